/* The dead-letter list <p>:dead: jobs that used up max_attempts, kept killing workers, or could
 * not be parsed or validated. Each entry is one JSON object (newest at the left):
 *
 *   {"id": "job-1" | null, "error": "...", "error_code": "invalid_request", "failed_at": 1764450901.123,
 *    "attempts": 3, "worker": "gpu1-4242", "queue": "short",
 *    "job": "<the job's JSON exactly as it was pushed>"}
 *
 * A job with an id also gets status failed, the error and its code in its hash (expiring after
 * result_ttl), and its batch counts it failed. `llmq requeue-dead` puts entries back
 * (rq_dead_requeue), the job still in its batch. */
#pragma once

#include "queue/fetch.h"
#include "queue/results.h"

struct rq;

/* Dead-letters a held job with `error` and its `code` ("invalid_request", ...; NULL = "internal")
 * atomically: LREM from processing + LPUSH <p>:dead + hash failed, with `result` as the hash's
 * result field (NULL = none). Returns 1, 0 when the job was no longer in this worker's
 * processing list (nothing done), or -1 (rq_error; still held, try again). batch_done (may be
 * NULL) gets the job's batch's total when this completed the batch, else 0. row (NULL = none): the
 * job's row, published onto <p>:results in the same script (queue/results.h). */
int rq_dead(struct rq *q, const struct rq_job *job, const char *code, const char *error, const char *result,
            const struct rq_row *row, long long *batch_done);

/* Puts dead entries back at the end of the queue they failed on, oldest first, with a fresh
 * hash (status queued, attempts 0): those whose id is in ids[0..n), or every entry when n == 0
 * (entries without an id are only requeued by n == 0). Returns how many, or -1. */
int rq_dead_requeue(struct rq *q, const char *const *ids, int n);
