/* queue/reaper.c's lookup of committed rows (rq_reap_set_lookup) against a real redis-server: a
 * lapsed worker's job whose row the caller's store has for that very delivery is acknowledged by
 * the reaper (and by a restart's recovery) with the row's status and result, its batch counted,
 * instead of being dead-lettered (max_stalls 1) or put back; a row of an earlier delivery or
 * of another worker is not taken for it; a line without an id whose failed row is committed is
 * dead-lettered with it, not failed again. The store here is a table in memory standing in for the
 * worker's SQLite file (worker/loop/committed.c reads the real one; the CLI test
 * test_worker_commit_crash.sh runs the whole path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/ack.h"
#include "queue/attempt.h"
#include "queue/batch.h"
#include "queue/fetch.h"
#include "queue/push.h"
#include "queue/reaper.h"
#include "queue/rq.h"
#include "rq_test.h"

/* The rows the store has: id, worker, started_at (0 = the fetch's time as Redis has it, + dt).
 * A row of a line without an id has id NULL and the line's text in `line` (one row per line). */
struct row {
    const char *id, *worker;
    double dt;
    bool failed; /* a failed row (bad input) instead of a completed one */
    const char *line;
};
static struct row rows[4];
static int nrows, lookups;

static int lookup(void *ctx, const char *id, const char *worker, const char *line, size_t len, int nth,
                  struct rq_done *out)
{
    (void)ctx;
    lookups++;
    for (int i = 0; i < nrows; i++) {
        if (!id) {
            if (rows[i].id || strcmp(rows[i].worker, worker) || strlen(rows[i].line) != len ||
                memcmp(rows[i].line, line, len) || nth != 1)
                continue;
            out->worker = strdup(rows[i].worker);
            out->status = RQ_STATUS_FAILED;
            out->error = strdup("invalid JSON (line 1, column 1): '[' or '{' expected near 'not'");
            out->error_code = strdup("invalid_json");
            return 1;
        }
        if (!rows[i].id || strcmp(rows[i].id, id))
            continue;
        out->worker = strdup(rows[i].worker);
        out->started_at = strtod(sval("HGET llmq:job:%s started_at", id), NULL) + rows[i].dt;
        if (rows[i].failed) {
            out->status = RQ_STATUS_FAILED;
            out->error = strdup("unknown field 'promt'");
            out->error_code = strdup("invalid_request");
            return 1;
        }
        out->status = RQ_STATUS_COMPLETED;
        out->finish_reason = strdup("length");
        out->prompt_tokens = 5;
        out->completion_tokens = 7;
        out->first_token_at = 1.7e9;
        char res[128];
        snprintf(res, sizeof res, "{\"id\":\"%s\",\"status\":\"completed\",\"text\":\"done\"}", id);
        out->result = strdup(res);
        return 1;
    }
    return 0;
}

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.max_attempts = 1;
    o.max_stalls = 1;
    return rq_test_open(&o);
}

/* `worker` fetches the n jobs, runs them (their delivery counts) and dies without acking. */
static void run_and_die(const char *worker, int n)
{
    struct rq *q = open_rq(worker);
    struct rq_source src = {"short", n};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, n, 0, j), n);
    struct rq_job *run[8];
    for (int i = 0; i < n; i++)
        run[i] = &j[i];
    assert_int_equal(rq_attempt(q, run, n), 0);
    for (int i = 0; i < n; i++)
        rq_job_free(&j[i]);
    rq_free(q); /* no heartbeat: lapsed */
    run("SADD llmq:workers %s", worker);
    rq_test_lapsed_long_ago(worker);
}

static void test_reaper_acks_committed(void **state)
{
    struct rq *client = open_rq("client");
    assert_int_equal(rq_batch_open(client, "b1", "in.jsonl", false), RQ_BATCH_CREATED);
    struct rq_push_item it[4] = {{"{\"id\":\"k0\",\"prompt\":\"x\"}", 24, "k0", NULL},
                                 {"{\"id\":\"k1\",\"prompt\":\"x\"}", 24, "k1", NULL},
                                 {"{\"id\":\"k2\",\"prompt\":\"x\"}", 24, "k2", NULL},
                                 {"{\"id\":\"k3\",\"prompt\":\"x\"}", 24, "k3", NULL}};
    assert_int_equal(rq_push(client, "short", "b1", RQ_PUSH_NEW, it, 4), 0);
    assert_int_equal(rq_batch_seal(client, "b1"), 0);
    run_and_die("gone", 4);
    /* k0: committed for this delivery; k1: a row from an earlier delivery (fetched before);
     * k2: a row another worker wrote; k3: no row */
    nrows = 3;
    rows[0] = (struct row){"k0", "gone", 0.05, false, NULL};
    rows[1] = (struct row){"k1", "gone", -60, false, NULL};
    rows[2] = (struct row){"k2", "other", 0.05, false, NULL};
    struct rq *r = open_rq("reaper");
    rq_reap_set_lookup(r, lookup, NULL);
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(lookups, 4);
    assert_int_equal(rr.acked, 1);
    assert_int_equal(rr.dead, 3); /* max_attempts 1: the others ran once and crashed */
    assert_int_equal(ival("LLEN llmq:processing:gone"), 0);
    assert_string_equal(sval("HGET llmq:job:k0 status"), "completed");
    assert_string_equal(sval("HGET llmq:job:k0 result"), "{\"id\":\"k0\",\"status\":\"completed\",\"text\":\"done\"}");
    assert_string_equal(sval("HGET llmq:job:k0 finish_reason"), "length");
    assert_string_equal(sval("HGET llmq:job:k0 completion_tokens"), "7");
    assert_string_equal(sval("HGET llmq:job:k0 worker"), "gone");
    assert_int_equal(ival("HEXISTS llmq:job:k0 error"), 0);
    assert_true(ival("TTL llmq:job:k0") > 0);
    for (int i = 1; i < 4; i++)
        assert_string_equal(sval("HGET llmq:job:k%d status", i), "failed");
    assert_int_equal(ival("LLEN llmq:dead"), 3);
    /* the batch counts it completed, and the batch is complete */
    assert_string_equal(sval("HGET llmq:batch:b1 completed"), "1");
    assert_string_equal(sval("HGET llmq:batch:b1 failed"), "3");
    assert_string_equal(sval("HGET llmq:batch:b1 running"), "0");
    assert_string_equal(sval("HGET llmq:batch:b1 state"), "completed");
    /* an event like the worker's own ack */
    redisReply *ev = cmd("XREVRANGE llmq:events + - COUNT 20");
    int completed = 0;
    for (size_t i = 0; i < ev->elements; i++) {
        redisReply *f = ev->element[i]->element[1];
        if (!strcmp(f->element[1]->str, "k0") && !strcmp(f->element[3]->str, "completed"))
            completed++;
    }
    freeReplyObject(ev);
    assert_int_equal(completed, 1);
    rq_free(r);
    rq_free(client);
}

/* A committed failed row (bad input) is dead-lettered with its error, as the worker would have;
 * a job that is not JSON goes back to its queue (the next fetch fails it with a row), unless its
 * failed row is committed: then it is dead-lettered with that row (one of two identical lines,
 * when only one row is there). */
static void test_failed_row_and_not_json(void **state)
{
    struct rq *client = open_rq("client");
    rq_test_push_n(client, "short", "f", 1);
    run("LPUSH llmq:queue:short %s", "not json at all");
    run("LPUSH llmq:queue:short %s", "not json, failed");
    run("LPUSH llmq:queue:short %s", "not json, failed");
    run_and_die("gone2", 4);
    nrows = 2;
    rows[0] = (struct row){"f0", "gone2", 0.01, true, NULL};
    rows[1] = (struct row){NULL, "gone2", 0, true, "not json, failed"};
    struct rq *r = open_rq("reaper2");
    rq_reap_set_lookup(r, lookup, NULL);
    struct rq_reap_result rr;
    assert_int_equal(rq_reap(r, &rr), 0);
    assert_int_equal(rr.acked, 2);
    assert_int_equal(rr.requeued, 2);
    assert_int_equal(rr.dead, 0);
    assert_string_equal(sval("HGET llmq:job:f0 status"), "failed");
    assert_string_equal(sval("HGET llmq:job:f0 error_code"), "invalid_request");
    assert_int_equal(ival("LLEN llmq:dead"), 2);
    char dead[2][512];
    snprintf(dead[0], sizeof dead[0], "%s", sval("LINDEX llmq:dead 0"));
    snprintf(dead[1], sizeof dead[1], "%s", sval("LINDEX llmq:dead 1"));
    assert_true((strstr(dead[0], "invalid_request") && strstr(dead[1], "invalid_json")) ||
                (strstr(dead[1], "invalid_request") && strstr(dead[0], "invalid_json")));
    assert_non_null(strstr(strstr(dead[0], "invalid_json") ? dead[0] : dead[1], "not json, failed"));
    assert_int_equal(ival("LLEN llmq:queue:short"), 2);
    char q0[64];
    snprintf(q0, sizeof q0, "%s", sval("LINDEX llmq:queue:short 0"));
    const char *q1 = sval("LINDEX llmq:queue:short 1");
    assert_true((!strcmp(q0, "not json at all") && !strcmp(q1, "not json, failed")) ||
                (!strcmp(q1, "not json at all") && !strcmp(q0, "not json, failed")));
    rq_free(r);
    rq_free(client);
}

/* A restart under the same id acknowledges its own committed job while recovering. */
static void test_recover_acks_committed(void **state)
{
    struct rq *client = open_rq("client");
    rq_test_push_n(client, "short", "m", 2);
    run_and_die("fixed", 2);
    nrows = 1;
    rows[0] = (struct row){"m1", "fixed", 0.01, false, NULL};
    struct rq *q = open_rq("fixed");
    rq_reap_set_lookup(q, lookup, NULL);
    struct rq_reap_result rr;
    assert_int_equal(rq_recover(q, &rr), 0);
    assert_int_equal(rr.acked, 1);
    assert_int_equal(rr.dead, 1);
    assert_string_equal(sval("HGET llmq:job:m1 status"), "completed");
    assert_string_equal(sval("HGET llmq:job:m0 status"), "failed");
    /* without a lookup nothing is asked: the old behaviour */
    rq_test_push_id(client, "short", "p0");
    run_and_die("plain", 1);
    rows[0] = (struct row){"p0", "plain", 0.01, false, NULL};
    rq_reap_set_lookup(q, NULL, NULL);
    int before = lookups;
    assert_int_equal(rq_reap(q, &rr), 0);
    assert_int_equal(lookups, before);
    assert_int_equal(rr.dead, 1);
    assert_int_equal(rr.acked, 0);
    rq_free(q);
    rq_free(client);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_reaper_acks_committed, rq_test_flush),
        cmocka_unit_test_setup(test_recover_acks_committed, rq_test_flush),
        cmocka_unit_test_setup(test_failed_row_and_not_json, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
