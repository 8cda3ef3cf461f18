/* worker/jobs/summary_tree.c: groups of hand-made levels (order, coverage, the budget, pairs at the
 * end), failures (an input or two neighbours over the budget), the depth for documents of 5x and 50x
 * a context, and on random levels: every group fits and is maximal from the left, and the depth
 * with max-length summaries bounds the real tree's depth and every level's width. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/jobs/summary_tree.h"

/* groups of lens[0..n) as the ends they must have */
static void expect_groups(const int *lens, int n, int sep, int budget, const int *want, int n_want)
{
    int ends[64];
    assert_true(n <= 64);
    int g = summary_groups(lens, n, sep, budget, ends);
    assert_int_equal(g, n_want);
    for (int i = 0; i < n_want; i++)
        assert_int_equal(ends[i], want[i]);
}

static void test_hand_made(void **state)
{
    (void)state;
    static const int ten[] = {10, 10, 10, 10, 10, 10, 10};
    /* budget 32, sep 1: three of 10 take 32 */
    expect_groups(ten, 7, 1, 32, (const int[]){3, 5, 7}, 3); /* 3+3+1: the lone last takes one */
    expect_groups(ten, 6, 1, 32, (const int[]){3, 6}, 2);
    expect_groups(ten, 7, 0, 30, (const int[]){3, 5, 7}, 3);
    expect_groups(ten, 7, 1, 31, (const int[]){2, 4, 6, 7}, 4); /* pairs only: the last stays alone */
    expect_groups(ten, 7, 1, 1000, (const int[]){7}, 1);
    expect_groups(ten, 1, 1, 10, (const int[]){1}, 1); /* one input: one group */
    expect_groups(ten, 2, 1, 21, (const int[]){2}, 1);
    /* mixed lengths: greedy from the left, order kept */
    static const int mix[] = {5, 20, 3, 3, 3, 25, 1, 1};
    expect_groups(mix, 8, 2, 30, (const int[]){2, 5, 7, 8}, 4); /* [5 20][3 3 3][25 1][1] */
}

static void test_failures(void **state)
{
    (void)state;
    int ends[8];
    static const int ten[] = {10, 10, 10};
    assert_int_equal(summary_groups(ten, 3, 1, 20, ends), -1); /* 10 + 1 + 10 > 20 */
    assert_int_equal(summary_groups(ten, 2, 0, 19, ends), -1);
    assert_int_equal(summary_groups(ten, 1, 0, 9, ends), -1); /* one alone over the budget */
    static const int big[] = {5, 40, 5};
    assert_int_equal(summary_groups(big, 3, 0, 44, ends), -1); /* 5 + 40 > 44 */
    static const int neg[] = {5, -1};
    assert_int_equal(summary_groups(neg, 2, 0, 44, ends), -1);
    assert_int_equal(summary_groups(ten, 0, 0, 44, ends), -1);
    assert_int_equal(summary_groups(ten, 3, -1, 44, ends), -1);
    assert_int_equal(summary_depth(0, 10, 1, 100), -1);
    assert_int_equal(summary_depth(2, 50, 1, 100), -1); /* two summaries never fit */
    assert_int_equal(summary_depth(2, 50, 0, 100), 2);
    assert_int_equal(summary_depth(1, 500, 1, 100), 1); /* nothing to combine */
    assert_int_equal(summary_level_width(2, 50, 1, 100, 0), -1);
}

/* Documents of 5x and 50x a 512-token context: chunks of 512 - 64 (template) - 64 (output) = 384
 * tokens with an overlap of 32 (352 new tokens each), 64-token summaries joined by 2 tokens: a
 * reduce prompt takes floor((384 + 2) / 66) = 5 of them. */
static void test_depth_of_long_documents(void **state)
{
    (void)state;
    const int ctx = 512, tpl = 64, out = 64, sep = 2, budget = ctx - tpl - out, step = budget - 32;
    int n5 = (5 * ctx - 32 + step - 1) / step, n50 = (50 * ctx - 32 + step - 1) / step;
    assert_int_equal(n5, 8);
    assert_int_equal(n50, 73);
    assert_int_equal(summary_depth(n5, out, sep, budget), 3); /* 8 -> 2 -> 1 */
    assert_int_equal(summary_level_width(n5, out, sep, budget, 1), 2);
    assert_int_equal(summary_level_width(n5, out, sep, budget, 2), 1);
    assert_int_equal(summary_level_width(n5, out, sep, budget, 3), 0);
    assert_int_equal(summary_depth(n50, out, sep, budget), 4); /* 73 -> 15 -> 3 -> 1 */
    assert_int_equal(summary_level_width(n50, out, sep, budget, 1), 15);
    assert_int_equal(summary_level_width(n50, out, sep, budget, 2), 3);
    /* the GPU benchmark: 200,000 tokens in chunks of 8192 (overlap 128): 25 chunks, 256-token summaries */
    assert_int_equal(summary_depth(25, 256, 2, 8192), 2);
    assert_int_equal(summary_depth(32, 256, 2, 8192), 3); /* 31 fit one prompt */
    assert_int_equal(summary_depth(31, 256, 2, 8192), 2);
}

/* The groups' invariants on lens[0..n): order and coverage, each fits, greedy from the left (a group
 * ends where the next input would overflow it, but the last pair moved), at least 2 per group but a
 * lone last after a pair. */
static void check_invariants(const int *lens, int n, int sep, int budget, const int *ends, int g)
{
    assert_true(g >= 1 && g <= n);
    assert_int_equal(ends[g - 1], n);
    if (n >= 2)
        assert_true(g < n);
    for (int k = 0, lo = 0; k < g; lo = ends[k++]) {
        assert_true(ends[k] > lo);
        long long sum = -sep;
        for (int i = lo; i < ends[k]; i++)
            sum += sep + lens[i];
        assert_true(sum <= budget);
        int size = ends[k] - lo;
        if (n >= 2 && size < 2) /* a lone last input, after a pair that could not take it */
            assert_true(k == g - 1 && k > 0 && lo - (k > 1 ? ends[k - 2] : 0) == 2);
        bool moved = k == g - 2 && ends[g - 1] - ends[g - 2] == 2 && ends[k] < n; /* gave one to the last */
        if (ends[k] < n && !moved)
            assert_true(sum + sep + lens[ends[k]] > budget);
    }
}

/* Real depth: run the tree with summaries of random length <= max_len, level by level. */
static int real_depth(int n, int max_len, int sep, int budget, int *widths, unsigned *seed)
{
    int lens[512], ends[512], depth = 1;
    widths[0] = n;
    while (n > 1) {
        for (int i = 0; i < n; i++)
            lens[i] = (int)(rand_r(seed) % (unsigned)(max_len + 1));
        int g = summary_groups(lens, n, sep, budget, ends);
        assert_true(g > 0);
        check_invariants(lens, n, sep, budget, ends, g);
        n = g;
        widths[depth++] = n;
    }
    return depth;
}

static void test_random(void **state)
{
    (void)state;
    unsigned seed = 56;
    for (int it = 0; it < 20000; it++) {
        int max_len = 1 + (int)(rand_r(&seed) % 40), sep = (int)(rand_r(&seed) % 4);
        int budget = 2 * max_len + sep + (int)(rand_r(&seed) % (unsigned)(6 * max_len));
        int n = 1 + (int)(rand_r(&seed) % 300);
        int widths[600];
        int d = summary_depth(n, max_len, sep, budget);
        assert_true(d >= 1);
        int rd = real_depth(n, max_len, sep, budget, widths, &seed);
        assert_true(rd <= d);
        for (int l = 0; l < rd; l++)
            assert_true(widths[l] <= summary_level_width(n, max_len, sep, budget, l));
        /* max-length summaries give exactly the predicted tree */
        int lens[300], ends[300], m = n, levels = 1;
        while (m > 1) {
            for (int i = 0; i < m; i++)
                lens[i] = max_len;
            m = summary_groups(lens, m, sep, budget, ends);
            assert_int_equal(m, summary_level_width(n, max_len, sep, budget, levels));
            levels++;
        }
        assert_int_equal(levels, d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_made),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_depth_of_long_documents),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
