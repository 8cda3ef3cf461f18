/* engine/moe: top-k routing against a double-precision reference written here (sort all experts by
 * logit, ties to the lower index; softmax in double; renormalize over the selection or not), on random
 * logits of several widths and on constructed ties: all logits equal, equal pairs straddling the k-th
 * place, a NaN, and K == E. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/moe.h"

#include "cpu_test.h"

#define MAXE 256

/* The reference: idx[0 .. K) by (logit descending, index ascending), NaN last; w in double. */
static void ref_route(const float *l, int E, int K, bool norm, int *idx, double *w)
{
    int order[MAXE] = {0};
    for (int e = 0; e < E; e++)
        order[e] = e;
    for (int i = 0; i < E; i++) /* a plain selection sort: obviously right */
        for (int j = i + 1; j < E; j++) {
            const float a = l[order[i]], b = l[order[j]];
            const bool swap = isnan(a) ? !isnan(b) || order[j] < order[i]
                                       : !isnan(b) && (b > a || (b == a && order[j] < order[i]));
            if (swap) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        }
    double mx = l[order[0]], z = 0, zs = 0;
    for (int e = 0; e < E; e++)
        if (!isnan(l[e]))
            z += exp((double)l[e] - mx);
    for (int k = 0; k < K; k++) {
        idx[k] = order[k];
        zs += exp((double)l[order[k]] - mx);
    }
    for (int k = 0; k < K; k++)
        w[k] = exp((double)l[idx[k]] - mx) / (norm ? zs : z);
}

/* moe_route equals the reference: the same experts in the same order; each weight within what fp32 allows:
 * l_e - max rounded to fp32 (relative 2^-24 of d = |l_e - max|, which exp turns into a relative error of
 * d 2^-24), expf's 1 ulp, the final rounding, and the normalizer made of such terms:
 * |dw| <= (8e-7 + 1.2e-7 d) w. */
static void expect_route(const float *l, int E, int K, bool norm, const char *what)
{
    int idx[MAXE], ridx[MAXE];
    float w[MAXE];
    double rw[MAXE];
    moe_route(l, E, K, norm, idx, w);
    ref_route(l, E, K, norm, ridx, rw);
    double sum = 0;
    for (int k = 0; k < K; k++) {
        if (idx[k] != ridx[k])
            fail_msg("%s (E %d, K %d, norm %d): place %d is expert %d, the reference's %d", what, E, K, norm,
                     k, idx[k], ridx[k]);
        const double d = fabs((double)l[idx[k]] - (double)l[idx[0]]);
        if (!(fabs(w[k] - rw[k]) <= (8e-7 + 1.2e-7 * d) * rw[k] + 1e-37))
            fail_msg("%s (E %d, K %d, norm %d): weight %d is %.9g, the reference's %.9g", what, E, K, norm, k,
                     w[k], rw[k]);
        sum += w[k];
    }
    if (norm && fabs(sum - 1) > 1e-6 * K)
        fail_msg("%s: renormalized weights sum to %.9g", what, sum);
}

static void test_random_logits(void **state)
{
    (void)state;
    static const int shapes[][2] = {{8, 2}, {6, 3}, {128, 8}, {64, 6}, {60, 4}, {16, 1}, {7, 7}, {256, 8}};
    uint64_t s = 0x5eed;
    float l[MAXE];
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int rep = 0; rep < 50; rep++)
            for (int norm = 0; norm < 2; norm++) {
                const int E = shapes[i][0], K = shapes[i][1];
                const double scale = rep % 5 == 0 ? 30 : 3; /* peaked softmaxes too */
                for (int e = 0; e < E; e++)
                    l[e] = (float)(((double)(cpu_test_splitmix(&s) >> 11) * 0x1p-53 * 2 - 1) * scale);
                expect_route(l, E, K, norm, "random logits");
            }
}

static void test_ties(void **state)
{
    (void)state;
    float l[MAXE];
    int idx[MAXE];
    float w[MAXE];
    /* all equal: the K lowest indices, weight 1/E, or 1/K renormalized (exactly: powers of two) */
    for (int e = 0; e < 8; e++)
        l[e] = 0.5f;
    moe_route(l, 8, 2, false, idx, w);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 1);
    assert_true(w[0] == 0.125f && w[1] == 0.125f);
    moe_route(l, 8, 2, true, idx, w);
    assert_true(w[0] == 0.5f && w[1] == 0.5f);
    expect_route(l, 8, 2, true, "all equal");
    /* a tie straddling the K-th place: experts 5 and 2 tie for second, 2 (the lower index) wins */
    const float t[8] = {-1, 0, 2, 0, -3, 2, 3, 1};
    memcpy(l, t, sizeof t);
    moe_route(l, 8, 2, true, idx, w);
    assert_int_equal(idx[0], 6);
    assert_int_equal(idx[1], 2);
    moe_route(l, 8, 3, true, idx, w);
    assert_int_equal(idx[2], 5);
    assert_true(w[1] == w[2]);
    for (int K = 1; K <= 8; K++)
        for (int norm = 0; norm < 2; norm++)
            expect_route(l, 8, K, norm, "ties");
    /* K == E: every expert, sorted; renormalized weights are the softmax itself */
    expect_route(l, 8, 8, true, "K == E");
    /* a NaN logit ranks last */
    l[6] = NAN;
    moe_route(l, 8, 2, false, idx, w);
    assert_int_equal(idx[0], 2);
    assert_int_equal(idx[1], 5);
    expect_route(l, 8, 3, true, "NaN");
    /* -inf and a very large spread: weight 0 for an expert that exp underflows, never NaN */
    const float u[4] = {-INFINITY, 100, -100, 0};
    moe_route(u, 4, 4, false, idx, w);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[3], 0);
    assert_true(w[0] == 1.0f && w[3] == 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_random_logits), cmocka_unit_test(test_ties)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
