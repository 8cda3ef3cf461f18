/* engine/chat_template: the Qwen3 ChatML template against transformers' own renders
 * (tests/fixtures/tokenizer/qwen3_chat.jsonl, made by make_fixtures.py), plus every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat_template.h"
#include "testutil.h"

#define GOLDEN "tests/fixtures/tokenizer/qwen3_chat.jsonl"
#define CASES "tests/fixtures/tokenizer/chats.jsonl"

/* ---- helpers */

/* chat_render must fail, leave *out NULL, and say `want` (a substring) in err. */
static void expect_render_error(const struct chat_message *m, size_t n, const char *want)
{
    char err[256] = "", *out = (char *)"sentinel";
    struct chat_options o = chat_options_default();
    assert_int_equal(chat_render(m, n, &o, &out, err, sizeof err), -1);
    assert_null(out);
    if (!strstr(err, want)) {
        print_error("error was \"%s\", expected it to contain \"%s\"\n", err, want);
        fail();
    }
}

/* chat_messages_from_json on the JSON text must fail with `want` in err and leave *msgs NULL. */
static void expect_json_error(const char *json, size_t flags, const char *want)
{
    json_error_t je;
    json_t *v = json_loads(json, flags | JSON_DECODE_ANY, &je);
    if (!v) {
        print_error("test JSON does not parse: %s\n", je.text);
        fail();
    }
    struct chat_message *msgs = (struct chat_message *)&je; /* any non-NULL value */
    size_t n = 99;
    char err[256] = "";
    assert_int_equal(chat_messages_from_json(v, &msgs, &n, err, sizeof err), -1);
    assert_null(msgs);
    assert_int_equal(n, 0);
    if (!strstr(err, want)) {
        print_error("for %s: error was \"%s\", expected it to contain \"%s\"\n", json, err, want);
        fail();
    }
    json_decref(v);
}

/* ---- options and a sanity case read straight off the template text */

static void test_defaults(void **state)
{
    (void)state;
    struct chat_options o = chat_options_default();
    assert_true(o.add_generation_prompt);
    assert_true(o.enable_thinking);
}

static void test_null_options_mean_defaults(void **state)
{
    (void)state;
    struct chat_message m[] = {{"user", "hi", NULL}};
    char err[256], *a = NULL, *b = NULL;
    struct chat_options o = chat_options_default();
    assert_int_equal(chat_render(m, 1, NULL, &a, err, sizeof err), 0);
    assert_int_equal(chat_render(m, 1, &o, &b, err, sizeof err), 0);
    assert_string_equal(a, b);
    /* the template's user turn and generation prompt, literally */
    assert_string_equal(a, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    free(b);
}

/* ---- chat_render errors */

static void test_render_empty(void **state)
{
    (void)state;
    expect_render_error(NULL, 0, "messages: the list is empty");
    struct chat_message m[] = {{"user", "hi", NULL}};
    expect_render_error(m, 0, "messages: the list is empty");
}

static void test_render_bad_roles(void **state)
{
    (void)state;
    struct chat_message tool[] = {{"user", "q", NULL}, {"assistant", "a", NULL}, {"tool", "r", NULL}};
    expect_render_error(tool, 3, "messages[2].role: 'tool' is not supported");
    struct chat_message other[] = {{"function", "x", NULL}};
    expect_render_error(other, 1, "messages[0].role: 'function' is not supported");
    struct chat_message upper[] = {{"user", "x", NULL}, {"User", "x", NULL}};
    expect_render_error(upper, 2, "messages[1].role: 'User' is not supported");
    struct chat_message empty[] = {{"", "x", NULL}};
    expect_render_error(empty, 1, "messages[0].role: '' is not supported");
    struct chat_message missing[] = {{"user", "x", NULL}, {NULL, "x", NULL}};
    expect_render_error(missing, 2, "messages[1].role: missing");
}

static void test_render_missing_content(void **state)
{
    (void)state;
    struct chat_message m[] = {{"system", "s", NULL}, {"user", "u", NULL}, {"assistant", NULL, "r"}};
    expect_render_error(m, 3, "messages[2].content: missing");
}

/* ---- chat_messages_from_json */

static void test_json_errors(void **state)
{
    (void)state;
    expect_json_error("{\"role\": \"user\", \"content\": \"x\"}", 0, "messages: expected an array");
    expect_json_error("\"hello\"", 0, "messages: expected an array");
    expect_json_error("[]", 0, "messages: the list is empty");
    expect_json_error("[{\"role\": \"user\", \"content\": \"x\"}, 3]", 0, "messages[1]: expected an object");
    expect_json_error("[{\"content\": \"x\"}]", 0, "messages[0].role: missing");
    expect_json_error("[{\"role\": 1, \"content\": \"x\"}]", 0, "messages[0].role: expected a string");
    expect_json_error("[{\"role\": null, \"content\": \"x\"}]", 0, "messages[0].role: expected a string");
    expect_json_error("[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": \"r\"}]",
                      0, "messages[1].role: 'tool' is not supported");
    expect_json_error("[{\"role\": \"developer\", \"content\": \"x\"}]", 0,
                      "messages[0].role: 'developer' is not supported");
    expect_json_error("[{\"role\": \"user\"}]", 0, "messages[0].content: missing");
    expect_json_error("[{\"role\": \"user\", \"content\": null}]", 0,
                      "messages[0].content: expected a string");
    expect_json_error("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]", 0,
                      "messages[0].content: expected a string");
    expect_json_error("[{\"role\": \"user\", \"content\": 5}]", 0, "messages[0].content: expected a string");
    expect_json_error("[{\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": 7}]", 0,
                      "messages[0].reasoning_content: expected a string or null");
    expect_json_error("[{\"role\": \"user\", \"content\": \"x\", \"name\": 3}]", 0,
                      "messages[0].name: expected a string");
    expect_json_error(
        "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
        "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}]",
        0, "messages[1].tool_calls: tool calls are not supported");
    expect_json_error("[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": {}}]", 0,
                      "messages[0].tool_calls: tool calls are not supported");
    expect_json_error("[{\"role\": \"user\", \"content\": \"x\", \"images\": []}]", 0,
                      "messages[0].images: unknown key");
    expect_json_error("[{\"role\": \"user\", \"content\": \"a\\u0000b\"}]", JSON_ALLOW_NUL,
                      "messages[0].content: contains a NUL character");
}

static void test_json_ok(void **state)
{
    (void)state;
    const char *text =
        "[{\"role\": \"system\", \"content\": \"s\", \"name\": \"sys\"},"
        " {\"role\": \"user\", \"content\": \"\"},"
        " {\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": null, \"tool_calls\": null},"
        " {\"role\": \"assistant\", \"content\": \"b\", \"reasoning_content\": \"r\", \"tool_calls\": []}]";
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    assert_non_null(v);
    struct chat_message *m = NULL;
    size_t n = 0;
    char err[256] = "";
    assert_int_equal(chat_messages_from_json(v, &m, &n, err, sizeof err), 0);
    assert_int_equal(n, 4);
    assert_string_equal(m[0].role, "system");
    assert_string_equal(m[0].content, "s");
    assert_null(m[0].reasoning_content);
    assert_string_equal(m[1].content, "");
    assert_null(m[2].reasoning_content);
    assert_string_equal(m[3].reasoning_content, "r");
    free(m);
    json_decref(v);
}

/* ---- the golden renders from transformers */

/* A JSON-quoted copy of s (caller frees), so control characters and newlines show. */
static char *quoted(const char *s)
{
    json_t *j = json_stringn_nocheck(s, strlen(s));
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return q;
}

/* Prints the first difference between what we rendered and what transformers rendered. */
static void report_mismatch(size_t line, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    while (from > 0 && ((unsigned char)want[from] & 0xC0) == 0x80) /* start on a character */
        from--;
    char *g = quoted(got + from), *w = quoted(want + from);
    print_error("%s line %zu: rendered text differs from transformers at byte %zu\n"
                "  ours (from byte %zu):         %.300s\n  transformers (from byte %zu): %.300s\n",
                GOLDEN, line, i, from, g ? g : "?", from, w ? w : "?");
    free(g);
    free(w);
}

static void test_golden_transformers(void **state)
{
    (void)state;
    FILE *f = fopen(test_source(GOLDEN), "r");
    if (!f) {
        print_error(
            "%s is missing: generate it on the GPU machine with\n"
            "  python3 tests/fixtures/tokenizer/make_fixtures.py --tokenizer <dir with tokenizer.json and "
            "tokenizer_config.json> --out tests/fixtures/tokenizer\n"
            "(see tests/fixtures/tokenizer/README.md)\n",
            GOLDEN);
        fail();
    }
    FILE *cases = fopen(test_source(CASES), "r");
    assert_non_null(cases);

    char *line = NULL, *cline = NULL;
    size_t cap = 0, ccap = 0, lineno = 0, failures = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *g = json_loads(line, 0, &je);
        if (!g) {
            print_error("%s line %zu: bad JSON: %s\n", GOLDEN, lineno, je.text);
            fail();
        }
        /* the fixture must be the render of the current chats.jsonl, case for case */
        if (getline(&cline, &ccap, cases) <= 0) {
            print_error("%s has more lines than %s: regenerate it\n", GOLDEN, CASES);
            fail();
        }
        json_t *c = json_loads(cline, 0, &je);
        assert_non_null(c);
        const char *keys[] = {"messages", "enable_thinking", "add_generation_prompt"};
        for (size_t k = 0; k < 3; k++)
            if (!json_equal(json_object_get(g, keys[k]), json_object_get(c, keys[k]))) {
                print_error("%s line %zu: \"%s\" differs from %s: regenerate the fixture\n", GOLDEN, lineno,
                            keys[k], CASES);
                fail();
            }

        const char *want = json_string_value(json_object_get(g, "text"));
        assert_non_null(want);
        struct chat_options o = chat_options_default();
        json_t *et = json_object_get(g, "enable_thinking");
        if (json_is_boolean(et)) /* null: not passed, the template's default (thinking on) */
            o.enable_thinking = json_is_true(et);
        json_t *agp = json_object_get(g, "add_generation_prompt");
        assert_true(json_is_boolean(agp));
        o.add_generation_prompt = json_is_true(agp);

        struct chat_message *m = NULL;
        size_t n = 0;
        char err[256] = "", *got = NULL;
        if (chat_messages_from_json(json_object_get(g, "messages"), &m, &n, err, sizeof err) ||
            chat_render(m, n, &o, &got, err, sizeof err)) {
            print_error("%s line %zu: %s\n", GOLDEN, lineno, err);
            failures++;
        } else if (strcmp(got, want)) {
            report_mismatch(lineno, got, want);
            failures++;
        }
        free(got);
        free(m);
        json_decref(c);
        json_decref(g);
    }
    if (getline(&cline, &ccap, cases) > 0) {
        print_error("%s has fewer lines than %s: regenerate it\n", GOLDEN, CASES);
        fail();
    }
    free(line);
    free(cline);
    fclose(cases);
    fclose(f);
    printf("%zu transformers renders compared, %zu differ\n", lineno, failures);
    assert_true(lineno >= 40);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_null_options_mean_defaults),
        cmocka_unit_test(test_render_empty),
        cmocka_unit_test(test_render_bad_roles),
        cmocka_unit_test(test_render_missing_content),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_json_ok),
        cmocka_unit_test(test_golden_transformers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
