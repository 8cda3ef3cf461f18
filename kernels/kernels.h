/* C-callable launchers of llmq's CUDA kernels: the contract between kernels/<family>.cu, the
 * CUDA backend (kernels/cuda_backend.cu) and the kernel tests (tests/gpu/test_k_*.cu).
 *
 * Conventions
 * - Every pointer is device memory unless its comment says "host". Everything runs on `stream`;
 *   nothing synchronizes. Launchers check their arguments, launch, check the launch, and return
 *   0, or -1 with the reason (file:line and CUDA's message) in k_last_error() (thread-local).
 * - bf16 is __nv_bfloat16. Activations are row-major [tokens, features]. Weights are row-major
 *   [out, in] as in Hugging Face checkpoints; the fused QKV weight is [(H + 2*KVH) * D, C] (q rows,
 *   then k, then v) and the fused gate/up weight is [2 * F, C] (gate rows, then up).
 * - The residual stream is fp32 (accuracy against the fp32 CPU oracle costs nothing measurable:
 *   tokens x hidden x 4 bytes).
 * - Paged KV cache, per layer: k_cache and v_cache are [num_blocks][KVH][block_size][D] bf16. A
 *   token's slot is block_table[pos / block_size] * block_size + pos % block_size; a block of one
 *   KV head is block_size * D contiguous elements.
 * - Only kernels/ and tests/gpu/ include this header (it includes CUDA headers). */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef __nv_bfloat16 bf16;

/* ---- errors (kernels/cuda_check.cu) */
const char *k_last_error(void);
/* Records "file:line: what: CUDA message" as the last error; returns -1. */
int k_fail(const char *file, int line, const char *what, cudaError_t e);
#define K_CHECK(call)                                                                                              \
    do {                                                                                                           \
        cudaError_t k_e_ = (call);                                                                                 \
        if (k_e_ != cudaSuccess)                                                                                   \
            return k_fail(__FILE__, __LINE__, #call, k_e_);                                                        \
    } while (0)
#define K_CHECK_LAUNCH() K_CHECK(cudaGetLastError())
/* Records "file:line: " + a printf-style message (bad arguments, cuBLAS failures); returns -1. */
int k_failf(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* In a launcher: fails with the message unless cond holds, e.g. K_REQUIRE(D % 2 == 0, "D %d odd", D). */
#define K_REQUIRE(cond, ...)                                                                                       \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            return k_failf(__FILE__, __LINE__, __VA_ARGS__);                                                       \
    } while (0)

/* ---- embedding.cu: out[t, :] = table[ids[t], :] (ids checked against vocab: out of range -> zeros) */
int k_embedding(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden, bf16 *out,
                cudaStream_t stream);
/* The same into the fp32 residual stream. */
int k_embedding_f32(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden, float *out,
                    cudaStream_t stream);

/* ---- rmsnorm.cu (RMSNorm as Hugging Face computes it, in fp32: x * rsqrt(mean(x^2) + eps) * w)
 * k_rmsnorm:      out = norm(residual) * w
 * k_add_rmsnorm:  residual += x (x bf16, a sublayer's output); out = norm(residual) * w
 * rows = tokens, cols = hidden. out may not alias x. */
int k_rmsnorm(const float *residual, const bf16 *w, bf16 *out, int rows, int cols, float eps, cudaStream_t stream);
int k_add_rmsnorm(float *residual, const bf16 *x, const bf16 *w, bf16 *out, int rows, int cols, float eps,
                  cudaStream_t stream);

/* ---- rope.cu: the attention prologue, one kernel.
 * qkv: [T, (H + 2*KVH) * D] (the fused QKV GEMM output). For each token t:
 *   1. bias (if not NULL, [(H + 2*KVH) * D]) is added to q, k and v;
 *   2. q heads and k heads get a per-head RMSNorm with q_norm / k_norm ([D]) when not NULL (Qwen3);
 *   3. q and k get NeoX RoPE (rotate_half) at positions[t]: angle_i = positions[t] * inv_freq[i]
 *      (inv_freq [D/2], fp32, from backend_rope_freqs), cos and sin multiplied by attn_scale (1 except yarn);
 *   4. q is written back in place; k and v are written to the cache slot slot_mapping[t] (< 0: skip).
 * All arithmetic in fp32; one rounding to bf16 at each store. */
int k_qk_norm_rope_kv(bf16 *qkv, const bf16 *bias, const bf16 *q_norm, const bf16 *k_norm, float eps,
                      const int32_t *positions, const float *inv_freq, float attn_scale,
                      const int32_t *slot_mapping, bf16 *k_cache, bf16 *v_cache, int T, int H, int KVH, int D,
                      int block_size, cudaStream_t stream);

/* ---- activation.cu: out[t, f] = silu(gate_up[t, f]) * gate_up[t, F + f], fp32 math */
int k_silu_mul(const bf16 *gate_up, bf16 *out, int T, int F, cudaStream_t stream);

/* ---- gemm.cu: cuBLASLt, Y[M, N] = X[M, K] · W[N, K]^T, bf16 inputs, fp32 accumulation; Y bf16,
 * or fp32 when y_f32 (logits). The algorithm is chosen once per (M, N, K, y_f32) by the library's
 * heuristic (and cached); the handle owns a workspace. Not thread-safe; one per stream. */
struct k_gemm;
struct k_gemm *k_gemm_create(size_t workspace_bytes);
void k_gemm_free(struct k_gemm *g);
int k_gemm_bf16(struct k_gemm *g, const bf16 *X, const bf16 *W, void *Y, int y_f32, int M, int N, int K,
                cudaStream_t stream);

/* ---- attention.cu: causal attention over the paged cache (K and V of the step's new tokens are
 * already written by k_qk_norm_rope_kv). Batch description (device arrays unless noted):
 *   q_start[n_seqs + 1]  query rows of sequence s are q_start[s] .. q_start[s+1]-1 (cumulative)
 *   ctx_len[n_seqs]      keys of sequence s: positions 0 .. ctx_len[s]-1; its n_q = q_start[s+1]-q_start[s]
 *                        queries sit at positions ctx_len[s] - n_q .. ctx_len[s] - 1 (causal within)
 *   block_tables         [n_seqs][max_blocks] physical block ids
 *   max_q_len, max_ctx_len (host) upper bounds for grid sizing.
 * q rows have stride q_stride elements (q sits inside the qkv buffer: q_stride = (H + 2*KVH) * D);
 * out is [total_q, H * D]. scale = 1 / sqrt(D). Softmax in fp32. */
struct k_attn_batch {
    int n_seqs;
    const int32_t *q_start;
    const int32_t *ctx_len;
    const int32_t *block_tables;
    int max_blocks;
    int max_q_len;   /* host */
    int max_ctx_len; /* host */
};
/* FlashAttention-2 style (tensor cores, online softmax), any n_q per sequence. */
int k_attention_prefill(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                        const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size, float scale,
                        cudaStream_t stream);
/* One query per sequence (q_start[s] = s), GQA-aware, split over the context for long sequences.
 * workspace: at least k_attention_decode_workspace(...) bytes. */
size_t k_attention_decode_workspace(int n_seqs, int H, int D, int max_ctx_len);
int k_attention_decode(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                       const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size, float scale,
                       void *workspace, size_t workspace_bytes, cudaStream_t stream);
/* k_attention_decode with the split chosen by the caller (tests, tuning): part_keys keys per partition
 * (rounded up to a multiple of 64), 0 = automatic (what k_attention_decode does), -1 = no split (one
 * CTA per sequence and KV head). Its workspace: k_attention_decode_workspace_split(..., part_keys). */
size_t k_attention_decode_workspace_split(int n_seqs, int H, int D, int max_ctx_len, int part_keys);
int k_attention_decode_split(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                             const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size,
                             float scale, int part_keys, void *workspace, size_t workspace_bytes,
                             cudaStream_t stream);

/* ---- sampling.cu: the GPU sampler, the same function as engine/sampler.c (the oracle).
 * logits [n, V] fp32 (raw model logits), one row per sequence to sample. Per row (device arrays):
 *   params[r]          struct k_sample_params
 *   hist / hist_start  token history for penalties: row r's tokens are hist[hist_start[r] .. hist_start[r+1]),
 *                      the first n_prompt[r] of them prompt, the rest output
 *   banned / banned_start  ids that must not be sampled (same CSR layout)
 * Outputs: token[r]; logprob[r] (log-softmax of raw logits at token); top_ids/top_lp [n][20] (the first
 * params[r].logprobs entries valid, descending, ties by lower id). The random number is
 * sampling_uniform(seed, step) of engine/sampling.h, bit for bit. logits may be modified in place.
 * token[r] = -1 (logprob NaN) where samp_sample would fail: a NaN or +inf logit, or no id left after
 * penalties and bans. hist/hist_start/n_prompt and banned/banned_start may be NULL (none); logprob and
 * top_ids/top_lp may be NULL (not written; top entries past N are -1 / -inf). V <= 2^20.
 * workspace: at least k_sample_workspace(n, V) bytes (about n * V * 4), 16-byte aligned, no init. */
struct k_sample_params {
    float temperature, top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
    int logprobs; /* -1 none, 0 chosen only, N top N */
    uint64_t seed;
    uint64_t step; /* tokens generated so far */
};
size_t k_sample_workspace(int n, int V);
int k_sample(float *logits, int n, int V, const struct k_sample_params *params, const int32_t *hist,
             const int32_t *hist_start, const int32_t *n_prompt, const int32_t *banned, const int32_t *banned_start,
             int32_t *token, float *logprob, int32_t *top_ids, float *top_lp, void *workspace,
             size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
