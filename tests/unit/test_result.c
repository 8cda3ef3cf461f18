/* The result writer: every shape of docs/JOBS.md, checked by parsing the written line back with
 * jansson and comparing field by field with the output it was given. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/jobs/answer_json.h"
#include "worker/jobs/job.h"
#include "worker/jobs/result.h"

static void parse_job(const char *line, struct job *j)
{
    char err[256];
    int rc = job_parse(line, strlen(line), NULL, j, err, sizeof err);
    if (rc)
        fail_msg("%s: %s", line, err);
}

/* Writes the line and reads it back; the line must be one line of valid JSON. */
static json_t *roundtrip(const struct job *j, const struct res_output *o, res_token_fn fn)
{
    char *line = res_line(j, o, fn, NULL);
    assert_non_null(line);
    assert_null(strchr(line, '\n'));
    json_error_t e;
    json_t *v = json_loads(line, 0, &e);
    if (!v)
        fail_msg("not JSON: %s (%s)", line, e.text);
    free(line);
    return v;
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        fail_msg("'%s' is not a string", key);
    return json_string_value(v);
}

static json_int_t num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("'%s' is not an integer", key);
    return json_integer_value(v);
}

/* Token strings for OpenAI logprobs: id 1 -> "a", 2 -> "bc", 3 -> the first byte of "é" (a partial
 * character), 4 -> " é" */
static const char *tokens(const void *ctx, int32_t id, size_t *len)
{
    static const char *t[] = {NULL, "a", "bc", "\xC3", " \xC3\xA9"};
    if (id < 1 || id > 4)
        return NULL;
    *len = strlen(t[id]);
    return t[id];
}

static const int32_t prompt_ids[] = {11, 12, 13};
static const int32_t out_ids[] = {1, 2, 3};

static struct be_out lp_of(int32_t tok, float lp, int n_top)
{
    struct be_out o = {.token = tok, .logprob = lp, .n_top = n_top};
    for (int k = 0; k < n_top; k++) {
        o.top_ids[k] = k + 1;
        o.top_logprobs[k] = -0.25f * (float)(k + 1);
    }
    return o;
}

static struct res_output completed(const struct be_out *lps)
{
    struct res_output o = {.finish = FINISH_STOP,
                           .text = "abc\xEF\xBF\xBD",
                           .text_len = 6,
                           .prompt_tokens = 3,
                           .completion_tokens = 3,
                           .prompt_ids = prompt_ids,
                           .token_ids = out_ids,
                           .logprobs = lps,
                           .model = "tiny",
                           .created = 1700000000};
    return o;
}

static void test_llmq_completed(void **state)
{
    struct job j;
    parse_job("{\"id\": \"j1\", \"prompt\": \"x\", \"return_token_ids\": true, \"logprobs\": 2, "
              "\"metadata\": {\"doc\": \"a.txt\"}}",
              &j);
    struct be_out lps[3] = {lp_of(1, -0.5f, 2), lp_of(2, -INFINITY, 2), lp_of(3, -1.5f, 2)};
    struct res_output o = completed(lps);
    json_t *r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "id"), "j1");
    assert_string_equal(str(r, "status"), "completed");
    assert_string_equal(str(r, "text"), "abc\xEF\xBF\xBD");
    assert_string_equal(str(r, "finish_reason"), "stop");
    assert_null(json_object_get(r, "error"));
    json_t *u = json_object_get(r, "usage");
    assert_int_equal(num(u, "prompt_tokens"), 3);
    assert_int_equal(num(u, "completion_tokens"), 3);
    json_t *pids = json_object_get(r, "prompt_token_ids"), *tids = json_object_get(r, "token_ids");
    assert_int_equal(json_array_size(pids), 3);
    assert_int_equal(json_integer_value(json_array_get(pids, 2)), 13);
    assert_int_equal(json_array_size(tids), 3);
    assert_int_equal(json_integer_value(json_array_get(tids, 0)), 1);
    json_t *l = json_object_get(r, "logprobs");
    assert_int_equal(json_array_size(l), 3);
    json_t *e0 = json_array_get(l, 0);
    assert_int_equal(num(e0, "token_id"), 1);
    assert_float_equal(json_real_value(json_object_get(e0, "logprob")), -0.5, 1e-7);
    json_t *top = json_object_get(e0, "top_logprobs");
    assert_int_equal(json_array_size(top), 2);
    assert_int_equal(num(json_array_get(top, 1), "token_id"), 2);
    assert_float_equal(json_real_value(json_object_get(json_array_get(top, 1), "logprob")), -0.5, 1e-7);
    /* JSON has no -inf: written as -9999 */
    assert_float_equal(json_real_value(json_object_get(json_array_get(l, 1), "logprob")), -9999.0, 0);
    assert_string_equal(str(json_object_get(r, "metadata"), "doc"), "a.txt");
    assert_int_equal(json_object_size(r), 9);
    json_decref(r);
    job_free(&j);
}

/* A client's metadata comes back as sent: doubles keep all their digits (the rest of the line is
 * written with 9, enough for the engine's float32 logprobs). */
static void test_metadata_exact(void **state)
{
    struct job j;
    parse_job("{\"id\": \"m1\", \"prompt\": \"x\", \"logprobs\": 0, "
              "\"metadata\": {\"x\": 21475.5483647, \"y\": [0.1, 1e-300, {\"metadata\": 2.718281828459045}], \"s\": \"1.5\"}}",
              &j);
    struct be_out lps[3] = {lp_of(1, -0.5f, 0), lp_of(2, -0.25f, 0), lp_of(3, -1.5f, 0)};
    struct res_output o = completed(lps);
    json_t *r = roundtrip(&j, &o, NULL);
    json_t *md = json_object_get(r, "metadata");
    assert_true(json_real_value(json_object_get(md, "x")) == 21475.5483647);
    json_t *y = json_object_get(md, "y");
    assert_true(json_real_value(json_array_get(y, 0)) == 0.1);
    assert_true(json_real_value(json_array_get(y, 1)) == 1e-300);
    assert_true(json_real_value(json_object_get(json_array_get(y, 2), "metadata")) == 2.718281828459045);
    assert_string_equal(str(md, "s"), "1.5");
    assert_true(json_equal(md, j.metadata));
    assert_float_equal(json_real_value(json_object_get(json_array_get(json_object_get(r, "logprobs"), 1), "logprob")),
                       -0.25, 0);
    json_decref(r);
    job_free(&j);
}

/* answer_json: the value of a JSON job's answer, or incomplete, from (kind, text, finish) alone. */
static void test_answer_json(void **state)
{
    bool inc = true;
    /* kinds without JSON: no value, never incomplete */
    static const enum job_constraint_kind plain[] = {JOB_CONSTRAINT_NONE, JOB_CONSTRAINT_REGEX,
                                                     JOB_CONSTRAINT_CHOICE};
    for (size_t i = 0; i < 3; i++) {
        assert_null(answer_json(plain[i], "{\"a\": 1}", 8, FINISH_STOP, &inc));
        assert_false(inc);
    }
    struct {
        enum job_constraint_kind kind;
        const char *text;
        enum finish_reason finish;
        const char *want; /* the value as compact JSON, or NULL: incomplete */
    } cases[] = {
        {JOB_CONSTRAINT_JSON_SCHEMA, "{\"title\": \"T\", \"n\": [1, 2.5]}", FINISH_STOP,
         "{\"title\":\"T\",\"n\":[1,2.5]}"},
        {JOB_CONSTRAINT_JSON_OBJECT, "\n {\"a\": {}} \n", FINISH_STOP, "{\"a\":{}}"}, /* whitespace around */
        {JOB_CONSTRAINT_JSON_SCHEMA, "[true, null]", FINISH_LENGTH,
         "[true,null]"}, /* closed before the cut */
        {JOB_CONSTRAINT_JSON_SCHEMA, "\"s\\u00e9\"", FINISH_STOP, "\"s\\u00E9\""},
        {JOB_CONSTRAINT_JSON_SCHEMA, "42", FINISH_STOP, "42"},
        {JOB_CONSTRAINT_JSON_SCHEMA, "42", FINISH_LENGTH, NULL},    /* might have gone on: 421 */
        {JOB_CONSTRAINT_JSON_SCHEMA, "-0.5", FINISH_TIMEOUT, NULL}, /* likewise */
        {JOB_CONSTRAINT_JSON_SCHEMA, "{\"title\": \"a long", FINISH_LENGTH, NULL},
        {JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1", FINISH_CANCELLED, NULL},
        {JOB_CONSTRAINT_JSON_OBJECT, "", FINISH_CANCELLED, NULL},
        {JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1} {\"b\": 2}", FINISH_STOP, NULL}, /* two values */
        {JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1, \"a\": 2}", FINISH_STOP, NULL},  /* duplicate key */
        {JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1e999}", FINISH_STOP, NULL},        /* no double holds it */
        {JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": \"\\u0000\"}", FINISH_STOP, NULL},  /* NUL in a string */
        {JOB_CONSTRAINT_JSON_OBJECT, NULL, FINISH_STOP, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *t = cases[i].text;
        json_t *v = answer_json(cases[i].kind, t, t ? strlen(t) : 0, cases[i].finish, &inc);
        char *got = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
        if (cases[i].want ? !got || strcmp(got, cases[i].want) || inc : got || !inc)
            fail_msg("case %zu (%s): got %s, incomplete %d; want %s", i, t ? t : "NULL", got ? got : "NULL",
                     inc, cases[i].want ? cases[i].want : "incomplete");
        free(got);
        json_decref(v);
    }
    /* the length given is what is read: the text need not end at a NUL */
    assert_null(answer_json(JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1}xyz", 5, FINISH_STOP, &inc));
    assert_true(inc);
    json_t *v = answer_json(JOB_CONSTRAINT_JSON_OBJECT, "{\"a\": 1}xyz", 8, FINISH_STOP, &inc);
    assert_non_null(v);
    assert_false(inc);
    json_decref(v);
}

/* In results: llmq's form has json and json_incomplete right after text, numbers reading back as the
 * same doubles; free-text jobs have neither; OpenAI lines keep OpenAI's shape (the JSON is the
 * content). */
static void test_structured_result(void **state)
{
    struct job j;
    parse_job("{\"id\": \"s1\", \"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
              "\"json_schema\": {\"name\": \"d\", \"schema\": {\"type\": \"object\"}}}, \"metadata\": "
              "{\"k\": 0.1}}",
              &j);
    const char *text = "{\"title\": \"Caf\\u00e9\", \"score\": 0.123456789012, \"n\": 3, \"x\": 0.1}";
    struct res_output o = {.finish = FINISH_STOP,
                           .text = text,
                           .text_len = strlen(text),
                           .prompt_tokens = 1,
                           .completion_tokens = 20};
    char *line = res_line(&j, &o, NULL, NULL);
    assert_non_null(line);
    /* the field order: json and json_incomplete follow text */
    char *at_text = strstr(line, "\"text\":"), *at_json = strstr(line, "\"json\":{"),
         *at_inc = strstr(line, "\"json_incomplete\":false");
    assert_true(at_text && at_json && at_inc && at_text < at_json && at_json < at_inc);
    json_t *r = json_loads(line, 0, NULL);
    assert_non_null(r);
    json_t *want = json_loads(text, 0, NULL);
    assert_true(json_equal(json_object_get(r, "json"), want)); /* 0.123456789012 exactly, not 9 digits */
    assert_string_equal(str(r, "text"), text);
    assert_true(json_real_value(json_object_get(json_object_get(r, "metadata"), "k")) == 0.1);
    json_decref(want);
    json_decref(r);
    free(line);

    /* cut by max_tokens: json null, incomplete */
    o.text = "{\"title\": \"Caf";
    o.text_len = strlen(o.text);
    o.finish = FINISH_LENGTH;
    r = roundtrip(&j, &o, NULL);
    assert_true(json_is_null(json_object_get(r, "json")));
    assert_true(json_is_true(json_object_get(r, "json_incomplete")));
    assert_string_equal(str(r, "finish_reason"), "length");
    json_decref(r);
    /* a failed job has no output, so neither field */
    struct res_output f = res_failed(JOB_ERR_ENGINE, "boom");
    r = roundtrip(&j, &f, NULL);
    assert_null(json_object_get(r, "json"));
    assert_null(json_object_get(r, "json_incomplete"));
    json_decref(r);
    job_free(&j);

    /* json_object, and a regex job (no JSON fields) */
    parse_job("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", &j);
    o.text = "{\"a\": [1, 2]}";
    o.text_len = strlen(o.text);
    o.finish = FINISH_STOP;
    r = roundtrip(&j, &o, NULL);
    assert_int_equal(json_array_size(json_object_get(json_object_get(r, "json"), "a")), 2);
    assert_true(json_is_false(json_object_get(r, "json_incomplete")));
    json_decref(r);
    job_free(&j);
    parse_job("{\"prompt\": \"x\", \"regex\": \"[{}a-z\\\":]+\"}", &j);
    r = roundtrip(&j, &o, NULL);
    assert_null(json_object_get(r, "json"));
    assert_null(json_object_get(r, "json_incomplete"));
    json_decref(r);
    job_free(&j);

    /* OpenAI chat: content is the text, no json anywhere */
    parse_job(
        "{\"custom_id\": \"c1\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}}}",
        &j);
    line = res_line(&j, &o, NULL, NULL);
    assert_null(strstr(line, "\"json\""));
    assert_null(strstr(line, "json_incomplete"));
    r = json_loads(line, 0, NULL);
    json_t *msg = json_object_get(
        json_array_get(json_object_get(json_object_get(json_object_get(r, "response"), "body"), "choices"),
                       0),
        "message");
    assert_string_equal(str(msg, "content"), "{\"a\": [1, 2]}");
    json_decref(r);
    free(line);
    job_free(&j);
}

static void test_llmq_minimal_and_cancelled(void **state)
{
    struct job j;
    parse_job("{\"prompt\": \"x\"}", &j);
    assert_int_equal(job_assign_id(&j), 0);
    struct res_output o = completed(NULL);
    o.finish = FINISH_LENGTH;
    json_t *r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "id"), j.id);
    assert_string_equal(str(r, "finish_reason"), "length");
    /* no token ids, logprobs or metadata unless asked for */
    assert_null(json_object_get(r, "prompt_token_ids"));
    assert_null(json_object_get(r, "token_ids"));
    assert_null(json_object_get(r, "logprobs"));
    assert_null(json_object_get(r, "metadata"));
    assert_int_equal(json_object_size(r), 5);
    json_decref(r);
    o.finish = FINISH_CANCELLED;
    r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "status"), "cancelled");
    assert_string_equal(str(r, "finish_reason"), "cancelled");
    assert_string_equal(str(r, "text"), "abc\xEF\xBF\xBD");
    json_decref(r);
    job_free(&j);
}

static void test_llmq_failed(void **state)
{
    struct job j;
    char err[256];
    const char *line = "{\"id\": \"bad-1\", \"prompt\": \"x\", \"max_tokens\": -3, \"metadata\": {\"k\": 1}}";
    int rc = job_parse(line, strlen(line), NULL, &j, err, sizeof err);
    assert_int_equal(rc, JOB_ERR_INVALID);
    struct res_output o = res_failed(rc, err);
    json_t *r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "id"), "bad-1");
    assert_string_equal(str(r, "status"), "failed");
    assert_string_equal(str(r, "error"), err);
    assert_null(json_object_get(r, "text"));
    assert_null(json_object_get(r, "usage"));
    /* metadata is echoed only when the job parsed far enough to read it */
    json_decref(r);
    job_free(&j);

    /* an error message cut inside a UTF-8 character is still written as valid JSON */
    parse_job("{\"id\": \"u\", \"prompt\": \"x\"}", &j);
    o = res_failed(JOB_ERR_ENGINE, "bad \xC3");
    r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "error"), "bad \xEF\xBF\xBD");
    json_decref(r);
    /* FINISH_ERROR from the engine without a message */
    o = completed(NULL);
    o.finish = FINISH_ERROR;
    r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "status"), "failed");
    json_decref(r);
    job_free(&j);
}

/* A timed-out job: failed with its error, and the text, finish_reason and usage of what it generated;
 * OpenAI lines carry the partial body under status 408 beside the error "timeout". */
static void test_timeout(void **state)
{
    struct job j;
    parse_job("{\"id\": \"t1\", \"prompt\": \"x\", \"timeout_s\": 2}", &j);
    struct res_output o = completed(NULL);
    o.finish = FINISH_TIMEOUT;
    o.error = "timeout_s (2 s) passed after 3 generated tokens; the text so far is kept";
    o.error_rc = JOB_ERR_TIMEOUT;
    json_t *r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "status"), "failed");
    assert_string_equal(str(r, "error"), o.error);
    assert_string_equal(str(r, "finish_reason"), "timeout");
    assert_string_equal(str(r, "text"), "abc\xEF\xBF\xBD");
    assert_int_equal(num(json_object_get(r, "usage"), "completion_tokens"), 3);
    json_decref(r);
    job_free(&j);

    parse_job("{\"custom_id\": \"c1\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
              "[{\"role\": \"user\", \"content\": \"x\"}], \"timeout_s\": 2}}",
              &j);
    r = roundtrip(&j, &o, NULL);
    json_t *resp = json_object_get(r, "response"), *err = json_object_get(r, "error");
    assert_int_equal(num(resp, "status_code"), 408);
    json_t *choice = json_array_get(json_object_get(json_object_get(resp, "body"), "choices"), 0);
    assert_string_equal(str(choice, "finish_reason"), "timeout");
    assert_string_equal(str(json_object_get(choice, "message"), "content"), "abc\xEF\xBF\xBD");
    assert_string_equal(str(err, "code"), "timeout");
    assert_string_equal(str(err, "message"), o.error);
    json_decref(r);
    job_free(&j);
}

static void check_batch_envelope(json_t *r, const char *custom_id)
{
    assert_int_equal(strncmp(str(r, "id"), "batch_req_", 10), 0);
    assert_int_equal(strlen(str(r, "id")), 10 + 32);
    assert_string_equal(str(r, "custom_id"), custom_id);
    assert_int_equal(json_object_size(r), 4);
}

static void test_openai_chat(void **state)
{
    struct job j;
    parse_job("{\"custom_id\": \"req-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
              "{\"model\": \"gpt-x\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
              "\"logprobs\": true, "
              "\"top_logprobs\": 2}}",
              &j);
    struct be_out lps[3] = {lp_of(1, -0.5f, 2), lp_of(2, -1.0f, 2), lp_of(3, -1.5f, 2)};
    struct res_output o = completed(lps);
    o.finish = FINISH_LENGTH;
    json_t *r = roundtrip(&j, &o, tokens);
    check_batch_envelope(r, "req-1");
    assert_true(json_is_null(json_object_get(r, "error")));
    json_t *resp = json_object_get(r, "response");
    assert_int_equal(num(resp, "status_code"), 200);
    assert_int_equal(strncmp(str(resp, "request_id"), "req_", 4), 0);
    json_t *body = json_object_get(resp, "body");
    assert_int_equal(strncmp(str(body, "id"), "chatcmpl-", 9), 0);
    assert_string_equal(str(body, "object"), "chat.completion");
    assert_int_equal(num(body, "created"), 1700000000);
    assert_string_equal(str(body, "model"), "tiny"); /* ours, not the request's */
    json_t *u = json_object_get(body, "usage");
    assert_int_equal(num(u, "prompt_tokens"), 3);
    assert_int_equal(num(u, "completion_tokens"), 3);
    assert_int_equal(num(u, "total_tokens"), 6);
    json_t *choices = json_object_get(body, "choices");
    assert_int_equal(json_array_size(choices), 1);
    json_t *c0 = json_array_get(choices, 0);
    assert_int_equal(num(c0, "index"), 0);
    assert_string_equal(str(c0, "finish_reason"), "length");
    json_t *msg = json_object_get(c0, "message");
    assert_string_equal(str(msg, "role"), "assistant");
    assert_string_equal(str(msg, "content"), "abc\xEF\xBF\xBD");
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 3);
    json_t *e1 = json_array_get(content, 1);
    assert_string_equal(str(e1, "token"), "bc");
    assert_float_equal(json_real_value(json_object_get(e1, "logprob")), -1.0, 1e-7);
    json_t *bytes = json_object_get(e1, "bytes");
    assert_int_equal(json_array_size(bytes), 2);
    assert_int_equal(json_integer_value(json_array_get(bytes, 0)), 'b');
    /* a partial UTF-8 character: U+FFFD in "token", the exact byte in "bytes" */
    json_t *e2 = json_array_get(content, 2);
    assert_string_equal(str(e2, "token"), "\xEF\xBF\xBD");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(e2, "bytes"), 0)), 0xC3);
    json_t *top = json_object_get(e2, "top_logprobs");
    assert_int_equal(json_array_size(top), 2);
    assert_string_equal(str(json_array_get(top, 0), "token"), "a");
    assert_float_equal(json_real_value(json_object_get(json_array_get(top, 0), "logprob")), -0.25, 1e-7);
    json_decref(r);

    /* without logprobs: null */
    job_free(&j);
    parse_job("{\"custom_id\": \"req-2\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
              "[{\"role\": \"user\", \"content\": \"hi\"}]}}",
              &j);
    o = completed(NULL);
    r = roundtrip(&j, &o, tokens);
    c0 = json_array_get(json_object_get(json_object_get(json_object_get(r, "response"), "body"), "choices"),
                        0);
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_string_equal(str(c0, "finish_reason"), "stop");
    json_decref(r);
    job_free(&j);
}

static void test_openai_completion(void **state)
{
    struct job j;
    parse_job("{\"custom_id\": \"c-1\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", "
              "\"logprobs\": 2}}",
              &j);
    struct be_out lps[3] = {lp_of(4, -0.5f, 2), lp_of(2, -1.0f, 2), lp_of(1, -1.5f, 0)};
    struct res_output o = completed(lps);
    json_t *r = roundtrip(&j, &o, tokens);
    check_batch_envelope(r, "c-1");
    json_t *body = json_object_get(json_object_get(r, "response"), "body");
    assert_string_equal(str(body, "object"), "text_completion");
    assert_int_equal(strncmp(str(body, "id"), "cmpl-", 5), 0);
    json_t *c0 = json_array_get(json_object_get(body, "choices"), 0);
    assert_string_equal(str(c0, "text"), "abc\xEF\xBF\xBD");
    assert_null(json_object_get(c0, "message"));
    json_t *lp = json_object_get(c0, "logprobs");
    json_t *toks = json_object_get(lp, "tokens");
    assert_int_equal(json_array_size(toks), 3);
    assert_string_equal(json_string_value(json_array_get(toks, 0)), " \xC3\xA9");
    assert_float_equal(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 1)), -1.0, 1e-7);
    json_t *tops = json_object_get(lp, "top_logprobs");
    assert_int_equal(json_array_size(tops), 3);
    assert_float_equal(json_real_value(json_object_get(json_array_get(tops, 0), "bc")), -0.5, 1e-7);
    assert_int_equal(json_object_size(json_array_get(tops, 2)), 0);
    /* text_offset counts characters, as Python does: " é" is 2 */
    json_t *offs = json_object_get(lp, "text_offset");
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), 2);
    assert_int_equal(json_integer_value(json_array_get(offs, 2)), 4);
    json_decref(r);
    job_free(&j);
}

static void test_openai_errors(void **state)
{
    struct job j;
    char err[256];
    const char *line =
        "{\"custom_id\": \"e-1\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [], "
        "\"n\": 1}}";
    int rc = job_parse(line, strlen(line), NULL, &j, err, sizeof err);
    assert_int_equal(rc, JOB_ERR_INVALID);
    struct res_output o = res_failed(rc, err);
    json_t *r = roundtrip(&j, &o, tokens);
    check_batch_envelope(r, "e-1");
    assert_true(json_is_null(json_object_get(r, "response")));
    json_t *e = json_object_get(r, "error");
    assert_string_equal(str(e, "code"), "invalid_request");
    assert_string_equal(str(e, "message"), err);
    json_decref(r);
    job_free(&j);

    /* a line that is not JSON but mentions custom_id: OpenAI shape, custom_id null */
    line = "{\"custom_id\": \"e-2\", broken";
    rc = job_parse(line, strlen(line), NULL, &j, err, sizeof err);
    o = res_failed(rc, err);
    r = roundtrip(&j, &o, tokens);
    assert_true(json_is_null(json_object_get(r, "custom_id")));
    assert_string_equal(str(json_object_get(r, "error"), "code"), "invalid_json");
    json_decref(r);
    job_free(&j);

    /* prompt too long; cancelled */
    parse_job("{\"custom_id\": \"e-3\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}", &j);
    o = res_failed(JOB_ERR_CONTEXT, "too long");
    r = roundtrip(&j, &o, tokens);
    assert_string_equal(str(json_object_get(r, "error"), "code"), "context_length_exceeded");
    json_decref(r);
    o = completed(NULL);
    o.finish = FINISH_CANCELLED;
    r = roundtrip(&j, &o, tokens);
    assert_true(json_is_null(json_object_get(r, "response")));
    assert_string_equal(str(json_object_get(r, "error"), "code"), "cancelled");
    json_decref(r);
    job_free(&j);
}

/* The reasoning of a model that thinks: llmq's "reasoning" and usage.reasoning_tokens, OpenAI chat's
 * message.reasoning_content and usage.completion_tokens_details.reasoning_tokens; an empty reasoning
 * is still written; none of them without reasoning, and none in a text completion. */
static void test_reasoning(void **state)
{
    struct job j;
    parse_job("{\"id\": \"r1\", \"prompt\": \"x\", \"thinking_budget\": 4}", &j);
    struct res_output o = completed(NULL);
    o.text = "42";
    o.text_len = 2;
    o.reasoning = "six times \xC3\xA9\n";
    o.reasoning_len = strlen(o.reasoning);
    o.has_reasoning = true;
    o.reasoning_tokens = 2;
    json_t *r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "text"), "42");
    assert_string_equal(str(r, "reasoning"), "six times \xC3\xA9\n");
    json_t *u = json_object_get(r, "usage");
    assert_int_equal(num(u, "completion_tokens"), 3); /* the total */
    assert_int_equal(num(u, "reasoning_tokens"), 2);
    json_decref(r);
    o.reasoning = "";
    o.reasoning_len = 0;
    r = roundtrip(&j, &o, NULL);
    assert_string_equal(str(r, "reasoning"), "");
    json_decref(r);
    o.has_reasoning = false;
    r = roundtrip(&j, &o, NULL);
    assert_null(json_object_get(r, "reasoning"));
    assert_null(json_object_get(json_object_get(r, "usage"), "reasoning_tokens"));
    json_decref(r);
    job_free(&j);

    parse_job("{\"custom_id\": \"c1\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
              "[{\"role\": \"user\", \"content\": \"hi\"}], \"thinking_budget\": 0}}",
              &j);
    o.has_reasoning = true;
    o.reasoning = "hmm";
    o.reasoning_len = 3;
    r = roundtrip(&j, &o, NULL);
    json_t *body = json_object_get(json_object_get(r, "response"), "body");
    json_t *msg = json_object_get(json_array_get(json_object_get(body, "choices"), 0), "message");
    assert_string_equal(str(msg, "content"), "42");
    assert_string_equal(str(msg, "reasoning_content"), "hmm");
    u = json_object_get(body, "usage");
    assert_int_equal(num(u, "completion_tokens"), 3);
    assert_int_equal(num(u, "total_tokens"), 6);
    assert_int_equal(num(json_object_get(u, "completion_tokens_details"), "reasoning_tokens"), 2);
    json_decref(r);
    o.has_reasoning = false;
    r = roundtrip(&j, &o, NULL);
    body = json_object_get(json_object_get(r, "response"), "body");
    msg = json_object_get(json_array_get(json_object_get(body, "choices"), 0), "message");
    assert_null(json_object_get(msg, "reasoning_content"));
    assert_null(json_object_get(json_object_get(body, "usage"), "completion_tokens_details"));
    json_decref(r);
    job_free(&j);

    parse_job("{\"custom_id\": \"t1\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}", &j);
    o.has_reasoning = true; /* the engine does not split completions; were it told so, nothing shows */
    r = roundtrip(&j, &o, NULL);
    body = json_object_get(json_object_get(r, "response"), "body");
    assert_null(json_object_get(json_array_get(json_object_get(body, "choices"), 0), "reasoning_content"));
    assert_null(json_object_get(json_object_get(body, "usage"), "completion_tokens_details"));
    json_decref(r);
    job_free(&j);
}

static void test_random_ids(void **state)
{
    char a[64], b[64];
    res_random_id("req_", a, sizeof a);
    res_random_id("req_", b, sizeof b);
    assert_int_equal(strlen(a), 4 + 32);
    assert_string_not_equal(a, b);
    assert_int_equal(strspn(a + 4, "0123456789abcdef"), 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llmq_completed),    cmocka_unit_test(test_llmq_minimal_and_cancelled),
        cmocka_unit_test(test_llmq_failed),       cmocka_unit_test(test_openai_chat),
        cmocka_unit_test(test_openai_completion), cmocka_unit_test(test_openai_errors),
        cmocka_unit_test(test_random_ids),        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_reasoning),         cmocka_unit_test(test_metadata_exact),
        cmocka_unit_test(test_answer_json),       cmocka_unit_test(test_structured_result),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
