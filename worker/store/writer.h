/* The worker's SQLite writer: a thread that owns the worker's database handle and runs one batch
 * of writes at a time (job parts, results, then metrics, then the workers row), so a slow or locked database
 * (a busy_timeout of seconds, a reader holding a lock) never stops the engine or the heartbeat.
 *
 *     struct wk_writer *w;
 *     wk_writer_start(db, &w, err, sizeof err);   // takes over db
 *     b.rows = rows; b.nrows = n; ...            // b and what it points to stay untouched ...
 *     wk_writer_submit(w, &b);                   // ... until it comes back:
 *     if (wk_writer_poll(w) == &b) ... b.rc_results, b.row_rc[i], b.moved ...
 *     wk_writer_stop(w, 5000);                   // waits for the batch in flight, closes db
 *
 * (Here a "batch" is one round of writes; the jobs' batches of `llmq enqueue` are `batches` rows.)
 * One batch is in flight at a time; the caller collects what finishes meanwhile and sends it in
 * the next one (bigger transactions when the database is slow). Everything but the writes runs
 * on the caller's thread. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/store/db.h"

struct wk_writer;

/* One batch of writes. The caller fills the inputs; the writer fills the outputs. Inputs and the
 * strings they point to are borrowed until the batch comes back from wk_writer_poll/_wait. */
struct wk_batch {
    /* inputs */
    const struct db_worker *worker_row; /* db_put_worker first (NULL = none) */
    const struct db_result *rows;       /* db_put_results (one transaction) */
    size_t nrows;
    int *row_rc;                      /* [nrows]: per-row outcome (db_put_results) */
    const struct db_metrics *metrics; /* db_put_metrics */
    size_t nmetrics;
    const struct db_batch *batches; /* db_put_batches (after the results) */
    size_t nbatches;
    const struct db_part *parts; /* db_put_parts (before the results) */
    size_t nparts;
    const char *touch_id; /* db_touch_worker(touch_id, touch_now, jobs_done, stopped); NULL = none */
    double touch_now;
    int64_t jobs_done;
    bool stopped;
    /* outputs: DB_OK, or the db_* code of that call (DB_OK when there was nothing to do) */
    int rc_worker, rc_results, rc_metrics, rc_touch, rc_batches, rc_parts;
    char err[512];    /* the first failure's message */
    char moved[1200]; /* "" or, once, why the path no longer named the open database (deleted or
                         replaced) and whether a new one was created there; the batch was then
                         written into the new one (or failed with DB_UNWRITABLE) */
    double write_ms;  /* time spent in SQLite */
};

/* Starts the thread; it owns db from now on (closed by wk_writer_stop). 0, or -1 with err (db is
 * then still the caller's). db NULL: a worker without a database (sqlite.path "", its rows go to
 * the result streams only): every batch comes back written (DB_OK) without writing anything.
 *
 * Before and after each batch the thread checks that db's path still names the file it writes
 * (db_file_moved). When it does not (the file was deleted or replaced), it opens the path again
 * (db_reopen: a new database with its schema), writes the last worker_row it was given there (so
 * that pointer and its strings must stay valid until wk_writer_stop) and then the whole batch, so
 * a batch reported written is in the file at the path. A path that cannot be opened again fails
 * this and every later batch with DB_UNWRITABLE, each trying again first. */
int wk_writer_start(struct db *db, struct wk_writer **out, char *err, size_t errlen);

/* Hands b to the thread. -1 when a batch is still in flight (nothing done). */
int wk_writer_submit(struct wk_writer *w, struct wk_batch *b);

/* Whether a batch is in flight (submitted and not yet returned by poll/wait). */
bool wk_writer_busy(const struct wk_writer *w);

/* The batch in flight once it is done (it is then the caller's again), else NULL at once. */
struct wk_batch *wk_writer_poll(struct wk_writer *w);

/* The same, waiting up to timeout_ms for it. */
struct wk_batch *wk_writer_wait(struct wk_writer *w, int timeout_ms);

/* Waits up to wait_ms for a batch in flight, then stops the thread and closes the database.
 * When the batch is still running after wait_ms, the thread is left to finish it on its own
 * (detached) and 1 is returned (the batch's memory must then stay valid: the process is about to
 * exit); otherwise 0. Accepts NULL. */
int wk_writer_stop(struct wk_writer *w, int wait_ms);
