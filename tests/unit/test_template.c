/* Prompt templates: the renderer (worker/jobs/template.c), its check at config load (worker/config/config.c)
 * and its use by the job parser (worker/jobs/job.c). Expected texts are written out by hand from the
 * rules in template.h (Python's str.format with plain names), never taken from the code. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/config/config.h"
#include "worker/jobs/job.h"
#include "worker/jobs/template.h"

/* Renders text with vars given as JSON text; returns the rc, the output in *out (owned). */
static int render(const char *text, const char *vars_json, char **out, char *var, char *err, size_t errlen)
{
    json_t *vars = NULL;
    if (vars_json) {
        json_error_t je;
        vars = json_loads(vars_json, 0, &je);
        if (!vars)
            fail_msg("bad test JSON %s: %s", vars_json, je.text);
    }
    int rc = tmpl_render(text, vars, out, var, err, errlen);
    json_decref(vars);
    return rc;
}

static void expect_text(const char *text, const char *vars, const char *want)
{
    char *out = NULL, var[TMPL_MAX_NAME + 1], err[256] = "";
    int rc = render(text, vars, &out, var, err, sizeof err);
    if (rc != TMPL_OK || !out || strcmp(out, want))
        fail_msg("render \"%s\" with %s: rc %d err \"%s\" got \"%s\", want \"%s\"", text,
                 vars ? vars : "NULL", rc, err, out ? out : "(null)", want);
    free(out);
}

static void test_render(void **state)
{
    (void)state;
    expect_text("Summarize this:\n{document}", "{\"document\": \"The fox.\"}", "Summarize this:\nThe fox.");
    expect_text("", NULL, "");
    expect_text("no placeholders", NULL, "no placeholders");
    expect_text("{a}{b}{a}", "{\"a\": \"1\", \"b\": \"2\"}", "121");
    expect_text("{{literal}} and {{{x}}}", "{\"x\": \"v\"}", "{literal} and {v}");
    expect_text("}}{{", NULL, "}{");
    expect_text("{x}", "{\"x\": \"\"}", "");
    /* a value is inserted as is: braces in it are not placeholders */
    expect_text("<{x}>", "{\"x\": \"{y} }} {{\"}", "<{y} }} {{>");
    /* names: letters, digits, _ - . */
    expect_text("{doc_1}/{q-a}/{v1.2}/{X}",
                "{\"doc_1\": \"a\", \"q-a\": \"b\", \"v1.2\": \"c\", \"X\": \"d\"}", "a/b/c/d");
    /* UTF-8 and a NUL-free multi-line value */
    expect_text("«{t}»", "{\"t\": \"Grüße\\n日本\"}", "«Grüße\n日本»");
    /* numbers: integers as digits, reals as Python's repr */
    expect_text("{i} {n} {r} {e} {h}", "{\"i\": 42, \"n\": -7, \"r\": 0.1, \"e\": 1e20, \"h\": 2.5}",
                "42 -7 0.1 1e+20 2.5");
    /* vars the template does not use are ignored, whatever their type */
    expect_text("{a}", "{\"a\": \"x\", \"b\": [1], \"c\": null}", "x");
}

static void expect_render_error(const char *text, const char *vars, int want_rc, const char *want_var,
                                const char *want_msg)
{
    char *out = (char *)1, var[TMPL_MAX_NAME + 1], err[256] = "";
    int rc = render(text, vars, &out, var, err, sizeof err);
    if (rc != want_rc || out != NULL || !strstr(err, want_msg) || (want_var && strcmp(var, want_var)))
        fail_msg("render \"%s\" with %s: rc %d var \"%s\" err \"%s\"; want rc %d var \"%s\" err \"%s\"", text,
                 vars ? vars : "NULL", rc, var, err, want_rc, want_var ? want_var : "", want_msg);
}

static void test_render_errors(void **state)
{
    (void)state;
    expect_render_error("Summarize {document} in {n} words", "{\"document\": \"x\"}", TMPL_ERR_MISSING, "n",
                        "no value for placeholder 'n'");
    expect_render_error("{document}", NULL, TMPL_ERR_MISSING, "document", "'document'");
    expect_render_error("{document}", "{}", TMPL_ERR_MISSING, "document", "'document'");
    const char *not_strings[] = {"true", "false", "null", "[\"x\"]", "{\"k\": \"v\"}"};
    for (size_t i = 0; i < sizeof not_strings / sizeof not_strings[0]; i++) {
        char vars[64];
        snprintf(vars, sizeof vars, "{\"d\": %s}", not_strings[i]);
        expect_render_error("x {d}", vars, TMPL_ERR_TYPE, "d",
                            "the value of 'd' is not a string or a number");
    }
    /* a syntax error is reported before any var is looked at */
    expect_render_error("{missing} {", NULL, TMPL_ERR_SYNTAX, "", "unmatched '{' at byte 10");
}

static void expect_syntax(const char *text, const char *want_msg)
{
    char err[256] = "";
    int rc = tmpl_check(text, err, sizeof err);
    if (want_msg == NULL) {
        if (rc != TMPL_OK)
            fail_msg("check \"%s\": rc %d err \"%s\", want OK", text, rc, err);
        return;
    }
    if (rc != TMPL_ERR_SYNTAX || !strstr(err, want_msg))
        fail_msg("check \"%s\": rc %d err \"%s\", want \"%s\"", text, rc, err, want_msg);
}

static void test_check(void **state)
{
    (void)state;
    expect_syntax("Summarize:\n\n{document}\n\nSummary:", NULL);
    expect_syntax("{{\"json\": {value}}}", NULL);
    expect_syntax("{{}}", NULL);
    expect_syntax("Oops {doc", "unmatched '{' at byte 5");
    expect_syntax("{", "unmatched '{' at byte 0");
    expect_syntax("a}", "unmatched '}' at byte 1");
    expect_syntax("{a}}", "unmatched '}' at byte 3");
    expect_syntax("{a{b}", "unmatched '{' at byte 0");
    expect_syntax("x {}", "empty placeholder {} at byte 2");
    expect_syntax("{a b}", "placeholder at byte 0: 'a b' is not a name");
    expect_syntax("{\"k\": 1}", "is not a name");
    expect_syntax("{{{x}", NULL); /* {{ then {x} */
    char longname[TMPL_MAX_NAME + 4];
    memset(longname, 'a', sizeof longname);
    longname[0] = '{';
    longname[TMPL_MAX_NAME + 2] = '}';
    longname[TMPL_MAX_NAME + 3] = 0;
    expect_syntax(longname, "longer than 64 characters");
    longname[TMPL_MAX_NAME + 1] = '}';
    longname[TMPL_MAX_NAME + 2] = 0;
    expect_syntax(longname, NULL); /* exactly 64 */
}

/* ---- at config load */

static char dir[128];
static char path[192];

static int setup(void **state)
{
    (void)state;
    if (scratch_dir_make(getenv("TMPDIR"), "test-template", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/llmq.yaml", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    rmdir(dir);
    return 0;
}

static void write_config(const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_config_load(void **state)
{
    (void)state;
    struct cfg c;
    char err[512], want[512];
    write_config("templates:\n"
                 "  ok: \"Summarize this:\\n{document}\"\n"
                 "  json: \"Answer as {{\\\"summary\\\": ...}}: {document}\"\n");
    assert_int_equal(cfg_load(&c, path, err, sizeof err), 0);
    assert_string_equal(cfg_template_find(&c, "ok"), "Summarize this:\n{document}");
    cfg_free(&c);

    write_config("sampling:\n  max_tokens: 10\ntemplates:\n  ok: \"{a}\"\n  summarize: \"Oops {doc\"\n");
    assert_int_equal(cfg_load(&c, path, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s:5: templates.summarize: unmatched '{' at byte 5", path);
    if (strncmp(err, want, strlen(want)))
        fail_msg("got \"%s\", want \"%s...\"", err, want);
    cfg_free(&c);

    write_config("templates:\n  t: \"a } b\"\n");
    assert_int_equal(cfg_load(&c, path, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s:2: templates.t: unmatched '}' at byte 2", path);
    if (strncmp(err, want, strlen(want)))
        fail_msg("got \"%s\", want \"%s...\"", err, want);
    cfg_free(&c);

    /* the same check for --set templates.NAME=TEXT */
    cfg_defaults(&c);
    assert_int_equal(cfg_set(&c, "templates.t", "{a b}", "--set", err, sizeof err), -1);
    assert_non_null(strstr(err, "--set: placeholder at byte 0: 'a b' is not a name"));
    assert_int_equal(c.n_templates, 0);
    assert_int_equal(cfg_set(&c, "templates.t", "{a} {{b}}", "--set", err, sizeof err), 0);
    assert_string_equal(cfg_template_find(&c, "t"), "{a} {{b}}");
    cfg_free(&c);
}

/* ---- in a job */

static const char *find(void *ctx, const char *name)
{
    (void)ctx;
    if (!strcmp(name, "summarize"))
        return "Summarize this:\n{document}";
    if (!strcmp(name, "spaces"))
        return "{a b}"; /* not from a config (those are checked): the parser still refuses it */
    if (!strcmp(name, "empty"))
        return "{x}";
    return NULL;
}

static void expect_job_error(const struct job_opts *o, const char *line, const char *want)
{
    struct job j;
    char err[512] = "";
    int rc = job_parse(line, strlen(line), o, &j, err, sizeof err);
    if (rc != JOB_ERR_INVALID || !strstr(err, want))
        fail_msg("%s: rc %d err \"%s\", want \"%s\"", line, rc, err, want);
    job_free(&j);
}

static void test_jobs(void **state)
{
    (void)state;
    struct job_opts o = job_opts_default();
    o.template_find = find;
    struct job j;
    char err[512];
    const char *ok =
        "{\"id\": \"d1\", \"template\": \"summarize\", \"vars\": {\"document\": \"The {quick} fox.\"},"
        " \"max_tokens\": 5}";
    assert_int_equal(job_parse(ok, strlen(ok), &o, &j, err, sizeof err), JOB_OK);
    /* the rendered text is one user message through the chat template */
    assert_null(j.prompt);
    assert_int_equal(json_array_size(j.messages), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(j.messages, 0), "role")), "user");
    assert_string_equal(json_string_value(json_object_get(json_array_get(j.messages, 0), "content")),
                        "Summarize this:\nThe {quick} fox.");
    assert_int_equal(j.max_tokens, 5);
    job_free(&j);

    expect_job_error(&o, "{\"template\": \"summarize\", \"vars\": {\"doc\": \"x\"}}",
                     "field 'vars': template 'summarize' needs 'document'");
    expect_job_error(&o, "{\"template\": \"summarize\", \"vars\": {\"document\": true}}",
                     "field 'vars.document': expected a string or a number, got true");
    expect_job_error(&o, "{\"template\": \"summarize\", \"vars\": {\"document\": null}}",
                     "field 'vars.document': expected a string or a number, got null");
    expect_job_error(&o, "{\"template\": \"summarize\", \"vars\": {\"document\": {\"a\": 1}}}",
                     "field 'vars.document': expected a string or a number");
    expect_job_error(&o, "{\"template\": \"nope\", \"vars\": {}}",
                     "field 'template': no template named 'nope' in the config");
    expect_job_error(&o, "{\"template\": \"summarize\", \"prompt\": \"x\", \"vars\": {\"document\": \"x\"}}",
                     "fields 'prompt', 'messages', 'template' and 'document' exclude each other (2 given)");
    expect_job_error(&o,
                     "{\"template\": \"summarize\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                     " \"vars\": {\"document\": \"x\"}}",
                     "exclude each other");
    expect_job_error(&o, "{\"prompt\": \"x\", \"vars\": {\"document\": \"x\"}}",
                     "field 'vars': only used with 'template'");
    expect_job_error(&o, "{\"template\": \"summarize\", \"vars\": [\"x\"]}",
                     "field 'vars': expected an object");
    expect_job_error(&o, "{\"template\": 3}", "field 'template': expected the name of a template");
    expect_job_error(&o, "{\"template\": \"spaces\", \"vars\": {}}",
                     "template 'spaces': placeholder at byte 0");
    expect_job_error(&o, "{\"template\": \"empty\", \"vars\": {\"x\": \"\"}}",
                     "template 'empty' rendered an empty prompt");
    struct job_opts none = job_opts_default();
    expect_job_error(&none, "{\"template\": \"summarize\", \"vars\": {\"document\": \"x\"}}",
                     "field 'template': templates are not configured");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render), cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_check),  cmocka_unit_test_setup_teardown(test_config_load, setup, teardown),
        cmocka_unit_test(test_jobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
