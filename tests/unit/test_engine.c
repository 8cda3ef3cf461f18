/* engine/engine: the whole host loop over the real CPU backend and a tiny random Qwen3 written by
 * tiny_model_write. The reference for every batched run is the same request run alone in a fresh
 * engine with roomy settings: greedy ids must be identical (and logprobs within 1e-4) when many
 * requests arrive staggered, when a tiny KV pool forces preemption, when a small token budget
 * forces chunked prefill, with and without prefix caching, and across lanes. Then the stop rules
 * (max_tokens, EOS and ignore_eos, stop ids, min_tokens, stop strings), cancellation, deadlines and
 * priorities on an injected clock, logprobs, seeds, validation errors, a backend failure that the engine
 * survives, and a sequence whose logits are NaN failing alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/grammar_int.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/log.h"
#include "engine/util/scratch_dir.h"

#include "cpu_test.h"

#define MAXJ 40
/* bytes of one KV block of the tiny model on the CPU backend: layers * (K, V) * kv_heads * block
 * size * head_dim * sizeof(float) */
#define BLOCK_BYTES (2LL * 2 * 2 * 4 * 16 * (int64_t)sizeof(float))
#define MAXOUT 64

static char g_dir[256];
static struct model *g_model;
static struct tok *g_tok;

/* ---- fixture: one tiny model for all tests */

/* The fixture's tiny model; vocab 0: the default one (setup then sets the tokenizer's) */
static struct tiny_opts fixture_opts(int vocab)
{
    struct tiny_opts o = tiny_opts_default();
    o.seed = 7;
    o.tie = false; /* tied tiny models just repeat their last token, which would hide wrong K/V */
    if (vocab > 0)
        o.vocab = vocab;
    return o;
}

static int setup(void **state)
{
    (void)state;
    log_set_level(LOG_WARN);
    char err[512];
    if (scratch_dir_make(getenv("TMPDIR"), "test-engine", g_dir, sizeof g_dir))
        return -1;
    struct tiny_opts o = fixture_opts(0);
    cpu_test_write_model(g_dir, &o);
    /* again with the vocabulary the tokenizer has, so every id has text */
    struct tok *t = tok_load_dir(g_dir, err, sizeof err);
    if (!t)
        fail_msg("tok_load_dir: %s", err);
    o.vocab = tok_vocab_size(t);
    tok_free(t);
    cpu_test_write_model(g_dir, &o);
    cpu_test_load_dir(g_dir, &g_model, &g_tok);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_free(g_model);
    tok_free(g_tok);
    scratch_dir_remove(g_dir);
    return 0;
}

/* ---- running jobs */

struct job {
    int32_t prompt[300];
    int n_prompt;
    struct engine_request r;
    int arrive; /* the step before which it is added */
};

struct result {
    int32_t out[MAXOUT + 1];
    int n_out;
    struct be_out lp[MAXOUT + 1];
    bool has_lp;
    char text[4096]; /* may hold NUL bytes (byte token 0 is a character): use text_len */
    size_t text_len;
    enum finish_reason fin;
    char error[256];
    int n_preemptions;
    double t_arrival, t_first, t_finished;
};

static struct engine_opts base_opts(void)
{
    struct engine_opts o = engine_opts_default();
    o.be.threads = 1;
    o.be.block_size = 4;
    o.be.max_model_len = 400;
    o.be.max_num_seqs = 64;
    o.be.max_num_batched_tokens = 2048;
    o.enable_prefix_caching = false;
    return o;
}

static struct engine *open_engine(const struct engine_opts *o)
{
    return cpu_test_engine(g_model, g_tok, o);
}

static void job_init(struct job *j, int id, int n_prompt, int max_tokens)
{
    memset(j, 0, sizeof *j);
    j->n_prompt = n_prompt;
    uint64_t x = 0x1234567ull * (uint64_t)(id + 1);
    for (int i = 0; i < n_prompt; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        j->prompt[i] = (int32_t)((x >> 33) % 256); /* byte tokens */
    }
    j->r = cpu_test_request(j->prompt, n_prompt, max_tokens, -1);
}

static void take_result(struct result *res, const struct engine_seq *s)
{
    memset(res, 0, sizeof *res);
    assert_true(s->n_output <= MAXOUT);
    res->n_out = s->n_output;
    memcpy(res->out, s->tokens + s->n_prompt, (size_t)s->n_output * sizeof *res->out);
    if (s->logprobs) {
        res->has_lp = true;
        memcpy(res->lp, s->logprobs, (size_t)s->n_output * sizeof *res->lp);
    }
    assert_int_equal(s->text[s->text_len], 0);
    assert_true(s->text_len < sizeof res->text);
    memcpy(res->text, s->text, s->text_len + 1);
    res->text_len = s->text_len;
    res->fin = s->finish;
    snprintf(res->error, sizeof res->error, "%s", s->error);
    res->n_preemptions = s->n_preemptions;
    res->t_arrival = s->t_arrival;
    res->t_first = s->t_first_token;
    res->t_finished = s->t_finished;
}

/* Runs the jobs through one engine (each added before step `arrive`) and collects every result.
 * Checks on the way: a seq's text only ever grows and every text shown is a prefix of the final
 * one; n_new_output is 1 exactly for the seqs that got a token; nothing finishes twice. */
static void run_jobs(struct engine *e, struct job *jobs, int n, struct result *res, struct engine_stats *st)
{
    struct engine_seq *seqs[MAXJ] = {0};
    char *shown[MAXJ] = {0};
    size_t shown_len[MAXJ] = {0};
    bool done[MAXJ] = {false};
    int n_done = 0;
    for (int step = 0; n_done < n && step < 5000; step++) {
        for (int i = 0; i < n; i++)
            if (jobs[i].arrive == step) {
                char err[256] = "";
                jobs[i].r.user = &jobs[i];
                seqs[i] = engine_add(e, &jobs[i].r, err, sizeof err);
                if (!seqs[i]) {
                    print_error("engine_add %d: %s\n", i, err);
                    fail();
                }
                shown[i] = calloc(1, 1);
                shown_len[i] = 0;
            }
        if (!engine_has_work(e))
            continue;
        struct engine_seq **ch;
        int nch;
        assert_int_equal(engine_step(e, &ch, &nch), 0);
        for (int k = 0; k < nch; k++) {
            struct job *j = ch[k]->user;
            int i = (int)(j - jobs);
            assert_ptr_equal(ch[k], seqs[i]);
            assert_false(done[i]);
            if (ch[k]->text_len < shown_len[i] || memcmp(shown[i], ch[k]->text, shown_len[i])) {
                print_error("job %d: text went from \"%s\" to \"%s\"\n", i, shown[i], ch[k]->text);
                fail();
            }
            free(shown[i]);
            shown[i] = malloc(ch[k]->text_len + 1);
            memcpy(shown[i], ch[k]->text, ch[k]->text_len + 1);
            shown_len[i] = ch[k]->text_len;
            if (ch[k]->finished) {
                take_result(&res[i], ch[k]);
                done[i] = true;
                n_done++;
            }
        }
        /* the ones not listed got no token */
        for (int i = 0; i < n; i++)
            if (seqs[i] && !done[i]) {
                bool listed = false;
                for (int k = 0; k < nch; k++)
                    listed |= ch[k] == seqs[i];
                if (!listed)
                    assert_int_equal(seqs[i]->n_new_output, 0);
            }
        for (int i = 0; i < n; i++)
            if (done[i] && seqs[i]) {
                engine_release(e, seqs[i]);
                seqs[i] = NULL;
            }
    }
    assert_int_equal(n_done, n);
    assert_false(engine_has_work(e));
    if (st)
        engine_get_stats(e, st);
    for (int i = 0; i < n; i++)
        free(shown[i]);
}

/* Each job alone in a fresh roomy engine. */
static void run_alone(struct job *jobs, int n, struct result *ref)
{
    struct engine_opts o = base_opts();
    for (int i = 0; i < n; i++) {
        struct engine *e = open_engine(&o);
        struct job j = jobs[i];
        j.arrive = 0;
        j.r.prompt = j.prompt;
        run_jobs(e, &j, 1, &ref[i], NULL);
        engine_free(e);
    }
}

static void expect_same(const struct result *ref, const struct result *got, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        if (got[i].n_out != ref[i].n_out || memcmp(got[i].out, ref[i].out, (size_t)ref[i].n_out * 4)) {
            print_error("%s: job %d: %d tokens differ from its run alone (%d tokens)\n", what, i,
                        got[i].n_out, ref[i].n_out);
            for (int k = 0; k < got[i].n_out && k < ref[i].n_out; k++)
                if (got[i].out[k] != ref[i].out[k]) {
                    print_error("  first difference at %d: %d vs %d\n", k, got[i].out[k], ref[i].out[k]);
                    break;
                }
            fail();
        }
        assert_int_equal(got[i].fin, ref[i].fin);
        assert_int_equal(got[i].text_len, ref[i].text_len);
        assert_memory_equal(got[i].text, ref[i].text, ref[i].text_len);
        if (ref[i].has_lp)
            for (int k = 0; k < ref[i].n_out; k++)
                assert_true(fabsf(got[i].lp[k].logprob - ref[i].lp[k].logprob) < 1e-4f);
    }
}

/* Varied lengths, staggered arrivals. */
static int make_batch(struct job *jobs, int n, int max_tokens)
{
    for (int i = 0; i < n; i++) {
        int len = 1 + (i * 37) % 120;
        if (i % 5 == 4)
            len = 200 + i;
        job_init(&jobs[i], i, len, max_tokens - (i % 3));
        jobs[i].arrive = (i * 3) / 2;
        jobs[i].r.sp.logprobs = i % 4 == 3 ? -1 : 2;
    }
    return n;
}

/* ---- batching, preemption, chunking, prefix caching: all equal to the runs alone */

static struct job g_jobs[MAXJ];
static struct result g_ref[MAXJ];
static int g_n;

static void ensure_reference(void)
{
    if (g_n)
        return;
    g_n = make_batch(g_jobs, 24, 24);
    run_alone(g_jobs, g_n, g_ref);
    for (int i = 0; i < g_n; i++) {
        assert_int_equal(g_ref[i].fin, FINISH_LENGTH);
        assert_int_equal(g_ref[i].n_out, g_jobs[i].r.max_tokens);
    }
}

static void test_batch_equals_alone(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    struct engine *e = open_engine(&o);
    struct result got[MAXJ];
    struct engine_stats st;
    run_jobs(e, g_jobs, g_n, got, &st);
    expect_same(g_ref, got, g_n, "batch");
    assert_int_equal(st.preemptions, 0);
    assert_true(st.steps < 200); /* they did run together */
    engine_free(e);
}

/* engine_set_on_start's callback: counts the calls per job (ctx: the jobs array); a seq is
 * listed before anything of it ran. */
static int g_starts[MAXJ];
static void count_starts(void *ctx, struct engine_seq *const *seqs, int n)
{
    struct job *jobs = ctx;
    for (int i = 0; i < n; i++) {
        assert_int_equal(seqs[i]->n_output, 0);
        assert_false(seqs[i]->finished);
        g_starts[(struct job *)seqs[i]->user - jobs]++;
    }
}

/* Also: the start callback lists each seq once, before its first step, preempted or not. */
static void test_preemption_equals_alone(void **state)
{
    (void)state;
    ensure_reference();
    for (int prefix = 0; prefix < 2; prefix++) {
        struct engine_opts o = base_opts();
        o.enable_prefix_caching = prefix;
        o.be.max_model_len = 260;
        /* 70 blocks of 4 tokens: one long job fits, the batch does not */
        o.be.kv_cache_bytes = 70 * BLOCK_BYTES;
        o.admission_reserve = 0; /* admit, then preempt as the jobs grow */
        struct engine *e = open_engine(&o);
        memset(g_starts, 0, sizeof g_starts);
        engine_set_on_start(e, count_starts, g_jobs);
        struct result got[MAXJ];
        struct engine_stats st;
        run_jobs(e, g_jobs, g_n, got, &st);
        for (int i = 0; i < g_n; i++)
            assert_int_equal(g_starts[i], 1);
        assert_int_equal(st.kv_blocks_total, 70);
        expect_same(g_ref, got, g_n, prefix ? "preemption + prefix cache" : "preemption");
        assert_true(st.preemptions > 0);
        int with = 0;
        for (int i = 0; i < g_n; i++)
            with += got[i].n_preemptions > 0;
        assert_true(with > 0);
        if (prefix)
            assert_true(st.prefix_hits > 0); /* readmissions found their blocks */
        assert_int_equal(st.kv_blocks_used, 0);
        engine_free(e);
    }
}

static void test_chunked_prefill_equals_alone(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    o.be.max_num_batched_tokens = 7;
    o.be.max_num_seqs = 5;
    struct engine *e = open_engine(&o);
    struct result got[MAXJ];
    run_jobs(e, g_jobs, g_n, got, NULL);
    expect_same(g_ref, got, g_n, "chunked prefill");
    engine_free(e);
    o = base_opts();
    o.long_prefill_chunk = 16;
    e = open_engine(&o);
    run_jobs(e, g_jobs, g_n, got, NULL);
    expect_same(g_ref, got, g_n, "long_prefill_chunk");
    engine_free(e);
}

static void test_prefix_cache_equals_alone(void **state)
{
    (void)state;
    /* jobs sharing long prefixes, arriving one after another so later ones hit the cache */
    struct job jobs[12];
    struct result ref[12], got[12];
    for (int i = 0; i < 12; i++) {
        job_init(&jobs[i], 100, 60 + 7 * i, 10);
        for (int k = 50; k < jobs[i].n_prompt; k++)
            jobs[i].prompt[k] = (int32_t)((k * 31 + i * 17) % 256); /* shared 50, then different */
        jobs[i].arrive = 12 * i;
        jobs[i].r.sp.logprobs = 1; /* compared within 1e-4: K/V a little off shows here first */
    }
    run_alone(jobs, 12, ref);
    struct engine_opts o = base_opts();
    o.enable_prefix_caching = true;
    struct engine *e = open_engine(&o);
    struct engine_stats st;
    run_jobs(e, jobs, 12, got, &st);
    expect_same(ref, got, 12, "prefix cache");
    assert_true(st.cached_tokens >= 11 * 48); /* 12 full blocks of the shared 50 tokens each time */
    assert_true(st.prefix_hits >= 11 * 12);
    engine_free(e);
}

static void test_lanes_equal_alone(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    o.num_lanes = 2;
    o.lanes[0].max_num_seqs = 4;
    o.lanes[1].max_num_seqs = 1;
    o.lanes[1].max_num_batched_tokens = 32;
    struct job jobs[MAXJ];
    memcpy(jobs, g_jobs, sizeof(struct job) * (size_t)g_n);
    for (int i = 0; i < g_n; i++) {
        jobs[i].r.prompt = jobs[i].prompt;
        jobs[i].r.lane = jobs[i].n_prompt > 100;
    }
    struct engine *e = open_engine(&o);
    struct result got[MAXJ];
    run_jobs(e, jobs, g_n, got, NULL);
    expect_same(g_ref, got, g_n, "lanes");
    assert_int_equal(engine_max_model_len(e, 0), 400);
    engine_free(e);
}

/* ---- stop rules */

static void run_one(const struct engine_opts *o, struct job *j, struct result *res)
{
    struct engine *e = open_engine(o);
    j->arrive = 0;
    j->r.prompt = j->prompt;
    run_jobs(e, j, 1, res, NULL);
    engine_free(e);
}

static void test_max_tokens(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    struct job j = g_jobs[3];
    j.r.max_tokens = 5;
    struct result r;
    run_one(&o, &j, &r);
    assert_int_equal(r.fin, FINISH_LENGTH);
    assert_int_equal(r.n_out, 5);
    assert_memory_equal(r.out, g_ref[3].out, 5 * sizeof(int32_t));
    assert_string_equal(finish_reason_name(r.fin), "length");
    assert_true(r.t_arrival > 0 && r.t_first >= r.t_arrival && r.t_finished >= r.t_first);
    /* max_tokens 1: finished in the prefill step itself */
    j.r.max_tokens = 1;
    run_one(&o, &j, &r);
    assert_int_equal(r.n_out, 1);
    assert_int_equal(r.out[0], g_ref[3].out[0]);
}

/* The reference output's k-th token, used as a stop id or EOS. Chooses k so that the token does
 * not occur before k. */
static int pick_stop(const struct result *ref, int min_k, int32_t *tok)
{
    for (int k = min_k; k < ref->n_out; k++) {
        bool earlier = false;
        for (int i = 0; i < k; i++)
            earlier |= ref->out[i] == ref->out[k];
        if (!earlier) {
            *tok = ref->out[k];
            return k;
        }
    }
    return -1;
}

static void test_stop_ids_and_min_tokens(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    int idx = 5;
    int32_t stop;
    int k = pick_stop(&g_ref[idx], 3, &stop);
    assert_true(k >= 3);
    struct job j = g_jobs[idx];
    j.r.stop_ids = &stop;
    j.r.n_stop_ids = 1;
    struct result r;
    run_one(&o, &j, &r);
    assert_int_equal(r.fin, FINISH_STOP);
    assert_int_equal(r.n_out, k + 1); /* the stop id is in the output ids */
    assert_memory_equal(r.out, g_ref[idx].out, (size_t)(k + 1) * sizeof(int32_t));
    /* its text is not: the text is that of the tokens before it */
    char *want = NULL;
    size_t wl = 0;
    char err[128];
    assert_int_equal(tok_decode(g_tok, r.out, (size_t)k, true, &want, &wl, err, sizeof err), 0);
    assert_int_equal(r.text_len, wl);
    assert_memory_equal(r.text, want, wl);
    free(want);
    /* min_tokens past k: the stop id is banned until then, so it cannot end the output early */
    j.r.min_tokens = k + 3;
    run_one(&o, &j, &r);
    assert_true(r.n_out >= k + 3);
    for (int i = 0; i < k + 3; i++)
        assert_int_not_equal(r.out[i], stop);
    assert_memory_equal(r.out, g_ref[idx].out, (size_t)k * sizeof(int32_t)); /* same until the ban bites */
    if (r.fin == FINISH_STOP)
        assert_int_equal(r.out[r.n_out - 1], stop);
    else
        assert_int_equal(r.n_out, j.r.max_tokens);
}

static void test_eos_and_ignore_eos(void **state)
{
    (void)state;
    ensure_reference();
    int idx = 7;
    int32_t eos;
    int k = pick_stop(&g_ref[idx], 2, &eos);
    assert_true(k >= 2);
    /* make that token the model's EOS for this test */
    struct model_config saved = g_model->cfg;
    g_model->cfg.eos_ids[0] = eos;
    g_model->cfg.n_eos = 1;
    struct engine_opts o = base_opts();
    struct job j = g_jobs[idx];
    j.r.ignore_eos = false;
    struct result r;
    run_one(&o, &j, &r);
    assert_int_equal(r.fin, FINISH_STOP);
    assert_int_equal(r.n_out, k + 1);
    assert_int_equal(r.out[k], eos);
    /* ignore_eos: runs to max_tokens, the same ids as the reference (which ignored EOS too) */
    j.r.ignore_eos = true;
    run_one(&o, &j, &r);
    assert_int_equal(r.fin, FINISH_LENGTH);
    assert_int_equal(r.n_out, g_ref[idx].n_out);
    assert_memory_equal(r.out, g_ref[idx].out, (size_t)r.n_out * sizeof(int32_t));
    /* min_tokens bans EOS too */
    j.r.ignore_eos = false;
    j.r.min_tokens = k + 1;
    run_one(&o, &j, &r);
    for (int i = 0; i < k + 1; i++)
        assert_int_not_equal(r.out[i], eos);
    g_model->cfg = saved;
}

/* Stop strings on the real detokenized text: a piece of the reference text spanning tokens. */
static void test_stop_strings(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    int tried = 0;
    for (int idx = 0; idx < g_n && tried < 6; idx++) {
        const char *text = g_ref[idx].text;
        size_t len = g_ref[idx].text_len;
        if (len < 12)
            continue;
        /* a stop of 3..5 whole characters from the middle, without NUL bytes */
        size_t a = len / 2;
        while (a > 0 && ((unsigned char)text[a] & 0xc0) == 0x80)
            a--;
        size_t b = a;
        for (int c = 0; c < 3 + idx % 3 && b < len; c++) {
            b++;
            while (b < len && ((unsigned char)text[b] & 0xc0) == 0x80)
                b++;
        }
        if (b >= len - 1 || memchr(text + a, 0, b - a))
            continue;
        char stop[64];
        memcpy(stop, text + a, b - a);
        stop[b - a] = 0;
        const char *first = memmem(text, len, stop, b - a);
        assert_non_null(first);
        struct job j = g_jobs[idx];
        const char *stops[] = {"\x01never", stop};
        j.r.stop = stops;
        j.r.n_stop = 2;
        struct result r;
        run_one(&o, &j, &r);
        assert_int_equal(r.fin, FINISH_STOP);
        if (r.text_len != (size_t)(first - text) || memcmp(r.text, text, (size_t)(first - text))) {
            print_error("job %d stop \"%s\": got \"%s\", expected the first %d bytes of \"%s\"\n", idx, stop,
                        r.text, (int)(first - text), text);
            fail();
        }
        assert_memory_equal(r.out, g_ref[idx].out, (size_t)r.n_out * sizeof(int32_t));
        assert_true(r.n_out <= g_ref[idx].n_out);
        tried++;
    }
    assert_true(tried >= 3);
    /* a stop string at the very start of the output */
    int idx = 0;
    while (idx < g_n && (g_ref[idx].text_len < 2 || g_ref[idx].text[0] == 0))
        idx++;
    assert_true(idx < g_n);
    struct job j = g_jobs[idx];
    char first[8];
    size_t n1 = 1;
    while (((unsigned char)g_ref[idx].text[n1] & 0xc0) == 0x80)
        n1++;
    memcpy(first, g_ref[idx].text, n1);
    first[n1] = 0;
    const char *stops[] = {first};
    j.r.stop = stops;
    j.r.n_stop = 1;
    struct result r;
    run_one(&o, &j, &r);
    assert_int_equal(r.fin, FINISH_STOP);
    assert_int_equal(r.text_len, 0);
    assert_true(r.n_out < g_ref[idx].n_out); /* as soon as its first character is complete */
}

/* Without stop rules the text is exactly tok_decode of the output ids. */
static void test_text_is_decode(void **state)
{
    (void)state;
    ensure_reference();
    for (int i = 0; i < g_n; i++) {
        char *want = NULL, err[128];
        size_t wl;
        assert_int_equal(
            tok_decode(g_tok, g_ref[i].out, (size_t)g_ref[i].n_out, true, &want, &wl, err, sizeof err), 0);
        assert_int_equal(g_ref[i].text_len, wl);
        assert_memory_equal(g_ref[i].text, want, wl);
        free(want);
    }
}

static void test_logprobs(void **state)
{
    (void)state;
    ensure_reference();
    for (int i = 0; i < g_n; i++) {
        if (g_jobs[i].r.sp.logprobs < 0) {
            assert_false(g_ref[i].has_lp);
            continue;
        }
        assert_true(g_ref[i].has_lp);
        for (int k = 0; k < g_ref[i].n_out; k++) {
            const struct be_out *lp = &g_ref[i].lp[k];
            assert_int_equal(lp->token, g_ref[i].out[k]);
            assert_int_equal(lp->n_top, 2);
            assert_int_equal(lp->top_ids[0], lp->token); /* greedy picks the most likely */
            assert_true(fabsf(lp->top_logprobs[0] - lp->logprob) < 1e-6f);
            assert_true(lp->logprob <= 0 && lp->top_logprobs[1] <= lp->top_logprobs[0]);
        }
    }
    struct engine_opts o = base_opts();
    struct job j = g_jobs[0];
    j.r.sp.logprobs = 0;
    struct result r;
    run_one(&o, &j, &r);
    assert_true(r.has_lp);
    assert_int_equal(r.lp[0].n_top, 0);
}

static void test_cancel(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    o.be.max_num_seqs = 1; /* the second one waits */
    struct engine *e = open_engine(&o);
    char err[256];
    struct job a = g_jobs[1], b = g_jobs[2];
    a.r.prompt = a.prompt;
    b.r.prompt = b.prompt;
    struct engine_seq *sa = engine_add(e, &a.r, err, sizeof err), *sb = engine_add(e, &b.r, err, sizeof err);
    assert_non_null(sa);
    assert_non_null(sb);
    struct engine_seq **ch;
    int nch;
    for (int s = 0; s < 4; s++)
        assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(sa->n_output, 4);
    assert_int_equal(sb->n_output, 0);
    engine_cancel(e, sa);
    engine_cancel(e, sb);
    engine_cancel(e, sb); /* twice is harmless */
    assert_true(engine_has_work(e));
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(nch, 2);
    assert_true(sa->finished && sb->finished);
    assert_int_equal(sa->finish, FINISH_CANCELLED);
    assert_int_equal(sb->finish, FINISH_CANCELLED);
    assert_string_equal(finish_reason_name(sa->finish), "cancelled");
    assert_int_equal(sa->n_output, 4); /* what it had, unchanged */
    assert_memory_equal(sa->tokens + sa->n_prompt, g_ref[1].out, 4 * sizeof(int32_t));
    assert_false(engine_has_work(e));
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_cancel(e, sa); /* finished: no-op */
    engine_release(e, sa);
    engine_release(e, sb);
    /* releasing an unfinished seq drops it */
    struct engine_seq *sc = engine_add(e, &a.r, err, sizeof err);
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    engine_release(e, sc);
    assert_false(engine_has_work(e));
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_free(e);
}

/* The tests' clock: engine_opts.clock reading *ctx, moved by hand. */
static double fake_clock(void *ctx)
{
    return *(const double *)ctx;
}

/* A running and a waiting seq whose deadline passes finish with "timeout" at the start of the next
 * step: the running one with the tokens (and the text of them) it had, the waiting one with none;
 * a seq without a deadline runs on, and takes the freed slot in that same step. */
static void test_timeout(void **state)
{
    (void)state;
    ensure_reference();
    double now = 100;
    struct engine_opts o = base_opts();
    o.be.max_num_seqs = 1; /* b and c wait behind a */
    o.clock = fake_clock;
    o.clock_ctx = &now;
    struct engine *e = open_engine(&o);
    struct job a = g_jobs[1], b = g_jobs[2], c = g_jobs[3];
    a.r.prompt = a.prompt;
    b.r.prompt = b.prompt;
    c.r.prompt = c.prompt;
    a.r.deadline = b.r.deadline = 110;
    struct engine_seq *sa = cpu_test_add(e, &a.r), *sb = cpu_test_add(e, &b.r), *sc = cpu_test_add(e, &c.r);
    assert_true(sa->t_arrival == 100);
    struct engine_seq **ch;
    int nch;
    for (int s = 0; s < 4; s++)
        assert_int_equal(engine_step(e, &ch, &nch), 0);
    now = 109.999; /* not yet */
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_false(sa->finished || sb->finished);
    assert_int_equal(sa->n_output, 5);
    now = 110;
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_true(sa->finished && sb->finished && !sc->finished);
    assert_int_equal(sa->finish, FINISH_TIMEOUT);
    assert_int_equal(sb->finish, FINISH_TIMEOUT);
    assert_string_equal(finish_reason_name(sa->finish), "timeout");
    assert_non_null(strstr(sa->error, "deadline passed after 5 generated tokens"));
    assert_true(sa->t_finished == 110);
    assert_int_equal(sa->n_output, 5); /* what it had: the reference's first 5 tokens, and their text */
    assert_memory_equal(sa->tokens + sa->n_prompt, g_ref[1].out, 5 * sizeof(int32_t));
    char *want = NULL, err[128];
    size_t wl;
    assert_int_equal(tok_decode(g_tok, g_ref[1].out, 5, true, &want, &wl, err, sizeof err), 0);
    assert_true(wl > 0);
    assert_int_equal(sa->text_len, wl);
    assert_memory_equal(sa->text, want, wl);
    free(want);
    assert_int_equal(sb->n_output, 0);
    assert_int_equal(sb->text_len, 0);
    assert_int_equal(sc->n_output, 1); /* admitted in the step that expired a */
    engine_release(e, sa);
    engine_release(e, sb);
    now = 1e9; /* no deadline: c is not touched by time */
    cpu_test_run(e);
    assert_int_equal(sc->finish, FINISH_LENGTH);
    assert_int_equal(sc->n_output, g_ref[3].n_out);
    assert_memory_equal(sc->tokens + sc->n_prompt, g_ref[3].out, (size_t)g_ref[3].n_out * sizeof(int32_t));
    engine_release(e, sc);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    /* a deadline already passed at engine_add: it finishes at the next step, before it runs */
    a.r.deadline = 50;
    sa = cpu_test_add(e, &a.r);
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(nch, 1);
    assert_int_equal(sa->finish, FINISH_TIMEOUT);
    assert_int_equal(sa->n_output, 0);
    engine_release(e, sa);
    a.r.deadline = NAN;
    assert_null(engine_add(e, &a.r, err, sizeof err));
    assert_non_null(strstr(err, "deadline"));
    engine_free(e);
}

/* Priorities reach the scheduler, and arrival times come from the engine's clock: with one running
 * slot, a later priority 0 request runs before an earlier priority -1 one, unless that one arrived
 * more than priority_aging_s before it. */
static void test_priority(void **state)
{
    (void)state;
    ensure_reference();
    for (int aged = 0; aged < 2; aged++) {
        double now = 0;
        struct engine_opts o = base_opts();
        o.be.max_num_seqs = 1;
        o.priority_aging_s = 60;
        o.clock = fake_clock;
        o.clock_ctx = &now;
        struct engine *e = open_engine(&o);
        struct job lo = g_jobs[1], hi = g_jobs[2];
        lo.r.prompt = lo.prompt;
        hi.r.prompt = hi.prompt;
        lo.r.priority = -1;
        struct engine_seq *sl = cpu_test_add(e, &lo.r);
        now = aged ? 61 : 59;
        struct engine_seq *sh = cpu_test_add(e, &hi.r);
        struct engine_seq **ch;
        int nch;
        assert_int_equal(engine_step(e, &ch, &nch), 0);
        assert_int_equal(nch, 1);
        assert_ptr_equal(ch[0], aged ? sl : sh);
        cpu_test_run(e);
        assert_memory_equal(sl->tokens + sl->n_prompt, g_ref[1].out,
                            (size_t)g_ref[1].n_out * sizeof(int32_t));
        assert_memory_equal(sh->tokens + sh->n_prompt, g_ref[2].out,
                            (size_t)g_ref[2].n_out * sizeof(int32_t));
        engine_release(e, sl);
        engine_release(e, sh);
        engine_free(e);
    }
}

static void test_seeds(void **state)
{
    (void)state;
    /* sampled output: the same with its seed alone or in a batch under preemption */
    struct job jobs[8];
    struct result ref[8], got[8];
    for (int i = 0; i < 8; i++) {
        job_init(&jobs[i], 50 + i, 30 + 20 * i, 20);
        jobs[i].r.sp.temperature = 1.0f;
        jobs[i].r.sp.top_k = 50;
        jobs[i].r.has_seed = true;
        jobs[i].r.sp.seed = 1000 + (uint64_t)i;
        jobs[i].arrive = i;
    }
    run_alone(jobs, 8, ref);
    struct engine_opts o = base_opts();
    o.be.max_model_len = 260;
    o.be.kv_cache_bytes = 80 * BLOCK_BYTES;
    o.admission_reserve = 0;
    struct engine *e = open_engine(&o);
    struct engine_stats st;
    run_jobs(e, jobs, 8, got, &st);
    expect_same(ref, got, 8, "seeded sampling");
    engine_free(e);
    /* without a seed: drawn from the engine's base seed, so two engines agree, two seeds differ */
    for (int i = 0; i < 8; i++)
        jobs[i].r.has_seed = false;
    struct result r1[8], r2[8];
    o = base_opts();
    e = open_engine(&o);
    run_jobs(e, jobs, 8, r1, NULL);
    engine_free(e);
    e = open_engine(&o);
    run_jobs(e, jobs, 8, r2, NULL);
    engine_free(e);
    expect_same(r1, r2, 8, "drawn seeds");
    o.seed = 99;
    e = open_engine(&o);
    run_jobs(e, jobs, 8, r2, NULL);
    engine_free(e);
    int differ = 0;
    for (int i = 0; i < 8; i++)
        differ += memcmp(r1[i].out, r2[i].out, sizeof r1[i].out) != 0;
    assert_true(differ > 0);
}

static void expect_add_error(struct engine *e, const struct engine_request *r, const char *want)
{
    char err[256] = "";
    assert_null(engine_add(e, r, err, sizeof err));
    if (!strstr(err, want)) {
        print_error("error \"%s\", expected it to contain \"%s\"\n", err, want);
        fail();
    }
}

static void test_validation(void **state)
{
    (void)state;
    struct engine_opts o = base_opts();
    struct engine *e = open_engine(&o);
    struct job j;
    job_init(&j, 0, 10, 5);
    struct engine_request r = j.r;
    r.n_prompt = 0;
    expect_add_error(e, &r, "prompt is empty");
    r = j.r;
    int32_t bad[2] = {1, 999999};
    r.prompt = bad;
    r.n_prompt = 2;
    expect_add_error(e, &r, "id 999999");
    r = j.r;
    r.max_tokens = 0;
    expect_add_error(e, &r, "max_tokens");
    r = j.r;
    r.max_tokens = 395;
    expect_add_error(e, &r, "exceed max_model_len 400");
    r = j.r;
    r.max_tokens = 2000000000;
    expect_add_error(e, &r, "max_model_len");
    r = j.r;
    r.min_tokens = 6;
    expect_add_error(e, &r, "min_tokens");
    r = j.r;
    r.sp.temperature = -1;
    expect_add_error(e, &r, "temperature");
    r = j.r;
    r.sp.top_p = 0;
    expect_add_error(e, &r, "top_p");
    r = j.r;
    r.sp.top_k = -5;
    expect_add_error(e, &r, "top_k");
    r = j.r;
    r.sp.min_p = 1.5f;
    expect_add_error(e, &r, "min_p");
    r = j.r;
    r.sp.logprobs = 21;
    expect_add_error(e, &r, "logprobs");
    r = j.r;
    r.sp.repetition_penalty = 0;
    expect_add_error(e, &r, "repetition_penalty");
    r = j.r;
    r.sp.presence_penalty = 3;
    expect_add_error(e, &r, "presence_penalty");
    r = j.r;
    const char *stops[] = {""};
    r.stop = stops;
    r.n_stop = 1;
    expect_add_error(e, &r, "stop[0] is empty");
    r = j.r;
    int32_t sid = -3;
    r.stop_ids = &sid;
    r.n_stop_ids = 1;
    expect_add_error(e, &r, "stop_token_ids[0]");
    r = j.r;
    r.lane = 1;
    expect_add_error(e, &r, "lane 1");
    r = j.r;
    r.sp.top_k = -1; /* vLLM's "off" is accepted */
    char err[256];
    struct engine_seq *s = engine_add(e, &r, err, sizeof err);
    assert_non_null(s);
    engine_release(e, s);
    engine_free(e);
    /* open errors: a backend name no backend has, no backend */
    char err2[256] = "";
    assert_null(backend_open("nope", g_model, &o.be, err2, sizeof err2));
    assert_non_null(strstr(err2, "nope"));
    err2[0] = 0;
    assert_null(engine_open(g_model, g_tok, NULL, &o, err2, sizeof err2));
    assert_non_null(strstr(err2, "backend"));
    engine_free(NULL);
}

/* A backend that delegates to the CPU backend and fails the steps it is told to. */
struct flaky {
    struct backend base;
    struct backend *inner;
    int calls, fail_at;
};

static int flaky_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    struct flaky *f = (struct flaky *)be;
    if (++f->calls == f->fail_at) {
        snprintf(be->err, sizeof be->err, "injected failure at call %d", f->calls);
        return -1;
    }
    return backend_step(f->inner, seqs, n, out);
}

static void flaky_free(struct backend *be)
{
    struct flaky *f = (struct flaky *)be;
    backend_free(f->inner);
    free(f);
}

static const struct backend_ops flaky_ops = {"flaky", flaky_step, flaky_free};

static void test_backend_failure(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    o.be.max_num_seqs = 2;
    char err[256];
    struct flaky *f = calloc(1, sizeof *f);
    f->inner = backend_open("cpu", g_model, &o.be, err, sizeof err);
    assert_non_null(f->inner);
    f->base.ops = &flaky_ops;
    f->base.num_blocks = f->inner->num_blocks;
    f->base.block_size = f->inner->block_size;
    f->fail_at = 3;
    struct engine *e = engine_open(g_model, g_tok, &f->base, &o, err, sizeof err);
    assert_non_null(e);
    assert_string_equal(engine_backend_name(e), "flaky");
    struct engine_seq *s[3];
    struct job j[3] = {g_jobs[0], g_jobs[1], g_jobs[2]};
    for (int i = 0; i < 3; i++) {
        j[i].r.prompt = j[i].prompt;
        s[i] = engine_add(e, &j[i].r, err, sizeof err);
    }
    struct engine_seq **ch;
    int nch;
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(engine_step(e, &ch, &nch), -1);
    assert_int_equal(nch, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(s[i]->finished);
        assert_int_equal(s[i]->finish, FINISH_ERROR);
        assert_non_null(strstr(s[i]->error, "injected failure"));
        assert_string_equal(finish_reason_name(s[i]->finish), "error");
    }
    assert_false(s[2]->finished);
    engine_release(e, s[0]);
    engine_release(e, s[1]);
    /* the engine goes on: the third one runs to its reference output */
    while (!s[2]->finished)
        assert_int_equal(engine_step(e, &ch, &nch), 0);
    assert_int_equal(s[2]->finish, FINISH_LENGTH);
    assert_memory_equal(s[2]->tokens + s[2]->n_prompt, g_ref[2].out,
                        (size_t)g_ref[2].n_out * sizeof(int32_t));
    engine_release(e, s[2]);
    struct engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    engine_free(e);
}

/* A sequence whose logits are NaN fails alone, with the reason, and the step's other sequences go on
 * to their reference outputs (backend_ops.step; a corrupt weight or, in the CUDA backend's fp16 mode,
 * an overflow ends this way): a copy of the tiny model with one token's embedding row set to NaN, a
 * job whose prompt holds that token beside one whose prompt and output do not. */
static void test_nan_logits_fail_one_sequence(void **state)
{
    (void)state;
    ensure_reference();
    const struct job *ok_job = &g_jobs[1];
    const struct result *ok_ref = &g_ref[1];
    bool used[256] = {false};
    for (int i = 0; i < ok_job->n_prompt; i++)
        used[ok_job->prompt[i]] = true;
    for (int i = 0; i < ok_ref->n_out; i++)
        if (ok_ref->out[i] < 256)
            used[ok_ref->out[i]] = true;
    int32_t bad_id = 0;
    while (used[bad_id])
        bad_id++;
    assert_true(bad_id < 256);

    char dir[256], err[512];
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-engine-nan", dir, sizeof dir), 0);
    struct tiny_opts o = fixture_opts(g_model->cfg.vocab);
    cpu_test_write_model(dir, &o);
    if (test_nan_row(dir, "model.embed_tokens.weight", bad_id, err, sizeof err))
        fail_msg("%s", err);
    struct model *m = cpu_test_load_model(dir);

    struct engine_opts eo = base_opts();
    struct engine *e = cpu_test_engine(m, g_tok, &eo);
    struct job bad;
    job_init(&bad, 99, 12, 8);
    bad.prompt[5] = bad_id;
    struct job good = *ok_job;
    good.r.prompt = good.prompt;
    struct engine_seq *sb = engine_add(e, &bad.r, err, sizeof err),
                      *sg = engine_add(e, &good.r, err, sizeof err);
    assert_non_null(sb);
    assert_non_null(sg);
    struct engine_seq **ch;
    int nch;
    while (!sg->finished)
        assert_int_equal(engine_step(e, &ch, &nch), 0); /* no step fails */
    assert_true(sb->finished);
    assert_int_equal(sb->finish, FINISH_ERROR);
    assert_int_equal(sb->n_output, 0);
    assert_non_null(strstr(sb->error, "sampling"));
    assert_non_null(strstr(sb->error, "nan"));
    struct result got;
    take_result(&got, sg);
    expect_same(ok_ref, &got, 1, "beside a NaN sequence");
    engine_release(e, sb);
    engine_release(e, sg);
    struct engine_stats est;
    engine_get_stats(e, &est);
    assert_int_equal(est.kv_blocks_used, 0);
    engine_free(e);
    model_free(m);
    scratch_dir_remove(dir);
}

/* A pool smaller than max_model_len lowers the engine's max_model_len (a backend that reports
 * fewer blocks than it has stands in for a small GPU). */
static void test_small_pool_caps_max_model_len(void **state)
{
    (void)state;
    ensure_reference();
    struct engine_opts o = base_opts();
    char err[256];
    struct flaky *f = calloc(1, sizeof *f);
    f->inner = backend_open("cpu", g_model, &o.be, err, sizeof err);
    assert_non_null(f->inner);
    f->base.ops = &flaky_ops;
    f->base.num_blocks = 10; /* 40 tokens */
    f->base.block_size = f->inner->block_size;
    struct engine *e = engine_open(g_model, g_tok, &f->base, &o, err, sizeof err);
    assert_non_null(e);
    assert_int_equal(engine_max_model_len(e, -1), 40);
    struct job j = g_jobs[3]; /* 112 prompt tokens */
    j.r.prompt = j.prompt;
    expect_add_error(e, &j.r, "max_model_len is 40");
    job_init(&j, 3, 30, 10);
    struct result r;
    run_jobs(e, &j, 1, &r, NULL);
    assert_int_equal(r.n_out, 10);
    engine_free(e);
}

/* ---- grammars */

/* root ::= '[' item (',' ' '? item)* ']' ;  item ::= [a-e]+ | '"' [0-9]* '"' */
static struct grammar *list_grammar(struct engine *e)
{
    char err[256] = "";
    const struct gr_vocab *v = engine_grammar_vocab(e, err, sizeof err);
    if (!v)
        fail_msg("engine_grammar_vocab: %s", err);
    struct gr_builder b;
    grb_init(&b);
    struct gr_seq s = {0};
    int32_t root = grb_rule(&b, "root"), item = grb_rule(&b, "item"), more = grb_rule(&b, "more"),
            letters = grb_rule(&b, "letters"), digits = grb_rule(&b, "digits");
    grs_range(&b, &s, 'a', 'e');
    grs_rule(&b, &s, letters);
    grb_alt(&b, letters, &s);
    grs_range(&b, &s, 'a', 'e');
    grb_alt(&b, letters, &s);
    grs_range(&b, &s, '0', '9');
    grs_rule(&b, &s, digits);
    grb_alt(&b, digits, &s);
    grb_alt(&b, digits, &s);
    grs_rule(&b, &s, letters);
    grb_alt(&b, item, &s);
    grs_byte(&b, &s, '"');
    grs_rule(&b, &s, digits);
    grs_byte(&b, &s, '"');
    grb_alt(&b, item, &s);
    grs_byte(&b, &s, ',');
    grs_rule(&b, &s, item);
    grs_rule(&b, &s, more);
    grb_alt(&b, more, &s);
    grs_lit(&b, &s, ", ", 2);
    grs_rule(&b, &s, item);
    grs_rule(&b, &s, more);
    grb_alt(&b, more, &s);
    grb_alt(&b, more, &s);
    grs_byte(&b, &s, '[');
    grs_rule(&b, &s, item);
    grs_rule(&b, &s, more);
    grs_byte(&b, &s, ']');
    grb_alt(&b, root, &s);
    grs_free(&s);
    struct grammar *g = gr_finish(&b, root, v, err, sizeof err);
    if (!g)
        fail_msg("gr_finish: %s", err);
    return g;
}

/* Whether text is a sentence of g (complete), or at least a prefix of one. */
static void expect_in_grammar(struct grammar *g, const char *text, size_t len, bool complete)
{
    struct gr_matcher *m = gr_matcher_new(g);
    assert_non_null(m);
    if (gr_matcher_accept_bytes(m, text, len) || (complete && !gr_matcher_complete(m))) {
        print_error("output \"%.*s\" is not %s the grammar\n", (int)len, text, complete ? "a sentence of" : "a prefix in");
        fail();
    }
    gr_matcher_free(m);
}

static void grammar_jobs(struct job *jobs, int n)
{
    for (int i = 0; i < n; i++) {
        job_init(&jobs[i], 70 + i, 20 + 15 * i, 48);
        jobs[i].r.sp.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.3f * (float)(i % 3);
        jobs[i].r.has_seed = true;
        jobs[i].r.sp.seed = 500 + (uint64_t)i;
        jobs[i].r.sp.logprobs = 2;
        jobs[i].r.ignore_eos = false;
        jobs[i].r.min_tokens = 0;
        jobs[i].arrive = i;
    }
}

static void test_grammar(void **state)
{
    (void)state;
    enum { N = 8 };
    struct job jobs[N];
    struct result ref[N], got[N];
    grammar_jobs(jobs, N);
    /* each alone, in an engine of its own (a grammar belongs to one engine's vocabulary) */
    for (int i = 0; i < N; i++) {
        struct engine_opts o = base_opts();
        struct engine *e = open_engine(&o);
        struct grammar *g = list_grammar(e);
        struct job j = jobs[i];
        j.arrive = 0;
        j.r.prompt = j.prompt;
        j.r.grammar = g;
        run_jobs(e, &j, 1, &ref[i], NULL);
        gr_unref(g);
        engine_free(e);
    }
    /* together, under preemption */
    struct engine_opts o = base_opts();
    o.be.max_model_len = 180;
    o.be.kv_cache_bytes = 60 * BLOCK_BYTES;
    o.admission_reserve = 0;
    struct engine *e = open_engine(&o);
    struct grammar *g = list_grammar(e);
    for (int i = 0; i < N; i++)
        jobs[i].r.grammar = g;
    struct engine_stats st;
    run_jobs(e, jobs, N, got, &st);
    expect_same(ref, got, N, "grammar");
    assert_true(st.preemptions > 0);
    assert_true(st.grammar_masks > 0);
    int stopped = 0;
    for (int i = 0; i < N; i++) {
        assert_true(got[i].fin == FINISH_STOP || got[i].fin == FINISH_LENGTH);
        expect_in_grammar(g, got[i].text, got[i].text_len, got[i].fin == FINISH_STOP);
        stopped += got[i].fin == FINISH_STOP;
        for (int k = 0; k < got[i].n_out; k++) /* logprobs stay the raw model's: top 1 may be outside */
            assert_true(got[i].lp[k].logprob <= 0);
    }
    assert_true(stopped > 0); /* some outputs end by themselves: EOS came once the list was complete */
    struct gr_stats gs;
    gr_get_stats(g, &gs);
    assert_true(gs.hits > 0 && gs.misses > 0);
    /* a grammar of another engine's vocabulary, or with ignore_eos, is refused */
    struct engine *e2 = open_engine(&o);
    struct grammar *g2 = list_grammar(e2);
    struct engine_request r = jobs[0].r;
    r.grammar = g2;
    expect_add_error(e, &r, "not compiled against this engine's vocabulary");
    r.grammar = g;
    r.ignore_eos = true;
    expect_add_error(e, &r, "ignore_eos");
    gr_unref(g2);
    engine_free(e2);
    gr_unref(g);
    engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_preemption_equals_alone),
        cmocka_unit_test(test_chunked_prefill_equals_alone),
        cmocka_unit_test(test_prefix_cache_equals_alone),
        cmocka_unit_test(test_lanes_equal_alone),
        cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_stop_ids_and_min_tokens),
        cmocka_unit_test(test_eos_and_ignore_eos),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_text_is_decode),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_priority),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_grammar),
        cmocka_unit_test(test_backend_failure),
        cmocka_unit_test(test_nan_logits_fail_one_sequence),
        cmocka_unit_test(test_small_pool_caps_max_model_len),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
