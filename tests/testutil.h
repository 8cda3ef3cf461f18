/* Helpers for the C tests (header-only; each test is its own program). */
#pragma once
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/safetensors.h"

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

static inline int test_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

/* Removes dir and everything below it, depth first, links not followed: a test's scratch folder with
 * subfolders (engine/util/scratch_dir.h's scratch_dir_remove takes one level). Returns 0, or -1 when
 * something could not be removed. */
static inline int test_remove_tree(const char *dir)
{
    return nftw(dir, test_remove_entry, 8, FTW_DEPTH | FTW_PHYS);
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

/* Sets row `row` of the BF16 matrix `name` in the model folder dir (its file, in place) to NaN: a
 * corrupt weight, for tests of what a NaN does downstream. Returns 0, or -1 with err. */
static inline int test_nan_row(const char *dir, const char *name, int64_t row, char *err, size_t errlen)
{
    struct st_set *st = st_open_dir(dir, err, errlen);
    if (!st)
        return -1;
    const struct st_tensor *t = st_find(st, name);
    if (!t || t->view.dtype != DT_BF16 || t->view.ndim != 2 || row < 0 || row >= t->view.shape[0]) {
        snprintf(err, errlen, "%.300s: not a BF16 matrix with row %lld", name, (long long)row);
        st_free(st);
        return -1;
    }
    const int64_t cols = t->view.shape[1];
    const off_t at =
        (off_t)((const char *)t->view.data - (const char *)st->files[t->file].map) + (off_t)(row * cols * 2);
    char path[4096];
    snprintf(path, sizeof path, "%s", st->files[t->file].path);
    st_free(st);
    uint16_t *nan = (uint16_t *)malloc((size_t)cols * 2);
    int fd = open(path, O_WRONLY);
    int rc = nan && fd >= 0 ? 0 : -1;
    for (int64_t i = 0; rc == 0 && i < cols; i++)
        nan[i] = 0x7fc0; /* bf16 quiet NaN */
    if (rc == 0 && pwrite(fd, nan, (size_t)cols * 2, at) != (ssize_t)(cols * 2))
        rc = -1;
    if (rc)
        snprintf(err, errlen, "%.300s: cannot write row %lld", path, (long long)row);
    if (fd >= 0)
        close(fd);
    free(nan);
    return rc;
}
