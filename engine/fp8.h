/* FP8 (OCP e4m3, "fn") weights in 128x128 blocks, as the Qwen3 *-FP8 checkpoints ship them and as
 * `model.dtype: fp8` makes them at load: the host reference of the quantization the CUDA kernels
 * do (kernels/quant.cu is bit for bit this), and the one rule both backends use to decide which
 * linear weights run in fp8.
 *
 * A block of up to b0 x b1 weights gets one fp32 scale s (the checkpoints' weight_scale_inv): the
 * weight w is stored as q = e4m3(w / s), round to nearest even, saturating at +-448, and its value
 * is e4m3_to_f32(q) * s. The scale is fp8_scale(amax of the block's |w|):
 *   amax / 448 (one correctly rounded fp32 division), so the largest weight maps to +-448;
 *   1 for an all-zero block (every q is 0 whatever the scale; 1 is what the checkpoints write);
 *   FLT_MIN (the smallest normal) where amax / 448 would be subnormal or zero for a non-zero amax,
 *   so that a scale is always a normal number and w / s never divides by zero.
 * The same function makes the 1x128 activation group scales on the GPU. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/model.h"

#define FP8_E4M3_MAX 448.0f
#define FP8_BLOCK 128 /* the only block size the backends run in fp8: [128, 128] */

/* The block scale for a block whose largest |w| is amax (>= 0, finite). */
float fp8_scale(float amax);

/* Quantizes w [N][K] (row-major, fp32) in blocks of b0 rows x b1 columns (partial blocks at the
 * right and bottom edges): q [N][K] e4m3 codes and scale_inv [ceil(N/b0)][ceil(K/b1)] (row-major).
 * Returns 0, or -1 (q and scale_inv then undefined) when w holds a NaN or an infinity, or a size is
 * not positive: a weight that cannot be quantized is a broken checkpoint, not something to clamp. */
int fp8_quantize_blocks(const float *w, int N, int K, int b0, int b1, uint8_t *q, float *scale_inv);

/* The values of a quantized matrix: w[n][k] = e4m3_to_f32(q[n][k]) * scale_inv[n/b0][k/b1]. */
void fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int N, int K, int b0, int b1, float *w);

/* The fp8 KV cache's quantization of one (token, KV head) vector x[D] (kernels.h, "fp8 KV cache";
 * k_qk_norm_rope_kv_fp8 computes the same in fp32): amax = max |x|, codes[d] = e4m3(x[d] * (448 /
 * amax)), round to nearest even, saturating; returns the scale amax / 448. A zero vector gets zero
 * codes and scale 0 (unlike fp8_scale's 1: the cache stores the scale, and 0 decodes exactly). */
float fp8_kv_quantize(const float *x, int D, uint8_t *codes);

/* Whether the (possibly fused) linear weight made of parts[0 .. n-1] (stacked by rows, one K) runs
 * in fp8 under weight_dtype:
 *   BE_WEIGHTS_BF16, BE_WEIGHTS_F16  never;
 *   BE_WEIGHTS_AUTO  when every part is an F8_E4M3 checkpoint tensor (with block scales);
 *   BE_WEIGHTS_FP8   always where the shape allows;
 * and in both of the last two only when the shape allows: K and every part's row count multiples of
 * FP8_BLOCK (so a fused matrix's 128-row blocks never straddle two parts, and cuBLASLt's 1x128
 * activation groups tile K), and every F8_E4M3 part in FP8_BLOCK x FP8_BLOCK blocks. Otherwise the
 * matrix is bf16 on the GPU (fp8 parts dequantized), which *why (may be NULL) says when fp8 was
 * wanted but the shape refused it (else it is set to ""). Both backends call this, so the CPU
 * oracle computes with the values the GPU uses. */
bool fp8_linear_use(enum be_weights weight_dtype, const struct tensor_view *const *parts, int n, char *why,
                    size_t whylen);

/* Converts one part of a linear weight to the fp32 values a backend computes with: with fp8 set,
 * an F8_E4M3 view is dequantized and any other view is rounded to bf16 (the GPU quantizes bf16
 * weights) and then quantized and dequantized with FP8_BLOCK blocks; without it, tensor_to_f32.
 * dst holds the view's rows x cols. Returns 0, or -1 with err. */
int fp8_linear_values(const struct tensor_view *t, bool fp8, float *dst, char *err, size_t errlen);
