/* The worker's metrics: one worker_metrics row (docs/SQLITE.md) every metrics.interval_s, from the
 * jobs that finished in the interval and the engine's counters; and the totals since the start
 * (counters, histograms, the Redis queue depths of the last interval) that GET /metrics serves
 * (worker/metrics/http.h) from a snapshot. docs/METRICS.md lists every metric for users.
 *
 *     struct wk_metrics m;
 *     wk_metrics_init(&m, now_mono, &engine_stats);
 *     ... wk_metrics_job(&m, failed, ttft_ms, itl_ms, e2e_ms) for every finished job ...
 *     if (now_mono - m.t0 >= interval) wk_metrics_row(&m, now_mono, now_wall, &engine_stats, &row);
 *     wk_metrics_free(&m);
 *
 * Percentiles interpolate linearly between the closest ranks (numpy's default): p of n sorted
 * samples is x[k] + f * (x[k+1] - x[k]) with k + f = p / 100 * (n - 1). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "queue/keys.h"
#include "worker/metrics/histogram.h"
#include "worker/metrics/prom.h"
#include "worker/store/db.h"

/* Queues whose depth is reported, in this order (the lanes' queues: "short", "long"). */
#define WK_METRICS_QUEUES 2

struct wk_samples {
    double *v;
    size_t n, cap;
};

/* Since the worker started: what /metrics serves besides the engine's own counters. A plain
 * struct (copied into snapshots). */
struct wk_totals {
    int64_t completed, failed, cancelled; /* jobs finished for good, by status */
    int64_t stop, length;                 /* completed jobs by finish_reason */
    int64_t dead, retried, routed;        /* dead-lettered, failed and retried, moved to the long queue */
    int64_t wait_shortfalls; /* WAITs with fewer replicas than redis.wait_replicas (queue/replicas.h) */
    struct hist ttft, itl, e2e, queue;    /* seconds */
    /* Redis, read every interval (wk_metrics_redis); -1 = unknown (never read, or the last read
     * failed) */
    int64_t queue_depth[WK_METRICS_QUEUES];
    int64_t retry_depth, dead_depth;
};

struct wk_metrics {
    double t0;                                       /* monotonic seconds: start of the interval */
    struct engine_stats last;                        /* the engine's counters at t0 */
    int64_t jobs_done, jobs_failed;                  /* in the interval */
    struct wk_samples ttft, itl, e2e;                /* milliseconds */
    int64_t jobs_cancelled, jobs_dead, jobs_retried; /* in the interval */
    struct wk_samples queue;                         /* milliseconds */
    struct wk_totals tot;
};

void wk_metrics_init(struct wk_metrics *m, double now_mono, const struct engine_stats *st);
void wk_metrics_free(struct wk_metrics *m);

/* A finished job (any status); NAN for a time it does not have (no first token, one token).
 * Interval figures only; the worker uses wk_metrics_finish. */
void wk_metrics_job(struct wk_metrics *m, int failed, double ttft_ms, double itl_ms, double e2e_ms);

/* What the metrics take from a finished job. */
struct wk_finished {
    int status;                /* enum db_status */
    const char *finish_reason; /* "stop", "length", ... or NULL */
    int completion_tokens;
    double ttft_ms, e2e_ms, queue_ms; /* NAN = unknown */
    int retried;                      /* failed, and goes back to Redis for another attempt */
};
/* A job that finished an attempt: interval figures and totals. A retried attempt counts only as
 * a retry (its job finishes later, here or elsewhere). Inter-token latency is the job's mean,
 * (e2e - ttft) / (completion_tokens - 1), observed once per interval between tokens. */
void wk_metrics_finish(struct wk_metrics *m, const struct wk_finished *f);
/* A job dead-lettered / moved to the long queue by this worker. */
void wk_metrics_dead(struct wk_metrics *m);
void wk_metrics_routed(struct wk_metrics *m, int64_t n);
/* The queue handle's count of WAITs that fell short (rq->wait_shortfalls), as it is now. */
void wk_metrics_wait_shortfalls(struct wk_metrics *m, int64_t n);
/* The Redis figures of the interval: depth[i] of queue wk_lane_queue(i), the retry set and the
 * dead list, or ok = 0 when they could not be read (all unknown). */
void wk_metrics_redis(struct wk_metrics *m, int ok, const int64_t *depth, int64_t retry, int64_t dead);

/* The row for the interval [t0, now_mono) (worker_id left NULL for the caller), then starts the
 * next interval at now_mono. Rates are per second of the interval; NAN when it has no length. */
void wk_metrics_row(struct wk_metrics *m, double now_mono, double now_wall, const struct engine_stats *st,
                    struct db_metrics *row);

/* What GET /metrics and GET /health serve: published by the worker loop (wk_metrics_snapshot plus
 * the identity and health fields), read by the HTTP thread. A plain struct. */
struct wk_snapshot {
    char worker_id[RQ_NAME_MAX + 1], model[256], backend[16], version[32];
    double started_at; /* unix seconds */
    /* /health: ready once the engine is loaded and the loop runs; "ok" when ready, not stopping,
     * and both Redis and SQLite answered their last call */
    int ready, stopping, redis_ok, sqlite_ok;
    char redis_err[200], sqlite_err[200];
    struct engine_stats st;
    int64_t gpu_mem_bytes; /* -1 = not reported by the backend */
    struct wk_totals tot;
};
/* Fills the metric fields of s (st, tot) from m and st; the caller fills the rest. */
void wk_metrics_snapshot(const struct wk_metrics *m, const struct engine_stats *st, struct wk_snapshot *s);

/* The Prometheus text of a snapshot into p (docs/METRICS.md); 0, or -1 with p->errmsg. */
int wk_metrics_format(const struct wk_snapshot *s, struct prom *p);

/* 1 when healthy; else 0 with the reason ("redis: connection refused", ...) in why. */
int wk_metrics_health(const struct wk_snapshot *s, char *why, size_t n);

/* The p-th percentile (0..100) of v[0..n), sorting v in place; NAN when n == 0. */
double wk_percentile(double *v, size_t n, double p);
