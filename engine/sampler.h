/* The reference sampler: one row of raw logits in, one token (and logprobs) out.
 *
 * Used by the CPU backend, and the oracle the GPU sampler is tested against. For one sequence:
 *   1. logprobs = log_softmax of the RAW logits (before penalties and temperature): the chosen
 *      token's, and the top N by descending logprob, ties by lower id;
 *   2. penalties on a copy: repetition_penalty over the distinct prompt+output ids (HF: a logit
 *      > 0 is divided by p, else multiplied by p), then presence and frequency over the output ids
 *      (OpenAI: logit -= presence * (count > 0) + frequency * count); banned ids and ids outside
 *      s->allowed (a grammar's mask) become -inf;
 *   3. temperature < SAMP_GREEDY_EPS: argmax (ties go to the lowest id);
 *   4. else p = softmax(logits / temperature); top_k keeps the k most probable; top_p keeps the
 *      smallest set (in order of descending p, ties by id) whose mass reaches top_p of the rest
 *      (at least one); min_p drops p < min_p * max p; the rest is renormalized;
 *   5. the token is picked by inverse CDF with u = sampling_uniform(seed, n_output) over the kept
 *      tokens in order of descending p (ties by lower id): the first whose cumulative mass
 *      exceeds u * total. n_output = n_tokens - n_prompt, so a sequence's draws depend only on
 *      its seed and how many tokens it has generated, never on the rest of the batch.
 * Sorting is avoided: top_k is a partial selection and top_p and the pick are weighted
 * selections (expected O(V)); masses are summed in double.
 *
 * A samp_ctx holds scratch for one vocabulary and is used by one thread at a time. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/sampling.h"

/* Temperatures below this are greedy (as vLLM's _SAMPLING_EPS). */
#define SAMP_GREEDY_EPS 1e-5f

struct samp_ctx;

/* Scratch for a vocabulary of `vocab` ids (about 17 bytes per id). NULL when out of memory.
 * Free with samp_free. */
struct samp_ctx *samp_new(int vocab);
void samp_free(struct samp_ctx *c);

/* Samples the next token of s (s->sp, tokens, n_prompt, n_tokens, banned) from its row of raw
 * logits [vocab], which is not modified. Fills out (token, and logprob/top when
 * s->sp->logprobs >= 0). Returns 0, or -1 with err when the logits hold a NaN or every id is
 * banned or -inf. */
int samp_sample(struct samp_ctx *c, const float *logits, const struct be_seq *s, struct be_out *out,
                char *err, size_t errlen);

/* The pieces of samp_sample, for tests and for the GPU sampler's oracle. */

/* Step 1: out->logprob = log_softmax(logits)[token], and the top n_top (clamped to
 * SAMPLING_MAX_LOGPROBS) into out->top_ids/top_logprobs/n_top. Sums in double. */
void samp_logprobs(const float *logits, int vocab, int32_t token, int n_top, struct be_out *out);

/* Step 2, in place on logits[c's vocab]: penalties of s->sp over s's tokens, then bans and the mask. */
void samp_penalize(struct samp_ctx *c, float *logits, const struct be_seq *s);

/* Steps 3-4 on penalized logits: writes the kept tokens into ids[] and their renormalized
 * probabilities into probs[] (each with room for the vocabulary), sorted by descending
 * probability, ties by lower id, and returns how many (1 with probability 1 when greedy; 0 when
 * no id has a finite logit). */
int samp_distribution(struct samp_ctx *c, const float *logits, const struct sampling_params *sp, int32_t *ids,
                      float *probs);
