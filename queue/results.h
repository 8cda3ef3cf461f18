/* The result streams: the rows of a fleet's workers on their way to one central database.
 *
 *   <p>:results         stream  one entry per finished job: id <job id>, worker <worker id>,
 *                               row <the jobs row as JSON: worker/store/row_json.h>
 *   <p>:metrics         stream  kind "worker" (a workers row) or "metrics" (a worker_metrics row),
 *                               worker <worker id>, row <JSON>
 *   <p>:stream-dropped  hash    results / metrics: entries the length cap removed
 *
 * A worker with results_stream.enabled publishes a job's row in the same script that
 * acknowledges the job (queue/ack.h, queue/dead.h, the reaper's committed rows), so a row is in
 * the stream exactly when its job is acknowledged; rq_results_publish is for rows committed after
 * Redis already let their job go, rq_metrics_publish for the metrics stream. Each add keeps the
 * stream at most results_maxlen entries long (0 = no cap): past it the oldest entries are removed
 * (XTRIM MAXLEN, exact) and counted in <p>:stream-dropped. `llmq collect --redis` reads the
 * streams through consumer groups (queue/collect.h) and trims what every group acknowledged. */
#pragma once
#include <stddef.h>

struct rq;

/* A row to publish: the job's (or worker's) id and the row's JSON text. json NULL = none. Both
 * borrowed for the call. */
struct rq_row {
    const char *id;
    const char *json;
};

/* Whether q publishes rows (rq_opts.results_maxlen >= 0). */
int rq_results_on(const struct rq *q);

/* Adds rows[0..n) to <p>:results in one script call (fields id, worker, row). Nothing when q
 * publishes no rows. 0, or -1 (rq_error; nothing added). */
int rq_results_publish(struct rq *q, const struct rq_row *rows, int n);

/* Adds rows[0..n) to <p>:metrics, kinds[i] "worker" or "metrics" (fields kind, worker: rows[i].id,
 * row). Nothing when q publishes no rows. 0, or -1 (rq_error; nothing added). */
int rq_metrics_publish(struct rq *q, const char *const *kinds, const struct rq_row *rows, int n);
