/* Kernel test: k_sample (kernels/sampling.cu) against the CPU oracle samp_sample (engine/sampler.c)
 * on the same logits, histories and parameters, row by row, plus timing at 256 x 151936.
 *
 * What must hold (each case prints one line with its numbers):
 * - tokens equal. The only tolerated difference is a near-tie of the pick: the GPU sums masses in
 *   2^-44 fixed point and the oracle in double (in another order), and exp() of the two libraries may
 *   differ in the last bit of a double, so the two can disagree only when u * total lies within about
 *   1e-9 of the boundary between two neighbours in the sorted order. A mismatch is counted as a
 *   near-tie when the two tokens are neighbours in the oracle's sorted kept list and |u - boundary|
 *   <= 1e-5 (the test's boundary comes from renormalized fp32 probabilities, good to ~1e-6); every
 *   other mismatch fails. Greedy rows must match exactly (no arithmetic decides them).
 * - a row the oracle refuses (NaN or +inf logit, every id -inf or banned) gives token -1.
 * - logprob of the chosen token within 1e-4 (abs) of the oracle's (the GPU sums exp in fp32).
 * - top-N ids equal, except where two ids' raw logits differ by <= 1e-6 (counted, not failed; the
 *   ordering compares the same floats, so this should stay 0); their logprobs within 1e-4; entries
 *   past N are -1 / -inf.
 * Inputs are fresh random numbers per run (seed printed; LLMQ_TEST_SEED=N reproduces a run). Outputs
 * are poisoned before every launch. Timing lines are informational. */
#include <algorithm>
#include <cmath>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu/gpu_test.h"
extern "C" {
#include "engine/backend.h"
#include "engine/sampler.h"
}

#define LP_TOL 1e-4
#define TIE_U_TOL 1e-5
#define VBIG 151936

static int failures = 0;
static uint64_t base_seed;

static uint64_t case_seed(uint64_t k)
{
    uint64_t z = base_seed + k * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) | 1;
}
static uint32_t rint_(uint64_t *s, uint32_t n)
{
    return (uint32_t)((gt_next(s) >> 33) % n);
}
template <typename T, size_t N> static T pick(uint64_t *s, const T (&a)[N])
{
    return a[rint_(s, (uint32_t)N)];
}

/* ---- one batch: rows of logits and what the sampler needs for each */

struct rowspec {
    k_sample_params p;
    std::vector<int32_t> hist; /* prompt then output */
    int n_prompt = 0;
    std::vector<int32_t> banned;
    std::vector<uint32_t> mask; /* a grammar's mask ((V + 31) / 32 words), or empty */
};

struct batch {
    int n = 0, V = 0;
    std::vector<float> logits; /* n * V */
    std::vector<rowspec> rows;
};

enum { L_NORMAL, L_QUANT, L_CONST, L_MASKED, L_SPIKE, L_TIEMAX, L_ZEROS, L_NKINDS };

static void gen_logits(float *l, int V, uint64_t *s, int kind)
{
    const float scales[] = {0.3f, 1.f, 2.f, 4.f, 8.f};
    const float sc = pick(s, scales);
    switch (kind) {
    case L_QUANT: /* many exact ties: p equal within each step */
        for (int i = 0; i < V; i++)
            l[i] = roundf(gt_normal(s) * sc * 2.f) * 0.5f;
        break;
    case L_CONST:
        for (int i = 0; i < V; i++)
            l[i] = 0.75f;
        break;
    case L_MASKED: /* a padded vocabulary: the tail and some scattered ids are -inf */
        for (int i = 0; i < V; i++)
            l[i] = (i >= V - V / 8 || rint_(s, 100) == 0) ? -INFINITY : gt_normal(s) * sc;
        l[rint_(s, (uint32_t)(V - V / 8))] = 1.f; /* one finite id at least */
        break;
    case L_SPIKE:
        for (int i = 0; i < V; i++)
            l[i] = gt_normal(s) * sc;
        l[rint_(s, V)] += 12.f;
        break;
    case L_TIEMAX: { /* the maximum copied to a few ids, below and above it */
        for (int i = 0; i < V; i++)
            l[i] = gt_normal(s) * sc;
        int am = (int)(std::max_element(l, l + V) - l);
        int k = 1 + rint_(s, 4);
        for (int j = 0; j < k; j++)
            l[rint_(s, V)] = l[am];
        break;
    }
    case L_ZEROS: { /* -0.0 and +0.0 as the maximum: equal as floats, so the lower id wins */
        for (int i = 0; i < V; i++)
            l[i] = -1.f - fabsf(gt_normal(s)) * sc;
        int a = rint_(s, V), b = rint_(s, V);
        l[a] = -0.0f;
        l[b] = 0.0f;
        break;
    }
    default:
        for (int i = 0; i < V; i++)
            l[i] = gt_normal(s) * sc;
    }
}

static k_sample_params base_params(uint64_t *s)
{
    k_sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.f, p.top_p = 1.f, p.min_p = 0.f;
    p.repetition_penalty = 1.f, p.presence_penalty = 0.f, p.frequency_penalty = 0.f;
    p.top_k = 0;
    const int lps[] = {-1, -1, 0, 1, 5, 20, 25};
    p.logprobs = pick(s, lps);
    p.seed = gt_next(s);
    p.step = 0;
    return p;
}

static float rand_temp(uint64_t *s)
{
    const float ts[] = {0.1f, 0.3f, 0.7f, 1.0f, 1.0f, 1.3f, 2.0f, 1e-5f};
    return pick(s, ts);
}
static int rand_topk(uint64_t *s, int V)
{
    const int ks[] = {1, 2, 5, 40, 50, 1000, 4095, 4096, 4097, 10000, -1, -2, -3};
    int k = pick(s, ks);
    return k == -1 ? V - 1 : k == -2 ? V : k == -3 ? V + 5 : k;
}
static float rand_topp(uint64_t *s)
{
    const float ps[] = {0.0f, 0.1f, 0.5f, 0.8f, 0.9f, 0.95f, 0.99f, 0.999999f};
    return pick(s, ps);
}
static float rand_minp(uint64_t *s)
{
    const float ms[] = {0.001f, 0.05f, 0.2f, 0.5f, 0.9f, 1.0f, 1.5f};
    return pick(s, ms);
}

/* Prompt and output tokens with repeats (a small pool) and a few out-of-range ids. */
static void gen_history(rowspec &r, int V, uint64_t *s)
{
    const int maxp = V > 10000 ? 4000 : 200, maxo = V > 10000 ? 600 : 100;
    int np = (int)rint_(s, maxp + 1), no = (int)rint_(s, maxo + 1);
    int32_t pool[30];
    for (int i = 0; i < 30; i++)
        pool[i] = (int32_t)rint_(s, V);
    r.hist.resize(np + no);
    for (int i = 0; i < np + no; i++) {
        uint32_t x = rint_(s, 100);
        r.hist[i] = x < 2 ? (x == 0 ? -3 : V + 7) : x < 50 ? pool[rint_(s, 30)] : (int32_t)rint_(s, V);
    }
    r.n_prompt = np;
    r.p.step = (uint64_t)no;
}

static void gen_penalties(rowspec &r, uint64_t *s)
{
    const float reps[] = {1.f, 1.1f, 1.5f, 0.7f, 2.5f}, press[] = {0.f, 0.4f, -0.5f, 2.f},
                freqs[] = {0.f, 0.1f, 0.7f, -0.2f};
    r.p.repetition_penalty = pick(s, reps);
    r.p.presence_penalty = pick(s, press);
    r.p.frequency_penalty = pick(s, freqs);
}

static void gen_banned(rowspec &r, const float *l, int V, uint64_t *s)
{
    int nb = (int)rint_(s, 11);
    for (int i = 0; i < nb; i++)
        r.banned.push_back((int32_t)rint_(s, V));
    if (rint_(s, 3) == 0)
        r.banned.push_back((int32_t)(std::max_element(l, l + V) - l));
    if (rint_(s, 10) == 0)
        r.banned.push_back(V + 1); /* out of range: ignored */
}

/* A grammar's mask: a few ids, about half of them, or all but a few; sometimes with the argmax. */
static void gen_mask(rowspec &r, const float *l, int V, uint64_t *s)
{
    const int words = (V + 31) / 32;
    uint32_t kind = rint_(s, 3);
    r.mask.assign(words, kind == 2 ? ~0u : 0u);
    int flips = kind == 1 ? V / 2 : 1 + (int)rint_(s, 40);
    for (int i = 0; i < flips; i++) {
        uint32_t t = rint_(s, V);
        r.mask[t >> 5] ^= 1u << (t & 31);
    }
    if (rint_(s, 2)) {
        int32_t am = (int32_t)(std::max_element(l, l + V) - l);
        r.mask[am >> 5] |= 1u << (am & 31);
    }
    if (V & 31) /* bits past V are never read; set them to show it */
        r.mask[words - 1] |= ~0u << (V & 31);
}

/* ---- the comparison */

struct tally {
    int rows = 0, equal = 0, near = 0, err_rows = 0, fail = 0, top_swaps = 0, lp_n = 0, top_n = 0;
    double lp_err = 0, top_err = 0, worst_gap = 0;
};

static sampling_params to_sp(const k_sample_params &p)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = p.temperature, sp.top_p = p.top_p, sp.top_k = p.top_k, sp.min_p = p.min_p;
    sp.repetition_penalty = p.repetition_penalty, sp.presence_penalty = p.presence_penalty;
    sp.frequency_penalty = p.frequency_penalty, sp.seed = p.seed, sp.logprobs = p.logprobs;
    return sp;
}

/* Is the mismatch a near-tie of the pick? Neighbours in the oracle's sorted kept list, with u within
 * TIE_U_TOL of the boundary between them. */
static bool near_tie(samp_ctx *c, const float *logits, int V, const be_seq *s, uint64_t step, int a, int b,
                     double *gap)
{
    std::vector<float> work(logits, logits + V), probs(V);
    std::vector<int32_t> ids(V);
    samp_penalize(c, work.data(), s);
    int n = samp_distribution(c, work.data(), s->sp, ids.data(), probs.data());
    int ra = -1, rb = -1;
    double cum = 0, bound = -1;
    for (int i = 0; i < n; i++) {
        if (ids[i] == a)
            ra = i;
        if (ids[i] == b)
            rb = i;
    }
    *gap = INFINITY;
    if (ra < 0 || rb < 0 || abs(ra - rb) != 1)
        return false;
    for (int i = 0; i <= std::min(ra, rb); i++)
        cum += probs[i];
    bound = cum;
    double u = sampling_uniform(s->sp->seed, step);
    *gap = fabs(u - bound);
    return *gap <= TIE_U_TOL;
}

static void run_batch(const char *name, batch &b)
{
    const int n = b.n, V = b.V;
    /* CSR */
    std::vector<int32_t> hist, hstart(n + 1), nprompt(n), banned, bstart(n + 1), arow(n);
    std::vector<uint32_t> allow;
    std::vector<k_sample_params> params(n);
    for (int r = 0; r < n; r++) {
        arow[r] = b.rows[r].mask.empty() ? -1 : (int32_t)(allow.size() / ((V + 31) / 32));
        allow.insert(allow.end(), b.rows[r].mask.begin(), b.rows[r].mask.end());
        hstart[r] = (int32_t)hist.size();
        bstart[r] = (int32_t)banned.size();
        hist.insert(hist.end(), b.rows[r].hist.begin(), b.rows[r].hist.end());
        banned.insert(banned.end(), b.rows[r].banned.begin(), b.rows[r].banned.end());
        nprompt[r] = b.rows[r].n_prompt;
        params[r] = b.rows[r].p;
    }
    hstart[n] = (int32_t)hist.size();
    bstart[n] = (int32_t)banned.size();
    if (hist.empty())
        hist.push_back(0);
    if (banned.empty())
        banned.push_back(0);
    if (allow.empty())
        allow.push_back(0);

    float *d_logits = gt_to_device(b.logits.data(), (size_t)n * V);
    k_sample_params *d_params = gt_to_device(params.data(), n);
    int32_t *d_hist = gt_to_device(hist.data(), hist.size()), *d_hstart = gt_to_device(hstart.data(), n + 1);
    int32_t *d_np = gt_to_device(nprompt.data(), n);
    int32_t *d_ban = gt_to_device(banned.data(), banned.size()),
            *d_bstart = gt_to_device(bstart.data(), n + 1);
    uint32_t *d_allow = gt_to_device(allow.data(), allow.size());
    int32_t *d_arow = gt_to_device(arow.data(), n);
    int32_t *d_tok = gt_poisoned<int32_t>(n), *d_top = gt_poisoned<int32_t>((size_t)n * 20);
    float *d_lp = gt_poisoned<float>(n), *d_toplp = gt_poisoned<float>((size_t)n * 20);
    size_t wsb = k_sample_workspace(n, V);
    void *ws;
    GPU_OK(cudaMalloc(&ws, wsb));
    GPU_OK(cudaMemset(ws, 0xab, wsb)); /* the workspace needs no initialization: show it */

    K_OK(k_sample(d_logits, n, V, d_params, d_hist, d_hstart, d_np, d_ban, d_bstart, d_allow, d_arow, d_tok, d_lp,
                  d_top, d_toplp, ws, wsb, 0));
    GPU_OK(cudaDeviceSynchronize());
    int32_t *tok = gt_to_host(d_tok, n), *top = gt_to_host(d_top, (size_t)n * 20);
    float *lp = gt_to_host(d_lp, n), *toplp = gt_to_host(d_toplp, (size_t)n * 20);
    /* the logits are the caller's: still the same after the call */
    float *after = gt_to_host(d_logits, (size_t)n * V);
    bool logits_kept = memcmp(after, b.logits.data(), (size_t)n * V * sizeof(float)) == 0;

    samp_ctx *c = samp_new(V);
    tally t;
    for (int r = 0; r < n; r++) {
        const rowspec &rs = b.rows[r];
        const float *l = &b.logits[(size_t)r * V];
        sampling_params sp = to_sp(rs.p);
        be_seq s;
        memset(&s, 0, sizeof s);
        s.tokens = rs.hist.data();
        s.n_prompt = rs.n_prompt;
        s.n_tokens = (int)rs.hist.size();
        s.pos = s.n_tokens, s.n_new = 1, s.sample = true, s.sp = &sp;
        s.banned = rs.banned.data();
        s.n_banned = (int)rs.banned.size();
        s.allowed = rs.mask.empty() ? NULL : rs.mask.data();
        be_out o;
        memset(&o, 0, sizeof o);
        char err[256] = "";
        int rc = samp_sample(c, l, &s, &o, err, sizeof err);
        t.rows++;
        bool row_fail = false;
        if (rc != 0) {
            t.err_rows++;
            if (tok[r] != -1) {
                printf("  FAIL row %d: oracle refuses (%s), GPU token %d\n", r, err, tok[r]);
                row_fail = true;
            }
            if (row_fail)
                t.fail++;
            continue;
        }
        if (tok[r] == o.token) {
            t.equal++;
        } else {
            double gap = INFINITY;
            bool greedy = rs.p.temperature < SAMP_GREEDY_EPS;
            if (!greedy && tok[r] >= 0 && tok[r] < V &&
                near_tie(c, l, V, &s, rs.p.step, o.token, tok[r], &gap)) {
                t.near++;
                t.worst_gap = std::max(t.worst_gap, gap);
                printf("  near-tie row %d: oracle %d, GPU %d, |u - boundary| %.2e\n", r, o.token, tok[r],
                       gap);
            } else {
                printf("  FAIL row %d: oracle token %d, GPU %d (T %g top_k %d top_p %g min_p %g rep %g pres "
                       "%g freq "
                       "%g hist %zu/%d banned %zu seed %llu step %llu; |u - boundary| %.2e)\n",
                       r, o.token, tok[r], rs.p.temperature, rs.p.top_k, rs.p.top_p, rs.p.min_p,
                       rs.p.repetition_penalty, rs.p.presence_penalty, rs.p.frequency_penalty, rs.hist.size(),
                       rs.n_prompt, rs.banned.size(), (unsigned long long)rs.p.seed,
                       (unsigned long long)rs.p.step, gap);
                row_fail = true;
            }
        }
        if (rs.p.logprobs >= 0) {
            /* the logprob of the GPU's own token, against the oracle's log-softmax at that token */
            be_out o2;
            samp_logprobs(l, V, tok[r] >= 0 && tok[r] < V ? tok[r] : o.token, rs.p.logprobs, &o2);
            double d = fabs((double)lp[r] - (double)o2.logprob);
            if (!(d <= LP_TOL)) {
                printf("  FAIL row %d: logprob %.7g, oracle %.7g\n", r, lp[r], o2.logprob);
                row_fail = true;
            }
            if (std::isfinite(d))
                t.lp_err = std::max(t.lp_err, d);
            t.lp_n++;
            for (int j = 0; j < 20; j++) {
                int gi = top[(size_t)r * 20 + j];
                float gl = toplp[(size_t)r * 20 + j];
                if (j >= o.n_top) {
                    if (gi != -1 || gl != -INFINITY) {
                        printf("  FAIL row %d: top entry %d past n_top %d is (%d, %g), want (-1, -inf)\n", r,
                               j, o.n_top, gi, gl);
                        row_fail = true;
                    }
                    continue;
                }
                t.top_n++;
                if (gi != o.top_ids[j]) {
                    bool swap_ok = gi >= 0 && gi < V && fabs((double)l[gi] - (double)l[o.top_ids[j]]) <= 1e-6;
                    if (swap_ok) {
                        t.top_swaps++;
                    } else {
                        printf("  FAIL row %d: top[%d] id %d, oracle %d\n", r, j, gi, o.top_ids[j]);
                        row_fail = true;
                    }
                }
                double dl = fabs((double)gl - (double)o.top_logprobs[j]);
                if (std::isinf(gl) && std::isinf(o.top_logprobs[j]) && gl == o.top_logprobs[j])
                    dl = 0;
                if (!(dl <= LP_TOL)) {
                    printf("  FAIL row %d: top[%d] logprob %.7g, oracle %.7g\n", r, j, gl, o.top_logprobs[j]);
                    row_fail = true;
                }
                if (std::isfinite(dl))
                    t.top_err = std::max(t.top_err, dl);
            }
        } else if (lp[r] != 0.f) {
            printf("  FAIL row %d: logprobs off, logprob %g (want 0)\n", r, lp[r]);
            row_fail = true;
        }
        if (row_fail)
            t.fail++;
    }
    samp_free(c);
    bool ok = t.fail == 0;
    printf("%s %-30s V %6d rows %4d: tokens equal %4d, near-ties %d (max |u-b| %.1e, tol %.0e), refused %d; "
           "logprob max|d| %.1e over %d, top max|d| %.1e over %d (tol %.0e), top swaps within 1e-6 %d%s\n",
           ok ? "ok  " : "FAIL", name, V, t.rows, t.equal, t.near, t.worst_gap, TIE_U_TOL, t.err_rows,
           t.lp_err, t.lp_n, t.top_err, t.top_n, LP_TOL, t.top_swaps,
           logits_kept ? "" : "; logits modified in place (allowed)");
    fflush(stdout);
    if (!ok)
        failures++;
    free(tok), free(top), free(lp), free(toplp), free(after);
    cudaFree(d_logits), cudaFree(d_params), cudaFree(d_hist), cudaFree(d_hstart), cudaFree(d_np);
    cudaFree(d_ban), cudaFree(d_bstart), cudaFree(d_allow), cudaFree(d_arow), cudaFree(d_tok), cudaFree(d_top), cudaFree(d_lp), cudaFree(d_toplp);
    cudaFree(ws);
}

/* ---- the cases */

enum {
    C_GREEDY,
    C_TEMP,
    C_TOPK,
    C_TOPP,
    C_MINP,
    C_COMBO,
    C_PENALTY,
    C_TIES,
    C_MASKED,
};

static const char *case_name(int k)
{
    static const char *names[] = {"greedy (planted ties, -0/+0)",
                                  "temperature only",
                                  "top_k",
                                  "top_p",
                                  "min_p",
                                  "top_k+top_p+min_p",
                                  "penalties+banned",
                                  "ties (quantized, constant)",
                                  "masked vocab (-inf)"};
    return names[k];
}

static void make_row(int kind, int V, uint64_t *s, float *l, rowspec &r)
{
    r.p = base_params(s);
    int lk = L_NORMAL;
    switch (kind) {
    case C_GREEDY: {
        const int kinds[] = {L_NORMAL, L_TIEMAX, L_TIEMAX, L_QUANT, L_ZEROS, L_CONST, L_SPIKE};
        lk = pick(s, kinds);
        const float ts[] = {0.f, 1e-6f, 9.99e-6f};
        r.p.temperature = pick(s, ts);
        if (rint_(s, 3) == 0)
            r.p.top_k = 1 + rint_(s, 50), r.p.top_p = 0.5f; /* ignored when greedy */
        break;
    }
    case C_TEMP:
        r.p.temperature = rand_temp(s);
        lk = rint_(s, 4) == 0 ? L_SPIKE : L_NORMAL;
        break;
    case C_TOPK:
        r.p.temperature = rand_temp(s);
        r.p.top_k = rand_topk(s, V);
        break;
    case C_TOPP:
        r.p.temperature = rand_temp(s);
        r.p.top_p = rand_topp(s);
        break;
    case C_MINP:
        r.p.temperature = rand_temp(s);
        r.p.min_p = rand_minp(s);
        break;
    case C_COMBO:
        r.p.temperature = rand_temp(s);
        if (rint_(s, 4))
            r.p.top_k = rand_topk(s, V);
        if (rint_(s, 4))
            r.p.top_p = rand_topp(s);
        if (rint_(s, 2))
            r.p.min_p = rand_minp(s);
        lk = rint_(s, L_NKINDS);
        break;
    case C_PENALTY:
        r.p.temperature = rint_(s, 4) == 0 ? 0.f : rand_temp(s);
        if (rint_(s, 2))
            r.p.top_p = rand_topp(s);
        if (rint_(s, 2))
            r.p.top_k = rand_topk(s, V);
        break;
    case C_TIES: {
        const int kinds[] = {L_QUANT, L_QUANT, L_QUANT, L_CONST};
        lk = pick(s, kinds);
        r.p.temperature = rint_(s, 5) == 0 ? 0.f : rand_temp(s);
        if (rint_(s, 2))
            r.p.top_k = rand_topk(s, V);
        if (rint_(s, 2))
            r.p.top_p = rand_topp(s);
        if (rint_(s, 3) == 0)
            r.p.min_p = rand_minp(s);
        break;
    }
    case C_MASKED:
        lk = L_MASKED;
        r.p.temperature = rint_(s, 5) == 0 ? 0.f : rand_temp(s);
        if (rint_(s, 2))
            r.p.top_k = rand_topk(s, V);
        if (rint_(s, 2))
            r.p.top_p = rand_topp(s);
        break;
    }
    gen_logits(l, V, s, lk);
    if (kind == C_PENALTY) {
        gen_history(r, V, s);
        gen_penalties(r, s);
        gen_banned(r, l, V, s);
    } else if (rint_(s, 3) == 0) {
        gen_history(r, V, s); /* a history without penalties changes only the draw's step */
    }
    if (rint_(s, 4) == 0)
        gen_mask(r, l, V, s);
}

static void run_kind(int kind, int V, int n, uint64_t seed)
{
    uint64_t s = seed;
    batch b;
    b.n = n, b.V = V;
    b.logits.resize((size_t)n * V);
    b.rows.resize(n);
    for (int r = 0; r < n; r++)
        make_row(kind, V, &s, &b.logits[(size_t)r * V], b.rows[r]);
    run_batch(case_name(kind), b);
}

/* The same logits row under n different seeds: the pick swept over u. */
static void run_seed_sweep(int V, int n, const char *what, float T, int top_k, float top_p, float min_p,
                           int lk, uint64_t seed)
{
    uint64_t s = seed;
    batch b;
    b.n = n, b.V = V;
    b.logits.resize((size_t)n * V);
    b.rows.resize(n);
    gen_logits(b.logits.data(), V, &s, lk);
    for (int r = 0; r < n; r++) {
        if (r)
            memcpy(&b.logits[(size_t)r * V], b.logits.data(), (size_t)V * sizeof(float));
        b.rows[r].p = base_params(&s);
        b.rows[r].p.temperature = T, b.rows[r].p.top_k = top_k, b.rows[r].p.top_p = top_p,
        b.rows[r].p.min_p = min_p;
        b.rows[r].p.step = rint_(&s, 1000);
        b.rows[r].hist.assign((size_t)b.rows[r].p.step, 1);
        b.rows[r].n_prompt = 0;
    }
    run_batch(what, b);
}

/* Rows the oracle refuses, between ordinary rows. */
static void run_errors(int V, uint64_t seed)
{
    uint64_t s = seed;
    const int n = 8;
    batch b;
    b.n = n, b.V = V;
    b.logits.resize((size_t)n * V);
    b.rows.resize(n);
    for (int r = 0; r < n; r++) {
        float *l = &b.logits[(size_t)r * V];
        gen_logits(l, V, &s, L_NORMAL);
        b.rows[r].p = base_params(&s);
        b.rows[r].p.temperature = (r & 1) ? 0.f : 0.8f;
        switch (r) {
        case 0:
            l[rint_(&s, V)] = NAN;
            break;
        case 1:
            l[rint_(&s, V)] = INFINITY;
            break;
        case 2:
        case 3:
            for (int i = 0; i < V; i++)
                l[i] = -INFINITY;
            break;
        case 4:
        case 5: /* every id banned */
            for (int i = 0; i < V; i++)
                b.rows[r].banned.push_back(i);
            break;
        default:
            break; /* ordinary rows */
        }
    }
    run_batch("refused rows (NaN, inf, banned)", b);
}

/* ---- timing: 256 rows x 151936 (and one row), the median of 20 launches after warm-up */

static void time_case(const char *what, int n, int V, float *d_logits,
                      const std::vector<k_sample_params> &params, int hist_len, uint64_t *s)
{
    std::vector<int32_t> hist((size_t)n * hist_len + 1), hstart(n + 1), np(n), bstart(n + 1, 0), banned(1, 0);
    for (size_t i = 0; i < hist.size(); i++)
        hist[i] = (int32_t)rint_(s, V);
    for (int r = 0; r <= n; r++)
        hstart[r] = r * hist_len;
    for (int r = 0; r < n; r++)
        np[r] = hist_len / 2;
    k_sample_params *d_params = gt_to_device(params.data(), n);
    int32_t *d_hist = gt_to_device(hist.data(), hist.size()), *d_hstart = gt_to_device(hstart.data(), n + 1);
    int32_t *d_np = gt_to_device(np.data(), n), *d_bstart = gt_to_device(bstart.data(), n + 1);
    int32_t *d_ban = gt_to_device(banned.data(), 1);
    int32_t *d_tok = gt_poisoned<int32_t>(n), *d_top = gt_poisoned<int32_t>((size_t)n * 20);
    float *d_lp = gt_poisoned<float>(n), *d_toplp = gt_poisoned<float>((size_t)n * 20);
    size_t wsb = k_sample_workspace(n, V);
    void *ws;
    GPU_OK(cudaMalloc(&ws, wsb));
    cudaEvent_t e0, e1;
    GPU_OK(cudaEventCreate(&e0));
    GPU_OK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int it = 0; it < 23; it++) {
        GPU_OK(cudaEventRecord(e0));
        K_OK(k_sample(d_logits, n, V, d_params, d_hist, d_hstart, d_np, d_ban, d_bstart, NULL, NULL, d_tok, d_lp,
                      d_top, d_toplp, ws, wsb, 0));
        GPU_OK(cudaEventRecord(e1));
        GPU_OK(cudaEventSynchronize(e1));
        float t;
        GPU_OK(cudaEventElapsedTime(&t, e0, e1));
        if (it >= 3)
            ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    int32_t *tok = gt_to_host(d_tok, n);
    int bad = 0;
    for (int r = 0; r < n; r++)
        bad += tok[r] < 0 || tok[r] >= V;
    double med = ms[ms.size() / 2], gbs = (double)n * V * 4 / (med * 1e-3) / 1e9;
    printf("time %-44s %d x %d: median %8.1f us (min %8.1f), %6.0f GB/s of logits read once = %4.1f%% of 4.2 "
           "TB/s%s\n",
           what, n, V, med * 1e3, ms[0] * 1e3, gbs, gbs / 4200 * 100, bad ? "  (BAD TOKENS)" : "");
    if (bad)
        failures++;
    fflush(stdout);
    free(tok);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d_params), cudaFree(d_hist), cudaFree(d_hstart), cudaFree(d_np), cudaFree(d_bstart),
        cudaFree(d_ban);
    cudaFree(d_tok), cudaFree(d_top), cudaFree(d_lp), cudaFree(d_toplp), cudaFree(ws);
}

static void run_timing(uint64_t seed)
{
    const int n = 256, V = VBIG;
    uint64_t s = seed;
    std::vector<float> h((size_t)n * V);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = gt_normal(&s) * 2.f;
    float *d_logits = gt_to_device(h.data(), h.size());
    std::vector<k_sample_params> p(n);
    auto set = [&](float T, int k, float tp, float mp, int lp, float rep, float pres, float freq) {
        for (int r = 0; r < n; r++) {
            p[r] = base_params(&s);
            p[r].temperature = T, p[r].top_k = k, p[r].top_p = tp, p[r].min_p = mp, p[r].logprobs = lp;
            p[r].repetition_penalty = rep, p[r].presence_penalty = pres, p[r].frequency_penalty = freq;
        }
    };
    set(0.f, 0, 1.f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("greedy", n, V, d_logits, p, 0, &s);
    set(0.f, 0, 1.f, 0.f, 20, 1.f, 0.f, 0.f);
    time_case("greedy, logprobs 20", n, V, d_logits, p, 0, &s);
    set(0.7f, 50, 0.9f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("T 0.7, top_k 50, top_p 0.9", n, V, d_logits, p, 0, &s);
    set(0.7f, 0, 0.9f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("T 0.7, top_p 0.9", n, V, d_logits, p, 0, &s);
    set(1.f, 0, 1.f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("T 1 (no cut)", n, V, d_logits, p, 0, &s);
    set(1.f, 0, 0.95f, 0.05f, 5, 1.f, 0.f, 0.f);
    time_case("T 1, top_p 0.95, min_p 0.05, logprobs 5", n, V, d_logits, p, 0, &s);
    set(0.7f, 50, 0.9f, 0.f, -1, 1.1f, 0.5f, 0.2f);
    time_case("T 0.7, top_k 50, top_p 0.9, penalties (hist 1024)", n, V, d_logits, p, 1024, &s);
    /* one row (single-sequence decode: one CTA per kernel, the sampler's latency per token; the two
     * launches' overhead included) */
    set(0.f, 0, 1.f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("greedy, one row", 1, V, d_logits, p, 0, &s);
    set(0.f, 0, 1.f, 0.f, 20, 1.f, 0.f, 0.f);
    time_case("greedy, logprobs 20, one row", 1, V, d_logits, p, 0, &s);
    set(0.7f, 50, 0.9f, 0.f, -1, 1.f, 0.f, 0.f);
    time_case("T 0.7, top_k 50, top_p 0.9, one row", 1, V, d_logits, p, 0, &s);
    cudaFree(d_logits);
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();

    /* k_sample's argument checks */
    {
        alignas(16) char dummy[64];
        int32_t *t = (int32_t *)dummy;
        if (k_sample((float *)dummy, 1, 0, (k_sample_params *)dummy, NULL, NULL, NULL, NULL, NULL, NULL, NULL, t,
                     NULL,
                     NULL, NULL, dummy, 64, 0) == 0 ||
            k_sample((float *)dummy, 4, 1000, (k_sample_params *)dummy, NULL, NULL, NULL, NULL, NULL, NULL, NULL, t,
                     NULL,
                     NULL, NULL, dummy, 64, 0) == 0) {
            printf("FAIL argument checks: a bad V or a short workspace was accepted\n");
            failures++;
        } else {
            printf("ok   argument checks (%s)\n", k_last_error());
        }
    }

    uint64_t k = 1;
    const int small_v[] = {50, 1000, 4099};
    for (int vi = 0; vi < 3; vi++)
        for (int kind = C_GREEDY; kind <= C_MASKED; kind++)
            run_kind(kind, small_v[vi], 256, case_seed(k++));
    for (int kind = C_GREEDY; kind <= C_MASKED; kind++)
        run_kind(kind, VBIG, kind == C_COMBO || kind == C_TIES || kind == C_PENALTY ? 160 : 96,
                 case_seed(k++));
    /* few rows: each row's stats pass split over 12-32 CTAs (stats_parts in kernels/sampling.cu); an odd
       V takes the scalar loads */
    for (int kind = C_GREEDY; kind <= C_MASKED; kind++)
        run_kind(kind, kind & 1 ? VBIG : 50001, 1 + (kind % 4) * 3, case_seed(k++));
    for (int vi = 0; vi < 2; vi++) {
        const int V = vi ? VBIG : 1000, n = vi ? 128 : 256;
        run_seed_sweep(V, n, "sweep T 0.8 top_p 0.9", 0.8f, 0, 0.9f, 0.f, L_NORMAL, case_seed(k++));
        run_seed_sweep(V, n, "sweep T 1 (flat)", 1.f, 0, 1.f, 0.f, L_NORMAL, case_seed(k++));
        run_seed_sweep(V, n, "sweep T 0.7 top_k 50 top_p 0.95", 0.7f, 50, 0.95f, 0.f, L_NORMAL,
                       case_seed(k++));
        run_seed_sweep(V, n, "sweep quantized T 1 top_p 0.7", 1.f, 0, 0.7f, 0.f, L_QUANT, case_seed(k++));
        run_seed_sweep(V, n, "sweep constant T 1", 1.f, 0, 1.f, 0.f, L_CONST, case_seed(k++));
        run_seed_sweep(V, n, "sweep constant top_k 5000 top_p 0.3", 1.f, 5000, 0.3f, 0.f, L_CONST,
                       case_seed(k++));
    }
    run_errors(50, case_seed(k++));
    run_errors(VBIG, case_seed(k++));

    run_timing(case_seed(k++));

    printf("%s: %d failing case(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
