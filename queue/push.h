/* The client side, for `llmq enqueue`, tests and benchmarks: pushes jobs onto a queue the way
 * any client may (LPUSH), and for jobs with an id first creates their hash (status queued,
 * queue, created_at, attempts 0, batch_id) so `llmq status` and clients can follow them from the
 * start. A client that is not llmq only needs the LPUSH (docs/QUEUE.md). */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct rq;

/* What a push does with a job whose hash already exists (a known key). */
enum rq_push_mode {
    RQ_PUSH_NEW,     /* refuse it: it is queued, running, or finished within result_ttl_s */
    RQ_PUSH_REPLACE, /* refuse it when queued or running; run a finished one again (fresh hash) */
    RQ_PUSH_FORCE,   /* push it with a fresh hash whatever it was (tests, benchmarks) */
};

struct rq_push_item {
    const char *raw; /* the job's JSON (borrowed) */
    size_t len;
    const char *id; /* its key (rq_job_id), or NULL/"" for none: then no hash is written */
    /* set by rq_push: NULL = pushed, else the status of the hash that refused it ("queued",
     * "running", "completed", ...; owned by the item: rq_push_item_clear frees it) */
    char *refused;
};

/* Frees items[0..n)'s `refused`. */
void rq_push_item_clear(struct rq_push_item *items, int n);

/* Pushes items[0..n) onto <p>:queue:<queue> in order (the first pushed is fetched first), in
 * one pipeline of script calls of up to 1000 jobs each; within a call, the hash checks, hashes,
 * events, LPUSHes and batch counts happen atomically. batch_id (NULL = none) must name a batch
 * opened with rq_batch_open (queue/batch.h), and then every item needs an id: a job new to the
 * batch adds one to its total. Returns how many items were refused (see mode and
 * items[i].refused), or -1 (rq_error; when the connection failed, some jobs may have been
 * pushed). */
int rq_push(struct rq *q, const char *queue, const char *batch_id, enum rq_push_mode mode,
            struct rq_push_item *items, int n);

/* The status of the hashes of ids[0..n) ("" when there is none) into status[i] (at most 15
 * bytes), in one round trip: what rq_push in RQ_PUSH_NEW mode would refuse. 0, or -1. */
int rq_job_statuses(struct rq *q, const char *const *ids, int n, char (*status)[16]);
