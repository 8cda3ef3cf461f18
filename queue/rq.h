/* The Redis queue handle: options, the two connections (one for commands, a dedicated one for
 * blocking fetches so a blocked BLMOVE never delays progress or acks), the key layout, the
 * loaded scripts, and the sticky error string.
 *
 *     struct rq_opts o;
 *     rq_opts_default(&o);  ... fields ...     // or cfg_rq_opts (worker/config/redis_cfg.h)
 *     struct rq *q;
 *     if (rq_open(&o, &q, err, sizeof err)) ... bad options ...
 *     if (rq_connect(q)) log_warn("%s", rq_error(q));   // optional: it reconnects by itself
 *     ... rq_fetch / rq_progress / rq_ack / rq_tick ... (queue/fetch.h etc.)
 *     rq_free(q);
 *
 * Every operation returns 0 (or a count) on success and -1 on failure, with the reason in
 * rq_error(q) ("ack: redis 127.0.0.1:6379: Connection refused (unavailable; next reconnect
 * attempt in 400 ms)"). A failure never loses a job: a job stays in the worker's processing list
 * until an ack, retry, requeue or dead-letter of it succeeds, so the caller simply tries again
 * later. Operations on held jobs are idempotent except fetch, whose own losses (a reply lost
 * with the connection after Redis moved jobs) rq repairs by itself on the next fetch.
 *
 * One thread uses a struct rq; a worker with several threads opens one per thread. */
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "queue/conn.h"
#include "queue/heartbeat.h"
#include "queue/keys.h"
#include "queue/pipe.h"
#include "queue/scripts.h"

struct rq_done;
#define RQ_BADKEY_MEMORY 64
#define RQ_SHORT_DONE_MAX 64

struct rq_opts {
    const char *url;      /* redis://[user:password@]host:port[/db], unix:///path.sock[?db=N] or /path.sock */
    const char *username; /* ACL user; NULL or "" = the URL's */
    const char *password; /* NULL or "" = the URL's */
    int db;               /* -1 = the URL's (0 if it has none) */
    const char *prefix;   /* key prefix; NULL = "llmq" */
    const char *worker_id;     /* NULL or "" = <hostname>-<pid> */
    const char *default_queue; /* where jobs go whose origin is unknown; NULL = "short" */
    int connect_timeout_ms;    /* connect, and every non-blocking command */
    int block_timeout_ms;      /* longest blocking fetch */
    int reconnect_max_ms;      /* ceiling of the reconnect backoff */
    int max_attempts;          /* deliveries before the dead list (those that lost their worker aside) */
    int max_stalls;            /* deliveries that ran a job and lost their worker, before the dead list */
    int retry_backoff_base_ms, retry_backoff_max_ms;
    int result_ttl_s;         /* a finished job's hash expires after this; 0 = never */
    int events_maxlen;        /* XADD <p>:events MAXLEN ~ this */
    int stream_maxlen;        /* XADD <p>:stream:<id> MAXLEN ~ this (queue/stream.h) */
    int heartbeat_ttl_s;      /* TTL of <p>:worker:<id> */
    int heartbeat_interval_s; /* rq_tick: heartbeat period */
    int reaper_interval_s;    /* rq_tick: reaper period */
    int64_t max_job_bytes;    /* larger jobs are not parsed for an id (0 = no limit) */
    int64_t fetch_max_bytes;  /* job JSON one fetch moves at most (one job always; 0 = no limit) */
    int64_t results_maxlen;   /* < 0: no rows published; else <p>:results and <p>:metrics keep at most
                                 this many entries, 0 = no cap (queue/results.h) */
    const char *sentinels;    /* "host:port, ..." of Redis Sentinels; NULL or "" = none (use url) */
    const char *master_name;  /* the master's name at the sentinels */
    const char *sentinel_username, *sentinel_password; /* AUTH to the sentinels; NULL or "" = none */
    int wait_replicas;        /* WAIT for this many replicas after push, fetch and ack (replicas.h) */
    int wait_timeout_ms;      /* WAIT's timeout */
    bool quiet;               /* no log lines from the connections (tests) */
    bool force_id;            /* the first heartbeat takes the id over even from a live instance */
};

/* The defaults of conf/llmq.yaml (redis://127.0.0.1:6379/0, prefix llmq, ...). */
void rq_opts_default(struct rq_opts *o);

/* A job held in memory by rq: a fingerprint of its JSON (see held in struct rq). */
struct rq_held {
    uint64_t hash;
    size_t len;
};

struct rq {
    struct rq_opts o; /* strings below point into owned copies */
    struct rq_keys keys;
    char worker[RQ_NAME_MAX + 1];
    char default_queue[RQ_QUEUE_MAX + 1];
    char proc_key[RQ_KEY_MAX]; /* <p>:processing:<worker> */
    char hb_key[RQ_KEY_MAX];   /* <p>:worker:<worker> */
    struct rq_conn cmd;        /* commands, pipelines, scripts */
    struct rq_conn blk;        /* BLMOVE only */
    struct rq_scripts scripts;
    struct rq_pipe pipe; /* reused by every operation */

    /* preformatted common script arguments */
    char now[32]; /* rq_stamp: unix seconds with milliseconds */
    char maxlen_s[16], ttl_s[16], maxbytes_s[24], maxatt_s[16];
    char rescap_s[24]; /* results_maxlen, "" when no rows are published */

    double started_at; /* unix seconds at rq_open */
    char host[256];

    /* Jobs fetched and not yet let go (ack, retry, requeue, dead): their processing-list
     * entries are ours. After a fetch lost its replies, anything else in our processing list
     * was moved by Redis without our knowing and is put back (see fetch.c). */
    struct rq_held *held;
    int nheld;
    size_t held_bytes; /* the sum of held[].len */
    size_t capheld;
    bool need_reconcile;
    int rr_next;        /* the source a blocking fetch starts with (rotates) */
    int64_t duplicates; /* jobs a fetch recognized as duplicates and did not hand out (fetch.h) */
    uint64_t badkeys[RQ_BADKEY_MEMORY]; /* keys of the wrong type reported (queue/badkey.h) */
    int nbadkeys;
    bool wait_short;         /* the last WAIT had fewer confirmations than wait_replicas (replicas.h) */
    bool wait_lost;          /* the last rq_wait failed with the connection */
    int64_t wait_shortfalls; /* WAITs with fewer confirmations than wait_replicas */
    int64_t short_log_ms;    /* a fetch held back for want of replicas is logged again from this time */
    /* Acks whose WAIT fell short and that completed a batch: the ack sent again finds the job final
     * and the batch done, so it reports batch_done from here (queue/ack.c). */
    struct {
        uint64_t hash; /* rq_hash of the job's raw text */
        long long batch_done;
    } short_done[RQ_SHORT_DONE_MAX];
    int nshort_done;

    int64_t next_heartbeat_ms, next_reap_ms, next_retry_ms; /* rq_tick schedule (monotonic) */
    int (*done_fn)(void *ctx, const char *id, const char *worker, const char *line, size_t len, int nth,
                   struct rq_done *out); /* rq_reap_set_lookup */
    void *done_ctx;

    char *owned[6]; /* copies of the option strings */
    /* The heartbeat hash carries this run's random token (field `instance`): a second process
     * started under the same id sees that the id is in use (queue/heartbeat.h). */
    char instance[24];
    bool claimed;               /* a heartbeat of this instance succeeded (the id is ours) */
    bool id_taken;              /* the last heartbeat found the hash held by another instance */
    struct rq_hb_holder holder; /* that instance, when id_taken */

    char err[1024];
};

/* Checks the options and prepares the handle (no connection yet). 0, or -1 with err. */
int rq_open(const struct rq_opts *o, struct rq **out, char *err, size_t errlen);
/* Closes both connections and frees q. Accepts NULL. */
void rq_free(struct rq *q);

/* The last error (sticky, "" if none yet). Valid until the next call on q. */
const char *rq_error(const struct rq *q);
/* This worker's id (the name in <p>:processing:<id>). */
const char *rq_worker_id(const struct rq *q);
/* Connects both connections now (ignoring the backoff). 0, or -1 with the reason. */
int rq_connect(struct rq *q);
/* Connects both connections, trying again with their backoff (up to reconnect_max_ms apart) until
 * both are up, timeout_ms has passed (then one last attempt each is made; 0 = that attempt alone),
 * the server refuses the credentials (rq_auth_refused: trying again would not help) or *stop is
 * non-zero (stop may be NULL; it is checked every 50 ms). For a caller that must not
 * go on without Redis: the failed attempts are not logged, the caller reports the outcome. 0, or
 * -1 with the last attempt's reason in rq_error, without the address ("Connection refused"). */
int rq_connect_wait(struct rq *q, int timeout_ms, const volatile sig_atomic_t *stop);
/* Whether the last connect attempt of either connection reached the server and it refused the
 * credentials (a wrong password or user, a password the server does not have, or none given to a
 * server that wants one): a fault of the configuration, not of the network. */
bool rq_auth_refused(const struct rq *q);
/* Number of jobs rq considers held by this worker. */
int rq_held_count(const struct rq *q);
/* Bytes of JSON of the jobs rq considers held by this worker. */
size_t rq_held_bytes(const struct rq *q);

/* ---- for the files of queue/ */

/* Formats into q->err; returns -1. */
int rq_fail(struct rq *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<what>: <the command connection's error>"; returns -1. */
int rq_fail_conn(struct rq *q, const char *what);
/* Sets q->now to the current time; returns it. */
double rq_stamp(struct rq *q);
/* Starts an EVALSHA of s in p with the common KEYS (events, dead, cancel, `proc`), then the
 * extra keys xkeys[0..nx), then the common ARGV; the caller appends the script's own ARGV. */
void rq_script_cmd(struct rq *q, struct rq_pipe *p, enum rq_script s, const char *proc,
                   const char *const *xkeys, int nx);
/* Starts an XADD to <p>:events (MAXLEN ~ events_maxlen) with the fields every event carries: id,
 * status, worker ("" when none) and ts (q->now); the caller appends the event's own fields. */
void rq_event_cmd(struct rq *q, struct rq_pipe *p, const char *id, const char *status, const char *worker);

/* Appends to an HSET of a job's hash the counts that are known: prompt_tokens and
 * completion_tokens when >= 0, first_token_at when > 0 (the "leave as it is" convention of
 * struct rq_progress and struct rq_result). */
void rq_job_counts(struct rq_pipe *p, int prompt_tokens, int completion_tokens, double first_token_at);

/* Appends "SADD <p>:models <model>" to p when the queue reference names a model (every writer
 * of a model queue does, so `llmq status` finds the model queues without KEYS). Returns the
 * commands added (0 or 1). */
int rq_model_add_cmd(struct rq *q, struct rq_pipe *p, const char *queue_ref);

/* Held-job bookkeeping. */
int rq_held_add(struct rq *q, const char *raw, size_t len);
void rq_held_remove(struct rq *q, const char *raw, size_t len);
/* 64-bit FNV-1a of raw: the fingerprint of a held job. */
uint64_t rq_hash(const char *raw, size_t len);
