/* engine/util/json_exact.c: reals written with the fewest digits that read back as the same double
 * (against Python's repr for the digits, and strtod for the reading back), in jansson's notation;
 * strings that look like numbers, integers and the rest of the text left as json_dumps writes them. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/util/json_exact.h"

static void real_is(double x, const char *want)
{
    char got[40];
    json_real_text(x, got, sizeof got);
    if (strcmp(got, want))
        fail_msg("%.17g: got %s, want %s", x, got, want);
    assert_true(strtod(got, NULL) == x);
}

static void test_reals(void **state)
{
    (void)state;
    real_is(0.7, "0.7");
    real_is(1796603375.011, "1796603375.011");
    real_is(0.1 + 0.2, "0.30000000000000004");
    real_is(3.0, "3.0");
    real_is(-2.5, "-2.5");
    real_is(0.0, "0.0");
    real_is(1e15, "1000000000000000.0");
    real_is(1.5e16, "15000000000000000.0");
    real_is(1e17, "1e+17");
    real_is(1e-4, "0.0001");
    real_is(1e-5, "1e-05");
    real_is(5e-324, "5e-324");
    real_is(1.7976931348623157e308, "1.7976931348623157e+308");
    real_is(123456789012.0, "123456789012.0");
    real_is(-1e15, "-1000000000000000.0");
    /* every double reads back, over many magnitudes */
    srand(57);
    for (int i = 0; i < 100000; i++) {
        uint64_t bits = ((uint64_t)rand() << 42) ^ ((uint64_t)rand() << 21) ^ (uint64_t)rand();
        double x;
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x))
            continue;
        char got[40];
        json_real_text(x, got, sizeof got);
        if (strtod(got, NULL) != x)
            fail_msg("%a: %s does not read back", x, got);
    }
}

static void test_dumps(void **state)
{
    (void)state;
    json_t *v = json_pack("{s:f, s:[f, i, s, f], s:{s:f}, s:s, s:b, s:n}", "time", 1796603375.011, "a", 0.7,
                          42, "1.10000000000000009", -1e-7, "o", "x", 1e15, "s", "a \"1.5\" \\", "t", 1, "u");
    assert_non_null(v);
    char *s = json_dumps_exact(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(3));
    assert_string_equal(s, "{\"a\":[0.7,42,\"1.10000000000000009\",-1e-07],\"o\":{\"x\":1000000000000000.0},"
                           "\"s\":\"a \\\"1.5\\\" \\\\\",\"t\":true,\"time\":1796603375.011,\"u\":null}");
    free(s);
    json_t *ints = json_pack("[i, i, s]", 1, -20, "3.25");
    s = json_dumps_exact(ints, JSON_COMPACT);
    assert_string_equal(s, "[1,-20,\"3.25\"]");
    free(s);
    s = json_dumps_exact(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    assert_non_null(strstr(s, "\"time\": 1796603375.011,\n"));
    free(s);
    json_decref(ints);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reals),
        cmocka_unit_test(test_dumps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
