/* Giving held jobs back without a verdict: on shutdown the jobs a worker could not finish in
 * time go back to the FRONT of their queue (RPUSH: fetched next), and a short-queue job whose
 * prompt is over long_threshold_tokens moves to the long queue the same way. Atomic per job
 * (a Lua script: LREM from processing + RPUSH + hash status queued). The delivery is not
 * counted: attempts goes back down by one for a job whose delivery rq_attempt counted. */
#pragma once

#include "queue/fetch.h"

struct rq;

/* Requeues jobs[0..n) (borrowed) to `to_queue`, or each to the queue it came from when NULL;
 * they will be fetched in the order given (jobs[0] first), before anything else waiting there.
 * `reason` goes into the event ("shutdown", "route_long", ...; NULL = "requeued"). All in one
 * round trip. Returns how many were still held and moved, or -1 (rq_error; try again). */
int rq_requeue(struct rq *q, const struct rq_job *const *jobs, int n, const char *to_queue,
               const char *reason);
