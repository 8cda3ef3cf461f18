// The per-lane arithmetic of the attention prologue (bias, per-head RMSNorm, NeoX RoPE) and where it
// stores k and v, shared by k_qk_norm_rope_kv (kernels/rope.cu) and the decode attention that folds
// the prologue in (kernels/attention_decode.cu, k_attention_decode_rope): one function, so that both compute
// the same bits.
// Included by kernels/*.cu only.
#pragma once
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/elt16.cuh"

// cos and sin of position pos for the D/2 frequencies, times attn_scale, by the calling CTA's threads
// (the caller synchronizes before reading them).
__device__ __forceinline__ void rope_table_fill(const float *inv_freq, float attn_scale, int pos, int D,
                                                float *cs, float *sn)
{
    for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
        float s, c;
        sincosf((float)pos * inv_freq[i], &s, &c); // the angle rounded to fp32 as transformers does
        cs[i] = c * attn_scale;
        sn[i] = s * attn_scale;
    }
}

// One head's 16 bytes held by lane sub = threadIdx.x % G of a group of G = D/8 lanes (8 contiguous
// elements each): r = rope(norm(raw + bias)), in fp32. The bias is added when add_bias, the RMSNorm
// over the group's D elements applied with weights wraw when norm, the NeoX rotation (rotate_half
// partner: lane sub ^ G/2) with the table cs/sn when rotate. Every lane of the warp must call it (the
// shuffles); lanes without a head pass zeros. raw, braw and wraw hold E (kernels/elt16.cuh).
template <typename E, int G>
__device__ __forceinline__ void rope_lane(uint4 raw, uint4 braw, bool add_bias, uint4 wraw, bool norm,
                                          bool rotate, float eps, const float *cs, const float *sn,
                                          float (&r)[8])
{
    constexpr int D = G * 8, HG = G / 2;
    const int sub = threadIdx.x % G;
    const bool first = sub < HG;
    const int fi0 = (sub % HG) * 8; // angle index of element 0
    float x[8];
    x8_to_float<E>(raw, x);
    if (add_bias) {
        float b[8];
        x8_to_float<E>(braw, b);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] += b[i];
    }
    // per-head RMSNorm; the shuffles run on every lane
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        ss += x[i] * x[i];
#pragma unroll
    for (int o = HG; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (norm) {
        const float rr = rsqrtf(ss / (float)D + eps);
        float w[8];
        x8_to_float<E>(wraw, w);
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = x[i] * rr * w[i];
    }
    // NeoX RoPE: first half v[i] = a c - b s, second half v[i + D/2] = b c + a s
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        y[i] = __shfl_xor_sync(0xffffffffu, x[i], HG);
    if (rotate) {
        // 16-byte shared loads (fi0 is a multiple of 8)
        const float4 c0 = *(const float4 *)(cs + fi0), c1 = *(const float4 *)(cs + fi0 + 4);
        const float4 s0 = *(const float4 *)(sn + fi0), s1 = *(const float4 *)(sn + fi0 + 4);
        const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            r[i] = first ? x[i] * c[i] - y[i] * s[i] : x[i] * c[i] + y[i] * s[i];
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            r[i] = x[i];
    }
}

// Element 0 of KV head g's row at cache slot `slot` in a paged cache [blocks][KVH][bs][D] (kernels.h).
__device__ __forceinline__ size_t rope_cache_at(int slot, int g, int KVH, int bs, int D)
{
    return (((size_t)(slot / bs) * KVH + g) * bs + slot % bs) * D;
}
