/* The reference sampler (see sampler.h for the exact semantics). */
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sampling_params sampling_params_default(void)
{
    return (struct sampling_params){
        .temperature = 1.0f,
        .top_p = 1.0f,
        .top_k = 0,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
        .logprobs = -1,
    };
}

/* splitmix64's finalizer (Steele, Lea, Flood 2014) applied to z + golden gamma. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* u = top 53 bits of mix64(mix64(seed) ^ step), times 2^-53. Every backend computes exactly this. */
double sampling_uniform(uint64_t seed, uint64_t step)
{
    uint64_t x = mix64(mix64(seed) ^ step);
    return (double)(x >> 11) * 0x1.0p-53;
}

/* ---- scratch */

struct cand {
    float p; /* unnormalized probability, > 0 */
    int32_t id;
};

struct samp_ctx {
    int vocab;
    float *work;       /* [vocab] penalized logits */
    struct cand *cand; /* [vocab] */
    uint32_t *count;   /* [vocab] output counts, zero between calls */
    uint8_t *seen;     /* [vocab] repetition marks, zero between calls */
};

struct samp_ctx *samp_new(int vocab)
{
    if (vocab <= 0)
        return NULL;
    struct samp_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->vocab = vocab;
    c->work = malloc((size_t)vocab * sizeof *c->work);
    c->cand = malloc((size_t)vocab * sizeof *c->cand);
    c->count = calloc((size_t)vocab, sizeof *c->count);
    c->seen = calloc((size_t)vocab, sizeof *c->seen);
    if (!c->work || !c->cand || !c->count || !c->seen) {
        samp_free(c);
        return NULL;
    }
    return c;
}

void samp_free(struct samp_ctx *c)
{
    if (!c)
        return;
    free(c->work);
    free(c->cand);
    free(c->count);
    free(c->seen);
    free(c);
}

/* ---- selection over candidates in the order (p descending, id ascending) */

static inline bool before(struct cand a, struct cand b)
{
    return a.p > b.p || (a.p == b.p && a.id < b.id);
}

static inline void cswap(struct cand *a, int i, int j)
{
    struct cand t = a[i];
    a[i] = a[j];
    a[j] = t;
}

static void cand_isort(struct cand *a, int n)
{
    for (int i = 1; i < n; i++) {
        struct cand x = a[i];
        int j = i;
        while (j > 0 && before(x, a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    return before(*a, *b) ? -1 : before(*b, *a) ? 1 : 0;
}

/* Partitions a[lo, hi) (hi - lo >= 3) around a median-of-three pivot: afterwards a[lo, m) come
 * before a[m] and a[m + 1, hi) after it. Returns m. The order is total (ids are distinct). */
static int partition(struct cand *a, int lo, int hi)
{
    int mid = lo + (hi - lo) / 2, last = hi - 1, pi;
    if (before(a[lo], a[mid]))
        pi = before(a[mid], a[last]) ? mid : before(a[lo], a[last]) ? last : lo;
    else
        pi = before(a[lo], a[last]) ? lo : before(a[mid], a[last]) ? last : mid;
    cswap(a, pi, last);
    struct cand piv = a[last];
    int s = lo;
    for (int i = lo; i < last; i++)
        if (before(a[i], piv))
            cswap(a, i, s++);
    cswap(a, s, last);
    return s;
}

#define SMALL 16

/* Rearranges a[0, n) so that a[0, k) are its k first elements in order (0 < k <= n). */
static void select_top(struct cand *a, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > SMALL) {
        int m = partition(a, lo, hi);
        if (m == k || m == k - 1)
            return;
        if (m < k)
            lo = m + 1;
        else
            hi = m;
    }
    cand_isort(a + lo, hi - lo);
}

/* The smallest prefix (in order) of a[0, n) whose mass reaches `target` (mass > target when
 * strict, >= otherwise): rearranges a so that the prefix is a[0, r) with a[r - 1] its last
 * element in order, and returns r (1 <= r <= n; n when rounding keeps the target out of reach). */
static int weighted_select(struct cand *a, int n, double target, bool strict)
{
    if (!strict && target <= 0) {
        select_top(a, n, 1);
        return 1;
    }
#define REACHED(v) (strict ? (v) > target : (v) >= target)
    double acc = 0; /* mass of a[0, lo) */
    int lo = 0, hi = n;
    while (hi - lo > SMALL) {
        int m = partition(a, lo, hi);
        double g = 0;
        for (int i = lo; i < m; i++)
            g += a[i].p;
        if (REACHED(acc + g)) {
            hi = m;
            continue;
        }
        acc += g;
        if (REACHED(acc + a[m].p))
            return m + 1;
        acc += a[m].p;
        lo = m + 1;
    }
    cand_isort(a + lo, hi - lo);
    for (int i = lo; i < hi; i++) {
        acc += a[i].p;
        if (REACHED(acc))
            return i + 1;
    }
    return hi > 0 ? hi : 1;
#undef REACHED
}

static double cand_mass(const struct cand *a, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i].p;
    return s;
}

/* ---- the steps */

void samp_logprobs(const float *logits, int vocab, int32_t token, int n_top, struct be_out *out)
{
    float lmax = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > lmax)
            lmax = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - (double)lmax);
    double lse = (double)lmax + log(sum);
    out->logprob = (token >= 0 && token < vocab) ? (float)((double)logits[token] - lse) : -INFINITY;

    if (n_top > SAMPLING_MAX_LOGPROBS)
        n_top = SAMPLING_MAX_LOGPROBS;
    if (n_top > vocab)
        n_top = vocab;
    if (n_top < 0)
        n_top = 0;
    int n = 0;
    float best[SAMPLING_MAX_LOGPROBS];
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float l = logits[i];
        if (n == n_top && !(l > best[n - 1])) /* ids ascend, so a tie never displaces */
            continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && l > best[j - 1]) {
            best[j] = best[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        best[j] = l;
        out->top_ids[j] = i;
    }
    out->n_top = n;
    for (int j = 0; j < n; j++)
        out->top_logprobs[j] = (float)((double)best[j] - lse);
}

void samp_penalize(struct samp_ctx *c, float *logits, const struct be_seq *s)
{
    const struct sampling_params *sp = s->sp;
    const int V = c->vocab;
    float rep = sp->repetition_penalty;
    if (rep > 0 && rep != 1.0f) {
        for (int i = 0; i < s->n_tokens; i++) {
            int32_t t = s->tokens[i];
            if (t < 0 || t >= V || c->seen[t])
                continue;
            c->seen[t] = 1;
            logits[t] = logits[t] > 0 ? logits[t] / rep : logits[t] * rep;
        }
        for (int i = 0; i < s->n_tokens; i++) {
            int32_t t = s->tokens[i];
            if (t >= 0 && t < V)
                c->seen[t] = 0;
        }
    }
    if (sp->presence_penalty != 0 || sp->frequency_penalty != 0) {
        for (int i = s->n_prompt; i < s->n_tokens; i++) {
            int32_t t = s->tokens[i];
            if (t >= 0 && t < V)
                c->count[t]++;
        }
        for (int i = s->n_prompt; i < s->n_tokens; i++) {
            int32_t t = s->tokens[i];
            if (t < 0 || t >= V || !c->count[t])
                continue; /* out of range, or already applied */
            logits[t] -= sp->frequency_penalty * (float)c->count[t];
            logits[t] -= sp->presence_penalty;
            c->count[t] = 0;
        }
    }
    for (int i = 0; i < s->n_banned; i++) {
        int32_t t = s->banned[i];
        if (t >= 0 && t < V)
            logits[t] = -INFINITY;
    }
    if (s->allowed)
        for (int i = 0; i < V; i++)
            if (!((s->allowed[i >> 5] >> (i & 31)) & 1u))
                logits[i] = -INFINITY;
}

static int argmax(const float *l, int V)
{
    int best = -1;
    float bl = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > bl) {
            bl = l[i];
            best = i;
        }
    return best;
}

/* Steps 3-4 without sorting: the kept candidates into c->cand[0, n), their mass into *total.
 * Returns n (0 when nothing is finite). Not for greedy. */
static int build_kept(struct samp_ctx *c, const float *logits, const struct sampling_params *sp,
                      double *total)
{
    const int V = c->vocab;
    float lmax = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > lmax)
            lmax = logits[i];
    *total = 0;
    if (lmax == -INFINITY)
        return 0;
    double inv_t = 1.0 / (double)sp->temperature;
    struct cand *a = c->cand;
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] == -INFINITY)
            continue;
        float p = (float)exp((double)(logits[i] - lmax) * inv_t);
        if (p > 0)
            a[n++] = (struct cand){p, i};
    }
    double mass = cand_mass(a, n);
    if (sp->top_k > 0 && sp->top_k < n) {
        select_top(a, n, sp->top_k);
        n = sp->top_k;
        mass = cand_mass(a, n);
    }
    if (sp->top_p < 1.0f) {
        n = weighted_select(a, n, (double)sp->top_p * mass, false);
        mass = cand_mass(a, n);
    }
    if (sp->min_p > 0) {
        float pmax = 0;
        for (int i = 0; i < n; i++)
            if (a[i].p > pmax)
                pmax = a[i].p;
        float thr = sp->min_p * pmax < pmax ? sp->min_p * pmax : pmax; /* min_p > 1 keeps the maximum */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (a[i].p >= thr)
                a[k++] = a[i];
        n = k;
        mass = cand_mass(a, n);
    }
    *total = mass;
    return n;
}

int samp_distribution(struct samp_ctx *c, const float *logits, const struct sampling_params *sp, int32_t *ids,
                      float *probs)
{
    if (sp->temperature < SAMP_GREEDY_EPS) {
        int t = argmax(logits, c->vocab);
        if (t < 0)
            return 0;
        ids[0] = t;
        probs[0] = 1.0f;
        return 1;
    }
    double total;
    int n = build_kept(c, logits, sp, &total);
    qsort(c->cand, (size_t)n, sizeof *c->cand, cand_cmp);
    for (int i = 0; i < n; i++) {
        ids[i] = c->cand[i].id;
        probs[i] = (float)(c->cand[i].p / total);
    }
    return n;
}

int samp_sample(struct samp_ctx *c, const float *logits, const struct be_seq *s, struct be_out *out,
                char *err, size_t errlen)
{
    const struct sampling_params *sp = s->sp;
    const int V = c->vocab;
    bool any = false;
    for (int i = 0; i < V; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            snprintf(err, errlen, "logit of id %d is %f", i, (double)logits[i]);
            return -1;
        }
        any |= logits[i] != -INFINITY;
    }
    if (!any) {
        snprintf(err, errlen, "every logit is -inf");
        return -1;
    }
    memcpy(c->work, logits, (size_t)V * sizeof *logits);
    samp_penalize(c, c->work, s);

    int32_t tok;
    if (sp->temperature < SAMP_GREEDY_EPS) {
        tok = argmax(c->work, V);
    } else {
        double total;
        int n = build_kept(c, c->work, sp, &total);
        if (n == 0) {
            tok = -1;
        } else {
            double u = sampling_uniform(sp->seed, (uint64_t)(s->n_tokens - s->n_prompt));
            int r = weighted_select(c->cand, n, u * total, true);
            tok = c->cand[r - 1].id;
        }
    }
    if (tok < 0) {
        snprintf(err, errlen, "no id can be sampled: %d banned%s, every other logit is -inf", s->n_banned,
                 s->allowed ? " and the rest outside the grammar's mask" : "");
        return -1;
    }
    out->token = tok;
    if (sp->logprobs >= 0) {
        samp_logprobs(logits, V, tok, sp->logprobs, out);
    } else {
        out->logprob = 0;
        out->n_top = 0;
    }
    return 0;
}
