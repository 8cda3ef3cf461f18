/* See replicas.h. */
#include "queue/replicas.h"

#include <string.h>

#include "queue/rq.h"

int rq_wait_cmd(struct rq *q, struct rq_pipe *p)
{
    if (q->o.wait_replicas <= 0)
        return 0;
    rq_pipe_cmd(p, "WAIT");
    rq_pipe_int(p, q->o.wait_replicas);
    rq_pipe_int(p, q->o.wait_timeout_ms > 0 ? q->o.wait_timeout_ms : 1);
    return 1;
}

int rq_wait_check(struct rq *q, const redisReply *r, const char *what)
{
    char w[64];
    snprintf(w, sizeof w, "%s (WAIT)", what);
    if (rq_reply_error(r, w, q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "%s: unexpected reply", w);
    if (r->integer >= q->o.wait_replicas) {
        q->wait_short = false;
        return 0;
    }
    q->wait_short = true;
    q->wait_shortfalls++;
    return rq_fail(
        q,
        "%s: %lld of %d replica%s confirmed within %d ms (redis.wait_replicas): the write is on the "
        "master only, a failover now could lose it",
        what, r->integer, q->o.wait_replicas, q->o.wait_replicas == 1 ? "" : "s", q->o.wait_timeout_ms);
}

int rq_wait(struct rq *q, const char *what)
{
    q->wait_lost = false;
    if (q->o.wait_replicas <= 0)
        return 0;
    redisReply *r = rq_conn_command(&q->cmd, "WAIT %d %d", q->o.wait_replicas,
                                    q->o.wait_timeout_ms > 0 ? q->o.wait_timeout_ms : 1);
    if (!r) {
        q->wait_lost = true;
        return rq_fail_conn(q, what);
    }
    int rc = rq_wait_check(q, r, what);
    freeReplyObject(r);
    return rc;
}

bool rq_wait_short(const struct rq *q)
{
    return q->wait_short;
}

bool rq_wait_lost(const struct rq *q)
{
    return q->wait_lost;
}

int rq_wait_ready(struct rq *q, const char *what)
{
    if (q->o.wait_replicas <= 0 || !q->wait_short)
        return 0;
    redisReply *r = rq_conn_command(&q->cmd, "ROLE");
    if (!r)
        return rq_fail_conn(q, what);
    long long n = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements >= 3 && r->element[2]->type == REDIS_REPLY_ARRAY)
        n = (long long)r->element[2]->elements;
    freeReplyObject(r);
    if (n < 0 || n >= q->o.wait_replicas) /* an ACL that forbids ROLE: let WAIT tell */
        return 0;
    return rq_fail(q, "%s: %lld replica%s connected, redis.wait_replicas asks for %d", what, n,
                   n == 1 ? "" : "s", q->o.wait_replicas);
}
