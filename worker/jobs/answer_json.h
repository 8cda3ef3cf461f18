/* The parsed JSON of a structured-output answer: what a job under a json_schema or json_object
 * constraint (job.h, struct job_constraint) gets beside its text, in llmq's result ("json",
 * "json_incomplete") and in SQLite's jobs.output_json. docs/RESULTS.md, "Structured output". */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "worker/jobs/job.h"

struct json_t; /* jansson */

/* The answer text[0..len) of a job of constraint `kind` that ended with `finish`, parsed: a new
 * reference to the JSON value, or NULL. Only json_schema and json_object jobs have one: for other
 * kinds it returns NULL with *incomplete false. For those two, *incomplete is true
 * and NULL is returned when the text is not one whole JSON value (whitespace around it allowed):
 * cut by max_tokens (finish LENGTH), a cancelled or timed-out job, or any text that does not parse;
 * and also when the job did not stop by itself (finish other than STOP) and the value is a bare
 * number, which the cut may have shortened. text NULL reads as "". Pure: reads only its arguments. */
struct json_t *answer_json(enum job_constraint_kind kind, const char *text, size_t len,
                           enum finish_reason finish, bool *incomplete);
