// The decode GEMV's device code (kernels/gemv.cu explains its lane mapping, work split and split K at
// its top): the activation load, the split-K ticket and gemv_body, the body every gemv_kernel
// instantiation runs. A header so that the kernels that run the same body on other operands (the
// mixture-of-experts GEMVs, kernels/moe_gemv.cu: one expert's weights and rows per CTA) compute the
// same products in the same order. Included by kernels/*.cu only.
#pragma once
#include <stdint.h>

#include "kernels/elt16.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"

// ---- device helpers

// Activations: written by the kernel before, read after the wait (ld_dep, kernels/launch.cuh: coherent,
// and cached in L1 for the re-reads of X by a CTA's tiles; through L2 alone, ld.global.cg, single fp8
// lost 25 % on an H100).
__device__ __forceinline__ uint4 ld_x(const void *p)
{
    return ld_dep((const uint4 *)p);
}

// Split K: whether this CTA is the last of its tile's ks parts to finish. Every thread calls it after
// storing its partial sums; the fence makes them visible before the ticket, and the last CTA may then
// read every part (the caller clears the ticket for the next launch).
__device__ __forceinline__ bool last_part(unsigned *ticket, int tile, int ks)
{
    __shared__ unsigned last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&ticket[tile], 1u) == (unsigned)ks - 1;
    __syncthreads();
    bool r = last;
    if (r)
        __threadfence();
    return r;
}

// ---- the kernel

// grid (ceil(N / (16 R))), block (WARPS * 32). See the top of the file. MINB (CTAs per SM) sets the
// register budget, 65536 / (WARPS * 32 * MINB): without one, ptxas (CUDA 13) keeps registers low by
// issuing each load just before its use, which serializes the loads of a chunk.
//
// DC: independent mma accumulation chains (1 or 2); otherwise the products of a step run as one
// dependent chain of long-latency legacy mmas. fp8: the DC chains of a step are summed at its end;
// 16-bit W: the step's second mma goes into a second accumulator, added at the end (2 chains are
// faster for 16-bit weights, no faster for fp8 ones).
//
// GLU (R = 1, ks = 1; k_gemv_*_glu): W holds 2N rows, gate rows 0..N-1 then up rows N..2N-1 (the fused
// gate_up matrix), and a tile is 8 outputs: gate rows n_base + g as the mma's rows g (h = 0), up rows
// N + n_base + g as rows g + 8 (h = 1), each half with its own block scale. The store rounds both sums
// to bf16 as the unfused GEMV would store them and writes silu(gate) * up as k_silu_mul computes it
// (kernels/silu.cuh): the same bits as k_gemv_* followed by k_silu_mul.
//
// E (the 16-bit element type, kernels/elt16.cuh): X, W and a 16-bit Y of the 16-bit-weight path are E
// and its products are mma16816<E>; gemv_kernel is E = bf16 (every path), gemv_kernel_f16 the
// 16-bit-weight path in fp16. The fp8 paths (FP8, GLU) are bf16 only.
//
// TL (k_gemv_fp8_tiled, k_gemv_bf16_tiled): W is read from its copy in tile order
// (k_gemv_*_tile_order) instead of the row-major matrix: the same bytes reach the same lanes, so the
// products and their order, and the bits, are the same; only the addresses differ. A load step reads 64
// bytes of each row (fp8: 64 k, bf16: 32 k). In the copy, a 16-row tile (GLU: 8 gate rows as h = 0 and
// the 8 up rows as h = 1) of rows of KB = K * WB bytes is KB / 128 blocks of 2 KB, one per 128 bytes of
// its rows, and a block holds its two load steps one after the other, each as [h][lane] x 16 bytes: the
// row-major lane (g, t)'s 16 bytes of row 8h + g at byte b0 + 16t are at tile * 16 KB + b0 * 16 +
// h * 512 + lane * 16. So one load instruction reads 512 contiguous bytes instead of 8 stretches of 64,
// and a CTA of 8 warps reads 8 x 2 KB (fp8 u2) or 16 x 2 KB (bf16 u4) in one piece.
//
// GX (the mixture-of-experts GEMVs, kernels/moe_gemv.cu): row m of X is row xrows[m] of Xv, read with
// ld_dep before the body's own PDL wait (the caller has waited already).
template <typename E, int WARPS, int U, int R, bool FP8, int DC, bool GLU, bool TL = false, bool GX = false>
__device__ __forceinline__ void gemv_body(const void *__restrict__ Xv, const void *__restrict__ Wv,
                                          const float *__restrict__ w_scale, void *__restrict__ Y, int y_f32,
                                          int M, int N, int K, int ks, unsigned *__restrict__ ticket,
                                          float *__restrict__ part_sum, const int32_t *xrows = nullptr)
{
    static_assert(!(FP8 || GLU) || !elt16<E>::f16, "the fp8 paths are bf16 only");
    constexpr int EPL = FP8 ? 16 : 8;      // weight elements per 16-byte load
    constexpr int WB = FP8 ? 1 : 2;        // bytes per weight element
    constexpr int STEP = 4 * EPL;          // k covered by one load step (4 lanes per row)
    constexpr int CK = U * STEP;           // k per chunk
    constexpr int XL = FP8 ? 2 : 1;        // 16-byte X loads per lane per step
    constexpr int XB = 2;                  // bytes per X element
    __shared__ float red[WARPS][R][8][16]; // [warp][tile][m][row in tile]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x / ks, part = blockIdx.x - tile * ks; // split K: part of the tile's K
    static_assert(!GLU || R == 1, "GLU tiles are one 8 + 8-row tile");
    const int n_base = tile * (GLU ? 8 : 16 * R);
    const bool okx = g < M;
    const char *wrow[R][2];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (TL) { // a tile past N reads tile 0 (its outputs are not stored)
                const int tl = GLU ? tile : tile * R + r;
                wrow[r][h] = (const char *)Wv + (size_t)(tl * (GLU ? 8 : 16) < N ? tl : 0) * K * WB * 16 +
                             h * 512 + lane * 16;
            } else {
                const int n = GLU ? (n_base + g < N ? h * N + n_base + g : 0) : n_base + 16 * r + 8 * h + g;
                wrow[r][h] =
                    (const char *)Wv + ((size_t)(n < (GLU ? 2 * N : N) ? n : 0) * K + (size_t)t * EPL) * WB;
            }
        }
    int xr = okx ? g : 0;
    if constexpr (GX)
        xr = ld_dep(xrows + xr);
    const char *xrow = (const char *)Xv + ((size_t)xr * K + t * EPL) * XB;
    const int kblocks = (K + 127) / 128;
    // A 16-row tile lies in one 128-row scale block; so do GLU's 8 gate rows and (N % 8 == 0) its 8 up
    // rows, each half with its own block.
    constexpr int SH = GLU ? 2 : 1;
    const float *srow[R][SH];
#pragma unroll
    for (int r = 0; r < R; r++) // a tile past N reads the first scale row (its outputs are not stored)
#pragma unroll
        for (int h = 0; h < SH; h++) {
            const int n = n_base + 16 * r < N ? (GLU ? h * N + n_base : n_base + 16 * r) : 0;
            srow[r][h] = FP8 ? w_scale + (size_t)(n / 128) * kblocks : w_scale;
        }

    float acc[R][4], acc2[R][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[r][i] = 0.f, acc2[r][i] = 0.f;

    // warp w takes chunks w, w + WARPS, ...; a chunk's weight loads (and scales) are all issued
    // before its products. Loads are unconditional (no branches between them): rows past N and X
    // rows past M read row 0 instead (their outputs are not stored), and a lane whose k is past K
    // reads k = 0 and zeroes its X (product 0; W is finite data). K % 16 == 0: all EPL elements of a
    // lane are valid or none.
    const int nchunks = (K + CK - 1) / CK;
    const int c_lo = (int)((long)nchunks * part / ks), c_hi = (int)((long)nchunks * (part + 1) / ks);
    uint4 wv[U][R][2];
    float sc[U][R][SH];
    auto load_w = [&](int c) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k0 = c * CK + u * STEP; // first k of the step (warp-uniform)
            const int kk = k0 + t * EPL < K ? k0 : -t * EPL;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const ptrdiff_t o = TL ? (ptrdiff_t)(k0 < K ? k0 : 0) * WB * 16 : (ptrdiff_t)kk * WB;
                    wv[u][r][h] = ld_stream(wrow[r][h] + o);
                }
            if (FP8)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int h = 0; h < SH; h++)
                        sc[u][r][h] = __ldg(srow[r][h] + (k0 < K ? k0 : 0) / 128);
        }
    };
    // The weights do not depend on the kernel before (PDL, kernels/launch.cuh): the warp's first
    // chunk is on its way while that kernel finishes.
    if (c_lo + warp < c_hi)
        load_w(c_lo + warp);
    pdl_enter(); // kernels/launch.cuh
#pragma unroll 1 // one chunk's loads in flight per warp, as sized; no unrolling by the compiler
    for (int c = c_lo + warp; c < c_hi; c += WARPS) {
        if (c != c_lo + warp)
            load_w(c);
        uint4 xv[U][XL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k0 = c * CK + u * STEP;
            const bool okk = k0 + t * EPL < K;
            const int kk = okk ? k0 : -t * EPL;
#pragma unroll
            for (int i = 0; i < XL; i++) {
                xv[u][i] = ld_x(xrow + (ptrdiff_t)kk * XB + 16 * i);
                if (!okk)
                    xv[u][i] = make_uint4(0, 0, 0, 0);
            }
        }
        // then the products
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!FP8) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    mma16816<E>(acc[r], wv[u][r][0].x, wv[u][r][1].x, wv[u][r][0].y, wv[u][r][1].y,
                                xv[u][0].x, xv[u][0].y);
                    mma16816<E>(DC > 1 ? acc2[r] : acc[r], wv[u][r][0].z, wv[u][r][1].z, wv[u][r][0].w,
                                wv[u][r][1].w, xv[u][0].z, xv[u][0].w);
                }
            } else {
                uint32_t xb0[4], xb1[4]; // the decode's pairs (kernels/gemv_mma.cuh)
                x_pairs16(xv[u][0], xv[u][XL - 1], xb0, xb1);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float dc[DC][4];
#pragma unroll
                    for (int c = 0; c < DC; c++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            dc[c][i] = 0.f;
                    const uint32_t *q0 = (const uint32_t *)&wv[u][r][0], *q1 = (const uint32_t *)&wv[u][r][1];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        uint32_t lo0, hi0, lo1, hi1;
                        e4m3x4_to_bf16(q0[j], lo0, hi0);
                        e4m3x4_to_bf16(q1[j], lo1, hi1);
                        mma_bf16(dc[j % DC], lo0, lo1, hi0, hi1, xb0[j], xb1[j]);
                    }
                    float d[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        d[i] = dc[0][i];
#pragma unroll
                        for (int c = 1; c < DC; c++)
                            d[i] += dc[c][i];
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) // d[0], d[1]: row g; d[2], d[3]: row g + 8
                        acc[r][i] = fmaf(d[i], sc[u][r][GLU ? i >> 1 : 0], acc[r][i]);
                }
            }
        }
    }

    // partial sums of the warps -> shared memory -> one thread per output
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (!FP8 && DC > 1)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[r][i] += acc2[r][i];
        red[warp][r][2 * t][g] = acc[r][0];
        red[warp][r][2 * t + 1][g] = acc[r][1];
        red[warp][r][2 * t][g + 8] = acc[r][2];
        red[warp][r][2 * t + 1][g + 8] = acc[r][3];
    }
    __syncthreads();
    if (GLU) {
        for (int i = threadIdx.x; i < 64; i += WARPS * 32) {
            const int m = i >> 3, row = i & 7, n = n_base + row;
            if (m >= M || n >= N)
                continue;
            float gs = 0.f, us = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; w++)
                gs += red[w][0][m][row], us += red[w][0][m][row + 8];
            const float gv = __bfloat162float(__float2bfloat16(gs)),
                        uv = __bfloat162float(__float2bfloat16(us));
            ((bf16 *)Y)[(size_t)m * N + n] = __float2bfloat16(silu_mul1(gv, uv));
        }
        return;
    }
    auto store = [&](size_t o, float s) {
        if (y_f32)
            ((float *)Y)[o] = s;
        else
            ((E *)Y)[o] = elt16<E>::from_f(s);
    };
    // f(r, m, row, n) for each output of the CTA's tiles (one thread each)
    auto each_output = [&](auto f) {
        for (int i = threadIdx.x; i < R * 128; i += WARPS * 32) {
            const int r = i >> 7, m = (i >> 4) & 7, row = i & 15, n = n_base + 16 * r + row;
            if (m < M && n < N)
                f(r, m, row, n);
        }
    };
    each_output([&](int r, int m, int row, int n) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            s += red[w][r][m][row];
        if (ks == 1)
            store((size_t)m * N + n, s);
        else
            part_sum[((size_t)part * M + m) * N + n] = s;
    });
    if (ks == 1 || !ticket) // no ticket: the parts are the output (k_gemv_fp8_parts)
        return;
    // split K: the tile's last part to finish adds the parts' sums in part order (deterministic) and
    // stores; it leaves the tile's ticket at 0 for the next launch
    if (!last_part(ticket, tile, ks))
        return;
    each_output([&](int, int m, int, int n) {
        float s = 0.f;
        for (int q = 0; q < ks; q++)
            s += __ldcg(part_sum + ((size_t)q * M + m) * N + n);
        store((size_t)m * N + n, s);
    });
    if (threadIdx.x == 0)
        ticket[tile] = 0;
}
