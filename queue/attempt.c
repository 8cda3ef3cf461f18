/* See attempt.h. */
#include "queue/attempt.h"

#include "queue/rq.h"

int rq_attempt(struct rq *q, struct rq_job *const *jobs, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += jobs[i]->id[0] && !jobs[i]->counted;
    if (k == 0)
        return 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_script_cmd(q, p, RQ_SCRIPT_ATTEMPT, q->proc_key, NULL, 0);
    for (int i = 0; i < n; i++)
        if (jobs[i]->id[0] && !jobs[i]->counted)
            rq_pipe_str(p, jobs[i]->id);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "counting attempts");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "counting attempts", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != k)
        return rq_fail(q, "counting attempts: unexpected reply from the attempt script");
    int e = 0;
    for (int i = 0; i < n; i++) {
        if (!jobs[i]->id[0] || jobs[i]->counted)
            continue;
        const redisReply *a = r->element[e++];
        if (a->type == REDIS_REPLY_INTEGER && a->integer >= 0) {
            jobs[i]->attempts = (int)a->integer;
            jobs[i]->counted = true;
        }
    }
    return 0;
}
