/* YaRN on the CPU backend against Hugging Face transformers, at positions past the native length.
 *
 * For each entry of models.json's "yarn_models" (a tiny Qwen3 with rope_scaling yarn, factor 4
 * over a native 256, prompts of up to 1000 tokens) the test re-creates the checkpoint with `llmq
 * make-tiny-model` (its sha256 must equal the fixture's), and compares greedy continuations with
 * tests/fixtures/models/<name>.jsonl (made by make_hf_fixtures.py in fp32) twice:
 *   - "config": config.json carries the entry's rope_scaling, as transformers read it;
 *   - "by max_model_len": config.json has no rope_scaling and max_position_embeddings 256, and the
 *     engine runs with max_model_len 1024, so llmq enables the same YaRN itself
 *     (model_config_extend_rope): the "enabled by model.max_model_len above the native
 *     length" against transformers' own numbers.
 * Generated ids must be equal and every logprob (chosen and top-5) within 1e-3, the bar of
 * test_hf_reference.c (a wrong ramp, factor or attention factor moves them by > 0.1).
 * Each in one batch with a large budget and in a chunked run (block size 8, budget 200 tokens).
 * Until the goldens exist (generated on the GPU machine) the test is skipped, saying so. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "testutil.h"

#define TOL 1e-3

struct golden {
    int32_t *prompt;
    int n_prompt;
    int n_ids;
    int32_t ids[64];
    double lp[64];
    double top_lp[64][8];
    double gap[64];
};

struct fixture {
    json_t *entry;
    char name[64];
    char dir[512];
    struct golden *g;
    int n, ntop;
};

static char tmpdir[256];

static char *source_path(const char *name, const char *ext)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/%s%s", getenv("LLMQ_SOURCE_DIR"), name, ext);
    return path;
}

static void read_goldens(struct fixture *f)
{
    json_error_t je;
    FILE *fp = fopen(source_path(f->name, ".jsonl"), "r");
    assert_non_null(fp);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, fp) > 0) {
        json_t *o = json_loads(line, 0, &je);
        if (!o)
            fail_msg("%s line %d: %s", source_path(f->name, ".jsonl"), f->n + 1, je.text);
        f->g = realloc(f->g, sizeof *f->g * (size_t)(f->n + 1));
        struct golden *g = &f->g[f->n++];
        memset(g, 0, sizeof *g);
        json_t *pr = json_object_get(o, "prompt"), *steps = json_object_get(o, "steps");
        g->n_prompt = (int)json_array_size(pr);
        g->prompt = malloc(sizeof *g->prompt * (size_t)g->n_prompt);
        for (int i = 0; i < g->n_prompt; i++)
            g->prompt[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
        g->n_ids = (int)json_array_size(steps);
        assert_true(g->n_ids > 0 && g->n_ids <= 64);
        f->ntop = (int)json_array_size(json_object_get(json_array_get(steps, 0), "top"));
        assert_true(f->ntop > 0 && f->ntop <= 8);
        for (int s = 0; s < g->n_ids; s++) {
            json_t *st = json_array_get(steps, (size_t)s), *top = json_object_get(st, "top");
            g->ids[s] = (int32_t)json_integer_value(json_object_get(st, "id"));
            g->lp[s] = json_real_value(json_object_get(st, "logprob"));
            g->gap[s] = json_real_value(json_object_get(st, "gap"));
            for (int k = 0; k < f->ntop; k++)
                g->top_lp[s][k] = json_real_value(json_array_get(json_array_get(top, (size_t)k), 1));
        }
        json_decref(o);
    }
    free(line);
    fclose(fp);
    assert_true(f->n > 0);
}

/* Re-creates the checkpoint and checks it is the one the goldens were made from. */
static void make_model(struct fixture *f)
{
    char cmd[4096], want[128] = "", got[128] = "";
    snprintf(f->dir, sizeof f->dir, "%s/%s", tmpdir, f->name);
    json_t *args = json_object_get(f->entry, "args");
    int n = snprintf(cmd, sizeof cmd, "'%s' make-tiny-model '%s'", getenv("LLMQ_BIN"), f->dir);
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s", json_string_value(json_array_get(args, i)));
    snprintf(cmd + n, sizeof cmd - (size_t)n, " >/dev/null");
    assert_int_equal(system(cmd), 0);
    FILE *fp = fopen(source_path(f->name, ".sha256"), "r");
    assert_non_null(fp);
    assert_non_null(fgets(want, sizeof want, fp));
    fclose(fp);
    snprintf(cmd, sizeof cmd, "sha256sum '%s/model.safetensors'", f->dir);
    fp = popen(cmd, "r");
    assert_non_null(fgets(got, sizeof got, fp));
    pclose(fp);
    if (strncmp(want, got, 64))
        fail_msg(
            "%s: make-tiny-model wrote a different checkpoint than the goldens were made from (sha256 %.64s, "
            "fixture %.64s): regenerate them",
            f->name, got, want);
}

/* Writes the keys of `overrides` into the checkpoint's config.json (as make_hf_fixtures.py does). */
static void set_config(struct fixture *f, json_t *overrides)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", f->dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    assert_non_null(c);
    assert_int_equal(json_object_update(c, overrides), 0);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(2)), 0);
    json_decref(c);
}

static void run_and_compare(struct fixture *f, const char *label, int block_size, int budget)
{
    char err[512];
    struct model *m = model_load(f->dir, err, sizeof err);
    if (!m)
        fail_msg("model_load: %s", err);
    struct tok *tok = tok_load_dir(f->dir, err, sizeof err);
    if (!tok)
        fail_msg("tok_load_dir: %s", err);
    struct engine_opts o = engine_opts_default();
    o.backend = "cpu";
    o.be.block_size = block_size;
    o.be.max_num_batched_tokens = budget;
    o.be.max_num_seqs = 16;
    o.be.max_model_len = (int)json_integer_value(json_object_get(f->entry, "max_model_len"));
    o.be.threads = 2;
    o.enable_prefix_caching = false;
    struct engine *e = engine_open(m, tok, &o, err, sizeof err);
    if (!e)
        fail_msg("engine_open: %s", err);
    struct engine_seq **seqs = calloc((size_t)f->n, sizeof *seqs);
    for (int i = 0; i < f->n; i++) {
        struct engine_request r = engine_request_default();
        r.prompt = f->g[i].prompt;
        r.n_prompt = f->g[i].n_prompt;
        r.sp.temperature = 0;
        r.sp.logprobs = f->ntop;
        r.max_tokens = f->g[i].n_ids;
        r.ignore_eos = true;
        seqs[i] = engine_add(e, &r, err, sizeof err);
        if (!seqs[i])
            fail_msg("engine_add: %s", err);
    }
    while (engine_has_work(e)) {
        struct engine_seq **changed;
        int nc;
        if (engine_step(e, &changed, &nc))
            fail_msg("engine_step failed");
    }
    double worst = 0;
    int past = 0;
    for (int i = 0; i < f->n; i++) {
        struct engine_seq *s = seqs[i];
        struct golden *g = &f->g[i];
        assert_true(s->finished);
        assert_int_equal(s->n_output, g->n_ids);
        past += g->n_prompt > 256;
        for (int t = 0; t < g->n_ids; t++) {
            int32_t got = s->tokens[s->n_prompt + t];
            if (got != g->ids[t])
                fail_msg("%s %s prompt %d (len %d) step %d: id %d, transformers %d (its top-2 gap %.4f)",
                         f->name, label, i, g->n_prompt, t, got, g->ids[t], g->gap[t]);
            const struct be_out *lo = &s->logprobs[t];
            double d = fabs(lo->logprob - g->lp[t]);
            worst = fmax(worst, d);
            if (d > TOL)
                fail_msg("%s %s prompt %d (len %d) step %d: logprob %.6f, transformers %.6f", f->name, label,
                         i, g->n_prompt, t, lo->logprob, g->lp[t]);
            assert_int_equal(lo->n_top, f->ntop);
            for (int k = 0; k < f->ntop; k++) {
                double dk = fabs(lo->top_logprobs[k] - g->top_lp[t][k]);
                worst = fmax(worst, dk);
                if (dk > TOL)
                    fail_msg("%s %s prompt %d step %d top %d: %.6f, transformers %.6f", f->name, label, i, t,
                             k, lo->top_logprobs[k], g->top_lp[t][k]);
            }
        }
        engine_release(e, s);
    }
    assert_true(past > 0); /* the point: positions past the native length */
    printf("%-12s %-28s %d prompts (%d past 256 tokens): ids equal, max |dlogprob| %.2e\n", f->name, label,
           f->n, past, worst);
    free(seqs);
    engine_free(e);
    tok_free(tok);
    model_free(m);
}

static void test_entry(void **state)
{
    struct fixture f;
    memset(&f, 0, sizeof f);
    f.entry = *state;
    snprintf(f.name, sizeof f.name, "%s", json_string_value(json_object_get(f.entry, "name")));
    read_goldens(&f);
    make_model(&f);
    set_config(&f, json_object_get(f.entry, "config"));
    run_and_compare(&f, "config rope_scaling, batch", 16, 4096);
    run_and_compare(&f, "config rope_scaling, chunked", 8, 200);
    set_config(&f, json_object_get(f.entry, "native_config"));
    run_and_compare(&f, "by max_model_len, batch", 16, 4096);
    run_and_compare(&f, "by max_model_len, chunked", 8, 200);
    for (int i = 0; i < f.n; i++)
        free(f.g[i].prompt);
    free(f.g);
}

int main(void)
{
    const char *path = test_source("tests/fixtures/models/models.json");
    json_error_t je;
    json_t *spec = json_load_file(path, 0, &je);
    if (!spec) {
        fprintf(stderr, "%s:%d: %s\n", path, je.line, je.text);
        return 1;
    }
    json_t *models = json_object_get(spec, "yarn_models");
    size_t n = json_array_size(models);
    if (n == 0) {
        fprintf(stderr, "%s has no yarn_models\n", path);
        return 1;
    }
    /* the one reason to skip: goldens not generated yet (they come from transformers on the GPU machine) */
    for (size_t i = 0; i < n; i++) {
        const char *name = json_string_value(json_object_get(json_array_get(models, i), "name"));
        const char *ext[] = {".jsonl", ".sha256"};
        for (int k = 0; k < 2; k++)
            if (access(source_path(name, ext[k]), R_OK)) {
                printf("SKIPPED: %s is missing: run `python3 tests/fixtures/models/make_hf_fixtures.py "
                       "--only %s` "
                       "where transformers is installed (the GPU machine)\n",
                       source_path(name, ext[k]), name);
                json_decref(spec);
                return TEST_SKIP_CODE;
            }
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llmq-yarnref-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    for (size_t i = 0; i < n; i++) {
        tests[i].name = json_string_value(json_object_get(json_array_get(models, i), "name"));
        tests[i].test_func = test_entry;
        tests[i].initial_state = json_array_get(models, i);
    }
    int rc = _cmocka_run_group_tests("yarn_reference", tests, n, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) {
    }
    free(tests);
    json_decref(spec);
    return rc;
}
