/* The rows of finished parts of map-reduce summary jobs (worker/jobs/summarize.h) on their way into
 * SQLite's job_parts: each is queued when its part finishes, goes out with the next batch of the
 * writer thread, and tells its job once the transaction has committed, which may open the job's
 * next level. A row owns copies of its strings, so a job let go before its row is written (handed
 * back, retried, reaped) leaves nothing dangling: the row is still written, for the delivery that
 * runs the job next, and nobody is told. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "worker/store/db.h"

struct sum_part;
struct wk_job;

struct wk_part_row {
    struct wk_job *job;    /* NULL once the job was let go */
    struct sum_part *part; /* the job's part it stores */
    struct db_part row;    /* its strings are the copies below */
    char *job_id, *plan, *output;
};

struct wk_part_rows {
    struct wk_part_row *rows; /* queued, oldest first; the first n_sent are in the batch in flight */
    size_t n, cap, n_sent;
    struct db_part *batch;    /* [cap]: the batch's db_part rows */
    struct wk_part_row *done; /* [cap]: the rows of a committed batch while their jobs are told */
};

/* Queues the row of part p of job j (its id, plan, worker and time as given). 0, or -1 out of memory. */
int wk_part_rows_add(struct wk_part_rows *q, struct wk_job *j, struct sum_part *p, const char *job_id,
                     const char *plan, const char *worker_id, double now_wall);

/* The rows for the next batch, at most max of them (marked sent): *n of them, borrowed until
 * wk_part_rows_done. */
const struct db_part *wk_part_rows_send(struct wk_part_rows *q, size_t max, size_t *n);

/* The batch came back. committed: its rows are written; each is given to fn (ctx, job, part) when its
 * job is still held, then dropped. Otherwise they stay queued, first, for the next batch. fn must not
 * queue rows. */
void wk_part_rows_done(struct wk_part_rows *q, bool committed,
                       void (*fn)(void *ctx, struct wk_job *job, struct sum_part *part), void *ctx);

/* Job j is let go: its rows forget it (they are still written). */
void wk_part_rows_forget(struct wk_part_rows *q, const struct wk_job *j);

/* Rows queued and not in flight. */
size_t wk_part_rows_waiting(const struct wk_part_rows *q);

void wk_part_rows_free(struct wk_part_rows *q);
