/* v / s, correctly rounded, from one reciprocal of s shared by a whole quantization group: the
 * activation quantizers of kernels/quant.cu divide every value of a 1x128 group by the group's scale,
 * and an IEEE division per value (__fdiv_rn: a reciprocal estimate, four FMAs, a range check and a
 * branch to its slow path) made those kernels issue-bound.
 *
 *   y = RN(1 / s)              once per group (fp8_reciprocal)
 *   q = RN(v * y)              per value (fp8_quotient)
 *   r = v - q * s              exact: one fused multiply-add
 *   RN(q + r * y)              = RN(v / s), Markstein's correction
 *
 * The residual r is exact only while it is a normal number (about 2^-24 v), so fp8_divide takes this
 * path for scales s >= FP8Q_MIN_SCALE and divides otherwise (amax below ~2^-51: never seen in a real
 * activation, but every input must give the CPU's code). With that, the e4m3 code of every quotient is
 * the code of the plain division engine/fp8.c computes, and the quotient itself is bit for bit the
 * division's wherever it can give a non-zero code (below 2^-11 both give code 0, +-0 by sign), for every
 * input the quantizers see: v a bf16 value (they round their result to bf16 before quantizing it),
 * s = fp8_scale(amax) of a bf16 amax >= |v|. Those are finitely many pairs, and tests/unit/test_fp8.c
 * checks them (all ~5e8 with LLMQ_TEST_EXHAUSTIVE=1; otherwise every amax mantissa at the exponents
 * where the two paths meet and at the extremes).
 * Plain C, also compiled as CUDA C++ (device code uses the intrinsics, never contracted). */
#pragma once
#include <math.h>

#define FP8Q_MIN_SCALE 0x1p-60f /* fp8_divide's reciprocal path from this scale up */

#ifdef __CUDACC__
#define FP8Q_FN __host__ __device__ __forceinline__
#else
#define FP8Q_FN static inline
#endif

FP8Q_FN float fp8_reciprocal(float s)
{
#ifdef __CUDA_ARCH__
    return __frcp_rn(s);
#else
    return 1.0f / s;
#endif
}

FP8Q_FN float fp8_quotient(float v, float s, float y)
{
#ifdef __CUDA_ARCH__
    const float q = __fmul_rn(v, y);
    return __fmaf_rn(__fmaf_rn(-q, s, v), y, q);
#else
    const float q = v * y;
    return fmaf(fmaf(-q, s, v), y, q);
#endif
}

/* q[i] = RN(v[i] / s) for a group's n values (the codes are the division's; see above). */
FP8Q_FN void fp8_divide(float *q, const float *v, int n, float s)
{
    if (s >= FP8Q_MIN_SCALE) {
        const float y = fp8_reciprocal(s);
        for (int i = 0; i < n; i++)
            q[i] = fp8_quotient(v[i], s, y);
    } else {
        for (int i = 0; i < n; i++)
#ifdef __CUDA_ARCH__
            q[i] = __fdiv_rn(v[i], s);
#else
            q[i] = v[i] / s;
#endif
    }
}
