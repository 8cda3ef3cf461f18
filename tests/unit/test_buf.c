/* engine/util/buf: appends keep the bytes and a NUL after them, printf text longer than the room
 * left is formatted whole, embedded NULs are kept, a failed reservation is sticky, and buf_take hands
 * the bytes over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/util/buf.h"

static void test_append(void **state)
{
    (void)state;
    struct buf b = {0};
    assert_int_equal(buf_puts(&b, ""), 0); /* allocates: p reads as "" */
    assert_non_null(b.p);
    assert_string_equal(b.p, "");
    assert_int_equal(buf_puts(&b, "hello"), 0);
    assert_int_equal(buf_append(&b, ", world", 7), 0);
    assert_int_equal(b.len, 12);
    assert_string_equal(b.p, "hello, world");
    assert_int_equal(buf_append(&b, "a\0b", 3), 0); /* bytes, not a string */
    assert_int_equal(b.len, 15);
    assert_memory_equal(b.p + 12, "a\0b", 4);
    for (int i = 0; i < 10000; i++) /* many small appends */
        assert_int_equal(buf_append(&b, "xyz", 3), 0);
    assert_int_equal(b.len, 15 + 30000);
    assert_true(b.cap > b.len);
    assert_int_equal(b.p[b.len], 0);
    assert_memory_equal(b.p + b.len - 6, "xyzxyz", 6);
    buf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    buf_free(&b); /* twice: harmless */
}

static void test_printf(void **state)
{
    (void)state;
    struct buf b = {0};
    assert_int_equal(buf_printf(&b, "%d-%s", 42, "x"), 0);
    assert_string_equal(b.p, "42-x");
    char big[1000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    size_t cap = b.cap;
    assert_int_equal(buf_printf(&b, "[%s]", big), 0); /* longer than the room left: formatted whole */
    assert_true(b.cap > cap);
    assert_int_equal(b.len, 4 + 2 + 999);
    assert_int_equal(b.p[4], '[');
    assert_int_equal(b.p[5 + 999], ']');
    assert_int_equal(b.p[b.len], 0);
    assert_int_equal(strlen(b.p), b.len);
    buf_free(&b);
}

static void test_oom_sticky(void **state)
{
    (void)state;
    struct buf b = {0};
    assert_int_equal(buf_puts(&b, "kept"), 0);
    assert_int_equal(buf_reserve(&b, SIZE_MAX - 2), -1); /* no such memory (the size overflows) */
    assert_true(b.oom);
    assert_string_equal(b.p, "kept"); /* what was there stays */
    assert_int_equal(buf_puts(&b, "more"), -1);
    assert_int_equal(buf_printf(&b, "%d", 1), -1);
    assert_int_equal(b.len, 4);
    assert_null(buf_take(&b)); /* out of memory: nothing to hand over, b freed */
    assert_null(b.p);
    assert_false(b.oom);
}

static void test_take(void **state)
{
    (void)state;
    struct buf b = {0};
    char *s = buf_take(&b); /* nothing appended: "" */
    assert_non_null(s);
    assert_string_equal(s, "");
    free(s);
    buf_puts(&b, "line");
    s = buf_take(&b);
    assert_string_equal(s, "line");
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_append), cmocka_unit_test(test_printf),
                                       cmocka_unit_test(test_oom_sticky), cmocka_unit_test(test_take)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
