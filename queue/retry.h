/* Retries with exponential backoff and jitter through <p>:retry, a sorted set of raw job JSON
 * scored by the unix time in milliseconds when the job is due again.
 *
 * rq_retry moves a failed held job from the processing list into the set (atomically, a Lua
 * script), or to the dead list when it has had max_attempts deliveries; rq_retry_due (called
 * by the worker loop, see rq_tick) moves due entries back to the end of their queue. The delay
 * after delivery k is base * 2^(k-1), capped at max, then scaled by a random factor in
 * [0.75, 1.25) so that jobs that failed together do not come back together. */
#pragma once
#include <stdint.h>

#include "queue/fetch.h"

struct rq;

/* The delay after delivery `attempt` (>= 1): min(base_ms * 2^(attempt-1), max_ms) * (0.75 + u/2)
 * with u in [0, 1), capped at max_ms. */
int64_t rq_backoff_ms(int base_ms, int max_ms, int attempt, double u);

enum rq_retry_outcome {
    RQ_RETRY_SCHEDULED = 0, /* in <p>:retry, due after *delay_ms */
    RQ_RETRY_DEAD = 1,      /* out of attempts (or without an id to count them by): in <p>:dead */
    RQ_RETRY_NOT_HELD = 2,  /* it was no longer in this worker's processing list: nothing done */
};

/* Schedules the held job for another delivery after its backoff, with `error` and its `code`
 * (NULL = "internal") in its hash (status queued, error, error_code, retry_at), or dead-letters
 * it, then with `result` as the hash's result field (NULL = none). Returns an enum
 * rq_retry_outcome, or -1 (rq_error; the job is still held, try again). delay_ms (may be NULL)
 * gets the delay; batch_done (may be NULL) the job's batch's total when a dead-letter completed
 * the batch, else 0. */
int rq_retry(struct rq *q, const struct rq_job *job, const char *code, const char *error, const char *result,
             int64_t *delay_ms, long long *batch_done);

/* Moves up to `max` retry entries that are due back to their queue (LPUSH, behind waiting
 * jobs), atomically. Returns how many moved, or -1. */
int rq_retry_due(struct rq *q, int max);
