/* worker/metrics/histogram.c: bucket edges (le is inclusive), the +Inf bucket, NAN and infinities, the
 * batch observation, bad bounds, and random observations against a direct count of x <= bound. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/metrics/histogram.h"

static void test_edges(void **state)
{
    static const double b[] = {0.1, 1, 10};
    struct hist h;
    assert_int_equal(hist_init(&h, b, 3), 0);
    assert_int_equal(h.n, 3);
    for (int i = 0; i <= 3; i++)
        assert_int_equal(hist_cumulative(&h, i), 0);
    hist_observe(&h, 0.1);  /* on a bound: that bucket */
    hist_observe(&h, 0.05); /* below the first */
    hist_observe(&h, 1.0000001);
    hist_observe(&h, 10);
    hist_observe(&h, 11);  /* above the last: +Inf only */
    hist_observe(&h, NAN); /* ignored */
    assert_int_equal(h.count, 5);
    assert_int_equal(hist_cumulative(&h, 0), 2);
    assert_int_equal(hist_cumulative(&h, 1), 2);
    assert_int_equal(hist_cumulative(&h, 2), 4);
    assert_int_equal(hist_cumulative(&h, 3), 5);
    assert_int_equal(hist_cumulative(&h, 99), 5);
    assert_int_equal(hist_cumulative(&h, -1), 0);
    assert_true(fabs(h.sum - (0.1 + 0.05 + 1.0000001 + 10 + 11)) < 1e-12);
    assert_true(hist_bound(&h, 0) == 0.1 && hist_bound(&h, 2) == 10);
    assert_true(isinf(hist_bound(&h, 3)) && hist_bound(&h, 3) > 0);

    hist_observe(&h, -INFINITY); /* first bucket; the sum follows (as the Prometheus clients do) */
    assert_int_equal(hist_cumulative(&h, 0), 3);
    assert_true(isinf(h.sum) && h.sum < 0);
    hist_observe(&h, INFINITY); /* +Inf only */
    assert_int_equal(hist_cumulative(&h, 2), 5);
    assert_int_equal(hist_cumulative(&h, 3), 7);
}

static void test_observe_n(void **state)
{
    static const double b[] = {0.01, 0.1};
    struct hist h, g;
    hist_init(&h, b, 2);
    hist_init(&g, b, 2);
    hist_observe_n(&h, 0.05, 7);
    for (int i = 0; i < 7; i++)
        hist_observe(&g, 0.05);
    assert_int_equal(h.count, 7);
    assert_int_equal(hist_cumulative(&h, 0), 0);
    assert_int_equal(hist_cumulative(&h, 1), 7);
    assert_true(fabs(h.sum - g.sum) < 1e-12);
    assert_memory_equal(h.bucket, g.bucket, sizeof h.bucket);
    hist_observe_n(&h, 0.05, 0); /* nothing */
    hist_observe_n(&h, NAN, 3);
    assert_int_equal(h.count, 7);
}

static void test_bad_bounds(void **state)
{
    struct hist h;
    static const double dec[] = {1, 0.5}, dup[] = {1, 1}, nan_[] = {1, NAN}, inf[] = {1, INFINITY};
    double many[HIST_MAX_BOUNDS + 1];
    for (int i = 0; i <= HIST_MAX_BOUNDS; i++)
        many[i] = i + 1;
    assert_int_equal(hist_init(&h, dec, 2), -1);
    assert_int_equal(h.n, 0);
    assert_int_equal(hist_init(&h, dup, 2), -1);
    assert_int_equal(hist_init(&h, nan_, 2), -1);
    assert_int_equal(hist_init(&h, inf, 2), -1);
    assert_int_equal(hist_init(&h, many, 0), -1);
    assert_int_equal(hist_init(&h, NULL, 1), -1);
    assert_int_equal(hist_init(&h, many, HIST_MAX_BOUNDS + 1), -1);
    assert_int_equal(hist_init(&h, many, HIST_MAX_BOUNDS), 0);
    /* an empty histogram (n = 0) still counts, all in +Inf */
    struct hist e;
    hist_init(&e, dec, 2);
    hist_observe(&e, 3);
    assert_int_equal(hist_cumulative(&e, 0), 1);
}

/* The built-in bucket sets are valid and match vLLM's ends. */
static void test_builtin_bounds(void **state)
{
    struct hist h;
    assert_int_equal(hist_init(&h, HIST_TTFT_BOUNDS, HIST_TTFT_N), 0);
    assert_true(HIST_TTFT_BOUNDS[0] == 0.001 && HIST_TTFT_BOUNDS[HIST_TTFT_N - 1] == 2560);
    assert_int_equal(hist_init(&h, HIST_ITL_BOUNDS, HIST_ITL_N), 0);
    assert_true(HIST_ITL_BOUNDS[0] == 0.01 && HIST_ITL_BOUNDS[HIST_ITL_N - 1] == 80);
    assert_int_equal(hist_init(&h, HIST_LATENCY_BOUNDS, HIST_LATENCY_N), 0);
    assert_true(HIST_LATENCY_BOUNDS[0] == 0.3 && HIST_LATENCY_BOUNDS[HIST_LATENCY_N - 1] == 7680);
    assert_int_equal(hist_init(&h, HIST_QUEUE_BOUNDS, HIST_QUEUE_N), 0);
    /* queue time: vLLM's request latency buckets, then longer ones */
    assert_memory_equal(HIST_QUEUE_BOUNDS, HIST_LATENCY_BOUNDS, sizeof(double) * (size_t)HIST_LATENCY_N);
    assert_true(HIST_QUEUE_BOUNDS[HIST_QUEUE_N - 1] == 86400);
}

/* Random values (many on the bounds themselves) against a direct count. */
static void test_random_against_count(void **state)
{
    struct hist h;
    hist_init(&h, HIST_TTFT_BOUNDS, HIST_TTFT_N);
    enum { N = 20000 };
    static double x[N];
    srand(7);
    double sum = 0;
    for (int i = 0; i < N; i++) {
        int r = rand();
        x[i] = r % 4 == 0 ? HIST_TTFT_BOUNDS[r % HIST_TTFT_N] : exp((double)(r % 20000) / 1000.0 - 9.0);
        hist_observe(&h, x[i]);
        sum += x[i];
    }
    for (int b = 0; b <= HIST_TTFT_N; b++) {
        uint64_t want = 0;
        for (int i = 0; i < N; i++)
            want += b == HIST_TTFT_N || x[i] <= HIST_TTFT_BOUNDS[b];
        assert_int_equal(hist_cumulative(&h, b), want);
    }
    assert_int_equal(h.count, N);
    assert_true(fabs(h.sum - sum) <= 1e-9 * sum);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_observe_n),
        cmocka_unit_test(test_bad_bounds),
        cmocka_unit_test(test_builtin_bounds),
        cmocka_unit_test(test_random_against_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
