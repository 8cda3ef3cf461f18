/* See reaper.h. */
#include "queue/reaper.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "engine/util/log.h"
#include "queue/ack.h"
#include "queue/heartbeat.h"
#include "queue/jobid.h"
#include "queue/rq.h"

void rq_done_clear(struct rq_done *d)
{
    free(d->id);
    free(d->worker);
    free(d->finish_reason);
    free(d->error);
    free(d->error_code);
    free(d->result);
    free(d->row);
    memset(d, 0, sizeof *d);
}

void rq_reap_set_lookup(struct rq *q, rq_done_fn fn, void *ctx)
{
    q->done_fn = fn;
    q->done_ctx = ctx;
}

/* The committed rows found for the jobs of one processing list. */
struct found {
    struct row {
        char *key; /* the job's id, or "\0<k>\0<line>" for the k-th line without an id (reap script) */
        size_t key_len;
        struct rq_done d;
    } *rows;
    size_t n, cap;
};

static void found_free(struct found *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->rows[i].key);
        rq_done_clear(&f->rows[i].d);
    }
    free(f->rows);
    memset(f, 0, sizeof *f);
}

/* Which line with this text among the list's first e + 1 entries entry e is (from 1). */
static int nth_copy(const redisReply *r, size_t e)
{
    int nth = 1;
    const redisReply *x = r->element[e];
    for (size_t i = 0; i < e; i++) {
        const redisReply *y = r->element[i];
        nth += y->type == REDIS_REPLY_STRING && y->len == x->len && !memcmp(y->str, x->str, x->len);
    }
    return nth;
}

/* Asks the lookup about every job of `worker`'s list in reply r (an LRANGE): by id, and a line
 * without an id by its text (its failed row). 0, or -1 out of memory. */
static int find_rows(struct rq *q, const char *worker, const redisReply *r, struct found *f)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return 0;
    for (size_t e = 0; e < r->elements; e++) {
        const redisReply *x = r->element[e];
        char id[RQ_ID_MAX + 1];
        if (x->type != REDIS_REPLY_STRING)
            continue;
        bool has_id = rq_job_id(x->str, x->len, (size_t)(q->o.max_job_bytes > 0 ? q->o.max_job_bytes : 0), id) ==
                      RQ_ID_FOUND;
        int nth = has_id ? 0 : nth_copy(r, e);
        struct rq_done d = {0};
        if (q->done_fn(q->done_ctx, has_id ? id : NULL, worker, x->str, x->len, nth, &d) != 1) {
            rq_done_clear(&d);
            continue;
        }
        char head[24];
        size_t hl = has_id ? strlen(id) : (size_t)snprintf(head, sizeof head, "%c%d%c", 0, nth, 0);
        char *key = malloc(has_id ? hl + 1 : hl + x->len + 1);
        if (!key || array_reserve(&f->rows, &f->cap, f->n + 1, sizeof *f->rows, 16)) {
            free(key);
            rq_done_clear(&d);
            return -1;
        }
        if (has_id) {
            memcpy(key, id, hl + 1);
        } else {
            memcpy(key, head, hl);
            memcpy(key + hl, x->str, x->len);
            key[hl + x->len] = 0;
            hl += x->len;
        }
        f->rows[f->n].key = key;
        f->rows[f->n].key_len = hl;
        f->rows[f->n++].d = d;
    }
    return 0;
}

/* Appends the reap script for `worker`, with the committed rows f (NULL: none); `check`: only
 * once its heartbeat has stayed lapsed for the grace (one heartbeat interval). mark: room for its
 * lapse mark's key. */
static void add_reap(struct rq *q, const char *worker, char *proc, char *hb, char *mark, bool check,
                     const char *reason, const struct found *f)
{
    rq_key_processing(&q->keys, worker, proc, RQ_KEY_MAX);
    rq_key_worker(&q->keys, worker, hb, RQ_KEY_MAX);
    rq_key_lapsed(&q->keys, worker, mark, RQ_KEY_MAX);
    const char *xk[] = {q->keys.workers, hb, mark, q->keys.lines, q->keys.results, q->keys.dropped};
    struct rq_pipe *p = &q->pipe;
    rq_script_cmd(q, p, RQ_SCRIPT_REAP, proc, xk, 6);
    rq_pipe_str(p, worker);
    rq_pipe_str(p, check ? "1" : "0");
    rq_pipe_str(p, reason);
    rq_pipe_int(p, check ? 1000LL * q->o.heartbeat_interval_s : 0);
    rq_pipe_int(p, q->o.max_stalls);
    rq_pipe_int(p, f ? (long long)f->n : 0);
    rq_pipe_str(p, q->rescap_s);
    for (size_t i = 0; f && i < f->n; i++) {
        const struct rq_done *d = &f->rows[i].d;
        rq_pipe_arg(p, f->rows[i].key, f->rows[i].key_len);
        rq_pipe_str(p, d->worker ? d->worker : "");
        rq_pipe_fmt(p, "%.6f", d->started_at);
        rq_pipe_str(p, rq_status_name((enum rq_status)d->status));
        rq_pipe_str(p, d->finish_reason ? d->finish_reason : "");
        rq_pipe_str(p, d->error ? d->error : "");
        rq_pipe_str(p, d->error_code ? d->error_code : "");
        rq_pipe_int(p, d->prompt_tokens);
        rq_pipe_int(p, d->completion_tokens);
        if (d->first_token_at > 0)
            rq_pipe_fmt(p, "%.3f", d->first_token_at);
        else
            rq_pipe_str(p, "");
        rq_pipe_str(p, d->result ? d->result : "");
        bool pub = d->row && q->rescap_s[0];
        rq_pipe_str(p, pub && d->id ? d->id : "");
        rq_pipe_str(p, pub ? d->row : "");
    }
}

/* The committed rows of the jobs in the processing lists of workers[0..n), into f[0..n): one
 * round trip (LRANGE each), then the lookup. Nothing is found when no lookup is set. 0, or -1. */
static int find_all(struct rq *q, const char *const *workers, int n, struct found *f)
{
    if (!q->done_fn || n == 0)
        return 0;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int k = 0; k < n; k++) {
        char proc[RQ_KEY_MAX];
        rq_key_processing(&q->keys, workers[k], proc, sizeof proc);
        rq_pipe_cmd(p, "LRANGE");
        rq_pipe_str(p, proc);
        rq_pipe_str(p, "0");
        rq_pipe_str(p, "-1");
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "reaper (reading a lapsed worker's list)");
    for (int k = 0; k < n; k++)
        if (find_rows(q, workers[k], p->reply[k], &f[k]))
            return rq_fail(q, "reaper: out of memory");
    return 0;
}

/* Adds one reap reply to res; returns 1 if the worker was reaped, 0 if alive or in its grace, -1
 * on error. */
static int count(struct rq *q, const redisReply *r, struct rq_reap_result *res)
{
    if (rq_reply_error(r, "reaper", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || r->element[0]->type != REDIS_REPLY_INTEGER)
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
    res->acked += (int)r->element[3]->integer;
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
    const char **names = n ? malloc((size_t)n * sizeof *names) : NULL;
    struct found *found = n ? calloc((size_t)n, sizeof *found) : NULL;
    if (n && (!keys || !cand || !lapsed || !reasons || !names || !found)) {
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
    for (int k = 0; k < nl; k++)
        names[k] = m->element[lapsed[k]]->str;
    /* rows this worker's database has of their jobs: acknowledged instead of run again */
    if (find_all(q, names, nl, found)) {
        rc = -1;
        goto out;
    }
    /* one script per lapsed worker, all in one round trip */
    rq_stamp(q);
    rq_pipe_reset(p);
    for (int k = 0; k < nl; k++) {
        snprintf(reasons[k], sizeof reasons[k], "worker %s stopped while running it (heartbeat lapsed)", names[k]);
        add_reap(q, names[k], keys[lapsed[k]][0], keys[lapsed[k]][1], keys[lapsed[k]][2], true, reasons[k],
                 &found[k]);
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        rc = rq_fail_conn(q, "reaper");
        goto out;
    }
    for (int k = 0; k < nl; k++) {
        int before_r = res->requeued, before_d = res->dead, before_a = res->acked;
        int c = count(q, p->reply[k], res);
        if (c < 0) {
            rc = -1;
        } else if (c > 0) {
            res->workers++;
            log_warn("reaper: worker %s lapsed (no heartbeat): %d job%s put back, %d dead-lettered", names[k],
                     res->requeued - before_r, res->requeued - before_r == 1 ? "" : "s", res->dead - before_d);
            if (res->acked > before_a)
                log_warn("reaper: %d job%s of worker %s had a committed row in this worker's database: "
                         "acknowledged with it, not run again",
                         res->acked - before_a, res->acked - before_a == 1 ? "" : "s", names[k]);
        }
    }
out:
    for (int k = 0; found && k < n; k++)
        found_free(&found[k]);
    free(found);
    free(names);
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
    struct found f = {0};
    const char *self = q->worker;
    if (find_all(q, &self, 1, &f)) {
        found_free(&f);
        return -1;
    }
    rq_stamp(q);
    rq_pipe_reset(&q->pipe);
    char proc[RQ_KEY_MAX], hb[RQ_KEY_MAX], mark[RQ_KEY_MAX], reason[RQ_NAME_MAX + 96];
    snprintf(reason, sizeof reason, "worker %s restarted while running it", q->worker);
    add_reap(q, q->worker, proc, hb, mark, false, reason, &f);
    int rc = rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts);
    found_free(&f);
    if (rc)
        return rq_fail_conn(q, "recover");
    if (count(q, q->pipe.reply[0], res) < 0)
        return -1;
    if (res->requeued || res->dead || res->acked)
        log_warn("recover: worker %s took back what it held before a restart: %d job%s put back, %d "
                 "dead-lettered, %d acknowledged with the row it had committed",
                 q->worker, res->requeued, res->requeued == 1 ? "" : "s", res->dead, res->acked);
    return 0;
}
