/* queue/fetch.c against a real redis-server: reliable moves into the processing list, batches,
 * priority and round-robin order over queues, blocking with a timeout, ids given at fetch and
 * kept across a crash, jobs pushed by redis-cli, cancel at fetch, and the repair of a fetch
 * whose reply was lost. */
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

#include "queue/ack.h"
#include "queue/attempt.h"
#include "queue/fetch.h"
#include "queue/jobid.h"
#include "queue/push.h"
#include "queue/reaper.h"
#include "queue/rq.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    return rq_test_open(&o);
}

static void ack_all(struct rq *q, struct rq_job *jobs, int n)
{
    struct rq_result res[64] = {0};
    for (int i = 0; i < n; i++)
        res[i] = (struct rq_result){
            .job = &jobs[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, n), n);
    for (int i = 0; i < n; i++)
        rq_job_free(&jobs[i]);
}

static void test_fetch_one(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push(q, "short", "{\"id\":\"a1\",\"prompt\":\"hello\"}", "a1");
    assert_string_equal(sval("HGET llmq:job:a1 status"), "queued");
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j), 1);
    assert_string_equal(j[0].raw, "{\"id\":\"a1\",\"prompt\":\"hello\"}");
    assert_string_equal(j[0].id, "a1");
    assert_string_equal(j[0].queue, "short");
    assert_int_equal(j[0].attempts, 1);
    assert_false(j[0].id_assigned);
    assert_false(j[0].cancel_requested);
    /* moved: gone from the queue, in the processing list; the hash says running */
    assert_int_equal(ival("LLEN llmq:queue:short"), 0);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 1);
    const char *s = sval("LINDEX llmq:processing:w1 0");
    assert_string_equal(s, j[0].raw);
    assert_string_equal(sval("HGET llmq:job:a1 status"), "running");
    assert_string_equal(sval("HGET llmq:job:a1 worker"), "w1");
    assert_string_equal(sval("HGET llmq:job:a1 queue"), "short");
    /* the delivery is counted once it runs (rq_attempt), not at fetch */
    assert_string_equal(sval("HGET llmq:job:a1 attempts"), "0");
    assert_false(j[0].counted);
    const char *started = sval("HGET llmq:job:a1 started_at");
    assert_true(fabs(strtod(started, NULL) - rq_wall_s()) < 5);
    assert_int_equal(ival("HEXISTS llmq:job:a1 created_at"), 1);
    assert_int_equal(rq_held_count(q), 1);
    /* an event for the state change */
    redisReply *ev = cmd("XREVRANGE llmq:events + - COUNT 1");
    assert_int_equal(ev->elements, 1);
    assert_string_equal(rs_stream_field(ev->element[0], "status"), "running");
    assert_string_equal(rs_stream_field(ev->element[0], "id"), "a1");
    freeReplyObject(ev);
    /* nothing more: a non-blocking fetch returns 0 at once */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j + 1), 0);
    ack_all(q, j, 1);
    assert_int_equal(rq_held_count(q), 0);
    rq_free(q);
}

static void test_batch_fifo(void **state)
{
    struct rq *q = open_rq("w1");
    struct rq_source src = {"short", 100};
    struct rq_job j[64];
    /* the first script call on a connection loads the scripts (one round trip, once) */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 20, 0, j), 0);
    struct rq_push_item items[50];
    char raws[50][64], ids[50][16];
    for (int i = 0; i < 50; i++) {
        snprintf(ids[i], sizeof ids[i], "j%02d", i);
        snprintf(raws[i], sizeof raws[i], "{\"id\":\"%.15s\",\"prompt\":\"p\"}", ids[i]);
        items[i] = (struct rq_push_item){raws[i], strlen(raws[i]), ids[i], NULL};
    }
    assert_int_equal(rq_push(q, "short", NULL, RQ_PUSH_FORCE, items, 50), 0);
    uint64_t rt = q->cmd.round_trips;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 20, 0, j), 20);
    assert_int_equal(q->cmd.round_trips - rt, 2); /* the whole batch: moved, then marked running */
    for (int i = 0; i < 20; i++)                  /* first pushed, first fetched */
        assert_string_equal(j[i].id, ids[i]);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 20);
    assert_int_equal(ival("LLEN llmq:queue:short"), 30);
    ack_all(q, j, 20);
    /* the per-queue limit binds too */
    src.max = 7;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 20, 0, j), 7);
    assert_string_equal(j[0].id, "j20");
    ack_all(q, j, 7);
    rq_free(q);
}

static void test_priority_and_round_robin(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "s", 3);
    rq_test_push_n(q, "long", "l", 3);
    struct rq_source src[2] = {{"short", 10}, {"long", 10}};
    struct rq_job j[16];
    /* priority: all of short, then long */
    assert_int_equal(rq_fetch(q, src, 2, RQ_ORDER_PRIORITY, 4, 0, j), 4);
    assert_string_equal(j[0].id, "s0");
    assert_string_equal(j[1].id, "s1");
    assert_string_equal(j[2].id, "s2");
    assert_string_equal(j[3].id, "l0");
    assert_string_equal(j[3].queue, "long");
    assert_string_equal(sval("HGET llmq:job:l0 queue"), "long");
    ack_all(q, j, 4);

    run("FLUSHALL");
    rq_test_push_n(q, "short", "s", 3);
    rq_test_push_n(q, "long", "l", 3);
    /* round robin: one each in turn, the longer queue finishing alone */
    src[1].max = 10;
    assert_int_equal(rq_fetch(q, src, 2, RQ_ORDER_ROUND_ROBIN, 5, 0, j), 5);
    const char *want[] = {"s0", "l0", "s1", "l1", "s2"};
    for (int i = 0; i < 5; i++)
        assert_string_equal(j[i].id, want[i]);
    ack_all(q, j, 5);
    /* a lane that is full takes nothing: long max 0 */
    rq_test_push_n(q, "short", "t", 2);
    src[1].max = 0;
    assert_int_equal(rq_fetch(q, src, 2, RQ_ORDER_ROUND_ROBIN, 10, 0, j), 2);
    assert_string_equal(j[0].id, "t0");
    assert_string_equal(j[1].id, "t1");
    assert_int_equal(ival("LLEN llmq:queue:long"), 1);
    ack_all(q, j, 2);
    /* model queues: sources of one group share its budget (4 in all, not 4 each) */
    run("FLUSHALL");
    rq_test_push_n(q, "m-1:short", "m", 3);
    rq_test_push_n(q, "short", "u", 3);
    struct rq_source lane[2] = {{"m-1:short", 4}, {"short", 4}};
    const int group[2] = {1, 1};
    assert_int_equal(rq_fetch_grouped(q, lane, group, 2, RQ_ORDER_PRIORITY, 10, 0, 0, j), 4);
    const char *want_g[] = {"m0", "m1", "m2", "u0"};
    for (int i = 0; i < 4; i++)
        assert_string_equal(j[i].id, want_g[i]);
    assert_string_equal(j[0].queue, "m-1:short");
    assert_string_equal(sval("HGET llmq:job:m0 queue"), "m-1:short");
    assert_int_equal(ival("LLEN llmq:queue:short"), 2);
    ack_all(q, j, 4);
    /* bad sources are refused */
    struct rq_source bad = {"a b:short", 1};
    assert_int_equal(rq_fetch(q, &bad, 1, RQ_ORDER_PRIORITY, 1, 0, j), -1);
    assert_non_null(strstr(rq_error(q), "not a queue name"));
    rq_free(q);
}

static double mono_ms(void)
{
    return (double)rq_mono_ms();
}

static void test_blocking(void **state)
{
    struct rq *q = open_rq("w1");
    struct rq_source src[2] = {{"short", 4}, {"long", 4}};
    struct rq_job j[8];
    /* nothing comes: returns 0 after about block_ms */
    double t0 = mono_ms();
    assert_int_equal(rq_fetch(q, src, 2, RQ_ORDER_PRIORITY, 4, 300, j), 0);
    double dt = mono_ms() - t0;
    assert_true(dt >= 250 && dt < 1500);

    /* a job pushed by another client (redis-cli, not llmq) while we block wakes the fetch up,
     * on the second queue as well as the first */
    rq_test_lpush_later(0.3, "long", "'{\"id\":\"cli-1\",\"prompt\":\"from redis-cli\"}'");
    t0 = mono_ms();
    int n = 0;
    for (int i = 0; i < 10 && n == 0; i++) /* block_ms 1000 split between the two queues */
        n = rq_fetch(q, src, 2, RQ_ORDER_PRIORITY, 4, 1000, j);
    dt = mono_ms() - t0;
    assert_int_equal(n, 1);
    assert_true(dt < 2500);
    assert_string_equal(j[0].id, "cli-1");
    assert_string_equal(j[0].queue, "long");
    assert_string_equal(j[0].raw, "{\"id\":\"cli-1\",\"prompt\":\"from redis-cli\"}");
    assert_int_equal(j[0].attempts, 1);
    assert_string_equal(sval("HGET llmq:job:cli-1 status"), "running");
    ack_all(q, j, 1);

    /* after a blocking wake-up, what else waits comes in the same call */
    rq_test_lpush_later(0.3, "short", "'{\"id\":\"b1\"}' '{\"id\":\"b2\"}' '{\"id\":\"b3\"}'");
    n = 0;
    for (int i = 0; i < 10 && n == 0; i++)
        n = rq_fetch(q, src, 2, RQ_ORDER_PRIORITY, 4, 1000, j);
    assert_int_equal(n, 3);
    assert_string_equal(j[0].id, "b1");
    assert_string_equal(j[1].id, "b2");
    assert_string_equal(j[2].id, "b3");
    assert_int_equal(ival("LLEN llmq:processing:w1"), 3);
    ack_all(q, j, 3);
    /* the blocking calls ran on their own connection */
    assert_true(q->blk.commands > 0);
    rq_free(q);
}

/* A job without an id gets one at fetch, written into the processing list, so that after a
 * crash the replayed job has the same id. */
static void test_id_assigned_and_kept_across_crash(void **state)
{
    char out[256];
    assert_int_equal(redis_cli(&srv, out, sizeof out, "LPUSH llmq:queue:short '{\"prompt\":\"no id here\"}'"),
                     0);
    struct rq *q = open_rq("crashy");
    struct rq_source src = {"short", 4};
    struct rq_job j[4];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 4, 0, j), 1);
    assert_true(j[0].id_assigned);
    assert_int_equal(strlen(j[0].id), 36);
    char id[RQ_ID_MAX + 1];
    assert_int_equal(rq_job_id(j[0].raw, j[0].len, 0, id), RQ_ID_FOUND);
    assert_string_equal(id, j[0].id);
    /* the processing list holds the JSON with the id */
    const char *inlist = sval("LINDEX llmq:processing:crashy 0");
    assert_string_equal(inlist, j[0].raw);
    assert_int_equal(ival("LLEN llmq:processing:crashy"), 1);
    assert_string_equal(sval("HGET llmq:job:%s status", j[0].id), "running");
    assert_string_equal(sval("HGET llmq:job:%s attempts", j[0].id), "0"); /* not counted at fetch */
    struct rq_job *run1 = &j[0];
    assert_int_equal(rq_attempt(q, &run1, 1), 0); /* it runs: this delivery counts */
    assert_string_equal(sval("HGET llmq:job:%s attempts", j[0].id), "1");
    char first_id[RQ_ID_MAX + 1];
    strcpy(first_id, j[0].id);
    char first_raw[256];
    snprintf(first_raw, sizeof first_raw, "%s", j[0].raw);
    rq_job_free(&j[0]);
    rq_free(q); /* "crash": no ack, no heartbeat (so the reaper sees it lapsed) */
    run("SADD llmq:workers crashy");
    run("SET llmq:lapsed:crashy 1 PX 1000"); /* lapsed long ago: its grace is over (reaper.h) */

    struct rq *q2 = open_rq("survivor");
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(q2, &rr), 0);
    assert_int_equal(rr.workers, 1);
    assert_int_equal(rr.requeued, 1);
    assert_int_equal(rq_fetch(q2, &src, 1, RQ_ORDER_PRIORITY, 4, 0, j), 1);
    assert_string_equal(j[0].id, first_id); /* same id */
    assert_string_equal(j[0].raw, first_raw);
    assert_false(j[0].id_assigned);
    assert_int_equal(j[0].attempts, 2);
    ack_all(q2, j, 1);
    rq_free(q2);
}

static void test_jobs_without_usable_id(void **state)
{
    struct rq *q = open_rq("w1");
    const char *oai =
        "{\"custom_id\":\"req-1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}";
    const char *oai_noid = "{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}";
    const char *nul = "{\"id\":null,\"prompt\":\"p\"}";
    const char *garbage = "this is not JSON";
    rq_test_push(q, "short", oai, NULL);
    rq_test_push(q, "short", oai_noid, NULL);
    rq_test_push(q, "short", nul, NULL);
    rq_test_push(q, "short", garbage, NULL);
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j), 4);
    /* find them by content */
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        if (!strcmp(j[i].raw, oai)) { /* an OpenAI line is known by its custom_id, unchanged */
            assert_string_equal(j[i].id, "req-1");
            assert_int_equal(j[i].attempts, 1);
            seen |= 1;
        } else if (!strcmp(j[i].raw, oai_noid)) { /* left alone: the parser will fail it */
            assert_string_equal(j[i].id, "");
            assert_int_equal(j[i].attempts, 0);
            seen |= 2;
        } else if (!strcmp(j[i].raw, garbage)) {
            assert_string_equal(j[i].id, "");
            assert_false(j[i].id_assigned);
            seen |= 4;
        } else { /* "id": null got an id */
            assert_true(j[i].id_assigned);
            json_t *root = json_loads(j[i].raw, JSON_REJECT_DUPLICATES, NULL);
            assert_non_null(root);
            assert_string_equal(json_string_value(json_object_get(root, "id")), j[i].id);
            json_decref(root);
            seen |= 8;
        }
    }
    assert_int_equal(seen, 15);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 4);
    ack_all(q, j, 4);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    rq_free(q);
}

static void test_cancel_seen_at_fetch(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_id(q, "short", "c1");
    rq_test_push_id(q, "short", "c2");
    char out[64];
    assert_int_equal(redis_cli(&srv, out, sizeof out, "SADD llmq:cancel c2"), 0);
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j), 2);
    assert_false(j[0].cancel_requested);
    assert_true(j[1].cancel_requested);
    struct rq_result res[2] = {
        {.job = &j[0], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1},
        {.job = &j[1], .status = RQ_STATUS_CANCELLED, .prompt_tokens = -1, .completion_tokens = 0},
    };
    assert_int_equal(rq_ack(q, res, 2), 2);
    assert_string_equal(sval("HGET llmq:job:c2 status"), "cancelled");
    assert_int_equal(ival("SISMEMBER llmq:cancel c2"), 0); /* cleaned up */
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(q);
}

/* A fetch whose reply was lost (the connection died after Redis moved the jobs) leaves jobs in
 * the processing list that rq does not know about; the next fetch puts them back first. A job
 * whose start step ran (its hash says running) gets that delivery back; one only moved (its
 * hash still queued) counted none, so nothing is taken off. */
static void test_reconcile_lost_fetch(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "r", 4);
    run("HSET llmq:job:r2 attempts 1"); /* r2 was delivered once before */
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, j), 1); /* r0: really held */
    /* as if a fetch had moved r1 and marked it running, and the reply never came */
    redisReply *r = cmd("LMOVE llmq:queue:short llmq:processing:w1 RIGHT LEFT");
    freeReplyObject(r);
    run("HSET llmq:job:r1 status running worker w1"); /* marked running: not counted yet */
    /* and one that moved r2 and lost its reply before the start step */
    r = cmd("LMOVE llmq:queue:short llmq:processing:w1 RIGHT LEFT");
    freeReplyObject(r);
    q->need_reconcile = true;
    assert_int_equal(ival("LLEN llmq:processing:w1"), 3);
    /* the next fetch first puts r1 and r2 back at the front, then fetches them properly */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j + 1), 3);
    assert_false(q->need_reconcile);
    int seen = 0;
    for (int i = 1; i < 4; i++) {
        if (!strcmp(j[i].id, "r1")) {
            assert_int_equal(j[i].attempts, 1); /* the lost delivery was not counted */
            seen |= 1;
        } else if (!strcmp(j[i].id, "r2")) {
            assert_int_equal(j[i].attempts, 2); /* the one before still counts */
            seen |= 2;
        } else {
            assert_string_equal(j[i].id, "r3");
            seen |= 4;
        }
    }
    assert_int_equal(seen, 7);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 4);
    /* with nothing unknown, reconcile does nothing */
    assert_int_equal(rq_reconcile(q), 0);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 4);
    ack_all(q, j, 4);
    rq_free(q);
}

/* Pushes n jobs of exactly `bytes` bytes each (ids <prefix>0..), in fetch order. */
static void push_sized(struct rq *q, const char *prefix, int n, size_t bytes)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        char *raw = malloc(bytes + 1);
        assert_non_null(raw);
        int h = snprintf(raw, bytes + 1, "{\"id\":\"%s\",\"prompt\":\"", id);
        assert_true(h > 0 && (size_t)h + 2 < bytes);
        memset(raw + h, 'x', bytes - (size_t)h - 2);
        memcpy(raw + bytes - 2, "\"}", 3);
        rq_test_push(q, "short", raw, id);
        free(raw);
    }
}

/* One fetch takes jobs while it has moved fewer than fetch_max_bytes: at most the bound plus
 * one job, and always one, so a job larger than the bound still moves. What it leaves stays
 * queued, untouched, in order. */
static void test_byte_bound(void **state)
{
    struct rq_opts o = rq_test_opts(srv.url, "w1");
    o.fetch_max_bytes = 3000;
    struct rq *q = rq_test_open(&o);
    push_sized(q, "s", 5, 1000);
    push_sized(q, "b", 1, 5000);
    push_sized(q, "t", 1, 1000);
    struct rq_source src = {"short", 100};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 100, 0, j), 3); /* 3000 bytes */
    assert_string_equal(j[0].id, "s0");
    assert_string_equal(j[2].id, "s2");
    assert_int_equal(rq_held_bytes(q), 3000);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 3);
    assert_string_equal(sval("HGET llmq:job:s3 status"), "queued"); /* untouched */
    assert_int_equal(ival("LLEN llmq:queue:short"), 4);
    ack_all(q, j, 3);
    assert_int_equal(rq_held_bytes(q), 0);
    /* s3, s4 (2000 bytes, under the bound), then the big one crosses it: the last taken */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 100, 0, j), 3);
    assert_string_equal(j[1].id, "s4");
    assert_string_equal(j[2].id, "b0");
    assert_int_equal(j[2].len, 5000);
    assert_int_equal(j[2].attempts, 1);
    assert_string_equal(sval("HGET llmq:job:b0 status"), "running");
    assert_int_equal(rq_held_bytes(q), 7000);
    ack_all(q, j, 3);
    /* a caller's budget binds too; a job over it moves when it is the first */
    push_sized(q, "u", 3, 1000);
    assert_int_equal(rq_fetch_grouped(q, &src, NULL, 1, RQ_ORDER_PRIORITY, 100, 500, 0, j), 1);
    assert_string_equal(j[0].id, "t0");
    ack_all(q, j, 1);
    assert_int_equal(rq_fetch_grouped(q, &src, NULL, 1, RQ_ORDER_PRIORITY, 100, 2000, 0, j), 2);
    assert_string_equal(j[1].id, "u1");
    ack_all(q, j, 2);
    assert_int_equal(rq_fetch_grouped(q, &src, NULL, 1, RQ_ORDER_PRIORITY, 100, 2000, 0, j), 1);
    assert_string_equal(j[0].id, "u2");
    ack_all(q, j, 1);
    rq_free(q);
}

/* Duplicates among the jobs of one fetch are taken out at their own places: the jobs around
 * them stay in the processing list and are handed out in order. */
static void test_duplicates_in_a_batch(void **state)
{
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "e", 5);
    run("HSET llmq:job:e1 status completed");
    run("HSET llmq:job:e3 status running worker w1");
    run("LPUSH llmq:queue:short {\"prompt\":\"noid\"}");
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j), 4);
    assert_string_equal(j[0].id, "e0");
    assert_string_equal(j[1].id, "e2");
    assert_string_equal(j[2].id, "e4");
    assert_true(j[3].id_assigned);
    assert_int_equal(q->duplicates, 2);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 4);
    for (int i = 0; i < 4; i++) { /* the list holds exactly what was handed out (the new id included) */
        const char *s = sval("LINDEX llmq:processing:w1 %d", 3 - i);
        assert_string_equal(s, j[i].raw);
    }
    assert_string_equal(sval("HGET llmq:job:e1 status"), "completed");
    ack_all(q, j, 4);
    rq_free(q);
}

/* A worker killed between the two steps of a fetch (jobs moved, not yet marked running): its
 * jobs are in its processing list with their hashes still queued; the reaper puts them back
 * without counting a delivery, and the next fetch runs them as first deliveries. */
static void test_crash_between_steps(void **state)
{
    struct rq *q = open_rq("survivor");
    rq_test_push_n(q, "short", "k", 2);
    redisReply *r = cmd("LMOVE llmq:queue:short llmq:processing:gone RIGHT LEFT");
    freeReplyObject(r);
    r = cmd("LMOVE llmq:queue:short llmq:processing:gone RIGHT LEFT");
    freeReplyObject(r);
    run("SADD llmq:workers gone"); /* no heartbeat: it has lapsed */
    rq_test_lapsed_long_ago("gone");
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(q, &rr), 0);
    assert_int_equal(rr.requeued, 2);
    assert_int_equal(rr.dead, 0);
    assert_int_equal(ival("LLEN llmq:processing:gone"), 0);
    assert_string_equal(sval("HGET llmq:job:k0 status"), "queued");
    assert_string_equal(sval("HGET llmq:job:k0 attempts"), "0");
    struct rq_source src = {"short", 8};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 8, 0, j), 2);
    assert_string_equal(j[0].id, "k0"); /* in their order */
    assert_int_equal(j[0].attempts, 1);
    assert_int_equal(j[1].attempts, 1);
    ack_all(q, j, 2);
    rq_free(q);
}

/* Two workers fetching concurrently never get the same job. */
static void test_two_workers_disjoint(void **state)
{
    struct rq *a = open_rq("wa"), *b = open_rq("wb");
    rq_test_push_n(a, "short", "d", 40);
    struct rq_source src = {"short", 100};
    struct rq_job ja[64], jb[64];
    int na = 0, nb = 0;
    while (na + nb < 40) {
        int k = rq_fetch(a, &src, 1, RQ_ORDER_PRIORITY, 3, 0, ja + na);
        assert_true(k >= 0);
        na += k;
        k = rq_fetch(b, &src, 1, RQ_ORDER_PRIORITY, 5, 0, jb + nb);
        assert_true(k >= 0);
        nb += k;
    }
    assert_int_equal(na + nb, 40);
    for (int x = 0; x < na; x++)
        for (int y = 0; y < nb; y++)
            assert_string_not_equal(ja[x].id, jb[y].id);
    assert_int_equal(ival("LLEN llmq:processing:wa"), na);
    assert_int_equal(ival("LLEN llmq:processing:wb"), nb);
    ack_all(a, ja, na);
    ack_all(b, jb, nb);
    rq_free(a);
    rq_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fetch_one, rq_test_flush),
        cmocka_unit_test_setup(test_batch_fifo, rq_test_flush),
        cmocka_unit_test_setup(test_priority_and_round_robin, rq_test_flush),
        cmocka_unit_test_setup(test_blocking, rq_test_flush),
        cmocka_unit_test_setup(test_id_assigned_and_kept_across_crash, rq_test_flush),
        cmocka_unit_test_setup(test_jobs_without_usable_id, rq_test_flush),
        cmocka_unit_test_setup(test_cancel_seen_at_fetch, rq_test_flush),
        cmocka_unit_test_setup(test_reconcile_lost_fetch, rq_test_flush),
        cmocka_unit_test_setup(test_byte_bound, rq_test_flush),
        cmocka_unit_test_setup(test_duplicates_in_a_batch, rq_test_flush),
        cmocka_unit_test_setup(test_crash_between_steps, rq_test_flush),
        cmocka_unit_test_setup(test_two_workers_disjoint, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
