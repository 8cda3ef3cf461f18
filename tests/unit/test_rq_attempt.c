/* queue/attempt.c against a real redis-server: a delivery counts only once the job runs
 * (rq_attempt), once per delivery; a job whose hash is no longer this worker's is not counted; a
 * shutdown hands back a counted job with its count taken back and an uncounted one unchanged;
 * the reaper and a restart's recovery put back held jobs that never ran with their count as it
 * was, and dead-letter a job that ran at max_stalls crashes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/attempt.h"
#include "queue/fetch.h"
#include "queue/heartbeat.h"
#include "queue/reaper.h"
#include "queue/requeue.h"
#include "queue/rq.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.max_attempts = 2;
    o.max_stalls = 2;
    return rq_test_open(&o);
}

static int fetch(struct rq *q, int max, struct rq_job *j)
{
    struct rq_source src = {"short", max};
    return rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, max, 0, j);
}

static void test_counts_once_when_run(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "c", 3);
    struct rq_job j[3];
    assert_int_equal(fetch(q, 3, j), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(j[i].attempts, 1); /* the delivery this is */
        assert_false(j[i].counted);
        assert_string_equal(sval("HGET llmq:job:%s attempts", j[i].id), "0");
    }
    /* c0 and c1 start running; c2 waits */
    struct rq_job *run2[2] = {&j[0], &j[1]};
    assert_int_equal(rq_attempt(q, run2, 2), 0);
    assert_true(j[0].counted && j[1].counted && !j[2].counted);
    assert_string_equal(sval("HGET llmq:job:c0 attempts"), "1");
    assert_string_equal(sval("HGET llmq:job:c1 attempts"), "1");
    assert_string_equal(sval("HGET llmq:job:c2 attempts"), "0");
    /* counting again (c0 is preempted and readmitted) changes nothing */
    assert_int_equal(rq_attempt(q, run2, 1), 0);
    assert_string_equal(sval("HGET llmq:job:c0 attempts"), "1");
    /* a job whose hash another worker holds now (reaped while this one stalled) is not counted */
    run("HSET llmq:job:c2 worker w2");
    struct rq_job *other = &j[2];
    assert_int_equal(rq_attempt(q, &other, 1), 0);
    assert_false(j[2].counted);
    assert_string_equal(sval("HGET llmq:job:c2 attempts"), "0");
    run("HSET llmq:job:c2 worker w1");
    /* shutdown: the counted job's delivery is taken back, the uncounted one's count stays */
    const struct rq_job *back[2] = {&j[1], &j[2]};
    assert_int_equal(rq_requeue(q, back, 2, NULL, "shutdown"), 2);
    assert_string_equal(sval("HGET llmq:job:c1 attempts"), "0");
    assert_string_equal(sval("HGET llmq:job:c2 attempts"), "0");
    /* Redis away: an error, nothing marked counted */
    struct rq_job k[2];
    assert_int_equal(fetch(q, 2, k), 2);
    struct rq_opts o = rq_test_opts("redis://127.0.0.1:1", "w1");
    o.quiet = true;
    struct rq *down = rq_test_open(&o);
    struct rq_job *kk = &k[0];
    assert_int_equal(rq_attempt(down, &kk, 1), -1);
    assert_false(k[0].counted);
    assert_non_null(strstr(rq_error(down), "counting attempts"));
    rq_free(down);
    for (int i = 0; i < 3; i++)
        rq_job_free(&j[i]);
    for (int i = 0; i < 2; i++)
        rq_job_free(&k[i]);
    rq_free(q);
}

/* A worker dies holding jobs of which only some ran, twice (max_stalls 2): the reaper, then a
 * restart's recovery, put back the ones that never ran with their count unchanged and
 * dead-letter the one that ran at both crashes. */
static void test_reaper_counts_what_ran(void **state)
{
    struct rq *q = open_rq("v1");
    rq_test_push_n(q, "short", "p", 3);
    struct rq_job j[3];
    assert_int_equal(fetch(q, 3, j), 3);
    struct rq_job *first = &j[0];
    assert_int_equal(rq_attempt(q, &first, 1), 0); /* p0 runs; p1, p2 wait */
    for (int i = 0; i < 3; i++)
        rq_job_free(&j[i]);
    rq_free(q); /* crash: no heartbeat */
    run("SADD llmq:workers v1");
    rq_test_lapsed_long_ago("v1");
    struct rq *r = open_rq("reaper");
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.requeued, 3);
    assert_string_equal(sval("HGET llmq:job:p0 attempts"), "1");
    assert_string_equal(sval("HGET llmq:job:p1 attempts"), "0");
    assert_string_equal(sval("HGET llmq:job:p2 attempts"), "0");
    /* the same again under a fixed id, taken back by its restart */
    q = open_rq("fixed");
    assert_int_equal(fetch(q, 3, j), 3);
    assert_string_equal(j[0].id, "p0"); /* put back at the front, oldest first */
    assert_int_equal(j[0].attempts, 2);
    first = &j[0];
    assert_int_equal(rq_attempt(q, &first, 1), 0);
    for (int i = 0; i < 3; i++)
        rq_job_free(&j[i]);
    rq_free(q);
    q = open_rq("fixed");
    assert_int_equal(rq_recover(q, &rr), 0);
    assert_int_equal(rr.dead, 1);
    assert_int_equal(rr.requeued, 2);
    assert_int_equal(ival("LLEN llmq:dead"), 1);
    assert_string_equal(sval("HGET llmq:job:p0 status"), "failed");
    assert_string_equal(sval("HGET llmq:job:p1 status"), "queued");
    assert_string_equal(sval("HGET llmq:job:p1 attempts"), "0");
    assert_string_equal(sval("HGET llmq:job:p2 attempts"), "0");
    assert_int_equal(ival("LLEN llmq:queue:short"), 2);
    rq_free(q);
    rq_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_counts_once_when_run, rq_test_flush),
        cmocka_unit_test_setup(test_reaper_counts_what_ran, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
