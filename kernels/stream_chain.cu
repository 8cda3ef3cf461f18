// A chain of dependent one-row fp8 GEMVs in one persistent kernel whose weight stream never waits on
// a dependency: the first piece of the decode megakernel that docs/CUDA_BACKEND.md ("One sequence
// with fp8 weights") describes, built to measure it before any engine work (docs/KERNELS.md, "The
// stream chain", has the measurements; at 40 layers of Qwen3-14B it runs ~0.99x the speed of the
// GEMV launches it would replace, so the engine does not use it).
//
// Why. At one sequence a token is ~320 dependent kernels; each matrix starts streaming only when its
// input is complete, so the memory idles for a ramp and a tail at every dependency (~4 us a GEMV).
// Here one CTA per SM runs every op of the chain. A copy warp streams the CTA's share of each matrix
// into a ring of shared-memory stages (cp.async.bulk, one copy a round of NW KB), in consumption
// order, as soon as a stage is free: it never looks at dependencies. The consumer warps wait, before
// the first product of an op, until every CTA has finished the op whose output is its input (a counter
// per op in global memory, no grid barrier), load that vector into shared memory, and then eat
// through the stages the copy warp has filled meanwhile.
//
// The weight layout (k_stream_layout_fp8): the matrix is cut into steps of 16 rows x 64 k (1 KB), tile
// (16 rows, all of K) by tile and k-step by k-step; CTA c's share is the contiguous range of steps
// [T c / G, T (c + 1) / G) of op's T = (N / 16) (K / 64) (balanced to one step), cut into NW contiguous
// sub-ranges, one per consumer warp, and stored in the order the warps take them: warp w's j-th step
// at position j NW + w of the CTA's stream (the short last round after). So a CTA's share is one run
// of bytes, a round (the j-th step of every warp: NW KB) is one copy, a stage holds one or two rounds, so
// a warp's step sits at its own place in its stage, and no warp waits on another within an op. A
// step's bytes are in the order the lanes read them: [h][g][t][16 bytes] = W[16 tile + 8 h + g][64 k-step
// + 16 t .. + 16], two conflict-free 512-byte reads. glu matrices (gate/up) hold gate rows 8 tile..
// as h = 0 and the matching up rows as h = 1, so a tile ends in 8 SwiGLU outputs.
//
// The products. X is kept in shared memory as f16 times a power of two chosen from max |x| (which
// the op that wrote X records) so that max |x| 2^e < 2^15: every bf16 value down to 2^-28 of the
// largest is exact in f16, so the products and their fp32 sums equal the bf16 ones times 2^e (the
// flush multiplies by 2^-e), and an e4m3 pair then decodes to f16 in one instruction (cvt) instead of
// kernels/gemv.cu's bit trick. Four m16n8k16 f16 mmas a step (independent accumulators), the step's sum
// times its 128 x 128 block scale added in fp32; column 0 of the mma is X's one row.
//
// The sums. A warp stores a tile it holds whole; the tiles it shares (its first and last) go to shared
// memory, and at the op's end warp k adds the CTA's shared tiles k, k + NW, ... over their warps in warp
// order. A tile cut between CTAs (at most the first and last of a range) is finished like k_gemv's
// split K: each piece writes its fp32 sums, takes a ticket, and the tile's last piece adds the pieces in
// CTA order and stores (deterministic; it leaves the ticket at 0). Then the CTA fences and counts the op
// done. The last CTA to leave zeroes the counters, so the next launch (or a graph replay) starts clean.
//
// Co-residency: every CTA spins on other CTAs' counters, so all must be resident at once: one CTA per
// SM (the ring takes most of shared memory), grid = the SM count, checked against the occupancy.
//
// What a megakernel would add on top, not built here: the ops between the matrices (RMSNorm and the
// residual, q/k norm + RoPE + the KV write, attention), M up to 8 (columns g of the mma), the bf16
// output projection, PDL with the kernels around it. sm_90a only (bulk copies with mbarriers).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/e4m3x2.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"
#include "kernels/tma.cuh"

#define SC_STEP 1024 // bytes of one step (16 rows x 64 k of e4m3)

// An op as the kernel reads it: the caller's description and where its tickets and partial sums are.
struct chain_op_dev {
    struct k_chain_op op;
    unsigned ticket_off; // in the workspace's ticket words
};

struct k_stream_chain {
    int nops, grid, variant, nstages, xmax;
    size_t smem;
    struct chain_op_dev *ops; // device
    int *ranges;              // device: [nops][grid + 1] first steps
    unsigned long long *prof; // device: K_CHAIN_PROFILE's record
    unsigned *ws;             // device: done[nops], ymax[nops], leave counter, tickets, then fp32 partials
    size_t ticket_words;      // tickets of every op
};

// ---- the layout

// The CTA that holds step l of T split G ways (CTA c takes [T c / G, T (c + 1) / G), the plan's ranges);
// the same for a CTA's n steps split among NW warps.
// I: long long for the layout, int in the kernel (T G < 2^31 there: the plan keeps T below 2^21 steps).
template <typename I> __host__ __device__ __forceinline__ int cta_of(I l, I T, int G)
{
    return (int)(((l + 1) * G + T - 1) / T) - 1;
}

// variant v: consumer warps chain_nw[v / 2], stages of 1 + v % 2 rounds (a round: a 1 KB step a warp)
static const int chain_nw[] = {16, 24, 31};
static int chain_stage_kb(int v)
{
    return chain_nw[v / 2] * (1 + v % 2);
}

// Destination step d of the stream holds source step (tile, k-step) as the kernel's CTA and warp order
// asks (see the top of the file); one thread per 16 bytes.
__global__ void stream_layout_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int N, int K,
                                     int glu, int G, int NW)
{
    const int St = K / 64;
    const long long T = (long long)(N / 16) * St;
    const size_t n16 = (size_t)N * K / 16;
    for (size_t d16 = blockIdx.x * (size_t)blockDim.x + threadIdx.x; d16 < n16;
         d16 += (size_t)gridDim.x * blockDim.x) {
        const long long d = (long long)(d16 >> 6);
        const int in = (int)(d16 & 63), h = in >> 5, g = (in >> 2) & 7, t = in & 3;
        const int c = cta_of(d, T, G);
        const long long lo = T * c / G, n = T * (c + 1) / G - lo, L = n / NW, p = d - lo;
        long long j, w;
        if (p < L * NW) {
            j = p / NW, w = p % NW;
        } else { // the short last round: the (p - L NW)-th warp that has L + 1 steps
            long long r = p - L * NW;
            j = L;
            for (w = 0; w < NW; w++)
                if (n * (w + 1) / NW - n * w / NW == L + 1 && r-- == 0)
                    break;
        }
        const long long step = lo + n * w / NW + j, tile = step / St, ks = step - tile * St;
        const long long row = glu ? (h == 0 ? 8 * tile + g : N / 2 + 8 * tile + g) : 16 * tile + 8 * h + g;
        dst[d16] = src[((size_t)row * K + (size_t)ks * 64 + t * 16) / 16];
    }
}

extern "C" int k_stream_layout_fp8(const uint8_t *W, uint8_t *Wt, int N, int K, int glu, int variant,
                                   cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_stream_layout_fp8: the stream chain is bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(W && Wt, "k_stream_layout_fp8: NULL pointer (W %p Wt %p)", (const void *)W, (void *)Wt);
    K_REQUIRE(N > 0 && N % 16 == 0 && K > 0 && K % 64 == 0,
              "k_stream_layout_fp8: N %d must be a positive multiple of 16 and K %d of 64", N, K);
    K_REQUIRE(variant >= 0 && variant < K_CHAIN_VARIANTS, "k_stream_layout_fp8: variant %d not in 0..%d",
              variant, K_CHAIN_VARIANTS - 1);
    int dev, sms;
    K_CHECK(cudaGetDevice(&dev));
    K_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    stream_layout_kernel<<<2048, 256, 0, stream>>>((const uint4 *)W, (uint4 *)Wt, N, K, glu != 0, sms,
                                                   chain_nw[variant / 2]);
    K_CHECK_LAUNCH();
    return 0;
}

// ---- the kernel

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// the consumer warps' barrier (the producer warp never joins it)
template <int NW> __device__ __forceinline__ void consumers_sync()
{
    asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");
}

// Block (NW + 1) * 32: warps 0..NW-1 consume, warp NW produces; a stage is RPS rounds of NW steps (a
// round: the j-th step of every warp, NW KB, one copy), so a warp's step always sits at its own place in
// its stage and the step loop does no stream arithmetic. ranges[i][c]: the first step of CTA c in op i
// ([nops][G + 1]).
// Dynamic shared memory: the ring (nst stages), X of the running op in the decode's pair order (xmax bf16),
// the warps' tile sums (two buffers, alternating), the stages' full and empty barriers. flags: K_CHAIN_*
// (measurements), read only by the MEASURE build (k_stream_chain_run takes it for any flag, so the
// kernel without flags has no flag tests in its step loop: 4 % faster, docs/PERFORMANCE.md 2026-12-03
// third); prof: K_CHAIN_PROFILE's timestamps.
template <int NW, int RPS, bool MEASURE>
__global__ void __launch_bounds__((NW + 1) * 32, 1)
    stream_chain_kernel(const chain_op_dev *__restrict__ ops, const int *__restrict__ ranges, int nops,
                        unsigned *__restrict__ ws, int nst, int xmax, size_t ticket_words, int flags_in,
                        unsigned long long *__restrict__ prof)
{
#ifdef K_WGMMA
    const int flags = MEASURE ? flags_in : 0;
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *ring = sm;
    constexpr int SB = RPS * NW * SC_STEP; // bytes of a stage
    uint4 *xp = (uint4 *)(sm + (size_t)nst * SB);
    float *red = (float *)((unsigned char *)xp + (size_t)xmax * 2);
    uint64_t *bars = (uint64_t *)(red + 2 * NW * 16);
    const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * nst;
    const int G = gridDim.x, c = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // K_CHAIN_L2: the copy warp prefetches the stages into L2 and the consumers load them from there
    // (the ring's barriers then only keep the prefetch at most nst stages ahead of the slowest warp)
    const bool l2 = flags & K_CHAIN_L2;
    // per op: CTAs done, max |y| (float bits; |y| orders as its bits), then the leave counter
    unsigned *done = ws, *ymax = ws + nops, *leave = ws + 2 * nops, *tickets = ws + 2 * nops + 1;
    float *partials = (float *)(ws + 2 * nops + 1 + ticket_words); // [nops][G][2][16]

    if (threadIdx.x == 0)
        for (int i = 0; i < nst; i++) {
            mbar_init(full0 + 8 * i, 1);
            mbar_init(empty0 + 8 * i, NW * 32); // every consumer lane arrives
        }
    __syncthreads();

    if (warp == NW) { // the producer: the CTA's ranges of every op, back to back, a round (NW steps) a copy
        if (lane != 0)
            return;
        int slot = 0, sub = 0; // the stage being filled and its rounds so far
        uint32_t wraps = 0;    // how many times the ring has wrapped
        long long waited = 0;
        for (int i = 0; i < nops; i++) {
            const uint8_t *w = ops[i].op.w;
            const int lo = ranges[i * (G + 1) + c], hi = ranges[i * (G + 1) + c + 1];
            for (int off = lo; off < hi; off += NW) {
                if (sub == 0 && wraps > 0) { // the slot's previous fill must be released
                    const long long t0 = (flags & K_CHAIN_PROFILE) ? clock64() : 0;
                    mbar_wait(empty0 + 8 * slot, (wraps - 1) & 1);
                    if (flags & K_CHAIN_PROFILE)
                        waited += clock64() - t0;
                }
                const uint32_t bytes = (uint32_t)min(NW, hi - off) * SC_STEP;
                if (flags & K_CHAIN_NO_COPY) {
                    // nothing brought in: the stage is marked filled below, the consumers read what is there
                } else if (l2) {
                    bulk_prefetch_l2(w + (size_t)off * SC_STEP, bytes);
                } else {
                    mbar_expect_tx(full0 + 8 * slot, bytes);
                    bulk_load(ring0 + (uint32_t)(slot * SB + sub * NW * SC_STEP), w + (size_t)off * SC_STEP,
                              bytes, full0 + 8 * slot);
                }
                if (++sub == RPS) {
                    if (!l2)
                        mbar_arrive(full0 + 8 * slot);
                    sub = 0;
                    if (++slot == nst)
                        slot = 0, wraps++;
                }
            }
        }
        if (sub > 0 && !l2)
            mbar_arrive(full0 + 8 * slot);
        if (flags & K_CHAIN_PROFILE)
            prof[(size_t)c * (4 * nops + 2) + 4 * nops] = (unsigned long long)waited;
        return;
    }

    // the consumers
    const int g = lane >> 2, t = lane & 3;
    // the stream as the copy warp fills it: the stage of the current round, the round's place in it, the
    // parity of the stage's fill
    int cslot = 0, csub = 0;
    uint32_t cphase = 0;
    unsigned long long *pr = prof + (size_t)c * (4 * nops + 2);
    const bool profile = (flags & K_CHAIN_PROFILE) && threadIdx.x == 0;
    long long data_wait = 0;
    auto stamp = [&](int i, int k) {
        if (profile) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            pr[4 * i + k] = t;
        }
    };
    float xscale = 1.f, xinv = 1.f; // X's power-of-two scale for f16 and its inverse
    for (int i = 0; i < nops; i++) {
        const k_chain_op op = ops[i].op;
        const int K = op.k, St = K / 64, kblocks = (K + 127) / 128, F = op.n / 2;
        const int T = op.n / 16 * St;                 // below 2^21 (the plan)
        const int *rg = ranges + (size_t)i * (G + 1); // the CTAs' first steps in this op
        const int lo = rg[c], hi = rg[c + 1], n = hi - lo, L = n / NW;
        stamp(i, 0);
        // the input: wait for the op that writes it, then X in the decode's pair order
        if (op.dep >= 0 && !(flags & K_CHAIN_NO_WAIT) && threadIdx.x == 0)
            while (ld_acquire(done + op.dep) < (unsigned)G)
                ;
        stamp(i, 1);
        consumers_sync<NW>(); // also: every warp is done with the previous op's X and partial sums
        // X into shared memory as f16 times 2^e, e chosen so that max |x| 2^e < 2^15: every bf16 value
        // from max |x| 2^-28 up is exact in f16 (11 significant bits), so the products and their fp32 sums
        // are the bf16 ones times 2^e exactly (only terms below that, 2^-28 of the largest, lose bits);
        // the flush multiplies by 2^-e. One e4m3 pair then decodes to f16 in one instruction.
        {
            float mx = 0.f;
            auto scale_for = [&](float m) { // xscale = 2^(15 - E) for m = f 2^E, f in [0.5, 1)
                int ex = 0;
                if (m > 0.f && m <= 3.4e38f)
                    frexpf(m, &ex);
                xscale = ldexpf(1.f, 15 - ex), xinv = ldexpf(1.f, ex - 15);
            };
            auto to_f16 = [&](const uint4 &v) {
                const bf16 *e = (const bf16 *)&v;
                uint32_t h[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const __half2 p = __floats2half2_rn(__bfloat162float(e[2 * k]) * xscale,
                                                        __bfloat162float(e[2 * k + 1]) * xscale);
                    h[k] = *(const uint32_t *)&p;
                }
                return make_uint4(h[0], h[1], h[2], h[3]);
            };
            if (op.dep >= 0) { // the op that wrote X kept its max: one pass
                scale_for(__uint_as_float(__ldcg(ymax + op.dep)));
                for (int u = threadIdx.x; u < K / 8; u += NW * 32)
                    xp[u] = to_f16(__ldcg((const uint4 *)(op.x + 8 * u)));
            } else { // an external X: its max first
                for (int u = threadIdx.x; u < K / 8; u += NW * 32) {
                    const uint4 v = __ldcg((const uint4 *)(op.x + 8 * u));
                    const bf16 *e = (const bf16 *)&v;
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        mx = fmaxf(mx, fabsf(__bfloat162float(e[k])));
                    xp[u] = v;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (lane == 0)
                    red[warp] = mx;
                consumers_sync<NW>();
                mx = 0.f;
                for (int w = 0; w < NW; w++)
                    mx = fmaxf(mx, red[w]);
                scale_for(mx);
                for (int u = threadIdx.x; u < K / 8; u += NW * 32) // the same elements this thread stored
                    xp[u] = to_f16(xp[u]);
            }
        }
        consumers_sync<NW>();
        stamp(i, 2);
        // this warp's steps: [wlo, whi) of the CTA's range, its j-th at stream position j NW + warp
        // (the last, short round: L NW + its rank among the warps that have L + 1 steps)
        const int wlo = lo + n * warp / NW, whi = lo + n * (warp + 1) / NW;
        const int rank = (wlo - lo) - warp * L;
        const int tf = wlo / St, tl = whi > wlo ? (whi - 1) / St : tf; // the warp's first and last tiles
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int tile = tf, ks = wlo - tf * St;
        const float *srow0 = NULL, *srow1 = NULL;
        auto scale_rows = [&]() { // GLU: gate rows 8 tile.., up rows F + 8 tile..; else rows 16 tile..
            srow0 = op.w_scale + (size_t)(op.glu ? tile / 16 : tile / 8) * kblocks;
            srow1 = op.glu ? op.w_scale + (size_t)((F + 8 * tile) / 128) * kblocks : srow0;
        };
        scale_rows();
        // the largest |y| a warp stored, into the op's ymax (the next op's X scale)
        auto note_max = [&](float m) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (lane == 0)
                atomicMax(ymax + i, __float_as_uint(m));
        };
        // a tile's sums: column 0 of the mma is on lanes t == 0 (row g in acc[0], row g + 8 in acc[2])
        auto flush = [&]() {
            acc[0] *= xinv, acc[2] *= xinv; // exact: a power of two
            if (tile == tf || tile == tl) { // shared with other warps or CTAs: into shared memory
                if (t == 0)
                    red[(warp * 2 + (tile == tf ? 0 : 1)) * 16 + g] = acc[0],
                                                                 red[(warp * 2 + (tile == tf ? 0 : 1)) * 16 +
                                                                     g + 8] = acc[2];
            } else { // a whole tile of this warp
                float m = 0.f;
                if (t == 0) {
                    if (op.glu) {
                        const bf16 v =
                            __float2bfloat16(silu_mul1(__bfloat162float(__float2bfloat16(acc[0])),
                                                       __bfloat162float(__float2bfloat16(acc[2]))));
                        op.y[8 * tile + g] = v;
                        m = fabsf(__bfloat162float(v));
                    } else {
                        const bf16 v0 = __float2bfloat16(acc[0]), v1 = __float2bfloat16(acc[2]);
                        op.y[16 * tile + g] = v0, op.y[16 * tile + g + 8] = v1;
                        m = fmaxf(fabsf(__bfloat162float(v0)), fabsf(__bfloat162float(v1)));
                    }
                }
                note_max(m);
            }
        };
        // the op's rounds: L full ones, then a short one if n % NW (with a step of the warps that have L + 1)
        const int nr = (n + NW - 1) / NW;
        for (int j = 0; j < nr; j++) {
            const bool mine = j < L || whi - wlo > L; // this warp has a step in round j
            const int at = j < L ? warp : rank;       // its place in the round
            if (csub == 0 && !l2) {                   // a new stage
                if (profile) {
                    const long long t0 = clock64();
                    mbar_wait(full0 + 8 * cslot, cphase);
                    data_wait += clock64() - t0;
                } else
                    mbar_wait(full0 + 8 * cslot, cphase);
            }
            if (mine && !(flags & K_CHAIN_NO_MATH)) {
                uint4 w0, w1;
                if (l2) { // from L2, where the copy warp's prefetch has brought it
                    const uint8_t *gw = op.w + ((size_t)lo + j * NW + at) * SC_STEP + lane * 16;
                    w0 = ld_stream(gw), w1 = ld_stream(gw + 512);
                } else {
                    const unsigned char *st = ring + cslot * SB + (csub * NW + at) * SC_STEP;
                    w0 = *(const uint4 *)(st + lane * 16), w1 = *(const uint4 *)(st + 512 + lane * 16);
                }
                const uint4 x0 = xp[ks * 8 + 2 * t], x1 = xp[ks * 8 + 2 * t + 1]; // k 64 ks + 16 t ..
                const bool scaled = !(flags & K_CHAIN_NO_SCALE);
                const float sc0 = scaled ? __ldg(srow0 + ks / 2) : 1.f,
                            sc1 = !scaled  ? 1.f
                                  : op.glu ? __ldg(srow1 + ks / 2)
                                           : sc0; // one block unless GLU
                const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
                const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                // four independent mmas (a dependent chain of four is ~4 mma latencies a step, which 24 warps
                // do not hide), added in a fixed order
                float dd[4][4] = {};
                if (flags & K_CHAIN_LOADS_ONLY) // the shared-memory reads without the products (measurement)
                    dd[0][0] = __uint_as_float((w0.x ^ w1.y ^ x0.z ^ x1.w) & 0x007fffffu);
                else
#pragma unroll
                    for (int e = 0; e < 4; e++) { // bytes 4e, 4e + 1 and 4e + 2, 4e + 3 of rows g and g + 8
                        const uint32_t a[4] = {e4m3x2_to_f16x2(q0[e]), e4m3x2_to_f16x2(q1[e]),
                                               e4m3x2_to_f16x2(q0[e] >> 16), e4m3x2_to_f16x2(q1[e] >> 16)};
                        mma_f16(dd[e], a, xw[2 * e], xw[2 * e + 1]);
                    }
                float d[4];
#pragma unroll
                for (int r = 0; r < 4; r++)
                    d[r] = (dd[0][r] + dd[1][r]) + (dd[2][r] + dd[3][r]);
                acc[0] = fmaf(d[0], sc0, acc[0]), acc[1] = fmaf(d[1], sc0, acc[1]);
                acc[2] = fmaf(d[2], sc1, acc[2]), acc[3] = fmaf(d[3], sc1, acc[3]);
            }
            if (mine && ++ks == St && j + 1 < whi - wlo) { // the next step starts a new tile
                flush();
                acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
                tile++, ks = 0;
                scale_rows();
            }
            if (++csub == RPS) { // the stage's last round: every lane gives the stage back
                mbar_arrive(empty0 + 8 * cslot);
                csub = 0;
                if (++cslot == nst)
                    cslot = 0, cphase ^= 1;
            }
        }
        if (whi > wlo)
            flush();
        consumers_sync<NW>();
        // the CTA's tiles that several warps or CTAs share: warp k adds tiles t0 + k, t0 + k + NW, ... over
        // the warps that hold a piece (in warp order) and stores, or (cut between CTAs) hands its sum on
        const int t0 = lo / St, t1 = hi > lo ? (hi - 1) / St : t0 - 1;
        for (int tt = t0 + warp; tt <= t1; tt += NW) {
            const int a = max(lo, tt * St), b = min(hi, (tt + 1) * St);
            const int wa = cta_of(a - lo, n, NW), wb = cta_of(b - 1 - lo, n, NW);
            float sum = 0.f;
            bool shared = false;
            for (int w = wa; w <= wb; w++) {
                const int w_lo = lo + n * w / NW, w_hi = lo + n * (w + 1) / NW;
                if (w_lo == w_hi)
                    continue;
                const int w_tf = w_lo / St, w_tl = (w_hi - 1) / St;
                if (tt != w_tf && tt != w_tl)
                    continue; // a whole tile of warp w, stored by it
                shared = true;
                if (lane < 16)
                    sum += red[(w * 2 + (tt == w_tf ? 0 : 1)) * 16 + lane];
            }
            if (!shared)
                continue;
            const int tlo = tt * St, thi = tlo + St;
            float v = sum;
            if (a != tlo ||
                b != thi) { // cut between CTAs: the tile's last piece adds the pieces in CTA order
                float *pbase = partials + (size_t)i * G * 32;
                if (lane < 16)
                    pbase[((size_t)c * 2 + (tt == t0 ? 0 : 1)) * 16 + lane] = sum;
                __threadfence();
                __syncwarp();
                const int c0 = cta_of(tlo, T, G), c1 = cta_of(thi - 1, T, G);
                int pieces = 0;
                for (int cc = c0; cc <= c1; cc++)
                    pieces += rg[cc] < rg[cc + 1];
                unsigned last = 0;
                if (lane == 0)
                    last = atomicAdd(tickets + ops[i].ticket_off + tt, 1u) == (unsigned)pieces - 1;
                if (!__shfl_sync(0xffffffffu, last, 0))
                    continue;
                __threadfence();
                v = 0.f;
                for (int cc = c0; cc <= c1; cc++) {
                    const int clo = rg[cc];
                    if (clo == rg[cc + 1])
                        continue;
                    if (lane < 16)
                        v += __ldcg(pbase + ((size_t)cc * 2 + (tt == clo / St ? 0 : 1)) * 16 + lane);
                }
                if (lane == 0)
                    tickets[ops[i].ticket_off + tt] = 0;
            }
            const float up = __shfl_down_sync(0xffffffffu, v, 8); // GLU: row lane + 8 is the up row
            float m = 0.f;
            if (op.glu) {
                if (lane < 8) {
                    const bf16 o = __float2bfloat16(silu_mul1(__bfloat162float(__float2bfloat16(v)),
                                                              __bfloat162float(__float2bfloat16(up))));
                    op.y[8 * tt + lane] = o;
                    m = fabsf(__bfloat162float(o));
                }
            } else if (lane < 16) {
                const bf16 o = __float2bfloat16(v);
                op.y[16 * tt + lane] = o;
                m = fabsf(__bfloat162float(o));
            }
            note_max(m);
        }
        consumers_sync<NW>();
        if (threadIdx.x == 0) { // the op is done here once every warp's stores are
            __threadfence();
            atomicAdd(done + i, 1u);
        }
        stamp(i, 3);
    }
    // a stage left part-filled at the end of the stream is given back too
    if (csub > 0)
        mbar_arrive(empty0 + 8 * cslot);
    if (profile)
        pr[4 * nops + 1] = (unsigned long long)data_wait;
    // the last CTA out leaves the counters at zero for the next launch
    consumers_sync<NW>();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(leave, 1u) == (unsigned)G - 1) {
            for (int i = 0; i < nops; i++)
                done[i] = 0, ymax[i] = 0;
            *leave = 0;
            __threadfence();
        }
    }
#endif
}

// ---- the plan and the launch

template <int NW, bool M> static void *chain_kernel_nw(int s)
{
    return s == 0 ? (void *)stream_chain_kernel<NW, 1, M> : (void *)stream_chain_kernel<NW, 2, M>;
}
template <bool M> static void *chain_kernel_m(int v)
{
    return v / 2 == 0   ? chain_kernel_nw<16, M>(v % 2)
           : v / 2 == 1 ? chain_kernel_nw<24, M>(v % 2)
                        : chain_kernel_nw<31, M>(v % 2);
}
// variant v's kernel; measure: its build that reads the flags
static void *chain_kernel(int v, bool measure)
{
    return measure ? chain_kernel_m<true>(v) : chain_kernel_m<false>(v);
}

extern "C" int k_stream_chain_plan(const struct k_chain_op *ops, int nops, int variant,
                                   struct k_stream_chain **out)
{
    *out = NULL;
    K_REQUIRE(!k_f16(), "k_stream_chain_plan: the stream chain is bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(k_wgmma_on(), "k_stream_chain_plan: needs an sm_90a device and a build for it (bulk copies)");
    K_REQUIRE(ops && nops > 0, "k_stream_chain_plan: no ops");
    K_REQUIRE(variant >= 0 && variant < K_CHAIN_VARIANTS, "k_stream_chain_plan: variant %d not in 0..%d",
              variant, K_CHAIN_VARIANTS - 1);
    int xmax = 0;
    size_t tickets = 0;
    for (int i = 0; i < nops; i++) {
        const k_chain_op *o = ops + i;
        K_REQUIRE(o->w && o->w_scale && o->x && o->y, "k_stream_chain_plan: op %d has a NULL pointer", i);
        K_REQUIRE(o->n > 0 && o->n % 16 == 0 && o->k > 0 && o->k % 64 == 0,
                  "k_stream_chain_plan: op %d: N %d must be a positive multiple of 16 and K %d of 64", i,
                  o->n, o->k);
        K_REQUIRE(o->dep >= -1 && o->dep < i,
                  "k_stream_chain_plan: op %d depends on op %d, not an earlier one", i, o->dep);
        K_REQUIRE((long long)(o->n / 16) * (o->k / 64) * 1024 < (1ll << 31),
                  "k_stream_chain_plan: op %d (N %d, K %d) is too large", i, o->n, o->k);
        xmax = o->k > xmax ? o->k : xmax;
        tickets += (size_t)o->n / 16;
    }
    int dev, sms, smem_max;
    K_CHECK(cudaGetDevice(&dev));
    K_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    K_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int nw = chain_nw[variant / 2], stage_kb = chain_stage_kb(variant);
    const size_t fixed = (size_t)xmax * 2 + 2 * nw * 16 * 4;
    const size_t stage = (size_t)stage_kb * SC_STEP;
    const long long room = (long long)smem_max - (long long)fixed;
    int nst = room > 0 ? (int)(room / (long long)(stage + 16)) : 0;
    const int cap = k_env_int("LLMQ_CHAIN_STAGES", 0, 1, 1 << 30); // measurement: fewer stages than fit
    if (cap > 0 && cap < nst)
        nst = cap;
    K_REQUIRE(nst >= 3,
              "k_stream_chain_plan: %d KB stages and K up to %d leave %d stages (3 needed) in %d bytes",
              stage_kb, xmax, nst, smem_max);
    const size_t smem = (size_t)nst * stage + fixed + 16 * (size_t)nst;
    for (int m = 0; m < 2; m++) { // the kernel and its MEASURE build
        void *kern = chain_kernel(variant, m);
        K_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int per_sm = 0;
        K_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, (nw + 1) * 32, smem));
        K_REQUIRE(per_sm >= 1, "k_stream_chain_plan: a CTA (%d threads, %zu bytes) does not fit an SM",
                  (nw + 1) * 32, smem);
    }
    k_stream_chain *p = (k_stream_chain *)calloc(1, sizeof *p);
    K_REQUIRE(p, "k_stream_chain_plan: out of host memory");
    p->nops = nops, p->grid = sms, p->variant = variant, p->nstages = nst;
    p->xmax = xmax, p->smem = smem, p->ticket_words = tickets;
    chain_op_dev *h = (chain_op_dev *)calloc((size_t)nops, sizeof *h);
    const size_t ws_bytes = ((size_t)2 * nops + 1 + tickets) * 4 + (size_t)nops * sms * 32 * 4;
    cudaError_t e = h ? cudaMalloc(&p->ops, (size_t)nops * sizeof *h) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess)
        e = cudaMalloc(&p->ws, ws_bytes);
    if (e == cudaSuccess) {
        size_t off = 0;
        for (int i = 0; i < nops; i++)
            h[i].op = ops[i], h[i].ticket_off = (unsigned)off, off += (size_t)ops[i].n / 16;
        e = cudaMemcpy(p->ops, h, (size_t)nops * sizeof *h, cudaMemcpyHostToDevice);
    }
    int *rg = (int *)malloc((size_t)nops * (sms + 1) * sizeof(int));
    if (e == cudaSuccess)
        e = rg ? cudaMalloc(&p->ranges, (size_t)nops * (sms + 1) * sizeof(int)) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) {
        for (int i = 0; i < nops; i++) {
            const long long T = (long long)(ops[i].n / 16) * (ops[i].k / 64);
            for (int c = 0; c <= sms; c++)
                rg[(size_t)i * (sms + 1) + c] = (int)(T * c / sms);
        }
        e = cudaMemcpy(p->ranges, rg, (size_t)nops * (sms + 1) * sizeof(int), cudaMemcpyHostToDevice);
    }
    free(rg);
    if (e == cudaSuccess)
        e = cudaMalloc(&p->prof, (size_t)sms * (4 * nops + 2) * sizeof(unsigned long long));
    if (e == cudaSuccess)
        e = cudaMemset(p->ws, 0, ws_bytes);
    free(h);
    if (e != cudaSuccess) {
        k_stream_chain_free(p);
        return k_fail(__FILE__, __LINE__, "k_stream_chain_plan: device buffers", e);
    }
    *out = p;
    return 0;
}

extern "C" int k_stream_chain_run(const struct k_stream_chain *p, int flags, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_stream_chain_run: the stream chain is bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(p, "k_stream_chain_run: no plan");
    const int nw = chain_nw[p->variant / 2];
    const struct chain_op_dev *ops = p->ops;
    const int *ranges = p->ranges;
    int nops = p->nops, nst = p->nstages, xmax = p->xmax;
    unsigned *ws = p->ws;
    size_t tw = p->ticket_words;
    unsigned long long *prof = p->prof;
    void *args[] = {(void *)&ops,  (void *)&ranges, (void *)&nops,  (void *)&ws,  (void *)&nst,
                    (void *)&xmax, (void *)&tw,     (void *)&flags, (void *)&prof};
    K_CHECK(cudaLaunchKernel(chain_kernel(p->variant, flags != 0), dim3(p->grid), dim3((nw + 1) * 32), args,
                             p->smem, stream));
    return 0;
}

extern "C" const char *k_stream_chain_describe(const struct k_stream_chain *p, char *buf, size_t n)
{
    snprintf(buf, n,
             "%d CTAs x (%d consumer warps + 1 copy warp), %d stages of %d KB, %zu bytes of shared memory",
             p->grid, chain_nw[p->variant / 2], p->nstages, chain_stage_kb(p->variant), p->smem);
    return buf;
}

extern "C" int k_stream_chain_profile(const struct k_stream_chain *p, unsigned long long *out)
{
    K_CHECK(
        cudaMemcpy(out, p->prof, (size_t)p->grid * (4 * p->nops + 2) * sizeof *out, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int k_stream_chain_grid(const struct k_stream_chain *p)
{
    return p->grid;
}

extern "C" void k_stream_chain_free(struct k_stream_chain *p)
{
    if (!p)
        return;
    cudaFree(p->ranges);
    cudaFree(p->prof);
    cudaFree(p->ops);
    cudaFree(p->ws);
    free(p);
}
