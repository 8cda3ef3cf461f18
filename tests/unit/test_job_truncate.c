/* A job's "truncate" (worker/jobs/truncate.h): the field in both forms, the budget, and job_prepare
 * cutting prompt text, token ids, messages and template jobs with the real Qwen3 and Llama-3.1
 * tokenizers and Qwen3's chat template (from the build's assets). Every cut is checked against an
 * independent reading: the kept ids are slices of the full tokenization, a cut chat prompt decodes
 * to the template's text around a prefix, suffix or both of the original content, in whole UTF-8
 * characters, and its ids are that text's own tokenization. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "engine/util/buf.h"
#include "testutil.h"
#include "worker/jobs/job.h"
#include "worker/jobs/result.h"
#include "worker/jobs/truncate.h"

static const char *find_template(void *ctx, const char *name)
{
    (void)ctx;
    return !strcmp(name, "summary") ? "Summarize:\n{document}" : NULL;
}

static int parse(const char *line, struct job *j, char *err, size_t errlen)
{
    struct job_opts o = job_opts_default();
    o.template_find = find_template;
    return job_parse(line, strlen(line), &o, j, err, errlen);
}

static const char *const modes[3] = {"start", "end", "middle"};

/* ---- the field */

static void test_field(void **state)
{
    (void)state;
    struct job j;
    char err[512], line[512];
    for (int m = 0; m < 3; m++) {
        snprintf(line, sizeof line, "{\"prompt\": \"x\", \"truncate\": \"%s\"}", modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.truncate, JOB_TRUNCATE_START + m);
        assert_string_equal(trunc_mode_name(j.truncate), modes[m]);
        json_t *p = job_params_json(&j);
        assert_string_equal(json_string_value(json_object_get(p, "truncate")), modes[m]);
        json_decref(p);
        job_free(&j);
        /* in OpenAI bodies, as llmq's other extensions */
        snprintf(line, sizeof line,
                 "{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
                 "[{\"role\": \"user\", \"content\": \"x\"}], \"truncate\": \"%s\"}}",
                 modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.truncate, JOB_TRUNCATE_START + m);
        job_free(&j);
        snprintf(line, sizeof line,
                 "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2], "
                 "\"truncate\": \"%s\"}}",
                 modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.truncate, JOB_TRUNCATE_START + m);
        job_free(&j);
    }
    /* absent and null: no truncation, nothing in the params */
    assert_int_equal(parse("{\"prompt\": \"x\", \"truncate\": null}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.truncate, JOB_TRUNCATE_NONE);
    json_t *p = job_params_json(&j);
    assert_null(json_object_get(p, "truncate"));
    json_decref(p);
    job_free(&j);
    /* wrong values name the field and the allowed values */
    static const struct {
        const char *line, *msg;
    } bad[] = {
        {"{\"prompt\": \"x\", \"truncate\": \"left\"}",
         "field 'truncate': expected \"start\", \"end\" or \"middle\", got \"left\""},
        {"{\"prompt\": \"x\", \"truncate\": true}",
         "field 'truncate': expected \"start\", \"end\" or \"middle\", got true"},
        {"{\"prompt\": \"x\", \"truncate\": \"\"}", "field 'truncate': expected"},
        {"{\"prompt\": \"x\", \"truncate\": \"Start\"}", "got \"Start\""},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"truncate\": "
         "3}}",
         "field 'body.truncate': expected \"start\", \"end\" or \"middle\", got 3"},
        {"{\"prompt\": \"x\", \"truncated\": \"end\"}",
         "unknown field 'truncated' (did you mean 'truncate'?)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(bad[i].line, &j, err, sizeof err), JOB_ERR_INVALID);
        if (!strstr(err, bad[i].msg))
            fail_msg("%s: got '%s', want '%s'", bad[i].line, err, bad[i].msg);
        job_free(&j);
    }
    assert_int_equal(trunc_mode_of("middle"), JOB_TRUNCATE_MIDDLE);
    assert_int_equal(trunc_mode_of("none"), JOB_TRUNCATE_NONE);
    assert_null(trunc_mode_name(JOB_TRUNCATE_NONE));
}

/* The budget: an explicit max_tokens is kept whole; a default one at most half the context. */
static void test_budget(void **state)
{
    (void)state;
    struct job j;
    char err[256];
    assert_int_equal(
        parse("{\"prompt\": \"x\", \"truncate\": \"end\", \"max_tokens\": 10}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(trunc_budget(&j, 64), 54);
    assert_int_equal(trunc_budget(&j, 10), 0);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"x\", \"truncate\": \"end\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.max_tokens, 256); /* the built-in default */
    assert_int_equal(trunc_budget(&j, 64), 32);
    assert_int_equal(trunc_budget(&j, 4096), 4096 - 256);
    assert_int_equal(trunc_budget(&j, 1), 0); /* at least 1 for the output */
    assert_int_equal(trunc_budget(&j, 3), 2);
    job_free(&j);
}

/* trunc_ids on 1..10 with one head and one tail id kept, to 6 ids. */
static void test_ids(void **state)
{
    (void)state;
    static const int32_t want[3][6] = {{1, 6, 7, 8, 9, 10}, {1, 2, 3, 4, 5, 10}, {1, 2, 3, 8, 9, 10}};
    for (int m = 0; m < 3; m++) {
        int32_t ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        size_t n = 10;
        assert_int_equal(trunc_ids(ids, &n, 1, 1, 6, JOB_TRUNCATE_START + m), 4);
        assert_int_equal(n, 6);
        assert_memory_equal(ids, want[m], sizeof want[m]);
    }
    int32_t ids[5] = {1, 2, 3, 4, 5};
    size_t n = 5;
    assert_int_equal(trunc_ids(ids, &n, 0, 0, 5, JOB_TRUNCATE_START), 0);  /* fits */
    assert_int_equal(trunc_ids(ids, &n, 2, 2, 3, JOB_TRUNCATE_START), -1); /* the kept ends alone are over */
    assert_int_equal(n, 5);
    assert_int_equal(trunc_ids(ids, &n, 0, 0, 3, JOB_TRUNCATE_MIDDLE), 2); /* odd: the front gets 2 */
    static const int32_t mid[3] = {1, 2, 5};
    assert_memory_equal(ids, mid, sizeof mid);
}

/* ---- job_prepare with real tokenizers */

static struct tok *load_tok(const char *name)
{
    char err[512];
    struct tok *t = tok_load_dir(test_asset(name), err, sizeof err);
    if (!t)
        fail_msg("%s: %s", name, err);
    return t;
}

static int32_t *encode(const struct tok *t, const char *s, bool add_special, size_t *n)
{
    int32_t *ids;
    char err[256];
    if (tok_encode_ex(t, s, strlen(s), add_special, &ids, n, err, sizeof err))
        fail_msg("encode: %s", err);
    return ids;
}

/* n numbered copies of fmt (with one %d), so that no part of the text repeats another. */
static char *numbered(const char *fmt, int n)
{
    struct buf b = {0};
    for (int i = 1; i <= n; i++)
        buf_printf(&b, fmt, i);
    return buf_take(&b);
}

static const char *const english = "Sentence %d: the quick brown fox jumps over the lazy dog. ";

/* A prompt's ids: the tokenizer's, sliced. Without truncate the job fails and says how to fix it. */
static void test_prompt_text(void **state)
{
    (void)state;
    struct tok *t = load_tok("qwen3-tokenizer");
    assert_non_null(t);
    char *text = numbered(english, 12), line[4096], err[1024];
    size_t n;
    int32_t *full = encode(t, text, true, &n);
    assert_true(n > 100);
    struct job j;
    struct job_input in;
    snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"max_tokens\": 10}", text);
    assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, NULL, (int)n + 5, &in, err, sizeof err), JOB_ERR_CONTEXT);
    assert_non_null(strstr(err, "at most 5 tokens can be generated (lower max_tokens, or set \"truncate\""));
    assert_non_null(strstr(err, "\"document\" with \"summarize\""));
    job_input_free(&in);
    assert_int_equal(job_prepare(&j, t, NULL, (int)n, &in, err, sizeof err), JOB_ERR_CONTEXT);
    assert_non_null(
        strstr(err, "leaves no room to generate (set \"truncate\" to \"start\", \"end\" or \"middle\""));
    job_input_free(&in);
    job_free(&j);
    for (int m = 0; m < 3; m++) {
        /* explicit max_tokens: the prompt gets 60 - 10 */
        snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"max_tokens\": 10, \"truncate\": \"%s\"}", text,
                 modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, t, NULL, 60, &in, err, sizeof err), JOB_OK);
        assert_int_equal(in.n_tokens, 50);
        assert_int_equal(in.req.n_prompt, 50);
        assert_ptr_equal(in.req.prompt, in.tokens);
        assert_int_equal(in.req.max_tokens, 10);
        assert_int_equal(in.truncated_tokens, (int)n - 50);
        size_t front = m == 0 ? 0 : m == 1 ? 50 : 25;
        assert_memory_equal(in.tokens, full, front * sizeof(int32_t));
        assert_memory_equal(in.tokens + front, full + n - (50 - front), (50 - front) * sizeof(int32_t));
        job_input_free(&in);
        /* a context that holds it: nothing is cut, nothing counted */
        assert_int_equal(job_prepare(&j, t, NULL, (int)n + 10, &in, err, sizeof err), JOB_OK);
        assert_int_equal(in.n_tokens, (int)n);
        assert_int_equal(in.truncated_tokens, 0);
        job_input_free(&in);
        /* max_tokens that leaves no prompt */
        assert_int_equal(job_prepare(&j, t, NULL, 10, &in, err, sizeof err), JOB_ERR_CONTEXT);
        assert_non_null(strstr(err, "no room is left for a prompt"));
        job_input_free(&in);
        job_free(&j);
        /* the default max_tokens (256): half of a 64-token context is kept for it */
        snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"truncate\": \"%s\"}", text, modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, t, NULL, 64, &in, err, sizeof err), JOB_OK);
        assert_int_equal(in.n_tokens, 32);
        assert_int_equal(in.req.max_tokens, 32);
        assert_int_equal(in.truncated_tokens, (int)n - 32);
        job_input_free(&in);
        job_free(&j);
    }
    free(full);
    free(text);
    tok_free(t);
}

/* Llama-3.1's post-processor adds a BOS: it stays first, and a BOS id given in a token-id prompt
 * too. Qwen3 adds none: its ids are cut as they are. */
static void test_bos_and_ids(void **state)
{
    (void)state;
    struct tok *t = load_tok("llama3_1-tokenizer");
    assert_non_null(t);
    int32_t bos = tok_bos_id(t);
    assert_int_equal(bos, 128000);
    char *text = numbered(english, 8), line[4096], err[1024];
    size_t n, nb;
    int32_t *full = encode(t, text, true, &n), *body = encode(t, text, false, &nb);
    assert_int_equal(full[0], bos);
    assert_int_equal(nb, n - 1);
    struct job j;
    struct job_input in;
    for (int m = 0; m < 3; m++) {
        snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"max_tokens\": 20, \"truncate\": \"%s\"}", text,
                 modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, t, NULL, 41, &in, err, sizeof err), JOB_OK);
        assert_int_equal(in.n_tokens, 21);
        assert_int_equal(in.tokens[0], bos);
        assert_int_equal(in.truncated_tokens, (int)n - 21);
        size_t front = m == 0 ? 0 : m == 1 ? 20 : 10;
        assert_memory_equal(in.tokens + 1, body, front * sizeof(int32_t));
        assert_memory_equal(in.tokens + 1 + front, body + nb - (20 - front), (20 - front) * sizeof(int32_t));
        job_input_free(&in);
        job_free(&j);
    }
    /* token ids: 128000, 1 .. 99; the BOS stays first */
    struct buf b = {0};
    buf_printf(&b,
               "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"max_tokens\": 5, "
               "\"truncate\": \"start\", \"prompt\": [%d",
               bos);
    for (int i = 1; i < 100; i++)
        buf_printf(&b, ", %d", i);
    buf_puts(&b, "]}}");
    assert_int_equal(parse(b.p, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, NULL, 15, &in, err, sizeof err), JOB_OK);
    static const int32_t want[10] = {128000, 91, 92, 93, 94, 95, 96, 97, 98, 99};
    assert_int_equal(in.n_tokens, 10);
    assert_memory_equal(in.tokens, want, sizeof want);
    assert_int_equal(in.truncated_tokens, 90);
    job_input_free(&in);
    job_free(&j);
    buf_free(&b);
    tok_free(t);
    /* Qwen3 has no BOS: the same ids lose their first one too */
    t = load_tok("qwen3-tokenizer");
    assert_non_null(t);
    assert_int_equal(
        parse("{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"max_tokens\": 2, "
              "\"truncate\": \"end\", \"prompt\": [7, 8, 9, 10, 11]}}",
              &j, err, sizeof err),
        JOB_OK);
    assert_int_equal(job_prepare(&j, t, NULL, 5, &in, err, sizeof err), JOB_OK);
    static const int32_t want_q[3] = {7, 8, 9};
    assert_int_equal(in.n_tokens, 3);
    assert_memory_equal(in.tokens, want_q, sizeof want_q);
    assert_int_equal(in.truncated_tokens, 2);
    job_input_free(&in);
    job_free(&j);
    free(full);
    free(body);
    free(text);
    tok_free(t);
}

/* ---- messages and templates (Qwen3's chat template) */

struct qwen {
    struct tok *t;
    struct chat_template *ct;
};

static struct qwen qwen_load(void)
{
    struct qwen q;
    char err[512];
    const char *dir = test_asset("qwen3-tokenizer");
    q.t = tok_load_dir(dir, err, sizeof err);
    if (!q.t)
        fail_msg("Qwen3 tokenizer: %s", err);
    q.ct = chat_template_load(dir, NULL, err, sizeof err);
    if (!q.ct)
        fail_msg("Qwen3 chat template: %s", err);
    return q;
}

static void qwen_free(struct qwen *q)
{
    tok_free(q->t);
    chat_template_free(q->ct);
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static size_t common_suffix(const char *a, size_t na, const char *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[na - 1 - i] == b[nb - 1 - i])
        i++;
    return i;
}

/* in holds the prompt `before` + kept + `after`, kept cut from content by mode in whole UTF-8
 * characters, in at most budget ids that are the tokenization of that text; returns kept's length. */
static size_t check_chat_cut(const struct tok *t, const struct job_input *in, const char *before,
                             const char *content, const char *after, int mode, int budget)
{
    char *text, err[256];
    size_t len;
    assert_true(in->n_tokens <= budget);
    assert_int_equal(tok_decode(t, in->tokens, (size_t)in->n_tokens, false, &text, &len, err, sizeof err), 0);
    size_t nb = strlen(before), na = strlen(after), nc = strlen(content);
    if (len < nb + na || memcmp(text, before, nb) || memcmp(text + len - na, after, na))
        fail_msg("the template's text is not intact: %s", text);
    const char *kept = text + nb;
    size_t nk = len - nb - na;
    json_t *valid = json_stringn(kept, nk); /* NULL for invalid UTF-8 */
    if (!valid || strstr(text, "\xEF\xBF\xBD"))
        fail_msg("the kept text is not whole UTF-8 characters: %.*s", (int)nk, kept);
    json_decref(valid);
    assert_true(nk < nc);
    size_t pre = common_prefix(kept, nk, content, nc), suf = common_suffix(kept, nk, content, nc);
    if (mode == 0 && suf != nk)
        fail_msg("start: the kept text is not the content's end: %.*s", (int)nk, kept);
    if (mode == 1 && pre != nk)
        fail_msg("end: the kept text is not the content's beginning: %.*s", (int)nk, kept);
    if (mode == 2 && (pre + suf < nk || pre == 0 || suf == 0))
        fail_msg("middle: the kept text is not the content's beginning and end: %.*s", (int)nk, kept);
    size_t n;
    int32_t *ids = encode(t, text, false, &n);
    assert_int_equal(n, (size_t)in->n_tokens);
    assert_memory_equal(ids, in->tokens, n * sizeof(int32_t));
    free(ids);
    free(text);
    return nk;
}

static const char *const qwen_before = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n";
static const char *const qwen_after = "<|im_end|>\n<|im_start|>assistant\n";

static void test_messages(void **state)
{
    (void)state;
    struct qwen q = qwen_load();
    char *content = numbered(english, 12), line[4096], err[1024];
    struct job j;
    struct job_input in;
    snprintf(line, sizeof line,
             "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
             "\"content\": \"%s\"}], \"max_tokens\": 16}",
             content);
    assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, q.t, q.ct, 4096, &in, err, sizeof err), JOB_OK);
    int full = in.n_tokens;
    job_input_free(&in);
    assert_int_equal(job_prepare(&j, q.t, q.ct, 80, &in, err, sizeof err), JOB_ERR_CONTEXT);
    assert_non_null(strstr(err, "\"summarize\""));
    job_input_free(&in);
    job_free(&j);
    for (int m = 0; m < 3; m++) {
        snprintf(line, sizeof line,
                 "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                 "\"content\": \"%s\"}], \"max_tokens\": 16, \"truncate\": \"%s\"}",
                 content, modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, q.t, q.ct, 80, &in, err, sizeof err), JOB_OK);
        check_chat_cut(q.t, &in, qwen_before, content, qwen_after, m, 64);
        assert_true(in.n_tokens >= 64 - 3); /* cut to the budget, give or take a merge at the cut */
        assert_int_equal(in.truncated_tokens, full - in.n_tokens);
        assert_int_equal(in.req.max_tokens, 16);
        job_input_free(&in);
        /* the same in an OpenAI chat line, with the content as text parts: the longest part is cut */
        snprintf(
            line, sizeof line,
            "{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
            "\"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": [{\"type\": "
            "\"text\", \"text\": \"%s\"}]}], \"max_completion_tokens\": 16, \"truncate\": \"%s\"}}",
            content, modes[m]);
        job_free(&j);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, q.t, q.ct, 80, &in, err, sizeof err), JOB_OK);
        check_chat_cut(q.t, &in, qwen_before, content, qwen_after, m, 64);
        assert_true(in.truncated_tokens > 0);
        job_input_free(&in);
        job_free(&j);
    }
    free(content);
    qwen_free(&q);
}

/* Chinese and characters of four bytes, which Qwen3 splits over several tokens: every cut, at
 * every budget, keeps whole characters. */
static void test_messages_utf8(void **state)
{
    (void)state;
    struct qwen q = qwen_load();
    char *content = numbered("第%d句：春眠不觉晓，𠀀𠀁𠀂处处闻啼鸟🙂鱻龘。", 20),
         line[8192], err[1024];
    /* the content's own tokens do end inside characters (else this test would prove nothing) */
    size_t n, off = 0, inside = 0;
    int32_t *ids = encode(q.t, content, false, &n);
    for (size_t i = 0; i + 1 < n; i++) {
        size_t len;
        tok_token_bytes(q.t, ids[i], &len);
        off += len;
        inside += ((unsigned char)content[off] & 0xC0) == 0x80;
    }
    assert_true(inside > 20);
    free(ids);
    struct job j;
    struct job_input in;
    for (int m = 0; m < 3; m++) {
        snprintf(line, sizeof line,
                 "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                 "\"content\": \"%s\"}], \"max_tokens\": 8, \"truncate\": \"%s\"}",
                 content, modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        for (int budget = 40; budget < 60; budget++) {
            assert_int_equal(job_prepare(&j, q.t, q.ct, budget + 8, &in, err, sizeof err), JOB_OK);
            check_chat_cut(q.t, &in, qwen_before, content, qwen_after, m, budget);
            assert_true(in.truncated_tokens > 0);
            job_input_free(&in);
        }
        job_free(&j);
    }
    free(content);
    qwen_free(&q);
}

/* A template job is one user message: its rendered text is what is cut. */
static void test_template(void **state)
{
    (void)state;
    struct qwen q = qwen_load();
    char *doc = numbered(english, 10), line[4096], err[1024], content[4096];
    snprintf(content, sizeof content, "Summarize:\n%s", doc);
    const char *before = "<|im_start|>user\n";
    struct job j;
    struct job_input in;
    for (int m = 0; m < 3; m++) {
        snprintf(line, sizeof line,
                 "{\"template\": \"summary\", \"vars\": {\"document\": \"%s\"}, \"max_tokens\": 20, "
                 "\"truncate\": \"%s\"}",
                 doc, modes[m]);
        assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
        assert_int_equal(job_prepare(&j, q.t, q.ct, 70, &in, err, sizeof err), JOB_OK);
        size_t kept = check_chat_cut(q.t, &in, before, content, qwen_after, m, 50);
        assert_true(kept > 100);
        assert_true(in.truncated_tokens > 50);
        job_input_free(&in);
        job_free(&j);
    }
    free(doc);
    qwen_free(&q);
}

/* When even an empty content leaves the chat template's own tokens over the budget, the job fails
 * and says so; nothing else of the conversation is cut. */
static void test_messages_cannot_fit(void **state)
{
    (void)state;
    struct qwen q = qwen_load();
    struct buf b = {0};
    buf_puts(&b, "{\"max_tokens\": 10, \"truncate\": \"start\", \"messages\": [");
    for (int i = 0; i < 30; i++)
        buf_printf(&b, "{\"role\": \"%s\", \"content\": \"turn %d\"}, ", i % 2 ? "assistant" : "user", i);
    buf_puts(&b, "{\"role\": \"user\", \"content\": \"a longer question than the others, to be cut\"}]}");
    struct job j;
    struct job_input in;
    char err[1024];
    assert_int_equal(parse(b.p, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, q.t, q.ct, 100, &in, err, sizeof err), JOB_ERR_CONTEXT);
    if (!strstr(
            err,
            "even with messages[30].content (the longest text) emptied by \"truncate\", the prompt has") ||
        !strstr(err, "over the 90 that max_model_len (100) leaves beside the output"))
        fail_msg("unclear: %s", err);
    job_input_free(&in);
    job_free(&j);
    buf_free(&b);
    qwen_free(&q);
}

/* ---- the count in the results */

static void test_result_usage(void **state)
{
    (void)state;
    static const char *const lines[] = {
        "{\"id\": \"a\", \"prompt\": \"x\", \"truncate\": \"start\"}",
        "{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"truncate\": \"end\"}}",
        "{\"custom_id\": \"d\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"truncate\": "
        "\"middle\"}}",
        "{\"id\": \"b\", \"prompt\": \"x\"}",
    };
    struct res_output o = {.finish = FINISH_STOP,
                           .text = "ok",
                           .text_len = 2,
                           .prompt_tokens = 5,
                           .completion_tokens = 2,
                           .truncated_tokens = 7};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        struct job j;
        char err[256];
        assert_int_equal(parse(lines[i], &j, err, sizeof err), JOB_OK);
        char *line = res_line(&j, &o, NULL, NULL);
        json_t *r = json_loads(line, 0, NULL);
        json_t *usage =
            j.form == JOB_FORM_LLMQ
                ? json_object_get(r, "usage")
                : json_object_get(json_object_get(json_object_get(r, "response"), "body"), "usage");
        assert_non_null(usage);
        json_t *tt = json_object_get(usage, "truncated_tokens");
        if (j.truncate) {
            assert_int_equal(json_integer_value(tt), 7);
            assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 5);
        } else {
            assert_null(tt);
        }
        json_decref(r);
        free(line);
        job_free(&j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_field),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_prompt_text),
        cmocka_unit_test(test_bos_and_ids),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_messages_utf8),
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_messages_cannot_fit),
        cmocka_unit_test(test_result_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
