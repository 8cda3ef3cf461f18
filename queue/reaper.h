/* The reaper: any worker, every reaper_interval_s, looks at the workers in <p>:workers whose
 * heartbeat key is gone and, with ONE Lua script per such worker (atomic, and it checks the
 * heartbeat again inside), moves every job of its processing list back to the front of the queue
 * it came from (the `queue` field of the job's hash; the default queue for jobs without one) and
 * removes the worker from the set. A job that has already had max_attempts deliveries goes to
 * <p>:dead instead, as does an entry that is not JSON at all. A delivery counts only when the job
 * ran (queue/attempt.h): a job that keeps killing the workers that run it counts up, one that was
 * only held when its worker died keeps its count. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct rq;

struct rq_reap_result {
    int workers;      /* lapsed workers cleaned up */
    int requeued;     /* jobs put back on a queue */
    int dead;         /* jobs dead-lettered */
    int acked;        /* jobs whose row was committed: acknowledged (rq_reap_set_lookup) */
    int graced;       /* lapsed workers still in their grace (not reaped yet) */
    int64_t grace_ms; /* the shortest grace left of those (0 = none) */
};

/* A job's committed row as the caller's database has it: what the worker that wrote it would
 * have acknowledged. Strings are owned (malloc) by the struct: rq_done_clear frees them. */
struct rq_done {
    char *id;              /* the row's id */
    char *worker;          /* the row's worker_id */
    double started_at;     /* the row's started_at (unix s): when that worker fetched it */
    int status;            /* an enum rq_status (queue/ack.h): completed, failed or cancelled */
    char *finish_reason;   /* NULL = none */
    char *error, *error_code;
    int prompt_tokens, completion_tokens;
    double first_token_at; /* 0 = unknown */
    char *result;          /* the hash's `result` field (the result line, or its marker); NULL = none */
    char *row;             /* the row as JSON, published onto <p>:results with the ack (queue/results.h);
                              NULL = none */
};
/* Frees d's strings and zeroes it. */
void rq_done_clear(struct rq_done *d);

/* Looks up job `id` in the caller's store: 1 and *out filled when it has a committed row (the
 * caller owns nothing of out afterwards), 0 when it has none (or cannot tell). For a line in
 * which rq_job_id finds no id, id is NULL: the row sought is the nth (from 1: the nth line with
 * that text in the list) newest failed row that `worker` wrote for the line line[0..len). */
typedef int (*rq_done_fn)(void *ctx, const char *id, const char *worker, const char *line, size_t len, int nth,
                          struct rq_done *out);

/* Makes rq_reap and rq_recover ask fn (NULL: nobody) about each job of the list they take back:
 * a job whose row is committed for the very delivery the lapsed worker held (the row's worker is
 * the one the hash names, and it was fetched no later than the row says) is acknowledged with
 * the row's status and result, atomically in the reap script, instead of being put back or
 * dead-lettered. Rows the caller cannot see (another host's database) are not found: those jobs
 * are handled as before. */
void rq_reap_set_lookup(struct rq *q, rq_done_fn fn, void *ctx);

/* Reaps every lapsed worker other than this one. A worker is reaped only once its heartbeat has
 * stayed gone for one heartbeat_interval_s more, counted by Redis from when a reaper first found
 * it lapsed (the <p>:lapsed:<id> mark, which the worker's heartbeat deletes): a worker that could
 * not reach Redis (a frozen or partitioned server) heartbeats as soon as Redis answers again and
 * keeps its jobs, as the heartbeats of every worker lapse together while the server is frozen.
 * 0, or -1 (res holds what was done). */
int rq_reap(struct rq *q, struct rq_reap_result *res);

/* At start-up, before the first fetch: a worker that restarts with a fixed id (--id) takes back
 * what its previous life left in its processing list, the same way (the interrupted delivery
 * counts for the jobs that ran in it). Refused while this process holds jobs. 0, or -1. */
int rq_recover(struct rq *q, struct rq_reap_result *res);
