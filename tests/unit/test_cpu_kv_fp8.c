/* engine/cpu_backend with kv_dtype DT_F8_E4M3: the fp8 KV cache oracle of the CUDA backend.
 *
 * 1. fp8 KV against fp32 KV on tiny checkpoints (two shapes, head_dim 64 and 128), teacher-forced:
 *    the logprobs differ, by a small amount (e4m3 keeps 4 significant bits: each K and V element moves
 *    by up to 2^-4 of itself, a few percent of a score), and greedy ids agree wherever the fp32 top-2
 *    gap is clear. The same holds with the bf16 emulation on (emu fp8 vs emu bf16 KV).
 * 2. Deterministic: two backends, same steps -> bitwise equal outputs. Quantization is per (token,
 *    KV head), so block size, block order and prefill chunking do not change a sequence's outputs
 *    (bitwise, plain fp32 forward).
 * 3. The jittered emulation quantizes jittered values: it differs from the unjittered one.
 * 4. The pool: kv_cache_bytes / (layers * 2 * KVH * block_size * (D + 4)) blocks. */
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

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/util/log.h"

#include "cpu_test.h"

#define NTOP 5
#define NTOK 150      /* tokens per test sequence */
#define PREFILL 40    /* first step; then one token per step */
#define CLEAR_GAP 1.0 /* about twice the largest |dlogprob| measured */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    return cpu_test_splitmix(&rng_state);
}

static void fixture_open(struct cpu_test_fixture *f, int shape, const char **name)
{
    struct tiny_opts o = tiny_opts_default();
    if (shape == 0) {
        *name = "qwen3-tied (D 64)";
        o.hidden = 128, o.heads = 4, o.kv_heads = 2, o.head_dim = 64, o.intermediate = 320, o.layers = 2;
    } else {
        *name = "qwen3-gqa4 (D 128)";
        o.hidden = 256, o.heads = 8, o.kv_heads = 2, o.head_dim = 128, o.intermediate = 512, o.layers = 3;
        o.tie = false, o.vocab = 1000, o.seed = 1;
    }
    cpu_test_fixture_open(f, &o, "kvfp8");
}

struct be_cfg {
    bool fp8, emu;
    uint64_t jitter;
    int block_size;
    int64_t kv_bytes;
};

static struct backend *open_cpu(const struct model *m, struct be_cfg c)
{
    struct backend_opts o = cpu_test_opts(c.block_size ? c.block_size : 16, 8, 1024, 512);
    o.kv_cache_bytes = c.kv_bytes;
    o.kv_dtype = c.fp8 ? DT_F8_E4M3 : DT_F32;
    o.emulate_cuda = c.emu;
    o.emulate_cuda_jitter = c.jitter;
    return cpu_test_backend(m, &o);
}

/* Runs tok[0 .. NTOK) teacher-forced in steps of `chunk` tokens (the first of PREFILL), blocks
 * table[i] = i, or shuffled (and offset by 3); out[p] after the step ending at p (unset for other p). */
static void run(struct backend *be, const int32_t *tok, int chunk, bool shuffled, struct be_out *out)
{
    const int bs = be->block_size, nb = (NTOK + bs - 1) / bs;
    int32_t table[NTOK];
    for (int i = 0; i < nb; i++)
        table[i] = i;
    if (shuffled) { /* a shuffled order, not from 0 (blocks 0..2 stay unused) */
        for (int i = nb - 1; i > 0; i--) {
            int j = (int)(rng() % (uint64_t)(i + 1));
            int32_t t = table[i];
            table[i] = table[j];
            table[j] = t;
        }
        for (int i = 0; i < nb; i++)
            table[i] += 3;
    }
    struct sampling_params sp = cpu_test_greedy(NTOP);
    for (int pos = 0; pos < NTOK;) {
        int n = pos == 0 ? PREFILL : chunk;
        n = n < NTOK - pos ? n : NTOK - pos;
        struct be_seq s = cpu_test_seq(tok, pos, n, table, nb, &sp);
        cpu_test_step(be, &s, 1, &out[pos + n - 1]);
        pos += n;
    }
}

/* got against ref at the positions that sample: |dlogprob| where the greedy ids agree, the ids that
 * differ (.ids), and in *ids_clear those of them where the reference's top-2 gap > CLEAR_GAP. */
static struct cpu_test_diff compare(const struct be_out *ref, const struct be_out *got, int *ids_clear)
{
    struct cpu_test_diff d = {0};
    *ids_clear = 0;
    for (int p = PREFILL - 1; p < NTOK; p++) {
        double gap = ref[p].top_logprobs[0] - ref[p].top_logprobs[1];
        if (ref[p].token != got[p].token) {
            d.ids++;
            *ids_clear += gap > CLEAR_GAP;
        } else {
            cpu_test_diff_tops(&d, &ref[p], &got[p]);
        }
    }
    return d;
}

static bool same(const struct be_out *a, const struct be_out *b)
{
    for (int p = PREFILL - 1; p < NTOK; p++) {
        if (a[p].token != b[p].token || memcmp(&a[p].logprob, &b[p].logprob, sizeof(float)) ||
            memcmp(a[p].top_logprobs, b[p].top_logprobs, NTOP * sizeof(float)))
            return false;
    }
    return true;
}

static void test_fp8_vs_fp32(void **state)
{
    (void)state;
    for (int shape = 0; shape < 2; shape++) {
        struct cpu_test_fixture f;
        const char *name;
        fixture_open(&f, shape, &name);
        int32_t tok[NTOK];
        cpu_test_random_tokens(&rng_state, tok, NTOK, f.m->cfg.vocab);
        for (int emu = 0; emu < 2; emu++) {
            struct backend *a = open_cpu(f.m, (struct be_cfg){false, emu, 0, 16, 0});
            struct backend *b = open_cpu(f.m, (struct be_cfg){true, emu, 0, 16, 0});
            static struct be_out oa[NTOK], ob[NTOK];
            run(a, tok, 1, false, oa);
            run(b, tok, 1, false, ob);
            int ids_clear;
            struct cpu_test_diff d = compare(oa, ob, &ids_clear);
            double mean = cpu_test_diff_mean(&d);
            printf("  %s%s: fp8 vs fp32 KV: max |dlogprob| %.4f mean %.5f over %ld, %d greedy ids differ (%d "
                   "where the gap > %.1f)\n",
                   name, emu ? " (bf16 emulation)" : "", d.max, mean, d.n, d.ids, ids_clear, CLEAR_GAP);
            /* nonzero: the pool really is quantized. Bounded: e4m3 moves each K and V element by up to
             * 2^-4 of itself (~2.5% rms), a score by ~2.5% of |q||k|/sqrt(D), about 6x the bf16
             * emulation's per-value error, whose mean effect on these chaotic random models is 0.02:
             * expect means around 0.1, measured 0.04-0.13. A wrong scale (2x on K or V), a wrong slot
             * or garbage codes move logprobs by several units. */
            assert_true(d.max > 1e-3);
            assert_true(d.max < 1.5);
            assert_true(mean < 0.3);
            assert_int_equal(ids_clear, 0);
            backend_free(a);
            backend_free(b);
        }
        cpu_test_fixture_close(&f);
    }
}

static void test_invariance(void **state)
{
    (void)state;
    struct cpu_test_fixture f;
    const char *name;
    fixture_open(&f, 1, &name);
    int32_t tok[NTOK];
    cpu_test_random_tokens(&rng_state, tok, NTOK, f.m->cfg.vocab);
    static struct be_out ref[NTOK], got[NTOK];
    struct backend *a = open_cpu(f.m, (struct be_cfg){true, false, 0, 16, 0});
    run(a, tok, 1, false, ref);
    backend_free(a);

    struct backend *b = open_cpu(f.m, (struct be_cfg){true, false, 0, 16, 0});
    run(b, tok, 1, false, got);
    assert_true(same(ref, got)); /* deterministic */
    backend_free(b);

    b = open_cpu(f.m, (struct be_cfg){true, false, 0, 32, 0});
    run(b, tok, 1, true, got);
    assert_true(same(ref, got)); /* block size 32, shuffled blocks */
    backend_free(b);

    /* chunked prefill: the positions that sample in both runs */
    static struct be_out ch[NTOK];
    b = open_cpu(f.m, (struct be_cfg){true, false, 0, 16, 0});
    run(b, tok, 10, true, ch);
    for (int p = PREFILL - 1; p < NTOK; p += 10) {
        assert_int_equal(ch[p].token, ref[p].token);
        assert_memory_equal(ch[p].top_logprobs, ref[p].top_logprobs, NTOP * sizeof(float));
    }
    backend_free(b);

    /* the jitter moves k and v before their quantization, as it moves every bf16 rounding */
    struct backend *e = open_cpu(f.m, (struct be_cfg){true, true, 0, 16, 0});
    struct backend *j = open_cpu(f.m, (struct be_cfg){true, true, 0x6a177e5ull, 16, 0});
    run(e, tok, 1, false, ref);
    run(j, tok, 1, false, got);
    int ids_clear;
    struct cpu_test_diff d = compare(ref, got, &ids_clear);
    printf("  %s: emu fp8 vs jittered emu fp8: max |dlogprob| %.4f, %d ids differ\n", name, d.max, d.ids);
    assert_false(same(ref, got));
    backend_free(e);
    backend_free(j);
    cpu_test_fixture_close(&f);
}

static void test_pool_size(void **state)
{
    (void)state;
    struct cpu_test_fixture f;
    const char *name;
    fixture_open(&f, 1, &name);
    const struct model_config *c = &f.m->cfg;
    const int64_t bytes = (int64_t)3 << 20;
    struct backend *a = open_cpu(f.m, (struct be_cfg){false, false, 0, 16, bytes});
    struct backend *b = open_cpu(f.m, (struct be_cfg){true, false, 0, 16, bytes});
    const int64_t blk32 = (int64_t)c->n_layers * 2 * c->n_kv_heads * 16 * c->head_dim * 4;
    const int64_t blk8 = (int64_t)c->n_layers * 2 * c->n_kv_heads * 16 * (c->head_dim + 4);
    printf("  %s, %lld bytes: %d fp32 blocks, %d fp8 blocks\n", name, (long long)bytes, a->num_blocks,
           b->num_blocks);
    assert_int_equal(a->num_blocks, (int)(bytes / blk32));
    assert_int_equal(b->num_blocks, (int)(bytes / blk8));
    backend_free(a);
    backend_free(b);
    cpu_test_fixture_close(&f);
}

int main(void)
{
    log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_vs_fp32),
        cmocka_unit_test(test_invariance),
        cmocka_unit_test(test_pool_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
