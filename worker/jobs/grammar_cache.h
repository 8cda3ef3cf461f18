/* The grammars of jobs' structured-output constraints (worker/jobs/job.h, struct job_constraint),
 * compiled once and shared by every job that asks for the same constraint (engine/grammar.h).
 *
 * A grammar also holds the token masks computed for its states, so jobs under one schema reuse each
 * other's masks. The cache keeps the GRAMMAR_CACHE_SIZE most recently used grammars; one that falls
 * out stays alive while sequences still use it (the engine holds references). */
#pragma once
#include <stddef.h>

struct engine;
struct grammar;
struct gr_vocab;
struct job;
struct job_constraint;
struct grammar_cache;

/* At most this many grammars, each with at most GR_CACHE_MAX_BYTES (64 MiB) of cached masks: 1 GiB of
 * host memory in the worst case (a few MiB for a typical schema: a mask is 19 KB for Qwen3, and a
 * schema reaches hundreds to a few thousand states). */
#define GRAMMAR_CACHE_SIZE 16

/* An empty cache, or NULL when out of memory. Free with grammar_cache_free (NULL is harmless). */
struct grammar_cache *grammar_cache_new(void);
void grammar_cache_free(struct grammar_cache *c);

/* The grammar of k (kind other than JOB_CONSTRAINT_NONE) against v: from the cache when an equal
 * constraint was compiled against v before, else compiled and cached. Borrowed: valid until the next
 * call on c (engine_add takes its own reference). NULL with err when the constraint cannot be compiled
 * (the compiler's message, e.g. a regex construct or a number range it cannot express) or memory runs
 * out. */
struct grammar *grammar_cache_get(struct grammar_cache *c, const struct job_constraint *k,
                                  const struct gr_vocab *v, char *err, size_t errlen);

/* The grammar of job j's constraint against engine e's vocabulary (built on first use) into *out:
 * borrowed as with grammar_cache_get, NULL when j has none. Returns 0, or JOB_ERR_RESPONSE_FORMAT with
 * err (the message the job fails with), or JOB_ERR_INTERNAL when memory runs out. */
int grammar_cache_for_job(struct grammar_cache *c, const struct job *j, struct engine *e,
                          struct grammar **out, char *err, size_t errlen);

/* Grammars compiled and served from the cache since it was made. */
void grammar_cache_stats(const struct grammar_cache *c, unsigned long long *compiled,
                         unsigned long long *hits);
