/* Rows as JSON: the form a row takes on the result streams (queue/results.h), from a worker's
 * store to `llmq collect --redis`. One object per row, a member per column by its SQLite name
 * (docs/SQLITE.md): a NULL string and a NULL (NAN) real are left out, integers always written,
 * reals with the fewest digits that read back as the same double (json_exact.h), so that a row
 * decoded is the row encoded, column for column (db_result_same). A jobs row carries its batch's
 * row (struct db_result.batch) as the member "batch". */
#pragma once
#include <jansson.h>

#include "worker/store/db.h"

/* The JSON text of r (with r->batch when not NULL); malloc'd, NULL when out of memory. */
char *row_json_result(const struct db_result *r);
/* ... of a worker_metrics row. */
char *row_json_metrics(const struct db_metrics *m);
/* ... of a workers row. */
char *row_json_worker(const struct db_worker_row *w);

/* Reads a jobs row from o (an object from row_json_result): *r from db_result_empty() with the
 * members given; strings borrowed from o (valid while o lives). A "batch" member fills *b and
 * sets r->batch = b. 0, or -1 when o is not an object or lacks id, status or finished_at, or a
 * member has the wrong JSON type. */
int row_json_read_result(const json_t *o, struct db_result *r, struct db_batch *b);
/* The same for a worker_metrics row (worker_id and ts required). */
int row_json_read_metrics(const json_t *o, struct db_metrics *m);
/* The same for a workers row (id and started_at required). */
int row_json_read_worker(const json_t *o, struct db_worker_row *w);
