// The mixture-of-experts grouped GEMM for prefill-sized steps (kernels/moe.h: k_moe_gemm_gate_up,
// k_moe_gemm_down): every expert's rows (k_moe_permute's expert-contiguous order) times that expert's
// weights, in one launch.
//
// Tiles. A CTA computes a tile of 128 rows of one expert x 128 weight rows (BM x BN) over all of K, in
// steps of BK = 32 through a 4-stage cp.async pipeline (kernels/cp_async.cuh): 8 warps as 2 x 4, a warp
// 64 rows x 32 weight rows, mma.sync m16n8k16 bf16 with fp32 accumulation, fragments by ldmatrix from
// shared rows padded to 80 bytes (the 8 rows an ldmatrix reads fall in 8 different bank groups).
// Grid (column tiles, row tiles): blockIdx.y is a row tile of the step, counted expert after expert
// (expert e has ceil(n_e / 128) of them); warp 0 finds the expert from expert_off (a scan of the experts'
// tile counts) and the CTA the tile's first row. The launch has ceil(P / 128) + E row tiles, the most any
// split of P rows over E experts needs; CTAs past the step's tiles leave at once. A tile of the last rows
// of an expert reads zeros for the rows past it (cp.async's zero fill) and stores only its own rows.
//
// gate/up (GLU): a tile's 128 weight rows are, per warp column wn, 16 gate rows n0 + 16 wn + j and the
// matching 16 up rows I + n0 + 16 wn + j, so a thread holds each gate sum and its up sum: the epilogue
// rounds both to bf16 and stores bf16(silu(g) * u) (kernels/silu.cuh), k_silu_mul of the unfused
// product; an output tile is 64 columns. The rows of A are gathered: row i is X[perm_tok[i]].
//
// fp8 weights: the B tile is e4m3 bytes (48-byte shared rows); an ldmatrix of 16 bytes of 8 weight rows
// gives a lane 4 consecutive k of one row, decoded exactly to bf16 pairs (k, k + 2) and (k + 1, k + 3)
// (kernels/gemv_mma.cuh), and the lane's A values are read for the same 4 k and paired alike: a dot
// product may take its k in any order. Each 128-k block's products are summed apart and added times the
// block's scale (the weight rows of a warp's n8 tile lie in one 128-row scale block).
//
// No tensor-memory or wgmma path yet: mma.sync reaches about two thirds of the H100/H200's dense bf16
// rate at best. docs/KERNELS.md, "Mixture of experts", has the bound and what a wgmma kernel would add.
#include <stdint.h>

#include "kernels/cp_async.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/moe.h"
#include "kernels/silu.cuh"

constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4, THREADS = 256;
constexpr int A_LD = (BK + 8) * 2; // bytes a shared row of A (and of a bf16 B): 80
constexpr int B8_LD = BK + 16;     // bytes a shared row of an fp8 B: 48
constexpr int A_BYTES = BM * A_LD;
template <bool FP8> constexpr int stage_bytes()
{
    return A_BYTES + BN * (FP8 ? B8_LD : A_LD);
}

// The expert of row tile y (counted expert after expert), its first row and its number of rows (<= BM);
// e = -1 past the step's tiles. Warp 0: lane l sums the tiles of experts [l J, l J + J), a warp scan
// finds the lane whose experts hold y.
__device__ __forceinline__ void find_tile(const int32_t *off, int E, int y, int *e_out, int *r0_out,
                                          int *n_out)
{
    const int lane = threadIdx.x & 31, J = (E + 31) / 32;
    auto tiles = [&](int e) { return (ld_dep(off + e + 1) - ld_dep(off + e) + BM - 1) / BM; };
    int mine = 0;
    for (int j = 0; j < J; j++)
        if (lane * J + j < E)
            mine += tiles(lane * J + j);
    int inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += v;
    }
    int base = inc - mine;
    if (y >= base && y < inc)
        for (int j = 0; j < J && lane * J + j < E; j++) {
            const int e = lane * J + j, n = tiles(e);
            if (y < base + n) {
                const int r0 = ld_dep(off + e) + (y - base) * BM;
                *e_out = e, *r0_out = r0, *n_out = min(BM, ld_dep(off + e + 1) - r0);
                break;
            }
            base += n;
        }
    if (lane == 31 && y >= inc)
        *e_out = -1;
}

template <bool FP8, bool GLU, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
    moe_gemm_kernel(const bf16 *__restrict__ A, const int32_t *__restrict__ gather,
                    const void *__restrict__ W, const float *__restrict__ w_scale, bf16 *__restrict__ Y,
                    int N, int K, int E, const int32_t *__restrict__ expert_off)
{
    extern __shared__ __align__(128) char smem[];
    __shared__ int tile_e, tile_r0, tile_n;
    pdl_enter(); // kernels/launch.cuh: the expert, the rows and A are the step's
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp >> 2, wn = warp & 3;
    if (warp == 0)
        find_tile(expert_off, E, blockIdx.y, &tile_e, &tile_r0, &tile_n);
    __syncthreads();
    const int e = tile_e;
    if (e < 0)
        return;
    const int r0 = tile_r0, nrows = tile_n;
    constexpr int WB = FP8 ? 1 : 2;        // bytes a weight
    constexpr int BNO = GLU ? BN / 2 : BN; // output columns of a tile
    const int n0 = blockIdx.x * BNO, wrows = GLU ? 2 * N : N;
    const char *We = (const char *)W + (size_t)e * wrows * K * WB;

    // this thread's copies of a stage: A 2 x 16 bytes (row c / 4, piece c % 4 of c = tid, tid + 256);
    // B bf16 the same, B fp8 1 x 16 bytes (row tid / 2, piece tid % 2)
    constexpr int BQ = FP8 ? 1 : 2;
    const char *a_src[2], *b_src[BQ];
    uint32_t a_dst[2], b_dst[BQ];
    bool a_ok[2], b_ok[BQ];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int c = tid + q * THREADS, row = c >> 2, piece = c & 3;
        a_ok[q] = row < nrows;
        const int i = r0 + (a_ok[q] ? row : 0);
        const int src = gather ? ld_dep(gather + i) : i;
        a_src[q] = (const char *)(A + (size_t)src * K) + piece * 16;
        a_dst[q] = row * A_LD + piece * 16;
    }
#pragma unroll
    for (int q = 0; q < BQ; q++) {
        const int c = tid + q * THREADS, b = FP8 ? c >> 1 : c >> 2, piece = FP8 ? c & 1 : c & 3;
        int col, wr;
        if (GLU) {
            const int j = b & 31;
            col = n0 + (b >> 5) * 16 + (j & 15);
            wr = (j < 16 ? 0 : N) + col;
        } else {
            col = n0 + b, wr = col;
        }
        b_ok[q] = col < N;
        b_src[q] = We + (size_t)(b_ok[q] ? wr : 0) * K * WB + piece * 16;
        b_dst[q] = A_BYTES + b * (FP8 ? B8_LD : A_LD) + piece * 16;
    }
    const uint32_t s0 = smem_u32(smem);
    auto load = [&](int kt, int slot) {
        const uint32_t base = s0 + slot * stage_bytes<FP8>();
#pragma unroll
        for (int q = 0; q < 2; q++)
            cp_async16(base + a_dst[q], a_src[q] + (size_t)kt * BK * 2, a_ok[q]);
#pragma unroll
        for (int q = 0; q < BQ; q++)
            cp_async16(base + b_dst[q], b_src[q] + (size_t)kt * BK * WB, b_ok[q]);
    };

    float acc[4][4][4], part[FP8 ? 4 : 1][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                acc[mi][ni][c] = 0.f;
                if (FP8)
                    part[FP8 ? mi : 0][ni][c] = 0.f;
            }
    // fp8: the scale rows of the warp's n8 tiles (a row past the matrix reads row block 0; not stored)
    const int KB = (K + 127) / 128;
    const float *srow[4];
    if (FP8) {
        const float *Se = w_scale + (size_t)e * ((wrows + 127) / 128) * KB;
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int c0 = GLU ? n0 + wn * 16 : n0 + wn * 32;
            const int r = c0 < N ? (GLU && ni >= 2 ? N + c0 : c0) : 0;
            srow[ni] = Se + (size_t)(r / 128) * KB;
        }
    }

    const int KT = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT)
            load(s, s);
        cp_async_commit();
    }
#pragma unroll 1
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // stage kt is in; every warp is done with the slot the next copy overwrites
        if (kt + STAGES - 1 < KT)
            load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
        const uint32_t sa = s0 + (kt % STAGES) * stage_bytes<FP8>(), sb = sa + A_BYTES;
        const char *pa = smem + (kt % STAGES) * stage_bytes<FP8>();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t af[4][4], bfr[4][2];
            if (!FP8) {
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    const int row = wm * 64 + mi * 16 + (lane & 15), col = ks * 16 + (lane >> 4) * 8;
                    ldsm_x4(af[mi], sa + row * A_LD + col * 2);
                }
#pragma unroll
                for (int nj = 0; nj < 2; nj++) {
                    const int row = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
                    const int col = ks * 16 + ((lane >> 3) & 1) * 8;
                    uint32_t r[4];
                    ldsm_x4(r, sb + row * A_LD + col * 2);
                    bfr[2 * nj][0] = r[0], bfr[2 * nj][1] = r[1], bfr[2 * nj + 1][0] = r[2],
                            bfr[2 * nj + 1][1] = r[3];
                }
            } else {
                // A: the lane's 4 k (ks * 16 + 4t ..) of rows g and g + 8, paired (k, k + 2), (k + 1, k + 3)
#pragma unroll
                for (int mi = 0; mi < 4; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = wm * 64 + mi * 16 + g + 8 * h;
                        const uint2 x = *(const uint2 *)(pa + row * A_LD + (ks * 16 + 4 * t) * 2);
                        af[mi][h] = __byte_perm(x.x, x.y, 0x5410);
                        af[mi][2 + h] = __byte_perm(x.x, x.y, 0x7632);
                    }
                // B: matrix i of the ldmatrix is n8 tile i; the lane gets row g, bytes 4t .. 4t + 3
                uint32_t q[4];
                ldsm_x4(q, sb + (wn * 32 + (lane >> 3) * 8 + (lane & 7)) * B8_LD + ks * 16);
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    e4m3x4_to_bf16(q[ni], bfr[ni][0], bfr[ni][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_bf16(FP8 ? part[FP8 ? mi : 0][ni] : acc[mi][ni], af[mi][0], af[mi][1], af[mi][2],
                             af[mi][3], bfr[ni][0], bfr[ni][1]);
        }
        if (FP8 && ((kt + 1) * BK % 128 == 0 || kt + 1 == KT)) { // the end of a 128-k scale block
            const int kb = kt * BK / 128;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const float sc = __ldg(srow[ni] + kb);
#pragma unroll
                for (int mi = 0; mi < 4; mi++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        acc[mi][ni][c] = fmaf(part[FP8 ? mi : 0][ni][c], sc, acc[mi][ni][c]);
                        part[FP8 ? mi : 0][ni][c] = 0.f;
                    }
            }
        }
    }

    // epilogue: C[g (+8)][2t, 2t + 1] of each n8 tile
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = wm * 64 + mi * 16 + g + 8 * h;
            if (row >= nrows)
                continue;
            bf16 *yr = Y + (size_t)(r0 + row) * N;
            if (GLU) {
#pragma unroll
                for (int ni = 0; ni < 2; ni++) {
                    const int col = n0 + wn * 16 + ni * 8 + 2 * t;
                    if (col >= N)
                        continue;
                    float o[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float gv = __bfloat162float(__float2bfloat16(acc[mi][ni][2 * h + c])),
                                    uv = __bfloat162float(__float2bfloat16(acc[mi][ni + 2][2 * h + c]));
                        o[c] = silu_mul1(gv, uv);
                    }
                    *(__nv_bfloat162 *)(yr + col) = __floats2bfloat162_rn(o[0], o[1]);
                }
            } else {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int col = n0 + wn * 32 + ni * 8 + 2 * t;
                    if (col < N)
                        *(__nv_bfloat162 *)(yr + col) =
                            __floats2bfloat162_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
            }
        }
}

// CTAs an SM: two of the bf16 kernels (80 KiB of stages, 128 registers a thread), one of the fp8 ones
// (their block sums take 64 registers more).
template <bool FP8, bool GLU>
static int moe_gemm_run(const bf16 *A, const int32_t *gather, const void *W, const float *s, bf16 *Y, int N,
                        int K, int P, int E, const int32_t *off, cudaStream_t stream)
{
    constexpr int MINB = FP8 ? 1 : 2;
    auto kern = moe_gemm_kernel<FP8, GLU, MINB>;
    const int smem = STAGES * stage_bytes<FP8>();
    K_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    K_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared)); // room for MINB CTAs' stages
    const int bno = GLU ? BN / 2 : BN;
    const dim3 grid((N + bno - 1) / bno, (P + BM - 1) / BM + E);
    K_CHECK(k_launch(kern, grid, THREADS, smem, stream, A, gather, W, s, Y, N, K, E, off));
    return 0;
}

// Either launcher: gate/up (GLU, gathering X's rows) into Hp [P][I], or down from Hp into Yp [P][H].
static int moe_gemm(const char *fn, bool glu, const bf16 *X, bf16 *Y, int T, int k,
                    const struct k_moe_perm *perm, const struct k_moe_weights *w, cudaStream_t stream)
{
    if (k_moe_check(fn, T, k, perm, w, BK, 1, X, Y))
        return -1;
    if (T == 0)
        return 0;
    K_REQUIRE((long)T * k / BM + w->E <= 65535, "%s: %d pairs: too many row tiles", fn, T * k);
    const int P = T * k;
    const int32_t *off = perm->expert_off, *gather = perm->perm_tok;
    if (glu)
        return w->fp8 ? moe_gemm_run<true, true>(X, gather, w->gate_up, w->gate_up_scale, Y, w->I, w->H, P,
                                                 w->E, off, stream)
                      : moe_gemm_run<false, true>(X, gather, w->gate_up, NULL, Y, w->I, w->H, P, w->E, off,
                                                  stream);
    return w->fp8 ? moe_gemm_run<true, false>(X, NULL, w->down, w->down_scale, Y, w->H, w->I, P, w->E, off,
                                              stream)
                  : moe_gemm_run<false, false>(X, NULL, w->down, NULL, Y, w->H, w->I, P, w->E, off, stream);
}

extern "C" int k_moe_gemm_gate_up(const bf16 *X, const struct k_moe_perm *perm, int T, int k,
                                  const struct k_moe_weights *w, bf16 *Hp, cudaStream_t stream)
{
    return moe_gemm("k_moe_gemm_gate_up", true, X, Hp, T, k, perm, w, stream);
}

extern "C" int k_moe_gemm_down(const bf16 *Hp, const struct k_moe_perm *perm, int T, int k,
                               const struct k_moe_weights *w, bf16 *Yp, cudaStream_t stream)
{
    return moe_gemm("k_moe_gemm_down", false, Hp, Yp, T, k, perm, w, stream);
}
