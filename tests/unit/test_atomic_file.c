/* engine/atomic_file: a file is replaced whole or not at all; the temporary file beside it never stays;
 * failures name the file and leave the target as it was. */
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

#include "engine/util/atomic_file.h"
#include "engine/util/scratch_dir.h"

static char dir[256], path[320], tmp[360];

static int setup(void **state)
{
    (void)state;
    if (scratch_dir_make(getenv("TMPDIR"), "test-atomic-file", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/out.txt", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char sub[340];
    snprintf(sub, sizeof sub, "%s/sub/x", dir);
    unlink(sub);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    rmdir(sub);
    scratch_dir_remove(dir);
    return 0;
}

static void slurp(const char *p, char *buf, size_t n)
{
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
}

static void write_whole(const char *text)
{
    struct atomic_file a;
    char msg[512] = "";
    assert_int_equal(atomic_file_open(&a, path, msg, sizeof msg), 0);
    fputs(text, a.f);
    assert_int_equal(access(tmp, F_OK), 0); /* written beside the target ... */
    assert_int_equal(atomic_file_commit(&a, msg, sizeof msg), 0);
    assert_int_equal(access(tmp, F_OK), -1); /* ... and renamed over it */
    assert_null(a.f);
}

static void test_commit_creates_and_replaces(void **state)
{
    (void)state;
    char got[64];
    write_whole("first\n");
    slurp(path, got, sizeof got);
    assert_string_equal(got, "first\n");
    write_whole("second, longer\n");
    slurp(path, got, sizeof got);
    assert_string_equal(got, "second, longer\n");
}

static void test_abort_keeps_the_target(void **state)
{
    (void)state;
    char got[64], msg[512] = "";
    write_whole("kept\n");
    struct atomic_file a;
    assert_int_equal(atomic_file_open(&a, path, msg, sizeof msg), 0);
    fputs("half of a new ver", a.f);
    atomic_file_abort(&a);
    assert_int_equal(access(tmp, F_OK), -1);
    slurp(path, got, sizeof got);
    assert_string_equal(got, "kept\n");
    struct atomic_file zero = {0};
    atomic_file_abort(&zero); /* a zeroed one: nothing to do */
}

static void test_no_such_folder(void **state)
{
    (void)state;
    char p[400], msg[512] = "";
    snprintf(p, sizeof p, "%s/no/such/x.txt", dir);
    struct atomic_file a;
    assert_int_equal(atomic_file_open(&a, p, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "no/such/x.txt.tmp-"));
    assert_non_null(strstr(msg, strerror(ENOENT)));
    assert_null(a.f);
}

static void test_rename_refused(void **state)
{
    (void)state;
    /* the target is a folder with a file in it: the rename fails, the folder stays, no temporary file */
    char sub[340], x[360], t[400], msg[512] = "";
    snprintf(sub, sizeof sub, "%s/sub", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(x, sizeof x, "%s/x", sub);
    FILE *f = fopen(x, "w");
    assert_non_null(f);
    fclose(f);
    struct atomic_file a;
    assert_int_equal(atomic_file_open(&a, sub, msg, sizeof msg), 0);
    fputs("data\n", a.f);
    assert_int_equal(atomic_file_commit(&a, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "cannot rename"));
    assert_non_null(strstr(msg, sub));
    snprintf(t, sizeof t, "%s.tmp-%ld", sub, (long)getpid());
    assert_int_equal(access(t, F_OK), -1);
    assert_int_equal(access(x, F_OK), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_creates_and_replaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_keeps_the_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_such_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rename_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
