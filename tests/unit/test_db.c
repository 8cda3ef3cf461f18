/* worker/store/db.c on real SQLite files in a temp dir: the schema and its settings, migrations (from
 * empty, from version 1, a failing one, a newer database, files that are not ours), the upsert
 * rules of a replayed job, batches of 1000, rejected rows, STRICT types and JSON columns, a
 * database locked by another connection and by another process (and by the sqlite3 shell),
 * readers during writes (WAL), workers and metrics, the query filters, and the example queries
 * of docs/SQLITE.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/store/db.h"

const char *db_test_column(const char *table, size_t i); /* worker/store/db.c, for tests */

static char dir[128];
static char path[192]; /* the database file of each test */
static char err[1024];

static int setup(void **state)
{
    if (scratch_dir_make(getenv("TMPDIR"), "test-db", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/llmq.db", dir);
    err[0] = 0;
    return 0;
}

static int teardown(void **state)
{
    return test_remove_tree(dir);
}

static struct db *open_ok(const struct db_opts *o)
{
    struct db *db = NULL;
    int rc = db_open(path, o, &db, err, sizeof err);
    if (rc != DB_OK)
        fail_msg("db_open(%s): %d %s", path, rc, err);
    assert_non_null(db);
    return db;
}

/* A second, raw connection (what another program would use). */
static sqlite3 *raw_open(void)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(path, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 5000);
    return h;
}

static void raw_exec(sqlite3 *h, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(h, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
}

/* The first column of the first row as an integer / a string (static buffer); -1 / "" if none. */
static int64_t raw_int(sqlite3 *h, const char *sql)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    return v;
}

static const char *raw_text(sqlite3 *h, const char *sql)
{
    static char buf[4096];
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    buf[0] = 0;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(buf, sizeof buf, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return buf;
}

static int64_t count_jobs(struct db *db)
{
    return raw_int(db_handle(db), "SELECT count(*) FROM jobs");
}

/* ---- rows */

struct rowbuf {
    char id[48], custom_id[48], params[128], output[160], metadata[128], result[384], request[128];
};

/* Row i: every column set, values derived from i (finished_at = t0 + i). */
static struct db_result make_row(struct rowbuf *b, int i, double t0)
{
    struct db_result r = db_result_empty();
    snprintf(b->id, sizeof b->id, "job-%05d", i);
    snprintf(b->custom_id, sizeof b->custom_id, "req-%d", i);
    snprintf(b->params, sizeof b->params, "{\"max_tokens\":%d,\"temperature\":0.5}", 16 + i % 7);
    snprintf(b->output, sizeof b->output, "summary number %d: \xc3\xa9t\xc3\xa9 \xe2\x9c\x93", i);
    snprintf(b->metadata, sizeof b->metadata, "{\"doc\":\"doc-%d.txt\",\"batch\":%d}", i, i / 100);
    snprintf(b->result, sizeof b->result,
             "{\"id\":\"%s\",\"status\":\"completed\",\"text\":\"summary number %d\","
             "\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}",
             b->id, i, 100 + i, 10 + i % 50);
    r.id = b->id;
    r.custom_id = i % 2 ? b->custom_id : NULL;
    r.queue = i % 3 ? "short" : "long";
    r.status = DB_COMPLETED;
    r.model = "tiny-qwen3";
    r.params = b->params;
    r.output = b->output;
    r.finish_reason = "stop";
    r.prompt_tokens = 100 + i;
    r.completion_tokens = 10 + i % 50;
    r.attempts = 1;
    r.worker_id = "w1";
    r.created_at = t0 + i - 2.5;
    r.started_at = t0 + i - 1.25;
    r.first_token_at = t0 + i - 1.0;
    r.finished_at = t0 + i;
    r.ttft_ms = 250.0 + i;
    r.latency_ms = 1250.0;
    r.queue_ms = 1250.0;
    r.metadata = b->metadata;
    r.result = b->result;
    r.request_form = i % 2 ? DB_FORM_OPENAI : DB_FORM_LLMQ;
    snprintf(b->request, sizeof b->request, "{\"id\":\"%s\",\"prompt\":\"p\",\"batch_id\":\"night-%d\"}",
             b->id, i % 3);
    r.batch_id = i % 3 ? (i % 3 == 1 ? "night-1" : "night-2") : NULL;
    r.request = b->request;
    return r;
}

static void assert_str_eq_null(const char *a, const char *b)
{
    if (!a || !b)
        assert_ptr_equal(a, b);
    else
        assert_string_equal(a, b);
}

static void assert_real_eq_nan(double a, double b)
{
    if (isnan(a) || isnan(b))
        assert_true(isnan(a) && isnan(b));
    else
        assert_true(fabs(a - b) <= 1e-9 * fabs(b));
}

static void assert_row_equal(const struct db_result *a, const struct db_result *b)
{
    assert_string_equal(a->id, b->id);
    assert_str_eq_null(a->custom_id, b->custom_id);
    assert_str_eq_null(a->queue, b->queue);
    assert_int_equal(a->status, b->status);
    assert_str_eq_null(a->model, b->model);
    assert_str_eq_null(a->params, b->params);
    assert_str_eq_null(a->output, b->output);
    assert_str_eq_null(a->finish_reason, b->finish_reason);
    assert_int_equal(a->prompt_tokens, b->prompt_tokens);
    assert_int_equal(a->completion_tokens, b->completion_tokens);
    assert_str_eq_null(a->error, b->error);
    assert_int_equal(a->attempts, b->attempts);
    assert_str_eq_null(a->worker_id, b->worker_id);
    assert_real_eq_nan(a->created_at, b->created_at);
    assert_real_eq_nan(a->started_at, b->started_at);
    assert_real_eq_nan(a->first_token_at, b->first_token_at);
    assert_real_eq_nan(a->finished_at, b->finished_at);
    assert_real_eq_nan(a->ttft_ms, b->ttft_ms);
    assert_real_eq_nan(a->latency_ms, b->latency_ms);
    assert_real_eq_nan(a->queue_ms, b->queue_ms);
    assert_str_eq_null(a->metadata, b->metadata);
    assert_str_eq_null(a->result, b->result);
    assert_int_equal(a->request_form, b->request_form);
    assert_str_eq_null(a->batch_id, b->batch_id);
    assert_str_eq_null(a->request, b->request);
    assert_str_eq_null(a->error_code, b->error_code);
    assert_str_eq_null(a->reasoning, b->reasoning);
    assert_int_equal(a->reasoning_tokens, b->reasoning_tokens);
    assert_str_eq_null(a->output_json, b->output_json);
}

/* Collects query results: compares each with expected[] in order, or just counts. */
struct collect {
    const struct db_result *expected;
    int n;
    int stop_after; /* return 7 after this many rows (0 = never) */
    char ids[64][48];
};

static int collect_row(void *ctx, const struct db_result *row)
{
    struct collect *c = ctx;
    if (c->expected)
        assert_row_equal(row, &c->expected[c->n]);
    if (c->n < 64)
        snprintf(c->ids[c->n], sizeof c->ids[0], "%s", row->id);
    c->n++;
    return c->stop_after && c->n >= c->stop_after ? 7 : 0;
}

/* The row with this id, copied into *out with its strings in b (false if there is none). */
struct one {
    struct db_result r;
    struct rowbuf b;
    char error[256];
    bool found;
};

static int copy_row(void *ctx, const struct db_result *row)
{
    struct one *o = ctx;
    o->r = *row;
    o->found = true;
    snprintf(o->b.output, sizeof o->b.output, "%s", row->output ? row->output : "");
    snprintf(o->error, sizeof o->error, "%s", row->error ? row->error : "");
    o->r.output = row->output ? o->b.output : NULL;
    o->r.error = row->error ? o->error : NULL;
    o->r.id = o->r.custom_id = o->r.queue = o->r.model = o->r.params = NULL;
    o->r.finish_reason = o->r.worker_id = o->r.metadata = o->r.result = NULL;
    o->r.batch_id = o->r.request = o->r.error_code = o->r.reasoning = o->r.output_json = NULL;
    return 0;
}

static struct one get_row(struct db *db, const char *id)
{
    struct one o = {.found = false};
    struct db_query q = db_query_all();
    q.id = id;
    assert_int_equal(db_query_results(db, &q, copy_row, &o), 0);
    return o;
}

/* ---- opening and the schema */

static void test_open_creates_schema(void **state)
{
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = 1234;
    struct db *db = open_ok(&o);
    sqlite3 *h = db_handle(db);
    assert_int_equal(db_n_migrations, db_migrations[db_n_migrations - 1].version);
    assert_int_equal(db_schema_version(db), db_n_migrations);
    assert_int_equal(raw_int(h, "PRAGMA user_version"), db_n_migrations);
    assert_int_equal(raw_int(h, "PRAGMA application_id"), 0x6c6c6d71);
    assert_string_equal(raw_text(h, "PRAGMA journal_mode"), "wal");
    assert_int_equal(raw_int(h, "PRAGMA synchronous"), 1); /* NORMAL */
    assert_int_equal(raw_int(h, "PRAGMA foreign_keys"), 1);
    assert_int_equal(raw_int(h, "PRAGMA busy_timeout"), 1234);
    assert_string_equal(db_path(db), path);
    assert_string_equal(db_errmsg(db), "");
    /* every table STRICT */
    const char *tables[] = {"jobs", "workers", "worker_metrics"};
    for (int i = 0; i < 3; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT strict FROM pragma_table_list WHERE name = '%s'", tables[i]);
        assert_int_equal(raw_int(h, sql), 1);
    }
    db_close(db);
    db_close(NULL);

    /* opening again is a no-op for the schema, and the file stays in WAL mode */
    db = open_ok(NULL);
    assert_int_equal(db_schema_version(db), db_n_migrations);
    db_close(db);
    sqlite3 *r = raw_open();
    assert_string_equal(raw_text(r, "PRAGMA journal_mode"), "wal");
    sqlite3_close(r);
}

/* The column tables in db.c against the DDL: same names, same order. */
static void test_columns_match_schema(void **state)
{
    struct db *db = open_ok(NULL);
    const char *tables[] = {"jobs", "worker_metrics", "batches", "job_parts", "workers"};
    for (int t = 0; t < 5; t++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT name FROM pragma_table_info('%s') ORDER BY cid", tables[t]);
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(db_handle(db), sql, -1, &st, NULL), SQLITE_OK);
        size_t i = 0;
        for (; sqlite3_step(st) == SQLITE_ROW; i++) {
            const char *c = db_test_column(tables[t], i);
            if (!c || strcmp(c, (const char *)sqlite3_column_text(st, 0)))
                fail_msg("%s column %zu: schema has %s, db.c has %s", tables[t], i,
                         sqlite3_column_text(st, 0), c ? c : "nothing");
        }
        sqlite3_finalize(st);
        assert_null(db_test_column(tables[t], i)); /* db.c has no extra columns */
    }
    db_close(db);
}

static const char *const m002_sql = "ALTER TABLE jobs ADD COLUMN extra TEXT;\n"
                                    "CREATE TABLE notes (job_id TEXT NOT NULL, note TEXT) STRICT;\n"
                                    "INSERT INTO notes SELECT id, 'migrated' FROM jobs;\n";

/* n rows as schema version 1 knows them (the columns of 001_init.sql), written with plain SQL:
 * what an older llmq left in its database. */
static void insert_v1_rows(sqlite3 *h, int n)
{
    for (int i = 0; i < n; i++) {
        char sql[1024];
        snprintf(
            sql, sizeof sql,
            "INSERT INTO jobs (id, custom_id, queue, status, model, params, output, finish_reason, "
            "prompt_tokens, completion_tokens, error, attempts, worker_id, created_at, started_at, "
            "first_token_at, finished_at, ttft_ms, latency_ms, queue_ms, metadata, result, request_form) "
            "VALUES ('old-%d', %s, 'short', '%s', 'tiny', '{\"max_tokens\":8}', %s, %s, 5, 3, %s, 1, "
            "'w0', 1.7e9, 1.7e9 + 1, 1.7e9 + 1.5, 1.7e9 + 2 + %d, 500, 1000, 1000, NULL, "
            "'{\"id\":\"old-%d\"}', '%s')",
            i, i % 2 ? "'req-1'" : "NULL", i == 2 ? "failed" : "completed", i == 2 ? "NULL" : "'text'",
            i == 2 ? "NULL" : "'stop'", i == 2 ? "'field ''x'': bad'" : "NULL", i, i,
            i % 2 ? "openai" : "llmq");
        raw_exec(h, sql);
    }
}

static void test_migrate_from_v1(void **state)
{
    struct db_migration list[2] = {db_migrations[0], {2, "002_test", m002_sql}};
    struct db_opts o = db_opts_default();
    o.migrations = list;
    o.n_migrations = 1;
    struct db *db = open_ok(&o); /* a version-1 database */
    assert_int_equal(db_schema_version(db), 1);
    insert_v1_rows(db_handle(db), 3);
    db_close(db);

    o.n_migrations = 2;
    db = open_ok(&o);
    assert_int_equal(db_schema_version(db), 2);
    sqlite3 *h = db_handle(db);
    assert_int_equal(raw_int(h, "PRAGMA user_version"), 2);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE extra IS NULL"), 3); /* the new column */
    assert_int_equal(raw_int(h, "SELECT count(*) FROM notes"), 3);                    /* data migrated */
    db_close(db);

    /* this binary (one migration fewer than the file) refuses it, naming path and versions */
    o.n_migrations = 1;
    struct db *db2 = (struct db *)0x1;
    assert_int_equal(db_open(path, &o, &db2, err, sizeof err), DB_ERR_NEWER);
    assert_null(db2);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "schema version 2, newer than this llmq knows (1)"));
}

/* A database made by schema versions 1 and 2 (before batches), with rows, opened by this llmq:
 * every row is kept with its values, the new columns are NULL there, and new rows carry them. */
static void test_migrate_to_batches(void **state)
{
    struct db_opts o = db_opts_default();
    o.n_migrations = 2;
    o.migrations = db_migrations;
    struct db *db = open_ok(&o);
    assert_int_equal(db_schema_version(db), 2);
    insert_v1_rows(db_handle(db), 4);
    const char *before =
        "SELECT group_concat(id || '|' || status || '|' || coalesce(custom_id, '-') || '|' || "
        "coalesce(error, '-') || '|' || finished_at || '|' || result, ';') FROM "
        "(SELECT * FROM jobs ORDER BY id)";
    char want[4096];
    snprintf(want, sizeof want, "%s", raw_text(db_handle(db), before));
    db_close(db);

    db = open_ok(NULL); /* every migration: 003 is applied */
    assert_int_equal(db_schema_version(db), db_n_migrations);
    sqlite3 *h = db_handle(db);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs"), 4);
    assert_string_equal(raw_text(h, before), want);
    assert_int_equal(
        raw_int(
            h, "SELECT count(*) FROM jobs WHERE batch_id IS NULL AND request IS NULL AND error_code IS NULL"),
        4);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM batches"), 0);
    /* the old rows are read back through db.c and the views see them */
    struct collect c = {0};
    assert_int_equal(db_query_results(db, NULL, collect_row, &c), 0);
    assert_int_equal(c.n, 4);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM job_failures"), 1);
    assert_int_equal(raw_int(h, "SELECT jobs FROM daily_model_usage"), 4);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM batch_summary"), 0);
    /* a new row next to them, in a batch */
    struct rowbuf b;
    struct db_result r = make_row(&b, 1, 1.8e9);
    struct db_batch batch = db_batch_empty();
    batch.id = "night-1";
    batch.input = "jobs.jsonl";
    batch.created_at = 1.8e9 - 60;
    batch.total = 1;
    batch.state = "running";
    r.batch = &batch;
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
    assert_string_equal(raw_text(h, "SELECT batch_id || '|' || input || '|' || state FROM batch_summary"),
                        "night-1|jobs.jsonl|running");
    db_close(db);
}

/* A database made with the first `from` migrations and three old rows, opened again by this llmq:
 * the migration named `next` and every later one are applied and the old rows read as before.
 * Returns the upgraded database. */
static struct db *upgraded_from(int from, const char *next)
{
    struct db_opts o = db_opts_default();
    o.n_migrations = from;
    o.migrations = db_migrations;
    struct db *db = open_ok(&o);
    assert_int_equal(db_schema_version(db), from);
    insert_v1_rows(db_handle(db), 3);
    const char *before =
        "SELECT group_concat(id || '|' || status || '|' || output || '|' || result, ';') FROM "
        "(SELECT * FROM jobs ORDER BY id)";
    char want[4096];
    snprintf(want, sizeof want, "%s", raw_text(db_handle(db), before));
    db_close(db);

    db = open_ok(NULL);
    assert_true(db_n_migrations > from);
    assert_string_equal(db_migrations[from].name, next);
    assert_int_equal(db_schema_version(db), db_n_migrations);
    assert_string_equal(raw_text(db_handle(db), before), want);
    return db;
}

/* A database of schema version 3 (before reasoning), with rows, opened by this llmq: the rows keep
 * their values with reasoning and reasoning_tokens NULL (read back as none), new rows carry both, and
 * the CHECK refuses a negative count. */
static void test_migrate_to_reasoning(void **state)
{
    struct db *db = upgraded_from(3, "004_reasoning");
    sqlite3 *h = db_handle(db);
    assert_int_equal(
        raw_int(h, "SELECT count(*) FROM jobs WHERE reasoning IS NULL AND reasoning_tokens IS NULL"), 3);
    struct one old = get_row(db, "old-0");
    assert_true(old.found);
    assert_null(old.r.reasoning);
    assert_int_equal(old.r.reasoning_tokens, -1);

    /* new rows: one with reasoning (multi-byte, with a NUL-free length), one without */
    struct rowbuf b1, b2;
    struct db_result r[2] = {make_row(&b1, 1, 1.8e9), make_row(&b2, 2, 1.8e9)};
    const char *reasoning = "let me think \xc3\xa9\n";
    r[0].reasoning = reasoning;
    r[0].reasoning_len = strlen(reasoning);
    r[0].reasoning_tokens = 7;
    assert_int_equal(db_put_results(db, r, 2, NULL), DB_OK);
    assert_string_equal(
        raw_text(h, "SELECT reasoning || '|' || reasoning_tokens FROM jobs WHERE id = 'job-00001'"),
        "let me think \xc3\xa9\n|7");
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE id = 'job-00002' AND reasoning IS NULL AND "
                                "reasoning_tokens IS NULL"),
                     1);
    struct collect c = {.expected = r};
    struct db_query q = db_query_all();
    q.since = 1.8e9; /* the two new rows, in order */
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 2);
    char *msg = NULL;
    assert_int_not_equal(
        sqlite3_exec(h, "UPDATE jobs SET reasoning_tokens = -1 WHERE id = 'job-00001'", NULL, NULL, &msg),
        SQLITE_OK);
    assert_non_null(strstr(msg, "CHECK constraint failed"));
    sqlite3_free(msg);
    db_close(db);
}

/* A database of schema version 4 (before output_json), with rows, opened by this llmq: the rows
 * keep their values with output_json NULL, a new row's JSON is stored minified with its numbers as
 * written and answers json_extract, and the CHECK refuses text that is not JSON (the row alone). */
static void test_migrate_to_output_json(void **state)
{
    struct db *db = upgraded_from(4, "005_structured_output");
    sqlite3 *h = db_handle(db);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE output_json IS NULL"), 3);
    struct one old = get_row(db, "old-0");
    assert_true(old.found);
    assert_null(old.r.output_json);

    struct rowbuf b1, b2, b3;
    struct db_result r[3] = {make_row(&b1, 1, 1.8e9), make_row(&b2, 2, 1.8e9), make_row(&b3, 3, 1.8e9)};
    r[0].output_json = "{\n  \"title\": \"Caf\xc3\xa9\",\n  \"score\": 0.10,  \"tags\": [\"a\", \"b\"] }";
    r[2].output_json = "{\"cut\": "; /* not JSON: the CHECK refuses this row only */
    int row_rc[3];
    assert_int_equal(db_put_results(db, r, 3, row_rc), DB_ERR_ROW);
    assert_int_equal(row_rc[0], 0);
    assert_int_equal(row_rc[1], 0);
    assert_int_equal(row_rc[2], DB_ERR_ROW);
    assert_string_equal(raw_text(h, "SELECT output_json FROM jobs WHERE id = 'job-00001'"),
                        "{\"title\":\"Caf\xc3\xa9\",\"score\":0.10,\"tags\":[\"a\",\"b\"]}");
    assert_string_equal(raw_text(h,
                                 "SELECT json_extract(output_json, '$.title') || '|' || "
                                 "json_extract(output_json, '$.tags[1]') FROM jobs WHERE id = 'job-00001'"),
                        "Caf\xc3\xa9|b");
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE id = 'job-00002' AND output_json IS NULL"),
                     1);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE id = 'job-00003'"), 0);
    /* read back as stored */
    struct db_query q = db_query_all();
    q.id = "job-00001";
    r[0].output_json = "{\"title\":\"Caf\xc3\xa9\",\"score\":0.10,\"tags\":[\"a\",\"b\"]}";
    struct collect c = {.expected = r};
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 1);
    db_close(db);
}

static void test_failed_migration_rolls_back(void **state)
{
    struct db_migration list[2] = {db_migrations[0],
                                   {2, "002_bad",
                                    "CREATE TABLE t2 (a INTEGER) STRICT;\n"
                                    "INSERT INTO nope VALUES (1);\n"}};
    struct db_opts o = db_opts_default();
    o.migrations = list;
    o.n_migrations = 2;
    struct db *db = NULL;
    assert_int_equal(db_open(path, &o, &db, err, sizeof err), DB_ERR);
    assert_null(db);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "002_bad"));
    assert_non_null(strstr(err, "no such table: nope"));
    assert_non_null(strstr(err, "stays at version 1"));
    sqlite3 *h = raw_open();
    assert_int_equal(raw_int(h, "PRAGMA user_version"), 1); /* 001 applied, 002 not */
    assert_int_equal(raw_int(h, "SELECT count(*) FROM sqlite_schema WHERE name = 't2'"), 0);
    sqlite3_close(h);
    db = open_ok(NULL);
    db_close(db);
}

static void test_newer_version(void **state)
{
    db_close(open_ok(NULL));
    sqlite3 *h = raw_open();
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", db_n_migrations + 5);
    raw_exec(h, sql);
    sqlite3_close(h);
    struct db *db = NULL;
    assert_int_equal(db_open(path, NULL, &db, err, sizeof err), DB_ERR_NEWER);
    assert_null(db);
    char want[160];
    snprintf(want, sizeof want, "schema version %d, newer than this llmq knows (%d)", db_n_migrations + 5,
             db_n_migrations);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "upgrade llmq"));
}

static void test_not_ours(void **state)
{
    struct db *db = NULL;
    /* not SQLite at all */
    FILE *f = fopen(path, "w");
    fputs("this is a text file, not a database, and it is long enough to have a header page....\n", f);
    fclose(f);
    assert_int_equal(db_open(path, NULL, &db, err, sizeof err), DB_ERR);
    assert_null(db);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "file is not a database"));
    /* another program's database */
    unlink(path);
    sqlite3 *h = raw_open();
    raw_exec(h, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)");
    sqlite3_close(h);
    assert_int_equal(db_open(path, NULL, &db, err, sizeof err), DB_ERR);
    assert_non_null(strstr(err, "not an llmq database"));
    /* a directory that does not exist */
    char bad[200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.db", dir);
    assert_int_equal(db_open(bad, NULL, &db, err, sizeof err), DB_ERR);
    assert_non_null(strstr(err, bad));
    char want[300];
    snprintf(want, sizeof want, "cannot create it: the folder %s/no/such/dir does not exist", dir);
    assert_non_null(strstr(err, want));
}

static void test_readonly(void **state)
{
    struct db_opts o = db_opts_default();
    o.readonly = true;
    struct db *db = NULL;
    assert_int_equal(db_open(path, &o, &db, err, sizeof err), DB_ERR); /* not created */
    assert_non_null(strstr(err, path));
    assert_int_equal(access(path, F_OK), -1);

    db = open_ok(NULL);
    struct rowbuf b;
    struct db_result r = make_row(&b, 1, 1.7e9);
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
    db_close(db);

    db = open_ok(&o);
    struct collect c = {.expected = &r};
    assert_int_equal(db_query_results(db, NULL, collect_row, &c), 0);
    assert_int_equal(c.n, 1);
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_ERR);
    assert_non_null(strstr(db_errmsg(db), "read-only"));
    assert_non_null(strstr(db_errmsg(db), path));
    db_close(db);
}

/* The path's files deleted, or another database renamed over the path, while a handle is open:
 * SQLite goes on committing into the old inode; db_file_moved notices and db_reopen makes a new
 * database at the path that the next write goes into. */
static void unlink_db_files(void)
{
    char name[256];
    const char *const suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s", path, suffix[i]);
        unlink(name);
    }
}

static void test_file_moved_reopen(void **state)
{
    struct db *db = open_ok(NULL);
    struct rowbuf b;
    struct db_result r = make_row(&b, 1, 1.7e9);
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
    assert_false(db_file_moved(db));

    unlink_db_files();
    assert_true(db_file_moved(db));
    assert_non_null(strstr(db_errmsg(db), "deleted"));
    assert_non_null(strstr(db_errmsg(db), path));
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK); /* into the unlinked file */
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(db_reopen(db), DB_OK);
    assert_false(db_file_moved(db));
    assert_int_equal(count_jobs(db), 0); /* a new database, with its schema */
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
    db_close(db);
    db = open_ok(NULL);
    assert_int_equal(count_jobs(db), 1); /* the row is in the file at the path */

    /* only the -wal deleted: noticed too */
    char wal[256];
    snprintf(wal, sizeof wal, "%s-wal", path);
    assert_int_equal(unlink(wal), 0);
    assert_true(db_file_moved(db));
    assert_non_null(strstr(db_errmsg(db), "-wal was deleted"));
    assert_int_equal(db_reopen(db), DB_OK);
    assert_int_equal(count_jobs(db), 1); /* the main file kept its row */
    db_close(db);

    /* another database renamed over the path */
    db = open_ok(NULL);
    char other[256];
    snprintf(other, sizeof other, "%s/other.db", dir);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(other, &h), SQLITE_OK);
    raw_exec(h, "CREATE TABLE t (x)");
    sqlite3_close(h);
    assert_int_equal(rename(other, path), 0);
    assert_true(db_file_moved(db));
    assert_non_null(strstr(db_errmsg(db), "replaced"));
    assert_int_equal(db_reopen(db), DB_UNWRITABLE); /* not an llmq database: nothing to write into */
    assert_non_null(strstr(db_errmsg(db), "not an llmq database"));
    assert_true(db_file_moved(db));
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_UNWRITABLE);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(db_reopen(db), DB_OK);
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
    db_close(db);
}

/* The write db_open makes to check the file does not wait for another writer's lock: the file
 * takes writes, and the worker starts as it did before that check. */
static void test_open_while_locked(void **state)
{
    struct db *db = open_ok(NULL);
    db_close(db);
    sqlite3 *h = raw_open();
    raw_exec(h, "BEGIN IMMEDIATE");
    double t0 = db_now();
    db = open_ok(NULL); /* busy_timeout 5000 */
    assert_true(db_now() - t0 < 2.0);
    raw_exec(h, "COMMIT");
    sqlite3_close(h);
    db_close(db);
}

/* ---- writing jobs */

/* Writes one row for `id` with this status, output and attempts. */
static void put_one(struct db *db, const char *id, enum db_status st, const char *output, int attempts,
                    double t)
{
    struct db_result r = db_result_empty();
    r.id = id;
    r.status = st;
    r.output = output;
    r.error = st == DB_FAILED ? "engine error" : NULL;
    r.attempts = attempts;
    r.finished_at = t;
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_OK);
}

static void expect_row(struct db *db, const char *id, enum db_status st, const char *output, int attempts)
{
    struct one o = get_row(db, id);
    assert_true(o.found);
    assert_int_equal(o.r.status, st);
    assert_str_eq_null(o.r.output, output);
    assert_int_equal(o.r.attempts, attempts);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE id = '%s'", id);
    assert_int_equal(raw_int(db_handle(db), sql), 1);
}

static void test_upsert_replay(void **state)
{
    struct db *db = open_ok(NULL);
    /* the same completed job twice: one row, the later processing */
    put_one(db, "a", DB_COMPLETED, "first", 1, 100);
    put_one(db, "a", DB_COMPLETED, "second", 2, 101);
    expect_row(db, "a", DB_COMPLETED, "second", 2);
    /* a failed replay of a completed job keeps the result, counts the attempt */
    put_one(db, "a", DB_FAILED, NULL, 3, 102);
    expect_row(db, "a", DB_COMPLETED, "second", 3);
    assert_null(get_row(db, "a").r.error);
    /* ... and a cancelled one too */
    put_one(db, "a", DB_CANCELLED, "sec", 4, 103);
    expect_row(db, "a", DB_COMPLETED, "second", 4);
    /* an older attempt count never lowers it */
    put_one(db, "a", DB_COMPLETED, "third", 1, 104);
    expect_row(db, "a", DB_COMPLETED, "third", 4);

    /* failed, then retried and completed */
    put_one(db, "b", DB_FAILED, NULL, 1, 100);
    expect_row(db, "b", DB_FAILED, NULL, 1);
    put_one(db, "b", DB_COMPLETED, "done", 2, 101);
    expect_row(db, "b", DB_COMPLETED, "done", 2);
    assert_null(get_row(db, "b").r.error);

    /* failed, then cancelled: the cancellation; cancelled, then failed: still cancelled */
    put_one(db, "c", DB_FAILED, NULL, 1, 100);
    put_one(db, "c", DB_CANCELLED, "part", 1, 101);
    expect_row(db, "c", DB_CANCELLED, "part", 1);
    put_one(db, "c", DB_FAILED, NULL, 2, 102);
    expect_row(db, "c", DB_CANCELLED, "part", 2);
    /* cancelled, then completed by a replay that did not see the cancel: the result */
    put_one(db, "c", DB_COMPLETED, "full", 3, 103);
    expect_row(db, "c", DB_COMPLETED, "full", 3);

    /* failed twice: the later error */
    put_one(db, "d", DB_FAILED, NULL, 1, 100);
    put_one(db, "d", DB_FAILED, NULL, 2, 101);
    expect_row(db, "d", DB_FAILED, NULL, 2);

    /* the same id twice inside one batch */
    struct db_result two[2] = {db_result_empty(), db_result_empty()};
    two[0].id = two[1].id = "e";
    two[0].output = "one", two[1].output = "two";
    two[0].finished_at = two[1].finished_at = 5;
    assert_int_equal(db_put_results(db, two, 2, NULL), DB_OK);
    expect_row(db, "e", DB_COMPLETED, "two", 1);
    assert_int_equal(count_jobs(db), 5);
    db_close(db);
}

static void test_batch_1000(void **state)
{
    enum { N = 1000 };
    struct rowbuf *b = calloc(N, sizeof *b);
    struct db_result *rows = calloc(N, sizeof *rows);
    double t0 = db_now() - 3600;
    for (int i = 0; i < N; i++)
        rows[i] = make_row(&b[i], i, t0);
    /* some NULLs: no custom_id / metadata, unknown times */
    rows[7].metadata = NULL;
    rows[7].first_token_at = NAN;
    rows[7].ttft_ms = NAN;
    rows[8].status = DB_FAILED;
    rows[8].output = NULL;
    rows[8].error = "field 'max_tokens': expected an integer >= 1, got -3";
    rows[9].output = "";

    struct db *db = open_ok(NULL);
    int *rc = calloc(N, sizeof *rc);
    assert_int_equal(db_put_results(db, rows, N, rc), DB_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(rc[i], 0);
    assert_int_equal(count_jobs(db), N);
    /* everything reads back as written, in finished_at order */
    struct collect c = {.expected = rows};
    assert_int_equal(db_query_results(db, NULL, collect_row, &c), 0);
    assert_int_equal(c.n, N);
    /* the empty output is '' (not NULL) */
    assert_int_equal(raw_int(db_handle(db), "SELECT count(*) FROM jobs WHERE output = ''"), 1);
    /* writing them all again (a replay of everything) leaves N rows */
    for (int k = 0; k < 4; k++)
        assert_int_equal(db_put_results(db, rows + k * 250, 250, NULL), DB_OK);
    assert_int_equal(count_jobs(db), N);
    db_close(db);
    free(rc);
    free(rows);
    free(b);
}

static void test_rejected_rows(void **state)
{
    struct rowbuf b[6];
    struct db_result rows[6];
    for (int i = 0; i < 6; i++)
        rows[i] = make_row(&b[i], i, 1.7e9);
    rows[1].status = (enum db_status)7;     /* C side: out of range */
    rows[2].params = "{\"max_tokens\": 16"; /* schema: CHECK json_valid */
    rows[4].id = NULL;                      /* C side: no id */
    rows[5].finished_at = NAN;              /* C side: required */
    struct db *db = open_ok(NULL);
    int rc[6];
    memset(rc, 0x55, sizeof rc);
    assert_int_equal(db_put_results(db, rows, 6, rc), DB_ERR_ROW);
    int want[6] = {0, DB_ERR_ROW, DB_ERR_ROW, 0, DB_ERR_ROW, DB_ERR_ROW};
    for (int i = 0; i < 6; i++)
        assert_int_equal(rc[i], want[i]);
    assert_int_equal(count_jobs(db), 2); /* the good rows were committed */
    const char *m = db_errmsg(db);
    assert_non_null(strstr(m, path));
    assert_non_null(strstr(m, "job 'job-00001' (row 2 of 6) rejected: status out of range"));
    assert_non_null(strstr(m, "3 more rows rejected"));
    /* the schema's own message for a bad JSON column */
    assert_int_equal(db_put_results(db, &rows[2], 1, NULL), DB_ERR_ROW);
    assert_non_null(strstr(db_errmsg(db), "job-00002"));
    assert_non_null(strstr(db_errmsg(db), "CHECK constraint failed"));
    assert_non_null(strstr(db_errmsg(db), "json_valid(params)"));
    assert_int_equal(db_put_results(db, rows, 0, NULL), DB_OK);
    db_close(db);
}

static void expect_raw_fail(sqlite3 *h, const char *sql, int want_rc, const char *want_msg)
{
    char *msg = NULL;
    int rc = sqlite3_exec(h, sql, NULL, NULL, &msg);
    if (rc == SQLITE_OK)
        fail_msg("accepted: %s", sql);
    assert_int_equal(sqlite3_extended_errcode(h), want_rc);
    if (!strstr(msg, want_msg))
        fail_msg("%s: got '%s', want '%s'", sql, msg, want_msg);
    sqlite3_free(msg);
}

static void test_strict_and_checks(void **state)
{
    db_close(open_ok(NULL));
    sqlite3 *h = raw_open();
    const char *cols =
        "INSERT INTO jobs (id, status, finished_at, prompt_tokens, ttft_ms, params, request_form) ";
    char sql[512];
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 1.5, 'many', NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_DATATYPE,
                    "cannot store TEXT value in INTEGER column jobs.prompt_tokens");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 1.5, 3, 'fast', NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_DATATYPE,
                    "cannot store TEXT value in REAL column jobs.ttft_ms");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', x'00', 3, NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_DATATYPE,
                    "cannot store BLOB value in REAL column jobs.finished_at");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'done', 1.5, 3, NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_CHECK, "CHECK constraint failed");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 1.5, -3, NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_CHECK, "prompt_tokens >= 0");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 1.5, 3, NULL, '{oops', 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_CHECK, "json_valid(params)");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 1.5, 3, NULL, NULL, 'anthropic')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_CHECK, "request_form IN");
    snprintf(sql, sizeof sql, "%s VALUES (NULL, 'completed', 1.5, 3, NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_NOTNULL, "jobs.id");
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', NULL, 3, NULL, NULL, 'llmq')", cols);
    expect_raw_fail(h, sql, SQLITE_CONSTRAINT_NOTNULL, "jobs.finished_at");
    /* what STRICT allows: an integer into a REAL column is stored as REAL */
    snprintf(sql, sizeof sql, "%s VALUES ('x', 'completed', 2, 3, 40, '{}', 'llmq')", cols);
    raw_exec(h, sql);
    assert_string_equal(raw_text(h, "SELECT typeof(ttft_ms) || typeof(finished_at) FROM jobs"), "realreal");
    /* a metrics row for a worker that does not exist: foreign key (with foreign_keys on) */
    raw_exec(h, "PRAGMA foreign_keys = ON");
    expect_raw_fail(h, "INSERT INTO worker_metrics (worker_id, ts, interval_s) VALUES ('ghost', 1, 10)",
                    SQLITE_CONSTRAINT_FOREIGNKEY, "FOREIGN KEY constraint failed");
    sqlite3_close(h);
}

static void test_json_columns(void **state)
{
    struct rowbuf b[4];
    struct db_result rows[4];
    for (int i = 0; i < 4; i++)
        rows[i] = make_row(&b[i], i, 1.7e9);
    struct db *db = open_ok(NULL);
    assert_int_equal(db_put_results(db, rows, 4, NULL), DB_OK);
    sqlite3 *h = db_handle(db);
    assert_string_equal(
        raw_text(h, "SELECT json_extract(metadata, '$.doc') FROM jobs WHERE id = 'job-00002'"), "doc-2.txt");
    assert_int_equal(raw_int(h, "SELECT count(*) FROM jobs WHERE json_extract(metadata, '$.batch') = 0"), 4);
    assert_int_equal(
        raw_int(h, "SELECT json_extract(params, '$.max_tokens') FROM jobs WHERE id = 'job-00003'"), 16 + 3);
    assert_int_equal(raw_int(h, "SELECT sum(json_extract(result, '$.usage.completion_tokens')) FROM jobs"),
                     (10 + 0) + (10 + 1) + (10 + 2) + (10 + 3));
    assert_int_equal(raw_int(h,
                             "SELECT count(*) FROM jobs WHERE json_extract(result, '$.usage.prompt_tokens') "
                             "= prompt_tokens"),
                     4);
    /* non-ASCII text round-trips byte for byte */
    assert_string_equal(raw_text(h, "SELECT output FROM jobs WHERE id = 'job-00001'"),
                        "summary number 1: \xc3\xa9t\xc3\xa9 \xe2\x9c\x93");
    db_close(db);
}

/* ---- locks */

static void test_busy_other_connection(void **state)
{
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = 50;
    o.busy_retries = 1;
    o.backoff_ms = 10;
    struct db *db = open_ok(&o);
    struct rowbuf b[3];
    struct db_result rows[3];
    for (int i = 0; i < 3; i++)
        rows[i] = make_row(&b[i], i, 1.7e9);

    sqlite3 *h = raw_open();
    raw_exec(h,
             "BEGIN IMMEDIATE; INSERT INTO workers (id, started_at, last_seen_at) VALUES ('holder', 1, 1)");
    double t = db_now();
    assert_int_equal(db_put_results(db, rows, 3, NULL), DB_BUSY);
    double waited = db_now() - t;
    assert_true(waited >= 0.09); /* two tries of busy_timeout 50 ms */
    const char *m = db_errmsg(db);
    assert_non_null(strstr(m, path));
    assert_non_null(strstr(m, "writing 3 results: database is locked"));
    assert_non_null(strstr(m, "gave up after 2 tries"));
    assert_non_null(strstr(m, "nothing was written"));
    /* the others fail the same way */
    struct db_worker w = {.id = "w1", .started_at = 1};
    assert_int_equal(db_put_worker(db, &w), DB_BUSY);
    /* reading is not blocked (WAL) */
    struct collect c = {0};
    assert_int_equal(db_query_results(db, NULL, collect_row, &c), 0);
    assert_int_equal(c.n, 0);

    raw_exec(h, "COMMIT");
    assert_int_equal(db_put_results(db, rows, 3, NULL), DB_OK); /* the caller's later try succeeds */
    assert_int_equal(count_jobs(db), 3);
    sqlite3_close(h);
    db_close(db);
}

/* Another process holds the write lock for `hold_ms`, longer than busy_timeout; one call with
 * enough retries waits it out. */
static void test_busy_other_process(void **state)
{
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = 150;
    o.busy_retries = 6;
    o.backoff_ms = 50;
    struct db *db = open_ok(&o);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        sqlite3 *h = NULL;
        if (sqlite3_open(path, &h) != SQLITE_OK ||
            sqlite3_exec(h, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK)
            _exit(1);
        if (write(fd[1], "x", 1) != 1)
            _exit(1);
        struct timespec ts = {0, 600 * 1000000L};
        nanosleep(&ts, NULL);
        sqlite3_exec(h, "COMMIT", NULL, NULL, NULL);
        sqlite3_close(h);
        _exit(0);
    }
    char x;
    assert_int_equal(read(fd[0], &x, 1), 1); /* the child holds the lock */
    struct rowbuf b;
    struct db_result r = make_row(&b, 1, 1.7e9);
    double t = db_now();
    int rc = db_put_results(db, &r, 1, NULL);
    double waited = db_now() - t;
    if (rc != DB_OK)
        fail_msg("%s", db_errmsg(db));
    assert_true(waited >= 0.4); /* it really waited for the other process */
    assert_int_equal(count_jobs(db), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(fd[0]);
    close(fd[1]);
    db_close(db);
}

/* The sqlite3 shell (what a user poking at the file would run) holds BEGIN EXCLUSIVE. */
static void test_busy_sqlite3_shell(void **state)
{
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = 100;
    o.busy_retries = 0;
    struct db *db = open_ok(&o);
    if (system("command -v sqlite3 >/dev/null 2>&1") != 0) {
        printf("note: no sqlite3 shell on this machine; test_busy_other_process covers the same case\n");
        db_close(db);
        return;
    }
    char marker[160], cmd[512];
    snprintf(marker, sizeof marker, "%s/locked", dir);
    snprintf(cmd, sizeof cmd,
             "printf 'BEGIN EXCLUSIVE;\\n.shell touch %s\\n.shell sleep 1\\nCOMMIT;\\n' | sqlite3 %s &",
             marker, path);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 500 && access(marker, F_OK) != 0; i++)
        usleep(10000);
    assert_int_equal(access(marker, F_OK), 0);
    struct rowbuf b;
    struct db_result r = make_row(&b, 1, 1.7e9);
    assert_int_equal(db_put_results(db, &r, 1, NULL), DB_BUSY); /* no retries: busy */
    assert_int_equal(count_jobs(db), 0);
    int rc = DB_BUSY;
    for (int i = 0; i < 60 && rc == DB_BUSY; i++) /* the caller tries again later */
        rc = db_put_results(db, &r, 1, NULL);
    assert_int_equal(rc, DB_OK);
    assert_int_equal(count_jobs(db), 1);
    db_close(db);
}

/* ---- readers during writes */

static void test_wal_readers(void **state)
{
    struct db *db = open_ok(NULL);
    struct rowbuf b[100];
    struct db_result rows[100];
    for (int i = 0; i < 100; i++)
        rows[i] = make_row(&b[i], i, 1.7e9);
    /* a reader in the middle of a read transaction neither blocks the writer nor sees its rows */
    sqlite3 *r = raw_open();
    raw_exec(r, "BEGIN");
    assert_int_equal(raw_int(r, "SELECT count(*) FROM jobs"), 0);
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = 0; /* any wait would fail the write */
    o.busy_retries = 0;
    struct db *w = open_ok(&o);
    assert_int_equal(db_put_results(w, rows, 100, NULL), DB_OK);
    assert_int_equal(raw_int(r, "SELECT count(*) FROM jobs"), 0); /* its snapshot */
    raw_exec(r, "COMMIT");
    assert_int_equal(raw_int(r, "SELECT count(*) FROM jobs"), 100);
    sqlite3_close(r);
    db_close(w);

    /* a writer process commits 20 batches while this one keeps querying */
    pid_t pid = fork();
    if (pid == 0) {
        struct db *cw = NULL;
        char e[512];
        if (db_open(path, NULL, &cw, e, sizeof e))
            _exit(1);
        static struct rowbuf cb[50];
        struct db_result cr[50];
        for (int k = 0; k < 20; k++) {
            for (int i = 0; i < 50; i++)
                cr[i] = make_row(&cb[i], 1000 + k * 50 + i, 1.7e9);
            if (db_put_results(cw, cr, 50, NULL))
                _exit(2);
            usleep(2000);
        }
        db_close(cw);
        _exit(0);
    }
    int last = 0, reads = 0, status = 0;
    for (;;) {
        struct collect c = {0};
        assert_int_equal(db_query_results(db, NULL, collect_row, &c), 0);
        assert_true(c.n >= last);              /* never a torn or older view */
        assert_int_equal((c.n - 100) % 50, 0); /* whole batches only */
        last = c.n;
        reads++;
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        usleep(1000);
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(count_jobs(db), 100 + 20 * 50);
    printf("note: %d full reads while another process wrote 20 batches\n", reads);
    db_close(db);
}

/* Several processes opening a new file at once: one creates the schema, none fails. */
static void test_concurrent_open(void **state)
{
    enum { N = 4 };
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            struct db *d = NULL;
            char e[512];
            int rc = db_open(path, NULL, &d, e, sizeof e);
            if (rc)
                fprintf(stderr, "child %d: %s\n", i, e);
            struct db_worker w = {.id = "w", .started_at = 1};
            if (!rc)
                rc = db_put_worker(d, &w);
            db_close(d);
            _exit(rc ? 1 : 0);
        }
    }
    for (int i = 0; i < N; i++) {
        int status;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    struct db *db = open_ok(NULL);
    assert_int_equal(db_schema_version(db), db_n_migrations);
    assert_int_equal(raw_int(db_handle(db), "SELECT count(*) FROM workers"), 1);
    db_close(db);
}

/* ---- queries */

static void test_query_filters(void **state)
{
    enum { N = 20 };
    struct rowbuf b[N];
    struct db_result rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = make_row(&b[i], i, 1000);
        rows[i].status = i % 5 == 0 ? DB_FAILED : i % 5 == 1 ? DB_CANCELLED : DB_COMPLETED;
    }
    struct db *db = open_ok(NULL);
    assert_int_equal(db_put_results(db, rows, N, NULL), DB_OK);
    struct db_query q = db_query_all();
    struct collect c = {0};

    q.status = DB_FAILED; /* ids 0, 5, 10, 15 */
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 4);
    assert_string_equal(c.ids[0], "job-00000");
    assert_string_equal(c.ids[3], "job-00015");

    q = db_query_all(); /* finished_at in [1005, 1012) */
    q.since = 1005;
    q.until = 1012;
    memset(&c, 0, sizeof c);
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 7);
    assert_string_equal(c.ids[0], "job-00005");
    assert_string_equal(c.ids[6], "job-00011");

    q.status = DB_COMPLETED; /* of those: 7, 8, 9 */
    memset(&c, 0, sizeof c);
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 3);
    assert_string_equal(c.ids[0], "job-00007");

    q = db_query_all();
    q.custom_id = "req-13";
    memset(&c, 0, sizeof c);
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.ids[0], "job-00013");

    q = db_query_all();
    q.form = DB_FORM_OPENAI; /* odd ids */
    q.limit = 3;
    memset(&c, 0, sizeof c);
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 3);
    assert_string_equal(c.ids[2], "job-00005");

    q = db_query_all();
    q.id = "nope";
    memset(&c, 0, sizeof c);
    assert_int_equal(db_query_results(db, &q, collect_row, &c), 0);
    assert_int_equal(c.n, 0);

    /* the callback stops the stream and its value comes back */
    memset(&c, 0, sizeof c);
    c.stop_after = 2;
    assert_int_equal(db_query_results(db, NULL, collect_row, &c), 7);
    assert_int_equal(c.n, 2);
    db_close(db);
}

/* The queries users run use the indexes (not a scan of every job). */
static void test_indexes_used(void **state)
{
    struct db *db = open_ok(NULL);
    sqlite3 *h = db_handle(db);
    raw_exec(h, "ANALYZE");
    struct {
        const char *sql, *index;
    } cases[] = {
        {"SELECT id FROM jobs WHERE status = 'failed' AND finished_at >= 5", "jobs_status_finished"},
        {"SELECT count(*) FROM jobs WHERE status = 'failed'", "jobs_status_finished"},
        {"SELECT id FROM jobs WHERE finished_at >= 5 ORDER BY finished_at", "jobs_finished"},
        {"SELECT id FROM jobs WHERE custom_id = 'req-1'", "jobs_custom_id"},
        {"SELECT ts FROM worker_metrics WHERE ts >= 5", "worker_metrics_ts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sql[256];
        snprintf(sql, sizeof sql, "EXPLAIN QUERY PLAN %s", cases[i].sql);
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK);
        bool found = false;
        char plan[512] = "";
        while (sqlite3_step(st) == SQLITE_ROW) {
            const char *d = (const char *)sqlite3_column_text(st, 3);
            strncat(plan, d, sizeof plan - strlen(plan) - 2);
            strcat(plan, "; ");
            found = found || strstr(d, cases[i].index);
        }
        sqlite3_finalize(st);
        if (!found)
            fail_msg("%s: plan '%s' does not use %s", cases[i].sql, plan, cases[i].index);
    }
    db_close(db);
}

/* ---- workers and metrics */

static void test_workers_and_metrics(void **state)
{
    struct db *db = open_ok(NULL);
    sqlite3 *h = db_handle(db);
    struct db_worker w = {.id = "gpu0",
                          .host = "box",
                          .pid = 4242,
                          .gpu = "NVIDIA H200",
                          .model = "qwen3-14b",
                          .backend = "cuda",
                          .version = "0.1.0",
                          .started_at = 1000};
    assert_int_equal(db_put_worker(db, &w), DB_OK);
    assert_int_equal(db_touch_worker(db, "gpu0", 1010, 17, false), DB_OK);
    assert_string_equal(
        raw_text(h, "SELECT host || ' ' || pid || ' ' || gpu || ' ' || model || ' ' || backend || "
                    "' ' || version || ' ' || started_at || ' ' || last_seen_at || ' ' || "
                    "jobs_done || ' ' || ifnull(stopped_at, 'running') FROM workers"),
        "box 4242 NVIDIA H200 qwen3-14b cuda 0.1.0 1000.0 1010.0 17 running");
    assert_int_equal(db_touch_worker(db, "gpu0", 1020, 20, true), DB_OK);
    assert_int_equal(raw_int(h, "SELECT stopped_at FROM workers"), 1020);
    assert_int_equal(db_touch_worker(db, "nobody", 1020, 0, false), DB_ERR);
    assert_non_null(strstr(db_errmsg(db), "no such worker"));
    assert_non_null(strstr(db_errmsg(db), path));

    struct db_metrics m[2] = {db_metrics_empty(), db_metrics_empty()};
    m[0].worker_id = m[1].worker_id = "gpu0";
    m[0].ts = 1010, m[1].ts = 1020;
    m[0].interval_s = m[1].interval_s = 10;
    m[0].jobs_done = 40, m[0].jobs_failed = 2;
    m[0].prompt_tokens_per_s = 5000, m[0].generation_tokens_per_s = 1200.5;
    m[0].ttft_p50_ms = 80, m[0].ttft_p95_ms = 200, m[0].itl_p50_ms = 12, m[0].itl_p95_ms = 20;
    m[0].e2e_p50_ms = 900, m[0].e2e_p95_ms = 1500;
    m[0].running = 64, m[0].waiting = 3, m[0].kv_usage = 0.75, m[0].prefix_cache_hit_rate = 0.5;
    m[0].preemptions = 1, m[0].gpu_mem_bytes = 80LL << 30;
    assert_int_equal(db_put_metrics(db, m, 2), DB_OK);
    assert_string_equal(
        raw_text(h, "SELECT jobs_done || ' ' || jobs_failed || ' ' || generation_tokens_per_s || "
                    "' ' || ttft_p95_ms || ' ' || kv_usage || ' ' || gpu_mem_bytes "
                    "FROM worker_metrics WHERE ts = 1010"),
        "40 2 1200.5 200.0 0.75 85899345920");
    /* the empty interval: NULL percentiles and memory */
    assert_int_equal(raw_int(h, "SELECT count(*) FROM worker_metrics WHERE ts = 1020 AND ttft_p50_ms IS NULL "
                                "AND kv_usage IS NULL AND gpu_mem_bytes IS NULL AND jobs_done = 0"),
                     1);
    /* the same (worker, ts) again replaces the row */
    m[1].jobs_done = 5;
    assert_int_equal(db_put_metrics(db, &m[1], 1), DB_OK);
    assert_int_equal(raw_int(h, "SELECT count(*) FROM worker_metrics"), 2);
    assert_int_equal(raw_int(h, "SELECT jobs_done FROM worker_metrics WHERE ts = 1020"), 5);
    /* metrics of an unknown worker: the foreign key says no, nothing of the call is written */
    struct db_metrics bad[2] = {m[0], m[0]};
    bad[0].ts = 1030;
    bad[1].worker_id = "ghost";
    assert_int_equal(db_put_metrics(db, bad, 2), DB_ERR);
    assert_non_null(strstr(db_errmsg(db), "FOREIGN KEY constraint failed"));
    assert_int_equal(raw_int(h, "SELECT count(*) FROM worker_metrics"), 2);
    bad[1].ts = NAN;
    assert_int_equal(db_put_metrics(db, bad, 2), DB_ERR);
    assert_non_null(strstr(db_errmsg(db), "row 2 has no ts"));

    /* a restart under the same id resets the row, keeps the metrics */
    w.started_at = 2000;
    w.pid = 99;
    assert_int_equal(db_put_worker(db, &w), DB_OK);
    assert_string_equal(raw_text(h,
                                 "SELECT pid || ' ' || jobs_done || ' ' || ifnull(stopped_at, 'running') || "
                                 "' ' || last_seen_at FROM workers"),
                        "99 0 running 2000.0");
    assert_int_equal(raw_int(h, "SELECT count(*) FROM worker_metrics"), 2);
    /* deleting a worker deletes its metrics */
    raw_exec(h, "DELETE FROM workers WHERE id = 'gpu0'");
    assert_int_equal(raw_int(h, "SELECT count(*) FROM worker_metrics"), 0);
    struct db_worker noid = {.started_at = 1};
    assert_int_equal(db_put_worker(db, &noid), DB_ERR);
    db_close(db);
}

/* ---- docs/SQLITE.md: every ```sql block runs against a database with data and returns rows */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The percentile query's row (jobs, p50, p95, p99) against nearest-rank percentiles computed here:
 * the value at rank ceil(p * n) of the completed jobs' sorted TTFTs. */
static void check_percentiles(sqlite3_stmt *st, const struct db_result *rows, int n)
{
    double *v = malloc((size_t)n * sizeof *v);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].status == DB_COMPLETED)
            v[k++] = rows[i].ttft_ms;
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    assert_int_equal(sqlite3_column_int(st, 0), k);
    const double p[3] = {0.50, 0.95, 0.99};
    for (int j = 0; j < 3; j++) {
        int rank = (int)ceil(p[j] * k - 1e-9);
        if (sqlite3_column_double(st, j + 1) != v[rank - 1])
            fail_msg("p%.0f: query says %g, want %g (rank %d of %d)", p[j] * 100,
                     sqlite3_column_double(st, j + 1), v[rank - 1], rank, k);
    }
    free(v);
}

static void test_doc_queries(void **state)
{
    const char *doc = test_source("docs/SQLITE.md");
    FILE *f = fopen(doc, "r");
    if (!f)
        fail_msg("cannot read %s", doc);
    static char text[1 << 17];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);

    /* data from the last two hours: every status, both forms, a worker with metrics */
    enum { N = 300 };
    static struct rowbuf b[N];
    static struct db_result rows[N];
    double now = db_now();
    /* two nights' batches (the queries name "nightly-2") */
    struct db_batch nights[2] = {db_batch_empty(), db_batch_empty()};
    nights[0].id = "nightly-1";
    nights[1].id = "nightly-2";
    for (int k = 0; k < 2; k++) {
        nights[k].input = "requests.jsonl";
        nights[k].created_at = now - 7300 + k * 3000;
        nights[k].state = "running";
    }
    for (int i = 0; i < N; i++) {
        rows[i] = make_row(&b[i], i, now - 7200 + i * 20);
        rows[i].batch_id = nights[i >= N / 2].id;
        rows[i].batch = &nights[i >= N / 2];
        rows[i].request = "{\"prompt\":\"x\"}";
        if (i % 4 == 1) { /* a model that thinks */
            rows[i].reasoning = "Let me see.\n";
            rows[i].reasoning_tokens = 5;
        }
        if (i % 5 == 2) /* a structured-output answer */
            rows[i].output_json = "{\"title\": \"Q3\", \"sentiment\": \"pos\"}";
        if (i % 10 == 3) {
            rows[i].status = DB_FAILED;
            rows[i].error = "context_length_exceeded: prompt of 9000 tokens is over max_model_len 8192";
            rows[i].error_code = "context_length_exceeded";
            rows[i].output = NULL;
        } else if (i % 10 == 7) {
            rows[i].status = DB_CANCELLED;
            rows[i].finish_reason = "cancelled";
            rows[i].error_code = "cancelled";
        }
    }
    struct db *db = open_ok(NULL);
    assert_int_equal(db_put_results(db, rows, N, NULL), DB_OK);
    struct db_worker w = {.id = "w1", .host = "box", .pid = 1, .backend = "cpu", .started_at = now - 7300};
    assert_int_equal(db_put_worker(db, &w), DB_OK);
    for (int i = 0; i < 50; i++) {
        struct db_metrics m = db_metrics_empty();
        m.worker_id = "w1";
        m.ts = now - 3000 + i * 10;
        m.interval_s = 10;
        m.jobs_done = 5;
        m.generation_tokens_per_s = 100 + i;
        m.prompt_tokens_per_s = 1000;
        m.ttft_p50_ms = 50;
        m.ttft_p95_ms = 90 + i;
        m.kv_usage = 0.5;
        m.running = 8;
        assert_int_equal(db_put_metrics(db, &m, 1), DB_OK);
    }

    int blocks = 0;
    for (char *p = text; (p = strstr(p, "\n```sql\n")) != NULL;) {
        p += 8;
        char *end = strstr(p, "\n```");
        assert_non_null(end);
        *end = 0;
        sqlite3_stmt *st;
        const char *tail = NULL;
        if (sqlite3_prepare_v2(db_handle(db), p, -1, &st, &tail) != SQLITE_OK)
            fail_msg("docs/SQLITE.md query fails: %s\n%s", sqlite3_errmsg(db_handle(db)), p);
        while (tail && (*tail == ' ' || *tail == '\n' || *tail == ';'))
            tail++;
        if (tail && *tail)
            fail_msg("docs/SQLITE.md: one statement per block, this one has more:\n%s", p);
        int rows_out = 0, rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            if (rows_out++ == 0 && strstr(p, "ttft_p99_ms") && !strstr(p, "PARTITION"))
                check_percentiles(st, rows, N);
        }
        if (rc != SQLITE_DONE)
            fail_msg("docs/SQLITE.md query fails: %s\n%s", sqlite3_errmsg(db_handle(db)), p);
        if (rows_out == 0 && sqlite3_stmt_readonly(st))
            fail_msg("docs/SQLITE.md query returns no rows on a database with data:\n%s", p);
        sqlite3_finalize(st);
        blocks++;
        p = end + 1;
    }
    printf("note: %d queries of docs/SQLITE.md ran\n", blocks);
    assert_true(blocks >= 6);
    db_close(db);
}

/* job_parts: written, replaced by (job, level, part), read back by plan in order; parts of an older
 * plan are deleted with the first write of a new one; bad rows fail the call. */
static int collect_part(void *ctx, const struct db_part *p)
{
    char *buf = ctx;
    size_t n = strlen(buf);
    snprintf(buf + n, 512 - n, "%lld.%lld:%.*s(%lld-%lld,%s);", (long long)p->level, (long long)p->part,
             (int)p->output_len, p->output, (long long)p->first, (long long)p->last,
             p->finish_reason ? p->finish_reason : "-");
    return 0;
}

static void test_job_parts(void **state)
{
    struct db *db = open_ok(NULL);
    struct db_part p[3];
    for (int i = 0; i < 3; i++)
        p[i] = (struct db_part){.job_id = "doc1", .level = i < 2 ? 0 : 1, .part = i < 2 ? i : 0, .plan = "aa",
                                .first = i < 2 ? i : 0, .last = i < 2 ? i : 1, .doc_end = 10, .output = "x",
                                .prompt_tokens = 5, .completion_tokens = 2, .finish_reason = "stop",
                                .created_at = 1.5};
    p[1].output = "second";
    assert_int_equal(db_put_parts(db, p, 3), DB_OK);
    char got[512] = "";
    assert_int_equal(db_get_parts(db, "doc1", "aa", collect_part, got), 0);
    assert_string_equal(got, "0.0:x(0-0,stop);0.1:second(1-1,stop);1.0:x(0-1,stop);");
    got[0] = 0;
    assert_int_equal(db_get_parts(db, "doc1", "bb", collect_part, got), 0);
    assert_string_equal(got, "");
    /* the same part again: replaced */
    p[0].output = "again";
    p[0].finish_reason = "length";
    assert_int_equal(db_put_parts(db, p, 1), DB_OK);
    got[0] = 0;
    db_get_parts(db, "doc1", "aa", collect_part, got);
    assert_string_equal(got, "0.0:again(0-0,length);0.1:second(1-1,stop);1.0:x(0-1,stop);");
    /* another plan: the old plan's parts go */
    p[0].plan = "bb";
    assert_int_equal(db_put_parts(db, p, 1), DB_OK);
    got[0] = 0;
    db_get_parts(db, "doc1", "aa", collect_part, got);
    assert_string_equal(got, "");
    got[0] = 0;
    db_get_parts(db, "doc1", "bb", collect_part, got);
    assert_string_equal(got, "0.0:again(0-0,length);");
    /* a row without output or plan fails the call, nothing written */
    p[1].plan = "bb";
    p[1].output = NULL;
    assert_int_equal(db_put_parts(db, p, 2), DB_ERR);
    assert_non_null(strstr(db_errmsg(db), "row 2"));
    got[0] = 0;
    db_get_parts(db, "doc1", "bb", collect_part, got);
    assert_string_equal(got, "0.0:again(0-0,length);");
    db_close(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_creates_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_columns_match_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_from_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_to_reasoning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_to_output_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_to_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_migration_rolls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_ours, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readonly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_moved_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_while_locked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upsert_replay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_1000, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejected_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strict_and_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_columns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_other_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_other_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_sqlite3_shell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wal_readers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_query_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_indexes_used, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_and_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_queries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_parts, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
