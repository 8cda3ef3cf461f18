/* See reaper.h. */
#include "queue/reaper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/log.h"
#include "queue/heartbeat.h"
#include "queue/rq.h"

/* Appends the reap script for `worker`; `check`: only once its heartbeat has stayed lapsed for
 * the grace (one heartbeat interval). mark: room for its lapse mark's key. */
static void add_reap(struct rq *q, const char *worker, char *proc, char *hb, char *mark, bool check,
                     const char *reason)
{
    rq_key_processing(&q->keys, worker, proc, RQ_KEY_MAX);
    rq_key_worker(&q->keys, worker, hb, RQ_KEY_MAX);
    rq_key_lapsed(&q->keys, worker, mark, RQ_KEY_MAX);
    const char *xk[] = {q->keys.workers, hb, mark};
    rq_script_cmd(q, &q->pipe, RQ_SCRIPT_REAP, proc, xk, 3);
    rq_pipe_str(&q->pipe, worker);
    rq_pipe_str(&q->pipe, check ? "1" : "0");
    rq_pipe_str(&q->pipe, reason);
    rq_pipe_int(&q->pipe, check ? 1000LL * q->o.heartbeat_interval_s : 0);
}

/* Adds one reap reply to res; returns 1 if the worker was reaped, 0 if alive or in its grace, -1
 * on error. */
static int count(struct rq *q, const redisReply *r, struct rq_reap_result *res)
{
    if (rq_reply_error(r, "reaper", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "reaper: unexpected reply from the reap script");
    if (r->element[0]->integer == -2 && r->element[1]->type == REDIS_REPLY_INTEGER) {
        int64_t left = r->element[1]->integer > 0 ? r->element[1]->integer : 1;
        if (res->grace_ms == 0 || left < res->grace_ms)
            res->grace_ms = left;
        res->graced++;
        return 0;
    }
    if (r->element[0]->integer < 0)
        return 0;
    res->requeued += (int)r->element[1]->integer;
    res->dead += (int)r->element[2]->integer;
    return 1;
}

int rq_reap(struct rq *q, struct rq_reap_result *res)
{
    memset(res, 0, sizeof *res);
    redisReply *m = rq_workers(q, "reaper");
    if (!m)
        return -1;
    int n = (int)m->elements, rc = 0;
    char(*keys)[3][RQ_KEY_MAX] = n ? malloc((size_t)n * sizeof *keys) : NULL;
    int *cand = n ? malloc((size_t)n * sizeof *cand) : NULL;
    int *lapsed = n ? malloc((size_t)n * sizeof *lapsed) : NULL;
    char(*reasons)[RQ_NAME_MAX + 96] = n ? malloc((size_t)n * sizeof *reasons) : NULL;
    if (n && (!keys || !cand || !lapsed || !reasons)) {
        rc = rq_fail(q, "reaper: out of memory");
        goto out;
    }
    /* whose heartbeat is gone? one round trip */
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    int nc = 0;
    for (int i = 0; i < n; i++) {
        const redisReply *w = m->element[i];
        if (w->type != REDIS_REPLY_STRING || !strcmp(w->str, q->worker) || w->len > RQ_NAME_MAX ||
            strlen(w->str) != w->len)
            continue;
        rq_key_worker(&q->keys, w->str, keys[i][1], RQ_KEY_MAX);
        rq_pipe_cmd(p, "EXISTS");
        rq_pipe_str(p, keys[i][1]);
        cand[nc++] = i;
    }
    if (nc == 0)
        goto out;
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "reaper");
        goto out;
    }
    int nl = 0;
    for (int k = 0; k < nc; k++)
        if (p->reply[k]->type == REDIS_REPLY_INTEGER && p->reply[k]->integer == 0)
            lapsed[nl++] = cand[k];
    if (nl == 0)
        goto out;
    /* one script per lapsed worker, all in one round trip */
    rq_stamp(q);
    rq_pipe_reset(p);
    for (int k = 0; k < nl; k++) {
        const char *w = m->element[lapsed[k]]->str;
        snprintf(reasons[k], sizeof reasons[k], "worker %s stopped while running it (heartbeat lapsed)", w);
        add_reap(q, w, keys[lapsed[k]][0], keys[lapsed[k]][1], keys[lapsed[k]][2], true, reasons[k]);
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "reaper");
        goto out;
    }
    for (int k = 0; k < nl; k++) {
        int before_r = res->requeued, before_d = res->dead;
        int c = count(q, p->reply[k], res);
        if (c < 0) {
            rc = -1;
        } else if (c > 0) {
            res->workers++;
            log_warn("reaper: worker %s lapsed (no heartbeat): %d job%s put back, %d dead-lettered",
                     m->element[lapsed[k]]->str, res->requeued - before_r,
                     res->requeued - before_r == 1 ? "" : "s", res->dead - before_d);
        }
    }
out:
    free(keys);
    free(cand);
    free(lapsed);
    free(reasons);
    freeReplyObject(m);
    return rc;
}

int rq_recover(struct rq *q, struct rq_reap_result *res)
{
    memset(res, 0, sizeof *res);
    if (q->nheld)
        return rq_fail(q, "recover: this worker holds %d jobs; only call it before the first fetch",
                       q->nheld);
    rq_stamp(q);
    rq_pipe_reset(&q->pipe);
    char proc[RQ_KEY_MAX], hb[RQ_KEY_MAX], mark[RQ_KEY_MAX], reason[RQ_NAME_MAX + 96];
    snprintf(reason, sizeof reason, "worker %s restarted while running it", q->worker);
    add_reap(q, q->worker, proc, hb, mark, false, reason);
    if (rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "recover");
    if (count(q, q->pipe.reply[0], res) < 0)
        return -1;
    if (res->requeued || res->dead)
        log_warn(
            "recover: worker %s took back what it held before a restart: %d job%s put back, %d dead-lettered",
            q->worker, res->requeued, res->requeued == 1 ? "" : "s", res->dead);
    return 0;
}
