/* worker/jobs/summarize.c: a map-reduce summary job's plan and tree, driven by hand (no engine):
 * every part's request fits the context; with summaries of a known length the tree has exactly the
 * depth summary_depth predicts and every level groups consecutive parts; a second plan of the same
 * job given the first one's committed parts (sum_restore) runs only the rest and reaches the same
 * tree; another document is another plan; the sizes that cannot work fail with their reasons. With
 * the real Qwen3 tokenizer and chat template. */
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
#include "worker/jobs/summarize.h"
#include "worker/jobs/summary_tree.h"

#define MAX_MODEL_LEN 512

static struct tok *tok;
static struct chat_template *ct;

static int setup(void **state)
{
    char err[1024];
    const char *dir = test_asset("qwen3-tokenizer");
    tok = tok_load_dir(dir, err, sizeof err);
    if (!tok)
        fail_msg("Qwen3 tokenizer: %s", err);
    ct = chat_template_load(dir, NULL, err, sizeof err);
    if (!ct)
        fail_msg("Qwen3 chat template: %s", err);
    return 0;
}

static int teardown(void **state)
{
    chat_template_free(ct);
    tok_free(tok);
    return 0;
}

/* An English text of about n bytes in paragraphs (seeded). */
static char *document(size_t n, unsigned seed)
{
    static const char *const words[] = {"report", "budget", "council", "river",  "station", "energy",
                                        "market", "harbour", "school", "village", "engineer", "museum"};
    struct buf b = {0};
    while (b.len < n) {
        for (int s = 0; s < 4; s++) {
            for (int w = 0; w < 9; w++) {
                seed = seed * 1103515245u + 12345u;
                buf_printf(&b, "%s%s", w ? " " : "", words[(seed >> 16) % 12]);
            }
            buf_puts(&b, s < 3 ? ". " : ".");
        }
        buf_puts(&b, "\n\n");
    }
    return buf_take(&b);
}

static void parse(const char *doc, const char *options, int max_tokens, struct job *j)
{
    json_t *line = json_pack("{s:s, s:s, s:i, s:o}", "id", "d", "document", doc, "max_tokens", max_tokens,
                             "summarize", json_loads(options, 0, NULL));
    char *text = json_dumps(line, JSON_COMPACT), err[512];
    json_decref(line);
    struct job_opts o = job_opts_default();
    if (job_parse(text, strlen(text), &o, j, err, sizeof err))
        fail_msg("parse: %s", err);
    free(text);
}

/* A summary of exactly k tokens ("word word ..."). */
static char *summary(int k)
{
    struct buf b = {0};
    for (int i = 0; i < k; i++)
        buf_puts(&b, i ? " word" : "word");
    return buf_take(&b);
}

struct run {
    int parts_run;         /* parts handed out by sum_next */
    int level_parts[SUM_MAX_LEVELS];
    int depth;
};

/* Runs every part of s, each "generating" a summary of k tokens (the root's too), checking its
 * request; parts are committed level by level as the worker does. */
static void run_all(struct sum_job *s, int k, struct run *r)
{
    memset(r, 0, sizeof *r);
    char *text = summary(k), err[512];
    for (;;) {
        struct sum_part *got[4096];
        int n = 0;
        for (struct sum_part *p; (p = sum_next(s));) {
            struct job_input in;
            if (sum_prepare(s, p, &in, err, sizeof err))
                fail_msg("level %d part %d: %s", p->level, p->index, err);
            if (in.n_tokens + in.req.max_tokens > MAX_MODEL_LEN)
                fail_msg("level %d part %d: %d prompt + %d output tokens over %d", p->level, p->index, in.n_tokens,
                         in.req.max_tokens, MAX_MODEL_LEN);
            job_input_free(&in);
            got[n++] = p;
        }
        r->parts_run += n;
        if (n == 0)
            break;
        for (int i = 0; i < n; i++)
            assert_int_equal(sum_done(s, got[i], text, strlen(text), 100, k, FINISH_LENGTH), 0);
        if (sum_finished(s))
            break;
        for (int i = 0; i < n; i++)
            assert_int_equal(sum_committed(s, got[i], err, sizeof err), 0);
    }
    free(text);
    assert_true(sum_finished(s));
    struct sum_totals t;
    sum_get_totals(s, &t);
    r->depth = t.depth;
    for (int i = 0; i < sum_n_parts(s); i++)
        r->level_parts[sum_part_at(s, i)->level]++;
}

/* Each level's parts are in order from 0, and each level above 0 groups consecutive parts of the
 * level below, all of them. */
static void check_tree(struct sum_job *s)
{
    int n = sum_n_parts(s), start = 0;
    for (int l = 0; start < n; l++) {
        int count = 0;
        while (start + count < n && sum_part_at(s, start + count)->level == l)
            count++;
        assert_true(count > 0);
        for (int i = 0; i < count; i++) {
            const struct sum_part *p = sum_part_at(s, start + i);
            assert_int_equal(p->index, i);
            if (l > 0)
                assert_int_equal(p->first, i ? sum_part_at(s, start + i - 1)->last + 1 : 0);
        }
        if (start + count < n) { /* the level above reads all of this one */
            const struct sum_part *last_above = NULL;
            for (int k = start + count; k < n && sum_part_at(s, k)->level == l + 1; k++)
                last_above = sum_part_at(s, k);
            assert_non_null(last_above);
            assert_int_equal(last_above->last, count - 1);
        }
        start += count;
    }
}

/* 5 and 50 contexts: depth as summary_depth predicts for summaries of exactly k tokens. */
static void test_depth_as_predicted(void **state)
{
    const struct {
        size_t bytes;
        int k;
        const char *options;
    } cases[] = {
        {12000, 12, "{\"max_tokens\": 12, \"chunk_tokens\": 300, \"overlap_tokens\": 20}"},
        {120000, 40, "{\"max_tokens\": 40}"},
        {120000, 12, "{\"max_tokens\": 12}"},
        {300, 12, "{\"max_tokens\": 12}"}, /* one chunk: the map summary is the answer */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *doc = document(cases[c].bytes, 7), err[512];
        struct job j;
        parse(doc, cases[c].options, cases[c].k, &j);
        struct sum_job *s;
        if (sum_open(&j, tok, ct, MAX_MODEL_LEN, &s, err, sizeof err))
            fail_msg("sum_open: %s", err);
        struct sum_totals t;
        sum_get_totals(s, &t);
        int predicted = summary_depth(t.chunks, cases[c].k, SUM_SEP, t.reduce_budget);
        struct run r;
        run_all(s, cases[c].k, &r);
        printf("%zu bytes: %d chunks of <= %d tokens (overlap %d), reduce budget %d: depth %d (predicted %d), "
               "%d parts\n",
               cases[c].bytes, t.chunks, t.chunk_tokens, t.overlap_tokens, t.reduce_budget, r.depth, predicted,
               r.parts_run);
        assert_int_equal(r.depth, predicted);
        for (int l = 0; l < r.depth; l++)
            assert_int_equal(r.level_parts[l], summary_level_width(t.chunks, cases[c].k, SUM_SEP,
                                                                   t.reduce_budget, l));
        assert_int_equal(r.level_parts[r.depth - 1], 1);
        check_tree(s);
        sum_get_totals(s, &t);
        assert_int_equal(t.parts_done, r.parts_run);
        assert_int_equal(t.parts_total, r.parts_run);
        assert_int_equal(t.completion_tokens, (int64_t)cases[c].k * r.parts_run);
        assert_true(t.any_length);
        char *want = summary(cases[c].k);
        assert_string_equal(sum_root(s)->output, want);
        free(want);
        sum_free(s);
        job_free(&j);
        free(doc);
    }
}

struct stored {
    int level, index, first, last;
    char *output;
};

/* The same job planned again with the first plan's level-0 parts (and some of level 1) restored:
 * same plan id, only the rest runs, the same tree. Another document: another plan. */
static void test_resume(void **state)
{
    char *doc = document(120000, 9), err[512];
    struct job j;
    parse(doc, "{\"max_tokens\": 40}", 40, &j);
    struct sum_job *a, *b;
    assert_int_equal(sum_open(&j, tok, ct, MAX_MODEL_LEN, &a, err, sizeof err), 0);
    struct run ra;
    run_all(a, 40, &ra);
    assert_true(ra.depth >= 3);
    /* keep level 0 and the first part of level 1, as a worker killed during level 1 would */
    struct stored keep[512];
    int nkeep = 0;
    for (int i = 0; i < sum_n_parts(a); i++) {
        const struct sum_part *p = sum_part_at(a, i);
        if (p->level == 0 || (p->level == 1 && p->index == 0))
            keep[nkeep++] = (struct stored){p->level, p->index, p->first, p->last, strdup(p->output)};
    }
    assert_int_equal(sum_open(&j, tok, ct, MAX_MODEL_LEN, &b, err, sizeof err), 0);
    assert_string_equal(sum_plan_id(a), sum_plan_id(b));
    for (int i = 0; i < nkeep; i++)
        assert_int_equal(sum_restore(b, keep[i].level, keep[i].index, keep[i].first, keep[i].last,
                                     keep[i].output, strlen(keep[i].output), 100, 40, FINISH_LENGTH),
                         0);
    struct sum_totals t;
    sum_get_totals(b, &t);
    assert_int_equal(t.parts_restored, nkeep);
    assert_int_equal(t.level, 1);
    struct run rb;
    run_all(b, 40, &rb);
    assert_int_equal(rb.parts_run, ra.parts_run - nkeep);
    assert_int_equal(rb.depth, ra.depth);
    assert_memory_equal(rb.level_parts, ra.level_parts, sizeof ra.level_parts);
    sum_get_totals(b, &t);
    assert_int_equal(t.parts_done, ra.parts_run); /* restored parts count in the totals */
    sum_free(b);

    /* a stored part that reads other inputs than the new plan's is not used */
    assert_int_equal(sum_open(&j, tok, ct, MAX_MODEL_LEN, &b, err, sizeof err), 0);
    assert_int_equal(sum_restore(b, 0, 0, 5, 5, "x", 1, 1, 1, FINISH_STOP), 0);
    sum_get_totals(b, &t);
    assert_int_equal(t.parts_restored, 0);
    sum_free(b);
    for (int i = 0; i < nkeep; i++)
        free(keep[i].output);

    /* another document, other options: other plans */
    struct job j2;
    doc[100] = doc[100] == 'a' ? 'b' : 'a';
    parse(doc, "{\"max_tokens\": 40}", 40, &j2);
    assert_int_equal(sum_open(&j2, tok, ct, MAX_MODEL_LEN, &b, err, sizeof err), 0);
    assert_string_not_equal(sum_plan_id(a), sum_plan_id(b));
    sum_free(b);
    job_free(&j2);
    parse(doc, "{\"max_tokens\": 41}", 40, &j2);
    struct sum_job *c;
    assert_int_equal(sum_open(&j2, tok, ct, MAX_MODEL_LEN, &c, err, sizeof err), 0);
    assert_string_not_equal(sum_plan_id(a), sum_plan_id(c));
    sum_free(c);
    job_free(&j2);
    sum_free(a);
    job_free(&j);
    free(doc);
}

/* What a part's prompt holds: the chunk's text in the map template, the summaries joined by a blank
 * line in the reduce template; the job's vars reach both; the root gets the job's max_tokens. */
static void test_prompts(void **state)
{
    struct job_opts o = job_opts_default();
    const char *line = "{\"document\": \"First paragraph here.\\n\\nSecond one is a little longer than the first "
                       "one.\\n\\nThird paragraph, which closes the text.\", \"vars\": {\"lang\": \"German\"}, "
                       "\"max_tokens\": 30, \"summarize\": {\"max_tokens\": 10, \"chunk_tokens\": 16}}";
    struct job j;
    char err[512];
    assert_int_equal(job_parse(line, strlen(line), &o, &j, err, sizeof err), 0);
    free(j.summarize->map_text);
    j.summarize->map_text = strdup("[{lang}] part {part}/{parts} level {level}: {document}");
    free(j.summarize->reduce_text);
    j.summarize->reduce_text = strdup("[{lang}] combine: {document}");
    struct sum_job *s;
    assert_int_equal(sum_open(&j, tok, NULL, MAX_MODEL_LEN, &s, err, sizeof err), 0); /* no chat template */
    struct sum_part *p = sum_next(s);
    assert_non_null(p);
    struct job_input in;
    assert_int_equal(sum_prepare(s, p, &in, err, sizeof err), 0);
    char *text;
    size_t tlen;
    assert_int_equal(tok_decode(tok, in.tokens, (size_t)in.n_tokens, false, &text, &tlen, err, sizeof err), 0);
    struct sum_totals t;
    sum_get_totals(s, &t);
    char want[256];
    snprintf(want, sizeof want, "[German] part 1/%d level 0: First paragraph here.", t.chunks);
    assert_int_equal(strncmp(text, want, strlen(want)), 0);
    assert_int_equal(in.req.max_tokens, t.chunks == 1 ? 30 : 10);
    free(text);
    job_input_free(&in);
    assert_true(t.chunks > 1);
    {
        struct sum_part *q[8];
        int n = 0;
        q[n++] = p;
        while ((p = sum_next(s)))
            q[n++] = p;
        for (int i = 0; i < n; i++) {
            char out[32];
            snprintf(out, sizeof out, "  summary %d\n", i);
            sum_done(s, q[i], out, strlen(out), 5, 3, FINISH_STOP);
            sum_committed(s, q[i], err, sizeof err);
        }
        p = sum_next(s);
        assert_non_null(p);
        assert_true(p->root);
        assert_int_equal(sum_prepare(s, p, &in, err, sizeof err), 0);
        assert_int_equal(tok_decode(tok, in.tokens, (size_t)in.n_tokens, false, &text, &tlen, err, sizeof err), 0);
        struct buf w = {0};
        buf_puts(&w, "[German] combine: ");
        for (int i = 0; i < n; i++)
            buf_printf(&w, "%ssummary %d", i ? "\n\n" : "", i);
        assert_string_equal(text, w.p);
        buf_free(&w);
        assert_int_equal(in.req.max_tokens, 30);
        free(text);
        job_input_free(&in);
    }
    sum_free(s);
    job_free(&j);
}

/* Sizes that cannot work fail with what is at fault. */
static void test_refusals(void **state)
{
    char *doc = document(5000, 3), err[512];
    const struct {
        const char *options;
        int max_tokens, rc;
        const char *msg;
    } cases[] = {
        {"{\"chunk_tokens\": 5000}", 16, JOB_ERR_INVALID, "field 'summarize.chunk_tokens': 5000 does not fit"},
        {"{\"max_tokens\": 200}", 16, JOB_ERR_CONTEXT, "a reduce step must hold two summaries"},
        {"{}", 500, JOB_ERR_CONTEXT, "no room for a chunk"},
        {"{\"chunk_tokens\": 100, \"overlap_tokens\": 50}", 16, JOB_ERR_INVALID,
         "field 'summarize.overlap_tokens': 50 is half a chunk"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct job j;
        parse(doc, cases[c].options, cases[c].max_tokens, &j);
        struct sum_job *s = (struct sum_job *)1;
        int rc = sum_open(&j, tok, ct, MAX_MODEL_LEN, &s, err, sizeof err);
        if (rc != cases[c].rc || !strstr(err, cases[c].msg))
            fail_msg("%s: rc %d \"%s\", want %d \"%s\"", cases[c].options, rc, err, cases[c].rc, cases[c].msg);
        assert_null(s);
        job_free(&j);
    }
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth_as_predicted),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
