/* Causal prefill attention over the paged KV cache, FlashAttention-2 style (and FlashAttention-3's
 * warp specialization on sm_90a): the kernel, its launcher and k_attention_prefill(_fp8). What it
 * shares with the decode kernel: kernels/attention.cuh; notes and numbers: docs/KERNELS.md,
 * "Attention". */
#include <atomic>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/test_paths.h"
#include "kernels/tma.cuh"
#include "kernels/warpgroup.cuh"
#include "kernels/wgmma.cuh"

namespace
{

/* The wgmma prefill's tensor maps of the 16-bit cache's K and V (rows of D, read keys_per_copy rows at a
 * time: min(block size, 128)); keys_per_copy 0: its tiles are loaded with cp.async instead. The maps
 * say bf16 for an fp16 cache too: a tile copy moves the 2-byte elements unchanged (no conversion, no
 * out-of-bounds fill: copies stay inside the pool), so the element type in the map is only its size. */
struct kv_maps {
    CUtensorMap k, v;
    int keys_per_copy;
};

/* ---- prefill: grid (row tiles, KVH, n_seqs), BM = 128 packed rows per CTA, 16 per warp (8 warps).
 *
 * WG (sm_90a, D = 128, BM = 128): the two products run on the warpgroup tensor cores (kernels/wgmma.cuh),
 * each warpgroup's 64 rows against the whole K/V tile in shared memory, K and V in the
 * 128-byte-swizzled layout (sw128_off); mask, online softmax and stores stay per warp.
 *   - 16-bit cache (PIPE): 128-key tiles in three stages, Q read from shared memory (swizzled too),
 *     S = Q K^T as 8 m64n128k16, O += P V as 8 m64n128k16 with P from registers, pipelined (below);
 *     the tiles come through tensor maps in the warp-specialized kernel (WS, below), or where no tensor
 *     map can be made, by cp.async from every thread with both warpgroups in lockstep.
 *   - fp8 cache: the mma.sync kernel's order and 64-key tiles (converted to bf16), S as 8 m64n64k16
 *     with Q from registers, P V as 4 m64n128k16; a warpgroup skips a tile above all of its rows.
 *
 * WS (the 16-bit cache through tensor maps, FlashAttention-3's warp specialization): 384 threads, a
 * producer warpgroup (one warp issues every tile's copies, waiting for a stage to be released before it
 * refills it; 24 registers a thread) and the two consumer warpgroups of the 128 rows (240 registers),
 * with no CTA-wide barrier in the loop: a consumer thread releases a stage (an arrival on the stage's
 * "empty" barrier) once its P V of that tile is done, and the two consumer warpgroups take turns
 * issuing their products (named barriers, "ping-pong"), so that one's softmax runs while the other's
 * products keep the tensor cores busy. The cp.async kernel has both warpgroups issue at once, then both
 * do their softmax while the tensor cores have only the P V products left, and a __syncthreads per tile
 * frees the stage. */
template <int D, int BM, bool F8, bool WG = false> constexpr int prefill_smem()
{
    /* 16-bit: sQ, two stages of K and V (PIPE: three of 128 keys). fp8: sQ, one bf16 K and V tile, two
     * staging stages of e4m3 K and V with their scales, the current tile's scales. WG: + 1 KB to align
     * the K/V tiles to 1024 bytes */
    return (F8 ? BM * D * 2 + 2 * KV_TILE * D * 2 + 2 * 2 * KV_TILE * D + 3 * 2 * KV_TILE * 4
               : (BM + 2 * (WG ? 6 : 2) * KV_TILE) * D * 2) +
           (WG ? 1024 : 0) + (WG && !F8 ? 64 : 0); /* the pipelined loop's tile barriers (WS: seven) */
}
/* CTAs per SM the register budget is cut for: at D = 128 a thread needs ~235 registers */
template <int D, int BM> constexpr int prefill_min_ctas()
{
    return (D <= 64 ? 2 : 1) * (128 / BM);
}

/* E: the 16-bit type of q, the cache (F8: the converted tiles), P for P V and out; bf16 when F8 */
template <typename E, int D, int BM, bool F8, bool WG = false, bool WS = false, int NT = BM *(WS ? 3 : 2)>
__global__ void __launch_bounds__(NT, WS ? 1 : prefill_min_ctas<D, BM>())
    attention_prefill_kernel(const E *__restrict__ q, int q_stride, const kv_src kv,
                             const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                             const int32_t *__restrict__ btabs, int max_blocks, E *__restrict__ out, int H,
                             int KVH, int bs, float sl2, const __grid_constant__ kv_maps maps)
{
    static_assert(!F8 || std::is_same<E, bf16>::value, "the fp8 cache's kernels are bf16 only");
    static_assert(!WG || (D == 128 && BM == 128), "the wgmma prefill is for D = 128, BM = 128");
    static_assert(!WS || (WG && !F8), "the warp-specialized prefill is the 16-bit cache's wgmma kernel");
    pdl_enter();                   // kernels/launch.cuh
    const int bsh = __ffs(bs) - 1; /* bs is a power of two (check_common) */
    /* 64-key K/V tiles: two stages, or the one converted fp8 tile; the pipelined wgmma loop: three
     * stages of 128 keys */
    constexpr int KST = F8 ? 1 : WG ? 6 : 2;
    constexpr bool PIPE = WG && !F8; /* the pipelined wgmma loop below */
    extern __shared__ __align__(128) unsigned char smem_raw[];
    /* WG: the K/V tiles (16 KB each) first, on a 1024-byte boundary */
    unsigned char *smem = WG ? smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023) : smem_raw;
    E *sK = reinterpret_cast<E *>(smem);                             /* [KST][KV_TILE][D] */
    E *sV = sK + KST * KV_TILE * D;                                  /* [KST][KV_TILE][D] */
    E *sQ = sV + KST * KV_TILE * D;                                  /* [BM][D] */
    uint8_t *sF = reinterpret_cast<uint8_t *>(sQ + BM * D);          /* fp8: [2][K, V][KV_TILE][D] */
    float *sS = reinterpret_cast<float *>(sF + 2 * 2 * KV_TILE * D); /* fp8: [2][K, V][KV_TILE] */
    float *sSc = sS + 2 * 2 * KV_TILE;                               /* fp8: [K, V][KV_TILE] */
    const E *kc = static_cast<const E *>(kv.k), *vc = static_cast<const E *>(kv.v);

    const int G = H / KVH;
    const int s = blockIdx.z, kvh = blockIdx.y;
    const int tile = gridDim.x - 1 - blockIdx.x; /* the longest (last) row tiles start first */
    const int q0 = q_start[s], n_q = q_start[s + 1] - q0, ctx = ctx_len[s];
    const int rows = n_q * G, r0 = tile * BM;
    if (r0 >= rows)
        return;
    const int past = ctx - n_q; /* position of the first query token */
    const int kv_end = past + min(r0 + BM - 1, rows - 1) / G + 1;
    const int n_tiles = (kv_end + KV_TILE - 1) / KV_TILE;
    const int32_t *btab = btabs + (size_t)s * max_blocks;
    /* WS: threads 0..127 are the producer warpgroup; tid and warp count the consumers' threads from 0 */
    constexpr int NC = WS ? NT - 128 : NT; /* threads that compute */
    const bool producer = WS && threadIdx.x < 128;
    const int tid = (int)threadIdx.x - (WS ? 128 : 0), warp = tid / 32, lane = threadIdx.x % 32;

    /* Q tile (the consumers): packed row r -> token r / G, head kvh * G + r % G; rows past the end are 0 */
    if (!producer) {
        constexpr int CPR = D / 8, RPP = NC / CPR;
        const int c = tid % CPR;
#pragma unroll
        for (int i = 0; i < BM / RPP; i++) {
            const int r = tid / CPR + i * RPP, pr = r0 + r;
            const bool ok = pr < rows;
            const E *src = q;
            if (ok) {
                const int tok = pr / G, g = pr - tok * G;
                src = q + (size_t)(q0 + tok) * q_stride + (size_t)(kvh * G + g) * D + c * 8;
            }
            /* PIPE: each warpgroup's 64 rows as a 128-byte-swizzled A operand */
            cp_async16(smem_u32(sQ) + (PIPE ? (r / 64) * 16384 + sw128_off(r % 64, c) : swz<D>(r, c) * 2),
                       src, ok);
        }
    }
    cp_async_commit();
    /* PIPE: 128-key tiles (two 64-key loads each) in stage t % 3 */
    constexpr int KT = 2 * KV_TILE;
    const int nt2 = (kv_end + KT - 1) / KT;
    auto load2 = [&](int t) {
        E *k = sK + (t % 3) * KT * D, *v = sV + (t % 3) * KT * D;
        load_kv_tile<D, NC, KT>(k, v, kc, vc, btab, kvh, KVH, bsh, t * KT, kv_end, tid, -1, 0);
        load_kv_tile<D, NC, KT>(k, v, kc, vc, btab, kvh, KVH, bsh, t * KT + KV_TILE, kv_end, tid, -1,
                                KV_TILE);
    };
    /* WS (tensor maps): warp 0 issues a tile's copies, lane c the keys_per_copy keys from
     * c * keys_per_copy of K and V (two 64-column halves each), completing on barrier t % 3 (phase
     * (t / 3) & 1); the lane reads its block-table entry (tma_row) before the wait that precedes the
     * issue, so the read's latency is hidden. Keys past kv_end are not copied, and their V rows are
     * zeroed once the tile has landed (v_tail): an unwritten slot of the last block may hold anything,
     * and 0 * NaN would poison P V. K rows past kv_end need nothing: the causal mask overwrites their
     * scores. */
    [[maybe_unused]] uint64_t *bars = reinterpret_cast<uint64_t *>(sF);
    /* warp 0: the cache row of this lane's copy of tile t, or -1 */
    auto tma_row = [&](int t) {
        const int R = maps.keys_per_copy, j = t * KT + lane * R;
        return t < nt2 && lane * R < KT && j < kv_end ? (int)kv_row(btab, j, kvh, KVH, bsh) : -1;
    };
    /* warp 0: tile t's copies, this lane's (row from tma_row) */
    auto tma_issue = [&](int t, int row) {
        const int R = maps.keys_per_copy, j0 = t * KT, j1 = min(j0 + KT, kv_end);
        const uint32_t bar = smem_u32(bars + t % 3);
        if (lane == 0)
            mbar_arrive_expect_tx(bar, (uint32_t)((j1 - j0 + R - 1) / R) * R * 128 * 4);
        __syncwarp();
        if (row >= 0) {
            const uint32_t off = (uint32_t)(lane * R) * 128;
            const uint32_t kb = smem_u32(sK + (t % 3) * KT * D) + off,
                           vb = smem_u32(sV + (t % 3) * KT * D) + off;
            tma_load_2d(kb, &maps.k, 0, row, bar);
            tma_load_2d(kb + KT * 128, &maps.k, 64, row, bar);
            tma_load_2d(vb, &maps.v, 0, row, bar);
            tma_load_2d(vb + KT * 128, &maps.v, 64, row, bar);
        }
    };
    /* zero V rows kv_end - t * KT .. KT - 1 of tile t (both halves, whole rows: swizzle-blind); threads
     * first, first + step, ... */
    auto v_tail = [&](int t, int first, int step) {
        const int rz = kv_end - t * KT;
        unsigned char *v = reinterpret_cast<unsigned char *>(sV + (t % 3) * KT * D);
        for (int i = first; i < (KT - rz) * 16; i += step)
            *reinterpret_cast<uint4 *>(v + ((i % 16) >> 3) * KT * 128 + (rz + i / 16) * 128 + (i % 8) * 16) =
                make_uint4(0, 0, 0, 0);
    };
    /* WS barriers: bars[0..2] "full" (tile t landed in stage t % 3), bars[3..5] "empty" (the 256 consumer
     * threads are done with the tile in stage t % 3), bars[6] "tail" (the last tile's V tail is zeroed) */
    if constexpr (WS) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < 3; i++)
                mbar_init(smem_u32(bars + i), 1), mbar_init(smem_u32(bars + 3 + i), NC);
            mbar_init(smem_u32(bars + 6), 1);
        }
        __syncthreads(); /* the barriers before anyone waits on them; the last CTA-wide barrier */
        if (producer) {
            wg_reg_dealloc<24>();
            if (threadIdx.x >= 32)
                return;
            /* warp 0: every tile's copies, a stage refilled once its last tile is released */
            int row = tma_row(0);
            for (int t = 0; t < nt2; t++) {
                const int next = tma_row(t + 1);
                if (t >= 3)
                    mbar_wait(smem_u32(bars + 3 + t % 3), (t / 3 - 1) & 1);
                tma_issue(t, row);
                row = next;
            }
            /* the last tile's V rows past kv_end, once it has landed; then the consumers' last P V may run */
            const int last = nt2 - 1;
            if (kv_end - last * KT < KT) {
                mbar_wait(smem_u32(bars + last % 3), (last / 3) & 1);
                v_tail(last, lane, 32);
                wg_fence_smem();
            }
            __syncwarp();
            if (lane == 0)
                mbar_arrive(smem_u32(bars + 6));
            return;
        }
        wg_reg_alloc<240>();
        cp_async_wait<0>(); /* Q: this thread's copies, then its warpgroup's */
        wg_fence_smem();
        named_bar_sync(3 + warp / 4, 128);
    } else if constexpr (PIPE) { /* tiles 0 and 1 */
        load2(0);
        cp_async_commit();
        if (nt2 > 1)
            load2(1);
        cp_async_commit();
        cp_async_wait<1>(); /* Q and tile 0 */
        wg_fence_smem();
    } else {
        if constexpr (F8)
            load_kv_tile_f8<D, NT>(sF, sS, kv, btab, kvh, KVH, bsh, 0, kv_end, tid);
        else
            load_kv_tile<D, NT>(sK, sV, kc, vc, btab, kvh, KVH, bsh, 0, kv_end, tid);
        cp_async_commit();
        cp_async_wait<1>();
    }
    if constexpr (!WS)
        __syncthreads();

    /* this warp's 16 rows: Q fragments, and the query position of the thread's two rows (g4, g4+8);
     * padding rows past the end act as the last row and are not stored */
    const int g4 = lane / 4, t4 = lane % 4;
    const int wr0 = r0 + warp * 16;
    const bool warp_active = wr0 < rows;
    const int qposA = past + min(wr0 + g4, rows - 1) / G;
    const int qposB = past + min(wr0 + g4 + 8, rows - 1) / G;
    const int w_qmin = past + min(wr0, rows - 1) / G;
    const int w_qmax = past + min(wr0 + 15, rows - 1) / G;
    /* WG: this warpgroup's 64 rows (uniform over its 4 warps) */
    const int g_r0 = r0 + (warp / 4) * 64;
    const bool g_active = g_r0 < rows;
    const int g_qmax = past + min(g_r0 + 63, rows - 1) / G;

    uint32_t qf[D / 16][4]; /* PIPE reads Q from shared memory */
    if constexpr (!PIPE)
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            ldsm_x4(qf[kk], smem_u32(sQ) + swz<D>(warp * 16 + (lane % 16), kk * 2 + lane / 16) * 2);

    [[maybe_unused]] const uint32_t kfb = k_frag_base<D>(lane), vfb = v_frag_base<D>(lane);
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;

    /* The online softmax of one S tile in place (this warp's 16 rows x NB * 8 keys from key j0): fp8 key
     * scales, the causal mask, new maxima and sums; sc becomes p (unscaled by the fp8 value scales), and
     * alA, alB are the factors this thread's two O rows are to be rescaled by. A row whose keys are all
     * masked so far keeps m = -inf and p = 0. The maxima and sums run as four independent chains a row
     * (the SASS had one dependent chain of NB steps). */
    auto softmax_exp = [&](auto &sc, int j0, float &alA, float &alB) {
        constexpr int NB = std::extent<std::remove_reference_t<decltype(sc)>>::value; /* 8-key blocks */
        static_assert(NB % 4 == 0, "four chains");
        if constexpr (F8) { /* S[., key] *= k_scale[key], before the mask (-inf * 0 would be NaN) */
#pragma unroll
            for (int nt = 0; nt < NB; nt++) {
                const float2 ks = *reinterpret_cast<const float2 *>(sSc + nt * 8 + 2 * t4);
                sc[nt][0] *= ks.x, sc[nt][1] *= ks.y, sc[nt][2] *= ks.x, sc[nt][3] *= ks.y;
            }
        }
        /* causal mask (also covers keys >= kv_end: every qpos < kv_end) */
        if (j0 + NB * 8 - 1 > w_qmin) {
#pragma unroll
            for (int nt = 0; nt < NB; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = j0 + nt * 8 + 2 * t4 + e;
                    if (j > qposA)
                        sc[nt][e] = NEG_INF;
                    if (j > qposB)
                        sc[nt][2 + e] = NEG_INF;
                }
            }
        }
        float xA[4], xB[4];
#pragma unroll
        for (int c = 0; c < 4; c++)
            xA[c] = fmaxf(sc[c][0], sc[c][1]), xB[c] = fmaxf(sc[c][2], sc[c][3]);
#pragma unroll
        for (int nt = 4; nt < NB; nt++) {
            xA[nt % 4] = fmaxf(xA[nt % 4], fmaxf(sc[nt][0], sc[nt][1]));
            xB[nt % 4] = fmaxf(xB[nt % 4], fmaxf(sc[nt][2], sc[nt][3]));
        }
        float mxA = fmaxf(fmaxf(mA, fmaxf(xA[0], xA[1])), fmaxf(xA[2], xA[3]));
        float mxB = fmaxf(fmaxf(mB, fmaxf(xB[0], xB[1])), fmaxf(xB[2], xB[3]));
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
        const float msA = mxA == NEG_INF ? 0.f : mxA * sl2, msB = mxB == NEG_INF ? 0.f : mxB * sl2;
        alA = fast_exp2(mA * sl2 - msA), alB = fast_exp2(mB * sl2 - msB);
        mA = mxA, mB = mxB;
        float sA[4] = {0.f, 0.f, 0.f, 0.f}, sB[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < NB; nt++) {
            sc[nt][0] = fast_exp2(fmaf(sc[nt][0], sl2, -msA));
            sc[nt][1] = fast_exp2(fmaf(sc[nt][1], sl2, -msA));
            sc[nt][2] = fast_exp2(fmaf(sc[nt][2], sl2, -msB));
            sc[nt][3] = fast_exp2(fmaf(sc[nt][3], sl2, -msB));
            sA[nt % 4] += sc[nt][0] + sc[nt][1], sB[nt % 4] += sc[nt][2] + sc[nt][3];
        }
        lA = fmaf(lA, alA, (sA[0] + sA[1]) + (sA[2] + sA[3]));
        lB = fmaf(lB, alB, (sB[0] + sB[1]) + (sB[2] + sB[3]));
    };
    /* p (from softmax_exp) as the A fragments of P V; fp8: times the keys' value scales */
    auto pack_p = [&](auto &sc, auto &pf) {
        constexpr int NB = std::extent<std::remove_reference_t<decltype(sc)>>::value;
#pragma unroll
        for (int nt = 0; nt < NB; nt++) {
            if constexpr (F8) {
                const float2 vs = *reinterpret_cast<const float2 *>(sSc + KV_TILE + nt * 8 + 2 * t4);
                pf[nt / 2][(nt % 2) * 2] = pack2<E>(sc[nt][0] * vs.x, sc[nt][1] * vs.y);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack2<E>(sc[nt][2] * vs.x, sc[nt][3] * vs.y);
            } else {
                pf[nt / 2][(nt % 2) * 2] = pack2<E>(sc[nt][0], sc[nt][1]);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack2<E>(sc[nt][2], sc[nt][3]);
            }
        }
    };
    auto softmax_p = [&](auto &sc, int j0, auto &pf, float &alA, float &alB) {
        softmax_exp(sc, j0, alA, alB);
        pack_p(sc, pf);
    };

    auto rescale_o = [&](float alA, float alB) {
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            o[i][0] *= alA, o[i][1] *= alA, o[i][2] *= alB, o[i][3] *= alB;
    };

    if constexpr (PIPE) {
        /* Pipelined (FlashAttention-3's order within a warpgroup): while the tensor cores run
         * O += P(it) V(it), the warps do the softmax of S(it + 1), whose product was issued just before;
         * O is rescaled once that P V is done. Tiles of 128 keys in three stages: tiles it and it + 1 in
         * use, it + 2 in flight. Q is read from shared memory. Both warpgroups work on every tile of
         * the CTA (the causal mask zeroes what lies above a row) and nothing around a wgmma branches,
         * so that ptxas keeps the wgmmas asynchronous (a wgmma under a branch it cannot prove uniform
         * over the warpgroup is serialized). */
        float sc[KT / 8][4];
        uint32_t pf[KT / 16][4];
        /* a k step's descriptor is its stage's plus its byte offset (wg_desc_at): one add, not six */
        const uint64_t qd = wg_desc(smem_u32(sQ) + (warp / 4) * 16384, 16, 1024);
        /* S = Q K(t)^T, one group */
        auto s_issue = [&](int t) {
            const uint64_t kd = wg_desc(smem_u32(sK + (t % 3) * KT * D), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wg_m64n128k16_ss<E>(sc, wg_desc_at(qd, (kk / 4) * 8192 + (kk % 4) * 32),
                                    wg_desc_at(kd, (kk / 4) * KT * 128 + (kk % 4) * 32), kk > 0);
            wg_commit();
            wg_hold(sc);
        };
        /* O += P V(t), one group */
        auto pv_issue = [&](int t) {
            const uint64_t vd = wg_desc(smem_u32(sV + (t % 3) * KT * D), KT * 128, 1024);
            wg_hold(o);
#pragma unroll
            for (int kk = 0; kk < KT / 16; kk++)
                wg_m64n128k16_nmajor<E>(o, pf[kk], wg_desc_at(vd, kk * 2048));
            wg_commit();
            wg_hold(o);
        };
        /* once S(t + 1) and P V(t) are issued: the softmax of S(t + 1) in place, then, once P V(t) is done,
         * O rescaled and P(t + 1) packed into the registers P V(t) read (FlashAttention-3's order).
         * Packing during the softmax wrote registers the running product still read, so ptxas waited
         * for P V(t) first. ptxas still hoists the second wait above the softmax (to the start of its
         * basic block, as the SASS shows), so the softmax runs after both products, beside the other
         * warpgroup's (a loop rotated to put the wait past the back edge ran the softmax beside P V(t),
         * and slower). */
        auto finish = [&](int t) {
            float alA, alB;
            wg_wait<1>(); /* S(t + 1) */
            wg_hold(sc);
            softmax_exp(sc, (t + 1) * KT, alA, alB);
            wg_hold(sc);  /* the softmax above the wait in the PTX (ptxas moves the wait up regardless) */
            wg_wait<0>(); /* P(t) V(t) */
            wg_hold(o);
            wg_keep(pf);
            rescale_o(alA, alB);
            pack_p(sc, pf);
        };
        if constexpr (WS) {
            /* Ping-pong: warpgroup w issues its products once named barrier 1 + w lets it, then lets the
             * other one (barrier 2 - w); warpgroup 0 goes first. Each issues nt2 + 1 times: S(0), then
             * S(it + 1) with P V(it), then the last P V; warpgroup 1's arrival after its last issue is
             * left out, so that each barrier sees as many arrivals as waits. */
            const int w = warp / 4;
            if (w == 1)
                named_bar_arrive(1, 256);
            float a, b;
            mbar_wait(smem_u32(bars), 0); /* tile 0 landed */
            named_bar_sync(1 + w, 256);
            wg_fence();
            s_issue(0);
            named_bar_arrive(2 - w, 256);
            wg_wait<0>();
            wg_hold(sc);
            softmax_p(sc, 0, pf, a, b);
            for (int it = 0; it + 1 < nt2; it++) {
                mbar_wait(smem_u32(bars + (it + 1) % 3), ((it + 1) / 3) & 1); /* tile it + 1 landed */
                named_bar_sync(1 + w, 256);
                wg_fence();
                s_issue(it + 1);
                pv_issue(it);
                named_bar_arrive(2 - w, 256);
                finish(it);
                /* this thread is done with tile it: once all are, its stage may be refilled (every thread
                 * arrives: a branch here made ptxas serialize the wgmmas, C7513) */
                mbar_arrive(smem_u32(bars + 3 + it % 3));
            }
            mbar_wait(smem_u32(bars + 6), 0); /* the last tile's V rows past kv_end are zero */
            named_bar_sync(1 + w, 256);
            wg_fence();
            pv_issue(nt2 - 1);
            wg_wait<0>();
            wg_hold(o);
            wg_keep(pf);
            if (w == 0)
                named_bar_arrive(2, 256);
        } else {
            {
                float a, b;
                wg_fence();
                s_issue(0);
                wg_wait<0>();
                wg_hold(sc);
                softmax_p(sc, 0, pf, a, b);
            }
            for (int it = 0; it + 1 < nt2; it++) {
                cp_async_wait<0>(); /* tile it + 1 landed (this thread's copies) */
                wg_fence_smem();
                __syncthreads(); /* ... everyone's; and every warpgroup is done with tile it - 1 */
                if (it + 2 < nt2)
                    load2(it + 2);
                cp_async_commit();
                wg_fence();
                s_issue(it + 1);
                pv_issue(it);
                finish(it);
            }
            /* the last tile's P V (the tile landed before the last iteration's barrier, or the prologue's) */
            wg_fence();
            pv_issue(nt2 - 1);
            wg_wait<0>();
            wg_hold(o);
            wg_keep(pf);
        }
    } else {
        for (int it = 0; it < n_tiles; it++) {
            const int st = it & 1;
            if (it + 1 < n_tiles) {
                if constexpr (F8)
                    load_kv_tile_f8<D, NT>(sF + (st ^ 1) * 2 * KV_TILE * D, sS + (st ^ 1) * 2 * KV_TILE, kv,
                                           btab, kvh, KVH, bsh, (it + 1) * KV_TILE, kv_end, tid);
                else
                    load_kv_tile<D, NT>(sK + (st ^ 1) * KV_TILE * D, sV + (st ^ 1) * KV_TILE * D, kc, vc,
                                        btab, kvh, KVH, bsh, (it + 1) * KV_TILE, kv_end, tid);
            }
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
            /* fp8: tile it to bf16 (the previous tile's readers are past the barrier above; the staging stage
             * read here is refilled only after the barrier below) */
            if constexpr (F8) {
                convert_kv_tile<D, NT, WG>(sK, sSc, sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, tid);
                if (WG)
                    wg_fence_smem();
                __syncthreads();
            }
            const int kst = F8 ? 0 : st;

            const int j0 = it * KV_TILE;
            if (WG ? g_active && j0 <= g_qmax : warp_active && j0 <= w_qmax) {
                /* S = Q K^T for 16 rows x 64 keys */
                float sc[KV_TILE / 8][4];
#pragma unroll
                for (int i = 0; i < KV_TILE / 8; i++)
                    sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
                const uint32_t kb = smem_u32(sK + kst * KV_TILE * D);
                if constexpr (WG) {
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk++)
                        wg_m64n64k16<E>(sc, qf[kk], wg_desc(kb + (kk / 4) * 8192 + (kk % 4) * 32, 16, 1024),
                                        kk > 0);
                    wg_commit();
                    wg_wait<0>();
                    wg_hold(sc);
                } else {
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
                        for (int np = 0; np < KV_TILE / 16; np++) {
                            uint32_t b[4];
                            ldsm_x4(b, kb + np * 16 * D * 2 + (kfb ^ (kk * 32)));
                            mma_e16<E>(sc[2 * np], qf[kk], b[0], b[1]);
                            mma_e16<E>(sc[2 * np + 1], qf[kk], b[2], b[3]);
                        }
                    }
                }
                uint32_t pf[KV_TILE / 16][4];
                float alA, alB;
                softmax_p(sc, j0, pf, alA, alB);
                rescale_o(alA, alB);
                /* O += P V */
                const uint32_t vb = smem_u32(sV + kst * KV_TILE * D);
                if constexpr (WG) {
                    wg_hold(o);
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < KV_TILE / 16; kk++)
                        wg_m64n128k16_nmajor<E>(o, pf[kk], wg_desc(vb + kk * 2048, 8192, 1024));
                    wg_commit();
                    wg_wait<0>();
                    wg_hold(o);
                } else {
#pragma unroll
                    for (int kk = 0; kk < KV_TILE / 16; kk++) {
#pragma unroll
                        for (int dp = 0; dp < D / 16; dp++) {
                            uint32_t b[4];
                            ldsm_x4_t(b, vb + kk * 16 * D * 2 + (vfb ^ (dp * 32)));
                            mma_e16<E>(o[2 * dp], pf[kk], b[0], b[1]);
                            mma_e16<E>(o[2 * dp + 1], pf[kk], b[2], b[3]);
                        }
                    }
                }
            }
            if constexpr (!F8)
                __syncthreads(); /* stage st is overwritten by the next iteration's load */
        }
    }

    if (!warp_active)
        return;
    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int pr = wr0 + g4 + half * 8;
        if (pr >= rows)
            continue;
        const float inv = 1.f / (half ? lB : lA);
        const int tok = pr / G, g = pr - tok * G;
        E *dst = out + (size_t)(q0 + tok) * H * D + (size_t)(kvh * G + g) * D + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            *reinterpret_cast<uint32_t *>(dst + nt * 8) =
                pack2<E>(o[nt][half * 2] * inv, o[nt][half * 2 + 1] * inv);
    }
}

template <typename E, int D, int BM, bool F8, bool WG = false>
int launch_prefill(const E *q, int q_stride, const kv_src &kv, const k_attn_batch *b, E *out, int H, int KVH,
                   int block_size, float sl2, cudaStream_t stream, bool allow_tma = true)
{
    static bool smem_done[16];
    constexpr int smem = prefill_smem<D, BM, F8, WG>();
    if (raise_smem(attention_prefill_kernel<E, D, BM, F8, WG>, smem, smem_done))
        return -1;
    const long long tiles = ((long long)b->max_q_len * (H / KVH) + BM - 1) / BM;
    K_REQUIRE(tiles <= 0x7fffffff, "k_attention_prefill: max_q_len %d too large", b->max_q_len);
    dim3 grid((unsigned)tiles, KVH, b->n_seqs);
    kv_maps maps;
    memset(&maps, 0, sizeof maps);
    /* the 16-bit cache's wgmma kernel reads its tiles through tensor maps (the warp-specialized kernel)
     * when a block's keys tile the 128-key tiles (or the reverse) and the rows are 16-byte aligned; else
     * by cp.async */
    constexpr int KT = 2 * KV_TILE;
    if (WG && !F8 && allow_tma && block_size >= 8 && (KT % block_size == 0 || block_size % KT == 0) &&
        ((uintptr_t)kv.k | (uintptr_t)kv.v) % 16 == 0) {
        const int R = block_size < KT ? block_size : KT;
        const uint64_t rows = (uint64_t)1 << 31; /* the pool's extent is not known here; copies stay inside */
        if (!k_tma_map_rows(&maps.k, kv.k, rows, D, (size_t)D * 2, R) &&
            !k_tma_map_rows(&maps.v, kv.v, rows, D, (size_t)D * 2, R)) {
            maps.keys_per_copy = R;
        } else { /* a driver without tensor maps: the cp.async loads, said once */
            static std::atomic<bool> said{false};
            if (!said.exchange(true))
                fprintf(stderr, "k_attention_prefill: no tensor maps (%s); K/V tiles load with cp.async\n",
                        k_last_error());
        }
    }
    if constexpr (WG && !F8) {
        if (maps.keys_per_copy > 0) {
            static bool ws_done[16];
            if (raise_smem(attention_prefill_kernel<E, D, BM, F8, WG, true>, smem, ws_done))
                return -1;
            K_CHECK(k_launch(attention_prefill_kernel<E, D, BM, F8, WG, true>, grid, BM * 3, smem, stream, q,
                             q_stride, kv, b->q_start, b->ctx_len, b->block_tables, b->max_blocks, out, H,
                             KVH, block_size, sl2, maps));
            return 0;
        }
    }
    K_CHECK(k_launch(attention_prefill_kernel<E, D, BM, F8, WG>, grid, BM * 2, smem, stream, q, q_stride, kv,
                     b->q_start, b->ctx_len, b->block_tables, b->max_blocks, out, H, KVH, block_size, sl2,
                     maps));
    return 0;
}

/* k_test_prefill_path (kernels/test_paths.h): K_TEST_PREFILL_* */
std::atomic<int> prefill_path{K_TEST_PREFILL_AUTO};

/* E: the 16-bit element type (kernels.h: bf16, or fp16 in fp16 mode); bf16 with an fp8 cache. The wgmma
 * kernel at D = 128 where the device and the build have it, else the mma.sync kernel. */
template <typename E, bool F8 = false>
int prefill_impl(const char *fn, const bf16 *q_, int q_stride, const kv_src &kv, const struct k_attn_batch *b,
                 bf16 *out_, int H, int KVH, int D, int block_size, float scale, cudaStream_t stream)
{
    if (check_common(fn, q_, q_stride, kv, F8, b, out_, H, KVH, D, block_size))
        return -1;
    const E *q = reinterpret_cast<const E *>(q_);
    E *out = reinterpret_cast<E *>(out_);
    if (b->n_seqs <= 0 || b->max_q_len <= 0)
        return 0;
    const float sl2 = scale * 1.4426950408889634f;
    const int path = prefill_path.load(std::memory_order_relaxed);
    if (D == 128 && k_wgmma_on() && path != K_TEST_PREFILL_MMA)
        return launch_prefill<E, 128, 128, F8, true>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream,
                                                     path != K_TEST_PREFILL_CPASYNC);
    return D == 128
               ? launch_prefill<E, 128, 128, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream)
               : launch_prefill<E, 64, 128, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream);
}

} // namespace

extern "C" int k_test_prefill_path(int path)
{
    K_REQUIRE(path >= K_TEST_PREFILL_AUTO && path <= K_TEST_PREFILL_CPASYNC, "k_test_prefill_path: path %d",
              path);
    prefill_path.store(path, std::memory_order_relaxed);
    return path == K_TEST_PREFILL_CPASYNC && !k_wgmma_on() ? 1 : 0;
}

extern "C" int k_attention_prefill(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                                   const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                   int block_size, float scale, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, nullptr, nullptr};
    return K_ELT16(prefill_impl, "k_attention_prefill", q, q_stride, kv, b, out, H, KVH, D, block_size, scale,
                   stream);
}

extern "C" int k_attention_prefill_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache,
                                       const uint8_t *v_cache, const float *k_scale, const float *v_scale,
                                       const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                       int block_size, float scale, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, k_scale, v_scale};
    return prefill_impl<bf16, true>("k_attention_prefill_fp8", q, q_stride, kv, b, out, H, KVH, D, block_size,
                                    scale, stream);
}
