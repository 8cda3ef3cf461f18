/* C-callable launchers of llmq's CUDA kernels: the contract between kernels/<family>.cu, the
 * CUDA backend (kernels/cuda_backend.cu) and the kernel tests (tests/gpu/test_k_*.cu).
 *
 * Conventions
 * - Every pointer is device memory unless its comment says "host". Everything runs on `stream`;
 *   nothing synchronizes. Launchers check their arguments, launch, check the launch, and return
 *   0, or -1 with the reason (file:line and CUDA's message) in k_last_error() (thread-local).
 * - The kernels of a step are launched with programmatic dependent launch (kernels/launch.cuh): a
 *   launch may start before the previous kernel on the stream ends, and waits for it on the device.
 * - bf16 is __nv_bfloat16 -- or IEEE fp16 (__half) while the calling thread is in fp16 mode
 *   (k_set_f16 below; model.dtype fp16): every 16-bit tensor a launcher takes as `bf16` (activations,
 *   16-bit weights, the 16-bit KV cache) then holds fp16 bits, and the kernels compute as they do in
 *   bf16 with fp16 roundings (kernels/elt16.cuh). The fp8 launchers (k_gemm_fp8, k_gemv_fp8*,
 *   quant.cu, the *_fp8 attention and kv_stage) are bf16 only and fail in fp16 mode.
 *   Activations are row-major [tokens, features]. Weights are row-major
 *   [out, in] as in Hugging Face checkpoints; the fused QKV weight is [(H + 2*KVH) * D, C] (q rows,
 *   then k, then v) and the fused gate/up weight is [2 * F, C] (gate rows, then up).
 * - The residual stream is fp32 (accuracy against the fp32 CPU oracle costs nothing measurable:
 *   tokens x hidden x 4 bytes).
 * - Paged KV cache, per layer: k_cache and v_cache are [num_blocks][KVH][block_size][D] bf16. A
 *   token's slot is block_table[pos / block_size] * block_size + pos % block_size; a block of one
 *   KV head is block_size * D contiguous elements.
 * - fp8 KV cache (the *_fp8 launchers; docs/CUDA_BACKEND.md, "FP8 KV cache"): k_cache and v_cache
 *   hold e4m3 (OCP fn) bytes in the same layout, with k_scale and v_scale [num_blocks][KVH][block_size]
 *   fp32 beside them: the value of element d of a (token, KV head) vector is
 *   e4m3(cache[slot, d]) * scale[slot], scale = amax / 448 over the vector's D values (0 for a zero
 *   vector). Written by k_qk_norm_rope_kv_fp8, read by k_attention_prefill_fp8 / k_attention_decode_fp8.
 * - Only kernels/, tests/gpu/ and the lab (contrib/lab) include this header (it includes CUDA headers). */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdbool.h>
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

/* ---- diagnostics.cu: the environment variables the kernels read (LLMQ_PDL, LLMQ_PDL_SKIP, LLMQ_GEMM_LOG;
 * docs/KERNELS.md, "Diagnostics"), read once per process. err is "" or says which value is bad (the CUDA
 * backend then fails to open); set lists the variables set ("" when none), for the log. */
struct k_diag {
    bool pdl;             /* LLMQ_PDL: launch with programmatic dependent launch (default true) */
    const char *pdl_skip; /* LLMQ_PDL_SKIP: names of kernels launched without it; NULL when unset */
    bool gemm_log;        /* LLMQ_GEMM_LOG: print each cuBLASLt plan and k_linear choice (default false) */
    char err[256];
    char set[512];
};
const struct k_diag *k_diag(void);

/* ---- launch.cu: the 16-bit element type of the calling thread's launches (above): 0 bf16 (the
 * default of every thread), 1 fp16. A launcher reads it when it is called; a CUDA graph keeps the
 * kernels its capture launched. */
void k_set_f16(int on);
int k_f16(void);

/* ---- embedding.cu: out[t, :] = table[ids[t], :] into the fp32 residual stream (ids checked against
 * vocab: out of range -> zeros) */
int k_embedding_f32(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden, float *out,
                    cudaStream_t stream);

/* ---- rmsnorm.cu (RMSNorm as Hugging Face computes it, in fp32: x * rsqrt(mean(x^2) + eps) * w)
 * k_rmsnorm:      out = norm(residual) * w
 * k_add_rmsnorm:  residual += x (x bf16, a sublayer's output); out = norm(residual) * w
 * rows = tokens, cols = hidden. out may not alias x. */
int k_rmsnorm(const float *residual, const bf16 *w, bf16 *out, int rows, int cols, float eps, cudaStream_t stream);
int k_add_rmsnorm(float *residual, const bf16 *x, const bf16 *w, bf16 *out, int rows, int cols, float eps,
                  cudaStream_t stream);
/* k_add_parts_rmsnorm: the same with x = E(parts[0] + ... + parts[ks - 1]) (fp32 [ks][rows][cols], summed
 * in part order from 0 and rounded to the 16-bit type E: what a split-K GEMV's last part stores, see
 * k_gemv_fp8_parts), so that the GEMV need not add its parts itself. 1 <= ks <= K_GEMV_MAX_SPLIT. The
 * residual is k_add_rmsnorm's on that x bit for bit; so is out for at most 4 parts and rows of at most
 * 8192 columns (the same block layout; otherwise within one rounding of it). */
int k_add_parts_rmsnorm(float *residual, const float *parts, int ks, const bf16 *w, bf16 *out, int rows,
                        int cols, float eps, cudaStream_t stream);

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
/* The same with an fp8 cache: each (token, KV head) vector of k (after norm and RoPE) and of v is
 * quantized from fp32 once: amax = max |x_d|, codes e4m3_rn_satfinite(x_d * (448 / amax)) (IEEE
 * division and product, as engine/dtype.h's f32_to_e4m3 rounds), k_scale/v_scale[slot] = amax / 448;
 * a zero vector gets codes 0 and scale 0. q stays bf16 in place. D in {16, 32, 64, 128, 256}, every
 * buffer 16-byte aligned (the scales 4-byte). */
int k_qk_norm_rope_kv_fp8(bf16 *qkv, const bf16 *bias, const bf16 *q_norm, const bf16 *k_norm, float eps,
                          const int32_t *positions, const float *inv_freq, float attn_scale,
                          const int32_t *slot_mapping, uint8_t *k_cache, uint8_t *v_cache, float *k_scale,
                          float *v_scale, int T, int H, int KVH, int D, int block_size, cudaStream_t stream);

/* ---- activation.cu: out[t, f] = silu(gate_up[t, f]) * gate_up[t, F + f], fp32 math */
int k_silu_mul(const bf16 *gate_up, bf16 *out, int T, int F, cudaStream_t stream);

/* ---- gemm.cu: cuBLASLt, Y[M, N] = X[M, K] · W[N, K]^T, bf16 inputs, fp32 accumulation; Y bf16,
 * or fp32 when y_f32 (logits). The algorithm is chosen once per (type, M, N, K, y_f32, alignments) and
 * cached: the library's heuristic pick, or for M <= 256 the fastest of its candidates timed once per
 * tune bucket of M; the handle owns a workspace. Not thread-safe; one per stream.
 * k_gemm_create loads cuBLASLt first (k_cublaslt_load, kernels/cublaslt_loader.h): NULL, with the
 * file(s) tried and dlerror()'s reason in k_last_error(), when the library cannot be loaded. */
struct k_gemm;
struct k_gemm *k_gemm_create(size_t workspace_bytes);
void k_gemm_free(struct k_gemm *g);
/* How a handle's cuBLASLt plans got their algorithms so far: tuned = timed over candidates on the
 * call's operands (M <= 256, outside a graph capture); borrowed = taken from a timed plan of the
 * same tune bucket (kernels/gemm.cu); loaded = plans and k_linear choices taken from the tuning file;
 * made = those the tuning file keeps (plans of M <= 256, k_linear's choices) made without it. Plans
 * of larger M take the heuristic's pick, the same in every process, and count in none of these. */
struct k_gemm_counts {
    int tuned, borrowed, loaded, made;
};
void k_gemm_get_counts(const struct k_gemm *g, struct k_gemm_counts *c);
/* k_linear's choice between the GEMV and cuBLASLt where both can run (the values of engine/backend.h's
 * enum be_gemm_pick): TIMED, the faster on the first call of a shape (the default); GEMV or CUBLASLT
 * wherever that path can run (tests, to compare runs whose timings could choose differently). */
enum { K_GEMM_PICK_TIMED = 0, K_GEMM_PICK_GEMV = 1, K_GEMM_PICK_CUBLASLT = 2 };
void k_gemm_set_pick(struct k_gemm *g, int pick);
/* The tuning file (engine.gemm_tuning_file; its format in engine/gemm_tuning.h): k_gemm_use_tuning_file
 * reads path into the handle when it was written for this device, cuBLASLt, CUDA runtime, llmq version
 * and workspace; from then on a plan or k_linear choice whose key is in the file takes the file's choice
 * (cuBLASLt's algorithm once cublasLtMatmulAlgoCheck accepts it for the shape; else it is made as
 * without the file) instead of timing: the same algorithms, so the same bits, as the run that wrote it.
 * Returns a GEMM_TUNING_* result of gemm_tuning_load, with msg (msglen bytes) saying what happened.
 * Unless the file is GEMM_TUNING_FOREIGN (not a tuning file, or unreadable: never written),
 * k_gemm_save_tuning writes it with the file's entries and every choice the handle made since:
 * 1 written, 0 nothing new (or no file in use), -1 failed (msg). Call both on the handle's device. */
int k_gemm_use_tuning_file(struct k_gemm *g, const char *path, char *msg, size_t msglen);
int k_gemm_save_tuning(struct k_gemm *g, char *msg, size_t msglen);
int k_gemm_bf16(struct k_gemm *g, const bf16 *X, const bf16 *W, void *Y, int y_f32, int M, int N, int K,
                cudaStream_t stream);

/* k_gemm_fp8: the same product on block-scaled FP8 (cuBLASLt on Hopper). cuBLASLt's block-scaled
 * modes need both scale tensors' leading dimensions to be multiples of 4, hence the padded layouts:
 *   W e4m3 [N, K] with fp32 scales w_scale [ceil(N/128)][K_FP8_KB(K)] row-major, K_FP8_KB(K) =
 *     round_up(ceil(K/128), 4): the checkpoints' weight_scale_inv layout [ceil(N/128)][ceil(K/128)]
 *     with each row padded (padding values are read and multiply only zero-contribution columns;
 *     any finite value, e.g. 0 or 1). It IS the checkpoint layout when ceil(K/128) % 4 == 0.
 *   X e4m3 [Mp, K] with Mp = K_FP8_ROWS(M) = round_up(M, 4) rows, fp32 scales x_scale
 *     [ceil(K/128)][Mp] (one per row and 128-column group, stored M-contiguous: x_scale[g * Mp + m],
 *     what k_quant_fp8_act / k_add_rmsnorm_fp8 / k_silu_mul_fp8 write).
 *   Y [Mp, N]: Y must hold Mp rows too.
 * Rows M..Mp-1 of Xq, x_scale and Y are scratch: read and written by the GEMM, contents meaningless
 * (rows are independent, so stale data there affects only those rows; keep them free of e4m3 NaN
 * codes, e.g. zero the buffers once at allocation). Y = sum over k of (Xq * x_scale)(Wq * w_scale),
 * fp32 accumulation, bf16 (or fp32 with y_f32). K and N multiples of 16 and 16-byte aligned operands;
 * k_linear takes k_gemv_fp8 at M = 1 (cuBLASLt may offer no algorithm there). Plans live in the same
 * cache as the bf16 ones (keyed with the dtype and Mp); decode-sized M are tuned the same way. */
#define K_FP8_ROWS(M) ((((M) + 3) / 4) * 4)
#define K_FP8_KB(K) (((((K) + 127) / 128 + 3) / 4) * 4)
int k_gemm_fp8(struct k_gemm *g, const uint8_t *Xq, const float *x_scale, const uint8_t *W, const float *w_scale,
               void *Y, int y_f32, int M, int N, int K, cudaStream_t stream);

/* One linear layer's weight for k_linear: bf16 [N, K], or (fp8 != 0) e4m3 [N, K] with fp32 block
 * scales: scale in the checkpoint layout [ceil(N/128)][ceil(K/128)] (what k_gemv_fp8 reads) and
 * scale_lt in k_gemm_fp8's padded layout [ceil(N/128)][K_FP8_KB(K)] (NULL: scale is used, correct
 * only when ceil(K/128) % 4 == 0, where the two layouts coincide). */
struct k_weight {
    int fp8;
    const void *w;      /* bf16 or uint8_t (e4m3) */
    const float *scale; /* fp8 only */
    int N, K;
    const float *scale_lt; /* fp8 only; may be NULL (see above) */
};
/* Y[M, N] = X[M, K] . W^T through the fastest path for the shape, the backend's single entry point
 * (fp8 W: Xq, x_scale and Y follow k_gemm_fp8's K_FP8_ROWS(M)-row layout whenever Xq is given):
 *   bf16 W: k_gemm_bf16, or for M <= K_GEMV_MAX_M k_gemv_bf16 when it measured faster;
 *   fp8 W:  k_gemm_fp8 on (Xq, x_scale), or for M <= K_GEMV_MAX_M k_gemv_fp8 on X when it measured
 *           faster (always at M = 1).
 * The inputs a caller has: X bf16 (may be NULL when M > K_GEMV_MAX_M and W is fp8 with Xq given),
 * Xq/x_scale (fp8 W only; may be NULL when X is given and M <= K_GEMV_MAX_M). The choice between
 * GEMV and cuBLASLt is made once per (dtype, M, N, K, y_f32, alignments) on the first call that is
 * not being captured into a graph: both run on the call's operands, one warm-up then the median of
 * three (cudaEvent timing, which synchronizes the stream), and the faster is kept in the plan cache;
 * while capturing with no choice made, GEMV is taken and nothing is cached (k_gemm_set_pick can pin
 * the choice; LLMQ_GEMM_LOG=1 prints each one). */
int k_linear(struct k_gemm *g, const bf16 *X, const uint8_t *Xq, const float *x_scale, const struct k_weight *w,
             void *Y, int y_f32, int M, cudaStream_t stream);
/* Whether k_linear may read Xq/x_scale for this weight at M rows (fp8 W and M > 1); when it may not, a
 * caller need not quantize W's input. */
int k_linear_takes_xq(const struct k_weight *w, int M);

/* ---- gemv.cu: Y[M, N] = X[M, K] · W[N, K]^T for decode-sized M (1 .. K_GEMV_MAX_M), a kernel that
 * streams the weight matrix once at (close to) the copy bandwidth, which cuBLASLt does not at these
 * M. X bf16 row-major; fp32 accumulation, one rounding at the store; Y bf16, or fp32 when y_f32.
 * K must be a multiple of 16 (16-byte rows). Any N >= 1.
 * k_gemv_fp8: W is e4m3 (OCP fn) row-major [N, K] with fp32 block scales w_scale
 * [ceil(N/128)][ceil(K/128)] (row-major; the value of W[n][k] is e4m3(W[n][k]) * w_scale[n/128][k/128],
 * the layout of the checkpoints' weight_scale_inv); X stays bf16 (not quantized). e4m3 NaN codes
 * (0x7f, 0xff) are not expected in weights (they decode as +-480).
 * M = 0 is a no-op (returns 0, pointers unused). X and W must be 16-byte aligned; Y needs only its
 * element alignment. Deterministic (fixed summation order), no atomics, no host synchronization: safe
 * inside CUDA graph capture. The tensor cores do the products (mma.sync, sm_80+). The kernel's
 * configuration (warps per CTA, loads in flight) follows from N and the weight type (kernels/gemv.cu).
 * Split K: the same product with K cut into ks parts (1..K_GEMV_MAX_SPLIT; 0 = the automatic choice,
 * which splits only shapes of one partial wave whose warps would walk many chunks each, e.g.
 * Qwen3-14B's down projection). Each part's CTA writes fp32 partial sums into ws and the last part of
 * a tile to finish adds them in part order (still deterministic) and stores Y. ws: K_GEMV_WS_BYTES of
 * device memory, zeroed once before first use (every launch leaves its tickets at zero), used by one
 * stream (launches on it run one after another); NULL = no split (ks 0 then means 1). */
#define K_GEMV_MAX_M 8
#define K_GEMV_MAX_SPLIT 8
#define K_GEMV_WS_TICKETS 16384
#define K_GEMV_WS_BYTES ((size_t)4 << 20)
int k_gemv_bf16(const bf16 *X, const bf16 *W, void *Y, int y_f32, int M, int N, int K, int ks, void *ws,
                cudaStream_t stream);
int k_gemv_fp8(const bf16 *X, const uint8_t *W, const float *w_scale, void *Y, int y_f32, int M, int N, int K,
               int ks, void *ws, cudaStream_t stream);
/* k_gemv_fp8_parts: k_gemv_fp8's split of K without its last step: parts [ks][M][N] fp32 gets each
 * part's sums, and the caller adds them (k_add_parts_rmsnorm does, in part order, with the rounding the
 * GEMV's store would make). No workspace, no ticket: the launch ends as soon as its last CTA's sums are
 * stored. ks: 1..K_GEMV_MAX_SPLIT, or 0 for the automatic choice of k_gemv_fp8; capped at K's
 * chunks. parts holds ks * M * N floats (K_GEMV_MAX_SPLIT * M * N covers ks = 0). Returns the number of
 * parts written (>= 1; M = 0 writes nothing and returns 1), or -1. */
int k_gemv_fp8_parts(const bf16 *X, const uint8_t *W, const float *w_scale, float *parts, int M, int N, int K,
                     int ks, cudaStream_t stream);
/* k_gemv_fp8_glu: the gate/up projection and SwiGLU in one launch for decode-sized M: W is the fused
 * gate_up matrix in k_gemv_fp8's format with 2F rows (gate rows 0..F-1, then up rows F..2F-1; scales
 * [ceil(2F/128)][ceil(K/128)]), Y [M, F] bf16 = silu(X . W_gate^T) * (X . W_up^T), each product
 * rounded to bf16 first: bit for bit k_gemv_fp8 into a [M, 2F] buffer in its configuration for shapes of
 * at least one 16-row tile per SM (or at M = 1 the mapping k_gemv_fp8_diag says) followed by
 * k_silu_mul, without the buffer and the second launch. F a multiple of 8 (a CTA's 8 up rows share one
 * scale block); X as for k_gemv_fp8. */
int k_gemv_fp8_glu(const bf16 *X, const uint8_t *W, const float *w_scale, bf16 *Y, int M, int F, int K,
                   cudaStream_t stream);
/* k_gemv_fp8_diag: whether the one-row fp8 GEMVs (M = 1, the configuration of a shape of at least one
 * 16-row tile per SM: k_gemv_fp8, k_gemv_fp8_parts, k_gemv_fp8_glu) run the diagonal mapping
 * (kernels/gemv.cu, gemv_diag_kernel: a load instruction reads 512 contiguous bytes of one row); the
 * same function, another fp32 summation order. on: 1 yes, 0 no, -1 leave as is (a query). Default: yes
 * on sm_90 devices of less than 4 TB/s nominal memory bandwidth (H100: faster there, not on the H200).
 * For the whole process; returns the setting before. */
int k_gemv_fp8_diag(int on);
/* A second copy of a matrix in the order the GEMV's lanes read it (kernels/gemv.cu, gemv_body's TL):
 * k_gemv_fp8_tile_order writes Wt (N x K bytes; glu: W is a fused gate/up matrix of 2N rows, 2N x K)
 * from W (e4m3 row-major), N a multiple of 16 (glu: of 8), K a multiple of 128; k_gemv_bf16_tile_order
 * the same for a bf16 W [N, K], K a multiple of 64. k_gemv_fp8_tiled(W, Wt, N, K, glu) and
 * k_gemv_bf16_tiled(W, Wt, N, K) register Wt as W's copy for the whole process (Wt NULL: forget it):
 * from then on k_gemv_fp8 and k_gemv_fp8_parts (glu 0, this N and K), k_gemv_fp8_glu (glu 1, F = N)
 * and k_gemv_bf16 (bf16 mode) read Wt instead of W (fp8: in place of the diagonal mapping too), for 1 to
 * K_GEMV_MAX_M rows; the same products in the same order, so the same bits. W stays the matrix of record
 * (w_scale and cuBLASLt read it); Wt must live until it is forgotten. */
int k_gemv_fp8_tile_order(const uint8_t *W, uint8_t *Wt, int N, int K, int glu, cudaStream_t stream);
int k_gemv_bf16_tile_order(const bf16 *W, bf16 *Wt, int N, int K, cudaStream_t stream);
int k_gemv_fp8_tiled(const uint8_t *W, const uint8_t *Wt, int N, int K, int glu);
int k_gemv_bf16_tiled(const bf16 *W, const bf16 *Wt, int N, int K);

/* ---- quant.cu: FP8 (OCP e4m3) quantization for the block-scaled GEMMs, bit for bit engine/fp8.h:
 * scale = amax / 448 (1 for an all-zero group, FLT_MIN where amax / 448 is below it), q = e4m3(v /
 * scale), round to nearest even, saturating. Activations are quantized in 1x128 groups (one scale per
 * row and 128 columns), scales stored M-contiguous with leading dimension Mp = K_FP8_ROWS(M):
 * x_scale[g * Mp + m], g < ceil(K/128) (entries m >= M are not written; x_scale holds
 * ceil(K/128) * Mp floats; Xq is [M, K], the caller sizes it Mp rows for k_gemm_fp8).
 * k_quant_fp8_weight: W bf16 [N, K] -> Wq [N, K] and w_scale [ceil(N/128)][ceil(K/128)] (the
 *   checkpoint layout, not k_gemm_fp8's padded one; 128x128
 *   blocks, partial at the edges). bad (may be NULL) is set to 1 when W holds a NaN or an infinity
 *   (Wq is then meaningless); it is never cleared.
 * k_quant_fp8_act: X bf16 [M, K] -> Xq [M, K], x_scale; K a multiple of 128.
 * The fused producers compute their bf16 output exactly as k_add_rmsnorm / k_silu_mul do (out may be
 * NULL: not written) and quantize that bf16 value, so their Xq equals k_quant_fp8_act of their out:
 * k_add_rmsnorm_fp8: x may be NULL (no add: k_rmsnorm); cols a multiple of 128.
 * k_silu_mul_fp8:    F a multiple of 128. */
int k_quant_fp8_weight(const bf16 *W, int N, int K, uint8_t *Wq, float *w_scale, int *bad, cudaStream_t stream);
int k_quant_fp8_act(const bf16 *X, int M, int K, uint8_t *Xq, float *x_scale, cudaStream_t stream);
int k_add_rmsnorm_fp8(float *residual, const bf16 *x, const bf16 *w, bf16 *out, uint8_t *outq, float *out_scale,
                      int rows, int cols, float eps, cudaStream_t stream);
int k_silu_mul_fp8(const bf16 *gate_up, bf16 *out, uint8_t *outq, float *out_scale, int T, int F,
                   cudaStream_t stream);

/* ---- attention_prefill.cu, attention_decode.cu: causal attention over the paged cache (K and V of the step's
 * new tokens are already written by k_qk_norm_rope_kv). Batch description (device arrays unless noted):
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
/* FlashAttention-2 style (tensor cores, online softmax), any n_q per sequence. On sm_90a at D = 128 the
 * products run on the warpgroup tensor cores (wgmma; a 16-bit cache's tiles come through tensor maps into
 * a warp-specialized kernel), elsewhere on mma.sync. block_size must be a power of two (a key's block is
 * found by a shift, as in the decode kernels). */
int k_attention_prefill(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                        const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size,
                        float scale, cudaStream_t stream);
/* One query per sequence (q_start[s] = s), GQA-aware, split over the context for long sequences.
 * block_size must be a power of two (as engine.block_size is; the decode kernels find a key's block by a
 * shift). workspace: at least k_attention_decode_workspace(...) bytes. */
size_t k_attention_decode_workspace(int n_seqs, int H, int D, int max_ctx_len);
int k_attention_decode(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                       const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size, float scale,
                       void *workspace, size_t workspace_bytes, cudaStream_t stream);
/* k_attention_decode with the split chosen by the caller (tests, tuning): part_keys keys per partition
 * (rounded up to a multiple of 64), 0 = automatic (what k_attention_decode does), -1 = no split (one
 * CTA per sequence and KV head). Its workspace: k_attention_decode_workspace_split(..., part_keys). */
size_t k_attention_decode_workspace_split(int n_seqs, int H, int D, int max_ctx_len, int part_keys);
/* The split a decode launch takes (host only, no GPU needed): the number of partitions for n_seqs
 * sequences whose longest context is max_ctx_len, part_keys as above (the same over a bf16 and an fp8
 * cache); *part (may be NULL) = keys per partition (max_ctx_len when it does not split). */
int k_attention_decode_parts(int n_seqs, int max_ctx_len, int part_keys, int *part);
int k_attention_decode_split(const bf16 *q, int q_stride, const bf16 *k_cache, const bf16 *v_cache,
                             const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size,
                             float scale, int part_keys, void *workspace, size_t workspace_bytes,
                             cudaStream_t stream);
/* k_qk_norm_rope_kv and k_attention_decode_split in one kernel, for a decode step over a 16-bit cache
 * (token row t = sequence s; the new token of sequence s at position ctx_len[s] - 1 = positions[s]):
 * every CTA normalizes and rotates the query heads it reads itself, and the CTA whose partition holds
 * the new key writes its k and v to the cache slot and uses them at once. qkv ([n_seqs, (H + 2*KVH) * D],
 * 16-byte aligned) is only read: q is not written back. Outputs and cache rows are those of the two
 * calls, bit for bit (one per-lane function, kernels/rope.cuh). D 64 or 128; bias and norms as in
 * k_qk_norm_rope_kv (NULL when absent, 16-byte aligned); part_keys and workspace as in
 * k_attention_decode_split. */
struct k_rope_in {
    const bf16 *bias, *q_norm, *k_norm;
    float eps;
    const int32_t *positions;    /* [n_seqs] */
    const float *inv_freq;       /* [D/2] */
    float attn_scale;
    const int32_t *slot_mapping; /* [n_seqs], < 0: no cache write */
};
int k_attention_decode_rope(const bf16 *qkv, const struct k_rope_in *rope, bf16 *k_cache, bf16 *v_cache,
                            const struct k_attn_batch *b, bf16 *out, int H, int KVH, int D, int block_size,
                            float scale, int part_keys, void *workspace, size_t workspace_bytes,
                            cudaStream_t stream);
/* The three over an fp8 cache (e4m3 k_cache/v_cache with k_scale/v_scale, layout above): the same
 * batch, outputs, workspace and splits. Tiles are read with 16-byte copies (16 codes each) and turned
 * into bf16 codes exactly; S[., key] is multiplied by k_scale[key] and P[., key] by v_scale[key] before
 * its bf16 rounding for P·V (the softmax sum takes the unscaled P). bf16 only: -1 in fp16 mode. */
int k_attention_prefill_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache, const uint8_t *v_cache,
                            const float *k_scale, const float *v_scale, const struct k_attn_batch *b, bf16 *out,
                            int H, int KVH, int D, int block_size, float scale, cudaStream_t stream);
int k_attention_decode_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache, const uint8_t *v_cache,
                           const float *k_scale, const float *v_scale, const struct k_attn_batch *b, bf16 *out,
                           int H, int KVH, int D, int block_size, float scale, void *workspace,
                           size_t workspace_bytes, cudaStream_t stream);
int k_attention_decode_split_fp8(const bf16 *q, int q_stride, const uint8_t *k_cache, const uint8_t *v_cache,
                                 const float *k_scale, const float *v_scale, const struct k_attn_batch *b,
                                 bf16 *out, int H, int KVH, int D, int block_size, float scale, int part_keys,
                                 void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* ---- kv_stage.cu: an fp8 cache's blocks as bf16, for the bf16 prefill attention (the engine's fp8 prefill:
 * docs/CUDA_BACKEND.md, "FP8 KV cache"). Staged block j = cache block blocks[j] (j < n_blocks <= 65535):
 * k_out/v_out [n_blocks][KVH][block_size][D] bf16, element = bf16_rn(e4m3_to_f32(code) * scale), the
 * product in fp32 (one more rounding than the fp8 kernels, relative 2^-9, against e4m3's 2^-4). A batch
 * whose block tables are remapped to the staged blocks then runs k_attention_prefill over k_out/v_out.
 * D a multiple of 16; caches and outputs 16-byte aligned, scales 4-byte. */
int k_kv_stage_fp8(const uint8_t *k_cache, const uint8_t *v_cache, const float *k_scale, const float *v_scale,
                   const int32_t *blocks, int n_blocks, bf16 *k_out, bf16 *v_out, int KVH, int D, int block_size,
                   cudaStream_t stream);

/* ---- sampling.cu: the GPU sampler, the same function as engine/sampler.c (the oracle).
 * logits [n, V] fp32 (raw model logits), one row per sequence to sample. Per row (device arrays):
 *   params[r]          struct k_sample_params
 *   hist / hist_start  token history for penalties: row r's tokens are hist[hist_start[r] .. hist_start[r+1]),
 *                      the first n_prompt[r] of them prompt, the rest output
 *   banned / banned_start  ids that must not be sampled (same CSR layout)
 *   allow / allow_row  grammar masks: row r may sample only the ids whose bit is set in mask allow_row[r] of
 *                      allow ((V + 31) / 32 words each, bit (id & 31) of word (id >> 5)); allow_row[r] < 0 or
 *                      allow_row NULL = no mask. Applied with the bans (after the raw logprobs).
 * Outputs: token[r]; logprob[r] (log-softmax of raw logits at token); top_ids/top_lp [n][20] (the first
 * params[r].logprobs entries valid, descending, ties by lower id). The random number is
 * sampling_uniform(seed, step) of engine/sampling.h, bit for bit. logits may be modified in place.
 * token[r] = -1 (logprob NaN) where samp_sample would fail: a NaN or +inf logit, or no id left after
 * penalties, bans and masks. hist/hist_start/n_prompt, banned/banned_start and allow/allow_row may be NULL (none); logprob and
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
             const uint32_t *allow, const int32_t *allow_row, int32_t *token, float *logprob, int32_t *top_ids,
             float *top_lp, void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
