/* See heartbeat.h. */
#include "queue/heartbeat.h"

#include <unistd.h>

#include "queue/rq.h"

int rq_heartbeat(struct rq *q, const struct rq_worker_info *info)
{
    static const struct rq_worker_info none = {0};
    if (!info)
        info = &none;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "MULTI");
    rq_pipe_cmd(p, "HSET");
    rq_pipe_str(p, q->hb_key);
    rq_pipe_str(p, "host");
    rq_pipe_str(p, q->host);
    rq_pipe_str(p, "pid");
    rq_pipe_int(p, (long long)getpid());
    rq_pipe_str(p, "gpu");
    rq_pipe_str(p, info->gpu ? info->gpu : "");
    rq_pipe_str(p, "model");
    rq_pipe_str(p, info->model ? info->model : "");
    rq_pipe_str(p, "models");
    rq_pipe_str(p, info->models ? info->models : "");
    rq_pipe_str(p, "started_at");
    rq_pipe_fmt(p, "%.3f", q->started_at);
    rq_pipe_str(p, "jobs_done");
    rq_pipe_int(p, (long long)info->jobs_done);
    rq_pipe_str(p, "tokens_per_s");
    rq_pipe_fmt(p, "%.1f", info->tokens_per_s);
    rq_pipe_str(p, "running");
    rq_pipe_int(p, info->running);
    rq_pipe_str(p, "waiting");
    rq_pipe_int(p, info->waiting);
    if (info->kv_blocks_total > 0) {
        rq_pipe_str(p, "kv_usage");
        rq_pipe_fmt(p, "%.4f", (double)info->kv_blocks_used / info->kv_blocks_total);
    }
    rq_pipe_str(p, "last_seen");
    rq_pipe_str(p, q->now);
    rq_pipe_cmd(p, "EXPIRE");
    rq_pipe_str(p, q->hb_key);
    rq_pipe_int(p, q->o.heartbeat_ttl_s);
    rq_pipe_cmd(p, "SADD");
    rq_pipe_str(p, q->keys.workers);
    rq_pipe_str(p, q->worker);
    char mark[RQ_KEY_MAX]; /* a reaper that found the heartbeat lapsed waits no longer (reaper.h) */
    if (rq_key_lapsed(&q->keys, q->worker, mark, sizeof mark) == 0) {
        rq_pipe_cmd(p, "DEL");
        rq_pipe_fmt(p, "%s", mark);
    }
    rq_pipe_cmd(p, "EXEC");
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "heartbeat");
    const redisReply *ex = p->reply[p->ncmd - 1];
    if (rq_reply_error(ex, "heartbeat", q->err, sizeof q->err))
        return -1;
    return ex->type == REDIS_REPLY_ARRAY ? 0 : rq_fail(q, "heartbeat: the transaction was not executed");
}

struct redisReply *rq_workers(struct rq *q, const char *what)
{
    redisReply *m = rq_conn_command(&q->cmd, "SMEMBERS %s", q->keys.workers);
    if (!m) {
        rq_fail_conn(q, what);
        return NULL;
    }
    if (rq_reply_error(m, what, q->err, sizeof q->err) || m->type != REDIS_REPLY_ARRAY) {
        if (m->type != REDIS_REPLY_ERROR)
            rq_fail(q, "%s: SMEMBERS answered with a reply of type %d", what, m->type);
        freeReplyObject(m);
        return NULL;
    }
    return m;
}

int rq_heartbeat_stop(struct rq *q)
{
    redisReply *r = rq_conn_command(&q->cmd, "LLEN %s", q->proc_key);
    if (!r)
        return rq_fail_conn(q, "heartbeat stop");
    long long held = r->type == REDIS_REPLY_INTEGER ? r->integer : 1;
    freeReplyObject(r);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "DEL");
    rq_pipe_str(p, q->hb_key);
    if (held == 0) {
        rq_pipe_cmd(p, "SREM");
        rq_pipe_str(p, q->keys.workers);
        rq_pipe_str(p, q->worker);
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "heartbeat stop");
    return 0;
}
