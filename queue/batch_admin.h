/* The batch commands' side of queue/batch.h: reading batches (one, or the newest ones),
 * cancelling one, and running a batch's finished jobs again from their stored requests. The
 * hash's fields are those of queue/batch.h; docs/BATCHES.md is the user's side. */
#pragma once
#include <stdbool.h>

#include "queue/keys.h"

struct rq;

/* A batch as its hash says (llmq:batch:<id>). */
struct rq_batch_info {
    char id[RQ_BATCH_ID_MAX + 1];
    bool exists;        /* the hash is there (a zset entry may outlive it) */
    char state[16];     /* queued, running, completed, cancelled; "" when it does not exist */
    char input[512];    /* the input file name as given to `llmq enqueue` (cut to fit) */
    double created_at;  /* unix seconds; 0 when unknown */
    double finished_at; /* unix seconds when its last job became final; 0 while open */
    long long total, queued, running, completed, failed, cancelled;
    bool enqueuing; /* an `llmq enqueue` is still adding jobs */
};

/* Reads batch `id` into *b. Returns 1 when it exists, 0 when Redis has no hash for it, -1
 * (rq_error; also for an id that is not a batch id). */
int rq_batch_get(struct rq *q, const char *id, struct rq_batch_info *b);

/* The newest `limit` batches of <p>:batches (by created_at, newest first), each with its hash
 * (exists false when it expired), into a new array *out of *n (the caller frees it). In two
 * round trips. 0, or -1 (rq_error). */
int rq_batch_list(struct rq *q, int limit, struct rq_batch_info **out, int *n);

enum rq_batch_cancel_result {
    RQ_BATCH_CANCEL_DONE = 1,      /* cancelled now */
    RQ_BATCH_CANCEL_ALREADY = 0,   /* it was cancelled before (running jobs asked again) */
    RQ_BATCH_CANCEL_UNKNOWN = -2,  /* no such batch */
    RQ_BATCH_CANCEL_COMPLETED = -3 /* it has completed: nothing to cancel */
};

/* Cancels batch `id` in one atomic step: its state becomes cancelled, so a job of it that a
 * worker fetches from now on is cancelled there without running (it gets its row and final
 * status as any cancelled job), and its jobs running on a worker are added to <p>:cancel (the
 * worker stops them at its next step, keeping what they generated). The counts move as those
 * jobs end; the batch finishes (finished_at, batch_completed event, PUBLISH) when the last one
 * has. *asked gets the running jobs asked to stop, *queued the jobs still queued. Returns an enum
 * rq_batch_cancel_result, or -1 (rq_error). */
int rq_batch_cancel(struct rq *q, const char *id, long long *asked, long long *queued);

/* One job to run again: its stored request (the job as the worker received it, with its
 * batch_id), its key, the queue reference to push it to and the status of its row. Borrowed. */
struct rq_batch_requeue_job {
    const char *raw;
    const char *id;
    const char *queue;
    const char *status;
};

enum rq_batch_requeue_result {
    RQ_BATCH_REQUEUE_OK = 0,
    RQ_BATCH_REQUEUE_BUSY = 1,      /* a job of the set is queued or running: nothing done */
    RQ_BATCH_REQUEUE_OTHER = 2,     /* a job's hash names another batch: nothing done */
    RQ_BATCH_REQUEUE_CANCELLING = 3 /* the batch is cancelled and has jobs not yet final */
};

/* Pushes jobs[0..n) of batch `id` again, in one atomic step, as new attempts of the same keys:
 * each gets a fresh hash (queued, attempts 0, its batch) and goes to the back of its queue; the
 * batch's counts move from each job's status to queued and the batch is open again (running,
 * no expiry; a cancelled one becomes running). When the batch's hash has expired it is made
 * again from `db` (the batch as the database has it: input, created_at and the counts of its
 * rows). Refused as a whole when a job of the set is not final. Returns an enum
 * rq_batch_requeue_result (why[len] names the job or state at fault), or -1 (rq_error). */
int rq_batch_requeue(struct rq *q, const char *id, const struct rq_batch_requeue_job *jobs, int n,
                     const struct rq_batch_info *db, char *why, size_t len);
