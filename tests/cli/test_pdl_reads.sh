#!/usr/bin/env bash
# tests/tools/pdl_reads/pdl_reads.py (no GPU needed): on a kernel file made here it names the parameter a
# kernel reads through ld.global.nc after griddepcontrol.wait, not one read with an ordinary load after it
# or one read before it; --check refuses what its list does not allow, naming kernel and parameter. Then
# the rule of kernels/launch.cuh over the project's kernels: every such read is one that
# tests/tools/pdl_reads/allowed.txt lists (weights, the step's uploaded inputs). Skips (77) without nvcc.
. "$(dirname "$0")/cli_lib.sh"
tool=$LLMQ_SOURCE_DIR/tests/tools/pdl_reads/pdl_reads.py
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$nvcc" ]; then
  echo "skipped: no nvcc here"; exit 77
fi

cat >"$tmp/k.cu" <<'CU'
#define WAIT asm volatile("griddepcontrol.wait;" ::: "memory")
__global__ void after_nc(const float *__restrict__ w, const float *__restrict__ x, float *y)
{
    const float a = __ldg(w + threadIdx.x); // before the wait: fine
    WAIT;
    y[threadIdx.x] = a * __ldg(x + threadIdx.x); // after it, on the read-only path
}
__global__ void after_ca(const float *__restrict__ x, float *y)
{
    WAIT;
    y[threadIdx.x] = __ldca(x + threadIdx.x);
}
CU
check "a kernel file" 0 python3 "$tool" --nvcc "$nvcc" "$tmp/k.cu"
grep -q "after_nc" <<<"$out" && grep -q "#1 float const\*" <<<"$out" || bad "the .nc read of x after the wait not named: $out"
grep -q "#0 " <<<"$out" && bad "the read of w before the wait named: $out"
grep -q "after_ca" <<<"$out" && bad "the ordinary load after the wait named: $out"
printf '# test\nafter_nc #1 read-only in this test\n' >"$tmp/allow"
check "--check, allowed" 0 python3 "$tool" --nvcc "$nvcc" --check "$tmp/allow" "$tmp/k.cu"
printf 'after_nc #0 w only\n' >"$tmp/allow"
check "--check, not allowed" 1 python3 "$tool" --nvcc "$nvcc" --check "$tmp/allow" "$tmp/k.cu"
grep -q "^NOT ALLOWED .*after_nc reads #1 float const\*" <<<"$out" || bad "--check: no NOT ALLOWED line for #1: $out"
printf 'after_nc\n' >"$tmp/allow"
check "--check, malformed list" 1 python3 "$tool" --nvcc "$nvcc" --check "$tmp/allow" "$tmp/k.cu"
grep -q "allow:1:" "$tmp/err" || bad "malformed list: the error does not name the line: $(cat "$tmp/err")"

# the project's kernels (the .cu files that define one: host-only files such as the cuBLASLt loader
# need headers only a CUDA build generates)
mapfile -t kfiles < <(grep -l "__global__" "$LLMQ_SOURCE_DIR"/kernels/*.cu)
check "kernels/*.cu against tests/tools/pdl_reads/allowed.txt" 0 python3 "$tool" --nvcc "$nvcc" \
  -I "$LLMQ_SOURCE_DIR" -I "$LLMQ_BUILD_DIR/generated" --check "$LLMQ_SOURCE_DIR/tests/tools/pdl_reads/allowed.txt" \
  "${kfiles[@]}"
grep "^NOT ALLOWED" <<<"$out"
finish
