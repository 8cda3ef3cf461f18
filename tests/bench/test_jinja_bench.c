/* engine/jinja's speed: renders per second of Qwen3's chat template (from the build's assets) on a
 * 4-message chat, the "multi_turn/gen=1" row of tests/fixtures/jinja/real.jsonl, and the time to
 * parse the template. Not a timed test: it checks only that every render equals jinja2's text, and
 * prints the numbers for docs/PERFORMANCE.md (CPU time of this thread). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/jinja.h"
#include "testutil.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The fixture row of the 4-message Qwen3 chat: its variables and jinja2's text. */
static json_t *find_row(void)
{
    FILE *f = fopen(test_source("tests/fixtures/jinja/real.jsonl"), "rb");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    json_t *found = NULL;
    while (!found && getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, NULL);
        assert_non_null(row);
        if (strcmp(json_string_value(json_object_get(row, "model")), "qwen3") == 0 &&
            strcmp(json_string_value(json_object_get(row, "name")), "multi_turn/gen=1") == 0)
            found = row;
        else
            json_decref(row);
    }
    free(line);
    fclose(f);
    assert_non_null(found);
    return found;
}

static void test_bench_qwen3(void **state)
{
    json_t *cfg = json_load_file(test_asset("qwen3-tokenizer/tokenizer_config.json"), 0, NULL);
    assert_non_null(cfg);
    const char *src = json_string_value(json_object_get(cfg, "chat_template"));
    assert_non_null(src);
    json_t *row = find_row();
    const json_t *vars = json_object_get(row, "vars");
    const char *want = json_string_value(json_object_get(row, "text"));
    assert_int_equal(json_array_size(json_object_get(vars, "messages")), 4);

    char err[512];
    int parses = 0;
    double t0 = cpu_s(), t1;
    do {
        struct jinja_template *t = jinja_parse(src, strlen(src), "qwen3", err, sizeof err);
        if (!t)
            fail_msg("parse: %s", err);
        jinja_free(t);
        parses++;
    } while ((t1 = cpu_s()) - t0 < 0.5);
    double parse_us = 1e6 * (t1 - t0) / parses;

    struct jinja_template *t = jinja_parse(src, strlen(src), "qwen3", err, sizeof err);
    assert_non_null(t);
    int renders = 0;
    size_t bytes = 0;
    t0 = cpu_s();
    do {
        char *out;
        size_t len;
        if (jinja_render(t, vars, NULL, &out, &len, err, sizeof err) != JINJA_OK)
            fail_msg("render: %s", err);
        if (strcmp(out, want) != 0)
            fail_msg("render %d differs from jinja2's text", renders);
        bytes = len;
        free(out);
        renders++;
    } while ((t1 = cpu_s()) - t0 < 2.0);
    double per_s = renders / (t1 - t0);
    printf("bench-jinja qwen3 chat template, 4 messages (%zu bytes out): %.0f renders/s (%.1f us each), "
           "parse %.0f us\n",
           bytes, per_s, 1e6 / per_s, parse_us);
    printf("{\"bench\":\"jinja\",\"template\":\"qwen3\",\"messages\":4,\"renders_per_s\":%.0f,\"parse_us\":%."
           "0f}\n",
           per_s, parse_us);
    jinja_free(t);
    json_decref(row);
    json_decref(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bench_qwen3)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
