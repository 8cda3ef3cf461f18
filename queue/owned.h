/* Which of the jobs a worker holds are still its own in Redis: still in its processing list.
 * A worker that could not renew its heartbeat for heartbeat_ttl_s may have been reaped meanwhile;
 * the jobs that are gone from its list were put back on their queues for another worker, so it
 * must not write their rows (they would run twice). */
#pragma once
#include <stdbool.h>

struct rq;
struct rq_job;

/* One LRANGE of this worker's processing list: owned[i] says whether jobs[i] (its raw text, as
 * fetched) is still in it. 0, or -1 (rq_error) with owned untouched. */
int rq_owned(struct rq *q, const struct rq_job *const *jobs, int n, bool *owned);
