/* How fast worker/store/db.c commits results: batches of 256 realistic rows (1.5 KB of output and a
 * 2 KB result line each) into a fresh WAL database, new ids and then a replay of the same ids,
 * against one transaction per row. Prints rows/s (docs/PERFORMANCE.md keeps the numbers); it
 * asserts only that every row arrived, never a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/store/db.h"

enum { BATCH = 256, BATCHES = 40, SINGLES = 300 };

struct rowbuf {
    char id[40], params[256], output[1600], metadata[80], result[2200];
};

static void fill(struct db_result *r, struct rowbuf *b, int i, double now)
{
    *r = db_result_empty();
    snprintf(b->id, sizeof b->id, "0193%04x-a4b1-7c3e-9f2a-%012d", i & 0xffff, i);
    snprintf(b->params, sizeof b->params,
             "{\"max_tokens\":256,\"temperature\":0.7,\"top_p\":0.95,\"top_k\":20,\"min_p\":0,"
             "\"repetition_penalty\":1,\"presence_penalty\":0,\"frequency_penalty\":0,\"seed\":%d}",
             i);
    size_t n = 0;
    while (n + 80 < sizeof b->output)
        n += (size_t)snprintf(b->output + n, sizeof b->output - n,
                              "The quarterly report %d shows revenue growth across all regions. ", i);
    snprintf(b->metadata, sizeof b->metadata, "{\"doc\":\"reports/q%d.txt\",\"run\":\"nightly\"}", i);
    snprintf(b->result, sizeof b->result,
             "{\"id\":\"%s\",\"status\":\"completed\",\"text\":\"%s\",\"finish_reason\":\"length\","
             "\"usage\":{\"prompt_tokens\":1800,\"completion_tokens\":256},\"metadata\":%s}",
             b->id, b->output, b->metadata);
    r->id = b->id;
    r->queue = "short";
    r->model = "Qwen3-14B";
    r->params = b->params;
    r->output = b->output;
    r->finish_reason = "length";
    r->prompt_tokens = 1800;
    r->completion_tokens = 256;
    r->worker_id = "gpu0";
    r->created_at = now - 30;
    r->started_at = now - 5;
    r->first_token_at = now - 4.9;
    r->finished_at = now;
    r->ttft_ms = 100;
    r->latency_ms = 5000;
    r->queue_ms = 25000;
    r->metadata = b->metadata;
    r->result = b->result;
}

static void test_speed(void **state)
{
    char dir[256], path[300], err[512];
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-db-speed", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/llmq.db", dir);
    struct db *db = NULL;
    if (db_open(path, NULL, &db, err, sizeof err))
        fail_msg("%s", err);
    struct rowbuf *b = calloc(BATCH, sizeof *b);
    struct db_result *rows = calloc(BATCH, sizeof *rows);
    double now = db_now();

    /* new rows */
    double busy = 0;
    for (int k = 0; k < BATCHES; k++) {
        for (int i = 0; i < BATCH; i++)
            fill(&rows[i], &b[i], k * BATCH + i, now);
        double t = db_now();
        assert_int_equal(db_put_results(db, rows, BATCH, NULL), DB_OK);
        busy += db_now() - t;
    }
    double insert_rate = BATCHES * BATCH / busy;

    /* a replay of the last batch, again and again: every row an update */
    double t = db_now();
    for (int k = 0; k < BATCHES / 4; k++)
        assert_int_equal(db_put_results(db, rows, BATCH, NULL), DB_OK);
    double replay_rate = BATCHES / 4 * BATCH / (db_now() - t);

    /* one transaction per row */
    t = db_now();
    for (int i = 0; i < SINGLES; i++) {
        fill(&rows[0], &b[0], 1000000 + i, now);
        assert_int_equal(db_put_results(db, rows, 1, NULL), DB_OK);
    }
    double single_rate = SINGLES / (db_now() - t);

    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_handle(db), "SELECT count(*) FROM jobs", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(st, 0), BATCHES * BATCH + SINGLES);
    sqlite3_finalize(st);

    struct stat sb;
    stat(path, &sb);
    printf("db speed (WAL, synchronous=NORMAL, rows of %zu B output + %zu B result):\n", strlen(b[0].output),
           strlen(b[0].result));
    printf("  batches of %d new rows:      %8.0f rows/s (%.2f ms per batch)\n", BATCH, insert_rate,
           1e3 * BATCH / insert_rate);
    printf("  batches of %d replayed rows: %8.0f rows/s\n", BATCH, replay_rate);
    printf("  one row per transaction:      %8.0f rows/s\n", single_rate);
    printf("  database: %.1f MB for %d rows\n", sb.st_size / 1e6, BATCHES * BATCH + SINGLES);
    db_close(db);
    free(rows);
    free(b);
    test_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_speed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
