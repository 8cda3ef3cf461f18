/* YaRN enabled by max_model_len (model_config_extend_rope, applied by backend_open).
 *
 * The rule's values against the examples (Qwen3: max_position_embeddings 40,960); the
 * extended config against what config.json's own rope_scaling block gives through the parser and
 * backend_rope_freqs (bit for bit); and a whole forward on the CPU backend: a tiny checkpoint with a
 * native length of 64 run with max_model_len 256 must produce exactly the logprobs of the same
 * weights whose config.json says yarn / factor 4 / original 64, and differ from plain RoPE.
 * (tests/unit/test_yarn_reference.c compares the same against transformers.) */
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

#include "cpu_test.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "worker/backends/backend_open.h"

static struct model_config qwen3_14b(void)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_QWEN3;
    c.hidden = 5120, c.intermediate = 17408, c.n_layers = 40, c.n_heads = 40, c.n_kv_heads = 8;
    c.head_dim = 128, c.vocab = 151936, c.max_position = 40960, c.rope_theta = 1e6, c.rms_eps = 1e-6f;
    c.rope_scaling.type = ROPE_DEFAULT;
    return c;
}

static void test_rule_values(void **state)
{
    (void)state;
    char msg[512];
    struct model_config c = qwen3_14b();
    assert_int_equal(model_config_extend_rope(&c, 131072, msg, sizeof msg), 1);
    assert_int_equal(c.rope_scaling.type, ROPE_YARN);
    assert_true(c.rope_scaling.factor == 4.0);
    assert_int_equal(c.rope_scaling.original_max, 40960);
    assert_true(c.rope_scaling.beta_fast == 32 && c.rope_scaling.beta_slow == 1);
    assert_true(fabs(c.rope_scaling.attn_factor - (0.1 * log(4.0) + 1)) < 1e-15);
    assert_int_equal(c.max_position, 40960); /* the native length stays */
    assert_non_null(strstr(msg, "YaRN enabled"));
    assert_non_null(strstr(msg, "\"factor\": 4.0"));
    printf("%s\n", msg);

    c = qwen3_14b();
    assert_int_equal(model_config_extend_rope(&c, 65536, msg, sizeof msg), 1);
    assert_true(c.rope_scaling.factor == 2.0); /* 1.6 rounded up */
    c = qwen3_14b();
    assert_int_equal(model_config_extend_rope(&c, 40961, msg, sizeof msg), 1);
    assert_true(c.rope_scaling.factor == 2.0);

    /* at or below the native length, or unset: nothing */
    c = qwen3_14b();
    assert_int_equal(model_config_extend_rope(&c, 40960, msg, sizeof msg), 0);
    assert_int_equal(c.rope_scaling.type, ROPE_DEFAULT);
    assert_string_equal(msg, "");
    assert_int_equal(model_config_extend_rope(&c, 0, msg, sizeof msg), 0);
    assert_int_equal(c.rope_scaling.type, ROPE_DEFAULT);

    /* a model's own rope_scaling is kept; a warning when it reaches less far */
    c = qwen3_14b();
    c.rope_scaling.type = ROPE_YARN;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max = 32768;
    struct model_config before = c;
    assert_int_equal(model_config_extend_rope(&c, 131072, msg, sizeof msg), 0);
    assert_memory_equal(&c, &before, sizeof c);
    assert_string_equal(msg, "");
    assert_int_equal(model_config_extend_rope(&c, 200000, msg, sizeof msg), 0);
    assert_memory_equal(&c, &before, sizeof c);
    assert_non_null(strstr(msg, "kept as configured"));
    c.rope_scaling.type = ROPE_LLAMA3;
    before = c;
    assert_int_equal(model_config_extend_rope(&c, 131072, NULL, 0), 0);
    assert_memory_equal(&c, &before, sizeof c);
}

/* ---- a tiny checkpoint, its config.json edited */

static char tmp[256];

static void write_model(const char *dir, int max_position)
{
    struct tiny_opts o = tiny_opts_default();
    o.hidden = 64, o.intermediate = 128, o.layers = 2, o.heads = 4, o.kv_heads = 2, o.head_dim = 32;
    o.vocab = 512, o.max_position = max_position, o.seed = 5;
    cpu_test_write_model(dir, &o);
}

/* Replaces config.json's rope_scaling with yarn / factor / original. */
static void set_yarn(const char *dir, double factor, int original)
{
    json_t *keys = json_pack("{s:{s:s, s:f, s:i}}", "rope_scaling", "rope_type", "yarn", "factor", factor,
                             "original_max_position_embeddings", original);
    cpu_test_set_config(dir, keys);
    json_decref(keys);
}

static void test_rule_equals_config(void **state)
{
    (void)state;
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/cfg", tmp);
    write_model(dir, 40960);
    struct model_config plain, configured;
    assert_int_equal(model_config_load(dir, &plain, err, sizeof err), 0);
    set_yarn(dir, 4.0, 40960);
    assert_int_equal(model_config_load(dir, &configured, err, sizeof err), 0);
    assert_int_equal(model_config_extend_rope(&plain, 131072, NULL, 0), 1);
    assert_int_equal(plain.rope_scaling.type, configured.rope_scaling.type);
    assert_true(plain.rope_scaling.factor == configured.rope_scaling.factor);
    assert_int_equal(plain.rope_scaling.original_max, configured.rope_scaling.original_max);
    assert_true(plain.rope_scaling.beta_fast == configured.rope_scaling.beta_fast);
    assert_true(plain.rope_scaling.beta_slow == configured.rope_scaling.beta_slow);
    assert_true(plain.rope_scaling.attn_factor == configured.rope_scaling.attn_factor);
    float f1[16], f2[16], s1, s2;
    assert_int_equal(backend_rope_freqs(&plain, f1, &s1, err, sizeof err), 0);
    assert_int_equal(backend_rope_freqs(&configured, f2, &s2, err, sizeof err), 0);
    assert_memory_equal(f1, f2, sizeof f1);
    assert_true(s1 == s2 && s1 > 1.13f && s1 < 1.14f);
}

/* Greedy continuation of a 200-token prompt with top-5 logprobs, on the CPU backend. */
static void run(const char *dir, int max_model_len, struct be_out *out, int32_t *ids, int n_new)
{
    struct model *m;
    struct tok *tok;
    cpu_test_load_dir(dir, &m, &tok);
    struct engine_opts o = engine_opts_default();
    o.be.max_model_len = max_model_len;
    o.be.threads = 2;
    o.be.block_size = 16;
    struct engine *e = cpu_test_engine(m, tok, &o);
    int32_t prompt[200];
    uint64_t s = 99;
    for (int i = 0; i < 200; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((s >> 33) % 512);
    }
    struct engine_request r = cpu_test_request(prompt, 200, n_new, 5);
    struct engine_seq *q = cpu_test_add(e, &r);
    cpu_test_run(e);
    assert_int_equal(q->n_output, n_new);
    memcpy(out, q->logprobs, (size_t)n_new * sizeof *out);
    memcpy(ids, q->tokens + 200, (size_t)n_new * sizeof *ids);
    engine_release(e, q);
    engine_free(e);
    tok_free(tok);
    model_free(m);
}

static void test_forward(void **state)
{
    (void)state;
    enum { N = 8 };
    char by_len[512], by_cfg[512], plain[512];
    snprintf(by_len, sizeof by_len, "%s/by_len", tmp);
    snprintf(by_cfg, sizeof by_cfg, "%s/by_cfg", tmp);
    snprintf(plain, sizeof plain, "%s/plain", tmp);
    write_model(by_len, 64); /* native 64: max_model_len 256 enables yarn x4 */
    write_model(by_cfg, 256);
    set_yarn(by_cfg, 4.0, 64);
    write_model(plain, 256); /* the same weights, plain RoPE */
    struct be_out a[N], b[N], c[N];
    int32_t ia[N], ib[N], ic[N];
    run(by_len, 256, a, ia, N);
    run(by_cfg, 256, b, ib, N);
    run(plain, 256, c, ic, N);
    assert_memory_equal(ia, ib, sizeof ia);
    double worst_plain = 0;
    for (int t = 0; t < N; t++) {
        assert_true(cpu_test_same_out(&a[t], &b[t])); /* the same arithmetic: bit for bit */
        worst_plain = fmax(worst_plain, fabs(a[t].top_logprobs[0] - c[t].top_logprobs[0]));
    }
    printf(
        "yarn by max_model_len == yarn by config.json; plain RoPE differs by up to %.3f in the top logprob\n",
        worst_plain);
    assert_true(worst_plain > 1e-3 || memcmp(ia, ic, sizeof ia));
}

int main(void)
{
    if (scratch_dir_make(getenv("TMPDIR"), "rope", tmp, sizeof tmp))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_values),
        cmocka_unit_test(test_rule_equals_config),
        cmocka_unit_test(test_forward),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_remove_tree(tmp);
    return rc;
}
