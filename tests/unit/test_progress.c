/* worker/cli/progress.c: the line progress_format draws (counts with thousands separators, percent, the
 * rate in its unit, elapsed and ETA), the bar's fill, an unknown total, and an inactive bar; work
 * under way (progress_set_partial) moving the fill, percent and ETA before anything is done, and a
 * bar without a rate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "worker/cli/progress.h"

static void test_tokens(void **state)
{
    (void)state;
    struct progress *p = progress_new_ex(stderr, "jobs", 1000, false);
    assert_non_null(p);
    assert_false(progress_active(p));
    char line[256];
    /* nothing drawn yet: the rate is tokens over the elapsed time */
    progress_format(p, 412, 75530, 41.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "412/1,000 jobs   41%  1,842 tok/s  0:41 elapsed  ETA 0:59"));
    assert_int_equal(line[0], '[');
    /* 40 columns of bar: 41 % of them filled, then the arrow */
    assert_int_equal(strncmp(line, "[================>", 18), 0);
    progress_free(p);
}

static void test_rate_unit_and_unknown_total(void **state)
{
    (void)state;
    struct progress *p = progress_new_ex(stderr, "MB", 0, false);
    progress_set_rate_unit(p, "MB/s");
    char line[256];
    progress_format(p, 600, 600, 10.0, 120, line, sizeof line);
    assert_string_equal(line, "600 MB  60 MB/s  0:10 elapsed"); /* no total: no bar, no percent */
    progress_set_total(p, 16000);
    progress_format(p, 16000, 16000, 100.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "] 16,000/16,000 MB  100%  160 MB/s  1:40 elapsed"));
    assert_null(strstr(line, "ETA")); /* done: no ETA */
    assert_null(strstr(line, ">"));   /* a full bar */
    progress_set_rate_unit(p, NULL);  /* ignored */
    progress_format(p, 1, 1, 1.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "1 MB/s"));
    progress_free(p);
}

static void test_partial_and_no_rate(void **state)
{
    (void)state;
    struct progress *p = progress_new_ex(stderr, "jobs", 10, false);
    char line[256];
    /* nothing done, 2.5 jobs' worth of tokens under way after 5 s: 25 %, ETA 15 s */
    progress_set_partial(p, 2.5);
    progress_format(p, 0, 1000, 5.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "0/10 jobs   25%  200 tok/s  0:05 elapsed  ETA 0:15"));
    assert_int_equal(strncmp(line, "[==========>", 12), 0); /* a quarter of 40 columns */
    /* partial beyond the total is capped */
    progress_set_partial(p, 30);
    progress_format(p, 4, 1000, 5.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "4/10 jobs  100%"));
    progress_set_partial(p, 0);
    progress_hide_rate(p);
    progress_format(p, 4, 0, 8.0, 120, line, sizeof line);
    assert_non_null(strstr(line, "4/10 jobs   40%  0:08 elapsed  ETA 0:12"));
    assert_null(strstr(line, "/s"));
    progress_free(p);
}

static void test_null_is_accepted(void **state)
{
    (void)state;
    progress_set_rate_unit(NULL, "x");
    progress_set_total(NULL, 3);
    progress_set_partial(NULL, 1);
    progress_hide_rate(NULL);
    assert_false(progress_due(NULL));
    progress_update(NULL, 1, 1);
    progress_finish(NULL);
    progress_free(NULL);
    assert_false(progress_active(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_rate_unit_and_unknown_total),
        cmocka_unit_test(test_partial_and_no_rate),
        cmocka_unit_test(test_null_is_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
