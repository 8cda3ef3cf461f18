/* The worker's per-interval metrics: one worker_metrics row (docs/SQLITE.md) every
 * metrics.interval_s, from the jobs that finished in the interval and the engine's counters.
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
#include "worker/db.h"

struct wk_samples {
    double *v;
    size_t n, cap;
};

struct wk_metrics {
    double t0;                        /* monotonic seconds: start of the interval */
    struct engine_stats last;         /* the engine's counters at t0 */
    int64_t jobs_done, jobs_failed;   /* in the interval */
    struct wk_samples ttft, itl, e2e; /* milliseconds */
};

void wk_metrics_init(struct wk_metrics *m, double now_mono, const struct engine_stats *st);
void wk_metrics_free(struct wk_metrics *m);

/* A finished job (any status); NAN for a time it does not have (no first token, one token). */
void wk_metrics_job(struct wk_metrics *m, int failed, double ttft_ms, double itl_ms, double e2e_ms);

/* The row for the interval [t0, now_mono) (worker_id left NULL for the caller), then starts the
 * next interval at now_mono. Rates are per second of the interval; NAN when it has no length. */
void wk_metrics_row(struct wk_metrics *m, double now_mono, double now_wall, const struct engine_stats *st,
                    struct db_metrics *row);

/* The p-th percentile (0..100) of v[0..n), sorting v in place; NAN when n == 0. */
double wk_percentile(double *v, size_t n, double p);
