/* queue/stats.c, queue/drain.c, queue/cancel.c and queue/tick.c against a real redis-server: the
 * numbers `llmq status` shows (each one checked against what was set up), the --drain check, cancel
 * requests and checks, and the periodic chores. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/ack.h"
#include "queue/cancel.h"
#include "queue/dead.h"
#include "queue/drain.h"
#include "queue/attempt.h"
#include "queue/fetch.h"
#include "queue/heartbeat.h"
#include "queue/progress.h"
#include "queue/push.h"
#include "queue/retry.h"
#include "queue/rq.h"
#include "queue/stats.h"
#include "queue/tick.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.retry_backoff_base_ms = 100;
    o.heartbeat_interval_s = 1;
    o.reaper_interval_s = 1;
    return rq_test_open(&o);
}

static const char *const queues[] = {"short", "long"};

static void test_stats(void **state)
{
    struct rq *a = open_rq("worker-a");
    rq_test_push_n(a, "short", "s", 7);
    rq_test_push_n(a, "long", "l", 2);
    struct rq_worker_info info = {
        .gpu = "cpu", .model = "tiny", .jobs_done = 5, .tokens_per_s = 42.5, .running = 2};
    assert_int_equal(rq_heartbeat(a, &info), 0);
    struct rq_source src = {"short", 2};
    struct rq_job j[4];
    assert_int_equal(rq_fetch(a, &src, 1, RQ_ORDER_PRIORITY, 2, 0, j), 2);
    struct rq_job *running[2] = {&j[0], &j[1]};
    assert_int_equal(rq_attempt(a, running, 2), 0); /* they run: their deliveries count */
    struct rq_progress pr[2] = {{j[0].id, 0.25, 10, 4, 0, 0, 0, 0}, {j[1].id, 0.75, 10, 12, 0, 0, 0, 0}};
    assert_int_equal(rq_progress(a, pr, 2), 0);
    /* one job in retry, one dead */
    assert_int_equal(rq_fetch(a, &src, 1, RQ_ORDER_PRIORITY, 2, 0, j + 2), 2);
    assert_int_equal(rq_retry(a, &j[2], NULL, "transient", NULL, NULL, NULL), RQ_RETRY_SCHEDULED);
    assert_int_equal(rq_dead(a, &j[3], NULL, "broken", NULL, NULL, NULL), 1);
    /* a lapsed worker left a job behind; a cancel is pending */
    run("SADD llmq:workers ghost");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"gj\"}");
    run("SADD llmq:cancel s1 zzz");

    struct rq_stats s;
    assert_int_equal(rq_stats(a, queues, 2, true, &s), 0);
    assert_int_equal(s.nqueues, 2);
    assert_string_equal(s.queues[0].name, "short");
    assert_int_equal(s.queues[0].len, 3);
    assert_string_equal(s.queues[1].name, "long");
    assert_int_equal(s.queues[1].len, 2);
    assert_int_equal(s.retry, 1);
    assert_int_equal(s.dead, 1);
    assert_int_equal(s.cancel, 2);
    assert_int_equal(s.running, 3);
    assert_int_equal(s.nworkers, 2);
    /* sorted by id: ghost, worker-a */
    assert_string_equal(s.workers[0].id, "ghost");
    assert_false(s.workers[0].alive);
    assert_int_equal(s.workers[0].holding, 1);
    assert_string_equal(s.workers[1].id, "worker-a");
    assert_true(s.workers[1].alive);
    assert_true(s.workers[1].ttl_s > 0);
    assert_int_equal(s.workers[1].holding, 2);
    assert_string_equal(s.workers[1].gpu, "cpu");
    assert_string_equal(s.workers[1].model, "tiny");
    assert_int_equal(s.workers[1].jobs_done, 5);
    assert_true(s.workers[1].tokens_per_s > 42.4 && s.workers[1].tokens_per_s < 42.6);
    assert_int_equal(s.workers[1].pid, (long)getpid());
    assert_true(s.workers[1].started_at > 1.7e9);
    /* running jobs with their progress */
    assert_int_equal(s.njobs, 3);
    int found = 0;
    for (int i = 0; i < s.njobs; i++) {
        if (!strcmp(s.jobs[i].id, j[0].id)) {
            assert_true(s.jobs[i].progress > 0.24 && s.jobs[i].progress < 0.26);
            assert_int_equal(s.jobs[i].completion_tokens, 4);
            assert_string_equal(s.jobs[i].worker, "worker-a");
            assert_string_equal(s.jobs[i].queue, "short");
            assert_int_equal(s.jobs[i].attempts, 1);
            found++;
        } else if (!strcmp(s.jobs[i].id, "gj")) {
            assert_string_equal(s.jobs[i].worker, "ghost");
            assert_true(s.jobs[i].progress < 0); /* no hash: unknown */
            found++;
        }
    }
    assert_int_equal(found, 2);
    rq_stats_free(&s);
    rq_stats_free(&s); /* harmless twice */

    rq_job_free(&j[2]);
    rq_job_free(&j[3]);
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(a);
}

/* rq_drain_check's figures, and rq_drain_done true only when they are all zero. */
static void drain_is(struct rq *q, int64_t queued, int64_t retry, int64_t held, int nholders)
{
    struct rq_drain d;
    assert_int_equal(rq_drain_check(q, queues, 2, &d), 0);
    assert_int_equal(d.queued, queued);
    assert_int_equal(d.retry, retry);
    assert_int_equal(d.held, held);
    assert_int_equal(d.nholders, nholders);
    assert_int_equal(rq_drain_done(&d), queued == 0 && retry == 0 && held == 0);
    rq_drain_free(&d);
    rq_drain_free(&d); /* harmless twice */
}

/* The --drain rule: nothing in the queues, the retry set or any other worker's list, live or
 * lapsed; the caller's own list is its own business. Each holder comes with its heartbeat's PTTL. */
static void test_drain_check(void **state)
{
    struct rq *a = open_rq("worker-a");
    struct rq *b = open_rq("worker-b");
    drain_is(a, 0, 0, 0, 0); /* nothing anywhere */

    rq_test_push_n(a, "short", "s", 3);
    rq_test_push_n(a, "long", "l", 2);
    struct rq_source src = {"short", 2};
    struct rq_job j[3];
    assert_int_equal(rq_heartbeat(a, NULL), 0);
    assert_int_equal(rq_fetch(a, &src, 1, RQ_ORDER_PRIORITY, 2, 0, j), 2); /* a's own */
    assert_int_equal(rq_heartbeat(b, NULL), 0);
    assert_int_equal(rq_fetch(b, &src, 1, RQ_ORDER_PRIORITY, 1, 0, j + 2), 1); /* b is alive */
    assert_int_equal(rq_retry(b, &j[2], NULL, "transient", NULL, NULL, NULL), RQ_RETRY_SCHEDULED);
    run("SADD llmq:workers ghost");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"gj\"}");
    drain_is(a, 2, 1, 1, 1); /* long queue, retry, the lapsed ghost */

    run("DEL llmq:queue:long llmq:retry");
    assert_int_equal(rq_fetch(b, &src, 1, RQ_ORDER_PRIORITY, 1, 0, j + 2), 0); /* short is empty */
    run("LPUSH llmq:processing:worker-b %s", "{\"id\":\"bj1\"}");
    run("LPUSH llmq:processing:worker-b %s", "{\"id\":\"bj2\"}");
    struct rq_drain d;
    assert_int_equal(rq_drain_check(a, queues, 2, &d), 0);
    assert_false(rq_drain_done(&d));
    assert_int_equal(d.nholders, 2); /* sorted by id */
    assert_string_equal(d.holders[0].id, "ghost");
    assert_int_equal(d.holders[0].jobs, 1);
    assert_int_equal(d.holders[0].lapse_ms, -2); /* lapsed: no heartbeat key */
    assert_string_equal(d.holders[1].id, "worker-b");
    assert_int_equal(d.holders[1].jobs, 2);
    assert_true(d.holders[1].lapse_ms > 0 && d.holders[1].lapse_ms <= 30000); /* alive: its TTL */
    rq_drain_free(&d);

    run("DEL llmq:processing:ghost");
    drain_is(a, 0, 0, 2, 1); /* a live worker's list keeps a drain waiting too */
    drain_is(b, 0, 0, 2, 1); /* from b's side: a's two jobs */
    run("DEL llmq:processing:worker-b");
    drain_is(a, 0, 0, 0, 0); /* a's own two running jobs are its own business */
    struct rq_drain bad;
    const char *nope[] = {"no such queue"};
    assert_int_equal(rq_drain_check(a, nope, 1, &bad), -1);
    rq_drain_free(&bad);
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_job_free(&j[2]);
    rq_free(a);
    rq_free(b);
}

static void test_cancel(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "c", 4);
    struct rq_source src = {"short", 3};
    struct rq_job j[4];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 3, 0, j), 3);
    /* c0 finished already: a cancel for it is refused; c1 running and c3 queued are accepted */
    struct rq_result done = {
        .job = &j[0], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, &done, 1), 1);
    const char *ask[] = {"c0", "c1", "c3"};
    struct rq_cancel_result acc[3];
    assert_int_equal(rq_cancel(q, ask, 3, acc), 2);
    assert_int_equal(acc[0].outcome, RQ_CANCEL_ENDED);
    assert_string_equal(acc[0].status, "completed");
    assert_int_equal(acc[1].outcome, RQ_CANCEL_ASKED);
    assert_int_equal(acc[2].outcome, RQ_CANCEL_ASKED);
    assert_int_equal(ival("SISMEMBER llmq:cancel c0"), 0);
    /* an id no job has is refused, nothing added; an addition bounds the set's life */
    const char *none[] = {"never-pushed"};
    assert_int_equal(rq_cancel(q, none, 1, acc), 0);
    assert_int_equal(acc[0].outcome, RQ_CANCEL_UNKNOWN);
    assert_int_equal(ival("SISMEMBER llmq:cancel never-pushed"), 0);
    assert_true(ival("TTL llmq:cancel") > 0);
    /* a client that is not llmq asks too */
    char out[64];
    assert_int_equal(redis_cli(&srv, out, sizeof out, "SADD llmq:cancel c2"), 0);
    /* the worker's per-step check: all held ids in one round trip */
    const char *held[] = {"c1", "c2", "nothere"};
    bool cancel[3];
    uint64_t rt = q->cmd.round_trips;
    assert_int_equal(rq_cancel_check(q, held, 3, cancel), 0);
    assert_int_equal(q->cmd.round_trips - rt, 1);
    assert_true(cancel[0]);
    assert_true(cancel[1]);
    assert_false(cancel[2]);
    /* the queued one is seen at fetch */
    struct rq_job k;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &k), 1);
    assert_string_equal(k.id, "c3");
    assert_true(k.cancel_requested);
    /* acking as cancelled cleans up; clear does too */
    struct rq_result res[2] = {
        {.job = &j[1], .status = RQ_STATUS_CANCELLED, .prompt_tokens = -1, .completion_tokens = 3},
        {.job = &k, .status = RQ_STATUS_CANCELLED, .prompt_tokens = -1, .completion_tokens = 0},
    };
    assert_int_equal(rq_ack(q, res, 2), 2);
    assert_int_equal(ival("SCARD llmq:cancel"), 1);
    const char *c2[] = {"c2"};
    assert_int_equal(rq_cancel_clear(q, c2, 1), 0);
    assert_int_equal(ival("SCARD llmq:cancel"), 0);
    assert_string_equal(sval("HGET llmq:job:c1 status"), "cancelled");
    assert_string_equal(sval("HGET llmq:job:c1 completion_tokens"), "3");
    for (int i = 0; i < 3; i++)
        rq_job_free(&j[i]);
    rq_job_free(&k);
    rq_free(q);
}

/* Every way a job ends takes its id out of the cancel set in the same step: dead-lettered,
 * dead-lettered by a retry out of attempts, and a copy of a finished job dropped at fetch. */
static void test_cancel_cleared(void **state)
{
    (void)state;
    struct rq_opts o = rq_test_opts(srv.url, "w1");
    o.max_attempts = 1;
    struct rq *q = rq_test_open(&o);
    rq_test_push_n(q, "short", "e", 2);
    struct rq_source src = {"short", 2};
    struct rq_job j[2];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 2, 0, j), 2);
    const char *ids[] = {"e0", "e1"};
    assert_int_equal(rq_cancel(q, ids, 2, NULL), 2);
    assert_int_equal(rq_dead(q, &j[0], "invalid_request", "bad", NULL, NULL, NULL), 1);
    assert_int_equal(ival("SISMEMBER llmq:cancel e0"), 0);
    struct rq_job *jp = &j[1];
    assert_int_equal(rq_attempt(q, &jp, 1), 0);
    int64_t delay = 0;
    assert_int_equal(rq_retry(q, &j[1], "internal", "engine failed", NULL, &delay, NULL), RQ_RETRY_DEAD);
    assert_string_equal(sval("HGET llmq:job:e1 status"), "failed");
    assert_int_equal(ival("SISMEMBER llmq:cancel e1"), 0);
    /* a client asks to cancel a job that has ended, then pushes a copy: the copy is dropped and
     * the id goes with it */
    char out[64];
    assert_int_equal(redis_cli(&srv, out, sizeof out, "SADD llmq:cancel e0"), 0);
    assert_int_equal(
        redis_cli(&srv, out, sizeof out, "LPUSH llmq:queue:short '{\"id\":\"e0\",\"prompt\":\"x\"}'"), 0);
    struct rq_job k;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &k), 0);
    assert_int_equal(ival("SISMEMBER llmq:cancel e0"), 0);
    assert_int_equal(ival("EXISTS llmq:cancel"), 0);
    for (int i = 0; i < 2; i++)
        rq_job_free(&j[i]);
    rq_free(q);
}

static void test_tick(void **state)
{
    struct rq *q = open_rq("ticker");
    run("SADD llmq:workers ghost");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"gt\"}");
    rq_test_push_n(q, "short", "t", 1);
    struct rq_source src = {"short", 1};
    struct rq_job j;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 1);
    assert_int_equal(rq_retry(q, &j, NULL, "transient", NULL, NULL, NULL), RQ_RETRY_SCHEDULED);
    rq_job_free(&j);
    struct rq_worker_info info = {.model = "m"};
    struct rq_tick_result tr;
    assert_int_equal(rq_tick(q, &info, &tr), 0);
    assert_true(tr.heartbeat);
    assert_true(tr.reaped);
    /* ghost's lapse is only marked: it is reaped once it stays lapsed for heartbeat_interval_s */
    assert_int_equal(tr.reap.workers, 0);
    assert_int_equal(tr.reap.graced, 1);
    assert_true(tr.reap.grace_ms > 0 && tr.reap.grace_ms <= 1000);
    assert_int_equal(ival("EXISTS llmq:lapsed:ghost"), 1);
    assert_int_equal(ival("EXISTS llmq:worker:ticker"), 1);
    /* right after: nothing is due */
    assert_int_equal(rq_tick(q, &info, &tr), 0);
    assert_false(tr.heartbeat);
    assert_false(tr.reaped);
    /* the retry (base 100 ms, +-25%) comes due and is moved by a later tick */
    int retried = 0;
    for (int i = 0; i < 100 && !retried; i++) {
        redis_server_sleep_ms(20);
        assert_int_equal(rq_tick(q, &info, &tr), 0);
        retried += tr.retried;
    }
    assert_int_equal(retried, 1);
    assert_int_equal(ival("ZCARD llmq:retry"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1); /* the retried one */
    /* after heartbeat_interval_s (1 s) the heartbeat is due again, and ghost's grace is over: the
     * reaper, scheduled for its end, takes its job back */
    redis_server_sleep_ms(1000);
    assert_int_equal(rq_tick(q, &info, &tr), 0);
    assert_true(tr.heartbeat);
    assert_true(tr.reaped);
    assert_int_equal(tr.reap.workers, 1);
    assert_int_equal(tr.reap.requeued, 1);
    assert_int_equal(ival("EXISTS llmq:lapsed:ghost"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 2); /* the reaped one and the retried one */
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_stats, rq_test_flush),
        cmocka_unit_test_setup(test_drain_check, rq_test_flush),
        cmocka_unit_test_setup(test_cancel, rq_test_flush),
        cmocka_unit_test_setup(test_cancel_cleared, rq_test_flush),
        cmocka_unit_test_setup(test_tick, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
