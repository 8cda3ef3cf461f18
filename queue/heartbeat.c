/* See heartbeat.h. */
#include "queue/heartbeat.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/util/log.h"
#include "queue/badkey.h"
#include "queue/rq.h"

/* Whether the instance holding our id is provably a dead earlier run on this machine: the hash
 * names this host and a pid that no longer exists. (Our own pid proves nothing: another handle of
 * this process, or a container elsewhere with the same hostname, may hold it.) */
static bool holder_gone(const struct rq *q)
{
    const struct rq_hb_holder *h = &q->holder;
    if (strcmp(h->host, q->host) != 0 || h->pid <= 0 || h->pid == (long long)getpid())
        return false;
    return kill((pid_t)h->pid, 0) == -1 && errno == ESRCH;
}

static int heartbeat_once(struct rq *q, const struct rq_worker_info *info, const char *replace)
{
    char mark[RQ_KEY_MAX]; /* a reaper that found the heartbeat lapsed waits no longer (reaper.h) */
    bool marked = rq_key_lapsed(&q->keys, q->worker, mark, sizeof mark) == 0;
    const char *xkeys[] = {q->hb_key, q->keys.workers, mark};
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_script_cmd(q, p, RQ_SCRIPT_HEARTBEAT, q->proc_key, xkeys, marked ? 3 : 2);
    rq_pipe_str(p, q->instance);
    rq_pipe_str(p, replace);
    rq_pipe_int(p, q->o.heartbeat_ttl_s);
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
    /* the events stream, which the scripts skip while it is of the wrong type: named here */
    rq_pipe_cmd(p, "TYPE");
    rq_pipe_str(p, q->keys.events);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "heartbeat");
    const redisReply *t = p->reply[1];
    if (t && t->type == REDIS_REPLY_STATUS && strcmp(t->str, "stream") && strcmp(t->str, "none"))
        rq_badkey_note(q, q->keys.events, t->str, "stream", "no events are added while it is not a stream");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "heartbeat", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_STRING)
        return rq_fail(q, "heartbeat: unexpected reply of type %d", r->type);
    struct rq_hb_holder *h = &q->holder;
    memset(h, 0, sizeof *h);
    if (r->elements >= 5) {
        snprintf(h->instance, sizeof h->instance, "%s", r->element[1]->str ? r->element[1]->str : "");
        snprintf(h->host, sizeof h->host, "%s", r->element[2]->str ? r->element[2]->str : "");
        h->pid = r->element[3]->str ? atoll(r->element[3]->str) : 0;
        h->ttl_ms = r->element[4]->type == REDIS_REPLY_INTEGER ? r->element[4]->integer : -1;
    }
    return strcmp(r->element[0]->str, "ok") ? RQ_HB_TAKEN : 0;
}

int rq_heartbeat(struct rq *q, const struct rq_worker_info *info)
{
    static const struct rq_worker_info none = {0};
    if (!info)
        info = &none;
    rq_stamp(q);
    q->id_taken = false;
    bool claiming = !q->claimed;
    int rc = heartbeat_once(q, info, claiming && q->o.force_id ? "*" : "");
    if (rc == RQ_HB_TAKEN && claiming && holder_gone(q)) {
        char seen[sizeof q->holder.instance];
        snprintf(seen, sizeof seen, "%s", q->holder.instance);
        if (!q->o.quiet)
            log_info("worker %s: the earlier run under this id (pid %lld on this host) is gone; taking its "
                     "heartbeat over",
                     q->worker, q->holder.pid);
        rc = heartbeat_once(q, info, seen); /* only if that run still holds it */
    }
    if (rc == 0) {
        q->claimed = true;
        return 0;
    }
    if (rc != RQ_HB_TAKEN)
        return rc;
    q->id_taken = true;
    const struct rq_hb_holder *h = &q->holder;
    char lapse[64] = "never lapses (it has no TTL)";
    if (h->ttl_ms >= 0)
        snprintf(lapse, sizeof lapse, "lapses in %.1f s", h->ttl_ms / 1e3);
    if (claiming)
        rq_fail(
            q,
            "worker id %s is in use: %s is held by another live worker (host %s, pid %lld) and %s if that "
            "worker has died. A second worker under the same id would take its jobs and run them twice; "
            "use another --id, wait until the heartbeat has lapsed, or pass --force-id if that worker is "
            "known to be gone",
            q->worker, q->hb_key, h->host[0] ? h->host : "?", h->pid, lapse);
    else
        rq_fail(q,
                "worker id %s was taken over: %s now belongs to another instance (host %s, pid %lld; started "
                "with --force-id, or while this worker could not heartbeat), which takes back %s",
                q->worker, q->hb_key, h->host[0] ? h->host : "?", h->pid, q->proc_key);
    q->claimed = false;
    return RQ_HB_TAKEN;
}

int rq_heartbeat_check(struct rq *q)
{
    redisReply *r = rq_conn_command(&q->cmd, "HGET %s instance", q->hb_key);
    if (!r)
        return rq_fail_conn(q, "heartbeat check");
    bool other = r->type == REDIS_REPLY_STRING &&
                 (r->len != strlen(q->instance) || memcmp(r->str, q->instance, r->len) != 0);
    bool err = rq_reply_error(r, "heartbeat check", q->err, sizeof q->err);
    freeReplyObject(r);
    if (err)
        return -1;
    if (!other)
        return 0;
    q->claimed = true; /* a plain heartbeat: it writes nothing and tells who holds the id */
    return rq_heartbeat(q, NULL);
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
