/* See tick.h. */
#include "queue/tick.h"

#include <string.h>

#include "queue/retry.h"
#include "queue/rq.h"

int rq_tick(struct rq *q, const struct rq_worker_info *info, struct rq_tick_result *res)
{
    struct rq_tick_result dummy;
    if (!res)
        res = &dummy;
    memset(res, 0, sizeof *res);
    int64_t now = rq_mono_ms();
    int rc = 0;
    char first[sizeof q->err] = "";
    if (now >= q->next_heartbeat_ms) {
        int hb = rq_heartbeat(q, info);
        if (hb == 0) {
            res->heartbeat = true;
            q->next_heartbeat_ms = now + 1000LL * q->o.heartbeat_interval_s;
        } else {
            res->id_taken = hb == RQ_HB_TAKEN;
            rc = -1;
            memcpy(first, q->err, sizeof first);
        }
    }
    if (rc && !q->cmd.ctx) /* the connection is gone (a timeout): the rest would wait for it too */
        goto out;
    if (now >= q->next_reap_ms) {
        if (rq_reap(q, &res->reap) == 0) {
            res->reaped = true;
            q->next_reap_ms = now + 1000LL * q->o.reaper_interval_s;
            if (res->reap.grace_ms > 0) /* look again as soon as a grace is over */
                rq_tick_reap_in(q, res->reap.grace_ms + 10);
        } else if (rc == 0) {
            rc = -1;
            memcpy(first, q->err, sizeof first);
        }
    }
    if (rc && !q->cmd.ctx)
        goto out;
    if (now >= q->next_retry_ms) {
        int period = q->o.retry_backoff_base_ms / 2 < 1000 ? q->o.retry_backoff_base_ms / 2 : 1000;
        if (period < 10)
            period = 10;
        int n = rq_retry_due(q, 1000);
        if (n >= 0) {
            res->retried = n;
            q->next_retry_ms = now + period;
        } else if (rc == 0) {
            rc = -1;
            memcpy(first, q->err, sizeof first);
        }
    }
out:
    if (rc)
        memcpy(q->err, first, sizeof first);
    return rc;
}

void rq_tick_heartbeat_now(struct rq *q)
{
    q->next_heartbeat_ms = 0;
}

void rq_tick_reap_in(struct rq *q, int64_t in_ms)
{
    int64_t at = rq_mono_ms() + (in_ms > 0 ? in_ms : 0);
    if (at < q->next_reap_ms)
        q->next_reap_ms = at;
}
