/* See metrics.h. */
#include "worker/metrics/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "worker/loop/lanes.h"

static void push(struct wk_samples *s, double x)
{
    if (isnan(x))
        return;
    if (array_reserve(&s->v, &s->cap, s->n + 1, sizeof *s->v, 256))
        return; /* a lost sample under memory pressure is not worth failing for */
    s->v[s->n++] = x;
}

void wk_metrics_init(struct wk_metrics *m, double now_mono, const struct engine_stats *st)
{
    memset(m, 0, sizeof *m);
    m->t0 = now_mono;
    if (st)
        m->last = *st;
    hist_init(&m->tot.ttft, HIST_TTFT_BOUNDS, HIST_TTFT_N);
    hist_init(&m->tot.itl, HIST_ITL_BOUNDS, HIST_ITL_N);
    hist_init(&m->tot.e2e, HIST_LATENCY_BOUNDS, HIST_LATENCY_N);
    hist_init(&m->tot.queue, HIST_QUEUE_BOUNDS, HIST_QUEUE_N);
    for (int i = 0; i < WK_METRICS_QUEUES; i++)
        m->tot.queue_depth[i] = -1;
    m->tot.retry_depth = m->tot.dead_depth = -1;
}

void wk_metrics_free(struct wk_metrics *m)
{
    if (!m)
        return;
    free(m->ttft.v);
    free(m->itl.v);
    free(m->e2e.v);
    free(m->queue.v);
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
    row->preemptions = (int64_t)(st->preemptions - m->last.preemptions);
    row->jobs_cancelled = m->jobs_cancelled;
    row->jobs_dead = m->jobs_dead;
    row->jobs_retried = m->jobs_retried;
    row->prompt_tokens = (int64_t)(st->prompt_tokens - m->last.prompt_tokens);
    row->generation_tokens = (int64_t)(st->generated_tokens - m->last.generated_tokens);
    row->prefix_cache_queries = (int64_t)(st->prefix_query_tokens - m->last.prefix_query_tokens);
    row->prefix_cache_hits = (int64_t)(st->prefix_hit_tokens - m->last.prefix_hit_tokens);
    if (row->prefix_cache_queries > 0) /* in tokens, as the counters beside it and vLLM's */
        row->prefix_cache_hit_rate = (double)row->prefix_cache_hits / (double)row->prefix_cache_queries;
    row->queue_p50_ms = wk_percentile(m->queue.v, m->queue.n, 50);
    row->queue_p95_ms = wk_percentile(m->queue.v, m->queue.n, 95);
    row->queue_short = m->tot.queue_depth[WK_LANE_SHORT];
    row->queue_long = m->tot.queue_depth[WK_LANE_LONG];
    row->retry_depth = m->tot.retry_depth;
    row->dead_depth = m->tot.dead_depth;
    m->t0 = now_mono;
    m->last = *st;
    m->jobs_done = m->jobs_failed = 0;
    m->jobs_cancelled = m->jobs_dead = m->jobs_retried = 0;
    m->ttft.n = m->itl.n = m->e2e.n = m->queue.n = 0;
}

/* ---- totals */

void wk_metrics_finish(struct wk_metrics *m, const struct wk_finished *f)
{
    if (f->retried) {
        m->jobs_retried++;
        m->tot.retried++;
        return;
    }
    double itl_ms = NAN;
    if (f->completion_tokens > 1 && !isnan(f->ttft_ms) && !isnan(f->e2e_ms))
        itl_ms = (f->e2e_ms - f->ttft_ms) / (f->completion_tokens - 1);
    wk_metrics_job(m, f->status == DB_FAILED, f->ttft_ms, itl_ms, f->e2e_ms);
    push(&m->queue, f->queue_ms);
    struct wk_totals *t = &m->tot;
    switch (f->status) {
    case DB_COMPLETED:
        t->completed++;
        if (f->finish_reason && !strcmp(f->finish_reason, "stop"))
            t->stop++;
        else if (f->finish_reason && !strcmp(f->finish_reason, "length"))
            t->length++;
        break;
    case DB_FAILED:
        t->failed++;
        break;
    case DB_CANCELLED:
        t->cancelled++;
        m->jobs_cancelled++;
        break;
    }
    hist_observe(&t->ttft, f->ttft_ms / 1e3);
    if (!isnan(itl_ms))
        hist_observe_n(&t->itl, itl_ms / 1e3, (uint64_t)(f->completion_tokens - 1));
    hist_observe(&t->e2e, f->e2e_ms / 1e3);
    hist_observe(&t->queue, f->queue_ms / 1e3);
}

void wk_metrics_dead(struct wk_metrics *m)
{
    m->jobs_dead++;
    m->tot.dead++;
}

void wk_metrics_routed(struct wk_metrics *m, int64_t n)
{
    m->tot.routed += n;
}

void wk_metrics_wait_shortfalls(struct wk_metrics *m, int64_t n)
{
    m->tot.wait_shortfalls = n;
}

void wk_metrics_redis(struct wk_metrics *m, int ok, const int64_t *depth, int64_t retry, int64_t dead)
{
    for (int i = 0; i < WK_METRICS_QUEUES; i++)
        m->tot.queue_depth[i] = ok ? depth[i] : -1;
    m->tot.retry_depth = ok ? retry : -1;
    m->tot.dead_depth = ok ? dead : -1;
}

void wk_metrics_snapshot(const struct wk_metrics *m, const struct engine_stats *st, struct wk_snapshot *s)
{
    s->st = *st;
    s->tot = m->tot;
}

int wk_metrics_health(const struct wk_snapshot *s, char *why, size_t n)
{
    if (!s->ready)
        snprintf(why, n, "starting: the engine is not ready");
    else if (s->stopping)
        snprintf(why, n, "stopping");
    else if (!s->redis_ok)
        snprintf(why, n, "redis: %s", s->redis_err[0] ? s->redis_err : "not connected");
    else if (!s->sqlite_ok)
        snprintf(why, n, "sqlite: %s", s->sqlite_err[0] ? s->sqlite_err : "the last write failed");
    else {
        snprintf(why, n, "ok");
        return 1;
    }
    return 0;
}

/* ---- Prometheus text (docs/METRICS.md lists these for users) */

static void family(struct prom *p, const char *name, enum prom_type type, const char *help)
{
    prom_family(p, name, type, help);
}

static void one(struct prom *p, const char *name, enum prom_type type, const char *help, double v)
{
    prom_family(p, name, type, help);
    prom_sample(p, NULL, 0, v);
}

static void labelled(struct prom *p, const char *label, const char *value, double v)
{
    struct prom_label l = {label, value};
    prom_sample(p, &l, 1, v);
}

int wk_metrics_format(const struct wk_snapshot *s, struct prom *p)
{
    const struct wk_totals *t = &s->tot;
    const struct engine_stats *st = &s->st;
    char why[256];

    family(p, "llmq_worker_info", PROM_GAUGE, "Always 1; the labels describe the worker.");
    struct prom_label info[] = {
        {"worker", s->worker_id}, {"version", s->version}, {"model", s->model}, {"backend", s->backend}};
    prom_sample(p, info, 4, 1);
    one(p, "llmq_worker_start_time_seconds", PROM_GAUGE, "When the worker started, in Unix seconds.",
        s->started_at);
    one(p, "llmq_worker_healthy", PROM_GAUGE,
        "1 when GET /health answers 200: engine ready, not stopping, Redis and SQLite answering.",
        wk_metrics_health(s, why, sizeof why));

    family(p, "llmq_queue_depth", PROM_GAUGE,
           "Jobs waiting in a Redis queue, read every metrics interval (the same for every worker).");
    for (int i = 0; i < WK_METRICS_QUEUES; i++)
        if (t->queue_depth[i] >= 0)
            labelled(p, "queue", wk_lane_queue(i), (double)t->queue_depth[i]);
    if (t->retry_depth >= 0)
        one(p, "llmq_retry_depth", PROM_GAUGE, "Jobs in the retry set waiting for their next attempt.",
            (double)t->retry_depth);
    if (t->dead_depth >= 0)
        one(p, "llmq_dead_depth", PROM_GAUGE, "Jobs in the dead-letter list.", (double)t->dead_depth);

    family(p, "llmq_num_requests_running", PROM_GAUGE, "Sequences in the engine's running batch, per lane.");
    for (int i = 0; i < WK_NLANES; i++)
        labelled(p, "lane", wk_lane_queue(i), st->lane_running[i]);
    family(p, "llmq_num_requests_waiting", PROM_GAUGE,
           "Sequences admitted to the engine and waiting for a slot, per lane.");
    for (int i = 0; i < WK_NLANES; i++)
        labelled(p, "lane", wk_lane_queue(i), st->lane_waiting[i]);
    if (st->kv_blocks_total > 0)
        one(p, "llmq_kv_cache_usage_perc", PROM_GAUGE, "Fraction of KV cache blocks in use, 0 to 1.",
            (double)st->kv_blocks_used / (double)st->kv_blocks_total);
    one(p, "llmq_prefix_cache_queries_total", PROM_COUNTER,
        "Prompt tokens looked up in the prefix cache (each job once, at its first admission).",
        (double)st->prefix_query_tokens);
    one(p, "llmq_prefix_cache_hits_total", PROM_COUNTER, "Of those, tokens found in the prefix cache.",
        (double)st->prefix_hit_tokens);
    one(p, "llmq_num_preemptions_total", PROM_COUNTER, "Sequences preempted to free KV cache blocks.",
        (double)st->preemptions);
    one(p, "llmq_grammar_masks_total", PROM_COUNTER,
        "Token masks made for sequences under a structured-output grammar.", (double)st->grammar_masks);
    one(p, "llmq_grammar_mask_seconds_total", PROM_COUNTER,
        "Seconds the engine spent making them (overlapped with the GPU's forward pass).", st->grammar_mask_s);
    one(p, "llmq_prompt_tokens_total", PROM_COUNTER, "Prompt tokens of the jobs added to the engine.",
        (double)st->prompt_tokens);
    one(p, "llmq_generation_tokens_total", PROM_COUNTER, "Tokens generated.", (double)st->generated_tokens);
    if (s->gpu_mem_bytes >= 0)
        one(p, "llmq_gpu_memory_used_bytes", PROM_GAUGE, "GPU memory in use by the engine.",
            (double)s->gpu_mem_bytes);

    family(p, "llmq_jobs_total", PROM_COUNTER,
           "Jobs this worker finished, by final status (the status of their SQLite row).");
    labelled(p, "status", "completed", (double)t->completed);
    labelled(p, "status", "failed", (double)t->failed);
    labelled(p, "status", "cancelled", (double)t->cancelled);
    family(p, "llmq_request_success_total", PROM_COUNTER, "Completed jobs by finish reason.");
    labelled(p, "finished_reason", "stop", (double)t->stop);
    labelled(p, "finished_reason", "length", (double)t->length);
    one(p, "llmq_jobs_dead_lettered_total", PROM_COUNTER,
        "Failed jobs this worker put on the dead-letter list.", (double)t->dead);
    one(p, "llmq_jobs_retried_total", PROM_COUNTER,
        "Failed attempts this worker put back in the retry set for another attempt.", (double)t->retried);
    one(p, "llmq_jobs_routed_total", PROM_COUNTER,
        "Jobs this worker moved from the short to the long queue (prompt over the threshold).",
        (double)t->routed);
    one(p, "llmq_redis_wait_shortfalls_total", PROM_COUNTER,
        "WAITs after an enqueue, fetch or ack that fewer replicas than redis.wait_replicas confirmed.",
        (double)t->wait_shortfalls);

    family(p, "llmq_time_to_first_token_seconds", PROM_HISTOGRAM,
           "Time to first token: fetched from Redis to the first generated token.");
    prom_histogram(p, NULL, 0, &t->ttft);
    family(p, "llmq_inter_token_latency_seconds", PROM_HISTOGRAM,
           "Time between generated tokens (each job's mean, counted once per interval).");
    prom_histogram(p, NULL, 0, &t->itl);
    family(p, "llmq_e2e_request_latency_seconds", PROM_HISTOGRAM,
           "End-to-end latency: fetched from Redis to finished.");
    prom_histogram(p, NULL, 0, &t->e2e);
    family(p, "llmq_request_queue_time_seconds", PROM_HISTOGRAM,
           "Time waiting in Redis: enqueued to fetched by a worker.");
    prom_histogram(p, NULL, 0, &t->queue);
    return p->err;
}
