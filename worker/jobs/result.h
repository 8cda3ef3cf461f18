/* A finished job as JSON: llmq's own result shape, or an OpenAI Batch output line for jobs that
 * came in that form. docs/JOBS.md shows both.
 *
 *   llmq:   {"id", "batch_id"?, "status": "completed"|"cancelled"|"failed", "text", "reasoning"?,
 *            "finish_reason", "usage": {"prompt_tokens", "completion_tokens", "reasoning_tokens"?,
 *            "truncated_tokens"?},
 *            "prompt_token_ids"?, "token_ids"?,
 *            "logprobs"?, "error_code"? (cancelled), "metadata"?}
 *           failed: {"id", "batch_id"?, "status": "failed", "error", "error_code", "metadata"?}
 *           timed out: failed, with "error", "error_code" and the fields of a completed result
 *            (finish_reason "timeout")
 *   OpenAI: {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id",
 *            "body": chat.completion | text_completion}, "error": null}; a chat answer with reasoning
 *            has message.reasoning_content and usage.completion_tokens_details.reasoning_tokens; a job
 *            with "truncate" has usage.truncated_tokens (llmq's extension)
 *           failed or cancelled: {"id", "custom_id", "response": null, "error": {"code", "message"}}
 *           timed out: "response" with status_code 408 and the partial body (finish_reason "timeout"),
 *           and "error": {"code": "timeout", "message"}
 *
 * Strings that are not valid UTF-8 (a cut error message, a token's partial character) are written
 * with U+FFFD in place of the bad bytes, so every line is valid JSON. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/engine.h"
#include "worker/jobs/job.h"

struct json_t; /* jansson */

/* How a job ended. Pointers are borrowed for the call. */
struct res_output {
    enum finish_reason finish; /* STOP, LENGTH, CANCELLED; ERROR (or error set) means failed; TIMEOUT
                                  is failed with the output (set error and error_rc JOB_ERR_TIMEOUT) */
    const char *text;          /* generated text (NULL = "") */
    size_t text_len;
    /* the reasoning (engine_seq.reasoning), written only when has_reasoning (NULL = "") */
    const char *reasoning;
    size_t reasoning_len;
    bool has_reasoning;
    int reasoning_tokens; /* of completion_tokens, those of the think block */
    int prompt_tokens, completion_tokens;
    int truncated_tokens;      /* prompt tokens "truncate" dropped (job_input); written when the job set it */
    const int32_t *prompt_ids; /* [prompt_tokens]: written when the job asked for token ids */
    const int32_t *token_ids;  /* [completion_tokens]: idem */
    const struct be_out *logprobs; /* [completion_tokens]: written when the job asked for logprobs */
    const char *error;             /* failed: why */
    int error_rc;      /* failed: an enum job_error, named by job_error_code for OpenAI's error.code */
    const char *model; /* OpenAI bodies' "model" (NULL = "llmq") */
    int64_t created;   /* OpenAI bodies' "created", Unix seconds (0 = now) */
    int chunks, depth; /* a map-reduce summary (usage.chunks, usage.depth); 0 for any other job */
};

/* The bytes that token `id` decodes to (not NUL-terminated, maybe a partial UTF-8 character),
 * with their count in *len; NULL when unknown. Used for the token strings of OpenAI logprobs. */
typedef const char *(*res_token_fn)(const void *ctx, int32_t id, size_t *len);

/* A failed job's output: finish FINISH_ERROR with the message and its enum job_error. */
struct res_output res_failed(int rc, const char *error);

/* The result object of job j (a new reference; NULL when out of memory). token_fn may be NULL
 * (OpenAI logprobs then carry empty token strings). */
struct json_t *res_json(const struct job *j, const struct res_output *o, res_token_fn token_fn,
                        const void *ctx);

/* res_json as one compact line of JSON without the newline (a new string, caller frees with
 * free()); NULL when out of memory. Floats are written with 9 significant digits. */
char *res_line(const struct job *j, const struct res_output *o, res_token_fn token_fn, const void *ctx);

/* Writes "<prefix><32 random hex digits>" into buf (ids like OpenAI's "batch_req_..."). */
void res_random_id(const char *prefix, char *buf, size_t len);
