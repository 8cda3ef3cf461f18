// The attention prologue in one pass over the fused QKV activations (kernels/kernels.h):
// bias add, per-head q/k RMSNorm, NeoX RoPE, q back in place, k and v into the paged cache.
//
// A block first computes its token's D/2 (cos, sin) pairs into shared memory (D/2 sincosf per
// block instead of one per element of every head), then takes head items (q heads, k heads, v
// heads) of the token's H + 2*KVH.
// - Vector path (D in {16, 32, 64, 128, 256}, 16-byte aligned buffers): a group of G = D/8 lanes
//   owns one head, 8 contiguous elements (16 bytes) per lane, and a token's heads are spread over
//   the fewest blocks of <= 256 threads (4 for Qwen3-14B), one head per group. The RMSNorm sum is a
//   shuffle reduction inside the group; the rotate_half partner of lane s is lane s ^ G/2, fetched
//   with one shuffle per element; lanes past the last head take part in the shuffles.
// - Fallback (any other even D, or unaligned buffers): one block per token, one warp per head, two
//   passes over it.
// Memory-bound: each element of qkv is read once and written once (q in place, k and v to the cache).
//
// qkv, bias, the norm weights and the 16-bit cache hold the 16-bit element type E (bf16 or fp16,
// kernels/elt16.cuh; rope_args keeps them as bf16 pointers, the kernels read them as E); the math is
// fp32 and rounds once to E at the store. The fp8 cache is bf16 only (E = bf16).
//
// fp8 cache (k_qk_norm_rope_kv_fp8, vector path only): after norm and RoPE the group reduces its
// head's amax with shuffles (every lane, before any lane leaves the iteration), then each lane
// writes its 8 codes (two fp8x2 conversions per pair, one 8-byte store) and lane 0 of the group the
// scale: each (token, head) vector is quantized once, from fp32.
#include <cuda_fp8.h>

#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"

// ---- kernels

struct rope_args { // the 16-bit pointers hold E (the kernels cast them)
    bf16 *qkv;
    const bf16 *bias, *q_norm, *k_norm;
    float eps;
    const int32_t *positions;
    const float *inv_freq;
    float attn_scale;
    const int32_t *slot_mapping;
    bf16 *k_cache, *v_cache;
    int H, KVH, D, block_size;
    uint8_t *k8, *v8; // fp8 cache (k_cache, v_cache unused)
    float *k_scale, *v_scale;
};

// shared cos/sin of token blockIdx.x: cs[i], sn[i] for i < D/2, already multiplied by attn_scale
__device__ __forceinline__ void rope_table(const rope_args &a, int pos, float *cs, float *sn)
{
    rope_table_fill(a.inv_freq, a.attn_scale, pos, a.D, cs, sn);
    __syncthreads();
}

// k/v head g of a token at cache slot `slot`: element 0 of its row in the cache
__device__ __forceinline__ size_t cache_at(const rope_args &a, int slot, int g)
{
    return rope_cache_at(slot, g, a.KVH, a.block_size, a.D);
}

// 8 codes of x * inv (e4m3, round to nearest even, saturating at 448) in memory order
__device__ __forceinline__ uint2 e4m3x8(const float (&x)[8], float inv)
{
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(x[2 * i], inv), __fmul_rn(x[2 * i + 1], inv)),
                                        __NV_SATFINITE, __NV_E4M3);
    return make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
}

// grid (T, P), block (threads, a multiple of 32 and of G), dynamic shared D * 4 bytes: CTA (t, y) takes
// head items y * groups .. y * groups + groups - 1 of token t (groups = threads / G), one per group of
// G lanes, so a token's heads run in P CTAs side by side rather than one after another (at decode the
// kernel is a latency chain). Everything that no kernel of the step writes (the position, the slot,
// the cos/sin table, bias and norm weights) is read before the wait (kernels/launch.cuh).
template <typename E, int G, bool F8> __global__ void __launch_bounds__(256) qk_rope_vec_kernel(rope_args a)
{
    static_assert(!F8 || !elt16<E>::f16, "the fp8 cache is bf16 only");
    constexpr int D = G * 8;
    extern __shared__ __align__(16) float smem[];
    float *cs = smem, *sn = smem + D / 2;
    const int t = blockIdx.x, NH = a.H + 2 * a.KVH;
    const int pos = a.positions[t], slot = a.slot_mapping[t];
    rope_table(a, pos, cs, sn);

    const int sub = threadIdx.x % G, groups = blockDim.x / G;
    E *row = (E *)a.qkv + (size_t)t * NH * D;
    const int hh = blockIdx.y * groups + threadIdx.x / G;
    const bool valid = hh < NH;
    const int kind = hh < a.H ? 0 : hh < a.H + a.KVH ? 1 : 2; // q, k, v
    const int col = hh * D + sub * 8;
    const E *nw = (const E *)(kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr);
    const uint4 braw =
        a.bias && valid ? __ldg((const uint4 *)((const E *)a.bias + col)) : make_uint4(0, 0, 0, 0);
    const uint4 wraw = nw && valid ? __ldg((const uint4 *)(nw + sub * 8)) : make_uint4(0, 0, 0, 0);
    pdl_enter_early(); // kernels/launch.cuh: the trigger first
    const uint4 raw = valid ? *(const uint4 *)(row + col) : make_uint4(0, 0, 0, 0);
    float r[8];
    rope_lane<E, G>(raw, braw, a.bias && valid, wraw, nw && valid, kind < 2, a.eps, cs, sn, r);
    if constexpr (F8) {
        // the head's amax: every lane takes part (invalid ones contribute zeros)
        constexpr int HG = G / 2;
        float am = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            am = fmaxf(am, fabsf(r[i]));
#pragma unroll
        for (int o = HG; o > 0; o >>= 1)
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        if (!valid)
            return;
        if (kind == 0) {
            *(uint4 *)(row + col) = float_to_x8<E>(r);
        } else if (slot >= 0) {
            const int g = hh - a.H - (kind == 2 ? a.KVH : 0);
            const size_t at = cache_at(a, slot, g);
            const float inv = am > 0.f ? __fdiv_rn(448.f, am) : 0.f;
            *(uint2 *)((kind == 1 ? a.k8 : a.v8) + at + sub * 8) = e4m3x8(r, inv);
            if (sub == 0)
                (kind == 1 ? a.k_scale : a.v_scale)[at / D] = __fdiv_rn(am, 448.f);
        }
        return;
    }
    if (!valid)
        return;
    const uint4 outv = float_to_x8<E>(r);
    if (kind == 0)
        *(uint4 *)(row + col) = outv;
    else if (slot >= 0) {
        const int g = hh - a.H - (kind == 2 ? a.KVH : 0);
        E *cache = (E *)(kind == 1 ? a.k_cache : a.v_cache);
        *(uint4 *)(cache + cache_at(a, slot, g) + sub * 8) = outv;
    }
}

// Any even D, any alignment: one warp per head item, pass 1 sums squares, pass 2 rotates pairs.
template <typename E> __global__ void __launch_bounds__(256) qk_rope_scalar_kernel(rope_args a)
{
    pdl_enter_early(); // kernels/launch.cuh: the trigger first
    extern __shared__ __align__(16) float smem[];
    const int D = a.D, half = D / 2;
    float *cs = smem, *sn = smem + half;
    const int t = blockIdx.x, NH = a.H + 2 * a.KVH;
    const int pos = a.positions[t], slot = a.slot_mapping[t];
    rope_table(a, pos, cs, sn);

    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    E *row = (E *)a.qkv + (size_t)t * NH * D;
    for (int hh = threadIdx.x / 32; hh < NH; hh += warps) { // warp-uniform
        const int kind = hh < a.H ? 0 : hh < a.H + a.KVH ? 1 : 2;
        const E *nw = (const E *)(kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr);
        const E *in = row + (size_t)hh * D;
        const E *bias = a.bias ? (const E *)a.bias + (size_t)hh * D : nullptr;
        float r = 1.f;
        if (nw) {
            float ss = 0.f;
            for (int i = lane; i < D; i += 32) {
                float v = elt16<E>::to_f(in[i]) + (bias ? elt16<E>::to_f(bias[i]) : 0.f);
                ss += v * v;
            }
            for (int o = 16; o > 0; o >>= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            r = rsqrtf(ss / (float)D + a.eps);
        }
        if (kind == 2 && slot < 0)
            continue;
        E *dst = kind == 0 ? row + (size_t)hh * D
                           : (E *)(kind == 1 ? a.k_cache : a.v_cache) +
                                 cache_at(a, slot < 0 ? 0 : slot, hh - a.H - (kind == 2 ? a.KVH : 0));
        for (int i = lane; i < half; i += 32) {
            float x0 = elt16<E>::to_f(in[i]) + (bias ? elt16<E>::to_f(bias[i]) : 0.f);
            float x1 = elt16<E>::to_f(in[i + half]) + (bias ? elt16<E>::to_f(bias[i + half]) : 0.f);
            if (nw) {
                x0 = x0 * r * elt16<E>::to_f(nw[i]);
                x1 = x1 * r * elt16<E>::to_f(nw[i + half]);
            }
            if (kind < 2) {
                const float c = cs[i], s = sn[i];
                const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
                x0 = y0, x1 = y1;
            }
            if (kind == 0 || slot >= 0) {
                dst[i] = elt16<E>::from_f(x0);
                dst[i + half] = elt16<E>::from_f(x1);
            }
        }
    }
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

// threads of the vector path: lanes for all heads of a token, split into the fewest CTAs (P) of <= 256;
// a multiple of G (D / 8 = 2 .. 32, a power of two) and of 32
static int vec_threads(int NH, int D, int *P)
{
    const int G = D / 8, lanes = NH * G, iters = (lanes + 255) / 256;
    const int threads = ((lanes + iters - 1) / iters + 31) / 32 * 32, groups = threads / G;
    *P = (NH + groups - 1) / groups;
    return threads;
}

// E: the 16-bit element type (bf16 with F8)
template <typename E, bool F8>
static int launch_vec(const rope_args &a, int T, size_t smem, cudaStream_t stream)
{
    int P;
    const int threads = vec_threads(a.H + 2 * a.KVH, a.D, &P);
    const dim3 grid(T, P);
    switch (a.D / 8) {
    case 2:
        K_CHECK(k_launch(qk_rope_vec_kernel<E, 2, F8>, grid, threads, smem, stream, a));
        break;
    case 4:
        K_CHECK(k_launch(qk_rope_vec_kernel<E, 4, F8>, grid, threads, smem, stream, a));
        break;
    case 8:
        K_CHECK(k_launch(qk_rope_vec_kernel<E, 8, F8>, grid, threads, smem, stream, a));
        break;
    case 16:
        K_CHECK(k_launch(qk_rope_vec_kernel<E, 16, F8>, grid, threads, smem, stream, a));
        break;
    default:
        K_CHECK(k_launch(qk_rope_vec_kernel<E, 32, F8>, grid, threads, smem, stream, a));
        break;
    }
    return 0;
}

static bool vec_dim(int D)
{
    return D == 16 || D == 32 || D == 64 || D == 128 || D == 256;
}

extern "C" int k_qk_norm_rope_kv(bf16 *qkv, const bf16 *bias, const bf16 *q_norm, const bf16 *k_norm,
                                 float eps, const int32_t *positions, const float *inv_freq, float attn_scale,
                                 const int32_t *slot_mapping, bf16 *k_cache, bf16 *v_cache, int T, int H,
                                 int KVH, int D, int block_size, cudaStream_t stream)
{
    K_REQUIRE(T >= 0 && H > 0 && KVH > 0 && H % KVH == 0 && D > 0 && D % 2 == 0 && block_size > 0,
              "k_qk_norm_rope_kv: bad shape T %d H %d KVH %d D %d block_size %d (need H %% KVH == 0, even D)",
              T, H, KVH, D, block_size);
    K_REQUIRE(D <= 4096, "k_qk_norm_rope_kv: head_dim %d > 4096", D);
    if (T == 0)
        return 0;
    K_REQUIRE(qkv && positions && inv_freq && slot_mapping && k_cache && v_cache,
              "k_qk_norm_rope_kv: NULL pointer (qkv %p positions %p inv_freq %p slot_mapping %p k_cache %p "
              "v_cache %p)",
              (void *)qkv, (const void *)positions, (const void *)inv_freq, (const void *)slot_mapping,
              (void *)k_cache, (void *)v_cache);
    K_REQUIRE(!(eps < 0), "k_qk_norm_rope_kv: eps %g < 0", (double)eps);

    rope_args a = {qkv,        bias,         q_norm,  k_norm,  eps,    positions, inv_freq,
                   attn_scale, slot_mapping, k_cache, v_cache, H,      KVH,       D,
                   block_size, nullptr,      nullptr, nullptr, nullptr};
    const int NH = H + 2 * KVH;
    const size_t smem = (size_t)D * sizeof(float);
    const bool vec = vec_dim(D) && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache) &&
                     (!bias || aligned16(bias)) && (!q_norm || aligned16(q_norm)) &&
                     (!k_norm || aligned16(k_norm));
    const bool f16 = k_f16();
    if (vec) {
        if (f16 ? launch_vec<__half, false>(a, T, smem, stream) : launch_vec<bf16, false>(a, T, smem, stream))
            return -1;
    } else {
        const int threads = NH >= 8 ? 256 : NH * 32;
        if (f16)
            K_CHECK(k_launch(qk_rope_scalar_kernel<__half>, T, threads, smem, stream, a));
        else
            K_CHECK(k_launch(qk_rope_scalar_kernel<bf16>, T, threads, smem, stream, a));
    }
    return 0;
}

extern "C" int k_qk_norm_rope_kv_fp8(bf16 *qkv, const bf16 *bias, const bf16 *q_norm, const bf16 *k_norm,
                                     float eps, const int32_t *positions, const float *inv_freq,
                                     float attn_scale, const int32_t *slot_mapping, uint8_t *k_cache,
                                     uint8_t *v_cache, float *k_scale, float *v_scale, int T, int H, int KVH,
                                     int D, int block_size, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_qk_norm_rope_kv_fp8: the fp8 KV cache is bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(T >= 0 && H > 0 && KVH > 0 && H % KVH == 0 && block_size > 0,
              "k_qk_norm_rope_kv_fp8: bad shape T %d H %d KVH %d D %d block_size %d (need H %% KVH == 0)", T,
              H, KVH, D, block_size);
    K_REQUIRE(vec_dim(D), "k_qk_norm_rope_kv_fp8: head_dim %d (16, 32, 64, 128 or 256 with an fp8 cache)", D);
    if (T == 0)
        return 0;
    K_REQUIRE(
        qkv && positions && inv_freq && slot_mapping && k_cache && v_cache && k_scale && v_scale,
        "k_qk_norm_rope_kv_fp8: NULL pointer (qkv %p positions %p inv_freq %p slot_mapping %p k_cache %p "
        "v_cache %p k_scale %p v_scale %p)",
        (void *)qkv, (const void *)positions, (const void *)inv_freq, (const void *)slot_mapping,
        (void *)k_cache, (void *)v_cache, (void *)k_scale, (void *)v_scale);
    K_REQUIRE(!(eps < 0), "k_qk_norm_rope_kv_fp8: eps %g < 0", (double)eps);
    K_REQUIRE(aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache) && (!bias || aligned16(bias)) &&
                  (!q_norm || aligned16(q_norm)) && (!k_norm || aligned16(k_norm)) &&
                  ((uintptr_t)k_scale | (uintptr_t)v_scale) % 4 == 0,
              "k_qk_norm_rope_kv_fp8: qkv, bias, norms and caches must be 16-byte aligned, scales 4-byte");

    rope_args a = {qkv,        bias,         q_norm,  k_norm,  eps,    positions, inv_freq,
                   attn_scale, slot_mapping, nullptr, nullptr, H,      KVH,       D,
                   block_size, k_cache,      v_cache, k_scale, v_scale};
    return launch_vec<bf16, true>(a, T, (size_t)D * sizeof(float), stream);
}
