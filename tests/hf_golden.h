/* Hugging Face transformers goldens for the C tests (header-only; each test is its own program, so
 * the state below is per program). Include it after <cmocka.h>.
 *
 * tests/fixtures/models/models.json lists tiny checkpoints, each re-created bit for bit by `llmq
 * make-tiny-model DIR <args>`; make_hf_fixtures.py ran transformers on them and wrote <name>.jsonl
 * (per prompt: its ids and, per generated step, the greedy id, its logprob, the top-k [id, logprob]
 * pairs and the top-2 gap) and <name>.sha256 (of the model.safetensors it read). A test:
 *
 *     static void test_entry(void **state)
 *     {
 *         struct hf_goldens f;
 *         hf_goldens_load(&f, *state);            // reads <name>.jsonl, makes the checkpoint
 *         ... model_load(f.dir), tok_load_dir(f.dir) ...
 *         struct engine_opts o = hf_golden_engine_opts(16, 4096, 4096);
 *         double worst = hf_golden_compare(&f, m, tok, &o, 0, f.n, "batch");
 *         hf_goldens_free(&f);
 *     }
 *
 *     int main(void) { return hf_golden_main("hf_reference", "models", "hfref", false, test_entry); }
 *
 * Every helper fails the test (cmocka) on an error or a difference. */
#pragma once
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_test.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/backends/backend_open.h"

/* Every logprob (chosen and top-k) must be within this of transformers': fp32 against fp32 with
 * different summation orders over up to 2000 positions differ by ~1e-5; 1e-3 is the bar and
 * leaves room without hiding a wrong RoPE, norm or YaRN ramp, which move them by > 0.1. */
#define HF_GOLDEN_TOL 1e-3

/* One prompt of a <name>.jsonl: arrays owned by the struct hf_goldens that holds it. */
struct hf_golden {
    int32_t *prompt;
    int n_prompt;
    int32_t *ids; /* [n_ids] transformers' greedy ids */
    int n_ids;
    double *lp;      /* [n_ids] chosen logprob */
    double *gap;     /* [n_ids] top-2 gap */
    int32_t *top_id; /* [n_ids][ntop] */
    double *top_lp;  /* [n_ids][ntop] */
};

/* The goldens of one models.json entry and the checkpoint re-created for them. */
struct hf_goldens {
    json_t *entry; /* borrowed from models.json */
    char name[64];
    char dir[512]; /* the checkpoint, below hf_golden_tmpdir */
    struct hf_golden *g;
    int n, ntop;
};

/* The temporary folder of this program (made and removed by hf_golden_main). */
static char hf_golden_tmpdir[256];

/* $LLMQ_SOURCE_DIR/tests/fixtures/models/<name><ext>, in a static buffer (valid until the next call). */
static inline const char *hf_golden_path(const char *name, const char *ext)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/%s%s", getenv("LLMQ_SOURCE_DIR"), name, ext);
    return path;
}

static inline void hf_golden_read(struct hf_goldens *f)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", hf_golden_path(f->name, ".jsonl"));
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("%s is missing: run tests/fixtures/models/make_hf_fixtures.py (see its header)", path);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, fp) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o)
            fail_msg("%s line %d: %s", path, f->n + 1, je.text);
        f->g = realloc(f->g, sizeof *f->g * (size_t)(f->n + 1));
        assert_non_null(f->g);
        struct hf_golden *g = &f->g[f->n++];
        json_t *pr = json_object_get(o, "prompt"), *steps = json_object_get(o, "steps");
        g->n_prompt = (int)json_array_size(pr);
        g->prompt = malloc(sizeof(int32_t) * (size_t)g->n_prompt);
        for (int i = 0; i < g->n_prompt; i++)
            g->prompt[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
        g->n_ids = (int)json_array_size(steps);
        f->ntop = (int)json_array_size(json_object_get(json_array_get(steps, 0), "top"));
        g->ids = malloc(sizeof(int32_t) * (size_t)g->n_ids);
        g->lp = malloc(sizeof(double) * (size_t)g->n_ids);
        g->gap = malloc(sizeof(double) * (size_t)g->n_ids);
        g->top_id = malloc(sizeof(int32_t) * (size_t)(g->n_ids * f->ntop));
        g->top_lp = malloc(sizeof(double) * (size_t)(g->n_ids * f->ntop));
        for (int s = 0; s < g->n_ids; s++) {
            json_t *st = json_array_get(steps, (size_t)s), *top = json_object_get(st, "top");
            g->ids[s] = (int32_t)json_integer_value(json_object_get(st, "id"));
            g->lp[s] = json_real_value(json_object_get(st, "logprob"));
            g->gap[s] = json_real_value(json_object_get(st, "gap"));
            for (int k = 0; k < f->ntop; k++) {
                json_t *pair = json_array_get(top, (size_t)k);
                g->top_id[s * f->ntop + k] = (int32_t)json_integer_value(json_array_get(pair, 0));
                g->top_lp[s * f->ntop + k] = json_real_value(json_array_get(pair, 1));
            }
        }
        json_decref(o);
    }
    free(line);
    fclose(fp);
    assert_true(f->n > 0);
}

/* Re-creates the checkpoint with the llmq binary and checks it is the one the goldens were made from. */
static inline void hf_golden_make_model(struct hf_goldens *f)
{
    char cmd[4096], want[128] = "", got[128] = "";
    snprintf(f->dir, sizeof f->dir, "%s/%s", hf_golden_tmpdir, f->name);
    json_t *args = json_object_get(f->entry, "args");
    int n = snprintf(cmd, sizeof cmd, "'%s' make-tiny-model '%s'", getenv("LLMQ_BIN"), f->dir);
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s", json_string_value(json_array_get(args, i)));
    snprintf(cmd + n, sizeof cmd - (size_t)n, " >/dev/null");
    assert_int_equal(system(cmd), 0);

    const char *path = hf_golden_path(f->name, ".sha256");
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("%s is missing: run tests/fixtures/models/make_hf_fixtures.py", path);
    assert_non_null(fgets(want, sizeof want, fp));
    fclose(fp);
    snprintf(cmd, sizeof cmd, "sha256sum '%s/model.safetensors'", f->dir);
    fp = popen(cmd, "r");
    assert_non_null(fgets(got, sizeof got, fp));
    pclose(fp);
    if (strncmp(want, got, 64))
        fail_msg("%s: make-tiny-model wrote a different checkpoint than the goldens were made from "
                 "(sha256 %.64s, fixture %.64s): regenerate them",
                 f->name, got, want);
}

/* Reads the goldens of models.json entry `entry` and re-creates its checkpoint in f->dir. */
static inline void hf_goldens_load(struct hf_goldens *f, json_t *entry)
{
    memset(f, 0, sizeof *f);
    f->entry = entry;
    snprintf(f->name, sizeof f->name, "%s", json_string_value(json_object_get(entry, "name")));
    hf_golden_read(f);
    hf_golden_make_model(f);
}

static inline void hf_goldens_free(struct hf_goldens *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->g[i].prompt), free(f->g[i].ids), free(f->g[i].lp), free(f->g[i].gap);
        free(f->g[i].top_id), free(f->g[i].top_lp);
    }
    free(f->g);
    f->g = NULL, f->n = 0;
}

/* The engine's options for the comparisons (on the CPU backend): 2 threads, up to 16 sequences, no
 * prefix caching. */
static inline struct engine_opts hf_golden_engine_opts(int block_size, int budget, int max_model_len)
{
    struct engine_opts o = engine_opts_default();
    o.be.block_size = block_size;
    o.be.max_num_batched_tokens = budget;
    o.be.max_num_seqs = 16;
    o.be.max_model_len = max_model_len;
    o.be.threads = 2;
    o.enable_prefix_caching = false;
    return o;
}

/* Runs prompts [from, to) greedily in one engine (opened with `o`) and compares each with its golden:
 * generated ids equal, chosen and top-k logprobs within HF_GOLDEN_TOL (the top-k rank by rank: ids
 * may swap among near-ties). Returns the largest |dlogprob| seen. */
static inline double hf_golden_compare(struct hf_goldens *f, struct model *m, struct tok *tok,
                                       const struct engine_opts *o, int from, int to, const char *label)
{
    struct engine *e = cpu_test_engine(m, tok, o);
    struct engine_seq **seqs = calloc((size_t)(to - from), sizeof *seqs);
    for (int i = from; i < to; i++) {
        struct engine_request r = cpu_test_request(f->g[i].prompt, f->g[i].n_prompt, f->g[i].n_ids, f->ntop);
        seqs[i - from] = cpu_test_add(e, &r);
    }
    cpu_test_run(e);
    double worst = 0;
    for (int i = from; i < to; i++) {
        struct engine_seq *s = seqs[i - from];
        const struct hf_golden *g = &f->g[i];
        assert_true(s->finished);
        assert_int_equal(s->n_output, g->n_ids);
        for (int t = 0; t < g->n_ids; t++) {
            int32_t got = s->tokens[s->n_prompt + t];
            if (got != g->ids[t])
                fail_msg("%s %s prompt %d (len %d) step %d: id %d, transformers %d (its top-2 gap %.4f)",
                         f->name, label, i, g->n_prompt, t, got, g->ids[t], g->gap[t]);
            const struct be_out *lo = &s->logprobs[t];
            double d = fabs(lo->logprob - g->lp[t]);
            worst = fmax(worst, d);
            if (d > HF_GOLDEN_TOL)
                fail_msg("%s %s prompt %d (len %d) step %d: logprob %.6f, transformers %.6f", f->name, label,
                         i, g->n_prompt, t, lo->logprob, g->lp[t]);
            assert_int_equal(lo->n_top, f->ntop);
            for (int k = 0; k < f->ntop; k++) {
                double dk = fabs(lo->top_logprobs[k] - g->top_lp[t * f->ntop + k]);
                worst = fmax(worst, dk);
                if (dk > HF_GOLDEN_TOL)
                    fail_msg("%s %s prompt %d step %d top %d: %.6f (id %d), transformers %.6f (id %d)",
                             f->name, label, i, t, k, lo->top_logprobs[k], lo->top_ids[k],
                             g->top_lp[t * f->ntop + k], g->top_id[t * f->ntop + k]);
            }
        }
        engine_release(e, s);
    }
    free(seqs);
    engine_free(e);
    return worst;
}

/* Prompts [from, to) in one engine of blocks of block_size and a token budget, compared with their goldens
 * (hf_golden_compare); prints the largest |dlogprob|. */
static inline void hf_golden_run(struct hf_goldens *f, struct model *m, struct tok *tok, int from, int to,
                                 int block_size, int budget, const char *label)
{
    struct engine_opts o = hf_golden_engine_opts(block_size, budget, 4096);
    double worst = hf_golden_compare(f, m, tok, &o, from, to, label);
    printf("%-22s %-8s prompts %d..%d: ids equal, max |dlogprob| %.2e\n", f->name, label, from, to - 1,
           worst);
}

/* The usual comparison of the models.json entry `entry`: its goldens read and its checkpoint made, then
 * all prompts in one batch (blocks of 16), each alone (blocks of 32), and all chunked (blocks of 8, a
 * token budget of chunk_budget, so prompt chunks share steps with decodes). Returns the model's config. */
static inline struct model_config hf_golden_runs(json_t *entry, int chunk_budget)
{
    struct hf_goldens f;
    hf_goldens_load(&f, entry);
    struct model *m;
    struct tok *tok;
    cpu_test_load_dir(f.dir, &m, &tok);
    hf_golden_run(&f, m, tok, 0, f.n, 16, 4096, "batch");
    for (int i = 0; i < f.n; i++)
        hf_golden_run(&f, m, tok, i, i + 1, 32, 8192, "alone");
    hf_golden_run(&f, m, tok, 0, f.n, 8, chunk_budget, "chunked");
    struct model_config c = m->cfg;
    tok_free(tok);
    model_free(m);
    hf_goldens_free(&f);
    return c;
}

/* The whole program: one cmocka test `test` per entry of models.json's array `key` (its state the
 * entry), in group `group`, with a temporary folder $TMPDIR/llmq-<tag>-XXXXXX removed afterwards. With
 * skip_missing, a missing <name>.jsonl or .sha256 skips the program (goldens not generated yet: they
 * come from transformers on the GPU machine); otherwise the test fails on it. */
static inline int hf_golden_main(const char *group, const char *key, const char *tag, bool skip_missing,
                                 CMUnitTestFunction test)
{
    const char *path = test_source("tests/fixtures/models/models.json");
    json_error_t je;
    json_t *spec = json_load_file(path, 0, &je);
    if (!spec) {
        fprintf(stderr, "%s:%d: %s\n", path, je.line, je.text);
        return 1;
    }
    json_t *models = json_object_get(spec, key);
    size_t n = json_array_size(models);
    if (n == 0) {
        fprintf(stderr, "%s has no %s\n", path, key);
        json_decref(spec);
        return 1;
    }
    for (size_t i = 0; skip_missing && i < n; i++) {
        const char *name = json_string_value(json_object_get(json_array_get(models, i), "name"));
        const char *ext[] = {".jsonl", ".sha256"};
        for (int k = 0; k < 2; k++)
            if (access(hf_golden_path(name, ext[k]), R_OK)) {
                printf("SKIPPED: %s is missing: run `python3 tests/fixtures/models/make_hf_fixtures.py "
                       "--only %s` where transformers is installed (the GPU machine)\n",
                       hf_golden_path(name, ext[k]), name);
                json_decref(spec);
                return TEST_SKIP_CODE;
            }
    }
    if (scratch_dir_make(getenv("TMPDIR"), tag, hf_golden_tmpdir, sizeof hf_golden_tmpdir)) {
        json_decref(spec);
        return 1;
    }
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    for (size_t i = 0; i < n; i++) {
        tests[i].name = json_string_value(json_object_get(json_array_get(models, i), "name"));
        tests[i].test_func = test;
        tests[i].initial_state = json_array_get(models, i);
    }
    int rc = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    test_remove_tree(hf_golden_tmpdir);
    free(tests);
    json_decref(spec);
    return rc;
}
