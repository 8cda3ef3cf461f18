/* How the `llmq batch` subcommands print a batch: a line or a block of text, or a JSON object
 * (the hash's fields with numbers as numbers). */
#pragma once
#include <stdio.h>

#include <jansson.h>

struct rq_batch_info;

/* "2025-06-01 22:14:03" in local time into buf[len]; "-" for 0. Returns buf. */
const char *batch_show_time(double t, char *buf, size_t len);

/* "3 jobs: 0 queued, 0 running, 2 completed, 1 failed, 0 cancelled" */
void batch_show_counts(FILE *f, const struct rq_batch_info *b);

/* {"id", "state", "input", "created_at", "finished_at" (null while open), "total", "queued",
 * "running", "completed", "failed", "cancelled"}; state "expired" when the hash is gone. New
 * reference (NULL when out of memory). */
json_t *batch_show_json(const struct rq_batch_info *b);

/* Prints j on one line of f and drops the reference (j may be NULL: nothing printed). */
void batch_show_put_json(FILE *f, json_t *j);
