// Skinny GEMM / GEMV for decode-sized batches: Y[M, N] = X[M, K] . W[N, K]^T with M <= 8, bf16 or
// e4m3 (128x128 block-scaled) weights, bf16 activations, fp32 accumulation, one rounding at the store.
// In fp16 mode (k_f16(), kernels.h) the 16-bit-weight GEMV computes the same with X, W and a 16-bit Y
// in fp16 (f16 mmas, fp16 rounding at the store: gemv_kernel_f16); the fp8 GEMVs are bf16 only.
//
// The job is to stream W once at the copy bandwidth; the arithmetic is small. The products run on
// the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), which fits the shape exactly: the
// 16 rows of the A operand are 16 rows n of W, and the 8 columns of the B operand are the (up to)
// 8 rows m of X. That keeps the per-byte instruction count flat in M (an FMA version needs M FMAs
// per weight element, which at M = 8 and fp8 weights would need the whole FP32 pipe).
//
// Fragment layout. In an m16n8k16 mma, lane (g = lane / 4, t = lane % 4) supplies A[g][2t, 2t+1],
// A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9] and B[2t, 2t+1][g], B[2t+8, 2t+9][g], and
// gets C[g][2t, 2t+1] and C[g+8][2t, 2t+1]. Because a dot product may sum its k's in any order, the
// kernel maps the 16 logical k of an mma onto physical k's so that every lane reads 16 contiguous
// bytes: lane t of row group g loads W[n0 + g][k + 8t .. k + 8t + 8) and W[n0 + g + 8][same]
// (bf16: 8 elements, two mmas) and the same k's of X row m = g. So one 16-byte load instruction
// moves 64 contiguous bytes of each of 8 rows (two full 32-byte sectors per row); X is read with
// the same pattern through L1 (it is tiny and every CTA reads it). fp8: a 16-byte load is 16
// elements of a row (four mmas); the e4m3 -> bf16 decode is two shifts and a LOP3 per bf16 pair
// (e4m3's 4 exponent and 3 mantissa bits land in the low bits of bf16's exponent and the high bits
// of its mantissa, which is the exact value times 2^-120, subnormals included), then one bf16x2
// multiply by 2^120 (exact). The decode yields the pairs (byte 0, byte 2) and (byte 1, byte 3), so
// X's pairs are permuted to match (PRMT). The block scale is constant over a 64-k step and a
// 16-row tile: each step's four mmas start from zero and the step's sum is added into the fp32
// accumulator times its scale.
//
// Work split. A CTA owns R tiles of 16 rows (R * 16 rows of Y) and all of K; its WARPS warps split
// K into chunks of U load steps (a load step = one 16-byte load per row per lane: 32 k for bf16,
// 64 k for fp8), warp w taking chunks w, w + WARPS, ... (so the warps of a CTA read neighbouring
// stretches of the same rows). A chunk's 2 * R * U weight loads (and its X loads) are all issued
// before the first mma: 2 * R * U * 16 bytes per lane in flight. At the end the warps' partial
// sums (4 * R floats per lane) meet in shared memory, one thread per output adds the WARPS partials
// in a fixed order and stores once. No atomics, no workspace, no host synchronization: launchers
// are safe to capture in CUDA graphs.
//
// Split K (k_gemv_* with a workspace). A one-wave GEMV whose warps walk many chunks one after another
// streams below the rate of a multi-wave one (Qwen3-14B's down projection against its gate/up). Then the grid
// is ks CTAs per tile, each over a contiguous ks-th of the chunks; each writes its fp32 sums to the
// workspace, takes a ticket (atomicAdd after a fence), and the tile's last CTA adds the ks sums in part order
// — the result does not depend on which CTA finishes last — stores Y and puts the ticket back to 0 for the
// next launch (graph replays included). k_gemv_fp8_parts stops before the ticket: with no ticket every CTA
// stores its part's sums into the caller's [ks][M][N] and leaves, and the caller adds them
// (k_add_parts_rmsnorm, in the same order and rounding).
//
// The configuration (WARPS, U, R) is a template parameter; gemv_pick() chooses one of three per shape
// (the launchers below).
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "kernels/elt16.cuh"
#include "kernels/gemv_body.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"

template <int WARPS, int U, int R, int MINB, bool FP8, int DC = 1, bool GLU = false, bool TL = false>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    gemv_kernel(const void *__restrict__ Xv, const void *__restrict__ Wv, const float *__restrict__ w_scale,
                void *__restrict__ Y, int y_f32, int M, int N, int K, int ks, unsigned *__restrict__ ticket,
                float *__restrict__ part_sum)
{
    gemv_body<__nv_bfloat16, WARPS, U, R, FP8, DC, GLU, TL>(Xv, Wv, w_scale, Y, y_f32, M, N, K, ks, ticket,
                                                            part_sum);
}

// The 16-bit-weight path in fp16 (X, W and a 16-bit Y __half; k_f16()).
template <int WARPS, int U, int R, int MINB, int DC>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    gemv_kernel_f16(const void *__restrict__ Xv, const void *__restrict__ Wv,
                    const float *__restrict__ w_scale, void *__restrict__ Y, int y_f32, int M, int N, int K,
                    int ks, unsigned *__restrict__ ticket, float *__restrict__ part_sum)
{
    gemv_body<__half, WARPS, U, R, false, DC, false>(Xv, Wv, w_scale, Y, y_f32, M, N, K, ks, ticket,
                                                     part_sum);
}

// ---- one row of X: the diagonal mapping (gemv_diag_kernel)
//
// At M = 1 only one of the mma's 8 B columns carries X, so the columns are free for another use: lane
// (g, t) supplies B column g from the k's of A row g that it supplies itself, and then only the
// diagonal products C[g][g] and C[g + 8][g] pair a weight with its own x. That lets A's 8 row groups
// be 8 consecutive 64-byte slices of one weight row instead of 8 rows: lane (g, t) loads
// W[ra][k0 + 64 g + 16 t .. + 16) (A rows g) and W[rb][same] (A rows g + 8), so one 16-byte load
// instruction moves 512 contiguous bytes of one row (four full 128-byte lines) where gemv_kernel's moves
// 64 bytes of each of 8 rows. A step is 512 k; the decode, the X pairs and the four mmas of a step are
// gemv_kernel's fp8 ones. Slice g lies in the 128-k scale block k0 / 128 + g / 2, so a lane scales
// its step sums by its own block's scale; the useful sums sit in lanes t = g / 2 (d[g & 1] for ra,
// d[2 + (g & 1)] for rb), and one butterfly over the warp adds the 8 slices at the end (fixed order).
//
// A warp owns its two rows over its part of K (no shared memory, no CTA barrier): a CTA of 8 warps is
// a tile of 16 rows (warp w: rows w and w + 8), or with GLU 8 outputs (warp w: gate row n and up row
// F + n). Split K: part p of ks takes steps [S p / ks, S (p + 1) / ks) of the S = ceil(K / 512); its sums
// go to part_sum [ks][N] and, with a ticket, the tile's last part adds them in part order and stores
// (gemv_kernel's scheme); without one the parts are the output (k_gemv_fp8_parts). The fp32 sums differ
// from gemv_kernel's in their order of additions, not in what they add.
template <int U, bool GLU>
__global__ void __launch_bounds__(256, 4)
    gemv_diag_kernel(const bf16 *__restrict__ X, const uint8_t *__restrict__ W,
                     const float *__restrict__ w_scale, void *__restrict__ Y, int y_f32, int N, int K, int ks,
                     unsigned *__restrict__ ticket, float *__restrict__ part_sum)
{
    constexpr int STEP = 512, SH = GLU ? 2 : 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, off = 64 * g + 16 * t;
    const int tile = blockIdx.x / ks, part = blockIdx.x - tile * ks;
    const int n_base = tile * (GLU ? 8 : 16);
    // rows past N read row 0 (their sums are not stored)
    const int na = n_base + warp, nb = GLU ? na : na + 8;
    const bool oka = na < N, okb = nb < N;
    const int ra = oka ? na : 0, rb = okb ? (GLU ? N + nb : nb) : 0;
    const char *wa = (const char *)W + (size_t)ra * K + off, *wb = (const char *)W + (size_t)rb * K + off;
    const int kblocks = (K + 127) / 128;
    const float *srow[SH];
    srow[0] = w_scale + (size_t)(ra / 128) * kblocks;
    if (GLU)
        srow[SH - 1] = w_scale + (size_t)(rb / 128) * kblocks;
    const int steps = (K + STEP - 1) / STEP;
    const int s_lo = (int)((long)steps * part / ks), s_hi = (int)((long)steps * (part + 1) / ks);

    // a step past the part or a lane's k past K reads its row's first bytes and zeroes its X
    auto ok_of = [&](int s) { return s < s_hi && s * STEP + off < K; };
    auto k_of = [&](int s) { return ok_of(s) ? s * STEP : -off; };
    uint4 wv[U][2];
    float sc[U][SH];
    auto load_w = [&](int s0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kk = k_of(s0 + u);
            wv[u][0] = ld_stream(wa + kk);
            wv[u][1] = ld_stream(wb + kk);
            const int kb = min(((s0 + u) * STEP + 64 * g) / 128, kblocks - 1);
#pragma unroll
            for (int h = 0; h < SH; h++)
                sc[u][h] = __ldg(srow[h] + kb);
        }
    };
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (s_lo < s_hi)
        load_w(s_lo);
    pdl_enter(); // kernels/launch.cuh: the first weights are on their way before the wait
#pragma unroll 1
    for (int s0 = s_lo; s0 < s_hi; s0 += U) {
        if (s0 != s_lo)
            load_w(s0);
        uint4 xv[U][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kk = k_of(s0 + u);
            const bool okk = ok_of(s0 + u);
            const bf16 *xp = X + off + kk;
            xv[u][0] = ld_x(xp), xv[u][1] = ld_x(xp + 8);
            if (!okk)
                xv[u][0] = xv[u][1] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t xb0[4], xb1[4];
            x_pairs16(xv[u][0], xv[u][1], xb0, xb1);
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            const uint32_t *q0 = (const uint32_t *)&wv[u][0], *q1 = (const uint32_t *)&wv[u][1];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t lo0, hi0, lo1, hi1;
                e4m3x4_to_bf16(q0[j], lo0, hi0);
                e4m3x4_to_bf16(q1[j], lo1, hi1);
                mma_bf16(d, lo0, lo1, hi0, hi1, xb0[j], xb1[j]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) // d[0], d[1]: rows ra's slices; d[2], d[3]: rb's
                acc[i] = fmaf(d[i], sc[u][GLU ? i >> 1 : 0], acc[i]);
        }
    }
    const bool diag = t == g >> 1;
    const bool odd = g & 1; // selects, not an index (which would put acc in local memory)
    float sa = diag ? (odd ? acc[1] : acc[0]) : 0.f, sb = diag ? (odd ? acc[3] : acc[2]) : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        sa += __shfl_xor_sync(0xffffffffu, sa, o);
        sb += __shfl_xor_sync(0xffffffffu, sb, o);
    }
    if (GLU) {
        if (lane == 0 && oka) {
            const float gv = __bfloat162float(__float2bfloat16(sa)),
                        uv = __bfloat162float(__float2bfloat16(sb));
            ((bf16 *)Y)[na] = __float2bfloat16(silu_mul1(gv, uv));
        }
        return;
    }
    auto store = [&](int n, float s) {
        if (y_f32)
            ((float *)Y)[n] = s;
        else
            ((bf16 *)Y)[n] = __float2bfloat16(s);
    };
    if (lane == 0) {
        if (ks == 1) {
            if (oka)
                store(na, sa);
            if (okb)
                store(nb, sb);
        } else {
            if (oka)
                part_sum[(size_t)part * N + na] = sa;
            if (okb)
                part_sum[(size_t)part * N + nb] = sb;
        }
    }
    if (ks == 1 || !ticket)
        return;
    if (!last_part(ticket, tile, ks))
        return;
    if (threadIdx.x < 16 && n_base + (int)threadIdx.x < N) {
        const int n = n_base + threadIdx.x;
        float s = 0.f;
        for (int q = 0; q < ks; q++)
            s += __ldcg(part_sum + (size_t)q * N + n);
        store(n, s);
    }
    if (threadIdx.x == 0)
        ticket[tile] = 0;
}

// Whether one-row fp8 GEMVs of at least one 16-row tile an SM (gemv_pick's WIDE_FP8, the gate/up GLU
// kernel, the parts of down) take gemv_diag_kernel: k_gemv_fp8_diag, else the device's rule: sm_90 with
// less than 4 TB/s of nominal memory bandwidth (peak memory clock x bus width x 2). It is faster on an
// H100 (3.35 TB/s) and not on an H200 (4.9 TB/s); other devices are not measured and keep the tile mapping.
static int g_diag = -1;
static bool diag_device_rule()
{
    int dev = 0, major = 0, khz = 0, bits = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    const double bytes_per_s = 2.0 * khz * 1e3 * bits / 8;
    return major == 9 && bytes_per_s > 0 && bytes_per_s < 4e12;
}
static bool diag_on()
{
    if (g_diag < 0)
        g_diag = diag_device_rule();
    return g_diag == 1;
}

extern "C" int k_gemv_fp8_diag(int on)
{
    const int was = diag_on();
    if (on >= 0)
        g_diag = on ? 1 : 0;
    return was;
}

static int diag_launch(bool glu, const bf16 *X, const uint8_t *W, const float *w_scale, void *Y, int y_f32,
                       int N, int K, int ks, unsigned *ticket, float *part_sum, cudaStream_t stream)
{
    if (glu)
        K_CHECK(k_launch(gemv_diag_kernel<2, true>, (N + 7) / 8, 256, 0, stream, X, W, w_scale, Y, 0, N, K, 1,
                         (unsigned *)NULL, (float *)NULL));
    else
        K_CHECK(k_launch(gemv_diag_kernel<2, false>, (N + 15) / 16 * ks, 256, 0, stream, X, W, w_scale, Y,
                         y_f32, N, K, ks, ticket, part_sum));
    return 0;
}

// ---- a second copy of the weights in tile order (k_gemv_*_tile_order, k_gemv_*_tiled)
//
// The copy's layout is at gemv_body's TL, in bytes: rows of KB bytes (fp8: K, bf16: 2K). One thread a
// 16-byte piece of the copy: piece o is lane (o % 32) of half (o / 32) % 2 of load step (o / 64) % 2 of
// block o / 128, block b being the 128-byte block b % (KB / 128) of tile b / (KB / 128).
__global__ void tile_order_kernel(const uint4 *__restrict__ W, uint4 *__restrict__ Wt, int N, int KB, int glu)
{
    const size_t pieces = (size_t)(glu ? 2 * N : N) * KB / 16;
    const int kblocks = KB / 128;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < pieces;
         o += (size_t)gridDim.x * blockDim.x) {
        const size_t b = o >> 7;
        const int j = (int)(o & 127), tile = (int)(b / kblocks), kb = (int)(b % kblocks);
        const int step = j >> 6, h = (j >> 5) & 1, g = (j & 31) >> 2, t = j & 3;
        const size_t row = glu ? (size_t)h * N + 8 * tile + g : (size_t)16 * tile + 8 * h + g;
        Wt[o] = W[(row * KB + kb * 128 + step * 64 + t * 16) / 16];
    }
}

// The registered copies: W (with its shape and kind) -> its copy. Looked up on the host at each launch
// that could read one (in the engine only while a graph is captured); a launch whose shape or kind differs
// from the registration reads W.
enum { TILED_FP8, TILED_FP8_GLU, TILED_BF16 };
struct tiled_copy {
    const void *w, *wt;
    int n, k, kind;
};
static std::mutex g_tiled_mu;
static std::vector<tiled_copy> g_tiled;
static std::atomic<int> g_tiled_n{0};

static const void *tiled_find(const void *W, int N, int K, int kind)
{
    if (g_tiled_n.load(std::memory_order_acquire) == 0)
        return NULL;
    std::lock_guard<std::mutex> lock(g_tiled_mu);
    for (const tiled_copy &c : g_tiled)
        if (c.w == W)
            return c.n == N && c.k == K && c.kind == kind ? c.wt : NULL;
    return NULL;
}

// The shape a copy needs: N a multiple of 16 (GLU: of 8), rows a multiple of 128 bytes.
static int tiled_shape(const char *fn, const void *W, const void *Wt, int N, int K, int kind)
{
    const int eb = kind == TILED_BF16 ? 2 : 1, nq = kind == TILED_FP8_GLU ? 8 : 16;
    K_REQUIRE(W, "%s: NULL W", fn);
    K_REQUIRE((uintptr_t)W % 16 == 0 && (uintptr_t)Wt % 16 == 0, "%s: W %p and Wt %p must be 16-byte aligned",
              fn, W, Wt);
    K_REQUIRE(N >= 1 && N % nq == 0, "%s: N %d not a positive multiple of %d", fn, N, nq);
    K_REQUIRE(K >= 128 / eb && K % (128 / eb) == 0, "%s: K %d not a positive multiple of %d", fn, K,
              128 / eb);
    return 0;
}

static int tile_order(const char *fn, const void *W, void *Wt, int N, int K, int kind, cudaStream_t stream)
{
    K_REQUIRE(Wt, "%s: NULL Wt", fn);
    if (tiled_shape(fn, W, Wt, N, K, kind))
        return -1;
    const bool glu = kind == TILED_FP8_GLU;
    const int KB = kind == TILED_BF16 ? 2 * K : K;
    const size_t pieces = (size_t)(glu ? 2 * N : N) * KB / 16;
    const unsigned grid = (unsigned)std::min<size_t>((pieces + 255) / 256, (size_t)k_sm_count() * 16);
    tile_order_kernel<<<grid, 256, 0, stream>>>((const uint4 *)W, (uint4 *)Wt, N, KB, glu ? 1 : 0);
    K_CHECK_LAUNCH();
    return 0;
}

static int tiled_set(const char *fn, const void *W, const void *Wt, int N, int K, int kind)
{
    if (Wt && tiled_shape(fn, W, Wt, N, K, kind))
        return -1;
    K_REQUIRE(W, "%s: NULL W", fn);
    std::lock_guard<std::mutex> lock(g_tiled_mu);
    for (size_t i = 0; i < g_tiled.size(); i++)
        if (g_tiled[i].w == W) {
            g_tiled.erase(g_tiled.begin() + i);
            break;
        }
    if (Wt)
        g_tiled.push_back({W, Wt, N, K, kind});
    g_tiled_n.store((int)g_tiled.size(), std::memory_order_release);
    return 0;
}

extern "C" int k_gemv_fp8_tile_order(const uint8_t *W, uint8_t *Wt, int N, int K, int glu,
                                     cudaStream_t stream)
{
    return tile_order("k_gemv_fp8_tile_order", W, Wt, N, K, glu ? TILED_FP8_GLU : TILED_FP8, stream);
}

extern "C" int k_gemv_bf16_tile_order(const bf16 *W, bf16 *Wt, int N, int K, cudaStream_t stream)
{
    return tile_order("k_gemv_bf16_tile_order", W, Wt, N, K, TILED_BF16, stream);
}

extern "C" int k_gemv_fp8_tiled(const uint8_t *W, const uint8_t *Wt, int N, int K, int glu)
{
    return tiled_set("k_gemv_fp8_tiled", W, Wt, N, K, glu ? TILED_FP8_GLU : TILED_FP8);
}

extern "C" int k_gemv_bf16_tiled(const bf16 *W, const bf16 *Wt, int N, int K)
{
    return tiled_set("k_gemv_bf16_tiled", W, Wt, N, K, TILED_BF16);
}

// ---- launchers

// The three configurations gemv_pick chooses from: (warps per CTA, load steps per chunk, 16-row tiles per
// CTA, CTAs per SM the registers are sized for, accumulation chains DC). NARROW: shapes of fewer 16-row
// tiles than SMs, either weight type (16 warps a CTA for more loads in flight per SM); WIDE_FP8 and
// WIDE_16: shapes of as many tiles as SMs or more, fp8 and 16-bit weights. Chunks are 128 k for the wide
// ones (16-bit u4, fp8 u2), so K = 5120 is 40 chunks, 5 per warp of 8, and 64 registers let 4 CTAs of 8
// warps share an SM (528 CTAs of 16 rows resident at once on 132 SMs: every Qwen3-14B projection but
// gate_up and lm_head in one wave, so no CTA runs in a lonely tail). Every configuration reads the
// tile-order copies (k_gemv_*_tiled) where they are registered. One list drives the launch and the shapes.
enum gemv_cfg { CFG_NARROW, CFG_WIDE_FP8, CFG_WIDE_16 };
#define GEMV_CONFIGS(X)                                                                                      \
    X(NARROW, 16, 2, 1, 2, 1)                                                                                \
    X(WIDE_FP8, 8, 2, 1, 4, 1)                                                                               \
    X(WIDE_16, 8, 4, 1, 4, 2)

// E: the 16-bit type of X and W (FP8: of X, bf16 only). TL: W is a tile-order copy. Only the weight
// type's own configurations are instantiated.
template <typename E, bool FP8, bool TL = false>
static int launch_cfg(int cfg, int ks, unsigned *ticket, float *part_sum, const void *X, const void *W,
                      const float *s, void *Y, int y_f32, int M, int N, int K, cudaStream_t stream)
{
    static_assert(!FP8 || !elt16<E>::f16, "the fp8 GEMVs are bf16 only");
    switch (cfg) {
#define GEMV_CASE(C, WARPS, U, R, MINB, DC)                                                                  \
    case CFG_##C:                                                                                            \
        if constexpr (CFG_##C == (FP8 ? CFG_WIDE_16 : CFG_WIDE_FP8))                                         \
            break;                                                                                           \
        else if constexpr (elt16<E>::f16)                                                                    \
            K_CHECK(k_launch(gemv_kernel_f16<WARPS, U, R, MINB, DC>, (N + 16 * R - 1) / (16 * R) * ks,       \
                             32 * WARPS, 0, stream, X, W, s, Y, y_f32, M, N, K, ks, ticket, part_sum));      \
        else                                                                                                 \
            K_CHECK(k_launch(gemv_kernel<WARPS, U, R, MINB, FP8, DC, false, TL>,                             \
                             (N + 16 * R - 1) / (16 * R) * ks, 32 * WARPS, 0, stream, X, W, s, Y, y_f32, M,  \
                             N, K, ks, ticket, part_sum));                                                   \
        return 0;
        GEMV_CONFIGS(GEMV_CASE)
#undef GEMV_CASE
    }
    return k_failf(__FILE__, __LINE__, "gemv: no configuration %d for %s weights", cfg,
                   FP8 ? "fp8" : "16-bit");
}

// The 16-bit-weight GEMV with X and W in E.
template <typename E>
static int launch_16(int cfg, int ks, unsigned *ticket, float *part_sum, const void *X, const void *W,
                     void *Y, int y_f32, int M, int N, int K, cudaStream_t stream)
{
    return launch_cfg<E, false>(cfg, ks, ticket, part_sum, X, W, NULL, Y, y_f32, M, N, K, stream);
}

// The configuration for a shape (above): narrow below one 16-row tile an SM, else the weight type's wide one.
static int gemv_pick(bool fp8, int N)
{
    const int tiles = (N + 15) / 16;
    if (tiles < k_sm_count())
        return CFG_NARROW;
    return fp8 ? CFG_WIDE_FP8 : CFG_WIDE_16;
}

static int gemv_check(const char *fn, const void *X, const void *W, const float *s, bool fp8, const void *Y,
                      int M, int N, int K, int ks)
{
    K_REQUIRE(M >= 1 && M <= K_GEMV_MAX_M, "%s: M %d out of 1..%d", fn, M, K_GEMV_MAX_M);
    K_REQUIRE(N >= 1, "%s: N %d < 1", fn, N);
    K_REQUIRE(K >= 16 && K % 16 == 0, "%s: K %d not a positive multiple of 16", fn, K);
    K_REQUIRE(X && W && Y && (s || !fp8), "%s: NULL pointer (X %p W %p Y %p w_scale %p)", fn, X, W, Y,
              (const void *)s);
    K_REQUIRE((uintptr_t)X % 16 == 0 && (uintptr_t)W % 16 == 0, "%s: X %p and W %p must be 16-byte aligned",
              fn, (const void *)X, W);
    K_REQUIRE(ks >= 0 && ks <= K_GEMV_MAX_SPLIT, "%s: ks %d out of 0..%d", fn, ks, K_GEMV_MAX_SPLIT);
    return 0;
}

// rows of Y per CTA, k per chunk, warps per CTA and CTAs per SM (register budget) of a configuration
struct cfg_info {
    int rows, chunk_k, warps, minb;
};
static cfg_info cfg_shape(int cfg, bool fp8)
{
    switch (cfg) {
#define GEMV_SHAPE(C, WARPS, U, R, MINB, DC)                                                                 \
    case CFG_##C:                                                                                            \
        return {16 * R, U * 4 * (fp8 ? 16 : 8), WARPS, MINB};
        GEMV_CONFIGS(GEMV_SHAPE)
#undef GEMV_SHAPE
    }
    return {16, 128, 8, 4};
}

// Split K (ks = 0): a one-wave GEMV whose warps each walk many chunks one after another (Qwen3-14B's
// down projection: 320 CTAs, 17 chunks a warp) is cut into 4 parts of K, 4x the CTAs in several
// waves, like the gate/up GEMV, which streams at a higher rate (docs/CUDA_BACKEND.md). Only shapes of
// at least one CTA per SM and at most one wave are split.
static int gemv_ks_auto(int ctas, int nchunks, const cfg_info &ci)
{
    const int sms = k_sm_count();
    if (ctas < sms || ctas >= ci.minb * sms)
        return 1;
    return nchunks >= 16 * ci.warps ? 4 : 1; // 16 or more chunks a warp
}

static int gemv_run(const char *fn, bool fp8, const void *X, const void *W, const float *w_scale, void *Y,
                    int y_f32, int M, int N, int K, int ks, void *ws, cudaStream_t stream)
{
    K_REQUIRE(!fp8 || !k_f16(), "%s: fp8 weights are bf16 only (no fp8 path in fp16 mode)", fn);
    if (M == 0)
        return 0;
    if (gemv_check(fn, X, W, w_scale, fp8, Y, M, N, K, ks))
        return -1;
    const int cfg = gemv_pick(fp8, N);
    const cfg_info ci = cfg_shape(cfg, fp8);
    const int ctas = (N + ci.rows - 1) / ci.rows, nchunks = (K + ci.chunk_k - 1) / ci.chunk_k;
    auto fits = [&](int parts) {
        return ws && ctas <= K_GEMV_WS_TICKETS &&
               (size_t)parts * M * N * 4 <= K_GEMV_WS_BYTES - K_GEMV_WS_TICKETS * 4;
    };
    if (ks == 0) {
        const int want = gemv_ks_auto(ctas, nchunks, ci);
        ks = fits(want) ? want : 1;
    }
    if (ks > nchunks)
        ks = nchunks;
    K_REQUIRE(ks == 1 || fits(ks),
              "%s: a split of K in %d needs the workspace (%p), at most %d CTAs (%d) and %d x M x N floats",
              fn, ks, ws, K_GEMV_WS_TICKETS, ctas, ks);
    unsigned *ticket = (unsigned *)ws;
    float *part_sum = ws ? (float *)((char *)ws + K_GEMV_WS_TICKETS * 4) : NULL;
    const void *wt = !k_f16() ? tiled_find(W, N, K, fp8 ? TILED_FP8 : TILED_BF16) : NULL;
    if (wt)
        return fp8 ? launch_cfg<__nv_bfloat16, true, true>(cfg, ks, ticket, part_sum, X, wt, w_scale, Y,
                                                           y_f32 != 0, M, N, K, stream)
                   : launch_cfg<__nv_bfloat16, false, true>(cfg, ks, ticket, part_sum, X, wt, NULL, Y,
                                                            y_f32 != 0, M, N, K, stream);
    if (fp8 && M == 1 && cfg == CFG_WIDE_FP8 && diag_on())
        return diag_launch(false, (const bf16 *)X, (const uint8_t *)W, w_scale, Y, y_f32 != 0, N, K, ks,
                           ticket, part_sum, stream);
    if (fp8)
        return launch_cfg<__nv_bfloat16, true>(cfg, ks, ticket, part_sum, X, W, w_scale, Y, y_f32 != 0, M, N,
                                               K, stream);
    return K_ELT16(launch_16, cfg, ks, ticket, part_sum, X, W, Y, y_f32 != 0, M, N, K, stream);
}

extern "C" int k_gemv_bf16(const bf16 *X, const bf16 *W, void *Y, int y_f32, int M, int N, int K, int ks,
                           void *ws, cudaStream_t stream)
{
    return gemv_run("k_gemv_bf16", false, X, W, NULL, Y, y_f32, M, N, K, ks, ws, stream);
}

extern "C" int k_gemv_fp8(const bf16 *X, const uint8_t *W, const float *w_scale, void *Y, int y_f32, int M,
                          int N, int K, int ks, void *ws, cudaStream_t stream)
{
    return gemv_run("k_gemv_fp8", true, X, W, w_scale, Y, y_f32, M, N, K, ks, ws, stream);
}

extern "C" int k_gemv_fp8_parts(const bf16 *X, const uint8_t *W, const float *w_scale, float *parts, int M,
                                int N, int K, int ks, cudaStream_t stream)
{
    const char *fn = "k_gemv_fp8_parts";
    K_REQUIRE(!k_f16(), "%s: fp8 weights are bf16 only (no fp8 path in fp16 mode)", fn);
    if (M == 0)
        return 1;
    if (gemv_check(fn, X, W, w_scale, true, parts, M, N, K, ks))
        return -1;
    const int cfg = gemv_pick(true, N);
    const cfg_info ci = cfg_shape(cfg, true);
    const int ctas = (N + ci.rows - 1) / ci.rows, nchunks = (K + ci.chunk_k - 1) / ci.chunk_k;
    if (ks == 0)
        ks = gemv_ks_auto(ctas, nchunks, ci);
    if (ks > nchunks)
        ks = nchunks;
    // ks == 1: the one part is Y in fp32; else every CTA stores its part's sums (part_sum, no ticket)
    const void *wt = tiled_find(W, N, K, TILED_FP8);
    int rc;
    if (wt)
        rc = launch_cfg<__nv_bfloat16, true, true>(cfg, ks, NULL, parts, X, wt, w_scale, parts, 1, M, N, K,
                                                   stream);
    else if (M == 1 && cfg == CFG_WIDE_FP8 && diag_on())
        rc = diag_launch(false, X, W, w_scale, parts, 1, N, K, ks, NULL, parts, stream);
    else
        rc = launch_cfg<__nv_bfloat16, true>(cfg, ks, NULL, parts, X, W, w_scale, parts, 1, M, N, K, stream);
    return rc ? -1 : ks;
}

// The fused gate/up + SwiGLU launch in WIDE_FP8's configuration (8 warps, 2 load steps, 4 CTAs an SM);
// TL: W is the tile-order copy.
template <bool TL = false>
static int glu_launch(const bf16 *X, const void *W, const float *w_scale, bf16 *Y, int M, int F, int K,
                      cudaStream_t stream)
{
    K_CHECK(k_launch(gemv_kernel<8, 2, 1, 4, true, 1, true, TL>, (F + 7) / 8, 256, 0, stream, (const void *)X,
                     (const void *)W, w_scale, (void *)Y, 0, M, F, K, 1, (unsigned *)NULL, (float *)NULL));
    return 0;
}

extern "C" int k_gemv_fp8_glu(const bf16 *X, const uint8_t *W, const float *w_scale, bf16 *Y, int M, int F,
                              int K, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_gemv_fp8_glu: fp8 weights are bf16 only (no fp8 path in fp16 mode)");
    if (M == 0)
        return 0;
    if (gemv_check("k_gemv_fp8_glu", X, W, w_scale, true, Y, M, F, K, 1))
        return -1;
    K_REQUIRE(F % 8 == 0, "k_gemv_fp8_glu: F %d not a multiple of 8", F);
    if (const void *wt = tiled_find(W, F, K, TILED_FP8_GLU))
        return glu_launch<true>(X, wt, w_scale, Y, M, F, K, stream);
    if (M == 1 && (F + 15) / 16 >= k_sm_count() && diag_on())
        return diag_launch(true, X, W, w_scale, Y, 0, F, K, 1, NULL, NULL, stream);
    return glu_launch(X, W, w_scale, Y, M, F, K, stream);
}
