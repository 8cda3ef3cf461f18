/* The periodic Redis chores of a worker, for its main loop to call every step (cheap when
 * nothing is due): the heartbeat every heartbeat_interval_s, the reaper every
 * reaper_interval_s, and moving due retries back to their queues every second (or every
 * retry_backoff_base_ms / 2 when that is shorter). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "queue/heartbeat.h"
#include "queue/reaper.h"

struct rq;

struct rq_tick_result {
    bool heartbeat;             /* a heartbeat was sent */
    bool reaped;                /* the reaper ran */
    struct rq_reap_result reap; /* what it did */
    int retried;                /* retry entries moved back to their queue */
    bool id_taken;              /* the heartbeat found another instance holding this worker id */
};

/* Does what is due. 0, or -1 with the first failure in rq_error (the other chores still ran,
 * unless the failure dropped the connection: a server that does not answer would make each of
 * them wait for its timeout; a failed chore is tried again at the next call). res may be NULL. */
int rq_tick(struct rq *q, const struct rq_worker_info *info, struct rq_tick_result *res);

/* Makes the heartbeat due at the next rq_tick (a worker that could not reach Redis renews it
 * first thing once Redis answers again). */
void rq_tick_heartbeat_now(struct rq *q);

/* Brings the reaper's next run forward to in_ms from now (never later than it is scheduled): for a
 * caller that knows when a heartbeat lapses (queue/drain.h) and wants its jobs back at once. */
void rq_tick_reap_in(struct rq *q, int64_t in_ms);
