/* Cutting a prompt that does not fit the context, for a job that asks for it with "truncate":
 * "start" | "end" | "middle" (docs/JOBS.md "Truncation"). job_prepare calls trunc_fit once the
 * prompt is tokenized; a job without "truncate" is never cut (it fails with
 * context_length_exceeded, whose message names both ways out: TRUNC_HINT).
 *
 * The budget is max_model_len minus the room kept for the output: the job's max_tokens when it set
 * one, else the default max_tokens but at most max_model_len / 2 (and at least 1), so that a large
 * default still leaves the prompt half of the context; the default is then clamped to what the
 * prompt leaves, as for any job. A prompt over the budget loses its tokens by mode:
 *
 *   start   the beginning goes, the end stays (vLLM's truncate_prompt_tokens)
 *   end     the end goes, the beginning stays
 *   middle  the beginning and the end stay, half of the kept tokens each (the first half gets the
 *           odd one), the middle goes
 *
 * What is cut, by the job's input:
 *   prompt text  its token list; the special tokens the tokenizer's post-processor adds (Llama-3's
 *                BOS) stay where they are
 *   token ids    the list; a first id that is the tokenizer's bos_token stays first
 *   messages     (a template job is one user message) the chat template's own tokens never: the
 *                longest text content (a message's string content or one text part; the first of
 *                equal ones) is cut at token boundaries of its own encoding, moved to the nearest
 *                UTF-8 character boundary inside the kept text, then the messages are rendered and
 *                tokenized again; while that is still over the budget, more is cut (at most
 *                TRUNC_MAX_ROUNDS renders). When even an empty content does not fit, the job fails
 *                with context_length_exceeded and a message that says so.
 *
 * The count of dropped tokens is the prompt's length before less after, as the model sees it (for
 * messages: rendered and tokenized), and goes into the result's usage.truncated_tokens. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "worker/jobs/job.h"

struct chat_template;
struct tok;

#define TRUNC_MAX_ROUNDS 16 /* renders of a messages job while its cut content is still too long */

/* The ways out, for the context_length_exceeded message of a job without "truncate". */
#define TRUNC_HINT                                                                                           \
    "set \"truncate\" to \"start\", \"end\" or \"middle\" to cut the prompt, or send the text as "           \
    "\"document\" with \"summarize\" to summarize it in pieces"

/* "start", "end", "middle"; NULL for JOB_TRUNCATE_NONE (or a value out of range). */
const char *trunc_mode_name(enum job_truncate mode);
/* The mode named s, or JOB_TRUNCATE_NONE when s names none of them. */
enum job_truncate trunc_mode_of(const char *s);

/* The most prompt tokens job j may keep under max_model_len (> 0): see above. May be < 1, when an
 * explicit max_tokens leaves no room for any prompt. */
int trunc_budget(const struct job *j, int max_model_len);

/* Cuts ids[0..*n) in place to at most budget ids by mode: the first `head` and the last `tail` ids
 * stay, the rest is cut as the mode says. *n is updated. Returns the ids dropped (0 when it fits
 * already), or -1 when head + tail alone are over budget (nothing changed). */
int trunc_ids(int32_t *ids, size_t *n, size_t head, size_t tail, size_t budget, enum job_truncate mode);

/* Fits the prompt of job j, tokenized by job_prepare into *tokens[0..*n) (owned, replaced when
 * cut), into trunc_budget(j, max_model_len) tokens when j asks for truncation; a no-op for a job
 * without "truncate", for max_model_len <= 0 and for a prompt that fits. tok and ct are borrowed
 * (ct is used only for messages). *dropped gets the prompt tokens dropped. Returns JOB_OK, or
 * JOB_ERR_CONTEXT when no cut can make it fit, JOB_ERR_TEMPLATE / JOB_ERR_INVALID / JOB_ERR_INTERNAL
 * as job_prepare's rendering and tokenizing give them; with err. On failure *tokens and *n are as
 * they were. */
int trunc_fit(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
              int32_t **tokens, size_t *n, int *dropped, char *err, size_t errlen);
