/* The seam between host logic and compute.
 *
 * The scheduler hands a backend one step: a list of sequences, for each the new tokens to run
 * (a prompt chunk, or the one token of a decode), where they start, the KV block table that
 * covers them, and its sampling parameters. The backend runs the forward pass, writes K and V
 * of the new tokens into the paged cache, and for each sequence whose step reaches the end of
 * its known tokens samples one token (with logprobs on request). Nothing else crosses the seam:
 * block allocation, stopping and text live on the host.
 *
 * Backends: "cpu" (fp32 reference, engine/cpu_backend.c) and "cuda" (kernels/, which builds on
 * this layer). engine/ names no CUDA code: a caller opens either by name with backend_open
 * (worker/backends/backend_open.h) and hands it to engine_open. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/dtype.h"
#include "engine/sampling.h"

struct model;

/* One sequence in one step. All pointers are borrowed for the duration of the call. */
struct be_seq {
    const int32_t *tokens;       /* every token of the sequence so far: prompt, then output */
    int n_prompt;                /* how many of tokens[] are prompt */
    int n_tokens;                /* how many tokens[] holds (prompt + output) */
    int pos;                     /* first position to run: tokens[pos, pos + n_new) are new */
    int n_new;                   /* >= 1 */
    const int32_t *block_table;  /* physical KV blocks for positions [0, pos + n_new) */
    int n_blocks;
    bool sample;                 /* pos + n_new == n_tokens: sample the next token */
    const struct sampling_params *sp;
    const int32_t *banned;       /* ids that must not be sampled now (EOS before min_tokens) */
    int n_banned;
    /* A grammar's mask (engine/grammar.h): bit (id & 31) of word (id >> 5) set = id may be sampled;
     * NULL = every id. Applied with the bans, after the raw logprobs, before temperature/top-k/top-p.
     * Its words are written by backend_fill_masks (below): a backend reads them only after calling it. */
    const uint32_t *allowed;
};

/* What a backend returns for a sequence with sample == true. */
struct be_out {
    int32_t token;
    float logprob;               /* log-softmax of the raw logits at token (when sp->logprobs >= 0) */
    int n_top;                   /* = sp->logprobs when > 0, else 0 */
    int32_t top_ids[SAMPLING_MAX_LOGPROBS];   /* by descending logprob, ties by lower id */
    float top_logprobs[SAMPLING_MAX_LOGPROBS];
};

/* Weight element type on a backend (model.dtype). */
enum be_weights {
    BE_WEIGHTS_AUTO = 0, /* the checkpoint's: F8_E4M3 linear weights stay fp8 on CUDA (dequantized on CPU) */
    BE_WEIGHTS_BF16,     /* every weight bf16 on CUDA (fp8 checkpoints dequantized at load) */
    BE_WEIGHTS_FP8,      /* linear weights (q/k/v/o/gate/up/down) fp8 e4m3 in 128x128 blocks, quantized at
                          * load where the checkpoint is not fp8 (engine/fp8.h); embeddings, norms and
                          * lm_head keep their dtype. The CPU backend computes with the same fp8 values */
    BE_WEIGHTS_F16,      /* fp16 mode (model.dtype fp16): every weight fp16 on CUDA (converted at load; a
                          * weight beyond fp16's range fails the load), activations and the KV cache
                          * (kv_dtype DT_F16) fp16 too; no fp8 weights, lm_head or KV cache */
};

/* What a backend assumes where backend_opts leaves max_num_seqs / max_num_batched_tokens at 0 (tests
 * that open a backend directly; the engine always passes its own, engine_opts_default). */
#define BACKEND_DEFAULT_MAX_NUM_SEQS 256
#define BACKEND_DEFAULT_MAX_BATCHED_TOKENS 8192

/* The CUDA backend's second copies of the weights in the decode GEMVs' read order
 * (engine.decode_weight_copies; engine/weight_copies.h). The CPU backend ignores it. */
enum be_copies {
    BE_COPIES_AUTO = 0, /* on where the KV cache still holds max_num_seqs sequences of max_model_len */
    BE_COPIES_ON,
    BE_COPIES_OFF,
};

/* k_linear's choice between the decode GEMV and cuBLASLt at decode-sized batches (CUDA; tests). */
enum be_gemm_pick {
    BE_GEMM_TIMED = 0, /* the faster of the two on the first call of each shape (the engine's) */
    BE_GEMM_GEMV,      /* the GEMV wherever it can run */
    BE_GEMM_CUBLASLT,  /* cuBLASLt wherever it can run */
};

/* Settings for tests, which no configuration key sets: each reaches a path or pins a choice so that a test
 * can compare runs bit for bit. Zero, the default, is what the engine runs. */
struct backend_test_opts {
    /* CUDA, fp8 KV cache: the prefill's bf16 staging pool in blocks (0: sized by the backend for a sequence
     * of max_model_len or a step of fresh prompts). A small pool makes a step stage its blocks in rounds,
     * and a sequence longer than the pool take the fp8 prefill kernel. */
    int kv_stage_blocks;
    /* CUDA: no decode step is enqueued ahead of its inputs (kernels/cuda_spec.cu; by default steps of up
     * to 4 sequences are); the same bits either way */
    bool no_step_guess;
    enum be_gemm_pick gemm_pick;
    /* CUDA: the GEMM tuning file is offered a save after every step, not once a minute */
    bool tuning_save_every_step;
};

struct backend_opts {
    int block_size;              /* tokens per KV block */
    int max_num_seqs;            /* most sequences in one step (0: BACKEND_DEFAULT_MAX_NUM_SEQS) */
    int max_num_batched_tokens;  /* most new tokens in one step (0: BACKEND_DEFAULT_MAX_BATCHED_TOKENS) */
    int max_model_len;           /* longest sequence */
    int threads;                 /* CPU threads, 0 = all */
    int device;                  /* CUDA device index (engine.device); the CPU backend ignores it */
    double gpu_memory_utilization;
    int64_t kv_cache_bytes;      /* KV pool size (CPU) or cap (CUDA) that tests and embedders set; 0 = none */
    int64_t cpu_kv_cache_bytes;  /* CPU only (engine.cpu_kv_cache_bytes): KV pool size when kv_cache_bytes is
                                    0; 0 = enough for max_num_seqs * max_model_len (capped). The CUDA
                                    backend sizes its pool from gpu_memory_utilization instead */
    int num_kv_blocks;           /* > 0: exactly this many KV blocks (engine.num_kv_blocks), over the two above */
    enum dtype kv_dtype;         /* DT_F32 on CPU; DT_BF16 or DT_F8_E4M3 on CUDA, DT_F16 with BE_WEIGHTS_F16 */
    enum be_weights weight_dtype; /* BE_WEIGHTS_AUTO (0) unless model.dtype says otherwise */
    /* the output projection (lm_head, or the embedding when tied), by the rule of fp8_linear_use
     * (engine/fp8.h): AUTO (0) = fp8 only where the checkpoint ships it in F8_E4M3 blocks (the Qwen3
     * FP8 checkpoints keep it bf16), FP8 = quantized at load (model.lm_head_dtype), BF16 = never */
    enum be_weights lm_head_dtype;
    enum be_copies decode_weight_copies; /* CUDA (engine.decode_weight_copies); AUTO (0) by default */
    /* CUDA: the GEMM tuning file (engine.gemm_tuning_file; engine/gemm_tuning.h), read at open and
     * written at close; NULL or "": none (choices timed in each process). Borrowed for the open. */
    const char *gemm_tuning_file;
    bool cuda_graphs;            /* CUDA: decode steps as graphs; CPU with emulate_cuda: mirror their buckets */
    int cuda_graph_max_batch;    /* largest decode batch run as a graph (0 = max_num_seqs); larger ones eager */
    /* CPU only, for testing the CUDA backend (default false: the plain fp32 oracle, unchanged).
     * The CPU forward rounds to bf16 (nearest even; fp16 with weight_dtype BE_WEIGHTS_F16) exactly
     * where the CUDA forward stores its 16-bit type:
     * weights, normed activations, GEMM outputs, q/k/v after RoPE, attention probabilities before
     * the P·V product (with the CUDA kernels' tiling of the running max), attention output, SiLU·up;
     * the residual stream and the logits stay fp32. See docs/CUDA_BACKEND.md, "Accuracy against
     * the CPU oracle". */
    bool emulate_cuda;
    /* With emulate_cuda, for tests: != 0 moves each activation by -4 .. +4 fp32 ulps (a hash of its
     * bits and this seed) before its 16-bit rounding, a stand-in for another fp32 evaluation order (a
     * GEMM summing a few hundred products in another order lands a few ulps away). The spread this
     * causes is the oracle's own sensitivity, against which a GPU is judged. 0: none. */
    uint64_t emulate_cuda_jitter;
    struct backend_test_opts test; /* tests only (above) */
};

struct backend;

struct backend_ops {
    const char *name;
    /* Runs one step. out[i] is written for each seqs[i] with sample set. Returns 0, or -1 with
     * be->err set: then no output is valid and the caller fails the step's sequences. A sequence whose
     * own sampling fails (a NaN or +inf logit: a corrupt weight, an overflow in fp16 mode; or no id
     * left to sample) does not fail the step: its out[i].token is -1, be->err says why (the first such
     * sequence's reason), and every other output is valid. */
    int (*step)(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out);
    void (*free)(struct backend *be);
};

struct backend {
    const struct backend_ops *ops;
    int num_blocks;   /* KV pool size in blocks, fixed at open */
    int block_size;
    char err[512];    /* the last error */
    /* Set by the engine: fills the step's be_seq.allowed masks. A step calls it (backend_fill_masks)
     * once, after starting the forward pass and before reading any mask, so that the host computes the
     * masks while the GPU computes the logits. A backend that wraps another copies both fields into the
     * inner one before stepping it. NULL: the masks are ready when step is called. */
    void (*fill_masks)(void *ctx);
    void *fill_masks_ctx;
};

static inline void backend_fill_masks(struct backend *be)
{
    if (be->fill_masks)
        be->fill_masks(be->fill_masks_ctx);
}

static inline int backend_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    return be->ops->step(be, seqs, n, out);
}
static inline const char *backend_name(const struct backend *be) { return be->ops->name; }
void backend_free(struct backend *be);

/* RoPE inverse frequencies of a model, shared by every backend: inv_freq[i] for i < head_dim / 2
 * and the factor that multiplies cos and sin (1 except for yarn), computed in float32 exactly as
 * transformers' _compute_default_rope_parameters / _compute_yarn_parameters /
 * _compute_llama3_parameters do. Returns 0, or -1 with err for an odd head_dim or bad scaling. */
struct model_config;
int backend_rope_freqs(const struct model_config *cfg, float *inv_freq, float *attn_scale, char *err,
                       size_t errlen);

/* Checks a model's shape for any backend: positive sizes, and query heads a multiple of KV heads. Returns
 * 0, or -1 with "unsupported model shape: ..." in err. */
int backend_check_model(const struct model_config *cfg, char *err, size_t errlen);

/* Checks one sequence of a step against the seam's contract (positions, block table inside the
 * pool of be->num_blocks, token ids below vocab, sample only at the last token) and, when
 * max_model_len > 0, its length. Returns 0, or -1 with "sequence i: ..." in be->err. Shared by the
 * backends so that both refuse the same steps with the same words. */
int backend_check_seq(struct backend *be, const struct be_seq *s, int i, int vocab, int max_model_len);

/* The CPU reference backend (engine/cpu_backend.c) for a loaded model that outlives it. NULL with err
 * on failure. Callers choose a backend by name through backend_open (worker/backends/backend_open.h),
 * which knows the CUDA one too. */
struct backend *cpu_backend_open(const struct model *m, const struct backend_opts *o, char *err,
                                 size_t errlen);
