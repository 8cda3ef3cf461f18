/* See drain.h. */
#include "queue/drain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/log.h"
#include "queue/badkey.h"
#include "queue/heartbeat.h"
#include "queue/rq.h"

void rq_drain_free(struct rq_drain *d)
{
    if (!d)
        return;
    free(d->holders);
    memset(d, 0, sizeof *d);
}

bool rq_drain_done(const struct rq_drain *d)
{
    return d->queued == 0 && d->retry == 0 && d->held == 0;
}

static int cmp_holder(const void *a, const void *b)
{
    return strcmp(((const struct rq_drain_holder *)a)->id, ((const struct rq_drain_holder *)b)->id);
}

int rq_drain_check(struct rq *q, const char *const *queues, int nq, struct rq_drain *d)
{
    memset(d, 0, sizeof *d);
    if (nq < 0 || nq > RQ_DRAIN_MAX_QUEUES)
        return rq_fail(q, "drain check: at most %d queues", RQ_DRAIN_MAX_QUEUES);
    for (int i = 0; i < nq; i++)
        if (!rq_valid_queue_ref(queues[i]))
            return rq_fail(q, "drain check: \"%.160s\" is not a queue name", queues[i]);
    redisReply *m = rq_workers(q, "drain check");
    if (!m)
        return -1;
    int nw = (int)m->elements, rc = 0;
    int *who = malloc(((size_t)nw + 1) * sizeof *who); /* the set's entries asked about */
    d->holders = calloc((size_t)nw + 1, sizeof *d->holders);
    if (!who || !d->holders) {
        rc = rq_fail(q, "drain check: out of memory");
        goto out;
    }
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    char key[RQ_KEY_MAX];
    for (int i = 0; i < nq; i++) {
        rq_key_queue(&q->keys, queues[i], key, sizeof key);
        rq_pipe_cmd(p, "LLEN");
        rq_pipe_fmt(p, "%s", key); /* a copy: key is reused */
    }
    rq_pipe_cmd(p, "ZCARD");
    rq_pipe_str(p, q->keys.retry);
    int nask = 0;
    for (int i = 0; i < nw; i++) {
        const redisReply *w = m->element[i];
        if (w->type != REDIS_REPLY_STRING || w->len > RQ_NAME_MAX || strlen(w->str) != w->len ||
            !strcmp(w->str, q->worker))
            continue;
        rq_key_processing(&q->keys, w->str, key, sizeof key);
        rq_pipe_cmd(p, "LLEN");
        rq_pipe_fmt(p, "%s", key);
        rq_key_worker(&q->keys, w->str, key, sizeof key);
        rq_pipe_cmd(p, "PTTL");
        rq_pipe_fmt(p, "%s", key);
        who[nask++] = i;
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "drain check");
        goto out;
    }
    for (int i = 0; i < p->nreply; i++) {
        const redisReply *r = p->reply[i];
        if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9)) {
            /* a queue, the retry set or a processing list of the wrong type holds no job: empty */
            if (i < nq)
                rq_key_queue(&q->keys, queues[i], key, sizeof key);
            else if (i == nq)
                snprintf(key, sizeof key, "%s", q->keys.retry);
            else
                rq_key_processing(&q->keys, m->element[who[(i - nq - 1) / 2]]->str, key, sizeof key);
            char text[RQ_KEY_MAX + 32];
            snprintf(text, sizeof text, "BADKEY %s (drain)", key);
            if (rq_badkey_first(q, text))
                log_warn("redis: %s is not a %s: --drain counts it as empty (delete or rename the key)", key,
                         i == nq ? "sorted set" : "list");
            continue;
        }
        if (rq_reply_error(r, "drain check", q->err, sizeof q->err)) {
            rc = -1;
            goto out;
        }
    }
    int k = 0;
    for (int i = 0; i < nq; i++)
        d->queued += rq_reply_int(p->reply[k++]);
    d->retry = rq_reply_int(p->reply[k++]);
    for (int a = 0; a < nask; a++) {
        int64_t jobs = rq_reply_int(p->reply[k++]);
        int64_t pttl = rq_reply_int(p->reply[k++]);
        if (jobs <= 0)
            continue;
        struct rq_drain_holder *h = &d->holders[d->nholders++];
        memcpy(h->id, m->element[who[a]]->str, m->element[who[a]]->len + 1);
        h->jobs = jobs;
        h->lapse_ms = pttl;
        d->held += jobs;
    }
    qsort(d->holders, (size_t)d->nholders, sizeof *d->holders, cmp_holder);
out:
    free(who);
    freeReplyObject(m);
    return rc;
}
