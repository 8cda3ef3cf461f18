/* The reaper: any worker, every reaper_interval_s, looks at the workers in <p>:workers whose
 * heartbeat key is gone and, with ONE Lua script per such worker (atomic, and it checks the
 * heartbeat again inside), moves every job of its processing list back to the front of the queue
 * it came from (the `queue` field of the job's hash; the default queue for jobs without one) and
 * removes the worker from the set. A job that has already had max_attempts deliveries goes to
 * <p>:dead instead, as does an entry that is not JSON at all. A delivery counts only when the job
 * ran (queue/attempt.h): a job that keeps killing the workers that run it counts up, one that was
 * only held when its worker died keeps its count. */
#pragma once

struct rq;

struct rq_reap_result {
    int workers;  /* lapsed workers cleaned up */
    int requeued; /* jobs put back on a queue */
    int dead;     /* jobs dead-lettered */
};

/* Reaps every lapsed worker other than this one. 0, or -1 (res holds what was done). */
int rq_reap(struct rq *q, struct rq_reap_result *res);

/* At start-up, before the first fetch: a worker that restarts with a fixed id (--id) takes back
 * what its previous life left in its processing list, the same way (the interrupted delivery
 * counts for the jobs that ran in it). Refused while this process holds jobs. 0, or -1. */
int rq_recover(struct rq *q, struct rq_reap_result *res);
