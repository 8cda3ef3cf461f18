/* Liveness: every worker refreshes its heartbeat hash <p>:worker:<id> (instance, host, pid, gpu,
 * model, models, started_at, jobs_done, tokens_per_s, running, waiting, kv_usage, last_seen) with a
 * TTL of heartbeat_ttl_s and keeps its id in the set <p>:workers. A worker whose hash expired is
 * considered dead, and any other worker's reaper (queue/reaper.h) puts its jobs back.
 *
 * The hash also says which run holds the id: `instance` is a random token of the process
 * (struct rq's instance). A heartbeat that finds the hash held by another instance writes nothing
 * and answers RQ_HB_TAKEN: at start a second worker under a live worker's id is refused (it would
 * take that worker's processing list and run its jobs twice), and a running worker learns that its
 * id was taken over. Check and write are one script, so of two starting at once one wins. */
#pragma once
#include <stdint.h>

struct rq;
struct redisReply;

/* What a worker tells about itself (strings borrowed; NULL = ""). */
struct rq_worker_info {
    const char *gpu;     /* "NVIDIA H200" or "cpu" */
    const char *model;   /* model name */
    const char *models;  /* the model names it serves (model.name, then model.aliases), comma-separated */
    int64_t jobs_done;   /* since start */
    double tokens_per_s; /* recent generation throughput */
    int running;         /* jobs in the engine now */
    int waiting;         /* sequences admitted by the engine, waiting for a place in the batch */
    int kv_blocks_used, kv_blocks_total; /* KV cache blocks; total 0 = unknown (kv_usage not written) */
};

/* The instance that holds a worker id, as the refused heartbeat found it (or, after a heartbeat
 * that replaced another instance's hash: that instance, ttl_ms -2; all zero otherwise). */
struct rq_hb_holder {
    char instance[24]; /* its token; "(none)" for a hash without one */
    char host[256];
    long long pid;
    long long ttl_ms; /* until the hash lapses; -1 without a TTL */
};

#define RQ_HB_TAKEN 1 /* rq_heartbeat: another instance holds this worker id */

/* HSET + EXPIRE + SADD in one script, with a DEL of <p>:lapsed:<id> (a reaper's mark that the
 * heartbeat had lapsed: the worker is back, queue/reaper.h), unless the hash is held by another
 * instance. Until one
 * heartbeat of this instance has succeeded (q->claimed) it claims the id: with opts.force_id from
 * anyone, else only when the hash is absent or its holder is provably gone (an earlier run on this
 * host whose pid no longer exists). 0; RQ_HB_TAKEN with q->holder set, q->id_taken true and the
 * reason in rq_error (at start: how to proceed; later: that the id was taken over); -1 on a Redis
 * failure. */
int rq_heartbeat(struct rq *q, const struct rq_worker_info *info);

/* Whether this instance still holds its id, in one HGET (for a step that acts on the processing
 * list as its owner, such as acknowledging). 0 when the hash is this instance's or absent;
 * RQ_HB_TAKEN (as rq_heartbeat, "taken over") when another instance's; -1 on a Redis failure. */
int rq_heartbeat_check(struct rq *q);

/* SMEMBERS <p>:workers: every known worker id, live or lapsed, as an array reply the caller
 * frees (freeReplyObject); NULL with "<what>: <why>" in rq_error. */
struct redisReply *rq_workers(struct rq *q, const char *what);

/* At a clean exit: deletes the heartbeat, and leaves <p>:workers if the processing list is empty
 * (otherwise the reaper takes the rest at once, as the heartbeat is gone). 0, or -1. */
int rq_heartbeat_stop(struct rq *q);
