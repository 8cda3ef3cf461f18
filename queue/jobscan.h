/* A job's key read in one pass over its text, without building a JSON tree: the fast path of
 * rq_job_id (queue/jobid.h), which the worker runs on every job it fetches.
 *
 * The pass checks the whole text as jansson's json_loadb (JSON_ALLOW_NUL) does: the JSON grammar,
 * strict UTF-8, no control characters in strings, escapes (lone surrogates refused), nothing but
 * whitespace after the value. Where the answer could depend on more than that (a number jansson
 * could find too large, an escape in a top-level key or in a value the key is read from, a
 * "\u0000" escape, nesting deeper than 64, a NUL byte) it gives up, and the caller parses with
 * jansson.
 * tests/unit/test_rq_jobkey.c compares both on a table of jobs and on many mutated ones. */
#pragma once
#include <stddef.h>

#include "queue/jobid.h"

/* The rq_idstate of raw[0..len) (and its key in id when RQ_ID_FOUND; id is "" otherwise), or -1
 * when it cannot tell without a full parse. */
int rq_job_scan(const char *raw, size_t len, char id[RQ_ID_MAX + 1]);
