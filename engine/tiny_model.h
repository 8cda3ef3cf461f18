/* Random checkpoints in Hugging Face layout, for demos, tests and benchmarks (`llmq make-tiny-model`).
 *
 * tiny_model_write fills a folder with config.json, generation_config.json, tokenizer.json,
 * tokenizer_config.json and model.safetensors (or N shards + model.safetensors.index.json).
 * The weights are a pure function of the options: the same options give byte-identical files on
 * every machine (a splitmix64 stream per tensor, seeded by --seed and the tensor's name; only exact or
 * correctly rounded IEEE operations in the draw). Each weight is approximately normal (Irwin-Hall: the
 * sum of 4 uniforms, rescaled), with scales chosen so that tiny models have peaked next-token
 * distributions (logits with std ~4) without collapsing into copying their input token:
 *   embed_tokens, lm_head   N(0, 4/sqrt(hidden))   the logits norm(h) . w have std ~4, tied or not
 *   q/k/v, gate/up          N(0, 1/sqrt(in))       unit gain: projections of normed inputs have rms ~1
 *   o_proj, down_proj       N(0, 4/sqrt(in))       block outputs outweigh the embedding in the residual
 *                                                  stream, so a tied lm_head does not echo the input token
 *   norm weights            1 + N(0, 0.1)          input/post-attention/final and q/k norms
 *   q/k/v biases (qwen2)    N(0, 0.5)              large enough to matter
 * Measured with an fp32 forward on 2-4 layer models (64-256 hidden, tied and untied, qwen3/qwen2/llama,
 * prompts of 5-300 tokens): the top-2 logit gap is over 0.05 in ~95% of greedy steps, top-1 probability
 * ~0.4-0.8. (With N(0, 1) embeddings and unit gains tied models repeat one token forever.)
 * fp8: linear weights are F8_E4M3 with BF16 `<name>_scale_inv` per 128x128 block (as Qwen3-*-FP8
 * ships them): scale_inv = bf16(amax / 448), w8 = e4m3(w / scale_inv); everything else is BF16 (the
 * MoE router too).
 * Mixture of experts (experts > 0): a Qwen3MoeForCausalLM whose MoE layers (engine/model.h,
 * model_layer_moe) have mlp.gate.weight (E, C) and mlp.experts.{e}.{gate,up,down}_proj.weight, drawn as
 * the dense MLP's weights (experts' down_proj with OUT_GAIN), the router N(0, ROUTER_GAIN/sqrt(hidden))
 * so that router logits have std ~2 and a token's K-th and K+1-th experts are rarely near a tie. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/dtype.h"
#include "engine/model.h"

#define TINY_EBADOPT (-2) /* tiny_model_write: the options are invalid (the CLI exits 2) */

struct tiny_opts {
    enum model_arch arch;     /* ARCH_QWEN3 */
    bool arch_from_tokenizer; /* true: with tokenizer_dir, arch follows the tokenizer instead: qwen3 for
                                 a Qwen tokenizer (tokenizer_class Qwen2Tokenizer), llama for any
                                 other (Llama-3, DeepSeek-V3: dense Llama is what llmq runs of them) */
    int hidden;               /* 64 */
    int intermediate;         /* 128 */
    int layers;               /* 2 */
    int heads;                /* 4 */
    int kv_heads;             /* 2 */
    int head_dim;             /* 0 = hidden / heads (16) */
    int vocab;                /* 0 = 512; with a Qwen tokenizer 151936 (if it fits), with any other its
                                 highest id + 1, rounded up to a multiple of 128 (Llama-3: 128256) */
    int max_position;         /* 4096 */
    double rope_theta;        /* 10000 */
    bool tie;                 /* true: lm_head is embed_tokens */
    /* mixture of experts: experts > 0 writes a Qwen3MoeForCausalLM (arch must be ARCH_QWEN3) */
    int experts;                                  /* 0: dense */
    int experts_per_token;                        /* 2 (1 .. experts) */
    int moe_intermediate;                         /* 0 = intermediate */
    bool norm_topk_prob;                          /* true */
    int decoder_sparse_step;                      /* 1: every layer not in mlp_only is MoE */
    uint64_t mlp_only[MODEL_MAX_MOE_LAYERS / 64]; /* bit l: layer l keeps a dense MLP (mlp_only_layers) */
    enum dtype dtype;          /* DT_BF16; DT_F16, DT_F32, or DT_F8_E4M3 (fp8 linear weights) */
    int shards;                /* 1: model.safetensors; N > 1: N shards + index */
    uint64_t seed;             /* 0 */
    const char *tokenizer_dir; /* NULL: write a minimal byte-level BPE tokenizer; else copy its files
                                  (refused unless llmq loads that tokenizer; bos/eos ids from its
                                  tokenizer_config.json, plus <|endoftext|>, <|eot_id|>,
                                  <|end_of_text|> as eos where it has them) */
    int threads;               /* 0: one per online CPU, at most 16; tensors are drawn in parallel (each
                                  has its own random stream, so the files do not depend on it); each
                                  thread holds its tensor as fp32 while drawing (Qwen3-14B's gate_proj:
                                  356 MB), besides the shard being written */
    /* Called from the calling thread about every 100 ms while the weights are drawn and written, with
     * the weight bytes done and their total; NULL: none. */
    void (*progress)(void *arg, uint64_t done, uint64_t total);
    void *progress_arg;
};

/* The defaults above: a tiny Qwen3. */
struct tiny_opts tiny_opts_default(void);

/* Writes the checkpoint into dir (created if needed; existing model.safetensors, index and
 * model-*-of-*.safetensors files there are removed first so a loader never mixes two runs).
 * Returns 0; TINY_EBADOPT with err for invalid options (e.g. heads not a multiple of kv_heads, a
 * vocab smaller than the tokenizer's); -1 with err when something cannot be read or written. */
int tiny_model_write(const char *dir, const struct tiny_opts *o, char *err, size_t errlen);
