/* The JSON line a finished job's row exports as (`llmq results --format jsonl`), which the
 * worker also stores in the job's Redis hash (its `result` field, docs/QUEUE.md). One builder, so
 * both say the same bytes. */
#pragma once

#include "worker/store/db.h"

/* The row's result line, without the newline: its stored result line (r->result) when it has
 * one, else llmq's result object built from the columns (a row written by an llmq older than the
 * result column, or one written without its JSON columns). Returns r->result itself (borrowed for
 * as long as r is), or a new string put in *owned as well (the caller frees *owned, which is NULL
 * when nothing was allocated); NULL when out of memory. */
const char *db_result_line(const struct db_result *r, char **owned);
