/* engine/util/scratch_dir: scratch_dir_make puts llmq-<name>-XXXXXX under the parent it is given (/tmp
 * when that is NULL or empty), a new folder each call; a buffer too small is refused; scratch_dir_remove
 * takes the folder and its files away. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/util/scratch_dir.h"

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_under_parent(void **state)
{
    (void)state;
    char outer[] = "/tmp/llmq-test-scratch-XXXXXX";
    assert_non_null(mkdtemp(outer));
    char a[256], b[256], prefix[128], file[300];
    assert_int_equal(scratch_dir_make(outer, "unit", a, sizeof a), 0);
    assert_int_equal(scratch_dir_make(outer, "unit", b, sizeof b), 0);
    snprintf(prefix, sizeof prefix, "%s/llmq-unit-", outer);
    assert_int_equal(strncmp(a, prefix, strlen(prefix)), 0);
    assert_int_equal(strlen(a), strlen(prefix) + 6);
    assert_string_not_equal(a, b);
    assert_true(is_dir(a) && is_dir(b));
    snprintf(file, sizeof file, "%s/f", a);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    scratch_dir_remove(a);
    scratch_dir_remove(b);
    assert_false(is_dir(a) || is_dir(b));

    /* no parent, or an empty one (an unset or empty TMPDIR): /tmp */
    assert_int_equal(scratch_dir_make("", "unit", a, sizeof a), 0);
    assert_int_equal(strncmp(a, "/tmp/llmq-unit-", 15), 0);
    scratch_dir_remove(a);
    assert_int_equal(scratch_dir_make(NULL, "unit", a, sizeof a), 0);
    assert_int_equal(strncmp(a, "/tmp/llmq-unit-", 15), 0);
    assert_true(is_dir(a));
    scratch_dir_remove(a);

    errno = 0; /* the path does not fit: refused, nothing made */
    assert_int_equal(scratch_dir_make(outer, "unit", a, 12), -1);
    assert_int_equal(errno, ENAMETOOLONG);

    assert_int_equal(rmdir(outer), 0); /* empty again: nothing was left behind */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_under_parent)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
