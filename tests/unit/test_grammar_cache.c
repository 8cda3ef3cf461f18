/* worker/jobs/grammar_cache: one grammar per distinct constraint (schemas equal up to key order share
 * one), the least recently used evicted past GRAMMAR_CACHE_SIZE, refusals passed on with the
 * compiler's message, and nothing cached for them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/grammar.h"
#include "worker/jobs/grammar_cache.h"
#include "worker/jobs/job.h"

static struct job_constraint schema_constraint(const char *text)
{
    struct job_constraint k = {.kind = JOB_CONSTRAINT_JSON_SCHEMA};
    json_error_t je;
    k.schema = json_loads(text, 0, &je);
    assert_non_null(k.schema);
    return k;
}

static void test_shared_and_evicted(void **state)
{
    (void)state;
    struct grammar_cache *c = grammar_cache_new();
    assert_non_null(c);
    char err[256] = "";
    unsigned long long compiled, hits;
    struct job_constraint a =
        schema_constraint("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}");
    struct job_constraint b =
        schema_constraint("{\"properties\": {\"x\": {\"type\": \"integer\"}}, \"type\": \"object\"}");
    struct grammar *ga = grammar_cache_get(c, &a, NULL, err, sizeof err);
    assert_non_null(ga);
    assert_ptr_equal(grammar_cache_get(c, &b, NULL, err, sizeof err), ga); /* key order does not matter */
    grammar_cache_stats(c, &compiled, &hits);
    assert_int_equal(compiled, 1);
    assert_int_equal(hits, 1);
    /* a regex with the schema's text is another constraint */
    struct job_constraint r = {.kind = JOB_CONSTRAINT_REGEX, .regex = "a+b"};
    struct grammar *gr = grammar_cache_get(c, &r, NULL, err, sizeof err);
    assert_non_null(gr);
    assert_ptr_not_equal(gr, ga);
    /* GRAMMAR_CACHE_SIZE others, a used between them: a stays, r (least recently used) goes */
    char rx[GRAMMAR_CACHE_SIZE][16];
    for (int i = 0; i < GRAMMAR_CACHE_SIZE - 1; i++) {
        snprintf(rx[i], sizeof rx[i], "x{%d}", i + 1);
        struct job_constraint k = {.kind = JOB_CONSTRAINT_REGEX, .regex = rx[i]};
        assert_non_null(grammar_cache_get(c, &k, NULL, err, sizeof err));
        assert_ptr_equal(grammar_cache_get(c, &a, NULL, err, sizeof err), ga);
    }
    grammar_cache_stats(c, &compiled, &hits);
    assert_int_equal(compiled, 1 + 1 + GRAMMAR_CACHE_SIZE - 1);
    assert_non_null(grammar_cache_get(c, &r, NULL, err, sizeof err)); /* compiled again */
    unsigned long long compiled2;
    grammar_cache_stats(c, &compiled2, &hits);
    assert_int_equal(compiled2, compiled + 1);
    assert_ptr_equal(grammar_cache_get(c, &a, NULL, err, sizeof err), ga);
    json_decref(a.schema);
    json_decref(b.schema);
    grammar_cache_free(c);
}

static void test_refusals(void **state)
{
    (void)state;
    struct grammar_cache *c = grammar_cache_new();
    char err[256] = "";
    struct job_constraint r = {.kind = JOB_CONSTRAINT_REGEX, .regex = "a(?=b)"};
    assert_null(grammar_cache_get(c, &r, NULL, err, sizeof err));
    assert_non_null(strstr(err, "unsupported lookahead at offset 1"));
    struct job_constraint s =
        schema_constraint("{\"type\": \"string\", \"pattern\": \"^a$\", \"format\": \"date\"}");
    assert_null(grammar_cache_get(c, &s, NULL, err, sizeof err));
    assert_true(strlen(err) > 0);
    unsigned long long compiled, hits;
    grammar_cache_stats(c, &compiled, &hits);
    assert_int_equal(compiled, 0);
    char *choices[] = {"yes", "no"};
    struct job_constraint ch = {.kind = JOB_CONSTRAINT_CHOICE, .choices = choices, .n_choices = 2};
    assert_non_null(grammar_cache_get(c, &ch, NULL, err, sizeof err));
    json_decref(s.schema);
    grammar_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_and_evicted),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
