/* queue/heartbeat.c and queue/reaper.c against a real redis-server: heartbeat fields and TTL,
 * the reaper's Lua script on a fake dead worker (a processing list with no heartbeat key),
 * live workers left alone, a heartbeat that really expires (reaped only after its grace; one that
 * comes back within the grace keeps its jobs), poison jobs that keep killing
 * workers ending in the dead list after max_stalls, a restarted worker taking back its own
 * list, and a clean exit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "queue/ack.h"
#include "queue/attempt.h"
#include "queue/fetch.h"
#include "queue/heartbeat.h"
#include "queue/push.h"
#include "queue/reaper.h"
#include "queue/rq.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker, int hb_ttl_s)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.max_attempts = 3;
    o.max_stalls = 3;
    o.heartbeat_interval_s = 1; /* the reaper's grace: 1 s */
    if (hb_ttl_s > 0)
        o.heartbeat_ttl_s = hb_ttl_s;
    return rq_test_open(&o);
}

static void test_heartbeat(void **state)
{
    struct rq *q = open_rq("hb1", 30);
    struct rq_worker_info info = {
        .gpu = "NVIDIA H200", .model = "Qwen3-8B", .jobs_done = 17, .tokens_per_s = 1234.5, .running = 3};
    assert_int_equal(rq_heartbeat(q, &info), 0);
    assert_int_equal(ival("SISMEMBER llmq:workers hb1"), 1);
    long long ttl = ival("TTL llmq:worker:hb1");
    assert_true(ttl > 25 && ttl <= 30);
    char host[256];
    gethostname(host, sizeof host);
    assert_string_equal(sval("HGET llmq:worker:hb1 host"), host);
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    assert_string_equal(sval("HGET llmq:worker:hb1 pid"), pid);
    assert_string_equal(sval("HGET llmq:worker:hb1 gpu"), "NVIDIA H200");
    assert_string_equal(sval("HGET llmq:worker:hb1 model"), "Qwen3-8B");
    assert_string_equal(sval("HGET llmq:worker:hb1 jobs_done"), "17");
    assert_string_equal(sval("HGET llmq:worker:hb1 tokens_per_s"), "1234.5");
    assert_string_equal(sval("HGET llmq:worker:hb1 running"), "3");
    assert_int_equal(ival("HEXISTS llmq:worker:hb1 started_at"), 1);
    /* a clean exit with nothing held: gone from both */
    assert_int_equal(rq_heartbeat_stop(q), 0);
    assert_int_equal(ival("EXISTS llmq:worker:hb1"), 0);
    assert_int_equal(ival("SISMEMBER llmq:workers hb1"), 0);
    rq_free(q);
}

/* The fake dead worker "ghost": a processing list and a membership, no heartbeat key. */
static void test_reap_fake_dead_worker(void **state)
{
    run("SADD llmq:workers ghost");
    rq_test_lapsed_long_ago("ghost");
    /* oldest at the right, as BLMOVE ... RIGHT LEFT leaves them */
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"g1\",\"prompt\":\"a\"}");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"g2\",\"prompt\":\"b\"}");
    run("LPUSH llmq:processing:ghost %s", "{\"prompt\":\"no id\"}");
    run("LPUSH llmq:processing:ghost %s", "{broken json");
    run("HSET llmq:job:g1 status running queue short attempts 1 worker ghost");
    run("HSET llmq:job:g2 status running queue long attempts 2 worker ghost");
    /* a live worker with a job: must be left alone */
    run("SADD llmq:workers alive");
    run("HSET llmq:worker:alive host h");
    run("EXPIRE llmq:worker:alive 30");
    run("LPUSH llmq:processing:alive %s", "{\"id\":\"a1\"}");
    /* someone is waiting in the short queue already */
    run("LPUSH llmq:queue:short %s", "{\"id\":\"waiting\"}");

    struct rq *q = open_rq("reaper", 30);
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(q, &rr), 0);
    assert_int_equal(rr.workers, 1);
    assert_int_equal(rr.requeued, 4); /* the entry that is not JSON too: the next fetch fails it */
    assert_int_equal(rr.dead, 0);
    assert_int_equal(ival("EXISTS llmq:processing:ghost"), 0);
    assert_int_equal(ival("SISMEMBER llmq:workers ghost"), 0);
    assert_int_equal(ival("LLEN llmq:processing:alive"), 1);
    assert_int_equal(ival("SISMEMBER llmq:workers alive"), 1);
    /* each back to the front of the queue it came from: the oldest is fetched first, before
     * what was waiting */
    assert_string_equal(sval("LINDEX llmq:queue:long 0"), "{\"id\":\"g2\",\"prompt\":\"b\"}");
    assert_int_equal(ival("LLEN llmq:queue:short"), 4);
    assert_string_equal(sval("LINDEX llmq:queue:short -1"), "{\"id\":\"g1\",\"prompt\":\"a\"}");
    assert_string_equal(sval("LINDEX llmq:queue:short -2"), "{\"prompt\":\"no id\"}");
    assert_string_equal(sval("LINDEX llmq:queue:short -3"), "{broken json");
    assert_string_equal(sval("LINDEX llmq:queue:short 0"), "{\"id\":\"waiting\"}");
    /* hashes: queued, the delivery already counted, why */
    assert_string_equal(sval("HGET llmq:job:g1 status"), "queued");
    assert_string_equal(sval("HGET llmq:job:g1 attempts"), "1");
    assert_string_equal(sval("HGET llmq:job:g2 attempts"), "2");
    assert_non_null(strstr(sval("HGET llmq:job:g1 error"), "worker ghost stopped"));
    assert_int_equal(ival("LLEN llmq:dead"), 0);
    /* running it again finds nothing to do */
    assert_int_equal(rq_reap(q, &rr), 0);
    assert_int_equal(rr.workers + rr.requeued + rr.dead, 0);
    rq_free(q);
}

/* A worker whose heartbeat really expires is reaped; one that keeps beating is not. */
static void test_heartbeat_expiry(void **state)
{
    struct rq *w = open_rq("short-lived", 1); /* TTL 1 s */
    rq_test_push_id(w, "short", "e1");
    assert_int_equal(rq_heartbeat(w, NULL), 0);
    struct rq_source src = {"short", 1};
    struct rq_job j;
    assert_int_equal(rq_fetch(w, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 1);
    struct rq *r = open_rq("reaper", 30);
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.workers, 0); /* still alive */
    assert_int_equal(ival("LLEN llmq:processing:short-lived"), 1);
    redis_server_sleep_ms(2100); /* the worker "hangs": no heartbeat for longer than its TTL */
    assert_int_equal(ival("EXISTS llmq:worker:short-lived"), 0);
    /* found lapsed: marked, reaped only if it stays lapsed for the grace (heartbeat_interval_s) */
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.workers, 0);
    assert_int_equal(rr.graced, 1);
    assert_int_equal(ival("EXISTS llmq:lapsed:short-lived"), 1);
    /* it comes back within the grace: its heartbeat deletes the mark and it keeps its job */
    assert_int_equal(rq_heartbeat(w, NULL), 0);
    assert_int_equal(ival("EXISTS llmq:lapsed:short-lived"), 0);
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.workers + rr.graced, 0);
    assert_int_equal(ival("LLEN llmq:processing:short-lived"), 1);
    /* it lapses again: a new grace, and once that is over it is reaped */
    run("DEL llmq:worker:short-lived");
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.graced, 1);
    assert_true(rr.grace_ms > 900 && rr.grace_ms <= 1000);
    assert_int_equal(ival("LLEN llmq:processing:short-lived"), 1);
    redis_server_sleep_ms((int)rr.grace_ms + 50);
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.workers, 1);
    assert_int_equal(rr.requeued, 1);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    /* the hung worker wakes up and acks: the job is not in its list any more (at-least-once:
     * the job may run twice; the SQLite upsert keeps one row) */
    struct rq_result res = {
        .job = &j, .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(w, &res, 1), 0);
    rq_job_free(&j);
    rq_free(w);
    rq_free(r);
}

/* A poison job kills every worker that takes it; after max_stalls (3) such deliveries the reaper
 * dead-letters it instead of handing it out again. */
static void test_poison_goes_dead(void **state)
{
    const char *poison = "{\"id\":\"poison\",\"prompt\":\"kills workers\"}";
    struct rq *client = open_rq("client", 30);
    rq_test_push(client, "short", poison, "poison");
    struct rq *reaper = open_rq("reaper", 30);
    struct rq_source src = {"short", 4};
    for (int round = 1; round <= 3; round++) {
        char name[32];
        snprintf(name, sizeof name, "victim%d", round);
        struct rq *w = open_rq(name, 30);
        assert_int_equal(rq_heartbeat(w, NULL), 0);
        struct rq_job j;
        assert_int_equal(rq_fetch(w, &src, 1, RQ_ORDER_PRIORITY, 4, 0, &j), 1);
        assert_string_equal(j.id, "poison");
        assert_int_equal(j.attempts, round);
        struct rq_job *running = &j;
        assert_int_equal(rq_attempt(w, &running, 1), 0); /* it runs: the delivery counts */
        assert_int_equal(j.attempts, round);
        assert_string_equal(sval("HGET llmq:job:poison attempts"), round == 1 ? "1" : round == 2 ? "2" : "3");
        rq_job_free(&j);
        rq_free(w);                      /* the worker dies with it */
        run("DEL llmq:worker:%s", name); /* its heartbeat lapses */
        rq_test_lapsed_long_ago(name);
        struct rq_reap_result rr;
        assert_int_equal(rq_reap(reaper, &rr), 0);
        assert_int_equal(rr.workers, 1);
        if (round < 3) {
            assert_int_equal(rr.requeued, 1);
            assert_int_equal(ival("LLEN llmq:queue:short"), 1);
        } else {
            assert_int_equal(rr.dead, 1);
            assert_int_equal(rr.requeued, 0);
        }
    }
    assert_int_equal(ival("LLEN llmq:queue:short"), 0);
    assert_int_equal(ival("LLEN llmq:dead"), 1);
    json_t *d = json_loads(sval("LINDEX llmq:dead 0"), 0, NULL);
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "id")), "poison");
    assert_string_equal(json_string_value(json_object_get(d, "job")), poison);
    assert_int_equal(json_integer_value(json_object_get(d, "attempts")), 3);
    assert_string_equal(json_string_value(json_object_get(d, "worker")), "victim3");
    assert_string_equal(json_string_value(json_object_get(d, "queue")), "short");
    assert_non_null(strstr(json_string_value(json_object_get(d, "error")), "lost while running it 3 times (queues.max_stalls 3)"));
    assert_true(json_real_value(json_object_get(d, "failed_at")) > 1.7e9);
    json_decref(d);
    assert_string_equal(sval("HGET llmq:job:poison status"), "failed");
    assert_non_null(strstr(sval("HGET llmq:job:poison error"), "heartbeat lapsed"));
    assert_true(ival("TTL llmq:job:poison") > 0);
    rq_free(client);
    rq_free(reaper);
}

/* A worker restarting with a fixed id takes back what its previous life held (its heartbeat may
 * still be alive, so no reaper would). */
static void test_recover_own_list(void **state)
{
    struct rq *w = open_rq("fixed", 30);
    struct rq_push_item it[2] = {{"{\"id\":\"f1\"}", 11, "f1", NULL}, {"{\"id\":\"f2\"}", 11, "f2", NULL}};
    assert_int_equal(rq_push(w, "long", NULL, RQ_PUSH_FORCE, it, 2), 0);
    assert_int_equal(rq_heartbeat(w, NULL), 0);
    struct rq_source src = {"long", 4};
    struct rq_job j[2];
    assert_int_equal(rq_fetch(w, &src, 1, RQ_ORDER_PRIORITY, 4, 0, j), 2);
    struct rq_job *first = &j[0];
    assert_int_equal(rq_attempt(w, &first, 1), 0); /* f1 runs, f2 only waits */
    /* recover is refused while jobs are held by this process */
    struct rq_reap_result rr;
    assert_int_equal(rq_recover(w, &rr), -1);
    assert_non_null(strstr(rq_error(w), "holds 2 jobs"));
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(w); /* crash */

    struct rq *again = open_rq("fixed", 30);
    assert_int_equal(rq_recover(again, &rr), 0);
    assert_int_equal(rr.requeued, 2);
    assert_int_equal(ival("LLEN llmq:processing:fixed"), 0);
    assert_int_equal(rq_fetch(again, &src, 1, RQ_ORDER_PRIORITY, 4, 0, j), 2);
    assert_string_equal(j[0].id, "f1"); /* same order as before */
    assert_string_equal(j[1].id, "f2");
    assert_int_equal(j[0].attempts, 2); /* it ran in the crash */
    assert_int_equal(j[1].attempts, 1); /* it did not: the same delivery number again */
    assert_string_equal(sval("HGET llmq:job:f2 attempts"), "0");
    /* a clean exit while still holding jobs keeps the worker listed, so the reaper takes them */
    assert_int_equal(rq_heartbeat_stop(again), 0);
    assert_int_equal(ival("EXISTS llmq:worker:fixed"), 0);
    assert_int_equal(ival("SISMEMBER llmq:workers fixed"), 1);
    rq_test_lapsed_long_ago("fixed");
    struct rq *r = open_rq("reaper", 30);
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.requeued, 2);
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(again);
    rq_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_heartbeat, rq_test_flush),
        cmocka_unit_test_setup(test_reap_fake_dead_worker, rq_test_flush),
        cmocka_unit_test_setup(test_heartbeat_expiry, rq_test_flush),
        cmocka_unit_test_setup(test_poison_goes_dead, rq_test_flush),
        cmocka_unit_test_setup(test_recover_own_list, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
