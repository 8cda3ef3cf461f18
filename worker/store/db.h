/* The SQLite store: finished jobs, workers and their per-interval metrics.
 *
 * The schema is schemas/NNN_<name>.sql, embedded into the binary (schemas/CMakeLists.txt) and
 * applied by db_open; docs/SQLITE.md describes the tables for users. Connections use WAL,
 * synchronous=NORMAL, busy_timeout and foreign_keys=ON.
 *
 * Usage (the worker):
 *
 *     struct db *db;
 *     struct db_opts o = db_opts_default();
 *     o.busy_timeout_ms = cfg.sqlite.busy_timeout_ms;
 *     if (db_open(cfg.sqlite.path, &o, &db, err, sizeof err)) { log(err); return 1; }
 *     ...
 *     struct db_result r[256];                  // r[i] = db_result_empty(), then fill in
 *     int rc = db_put_results(db, r, n, row_rc); // one transaction
 *     if (rc == DB_BUSY)  keep the jobs in the processing list, try again later (nothing written)
 *     else if (rc == DB_ERR) log(db_errmsg(db)); nothing written; the same
 *     else if (rc == DB_UNWRITABLE) nothing written, and waiting will not mend it: hand the jobs back
 *     else ack every job; rows with row_rc[i] == DB_ERR_ROW were rejected (rc was DB_ERR_ROW)
 *     db_close(db);
 *
 * Delivery is at-least-once, so one job id may be written more than once (a replay after a crash
 * between commit and ack, a job reaped from a worker that was slow rather than dead). The row for
 * an id always reflects its most useful processing:
 *   - a write replaces the row when its status ranks at least as high as the row's, with
 *     completed > cancelled > failed; among equals the later write wins (the last processing);
 *   - otherwise the row is kept (a completed result is never replaced by a failed or cancelled
 *     replay, a cancellation is not replaced by a later failure);
 *   - attempts is always the larger of the two.
 *
 * A struct db is used by one thread at a time; open one per thread that needs one. Error messages
 * name the database path and carry SQLite's message; the last one stays on the handle
 * (db_errmsg) until the next failing call. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct db;
struct sqlite3;

/* Return codes (0 = ok). */
enum {
    DB_OK = 0,
    DB_ERR = -1,        /* failed; nothing of this call was written */
    DB_BUSY = -2,       /* the database stayed locked by another connection past every retry of this
                           call; nothing was written, try again later */
    DB_ERR_ROW = -3,    /* db_put_results: some rows were rejected (row_rc), the others committed */
    DB_ERR_NEWER = -4,  /* db_open: the database's schema is newer than this binary knows */
    DB_UNWRITABLE = -5, /* the database cannot be written and retrying soon will not mend it: a
                          read-only file, directory or file system, no permission, an I/O error,
                          a file that cannot be opened or created; nothing was written */
    DB_ERR_OLDER = -6   /* db_open, readonly: the database's schema is older than this binary's (a
                           read-write open would migrate it) */
};

/* One embedded migration; db_migrations[i].version == i + 1. */
struct db_migration {
    int version;      /* its PRAGMA user_version once applied */
    const char *name; /* "001_init" */
    const char *sql;  /* the file's text */
};
/* schemas/NNN_<name>.sql, in order (generated at build time). */
extern const struct db_migration db_migrations[];
extern const int db_n_migrations;

struct db_opts {
    int busy_timeout_ms; /* PRAGMA busy_timeout: how long one SQLite call waits for a lock (5000) */
    int busy_retries;    /* after that, how many more times a write call tries, with backoff (2) */
    int backoff_ms;      /* first backoff; doubles each retry, at most 1 s, with jitter (50) */
    bool readonly;       /* open for reading (exports): no creating, no migrating, writes fail */
    /* The migrations to apply; NULL = the embedded ones (tests pass their own lists). */
    const struct db_migration *migrations;
    int n_migrations;
};
struct db_opts db_opts_default(void);

/* Opens (creating if needed, unless readonly) the database at `path` and brings its schema up to
 * date: each missing migration runs in its own transaction. A read-write open then writes once
 * (a transaction that rewrites PRAGMA user_version) so that a database this process cannot write
 * fails here (DB_UNWRITABLE), and notes which files the path, its -wal and its -shm are (for
 * db_file_moved). Fails on a database whose schema is newer than this binary's (DB_ERR_NEWER), a
 * file that is not a SQLite database, or a database of another program (tables, but no llmq
 * schema); a readonly open also on an older schema (DB_ERR_OLDER). o may be NULL (defaults). On
 * success *out is the handle (the caller owns it: db_close); on failure *out is NULL, err says why
 * (it starts with the path) and the return value is DB_ERR, DB_BUSY, DB_ERR_NEWER, DB_ERR_OLDER or
 * DB_UNWRITABLE. */
int db_open(const char *path, const struct db_opts *o, struct db **out, char *err, size_t errlen);

/* Read-write handles: whether the path (or its -wal or -shm) no longer names the file the
 * connection writes: deleted or replaced since db_open / db_reopen. Such a connection still
 * commits, into a file nobody will see again. True (with db_errmsg naming the file) also for a
 * handle whose db_reopen failed; false for a file that could not be noted (in memory). */
bool db_file_moved(struct db *db);

/* Read-write handles: closes the connection, leaving the files at the path as they are (SQLite
 * would otherwise delete <path>-wal and -shm at close), and opens the path again as db_open does
 * (creating the file and its schema). DB_OK; or DB_UNWRITABLE / DB_BUSY with db_errmsg, the
 * handle then left closed: every write fails with DB_UNWRITABLE until a db_reopen succeeds. */
int db_reopen(struct db *db);

/* Finalizes the cached statements and closes the connection. Accepts NULL. */
void db_close(struct db *db);

/* The last error on this handle ("" if none); valid until the next call on the handle. */
const char *db_errmsg(const struct db *db);
/* The path given to db_open (borrowed, lives as long as the handle). */
const char *db_path(const struct db *db);
/* The schema version (PRAGMA user_version) after db_open. */
int db_schema_version(const struct db *db);
/* The underlying connection, for tests and ad-hoc queries (borrowed; do not close it). */
struct sqlite3 *db_handle(struct db *db);

/* Unix time in seconds, with fractions (CLOCK_REALTIME). */
double db_now(void);

/* ---- jobs */

enum db_status { DB_COMPLETED, DB_FAILED, DB_CANCELLED };
/* "completed", "failed", "cancelled"; NULL when out of range. */
const char *db_status_name(int status);
/* The enum for a name, or -1. */
int db_status_from_name(const char *name);
/* The rank of a status in the upsert (completed 2 > cancelled 1 > failed 0). */
int db_status_rank(int status);

enum db_form { DB_FORM_LLMQ, DB_FORM_OPENAI };

/* One row of `batches` (schemas/003_batches.sql). Strings are borrowed: NULL is SQL NULL (and,
 * in db_put_batches, leaves the column as it is); reals: NAN; total: < 0. */
struct db_batch {
    const char *id; /* required */
    const char *input;
    double created_at;
    int64_t total;
    const char *state; /* "queued", "running", "completed", "cancelled" */
    double finished_at;
};
/* Every string NULL, every real NAN, total -1. */
struct db_batch db_batch_empty(void);

/* One row of `jobs` (docs/SQLITE.md and schemas/NNN_*.sql say what each column means).
 * Strings are borrowed: NULL is SQL NULL. Reals: NAN is SQL NULL. */
struct db_result {
    const char *id; /* required */
    const char *custom_id;
    const char *queue;
    enum db_status status;
    const char *model;
    const char *params; /* JSON text */
    const char *output; /* generated text: output_len bytes (0 = up to the NUL) */
    size_t output_len;
    const char *finish_reason;
    int64_t prompt_tokens, completion_tokens;
    const char *error;
    int64_t attempts;
    const char *worker_id;
    double created_at, started_at, first_token_at, finished_at; /* Unix seconds; finished_at required */
    double ttft_ms, latency_ms, queue_ms;
    const char *metadata; /* JSON text */
    const char *result;   /* the result line (JSON) */
    enum db_form request_form;
    /* schemas/003_batches.sql */
    const char *batch_id;
    const char *request; /* the job as received: request_len bytes (0 = up to the NUL) */
    size_t request_len;
    const char *error_code; /* NULL for completed */
    /* schemas/004_reasoning.sql */
    const char *reasoning; /* the think block's text: reasoning_len bytes (0 = up to the NUL); NULL = none */
    size_t reasoning_len;
    int64_t reasoning_tokens; /* < 0 is NULL (no reasoning) */
    /* schemas/005_structured_output.sql */
    const char *output_json; /* JSON text of a json_schema / json_object job's answer (stored minified);
                                NULL = none */
    /* not a column: the row's batch, inserted into `batches` unless it is there (NULL = none) */
    const struct db_batch *batch;
};
/* A row with every string NULL, every real NAN, counts 0 (reasoning_tokens -1), attempts 1, status
 * completed, form llmq. */
struct db_result db_result_empty(void);

/* A copy of r in one malloc'd block (the struct, then its strings), so that it outlives the
 * callback that lent it; `batch` is not copied (NULL). Free it with free(). NULL when out of
 * memory. */
struct db_result *db_result_dup(const struct db_result *r);

/* Whether a and b hold the same value in every column of `jobs` (NULL equals NULL). */
bool db_result_same(const struct db_result *a, const struct db_result *b);

/* Writes rows[0..n) in one transaction (BEGIN IMMEDIATE ... COMMIT), each as the upsert described
 * at the top of this file, with its `batch` inserted first when `batches` has no row for it (a
 * row that is there only gets the columns it lacks; a batch row SQLite refuses is left out). A row is
 * rejected, and the others still written, when it breaks a rule of the schema (no id, bad status, finished_at
 * missing, JSON that does not parse, ...); row_rc (NULL, or n entries) then says which: 0 written, DB_ERR_ROW
 * rejected, and db_errmsg names the first one. Returns DB_OK, DB_ERR_ROW, DB_BUSY (locked past the retries:
 * nothing written) or DB_ERR (nothing written). n == 0 is a no-op. */
int db_put_results(struct db *db, const struct db_result *rows, size_t n, int *row_rc);

/* Writes batch rows in one transaction: a new id is inserted, a known one gets the columns that
 * are given (state, finished_at and total; input and created_at only where they are NULL).
 * Returns DB_OK, DB_BUSY or DB_ERR (nothing written: a row without an id fails the call). */
int db_put_batches(struct db *db, const struct db_batch *rows, size_t n);

/* Called once per batch row; the row and its strings are borrowed for the call only. Return 0 to
 * go on, anything else to stop. */
typedef int (*db_batch_fn)(void *ctx, const struct db_batch *batch);

/* Streams the rows of `batches` to fn, by id; only the row of `id` when id is not NULL. Returns
 * 0, fn's nonzero value, or DB_ERR / DB_BUSY with db_errmsg. */
int db_query_batches(struct db *db, const char *id, db_batch_fn fn, void *ctx);

/* One row of `job_parts` (schemas/006_job_parts.sql): a committed partial summary of a map-reduce
 * job (worker/jobs/summarize.h). Strings are borrowed; finish_reason and worker_id may be NULL. */
struct db_part {
    const char *job_id; /* required */
    int64_t level, part;
    const char *plan; /* required: the job's plan id */
    int64_t first, last, doc_start, doc_end;
    const char *output; /* output_len bytes (0 = up to the NUL); required */
    size_t output_len;
    int64_t prompt_tokens, completion_tokens;
    const char *finish_reason;
    const char *worker_id;
    double created_at; /* required */
};

/* Writes parts[0..n) in one transaction. A part replaces the row of the same (job_id, level, part);
 * rows of the same job under another plan are deleted first (the job was sent again with another
 * document or options). Returns DB_OK, DB_BUSY, DB_UNWRITABLE or DB_ERR (nothing written; a row
 * without job_id, plan or output fails the call). n == 0 is a no-op. */
int db_put_parts(struct db *db, const struct db_part *parts, size_t n);

/* Called once per part row; the row and its strings are borrowed for the call only. Return 0 to go
 * on, anything else to stop. */
typedef int (*db_part_fn)(void *ctx, const struct db_part *part);

/* Streams the parts of job `job_id` under `plan` to fn, by level then part. Returns 0, fn's nonzero
 * value, or DB_ERR / DB_BUSY with db_errmsg. */
int db_get_parts(struct db *db, const char *job_id, const char *plan, db_part_fn fn, void *ctx);

/* Which rows db_query_results returns, in order of finished_at, then id. */
struct db_query {
    int status;            /* an enum db_status, or -1 for all */
    double since, until;   /* finished_at >= since, < until; NAN = unbounded */
    const char *id;        /* only this job id (NULL = any) */
    const char *custom_id; /* only this custom_id (NULL = any) */
    const char *batch_id;  /* only this batch (NULL = any) */
    int form;              /* an enum db_form, or -1 for all */
    int64_t limit;         /* at most this many rows; 0 = all */
};
/* status -1, since and until NAN, no ids, form -1, no limit. */
struct db_query db_query_all(void);

/* Called once per row; the row and its strings are borrowed for the call only. Return 0 to go
 * on, anything else to stop (db_query_results then returns that value). */
typedef int (*db_row_fn)(void *ctx, const struct db_result *row);

/* Streams the matching rows to fn, from one read snapshot (WAL: writers are not blocked).
 * Returns 0, fn's nonzero value, or DB_ERR / DB_BUSY with db_errmsg. */
int db_query_results(struct db *db, const struct db_query *q, db_row_fn fn, void *ctx);

/* Streams to fn the nth newest (nth from 1) failed row that worker_id wrote for a job line
 * without an id: its stored request is exactly line[0..len). For the reaper, which must not fail
 * such a line a second time into a second row (worker/loop/committed.h). Scans the failed rows
 * (the status index), so it costs what they number. Returns 0 (fn not called: none), fn's nonzero
 * value, or DB_ERR / DB_BUSY with db_errmsg. */
int db_find_failed_line(struct db *db, const char *worker_id, const char *line, size_t len, int nth, db_row_fn fn,
                        void *ctx);

/* ---- workers and metrics */

struct db_worker {
    const char *id; /* required */
    const char *host;
    int64_t pid;
    const char *gpu, *model, *backend, *version;
    double started_at; /* Unix seconds; also the first last_seen_at */
};
/* Inserts the worker, or resets the row of a worker that restarts under the same id (jobs_done 0,
 * stopped_at NULL). */
int db_put_worker(struct db *db, const struct db_worker *w);

/* One row of `workers` as stored: what db_put_worker wrote and db_touch_worker updated since.
 * stopped_at NAN is NULL (running, or it crashed); w.pid < 0 is NULL. */
struct db_worker_row {
    struct db_worker w;
    double last_seen_at, stopped_at;
    int64_t jobs_done;
};

/* Called once per worker row; the row and its strings are borrowed for the call only. Return 0 to
 * go on, anything else to stop. */
typedef int (*db_worker_fn)(void *ctx, const struct db_worker_row *row);

/* Streams the rows of `workers` to fn, by id; only the row of `id` when id is not NULL. Returns
 * 0, fn's nonzero value, or DB_ERR / DB_BUSY with db_errmsg. */
int db_query_workers(struct db *db, const char *id, db_worker_fn fn, void *ctx);

/* Writes whole worker rows in one transaction: a known id gets every column of the row (an update
 * in place: its metrics stay). Returns DB_OK, DB_BUSY or DB_ERR (nothing written: a row without
 * an id or started_at fails the call). */
int db_put_worker_rows(struct db *db, const struct db_worker_row *rows, size_t n);

/* Sets last_seen_at = now and jobs_done (since the worker started); with `stopped` also
 * stopped_at = now. A worker id with no row is an error (DB_ERR). */
int db_touch_worker(struct db *db, const char *id, double now, int64_t jobs_done, bool stopped);

/* One row of worker_metrics. Reals: NAN is SQL NULL (a percentile with no samples, kv_usage
 * before the engine runs); gpu_mem_bytes < 0 is NULL. */
struct db_metrics {
    const char *worker_id; /* a worker already written with db_put_worker */
    double ts, interval_s;
    int64_t jobs_done, jobs_failed;
    double prompt_tokens_per_s, generation_tokens_per_s;
    double ttft_p50_ms, ttft_p95_ms, itl_p50_ms, itl_p95_ms, e2e_p50_ms, e2e_p95_ms;
    int64_t running, waiting;
    double kv_usage, prefix_cache_hit_rate;
    int64_t preemptions;
    int64_t gpu_mem_bytes;
    /* schemas/002_metrics.sql */
    int64_t jobs_cancelled, jobs_dead, jobs_retried;
    int64_t prompt_tokens, generation_tokens, prefix_cache_queries, prefix_cache_hits;
    double queue_p50_ms, queue_p95_ms;
    int64_t queue_short, queue_long, retry_depth, dead_depth; /* < 0 is NULL (unknown) */
};
/* Every real NAN, every count 0, gpu_mem_bytes and the depths -1. */
struct db_metrics db_metrics_empty(void);

/* Called once per metrics row; borrowed for the call only. Return 0 to go on, else stop. */
typedef int (*db_metrics_fn)(void *ctx, const struct db_metrics *row);

/* Streams worker_metrics rows to fn by worker_id, then ts: all of them (worker_id NULL), one
 * worker's (ts NAN), or the one row of (worker_id, ts). Returns 0, fn's nonzero value, or DB_ERR /
 * DB_BUSY with db_errmsg. */
int db_query_metrics(struct db *db, const char *worker_id, double ts, db_metrics_fn fn, void *ctx);

/* Whether a and b hold the same value in every column of worker_metrics. */
bool db_metrics_same(const struct db_metrics *a, const struct db_metrics *b);

/* Writes metrics rows in one transaction; a row for a (worker_id, ts) already there replaces it.
 * Returns DB_OK, DB_BUSY or DB_ERR (nothing written: a bad row fails the call). */
int db_put_metrics(struct db *db, const struct db_metrics *rows, size_t n);
