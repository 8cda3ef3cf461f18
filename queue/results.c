/* See results.h. */
#include "queue/results.h"

#include "queue/rq.h"

int rq_results_on(const struct rq *q)
{
    return q->rescap_s[0] != 0;
}

/* One publish script call of n entries onto stream (dropped-hash field `name`). */
static int publish(struct rq *q, const char *stream, const char *name, const char *f1, const char *const *v1,
                   const struct rq_row *rows, int n)
{
    if (n <= 0 || !rq_results_on(q))
        return 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {stream, q->keys.dropped};
    rq_script_cmd(q, p, RQ_SCRIPT_PUBLISH, q->proc_key, xk, 2);
    rq_pipe_str(p, q->rescap_s);
    rq_pipe_str(p, name);
    rq_pipe_int(p, n);
    for (int i = 0; i < n; i++) {
        rq_pipe_str(p, f1);
        rq_pipe_str(p, v1 ? v1[i] : rows[i].id);
        rq_pipe_str(p, "worker");
        rq_pipe_str(p, v1 ? rows[i].id : q->worker);
        rq_pipe_str(p, "row");
        rq_pipe_str(p, rows[i].json ? rows[i].json : "{}");
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "publish");
    if (rq_reply_error(p->reply[0], "publish", q->err, sizeof q->err))
        return -1;
    return 0;
}

int rq_results_publish(struct rq *q, const struct rq_row *rows, int n)
{
    return publish(q, q->keys.results, "results", "id", NULL, rows, n);
}

int rq_metrics_publish(struct rq *q, const char *const *kinds, const struct rq_row *rows, int n)
{
    return publish(q, q->keys.metrics, "metrics", "kind", kinds, rows, n);
}
