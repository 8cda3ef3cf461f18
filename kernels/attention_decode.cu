/* Causal decode attention over the paged KV cache, GQA-aware and split over the context (with the
 * q/k norm + RoPE prologue folded in for k_attention_decode_rope; over an fp8 cache with f16 products,
 * K's codes straight from the staged bytes into the mma registers): the kernels, their launchers and
 * k_attention_decode*. What it shares with the prefill kernel: kernels/attention.cuh; notes and
 * numbers: docs/KERNELS.md, "Attention". */
#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"

extern "C" {
#include "engine/decode_split.h"
}

namespace
{

/* The cp.asyncs of key j alone, row r of a tile load_kv_tile left it out of (threads tid < D / 8). */
template <int D, typename E>
__device__ __forceinline__ void load_kv_row(E *sK, E *sV, const E *__restrict__ kc, const E *__restrict__ vc,
                                            const int32_t *__restrict__ btab, int kvh, int KVH, int bsh,
                                            int r, int j, int tid)
{
    if (tid < D / 8) {
        const size_t off = (size_t)kv_row(btab, j, kvh, KVH, bsh) * D + tid * 8;
        const uint32_t so = (uint32_t)swz<D>(r, tid) * 2;
        cp_async16(smem_u32(sK) + so, kc + off, true);
        cp_async16(smem_u32(sV) + so, vc + off, true);
    }
}

/* fp8 cache: the cp.asyncs of key j alone (codes and scales), row r of a staging tile
 * load_kv_tile_f8 left it out of (threads tid < D / 16 + 2), in the chunk order of f8_chunk. */
template <int D>
__device__ __forceinline__ void load_kv_row_f8(uint8_t *sF, float *sS, const kv_src kv,
                                               const int32_t *__restrict__ btab, int kvh, int KVH, int bsh,
                                               int r, int j, int tid)
{
    constexpr int CPR = D / 16;
    const size_t row = kv_row(btab, j, kvh, KVH, bsh);
    const uint8_t *kc = static_cast<const uint8_t *>(kv.k), *vc = static_cast<const uint8_t *>(kv.v);
    const uint32_t base = smem_u32(sF);
    if (tid < CPR) {
        const int pc = f8_chunk<D>(r, tid);
        cp_async16(base + r * D + pc * 16, kc + row * D + tid * 16, true);
        cp_async16(base + (KV_TILE + r) * D + pc * 16, vc + row * D + tid * 16, true);
    } else if (tid == CPR) {
        cp_async4(smem_u32(sS + r), kv.ks + row, true);
    } else if (tid == CPR + 1) {
        cp_async4(smem_u32(sS + KV_TILE + r), kv.vs + row, true);
    }
}

constexpr int DC_THREADS = 128;

/* fp8 cache: this lane's Q fragments as f16 for mma_f16, read once from sQ. The head dimension is
 * permuted (the same way for Q and K, so the sums are the same sums): in k step kk the lane's k
 * positions 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 hold d = t4 D / 4 + 4 kk + 0 .. 3, so that a key's
 * fragments are D / 4 consecutive codes (s_tile_f8). bf16 -> f16 is exact over f16's normal range;
 * if |q| exceeds 2^14, Q is scaled by a power of two 2^-e and the return value 2^e multiplies the
 * scores with the k scales (exact either way). */
template <int D>
__device__ __forceinline__ float q_frags_f16(uint32_t (&qf)[D / 16][4], const bf16 *sQ, int g4, int t4)
{
    uint2 raw[D / 16][2]; /* rows g4, g4 + 8: 4 bf16 at d = t4 D / 4 + 4 kk */
    float amax = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int d = t4 * (D / 4) + 4 * kk;
            raw[kk][h] = *reinterpret_cast<const uint2 *>(sQ + swz<D>(g4 + 8 * h, d / 8) + d % 8);
            const uint32_t w[2] = {raw[kk][h].x, raw[kk][h].y};
#pragma unroll
            for (int i = 0; i < 2; i++)
                amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(w[i] << 16)),
                                         fabsf(__uint_as_float(w[i] & 0xffff0000u))));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    if (amax > 16384.f) { /* uniform across the warp */
        frexpf(amax, &e); /* amax < 2^e */
        e -= 14;
    }
    const float down = exp2f((float)-e);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t w[2] = {raw[kk][h].x, raw[kk][h].y};
#pragma unroll
            for (int i = 0; i < 2; i++) /* i = 0: d + 0, 1 (fragment 0 / 1); i = 1: d + 2, 3 (2 / 3) */
                qf[kk][2 * i + h] = pack2<__half>(__uint_as_float(w[i] << 16) * down,
                                                  __uint_as_float(w[i] & 0xffff0000u) * down);
        }
    }
    return exp2f((float)e);
}

/* fp8 cache: the S products of one n tile (8 keys) from staged codes: this lane's key is row kr of the
 * stage's K, its D / 4 codes (q_frags_f16's permutation) read as whole chunks and converted in
 * registers, one instruction a pair. */
template <int D>
__device__ __forceinline__ void s_tile_f8(float (&sc)[4], const uint32_t (&qf)[D / 16][4], const uint8_t *sK8,
                                          int kr, int t4)
{
    uint32_t w[D / 16];
#pragma unroll
    for (int h = 0; h < D / 64; h++) {
        const uint4 x =
            *reinterpret_cast<const uint4 *>(sK8 + kr * D + f8_chunk<D>(kr, t4 * (D / 64) + h) * 16);
        w[4 * h] = x.x, w[4 * h + 1] = x.y, w[4 * h + 2] = x.z, w[4 * h + 3] = x.w;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        mma_f16(sc, qf[kk], e4m3x2_to_f16x2(w[kk]), e4m3x2_to_f16x2(w[kk] >> 16));
}

/* fp8 cache: one warp's 16 V rows (r0 ..) of a staged tile to f16 in the swizzled tile sVh that
 * ldsm_x4_t reads. A lane converts 8-byte units: conflict-free 8-byte loads (a half-warp reads 128
 * distinct bytes) and 16-byte stores (an 8-lane phase writes 8 chunk positions of one row). */
template <int D> __device__ __forceinline__ void v_rows_f16(bf16 *sVh, const uint8_t *sV8, int r0, int lane)
{
    constexpr int UPR = D / 8;    /* 8-byte units a row */
    constexpr int RPI = 32 / UPR; /* rows a pass */
    const int u = lane % UPR;
#pragma unroll
    for (int i = 0; i < 16 / RPI; i++) {
        const int r = r0 + lane / UPR + i * RPI;
        const uint2 x =
            *reinterpret_cast<const uint2 *>(sV8 + r * D + f8_chunk<D>(r, u / 2) * 16 + (u % 2) * 8);
        const uint4 o = make_uint4(e4m3x2_to_f16x2(x.x), e4m3x2_to_f16x2(x.x >> 16), e4m3x2_to_f16x2(x.y),
                                   e4m3x2_to_f16x2(x.y >> 16));
        *reinterpret_cast<uint4 *>(sVh + swz<D>(r, u)) = o;
    }
}

/* ---- decode: grid (partitions, KVH, n_seqs), 4 warps; the G query heads of the KV head are the
 * rows of one m16 tile (rows >= G are zero); each warp takes 16 keys of every 64-key tile and
 * keeps its own softmax state; the 4 warps combine at the end. A sequence whose context fits one
 * partition writes `out` directly; otherwise each partition writes its normalized fp32 output and
 * (max, sum) to the workspace and decode_reduce_kernel combines them.
 *
 * ROPE (16-bit cache; k_attention_decode_rope): the attention prologue of kernels/rope.cu folded in,
 * with its per-lane function (kernels/rope.cuh), so the values are the same bits. q is the raw qkv.
 * Each CTA normalizes and rotates its G query heads itself (groups of D/8 lanes, one head each) and
 * stores them to sQ; the CTA whose partition holds the new key (position ctx - 1, the token being
 * decoded) also computes that key's k and v, writes them to the cache slot and puts them in its own
 * K/V stage. The cos/sin table, the slot and the norm weights are read before the wait. */
/* fp8: 3 stages (71 KB at D = 128) leave room for 3 CTAs an SM (at most 170 registers); 4 stages (2 CTAs)
 * are slower. 16-bit at D = 128: 2 stages (68 KB, 3 CTAs an SM: the same bytes in flight an SM as 3
 * stages' 2 CTAs of 101 KB, and a third CTA to hide each one's prologue and merge where CTAs are short). */
template <int D, bool F8> constexpr int decode_stages()
{
    return F8 ? 3 : D >= 128 ? 2 : 4;
}
template <int D, bool F8> constexpr int decode_smem()
{
    /* 16-bit: sQ, NS stages of K and V, (ROPE) the cos/sin table. fp8: sQ, one f16 V tile, NS staging
     * stages of e4m3 K and V with their scales (the final combine reuses the staging area) */
    return F8 ? 16 * D * 2 + KV_TILE * D * 2 + decode_stages<D, F8>() * 2 * KV_TILE * (D + 4)
              : 16 * D * 2 + decode_stages<D, F8>() * 2 * KV_TILE * D * 2 + D * 4;
}

/* E: the 16-bit type of q (ROPE: qkv and the rope weights), the cache, P for P V and out; bf16 when F8
 * (whose V tile and P are f16 all the same: the fp8 products above) */
/* ONE: the same code as a second kernel, launched for grids of at most one CTA an SM, whose preferred
 * carve-out is one CTA's shared memory (decode_carveout_one, below). */
template <typename E, int D, bool F8, bool ROPE, bool ONE>
__global__ void __launch_bounds__(DC_THREADS)
    attention_decode_kernel(const E *__restrict__ q, int q_stride, const kv_src kv,
                            const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                            const int32_t *__restrict__ btabs, int max_blocks, E *__restrict__ out, int H,
                            int KVH, int bs, float sl2, int part_keys, int n_part_max,
                            float *__restrict__ ws_o, float2 *__restrict__ ws_ml, const k_rope_in rope)
{
    static_assert(!(ROPE && F8), "the folded prologue writes a 16-bit cache");
    static_assert(!F8 || std::is_same<E, bf16>::value, "the fp8 cache's kernels are bf16 only");
    constexpr int NS = decode_stages<D, F8>();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    E *sQ = reinterpret_cast<E *>(smem_raw); /* [16][D] */
    E *sKV = sQ + 16 * D; /* 16-bit: [NS][K, V][KV_TILE][D]; fp8: V [KV_TILE][D] as f16 (v_rows_f16) */
    uint8_t *sF = reinterpret_cast<uint8_t *>(sKV + KV_TILE * D); /* fp8: [NS][K, V][KV_TILE][D] (f8_chunk) */
    float *sS = reinterpret_cast<float *>(sF + NS * 2 * KV_TILE * D); /* fp8: [NS][K, V][KV_TILE] */
    const E *kc = static_cast<const E *>(kv.k), *vc = static_cast<const E *>(kv.v);

    const int G = H / KVH;
    const int s = blockIdx.z, kvh = blockIdx.y, p = blockIdx.x;
    const int ctx = max(ctx_len[s], 0);
    /* partitions of this sequence; the last launched one takes any remainder (max_ctx_len too small) */
    const int n_part_s = min(max((ctx + part_keys - 1) / part_keys, 1), n_part_max);
    const bool live = p < n_part_s;
    const int start = p * part_keys;
    const int end = p == n_part_s - 1 ? ctx : start + part_keys;
    const int n_tiles = (end - start + KV_TILE - 1) / KV_TILE;
    const int qrow = q_start[s];
    const int32_t *btab = btabs + (size_t)s * max_blocks;
    const int bsh = __ffs(bs) - 1; /* bs is a power of two (check_common) */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    constexpr int GL = D / 8; /* ROPE: lanes per head */
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    float *cs = nullptr, *sn = nullptr;
    int slot = -1;
    uint4 wq = zero4, wk = zero4;
    if constexpr (ROPE) { /* before the wait: the table, the slot, the norm weights */
        cs = reinterpret_cast<float *>(smem_raw + decode_smem<D, F8>() - D * 4), sn = cs + D / 2;
        rope_table_fill(rope.inv_freq, rope.attn_scale, rope.positions[qrow], D, cs, sn);
        slot = rope.slot_mapping[qrow];
        if (rope.q_norm)
            wq = __ldg(reinterpret_cast<const uint4 *>(rope.q_norm) + tid % GL);
        if (rope.k_norm)
            wk = __ldg(reinterpret_cast<const uint4 *>(rope.k_norm) + tid % GL);
        __syncthreads();
    }

    /* The first NS - 1 tiles before the wait (kernels/launch.cuh): the step writes one key of the
     * sequence, its last (ctx - 1, the token being decoded: k_qk_norm_rope_kv, the kernel before),
     * which is left out and brought after the wait with Q. At decode this takes the KV reads off the
     * latency chain: they run while the kernel before finishes. */
    const int jlate = ctx - 1;
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        if (live && st < n_tiles) {
            if constexpr (F8)
                load_kv_tile_f8<D, DC_THREADS, true>(sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, kv,
                                                     btab, kvh, KVH, bsh, start + st * KV_TILE, end, tid,
                                                     jlate);
            else
                load_kv_tile<D, DC_THREADS>(sKV + st * 2 * KV_TILE * D, sKV + (st * 2 + 1) * KV_TILE * D, kc,
                                            vc, btab, kvh, KVH, bsh, start + st * KV_TILE, end, tid, jlate);
        }
        cp_async_commit();
    }
    pdl_enter(); // kernels/launch.cuh
    if (!live)
        return;
    const bool late_here = jlate >= start && jlate < end, late_staged = (jlate - start) / KV_TILE < NS - 1;
    uint4 late = zero4; /* ROPE: this lane's 16 bytes of the new key's k (late_kind 1) or v (2) */
    int late_kind = 0;
    if constexpr (ROPE) { /* the prologue: q heads of this KV head to sQ; k and v of the new key */
        constexpr int GROUPS = DC_THREADS / GL;
        const int grp = tid / GL, sub = tid % GL, n_items = G + (late_here ? 2 : 0);
        const E *row = q + (size_t)qrow * q_stride;
        for (int base = 0; base < G + 2; base += GROUPS) { /* uniform: every lane shuffles */
            const int item = base + grp, kind = item < G ? 0 : item == G ? 1 : 2;
            const bool valid = item < n_items;
            const int col = (kind == 0 ? kvh * G + item : kind == 1 ? H + kvh : H + KVH + kvh) * D + sub * 8;
            const uint4 raw = valid ? ld_dep(reinterpret_cast<const uint4 *>(row + col)) : zero4;
            const uint4 braw =
                rope.bias && valid ? __ldg(reinterpret_cast<const uint4 *>(rope.bias + col)) : zero4;
            const bool norm =
                valid && (kind == 0 ? rope.q_norm != nullptr : kind == 1 && rope.k_norm != nullptr);
            float r[8];
            rope_lane<E, GL>(raw, braw, rope.bias && valid, kind == 0 ? wq : wk, norm, kind < 2, rope.eps, cs,
                             sn, r);
            if (!valid)
                continue;
            const uint4 v = float_to_x8<E>(r);
            if (kind == 0) {
                *reinterpret_cast<uint4 *>(sQ + swz<D>(item, sub)) = v;
            } else {
                if (slot >= 0) {
                    E *cache = const_cast<E *>(kind == 1 ? kc : vc);
                    *reinterpret_cast<uint4 *>(cache + rope_cache_at(slot, kvh, KVH, bs, D) + sub * 8) = v;
                    if (!late_staged) /* the main loop reads it back from L2 (cp.async.cg) */
                        __threadfence();
                }
                late = v, late_kind = kind;
            }
        }
        for (int i = tid; i < (16 - G) * GL; i += DC_THREADS) /* rows >= G are zero */
            *reinterpret_cast<uint4 *>(sQ + swz<D>(G + i / GL, i % GL)) = zero4;
    } else { /* Q: rows g < G are the query heads kvh * G + g */
        constexpr int CPR = D / 8;
#pragma unroll
        for (int i = 0; i < 16 * CPR / DC_THREADS; i++) {
            const int idx = tid + i * DC_THREADS, r = idx / CPR, c = idx % CPR;
            const bool ok = r < G;
            const E *src = ok ? q + (size_t)qrow * q_stride + (size_t)(kvh * G + r) * D + c * 8 : q;
            cp_async16(smem_u32(sQ) + swz<D>(r, c) * 2, src, ok);
        }
    }
    if (!ROPE && late_here && late_staged) { /* the key left out above */
        const int st = (jlate - start) / KV_TILE, r = jlate - start - st * KV_TILE;
        if constexpr (F8)
            load_kv_row_f8<D>(sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, kv, btab, kvh, KVH, bsh, r,
                              jlate, tid);
        else
            load_kv_row<D>(sKV + st * 2 * KV_TILE * D, sKV + (st * 2 + 1) * KV_TILE * D, kc, vc, btab, kvh,
                           KVH, bsh, r, jlate, tid);
    }
    cp_async_commit();
    cp_async_wait<0>(); /* Q, the late key and the tiles before the wait */
    __syncthreads();
    if constexpr (ROPE) { /* the new key into its stage (no copy is in flight to that row) */
        if (late_kind > 0 && late_staged) {
            const int st = (jlate - start) / KV_TILE, r = jlate - start - st * KV_TILE;
            *reinterpret_cast<uint4 *>(sKV + (st * 2 + late_kind - 1) * KV_TILE * D + swz<D>(r, tid % GL)) =
                late;
        }
        __syncthreads();
    }

    const int g4 = lane / 4, t4 = lane % 4;
    const uint32_t kfb = k_frag_base<D>(lane), vfb = v_frag_base<D>(lane);
    uint32_t qf[D / 16][4];
    float qmul = 1.f; /* fp8: what the scores owe Q's scaling (q_frags_f16) */
    if constexpr (F8) {
        qmul = q_frags_f16<D>(qf, sQ, g4, t4);
    } else {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            ldsm_x4(qf[kk], smem_u32(sQ) + swz<D>(lane % 16, kk * 2 + lane / 16) * 2);
    }

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;
    float cv = 0.f; /* fp8: o holds the output over cv, the last tile's largest v scale of this warp */

    for (int it = 0; it < n_tiles; it++) {
        const auto issue_next = [&]() {
            const int nxt = it + NS - 1;
            if (nxt < n_tiles) {
                const int sn = nxt % NS;
                if constexpr (F8)
                    load_kv_tile_f8<D, DC_THREADS, true>(sF + sn * 2 * KV_TILE * D, sS + sn * 2 * KV_TILE, kv,
                                                         btab, kvh, KVH, bsh, start + nxt * KV_TILE, end,
                                                         tid);
                else
                    load_kv_tile<D, DC_THREADS>(sKV + sn * 2 * KV_TILE * D, sKV + (sn * 2 + 1) * KV_TILE * D,
                                                kc, vc, btab, kvh, KVH, bsh, start + nxt * KV_TILE, end, tid);
            }
            cp_async_commit();
        };
        if constexpr (F8) { /* one barrier a tile: tile it has landed, and every warp is past tile it - 1,
                               whose stage the next load refills */
            cp_async_wait<NS - 2>();
            __syncthreads();
            issue_next();
        } else {
            issue_next();
            cp_async_wait<NS - 1>();
            __syncthreads();
        }

        const int st = it % NS;
        const int wj0 = start + it * KV_TILE + warp * 16; /* this warp's 16 keys */
        if (wj0 < end) {
            const uint32_t kb = smem_u32(sKV + (F8 ? 0 : st) * 2 * KV_TILE * D) + warp * 16 * D * 2;
            const uint32_t vb = F8 ? kb : kb + KV_TILE * D * 2;
            const uint8_t *sK8 = sF + st * 2 * KV_TILE * D;
            const float *sSt = sS + st * 2 * KV_TILE; /* fp8: this tile's k scales, then v scales */
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            if constexpr (F8) {
                __syncwarp(); /* the lanes' reads of the previous tile's V are done */
                v_rows_f16<D>(sKV, sK8 + KV_TILE * D, warp * 16, lane);
                s_tile_f8<D>(sc[0], qf, sK8, warp * 16 + g4, t4);
                s_tile_f8<D>(sc[1], qf, sK8, warp * 16 + 8 + g4, t4);
                /* S[., key] *= k_scale[key] (and Q's scaling), before the mask */
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const float2 ks = *reinterpret_cast<const float2 *>(sSt + warp * 16 + nt * 8 + 2 * t4);
                    const float kx = ks.x * qmul, ky = ks.y * qmul;
                    sc[nt][0] *= kx, sc[nt][1] *= ky, sc[nt][2] *= kx, sc[nt][3] *= ky;
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    uint32_t b[4];
                    ldsm_x4(b, kb + (kfb ^ (kk * 32)));
                    mma_e16<E>(sc[0], qf[kk], b[0], b[1]);
                    mma_e16<E>(sc[1], qf[kk], b[2], b[3]);
                }
            }
            if (wj0 + 15 >= end) {
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (wj0 + nt * 8 + 2 * t4 + e >= end)
                            sc[nt][e] = sc[nt][2 + e] = NEG_INF;
                    }
                }
            }
            float mxA = fmaxf(mA, fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])));
            float mxB = fmaxf(mB, fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3])));
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
            const float msA = mxA == NEG_INF ? 0.f : mxA * sl2, msB = mxB == NEG_INF ? 0.f : mxB * sl2;
            const float alA = fast_exp2(mA * sl2 - msA), alB = fast_exp2(mB * sl2 - msB);
            float oA = alA, oB = alB; /* o's factor */
            /* fp8: P[., key] *= v_scale[key] / c, c the largest of the warp's 16 (P stays in [0, 1], f16's
               best range); o, kept over c, is rescaled by c_old / c_new with the softmax's factor */
            float2 vs[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
            if constexpr (F8) {
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
                    vs[nt] = *reinterpret_cast<const float2 *>(sSt + KV_TILE + warp * 16 + nt * 8 + 2 * t4);
                float c = fmaxf(fmaxf(vs[0].x, vs[0].y), fmaxf(vs[1].x, vs[1].y));
                c = fmaxf(c, __shfl_xor_sync(0xffffffffu, c, 1));
                c = fmaxf(c, __shfl_xor_sync(0xffffffffu, c, 2));
                if (!(c > 0.f)) /* all zero (or NaN): the products are zero either way */
                    c = 1.f;
                const float inv = 1.f / c, r = cv * inv;
                cv = c;
                oA *= r, oB *= r;
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
                    vs[nt].x *= inv, vs[nt].y *= inv;
            }
            mA = mxA, mB = mxB;
            lA *= alA, lB *= alB;
#pragma unroll
            for (int i = 0; i < D / 8; i++)
                o[i][0] *= oA, o[i][1] *= oA, o[i][2] *= oB, o[i][3] *= oB;
            uint32_t pf[4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const float p0 = fast_exp2(fmaf(sc[nt][0], sl2, -msA)),
                            p1 = fast_exp2(fmaf(sc[nt][1], sl2, -msA));
                const float p2 = fast_exp2(fmaf(sc[nt][2], sl2, -msB)),
                            p3 = fast_exp2(fmaf(sc[nt][3], sl2, -msB));
                lA += p0 + p1, lB += p2 + p3;
                if constexpr (F8) { /* l sums the unscaled p */
                    pf[nt * 2] = pack2<__half>(p0 * vs[nt].x, p1 * vs[nt].y);
                    pf[nt * 2 + 1] = pack2<__half>(p2 * vs[nt].x, p3 * vs[nt].y);
                } else {
                    pf[nt * 2] = pack2<E>(p0, p1);
                    pf[nt * 2 + 1] = pack2<E>(p2, p3);
                }
            }
            if constexpr (F8)
                __syncwarp(); /* the warp's V rows (v_rows_f16) are in sKV */
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, vb + (vfb ^ (dp * 32)));
                if constexpr (F8) {
                    mma_f16(o[2 * dp], pf, b[0], b[1]);
                    mma_f16(o[2 * dp + 1], pf, b[2], b[3]);
                } else {
                    mma_e16<E>(o[2 * dp], pf, b[0], b[1]);
                    mma_e16<E>(o[2 * dp + 1], pf, b[2], b[3]);
                }
            }
        }
        if constexpr (!F8)
            __syncthreads(); /* stage st is refilled by the next iteration's load */
    }
    if constexpr (F8) {
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            o[i][0] *= cv, o[i][1] *= cv, o[i][2] *= cv, o[i][3] *= cv;
    }

    /* combine the 4 warps through shared memory (the K/V stages are free now) */
    cp_async_wait<0>();
    __syncthreads();
    float *sO = reinterpret_cast<float *>(F8 ? (void *)sF : (void *)sKV); /* [4 warps][16 rows][D] */
    float *sM = sO + 4 * 16 * D;                                          /* [4][16] */
    float *sL = sM + 4 * 16;                                              /* [4][16] */
    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    if (t4 == 0) {
        sM[warp * 16 + g4] = mA, sM[warp * 16 + g4 + 8] = mB;
        sL[warp * 16 + g4] = lA, sL[warp * 16 + g4 + 8] = lB;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        *reinterpret_cast<float2 *>(sO + (warp * 16 + g4) * D + nt * 8 + 2 * t4) =
            make_float2(o[nt][0], o[nt][1]);
        *reinterpret_cast<float2 *>(sO + (warp * 16 + g4 + 8) * D + nt * 8 + 2 * t4) =
            make_float2(o[nt][2], o[nt][3]);
    }
    __syncthreads();

    const int H_D = H * D;
    for (int idx = tid; idx < G * D / 2; idx += DC_THREADS) {
        const int r = idx / (D / 2), d = (idx % (D / 2)) * 2;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < 4; w++)
            M = fmaxf(M, sM[w * 16 + r]);
        float L = 0.f, x = 0.f, y = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float mw = sM[w * 16 + r];
            const float e = mw == NEG_INF ? 0.f : fast_exp2((mw - M) * sl2);
            const float2 v = *reinterpret_cast<const float2 *>(sO + (w * 16 + r) * D + d);
            L += sL[w * 16 + r] * e, x += v.x * e, y += v.y * e;
        }
        const float inv = L > 0.f ? 1.f / L : 0.f;
        const int h = kvh * G + r;
        if (n_part_s == 1) {
            *reinterpret_cast<uint32_t *>(out + (size_t)qrow * H_D + (size_t)h * D + d) =
                pack2<E>(x * inv, y * inv);
        } else {
            const size_t slot = ((size_t)s * H + h) * n_part_max + p;
            *reinterpret_cast<float2 *>(ws_o + slot * D + d) = make_float2(x * inv, y * inv);
            if (d == 0)
                ws_ml[slot] = make_float2(M * sl2, L); /* every partition has >= 1 key: M is finite */
        }
    }
}

/* One warp per (sequence, head) of a split sequence: out = sum_p w_p o_p / sum_p w_p with
 * w_p = l_p * 2^(m_p - max m). Block (32, 4). A latency chain at decode (one warp's loads are the
 * whole kernel): lane p holds partition p's (m, l), and the partial outputs of DR_BATCH partitions
 * are loaded together, the first batch in flight with the (m, l) loads; the sum runs over p in order. */
constexpr int DR_BATCH = 16;

template <int V>
__device__ __forceinline__ void load_parts(float (&x)[DR_BATCH][V], const float *__restrict__ ws_o,
                                           size_t base, int p0, int n, int D, int lane)
{
#pragma unroll
    for (int j = 0; j < DR_BATCH; j++) {
        const int p = min(p0 + j, n - 1);
        const float *src = ws_o + (base + p) * D + lane * V;
        if constexpr (V == 4) {
            const float4 v = ld_dep(reinterpret_cast<const float4 *>(src));
            x[j][0] = v.x, x[j][1] = v.y, x[j][2] = v.z, x[j][3] = v.w;
        } else {
#pragma unroll
            for (int v = 0; v < V; v++)
                x[j][v] = ld_dep(src + v);
        }
    }
}

template <typename E, int D>
__global__ void __launch_bounds__(128)
    attention_decode_reduce_kernel(const float *__restrict__ ws_o, const float2 *__restrict__ ws_ml,
                                   const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                                   E *__restrict__ out, int n_seqs, int H, int part_keys, int n_part_max)
{
    constexpr int V = D / 32; /* elements per lane */
    const int gw = blockIdx.x * 4 + threadIdx.y, lane = threadIdx.x;
    const int s = gw / H, h = gw % H;
    /* the step's inputs (uploaded before it, kernels/launch.cuh) before the wait */
    const int ctx = s < n_seqs ? max(ctx_len[s], 0) : 0, qs = s < n_seqs ? q_start[s] : 0;
    pdl_enter(); // kernels/launch.cuh
    if (s >= n_seqs)
        return;
    const int n = min(max((ctx + part_keys - 1) / part_keys, 1), n_part_max);
    if (n <= 1)
        return; /* written by the partition kernel */
    const size_t base = ((size_t)s * H + h) * n_part_max;
    const float2 ml_lane = lane < n ? ld_dep(ws_ml + base + lane) : make_float2(NEG_INF, 0.f);
    float x[DR_BATCH][V];
    load_parts<V>(x, ws_o, base, 0, n, D, lane);
    float M = ml_lane.x;
    for (int p = lane + 32; p < n; p += 32)
        M = fmaxf(M, ld_dep(ws_ml + base + p).x);
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float acc[V], L = 0.f;
#pragma unroll
    for (int v = 0; v < V; v++)
        acc[v] = 0.f;
    for (int p0 = 0; p0 < n; p0 += DR_BATCH) {
        if (p0 > 0)
            load_parts<V>(x, ws_o, base, p0, n, D, lane);
#pragma unroll
        for (int j = 0; j < DR_BATCH; j++) {
            const int p = p0 + j; /* warp-uniform */
            if (p >= n)
                break;
            const float2 ml = p < 32 ? make_float2(__shfl_sync(0xffffffffu, ml_lane.x, p),
                                                   __shfl_sync(0xffffffffu, ml_lane.y, p))
                                     : ld_dep(ws_ml + base + p);
            const float w = ml.y * fast_exp2(ml.x - M);
            L += w;
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[v] += w * x[j][v];
        }
    }
    const float inv = 1.f / L;
    E *dst = out + (size_t)qs * H * D + (size_t)h * D + lane * V;
#pragma unroll
    for (int v = 0; v < V; v += 2)
        *reinterpret_cast<uint32_t *>(dst + v) = pack2<E>(acc[v] * inv, acc[v + 1] * inv);
}

/* Decode partitioning: decode_split, engine/decode_split.h (shared with the CPU backend's emulation). */
static_assert(KV_TILE == DECODE_SPLIT_TILE, "decode partitions are whole K/V tiles");

size_t decode_ws_bytes(int n_seqs, int H, int D, int n_part)
{
    return n_part <= 1 ? 0 : (size_t)n_seqs * H * n_part * ((size_t)D * 4 + sizeof(float2));
}

/* A grid of at most one CTA an SM (a few sequences: one sequence is 8 KV heads x up to 32 partitions on
 * Qwen3-14B) runs the kernel's ONE instance, whose preferred carve-out is one CTA's shared memory (and the
 * per-CTA reservation): the SM keeps the rest of its 256 KB as L1, which the K/V reads of so few CTAs use.
 * For the kernel sized for three CTAs an SM the driver takes the largest shared-memory configuration (228 KB,
 * 28 KB of L1) on every SM the attention runs on. */
template <typename F> int decode_carveout_one(F *kernel, int smem, bool (&done)[16])
{
    int dev = 0, max_sm = 0, reserved = 0;
    K_CHECK(cudaGetDevice(&dev));
    if (dev < 16 && done[dev])
        return 0;
    K_CHECK(cudaDeviceGetAttribute(&max_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    K_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    const int pct = max_sm > 0 ? std::min(100, (100 * (smem + reserved) + max_sm - 1) / max_sm) : 100;
    K_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct));
    if (dev < 16)
        done[dev] = true;
    return 0;
}

template <typename E, int D, bool F8, bool ROPE>
int launch_decode(const E *q, int q_stride, const kv_src &kv, const k_attn_batch *b, E *out, int H, int KVH,
                  int block_size, float sl2, int part, int n_part, void *ws, const k_rope_in &rope,
                  cudaStream_t stream)
{
    static bool smem_done[2][16], carve_done[16];
    const bool one = (long long)n_part * KVH * b->n_seqs <= k_sm_count();
    auto *kernel =
        one ? attention_decode_kernel<E, D, F8, ROPE, true> : attention_decode_kernel<E, D, F8, ROPE, false>;
    if (raise_smem(kernel, decode_smem<D, F8>(), smem_done[one]) ||
        (one && decode_carveout_one(kernel, decode_smem<D, F8>(), carve_done)))
        return -1;
    float *ws_o = (float *)ws;
    float2 *ws_ml = n_part > 1 ? (float2 *)(ws_o + (size_t)b->n_seqs * H * n_part * D) : nullptr;
    dim3 grid(n_part, KVH, b->n_seqs);
    K_CHECK(k_launch(kernel, grid, DC_THREADS, decode_smem<D, F8>(), stream, q, q_stride, kv, b->q_start,
                     b->ctx_len, b->block_tables, b->max_blocks, out, H, KVH, block_size, sl2, part, n_part,
                     ws_o, ws_ml, rope));
    if (n_part > 1) {
        const long long warps = (long long)b->n_seqs * H;
        K_CHECK(k_launch(attention_decode_reduce_kernel<E, D>, (unsigned)((warps + 3) / 4), dim3(32, 4), 0,
                         stream, ws_o, ws_ml, b->q_start, b->ctx_len, out, b->n_seqs, H, part, n_part));
    }
    return 0;
}

/* E: the 16-bit element type (kernels.h: bf16, or fp16 in fp16 mode); bf16 with an fp8 cache */
template <typename E, bool F8 = false, bool ROPE = false>
int decode_impl(const char *fn, const bf16 *q_, int q_stride, const kv_src &kv, const struct k_attn_batch *b,
                bf16 *out_, int H, int KVH, int D, int block_size, float scale, int part_keys,
                void *workspace, size_t workspace_bytes, cudaStream_t stream,
                const k_rope_in &rope = k_rope_in{})
{
    if (check_common(fn, q_, q_stride, kv, F8, b, out_, H, KVH, D, block_size))
        return -1;
    const E *q = reinterpret_cast<const E *>(q_);
    E *out = reinterpret_cast<E *>(out_);
    K_REQUIRE(H / KVH <= 16, "%s: %d query heads per KV head (at most 16)", fn, H / KVH);
    if (b->n_seqs <= 0)
        return 0;
    int part, n_part;
    decode_split(b->n_seqs, b->max_ctx_len, part_keys, &part, &n_part, nullptr);
    const size_t need = decode_ws_bytes(b->n_seqs, H, D, n_part);
    K_REQUIRE(need == 0 || (workspace && workspace_bytes >= need && (uintptr_t)workspace % 16 == 0),
              "%s: workspace of %zu bytes (16-byte aligned) needed, %zu given", fn, need,
              workspace ? workspace_bytes : (size_t)0);
    const float sl2 = scale * 1.4426950408889634f;
    return D == 128 ? launch_decode<E, 128, F8, ROPE>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, part,
                                                      n_part, workspace, rope, stream)
                    : launch_decode<E, 64, F8, ROPE>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, part,
                                                     n_part, workspace, rope, stream);
}

} // namespace

extern "C" size_t k_attention_decode_workspace_split(int n_seqs, int H, int D, int max_ctx_len, int part_keys)
{
    int part, n_part, n_bound;
    decode_split(n_seqs, max_ctx_len, part_keys, &part, &n_part, &n_bound);
    return decode_ws_bytes(n_seqs, H, D, n_bound);
}

extern "C" size_t k_attention_decode_workspace(int n_seqs, int H, int D, int max_ctx_len)
{
    return k_attention_decode_workspace_split(n_seqs, H, D, max_ctx_len, 0);
}

extern "C" int k_attention_decode_parts(int n_seqs, int max_ctx_len, int part_keys, int *part)
{
    int p, n_part;
    decode_split(n_seqs, max_ctx_len, part_keys, &p, &n_part, nullptr);
    if (part)
        *part = p;
    return n_part;
}

extern "C" int k_attention_decode_split(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                                        const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                        int block_size, float scale, int part_keys, void *workspace,
                                        size_t workspace_bytes, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, nullptr, nullptr};
    return K_ELT16(decode_impl, "k_attention_decode", q, q_stride, kv, b, out, H, KVH, D, block_size, scale,
                   part_keys, workspace, workspace_bytes, stream);
}

extern "C" int k_attention_decode_rope(const bf16 *qkv, const struct k_rope_in *rope, bf16 *k_cache,
                                       bf16 *v_cache, const struct k_attn_batch *b, bf16 *out, int H, int KVH,
                                       int D, int block_size, float scale, int part_keys, void *workspace,
                                       size_t workspace_bytes, cudaStream_t stream)
{
    K_REQUIRE(rope && rope->positions && rope->inv_freq && rope->slot_mapping,
              "k_attention_decode_rope: NULL rope, positions, inv_freq or slot_mapping");
    K_REQUIRE(!(rope->eps < 0), "k_attention_decode_rope: eps %g < 0", (double)rope->eps);
    K_REQUIRE(((uintptr_t)rope->bias | (uintptr_t)rope->q_norm | (uintptr_t)rope->k_norm) % 16 == 0,
              "k_attention_decode_rope: bias, q_norm and k_norm must be 16-byte aligned");
    const kv_src kv = {k_cache, v_cache, nullptr, nullptr};
    return k_f16() ? decode_impl<__half, false, true>("k_attention_decode_rope", qkv, (H + 2 * KVH) * D, kv,
                                                      b, out, H, KVH, D, block_size, scale, part_keys,
                                                      workspace, workspace_bytes, stream, *rope)
                   : decode_impl<bf16, false, true>("k_attention_decode_rope", qkv, (H + 2 * KVH) * D, kv, b,
                                                    out, H, KVH, D, block_size, scale, part_keys, workspace,
                                                    workspace_bytes, stream, *rope);
}

extern "C" int k_attention_decode(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                                  const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                  int block_size, float scale, void *workspace, size_t workspace_bytes,
                                  cudaStream_t stream)
{
    return k_attention_decode_split(q, q_stride, k_cache, v_cache, b, out, H, KVH, D, block_size, scale, 0,
                                    workspace, workspace_bytes, stream);
}

extern "C" int k_attention_decode_split_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache,
                                            const uint8_t *v_cache, const float *k_scale,
                                            const float *v_scale, const struct k_attn_batch *b, bf16 *out,
                                            int H, int KVH, int D, int block_size, float scale, int part_keys,
                                            void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, k_scale, v_scale};
    return decode_impl<bf16, true>("k_attention_decode_fp8", q, q_stride, kv, b, out, H, KVH, D, block_size,
                                   scale, part_keys, workspace, workspace_bytes, stream);
}

extern "C" int k_attention_decode_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache,
                                      const uint8_t *v_cache, const float *k_scale, const float *v_scale,
                                      const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                      int block_size, float scale, void *workspace, size_t workspace_bytes,
                                      cudaStream_t stream)
{
    return k_attention_decode_split_fp8(q, q_stride, k_cache, v_cache, k_scale, v_scale, b, out, H, KVH, D,
                                        block_size, scale, 0, workspace, workspace_bytes, stream);
}
