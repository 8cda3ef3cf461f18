/* Merging one llmq database into another (`llmq collect --from-db`): the rows of a worker's file
 * go into a central one under the same rules as a worker's own writes (db.h), so that merging is
 * idempotent and does not depend on the order of the sources.
 *
 * For each job id the target ends with the row that ranks highest: completed > cancelled > failed,
 * among equal statuses the later finished_at (then the greater worker_id); attempts is the largest
 * any copy had. A source row identical to the target's is not written. Rows are written through
 * db_put_results, so the upsert's rules hold for every write. For each batch id the target ends
 * with the row furthest along: its state (queued < running < completed, cancelled), then the later
 * finished_at, then the larger total (a batch grows with `enqueue --append`); a column that row
 * lacks is filled in from the other. A worker row ends as the latest (started_at, then
 * last_seen_at: a restart, then a later heartbeat), updated in place so that its metrics stay; a
 * worker_metrics row is added when the target has none for its (worker_id, ts), and one there
 * already is kept (the same worker id on two hosts is a misconfiguration: the first merged wins).
 * job_parts (partial map-reduce summaries, a worker's own resume state) are not merged. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct db;
struct db_result;
struct db_batch;
struct db_worker_row;
struct db_metrics;

/* Rows of one table: read from the source; written into the target (new, replacing, or raising
 * attempts); kept (the target's row was the same or ranks higher: nothing written). */
struct merge_count {
    int64_t read, written, kept;
    int64_t rejected; /* jobs: rows the target refused (a rule of its schema); the others are written */
};

struct merge_stats {
    struct merge_count jobs, batches, workers, metrics;
};

/* Merges the llmq database at source_path into target (opened read-write with db_open), writing
 * at most batch_rows rows per transaction (0 = 1000). The source is opened read-only and never
 * changed; one with an older schema is first copied (VACUUM INTO a temporary file beside the
 * target, removed afterwards) and the copy migrated. Refused, with err naming the file: a source
 * that is the target's file, that does not exist, is not an llmq database, or has a newer schema.
 * *st (zeroed first) counts the rows, also of a merge that failed part way (the transactions
 * committed before the failure stay: merging again completes it). A jobs row the target refuses
 * is left out and counted (st->jobs.rejected): the merge goes on, and then returns -1 with err
 * saying how many. Returns 0, or -1 with err. */
int merge_db(struct db *target, const char *source_path, size_t batch_rows, struct merge_stats *st, char *err,
             size_t errlen);

/* Merging rows one at a time (`llmq collect --redis`: rows from the result streams), under the
 * same rules. Rows are copied; they are written merge's batch_rows at a time, the rest by
 * merge_flush, so what is committed is known only after merge_flush returns 0.
 *
 *     struct merge *m = merge_open(db, 1000, &st, err, sizeof err);
 *     merge_add_job(m, &row) ... merge_add_metrics(m, &mrow) ...
 *     if (merge_flush(m) == 0) ... everything added is committed ...
 *     merge_close(m);
 *
 * Each call returns 0, or -1 with err (given to merge_open) set; a failed call may have
 * committed some of the rows added before it (merging them again is harmless). */
struct merge;
/* NULL (with err) when out of memory. st is zeroed and counts every row added. */
struct merge *merge_open(struct db *target, size_t batch_rows, struct merge_stats *st, char *err,
                         size_t errlen);
/* A jobs row (its `batch` is not written: add it with merge_add_batch). */
int merge_add_job(struct merge *m, const struct db_result *row);
/* A batches row. */
int merge_add_batch(struct merge *m, const struct db_batch *row);
/* A workers row: written at once (a later row of the same worker then ranks against it). */
int merge_add_worker(struct merge *m, const struct db_worker_row *row);
/* A worker_metrics row; when the target has no row for its worker, a placeholder workers row
 * (started_at 0, the rest NULL) is written first, which the worker's own row replaces when it
 * comes. */
int merge_add_metrics(struct merge *m, const struct db_metrics *row);
/* Writes what is pending. A jobs row the target refuses (db_put_results: DB_ERR_ROW) does not fail
 * the call: it is counted in st->jobs.rejected and the others are written. */
int merge_flush(struct merge *m);
/* Why the first refused row was refused ("" when none was). Borrowed from m. */
const char *merge_rejected(const struct merge *m);
/* Frees m, dropping what is pending unwritten. Accepts NULL. */
void merge_close(struct merge *m);
