/* Helpers for the cmocka tests that run the CPU backend or the engine on it (tests/unit/test_cpu_*.c,
 * test_engine.c, test_rope_extend.c, test_model_load.c, and through tests/hf_golden.h
 * test_hf_reference.c and test_yarn_reference.c). Header-only: each test is its own program. Include it
 * after <cmocka.h>.
 *
 *   - tiny checkpoints (engine/tiny_model.h) written and loaded, with their tokenizer, alone or in a
 *     scratch folder of their own (struct cpu_test_fixture); keys of config.json replaced; a load that
 *     must fail with a given message; a loaded view of a given name, dtype and shape;
 *   - backend options of the size these tests use, a CPU backend opened, a step, a greedy sampling with
 *     logprobs, and a one-sequence step description (struct be_seq);
 *   - an engine opened, a greedy request, a sequence added, the engine run until it has no work;
 *   - what the naive references share: a tensor as fp32, an RMS norm, a row of logits turned into
 *     log-probabilities in place;
 *   - two outputs compared: bit for bit, or the differences of their top lists (struct cpu_test_diff);
 *   - splitmix64, the tests' seeded random numbers, and random token ids drawn from it.
 * Every helper fails the test (cmocka) on an error. */
#pragma once
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/backends/backend_open.h"

/* ---- seeded random numbers */

/* splitmix64: the next number of the sequence whose state is *s. */
static inline uint64_t cpu_test_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* t[0 .. n) = token ids in [0, V), the next n numbers of the sequence *s modulo V. */
static inline void cpu_test_random_tokens(uint64_t *s, int32_t *t, int n, int V)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(cpu_test_splitmix(s) % (uint64_t)V);
}

/* ---- checkpoints */

/* tiny_model_write(dir, o): a tiny checkpoint of options `o` in dir (made if missing). */
static inline void cpu_test_write_model(const char *dir, const struct tiny_opts *o)
{
    char err[512] = "";
    if (tiny_model_write(dir, o, err, sizeof err))
        fail_msg("tiny_model_write %s: %s", dir, err);
}

/* model_load(dir); the caller frees it (model_free). */
static inline struct model *cpu_test_load_model(const char *dir)
{
    char err[512] = "";
    struct model *m = model_load(dir, err, sizeof err);
    if (!m)
        fail_msg("model_load %s: %s", dir, err);
    return m;
}

/* model_load and tok_load_dir of dir; the caller frees both. */
static inline void cpu_test_load_dir(const char *dir, struct model **m, struct tok **tok)
{
    char err[512] = "";
    *m = cpu_test_load_model(dir);
    if (!(*tok = tok_load_dir(dir, err, sizeof err)))
        fail_msg("tok_load_dir %s: %s", dir, err);
}

/* Replaces the keys of dir/config.json that `keys` (a JSON object, borrowed) holds with its values,
 * as a checkpoint's own config would carry them. */
static inline void cpu_test_set_config(const char *dir, json_t *keys)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!c)
        fail_msg("%s: %s", path, je.text);
    assert_int_equal(json_object_update(c, keys), 0);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(2)), 0);
    json_decref(c);
}

/* "dir/name" in one of four static buffers, used in turn (valid for the next three calls). */
static inline const char *cpu_test_path(const char *dir, const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* model_load(dir) must fail with an error containing `want`; returns the whole error (a static buffer,
 * valid until the next call). */
static inline const char *cpu_test_expect_load_error(const char *dir, const char *want)
{
    static char err[1024];
    err[0] = 0;
    struct model *m = model_load(dir, err, sizeof err);
    if (m) {
        model_free(m);
        fail_msg("model_load %s succeeded, want \"%s\"", dir, want);
    }
    if (!strstr(err, want))
        fail_msg("error \"%s\" does not contain \"%s\"", err, want);
    return err;
}

/* A loaded weight view is `name` of dtype dt and shape [d0] (d1 == 0) or [d0, d1]; an F8_E4M3 one has its
 * BF16 <name>_scale_inv of 128 x 128 blocks, any other none. */
static inline void cpu_test_check_view(const struct tensor_view *v, const char *name, enum dtype dt,
                                       int64_t d0, int64_t d1)
{
    assert_non_null(v->data);
    assert_string_equal(v->name, name);
    if (v->dtype != dt)
        fail_msg("%s: dtype %s, want %s", name, dtype_name(v->dtype), dtype_name(dt));
    assert_int_equal(v->ndim, d1 ? 2 : 1);
    assert_int_equal(v->shape[0], d0);
    if (d1)
        assert_int_equal(v->shape[1], d1);
    if (dt == DT_F8_E4M3) {
        char sname[512];
        snprintf(sname, sizeof sname, "%.400s_scale_inv", name);
        assert_non_null(v->scale_inv);
        assert_string_equal(v->scale_inv->name, sname);
        assert_int_equal(v->scale_inv->dtype, DT_BF16);
        assert_int_equal(v->scale_inv->shape[0], (d0 + 127) / 128);
        assert_int_equal(v->scale_inv->shape[1], (d1 + 127) / 128);
        assert_int_equal(v->block[0], 128);
        assert_int_equal(v->block[1], 128);
    } else {
        assert_null(v->scale_inv);
    }
}

/* A tiny checkpoint in its own temporary folder, loaded. */
struct cpu_test_fixture {
    char dir[256];
    struct model *m; /* owned; freed by cpu_test_fixture_close */
};

/* Writes a tiny checkpoint of options `o` into $TMPDIR (or /tmp)/llmq-<tag>-XXXXXX and loads it. */
static inline void cpu_test_fixture_open(struct cpu_test_fixture *f, const struct tiny_opts *o,
                                         const char *tag)
{
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), tag, f->dir, sizeof f->dir), 0);
    cpu_test_write_model(f->dir, o);
    f->m = cpu_test_load_model(f->dir);
}

/* Frees the model and removes the folder (and the files in it). */
static inline void cpu_test_fixture_close(struct cpu_test_fixture *f)
{
    model_free(f->m);
    scratch_dir_remove(f->dir);
}

/* ---- the CPU backend */

/* Options for a CPU backend of blocks of `block_size` tokens, up to `max_num_seqs` sequences and
 * `max_num_batched_tokens` tokens a step, sequences of up to `max_model_len` tokens; two threads and an
 * fp32 KV cache of the backend's default size. Everything else zero: a test sets what it varies. */
static inline struct backend_opts cpu_test_opts(int block_size, int max_num_seqs, int max_num_batched_tokens,
                                                int max_model_len)
{
    struct backend_opts o;
    memset(&o, 0, sizeof o);
    o.block_size = block_size;
    o.max_num_seqs = max_num_seqs;
    o.max_num_batched_tokens = max_num_batched_tokens;
    o.max_model_len = max_model_len;
    o.threads = 2;
    o.kv_dtype = DT_F32;
    return o;
}

/* backend_open("cpu", m, o); fails the test with the backend's message if it cannot. The caller
 * frees the backend (backend_free); `m` must outlive it. */
static inline struct backend *cpu_test_backend(const struct model *m, const struct backend_opts *o)
{
    char err[512] = "";
    struct backend *be = backend_open("cpu", m, o, err, sizeof err);
    if (!be) {
        print_error("backend_open: %s\n", err);
        fail();
    }
    return be;
}

/* Greedy, with the top `ntop` logprobs. */
static inline struct sampling_params cpu_test_greedy(int ntop)
{
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 0;
    sp.logprobs = ntop;
    return sp;
}

/* One step of a sequence `tok` running tokens [pos, pos + n_new) with blocks table[0 .. n_blocks),
 * sampling (with `sp`) at its last token. Borrows tok, table and sp. */
static inline struct be_seq cpu_test_seq(const int32_t *tok, int pos, int n_new, const int32_t *table,
                                         int n_blocks, const struct sampling_params *sp)
{
    struct be_seq b;
    memset(&b, 0, sizeof b);
    b.tokens = tok;
    b.pos = pos;
    b.n_new = n_new;
    b.n_tokens = pos + n_new; /* the step always samples: logits at its last token */
    b.n_prompt = b.n_tokens;
    b.block_table = table;
    b.n_blocks = n_blocks;
    b.sample = true;
    b.sp = sp;
    return b;
}

/* backend_step(be, seqs, n, out); fails the test with the backend's error if it fails. */
static inline void cpu_test_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    if (backend_step(be, seqs, n, out) != 0) {
        print_error("step failed: %s\n", be->err);
        fail();
    }
}

/* ---- the engine */

/* engine_open(m, tok, backend_open("cpu", m, &o->be), o); the caller frees it (engine_free, which frees
 * the backend); m and tok must outlive it. */
static inline struct engine *cpu_test_engine(struct model *m, struct tok *tok, const struct engine_opts *o)
{
    char err[512] = "";
    struct backend *be = backend_open("cpu", m, &o->be, err, sizeof err);
    struct engine *e = be ? engine_open(m, tok, be, o, err, sizeof err) : NULL;
    if (!e)
        fail_msg("engine_open: %s", err);
    return e;
}

/* A greedy request for prompt[0 .. n_prompt) (borrowed) that generates exactly max_tokens tokens
 * (EOS ignored), with the top `ntop` logprobs of each (-1: none). */
static inline struct engine_request cpu_test_request(const int32_t *prompt, int n_prompt, int max_tokens,
                                                     int ntop)
{
    struct engine_request r = engine_request_default();
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.sp.temperature = 0;
    r.sp.logprobs = ntop;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
}

/* engine_add(e, r); the sequence is the engine's (engine_release). */
static inline struct engine_seq *cpu_test_add(struct engine *e, const struct engine_request *r)
{
    char err[512] = "";
    struct engine_seq *s = engine_add(e, r, err, sizeof err);
    if (!s)
        fail_msg("engine_add: %s", err);
    return s;
}

/* Steps the engine until it has no work; every step must succeed. */
static inline void cpu_test_run(struct engine *e)
{
    while (engine_has_work(e)) {
        struct engine_seq **changed;
        int n_changed;
        if (engine_step(e, &changed, &n_changed))
            fail_msg("engine_step failed");
    }
}

/* ---- what the naive references share */

/* The values of tensor v as fp32 (tensor_to_f32) in a new array the caller frees. */
static inline float *cpu_test_f32(const struct tensor_view *v)
{
    char err[256] = "";
    float *f = malloc((size_t)tensor_numel(v) * sizeof *f);
    assert_non_null(f);
    if (tensor_to_f32(v, f, err, sizeof err))
        fail_msg("tensor_to_f32 %s: %s", v->name, err);
    return f;
}

/* out[0 .. n) = x * w / rms(x), in double (out may be x). */
static inline void cpu_test_rmsnorm(double *out, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

/* row[0 .. n) = log_softmax(row), in double. */
static inline void cpu_test_log_softmax(double *row, int n)
{
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < n; i++)
        z += exp(row[i] - mx);
    for (int i = 0; i < n; i++)
        row[i] -= mx + log(z);
}

/* ---- comparing outputs */

/* Two outputs of one position bit for bit: token, chosen logprob, the top list's ids and logprobs. */
static inline bool cpu_test_same_out(const struct be_out *a, const struct be_out *b)
{
    if (a->token != b->token || a->n_top != b->n_top || a->logprob != b->logprob)
        return false;
    for (int j = 0; j < a->n_top; j++)
        if (a->top_ids[j] != b->top_ids[j] || a->top_logprobs[j] != b->top_logprobs[j])
            return false;
    return true;
}

/* Differences between two runs' outputs, gathered over positions. */
struct cpu_test_diff {
    double max, sum; /* of |dlogprob| */
    long n;          /* |dlogprob| values gathered */
    int ids;         /* greedy ids that differ (where the caller counts them) */
};

static inline void cpu_test_diff_add(struct cpu_test_diff *d, double x)
{
    d->max = x > d->max ? x : d->max;
    d->sum += x;
    d->n++;
}

static inline double cpu_test_diff_mean(const struct cpu_test_diff *d)
{
    return d->n ? d->sum / (double)d->n : 0;
}

/* got against ref at one position: |dlogprob| of every id both top lists hold. */
static inline void cpu_test_diff_tops(struct cpu_test_diff *d, const struct be_out *ref,
                                      const struct be_out *got)
{
    for (int i = 0; i < ref->n_top; i++)
        for (int k = 0; k < got->n_top; k++)
            if (got->top_ids[k] == ref->top_ids[i])
                cpu_test_diff_add(d, fabs((double)got->top_logprobs[k] - ref->top_logprobs[i]));
}
