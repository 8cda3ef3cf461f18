/* fmt_double: the fewest digits that read back, in %.15g's notation. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/util/fmt_double.h"

static void text_is(double v, const char *want)
{
    char got[40];
    fmt_double(v, got, sizeof got);
    if (strcmp(got, want))
        fail_msg("%.17g: got %s, want %s", v, got, want);
}

static void test_texts(void **state)
{
    (void)state;
    text_is(0.7, "0.7");
    text_is(100, "100");
    text_is(10, "10");
    text_is(123456789012345.0, "123456789012345");
    text_is(1e15, "1e+15");
    text_is(0.1 + 0.2, "0.30000000000000004");
    text_is(1.5e-7, "1.5e-07");
    text_is(1e-4, "0.0001");
    text_is(-2.5, "-2.5");
    text_is(0.0, "0");
    text_is(5e-324, "5e-324");
    text_is(DBL_MAX, "1.7976931348623157e+308");
    text_is(1796603375.011, "1796603375.011");
}

/* Every text reads back as its double, and no shorter %g text does. */
static void test_round_trips(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v;
        memcpy(&v, &x, sizeof v);
        if (!isfinite(v))
            continue;
        char got[40], shorter[400];
        fmt_double(v, got, sizeof got);
        assert_true(strtod(got, NULL) == v);
        char sig[40]; /* the significant digits: no sign, point, exponent, leading or trailing zeros */
        size_t n = 0;
        for (const char *c = got; *c && *c != 'e'; c++)
            if (*c >= '0' && *c <= '9' && (n || *c != '0'))
                sig[n++] = *c;
        while (n > 1 && sig[n - 1] == '0')
            n--;
        if (n > 1) {
            snprintf(shorter, sizeof shorter, "%.*g", (int)n - 1, v);
            if (strtod(shorter, NULL) == v)
                fail_msg("%s: %s is shorter", got, shorter);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_texts),
        cmocka_unit_test(test_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
