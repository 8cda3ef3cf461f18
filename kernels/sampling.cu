// The GPU sampler: the same function as engine/sampler.c (the oracle), one row of raw fp32 logits
// per sequence. docs/KERNELS.md ("Sampling") describes the algorithm and its exactness.
//
// Two kernels:
//   stats_kernel   one pass over the raw logits, a row split into P slices of one CTA each (P > 1 for
//                  few rows: one CTA alone took ~75 us over 152K logits, 1.6 % of a single-sequence
//                  decode step): NaN/+inf check, max and argmax (ties to the lowest id), the
//                  slice's max and sum of exp for the log-sum-exp (when logprobs are asked for) and its
//                  top N raw logits (N <= 20, a sorted list per thread in registers, merged by warps).
//   sample_kernel  one CTA per row. It first merges the row's P slices (warp 0: the reductions and a
//                  P-way merge of the sorted top lists, written to top_ids/top_lp), then: penalties
//                  (a bitset of touched ids in shared memory, their flags and output counts
//                  in the row's workspace), then greedy (argmax) or: p = (float)exp((double)(l - lmax)
//                  / T) exactly as the oracle computes it, stored as its bits (the key: for p > 0 the
//                  bits order like p) in the row's workspace; top_k, top_p, min_p and the pick are each
//                  "the first element, in order of descending p and then ascending id, where the
//                  running count or mass reaches a target". A search finds it by radix selection over
//                  the key (12, 11 and 8 bit digits, histograms of counts and masses in shared memory);
//                  as soon as the elements up to and including the target's bin number at most
//                  S_CAP they are gathered into shared memory, sorted (bitonic) and finished there
//                  (every later step then runs in shared memory too). A tie group larger than S_CAP
//                  (equal p) is resolved by id with one ordered pass.
// Masses are summed in 2^-44 fixed point (64-bit integers): exact, so the result does not depend on
// the order of summation or on the block size, and the same logits give the same token on every run.
#include <atomic>
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/launch.cuh"

#define SA_THREADS 256                      // stats_kernel
#define SB_THREADS 512                      // sample_kernel
#define S_TOP 20                            // SAMPLING_MAX_LOGPROBS
#define S_CAP 4096                          // most elements sorted in shared memory
#define S_MAX_V (1 << 20)                   // fixed-point masses: V * 2^44 < 2^64
#define S_GREEDY_EPS 1e-5f                  // SAMP_GREEDY_EPS of engine/sampler.h
#define S_REGION (S_CAP * 8 * 2)            // histograms, or the sorted keys and their running masses
#define S_FX_SCALE 17592186044416.0f        // 2^44
#define S_SMEM_MAX (S_REGION + S_MAX_V / 8) // dynamic shared memory at V = S_MAX_V: 192 KiB

// A touched id's word in the row's workspace (before it holds the row's keys).
#define W_BAN 0x80000000u
#define W_HIST 0x40000000u
#define W_CNT 0x3fffffffu

#define ST_BAD 1 // a NaN or +inf logit
#define ST_ANY 2 // some logit > -inf

struct samp_stats { // per row, merged from its slices by sample_kernel
    float lmax;     // largest raw logit
    int argmax;     // its lowest id, -1 when every logit is -inf
    int flags;      // ST_*
    int pad;
    double lse; // log-sum-exp of the raw logits (when logprobs >= 0)
    double pad2;
};

struct samp_part {       // per slice of a row, from stats_kernel
    uint64_t top[S_TOP]; // the slice's largest keys (vkey), descending; 0 past its count
    uint64_t am;         // its largest key
    float gm, sc;        // its largest finite logit and sum of exp(x - gm) (when logprobs >= 0)
    int flags;           // ST_*
    int pad;
};

#define S_PART_SLOTS 128  // slices of all rows together when a row has more than one
#define S_PART_MIN_V 4096 // logits a slice covers at least
#define S_PART_MAX 32     // slices of one row: one warp merges them

// Slices per row for n rows of V logits: one for many rows, up to 32 while rows x slices fit 128.
static int stats_parts(int n, int V)
{
    int p = n > 0 ? S_PART_SLOTS / n : 1;
    p = p < S_PART_MAX ? p : S_PART_MAX;
    p = p < V / S_PART_MIN_V ? p : V / S_PART_MIN_V;
    return p > 1 ? p : 1;
}

// Top-N entries a row wants (logprobs capped by S_TOP and V).
__device__ __forceinline__ int want_top(const struct k_sample_params &p, int V)
{
    int ntop = p.logprobs < S_TOP ? p.logprobs : S_TOP;
    ntop = ntop < V ? ntop : V;
    return ntop > 0 ? ntop : 0;
}

// ---- helpers

// Floats to unsigned integers with the same order (-0 counts as +0, as a float comparison does).
__device__ __forceinline__ uint32_t f2o(float x)
{
    uint32_t b = __float_as_uint(x == 0.f ? 0.f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float o2f(uint32_t u)
{
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
// (value descending, id ascending) as one descending 64-bit key; 0 is below every real key.
__device__ __forceinline__ uint64_t vkey(float x, int id)
{
    return ((uint64_t)f2o(x) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}
__device__ __forceinline__ int vkey_id(uint64_t k)
{
    return (int)(0xffffffffu - (uint32_t)k);
}
__device__ __forceinline__ float vkey_val(uint64_t k)
{
    return o2f((uint32_t)(k >> 32));
}

// sampling_uniform of engine/sampler.c, bit for bit.
__device__ __forceinline__ uint64_t s_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ double s_uniform(uint64_t seed, uint64_t step)
{
    uint64_t x = s_mix64(s_mix64(seed) ^ step);
    return (double)(x >> 11) * 0x1.0p-53; // exact: a 53-bit integer times a power of two
}

// A probability's mass in 2^-44 units (p <= 1, so at most 2^44).
__device__ __forceinline__ uint64_t fx(uint32_t key)
{
    return __float2ull_rn(__fmul_rn(__uint_as_float(key), S_FX_SCALE));
}

__device__ __forceinline__ uint64_t u64max(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

// Block-wide reduction; every thread gets the result. scratch: 32 entries of T in shared memory.
template <typename T, typename Op> __device__ __forceinline__ T block_reduce(T v, Op op, T *scratch)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); // scratch may still be read by a previous reduction
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = scratch[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++)
        r = op(r, scratch[w]);
    return r;
}

// Block-wide exclusive prefix sum of (c, m) in thread order.
__device__ __forceinline__ void block_excl_scan(uint32_t &c, uint64_t &m, uint32_t *sc, uint64_t *sm)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t ic = c;
    uint64_t im = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t tc = __shfl_up_sync(0xffffffffu, ic, o);
        uint64_t tm = __shfl_up_sync(0xffffffffu, im, o);
        if (lane >= o)
            ic += tc, im += tm;
    }
    __syncthreads();
    if (lane == 31)
        sc[warp] = ic, sm[warp] = im;
    __syncthreads();
    uint32_t pc = 0;
    uint64_t pm = 0;
    for (int w = 0; w < warp; w++)
        pc += sc[w], pm += sm[w];
    c = pc + ic - c;
    m = pm + im - m;
}

// Four logits of group q (ids 4q .. 4q+3); past V (scalar path only) -inf, which callers skip.
template <bool VEC> __device__ __forceinline__ float4 load4(const float *row, int V, int q)
{
    if (VEC)
        return ld_dep((const float4 *)row + q);
    const int i = q << 2;
    float4 v;
    v.x = ld_dep(row + i);
    v.y = i + 1 < V ? ld_dep(row + i + 1) : -INFINITY;
    v.z = i + 2 < V ? ld_dep(row + i + 2) : -INFINITY;
    v.w = i + 3 < V ? ld_dep(row + i + 3) : -INFINITY;
    return v;
}

// Calls f(x, id) for every logit of the groups of four [q0, n4); each thread sees its ids in ascending
// order.
template <bool VEC, typename F>
__device__ __forceinline__ void for_range(const float *row, int V, int q0, int n4, F &&f)
{
    const int bd = blockDim.x;
    for (int q = q0 + threadIdx.x; q < n4; q += 2 * bd) {
        const int q2 = q + bd;
        float4 a = load4<VEC>(row, V, q), b = make_float4(0.f, 0.f, 0.f, 0.f);
        if (q2 < n4)
            b = load4<VEC>(row, V, q2);
        const int i = q << 2, j = q2 << 2;
        f(a.x, i), f(a.y, i + 1), f(a.z, i + 2), f(a.w, i + 3);
        if (q2 < n4)
            f(b.x, j), f(b.y, j + 1), f(b.z, j + 2), f(b.w, j + 3);
    }
}

// Calls f(x, id) for every logit of the row; each thread sees its ids in ascending order.
template <bool VEC, typename F> __device__ __forceinline__ void for_logits(const float *row, int V, F &&f)
{
    for_range<VEC>(row, V, 0, (V + 3) >> 2, static_cast<F &&>(f));
}

// Calls f(key, id) for every key of the row (Vp keys, a multiple of 4; padding keys are 0).
template <typename F> __device__ __forceinline__ void for_keys(const uint32_t *pw, int Vp, F &&f)
{
    const uint4 *p4 = (const uint4 *)pw;
    const int n4 = Vp >> 2, bd = blockDim.x;
    for (int q = threadIdx.x; q < n4; q += 2 * bd) {
        const int q2 = q + bd;
        uint4 a = __ldcg(p4 + q), b = make_uint4(0, 0, 0, 0);
        if (q2 < n4)
            b = __ldcg(p4 + q2);
        const int i = q << 2, j = q2 << 2;
        f(a.x, i), f(a.y, i + 1), f(a.z, i + 2), f(a.w, i + 3);
        if (q2 < n4)
            f(b.x, j), f(b.y, j + 1), f(b.z, j + 2), f(b.w, j + 3);
    }
}

// ---- stats_kernel: grid (P, n), block (SA_THREADS); CTA (p, r) covers slice p of row r

// Largest of each lane's head, removed from the lane that holds it; lane 0's list grows by one.
__device__ __forceinline__ uint64_t top_pop(uint64_t (&tk)[S_TOP])
{
    uint64_t h = tk[0], best = h;
#pragma unroll
    for (int o = 16; o; o >>= 1)
        best = u64max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (h == best && best != 0) { // ids are distinct: one lane
#pragma unroll
        for (int q = 0; q < S_TOP - 1; q++)
            tk[q] = tk[q + 1];
        tk[S_TOP - 1] = 0;
    }
    return best;
}

template <bool VEC>
__global__ void __launch_bounds__(SA_THREADS)
    stats_kernel(const float *logits, int V, const struct k_sample_params *params, struct samp_part *parts)
{
    pdl_enter(); // kernels/launch.cuh
    __shared__ uint64_t red64[32];
    __shared__ float redf[32];
    __shared__ uint64_t wtop[SA_THREADS / 32][S_TOP];

    const int r = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *row = logits + (size_t)r * V;
    const int ntop = want_top(params[r], V);
    const bool lse_on = params[r].logprobs >= 0;
    // slice: groups of four [q0, q1), the same share for every slice but the last
    const int n4 = (V + 3) >> 2, per = (n4 + gridDim.x - 1) / gridDim.x;
    const int q0 = min(n4, (int)blockIdx.x * per), q1 = min(n4, q0 + per);
    struct samp_part *out = parts + (size_t)r * gridDim.x + blockIdx.x;

    uint64_t tk[S_TOP];
#pragma unroll
    for (int q = 0; q < S_TOP; q++)
        tk[q] = 0;
    uint64_t am = 0;
    float m = -INFINITY, s = 0.f;
    int bad = 0, any = 0;
    for_range<VEC>(row, V, q0, q1, [&](float x, int i) {
        if (i >= V)
            return;
        bad |= (x != x) | (x == INFINITY);
        const uint64_t k = vkey(x, i);
        am = u64max(am, k);
        if (x != -INFINITY) {
            any = 1;
            if (lse_on) { // online: s = sum exp(x - m)
                if (x > m)
                    s = s * expf(m - x) + 1.f, m = x;
                else
                    s += expf(x - m);
            }
        }
        if (ntop > 0 && k > tk[S_TOP - 1]) {
            tk[S_TOP - 1] = k;
#pragma unroll
            for (int q = S_TOP - 1; q > 0; q--)
                if (tk[q] > tk[q - 1]) {
                    uint64_t t = tk[q];
                    tk[q] = tk[q - 1];
                    tk[q - 1] = t;
                }
        }
    });
    bad = __syncthreads_or(bad);
    any = __syncthreads_or(any);
    am = block_reduce(
        am, [](uint64_t a, uint64_t b) { return u64max(a, b); }, red64);
    float gm = -INFINITY, sc = 0.f;
    if (lse_on) {
        gm = block_reduce(
            m, [](float a, float b) { return fmaxf(a, b); }, redf);
        sc = (m == -INFINITY) ? 0.f : s * expf(m - gm);
        sc = block_reduce(
            sc, [](float a, float b) { return a + b; }, redf);
    }
    // top N: each warp merges its lanes' lists, then warp 0 merges the warps' lists
    for (int j = 0; j < ntop; j++) {
        uint64_t b = top_pop(tk);
        if (lane == 0)
            wtop[warp][j] = b;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int q = 0; q < S_TOP; q++)
            tk[q] = (lane < (int)(blockDim.x >> 5) && q < ntop) ? wtop[lane][q] : 0;
        for (int j = 0; j < S_TOP; j++) { // every entry, so that the merge may read 0 past the count
            uint64_t b = j < ntop ? top_pop(tk) : 0;
            if (lane == 0)
                out->top[j] = b;
        }
        if (lane == 0) {
            out->am = am, out->gm = gm, out->sc = sc;
            out->flags = (bad ? ST_BAD : 0) | (any ? ST_ANY : 0);
            out->pad = 0;
        }
    }
}

// The row's slices merged into its stats (returned to every thread) and its top-N list written to
// top_ids/top_lp. Warp 0 reduces the slices and merges their sorted lists P ways, one pop per entry,
// from shared memory (sh: S_PART_MAX * S_TOP keys).
__device__ struct samp_stats stats_merge(const struct samp_part *pp, int P, int r, int ntop, bool lse_on,
                                         int32_t *top_ids, float *top_lp, uint64_t *sh,
                                         struct samp_stats *s_out)
{
    const int nl = ntop < S_TOP ? ntop + 1 : S_TOP; // entries a list can be read up to
    for (int i = threadIdx.x; ntop > 0 && i < P * nl; i += blockDim.x)
        sh[(i / nl) * S_TOP + i % nl] = __ldcg(&pp[i / nl].top[i % nl]);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        uint64_t am = 0;
        float gm = -INFINITY, sc = 0.f;
        int flags = 0;
        if (lane < P) {
            am = __ldcg(&pp[lane].am), gm = __ldcg(&pp[lane].gm), sc = __ldcg(&pp[lane].sc);
            flags = __ldcg(&pp[lane].flags);
        }
        float GM = gm;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            am = u64max(am, __shfl_xor_sync(0xffffffffu, am, o));
            flags |= __shfl_xor_sync(0xffffffffu, flags, o);
            GM = fmaxf(GM, __shfl_xor_sync(0xffffffffu, GM, o));
        }
        double S = gm == -INFINITY ? 0.0 : (double)sc * exp((double)gm - (double)GM);
#pragma unroll
        for (int o = 16; o; o >>= 1)
            S += __shfl_xor_sync(0xffffffffu, S, o);
        const double lse = lse_on ? (double)GM + log(S) : 0.0;
        int h = 0;
        uint64_t key = lane < P && ntop > 0 ? sh[lane * S_TOP] : 0;
        for (int j = 0; j < ntop; j++) {
            uint64_t best = key;
#pragma unroll
            for (int o = 16; o; o >>= 1)
                best = u64max(best, __shfl_xor_sync(0xffffffffu, best, o));
            if (key == best && best != 0) // ids are distinct: one lane
                key = ++h < S_TOP ? sh[lane * S_TOP + h] : 0;
            if (lane == 0 && top_ids) {
                top_ids[(size_t)r * S_TOP + j] = vkey_id(best);
                top_lp[(size_t)r * S_TOP + j] = (float)__dsub_rn((double)vkey_val(best), lse);
            }
        }
        if (top_ids && lane >= ntop && lane < S_TOP)
            top_ids[(size_t)r * S_TOP + lane] = -1, top_lp[(size_t)r * S_TOP + lane] = -INFINITY;
        if (lane == 0) {
            const float lmax = vkey_val(am);
            s_out->lmax = lmax;
            s_out->argmax = lmax == -INFINITY ? -1 : vkey_id(am);
            s_out->flags = flags;
            s_out->pad = 0;
            s_out->lse = lse;
            s_out->pad2 = 0;
        }
    }
    __syncthreads();
    return *s_out;
}

// ---- sample_kernel: grid (n), block (SB_THREADS), dynamic shared memory S_REGION + the bitset

enum { OP_COUNT, OP_GE, OP_GT }; // running count >= c; running mass >= m; running mass > m

struct target {
    int op;
    uint32_t count;
    double mass; // in 2^-44 units
};

__device__ __forceinline__ bool reached(const target &t, uint32_t c, uint64_t m)
{
    return t.op == OP_COUNT ? c >= t.count
           : t.op == OP_GE  ? __ull2double_rn(m) >= t.mass
                            : __ull2double_rn(m) > t.mass;
}

// The kept set is a prefix of the order (p descending, id ascending), given by its last element:
// key > cut_key, or key == cut_key and id <= cut_id. Initially (0, -1): every key > 0.
struct sstate {
    uint32_t cut_key;
    int cut_id;
    uint32_t count_kept; // elements kept
    uint64_t m_kept;     // their mass
    uint32_t max_key;    // the largest key of the row
    int smem_mode;       // the kept set's first sorted_n elements are sorted in shared memory
    int hist_valid;      // the level-0 histogram in shared memory is the kept set's
    uint32_t sorted_n;
    // scratch of one search
    int found, idx;
    uint32_t bin, c_above, c_bin, gcount, jsel;
    uint64_t m_above;
    int res_id;
    // reductions
    uint64_t r64[32];
    uint32_t r32[32];
    float rf[32];
};

struct sctx {
    const float *row;
    uint32_t *pw; // the row's workspace: touched ids' words, then the keys [Vp]
    int V, Vp;
    uint64_t *hmass; // [4096] | keys [S_CAP]
    uint32_t *hcnt;  // [4096]
    uint64_t *keys;  // [S_CAP] (key << 32 | ~id), sorted descending
    uint64_t *cum;   // [S_CAP] running mass, inclusive
};

__device__ __forceinline__ bool kept(uint32_t key, int id, uint32_t ck, int cid)
{
    return key > ck || (key == ck && id <= cid);
}

// Level-L histogram of the kept keys whose bits above the digit equal prefix's.
__device__ void build_hist(const sctx &c, sstate &S, int sh, int nb, uint32_t prefix)
{
    const int nbins = 1 << nb, hs = sh + nb;
    for (int b = threadIdx.x; b < nbins; b += blockDim.x)
        c.hmass[b] = 0, c.hcnt[b] = 0;
    __syncthreads();
    const uint32_t ck = S.cut_key, hp = hs >= 32 ? 0u : prefix >> hs;
    const int cid = S.cut_id;
    for_keys(c.pw, c.Vp, [&](uint32_t k, int i) {
        if (k && kept(k, i, ck, cid) && (hs >= 32 ? 0u : k >> hs) == hp) {
            const uint32_t b = (k >> sh) & (uint32_t)(nbins - 1);
            atomicAdd(&c.hcnt[b], 1u);
            atomicAdd((unsigned long long *)&c.hmass[b], (unsigned long long)fx(k));
        }
    });
    __syncthreads();
}

// The bin, from the top, where the target is reached, given the count and mass above all bins.
// Sets S.found, S.bin, S.c_above, S.m_above (above the bin), S.c_bin.
__device__ bool find_bin(const sctx &c, sstate &S, int nbins, const target &t, uint32_t c_off, uint64_t m_off)
{
    if (threadIdx.x == 0)
        S.found = 0;
    const int bpt = (nbins + blockDim.x - 1) / blockDim.x;
    const int hi = nbins - (int)threadIdx.x * bpt, lo = hi - bpt > 0 ? hi - bpt : 0;
    uint32_t cc = 0;
    uint64_t mm = 0;
    for (int b = lo; b < hi; b++)
        cc += c.hcnt[b], mm += c.hmass[b];
    uint32_t ca = cc;
    uint64_t ma = mm;
    block_excl_scan(ca, ma, S.r32, S.r64); // thread order is descending bins
    ca += c_off, ma += m_off;
    if (hi > lo && !reached(t, ca, ma) && reached(t, ca + cc, ma + mm)) {
        for (int b = hi - 1; b >= lo; b--) {
            const uint32_t bc = c.hcnt[b];
            const uint64_t bm = c.hmass[b];
            if (reached(t, ca + bc, ma + bm)) {
                S.found = 1, S.bin = (uint32_t)b, S.c_above = ca, S.m_above = ma, S.c_bin = bc;
                break;
            }
            ca += bc, ma += bm;
        }
    }
    __syncthreads();
    return S.found;
}

// Gathers the kept keys in [lo, hi] into c.keys (the caller knows there are at most S_CAP).
__device__ void gather(const sctx &c, sstate &S, uint32_t lo, uint32_t hi)
{
    if (threadIdx.x == 0)
        S.gcount = 0;
    __syncthreads();
    const uint32_t ck = S.cut_key;
    const int cid = S.cut_id;
    for_keys(c.pw, c.Vp, [&](uint32_t k, int i) {
        if (k >= lo && k <= hi && k && kept(k, i, ck, cid)) {
            uint32_t slot = atomicAdd(&S.gcount, 1u);
            if (slot < S_CAP)
                c.keys[slot] = ((uint64_t)k << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
        }
    });
    __syncthreads();
}

// Sorts c.keys[0, n) descending (bitonic) and writes the running masses into c.cum.
__device__ void sort_and_cum(const sctx &c, sstate &S, uint32_t n)
{
    uint32_t P = 1;
    while (P < n)
        P <<= 1;
    for (uint32_t i = n + threadIdx.x; i < P; i += blockDim.x)
        c.keys[i] = 0;
    __syncthreads();
    for (uint32_t k = 2; k <= P; k <<= 1)
        for (uint32_t j = k >> 1; j > 0; j >>= 1) {
            for (uint32_t i = threadIdx.x; i < P; i += blockDim.x) {
                const uint32_t ixj = i ^ j;
                if (ixj > i) {
                    const uint64_t a = c.keys[i], b = c.keys[ixj];
                    if ((i & k) == 0 ? a < b : a > b)
                        c.keys[i] = b, c.keys[ixj] = a;
                }
            }
            __syncthreads();
        }
    const uint32_t per = (n + blockDim.x - 1) / blockDim.x;
    const uint32_t lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
    uint64_t sum = 0;
    for (uint32_t i = lo; i < hi; i++)
        sum += fx((uint32_t)(c.keys[i] >> 32));
    uint32_t dummy = 0;
    uint64_t base = sum;
    block_excl_scan(dummy, base, S.r32, S.r64);
    for (uint32_t i = lo; i < hi; i++) {
        base += fx((uint32_t)(c.keys[i] >> 32));
        c.cum[i] = base;
    }
    if (threadIdx.x == 0)
        S.sorted_n = n;
    __syncthreads();
}

// Finds the target among the n sorted elements, which follow c_off elements of mass m_off. On
// success the kept set ends there. Returns whether the target was reached.
__device__ bool resolve_sorted(const sctx &c, sstate &S, const target &t, uint32_t c_off, uint64_t m_off,
                               uint32_t n)
{
    if (threadIdx.x == 0) {
        int idx = -1;
        if (t.op == OP_COUNT) {
            if (t.count > c_off && t.count - c_off <= n)
                idx = (int)(t.count - c_off - 1);
        } else {
            uint32_t lo = 0, hi = n;
            while (lo < hi) {
                const uint32_t mid = (lo + hi) >> 1;
                if (reached(t, 0, m_off + c.cum[mid]))
                    hi = mid;
                else
                    lo = mid + 1;
            }
            idx = lo < n ? (int)lo : -1;
        }
        if (idx >= 0) {
            const uint64_t k = c.keys[idx];
            S.cut_key = (uint32_t)(k >> 32);
            S.cut_id = vkey_id(k);
            S.count_kept = c_off + (uint32_t)idx + 1;
            S.m_kept = m_off + c.cum[idx];
        }
        S.idx = idx;
    }
    __syncthreads();
    return S.idx >= 0;
}

// The j-th (1-based) lowest id among the kept elements with key K: one pass in id order, each
// thread over a contiguous range of ids. Sets S.res_id.
__device__ void ordered_select(const sctx &c, sstate &S, uint32_t K, uint32_t j)
{
    const uint32_t ck = S.cut_key;
    const int cid = S.cut_id;
    const int per = (c.V + blockDim.x - 1) / blockDim.x;
    const int lo = threadIdx.x * per, hi = lo + per < c.V ? lo + per : c.V;
    uint32_t cnt = 0;
    for (int i = lo; i < hi; i++)
        cnt += __ldcg(c.pw + i) == K && kept(K, i, ck, cid);
    uint32_t ex = cnt;
    uint64_t dummy = 0;
    block_excl_scan(ex, dummy, S.r32, S.r64);
    if (ex < j && j <= ex + cnt) {
        uint32_t need = j - ex;
        for (int i = lo; i < hi; i++)
            if (__ldcg(c.pw + i) == K && kept(K, i, ck, cid) && --need == 0) {
                S.res_id = i;
                break;
            }
    }
    __syncthreads();
}

// Gathers and sorts the whole kept set (count_kept <= S_CAP).
__device__ void gather_all(const sctx &c, sstate &S)
{
    const uint32_t n = S.count_kept;
    gather(c, S, 1u, 0xffffffffu);
    sort_and_cum(c, S, n);
    if (threadIdx.x == 0)
        S.smem_mode = 1, S.hist_valid = 0;
    __syncthreads();
}

// Radix search over the keys in the row's workspace. Returns whether the target was reached; then
// the kept set ends at the target's element (and may now be in shared memory).
__device__ bool search_global(const sctx &c, sstate &S, const target &t)
{
    uint32_t prefix = 0, c_off = 0;
    uint64_t m_off = 0;
    for (int lev = 0; lev < 3; lev++) {
        const int sh = lev == 0 ? 19 : lev == 1 ? 8 : 0, nb = lev == 0 ? 12 : lev == 1 ? 11 : 8;
        const bool cached = lev == 0 && S.hist_valid;
        __syncthreads();
        if (threadIdx.x == 0)
            S.hist_valid = 0; // the histogram region is about to be reused
        if (!cached)
            build_hist(c, S, sh, nb, prefix);
        if (!find_bin(c, S, 1 << nb, t, c_off, m_off))
            return false; // only at level 0: the deeper bins sum to the one found above
        const uint32_t klo = prefix | (S.bin << sh), cb = S.c_bin;
        c_off = S.c_above, m_off = S.m_above;
        __syncthreads();
        if (c_off + cb <= S_CAP) { // everything down to this bin fits: finish in shared memory
            gather(c, S, klo, 0xffffffffu);
            sort_and_cum(c, S, c_off + cb);
            if (threadIdx.x == 0)
                S.smem_mode = 1;
            __syncthreads();
            return resolve_sorted(c, S, t, 0, 0, c_off + cb);
        }
        if (cb <= S_CAP) { // the bin fits
            gather(c, S, klo, klo + ((1u << sh) - 1));
            sort_and_cum(c, S, cb);
            return resolve_sorted(c, S, t, c_off, m_off, cb);
        }
        prefix = klo;
    }
    // more than S_CAP elements share the key `prefix` (equal p): how many of them, then which ids
    const uint32_t K = prefix, cb = S.c_bin;
    const uint64_t f = fx(K);
    if (threadIdx.x == 0) {
        uint32_t j;
        if (t.op == OP_COUNT) {
            j = t.count - c_off;
        } else {
            uint32_t lo = 1, hi = cb;
            while (lo < hi) {
                const uint32_t mid = (lo + hi) >> 1;
                if (reached(t, c_off + mid, m_off + (uint64_t)mid * f))
                    hi = mid;
                else
                    lo = mid + 1;
            }
            j = lo;
        }
        S.jsel = j < 1 ? 1 : j > cb ? cb : j;
        S.res_id = -1;
    }
    __syncthreads();
    const uint32_t j = S.jsel;
    ordered_select(c, S, K, j);
    if (threadIdx.x == 0) {
        S.cut_key = K;
        S.cut_id = S.res_id;
        S.count_kept = c_off + j;
        S.m_kept = m_off + (uint64_t)j * f;
    }
    __syncthreads();
    return true;
}

// One step (top_k, top_p or the pick) on the kept set. Returns whether the target was reached.
__device__ bool do_op(const sctx &c, sstate &S, const target &t)
{
    __syncthreads();
    if (S.smem_mode) {
        const uint32_t n = S.sorted_n < S.count_kept ? S.sorted_n : S.count_kept;
        return resolve_sorted(c, S, t, 0, 0, n);
    }
    const bool ok = search_global(c, S, t);
    __syncthreads();
    if (ok && !S.smem_mode && S.count_kept <= S_CAP)
        gather_all(c, S);
    return ok;
}

// min_p: keeps p >= min(min_p * pmax, pmax), a prefix of the kept set.
__device__ void apply_min_p(const sctx &c, sstate &S, float min_p)
{
    __syncthreads();
    const float pmax = __uint_as_float(S.max_key); // the first element is always kept
    const float mp = __fmul_rn(min_p, pmax);
    const uint32_t tb = __float_as_uint(mp < pmax ? mp : pmax);
    if (S.smem_mode) {
        if (threadIdx.x == 0) {
            const uint32_t n = S.sorted_n < S.count_kept ? S.sorted_n : S.count_kept;
            uint32_t lo = 0, hi = n; // first index with key < tb
            while (lo < hi) {
                const uint32_t mid = (lo + hi) >> 1;
                if ((uint32_t)(c.keys[mid] >> 32) < tb)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            if (lo < n && lo > 0) {
                const uint64_t k = c.keys[lo - 1];
                S.cut_key = (uint32_t)(k >> 32), S.cut_id = vkey_id(k);
                S.count_kept = lo, S.m_kept = c.cum[lo - 1];
            }
        }
        __syncthreads();
        return;
    }
    if (tb <= S.cut_key)
        return; // every kept key is >= cut_key >= tb
    const uint32_t ck = S.cut_key;
    const int cid = S.cut_id;
    uint32_t cnt = 0;
    uint64_t mass = 0;
    for_keys(c.pw, c.Vp, [&](uint32_t k, int i) {
        if (k >= tb && kept(k, i, ck, cid))
            cnt++, mass += fx(k);
    });
    cnt = block_reduce(
        cnt, [](uint32_t a, uint32_t b) { return a + b; }, S.r32);
    mass = block_reduce(
        mass, [](uint64_t a, uint64_t b) { return a + b; }, S.r64);
    if (threadIdx.x == 0) {
        S.cut_key = tb, S.cut_id = 0x7fffffff; // key >= tb
        S.count_kept = cnt, S.m_kept = mass, S.hist_valid = 0;
    }
    __syncthreads();
    if (S.count_kept <= S_CAP)
        gather_all(c, S);
}

template <bool VEC>
__global__ void __launch_bounds__(SB_THREADS, 2)
    sample_kernel(const float *logits, int V, int Vp, const struct k_sample_params *params,
                  const int32_t *hist, const int32_t *hist_start, const int32_t *n_prompt,
                  const int32_t *banned, const int32_t *banned_start, const uint32_t *allow,
                  const int32_t *allow_row, const struct samp_part *parts, int n_parts, int32_t *top_ids,
                  float *top_lp, uint32_t *ws_keys, int32_t *token, float *logprob)
{
    pdl_enter(); // kernels/launch.cuh
    extern __shared__ __align__(16) unsigned char dyn[];
    __shared__ sstate S;
    __shared__ struct samp_stats s_st;

    const int r = blockIdx.x, bd = blockDim.x, tid = threadIdx.x;
    const struct k_sample_params P = params[r];
    const struct samp_stats st = stats_merge(parts + (size_t)r * n_parts, n_parts, r, want_top(P, V),
                                             P.logprobs >= 0, top_ids, top_lp, (uint64_t *)dyn, &s_st);
    sctx c;
    c.row = logits + (size_t)r * V;
    c.pw = ws_keys + (size_t)r * Vp;
    c.V = V, c.Vp = Vp;
    c.hmass = (uint64_t *)dyn;
    c.hcnt = (uint32_t *)(dyn + S_CAP * 8);
    c.keys = (uint64_t *)dyn;
    c.cum = (uint64_t *)(dyn + S_CAP * 8);
    uint32_t *bits = (uint32_t *)(dyn + S_REGION);
    uint32_t *pw = c.pw;

    int tok = -1;
    if ((st.flags & ST_BAD) || !(st.flags & ST_ANY))
        goto done;
    {
        // ---- penalties: mark the touched ids, then their words (flags, output count) in pw
        const bool rep_on = P.repetition_penalty > 0.f && P.repetition_penalty != 1.f;
        const bool pf_on = P.presence_penalty != 0.f || P.frequency_penalty != 0.f;
        int h0 = 0, h1 = 0, np = 0, b0 = 0, b1 = 0;
        if (hist_start) {
            h0 = hist_start[r], h1 = hist_start[r + 1];
            np = n_prompt ? n_prompt[r] : 0;
            np = np < 0 ? 0 : np > h1 - h0 ? h1 - h0 : np;
        }
        if (banned_start)
            b0 = banned_start[r], b1 = banned_start[r + 1];
        const int ar = allow_row ? allow_row[r] : -1;
        const uint32_t *am = ar >= 0 ? allow + (size_t)ar * ((V + 31) >> 5) : NULL;
        const bool pen_on = (rep_on && h1 > h0) || (pf_on && h1 - h0 > np) || b1 > b0 || am;
        if (pen_on) {
            const int words = (V + 31) >> 5;
            for (int w = tid; w < words; w += bd)
                bits[w] = 0;
            __syncthreads();
            for (int j = h0 + tid; j < h1; j += bd) {
                const int t = hist[j];
                if (t >= 0 && t < V && (rep_on || j - h0 >= np))
                    atomicExch(&pw[t], 0u), atomicOr(&bits[t >> 5], 1u << (t & 31));
            }
            for (int j = b0 + tid; j < b1; j += bd) {
                const int t = banned[j];
                if (t >= 0 && t < V)
                    atomicExch(&pw[t], 0u), atomicOr(&bits[t >> 5], 1u << (t & 31));
            }
            __syncthreads();
            for (int j = h0 + tid; j < h1; j += bd) {
                const int t = hist[j];
                if (t < 0 || t >= V)
                    continue;
                if (rep_on)
                    atomicOr(&pw[t], W_HIST);
                if (pf_on && j - h0 >= np)
                    atomicAdd(&pw[t], 1u);
            }
            for (int j = b0 + tid; j < b1; j += bd) {
                const int t = banned[j];
                if (t >= 0 && t < V)
                    atomicOr(&pw[t], W_BAN);
            }
            __syncthreads();
        }
        // The penalized logit, with exactly the oracle's float operations (no contraction).
        const float rep = P.repetition_penalty, pres = P.presence_penalty, freq = P.frequency_penalty;
        auto pen = [&](float x, int i) -> float {
            if (am && !((__ldg(am + (i >> 5)) >> (i & 31)) & 1u))
                return -INFINITY; // outside the grammar's mask
            if (!pen_on || !((bits[i >> 5] >> (i & 31)) & 1u))
                return x;
            const uint32_t w = __ldcg(pw + i);
            if (rep_on && (w & W_HIST))
                x = x > 0.f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
            const uint32_t cnt = w & W_CNT;
            if (pf_on && cnt) {
                x = __fsub_rn(x, __fmul_rn(freq, __uint2float_rn(cnt)));
                x = __fsub_rn(x, pres);
            }
            if (w & W_BAN)
                x = -INFINITY;
            return x;
        };

        // ---- greedy: argmax, ties to the lowest id
        if (P.temperature < S_GREEDY_EPS) {
            if (!pen_on) {
                tok = st.argmax;
            } else {
                uint64_t am = 0;
                for_logits<VEC>(c.row, V, [&](float x, int i) {
                    if (i < V)
                        am = u64max(am, vkey(pen(x, i), i));
                });
                am = block_reduce(
                    am, [](uint64_t a, uint64_t b) { return u64max(a, b); }, S.r64);
                tok = vkey_val(am) == -INFINITY ? -1 : vkey_id(am);
            }
            goto done;
        }

        // ---- p = (float)exp((double)(l - lmax) / T) as keys, with the level-0 histogram
        float lmax = st.lmax;
        if (pen_on) {
            float mx = -INFINITY;
            for_logits<VEC>(c.row, V, [&](float x, int i) {
                if (i < V)
                    mx = fmaxf(mx, pen(x, i));
            });
            lmax = block_reduce(
                mx, [](float a, float b) { return fmaxf(a, b); }, S.rf);
        }
        if (lmax == -INFINITY)
            goto done;
        for (int b = tid; b < 4096; b += bd)
            c.hmass[b] = 0, c.hcnt[b] = 0;
        __syncthreads();
        const double inv_t = __ddiv_rn(1.0, (double)P.temperature);
        auto key_of = [&](float x, int i) -> uint32_t {
            if (i >= V)
                return 0;
            const float l = pen(x, i);
            if (l == -INFINITY)
                return 0;
            const float p = __double2float_rn(exp(__dmul_rn((double)__fsub_rn(l, lmax), inv_t)));
            return __float_as_uint(p); // 0 when p underflows: not a candidate, as in the oracle
        };
        uint32_t cnt = 0, maxk = 0;
        uint64_t mass = 0;
        const int n4 = Vp >> 2;
        for (int q = tid; q < n4; q += bd) {
            const int i = q << 2;
            float4 x = i < V ? load4<VEC>(c.row, V, q) : make_float4(0.f, 0.f, 0.f, 0.f);
            uint4 k = make_uint4(key_of(x.x, i), key_of(x.y, i + 1), key_of(x.z, i + 2), key_of(x.w, i + 3));
            __stcg((uint4 *)pw + q, k);
            const uint32_t ks[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (ks[e]) {
                    const uint64_t f = fx(ks[e]);
                    cnt++, mass += f, maxk = maxk > ks[e] ? maxk : ks[e];
                    atomicAdd(&c.hcnt[ks[e] >> 19], 1u);
                    atomicAdd((unsigned long long *)&c.hmass[ks[e] >> 19], (unsigned long long)f);
                }
        }
        cnt = block_reduce(
            cnt, [](uint32_t a, uint32_t b) { return a + b; }, S.r32);
        mass = block_reduce(
            mass, [](uint64_t a, uint64_t b) { return a + b; }, S.r64);
        maxk = block_reduce(
            maxk, [](uint32_t a, uint32_t b) { return a > b ? a : b; }, S.r32);
        if (tid == 0) {
            S.cut_key = 0, S.cut_id = -1, S.count_kept = cnt, S.m_kept = mass, S.max_key = maxk;
            S.smem_mode = 0, S.hist_valid = 1, S.sorted_n = 0;
        }
        __syncthreads();
        if (S.count_kept <= S_CAP)
            gather_all(c, S);

        // ---- top_k, top_p, min_p, then the pick
        if (P.top_k > 0 && (uint32_t)P.top_k < S.count_kept)
            do_op(c, S, target{OP_COUNT, (uint32_t)P.top_k, 0.0});
        if (P.top_p < 1.0f) {
            __syncthreads();
            const double tm = __dmul_rn((double)P.top_p, __ull2double_rn(S.m_kept));
            if (tm <= 0)
                do_op(c, S, target{OP_COUNT, 1u, 0.0});
            else
                do_op(c, S, target{OP_GE, 0u, tm}); // not reached (rounding): keep all
        }
        if (P.min_p > 0.f)
            apply_min_p(c, S, P.min_p);
        __syncthreads();
        const double u = s_uniform(P.seed, P.step);
        const double tu = __dmul_rn(u, __ull2double_rn(S.m_kept));
        if (!do_op(c, S, target{OP_GT, 0u, tu})) {
            __syncthreads();
            do_op(c, S, target{OP_COUNT, S.count_kept, 0.0}); // rounding: the last kept element
        }
        __syncthreads();
        tok = S.cut_id;
    }
done:
    if (tid == 0) {
        token[r] = tok;
        if (logprob) {
            if (P.logprobs < 0)
                logprob[r] = 0.f;
            else
                logprob[r] = tok >= 0 ? (float)__dsub_rn((double)c.row[tok], st.lse) : NAN;
        }
    }
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}
static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}
static size_t keys_stride(int V)
{
    return round_up((size_t)V, 4);
}
// The slices' stats: n rows of one slice, or at most S_PART_SLOTS slices (stats_parts).
static size_t stats_bytes(int n)
{
    return round_up((size_t)(n > S_PART_SLOTS ? n : S_PART_SLOTS) * sizeof(struct samp_part), 256);
}

extern "C" size_t k_sample_workspace(int n, int V)
{
    if (n <= 0 || V <= 0)
        return 0;
    return stats_bytes(n) + (size_t)n * keys_stride(V) * sizeof(uint32_t);
}

template <bool VEC>
static int sample_launch(float *logits, int n, int V, const struct k_sample_params *params,
                         const int32_t *hist, const int32_t *hist_start, const int32_t *n_prompt,
                         const int32_t *banned, const int32_t *banned_start, const uint32_t *allow,
                         const int32_t *allow_row, int32_t *token, float *logprob, int32_t *top_ids,
                         float *top_lp, void *workspace, cudaStream_t stream)
{
    struct samp_part *parts = (struct samp_part *)workspace;
    const int P = stats_parts(n, V);
    uint32_t *keys = (uint32_t *)((char *)workspace + stats_bytes(n));
    const int Vp = (int)keys_stride(V);
    const size_t smem = S_REGION + round_up((size_t)((V + 31) / 32) * 4, 16);
    static_assert(sizeof(struct samp_stats) == 32, "samp_stats layout");
    static_assert(S_PART_MAX <= 32 && S_PART_MAX * S_TOP * 8 <= S_REGION,
                  "stats_merge: one warp, sh in S_REGION");
    // Dynamic shared memory up to what any V needs (or the device allows), set once per device and
    // not per launch, so that a launch inside a graph capture makes no attribute call after the
    // first eager one.
    static std::atomic<int> smem_allowed[64];
    int dev = 0;
    K_CHECK(cudaGetDevice(&dev));
    std::atomic<int> &allowed = smem_allowed[dev & 63];
    if (allowed.load() == 0) {
        int optin = 0;
        cudaFuncAttributes fa;
        K_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        K_CHECK(cudaFuncGetAttributes(&fa, sample_kernel<VEC>));
        int a = optin - (int)fa.sharedSizeBytes;
        a = a < S_SMEM_MAX ? a : S_SMEM_MAX;
        K_CHECK(cudaFuncSetAttribute(sample_kernel<VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, a));
        allowed.store(a);
    }
    K_REQUIRE(smem <= (size_t)allowed.load(),
              "k_sample: V %d needs %zu bytes of shared memory, the device allows %d", V, smem,
              allowed.load());
    K_CHECK(k_launch(stats_kernel<VEC>, dim3(P, n), SA_THREADS, 0, stream, logits, V, params, parts));
    K_CHECK(k_launch(sample_kernel<VEC>, n, SB_THREADS, smem, stream, logits, V, Vp, params, hist, hist_start,
                     n_prompt, banned, banned_start, allow, allow_row, parts, P, top_ids, top_lp, keys, token,
                     logprob));
    return 0;
}

extern "C" int k_sample(float *logits, int n, int V, const struct k_sample_params *params,
                        const int32_t *hist, const int32_t *hist_start, const int32_t *n_prompt,
                        const int32_t *banned, const int32_t *banned_start, const uint32_t *allow,
                        const int32_t *allow_row, int32_t *token, float *logprob, int32_t *top_ids, float *top_lp,
                        void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    K_REQUIRE(n >= 0 && V > 0 && V <= S_MAX_V, "k_sample: bad shape n %d V %d (V at most %d)", n, V, S_MAX_V);
    if (n == 0)
        return 0;
    K_REQUIRE(logits && params && token && workspace,
              "k_sample: NULL pointer (logits %p params %p token %p workspace %p)", (void *)logits,
              (const void *)params, (void *)token, workspace);
    K_REQUIRE((top_ids == NULL) == (top_lp == NULL),
              "k_sample: top_ids and top_lp must both be given or both NULL");
    K_REQUIRE(hist_start == NULL || hist != NULL, "k_sample: hist_start without hist");
    K_REQUIRE(banned_start == NULL || banned != NULL, "k_sample: banned_start without banned");
    K_REQUIRE(allow_row == NULL || allow != NULL, "k_sample: allow_row without allow");
    K_REQUIRE(aligned16(workspace), "k_sample: workspace %p not 16-byte aligned", workspace);
    const size_t need = k_sample_workspace(n, V);
    K_REQUIRE(workspace_bytes >= need, "k_sample: workspace %zu bytes, need %zu for n %d V %d",
              workspace_bytes, need, n, V);
    if (V % 4 == 0 && aligned16(logits))
        return sample_launch<true>(logits, n, V, params, hist, hist_start, n_prompt, banned, banned_start, allow,
                                   allow_row, token, logprob, top_ids, top_lp, workspace, stream);
    return sample_launch<false>(logits, n, V, params, hist, hist_start, n_prompt, banned, banned_start, allow,
                                allow_row, token, logprob, top_ids, top_lp, workspace, stream);
}
