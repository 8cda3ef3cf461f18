/* See purge.h. */
#include "queue/purge.h"

#include <stdio.h>
#include <string.h>

#include "queue/keys.h"
#include "queue/rq.h"

/* The key purged into buf (RQ_KEY_MAX bytes). 0, or -1 (rq_error). */
static int purge_key(struct rq *q, enum rq_purge_what what, const char *ref, char *buf)
{
    if (what == RQ_PURGE_RETRY)
        return snprintf(buf, RQ_KEY_MAX, "%s", q->keys.retry) < RQ_KEY_MAX ? 0 : -1;
    if (what == RQ_PURGE_DEAD)
        return snprintf(buf, RQ_KEY_MAX, "%s", q->keys.dead) < RQ_KEY_MAX ? 0 : -1;
    if (rq_key_queue(&q->keys, ref, buf, RQ_KEY_MAX))
        return rq_fail(q, "purge: the queue name '%s' is too long", ref);
    return 0;
}

long long rq_purge_count(struct rq *q, enum rq_purge_what what, const char *ref)
{
    char key[RQ_KEY_MAX];
    if (purge_key(q, what, ref, key))
        return -1;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, what == RQ_PURGE_RETRY ? "ZCARD" : "LLEN");
    rq_pipe_str(p, key);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "purge");
    const redisReply *r = p->reply[0];
    if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9))
        return rq_fail(q, "purge: BADKEY %s is not a %s", key, what == RQ_PURGE_RETRY ? "zset" : "list");
    if (rq_reply_error(r, "purge", q->err, sizeof q->err))
        return -1;
    return rq_reply_int(r);
}

long long rq_purge(struct rq *q, enum rq_purge_what what, const char *ref, long long max, long long *hashes)
{
    static const char *const kind[] = {"queue", "retry", "dead"};
    char key[RQ_KEY_MAX];
    if (hashes)
        *hashes = 0;
    if (purge_key(q, what, ref, key))
        return -1;
    const char *keys[] = {key};
    long long done = 0;
    while (done < max) {
        long long round = max - done < RQ_PURGE_ROUND ? max - done : RQ_PURGE_ROUND;
        rq_stamp(q);
        struct rq_pipe *p = &q->pipe;
        rq_pipe_reset(p);
        rq_script_cmd(q, p, RQ_SCRIPT_PURGE, q->proc_key, keys, 1);
        rq_pipe_str(p, kind[what]);
        rq_pipe_fmt(p, "%lld", round);
        rq_pipe_str(p, what == RQ_PURGE_QUEUE ? ref : "");
        if (rq_pipe_exec(p, &q->cmd, &q->scripts))
            return rq_fail_conn(q, "purge");
        const redisReply *r = p->reply[0];
        if (rq_reply_error(r, "purge", q->err, sizeof q->err))
            return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            return rq_fail(q, "purge: unexpected reply from the purge script");
        long long n = rq_reply_int(r->element[0]);
        done += n;
        if (hashes)
            *hashes += rq_reply_int(r->element[1]);
        if (n < round)
            break;
    }
    return done;
}
