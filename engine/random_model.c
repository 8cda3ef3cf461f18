/* Models with real shapes and no files (see random_model.h). */
#include "engine/random_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dtype.h"
#include "engine/util/hash.h"

#define NAME_LEN 80 /* room for "model.layers.NNN.post_attention_layernorm.weight" */

struct rmodel {
    struct model m; /* first: a struct model * is a struct rmodel * */
    uint16_t *data; /* materialized bf16 values of every tensor, or NULL */
    char *names;    /* [n_tensors][NAME_LEN] */
    int n_names, cap_names;
};

static const struct {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim;
    bool tie;
} SHAPES[] = {
    {"qwen3-14b", 5120, 17408, 40, 40, 8, 128, false},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, false},
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, true},
};

/* Qwen3-MoE: every layer a mixture of experts with normalized top-k, untied; intermediate is config.json's
 * intermediate_size (unused: no dense layer). */
static const struct {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, experts, experts_active, moe_intermediate;
} MOE_SHAPES[] = {
    {"qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 128, 8, 768},
};

/* The fields of a Qwen3 shape and the constants every shape shares. */
static void qwen3_config(struct model_config *cfg, const char *arch_name, int hidden, int intermediate,
                         int layers, int heads, int kv_heads, int head_dim, bool tie)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = ARCH_QWEN3;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", arch_name);
    cfg->hidden = hidden;
    cfg->intermediate = intermediate;
    cfg->n_layers = layers;
    cfg->n_heads = heads;
    cfg->n_kv_heads = kv_heads;
    cfg->head_dim = head_dim;
    cfg->vocab = 151936;
    cfg->max_position = 131072;
    cfg->rms_eps = 1e-6f;
    cfg->rope_theta = 1e6;
    cfg->tie_embeddings = tie;
    cfg->qk_norm = true;
    cfg->qkv_bias = false;
    cfg->rope_scaling.type = ROPE_DEFAULT;
    cfg->torch_dtype = DT_BF16;
    cfg->eos_ids[0] = 151645; /* <|im_end|> */
    cfg->eos_ids[1] = 151643; /* <|endoftext|> */
    cfg->n_eos = 2;
    cfg->bos_id = -1;
    cfg->pad_id = 151643;
}

int random_model_config(const char *name, struct model_config *cfg, char *err, size_t errlen)
{
    for (size_t i = 0; name && i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (!strcmp(name, SHAPES[i].name)) {
            qwen3_config(cfg, "Qwen3ForCausalLM", SHAPES[i].hidden, SHAPES[i].intermediate, SHAPES[i].layers,
                         SHAPES[i].heads, SHAPES[i].kv_heads, SHAPES[i].head_dim, SHAPES[i].tie);
            return 0;
        }
    for (size_t i = 0; name && i < sizeof MOE_SHAPES / sizeof MOE_SHAPES[0]; i++)
        if (!strcmp(name, MOE_SHAPES[i].name)) {
            qwen3_config(cfg, "Qwen3MoeForCausalLM", MOE_SHAPES[i].hidden, MOE_SHAPES[i].intermediate,
                         MOE_SHAPES[i].layers, MOE_SHAPES[i].heads, MOE_SHAPES[i].kv_heads,
                         MOE_SHAPES[i].head_dim, false);
            cfg->arch = ARCH_QWEN3_MOE;
            cfg->n_experts = MOE_SHAPES[i].experts;
            cfg->n_experts_active = MOE_SHAPES[i].experts_active;
            cfg->moe_intermediate = MOE_SHAPES[i].moe_intermediate;
            cfg->norm_topk_prob = true;
            cfg->decoder_sparse_step = 1;
            return 0;
        }
    snprintf(err, errlen,
             "unknown model shape '%s' (expected qwen3-14b, qwen3-8b, qwen3-0.6b or qwen3-30b-a3b)",
             name ? name : "");
    return -1;
}

int64_t random_model_params(const struct model_config *c)
{
    int64_t C = c->hidden, F = c->intermediate, D = c->head_dim, V = c->vocab;
    int64_t HD = (int64_t)c->n_heads * D, KVD = (int64_t)c->n_kv_heads * D, QKV = HD + 2 * KVD;
    int64_t layer = 2 * C + QKV * C + (c->qkv_bias ? QKV : 0) + (c->qk_norm ? 2 * D : 0) + C * HD;
    int64_t n_moe = model_moe_layers(c),
            moe = (int64_t)c->n_experts * (C + 3 * (int64_t)c->moe_intermediate * C);
    return V * C * (c->tie_embeddings ? 1 : 2) + C + layer * c->n_layers + 3 * F * C * (c->n_layers - n_moe) +
           moe * n_moe;
}

/* ---- the rule */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t random_model_seed(const char *name)
{
    return splitmix64(fnv1a_str(FNV1A_INIT, name));
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

struct random_fill random_model_fill(const char *name)
{
    struct random_fill r = {random_model_seed(name), 0.0f, 0.0f};
    if (ends_with(name, "norm.weight"))
        r.base = 1.0f;
    else if (!ends_with(name, ".bias"))
        r.amp = (float)(RANDOM_MODEL_STD * sqrt(3.0));
    return r;
}

float random_model_value(const struct random_fill *r, uint64_t i)
{
    uint64_t h = splitmix64(r->seed + i);
    float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* exact: 24 bits */
    float x = 2.0f * u - 1.0f;                         /* exact */
    float v = r->amp * x;                              /* one rounding */
    return bf16_to_f32(f32_to_bf16(r->base + v));      /* base or v is 0: exact */
}

/* ---- the model */

static const char *add_name(struct rmodel *r, const char *fmt, int layer)
{
    if (r->n_names == r->cap_names)
        return NULL;
    char *p = r->names + (size_t)r->n_names++ * NAME_LEN;
    snprintf(p, NAME_LEN, fmt, layer);
    return p;
}

static void view(struct rmodel *r, struct tensor_view *t, const char *fmt, int layer, int64_t d0, int64_t d1)
{
    memset(t, 0, sizeof *t);
    t->name = add_name(r, fmt, layer);
    t->dtype = DT_BF16;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

/* The router and experts of MoE layer l, the k-th MoE layer. */
static void experts_views(struct rmodel *r, struct model *m, int l, int k)
{
    const struct model_config *c = &m->cfg;
    const int64_t C = c->hidden, FE = c->moe_intermediate;
    struct layer_weights *w = &m->layers[l];
    char fmt[NAME_LEN];
    view(r, &w->router, "model.layers.%d.mlp.gate.weight", l, c->n_experts, C);
    w->experts = m->experts + (size_t)k * (size_t)c->n_experts;
    for (int e = 0; e < c->n_experts; e++) {
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%d.gate_proj.weight", e);
        view(r, &w->experts[e].w_gate, fmt, l, FE, C);
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%d.up_proj.weight", e);
        view(r, &w->experts[e].w_up, fmt, l, FE, C);
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%d.down_proj.weight", e);
        view(r, &w->experts[e].w_down, fmt, l, C, FE);
    }
}

/* Calls fn on every tensor view of m. */
static void each_view(struct model *m, void (*fn)(struct tensor_view *, void *), void *ctx)
{
    fn(&m->embed, ctx);
    if (!m->cfg.tie_embeddings)
        fn(&m->lm_head, ctx);
    fn(&m->final_norm, ctx);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        struct tensor_view *all[] = {&w->attn_norm, &w->wq,     &w->wk,     &w->wv,     &w->bq,
                                     &w->bk,        &w->bv,     &w->q_norm, &w->k_norm, &w->wo,
                                     &w->mlp_norm,  &w->w_gate, &w->w_up,   &w->w_down, &w->router};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]->name)
                fn(all[i], ctx);
        for (int e = 0; w->experts && e < m->cfg.n_experts; e++) {
            fn(&w->experts[e].w_gate, ctx);
            fn(&w->experts[e].w_up, ctx);
            fn(&w->experts[e].w_down, ctx);
        }
    }
}

struct fill_ctx {
    uint16_t *p;
};

static void materialize_one(struct tensor_view *t, void *ctx)
{
    struct fill_ctx *f = ctx;
    struct random_fill r = random_model_fill(t->name);
    int64_t n = tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        f->p[i] = f32_to_bf16(random_model_value(&r, (uint64_t)i));
    t->data = f->p;
    f->p += n;
}

struct model *random_model_create(const struct model_config *cfg, bool materialize, char *err, size_t errlen)
{
    const struct model_config *c = cfg;
    if (c->hidden <= 0 || c->intermediate <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->head_dim % 2 || c->vocab <= 0 || c->n_heads % c->n_kv_heads) {
        snprintf(err, errlen,
                 "random model: unsupported shape: hidden %d, intermediate %d, layers %d, heads %d, kv heads "
                 "%d, head_dim %d, vocab %d",
                 c->hidden, c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab);
        return NULL;
    }
    struct rmodel *r = calloc(1, sizeof *r);
    if (!r)
        goto oom;
    struct model *m = &r->m;
    m->cfg = *c;
    snprintf(m->dir, sizeof m->dir, "(random weights)");
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    const int n_moe = model_moe_layers(c);
    r->cap_names = 3 + 15 * c->n_layers + 3 * c->n_experts * n_moe;
    r->names = calloc((size_t)r->cap_names, NAME_LEN);
    if (n_moe && !(m->experts = calloc((size_t)n_moe * (size_t)c->n_experts, sizeof *m->experts)))
        goto oom;
    if (!m->layers || !r->names)
        goto oom;

    const int64_t C = c->hidden, F = c->intermediate, D = c->head_dim, V = c->vocab;
    const int64_t HD = (int64_t)c->n_heads * D, KVD = (int64_t)c->n_kv_heads * D;
    view(r, &m->embed, "model.embed_tokens.weight", 0, V, C);
    if (c->tie_embeddings)
        m->lm_head = m->embed;
    else
        view(r, &m->lm_head, "lm_head.weight", 0, V, C);
    view(r, &m->final_norm, "model.norm.weight", 0, C, 0);
    for (int l = 0, k_moe = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        view(r, &w->attn_norm, "model.layers.%d.input_layernorm.weight", l, C, 0);
        view(r, &w->wq, "model.layers.%d.self_attn.q_proj.weight", l, HD, C);
        view(r, &w->wk, "model.layers.%d.self_attn.k_proj.weight", l, KVD, C);
        view(r, &w->wv, "model.layers.%d.self_attn.v_proj.weight", l, KVD, C);
        if (c->qkv_bias) {
            view(r, &w->bq, "model.layers.%d.self_attn.q_proj.bias", l, HD, 0);
            view(r, &w->bk, "model.layers.%d.self_attn.k_proj.bias", l, KVD, 0);
            view(r, &w->bv, "model.layers.%d.self_attn.v_proj.bias", l, KVD, 0);
        }
        if (c->qk_norm) {
            view(r, &w->q_norm, "model.layers.%d.self_attn.q_norm.weight", l, D, 0);
            view(r, &w->k_norm, "model.layers.%d.self_attn.k_norm.weight", l, D, 0);
        }
        view(r, &w->wo, "model.layers.%d.self_attn.o_proj.weight", l, C, HD);
        view(r, &w->mlp_norm, "model.layers.%d.post_attention_layernorm.weight", l, C, 0);
        if (model_layer_moe(c, l)) {
            experts_views(r, m, l, k_moe++);
            continue;
        }
        view(r, &w->w_gate, "model.layers.%d.mlp.gate_proj.weight", l, F, C);
        view(r, &w->w_up, "model.layers.%d.mlp.up_proj.weight", l, F, C);
        view(r, &w->w_down, "model.layers.%d.mlp.down_proj.weight", l, C, F);
    }
    if (materialize) {
        int64_t n = random_model_params(c);
        r->data = malloc((size_t)n * sizeof *r->data);
        if (!r->data) {
            snprintf(err, errlen, "random model: out of memory for %.2f GB of bf16 weights",
                     (double)n * 2 / 1e9);
            random_model_free(m);
            return NULL;
        }
        struct fill_ctx f = {r->data};
        each_view(m, materialize_one, &f);
        if (c->tie_embeddings)
            m->lm_head = m->embed;
    }
    return m;
oom:
    snprintf(err, errlen, "random model: out of memory");
    if (r)
        random_model_free(&r->m);
    return NULL;
}

void random_model_free(struct model *m)
{
    if (!m)
        return;
    struct rmodel *r = (struct rmodel *)m;
    free(r->data);
    free(r->names);
    free(m->layers);
    free(m->experts);
    free(r);
}
