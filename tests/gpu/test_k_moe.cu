/* The mixture-of-experts kernels (kernels/moe.h) against double-precision C references: k_moe_route,
 * k_moe_permute, k_moe_route_permute, k_moe_combine, the experts' products by both paths (the decode GEMVs
 * and the grouped GEMM, bf16 and fp8 weights) and the whole MLP (k_moe_mlp), with uneven expert loads (one
 * expert in every token, most experts without a row), k = 1 and k = 8, E = 128, token counts from 1 to
 * prefill-sized, CUDA graph capture, argument errors, and timing at Qwen3-30B-A3B's shapes.
 *
 * Inputs are fresh random numbers per run (seed printed; LLMQ_TEST_SEED=N reproduces a run): X ~ N(0, 1)
 * bf16, bf16 weights ~ N(0, 1/K); fp8 weights as in test_k_gemv (90% e4m3(N(0, 1) * 64), 10% random
 * codes but NaN, block scales in [0.5, 2] / (64 sqrt(K))). The references decode the same bytes with
 * engine/dtype.h and sum in double; each stage's reference takes the stage's real inputs (the kernel's
 * outputs of the stage before, read back), so a tolerance covers one stage's roundings.
 *
 * Tolerances:
 *   routing: the expert ids exactly (the same fp32 comparisons; equal logits: the lower id first, NaN
 *     as -inf); each weight within (2 R + E + k + 4) * 2^-24 * 1.5 relative, R the row's range of finite
 *     logits: the fp32 exponent l - max errs by <= R 2^-24 (relative error of its exp, once in the term
 *     and once in the sum), expf by <= 2 ulp, the softmax sum of E positive terms by <= E ulp of the
 *     sum, the division and the renormalization by a few more; 1.5x margin.
 *   permutation: exact (integers); k_moe_route_permute: k_moe_route's ids and weights bit for bit and
 *     the permutation exact.
 *   combine: |got - ref| <= 2^-8 |ref| + k 2^-23 sum_s |w_s y_s|: the bf16 rounding of the output (half
 *     an ulp, <= 2^-9 relative: 2x margin) and k fp32 fmas, each erring by <= 2^-24 of a partial sum.
 *   gate/up + SwiGLU (h = silu(g) u): |got - ref| <= 2^-8 (|silu'(g) g u| + |silu(g) u| + |ref|) +
 *     a (|silu'(g) u| + |silu(g)|): the bf16 roundings of g and u (<= 2^-9 relative each) carried
 *     through silu(g) u, the output's rounding, each with a 2x margin, and a = 2^-16 sqrt(K) max |x w s|,
 *     the fp32 accumulation allowance of test_k_gemv (random-walk sum of the K / 16 adds' errors) for g
 *     and u; per case ||got - ref|| <= 6e-3 ||ref|| (three bf16 roundings of ~1.1e-3 rms each).
 *   down: |got - ref| <= 2^-8 |ref| + a (one rounding, the accumulation allowance); per case 4e-3.
 *   whole MLP against a reference with no rounding at all (routing in double, every product exact):
 *     per token ||got - ref|| <= 1e-2 ||ref||, over the case 5e-3: five bf16 roundings in sequence
 *     (g and u, h, y, out) of ~1.1e-3 rms each, amplified up to ~2x by silu', give ~2.5e-3; over a
 *     token's H values the estimate has a spread of a few percent. A lost or doubled pair, a wrong
 *     expert or weight errs by >= 1 / sqrt(k) of a token's norm (the pairs' outputs are independent).
 * Outputs are poisoned (0xFF: NaN) before each run; a NaN or a written row past expert_off[E] fails.
 *
 * Timing (informational): one MoE layer at Qwen3-30B-A3B's shape (E 128, k 8, H 2048, I 768) with
 * device-filled random weights, bf16 and fp8, each run on other tokens (so other experts than the run
 * before, not served from L2): T = 1, 8, 64 (decode path: the distinct experts' weight bytes a step reads,
 * as TB/s) and T = 512, 4096 (grouped GEMM: TFLOP/s of the 2 P (3 H I) flops), with each stage's time
 * alone; and both paths at T = 16 .. 256, for K_MOE_GEMV_MAX_T. */
#include <algorithm>
#include <cmath>
#include <stdarg.h>
#include <vector>

#include "gpu/gpu_test.h"
#include "kernels/moe.h"

extern "C" {
#include "engine/dtype.h"
}

#define ATOL_FRAC (1.0 / 65536)

static uint64_t base_seed, seed_k = 1;
static uint64_t next_seed(void)
{
    return gt_splitmix(base_seed + seed_k++) | 1;
}

template <typename T> static std::vector<T> to_host(const T *d, size_t n)
{
    std::vector<T> h(n);
    GPU_OK(cudaDeviceSynchronize());
    if (n)
        GPU_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
template <typename T> static T *upload(const std::vector<T> &h)
{
    T *d;
    GPU_OK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
    if (!h.empty())
        GPU_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<uint16_t> random_x(size_t n, uint64_t s)
{
    std::vector<uint16_t> x(n);
    for (auto &v : x)
        v = f32_to_bf16(gt_normal(&s));
    return x;
}

/* One stage's comparison: elements past their bound, the worst |got - ref| / bound, and the
 * norm-relative error. */
struct tally {
    size_t bad = 0;
    double num = 0, den = 0, worst = 0;
    void add(double got, double ref, double tol)
    {
        const double dd = fabs(got - ref);
        if (!(dd <= tol))
            bad++;
        worst = std::max(worst, std::isnan(dd) ? INFINITY : tol > 0 ? dd / tol : dd > 0 ? INFINITY : 0);
        num += dd * dd, den += ref * ref;
    }
    double rel() const { return den > 0 ? sqrt(num / den) : sqrt(num); }
};

/* ---- the routing reference */

/* the reference top-k of one row: descending, equal logits by the lower id, NaN as -inf; weights in
 * double */
static void ref_route(const float *l, int E, int k, int norm, int *ids, double *w)
{
    std::vector<int> ord(E);
    for (int e = 0; e < E; e++)
        ord[e] = e;
    auto val = [&](int e) { return std::isnan(l[e]) ? -INFINITY : l[e]; };
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return val(a) > val(b); });
    double mx = -INFINITY;
    for (int e = 0; e < E; e++)
        mx = std::max(mx, (double)val(e));
    double sum = 0;
    for (int e = 0; e < E; e++)
        sum += exp((double)val(e) - mx);
    double tot = 0;
    for (int s = 0; s < k; s++) {
        ids[s] = ord[s];
        w[s] = exp((double)val(ord[s]) - mx) / sum;
        tot += w[s];
    }
    if (norm)
        for (int s = 0; s < k; s++)
            w[s] /= tot;
}

/* ---- permutation */

/* Expert ids of T tokens x k slots. kind 0: k distinct random experts a token (the router's);
 * 1: skewed: slot 0 is expert 7 in every token, the others distinct among experts 0..k+2 (most experts
 * get nothing); 2: random ids in -2 .. E + 1 (out-of-range pairs are dropped), repeats allowed. */
static std::vector<int32_t> make_ids(int T, int k, int E, int kind, uint64_t s)
{
    std::vector<int32_t> ids((size_t)T * k);
    std::vector<int> pool;
    for (int t = 0; t < T; t++) {
        if (kind == 2) {
            for (int j = 0; j < k; j++)
                ids[(size_t)t * k + j] = (int)(gt_next(&s) % (uint64_t)(E + 4)) - 2;
            continue;
        }
        pool.clear();
        const int n = kind == 0 ? E : std::min(E, k + 3);
        for (int e = 0; e < n; e++)
            if (kind == 0 || e != 7)
                pool.push_back(e);
        for (int j = 0; j < k; j++) {
            if (kind == 1 && j == 0) {
                ids[(size_t)t * k] = 7;
                continue;
            }
            const size_t r = j + (size_t)(gt_next(&s) % (uint64_t)(pool.size() - j));
            std::swap(pool[j], pool[r]);
            ids[(size_t)t * k + j] = pool[j];
        }
    }
    return ids;
}

struct dperm {
    k_moe_perm p;
    int T, k, E;
    std::vector<int32_t> off, active, tok, pos; /* read back */
};
static void perm_alloc(dperm &d, int T, int k, int E)
{
    const size_t P = (size_t)T * k;
    d.T = T, d.k = k, d.E = E;
    d.p.expert_off = gt_poisoned<int32_t>(E + 1);
    d.p.active = gt_poisoned<int32_t>(E);
    d.p.perm_tok = gt_poisoned<int32_t>(std::max<size_t>(P, 1));
    d.p.pair_pos = gt_poisoned<int32_t>(std::max<size_t>(P, 1));
}
static void perm_read(dperm &d)
{
    const size_t P = (size_t)d.T * d.k;
    d.off = to_host(d.p.expert_off, d.E + 1);
    d.active = to_host(d.p.active, d.E);
    d.tok = to_host(d.p.perm_tok, P);
    d.pos = to_host(d.p.pair_pos, P);
}
static void perm_free(dperm &d)
{
    GPU_OK(cudaFree(d.p.expert_off));
    GPU_OK(cudaFree(d.p.active));
    GPU_OK(cudaFree(d.p.perm_tok));
    GPU_OK(cudaFree(d.p.pair_pos));
}

/* k_moe_permute of ids (uploaded; the device copy is returned, for the caller to free) into d, read back */
static int32_t *permute_ids(dperm &d, const std::vector<int32_t> &ids, int T, int k, int E)
{
    int32_t *dids = upload(ids);
    perm_alloc(d, T, k, E);
    K_OK(k_moe_permute(dids, T, k, E, &d.p, 0));
    perm_read(d);
    return dids;
}

/* checks the read-back permutation against the reference stable counting sort of ids; returns 1 if right */
static int perm_verify(const dperm &d, const std::vector<int32_t> &ids, const char *what)
{
    const int E = d.E, k = d.k;
    const size_t P = ids.size();
    std::vector<int32_t> off(E + 1, 0), active, rows;
    for (int32_t e : ids)
        if (e >= 0 && e < E)
            off[e + 1]++;
    for (int e = 0; e < E; e++) {
        if (off[e + 1])
            active.push_back(e);
        off[e + 1] += off[e];
    }
    while ((int)active.size() < E)
        active.push_back(-1);
    int bad = 0;
    for (int e = 0; e <= E; e++)
        bad += d.off[e] != off[e];
    for (int e = 0; e < E; e++)
        bad += d.active[e] != active[e];
    std::vector<int32_t> next(off.begin(), off.end() - 1);
    for (size_t p = 0; p < P; p++) {
        const int e = ids[p];
        const int want = e >= 0 && e < E ? next[e]++ : -1;
        if (d.pos[p] != want)
            bad++;
        else if (want >= 0 && d.tok[want] != (int32_t)(p / k))
            bad++;
    }
    gt_check(bad == 0, "permute %s T %d k %d E %d: %d mismatches (%d rows, %d active experts)", what, d.T, k,
             E, bad, off[E], (int)std::count_if(active.begin(), active.end(), [](int a) { return a >= 0; }));
    return bad == 0;
}

static void permute_case(int T, int k, int E, int kind)
{
    const auto ids = make_ids(T, k, E, kind, next_seed());
    dperm d;
    int32_t *dids = permute_ids(d, ids, T, k, E);
    perm_verify(d, ids, kind == 0 ? "router" : kind == 1 ? "skewed" : "with dropped pairs");
    perm_free(d);
    GPU_OK(cudaFree(dids));
}

/* ---- routing, and routing with the permutation in one launch */

/* kind 0: N(0, 2) logits; 1: logits on a grid of 0.25 (many ties); 2: with NaN and -inf sprinkled in */
static void route_case(int T, int E, int k, int norm, int kind)
{
    uint64_t s = next_seed();
    std::vector<float> logits((size_t)T * E);
    for (auto &v : logits) {
        v = 2.f * gt_normal(&s);
        if (kind == 1)
            v = roundf(v * 4.f) / 4.f;
        if (kind == 2 && gt_next(&s) % 13 == 0)
            v = gt_next(&s) & 1 ? NAN : -INFINITY;
    }
    float *dl = upload(logits);
    int32_t *ids = gt_poisoned<int32_t>((size_t)T * k);
    float *w = gt_poisoned<float>((size_t)T * k);
    K_OK(k_moe_route(dl, T, E, k, norm, ids, w, 0));
    auto hi = to_host(ids, (size_t)T * k);
    auto hw = to_host(w, (size_t)T * k);
    int bad_ids = 0, bad_w = 0;
    double worst = 0;
    std::vector<int> ri(k);
    std::vector<double> rw(k);
    for (int t = 0; t < T; t++) {
        ref_route(&logits[(size_t)t * E], E, k, norm, ri.data(), rw.data());
        float lo = INFINITY, up = -INFINITY; /* the finite logits' range: the exponents' size */
        for (int e = 0; e < E; e++) {
            const float v = logits[(size_t)t * E + e];
            if (std::isfinite(v))
                lo = std::min(lo, v), up = std::max(up, v);
        }
        const double tol = (2.0 * (up > lo ? up - lo : 0) + E + k + 4) * 1.5 / 16777216.0;
        for (int j = 0; j < k; j++) {
            if (hi[(size_t)t * k + j] != ri[j] && bad_ids++ < 3)
                printf("     token %d slot %d: id %d, want %d\n", t, j, hi[(size_t)t * k + j], ri[j]);
            const double diff = fabs(hw[(size_t)t * k + j] - rw[j]), d = rw[j] > 0 ? diff / rw[j] : diff;
            worst = std::max(worst, std::isnan(d) ? INFINITY : d);
            if (!(d <= tol))
                bad_w++;
        }
    }
    gt_check(bad_ids == 0 && bad_w == 0,
             "route T %d E %d k %d norm %d %s: %d wrong ids, %d weights past tolerance (worst rel err %.2e)",
             T, E, k, norm,
             kind == 0   ? "normal"
             : kind == 1 ? "ties"
                         : "NaN/-inf",
             bad_ids, bad_w, worst);
    /* the fused launch: the same ids and weights, and the permutation of those ids */
    int32_t *ids2 = gt_poisoned<int32_t>((size_t)T * k);
    float *w2 = gt_poisoned<float>((size_t)T * k);
    dperm d;
    perm_alloc(d, T, k, E);
    K_OK(k_moe_route_permute(dl, T, E, k, norm, ids2, w2, &d.p, 0));
    const auto hi2 = to_host(ids2, (size_t)T * k);
    const auto hw2 = to_host(w2, (size_t)T * k);
    gt_check(hi2 == hi && !memcmp(hw2.data(), hw.data(), hw.size() * 4),
             "route_permute T %d E %d k %d: k_moe_route's ids and weights bit for bit", T, E, k);
    perm_read(d);
    perm_verify(d, hi, "(route_permute)");
    perm_free(d);
    GPU_OK(cudaFree(ids2));
    GPU_OK(cudaFree(w2));
    GPU_OK(cudaFree(dl));
    GPU_OK(cudaFree(ids));
    GPU_OK(cudaFree(w));
}

/* ---- combine */

static void combine_case(int T, int k, int E, int H, int kind)
{
    const size_t P = (size_t)T * k;
    const auto ids = make_ids(T, k, E, kind, next_seed());
    dperm d;
    int32_t *dids = permute_ids(d, ids, T, k, E);
    if (!perm_verify(d, ids, "(combine input)"))
        return;
    /* combine: Yp random, weights random in (0, 1] */
    uint64_t s = next_seed();
    const auto y = random_x(P * H, next_seed());
    std::vector<float> w(P);
    for (auto &v : w)
        v = 0.5f * (gt_uniform(&s) + 1.f) + 1e-3f;
    uint16_t *dy = upload(y);
    float *dw = upload(w);
    bf16 *out = gt_poisoned<bf16>((size_t)T * H);
    K_OK(k_moe_combine((const bf16 *)dy, &d.p, dw, T, k, H, out, 0));
    const auto ho = to_host((const uint16_t *)out, (size_t)T * H);
    tally cb;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < k; j++) {
                const int pos = d.pos[(size_t)t * k + j];
                if (pos < 0)
                    continue;
                const double v = (double)w[(size_t)t * k + j] * bf16_to_f32(y[(size_t)pos * H + h]);
                ref += v, mag += fabs(v);
            }
            cb.add(bf16_to_f32(ho[(size_t)t * H + h]), ref, ldexp(fabs(ref), -8) + k * ldexp(mag, -23));
        }
    gt_check(cb.bad == 0, "combine T %d k %d H %d%s: %zu outputs past tolerance (worst %.2f of it)", T, k, H,
             kind == 2 ? " (dropped pairs)" : "", cb.bad, cb.worst);
    GPU_OK(cudaFree(dy));
    GPU_OK(cudaFree(dw));
    GPU_OK(cudaFree(out));
    GPU_OK(cudaFree(dids));
    perm_free(d);
}

/* ---- experts */

/* A layer's expert weights on the host (exact values as float: bf16 or e4m3 codes; fp8 scales apart)
 * and on the device. */
struct experts {
    int E, H, I;
    bool fp8;
    std::vector<float> gu, dn;   /* [E][2I][H], [E][H][I]: bf16 values or e4m3 code values */
    std::vector<float> gus, dns; /* fp8: [E][ceil(2I/128)][ceil(H/128)], [E][ceil(H/128)][ceil(I/128)] */
    void *dgu = nullptr, *ddn = nullptr;
    float *dgus = nullptr, *ddns = nullptr;
    k_moe_weights w;
};

static void make_matrix(bool fp8, int E, int N, int K, uint64_t s, std::vector<float> &v,
                        std::vector<float> &sc, void **dv, float **dsc)
{
    v.resize((size_t)E * N * K);
    if (fp8) {
        std::vector<uint8_t> q(v.size());
        for (size_t i = 0; i < q.size(); i++)
            q[i] = gt_random_e4m3(&s), v[i] = e4m3_to_f32(q[i]);
        sc.resize((size_t)E * ((N + 127) / 128) * ((K + 127) / 128));
        for (auto &x : sc)
            x = (0.5f + 0.75f * (gt_uniform(&s) + 1.f)) / (64.f * sqrtf((float)K));
        *dv = upload(q);
        *dsc = upload(sc);
    } else {
        std::vector<uint16_t> b(v.size());
        const float sd = 1.f / sqrtf((float)K);
        for (size_t i = 0; i < b.size(); i++)
            b[i] = f32_to_bf16(gt_normal(&s) * sd), v[i] = bf16_to_f32(b[i]);
        *dv = upload(b);
    }
}

static void make_experts(experts &x, int E, int H, int I, bool fp8)
{
    x.E = E, x.H = H, x.I = I, x.fp8 = fp8;
    make_matrix(fp8, E, 2 * I, H, next_seed(), x.gu, x.gus, &x.dgu, &x.dgus);
    make_matrix(fp8, E, H, I, next_seed(), x.dn, x.dns, &x.ddn, &x.ddns);
    x.w = {E, H, I, fp8 ? 1 : 0, x.dgu, x.dgus, x.ddn, x.ddns};
}
static void free_experts(experts &x)
{
    GPU_OK(cudaFree(x.dgu));
    GPU_OK(cudaFree(x.ddn));
    GPU_OK(cudaFree(x.dgus));
    GPU_OK(cudaFree(x.ddns));
}

/* row n of expert e's matrix (N rows of K; scales sc when fp8) dotted with x[K] in double; *mx = the
 * largest |x w s| */
static double dot_row(const experts &x, const std::vector<float> &v, const std::vector<float> &sc, int e,
                      int N, int K, int n, const double *xv, double *mx)
{
    const float *w = &v[((size_t)e * N + n) * K];
    const int KB = (K + 127) / 128;
    double acc = 0, m = 0;
    for (int b = 0; b < KB; b++) {
        const double s = x.fp8 ? sc[((size_t)e * ((N + 127) / 128) + n / 128) * KB + b] : 1.0;
        double blk = 0;
        for (int kk = b * 128; kk < std::min(K, b * 128 + 128); kk++) {
            const double p = xv[kk] * w[kk];
            blk += p, m = std::max(m, fabs(p * s));
        }
        acc += blk * s;
    }
    *mx = m;
    return acc;
}

static double silu(double g)
{
    return g / (1 + exp(-g));
}

/* The experts' products of one case by one path (0 decode GEMVs, 1 grouped GEMM), each stage against its
 * reference on its real inputs. */
static void experts_path(const experts &x, const dperm &d, const std::vector<uint16_t> &X, uint16_t *dX,
                         int path, const char *what)
{
    const int T = d.T, k = d.k, E = x.E, H = x.H, I = x.I;
    const size_t P = (size_t)T * k;
    const int rows = d.off[E];
    bf16 *hp = gt_poisoned<bf16>(P * I), *yp = gt_poisoned<bf16>(P * H),
         *again = gt_poisoned<bf16>(P * std::max(H, I));
    auto gate_up = [&](bf16 *out) {
        K_OK(path == 0 ? k_moe_gemv_gate_up((const bf16 *)dX, &d.p, T, k, &x.w, out, 0)
                       : k_moe_gemm_gate_up((const bf16 *)dX, &d.p, T, k, &x.w, out, 0));
    };
    auto down = [&](bf16 *out) {
        K_OK(path == 0 ? k_moe_gemv_down(hp, &d.p, T, k, &x.w, out, 0)
                       : k_moe_gemm_down(hp, &d.p, T, k, &x.w, out, 0));
    };
    /* every output twice: the same bits (no race, no order that depends on timing) */
    auto same_again = [&](const char *stage, const std::vector<uint16_t> &first, size_t n) {
        const auto second = to_host((const uint16_t *)again, n);
        gt_check(second == first, "%s %s %s: a second run gives the same bits", path ? "grouped" : "gemv",
                 stage, x.fp8 ? "fp8" : "bf16");
    };
    gate_up(hp);
    const auto hh = to_host((const uint16_t *)hp, P * I);
    GPU_OK(cudaMemset(again, 0xff, P * I * 2));
    gate_up(again);
    same_again("gate/up", hh, P * I);
    /* expert of each row */
    std::vector<int> row_e(rows);
    for (int e = 0; e < E; e++)
        for (int i = d.off[e]; i < d.off[e + 1]; i++)
            row_e[i] = e;
    std::vector<double> xv(std::max(H, I));
    tally gu;
    for (int i = 0; i < rows; i++) {
        const int e = row_e[i];
        for (int c = 0; c < H; c++)
            xv[c] = bf16_to_f32(X[(size_t)d.tok[i] * H + c]);
        for (int n = 0; n < I; n++) {
            double mg, mu;
            const double g = dot_row(x, x.gu, x.gus, e, 2 * I, H, n, xv.data(), &mg);
            const double u = dot_row(x, x.gu, x.gus, e, 2 * I, H, I + n, xv.data(), &mu);
            const double sg = 1 / (1 + exp(-g)), sl = g * sg, dsl = sg * (1 + g * (1 - sg));
            const double ref = sl * u, a = ATOL_FRAC * sqrt((double)H) * std::max(mg, mu);
            gu.add(bf16_to_f32(hh[(size_t)i * I + n]), ref,
                   ldexp(fabs(dsl * g * u) + fabs(sl * u) + fabs(ref), -8) + a * (fabs(dsl * u) + fabs(sl)));
        }
    }
    for (size_t i = rows; i < P; i++) /* rows past expert_off[E] stay poisoned */
        gu.bad += hh[i * I] != 0xffff;
    gt_check(
        gu.bad == 0 && gu.rel() <= 6e-3,
        "%s gate/up %s %s T %d k %d E %d H %d I %d (%d rows): %zu past tolerance (worst %.2f of it), rel "
        "err %.2e (tol 6e-3)",
        path ? "grouped" : "gemv", x.fp8 ? "fp8 " : "bf16", what, T, k, E, H, I, rows, gu.bad, gu.worst,
        gu.rel());

    down(yp);
    const auto hy = to_host((const uint16_t *)yp, P * H);
    GPU_OK(cudaMemset(again, 0xff, P * H * 2));
    down(again);
    same_again("down", hy, P * H);
    tally dn;
    for (int i = 0; i < rows; i++) {
        const int e = row_e[i];
        for (int c = 0; c < I; c++)
            xv[c] = bf16_to_f32(hh[(size_t)i * I + c]);
        for (int n = 0; n < H; n++) {
            double m;
            const double ref = dot_row(x, x.dn, x.dns, e, H, I, n, xv.data(), &m);
            dn.add(bf16_to_f32(hy[(size_t)i * H + n]), ref,
                   ldexp(fabs(ref), -8) + ATOL_FRAC * sqrt((double)I) * m);
        }
    }
    for (size_t i = rows; i < P; i++)
        dn.bad += hy[i * H] != 0xffff;
    gt_check(dn.bad == 0 && dn.rel() <= 4e-3,
             "%s down    %s %s T %d k %d E %d H %d I %d: %zu past tolerance (worst %.2f of it), rel err %.2e "
             "(tol 4e-3)",
             path ? "grouped" : "gemv", x.fp8 ? "fp8 " : "bf16", what, T, k, E, H, I, dn.bad, dn.worst,
             dn.rel());
    GPU_OK(cudaFree(hp));
    GPU_OK(cudaFree(yp));
    GPU_OK(cudaFree(again));
}

static void experts_case(int T, int k, int E, int H, int I, bool fp8, int kind)
{
    experts x;
    make_experts(x, E, H, I, fp8);
    const auto ids = make_ids(T, k, E, kind, next_seed());
    dperm d;
    int32_t *dids = permute_ids(d, ids, T, k, E);
    const auto X = random_x((size_t)T * H, next_seed());
    uint16_t *dX = upload(X);
    const char *what = kind == 0 ? "router" : kind == 1 ? "skewed" : "dropped";
    for (int path = 0; path < 2; path++)
        experts_path(x, d, X, dX, path, what);
    GPU_OK(cudaFree(dX));
    GPU_OK(cudaFree(dids));
    perm_free(d);
    free_experts(x);
}

/* ---- the whole MLP */

/* logits kind 0: N(0, 2); 1: skewed: expert 3 gets +8 (every token), experts E/2 .. E-1 get -30 (none) */
static void mlp_case(const experts &x, int T, int k, int norm, int kind)
{
    const int E = x.E, H = x.H, I = x.I;
    uint64_t s = next_seed();
    std::vector<float> logits((size_t)T * E);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            float v = 2.f * gt_normal(&s);
            if (kind == 1)
                v += e == 3 ? 8.f : e >= E / 2 ? -30.f : 0.f;
            logits[(size_t)t * E + e] = v;
        }
    const auto X = random_x((size_t)T * H, next_seed());
    float *dl = upload(logits);
    uint16_t *dX = upload(X);
    bf16 *out = gt_poisoned<bf16>((size_t)T * H);
    const size_t wsb = k_moe_workspace(T, k, E, H, I);
    void *ws;
    GPU_OK(cudaMalloc(&ws, wsb));
    K_OK(k_moe_mlp((const bf16 *)dX, dl, T, k, norm, &x.w, out, ws, wsb, 0));
    const auto ho = to_host((const uint16_t *)out, (size_t)T * H);

    std::vector<int> ri(k);
    std::vector<double> rw(k), xv(H), hv(I), ref(H);
    double num = 0, den = 0, worst_tok = 0;
    int bad_tok = 0;
    for (int t = 0; t < T; t++) {
        ref_route(&logits[(size_t)t * E], E, k, norm, ri.data(), rw.data());
        for (int c = 0; c < H; c++)
            xv[c] = bf16_to_f32(X[(size_t)t * H + c]);
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int j = 0; j < k; j++) {
            double m;
            for (int n = 0; n < I; n++) {
                const double g = dot_row(x, x.gu, x.gus, ri[j], 2 * I, H, n, xv.data(), &m);
                const double u = dot_row(x, x.gu, x.gus, ri[j], 2 * I, H, I + n, xv.data(), &m);
                hv[n] = silu(g) * u;
            }
            for (int n = 0; n < H; n++)
                ref[n] += rw[j] * dot_row(x, x.dn, x.dns, ri[j], H, I, n, hv.data(), &m);
        }
        double tn = 0, td = 0;
        for (int n = 0; n < H; n++) {
            const double dd = bf16_to_f32(ho[(size_t)t * H + n]) - ref[n];
            tn += dd * dd, td += ref[n] * ref[n];
        }
        const double rel = sqrt(tn / td);
        if (!(rel <= 1e-2) && bad_tok++ < 3)
            printf("     token %d: rel err %.3e\n", t, rel);
        worst_tok = std::max(worst_tok, std::isnan(rel) ? INFINITY : rel);
        num += tn, den += td;
    }
    const double rel = sqrt(num / den);
    gt_check(
        bad_tok == 0 && rel <= 5e-3,
        "mlp %s %s T %d k %d norm %d E %d H %d I %d (%s path): %d tokens past 1e-2 (worst %.2e), rel err "
        "%.2e (tol 5e-3)",
        x.fp8 ? "fp8 " : "bf16", kind == 0 ? "router" : "skewed", T, k, norm, E, H, I,
        T <= K_MOE_GEMV_MAX_T ? "gemv" : "grouped", bad_tok, worst_tok, rel);

    /* the same step captured in a CUDA graph and replayed: the same bits */
    if (T <= 8) {
        cudaStream_t st;
        GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        bf16 *out2 = gt_poisoned<bf16>((size_t)T * H);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        GPU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        K_OK(k_moe_mlp((const bf16 *)dX, dl, T, k, norm, &x.w, out2, ws, wsb, st));
        GPU_OK(cudaStreamEndCapture(st, &graph));
        GPU_OK(cudaGraphInstantiate(&exec, graph, 0));
        GPU_OK(cudaGraphLaunch(exec, st));
        GPU_OK(cudaGraphLaunch(exec, st));
        GPU_OK(cudaStreamSynchronize(st));
        const auto h2 = to_host((const uint16_t *)out2, (size_t)T * H);
        gt_check(h2 == ho, "mlp T %d: a graph replay gives the eager call's bits", T);
        GPU_OK(cudaGraphExecDestroy(exec));
        GPU_OK(cudaGraphDestroy(graph));
        GPU_OK(cudaFree(out2));
        GPU_OK(cudaStreamDestroy(st));
    }
    GPU_OK(cudaFree(dl));
    GPU_OK(cudaFree(dX));
    GPU_OK(cudaFree(out));
    GPU_OK(cudaFree(ws));
}

/* ---- argument errors */

static void expect_fail(int rc, const char *what, const char *needle)
{
    const char *msg = k_last_error();
    gt_check(rc == -1 && strstr(msg, needle), "refused: %s (\"%s\")", what, msg);
}

static void argument_checks(const experts &x)
{
    dperm d;
    perm_alloc(d, 4, 2, x.E);
    bf16 *buf = gt_poisoned<bf16>(64 * 1024);
    int32_t *ids = gt_poisoned<int32_t>(64);
    float *f = gt_poisoned<float>(1024);
    expect_fail(k_moe_route(f, 4, x.E, x.E + 1, 1, ids, f, 0), "k > E", "bad sizes");
    expect_fail(k_moe_route(f, 4, K_MOE_MAX_E + 1, 2, 1, ids, f, 0), "E > K_MOE_MAX_E", "bad sizes");
    expect_fail(k_moe_route(f, 4, x.E, K_MOE_MAX_K + 1, 1, ids, f, 0), "k > K_MOE_MAX_K", "bad sizes");
    k_moe_weights w = x.w;
    w.I = 24;
    expect_fail(k_moe_gemm_gate_up(buf, &d.p, 4, 2, &w, buf, 0), "grouped GEMM, I not a multiple of 32",
                "multiples");
    w = x.w, w.down = NULL;
    expect_fail(k_moe_gemv_down(buf, &d.p, 4, 2, &w, buf, 0), "NULL down weights", "NULL weight");
    expect_fail(k_moe_combine(buf, &d.p, f, 4, 2, 12, buf, 0), "H not a multiple of 8", "multiple of 8");
    expect_fail(k_moe_mlp(buf, f, 4, 2, 1, &x.w, buf, buf, 100, 0), "a small workspace", "workspace");
    gt_check(k_moe_mlp(buf, f, 0, 2, 1, &x.w, buf, NULL, 0, 0) == 0, "T = 0: nothing to do, 0");
    k_set_f16(1);
    expect_fail(k_moe_route(f, 4, x.E, 2, 1, ids, f, 0), "fp16 mode", "bf16 only");
    k_set_f16(0);
    GPU_OK(cudaFree(buf));
    GPU_OK(cudaFree(ids));
    GPU_OK(cudaFree(f));
    perm_free(d);
}

/* ---- timing at Qwen3-30B-A3B's layer shape */

__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed, float scale, int fp8)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t r = gt_splitmix(seed ^ (i * 0x9e3779b97f4a7c15ull));
        if (fp8) {
            uint8_t b = (uint8_t)r;
            ((uint8_t *)p)[i] = (b & 0x7f) == 0x7f ? 0x3f : b;
        } else { /* the sum of 4 uniforms, ~N(0, 1) * scale */
            float a = 0;
            for (int j = 0; j < 4; j++)
                a += (float)((r >> (16 * j)) & 0xffff) / 32768.f - 1.f;
            p[i] = __bfloat16_as_ushort(__float2bfloat16(a * 0.866f * scale));
        }
    }
}
static void fill(void *p, size_t n, float scale, int fp8)
{
    fill_kernel<<<1024, 256>>>((uint16_t *)p, n, next_seed(), scale, fp8);
    GPU_OK(cudaGetLastError());
}

/* The step's buffers for timing, at up to TMAX tokens. */
struct bench {
    int E, k, H, I, TMAX;
    k_moe_weights w;
    bf16 *X, *out, *h, *y;
    float *logits, *rw;
    int32_t *ids;
    dperm d;
    cudaEvent_t ev[5];
};

/* The median over 9 runs (after 2) of one MoE layer of T tokens by one path (gemv: the decode path, else
 * the grouped GEMM), each run on the next T tokens (other experts: what a step reads is not in L2 from
 * the run before). *stage gets the four stages' medians (routing + sort, gate/up, down, combine), timed
 * by events between them (which keep the stages from overlapping under PDL); the return value is the
 * whole of a k_moe_mlp-like run without those events when whole, else their sum. */
static double time_path(bench &b, int T, bool gemv, bool whole, double *stage)
{
    const int E = b.E, k = b.k;
    std::vector<float> per[5];
    for (int r = -2; r < 9; r++) {
        const int o = (int)((long)(r + 2) * T % (b.TMAX - T + 1));
        const bf16 *X = b.X + (size_t)o * b.H;
        const float *lg = b.logits + (size_t)o * E;
        auto mark = [&](int i) {
            if (!whole || i == 0 || i == 4)
                GPU_OK(cudaEventRecord(b.ev[i]));
        };
        mark(0);
        if (gemv) {
            K_OK(k_moe_route_permute(lg, T, E, k, 1, b.ids, b.rw, &b.d.p, 0));
        } else {
            K_OK(k_moe_route(lg, T, E, k, 1, b.ids, b.rw, 0));
            K_OK(k_moe_permute(b.ids, T, k, E, &b.d.p, 0));
        }
        mark(1);
        K_OK(gemv ? k_moe_gemv_gate_up(X, &b.d.p, T, k, &b.w, b.h, 0)
                  : k_moe_gemm_gate_up(X, &b.d.p, T, k, &b.w, b.h, 0));
        mark(2);
        K_OK(gemv ? k_moe_gemv_down(b.h, &b.d.p, T, k, &b.w, b.y, 0)
                  : k_moe_gemm_down(b.h, &b.d.p, T, k, &b.w, b.y, 0));
        mark(3);
        K_OK(k_moe_combine(b.y, &b.d.p, b.rw, T, k, b.H, b.out, 0));
        mark(4);
        GPU_OK(cudaEventSynchronize(b.ev[4]));
        if (r < 0)
            continue;
        float ms;
        GPU_OK(cudaEventElapsedTime(&ms, b.ev[0], b.ev[4]));
        per[4].push_back(ms);
        for (int i = 0; i < 4 && !whole; i++) {
            GPU_OK(cudaEventElapsedTime(&ms, b.ev[i], b.ev[i + 1]));
            per[i].push_back(ms);
        }
    }
    for (int i = 0; i < 5; i++)
        std::sort(per[i].begin(), per[i].end());
    for (int i = 0; i < 4 && stage; i++)
        stage[i] = whole ? 0 : per[i][4] * 1e3;
    return per[4][4] * 1e3;
}

static void timing(bool fp8)
{
    bench b;
    const int E = 128, k = 8, H = 2048, I = 768, TMAX = 4096 + 64;
    b.E = E, b.k = k, b.H = H, b.I = I, b.TMAX = TMAX;
    const size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I, wb = fp8 ? 1 : 2;
    void *gu, *dn;
    float *gus = NULL, *dns = NULL;
    GPU_OK(cudaMalloc(&gu, ngu * wb));
    GPU_OK(cudaMalloc(&dn, ndn * wb));
    fill(gu, ngu, 1.f / sqrtf((float)H), fp8);
    fill(dn, ndn, 1.f / sqrtf((float)I), fp8);
    if (fp8) {
        const size_t sgu = (size_t)E * (2 * I / 128) * (H / 128), sdn = (size_t)E * (H / 128) * (I / 128);
        std::vector<float> a(sgu, 1.f / (64.f * sqrtf((float)H))), c(sdn, 1.f / (64.f * sqrtf((float)I)));
        gus = upload(a), dns = upload(c);
    }
    b.w = {E, H, I, fp8 ? 1 : 0, gu, gus, dn, dns};
    const size_t P = (size_t)TMAX * k;
    GPU_OK(cudaMalloc(&b.X, (size_t)TMAX * H * 2));
    GPU_OK(cudaMalloc(&b.out, (size_t)TMAX * H * 2));
    GPU_OK(cudaMalloc(&b.h, P * I * 2));
    GPU_OK(cudaMalloc(&b.y, P * H * 2));
    GPU_OK(cudaMalloc(&b.logits, (size_t)TMAX * E * 4));
    GPU_OK(cudaMalloc(&b.ids, P * 4));
    GPU_OK(cudaMalloc(&b.rw, P * 4));
    perm_alloc(b.d, TMAX, k, E);
    fill(b.X, (size_t)TMAX * H, 1.f, 0);
    {
        uint64_t s = next_seed();
        std::vector<float> l((size_t)TMAX * E);
        for (auto &v : l)
            v = 2.f * gt_normal(&s);
        GPU_OK(cudaMemcpy(b.logits, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
    }
    for (auto &e : b.ev)
        GPU_OK(cudaEventCreate(&e));
    const double expert_bytes = (double)(2 * I * H + H * I) * wb;
    const char *dt = fp8 ? "fp8 " : "bf16";
    for (int T : {1, 8, 64, 512, 4096}) {
        const bool gemv = T <= K_MOE_GEMV_MAX_T;
        double st[4];
        const double us = time_path(b, T, gemv, true, NULL);
        time_path(b, T, gemv, false, st);
        /* the distinct experts of the last run's tokens */
        b.d.T = T;
        perm_read(b.d);
        int distinct = 0;
        for (int e = 0; e < E; e++)
            distinct += b.d.active[e] >= 0;
        printf("time %s T %4d: %8.1f us (%s path), %3d experts: %.2f TB/s of their weights, %.1f TFLOP/s; "
               "alone: route+sort %.1f, gate/up %.1f, down %.1f, combine %.1f us\n",
               dt, T, us, gemv ? "gemv" : "grouped", distinct, distinct * expert_bytes / us * 1e-6,
               2.0 * T * k * 3.0 * H * I / us * 1e-6, st[0], st[1], st[2], st[3]);
    }
    /* where the grouped GEMM overtakes the GEMVs (K_MOE_GEMV_MAX_T) */
    for (int T : {16, 32, 64, 128, 256})
        printf("crossover %s T %3d: gemv path %8.1f us, grouped path %8.1f us\n", dt, T,
               time_path(b, T, true, true, NULL), time_path(b, T, false, true, NULL));
    for (auto &e : b.ev)
        GPU_OK(cudaEventDestroy(e));
    b.d.T = TMAX;
    perm_free(b.d);
    for (void *p : {(void *)gu, (void *)dn, (void *)gus, (void *)dns, (void *)b.X, (void *)b.out, (void *)b.h,
                    (void *)b.y, (void *)b.logits, (void *)b.ids, (void *)b.rw})
        GPU_OK(cudaFree(p));
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();

    printf("\n== routing\n");
    route_case(1, 128, 8, 1, 0);
    route_case(37, 128, 8, 0, 0);
    route_case(300, 128, 1, 1, 0);
    route_case(64, 128, 8, 1, 1);
    route_case(64, 128, 8, 1, 2);
    route_case(17, 60, 4, 1, 0);
    route_case(9, 8, 8, 1, 0);
    route_case(33, 512, 16, 0, 1);

    printf("\n== permutation\n");
    for (int kind = 0; kind < 3; kind++)
        for (int T : {1, 7, 300, 4096}) {
            permute_case(T, 8, 128, kind);
            permute_case(T, 1, 128, kind);
        }
    permute_case(1000, 16, 512, 0);
    permute_case(50, 2, 3, 2);

    printf("\n== combine\n");
    combine_case(1, 8, 128, 2048, 0);
    combine_case(130, 8, 128, 264, 1);
    combine_case(40, 1, 128, 64, 0);
    combine_case(40, 4, 16, 64, 2);

    printf("\n== the experts' products, both paths (gemv: decode GEMVs; grouped: grouped GEMM)\n");
    for (int fp8 = 0; fp8 < 2; fp8++) {
        experts_case(1, 8, 128, 256, 128, fp8, 0);
        experts_case(5, 1, 128, 256, 128, fp8, 0);
        experts_case(200, 8, 128, 256, 128, fp8, 0);
        experts_case(200, 8, 128, 256, 128, fp8, 1);
        experts_case(100, 1, 128, 256, 128, fp8, 1);
        experts_case(24, 8, 32, 1024, 384, fp8, 0);
    }
    experts_case(70, 8, 128, 160, 96, false, 0); /* partial column tiles (bf16: multiples of 32) */
    experts_case(33, 4, 16, 256, 128, false, 2); /* dropped pairs */

    printf("\n== the whole MLP (k_moe_mlp)\n");
    for (int fp8 = 0; fp8 < 2; fp8++) {
        experts x;
        make_experts(x, 128, 256, 128, fp8);
        for (int T : {1, 5, K_MOE_GEMV_MAX_T, K_MOE_GEMV_MAX_T + 1, 200})
            mlp_case(x, T, 8, 1, 0);
        mlp_case(x, 100, 8, 1, 1);
        mlp_case(x, 8, 8, 1, 1);
        mlp_case(x, 100, 1, 0, 0);
        if (!fp8) {
            printf("\n== argument errors\n");
            argument_checks(x);
        }
        free_experts(x);
    }

    printf("\n== timing at Qwen3-30B-A3B's layer (E 128, k 8, H 2048, I 768), informational\n");
    timing(false);
    timing(true);

    printf("\n%d checks passed, %d failed\n", gt_passes, gt_failures);
    for (int i = 0; i < gt_n_failed; i++)
        printf("  FAILED: %s\n", gt_failed[i]);
    return gt_failures ? 1 : 0;
}
