/* queue/progress.c, queue/ack.c and queue/requeue.c against a real redis-server: progress of 256
 * jobs pipelined in one round trip (counted on both sides), acks of many jobs in one transaction,
 * the final hash with its TTL, the events stream and its cap, and jobs given back on shutdown or
 * moved to the long queue. */
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
#include "queue/requeue.h"
#include "queue/rq.h"
#include "rq_test.h"

/* Also zeroes INFO commandstats, which calls() reads. */
static int setup(void **state)
{
    if (rq_test_flush(state))
        return -1;
    redisReply *r = redisCommand(adm, "CONFIG RESETSTAT");
    if (r)
        freeReplyObject(r);
    return 0;
}

static struct rq *open_rq(const char *worker, int events_maxlen, int result_ttl_s)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    if (events_maxlen > 0)
        o.events_maxlen = events_maxlen;
    o.result_ttl_s = result_ttl_s;
    return rq_test_open(&o);
}

/* Pushes n jobs "<tag><i>" and fetches them all into jobs[]. */
static void push_fetch(struct rq *q, const char *queue, const char *tag, int n, struct rq_job *jobs)
{
    struct rq_push_item *items = calloc((size_t)n, sizeof *items);
    char(*raw)[96] = calloc((size_t)n, sizeof *raw);
    char(*ids)[32] = calloc((size_t)n, sizeof *ids);
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof ids[i], "%s%d", tag, i);
        snprintf(raw[i], sizeof raw[i], "{\"id\":\"%s\",\"prompt\":\"x\",\"max_tokens\":4}", ids[i]);
        items[i] = (struct rq_push_item){raw[i], strlen(raw[i]), ids[i], NULL};
    }
    assert_int_equal(rq_push(q, queue, NULL, RQ_PUSH_FORCE, items, n), 0);
    struct rq_source src = {queue, n};
    int got = 0;
    while (got < n) {
        int k = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, n - got, 0, jobs + got);
        assert_true(k > 0);
        got += k;
    }
    free(items);
    free(raw);
    free(ids);
}

/* calls=N of one command in INFO commandstats */
static long long calls(const char *command)
{
    redisReply *r = cmd("INFO commandstats");
    char key[64];
    snprintf(key, sizeof key, "cmdstat_%s:calls=", command);
    const char *p = strstr(r->str, key);
    long long v = p ? strtoll(p + strlen(key), NULL, 10) : 0;
    freeReplyObject(r);
    return v;
}

static void test_progress_256_one_round_trip(void **state)
{
    struct rq *q = open_rq("w1", 0, 3600);
    enum { N = 256 };
    struct rq_job *jobs = calloc(N, sizeof *jobs);
    push_fetch(q, "short", "p", N, jobs);
    struct rq_progress pr[N];
    double ft = rq_wall_s();
    for (int i = 0; i < N; i++)
        pr[i] = (struct rq_progress){jobs[i].id, (i + 1) / (double)N, 10 + i, i, ft, 0, 0, 0};
    uint64_t rt = q->cmd.round_trips, sent = q->cmd.commands;
    long long hset = calls("hset"), xadd = calls("xadd");
    assert_int_equal(rq_progress(q, pr, N), 0);
    /* our side: one round trip, 2 commands per job, 512 replies read */
    assert_int_equal(q->cmd.round_trips - rt, 1);
    assert_int_equal(q->cmd.commands - sent, 2 * N);
    assert_int_equal(q->pipe.nreply, 2 * N);
    /* the server's side: it executed exactly those */
    assert_int_equal(calls("hset") - hset, N);
    assert_int_equal(calls("xadd") - xadd, N);
    /* and the hashes say so */
    for (int i = 0; i < N; i += 51) {
        char want[32];
        snprintf(want, sizeof want, "%.4f", (i + 1) / (double)N);
        assert_string_equal(sval("HGET llmq:job:%s progress", jobs[i].id), want);
        snprintf(want, sizeof want, "%d", i);
        assert_string_equal(sval("HGET llmq:job:%s completion_tokens", jobs[i].id), want);
        snprintf(want, sizeof want, "%d", 10 + i);
        assert_string_equal(sval("HGET llmq:job:%s prompt_tokens", jobs[i].id), want);
        assert_string_equal(sval("HGET llmq:job:%s status", jobs[i].id), "running");
    }
    /* the last event is the last job's progress */
    redisReply *ev = cmd("XREVRANGE llmq:events + - COUNT 1");
    assert_string_equal(rs_stream_field(ev->element[0], "id"), jobs[N - 1].id);
    assert_string_equal(rs_stream_field(ev->element[0], "progress"), "1.0000");
    assert_string_equal(rs_stream_field(ev->element[0], "worker"), "w1");
    freeReplyObject(ev);
    /* "leave as is" leaves it */
    struct rq_progress only = {jobs[0].id, -1, -1, 99, 0, 0, 0, 0};
    assert_int_equal(rq_progress(q, &only, 1), 0);
    assert_string_equal(sval("HGET llmq:job:%s completion_tokens", jobs[0].id), "99");
    assert_string_equal(sval("HGET llmq:job:%s prompt_tokens", jobs[0].id), "10");

    /* ack all 256 in one script call, one round trip */
    struct rq_result *res = calloc(N, sizeof *res);
    for (int i = 0; i < N; i++)
        res[i] = (struct rq_result){.job = &jobs[i],
                                    .status = RQ_STATUS_COMPLETED,
                                    .prompt_tokens = 10 + i,
                                    .completion_tokens = 4,
                                    .finish_reason = "length"};
    rt = q->cmd.round_trips;
    long long evalsha = calls("evalsha");
    assert_int_equal(rq_ack(q, res, N), N);
    assert_int_equal(q->cmd.round_trips - rt, 1);
    assert_int_equal(calls("evalsha") - evalsha, 1);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_int_equal(rq_held_count(q), 0);
    for (int i = 0; i < N; i += 37) {
        assert_string_equal(sval("HGET llmq:job:%s status", jobs[i].id), "completed");
        assert_string_equal(sval("HGET llmq:job:%s progress", jobs[i].id), "1");
        assert_string_equal(sval("HGET llmq:job:%s finish_reason", jobs[i].id), "length");
        assert_string_equal(sval("HGET llmq:job:%s completion_tokens", jobs[i].id), "4");
        assert_int_equal(ival("HEXISTS llmq:job:%s finished_at", jobs[i].id), 1);
        long long ttl = ival("TTL llmq:job:%s", jobs[i].id);
        assert_true(ttl > 3500 && ttl <= 3600);
    }
    for (int i = 0; i < N; i++)
        rq_job_free(&jobs[i]);
    free(jobs);
    free(res);
    rq_free(q);
}

static void test_ack_states_and_errors(void **state)
{
    struct rq *q = open_rq("w1", 0, 0); /* result_ttl 0: hashes never expire */
    struct rq_job j[3];
    push_fetch(q, "short", "a", 3, j);
    /* an old error (from an earlier attempt) is removed on success */
    run("HSET llmq:job:a0 error %s", "earlier failure");
    run("SADD llmq:cancel a2");
    struct rq_result res[3] = {
        {.job = &j[0],
         .status = RQ_STATUS_COMPLETED,
         .prompt_tokens = 5,
         .completion_tokens = 2,
         .first_token_at = 1700000000.5},
        {.job = &j[1],
         .status = RQ_STATUS_FAILED,
         .error = "engine_error: out of KV blocks",
         .prompt_tokens = -1,
         .completion_tokens = -1},
        {.job = &j[2], .status = RQ_STATUS_CANCELLED, .prompt_tokens = -1, .completion_tokens = 1},
    };
    assert_int_equal(rq_ack(q, res, 3), 3);
    assert_int_equal(ival("HEXISTS llmq:job:a0 error"), 0);
    assert_string_equal(sval("HGET llmq:job:a0 first_token_at"), "1700000000.500");
    assert_string_equal(sval("HGET llmq:job:a1 status"), "failed");
    assert_string_equal(sval("HGET llmq:job:a1 error"), "engine_error: out of KV blocks");
    assert_string_equal(sval("HGET llmq:job:a1 progress"), "0"); /* not set to 1: it did not finish */
    assert_string_equal(sval("HGET llmq:job:a2 status"), "cancelled");
    assert_int_equal(ival("SISMEMBER llmq:cancel a2"), 0);
    assert_int_equal(ival("TTL llmq:job:a0"), -1);
    /* events: one per final state, with the status */
    redisReply *ev = cmd("XREVRANGE llmq:events + - COUNT 3");
    assert_int_equal(ev->elements, 3);
    assert_string_equal(rs_stream_field(ev->element[0], "status"), "cancelled");
    assert_string_equal(rs_stream_field(ev->element[1], "status"), "failed");
    assert_string_equal(rs_stream_field(ev->element[1], "error"), "engine_error: out of KV blocks");
    assert_string_equal(rs_stream_field(ev->element[2], "status"), "completed");
    freeReplyObject(ev);
    /* acking again (a retry after a lost reply) is harmless: nothing held any more */
    assert_int_equal(rq_ack(q, res, 3), 0);
    assert_string_equal(sval("HGET llmq:job:a1 status"), "failed");
    for (int i = 0; i < 3; i++)
        rq_job_free(&j[i]);
    rq_free(q);
}

/* A job that was taken from us (reaped) is not in our list any more: the ack says so. */
static void test_ack_not_held(void **state)
{
    struct rq *q = open_rq("w1", 0, 60);
    struct rq_job j[2];
    push_fetch(q, "short", "n", 2, j);
    run("LREM llmq:processing:w1 0 %s", j[1].raw);
    struct rq_result res[2] = {
        {.job = &j[0], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1},
        {.job = &j[1], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1},
    };
    assert_int_equal(rq_ack(q, res, 2), 1);
    assert_string_equal(sval("HGET llmq:job:n1 status"), "completed"); /* the result stands */
    assert_int_equal(rq_held_count(q), 0);
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(q);
}

static void test_events_capped(void **state)
{
    struct rq *q = open_rq("w1", 100, 60);
    struct rq_job j[1];
    push_fetch(q, "short", "e", 1, j);
    struct rq_progress pr[100];
    for (int i = 0; i < 100; i++)
        pr[i] = (struct rq_progress){j[0].id, i / 100.0, -1, i, 0, 0, 0, 0};
    for (int round = 0; round < 30; round++)
        assert_int_equal(rq_progress(q, pr, 100), 0);
    /* 3000 events with MAXLEN ~ 100: trimmed in whole macro nodes, so about 100, never 3000 */
    long long len = ival("XLEN llmq:events");
    assert_true(len >= 100 && len < 400);
    struct rq_result res = {
        .job = &j[0], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, &res, 1), 1);
    rq_job_free(&j[0]);
    rq_free(q);
}

/* Shutdown: what a worker still holds goes back to the FRONT of its queue (fetched next), in
 * the order it was fetched, and the interrupted delivery does not count. */
static void test_requeue_on_shutdown(void **state)
{
    struct rq *q = open_rq("w1", 0, 60);
    struct rq_job j[5];
    push_fetch(q, "short", "s", 3, j);
    push_fetch(q, "long", "l", 1, j + 3);
    /* a newcomer arrived meanwhile */
    char out[64];
    assert_int_equal(redis_cli(&srv, out, sizeof out, "LPUSH llmq:queue:short '{\"id\":\"late\"}'"), 0);
    const struct rq_job *back[4] = {&j[0], &j[1], &j[2], &j[3]}; /* in the order they were fetched */
    assert_int_equal(rq_requeue(q, back, 4, NULL, "shutdown"), 4);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_int_equal(ival("LLEN llmq:queue:long"), 1); /* each to where it came from */
    assert_string_equal(sval("HGET llmq:job:s0 status"), "queued");
    assert_string_equal(sval("HGET llmq:job:s0 attempts"), "0");
    for (int i = 0; i < 4; i++)
        rq_job_free(&j[i]);
    /* the next worker gets them before the newcomer, oldest first */
    struct rq *q2 = open_rq("w2", 0, 60);
    struct rq_source src = {"short", 10};
    assert_int_equal(rq_fetch(q2, &src, 1, RQ_ORDER_PRIORITY, 10, 0, j), 4);
    assert_string_equal(j[0].id, "s0");
    assert_string_equal(j[1].id, "s1");
    assert_string_equal(j[2].id, "s2");
    assert_string_equal(j[3].id, "late");
    assert_int_equal(j[0].attempts, 1);
    const struct rq_job *all[4] = {&j[0], &j[1], &j[2], &j[3]};
    /* routing: a prompt too long for the short lane moves to the long queue */
    assert_int_equal(rq_requeue(q2, all, 1, "long", "route_long"), 1);
    assert_string_equal(sval("HGET llmq:job:s0 queue"), "long");
    assert_string_equal(sval("LINDEX llmq:queue:long -1"), j[0].raw);
    redisReply *ev = cmd("XREVRANGE llmq:events + - COUNT 1");
    assert_string_equal(rs_stream_field(ev->element[0], "reason"), "route_long");
    freeReplyObject(ev);
    /* a job no longer held is not pushed twice */
    assert_int_equal(rq_requeue(q2, all, 1, "long", "route_long"), 0);
    assert_int_equal(ival("LLEN llmq:queue:long"), 2);
    assert_int_equal(rq_requeue(q2, all + 1, 3, NULL, "shutdown"), 3);
    for (int i = 0; i < 4; i++)
        rq_job_free(&j[i]);
    rq_free(q2);
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_progress_256_one_round_trip, setup),
        cmocka_unit_test_setup(test_ack_states_and_errors, setup),
        cmocka_unit_test_setup(test_ack_not_held, setup),
        cmocka_unit_test_setup(test_events_capped, setup),
        cmocka_unit_test_setup(test_requeue_on_shutdown, setup),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
