/* engine/bench.c's roofline model of a step: what each dtype choice changes in a step's bytes and
 * flops, on Qwen3-14B's shapes (the numbers llmq bench divides by). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "engine/bench.h"
#include "engine/random_model.h"

/* One step of a decode sequence at position 200 and a prefill chunk of 64 tokens that samples
 * (sample_prefill) or not; returns the roofline it adds to. */
static struct bench_roofline one_step(const struct model_config *c, bool fp8w, bool fp8lm,
                                      bool sample_prefill, bool decode)
{
    struct bench_roofline r;
    memset(&r, 0, sizeof r);
    r.fp8_weights = fp8w, r.fp8_lm_head = fp8lm;
    struct be_seq s[2];
    memset(s, 0, sizeof s);
    s[0].pos = 200, s[0].n_new = 1, s[0].sample = true;
    s[1].pos = 0, s[1].n_new = 64, s[1].sample = sample_prefill;
    bench_roofline_step(&r, c, decode ? s : s + 1, decode ? 2 : 1);
    return r;
}

static void test_lm_head_bytes(void **state)
{
    (void)state;
    struct model_config c;
    char err[256];
    assert_int_equal(random_model_config("qwen3-14b", &c, err, sizeof err), 0);
    const double V = c.vocab, C = c.hidden, L = c.n_layers, F = c.intermediate;
    const double QKV = (double)(c.n_heads + 2 * c.n_kv_heads) * c.head_dim,
                 HD = (double)c.n_heads * c.head_dim;
    const double lin = QKV * C + HD * C + 3 * F * C;
    for (int fw = 0; fw < 2; fw++) {
        /* a step that samples: the projection counts 2 bytes a weight in bf16, 1 in fp8 */
        struct bench_roofline a = one_step(&c, fw, false, true, true), b = one_step(&c, fw, true, true, true);
        assert_true(a.bytes - b.bytes == V * C);
        assert_true(a.flops == b.flops); /* the same products, at another rate */
        assert_true(b.ideal_s < a.ideal_s);
        /* a step where nothing samples reads no projection */
        a = one_step(&c, fw, false, false, false), b = one_step(&c, fw, true, false, false);
        assert_true(a.bytes == b.bytes);
        assert_true(a.ideal_s == b.ideal_s);
    }
    /* fp8 linear weights count the layers' matrices once, the projection as it is */
    struct bench_roofline a = one_step(&c, false, false, true, true),
                          b = one_step(&c, true, false, true, true);
    assert_true(a.bytes - b.bytes == L * lin);
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fabs(b);
}

/* Attention's part of the floor: a decode step reads K and V of its context (bytes-bound), a long
 * prefill chunk is flops-bound; never more than the step's whole ideal time. */
static void test_attention_floor(void **state)
{
    (void)state;
    struct model_config c;
    char err[256];
    assert_int_equal(random_model_config("qwen3-14b", &c, err, sizeof err), 0);
    const double L = c.n_layers, KVH = c.n_kv_heads, D = c.head_dim, HD = (double)c.n_heads * c.head_dim;
    for (int f8 = 0; f8 < 2; f8++) {
        struct bench_roofline r;
        memset(&r, 0, sizeof r);
        r.fp8_kv = f8;
        struct be_seq s;
        memset(&s, 0, sizeof s);
        s.pos = 65535, s.n_new = 1, s.sample = true; /* one decode step at 65,536 keys */
        bench_roofline_step(&r, &c, &s, 1);
        const double kvb = f8 ? 2 * KVH * (D + 4) : 4 * KVH * D;
        assert_true(near(r.attn_ideal_s, L * kvb * 65536 / BENCH_COPY_BPS));
        assert_true(r.attn_ideal_s < r.ideal_s);
        /* a prefill chunk of 8192 tokens after 57,344 cached: 4 L HD flops per causal pair */
        memset(&r, 0, sizeof r);
        r.fp8_kv = f8;
        s.pos = 57344, s.n_new = 8192, s.sample = false;
        bench_roofline_step(&r, &c, &s, 1);
        const double pairs = 8192.0 * 57344 + 8192.0 * 8193 / 2;
        assert_true(near(r.attn_ideal_s, 4 * L * HD * pairs / BENCH_BF16_FLOPS));
        assert_true(r.attn_ideal_s <= r.ideal_s && r.attn_ideal_s > 0.4 * r.ideal_s);
    }
}

/* Qwen3-30B-A3B (every layer MoE, 128 experts, 8 per token): a token runs ~2.7 B matrix weights (attention,
 * router, 8 experts of 3 x 768 x 2048 per layer; ~3.3 B "active" with the embedding and lm_head); one
 * token reads only its 8 experts, a step of many tokens reads all ~29.9 B layer weights. */
static void test_moe(void **state)
{
    (void)state;
    struct model_config c;
    char err[256];
    assert_int_equal(random_model_config("qwen3-30b-a3b", &c, err, sizeof err), 0);
    assert_int_equal(model_moe_layers(&c), 48);
    const double C = 2048, attn = (4096.0 + 2 * 512) * C + 4096 * C, expert = 3 * 768 * C;
    const double per_token = 48 * (attn + 128 * C + 8 * expert), all = 48 * (attn + 128 * C + 128 * expert);
    struct bench_roofline r;
    memset(&r, 0, sizeof r);
    struct be_seq s;
    memset(&s, 0, sizeof s);
    s.pos = 0, s.n_new = 1; /* one token, no sampling, no context: weights, one embedding row, its K/V */
    bench_roofline_step(&r, &c, &s, 1);
    assert_true(near(r.flops, 2 * per_token + 4 * 48 * 4096.0));
    const double kv = 48 * 2 * 2 * 512.0 * 2; /* K and V read and written, bf16 */
    const double small = 48 * 2 * (2 * C + 2 * 128);
    assert_true(near(r.bytes, 2 * per_token + small + 2 * C + 2 * C + kv));
    /* 4096 tokens select (almost) every expert: the weights read approach all of them */
    memset(&r, 0, sizeof r);
    s.n_new = 4096;
    bench_roofline_step(&r, &c, &s, 1);
    assert_true(r.bytes > 2 * all && r.bytes < 2 * all * 1.01 + 4096 * (2 * C + kv));
    assert_true(near(r.flops / 4096, 2 * per_token + 4 * 48 * 4096.0 * 4097 / 2)); /* causal pairs / token */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_lm_head_bytes),
                                       cmocka_unit_test(test_attention_floor), cmocka_unit_test(test_moe)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
