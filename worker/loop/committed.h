/* The worker's own database as the reaper's lookup (queue/reaper.h, rq_reap_set_lookup): before
 * the reaper or the start-up recovery puts back a lapsed worker's jobs, it asks here whether a job
 * already has a committed row in this worker's SQLite file (a worker killed between its commit and
 * its ack; the same file after a restart under the same id, or a file several workers share). Such
 * a job is acknowledged with its row instead of being run again or dead-lettered. A separate
 * read-only connection: the writer thread owns the other one, and WAL readers do not wait for it. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "queue/reaper.h"
#include "worker/store/db.h"

struct wk_committed;

/* Opens the read-only connection to the database at path (which the writer has opened and
 * migrated). max_bytes: redis.result_max_bytes (a longer result line becomes the marker, as in
 * the worker's ack). NULL with err when it cannot be opened. */
struct wk_committed *wk_committed_open(const char *path, int busy_timeout_ms, int64_t max_bytes, char *err,
                                       size_t errlen);
/* Closes it. Accepts NULL. */
void wk_committed_close(struct wk_committed *c);

/* An rq_done_fn over ctx (a struct wk_committed): 1 with the row of job `id` in out (id NULL: the
 * nth newest failed row `worker` wrote for the job line line[0..len) without an id), 0 when there
 * is none or the read failed (logged). */
int wk_committed_lookup(void *ctx, const char *id, const char *worker, const char *line, size_t len, int nth,
                        struct rq_done *out);

/* The committed parts of summary job `job_id` under `plan` (SQLite job_parts), streamed to fn as
 * db_get_parts does: for a job taken again after its worker was lost, which resumes where that
 * worker was. 0, fn's nonzero value, or -1 when the read failed (logged). */
int wk_committed_parts(struct wk_committed *c, const char *job_id, const char *plan, db_part_fn fn, void *ctx);
