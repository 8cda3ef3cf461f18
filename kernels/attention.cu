/* Causal attention over the paged KV cache: FlashAttention-2 style prefill and GQA-aware,
 * split-over-the-context decode. Contract and layouts: kernels/kernels.h; design notes and numbers:
 * docs/KERNELS.md, section "Attention".
 *
 * Both kernels use mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80 and sm_90), K and V tiles of
 * 64 keys gathered from the paged cache with 16-byte cp.async into XOR-swizzled shared memory
 * (conflict-free ldmatrix), and an online softmax in fp32 in the log2 domain. On sm_90a the prefill
 * over a bf16 cache runs its products on wgmma instead, its 128-key tiles copied by the tensor memory
 * accelerator (kernels/tma.cuh).
 *
 * GQA: a CTA works for one KV head and all G = H / KVH query heads that share it. Its "rows" are
 * packed (token, head) pairs, row = token * G + g, so every K/V tile is loaded once for G heads. */
#include <atomic>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "kernels/e4m3x2.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/rope.cuh"
#include "kernels/tma.cuh"
#include "kernels/warpgroup.cuh"
#include "kernels/wgmma.cuh"

extern "C" {
#include "engine/decode_split.h"
}

namespace
{

/* ------------------------------------------------------------------------------------------------
 * kernels
 * ---------------------------------------------------------------------------------------------- */

constexpr int KV_TILE = 64; /* keys per K/V tile (both kernels) */
constexpr float NEG_INF = -INFINITY;

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; valid == false writes 16 zero bytes and reads nothing. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
/* 4-byte async copy (the scales of an fp8 cache); valid == false writes 4 zero bytes. */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid)
{
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a · b for one m16n8k16 tile: a row-major 16x16 (4 regs), b "col" 16x8 (2 regs), c 16x8 fp32. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Two e4m3 values (low byte first) to a bf16x2 register, exactly (kernels/e4m3x2.cuh; the f32 -> bf16
 * step is exact too: e4m3's range is inside bf16's normal range). */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v)
{
    const float2 f = e4m3x2_to_float2(v);
    return pack_bf16(f.x, f.y);
}

/* The paged cache of one layer as a kernel reads it: bf16 (ks, vs NULL) or e4m3 bytes with one fp32
 * scale per (block, KV head, slot). */
struct kv_src {
    const void *k, *v;
    const float *ks, *vs;
};

/* The wgmma prefill's tensor maps of the bf16 cache's K and V (rows of D, read keys_per_copy rows at a
 * time: min(block size, 128)); keys_per_copy 0: its tiles are loaded with cp.async instead. */
struct kv_maps {
    CUtensorMap k, v;
    int keys_per_copy;
};

/* Element offset of 16-byte chunk c of row r in a [rows][D] bf16 tile whose chunks are XOR-swizzled
 * by the row's low 3 bits: the 8 rows an ldmatrix reads at one column hit 8 different bank groups. */
template <int D> __device__ __forceinline__ int swz(int r, int c)
{
    return r * D + ((c ^ (r & 7)) << 3);
}

/* ldmatrix addressing in a swizzled tile. For the K operand (x4 = two 8-key n-tiles x the two
 * 8-column halves of a 16-column k-step) and the V operand (x4.trans = two 8-key halves x two 8-column
 * n-tiles) the row a lane addresses has lane % 8 as its low 3 bits, so column pair i (chunks 2i, 2i+1)
 * sits at frag_base ^ (i * 32) bytes: the row part has no bits below 2 * D. Rows 16 apart add
 * 16 * D * 2 bytes. */
template <int D> __device__ __forceinline__ uint32_t k_frag_base(int lane)
{
    const int r = (lane % 8) + 8 * (lane / 16), c = (lane / 8) % 2;
    return (uint32_t)(r * D * 2 + ((c ^ (lane % 8)) << 4));
}
template <int D> __device__ __forceinline__ uint32_t v_frag_base(int lane)
{
    const int r = (lane % 8) + 8 * ((lane / 8) % 2), c = lane / 16;
    return (uint32_t)(r * D * 2 + ((c ^ (lane % 8)) << 4));
}

/* Element index / D of key j of KV head kvh in one layer's paged cache (kernels.h: block_table[j / bs],
 * then the head's slab, then j % bs): the slot of the fp32 scales, and the row of the K/V codes. */
__device__ __forceinline__ size_t kv_row(const int32_t *__restrict__ btab, int j, int kvh, int KVH, int bs)
{
    return ((size_t)btab[j / bs] * KVH + kvh) * bs + (j % bs);
}

/* Issues the cp.asyncs of one K and one V tile: keys j0 .. j0+63 of KV head kvh, read through the
 * block table. Keys >= jlim are zero-filled without touching the block table (an unwritten slot of
 * the last block may hold anything, and 0 * NaN would poison P·V). Key jskip (< jlim) is left out
 * entirely (no copy: load_kv_row brings it later). SWR > 0: the tiles are in the 128-byte-swizzled
 * layout of SWR rows (kernels/wgmma.cuh, sw128_off), the keys at rows r_off .. r_off + 63. */
template <int D, int NT, int SWR = 0>
__device__ __forceinline__ void load_kv_tile(bf16 *sK, bf16 *sV, const bf16 *__restrict__ kc,
                                             const bf16 *__restrict__ vc, const int32_t *__restrict__ btab,
                                             int kvh, int KVH, int bs, int j0, int jlim, int tid,
                                             int jskip = -1, int r_off = 0)
{
    constexpr int CPR = D / 8;    /* chunks per row */
    constexpr int RPP = NT / CPR; /* rows per pass */
    static_assert(KV_TILE % RPP == 0, "tile rows must divide evenly among threads");
    const int c = tid % CPR;
    const uint32_t k_base = smem_u32(sK), v_base = smem_u32(sV);
#pragma unroll
    for (int i = 0; i < KV_TILE / RPP; i++) {
        const int r = tid / CPR + i * RPP;
        const int j = j0 + r;
        const bool ok = j < jlim;
        const size_t off = ok ? kv_row(btab, j, kvh, KVH, bs) * D + c * 8 : 0;
        const uint32_t so = SWR ? sw128_off(r_off + r, c, SWR) : (uint32_t)swz<D>(r, c) * 2;
        if (!ok || j != jskip) { /* a key past jlim is zero-filled even if it is jskip */
            cp_async16(k_base + so, kc + off, ok);
            cp_async16(v_base + so, vc + off, ok);
        }
    }
}

/* The cp.asyncs of key j alone, row r of a tile load_kv_tile left it out of (threads tid < D / 8). */
template <int D>
__device__ __forceinline__ void load_kv_row(bf16 *sK, bf16 *sV, const bf16 *__restrict__ kc,
                                            const bf16 *__restrict__ vc, const int32_t *__restrict__ btab,
                                            int kvh, int KVH, int bs, int r, int j, int tid)
{
    if (tid < D / 8) {
        const size_t off = kv_row(btab, j, kvh, KVH, bs) * D + tid * 8;
        const uint32_t so = (uint32_t)swz<D>(r, tid) * 2;
        cp_async16(smem_u32(sK) + so, kc + off, true);
        cp_async16(smem_u32(sV) + so, vc + off, true);
    }
}

/* fp8 cache: issues the cp.asyncs of one K and one V tile of e4m3 bytes (16 per copy) into a
 * linear staging area sF [K, V][KV_TILE][D] and their scales into sS [K, V][KV_TILE]; keys >= jlim
 * are zero-filled and key jskip left out as in load_kv_tile. */
template <int D, int NT>
__device__ __forceinline__ void load_kv_tile_f8(uint8_t *sF, float *sS, const kv_src kv,
                                                const int32_t *__restrict__ btab, int kvh, int KVH, int bs,
                                                int j0, int jlim, int tid, int jskip = -1)
{
    constexpr int CPR = D / 16;   /* 16-byte chunks per row */
    constexpr int RPP = NT / CPR; /* rows per pass */
    static_assert(KV_TILE % RPP == 0, "tile rows must divide evenly among threads");
    const uint8_t *kc = static_cast<const uint8_t *>(kv.k), *vc = static_cast<const uint8_t *>(kv.v);
    const int c = tid % CPR;
    const uint32_t base = smem_u32(sF);
#pragma unroll
    for (int i = 0; i < KV_TILE / RPP; i++) {
        const int r = tid / CPR + i * RPP;
        const int j = j0 + r;
        const bool ok = j < jlim;
        const size_t off = ok ? kv_row(btab, j, kvh, KVH, bs) * D + c * 16 : 0;
        if (!ok || j != jskip) {
            cp_async16(base + r * D + c * 16, kc + off, ok);
            cp_async16(base + (KV_TILE + r) * D + c * 16, vc + off, ok);
        }
    }
    for (int i = tid; i < 2 * KV_TILE; i += NT) {
        const int j = j0 + i % KV_TILE;
        const bool ok = j < jlim;
        const size_t off = ok ? kv_row(btab, j, kvh, KVH, bs) : 0;
        if (!ok || j != jskip)
            cp_async4(smem_u32(sS + i), (i < KV_TILE ? kv.ks : kv.vs) + off, ok);
    }
}

/* fp8 cache: the cp.asyncs of key j alone (codes and scales), row r of a staging tile
 * load_kv_tile_f8 left it out of (threads tid < D / 16 + 2). */
template <int D>
__device__ __forceinline__ void load_kv_row_f8(uint8_t *sF, float *sS, const kv_src kv,
                                               const int32_t *__restrict__ btab, int kvh, int KVH, int bs,
                                               int r, int j, int tid)
{
    constexpr int CPR = D / 16;
    const size_t row = kv_row(btab, j, kvh, KVH, bs);
    const uint8_t *kc = static_cast<const uint8_t *>(kv.k), *vc = static_cast<const uint8_t *>(kv.v);
    const uint32_t base = smem_u32(sF);
    if (tid < CPR) {
        cp_async16(base + r * D + tid * 16, kc + row * D + tid * 16, true);
        cp_async16(base + (KV_TILE + r) * D + tid * 16, vc + row * D + tid * 16, true);
    } else if (tid == CPR) {
        cp_async4(smem_u32(sS + r), kv.ks + row, true);
    } else if (tid == CPR + 1) {
        cp_async4(smem_u32(sS + KV_TILE + r), kv.vs + row, true);
    }
}

/* fp8 cache: converts a landed staging tile sF (load_kv_tile_f8) to the swizzled bf16 tiles
 * sKV [K, V][KV_TILE][D] the mma fragments are read from (raw codes: the scales are applied to score
 * and probability columns), and copies its scales to sSc [K, V][KV_TILE]. Per unit of 8 elements: an
 * 8-byte shared load, four fp8x2 conversions, one 16-byte shared store (an 8-lane phase writes 8
 * distinct chunks of one row group: conflict-free). */
template <int D, int NT, bool SW = false>
__device__ __forceinline__ void convert_kv_tile(bf16 *sKV, float *sSc, const uint8_t *sF, const float *sS,
                                                int tid)
{
    constexpr int UPR = D / 8; /* units per row */
    constexpr int UNITS = 2 * KV_TILE * UPR;
    static_assert(UNITS % NT == 0, "units must divide evenly among threads");
#pragma unroll 4
    for (int i = 0; i < UNITS / NT; i++) {
        const int u = tid + i * NT;
        const int kv = u / (KV_TILE * UPR), rem = u % (KV_TILE * UPR), r = rem / UPR, c = rem % UPR;
        const uint2 w = *reinterpret_cast<const uint2 *>(sF + (size_t)u * 8);
        uint4 o;
        o.x = e4m3x2_to_bf16x2(w.x), o.y = e4m3x2_to_bf16x2(w.x >> 16);
        o.z = e4m3x2_to_bf16x2(w.y), o.w = e4m3x2_to_bf16x2(w.y >> 16);
        bf16 *tile = sKV + kv * KV_TILE * D;
        if (SW)
            *reinterpret_cast<uint4 *>(reinterpret_cast<unsigned char *>(tile) + sw128_off(r, c)) = o;
        else
            *reinterpret_cast<uint4 *>(tile + swz<D>(r, c)) = o;
    }
    for (int i = tid; i < 2 * KV_TILE; i += NT)
        sSc[i] = sS[i];
}

/* ---- prefill: grid (row tiles, KVH, n_seqs), BM packed rows per CTA, 16 per warp (BM = 128: 8 warps,
 * the default; 64: 4 warps, two CTAs per SM).
 *
 * WG (sm_90a, D = 128, BM = 128): the two products run on the warpgroup tensor cores (kernels/wgmma.cuh),
 * each warpgroup's 64 rows against the whole K/V tile in shared memory, K and V in the
 * 128-byte-swizzled layout (sw128_off); mask, online softmax and stores stay per warp.
 *   - bf16 cache (PIPE): 128-key tiles in three stages, Q read from shared memory (swizzled too),
 *     S = Q K^T as 8 m64n128k16, O += P V as 8 m64n128k16 with P from registers, pipelined (below);
 *     the tiles come through tensor maps (maps.keys_per_copy > 0: TMA copies issued by warp 0,
 *     completing on three mbarriers after sQ), else cp.async from every thread.
 *   - fp8 cache: the mma.sync kernel's order and 64-key tiles (converted to bf16), S as 8 m64n64k16
 *     with Q from registers, P V as 4 m64n128k16; a warpgroup skips a tile above all of its rows.
 *
 * WS (the bf16 cache through tensor maps, FlashAttention-3's warp specialization): 384 threads, a
 * producer warpgroup (one warp issues every tile's copies, waiting for a stage to be released before it
 * refills it; 24 registers a thread) and the two consumer warpgroups of the 128 rows (240 registers),
 * with no CTA-wide barrier in the loop: a consumer thread releases a stage (an arrival on the stage's
 * "empty" barrier) once its P V of that tile is done, and the two consumer warpgroups take turns
 * issuing their products (named barriers, "ping-pong"), so that one's softmax runs while the other's
 * products keep the tensor cores busy. Without WS both warpgroups issue at once, then both do their
 * softmax while the tensor cores have only the P V products left, and a __syncthreads per tile frees
 * the stage. */
template <int D, int BM, bool F8, bool WG = false> constexpr int prefill_smem()
{
    /* bf16: sQ, two stages of K and V (PIPE: three of 128 keys). fp8: sQ, one bf16 K and V tile, two
     * staging stages of e4m3 K and V with their scales, the current tile's scales. WG: + 1 KB to align
     * the K/V tiles to 1024 bytes */
    return (F8 ? BM * D * 2 + 2 * KV_TILE * D * 2 + 2 * 2 * KV_TILE * D + 3 * 2 * KV_TILE * 4
               : (BM + 2 * (WG ? 6 : 2) * KV_TILE) * D * 2) +
           (WG ? 1024 : 0) + (WG && !F8 ? 64 : 0); /* the pipelined loop's three tile barriers */
}
/* CTAs per SM the register budget is cut for: at D = 128 a thread needs ~235 registers */
template <int D, int BM> constexpr int prefill_min_ctas()
{
    return (D <= 64 ? 2 : 1) * (128 / BM);
}

template <int D, int BM, bool F8, bool WG = false, bool WS = false, int NT = BM *(WS ? 3 : 2)>
__global__ void __launch_bounds__(NT, WS ? 1 : prefill_min_ctas<D, BM>())
    attention_prefill_kernel(const bf16 *__restrict__ q, int q_stride, const kv_src kv,
                             const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                             const int32_t *__restrict__ btabs, int max_blocks, bf16 *__restrict__ out, int H,
                             int KVH, int bs, float sl2, const __grid_constant__ kv_maps maps)
{
    static_assert(!WG || (D == 128 && BM == 128), "the wgmma prefill is for D = 128, BM = 128");
    static_assert(!WS || (WG && !F8), "the warp-specialized prefill is the bf16 wgmma kernel's");
    pdl_enter(); // kernels/launch.cuh
    /* 64-key K/V tiles: two stages, or the one converted fp8 tile; the pipelined wgmma loop: three
     * stages of 128 keys */
    constexpr int KST = F8 ? 1 : WG ? 6 : 2;
    constexpr bool PIPE = WG && !F8; /* the pipelined wgmma loop below */
    extern __shared__ __align__(128) unsigned char smem_raw[];
    /* WG: the K/V tiles (16 KB each) first, on a 1024-byte boundary */
    unsigned char *smem = WG ? smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023) : smem_raw;
    bf16 *sK = reinterpret_cast<bf16 *>(smem);                       /* [KST][KV_TILE][D] */
    bf16 *sV = sK + KST * KV_TILE * D;                               /* [KST][KV_TILE][D] */
    bf16 *sQ = sV + KST * KV_TILE * D;                               /* [BM][D] */
    uint8_t *sF = reinterpret_cast<uint8_t *>(sQ + BM * D);          /* fp8: [2][K, V][KV_TILE][D] */
    float *sS = reinterpret_cast<float *>(sF + 2 * 2 * KV_TILE * D); /* fp8: [2][K, V][KV_TILE] */
    float *sSc = sS + 2 * 2 * KV_TILE;                               /* fp8: [K, V][KV_TILE] */
    const bf16 *kc = static_cast<const bf16 *>(kv.k), *vc = static_cast<const bf16 *>(kv.v);

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
            const bf16 *src = q;
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
        bf16 *k = sK + (t % 3) * KT * D, *v = sV + (t % 3) * KT * D;
        load_kv_tile<D, NC, KT>(k, v, kc, vc, btab, kvh, KVH, bs, t * KT, kv_end, tid, -1, 0);
        load_kv_tile<D, NC, KT>(k, v, kc, vc, btab, kvh, KVH, bs, t * KT + KV_TILE, kv_end, tid, -1, KV_TILE);
    };
    /* PIPE with tensor maps: warp 0 issues a tile's copies, lane c the keys_per_copy keys from
     * c * keys_per_copy of K and V (two 64-column halves each), completing on barrier t % 3 (phase
     * (t / 3) & 1); the lane reads its block-table entry (tma_row) before the wait that precedes the
     * issue, so the read's latency is hidden. Keys past kv_end are not copied, and their V rows are
     * zeroed once the tile has landed (v_tail): an unwritten slot of the last block may hold anything,
     * and 0 * NaN would poison P V. K rows past kv_end need nothing: the causal mask overwrites their
     * scores. */
    const bool tma = PIPE && maps.keys_per_copy > 0;
    [[maybe_unused]] uint64_t *bars = reinterpret_cast<uint64_t *>(sF);
    /* warp 0: the cache row of this lane's copy of tile t, or -1 */
    auto tma_row = [&](int t) {
        const int R = maps.keys_per_copy, j = t * KT + lane * R;
        return t < nt2 && lane * R < KT && j < kv_end ? (int)kv_row(btab, j, kvh, KVH, bs) : -1;
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
        if (tma) {
            if (tid == 0)
                for (int i = 0; i < 3; i++)
                    mbar_init(smem_u32(bars + i), 1);
            __syncthreads(); /* the barriers before anyone waits on them */
            if (warp == 0) {
                tma_issue(0, tma_row(0));
                if (nt2 > 1)
                    tma_issue(1, tma_row(1));
            }
            cp_async_wait<0>(); /* Q */
            mbar_wait(smem_u32(bars), 0);
            if (nt2 == 1)
                v_tail(0, tid, NT);
        } else {
            load2(0);
            cp_async_commit();
            if (nt2 > 1)
                load2(1);
            cp_async_commit();
            cp_async_wait<1>(); /* Q and tile 0 */
        }
        wg_fence_smem();
    } else {
        if constexpr (F8)
            load_kv_tile_f8<D, NT>(sF, sS, kv, btab, kvh, KVH, bs, 0, kv_end, tid);
        else
            load_kv_tile<D, NT>(sK, sV, kc, vc, btab, kvh, KVH, bs, 0, kv_end, tid);
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

    /* The online softmax of one S tile (this warp's 16 rows x 64 keys from key j0): fp8 key scales, the
     * causal mask, new maxima and sums, and P as the A fragments of P V; alA, alB are the factors this
     * thread's two O rows are to be rescaled by. A row whose keys are all masked so far keeps m = -inf
     * and p = 0. */
    auto softmax_p = [&](auto &sc, int j0, auto &pf, float &alA, float &alB) {
        constexpr int NB = std::extent<std::remove_reference_t<decltype(sc)>>::value; /* 8-key blocks */
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
        /* online softmax; a row whose keys are all masked so far keeps m = -inf and p = 0 */
        float mxA = mA, mxB = mB;
#pragma unroll
        for (int nt = 0; nt < NB; nt++) {
            mxA = fmaxf(mxA, fmaxf(sc[nt][0], sc[nt][1]));
            mxB = fmaxf(mxB, fmaxf(sc[nt][2], sc[nt][3]));
        }
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
        const float msA = mxA == NEG_INF ? 0.f : mxA * sl2, msB = mxB == NEG_INF ? 0.f : mxB * sl2;
        alA = fast_exp2(mA * sl2 - msA), alB = fast_exp2(mB * sl2 - msB);
        mA = mxA, mB = mxB;
        lA *= alA, lB *= alB;
#pragma unroll
        for (int nt = 0; nt < NB; nt++) {
            const float p0 = fast_exp2(fmaf(sc[nt][0], sl2, -msA)),
                        p1 = fast_exp2(fmaf(sc[nt][1], sl2, -msA));
            const float p2 = fast_exp2(fmaf(sc[nt][2], sl2, -msB)),
                        p3 = fast_exp2(fmaf(sc[nt][3], sl2, -msB));
            lA += p0 + p1, lB += p2 + p3;
            if constexpr (F8) { /* P[., key] *= v_scale[key] for the product; l sums the unscaled p */
                const float2 vs = *reinterpret_cast<const float2 *>(sSc + KV_TILE + nt * 8 + 2 * t4);
                pf[nt / 2][(nt % 2) * 2] = pack_bf16(p0 * vs.x, p1 * vs.y);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p2 * vs.x, p3 * vs.y);
            } else {
                pf[nt / 2][(nt % 2) * 2] = pack_bf16(p0, p1);
                pf[nt / 2][(nt % 2) * 2 + 1] = pack_bf16(p2, p3);
            }
        }
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
        uint32_t pf[KT / 16][4], pn[KT / 16][4];
        const uint32_t qb = smem_u32(sQ) + (warp / 4) * 16384;
        /* S = Q K(t)^T, one group */
        auto s_issue = [&](int t) {
            const uint32_t kb = smem_u32(sK + (t % 3) * KT * D);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wg_m64n128k16_ss(sc, wg_desc(qb + (kk / 4) * 8192 + (kk % 4) * 32, 16, 1024),
                                 wg_desc(kb + (kk / 4) * KT * 128 + (kk % 4) * 32, 16, 1024), kk > 0);
            wg_commit();
            wg_hold(sc);
        };
        /* O += P V(t), one group */
        auto pv_issue = [&](int t) {
            const uint32_t vb = smem_u32(sV + (t % 3) * KT * D);
            wg_hold(o);
#pragma unroll
            for (int kk = 0; kk < KT / 16; kk++)
                wg_m64n128k16_nmajor(o, pf[kk], wg_desc(vb + kk * 2048, KT * 128, 1024));
            wg_commit();
            wg_hold(o);
        };
        /* once S(t + 1) and P V(t) are issued: the softmax of S(t + 1), then O rescaled when P V(t) is done,
         * and P(t + 1) made the current P */
        auto finish = [&](int t) {
            float alA, alB;
            wg_wait<1>(); /* S(t + 1) */
            wg_hold(sc);
            softmax_p(sc, (t + 1) * KT, pn, alA, alB);
            wg_wait<0>(); /* P(t) V(t) */
            wg_hold(o);
            wg_keep(pf);
            rescale_o(alA, alB);
#pragma unroll
            for (int i = 0; i < KT / 16; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pf[i][e] = pn[i][e];
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
                const int next_row = tma && warp == 0 ? tma_row(it + 2) : -1;
                if (tma) {
                    mbar_wait(smem_u32(bars + (it + 1) % 3), ((it + 1) / 3) & 1); /* tile it + 1 landed */
                    if (it + 2 == nt2)
                        v_tail(it + 1, tid, NT);
                } else {
                    cp_async_wait<0>(); /* tile it + 1 landed (this thread's copies) */
                }
                wg_fence_smem();
                __syncthreads(); /* ... everyone's; and every warpgroup is done with tile it - 1 */
                if (tma) {
                    if (warp == 0 && it + 2 < nt2)
                        tma_issue(it + 2, next_row);
                } else {
                    if (it + 2 < nt2)
                        load2(it + 2);
                    cp_async_commit();
                }
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
                                           btab, kvh, KVH, bs, (it + 1) * KV_TILE, kv_end, tid);
                else
                    load_kv_tile<D, NT>(sK + (st ^ 1) * KV_TILE * D, sV + (st ^ 1) * KV_TILE * D, kc, vc,
                                        btab, kvh, KVH, bs, (it + 1) * KV_TILE, kv_end, tid);
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
                        wg_m64n64k16(sc, qf[kk], wg_desc(kb + (kk / 4) * 8192 + (kk % 4) * 32, 16, 1024),
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
                            mma_bf16(sc[2 * np], qf[kk], b[0], b[1]);
                            mma_bf16(sc[2 * np + 1], qf[kk], b[2], b[3]);
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
                        wg_m64n128k16_nmajor(o, pf[kk], wg_desc(vb + kk * 2048, 8192, 1024));
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
                            mma_bf16(o[2 * dp], pf[kk], b[0], b[1]);
                            mma_bf16(o[2 * dp + 1], pf[kk], b[2], b[3]);
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
        bf16 *dst = out + (size_t)(q0 + tok) * H * D + (size_t)(kvh * G + g) * D + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            *reinterpret_cast<uint32_t *>(dst + nt * 8) =
                pack_bf16(o[nt][half * 2] * inv, o[nt][half * 2 + 1] * inv);
    }
}

/* ---- decode: grid (partitions, KVH, n_seqs), 4 warps; the G query heads of the KV head are the
 * rows of one m16 tile (rows >= G are zero); each warp takes 16 keys of every 64-key tile and
 * keeps its own softmax state; the 4 warps combine at the end. A sequence whose context fits one
 * partition writes `out` directly; otherwise each partition writes its normalized fp32 output and
 * (max, sum) to the workspace and decode_reduce_kernel combines them.
 *
 * ROPE (bf16 cache; k_attention_decode_rope): the attention prologue of kernels/rope.cu folded in,
 * with its per-lane function (kernels/rope.cuh), so the values are the same bits. q is the raw qkv.
 * Each CTA normalizes and rotates its G query heads itself (groups of D/8 lanes, one head each) and
 * stores them to sQ; the CTA whose partition holds the new key (position ctx - 1, the token being
 * decoded) also computes that key's k and v, writes them to the cache slot and puts them in its own
 * K/V stage. The cos/sin table, the slot and the norm weights are read before the wait. */
constexpr int DC_THREADS = 128;
template <int D, bool F8> constexpr int decode_stages()
{
    return F8 ? 4 : D >= 128 ? 3 : 4;
}
template <int D, bool F8> constexpr int decode_smem()
{
    /* bf16: sQ, NS stages of K and V, (ROPE) the cos/sin table. fp8: sQ, one bf16 K and V tile, NS staging
     * stages of e4m3 K and V with their scales, the current tile's scales (the final combine reuses the
     * staging area) */
    return F8 ? 16 * D * 2 + 2 * KV_TILE * D * 2 + decode_stages<D, F8>() * 2 * KV_TILE * (D + 4) +
                    2 * KV_TILE * 4
              : 16 * D * 2 + decode_stages<D, F8>() * 2 * KV_TILE * D * 2 + D * 4;
}

template <int D, bool F8, bool ROPE>
__global__ void __launch_bounds__(DC_THREADS)
    attention_decode_kernel(const bf16 *__restrict__ q, int q_stride, const kv_src kv,
                            const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                            const int32_t *__restrict__ btabs, int max_blocks, bf16 *__restrict__ out, int H,
                            int KVH, int bs, float sl2, int part_keys, int n_part_max,
                            float *__restrict__ ws_o, float2 *__restrict__ ws_ml, const k_rope_in rope)
{
    static_assert(!(ROPE && F8), "the folded prologue writes a bf16 cache");
    constexpr int NS = decode_stages<D, F8>();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem_raw); /* [16][D] */
    bf16 *sKV = sQ + 16 * D; /* bf16: [NS][K, V][KV_TILE][D]; fp8: [K, V][KV_TILE][D] (converted) */
    uint8_t *sF = reinterpret_cast<uint8_t *>(sKV + 2 * KV_TILE * D); /* fp8: [NS][K, V][KV_TILE][D] */
    float *sS = reinterpret_cast<float *>(sF + NS * 2 * KV_TILE * D); /* fp8: [NS][K, V][KV_TILE] */
    float *sSc = sS + NS * 2 * KV_TILE;                               /* fp8: [K, V][KV_TILE] */
    const bf16 *kc = static_cast<const bf16 *>(kv.k), *vc = static_cast<const bf16 *>(kv.v);

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
                load_kv_tile_f8<D, DC_THREADS>(sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, kv, btab,
                                               kvh, KVH, bs, start + st * KV_TILE, end, tid, jlate);
            else
                load_kv_tile<D, DC_THREADS>(sKV + st * 2 * KV_TILE * D, sKV + (st * 2 + 1) * KV_TILE * D, kc,
                                            vc, btab, kvh, KVH, bs, start + st * KV_TILE, end, tid, jlate);
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
        const bf16 *row = q + (size_t)qrow * q_stride;
        for (int base = 0; base < G + 2; base += GROUPS) { /* uniform: every lane shuffles */
            const int item = base + grp, kind = item < G ? 0 : item == G ? 1 : 2;
            const bool valid = item < n_items;
            const int col = (kind == 0 ? kvh * G + item : kind == 1 ? H + kvh : H + KVH + kvh) * D + sub * 8;
            const uint4 raw = valid ? *reinterpret_cast<const uint4 *>(row + col) : zero4;
            const uint4 braw =
                rope.bias && valid ? __ldg(reinterpret_cast<const uint4 *>(rope.bias + col)) : zero4;
            const bool norm =
                valid && (kind == 0 ? rope.q_norm != nullptr : kind == 1 && rope.k_norm != nullptr);
            float r[8];
            rope_lane<GL>(raw, braw, rope.bias && valid, kind == 0 ? wq : wk, norm, kind < 2, rope.eps, cs,
                          sn, r);
            if (!valid)
                continue;
            const uint4 v = float_to_bf16x8(r);
            if (kind == 0) {
                *reinterpret_cast<uint4 *>(sQ + swz<D>(item, sub)) = v;
            } else {
                if (slot >= 0) {
                    bf16 *cache = const_cast<bf16 *>(kind == 1 ? kc : vc);
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
            const bf16 *src = ok ? q + (size_t)qrow * q_stride + (size_t)(kvh * G + r) * D + c * 8 : q;
            cp_async16(smem_u32(sQ) + swz<D>(r, c) * 2, src, ok);
        }
    }
    if (!ROPE && late_here && late_staged) { /* the key left out above */
        const int st = (jlate - start) / KV_TILE, r = jlate - start - st * KV_TILE;
        if constexpr (F8)
            load_kv_row_f8<D>(sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, kv, btab, kvh, KVH, bs, r,
                              jlate, tid);
        else
            load_kv_row<D>(sKV + st * 2 * KV_TILE * D, sKV + (st * 2 + 1) * KV_TILE * D, kc, vc, btab, kvh,
                           KVH, bs, r, jlate, tid);
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
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        ldsm_x4(qf[kk], smem_u32(sQ) + swz<D>(lane % 16, kk * 2 + lane / 16) * 2);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;

    for (int it = 0; it < n_tiles; it++) {
        {
            const int nxt = it + NS - 1;
            if (nxt < n_tiles) {
                const int sn = nxt % NS;
                if constexpr (F8)
                    load_kv_tile_f8<D, DC_THREADS>(sF + sn * 2 * KV_TILE * D, sS + sn * 2 * KV_TILE, kv, btab,
                                                   kvh, KVH, bs, start + nxt * KV_TILE, end, tid);
                else
                    load_kv_tile<D, DC_THREADS>(sKV + sn * 2 * KV_TILE * D, sKV + (sn * 2 + 1) * KV_TILE * D,
                                                kc, vc, btab, kvh, KVH, bs, start + nxt * KV_TILE, end, tid);
            }
            cp_async_commit();
        }
        cp_async_wait<NS - 1>();
        __syncthreads();

        const int st = it % NS;
        /* fp8: tile it to bf16 (the previous tile's readers are past the barrier above; its staging stage
         * is refilled only after the barrier below) */
        if constexpr (F8) {
            convert_kv_tile<D, DC_THREADS>(sKV, sSc, sF + st * 2 * KV_TILE * D, sS + st * 2 * KV_TILE, tid);
            __syncthreads();
        }
        const int wj0 = start + it * KV_TILE + warp * 16; /* this warp's 16 keys */
        if (wj0 < end) {
            const uint32_t kb = smem_u32(sKV + (F8 ? 0 : st) * 2 * KV_TILE * D) + warp * 16 * D * 2;
            const uint32_t vb = kb + KV_TILE * D * 2;
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t b[4];
                ldsm_x4(b, kb + (kfb ^ (kk * 32)));
                mma_bf16(sc[0], qf[kk], b[0], b[1]);
                mma_bf16(sc[1], qf[kk], b[2], b[3]);
            }
            if constexpr (F8) { /* S[., key] *= k_scale[key], before the mask */
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const float2 ks = *reinterpret_cast<const float2 *>(sSc + warp * 16 + nt * 8 + 2 * t4);
                    sc[nt][0] *= ks.x, sc[nt][1] *= ks.y, sc[nt][2] *= ks.x, sc[nt][3] *= ks.y;
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
            mA = mxA, mB = mxB;
            lA *= alA, lB *= alB;
#pragma unroll
            for (int i = 0; i < D / 8; i++)
                o[i][0] *= alA, o[i][1] *= alA, o[i][2] *= alB, o[i][3] *= alB;
            uint32_t pf[4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const float p0 = fast_exp2(fmaf(sc[nt][0], sl2, -msA)),
                            p1 = fast_exp2(fmaf(sc[nt][1], sl2, -msA));
                const float p2 = fast_exp2(fmaf(sc[nt][2], sl2, -msB)),
                            p3 = fast_exp2(fmaf(sc[nt][3], sl2, -msB));
                lA += p0 + p1, lB += p2 + p3;
                if constexpr (F8) { /* P[., key] *= v_scale[key]; l sums the unscaled p */
                    const float2 vs =
                        *reinterpret_cast<const float2 *>(sSc + KV_TILE + warp * 16 + nt * 8 + 2 * t4);
                    pf[nt * 2] = pack_bf16(p0 * vs.x, p1 * vs.y);
                    pf[nt * 2 + 1] = pack_bf16(p2 * vs.x, p3 * vs.y);
                } else {
                    pf[nt * 2] = pack_bf16(p0, p1);
                    pf[nt * 2 + 1] = pack_bf16(p2, p3);
                }
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, vb + (vfb ^ (dp * 32)));
                mma_bf16(o[2 * dp], pf, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pf, b[2], b[3]);
            }
        }
        if constexpr (!F8)
            __syncthreads(); /* stage st is refilled by the next iteration's load */
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
                pack_bf16(x * inv, y * inv);
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
            const float4 v = *reinterpret_cast<const float4 *>(src);
            x[j][0] = v.x, x[j][1] = v.y, x[j][2] = v.z, x[j][3] = v.w;
        } else {
#pragma unroll
            for (int v = 0; v < V; v++)
                x[j][v] = src[v];
        }
    }
}

template <int D>
__global__ void __launch_bounds__(128)
    attention_decode_reduce_kernel(const float *__restrict__ ws_o, const float2 *__restrict__ ws_ml,
                                   const int32_t *__restrict__ q_start, const int32_t *__restrict__ ctx_len,
                                   bf16 *__restrict__ out, int n_seqs, int H, int part_keys, int n_part_max)
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
    const float2 ml_lane = lane < n ? ws_ml[base + lane] : make_float2(NEG_INF, 0.f);
    float x[DR_BATCH][V];
    load_parts<V>(x, ws_o, base, 0, n, D, lane);
    float M = ml_lane.x;
    for (int p = lane + 32; p < n; p += 32)
        M = fmaxf(M, ws_ml[base + p].x);
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
                                     : ws_ml[base + p];
            const float w = ml.y * fast_exp2(ml.x - M);
            L += w;
#pragma unroll
            for (int v = 0; v < V; v++)
                acc[v] += w * x[j][v];
        }
    }
    const float inv = 1.f / L;
    bf16 *dst = out + (size_t)qs * H * D + (size_t)h * D + lane * V;
#pragma unroll
    for (int v = 0; v < V; v += 2)
        *reinterpret_cast<uint32_t *>(dst + v) = pack_bf16(acc[v] * inv, acc[v + 1] * inv);
}

/* ------------------------------------------------------------------------------------------------
 * launchers
 * ---------------------------------------------------------------------------------------------- */

/* Raises a kernel's dynamic shared-memory limit once per device. */
template <typename F> int raise_smem(F *kernel, int bytes, bool (&done)[16])
{
    int dev = 0;
    K_CHECK(cudaGetDevice(&dev));
    if (dev < 16 && done[dev])
        return 0;
    K_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (dev < 16)
        done[dev] = true;
    return 0;
}

int check_common(const char *fn, const bf16 *q, int q_stride, const kv_src &kv, bool f8,
                 const struct k_attn_batch *b, const bf16 *out, int H, int KVH, int D, int block_size)
{
    K_REQUIRE(b && q && kv.k && kv.v && out, "%s: NULL pointer", fn);
    K_REQUIRE(!f8 || (kv.ks && kv.vs), "%s: NULL k_scale or v_scale", fn);
    K_REQUIRE(b->n_seqs <= 0 || (b->q_start && b->ctx_len && b->block_tables), "%s: NULL batch array", fn);
    K_REQUIRE(D == 64 || D == 128, "%s: head dim %d (64 or 128 supported)", fn, D);
    K_REQUIRE(H > 0 && KVH > 0 && H % KVH == 0, "%s: H %d is not a positive multiple of KVH %d", fn, H, KVH);
    K_REQUIRE(block_size > 0 && b->max_blocks > 0, "%s: block_size %d, max_blocks %d", fn, block_size,
              b->max_blocks);
    K_REQUIRE(q_stride >= H * D && q_stride % 8 == 0, "%s: q_stride %d (>= H * D = %d, a multiple of 8)", fn,
              q_stride, H * D);
    K_REQUIRE(((uintptr_t)q | (uintptr_t)kv.k | (uintptr_t)kv.v) % 16 == 0 && (uintptr_t)out % 4 == 0,
              "%s: q, k_cache, v_cache must be 16-byte aligned, out 4-byte aligned", fn);
    K_REQUIRE(!f8 || ((uintptr_t)kv.ks | (uintptr_t)kv.vs) % 4 == 0,
              "%s: k_scale, v_scale must be 4-byte aligned", fn);
    K_REQUIRE(b->n_seqs <= 65535, "%s: %d sequences (at most 65535 per launch)", fn, b->n_seqs);
    return 0;
}

/* Decode partitioning: decode_split, engine/decode_split.h (shared with the CPU backend's emulation). */
static_assert(KV_TILE == DECODE_SPLIT_TILE, "decode partitions are whole K/V tiles");

size_t decode_ws_bytes(int n_seqs, int H, int D, int n_part)
{
    return n_part <= 1 ? 0 : (size_t)n_seqs * H * n_part * ((size_t)D * 4 + sizeof(float2));
}

template <int D, int BM, bool F8, bool WG = false>
int launch_prefill(const bf16 *q, int q_stride, const kv_src &kv, const k_attn_batch *b, bf16 *out, int H,
                   int KVH, int block_size, float sl2, cudaStream_t stream, bool allow_tma = true,
                   bool allow_ws = true)
{
    static bool smem_done[16];
    constexpr int smem = prefill_smem<D, BM, F8, WG>();
    if (raise_smem(attention_prefill_kernel<D, BM, F8, WG>, smem, smem_done))
        return -1;
    const long long tiles = ((long long)b->max_q_len * (H / KVH) + BM - 1) / BM;
    K_REQUIRE(tiles <= 0x7fffffff, "k_attention_prefill: max_q_len %d too large", b->max_q_len);
    dim3 grid((unsigned)tiles, KVH, b->n_seqs);
    kv_maps maps;
    memset(&maps, 0, sizeof maps);
    /* the pipelined wgmma loop reads its tiles through tensor maps when a block's keys tile the 128-key
     * tiles (or the reverse) and the rows are 16-byte aligned; LLMQ_ATTN_PREFILL_TMA=0 (read once) keeps
     * cp.async (docs/KERNELS.md) */
    static const int tma_env = k_env_int("LLMQ_ATTN_PREFILL_TMA", 1, 0, 1);
    constexpr int KT = 2 * KV_TILE;
    if (WG && !F8 && allow_tma && tma_env && block_size >= 8 &&
        (KT % block_size == 0 || block_size % KT == 0) && ((uintptr_t)kv.k | (uintptr_t)kv.v) % 16 == 0) {
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
    /* with tensor maps, the warp-specialized kernel; LLMQ_ATTN_PREFILL_WS=0 (read once) keeps both
     * warpgroups in lockstep (docs/KERNELS.md) */
    static const int ws_env = k_env_int("LLMQ_ATTN_PREFILL_WS", 1, 0, 1);
    if constexpr (WG && !F8) {
        if (maps.keys_per_copy > 0 && allow_ws && ws_env) {
            static bool ws_done[16];
            if (raise_smem(attention_prefill_kernel<D, BM, F8, WG, true>, smem, ws_done))
                return -1;
            K_CHECK(k_launch(attention_prefill_kernel<D, BM, F8, WG, true>, grid, BM * 3, smem, stream, q,
                             q_stride, kv, b->q_start, b->ctx_len, b->block_tables, b->max_blocks, out, H,
                             KVH, block_size, sl2, maps));
            return 0;
        }
    }
    K_CHECK(k_launch(attention_prefill_kernel<D, BM, F8, WG>, grid, BM * 2, smem, stream, q, q_stride, kv,
                     b->q_start, b->ctx_len, b->block_tables, b->max_blocks, out, H, KVH, block_size, sl2,
                     maps));
    return 0;
}

/* k_attention_prefill_force: 0 = automatic, else K_ATTN_PREFILL_* (kernels.h) */
std::atomic<int> prefill_forced{0};

template <int D, bool F8, bool ROPE>
int launch_decode(const bf16 *q, int q_stride, const kv_src &kv, const k_attn_batch *b, bf16 *out, int H,
                  int KVH, int block_size, float sl2, int part, int n_part, void *ws, const k_rope_in &rope,
                  cudaStream_t stream)
{
    static bool smem_done[16];
    if (raise_smem(attention_decode_kernel<D, F8, ROPE>, decode_smem<D, F8>(), smem_done))
        return -1;
    float *ws_o = (float *)ws;
    float2 *ws_ml = n_part > 1 ? (float2 *)(ws_o + (size_t)b->n_seqs * H * n_part * D) : nullptr;
    dim3 grid(n_part, KVH, b->n_seqs);
    K_CHECK(k_launch(attention_decode_kernel<D, F8, ROPE>, grid, DC_THREADS, decode_smem<D, F8>(), stream, q,
                     q_stride, kv, b->q_start, b->ctx_len, b->block_tables, b->max_blocks, out, H, KVH,
                     block_size, sl2, part, n_part, ws_o, ws_ml, rope));
    if (n_part > 1) {
        const long long warps = (long long)b->n_seqs * H;
        K_CHECK(k_launch(attention_decode_reduce_kernel<D>, (unsigned)((warps + 3) / 4), dim3(32, 4), 0,
                         stream, ws_o, ws_ml, b->q_start, b->ctx_len, out, b->n_seqs, H, part, n_part));
    }
    return 0;
}

template <bool F8>
int prefill_impl(const char *fn, const bf16 *q, int q_stride, const kv_src &kv, const struct k_attn_batch *b,
                 bf16 *out, int H, int KVH, int D, int block_size, float scale, cudaStream_t stream)
{
    if (check_common(fn, q, q_stride, kv, F8, b, out, H, KVH, D, block_size))
        return -1;
    if (b->n_seqs <= 0 || b->max_q_len <= 0)
        return 0;
    const float sl2 = scale * 1.4426950408889634f;
    /* tuning hooks (docs/KERNELS.md), read once: LLMQ_ATTN_PREFILL_BM=64 selects the mma.sync kernel's
     * 64-row CTAs of 4 warps; LLMQ_ATTN_PREFILL_WG=0 keeps the mma.sync kernel on sm_90a */
    static const int env = k_env_int("LLMQ_ATTN_PREFILL_BM", 128, 64, 128) == 64 ? K_ATTN_PREFILL_MMA64
                           : k_env_int("LLMQ_ATTN_PREFILL_WG", 1, 0, 1)          ? 0
                                                                                 : K_ATTN_PREFILL_MMA128;
    int v = prefill_forced.load(std::memory_order_relaxed);
    if (v == 0)
        v = env;
    auto wgmma = [](int x) {
        return x == K_ATTN_PREFILL_WGMMA || x == K_ATTN_PREFILL_WGMMA_CPASYNC ||
               x == K_ATTN_PREFILL_WGMMA_SYNC;
    };
    if (v == 0 || wgmma(v))
        v = !(D == 128 && k_wgmma_on()) ? K_ATTN_PREFILL_MMA128 : v == 0 ? K_ATTN_PREFILL_WGMMA : v;
    if (D == 128) {
        if (wgmma(v))
            return launch_prefill<128, 128, F8, true>(q, q_stride, kv, b, out, H, KVH, block_size, sl2,
                                                      stream, v != K_ATTN_PREFILL_WGMMA_CPASYNC,
                                                      v == K_ATTN_PREFILL_WGMMA);
        return v == K_ATTN_PREFILL_MMA64
                   ? launch_prefill<128, 64, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream)
                   : launch_prefill<128, 128, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream);
    }
    return v == K_ATTN_PREFILL_MMA64
               ? launch_prefill<64, 64, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream)
               : launch_prefill<64, 128, F8>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, stream);
}

template <bool F8, bool ROPE = false>
int decode_impl(const char *fn, const bf16 *q, int q_stride, const kv_src &kv, const struct k_attn_batch *b,
                bf16 *out, int H, int KVH, int D, int block_size, float scale, int part_keys, void *workspace,
                size_t workspace_bytes, cudaStream_t stream, const k_rope_in &rope = k_rope_in{})
{
    if (check_common(fn, q, q_stride, kv, F8, b, out, H, KVH, D, block_size))
        return -1;
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
    return D == 128 ? launch_decode<128, F8, ROPE>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, part,
                                                   n_part, workspace, rope, stream)
                    : launch_decode<64, F8, ROPE>(q, q_stride, kv, b, out, H, KVH, block_size, sl2, part,
                                                  n_part, workspace, rope, stream);
}

} // namespace

extern "C" int k_attention_prefill_force(int variant)
{
    K_REQUIRE(variant >= 0 && variant <= K_ATTN_PREFILL_WGMMA_SYNC, "k_attention_prefill_force: variant %d",
              variant);
    prefill_forced.store(variant, std::memory_order_relaxed);
    return variant >= K_ATTN_PREFILL_WGMMA && !k_wgmma_on() ? 1 : 0;
}

extern "C" int k_attention_prefill(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                                   const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                   int block_size, float scale, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, nullptr, nullptr};
    return prefill_impl<false>("k_attention_prefill", q, q_stride, kv, b, out, H, KVH, D, block_size, scale,
                               stream);
}

extern "C" int k_attention_prefill_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache,
                                       const uint8_t *v_cache, const float *k_scale, const float *v_scale,
                                       const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D,
                                       int block_size, float scale, cudaStream_t stream)
{
    const kv_src kv = {k_cache, v_cache, k_scale, v_scale};
    return prefill_impl<true>("k_attention_prefill_fp8", q, q_stride, kv, b, out, H, KVH, D, block_size,
                              scale, stream);
}

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
    return decode_impl<false>("k_attention_decode", q, q_stride, kv, b, out, H, KVH, D, block_size, scale,
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
    return decode_impl<false, true>("k_attention_decode_rope", qkv, (H + 2 * KVH) * D, kv, b, out, H, KVH, D,
                                    block_size, scale, part_keys, workspace, workspace_bytes, stream, *rope);
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
    return decode_impl<true>("k_attention_decode_fp8", q, q_stride, kv, b, out, H, KVH, D, block_size, scale,
                             part_keys, workspace, workspace_bytes, stream);
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
