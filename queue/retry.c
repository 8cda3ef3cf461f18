/* See retry.h. */
#include "queue/retry.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "queue/rq.h"

int64_t rq_backoff_ms(int base_ms, int max_ms, int attempt, double u)
{
    if (attempt < 1)
        attempt = 1;
    if (base_ms < 0)
        base_ms = 0;
    double d = base_ms;
    for (int i = 1; i < attempt && d < max_ms; i++)
        d *= 2;
    if (d > max_ms)
        d = max_ms;
    if (u < 0)
        u = 0;
    if (u >= 1)
        u = 0.999999;
    d *= 0.75 + u / 2;
    if (d > max_ms)
        d = max_ms;
    return (int64_t)d;
}

static double uniform(void)
{
    static __thread unsigned seed;
    if (!seed) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (unsigned)ts.tv_nsec ^ (unsigned)(uintptr_t)&ts;
    }
    return rand_r(&seed) / ((double)RAND_MAX + 1);
}

int rq_retry(struct rq *q, const struct rq_job *job, const char *code, const char *error, const char *result,
             int64_t *delay_ms, long long *batch_done)
{
    if (batch_done)
        *batch_done = 0;
    int64_t delay = rq_backoff_ms(q->o.retry_backoff_base_ms, q->o.retry_backoff_max_ms,
                                  job->attempts > 0 ? job->attempts : 1, uniform());
    if (delay_ms)
        *delay_ms = delay;
    double now = rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.retry};
    rq_script_cmd(q, p, RQ_SCRIPT_RETRY, q->proc_key, xk, 1);
    rq_pipe_arg(p, job->raw, job->len);
    rq_pipe_int(p, (long long)(now * 1000) + delay);
    rq_pipe_str(p, error ? error : "failed");
    rq_pipe_str(p, code ? code : "internal");
    rq_pipe_str(p, result ? result : "");
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "retry");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "retry", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "retry: unexpected reply from the retry script");
    rq_held_remove(q, job->raw, job->len);
    if (batch_done && r->element[2]->type == REDIS_REPLY_INTEGER)
        *batch_done = r->element[2]->integer;
    switch (r->element[0]->integer) {
    case 1:
        return RQ_RETRY_SCHEDULED;
    case 2:
        return RQ_RETRY_DEAD;
    default:
        return RQ_RETRY_NOT_HELD;
    }
}

int rq_retry_due(struct rq *q, int max)
{
    if (max <= 0)
        return 0;
    double now = rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.retry};
    rq_script_cmd(q, p, RQ_SCRIPT_RETRY_DUE, q->proc_key, xk, 1);
    rq_pipe_int(p, (long long)(now * 1000));
    rq_pipe_int(p, max);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "retry (moving due jobs)");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "retry (moving due jobs)", q->err, sizeof q->err))
        return -1;
    return r->type == REDIS_REPLY_INTEGER ? (int)r->integer : 0;
}
