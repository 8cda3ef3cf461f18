/* The fp32 CPU reference backend: the oracle every faster path is tested against.
 *
 * Weights are converted to fp32 at open (tensor_to_f32) into one allocation: q/k/v fused into
 * one (H+2KVH)·D × C matrix and gate/up into one 2F × C matrix (per expert 2FE × C in a MoE layer, the
 * router E × C beside them: moe_mlp runs only the experts the step's rows selected). One step runs every new
 * token of every sequence as one [T, ·] activation matrix; attention reads the paged KV pool through each
 * sequence's block table; logits are computed only for the last token of sequences that sample.
 *
 * KV pool layout (fp32), one allocation of num_blocks blocks:
 *     kv[layer][K|V][block][kv_head][slot][d]    (L, 2, num_blocks, KVH, block_size, D)
 * so position p of a sequence lives in block block_table[p / block_size], slot p % block_size,
 * and one block of one KV head is block_size·D contiguous floats.
 * With kv_dtype DT_F8_E4M3 the pool holds e4m3 codes in the same layout (kv_codes) and one fp32
 * scale per (layer, K|V, block, kv head, slot) (kv_scales), quantized as the CUDA backend's
 * k_qk_norm_rope_kv_fp8 does it (fp8_kv_quantize, engine/fp8.h: amax / 448 per token and head, round to
 * nearest even, saturating) and decoded on read: the oracle of the CUDA fp8 KV path (docs/CUDA_BACKEND.md,
 * "FP8 KV cache"). Any other kv_dtype keeps fp32.
 *
 * Every per-token computation (GEMM rows, norms, RoPE, attention over positions in order) is done
 * the same way whatever else is in the batch, so a sequence's logits do not depend on batching,
 * chunking, block size or which blocks it was given. Threads: OpenMP over GEMM output columns,
 * over rows, and over (token, head) pairs in attention.
 *
 * CUDA emulation (backend_opts.emulate_cuda, for testing the CUDA backend): the same forward, with a
 * rounding to bf16 (nearest even) wherever kernels/cuda_backend.cu stores bf16 — every weight at open;
 * the normed sublayer inputs (input, post-attention and final norm); the QKV GEMM output (before the
 * bias); q after norm and RoPE, k and v as the bf16 KV cache holds them (with an fp8 pool: k and v are
 * quantized from fp32, as on the GPU, and scores are formed as (q · codes) · k_scale); the attention
 * probabilities (times v_scale with an fp8 pool) as the tensor-core P·V product takes them (attention_emu);
 * the attention output; the o_proj, gate/up, SiLU·up and down outputs. The residual stream and the logits
 * stay fp32, as on the GPU. Attention then depends on how a step is laid out (decode rows vs prefill rows,
 * the decode split), as it does on the GPU, so the batching invariance above holds only between steps laid
 * out alike. In fp16 mode (weight_dtype BE_WEIGHTS_F16) every one of these roundings is to fp16 instead.
 * Off (the default), none of this code runs and the fp32 forward is bit for bit what it was.
 *
 * fp8 weights (backend_opts.weight_dtype, engine/fp8.h): a linear weight that the CUDA backend runs in
 * fp8 holds here exactly the values the GPU multiplies with — an F8_E4M3 checkpoint tensor
 * dequantized, or a bf16/fp32 one rounded to bf16, quantized in 128x128 blocks and dequantized — and
 * is not rounded to bf16 under emulation. The GPU's 1x128 quantization of GEMM inputs is not
 * emulated (its small-batch GEMV path does not quantize them). */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/decode_split.h"
#include "engine/fp8.h"
#include "engine/model.h"
#include "engine/moe.h"
#include "engine/sampler.h"
#include "engine/util/log.h"

#define KV_DEFAULT_CAP_BYTES ((int64_t)512 << 20) /* default KV pool cap when kv_cache_bytes is 0 */
#define LOGIT_CHUNK 16                            /* sequences whose logits are computed at once */
#define GEMM_NB 16                                /* weight rows per GEMM work item */

/* bf16 emulation: the CUDA kernels' constants (kernels/attention.cuh; the decode split and graph
 * buckets are shared: engine/decode_split.h) */
#define EMU_KV_TILE 64 /* keys per K/V tile of both attention kernels */
#define EMU_DC_WARPS 4 /* k_attention_decode: warps per CTA, 16 keys of each tile per warp */

struct cpu_layer {
    const float *attn_norm;       /* (C) */
    const float *wqkv;            /* (QKV, C): wq rows, then wk, then wv */
    const float *bqkv;            /* (QKV), or NULL without qkv_bias */
    const float *q_norm, *k_norm; /* (D), or NULL without qk_norm */
    const float *wo;              /* (C, H*D) */
    const float *mlp_norm;        /* (C) */
    const float *wgu;             /* (2F, C): gate rows, then up rows — dense layers */
    const float *wdown;           /* (C, F) */
    const float *router;          /* (E, C) — MoE layers; NULL in a dense layer */
    const float *ewgu;            /* (E, 2FE, C): each expert's gate rows, then its up rows */
    const float *edown;           /* (E, C, FE) */
};

struct cpu_backend {
    struct backend base; /* first, so a struct backend * is a struct cpu_backend * */
    struct model_config cfg;
    int nthreads;
    int C, F, L, H, KVH, D, V;
    int QKV, HD, KVD; /* (H + 2 KVH) D, H D, KVH D */
    float eps;
    int E, K, FE;   /* experts, experts per token, expert MLP size; E == 0 without MoE layers */
    bool norm_topk; /* norm_topk_prob */

    float *weights;           /* the one allocation behind every pointer below */
    const float *embed;       /* (V, C) */
    const float *lm_head;     /* (V, C); == embed when tied */
    const float *final_norm;  /* (C) */
    struct cpu_layer *layers; /* [L] */
    float *inv_freq;          /* (D/2) */
    float attn_scale;         /* RoPE cos/sin factor (yarn) */

    /* CUDA emulation (emulate_cuda); everything here is unused when emu is false */
    bool emu;
    bool emu_f16;        /* the 16-bit type is fp16 (weight_dtype BE_WEIGHTS_F16), not bf16 */
    uint64_t emu_jitter; /* emulate_cuda_jitter */
    bool emu_graphs;     /* pure decode steps are laid out as the CUDA backend's decode graphs */
    int emu_graph_max;   /* the largest graph batch and max_model_len as the CUDA backend takes them */
    int emu_max_len;
    size_t n_weights; /* floats in weights */
    float *mrun;      /* [nthreads, cap_ctx] the running max each key's probability was rounded against */
    float *vgrp;      /* fp8 pool: [nthreads, cap_ctx] each key's v scale, then its 16-key group's largest */

    float *kv;      /* the pool, layout above; NULL with an fp8 pool */
    size_t kv_slab; /* elements of one (block, kv head): block_size * D */
    size_t kv_part; /* elements of K (or V) of one layer: num_blocks * KVH * kv_slab */
    /* fp8 pool (kv_dtype DT_F8_E4M3) */
    bool kv8;
    uint8_t *kv_codes; /* (L, 2, num_blocks, KVH, block_size, D) e4m3 */
    float *kv_scales;  /* (L, 2, num_blocks, KVH, block_size): element value = e4m3(code) * scale */
    float *kv_buf;     /* [nthreads][2][kv_slab]: one block's codes decoded for attention */
    float *kv_stg;     /* emulate_cuda with an fp8 pool: every slot as k_kv_stage_fp8 stages
                          it (kv_codes' layout), written with its codes: a prefill row reads these instead
                          of staging each block again for every (row, head), as the GPU stages once a step */
    float e4m3_lut[256];

    /* step scratch, grown on demand */
    int cap_rows, cap_ctx;
    float *x, *h, *qkv, *att, *tmp, *gu,
        *act;               /* [T, C], [T, C], [T, QKV], [T, HD], [T, C], [T, 2F], [T, F] */
    float *rcos, *rsin;     /* [T, D/2] */
    int *row_seq, *row_pos; /* [T] */
    float *scores;          /* [nthreads, cap_ctx] */
    float *hfin, *logits;   /* [LOGIT_CHUNK, C], [LOGIT_CHUNK, V] */
    int *pick;              /* [LOGIT_CHUNK] sequence index per logits row */
    char (*perr)[256];      /* [LOGIT_CHUNK] sampler errors */
    struct samp_ctx **samp; /* [nthreads] */
    /* MoE scratch (E > 0), grown with cap_rows: rows grouped by expert, TK = T * K */
    float *mlog, *mw;  /* [T, E] router logits, [T, K] routing weights */
    int *msel, *mslot; /* [T, K] selected experts, and where each (row, k) sits in the grouped rows */
    float *mx, *mgu;   /* [TK, C] grouped inputs, [TK, 2FE] their gate/up outputs */
    float *mact, *my;  /* [TK, FE] SiLU(gate) * up, [TK, C] the experts' outputs */
    int *moff;         /* [E + 1] first grouped row of each expert (moff[E] = TK) */
    int *mitem;        /* [E * max(ceil(2FE / GEMM_NB), ceil(C / GEMM_NB))] GEMM work items */
};

/* ---- math */

/* sum a[k] b[k] in a fixed order: 8 lanes over k, combined pairwise, then the tail */
static inline float dot(const float *a, const float *b, int K)
{
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[k + j] * b[k + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; k < K; k++)
        s += a[k] * b[k];
    return s;
}

/* dot(x_r, w) for four rows sharing the loads of w; bitwise equal to four dot() calls */
static inline void dot4(const float *w, const float *x0, const float *x1, const float *x2, const float *x3,
                        int K, float out[4])
{
    float a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0};
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) {
            float wv = w[k + j];
            a0[j] += x0[k + j] * wv;
            a1[j] += x1[k + j] * wv;
            a2[j] += x2[k + j] * wv;
            a3[j] += x3[k + j] * wv;
        }
    const float *xs[4] = {x0, x1, x2, x3};
    float *as[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; r++) {
        const float *a = as[r];
        float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (int kk = k; kk < K; kk++)
            s += xs[r][kk] * w[kk];
        out[r] = s;
    }
}

/* Columns [n0, n1) of y[M, N] = x[M, K] · w[N, K]^T: one GEMM work item. Each y element is dot() of its
 * row and column whatever M is (dot4 is bitwise dot). */
static void matmul_block(float *y, const float *x, const float *w, int M, int N, int K, int n0, int n1)
{
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        const float *x0 = x + (size_t)m * K;
        for (int n = n0; n < n1; n++) {
            float o[4];
            dot4(w + (size_t)n * K, x0, x0 + K, x0 + 2 * (size_t)K, x0 + 3 * (size_t)K, K, o);
            for (int r = 0; r < 4; r++)
                y[(size_t)(m + r) * N + n] = o[r];
        }
    }
    for (; m < M; m++)
        for (int n = n0; n < n1; n++)
            y[(size_t)m * N + n] = dot(x + (size_t)m * K, w + (size_t)n * K, K);
}

/* y[M, N] = x[M, K] · w[N, K]^T. Work items are blocks of GEMM_NB rows of w (kept in cache while
 * every row of x passes over them); the K loop is innermost over contiguous memory. */
static void matmul(float *y, const float *x, const float *w, int M, int N, int K, int nt)
{
    int nblk = (N + GEMM_NB - 1) / GEMM_NB;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int b = 0; b < nblk; b++) {
        int n0 = b * GEMM_NB, n1 = n0 + GEMM_NB < N ? n0 + GEMM_NB : N;
        matmul_block(y, x, w, M, N, K, n0, n1);
    }
}

/* HF RMSNorm in fp32: w * (x * rsqrt(mean(x^2) + eps)); the mean is accumulated in double */
static inline void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float var = (float)(ss / n);
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * r);
}

/* NeoX RoPE on one head: v[i], v[i + D/2] rotated by angle i (HF rotate_half) */
static inline void rope(float *v, const float *c, const float *s, int half)
{
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
    }
}

/* ---- bf16 emulation */

/* x rounded to bf16 and back: nearest, ties to even (f32_to_bf16, __float2bfloat16_rn); NaN kept */
static inline float bf16r(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x moved by -4 .. +4 ulps, a hash of its bits and seed (emulate_cuda_jitter); zeros, infinities
 * and NaNs are kept, and a step never leaves the finite numbers of x's sign */
static inline float jitter(float x, uint64_t seed)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) == 0 || (u & 0x7f800000u) == 0x7f800000u)
        return x;
    uint64_t h = (seed ^ u) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    uint32_t v = u + (uint32_t)(h % 9) - 4u;
    if ((v & 0x7f800000u) == 0x7f800000u || (v ^ u) >> 31)
        return x;
    memcpy(&x, &v, sizeof x);
    return x;
}

/* x rounded to fp16 and back: nearest, ties to even, subnormals kept, overflow to infinity (f32_to_f16,
 * __float2half_rn) */
static inline float f16r(float x)
{
    return f16_to_f32(f32_to_f16(x));
}

/* An activation as the CUDA backend stores it: rounded to its 16-bit type, bf16 or fp16 (after the
 * jitter, when asked). */
static inline float emu_round(const struct cpu_backend *b, float x)
{
    const float y = b->emu_jitter ? jitter(x, b->emu_jitter) : x;
    return b->emu_f16 ? f16r(y) : bf16r(y);
}

/* The same, rounded to f16 (the fp8 pool's decode probabilities, k_attention_decode_fp8). */
static inline float emu_round_f16(const struct cpu_backend *b, float x)
{
    return f16_to_f32(f32_to_f16(b->emu_jitter ? jitter(x, b->emu_jitter) : x));
}

/* emu_round over n values in place */
static void emu_round_n(const struct cpu_backend *b, float *x, size_t n, int nt)
{
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++)
        x[i] = emu_round(b, x[i]);
}

/* ---- open */

/* How load_weight_as places a tensor: as its fp32 values, rounded to bf16 or fp16 (emulate_cuda: the
 * CUDA backend's 16-bit weights), or as the fp8 values the CUDA backend computes with (engine/fp8.h:
 * dequantized from the checkpoint, or quantized and dequantized; never rounded to bf16 after). */
enum lw_mode { LW_PLAIN, LW_BF16, LW_F16, LW_FP8 };

/* Converts one weight into dst after checking its shape (d1 == 0: a vector of d0). */
static int load_weight(const struct tensor_view *t, const char *what, int layer, int64_t d0, int64_t d1,
                       float *dst, enum lw_mode mode, char *err, size_t errlen)
{
    char name[128];
    if (t->name)
        snprintf(name, sizeof name, "%s", t->name);
    else if (layer >= 0)
        snprintf(name, sizeof name, "layer %d %s", layer, what);
    else
        snprintf(name, sizeof name, "%s", what);
    if (!t->data) {
        snprintf(err, errlen, "%s: missing", name);
        return -1;
    }
    if (tensor_view_check_shape(t, name, d0, d1, err, errlen))
        return -1;
    char e2[256];
    if (fp8_linear_values(t, mode == LW_FP8, dst, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "%s: %s", name, e2);
        return -1;
    }
    if (mode == LW_BF16 || mode == LW_F16) {
        const size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
        for (size_t i = 0; i < n; i++)
            dst[i] = mode == LW_F16 ? f16r(dst[i]) : bf16r(dst[i]);
    }
    return 0;
}

static void cpu_free(struct backend *be);
static int cpu_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out);
static const struct backend_ops cpu_ops = {"cpu", cpu_step, cpu_free};

/* How a weight that is not fp8 is placed: as the CUDA backend holds it when emulating it. */
static enum lw_mode emu_mode(const struct backend_opts *o)
{
    return !o->emulate_cuda ? LW_PLAIN : o->weight_dtype == BE_WEIGHTS_F16 ? LW_F16 : LW_BF16;
}

/* The mode of one (fused) linear weight: fp8 where engine/fp8.h says the CUDA backend runs it in fp8. */
static enum lw_mode linear_mode(const struct backend_opts *o, const struct tensor_view *const *parts, int n,
                                enum lw_mode plain, int *n_fp8, bool quiet)
{
    char why[256];
    if (!fp8_linear_use(o->weight_dtype, parts, n, why, sizeof why)) {
        if (why[0] && !quiet) /* quiet: said for the first expert already */
            log_info("cpu backend: %s", why);
        return plain;
    }
    (*n_fp8)++;
    return LW_FP8;
}

/* The output projection's mode: fp8 where it is on the GPU (backend_opts.lm_head_dtype). */
static enum lw_mode lm_head_mode(const struct backend_opts *o, const struct tensor_view *src)
{
    const enum lw_mode plain = emu_mode(o);
    const struct tensor_view *parts[1] = {src};
    char why[256];
    /* fp16 mode has no fp8 output projection (the CUDA backend refuses lm_head_dtype fp8 there) */
    const enum be_weights want = o->weight_dtype == BE_WEIGHTS_F16 ? BE_WEIGHTS_F16 : o->lm_head_dtype;
    if (!fp8_linear_use(want, parts, 1, why, sizeof why)) {
        if (why[0])
            log_info("cpu backend: lm_head: %s", why);
        return plain;
    }
    return LW_FP8;
}

static int load_weights(struct cpu_backend *b, const struct model *m, const struct backend_opts *o, char *err,
                        size_t errlen)
{
    const enum lw_mode plain = emu_mode(o);
    int n_fp8 = 0, n_lin = 0;
    const struct model_config *c = &b->cfg;
    const int64_t C = b->C, F = b->F, D = b->D, V = b->V, QKV = b->QKV, HD = b->HD, KVD = b->KVD;
    const int64_t E = b->E, FE = b->FE;
    const size_t attn =
                     (size_t)(C + QKV * C + (c->qkv_bias ? QKV : 0) + (c->qk_norm ? 2 * D : 0) + C * HD + C),
                 dense = (size_t)(2 * F * C + C * F), moe = (size_t)(E * C + E * (2 * FE * C + C * FE));
    size_t layers = 0;
    for (int l = 0; l < b->L; l++)
        layers += attn + (model_layer_moe(c, l) ? moe : dense);
    /* the output projection in fp8 (model.lm_head_dtype; the GPU's values) needs its own copy when tied */
    const struct tensor_view *lm_src = c->tie_embeddings ? &m->embed : &m->lm_head;
    const enum lw_mode ml = lm_head_mode(o, lm_src);
    const bool lm_own = !c->tie_embeddings || ml == LW_FP8;
    size_t total = (size_t)(V * C) * (lm_own ? 2 : 1) + (size_t)C + layers;
    b->weights = malloc(total * sizeof(float));
    b->n_weights = total;
    b->layers = calloc((size_t)b->L, sizeof *b->layers);
    if (!b->weights || !b->layers) {
        snprintf(err, errlen, "out of memory for %.1f MiB of fp32 weights", (double)total * 4 / (1 << 20));
        return -1;
    }
    float *p = b->weights;
#define TAKE(dst, n)                                                                                         \
    do {                                                                                                     \
        (dst) = p;                                                                                           \
        p += (n);                                                                                            \
    } while (0)
    float *w;
    TAKE(w, V * C);
    if (load_weight(&m->embed, "embed_tokens", -1, V, C, w, plain, err, errlen))
        return -1;
    b->embed = w;
    if (!lm_own) {
        b->lm_head = b->embed;
    } else {
        TAKE(w, V * C);
        if (load_weight(lm_src, c->tie_embeddings ? "embed_tokens" : "lm_head", -1, V, C, w, ml, err, errlen))
            return -1;
        b->lm_head = w;
    }
    TAKE(w, C);
    if (load_weight(&m->final_norm, "norm", -1, C, 0, w, plain, err, errlen))
        return -1;
    b->final_norm = w;

    bool experts_said = false;
    for (int l = 0; l < b->L; l++) {
        const struct layer_weights *lw = &m->layers[l];
        struct cpu_layer *cl = &b->layers[l];
        const struct tensor_view *pq[3] = {&lw->wq, &lw->wk, &lw->wv}, *po[1] = {&lw->wo};
        const enum lw_mode mq = linear_mode(o, pq, 3, plain, &n_fp8, false),
                           mo = linear_mode(o, po, 1, plain, &n_fp8, false);
        n_lin += 2;
        TAKE(w, C);
        if (load_weight(&lw->attn_norm, "input_layernorm", l, C, 0, w, plain, err, errlen))
            return -1;
        cl->attn_norm = w;
        TAKE(w, QKV * C);
        if (load_weight(&lw->wq, "q_proj", l, HD, C, w, mq, err, errlen) ||
            load_weight(&lw->wk, "k_proj", l, KVD, C, w + HD * C, mq, err, errlen) ||
            load_weight(&lw->wv, "v_proj", l, KVD, C, w + (HD + KVD) * C, mq, err, errlen))
            return -1;
        cl->wqkv = w;
        if (c->qkv_bias) {
            TAKE(w, QKV);
            if (load_weight(&lw->bq, "q_proj.bias", l, HD, 0, w, plain, err, errlen) ||
                load_weight(&lw->bk, "k_proj.bias", l, KVD, 0, w + HD, plain, err, errlen) ||
                load_weight(&lw->bv, "v_proj.bias", l, KVD, 0, w + HD + KVD, plain, err, errlen))
                return -1;
            cl->bqkv = w;
        }
        if (c->qk_norm) {
            TAKE(w, 2 * D);
            if (load_weight(&lw->q_norm, "q_norm", l, D, 0, w, plain, err, errlen) ||
                load_weight(&lw->k_norm, "k_norm", l, D, 0, w + D, plain, err, errlen))
                return -1;
            cl->q_norm = w;
            cl->k_norm = w + D;
        }
        TAKE(w, C * HD);
        if (load_weight(&lw->wo, "o_proj", l, C, HD, w, mo, err, errlen))
            return -1;
        cl->wo = w;
        TAKE(w, C);
        if (load_weight(&lw->mlp_norm, "post_attention_layernorm", l, C, 0, w, plain, err, errlen))
            return -1;
        cl->mlp_norm = w;
        if (model_layer_moe(c, l)) {
            if (!lw->experts) {
                snprintf(err, errlen, "layer %d: a mixture-of-experts layer without its experts", l);
                return -1;
            }
            TAKE(w, E * C); /* the router: logits in fp32, never fp8 */
            if (load_weight(&lw->router, "mlp.gate", l, E, C, w, plain, err, errlen))
                return -1;
            cl->router = w;
            TAKE(w, E * 2 * FE * C);
            cl->ewgu = w;
            TAKE(w, E * C * FE);
            cl->edown = w;
            for (int e = 0; e < E; e++) {
                const struct expert_weights *x = &lw->experts[e];
                const struct tensor_view *pg[2] = {&x->w_gate, &x->w_up}, *pd[1] = {&x->w_down};
                const enum lw_mode mg = linear_mode(o, pg, 2, plain, &n_fp8, experts_said),
                                   md = linear_mode(o, pd, 1, plain, &n_fp8, experts_said);
                experts_said = true; /* why an expert is not fp8: said once, not E x layers times */
                float *gu = (float *)cl->ewgu + (size_t)e * 2 * FE * C,
                      *dn = (float *)cl->edown + (size_t)e * C * FE;
                if (load_weight(&x->w_gate, "expert gate_proj", l, FE, C, gu, mg, err, errlen) ||
                    load_weight(&x->w_up, "expert up_proj", l, FE, C, gu + FE * C, mg, err, errlen) ||
                    load_weight(&x->w_down, "expert down_proj", l, C, FE, dn, md, err, errlen))
                    return -1;
                n_lin += 2;
            }
            continue;
        }
        const struct tensor_view *pg[2] = {&lw->w_gate, &lw->w_up}, *pd[1] = {&lw->w_down};
        const enum lw_mode mg = linear_mode(o, pg, 2, plain, &n_fp8, false),
                           md = linear_mode(o, pd, 1, plain, &n_fp8, false);
        n_lin += 2;
        TAKE(w, 2 * F * C);
        if (load_weight(&lw->w_gate, "gate_proj", l, F, C, w, mg, err, errlen) ||
            load_weight(&lw->w_up, "up_proj", l, F, C, w + F * C, mg, err, errlen))
            return -1;
        cl->wgu = w;
        TAKE(w, C * F);
        if (load_weight(&lw->w_down, "down_proj", l, C, F, w, md, err, errlen))
            return -1;
        cl->wdown = w;
    }
#undef TAKE
    if (n_fp8 || ml == LW_FP8)
        log_info("cpu backend: %d of %d linear weight matrices%s hold fp8 (e4m3, %dx%d blocks) values", n_fp8,
                 n_lin, ml == LW_FP8 ? " and lm_head" : "", FP8_BLOCK, FP8_BLOCK);
    return 0;
}

static int size_kv(struct cpu_backend *b, const struct backend_opts *o, char *err, size_t errlen)
{
    const int bs = o->block_size;
    if (bs <= 0) {
        snprintf(err, errlen, "block_size %d: must be positive", bs);
        return -1;
    }
    int max_len = o->max_model_len > 0 ? o->max_model_len : b->cfg.max_position;
    if (max_len <= 0) {
        snprintf(err, errlen, "max_model_len is not set and the model has no max_position_embeddings");
        return -1;
    }
    b->kv8 = o->kv_dtype == DT_F8_E4M3;
    /* K and V of KVH heads x block_size tokens over all layers: D floats each, or D e4m3 codes + a scale */
    int64_t tok_bytes =
        b->kv8 ? (int64_t)b->D + (int64_t)sizeof(float) : (int64_t)b->D * (int64_t)sizeof(float);
    int64_t block_bytes = (int64_t)b->L * 2 * b->KVH * bs * tok_bytes;
    int64_t seq_blocks = ((int64_t)max_len + bs - 1) / bs;
    int64_t nb;
    const char *from = NULL; /* the key that set the size; NULL: the default cap */
    if (o->num_kv_blocks > 0) {
        nb = o->num_kv_blocks;
        from = "num_kv_blocks";
    } else if (o->kv_cache_bytes > 0) {
        nb = o->kv_cache_bytes / block_bytes;
        from = "kv_cache_bytes";
    } else if (o->cpu_kv_cache_bytes > 0) {
        nb = o->cpu_kv_cache_bytes / block_bytes;
        from = "cpu_kv_cache_bytes";
    } else {
        int64_t need = (int64_t)(o->max_num_seqs > 0 ? o->max_num_seqs : 1) * seq_blocks;
        int64_t cap = KV_DEFAULT_CAP_BYTES / block_bytes;
        nb = need < cap ? need : cap;
    }
    if (nb > (1 << 30))
        nb = 1 << 30;
    if (nb < seq_blocks) {
        snprintf(err, errlen,
                 "KV cache of %lld blocks (%.1f MiB%s%s) cannot hold one sequence of max_model_len %d "
                 "(%lld blocks of %d tokens, %.1f MiB of %s KV); raise %s or lower max_model_len",
                 (long long)nb, (double)(nb * block_bytes) / (1 << 20), from ? " from " : ", the default cap",
                 from ? from : "", max_len, (long long)seq_blocks, bs,
                 (double)(seq_blocks * block_bytes) / (1 << 20), b->kv8 ? "fp8" : "fp32",
                 from ? from : "cpu_kv_cache_bytes");
        return -1;
    }
    b->base.num_blocks = (int)nb;
    b->base.block_size = bs;
    b->kv_slab = (size_t)bs * b->D;
    b->kv_part = (size_t)nb * b->KVH * b->kv_slab;
    if (b->kv8) {
        b->kv_codes = calloc(2 * (size_t)b->L * b->kv_part, 1);
        b->kv_scales = calloc(2 * (size_t)b->L * b->kv_part / (size_t)b->D, sizeof(float));
        b->kv_buf = malloc((size_t)b->nthreads * 2 * b->kv_slab * sizeof(float));
        for (int i = 0; i < 256; i++)
            b->e4m3_lut[i] = e4m3_to_f32((uint8_t)i);
    } else {
        b->kv = calloc(2 * (size_t)b->L * b->kv_part, sizeof(float));
    }
    if (b->kv8 ? !b->kv_codes || !b->kv_scales || !b->kv_buf : !b->kv) {
        snprintf(err, errlen, "out of memory for a %.1f MiB KV cache",
                 (double)(nb * block_bytes) / (1 << 20));
        return -1;
    }
    log_info("cpu backend: KV cache %lld blocks of %d tokens = %lld tokens, %.1f MiB %s (max_model_len %d)",
             (long long)nb, bs, (long long)nb * bs, (double)(nb * block_bytes) / (1 << 20),
             b->kv8 ? "fp8 e4m3 + fp32 scale per token and KV head" : "fp32", max_len);
    return 0;
}

struct backend *cpu_backend_open(const struct model *m, const struct backend_opts *o, char *err,
                                 size_t errlen)
{
    const struct model_config *c = &m->cfg;
    if (backend_check_model(c, err, errlen))
        return NULL;
    struct cpu_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &cpu_ops;
    b->cfg = *c;
    const int n_moe = model_moe_layers(c);
    b->C = c->hidden, b->L = c->n_layers, b->H = c->n_heads, b->KVH = c->n_kv_heads;
    b->F = n_moe < c->n_layers ? c->intermediate : 0; /* 0: no dense MLP (its scratch is not sized) */
    if (n_moe > 0) {
        b->E = c->n_experts, b->K = c->n_experts_active, b->FE = c->moe_intermediate;
        b->norm_topk = c->norm_topk_prob;
    }
    b->D = c->head_dim, b->V = c->vocab;
    b->HD = b->H * b->D, b->KVD = b->KVH * b->D, b->QKV = b->HD + 2 * b->KVD;
    b->eps = c->rms_eps;
    b->nthreads = o->threads > 0 ? o->threads : omp_get_max_threads();

    b->inv_freq = malloc((size_t)(b->D / 2 + 1) * sizeof(float));
    if (!b->inv_freq) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (backend_rope_freqs(c, b->inv_freq, &b->attn_scale, err, errlen))
        goto fail;
    if (load_weights(b, m, o, err, errlen) || size_kv(b, o, err, errlen))
        goto fail;
    if (o->emulate_cuda) {
        /* the CUDA backend's weights were rounded to bf16 or fp16 by load_weights (not fp8 ones) */
        b->emu = true;
        b->emu_f16 = o->weight_dtype == BE_WEIGHTS_F16;
        b->emu_graphs = o->cuda_graphs;
        b->emu_graph_max = decode_graph_max(
            o->cuda_graph_max_batch, o->max_num_seqs > 0 ? o->max_num_seqs : BACKEND_DEFAULT_MAX_NUM_SEQS);
        b->emu_max_len = o->max_model_len > 0 ? o->max_model_len : c->max_position;
        b->emu_jitter = o->emulate_cuda_jitter;
        if (b->kv8 && !(b->kv_stg = calloc(2 * (size_t)b->L * b->kv_part, sizeof(float)))) {
            snprintf(err, errlen, "out of memory for the emulated fp8 KV staging copy");
            goto fail;
        }
    }

    if (b->E) {
        const int nb_gu = (2 * b->FE + GEMM_NB - 1) / GEMM_NB, nb_dn = (b->C + GEMM_NB - 1) / GEMM_NB;
        b->moff = malloc((size_t)(b->E + 1) * sizeof *b->moff);
        b->mitem = malloc((size_t)b->E * (size_t)(nb_gu > nb_dn ? nb_gu : nb_dn) * sizeof *b->mitem);
        if (!b->moff || !b->mitem) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        log_info("cpu backend: %d of %d layers mixture of experts: %d experts of %d, %d per token, %s", n_moe,
                 b->L, b->E, b->FE, b->K, b->norm_topk ? "renormalized" : "not renormalized");
    }
    b->hfin = malloc((size_t)LOGIT_CHUNK * b->C * sizeof(float));
    b->logits = malloc((size_t)LOGIT_CHUNK * b->V * sizeof(float));
    b->pick = malloc(LOGIT_CHUNK * sizeof *b->pick);
    b->perr = malloc(LOGIT_CHUNK * sizeof *b->perr);
    b->samp = calloc((size_t)b->nthreads, sizeof *b->samp);
    if (!b->hfin || !b->logits || !b->pick || !b->perr || !b->samp) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int t = 0; t < b->nthreads; t++)
        if (!(b->samp[t] = samp_new(b->V))) {
            snprintf(err, errlen, "out of memory for the sampler");
            goto fail;
        }
    log_info("cpu backend: %s, %d layers, hidden %d, heads %d/%d x %d, vocab %d, %d threads%s", c->arch_name,
             b->L, b->C, b->H, b->KVH, b->D, b->V, b->nthreads,
             !b->emu ? ""
             : b->emu_graphs
                 ? (b->emu_f16 ? ", fp16 emulation (decode graphs)" : ", bf16 emulation (decode graphs)")
                 : (b->emu_f16 ? ", fp16 emulation" : ", bf16 emulation"));
    return &b->base;
fail:
    cpu_free(&b->base);
    return NULL;
}

static void cpu_free(struct backend *be)
{
    struct cpu_backend *b = (struct cpu_backend *)be;
    if (!b)
        return;
    free(b->weights);
    free(b->layers);
    free(b->inv_freq);
    free(b->kv);
    free(b->kv_codes), free(b->kv_scales), free(b->kv_buf), free(b->kv_stg);
    free(b->x), free(b->h), free(b->qkv), free(b->att), free(b->tmp), free(b->gu), free(b->act);
    free(b->rcos), free(b->rsin), free(b->row_seq), free(b->row_pos), free(b->scores), free(b->mrun);
    free(b->vgrp);
    free(b->mlog), free(b->mw), free(b->msel), free(b->mslot), free(b->mx), free(b->mgu), free(b->mact);
    free(b->my), free(b->moff), free(b->mitem);
    free(b->hfin), free(b->logits), free(b->pick), free(b->perr);
    if (b->samp)
        for (int t = 0; t < b->nthreads; t++)
            samp_free(b->samp[t]);
    free(b->samp);
    free(b);
}

/* ---- step */

static int grow(void **p, size_t bytes)
{
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

static int reserve(struct cpu_backend *b, int rows, int ctx)
{
    if (rows > b->cap_rows) {
        size_t r = (size_t)rows, f = sizeof(float);
        if (grow((void **)&b->x, r * b->C * f) || grow((void **)&b->h, r * b->C * f) ||
            grow((void **)&b->qkv, r * b->QKV * f) || grow((void **)&b->att, r * b->HD * f) ||
            grow((void **)&b->tmp, r * b->C * f) || grow((void **)&b->gu, r * 2 * (b->F ? b->F : 1) * f) ||
            grow((void **)&b->act, r * (b->F ? b->F : 1) * f) ||
            grow((void **)&b->rcos, r * (b->D / 2 + 1) * f) ||
            grow((void **)&b->rsin, r * (b->D / 2 + 1) * f) || grow((void **)&b->row_seq, r * sizeof(int)) ||
            grow((void **)&b->row_pos, r * sizeof(int)))
            return -1;
        const size_t E = (size_t)b->E, K = (size_t)b->K, FE = (size_t)b->FE;
        if (E &&
            (grow((void **)&b->mlog, r * E * f) || grow((void **)&b->mw, r * K * f) ||
             grow((void **)&b->msel, r * K * sizeof(int)) || grow((void **)&b->mslot, r * K * sizeof(int)) ||
             grow((void **)&b->mx, r * K * b->C * f) || grow((void **)&b->mgu, r * K * 2 * FE * f) ||
             grow((void **)&b->mact, r * K * FE * f) || grow((void **)&b->my, r * K * b->C * f)))
            return -1;
        b->cap_rows = rows;
    }
    if (ctx > b->cap_ctx) {
        if (grow((void **)&b->scores, (size_t)b->nthreads * ctx * sizeof(float)))
            return -1;
        if (b->emu && grow((void **)&b->mrun, (size_t)b->nthreads * ctx * sizeof(float)))
            return -1;
        if (b->emu && b->kv8 && grow((void **)&b->vgrp, (size_t)b->nthreads * ctx * sizeof(float)))
            return -1;
        b->cap_ctx = ctx;
    }
    return 0;
}

/* fp8 pool: the scales of rows 0 .. of K (kind 0) or V (kind 1) of (block blk, kv head g) of a layer. */
static const float *kv_scale_rows(const struct cpu_backend *b, int layer, int kind, int32_t blk, int g)
{
    const size_t at =
        ((size_t)layer * 2 + (size_t)kind) * b->kv_part + ((size_t)blk * b->KVH + g) * b->kv_slab;
    return b->kv_scales + at / (size_t)b->D;
}

/* Rows 0 .. n-1 of K (kind 0) or V (kind 1) of (block blk, kv head g) of a layer as floats: the fp32
 * pool itself (*scale NULL), or with an fp8 pool the codes decoded into buf (exact) and their scales
 * in *scale (the value of row j is the decoded row times scale[j]); staged (fp8 pool): the values
 * themselves, rounded as k_kv_stage_fp8 rounds them, *scale NULL. */
static const float *kv_rows(const struct cpu_backend *b, int layer, int kind, int32_t blk, int g, int n,
                            bool staged, float *buf, const float **scale)
{
    const size_t at =
        ((size_t)layer * 2 + (size_t)kind) * b->kv_part + ((size_t)blk * b->KVH + g) * b->kv_slab;
    if (!b->kv8) {
        *scale = NULL;
        return b->kv + at;
    }
    if (staged) { /* k_kv_stage_fp8's values, kept by qk_rope_store (kv_stg) */
        *scale = NULL;
        return b->kv_stg + at;
    }
    const uint8_t *c = b->kv_codes + at;
    for (size_t i = 0; i < (size_t)n * b->D; i++)
        buf[i] = b->e4m3_lut[c[i]];
    *scale = kv_scale_rows(b, layer, kind, blk, g);
    return buf;
}

/* q/k norm and RoPE of every row in place in qkv, then K and V of every row into the pool. */
static void qk_rope_store(struct cpu_backend *b, const struct cpu_layer *cl, int layer,
                          const struct be_seq *seqs, int T)
{
    const int D = b->D, half = D / 2, bs = b->base.block_size;
    const size_t lk = (size_t)layer * 2 * b->kv_part, lv = lk + b->kv_part; /* K and V of this layer */
#pragma omp parallel for schedule(static) num_threads(b->nthreads)
    for (int r = 0; r < T; r++) {
        float *q = b->qkv + (size_t)r * b->QKV, *k = q + b->HD, *v = k + b->KVD;
        const float *c = b->rcos + (size_t)r * half, *s = b->rsin + (size_t)r * half;
        for (int h = 0; h < b->H; h++) {
            if (cl->q_norm)
                rmsnorm(q + h * D, q + h * D, cl->q_norm, D, b->eps);
            rope(q + h * D, c, s, half);
        }
        for (int g = 0; g < b->KVH; g++) {
            if (cl->k_norm)
                rmsnorm(k + g * D, k + g * D, cl->k_norm, D, b->eps);
            rope(k + g * D, c, s, half);
        }
        if (b->emu) {
            /* k_qk_norm_rope_kv stores q, k and v in bf16; the fp8 variant quantizes k, v from fp32 */
            for (int j = 0; j < (b->kv8 ? b->HD : b->QKV); j++)
                q[j] = emu_round(b, q[j]);
            if (b->kv8 && b->emu_jitter)
                for (int j = b->HD; j < b->QKV; j++)
                    q[j] = jitter(q[j], b->emu_jitter);
        }
        const struct be_seq *sq = &seqs[b->row_seq[r]];
        int p = b->row_pos[r];
        size_t blk = (size_t)sq->block_table[p / bs], off = (size_t)(p % bs) * D;
        for (int g = 0; g < b->KVH; g++) {
            size_t at = (blk * b->KVH + g) * b->kv_slab + off;
            if (b->kv8) {
                b->kv_scales[(lk + at) / D] = fp8_kv_quantize(k + g * D, D, b->kv_codes + lk + at);
                b->kv_scales[(lv + at) / D] = fp8_kv_quantize(v + g * D, D, b->kv_codes + lv + at);
                for (size_t i = 0; b->kv_stg && i < 2; i++) { /* K, then V: as kv_rows stages them */
                    const size_t e = (i ? lv : lk) + at;
                    const float sc = b->kv_scales[e / D];
                    for (int d = 0; d < D; d++)
                        b->kv_stg[e + d] = emu_round(b, b->e4m3_lut[b->kv_codes[e + d]] * sc);
                }
            } else {
                memcpy(b->kv + lk + at, k + g * D, (size_t)D * sizeof(float));
                memcpy(b->kv + lv + at, v + g * D, (size_t)D * sizeof(float));
            }
        }
    }
}

/* The scores of query q against the keys at positions [0, ctx) of kv head g of a layer (block table
 * bt), each times scale, into sc[0 .. ctx); returns their maximum. buf: kv_rows's scratch (NULL unless
 * the pool is fp8). */
static float qk_scores(const struct cpu_backend *b, int layer, const int32_t *bt, int g, int ctx,
                       const float *q, float scale, bool staged, float *buf, float *sc)
{
    const int D = b->D, bs = b->base.block_size;
    float mx = -INFINITY;
    for (int j0 = 0; j0 < ctx; j0 += bs) {
        int n = ctx - j0 < bs ? ctx - j0 : bs;
        const float *ks;
        const float *kb = kv_rows(b, layer, 0, bt[j0 / bs], g, n, staged, buf, &ks);
        for (int j = 0; j < n; j++) {
            float s = dot(q, kb + (size_t)j * D, D); /* fp8: q · codes, then the column's k_scale */
            if (ks)
                s *= ks[j];
            s *= scale;
            sc[j0 + j] = s;
            mx = fmaxf(mx, s);
        }
    }
    return mx;
}

/* Causal attention of every (row, head) over positions [0, pos] read from the pool. */
static void attention(struct cpu_backend *b, int layer, const struct be_seq *seqs, int T)
{
    const int D = b->D, H = b->H, bs = b->base.block_size, rep = b->H / b->KVH;
    const float scale = (float)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->nthreads)
    for (int it = 0; it < T * H; it++) {
        int r = it / H, h = it % H, g = h / rep, ctx = b->row_pos[r] + 1;
        const int32_t *bt = seqs[b->row_seq[r]].block_table;
        const float *q = b->qkv + (size_t)r * b->QKV + (size_t)h * D;
        float *sc = b->scores + (size_t)omp_get_thread_num() * b->cap_ctx;
        float *buf = b->kv8 ? b->kv_buf + (size_t)omp_get_thread_num() * 2 * b->kv_slab : NULL;
        const float mx = qk_scores(b, layer, bt, g, ctx, q, scale, false, buf, sc);
        double sum = 0;
        for (int j = 0; j < ctx; j++) {
            float e = expf(sc[j] - mx);
            sc[j] = e;
            sum += e;
        }
        float *o = b->att + (size_t)r * b->HD + (size_t)h * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int j0 = 0; j0 < ctx; j0 += bs) {
            int n = ctx - j0 < bs ? ctx - j0 : bs;
            const float *vs;
            const float *vb =
                kv_rows(b, layer, 1, bt[j0 / bs], g, n, false, buf ? buf + b->kv_slab : NULL, &vs);
            for (int j = 0; j < n; j++) {
                float p = (float)(sc[j0 + j] / sum);
                if (vs)
                    p *= vs[j];
                const float *vv = vb + (size_t)j * D;
                for (int d = 0; d < D; d++)
                    o[d] += p * vv[d];
            }
        }
    }
}

/* Attention as the CUDA kernels round it (emulate_cuda). Raw scores q·k in fp32; each probability
 * p = 2^(s·sl2 - m·sl2) (sl2 = log2(e) / sqrt(D), as the kernels fold the scale into exp2) is rounded
 * to bf16 before the P·V product, where m is the running maximum its kernel had reached when it
 * processed the key; the normalizer sums the unrounded p; the output is rounded to bf16. Mathematically
 * key j contributes bf16(2^((s_j - m_j) sl2)) · 2^((m_j - M) sl2) · v_j to out · l, M the row maximum:
 * the kernels' rescaling of the accumulator by 2^((m_old - m_new) sl2) at each new maximum gives the
 * same up to fp32 rounding. The running maximum m_j:
 *   rows of sequences with n_new > 1 (k_attention_prefill): one per row, over 64-key tiles from
 *     position 0 (tile t takes the max over keys 0 .. 64 t + 63);
 *   rows of sequences with n_new == 1 (k_attention_decode): the context is split into partitions of
 *     `part` keys (n_part at most, the last one takes the rest), and within a partition each of 4 warps
 *     takes keys 16 w .. 16 w + 15 of every 64-key tile with its own running max.
 * The kernels' exp2 is ex2.approx (within 2 ulp of exp2f) and their fp32 sums run in another order:
 * those differences move a rounding only where a value sits within a few fp32 ulps of a bf16 tie. */
static void attention_emu(struct cpu_backend *b, int layer, const struct be_seq *seqs, int T, int part,
                          int n_part)
{
    const int D = b->D, H = b->H, bs = b->base.block_size, rep = b->H / b->KVH;
    const float sl2 = (1.0f / sqrtf((float)D)) * 1.4426950408889634f;
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->nthreads)
    for (int it = 0; it < T * H; it++) {
        int r = it / H, h = it % H, g = h / rep, ctx = b->row_pos[r] + 1;
        const struct be_seq *sq = &seqs[b->row_seq[r]];
        const int32_t *bt = sq->block_table;
        const float *q = b->qkv + (size_t)r * b->QKV + (size_t)h * D;
        float *sc = b->scores + (size_t)omp_get_thread_num() * b->cap_ctx;
        float *mr = b->mrun + (size_t)omp_get_thread_num() * b->cap_ctx;
        float *buf = b->kv8 ? b->kv_buf + (size_t)omp_get_thread_num() * 2 * b->kv_slab : NULL;
        /* a prefill row over an fp8 pool reads bf16 copies of its blocks, as the CUDA backend's prefill
         * does (k_kv_stage_fp8, then the bf16 prefill attention) */
        const bool staged = buf && sq->n_new > 1;
        const float M = qk_scores(b, layer, bt, g, ctx, q, 1.0f, staged, buf, sc); /* raw: sl2 below */
        if (sq->n_new == 1) {
            int np = (ctx + part - 1) / part;
            np = np < 1 ? 1 : np > n_part ? n_part : np;
            for (int p = 0; p < np; p++) {
                int start = p * part, end = p == np - 1 ? ctx : start + part;
                for (int w = 0; w < EMU_DC_WARPS; w++) {
                    float m = -INFINITY;
                    for (int t0 = start + 16 * w; t0 < end; t0 += EMU_KV_TILE) {
                        int t1 = t0 + 16 < end ? t0 + 16 : end;
                        for (int j = t0; j < t1; j++)
                            m = fmaxf(m, sc[j]);
                        for (int j = t0; j < t1; j++)
                            mr[j] = m;
                    }
                }
            }
        } else {
            float m = -INFINITY;
            for (int t0 = 0; t0 < ctx; t0 += EMU_KV_TILE) {
                int t1 = t0 + EMU_KV_TILE < ctx ? t0 + EMU_KV_TILE : ctx;
                for (int j = t0; j < t1; j++)
                    m = fmaxf(m, sc[j]);
                for (int j = t0; j < t1; j++)
                    mr[j] = m;
            }
        }
        /* fp8 pool, decode row (k_attention_decode_fp8): P * v_scale / c is rounded to f16, c the largest v
           scale of the key's 16-key group (a warp's keys of a tile; partitions start at whole tiles) */
        float *vg = NULL;
        if (b->kv8 && !staged && sq->n_new == 1) {
            vg = b->vgrp + (size_t)omp_get_thread_num() * b->cap_ctx;
            for (int j0 = 0; j0 < ctx; j0 += bs)
                memcpy(vg + j0, kv_scale_rows(b, layer, 1, bt[j0 / bs], g),
                       (size_t)(ctx - j0 < bs ? ctx - j0 : bs) * sizeof(float));
            for (int g0 = 0; g0 < ctx; g0 += 16) {
                const int g1 = g0 + 16 < ctx ? g0 + 16 : ctx;
                float c = 0.0f;
                for (int j = g0; j < g1; j++)
                    c = fmaxf(c, vg[j]);
                if (!(c > 0.0f))
                    c = 1.0f;
                for (int j = g0; j < g1; j++)
                    vg[j] = c;
            }
        }
        const float Ms = M * sl2;
        float l = 0;
        float *o = b->att + (size_t)r * b->HD + (size_t)h * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int j0 = 0; j0 < ctx; j0 += bs) {
            int n = ctx - j0 < bs ? ctx - j0 : bs;
            const float *vs;
            const float *vb =
                kv_rows(b, layer, 1, bt[j0 / bs], g, n, staged, buf ? buf + b->kv_slab : NULL, &vs);
            for (int j = 0; j < n; j++) {
                const float ms = mr[j0 + j] * sl2;
                const float p = exp2f(fmaf(sc[j0 + j], sl2, -ms)), c = exp2f(ms - Ms);
                /* fp8: the probability times the key's v_scale is what the kernels round for P·V (the
                   decode kernel: over its group's largest, to f16) */
                const float w = vg   ? emu_round_f16(b, p * (vs[j] * (1.0f / vg[j0 + j]))) * vg[j0 + j] * c
                                : vs ? emu_round(b, p * vs[j]) * c
                                     : emu_round(b, p) * c;
                l += p * c;
                const float *vv = vb + (size_t)j * D;
                for (int d = 0; d < D; d++)
                    o[d] += w * vv[d];
            }
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < D; d++)
            o[d] = emu_round(b, o[d] * inv);
    }
}

/* SiLU(gate) * up of rows [0, M) of gu (M, 2N: gate, then up) into act (M, N); emulate_cuda: stored as the
 * CUDA backend's k_silu_mul stores it. */
static void silu_mul(const struct cpu_backend *b, const float *gu, float *act, int M, int N)
{
#pragma omp parallel for schedule(static) num_threads(b->nthreads)
    for (int r = 0; r < M; r++) {
        const float *g = gu + (size_t)r * 2 * N, *u = g + N;
        float *a = act + (size_t)r * N;
        if (b->emu) /* k_silu_mul: g / (1 + e^-g) * u in fp32, stored in bf16 */
            for (int j = 0; j < N; j++)
                a[j] = emu_round(b, g[j] / (1.0f + expf(-g[j])) * u[j]);
        else
            for (int j = 0; j < N; j++)
                a[j] = g[j] * (1.0f / (1.0f + expf(-g[j]))) * u[j];
    }
}

/* GEMMs of every expert that has rows: for expert e, y_e[n_e, N] = x_e[n_e, Kd] · w_e[N, Kd]^T, where x_e
 * and y_e are its rows of the grouped x and y (b->moff) and w_e = w + e N Kd. One parallel loop over
 * (expert, GEMM_NB-column block) work items, so few rows per expert still keep every thread busy. */
static void expert_gemms(struct cpu_backend *b, float *y, const float *x, const float *w, int N, int Kd)
{
    const int nb = (N + GEMM_NB - 1) / GEMM_NB;
    int n_items = 0;
    for (int e = 0; e < b->E; e++)
        if (b->moff[e + 1] > b->moff[e])
            for (int k = 0; k < nb; k++)
                b->mitem[n_items++] = e * nb + k;
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->nthreads)
    for (int it = 0; it < n_items; it++) {
        const int e = b->mitem[it] / nb, n0 = b->mitem[it] % nb * GEMM_NB,
                  n1 = n0 + GEMM_NB < N ? n0 + GEMM_NB : N;
        const size_t r0 = (size_t)b->moff[e];
        matmul_block(y + r0 * N, x + r0 * Kd, w + (size_t)e * N * Kd, b->moff[e + 1] - b->moff[e], N, Kd, n0,
                     n1);
    }
}

/* The mixture-of-experts MLP of rows [0, T) of b->h into b->tmp (engine/model.h, engine/moe.h): router
 * logits in fp32, each row routed (moe_route), the rows grouped by expert (ascending rows within an
 * expert), only the selected experts' GEMMs run, and each row's output summed over its experts in
 * ascending expert order (as transformers' index_add over experts). Every row's result is the same
 * whatever else is in the step. emulate_cuda: the expert GEMM outputs and SiLU * up are rounded as in the
 * dense MLP, each expert's output is weighted and summed in fp32, and the sum is rounded once. */
static void moe_mlp(struct cpu_backend *b, const struct cpu_layer *cl, int T)
{
    const int C = b->C, E = b->E, K = b->K, FE = b->FE, nt = b->nthreads;
    matmul(b->mlog, b->h, cl->router, T, E, C, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < T; r++)
        moe_route(b->mlog + (size_t)r * E, E, K, b->norm_topk, b->msel + (size_t)r * K,
                  b->mw + (size_t)r * K);
    /* group: counting sort of the (row, k) pairs by expert */
    memset(b->moff, 0, (size_t)(E + 1) * sizeof *b->moff);
    for (int i = 0; i < T * K; i++)
        b->moff[b->msel[i] + 1]++;
    for (int e = 0; e < E; e++)
        b->moff[e + 1] += b->moff[e];
    for (int i = 0; i < T * K; i++) { /* moff[e] moves to the end of e's rows here, then back */
        const int at = b->moff[b->msel[i]]++;
        b->mslot[i] = at;
        memcpy(b->mx + (size_t)at * C, b->h + (size_t)(i / K) * C, (size_t)C * sizeof(float));
    }
    for (int e = E; e > 0; e--)
        b->moff[e] = b->moff[e - 1];
    b->moff[0] = 0;
    const size_t TK = (size_t)T * K;
    expert_gemms(b, b->mgu, b->mx, cl->ewgu, 2 * FE, C);
    if (b->emu)
        emu_round_n(b, b->mgu, TK * 2 * FE, nt);
    silu_mul(b, b->mgu, b->mact, (int)TK, FE);
    expert_gemms(b, b->my, b->mact, cl->edown, C, FE);
    if (b->emu)
        emu_round_n(b, b->my, TK * C, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < T; r++) {
        float *o = b->tmp + (size_t)r * C;
        const int *sel = b->msel + (size_t)r * K;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int done = 0, last = -1; done < K; done++) { /* the next larger expert index than last */
            int k = -1;
            for (int j = 0; j < K; j++)
                if (sel[j] > last && (k < 0 || sel[j] < sel[k]))
                    k = j;
            last = sel[k];
            const float w = b->mw[(size_t)r * K + k], *y = b->my + (size_t)b->mslot[(size_t)r * K + k] * C;
            for (int j = 0; j < C; j++)
                o[j] += w * y[j];
        }
        if (b->emu)
            for (int j = 0; j < C; j++)
                o[j] = emu_round(b, o[j]);
    }
}

static int cpu_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    struct cpu_backend *b = (struct cpu_backend *)be;
    const int C = b->C, F = b->F, half = b->D / 2, nt = b->nthreads;
    be->err[0] = 0;
    int T = 0, ctx = 1;
    for (int i = 0; i < n; i++) {
        if (backend_check_seq(&b->base, &seqs[i], i, b->V, 0))
            return -1;
        T += seqs[i].n_new;
        if (seqs[i].pos + seqs[i].n_new > ctx)
            ctx = seqs[i].pos + seqs[i].n_new;
    }
    if (T == 0)
        return 0;
    if (reserve(b, T, ctx)) {
        snprintf(be->err, sizeof be->err, "out of memory for a step of %d tokens", T);
        return -1;
    }

    /* rows: embeddings, positions, RoPE angles (float32 as transformers: pos * inv_freq) */
    for (int i = 0, r = 0; i < n; i++)
        for (int t = 0; t < seqs[i].n_new; t++, r++) {
            b->row_seq[r] = i;
            b->row_pos[r] = seqs[i].pos + t;
        }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < T; r++) {
        const struct be_seq *s = &seqs[b->row_seq[r]];
        memcpy(b->x + (size_t)r * C, b->embed + (size_t)s->tokens[b->row_pos[r]] * C,
               (size_t)C * sizeof(float));
        for (int i = 0; i < half; i++) {
            float ang = (float)b->row_pos[r] * b->inv_freq[i];
            b->rcos[(size_t)r * half + i] = (float)cos((double)ang) * b->attn_scale;
            b->rsin[(size_t)r * half + i] = (float)sin((double)ang) * b->attn_scale;
        }
    }

    /* bf16 emulation: the decode attention's split as the CUDA backend launches it for this step */
    int dec_part = 1, dec_nparts = 1;
    if (b->emu) {
        int nd = 0, dctx = 0;
        for (int i = 0; i < n; i++)
            if (seqs[i].n_new == 1) {
                nd++;
                dctx = seqs[i].pos + 1 > dctx ? seqs[i].pos + 1 : dctx;
            }
        if (b->emu_graphs && nd == n && nd <= b->emu_graph_max) { /* a graph of its buckets */
            dctx = decode_graph_ctx(dctx, b->emu_max_len, b->base.block_size);
            nd = decode_graph_batch(nd, b->emu_graph_max);
        }
        decode_split(nd, dctx, 0, &dec_part, &dec_nparts, NULL); /* as kernels/attention_decode.cu */
    }
    const size_t TC = (size_t)T * C;

    for (int l = 0; l < b->L; l++) {
        const struct cpu_layer *cl = &b->layers[l];
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int r = 0; r < T; r++)
            rmsnorm(b->h + (size_t)r * C, b->x + (size_t)r * C, cl->attn_norm, C, b->eps);
        if (b->emu)
            emu_round_n(b, b->h, TC, nt);
        matmul(b->qkv, b->h, cl->wqkv, T, b->QKV, C, nt);
        if (b->emu) /* the GEMM's bf16 output; the bias is added in fp32 by k_qk_norm_rope_kv */
            emu_round_n(b, b->qkv, (size_t)T * b->QKV, nt);
        if (cl->bqkv)
            for (int r = 0; r < T; r++)
                for (int j = 0; j < b->QKV; j++)
                    b->qkv[(size_t)r * b->QKV + j] += cl->bqkv[j];
        qk_rope_store(b, cl, l, seqs, T);
        if (b->emu)
            attention_emu(b, l, seqs, T, dec_part, dec_nparts);
        else
            attention(b, l, seqs, T);
        matmul(b->tmp, b->att, cl->wo, T, C, b->HD, nt);
        if (b->emu)
            emu_round_n(b, b->tmp, TC, nt);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int r = 0; r < T; r++) {
            float *x = b->x + (size_t)r * C;
            const float *a = b->tmp + (size_t)r * C;
            for (int j = 0; j < C; j++)
                x[j] += a[j];
            rmsnorm(b->h + (size_t)r * C, x, cl->mlp_norm, C, b->eps);
        }
        if (b->emu)
            emu_round_n(b, b->h, TC, nt);
        if (cl->router) { /* a mixture of experts: its output into tmp */
            moe_mlp(b, cl, T);
            for (size_t j = 0; j < TC; j++)
                b->x[j] += b->tmp[j];
            continue;
        }
        matmul(b->gu, b->h, cl->wgu, T, 2 * F, C, nt);
        if (b->emu)
            emu_round_n(b, b->gu, (size_t)T * 2 * F, nt);
        silu_mul(b, b->gu, b->act, T, F);
        matmul(b->tmp, b->act, cl->wdown, T, C, F, nt);
        if (b->emu)
            emu_round_n(b, b->tmp, TC, nt);
        for (size_t j = 0; j < (size_t)T * C; j++)
            b->x[j] += b->tmp[j];
    }

    /* logits of the last row of each sampling sequence, LOGIT_CHUNK sequences at a time */
    int last = -1;
    bool failed = false;
    backend_fill_masks(be); /* the forward is done: masks before the first sample */
    for (int i0 = 0; i0 < n;) {
        int k = 0, r = 0;
        for (int i = 0; i < n; i++) {
            r += seqs[i].n_new;
            if (i > last && seqs[i].sample && k < LOGIT_CHUNK) {
                b->pick[k] = i;
                rmsnorm(b->hfin + (size_t)k * C, b->x + (size_t)(r - 1) * C, b->final_norm, C, b->eps);
                if (b->emu)
                    emu_round_n(b, b->hfin + (size_t)k * C, (size_t)C, 1);
                k++;
                last = i;
            }
        }
        if (k == 0)
            break;
        matmul(b->logits, b->hfin, b->lm_head, k, b->V, C, nt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int j = 0; j < k; j++) {
            int i = b->pick[j];
            b->perr[j][0] = 0;
            samp_sample(b->samp[omp_get_thread_num()], b->logits + (size_t)j * b->V, &seqs[i], &out[i],
                        b->perr[j], sizeof b->perr[j]);
        }
        for (int j = 0; j < k; j++)
            if (b->perr[j][0]) { /* that sequence alone fails (backend_ops.step) */
                out[b->pick[j]].token = -1;
                if (!failed)
                    snprintf(be->err, sizeof be->err, "sequence %d: sampling: %s", b->pick[j], b->perr[j]);
                failed = true;
            }
        i0 = last + 1;
    }
    return 0;
}
