/* The CUDA backend's cuBLASLt loader (kernels/cublaslt_loader.h), which needs no GPU: a file that is
 * not there and a library without cuBLASLt's functions fail with an error naming each file and the
 * reason; the toolkit's library loads, every function resolves, and a call through the table answers
 * the library's version, whose major number is the soname's. Exits 77 (skipped) with the reason in a
 * build without the CUDA backend, or where the toolkit's library is not installed (after the failure
 * cases, which need no library, have run). The order matters: once a load succeeds it stays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#ifdef LLMQ_HAVE_CUDA_BACKEND
#include "kernels/cublaslt_loader.h"
#include "llmq_cublaslt.h"

static const char *absent_why; /* set when the toolkit's library is not on this machine */

static void test_missing_file(void **state)
{
    (void)state;
    const char *names[] = {"libcublasLt.so.0-not-there", "/nonexistent-dir/libcublasLt.so.0-not-there"};
    char err[2048] = "";
    assert_int_equal(k_cublaslt_load_from(names, 2, err, sizeof err), -1);
    assert_non_null(
        strstr(err, "cannot load cuBLASLt (" LLMQ_CUBLASLT_SONAME ", the CUDA backend's GEMMs): "));
    /* each file with dlerror()'s reason */
    assert_non_null(strstr(err, "libcublasLt.so.0-not-there: cannot open shared object file"));
    assert_non_null(
        strstr(err, "; /nonexistent-dir/libcublasLt.so.0-not-there: cannot open shared object file"));
    assert_null(k_cublaslt_path());
    assert_int_equal(k_cublaslt_version(), 0);
}

static void test_not_cublaslt(void **state)
{
    (void)state;
    const char *names[] = {"libm.so.6"}; /* loads, but has none of the functions */
    char err[2048] = "";
    assert_int_equal(k_cublaslt_load_from(names, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "libm.so.6: no cublasLtCreate ("));
    assert_null(k_cublaslt_path());
}

static void test_load(void **state)
{
    (void)state;
    char err[2048] = "";
    const char *file = LLMQ_CUBLASLT_DIR "/" LLMQ_CUBLASLT_SONAME;
    if (k_cublaslt_load(err, sizeof err)) {
        if (access(file, F_OK) != 0) { /* not installed here (e.g. nvcc without cuBLAS): nothing to load */
            absent_why = file;
            printf("note: %s\n", err);
            return;
        }
        fail_msg("%s exists but did not load: %s", file, err);
    }
    const char *path = k_cublaslt_path();
    assert_non_null(path);
    printf("loaded %s, version %zu\n", path, k_cublaslt_version());
    /* the file is the soname's (found by the dynamic loader, or in the toolkit's directory) */
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    assert_string_equal(base, LLMQ_CUBLASLT_SONAME);
    /* a call through the table: cublasLtGetVersion is major * 10000 + minor * 100 + patch */
    const char *so = strstr(LLMQ_CUBLASLT_SONAME, ".so.");
    assert_non_null(so);
    assert_int_equal((int)(k_cublaslt_version() / 10000), atoi(so + 4));
    /* loaded once: later calls, whatever the names, keep it */
    const char *none[] = {"libcublasLt.so.0-not-there"};
    assert_int_equal(k_cublaslt_load_from(none, 1, err, sizeof err), 0);
    assert_int_equal(k_cublaslt_load(err, sizeof err), 0);
    assert_string_equal(k_cublaslt_path(), path);
}
#endif

int main(void)
{
#ifndef LLMQ_HAVE_CUDA_BACKEND
    printf("skipped: built without the CUDA backend (no cuBLASLt loader)\n");
    return 77;
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_not_cublaslt),
        cmocka_unit_test(test_load),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0 && absent_why) {
        printf("skipped: %s is not installed on this machine\n", absent_why);
        return 77;
    }
    return rc;
#endif
}
