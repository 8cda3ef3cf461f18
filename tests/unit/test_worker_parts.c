/* The worker's pure parts: lane room and routing (worker/loop/lanes.h), metrics percentiles and rows
 * (worker/metrics/metrics.h); the held-job lists are engine/util/list.h's (tests/unit/test_list.c). The
 * loop itself is tested end to end by tests/cli/test_worker_*.sh against a real redis-server. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "worker/jobs/job.h"
#include "worker/loop/lanes.h"
#include "worker/metrics/metrics.h"

static struct wk_lanes two_lanes(void)
{
    struct wk_lanes l;
    memset(&l, 0, sizeof l);
    l.serve[WK_LANE_SHORT] = l.serve[WK_LANE_LONG] = true;
    l.order[0] = WK_LANE_SHORT;
    l.order[1] = WK_LANE_LONG;
    l.cap[WK_LANE_SHORT] = 320;
    l.cap[WK_LANE_LONG] = 20;
    l.global_cap = 320;
    l.max_model_len[WK_LANE_SHORT] = 4096;
    l.max_model_len[WK_LANE_LONG] = 4096;
    l.long_threshold = 100;
    return l;
}

static void test_sources_idle(void **state)
{
    (void)state;
    struct wk_lanes l = two_lanes();
    struct engine_stats st;
    memset(&st, 0, sizeof st);
    struct rq_source src[2];
    int total = -1;
    assert_int_equal(wk_lanes_sources(&l, &st, src, &total), 2);
    assert_string_equal(src[0].queue, "short");
    assert_string_equal(src[1].queue, "long");
    assert_int_equal(src[0].max, 320);
    /* the long lane gets its own room even though the short lane could take all of the global */
    assert_int_equal(src[1].max, 20);
    assert_int_equal(total, 320);
}

static void test_sources_busy(void **state)
{
    (void)state;
    struct wk_lanes l = two_lanes();
    struct engine_stats st;
    memset(&st, 0, sizeof st);
    st.lane_running[WK_LANE_SHORT] = 250;
    st.lane_waiting[WK_LANE_SHORT] = 10;
    st.lane_running[WK_LANE_LONG] = 15;
    st.lane_waiting[WK_LANE_LONG] = 10; /* over its cap: no room, not negative */
    st.running = 265;
    st.waiting = 20;
    struct rq_source src[2];
    int total;
    wk_lanes_sources(&l, &st, src, &total);
    assert_int_equal(src[0].max, 35); /* 320 - 285 global room is less than the lane's 60 */
    assert_int_equal(src[1].max, 0);
    assert_int_equal(total, 35);
    st.running = 400; /* over the global cap */
    wk_lanes_sources(&l, &st, src, &total);
    assert_int_equal(src[0].max, 0);
    assert_int_equal(total, 0);
}

static void test_sources_one_queue(void **state)
{
    (void)state;
    struct wk_lanes l = two_lanes();
    l.serve[WK_LANE_SHORT] = false;
    l.order[0] = WK_LANE_LONG;
    l.order[1] = -1;
    struct engine_stats st;
    memset(&st, 0, sizeof st);
    struct rq_source src[2];
    int total;
    assert_int_equal(wk_lanes_sources(&l, &st, src, &total), 1);
    assert_string_equal(src[0].queue, "long");
    assert_int_equal(total, 20);
}

static void test_route(void **state)
{
    (void)state;
    struct wk_lanes l = two_lanes();
    assert_int_equal(wk_lanes_route(&l, WK_LANE_SHORT, JOB_OK, 100), WK_ROUTE_HERE);
    assert_int_equal(wk_lanes_route(&l, WK_LANE_SHORT, JOB_OK, 101), WK_ROUTE_LONG);
    assert_int_equal(wk_lanes_route(&l, WK_LANE_LONG, JOB_OK, 5000), WK_ROUTE_HERE);
    assert_int_equal(wk_lanes_route(&l, WK_LANE_LONG, JOB_OK, 3), WK_ROUTE_HERE); /* long stays long */
    assert_int_equal(wk_lanes_route(&l, WK_LANE_SHORT, JOB_ERR_CONTEXT, 0), WK_ROUTE_FAIL); /* same lengths */
    l.max_model_len[WK_LANE_SHORT] = 1024;
    assert_int_equal(wk_lanes_route(&l, WK_LANE_SHORT, JOB_ERR_CONTEXT, 0), WK_ROUTE_LONG);
    assert_int_equal(wk_lanes_route(&l, WK_LANE_LONG, JOB_ERR_CONTEXT, 0), WK_ROUTE_FAIL);
    assert_int_equal(wk_lanes_route(&l, WK_LANE_SHORT, JOB_ERR_INVALID, 0), WK_ROUTE_FAIL);
    assert_string_equal(wk_lane_queue(WK_LANE_LONG), "long");
    assert_int_equal(wk_lane_of_queue("long"), WK_LANE_LONG);
    assert_int_equal(wk_lane_of_queue("short"), WK_LANE_SHORT);
}

/* numpy.percentile(x, p) (linear interpolation) for the same inputs */
static void test_percentile(void **state)
{
    (void)state;
    double v[100];
    for (int i = 0; i < 100; i++)
        v[i] = 100 - i; /* unsorted: 100 .. 1 */
    assert_true(fabs(wk_percentile(v, 100, 50) - 50.5) < 1e-12);
    assert_true(fabs(wk_percentile(v, 100, 95) - 95.05) < 1e-12);
    assert_true(fabs(wk_percentile(v, 100, 0) - 1) < 1e-12);
    assert_true(fabs(wk_percentile(v, 100, 100) - 100) < 1e-12);
    double w[] = {7, 1, 3};
    assert_true(fabs(wk_percentile(w, 3, 50) - 3) < 1e-12);
    assert_true(fabs(wk_percentile(w, 3, 95) - 6.6) < 1e-12);
    double one[] = {4};
    assert_true(fabs(wk_percentile(one, 1, 95) - 4) < 1e-12);
    assert_true(isnan(wk_percentile(NULL, 0, 50)));
}

static void test_metrics_row(void **state)
{
    (void)state;
    struct engine_stats st;
    memset(&st, 0, sizeof st);
    st.prompt_tokens = 100;
    st.generated_tokens = 50;
    st.prefix_query_tokens = 100; /* the hit rate is in tokens, as the counters beside it */
    st.prefix_hit_tokens = 20;
    st.prefix_queries = 10; /* block lookups: not what the row reports */
    st.prefix_hits = 9;
    struct wk_metrics m;
    wk_metrics_init(&m, 10.0, &st);
    wk_metrics_job(&m, 0, 5, 1, 20);
    wk_metrics_job(&m, 1, NAN, NAN, 3); /* failed before its first token */
    wk_metrics_job(&m, 0, 15, 3, 40);
    st.prompt_tokens = 300;
    st.generated_tokens = 450;
    st.prefix_query_tokens = 300;
    st.prefix_hit_tokens = 120;
    st.prefix_queries = 20;
    st.prefix_hits = 10;
    st.running = 3;
    st.waiting = 1;
    st.kv_blocks_used = 25;
    st.kv_blocks_total = 100;
    st.preemptions = 2;
    struct db_metrics r;
    wk_metrics_row(&m, 12.0, 1e9, &st, &r);
    assert_int_equal(r.jobs_done, 3);
    assert_int_equal(r.jobs_failed, 1);
    assert_true(fabs(r.interval_s - 2) < 1e-12);
    assert_true(fabs(r.prompt_tokens_per_s - 100) < 1e-9);
    assert_true(fabs(r.generation_tokens_per_s - 200) < 1e-9);
    assert_true(fabs(r.ttft_p50_ms - 10) < 1e-12);
    assert_true(fabs(r.itl_p50_ms - 2) < 1e-12);
    assert_true(fabs(r.e2e_p50_ms - 20) < 1e-12);
    assert_true(fabs(r.e2e_p95_ms - 38) < 1e-12);
    assert_true(fabs(r.kv_usage - 0.25) < 1e-12);
    assert_true(fabs(r.prefix_cache_hit_rate - 0.5) < 1e-12);
    assert_int_equal(r.prefix_cache_queries, 200);
    assert_int_equal(r.prefix_cache_hits, 100);
    assert_int_equal(r.preemptions, 2);
    assert_int_equal(r.running, 3);
    assert_int_equal(r.waiting, 1);
    /* the next interval starts empty */
    wk_metrics_row(&m, 13.0, 1e9 + 1, &st, &r);
    assert_int_equal(r.jobs_done, 0);
    assert_true(isnan(r.ttft_p50_ms));
    assert_true(fabs(r.generation_tokens_per_s) < 1e-12);
    assert_true(isnan(r.prefix_cache_hit_rate));
    wk_metrics_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sources_idle),      cmocka_unit_test(test_sources_busy),
        cmocka_unit_test(test_sources_one_queue), cmocka_unit_test(test_route),
        cmocka_unit_test(test_percentile),        cmocka_unit_test(test_metrics_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
