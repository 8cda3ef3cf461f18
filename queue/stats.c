/* See stats.h. */
#include "queue/stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/heartbeat.h"
#include "queue/jobid.h"
#include "queue/rq.h"

void rq_stats_free(struct rq_stats *s)
{
    if (!s)
        return;
    free(s->workers);
    free(s->jobs);
    memset(s, 0, sizeof *s);
}

static void copy_str(char *dst, size_t len, const redisReply *r)
{
    dst[0] = 0;
    if (r && r->type == REDIS_REPLY_STRING)
        snprintf(dst, len, "%.*s", (int)(r->len < len ? r->len : len - 1), r->str);
}

static double num_of(const redisReply *r)
{
    char b[64];
    copy_str(b, sizeof b, r);
    return b[0] ? strtod(b, NULL) : 0;
}

static int cmp_worker(const void *a, const void *b)
{
    return strcmp(((const struct rq_worker_stat *)a)->id, ((const struct rq_worker_stat *)b)->id);
}

int rq_stats(struct rq *q, const char *const *queues, int nq, bool want_jobs, struct rq_stats *s)
{
    memset(s, 0, sizeof *s);
    if (nq < 0 || nq > RQ_STATS_MAX_QUEUES)
        return rq_fail(q, "status: at most %d queues", RQ_STATS_MAX_QUEUES);
    for (int i = 0; i < nq; i++)
        if (!rq_valid_queue_ref(queues[i]))
            return rq_fail(q, "status: \"%.160s\" is not a queue name", queues[i]);
    redisReply *m = rq_workers(q, "status");
    if (!m)
        return -1;
    int nw = (int)m->elements, rc = 0;
    char(*keys)[2][RQ_KEY_MAX] = malloc(((size_t)nw + 1) * sizeof *keys);
    char qkeys[RQ_STATS_MAX_QUEUES][RQ_KEY_MAX];
    s->workers = calloc((size_t)nw + 1, sizeof *s->workers);
    if (!keys || !s->workers) {
        rc = rq_fail(q, "status: out of memory");
        goto out;
    }
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int i = 0; i < nq; i++) {
        rq_key_queue(&q->keys, queues[i], qkeys[i], RQ_KEY_MAX);
        rq_pipe_cmd(p, "LLEN");
        rq_pipe_str(p, qkeys[i]);
    }
    rq_pipe_cmd(p, "ZCARD");
    rq_pipe_str(p, q->keys.retry);
    rq_pipe_cmd(p, "LLEN");
    rq_pipe_str(p, q->keys.dead);
    rq_pipe_cmd(p, "SCARD");
    rq_pipe_str(p, q->keys.cancel);
    static const char *const fields[] = {"host",       "pid",       "gpu",          "model",
                                         "started_at", "jobs_done", "tokens_per_s", "last_seen",
                                         "running",    "waiting",   "kv_usage"};
    for (int i = 0; i < nw; i++) {
        const redisReply *w = m->element[i];
        char id[RQ_NAME_MAX + 1];
        copy_str(id, sizeof id, w);
        rq_key_worker(&q->keys, id, keys[i][0], RQ_KEY_MAX);
        rq_key_processing(&q->keys, id, keys[i][1], RQ_KEY_MAX);
        rq_pipe_cmd(p, "HMGET");
        rq_pipe_str(p, keys[i][0]);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            rq_pipe_str(p, fields[f]);
        rq_pipe_cmd(p, "TTL");
        rq_pipe_str(p, keys[i][0]);
        rq_pipe_cmd(p, "LLEN");
        rq_pipe_str(p, keys[i][1]);
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "status");
        goto out;
    }
    for (int i = 0; i < p->nreply; i++) {
        const redisReply *r = p->reply[i];
        if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9)) { /* name the key */
            static const char *const what[] = {"sorted set", "list", "set"};
            int w = i - nq - 3;
            const char *key = i < nq        ? qkeys[i]
                              : i == nq     ? q->keys.retry
                              : i == nq + 1 ? q->keys.dead
                              : i == nq + 2 ? q->keys.cancel
                                            : keys[w / 3][w % 3 == 2];
            const char *type = i < nq ? "list" : i <= nq + 2 ? what[i - nq] : w % 3 == 2 ? "list" : "hash";
            rc = rq_fail(q, "status: BADKEY %s is not a %s", key, type);
            goto out;
        }
        if (rq_reply_error(r, "status", q->err, sizeof q->err)) {
            rc = -1;
            goto out;
        }
    }
    int k = 0;
    s->nqueues = nq;
    for (int i = 0; i < nq; i++) {
        snprintf(s->queues[i].name, sizeof s->queues[i].name, "%s", queues[i]);
        s->queues[i].len = rq_reply_int(p->reply[k++]);
    }
    s->retry = rq_reply_int(p->reply[k++]);
    s->dead = rq_reply_int(p->reply[k++]);
    s->cancel = rq_reply_int(p->reply[k++]);
    for (int i = 0; i < nw; i++) {
        struct rq_worker_stat *w = &s->workers[i];
        copy_str(w->id, sizeof w->id, m->element[i]);
        const redisReply *h = p->reply[k++];
        int64_t ttl = rq_reply_int(p->reply[k++]);
        w->holding = rq_reply_int(p->reply[k++]);
        w->alive = ttl != -2;
        w->ttl_s = ttl >= 0 ? (int)ttl : -1;
        if (h->type == REDIS_REPLY_ARRAY && h->elements == sizeof fields / sizeof fields[0]) {
            char b[64];
            copy_str(w->host, sizeof w->host, h->element[0]);
            copy_str(b, sizeof b, h->element[1]);
            w->pid = strtol(b, NULL, 10);
            copy_str(w->gpu, sizeof w->gpu, h->element[2]);
            copy_str(w->model, sizeof w->model, h->element[3]);
            w->started_at = num_of(h->element[4]);
            copy_str(b, sizeof b, h->element[5]);
            w->jobs_done = strtoll(b, NULL, 10);
            w->tokens_per_s = num_of(h->element[6]);
            w->last_seen = num_of(h->element[7]);
            w->running = (int)num_of(h->element[8]);
            w->waiting = (int)num_of(h->element[9]);
            w->kv_usage = h->element[10]->type == REDIS_REPLY_STRING ? num_of(h->element[10]) : -1;
        } else {
            w->kv_usage = -1;
        }
        s->running += w->holding;
    }
    s->nworkers = nw;
    qsort(s->workers, (size_t)nw, sizeof *s->workers, cmp_worker);
    if (!want_jobs || s->running == 0)
        goto out;

    /* the running jobs: every processing list, then every job's hash */
    rq_pipe_reset(p);
    for (int i = 0; i < nw; i++) {
        rq_key_processing(&q->keys, s->workers[i].id, keys[i][1], RQ_KEY_MAX);
        rq_pipe_cmd(p, "LRANGE");
        rq_pipe_str(p, keys[i][1]);
        rq_pipe_str(p, "0");
        rq_pipe_str(p, "-1");
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "status");
        goto out;
    }
    struct rq_pipe lists = q->pipe; /* keep these replies while the pipe is reused */
    rq_pipe_init(&q->pipe);
    size_t total = 0;
    for (int i = 0; i < nw; i++)
        if (lists.reply[i]->type == REDIS_REPLY_ARRAY)
            total += lists.reply[i]->elements;
    s->jobs = calloc(total + 1, sizeof *s->jobs);
    char(*hk)[RQ_KEY_MAX] = malloc((total + 1) * sizeof *hk);
    if (!s->jobs || !hk) {
        free(hk);
        rq_pipe_free(&lists);
        rc = rq_fail(q, "status: out of memory");
        goto out;
    }
    int nj = 0;
    for (int i = 0; i < nw; i++) {
        const redisReply *l = lists.reply[i];
        for (size_t e = 0; l->type == REDIS_REPLY_ARRAY && e < l->elements; e++) {
            const redisReply *x = l->element[e];
            struct rq_running_job *j = &s->jobs[nj];
            if (x->type != REDIS_REPLY_STRING ||
                rq_job_id(x->str, x->len, (size_t)q->o.max_job_bytes, j->id) != RQ_ID_FOUND)
                continue;
            snprintf(j->worker, sizeof j->worker, "%s", s->workers[i].id);
            j->progress = -1;
            j->parts_done = j->parts_total = j->level = -1;
            rq_key_job(&q->keys, j->id, hk[nj], RQ_KEY_MAX);
            rq_pipe_cmd(&q->pipe, "HMGET");
            rq_pipe_str(&q->pipe, hk[nj]);
            rq_pipe_str(&q->pipe, "progress");
            rq_pipe_str(&q->pipe, "completion_tokens");
            rq_pipe_str(&q->pipe, "attempts");
            rq_pipe_str(&q->pipe, "started_at");
            rq_pipe_str(&q->pipe, "queue");
            rq_pipe_str(&q->pipe, "prompt_tokens");
            rq_pipe_str(&q->pipe, "first_token_at");
            rq_pipe_str(&q->pipe, "updated_at");
            rq_pipe_str(&q->pipe, "parts_done");
            rq_pipe_str(&q->pipe, "parts_total");
            rq_pipe_str(&q->pipe, "level");
            nj++;
        }
    }
    if (nj && rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "status");
    } else {
        for (int i = 0; i < nj; i++) {
            const redisReply *h = q->pipe.reply[i];
            struct rq_running_job *j = &s->jobs[i];
            if (h->type != REDIS_REPLY_ARRAY || h->elements != 11)
                continue;
            if (h->element[0]->type == REDIS_REPLY_STRING)
                j->progress = num_of(h->element[0]);
            j->completion_tokens = (int64_t)num_of(h->element[1]);
            j->attempts = (int)num_of(h->element[2]);
            j->started_at = num_of(h->element[3]);
            copy_str(j->queue, sizeof j->queue, h->element[4]);
            j->prompt_tokens = (int64_t)num_of(h->element[5]);
            j->first_token_at = num_of(h->element[6]);
            j->updated_at = num_of(h->element[7]);
            j->parts_total = h->element[9]->type == REDIS_REPLY_STRING ? (int)num_of(h->element[9]) : -1;
            j->parts_done = j->parts_total >= 0 ? (int)num_of(h->element[8]) : -1;
            j->level = j->parts_total >= 0 ? (int)num_of(h->element[10]) : -1;
        }
        s->njobs = nj;
    }
    free(hk);
    rq_pipe_free(&lists);
out:
    free(keys);
    freeReplyObject(m);
    return rc;
}
