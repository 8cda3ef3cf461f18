/* The queue path's micro-benchmark (queue/bench.c) against a real redis-server: prints how long
 * a worker's fetch + progress + ack round for 256 jobs takes here, over TCP and the unix socket.
 * Not a timed test: it checks only what does not depend on the machine (every job acked, four
 * round trips per round), and prints the numbers for docs/PERFORMANCE.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/bench.h"
#include "queue/fetch.h"
#include "queue/rq.h"
#include "rq_test.h"

static void bench_over(const char *url, const char *what)
{
    struct rq_opts o = rq_test_opts(url, "bench");
    struct rq *q = rq_test_open(&o);
    struct rq_bench b;
    if (rq_bench(q, "short", 8, 1, 512, &b)) /* warm-up: connect, load the scripts */
        fail_msg("bench: %s", rq_error(q));
    if (rq_bench(q, "short", 256, 40, 512, &b))
        fail_msg("bench: %s", rq_error(q));
    printf(
        "bench-queue %s: 256 jobs x 512 B, mean of %d rounds: fetch %.3f ms, progress %.3f ms, ack %.3f ms, "
        "round %.3f ms (best %.3f ms) = %.0f jobs/s through the worker's side; push %.3f ms; "
        "%llu round trips per round\n",
        what, b.rounds, b.fetch_ms, b.progress_ms, b.ack_ms, b.round_ms, b.best_round_ms, b.jobs_per_s,
        b.push_ms, b.round_trips);
    printf("{\"bench\":\"queue\",\"transport\":\"%s\",\"jobs\":%d,\"rounds\":%d,\"fetch_ms\":%.3f,"
           "\"progress_ms\":%.3f,\"ack_ms\":%.3f,\"round_ms\":%.3f,\"best_round_ms\":%.3f,\"jobs_per_s\":%."
           "0f}\n",
           what, b.jobs, b.rounds, b.fetch_ms, b.progress_ms, b.ack_ms, b.round_ms, b.best_round_ms,
           b.jobs_per_s);
    fflush(stdout);
    assert_int_equal(b.round_trips, 4); /* fetch (move, start), progress, ack, for all 256 jobs */
    assert_int_equal(rq_held_count(q), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 0);
    assert_int_equal(ival("LLEN llmq:processing:bench"), 0);
    rq_free(q);
}

static void test_bench_tcp(void **state)
{
    bench_over(srv.url, "tcp");
}

static void test_bench_unix(void **state)
{
    bench_over(srv.sock, "unix");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_tcp),
        cmocka_unit_test(test_bench_unix),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
