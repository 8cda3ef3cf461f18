/* A Hugging Face model folder, read but not yet placed on a backend: its configuration and
 * borrowed views of every weight tensor in the mmap'd safetensors files.
 *
 * Supported architectures: Qwen3ForCausalLM (q/k RMSNorm, no biases), Qwen2ForCausalLM (q/k/v
 * bias, no q/k norm) and LlamaForCausalLM (neither) — one forward pass with flags — and
 * Qwen3MoeForCausalLM: Qwen3's attention with a mixture-of-experts MLP in the layers model_layer_moe
 * names (the others keep Qwen3's dense MLP of intermediate_size).
 *
 * A MoE layer's MLP (transformers' Qwen3MoeSparseMoeBlock) on a normed row h (C):
 *     logits = router · h                              (E), fp32
 *     p      = softmax(logits) over all E experts
 *     S      = the K experts of the largest logits (ties: the lower index), K = num_experts_per_tok
 *     w_e    = p_e / sum_{j in S} p_j  if norm_topk_prob, else p_e          (e in S)
 *     out    = sum_{e in S} w_e · down_e(silu(gate_e · h) * (up_e · h))
 * (engine/moe.h computes S and w). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/dtype.h"

#define MODEL_MAX_EOS 8
#define MODEL_MAX_MOE_LAYERS 1024 /* layers a MoE model may have (mlp_only_layers is a bit set) */

enum model_arch { ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA, ARCH_QWEN3_MOE };
enum rope_type { ROPE_DEFAULT, ROPE_YARN, ROPE_LLAMA3 };

struct model_config {
    enum model_arch arch;
    char arch_name[64];    /* "Qwen3ForCausalLM" ... as in config.json */
    int hidden;            /* hidden_size, C */
    int intermediate;      /* intermediate_size, F */
    int n_layers;          /* num_hidden_layers, L */
    int n_heads;           /* num_attention_heads, H */
    int n_kv_heads;        /* num_key_value_heads, KVH (H % KVH == 0) */
    int head_dim;          /* head_dim, D (default C / H; H * D may differ from C) */
    int vocab;             /* vocab_size, V */
    int max_position;      /* max_position_embeddings */
    float rms_eps;         /* rms_norm_eps */
    double rope_theta;     /* rope_theta (base) */
    bool tie_embeddings;   /* tie_word_embeddings: lm_head is embed_tokens */
    bool qk_norm;          /* per-head RMSNorm on q and k before RoPE (Qwen3) */
    bool qkv_bias;         /* biases on q, k, v projections (Qwen2) */
    /* mixture of experts (Qwen3MoeForCausalLM; n_experts 0 for every other architecture) */
    int n_experts;         /* num_experts, E; 0: every layer is dense */
    int n_experts_active;  /* num_experts_per_tok, K (1 <= K <= E) */
    int moe_intermediate;  /* moe_intermediate_size, FE: each expert's MLP size */
    bool norm_topk_prob;   /* renormalize the K selected probabilities to sum 1 */
    int decoder_sparse_step; /* layer l is MoE when (l + 1) % step == 0 (and not in mlp_only_layers) */
    uint64_t mlp_only[MODEL_MAX_MOE_LAYERS / 64]; /* bit l: mlp_only_layers lists layer l (dense) */
    struct {
        enum rope_type type;
        double factor;            /* yarn/llama3 scaling factor */
        int original_max;         /* original_max_position_embeddings */
        double beta_fast, beta_slow, attn_factor, low_freq_factor, high_freq_factor;
    } rope_scaling;
    enum dtype torch_dtype;   /* as declared; weights keep their own dtypes */
    bool fp8_blocks;          /* quantization_config: fp8 e4m3 weights with block scales */
    int fp8_block[2];         /* weight_block_size [out, in], e.g. 128, 128 */
    /* generation_config.json (and config.json fallbacks) */
    int eos_ids[MODEL_MAX_EOS];
    int n_eos;
    int bos_id, pad_id;       /* -1 when absent */
    bool has_sampling_defaults; /* the fields below came from generation_config.json */
    float gen_temperature, gen_top_p, gen_min_p, gen_repetition_penalty;
    int gen_top_k;
};

/* A borrowed view of one tensor inside an mmap'd file. */
struct tensor_view {
    const char *name;          /* borrowed from the safetensors header, lives as long as the model */
    enum dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;          /* into the mmap */
    const struct tensor_view *scale_inv; /* F8_E4M3 weights: fp32/bf16 block scales [ceil(out/B0), ceil(in/B1)] */
    int block[2];              /* F8_E4M3 with scale_inv: the block [B0, B1] (weight_block_size); else 0 */
};

struct layer_weights {
    struct tensor_view attn_norm;          /* (C) input_layernorm */
    struct tensor_view wq, wk, wv;         /* (H*D, C), (KVH*D, C), (KVH*D, C) */
    struct tensor_view bq, bk, bv;         /* (H*D), (KVH*D) — qkv_bias only; else data == NULL */
    struct tensor_view q_norm, k_norm;     /* (D) — qk_norm only */
    struct tensor_view wo;                 /* (C, H*D) */
    struct tensor_view mlp_norm;           /* (C) post_attention_layernorm */
    struct tensor_view w_gate, w_up;       /* (F, C) — dense layers; data == NULL in a MoE layer */
    struct tensor_view w_down;             /* (C, F) */
    struct tensor_view router;             /* (E, C) mlp.gate.weight — MoE layers only */
    struct expert_weights *experts;        /* [E] into model.experts — MoE layers only, else NULL */
};

/* One expert of a MoE layer: model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight */
struct expert_weights {
    struct tensor_view w_gate, w_up; /* (FE, C) */
    struct tensor_view w_down;       /* (C, FE) */
};

struct model {
    char dir[4096];
    struct model_config cfg;
    struct tensor_view embed;       /* (V, C) model.embed_tokens.weight */
    struct tensor_view final_norm;  /* (C) model.norm.weight */
    struct tensor_view lm_head;     /* (V, C); == embed when tie_embeddings */
    struct layer_weights *layers;   /* [n_layers] */
    struct expert_weights *experts; /* [MoE layers][E], the experts of every MoE layer; NULL if none */
    struct st_set *files;           /* the mmap'd safetensors files (engine/safetensors.h) */
};

/* Reads config.json, generation_config.json and the safetensors (model.safetensors, or the
 * shards listed in model.safetensors.index.json) of `dir`, and checks every tensor's presence,
 * shape and dtype. On failure returns NULL and writes e.g.
 * "model.layers.3.self_attn.q_proj.weight in model-00001-of-00002.safetensors: shape [512, 64],
 *  expected [1024, 64]" into err. Free with model_free. */
struct model *model_load(const char *dir, char *err, size_t errlen);
void model_free(struct model *m);

/* 0 when t is [d0] (d1 == 0) or [d0, d1]; else -1 and "<name>: shape [a, b], expected [d0, d1]" in
 * err. For the backends, which check the views they are given again. */
int tensor_view_check_shape(const struct tensor_view *t, const char *name, int64_t d0, int64_t d1, char *err,
                            size_t errlen);

/* Whether layer l's MLP is a mixture of experts: E > 0, l not in mlp_only_layers and
 * (l + 1) % decoder_sparse_step == 0, as transformers' Qwen3MoeDecoderLayer decides. */
bool model_layer_moe(const struct model_config *c, int l);
/* The number of layers model_layer_moe names. */
int model_moe_layers(const struct model_config *c);

/* Parses only config.json (+ generation_config.json when present) into *cfg. */
int model_config_load(const char *dir, struct model_config *cfg, char *err, size_t errlen);

/* YaRN for a context above the native one: when max_model_len exceeds max_position_embeddings and
 * config.json has no rope_scaling, sets c->rope_scaling to what config.json would say with
 *     "rope_scaling": {"rope_type": "yarn", "factor": F, "original_max_position_embeddings": N}
 * N = max_position_embeddings (the native length), F = ceil(max_model_len / N) as a whole number
 * (2 for 65,536 and 4 for 131,072 over Qwen3's 40,960: the factors Qwen's model cards tell users to
 * set), beta_fast 32, beta_slow 1, attention factor 0.1 ln F + 1, as transformers derives them.
 * Returns 1 when it changed c, else 0; msg (when msglen > 0) gets a line for the log either way:
 * what was enabled, or, for a model whose own rope_scaling reaches less far than max_model_len, a
 * warning; "" when there is nothing to say. backend_open applies it to every backend. */
int model_config_extend_rope(struct model_config *c, int max_model_len, char *msg, size_t msglen);

/* Converts a weight view to fp32, dequantizing F8_E4M3 with its block scales. dst holds
 * the product of the view's shape. Returns 0, or -1 with err for an unsupported dtype. */
int tensor_to_f32(const struct tensor_view *t, float *dst, char *err, size_t errlen);

/* Number of elements of a view. */
int64_t tensor_numel(const struct tensor_view *t);
