/* See fp8.h. */
#include "engine/fp8.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/dtype.h"

float fp8_scale(float amax)
{
    if (amax == 0.0f)
        return 1.0f;
    float s = amax / FP8_E4M3_MAX;
    return s < FLT_MIN ? FLT_MIN : s;
}

float fp8_kv_quantize(const float *x, int D, uint8_t *codes)
{
    float am = 0.0f;
    for (int d = 0; d < D; d++)
        am = fmaxf(am, fabsf(x[d]));
    const float inv = am > 0.0f ? FP8_E4M3_MAX / am : 0.0f;
    for (int d = 0; d < D; d++)
        codes[d] = f32_to_e4m3(x[d] * inv);
    return am / FP8_E4M3_MAX;
}

int fp8_quantize_blocks(const float *w, int N, int K, int b0, int b1, uint8_t *q, float *scale_inv)
{
    if (N <= 0 || K <= 0 || b0 <= 0 || b1 <= 0)
        return -1;
    const int nb1 = (K + b1 - 1) / b1;
    for (int br = 0; br * b0 < N; br++)
        for (int bc = 0; bc < nb1; bc++) {
            const int r1 = (br + 1) * b0 < N ? (br + 1) * b0 : N, c1 = (bc + 1) * b1 < K ? (bc + 1) * b1 : K;
            float amax = 0.0f;
            for (int r = br * b0; r < r1; r++)
                for (int c = bc * b1; c < c1; c++) {
                    float a = fabsf(w[(size_t)r * K + c]);
                    if (!isfinite(a))
                        return -1;
                    amax = a > amax ? a : amax;
                }
            const float s = fp8_scale(amax);
            scale_inv[(size_t)br * nb1 + bc] = s;
            for (int r = br * b0; r < r1; r++)
                for (int c = bc * b1; c < c1; c++)
                    q[(size_t)r * K + c] = f32_to_e4m3(w[(size_t)r * K + c] / s);
        }
    return 0;
}

void fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int N, int K, int b0, int b1, float *w)
{
    float lut[256];
    for (int i = 0; i < 256; i++)
        lut[i] = e4m3_to_f32((uint8_t)i);
    const int nb1 = (K + b1 - 1) / b1;
    for (int r = 0; r < N; r++) {
        const float *srow = scale_inv + (size_t)(r / b0) * nb1;
        for (int c = 0; c < K; c++)
            w[(size_t)r * K + c] = lut[q[(size_t)r * K + c]] * srow[c / b1];
    }
}

static bool is_fp8(const struct tensor_view *t)
{
    return t->dtype == DT_F8_E4M3 && t->scale_inv;
}

bool fp8_linear_use(enum be_weights weight_dtype, const struct tensor_view *const *parts, int n, char *why,
                    size_t whylen)
{
    if (why && whylen)
        why[0] = 0;
    if (weight_dtype == BE_WEIGHTS_BF16 || weight_dtype == BE_WEIGHTS_F16 || n <= 0)
        return false;
    bool all_fp8 = true;
    for (int i = 0; i < n; i++)
        all_fp8 &= is_fp8(parts[i]);
    if (weight_dtype == BE_WEIGHTS_AUTO && !all_fp8)
        return false;
    const char *name = parts[0]->name ? parts[0]->name : "a linear weight";
    for (int i = 0; i < n; i++) {
        const struct tensor_view *t = parts[i];
        if (t->ndim != 2 || t->shape[1] != parts[0]->shape[1] || t->shape[0] % FP8_BLOCK ||
            t->shape[1] % FP8_BLOCK) {
            if (why && whylen)
                snprintf(
                    why, whylen,
                    "%s%s: part %d of %d has shape [%lld, %lld], not multiples of %d: bf16 for this matrix",
                    name, n > 1 ? " (fused)" : "", i, n, (long long)t->shape[0],
                    (long long)(t->ndim > 1 ? t->shape[1] : 0), FP8_BLOCK);
            return false;
        }
        if (is_fp8(t) && (t->block[0] != FP8_BLOCK || t->block[1] != FP8_BLOCK)) {
            if (why && whylen)
                snprintf(why, whylen, "%s: fp8 blocks of %dx%d, not %dx%d: dequantized to bf16", name,
                         t->block[0], t->block[1], FP8_BLOCK, FP8_BLOCK);
            return false;
        }
    }
    return true;
}

int fp8_linear_values(const struct tensor_view *t, bool fp8, float *dst, char *err, size_t errlen)
{
    if (tensor_to_f32(t, dst, err, errlen))
        return -1;
    if (!fp8 || is_fp8(t))
        return 0;
    const char *name = t->name ? t->name : "a linear weight";
    if (t->ndim != 2 || t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX) {
        snprintf(err, errlen, "%s: not a matrix", name);
        return -1;
    }
    const int N = (int)t->shape[0], K = (int)t->shape[1];
    const size_t n = (size_t)N * K;
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(f32_to_bf16(dst[i]));
    uint8_t *q = malloc(n);
    float *s =
        malloc((size_t)((N + FP8_BLOCK - 1) / FP8_BLOCK) * ((K + FP8_BLOCK - 1) / FP8_BLOCK) * sizeof *s);
    int rc = 0;
    if (!q || !s) {
        snprintf(err, errlen, "%s: out of memory for its fp8 copy", name);
        rc = -1;
    } else if (fp8_quantize_blocks(dst, N, K, FP8_BLOCK, FP8_BLOCK, q, s)) {
        snprintf(err, errlen, "%s: holds a NaN or an infinity: cannot be quantized to fp8", name);
        rc = -1;
    } else {
        fp8_dequantize_blocks(q, s, N, K, FP8_BLOCK, FP8_BLOCK, dst);
    }
    free(q);
    free(s);
    return rc;
}
