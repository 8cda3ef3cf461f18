/* See worker.h; docs/WORKER.md for users. */
#include "worker/loop/worker.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/chat_template.h"
#include "engine/cuda_backend.h"
#include "engine/engine.h"
#include "engine/gpu.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/util/array.h"
#include "engine/util/errfmt.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "llmq_version.h"
#include "queue/ack.h"
#include "queue/attempt.h"
#include "queue/badkey.h"
#include "queue/cancel.h"
#include "queue/dead.h"
#include "queue/drain.h"
#include "queue/fetch.h"
#include "queue/owned.h"
#include "queue/progress.h"
#include "queue/reaper.h"
#include "queue/redis_url.h"
#include "queue/replicas.h"
#include "queue/requeue.h"
#include "queue/results.h"
#include "queue/retry.h"
#include "queue/rq.h"
#include "queue/stats.h"
#include "queue/tick.h"
#include "worker/backends/backend_open.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/config/redis_cfg.h"
#include "worker/jobs/grammar_cache.h"
#include "worker/jobs/job.h"
#include "worker/jobs/summarize.h"
#include "worker/jobs/tpl_source.h"
#include "worker/loop/committed.h"
#include "worker/loop/held.h"
#include "worker/loop/lanes.h"
#include "worker/loop/models.h"
#include "worker/loop/part_rows.h"
#include "worker/loop/redis_gate.h"
#include "worker/loop/signals.h"
#include "worker/loop/stream.h"
#include "worker/metrics/http.h"
#include "worker/metrics/metrics.h"
#include "worker/store/db.h"
#include "worker/store/row_json.h"
#include "worker/store/writer.h"

#define MAX_BATCH 4096         /* rows in one transaction */
#define MAX_METRICS 64         /* metrics rows kept while SQLite is unavailable */
#define MAX_BATCH_ROWS 64      /* completed batches whose `batches` row waits for SQLite */
#define FLUSH_S 10.0           /* after the run: time to hand jobs back and write the last rows */
#define EMPTY_FETCH_S 0.02     /* after an empty fetch while busy, no new fetch for this long ... */
#define EMPTY_FETCH_MAX_S 0.16 /* ... doubling up to this while the queues stay empty */
#define IDLE_SLEEP_MS 5        /* an iteration with nothing to do while waiting on Redis or SQLite */
#define TROUBLE_LOG_S 10.0     /* a failing Redis or SQLite step is logged at most this often */
#define PROGRESS_FLUSH_S 0.05  /* progress updates go to Redis at most this often (one pipeline) */
#define CANCEL_CHECK_S 0.02    /* cancellations are checked at most this often (every step when longer) */
#define WK_ISOLATE_STALLS 2    /* a job that ran in this many deliveries that lost their worker runs isolated */
#define EXIT_REDIS_WAIT_S 2.0  /* at exit, with Redis unreachable: how long to wait for it to answer */
#define MAX_OVERHEAD_SAMPLES (1 << 20)
#define PUBLISH_S 0.1 /* the metrics snapshot for GET /metrics is refreshed at most this often */

/* Loop phases, timed for the per-step overhead (docs/PERFORMANCE.md "Queue path"). */
enum { PH_TICK, PH_REDIS, PH_FETCH, PH_CANCEL, PH_STEP, PH_PROGRESS, PH_FINISH, PH_COMMIT, PH_N };
static const char *const ph_names[PH_N] = {"tick",   "redis",    "fetch",  "cancel",
                                           "engine", "progress", "finish", "commit"};

struct timing {
    double sum[PH_N];      /* seconds, over the iterations that ran an engine step */
    uint64_t steps;        /* iterations that ran an engine step (without blocking on Redis) */
    struct wk_samples ovh; /* worker overhead per such step, microseconds */
    double full_sum;       /* overhead at full batch (running == engine.max_num_seqs) */
    uint64_t full_n;
};

/* Fetching: what one rq_fetch brings and when the next may run. */
struct wk_fetch {
    struct rq_job *jobs;           /* [cap]: one fetch's jobs, before each becomes a held wk_job */
    char (*hash_keys)[RQ_KEY_MAX]; /* [cap]: their hashes' keys, for the created_at lookup */
    size_t cap;
    struct rq_pipe pipe; /* the created_at lookups of one fetch, one round trip */
    double last_empty;   /* monotonic time of the last fetch that brought nothing; 0 after one that did */
    double empty_wait;   /* seconds before the next fetch after an empty one (while busy) */
    uint64_t seq;        /* jobs fetched so far (each one's progress phase) */
    bool recovered;      /* what an earlier run under this id left is taken back (rq_recover) */
    bool paused;         /* too many finished jobs wait for SQLite or Redis: not fetching */
};

/* The Redis side besides fetching: how often progress and cancellations go out, and trouble. */
struct wk_redis {
    double last_progress; /* monotonic time progress updates last went out */
    double last_cancel;   /* ... and cancellations were last checked */
    double trouble_since; /* when a Redis step started failing; 0 while they succeed */
    double next_log;      /* a failing step is logged again from this time */
    struct wk_gate gate;  /* Redis steps skipped while it does not answer; the heartbeat's lease */
    bool unleased;        /* rows are held back: the lease ran out (logged once) */
    double short_since;   /* acks wait for replicas (redis.wait_replicas) since; 0 = they do not */
    double short_next_log;
};

/* One iteration's arrays, each with room for cap entries, grown as needed (grow_scratch). */
struct wk_scratch {
    struct wk_job **jobs;         /* the jobs of one state a step works on (jobs_of) */
    struct rq_result *results;    /* rq_ack: their results */
    const char **ids;             /* rq_cancel_check: their ids */
    bool *flags;                  /* rq_cancel_check's answers; which created_at were asked */
    struct rq_progress *progress; /* rq_progress: the updates of one flush */
    const struct rq_job **rjobs;  /* rq_requeue: their Redis records */
    size_t cap;
};

/* The SQLite side: the batch the writer thread runs (worker/store/writer.h) and what waits for the
 * next one. */
struct wk_store {
    struct wk_writer *writer;
    struct wk_committed *committed; /* read-only: the reaper's lookup of committed rows */
    struct wk_part_rows parts;      /* rows of summary jobs' finished parts (part_rows.h) */
    struct wk_batch batch;                  /* the batch in flight */
    struct db_result *rows;                 /* [MAX_BATCH]: its job rows */
    int *row_rc;                            /* [MAX_BATCH]: each row's outcome */
    struct wk_job **row_jobs;               /* [MAX_BATCH]: each row's job (state COMMITTING) */
    size_t n_rows;                          /* rows in the batch in flight */
    double oldest_pending;                  /* monotonic time the oldest PENDING job became pending */
    double next_commit;                     /* no batch before this: the backoff after a failed write */
    int backoff_ms;                         /* that backoff; 0 while writes succeed */
    double trouble_since;                   /* when writes started failing; 0 while they succeed */
    double next_log;                        /* a failing write is logged again from this time */
    char err[600];                          /* why the last write failed (for GET /health) */
    struct db_worker worker_row;            /* this worker's workers row */
    bool worker_row_done;                   /* ... is written */
    bool worker_row_sent;                   /* ... is in the batch in flight */
    struct db_metrics metrics[MAX_METRICS]; /* metrics rows waiting to be written, oldest first */
    int n_metrics;
    int n_metrics_sent; /* the first n_metrics_sent of them are in the batch in flight */
    struct db_batch
        batch_rows[MAX_BATCH_ROWS]; /* batches this worker completed, for their rows (strings owned) */
    int n_batch_rows;
    int n_batch_rows_sent; /* the first n_batch_rows_sent of them are in the batch in flight */
    bool want_touch;    /* the workers row's jobs_done and last_seen are due */
    bool touch_sent;    /* ... and in the batch in flight */
    bool stopped_touch; /* the row is marked stopped */

    /* when the database became unwritable (DB_UNWRITABLE); 0 while it is not */
    double unwritable_since;
    /* the database file was deleted or replaced and created anew: why (for GET /health) */
    char replaced[600];
};

/* What the worker counts and reports: metrics rows, GET /metrics, the log lines. */
struct wk_stats {
    struct wk_metrics metrics;   /* the current interval's figures (worker/metrics/metrics.h) */
    struct wk_http *http;        /* GET /metrics and /health; NULL when metrics.enabled is false */
    struct wk_snapshot snapshot; /* what it serves: identity set at setup, the rest at each publish */
    double next_publish;         /* the snapshot is refreshed from this monotonic time */
    double next_row;             /* the next metrics row is due at this monotonic time */
    double last_tokens_per_s;    /* generation rate of the last metrics row (the heartbeat's) */
    int64_t done, completed, failed, cancelled; /* jobs whose rows are committed, by status */
    int64_t dead, retried, routed, requeued;    /* dead-lettered, retried, moved long, handed back */
    int64_t reaped_dead; /* of dead: by this worker's reaper or its start-up recovery (no row) */
    int64_t routed_model;                       /* moved to the queue of the model they name */
    int64_t interval_done, interval_failed, interval_cancelled; /* since the last info line */
    struct timing run_timing, interval_timing; /* whole run, and the current metrics interval (--stats) */
};

/* --drain: the other workers whose lists it has waited for (each is logged once). */
struct wk_drain {
    char (*told)[RQ_NAME_MAX + 1];
    size_t ntold, cap;
};

struct wk {
    const struct cfg *cfg;
    struct wk_opts opts;
    /* what runs the jobs */
    struct model *model;
    struct tok *tok;
    struct chat_template *chat; /* the model's chat template, parsed once */
    struct engine *eng;
    struct grammar_cache *grammars; /* jobs' structured-output grammars, compiled once each */
    struct wk_lanes lanes; /* which queue feeds which engine lane, and their room */
    struct wk_models models; /* the model names it serves and their queues (models.h) */
    struct tpl_source *tpl;  /* templates: the config's, else the published ones (tpl_source.h) */
    bool tpl_published;      /* the config's templates are published (before the first fetch) */
    int exit_code;
    struct job_opts jopts; /* how a job is parsed: defaults, size limit, templates */
    struct wk_ctx ctx;     /* what finishing a job needs (held.h) */
    int64_t gpu_mem_bytes; /* device memory the backend allocated, -1 = not a GPU backend */
    char model_name[256], gpu[256], host[256], worker_id[RQ_NAME_MAX + 1];
    struct rq *rq; /* the Redis connection and this worker's keys */

    struct list held[WK_NSTATES]; /* the jobs it holds, one list per state (held.h) */
    struct wk_fetch fetch;
    struct wk_redis redis;
    struct wk_scratch scratch;
    struct wk_store store;
    struct wk_stats stats;
    struct wk_drain drain;
    struct wk_stream stream; /* text streaming of the jobs that ask for it */

    struct rq_job **counting; /* redis_count: the jobs whose delivery it counts */
    size_t counting_cap;
    int count_due;            /* jobs with count_due set */

    bool stopping;        /* a signal came: no more fetching */
    bool id_lost;         /* another instance took this worker id over: no more Redis writes */
    bool start_stopped;   /* a stop signal came during set-up: a clean exit */
    bool start_unreachable; /* --drain gave up on reaching Redis at the start */
    double stop_deadline; /* running jobs are handed back from this monotonic time */
};

/* ---- small helpers */

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int held_count(const struct wk *w)
{
    int n = 0;
    for (int s = 0; s < WK_NSTATES; s++)
        n += w->held[s].n;
    return n;
}

static void move(struct wk *w, struct wk_job *j, int state)
{
    if (j->state >= 0)
        list_remove(&w->held[j->state], &j->link);
    j->state = state;
    if (state == WK_PENDING && w->held[WK_PENDING].n == 0)
        w->store.oldest_pending = llmq_mono_s();
    if (state >= 0)
        list_push_back(&w->held[state], &j->link);
}

/* Stops what job j runs in the engine (its seq, or its parts'): each is cancelled and forgets the
 * job, so its end is released without a row. */
static void stop_seqs(struct wk *w, struct wk_job *j)
{
    if (j->seq) {
        engine_cancel(w->eng, j->seq);
        j->seq->user = NULL;
        j->seq = NULL;
    }
    sum_stop_parts(j->sum, w->eng);
    j->parts_running = 0;
}

static void drop(struct wk *w, struct wk_job *j)
{
    if (j->count_due)
        w->count_due--;
    stop_seqs(w, j);
    if (j->sum)
        wk_part_rows_forget(&w->store.parts, j);
    move(w, j, -1);
    wk_job_free(j);
}

static int grow_scratch(struct wk *w, int n)
{
    if ((size_t)n <= w->scratch.cap)
        return 0;
    size_t cap = array_grown_cap(w->scratch.cap, (size_t)n, 256); /* one capacity for all six */
    if (array_resize(&w->scratch.results, cap, sizeof *w->scratch.results) ||
        array_resize(&w->scratch.jobs, cap, sizeof *w->scratch.jobs) ||
        array_resize(&w->scratch.ids, cap, sizeof *w->scratch.ids) ||
        array_resize(&w->scratch.flags, cap, sizeof *w->scratch.flags) ||
        array_resize(&w->scratch.progress, cap, sizeof *w->scratch.progress) ||
        array_resize(&w->scratch.rjobs, cap, sizeof *w->scratch.rjobs))
        return -1;
    w->scratch.cap = cap;
    return 0;
}

/* A Redis step failed: log it (at most every TROUBLE_LOG_S while it keeps failing). A key of the
 * wrong type (queue/badkey.h) is no trouble of Redis: it is logged once, by name, and the step
 * is tried again with the next round while everything else goes on. When the connection is gone
 * (lost, timed out, not reconnected yet) the gate closes: no Redis step runs until the probe has
 * an answer (redis_up). */
static void redis_trouble(struct wk *w, const char *what)
{
    const char *bad = rq_badkey_error(w->rq);
    if (bad) {
        if (rq_badkey_first(w->rq, bad))
            log_warn("redis: %s failed: %s; nothing was written and the jobs concerned stay where they were (%d "
                     "held): the worker goes on with the others and tries again (delete or rename the key)",
                     what, bad + strlen("BADKEY "), held_count(w));
        return;
    }
    double now = llmq_mono_s();
    if (w->redis.trouble_since == 0)
        w->redis.trouble_since = now;
    bool down = !w->rq->cmd.ctx;
    if (now >= w->redis.next_log) {
        log_warn("redis: %s failed: %s; the worker keeps running%s and tries again (%d jobs held)", what,
                 rq_error(w->rq), down ? " without Redis (its steps wait in memory)" : "", held_count(w));
        w->redis.next_log = now + TROUBLE_LOG_S;
    }
    if (down)
        wk_gate_close(&w->redis.gate, now);
}

/* Whether the Redis steps may run now (redis_gate.h). While the gate is closed: false at once,
 * with a line at most every TROUBLE_LOG_S; once the probe has had an answer, the commands
 * connection is made again (one connect) and the heartbeat is made due, so it goes first and
 * renews the lease. */
static bool redis_up(struct wk *w)
{
    struct wk_gate *g = &w->redis.gate;
    if (!g->closed)
        return true;
    double now = llmq_mono_s();
    if (!wk_gate_answered(g)) {
        if (now >= w->redis.next_log) {
            char why[400];
            wk_gate_error(g, why, sizeof why);
            log_warn("redis: still unreachable after %.0f s (%s); the engine keeps running and commits rows, "
                     "Redis steps wait (%d jobs held)",
                     now - g->closed_since, why, held_count(w));
            w->redis.next_log = now + TROUBLE_LOG_S;
        }
        return false;
    }
    if (!w->rq->cmd.ctx && rq_conn_connect_now(&w->rq->cmd)) { /* it stopped answering again */
        double since = g->closed_since;
        wk_gate_reopen(g);
        wk_gate_close(g, since);
        return false;
    }
    wk_gate_reopen(g);
    rq_tick_heartbeat_now(w->rq);
    return true;
}

/* Whether the gate is open (no probe check: within an iteration, after redis_up). */
static bool redis_open(const struct wk *w)
{
    return !w->redis.gate.closed;
}

static void redis_ok(struct wk *w)
{
    if (w->redis.trouble_since > 0) {
        log_info("redis: working again after %.1f s", llmq_mono_s() - w->redis.trouble_since);
        w->redis.trouble_since = 0;
        w->redis.next_log = 0;
    }
}

/* The jobs of a state (all, or those with `after`) into w->scratch.jobs; 0 when out of memory. */
static int jobs_of(struct wk *w, int state, int after)
{
    if (grow_scratch(w, w->held[state].n))
        return 0;
    int n = 0;
    for (struct wk_job *j = wk_job_of(w->held[state].head); j; j = wk_job_of(j->link.next))
        if (after < 0 || (int)j->after == after)
            w->scratch.jobs[n++] = j;
    return n;
}

/* ---- finishing jobs */

/* A finished attempt into the metrics; `retried`: it goes back to Redis for another attempt. */
static void count_finish(struct wk *w, const struct wk_job *j, bool retried)
{
    struct wk_finished f = {
        .status = j->status == RQ_STATUS_COMPLETED   ? DB_COMPLETED
                  : j->status == RQ_STATUS_CANCELLED ? DB_CANCELLED
                                                     : DB_FAILED,
        .finish_reason = j->finish_reason,
        .completion_tokens = j->completion_tokens,
        .ttft_ms = j->ttft_ms,
        .e2e_ms = j->latency_ms,
        .queue_ms =
            isnan(j->created_at) || isnan(j->started_at) ? NAN : (j->started_at - j->created_at) * 1e3,
        .retried = retried,
    };
    wk_metrics_finish(&w->stats.metrics, &f);
}

/* A line without an id that the reaper put back (rq_job.held_by): the worker that held it may
 * have committed its failed row in this database before it died. Then it is failed again under
 * that row's id, so the row is written over instead of a second one beside it. */
static void reuse_line_row(struct wk *w, struct wk_job *j)
{
    if (j->rj.id[0] || !j->rj.held_by[0] || !w->store.committed)
        return;
    struct rq_done d = {0};
    if (wk_committed_lookup(w->store.committed, NULL, j->rj.held_by, j->rj.raw, j->rj.len, 1, &d) == 1 &&
        strlen(d.id) < sizeof j->row_id) {
        memcpy(j->row_id, d.id, strlen(d.id) + 1);
        log_info("a line without an id put back from worker %s has its failed row %s here: written over",
                 j->rj.held_by, j->row_id);
    }
    rq_done_clear(&d);
}

/* A job that ran is finished: one the engine failed goes back for another attempt while it has
 * some (counted once redis_retry knows whether it is retried or dead), any other waits for its row. */
static void after_run(struct wk *w, struct wk_job *j)
{
    if (j->status == RQ_STATUS_FAILED && (j->error_rc == JOB_ERR_ENGINE || j->error_rc == JOB_ERR_INTERNAL) &&
        j->rj.id[0] && j->rj.attempts - j->rj.stalls < w->cfg->queues.max_attempts) {
        move(w, j, WK_RETRY);
    } else {
        count_finish(w, j, false);
        move(w, j, WK_PENDING);
    }
}

/* A job that cannot run: failed row first, then the dead list. */
static void fail_job(struct wk *w, struct wk_job *j, int rc, const char *err)
{
    reuse_line_row(w, j);
    wk_job_finish_failed(j, &w->ctx, rc, err, db_now());
    count_finish(w, j, false);
    move(w, j, WK_PENDING);
}

static void admit_summary(struct wk *w, struct wk_job *j, int lane);

/* Parse, validate, tokenize, route and add one fetched job. */
static void admit(struct wk *w, struct wk_job *j)
{
    char err[1024];
    int rc = job_parse(j->rj.raw, j->rj.len, &w->jopts, &j->job, err, sizeof err);
    j->parsed = rc == JOB_OK;
    if (j->job.model && !wk_models_serves(&w->models, j->job.model)) {
        log_debug("job %s names model %s, which this worker does not serve: moving it to that model's queue",
                  wk_job_id(j), j->job.model);
        j->route = WK_TO_MODEL;
        move(w, j, WK_ROUTE);
        return;
    }
    if (rc && tpl_source_failed(w->tpl)) { /* not the job's fault: hand it back, try again later */
        log_warn("job %s: reading its template from Redis failed (%s); handing it back", wk_job_id(j),
                 tpl_source_error(w->tpl));
        j->route = WK_TO_ORIGIN;
        move(w, j, WK_ROUTE);
        return;
    }
    if (rc) {
        fail_job(w, j, rc, err);
        return;
    }
    if (!j->job.id && j->job.form == JOB_FORM_LLMQ && job_assign_id(&j->job)) {
        fail_job(w, j, JOB_ERR_INTERNAL, "out of memory");
        return;
    }
    if (j->rj.cancel_requested) {
        wk_job_finish_cancelled(j, &w->ctx, db_now());
        count_finish(w, j, false);
        move(w, j, WK_PENDING);
        return;
    }
    int lane = wk_lane_of_queue(j->rj.queue);
    if (j->job.summarize) {
        admit_summary(w, j, lane);
        return;
    }
    struct job_input in;
    rc = job_prepare(&j->job, w->tok, w->chat, w->lanes.max_model_len[lane], &in, err, sizeof err);
    enum wk_route route = wk_lanes_route(&w->lanes, lane, rc, in.n_tokens);
    /* a job cut to fit the short lane is cut to the long lane's context instead when that is larger */
    if (route == WK_ROUTE_HERE && in.truncated_tokens > 0 &&
        wk_lanes_route(&w->lanes, lane, JOB_ERR_CONTEXT, 0) == WK_ROUTE_LONG)
        route = WK_ROUTE_LONG;
    switch (route) {
    case WK_ROUTE_LONG:
        log_debug("job %s: %d prompt tokens, over queues.long_threshold_tokens (%d) or the short lane's "
                  "context: moving it to the long queue",
                  wk_job_id(j), in.n_tokens + in.truncated_tokens, w->lanes.long_threshold);
        j->route = WK_TO_LONG;
        move(w, j, WK_ROUTE);
        break;
    case WK_ROUTE_FAIL:
        fail_job(w, j, rc, err);
        break;
    case WK_ROUTE_HERE:
        in.req.lane = lane;
        in.req.user = &j->run;
        in.req.deadline = job_deadline(&j->job, j->fetched_mono); /* the engine's clock is monotonic */
        /* ran in two deliveries that lost their worker: a suspect, run apart from other suspects
         * (docs/QUEUE.md, "Attempts") */
        in.req.isolated = j->rj.stalls >= WK_ISOLATE_STALLS;
        j->lane = lane;
        j->max_tokens = in.req.max_tokens;
        j->prompt_tokens = in.n_tokens;
        j->truncated_tokens = in.truncated_tokens;
        rc = grammar_cache_for_job(w->grammars, &j->job, w->eng, &in.req.grammar, err, sizeof err);
        j->seq = rc ? NULL : engine_add(w->eng, &in.req, err, sizeof err);
        if (rc) {
            fail_job(w, j, rc, err);
        } else if (!j->seq) {
            fail_job(w, j, JOB_ERR_ENGINE, err);
        } else {
            wk_job_admitted(j); /* the engine has the tokens */
            move(w, j, WK_RUNNING);
            wk_stream_admit(&w->stream, j);
        }
        break;
    }
    job_input_free(&in);
}

/* ---- map-reduce summary jobs (worker/jobs/summarize.h): each part is a seq of its own */

/* The job ends (its root finished, a part failed, timed out or was cancelled): its other parts are
 * stopped, the job is finished with the totals over its parts, and it goes the way of any
 * finished job. rc and err: why it failed (finish FINISH_ERROR). */
static void end_summary(struct wk *w, struct wk_job *j, enum finish_reason finish, int rc, const char *err)
{
    stop_seqs(w, j);
    struct sum_totals t;
    sum_get_totals(j->sum, &t);
    wk_job_finish_summary(j, &w->ctx, finish, rc, err, llmq_mono_s(), db_now());
    if (t.parts_restored)
        log_info("job %s: %d of its %d parts were committed by an earlier delivery and not computed again",
                 wk_job_id(j), t.parts_restored, t.parts_done);
    after_run(w, j);
}

/* Adds the parts of job j that wait (a new level's) to the engine. */
static void pump_summary(struct wk *w, struct wk_job *j)
{
    char err[1024];
    struct sum_start st = {
        .eng = w->eng,
        .grammars = w->grammars,
        .owner = j,
        .deadline = job_deadline(&j->job, j->fetched_mono),
        .isolated = j->rj.stalls >= WK_ISOLATE_STALLS,
        .lane = wk_lanes_part,
        .lane_ctx = &w->lanes,
    };
    int rc = sum_start_parts(j->sum, &st, &j->parts_running, err, sizeof err);
    if (rc)
        end_summary(w, j, FINISH_ERROR, rc, err);
}

static int restore_part(void *ctx, const struct db_part *r)
{
    struct sum_job *s = ctx;
    enum finish_reason f = r->finish_reason && !strcmp(r->finish_reason, "length") ? FINISH_LENGTH : FINISH_STOP;
    sum_restore(s, (int)r->level, (int)r->part, (int)r->first, (int)r->last, r->output, r->output_len,
                (int)r->prompt_tokens, (int)r->completion_tokens, f); /* out of memory: computed again */
    return 0;
}

/* A summary job: its plan, the parts an earlier delivery committed, and its first parts in the
 * engine. A short-queue job whose document is over queues.long_threshold_tokens moves to the
 * long queue, as a long prompt does. */
static void admit_summary(struct wk *w, struct wk_job *j, int lane)
{
    char err[1024];
    /* planned for the long lane's context: a part that does not fit the short lane runs there */
    int rc = sum_open(&j->job, w->tok, w->chat, w->lanes.max_model_len[WK_LANE_LONG], &j->sum, err, sizeof err);
    if (rc) {
        fail_job(w, j, rc, err);
        return;
    }
    struct sum_totals t;
    sum_get_totals(j->sum, &t);
    if (lane == WK_LANE_SHORT && t.document_tokens > w->lanes.long_threshold) {
        log_debug("job %s: a document of about %lld tokens, over queues.long_threshold_tokens (%d): moving it "
                  "to the long queue",
                  wk_job_id(j), (long long)t.document_tokens, w->lanes.long_threshold);
        sum_free(j->sum);
        j->sum = NULL;
        j->route = WK_TO_LONG;
        move(w, j, WK_ROUTE);
        return;
    }
    if (w->store.committed)
        wk_committed_parts(w->store.committed, wk_job_id(j), sum_plan_id(j->sum), restore_part, j->sum);
    sum_get_totals(j->sum, &t);
    if (t.parts_restored)
        log_info("job %s: resuming at level %d with %d part%s committed by an earlier delivery", wk_job_id(j),
                 t.level, t.parts_restored, t.parts_restored == 1 ? "" : "s");
    j->lane = lane;
    j->max_tokens = j->job.max_tokens;
    j->progress_due = true;
    wk_job_admitted(j);
    move(w, j, WK_RUNNING);
    pump_summary(w, j);
}

/* A part's seq finished: its summary is kept and its row queued for SQLite; the root's ends the
 * job; a part that failed, timed out or was cancelled ends it too. */
static void part_finished(struct wk *w, struct sum_run *r, struct engine_seq *s, double now_wall)
{
    struct wk_job *j = r->owner;
    struct sum_part *p = r->part;
    p->user = NULL;
    free(r);
    j->parts_running--;
    if (s->finish == FINISH_STOP || s->finish == FINISH_LENGTH) {
        if (sum_done(j->sum, p, s->text, s->text_len, s->n_prompt, s->n_output, s->finish))
            end_summary(w, j, FINISH_ERROR, JOB_ERR_INTERNAL, "out of memory");
        else if (p->root)
            end_summary(w, j, FINISH_STOP, 0, NULL);
        else if (wk_part_rows_add(&w->store.parts, j, p, wk_job_id(j), sum_plan_id(j->sum), w->worker_id,
                                  now_wall))
            end_summary(w, j, FINISH_ERROR, JOB_ERR_INTERNAL, "out of memory");
        else
            j->progress_due = true;
    } else {
        char why[300];
        snprintf(why, sizeof why, "level %d, part %d: %s", p->level, p->index + 1,
                 s->error[0] ? s->error : "the engine failed");
        end_summary(w, j, s->finish, s->finish == FINISH_ERROR ? JOB_ERR_ENGINE : 0, why);
    }
    engine_release(w->eng, s);
}

/* A part's row is committed (wk_part_rows_done): the next level may start. */
static void part_committed(void *ctx, struct wk_job *j, struct sum_part *p)
{
    struct wk *w = ctx;
    if (j->state != WK_RUNNING || !j->sum)
        return; /* ended meanwhile */
    char err[512];
    int rc = sum_committed(j->sum, p, err, sizeof err);
    if (rc) {
        end_summary(w, j, FINISH_ERROR, rc, err);
        return;
    }
    j->progress_due = true;
    pump_summary(w, j);
}

static double reply_num(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_STRING)
        return NAN;
    char *end;
    double v = strtod(r->str, &end);
    return end != r->str ? v : NAN;
}

/* The first job of jobs[0..i) in the same batch as jobs[i], or -1. */
static int same_batch_before(struct wk_job **jobs, int i)
{
    for (int k = 0; k < i; k++)
        if (!strcmp(jobs[k]->rj.batch_id, jobs[i]->rj.batch_id))
            return k;
    return -1;
}

/* created_at of the fetched jobs from their hashes (NAN when unknown), and their batches' hashes
 * for the `batches` rows (once per batch), in one round trip. */
static void fetch_created(struct wk *w, struct wk_job **jobs, int n)
{
    struct rq_pipe *p = &w->fetch.pipe;
    rq_pipe_reset(p);
    int asked = 0;
    for (int i = 0; i < n; i++) {
        w->scratch.flags[i] = jobs[i]->rj.id[0] && rq_key_job(&w->rq->keys, jobs[i]->rj.id,
                                                              w->fetch.hash_keys[i], RQ_KEY_MAX) == 0;
        if (!w->scratch.flags[i])
            continue;
        rq_pipe_cmd(p, "HGET");
        rq_pipe_str(p, w->fetch.hash_keys[i]);
        rq_pipe_str(p, "created_at");
        asked++;
        char bk[RQ_KEY_MAX];
        if (jobs[i]->rj.batch_id[0] && same_batch_before(jobs, i) < 0 &&
            rq_key_batch(&w->rq->keys, jobs[i]->rj.batch_id, bk, sizeof bk) == 0) {
            rq_pipe_cmd(p, "HMGET");
            rq_pipe_fmt(p, "%s", bk); /* a copy: bk is gone before the exec */
            rq_pipe_str(p, "input");
            rq_pipe_str(p, "created_at");
            rq_pipe_str(p, "total");
            rq_pipe_str(p, "state");
        }
    }
    if (!asked || rq_pipe_exec(p, &w->rq->cmd, &w->rq->scripts))
        return;
    int k = 0;
    for (int i = 0; i < n && k < p->nreply; i++) {
        if (!w->scratch.flags[i])
            continue;
        double v = reply_num(p->reply[k++]);
        if (v > 0) /* Redis stamps in milliseconds: never after our own start */
            jobs[i]->created_at = v < jobs[i]->started_at ? v : jobs[i]->started_at;
        if (!jobs[i]->rj.batch_id[0])
            continue;
        int first = same_batch_before(jobs, i);
        if (first >= 0) { /* asked for an earlier job of the same batch */
            if (jobs[first]->batch.id)
                wk_job_set_batch(jobs[i], &jobs[first]->batch);
            continue;
        }
        const redisReply *b = k < p->nreply ? p->reply[k++] : NULL;
        if (!b || b->type != REDIS_REPLY_ARRAY || b->elements != 4 ||
            b->element[3]->type != REDIS_REPLY_STRING)
            continue; /* the batch hash is gone (expired): no batches row from this job */
        struct db_batch row = db_batch_empty();
        row.id = jobs[i]->rj.batch_id;
        row.input = b->element[0]->type == REDIS_REPLY_STRING ? b->element[0]->str : NULL;
        row.created_at = reply_num(b->element[1]);
        double total = reply_num(b->element[2]);
        row.total = isnan(total) ? -1 : (int64_t)total;
        row.state = b->element[3]->str;
        wk_job_set_batch(jobs[i], &row);
    }
}

/* A batch this worker's Redis step completed: its `batches` row gets state, finished_at and
 * total with the next SQLite write. */
static void batch_completed(struct wk *w, const struct wk_job *j, long long total)
{
    const char *id = j->batch.id ? j->batch.id : j->rj.batch_id;
    if (total <= 0 || !id[0])
        return;
    log_info("batch %s completed: all %lld jobs are final", id, total);
    struct wk_store *st = &w->store;
    if (st->n_batch_rows == MAX_BATCH_ROWS &&
        st->n_batch_rows_sent == 0) { /* SQLite away long: drop the oldest */
        free((char *)st->batch_rows[0].id);
        free((char *)st->batch_rows[0].input);
        memmove(st->batch_rows, st->batch_rows + 1, (MAX_BATCH_ROWS - 1) * sizeof *st->batch_rows);
        st->n_batch_rows--;
    }
    if (st->n_batch_rows == MAX_BATCH_ROWS)
        return;
    struct db_batch *b = &st->batch_rows[st->n_batch_rows];
    *b = db_batch_empty();
    b->id = strdup(id);
    b->input = j->batch.input ? strdup(j->batch.input) : NULL;
    b->created_at = j->batch.created_at;
    b->total = total;
    b->state = "completed";
    b->finished_at = strtod(w->rq->now, NULL);
    if (b->id)
        st->n_batch_rows++;
}

/* Forgets the first n pending batch rows (written, or refused for good). */
static void batch_rows_drop(struct wk_store *st, int n)
{
    for (int i = 0; i < n; i++) {
        free((char *)st->batch_rows[i].id);
        free((char *)st->batch_rows[i].input);
    }
    memmove(st->batch_rows, st->batch_rows + n, (size_t)(st->n_batch_rows - n) * sizeof *st->batch_rows);
    st->n_batch_rows -= n;
}

/* ---- the Redis side of held jobs */

/* Another instance took this worker id over (--force-id): the processing list is its now, so this
 * one acknowledges and hands back nothing more and stops (exit 1). */
static void lost_id(struct wk *w)
{
    log_error("%s; stopping without acknowledging or handing back anything (exit 1)", rq_error(w->rq));
    w->id_lost = true;
    w->exit_code = 1;
}

/* The rows of jobs[0..n) as published on <p>:results (worker/store/row_json.h): the values their
 * commit wrote. NULL when q publishes no rows, or out of memory (then nothing is owned). */
static char **publish_rows(struct wk *w, struct wk_job *const *jobs, int n)
{
    if (!rq_results_on(w->rq))
        return NULL;
    char **rows = calloc((size_t)n, sizeof *rows);
    for (int i = 0; rows && i < n; i++) {
        struct db_result r;
        wk_job_row(jobs[i], &w->ctx, &r);
        if (!(rows[i] = row_json_result(&r))) {
            for (int k = 0; k < i; k++)
                free(rows[k]);
            free(rows);
            return NULL;
        }
    }
    return rows;
}

static void free_rows(char **rows, int n)
{
    for (int i = 0; rows && i < n; i++)
        free(rows[i]);
    free(rows);
}

/* An ack was held for want of replicas (queue/replicas.h): logged at most every TROUBLE_LOG_S; the
 * jobs stay held (rows written) and the ack is sent again at the next round. */
static void replicas_short(struct wk *w)
{
    double now = llmq_mono_s();
    if (w->redis.short_since == 0)
        w->redis.short_since = now;
    if (now >= w->redis.short_next_log) {
        log_warn("redis: %s; the acks wait (%d jobs held, their rows written) and are sent again",
                 rq_error(w->rq), held_count(w));
        w->redis.short_next_log = now + TROUBLE_LOG_S;
    }
}

static void redis_committed(struct wk *w)
{
    int n = jobs_of(w, WK_COMMITTED, WK_AFTER_ACK);
    if (n) {
        int own = rq_heartbeat_check(w->rq); /* acks only while the list is ours */
        if (own == RQ_HB_TAKEN) {
            lost_id(w);
            return;
        }
        if (own < 0) {
            redis_trouble(w, "ack");
            return;
        }
        int64_t max_bytes = w->cfg->redis.result_max_bytes;
        char **rows = publish_rows(w, w->scratch.jobs, n);
        if (rq_results_on(w->rq) && !rows) {
            redis_trouble(w, "ack (out of memory for the rows to publish)");
            return;
        }
        for (int i = 0; i < n; i++) {
            struct wk_job *j = w->scratch.jobs[i];
            w->scratch.results[i] = (struct rq_result){
                .job = &j->rj,
                .status = j->status,
                .error = j->error,
                .error_code = wk_job_error_code(j),
                .finish_reason = j->finish_reason,
                .prompt_tokens = j->prompt_tokens,
                .completion_tokens = j->completion_tokens,
                .first_token_at = isnan(j->first_token_at) ? 0 : j->first_token_at,
                .result = wk_job_hash_result(j, &w->ctx, max_bytes),
                .row_id = wk_job_id(j),
                .row = rows ? rows[i] : NULL,
            };
        }
        int removed = rq_ack(w->rq, w->scratch.results, n);
        free_rows(rows, n);
        if (removed < 0 && w->rq->cmd.ctx && rq_wait_short(w->rq)) {
            replicas_short(w);
            return;
        }
        if (removed < 0) {
            redis_trouble(w, "ack");
            return;
        }
        redis_ok(w);
        bool again = w->redis.short_since > 0; /* sent before: its first run took them out of the list */
        if (again) {
            log_info("redis: replicas confirm again after %.1f s; the held acks went through",
                     llmq_mono_s() - w->redis.short_since);
            w->redis.short_since = w->redis.short_next_log = 0;
        }
        if (removed < n && !again)
            log_info("redis: %d of %d acknowledged jobs were no longer in %s (reaped while this worker was "
                     "unreachable, or lost in a Redis restart); their rows are written",
                     n - removed, n, w->rq->proc_key);
        wk_stream_end(&w->stream, w->rq, w->scratch.jobs, n);
        for (int i = 0; i < n; i++) {
            batch_completed(w, w->scratch.jobs[i], w->scratch.results[i].batch_done);
            drop(w, w->scratch.jobs[i]);
        }
    }
    n = jobs_of(w, WK_COMMITTED, WK_AFTER_DEAD);
    for (int i = 0; i < n; i++) {
        struct wk_job *j = w->scratch.jobs[i];
        long long done = 0;
        char **rows = publish_rows(w, &j, 1);
        struct rq_row row = {wk_job_id(j), rows ? rows[0] : NULL};
        int r = rq_results_on(w->rq) && !rows
                    ? -1
                    : rq_dead(w->rq, &j->rj, wk_job_error_code(j), j->error,
                              wk_job_hash_result(j, &w->ctx, w->cfg->redis.result_max_bytes), &row, &done);
        free_rows(rows, 1);
        if (r < 0) {
            redis_trouble(w, "dead-lettering");
            return;
        }
        redis_ok(w);
        wk_stream_end(&w->stream, w->rq, &j, 1);
        batch_completed(w, j, done);
        w->stats.dead++;
        wk_metrics_dead(&w->stats.metrics);
        log_warn("job %s failed: %s; dead-lettered", wk_job_id(j), j->error ? j->error : "?");
        drop(w, j);
    }
    n = jobs_of(w, WK_COMMITTED, WK_AFTER_NONE);
    if (n && rq_results_on(w->rq)) { /* Redis let them go before the commit: their rows go out now */
        char **rows = publish_rows(w, w->scratch.jobs, n);
        struct rq_row *pr = rows ? calloc((size_t)n, sizeof *pr) : NULL;
        for (int i = 0; pr && i < n; i++)
            pr[i] = (struct rq_row){wk_job_id(w->scratch.jobs[i]), rows[i]};
        int r = pr ? rq_results_publish(w->rq, pr, n) : -1;
        free(pr);
        free_rows(rows, n);
        if (r < 0) {
            redis_trouble(w, "publishing rows");
            return;
        }
        redis_ok(w);
    }
    for (int i = 0; i < n; i++)
        drop(w, w->scratch.jobs[i]);
}

/* Where a WK_ROUTE job goes: the long queue of its model (or the unnamed one), the queue of the
 * model it names, or back where it came from (NULL). 0, or -1 when no reference can be built. */
static int route_target(const struct wk_job *j, char *buf, size_t len, const char **out)
{
    char model[RQ_MODEL_MAX + 1];
    *out = buf;
    switch (j->route) {
    case WK_TO_LONG:
        if (rq_queue_ref_model(j->rj.queue, model, sizeof model))
            return -1;
        return rq_queue_ref(model, "long", buf, len);
    case WK_TO_MODEL:
        return rq_queue_ref(j->job.model, rq_queue_ref_queue(j->rj.queue), buf, len);
    default:
        *out = NULL;
        return 0;
    }
}

/* Moves the jobs to route, one rq_requeue per run of jobs with the same target. */
static void redis_route(struct wk *w)
{
    static const char *const reasons[] = {
        [WK_TO_LONG] = "route_long", [WK_TO_MODEL] = "route_model", [WK_TO_ORIGIN] = "template_lookup"};
    int n = jobs_of(w, WK_ROUTE, -1);
    for (int i = 0; i < n;) {
        struct wk_job *first = w->scratch.jobs[i];
        char tbuf[RQ_QREF_MAX + 1], obuf[RQ_QREF_MAX + 1];
        const char *target, *other;
        if (route_target(first, tbuf, sizeof tbuf, &target))
            target = NULL; /* cannot happen for a valid reference: back where it came from */
        int k = 0;
        for (int m = i; m < n; m++) {
            struct wk_job *j = w->scratch.jobs[m];
            if (j->route != first->route || route_target(j, obuf, sizeof obuf, &other) ||
                (target ? !other || strcmp(other, target) : other != NULL))
                break;
            w->scratch.rjobs[k++] = &j->rj;
        }
        int moved = rq_requeue(w->rq, w->scratch.rjobs, k, target, reasons[first->route]);
        if (moved < 0) {
            redis_trouble(w, "moving jobs to another queue");
            return;
        }
        redis_ok(w);
        if (first->route == WK_TO_LONG) {
            w->stats.routed += moved;
            wk_metrics_routed(&w->stats.metrics, moved);
        } else if (first->route == WK_TO_MODEL) {
            w->stats.routed_model += moved;
        }
        log_debug("moved %d job%s to %s", moved, moved == 1 ? "" : "s", target ? target : "their queue");
        for (int m = 0; m < k; m++)
            drop(w, w->scratch.jobs[i + m]);
        i += k;
    }
}

static void redis_retry(struct wk *w)
{
    int n = jobs_of(w, WK_RETRY, -1);
    for (int i = 0; i < n; i++) {
        struct wk_job *j = w->scratch.jobs[i];
        int64_t delay = 0;
        long long done = 0;
        /* the result goes with it in case Redis dead-letters it (out of attempts) */
        int r = rq_retry(w->rq, &j->rj, wk_job_error_code(j), j->error,
                         wk_job_hash_result(j, &w->ctx, w->cfg->redis.result_max_bytes), &delay, &done);
        if (r < 0) {
            redis_trouble(w, "scheduling a retry");
            return;
        }
        redis_ok(w);
        batch_completed(w, j, done);
        if (r == RQ_RETRY_SCHEDULED) {
            w->stats.retried++;
            count_finish(w, j, true);
            log_warn("job %s failed in the engine (%s); attempt %d of %d, retrying in %.1f s", wk_job_id(j),
                     j->error, j->rj.attempts - j->rj.stalls, w->cfg->queues.max_attempts, (double)delay / 1e3);
            drop(w, j);
        } else if (r == RQ_RETRY_DEAD) { /* Redis dead-lettered it: write its failed row */
            w->stats.dead++;
            count_finish(w, j, false);
            wk_metrics_dead(&w->stats.metrics);
            log_warn("job %s failed in the engine (%s) and is out of attempts; dead-lettered", wk_job_id(j),
                     j->error);
            wk_stream_end(&w->stream, w->rq, &j, 1);
            j->after = WK_AFTER_NONE;
            move(w, j, WK_PENDING);
        } else {
            drop(w, j);
        }
    }
}

/* Counts a delivery (rq_attempt) for the jobs that started running and are not counted yet, in
 * one round trip. When Redis fails they stay due and the next call tries again. */
static void redis_count(struct wk *w)
{
    if (w->count_due <= 0)
        return;
    if (array_reserve(&w->counting, &w->counting_cap, (size_t)w->count_due, sizeof *w->counting, 64))
        return;
    int n = 0;
    for (int s = 0; s < WK_NSTATES && n < w->count_due; s++)
        for (struct wk_job *j = wk_job_of(w->held[s].head); j && n < w->count_due; j = wk_job_of(j->link.next))
            if (j->count_due)
                w->counting[n++] = &j->rj;
    if (rq_attempt(w->rq, w->counting, n)) {
        redis_trouble(w, "counting the delivery of jobs that start running");
        return;
    }
    redis_ok(w);
    for (int i = 0; i < n; i++) /* the wk_job around each rq_job */
        ((struct wk_job *)((char *)w->counting[i] - offsetof(struct wk_job, rj)))->count_due = false;
    w->count_due = 0;
}

/* The engine is about to run these jobs for the first time: their delivery counts from now on
 * (docs/QUEUE.md, "attempts"), before the step that runs them, so a job that crashes the worker
 * in that step has it counted. */
static void on_start(void *ctx, struct engine_seq *const *seqs, int n)
{
    struct wk *w = ctx;
    for (int i = 0; i < n; i++) {
        struct sum_run *r = seqs[i]->user;
        struct wk_job *j = r ? r->owner : NULL;
        if (j && j->rj.id[0] && !j->rj.counted && !j->count_due) {
            j->count_due = true;
            w->count_due++;
        }
    }
    if (redis_open(w)) /* else sent with the first Redis step once Redis answers again */
        redis_count(w);
}

/* The Redis side of held jobs whose rows are committed (ack, dead list), of jobs to move to the long
 * queue and of jobs to retry. */
static void redis_settle(struct wk *w)
{
    if (redis_open(w))
        redis_count(w);
    if (redis_open(w))
        redis_committed(w);
    if (w->id_lost)
        return;
    if (redis_open(w))
        redis_route(w);
    if (redis_open(w))
        redis_retry(w);
}

/* ---- SQLite */

static void db_trouble(struct wk *w, const char *msg)
{
    struct wk_store *store = &w->store;
    double now = llmq_mono_s();
    snprintf(store->err, sizeof store->err, "%s", msg);
    if (store->trouble_since == 0)
        store->trouble_since = now;
    if (now >= store->next_log) {
        int waiting = w->held[WK_PENDING].n + w->held[WK_COMMITTING].n;
        log_warn(
            "sqlite: %s; %d finished job%s wait in memory (still in %s) and the write is retried in %.1f s",
            msg, waiting, waiting == 1 ? "" : "s", w->rq->proc_key, store->backoff_ms / 1e3);
        store->next_log = now + TROUBLE_LOG_S;
    }
}

static void requeue_state(struct wk *w, int state, const char *why);

/* The database cannot be written (DB_UNWRITABLE): waiting will not mend it soon, and jobs held
 * meanwhile would sit out of every other worker's reach behind a live heartbeat. Stops fetching
 * (phase_fetch), hands the jobs still to run or to write back to the front of their queues, and
 * keeps trying the workers row (with the write backoff) until a write succeeds; a --drain worker
 * gives up after sqlite.unwritable_timeout_s (store_and_report). */
static void store_unwritable(struct wk *w, const char *why)
{
    struct wk_store *st = &w->store;
    if (st->unwritable_since == 0) {
        st->unwritable_since = llmq_mono_s();
        int n = w->held[WK_RUNNING].n + w->held[WK_PENDING].n;
        char tail[160];
        if (w->opts.drain)
            snprintf(tail, sizeof tail,
                     "; --drain gives up with exit status 1 unless it can write within %d s "
                     "(sqlite.unwritable_timeout_s)",
                     w->cfg->sqlite.unwritable_timeout_s);
        else
            snprintf(tail, sizeof tail, "; trying again, and fetching again once it can write");
        log_error(
            "sqlite: %s; the database cannot be written: not fetching, %d job%s handed back to the front "
            "of their queues%s",
            why, n, n == 1 ? "" : "s", tail);
    }
    requeue_state(w, WK_RUNNING, "sqlite_unwritable");
    requeue_state(w, WK_PENDING, "sqlite_unwritable");
    st->want_touch = true;
}

static void commit_done(struct wk *w, struct wk_batch *b)
{
    struct wk_store *store = &w->store;
    double now = llmq_mono_s();
    bool results_ok = b->rc_results == DB_OK || b->rc_results == DB_ERR_ROW;
    if (b->moved[0]) {
        log_error("sqlite: %s", b->moved);
        if (results_ok)
            snprintf(store->replaced, sizeof store->replaced, "%.590s", b->moved);
    }
    log_debug("sqlite: batch of %zu rows, %zu metrics rows: %.2f ms (results %d)", store->n_rows,
              (size_t)store->n_metrics_sent, b->write_ms, b->rc_results);
    bool worker_row_failed = store->worker_row_sent && b->rc_worker != DB_OK;
    if (b->nparts) {
        if (b->rc_parts == DB_ERR) /* refused for what they are: the jobs go on without them stored */
            log_warn("sqlite: %zu job part row%s not stored: %s", b->nparts, b->nparts == 1 ? "" : "s", b->err);
        wk_part_rows_done(&store->parts, b->rc_parts == DB_OK || b->rc_parts == DB_ERR, part_committed, w);
    }
    if (store->worker_row_sent && b->rc_worker == DB_OK)
        store->worker_row_done = true;
    store->worker_row_sent = false;
    if (store->n_metrics_sent) {
        bool drop_them = b->rc_metrics == DB_OK;
        if (b->rc_metrics == DB_ERR &&
            !worker_row_failed) { /* refused for what it is: retrying will not help */
            log_warn("sqlite: %d metrics row%s dropped: %s", store->n_metrics_sent,
                     store->n_metrics_sent == 1 ? "" : "s", b->err);
            drop_them = true;
        }
        if (drop_them) {
            memmove(store->metrics, store->metrics + store->n_metrics_sent,
                    (size_t)(store->n_metrics - store->n_metrics_sent) * sizeof *store->metrics);
            store->n_metrics -= store->n_metrics_sent;
        }
        store->n_metrics_sent = 0;
    }
    if (store->n_batch_rows_sent) {
        if (b->rc_batches == DB_ERR) /* refused for what it is: retrying will not help */
            log_warn("sqlite: %d batch row%s dropped: %s", store->n_batch_rows_sent,
                     store->n_batch_rows_sent == 1 ? "" : "s", b->err);
        if (b->rc_batches != DB_BUSY && b->rc_batches != DB_UNWRITABLE)
            batch_rows_drop(store, store->n_batch_rows_sent);
        store->n_batch_rows_sent = 0;
    }
    if (store->touch_sent && b->rc_touch == DB_OK) {
        store->want_touch = false;
        if (b->stopped)
            store->stopped_touch = true;
    }
    store->touch_sent = false;

    if (results_ok) {
        for (size_t i = 0; i < store->n_rows; i++) {
            struct wk_job *j = store->row_jobs[i];
            if (b->rc_results == DB_OK || store->row_rc[i] == DB_OK) {
                move(w, j, WK_COMMITTED);
                w->stats.done++;
                w->stats.interval_done++;
                w->stats.completed += j->status == RQ_STATUS_COMPLETED;
                w->stats.failed += j->status == RQ_STATUS_FAILED;
                w->stats.interval_failed += j->status == RQ_STATUS_FAILED;
                w->stats.cancelled += j->status == RQ_STATUS_CANCELLED;
                w->stats.interval_cancelled += j->status == RQ_STATUS_CANCELLED;
            } else if (!j->degraded) {
                log_warn(
                    "sqlite: the row of job %s was refused (%s); writing it again without its JSON columns",
                    wk_job_id(j), b->err);
                wk_job_degrade(j);
                move(w, j, WK_PENDING);
            } else {
                log_error("sqlite: the row of job %s was refused again (%s); the job is let go without a row",
                          wk_job_id(j), b->err);
                move(w, j, WK_COMMITTED);
            }
        }
    } else {
        /* nothing was written: back to the front of the pending list, in order */
        for (size_t i = store->n_rows; i-- > 0;) {
            struct wk_job *j = store->row_jobs[i];
            list_remove(&w->held[WK_COMMITTING], &j->link);
            j->state = WK_PENDING;
            list_push_front(&w->held[WK_PENDING], &j->link);
        }
        store->oldest_pending = 0;
    }
    bool unwritable = b->rc_results == DB_UNWRITABLE || b->rc_worker == DB_UNWRITABLE ||
                      b->rc_parts == DB_UNWRITABLE ||
                      b->rc_metrics == DB_UNWRITABLE || b->rc_touch == DB_UNWRITABLE ||
                      b->rc_batches == DB_UNWRITABLE;
    bool failed = !results_ok || worker_row_failed || b->rc_parts == DB_BUSY || b->rc_metrics == DB_BUSY ||
                  b->rc_touch == DB_BUSY ||
                  b->rc_batches == DB_BUSY || unwritable;
    if (unwritable)
        store_unwritable(w, b->err[0] ? b->err : "the database cannot be written");
    if (failed) {
        store->backoff_ms = store->backoff_ms ? 2 * store->backoff_ms : 100;
        if (store->backoff_ms > 2000)
            store->backoff_ms = 2000;
        store->next_commit = now + store->backoff_ms / 1e3;
        db_trouble(w, b->err[0] ? b->err : "the write failed");
    } else {
        if (store->trouble_since > 0)
            log_info("sqlite: writing again after %.1f s (%zu rows committed)%s", now - store->trouble_since,
                     store->n_rows, store->unwritable_since > 0 ? "; fetching again" : "");
        store->unwritable_since = 0;
        store->trouble_since = 0;
        store->next_log = 0;
        store->backoff_ms = 0;
    }
    store->n_rows = 0;
}

/* Whether job rows may be committed: only while the heartbeat's lease holds (redis_gate.h). Past
 * it another worker may have reaped the jobs; their rows wait until redis_chores has renewed the
 * heartbeat and found which jobs are still this worker's. */
static bool rows_leased(struct wk *w, double now)
{
    bool ok = wk_gate_leased(&w->redis.gate, now);
    if (!ok && !w->redis.unleased && w->held[WK_PENDING].n) {
        log_warn(
            "worker: no heartbeat for %d s (worker.heartbeat_ttl_s): %d finished job%s wait, not written, "
            "until Redis confirms they are still this worker's",
            w->cfg->worker.heartbeat_ttl_s, w->held[WK_PENDING].n, w->held[WK_PENDING].n == 1 ? "" : "s");
        w->redis.unleased = true;
    }
    if (ok)
        w->redis.unleased = false;
    return ok;
}

static bool commit_due(struct wk *w, double now)
{
    struct wk_store *store = &w->store;
    if (wk_writer_busy(store->writer) || now < store->next_commit)
        return false;
    bool leased = rows_leased(w, now);
    if (leased && wk_part_rows_waiting(&store->parts)) /* a summary's next level waits for them */
        return true;
    int n = leased ? w->held[WK_PENDING].n : 0;
    if (n && (n >= w->cfg->sqlite.commit_max_rows ||
              (now - store->oldest_pending) * 1e3 >= w->cfg->sqlite.commit_interval_ms ||
              !engine_has_work(w->eng) || w->stopping))
        return true;
    return !store->worker_row_done || store->n_metrics > 0 || store->want_touch || store->n_batch_rows > 0;
}

static void commit_submit(struct wk *w, bool stopped)
{
    struct wk_store *store = &w->store;
    struct wk_batch *b = &store->batch;
    memset(b, 0, sizeof *b);
    store->n_rows = 0;
    struct wk_job *j = rows_leased(w, llmq_mono_s()) ? wk_job_of(w->held[WK_PENDING].head) : NULL;
    while (j && store->n_rows < MAX_BATCH) {
        struct wk_job *next = wk_job_of(j->link.next);
        wk_job_row(j, &w->ctx, &store->rows[store->n_rows]);
        store->row_jobs[store->n_rows++] = j;
        move(w, j, WK_COMMITTING);
        j = next;
    }
    if (w->held[WK_PENDING].n)
        store->oldest_pending = llmq_mono_s();
    b->rows = store->rows;
    b->nrows = store->n_rows;
    b->row_rc = store->row_rc;
    if (rows_leased(w, llmq_mono_s()))
        b->parts = wk_part_rows_send(&store->parts, MAX_BATCH, &b->nparts);
    if (!store->worker_row_done) {
        store->worker_row.started_at = w->rq->started_at;
        b->worker_row = &store->worker_row;
        store->worker_row_sent = true;
    }
    b->metrics = store->metrics;
    b->nmetrics = (size_t)store->n_metrics;
    store->n_metrics_sent = store->n_metrics;
    b->batches = store->batch_rows;
    b->nbatches = (size_t)store->n_batch_rows;
    store->n_batch_rows_sent = store->n_batch_rows;
    if (store->want_touch || stopped) {
        b->touch_id = w->worker_id;
        b->touch_now = db_now();
        b->jobs_done = w->stats.done;
        b->stopped = stopped;
        store->touch_sent = true;
    }
    if (wk_writer_submit(store->writer, b)) { /* cannot happen: commit_due checked it */
        log_error("sqlite: the writer is busy");
        for (size_t i = 0; i < store->n_rows; i++)
            move(w, store->row_jobs[i], WK_PENDING);
        store->n_rows = 0;
        store->n_metrics_sent = 0;
        store->n_batch_rows_sent = 0;
        wk_part_rows_done(&store->parts, false, NULL, NULL);
        store->worker_row_sent = store->touch_sent = false;
    }
}

/* ---- metrics and log lines */

/* The Redis figures of the metrics (queue depths, retry set, dead list): one rq_stats per metrics
 * interval, never one per scrape. */
static void read_redis_figures(struct wk *w)
{
    const char *queues[WK_METRICS_QUEUES];
    for (int i = 0; i < WK_METRICS_QUEUES; i++)
        queues[i] = wk_lane_queue(i);
    struct rq_stats rs;
    memset(&rs, 0, sizeof rs);
    bool ok = redis_open(w) && rq_stats(w->rq, queues, WK_METRICS_QUEUES, false, &rs) == 0;
    int64_t depth[WK_METRICS_QUEUES] = {0};
    for (int i = 0; ok && i < WK_METRICS_QUEUES; i++)
        depth[i] = rs.queues[i].len;
    wk_metrics_redis(&w->stats.metrics, ok, depth, rs.retry, rs.dead);
    rq_stats_free(&rs);
    if (!ok && redis_open(w) && !w->rq->cmd.ctx)
        redis_trouble(w, "reading the queue depths");
    else if (!ok)
        log_debug("metrics: reading the queue depths failed: %s", rq_error(w->rq));
}

/* The snapshot GET /metrics and /health serve (worker/metrics/http.h). */
static void publish(struct wk *w, double now)
{
    if (!w->stats.http)
        return;
    w->stats.next_publish = now + PUBLISH_S;
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    struct wk_snapshot *s = &w->stats.snapshot;
    wk_metrics_wait_shortfalls(&w->stats.metrics, w->rq->wait_shortfalls);
    wk_metrics_snapshot(&w->stats.metrics, &st, s);
    s->ready = 1;
    s->stopping = w->stopping;
    s->redis_ok = w->redis.trouble_since == 0 && w->rq->cmd.ctx != NULL && redis_open(w);
    snprintf(s->redis_err, sizeof s->redis_err, "%.*s", (int)sizeof s->redis_err - 1,
             s->redis_ok ? "" : rq_error(w->rq));
    s->sqlite_ok = w->store.trouble_since == 0 && !w->store.replaced[0];
    snprintf(s->sqlite_err, sizeof s->sqlite_err, "%.*s", (int)sizeof s->sqlite_err - 1,
             w->store.trouble_since > 0 ? w->store.err : w->store.replaced);
    wk_http_publish(w->stats.http, s);
}

/* With results_stream.enabled: this worker's workers row and the metrics row m onto <p>:metrics
 * (one try: a row made while Redis does not answer is not published; a local database keeps it). */
static void publish_metrics(struct wk *w, const struct db_metrics *m)
{
    if (!rq_results_on(w->rq) || !redis_open(w))
        return;
    struct db_worker_row wr = {.w = w->store.worker_row, .jobs_done = w->stats.done, .stopped_at = NAN};
    wr.w.started_at = w->rq->started_at;
    wr.last_seen_at = m->ts;
    char *json[2] = {row_json_worker(&wr), row_json_metrics(m)};
    static const char *const kinds[2] = {"worker", "metrics"};
    struct rq_row rows[2] = {{w->worker_id, json[0]}, {w->worker_id, json[1]}};
    if (json[0] && json[1] && rq_metrics_publish(w->rq, kinds, rows, 2))
        log_debug("metrics: publishing the metrics row failed: %s", rq_error(w->rq));
    free(json[0]);
    free(json[1]);
}

static void add_metrics_row(struct wk *w, double now)
{
    read_redis_figures(w);
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    struct db_metrics row;
    wk_metrics_row(&w->stats.metrics, now, db_now(), &st, &row);
    row.worker_id = w->worker_id;
    row.gpu_mem_bytes = w->gpu_mem_bytes;
    w->stats.last_tokens_per_s = row.generation_tokens_per_s;
    if (w->store.n_metrics == MAX_METRICS &&
        w->store.n_metrics_sent == 0) { /* SQLite has been away long: drop the oldest */
        memmove(w->store.metrics, w->store.metrics + 1, (MAX_METRICS - 1) * sizeof *w->store.metrics);
        w->store.n_metrics--;
    }
    if (w->store.n_metrics < MAX_METRICS)
        w->store.metrics[w->store.n_metrics++] = row;
    w->store.want_touch = true;
    publish_metrics(w, &row);
    log_info("worker: %lld done in %.0f s (%lld failed, %lld cancelled), %.0f prompt + %.0f generated tok/s, "
             "running %d, waiting %d, held %d, kv %.0f%%",
             (long long)w->stats.interval_done, row.interval_s, (long long)w->stats.interval_failed,
             (long long)w->stats.interval_cancelled,
             isnan(row.prompt_tokens_per_s) ? 0 : row.prompt_tokens_per_s,
             isnan(row.generation_tokens_per_s) ? 0 : row.generation_tokens_per_s, st.running, st.waiting,
             held_count(w), isnan(row.kv_usage) ? 0 : 100 * row.kv_usage);
    w->stats.interval_done = w->stats.interval_failed = w->stats.interval_cancelled = 0;
    publish(w, now);
}

/* The loop's per-phase timings as one line at `level`. */
static void timing_line(enum log_level level, const char *what, struct timing *t)
{
    if (!t->steps) {
        log_msg(level, "%s: no engine steps", what);
        return;
    }
    char buf[512];
    size_t n = 0;
    double ovh = 0;
    for (int p = 0; p < PH_N; p++) {
        if (p != PH_STEP)
            ovh += t->sum[p];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s %.1f", p ? ", " : "", ph_names[p],
                              t->sum[p] / (double)t->steps * 1e6);
        if (n >= sizeof buf)
            break;
    }
    double p50 = wk_percentile(t->ovh.v, t->ovh.n, 50), p95 = wk_percentile(t->ovh.v, t->ovh.n, 95);
    double pmax = wk_percentile(t->ovh.v, t->ovh.n, 100);
    log_msg(
        level,
        "%s: %llu steps; worker overhead per step %.1f us mean, %.1f p50, %.1f p95, %.1f max "
        "(engine step %.1f us mean); at full batch %.1f us mean over %llu steps; per phase (us/step): %s",
        what, (unsigned long long)t->steps, ovh / (double)t->steps * 1e6, p50, p95, pmax,
        t->sum[PH_STEP] / (double)t->steps * 1e6, t->full_n ? t->full_sum / (double)t->full_n * 1e6 : 0.0,
        (unsigned long long)t->full_n, buf);
}

static void timing_add(struct timing *t, const double *ph, int running, int full)
{
    double ovh = 0;
    for (int p = 0; p < PH_N; p++) {
        t->sum[p] += ph[p];
        if (p != PH_STEP)
            ovh += ph[p];
    }
    t->steps++;
    if (running >= full) {
        t->full_sum += ovh;
        t->full_n++;
    }
    if (t->ovh.n < MAX_OVERHEAD_SAMPLES) {
        if (array_reserve(&t->ovh.v, &t->ovh.cap, t->ovh.n + 1, sizeof *t->ovh.v, 4096))
            return;
        t->ovh.v[t->ovh.n++] = ovh * 1e6;
    }
}

static void timing_reset(struct timing *t)
{
    double *v = t->ovh.v;
    size_t cap = t->ovh.cap;
    memset(t, 0, sizeof *t);
    t->ovh.v = v;
    t->ovh.cap = cap;
}

/* ---- one iteration */

static void phase_fetch(struct wk *w, bool *blocked)
{
    *blocked = false;
    if (w->stopping || !w->fetch.recovered || w->store.unwritable_since > 0)
        return;
    int waiting_rows = w->held[WK_PENDING].n + w->held[WK_COMMITTING].n + w->held[WK_COMMITTED].n;
    int bound = 4 * w->cfg->sqlite.commit_max_rows; /* finished jobs kept in memory at most (about) */
    if (bound < 64)
        bound = 64;
    if (waiting_rows >= bound) {
        if (!w->fetch.paused)
            log_warn("worker: %d finished jobs wait for SQLite or Redis; not fetching until they are written",
                     waiting_rows);
        w->fetch.paused = true;
        return;
    }
    if (w->fetch.paused)
        log_info("worker: fetching again");
    w->fetch.paused = false;
    if (!w->tpl_published) { /* the config's templates go to Redis before the first job is taken */
        char err[1024];
        int rc = tpl_source_publish(w->tpl, w->worker_id, err, sizeof err);
        if (rc == -1) {
            redis_trouble(w, "publishing the templates");
            return;
        }
        if (rc == -2) {
            log_error("%s", err);
            w->exit_code = 1;
            w->stopping = true;
            return;
        }
        w->tpl_published = true;
        if (w->cfg->n_templates)
            log_info("templates: %zu published to %s", w->cfg->n_templates, w->rq->keys.templates);
    }
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    struct rq_source lanes[WK_NLANES];
    int total = 0;
    int nlanes = wk_lanes_sources(&w->lanes, &st, lanes, &total);
    if (total <= 0)
        return;
    struct rq_source src[WK_NLANES * (WK_MAX_SERVED + 1)];
    int group[WK_NLANES * (WK_MAX_SERVED + 1)];
    int nsrc = wk_models_sources(&w->models, lanes, nlanes, src, group);
    bool idle = !engine_has_work(w->eng) && held_count(w) == 0;
    double now = llmq_mono_s();
    if (!idle && w->fetch.last_empty > 0 && now - w->fetch.last_empty < w->fetch.empty_wait)
        return;
    /* jobs held take memory until they are acknowledged: a few large jobs fill the budget, and
     * the next ones wait in Redis for a worker with room */
    int64_t budget = w->cfg->queues.fetch_max_bytes - (int64_t)rq_held_bytes(w->rq);
    if (budget <= 0 && rq_held_count(w->rq) > 0)
        return;
    if ((size_t)total > w->fetch.cap) { /* exactly what this fetch may bring */
        if (array_resize(&w->fetch.jobs, (size_t)total, sizeof *w->fetch.jobs) ||
            array_resize(&w->fetch.hash_keys, (size_t)total, sizeof *w->fetch.hash_keys))
            return;
        w->fetch.cap = (size_t)total;
    }
    int block = idle ? RQ_BLOCK_DEFAULT : 0;
    *blocked = idle;
    int n = rq_fetch_grouped(w->rq, src, group, nsrc, RQ_ORDER_PRIORITY, total, budget > 0 ? budget : 1,
                             block, w->fetch.jobs);
    if (n < 0) {
        redis_trouble(w, "fetch");
        if (block && !w->rq->blk.ctx)
            wk_gate_close(&w->redis.gate, llmq_mono_s());
        return;
    }
    redis_ok(w);
    w->fetch.last_empty = n == 0 ? llmq_mono_s() : 0;
    if (n > 0 || idle)
        w->fetch.empty_wait = EMPTY_FETCH_S;
    else if (w->fetch.empty_wait < EMPTY_FETCH_MAX_S)
        w->fetch.empty_wait *= 2;
    if (n == 0)
        return;
    if (grow_scratch(w, n)) {
        log_error("worker: out of memory; the fetched jobs are handed back");
        for (int i = 0; i < n; i++) { /* one by one: no room for a list of them */
            const struct rq_job *one = &w->fetch.jobs[i];
            rq_requeue(w->rq, &one, 1, NULL, "out_of_memory");
            rq_job_free(&w->fetch.jobs[i]);
        }
        return;
    }
    double now_mono = llmq_mono_s(), now_wall = db_now();
    int k = 0;
    for (int i = 0; i < n; i++) {
        struct wk_job *j = wk_job_new(&w->fetch.jobs[i], now_mono, now_wall);
        if (!j) { /* out of memory: it stays held by rq and goes back at shutdown or via the reaper */
            log_error("worker: out of memory for job %s", w->fetch.jobs[i].id);
            rq_job_free(&w->fetch.jobs[i]);
            continue;
        }
        w->scratch.jobs[k++] = j;
    }
    fetch_created(w, w->scratch.jobs, k);
    for (int i = 0; i < k; i++) {
        w->scratch.jobs[i]->progress_phase =
            (int)(w->fetch.seq++ % (uint64_t)w->cfg->worker.progress_every_tokens);
        admit(w, w->scratch.jobs[i]);
    }
}

static void phase_cancel(struct wk *w)
{
    double now = llmq_mono_s();
    if (now - w->redis.last_cancel < CANCEL_CHECK_S)
        return;
    w->redis.last_cancel = now;
    int n = 0;
    for (struct wk_job *j = wk_job_of(w->held[WK_RUNNING].head); j; j = wk_job_of(j->link.next))
        if (!j->cancel_sent && j->rj.id[0])
            n++;
    if (!n || grow_scratch(w, n))
        return;
    n = 0;
    for (struct wk_job *j = wk_job_of(w->held[WK_RUNNING].head); j; j = wk_job_of(j->link.next))
        if (!j->cancel_sent && j->rj.id[0]) {
            w->scratch.jobs[n] = j;
            w->scratch.ids[n++] = j->rj.id;
        }
    if (rq_cancel_check(w->rq, w->scratch.ids, n, w->scratch.flags)) {
        redis_trouble(w, "checking cancellations");
        return;
    }
    for (int i = 0; i < n; i++)
        if (w->scratch.flags[i]) {
            struct wk_job *j = w->scratch.jobs[i];
            log_info("job %s: cancelled by request", wk_job_id(j));
            j->cancel_sent = true;
            if (j->sum)
                end_summary(w, j, FINISH_CANCELLED, 0, NULL);
            else
                engine_cancel(w->eng, j->seq);
        }
}

/* engine_step and what follows from it: progress and finished jobs. Adds the time of each part to ph. */
static void phase_step(struct wk *w, double *ph)
{
    double t0 = llmq_mono_s();
    struct engine_seq **changed = NULL;
    int n = 0;
    if (engine_step(w->eng, &changed, &n))
        log_warn("engine: a step failed; its %d job%s are retried", n, n == 1 ? "" : "s");
    double t1 = llmq_mono_s();
    ph[PH_STEP] += t1 - t0;
    /* progress: marked per job every `every` tokens (and at the first token), sent in one
     * pipeline at most every PROGRESS_FLUSH_S */
    int every = w->cfg->worker.progress_every_tokens;
    double nw = db_now();
    for (int i = 0; i < n; i++) {
        struct engine_seq *s = changed[i];
        struct sum_run *r = s->user;
        struct wk_job *j = r ? r->owner : NULL;
        if (s->finished || !j || r->part || !j->rj.id[0]) /* a summary's progress is its parts' */
            continue;
        if (s->t_first_token > 0 && isnan(j->first_token_at)) {
            j->first_token_at = nw - (t1 - s->t_first_token);
            j->progress_due = true;
        } else if ((s->n_output + j->progress_phase) % every == 0 && s->n_output != j->reported_tokens) {
            j->progress_due = true;
        }
    }
    if (t1 - w->redis.last_progress >= PROGRESS_FLUSH_S && redis_open(w)) {
        w->redis.last_progress = t1;
        int np = 0;
        if (grow_scratch(w, w->held[WK_RUNNING].n) == 0)
            for (struct wk_job *j = wk_job_of(w->held[WK_RUNNING].head); j; j = wk_job_of(j->link.next)) {
                if (!j->progress_due || (!j->seq && !j->sum))
                    continue;
                j->progress_due = false;
                if (j->sum) {
                    struct sum_totals t;
                    sum_get_totals(j->sum, &t);
                    w->scratch.progress[np++] = (struct rq_progress){
                        .id = j->rj.id,
                        .progress = t.parts_total > 0 ? (double)t.parts_done / t.parts_total : 0,
                        .prompt_tokens = t.prompt_tokens > INT32_MAX ? INT32_MAX : (int)t.prompt_tokens,
                        .completion_tokens =
                            t.completion_tokens > INT32_MAX ? INT32_MAX : (int)t.completion_tokens,
                        .parts_done = t.parts_done,
                        .parts_total = t.parts_total,
                        .level = t.level,
                    };
                    continue;
                }
                j->reported_tokens = j->seq->n_output;
                w->scratch.progress[np++] = (struct rq_progress){
                    .id = j->rj.id,
                    .progress = j->max_tokens > 0 ? (double)j->seq->n_output / j->max_tokens : -1,
                    .prompt_tokens = j->seq->n_prompt,
                    .completion_tokens = j->seq->n_output,
                    .first_token_at = isnan(j->first_token_at) ? 0 : j->first_token_at,
                };
            }
        if (np && rq_progress(w->rq, w->scratch.progress, np))
            redis_trouble(w, "progress");
    }
    if (redis_open(w))
        wk_stream_flush(&w->stream, w->rq, &w->held[WK_RUNNING], t1); /* a no-op while no job streams */
    double t2 = llmq_mono_s();
    ph[PH_PROGRESS] += t2 - t1;
    /* finished */
    nw = db_now();
    for (int i = 0; i < n; i++) {
        struct engine_seq *s = changed[i];
        if (!s->finished)
            continue;
        struct sum_run *r = s->user;
        if (!r) { /* handed back while it ran (requeue_state), or dropped (redis_reclaim): nothing to write */
            engine_release(w->eng, s);
            continue;
        }
        if (r->part) {
            part_finished(w, r, s, nw);
            continue;
        }
        struct wk_job *j = r->owner;
        wk_job_finish_seq(j, &w->ctx, s, t2, nw);
        engine_release(w->eng, s);
        j->seq = NULL;
        after_run(w, j);
    }
    ph[PH_FINISH] += llmq_mono_s() - t2;
}

/* After the lease ran out (the heartbeat could not be renewed for heartbeat_ttl_s) and a heartbeat
 * went through again: another worker's reaper may have put this worker's jobs back on their
 * queues meanwhile. Those no longer in its processing list are another worker's now: they are
 * dropped without a row (a running one is stopped). Jobs whose rows are committed are
 * acknowledged as ever (the ack makes their hash final, so a copy not fetched yet is dropped as a
 * duplicate); those the writer has are left to it. 0, or -1 when the list could not be read. */
static int redis_reclaim(struct wk *w)
{
    static const int states[] = {WK_RUNNING, WK_PENDING, WK_ROUTE, WK_RETRY};
    if (grow_scratch(w, held_count(w)))
        return -1;
    int n = 0;
    for (size_t s = 0; s < sizeof states / sizeof states[0]; s++)
        for (struct wk_job *j = wk_job_of(w->held[states[s]].head); j; j = wk_job_of(j->link.next))
            if (j->after != WK_AFTER_NONE) { /* (those Redis let go already) */
                w->scratch.jobs[n] = j;
                w->scratch.rjobs[n++] = &j->rj;
            }
    if (rq_owned(w->rq, w->scratch.rjobs, n, w->scratch.flags)) {
        redis_trouble(w, "reading this worker's processing list");
        return -1;
    }
    int lost = 0;
    for (int i = 0; i < n; i++) {
        if (w->scratch.flags[i])
            continue;
        struct wk_job *j = w->scratch.jobs[i];
        log_warn("job %s: reaped by another worker while this one could not reach Redis; dropped without a "
                 "row (it runs elsewhere)",
                 wk_job_id(j));
        stop_seqs(w, j);
        rq_held_remove(w->rq, j->rj.raw, j->rj.len);
        drop(w, j);
        lost++;
    }
    if (n)
        log_info(
            "redis: the heartbeat is renewed after it had lapsed; %d of %d held job%s still this worker's%s",
            n - lost, n, n == 1 ? "" : "s", lost ? ", the others were reaped and are dropped here" : "");
    return 0;
}

/* Heartbeat, reaper and due retries (rq_tick), and once, before the first fetch, what an earlier
 * run under this worker id left in its processing list. A heartbeat renews the lease; after one
 * that had run out, only once redis_reclaim knows which jobs are still this worker's. */
static void redis_chores(struct wk *w)
{
    struct engine_stats hb; /* the engine's gauges for the heartbeat (llmq status) */
    engine_get_stats(w->eng, &hb);
    struct rq_worker_info info = {
        .gpu = w->gpu,
        .model = w->model_name,
        .models = w->models.csv,
        .jobs_done = w->stats.done,
        .tokens_per_s = isnan(w->stats.last_tokens_per_s) ? 0 : w->stats.last_tokens_per_s,
        .running = w->held[WK_RUNNING].n,
        .waiting = hb.waiting,
        .kv_blocks_used = hb.kv_blocks_used,
        .kv_blocks_total = hb.kv_blocks_total,
    };
    struct rq_tick_result tr;
    double sent = llmq_mono_s();
    bool lapsed = w->redis.gate.lease_until > 0 && !wk_gate_leased(&w->redis.gate, sent);
    int rc = rq_tick(w->rq, &info, &tr);
    if (tr.heartbeat && (!lapsed || redis_reclaim(w) == 0)) /* else again at the next heartbeat */
        wk_gate_lease(&w->redis.gate, sent, w->cfg->worker.heartbeat_ttl_s);
    w->stats.reaped_dead += tr.reap.dead; /* what was done also when another chore failed */
    w->stats.dead += tr.reap.dead;
    if (tr.id_taken) {
        lost_id(w);
        return;
    }
    if (rc)
        redis_trouble(w, "heartbeat/reaper/retries");
    else if (tr.reaped && (tr.reap.requeued || tr.reap.dead || tr.reap.acked))
        log_info("reaper: %d lapsed worker%s: %d job%s back on their queue, %d dead-lettered, %d acknowledged "
                 "with their committed row",
                 tr.reap.workers, tr.reap.workers == 1 ? "" : "s", tr.reap.requeued,
                 tr.reap.requeued == 1 ? "" : "s", tr.reap.dead, tr.reap.acked);
    if (!w->fetch.recovered && held_count(w) == 0 && w->rq->claimed) {
        struct rq_reap_result rr = {0};
        if (rq_recover(w->rq, &rr) == 0) {
            w->fetch.recovered = true;
            w->stats.reaped_dead += rr.dead;
            w->stats.dead += rr.dead;
            if (rr.requeued || rr.dead || rr.acked)
                log_info("worker: took back what an earlier run under this id left: %d job%s requeued, %d "
                         "dead-lettered, %d acknowledged with their committed row",
                         rr.requeued, rr.requeued == 1 ? "" : "s", rr.dead, rr.acked);
        } else {
            redis_trouble(w, "recovering this worker's processing list");
        }
    }
}

/* The rows' side after the step: a batch the writer finished, the metrics row when due, the next
 * batch when due, and the snapshot GET /metrics serves. */
static void store_and_report(struct wk *w, double now)
{
    struct wk_batch *b = wk_writer_poll(w->store.writer);
    if (b)
        commit_done(w, b);
    if (w->opts.drain && w->store.unwritable_since > 0 && !w->stopping &&
        now - w->store.unwritable_since >= w->cfg->sqlite.unwritable_timeout_s) {
        log_error(
            "sqlite: the database could not be written for %d s (sqlite.unwritable_timeout_s): a --drain "
            "worker gives up; exit status 1",
            w->cfg->sqlite.unwritable_timeout_s);
        w->exit_code = 1;
        w->stopping = true;
        w->stop_deadline = now;
    }
    if (now >= w->stats.next_row) {
        add_metrics_row(w, now);
        w->stats.next_row = now + w->cfg->metrics.interval_s;
        if (w->opts.stats) {
            timing_line(LOG_INFO, "worker stats (last interval)", &w->stats.interval_timing);
            timing_reset(&w->stats.interval_timing);
        }
    }
    if (commit_due(w, now))
        commit_submit(w, false);
    if (now >= w->stats.next_publish)
        publish(w, now);
}

/* Adds the seconds since *t to *phase and restarts *t. */
static void lap(double *phase, double *t)
{
    double now = llmq_mono_s();
    *phase += now - *t;
    *t = now;
}

/* One pass of the loop, one engine step, in the order of docs/WORKER.md ("What one iteration does");
 * each phase is timed for the --stats lines. The Redis steps are skipped while Redis does not
 * answer (redis_up, redis_gate.h): the engine never waits on it. */
static void iterate(struct wk *w)
{
    double ph[PH_N] = {0};
    double t = llmq_mono_s();
    if (redis_up(w))
        redis_chores(w); /* 1. heartbeat, reaper, retries */
    if (w->id_lost)
        return;
    lap(&ph[PH_TICK], &t);
    redis_settle(w); /* 1. acknowledgements and the rest of the Redis side of held jobs */
    if (w->id_lost)
        return;
    lap(&ph[PH_REDIS], &t);
    bool blocked = false;
    if (redis_open(w))
        phase_fetch(w, &blocked); /* 2. fetch, parse, route, add to the engine */
    lap(&ph[PH_FETCH], &t);
    bool has_work = engine_has_work(w->eng);
    if (has_work && redis_open(w))
        phase_cancel(w); /* 3. cancellations */
    lap(&ph[PH_CANCEL], &t);

    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    int running = st.running;
    if (has_work)
        phase_step(w, ph); /* 4. engine_step, 5. progress, 6. finished jobs become rows (timed inside) */
    t = llmq_mono_s();
    store_and_report(w, t); /* 6. rows committed on the writer thread; metrics */
    lap(&ph[PH_COMMIT], &t);

    if (has_work && !blocked) {
        timing_add(&w->stats.run_timing, ph, running, w->cfg->engine.max_num_seqs);
        timing_add(&w->stats.interval_timing, ph, running, w->cfg->engine.max_num_seqs);
    }
    /* waiting only on Redis or SQLite: do not spin */
    if (!has_work && !blocked && !engine_has_work(w->eng))
        sleep_ms(IDLE_SLEEP_MS);
}

/* ---- the end of a run */

/* Hands the jobs of a state back to the front of their queues (not counted as an attempt).
 * Jobs in COMMITTING stay in their list (the writer thread still reads their rows). */
static void requeue_state(struct wk *w, int state, const char *why)
{
    int n = jobs_of(w, state, -1);
    if (!n)
        return;
    for (int i = 0; i < n; i++)
        w->scratch.rjobs[i] = &w->scratch.jobs[i]->rj;
    int moved = rq_requeue(w->rq, w->scratch.rjobs, n, NULL, why);
    if (moved < 0) {
        redis_trouble(w, "handing jobs back");
        return;
    }
    w->stats.requeued += moved;
    for (int i = 0; i < n; i++) {
        struct wk_job *j = w->scratch.jobs[i];
        stop_seqs(w, j);
        if (state == WK_COMMITTING)
            j->after = WK_AFTER_NONE;
        else
            drop(w, j);
    }
}

/* After the loop: unfinished jobs back to the front of their queues, the last rows written and
 * acknowledged, the workers row marked stopped, the heartbeat removed. `hard` (a second signal):
 * finished jobs whose rows are not written yet are handed back too instead of waiting for SQLite.
 * While Redis does not answer, the rows are written and the worker waits EXIT_REDIS_WAIT_S for it,
 * then leaves what it holds in its processing list for another worker's reaper. */
static void finish_run(struct wk *w, bool hard)
{
    double until = llmq_mono_s() + (hard ? 2.0 : FLUSH_S);
    double redis_wait = llmq_mono_s() + EXIT_REDIS_WAIT_S;
    w->stopping = true; /* GET /health: 503 "stopping" from now on */
    if (w->stats.metrics.jobs_done) /* the last, partial interval */
        add_metrics_row(w, llmq_mono_s());
    publish(w, llmq_mono_s());
    int running = w->held[WK_RUNNING].n;
    if (running)
        log_info("worker: handing %d unfinished job%s back to the front of their queue", running,
                 running == 1 ? "" : "s");
    for (;;) {
        double now = llmq_mono_s();
        bool up = redis_up(w);
        if (up)
            requeue_state(w, WK_RUNNING, "shutdown");
        struct wk_batch *b = wk_writer_poll(w->store.writer);
        if (b)
            commit_done(w, b);
        if (hard && redis_open(w))
            requeue_state(w, WK_PENDING, "shutdown");
        if (!wk_writer_busy(w->store.writer) && now >= w->store.next_commit &&
            (w->held[WK_PENDING].n || !w->store.stopped_touch))
            commit_submit(w, true);
        redis_settle(w);
        if (held_count(w) == 0 && (w->store.stopped_touch || hard || w->store.unwritable_since > 0))
            break;
        bool rows_done = w->store.stopped_touch && !wk_writer_busy(w->store.writer) &&
                         (w->held[WK_PENDING].n == 0 || !wk_gate_leased(&w->redis.gate, now));
        /* Redis does not answer: what is held stays in the processing list */
        if (!redis_open(w) && now >= redis_wait && (rows_done || hard))
            break;
        if (now >= until) { /* rows that could not be written: their jobs run again elsewhere */
            if (redis_open(w))
                requeue_state(w, WK_PENDING, "shutdown");
            if (redis_open(w))
                requeue_state(w, WK_COMMITTING, "shutdown");
            break;
        }
        sleep_ms(IDLE_SLEEP_MS);
    }
    int left = held_count(w) - w->held[WK_COMMITTING].n;
    if (left > 0)
        log_warn("worker: %d job%s could not be handed back (Redis unreachable); they stay in %s and a live "
                 "worker's reaper returns them to their queue once this worker's heartbeat has lapsed (%d s)",
                 left, left == 1 ? "" : "s", w->rq->proc_key, w->cfg->worker.heartbeat_ttl_s);
    else if (!redis_open(w))
        log_warn("redis: unreachable at exit; the heartbeat is left to expire (%d s)",
                 w->cfg->worker.heartbeat_ttl_s);
    else if (rq_heartbeat_stop(w->rq))
        log_warn("redis: removing the heartbeat failed: %s", rq_error(w->rq));
}

/* ---- set-up */

/* The first connection to Redis. A --drain worker (a cron job) can do nothing without Redis and
 * must not wait for it forever: it tries for redis.start_timeout_s (--connect-timeout), then gives
 * up with one line and exit WK_EXIT_UNREACHABLE. A service worker starts anyway and keeps trying with
 * backoff, as after a lost connection: systemd would restart it only to do the same, and it is ready the
 * moment Redis is. A server that refuses the credentials (a wrong password, or none given) fails
 * the start of both with one line: the same password would be refused forever. 0, or -1 (after
 * the log line). */
static int redis_start(struct wk *w)
{
    const struct cfg *c = w->cfg;
    char url[600];
    rq_url_redact(c->redis.url, url, sizeof url);
    double t0 = llmq_mono_s();
    if (!w->opts.drain || c->redis.start_timeout_s == 0) {
        if (rq_connect(w->rq) && !rq_auth_refused(w->rq))
            log_warn("redis: %s; the worker starts anyway and keeps trying with backoff", rq_error(w->rq));
    } else {
        if (rq_connect_wait(w->rq, 1000 * c->redis.start_timeout_s, wk_signals_counter()) == 0) {
            if (llmq_mono_s() - t0 >= 1)
                log_info("redis: connected after %.1f s", llmq_mono_s() - t0);
            return 0;
        }
    }
    if (rq_auth_refused(w->rq)) { /* the same password would be refused forever */
        log_error(
            "redis %s refused the credentials: %s (redis.password, redis.url): the worker does not start",
            url, rq_error(w->rq));
        return -1;
    }
    if (!w->opts.drain || c->redis.start_timeout_s == 0)
        return 0;
    if (wk_signals_count()) {
        log_info("redis %s cannot be reached (%s) and %s came: exiting", url, rq_error(w->rq), wk_signals_last());
        w->start_stopped = true; /* a stop asked for: exit 0 */
    } else {
        log_error("redis %s cannot be reached: %s (for %.0f s; --connect-timeout, redis.start_timeout_s): a "
                  "--drain worker does not start without it",
                  url, rq_error(w->rq), llmq_mono_s() - t0);
        w->start_unreachable = true;
    }
    return -1;
}

/* Claims this worker id in Redis at start (the first heartbeat, queue/heartbeat.h): refused while
 * another live instance holds it, unless --force-id. Without Redis yet, the first heartbeat of the
 * loop claims it instead (and a refusal then stops the worker the same way). 0, or -1 (logged). */
static int claim_id(struct wk *w)
{
    if (!w->rq->cmd.ctx)
        return 0;
    int rc = rq_heartbeat(w->rq, NULL);
    if (rc == RQ_HB_TAKEN) {
        log_error("%s", rq_error(w->rq));
        return -1;
    }
    if (rc == 0 && w->rq->holder.instance[0])
        log_warn("worker %s: took the id over from host %s pid %lld", w->worker_id, w->rq->holder.host,
                 w->rq->holder.pid);
    return 0;
}

/* Whether a stop signal came during set-up: then the worker exits 0 before `next` (a model load can
 * take minutes). */
static bool start_stop(struct wk *w, const char *next)
{
    if (!wk_signals_count())
        return false;
    log_info("received %s while starting: exiting before %s", wk_signals_last(), next);
    w->start_stopped = true;
    return true;
}

static int setup(struct wk *w)
{
    const struct cfg *c = w->cfg;
    char err[1024];
    /* Redis first: a cron job without Redis fails before it loads a model */
    struct rq_opts ro;
    cfg_rq_opts(&ro, c);
    ro.force_id = w->opts.force_id;
    if (rq_open(&ro, &w->rq, err, sizeof err)) {
        log_error("redis: %s", err);
        return -1;
    }
    snprintf(w->worker_id, sizeof w->worker_id, "%s", rq_worker_id(w->rq));
    char probe_name[RQ_NAME_MAX + 16];
    snprintf(probe_name, sizeof probe_name, "llmq:%s:probe", w->worker_id);
    if (wk_gate_start(&w->redis.gate, &w->rq->cmd, probe_name, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    w->tpl = tpl_source_new(c, w->rq);
    if (!w->tpl) {
        log_error("out of memory");
        return -1;
    }
    rq_pipe_init(&w->fetch.pipe);
    wk_stream_init(&w->stream, c->redis.stream_interval_ms);
    if (redis_start(w) || claim_id(w) || start_stop(w, "loading the model"))
        return -1;

    w->model = model_load(c->model.path, err, sizeof err);
    if (!w->model) {
        log_error("model %s: %s", c->model.path, err);
        return -1;
    }
    const char *tok_dir = c->model.tokenizer[0] ? c->model.tokenizer : c->model.path;
    w->tok = tok_load_dir(tok_dir, err, sizeof err);
    if (!w->tok) {
        log_error("tokenizer %s: %s", tok_dir, err);
        return -1;
    }
    w->chat = chat_template_load(tok_dir, c->model.chat_template, err, sizeof err);
    if (!w->chat) {
        log_error("model %s: %s", c->model.path, err);
        return -1;
    }
    if (chat_template_present(w->chat))
        log_info("chat template: %s", chat_template_origin(w->chat));
    else
        log_warn("the model has no chat template: jobs with messages will fail (set model.chat_template)");
    struct engine_opts eo = engine_cfg_opts(c);
    engine_cfg_lanes(&eo, c);
    struct backend *be = backend_open(engine_cfg_backend(c), w->model, &eo.be, err, sizeof err);
    w->eng = be ? engine_open(w->model, w->tok, be, &eo, err, sizeof err) : NULL;
    if (!w->eng) {
        log_error("engine: %s", err);
        return -1;
    }
    engine_set_on_start(w->eng, on_start, w);
    w->grammars = grammar_cache_new();
    if (!w->grammars) {
        log_error("out of memory");
        return -1;
    }
    if (start_stop(w, "opening the database"))
        return -1;
    if (wk_lanes_init(&w->lanes, c, w->eng, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    engine_cfg_model_name(c, w->model_name, sizeof w->model_name);
    wk_models_init(&w->models, w->model_name, c->model.aliases, err, sizeof err);
    if (err[0])
        log_warn("%s", err);
    const char *backend = engine_backend_name(w->eng);
    if (!strcmp(backend, "cpu") || gpu_describe(w->gpu, sizeof w->gpu))
        snprintf(w->gpu, sizeof w->gpu, "cpu");

    w->jopts = job_opts_default();
    job_defaults_from_cfg(&w->jopts.defaults, &c->sampling);
    if (c->sampling.use_generation_config)
        job_defaults_from_model(&w->jopts.defaults, &w->model->cfg, w->model->dir);
    w->jopts.max_bytes = c->queues.max_job_bytes;
    w->jopts.template_find = tpl_source_find;
    w->jopts.template_ctx = w->tpl;
    w->jopts.template_where = "in the config or published in Redis";

    struct db_opts dbo = db_opts_default();
    dbo.busy_timeout_ms = c->sqlite.busy_timeout_ms;
    struct db *db = NULL;
    bool no_db = !c->sqlite.path[0]; /* rows only on the result streams (cfg_validate: enabled) */
    if (!no_db && db_open(c->sqlite.path, &dbo, &db, err, sizeof err)) {
        log_error("sqlite: %s", err);
        return -1;
    }
    if (no_db)
        log_info("sqlite: no local database (sqlite.path \"\"): a job's row is only on %s once it is "
                 "acknowledged, until a collector has it",
                 w->rq->keys.results);
    if (wk_writer_start(db, &w->store.writer, err, sizeof err)) {
        db_close(db);
        log_error("%s", err);
        return -1;
    }
    /* jobs a lapsed worker (or this id's previous run) committed but did not acknowledge */
    w->store.committed = no_db ? NULL
                               : wk_committed_open(c->sqlite.path, c->sqlite.busy_timeout_ms,
                                                   c->redis.result_max_bytes, err, sizeof err);
    if (w->store.committed)
        rq_reap_set_lookup(w->rq, wk_committed_lookup, w->store.committed);
    else if (!no_db)
        log_warn("sqlite: %s (read-only); the reaper cannot see committed rows: jobs committed but not "
                 "acknowledged by a crashed worker are run again",
                 err);

    w->store.rows = calloc(MAX_BATCH, sizeof *w->store.rows);
    w->store.row_rc = calloc(MAX_BATCH, sizeof *w->store.row_rc);
    w->store.row_jobs = calloc(MAX_BATCH, sizeof *w->store.row_jobs);
    if (!w->store.rows || !w->store.row_rc || !w->store.row_jobs || grow_scratch(w, 1024)) {
        log_error("out of memory");
        return -1;
    }
    if (gethostname(w->host, sizeof w->host) != 0)
        snprintf(w->host, sizeof w->host, "localhost");
    w->host[sizeof w->host - 1] = 0;
    w->store.worker_row = (struct db_worker){
        .id = w->worker_id,
        .host = w->host,
        .pid = (int64_t)getpid(),
        .gpu = strcmp(w->gpu, "cpu") ? w->gpu : NULL,
        .model = w->model_name,
        .backend = backend,
        .version = LLMQ_VERSION,
    };
    w->ctx = (struct wk_ctx){.model_name = w->model_name, .worker_id = w->worker_id, .tok = w->tok};
    struct engine_stats st;
    engine_get_stats(w->eng, &st);
    double now = llmq_mono_s();
    wk_metrics_init(&w->stats.metrics, now, &st);
    w->stats.next_row = now + c->metrics.interval_s;
    w->stats.last_tokens_per_s = 0;
    w->fetch.empty_wait = EMPTY_FETCH_S;
    char where[300];
    rq_conn_describe(&w->rq->cmd, where, sizeof where);
    log_info("worker %s: model %s (%s backend, serves %s), queues %s (short lane %d seqs, long lane %d seqs, "
             "long threshold "
             "%d tokens), redis %s prefix %s, sqlite %s%s",
             w->worker_id, w->model_name, backend, w->models.n ? w->models.csv : "no model queue",
             c->worker.queues, c->queues.short_max_num_seqs, c->queues.long_max_num_seqs,
             c->queues.long_threshold_tokens, where, c->redis.prefix, c->sqlite.path,
             w->opts.drain ? ", drain mode" : "");
    w->gpu_mem_bytes = -1; /* not on the CPU backend (docs/METRICS.md) */
#ifdef LLMQ_HAVE_CUDA_BACKEND
    struct cuda_backend_stats cs; /* allocated once at open: weights, KV pool, activations, workspaces */
    if (cuda_backend_get_stats(engine_backend(w->eng), &cs) == 0)
        w->gpu_mem_bytes = cs.alloc_bytes;
#endif
    if (c->metrics.enabled) {
        struct wk_snapshot *s = &w->stats.snapshot;
        snprintf(s->worker_id, sizeof s->worker_id, "%s", w->worker_id);
        snprintf(s->model, sizeof s->model, "%s", w->model_name);
        snprintf(s->backend, sizeof s->backend, "%.*s", (int)sizeof s->backend - 1, backend);
        snprintf(s->version, sizeof s->version, "%s", LLMQ_VERSION);
        s->started_at = w->rq->started_at;
        s->gpu_mem_bytes = w->gpu_mem_bytes;
        if (wk_http_start(c->metrics.listen_address, c->metrics.port, &w->stats.http, err, sizeof err)) {
            log_warn("%s; the worker runs without GET /metrics and /health", err);
        } else {
            read_redis_figures(w); /* the Redis gauges from the first scrape on, not after an interval */
            publish(w, now);
            log_info("metrics: http://%s%s%s:%d/metrics and /health",
                     strchr(c->metrics.listen_address, ':') ? "[" : "", c->metrics.listen_address,
                     strchr(c->metrics.listen_address, ':') ? "]" : "", wk_http_port(w->stats.http));
        }
    }
    return 0;
}

static void teardown(struct wk *w)
{
    wk_http_stop(w->stats.http);
    w->stats.http = NULL;
    /* a writer stuck on a lock keeps reading its batch: then that memory is left to the exit */
    int stuck = wk_writer_stop(w->store.writer, 2000);
    if (stuck)
        log_warn("sqlite: the last write is still waiting for a lock; exiting without it (its jobs were "
                 "handed back)");
    if (w->rq)
        rq_reap_set_lookup(w->rq, NULL, NULL);
    wk_part_rows_free(&w->store.parts);
    wk_committed_close(w->store.committed);
    w->store.committed = NULL;
    for (int s = 0; s < WK_NSTATES; s++)
        while (w->held[s].head) {
            if (stuck && s == WK_COMMITTING) {
                list_remove(&w->held[s], w->held[s].head);
                continue;
            }
            drop(w, wk_job_of(w->held[s].head));
        }
    rq_pipe_free(&w->fetch.pipe);
    wk_stream_free(&w->stream);
    tpl_source_free(w->tpl);
    wk_gate_stop(&w->redis.gate);
    rq_free(w->rq);
    grammar_cache_free(w->grammars);
    engine_free(w->eng);
    tok_free(w->tok);
    chat_template_free(w->chat);
    model_free(w->model);
    wk_metrics_free(&w->stats.metrics);
    free(w->stats.run_timing.ovh.v);
    free(w->stats.interval_timing.ovh.v);
    free(w->fetch.jobs);
    free(w->fetch.hash_keys);
    free(w->scratch.results);
    free(w->scratch.jobs);
    free(w->counting);
    free(w->scratch.ids);
    free(w->scratch.flags);
    free(w->scratch.progress);
    free(w->scratch.rjobs);
    free(w->drain.told);
    if (!stuck) {
        free(w->store.rows);
        free(w->store.row_rc);
        free(w->store.row_jobs);
        batch_rows_drop(&w->store, w->store.n_batch_rows);
    }
}

/* --drain: logs once per worker what the drain waits for in its list. */
static void drain_tell(struct wk *w, const struct rq_drain_holder *h)
{
    struct wk_drain *d = &w->drain;
    for (size_t i = 0; i < d->ntold; i++)
        if (!strcmp(d->told[i], h->id))
            return;
    if (array_reserve(&d->told, &d->cap, d->ntold + 1, sizeof *d->told, 8) == 0)
        snprintf(d->told[d->ntold++], sizeof *d->told, "%s", h->id);
    char proc[RQ_KEY_MAX];
    rq_key_processing(&w->rq->keys, h->id, proc, sizeof proc);
    if (h->lapse_ms >= 0)
        log_info("drain: waiting for worker %s: %lld job%s in %s; it may still finish them, and if it has "
                 "died its heartbeat lapses within %.1f s, then they are reaped and run here",
                 h->id, (long long)h->jobs, h->jobs == 1 ? "" : "s", proc, h->lapse_ms / 1e3);
    else if (h->lapse_ms == -1)
        log_warn(
            "drain: waiting for worker %s: %lld job%s in %s, and its heartbeat has no TTL (set by hand?): "
            "it never lapses, so only that worker can finish them",
            h->id, (long long)h->jobs, h->jobs == 1 ? "" : "s", proc);
}

/* --drain: whether there is nothing left anywhere (two round trips). Jobs in another worker's list
 * keep it waiting, whether that worker is alive (it may die with them) or lapsed (the reaper puts
 * them back); the reaper runs as soon as the first holder's heartbeat can have lapsed. */
static bool drained(struct wk *w)
{
    if (!redis_open(w))
        return false;
    const char *queues[WK_NLANES * (WK_MAX_SERVED + 1)];
    int nq = wk_models_queues(&w->models, &w->lanes, queues);
    struct rq_drain d;
    if (rq_drain_check(w->rq, queues, nq, &d)) {
        rq_drain_free(&d);
        redis_trouble(w, "checking the queues");
        return false;
    }
    bool done = rq_drain_done(&d);
    int64_t reap_in = -1;
    for (int i = 0; i < d.nholders; i++) {
        const struct rq_drain_holder *h = &d.holders[i];
        drain_tell(w, h);
        int64_t in = h->lapse_ms == -2 ? 0 : h->lapse_ms + 10; /* a key is gone once its PTTL ran out */
        if (h->lapse_ms != -1 && (reap_in < 0 || in < reap_in))
            reap_in = in;
    }
    if (reap_in >= 0)
        rq_tick_reap_in(w->rq, reap_in);
    rq_drain_free(&d);
    return done;
}

int wk_run(const struct cfg *c, const struct wk_opts *o)
{
    struct wk *w = calloc(1, sizeof *w);
    if (!w) {
        log_error("out of memory");
        return 1;
    }
    w->cfg = c;
    w->opts = *o;
    for (int s = 0; s < WK_NSTATES; s++)
        memset(&w->held[s], 0, sizeof w->held[s]);
    log_set_level((enum log_level)c->worker.log_level);

    wk_signals_catch(); /* cmd_worker did already, before reading the config */

    if (setup(w)) {
        /* nothing was fetched: the heartbeat goes, and an earlier run's list to the reaper */
        if (w->rq && w->rq->claimed && rq_heartbeat_stop(w->rq))
            log_warn("redis: removing the heartbeat failed: %s", rq_error(w->rq));
        int rc = w->start_stopped ? 0 : w->start_unreachable ? WK_EXIT_UNREACHABLE : 1;
        teardown(w);
        free(w);
        return rc;
    }
    double t_start = llmq_mono_s();
    bool hard = false;
    for (;;) {
        if (w->id_lost)
            break;
        int sigs = wk_signals_count();
        if (sigs >= 2) {
            log_warn("received %s again: handing everything back now", wk_signals_last());
            hard = true;
            break;
        }
        if (sigs == 1 && !w->stopping) {
            w->stopping = true;
            w->stop_deadline = llmq_mono_s() + c->worker.shutdown_timeout_s;
            log_info(
                "received %s: not fetching any more; finishing %d running job%s (up to %d s), then handing "
                "back the rest (send it again to stop at once)",
                wk_signals_last(), w->held[WK_RUNNING].n,
                w->held[WK_RUNNING].n == 1 ? "" : "s", c->worker.shutdown_timeout_s);
        }
        if (w->stopping && (!engine_has_work(w->eng) || llmq_mono_s() >= w->stop_deadline)) {
            if (engine_has_work(w->eng))
                log_info("worker: shutdown_timeout_s (%d s) is over", c->worker.shutdown_timeout_s);
            break;
        }
        iterate(w);
        if (w->opts.drain && !w->stopping && held_count(w) == 0 && !engine_has_work(w->eng) &&
            w->fetch.recovered && w->fetch.last_empty > 0 && drained(w)) {
            log_info("drain: the queues, the retry set and every worker's list are empty and nothing runs: "
                     "exiting");
            break;
        }
    }
    if (!w->id_lost)
        finish_run(w, hard);
    double dt = llmq_mono_s() - t_start;
    /* a developer's figure: at debug level, or with --stats */
    timing_line(w->opts.stats ? LOG_INFO : LOG_DEBUG, "worker stats", &w->stats.run_timing);
    /* a cron job learns from the status that jobs failed; a service is only told how it stopped */
    int status = w->exit_code                                       ? w->exit_code
                 : w->opts.drain && (w->stats.failed || w->stats.dead) ? WK_EXIT_JOBS_FAILED
                                                                       : 0;
    char tail[96] = "";
    if (w->opts.drain)
        snprintf(tail, sizeof tail, "; exit status %d%s", status,
                 status ? " (jobs failed or were dead-lettered)" : "");
    log_info(
        "worker %s stopped after %.1f s: %lld jobs done (%lld completed, %lld failed, %lld cancelled), %lld "
        "dead-lettered (%lld reaped from crashed workers), %lld retried, %lld moved to the long queue, %lld "
        "moved to their model's queue, %lld handed back%s",
        w->worker_id, dt, (long long)w->stats.done, (long long)w->stats.completed, (long long)w->stats.failed,
        (long long)w->stats.cancelled, (long long)w->stats.dead, (long long)w->stats.reaped_dead,
        (long long)w->stats.retried, (long long)w->stats.routed, (long long)w->stats.routed_model,
        (long long)w->stats.requeued, tail);
    teardown(w);
    free(w);
    return status;
}
