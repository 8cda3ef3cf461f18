/* `llmq worker`: the main loop. Jobs come from the Redis queues (queue/), run through the engine
 * in two lanes (worker/loop/lanes.h), and finish as SQLite rows (worker/store/writer.h) acknowledged in Redis
 * after their commit. docs/WORKER.md describes it for users.
 *
 * One iteration per engine step:
 *   1. Redis chores (rq_tick: heartbeat, reaper, due retries) and the Redis side of jobs whose
 *      rows are committed (one rq_ack for all; dead letters, routing, retries);
 *   2. fetch: top the lanes up while the engine has room (never blocking while it has work;
 *      blocking up to redis.block_timeout_ms only when the worker holds nothing); parse,
 *      validate, tokenize and route each job, or fail it;
 *   3. cancellations of held jobs (one SMISMEMBER);
 *   4. engine_step;
 *   5. progress of running jobs every worker.progress_every_tokens tokens (one pipeline);
 *   6. finished jobs become rows; rows go to SQLite in one transaction on the writer thread
 *      (sqlite.commit_max_rows / commit_interval_ms), and their jobs are acknowledged in Redis at
 *      step 1 of a later iteration once the transaction is committed.
 * A failure of Redis or SQLite never drops a job: the step is tried again at a later iteration
 * while the job stays in this worker's processing list. */
#pragma once
#include <stdbool.h>

struct cfg;

struct wk_opts {
    bool drain;    /* exit once the queues, the retry set and every worker's list are empty */
    bool stats;    /* log a per-phase timing line every metrics interval (always once at exit) */
    bool force_id; /* take the worker id over even while another live worker holds it */
};

#define WK_EXIT_JOBS_FAILED 3 /* --drain: jobs failed or were dead-lettered during the run */
#define WK_EXIT_UNREACHABLE 69 /* --drain: Redis unreachable at the start (CLI_EXIT_UNREACHABLE) */

/* Runs the worker until a stop signal (worker/loop/signals.h) or, with drain, until there is
 * nothing left. c must be validated; it is borrowed for the run. Returns the exit status: 0 after a
 * clean stop (also when the signal came during set-up), 1 when the worker could not start (model,
 * tokenizer, engine, database, options, its id held by another live worker) or when another
 * instance took its id over while it ran, WK_EXIT_UNREACHABLE with drain when Redis stayed
 * unreachable for redis.start_timeout_s,
 * WK_EXIT_JOBS_FAILED with drain when any job finished failed or was dead-lettered (by this worker or its
 * reaper). */
int wk_run(const struct cfg *c, const struct wk_opts *o);
