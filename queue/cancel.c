/* See cancel.h. */
#include "queue/cancel.h"

#include <stdio.h>
#include <string.h>

#include "queue/rq.h"

int rq_cancel(struct rq *q, const char *const *ids, int n, struct rq_cancel_result *res)
{
    if (n <= 0)
        return 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_script_cmd(q, p, RQ_SCRIPT_CANCEL, q->proc_key, NULL, 0);
    for (int i = 0; i < n; i++)
        rq_pipe_str(p, ids[i]);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "cancel");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "cancel", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != n)
        return rq_fail(q, "cancel: unexpected reply from the cancel script");
    int added = 0;
    for (int i = 0; i < n; i++) {
        const redisReply *e = r->element[i];
        struct rq_cancel_result x = {.outcome = RQ_CANCEL_UNKNOWN};
        if (e->type == REDIS_REPLY_STRING) {
            x.outcome = RQ_CANCEL_ENDED;
            snprintf(x.status, sizeof x.status, "%s", e->str);
        } else if (e->type == REDIS_REPLY_INTEGER && e->integer == 1) {
            x.outcome = RQ_CANCEL_ASKED;
        }
        added += x.outcome == RQ_CANCEL_ASKED;
        if (res)
            res[i] = x;
    }
    return added;
}

int rq_cancel_check(struct rq *q, const char *const *ids, int n, bool *out)
{
    if (n <= 0)
        return 0;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "SMISMEMBER");
    rq_pipe_str(p, q->keys.cancel);
    for (int i = 0; i < n; i++)
        rq_pipe_str(p, ids[i]);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "cancel check");
    const redisReply *r = p->reply[0];
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0)
        return rq_fail(q, "cancel check: BADKEY %s is not a set", q->keys.cancel);
    if (rq_reply_error(r, "cancel check (SMISMEMBER)", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != n)
        return rq_fail(q, "cancel check: unexpected reply to SMISMEMBER");
    for (int i = 0; i < n; i++)
        out[i] = r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer;
    return 0;
}

int rq_cancel_clear(struct rq *q, const char *const *ids, int n)
{
    if (n <= 0)
        return 0;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "SREM");
    rq_pipe_str(p, q->keys.cancel);
    for (int i = 0; i < n; i++)
        rq_pipe_str(p, ids[i]);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "cancel clear");
    return rq_reply_error(q->pipe.reply[0], "cancel clear (SREM)", q->err, sizeof q->err) ? -1 : 0;
}
