/* See requeue.h. */
#include "queue/requeue.h"

#include "queue/rq.h"

int rq_requeue(struct rq *q, const struct rq_job *const *jobs, int n, const char *to_queue,
               const char *reason)
{
    if (n <= 0)
        return 0;
    if (to_queue && !rq_valid_queue_ref(to_queue))
        return rq_fail(q, "requeue: \"%.160s\" is not a queue name", to_queue);
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    int first = rq_model_add_cmd(q, p, to_queue); /* 1 when it added an SADD before the moves */
    for (int i = n - 1; i >= 0; i--) { /* the last pushed is fetched first: jobs[0] */
        rq_script_cmd(q, p, RQ_SCRIPT_REQUEUE, q->proc_key, NULL, 0);
        rq_pipe_arg(p, jobs[i]->raw, jobs[i]->len);
        rq_pipe_str(p, to_queue ? to_queue : "");
        rq_pipe_str(p, jobs[i]->counted ? "1" : "0");
        rq_pipe_str(p, reason ? reason : "requeued");
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "requeue");
    int moved = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        const redisReply *r = p->reply[first + n - 1 - i];
        if (rq_reply_error(r, "requeue", q->err, sizeof q->err)) {
            rc = -1;
            continue;
        }
        moved += r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        rq_held_remove(q, jobs[i]->raw, jobs[i]->len);
    }
    return rc ? rc : moved;
}
