/* See conn.h. */
#include "queue/conn.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/log.h"

#define BACKOFF_MIN_MS 100
#define TROUBLE_LOG_MS 10000 /* the WARN lines of all connections together: at most one per this */

/* One limiter for the whole process: a worker has two connections (and a tool may have more), and
 * each failed attempt of each would otherwise log its own line. A connection that is back ends the
 * window, so that the next outage is logged the moment it starts. */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_log_next_ms; /* monotonic: no connection WARN line before this */
static int g_log_suppressed;  /* lines not shown since the last one */

/* Whether a connection WARN line may be logged now; if so, *held is how many were not shown
 * since the last one (and the count starts again), else the line is counted as not shown. */
static bool trouble_log_due(int *held)
{
    int64_t now = rq_mono_ms();
    pthread_mutex_lock(&g_log_mu);
    bool due = now >= g_log_next_ms;
    if (due) {
        *held = g_log_suppressed;
        g_log_suppressed = 0;
        g_log_next_ms = now + TROUBLE_LOG_MS;
    } else {
        g_log_suppressed++;
    }
    pthread_mutex_unlock(&g_log_mu);
    return due;
}

static void trouble_log_reset(void)
{
    pthread_mutex_lock(&g_log_mu);
    g_log_next_ms = 0;
    pthread_mutex_unlock(&g_log_mu);
}

/* " (N more such lines in the last 10 s not shown)" into buf, or "". */
static const char *held_note(int held, char *buf, size_t len)
{
    buf[0] = 0;
    if (held > 0)
        snprintf(buf, len, " (%d more such line%s in the last %d s not shown)", held, held == 1 ? "" : "s",
                 TROUBLE_LOG_MS / 1000);
    return buf;
}

int64_t rq_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double rq_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct timeval tv_ms(int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

void rq_conn_init(struct rq_conn *c, const struct rq_addr *addr, const char *name, int connect_timeout_ms,
                  int cmd_timeout_ms, int reconnect_max_ms)
{
    memset(c, 0, sizeof *c);
    c->addr = *addr;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->connect_timeout_ms = connect_timeout_ms > 0 ? connect_timeout_ms : 2000;
    c->cmd_timeout_ms = cmd_timeout_ms > 0 ? cmd_timeout_ms : c->connect_timeout_ms;
    c->reconnect_max_ms = reconnect_max_ms >= BACKOFF_MIN_MS ? reconnect_max_ms : BACKOFF_MIN_MS;
    c->backoff_ms = BACKOFF_MIN_MS;
    c->seed = (unsigned)rq_mono_ms() ^ (unsigned)getpid() ^ (unsigned)(uintptr_t)c;
    /* hiredis writes with write(2): a server that went away must not kill the process. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

void rq_conn_close(struct rq_conn *c)
{
    if (!c)
        return;
    if (c->ctx)
        redisFree(c->ctx);
    c->ctx = NULL;
    c->pending = 0;
    c->unflushed = false;
}

void rq_conn_describe(const struct rq_conn *c, char *buf, size_t len)
{
    if (c->sentinel.n && !c->sentinel_named)
        snprintf(buf, len, "(the master \"%.60s\" of the sentinels)", c->sentinel.master_name);
    else if (c->addr.unix_path[0])
        snprintf(buf, len, "unix:%s", c->addr.unix_path);
    else if (strchr(c->addr.host, ':'))
        snprintf(buf, len, "[%s]:%d", c->addr.host, c->addr.port);
    else
        snprintf(buf, len, "%s:%d", c->addr.host, c->addr.port);
}

/* hiredis' message for a context error, with a timeout said as one. */
static void ctx_error(const struct rq_conn *c, const redisContext *ctx, int timeout_ms, char *buf, size_t len)
{
    if (ctx->err == REDIS_ERR_IO &&
        (strstr(ctx->errstr, "temporarily unavailable") || strstr(ctx->errstr, "timed out")))
        snprintf(buf, len, "no answer within %d ms (timeout)", timeout_ms);
    else
        snprintf(buf, len, "%s", ctx->errstr[0] ? ctx->errstr : "connection error");
}

/* One command during the handshake; 0, -1 with the reason in msg, or -2 when the server answered
 * with an error (the reason in msg too). The first command is where a port that is not Redis's
 * shows: an answer that is not in the Redis protocol (an HTTP server), a hang-up, or silence. */
static int handshake(redisContext *ctx, int timeout_ms, char *msg, size_t len, const char *what, int argc,
                     const char **argv)
{
    redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
    if (!r) {
        if (ctx->err == REDIS_ERR_PROTOCOL)
            snprintf(msg, len, "not a Redis server: its answer to %s is not in the Redis protocol (%s)", what,
                     ctx->errstr);
        else if (ctx->err == REDIS_ERR_EOF)
            snprintf(msg, len, "%s: the server closed the connection without answering (not a Redis server?)",
                     what);
        else if (ctx->err == REDIS_ERR_IO &&
                 (strstr(ctx->errstr, "temporarily unavailable") || strstr(ctx->errstr, "timed out")))
            snprintf(msg, len,
                     "%s: no answer within %d ms: something listens there but does not answer (a stopped "
                     "Redis, or not a Redis server)",
                     what, timeout_ms);
        else
            snprintf(msg, len, "%s: %s", what, ctx->errstr[0] ? ctx->errstr : "no reply");
        return -1;
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(msg, len, "%s failed: %.*s", what, (int)r->len, r->str);
        rc = -2;
    }
    freeReplyObject(r);
    return rc;
}

/* With Sentinel: whether the server is a master (ROLE). 0, -1 (msg) when it cannot be asked, or -3
 * when it is a replica. A server whose ACL forbids ROLE is taken for what the sentinel said. */
static int check_master(redisContext *ctx, char *msg, size_t len)
{
    redisReply *r = redisCommand(ctx, "ROLE");
    if (!r) {
        snprintf(msg, len, "ROLE: %s", ctx->errstr[0] ? ctx->errstr : "no reply");
        return -1;
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING &&
        strcmp(r->element[0]->str, "master") != 0) {
        snprintf(msg, len, "the sentinels named a server that is a %s, not a master (a failover in progress)",
                 r->element[0]->str);
        rc = -3;
    }
    freeReplyObject(r);
    return rc;
}

/* Connects to c->addr: AUTH, SELECT, PING, the version check, ROLE with Sentinel, CLIENT SETNAME.
 * 0, -1 (msg), or -3 when Sentinel is on and the server is not a master. */
static int connect_server(struct rq_conn *c, char *msg, size_t len)
{
    struct timeval tv = tv_ms(c->connect_timeout_ms);
    redisContext *ctx = c->addr.unix_path[0] ? redisConnectUnixWithTimeout(c->addr.unix_path, tv)
                                             : redisConnectWithTimeout(c->addr.host, c->addr.port, tv);
    if (!ctx) {
        snprintf(msg, len, "out of memory");
        return -1;
    }
    if (ctx->err) {
        ctx_error(c, ctx, c->connect_timeout_ms, msg, len);
        redisFree(ctx);
        return -1;
    }
    redisSetTimeout(ctx, tv);
    if (!c->addr.unix_path[0])
        redisEnableKeepAlive(ctx);
    c->auth_refused = false;
    int rc = 0;
    if (c->addr.user[0]) {
        const char *argv[] = {"AUTH", c->addr.user, c->addr.password};
        rc = handshake(ctx, c->connect_timeout_ms, msg, len, "AUTH (ACL user)", 3, argv);
    } else if (c->addr.password[0]) {
        const char *argv[] = {"AUTH", c->addr.password};
        rc = handshake(ctx, c->connect_timeout_ms, msg, len, "AUTH", 2, argv);
    }
    c->auth_refused = rc == -2; /* WRONGPASS, or a password given to a server that has none */
    if (rc == 0 && c->addr.db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", c->addr.db);
        const char *argv[] = {"SELECT", db};
        rc = handshake(ctx, c->connect_timeout_ms, msg, len, "SELECT", 2, argv);
    }
    if (rc == 0) { /* a server that wants a password answers NOAUTH here */
        const char *argv[] = {"PING"};
        rc = handshake(ctx, c->connect_timeout_ms, msg, len, "PING", 1, argv);
        if (rc && strstr(msg, "NOAUTH")) {
            snprintf(msg, len,
                     "the server requires a password (NOAUTH): set redis.password or put it in redis.url");
            c->auth_refused = true;
        }
    }
    if (rc == 0) { /* LMOVE, BLMOVE, LPOS and SMISMEMBER need 6.2 (skipped if an ACL forbids INFO) */
        redisReply *r = redisCommand(ctx, "INFO server");
        if (r && r->type == REDIS_REPLY_STRING) {
            const char *v = strstr(r->str, "redis_version:");
            int major = 0, minor = 0;
            if (v && sscanf(v + 14, "%d.%d", &major, &minor) == 2 &&
                (major < 6 || (major == 6 && minor < 2))) {
                snprintf(msg, len, "the server runs Redis %d.%d; llmq needs Redis 6.2 or newer", major,
                         minor);
                rc = -1;
            }
        }
        if (r) {
            freeReplyObject(r);
        } else {
            snprintf(msg, len, "INFO: %s", ctx->errstr[0] ? ctx->errstr : "no reply");
            rc = -1;
        }
    }
    if (rc == 0 && c->sentinel.n)
        rc = check_master(ctx, msg, len);
    if (rc == 0 && c->client_name[0]) { /* best effort: an ACL may forbid it */
        redisReply *r = redisCommand(ctx, "CLIENT SETNAME %s", c->client_name);
        if (r) {
            freeReplyObject(r);
        } else {
            snprintf(msg, len, "CLIENT SETNAME: %s", ctx->errstr[0] ? ctx->errstr : "no reply");
            rc = -1;
        }
    }
    if (rc) {
        redisFree(ctx);
        return rc == -3 ? -3 : -1;
    }
    redisSetTimeout(ctx, tv_ms(c->cmd_timeout_ms));
    c->ctx = ctx;
    return 0;
}

/* With Sentinel: asks the sentinels for the master and connects to it; a server that is not a
 * master (a sentinel that has not seen the failover yet) sends the question to the next
 * sentinel. A master that cannot be reached ends the attempt (the backoff retries: the sentinels
 * fail it over after their down-after-milliseconds). Else connect_server. 0 or -1 (msg). */
static int connect_once(struct rq_conn *c, char *msg, size_t len)
{
    if (!c->sentinel.n)
        return connect_server(c, msg, len) ? -1 : 0;
    for (int k = 0; k < c->sentinel.n; k++) {
        char host[sizeof c->addr.host], why[400];
        int port = 0;
        if (rq_sentinel_master(&c->sentinel, c->connect_timeout_ms, &c->sentinel_from, host, sizeof host,
                               &port, why, sizeof why)) {
            snprintf(msg, len, "no sentinel named the master \"%.60s\": %.300s", c->sentinel.master_name,
                     why);
            return -1;
        }
        snprintf(c->addr.host, sizeof c->addr.host, "%s", host);
        c->addr.port = port;
        c->addr.unix_path[0] = 0;
        c->sentinel_named = true;
        int rc = connect_server(c, why, sizeof why);
        char sname[300];
        rq_sentinel_describe(&c->sentinel, c->sentinel_from, sname, sizeof sname);
        if (rc == 0) {
            char addr[300];
            rq_conn_describe(c, addr, sizeof addr);
            if (!c->quiet && strcmp(addr, c->master_seen))
                log_info("redis sentinel %s: the master \"%s\" is %s%s%s (%s connection)", sname,
                         c->sentinel.master_name, addr, c->master_seen[0] ? ", was " : "", c->master_seen,
                         c->name);
            snprintf(c->master_seen, sizeof c->master_seen, "%s", addr);
            return 0;
        }
        snprintf(msg, len, "master \"%.40s\" at %.60s:%d (from sentinel %.60s): %.150s",
                 c->sentinel.master_name, host, port, sname, why);
        if (rc != -3)
            return -1;
        c->sentinel_from = (c->sentinel_from + 1) % c->sentinel.n; /* ask the next one */
    }
    return -1;
}

static int attempt(struct rq_conn *c)
{
    char addr[300], msg[400];
    rq_conn_describe(c, addr, sizeof addr);
    int64_t now = rq_mono_ms();
    if (connect_once(c, msg, sizeof msg) == 0) {
        rq_conn_describe(c, addr, sizeof addr); /* with Sentinel: the master it found */
        if (!c->quiet) {
            if (c->failures > 0 || c->down_since_ms)
                log_info("redis %s (%s connection): connected again after %.1f s (%d failed attempt%s)", addr,
                         c->name, c->down_since_ms ? (now - c->down_since_ms) / 1000.0 : 0.0, c->failures,
                         c->failures == 1 ? "" : "s");
            else
                log_debug("redis %s (%s connection): connected", addr, c->name);
        }
        if (c->failures > 0 || c->down_since_ms)
            trouble_log_reset();
        c->was_up = true;
        c->failures = 0;
        c->backoff_ms = BACKOFF_MIN_MS;
        c->down_since_ms = 0;
        c->retry_at_ms = 0;
        c->epoch++;
        c->connects++;
        c->err[0] = 0;
        return 0;
    }
    if (!c->down_since_ms)
        c->down_since_ms = now;
    c->failures++;
    int delay = c->backoff_ms;
    /* +-20% jitter so that many workers do not reconnect in lockstep */
    delay += (int)(((int)(rand_r(&c->seed) % 41) - 20) * (long)delay / 100);
    if (delay < 1)
        delay = 1;
    c->retry_at_ms = now + delay;
    c->backoff_ms = c->backoff_ms * 2 > c->reconnect_max_ms ? c->reconnect_max_ms : c->backoff_ms * 2;
    snprintf(c->err, sizeof c->err, "redis %s: %s", addr, msg);
    snprintf(c->last_error, sizeof c->last_error, "%s", msg);
    int held;
    char note[96];
    if (!c->quiet && trouble_log_due(&held))
        log_warn("redis %s (%s connection): cannot connect: %s; next attempt in %d ms%s", addr, c->name, msg,
                 delay, held_note(held, note, sizeof note));
    return -1;
}

int rq_conn_connect_now(struct rq_conn *c)
{
    if (c->ctx)
        return 0;
    return attempt(c);
}

int rq_conn_ready(struct rq_conn *c)
{
    if (c->ctx)
        return 0;
    int64_t wait = rq_conn_retry_in_ms(c);
    if (wait > 0) {
        char addr[300];
        rq_conn_describe(c, addr, sizeof addr);
        snprintf(c->err, sizeof c->err, "redis %s: %s (unavailable; next reconnect attempt in %lld ms)", addr,
                 c->last_error[0] ? c->last_error : "connection lost", (long long)wait);
        return -1;
    }
    return attempt(c);
}

void rq_conn_drop(struct rq_conn *c, const char *why)
{
    char addr[300];
    rq_conn_describe(c, addr, sizeof addr);
    bool was_connected = c->ctx != NULL;
    rq_conn_close(c);
    snprintf(c->err, sizeof c->err, "redis %s: %s", addr, why);
    snprintf(c->last_error, sizeof c->last_error, "%s", why);
    if (was_connected) {
        int held;
        char note[96];
        if (!c->quiet && trouble_log_due(&held))
            log_warn("redis %s (%s connection): connection lost: %s; reconnecting%s", addr, c->name, why,
                     held_note(held, note, sizeof note));
        c->down_since_ms = rq_mono_ms();
        c->retry_at_ms = 0; /* first attempt at once: a restarted server is usually back */
    }
}

int64_t rq_conn_retry_in_ms(const struct rq_conn *c)
{
    if (c->ctx || !c->retry_at_ms)
        return 0;
    int64_t d = c->retry_at_ms - rq_mono_ms();
    return d > 0 ? d : 0;
}

int rq_conn_append_argv(struct rq_conn *c, int argc, const char **argv, const size_t *lens)
{
    if (!c->ctx && rq_conn_ready(c))
        return -1;
    if (redisAppendCommandArgv(c->ctx, argc, argv, lens) != REDIS_OK) {
        rq_conn_drop(c, "out of memory building a command");
        return -1;
    }
    c->pending++;
    c->unflushed = true;
    c->commands++;
    return 0;
}

int rq_conn_read(struct rq_conn *c, redisReply **r)
{
    *r = NULL;
    if (!c->ctx) {
        if (!c->err[0])
            snprintf(c->err, sizeof c->err, "not connected");
        return -1;
    }
    if (c->pending <= 0) {
        snprintf(c->err, sizeof c->err, "internal error: a reply was read that no command asked for");
        return -1;
    }
    if (c->unflushed) {
        c->round_trips++;
        c->unflushed = false;
    }
    void *reply = NULL;
    if (redisGetReply(c->ctx, &reply) != REDIS_OK || !reply) {
        char msg[300];
        ctx_error(c, c->ctx, c->cmd_timeout_ms, msg, sizeof msg);
        rq_conn_drop(c, msg);
        return -1;
    }
    c->pending--;
    const redisReply *x = reply;
    if (c->sentinel.n && x->type == REDIS_REPLY_ERROR &&
        (!strncmp(x->str, "READONLY", 8) || strstr(x->str, "READONLY You can't write") ||
         !strncmp(x->str, "UNBLOCKED", 9))) { /* a demoted master (UNBLOCKED: a BLMOVE it ended) */
        freeReplyObject(reply);               /* the sentinels know the new one */
        rq_conn_drop(c, "the server is no longer the master (READONLY): asking the sentinels for the master");
        return -1;
    }
    *r = reply;
    return 0;
}

void rq_conn_discard(struct rq_conn *c)
{
    while (c->ctx && c->pending > 0) {
        redisReply *r;
        if (rq_conn_read(c, &r))
            break;
        freeReplyObject(r);
    }
}

redisReply *rq_conn_command(struct rq_conn *c, const char *fmt, ...)
{
    if (!c->ctx && rq_conn_ready(c))
        return NULL;
    rq_conn_discard(c);
    if (!c->ctx && rq_conn_ready(c))
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(c->ctx, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK) {
        rq_conn_drop(c, "out of memory building a command");
        return NULL;
    }
    c->pending++;
    c->unflushed = true;
    c->commands++;
    redisReply *r;
    return rq_conn_read(c, &r) ? NULL : r;
}
