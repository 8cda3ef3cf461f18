/* Batches: the jobs of one `llmq enqueue` (like an OpenAI Batch), followed in Redis.
 *
 *   <p>:batch:<id>   hash  id, input, created_at, total, queued, running, completed, failed,
 *                          cancelled, state (queued | running | completed | cancelled),
 *                          finished_at, enqueuing and enqueue_until (while an enqueue is
 *                          still adding jobs)
 *   <p>:batches      zset  batch ids scored by created_at
 *   <p>:batch-done   channel  the id of a batch when its last job becomes final
 *
 * The counts move in the same Lua steps that move the jobs (queue/scripts.h), so they equal the
 * statuses of the job hashes that name the batch; the step that makes the last job final sets
 * state completed and finished_at, adds a batch_completed event and PUBLISHes the id. The hash
 * expires result_ttl_s after completion (the zset entry stays until a later step prunes it).
 *
 * An enqueue: rq_batch_open, rq_push(..., batch_id, ...) as often as needed, rq_batch_seal.
 * Until the seal the batch cannot complete (its total is still growing), or for at most an hour
 * after the open when the enqueue was killed before it sealed (`enqueue_until`). */
#pragma once
#include <stdbool.h>

struct rq;

enum rq_batch_open_result {
    RQ_BATCH_CREATED = 0,   /* a new batch */
    RQ_BATCH_REOPENED = 1,  /* it existed and `append` was asked: jobs are added to it */
    RQ_BATCH_EXISTS = 2,    /* it exists and `append` was not asked: nothing done */
    RQ_BATCH_CANCELLED = 3, /* it exists and was cancelled: nothing done */
};

/* Creates batch `batch_id` (rq_valid_batch_id) with `input` (a file name, as given; "" = none),
 * or with `append` reopens an existing one, and counts one enqueue in progress. Returns an enum
 * rq_batch_open_result, or -1 (rq_error). */
int rq_batch_open(struct rq *q, const char *batch_id, const char *input, bool append);

/* Ends the enqueue rq_batch_open began: from now on (once every enqueue in progress ended) the
 * batch completes when its last job is final, at once if they all are. Returns the batch's total
 * when this call completed it, 0 when it did not, or -1 (rq_error). */
long long rq_batch_seal(struct rq *q, const char *batch_id);

/* The state of batch `batch_id` ("queued", "running", "completed", "cancelled") into state, ""
 * when Redis has no such batch. 0, or -1 (rq_error). */
int rq_batch_state(struct rq *q, const char *batch_id, char state[16]);

/* A new batch id: "batch_" and the 32 hex digits of a UUIDv7 (time-ordered), into id[39]. */
void rq_new_batch_id(char id[39]);
