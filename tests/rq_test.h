/* The shared fixture of the Redis integration tests, tests/unit/test_rq_*.c (header-only; each
 * test is its own program, so the state below is per program). Include it after <cmocka.h>.
 *
 * One real redis-server (tests/redis_server.h) per test program, started by the group setup, a
 * plain connection `adm` to look at what rq did, and helpers to open an rq and push jobs:
 *
 *     static void test_x(void **state)
 *     {
 *         struct rq_opts o = rq_test_opts(srv.url, "w1");
 *         o.max_attempts = 3;                          // whatever the test needs
 *         struct rq *q = rq_test_open(&o);
 *         rq_test_push_n(q, "short", "j", 4);          // jobs j0 .. j3
 *         assert_int_equal(ival("LLEN llmq:queue:short"), 4);
 *         rq_free(q);
 *     }
 *
 *     int main(void)
 *     {
 *         const struct CMUnitTest tests[] = {cmocka_unit_test_setup(test_x, rq_test_flush)};
 *         return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
 *     }
 *
 * A test that needs its own server (other options, restarts) may start one in `srv` itself and
 * clean it up, without the group hooks. Every helper fails the test (cmocka) on an error. */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/push.h"
#include "queue/rq.h"
#include "redis_server.h"

static struct redis_server srv; /* the program's redis-server */
static redisContext *adm;       /* a plain connection to it, for looking at what rq did */

/* Assertions on adm (see rs_cmd and the others in redis_server.h). */
#define cmd(...) rs_cmd(adm, __VA_ARGS__)
#define ival(...) rs_int(adm, __VA_ARGS__)
#define sval(...) rs_str(adm, __VA_ARGS__)
#define run(...) rs_do(adm, __VA_ARGS__)

/* Worker `name` was found lapsed longer ago than the reaper's grace (the mark a reaper leaves,
 * aged): the next rq_reap reaps it at once. */
static inline void rq_test_lapsed_long_ago(const char *name)
{
    run("SET llmq:lapsed:%s 1 PX 1000", name);
}

/* Group setup: skips the program (exit 77) without redis-server, starts srv (default options)
 * and connects adm. -1 (every test fails) when the server does not start; its log says why. */
static inline int rq_test_group_setup(void **state)
{
    (void)state;
    redis_server_require();
    if (redis_server_start(&srv, NULL)) {
        fprintf(stderr, "cannot start redis-server (see %s)\n", srv.log);
        return -1;
    }
    adm = redis_server_connect(&srv);
    return adm ? 0 : -1;
}

/* Group teardown: closes adm, stops srv and removes its temp dir. */
static inline int rq_test_group_teardown(void **state)
{
    (void)state;
    if (adm)
        redisFree(adm);
    adm = NULL;
    redis_server_cleanup(&srv);
    return 0;
}

/* Per-test setup: FLUSHALL through adm, so each test starts from an empty server. */
static inline int rq_test_flush(void **state)
{
    (void)state;
    redisReply *r = redisCommand(adm, "FLUSHALL");
    if (!r)
        return -1;
    freeReplyObject(r);
    return 0;
}

/* rq_opts_default with url and worker id set and the connections' log lines off; the caller sets
 * what else its test needs. The strings are borrowed. */
static inline struct rq_opts rq_test_opts(const char *url, const char *worker)
{
    struct rq_opts o;
    rq_opts_default(&o);
    o.url = url;
    o.worker_id = worker;
    o.quiet = true;
    return o;
}

/* rq_open(o); fails the test with rq_open's message when it refuses. The caller rq_frees it. */
static inline struct rq *rq_test_open(const struct rq_opts *o)
{
    struct rq *q;
    char err[512];
    if (rq_open(o, &q, err, sizeof err))
        fail_msg("rq_open: %s", err);
    return q;
}

/* Pushes one job (raw JSON with the given id) onto queue; fails the test if rq_push fails. */
static inline void rq_test_push(struct rq *q, const char *queue, const char *raw, const char *id)
{
    struct rq_push_item it = {raw, strlen(raw), id, NULL};
    if (rq_push(q, queue, NULL, RQ_PUSH_FORCE, &it, 1))
        fail_msg("push: %s", rq_error(q));
}

/* Pushes the job {"id":"<id>","prompt":"x"} onto queue, as rq_test_push. */
static inline void rq_test_push_id(struct rq *q, const char *queue, const char *id)
{
    char raw[160];
    snprintf(raw, sizeof raw, "{\"id\":\"%s\",\"prompt\":\"x\"}", id);
    rq_test_push(q, queue, raw, id);
}

/* Pushes n jobs with ids <tag>0 .. <tag>n-1 (in that order, one rq_push each), as rq_test_push_id. */
static inline void rq_test_push_n(struct rq *q, const char *queue, const char *tag, int n)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", tag, i);
        rq_test_push_id(q, queue, id);
    }
}

/* Runs `redis-cli -p <port> LPUSH llmq:queue:<queue> <jobs>` in the background delay_s seconds
 * from now, for a blocking fetch to wait for. jobs is shell text: quote each job ('{"id":"x"}'). */
static inline void rq_test_lpush_later(double delay_s, const char *queue, const char *jobs)
{
    char bg[1024];
    snprintf(bg, sizeof bg, "(sleep %g; redis-cli -p %d LPUSH llmq:queue:%s %s) >/dev/null 2>&1 &", delay_s,
             srv.port, queue, jobs);
    assert_int_equal(system(bg), 0);
}
