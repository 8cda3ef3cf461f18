/* Redis going away under a working worker: every operation fails with an error instead of
 * crashing or hanging, held jobs stay held until an ack succeeds, the connections come back.
 * Without persistence a restart loses Redis's data (that is Redis's behaviour; the worker only
 * has to recover its connection and keep working); with --appendonly yes --appendfsync always
 * nothing is lost across even a kill -9 of the server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/ack.h"
#include "queue/fetch.h"
#include "queue/progress.h"
#include "queue/push.h"
#include "queue/rq.h"
#include "rq_test.h"

/* Each test starts srv itself (with its own options) and cleans it up; short timeouts, for the
 * calls made while the server is down. */
static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.connect_timeout_ms = 500;
    o.block_timeout_ms = 200;
    o.reconnect_max_ms = 300;
    return rq_test_open(&o);
}

/* Retries op until it returns >= 0 or `ms` pass; returns its last result. */
#define UNTIL_OK(ms, op)                                                                                     \
    ({                                                                                                       \
        int64_t t0_ = rq_mono_ms();                                                                          \
        int r_;                                                                                              \
        while ((r_ = (op)) < 0 && rq_mono_ms() - t0_ < (ms))                                                 \
            redis_server_sleep_ms(20);                                                                       \
        r_;                                                                                                  \
    })

static void test_down_then_back_without_persistence(void **state)
{
    redis_server_require();
    assert_int_equal(redis_server_start(&srv, NULL), 0);
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "j", 10);
    struct rq_source src = {"short", 10};
    struct rq_job j[10];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 10, 0, j), 10);
    struct rq_progress pr[10];
    for (int i = 0; i < 10; i++)
        pr[i] = (struct rq_progress){j[i].id, 0.5, 3, 2, 0, 0, 0, 0};
    assert_int_equal(rq_progress(q, pr, 10), 0);

    /* the server dies (kill -9) mid-batch; for a while every call fails, promptly */
    redis_server_kill(&srv);
    struct rq_result res[10];
    for (int i = 0; i < 10; i++)
        res[i] = (struct rq_result){
            .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = 3, .completion_tokens = 4};
    int64_t t0 = rq_mono_ms();
    for (int k = 0; k < 5; k++) {
        int64_t t = rq_mono_ms();
        assert_int_equal(rq_progress(q, pr, 10), -1);
        assert_int_equal(rq_ack(q, res, 10), -1);
        assert_true(rq_mono_ms() - t < 600);    /* at most one connect timeout, never a hang */
        assert_int_equal(rq_held_count(q), 10); /* a failed ack lets nothing go */
    }
    assert_non_null(strstr(rq_error(q), "ack: redis 127.0.0.1:"));
    struct rq_job more[2];
    t0 = rq_mono_ms();
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 2, RQ_BLOCK_DEFAULT, more), -1);
    assert_true(rq_mono_ms() - t0 >= 150); /* a blocking fetch still takes its block time */

    /* back (empty: no persistence) */
    assert_int_equal(redis_server_again(&srv), 0);
    /* the ack goes through; the jobs were lost with Redis's data, so none was still listed,
     * but the hashes record the results */
    assert_int_equal(UNTIL_OK(2000, rq_ack(q, res, 10)), 0);
    assert_int_equal(rq_held_count(q), 0);
    for (int i = 0; i < 10; i++)
        rq_job_free(&j[i]);
    adm = redis_server_connect(&srv);
    assert_non_null(adm);
    assert_string_equal(rs_str(adm, "HGET llmq:job:j3 status"), "completed");
    /* and the worker keeps working, both connections */
    rq_test_push_n(q, "short", "k", 3);
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 10, 0, j), 3);
    for (int i = 0; i < 3; i++)
        res[i] = (struct rq_result){
            .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, 3), 3);
    rq_test_lpush_later(0.2, "short", "'{\"id\":\"late\"}'");
    int n = 0;
    for (int i = 0; i < 20 && n <= 0; i++)
        n = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 10, 200, j + 3);
    assert_int_equal(n, 1);
    assert_string_equal(j[3].id, "late");
    res[0] = (struct rq_result){
        .job = &j[3], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, 1), 1);
    assert_int_equal(rs_int(adm, "LLEN llmq:processing:w1"), 0);
    for (int i = 0; i < 4; i++)
        rq_job_free(&j[i]);
    redisFree(adm);
    rq_free(q);
    redis_server_cleanup(&srv);
}

static void test_nothing_lost_with_aof(void **state)
{
    redis_server_require();
    const char *extra[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    assert_int_equal(redis_server_start(&srv, extra), 0);
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "a", 100);
    struct rq_source src = {"short", 10};
    struct rq_job j[10];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 10, 0, j), 10);
    struct rq_result res[10];
    for (int i = 0; i < 10; i++)
        res[i] = (struct rq_result){
            .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = 1, .completion_tokens = 1};
    assert_int_equal(rq_ack(q, res, 5), 5);

    redis_server_kill(&srv);                     /* a crash: no shutdown, only what the AOF has */
    assert_int_equal(rq_ack(q, res + 5, 5), -1); /* fails while down, jobs still held */
    assert_int_equal(redis_server_again(&srv), 0);

    adm = redis_server_connect(&srv);
    assert_non_null(adm);
    assert_int_equal(rs_int(adm, "LLEN llmq:queue:short"), 90);
    assert_int_equal(rs_int(adm, "LLEN llmq:processing:w1"), 5); /* the unacked are still there */
    for (int i = 0; i < 5; i++) {
        assert_string_equal(rs_str(adm, "HGET llmq:job:%s status", j[i].id), "completed");
        assert_string_equal(rs_str(adm, "HGET llmq:job:%s status", j[5 + i].id), "running");
    }
    /* the worker reconnects and its retried ack finds every job it held */
    assert_int_equal(UNTIL_OK(2000, rq_ack(q, res + 5, 5)), 5);
    assert_int_equal(rs_int(adm, "LLEN llmq:processing:w1"), 0);
    for (int i = 0; i < 10; i++)
        rq_job_free(&j[i]);
    /* every job accounted for: 90 waiting, 10 completed */
    int completed = 0;
    for (int i = 0; i < 100; i++) {
        const char *st = rs_str(adm, "HGET llmq:job:a%d status", i);
        completed += !strcmp(st, "completed");
        if (strcmp(st, "completed"))
            assert_string_equal(st, "queued");
    }
    assert_int_equal(completed, 10);
    /* and the rest can be fetched */
    int total = 0, n;
    while ((n = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 10, 0, j)) > 0) {
        for (int i = 0; i < n; i++)
            res[i] = (struct rq_result){
                .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
        assert_int_equal(rq_ack(q, res, n), n);
        for (int i = 0; i < n; i++)
            rq_job_free(&j[i]);
        total += n;
    }
    assert_int_equal(n, 0);
    assert_int_equal(total, 90);
    redisFree(adm);
    rq_free(q);
    redis_server_cleanup(&srv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_down_then_back_without_persistence),
        cmocka_unit_test(test_nothing_lost_with_aof),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
