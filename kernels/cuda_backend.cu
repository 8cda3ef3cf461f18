// The CUDA backend (engine/backend.h): bf16 weights, paged bf16 KV cache, fp32 residual stream (or all
// the 16-bit tensors in fp16: fp16 mode, backend_opts.weight_dtype BE_WEIGHTS_F16).
//
// One step, as the host builds it:
//   rows     the step's new tokens, decode sequences (n_new == 1) first, then prefill sequences,
//            so each attention kernel sees one contiguous group;
//   inputs   token ids, positions, KV slots (from the block tables), per group q_start / ctx_len /
//            block tables, sampler parameters and histories: filled in pinned host buffers and
//            copied with one cudaMemcpyAsync per array into fixed device buffers;
//   forward  embedding, then per layer add_rmsnorm, QKV GEMM, q/k norm + RoPE + KV write,
//            attention (decode group, prefill group), o_proj GEMM, add_rmsnorm, gate/up GEMM,
//            SiLU*up, down GEMM; the final norm and lm_head only for rows that get logits;
//   sampling k_sample on fp32 logits; token, logprob and top logprobs copied back; one sync.
// Pure decode steps (every sequence n_new == 1) can run as CUDA graphs (cuda_graphs.cu).
//
// Memory: weights, activations for max_num_batched_tokens rows, logits for max_num_seqs rows,
// workspaces and staging are allocated first; the KV pool then takes what
// gpu_memory_utilization * total leaves of the measured free memory, less a reserve for graphs.
//
// Errors: every CUDA call and launcher is checked; a failed step returns -1 with the reason in
// be->err. After a sticky error (the CUDA context is lost) every later step fails at once and says so.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cublaslt_loader.h"
#include "kernels/cuda_backend.cuh"

extern "C" {
#include "engine/cuda_backend.h"
#include "engine/decode_split.h"
#include "engine/gemm_tuning.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "engine/weight_copies.h"
}

static_assert((int)K_GEMM_PICK_TIMED == (int)BE_GEMM_TIMED && (int)K_GEMM_PICK_GEMV == (int)BE_GEMM_GEMV &&
                  (int)K_GEMM_PICK_CUBLASLT == (int)BE_GEMM_CUBLASLT,
              "k_gemm_set_pick takes enum be_gemm_pick's values");

#define GRAPH_RESERVE ((size_t)512 << 20) // device memory kept out of the KV pool for graphs and cuBLAS
#define CB_TUNING_SAVE_S 60.0             // the GEMM tuning file's save interval while steps run
#define HIST_INIT 1024                    // sampler history ints per sequence allocated at open
#define BANNED_INIT 16

static int cb_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out);
static void cb_free(struct backend *be);
static const struct backend_ops cuda_ops = {"cuda", cb_step, cb_free};

// ---- errors and memory

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int cb_fail_cuda(struct cuda_backend *b, const char *file, int line, const char *what, cudaError_t e)
{
    snprintf(b->base.err, sizeof b->base.err, "%s:%d: %s: %s (%s)", base_name(file), line, what,
             cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int cb_fail_k(struct cuda_backend *b, const char *what)
{
    snprintf(b->base.err, sizeof b->base.err, "%s: %s", what, k_last_error());
    return -1;
}

int cb_malloc(struct cuda_backend *b, void **p, size_t bytes, const char *what)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(
            b->base.err, sizeof b->base.err,
            "cudaMalloc of %.1f MiB for %s: %s (%.1f MiB free of %.1f MiB; lower max_num_batched_tokens, "
            "max_num_seqs or gpu_memory_utilization)",
            (double)bytes / (1 << 20), what, cudaGetErrorString(e), (double)fr / (1 << 20),
            (double)tot / (1 << 20));
        *p = NULL;
        return -1;
    }
    b->alloc_bytes += bytes;
    return 0;
}

static void note_peak(struct cuda_backend *b)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > b->peak_used)
        b->peak_used = tot - fr;
}

static int buf_alloc(struct cuda_backend *b, struct cb_buf *x, size_t bytes, const char *what)
{
    x->cap = bytes ? bytes : 16;
    if (cb_malloc(b, &x->d, x->cap, what))
        return -1;
    cudaError_t e = cudaHostAlloc(&x->h, x->cap, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        x->h = NULL;
        return cb_fail_cuda(b, __FILE__, __LINE__, "cudaHostAlloc", e);
    }
    return 0;
}

static void buf_free(struct cuda_backend *b, struct cb_buf *x)
{
    if (x->d) {
        cudaFree(x->d);
        b->alloc_bytes -= x->cap;
    }
    if (x->h)
        cudaFreeHost(x->h);
    x->d = x->h = NULL;
    x->cap = 0;
}

// Grows x to hold at least `bytes` (contents are not kept). Only between steps: the stream is idle.
static int buf_reserve(struct cuda_backend *b, struct cb_buf *x, size_t bytes, const char *what)
{
    if (bytes <= x->cap)
        return 0;
    size_t cap = x->cap * 2 > bytes ? x->cap * 2 : bytes;
    buf_free(b, x);
    if (buf_alloc(b, x, cap, what))
        return -1;
    note_peak(b);
    return 0;
}

static int upload(struct cuda_backend *b, const struct cb_buf *x, size_t bytes)
{
    if (bytes)
        CB_CUDA(cudaMemcpyAsync(x->d, x->h, bytes, cudaMemcpyHostToDevice, b->stream));
    return 0;
}

// After a failed step: a non-sticky error is cleared; a sticky one marks the backend broken.
static void after_failure(struct cuda_backend *b)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(b->stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(b->stream, &g);
        if (g)
            cudaGraphDestroy(g);
    }
    b->spec.live = false; // a guessed step on the stream is dropped with the failed one
    (void)cudaStreamSynchronize(b->copy.stream);
    cudaError_t e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess)
        return;
    (void)cudaGetLastError();
    e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess)
        return;
    b->broken = true;
    size_t n = strlen(b->base.err);
    snprintf(b->base.err + n, sizeof b->base.err - n,
             " [the CUDA context is lost (%s): this backend cannot run further steps]", cudaGetErrorName(e));
    log_error("cuda backend: %s", b->base.err);
}

// ---- small kernels of the forward pass

// resid_out[j] = resid[rows[j]], tmp_out[j] = tmp[rows[j]]: the rows that get logits
__global__ void gather_rows_kernel(const float *resid, const bf16 *tmp, const int32_t *rows, float *resid_out,
                                   bf16 *tmp_out, int C)
{
    const size_t r = (size_t)rows[blockIdx.x], j = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        resid_out[j * C + c] = resid[r * C + c];
        tmp_out[j * C + c] = tmp[r * C + c];
    }
}

__global__ void iota_kernel(int32_t *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = i;
}

// ---- the forward pass (enqueues only: no host synchronization, so it can be captured)

// q/k norm + RoPE + KV write, then attention (decode group, prefill group) into b->acts.att, over the
// layer's bf16 or fp8 cache.
static int attention_block(struct cuda_backend *b, const struct cb_plan *p, const struct cb_layer *cl,
                           const int32_t *pos, const int32_t *slot, float scale)
{
    const int T = p->T, QKV = b->QKV, HD = b->HD, bs = b->base.block_size;
    cudaStream_t st = b->stream;
    bf16 *q_pre = b->acts.qkv + (size_t)p->nd * QKV, *att_pre = b->acts.att + (size_t)p->nd * HD;
    if (b->kv.fp8) {
        uint8_t *kc = (uint8_t *)cl->k_cache, *vc = (uint8_t *)cl->v_cache;
        CB_K(k_qk_norm_rope_kv_fp8(b->acts.qkv, cl->bqkv, cl->q_norm, cl->k_norm, b->eps, pos, b->w.inv_freq,
                                   b->w.attn_scale, slot, kc, vc, cl->k_scale, cl->v_scale, T, b->H, b->KVH,
                                   b->D, bs, st));
        if (p->nd > 0)
            CB_K(k_attention_decode_fp8(b->acts.qkv, QKV, kc, vc, cl->k_scale, cl->v_scale, &p->dec,
                                        b->acts.att, b->H, b->KVH, b->D, bs, scale, b->acts.attn_ws,
                                        b->acts.attn_ws_bytes, st));
        if (p->np > 0 && p->n_stage == 0)
            CB_K(k_attention_prefill_fp8(q_pre, QKV, kc, vc, cl->k_scale, cl->v_scale, &p->pre, att_pre, b->H,
                                         b->KVH, b->D, bs, scale, st));
        for (int g = 0; g < p->n_stage; g++) { // the blocks as bf16, then the bf16 prefill over them
            const struct cb_stage_group *sg = &p->stage[g];
            CB_K(k_kv_stage_fp8(kc, vc, cl->k_scale, cl->v_scale, (const int32_t *)b->stage.src.d + sg->b0,
                                sg->nb, b->stage.k, b->stage.v, b->KVH, b->D, bs, st));
            struct k_attn_batch gb = p->pre;
            gb.n_seqs = sg->k1 - sg->k0;
            gb.q_start += sg->k0;
            gb.ctx_len += sg->k0;
            gb.block_tables = (const int32_t *)b->stage.btab.d + (size_t)sg->k0 * p->pre.max_blocks;
            gb.max_q_len = sg->max_q;
            gb.max_ctx_len = sg->max_ctx;
            CB_K(k_attention_prefill(q_pre, QKV, b->stage.k, b->stage.v, &gb, att_pre, b->H, b->KVH, b->D, bs,
                                     scale, st));
        }
        return 0;
    }
    bf16 *kc = (bf16 *)cl->k_cache, *vc = (bf16 *)cl->v_cache;
    // A pure decode step folds the q/k norm + RoPE prologue into the decode attention (one dependent
    // launch fewer a layer, the same bits: k_attention_decode_rope).
    if (p->np == 0 && p->nd > 0) {
        const struct k_rope_in rope = {cl->bqkv, cl->q_norm,    cl->k_norm,      b->eps,
                                       pos,      b->w.inv_freq, b->w.attn_scale, slot};
        CB_K(k_attention_decode_rope(b->acts.qkv, &rope, kc, vc, &p->dec, b->acts.att, b->H, b->KVH, b->D, bs,
                                     scale, 0, b->acts.attn_ws, b->acts.attn_ws_bytes, st));
        return 0;
    }
    CB_K(k_qk_norm_rope_kv(b->acts.qkv, cl->bqkv, cl->q_norm, cl->k_norm, b->eps, pos, b->w.inv_freq,
                           b->w.attn_scale, slot, kc, vc, T, b->H, b->KVH, b->D, bs, st));
    if (p->nd > 0)
        CB_K(k_attention_decode(b->acts.qkv, QKV, kc, vc, &p->dec, b->acts.att, b->H, b->KVH, b->D, bs, scale,
                                b->acts.attn_ws, b->acts.attn_ws_bytes, st));
    if (p->np > 0)
        CB_K(k_attention_prefill(q_pre, QKV, kc, vc, &p->pre, att_pre, b->H, b->KVH, b->D, bs, scale, st));
    return 0;
}

int cb_forward(struct cuda_backend *b, const struct cb_plan *p)
{
    const int T = p->T, C = b->C, F = b->F, HD = b->HD;
    const float scale = 1.0f / sqrtf((float)b->D);
    cudaStream_t st = b->stream;
    const int32_t *ids = (const int32_t *)b->io.ids.d, *pos = (const int32_t *)b->io.pos.d,
                  *slot = (const int32_t *)b->io.slot.d;

    CB_K(k_embedding_f32(ids, T, b->w.embed, b->V, C, b->acts.resid, st));
    // A one-sequence step with fp8 weights leaves the down GEMV's parts of K unadded (k_gemv_fp8_parts)
    // and the add + RMSNorm after it (the next layer's, or the final one on the same row: no gather) adds
    // them (k_add_parts_rmsnorm): the same bits, and the GEMV ends without its split's ticket, fence and
    // last-part sum.
    const bool parts = T == 1 && !p->gather && b->layers[0].wdown.fp8;
    int pend = 0; // down's parts in acts.down_parts not yet added (0: the last sublayer's output is in tmp)
    for (int l = 0; l < b->L; l++) {
        const struct cb_layer *cl = &b->layers[l];
        // an fp8 matrix's input is quantized by its producer (the norm, SiLU*up) or k_quant_fp8_act into
        // xq/xs where k_linear may read it (k_linear_takes_xq; the fused producers round to bf16 exactly
        // as the plain ones do, so the values are the same); its bf16 form is kept only where k_linear
        // may take the GEMV (T <= K_GEMV_MAX_M)
        const bool small = T <= K_GEMV_MAX_M;
        const bool qkv_xq = k_linear_takes_xq(&cl->wqkv, T), gu_xq = k_linear_takes_xq(&cl->wgu, T),
                   down_xq = k_linear_takes_xq(&cl->wdown, T);
        if (qkv_xq)
            CB_K(k_add_rmsnorm_fp8(b->acts.resid, l == 0 ? NULL : b->acts.tmp, cl->attn_norm,
                                   small ? b->acts.h : NULL, b->acts.xq, b->acts.xs, T, C, b->eps, st));
        else if (l == 0)
            CB_K(k_rmsnorm(b->acts.resid, cl->attn_norm, b->acts.h, T, C, b->eps, st));
        else if (pend)
            CB_K(k_add_parts_rmsnorm(b->acts.resid, b->acts.down_parts, pend, cl->attn_norm, b->acts.h, T, C,
                                     b->eps, st));
        else
            CB_K(k_add_rmsnorm(b->acts.resid, b->acts.tmp, cl->attn_norm, b->acts.h, T, C, b->eps, st));
        CB_K(k_linear(b->gemm, cl->wqkv.fp8 && !small ? NULL : b->acts.h, qkv_xq ? b->acts.xq : NULL,
                      qkv_xq ? b->acts.xs : NULL, &cl->wqkv, b->acts.qkv, 0, T, st));
        if (attention_block(b, p, cl, pos, slot, scale))
            return -1;
        const bool wo_xq = k_linear_takes_xq(&cl->wo, T);
        if (wo_xq)
            CB_K(k_quant_fp8_act(b->acts.att, T, HD, b->acts.xq, b->acts.xs, st));
        CB_K(k_linear(b->gemm, b->acts.att, wo_xq ? b->acts.xq : NULL, wo_xq ? b->acts.xs : NULL, &cl->wo,
                      b->acts.tmp, 0, T, st));
        if (gu_xq)
            CB_K(k_add_rmsnorm_fp8(b->acts.resid, b->acts.tmp, cl->mlp_norm, small ? b->acts.h : NULL,
                                   b->acts.xq, b->acts.xs, T, C, b->eps, st));
        else
            CB_K(k_add_rmsnorm(b->acts.resid, b->acts.tmp, cl->mlp_norm, b->acts.h, T, C, b->eps, st));
        // one sequence with fp8 weights: gate/up and SwiGLU as one kernel (k_gemv_fp8_glu: the same bits,
        // one dependent launch fewer a layer)
        if (cl->wgu.fp8 && T == 1)
            CB_K(k_gemv_fp8_glu(b->acts.h, (const uint8_t *)cl->wgu.w, cl->wgu.scale, b->acts.act, T, F, C,
                                st));
        else {
            CB_K(k_linear(b->gemm, cl->wgu.fp8 && !small ? NULL : b->acts.h, gu_xq ? b->acts.xq : NULL,
                          gu_xq ? b->acts.xs : NULL, &cl->wgu, b->acts.gu, 0, T, st));
            if (down_xq)
                CB_K(
                    k_silu_mul_fp8(b->acts.gu, small ? b->acts.act : NULL, b->acts.xq, b->acts.xs, T, F, st));
            else
                CB_K(k_silu_mul(b->acts.gu, b->acts.act, T, F, st));
        }
        if (parts) {
            pend = k_gemv_fp8_parts(b->acts.act, (const uint8_t *)cl->wdown.w, cl->wdown.scale,
                                    b->acts.down_parts, 1, cl->wdown.N, cl->wdown.K, 0, st);
            if (pend < 0)
                return cb_fail_k(b, "k_gemv_fp8_parts");
        } else {
            CB_K(k_linear(b->gemm, cl->wdown.fp8 && !small ? NULL : b->acts.act, down_xq ? b->acts.xq : NULL,
                          down_xq ? b->acts.xs : NULL, &cl->wdown, b->acts.tmp, 0, T, st));
        }
    }
    if (p->n_logits == 0)
        return 0;
    // the last layer's down projection is still to be added: the final norm does it, on logits rows only
    const int NL = p->n_logits;
    float *res = b->acts.resid;
    const bf16 *add = b->acts.tmp;
    if (p->gather) {
        gather_rows_kernel<<<NL, 256, 0, st>>>(b->acts.resid, b->acts.tmp, (const int32_t *)b->io.last_rows.d,
                                               b->acts.resid_last, b->acts.tmp_last, C);
        CB_CUDA(cudaGetLastError());
        res = b->acts.resid_last, add = b->acts.tmp_last;
    }
    // lm_head: bf16 (as vLLM and the Qwen3-FP8 checkpoints keep it) or fp8 (model.lm_head_dtype), whose
    // input the final norm quantizes where k_linear may read it; small batches may take the GEMV
    const bool lm_small = NL <= K_GEMV_MAX_M, lm_xq = k_linear_takes_xq(&b->w.lm, NL);
    if (lm_xq)
        CB_K(k_add_rmsnorm_fp8(res, add, b->w.final_norm, lm_small ? b->acts.h_last : NULL, b->acts.xq,
                               b->acts.xs, NL, C, b->eps, st));
    else if (pend)
        CB_K(k_add_parts_rmsnorm(res, b->acts.down_parts, pend, b->w.final_norm, b->acts.h_last, NL, C,
                                 b->eps, st));
    else
        CB_K(k_add_rmsnorm(res, add, b->w.final_norm, b->acts.h_last, NL, C, b->eps, st));
    CB_K(k_linear(b->gemm, b->w.lm.fp8 && !lm_small ? NULL : b->acts.h_last, lm_xq ? b->acts.xq : NULL,
                  lm_xq ? b->acts.xs : NULL, &b->w.lm, b->acts.logits, 1, NL, st));
    return 0;
}

// ---- open

static double kv_util(const struct backend_opts *o)
{
    return o->gpu_memory_utilization > 0 && o->gpu_memory_utilization <= 1 ? o->gpu_memory_utilization : 0.92;
}

// bytes of one KV block over all layers: K and V of KVH heads x block_size tokens, D bf16 each, or D
// e4m3 bytes + one fp32 scale each
static size_t kv_block_bytes(const struct cuda_backend *b)
{
    const size_t tok_bytes = b->kv.fp8 ? (size_t)b->D + sizeof(float) : (size_t)b->D * sizeof(bf16);
    return (size_t)b->L * 2 * b->KVH * b->base.block_size * tok_bytes;
}

static int size_kv(struct cuda_backend *b, const struct backend_opts *o)
{
    const int bs = b->base.block_size;
    size_t fr = 0, tot = 0;
    CB_CUDA(cudaMemGetInfo(&fr, &tot));
    const double util = kv_util(o);
    const size_t block_bytes = kv_block_bytes(b);
    double used = (double)(tot - fr), budget = util * (double)tot - used - (double)GRAPH_RESERVE;
    const char *why = "gpu_memory_utilization";
    if (o->kv_cache_bytes > 0 && (double)o->kv_cache_bytes < budget) {
        budget = (double)o->kv_cache_bytes;
        why = "kv_cache_bytes";
    }
    // engine.num_kv_blocks: exactly that many, whatever the budget says (and no smaller retry below)
    const bool exact = o->num_kv_blocks > 0;
    int64_t nb;
    if (exact) {
        nb = o->num_kv_blocks;
        why = "num_kv_blocks";
        if (nb < b->max_blocks) { // as the CPU backend: an explicit size must hold one whole sequence
            snprintf(
                b->base.err, sizeof b->base.err,
                "KV cache of %lld blocks (from num_kv_blocks) cannot hold one sequence of max_model_len %d "
                "(%d blocks of %d tokens); raise num_kv_blocks or lower max_model_len",
                (long long)nb, b->max_model_len, b->max_blocks, bs);
            return -1;
        }
        if ((double)nb * (double)block_bytes > (double)fr - (double)GRAPH_RESERVE) {
            snprintf(
                b->base.err, sizeof b->base.err,
                "engine.num_kv_blocks %lld: %.2f GB of KV cache (%.1f MiB a block of %d tokens) do not fit "
                "in the %.2f GB free after weights and activations%s",
                (long long)nb, (double)nb * (double)block_bytes / 1e9, (double)block_bytes / (1 << 20), bs,
                ((double)fr - (double)GRAPH_RESERVE) / 1e9,
                b->w.copies ? " (and the decode weight copies of engine.decode_weight_copies on)" : "");
            return -1;
        }
    } else {
        nb = budget > 0 ? (int64_t)(budget / (double)block_bytes) : 0;
        if (nb > (1 << 30))
            nb = 1 << 30;
        if (nb < 1) {
            snprintf(
                b->base.err, sizeof b->base.err,
                "no room for a KV cache: %.2f GB of %.2f GB are in use after weights and activations "
                "(gpu_memory_utilization %.2f leaves %.2f GB; one block of %d tokens is %.1f MiB); lower "
                "max_num_batched_tokens or max_num_seqs, or raise gpu_memory_utilization%s",
                used / 1e9, (double)tot / 1e9, util, util * (double)tot / 1e9, bs,
                (double)block_bytes / (1 << 20),
                b->w.copies ? ", or set engine.decode_weight_copies to auto or off (the copies are in use)"
                            : "");
            return -1;
        }
    }
    // a fragmented device may refuse one large allocation: retry a little smaller
    for (int attempt = 0;; attempt++) {
        cudaError_t e = cudaMalloc(&b->kv.pool, (size_t)nb * block_bytes);
        if (e == cudaSuccess)
            break;
        (void)cudaGetLastError();
        b->kv.pool = NULL;
        if (attempt == 10 || nb < 2 || exact)
            return cb_fail_cuda(b, __FILE__, __LINE__, "cudaMalloc(KV cache)", e);
        nb = nb * 95 / 100;
    }
    b->kv.bytes = (size_t)nb * block_bytes;
    b->alloc_bytes += b->kv.bytes;
    CB_CUDA(cudaMemsetAsync(b->kv.pool, 0, b->kv.bytes, b->stream)); // finite values in never-written slots
    b->base.num_blocks = (int)nb;
    const size_t part = (size_t)nb * b->KVH * bs * b->D; // elements of K (or V) of one layer
    const size_t spart = (size_t)nb * b->KVH * bs;       // fp8: scales of K (or V) of one layer
    // fp8: the scales right after the codes (16-byte aligned: D is a multiple of 16)
    float *scales = b->kv.fp8 ? (float *)((uint8_t *)b->kv.pool + (size_t)b->L * 2 * part) : NULL;
    for (int l = 0; l < b->L; l++) {
        struct cb_layer *cl = &b->layers[l];
        if (b->kv.fp8) {
            cl->k_cache = (uint8_t *)b->kv.pool + (size_t)l * 2 * part;
            cl->v_cache = (uint8_t *)cl->k_cache + part;
            cl->k_scale = scales + (size_t)l * 2 * spart;
            cl->v_scale = cl->k_scale + spart;
        } else {
            cl->k_cache = (bf16 *)b->kv.pool + (size_t)l * 2 * part;
            cl->v_cache = (bf16 *)cl->k_cache + part;
            cl->k_scale = cl->v_scale = NULL;
        }
    }
    log_info(
        "cuda backend: KV cache %lld blocks of %d tokens = %lld tokens, %.2f GB %s (%s; %.2f GB of %.2f GB "
        "in use before it)",
        (long long)nb, bs, (long long)nb * bs, (double)b->kv.bytes / 1e9,
        b->kv.fp8 ? "fp8 e4m3 + fp32 scale per token and KV head"
        : b->f16  ? "fp16"
                  : "bf16",
        why, used / 1e9, (double)tot / 1e9);
    if ((int64_t)nb * bs < b->max_model_len)
        log_warn("cuda backend: the KV cache holds %lld tokens, less than max_model_len %d",
                 (long long)nb * bs, b->max_model_len);
    return 0;
}

// The decode GEMVs' weight copies, by engine/weight_copies.h's rule: what size_kv above would have
// for the KV cache without them, against what the cache must hold. Made right before size_kv, after
// every other allocation, so that the budget is the one the cache then sizes itself from.
static int weight_copies(struct cuda_backend *b, const struct backend_opts *o)
{
    size_t fr = 0, tot = 0;
    CB_CUDA(cudaMemGetInfo(&fr, &tot));
    const int bs = b->base.block_size;
    struct weight_copies_in in = {};
    in.mode = o->decode_weight_copies;
    in.copy_bytes = (double)cb_tile_copies_bytes(b);
    in.block_bytes = (double)kv_block_bytes(b);
    in.block_size = bs;
    if (o->num_kv_blocks > 0) { // size_kv's exact size: the free memory, whatever the utilization
        in.kv_budget = (double)fr - (double)GRAPH_RESERVE;
        in.need_tokens = (int64_t)o->num_kv_blocks * bs;
    } else {
        in.kv_budget = kv_util(o) * (double)tot - (double)(tot - fr) - (double)GRAPH_RESERVE;
        in.kv_cap = o->kv_cache_bytes > 0 ? (double)o->kv_cache_bytes : 0;
        in.need_tokens = (int64_t)b->max_seqs * b->max_model_len;
    }
    char why[256];
    if (!weight_copies_decide(&in, why, sizeof why)) {
        if (in.copy_bytes > 0)
            log_info("cuda backend: no decode weight copies (%.2f GB): %s", in.copy_bytes / 1e9, why);
        return 0;
    }
    return cb_tile_copies(b, why);
}

// fp8 cache: the prefill attention's staging pool (cuda_backend.cuh). It holds one sequence of
// max_model_len, or a full step of fresh prompts (max_tokens new keys in at most S partial blocks), so
// a step needs more than one staging round only when earlier context adds up past that (or a test's
// smaller pool, backend_test_opts.kv_stage_blocks).
static int alloc_stage(struct cuda_backend *b, const struct backend_opts *o)
{
    b->stage.cap = 0;
    if (!b->kv.fp8)
        return 0;
    const int bs = b->base.block_size, S = b->max_seqs;
    long long cap = (b->max_tokens + bs - 1) / bs + S;
    cap = cap > b->max_blocks ? cap : b->max_blocks;
    cap = o->test.kv_stage_blocks > 0 ? o->test.kv_stage_blocks : cap;
    cap = cap < 65535 ? cap : 65535; // one k_kv_stage_fp8 launch
    const size_t bytes = (size_t)cap * b->KVH * bs * b->D * sizeof(bf16);
    if (cb_malloc(b, (void **)&b->stage.k, bytes, "fp8 prefill staging (K)") ||
        cb_malloc(b, (void **)&b->stage.v, bytes, "fp8 prefill staging (V)") ||
        buf_alloc(b, &b->stage.src, (size_t)S * b->max_blocks * 4, "staged blocks") ||
        buf_alloc(b, &b->stage.btab, (size_t)S * b->max_blocks * 4, "staged block tables"))
        return -1;
    b->stage.cap = (int)cap;
    return 0;
}

static int alloc_buffers(struct cuda_backend *b, const struct backend_opts *o)
{
    const size_t R = b->rows, S = b->max_seqs, C = b->C;
    if (cb_malloc(b, (void **)&b->acts.resid, R * C * 4, "residual") ||
        cb_malloc(b, (void **)&b->acts.h, R * C * 2, "norm") ||
        cb_malloc(b, (void **)&b->acts.qkv, R * b->QKV * 2, "qkv") ||
        cb_malloc(b, (void **)&b->acts.att, R * b->HD * 2, "attn") ||
        cb_malloc(b, (void **)&b->acts.tmp, R * C * 2, "sublayer out") ||
        cb_malloc(b, (void **)&b->acts.down_parts, K_GEMV_MAX_SPLIT * C * 4, "down parts") ||
        cb_malloc(b, (void **)&b->acts.gu, R * 2 * b->F * 2, "gate/up") ||
        cb_malloc(b, (void **)&b->acts.act, R * b->F * 2, "mlp act") ||
        cb_malloc(b, (void **)&b->acts.resid_last, S * C * 4, "last rows") ||
        cb_malloc(b, (void **)&b->acts.tmp_last, S * C * 2, "last rows") ||
        cb_malloc(b, (void **)&b->acts.h_last, S * C * 2, "last rows") ||
        cb_malloc(b, (void **)&b->acts.logits, K_FP8_ROWS(S) * b->V * 4, "logits") || // fp8 lm_head: Mp rows
        cb_malloc(b, (void **)&b->acts.qs_dec, (S + 1) * 4, "q_start"))
        return -1;
    iota_kernel<<<(unsigned)((S + 1 + 255) / 256), 256, 0, b->stream>>>(b->acts.qs_dec, (int)S + 1);
    CB_CUDA(cudaGetLastError());
    // the decode split depends on the batch (at most ~4096 partitions in all), so take the largest need
    // over every batch size a step or a padded graph can have
    b->acts.attn_ws_bytes = 0;
    for (int n = 1; n <= (int)S; n++) {
        size_t w = k_attention_decode_workspace(n, b->H, b->D, b->max_model_len);
        b->acts.attn_ws_bytes = w > b->acts.attn_ws_bytes ? w : b->acts.attn_ws_bytes;
    }
    b->acts.samp_ws_bytes = k_sample_workspace((int)S, b->V);
    if (cb_malloc(b, &b->acts.attn_ws, b->acts.attn_ws_bytes, "decode attention workspace") ||
        cb_malloc(b, &b->acts.samp_ws, b->acts.samp_ws_bytes, "sampler workspace"))
        return -1;
    const size_t MB = b->max_blocks;
    if (buf_alloc(b, &b->io.ids, R * 4, "ids") || buf_alloc(b, &b->io.pos, R * 4, "positions") ||
        buf_alloc(b, &b->io.slot, R * 4, "slots") || buf_alloc(b, &b->io.ctx_dec, S * 4, "ctx_len") ||
        buf_alloc(b, &b->io.btab_dec, S * MB * 4, "block tables") ||
        buf_alloc(b, &b->io.qs_pre, (S + 1) * 4, "q_start") ||
        buf_alloc(b, &b->io.ctx_pre, S * 4, "ctx_len") ||
        buf_alloc(b, &b->io.btab_pre, S * MB * 4, "block tables") ||
        buf_alloc(b, &b->io.last_rows, S * 4, "last rows") ||
        buf_alloc(b, &b->io.params, S * sizeof(struct k_sample_params), "sampling params") ||
        buf_alloc(b, &b->io.hist, S * HIST_INIT * 4, "token histories") ||
        buf_alloc(b, &b->io.hist_start, (S + 1) * 4, "history starts") ||
        buf_alloc(b, &b->io.n_prompt, S * 4, "n_prompt") ||
        buf_alloc(b, &b->io.banned, S * BANNED_INIT * 4, "banned ids") ||
        buf_alloc(b, &b->io.banned_start, (S + 1) * 4, "banned starts") ||
        buf_alloc(b, &b->io.allow, 16, "grammar masks") || buf_alloc(b, &b->io.allow_row, S * 4, "mask rows") ||
        buf_alloc(b, &b->io.out, S * (2 + 2 * CB_TOP) * 4, "sampler outputs"))
        return -1;
    if (alloc_stage(b, o))
        return -1;
    b->io.row_seq = (int *)calloc(S, sizeof(int));
    b->io.order = (int *)calloc(S, sizeof(int));
    b->stage.groups = (struct cb_stage_group *)calloc(S, sizeof *b->stage.groups);
    if (!b->io.row_seq || !b->io.order || !b->stage.groups) {
        snprintf(b->base.err, sizeof b->base.err, "out of host memory");
        return -1;
    }
    return cb_spec_init(b, o->test.no_step_guess ? 0 : CB_SPEC_MAX);
}

extern "C" struct backend *cuda_backend_open(const struct model *m, const struct backend_opts *o, char *err,
                                             size_t errlen)
{
    const struct model_config *c = &m->cfg;
    if (backend_check_model(c, err, errlen))
        return NULL;
    if (model_moe_layers(c) > 0) {
        snprintf(err, errlen,
                 "%s: %d of %d layers are mixture-of-experts (%d experts, %d per token); the CUDA "
                 "backend does not run MoE layers yet (the CPU backend does: engine.backend cpu)",
                 c->arch_name, model_moe_layers(c), c->n_layers, c->n_experts, c->n_experts_active);
        return NULL;
    }
    const bool f16 = o->weight_dtype == BE_WEIGHTS_F16;
    if (o->kv_dtype != DT_BF16 && o->kv_dtype != DT_F8_E4M3 && o->kv_dtype != DT_F16) {
        snprintf(
            err, errlen,
            "KV cache dtype %s: the CUDA backend keeps its KV cache in bf16, fp8 (e4m3), or fp16 in fp16 "
            "mode",
            dtype_name(o->kv_dtype) ? dtype_name(o->kv_dtype) : "?");
        return NULL;
    }
    if (f16 != (o->kv_dtype == DT_F16)) {
        const char *kv = o->kv_dtype == DT_F8_E4M3 ? "fp8" : o->kv_dtype == DT_BF16 ? "bf16" : "fp16";
        snprintf(
            err, errlen,
            f16 ? "model.dtype fp16 keeps the KV cache in fp16 (engine.kv_cache_dtype auto), not %s: fp16 "
                  "mode has no bf16 or fp8 cache"
                : "KV cache dtype %s: an fp16 cache needs model.dtype fp16",
            kv);
        return NULL;
    }
    if (f16 && o->lm_head_dtype == BE_WEIGHTS_FP8) {
        snprintf(err, errlen, "model.lm_head_dtype fp8 with model.dtype fp16: fp16 mode has no fp8 path");
        return NULL;
    }
    if (o->kv_dtype == DT_F8_E4M3 && c->head_dim != 64 && c->head_dim != 128) {
        snprintf(err, errlen, "fp8 KV cache: head_dim %d (64 or 128 supported)", c->head_dim);
        return NULL;
    }
    if (o->block_size <= 0) {
        snprintf(err, errlen, "block_size %d: must be positive", o->block_size);
        return NULL;
    }
    int max_len = o->max_model_len > 0 ? o->max_model_len : c->max_position;
    if (max_len <= 0) {
        snprintf(err, errlen, "max_model_len is not set and the model has no max_position_embeddings");
        return NULL;
    }
    const struct k_diag *dg = k_diag(); // kernels/diagnostics.cu: the environment's diagnostics
    if (dg->err[0]) {
        snprintf(err, errlen, "cuda backend: %s", dg->err);
        return NULL;
    }
    if (dg->set[0])
        log_info("cuda backend: diagnostics from the environment: %s", dg->set);
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        snprintf(err, errlen, "no usable CUDA device: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }
    struct cuda_backend *b = (struct cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->base.ops = &cuda_ops;
    b->base.block_size = o->block_size;
    b->cfg = *c;
    b->C = c->hidden, b->F = c->intermediate, b->L = c->n_layers, b->H = c->n_heads, b->KVH = c->n_kv_heads;
    b->D = c->head_dim, b->V = c->vocab;
    b->HD = b->H * b->D, b->KVD = b->KVH * b->D, b->QKV = b->HD + 2 * b->KVD;
    b->eps = c->rms_eps;
    b->max_seqs = o->max_num_seqs > 0 ? o->max_num_seqs : BACKEND_DEFAULT_MAX_NUM_SEQS;
    b->max_tokens =
        o->max_num_batched_tokens > 0 ? o->max_num_batched_tokens : BACKEND_DEFAULT_MAX_BATCHED_TOKENS;
    b->max_model_len = max_len;
    b->max_blocks = (max_len + o->block_size - 1) / o->block_size;
    b->graphs.on = o->cuda_graphs;
    b->graphs.max_batch = decode_graph_max(o->cuda_graph_max_batch, b->max_seqs);
    b->f16 = f16;
    b->w.dtype = o->weight_dtype;
    // fp16 mode: no fp8 output projection even where a checkpoint ships one (fp8_linear_use says never)
    b->w.lm_dtype = f16 ? BE_WEIGHTS_F16 : o->lm_head_dtype;
    b->kv.fp8 = o->kv_dtype == DT_F8_E4M3;
    // a multiple of 4: k_gemm_fp8 reads and writes K_FP8_ROWS(T) rows of xq/xs and of its output
    b->rows = K_FP8_ROWS(b->max_tokens > b->max_seqs ? b->max_tokens : b->max_seqs);
    b->device = o->device;

    float *inv = NULL;
    int prev_f16 = k_f16();
    cudaDeviceProp prop;
    int n_dev = 0;
    if ((e = cudaGetDeviceCount(&n_dev)) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaGetDeviceCount", e);
        goto fail;
    }
    if (b->device < 0 || b->device >= n_dev) { // engine.device names a GPU this machine does not have
        snprintf(b->base.err, sizeof b->base.err,
                 "engine.device %d: this machine has %d CUDA device%s (0..%d; CUDA_VISIBLE_DEVICES, if set, "
                 "renumbers them)",
                 b->device, n_dev, n_dev == 1 ? "" : "s", n_dev - 1);
        goto fail;
    }
    // The device is per host thread: every entry point (open, step, stats, free) selects it
    if ((e = cudaSetDevice(b->device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, b->device)) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaSetDevice", e);
        goto fail;
    }
    k_set_f16(b->f16); // for this open's launches; the caller's mode (prev_f16) is given back below
    snprintf(b->device_name, sizeof b->device_name, "%s", prop.name);
    b->total_mem = prop.totalGlobalMem;
    if ((e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamCreateWithFlags", e);
        goto fail;
    }
    b->gemm = k_gemm_create(CB_GEMM_WORKSPACE);
    if (!b->gemm) {
        snprintf(b->base.err, sizeof b->base.err, "cuBLASLt: %s", k_last_error());
        goto fail;
    }
    log_info("cuda backend: cuBLASLt %zu from %s", k_cublaslt_version(), k_cublaslt_path());
    b->alloc_bytes += CB_GEMM_WORKSPACE + K_GEMV_WS_BYTES; // cuBLASLt and the GEMV split-K workspaces
    k_gemm_set_pick(b->gemm, (int)o->test.gemm_pick);
    if (o->gemm_tuning_file && o->gemm_tuning_file[0]) {
        char msg[1024];
        const int rc = k_gemm_use_tuning_file(b->gemm, o->gemm_tuning_file, msg, sizeof msg);
        b->tuning.on = rc != GEMM_TUNING_FOREIGN;
        b->tuning.saved = llmq_mono_s();
        b->tuning.save_s = o->test.tuning_save_every_step ? 0 : CB_TUNING_SAVE_S;
        if (rc == GEMM_TUNING_LOADED)
            log_info("cuda backend: GEMM tuning file %s", msg);
        else if (rc == GEMM_TUNING_NO_FILE)
            log_info("cuda backend: GEMM tuning file %s: the choices made will be written there at close",
                     msg);
        else if (rc == GEMM_TUNING_FOREIGN)
            log_warn(
                "cuda backend: GEMM tuning file %s; it is neither read nor written (engine.gemm_tuning_file)",
                msg);
        else
            log_warn("cuda backend: GEMM tuning file %s: set aside, the GEMMs are timed again and the file "
                     "replaced at close",
                     msg);
    }

    inv = (float *)malloc((size_t)(b->D / 2 + 1) * sizeof(float));
    if (!inv) {
        snprintf(b->base.err, sizeof b->base.err, "out of memory");
        goto fail;
    }
    if (backend_rope_freqs(c, inv, &b->w.attn_scale, b->base.err, sizeof b->base.err))
        goto fail;
    if (cb_malloc(b, (void **)&b->w.inv_freq, (size_t)(b->D / 2) * sizeof(float), "rope"))
        goto fail;
    if ((e = cudaMemcpy(b->w.inv_freq, inv, (size_t)(b->D / 2) * sizeof(float), cudaMemcpyHostToDevice)) !=
        cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemcpy(inv_freq)", e);
        goto fail;
    }
    free(inv);
    inv = NULL;

    if (cb_load_weights(b, m) || alloc_buffers(b, o))
        goto fail;
    if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize", e);
        goto fail;
    }
    if (weight_copies(b, o) || size_kv(b, o))
        goto fail;
    if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize", e);
        goto fail;
    }
    note_peak(b);
    log_info(
        "cuda backend: %s on device %d, %s (%.1f GB), %d layers, hidden %d, heads %d/%d x %d, vocab %d; "
        "up to %d sequences and %d tokens per step, max_model_len %d, %.2f GB allocated (activations and "
        "workspaces %.2f GB), decode graphs %s%s%s",
        c->arch_name, b->device, b->device_name, (double)b->total_mem / 1e9, b->L, b->C, b->H, b->KVH, b->D,
        b->V, b->max_seqs, b->max_tokens, b->max_model_len, (double)b->alloc_bytes / 1e9,
        (double)(b->alloc_bytes - b->w.bytes - b->w.copies_bytes - b->kv.bytes) / 1e9,
        b->graphs.on ? "on" : "off", b->f16 ? "; fp16 mode (weights, activations and KV cache in fp16)" : "",
        b->w.copies                ? "; decode GEMVs on the weight copies (engine.decode_weight_copies)"
        : b->w.n_fp8 == 0          ? ""
        : k_gemv_fp8_diag(-1) == 1 ? "; one-row fp8 GEMVs in the diagonal mapping"
                                   : "; one-row fp8 GEMVs in the tile mapping");
    k_set_f16(prev_f16);
    return &b->base;
fail:
    k_set_f16(prev_f16);
    free(inv);
    snprintf(err, errlen, "%s", b->base.err[0] ? b->base.err : "cuda backend: open failed");
    cb_free(&b->base);
    return NULL;
}

// Writes the GEMM tuning file when new choices came since the last save (kernels/gemm.cu returns at
// once otherwise); says so at info (at close) or debug (the saves while steps run) level.
static void tuning_save(struct cuda_backend *b, bool at_close)
{
    char msg[1024];
    const int rc = k_gemm_save_tuning(b->gemm, msg, sizeof msg);
    if (rc > 0)
        log_msg(at_close ? LOG_INFO : LOG_DEBUG, "cuda backend: GEMM tuning file %s", msg);
    else if (rc < 0)
        log_warn("cuda backend: GEMM tuning file not written: %s", msg);
}

// ---- the host's part of a step
//
// Between two steps the GPU waits for the host: the copy back of the sampled tokens, the engine's and
// the caller's work on them, the next step's layout and uploads, its launch. A kernel timeline shows
// the whole gap (contrib/lab/ktrace, `--whole`: the host turn); these sums say which part of it is host
// time, per phase (CB_HT_*, cuda_backend.cuh), for graph (pure decode) and eager steps: logged at close.

static void host_times_log(const struct cuda_backend *b)
{
    static const char *kind[2] = {"graph", "eager"};
    for (int k = 0; k < 2; k++) {
        if (b->ht.steps[k] == 0)
            continue;
        const double u = 1e6 / (double)b->ht.steps[k];
        const double *t = b->ht.t[k];
        log_info(
            "cuda backend: host time a step, %s steps (%llu), us: %.1f between steps (the engine and its "
            "caller), %.1f layout and uploads, %.1f forward enqueued, %.1f sampler enqueued, %.1f "
            "waiting for the GPU, %.1f outputs read",
            kind[k], (unsigned long long)b->ht.steps[k], t[CB_HT_BETWEEN] * u, t[CB_HT_PREPARE] * u,
            t[CB_HT_FORWARD] * u, t[CB_HT_SAMPLER] * u, t[CB_HT_WAIT] * u, t[CB_HT_READ] * u);
    }
}

static void cb_free(struct backend *be)
{
    struct cuda_backend *b = (struct cuda_backend *)be;
    if (!b)
        return;
    cudaSetDevice(b->device);
    if (b->stream)
        cudaStreamSynchronize(b->stream);
    if (b->copy.stream)
        cudaStreamSynchronize(b->copy.stream);
    cb_spec_free(b);
    host_times_log(b);
    if (b->graphs.n || b->graphs.replays || b->graphs.eager_steps) {
        struct k_gemm_counts gc = {0, 0, 0, 0};
        if (b->gemm)
            k_gemm_get_counts(b->gemm, &gc);
        log_info("cuda backend: %llu eager steps, %llu graph replays, %d decode graphs captured; GEMM "
                 "algorithms: %d timed, %d taken from their tune bucket, %d from the tuning file",
                 (unsigned long long)b->graphs.eager_steps, (unsigned long long)b->graphs.replays,
                 b->graphs.n, gc.tuned, gc.borrowed, gc.loaded);
    }
    if (b->gemm)
        tuning_save(b, true);
    cb_graphs_free(b);
    cb_tile_copies_free(b);
    k_gemm_free(b->gemm);
    if (b->acts.xq)
        cudaFree(b->acts.xq);
    void *dev[] = {b->w.buf,          b->w.copies,        b->kv.pool,       b->w.inv_freq,  b->acts.resid,
                   b->acts.h,         b->acts.qkv,        b->acts.att,      b->acts.tmp,    b->acts.gu,
                   b->acts.act,       b->acts.resid_last, b->acts.tmp_last, b->acts.h_last, b->acts.logits,
                   b->acts.qs_dec,    b->acts.attn_ws,    b->acts.samp_ws,  b->stage.k,     b->stage.v,
                   b->acts.down_parts};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            cudaFree(dev[i]);
    struct cb_buf *bufs[] = {&b->io.ids,       &b->io.pos,    &b->io.slot,         &b->io.ctx_dec,
                             &b->io.btab_dec,  &b->io.qs_pre, &b->io.ctx_pre,      &b->io.btab_pre,
                             &b->io.last_rows, &b->io.params, &b->io.hist,         &b->io.hist_start,
                             &b->io.n_prompt,  &b->io.banned, &b->io.banned_start, &b->io.out,
                             &b->io.allow,     &b->io.allow_row, &b->stage.src, &b->stage.btab};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        buf_free(b, bufs[i]);
    free(b->layers);
    free(b->io.row_seq);
    free(b->io.order);
    free(b->stage.groups);
    free(b->stage.mark);
    free(b->stage.at);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    free(b);
}

extern "C" int cuda_backend_get_stats(const struct backend *be, struct cuda_backend_stats *st)
{
    if (!be || be->ops != &cuda_ops)
        return -1;
    struct cuda_backend *b = (struct cuda_backend *)be;
    if (cudaSetDevice(b->device) == cudaSuccess)
        note_peak(b);
    memset(st, 0, sizeof *st);
    snprintf(st->device, sizeof st->device, "%.127s", b->device_name);
    st->device_total_bytes = (int64_t)b->total_mem;
    st->weights_bytes = (int64_t)b->w.bytes;
    st->copy_bytes = (int64_t)b->w.copies_bytes;
    st->kv_bytes = (int64_t)b->kv.bytes;
    st->alloc_bytes = (int64_t)b->alloc_bytes;
    st->peak_used_bytes = (int64_t)b->peak_used;
    st->graphs = b->graphs.n;
    st->graph_replays = b->graphs.replays;
    st->eager_steps = b->graphs.eager_steps;
    st->guesses_taken = b->spec.hits;
    st->guesses_dropped = b->spec.misses;
    st->guesses_new_block = b->spec.hits_block;
    struct k_gemm_counts gc = {0, 0, 0, 0};
    if (b->gemm)
        k_gemm_get_counts(b->gemm, &gc);
    st->gemm_made = gc.made;
    st->gemm_loaded = gc.loaded;
    return 0;
}

// ---- step

int cb_slot(const struct be_seq *s, int p, int bs)
{
    return s->block_table[p / bs] * bs + p % bs;
}

// One row's token, position and KV slot.
static void put_row(struct cuda_backend *b, int r, const struct be_seq *s, int p)
{
    ((int32_t *)b->io.ids.h)[r] = s->tokens[p];
    ((int32_t *)b->io.pos.h)[r] = p;
    ((int32_t *)b->io.slot.h)[r] = cb_slot(s, p, b->base.block_size);
}

// Row k of a block-table array of stride mb: the sequence's blocks, then block 0.
static void put_btab(int32_t *bt, int k, int mb, const struct be_seq *s, int ctx, int bs)
{
    int need = (ctx + bs - 1) / bs;
    int32_t *row = bt + (size_t)k * mb;
    memcpy(row, s->block_table, (size_t)need * sizeof(int32_t));
    for (int j = need; j < mb; j++)
        row[j] = 0;
}

// fp8 cache: the staging rounds of a step's np prefill sequences (their block tables in btab_pre, rows
// of mb): consecutive sequences share a round while their blocks fit the pool, and a block two of them
// read (a shared prefix) is staged once per round; the round's blocks are listed in stage.src and each
// table is remapped to their places in the pool. Uploads both; returns the number of rounds (0: no pool,
// or a sequence longer than it), -1 on a CUDA error.
static int plan_stage(struct cuda_backend *b, int np, int mb)
{
    if (b->stage.cap == 0)
        return 0;
    const int bs = b->base.block_size, n_blocks = b->base.num_blocks;
    if (!b->stage.mark) { // per cache block: the round that staged it last, and where
        b->stage.mark = (uint32_t *)calloc((size_t)n_blocks, sizeof *b->stage.mark);
        b->stage.at = (int32_t *)malloc((size_t)n_blocks * sizeof *b->stage.at);
        if (!b->stage.mark || !b->stage.at) {
            free(b->stage.mark), free(b->stage.at);
            b->stage.mark = NULL, b->stage.at = NULL;
            return 0; // no host memory for it: the fp8 kernel
        }
    }
    const int32_t *ctx = (const int32_t *)b->io.ctx_pre.h, *qs = (const int32_t *)b->io.qs_pre.h,
                  *btab = (const int32_t *)b->io.btab_pre.h;
    int32_t *src = (int32_t *)b->stage.src.h, *remap = (int32_t *)b->stage.btab.h;
    uint32_t *mark = b->stage.mark;
    int n_groups = 0, total = 0;
    struct cb_stage_group *g = NULL;
    for (int k = 0; k < np; k++) {
        const int need = (ctx[k] + bs - 1) / bs;
        const int32_t *row = btab + (size_t)k * mb;
        if (need > b->stage.cap)
            return 0;
        int fresh = 0; // blocks the current round does not hold yet
        for (int j = 0; j < need; j++) {
            if (row[j] < 0 || row[j] >= n_blocks)
                return 0; // not a block of this pool (the step fails in its own checks)
            fresh += g && mark[row[j]] == b->stage.epoch ? 0 : 1;
        }
        if (!g || g->nb + fresh > b->stage.cap) {
            if (++b->stage.epoch == 0) { // 2^32 rounds: start the marks again
                memset(mark, 0, (size_t)n_blocks * sizeof *mark);
                b->stage.epoch = 1;
            }
            g = &b->stage.groups[n_groups++];
            *g = cb_stage_group{k, k, total, 0, 0, 0};
        }
        for (int j = 0; j < need; j++) {
            if (mark[row[j]] != b->stage.epoch) {
                mark[row[j]] = b->stage.epoch;
                b->stage.at[row[j]] = g->nb++;
                src[total++] = row[j];
            }
            remap[(size_t)k * mb + j] = b->stage.at[row[j]];
        }
        for (int j = need; j < mb; j++)
            remap[(size_t)k * mb + j] = 0;
        g->k1 = k + 1;
        const int nq = qs[k + 1] - qs[k];
        g->max_q = nq > g->max_q ? nq : g->max_q;
        g->max_ctx = ctx[k] > g->max_ctx ? ctx[k] : g->max_ctx;
    }
    if (upload(b, &b->stage.src, (size_t)total * 4) || upload(b, &b->stage.btab, (size_t)np * mb * 4))
        return -1;
    return n_groups;
}

static bool needs_history(const struct sampling_params *sp)
{
    return sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
}

bool cb_plain_sampling(const struct be_seq *s)
{
    return !needs_history(s->sp) && !(s->banned && s->n_banned > 0) && !s->allowed;
}

void cb_sample_params(const struct be_seq *s, struct k_sample_params *q)
{
    const struct sampling_params *sp = s->sp;
    memset(q, 0, sizeof *q);
    q->temperature = sp->temperature;
    q->top_p = sp->top_p;
    q->min_p = sp->min_p;
    q->repetition_penalty = sp->repetition_penalty;
    q->presence_penalty = sp->presence_penalty;
    q->frequency_penalty = sp->frequency_penalty;
    q->top_k = sp->top_k;
    q->logprobs = sp->logprobs;
    q->seed = sp->seed;
    q->step = (uint64_t)(s->n_tokens - s->n_prompt);
}

// Sampler inputs for rows 0 .. n_samp-1 (row j samples seqs[b->io.row_seq[j]]), uploaded.
static int put_sampler_inputs(struct cuda_backend *b, const struct be_seq *seqs, int n_samp)
{
    size_t n_hist = 0, n_ban = 0;
    for (int j = 0; j < n_samp; j++) {
        const struct be_seq *s = &seqs[b->io.row_seq[j]];
        if (!s->sample)
            continue;
        if (needs_history(s->sp))
            n_hist += (size_t)(s->sp->repetition_penalty != 1.0f ? s->n_tokens : s->n_tokens - s->n_prompt);
        n_ban += (size_t)(s->banned && s->n_banned > 0 ? s->n_banned : 0);
    }
    size_t n_masks = 0;
    const size_t words = (size_t)(b->V + 31) / 32;
    for (int j = 0; j < n_samp; j++) {
        const struct be_seq *s = &seqs[b->io.row_seq[j]];
        n_masks += s->sample && s->allowed;
    }
    if (buf_reserve(b, &b->io.hist, n_hist * 4, "token histories") ||
        buf_reserve(b, &b->io.banned, n_ban * 4, "banned ids") ||
        buf_reserve(b, &b->io.allow, n_masks * words * 4, "grammar masks"))
        return -1;
    int32_t *arow = (int32_t *)b->io.allow_row.h;
    size_t om = 0;
    struct k_sample_params *pr = (struct k_sample_params *)b->io.params.h;
    int32_t *hist = (int32_t *)b->io.hist.h, *hs = (int32_t *)b->io.hist_start.h,
            *np = (int32_t *)b->io.n_prompt.h;
    int32_t *ban = (int32_t *)b->io.banned.h, *bst = (int32_t *)b->io.banned_start.h;
    size_t oh = 0, ob = 0;
    for (int j = 0; j < n_samp; j++) {
        const struct be_seq *s = &seqs[b->io.row_seq[j]];
        struct k_sample_params *q = &pr[j];
        hs[j] = (int32_t)oh;
        bst[j] = (int32_t)ob;
        np[j] = 0;
        arow[j] = -1;
        if (!s->sample) { // a decode row that does not sample (its output is ignored): greedy, nothing else
            memset(q, 0, sizeof *q);
            q->top_p = 1.0f;
            q->repetition_penalty = 1.0f;
            q->logprobs = -1;
            continue;
        }
        const struct sampling_params *sp = s->sp;
        cb_sample_params(s, q);
        if (needs_history(sp)) {
            int from = sp->repetition_penalty != 1.0f ? 0 : s->n_prompt;
            memcpy(hist + oh, s->tokens + from, (size_t)(s->n_tokens - from) * 4);
            oh += (size_t)(s->n_tokens - from);
            np[j] = from == 0 ? s->n_prompt : 0;
        }
        if (s->banned && s->n_banned > 0) {
            memcpy(ban + ob, s->banned, (size_t)s->n_banned * 4);
            ob += (size_t)s->n_banned;
        }
        if (s->allowed)
            arow[j] = (int32_t)om++; // its words come in put_masks, after the forward is enqueued
    }
    hs[n_samp] = (int32_t)oh;
    bst[n_samp] = (int32_t)ob;
    if (upload(b, &b->io.params, (size_t)n_samp * sizeof *pr) ||
        upload(b, &b->io.hist_start, (size_t)(n_samp + 1) * 4) ||
        upload(b, &b->io.n_prompt, (size_t)n_samp * 4) ||
        upload(b, &b->io.banned_start, (size_t)(n_samp + 1) * 4) || upload(b, &b->io.hist, oh * 4) ||
        upload(b, &b->io.banned, ob * 4) || upload(b, &b->io.allow_row, (size_t)n_samp * 4))
        return -1;
    return 0;
}

// The grammar masks of the sampled rows (laid out by put_sampler_inputs), asked of the engine now that
// the forward is enqueued, so that the host computes them while the GPU runs; then uploaded.
static int put_masks(struct cuda_backend *b, const struct be_seq *seqs, int n_samp)
{
    backend_fill_masks(&b->base);
    const size_t words = (size_t)(b->V + 31) / 32;
    uint32_t *allow = (uint32_t *)b->io.allow.h;
    size_t om = 0;
    for (int j = 0; j < n_samp; j++) {
        const struct be_seq *s = &seqs[b->io.row_seq[j]];
        if (s->sample && s->allowed)
            memcpy(allow + om++ * words, s->allowed, words * 4);
    }
    return upload(b, &b->io.allow, om * words * 4);
}

static int run_step(struct cuda_backend *b, const struct be_seq *seqs, int n, struct be_out *out,
                    double t_enter)
{
    int taken_rc = 0;
    if (b->spec.live && cb_spec_take(b, seqs, n, out, &taken_rc)) // the guessed step was this one
        return taken_rc;
    const int bs = b->base.block_size, S = b->max_seqs;
    // decode sequences first, then prefill sequences
    int nd = 0, np = 0, max_ctx_dec = 0, max_ctx_pre = 0, max_q_pre = 0, T = 0;
    for (int i = 0; i < n; i++)
        if (seqs[i].n_new == 1) {
            b->io.order[nd++] = i;
            if (seqs[i].pos + 1 > max_ctx_dec)
                max_ctx_dec = seqs[i].pos + 1;
        }
    for (int i = 0; i < n; i++)
        if (seqs[i].n_new > 1) {
            b->io.order[nd + np++] = i;
            int ctx = seqs[i].pos + seqs[i].n_new;
            max_ctx_pre = ctx > max_ctx_pre ? ctx : max_ctx_pre;
            max_q_pre = seqs[i].n_new > max_q_pre ? seqs[i].n_new : max_q_pre;
        }
    for (int i = 0; i < n; i++)
        T += seqs[i].n_new;
    const bool pure = np == 0;
    const bool graph = pure && b->graphs.on && nd <= b->graphs.max_batch;
    const int B = graph ? cb_graph_batch(b, nd) : nd;
    const int gctx = graph ? cb_graph_ctx(b, max_ctx_dec) : max_ctx_dec;
    const int dec_ctx = graph ? gctx : max_ctx_dec;
    const int mb_dec = dec_ctx > 0 ? (dec_ctx + bs - 1) / bs : 1;
    const int mb_pre = max_ctx_pre > 0 ? (max_ctx_pre + bs - 1) / bs : 1;
    const int rows = graph ? B : T;

    // rows: decode group (padded to B with dummy rows), then prefill group
    int32_t *ctx_dec = (int32_t *)b->io.ctx_dec.h, *btab_dec = (int32_t *)b->io.btab_dec.h;
    int32_t *qs_pre = (int32_t *)b->io.qs_pre.h, *ctx_pre = (int32_t *)b->io.ctx_pre.h,
            *btab_pre = (int32_t *)b->io.btab_pre.h;
    int32_t *last = (int32_t *)b->io.last_rows.h;
    int r = 0;
    for (int k = 0; k < nd; k++, r++) {
        const struct be_seq *s = &seqs[b->io.order[k]];
        put_row(b, r, s, s->pos);
        ctx_dec[k] = s->pos + 1;
        put_btab(btab_dec, k, mb_dec, s, s->pos + 1, bs);
    }
    for (int k = nd; k < B; k++, r++) { // dummy rows: no KV write, attend to one key of block 0
        ((int32_t *)b->io.ids.h)[r] = 0;
        ((int32_t *)b->io.pos.h)[r] = 0;
        ((int32_t *)b->io.slot.h)[r] = -1;
        ctx_dec[k] = 1;
        memset(btab_dec + (size_t)k * mb_dec, 0, (size_t)mb_dec * 4);
    }
    int n_samp = 0;
    if (pure) {
        for (int k = 0; k < nd; k++)
            b->io.row_seq[n_samp++] = b->io.order[k];
    } else {
        for (int k = 0; k < nd; k++)
            if (seqs[b->io.order[k]].sample) {
                last[n_samp] = k;
                b->io.row_seq[n_samp++] = b->io.order[k];
            }
    }
    for (int k = 0; k < np; k++) {
        const struct be_seq *s = &seqs[b->io.order[nd + k]];
        qs_pre[k] = r - nd;
        for (int t = 0; t < s->n_new; t++, r++)
            put_row(b, r, s, s->pos + t);
        ctx_pre[k] = s->pos + s->n_new;
        put_btab(btab_pre, k, mb_pre, s, s->pos + s->n_new, bs);
        if (s->sample) {
            last[n_samp] = r - 1;
            b->io.row_seq[n_samp++] = b->io.order[nd + k];
        }
    }
    qs_pre[np] = r - nd;
    if (r != rows || n_samp > S) {
        snprintf(b->base.err, sizeof b->base.err, "internal: %d rows laid out for %d, %d sampled rows", r,
                 rows, n_samp);
        return -1;
    }

    if (upload(b, &b->io.ids, (size_t)rows * 4) || upload(b, &b->io.pos, (size_t)rows * 4) ||
        upload(b, &b->io.slot, (size_t)rows * 4))
        return -1;
    if (B > 0 &&
        (upload(b, &b->io.ctx_dec, (size_t)B * 4) || upload(b, &b->io.btab_dec, (size_t)B * mb_dec * 4)))
        return -1;
    if (np > 0 &&
        (upload(b, &b->io.qs_pre, (size_t)(np + 1) * 4) || upload(b, &b->io.ctx_pre, (size_t)np * 4) ||
         upload(b, &b->io.btab_pre, (size_t)np * mb_pre * 4)))
        return -1;
    const int n_stage = np > 0 ? plan_stage(b, np, mb_pre) : 0;
    if (n_stage < 0)
        return -1;
    if (!pure && n_samp > 0 && upload(b, &b->io.last_rows, (size_t)n_samp * 4))
        return -1;
    if (n_samp > 0 && put_sampler_inputs(b, seqs, n_samp))
        return -1;

    const int hk = graph ? 0 : 1; // host time sums: graph or eager step
    double *ht = b->ht.t[hk], t1 = llmq_mono_s(), t2;
    if (b->ht.returned > 0)
        ht[CB_HT_BETWEEN] += t_enter - b->ht.returned;
    ht[CB_HT_PREPARE] += t1 - t_enter;
    b->ht.steps[hk]++;

    struct cb_plan p;
    memset(&p, 0, sizeof p);
    p.T = rows;
    p.nd = B;
    p.np = np;
    p.dec.n_seqs = B;
    p.dec.q_start = b->acts.qs_dec;
    p.dec.ctx_len = (const int32_t *)b->io.ctx_dec.d;
    p.dec.block_tables = (const int32_t *)b->io.btab_dec.d;
    p.dec.max_blocks = mb_dec;
    p.dec.max_q_len = 1;
    p.dec.max_ctx_len = dec_ctx;
    p.pre.n_seqs = np;
    p.pre.q_start = (const int32_t *)b->io.qs_pre.d;
    p.pre.ctx_len = (const int32_t *)b->io.ctx_pre.d;
    p.pre.block_tables = (const int32_t *)b->io.btab_pre.d;
    p.pre.max_blocks = mb_pre;
    p.pre.max_q_len = max_q_pre;
    p.pre.max_ctx_len = max_ctx_pre;
    p.n_logits = pure ? B : n_samp; // a padded graph computes logits for its dummy rows too
    p.gather = !pure;
    p.n_stage = n_stage;
    p.stage = b->stage.groups;
    if (graph) {
        if (cb_graph_run(b, &p, B, gctx))
            return -1;
    } else {
        if (cb_forward(b, &p))
            return -1;
        b->graphs.eager_steps++;
    }

    t2 = llmq_mono_s();
    ht[CB_HT_FORWARD] += t2 - t1;
    if (n_samp > 0) {
        if (put_masks(b, seqs, n_samp) || cb_enqueue_sample(b, seqs, n_samp, b->io.out.h, b->copy.ev_out))
            return -1;
    } else {
        CB_CUDA(cudaEventRecord(b->copy.ev_out, b->stream));
    }
    // the next pure decode step, guessed and enqueued before this one's tokens are read (cuda_spec.cu)
    if (graph && n_samp == nd && nd > 0)
        cb_spec_guess(b, seqs, nd, B, gctx);
    t1 = llmq_mono_s();
    ht[CB_HT_SAMPLER] += t1 - t2;
    CB_CUDA(cudaEventSynchronize(b->copy.ev_out));
    t2 = llmq_mono_s();
    ht[CB_HT_WAIT] += t2 - t1;
    if (cb_read_outputs(b, seqs, n_samp, b->io.out.h, out))
        return -1;
    ht[CB_HT_READ] += llmq_mono_s() - t2;
    if (b->spec.live)
        cb_spec_expect(b, nd, (const int32_t *)b->io.out.h);
    return 0;
}

// The sampler on stream, then the copy of its outputs into host on copy.stream, then done recorded after
// the copy.
int cb_enqueue_sample(struct cuda_backend *b, const struct be_seq *seqs, int n_samp, void *host,
                      cudaEvent_t done)
{
    const int S = b->max_seqs;
    char *o = (char *)b->io.out.d;
    int32_t *tok = (int32_t *)o;
    float *lp = (float *)(o + (size_t)S * 4);
    int32_t *top_ids = (int32_t *)(o + (size_t)S * 8);
    float *top_lp = (float *)(o + (size_t)S * 8 + (size_t)S * CB_TOP * 4);
    CB_CUDA(cudaStreamWaitEvent(b->stream, b->copy.ev_copied, 0)); // the previous copy back has read out.d
    CB_K(k_sample(b->acts.logits, n_samp, b->V, (const struct k_sample_params *)b->io.params.d,
                  (const int32_t *)b->io.hist.d, (const int32_t *)b->io.hist_start.d,
                  (const int32_t *)b->io.n_prompt.d, (const int32_t *)b->io.banned.d,
                  (const int32_t *)b->io.banned_start.d, (const uint32_t *)b->io.allow.d,
                  (const int32_t *)b->io.allow_row.d, tok, lp, top_ids, top_lp, b->acts.samp_ws,
                  b->acts.samp_ws_bytes, b->stream));
    bool want_top = false;
    for (int j = 0; j < n_samp; j++) {
        const struct be_seq *s = &seqs[b->io.row_seq[j]];
        want_top |= s->sample && s->sp->logprobs > 0;
    }
    size_t bytes = want_top ? b->io.out.cap : (size_t)S * 8;
    cudaStream_t cs = b->copy.stream;
    CB_CUDA(cudaEventRecord(b->copy.ev_sampled, b->stream));
    CB_CUDA(cudaStreamWaitEvent(cs, b->copy.ev_sampled, 0));
    CB_CUDA(cudaMemcpyAsync(host, b->io.out.d, bytes, cudaMemcpyDeviceToHost, cs));
    CB_CUDA(cudaEventRecord(b->copy.ev_copied, cs));
    CB_CUDA(cudaEventRecord(done, cs));
    return 0;
}

int cb_read_outputs(struct cuda_backend *b, const struct be_seq *seqs, int n_samp, const void *host,
                    struct be_out *out)
{
    const int S = b->max_seqs;
    const char *o = (const char *)host;
    const int32_t *tok = (const int32_t *)o;
    const float *lp = (const float *)(o + (size_t)S * 4);
    const int32_t *top_ids = (const int32_t *)(o + (size_t)S * 8);
    const float *top_lp = (const float *)(o + (size_t)S * 8 + (size_t)S * CB_TOP * 4);
    for (int j = 0; j < n_samp; j++) {
        int i = b->io.row_seq[j];
        const struct be_seq *s = &seqs[i];
        if (!s->sample)
            continue;
        struct be_out *bo = &out[i];
        if (tok[j] == -1) { // this sequence alone fails (backend_ops.step); the first one's reason is kept
            if (!b->base.err[0])
                snprintf(b->base.err, sizeof b->base.err,
                         "sequence %d: sampling: a NaN or +inf logit, or no id left to sample (the GPU "
                         "sampler returned no token)",
                         i);
            bo->token = -1;
            continue;
        }
        if (tok[j] < 0 || tok[j] >= b->V) {
            snprintf(b->base.err, sizeof b->base.err,
                     "sequence %d: the GPU sampler returned token %d, outside the vocabulary of %d", i,
                     tok[j], b->V);
            return -1;
        }
        bo->token = tok[j];
        bo->logprob = s->sp->logprobs >= 0 ? lp[j] : 0.0f;
        int nt = s->sp->logprobs > 0 ? s->sp->logprobs : 0;
        nt = nt > CB_TOP ? CB_TOP : nt;
        bo->n_top = nt;
        for (int t = 0; t < nt; t++) {
            bo->top_ids[t] = top_ids[(size_t)j * CB_TOP + t];
            bo->top_logprobs[t] = top_lp[(size_t)j * CB_TOP + t];
        }
    }
    return 0;
}

static int cb_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    struct cuda_backend *b = (struct cuda_backend *)be;
    const double t_enter = llmq_mono_s();
    if (b->broken) // be->err still holds the error that broke it
        return -1;
    be->err[0] = 0;
    if (n <= 0)
        return 0;
    cudaError_t de = cudaSetDevice(b->device); // the caller's thread may not have selected it
    if (de != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaSetDevice", de);
        return -1;
    }
    if (n > b->max_seqs) {
        snprintf(be->err, sizeof be->err,
                 "%d sequences in one step; this backend was opened for max_num_seqs %d", n, b->max_seqs);
        return -1;
    }
    int64_t T = 0;
    for (int i = 0; i < n; i++) {
        if (backend_check_seq(&b->base, &seqs[i], i, b->V, b->max_model_len))
            return -1;
        T += seqs[i].n_new;
    }
    if (T > b->max_tokens) {
        snprintf(be->err, sizeof be->err,
                 "%lld tokens in one step; this backend was opened for max_num_batched_tokens %d",
                 (long long)T, b->max_tokens);
        return -1;
    }
    const int prev_f16 = k_f16();
    k_set_f16(b->f16);
    int rc = run_step(b, seqs, n, out, t_enter);
    k_set_f16(prev_f16);
    if (rc)
        after_failure(b);
    // the tuning file also every CB_TUNING_SAVE_S while new choices come, not only at close, so that a
    // worker killed without closing keeps what it timed (a save with nothing new returns at once)
    if (rc == 0 && b->tuning.on && t_enter - b->tuning.saved >= b->tuning.save_s) {
        b->tuning.saved = t_enter;
        tuning_save(b, false);
    }
    b->ht.returned = llmq_mono_s();
    return rc;
}
