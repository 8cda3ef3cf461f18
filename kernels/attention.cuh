/* Causal attention over the paged KV cache: what the prefill (kernels/attention_prefill.cu) and the
 * decode (kernels/attention_decode.cu) kernels share. Contract and layouts: kernels/kernels.h; design
 * notes and numbers: docs/KERNELS.md, section "Attention".
 *
 * The kernels over a 16-bit cache are templates over its element type E (bf16 or fp16,
 * kernels/elt16.cuh): Q, K, V, the output and the probabilities rounded for P·V are E, the products
 * E in and fp32 out, the softmax fp32; the launchers pick E with k_f16(). The fp8 cache's kernels are
 * bf16 only (E = bf16).
 *
 * Both kernels use mma.sync m16n8k16 (E in, fp32 accumulate; sm_80 and sm_90), K and V tiles of
 * 64 keys gathered from the paged cache with 16-byte cp.async into XOR-swizzled shared memory
 * (conflict-free ldmatrix), and an online softmax in fp32 in the log2 domain. On sm_90a the prefill
 * over a 16-bit cache runs its products on wgmma instead, its 128-key tiles copied by the tensor memory
 * accelerator (kernels/tma.cuh).
 *
 * GQA: a CTA works for one KV head and all G = H / KVH query heads that share it. Its "rows" are
 * packed (token, head) pairs, row = token * G + g, so every K/V tile is loaded once for G heads.
 *
 * Everything here is in an anonymous namespace: each of the two files gets its own copy. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "kernels/cp_async.cuh"
#include "kernels/e4m3x2.cuh"
#include "kernels/elt16.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/kernels.h"
#include "kernels/wgmma.cuh"

namespace
{

/* ------------------------------------------------------------------------------------------------
 * kernels
 * ---------------------------------------------------------------------------------------------- */

constexpr int KV_TILE = 64; /* keys per K/V tile (both kernels) */
constexpr float NEG_INF = -INFINITY;

/* c += a · b for one m16n8k16 tile: a row-major 16x16 (4 regs), b "col" 16x8 (2 regs), c 16x8 fp32;
 * E operands (kernels/elt16.cuh). */
template <typename E>
__device__ __forceinline__ void mma_e16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    mma16816<E>(c, a[0], a[1], a[2], a[3], b0, b1);
}

/* The same product with f16 operands is kernels/gemv_mma.cuh's mma_f16 (the fp8 cache's decode: e4m3
 * codes convert to f16 in one instruction a pair, where bf16 takes a trip through fp32). */

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two e4m3 values (low byte first) to a bf16x2 register, exactly (kernels/e4m3x2.cuh; the f32 -> bf16
 * step is exact too: e4m3's range is inside bf16's normal range). */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v)
{
    const float2 f = e4m3x2_to_float2(v);
    return pack2<bf16>(f.x, f.y);
}

/* The paged cache of one layer as a kernel reads it: 16-bit, E (ks, vs NULL), or e4m3 bytes with one fp32
 * scale per (block, KV head, slot). */
struct kv_src {
    const void *k, *v;
    const float *ks, *vs;
};

/* Element offset of 16-byte chunk c of row r in a [rows][D] 16-bit tile whose chunks are XOR-swizzled
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
 * then the head's slab, then j % bs): the slot of the fp32 scales, and the row of the K/V codes. Block
 * sizes are powers of two (check_common refuses others), so bsh = log2(bs) makes the block a shift and
 * the slot a mask: dividing by a runtime block size costs ~20 instructions a row (it held the fp8 decode
 * kernel's copies at a third of its loop's issue slots, docs/KERNELS.md). 32 bits: a layer's pool holds
 * fewer than 2^32 rows. */
__device__ __forceinline__ uint32_t kv_row(const int32_t *__restrict__ btab, int j, int kvh, int KVH, int bsh)
{
    return (((uint32_t)btab[j >> bsh] * (uint32_t)KVH + (uint32_t)kvh) << bsh) |
           ((uint32_t)j & ((1u << bsh) - 1u));
}

/* Issues the cp.asyncs of one K and one V tile: keys j0 .. j0+63 of KV head kvh, read through the
 * block table. Keys >= jlim are zero-filled without touching the block table (an unwritten slot of
 * the last block may hold anything, and 0 * NaN would poison P·V). Key jskip (< jlim) is left out
 * entirely (no copy: load_kv_row brings it later). SWR > 0: the tiles are in the 128-byte-swizzled
 * layout of SWR rows (kernels/wgmma.cuh, sw128_off), the keys at rows r_off .. r_off + 63. bsh: log2 of
 * the block size (kv_row). */
template <int D, int NT, int SWR = 0, typename E>
__device__ __forceinline__ void load_kv_tile(E *sK, E *sV, const E *__restrict__ kc, const E *__restrict__ vc,
                                             const int32_t *__restrict__ btab, int kvh, int KVH, int bsh,
                                             int j0, int jlim, int tid, int jskip = -1, int r_off = 0)
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
        const size_t off = ok ? (size_t)kv_row(btab, j, kvh, KVH, bsh) * D + c * 8 : 0;
        const uint32_t so = SWR ? sw128_off(r_off + r, c, SWR) : (uint32_t)swz<D>(r, c) * 2;
        if (!ok || j != jskip) { /* a key past jlim is zero-filled even if it is jskip */
            cp_async16(k_base + so, kc + off, ok);
            cp_async16(v_base + so, vc + off, ok);
        }
    }
}

/* The decode kernel's fp8 staging rows: 16-byte chunk c of row r sits at chunk position c ^ (r & 7) for
 * D = 128 (8 chunks a row), so that lanes reading chunks 2 t4 (+ 1) of 2 rows, or 8-byte halves across
 * a row, hit distinct banks; D = 64 rows (4 chunks, 2 rows per 128 bytes) need no swizzle. */
template <int D> __device__ __forceinline__ int f8_chunk(int r, int c)
{
    return D == 128 ? c ^ (r & 7) : c;
}

/* fp8 cache: issues the cp.asyncs of one K and one V tile of e4m3 bytes (16 per copy) into a
 * staging area sF [K, V][KV_TILE][D] (linear, or with SW the chunk order of f8_chunk) and their
 * scales into sS [K, V][KV_TILE]; keys >= jlim are zero-filled and key jskip left out as in
 * load_kv_tile. */
template <int D, int NT, bool SW = false>
__device__ __forceinline__ void load_kv_tile_f8(uint8_t *sF, float *sS, const kv_src kv,
                                                const int32_t *__restrict__ btab, int kvh, int KVH, int bsh,
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
        const size_t off = ok ? (size_t)kv_row(btab, j, kvh, KVH, bsh) * D + c * 16 : 0;
        const int pc = SW ? f8_chunk<D>(r, c) : c;
        if (!ok || j != jskip) {
            cp_async16(base + r * D + pc * 16, kc + off, ok);
            cp_async16(base + (KV_TILE + r) * D + pc * 16, vc + off, ok);
        }
    }
    for (int i = tid; i < 2 * KV_TILE; i += NT) {
        const int j = j0 + i % KV_TILE;
        const bool ok = j < jlim;
        const size_t off = ok ? (size_t)kv_row(btab, j, kvh, KVH, bsh) : 0;
        if (!ok || j != jskip)
            cp_async4(smem_u32(sS + i), (i < KV_TILE ? kv.ks : kv.vs) + off, ok);
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
    K_REQUIRE(!f8 || !k_f16(), "%s: an fp8 KV cache is bf16 only (no fp8 path in fp16 mode)", fn);
    K_REQUIRE(b && q && kv.k && kv.v && out, "%s: NULL pointer", fn);
    K_REQUIRE(!f8 || (kv.ks && kv.vs), "%s: NULL k_scale or v_scale", fn);
    K_REQUIRE(b->n_seqs <= 0 || (b->q_start && b->ctx_len && b->block_tables), "%s: NULL batch array", fn);
    K_REQUIRE(D == 64 || D == 128, "%s: head dim %d (64 or 128 supported)", fn, D);
    K_REQUIRE(H > 0 && KVH > 0 && H % KVH == 0, "%s: H %d is not a positive multiple of KVH %d", fn, H, KVH);
    K_REQUIRE(block_size > 0 && b->max_blocks > 0, "%s: block_size %d, max_blocks %d", fn, block_size,
              b->max_blocks);
    K_REQUIRE((block_size & (block_size - 1)) == 0, "%s: block_size %d is not a power of two", fn,
              block_size); /* kv_row */
    K_REQUIRE(q_stride >= H * D && q_stride % 8 == 0, "%s: q_stride %d (>= H * D = %d, a multiple of 8)", fn,
              q_stride, H * D);
    K_REQUIRE(((uintptr_t)q | (uintptr_t)kv.k | (uintptr_t)kv.v) % 16 == 0 && (uintptr_t)out % 4 == 0,
              "%s: q, k_cache, v_cache must be 16-byte aligned, out 4-byte aligned", fn);
    K_REQUIRE(!f8 || ((uintptr_t)kv.ks | (uintptr_t)kv.vs) % 4 == 0,
              "%s: k_scale, v_scale must be 4-byte aligned", fn);
    K_REQUIRE(b->n_seqs <= 65535, "%s: %d sequences (at most 65535 per launch)", fn, b->n_seqs);
    return 0;
}

} // namespace
