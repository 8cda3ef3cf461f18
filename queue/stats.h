/* What `llmq status` shows: queue depths, the retry and dead counts, live and lapsed workers with
 * their heartbeat fields and how many jobs each holds, and the running jobs with their progress.
 * What `llmq worker --drain` waits for is queue/drain.h. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "queue/keys.h"

struct rq;

#define RQ_STATS_MAX_QUEUES 32

struct rq_worker_stat {
    char id[RQ_NAME_MAX + 1];
    bool alive; /* its heartbeat key exists */
    int ttl_s;  /* seconds left on the heartbeat; -1 when none */
    char host[128], gpu[128], model[256];
    long pid;
    double started_at, last_seen; /* unix seconds; 0 when unknown */
    int64_t jobs_done;
    double tokens_per_s;
    int running, waiting; /* sequences in the engine's batch / admitted and waiting */
    double kv_usage;      /* used / total KV cache blocks, 0..1; -1 when not published */
    int64_t holding;      /* LLEN of its processing list: the jobs it runs (or left behind) */
};

struct rq_running_job {
    char id[RQ_ID_MAX + 1];
    char worker[RQ_NAME_MAX + 1];
    char queue[RQ_QREF_MAX + 1];
    double progress; /* 0..1; -1 when unknown */
    int64_t prompt_tokens, completion_tokens;
    int attempts;
    double started_at, first_token_at, updated_at; /* unix seconds; 0 when unknown */
    int parts_done, parts_total, level; /* a summary job's (queue/progress.h); -1 for any other */
};

struct rq_stats {
    int nqueues;
    struct {
        char name[RQ_QREF_MAX + 1]; /* a queue reference */
        int64_t len;
    } queues[RQ_STATS_MAX_QUEUES];
    int64_t retry;                  /* ZCARD <p>:retry */
    int64_t dead;                   /* LLEN <p>:dead */
    int64_t cancel;                 /* SCARD <p>:cancel */
    int64_t running;                /* jobs in all processing lists */
    struct rq_worker_stat *workers; /* [nworkers], owned; sorted by id */
    int nworkers;
    struct rq_running_job *jobs; /* [njobs], owned; only with want_jobs */
    int njobs;
};

/* Fills s for the queues named in queues[0..nq) (nq <= RQ_STATS_MAX_QUEUES). With want_jobs
 * also lists every job in every processing list with its hash's progress (one more round trip
 * and a read of each job; fine for a status command, not for a hot loop). 0, or -1. s must be
 * given to rq_stats_free either way. */
int rq_stats(struct rq *q, const char *const *queues, int nq, bool want_jobs, struct rq_stats *s);
void rq_stats_free(struct rq_stats *s);
