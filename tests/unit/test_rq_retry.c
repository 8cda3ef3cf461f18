/* queue/retry.c and queue/dead.c against a real redis-server: retry with a short backoff (the
 * due times measured), the mover, max_attempts ending in the dead list with the job's original
 * text, unparseable jobs dead-lettered at once, and requeue-dead by id and all. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "queue/dead.h"
#include "queue/attempt.h"
#include "queue/fetch.h"
#include "queue/push.h"
#include "queue/retry.h"
#include "queue/rq.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.max_attempts = 3;
    o.retry_backoff_base_ms = 200;
    o.retry_backoff_max_ms = 2000;
    o.result_ttl_s = 600;
    return rq_test_open(&o);
}

/* Fetches one job and starts running it: its delivery counts (rq_attempt), as in a worker. */
static int fetch1(struct rq *q, const char *queue, struct rq_job *j)
{
    struct rq_source src = {queue, 1};
    int n = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, j);
    if (n == 1 && rq_attempt(q, &j, 1))
        return -1;
    return n;
}

static void test_retry_backoff_then_dead(void **state)
{
    const char *raw = "{\"id\":\"r1\",\"prompt\":\"flaky\",\"max_tokens\":3}";
    struct rq *q = open_rq("w1");
    rq_test_push(q, "long", raw, "r1");
    /* something else waits in the queue: a due retry goes behind it */
    run("LPUSH llmq:queue:long %s", "{\"id\":\"other\"}");
    struct rq_job j;
    for (int attempt = 1; attempt <= 2; attempt++) {
        assert_int_equal(fetch1(q, "long", &j), 1);
        if (attempt == 2) { /* "other" came first */
            assert_string_equal(j.id, "other");
            struct rq_job o = j;
            assert_int_equal(fetch1(q, "long", &j), 1);
            assert_int_equal(rq_dead(q, &o, NULL, "not this one's test", NULL, NULL, NULL), 1);
            rq_job_free(&o);
        }
        assert_string_equal(j.id, "r1");
        assert_int_equal(j.attempts, attempt);
        double t0 = rq_wall_s();
        int64_t delay;
        assert_int_equal(rq_retry(q, &j, "engine_error", "engine_error: transient", "{\"status\":\"failed\"}",
                                  &delay, NULL),
                         RQ_RETRY_SCHEDULED);
        assert_int_equal(ival("HEXISTS llmq:job:r1 result"), 0); /* a result only when it is final */
        /* base 200 ms * 2^(attempt-1), +-25% */
        int64_t nominal = 200LL << (attempt - 1);
        assert_true(delay >= nominal * 3 / 4 && delay < nominal * 5 / 4 + 1);
        /* the score is the due time */
        double score = strtod(sval("ZSCORE llmq:retry %s", raw), NULL);
        assert_true(fabs(score - (t0 * 1000 + delay)) < 200);
        assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
        assert_string_equal(sval("HGET llmq:job:r1 status"), "queued");
        assert_string_equal(sval("HGET llmq:job:r1 error"), "engine_error: transient");
        assert_int_equal(ival("HEXISTS llmq:job:r1 retry_at"), 1);
        /* not due yet: nothing moves */
        assert_int_equal(rq_retry_due(q, 100), 0);
        assert_int_equal(ival("ZCARD llmq:retry"), 1);
        /* poll until it moves; it must not move early, and must move soon after it is due */
        int moved = 0;
        double t_moved = 0;
        while (!moved && rq_wall_s() - t0 < 3) {
            moved = rq_retry_due(q, 100);
            assert_true(moved >= 0);
            t_moved = rq_wall_s();
            if (!moved)
                redis_server_sleep_ms(10);
        }
        assert_int_equal(moved, 1);
        double waited_ms = (t_moved - t0) * 1000;
        assert_true(waited_ms >= delay - 30);
        assert_true(waited_ms < delay + 300);
        assert_int_equal(ival("ZCARD llmq:retry"), 0);
        assert_string_equal(sval("LINDEX llmq:queue:long 0"), raw); /* at the back (LPUSH) */
        rq_job_free(&j);
    }
    /* third delivery fails too: max_attempts 3 reached, dead */
    assert_int_equal(fetch1(q, "long", &j), 1);
    assert_int_equal(j.attempts, 3);
    const char *res = "{\"id\":\"r1\",\"status\":\"failed\",\"error\":\"engine_error: still broken\"}";
    assert_int_equal(rq_retry(q, &j, "engine_error", "engine_error: still broken", res, NULL, NULL),
                     RQ_RETRY_DEAD);
    assert_int_equal(ival("ZCARD llmq:retry"), 0);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_int_equal(ival("LLEN llmq:dead"), 2);
    json_t *d = json_loads(sval("LINDEX llmq:dead 0"), 0, NULL);
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "id")), "r1");
    assert_string_equal(json_string_value(json_object_get(d, "job")), raw); /* the original text */
    assert_string_equal(json_string_value(json_object_get(d, "error")), "engine_error: still broken");
    assert_int_equal(json_integer_value(json_object_get(d, "attempts")), 3);
    assert_string_equal(json_string_value(json_object_get(d, "worker")), "w1");
    assert_string_equal(json_string_value(json_object_get(d, "queue")), "long");
    json_decref(d);
    assert_string_equal(sval("HGET llmq:job:r1 status"), "failed");
    assert_string_equal(sval("HGET llmq:job:r1 error"), "engine_error: still broken");
    assert_string_equal(sval("HGET llmq:job:r1 result"), res); /* set with the failed status */
    long long ttl = ival("TTL llmq:job:r1");
    assert_true(ttl > 0 && ttl <= 600);
    rq_job_free(&j);

    /* a retry of a job not held any more does nothing */
    assert_int_equal(rq_retry(q, &(struct rq_job){.raw = (char *)raw, .len = strlen(raw), .attempts = 1},
                              NULL, "x", NULL, NULL, NULL),
                     RQ_RETRY_NOT_HELD);
    assert_int_equal(ival("ZCARD llmq:retry"), 0);
    rq_free(q);
}

/* Jobs that cannot be parsed go to the dead list at once with the parser's error; their text is
 * kept byte for byte, whatever it is. */
static void test_unparseable_dead_at_once(void **state)
{
    char out[64];
    /* pushed by a client that is not llmq */
    assert_int_equal(
        redis_cli(&srv, out, sizeof out, "LPUSH llmq:queue:short 'not json at all \"quoted\" \\\\ /'"), 0);
    struct rq *q = open_rq("w1");
    struct rq_job j;
    assert_int_equal(fetch1(q, "short", &j), 1);
    assert_string_equal(j.id, "");
    assert_int_equal(j.attempts, 0);
    assert_int_equal(rq_dead(q, &j, "invalid_json",
                             "invalid_json: invalid JSON (line 1, column 1): '[' or '{' expected", NULL, NULL,
                             NULL),
                     1);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    json_t *d = json_loads(sval("LINDEX llmq:dead 0"), 0, NULL);
    assert_non_null(d);
    assert_true(json_is_null(json_object_get(d, "id")));
    assert_string_equal(json_string_value(json_object_get(d, "job")), j.raw);
    assert_string_equal(json_string_value(json_object_get(d, "queue")), "short");
    assert_int_equal(json_integer_value(json_object_get(d, "attempts")), 0);
    json_decref(d);
    rq_job_free(&j);

    /* a job with an id that fails validation: dead, and its hash says failed with the error */
    const char *bad = "{\"id\":\"v1\",\"prompt\":\"\",\"max_tokens\":-3}";
    rq_test_push(q, "short", bad, "v1");
    assert_int_equal(fetch1(q, "short", &j), 1);
    assert_int_equal(rq_dead(q, &j, "invalid_request",
                             "invalid_request: field 'max_tokens': expected an integer >= 1, got -3", NULL,
                             NULL, NULL),
                     1);
    assert_string_equal(sval("HGET llmq:job:v1 status"), "failed");
    assert_string_equal(sval("HGET llmq:job:v1 error"),
                        "invalid_request: field 'max_tokens': expected an integer >= 1, got -3");
    assert_int_equal(ival("LLEN llmq:dead"), 2);
    /* retry of a job without an id cannot count attempts: it is dead-lettered */
    assert_int_equal(redis_cli(&srv, out, sizeof out, "LPUSH llmq:queue:short '[1,2,3]'"), 0);
    rq_job_free(&j);
    assert_int_equal(fetch1(q, "short", &j), 1);
    assert_int_equal(rq_retry(q, &j, "invalid_json", "invalid_json: a job is an object", NULL, NULL, NULL),
                     RQ_RETRY_DEAD);
    assert_int_equal(ival("LLEN llmq:dead"), 3);
    rq_job_free(&j);
    rq_free(q);
}

static void test_requeue_dead(void **state)
{
    struct rq *q = open_rq("w1");
    const char *raws[3] = {"{\"id\":\"d1\",\"prompt\":\"a\"}", "{\"id\":\"d2\",\"prompt\":\"b\"}",
                           "{\"id\":\"d3\",\"prompt\":\"c\"}"};
    const char *ids[3] = {"d1", "d2", "d3"};
    for (int i = 0; i < 3; i++) {
        rq_test_push(q, i == 2 ? "long" : "short", raws[i], ids[i]);
        struct rq_job j;
        assert_int_equal(fetch1(q, i == 2 ? "long" : "short", &j), 1);
        assert_int_equal(rq_dead(q, &j, NULL, "broken", NULL, NULL, NULL), 1);
        rq_job_free(&j);
    }
    run("LPUSH llmq:queue:short %s", "garbage");
    struct rq_job g;
    assert_int_equal(fetch1(q, "short", &g), 1);
    assert_int_equal(rq_dead(q, &g, "invalid_json", "invalid_json", NULL, NULL, NULL), 1);
    rq_job_free(&g);
    assert_int_equal(ival("LLEN llmq:dead"), 4);
    /* by id */
    const char *want[] = {"d2", "nope"};
    assert_int_equal(rq_dead_requeue(q, want, 2), 1);
    assert_int_equal(ival("LLEN llmq:dead"), 3);
    assert_string_equal(sval("LINDEX llmq:queue:short 0"), raws[1]);
    assert_string_equal(sval("HGET llmq:job:d2 status"), "queued");
    assert_string_equal(sval("HGET llmq:job:d2 attempts"), "0");
    assert_int_equal(ival("HEXISTS llmq:job:d2 error"), 0);
    assert_int_equal(ival("TTL llmq:job:d2"), -1);
    /* all (including the entry without an id), each to the queue it failed on */
    assert_int_equal(rq_dead_requeue(q, NULL, 0), 3);
    assert_int_equal(ival("LLEN llmq:dead"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 3);
    assert_int_equal(ival("LLEN llmq:queue:long"), 1);
    assert_string_equal(sval("LINDEX llmq:queue:long 0"), raws[2]);
    /* and they run again with fresh attempts */
    struct rq_job j;
    assert_int_equal(fetch1(q, "long", &j), 1);
    assert_string_equal(j.id, "d3");
    assert_int_equal(j.attempts, 1);
    rq_job_free(&j);
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_retry_backoff_then_dead, rq_test_flush),
        cmocka_unit_test_setup(test_unparseable_dead_at_once, rq_test_flush),
        cmocka_unit_test_setup(test_requeue_dead, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
