/* worker/store/row_json.c: a row encoded and decoded is the row, column for column
 * (db_result_same, db_metrics_same), with NULLs, NANs, embedded NUL bytes, non-ASCII text, reals
 * that need every digit and a batch; a row missing a required member, or with a member of the
 * wrong type, is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "worker/store/db.h"
#include "worker/store/row_json.h"

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *o = json_loads(text, JSON_ALLOW_NUL, &e);
    if (!o)
        fail_msg("not JSON (%s): %s", e.text, text);
    return o;
}

static void test_result_round_trip(void **state)
{
    (void)state;
    static const char output[] = "a\0b \xc3\xa9t\xc3\xa9";
    struct db_batch b = db_batch_empty();
    b.id = "nightly";
    b.input = "jobs.jsonl";
    b.created_at = 1796600000.123;
    b.total = 3;
    b.state = "running";
    struct db_result r = db_result_empty();
    r.id = "nightly/c-1";
    r.custom_id = "c-1";
    r.queue = "short";
    r.status = DB_CANCELLED;
    r.model = "qwen3-8b";
    r.params = "{\"max_tokens\":16}";
    r.output = output;
    r.output_len = sizeof output - 1;
    r.finish_reason = "cancelled";
    r.prompt_tokens = 512;
    r.completion_tokens = 7;
    r.attempts = 2;
    r.worker_id = "gpu1-4242";
    r.created_at = 1796600000.1;
    r.started_at = 0.1 + 0.2; /* needs 17 digits */
    r.finished_at = 1796600003.000001;
    r.ttft_ms = 81.25;
    r.result = "{\"id\":\"nightly/c-1\"}";
    r.request_form = DB_FORM_OPENAI;
    r.batch_id = "nightly";
    r.request = "{\"custom_id\":\"c-1\"}";
    r.error_code = "cancelled";
    r.batch = &b;
    char *text = row_json_result(&r);
    assert_non_null(text);
    json_t *o = parse(text);
    struct db_result back;
    struct db_batch bb;
    assert_int_equal(row_json_read_result(o, &back, &bb), 0);
    assert_true(db_result_same(&r, &back));
    assert_int_equal(back.output_len, sizeof output - 1);
    assert_memory_equal(back.output, output, sizeof output - 1);
    assert_true(isnan(back.first_token_at) && isnan(back.latency_ms));
    assert_null(back.metadata);
    assert_int_equal(back.reasoning_tokens, -1);
    assert_ptr_equal(back.batch, &bb);
    assert_string_equal(bb.id, "nightly");
    assert_string_equal(bb.state, "running");
    assert_int_equal(bb.total, 3);
    assert_true(bb.created_at == b.created_at && isnan(bb.finished_at));
    assert_null(json_object_get(o, "metadata")); /* NULL columns are left out */
    json_decref(o);
    free(text);
}

static void test_result_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "[]",
        "{\"status\":\"completed\",\"finished_at\":1}",                  /* no id */
        "{\"id\":\"a\",\"finished_at\":1}",                              /* no status */
        "{\"id\":\"a\",\"status\":\"done\",\"finished_at\":1}",          /* not a status */
        "{\"id\":\"a\",\"status\":\"completed\"}",                       /* no finished_at */
        "{\"id\":\"a\",\"status\":\"completed\",\"finished_at\":\"1\"}", /* a string for a real */
        "{\"id\":\"a\",\"status\":\"completed\",\"finished_at\":1,\"attempts\":1.5}",
        "{\"id\":\"a\",\"status\":\"completed\",\"finished_at\":1,\"batch\":{\"total\":1}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *o = parse(bad[i]);
        struct db_result r;
        struct db_batch b;
        if (row_json_read_result(o, &r, &b) != -1)
            fail_msg("accepted: %s", bad[i]);
        json_decref(o);
    }
}

static void test_metrics_and_worker(void **state)
{
    (void)state;
    struct db_metrics m = db_metrics_empty();
    m.worker_id = "gpu1-4242";
    m.ts = 1796600010.5;
    m.interval_s = 10;
    m.jobs_done = 450;
    m.generation_tokens_per_s = 5760.125;
    m.kv_usage = 0.25;
    m.queue_short = 17;
    char *text = row_json_metrics(&m);
    assert_non_null(text);
    json_t *o = parse(text);
    struct db_metrics back;
    assert_int_equal(row_json_read_metrics(o, &back), 0);
    assert_true(db_metrics_same(&m, &back));
    assert_true(isnan(back.ttft_p50_ms));
    assert_int_equal(back.gpu_mem_bytes, -1);
    json_decref(o);
    free(text);

    struct db_worker_row w = {.w = {.id = "gpu1-4242",
                                    .host = "gpu1",
                                    .pid = 4242,
                                    .gpu = "NVIDIA H200",
                                    .model = "qwen3-14b",
                                    .backend = "cuda",
                                    .version = "1.0",
                                    .started_at = 1796600000.25},
                              .last_seen_at = 1796600010.5,
                              .stopped_at = NAN,
                              .jobs_done = 450};
    text = row_json_worker(&w);
    assert_non_null(text);
    o = parse(text);
    struct db_worker_row wb;
    assert_int_equal(row_json_read_worker(o, &wb), 0);
    assert_string_equal(wb.w.id, "gpu1-4242");
    assert_string_equal(wb.w.gpu, "NVIDIA H200");
    assert_int_equal(wb.w.pid, 4242);
    assert_true(wb.w.started_at == w.w.started_at && wb.last_seen_at == w.last_seen_at);
    assert_true(isnan(wb.stopped_at));
    assert_int_equal(wb.jobs_done, 450);
    json_decref(o);
    free(text);
    o = parse("{\"id\":\"x\"}"); /* no started_at */
    assert_int_equal(row_json_read_worker(o, &wb), -1);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_round_trip),
        cmocka_unit_test(test_result_refused),
        cmocka_unit_test(test_metrics_and_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
