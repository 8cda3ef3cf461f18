/* The CPU backend against Hugging Face transformers (fp32, eager attention).
 *
 * For each tiny checkpoint of tests/fixtures/models/models.json the test re-creates it with
 * `llmq make-tiny-model` (deterministic; the sha256 of model.safetensors must equal the one the
 * fixture was made from), runs every fixture prompt greedily through the engine on the CPU
 * backend, and compares with tests/fixtures/models/<name>.jsonl (made by make_hf_fixtures.py):
 *   - the generated ids exactly;
 *   - the chosen token's logprob and the top-5 logprobs within 1e-3 (fp32 against fp32 with
 *     different summation orders over up to 2000 positions: differences are ~1e-5; 1e-3 is the
 *     issue's bar and leaves room without hiding a wrong RoPE or norm, which move them by > 0.1).
 * Three runs per model: all prompts in one batch; one by one; and one batch with a small token
 * budget and block size, so prompts run in chunks over many steps and share the step with decodes. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "testutil.h"

#define TOL 1e-3

struct fixture_prompt {
    int32_t *prompt;
    int n_prompt;
    int32_t *ids;
    int n_ids;
    double *lp;      /* [n_ids] chosen logprob */
    int32_t *top_id; /* [n_ids][ntop] */
    double *top_lp;
    double *gap;
};

struct fixture {
    char name[64];
    char dir[512];
    struct fixture_prompt *p;
    int n;
    int ntop;
};

static char tmpdir[256];

static void read_prompts(struct fixture *f)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/%s.jsonl", getenv("LLMQ_SOURCE_DIR"), f->name);
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("%s is missing: run tests/fixtures/models/make_hf_fixtures.py (see its header)", path);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, fp) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        f->p = realloc(f->p, sizeof *f->p * (size_t)(f->n + 1));
        struct fixture_prompt *fp1 = &f->p[f->n++];
        json_t *pr = json_object_get(o, "prompt"), *steps = json_object_get(o, "steps");
        fp1->n_prompt = (int)json_array_size(pr);
        fp1->prompt = malloc(sizeof(int32_t) * (size_t)fp1->n_prompt);
        for (int i = 0; i < fp1->n_prompt; i++)
            fp1->prompt[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
        fp1->n_ids = (int)json_array_size(steps);
        f->ntop = (int)json_array_size(json_object_get(json_array_get(steps, 0), "top"));
        fp1->ids = malloc(sizeof(int32_t) * (size_t)fp1->n_ids);
        fp1->lp = malloc(sizeof(double) * (size_t)fp1->n_ids);
        fp1->gap = malloc(sizeof(double) * (size_t)fp1->n_ids);
        fp1->top_id = malloc(sizeof(int32_t) * (size_t)(fp1->n_ids * f->ntop));
        fp1->top_lp = malloc(sizeof(double) * (size_t)(fp1->n_ids * f->ntop));
        for (int s = 0; s < fp1->n_ids; s++) {
            json_t *st = json_array_get(steps, (size_t)s), *top = json_object_get(st, "top");
            fp1->ids[s] = (int32_t)json_integer_value(json_object_get(st, "id"));
            fp1->lp[s] = json_real_value(json_object_get(st, "logprob"));
            fp1->gap[s] = json_real_value(json_object_get(st, "gap"));
            for (int k = 0; k < f->ntop; k++) {
                json_t *pair = json_array_get(top, (size_t)k);
                fp1->top_id[s * f->ntop + k] = (int32_t)json_integer_value(json_array_get(pair, 0));
                fp1->top_lp[s * f->ntop + k] = json_real_value(json_array_get(pair, 1));
            }
        }
        json_decref(o);
    }
    free(line);
    fclose(fp);
    assert_true(f->n > 0);
}

/* Re-creates the checkpoint with the llmq binary and checks it is the one the fixture saw. */
static void make_model(struct fixture *f, json_t *args)
{
    char cmd[4096];
    snprintf(f->dir, sizeof f->dir, "%s/%s", tmpdir, f->name);
    int n = snprintf(cmd, sizeof cmd, "'%s' make-tiny-model '%s'", getenv("LLMQ_BIN"), f->dir);
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s", json_string_value(json_array_get(args, i)));
    snprintf(cmd + n, sizeof cmd - (size_t)n, " >/dev/null");
    assert_int_equal(system(cmd), 0);

    char want[128] = "", got[128] = "", path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/%s.sha256", getenv("LLMQ_SOURCE_DIR"), f->name);
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
        fail_msg("%s: make-tiny-model wrote a different checkpoint than the fixture was made from "
                 "(sha256 %.64s, fixture %.64s): regenerate the fixtures", f->name, got, want);
}

/* Runs prompts [from, to) in one engine; compares each with the fixture. */
static void run_and_compare(struct fixture *f, struct model *m, struct tok *tok, int from, int to, int block_size,
                            int budget, const char *label)
{
    char err[512];
    struct engine_opts o = engine_opts_default();
    o.backend = "cpu";
    o.be.block_size = block_size;
    o.be.max_num_batched_tokens = budget;
    o.be.max_num_seqs = 16;
    o.be.max_model_len = 4096;
    o.be.threads = 2;
    o.enable_prefix_caching = false;
    struct engine *e = engine_open(m, tok, &o, err, sizeof err);
    if (!e)
        fail_msg("engine_open: %s", err);
    struct engine_seq **seqs = calloc((size_t)(to - from), sizeof *seqs);
    for (int i = from; i < to; i++) {
        struct engine_request r = engine_request_default();
        r.prompt = f->p[i].prompt;
        r.n_prompt = f->p[i].n_prompt;
        r.sp.temperature = 0;
        r.sp.logprobs = f->ntop;
        r.max_tokens = f->p[i].n_ids;
        r.ignore_eos = true;
        seqs[i - from] = engine_add(e, &r, err, sizeof err);
        if (!seqs[i - from])
            fail_msg("engine_add: %s", err);
    }
    while (engine_has_work(e)) {
        struct engine_seq **changed;
        int nc;
        if (engine_step(e, &changed, &nc))
            fail_msg("engine_step failed");
    }
    double worst = 0;
    for (int i = from; i < to; i++) {
        struct engine_seq *s = seqs[i - from];
        struct fixture_prompt *p = &f->p[i];
        assert_true(s->finished);
        assert_int_equal(s->n_output, p->n_ids);
        for (int t = 0; t < p->n_ids; t++) {
            int32_t got = s->tokens[s->n_prompt + t];
            if (got != p->ids[t])
                fail_msg("%s %s prompt %d (len %d) step %d: id %d, transformers %d (its top-2 gap %.4f)", f->name,
                         label, i, p->n_prompt, t, got, p->ids[t], p->gap[t]);
            const struct be_out *lo = &s->logprobs[t];
            double d = fabs(lo->logprob - p->lp[t]);
            worst = fmax(worst, d);
            if (d > TOL)
                fail_msg("%s %s prompt %d step %d: logprob %.6f, transformers %.6f", f->name, label, i, t,
                         lo->logprob, p->lp[t]);
            assert_int_equal(lo->n_top, f->ntop);
            for (int k = 0; k < f->ntop; k++) {
                /* ids may swap among near-ties; compare the values rank by rank */
                double dk = fabs(lo->top_logprobs[k] - p->top_lp[t * f->ntop + k]);
                worst = fmax(worst, dk);
                if (dk > TOL)
                    fail_msg("%s %s prompt %d step %d top %d: %.6f (id %d), transformers %.6f (id %d)", f->name,
                             label, i, t, k, lo->top_logprobs[k], lo->top_ids[k], p->top_lp[t * f->ntop + k],
                             p->top_id[t * f->ntop + k]);
            }
        }
        engine_release(e, s);
    }
    printf("%-20s %-12s prompts %d..%d: ids equal, max |dlogprob| %.2e\n", f->name, label, from, to - 1, worst);
    free(seqs);
    engine_free(e);
}

static void test_model(void **state)
{
    json_t *entry = *state;
    struct fixture f = {0};
    snprintf(f.name, sizeof f.name, "%s", json_string_value(json_object_get(entry, "name")));
    read_prompts(&f);
    make_model(&f, json_object_get(entry, "args"));
    char err[512];
    struct model *m = model_load(f.dir, err, sizeof err);
    if (!m)
        fail_msg("model_load: %s", err);
    struct tok *tok = tok_load_dir(f.dir, err, sizeof err);
    if (!tok)
        fail_msg("tok_load_dir: %s", err);
    run_and_compare(&f, m, tok, 0, f.n, 16, 4096, "batch");
    for (int i = 0; i < f.n; i++)
        run_and_compare(&f, m, tok, i, i + 1, 32, 8192, "alone");
    run_and_compare(&f, m, tok, 0, f.n, 8, 200, "chunked");
    tok_free(tok);
    model_free(m);
    for (int i = 0; i < f.n; i++) {
        free(f.p[i].prompt), free(f.p[i].ids), free(f.p[i].lp), free(f.p[i].gap);
        free(f.p[i].top_id), free(f.p[i].top_lp);
    }
    free(f.p);
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
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llmq-hfref-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    json_t *models = json_object_get(spec, "models");
    size_t n = json_array_size(models);
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    for (size_t i = 0; i < n; i++) {
        tests[i].name = json_string_value(json_object_get(json_array_get(models, i), "name"));
        tests[i].test_func = test_model;
        tests[i].initial_state = json_array_get(models, i);
    }
    int rc = _cmocka_run_group_tests("hf_reference", tests, n, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) {
    }
    free(tests);
    json_decref(spec);
    return rc;
}
