/* See route.h. */
#include "queue/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/rq.h"

int rq_model_add_cmd(struct rq *q, struct rq_pipe *p, const char *queue_ref)
{
    char model[RQ_MODEL_MAX + 1];
    if (!queue_ref || rq_queue_ref_model(queue_ref, model, sizeof model) || !model[0])
        return 0;
    rq_pipe_cmd(p, "SADD");
    rq_pipe_str(p, q->keys.models);
    rq_pipe_fmt(p, "%s", model); /* copied: model is a local */
    return 1;
}

bool rq_models_has(const char *models, const char *model)
{
    size_t n = strlen(model);
    for (const char *s = models; s && *s;) {
        size_t k = strcspn(s, ",");
        if (k == n && !memcmp(s, model, n))
            return true;
        s += k + (s[k] == ',');
    }
    return false;
}

static int cmp_model(const void *a, const void *b)
{
    return strcmp(((const struct rq_model_queue *)a)->model, ((const struct rq_model_queue *)b)->model);
}

/* One SMEMBERS as an array reply; NULL after rq_fail. */
static redisReply *members(struct rq *q, const char *key)
{
    redisReply *r = rq_conn_command(&q->cmd, "SMEMBERS %s", key);
    if (!r) {
        rq_fail_conn(q, "model queues");
        return NULL;
    }
    if (rq_reply_error(r, "model queues (SMEMBERS)", q->err, sizeof q->err) || r->type != REDIS_REPLY_ARRAY) {
        if (r->type != REDIS_REPLY_ERROR)
            rq_fail(q, "model queues: unexpected reply to SMEMBERS");
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

int rq_model_queues(struct rq *q, struct rq_model_queue **out, int *n)
{
    *out = NULL;
    *n = 0;
    redisReply *m = members(q, q->keys.models);
    if (!m)
        return -1;
    redisReply *w = members(q, q->keys.workers);
    if (!w) {
        freeReplyObject(m);
        return -1;
    }
    struct rq_model_queue *mq = calloc(m->elements + 1, sizeof *mq);
    int nm = 0, rc = 0;
    if (!mq) {
        rc = rq_fail(q, "model queues: out of memory");
        goto out;
    }
    for (size_t i = 0; i < m->elements; i++) {
        const redisReply *e = m->element[i];
        if (e->type != REDIS_REPLY_STRING || e->len > RQ_MODEL_MAX)
            continue;
        memcpy(mq[nm].model, e->str, e->len);
        mq[nm].model[e->len] = 0;
        if (rq_valid_model_name(mq[nm].model))
            nm++;
    }
    qsort(mq, (size_t)nm, sizeof *mq, cmp_model);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    char key[RQ_KEY_MAX], ref[RQ_QREF_MAX + 1];
    for (int i = 0; i < nm; i++)
        for (int lane = 0; lane < 2; lane++) {
            rq_queue_ref(mq[i].model, lane ? "long" : "short", ref, sizeof ref);
            rq_key_queue(&q->keys, ref, key, sizeof key);
            rq_pipe_cmd(p, "LLEN");
            rq_pipe_fmt(p, "%s", key);
        }
    for (size_t i = 0; i < w->elements; i++) {
        const redisReply *e = w->element[i];
        char id[RQ_NAME_MAX + 1];
        snprintf(id, sizeof id, "%.*s", e->type == REDIS_REPLY_STRING ? (int)e->len : 0,
                 e->type == REDIS_REPLY_STRING ? e->str : "");
        rq_key_worker(&q->keys, id, key, sizeof key);
        rq_pipe_cmd(p, "HGET");
        rq_pipe_fmt(p, "%s", key);
        rq_pipe_str(p, "models");
    }
    if (p->ncmd && rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "model queues");
        goto out;
    }
    int k = 0;
    for (int i = 0; i < nm; i++) {
        const redisReply *a = p->reply[k++], *b = p->reply[k++];
        mq[i].len_short = a && a->type == REDIS_REPLY_INTEGER ? a->integer : 0;
        mq[i].len_long = b && b->type == REDIS_REPLY_INTEGER ? b->integer : 0;
    }
    for (size_t i = 0; i < w->elements; i++) {
        const redisReply *r = p->reply[k++]; /* nil once the heartbeat has expired: not live */
        if (!r || r->type != REDIS_REPLY_STRING)
            continue;
        char *models = strndup(r->str, r->len);
        for (int j = 0; models && j < nm; j++)
            mq[j].live_workers += rq_models_has(models, mq[j].model);
        free(models);
    }
    *out = mq;
    *n = nm;
    mq = NULL;
out:
    free(mq);
    freeReplyObject(m);
    freeReplyObject(w);
    return rc;
}
