#!/usr/bin/env bash
# The CUDA build's binary names no cuBLAS library for the dynamic loader (the backend loads cuBLASLt
# with dlopen when it opens: docs/CUDA_BACKEND.md, "cuBLASLt: loaded when the backend opens"), so
# nothing of 540 MB is mapped and relocated before the worker can hold a stop signal. Skipped (77)
# in builds without the CUDA backend.
. "$(dirname "$0")/cli_lib.sh"
check "llmq --version" 0 "$LLMQ_BIN" --version
if ! grep -q "^cuda backend: built" <<<"$out"; then
  echo "skipped: built without the CUDA backend"
  exit 77
fi
command -v readelf >/dev/null || { echo "skipped: no readelf"; exit 77; }
needed=$(readelf -d "$LLMQ_BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] && ok "readelf -d lists the needed libraries" || bad "no NEEDED entries read"
if grep -qi cublas <<<"$needed"; then
  bad "llmq needs $(grep -i cublas <<<"$needed" | tr '\n' ' ')"
else
  ok "no libcublas* among: $(tr '\n' ' ' <<<"$needed")"
fi
finish
