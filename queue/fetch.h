/* Reliable fetch: jobs move from <p>:queue:<name> into this worker's <p>:processing:<worker>
 * atomically (LMOVE/BLMOVE ... RIGHT LEFT), so a job is always in exactly one list and survives
 * a crash of the worker (the reaper puts it back, queue/reaper.h).
 *
 * A fetch is two steps, neither of which decodes a job inside Redis (a script that parsed
 * megabytes of JSON would hold Redis for seconds):
 *   1. the fetch script moves waiting jobs, up to a count and a byte bound (it stops once the
 *      bound is reached: the first job always moves, so a single large job still does), and
 *      returns them as they are;
 *   2. rq reads each job's id (rq_job_id), gives one to a job in llmq's form that has none, and
 *      the start script marks each job running in its hash (<p>:job:<id>: status running,
 *      worker, queue, started_at, created_at if unset; the delivery is counted in `attempts`
 *      only when the job starts running, queue/attempt.h), counts it running in its
 *      batch, adds an event and reports a pending cancel.
 * A crash between the steps leaves the moved jobs in the processing list with their hashes
 * still queued: the reaper puts them back without counting a delivery. A reply lost between
 * them makes the next fetch put them back first (rq_reconcile).
 *
 * A duplicate is not handed out: a job whose hash is final (completed, failed, cancelled), or
 * running on this or another live worker (its heartbeat key exists), arrived again by a plain
 * LPUSH (retries, the reaper, requeue-dead and `llmq enqueue --replace` set the hash to queued
 * first). The start script takes it out of the processing list again and adds a `duplicate`
 * event; its hash and row stay as they are, rq logs it and counts it in rq->duplicates. A job in llmq's form
 * without an id gets one (a UUIDv7): the entry in the processing list is replaced by the JSON
 * with the id (LSET, in the start script), so a replay after a crash keeps the same id.
 *
 * A job whose hash, or its batch's hash, is of the wrong type (queue/badkey.h) is handed out
 * without an id (rq_job.id ""), its keys left alone: it runs and is acknowledged like a job
 * without an id; rq logs the key once. A source queue of the wrong type is not fetched from
 * (logged once).
 *
 * Waiting jobs are taken without blocking, as many as allowed, in one round trip (then one more
 * for step 2); the call blocks (BLMOVE on the dedicated blocking connection, at most block_ms in
 * all) only when every queue is empty. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue/keys.h"

struct rq;

/* A job held by this worker. */
struct rq_job {
    char *raw;                    /* its JSON exactly as in the processing list (owned, NUL-terminated) */
    size_t len;                   /* bytes of raw */
    char id[RQ_ID_MAX + 1];       /* its id (own or assigned); "" when it has none (not JSON ...) */
    bool id_assigned;             /* rq gave it the id at this fetch (raw includes it) */
    char queue[RQ_QREF_MAX + 1];  /* the queue it came from: a reference ("short", "qwen3-8b:short") */
    int attempts;                 /* deliveries so far, this one included (0 without an id); counted in
                                     Redis only once it runs (rq_attempt) */
    int stalls;                   /* earlier deliveries that ran it and ended with the worker lost
                                     (killed, crashed): the reaper counts them (queue/reaper.h) */
    char held_by[RQ_NAME_MAX + 1]; /* a line without an id put back by the reaper: the worker that
                                      held it then (its failed row may exist: rq_done_fn); else "" */
    bool counted;                 /* rq_attempt counted this delivery in its hash */
    bool cancel_requested;        /* its id was in <p>:cancel at fetch */
    char batch_id[RQ_BATCH_ID_MAX + 1]; /* the batch its hash counts it in; "" = none */
};

/* Frees what j owns and zeroes it. Accepts NULL. */
void rq_job_free(struct rq_job *j);
/* Copies src into dst (a new raw). 0, or -1 out of memory. */
int rq_job_copy(struct rq_job *dst, const struct rq_job *src);

/* One queue to fetch from and the most jobs to take from it in this call (0 = none now, e.g.
 * its lane is full). */
struct rq_source {
    const char *queue; /* a queue reference: "short", "long", "qwen3-8b:short" */
    int max;
};

#define RQ_FETCH_MAX_SOURCES 32

enum rq_order {
    RQ_ORDER_PRIORITY,    /* empty the first source (up to its max) before looking at the next */
    RQ_ORDER_ROUND_ROBIN, /* one job from each source in turn */
};

/* block_ms: 0 never blocks; < 0 blocks up to the configured redis.block_timeout_ms. */
#define RQ_BLOCK_DEFAULT (-1)

/* Fetches up to `max` jobs from the sources (1..RQ_FETCH_MAX_SOURCES) in `order` into out[0..max). Returns
 * how many (0 after block_ms with nothing to do) or -1 (rq_error). When Redis cannot be reached a blocking
 * fetch still waits out block_ms (sleeping) before it fails, so a worker loop does not spin. The caller owns
 * the jobs (rq_job_free) and must end each one with rq_ack, rq_retry, rq_requeue or rq_dead. */
int rq_fetch(struct rq *q, const struct rq_source *src, int nsrc, enum rq_order order, int max, int block_ms,
             struct rq_job *out);
/* rq_fetch where sources share budgets: sources with the same group[i] > 0 take at most their
 * (equal) max together, e.g. a lane fed by its model queues and the unnamed queue. group NULL or
 * group[i] 0: a source of its own. max_bytes bounds the bytes of job JSON this call moves: jobs
 * are taken while fewer bytes than that have been, so the first job always moves whatever its
 * size, and a call moves at most max_bytes plus one job; <= 0: rq_opts.fetch_max_bytes (what
 * rq_fetch uses). */
int rq_fetch_grouped(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                     enum rq_order order, int max, int64_t max_bytes, int block_ms, struct rq_job *out);

/* Puts back every entry of this worker's processing list that rq does not hold (a fetch whose
 * replies were lost). Done by rq_fetch on its own after such a loss; exposed for tests.
 * Returns how many were put back, or -1. */
int rq_reconcile(struct rq *q);
