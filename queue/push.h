/* The client side, for `llmq enqueue`, tests and benchmarks: pushes jobs onto a queue the way
 * any client may (LPUSH), and for jobs with an id first creates their hash (status queued,
 * queue, created_at, attempts 0) so `llmq status` and clients can follow them from the start.
 * A client that is not llmq only needs the LPUSH (docs/QUEUE.md). */
#pragma once
#include <stddef.h>

struct rq;

struct rq_push_item {
    const char *raw; /* the job's JSON (borrowed) */
    size_t len;
    const char *id; /* its id (rq_job_id), or NULL/"" for none: then no hash is written */
};

/* Pushes items[0..n) onto <p>:queue:<queue> in order (the first pushed is fetched first), in
 * one pipeline: the hashes (DEL + HSET, an XADD each), then LPUSHes of up to 1000 jobs each.
 * 0, or -1 (rq_error; when the connection failed, some jobs may have been pushed). */
int rq_push(struct rq *q, const char *queue, const struct rq_push_item *items, int n);
