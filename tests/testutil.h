/* Helpers for the C tests (header-only; each test is its own program). */
#pragma once
#include <stdio.h>
#include <stdlib.h>

/* Exit code ctest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define TEST_SKIP_CODE 77

/* Prints why and exits as skipped. Only for a missing GPU or a registry that cannot be reached. */
static inline void test_skip(const char *why)
{
    printf("SKIPPED: %s\n", why);
    fflush(stdout);
    exit(TEST_SKIP_CODE);
}

/* $LLMQ_ASSETS/<rel> if it exists, otherwise skips with the reason tests/assets/fetch.sh left. */
static inline const char *test_asset(const char *rel)
{
    static char path[4096];
    const char *dir = getenv("LLMQ_ASSETS");
    if (!dir)
        test_skip("LLMQ_ASSETS is not set (run the tests through ctest)");
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        return path;
    }
    char why[4096], reason[1024] = "tests/assets/fetch.sh did not run";
    snprintf(why, sizeof why, "%s/fetch-failed", dir);
    FILE *r = fopen(why, "r");
    if (r) {
        size_t n = fread(reason, 1, sizeof reason - 1, r);
        reason[n] = 0;
        fclose(r);
    }
    snprintf(why, sizeof why, "asset %s missing: %s", rel, reason);
    test_skip(why);
    return NULL;
}

/* $LLMQ_SOURCE_DIR/<rel> (committed fixtures); aborts if the variable is missing. */
static inline const char *test_source(const char *rel)
{
    static char path[4096];
    const char *dir = getenv("LLMQ_SOURCE_DIR");
    if (!dir) {
        fprintf(stderr, "LLMQ_SOURCE_DIR is not set (run the tests through ctest)\n");
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    return path;
}
