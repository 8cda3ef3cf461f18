/* queue/heartbeat.c against a real redis-server: who holds a worker id. A second instance under a
 * live id is refused and writes nothing; force_id takes the id over and the first learns it at its
 * next heartbeat; a hash without a token (written by hand, or by an older worker) counts as another
 * instance's; a lapsed hash is claimed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "queue/heartbeat.h"
#include "queue/rq.h"
#include "rq_test.h"

static struct rq *open_rq(const char *worker, bool force)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.heartbeat_ttl_s = 30;
    o.force_id = force;
    return rq_test_open(&o);
}

static void test_one_holder(void **state)
{
    struct rq *a = open_rq("w", false), *b = open_rq("w", false);
    assert_int_equal(rq_heartbeat(a, NULL), 0);
    assert_true(a->claimed);
    assert_string_equal(sval("HGET llmq:worker:w instance"), a->instance);
    /* b is refused: nothing written, the holder and its TTL told */
    run("HSET llmq:worker:w marker 1");
    assert_int_equal(rq_heartbeat(b, NULL), RQ_HB_TAKEN);
    assert_true(b->id_taken);
    assert_false(b->claimed);
    assert_string_equal(b->holder.instance, a->instance);
    assert_int_equal(b->holder.pid, (long long)getpid());
    assert_true(b->holder.ttl_ms > 25000 && b->holder.ttl_ms <= 30000);
    assert_non_null(strstr(rq_error(b), "worker id w is in use"));
    assert_int_equal(ival("HEXISTS llmq:worker:w marker"), 1); /* untouched */
    /* a keeps beating */
    assert_int_equal(rq_heartbeat(a, NULL), 0);
    rq_free(a);
    rq_free(b);
}

static void test_force_and_taken_over(void **state)
{
    struct rq *a = open_rq("w", false), *c = open_rq("w", true);
    assert_int_equal(rq_heartbeat(a, NULL), 0);
    assert_int_equal(rq_heartbeat(c, NULL), 0); /* force_id */
    assert_string_equal(c->holder.instance, a->instance);
    assert_string_equal(sval("HGET llmq:worker:w instance"), c->instance);
    /* a learns it at its next heartbeat and writes nothing */
    assert_int_equal(rq_heartbeat(a, NULL), RQ_HB_TAKEN);
    assert_non_null(strstr(rq_error(a), "was taken over"));
    assert_string_equal(sval("HGET llmq:worker:w instance"), c->instance);
    /* c's later heartbeats do not force anything: it holds the id */
    assert_int_equal(rq_heartbeat(c, NULL), 0);
    rq_free(a);
    rq_free(c);
}

static void test_no_token_and_lapsed(void **state)
{
    struct rq *a = open_rq("w", false);
    /* a hash with no token, held by another host: another instance */
    run("HSET llmq:worker:w host elsewhere pid 1");
    run("EXPIRE llmq:worker:w 30");
    assert_int_equal(rq_heartbeat(a, NULL), RQ_HB_TAKEN);
    assert_string_equal(a->holder.instance, "(none)");
    assert_string_equal(a->holder.host, "elsewhere");
    /* once it has lapsed, the id is free */
    run("DEL llmq:worker:w");
    assert_int_equal(rq_heartbeat(a, NULL), 0);
    assert_int_equal(ival("SISMEMBER llmq:workers w"), 1);
    rq_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_one_holder, rq_test_flush),
        cmocka_unit_test_setup(test_force_and_taken_over, rq_test_flush),
        cmocka_unit_test_setup(test_no_token_and_lapsed, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
