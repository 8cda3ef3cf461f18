/* schemas/job.schema.json and schemas/result.schema.json against the code they describe:
 * - every result shape worker/jobs/result.c writes validates against result.schema.json (and a result
 *   with a field too many does not);
 * - job.schema.json lists, per form, exactly the field names worker/jobs/job.c knows;
 * - for a corpus of good and bad job lines, the schema and job_parse agree on which are valid.
 * The validator below implements the JSON Schema keywords these two files use and fails on any
 * other, so the files cannot drift onto keywords nothing checks. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "testutil.h"
#include "worker/jobs/job.h"
#include "worker/jobs/result.h"

/* ---- a JSON Schema (2020-12) validator for the keywords these files use */

static json_t *load_schema(const char *rel)
{
    json_error_t e;
    json_t *s = json_load_file(test_source(rel), 0, &e);
    if (!s)
        fail_msg("%s: line %d: %s", rel, e.line, e.text);
    return s;
}

static bool pattern_match(const char *pat, size_t patlen, const char *s, size_t n)
{
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, patlen, PCRE2_UTF | PCRE2_ALT_BSUX, &errcode, &erroff, NULL);
    if (!re)
        fail_msg("bad pattern in the schema: %s", pat);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static bool is_type(const json_t *v, const char *t)
{
    if (!strcmp(t, "object"))
        return json_is_object(v);
    if (!strcmp(t, "array"))
        return json_is_array(v);
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    fail_msg("unknown type '%s' in the schema", t);
    return false;
}

/* Why the last validation failed: "<where>: <what>". */
static char why[512];

static bool no(const char *where, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool no(const char *where, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(why, sizeof why, "%s: %s", where[0] ? where : "(root)", what);
    return false;
}

static bool valid(json_t *root, json_t *schema, json_t *v, const char *where);

static bool valid_ref(json_t *root, const char *ref, json_t *v, const char *where)
{
    if (strncmp(ref, "#/$defs/", 8))
        fail_msg("unsupported $ref %s", ref);
    json_t *s = json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (!s)
        fail_msg("$ref %s: no such definition", ref);
    return valid(root, s, v, where);
}

static bool valid(json_t *root, json_t *schema, json_t *v, const char *where)
{
    if (json_is_true(schema))
        return true;
    if (json_is_false(schema))
        return no(where, "not allowed");
    const char *kw;
    json_t *a;
    json_object_foreach(schema, kw, a)
    {
        char sub[400];
        if (!strcmp(kw, "title") || !strcmp(kw, "description") || !strcmp(kw, "$schema") ||
            !strcmp(kw, "$id") || !strcmp(kw, "$defs")) {
            continue;
        } else if (!strcmp(kw, "$ref")) {
            if (!valid_ref(root, json_string_value(a), v, where))
                return false;
        } else if (!strcmp(kw, "type")) {
            bool ok = false;
            if (json_is_string(a))
                ok = is_type(v, json_string_value(a));
            for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++)
                ok = ok || is_type(v, json_string_value(json_array_get(a, i)));
            if (!ok)
                return no(where, "wrong type");
        } else if (!strcmp(kw, "enum")) {
            bool ok = false;
            for (size_t i = 0; i < json_array_size(a); i++)
                ok = ok || json_equal(v, json_array_get(a, i));
            if (!ok)
                return no(where, "not one of the enum's values");
        } else if (!strcmp(kw, "const")) {
            if (!json_equal(v, a))
                return no(where, "not the const value");
        } else if (!strcmp(kw, "properties")) {
            const char *k;
            json_t *ps;
            json_object_foreach(a, k, ps)
            {
                json_t *x = json_object_get(v, k);
                snprintf(sub, sizeof sub, "%s.%s", where, k);
                if (json_is_object(v) && x && !valid(root, ps, x, sub))
                    return false;
            }
        } else if (!strcmp(kw, "additionalProperties")) {
            const char *k;
            json_t *x;
            json_t *props = json_object_get(schema, "properties");
            if (json_is_object(v))
                json_object_foreach(v, k, x)
                {
                    snprintf(sub, sizeof sub, "%s.%s", where, k);
                    if (!json_object_get(props, k) && !valid(root, a, x, sub))
                        return no(sub, "not an allowed property");
                }
        } else if (!strcmp(kw, "required")) {
            for (size_t i = 0; json_is_object(v) && i < json_array_size(a); i++)
                if (!json_object_get(v, json_string_value(json_array_get(a, i))))
                    return no(where, "missing %s", json_string_value(json_array_get(a, i)));
        } else if (!strcmp(kw, "dependentRequired")) {
            const char *k;
            json_t *deps;
            json_object_foreach(a, k, deps)
            {
                for (size_t i = 0; json_object_get(v, k) && i < json_array_size(deps); i++)
                    if (!json_object_get(v, json_string_value(json_array_get(deps, i))))
                        return no(where, "%s needs %s", k, json_string_value(json_array_get(deps, i)));
            }
        } else if (!strcmp(kw, "items")) {
            for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
                snprintf(sub, sizeof sub, "%s[%zu]", where, i);
                if (!valid(root, a, json_array_get(v, i), sub))
                    return false;
            }
        } else if (!strcmp(kw, "minItems") || !strcmp(kw, "maxItems")) {
            size_t n = json_array_size(v);
            if (json_is_array(v) &&
                (kw[1] == 'i' ? n < (size_t)json_integer_value(a) : n > (size_t)json_integer_value(a)))
                return no(where, "%zu items breaks %s", n, kw);
        } else if (!strcmp(kw, "minLength") || !strcmp(kw, "maxLength")) {
            size_t n = json_is_string(v) ? utf8_chars(json_string_value(v), json_string_length(v)) : 0;
            if (json_is_string(v) &&
                (kw[1] == 'i' ? n < (size_t)json_integer_value(a) : n > (size_t)json_integer_value(a)))
                return no(where, "length %zu breaks %s", n, kw);
        } else if (!strcmp(kw, "minimum") || !strcmp(kw, "maximum") || !strcmp(kw, "exclusiveMinimum")) {
            if (!json_is_number(v))
                continue;
            bool ok;
            if (json_is_integer(v) && json_is_integer(a)) { /* exact for 64-bit bounds */
                json_int_t x = json_integer_value(v), b = json_integer_value(a);
                ok = !strcmp(kw, "minimum") ? x >= b : !strcmp(kw, "maximum") ? x <= b : x > b;
            } else {
                double x = json_number_value(v), b = json_number_value(a);
                ok = !strcmp(kw, "minimum") ? x >= b : !strcmp(kw, "maximum") ? x <= b : x > b;
            }
            if (!ok)
                return no(where, "out of range (%s)", kw);
        } else if (!strcmp(kw, "pattern")) {
            if (json_is_string(v) && !pattern_match(json_string_value(a), json_string_length(a),
                                                    json_string_value(v), json_string_length(v)))
                return no(where, "does not match %s", json_string_value(a));
        } else if (!strcmp(kw, "oneOf") || !strcmp(kw, "anyOf")) {
            int matches = 0;
            for (size_t i = 0; i < json_array_size(a); i++)
                matches += valid(root, json_array_get(a, i), v, where);
            if (kw[0] == 'o' ? matches != 1 : matches == 0)
                return no(where, "%d alternatives of %s match", matches, kw);
        } else if (!strcmp(kw, "not")) {
            if (valid(root, a, v, where))
                return no(where, "matches a 'not'");
        } else {
            fail_msg("the schema uses '%s', which this validator does not implement", kw);
        }
    }
    return true;
}

/* ---- results */

static const char *token_text(const void *ctx, int32_t id, size_t *len)
{
    static const char *t[] = {"a", "bc", "\xC3", " \xC3\xA9"};
    const char *s = t[id % 4];
    *len = strlen(s);
    return s;
}

static void parse_or_fail(const char *line, struct job *j)
{
    char err[256];
    if (job_parse(line, strlen(line), NULL, j, err, sizeof err))
        fail_msg("%s: %s", line, err);
}

/* res_line of (job, output) must match `def` and only it among the root's alternatives. */
static void expect_shape(json_t *root, const struct job *j, const struct res_output *o, const char *def)
{
    char *line = res_line(j, o, token_text, NULL);
    assert_non_null(line);
    json_t *v = json_loads(line, 0, NULL);
    assert_non_null(v);
    char ref[64];
    snprintf(ref, sizeof ref, "#/$defs/%s", def);
    if (!valid_ref(root, ref, v, ""))
        fail_msg("result does not match %s: %s\n%s", def, why, line);
    if (!valid(root, root, v, ""))
        fail_msg("result does not match the root schema: %s\n%s", why, line);
    /* one field too many is refused (the validator can say no) */
    json_object_set_new(v, "surprise", json_true());
    assert_false(valid(root, root, v, ""));
    json_decref(v);
    free(line);
}

static void test_result_shapes(void **state)
{
    json_t *root = load_schema("schemas/result.schema.json");
    struct be_out lp[3];
    memset(lp, 0, sizeof lp);
    for (int i = 0; i < 3; i++) {
        lp[i].token = i + 1;
        lp[i].logprob = -0.5f * (float)i;
        lp[i].n_top = 2;
        lp[i].top_ids[0] = i + 1, lp[i].top_ids[1] = i + 2;
        lp[i].top_logprobs[0] = -0.1f, lp[i].top_logprobs[1] = -INFINITY;
    }
    int32_t prompt_ids[2] = {7, 8}, ids[3] = {1, 2, 3};
    struct res_output done = {.finish = FINISH_STOP,
                              .text = "abc",
                              .text_len = 3,
                              .prompt_tokens = 2,
                              .completion_tokens = 3,
                              .prompt_ids = prompt_ids,
                              .token_ids = ids,
                              .logprobs = lp,
                              .model = "tiny",
                              .created = 1733000000};
    struct res_output cancelled = done, length = done;
    cancelled.finish = FINISH_CANCELLED;
    length.finish = FINISH_LENGTH;
    struct res_output failed =
        res_failed(JOB_ERR_INVALID, "field 'max_tokens': expected an integer >= 1, got -3");
    struct res_output timeout = done; /* failed, with what it generated */
    timeout.finish = FINISH_TIMEOUT;
    timeout.error = "timeout_s (2 s) passed after 3 generated tokens; the text so far is kept";
    timeout.error_rc = JOB_ERR_TIMEOUT;
    struct res_output thought = done, thought_timeout = timeout; /* a model that thinks */
    thought.reasoning = thought_timeout.reasoning = "hmm";
    thought.reasoning_len = thought_timeout.reasoning_len = 3;
    thought.has_reasoning = thought_timeout.has_reasoning = true;
    thought.reasoning_tokens = thought_timeout.reasoning_tokens = 2;

    struct job j;
    parse_or_fail("{\"id\": \"a\", \"prompt\": \"x\", \"return_token_ids\": true, \"logprobs\": 2, "
                  "\"metadata\": {\"doc\": \"d.txt\"}}",
                  &j);
    expect_shape(root, &j, &done, "llmq_completed");
    expect_shape(root, &j, &cancelled, "llmq_completed");
    expect_shape(root, &j, &failed, "llmq_failed");
    expect_shape(root, &j, &timeout, "llmq_timeout");
    expect_shape(root, &j, &thought, "llmq_completed");
    expect_shape(root, &j, &thought_timeout, "llmq_timeout");
    job_free(&j);
    parse_or_fail("{\"prompt\": \"x\"}", &j); /* no id, no extras */
    expect_shape(root, &j, &length, "llmq_completed");
    job_free(&j);
    /* structured output: json and json_incomplete beside text */
    parse_or_fail("{\"id\": \"s\", \"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", &j);
    struct res_output answer = done, cut = length, answer_timeout = timeout;
    answer.text = answer_timeout.text = "{\"a\": [1.5]}";
    answer.text_len = answer_timeout.text_len = strlen(answer.text);
    cut.text = "{\"a\": [1.";
    cut.text_len = strlen(cut.text);
    expect_shape(root, &j, &answer, "llmq_completed");
    expect_shape(root, &j, &cut, "llmq_completed");
    expect_shape(root, &j, &answer_timeout, "llmq_timeout");
    expect_shape(root, &j, &failed, "llmq_failed");
    job_free(&j);
    /* a line that is not JSON: the failed shape, without an id */
    char err[256];
    assert_int_not_equal(job_parse("{nope", 5, NULL, &j, err, sizeof err), 0);
    struct res_output bad = res_failed(JOB_ERR_JSON, err);
    expect_shape(root, &j, &bad, "llmq_failed");
    job_free(&j);

    parse_or_fail(
        "{\"custom_id\": \"r1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": "
        "2}}",
        &j);
    expect_shape(root, &j, &done, "openai_ok");
    expect_shape(root, &j, &failed, "openai_error");
    expect_shape(root, &j, &cancelled, "openai_error");
    expect_shape(root, &j, &timeout, "openai_timeout");
    expect_shape(root, &j, &thought, "openai_ok");
    expect_shape(root, &j, &thought_timeout, "openai_timeout");
    job_free(&j);
    parse_or_fail("{\"custom_id\": \"r2\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", "
                  "\"logprobs\": 2}}",
                  &j);
    expect_shape(root, &j, &done, "openai_ok");
    expect_shape(root, &j, &length, "openai_ok");
    expect_shape(root, &j, &timeout, "openai_timeout");
    job_free(&j);
    parse_or_fail("{\"custom_id\": \"r3\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2]}}",
                  &j);
    expect_shape(root, &j, &done, "openai_ok"); /* logprobs null */
    job_free(&j);
    /* truncate: usage.truncated_tokens */
    struct res_output cut_prompt = done, cut_timeout = timeout;
    cut_prompt.truncated_tokens = cut_timeout.truncated_tokens = 9;
    parse_or_fail("{\"id\": \"t\", \"prompt\": \"x\", \"truncate\": \"start\"}", &j);
    expect_shape(root, &j, &cut_prompt, "llmq_completed");
    expect_shape(root, &j, &cut_timeout, "llmq_timeout");
    job_free(&j);
    parse_or_fail("{\"custom_id\": \"t1\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
                  "[{\"role\": \"user\", \"content\": \"hi\"}], \"truncate\": \"end\"}}",
                  &j);
    expect_shape(root, &j, &cut_prompt, "openai_ok");
    job_free(&j);
    parse_or_fail("{\"custom_id\": \"t2\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", "
                  "\"truncate\": \"middle\"}}",
                  &j);
    expect_shape(root, &j, &cut_timeout, "openai_timeout");
    job_free(&j);
    json_decref(root);
}

/* ---- jobs */

static const char *find_template(void *ctx, const char *name)
{
    return !strcmp(name, "summarize") ? "Summarize:\n{document}" : NULL;
}

static int parse(const char *line, char *err, size_t errlen)
{
    struct job_opts o = job_opts_default();
    o.template_find = find_template;
    struct job j;
    int rc = job_parse(line, strlen(line), &o, &j, err, errlen);
    job_free(&j);
    return rc;
}

/* The property names of $defs/<def>. */
static json_t *props(json_t *root, const char *def)
{
    json_t *p = json_object_get(json_object_get(json_object_get(root, "$defs"), def), "properties");
    assert_non_null(p);
    return p;
}

/* Per form, the schema's property names are exactly the names job_parse does not call unknown:
 * every name of any form (and some that are in none) is tried in every form with a null value
 * (null counts as absent, so only the name matters). */
static void test_job_field_names(void **state)
{
    json_t *root = load_schema("schemas/job.schema.json");
    static const char *const defs[3] = {"llmq", "chat_body", "completion_body"};
    json_t *names = json_object();
    for (int f = 0; f < 3; f++) {
        const char *k;
        json_t *x;
        json_object_foreach(props(root, defs[f]), k, x) json_object_set_new(names, k, json_true());
    }
    static const char *const extra[] = {"foo",          "max_token", "tool_calls", "response", "logit_bias",
                                        "best_of",      "n",         "stream",     "audio",    "prompt_ids",
                                        "stop_strings", "top_n"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        json_object_set_new(names, extra[i], json_true());

    int checked = 0;
    const char *name;
    json_t *unused;
    json_object_foreach(names, name, unused)
    {
        for (int f = 0; f < 3; f++) {
            static const char *const base_key[3] = {"prompt", "messages", "prompt"};
            static const char *const base_val[3] = {"\"x\"", "[{\"role\": \"user\", \"content\": \"x\"}]",
                                                    "\"x\""};
            if (!strcmp(name, base_key[f]))
                continue; /* the base field itself; the schema requires it in that form */
            char line[512], err[256];
            if (f == 0)
                snprintf(line, sizeof line, "{\"%s\": %s, \"%s\": null}", base_key[f], base_val[f], name);
            else
                snprintf(line, sizeof line,
                         "{\"custom_id\": \"r\", \"url\": \"%s\", \"body\": {\"%s\": %s, \"%s\": null}}",
                         f == 1 ? "/v1/chat/completions" : "/v1/completions", base_key[f], base_val[f], name);
            int rc = parse(line, err, sizeof err);
            bool parser_knows = rc == 0 || !strstr(err, "unknown field");
            bool schema_has = json_object_get(props(root, defs[f]), name) != NULL;
            if (parser_knows != schema_has)
                fail_msg("%s: field '%s': job_parse %s it (%s), the schema %s", defs[f], name,
                         parser_knows ? "knows" : "does not know", rc ? err : "ok",
                         schema_has ? "has it" : "does not");
            checked++;
        }
    }
    printf("note: %d field names checked across 3 forms\n", checked);
    json_decref(names);
    json_decref(root);
}

/* Lines where schema and parser must agree. Context length, byte lengths and configured
 * templates are outside what a schema can know, so the corpus stays away from them. */
static void test_job_corpus(void **state)
{
    json_t *root = load_schema("schemas/job.schema.json");
    static const char *const lines[] = {
        /* good */
        "{\"prompt\": \"hello\"}",
        "{\"id\": \"doc-1\", \"prompt\": \"x\", \"max_tokens\": 5, \"temperature\": 0, \"top_p\": 1, "
        "\"top_k\": -1, "
        "\"min_p\": 0.1, \"seed\": -5, \"stop\": [\"a\", \"b\"], \"stop_token_ids\": [1, 2], "
        "\"presence_penalty\": -2, "
        "\"frequency_penalty\": 2, \"repetition_penalty\": 1.1, \"logprobs\": 20, \"return_token_ids\": "
        "true, "
        "\"ignore_eos\": false, \"skip_special_tokens\": true, \"metadata\": {\"a\": [1]}, \"min_tokens\": "
        "1}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
        "\"content\": "
        "[{\"type\": \"text\", \"text\": \"hi\"}]}], \"enable_thinking\": false, \"logprobs\": true}",
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"x\", \"name\": \"n\"}, {\"role\": "
        "\"assistant\", "
        "\"content\": \"y\", \"reasoning_content\": null, \"tool_calls\": []}, {\"role\": \"user\", "
        "\"content\": \"z\"}]}",
        "{\"template\": \"summarize\", \"vars\": {\"document\": \"text\"}, \"stop\": \"END\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", "
        "\"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": "
        "\"{}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"18 C\"}], \"tools\": [{\"type\": "
        "\"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"type\": \"object\"}}}], "
        "\"documents\": [{\"text\": \"d\"}], \"chat_template_kwargs\": {\"enable_thinking\": true, \"x\": "
        "[1]}}",
        "{\"template\": \"summarize\", \"vars\": {\"document\": \"text\"}, \"chat_template_kwargs\": {\"a\": "
        "1}}",
        "{\"prompt\": \"x\", \"max_tokens\": null, \"seed\": null}",
        "{\"prompt\": \"x\", \"timeout_s\": 0.5, \"priority\": -1}",
        "{\"prompt\": \"<think>\\n\", \"thinking_budget\": 0, \"stop_in_reasoning\": true}",
        "{\"custom_id\": \"r6\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"thinking_budget\": 512, \"stop_in_reasoning\": false}}",
        "{\"custom_id\": \"r5\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", "
        "\"timeout_s\": 604800, \"priority\": 1000}}",
        "{\"custom_id\": \"r1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
        "{\"model\": \"m\", "
        "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_completion_tokens\": 9, \"n\": 1, "
        "\"stream\": false, \"logprobs\": true, \"top_logprobs\": 3, \"chat_template_kwargs\": "
        "{\"enable_thinking\": "
        "false}, \"response_format\": {\"type\": \"text\"}, \"tools\": [], \"user\": \"u\", \"store\": "
        "true}}",
        "{\"custom_id\": \"r6\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"f\"}}], "
        "\"tool_choice\": \"auto\", \"documents\": []}}",
        "{\"custom_id\": \"r2\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"x\"], \"logprobs\": "
        "5, "
        "\"echo\": false, \"best_of\": 1, \"suffix\": \"\"}}",
        "{\"custom_id\": \"r3\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2, 3]}}",
        "{\"custom_id\": \"r4\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [[1, 2, 3]], \"stop\": "
        "null}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
        "\"doc_1\", \"schema\": {\"type\": \"object\"}, \"strict\": true, \"description\": \"d\"}}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}, \"regex\": null}",
        "{\"prompt\": \"x\", \"regex\": \"[a-z]+\"}",
        "{\"prompt\": \"x\", \"truncate\": \"middle\"}",
        "{\"custom_id\": \"r9\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1], \"truncate\": "
        "\"start\"}}",
        "{\"custom_id\": \"r7\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"choice\": [\"yes\", \"no\"]}}",
        "{\"custom_id\": \"r8\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", "
        "\"response_format\": "
        "{\"type\": \"json_object\"}}}",
        "{\"id\": \"d\", \"document\": \"a long text\", \"summarize\": {}}",
        "{\"document\": \"x\", \"vars\": {\"lang\": \"de\"}, \"summarize\": {\"chunk_tokens\": 64, "
        "\"overlap_tokens\": 8, \"max_tokens\": 20}, \"max_tokens\": 40}",
        "{\"document\": \"x\", \"summarize\": true}",
        /* bad */
        "{\"document\": \"x\"}",
        "{\"document\": \"x\", \"summarize\": {\"chunk\": 64}}",
        "{\"document\": \"x\", \"summarize\": {\"chunk_tokens\": 8}}",
        "{\"document\": \"x\", \"summarize\": false}",
        "{\"prompt\": \"x\", \"vars\": {}}",
        "{\"document\": \"x\", \"prompt\": \"y\", \"summarize\": {}}",
        "{\"prompt\": \"x\", \"choice\": []}",
        "{\"prompt\": \"x\", \"choice\": [\"\"]}",
        "{\"prompt\": \"x\", \"regex\": \"\"}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"xml\"}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\", \"x\": 1}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
        "\"a b\", "
        "\"schema\": {}}}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
        "{}}}}",
        "{}",
        "{\"prompt\": \"\"}",
        "{\"prompt\": 5}",
        "{\"prompt\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
        "{\"prompt\": \"x\", \"max_token\": 5}",
        "{\"prompt\": \"x\", \"max_tokens\": 0}",
        "{\"prompt\": \"x\", \"max_tokens\": 5.5}",
        "{\"prompt\": \"x\", \"max_tokens\": \"5\"}",
        "{\"prompt\": \"x\", \"temperature\": -1}",
        "{\"prompt\": \"x\", \"top_p\": 0}",
        "{\"prompt\": \"x\", \"top_k\": -2}",
        "{\"prompt\": \"x\", \"min_p\": 1.5}",
        "{\"prompt\": \"x\", \"presence_penalty\": 3}",
        "{\"prompt\": \"x\", \"repetition_penalty\": 0}",
        "{\"prompt\": \"x\", \"logprobs\": 21}",
        "{\"prompt\": \"x\", \"stop\": [\"\"]}",
        "{\"prompt\": \"x\", \"stop\": [1]}",
        "{\"prompt\": \"x\", \"stop_token_ids\": [-1]}",
        "{\"prompt\": \"x\", \"metadata\": [1]}",
        "{\"prompt\": \"x\", \"ignore_eos\": 1}",
        "{\"prompt\": \"x\", \"thinking_budget\": -1}",
        "{\"prompt\": \"x\", \"thinking_budget\": 2.5}",
        "{\"prompt\": \"x\", \"stop_in_reasoning\": 1}",
        "{\"prompt\": \"x\", \"timeout_s\": 0}",
        "{\"prompt\": \"x\", \"timeout_s\": 604801}",
        "{\"prompt\": \"x\", \"priority\": 1.5}",
        "{\"prompt\": \"x\", \"priority\": -1001}",
        "{\"prompt\": \"x\", \"truncate\": \"left\"}",
        "{\"prompt\": \"x\", \"truncate\": true}",
        "{\"prompt\": \"x\", \"vars\": {\"a\": \"b\"}}",
        "{\"id\": \"\", \"prompt\": \"x\"}",
        "{\"id\": \"a\\nb\", \"prompt\": \"x\"}",
        "{\"id\": 5, \"prompt\": \"x\"}",
        "{\"messages\": []}",
        "{\"messages\": [{\"role\": \"\", \"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"user\"}]}",
        "{\"messages\": [{\"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": 1}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"documents\": [1]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"tools\": "
        "[]}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": "
        "{\"enable_thinking\": 1}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"extra\": 1}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": \"x\"}}",
        "{\"custom_id\": \"r\", \"method\": \"GET\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
        "\"x\"}}",
        "{\"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/completions\"}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"prompt\": \"x\"}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", "
        "\"content\": \"x\"}], \"n\": 2}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", "
        "\"content\": \"x\"}], \"logprobs\": 3}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", "
        "\"content\": \"x\"}], \"audio\": {\"voice\": \"x\"}}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"a\", \"b\"]}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"echo\": true}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}, \"extra\": 1}",
    };
    int good = 0, bad = 0;
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        char err[256];
        int rc = parse(lines[i], err, sizeof err);
        json_t *v = json_loads(lines[i], 0, NULL);
        assert_non_null(v);
        bool schema_ok = valid(root, root, v, "");
        if (schema_ok != (rc == 0))
            fail_msg("%s\n  job_parse: %s; schema: %s", lines[i], rc ? err : "ok", schema_ok ? "valid" : why);
        rc == 0 ? good++ : bad++;
        json_decref(v);
    }
    printf("note: schema and parser agree on %d good and %d bad lines\n", good, bad);
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_shapes),
        cmocka_unit_test(test_job_field_names),
        cmocka_unit_test(test_job_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
