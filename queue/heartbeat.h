/* Liveness: every worker refreshes its heartbeat hash <p>:worker:<id> (host, pid, gpu, model,
 * models, started_at, jobs_done, tokens_per_s, running, waiting, kv_usage, last_seen) with a TTL of
 * heartbeat_ttl_s and keeps its id in the set <p>:workers. A worker whose hash expired is
 * considered dead, and any other worker's reaper (queue/reaper.h) puts its jobs back. */
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

/* HSET + EXPIRE + SADD in one MULTI/EXEC, with a DEL of <p>:lapsed:<id> (a reaper's mark that
 * the heartbeat had lapsed: the worker is back, queue/reaper.h). 0, or -1. */
int rq_heartbeat(struct rq *q, const struct rq_worker_info *info);

/* SMEMBERS <p>:workers: every known worker id, live or lapsed, as an array reply the caller
 * frees (freeReplyObject); NULL with "<what>: <why>" in rq_error. */
struct redisReply *rq_workers(struct rq *q, const char *what);

/* At a clean exit: deletes the heartbeat, and leaves <p>:workers if the processing list is empty
 * (otherwise the reaper takes the rest at once, as the heartbeat is gone). 0, or -1. */
int rq_heartbeat_stop(struct rq *q);
