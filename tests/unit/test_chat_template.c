/* engine/chat_template: where a model's template is found (tokenizer_config.json's string or list
 * form, chat_template.jinja, an override file), the variables it gets, its errors, and fidelity:
 * the real templates of five tokenizer packages rendered over tests/fixtures/chat/conversations.json
 * against transformers' apply_chat_template (tests/fixtures/chat/<model>_chat.jsonl, made by
 * make_goldens.py): byte-identical text, identical ids, the same raise_exception message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "testutil.h"

/* ---- helpers */

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/llmq-test-chat-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    return test_remove_tree(dir);
}

static void put(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void drop(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

/* tokenizer_config.json with the given "chat_template" JSON value (NULL: none) and special tokens. */
static void put_config(const char *template_json)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\", \"lstrip\": false}, "
             "\"eos_token\": \"</s>\", \"pad_token\": null, \"model_max_length\": "
             "1000000000000000019884624838656%s%s}",
             template_json ? ", \"chat_template\": " : "", template_json ? template_json : "");
    put("tokenizer_config.json", text);
}

static struct chat_template *load(const char *override)
{
    char err[512] = "";
    struct chat_template *ct = chat_template_load(dir, override, err, sizeof err);
    if (!ct)
        fail_msg("chat_template_load: %s", err);
    return ct;
}

/* Renders `messages` (JSON text) with tools/kwargs (JSON text or NULL); returns rc, text in out. */
static int render(const struct chat_template *ct, const char *messages, const char *tools, const char *kwargs,
                  bool agp, bool as_given, char **out, char *err, size_t errlen)
{
    json_t *m = json_loads(messages, 0, NULL), *t = tools ? json_loads(tools, 0, NULL) : NULL,
           *k = kwargs ? json_loads(kwargs, 0, NULL) : NULL;
    assert_non_null(m);
    struct chat_input in = {
        .messages = m, .tools = t, .kwargs = k, .add_generation_prompt = agp, .parts_as_given = as_given};
    size_t len = 0;
    int rc = chat_template_render(ct, &in, out, &len, err, errlen);
    if (rc == CHAT_OK)
        assert_int_equal(strlen(*out), len);
    else
        assert_null(*out);
    json_decref(m);
    json_decref(t);
    json_decref(k);
    return rc;
}

/* Renders and expects `want` exactly. */
static void expect(const struct chat_template *ct, const char *messages, const char *tools,
                   const char *kwargs, bool agp, bool as_given, const char *want)
{
    char *out = NULL, err[1024] = "";
    int rc = render(ct, messages, tools, kwargs, agp, as_given, &out, err, sizeof err);
    if (rc != CHAT_OK)
        fail_msg("render failed (%d): %s", rc, err);
    if (strcmp(out, want))
        fail_msg("rendered \"%s\", expected \"%s\"", out, want);
    free(out);
}

#define USER "[{\"role\": \"user\", \"content\": \"hi\"}]"
#define TOOLS "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]"

/* ---- where the template comes from */

static void test_config_string(void **state)
{
    put_config("\"{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{% for m in messages %}"
               "{{ m.role }}:{{ m.content }}{% endfor %}\"");
    struct chat_template *ct = load(NULL);
    assert_true(chat_template_present(ct));
    assert_string_equal(chat_template_origin(ct), "tokenizer_config.json");
    /* an AddedToken's content; a null pad_token is not passed (transformers' special_tokens_map) */
    expect(ct, USER, NULL, NULL, true, false, "<s>|</s>|False|user:hi");
    /* chat_template_kwargs may replace a special token */
    expect(ct, USER, NULL, "{\"bos_token\": \"B\"}", true, false, "B|</s>|False|user:hi");
    chat_template_free(ct);
}

static void test_config_list(void **state)
{
    put_config("[{\"name\": \"default\", \"template\": \"D{{ tools is none }}\"}, "
               "{\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}, "
               "{\"name\": \"rag\", \"template\": \"R\"}]");
    struct chat_template *ct = load(NULL);
    expect(ct, USER, NULL, NULL, true, false, "DTrue");
    expect(ct, USER, TOOLS, NULL, true, false, "T1"); /* tools given and the list has tool_use */
    chat_template_free(ct);

    put_config("[{\"name\": \"default\", \"template\": \"D\"}]");
    ct = load(NULL);
    expect(ct, USER, TOOLS, NULL, true, false, "D"); /* no tool_use: the default */
    chat_template_free(ct);

    put_config("[{\"name\": \"rag\", \"template\": \"R\"}, {\"name\": \"tool_use\", \"template\": \"T\"}]");
    ct = load(NULL);
    char *out = NULL, err[512] = "";
    assert_int_equal(render(ct, USER, NULL, NULL, true, false, &out, err, sizeof err), CHAT_ERROR);
    assert_string_equal(err, "the model's chat templates (rag, tool_use) have none named \"default\"");
    expect(ct, USER, TOOLS, NULL, true, false, "T");
    chat_template_free(ct);

    put_config("[{\"name\": \"default\"}]");
    assert_null(chat_template_load(dir, NULL, err, sizeof err));
    assert_non_null(strstr(err, "\"chat_template\"[0]: expected {\"name\": string, \"template\": string}"));
}

static void test_jinja_file_and_override(void **state)
{
    put_config("\"config\"");
    put("chat_template.jinja", "file {{ messages[0].content }}");
    struct chat_template *ct = load(NULL);
    /* transformers lets chat_template.jinja replace the config's template */
    assert_string_equal(chat_template_origin(ct), "chat_template.jinja");
    expect(ct, USER, NULL, NULL, true, false, "file hi");
    chat_template_free(ct);

    char path[256];
    snprintf(path, sizeof path, "%s/mine.jinja", dir);
    put("mine.jinja", "mine {{ eos_token }}");
    ct = load(path); /* the override wins over both; the special tokens still come from the config */
    assert_string_equal(chat_template_origin(ct), path);
    expect(ct, USER, NULL, NULL, true, false, "mine </s>");
    chat_template_free(ct);

    char err[512] = "";
    snprintf(path, sizeof path, "%s/missing.jinja", dir);
    assert_null(chat_template_load(dir, path, err, sizeof err));
    assert_non_null(strstr(err, "cannot read"));
    assert_non_null(strstr(err, "missing.jinja"));

    drop("chat_template.jinja");
    ct = load(""); /* "" is no override */
    expect(ct, USER, NULL, NULL, true, false, "config");
    chat_template_free(ct);
}

static void test_no_template(void **state)
{
    put_config(NULL);
    struct chat_template *ct = load(NULL);
    assert_false(chat_template_present(ct));
    assert_string_equal(chat_template_origin(ct), "none");
    char *out = NULL, err[512] = "";
    assert_int_equal(render(ct, USER, NULL, NULL, true, false, &out, err, sizeof err), CHAT_NONE);
    assert_string_equal(err, "the model has no chat template (no chat_template in tokenizer_config.json, no "
                             "chat_template.jinja): send a prompt, or set model.chat_template");
    chat_template_free(ct);
    drop("tokenizer_config.json"); /* a folder without tokenizer_config.json at all */
    ct = load(NULL);
    assert_false(chat_template_present(ct));
    chat_template_free(ct);
}

static void test_parse_error(void **state)
{
    char err[512] = "";
    put_config("\"ok\\n{{ messages | wordcount }}\"");
    assert_null(chat_template_load(dir, NULL, err, sizeof err));
    if (!strstr(err, "chat_template") || !strstr(err, "line 2") || !strstr(err, "wordcount"))
        fail_msg("error \"%s\" does not name the template, the line and the construct", err);
    put_config("\"{{ raise_exception('x') }}\"");
    put("bad.jinja", "{% for m in messages %}\n\n{% frobnicate %}{% endfor %}");
    char path[256];
    snprintf(path, sizeof path, "%s/bad.jinja", dir);
    assert_null(chat_template_load(dir, path, err, sizeof err));
    if (!strstr(err, "bad.jinja") || !strstr(err, "line 3"))
        fail_msg("error \"%s\" does not name the file and the line", err);
}

/* ---- what a render gets */

static void test_variables(void **state)
{
    put_config("\"{{ tools is none }}/{{ documents is none }}/{{ add_generation_prompt }}/"
               "{{ enable_thinking is defined }}/{{ custom | default('-') }}\"");
    struct chat_template *ct = load(NULL);
    expect(ct, USER, NULL, NULL, false, false, "True/True/False/False/-");
    expect(ct, USER, TOOLS, "{\"enable_thinking\": false, \"custom\": [1, 2]}", true, false,
           "False/True/True/True/[1, 2]");
    chat_template_free(ct);
}

static void test_raise(void **state)
{
    put_config("\"{% if messages[0].role != 'system' %}{{ raise_exception('first: ' ~ messages[0].role) }}"
               "{% endif %}ok\"");
    struct chat_template *ct = load(NULL);
    char *out = NULL, err[512] = "";
    assert_int_equal(render(ct, USER, NULL, NULL, true, false, &out, err, sizeof err), CHAT_RAISED);
    assert_string_equal(err, "first: user"); /* the template's message, exactly */
    expect(ct, "[{\"role\": \"system\", \"content\": \"s\"}]", NULL, NULL, true, false, "ok");
    chat_template_free(ct);
}

static void test_content_parts(void **state)
{
    const char *parts = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                        "{\"type\": \"text\", \"text\": \"b\"}]}]";
    /* a template that takes content as a string: the worker joins the parts' texts with "\n" (as
     * vLLM does); as transformers does, the list is passed as given */
    put_config("\"{{ messages[0].content is string }}:{{ messages[0]['content'] | length }}\"");
    struct chat_template *ct = load(NULL);
    expect(ct, parts, NULL, NULL, true, false, "True:3");
    expect(ct, parts, NULL, NULL, true, true, "False:2");
    chat_template_free(ct);
    /* a template that loops over content gets the list */
    put_config(
        "\"{% for m in messages %}{% for p in m['content'] %}<{{ p.text }}>{% endfor %}{% endfor %}\"");
    ct = load(NULL);
    expect(ct, parts, NULL, NULL, true, false, "<a><b>");
    chat_template_free(ct);
}

/* ---- fidelity: transformers' renders of the real templates */

static const char *const models[] = {"qwen3", "llama3", "llama3_1", "deepseek_v3", "gemma3"};

static void report_mismatch(const char *model, const char *name, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    print_error("%s / %s: text differs at byte %zu\n  got:  \"%.80s\"\n  want: \"%.80s\"\n", model, name, i,
                got + from, want + from);
}

static void test_fidelity(void **state)
{
    json_error_t je;
    json_t *cases = json_load_file(test_source("tests/fixtures/chat/conversations.json"), 0, &je);
    if (!json_is_array(cases))
        fail_msg("tests/fixtures/chat/conversations.json: %s", je.text);
    size_t compared = 0, raised = 0, failures = 0, ids_compared = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char rel[128], err[1024] = "";
        snprintf(rel, sizeof rel, "%s-tokenizer/tokenizer_config.json", models[mi]);
        char tdir[4096];
        snprintf(tdir, sizeof tdir, "%s", test_asset(rel));
        *strrchr(tdir, '/') = 0;
        struct chat_template *ct = chat_template_load(tdir, NULL, err, sizeof err);
        if (!ct)
            fail_msg("%s: %s", models[mi], err);
        struct tok *tok = tok_load_dir(tdir, err, sizeof err);
        if (!tok) /* the text is still compared */
            printf("%s: ids not compared, the tokenizer does not load here: %s\n", models[mi], err);
        char golden[128];
        snprintf(golden, sizeof golden, "tests/fixtures/chat/%s_chat.jsonl", models[mi]);
        FILE *f = fopen(test_source(golden), "r");
        if (!f)
            fail_msg("%s is missing: run tests/fixtures/chat/make_goldens.py", golden);
        char *line = NULL;
        size_t cap = 0, k = 0;
        for (; getline(&line, &cap, f) > 0; k++) {
            json_t *g = json_loads(line, 0, &je), *c = json_array_get(cases, k);
            if (!g || !c)
                fail_msg("%s line %zu: %s", golden, k + 1,
                         g ? "more lines than conversations.json" : je.text);
            const char *name = json_string_value(json_object_get(c, "name"));
            if (!name || strcmp(name, json_string_value(json_object_get(g, "name"))))
                fail_msg("%s line %zu: not the case %s of conversations.json: regenerate it", golden, k + 1,
                         name ? name : "?");
            json_t *tools = json_object_get(c, "tools"), *docs = json_object_get(c, "documents");
            json_t *kw = json_object_get(c, "chat_template_kwargs");
            struct chat_input in = {.messages = json_object_get(c, "messages"),
                                    .tools = json_is_null(tools) ? NULL : tools,
                                    .documents = json_is_null(docs) ? NULL : docs,
                                    .kwargs = kw,
                                    .add_generation_prompt =
                                        json_is_true(json_object_get(c, "add_generation_prompt")),
                                    .parts_as_given = true};
            char *out = NULL;
            size_t len = 0;
            int rc = chat_template_render(ct, &in, &out, &len, err, sizeof err);
            json_t *want_text = json_object_get(g, "text"), *gerr = json_object_get(g, "error");
            compared++;
            if (want_text) {
                if (rc != CHAT_OK) {
                    print_error("%s / %s: render failed (%d): %s\n", models[mi], name, rc, err);
                    failures++;
                } else if (len != json_string_length(want_text) ||
                           memcmp(out, json_string_value(want_text), len)) {
                    report_mismatch(models[mi], name, out, json_string_value(want_text));
                    failures++;
                } else if (tok) {
                    int32_t *ids = NULL;
                    size_t n = 0;
                    /* "tk_ids": where Hugging Face tokenizers (the library vLLM and transformers 4
                     * encode with) disagrees with transformers 5, whose LlamaTokenizer replaces a
                     * byte-level tokenizer.json's pre-tokenizer with Metaspace (DeepSeek-V3 declares
                     * LlamaTokenizerFast; transformers issue 45488): tokenizers is the reference */
                    json_t *want_ids = json_object_get(g, "tk_ids");
                    if (!want_ids)
                        want_ids = json_object_get(g, "ids");
                    bool same = tok_encode_ex(tok, out, len, false, &ids, &n, err, sizeof err) == 0 &&
                                n == json_array_size(want_ids);
                    for (size_t i = 0; same && i < n; i++)
                        same = ids[i] == json_integer_value(json_array_get(want_ids, i));
                    if (!same) {
                        print_error("%s / %s: ids differ (%zu ids, %zu expected)\n", models[mi], name, n,
                                    json_array_size(want_ids));
                        failures++;
                    }
                    ids_compared++;
                    free(ids);
                }
            } else {
                const char *type = json_string_value(json_object_get(gerr, "type"));
                const char *msg = json_string_value(json_object_get(gerr, "message"));
                raised++;
                if (type && !strcmp(type, "TemplateError")) { /* raise_exception: the same message */
                    if (rc != CHAT_RAISED || strcmp(err, msg)) {
                        print_error("%s / %s: expected the raise \"%s\", got %d \"%s\"\n", models[mi], name,
                                    msg, rc, rc == CHAT_OK ? out : err);
                        failures++;
                    }
                } else if (rc == CHAT_OK) { /* a Python error (TypeError, ...): an error here too */
                    print_error("%s / %s: transformers failed (%s: %s) but this rendered \"%.60s\"\n",
                                models[mi], name, type ? type : "?", msg ? msg : "?", out);
                    failures++;
                }
            }
            free(out);
            json_decref(g);
        }
        if (k != json_array_size(cases))
            fail_msg("%s has %zu lines, conversations.json %zu cases: regenerate it", golden, k,
                     json_array_size(cases));
        free(line);
        fclose(f);
        tok_free(tok);
        chat_template_free(ct);
    }
    json_decref(cases);
    printf("%zu renders compared with transformers (%zu of them errors, %zu id lists), %zu differ\n",
           compared, raised, ids_compared, failures);
    assert_int_equal(failures, 0);
}

/* The Qwen3 renders of tests/fixtures/tokenizer/qwen3_chat.jsonl (transformers, thinking on/off). */
static void test_qwen3_renders(void **state)
{
    char tdir[4096], err[1024] = "";
    snprintf(tdir, sizeof tdir, "%s", test_asset("qwen3-tokenizer/tokenizer_config.json"));
    *strrchr(tdir, '/') = 0;
    struct chat_template *ct = chat_template_load(tdir, NULL, err, sizeof err);
    if (!ct)
        fail_msg("%s", err);
    FILE *f = fopen(test_source("tests/fixtures/tokenizer/qwen3_chat.jsonl"), "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0, n = 0, failures = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *g = json_loads(line, 0, NULL);
        assert_non_null(g);
        json_t *et = json_object_get(g, "enable_thinking"), *kw = json_object();
        if (json_is_boolean(et)) /* null: not passed */
            json_object_set(kw, "enable_thinking", et);
        struct chat_input in = {.messages = json_object_get(g, "messages"),
                                .kwargs = kw,
                                .add_generation_prompt =
                                    json_is_true(json_object_get(g, "add_generation_prompt"))};
        char *out = NULL;
        size_t len = 0;
        int rc = chat_template_render(ct, &in, &out, &len, err, sizeof err);
        const char *want = json_string_value(json_object_get(g, "text"));
        if (rc != CHAT_OK || strcmp(out, want)) {
            if (rc == CHAT_OK)
                report_mismatch("qwen3_chat.jsonl", "line", out, want);
            else
                print_error("line %zu: %s\n", n + 1, err);
            failures++;
        }
        free(out);
        json_decref(kw);
        json_decref(g);
        n++;
    }
    free(line);
    fclose(f);
    chat_template_free(ct);
    printf("%zu Qwen3 renders compared, %zu differ\n", n, failures);
    assert_true(n >= 40);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_config_string, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jinja_file_and_override, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_template, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_variables, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_content_parts, setup, teardown),
        cmocka_unit_test(test_qwen3_renders),
        cmocka_unit_test(test_fidelity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
