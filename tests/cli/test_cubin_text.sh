#!/usr/bin/env bash
# tests/tools/cubin_text/cubin_text.py on cubins nvcc makes here (no GPU needed): a comment-only change
# (which renames the anonymous namespace) compares `same`, a changed kernel `DIFF` beside an unchanged
# one `same`, with the exit status saying whether all were the same; a non-ELF file is refused.
# Skips (77) without nvcc.
. "$(dirname "$0")/cli_lib.sh"
tool=$LLMQ_SOURCE_DIR/tests/tools/cubin_text/cubin_text.py
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$nvcc" ]; then
  echo "skipped: no nvcc here"; exit 77
fi

src() { # src FILE [COMMENT]: two kernels, one in an anonymous namespace
  cat >"$1" <<CU
namespace {
__global__ void scale(float *x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x; ${2:-}
    if (i < n)
#ifdef VARIANT
        x[i] = x[i] * a + 1.f;
#else
        x[i] = x[i] * a;
#endif
}
}
__global__ void other(int *y) { y[threadIdx.x] = threadIdx.x; }
void launch(float *x, int *y) { scale<<<1, 32>>>(x, 2.f, 32); other<<<1, 32>>>(y); }
CU
}
src "$tmp/a.cu"
src "$tmp/b.cu" "// a comment that changes nothing"
for v in a b; do
  "$nvcc" -arch=sm_80 -cubin -o "$tmp/$v.cubin" "$tmp/$v.cu" || { bad "nvcc $v.cu"; finish; exit 1; }
done
"$nvcc" -arch=sm_80 -cubin -DVARIANT -o "$tmp/c.cubin" "$tmp/a.cu" || { bad "nvcc -DVARIANT"; finish; exit 1; }

check "comment only: all the same" 0 python3 "$tool" "$tmp/a.cubin" "$tmp/b.cubin"
[ "$(grep -c '^same' <<<"$out")" = 2 ] || bad "comment only: want two 'same' lines, got: $out"
check "changed kernel: exit 1" 1 python3 "$tool" "$tmp/a.cubin" "$tmp/c.cubin"
grep -q '^DIFF .*scale' <<<"$out" || bad "changed kernel: no DIFF line for scale: $out"
grep -q '^same .*other' <<<"$out" || bad "changed kernel: the unchanged kernel is not 'same': $out"
check "--only the unchanged kernel" 0 python3 "$tool" "$tmp/a.cubin" "$tmp/c.cubin" --only other
check "not a cubin" 1 python3 "$tool" "$tmp/a.cu" "$tmp/b.cubin"
grep -q "not an ELF64" "$tmp/err" || bad "not a cubin: the error does not say why: $(cat "$tmp/err")"
finish
