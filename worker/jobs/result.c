/* Result JSON for finished jobs; see result.h and docs/JOBS.md. */
#include "worker/jobs/result.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <utf8proc.h>

#include "worker/jobs/answer_json.h"

#define LOGPROB_FLOOR                                                                                        \
    -9999.0 /* what -inf (and NaN) logprobs are written as; JSON has no infinity (vLLM does the same) */

struct res_output res_failed(int rc, const char *error)
{
    struct res_output o = {.finish = FINISH_ERROR, .error = error, .error_rc = rc};
    return o;
}

void res_random_id(const char *prefix, char *buf, size_t len)
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
        for (size_t i = 0; i < sizeof b; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (unsigned char)x;
        }
    }
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    snprintf(buf, len, "%s%s", prefix, hex);
}

/* A JSON string of s[0..n): as is when it is valid UTF-8, else with U+FFFD for each bad byte. */
static json_t *str_lossy(const char *s, size_t n)
{
    if (!s)
        return json_string("");
    json_t *v = json_stringn(s, n);
    if (v)
        return v;
    char *buf = malloc(3 * n + 1), *p = buf;
    if (!buf)
        return NULL;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) {
            memcpy(p, s + i, (size_t)k);
            p += k;
            i += (size_t)k;
        } else {
            memcpy(p, "\xEF\xBF\xBD", 3);
            p += 3;
            i++;
        }
    }
    v = json_stringn(buf, (size_t)(p - buf));
    free(buf);
    return v;
}

static json_t *num(double x)
{
    return json_real(isfinite(x) ? x : LOGPROB_FLOOR);
}

static json_t *id_array(const int32_t *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static bool failed(const struct res_output *o)
{
    return o->error || o->finish == FINISH_ERROR;
}

/* A job with output: completed, cancelled, or failed by its timeout (with what it generated). */
static bool has_output(const struct res_output *o)
{
    return !failed(o) || o->finish == FINISH_TIMEOUT;
}

/* ---- llmq's shape */

static json_t *llmq_logprobs(const struct res_output *o)
{
    json_t *a = json_array();
    for (int i = 0; a && i < o->completion_tokens; i++) {
        const struct be_out *lp = &o->logprobs[i];
        json_t *top = json_array();
        for (int k = 0; top && k < lp->n_top; k++)
            json_array_append_new(top, json_pack("{s:i, s:o}", "token_id", (int)lp->top_ids[k], "logprob",
                                                 num(lp->top_logprobs[k])));
        json_array_append_new(a, json_pack("{s:i, s:o, s:o}", "token_id", (int)lp->token, "logprob",
                                           num(lp->logprob), "top_logprobs", top));
    }
    return a;
}

static json_t *llmq_json(const struct job *j, const struct res_output *o)
{
    json_t *r = json_object();
    if (!r)
        return NULL;
    json_object_set_new(r, "id", str_lossy(j->id, j->id ? strlen(j->id) : 0));
    if (j->batch_id)
        json_object_set_new(r, "batch_id", json_string(j->batch_id));
    if (failed(o)) {
        json_object_set_new(r, "status", json_string("failed"));
        json_object_set_new(
            r, "error", str_lossy(o->error ? o->error : "failed", strlen(o->error ? o->error : "failed")));
        json_object_set_new(r, "error_code",
                            json_string(job_error_code(o->error_rc ? o->error_rc : JOB_ERR_ENGINE)));
    } else {
        json_object_set_new(r, "status",
                            json_string(o->finish == FINISH_CANCELLED ? "cancelled" : "completed"));
    }
    if (has_output(o)) {
        json_object_set_new(r, "text", str_lossy(o->text ? o->text : "", o->text ? o->text_len : 0));
        if (job_constraint_is_json(j->constraint.kind)) { /* right after text: res_line finds it there */
            bool incomplete;
            json_t *v = answer_json(j->constraint.kind, o->text, o->text_len, o->finish, &incomplete);
            json_object_set_new(r, "json", v ? v : json_null());
            json_object_set_new(r, "json_incomplete", json_boolean(incomplete));
        }
        if (o->has_reasoning)
            json_object_set_new(
                r, "reasoning",
                str_lossy(o->reasoning ? o->reasoning : "", o->reasoning ? o->reasoning_len : 0));
        const char *fr = finish_reason_name(o->finish);
        json_object_set_new(r, "finish_reason", fr ? json_string(fr) : json_null());
        json_t *usage = json_pack("{s:i, s:i}", "prompt_tokens", o->prompt_tokens, "completion_tokens",
                                  o->completion_tokens);
        if (usage && o->has_reasoning)
            json_object_set_new(usage, "reasoning_tokens", json_integer(o->reasoning_tokens));
        if (usage && j->truncate != JOB_TRUNCATE_NONE)
            json_object_set_new(usage, "truncated_tokens", json_integer(o->truncated_tokens));
        if (usage && o->chunks > 0) {
            json_object_set_new(usage, "chunks", json_integer(o->chunks));
            json_object_set_new(usage, "depth", json_integer(o->depth));
        }
        json_object_set_new(r, "usage", usage);
        if (j->return_token_ids) {
            json_object_set_new(r, "prompt_token_ids",
                                id_array(o->prompt_ids, o->prompt_ids ? o->prompt_tokens : 0));
            json_object_set_new(r, "token_ids",
                                id_array(o->token_ids, o->token_ids ? o->completion_tokens : 0));
        }
        if (j->sp.logprobs >= 0 && o->logprobs)
            json_object_set_new(r, "logprobs", llmq_logprobs(o));
        if (o->finish == FINISH_CANCELLED)
            json_object_set_new(r, "error_code", json_string(job_error_code(JOB_ERR_CANCELLED)));
    }
    if (j->metadata)
        json_object_set(r, "metadata", j->metadata);
    return r;
}

/* ---- OpenAI's shapes */

static json_t *token_str(res_token_fn fn, const void *ctx, int32_t id, json_t **bytes)
{
    size_t n = 0;
    const char *s = fn ? fn(ctx, id, &n) : NULL;
    if (!s)
        n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; *bytes && i < n; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)s[i]));
    }
    return str_lossy(s ? s : "", n);
}

/* chat.completion: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null} */
static json_t *chat_logprobs(const struct res_output *o, res_token_fn fn, const void *ctx)
{
    json_t *content = json_array();
    for (int i = 0; content && i < o->completion_tokens; i++) {
        const struct be_out *lp = &o->logprobs[i];
        json_t *top = json_array(), *bytes;
        for (int k = 0; top && k < lp->n_top; k++) {
            json_t *tb, *ts = token_str(fn, ctx, lp->top_ids[k], &tb);
            json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token", ts, "logprob",
                                                 num(lp->top_logprobs[k]), "bytes", tb));
        }
        json_t *ts = token_str(fn, ctx, lp->token, &bytes);
        json_array_append_new(content, json_pack("{s:o, s:o, s:o, s:o}", "token", ts, "logprob",
                                                 num(lp->logprob), "bytes", bytes, "top_logprobs", top));
    }
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

/* text_completion: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"} */
static json_t *completion_logprobs(const struct res_output *o, res_token_fn fn, const void *ctx)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t offset = 0;
    for (int i = 0; i < o->completion_tokens; i++) {
        const struct be_out *lp = &o->logprobs[i];
        json_t *ts = token_str(fn, ctx, lp->token, NULL);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        for (size_t b = 0; ts && b < json_string_length(ts); b++) /* characters, as Python counts them */
            offset += ((unsigned char)json_string_value(ts)[b] & 0xC0) != 0x80;
        json_array_append_new(tokens, ts);
        json_array_append_new(lps, num(lp->logprob));
        json_t *top = json_object();
        for (int k = 0; top && k < lp->n_top; k++) {
            json_t *key = token_str(fn, ctx, lp->top_ids[k], NULL);
            if (key && !json_object_get(top, json_string_value(key))) /* equal strings keep the likelier */
                json_object_set_new(top, json_string_value(key), num(lp->top_logprobs[k]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *openai_json(const struct job *j, const struct res_output *o, res_token_fn fn, const void *ctx)
{
    char id[64], req[64], body_id[64];
    res_random_id("batch_req_", id, sizeof id);
    json_t *custom = j->custom_id ? str_lossy(j->custom_id, strlen(j->custom_id)) : json_null();
    if (!has_output(o) || o->finish == FINISH_CANCELLED) {
        const char *code =
            job_error_code(failed(o) ? (o->error_rc ? o->error_rc : JOB_ERR_ENGINE) : JOB_ERR_CANCELLED);
        const char *msg = o->error ? o->error : failed(o) ? "failed" : "the job was cancelled";
        return json_pack("{s:s, s:o, s:n, s:{s:s, s:o}}", "id", id, "custom_id", custom, "response", "error",
                         "code", code, "message", str_lossy(msg, strlen(msg)));
    }
    bool chat = j->form == JOB_FORM_CHAT;
    res_random_id("req_", req, sizeof req);
    res_random_id(chat ? "chatcmpl-" : "cmpl-", body_id, sizeof body_id);
    json_t *text = str_lossy(o->text ? o->text : "", o->text ? o->text_len : 0);
    json_t *lp = j->sp.logprobs >= 0 && o->logprobs
                     ? (chat ? chat_logprobs(o, fn, ctx) : completion_logprobs(o, fn, ctx))
                     : json_null();
    const char *fr = finish_reason_name(o->finish);
    json_t *choice =
        chat ? json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", 0, "message", "role", "assistant",
                         "content", text, "refusal", "logprobs", lp, "finish_reason", fr ? fr : "stop")
             : json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", text, "logprobs", lp, "finish_reason",
                         fr ? fr : "stop");
    if (chat && o->has_reasoning) /* vLLM's field; after content, as vLLM writes it */
        json_object_set_new(json_object_get(choice, "message"), "reasoning_content",
                            str_lossy(o->reasoning ? o->reasoning : "", o->reasoning ? o->reasoning_len : 0));
    int64_t created = o->created ? o->created : (int64_t)time(NULL);
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:{s:i, s:i, s:i}}", "id", body_id, "object",
                             chat ? "chat.completion" : "text_completion", "created", (json_int_t)created,
                             "model", o->model ? o->model : "llmq", "choices", choice, "usage",
                             "prompt_tokens", o->prompt_tokens, "completion_tokens", o->completion_tokens,
                             "total_tokens", o->prompt_tokens + o->completion_tokens);
    if (body && chat && o->has_reasoning)
        json_object_set_new(json_object_get(body, "usage"), "completion_tokens_details",
                            json_pack("{s:i}", "reasoning_tokens", o->reasoning_tokens));
    if (body && j->truncate != JOB_TRUNCATE_NONE) /* llmq's extension */
        json_object_set_new(json_object_get(body, "usage"), "truncated_tokens",
                            json_integer(o->truncated_tokens));
    if (o->finish != FINISH_TIMEOUT)
        return json_pack("{s:s, s:o, s:{s:i, s:s, s:o}, s:n}", "id", id, "custom_id", custom, "response",
                         "status_code", 200, "request_id", req, "body", body, "error");
    /* timed out: the partial body under HTTP 408 (Request Timeout), and the error as for a failure */
    const char *msg = o->error ? o->error : "the job's timeout_s passed";
    return json_pack("{s:s, s:o, s:{s:i, s:s, s:o}, s:{s:s, s:o}}", "id", id, "custom_id", custom, "response",
                     "status_code", 408, "request_id", req, "body", body, "error", "code",
                     job_error_code(JOB_ERR_TIMEOUT), "message", str_lossy(msg, strlen(msg)));
}

json_t *res_json(const struct job *j, const struct res_output *o, res_token_fn token_fn, const void *ctx)
{
    if (j->form == JOB_FORM_LLMQ)
        return llmq_json(j, o);
    return openai_json(j, o, token_fn, ctx);
}

/* Whether v holds a real number that 9 significant digits do not give back exactly (all = any
 * real at all). */
static bool has_real(const json_t *v, bool all)
{
    if (json_is_real(v)) {
        char b[32];
        snprintf(b, sizeof b, "%.9g", json_real_value(v));
        return all || strtod(b, NULL) != json_real_value(v);
    }
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v))
        json_array_foreach(v, i, x) if (has_real(x, all)) return true;
    if (json_is_object(v))
        json_object_foreach((json_t *)v, k, x) if (has_real(x, all)) return true;
    return false;
}

/* line (from json_dumps with 9 digits, owned) with the text of its top-level `key` (whose value is
 * v) swapped for v dumped with every digit a double needs (17), so numbers come back as they were.
 * The key is looked for as "<key>":<value with 9 digits>, the last occurrence when `last` (metadata
 * is the line's last field), else the first (a field after the strings id, batch_id, status, text,
 * whose quotes are escaped inside them). Returns the new line (line freed), line itself when there
 * is nothing to swap, or NULL when out of memory (line freed). */
static char *exact_field(char *line, const char *name, const json_t *v, bool last)
{
    int flags = JSON_COMPACT | JSON_ENCODE_ANY;
    char *shrt = json_dumps(v, flags | JSON_REAL_PRECISION(9)), *full = json_dumps(v, flags);
    char *out = line, *key = NULL;
    if (!shrt || !full) {
        out = NULL;
    } else {
        size_t head_len = strlen(name) + 3, kl = head_len + strlen(shrt);
        key = malloc(kl + 1);
        if (!key) {
            out = NULL;
        } else {
            snprintf(key, kl + 1, "\"%s\":%s", name, shrt);
            char *at = NULL, *p = line;
            while ((p = strstr(p, key)) != NULL) {
                at = p++;
                if (!last)
                    break;
            }
            if (at) {
                size_t head = (size_t)(at - line) + head_len, tail = strlen(at + kl);
                out = malloc(head + strlen(full) + tail + 1);
                if (out) {
                    memcpy(out, line, head);
                    memcpy(out + head, full, strlen(full));
                    memcpy(out + head + strlen(full), at + kl, tail + 1);
                }
            }
        }
    }
    if (out != line)
        free(line);
    free(key);
    free(shrt);
    free(full);
    return out;
}

char *res_line(const struct job *j, const struct res_output *o, res_token_fn token_fn, const void *ctx)
{
    json_t *r = res_json(j, o, token_fn, ctx);
    if (!r)
        return NULL;
    /* 9 digits keep the engine's float32 numbers (logprobs) exact and short; a client's metadata
     * carries doubles, which need 17 to come back as sent */
    char *s = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(9));
    /* the answer's numbers too, where 9 digits would change them */
    const json_t *answer = json_object_get(r, "json");
    if (s && j->form == JOB_FORM_LLMQ && answer && has_real(answer, false))
        s = exact_field(s, "json", answer, false);
    json_decref(r);
    if (s && j->form == JOB_FORM_LLMQ && j->metadata && has_real(j->metadata, true))
        s = exact_field(s, "metadata", j->metadata, true);
    return s;
}
