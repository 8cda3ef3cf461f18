// The mixture-of-experts MLP's routing and its permutation (kernels/moe.h): k_moe_route (top-k of the
// router logits with the softmax and the optional renormalization, one warp a token), k_moe_permute
// (a stable counting sort of the (token, slot) pairs by expert, one CTA), k_moe_route_permute (both in one
// CTA, for decode-sized steps) and k_moe_combine (the weighted sum of each token's expert outputs in token
// order).
//
// Everything these kernels read was written by an earlier kernel of the step (the router GEMM's logits,
// the routing's ids and weights, the permutation, the experts' outputs) or, in the fused kernel, by the
// CTA itself before a barrier (the ids), so all of it is read after the PDL wait with ld_dep
// (kernels/launch.cuh), none of it on the non-coherent path.
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/moe.h"

// ---- routing: one warp a token

constexpr int ROUTE_WARPS = 4;            // tokens per CTA
constexpr int ROUTE_J = K_MOE_MAX_E / 32; // logits a lane holds (expert e = 32 j + lane)

// The larger of (v, i) and (ov, oi): the larger value, on equal values the lower index.
__device__ __forceinline__ void arg_max(float &v, int &i, float ov, int oi)
{
    if (ov > v || (ov == v && oi < i))
        v = ov, i = oi;
}

// Token t's routing by one warp (every lane calls it): ids[t * k + s] and w[t * k + s] for s < k.
__device__ __forceinline__ void route_token(const float *logits, int t, int E, int k, int norm, int32_t *ids,
                                            float *w)
{
    const int lane = threadIdx.x & 31;
    const float *row = logits + (size_t)t * E;
    float v[ROUTE_J];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < ROUTE_J; j++) {
        const int e = 32 * j + lane;
        float x = -INFINITY;
        if (e < E) {
            x = ld_dep(row + e);
            if (isnan(x))
                x = -INFINITY;
        }
        v[j] = x;
        mx = fmaxf(mx, x);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m = mx == -INFINITY ? 0.f : mx; // no finite logit: every probability is 0 / 0
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < ROUTE_J; j++)
        if (32 * j + lane < E)
            sum += expf(v[j] - m);
#pragma unroll
    for (int o = 16; o; o >>= 1) // butterfly: every lane ends with the same sum, in the same order
        sum += __shfl_xor_sync(0xffffffffu, sum, o);

    // k rounds of a warp arg-max over the logits not taken yet; lane s keeps slot s
    uint32_t taken = 0;
    int my_id = 0;
    float my_p = 0.f;
    for (int s = 0; s < k; s++) {
        float bv = -INFINITY;
        int bi = E; // beyond every expert: any logit, -inf included, beats it
#pragma unroll
        for (int j = 0; j < ROUTE_J; j++) {
            const int e = 32 * j + lane;
            if (e < E && !(taken >> j & 1))
                arg_max(bv, bi, v[j], e);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
            arg_max(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        if (lane == s)
            my_id = bi, my_p = expf(bv - m) / sum;
    }
    if (norm) {
        float tot = lane < k ? my_p : 0.f;
#pragma unroll
        for (int o = 16; o; o >>= 1)
            tot += __shfl_xor_sync(0xffffffffu, tot, o);
        my_p /= tot;
    }
    if (lane < k) {
        ids[(size_t)t * k + lane] = my_id;
        w[(size_t)t * k + lane] = my_p;
    }
}

__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_kernel(const float *__restrict__ logits, int T, int E, int k, int norm,
                     int32_t *__restrict__ ids, float *__restrict__ w)
{
    pdl_enter(); // kernels/launch.cuh
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t < T)
        route_token(logits, t, E, k, norm, ids, w);
}

static int moe_bf16_only(const char *fn)
{
    K_REQUIRE(!k_f16(), "%s: the mixture-of-experts kernels are bf16 only (no fp16 mode)", fn);
    return 0;
}

static int moe_sizes(const char *fn, int T, int k, int E)
{
    if (moe_bf16_only(fn))
        return -1;
    K_REQUIRE(T >= 0 && E >= 1 && E <= K_MOE_MAX_E && k >= 1 && k <= K_MOE_MAX_K && k <= E,
              "%s: bad sizes T %d, E %d (1..%d), k %d (1..%d, <= E)", fn, T, E, K_MOE_MAX_E, k, K_MOE_MAX_K);
    K_REQUIRE((long)T * k <= (1l << 30), "%s: T %d x k %d pairs too many", fn, T, k);
    return 0;
}

extern "C" int k_moe_route(const float *logits, int T, int E, int k, int norm, int32_t *ids, float *w,
                           cudaStream_t stream)
{
    if (moe_sizes("k_moe_route", T, k, E))
        return -1;
    if (T == 0)
        return 0;
    K_REQUIRE(logits && ids && w, "k_moe_route: NULL pointer (logits %p ids %p w %p)", (const void *)logits,
              (void *)ids, (void *)w);
    K_CHECK(k_launch(moe_route_kernel, (T + ROUTE_WARPS - 1) / ROUTE_WARPS, ROUTE_WARPS * 32, 0, stream,
                     logits, T, E, k, norm, ids, w));
    return 0;
}

// ---- permutation: a stable counting sort in one CTA
//
// PERM_WARPS warps; warp w owns the contiguous pairs [w c, (w + 1) c) (c = ceil(P / PERM_WARPS)). Pass 1
// counts each warp's pairs per expert into cnt[w][e] (shared memory; only warp w writes row w: the lanes
// holding one expert find each other with __match_any_sync and the lowest adds their number). Then thread
// e turns column e into each warp's first row within expert e, and block scans give expert_off and the
// active list. Pass 2 walks the pairs again in the same order: a pair's row is its warp's next row of its
// expert plus its rank among the lanes of the same expert. So within an expert the rows are in pair
// order, whatever the timing.

constexpr int PERM_WARPS = 32;
constexpr int PERM_THREADS = PERM_WARPS * 32;
constexpr int PERM_U = 4; // pairs a lane loads at once (loads in flight)

// Exclusive scan of x over the CTA (PERM_THREADS threads); *total = the sum. part: PERM_WARPS ints of
// shared memory, not in use by another scan at the same time.
__device__ __forceinline__ int block_scan(int x, int *part, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += y;
    }
    if (lane == 31)
        part[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int p = part[lane], q = p; // PERM_WARPS == 32
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, q, o);
            if (lane >= o)
                q += y;
        }
        part[lane] = q - p; // exclusive
        if (lane == 31)
            part[PERM_WARPS] = q;
    }
    __syncthreads();
    *total = part[PERM_WARPS];
    return part[warp] + inc - x;
}

// The PERM_U pairs p0 + 32 u + lane of the warp's range [p0, hi): their experts, -1 past the range or
// for an id outside [0, E).
__device__ __forceinline__ void perm_load(const int32_t *ids, int p0, int hi, int E, int (&ev)[PERM_U])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < PERM_U; u++) {
        const int p = p0 + 32 * u + lane;
        const int e = p < hi ? ld_dep(ids + p) : -1;
        ev[u] = e >= 0 && e < E ? e : -1;
    }
}

// The sort by the whole CTA (PERM_THREADS threads, PERM_WARPS * E ints of dynamic shared memory), after
// the PDL wait; ids is read with ld_dep (an earlier kernel's, or this CTA's before a barrier).
__device__ __forceinline__ void permute_body(const int32_t *ids, int P, int k, int E, int32_t *expert_off,
                                             int32_t *active, int32_t *perm_tok, int32_t *pair_pos)
{
    extern __shared__ int cnt[]; // [PERM_WARPS][E]
    __shared__ int part0[PERM_WARPS + 1], part1[PERM_WARPS + 1];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < PERM_WARPS * E; i += PERM_THREADS)
        cnt[i] = 0;
    __syncthreads();
    const int chunk = (P + PERM_WARPS - 1) / PERM_WARPS;
    const int lo = min(P, warp * chunk), hi = min(P, lo + chunk);
    int *mine = cnt + warp * E;
    for (int p0 = lo; p0 < hi; p0 += 32 * PERM_U) {
        int ev[PERM_U];
        perm_load(ids, p0, hi, E, ev);
#pragma unroll
        for (int u = 0; u < PERM_U; u++) {
            const unsigned peers = __match_any_sync(0xffffffffu, ev[u]);
            if (ev[u] >= 0 && lane == __ffs(peers) - 1)
                mine[ev[u]] += __popc(peers);
            __syncwarp();
        }
    }
    __syncthreads();
    // expert e = tid: its rows, and each warp's first row within it (relative, then absolute)
    int n_e = 0;
    if (tid < E)
        for (int w = 0; w < PERM_WARPS; w++) {
            const int c = cnt[w * E + tid];
            cnt[w * E + tid] = n_e;
            n_e += c;
        }
    int n_rows, n_active;
    const int off = block_scan(n_e, part0, &n_rows);
    const int slot = block_scan(n_e > 0, part1, &n_active);
    if (tid < E) {
        expert_off[tid] = off;
        for (int w = 0; w < PERM_WARPS; w++)
            cnt[w * E + tid] += off;
        if (n_e > 0)
            active[slot] = tid;
        if (tid >= n_active)
            active[tid] = -1;
    }
    if (tid == 0)
        expert_off[E] = n_rows;
    __syncthreads();
    const unsigned below = (1u << lane) - 1;
    for (int p0 = lo; p0 < hi; p0 += 32 * PERM_U) {
        int ev[PERM_U];
        perm_load(ids, p0, hi, E, ev);
#pragma unroll
        for (int u = 0; u < PERM_U; u++) {
            const int p = p0 + 32 * u + lane;
            const unsigned peers = __match_any_sync(0xffffffffu, ev[u]);
            if (ev[u] >= 0) {
                const int row = mine[ev[u]] + __popc(peers & below);
                perm_tok[row] = p / k;
                pair_pos[p] = row;
            } else if (p < hi) {
                pair_pos[p] = -1;
            }
            __syncwarp();
            if (ev[u] >= 0 && lane == __ffs(peers) - 1)
                mine[ev[u]] += __popc(peers);
            __syncwarp();
        }
    }
}

__global__ void __launch_bounds__(PERM_THREADS)
    moe_permute_kernel(const int32_t *__restrict__ ids, int P, int k, int E, int32_t *__restrict__ expert_off,
                       int32_t *__restrict__ active, int32_t *__restrict__ perm_tok,
                       int32_t *__restrict__ pair_pos)
{
    pdl_enter(); // kernels/launch.cuh
    permute_body(ids, P, k, E, expert_off, active, perm_tok, pair_pos);
}

// k_moe_route_permute: warp w routes tokens w, w + PERM_WARPS, ..., then the CTA sorts the pairs.
__global__ void __launch_bounds__(PERM_THREADS)
    moe_route_permute_kernel(const float *__restrict__ logits, int T, int E, int k, int norm, int32_t *ids,
                             float *__restrict__ w, int32_t *__restrict__ expert_off,
                             int32_t *__restrict__ active, int32_t *__restrict__ perm_tok,
                             int32_t *__restrict__ pair_pos)
{
    pdl_enter(); // kernels/launch.cuh
    for (int t = threadIdx.x >> 5; t < T; t += PERM_WARPS)
        route_token(logits, t, E, k, norm, ids, w);
    __syncthreads(); // the block's global writes (ids) are visible to all its threads
    permute_body(ids, T * k, k, E, expert_off, active, perm_tok, pair_pos);
}

static int perm_check(const char *fn, const struct k_moe_perm *perm)
{
    K_REQUIRE(perm && perm->expert_off && perm->active && perm->perm_tok && perm->pair_pos,
              "%s: NULL permutation array", fn);
    return 0;
}

extern "C" int k_moe_check(const char *fn, int T, int k, const struct k_moe_perm *perm,
                           const struct k_moe_weights *w, int mult, int fp8_128, const bf16 *X, const bf16 *Y)
{
    K_REQUIRE(w, "%s: NULL weights", fn);
    if (moe_sizes(fn, T, k, w->E) || perm_check(fn, perm))
        return -1;
    const int m = w->fp8 && fp8_128 ? 128 : mult;
    K_REQUIRE(w->H >= m && w->H % m == 0 && w->I >= m && w->I % m == 0,
              "%s: H %d and I %d must be positive multiples of %d (%s weights)", fn, w->H, w->I, m,
              w->fp8 ? "fp8" : "bf16");
    K_REQUIRE(w->gate_up && w->down && (!w->fp8 || (w->gate_up_scale && w->down_scale)),
              "%s: NULL weight or scale (gate_up %p down %p, fp8 %d: scales %p %p)", fn, w->gate_up, w->down,
              w->fp8, (const void *)w->gate_up_scale, (const void *)w->down_scale);
    K_REQUIRE((uintptr_t)w->gate_up % 16 == 0 && (uintptr_t)w->down % 16 == 0,
              "%s: weights must be 16-byte aligned", fn);
    K_REQUIRE(T == 0 || (X && Y && (uintptr_t)X % 16 == 0), "%s: NULL or unaligned X %p / Y %p", fn,
              (const void *)X, (const void *)Y);
    return 0;
}

// The dynamic shared memory of the sorting kernels for E experts, opted in above 48 KiB (E > 384; a host
// call, per device).
template <typename K> static int perm_smem(K kern, int E, size_t *smem)
{
    *smem = (size_t)PERM_WARPS * E * sizeof(int);
    if (*smem > 48 * 1024)
        K_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)(PERM_WARPS * K_MOE_MAX_E * sizeof(int))));
    return 0;
}

extern "C" int k_moe_permute(const int32_t *ids, int T, int k, int E, const struct k_moe_perm *perm,
                             cudaStream_t stream)
{
    const char *fn = "k_moe_permute";
    if (moe_sizes(fn, T, k, E) || perm_check(fn, perm))
        return -1;
    if (T == 0)
        return 0;
    K_REQUIRE(ids, "%s: NULL ids", fn);
    size_t smem;
    if (perm_smem(moe_permute_kernel, E, &smem))
        return -1;
    K_CHECK(k_launch(moe_permute_kernel, 1, PERM_THREADS, smem, stream, ids, T * k, k, E, perm->expert_off,
                     perm->active, perm->perm_tok, perm->pair_pos));
    return 0;
}

extern "C" int k_moe_route_permute(const float *logits, int T, int E, int k, int norm, int32_t *ids, float *w,
                                   const struct k_moe_perm *perm, cudaStream_t stream)
{
    const char *fn = "k_moe_route_permute";
    if (moe_sizes(fn, T, k, E) || perm_check(fn, perm))
        return -1;
    if (T == 0)
        return 0;
    K_REQUIRE(logits && ids && w, "%s: NULL pointer (logits %p ids %p w %p)", fn, (const void *)logits,
              (void *)ids, (void *)w);
    size_t smem;
    if (perm_smem(moe_route_permute_kernel, E, &smem))
        return -1;
    K_CHECK(k_launch(moe_route_permute_kernel, 1, PERM_THREADS, smem, stream, logits, T, E, k, norm, ids, w,
                     perm->expert_off, perm->active, perm->perm_tok, perm->pair_pos));
    return 0;
}

// ---- combine: 16 bytes (8 bf16) a thread

constexpr int ROW_THREADS = 128;

__global__ void __launch_bounds__(ROW_THREADS)
    moe_combine_kernel(const bf16 *__restrict__ Yp, const int32_t *__restrict__ pair_pos,
                       const float *__restrict__ w, int k, int H, bf16 *__restrict__ out)
{
    __shared__ int pos[K_MOE_MAX_K];
    __shared__ float ws[K_MOE_MAX_K];
    pdl_enter();
    const int t = blockIdx.x;
    if (threadIdx.x < k) {
        pos[threadIdx.x] = ld_dep(pair_pos + (size_t)t * k + threadIdx.x);
        ws[threadIdx.x] = ld_dep(w + (size_t)t * k + threadIdx.x);
    }
    __syncthreads();
    for (int u = threadIdx.x; u < H / 8; u += ROW_THREADS) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < k; s++) {
            if (pos[s] < 0)
                continue;
            const uint4 y = ld_dep((const uint4 *)(Yp + (size_t)pos[s] * H) + u);
            const __nv_bfloat162 *y2 = (const __nv_bfloat162 *)&y;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = __bfloat1622float2(y2[j]);
                acc[2 * j] = fmaf(ws[s], f.x, acc[2 * j]);
                acc[2 * j + 1] = fmaf(ws[s], f.y, acc[2 * j + 1]);
            }
        }
        uint4 o;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int j = 0; j < 4; j++)
            o2[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
        ((uint4 *)(out + (size_t)t * H))[u] = o;
    }
}

static int row_check(const char *fn, const void *a, const void *b, int H)
{
    K_REQUIRE(a && b, "%s: NULL pointer", fn);
    K_REQUIRE(H >= 8 && H % 8 == 0, "%s: H %d not a positive multiple of 8", fn, H);
    K_REQUIRE((uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0, "%s: rows must be 16-byte aligned", fn);
    return 0;
}

extern "C" int k_moe_combine(const bf16 *Yp, const struct k_moe_perm *perm, const float *w, int T, int k,
                             int H, bf16 *out, cudaStream_t stream)
{
    const char *fn = "k_moe_combine";
    if (moe_sizes(fn, T, k, k) || perm_check(fn, perm))
        return -1;
    if (T == 0)
        return 0;
    if (row_check(fn, Yp, out, H))
        return -1;
    K_REQUIRE(w, "%s: NULL weights", fn);
    K_CHECK(k_launch(moe_combine_kernel, T, ROW_THREADS, 0, stream, Yp, (const int32_t *)perm->pair_pos, w, k,
                     H, out));
    return 0;
}
