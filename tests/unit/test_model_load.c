/* engine/model.c and engine/tiny_model.c: every architecture, dtype, tying and sharding of a tiny
 * checkpoint loads with the right views; the dtypes agree with one another (the same seed draws the
 * same weights: bf16/f16 are the f32 weights rounded, fp8 dequantizes to within e4m3's precision);
 * broken checkpoints and configs fail with messages that name the file, the tensor and the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/tiny_model.h"
#include "engine/util/scratch_dir.h"

#include "cpu_test.h"

static char tmpdir[256];
static char err[1024];

static int setup(void **state)
{
    return scratch_dir_make(getenv("TMPDIR"), "test-model", tmpdir, sizeof tmpdir);
}

static int teardown(void **state)
{
    return test_remove_tree(tmpdir);
}

static const char *sub(const char *name)
{
    return cpu_test_path(tmpdir, name);
}

static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static void check_model(const struct model *m, const struct tiny_opts *o)
{
    const struct model_config *c = &m->cfg;
    int D = o->head_dim ? o->head_dim : o->hidden / o->heads;
    assert_int_equal(c->arch, o->arch);
    assert_int_equal(c->hidden, o->hidden);
    assert_int_equal(c->intermediate, o->intermediate);
    assert_int_equal(c->n_layers, o->layers);
    assert_int_equal(c->n_heads, o->heads);
    assert_int_equal(c->n_kv_heads, o->kv_heads);
    assert_int_equal(c->head_dim, D);
    assert_int_equal(c->vocab, o->vocab ? o->vocab : 512);
    assert_int_equal(c->max_position, o->max_position);
    assert_true(c->rope_theta == o->rope_theta);
    assert_true(c->rms_eps == 1e-6f);
    assert_int_equal(c->tie_embeddings, o->tie);
    assert_int_equal(c->qk_norm, o->arch == ARCH_QWEN3);
    assert_int_equal(c->qkv_bias, o->arch == ARCH_QWEN2);
    assert_int_equal(c->fp8_blocks, o->dtype == DT_F8_E4M3);
    assert_int_equal(c->rope_scaling.type, ROPE_DEFAULT);
    /* the minimal tokenizer: 256 bytes, 16 merges, then <|endoftext|> 272, <|im_start|> 273, <|im_end|> 274
     */
    assert_int_equal(c->n_eos, 2);
    assert_int_equal(c->eos_ids[0], 274);
    assert_int_equal(c->eos_ids[1], 272);
    assert_int_equal(c->bos_id, 272);
    assert_int_equal(c->pad_id, 272);
    assert_false(c->has_sampling_defaults);

    enum dtype lin = o->dtype, other = o->dtype == DT_F8_E4M3 ? DT_BF16 : o->dtype;
    int64_t C = o->hidden, F = o->intermediate, V = c->vocab, QD = (int64_t)o->heads * D,
            KD = (int64_t)o->kv_heads * D;
    char n[200];
    cpu_test_check_view(&m->embed, "model.embed_tokens.weight", other, V, C);
    cpu_test_check_view(&m->final_norm, "model.norm.weight", other, C, 0);
    if (o->tie) {
        assert_ptr_equal(m->lm_head.data, m->embed.data);
    } else {
        cpu_test_check_view(&m->lm_head, "lm_head.weight", other, V, C);
        assert_ptr_not_equal(m->lm_head.data, m->embed.data);
    }
    for (int l = 0; l < o->layers; l++) {
        const struct layer_weights *w = &m->layers[l];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.%s", l, s), n)
        cpu_test_check_view(&w->attn_norm, NAME("input_layernorm.weight"), other, C, 0);
        cpu_test_check_view(&w->mlp_norm, NAME("post_attention_layernorm.weight"), other, C, 0);
        cpu_test_check_view(&w->wq, NAME("self_attn.q_proj.weight"), lin, QD, C);
        cpu_test_check_view(&w->wk, NAME("self_attn.k_proj.weight"), lin, KD, C);
        cpu_test_check_view(&w->wv, NAME("self_attn.v_proj.weight"), lin, KD, C);
        cpu_test_check_view(&w->wo, NAME("self_attn.o_proj.weight"), lin, C, QD);
        cpu_test_check_view(&w->w_gate, NAME("mlp.gate_proj.weight"), lin, F, C);
        cpu_test_check_view(&w->w_up, NAME("mlp.up_proj.weight"), lin, F, C);
        cpu_test_check_view(&w->w_down, NAME("mlp.down_proj.weight"), lin, C, F);
        if (o->arch == ARCH_QWEN2) {
            cpu_test_check_view(&w->bq, NAME("self_attn.q_proj.bias"), other, QD, 0);
            cpu_test_check_view(&w->bk, NAME("self_attn.k_proj.bias"), other, KD, 0);
            cpu_test_check_view(&w->bv, NAME("self_attn.v_proj.bias"), other, KD, 0);
        } else {
            assert_null(w->bq.data);
            assert_null(w->bk.data);
            assert_null(w->bv.data);
        }
        if (o->arch == ARCH_QWEN3) {
            cpu_test_check_view(&w->q_norm, NAME("self_attn.q_norm.weight"), other, D, 0);
            cpu_test_check_view(&w->k_norm, NAME("self_attn.k_norm.weight"), other, D, 0);
        } else {
            assert_null(w->q_norm.data);
            assert_null(w->k_norm.data);
        }
#undef NAME
    }
}

static struct tiny_opts opts(enum model_arch arch, enum dtype dt, bool tie, int shards)
{
    struct tiny_opts o = tiny_opts_default();
    o.arch = arch;
    o.dtype = dt;
    o.tie = tie;
    o.shards = shards;
    o.seed = 42;
    return o;
}

/* Every tensor of a and b holds the same bytes. */
static void same_tensors(const struct model *a, const struct model *b)
{
    assert_int_equal(a->files->n_tensors, b->files->n_tensors);
    for (int f = 0; f < a->files->n_files; f++)
        for (int i = 0; i < a->files->files[f].n_tensors; i++) {
            const struct st_tensor *t = &a->files->files[f].tensors[i], *u = st_find(b->files, t->view.name);
            assert_non_null(u);
            assert_int_equal(t->end - t->begin, u->end - u->begin);
            assert_memory_equal(t->view.data, u->view.data, t->end - t->begin);
        }
}

static void test_variants_load(void **state)
{
    static const enum model_arch archs[] = {ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA};
    static const enum dtype dts[] = {DT_BF16, DT_F16, DT_F32, DT_F8_E4M3};
    int count = 0;
    for (int a = 0; a < 3; a++)
        for (int d = 0; d < 4; d++)
            for (int tie = 0; tie < 2; tie++) {
                struct model *ms[2];
                for (int sh = 0; sh < 2; sh++) {
                    struct tiny_opts o = opts(archs[a], dts[d], tie, sh ? 3 : 1);
                    char name[64];
                    snprintf(name, sizeof name, "v%d%d%d%d", a, d, tie, sh);
                    cpu_test_write_model(sub(name), &o);
                    ms[sh] = cpu_test_load_model(sub(name));
                    check_model(ms[sh], &o);
                    assert_int_equal(ms[sh]->files->n_files, sh ? 3 : 1);
                    count++;
                }
                same_tensors(ms[0], ms[1]); /* sharding moves tensors, never changes them */
                model_free(ms[0]);
                model_free(ms[1]);
            }
    assert_int_equal(count, 48);
}

/* e4m3 decoded from its fields, independent of engine/dtype.c */
static double e4m3_ref(uint8_t b)
{
    int e = (b >> 3) & 0xf, m = b & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

static void compare_dtypes(const struct tensor_view *v32, const struct tensor_view *v, enum dtype dt)
{
    int64_t n = tensor_numel(v32);
    assert_int_equal(tensor_numel(v), n);
    const float *w = v32->data;
    float *deq = cpu_test_f32(v);
    if (dt == DT_BF16 || dt == DT_F16) {
        const uint16_t *h = v->data;
        for (int64_t i = 0; i < n; i++) {
            uint16_t want = dt == DT_BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
            if (h[i] != want)
                fail_msg("%s[%lld]: 0x%04x, want 0x%04x for %g", v->name, (long long)i, h[i], want,
                         (double)w[i]);
        }
    } else if (dt == DT_F8_E4M3) {
        const uint8_t *q = v->data;
        const uint16_t *s = v->scale_inv->data;
        int64_t cols = v->shape[1], scols = v->scale_inv->shape[1];
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i / cols, c = i % cols;
            uint32_t sb = (uint32_t)s[(r / 128) * scols + c / 128] << 16;
            float scale;
            memcpy(&scale, &sb, 4);
            float want = (float)e4m3_ref(q[i]) * scale; /* the dequantization, computed here */
            if (deq[i] != want)
                fail_msg("%s[%lld]: tensor_to_f32 %g, dequantized %g", v->name, (long long)i, (double)deq[i],
                         (double)want);
            /* and it is the original weight to within e4m3's precision */
            double bound = fabs(w[i]) / 16 * (1 + 1e-5) + scale * 0x1p-10;
            if (fabs(deq[i] - w[i]) > bound)
                fail_msg("%s[%lld]: %g dequantizes to %g (bound %g)", v->name, (long long)i, (double)w[i],
                         (double)deq[i], bound);
        }
    }
    free(deq);
}

static void test_dtypes_agree(void **state)
{
    static const enum model_arch archs[] = {ARCH_QWEN3, ARCH_QWEN2};
    for (int a = 0; a < 2; a++) {
        struct tiny_opts o = opts(archs[a], DT_F32, false, 1);
        o.hidden = 160; /* several fp8 blocks, partial ones at the edges */
        o.intermediate = 300;
        o.heads = 5;
        o.kv_heads = 1;
        o.head_dim = 48;
        cpu_test_write_model(sub("f32"), &o);
        struct model *m32 = cpu_test_load_model(sub("f32"));
        static const enum dtype dts[] = {DT_BF16, DT_F16, DT_F8_E4M3};
        for (int d = 0; d < 3; d++) {
            o.dtype = dts[d];
            cpu_test_write_model(sub("other"), &o);
            struct model *m = cpu_test_load_model(sub("other"));
            check_model(m, &o);
            enum dtype other = dts[d] == DT_F8_E4M3 ? DT_BF16 : dts[d];
            compare_dtypes(&m32->embed, &m->embed, other);
            compare_dtypes(&m32->lm_head, &m->lm_head, other);
            for (int l = 0; l < o.layers; l++) {
                const struct layer_weights *w32 = &m32->layers[l], *w = &m->layers[l];
                compare_dtypes(&w32->wq, &w->wq, dts[d]);
                compare_dtypes(&w32->wk, &w->wk, dts[d]);
                compare_dtypes(&w32->wo, &w->wo, dts[d]);
                compare_dtypes(&w32->w_up, &w->w_up, dts[d]);
                compare_dtypes(&w32->w_down, &w->w_down, dts[d]);
                compare_dtypes(&w32->attn_norm, &w->attn_norm, other);
                if (o.arch == ARCH_QWEN2)
                    compare_dtypes(&w32->bq, &w->bq, other);
            }
            model_free(m);
        }
        model_free(m32);
    }
}

static void stats(const struct tensor_view *v, double *mean, double *std)
{
    float *f = cpu_test_f32(v);
    int64_t n = tensor_numel(v);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += f[i];
        s2 += (double)f[i] * f[i];
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
    free(f);
}

/* The documented weight scales (tiny_model.h), and different seeds give different weights. */
static void test_weight_scales(void **state)
{
    struct tiny_opts o = opts(ARCH_QWEN2, DT_F32, false, 1);
    o.hidden = 256;
    o.intermediate = 512;
    o.heads = 8;
    o.kv_heads = 4;
    cpu_test_write_model(sub("scales"), &o);
    struct model *m = cpu_test_load_model(sub("scales"));
    double mean, std;
    stats(&m->embed, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 4 / 16.0) < 0.01);
    stats(&m->lm_head, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 4 / 16.0) < 0.01);
    stats(&m->layers[0].wq, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 1 / 16.0) < 0.002);
    stats(&m->layers[1].w_down, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 4 / sqrt(512)) < 0.006);
    stats(&m->layers[0].wo, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 4 / 16.0) < 0.006);
    stats(&m->layers[0].w_gate, &mean, &std);
    assert_true(fabs(mean) < 0.01 && fabs(std - 1 / 16.0) < 0.002);
    stats(&m->layers[1].mlp_norm, &mean, &std);
    assert_true(fabs(mean - 1) < 0.03 && fabs(std - 0.1) < 0.02);
    stats(&m->layers[0].bk, &mean, &std);
    assert_true(fabs(mean) < 0.2 && fabs(std - 0.5) < 0.15);
    o.seed = 43;
    cpu_test_write_model(sub("scales2"), &o);
    struct model *m2 = cpu_test_load_model(sub("scales2"));
    assert_memory_not_equal(m->embed.data, m2->embed.data, 64);
    assert_memory_not_equal(m->layers[0].wq.data, m2->layers[0].wq.data, 64);
    model_free(m);
    model_free(m2);
}

/* ---- broken checkpoints: write a good one, then rewrite model.safetensors with one change ---- */

typedef void (*mutate_fn)(struct st_write *w, int *n, void *buf);

static void rewrite(const char *src, const char *dst, mutate_fn fn)
{
    sh("rm -rf '%s' && mkdir -p '%s' && cp '%s'/*.json '%s'/", dst, dst, src, dst);
    struct st_set *s = st_open_dir(src, err, sizeof err);
    assert_non_null(s);
    struct st_write *w = calloc((size_t)s->n_tensors + 1, sizeof *w);
    int n = 0;
    for (int f = 0; f < s->n_files; f++)
        for (int i = 0; i < s->files[f].n_tensors; i++) {
            const struct tensor_view *v = &s->files[f].tensors[i].view;
            w[n] = (struct st_write){v->name, v->dtype, v->ndim, {0}, v->data};
            memcpy(w[n].shape, v->shape, sizeof v->shape);
            n++;
        }
    static uint8_t buf[1 << 20];
    fn(w, &n, buf);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    assert_int_equal(st_write_file(p, w, n, err, sizeof err), 0);
    free(w);
    st_free(s);
}

static struct st_write *find_w(struct st_write *w, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(w[i].name, name))
            return &w[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static void drop(struct st_write *w, int *n, const char *name)
{
    struct st_write *t = find_w(w, *n, name);
    memmove(t, t + 1, (size_t)(w + *n - (t + 1)) * sizeof *t);
    (*n)--;
}

static void m_drop_up(struct st_write *w, int *n, void *buf)
{
    drop(w, n, "model.layers.1.mlp.up_proj.weight");
}
static void m_transpose_k(struct st_write *w, int *n, void *buf)
{
    struct st_write *t = find_w(w, *n, "model.layers.0.self_attn.k_proj.weight");
    int64_t a = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = a;
}
static void m_norm_i32(struct st_write *w, int *n, void *buf)
{
    struct st_write *t = find_w(w, *n, "model.norm.weight");
    t->dtype = DT_I32;
    t->data = buf;
}
static void m_embed_f8(struct st_write *w, int *n, void *buf)
{
    struct st_write *t = find_w(w, *n, "model.embed_tokens.weight");
    t->dtype = DT_F8_E4M3;
    t->data = buf;
}
static void m_drop_scale(struct st_write *w, int *n, void *buf)
{
    drop(w, n, "model.layers.0.self_attn.q_proj.weight_scale_inv");
}
static void m_scale_shape(struct st_write *w, int *n, void *buf)
{
    struct st_write *t = find_w(w, *n, "model.layers.1.mlp.down_proj.weight_scale_inv");
    t->shape[0] = 2;
    t->data = buf;
}
static void m_drop_bias(struct st_write *w, int *n, void *buf)
{
    drop(w, n, "model.layers.0.self_attn.v_proj.bias");
}
static void m_drop_lm_head(struct st_write *w, int *n, void *buf)
{
    drop(w, n, "lm_head.weight");
}
static void m_lm_head_short(struct st_write *w, int *n, void *buf)
{
    struct st_write *t = find_w(w, *n, "lm_head.weight");
    t->shape[0] = 500;
}
static void m_drop_qnorm(struct st_write *w, int *n, void *buf)
{
    drop(w, n, "model.layers.1.self_attn.q_norm.weight");
}
static void m_none(struct st_write *w, int *n, void *buf) {}

static void test_broken_checkpoints(void **state)
{
    struct tiny_opts o = opts(ARCH_QWEN3, DT_BF16, false, 1);
    cpu_test_write_model(sub("good"), &o);
    rewrite(sub("good"), sub("bad"), m_none);
    model_free(cpu_test_load_model(sub("bad"))); /* the rewrite itself changes nothing */

    rewrite(sub("good"), sub("bad"), m_drop_up);
    cpu_test_expect_load_error(sub("bad"),
                               "model.layers.1.mlp.up_proj.weight: missing (not in model.safetensors)");
    rewrite(sub("good"), sub("bad"), m_transpose_k);
    cpu_test_expect_load_error(
        sub("bad"),
        "model.layers.0.self_attn.k_proj.weight in model.safetensors: shape [64, 32], expected [32, 64]");
    rewrite(sub("good"), sub("bad"), m_norm_i32);
    cpu_test_expect_load_error(sub("bad"),
                               "model.norm.weight in model.safetensors: dtype I32, expected F32|F16|BF16");
    rewrite(sub("good"), sub("bad"), m_embed_f8);
    cpu_test_expect_load_error(
        sub("bad"), "model.embed_tokens.weight in model.safetensors: dtype F8_E4M3, expected F32|F16|BF16");
    rewrite(sub("good"), sub("bad"), m_drop_qnorm);
    cpu_test_expect_load_error(sub("bad"),
                               "model.layers.1.self_attn.q_norm.weight: missing (not in model.safetensors)");
    rewrite(sub("good"), sub("bad"), m_drop_lm_head);
    cpu_test_expect_load_error(sub("bad"), "lm_head.weight: missing (not in model.safetensors)");
    rewrite(sub("good"), sub("bad"), m_lm_head_short);
    cpu_test_expect_load_error(sub("bad"),
                               "lm_head.weight in model.safetensors: shape [500, 64], expected [512, 64]");

    /* tied: a present lm_head.weight is used (and checked); without it lm_head is the embedding */
    o.tie = true;
    cpu_test_write_model(sub("tied"), &o);
    struct model *m = cpu_test_load_model(sub("tied"));
    assert_ptr_equal(m->lm_head.data, m->embed.data);
    model_free(m);
    o.tie = false;
    cpu_test_write_model(sub("untied"), &o);
    sh("cp '%s'/config.json '%s'/config.json", sub("tied"), sub("untied"));
    m = cpu_test_load_model(sub("untied"));
    assert_true(m->cfg.tie_embeddings);
    assert_string_equal(m->lm_head.name, "lm_head.weight");
    assert_ptr_not_equal(m->lm_head.data, m->embed.data);
    model_free(m);
    rewrite(sub("untied"), sub("bad"), m_lm_head_short);
    cpu_test_expect_load_error(sub("bad"),
                               "lm_head.weight in model.safetensors: shape [500, 64], expected [512, 64]");

    /* a truncated file */
    sh("cp -r '%s' '%s'/cut && truncate -s -100 '%s'/cut/model.safetensors", sub("good"), tmpdir, tmpdir);
    cpu_test_expect_load_error(sub("cut"), "lm_head.weight in model.safetensors: data_offsets");
    cpu_test_expect_load_error(sub("cut"), "beyond the data section");

    /* qwen2 biases */
    o = opts(ARCH_QWEN2, DT_BF16, true, 1);
    cpu_test_write_model(sub("q2"), &o);
    rewrite(sub("q2"), sub("bad"), m_drop_bias);
    cpu_test_expect_load_error(sub("bad"),
                               "model.layers.0.self_attn.v_proj.bias: missing (not in model.safetensors)");

    /* fp8 block scales */
    o = opts(ARCH_QWEN3, DT_F8_E4M3, true, 1);
    cpu_test_write_model(sub("fp8"), &o);
    rewrite(sub("fp8"), sub("bad"), m_drop_scale);
    cpu_test_expect_load_error(sub("bad"),
                               "model.layers.0.self_attn.q_proj.weight in model.safetensors: F8_E4M3 weight "
                               "without its block scales model.layers.0.self_attn.q_proj.weight_scale_inv");
    rewrite(sub("fp8"), sub("bad"), m_scale_shape);
    cpu_test_expect_load_error(
        sub("bad"), "model.layers.1.mlp.down_proj.weight_scale_inv in model.safetensors: shape [2, 1], "
                    "expected [1, 1]");

    /* shards: a missing one, and one cut short */
    o = opts(ARCH_LLAMA, DT_BF16, false, 3);
    cpu_test_write_model(sub("sharded"), &o);
    sh("rm '%s'/model-00002-of-00003.safetensors", sub("sharded"));
    cpu_test_expect_load_error(
        sub("sharded"), "model-00002-of-00003.safetensors: No such file or directory (a shard listed in "
                        "model.safetensors.index.json)");
    cpu_test_write_model(sub("sharded"), &o);
    sh("truncate -s 20 '%s'/model-00003-of-00003.safetensors", sub("sharded"));
    cpu_test_expect_load_error(sub("sharded"), "model-00003-of-00003.safetensors: header length");
    /* no weights at all */
    sh("rm '%s'/model-0000* '%s'/model.safetensors.index.json", sub("sharded"), sub("sharded"));
    cpu_test_expect_load_error(sub("sharded"), "no model.safetensors or model.safetensors.index.json");
    /* rewriting a folder with one file removes the old shards and index */
    o.shards = 1;
    cpu_test_write_model(sub("sharded"), &o);
    sh("test ! -e '%s'/model.safetensors.index.json", sub("sharded"));
    model_free(cpu_test_load_model(sub("sharded")));
    model_free(NULL);
}

/* ---- configs ---- */

static json_t *base_config(void)
{
    json_error_t je;
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", sub("good"));
    json_t *j = json_load_file(p, 0, &je);
    assert_non_null(j);
    return j;
}

/* Writes cfg (stolen) as cdir/config.json and gen (NULL: none) as its generation_config.json. */
static const char *write_cfg(json_t *cfg, const char *gen)
{
    const char *d = sub("cfg");
    sh("rm -rf '%s' && mkdir -p '%s'", d, d);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", d);
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
    if (gen) {
        snprintf(p, sizeof p, "%s/generation_config.json", d);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs(gen, f);
        fclose(f);
    }
    return d;
}

static json_t *with(json_t *j, const char *key, json_t *v)
{
    if (v)
        json_object_set_new(j, key, v);
    else
        json_object_del(j, key);
    return j;
}

static void expect_cfg_error(json_t *cfg, const char *gen, const char *want)
{
    struct model_config c;
    const char *d = write_cfg(cfg, gen);
    if (model_config_load(d, &c, err, sizeof err) == 0)
        fail_msg("config accepted, want \"%s\"", want);
    if (!strstr(err, want))
        fail_msg("error \"%s\" does not contain \"%s\"", err, want);
}

static struct model_config cfg_ok(json_t *cfg, const char *gen)
{
    struct model_config c;
    const char *d = write_cfg(cfg, gen);
    if (model_config_load(d, &c, err, sizeof err) != 0)
        fail_msg("config rejected: %s", err);
    return c;
}

static json_t *parse(const char *s)
{
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j)
        fail_msg("bad test JSON %s: %s", s, je.text);
    return j;
}

/* A path that is not a model folder: said once, without jansson's "(line -1)". */
static void test_not_a_model_folder(void **state)
{
    assert_string_equal(cpu_test_expect_load_error(sub("nowhere"), "not a model folder (it does not exist)"),
                        "not a model folder (it does not exist)");
    sh("mkdir -p '%s'", sub("empty"));
    assert_string_equal(cpu_test_expect_load_error(sub("empty"), "not a model folder (no config.json)"),
                        "not a model folder (no config.json)");
    sh("echo x > '%s'", sub("plainfile"));
    cpu_test_expect_load_error(sub("plainfile"), "not a model folder (a file)");
}

static void test_config_errors(void **state)
{
    struct tiny_opts o = opts(ARCH_QWEN3, DT_BF16, false, 1);
    cpu_test_write_model(sub("good"), &o);
    expect_cfg_error(with(base_config(), "architectures", json_pack("[s]", "GPT2LMHeadModel")), NULL,
                     "config.json: architecture 'GPT2LMHeadModel' is not supported");
    expect_cfg_error(with(base_config(), "architectures", NULL), NULL,
                     "config.json: missing key \"architectures\"");
    expect_cfg_error(with(base_config(), "architectures", json_string("Qwen3ForCausalLM")), NULL,
                     "config.json: \"architectures\" must be a list of strings, got a string");
    expect_cfg_error(with(base_config(), "hidden_size", NULL), NULL,
                     "config.json: missing key \"hidden_size\"");
    expect_cfg_error(with(base_config(), "hidden_size", json_null()), NULL,
                     "config.json: missing key \"hidden_size\"");
    expect_cfg_error(with(base_config(), "hidden_size", json_string("64")), NULL,
                     "config.json: \"hidden_size\" must be an integer, got a string");
    expect_cfg_error(with(base_config(), "num_hidden_layers", json_real(2.5)), NULL,
                     "config.json: \"num_hidden_layers\" must be an integer, got a real number");
    expect_cfg_error(with(base_config(), "vocab_size", json_integer(0)), NULL,
                     "config.json: \"vocab_size\" is 0, must be at least 1");
    expect_cfg_error(with(base_config(), "num_key_value_heads", json_integer(3)), NULL,
                     "num_attention_heads (4) is not a multiple of num_key_value_heads (3)");
    expect_cfg_error(with(with(base_config(), "head_dim", NULL), "hidden_size", json_integer(66)), NULL,
                     "no head_dim, and hidden_size (66) is not a multiple of num_attention_heads (4)");
    expect_cfg_error(with(base_config(), "tie_word_embeddings", json_string("yes")), NULL,
                     "\"tie_word_embeddings\" must be a boolean, got a string");
    expect_cfg_error(with(base_config(), "rms_norm_eps", json_string("1e-6")), NULL,
                     "\"rms_norm_eps\" must be a number, got a string");
    expect_cfg_error(with(base_config(), "rope_theta", json_integer(-1)), NULL,
                     "\"rope_theta\" is -1, must be positive");
    expect_cfg_error(with(base_config(), "attention_bias", json_true()), NULL,
                     "attention_bias true (biases on q/k/v/o) is not supported for Qwen3ForCausalLM");
    expect_cfg_error(with(base_config(), "hidden_act", json_string("gelu")), NULL,
                     "hidden_act 'gelu' is not supported");
    expect_cfg_error(with(base_config(), "use_sliding_window", json_true()), NULL, "use_sliding_window true");
    expect_cfg_error(with(base_config(), "torch_dtype", json_string("int8")), NULL,
                     "\"torch_dtype\" 'int8' is not supported");
    expect_cfg_error(with(base_config(), "rope_scaling", parse("{\"rope_type\":\"linear\",\"factor\":2.0}")),
                     NULL, "rope scaling type 'linear' is not supported");
    expect_cfg_error(with(base_config(), "rope_scaling", parse("{\"factor\":2.0}")), NULL,
                     "missing key \"rope_scaling.rope_type\"");
    expect_cfg_error(with(base_config(), "rope_scaling", parse("{\"type\":\"yarn\"}")), NULL,
                     "config.json: missing key \"rope_scaling.factor\"");
    expect_cfg_error(with(base_config(), "rope_scaling",
                          parse("{\"rope_type\":\"llama3\",\"factor\":8.0,\"high_freq_factor\":4.0,"
                                "\"original_max_position_embeddings\":8192}")),
                     NULL, "config.json: missing key \"rope_scaling.low_freq_factor\"");
    expect_cfg_error(with(base_config(), "rope_scaling", json_integer(1)), NULL,
                     "\"rope_scaling\" must be an object, got an integer");
    expect_cfg_error(
        with(base_config(), "quantization_config", parse("{\"quant_method\":\"gptq\",\"bits\":4}")), NULL,
        "quantization method 'gptq' is not supported");
    expect_cfg_error(with(base_config(), "quantization_config", parse("{\"quant_method\":\"fp8\"}")), NULL,
                     "no weight_block_size");
    expect_cfg_error(
        with(base_config(), "quantization_config",
             parse("{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}")),
        NULL, "fp8 format 'e5m2' is not supported");
    expect_cfg_error(with(base_config(), "quantization_config",
                          parse("{\"quant_method\":\"fp8\",\"weight_block_size\":[128]}")),
                     NULL, "weight_block_size\" must be [rows, cols]");
    expect_cfg_error(with(base_config(), "eos_token_id", json_integer(600)), NULL,
                     "config.json: \"eos_token_id\" is 600, beyond the vocabulary (512)");
    /* generation_config.json */
    expect_cfg_error(
        base_config(), "{\"eos_token_id\": \"x\"}",
        "generation_config.json: \"eos_token_id\" must be an integer or a list of integers, got a string");
    expect_cfg_error(base_config(), "{\"eos_token_id\": [1, -2]}",
                     "generation_config.json: \"eos_token_id\"[1] must be a token id below 512");
    expect_cfg_error(base_config(), "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", "lists 9 ids, at most 8");
    expect_cfg_error(base_config(), "{\"temperature\": \"hot\"}",
                     "generation_config.json: \"temperature\" must be a number, got a string");
    expect_cfg_error(base_config(), "{\"top_p\": 1.5}", "top_p and min_p must be at most 1");
    expect_cfg_error(base_config(), "{\"eos_token_id\": 3,", "cfg/generation_config.json: ");
    expect_cfg_error(base_config(), "[1]", "cfg/generation_config.json: not a JSON object");
}

static void test_config_values(void **state)
{
    struct tiny_opts o = opts(ARCH_QWEN3, DT_BF16, false, 1);
    cpu_test_write_model(sub("good"), &o);
    /* the files themselves */
    struct model_config c;
    assert_int_equal(model_config_load(sub("nowhere"), &c, err, sizeof err), -1);
    assert_string_equal(err, "not a model folder (it does not exist)"); /* the callers name the folder */
    const char *d = write_cfg(base_config(), NULL);
    sh("echo '{\"hidden_size\": ' > '%s'/config.json", d);
    assert_int_equal(model_config_load(d, &c, err, sizeof err), -1);
    if (!strstr(err, "cfg/config.json: "))
        fail_msg("%s", err);

    /* defaults */
    c = cfg_ok(with(with(with(with(base_config(), "head_dim", NULL), "tie_word_embeddings", NULL),
                         "rms_norm_eps", NULL),
                    "num_key_value_heads", NULL),
               NULL);
    assert_int_equal(c.head_dim, 16);
    assert_false(c.tie_embeddings);
    assert_true(c.rms_eps == 1e-6f);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.n_eos, 1); /* config.json's eos_token_id, without a generation config */
    assert_int_equal(c.eos_ids[0], 274);
    assert_int_equal(c.bos_id, 272);
    assert_int_equal(c.pad_id, -1);
    assert_false(c.has_sampling_defaults);
    assert_true(c.gen_temperature == 1 && c.gen_top_p == 1 && c.gen_top_k == 0 && c.gen_min_p == 0 &&
                c.gen_repetition_penalty == 1);
    assert_int_equal(c.torch_dtype, DT_BF16);
    json_t *j = with(with(base_config(), "architectures", json_pack("[s]", "LlamaForCausalLM")),
                     "max_position_embeddings", NULL);
    c = cfg_ok(with(with(j, "torch_dtype", NULL), "dtype", json_string("float16")), NULL);
    assert_int_equal(c.arch, ARCH_LLAMA);
    assert_false(c.qk_norm || c.qkv_bias);
    assert_int_equal(c.max_position, 2048);
    assert_int_equal(c.torch_dtype, DT_F16);
    assert_string_equal(c.arch_name, "LlamaForCausalLM");
    c = cfg_ok(with(base_config(), "architectures", json_pack("[s]", "Qwen2ForCausalLM")), NULL);
    assert_true(c.qkv_bias && !c.qk_norm && c.arch == ARCH_QWEN2);
    c = cfg_ok(with(with(base_config(), "head_dim", json_integer(32)), "rms_norm_eps", json_real(1e-5)),
               NULL);
    assert_int_equal(c.head_dim, 32); /* heads x head_dim may differ from hidden */
    assert_true(c.rms_eps == 1e-5f);

    /* rope scaling */
    c = cfg_ok(with(base_config(), "rope_scaling",
                    parse("{\"type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}")),
               NULL);
    assert_int_equal(c.rope_scaling.type, ROPE_YARN);
    assert_true(c.rope_scaling.factor == 4.0 && c.rope_scaling.original_max == 32768);
    assert_true(c.rope_scaling.beta_fast == 32 && c.rope_scaling.beta_slow == 1);
    assert_true(fabs(c.rope_scaling.attn_factor - (0.1 * log(4.0) + 1)) < 1e-12);
    c = cfg_ok(with(base_config(), "rope_scaling",
                    parse("{\"rope_type\":\"yarn\",\"factor\":2,\"beta_fast\":16,\"attention_factor\":1.5}")),
               NULL);
    assert_true(c.rope_scaling.attn_factor == 1.5 && c.rope_scaling.beta_fast == 16);
    assert_int_equal(c.rope_scaling.original_max, 4096); /* max_position_embeddings */
    c = cfg_ok(
        with(
            base_config(), "rope_scaling",
            parse("{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                  "\"original_max_position_embeddings\":8192}")),
        NULL);
    assert_int_equal(c.rope_scaling.type, ROPE_LLAMA3);
    assert_true(c.rope_scaling.factor == 8 && c.rope_scaling.low_freq_factor == 1 &&
                c.rope_scaling.high_freq_factor == 4 && c.rope_scaling.original_max == 8192);
    c = cfg_ok(with(base_config(), "rope_scaling", parse("{\"rope_type\":\"default\"}")), NULL);
    assert_int_equal(c.rope_scaling.type, ROPE_DEFAULT);
    c = cfg_ok(with(with(base_config(), "rope_theta", NULL), "rope_parameters",
                    parse("{\"rope_type\":\"default\",\"rope_theta\":500000.0}")),
               NULL);
    assert_true(c.rope_theta == 500000.0);
    c = cfg_ok(with(base_config(), "rope_theta", NULL), NULL);
    assert_true(c.rope_theta == 10000.0);

    /* fp8 */
    c = cfg_ok(with(base_config(), "quantization_config",
                    parse("{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
                          "\"weight_block_size\":[64,128]}")),
               NULL);
    assert_true(c.fp8_blocks && c.fp8_block[0] == 64 && c.fp8_block[1] == 128);

    /* generation_config.json: eos list, bos/pad, sampling defaults */
    c = cfg_ok(base_config(), "{\"bos_token_id\": 5, \"pad_token_id\": 6, \"eos_token_id\": [7, 8, 9],"
                              "\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}");
    assert_int_equal(c.n_eos, 3);
    assert_true(c.eos_ids[0] == 7 && c.eos_ids[1] == 8 && c.eos_ids[2] == 9);
    assert_true(c.bos_id == 5 && c.pad_id == 6);
    assert_true(c.has_sampling_defaults);
    assert_true(c.gen_temperature == 0.6f && c.gen_top_k == 20 && c.gen_top_p == 0.95f && c.gen_min_p == 0 &&
                c.gen_repetition_penalty == 1);
    c = cfg_ok(base_config(), "{\"eos_token_id\": 11, \"min_p\": 0.1, \"repetition_penalty\": 1.1}");
    assert_true(c.n_eos == 1 && c.eos_ids[0] == 11);
    assert_true(c.has_sampling_defaults && c.gen_min_p == 0.1f && c.gen_repetition_penalty == 1.1f);
    c = cfg_ok(base_config(), "{\"max_new_tokens\": 100}"); /* eos falls back to config.json */
    assert_true(c.n_eos == 1 && c.eos_ids[0] == 274 && !c.has_sampling_defaults);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variants_load),      cmocka_unit_test(test_dtypes_agree),
        cmocka_unit_test(test_weight_scales),      cmocka_unit_test(test_broken_checkpoints),
        cmocka_unit_test(test_config_errors),      cmocka_unit_test(test_config_values),
        cmocka_unit_test(test_not_a_model_folder),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
