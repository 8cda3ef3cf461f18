/* See rq.h. */
#include "queue/rq.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/array.h"
#include "engine/util/hash.h"

void rq_opts_default(struct rq_opts *o)
{
    memset(o, 0, sizeof *o);
    o->url = "redis://127.0.0.1:6379/0";
    o->db = -1;
    o->prefix = "llmq";
    o->default_queue = "short";
    o->connect_timeout_ms = 2000;
    o->block_timeout_ms = 1000;
    o->reconnect_max_ms = 5000;
    o->max_attempts = 3;
    o->max_stalls = 10;
    o->retry_backoff_base_ms = 1000;
    o->retry_backoff_max_ms = 60000;
    o->result_ttl_s = 86400;
    o->events_maxlen = 100000;
    o->stream_maxlen = 10000;
    o->heartbeat_ttl_s = 30;
    o->heartbeat_interval_s = 5;
    o->reaper_interval_s = 10;
    o->max_job_bytes = 4 << 20;
    o->fetch_max_bytes = 8 << 20;
    o->results_maxlen = -1;
    o->master_name = "mymaster";
    o->wait_timeout_ms = 1000;
}

/* 16 hex digits from /dev/urandom (the clock and pid mixed where it cannot be read): a token that
 * tells this run apart from any other run under the same worker id. */
static void new_instance(char *buf, size_t len)
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&v, sizeof v, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char seed[64];
        int n = snprintf(seed, sizeof seed, "%lld.%ld.%ld", (long long)ts.tv_sec, ts.tv_nsec, (long)getpid());
        v = rq_hash(seed, (size_t)n);
    }
    if (f)
        fclose(f);
    snprintf(buf, len, "%016llx", (unsigned long long)v);
}

static char *dup_or(const char *s, const char *def)
{
    return strdup(s && *s ? s : def);
}

int rq_open(const struct rq_opts *o, struct rq **out, char *err, size_t errlen)
{
    *out = NULL;
    struct rq *q = calloc(1, sizeof *q);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    q->o = *o;
    if (rq_keys_init(&q->keys, o->prefix && *o->prefix ? o->prefix : "llmq", err, errlen))
        goto fail;

    /* the address: the URL (or a bare socket path), then username/password/db where set */
    struct rq_addr a;
    char msg[300];
    const char *url = o->url && *o->url ? o->url : "redis://127.0.0.1:6379/0";
    if (url[0] == '/') {
        memset(&a, 0, sizeof a);
        if (strlen(url) >= sizeof a.unix_path) {
            snprintf(err, errlen, "redis url: socket path too long");
            goto fail;
        }
        snprintf(a.unix_path, sizeof a.unix_path, "%s", url);
    } else if (rq_url_parse(url, &a, msg, sizeof msg)) {
        snprintf(err, errlen, "redis url: %s", msg);
        goto fail;
    }
    if (o->username && *o->username)
        snprintf(a.user, sizeof a.user, "%s", o->username);
    if (o->password && *o->password)
        snprintf(a.password, sizeof a.password, "%s", o->password);
    if (o->db >= 0)
        a.db = o->db;
    struct rq_sentinels sen;
    memset(&sen, 0, sizeof sen);
    if (o->sentinels && *o->sentinels) {
        if (rq_sentinels_parse(o->sentinels, &sen, msg, sizeof msg)) {
            snprintf(err, errlen, "redis sentinels: %s", msg);
            goto fail;
        }
        if (!o->master_name || !*o->master_name || strlen(o->master_name) >= sizeof sen.master_name) {
            snprintf(err, errlen, "redis sentinels: a master name of 1 to %d bytes is needed",
                     (int)sizeof sen.master_name - 1);
            goto fail;
        }
        snprintf(sen.master_name, sizeof sen.master_name, "%s", o->master_name);
        snprintf(sen.user, sizeof sen.user, "%s", o->sentinel_username ? o->sentinel_username : "");
        snprintf(sen.password, sizeof sen.password, "%s", o->sentinel_password ? o->sentinel_password : "");
    }

    if (gethostname(q->host, sizeof q->host) != 0 || !q->host[0])
        snprintf(q->host, sizeof q->host, "localhost");
    q->host[sizeof q->host - 1] = 0;
    if (o->worker_id && *o->worker_id) {
        if (!rq_valid_worker_id(o->worker_id)) {
            snprintf(err, errlen, "worker id \"%.140s\": use 1 to %d letters, digits and . _ @ -",
                     o->worker_id, RQ_NAME_MAX);
            goto fail;
        }
        snprintf(q->worker, sizeof q->worker, "%s", o->worker_id);
    } else {
        char h[RQ_NAME_MAX - 12];
        size_t n = 0;
        for (const char *s = q->host; *s && n + 1 < sizeof h; s++)
            h[n++] = rq_valid_worker_id((char[]){*s, 0}) ? *s : '-';
        h[n] = 0;
        snprintf(q->worker, sizeof q->worker, "%s-%ld", h, (long)getpid());
    }
    const char *dq = o->default_queue && *o->default_queue ? o->default_queue : "short";
    if (!rq_valid_queue_name(dq)) {
        snprintf(err, errlen, "default queue \"%.40s\" is not a valid queue name", dq);
        goto fail;
    }
    snprintf(q->default_queue, sizeof q->default_queue, "%s", dq);
    rq_key_processing(&q->keys, q->worker, q->proc_key, sizeof q->proc_key);
    rq_key_worker(&q->keys, q->worker, q->hb_key, sizeof q->hb_key);
    new_instance(q->instance, sizeof q->instance);

    /* copies of the option strings the handle keeps using */
    q->owned[0] = dup_or(o->url, "redis://127.0.0.1:6379/0");
    q->owned[1] = dup_or(o->username, "");
    q->owned[2] = dup_or(o->password, "");
    for (int i = 0; i < 3; i++)
        if (!q->owned[i]) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    q->o.url = q->owned[0];
    q->o.username = q->owned[1];
    q->o.password = q->owned[2];
    q->o.prefix = q->keys.prefix;
    q->o.worker_id = q->worker;
    q->o.default_queue = q->default_queue;
    /* the sentinel settings live in cmd.sentinel and blk.sentinel */
    q->o.sentinels = q->o.master_name = q->o.sentinel_username = q->o.sentinel_password = NULL;
    if (q->o.max_attempts < 1)
        q->o.max_attempts = 1;
    if (q->o.max_stalls < 1)
        q->o.max_stalls = 1;
    if (q->o.block_timeout_ms < 1)
        q->o.block_timeout_ms = 1000;
    if (q->o.heartbeat_ttl_s < 1)
        q->o.heartbeat_ttl_s = 30;
    if (q->o.heartbeat_interval_s < 1)
        q->o.heartbeat_interval_s = 1;
    if (q->o.reaper_interval_s < 1)
        q->o.reaper_interval_s = 1;
    if (q->o.events_maxlen < 1)
        q->o.events_maxlen = 1;

    snprintf(q->maxlen_s, sizeof q->maxlen_s, "%d", q->o.events_maxlen);
    snprintf(q->ttl_s, sizeof q->ttl_s, "%d", q->o.result_ttl_s > 0 ? q->o.result_ttl_s : 0);
    snprintf(q->maxbytes_s, sizeof q->maxbytes_s, "%lld",
             (long long)(q->o.max_job_bytes > 0 ? q->o.max_job_bytes : 0));
    snprintf(q->maxatt_s, sizeof q->maxatt_s, "%d", q->o.max_attempts);
    if (q->o.results_maxlen >= 0)
        snprintf(q->rescap_s, sizeof q->rescap_s, "%lld", (long long)q->o.results_maxlen);

    rq_conn_init(&q->cmd, &a, "commands", q->o.connect_timeout_ms, q->o.connect_timeout_ms,
                 q->o.reconnect_max_ms);
    /* the blocking connection waits up to block_timeout_ms for a reply by design */
    rq_conn_init(&q->blk, &a, "blocking", q->o.connect_timeout_ms,
                 q->o.block_timeout_ms + q->cmd.connect_timeout_ms, q->o.reconnect_max_ms);
    q->cmd.quiet = q->blk.quiet = o->quiet;
    q->cmd.sentinel = q->blk.sentinel = sen;
    snprintf(q->cmd.client_name, sizeof q->cmd.client_name, "llmq:%s", q->worker);
    snprintf(q->blk.client_name, sizeof q->blk.client_name, "llmq:%s:blocking", q->worker);
    rq_pipe_init(&q->pipe);
    q->started_at = rq_wall_s();
    rq_stamp(q);
    *out = q;
    return 0;
fail:
    rq_free(q);
    return -1;
}

void rq_free(struct rq *q)
{
    if (!q)
        return;
    rq_conn_close(&q->cmd);
    rq_conn_close(&q->blk);
    rq_pipe_free(&q->pipe);
    free(q->held);
    for (size_t i = 0; i < sizeof q->owned / sizeof q->owned[0]; i++)
        free(q->owned[i]);
    free(q);
}

const char *rq_error(const struct rq *q)
{
    return q->err;
}

const char *rq_worker_id(const struct rq *q)
{
    return q->worker;
}

int rq_connect(struct rq *q)
{
    if (rq_conn_connect_now(&q->cmd))
        return rq_fail(q, "connect: %s", q->cmd.err);
    if (rq_conn_connect_now(&q->blk))
        return rq_fail(q, "connect: %s", q->blk.err);
    return 0;
}

/* Sleeps until `at` (monotonic ms) in slices short enough to notice *stop. */
static void nap_until(int64_t at, const volatile sig_atomic_t *stop)
{
    for (int64_t now = rq_mono_ms(); now < at && !(stop && *stop); now = rq_mono_ms()) {
        int64_t ms = at - now < 50 ? at - now : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int rq_connect_wait(struct rq *q, int timeout_ms, const volatile sig_atomic_t *stop)
{
    int64_t deadline = rq_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    bool quiet_cmd = q->cmd.quiet, quiet_blk = q->blk.quiet;
    q->cmd.quiet = q->blk.quiet = true;
    int rc = 0;
    for (;;) {
        bool last = rq_mono_ms() >= deadline; /* one more attempt each, whatever the backoff says */
        struct rq_conn *c;
        if (last)
            c = rq_conn_connect_now(&q->cmd) ? &q->cmd : rq_conn_connect_now(&q->blk) ? &q->blk : NULL;
        else
            c = rq_conn_ready(&q->cmd) ? &q->cmd : rq_conn_ready(&q->blk) ? &q->blk : NULL;
        if (!c)
            break;
        if (last || (stop && *stop) || c->auth_refused) { /* a wrong password stays wrong */
            rc = rq_fail(q, "%s", c->last_error[0] ? c->last_error : "cannot connect");
            break;
        }
        int64_t next = rq_mono_ms() + rq_conn_retry_in_ms(c);
        nap_until(next < deadline ? next : deadline, stop);
    }
    q->cmd.quiet = quiet_cmd;
    q->blk.quiet = quiet_blk;
    return rc;
}

bool rq_auth_refused(const struct rq *q)
{
    return q->cmd.auth_refused || q->blk.auth_refused;
}

int rq_held_count(const struct rq *q)
{
    return q->nheld;
}

size_t rq_held_bytes(const struct rq *q)
{
    return q->held_bytes;
}

int rq_fail(struct rq *q, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->err, sizeof q->err, fmt, ap);
    va_end(ap);
    return -1;
}

int rq_fail_conn(struct rq *q, const char *what)
{
    return rq_fail(q, "%s: %s", what, q->cmd.err);
}

double rq_stamp(struct rq *q)
{
    double t = rq_wall_s();
    snprintf(q->now, sizeof q->now, "%.3f", t);
    return t;
}

void rq_script_cmd(struct rq *q, struct rq_pipe *p, enum rq_script s, const char *proc,
                   const char *const *xkeys, int nx)
{
    rq_pipe_script(p, s, RQ_SCRIPT_COMMON_KEYS + nx);
    rq_pipe_str(p, q->keys.events);
    rq_pipe_str(p, q->keys.dead);
    rq_pipe_str(p, q->keys.cancel);
    rq_pipe_str(p, proc);
    for (int i = 0; i < nx; i++)
        rq_pipe_str(p, xkeys[i]);
    rq_pipe_str(p, q->keys.job_stem);
    rq_pipe_str(p, q->keys.queue_stem);
    rq_pipe_str(p, q->worker);
    rq_pipe_str(p, q->now);
    rq_pipe_str(p, q->maxlen_s);
    rq_pipe_str(p, q->ttl_s);
    rq_pipe_str(p, q->default_queue);
    rq_pipe_str(p, q->maxbytes_s);
    rq_pipe_str(p, q->maxatt_s);
    rq_pipe_str(p, q->keys.batch_stem);
    rq_pipe_str(p, q->keys.batch_done);
    rq_pipe_str(p, q->keys.worker_stem);
}

void rq_event_cmd(struct rq *q, struct rq_pipe *p, const char *id, const char *status, const char *worker)
{
    rq_pipe_cmd(p, "XADD");
    rq_pipe_str(p, q->keys.events);
    rq_pipe_str(p, "MAXLEN");
    rq_pipe_str(p, "~");
    rq_pipe_str(p, q->maxlen_s);
    rq_pipe_str(p, "*");
    rq_pipe_str(p, "id");
    rq_pipe_str(p, id);
    rq_pipe_str(p, "status");
    rq_pipe_str(p, status);
    rq_pipe_str(p, "worker");
    rq_pipe_str(p, worker);
    rq_pipe_str(p, "ts");
    rq_pipe_str(p, q->now);
}

void rq_job_counts(struct rq_pipe *p, int prompt_tokens, int completion_tokens, double first_token_at)
{
    if (prompt_tokens >= 0) {
        rq_pipe_str(p, "prompt_tokens");
        rq_pipe_int(p, prompt_tokens);
    }
    if (completion_tokens >= 0) {
        rq_pipe_str(p, "completion_tokens");
        rq_pipe_int(p, completion_tokens);
    }
    if (first_token_at > 0) {
        rq_pipe_str(p, "first_token_at");
        rq_pipe_fmt(p, "%.3f", first_token_at);
    }
}

uint64_t rq_hash(const char *raw, size_t len)
{
    return fnv1a(FNV1A_INIT, raw, len);
}

int rq_held_add(struct rq *q, const char *raw, size_t len)
{
    if (array_reserve(&q->held, &q->capheld, (size_t)q->nheld + 1, sizeof *q->held, 256))
        return -1;
    q->held[q->nheld++] = (struct rq_held){rq_hash(raw, len), len};
    q->held_bytes += len;
    return 0;
}

void rq_held_remove(struct rq *q, const char *raw, size_t len)
{
    uint64_t h = rq_hash(raw, len);
    for (int i = 0; i < q->nheld; i++)
        if (q->held[i].hash == h && q->held[i].len == len) {
            q->held[i] = q->held[--q->nheld];
            q->held_bytes -= len;
            return;
        }
}
