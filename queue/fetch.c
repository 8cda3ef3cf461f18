/* See fetch.h. */
#include "queue/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/util/log.h"
#include "queue/badkey.h"
#include "queue/jobid.h"
#include "queue/replicas.h"
#include "queue/rq.h"

#define MAX_SOURCES RQ_FETCH_MAX_SOURCES
#define SHORT_LOG_MS 10000 /* a fetch held back for want of replicas is logged at most this often */

static int put_back(struct rq *q, const char *reason);

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
 * fewer from (a job already got from it by BLMOVE, `pre` bytes). Returns 0, or 1 when nothing
 * can be asked. */
static int add_fetch(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                     enum rq_order order, int max, int64_t max_bytes, int minus, size_t pre,
                     char keys[][RQ_KEY_MAX], int *map)
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
    if (n == 0 || max <= 0 || (pre > 0 && max_bytes > 0 && (int64_t)pre >= max_bytes))
        return 1;
    rq_script_cmd(q, &q->pipe, RQ_SCRIPT_FETCH, q->proc_key, xk, n);
    rq_pipe_str(&q->pipe, order == RQ_ORDER_ROUND_ROBIN ? "r" : "p");
    rq_pipe_int(&q->pipe, max);
    rq_pipe_int(&q->pipe, max_bytes > 0 ? max_bytes : 0);
    rq_pipe_int(&q->pipe, (long long)pre);
    for (int i = 0; i < n; i++)
        rq_pipe_int(&q->pipe, caps[i]);
    for (int i = 0; grouped && i < n; i++) /* a source of no group gets one of its own */
        rq_pipe_int(&q->pipe, groups[i] > 0 ? groups[i] : MAX_SOURCES + 1 + i);
    return 0;
}

/* Makes j the job in reply string r, taking r's buffer over (hiredis allocates it with malloc and
 * ends it with a NUL): a job of megabytes is not copied. */
static void take_job(struct rq_job *j, redisReply *r, const char *queue)
{
    memset(j, 0, sizeof *j);
    j->raw = r->str;
    j->len = r->len;
    r->str = NULL;
    r->len = 0;
    snprintf(j->queue, sizeof j->queue, "%s", queue);
}

static void set_str(char *dst, size_t cap, const redisReply *r)
{
    if (r && r->type == REDIS_REPLY_STRING && r->len < cap) {
        memcpy(dst, r->str, r->len);
        dst[r->len] = 0;
    }
}

/* A duplicate the start script took out again: logged and counted. */
static void duplicate(struct rq *q, const char *id, const redisReply *status, const redisReply *holder)
{
    q->duplicates++;
    char s[32] = "?", h[RQ_NAME_MAX + 1] = "";
    set_str(s, sizeof s, status);
    set_str(h, sizeof h, holder);
    log_warn("job %s arrived again while %s%s%s: a duplicate, not run (taken out of %s; its hash and row are "
             "left as they are)",
             id[0] ? id : "?", s, h[0] ? " by " : "", h, q->proc_key);
}

/* A note of the fetch or start script: "<key>\n<type>", not a `want`. A source queue is skipped
 * by that fetch; a job's hash (or its batch's) is left alone and the job is handed out without
 * an id in Redis (queue/badkey.h). Logged once per key. */
static void bad_key(struct rq *q, const char *key_type, const char *want)
{
    char k[RQ_KEY_MAX] = "?";
    const char *nl = strchr(key_type, '\n');
    size_t kl = nl ? (size_t)(nl - key_type) : strlen(key_type);
    snprintf(k, sizeof k, "%.*s", (int)(kl < sizeof k ? kl : sizeof k - 1), key_type);
    rq_badkey_note(q, k, nl ? nl + 1 : "?", want,
                   strcmp(want, "list") == 0 ? "the queue is not fetched from"
                                             : "its job runs without it (not counted, tracked or retried in "
                                               "Redis; a failure dead-letters it)");
}

/* The fetch script's reply into out[n..max) (the raws taken over from r). Returns the new
 * count, or -1 (q->err). */
static int parse_fetch(struct rq *q, redisReply *r, const struct rq_source *src, const int *map,
                       struct rq_job *out, int n, int max)
{
    if (rq_reply_error(r, "fetch", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2)
        return rq_fail(q, "fetch: unexpected reply from the fetch script");
    for (size_t e = 0; e + 1 < r->elements; e += 2) {
        redisReply **f = r->element + e;
        if (f[0]->type != REDIS_REPLY_INTEGER || f[1]->type != REDIS_REPLY_STRING || f[0]->integer < -2 ||
            f[0]->integer == -1 || f[0]->integer >= MAX_SOURCES)
            return rq_fail(q, "fetch: unexpected reply from the fetch script");
    }
    for (size_t e = 0; e + 1 < r->elements; e += 2) {
        if (r->element[e]->integer == -2) /* a source queue of the wrong type: "<key>\n<type>" */
            bad_key(q, r->element[e + 1]->str, "list");
        else if (n < max)
            take_job(&out[n++], r->element[e + 1], src[map[r->element[e]->integer]].queue);
    }
    return n;
}

/* Marks the jobs out[0..n), just moved into the processing list in that order (so out[k] is at
 * index n - 1 - k), running: reads each one's id here (Redis never decodes a job), gives an id
 * to a job in llmq's form that has none, and runs the start script for all of them in one round
 * trip. Duplicates and jobs no longer in the list are dropped from out (keeping the order of
 * the rest). Returns how many remain, or -1 (every job freed; the next fetch reconciles). */
static int start_jobs(struct rq *q, struct rq_job *out, int n)
{
    char **raws = calloc((size_t)n, sizeof *raws);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    if (!raws || !lens) {
        free(raws);
        free(lens);
        for (int i = 0; i < n; i++)
            rq_job_free(&out[i]);
        q->need_reconcile = true;
        return rq_fail(q, "fetch: out of memory");
    }
    char mark[RQ_NAME_MAX + 64];
    int ml = snprintf(mark, sizeof mark, "%cllmq duplicate %s %s", 1, q->worker, q->now);
    rq_pipe_reset(&q->pipe);
    const char *xk[] = {q->keys.lines};
    rq_script_cmd(q, &q->pipe, RQ_SCRIPT_START, q->proc_key, xk, 1);
    rq_pipe_int(&q->pipe, n);
    rq_pipe_arg(&q->pipe, mark, (size_t)(ml < (int)sizeof mark ? ml : (int)sizeof mark - 1));
    for (int i = 0; i < n; i++) {
        struct rq_job *j = &out[i];
        enum rq_idstate st = rq_job_id(j->raw, j->len, (size_t)q->o.max_job_bytes, j->id);
        if (st == RQ_ID_MISSING) {
            char id[RQ_ID_MAX + 1];
            rq_new_id(id);
            if (rq_job_add_id(j->raw, j->len, id, &raws[i], &lens[i]) == 0) /* else it stays without */
                memcpy(j->id, id, sizeof id);
        }
        rq_pipe_str(&q->pipe, j->queue);
        rq_pipe_int(&q->pipe, n - 1 - i);
        rq_pipe_int(&q->pipe, (long long)j->len);
        rq_pipe_str(&q->pipe, j->id);
        rq_pipe_arg(&q->pipe, raws[i] ? raws[i] : "", raws[i] ? lens[i] : 0);
    }
    int rc = rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts);
    const redisReply *r = rc ? NULL : q->pipe.reply[0];
    if (rc)
        rq_fail_conn(q, "fetch (marking the jobs running)");
    else if (rq_reply_error(r, "fetch (start)", q->err, sizeof q->err))
        rc = -1;
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 7 * (size_t)n) {
        rq_fail(q, "fetch: unexpected reply from the start script");
        rc = -1;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        struct rq_job *j = &out[i];
        redisReply **f = rc ? NULL : r->element + 7 * i;
        long long code = f && f[0]->type == REDIS_REPLY_INTEGER ? f[0]->integer : 0;
        if (code == 1) {
            if (raws[i]) {
                free(j->raw);
                j->raw = raws[i];
                j->len = lens[i];
                j->id_assigned = true;
            }
            j->attempts = f[1]->type == REDIS_REPLY_INTEGER ? (int)f[1]->integer : 0;
            j->cancel_requested = f[2]->type == REDIS_REPLY_INTEGER && f[2]->integer;
            j->stalls = f[5]->type == REDIS_REPLY_INTEGER ? (int)f[5]->integer : 0;
            set_str(j->held_by, sizeof j->held_by, f[6]);
            set_str(j->batch_id, sizeof j->batch_id, f[3]);
            if (f[4]->type == REDIS_REPLY_STRING && f[4]->len > 0) { /* its hash is of the wrong type */
                bad_key(q, f[4]->str, "hash");
                j->id[0] = 0;
            }
            if (kept != i) {
                out[kept] = *j;
                memset(j, 0, sizeof *j);
            }
            kept++;
            continue;
        }
        if (code == -1)
            duplicate(q, j->id, f[1], f[2]);
        else /* not where it was moved to (or no answer): the next fetch reconciles */
            q->need_reconcile = true;
        free(raws[i]);
        rq_job_free(j);
    }
    free(raws);
    free(lens);
    return rc ? -1 : kept;
}

/* BLMOVE from one source after another (block_ms split between them), then the rest without
 * blocking. Returns the count of jobs moved (not started yet), or -1. */
static int fetch_blocking(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                          enum rq_order order, int max, int64_t max_bytes, int block_ms, struct rq_job *out)
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
        if (q->blk.ctx && q->blk.sentinel.n && strcmp(q->blk.master_seen, q->cmd.master_seen))
            rq_conn_drop(&q->blk, "the commands connection found a new master"); /* not the old one's jobs */
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
        take_job(&out[0], r, src[i].queue);
        freeReplyObject(r);
        /* the rest that is waiting now, in one more round trip */
        rq_stamp(q);
        rq_pipe_reset(&q->pipe);
        char keys[MAX_SOURCES][RQ_KEY_MAX];
        int map[MAX_SOURCES];
        if (add_fetch(q, src, group, nsrc, order, max - 1, max_bytes, i, out[0].len, keys, map))
            return 1;
        if (rq_pipe_exec(&q->pipe, &q->cmd, &q->scripts)) {
            rq_job_free(&out[0]);
            q->need_reconcile = true;
            return rq_fail_conn(q, "fetch");
        }
        int n = parse_fetch(q, q->pipe.reply[0], src, map, out, 1, max);
        if (n < 0) {
            rq_job_free(&out[0]);
            q->need_reconcile = true;
        }
        return n;
    }
    return 0;
}

int rq_fetch(struct rq *q, const struct rq_source *src, int nsrc, enum rq_order order, int max, int block_ms,
             struct rq_job *out)
{
    return rq_fetch_grouped(q, src, NULL, nsrc, order, max, 0, block_ms, out);
}

int rq_fetch_grouped(struct rq *q, const struct rq_source *src, const int *group, int nsrc,
                     enum rq_order order, int max, int64_t max_bytes, int block_ms, struct rq_job *out)
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
    if (max_bytes <= 0)
        max_bytes = q->o.fetch_max_bytes;
    int64_t t0 = rq_mono_ms();
    if (rq_wait_ready(q, "fetch")) { /* fewer replicas than wait_replicas: take nothing now */
        if (!q->cmd.ctx) {
            if (block_ms > 0 && wait_ready(&q->cmd, t0 + block_ms) == 0)
                sleep_ms(t0 + block_ms - rq_mono_ms());
            return -1;
        }
        if (t0 >= q->short_log_ms) {
            log_warn("redis: %s: not fetching until they are", rq_error(q));
            q->short_log_ms = t0 + SHORT_LOG_MS;
        }
        sleep_ms(t0 + block_ms - rq_mono_ms());
        return 0;
    }
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
    if (add_fetch(q, src, group, nsrc, order, max, max_bytes, -1, 0, keys, map))
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
        n = fetch_blocking(q, src, group, nsrc, order, max, max_bytes, block_ms, out);
    if (n <= 0)
        return n;
    rq_stamp(q);
    n = start_jobs(q, out, n);
    if (n <= 0)
        return n;
    if (rq_wait(q, "fetch")) { /* not on the replicas: a failover would put them back in their queue */
        for (int k = 0; k < n; k++)
            rq_job_free(&out[k]);
        q->need_reconcile = true; /* the connection failed: the next fetch puts them back */
        if (rq_wait_lost(q))
            return -1;
        int64_t now = rq_mono_ms();
        if (now >= q->short_log_ms) {
            log_warn("redis: %s; the %d fetched job%s go back to their queue", rq_error(q), n, n == 1 ? "" : "s");
            q->short_log_ms = now + SHORT_LOG_MS;
        }
        if (put_back(q, "replicas_short") >= 0)
            q->need_reconcile = false;
        return 0;
    }
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
    return put_back(q, "fetch_lost");
}

/* Puts back every entry of the processing list that rq does not hold, with `reason` in the
 * events; logs the count only for fetch_lost. Returns how many, or -1. */
static int put_back(struct rq *q, const char *reason)
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
        rq_pipe_str(&q->pipe, reason);
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
    if (moved && !strcmp(reason, "fetch_lost"))
        log_warn("redis: put %d job%s back on their queue after a fetch lost its reply", moved,
                 moved == 1 ? "" : "s");
    q->need_reconcile = false;
    return moved;
}
