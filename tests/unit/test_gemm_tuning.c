/* The GEMM tuning file's format (engine/gemm_tuning.h): a round trip keeps every entry bit for bit,
 * a file for another identity or format version is set aside, a malformed line is reported with its
 * file and line, a file that is not ours is left alone, and a save replaces the file whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine/gemm_tuning.h"
#include "engine/util/scratch_dir.h"

#define ID "device NVIDIA H200 sm 132 cc 9.0; cublasLt 130100; llmq 0.1.0"

static char dir[512], path[600];

static int setup(void **state)
{
    (void)state;
    if (scratch_dir_make(getenv("TMPDIR"), "test-gemm-tuning", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/gemm.tuning", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    scratch_dir_remove(dir);
    return 0;
}

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static struct gemm_tuning_entry entry(const char *kind, int M, uint64_t seed)
{
    struct gemm_tuning_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.kind, sizeof e.kind, "%s", kind);
    const int key[GEMM_TUNING_KEY_INTS] = {M, 5120, 17408, (int)(seed & 1), 256, 256, 16, M > 8};
    memcpy(e.key, key, sizeof key);
    e.timed_M = M + 1;
    e.path = (int)(seed % 2);
    for (int w = 0; w < 8; w++) /* every bit pattern class: high bit set, zero words, small values */
        e.algo[w] = w == 3 ? 0 : (seed * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)w << 60) ^ (uint64_t)w;
    return e;
}

static void test_round_trip(void **state)
{
    (void)state;
    struct gemm_tuning t = {0}, u = {0};
    char msg[512];
    const char *kinds[3] = {"bf16", "fp8", "choice-fp8"};
    for (int i = 0; i < 30; i++) {
        struct gemm_tuning_entry e = entry(kinds[i % 3], 1 + i, (uint64_t)i * 7919 + 1);
        assert_int_equal(gemm_tuning_put(&t, &e), 0);
    }
    assert_int_equal(t.n, 30);
    assert_int_equal(gemm_tuning_save(&t, path, ID, msg, sizeof msg), 0);
    assert_int_equal(gemm_tuning_load(&u, path, ID, msg, sizeof msg), GEMM_TUNING_LOADED);
    assert_int_equal(u.n, 30);
    for (int i = 0; i < t.n; i++) {
        const struct gemm_tuning_entry *f = gemm_tuning_find(&u, t.e[i].kind, t.e[i].key);
        assert_non_null(f);
        assert_memory_equal(f, &t.e[i], sizeof *f);
    }
    /* a key that was never put is not found, nor one of another kind */
    struct gemm_tuning_entry x = entry("bf16", 1000, 3);
    assert_null(gemm_tuning_find(&u, x.kind, x.key));
    x = entry("fp8", 1, 1); /* M 1 was put as bf16 */
    assert_null(gemm_tuning_find(&u, x.kind, x.key));
    /* no temporary file stays beside it */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    assert_int_equal(access(tmp, F_OK), -1);
    gemm_tuning_free(&t);
    gemm_tuning_free(&u);
    gemm_tuning_free(NULL);
}

static void test_put_replaces(void **state)
{
    (void)state;
    struct gemm_tuning t = {0};
    struct gemm_tuning_entry a = entry("bf16", 8, 1), b = a;
    b.timed_M = 99, b.algo[0] = 42;
    assert_int_equal(gemm_tuning_put(&t, &a), 0);
    assert_int_equal(gemm_tuning_put(&t, &b), 0);
    assert_int_equal(t.n, 1);
    assert_int_equal(gemm_tuning_find(&t, "bf16", a.key)->timed_M, 99);
    struct gemm_tuning_entry bad = a;
    snprintf(bad.kind, sizeof bad.kind, "BF 16");
    assert_int_equal(gemm_tuning_put(&t, &bad), -1);
    bad.kind[0] = 0;
    assert_int_equal(gemm_tuning_put(&t, &bad), -1);
    assert_int_equal(t.n, 1);
    gemm_tuning_free(&t);
}

static void test_no_file(void **state)
{
    (void)state;
    struct gemm_tuning t = {0};
    char msg[512];
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_NO_FILE);
    assert_int_equal(t.n, 0);
    /* an empty file is no file yet (it is written at the first save) */
    write_file("");
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_NO_FILE);
    assert_non_null(strstr(msg, "empty"));
    struct gemm_tuning_entry e = entry("bf16", 4, 5);
    assert_int_equal(gemm_tuning_put(&t, &e), 0);
    assert_int_equal(gemm_tuning_save(&t, path, ID, msg, sizeof msg), 0);
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_LOADED);
    assert_int_equal(t.n, 1);
    gemm_tuning_free(&t);
}

static void test_other_identity(void **state)
{
    (void)state;
    struct gemm_tuning t = {0};
    char msg[512];
    struct gemm_tuning_entry e = entry("bf16", 4, 5);
    assert_int_equal(gemm_tuning_put(&t, &e), 0);
    assert_int_equal(gemm_tuning_save(&t, path, "device NVIDIA H100 80GB HBM3 sm 132", msg, sizeof msg), 0);
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_OTHER_ID);
    assert_int_equal(t.n, 0);
    assert_non_null(strstr(msg, ":2:"));
    assert_non_null(strstr(msg, "H100"));
    write_file("llmq-gemm-tuning 2\nidentity " ID "\n");
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_OTHER_ID);
    assert_non_null(strstr(msg, "format version 2"));
}

/* Each malformed line is named by its number; the entries before it are not kept. */
static void test_malformed(void **state)
{
    (void)state;
    struct {
        const char *line, *why;
    } bad[] = {
        {"bf16 1 5120 5120 0 256 256 256 0 1 0", "fewer than 12"},
        {"bf16 1 5120 5120 0 256 256 256 0 1 0 00 extra", "more than 12"},
        {"BF16 1 5120 5120 0 256 256 256 0 1 0 " /* a kind outside [a-z0-9_-] */
         "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000",
         "kind"},
        {"bf16 0 5120 5120 0 256 256 256 0 1 0 "
         "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000",
         "M is not"},
        {"bf16 1 5120 5120 2 256 256 256 0 1 0 "
         "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000",
         "y_f32 is not"},
        {"bf16 1 5120 5120x 0 256 256 256 0 1 0 "
         "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000",
         "K is not"},
        {"bf16 1 5120 5120 0 256 256 256 0 1 0 "
         "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000g"
         "000000000000000000000000000000",
         "128 hex"},
        {"bf16 1 5120 5120 0 256 256 256 0 1 0 00ff", "128 hex"},
    };
    char text[1024], msg[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text,
                 "llmq-gemm-tuning 1\nidentity " ID "\n# a comment\n\nfp8 4 5120 5120 0 256 256 256 0 4 0 "
                 "0000000000000001000000000000000200000000000000030000000000000004"
                 "0000000000000005000000000000000600000000000000070000000000000008\n%s\n",
                 bad[i].line);
        write_file(text);
        struct gemm_tuning t = {0};
        assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_BAD);
        assert_int_equal(t.n, 0);
        char at[700];
        snprintf(at, sizeof at, "%s:6: ", path);
        if (!strstr(msg, at) || !strstr(msg, bad[i].why))
            fail_msg("line %zu: message \"%s\" lacks \"%s\" or \"%s\"", i, msg, at, bad[i].why);
    }
    /* the good line alone loads, with its words in order */
    snprintf(text, sizeof text,
             "llmq-gemm-tuning 1\r\nidentity " ID "\r\nfp8 4 5120 5120 0 256 256 256 0 4 0 "
             "0000000000000001000000000000000200000000000000030000000000000004"
             "0000000000000005000000000000000600000000000000070000000000000008\r\n");
    write_file(text);
    struct gemm_tuning t = {0};
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_LOADED);
    assert_int_equal(t.n, 1);
    for (int w = 0; w < 8; w++)
        assert_true(t.e[0].algo[w] == (uint64_t)(w + 1));
    assert_int_equal(t.e[0].timed_M, 4);
    gemm_tuning_free(&t);
    /* a header without its identity line */
    write_file("llmq-gemm-tuning 1\n");
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_BAD);
    assert_non_null(strstr(msg, "identity"));
}

/* A file that is not a tuning file (say, the configuration given by mistake) is named as such. */
static void test_foreign(void **state)
{
    (void)state;
    struct gemm_tuning t = {0};
    char msg[512];
    write_file("engine:\n  gemm_tuning_file: /var/lib/llmq/gemm.tuning\n");
    assert_int_equal(gemm_tuning_load(&t, path, ID, msg, sizeof msg), GEMM_TUNING_FOREIGN);
    assert_non_null(strstr(msg, "not a GEMM tuning file"));
    /* a folder where the file should be: the save fails with the path, and nothing is left */
    char sub[600];
    snprintf(sub, sizeof sub, "%s/nope/gemm.tuning", dir);
    assert_int_equal(gemm_tuning_save(&t, sub, ID, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "nope"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test(test_put_replaces),
        cmocka_unit_test_setup_teardown(test_no_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
