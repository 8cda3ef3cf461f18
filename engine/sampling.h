/* Sampling parameters of one sequence, shared by the host engine and every backend. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define SAMPLING_MAX_LOGPROBS 20 /* OpenAI's limit on top_logprobs */

struct sampling_params {
    float temperature;        /* 0 = greedy (argmax; ties go to the lowest id) */
    float top_p;              /* 1 = off */
    int top_k;                /* 0 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; over prompt and output tokens (HF/vLLM semantics) */
    float presence_penalty;   /* 0 = off; over output tokens (OpenAI/vLLM semantics) */
    float frequency_penalty;  /* 0 = off; over output tokens */
    uint64_t seed;            /* per-sequence; the engine draws one when the job has none */
    int logprobs;             /* -1 none; 0 the chosen token's only; N also the top N (<= 20) */
};

/* temperature 1, everything else off, logprobs -1, seed 0. */
struct sampling_params sampling_params_default(void);

/* The uniform random number in [0, 1) that a sequence with this seed uses for its step-th
 * generated token. Counter-based (no state), so the same seed gives the same output whatever
 * else is in the batch, on every backend. */
double sampling_uniform(uint64_t seed, uint64_t step);
