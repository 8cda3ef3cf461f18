/* The reaper: any worker, every reaper_interval_s, looks at the workers in <p>:workers whose
 * heartbeat key is gone and, with ONE Lua script per such worker (atomic, and it checks the
 * heartbeat again inside), moves every job of its processing list back to the front of the queue
 * it came from (the `queue` field of the job's hash; the default queue for jobs without one) and
 * removes the worker from the set. A job that has already had max_attempts deliveries (each
 * fetch counts one, so a job that keeps killing workers counts up) goes to <p>:dead instead, as
 * does an entry that is not JSON at all. */
#pragma once
#include <stdint.h>

struct rq;

struct rq_reap_result {
    int workers;      /* lapsed workers cleaned up */
    int requeued;     /* jobs put back on a queue */
    int dead;         /* jobs dead-lettered */
    int graced;       /* lapsed workers still in their grace (not reaped yet) */
    int64_t grace_ms; /* the shortest grace left of those (0 = none) */
};

/* Reaps every lapsed worker other than this one. A worker is reaped only once its heartbeat has
 * stayed gone for one heartbeat_interval_s more, counted by Redis from when a reaper first found
 * it lapsed (the <p>:lapsed:<id> mark, which the worker's heartbeat deletes): a worker that could
 * not reach Redis (a frozen or partitioned server) heartbeats as soon as Redis answers again and
 * keeps its jobs, as the heartbeats of every worker lapse together while the server is frozen.
 * 0, or -1 (res holds what was done). */
int rq_reap(struct rq *q, struct rq_reap_result *res);

/* At start-up, before the first fetch: a worker that restarts with a fixed id (--id) takes back
 * what its previous life left in its processing list, the same way (the interrupted delivery
 * counts). Refused while this process holds jobs. 0, or -1. */
int rq_recover(struct rq *q, struct rq_reap_result *res);
