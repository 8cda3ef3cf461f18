/* Models with real shapes and no files: "random weights" for `llmq bench --random-weights` and tests.
 *
 * random_model_create builds a struct model (engine/model.h) from a config alone. Its tensor views
 * carry names, dtypes (BF16) and shapes like a loaded checkpoint's, and either
 *   - data == NULL ("lazy"): a backend that understands random weights fills the tensor itself from
 *     its name with the rule below (the CUDA backend does, on the device, so a 14B model needs no
 *     host memory and no upload), or
 *   - data pointing at host bf16 values of the same rule ("materialized", for the CPU backend, which
 *     needs real data: sensible only for small shapes).
 * Both give bit-identical weights, so a CUDA backend on a lazy model and the CPU backend on a
 * materialized one of the same config compute the same function.
 *
 * The rule, per tensor (a pure function of its name and the element index i):
 *   norm weights (names ending in "norm.weight")    1
 *   biases (names ending in ".bias")                0
 *   everything else                                 amp * (2u - 1), amp = RANDOM_MODEL_STD * sqrt(3)
 * where u = (splitmix64(seed + i) >> 40) / 2^24 and seed = random_model_seed(name): uniform weights
 * with standard deviation RANDOM_MODEL_STD (0.02, what contrib/bench/transformers_peer.py draws, normal
 * there), rounded to bf16 to nearest even. Every step is exact or one correctly rounded IEEE
 * operation, so the host and the device agree bit for bit. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

#define RANDOM_MODEL_STD 0.02

/* Fills *cfg with a named shape: "qwen3-14b", "qwen3-8b" or "qwen3-0.6b" (Qwen3 dense, as
 * contrib/bench/transformers_peer.py defines them: vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6,
 * max_position_embeddings 131072, EOS 151645/151643; 0.6b ties its embeddings), or "qwen3-30b-a3b"
 * (Qwen3-MoE with the same constants: 48 layers, hidden 2048, 32/4 heads of 128, every layer 128
 * experts of 768 with 8 per token, normalized; intermediate_size 6144 as its config.json says, unused).
 * Returns 0, or -1 with err listing the known names. */
int random_model_config(const char *name, struct model_config *cfg, char *err, size_t errlen);

/* Weights (parameters) of a config, the embedding (and untied lm_head) included. */
int64_t random_model_params(const struct model_config *cfg);

/* A model of cfg with random weights, lazy (data NULL) or materialized on the host. NULL with err
 * on a bad config or when out of memory. Free with random_model_free (not model_free). */
struct model *random_model_create(const struct model_config *cfg, bool materialize, char *err, size_t errlen);
void random_model_free(struct model *m);

/* The rule above, for backends that fill lazy tensors themselves. */
struct random_fill {
    uint64_t seed; /* random_model_seed(name) */
    float amp;     /* half-width of the uniform; 0 for constants */
    float base;    /* the constant added (1 for norms, else 0) */
};
/* The fill of a tensor by name. */
struct random_fill random_model_fill(const char *name);
uint64_t random_model_seed(const char *name);
/* Element i of a tensor with fill r, as the float the bf16 value holds. */
float random_model_value(const struct random_fill *r, uint64_t i);
