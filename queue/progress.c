/* See progress.h. */
#include "queue/progress.h"

#include <stdlib.h>
#include <string.h>

#include "queue/rq.h"

/* A summary job's parts_done, parts_total and level as fields of the command being built. */
static void parts(struct rq_pipe *p, const struct rq_progress *x)
{
    if (x->parts_total <= 0)
        return;
    rq_pipe_str(p, "parts_done");
    rq_pipe_int(p, x->parts_done);
    rq_pipe_str(p, "parts_total");
    rq_pipe_int(p, x->parts_total);
    rq_pipe_str(p, "level");
    rq_pipe_int(p, x->level);
}

int rq_progress(struct rq *q, const struct rq_progress *pr, int n)
{
    if (n <= 0)
        return 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    char(*hk)[RQ_KEY_MAX] = malloc((size_t)n * sizeof *hk);
    if (!hk)
        return rq_fail(q, "progress: out of memory");
    for (int i = 0; i < n; i++) {
        const struct rq_progress *x = &pr[i];
        if (!x->id || !x->id[0])
            continue;
        if (rq_key_job(&q->keys, x->id, hk[i], RQ_KEY_MAX))
            continue;
        rq_pipe_cmd(p, "HSET");
        rq_pipe_str(p, hk[i]);
        rq_pipe_str(p, "updated_at");
        rq_pipe_str(p, q->now);
        if (x->progress >= 0) {
            rq_pipe_str(p, "progress");
            rq_pipe_fmt(p, "%.4f", x->progress > 1 ? 1.0 : x->progress);
        }
        rq_job_counts(p, x->prompt_tokens, x->completion_tokens, x->first_token_at);
        parts(p, x);
        rq_event_cmd(q, p, x->id, "running", q->worker);
        if (x->progress >= 0) {
            rq_pipe_str(p, "progress");
            rq_pipe_fmt(p, "%.4f", x->progress > 1 ? 1.0 : x->progress);
        }
        if (x->completion_tokens >= 0) {
            rq_pipe_str(p, "completion_tokens");
            rq_pipe_int(p, x->completion_tokens);
        }
        parts(p, x);
    }
    int rc = rq_pipe_exec(p, &q->cmd, &q->scripts);
    free(hk);
    char hk0[RQ_KEY_MAX];
    if (rc)
        return rq_fail_conn(q, "progress");
    for (int i = 0; i < p->nreply; i++) {
        const redisReply *r = p->reply[i];
        if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9)) {
            /* two commands per job: HSET of its hash, XADD to the events */
            int k = -1;
            for (int j = 0, c = 0; j < n && k < 0; j++)
                if (pr[j].id && pr[j].id[0] && rq_key_job(&q->keys, pr[j].id, hk0, RQ_KEY_MAX) == 0 &&
                    c++ == i / 2)
                    k = j;
            return rq_fail(q, "progress: BADKEY %s is not a %s",
                           i % 2    ? q->keys.events
                           : k >= 0 ? hk0
                                    : "?",
                           i % 2 ? "stream" : "hash");
        }
        if (rq_reply_error(r, "progress", q->err, sizeof q->err))
            return -1;
    }
    return 0;
}
