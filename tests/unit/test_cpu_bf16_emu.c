/* engine/cpu_backend with emulate_cuda: the CPU oracle that rounds like the CUDA backend.
 *
 * 1. Against a naive reference written here (double precision, whole sequence at once) that rounds
 *    to bf16 at the same points: the emulated backend is as close to it as the bf16 forward's own
 *    sensitivity allows, and several times closer than the plain fp32 backend is. The same in fp16
 *    (weight_dtype BE_WEIGHTS_F16: the emulation of the CUDA backend's fp16 mode), where every
 *    difference is several times smaller than in bf16.
 * 2. On the tiny checkpoints of tests/gpu/test_cuda_backend.c: the emulated vs fp32 differences have
 *    the size the H200 showed between CUDA and the fp32 oracle (0.07-0.23 max |dlogprob|), and the
 *    jittered oracle (emulate_cuda_jitter) spreads by a similar amount: printed.
 * 3. Invariants: block size, block order, prefill chunking and batching do not change a sequence's
 *    outputs when the steps are laid out alike (bitwise); a decode layout, another decode split and
 *    the decode-graph buckets change them by a rounding-sized amount, exactly where the CUDA backend's
 *    would; weights are rounded to bf16 once (an fp32 checkpoint and its bf16 rounding agree bitwise);
 *    the plain fp32 backend ignores the jitter. */
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

#define NTOP SAMPLING_MAX_LOGPROBS

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static void random_tokens(int32_t *t, int n, int V)
{
    cpu_test_random_tokens(&rng_state, t, n, V);
}

/* The shapes of tests/gpu/test_cuda_backend.c, and a one-layer Qwen3 */
static struct tiny_opts shape_opts(int i, const char **name)
{
    struct tiny_opts o = tiny_opts_default();
    switch (i) {
    case 0:
        *name = "qwen3-tied";
        o.hidden = 128, o.heads = 4, o.kv_heads = 2, o.head_dim = 64, o.intermediate = 320, o.layers = 2;
        break;
    case 1:
        *name = "qwen3-gqa4";
        o.hidden = 256, o.heads = 8, o.kv_heads = 2, o.head_dim = 128, o.intermediate = 512, o.layers = 3;
        o.tie = false, o.vocab = 1000, o.seed = 1;
        break;
    case 2:
        *name = "qwen2-bias";
        o.arch = ARCH_QWEN2, o.hidden = 256, o.heads = 4, o.kv_heads = 2, o.intermediate = 384, o.layers = 2;
        o.seed = 2;
        break;
    case 3:
        *name = "qwen3-f32";
        o.hidden = 128, o.heads = 2, o.kv_heads = 1, o.head_dim = 64, o.intermediate = 256, o.layers = 2;
        o.dtype = DT_F32, o.seed = 3;
        break;
    default:
        *name = "qwen3-1layer";
        o.hidden = 128, o.heads = 4, o.kv_heads = 2, o.head_dim = 64, o.intermediate = 256, o.layers = 1;
        o.tie = false, o.seed = 4;
        break;
    }
    return o;
}

/* ---- backends */

struct be_cfg {
    bool emu, graphs, f16;
    uint64_t jitter;
    int block_size, max_len;
};

static struct backend *open_cpu(const struct model *m, struct be_cfg c)
{
    struct backend_opts o =
        cpu_test_opts(c.block_size ? c.block_size : 16, 64, 4096, c.max_len ? c.max_len : 2048);
    o.cuda_graphs = c.graphs;
    o.emulate_cuda = c.emu;
    o.emulate_cuda_jitter = c.jitter;
    o.weight_dtype = c.f16 ? BE_WEIGHTS_F16 : BE_WEIGHTS_AUTO;
    return cpu_test_backend(m, &o);
}

static void contiguous(int32_t *table, int n, int first)
{
    for (int i = 0; i < n; i++)
        table[i] = first + i;
}

/* Runs tok in steps of the given sizes (the last repeats), out[p] at the end of each step. */
static void run_steps(struct backend *be, const int32_t *tok, int n, const int *sizes, int n_sizes,
                      const int32_t *table, int n_blocks, struct be_out *out)
{
    struct sampling_params sp = cpu_test_greedy(NTOP);
    for (int pos = 0, k = 0; pos < n; k++) {
        int c = sizes[k < n_sizes ? k : n_sizes - 1];
        c = c < n - pos ? c : n - pos;
        struct be_seq s = cpu_test_seq(tok, pos, c, table, n_blocks, &sp);
        cpu_test_step(be, &s, 1, &out[pos + c - 1]);
        pos += c;
    }
}

/* ---- differences between outputs */

/* got against ref at one position: every id both top lists hold */
static void diff_out(struct cpu_test_diff *d, const struct be_out *ref, const struct be_out *got)
{
    d->ids += got->token != ref->token;
    cpu_test_diff_tops(d, ref, got);
}

/* got's top list against a full row of reference logprobs */
static void diff_row(struct cpu_test_diff *d, const double *row, int V, const struct be_out *got)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        best = row[i] > row[best] ? i : best;
    d->ids += got->token != best;
    for (int k = 0; k < got->n_top; k++)
        cpu_test_diff_add(d, fabs((double)got->top_logprobs[k] - row[got->top_ids[k]]));
}

static void expect_same(const struct be_out *a, const struct be_out *b, const char *what, int p)
{
    if (!cpu_test_same_out(a, b)) {
        print_error(
            "%s: position %d: token %d logprob %.9g vs token %d logprob %.9g (expected bitwise equal)\n",
            what, p, a->token, (double)a->logprob, b->token, (double)b->logprob);
        fail();
    }
}

/* ---- the naive reference: double precision, whole sequence, rounding to bf16 where asked */

struct wts {
    float *embed, *lm_head, *final_norm;
    struct {
        float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *mlp_norm, *w_gate, *w_up,
            *w_down;
    } l[4];
    float *all[64];
    int n_all;
};

static bool R_on;  /* the reference rounds (bf16 emulation) */
static bool R_f16; /* ... to fp16 instead (fp16 mode), weights too */
static double R16(double x)
{
    return R_f16 ? (double)f16_to_f32(f32_to_f16((float)x)) : (double)bf16_to_f32(f32_to_bf16((float)x));
}

static float *wts_get(struct wts *w, const struct tensor_view *t, bool round)
{
    if (!t->data)
        return NULL;
    int64_t n = tensor_numel(t);
    float *f = cpu_test_f32(t);
    if (round)
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)R16(f[i]);
    assert_true(w->n_all < 64);
    w->all[w->n_all++] = f;
    return f;
}

static void wts_load(struct wts *w, const struct model *m, bool round)
{
    memset(w, 0, sizeof *w);
    assert_true(m->cfg.n_layers <= 4);
    w->embed = wts_get(w, &m->embed, round);
    w->lm_head = m->cfg.tie_embeddings ? w->embed : wts_get(w, &m->lm_head, round);
    w->final_norm = wts_get(w, &m->final_norm, round);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct layer_weights *lw = &m->layers[l];
        w->l[l].attn_norm = wts_get(w, &lw->attn_norm, round);
        w->l[l].wq = wts_get(w, &lw->wq, round);
        w->l[l].wk = wts_get(w, &lw->wk, round);
        w->l[l].wv = wts_get(w, &lw->wv, round);
        w->l[l].bq = wts_get(w, &lw->bq, round);
        w->l[l].bk = wts_get(w, &lw->bk, round);
        w->l[l].bv = wts_get(w, &lw->bv, round);
        w->l[l].q_norm = wts_get(w, &lw->q_norm, round);
        w->l[l].k_norm = wts_get(w, &lw->k_norm, round);
        w->l[l].wo = wts_get(w, &lw->wo, round);
        w->l[l].mlp_norm = wts_get(w, &lw->mlp_norm, round);
        w->l[l].w_gate = wts_get(w, &lw->w_gate, round);
        w->l[l].w_up = wts_get(w, &lw->w_up, round);
        w->l[l].w_down = wts_get(w, &lw->w_down, round);
    }
}

static void wts_free(struct wts *w)
{
    for (int i = 0; i < w->n_all; i++)
        free(w->all[i]);
}

static double R(double x)
{
    return R_on ? R16(x) : x;
}

static void ref_linear(double *y, const float *W, const double *x, int N, int K)
{
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < K; k++)
            s += (double)W[(size_t)n * K + k] * x[k];
        y[n] = R(s);
    }
}

/* log_softmax rows lp[n][V] at every position of tok[0, n), every row computed as the prefill
 * kernel lays it out (running max over 64-key tiles) */
static double *ref_forward(const struct model *m, const struct wts *w, const int32_t *tok, int n, bool emu)
{
    R_on = emu;
    const struct model_config *c = &m->cfg;
    const int C = c->hidden, F = c->intermediate, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    const int V = c->vocab, HD = H * D, KVD = KVH * D, half = D / 2;
    const double eps = c->rms_eps;
    float inv_freq[512], attn_scale;
    char err[256];
    assert_true(half <= 512);
    assert_int_equal(backend_rope_freqs(c, inv_freq, &attn_scale, err, sizeof err), 0);
    double *x = calloc((size_t)n * C, sizeof *x), *h = calloc((size_t)C, sizeof *h);
    double *q = calloc((size_t)n * HD, sizeof *q), *k = calloc((size_t)n * KVD, sizeof *k);
    double *v = calloc((size_t)n * KVD, sizeof *v), *o = calloc((size_t)HD, sizeof *o);
    double *y = calloc((size_t)C, sizeof *y), *g = calloc((size_t)2 * F, sizeof *g);
    double *sc = calloc((size_t)n, sizeof *sc), *mr = calloc((size_t)n, sizeof *mr);
    double *lp = calloc((size_t)n * V, sizeof *lp);
    for (int p = 0; p < n; p++)
        for (int i = 0; i < C; i++)
            x[(size_t)p * C + i] = w->embed[(size_t)tok[p] * C + i];
    for (int l = 0; l < c->n_layers; l++) {
        for (int p = 0; p < n; p++) {
            cpu_test_rmsnorm(h, x + (size_t)p * C, w->l[l].attn_norm, C, eps);
            for (int i = 0; i < C; i++)
                h[i] = R(h[i]);
            double *qp = q + (size_t)p * HD, *kp = k + (size_t)p * KVD, *vp = v + (size_t)p * KVD;
            ref_linear(qp, w->l[l].wq, h, HD, C);
            ref_linear(kp, w->l[l].wk, h, KVD, C);
            ref_linear(vp, w->l[l].wv, h, KVD, C);
            for (int i = 0; w->l[l].bq && i < HD; i++)
                qp[i] += w->l[l].bq[i];
            for (int i = 0; w->l[l].bk && i < KVD; i++)
                kp[i] += w->l[l].bk[i], vp[i] += w->l[l].bv[i];
            for (int hh = 0; hh < H + KVH; hh++) {
                double *u = hh < H ? qp + hh * D : kp + (hh - H) * D;
                const float *nw = hh < H ? w->l[l].q_norm : w->l[l].k_norm;
                if (nw)
                    cpu_test_rmsnorm(u, u, nw, D, eps);
                for (int i = 0; i < half; i++) {
                    double ang = (double)((float)p * inv_freq[i]);
                    double cs = cos(ang) * attn_scale, sn = sin(ang) * attn_scale;
                    double a = u[i], b = u[i + half];
                    u[i] = R(a * cs - b * sn);
                    u[i + half] = R(b * cs + a * sn);
                }
            }
            for (int i = 0; i < KVD; i++)
                vp[i] = R(vp[i]);
        }
        for (int p = 0; p < n; p++) {
            for (int hh = 0; hh < H; hh++) {
                int gg = hh / (H / KVH);
                double mx = -INFINITY, M = -INFINITY;
                for (int j = 0; j <= p; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += q[(size_t)p * HD + hh * D + d] * k[(size_t)j * KVD + gg * D + d];
                    sc[j] = s / sqrt((double)D);
                    M = sc[j] > M ? sc[j] : M;
                }
                for (int t0 = 0; t0 <= p; t0 += 64) { /* running max per 64-key tile */
                    for (int j = t0; j <= p && j < t0 + 64; j++)
                        mx = sc[j] > mx ? sc[j] : mx;
                    for (int j = t0; j <= p && j < t0 + 64; j++)
                        mr[j] = mx;
                }
                double z = 0;
                for (int d = 0; d < D; d++)
                    o[hh * D + d] = 0;
                for (int j = 0; j <= p; j++) {
                    double pj = R(exp(sc[j] - mr[j])) * exp(mr[j] - M);
                    z += exp(sc[j] - M);
                    for (int d = 0; d < D; d++)
                        o[hh * D + d] += pj * v[(size_t)j * KVD + gg * D + d];
                }
                for (int d = 0; d < D; d++)
                    o[hh * D + d] = R(o[hh * D + d] / z);
            }
            ref_linear(y, w->l[l].wo, o, C, HD);
            for (int i = 0; i < C; i++)
                x[(size_t)p * C + i] += y[i];
        }
        for (int p = 0; p < n; p++) {
            double *xp = x + (size_t)p * C;
            cpu_test_rmsnorm(h, xp, w->l[l].mlp_norm, C, eps);
            for (int i = 0; i < C; i++)
                h[i] = R(h[i]);
            ref_linear(g, w->l[l].w_gate, h, F, C);
            ref_linear(g + F, w->l[l].w_up, h, F, C);
            for (int i = 0; i < F; i++)
                g[i] = R(g[i] / (1 + exp(-g[i])) * g[F + i]);
            ref_linear(y, w->l[l].w_down, g, C, F);
            for (int i = 0; i < C; i++)
                xp[i] += y[i];
        }
    }
    for (int p = 0; p < n; p++) {
        double *row = lp + (size_t)p * V;
        cpu_test_rmsnorm(h, x + (size_t)p * C, w->final_norm, C, eps);
        for (int i = 0; i < C; i++)
            h[i] = R(h[i]);
        R_on = false; /* logits in fp32 */
        ref_linear(row, w->lm_head, h, V, C);
        R_on = emu;
        cpu_test_log_softmax(row, V);
    }
    free(x), free(h), free(q), free(k), free(v), free(o), free(y), free(g), free(sc), free(mr);
    return lp;
}

/* ---- tests */

/* Every position's outputs as prefill rows: the prefix tok[0, p] as one step of p + 1 tokens
 * (p >= 1; one token would be a decode row). */
static void run_prefixes(struct backend *be, const int32_t *tok, int n, struct be_out *out)
{
    int32_t table[64];
    contiguous(table, 64, 0);
    struct sampling_params sp = cpu_test_greedy(NTOP);
    for (int p = 1; p < n; p++) {
        struct be_seq s = cpu_test_seq(tok, 0, p + 1, table, (p + 16) / 16, &sp);
        cpu_test_step(be, &s, 1, &out[p]);
    }
}

/* The emulated backend against the emulating reference, the plain backend as the control; in bf16, or
 * in fp16 (f16). */
static void against_reference(bool f16)
{
    enum { N = 80 };
    const int shapes[] = {4, 0, 2, 3};
    R_f16 = f16;
    printf("  %-12s %-28s %-28s %-28s\n", f16 ? "fp16" : "bf16", "emu backend vs emu reference",
           "fp32 backend vs emu reference", "fp32 backend vs fp32 reference");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const char *name;
        struct tiny_opts o = shape_opts(shapes[si], &name);
        struct cpu_test_fixture fx;
        cpu_test_fixture_open(&fx, &o, "emu");
        const int V = fx.m->cfg.vocab;
        int32_t tok[N];
        random_tokens(tok, N, V);
        struct wts w;
        wts_load(&w, fx.m, true); /* what the emulation computes with */
        double *ref_emu = ref_forward(fx.m, &w, tok, N, true);
        wts_free(&w);
        wts_load(&w, fx.m, false);
        double *ref_f32 = ref_forward(fx.m, &w, tok, N, false);
        wts_free(&w);

        struct be_out emu[N], f32[N];
        struct backend *be = open_cpu(fx.m, (struct be_cfg){.emu = true, .f16 = f16});
        run_prefixes(be, tok, N, emu);
        backend_free(be);
        be = open_cpu(fx.m, (struct be_cfg){0});
        run_prefixes(be, tok, N, f32);
        backend_free(be);
        struct cpu_test_diff de = {0}, dc = {0}, df = {0};
        for (int p = 1; p < N; p++) {
            diff_row(&de, ref_emu + (size_t)p * V, V, &emu[p]);
            diff_row(&dc, ref_emu + (size_t)p * V, V, &f32[p]);
            diff_row(&df, ref_f32 + (size_t)p * V, V, &f32[p]);
        }
        printf("  %-12s max %.4f mean %.5f          max %.4f mean %.5f          max %.6f mean %.7f\n", name,
               de.max, cpu_test_diff_mean(&de), dc.max, cpu_test_diff_mean(&dc), df.max,
               cpu_test_diff_mean(&df));
        /* the fp32 forward is stable: its reference agrees to fp32 precision */
        assert_true(df.max < 1e-3);
        /* the emulation reproduces the rounding: closer to the rounding reference than the plain
         * forward, in the mean and in the worst case; with one layer (no cascade of flipped roundings
         * through later layers) by more than an order of magnitude */
        /* In fp16 the emulation's margin over the plain forward is smaller: a flipped rounding (the
         * two sides' fp32 arithmetic differs by an ulp or so near a tie) is 8x more likely and 8x
         * smaller than in bf16, so the flips' random walk shrinks only as the square root of the step
         * while the rounding itself shrinks 8x; past one layer the two are alike in size (measured:
         * one layer, flips 0.0009 against rounding 0.0035 in the mean; two layers 0.0026 against
         * 0.0036); the emulation stays within 0.02 of its reference. */
        if (f16 && fx.m->cfg.n_layers > 1) {
            assert_true(de.max < 0.02);
        } else {
            assert_true(cpu_test_diff_mean(&de) * (fx.m->cfg.n_layers == 1 ? (f16 ? 2.5 : 20) : 2) <
                        cpu_test_diff_mean(&dc));
            assert_true(de.max < dc.max);
            assert_true(de.max < 0.1);
        }
        /* fp16's 10-bit mantissa: rounding (the plain forward against the rounding reference) several
         * times smaller than bf16's 7-bit one gives on these shapes (0.08-0.26 max); 0.012-0.02, and
         * 0.04 where the checkpoint is fp32 (its weights are rounded too) */
        if (f16)
            assert_true(dc.max < 0.05);
        free(ref_emu);
        free(ref_f32);
        cpu_test_fixture_close(&fx);
    }
    R_f16 = false;
}

static void test_against_reference(void **state)
{
    (void)state;
    against_reference(false);
}

static void test_against_reference_f16(void **state)
{
    (void)state;
    against_reference(true);
}

/* ---- the fixtures of the GPU test: how large bf16 rounding is, and the oracle's own spread */

/* Teacher-forced lockstep of sequences with prompts of lens[] (prefilled in one step) and n_new
 * sampled tokens each (then decoded together), fed be[0]'s tokens; d[k - 1] collects be[k] against
 * be[0]. */
static void lockstep(struct backend **be, int nbe, const int *lens, int ns, int n_new, int V,
                     struct cpu_test_diff *d)
{
    enum { MAXS = 8, MAXT = 300 };
    assert_true(ns <= MAXS);
    int32_t tok[MAXS][MAXT], table[MAXS][MAXT / 16 + 1];
    int nt[MAXS], pos[MAXS];
    struct sampling_params sp = cpu_test_greedy(NTOP);
    sp.logprobs = 5;   /* as the GPU test compares */
    uint64_t seed = 7; /* the prompts of the GPU test's direct/whole */
    for (int i = 0; i < ns; i++) {
        assert_true(lens[i] + n_new <= MAXT);
        cpu_test_random_tokens(&seed, tok[i], lens[i], V);
        nt[i] = lens[i], pos[i] = 0;
        contiguous(table[i], MAXT / 16 + 1, i * (MAXT / 16 + 1));
    }
    for (int step = 0; step < n_new; step++) {
        struct be_seq s[MAXS];
        struct be_out out[4][MAXS];
        for (int i = 0; i < ns; i++)
            s[i] = cpu_test_seq(tok[i], pos[i], nt[i] - pos[i], table[i], MAXT / 16 + 1, &sp);
        for (int k = 0; k < nbe; k++)
            cpu_test_step(be[k], s, ns, out[k]);
        for (int i = 0; i < ns; i++) {
            for (int k = 1; k < nbe; k++)
                diff_out(&d[k - 1], &out[0][i], &out[k][i]);
            pos[i] = nt[i];
            tok[i][nt[i]++] = out[0][i].token;
        }
    }
}

static void test_fixture_sizes(void **state)
{
    (void)state;
    const int lens[] = {1, 7, 16, 33, 100, 250};
    printf("  direct/whole of tests/gpu/test_cuda_backend.c, the same prompts and teacher (72 sampled "
           "positions, "
           "max / mean |dlogprob|):\n");
    for (int si = 0; si < 4; si++) {
        const char *name;
        struct tiny_opts o = shape_opts(si, &name);
        struct cpu_test_fixture fx;
        cpu_test_fixture_open(&fx, &o, "emu");
        struct backend *be[4] = {open_cpu(fx.m, (struct be_cfg){.emu = true}),
                                 open_cpu(fx.m, (struct be_cfg){0}),
                                 open_cpu(fx.m, (struct be_cfg){.emu = true, .jitter = 0x6a177e5}),
                                 open_cpu(fx.m, (struct be_cfg){.jitter = 0x6a177e5})};
        struct cpu_test_diff d[3] = {{0}};
        lockstep(be, 4, lens, 6, 12, fx.m->cfg.vocab, d);
        printf("  %-11s bf16 rounding (emu vs fp32) %.4f / %.4f, oracle spread (emu vs jittered emu) %.4f / "
               "%.4f\n",
               name, d[0].max, cpu_test_diff_mean(&d[0]), d[1].max, cpu_test_diff_mean(&d[1]));
        /* the size the H200 showed between CUDA and the fp32 oracle on these models (0.07-0.23) */
        assert_true(d[0].max > 0.03 && d[0].max < 0.4);
        assert_true(cpu_test_diff_mean(&d[0]) > 0.005 && cpu_test_diff_mean(&d[0]) < 0.06);
        /* the jitter moves the emulated forward, by a rounding-sized amount */
        assert_true(d[1].max > 0 && d[1].max < 0.4);
        /* and the plain fp32 forward ignores it (bitwise: the same differences from emu) */
        assert_true(d[2].max == d[0].max && d[2].sum == d[0].sum && d[2].ids == d[0].ids);
        for (int k = 0; k < 4; k++)
            backend_free(be[k]);
        cpu_test_fixture_close(&fx);
    }
}

/* ---- layouts */

/* Block size, block order, prefill chunking and batching: bitwise, as long as every token is run
 * in the same kind of row (prefill rows: steps of >= 2 tokens; decode rows: 1 token). */
static void test_invariants(void **state)
{
    (void)state;
    enum { N = 150, NB = N / 5 + 1 };
    for (int si = 0; si < 3; si += 2) {
        const char *name;
        struct tiny_opts o = shape_opts(si, &name);
        struct cpu_test_fixture fx;
        cpu_test_fixture_open(&fx, &o, "emu");
        int32_t tok[N], tok2[N], table[NB];
        random_tokens(tok, N, fx.m->cfg.vocab);
        random_tokens(tok2, N, fx.m->cfg.vocab);
        const int whole[] = {110, 1}, chunked[] = {12, 9, 29, 60, 1}, sizes[] = {16, 5, 1};
        struct be_out base[N], o2[N];

        struct backend *be = open_cpu(fx.m, (struct be_cfg){.emu = true});
        contiguous(table, NB, 0);
        run_steps(be, tok, N, whole, 2, table, NB, base);
        /* chunked prefill in other blocks */
        contiguous(table, NB, NB);
        run_steps(be, tok, N, chunked, 5, table, NB, o2);
        for (int p = 109; p < N; p++)
            expect_same(&o2[p], &base[p], "chunked prefill", p);
        backend_free(be);
        /* block sizes, reversed block order */
        for (int b = 0; b < 3; b++) {
            int nb = (N + sizes[b] - 1) / sizes[b];
            int32_t *t = malloc((size_t)nb * sizeof *t);
            for (int i = 0; i < nb; i++)
                t[i] = (nb - 1 - i) * 2;
            be = open_cpu(fx.m, (struct be_cfg){.emu = true, .block_size = sizes[b]});
            run_steps(be, tok, N, chunked, 5, t, nb, o2);
            for (int p = 109; p < N; p++)
                expect_same(&o2[p], &base[p], "block size", p);
            backend_free(be);
            free(t);
        }
        /* batched with another sequence laid out alike (contexts under 512: the decode split does not
         * depend on the batch) */
        be = open_cpu(fx.m, (struct be_cfg){.emu = true});
        int32_t t1[NB], t2[NB];
        for (int i = 0; i < NB; i++)
            t1[i] = 2 * i + 1, t2[i] = 2 * i;
        struct sampling_params sp = cpu_test_greedy(NTOP);
        for (int pos = 0; pos < N;) {
            int c = pos == 0 ? 110 : 1;
            struct be_seq s[2] = {cpu_test_seq(tok2, pos, c, t2, NB, &sp),
                                  cpu_test_seq(tok, pos, c, t1, NB, &sp)};
            struct be_out out[2];
            cpu_test_step(be, s, 2, out);
            pos += c;
            expect_same(&out[1], &base[pos - 1], "batched", pos - 1);
        }
        backend_free(be);
        cpu_test_fixture_close(&fx);
    }
}

/* Decode rows against prefill rows, another decode split (the batch's longest context), and the
 * decode-graph buckets: each changes the roundings exactly where the CUDA backend's change. */
static void test_layouts(void **state)
{
    (void)state;
    enum { N = 60, LONG = 1030, OTHER = 1300, SHORT = 200 };
    const char *name;
    struct tiny_opts o = shape_opts(0, &name);
    struct cpu_test_fixture fx;
    cpu_test_fixture_open(&fx, &o, "emu");
    const int V = fx.m->cfg.vocab;

    /* token by token (decode rows) vs prefixes (prefill rows): close, not equal; fp32: equal */
    int32_t tok[N], table[8];
    random_tokens(tok, N, V);
    contiguous(table, 8, 0);
    const int one[] = {1};
    struct be_out dec[N], pre[N];
    struct cpu_test_diff d = {0};
    for (int emu = 1; emu >= 0; emu--) {
        struct backend *be = open_cpu(fx.m, (struct be_cfg){.emu = emu});
        run_steps(be, tok, N, one, 1, table, 8, dec);
        run_prefixes(be, tok, N, pre);
        backend_free(be);
        int equal = 0;
        for (int p = 1; p < N; p++) {
            if (emu)
                diff_out(&d, &pre[p], &dec[p]);
            equal += cpu_test_same_out(&dec[p], &pre[p]);
        }
        if (emu) {
            printf("  decode rows vs prefill rows: %d of %d positions bitwise equal, max |dlogprob| %.4f "
                   "mean %.5f\n",
                   equal, N - 1, d.max, cpu_test_diff_mean(&d));
            assert_true(equal < N - 1 && d.max < 0.4 && cpu_test_diff_mean(&d) < 0.06);
        } else {
            assert_int_equal(equal, N - 1);
        }
    }

    /* a long sequence decoding past 1024 keys: eagerly and as the decode graph of its buckets, alone
     * and beside a longer and a short one (three sequences: another split). The bf16-cache split
     * (engine/decode_split.h): alone, at most 32 partitions of >= 64 keys, which rounds to the
     * same 64-key partitions for the context and its graph bucket (1024 or 2048), so graph == eager
     * at every context; three sequences: >= 10 partitions eagerly (192 keys at 1300), >= 8 in the
     * graph of 4 rows (256 keys), each unlike the lone sequence's. */
    int32_t *lt = malloc(LONG * sizeof *lt), *ot = malloc(OTHER * sizeof *ot), st[SHORT];
    random_tokens(lt, LONG, V);
    random_tokens(ot, OTHER, V);
    random_tokens(st, SHORT, V);
    const int nb_l = LONG / 16 + 1, nb_o = OTHER / 16 + 1, nb_s = SHORT / 16 + 1;
    int32_t lt_tab[LONG / 16 + 1], ot_tab[OTHER / 16 + 1], st_tab[SHORT / 16 + 1];
    contiguous(lt_tab, nb_l, 0);
    contiguous(ot_tab, nb_o, nb_l);
    contiguous(st_tab, nb_s, nb_l + nb_o);
    struct backend *be[4] = {open_cpu(fx.m, (struct be_cfg){.emu = true}),
                             open_cpu(fx.m, (struct be_cfg){.emu = true}),
                             open_cpu(fx.m, (struct be_cfg){.emu = true, .graphs = true}),
                             open_cpu(fx.m, (struct be_cfg){.emu = true, .graphs = true})};
    struct sampling_params sp = cpu_test_greedy(NTOP);
    struct be_out out[4][3];
    int same_graph = 0, same_beside = 0, same_beside_graph = 0, n_cmp = 0;
    struct cpu_test_diff dg = {0}, db = {0}, dbg = {0};
    for (int pos = 0; pos < LONG;) {
        int c = pos == 0 ? 1000 : 1;
        struct be_seq alone = cpu_test_seq(lt, pos, c, lt_tab, nb_l, &sp);
        cpu_test_step(be[0], &alone, 1, out[0]);
        cpu_test_step(be[2], &alone, 1, out[2]);
        /* beside: the other two prefill with the first chunk, then decode next to it */
        struct be_seq three[3] = {alone, cpu_test_seq(ot, 0, OTHER - 1, ot_tab, nb_o, &sp),
                                  cpu_test_seq(st, 0, SHORT - 1, st_tab, nb_s, &sp)};
        if (pos > 0) {
            three[1] = cpu_test_seq(ot, OTHER - 1, 1, ot_tab, nb_o, &sp);
            three[2] = cpu_test_seq(st, SHORT - 1, 1, st_tab, nb_s, &sp);
        }
        cpu_test_step(be[1], three, 3, out[1]);
        cpu_test_step(be[3], three, 3, out[3]);
        pos += c;
        if (pos == 1000)
            continue;
        n_cmp++;
        same_graph += cpu_test_same_out(&out[0][0], &out[2][0]), diff_out(&dg, &out[0][0], &out[2][0]);
        same_beside += cpu_test_same_out(&out[0][0], &out[1][0]), diff_out(&db, &out[0][0], &out[1][0]);
        same_beside_graph += cpu_test_same_out(&out[1][0], &out[3][0]),
            diff_out(&dbg, &out[1][0], &out[3][0]);
    }
    printf(
        "  decode past 1000 keys: graph == eager alone at %d of %d contexts (max |dlogprob| %.4f); beside a "
        "%d- and a %d-token sequence == alone at %d (max %.4f); beside, graph == eager at %d (max %.4f)\n",
        same_graph, n_cmp, dg.max, OTHER, SHORT, same_beside, db.max, same_beside_graph, dbg.max);
    assert_int_equal(same_graph, n_cmp);
    assert_true(same_beside < n_cmp && db.max < 0.4);
    assert_true(same_beside_graph < n_cmp && dbg.max < 0.4);
    for (int k = 0; k < 4; k++)
        backend_free(be[k]);
    free(lt);
    free(ot);
    cpu_test_fixture_close(&fx);
}

/* ---- weights */

static void *round_view(struct tensor_view *v, void **keep, int *nk)
{
    if (!v->data)
        return NULL;
    int64_t n = tensor_numel(v);
    float *f = cpu_test_f32(v);
    for (int64_t i = 0; i < n; i++)
        f[i] = bf16_to_f32(f32_to_bf16(f[i]));
    v->dtype = DT_F32;
    v->data = f;
    v->scale_inv = NULL;
    keep[(*nk)++] = f;
    return f;
}

/* An fp32 checkpoint and its bf16 rounding (given as fp32): the same to the emulation, not to fp32. */
static void test_weights_rounded_once(void **state)
{
    (void)state;
    const char *name;
    struct tiny_opts o = shape_opts(3, &name); /* float32 */
    struct cpu_test_fixture fx;
    cpu_test_fixture_open(&fx, &o, "emu");
    struct model r = *fx.m;
    struct layer_weights lw[4];
    void *keep[64];
    int nk = 0;
    assert_true(r.cfg.n_layers <= 4);
    memcpy(lw, fx.m->layers, (size_t)r.cfg.n_layers * sizeof *lw);
    r.layers = lw;
    round_view(&r.embed, keep, &nk);
    if (r.cfg.tie_embeddings)
        r.lm_head = r.embed;
    else
        round_view(&r.lm_head, keep, &nk);
    round_view(&r.final_norm, keep, &nk);
    for (int l = 0; l < r.cfg.n_layers; l++) {
        struct tensor_view *v[] = {&lw[l].attn_norm, &lw[l].wq,     &lw[l].wk,     &lw[l].wv,     &lw[l].bq,
                                   &lw[l].bk,        &lw[l].bv,     &lw[l].q_norm, &lw[l].k_norm, &lw[l].wo,
                                   &lw[l].mlp_norm,  &lw[l].w_gate, &lw[l].w_up,   &lw[l].w_down};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            round_view(v[i], keep, &nk);
    }
    enum { N = 40 };
    int32_t tok[N], table[4];
    random_tokens(tok, N, r.cfg.vocab);
    contiguous(table, 4, 0);
    const int sizes[] = {20, 1};
    for (int emu = 1; emu >= 0; emu--) {
        struct be_out a[N], b[N];
        struct backend *be = open_cpu(fx.m, (struct be_cfg){.emu = emu});
        run_steps(be, tok, N, sizes, 2, table, 4, a);
        backend_free(be);
        be = open_cpu(&r, (struct be_cfg){.emu = emu});
        run_steps(be, tok, N, sizes, 2, table, 4, b);
        backend_free(be);
        int equal = 0;
        for (int p = 19; p < N; p++)
            equal += cpu_test_same_out(&a[p], &b[p]);
        if (emu)
            assert_int_equal(equal, N - 19);
        else
            assert_true(equal < N - 19);
    }
    for (int i = 0; i < nk; i++)
        free(keep[i]);
    cpu_test_fixture_close(&fx);
}

int main(void)
{
    log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference), cmocka_unit_test(test_against_reference_f16),
        cmocka_unit_test(test_fixture_sizes),     cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_layouts),           cmocka_unit_test(test_weights_rounded_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
