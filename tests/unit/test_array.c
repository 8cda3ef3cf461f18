/* engine/util/array: the doubling rule (from min_cap, from the current capacity, up to need), the
 * overflow guards, and that a failed growth leaves the array and its capacity as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/util/array.h"

static void test_grown_cap(void **state)
{
    (void)state;
    assert_int_equal(array_grown_cap(0, 0, 16), 0);   /* nothing needed: as it is */
    assert_int_equal(array_grown_cap(8, 8, 16), 8);   /* has room */
    assert_int_equal(array_grown_cap(0, 1, 16), 16);  /* from min_cap */
    assert_int_equal(array_grown_cap(0, 17, 16), 32); /* doubled until it holds need */
    assert_int_equal(array_grown_cap(0, 100, 16), 128);
    assert_int_equal(array_grown_cap(24, 25, 16), 48); /* from the current capacity, not min_cap */
    assert_int_equal(array_grown_cap(3, 50, 1024), 96);
    assert_int_equal(array_grown_cap(0, 3, 0), 4);                              /* min_cap 0 starts at 1 */
    assert_int_equal(array_grown_cap(SIZE_MAX / 2 + 1, SIZE_MAX, 1), SIZE_MAX); /* cannot double */
}

static void test_reserve(void **state)
{
    (void)state;
    int32_t *a = NULL;
    size_t cap = 0;
    for (int i = 0; i < 1000; i++) { /* appends one by one */
        assert_int_equal(array_reserve(&a, &cap, (size_t)i + 1, sizeof *a, 16), 0);
        assert_true(cap >= (size_t)i + 1);
        a[i] = i * 7;
    }
    assert_int_equal(cap, 1024);
    for (int i = 0; i < 1000; i++) /* every element survived the reallocations */
        assert_int_equal(a[i], i * 7);
    int32_t *before = a;
    assert_int_equal(array_reserve(&a, &cap, 500, sizeof *a, 16), 0); /* has room: untouched */
    assert_ptr_equal(a, before);
    assert_int_equal(cap, 1024);

    /* too large: refused, the array and its capacity as they were */
    assert_int_equal(array_reserve(&a, &cap, SIZE_MAX / 2, sizeof *a, 16), -1);
    assert_ptr_equal(a, before);
    assert_int_equal(cap, 1024);
    assert_int_equal(a[999], 999 * 7);
    assert_int_equal(array_resize(&a, SIZE_MAX / 4 + 1, sizeof *a), -1); /* n * elem overflows */
    assert_ptr_equal(a, before);

    assert_int_equal(array_resize(&a, 3, sizeof *a), 0); /* shrinks too */
    assert_int_equal(a[2], 14);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_grown_cap), cmocka_unit_test(test_reserve)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
