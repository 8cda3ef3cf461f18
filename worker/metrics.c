/* See metrics.h. */
#include "worker/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void push(struct wk_samples *s, double x)
{
    if (isnan(x))
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return; /* a lost sample under memory pressure is not worth failing for */
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

void wk_metrics_init(struct wk_metrics *m, double now_mono, const struct engine_stats *st)
{
    memset(m, 0, sizeof *m);
    m->t0 = now_mono;
    if (st)
        m->last = *st;
}

void wk_metrics_free(struct wk_metrics *m)
{
    if (!m)
        return;
    free(m->ttft.v);
    free(m->itl.v);
    free(m->e2e.v);
    memset(m, 0, sizeof *m);
}

void wk_metrics_job(struct wk_metrics *m, int failed, double ttft_ms, double itl_ms, double e2e_ms)
{
    m->jobs_done++;
    m->jobs_failed += failed != 0;
    push(&m->ttft, ttft_ms);
    push(&m->itl, itl_ms);
    push(&m->e2e, e2e_ms);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double wk_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    if (p <= 0)
        return v[0];
    if (p >= 100)
        return v[n - 1];
    double pos = p / 100.0 * (double)(n - 1);
    size_t k = (size_t)pos;
    double f = pos - (double)k;
    return k + 1 < n ? v[k] + f * (v[k + 1] - v[k]) : v[k];
}

void wk_metrics_row(struct wk_metrics *m, double now_mono, double now_wall, const struct engine_stats *st,
                    struct db_metrics *row)
{
    *row = db_metrics_empty();
    double dt = now_mono - m->t0;
    row->ts = now_wall;
    row->interval_s = dt > 0 ? dt : 0;
    row->jobs_done = m->jobs_done;
    row->jobs_failed = m->jobs_failed;
    if (dt > 0) {
        row->prompt_tokens_per_s = (double)(st->prompt_tokens - m->last.prompt_tokens) / dt;
        row->generation_tokens_per_s = (double)(st->generated_tokens - m->last.generated_tokens) / dt;
    }
    row->ttft_p50_ms = wk_percentile(m->ttft.v, m->ttft.n, 50);
    row->ttft_p95_ms = wk_percentile(m->ttft.v, m->ttft.n, 95);
    row->itl_p50_ms = wk_percentile(m->itl.v, m->itl.n, 50);
    row->itl_p95_ms = wk_percentile(m->itl.v, m->itl.n, 95);
    row->e2e_p50_ms = wk_percentile(m->e2e.v, m->e2e.n, 50);
    row->e2e_p95_ms = wk_percentile(m->e2e.v, m->e2e.n, 95);
    row->running = st->running;
    row->waiting = st->waiting;
    if (st->kv_blocks_total > 0)
        row->kv_usage = (double)st->kv_blocks_used / (double)st->kv_blocks_total;
    uint64_t q = st->prefix_queries - m->last.prefix_queries;
    if (q > 0)
        row->prefix_cache_hit_rate = (double)(st->prefix_hits - m->last.prefix_hits) / (double)q;
    row->preemptions = (int64_t)(st->preemptions - m->last.preemptions);
    m->t0 = now_mono;
    m->last = *st;
    m->jobs_done = m->jobs_failed = 0;
    m->ttft.n = m->itl.n = m->e2e.n = 0;
}
