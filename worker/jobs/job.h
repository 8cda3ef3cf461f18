/* A generation job: one JSON object in either form of DESIGN.md "Jobs and results", parsed and
 * validated into a struct, then turned into an engine_request.
 *
 *   llmq's own:  {"id", "prompt" | "messages" | "template"+"vars", "max_tokens", "temperature", ...}
 *   OpenAI Batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
 *                  "body": {...}}
 *
 * docs/JOBS.md is the user's reference: every field, its type, default and bounds, and the error
 * messages. Errors name the field and the value: "field 'max_tokens': expected an integer >= 1, got -3".
 *
 * Usage (`llmq run`, the worker):
 *
 *     struct job j;
 *     int rc = job_parse(line, len, &opts, &j, err, sizeof err);   // j is always initialised
 *     job_assign_id(&j);                                          // when the job has none
 *     if (rc == 0) rc = job_prepare(&j, tok, ct, max_model_len, &in, err, sizeof err);
 *     if (rc == 0) seq = engine_add(e, &in.req, err, sizeof err); // in.req borrows from j and in
 *     ...
 *     job_input_free(&in); job_free(&j);
 *
 * Not thread-safe per job; different jobs may be parsed on different threads. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampling.h"
#include "engine/util/uuid.h"

struct json_t; /* jansson */
struct cfg_sampling;
struct chat_template;
struct model_config;
struct tok;

#define JOB_MAX_DEPTH 32         /* nesting of arrays and objects in a job's JSON */
#define JOB_MAX_ID_BYTES 256     /* "id" / "custom_id" (RQ_OWN_ID_MAX) */
#define JOB_MAX_STOP 16          /* stop strings per job */
#define JOB_MAX_STOP_BYTES 1024  /* bytes per stop string */
#define JOB_MAX_STOP_IDS 64      /* stop_token_ids per job */
#define JOB_ID_LEN UUID_TEXT_LEN /* a generated id: a UUIDv7 in its 36-character text form */
#define JOB_MAX_TIMEOUT_S 604800 /* "timeout_s": at most a week */
#define JOB_MAX_PRIORITY 1000    /* "priority": -1000 .. 1000 */
#define JOB_MAX_CHOICES 1024     /* "choice": strings per job */
#define JOB_MAX_SCHEMA_NAME 64   /* "response_format.json_schema.name": bytes (OpenAI's limit) */

/* Failure kinds: what job_parse / job_prepare return, and what the worker records for every way
 * a job can end without completing. job_error_code() names each for OpenAI's error.code, the
 * SQLite row's error_code and the Redis hash's; the table of codes is in job.c (docs/JOBS.md
 * "Error codes" lists which failure gives which). */
enum job_error {
    JOB_OK = 0,
    JOB_ERR_JSON = -1,      /* "invalid_json": not JSON, bad UTF-8 or escape, too deep, not an object */
    JOB_ERR_TOO_LARGE = -2, /* "job_too_large": over queues.max_job_bytes */
    JOB_ERR_INVALID =
        -3, /* "invalid_request": a field is missing, unknown, of the wrong type or out of range */
    JOB_ERR_CONTEXT = -4,   /* "context_length_exceeded": prompt (+ max_tokens) over max_model_len */
    JOB_ERR_ENGINE = -5,    /* "engine_error": the engine refused or failed the job */
    JOB_ERR_TIMEOUT = -6,   /* "timeout": the job's timeout_s passed */
    JOB_ERR_CANCELLED = -7, /* "cancelled": stopped by a cancel request (status cancelled) */
    JOB_ERR_INTERNAL = -8,  /* "internal": the worker failed it (out of memory, ...) */
    /* "max_stalls_exceeded": its worker was lost while running it max_stalls times (a poison job);
     * written by the reaper's script (queue/scripts.c), never by job_parse */
    JOB_ERR_STALLS = -9,
    /* "template_error": the model's chat template refused the conversation (raise_exception: its
     * message is the error), failed while rendering, or the model has none */
    JOB_ERR_TEMPLATE = -10,
    /* "invalid_response_format": a structured-output field (response_format, regex, choice) is
     * malformed, its JSON Schema is refused (the message names the keyword and its JSON pointer),
     * or the job asks for two constraints */
    JOB_ERR_RESPONSE_FORMAT = -11,
};
#define JOB_ERR_COUNT 11 /* failure kinds, JOB_ERR_JSON .. JOB_ERR_RESPONSE_FORMAT */
/* "invalid_json", ...; "" for JOB_OK, "internal" for a value out of range. */
const char *job_error_code(int rc);

enum job_form {
    JOB_FORM_LLMQ,       /* llmq's own */
    JOB_FORM_CHAT,       /* OpenAI Batch line for /v1/chat/completions */
    JOB_FORM_COMPLETION, /* OpenAI Batch line for /v1/completions */
};

/* What a job's output must be (structured output, docs/STRUCTURED_OUTPUT.md): at most one per job.
 * The worker turns it into a grammar (engine/grammar.h): JSON_SCHEMA through js_compile(schema) and
 * gr_compile_schema (schema_hash keys a compile cache; compare the schemas on a hit), JSON_OBJECT
 * through gr_compile_json_object, REGEX through gr_compile_regex(regex), CHOICE through
 * gr_compile_choice(choices, n_choices). */
enum job_constraint_kind {
    JOB_CONSTRAINT_NONE = 0,    /* free text (also response_format {"type": "text"}) */
    JOB_CONSTRAINT_JSON_SCHEMA, /* response_format {"type": "json_schema", "json_schema": {...}} */
    JOB_CONSTRAINT_JSON_OBJECT, /* response_format {"type": "json_object"}: any JSON object */
    JOB_CONSTRAINT_REGEX,       /* "regex": the whole output matches the pattern */
    JOB_CONSTRAINT_CHOICE,      /* "choice": the output is one of the strings */
};

/* A job's constraint. Owned by the job (job_free frees it; job_drop_input keeps it). After a
 * successful job_parse exactly the members of its kind are set:
 *   JSON_SCHEMA: schema (an object js_compile accepted when the job was parsed), schema_hash
 *                (js_hash(schema)), name, strict;
 *   REGEX:       regex (non-empty, without NUL; its syntax is checked when it is compiled);
 *   CHOICE:      choices[0..n_choices), 1 <= n_choices <= JOB_MAX_CHOICES, each non-empty, without NUL. */
struct job_constraint {
    enum job_constraint_kind kind;
    struct json_t *schema; /* owned reference to json_schema.schema as the job gave it */
    uint64_t schema_hash;
    char *name;     /* json_schema.name (owned) */
    bool strict;    /* json_schema.strict (false when absent); llmq enforces the schema either way */
    char *regex;    /* owned */
    char **choices; /* [n_choices] owned */
    size_t n_choices;
};
/* "json_schema", "json_object", "regex", "choice"; NULL for JOB_CONSTRAINT_NONE. */
const char *job_constraint_name(enum job_constraint_kind kind);
/* Whether a job of this kind answers with JSON (its result carries the parsed value). */
bool job_constraint_is_json(enum job_constraint_kind kind);

/* What a job over the context does (its "truncate"; worker/jobs/truncate.h): fail, or drop prompt
 * tokens from the start, the end or the middle. */
enum job_truncate {
    JOB_TRUNCATE_NONE = 0, /* fail with JOB_ERR_CONTEXT (the default) */
    JOB_TRUNCATE_START,    /* drop the beginning, keep the end */
    JOB_TRUNCATE_END,      /* drop the end, keep the beginning */
    JOB_TRUNCATE_MIDDLE,   /* keep the beginning and the end halves */
};

/* A map-reduce summary of a document longer than the context (docs/JOBS.md "Long documents"):
 * the job's "document" and "summarize" fields. Owned by the job; worker/jobs/summarize.h runs it. */
struct job_summarize {
    char *document; /* owned, document_len bytes and a NUL; valid UTF-8 without NUL */
    size_t document_len;
    int chunk_tokens;   /* summarize.chunk_tokens; 0 = sized from max_model_len when planned */
    int overlap_tokens; /* summarize.overlap_tokens; -1 = the default */
    int max_tokens;     /* summarize.max_tokens: each partial summary's; 0 = the job's max_tokens */
    char *map_template, *reduce_template; /* the templates' names (owned) */
    char *map_text, *reduce_text;         /* their text (owned copies) */
    struct json_t *vars;                  /* the job's "vars" (owned reference), or NULL */
};
#define JOB_SUMMARIZE_MAP "summarize_map"       /* the default map template's name */
#define JOB_SUMMARIZE_REDUCE "summarize_reduce" /* ... and the reduce template's */
/* The built-in text of the default map / reduce template (used when the config and Redis have
 * no template of that name). */
extern const char job_summarize_map_text[], job_summarize_reduce_text[];

/* Values for fields a job leaves out. The job's own values always win. */
struct job_defaults {
    int max_tokens;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
    bool enable_thinking;
};
/* max_tokens 256, temperature 1, top_p 1, top_k 0, min_p 0, penalties off, enable_thinking true. */
struct job_defaults job_defaults_builtin(void);
/* The config's sampling section. */
void job_defaults_from_cfg(struct job_defaults *d, const struct cfg_sampling *s);
/* generation_config.json's defaults over *d, as vLLM does with --generation-config auto: each of
 * temperature, top_p, top_k, min_p, repetition_penalty (values from mc, validated by model_load)
 * and max_new_tokens (as max_tokens) that the file of model_dir sets. A no-op when it sets none.
 * Call it after job_defaults_from_cfg when sampling.use_generation_config is set. */
void job_defaults_from_model(struct job_defaults *d, const struct model_config *mc, const char *model_dir);

/* Returns the text of the prompt template `name`, or NULL when there is no such template. */
typedef const char *(*job_template_fn)(void *ctx, const char *name);

struct job_opts {
    struct job_defaults defaults;
    int64_t max_bytes;             /* longest job JSON in bytes; 0 = no limit (queues.max_job_bytes) */
    job_template_fn template_find; /* NULL: no templates are configured */
    void *template_ctx;
    const char *template_where; /* where an unknown template was looked for, for its error message;
                                   NULL = "in the config" */
};
/* Built-in defaults, no size limit, no templates. */
struct job_opts job_opts_default(void);

struct job {
    enum job_form form;
    /* The job's key (owned; NULL when it has none), by queue/jobid.h's rule: llmq's "id", an
     * OpenAI line's "custom_id", or "<batch_id>/<custom_id>" for an OpenAI line in a batch. */
    char *id;
    char *model;       /* llmq "model" or OpenAI "body.model" (owned); NULL when it names none (or "") */
    bool id_generated; /* id came from job_assign_id */
    char *custom_id;   /* an OpenAI line's "custom_id" (owned); NULL in llmq's form */
    char *batch_id;    /* "batch_id" (owned): the batch `llmq enqueue` put it in; NULL = none */

    /* The input: exactly one of prompt, prompt_ids, messages is set after a successful parse. */
    char *prompt;        /* text sent as is (llmq "prompt", a rendered template, completions "prompt") */
    int32_t *prompt_ids; /* [n_prompt_ids] completions "prompt" given as token ids */
    int n_prompt_ids;
    struct json_t *messages; /* owned reference to the validated messages array ("developer" read as
                                "system"; an assistant's absent content with tool calls as null) */
    bool chat;               /* the input was messages (still true after job_drop_input) */
    /* What the chat template gets besides the messages (owned references, NULL when absent). */
    struct json_t *tools;       /* "tools": OpenAI function definitions; [] counts as absent */
    struct json_t *documents;   /* "documents" */
    struct json_t *chat_kwargs; /* "chat_template_kwargs" without enable_thinking (see below) */
    /* The template's enable_thinking: chat_template_kwargs.enable_thinking, else the job's
     * "enable_thinking", else the default (sampling.enable_thinking). Always passed. */
    bool enable_thinking;

    /* Generation. */
    struct sampling_params sp; /* sp.logprobs: -1 none, 0 the chosen token's, N also the top N */
    bool has_seed;
    int max_tokens;
    bool max_tokens_given; /* the job set it (else it is the default and may be clamped) */
    int min_tokens;
    bool ignore_eos;
    bool skip_special_tokens;
    char **stop; /* [n_stop] owned */
    int n_stop;
    int32_t *stop_ids; /* [n_stop_ids] owned */
    int n_stop_ids;
    int thinking_budget;    /* tokens of reasoning before the engine closes the think block; -1 = none */
    bool stop_in_reasoning; /* stop strings also end the output inside the reasoning */

    /* Scheduling. */
    double timeout_s;           /* seconds from when a worker takes it (llmq run: reads it); 0 = none */
    int priority;               /* admission order within its lane, higher first; default 0 */
    enum job_truncate truncate; /* "truncate": what a prompt over the context does */

    /* Output. */
    bool return_token_ids;
    bool stream;                      /* "stream": the text goes to <p>:stream:<id> as it comes */
    struct json_t *metadata;          /* owned reference to the job's "metadata" object, or NULL */
    struct job_constraint constraint; /* structured output; kind NONE for free text */
    /* A map-reduce summary job: NULL for any other. It has no prompt, prompt_ids or messages, and
     * job_prepare refuses it (worker/jobs/summarize.h prepares its parts); job_drop_input keeps it. */
    struct job_summarize *summarize;
};

/* Parses and validates one job from `len` bytes of JSON (need not be NUL-terminated). *j is
 * always initialised, even on failure, and must be given to job_free. The model is read before
 * any other field: a job whose only fault is one a worker serving its model may not have (a
 * template) still has j->model. On failure j->form, j->id, j->custom_id, j->batch_id and
 * j->model are set as far as the line could be read (a line that is not JSON is taken for an
 * OpenAI line when it contains the text "custom_id"), so the caller can answer in the right
 * shape. Returns JOB_OK or a negative enum job_error with the message in err. */
int job_parse(const char *line, size_t len, const struct job_opts *o, struct job *j, char *err,
              size_t errlen);

/* Frees what the job owns and zeroes it. Accepts NULL. */
void job_free(struct job *j);
/* Frees the input (prompt, prompt_ids, messages) once job_prepare has turned it into tokens and
 * the engine holds them: a job of megabytes is not kept twice while it runs. Everything else
 * (ids, generation parameters, metadata) stays; job_prepare must not be called again. */
void job_drop_input(struct job *j);
/* The "metadata" object of a job (llmq's "metadata", an OpenAI line's "body.metadata") read again
 * from the `len` bytes of JSON job_parse accepted: a new reference, or NULL when it has none (or
 * out of memory). For a worker that let a large job's parsed metadata go while it ran. */
struct json_t *job_metadata_of(const char *line, size_t len);

/* Gives a job without an id a new one (a UUIDv7, engine/util/uuid.h) and sets id_generated. Returns 0, or -1
 * when out of memory. */
int job_assign_id(struct job *j);

/* A job ready for engine_add: its prompt tokens and the request. */
struct job_input {
    int32_t *tokens; /* [n_tokens] owned */
    int n_tokens;
    int truncated_tokens;      /* prompt tokens "truncate" dropped (the result's usage.truncated_tokens) */
    struct engine_request req; /* borrows from the job and from tokens; user is NULL */
};

/* Renders messages with the model's chat template ct (engine/chat_template.h; once per job, with
 * add_generation_prompt, the job's tools, documents and chat_template_kwargs, and enable_thinking),
 * tokenizes the input (a rendered prompt without added special tokens, as apply_chat_template
 * does) and fills in->req (its priority too; the deadline is the caller's: job_deadline). A template
 * that raises, fails, or is absent is JOB_ERR_TEMPLATE with its message. A job with "truncate" has
 * its prompt cut to trunc_budget tokens first (truncate.h; the count in in->truncated_tokens). A
 * prompt of max_model_len tokens or more, or a prompt plus an explicit max_tokens over max_model_len,
 * is JOB_ERR_CONTEXT; a default max_tokens is clamped to what fits. tok and ct are borrowed (ct may
 * be NULL when the job has no messages). Returns JOB_OK, or a negative enum job_error with err; *in is always
 * initialised (job_input_free). */
int job_prepare(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
                struct job_input *in, char *err, size_t errlen);

/* Renders the job's messages with ct as job_prepare does: a new string in *text (free with free()).
 * Returns JOB_OK, or JOB_ERR_TEMPLATE / JOB_ERR_INTERNAL with err. */
int job_render_chat(const struct job *j, const struct chat_template *ct, char **text, size_t *len, char *err,
                    size_t errlen);
void job_input_free(struct job_input *in);

/* The engine_request.deadline of a job taken at `taken` (engine_now seconds): taken + timeout_s,
 * or 0 (none) when the job has no timeout_s. */
double job_deadline(const struct job *j, double taken);
/* The message of a job that timed out (FINISH_TIMEOUT) after n_tokens generated tokens. */
void job_timeout_error(const struct job *j, int n_tokens, char *buf, size_t len);

/* The job's effective parameters as a new JSON object (for SQLite's params column):
 * max_tokens, temperature, top_p, top_k, min_p, penalties, seed, stop, stop_token_ids, logprobs,
 * min_tokens, ignore_eos, thinking_budget, stop_in_reasoning (when set), skip_special_tokens,
 * enable_thinking (messages only), return_token_ids,
 * stream, timeout_s and priority (when set), constraint (job_constraint_name, when set), truncate
 * (its mode, when set).
 * NULL when out of memory. */
struct json_t *job_params_json(const struct job *j);
