/* The generation engine: requests in, tokens and text out, over any backend.
 *
 * It owns the scheduler (continuous batching, chunked prefill, admission by priority and
 * prompt-length bucket, preemption by recompute), the paged KV block manager, stopping (EOS, stop
 * ids, stop strings across token boundaries, max_tokens, min_tokens, deadlines) and incremental
 * detokenization.
 * `llmq run`, the worker and `llmq bench` all drive it the same way:
 *
 *     engine_add(...) as requests arrive;
 *     while (engine_has_work(e)) {
 *         engine_step(e, &changed, &n);      // one forward step
 *         for each changed seq: read its new tokens / text; if finished, use it, engine_release(e, seq)
 *     }
 *
 * Single-threaded: all calls on one engine from one thread. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/sampling.h"

struct model;
struct tok;

#define ENGINE_MAX_LANES 4

enum finish_reason {
    FINISH_NONE,
    FINISH_STOP,
    FINISH_LENGTH,
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_TIMEOUT, /* its deadline passed (engine_request.deadline); the text so far is kept */
};
/* "stop", "length", "cancelled", "error", "timeout"; NULL for FINISH_NONE. */
const char *finish_reason_name(enum finish_reason r);

/* Caps of one lane (e.g. 0 = short jobs, 1 = long documents), inside the global ones; 0 = global. */
struct engine_lane {
    int max_num_seqs;
    int max_num_batched_tokens;
    int max_model_len;
};

struct engine_opts {
    struct backend_opts be;       /* block_size, max_num_seqs, max_num_batched_tokens, max_model_len, ... */
    int long_prefill_chunk;       /* most tokens of one prompt per step (0 = max_num_batched_tokens) */
    bool enable_prefix_caching;   /* reuse the K/V of full blocks shared with earlier prompts */
    double admission_reserve;     /* share of max_tokens admission keeps blocks for (sched_opts) */
    uint64_t seed;                /* base of the seeds drawn for requests without one */
    int num_lanes;                /* 0 or 1 = one lane with the global caps */
    struct engine_lane lanes[ENGINE_MAX_LANES];
    double priority_aging_s; /* waiting this long raises a request's priority by 1 (sched_opts) */
    /* The engine's clock in seconds (arrival, first token, finish, deadlines); NULL = CLOCK_MONOTONIC
     * (llmq_mono_s). Tests pass their own to move time without sleeping. */
    double (*clock)(void *ctx);
    void *clock_ctx;
};
/* block_size 32, max_num_seqs 512, max_num_batched_tokens 16384, max_model_len 0 (= the model's),
 * gpu_memory_utilization 0.92, kv_dtype BF16 (the CPU backend keeps fp32),
 * cuda_graphs true up to batch 512, prefix caching on, admission_reserve 1, seed 0, one lane,
 * priority_aging_s 60, the monotonic clock. */
struct engine_opts engine_opts_default(void);

struct engine_request {
    const int32_t *prompt;        /* copied by engine_add */
    int n_prompt;                 /* >= 1 */
    struct sampling_params sp;
    bool has_seed;                /* false: the engine draws a seed */
    int max_tokens;               /* >= 1 */
    int min_tokens;               /* EOS and stop ids are banned until this many tokens */
    bool ignore_eos;
    const char *const *stop;      /* stop strings (copied); output ends before the first match */
    int n_stop;
    const int32_t *stop_ids;      /* extra stop token ids (copied) */
    int n_stop_ids;
    bool skip_special_tokens;     /* in the text (default true) */
    /* Models that think (engine/think.h): a budget of tokens inside the think block, after which the
     * engine forces its close; engine_add refuses one on a model without think tags. */
    bool has_thinking_budget;
    int thinking_budget;          /* >= 0 when has_thinking_budget */
    bool stop_in_reasoning;       /* stop strings also end the output inside the reasoning */
    bool no_think_split;          /* the think block stays in text, tags included (OpenAI completions);
                                     a thinking budget still applies */
    int lane;                     /* 0 .. num_lanes - 1 */
    int priority;                 /* admission order in its lane, higher first (docs/SCHEDULER.md) */
    bool isolated;                /* runs only while no other isolated request does (a job suspected
                                     of killing the workers that ran it; docs/SCHEDULER.md) */
    double deadline;              /* engine_now() time from which it finishes with FINISH_TIMEOUT at
                                     the next engine_step, keeping its text so far; 0 = none */
    /* Structured output (engine/grammar.h): the answer must be a sentence of this grammar, compiled
     * against engine_grammar_vocab(e); the sampler only sees the ids it allows, and EOS only once the
     * answer is complete. Inside a think block nothing is masked; the first token may also open one.
     * engine_add takes its own reference; NULL = none. Not with ignore_eos. */
    struct grammar *grammar;
    void *user;                   /* returned untouched in engine_seq.user */
};
/* Zeroed, with sp = sampling_params_default(), max_tokens 16, skip_special_tokens true. */
struct engine_request engine_request_default(void);

/* A request as it runs. Fields are read-only for callers; valid until engine_release. */
struct engine_seq {
    void *user;
    int n_prompt;
    int32_t *tokens;              /* prompt then generated ids (a final EOS/stop id included) */
    int n_output;                 /* generated ids so far */
    int n_new_output;             /* ids generated in the last engine_step (0 or 1) */
    char *text;                   /* generated text so far, stop string removed, NUL-terminated; on a
                                     model that thinks, only the answer (after the think block) */
    size_t text_len;
    /* The reasoning (engine/think.h): the text inside the think block, tags excluded, NUL-terminated
     * ("" until there is some); has_reasoning once the output is in a think block. */
    char *reasoning;
    size_t reasoning_len;
    bool has_reasoning;
    int n_reasoning_tokens;       /* output ids of the think block, its tags included (<= n_output) */
    struct be_out *logprobs;      /* [n_output] when sp.logprobs >= 0, else NULL */
    bool finished;
    enum finish_reason finish;
    char error[256];                             /* FINISH_ERROR, FINISH_TIMEOUT: why */
    double t_arrival, t_first_token, t_finished; /* engine_now() seconds; 0 until it happens */
    int n_preemptions;
};

struct engine_stats {
    int running, waiting;         /* sequences */
    int kv_blocks_used, kv_blocks_total;
    uint64_t steps, preemptions, prompt_tokens, generated_tokens; /* steps that ran the backend; prompt
                                                                     tokens of the requests added */
    int lane_running[ENGINE_MAX_LANES], lane_waiting[ENGINE_MAX_LANES];
    int kv_blocks_cached;         /* free blocks still holding a reusable prefix */
    uint64_t computed_tokens;     /* tokens run through the backend (prefill chunks, recompute, decode) */
    uint64_t prefix_queries, prefix_hits; /* full blocks looked up in / found in the prefix cache */
    uint64_t cached_tokens;       /* prompt tokens not computed thanks to the prefix cache */
    /* Prefix cache in tokens, as vLLM counts vllm:prefix_cache_queries / _hits: once per request, at
     * its first admission, queries += its tokens and hits += the tokens found cached (a multiple of
     * the block size, at most n_prompt - 1). Readmissions after a preemption count apart, so a
     * victim finding its own blocks again does not raise the hit rate. Nothing is counted while
     * prefix caching is off. Hit rate = prefix_hit_tokens / prefix_query_tokens. */
    uint64_t prefix_query_tokens, prefix_hit_tokens;
    uint64_t prefix_preempted_query_tokens, prefix_preempted_hit_tokens;
    uint64_t lane_computed_tokens[ENGINE_MAX_LANES]; /* computed_tokens by lane */
    uint64_t grammar_masks;  /* token masks made for sequences under a grammar */
    double grammar_mask_s;   /* seconds spent making them (cache hits and misses) */
};

/* An engine over a backend the caller opened for m with o->be (backend_open,
 * worker/backends/backend_open.h; or a wrapper of one, as `llmq bench` measures steps): the engine
 * takes be over and frees it, also on failure. Sizes the KV pool's manager and the scheduler. tok is
 * borrowed for text and may not be NULL. NULL with err on failure. When the KV pool holds fewer
 * tokens than max_model_len, the engine's max_model_len is lowered to what it holds (logged). */
struct engine *engine_open(const struct model *m, const struct tok *tok, struct backend *be,
                           const struct engine_opts *o, char *err, size_t errlen);
void engine_free(struct engine *e);

/* Queues a request. Returns its seq, or NULL with err when the request can never run (empty
 * prompt, prompt + max_tokens over max_model_len, bad sampling values, token ids out of range, a
 * thinking budget < 0 or on a model that does not think). */
struct engine_seq *engine_add(struct engine *e, const struct engine_request *r, char *err, size_t errlen);

/* Runs one step if there is work. *changed lists the seqs that got a token or finished in this
 * step (borrowed until the next call). Returns 0, or -1 when the backend failed: the step's
 * sequences are then finished with FINISH_ERROR (listed in *changed) and the engine stays usable. */
int engine_step(struct engine *e, struct engine_seq ***changed, int *n_changed);

/* Called by engine_step with the seqs it is about to run for the first time (their first prefill
 * chunk), before the backend runs the step; seqs[0..n) are borrowed for the call. A seq is listed
 * once in its life (not again after a preemption). */
typedef void (*engine_start_fn)(void *ctx, struct engine_seq *const *seqs, int n);
/* Sets (fn NULL: clears) the start callback; ctx is passed to it. */
void engine_set_on_start(struct engine *e, engine_start_fn fn, void *ctx);

/* Stops a queued or running seq: it finishes with FINISH_CANCELLED at the next engine_step (and
 * is listed in its *changed). A seq whose deadline has passed finishes the same way at the start of
 * a step, with FINISH_TIMEOUT: one clock reading per step while any seq has a deadline, and a walk
 * of the seqs only when the earliest deadline has passed. */
void engine_cancel(struct engine *e, struct engine_seq *s);

/* Frees a finished seq. */
void engine_release(struct engine *e, struct engine_seq *s);

bool engine_has_work(const struct engine *e);
/* The engine's clock (engine_opts.clock), in seconds: the time base of deadlines. */
double engine_now(const struct engine *e);
void engine_get_stats(const struct engine *e, struct engine_stats *st);
const char *engine_backend_name(const struct engine *e);
/* Whether the model thinks: its tokenizer has <think> and </think> as added tokens (engine/think.h);
 * then outputs are split into reasoning and answer, and thinking budgets apply. */
bool engine_thinks(const struct engine *e);
/* The backend the engine steps (borrowed; for backend-specific figures such as GPU memory). */
const struct backend *engine_backend(const struct engine *e);
/* The vocabulary grammars for this engine are compiled against (engine/grammar.h), built on the first
 * call (a trie of the tokenizer's ids: tens of milliseconds for a 150k vocabulary) and owned by the
 * engine. NULL with err when memory runs out. */
struct gr_vocab;
const struct gr_vocab *engine_grammar_vocab(struct engine *e, char *err, size_t errlen);
/* The longest sequence (prompt + max_tokens) engine_add accepts in a lane (-1 = any lane). */
int engine_max_model_len(const struct engine *e, int lane);
