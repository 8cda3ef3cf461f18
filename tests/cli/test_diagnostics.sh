#!/usr/bin/env bash
# The kernels' diagnostic variables (kernels/diagnostics.cu; docs/KERNELS.md, "Diagnostics"): a bad value
# refuses the CUDA backend with a message naming the variable and the values it takes, before the backend
# looks for a device (so no GPU is needed here); good values are logged when it opens. Skips (77) in a
# build without the CUDA backend.
. "$(dirname "$0")/cli_lib.sh"
bench=("$LLMQ_BIN" bench --random-weights qwen3-0.6b --workload single --input-len 8 --output-len 2 --backend cuda)
out=$("${bench[@]}" 2>&1)
if grep -q "built without the CUDA backend" <<<"$out"; then
  echo "skipped: this llmq has no CUDA backend"; exit 77
fi
for bad in LLMQ_PDL=2 LLMQ_PDL=on LLMQ_GEMM_LOG=yes LLMQ_GEMM_LOG=; do
  out=$(env "$bad" "${bench[@]}" 2>&1); rc=$?
  name=${bad%%=*} val=${bad#*=}
  [ $rc -ne 0 ] && grep -qF "cuda backend: $name=\"$val\": expected 0 or 1" <<<"$out" &&
    ok "$bad refused" || bad "$bad: exit $rc, $out"
done
out=$(env LLMQ_PDL=1 LLMQ_GEMM_LOG=0 LLMQ_PDL_SKIP=rmsnorm,gemv "${bench[@]}" 2>&1)
grep -qF "cuda backend: diagnostics from the environment: LLMQ_PDL=1, LLMQ_GEMM_LOG=0, LLMQ_PDL_SKIP=rmsnorm,gemv" <<<"$out" &&
  ok "good values logged" || bad "no diagnostics line: $out"
out=$(env -u LLMQ_PDL -u LLMQ_GEMM_LOG -u LLMQ_PDL_SKIP "${bench[@]}" 2>&1)
grep -q "diagnostics from the environment" <<<"$out" && bad "a diagnostics line without any set: $out" ||
  ok "nothing logged when none is set"
finish
