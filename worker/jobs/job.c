/* Parsing and validating jobs; see job.h and docs/JOBS.md.
 *
 * One table lists every field of every form with its handler. A handler reads one value into the
 * job or writes an error naming the field and the value. Nulls count as absent (OpenAI clients
 * send them for unset fields). Cross-field rules run after all fields are read. */
#include "worker/jobs/job.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/chat_template.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/model.h"
#include "engine/think.h"
#include "engine/tokenizer.h"
#include "engine/util/errfmt.h"
#include "engine/util/jtype.h"
#include "engine/util/uuid.h"
#include "queue/jobid.h"
#include "queue/keys.h"
#include "worker/config/config.h"
#include "worker/jobs/template.h"
#include "worker/jobs/truncate.h"

#define NONE ""         /* struct field.neutral: no value of this field is accepted */
#define GREEDY_EPS 1e-5 /* temperatures below this are greedy (vLLM's _SAMPLING_EPS) */

/* Every way a job ends without completing, by its code. One table: the parser, the worker loop
 * (worker/loop/), `llmq run` and the results name failures only through it. */
static const struct {
    int rc;
    const char *code;
} error_codes[JOB_ERR_COUNT] = {
    {JOB_ERR_JSON, "invalid_json"},
    {JOB_ERR_TOO_LARGE, "job_too_large"},
    {JOB_ERR_INVALID, "invalid_request"},
    {JOB_ERR_CONTEXT, "context_length_exceeded"},
    {JOB_ERR_ENGINE, "engine_error"},
    {JOB_ERR_TIMEOUT, "timeout"},
    {JOB_ERR_CANCELLED, "cancelled"},
    {JOB_ERR_INTERNAL, "internal"},
    {JOB_ERR_STALLS, "max_stalls_exceeded"},
    {JOB_ERR_TEMPLATE, "template_error"},
    {JOB_ERR_RESPONSE_FORMAT, "invalid_response_format"},
};

const char *job_error_code(int rc)
{
    if (rc == JOB_OK)
        return "";
    for (size_t i = 0; i < JOB_ERR_COUNT; i++)
        if (error_codes[i].rc == rc)
            return error_codes[i].code;
    return "internal";
}

struct job_defaults job_defaults_builtin(void)
{
    struct job_defaults d = {.max_tokens = 256,
                             .temperature = 1.0f,
                             .top_p = 1.0f,
                             .min_p = 0.0f,
                             .repetition_penalty = 1.0f,
                             .presence_penalty = 0.0f,
                             .frequency_penalty = 0.0f,
                             .top_k = 0,
                             .enable_thinking = true};
    return d;
}

void job_defaults_from_cfg(struct job_defaults *d, const struct cfg_sampling *s)
{
    d->max_tokens = s->max_tokens;
    d->temperature = (float)s->temperature;
    d->top_p = (float)s->top_p;
    d->top_k = s->top_k;
    d->min_p = (float)s->min_p;
    d->repetition_penalty = (float)s->repetition_penalty;
    d->presence_penalty = (float)s->presence_penalty;
    d->frequency_penalty = (float)s->frequency_penalty;
    d->enable_thinking = s->enable_thinking;
}

void job_defaults_from_model(struct job_defaults *d, const struct model_config *mc, const char *model_dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    json_t *g = json_load_file(path, 0, NULL);
    if (!json_is_object(g)) { /* model_load read it; without it there is nothing to take */
        json_decref(g);
        return;
    }
#define GIVEN(key) (json_object_get(g, key) && !json_is_null(json_object_get(g, key)))
    if (mc->has_sampling_defaults) {
        if (GIVEN("temperature"))
            d->temperature = mc->gen_temperature;
        if (GIVEN("top_p"))
            d->top_p = mc->gen_top_p;
        if (GIVEN("top_k"))
            d->top_k = mc->gen_top_k < 0 ? 0 : mc->gen_top_k;
        if (GIVEN("min_p"))
            d->min_p = mc->gen_min_p;
        if (GIVEN("repetition_penalty"))
            d->repetition_penalty = mc->gen_repetition_penalty;
    }
    long long n;
    if (GIVEN("max_new_tokens") && json_is_integer(json_object_get(g, "max_new_tokens")) &&
        (n = json_integer_value(json_object_get(g, "max_new_tokens"))) >= 1 && n <= INT32_MAX)
        d->max_tokens = (int)n;
#undef GIVEN
    json_decref(g);
}

struct job_opts job_opts_default(void)
{
    struct job_opts o = {.defaults = job_defaults_builtin()};
    return o;
}

/* ---- parse context and error messages */

struct pctx {
    struct job *j;
    const struct job_opts *o;
    char *err;
    size_t errlen;
    const char *prefix;    /* "" for llmq's form, "body." inside an OpenAI body */
    json_t *template_name; /* borrowed from the root until the end of the parse */
    json_t *vars;
    bool chat_logprobs;   /* OpenAI chat: "logprobs": true */
    json_t *top_logprobs; /* OpenAI chat: "top_logprobs" (borrowed) */
    int n_top_logprobs;   /* ... its value */
    bool max_completion_tokens;
    bool kw_thinking;             /* chat_template_kwargs set enable_thinking */
    const char *constraint_field; /* the field that set j->constraint ("response_format", ...) */
    json_t *document;             /* "document" (borrowed) */
    json_t *summarize;            /* "summarize" (borrowed) */
};

/* A short JSON rendering of v for error messages: ASCII only (so cutting it cannot split a UTF-8
 * sequence), at most ~48 bytes. */
static void describe(const json_t *v, char *buf, size_t len)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    if (!s) {
        snprintf(buf, len, "?");
        return;
    }
    if (strlen(s) > 48)
        snprintf(buf, len, "%.45s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
}

/* "field '<prefix><name>': <what>, got <value>" (without ", got" when v is NULL). */
static int bad(struct pctx *c, const char *name, const json_t *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(struct pctx *c, const char *name, const json_t *v, const char *fmt, ...)
{
    char what[256], got[64] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (v)
        describe(v, got, sizeof got);
    return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "field '%s%s': %s%s%s", c->prefix, name, what,
                     v ? ", got " : "", got);
}

/* ---- typed readers */

static bool as_int(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) { /* 5.0 from a client that writes every number as a float */
        double r = json_real_value(v);
        if (isfinite(r) && r == floor(r) && r >= -9.2e18 && r <= 9.2e18) {
            *out = (long long)r;
            return true;
        }
    }
    return false;
}

static int read_int(struct pctx *c, const char *name, const json_t *v, long long lo, long long hi,
                    long long *out)
{
    if (as_int(v, out) && *out >= lo && *out <= hi)
        return 0;
    if (hi == LLONG_MAX)
        return bad(c, name, v, "expected an integer >= %lld", lo);
    return bad(c, name, v, "expected an integer between %lld and %lld", lo, hi);
}

/* A number in [lo, hi], with either end open when asked; hi = INFINITY for none. */
static int read_num(struct pctx *c, const char *name, const json_t *v, double lo, bool lo_open, double hi,
                    bool hi_open, double *out)
{
    if (json_is_number(v)) {
        double x = json_number_value(v);
        if (isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi)) {
            *out = x;
            return 0;
        }
    }
    if (isinf(hi))
        return bad(c, name, v, "expected a number %s %g", lo_open ? ">" : ">=", lo);
    if (!lo_open && !hi_open)
        return bad(c, name, v, "expected a number between %g and %g", lo, hi);
    return bad(c, name, v, "expected a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
               hi_open ? ')' : ']');
}

static int read_bool(struct pctx *c, const char *name, const json_t *v, bool *out)
{
    if (!json_is_boolean(v))
        return bad(c, name, v, "expected true or false");
    *out = json_is_true(v);
    return 0;
}

static int read_float(struct pctx *c, const char *name, const json_t *v, double lo, bool lo_open, double hi,
                      bool hi_open, float *out)
{
    double x = 0;
    if (read_num(c, name, v, lo, lo_open, hi, hi_open, &x))
        return JOB_ERR_INVALID;
    /* the bounds hold for the float that is stored, not only for the double read (1e-50 would
     * become 0 and 1e300 infinity) */
    float f = (float)x;
    if (!isfinite(f) || (lo_open ? f <= lo : f < lo) || (hi_open ? f >= hi : f > hi))
        return bad(c, name, v, "%g is not representable as a 32-bit float in the allowed range", x);
    *out = f;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* An id: 1..JOB_MAX_ID_BYTES bytes of UTF-8 without control characters, into *dst. */
static int read_id(struct pctx *c, const char *name, const json_t *v, char **dst)
{
    if (!json_is_string(v))
        return bad(c, name, v, "expected a string");
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > JOB_MAX_ID_BYTES)
        return bad(c, name, v, "expected 1 to %d bytes", JOB_MAX_ID_BYTES);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return bad(c, name, v, "must not contain control characters");
    free(*dst);
    *dst = dup_n(s, n);
    return *dst ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
}

/* "batch_id": a batch id (queue/keys.h: rq_valid_batch_id), or null for none. */
static int read_batch_id(struct pctx *c, const json_t *v)
{
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v) || !rq_valid_batch_id(json_string_value(v), json_string_length(v)))
        return bad(c, "batch_id", v, "expected 1 to %d letters, digits, '.', '_' or '-'", RQ_BATCH_ID_MAX);
    free(c->j->batch_id);
    c->j->batch_id = dup_n(json_string_value(v), json_string_length(v));
    return c->j->batch_id ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
}

/* ---- field handlers: int h(struct pctx *, const char *name, json_t *value) */

typedef int (*field_fn)(struct pctx *c, const char *name, json_t *v);

static int h_ignore(struct pctx *c, const char *name, json_t *v)
{
    return 0;
}

static int h_ignore_string(struct pctx *c, const char *name, json_t *v)
{
    return json_is_string(v) ? 0 : bad(c, name, v, "expected a string");
}

static int h_id(struct pctx *c, const char *name, json_t *v)
{
    return read_id(c, name, v, &c->j->id);
}

static int h_batch_id(struct pctx *c, const char *name, json_t *v)
{
    return read_batch_id(c, v);
}

static int h_prompt(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_string(v))
        return bad(c, name, v, "expected a string");
    if (json_string_length(v) == 0)
        return bad(c, name, NULL, "must not be empty");
    c->j->prompt = dup_n(json_string_value(v), json_string_length(v));
    return c->j->prompt ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
}

/* Completions: a string, [string], token ids [int...] or [[int...]] (one prompt per job). */
static int h_completion_prompt(struct pctx *c, const char *name, json_t *v)
{
    if (json_is_string(v))
        return h_prompt(c, name, v);
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(c, name, v, "expected a non-empty string, or a list of token ids");
    json_t *first = json_array_get(v, 0);
    if (json_is_string(first) || json_is_array(first)) {
        if (json_array_size(v) != 1)
            return bad(c, name, NULL, "only one prompt per request (%zu given)", json_array_size(v));
        if (json_is_string(first))
            return h_prompt(c, name, first);
        v = first;
        if (json_array_size(v) == 0)
            return bad(c, name, NULL, "the list of token ids is empty");
    }
    size_t n = json_array_size(v);
    c->j->prompt_ids = malloc(n * sizeof(int32_t));
    if (!c->j->prompt_ids)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long id = 0;
        if (!as_int(json_array_get(v, i), &id) || id < 0 || id > INT32_MAX) {
            char field[64];
            snprintf(field, sizeof field, "%s[%zu]", name, i);
            return bad(c, field, json_array_get(v, i), "expected a token id (an integer >= 0)");
        }
        c->j->prompt_ids[i] = (int32_t)id;
    }
    c->j->n_prompt_ids = (int)n;
    return 0;
}

/* The parts of a message's content: [{"type": "text", "text": "..."}, ...]. */
static int check_parts(struct pctx *c, const char *at, json_t *parts)
{
    size_t k;
    json_t *p;
    json_array_foreach(parts, k, p)
    {
        char field[128];
        snprintf(field, sizeof field, "%s.content[%zu]", at, k);
        json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(type))
            return bad(c, field, p, "expected a content part {\"type\": \"text\", \"text\": ...}");
        if (strcmp(json_string_value(type), "text") != 0) {
            snprintf(field + strlen(field), sizeof field - strlen(field), ".type");
            return bad(c, field, type, "only text parts are supported");
        }
        if (!json_is_string(text)) {
            snprintf(field + strlen(field), sizeof field - strlen(field), ".text");
            return bad(c, field, text ? text : json_null(), "expected a string");
        }
    }
    return 0;
}

/* An assistant message's "tool_calls": [{"id"?, "type"?: "function", "function": {"name", "arguments"}}]. */
static int check_tool_calls(struct pctx *c, const char *at, json_t *calls)
{
    char field[160];
    snprintf(field, sizeof field, "%s.tool_calls", at);
    if (!json_is_array(calls))
        return bad(c, field, calls, "expected a list of tool calls");
    size_t k;
    json_t *tc;
    json_array_foreach(calls, k, tc)
    {
        snprintf(field, sizeof field, "%s.tool_calls[%zu]", at, k);
        if (!json_is_object(tc))
            return bad(c, field, tc, "expected an object {\"type\": \"function\", \"function\": {...}}");
        json_t *id = json_object_get(tc, "id"), *type = json_object_get(tc, "type"),
               *fn = json_object_get(tc, "function");
        size_t n = strlen(field);
        if (id && !json_is_string(id)) {
            snprintf(field + n, sizeof field - n, ".id");
            return bad(c, field, id, "expected a string");
        }
        if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))) {
            snprintf(field + n, sizeof field - n, ".type");
            return bad(c, field, type, "expected \"function\"");
        }
        snprintf(field + n, sizeof field - n, ".function");
        if (!json_is_object(fn))
            return bad(c, field, fn ? fn : json_null(), "expected an object {\"name\", \"arguments\"}");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        n = strlen(field);
        if (!json_is_string(name)) {
            snprintf(field + n, sizeof field - n, ".name");
            return bad(c, field, name ? name : json_null(), "expected a string");
        }
        if (!json_is_string(args) && !json_is_object(args)) {
            snprintf(field + n, sizeof field - n, ".arguments");
            return bad(c, field, args ? args : json_null(), "expected a JSON string or an object");
        }
    }
    return 0;
}

/* One message of "messages" (m is the job's own copy, normalised in place). */
static int check_message(struct pctx *c, size_t i, json_t *m)
{
    char at[64];
    snprintf(at, sizeof at, "messages[%zu]", i);
    if (!json_is_object(m))
        return bad(c, at, m, "expected an object {\"role\", \"content\"}");
    char field[160];
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v)
    {
        static const char *const known[] = {"role",         "content",           "name", "tool_calls",
                                            "tool_call_id", "reasoning_content", NULL};
        bool ok = false;
        for (const char *const *k = known; *k; k++)
            ok = ok || !strcmp(*k, key);
        snprintf(field, sizeof field, "%s.%.64s", at, key);
        if (!ok)
            return bad(c, field, NULL,
                       "unknown key (a message has role, content, name, tool_calls, tool_call_id, "
                       "reasoning_content)");
        if ((!strcmp(key, "name") || !strcmp(key, "tool_call_id")) && !json_is_string(v))
            return bad(c, field, v, "expected a string");
        if (!strcmp(key, "reasoning_content") && !json_is_string(v) && !json_is_null(v))
            return bad(c, field, v, "expected a string or null");
    }
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    json_t *calls = json_object_get(m, "tool_calls");
    snprintf(field, sizeof field, "%s.role", at);
    if (!role)
        return bad(c, field, NULL, "missing");
    if (!json_is_string(role) || json_string_length(role) == 0)
        return bad(c, field, role, "expected a role such as \"user\"");
    if (strlen(json_string_value(role)) != json_string_length(role))
        return bad(c, field, NULL, "contains a NUL character");
    if (!strcmp(json_string_value(role), "developer") && /* OpenAI's new "system" */
        json_object_set_new(m, "role", json_string("system")))
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    bool assistant = !strcmp(json_string_value(json_object_get(m, "role")), "assistant");
    bool has_calls = calls && !json_is_null(calls);
    if (has_calls && !assistant) {
        snprintf(field, sizeof field, "%s.tool_calls", at);
        return bad(c, field, NULL, "only assistant messages have tool calls");
    }
    if (has_calls && check_tool_calls(c, at, calls))
        return JOB_ERR_INVALID;
    snprintf(field, sizeof field, "%s.content", at);
    bool calls_given = has_calls && json_array_size(calls) > 0;
    if (!content || json_is_null(content)) {
        if (!(assistant && calls_given))
            return bad(c, field, NULL,
                       content ? "null is only allowed in an assistant message with tool_calls" : "missing");
        if (!content && json_object_set_new(m, "content", json_null())) /* as OpenAI clients send it */
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
        return 0;
    }
    if (json_is_array(content))
        return check_parts(c, at, content);
    if (!json_is_string(content))
        return bad(c, field, content, "expected a string or a list of text parts");
    if (strlen(json_string_value(content)) != json_string_length(content))
        return bad(c, field, NULL, "contains a NUL character");
    return 0;
}

static int h_messages(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(c, name, v, "expected a non-empty list of messages");
    json_t *copy = json_deep_copy(v);
    if (!copy)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    c->j->messages = copy;
    for (size_t i = 0; i < json_array_size(copy); i++) {
        int rc = check_message(c, i, json_array_get(copy, i));
        if (rc)
            return rc;
    }
    return 0;
}

/* "tools": [{"type": "function", "function": {"name", "description"?, "parameters"?}}]. */
static int h_tools(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_array(v))
        return bad(c, name, v, "expected a list of tools {\"type\": \"function\", \"function\": {...}}");
    size_t k;
    json_t *t;
    json_array_foreach(v, k, t)
    {
        char field[96];
        snprintf(field, sizeof field, "%s[%zu]", name, k);
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        size_t n = strlen(field);
        if (!json_is_object(t))
            return bad(c, field, t, "expected an object {\"type\": \"function\", \"function\": {...}}");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
            snprintf(field + n, sizeof field - n, ".type");
            return bad(c, field, type ? type : json_null(), "expected \"function\"");
        }
        snprintf(field + n, sizeof field - n, ".function");
        if (!json_is_object(fn))
            return bad(c, field, fn ? fn : json_null(), "expected an object {\"name\", \"parameters\"?}");
        n = strlen(field);
        json_t *fname = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
               *params = json_object_get(fn, "parameters");
        if (!json_is_string(fname) || json_string_length(fname) == 0) {
            snprintf(field + n, sizeof field - n, ".name");
            return bad(c, field, fname ? fname : json_null(), "expected the function's name");
        }
        if (desc && !json_is_string(desc)) {
            snprintf(field + n, sizeof field - n, ".description");
            return bad(c, field, desc, "expected a string");
        }
        if (params && !json_is_object(params)) {
            snprintf(field + n, sizeof field - n, ".parameters");
            return bad(c, field, params, "expected a JSON Schema object");
        }
    }
    json_decref(c->j->tools);
    c->j->tools = json_array_size(v) ? json_incref(v) : NULL; /* [] is no tools, as OpenAI clients mean it */
    return 0;
}

/* "tool_choice": "auto" or "none". The tools are rendered into the prompt either way; the answer
 * is text (tool calls are not parsed out of it), so no choice can be enforced. */
static int h_tool_choice(struct pctx *c, const char *name, json_t *v)
{
    if (json_is_string(v) && (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "none")))
        return 0;
    return bad(c, name, v,
               "not supported by llmq (only \"auto\" and \"none\" are accepted: tool calls are "
               "not parsed out of the answer)");
}

/* "documents": a list of objects (retrieval-augmented templates read their keys). */
static int h_documents(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_array(v))
        return bad(c, name, v, "expected a list of objects");
    size_t k;
    json_t *d;
    json_array_foreach(v, k, d)
    {
        char field[64];
        snprintf(field, sizeof field, "%s[%zu]", name, k);
        if (!json_is_object(d))
            return bad(c, field, d, "expected an object");
    }
    json_decref(c->j->documents);
    c->j->documents = json_incref(v);
    return 0;
}

static int h_max_tokens(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (!strcmp(name, "max_tokens") && c->max_completion_tokens)
        return 0; /* max_completion_tokens wins */
    if (read_int(c, name, v, 1, INT32_MAX, &x))
        return JOB_ERR_INVALID;
    c->j->max_tokens = (int)x;
    c->j->max_tokens_given = true;
    if (!strcmp(name, "max_completion_tokens"))
        c->max_completion_tokens = true;
    return 0;
}

static int h_min_tokens(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (read_int(c, name, v, 0, INT32_MAX, &x))
        return JOB_ERR_INVALID;
    c->j->min_tokens = (int)x;
    return 0;
}

static int h_temperature(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, 0, false, 100, false, &c->j->sp.temperature);
}

static int h_top_p(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, 0, true, 1, false, &c->j->sp.top_p);
}

static int h_top_k(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (read_int(c, name, v, -1, INT32_MAX, &x))
        return JOB_ERR_INVALID;
    c->j->sp.top_k = x < 0 ? 0 : (int)x; /* -1 is vLLM's "off" */
    return 0;
}

static int h_min_p(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, 0, false, 1, false, &c->j->sp.min_p);
}

static int h_presence(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, -2, false, 2, false, &c->j->sp.presence_penalty);
}

static int h_frequency(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, -2, false, 2, false, &c->j->sp.frequency_penalty);
}

static int h_repetition(struct pctx *c, const char *name, json_t *v)
{
    return read_float(c, name, v, 0, true, INFINITY, false, &c->j->sp.repetition_penalty);
}

static int h_seed(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (!as_int(v, &x))
        return bad(c, name, v, "expected an integer");
    c->j->sp.seed = (uint64_t)x;
    c->j->has_seed = true;
    return 0;
}

static int add_stop(struct pctx *c, const char *field, json_t *s)
{
    if (!json_is_string(s))
        return bad(c, field, s, "expected a string");
    size_t n = json_string_length(s);
    if (n == 0)
        return bad(c, field, NULL, "a stop string must not be empty");
    if (n > JOB_MAX_STOP_BYTES)
        return bad(c, field, NULL, "a stop string is at most %d bytes (this one has %zu)", JOB_MAX_STOP_BYTES,
                   n);
    char *p = dup_n(json_string_value(s), n);
    if (!p)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    c->j->stop[c->j->n_stop++] = p;
    return 0;
}

static int h_stop(struct pctx *c, const char *name, json_t *v)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v))
        return bad(c, name, v, "expected a string or a list of strings");
    if (n > JOB_MAX_STOP)
        return bad(c, name, NULL, "at most %d stop strings (%zu given)", JOB_MAX_STOP, n);
    c->j->stop = calloc(n ? n : 1, sizeof(char *));
    if (!c->j->stop)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    if (json_is_string(v))
        return add_stop(c, name, v);
    for (size_t i = 0; i < n; i++) {
        char field[64];
        snprintf(field, sizeof field, "%s[%zu]", name, i);
        if (add_stop(c, field, json_array_get(v, i)))
            return JOB_ERR_INVALID;
    }
    return 0;
}

static int h_stop_ids(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_array(v))
        return bad(c, name, v, "expected a list of token ids");
    size_t n = json_array_size(v);
    if (n > JOB_MAX_STOP_IDS)
        return bad(c, name, NULL, "at most %d stop token ids (%zu given)", JOB_MAX_STOP_IDS, n);
    c->j->stop_ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!c->j->stop_ids)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long id = 0;
        char field[64];
        snprintf(field, sizeof field, "%s[%zu]", name, i);
        if (read_int(c, field, json_array_get(v, i), 0, INT32_MAX, &id))
            return JOB_ERR_INVALID;
        c->j->stop_ids[c->j->n_stop_ids++] = (int32_t)id;
    }
    return 0;
}

/* llmq and completions: an integer 0..20; llmq also takes true (= 0) and false (= none). */
static int h_logprobs_n(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (c->j->form == JOB_FORM_LLMQ && json_is_boolean(v)) {
        c->j->sp.logprobs = json_is_true(v) ? 0 : -1;
        return 0;
    }
    if (read_int(c, name, v, 0, SAMPLING_MAX_LOGPROBS, &x))
        return JOB_ERR_INVALID;
    c->j->sp.logprobs = (int)x;
    return 0;
}

/* OpenAI chat: "logprobs": bool, with "top_logprobs": N resolved after all fields. */
static int h_chat_logprobs(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->chat_logprobs);
}

static int h_top_logprobs(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (read_int(c, name, v, 0, SAMPLING_MAX_LOGPROBS, &x))
        return JOB_ERR_INVALID;
    c->top_logprobs = v;
    c->n_top_logprobs = (int)x;
    return 0;
}

static int h_return_token_ids(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->j->return_token_ids);
}

static int h_stream(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->j->stream);
}

static int h_enable_thinking(struct pctx *c, const char *name, json_t *v)
{
    bool b = false;
    if (read_bool(c, name, v, &b))
        return JOB_ERR_INVALID;
    if (!c->kw_thinking) /* chat_template_kwargs.enable_thinking wins */
        c->j->enable_thinking = b;
    return 0;
}

static int h_thinking_budget(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (read_int(c, name, v, 0, INT32_MAX, &x))
        return JOB_ERR_INVALID;
    c->j->thinking_budget = (int)x;
    return 0;
}

static int h_stop_in_reasoning(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->j->stop_in_reasoning);
}

static int h_ignore_eos(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->j->ignore_eos);
}

static int h_skip_special(struct pctx *c, const char *name, json_t *v)
{
    return read_bool(c, name, v, &c->j->skip_special_tokens);
}

static int h_timeout(struct pctx *c, const char *name, json_t *v)
{
    return read_num(c, name, v, 0, true, JOB_MAX_TIMEOUT_S, false, &c->j->timeout_s);
}

static int h_priority(struct pctx *c, const char *name, json_t *v)
{
    long long x = 0;
    if (read_int(c, name, v, -JOB_MAX_PRIORITY, JOB_MAX_PRIORITY, &x))
        return JOB_ERR_INVALID;
    c->j->priority = (int)x;
    return 0;
}

static int h_truncate(struct pctx *c, const char *name, json_t *v)
{
    enum job_truncate m = json_is_string(v) ? trunc_mode_of(json_string_value(v)) : JOB_TRUNCATE_NONE;
    if (m == JOB_TRUNCATE_NONE)
        return bad(c, name, v, "expected \"start\", \"end\" or \"middle\"");
    c->j->truncate = m;
    return 0;
}

static int h_template(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return bad(c, name, v, "expected the name of a template");
    c->template_name = v;
    return 0;
}

static int h_vars(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_object(v))
        return bad(c, name, v, "expected an object");
    c->vars = v;
    return 0;
}

static int h_document(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return bad(c, name, v, "expected the document's text (a non-empty string)");
    if (memchr(json_string_value(v), 0, json_string_length(v)))
        return bad(c, name, NULL, "contains a NUL character");
    c->document = v;
    return 0;
}

static int h_summarize(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_object(v) && !json_is_true(v))
        return bad(c, name, v, "expected an object of options ({} or true for the defaults)");
    c->summarize = v;
    return 0;
}

static int h_metadata(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_object(v))
        return bad(c, name, v, "expected an object");
    json_decref(c->j->metadata);
    c->j->metadata = json_incref(v);
    return 0;
}

/* "chat_template_kwargs": more variables for the chat template. enable_thinking (true, false or
 * null) is kept apart in j->enable_thinking; the names the job's own fields set are refused. */
static int h_chat_template_kwargs(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_object(v))
        return bad(c, name, v, "expected an object");
    json_t *kw = json_object();
    if (!kw)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    json_decref(c->j->chat_kwargs);
    c->j->chat_kwargs = kw;
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        char field[128];
        snprintf(field, sizeof field, "%s.%.64s", name, key);
        if (!strcmp(key, "messages") || !strcmp(key, "tools") || !strcmp(key, "documents") ||
            !strcmp(key, "add_generation_prompt"))
            return bad(c, field, NULL, "set by the job itself, not here%s",
                       strcmp(key, "tools") && strcmp(key, "documents") ? "" : " (use the job's field)");
        if (!strcmp(key, "enable_thinking")) {
            if (!json_is_null(val)) {
                if (read_bool(c, field, val, &c->j->enable_thinking))
                    return JOB_ERR_INVALID;
                c->kw_thinking = true;
            }
            continue;
        }
        if (json_object_set(kw, key, val))
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    }
    return 0;
}

/* ---- structured output: response_format, regex, choice (job.h, struct job_constraint) */

const char *job_constraint_name(enum job_constraint_kind kind)
{
    static const char *const names[] = {NULL, "json_schema", "json_object", "regex", "choice"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : NULL;
}

bool job_constraint_is_json(enum job_constraint_kind kind)
{
    return kind == JOB_CONSTRAINT_JSON_SCHEMA || kind == JOB_CONSTRAINT_JSON_OBJECT;
}

static void constraint_free(struct job_constraint *k)
{
    json_decref(k->schema);
    free(k->name);
    free(k->regex);
    for (size_t i = 0; i < k->n_choices; i++)
        free(k->choices[i]);
    free(k->choices);
    memset(k, 0, sizeof *k);
}

/* Claims the job's one constraint for `field`; an error when another field has it. */
static int claim_constraint(struct pctx *c, const char *field, enum job_constraint_kind kind)
{
    if (c->j->constraint.kind != JOB_CONSTRAINT_NONE)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_RESPONSE_FORMAT,
                         "fields '%s%s' and '%s%s' exclude each other (one constraint per job: a "
                         "json_schema or json_object response_format, a regex or a choice)",
                         c->prefix, c->constraint_field, c->prefix, field);
    c->j->constraint.kind = kind;
    c->constraint_field = field;
    return 0;
}

/* A string without NUL of at least one byte, copied into *dst. */
static int read_nonempty(struct pctx *c, const char *field, const json_t *v, char **dst)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return bad(c, field, v, "expected a non-empty string");
    if (strlen(json_string_value(v)) != json_string_length(v))
        return bad(c, field, NULL, "contains a NUL character");
    *dst = dup_n(json_string_value(v), json_string_length(v));
    return *dst ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
}

/* Unknown keys of an object of the response_format: an error naming the first. */
static int only_keys(struct pctx *c, const char *at, json_t *obj, const char *const *known, const char *list)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        bool ok = false;
        for (const char *const *k = known; *k; k++)
            ok = ok || !strcmp(*k, key);
        if (!ok) {
            char field[160];
            snprintf(field, sizeof field, "%s.%.64s", at, key);
            return bad(c, field, NULL, "unknown key (%s)", list);
        }
    }
    return 0;
}

/* response_format.json_schema: {"name", "schema", "strict"?, "description"?}. */
static int read_json_schema(struct pctx *c, const char *name, json_t *js)
{
    char at[64], field[96];
    struct job_constraint *k = &c->j->constraint;
    snprintf(at, sizeof at, "%s.json_schema", name);
    if (!json_is_object(js))
        return bad(c, at, js ? js : json_null(), "expected an object {\"name\", \"schema\", \"strict\"?}");
    static const char *const known[] = {"name", "schema", "strict", "description", NULL};
    if (only_keys(c, at, js, known, "json_schema has name, schema, strict, description"))
        return JOB_ERR_INVALID;
    json_t *jname = json_object_get(js, "name"), *schema = json_object_get(js, "schema"),
           *strict = json_object_get(js, "strict"), *desc = json_object_get(js, "description");
    snprintf(field, sizeof field, "%s.name", at);
    if (!jname || json_is_null(jname))
        return bad(c, field, NULL, "missing (OpenAI requires a name for the schema)");
    bool name_ok = json_is_string(jname) && json_string_length(jname) >= 1 &&
                   json_string_length(jname) <= JOB_MAX_SCHEMA_NAME;
    for (size_t i = 0; name_ok && i < json_string_length(jname); i++) {
        char ch = json_string_value(jname)[i];
        name_ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '-';
    }
    if (!name_ok)
        return bad(c, field, jname, "expected 1 to %d letters, digits, '_' or '-'", JOB_MAX_SCHEMA_NAME);
    snprintf(field, sizeof field, "%s.strict", at);
    if (strict && !json_is_null(strict) && read_bool(c, field, strict, &k->strict))
        return JOB_ERR_INVALID;
    snprintf(field, sizeof field, "%s.description", at);
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return bad(c, field, desc, "expected a string");
    snprintf(field, sizeof field, "%s.schema", at);
    if (!schema || json_is_null(schema))
        return bad(c, field, NULL, "missing (the JSON Schema the output must follow)");
    if (!json_is_object(schema))
        return bad(c, field, schema, "expected a JSON Schema object");
    char why[512];
    struct js_schema *compiled = js_compile(schema, why, sizeof why);
    if (!compiled)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_RESPONSE_FORMAT, "field '%s%s': %s", c->prefix, field,
                         why);
    /* the grammar too (without a vocabulary: no masks), so that what the grammar compilers refuse is
     * refused here, at enqueue; the worker compiles it again, once per distinct schema */
    struct grammar *g = gr_compile_schema(compiled, NULL, why, sizeof why);
    js_free(compiled);
    if (!g)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_RESPONSE_FORMAT, "field '%s%s': %s", c->prefix, field,
                         why);
    gr_unref(g);
    k->name = dup_n(json_string_value(jname), json_string_length(jname));
    k->schema = json_incref(schema);
    k->schema_hash = js_hash(schema);
    return k->name ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
}

static int response_format(struct pctx *c, const char *name, json_t *v)
{
    static const char expect[] = "expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}";
    if (!json_is_object(v))
        return bad(c, name, v, expect);
    char field[64];
    snprintf(field, sizeof field, "%s.type", name);
    json_t *type = json_object_get(v, "type");
    if (!json_is_string(type))
        return bad(c, field, type ? type : json_null(),
                   "expected \"text\", \"json_object\" or \"json_schema\"");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text") || !strcmp(t, "json_object")) {
        static const char *const known[] = {"type", NULL};
        if (only_keys(c, name, v, known, "this type has only 'type'"))
            return JOB_ERR_INVALID;
        if (!strcmp(t, "text"))
            return 0;
        return claim_constraint(c, name, JOB_CONSTRAINT_JSON_OBJECT);
    }
    if (!strcmp(t, "json_schema")) {
        static const char *const known[] = {"type", "json_schema", NULL};
        if (only_keys(c, name, v, known, "response_format has type and json_schema"))
            return JOB_ERR_INVALID;
        int rc = claim_constraint(c, name, JOB_CONSTRAINT_JSON_SCHEMA);
        return rc ? rc : read_json_schema(c, name, json_object_get(v, "json_schema"));
    }
    return bad(c, field, type, "expected \"text\", \"json_object\" or \"json_schema\"");
}

static int regex_field(struct pctx *c, const char *name, json_t *v)
{
    int rc = claim_constraint(c, name, JOB_CONSTRAINT_REGEX);
    if (!rc)
        rc = read_nonempty(c, name, v, &c->j->constraint.regex);
    if (rc)
        return rc;
    char why[512];
    struct grammar *g = gr_compile_regex(c->j->constraint.regex, NULL, why, sizeof why); /* its syntax */
    if (!g)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_RESPONSE_FORMAT, "field '%s%s': %s", c->prefix, name, why);
    gr_unref(g);
    return 0;
}

static int choice_field(struct pctx *c, const char *name, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(c, name, v, "expected a non-empty list of strings");
    size_t n = json_array_size(v);
    if (n > JOB_MAX_CHOICES)
        return bad(c, name, NULL, "at most %d choices (%zu given)", JOB_MAX_CHOICES, n);
    int rc = claim_constraint(c, name, JOB_CONSTRAINT_CHOICE);
    if (rc)
        return rc;
    struct job_constraint *k = &c->j->constraint;
    k->choices = calloc(n, sizeof(char *));
    if (!k->choices)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char field[64];
        snprintf(field, sizeof field, "%s[%zu]", name, i);
        if ((rc = read_nonempty(c, field, json_array_get(v, i), &k->choices[i])))
            return rc;
        k->n_choices++;
    }
    return 0;
}

/* The handlers: what `bad` calls invalid_request is invalid_response_format here. */
static int as_rf(int rc)
{
    return rc == JOB_ERR_INVALID ? JOB_ERR_RESPONSE_FORMAT : rc;
}
static int h_response_format(struct pctx *c, const char *name, json_t *v)
{
    return as_rf(response_format(c, name, v));
}
static int h_regex(struct pctx *c, const char *name, json_t *v)
{
    return as_rf(regex_field(c, name, v));
}
static int h_choice(struct pctx *c, const char *name, json_t *v)
{
    return as_rf(choice_field(c, name, v));
}

/* ---- the field table */

enum { F_LLMQ = 1, F_CHAT = 2, F_COMPL = 4, F_OPENAI = F_CHAT | F_COMPL, F_ALL = 7 };

struct field {
    const char *name;
    unsigned forms;
    field_fn fn;
    const char *neutral; /* OpenAI fields llmq does not support: the one value (JSON) that is accepted,
                            or NONE when no value is */
};

static const struct field fields[] = {
    {"id", F_LLMQ, h_id, NULL},
    {"batch_id", F_LLMQ, h_batch_id, NULL},
    {"prompt", F_LLMQ, h_completion_prompt, NULL},
    {"prompt", F_COMPL, h_completion_prompt, NULL},
    {"messages", F_LLMQ | F_CHAT, h_messages, NULL},
    {"template", F_LLMQ, h_template, NULL},
    {"vars", F_LLMQ, h_vars, NULL},
    {"document", F_LLMQ, h_document, NULL},
    {"summarize", F_LLMQ, h_summarize, NULL},
    {"max_tokens", F_ALL, h_max_tokens, NULL},
    {"max_completion_tokens", F_CHAT, h_max_tokens, NULL},
    {"min_tokens", F_ALL, h_min_tokens, NULL},
    {"temperature", F_ALL, h_temperature, NULL},
    {"top_p", F_ALL, h_top_p, NULL},
    {"top_k", F_ALL, h_top_k, NULL},
    {"min_p", F_ALL, h_min_p, NULL},
    {"seed", F_ALL, h_seed, NULL},
    {"stop", F_ALL, h_stop, NULL},
    {"stop_token_ids", F_ALL, h_stop_ids, NULL},
    {"presence_penalty", F_ALL, h_presence, NULL},
    {"frequency_penalty", F_ALL, h_frequency, NULL},
    {"repetition_penalty", F_ALL, h_repetition, NULL},
    {"logprobs", F_LLMQ | F_COMPL, h_logprobs_n, NULL},
    {"logprobs", F_CHAT, h_chat_logprobs, NULL},
    {"top_logprobs", F_CHAT, h_top_logprobs, NULL},
    {"return_token_ids", F_LLMQ, h_return_token_ids, NULL},
    {"enable_thinking", F_LLMQ, h_enable_thinking, NULL},
    {"chat_template_kwargs", F_LLMQ | F_CHAT, h_chat_template_kwargs, NULL},
    {"tools", F_LLMQ | F_CHAT, h_tools, NULL},
    {"documents", F_LLMQ | F_CHAT, h_documents, NULL},
    {"ignore_eos", F_ALL, h_ignore_eos, NULL},
    {"thinking_budget", F_ALL, h_thinking_budget, NULL},
    {"stop_in_reasoning", F_ALL, h_stop_in_reasoning, NULL},
    {"skip_special_tokens", F_ALL, h_skip_special, NULL},
    {"metadata", F_ALL, h_metadata, NULL},
    {"stream", F_ALL, h_stream, NULL},
    {"timeout_s", F_ALL, h_timeout, NULL}, /* in OpenAI bodies: llmq's extensions, like vLLM's */
    {"priority", F_ALL, h_priority, NULL},
    {"truncate", F_ALL, h_truncate, NULL},
    {"response_format", F_ALL, h_response_format, NULL},
    {"regex", F_ALL, h_regex, NULL}, /* llmq's, also in OpenAI bodies */
    {"choice", F_ALL, h_choice, NULL},
    /* OpenAI fields that change nothing here */
    {"model", F_ALL, h_ignore, NULL}, /* read first, by read_model */
    {"user", F_OPENAI, h_ignore_string, NULL},
    {"store", F_CHAT, h_ignore, NULL},
    {"service_tier", F_OPENAI, h_ignore, NULL},
    {"prompt_cache_key", F_OPENAI, h_ignore, NULL},
    {"safety_identifier", F_OPENAI, h_ignore, NULL},
    {"parallel_tool_calls", F_CHAT, h_ignore, NULL},
    {"tool_choice", F_CHAT, h_tool_choice, NULL},
    /* OpenAI fields llmq does not support: only their neutral value is accepted */
    {"n", F_OPENAI, NULL, "1"},
    {"best_of", F_COMPL, NULL, "1"},
    {"echo", F_COMPL, NULL, "false"},
    {"suffix", F_COMPL, NULL, "\"\""},
    {"stream_options", F_OPENAI, NULL, "{}"},
    {"logit_bias", F_OPENAI, NULL, "{}"},
    {"functions", F_CHAT, NULL, "[]"},
    {"function_call", F_CHAT, NULL, "\"none\""},
    {"modalities", F_CHAT, NULL, "[\"text\"]"},
    {"audio", F_CHAT, NULL, NONE},
    {"prediction", F_CHAT, NULL, NONE},
    {"reasoning_effort", F_CHAT, NULL, NONE},
    {"web_search_options", F_CHAT, NULL, NONE},
    {"verbosity", F_CHAT, NULL, NONE},
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

static const struct field *field_find(const char *name, unsigned form)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if ((fields[i].forms & form) && !strcmp(fields[i].name, name))
            return &fields[i];
    return NULL;
}

/* Levenshtein distance, capped: enough to suggest "max_tokens" for "max_token". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    size_t d[41][41];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t k = 0; k <= lb; k++)
        d[0][k] = k;
    for (size_t i = 1; i <= la; i++)
        for (size_t k = 1; k <= lb; k++) {
            size_t best = d[i - 1][k - 1] + (a[i - 1] != b[k - 1]);
            if (d[i - 1][k] + 1 < best)
                best = d[i - 1][k] + 1;
            if (d[i][k - 1] + 1 < best)
                best = d[i][k - 1] + 1;
            d[i][k] = best;
        }
    return d[la][lb];
}

static int unknown_field(struct pctx *c, const char *key, unsigned form, const char *const *extra)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < N_FIELDS; i++)
        if (fields[i].forms & form) {
            size_t d = edit_distance(key, fields[i].name);
            if (d < best_d)
                best_d = d, best = fields[i].name;
        }
    for (; extra && *extra; extra++) {
        size_t d = edit_distance(key, *extra);
        if (d < best_d)
            best_d = d, best = *extra;
    }
    if (best)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "unknown field '%s%.64s' (did you mean '%s'?)",
                         c->prefix, key, best);
    return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "unknown field '%s%.64s'", c->prefix, key);
}

/* Reads every field of obj for `form`: unknown names first, then each value in order. */
static int read_fields(struct pctx *c, json_t *obj, unsigned form, const char *const *extra)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        bool known = field_find(key, form) != NULL;
        for (const char *const *e = extra; !known && e && *e; e++)
            known = !strcmp(*e, key);
        if (!known)
            return unknown_field(c, key, form, extra);
    }
    json_object_foreach(obj, key, v)
    {
        const struct field *f = field_find(key, form);
        if (!f || json_is_null(v))
            continue;
        if (f->neutral) {
            json_t *ok = f->neutral[0] ? json_loads(f->neutral, JSON_DECODE_ANY, NULL) : NULL;
            bool same = ok && json_equal(ok, v);
            json_decref(ok);
            if (same)
                continue;
            if (!f->neutral[0])
                return bad(c, key, NULL, "not supported by llmq");
            return bad(c, key, v, "not supported by llmq (only %s is accepted)", f->neutral);
        }
        int rc = f->fn(c, key, v);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- templates (worker/jobs/template.c renders; the messages name the job's fields) */

static int render_template(struct pctx *c, const char *tname, const char *text, json_t *vars)
{
    char *out = NULL, var[TMPL_MAX_NAME + 1], msg[256];
    int rc = tmpl_render(text, vars, &out, var, msg, sizeof msg);
    switch (rc) {
    case TMPL_OK:
        break;
    case TMPL_ERR_MISSING:
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "field 'vars': template '%s' needs '%s'", tname,
                         var);
    case TMPL_ERR_TYPE: {
        char field[TMPL_MAX_NAME + 8];
        snprintf(field, sizeof field, "vars.%s", var);
        return bad(c, field, json_object_get(vars, var), "expected a string or a number");
    }
    case TMPL_ERR_NOMEM:
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    default:
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "template '%s': %s", tname, msg);
    }
    if (!out[0]) {
        free(out);
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "template '%s' rendered an empty prompt", tname);
    }
    c->j->prompt = out;
    return 0;
}

/* ---- the forms */

static int summarize_form(struct pctx *c);

static int llmq_form(struct pctx *c, json_t *root)
{
    struct job *j = c->j;
    int rc = read_fields(c, root, F_LLMQ, NULL);
    if (rc)
        return rc;
    int inputs = (j->prompt != NULL || j->prompt_ids != NULL) + (j->messages != NULL) +
                 (c->template_name != NULL) + (c->document != NULL);
    if (inputs == 0)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "missing field: one of 'prompt', 'messages', 'template' or 'document' is required");
    if (inputs > 1)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "fields 'prompt', 'messages', 'template' and 'document' exclude each other (%d given)",
                         inputs);
    if (c->vars && !c->template_name && !c->document)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "field 'vars': only used with 'template' or 'document'");
    if (c->document || c->summarize)
        return summarize_form(c);
    if (!j->messages && !c->template_name) { /* a prompt goes to the model without a chat template */
        const char *f = j->tools         ? "tools"
                        : j->documents   ? "documents"
                        : j->chat_kwargs ? "chat_template_kwargs"
                                         : NULL;
        if (f)
            return errfmt_rc(
                c->err, c->errlen, JOB_ERR_INVALID,
                "field '%s': only used with 'messages' or 'template' (a prompt gets no chat template)", f);
    }
    if (c->template_name) {
        const char *name = json_string_value(c->template_name);
        if (!c->o->template_find)
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                             "field 'template': templates are not configured");
        const char *text = c->o->template_find(c->o->template_ctx, name);
        if (!text)
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                             "field 'template': no template named '%.64s' %s", name,
                             c->o->template_where ? c->o->template_where : "in the config");
        /* The rendered text is one user message through the chat template. */
        rc = render_template(c, name, text, c->vars);
        if (rc)
            return rc;
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", j->prompt);
        free(j->prompt);
        j->prompt = NULL;
        if (!msgs)
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
        j->messages = msgs;
    }
    return 0;
}

/* ---- map-reduce summary jobs: "document" with "summarize" */

const char job_summarize_map_text[] =
    "The text below is part {part} of {parts} of a longer document. Summarize it in a few sentences, "
    "in the language of the text. Keep the facts, names, numbers and decisions.\n\n{document}";
const char job_summarize_reduce_text[] =
    "The texts below summarize consecutive parts of one document, in order. Combine them into one "
    "summary of the whole document, in the language of the text. Keep the facts, names, numbers and "
    "decisions.\n\n{document}";

/* The text of template `name` for summarize.<field> (dflt: the built-in text of the default name),
 * as an owned copy in *dst. */
static int summarize_template(struct pctx *c, const char *field, const json_t *v, const char *dflt_name,
                              const char *dflt_text, char **name_out, char **dst)
{
    const char *name = dflt_name;
    if (v) {
        if (!json_is_string(v) || json_string_length(v) == 0)
            return bad(c, field, v, "expected the name of a template");
        name = json_string_value(v);
    }
    const char *text = c->o->template_find ? c->o->template_find(c->o->template_ctx, name) : NULL;
    if (!text && !v)
        text = dflt_text;
    if (!text)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "field '%s': no template named '%.64s' %s", field,
                         name, c->o->template_where ? c->o->template_where : "in the config");
    char msg[256];
    if (tmpl_check(text, msg, sizeof msg))
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "field '%s': template '%.64s': %s", field, name,
                         msg);
    *name_out = strdup(name);
    *dst = strdup(text);
    if (!*name_out || !*dst)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    return 0;
}

static int summarize_form(struct pctx *c)
{
    struct job *j = c->j;
    if (!c->document)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "field 'summarize': needs the text in 'document' (exclusive of 'prompt', "
                         "'messages' and 'template')");
    if (!c->summarize)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "field 'document': only used with 'summarize' (a map-reduce summary; "
                         "\"summarize\": {} for the defaults)");
    const char *refused = j->stream                          ? "stream"
                          : j->truncate != JOB_TRUNCATE_NONE ? "truncate"
                          : j->sp.logprobs >= 0              ? "logprobs"
                          : j->return_token_ids              ? "return_token_ids"
                          : j->tools                         ? "tools"
                          : j->documents                     ? "documents"
                                                             : NULL;
    if (refused)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "field '%s': not supported with 'summarize'",
                         refused);
    struct job_summarize *s = calloc(1, sizeof *s);
    if (!s)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    j->summarize = s;
    s->overlap_tokens = -1;
    s->document_len = json_string_length(c->document);
    s->document = dup_n(json_string_value(c->document), s->document_len);
    if (!s->document)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INTERNAL, "out of memory");
    s->vars = json_incref(c->vars);
    json_t *o = json_is_object(c->summarize) ? c->summarize : NULL;
    static const char *const known[] = {"chunk_tokens",  "overlap_tokens", "max_tokens",
                                        "map_template", "reduce_template", NULL};
    if (o) {
        int rc = only_keys(c, "summarize", o, known,
                           "chunk_tokens, overlap_tokens, max_tokens, map_template, reduce_template");
        if (rc)
            return rc;
    }
    long long x;
    json_t *v;
    if (o && (v = json_object_get(o, "chunk_tokens"))) {
        if (read_int(c, "summarize.chunk_tokens", v, 16, INT32_MAX, &x))
            return JOB_ERR_INVALID;
        s->chunk_tokens = (int)x;
    }
    if (o && (v = json_object_get(o, "overlap_tokens"))) {
        if (read_int(c, "summarize.overlap_tokens", v, 0, INT32_MAX, &x))
            return JOB_ERR_INVALID;
        s->overlap_tokens = (int)x;
    }
    if (o && (v = json_object_get(o, "max_tokens"))) {
        if (read_int(c, "summarize.max_tokens", v, 1, INT32_MAX, &x))
            return JOB_ERR_INVALID;
        s->max_tokens = (int)x;
    }
    int rc = summarize_template(c, "summarize.map_template", o ? json_object_get(o, "map_template") : NULL,
                                JOB_SUMMARIZE_MAP, job_summarize_map_text, &s->map_template, &s->map_text);
    if (!rc)
        rc = summarize_template(c, "summarize.reduce_template",
                                o ? json_object_get(o, "reduce_template") : NULL, JOB_SUMMARIZE_REDUCE,
                                job_summarize_reduce_text, &s->reduce_template, &s->reduce_text);
    return rc;
}

static int openai_form(struct pctx *c, json_t *root)
{
    struct job *j = c->j;
    static const char *const top[] = {"custom_id", "method", "url", "body", "batch_id", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        bool known = false;
        for (const char *const *t = top; *t; t++)
            known = known || !strcmp(*t, key);
        if (!known) {
            const char *best = NULL;
            for (const char *const *t = top; *t; t++)
                if (edit_distance(key, *t) <= 2)
                    best = *t;
            if (best)
                return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                                 "unknown field '%.64s' (did you mean '%s'?)", key, best);
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                             "unknown field '%.64s' (an OpenAI batch line has custom_id, method, url, body)",
                             key);
        }
    }
    json_t *method = json_object_get(root, "method"), *url = json_object_get(root, "url");
    json_t *body = json_object_get(root, "body");
    if (!j->custom_id)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "missing field 'custom_id'");
    if (method && !(json_is_string(method) && !strcmp(json_string_value(method), "POST")))
        return bad(c, "method", method, "expected \"POST\"");
    if (!url)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID,
                         "missing field 'url' (\"/v1/chat/completions\" or \"/v1/completions\")");
    if (!json_is_string(url))
        return bad(c, "url", url, "expected \"/v1/chat/completions\" or \"/v1/completions\"");
    if (!strcmp(json_string_value(url), "/v1/chat/completions"))
        j->form = JOB_FORM_CHAT;
    else if (!strcmp(json_string_value(url), "/v1/completions"))
        j->form = JOB_FORM_COMPLETION;
    else
        return bad(c, "url", url, "not supported (use \"/v1/chat/completions\" or \"/v1/completions\")");
    if (!body)
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "missing field 'body'");
    if (!json_is_object(body))
        return bad(c, "body", body, "expected an object");
    c->prefix = "body.";
    int rc = read_fields(c, body, j->form == JOB_FORM_CHAT ? F_CHAT : F_COMPL, NULL);
    if (rc)
        return rc;
    if (j->form == JOB_FORM_CHAT) {
        if (!j->messages)
            return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "missing field 'body.messages'");
        if (c->top_logprobs && !c->chat_logprobs)
            return bad(c, "top_logprobs", c->top_logprobs, "needs \"logprobs\": true");
        if (c->chat_logprobs)
            j->sp.logprobs = c->n_top_logprobs;
    } else if (!j->prompt && !j->prompt_ids) {
        return errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "missing field 'body.prompt'");
    }
    return 0;
}

/* ---- job_parse */

/* Nesting depth of the JSON text (strings skipped); returns the byte offset where it first goes
 * over max, or -1. */
static long too_deep(const char *s, size_t n, int max)
{
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max)
                return (long)i;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return -1;
}

static bool looks_openai(const char *s, size_t n)
{
    return memmem(s, n, "\"custom_id\"", 11) != NULL;
}

static void job_init(struct job *j, const struct job_opts *o)
{
    memset(j, 0, sizeof *j);
    const struct job_defaults *d = &o->defaults;
    j->form = JOB_FORM_LLMQ;
    j->sp = sampling_params_default();
    j->sp.temperature = d->temperature;
    j->sp.top_p = d->top_p;
    j->sp.top_k = d->top_k;
    j->sp.min_p = d->min_p;
    j->sp.repetition_penalty = d->repetition_penalty;
    j->sp.presence_penalty = d->presence_penalty;
    j->sp.frequency_penalty = d->frequency_penalty;
    j->sp.logprobs = -1;
    j->max_tokens = d->max_tokens;
    j->enable_thinking = d->enable_thinking;
    j->skip_special_tokens = true;
    j->thinking_budget = -1;
}

/* "model" (llmq) or "body.model" (OpenAI) into j->model: a model name (queue/keys.h's rule), or
 * absent, null or "" for none. */
static int read_model(struct pctx *c, json_t *obj, const char *field)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, "model") : NULL;
    if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))
        return 0;
    if (!json_is_string(v) || json_string_length(v) > RQ_MODEL_MAX ||
        !rq_valid_model_name(json_string_value(v)))
        return bad(c, field, v, "expected a model name (1 to %d letters, digits, '.', '_', '-', '/')",
                   RQ_MODEL_MAX);
    c->j->model = strdup(json_string_value(v));
    return c->j->model ? 0 : errfmt_rc(c->err, c->errlen, JOB_ERR_INVALID, "out of memory");
}

int job_parse(const char *line, size_t len, const struct job_opts *o, struct job *j, char *err, size_t errlen)
{
    struct job_opts def;
    if (!o) {
        def = job_opts_default();
        o = &def;
    }
    job_init(j, o);
    if (err && errlen)
        err[0] = 0;
    if (o->max_bytes > 0 && (int64_t)len > o->max_bytes) {
        if (looks_openai(line, len))
            j->form = JOB_FORM_CHAT;
        errfmt(err, errlen, "the job is %zu bytes, over the limit of %lld (queues.max_job_bytes)", len,
               (long long)o->max_bytes);
        return JOB_ERR_TOO_LARGE;
    }
    long at = too_deep(line, len, JOB_MAX_DEPTH);
    if (at >= 0) {
        if (looks_openai(line, len))
            j->form = JOB_FORM_CHAT;
        errfmt(err, errlen, "invalid JSON: nested deeper than %d levels (at byte %ld)", JOB_MAX_DEPTH, at);
        return JOB_ERR_JSON;
    }
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        if (looks_openai(line, len))
            j->form = JOB_FORM_CHAT;
        errfmt(err, errlen, "invalid JSON (line %d, column %d): %s", jerr.line, jerr.column, jerr.text);
        return JOB_ERR_JSON;
    }
    struct pctx c = {.j = j, .o = o, .err = err, .errlen = errlen, .prefix = ""};
    int rc;
    if (!json_is_object(root)) {
        /* jobs say "a number" for integers and reals alike */
        errfmt(err, errlen, "invalid JSON: a job is an object, got %s",
               json_is_number(root) ? "a number" : jtype_name(root));
        rc = JOB_ERR_JSON;
    } else if (json_object_get(root, "custom_id") || json_object_get(root, "body") ||
               json_object_get(root, "url") || json_object_get(root, "method")) {
        j->form = JOB_FORM_CHAT;
        json_t *cid = json_object_get(root, "custom_id");
        rc = cid && !json_is_null(cid) ? read_id(&c, "custom_id", cid, &j->custom_id) : 0;
        if (rc == 0)
            rc = read_batch_id(&c, json_object_get(root, "batch_id"));
        if (rc == 0 && j->custom_id) { /* the key: queue/jobid.h's rule */
            char key[RQ_ID_MAX + 1];
            rq_openai_key(j->batch_id, j->custom_id, key);
            j->id = strdup(key);
            rc = j->id ? 0 : errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "out of memory");
        }
        if (rc == 0)
            rc = read_model(&c, json_object_get(root, "body"), "body.model");
        if (rc == 0)
            rc = openai_form(&c, root);
    } else {
        json_t *id = json_object_get(root, "id");
        rc = id && !json_is_null(id) ? read_id(&c, "id", id, &j->id) : 0;
        if (rc == 0)
            rc = read_model(&c, root, "model");
        if (rc == 0)
            rc = llmq_form(&c, root);
    }
    if (rc == 0) {
        if (j->min_tokens > j->max_tokens) {
            errfmt(err, errlen, "field '%smin_tokens': %d is over max_tokens (%d%s)", c.prefix, j->min_tokens,
                   j->max_tokens, j->max_tokens_given ? "" : ", the default");
            rc = JOB_ERR_INVALID;
        }
        if (j->sp.temperature < GREEDY_EPS)
            j->sp.temperature = 0;
    }
    json_decref(root);
    return rc;
}

void job_free(struct job *j)
{
    if (!j)
        return;
    free(j->id);
    free(j->model);
    free(j->custom_id);
    free(j->batch_id);
    free(j->prompt);
    free(j->prompt_ids);
    json_decref(j->messages);
    json_decref(j->tools);
    json_decref(j->documents);
    json_decref(j->chat_kwargs);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->stop);
    free(j->stop_ids);
    json_decref(j->metadata);
    constraint_free(&j->constraint);
    if (j->summarize) {
        free(j->summarize->document);
        free(j->summarize->map_template);
        free(j->summarize->reduce_template);
        free(j->summarize->map_text);
        free(j->summarize->reduce_text);
        json_decref(j->summarize->vars);
        free(j->summarize);
    }
    memset(j, 0, sizeof *j);
}

void job_drop_input(struct job *j)
{
    j->chat = j->chat || j->messages;
    free(j->prompt);
    free(j->prompt_ids);
    json_decref(j->messages);
    json_decref(j->tools);
    json_decref(j->documents);
    json_decref(j->chat_kwargs);
    j->prompt = NULL;
    j->prompt_ids = NULL;
    j->n_prompt_ids = 0;
    j->messages = NULL;
    j->tools = NULL;
    j->documents = NULL;
    j->chat_kwargs = NULL;
}

json_t *job_metadata_of(const char *line, size_t len)
{
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    const json_t *from = root;
    if (json_object_get(root, "custom_id") || json_object_get(root, "body") || json_object_get(root, "url") ||
        json_object_get(root, "method"))
        from = json_object_get(root, "body");
    json_t *m = json_object_get(from, "metadata");
    m = json_is_object(m) ? json_incref(m) : NULL;
    json_decref(root);
    return m;
}

/* ---- ids */

int job_assign_id(struct job *j)
{
    if (j->id)
        return 0;
    char id[JOB_ID_LEN + 1];
    uuid7(id);
    j->id = strdup(id);
    if (!j->id)
        return -1;
    j->id_generated = true;
    return 0;
}

/* ---- into an engine request */

int job_render_chat(const struct job *j, const struct chat_template *ct, char **text, size_t *len, char *err,
                    size_t errlen)
{
    *text = NULL;
    *len = 0;
    json_t *kw = j->chat_kwargs ? json_copy(j->chat_kwargs) : json_object();
    if (!kw || json_object_set_new(kw, "enable_thinking", json_boolean(j->enable_thinking))) {
        json_decref(kw);
        return errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "out of memory");
    }
    struct chat_input ci = {.messages = j->messages,
                            .tools = j->tools,
                            .documents = j->documents,
                            .kwargs = kw,
                            .add_generation_prompt = true};
    int rc = chat_template_render(ct, &ci, text, len, err, errlen);
    json_decref(kw);
    return rc == CHAT_OK ? JOB_OK : JOB_ERR_TEMPLATE;
}

int job_prepare(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
                struct job_input *in, char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    size_t n = 0;
    if (j->prompt_ids) {
        n = (size_t)j->n_prompt_ids;
        in->tokens = malloc(n * sizeof(int32_t));
        if (!in->tokens) {
            errfmt(err, errlen, "out of memory");
            return JOB_ERR_INTERNAL;
        }
        memcpy(in->tokens, j->prompt_ids, n * sizeof(int32_t));
    } else if (j->messages) {
        char *text = NULL;
        size_t len = 0;
        int rc = job_render_chat(j, ct, &text, &len, err, errlen);
        if (rc)
            return rc;
        /* The rendered text carries its own special tokens. */
        rc = tok_encode_ex(tok, text, len, false, &in->tokens, &n, err, errlen);
        free(text);
        if (rc)
            return JOB_ERR_INVALID;
    } else if (j->prompt) {
        if (tok_encode(tok, j->prompt, strlen(j->prompt), &in->tokens, &n, err, errlen))
            return JOB_ERR_INVALID;
    } else {
        errfmt(err, errlen, "the job has no prompt");
        return JOB_ERR_INVALID;
    }
    in->n_tokens = (int)n;
    if (n == 0) {
        errfmt(err, errlen, "the prompt is empty after tokenization");
        return JOB_ERR_INVALID;
    }
    int rc = trunc_fit(j, tok, ct, max_model_len, &in->tokens, &n, &in->truncated_tokens, err, errlen);
    if (rc)
        return rc;
    in->n_tokens = (int)n;
    int max_tokens = j->max_tokens;
    if (max_model_len > 0) {
        if ((long long)n >= max_model_len) {
            errfmt(
                err, errlen,
                "the prompt has %zu tokens; max_model_len is %d and leaves no room to generate (" TRUNC_HINT
                ")",
                n, max_model_len);
            return JOB_ERR_CONTEXT;
        }
        long long room = max_model_len - (long long)n;
        if (max_tokens > room) {
            if (j->max_tokens_given) {
                errfmt(
                    err, errlen,
                    "max_tokens is %d, but the prompt has %zu tokens and max_model_len is %d: at most %lld "
                    "tokens can be generated (lower max_tokens, or " TRUNC_HINT ")",
                    max_tokens, n, max_model_len, room);
                return JOB_ERR_CONTEXT;
            }
            max_tokens = (int)room; /* the default shrinks to what fits */
        }
    }
    struct engine_request *r = &in->req;
    *r = engine_request_default();
    r->prompt = in->tokens;
    r->n_prompt = in->n_tokens;
    r->sp = j->sp;
    r->has_seed = j->has_seed;
    r->max_tokens = max_tokens;
    r->min_tokens = j->min_tokens < max_tokens ? j->min_tokens : max_tokens;
    r->ignore_eos = j->ignore_eos;
    r->stop = (const char *const *)j->stop;
    r->n_stop = j->n_stop;
    r->stop_ids = j->stop_ids;
    r->n_stop_ids = j->n_stop_ids;
    r->skip_special_tokens = j->skip_special_tokens;
    r->priority = j->priority;
    r->stop_in_reasoning = j->stop_in_reasoning;
    r->no_think_split = j->form == JOB_FORM_COMPLETION; /* as vLLM: completions keep the think block */
    if (j->thinking_budget >= 0) {
        struct think_vocab tv;
        think_vocab_init(&tv, tok);
        if (!think_vocab_ok(&tv)) {
            errfmt(err, errlen,
                   "field '%sthinking_budget': the model does not think (its tokenizer has no <think> and "
                   "</think> tokens)",
                   j->form == JOB_FORM_LLMQ ? "" : "body.");
            return JOB_ERR_INVALID;
        }
        r->has_thinking_budget = true;
        r->thinking_budget = j->thinking_budget;
    }
    return JOB_OK;
}

double job_deadline(const struct job *j, double taken)
{
    return j->timeout_s > 0 ? taken + j->timeout_s : 0;
}

void job_timeout_error(const struct job *j, int n_tokens, char *buf, size_t len)
{
    errfmt(buf, len, "timeout_s (%g s) passed after %d generated token%s; the text so far is kept",
           j->timeout_s, n_tokens, n_tokens == 1 ? "" : "s");
}

void job_input_free(struct job_input *in)
{
    if (!in)
        return;
    free(in->tokens);
    memset(in, 0, sizeof *in);
}

/* ---- params for SQLite */

json_t *job_params_json(const struct job *j)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "max_tokens", json_integer(j->max_tokens));
    json_object_set_new(o, "temperature", json_real(j->sp.temperature));
    json_object_set_new(o, "top_p", json_real(j->sp.top_p));
    json_object_set_new(o, "top_k", json_integer(j->sp.top_k));
    json_object_set_new(o, "min_p", json_real(j->sp.min_p));
    json_object_set_new(o, "repetition_penalty", json_real(j->sp.repetition_penalty));
    json_object_set_new(o, "presence_penalty", json_real(j->sp.presence_penalty));
    json_object_set_new(o, "frequency_penalty", json_real(j->sp.frequency_penalty));
    if (j->has_seed)
        json_object_set_new(o, "seed", json_integer((json_int_t)j->sp.seed));
    if (j->n_stop) {
        json_t *a = json_array();
        for (int i = 0; i < j->n_stop; i++)
            json_array_append_new(a, json_string(j->stop[i]));
        json_object_set_new(o, "stop", a);
    }
    if (j->n_stop_ids) {
        json_t *a = json_array();
        for (int i = 0; i < j->n_stop_ids; i++)
            json_array_append_new(a, json_integer(j->stop_ids[i]));
        json_object_set_new(o, "stop_token_ids", a);
    }
    if (j->sp.logprobs >= 0)
        json_object_set_new(o, "logprobs", json_integer(j->sp.logprobs));
    if (j->min_tokens)
        json_object_set_new(o, "min_tokens", json_integer(j->min_tokens));
    if (j->ignore_eos)
        json_object_set_new(o, "ignore_eos", json_true());
    if (j->thinking_budget >= 0)
        json_object_set_new(o, "thinking_budget", json_integer(j->thinking_budget));
    if (j->stop_in_reasoning)
        json_object_set_new(o, "stop_in_reasoning", json_true());
    if (!j->skip_special_tokens)
        json_object_set_new(o, "skip_special_tokens", json_false());
    if (j->messages || j->chat)
        json_object_set_new(o, "enable_thinking", json_boolean(j->enable_thinking));
    if (j->return_token_ids)
        json_object_set_new(o, "return_token_ids", json_true());
    if (j->stream)
        json_object_set_new(o, "stream", json_true());
    if (j->timeout_s > 0)
        json_object_set_new(o, "timeout_s", json_real(j->timeout_s));
    if (j->priority)
        json_object_set_new(o, "priority", json_integer(j->priority));
    if (j->constraint.kind != JOB_CONSTRAINT_NONE)
        json_object_set_new(o, "constraint", json_string(job_constraint_name(j->constraint.kind)));
    if (j->truncate != JOB_TRUNCATE_NONE)
        json_object_set_new(o, "truncate", json_string(trunc_mode_name(j->truncate)));
    if (j->summarize) {
        const struct job_summarize *s = j->summarize;
        json_t *so = json_pack("{s:s, s:s}", "map_template", s->map_template, "reduce_template",
                               s->reduce_template);
        if (so && s->chunk_tokens)
            json_object_set_new(so, "chunk_tokens", json_integer(s->chunk_tokens));
        if (so && s->overlap_tokens >= 0)
            json_object_set_new(so, "overlap_tokens", json_integer(s->overlap_tokens));
        if (so && s->max_tokens)
            json_object_set_new(so, "max_tokens", json_integer(s->max_tokens));
        json_object_set_new(o, "summarize", so);
    }
    return o;
}
