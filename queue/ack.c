/* See ack.h. */
#include "queue/ack.h"

#include <stdbool.h>

#include <string.h>

#include "queue/replicas.h"
#include "queue/rq.h"

const char *rq_status_name(enum rq_status s)
{
    static const char *const names[] = {"queued", "running", "completed", "failed", "cancelled"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* An ack whose WAIT fell short completed the batch of the job raw[0..len): remembered, so that
 * the ack sent again, which finds the batch done already, still reports it. */
static void short_done_keep(struct rq *q, const char *raw, size_t len, long long done)
{
    if (done <= 0)
        return;
    if (q->nshort_done == RQ_SHORT_DONE_MAX) /* the oldest goes: more are not held at once */
        memmove(q->short_done, q->short_done + 1, (RQ_SHORT_DONE_MAX - 1) * sizeof q->short_done[0]);
    else
        q->nshort_done++;
    q->short_done[q->nshort_done - 1].hash = rq_hash(raw, len);
    q->short_done[q->nshort_done - 1].batch_done = done;
}

/* The batch_done kept for the job raw[0..len) by short_done_keep (and forgotten), or 0. */
static long long short_done_take(struct rq *q, const char *raw, size_t len)
{
    uint64_t h = q->nshort_done ? rq_hash(raw, len) : 0;
    for (int i = 0; i < q->nshort_done; i++)
        if (q->short_done[i].hash == h) {
            long long done = q->short_done[i].batch_done;
            q->short_done[i] = q->short_done[--q->nshort_done];
            return done;
        }
    return 0;
}

int rq_ack(struct rq *q, struct rq_result *res, int n)
{
    if (n <= 0)
        return 0;
    if (rq_wait_ready(q, "ack")) /* a replica short: fail at once, not after a WAIT timeout */
        return -1;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.results, q->keys.dropped};
    rq_script_cmd(q, p, RQ_SCRIPT_ACK, q->proc_key, xk, 2);
    rq_pipe_int(p, n);
    rq_pipe_str(p, q->rescap_s);
    for (int i = 0; i < n; i++) {
        struct rq_result *r = &res[i];
        const struct rq_job *j = r->job;
        r->batch_done = 0;
        rq_pipe_arg(p, j->raw, j->len);
        rq_pipe_str(p, j->id);
        rq_pipe_str(p, rq_status_name(r->status));
        rq_pipe_str(p, j->queue);
        rq_pipe_str(p, r->finish_reason ? r->finish_reason : "");
        rq_pipe_str(p, r->error ? r->error : "");
        rq_pipe_str(p, r->error_code ? r->error_code : "");
        if (r->prompt_tokens >= 0)
            rq_pipe_int(p, r->prompt_tokens);
        else
            rq_pipe_str(p, "");
        if (r->completion_tokens >= 0)
            rq_pipe_int(p, r->completion_tokens);
        else
            rq_pipe_str(p, "");
        if (r->first_token_at > 0)
            rq_pipe_fmt(p, "%.3f", r->first_token_at);
        else
            rq_pipe_str(p, "");
        rq_pipe_str(p, r->result ? r->result : "");
        bool pub = r->row && q->rescap_s[0];
        rq_pipe_str(p, pub && r->row_id ? r->row_id : "");
        rq_pipe_str(p, pub ? r->row : "");
    }
    int waits = rq_wait_cmd(q, p); /* WAIT in the same round trip */
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "ack");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "ack", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != 2 * n)
        return rq_fail(q, "ack: unexpected reply from the ack script");
    if (waits && rq_wait_check(q, p->reply[1], "ack")) { /* held still: the ack is sent again */
        for (int i = 0; i < n; i++) {
            const redisReply *b = r->element[2 * i + 1];
            if (b->type == REDIS_REPLY_INTEGER)
                short_done_keep(q, res[i].job->raw, res[i].job->len, b->integer);
        }
        return -1;
    }
    int removed = 0;
    for (int i = 0; i < n; i++) {
        const redisReply *x = r->element[2 * i], *b = r->element[2 * i + 1];
        removed += x->type == REDIS_REPLY_INTEGER && x->integer > 0;
        res[i].batch_done = b->type == REDIS_REPLY_INTEGER ? b->integer : 0;
        long long kept = short_done_take(q, res[i].job->raw, res[i].job->len);
        if (kept > res[i].batch_done)
            res[i].batch_done = kept;
        rq_held_remove(q, res[i].job->raw, res[i].job->len);
    }
    return removed;
}
