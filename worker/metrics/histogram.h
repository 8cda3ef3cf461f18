/* A Prometheus-style histogram: fixed upper bounds, a count per bucket, the sum and the count of
 * every observation. A plain struct without pointers, so a snapshot of it is a struct copy (the
 * worker publishes copies to the metrics HTTP thread, worker/metrics/http.h).
 *
 *     struct hist h;
 *     hist_init(&h, HIST_LATENCY_BOUNDS, HIST_LATENCY_N);   // 0, or -1 for bad bounds
 *     hist_observe(&h, 0.42);
 *     for (int i = 0; i <= h.n; i++) le = hist_bound(&h, i), count = hist_cumulative(&h, i);
 *
 * Buckets follow Prometheus: bucket i counts observations <= bound i (cumulatively, when read
 * with hist_cumulative); bucket n is +Inf and always equals the count. NAN observations are
 * ignored; -Inf and +Inf fall into the first and the +Inf bucket and make the sum infinite, as
 * in the Prometheus clients. */
#pragma once
#include <stdint.h>

#define HIST_MAX_BOUNDS 32

struct hist {
    int n;                                /* finite upper bounds */
    double bound[HIST_MAX_BOUNDS];        /* strictly increasing, finite */
    uint64_t bucket[HIST_MAX_BOUNDS + 1]; /* observations in (bound[i-1], bound[i]]; [n] = above the last */
    double sum;
    uint64_t count;
};

/* Empties h and sets its bounds (copied). -1 when n is not in 1..HIST_MAX_BOUNDS or the bounds
 * are not finite and strictly increasing (h is then empty with n = 0). */
int hist_init(struct hist *h, const double *bounds, int n);

/* One observation. */
void hist_observe(struct hist *h, double x);
/* `times` observations of the same value x (sum += times * x): a batch of equal intervals, such
 * as the mean inter-token latency of a job counted once per interval. */
void hist_observe_n(struct hist *h, double x, uint64_t times);

/* Observations <= bound i (i in 0..n; i == n is +Inf: the count). */
uint64_t hist_cumulative(const struct hist *h, int i);
/* Upper bound i; INFINITY for i == n. */
double hist_bound(const struct hist *h, int i);

/* Bucket bounds in seconds, as vLLM's (vllm/v1/metrics/loggers.py). */
extern const double HIST_TTFT_BOUNDS[]; /* time to first token: 1 ms .. 2560 s */
extern const int HIST_TTFT_N;
extern const double HIST_ITL_BOUNDS[]; /* inter-token latency: 10 ms .. 80 s */
extern const int HIST_ITL_N;
extern const double HIST_LATENCY_BOUNDS[]; /* end to end: 0.3 s .. 7680 s */
extern const int HIST_LATENCY_N;
/* Queue time: vLLM's request latency buckets, then 4 h, 8 h, 24 h (jobs of a nightly batch wait
 * for hours in Redis; vLLM's last bucket is 7680 s). */
extern const double HIST_QUEUE_BOUNDS[];
extern const int HIST_QUEUE_N;
