/* Qwen3-MoE checkpoints (engine/model.h) as `llmq make-tiny-model --experts` writes them, loaded and run
 * on the CPU backend, without transformers' goldens (test_hf_reference_moe.c has those):
 *   - Qwen3-30B-A3B's published config.json, and transformers' defaults for absent MoE keys;
 *   - the layout: which layers are MoE (decoder_sparse_step, mlp_only_layers), the router and expert
 *     views with their shapes and dtypes, bf16 and fp8 (block scales on the experts, a bf16 router);
 *   - errors that name the key or the tensor: config values out of range, a router or an expert missing
 *     or of the wrong shape;
 *   - a MoE model whose experts are all one MLP equals the dense Qwen3 with that MLP: bit for bit with
 *     one expert per token (its weight is exactly 1), in fp32 and under emulate_cuda (the expert's
 *     roundings are the dense MLP's); within 1e-5 with two renormalized (1e-2 emulated: the weighted sum
 *     is rounded to bf16 once more), and not with two unnormalized (the weights then sum to less than 1:
 *     the comparison can fail);
 *   - through the engine, prefix caching and batching do not change a MoE model's outputs;
 *   - random weights: the qwen3-30b-a3b preset's views, and a small random MoE run on the CPU. */
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
#include <sys/stat.h>

#include "engine/model.h"
#include "engine/random_model.h"
#include "engine/safetensors.h"
#include "engine/util/log.h"

#include "cpu_test.h"

static char tmpdir[256];
static char err[1024];

static const char *sub(const char *name)
{
    return cpu_test_path(tmpdir, name);
}

/* 4 layers, 4 experts of 32, 2 per token; MoE layers where (l + 1) % step == 0 and l is not in only. */
static struct tiny_opts moe_opts(int step, uint64_t only, enum dtype dt)
{
    struct tiny_opts o = tiny_opts_default();
    o.layers = 4;
    o.experts = 4;
    o.experts_per_token = 2;
    o.moe_intermediate = 32;
    o.decoder_sparse_step = step;
    o.mlp_only[0] = only;
    o.dtype = dt;
    o.seed = 5;
    return o;
}

static void test_layout(void **state)
{
    (void)state;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        struct tiny_opts o = moe_opts(2, 1u << 3, fp8 ? DT_F8_E4M3 : DT_BF16); /* MoE: layer 1 only */
        if (fp8) /* fp8 block scales of 128 x 128: sizes that fill blocks */
            o.hidden = 128, o.moe_intermediate = 128, o.intermediate = 256, o.heads = 4, o.head_dim = 32;
        cpu_test_write_model(sub("layout"), &o);
        struct model *m = cpu_test_load_model(sub("layout"));
        const struct model_config *c = &m->cfg;
        assert_int_equal(c->arch, ARCH_QWEN3_MOE);
        assert_string_equal(c->arch_name, "Qwen3MoeForCausalLM");
        assert_true(c->qk_norm);
        assert_int_equal(c->n_experts, 4);
        assert_int_equal(c->n_experts_active, 2);
        assert_int_equal(c->moe_intermediate, o.moe_intermediate);
        assert_true(c->norm_topk_prob);
        assert_int_equal(model_moe_layers(c), 1);
        const enum dtype wt = fp8 ? DT_F8_E4M3 : DT_BF16;
        const int64_t C = o.hidden, FE = o.moe_intermediate, F = o.intermediate;
        for (int l = 0; l < 4; l++) {
            const struct layer_weights *w = &m->layers[l];
            char name[128];
            assert_int_equal(model_layer_moe(c, l), l == 1);
            if (l != 1) {
                assert_null(w->experts);
                assert_null(w->router.data);
                snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
                cpu_test_check_view(&w->w_gate, name, wt, F, C);
                continue;
            }
            assert_null(w->w_gate.data);
            cpu_test_check_view(&w->router, "model.layers.1.mlp.gate.weight", DT_BF16, 4, C);
            for (int e = 0; e < 4; e++) {
                snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.up_proj.weight", e);
                cpu_test_check_view(&w->experts[e].w_up, name, wt, FE, C);
                snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.down_proj.weight", e);
                cpu_test_check_view(&w->experts[e].w_down, name, wt, C, FE);
            }
        }
        model_free(m);
    }
}

/* Qwen3-30B-A3B's config.json as published (its keys and values): read as Qwen3-MoE, every layer MoE. */
static void test_published_config(void **state)
{
    (void)state;
    static const char CFG[] =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": "
        "0.0, "
        "\"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128, "
        "\"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, "
        "\"intermediate_size\": 6144, \"max_position_embeddings\": 40960, \"max_window_layers\": 48, "
        "\"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, "
        "\"norm_topk_prob\": true, \"num_attention_heads\": 32, \"num_experts\": 128, "
        "\"num_experts_per_tok\": 8, \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, "
        "\"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
        "\"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, \"sliding_window\": null, "
        "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"use_cache\": true, "
        "\"use_sliding_window\": false, \"vocab_size\": 151936}";
    const char *dir = sub("published");
    assert_int_equal(mkdir(dir, 0755), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(CFG, f);
    fclose(f);
    struct model_config c;
    if (model_config_load(dir, &c, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.arch, ARCH_QWEN3_MOE);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_active, 8);
    assert_int_equal(c.moe_intermediate, 768);
    assert_true(c.norm_topk_prob);
    assert_int_equal(model_moe_layers(&c), 48);
    /* transformers' defaults where keys are absent: 128 experts, top 8, 768, norm_topk_prob false */
    json_error_t je;
    json_t *j = json_loads(CFG, 0, &je);
    assert_non_null(j);
    json_object_del(j, "num_experts"), json_object_del(j, "num_experts_per_tok");
    json_object_del(j, "moe_intermediate_size"), json_object_del(j, "norm_topk_prob");
    json_object_del(j, "decoder_sparse_step"), json_object_del(j, "mlp_only_layers");
    assert_int_equal(json_dump_file(j, path, 0), 0);
    json_decref(j);
    if (model_config_load(dir, &c, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_active, 8);
    assert_int_equal(c.moe_intermediate, 768);
    assert_false(c.norm_topk_prob);
    assert_int_equal(model_moe_layers(&c), 48);
}

/* A fresh copy of the layout checkpoint (layer 1 MoE) with config keys replaced by `keys` (owned). */
static const char *with_config(json_t *keys)
{
    struct tiny_opts o = moe_opts(2, 1u << 3, DT_BF16);
    cpu_test_write_model(sub("bad"), &o);
    cpu_test_set_config(sub("bad"), keys);
    json_decref(keys);
    return sub("bad");
}

/* The layout checkpoint (layer 1 MoE; fp8 when dtype is "fp8") rewritten with tensor `name` dropped, or
 * with its two dimensions swapped. */
static const char *without(const char *dtype, const char *name, bool transpose)
{
    struct tiny_opts o = moe_opts(2, 1u << 3, dtype ? DT_F8_E4M3 : DT_BF16);
    cpu_test_write_model(sub("whole"), &o);
    struct st_set *s = st_open_dir(sub("whole"), err, sizeof err);
    assert_non_null(s);
    struct st_write *w = calloc((size_t)s->n_tensors, sizeof *w);
    assert_non_null(w);
    int n = 0, found = 0;
    for (int i = 0; i < s->files[0].n_tensors; i++) {
        const struct tensor_view *v = &s->files[0].tensors[i].view;
        const bool it = !strcmp(v->name, name);
        found += it;
        if (it && !transpose)
            continue;
        w[n] = (struct st_write){v->name, v->dtype, v->ndim, {v->shape[0], v->shape[1]}, v->data};
        if (it)
            w[n].shape[0] = v->shape[1], w[n].shape[1] = v->shape[0];
        n++;
    }
    assert_int_equal(found, 1);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", sub("cut"));
    cpu_test_write_model(sub("cut"), &o); /* its config files; the weights are replaced */
    assert_int_equal(st_write_file(path, w, n, err, sizeof err), 0);
    free(w);
    st_free(s);
    return sub("cut");
}

static void test_errors(void **state)
{
    (void)state;
    cpu_test_expect_load_error(with_config(json_pack("{s:i}", "num_experts_per_tok", 5)),
                               "config.json: num_experts_per_tok (5) is larger than num_experts (4)");
    cpu_test_expect_load_error(with_config(json_pack("{s:i}", "decoder_sparse_step", 0)),
                               "config.json: \"decoder_sparse_step\" is 0, must be at least 1");
    cpu_test_expect_load_error(with_config(json_pack("{s:[i]}", "mlp_only_layers", 4)),
                               "config.json: \"mlp_only_layers\"[0] must be a layer index below 4");
    cpu_test_expect_load_error(
        with_config(json_pack("{s:s}", "mlp_only_layers", "3")),
        "config.json: \"mlp_only_layers\" must be a list of layer indices, got a string");
    cpu_test_expect_load_error(with_config(json_pack("{s:s}", "norm_topk_prob", "yes")),
                               "config.json: \"norm_topk_prob\" must be a boolean, got a string");
    /* tensors: the checkpoint no longer fits the config */
    cpu_test_expect_load_error(
        with_config(json_pack("{s:i}", "moe_intermediate_size", 16)),
        "model.layers.1.mlp.experts.0.gate_proj.weight in model.safetensors: shape [32, 64], "
        "expected [16, 64]");
    cpu_test_expect_load_error(
        with_config(json_pack("{s:i}", "num_experts", 5)),
        "model.layers.1.mlp.gate.weight in model.safetensors: shape [4, 64], expected [5, 64]");
    cpu_test_expect_load_error(with_config(json_pack("{s:[]}", "mlp_only_layers")), /* layer 3 becomes MoE */
                               "model.layers.3.mlp.gate.weight: missing (not in model.safetensors)");
    cpu_test_expect_load_error(
        with_config(json_pack("{s:i}", "decoder_sparse_step", 1)), /* layers 0, 2 too */
        "model.layers.0.mlp.gate.weight: missing (not in model.safetensors)");
    /* a dense Qwen3 config over MoE tensors: the dense MLP is missing */
    cpu_test_expect_load_error(with_config(json_pack("{s:[s]}", "architectures", "Qwen3ForCausalLM")),
                               "model.layers.1.mlp.gate_proj.weight: missing (not in model.safetensors)");
    /* one expert's tensor dropped from the file, or transposed */
    cpu_test_expect_load_error(
        without(NULL, "model.layers.1.mlp.experts.2.down_proj.weight", false),
        "model.layers.1.mlp.experts.2.down_proj.weight: missing (not in model.safetensors)");
    cpu_test_expect_load_error(
        without(NULL, "model.layers.1.mlp.experts.3.up_proj.weight", true),
        "model.layers.1.mlp.experts.3.up_proj.weight in model.safetensors: shape [64, 32], "
        "expected [32, 64]");
    /* fp8: an expert without its block scales */
    cpu_test_expect_load_error(
        without("fp8", "model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv", false),
        "model.layers.1.mlp.experts.1.gate_proj.weight in model.safetensors: F8_E4M3 weight without "
        "its block scales model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv");
}

/* m with every expert of every MoE layer made expert 0 (in place), and a dense Qwen3 view of it whose
 * MoE layers' MLP is that expert (the caller frees the returned model's layers and the model). */
static struct model *dense_twin(struct model *m)
{
    struct model *d = malloc(sizeof *d);
    assert_non_null(d);
    *d = *m;
    d->cfg.arch = ARCH_QWEN3;
    d->cfg.n_experts = 0;
    d->experts = NULL;
    d->layers = calloc((size_t)m->cfg.n_layers, sizeof *d->layers);
    assert_non_null(d->layers);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        d->layers[l] = *w;
        if (!w->experts)
            continue;
        for (int e = 1; e < m->cfg.n_experts; e++)
            w->experts[e] = w->experts[0];
        d->layers[l].w_gate = w->experts[0].w_gate;
        d->layers[l].w_up = w->experts[0].w_up;
        d->layers[l].w_down = w->experts[0].w_down;
        d->layers[l].experts = NULL;
        memset(&d->layers[l].router, 0, sizeof d->layers[l].router);
    }
    return d;
}

/* Runs tok[0 .. n) through be in chunks of 5, out[p] the outputs at every chunk's last position. */
static void run(struct backend *be, const int32_t *tok, int n, struct be_out *out)
{
    struct sampling_params sp = cpu_test_greedy(SAMPLING_MAX_LOGPROBS);
    int32_t table[64];
    for (int i = 0; i < 64; i++)
        table[i] = i;
    for (int pos = 0; pos < n;) {
        const int k = n - pos < 5 ? n - pos : 5;
        struct be_seq s = cpu_test_seq(tok, pos, k, table, (n + 3) / 4, &sp);
        cpu_test_step(be, &s, 1, &out[pos + k - 1]);
        pos += k;
    }
}

/* The largest |dlogprob| between two runs over the chunks' last positions; -1 when a token differs. */
static double run_diff(const struct be_out *a, const struct be_out *b, int n)
{
    double worst = 0;
    for (int p = 0; p < n; p++) {
        if (p % 5 != 4 && p != n - 1) /* the chunks' last positions */
            continue;
        if (a[p].token != b[p].token)
            return -1;
        worst = fmax(worst, fabs(a[p].logprob - b[p].logprob));
        for (int j = 0; j < a[p].n_top; j++)
            worst = fmax(worst, a[p].top_ids[j] == b[p].top_ids[j]
                                    ? fabs(a[p].top_logprobs[j] - b[p].top_logprobs[j])
                                    : INFINITY);
    }
    return worst;
}

static void test_identical_experts_are_dense(void **state)
{
    (void)state;
    enum { N = 37 };
    int32_t tok[N];
    uint64_t seed = 77;
    cpu_test_random_tokens(&seed, tok, N, 512);
    const struct {
        int K;
        bool norm;
        double max_diff; /* 0: bit for bit; < 0: must differ by more than -max_diff */
    } cases[] = {{1, true, 0}, {2, true, 1e-5}, {2, false, -1e-3}, {1, false, -1e-3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tiny_opts o = moe_opts(1, 1u << 2, DT_BF16); /* layers 0, 1, 3 MoE, 2 dense */
        o.moe_intermediate = o.intermediate;                /* one MLP size, so a dense twin exists */
        o.experts_per_token = cases[i].K;
        o.norm_topk_prob = cases[i].norm;
        cpu_test_write_model(sub("same"), &o);
        struct model *m = cpu_test_load_model(sub("same"));
        struct model *d = dense_twin(m);
        for (int emu = 0; emu < 2; emu++) { /* fp32, and emulate_cuda's bf16 roundings */
            struct backend_opts bo = cpu_test_opts(4, 4, 64, 64);
            bo.emulate_cuda = emu;
            bo.kv_dtype = emu ? DT_BF16 : DT_F32;
            struct backend *bm = cpu_test_backend(m, &bo), *bd = cpu_test_backend(d, &bo);
            struct be_out om[N], od[N];
            run(bm, tok, N, om);
            run(bd, tok, N, od);
            const double diff = run_diff(om, od, N);
            printf("K %d norm %d emulate_cuda %d: max |dlogprob| %.3g\n", cases[i].K, cases[i].norm, emu,
                   diff);
            if (cases[i].max_diff == 0) {
                for (int p = 0; p < N; p++)
                    if (p % 5 == 4 || p == N - 1)
                        assert_true(cpu_test_same_out(&om[p], &od[p]));
            } else if (cases[i].max_diff > 0) {
                assert_true(diff >= 0 && diff <= (emu ? 1e-2 : cases[i].max_diff));
            } else {
                assert_true(diff < 0 || diff > -cases[i].max_diff);
            }
            backend_free(bm), backend_free(bd);
        }
        free(d->layers), free(d);
        model_free(m);
    }
}

/* Prompts sharing prefixes, run with prefix caching on and off and in one batch or one by one: the
 * same tokens and logprobs (the MoE MLP of a row does not depend on the other rows of its step). */
static void test_engine_invariance(void **state)
{
    (void)state;
    struct tiny_opts o = moe_opts(2, 0, DT_BF16); /* layers 1 and 3 MoE */
    o.norm_topk_prob = false;
    cpu_test_write_model(sub("engine"), &o);
    struct model *m;
    struct tok *tok;
    cpu_test_load_dir(sub("engine"), &m, &tok);
    enum { NP = 4, LEN = 40, GEN = 8 };
    int32_t prompts[NP][LEN];
    uint64_t seed = 9;
    cpu_test_random_tokens(&seed, prompts[0], LEN, 512);
    for (int i = 1; i < NP; i++) { /* each shares a prefix of 10 i tokens with the first */
        memcpy(prompts[i], prompts[0], sizeof prompts[0]);
        cpu_test_random_tokens(&seed, prompts[i] + 10 * i, LEN - 10 * i, 512);
    }
    int32_t ids[3][NP][GEN];
    float lps[3][NP][GEN];
    for (int run = 0; run < 3; run++) {
        struct engine_opts eo = engine_opts_default();
        eo.be = cpu_test_opts(4, 8, run == 2 ? 16 : 512, 128);
        eo.enable_prefix_caching = run != 0;
        struct engine *e = cpu_test_engine(m, tok, &eo);
        struct engine_seq *s[NP];
        for (int i = 0; i < NP; i++) {
            struct engine_request r = cpu_test_request(prompts[i], LEN, GEN, 2);
            s[i] = cpu_test_add(e, &r);
            if (run == 1) /* one at a time, so later prompts find the first one's blocks */
                cpu_test_run(e);
        }
        cpu_test_run(e);
        for (int i = 0; i < NP; i++) {
            assert_int_equal(s[i]->n_output, GEN);
            for (int t = 0; t < GEN; t++) {
                ids[run][i][t] = s[i]->tokens[LEN + t];
                lps[run][i][t] = s[i]->logprobs[t].logprob;
            }
            engine_release(e, s[i]);
        }
        engine_free(e);
    }
    for (int run = 1; run < 3; run++)
        for (int i = 0; i < NP; i++)
            for (int t = 0; t < GEN; t++) {
                assert_int_equal(ids[run][i][t], ids[0][i][t]);
                assert_true(lps[run][i][t] == lps[0][i][t]);
            }
    tok_free(tok);
    model_free(m);
}

/* Random weights (engine/random_model.h): qwen3-30b-a3b's lazy views have the checkpoint's names and shapes
 * and its 30.5 B parameters; a small MoE config materialized runs on the CPU backend (every router and
 * expert view got its values). */
static void test_random_weights(void **state)
{
    (void)state;
    struct model_config c;
    assert_int_equal(random_model_config("qwen3-30b-a3b", &c, err, sizeof err), 0);
    assert_int_equal(c.arch, ARCH_QWEN3_MOE);
    assert_true(fabs((double)random_model_params(&c) / 1e9 - 30.53) < 0.01);
    struct model *m = random_model_create(&c, false, err, sizeof err);
    assert_non_null(m);
    const struct layer_weights *w = &m->layers[47];
    assert_null(w->router.data);
    assert_string_equal(w->router.name, "model.layers.47.mlp.gate.weight");
    assert_string_equal(w->experts[127].w_down.name, "model.layers.47.mlp.experts.127.down_proj.weight");
    assert_int_equal(w->experts[127].w_down.shape[0], 2048);
    assert_int_equal(w->experts[127].w_down.shape[1], 768);
    assert_null(w->w_gate.name);
    random_model_free(m);

    c.hidden = 64, c.intermediate = 96, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    c.vocab = 300, c.n_experts = 4, c.n_experts_active = 2, c.moe_intermediate = 32;
    c.eos_ids[0] = c.eos_ids[1] = 0, c.pad_id = 0;
    c.mlp_only[0] = 1; /* layer 0 dense */
    m = random_model_create(&c, true, err, sizeof err);
    assert_non_null(m);
    assert_non_null(m->layers[1].experts[3].w_up.data);
    assert_non_null(m->layers[0].w_up.data);
    struct backend_opts bo = cpu_test_opts(4, 2, 64, 64);
    struct backend *be = cpu_test_backend(m, &bo);
    int32_t tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, table[4] = {0, 1, 2, 3};
    struct sampling_params sp = cpu_test_greedy(2);
    struct be_seq s = cpu_test_seq(tok, 0, 9, table, 3, &sp);
    struct be_out out;
    cpu_test_step(be, &s, 1, &out);
    assert_true(out.token >= 0 && out.token < 300 && isfinite(out.logprob));
    backend_free(be);
    random_model_free(m);
}

int main(void)
{
    log_set_level(LOG_WARN);
    if (scratch_dir_make(getenv("TMPDIR"), "moe", tmpdir, sizeof tmpdir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_published_config),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_identical_experts_are_dense),
        cmocka_unit_test(test_engine_invariance),
        cmocka_unit_test(test_random_weights),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_remove_tree(tmpdir);
    return rc;
}
