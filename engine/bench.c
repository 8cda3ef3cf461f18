/* Workloads, the roofline model and the measuring backend wrapper of `llmq bench` (see bench.h). */
#include "engine/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct bench_workload WORKLOADS[] = {
    {"chat", 1000, 512, 128},   {"decode", 512, 128, 1024}, {"summarize", 200, 4096, 256},
    {"longdoc", 8, 65536, 256}, {"single", 1, 128, 512},    {"mapreduce", 50, 8192, 256},
};

const struct bench_workload *bench_workload_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof WORKLOADS / sizeof WORKLOADS[0]; i++)
        if (!strcmp(name, WORKLOADS[i].name))
            return &WORKLOADS[i];
    return NULL;
}

const char *bench_workload_names(void)
{
    return "chat, decode, summarize, longdoc, single, mapreduce";
}

void bench_roofline_step(struct bench_roofline *r, const struct model_config *c, const struct be_seq *seqs,
                         int n)
{
    const double C = c->hidden, F = c->intermediate, L = c->n_layers, D = c->head_dim, V = c->vocab;
    const double H = c->n_heads, KVH = c->n_kv_heads, HD = H * D, KVD = KVH * D, QKV = HD + 2 * KVD;
    /* matrix weights of the layers: attention, then dense MLPs; a MoE layer's router and experts below */
    const double moe_l = model_moe_layers(c), E = c->n_experts, K = c->n_experts_active,
                 FE = c->moe_intermediate;
    const double lin = L * (QKV * C + HD * C) + (L - moe_l) * 3 * F * C + moe_l * E * C; /* every token's */
    const double small = 2 * C + (c->qk_norm ? 2 * D : 0) + (c->qkv_bias ? QKV : 0);     /* norms, biases */
    double T = 0, samp = 0, kv_read = 0, attn = 0;
    for (int i = 0; i < n; i++) {
        double pos = seqs[i].pos, q = seqs[i].n_new;
        T += q;
        samp += seqs[i].sample;
        kv_read += pos + q;
        attn += q * pos + q * (q + 1) / 2; /* query-key pairs under the causal mask */
    }
    if (T == 0)
        return;
    /* a MoE layer reads the experts the step's tokens selected: with routing taken as uniform, the
       expected number of distinct experts among T tokens' K picks is E (1 - (1 - K/E)^T) */
    const double experts_read = E > 0 ? moe_l * E * (1 - pow(1 - K / E, T)) * 3 * FE * C : 0,
                 experts_run = moe_l * K * 3 * FE * C;
    const double wb = r->fp8_weights ? 1 : 2;                       /* bytes per linear weight */
    const double kvb = r->fp8_kv ? 2 * KVH * (D + 4) : 2 * 2 * KVD; /* K and V bytes per token and layer */
    const double lmb = r->fp8_lm_head ? 1 : 2;                      /* bytes per lm_head weight */
    double bytes = wb * (lin + experts_read) + L * 2 * small + 2 * C + (samp > 0 ? lmb * V * C : 0) +
                   2 * C * T           /* embedding rows */
                   + L * kvb * kv_read /* K and V read */
                   + L * kvb * T;      /* K and V written */
    double lin_flops = 2 * (lin + experts_run) * T, lm_flops = 2 * V * C * samp,
           attn_flops = 4 * L * HD * attn, flops = lin_flops + lm_flops + attn_flops;
    double tb = bytes / BENCH_COPY_BPS,
           tf = lin_flops / (r->fp8_weights ? BENCH_FP8_FLOPS : BENCH_BF16_FLOPS) +
                lm_flops / (r->fp8_lm_head ? BENCH_FP8_FLOPS : BENCH_BF16_FLOPS) +
                (flops - lin_flops - lm_flops) / BENCH_BF16_FLOPS;
    r->steps++;
    r->tokens += (uint64_t)T;
    r->sampled += (uint64_t)samp;
    r->bytes += bytes;
    r->flops += flops;
    r->ideal_s += tb > tf ? tb : tf;
    const double ab = L * kvb * kv_read / BENCH_COPY_BPS, af = attn_flops / BENCH_BF16_FLOPS;
    r->attn_ideal_s += ab > af ? ab : af;
    r->compute_bound_steps += tf > tb;
}

/* ---- the wrapper */

struct wrap {
    struct backend base; /* first */
    struct backend *inner;
    struct model_config cfg;
    struct bench_roofline *r;
};

static int wrap_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    struct wrap *w = (struct wrap *)be;
    bench_roofline_step(w->r, &w->cfg, seqs, n);
    w->inner->fill_masks = be->fill_masks;
    w->inner->fill_masks_ctx = be->fill_masks_ctx;
    int rc = backend_step(w->inner, seqs, n, out);
    memcpy(be->err, w->inner->err, sizeof be->err);
    return rc;
}

static void wrap_free(struct backend *be)
{
    struct wrap *w = (struct wrap *)be;
    if (!w)
        return;
    backend_free(w->inner);
    free(w);
}

static const struct backend_ops wrap_ops_cpu = {"cpu", wrap_step, wrap_free};
static const struct backend_ops wrap_ops_cuda = {"cuda", wrap_step, wrap_free};
static const struct backend_ops wrap_ops_other = {"bench", wrap_step, wrap_free};

struct backend *bench_wrap_backend(struct backend *inner, const struct model_config *c,
                                   struct bench_roofline *r)
{
    struct wrap *w = calloc(1, sizeof *w);
    if (!w) {
        backend_free(inner);
        return NULL;
    }
    const char *name = backend_name(inner);
    /* the wrapper answers to the inner backend's name (the engine logs it) */
    w->base.ops = !strcmp(name, "cpu")    ? &wrap_ops_cpu
                  : !strcmp(name, "cuda") ? &wrap_ops_cuda
                                          : &wrap_ops_other;
    w->base.num_blocks = inner->num_blocks;
    w->base.block_size = inner->block_size;
    w->inner = inner;
    w->cfg = *c;
    w->r = r;
    return &w->base;
}

struct backend *bench_inner_backend(struct backend *be)
{
    if (be && be->ops->step == wrap_step)
        return ((struct wrap *)be)->inner;
    return be;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    double k = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)floor(k), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (k - (double)lo);
}
