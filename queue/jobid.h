/* A job's id, read from its JSON, and ids given at fetch time to jobs that have none.
 *
 * The rule (the same in the Lua scripts, queue/scripts.c): an OpenAI batch line (it has
 * "custom_id", "body", "url" or "method") is known by its string "custom_id"; any other object
 * by its string "id". A usable id has 1..RQ_ID_MAX bytes and no control characters. A job in
 * llmq's form without "id" (or with "id": null) can be given one; everything else (not JSON, not
 * an object, an OpenAI line without custom_id, an id of the wrong type) has none, and the
 * worker's parser reports why when it dead-letters it. */
#pragma once
#include <stddef.h>

#include "queue/keys.h"

enum rq_idstate {
    RQ_ID_FOUND = 0,   /* id holds the job's own id */
    RQ_ID_MISSING = 1, /* a JSON object in llmq's form without an id: rq_job_add_id can add one */
    RQ_ID_NONE = 2,    /* no usable id and none can be added */
};

/* Reads the id of raw[0..len). max_bytes > 0: a longer job is RQ_ID_NONE without being parsed
 * (the worker fails it as too large). id is "" unless RQ_ID_FOUND. */
enum rq_idstate rq_job_id(const char *raw, size_t len, size_t max_bytes, char id[RQ_ID_MAX + 1]);

/* A new id: a UUIDv7 in text form (engine/util/uuid.h), 36 characters. */
void rq_new_id(char id[RQ_ID_MAX + 1]);

/* The job raw[0..len) with "id": id added: the text is kept byte for byte and `,"id":"..."` is
 * inserted before the closing brace (or the JSON is rewritten when it holds "id": null).
 * *out is malloc'd and NUL-terminated (the caller frees it), *outlen its length.
 * 0, or -1 when raw is not a JSON object in llmq's form, or out of memory. */
int rq_job_add_id(const char *raw, size_t len, const char *id, char **out, size_t *outlen);
