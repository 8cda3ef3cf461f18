/* worker/store/merge.c on real SQLite files: the cases of the merge rules a worker's databases
 * rarely produce (tests/cli/test_collect.sh runs real workers): a kept row that still takes a
 * source's larger attempts (lower and equal rank), a later failure over an earlier one, batches
 * of rows per transaction, identical rows not written, a restarted worker's row updated in place
 * (its metrics kept), db_result_dup and db_result_same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/store/db.h"
#include "worker/store/merge.h"

static char dir[128], src_path[192], dst_path[192], err[1024];

static int setup(void **state)
{
    (void)state;
    if (scratch_dir_make(getenv("TMPDIR"), "test-merge", dir, sizeof dir))
        return -1;
    snprintf(src_path, sizeof src_path, "%s/host.db", dir);
    snprintf(dst_path, sizeof dst_path, "%s/central.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

static struct db *open_at(const char *p)
{
    struct db *db = NULL;
    if (db_open(p, NULL, &db, err, sizeof err) != DB_OK)
        fail_msg("db_open(%s): %s", p, err);
    return db;
}

static struct db_result row(const char *id, enum db_status s, double finished_at, int64_t attempts,
                            const char *worker)
{
    struct db_result r = db_result_empty();
    r.id = id;
    r.status = s;
    r.finished_at = finished_at;
    r.attempts = attempts;
    r.worker_id = worker;
    r.output = s == DB_COMPLETED ? "text" : NULL;
    r.error = s == DB_FAILED ? "boom" : NULL;
    return r;
}

static void put(const char *p, const struct db_result *r, size_t n)
{
    struct db *db = open_at(p);
    assert_int_equal(db_put_results(db, r, n, NULL), DB_OK);
    db_close(db);
}

/* The target's row of id as "status|finished_at|attempts|worker_id". */
static void target_row(const char *id, char *out, size_t len)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(dst_path, &h), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h,
                                        "SELECT status || '|' || finished_at || '|' || attempts || '|' || "
                                        "ifnull(worker_id, '') FROM jobs WHERE id = ?1",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    out[0] = 0;
    if (sqlite3_step(st) == SQLITE_ROW)
        snprintf(out, len, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(h);
}

static struct merge_stats merge(size_t batch_rows)
{
    struct db *dst = open_at(dst_path);
    struct merge_stats st;
    if (merge_db(dst, src_path, batch_rows, &st, err, sizeof err))
        fail_msg("merge_db: %s", err);
    db_close(dst);
    return st;
}

static void test_kept_rows_take_attempts(void **state)
{
    (void)state;
    /* target: a completed a, a completed b finished at 200, a failed c */
    struct db_result t[] = {row("a", DB_COMPLETED, 100, 1, "w1"), row("b", DB_COMPLETED, 200, 1, "w1"),
                            row("c", DB_FAILED, 100, 2, "w1")};
    put(dst_path, t, 3);
    /* source: a failed with 4 attempts (lower rank), b completed earlier with 3 (equal rank, earlier),
     * c failed later with 1 (equal rank, later: replaces, attempts stay 2) */
    struct db_result s[] = {row("a", DB_FAILED, 300, 4, "w2"), row("b", DB_COMPLETED, 150, 3, "w2"),
                            row("c", DB_FAILED, 300, 1, "w2")};
    put(src_path, s, 3);
    struct merge_stats st = merge(0);
    char got[256];
    target_row("a", got, sizeof got);
    assert_string_equal(got, "completed|100.0|4|w1");
    target_row("b", got, sizeof got);
    assert_string_equal(got, "completed|200.0|3|w1");
    target_row("c", got, sizeof got);
    assert_string_equal(got, "failed|300.0|2|w2");
    assert_int_equal(st.jobs.read, 3);
    assert_int_equal(st.jobs.written, 3);
    assert_int_equal(st.jobs.kept, 0);
    /* again: nothing to write */
    st = merge(0);
    assert_int_equal(st.jobs.written, 0);
    assert_int_equal(st.jobs.kept, 3);
}

static void test_batches_of_rows(void **state)
{
    (void)state;
    char ids[7][8];
    struct db_result s[7];
    for (int i = 0; i < 7; i++) {
        snprintf(ids[i], sizeof ids[i], "j%d", i);
        s[i] = row(ids[i], DB_COMPLETED, 100 + i, 1, "w1");
    }
    put(src_path, s, 7);
    struct db *dst = open_at(dst_path);
    sqlite3 *h = db_handle(dst);
    int before = sqlite3_total_changes(h);
    struct merge_stats st;
    assert_int_equal(merge_db(dst, src_path, 3, &st, err, sizeof err), 0);
    assert_int_equal(st.jobs.written, 7);
    assert_int_equal(sqlite3_total_changes(h) - before, 7);
    before = sqlite3_total_changes(h);
    assert_int_equal(merge_db(dst, src_path, 3, &st, err, sizeof err), 0);
    assert_int_equal(st.jobs.kept, 7);
    assert_int_equal(sqlite3_total_changes(h) - before, 0); /* identical rows are not written */
    db_close(dst);
}

static void put_worker(const char *p, const char *id, double started, double seen, double ts)
{
    struct db *db = open_at(p);
    struct db_worker w = {.id = id, .host = p, .pid = 7, .backend = "cpu", .started_at = started};
    assert_int_equal(db_put_worker(db, &w), DB_OK);
    assert_int_equal(db_touch_worker(db, id, seen, 5, true), DB_OK);
    struct db_metrics mr = db_metrics_empty();
    mr.worker_id = id;
    mr.ts = ts;
    mr.interval_s = 1;
    assert_int_equal(db_put_metrics(db, &mr, 1), DB_OK);
    db_close(db);
}

static int64_t count(const char *sql)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(dst_path, &h), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

/* A worker that restarted: the later row replaces the target's in place, whose metrics stay (an
 * upsert, not a delete that would cascade); an earlier one is kept out. */
static void test_worker_restart(void **state)
{
    (void)state;
    put_worker(dst_path, "w", 100, 150, 150);
    put_worker(src_path, "w", 200, 250, 250);
    struct merge_stats st = merge(0);
    assert_int_equal(st.workers.written, 1);
    assert_int_equal(st.metrics.written, 1);
    assert_int_equal(
        count("SELECT started_at = 200 AND last_seen_at = 250 AND stopped_at = 250 AND jobs_done = 5 "
              "AND pid = 7 FROM workers WHERE id = 'w'"),
        1);
    assert_int_equal(count("SELECT count(*) FROM worker_metrics WHERE worker_id = 'w'"), 2);
    /* the other way round: the target's later row stays */
    char tmp[192];
    snprintf(tmp, sizeof tmp, "%s", src_path);
    snprintf(src_path, sizeof src_path, "%s/old.db", dir);
    put_worker(src_path, "w", 50, 60, 60);
    st = merge(0);
    assert_int_equal(st.workers.kept, 1);
    assert_int_equal(st.metrics.written, 1);
    assert_int_equal(count("SELECT started_at FROM workers WHERE id = 'w'"), 200);
    assert_int_equal(count("SELECT count(*) FROM worker_metrics WHERE worker_id = 'w'"), 3);
    st = merge(0);
    assert_int_equal(st.workers.written + st.metrics.written, 0);
    snprintf(src_path, sizeof src_path, "%s", tmp);
}

static void test_dup_and_same(void **state)
{
    (void)state;
    struct db_result r = row("x", DB_COMPLETED, 5, 2, "w");
    r.output = "a\0b";
    r.output_len = 3;
    r.params = "{\"t\":1}";
    struct db_result *d = db_result_dup(&r);
    assert_non_null(d);
    assert_true(d->output != r.output && d->output_len == 3 && !memcmp(d->output, "a\0b", 3));
    assert_true(db_result_same(&r, d));
    d->attempts = 3;
    assert_false(db_result_same(&r, d));
    d->attempts = 2;
    d->output_len = 2;
    assert_false(db_result_same(&r, d));
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kept_rows_take_attempts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batches_of_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dup_and_same, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
