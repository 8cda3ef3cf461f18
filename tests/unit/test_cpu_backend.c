/* engine/cpu_backend: the paged fp32 forward against a naive reference written here (unpaged,
 * whole sequence at once, double precision, straightforward loops) on random in-memory models of
 * several shapes — Qwen3-MoE ones among them (router softmax, top-k, renormalized or not, dense and
 * MoE layers mixed) — and the paging invariants: chunking, block size, block order and batching must
 * not change a sequence's logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/fp8.h"
#include "engine/model.h"
#include "engine/util/log.h"

#include "cpu_test.h"
#include "worker/backends/backend_open.h"

/* ---- random in-memory models */

#define MAX_E 8 /* experts of the MoE shapes, at most */

struct shape {
    const char *name;
    enum model_arch arch;
    int C, F, L, H, KVH, D, V;
    bool tied, bf16;
    double theta;
    /* ARCH_QWEN3_MOE: E experts of FE, K per token; layers in mlp_only and those with (l + 1) % step
       != 0 stay dense */
    int E, K, FE, step;
    bool norm;
    uint64_t mlp_only;
};

/* Qwen3 tied with H*D != C and GQA 2; Qwen2 with biases, GQA 1, untied; Llama with GQA 4 and
 * theta 500000; a Qwen3 with bf16 weights (through tensor_to_f32) and GQA 4; Qwen3-MoE with 8 experts,
 * 2 per token renormalized, layer 1 dense (mlp_only_layers); Qwen3-MoE with bf16 weights, 6 experts, 3
 * per token not renormalized, every second layer MoE (decoder_sparse_step 2). */
static const struct shape SHAPES[] = {
    {"qwen3-tied", ARCH_QWEN3, 64, 96, 2, 4, 2, 32, 211, true, false, 1000000, 0, 0, 0, 0, false, 0},
    {"qwen2-bias", ARCH_QWEN2, 48, 80, 2, 6, 6, 8, 173, false, false, 10000, 0, 0, 0, 0, false, 0},
    {"llama-gqa4", ARCH_LLAMA, 64, 112, 3, 8, 2, 16, 157, false, false, 500000, 0, 0, 0, 0, false, 0},
    {"qwen3-bf16", ARCH_QWEN3, 40, 64, 2, 4, 1, 20, 101, false, true, 10000, 0, 0, 0, 0, false, 0},
    {"qwen3moe-norm", ARCH_QWEN3_MOE, 64, 96, 3, 4, 2, 16, 199, false, false, 10000, 8, 2, 40, 1, true, 0x2},
    {"qwen3moe-step2", ARCH_QWEN3_MOE, 48, 64, 2, 4, 2, 16, 151, true, true, 1000000, 6, 3, 24, 2, false, 0},
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

struct tmodel {
    struct model m;
    const struct shape *sh;
    void *allocs[512];
    int n_allocs;
    /* fp32 copies of what the views hold (bf16-rounded for bf16 models), for the reference */
    float *embed, *lm_head, *final_norm;
    struct {
        float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *mlp_norm, *w_gate, *w_up,
            *w_down;
        float *router, *e_gate[MAX_E], *e_up[MAX_E], *e_down[MAX_E]; /* MoE layers: router != NULL */
    } l[4];
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) /* [-1, 1) */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-52 - 1.0;
}

static void *tm_alloc(struct tmodel *t, size_t bytes)
{
    void *p = calloc(1, bytes);
    assert_non_null(p);
    assert_true(t->n_allocs < 512);
    t->allocs[t->n_allocs++] = p;
    return p;
}

/* A weight of n = d0 * d1 elements (d1 == 0: a vector) with values center + U(-1, 1) * scale;
 * returns the fp32 values and points the view at them (or at their bf16 rounding). */
static float *tm_weight(struct tmodel *t, struct tensor_view *v, int64_t d0, int64_t d1, double center,
                        double scale)
{
    int64_t n = d0 * (d1 ? d1 : 1);
    float *f = tm_alloc(t, (size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)(center + urand() * scale);
    v->ndim = d1 ? 2 : 1;
    v->shape[0] = d0;
    v->shape[1] = d1;
    if (t->sh->bf16) {
        uint16_t *h = tm_alloc(t, (size_t)n * sizeof *h);
        for (int64_t i = 0; i < n; i++) {
            h[i] = f32_to_bf16(f[i]);
            f[i] = bf16_to_f32(h[i]);
        }
        v->dtype = DT_BF16;
        v->data = h;
    } else {
        v->dtype = DT_F32;
        v->data = f;
    }
    return f;
}

static struct tmodel *make_model(const struct shape *sh)
{
    struct tmodel *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->sh = sh;
    struct model_config *c = &t->m.cfg;
    c->arch = sh->arch;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", sh->name);
    c->hidden = sh->C, c->intermediate = sh->F, c->n_layers = sh->L, c->n_heads = sh->H;
    c->n_kv_heads = sh->KVH, c->head_dim = sh->D, c->vocab = sh->V;
    c->max_position = 4096;
    c->rms_eps = 1e-6f;
    c->rope_theta = sh->theta;
    c->tie_embeddings = sh->tied;
    c->qk_norm = sh->arch == ARCH_QWEN3 || sh->arch == ARCH_QWEN3_MOE;
    c->n_experts = sh->E, c->n_experts_active = sh->K, c->moe_intermediate = sh->FE;
    c->decoder_sparse_step = sh->step, c->norm_topk_prob = sh->norm, c->mlp_only[0] = sh->mlp_only;
    if (sh->E)
        t->m.experts = tm_alloc(t, (size_t)sh->L * (size_t)sh->E * sizeof *t->m.experts);
    c->qkv_bias = sh->arch == ARCH_QWEN2;
    c->rope_scaling.type = ROPE_DEFAULT;
    c->bos_id = c->pad_id = -1;

    const int C = sh->C, F = sh->F, HD = sh->H * sh->D, KVD = sh->KVH * sh->D;
    const double wc = 1.0 / sqrt(C) * sqrt(3.0); /* uniform with variance 1/K */
    t->embed = tm_weight(t, &t->m.embed, sh->V, C, 0, 0.5);
    t->final_norm = tm_weight(t, &t->m.final_norm, C, 0, 1, 0.2);
    if (sh->tied) {
        t->m.lm_head = t->m.embed;
        t->lm_head = t->embed;
    } else {
        t->lm_head = tm_weight(t, &t->m.lm_head, sh->V, C, 0, 0.5);
    }
    t->m.layers = tm_alloc(t, (size_t)sh->L * sizeof *t->m.layers);
    assert_true(sh->L <= 4);
    for (int l = 0; l < sh->L; l++) {
        struct layer_weights *lw = &t->m.layers[l];
        t->l[l].attn_norm = tm_weight(t, &lw->attn_norm, C, 0, 1, 0.2);
        t->l[l].wq = tm_weight(t, &lw->wq, HD, C, 0, wc);
        t->l[l].wk = tm_weight(t, &lw->wk, KVD, C, 0, wc);
        t->l[l].wv = tm_weight(t, &lw->wv, KVD, C, 0, wc);
        if (c->qkv_bias) {
            t->l[l].bq = tm_weight(t, &lw->bq, HD, 0, 0, 0.5);
            t->l[l].bk = tm_weight(t, &lw->bk, KVD, 0, 0, 0.5);
            t->l[l].bv = tm_weight(t, &lw->bv, KVD, 0, 0, 0.5);
        }
        if (c->qk_norm) {
            t->l[l].q_norm = tm_weight(t, &lw->q_norm, sh->D, 0, 1, 0.3);
            t->l[l].k_norm = tm_weight(t, &lw->k_norm, sh->D, 0, 1, 0.3);
        }
        t->l[l].wo = tm_weight(t, &lw->wo, C, HD, 0, sqrt(3.0 / HD));
        t->l[l].mlp_norm = tm_weight(t, &lw->mlp_norm, C, 0, 1, 0.2);
        if (model_layer_moe(c, l)) { /* router logits of std ~1.5 */
            const int FE = sh->FE;
            t->l[l].router = tm_weight(t, &lw->router, sh->E, C, 0, 1.5 * wc);
            lw->experts = t->m.experts + (size_t)l * (size_t)sh->E;
            for (int e = 0; e < sh->E; e++) {
                t->l[l].e_gate[e] = tm_weight(t, &lw->experts[e].w_gate, FE, C, 0, wc);
                t->l[l].e_up[e] = tm_weight(t, &lw->experts[e].w_up, FE, C, 0, wc);
                t->l[l].e_down[e] = tm_weight(t, &lw->experts[e].w_down, C, FE, 0, sqrt(3.0 / FE));
            }
            continue;
        }
        t->l[l].w_gate = tm_weight(t, &lw->w_gate, F, C, 0, wc);
        t->l[l].w_up = tm_weight(t, &lw->w_up, F, C, 0, wc);
        t->l[l].w_down = tm_weight(t, &lw->w_down, C, F, 0, sqrt(3.0 / F));
    }
    return t;
}

static void free_model(struct tmodel *t)
{
    for (int i = 0; i < t->n_allocs; i++)
        free(t->allocs[i]);
    free(t);
}

/* ---- the naive reference: whole sequence, unpaged, double */

/* y[N] = W[N, K] x[K] (+ b) */
static void ref_linear(double *y, const float *W, const float *b, const double *x, int N, int K)
{
    for (int n = 0; n < N; n++) {
        double s = b ? b[n] : 0;
        for (int k = 0; k < K; k++)
            s += (double)W[(size_t)n * K + k] * x[k];
        y[n] = s;
    }
}

static void ref_rope(double *v, int D, int pos, double theta)
{
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double ang = pos * pow(theta, -2.0 * i / D);
        double a = v[i], b = v[i + half];
        v[i] = a * cos(ang) - b * sin(ang);
        v[i + half] = b * cos(ang) + a * sin(ang);
    }
}

/* xp += the SwiGLU MLP (gate, up: F x C; down: C x F) of h, times w */
static void ref_mlp(double *xp, const double *h, const float *gate, const float *up, const float *down, int C,
                    int F, double w)
{
    double *g = calloc((size_t)F, sizeof *g), *u = calloc((size_t)F, sizeof *u);
    ref_linear(g, gate, NULL, h, F, C);
    ref_linear(u, up, NULL, h, F, C);
    for (int i = 0; i < F; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    for (int i = 0; i < C; i++) {
        double s = 0;
        for (int j = 0; j < F; j++)
            s += (double)down[(size_t)i * F + j] * g[j];
        xp[i] += w * s;
    }
    free(g), free(u);
}

/* xp += the mixture of experts of MoE layer l on h, straight from the definition in double: softmax over
 * all experts, the K largest (ties to the lower index), renormalized when the shape says so */
static void ref_moe(const struct tmodel *t, int l, double *xp, const double *h)
{
    const struct shape *sh = t->sh;
    double lg[MAX_E], p[MAX_E], z = 0, mx = -INFINITY;
    bool taken[MAX_E] = {false};
    int sel[MAX_E];
    ref_linear(lg, t->l[l].router, NULL, h, sh->E, sh->C);
    for (int e = 0; e < sh->E; e++)
        mx = fmax(mx, lg[e]);
    for (int e = 0; e < sh->E; e++)
        z += p[e] = exp(lg[e] - mx);
    double psel = 0;
    for (int k = 0; k < sh->K; k++) {
        int best = -1;
        for (int e = 0; e < sh->E; e++)
            if (!taken[e] && (best < 0 || lg[e] > lg[best]))
                best = e;
        taken[best] = true;
        sel[k] = best;
        psel += p[best] / z;
    }
    for (int k = 0; k < sh->K; k++) {
        const int e = sel[k];
        ref_mlp(xp, h, t->l[l].e_gate[e], t->l[l].e_up[e], t->l[l].e_down[e], sh->C, sh->FE,
                p[e] / z / (sh->norm ? psel : 1));
    }
}

/* log_softmax of the logits at every position of tokens[0, n): lp[n][V] */
static double *ref_forward(const struct tmodel *t, const int32_t *tok, int n)
{
    const struct shape *sh = t->sh;
    const int C = sh->C, F = sh->F, H = sh->H, KVH = sh->KVH, D = sh->D, V = sh->V;
    const int HD = H * D, KVD = KVH * D;
    const double eps = t->m.cfg.rms_eps;
    double *x = calloc((size_t)n * C, sizeof *x), *h = calloc((size_t)C, sizeof *h);
    double *q = calloc((size_t)n * HD, sizeof *q), *k = calloc((size_t)n * KVD, sizeof *k);
    double *v = calloc((size_t)n * KVD, sizeof *v), *o = calloc((size_t)HD, sizeof *o);
    double *y = calloc((size_t)C, sizeof *y);
    double *sc = calloc((size_t)n, sizeof *sc), *lp = calloc((size_t)n * V, sizeof *lp);
    for (int p = 0; p < n; p++)
        for (int i = 0; i < C; i++)
            x[(size_t)p * C + i] = t->embed[(size_t)tok[p] * C + i];
    for (int l = 0; l < sh->L; l++) {
        for (int p = 0; p < n; p++) {
            cpu_test_rmsnorm(h, x + (size_t)p * C, t->l[l].attn_norm, C, eps);
            double *qp = q + (size_t)p * HD, *kp = k + (size_t)p * KVD, *vp = v + (size_t)p * KVD;
            ref_linear(qp, t->l[l].wq, t->l[l].bq, h, HD, C);
            ref_linear(kp, t->l[l].wk, t->l[l].bk, h, KVD, C);
            ref_linear(vp, t->l[l].wv, t->l[l].bv, h, KVD, C);
            for (int hh = 0; hh < H; hh++) {
                if (t->l[l].q_norm)
                    cpu_test_rmsnorm(qp + hh * D, qp + hh * D, t->l[l].q_norm, D, eps);
                ref_rope(qp + hh * D, D, p, sh->theta);
            }
            for (int gg = 0; gg < KVH; gg++) {
                if (t->l[l].k_norm)
                    cpu_test_rmsnorm(kp + gg * D, kp + gg * D, t->l[l].k_norm, D, eps);
                ref_rope(kp + gg * D, D, p, sh->theta);
            }
        }
        for (int p = 0; p < n; p++) {
            for (int hh = 0; hh < H; hh++) {
                int gg = hh / (H / KVH);
                double mx = -INFINITY, z = 0;
                for (int j = 0; j <= p; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += q[(size_t)p * HD + hh * D + d] * k[(size_t)j * KVD + gg * D + d];
                    sc[j] = s / sqrt((double)D);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= p; j++)
                    z += sc[j] = exp(sc[j] - mx);
                for (int d = 0; d < D; d++) {
                    double s = 0;
                    for (int j = 0; j <= p; j++)
                        s += sc[j] / z * v[(size_t)j * KVD + gg * D + d];
                    o[hh * D + d] = s;
                }
            }
            ref_linear(y, t->l[l].wo, NULL, o, C, HD);
            for (int i = 0; i < C; i++)
                x[(size_t)p * C + i] += y[i];
        }
        for (int p = 0; p < n; p++) {
            double *xp = x + (size_t)p * C;
            cpu_test_rmsnorm(h, xp, t->l[l].mlp_norm, C, eps);
            if (t->l[l].router)
                ref_moe(t, l, xp, h);
            else
                ref_mlp(xp, h, t->l[l].w_gate, t->l[l].w_up, t->l[l].w_down, C, F, 1.0);
        }
    }
    for (int p = 0; p < n; p++) {
        double *row = lp + (size_t)p * V;
        cpu_test_rmsnorm(h, x + (size_t)p * C, t->final_norm, C, eps);
        ref_linear(row, t->lm_head, NULL, h, V, C);
        cpu_test_log_softmax(row, V);
    }
    free(x), free(h), free(q), free(k), free(v), free(o), free(y), free(sc);
    return lp;
}

/* ---- driving the backend */

static struct backend *open_cpu_lm(const struct tmodel *t, int block_size, int64_t kv_bytes,
                                   enum be_weights lm)
{
    struct backend_opts o = cpu_test_opts(block_size, 8, 512, 256);
    o.lm_head_dtype = lm;
    o.kv_cache_bytes = kv_bytes;
    struct backend *be = cpu_test_backend(&t->m, &o);
    assert_string_equal(backend_name(be), "cpu");
    assert_int_equal(be->block_size, block_size);
    return be;
}

static struct backend *open_cpu(const struct tmodel *t, int block_size, int64_t kv_bytes)
{
    return open_cpu_lm(t, block_size, kv_bytes, BE_WEIGHTS_AUTO);
}

/* A sequence as a test drives it: its tokens, its block table, and the steps (chunk sizes). */
struct tseq {
    const int32_t *tokens;
    int n; /* tokens to run */
    int32_t table[256];
    int n_blocks;
    int pos; /* tokens already run */
};

static void tseq_init(struct tseq *s, const int32_t *tokens, int n, int block_size, int first_block,
                      int stride)
{
    memset(s, 0, sizeof *s);
    s->tokens = tokens;
    s->n = n;
    s->n_blocks = (n + block_size - 1) / block_size;
    assert_true(s->n_blocks <= 256);
    for (int i = 0; i < s->n_blocks; i++)
        s->table[i] = first_block + i * stride;
}

static struct be_seq tseq_step(const struct tseq *s, int n_new, const struct sampling_params *sp)
{
    return cpu_test_seq(s->tokens, s->pos, n_new, s->table, s->n_blocks, sp);
}

/* Runs s in chunks of `chunk` tokens (0 = all at once); out[p] for each step's last position p. */
static void run_chunks(struct backend *be, struct tseq *s, int chunk, struct be_out *out)
{
    struct sampling_params sp = cpu_test_greedy(SAMPLING_MAX_LOGPROBS);
    while (s->pos < s->n) {
        int k = chunk > 0 && s->n - s->pos > chunk ? chunk : s->n - s->pos;
        struct be_seq b = tseq_step(s, k, &sp);
        cpu_test_step(be, &b, 1, &out[s->pos + k - 1]);
        s->pos += k;
    }
}

static void random_tokens(int32_t *t, int n, int V)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((urand() + 1) / 2 * V) % V;
}

/* |a - b| <= tol * max(1, |b|) */
static void expect_close(double a, double b, double tol, const char *what, int pos, int j)
{
    if (!(fabs(a - b) <= tol * fmax(1.0, fabs(b)))) {
        print_error("%s at position %d, entry %d: %.8f vs %.8f\n", what, pos, j, a, b);
        fail();
    }
}

/* The backend's logprobs at position p equal the reference row: the greedy token is the
 * reference's argmax (unless a near tie), its logprob and the top 20 agree within tol. */
static void expect_matches_ref(const struct be_out *o, const double *row, int V, double tol, int p)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (row[i] > row[best])
            best = i;
    double second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != best && row[i] > second)
            second = row[i];
    if (row[best] - second > 1e-3)
        assert_int_equal(o->token, best);
    expect_close(o->logprob, row[o->token], tol, "chosen logprob", p, 0);
    assert_int_equal(o->n_top, SAMPLING_MAX_LOGPROBS);
    for (int j = 0; j < o->n_top; j++) {
        expect_close(o->top_logprobs[j], row[o->top_ids[j]], tol, "top logprob", p, j);
        if (j > 0)
            assert_true(o->top_logprobs[j] <= o->top_logprobs[j - 1]);
    }
    /* and no id outside the top list beats its last entry */
    double floor_lp = row[o->top_ids[o->n_top - 1]];
    for (int i = 0; i < V; i++) {
        bool in = false;
        for (int j = 0; j < o->n_top; j++)
            in |= o->top_ids[j] == i;
        if (!in && row[i] > floor_lp + 1e-4) {
            print_error("position %d: id %d (%.6f) is missing from the top list\n", p, i, row[i]);
            fail();
        }
    }
}

/* Two outputs of the same position from different runs: same token and logprobs. The forward is
 * computed the same way per token whatever the batching, so this is expected to be bitwise; the
 * tolerance only allows for a compiler that contracts to FMA differently at different sites. */
static void expect_same(const struct be_out *a, const struct be_out *b, int p)
{
    assert_int_equal(a->token, b->token);
    expect_close(a->logprob, b->logprob, 1e-6, "logprob (invariance)", p, 0);
    assert_int_equal(a->n_top, b->n_top);
    for (int j = 0; j < a->n_top; j++) {
        assert_int_equal(a->top_ids[j], b->top_ids[j]);
        expect_close(a->top_logprobs[j], b->top_logprobs[j], 1e-6, "top logprob (invariance)", p, j);
    }
}

/* ---- tests */

/* Token by token (every position's logits) and all at once, against the reference. */
static void test_against_reference(void **state)
{
    (void)state;
    enum { N = 40 };
    for (int si = 0; si < N_SHAPES; si++) {
        struct tmodel *t = make_model(&SHAPES[si]);
        int32_t tok[N];
        random_tokens(tok, N, t->sh->V);
        double *ref = ref_forward(t, tok, N);
        /* the reference's logits have a useful spread (the test would be weak otherwise) */
        double lo = 0;
        for (int i = 0; i < t->sh->V; i++)
            lo = fmin(lo, ref[(size_t)(N - 1) * t->sh->V + i]);
        assert_true(lo < -3);

        struct backend *be = open_cpu(t, 4, 0);
        struct be_out out[N];
        struct tseq s;
        tseq_init(&s, tok, N, 4, 0, 1);
        run_chunks(be, &s, 1, out);
        for (int p = 0; p < N; p++)
            expect_matches_ref(&out[p], ref + (size_t)p * t->sh->V, t->sh->V, 1e-4, p);
        memset(out, 0, sizeof out);
        tseq_init(&s, tok, N, 4, 20, 1); /* all at once, in other blocks */
        run_chunks(be, &s, 0, out);
        expect_matches_ref(&out[N - 1], ref + (size_t)(N - 1) * t->sh->V, t->sh->V, 1e-4, N - 1);
        backend_free(be);
        free(ref);
        free_model(t);
    }
}

/* model.lm_head_dtype fp8: the output projection holds its 128x128-block fp8 values (what the GPU
 * multiplies with), the embedding (tied or not) its own; auto and bf16 keep the plain values. */
static void test_fp8_lm_head(void **state)
{
    (void)state;
    enum { N = 24 };
    static const struct shape LM[] = {
        {"qwen3-untied-v256", ARCH_QWEN3, 128, 192, 2, 4, 2, 32, 256, false, false, 1000000, 0, 0, 0, 0,
         false, 0},
        {"qwen3-tied-v384", ARCH_QWEN3, 128, 160, 2, 4, 2, 32, 384, true, false, 1000000, 0, 0, 0, 0, false,
         0},
    };
    for (int si = 0; si < 2; si++) {
        struct tmodel *t = make_model(&LM[si]);
        const int V = LM[si].V, C = LM[si].C;
        int32_t tok[N];
        random_tokens(tok, N, V);
        double *plain = ref_forward(t, tok, N);
        /* the reference with the output projection's fp8 values (the input embedding unchanged) */
        float *q = malloc((size_t)V * C * sizeof *q), *keep = t->lm_head;
        char err[256];
        assert_non_null(q);
        struct tensor_view lv = t->m.lm_head; /* == the embedding's view when tied */
        assert_int_equal(fp8_linear_values(&lv, true, q, err, sizeof err), 0);
        t->lm_head = q;
        double *ref8 = ref_forward(t, tok, N);
        t->lm_head = keep;
        /* the quantization moves the logprobs (else this test could not tell the two apart) */
        double moved = 0;
        for (size_t i = 0; i < (size_t)N * V; i++)
            moved = fmax(moved, fabs(ref8[i] - plain[i]));
        assert_true(moved > 1e-3);

        const enum be_weights modes[3] = {BE_WEIGHTS_FP8, BE_WEIGHTS_AUTO, BE_WEIGHTS_BF16};
        for (int mi = 0; mi < 3; mi++) {
            struct backend *be = open_cpu_lm(t, 4, 0, modes[mi]);
            struct be_out out[N];
            struct tseq s;
            tseq_init(&s, tok, N, 4, 0, 1);
            run_chunks(be, &s, 1, out);
            for (int p = 0; p < N; p++)
                expect_matches_ref(&out[p], (mi == 0 ? ref8 : plain) + (size_t)p * V, V, 1e-4, p);
            backend_free(be);
        }
        free(q), free(plain), free(ref8);
        free_model(t);
    }
}

/* One go vs chunks vs token by token; block sizes 1, 4, 16 and 5; shuffled block tables. */
static void test_paging_invariants(void **state)
{
    (void)state;
    enum { N = 37 };
    for (int si = 0; si < N_SHAPES; si++) {
        struct tmodel *t = make_model(&SHAPES[si]);
        int32_t tok[N];
        random_tokens(tok, N, t->sh->V);
        struct be_out base[N], o[N];
        struct tseq s;

        struct backend *be = open_cpu(t, 4, 0);
        tseq_init(&s, tok, N, 4, 0, 1);
        run_chunks(be, &s, 1, base); /* token by token: every position */

        tseq_init(&s, tok, N, 4, 0, 1);
        run_chunks(be, &s, 0, o);
        expect_same(&o[N - 1], &base[N - 1], N - 1);

        const int chunks[3] = {3, 5, 16};
        for (int c = 0; c < 3; c++) {
            tseq_init(&s, tok, N, 4, 11, 1);
            run_chunks(be, &s, chunks[c], o);
            for (int p = chunks[c] - 1; p < N; p += chunks[c])
                expect_same(&o[p], &base[p], p);
            expect_same(&o[N - 1], &base[N - 1], N - 1);
        }
        /* a shuffled, non-contiguous table: blocks 3*i+1 in a permuted order */
        tseq_init(&s, tok, N, 4, 0, 1);
        for (int i = 0; i < s.n_blocks; i++)
            s.table[i] = (int32_t)(((i * 7) % s.n_blocks) * 3 + 1);
        run_chunks(be, &s, 6, o);
        expect_same(&o[N - 1], &base[N - 1], N - 1);
        backend_free(be);

        const int sizes[3] = {1, 16, 5};
        for (int b = 0; b < 3; b++) {
            be = open_cpu(t, sizes[b], 0);
            tseq_init(&s, tok, N, sizes[b], 0, 1);
            /* reversed block order */
            for (int i = 0; i < s.n_blocks; i++)
                s.table[i] = (int32_t)(s.n_blocks - 1 - i) * 2;
            run_chunks(be, &s, 7, o);
            for (int p = 6; p < N; p += 7)
                expect_same(&o[p], &base[p], p);
            expect_same(&o[N - 1], &base[N - 1], N - 1);
            backend_free(be);
        }
        free_model(t);
    }
}

/* Several sequences in one step, prefill chunks and decodes mixed, equal each run alone; with
 * seeded temperature sampling the tokens are equal too. */
static void test_batch_equals_alone(void **state)
{
    (void)state;
    enum { NS = 4, MAXN = 48 };
    const int lens[NS] = {30, 9, 21, 48};
    const int chunk[NS] = {8, 9, 5, 48}; /* prefill chunk per step, then decodes */
    for (int si = 0; si < N_SHAPES; si++) {
        struct tmodel *t = make_model(&SHAPES[si]);
        int32_t tok[NS][MAXN];
        struct be_out alone[NS][MAXN], batch[NS][MAXN];
        struct sampling_params sps[NS];
        for (int i = 0; i < NS; i++) {
            random_tokens(tok[i], lens[i], t->sh->V);
            sps[i] = cpu_test_greedy(SAMPLING_MAX_LOGPROBS);
            if (i % 2) { /* seeded sampling on two of them */
                sps[i].temperature = 0.9f;
                sps[i].top_k = 50;
                sps[i].seed = 1000 + (uint64_t)i;
            }
        }
        struct backend *be = open_cpu(t, 8, 0);
        /* alone: each sequence token by token in its own blocks */
        struct tseq s[NS];
        for (int i = 0; i < NS; i++) {
            tseq_init(&s[i], tok[i], lens[i], 8, i * 8, 1);
            while (s[i].pos < s[i].n) {
                struct be_seq b = tseq_step(&s[i], 1, &sps[i]);
                cpu_test_step(be, &b, 1, &alone[i][s[i].pos]);
                s[i].pos++;
            }
        }
        /* batched: every step runs a chunk of each unfinished sequence (a prompt chunk until
         * `chunk` is reached, then one token), blocks interleaved across sequences */
        for (int i = 0; i < NS; i++) {
            tseq_init(&s[i], tok[i], lens[i], 8, 40 + i, NS);
        }
        for (;;) {
            struct be_seq b[NS];
            struct be_out o[NS];
            int idx[NS], nb = 0;
            for (int i = 0; i < NS; i++) {
                if (s[i].pos >= s[i].n)
                    continue;
                int k = s[i].pos < chunk[i] ? chunk[i] - s[i].pos : 1;
                if (k > s[i].n - s[i].pos)
                    k = s[i].n - s[i].pos;
                b[nb] = tseq_step(&s[i], k, &sps[i]);
                idx[nb++] = i;
            }
            if (nb == 0)
                break;
            cpu_test_step(be, b, nb, o);
            for (int j = 0; j < nb; j++) {
                int i = idx[j];
                s[i].pos += b[j].n_new;
                batch[i][s[i].pos - 1] = o[j];
            }
        }
        for (int i = 0; i < NS; i++)
            for (int p = chunk[i] - 1; p < lens[i]; p++)
                expect_same(&batch[i][p], &alone[i][p], p);
        backend_free(be);
        free_model(t);
    }
}

/* Only sequences with sample set get logits; others' out entries are untouched. */
static void test_sample_flag(void **state)
{
    (void)state;
    struct tmodel *t = make_model(&SHAPES[0]);
    struct backend *be = open_cpu(t, 4, 0);
    int32_t tok[10];
    random_tokens(tok, 10, t->sh->V);
    struct tseq a, b;
    tseq_init(&a, tok, 10, 4, 0, 1);
    tseq_init(&b, tok, 10, 4, 3, 1);
    struct sampling_params sp = cpu_test_greedy(SAMPLING_MAX_LOGPROBS);
    struct be_seq s[2] = {tseq_step(&a, 6, &sp), tseq_step(&b, 10, &sp)};
    s[0].sample = false;
    s[0].n_tokens = 10; /* more tokens follow in a later step */
    s[0].n_prompt = 10;
    struct be_out out[2];
    memset(out, 0x5a, sizeof out);
    cpu_test_step(be, s, 2, out);
    const unsigned char *raw = (const unsigned char *)&out[0];
    for (size_t i = 0; i < sizeof out[0]; i++)
        assert_int_equal(raw[i], 0x5a);
    assert_true(out[1].token >= 0 && out[1].token < t->sh->V);
    /* continuing the first one gives what one go gives */
    a.pos = 6;
    struct be_seq s2 = tseq_step(&a, 4, &sp);
    cpu_test_step(be, &s2, 1, &out[0]);
    expect_same(&out[0], &out[1], 9);
    backend_free(be);
    free_model(t);
}

/* Bad steps fail with a message and no crash; the backend keeps working. */
static void test_step_errors(void **state)
{
    (void)state;
    struct tmodel *t = make_model(&SHAPES[1]);
    struct backend *be = open_cpu(t, 4, 0);
    int32_t tok[10];
    random_tokens(tok, 10, t->sh->V);
    struct sampling_params sp = cpu_test_greedy(SAMPLING_MAX_LOGPROBS);
    struct tseq a;
    tseq_init(&a, tok, 10, 4, 0, 1);
    struct be_out o;

    struct be_seq s = tseq_step(&a, 10, &sp);
    s.n_blocks = 2; /* 10 tokens need 3 blocks of 4 */
    assert_int_equal(backend_step(be, &s, 1, &o), -1);
    assert_non_null(strstr(be->err, "need 3"));

    s = tseq_step(&a, 10, &sp);
    a.table[1] = be->num_blocks;
    assert_int_equal(backend_step(be, &s, 1, &o), -1);
    assert_non_null(strstr(be->err, "outside the pool"));
    a.table[1] = 1;

    int32_t bad[2] = {0, t->sh->V};
    struct tseq c;
    tseq_init(&c, bad, 2, 4, 0, 1);
    s = tseq_step(&c, 2, &sp);
    assert_int_equal(backend_step(be, &s, 1, &o), -1);
    assert_non_null(strstr(be->err, "outside the vocabulary"));

    s = tseq_step(&a, 10, &sp);
    s.n_tokens = 11; /* sample set but the step stops short of the last token */
    assert_int_equal(backend_step(be, &s, 1, &o), -1);
    assert_non_null(strstr(be->err, "sample"));

    s = tseq_step(&a, 10, &sp); /* and a good step still works */
    cpu_test_step(be, &s, 1, &o);
    assert_int_equal(backend_step(be, &s, 0, &o), 0);
    backend_free(be);
    free_model(t);
}

/* KV pool sizing: from kv_cache_bytes, cpu_kv_cache_bytes, the default, and the error when one sequence
 * cannot fit. */
static void test_kv_sizing(void **state)
{
    (void)state;
    struct tmodel *t = make_model(&SHAPES[0]);           /* L 2, KVH 2, D 32 */
    const int64_t block_bytes = 2 * 2 * 2 * 16 * 32 * 4; /* L * K|V * KVH * bs * D * fp32 */
    struct backend *be = open_cpu(t, 16, block_bytes * 37 + 5);
    assert_int_equal(be->num_blocks, 37);
    backend_free(be);
    be = open_cpu(t, 16, 0); /* 8 seqs * 256 tokens / 16 = 128 blocks, under the cap */
    assert_int_equal(be->num_blocks, 128);
    backend_free(be);

    struct backend_opts o = {0};
    o.block_size = 16;
    o.max_num_seqs = 1;
    o.max_model_len = 256;
    o.kv_cache_bytes = block_bytes * 15; /* 256 tokens need 16 blocks */
    char err[512] = "";
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "max_model_len 256"));
    o.kv_cache_bytes = 0;
    o.max_model_len = 1 << 22; /* 4M tokens: over the 512 MiB default cap */
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "cannot hold one sequence"));
    assert_non_null(strstr(err, "raise cpu_kv_cache_bytes")); /* the key a user has */
    /* engine.cpu_kv_cache_bytes (what the configuration sets): the pool's size when kv_cache_bytes is 0,
     * named in the error; kv_cache_bytes, when set, wins */
    o.max_model_len = 256;
    o.max_num_seqs = 8;
    o.threads = 2;
    o.cpu_kv_cache_bytes = block_bytes * 21 + 7;
    struct backend *bc = backend_open("cpu", &t->m, &o, err, sizeof err);
    assert_non_null(bc);
    assert_int_equal(bc->num_blocks, 21);
    backend_free(bc);
    o.kv_cache_bytes = block_bytes * 19;
    bc = backend_open("cpu", &t->m, &o, err, sizeof err);
    assert_non_null(bc);
    assert_int_equal(bc->num_blocks, 19);
    backend_free(bc);
    o.kv_cache_bytes = 0;
    o.cpu_kv_cache_bytes = block_bytes * 15; /* 256 tokens need 16 blocks */
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "from cpu_kv_cache_bytes"));
    assert_non_null(strstr(err, "raise cpu_kv_cache_bytes"));
    o.cpu_kv_cache_bytes = 0;
    o.max_model_len = 256;
    o.block_size = 0;
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "block_size"));
    free_model(t);
}

/* Open errors: a wrong shape, a missing tensor, a bad backend name, cuda in a CPU build. */
static void test_open_errors(void **state)
{
    (void)state;
    struct tmodel *t = make_model(&SHAPES[2]);
    struct backend_opts o = {0};
    o.block_size = 16;
    o.max_num_seqs = 2;
    o.max_model_len = 64;
    char err[512] = "";
    t->m.layers[1].wk.shape[0]++;
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "layer 1 k_proj: shape [33, 64], expected [32, 64]"));
    t->m.layers[1].wk.shape[0]--;
    const void *keep = t->m.layers[2].w_up.data;
    t->m.layers[2].w_up.data = NULL;
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "layer 2 up_proj: missing"));
    t->m.layers[2].w_up.data = keep;
    assert_null(backend_open("tpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "unknown backend"));
    /* the shape check both backends share (backend_check_model), before anything else */
    const int heads = t->m.cfg.n_heads;
    t->m.cfg.n_heads = 2 * t->m.cfg.n_kv_heads + 1;
    assert_null(backend_open("cpu", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "unsupported model shape: hidden "));
#ifdef LLMQ_HAVE_CUDA
    err[0] = 0;
    assert_null(backend_open("cuda", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "unsupported model shape: hidden "));
#endif
    t->m.cfg.n_heads = heads;
#ifndef LLMQ_HAVE_CUDA
    assert_null(backend_open("cuda", &t->m, &o, err, sizeof err));
    assert_non_null(strstr(err, "built without the CUDA backend"));
    struct backend *be = backend_open("auto", &t->m, &o, err, sizeof err);
    assert_non_null(be);
    assert_string_equal(backend_name(be), "cpu");
    backend_free(be);
#endif
    backend_free(NULL);
    free_model(t);
}

/* backend_rope_freqs: default, llama3 and yarn against the formulas of transformers'
 * _compute_*_parameters evaluated here in double. */
static void test_rope_freqs(void **state)
{
    (void)state;
    struct model_config c = {0};
    c.head_dim = 128;
    c.rope_theta = 500000;
    c.max_position = 131072;
    float inv[64], scale;
    char err[256];
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), 0);
    assert_true(scale == 1.0f);
    for (int i = 0; i < 64; i++)
        assert_true(fabs(inv[i] / pow(500000.0, -2.0 * i / 128) - 1) < 1e-6);

    /* llama3 (Llama-3.1: factor 8, low 1, high 4, original 8192) */
    c.rope_scaling.type = ROPE_LLAMA3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max = 8192;
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), 0);
    int n_low = 0, n_mid = 0, n_high = 0;
    for (int i = 0; i < 64; i++) {
        double f = pow(500000.0, -2.0 * i / 128), wl = 2 * M_PI / f, want;
        if (wl < 8192.0 / 4)
            want = f, n_high++;
        else if (wl > 8192.0 / 1)
            want = f / 8, n_low++;
        else {
            double sm = (8192.0 / wl - 1) / (4 - 1);
            want = (1 - sm) * f / 8 + sm * f;
            n_mid++;
        }
        if (fabs(inv[i] / want - 1) > 1e-5) {
            print_error("llama3 inv_freq[%d] %.9g, expected %.9g\n", i, (double)inv[i], want);
            fail();
        }
    }
    assert_true(n_low > 0 && n_mid > 0 && n_high > 0);
    c.rope_scaling.original_max = 0;
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), -1);

    /* yarn (Qwen3 long context: factor 4, original 32768, theta 1e6) */
    c.rope_theta = 1000000;
    c.rope_scaling.type = ROPE_YARN;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max = 32768;
    c.rope_scaling.beta_fast = 32;
    c.rope_scaling.beta_slow = 1;
    c.rope_scaling.attn_factor = 0; /* derived: 0.1 ln 4 + 1 */
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), 0);
    assert_true(fabs(scale - (0.1 * log(4.0) + 1)) < 1e-6);
    double low = floor(128 * log(32768 / (32 * 2 * M_PI)) / (2 * log(1e6)));
    double high = ceil(128 * log(32768 / (1 * 2 * M_PI)) / (2 * log(1e6)));
    low = fmax(low, 0), high = fmin(high, 127);
    for (int i = 0; i < 64; i++) {
        double f = pow(1e6, -2.0 * i / 128);
        double ramp = fmin(1, fmax(0, (i - low) / (high - low)));
        double extra = 1 - ramp, want = f / 4 * (1 - extra) + f * extra;
        if (fabs(inv[i] / want - 1) > 1e-5) {
            print_error("yarn inv_freq[%d] %.9g, expected %.9g\n", i, (double)inv[i], want);
            fail();
        }
    }
    c.rope_scaling.attn_factor = 1.25;
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), 0);
    assert_true(scale == 1.25f);
    c.head_dim = 7;
    assert_int_equal(backend_rope_freqs(&c, inv, &scale, err, sizeof err), -1);
    assert_non_null(strstr(err, "even"));
}

int main(void)
{
    log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),  cmocka_unit_test(test_paging_invariants),
        cmocka_unit_test(test_batch_equals_alone), cmocka_unit_test(test_sample_flag),
        cmocka_unit_test(test_step_errors),        cmocka_unit_test(test_kv_sizing),
        cmocka_unit_test(test_open_errors),        cmocka_unit_test(test_rope_freqs),
        cmocka_unit_test(test_fp8_lm_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
