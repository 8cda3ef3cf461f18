/* See fetch.h. */
#include "queue/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/util/log.h"
#include "queue/badkey.h"
#include "queue/jobid.h"
#include "queue/rq.h"

#define MAX_SOURCES RQ_FETCH_MAX_SOURCES

void rq_job_free(struct rq_job *j)
{
    if (!j)
        return;
    free(j->raw);
    memset(j, 0, sizeof *j);
}

int rq_job_copy(struct rq_job *dst, const struct rq_job *src)
{
    *dst = *src;
    dst->raw = malloc(src->len + 1);
    if (!dst->raw)
        return -1;
    memcpy(dst->raw, src->raw, src->len);
    dst->raw[src->len] = 0;
    return 0;
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until c is connected or the deadline (monotonic ms) passes, trying to reconnect as its
 * backoff allows: what a blocking call does while Redis is away. 0 once connected, else -1. */
static int wait_ready(struct rq_conn *c, int64_t deadline)
{
    for (;;) {
        if (rq_conn_ready(c) == 0)
            return 0;
        int64_t left = deadline - rq_mono_ms();
        if (left <= 0)
            return -1;
        int64_t wait = rq_conn_retry_in_ms(c);
        sleep_ms(wait > 0 && wait < left ? wait : left);
    }
}

/* Appends the fetch script for the sources with room; `minus` (or -1) is a source to take one
 * fewer from (a job already got from it by BLMOVE). Returns 0, or 1 when nothing can be asked. */
static int add_fetch(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                     enum rq_order order, int max, int minus, char keys[][RQ_KEY_MAX], int *map)
{
    const char *xk[MAX_SOURCES];
    int caps[MAX_SOURCES], groups[MAX_SOURCES], n = 0;
    bool grouped = false;
    for (int i = 0; i < nsrc; i++) {
        int g = group ? group[i] : 0;
        bool same = i == minus || (minus >= 0 && g > 0 && g == group[minus]);
        int cap = src[i].max - same;
        if (cap <= 0)
            continue;
        rq_key_queue(&q->keys, src[i].queue, keys[i], RQ_KEY_MAX);
        xk[n] = keys[i];
        caps[n] = cap;
        groups[n] = g;
        grouped |= g > 0;
        map[n] = i;
        n++;
    }
    if (n == 0 || max <= 0)
        return 1;
    rq_script_cmd(q, &q->pipe, RQ_SCRIPT_FETCH, q->proc_key, xk, n);
    rq_pipe_str(&q->pipe, order == RQ_ORDER_ROUND_ROBIN ? "r" : "p");
    rq_pipe_int(&q->pipe, max);
    for (int i = 0; i < n; i++)
        rq_pipe_int(&q->pipe, caps[i]);
    for (int i = 0; grouped && i < n; i++) /* a source of no group gets one of its own */
        rq_pipe_int(&q->pipe, groups[i] > 0 ? groups[i] : MAX_SOURCES + 1 + i);
    return 0;
}

static int set_job(struct rq_job *j, const char *raw, size_t len, const char *queue)
{
    memset(j, 0, sizeof *j);
    j->raw = malloc(len + 1);
    if (!j->raw)
        return -1;
    memcpy(j->raw, raw, len);
    j->raw[len] = 0;
    j->len = len;
    snprintf(j->queue, sizeof j->queue, "%s", queue);
    return 0;
}

static void set_str(char *dst, size_t cap, const redisReply *r)
{
    if (r && r->type == REDIS_REPLY_STRING && r->len < cap) {
        memcpy(dst, r->str, r->len);
        dst[r->len] = 0;
    }
}

static void set_id(struct rq_job *j, const redisReply *id)
{
    set_str(j->id, sizeof j->id, id);
}

/* A duplicate the fetch or start script took out again: logged and counted. */
static void duplicate(struct rq *q, const redisReply *id, const redisReply *status, const redisReply *holder)
{
    q->duplicates++;
    char i[RQ_ID_MAX + 1] = "?", s[32] = "?", h[RQ_NAME_MAX + 1] = "";
    set_str(i, sizeof i, id);
    set_str(s, sizeof s, status);
    set_str(h, sizeof h, holder);
    log_warn("job %s arrived again while %s%s%s: a duplicate, not run (taken out of %s; its hash and row are "
             "left as they are)",
             i, s, h[0] ? " by " : "", h, q->proc_key);
}

/* A note of the fetch or start script: `key` is a `type`, not a `want`. A source queue is skipped
 * by that fetch; a job's hash (or its batch's) is left alone and the job is handed out without
 * an id in Redis (queue/badkey.h). Logged once per key. */
static void bad_key(struct rq *q, const redisReply *key, const redisReply *type, const redisReply *want)
{
    char k[RQ_KEY_MAX] = "?", t[32] = "?", w[32] = "?";
    set_str(k, sizeof k, key);
    set_str(t, sizeof t, type);
    set_str(w, sizeof w, want);
    rq_badkey_note(q, k, t, w,
                   strcmp(w, "list") == 0 ? "the queue is not fetched from"
                                          : "its job runs without it (not counted, tracked or retried in "
                                            "Redis; a failure dead-letters it)");
}

/* The fetch script's reply into out[n..max). Returns the new count, or -1 (q->err). */
static int parse_fetch(struct rq *q, const redisReply *r, const struct rq_source *src, const int *map,
                       struct rq_job *out, int n, int max)
{
    if (rq_reply_error(r, "fetch", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 6)
        return rq_fail(q, "fetch: unexpected reply from the fetch script");
    for (size_t e = 0; e + 5 < r->elements; e += 6) {
        redisReply **f = r->element + e;
        if (f[0]->type != REDIS_REPLY_INTEGER || f[1]->type != REDIS_REPLY_STRING)
            return rq_fail(q, "fetch: unexpected reply from the fetch script");
        if (f[0]->integer == -2) {
            bad_key(q, f[2], f[3], f[4]);
            continue;
        }
        if (f[0]->integer < 0) {
            duplicate(q, f[2], f[3], f[4]);
            continue;
        }
        if (n >= max)
            continue;
        struct rq_job *j = &out[n];
        if (set_job(j, f[1]->str, f[1]->len, src[map[f[0]->integer]].queue))
            return rq_fail(q, "fetch: out of memory");
        set_id(j, f[2]);
        j->attempts = f[3]->type == REDIS_REPLY_INTEGER ? (int)f[3]->integer : 0;
        j->cancel_requested = f[4]->type == REDIS_REPLY_INTEGER && f[4]->integer;
        set_str(j->batch_id, sizeof j->batch_id, f[5]);
        n++;
    }
    return n;
}

/* The start script's reply ({found, id, attempts, cancel, batch}) into j. Returns found (0/1),
 * 2 for a duplicate (logged), or -1. */
static int parse_start(struct rq *q, const redisReply *r, struct rq_job *j)
{
    if (rq_reply_error(r, "fetch (start)", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "fetch: unexpected reply from the start script");
    long long found = r->element[0]->integer;
    if (found == 0)
        return 0;
    if (r->elements != (found < 0 ? 4u : 5u) && !(found == 1 && r->elements == 8))
        return rq_fail(q, "fetch: unexpected reply from the start script");
    if (r->elements == 8)
        bad_key(q, r->element[5], r->element[6], r->element[7]);
    if (found < 0) {
        duplicate(q, r->element[1], r->element[2], r->element[3]);
        return 2;
    }
    set_id(j, r->element[1]);
    j->attempts = r->element[2]->type == REDIS_REPLY_INTEGER ? (int)r->element[2]->integer : 0;
    j->cancel_requested = r->element[3]->type == REDIS_REPLY_INTEGER && r->element[3]->integer;
    set_str(j->batch_id, sizeof j->batch_id, r->element[4]);
    return 1;
}

static void add_start(struct rq *q, const struct rq_job *j, const char *raw_new, size_t new_len,
                      const char *id)
{
    rq_script_cmd(q, &q->pipe, RQ_SCRIPT_START, q->proc_key, NULL, 0);
    rq_pipe_str(&q->pipe, j->queue);
    rq_pipe_arg(&q->pipe, j->raw, j->len);
    rq_pipe_arg(&q->pipe, raw_new ? raw_new : "", raw_new ? new_len : 0);
    rq_pipe_str(&q->pipe, id ? id : "");
}

/* Gives the jobs in out[0..n) that lack an id and can take one their id. Returns the count of
 * jobs still returned, or -1. */
static int assign_ids(struct rq *q, struct rq_job *out, int n)
{
    enum { BATCH = 64 };
    int need[BATCH], nn = 0;
    char *raws[BATCH];
    size_t lens[BATCH];
    char ids[BATCH][RQ_ID_MAX + 1];
    for (int base = 0; base < n; base += nn) {
        nn = 0;
        rq_pipe_reset(&q->pipe);
        for (int i = base; i < n && nn < BATCH; i++, nn++) {
            need[nn] = -1;
            char tmp[RQ_ID_MAX + 1];
            if (out[i].id[0] ||
                rq_job_id(out[i].raw, out[i].len, (size_t)q->o.max_job_bytes, tmp) != RQ_ID_MISSING)
                continue;
            rq_new_id(ids[nn]);
            if (rq_job_add_id(out[i].raw, out[i].len, ids[nn], &raws[nn], &lens[nn]))
                continue; /* out of memory: it stays without an id */
            need[nn] = i;
            add_start(q, &out[i], raws[nn], lens[nn], ids[nn]);
        }
        if (q->pipe.ncmd == 0)
            continue;
        int rc = rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts);
        int c = 0;
        for (int k = 0; k < nn; k++) {
            if (need[k] < 0)
                continue;
            struct rq_job *j = &out[need[k]];
            int found = rc ? -1 : parse_start(q, q->pipe.reply[c], j);
            c++;
            if (found == 1) {
                free(j->raw);
                j->raw = raws[k];
                j->len = lens[k];
                j->id_assigned = true;
            } else {
                free(raws[k]);
                free(j->raw); /* not returned; reconcile puts it back. Mark it for the sweep below. */
                j->raw = NULL;
            }
        }
        if (rc) {
            rq_fail_conn(q, "fetch (giving ids)");
            q->need_reconcile = true;
        }
    }
    int kept = 0; /* drop the jobs marked above, keeping the order of the rest */
    for (int i = 0; i < n; i++) {
        if (!out[i].raw) {
            q->need_reconcile = true;
            continue;
        }
        if (kept != i)
            out[kept] = out[i];
        kept++;
    }
    for (int i = kept; i < n; i++)
        memset(&out[i], 0, sizeof out[i]);
    return kept;
}

/* BLMOVE from one source after another (block_ms split between them), then the rest without
 * blocking. Returns the count, or -1. */
static int fetch_blocking(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                          enum rq_order order, int max, int block_ms, struct rq_job *out)
{
    int active[MAX_SOURCES], na = 0;
    for (int i = 0; i < nsrc; i++)
        if (src[i].max > 0)
            active[na++] = i;
    if (na == 0)
        return 0;
    int64_t deadline = rq_mono_ms() + block_ms;
    int per = block_ms / na > 10 ? block_ms / na : 10;
    for (int k = 0; k < na; k++) {
        int i = active[(q->rr_next + k) % na];
        int64_t left = deadline - rq_mono_ms();
        if (left <= 0)
            break;
        if (wait_ready(&q->blk, deadline)) /* down: wait as a blocking call would, then fail */
            return rq_fail(q, "fetch: %s", q->blk.err);
        left = deadline - rq_mono_ms();
        if (left <= 0)
            break;
        char key[RQ_KEY_MAX], tmo[32];
        rq_key_queue(&q->keys, src[i].queue, key, sizeof key);
        snprintf(tmo, sizeof tmo, "%.3f", (per < left ? per : left) / 1000.0);
        redisReply *r = rq_conn_command(&q->blk, "BLMOVE %s %s RIGHT LEFT %s", key, q->proc_key, tmo);
        if (!r) {
            q->need_reconcile = true; /* it may have moved a job before the reply was lost */
            return rq_fail(q, "fetch: %s", q->blk.err);
        }
        if (r->type == REDIS_REPLY_NIL) {
            freeReplyObject(r);
            continue;
        }
        if (rq_reply_error(r, "fetch (BLMOVE)", q->err, sizeof q->err) || r->type != REDIS_REPLY_STRING) {
            if (r->type != REDIS_REPLY_ERROR)
                rq_fail(q, "fetch: unexpected reply to BLMOVE");
            freeReplyObject(r);
            return -1;
        }
        q->rr_next = (q->rr_next + k + 1) % na;
        int rc = set_job(&out[0], r->str, r->len, src[i].queue);
        freeReplyObject(r);
        if (rc)
            return rq_fail(q, "fetch: out of memory");
        /* mark it running and fill the batch in one round trip */
        rq_stamp(q);
        rq_pipe_reset(&q->pipe);
        add_start(q, &out[0], NULL, 0, NULL);
        char keys[MAX_SOURCES][RQ_KEY_MAX];
        int map[MAX_SOURCES];
        int more = add_fetch(q, src, group, nsrc, order, max - 1, i, keys, map) == 0;
        if (rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts)) {
            rq_job_free(&out[0]);
            q->need_reconcile = true;
            return rq_fail_conn(q, "fetch");
        }
        int found = parse_start(q, q->pipe.reply[0], &out[0]);
        if (found == 2) /* a duplicate, already taken out again: the slot is free */
            rq_job_free(&out[0]);
        else if (found != 1) {
            rq_job_free(&out[0]);
            q->need_reconcile = true;
            if (found == 0)
                return rq_fail(q, "fetch: a job moved by BLMOVE was no longer in %s", q->proc_key);
            return -1;
        }
        int n = found == 1;
        if (more) {
            int got = parse_fetch(q, q->pipe.reply[1], src, map, out, n, max);
            if (got < 0) {
                q->need_reconcile = true;
                if (n)
                    rq_job_free(&out[0]);
                return -1;
            }
            n = got;
        }
        return n;
    }
    return 0;
}

int rq_fetch(struct rq *q, const struct rq_source *src, int nsrc, enum rq_order order, int max, int block_ms,
             struct rq_job *out)
{
    return rq_fetch_grouped(q, src, NULL, nsrc, order, max, block_ms, out);
}

int rq_fetch_grouped(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                     enum rq_order order, int max, int block_ms, struct rq_job *out)
{
    if (nsrc < 1 || nsrc > MAX_SOURCES)
        return rq_fail(q, "fetch: expected 1 to %d queues, got %d", MAX_SOURCES, nsrc);
    for (int i = 0; i < nsrc; i++)
        if (!src[i].queue || !rq_valid_queue_ref(src[i].queue))
            return rq_fail(q, "fetch: \"%.40s\" is not a queue name", src[i].queue ? src[i].queue : "(null)");
    if (max <= 0)
        return 0;
    if (block_ms < 0)
        block_ms = q->o.block_timeout_ms;
    int64_t t0 = rq_mono_ms();
    if (q->need_reconcile && rq_reconcile(q) < 0) {
        if (block_ms > 0 &&
            wait_ready(&q->cmd, t0 + block_ms) == 0) /* Redis is away: wait like a blocking call */
            sleep_ms(t0 + block_ms - rq_mono_ms());
        return -1;
    }
    rq_stamp(q);
    rq_pipe_reset(&q->pipe);
    char keys[MAX_SOURCES][RQ_KEY_MAX];
    int map[MAX_SOURCES];
    if (add_fetch(q, src, group, nsrc, order, max, -1, keys, map))
        return 0;
    if (rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts)) {
        q->need_reconcile = true;
        rq_fail_conn(q, "fetch");
        if (block_ms > 0 &&
            wait_ready(&q->cmd, t0 + block_ms) == 0) /* Redis is away: wait like a blocking call */
            sleep_ms(t0 + block_ms - rq_mono_ms());
        return -1;
    }
    int n = parse_fetch(q, q->pipe.reply[0], src, map, out, 0, max);
    if (n < 0 && rq_badkey_error(q)) { /* the script moved nothing; wait like a blocking call */
        sleep_ms(t0 + block_ms - rq_mono_ms());
        return -1;
    }
    if (n < 0) {
        q->need_reconcile = true;
        return -1;
    }
    if (n == 0 && block_ms > 0)
        n = fetch_blocking(q, src, group, nsrc, order, max, block_ms, out);
    if (n <= 0)
        return n;
    n = assign_ids(q, out, n);
    for (int i = 0; i < n; i++)
        if (rq_held_add(q, out[i].raw, out[i].len)) {
            for (int k = 0; k < n; k++)
                rq_job_free(&out[k]);
            q->need_reconcile = true;
            return rq_fail(q, "fetch: out of memory");
        }
    return n;
}

int rq_reconcile(struct rq *q)
{
    redisReply *r = rq_conn_command(&q->cmd, "LRANGE %s 0 -1", q->proc_key);
    if (!r)
        return rq_fail_conn(q, "fetch (checking the processing list)");
    if (rq_reply_error(r, "fetch (LRANGE)", q->err, sizeof q->err) || r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return -1;
    }
    struct rq_held *tmp = NULL;
    if (q->nheld) {
        tmp = malloc((size_t)q->nheld * sizeof *tmp);
        if (!tmp) {
            freeReplyObject(r);
            return rq_fail(q, "out of memory");
        }
        memcpy(tmp, q->held, (size_t)q->nheld * sizeof *tmp);
    }
    int ntmp = q->nheld, orphans = 0;
    rq_stamp(q);
    rq_pipe_reset(&q->pipe);
    for (size_t e = 0; e < r->elements; e++) {
        const redisReply *x = r->element[e];
        if (x->type != REDIS_REPLY_STRING)
            continue;
        uint64_t h = rq_hash(x->str, x->len);
        bool held = false;
        for (int i = 0; i < ntmp && !held; i++)
            if (tmp[i].hash == h && tmp[i].len == x->len) {
                tmp[i] = tmp[--ntmp];
                held = true;
            }
        if (held)
            continue;
        rq_script_cmd(q, &q->pipe, RQ_SCRIPT_REQUEUE, q->proc_key, NULL, 0);
        rq_pipe_arg(&q->pipe, x->str, x->len);
        rq_pipe_str(&q->pipe, "");
        rq_pipe_str(&q->pipe, "0"); /* never handed out, so never counted (queue/attempt.h) */
        rq_pipe_str(&q->pipe, "fetch_lost");
        orphans++;
    }
    free(tmp);
    int rc = orphans ? rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts) : 0;
    freeReplyObject(r);
    if (rc)
        return rq_fail_conn(q, "fetch (putting back jobs whose fetch was interrupted)");
    int moved = 0;
    for (int i = 0; i < q->pipe.nreply && orphans; i++)
        if (q->pipe.reply[i] && q->pipe.reply[i]->type == REDIS_REPLY_INTEGER)
            moved += (int)q->pipe.reply[i]->integer;
    if (moved)
        log_warn("redis: put %d job%s back on their queue after a fetch lost its reply", moved,
                 moved == 1 ? "" : "s");
    q->need_reconcile = false;
    return moved;
}
