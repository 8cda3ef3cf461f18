/* A job's key, read from its JSON, and ids given at fetch time to jobs that have none.
 *
 * The key names the job's Redis hash (<p>:job:<key>) and its SQLite row (jobs.id). The rule (the
 * same in the Lua prelude's job_id(), queue/scripts.c, and in the worker's parser,
 * worker/jobs/job.c; tests/unit/test_rq_jobkey.c runs one table of jobs through all three):
 *
 *   - an OpenAI batch line (it has "custom_id", "body", "url" or "method") is known by its string
 *     "custom_id", or by "<batch_id>/<custom_id>" when it carries a string "batch_id" (`llmq
 *     enqueue` adds one to every line it pushes), so the same custom_id in two batches names two
 *     jobs;
 *   - any other object (llmq's form) by its string "id" ("batch_id" does not enter its key).
 *
 * The line must be JSON that both decoders read: cjson inside Redis reads NaN, Infinity, hex and
 * leading zeros only when told to (the scripts tell it not to), jansson reads "\u0000" only when
 * told to (rq_job_id does), and neither reads arrays and objects nested deeper than
 * RQ_JSON_MAX_DEPTH. What is left is documented in docs/QUEUE.md ("A job's key"): a line with
 * invalid UTF-8 or a raw control character outside its key's strings, or a number JSON cannot
 * hold, has a key for the scripts and none for rq_job_id, and the worker's parser fails it as
 * invalid JSON under the scripts' key.
 *
 * A usable id or custom_id is 1..RQ_OWN_ID_MAX bytes (not characters) of UTF-8 without C0
 * control characters (U+0000..U+001F) or DEL (U+007F); every other character is allowed, '/'
 * and spaces included. A batch id is 1..RQ_BATCH_ID_MAX letters, digits, '.', '_' and '-'
 * (rq_valid_batch_id); "batch_id": null is no batch. A job in llmq's form without "id" (or with
 * "id": null) can be given one; everything else (not JSON, not an object, an OpenAI line without custom_id or
 * with a bad batch_id, an id of the wrong type) has none, and the worker's parser reports why when it
 * dead-letters it. */
#pragma once
#include <stddef.h>

#include "queue/keys.h"

/* Arrays and objects nested deeper than this: not read (cjson's limit inside Redis). */
#define RQ_JSON_MAX_DEPTH 1000

enum rq_idstate {
    RQ_ID_FOUND = 0,   /* id holds the job's key */
    RQ_ID_MISSING = 1, /* a JSON object in llmq's form without an id: rq_job_add_id can add one */
    RQ_ID_NONE = 2,    /* no usable key and none can be added */
};

/* Reads the key of raw[0..len). max_bytes > 0: a longer job is RQ_ID_NONE without being parsed
 * (the worker fails it as too large). id is "" unless RQ_ID_FOUND. */
enum rq_idstate rq_job_id(const char *raw, size_t len, size_t max_bytes, char id[RQ_ID_MAX + 1]);
/* rq_job_id without the size bound, always through a full jansson parse: the reference that
 * rq_job_id's one-pass reading (queue/jobscan.h) falls back to and is tested against. */
enum rq_idstate rq_job_id_parsed(const char *raw, size_t len, char id[RQ_ID_MAX + 1]);

/* The key of an OpenAI line: "<batch_id>/<custom_id>", or custom_id when batch_id is NULL or "".
 * Both are taken as valid (the caller checked them). */
void rq_openai_key(const char *batch_id, const char *custom_id, char id[RQ_ID_MAX + 1]);

/* A new id: a UUIDv7 in text form (engine/util/uuid.h), 36 characters. */
void rq_new_id(char id[RQ_ID_MAX + 1]);

/* The job raw[0..len) with "id": id added: the text is kept byte for byte and `,"id":"..."` is
 * inserted before the closing brace (or the JSON is rewritten when it holds "id": null).
 * *out is malloc'd and NUL-terminated (the caller frees it), *outlen its length.
 * 0, or -1 when raw is not a JSON object in llmq's form, or out of memory. */
int rq_job_add_id(const char *raw, size_t len, const char *id, char **out, size_t *outlen);

/* The job raw[0..len) with "batch_id": batch_id added the same way (text kept byte for byte),
 * for llmq's form and OpenAI lines alike. 0, or -1 when raw is not a JSON object, already has a
 * "batch_id" key, batch_id is not a valid batch id, or out of memory. */
int rq_job_add_batch(const char *raw, size_t len, const char *batch_id, char **out, size_t *outlen);
