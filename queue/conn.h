/* One Redis connection that survives its server: connect (TCP or unix socket), AUTH (password,
 * or ACL user + password), SELECT, timeouts, and reconnection with exponential backoff, with
 * clear log lines (engine/util/log.h) when it is lost, while it is down, and when it is back.
 *
 * A connection never blocks to wait out its backoff: while it is down, rq_conn_ready fails at once
 * (with the time of the next attempt in the error) until the next attempt is due. The first
 * attempt after a connection that was working is immediate, so a restarted server costs one
 * failed command. Like hiredis, it keeps a sticky error string (c->err) describing the last
 * failure.
 *
 * Commands are pipelined: rq_conn_append* queue commands in the output buffer, rq_conn_read
 * flushes them all in one write and returns the replies in order. Any I/O error or timeout
 * drops the connection (a half-read pipeline cannot be resumed) and every pending reply is lost;
 * the caller sees -1 and tries again later.
 *
 * With Sentinel (c->sentinel.n > 0), every connect, the first and every one after a loss, first
 * asks the sentinels where the master of c->sentinel.master_name is (queue/sentinel.h), connects
 * there (c->addr's host and port become that address; its credentials and database stay) and
 * checks with ROLE that the server is a master; a server that answers READONLY to a write (a
 * master demoted to a replica while the connection stayed up), or UNBLOCKED to a blocking
 * command (the demotion ended it), drops the connection like an I/O error, so the next attempt
 * asks the sentinels again. A change of master is logged.
 *
 * hiredis writes with write(2), so rq_conn_init sets SIGPIPE to SIG_IGN if it is still at its
 * default: a server that goes away must not kill the process.
 *
 * Not thread-safe: one thread uses a connection. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "queue/redis_url.h"
#include "queue/sentinel.h"

struct rq_conn {
    redisContext *ctx; /* NULL while down (owned) */
    struct rq_addr addr;          /* with Sentinel: the last master's address (host, port) */
    struct rq_sentinels sentinel; /* n = 0: no Sentinel (set after rq_conn_init) */
    int sentinel_from;            /* the sentinel asked first (the last that answered) */
    char master_seen[300];        /* with Sentinel: the master last connected to ("" = none) */
    bool sentinel_named;          /* with Sentinel: a sentinel has named the master (addr is it) */
    char name[64];          /* "commands", "blocking": which connection, for log lines */
    char client_name[200];  /* CLIENT SETNAME after connecting; "" = none */
    int connect_timeout_ms; /* connect, AUTH and SELECT */
    int cmd_timeout_ms;     /* socket read/write timeout of every command */
    int reconnect_max_ms;   /* backoff ceiling */
    bool quiet;             /* no log lines (tests of the backoff) */

    int64_t retry_at_ms;   /* monotonic: no connect attempt before this */
    int backoff_ms;        /* delay after the next failed attempt */
    int failures;          /* consecutive failed attempts */
    int64_t down_since_ms; /* monotonic; 0 while up or before the first attempt */
    bool was_up;           /* a connection has been established at least once */
    uint64_t epoch;        /* incremented on every successful connect (scripts reload per epoch) */
    int pending;           /* replies still to be read */
    unsigned seed;         /* rand_r state for the backoff jitter */
    bool unflushed;        /* commands appended since the last read */
    bool auth_refused;     /* the last connect attempt reached the server, which refused the
                              credentials: AUTH answered an error (WRONGPASS, a password given to a
                              server without one), or PING answered NOAUTH (none given) */

    uint64_t commands;    /* commands sent */
    uint64_t round_trips; /* flushes followed by reads: one per pipeline */
    uint64_t connects;    /* successful connects */

    char last_error[400]; /* why the connection is down (without the address) */
    char err[1024];
};

/* Prepares c (does not connect). cmd_timeout_ms <= 0 = connect_timeout_ms. */
void rq_conn_init(struct rq_conn *c, const struct rq_addr *addr, const char *name, int connect_timeout_ms,
                  int cmd_timeout_ms, int reconnect_max_ms);
/* Closes the socket. Accepts NULL. */
void rq_conn_close(struct rq_conn *c);

/* "127.0.0.1:6379" or "unix:/path.sock" into buf; with Sentinel, before any sentinel named the
 * master: (the master "mymaster" of the sentinels). */
void rq_conn_describe(const struct rq_conn *c, char *buf, size_t len);

/* Connects if needed: 0 when connected, -1 (c->err) when the server cannot be reached, AUTH or
 * SELECT fail, or the backoff is not over yet. */
int rq_conn_ready(struct rq_conn *c);
/* Connects now, ignoring the backoff (a caller that wants to know at start-up). */
int rq_conn_connect_now(struct rq_conn *c);
/* Drops the connection after an error (`why` goes into c->err and the log); the next attempt
 * is immediate if the connection had been working, else after the backoff. */
void rq_conn_drop(struct rq_conn *c, const char *why);
/* Milliseconds until the next connect attempt is allowed (0 when connected or due). */
int64_t rq_conn_retry_in_ms(const struct rq_conn *c);

/* Queue one command (connecting first if needed): argv form, binary safe. 0 or -1. */
int rq_conn_append_argv(struct rq_conn *c, int argc, const char **argv, const size_t *lens);
/* Reads the next reply (flushing queued commands first). 0 with *r set (owned by the caller:
 * freeReplyObject), or -1 after an I/O error, a timeout or a protocol error (connection
 * dropped). A Redis error reply is a reply (type REDIS_REPLY_ERROR), not a failure. */
int rq_conn_read(struct rq_conn *c, redisReply **r);
/* Reads and frees every pending reply (after a caller gave up on a pipeline). */
void rq_conn_discard(struct rq_conn *c);
/* One command in one round trip, printf-style like redisCommand (%s, %b). NULL after a
 * failure (c->err). The reply is the caller's (freeReplyObject). */
redisReply *rq_conn_command(struct rq_conn *c, const char *fmt, ...);

/* Monotonic milliseconds and wall-clock seconds (unix time with a fraction). */
int64_t rq_mono_ms(void);
double rq_wall_s(void);
