/* engine/sampler: every step against a brute-force reference written here in double precision
 * (full sorts, direct formulas), plus the distribution of temperature sampling over many seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

/* ---- helpers */

static uint64_t rng_state = 12345;
static double rnd(void) /* xorshift64*, [0, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int V, double spread)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)((rnd() * 2 - 1) * spread);
}

static struct be_seq seq_of(const struct sampling_params *sp, const int32_t *tokens, int n_prompt,
                            int n_tokens)
{
    struct be_seq s = {0};
    s.tokens = tokens;
    s.n_prompt = n_prompt;
    s.n_tokens = n_tokens;
    s.pos = n_tokens - 1;
    s.n_new = 1;
    s.sample = true;
    s.sp = sp;
    return s;
}

static int sample(struct samp_ctx *c, const float *logits, const struct be_seq *s)
{
    struct be_out o;
    char err[256] = "";
    if (samp_sample(c, logits, s, &o, err, sizeof err) != 0) {
        print_error("samp_sample failed: %s\n", err);
        fail();
    }
    return o.token;
}

struct ref_item {
    double p;
    int id;
};
static int ref_cmp(const void *a, const void *b)
{
    const struct ref_item *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

/* The kept set of steps 3-4 by brute force: full sort, then the filters in order. Probabilities
 * are renormalized. Returns n; items[] sorted by descending p, ties by id. */
static int ref_kept(const float *l, int V, const struct sampling_params *sp, struct ref_item *items)
{
    double mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > mx)
            mx = l[i];
    int n = 0;
    for (int i = 0; i < V; i++)
        if (l[i] != -INFINITY)
            items[n++] = (struct ref_item){exp(((double)l[i] - mx) / sp->temperature), i};
    qsort(items, (size_t)n, sizeof *items, ref_cmp);
    if (sp->top_k > 0 && sp->top_k < n)
        n = sp->top_k;
    if (sp->top_p < 1) {
        double tot = 0, cum = 0;
        for (int i = 0; i < n; i++)
            tot += items[i].p;
        int k = 0;
        while (k < n) {
            cum += items[k].p;
            k++;
            if (cum >= sp->top_p * tot)
                break;
        }
        n = k;
    }
    if (sp->min_p > 0) {
        double thr = sp->min_p * items[0].p;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (items[i].p >= thr)
                items[k++] = items[i];
        n = k;
    }
    double tot = 0;
    for (int i = 0; i < n; i++)
        tot += items[i].p;
    for (int i = 0; i < n; i++)
        items[i].p /= tot;
    return n;
}

/* Inverse CDF over the kept set: the first item whose cumulative probability exceeds u. Sets
 * *near when u lies within 1e-6 of a boundary (float and double may then disagree). */
static int ref_pick(const struct ref_item *items, int n, double u, int *near)
{
    double cum = 0;
    *near = 0;
    for (int i = 0; i < n; i++) {
        cum += items[i].p;
        if (fabs(cum - u) < 1e-6)
            *near = 1;
        if (cum > u)
            return items[i].id;
    }
    return items[n - 1].id;
}

/* ---- sampling_uniform */

static void test_uniform(void **state)
{
    (void)state;
    /* The documented formula, written out: u = (mix(mix(seed) ^ step) >> 11) * 2^-53 with
     * splitmix64's mix; the GPU sampler must reproduce these values exactly. */
    uint64_t seed = 0x0123456789abcdefull, step = 42;
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = (z ^ (z >> 31)) ^ step;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = z ^ (z >> 31);
    assert_true(sampling_uniform(seed, step) == (double)(z >> 11) / 9007199254740992.0);

    double sum = 0, lo = 1, hi = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = sampling_uniform((uint64_t)(i / 100), (uint64_t)(i % 100));
        assert_true(u >= 0 && u < 1);
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    /* mean of n uniforms: sd 1/sqrt(12 n) ~ 6.5e-4; 8 sd */
    assert_true(fabs(sum / n - 0.5) < 5e-3);
    assert_true(lo < 1e-3 && hi > 1 - 1e-3);
    assert_true(sampling_uniform(1, 0) != sampling_uniform(2, 0));
    assert_true(sampling_uniform(1, 0) != sampling_uniform(1, 1));
    assert_true(sampling_uniform(7, 3) == sampling_uniform(7, 3));

    struct sampling_params d = sampling_params_default();
    assert_true(d.temperature == 1.0f && d.top_p == 1.0f && d.top_k == 0 && d.min_p == 0.0f);
    assert_true(d.repetition_penalty == 1.0f && d.presence_penalty == 0 && d.frequency_penalty == 0);
    assert_int_equal(d.logprobs, -1);
    assert_true(d.seed == 0);
}

/* ---- greedy */

static void test_greedy_ties(void **state)
{
    (void)state;
    struct samp_ctx *c = samp_new(6);
    assert_non_null(c);
    float l[6] = {1, 5, 3, 5, -2, 5};
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 0;
    int32_t toks[1] = {0};
    struct be_seq s = seq_of(&sp, toks, 1, 1);
    assert_int_equal(sample(c, l, &s), 1);
    int32_t ban[2] = {1, 5};
    s.banned = ban;
    s.n_banned = 1;
    assert_int_equal(sample(c, l, &s), 3);
    s.n_banned = 2;
    assert_int_equal(sample(c, l, &s), 3);
    /* very small temperatures are greedy too */
    sp.temperature = 1e-7f;
    s.n_banned = 0;
    assert_int_equal(sample(c, l, &s), 1);
    /* everything banned or -inf: an error, not a token */
    float m[6] = {-INFINITY, -INFINITY, 2, -INFINITY, -INFINITY, -INFINITY};
    int32_t ban2[1] = {2};
    s.banned = ban2;
    s.n_banned = 1;
    struct be_out o;
    char err[256] = "";
    assert_int_equal(samp_sample(c, m, &s, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "no id can be sampled"));
    sp.temperature = 1;
    assert_int_equal(samp_sample(c, m, &s, &o, err, sizeof err), -1);
    float nan_l[6] = {0, 1, NAN, 0, 0, 0};
    s.n_banned = 0;
    assert_int_equal(samp_sample(c, nan_l, &s, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "id 2"));
    samp_free(c);
    samp_free(NULL);
}

/* ---- temperature: the empirical distribution over many seeds against the exact softmax */

static void test_temperature_distribution(void **state)
{
    (void)state;
    enum { V = 6, N = 30000 };
    const float l[V] = {0.3f, -1.2f, 2.0f, 0.0f, 1.1f, -0.4f};
    struct samp_ctx *c = samp_new(V);
    const float temps[3] = {0.7f, 1.0f, 1.8f};
    for (int ti = 0; ti < 3; ti++) {
        struct sampling_params sp = sampling_params_default();
        sp.temperature = temps[ti];
        double p[V], z = 0;
        for (int i = 0; i < V; i++)
            z += p[i] = exp(l[i] / (double)sp.temperature);
        int count[V] = {0};
        int32_t toks[64] = {0};
        for (int k = 0; k < N; k++) {
            /* seeds and steps both vary: n_output = n_tokens - n_prompt = k % 50 */
            sp.seed = (uint64_t)(k / 50) * 7919 + (uint64_t)ti;
            struct be_seq s = seq_of(&sp, toks, 1, 1 + k % 50);
            count[sample(c, l, &s)]++;
        }
        double chi2 = 0;
        for (int i = 0; i < V; i++) {
            double e = N * p[i] / z;
            chi2 += (count[i] - e) * (count[i] - e) / e;
        }
        /* 5 degrees of freedom: P(chi2 > 30) ~ 1.5e-5; the seeds are fixed so this cannot flake */
        if (chi2 > 30) {
            print_error("temperature %g: chi2 %.2f\n", (double)sp.temperature, chi2);
            fail();
        }
    }
    samp_free(c);
}

/* ---- top_k / top_p / min_p: the kept set and the pick against brute force */

static void check_filters(int V, double spread, int trials, const struct sampling_params *base)
{
    struct samp_ctx *c = samp_new(V);
    float *l = malloc((size_t)V * sizeof *l), *probs = malloc((size_t)V * sizeof *probs);
    int32_t *ids = malloc((size_t)V * sizeof *ids), toks[4] = {0};
    struct ref_item *ref = malloc((size_t)V * sizeof *ref);
    for (int t = 0; t < trials; t++) {
        random_logits(l, V, spread);
        if (t % 3 == 1) /* ties around every cut */
            for (int i = 0; i < V; i++)
                l[i] = (float)(int)(l[i] * 2) / 2;
        struct sampling_params sp = *base;
        int n = samp_distribution(c, l, &sp, ids, probs);
        int rn = ref_kept(l, V, &sp, ref);
        if (n != rn) {
            print_error("V %d trial %d (top_k %d top_p %g min_p %g T %g): kept %d, brute force %d\n", V, t,
                        sp.top_k, (double)sp.top_p, (double)sp.min_p, (double)sp.temperature, n, rn);
            fail();
        }
        for (int i = 0; i < n; i++) {
            assert_int_equal(ids[i], ref[i].id);
            assert_true(fabs(probs[i] - ref[i].p) < 1e-6);
        }
        /* the pick: inverse CDF at u = sampling_uniform(seed, n_output) over the kept set */
        for (int k = 0; k < 40; k++) {
            sp.seed = (uint64_t)(t * 1000 + k);
            struct be_seq s = seq_of(&sp, toks, 1, 1 + k % 3);
            double u = sampling_uniform(sp.seed, (uint64_t)(k % 3));
            int near;
            int want = ref_pick(ref, rn, u, &near);
            int got = sample(c, l, &s);
            if (!near && got != want) {
                print_error("V %d trial %d seed %llu: sampled %d, inverse CDF %d\n", V, t,
                            (unsigned long long)sp.seed, got, want);
                fail();
            }
        }
    }
    free(l);
    free(probs);
    free(ids);
    free(ref);
    samp_free(c);
}

static void test_filters(void **state)
{
    (void)state;
    struct sampling_params sp = sampling_params_default();
    const int vocabs[3] = {7, 50, 5000};
    for (int vi = 0; vi < 3; vi++) {
        int V = vocabs[vi], trials = V > 1000 ? 4 : 12;
        sp = sampling_params_default(); /* nothing: the full softmax */
        check_filters(V, 4, trials, &sp);
        sp.top_k = 5;
        check_filters(V, 4, trials, &sp);
        sp.top_k = 0;
        sp.top_p = 0.9f;
        check_filters(V, 4, trials, &sp);
        sp.top_p = 0.3f;
        sp.temperature = 0.5f;
        check_filters(V, 4, trials, &sp);
        sp.top_p = 1;
        sp.min_p = 0.05f;
        check_filters(V, 4, trials, &sp);
        sp.top_k = 40;
        sp.top_p = 0.8f;
        sp.min_p = 0.1f;
        sp.temperature = 1.3f;
        check_filters(V, 6, trials, &sp);
        sp.top_k = 1; /* top_k 1 is greedy */
        check_filters(V, 6, trials, &sp);
        sp.top_k = 0;
        sp.top_p = 0; /* top_p 0 keeps the single most probable */
        sp.min_p = 0;
        check_filters(V, 6, trials, &sp);
    }
    /* with a flat distribution the top_p cut must be exact: 10 equal ids, top_p 0.35 keeps the
     * 4 lowest (0.3 < 0.35 <= 0.4) */
    struct samp_ctx *c = samp_new(10);
    float l[10] = {0};
    int32_t ids[10];
    float probs[10];
    sp = sampling_params_default();
    sp.top_p = 0.35f;
    assert_int_equal(samp_distribution(c, l, &sp, ids, probs), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ids[i], i);
        assert_true(fabs(probs[i] - 0.25) < 1e-6);
    }
    /* exact boundaries: top_p keeps the smallest set whose mass reaches top_p (4 equal ids,
     * top_p 0.5: exactly 2), min_p keeps p >= min_p * max (min_p 1: every tied maximum) */
    sp.top_p = 0.5f;
    float l4[10] = {0, 0, 0, 0, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(samp_distribution(c, l4, &sp, ids, probs), 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    sp.top_p = 1;
    sp.min_p = 1;
    float lm[10] = {1, 3, 0, 3, 2, 3, -1, 0, 0, 0};
    assert_int_equal(samp_distribution(c, lm, &sp, ids, probs), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 5);
    samp_free(c);
}

/* ---- penalties */

static void test_penalties(void **state)
{
    (void)state;
    enum { V = 20 };
    struct samp_ctx *c = samp_new(V);
    float l[V], got[V];
    random_logits(l, V, 3);
    l[5] = 0; /* a zero logit is unchanged by the repetition penalty */
    int32_t toks[9] = {3, 3, 5, 19, /* prompt */ 5, 7, 7, 7, 11};
    struct sampling_params sp = sampling_params_default();
    sp.repetition_penalty = 1.3f;
    sp.presence_penalty = 0.5f;
    sp.frequency_penalty = 0.25f;
    struct be_seq s = seq_of(&sp, toks, 4, 9);
    int32_t ban[2] = {0, 12};
    s.banned = ban;
    s.n_banned = 2;
    memcpy(got, l, sizeof l);
    samp_penalize(c, got, &s);
    for (int i = 0; i < V; i++) {
        double x = l[i];
        int in_all = 0, cnt = 0;
        for (int k = 0; k < 9; k++)
            in_all |= toks[k] == i;
        for (int k = 4; k < 9; k++)
            cnt += toks[k] == i;
        if (in_all)
            x = x > 0 ? x / 1.3 : x * 1.3;
        x -= 0.25 * cnt + 0.5 * (cnt > 0);
        if (i == 0 || i == 12)
            x = -INFINITY;
        if (isinf(x)) {
            assert_true(isinf(got[i]) && got[i] < 0);
        } else if (fabs(got[i] - x) > 1e-5 * (1 + fabs(x))) {
            print_error("id %d: penalized %.7f, expected %.7f\n", i, (double)got[i], x);
            fail();
        }
    }
    /* the scratch is clean again: a second call gives the same result */
    float again[V];
    memcpy(again, l, sizeof l);
    samp_penalize(c, again, &s);
    assert_memory_equal(again, got, sizeof got);

    samp_free(c);

    /* greedy sees penalties: a repeated id loses the argmax to its runner-up */
    c = samp_new(4);
    float g[4] = {1.0f, 2.0f, 1.9f, -1.0f};
    int32_t t2[3] = {3, 1, 1};
    struct sampling_params gp = sampling_params_default();
    gp.temperature = 0;
    struct be_seq s2 = seq_of(&gp, t2, 1, 3);
    assert_int_equal(sample(c, g, &s2), 1);
    gp.frequency_penalty = 0.1f; /* 2 - 0.2 = 1.8 < 1.9 */
    assert_int_equal(sample(c, g, &s2), 2);
    gp.frequency_penalty = 0;
    gp.presence_penalty = 0.05f; /* 1.95 > 1.9 */
    assert_int_equal(sample(c, g, &s2), 1);
    gp.presence_penalty = 0;
    gp.repetition_penalty = 1.1f; /* 2 / 1.1 = 1.82 */
    assert_int_equal(sample(c, g, &s2), 2);
    /* presence/frequency count output tokens only: the same id in the prompt is not penalized */
    gp.repetition_penalty = 1;
    gp.presence_penalty = 1;
    struct be_seq s3 = seq_of(&gp, t2, 3, 3);
    assert_int_equal(sample(c, g, &s3), 1);
    samp_free(c);
}

/* ---- banned ids are never sampled */

static void test_banned(void **state)
{
    (void)state;
    enum { V = 8 };
    struct samp_ctx *c = samp_new(V);
    float l[V] = {0, 3, 0.5f, 2.9f, 0, -1, 0.2f, 0};
    int32_t ban[2] = {1, 3}, toks[1] = {0};
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 2.0f;
    struct be_seq s = seq_of(&sp, toks, 1, 1);
    s.banned = ban;
    s.n_banned = 2;
    int seen[V] = {0};
    for (int k = 0; k < 2000; k++) {
        sp.seed = (uint64_t)k;
        seen[sample(c, l, &s)]++;
    }
    assert_int_equal(seen[1], 0);
    assert_int_equal(seen[3], 0);
    for (int i = 0; i < V; i++)
        if (i != 1 && i != 3)
            assert_true(seen[i] > 0);
    samp_free(c);
}

/* ---- logprobs: log_softmax of the raw logits, in double */

static void test_logprobs(void **state)
{
    (void)state;
    enum { V = 1000 };
    struct samp_ctx *c = samp_new(V);
    float l[V];
    random_logits(l, V, 8);
    l[10] = l[500] = l[999] = 9.5f; /* a three-way tie at the top: ids ascend */
    l[20] = l[21] = 9.0f;
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++)
        z += exp(l[i] - mx);
    double lse = mx + log(z);
    struct ref_item *ref = malloc(V * sizeof *ref);
    for (int i = 0; i < V; i++)
        ref[i] = (struct ref_item){l[i], i};
    qsort(ref, V, sizeof *ref, ref_cmp);

    struct sampling_params sp = sampling_params_default();
    sp.logprobs = 20;
    sp.repetition_penalty = 5; /* penalties and temperature must not touch logprobs */
    sp.temperature = 0.3f;
    sp.seed = 99;
    int32_t toks[3] = {10, 500, 999};
    struct be_seq s = seq_of(&sp, toks, 1, 3);
    struct be_out o;
    char err[256];
    assert_int_equal(samp_sample(c, l, &s, &o, err, sizeof err), 0);
    assert_int_equal(o.n_top, 20);
    for (int j = 0; j < 20; j++) {
        assert_int_equal(o.top_ids[j], ref[j].id);
        assert_true(fabs(o.top_logprobs[j] - (ref[j].p - lse)) < 1e-5);
    }
    assert_int_equal(o.top_ids[0], 10);
    assert_int_equal(o.top_ids[1], 500);
    assert_int_equal(o.top_ids[2], 999);
    assert_int_equal(o.top_ids[3], 20);
    assert_true(fabs(o.logprob - (l[o.token] - lse)) < 1e-5);

    sp.logprobs = 0;
    assert_int_equal(samp_sample(c, l, &s, &o, err, sizeof err), 0);
    assert_int_equal(o.n_top, 0);
    assert_true(fabs(o.logprob - (l[o.token] - lse)) < 1e-5);
    sp.logprobs = 3;
    assert_int_equal(samp_sample(c, l, &s, &o, err, sizeof err), 0);
    assert_int_equal(o.n_top, 3);
    sp.logprobs = -1;
    o.n_top = 7;
    assert_int_equal(samp_sample(c, l, &s, &o, err, sizeof err), 0);
    assert_int_equal(o.n_top, 0);

    /* a tie across the cut of the top list: the lower ids are listed */
    float tie[12] = {0, 0, 4, 0, 0, 4, 0, 4, 0, 4, 0, 0};
    struct be_out ot;
    samp_logprobs(tie, 12, 9, 3, &ot);
    assert_int_equal(ot.n_top, 3);
    assert_int_equal(ot.top_ids[0], 2);
    assert_int_equal(ot.top_ids[1], 5);
    assert_int_equal(ot.top_ids[2], 7);

    /* large logits do not overflow */
    float big[3] = {1000, 999, -1000};
    struct be_out ob;
    samp_logprobs(big, 3, 1, 2, &ob);
    assert_true(fabs(ob.logprob - (-1 - log1p(exp(-1.0)))) < 1e-5);
    assert_true(fabs(ob.top_logprobs[0] - (-log1p(exp(-1.0)))) < 1e-5);
    free(ref);
    samp_free(c);
}

/* ---- a sequence's draws depend on its seed and step only, never on the other sequences */

static void test_seed_independent_of_batch(void **state)
{
    (void)state;
    enum { V = 300, STEPS = 30 };
    struct samp_ctx *c = samp_new(V);
    float l[V];
    random_logits(l, V, 3);
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 1.2f;
    sp.top_p = 0.95f;
    sp.seed = 4242;
    sp.presence_penalty = 0.3f;
    int32_t toks[STEPS + 2] = {1, 2};
    int alone[STEPS];
    for (int k = 0; k < STEPS; k++) {
        struct be_seq s = seq_of(&sp, toks, 2, 2 + k);
        toks[2 + k] = alone[k] = sample(c, l, &s);
    }
    /* again, with other sequences (other seeds, penalties, bans) sampled in between */
    struct sampling_params other = sampling_params_default();
    other.repetition_penalty = 1.5f;
    other.frequency_penalty = 0.7f;
    int32_t otoks[40];
    for (int i = 0; i < 40; i++)
        otoks[i] = (i * 37) % V;
    int32_t ban[3] = {alone[0], alone[1], alone[2]};
    int distinct = 0;
    for (int k = 0; k < STEPS; k++) {
        for (int j = 0; j < 3; j++) {
            other.seed = (uint64_t)(k * 10 + j);
            struct be_seq so = seq_of(&other, otoks, 10, 20 + j * 5);
            so.banned = ban;
            so.n_banned = 3;
            sample(c, l, &so);
        }
        struct be_seq s = seq_of(&sp, toks, 2, 2 + k);
        assert_int_equal(sample(c, l, &s), alone[k]);
        distinct += k > 0 && alone[k] != alone[k - 1];
    }
    assert_true(distinct > 5); /* it really is sampling */
    /* and a fresh context gives the same */
    struct samp_ctx *c2 = samp_new(V);
    struct be_seq s = seq_of(&sp, toks, 2, 2 + 17);
    assert_int_equal(sample(c2, l, &s), alone[17]);
    samp_free(c2);
    samp_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_greedy_ties),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_banned),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_seed_independent_of_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
