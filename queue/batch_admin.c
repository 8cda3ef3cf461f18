/* See batch_admin.h. */
#include "queue/batch_admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/rq.h"

/* The fields of an HGETALL reply into *b (which has its id already). */
static void batch_from_hash(const redisReply *r, struct rq_batch_info *b)
{
    b->exists = r->type == REDIS_REPLY_ARRAY && r->elements >= 2;
    if (!b->exists)
        return;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        const char *f = k->str, *s = v->str;
        if (!strcmp(f, "state"))
            snprintf(b->state, sizeof b->state, "%s", s);
        else if (!strcmp(f, "input"))
            snprintf(b->input, sizeof b->input, "%s", s);
        else if (!strcmp(f, "created_at"))
            b->created_at = strtod(s, NULL);
        else if (!strcmp(f, "finished_at"))
            b->finished_at = strtod(s, NULL);
        else if (!strcmp(f, "enqueuing"))
            b->enqueuing = strtoll(s, NULL, 10) > 0;
        else {
            static const char *const names[] = {"total",     "queued", "running",
                                                "completed", "failed", "cancelled"};
            long long *dst[] = {&b->total, &b->queued, &b->running, &b->completed, &b->failed, &b->cancelled};
            for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
                if (!strcmp(f, names[n]))
                    *dst[n] = strtoll(s, NULL, 10);
        }
    }
}

static int batch_key(struct rq *q, const char *id, char *key, size_t len)
{
    if (!rq_valid_batch_id(id, strlen(id)) || rq_key_batch(&q->keys, id, key, len))
        return rq_fail(q, "batch: \"%.80s\" is not a batch id (1 to %d letters, digits, '.', '_' or '-')", id,
                       RQ_BATCH_ID_MAX);
    return 0;
}

int rq_batch_get(struct rq *q, const char *id, struct rq_batch_info *b)
{
    memset(b, 0, sizeof *b);
    char key[RQ_KEY_MAX];
    if (batch_key(q, id, key, sizeof key))
        return -1;
    snprintf(b->id, sizeof b->id, "%s", id);
    redisReply *r = rq_conn_command(&q->cmd, "HGETALL %s", key);
    if (!r)
        return rq_fail_conn(q, "batch");
    int rc = rq_reply_error(r, "batch", q->err, sizeof q->err) ? -1 : 0;
    if (rc == 0)
        batch_from_hash(r, b);
    freeReplyObject(r);
    return rc ? rc : b->exists;
}

int rq_batch_list(struct rq *q, int limit, struct rq_batch_info **out, int *n)
{
    *out = NULL;
    *n = 0;
    redisReply *z =
        rq_conn_command(&q->cmd, "ZREVRANGE %s 0 %d", q->keys.batches, limit > 0 ? limit - 1 : -1);
    if (!z)
        return rq_fail_conn(q, "batch list");
    if (rq_reply_error(z, "batch list", q->err, sizeof q->err) || z->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(z);
        return -1;
    }
    struct rq_batch_info *b = calloc(z->elements + 1, sizeof *b);
    char(*keys)[RQ_KEY_MAX] = calloc(z->elements + 1, sizeof *keys);
    int rc = 0, k = 0;
    if (!b || !keys) {
        rc = rq_fail(q, "batch list: out of memory");
        goto out;
    }
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (size_t i = 0; i < z->elements; i++) {
        const redisReply *e = z->element[i];
        if (e->type != REDIS_REPLY_STRING || !rq_valid_batch_id(e->str, e->len) ||
            rq_key_batch(&q->keys, e->str, keys[k], sizeof keys[k]))
            continue; /* not written by llmq */
        snprintf(b[k].id, sizeof b[k].id, "%s", e->str);
        rq_pipe_cmd(p, "HGETALL");
        rq_pipe_str(p, keys[k]);
        k++;
    }
    if (k && rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "batch list");
        goto out;
    }
    for (int i = 0; i < k; i++) {
        if (rq_reply_error(p->reply[i], "batch list", q->err, sizeof q->err)) {
            rc = -1;
            goto out;
        }
        batch_from_hash(p->reply[i], &b[i]);
    }
out:
    free(keys);
    freeReplyObject(z);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    *n = k;
    return 0;
}

int rq_batch_cancel(struct rq *q, const char *id, long long *asked, long long *queued)
{
    *asked = *queued = 0;
    char key[RQ_KEY_MAX];
    if (batch_key(q, id, key, sizeof key))
        return -1;
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.workers};
    rq_script_cmd(q, p, RQ_SCRIPT_BATCH_CANCEL, q->proc_key, xk, 1);
    rq_pipe_str(p, id);
    rq_pipe_str(p, q->keys.proc_stem);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "batch cancel");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "batch cancel", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3)
        return rq_fail(q, "batch cancel: unexpected reply from the batch_cancel script");
    *asked = rq_reply_int(r->element[1]);
    *queued = rq_reply_int(r->element[2]);
    switch (rq_reply_int(r->element[0])) {
    case 1:
        return RQ_BATCH_CANCEL_DONE;
    case 0:
        return RQ_BATCH_CANCEL_ALREADY;
    case -1:
        return RQ_BATCH_CANCEL_UNKNOWN;
    default:
        return RQ_BATCH_CANCEL_COMPLETED;
    }
}

/* The string of an element of a script's array reply ("" when it is not one). */
static const char *elem_str(const redisReply *r, size_t i)
{
    return i < r->elements && r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "";
}

int rq_batch_requeue(struct rq *q, const char *id, const struct rq_batch_requeue_job *jobs, int n,
                     const struct rq_batch_info *db, char *why, size_t len)
{
    why[0] = 0;
    char key[RQ_KEY_MAX];
    if (batch_key(q, id, key, sizeof key))
        return -1;
    double now = rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.batches, q->keys.models};
    rq_script_cmd(q, p, RQ_SCRIPT_BATCH_RERUN, q->proc_key, xk, 2);
    rq_pipe_str(p, id);
    rq_pipe_str(p, db->input);
    rq_pipe_fmt(p, "%.3f", db->created_at > 0 ? db->created_at : now);
    const long long counts[] = {db->total, db->completed, db->failed, db->cancelled};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        rq_pipe_int(p, counts[i]);
    rq_pipe_int(p, n);
    for (int i = 0; i < n; i++) {
        rq_pipe_str(p, jobs[i].raw);
        rq_pipe_str(p, jobs[i].id);
        rq_pipe_str(p, jobs[i].queue);
        rq_pipe_str(p, jobs[i].status);
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "requeue");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "requeue", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2)
        return rq_fail(q, "requeue: unexpected reply from the batch_requeue script");
    const char *tag = elem_str(r, 0);
    if (!strcmp(tag, "ok"))
        return RQ_BATCH_REQUEUE_OK;
    if (!strcmp(tag, "busy")) {
        snprintf(why, len, "job '%s' is %s", elem_str(r, 1), elem_str(r, 2));
        return RQ_BATCH_REQUEUE_BUSY;
    }
    if (!strcmp(tag, "other")) {
        snprintf(why, len, "job '%s' belongs to batch '%s' now", elem_str(r, 1), elem_str(r, 2));
        return RQ_BATCH_REQUEUE_OTHER;
    }
    snprintf(why, len, "the batch is cancelled and %lld of its jobs are not final yet",
             (long long)rq_reply_int(r->element[1]));
    return RQ_BATCH_REQUEUE_CANCELLING;
}
