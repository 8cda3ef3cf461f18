/* See dead.h. */
#include "queue/dead.h"

#include <stdbool.h>

#include "queue/rq.h"

int rq_dead(struct rq *q, const struct rq_job *job, const char *code, const char *error, const char *result,
            const struct rq_row *row, long long *batch_done)
{
    if (batch_done)
        *batch_done = 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.results, q->keys.dropped};
    rq_script_cmd(q, p, RQ_SCRIPT_DEAD, q->proc_key, xk, 2);
    rq_pipe_arg(p, job->raw, job->len);
    rq_pipe_str(p, error ? error : "failed");
    rq_pipe_str(p, job->queue[0] ? job->queue : q->default_queue);
    rq_pipe_str(p, job->id);
    rq_pipe_str(p, code ? code : "internal");
    rq_pipe_str(p, result ? result : "");
    bool pub = row && row->json && q->rescap_s[0];
    rq_pipe_str(p, pub ? q->rescap_s : "");
    rq_pipe_str(p, pub && row->id ? row->id : "");
    rq_pipe_str(p, pub ? row->json : "");
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "dead-letter");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "dead-letter", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "dead-letter: unexpected reply from the dead script");
    rq_held_remove(q, job->raw, job->len);
    if (batch_done && r->element[1]->type == REDIS_REPLY_INTEGER)
        *batch_done = r->element[1]->integer;
    return r->element[0]->integer > 0;
}

int rq_dead_requeue(struct rq *q, const char *const *ids, int n)
{
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_script_cmd(q, p, RQ_SCRIPT_DEAD_REQUEUE, q->proc_key, NULL, 0);
    rq_pipe_str(p, n == 0 ? "1" : "0");
    for (int i = 0; i < n; i++)
        rq_pipe_str(p, ids[i]);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "requeue-dead");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "requeue-dead", q->err, sizeof q->err))
        return -1;
    return r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
}
