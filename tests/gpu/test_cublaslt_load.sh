#!/usr/bin/env bash
# The CUDA backend loads cuBLASLt when it opens (docs/CUDA_BACKEND.md, "cuBLASLt: loaded when the
# backend opens"). On a tiny model with `llmq run`:
#   - --backend cuda runs, and its log names the cuBLASLt version and the file it came from, whose
#     name is the toolkit's soname (libcublasLt.so.<major>);
#   - with that file unloadable (/dev/null bound over it in a private mount namespace; skipped where
#     unshare cannot make one), --backend cuda and --backend auto fail with exit 1 and an error that
#     names the library and the loader's reason, and --backend cpu still runs.
# Skips (77) without a GPU.
. "$(dirname "$0")/../cli/cli_lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no NVIDIA GPU here (nvidia-smi -L fails)"; exit 77
fi
tiny_model "$tmp/m" --head-dim 64   # a head size the CUDA attention kernels take (64, 128)
printf '{"id": "a", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}\n' >"$tmp/in.jsonl"
run() { # run NAME WANT_RC BACKEND [wrapper...]: llmq run on the tiny model, stdout and stderr in $out
  local name=$1 want=$2 be=$3; shift 3
  rm -f "$tmp/out.jsonl"
  check_merged "$name" "$want" "$@" "$LLMQ_BIN" run --model "$tmp/m" --input "$tmp/in.jsonl" \
    --output "$tmp/out.jsonl" --backend "$be"
}
completed() { grep -q '"status": *"completed"' "$tmp/out.jsonl" 2>/dev/null && ok "$1: the job completed" || bad "$1: no completed job"; }

run "--backend cuda" 0 cuda
completed "--backend cuda"
file=$(sed -n 's/.*cuda backend: cuBLASLt [1-9][0-9]* from \(.*\)$/\1/p' <<<"$out" | head -1)
if [ -n "$file" ]; then ok "the log names cuBLASLt's version and file: $file"; else bad "no cuBLASLt line in: $out"; fi
case "$(basename "$file")" in
  libcublasLt.so.[0-9]*) ok "the file is the soname's" ;;
  *) bad "loaded '$file', not libcublasLt.so.<major>" ;;
esac

# the same runs where that file is /dev/null, and so is the one the loader tries next (the toolkit's
# directory, compiled in: often the same file through a link)
gen="$LLMQ_BUILD_DIR/generated/llmq_cublaslt.h"
dir=$(sed -n 's/^#define LLMQ_CUBLASLT_DIR "\(.*\)"$/\1/p' "$gen")
soname=$(sed -n 's/^#define LLMQ_CUBLASLT_SONAME "\(.*\)"$/\1/p' "$gen")
[ -n "$dir" ] && [ -n "$soname" ] && ok "the build's cuBLASLt: $soname, else $dir" || bad "no soname or directory in $gen"
other=$file
[ -e "$dir/$soname" ] && other="$dir/$soname"
ns=(unshare -m)
[ "$(id -u)" -eq 0 ] || ns=(unshare -rm)
if [ -z "$file" ] || ! "${ns[@]}" sh -c 'mount --bind /dev/null "$0"' "$file" 2>/dev/null; then
  echo "note: no private mount namespace here (${ns[*]}): the missing-library case is not tested"
  finish
  exit
fi
hide=("${ns[@]}" sh -c 'mount --bind /dev/null "$0" && mount --bind /dev/null "$1" && shift && exec "$@"' \
  "$file" "$other")
for be in cuda auto; do
  run "--backend $be without cuBLASLt" 1 "$be" "${hide[@]}"
  if grep -qF "cannot load cuBLASLt ($soname, the CUDA backend's GEMMs): " <<<"$out" && grep -qF "; $dir/$soname: " <<<"$out"; then
    ok "--backend $be: the error names the library, the file and the reason"
  else
    bad "--backend $be: unclear error: $out"
  fi
done
run "--backend cpu without cuBLASLt" 0 cpu "${hide[@]}"
completed "--backend cpu without cuBLASLt"
finish
