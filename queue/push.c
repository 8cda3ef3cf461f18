/* See push.h. */
#include "queue/push.h"

#include <stdlib.h>

#include "queue/rq.h"

int rq_push(struct rq *q, const char *queue, const struct rq_push_item *items, int n)
{
    if (n <= 0)
        return 0;
    if (!rq_valid_queue_name(queue))
        return rq_fail(q, "push: \"%.40s\" is not a queue name", queue);
    char qk[RQ_KEY_MAX];
    rq_key_queue(&q->keys, queue, qk, sizeof qk);
    char(*hk)[RQ_KEY_MAX] = malloc((size_t)n * sizeof *hk);
    if (!hk)
        return rq_fail(q, "push: out of memory");
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int i = 0; i < n; i++) {
        const char *id = items[i].id;
        if (!id || !id[0] || rq_key_job(&q->keys, id, hk[i], RQ_KEY_MAX))
            continue;
        rq_pipe_cmd(p, "DEL");
        rq_pipe_str(p, hk[i]);
        rq_pipe_cmd(p, "HSET");
        rq_pipe_str(p, hk[i]);
        rq_pipe_str(p, "status");
        rq_pipe_str(p, "queued");
        rq_pipe_str(p, "queue");
        rq_pipe_str(p, queue);
        rq_pipe_str(p, "created_at");
        rq_pipe_str(p, q->now);
        rq_pipe_str(p, "attempts");
        rq_pipe_str(p, "0");
        rq_event_cmd(q, p, id, "queued", "");
        rq_pipe_str(p, "queue");
        rq_pipe_str(p, queue);
    }
    for (int i = 0; i < n; i++) {
        if (i % 1000 == 0) {
            rq_pipe_cmd(p, "LPUSH");
            rq_pipe_str(p, qk);
        }
        rq_pipe_arg(p, items[i].raw, items[i].len);
    }
    int rc = rq_pipe_exec(p, &q->cmd, &q->scripts);
    free(hk);
    if (rc)
        return rq_fail_conn(q, "push");
    for (int i = 0; i < p->nreply; i++)
        if (rq_reply_error(p->reply[i], "push", q->err, sizeof q->err))
            return -1;
    return 0;
}
