/* See ack.h. */
#include "queue/ack.h"

#include <stdlib.h>

#include "queue/rq.h"

const char *rq_status_name(enum rq_status s)
{
    static const char *const names[] = {"queued", "running", "completed", "failed", "cancelled"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

int rq_ack(struct rq *q, const struct rq_result *res, int n)
{
    if (n <= 0)
        return 0;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "MULTI");
    char(*hk)[RQ_KEY_MAX] = malloc((size_t)n * sizeof *hk);
    int *lrem_at = malloc((size_t)n * sizeof *lrem_at);
    if (!hk || !lrem_at) {
        free(hk);
        free(lrem_at);
        return rq_fail(q, "ack: out of memory");
    }
    int queued = 0; /* commands inside MULTI: their replies are in EXEC's array in this order */
    for (int i = 0; i < n; i++) {
        const struct rq_result *r = &res[i];
        const struct rq_job *j = r->job;
        const char *st = rq_status_name(r->status);
        rq_pipe_cmd(p, "LREM"); /* from the tail: the oldest jobs, which usually finish first */
        rq_pipe_str(p, q->proc_key);
        rq_pipe_str(p, "-1");
        rq_pipe_arg(p, j->raw, j->len);
        lrem_at[i] = queued++;
        if (!j->id[0])
            continue;
        rq_key_job(&q->keys, j->id, hk[i], RQ_KEY_MAX);
        rq_pipe_cmd(p, "HSET");
        rq_pipe_str(p, hk[i]);
        rq_pipe_str(p, "status");
        rq_pipe_str(p, st);
        rq_pipe_str(p, "finished_at");
        rq_pipe_str(p, q->now);
        rq_pipe_str(p, "worker");
        rq_pipe_str(p, q->worker);
        if (r->status == RQ_STATUS_COMPLETED) {
            rq_pipe_str(p, "progress");
            rq_pipe_str(p, "1");
        }
        rq_job_counts(p, r->prompt_tokens, r->completion_tokens, r->first_token_at);
        if (r->finish_reason) {
            rq_pipe_str(p, "finish_reason");
            rq_pipe_str(p, r->finish_reason);
        }
        if (r->error) {
            rq_pipe_str(p, "error");
            rq_pipe_str(p, r->error);
        }
        queued++;
        if (!r->error) {
            rq_pipe_cmd(p, "HDEL");
            rq_pipe_str(p, hk[i]);
            rq_pipe_str(p, "error");
            queued++;
        }
        if (q->o.result_ttl_s > 0) {
            rq_pipe_cmd(p, "EXPIRE");
            rq_pipe_str(p, hk[i]);
            rq_pipe_str(p, q->ttl_s);
            queued++;
        }
        rq_pipe_cmd(p, "SREM");
        rq_pipe_str(p, q->keys.cancel);
        rq_pipe_str(p, j->id);
        queued++;
        rq_event_cmd(q, p, j->id, st, q->worker);
        rq_pipe_str(p, "queue");
        rq_pipe_str(p, j->queue);
        if (r->completion_tokens >= 0) {
            rq_pipe_str(p, "completion_tokens");
            rq_pipe_int(p, r->completion_tokens);
        }
        if (r->error) {
            rq_pipe_str(p, "error");
            rq_pipe_str(p, r->error);
        }
        queued++;
    }
    rq_pipe_cmd(p, "EXEC");
    int rc = rq_pipe_exec(p, &q->cmd, &q->scripts);
    int removed = -1;
    if (rc) {
        rq_fail_conn(q, "ack");
    } else {
        const redisReply *ex = p->reply[p->ncmd - 1];
        if (!rq_reply_error(ex, "ack (EXEC)", q->err, sizeof q->err)) {
            if (ex->type != REDIS_REPLY_ARRAY || (int)ex->elements != queued) {
                rq_fail(q, "ack: the transaction was not executed");
            } else {
                removed = 0;
                for (int i = 0; i < n; i++) {
                    const redisReply *x = ex->element[lrem_at[i]];
                    removed += x->type == REDIS_REPLY_INTEGER && x->integer > 0;
                    rq_held_remove(q, res[i].job->raw, res[i].job->len);
                }
            }
        }
    }
    free(hk);
    free(lrem_at);
    return removed;
}
