/* The worker's finished-job record (worker/loop/held.c) for structured-output jobs: from a finished
 * engine seq to the SQLite row and the result line, through answer_json. The row is written into a
 * real SQLite file and read back with json_extract; the engine seq is filled in by hand (the
 * constrained generation itself is the engine's, tested there). */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "engine/engine.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/jobs/job.h"
#include "worker/loop/held.h"
#include "worker/store/db.h"

static char dir[128], path[192];

static int setup(void **state)
{
    if (scratch_dir_make(getenv("TMPDIR"), "test-held", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/llmq.db", dir);
    return 0;
}

static int teardown(void **state)
{
    return test_remove_tree(dir);
}

/* A held job parsed from line, finished by a seq that generated text with finish. */
static struct wk_job *finished(const char *line, const char *text, enum finish_reason finish)
{
    struct rq_job rj = {0};
    rj.raw = strdup(line);
    rj.len = strlen(line);
    struct wk_job *j = wk_job_new(&rj, 100.0, 1.8e9);
    assert_non_null(j);
    char err[512];
    assert_int_equal(job_parse(j->rj.raw, j->rj.len, NULL, &j->job, err, sizeof err), JOB_OK);
    j->parsed = true;
    wk_job_admitted(j); /* as the worker does once the engine holds it: the input goes */
    int32_t tokens[4] = {1, 2, 3, 4};
    struct engine_seq s;
    memset(&s, 0, sizeof s);
    s.n_prompt = 2;
    s.tokens = tokens;
    s.n_output = 2;
    s.text = (char *)text;
    s.text_len = strlen(text);
    s.reasoning = (char *)"";
    s.finished = true;
    s.finish = finish;
    s.t_arrival = 100.0;
    s.t_first_token = 100.5;
    s.t_finished = 101.0;
    struct wk_ctx c = {.model_name = "tiny", .worker_id = "w1"};
    assert_int_equal(wk_job_finish_seq(j, &c, &s, 101.0, 1.8e9 + 1), 0);
    return j;
}

static const char *const SCHEMA_JOB =
    "{\"id\": \"s-%d\", \"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
    "{\"name\": \"doc\", \"schema\": {\"type\": \"object\", \"properties\": {\"title\": {\"type\": "
    "\"string\"}, "
    "\"score\": {\"type\": \"number\"}}}}}}";

static void test_rows_and_lines(void **state)
{
    struct wk_ctx c = {.model_name = "tiny", .worker_id = "w1"};
    char line[512];
    struct wk_job *jobs[5];
    snprintf(line, sizeof line, SCHEMA_JOB, 1);
    jobs[0] = finished(line, " {\"title\": \"Caf\xc3\xa9\", \"score\": 0.10}\n", FINISH_STOP);
    snprintf(line, sizeof line, SCHEMA_JOB, 2);
    jobs[1] = finished(line, "{\"title\": \"cut he", FINISH_LENGTH);
    jobs[2] =
        finished("{\"id\": \"o-1\", \"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}",
                 "{\"a\": [1, {\"b\": null}]}", FINISH_STOP);
    jobs[3] = finished("{\"id\": \"r-1\", \"prompt\": \"x\", \"regex\": \"[{}a:1\\\" ]+\"}", "{\"a\": 1}",
                       FINISH_STOP);
    jobs[4] = finished("{\"id\": \"t-1\", \"prompt\": \"x\"}", "{\"a\": 1}", FINISH_STOP);

    /* the records */
    assert_string_equal(jobs[0]->output_json, " {\"title\": \"Caf\xc3\xa9\", \"score\": 0.10}\n");
    assert_null(jobs[1]->output_json);
    assert_non_null(jobs[2]->output_json);
    assert_null(jobs[3]->output_json); /* a regex job's text is text, even when it looks like JSON */
    assert_null(jobs[4]->output_json);
    /* the result lines */
    json_t *r0 = json_loads(jobs[0]->result, 0, NULL), *r1 = json_loads(jobs[1]->result, 0, NULL),
           *r3 = json_loads(jobs[3]->result, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(r0, "json"), "title")),
                        "Caf\xc3\xa9");
    assert_true(json_is_false(json_object_get(r0, "json_incomplete")));
    assert_true(json_is_null(json_object_get(r1, "json")));
    assert_true(json_is_true(json_object_get(r1, "json_incomplete")));
    assert_null(json_object_get(r3, "json"));
    json_decref(r0);
    json_decref(r1);
    json_decref(r3);

    /* the rows, in a real database */
    struct db *db = NULL;
    char err[1024];
    assert_int_equal(db_open(path, NULL, &db, err, sizeof err), DB_OK);
    struct db_result rows[5];
    for (int i = 0; i < 5; i++)
        wk_job_row(jobs[i], &c, &rows[i]);
    int row_rc[5];
    assert_int_equal(db_put_results(db, rows, 5, row_rc), DB_OK);
    sqlite3 *h = db_handle(db);
    sqlite3_stmt *st;
    assert_int_equal(
        sqlite3_prepare_v2(h,
                           "SELECT group_concat(id || '=' || coalesce(output_json, 'NULL') || '|' || "
                           "coalesce(json_extract(output_json, '$.title'), '-'), ' ; ') FROM "
                           "(SELECT * FROM jobs ORDER BY id)",
                           -1, &st, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal(
        (const char *)sqlite3_column_text(st, 0),
        "o-1={\"a\":[1,{\"b\":null}]}|- ; r-1=NULL|- ; s-1={\"title\":\"Caf\xc3\xa9\",\"score\":0.10}|"
        "Caf\xc3\xa9 ; s-2=NULL|- ; t-1=NULL|-");
    sqlite3_finalize(st);
    /* llmq results' line of a row is the stored result line, json and all */
    assert_non_null(strstr(rows[0].result, "\"json\":{\"title\":"));

    /* a row SQLite rejects is written again without its JSON columns, output_json among them */
    wk_job_degrade(jobs[0]);
    assert_null(jobs[0]->output_json);
    db_close(db);
    for (int i = 0; i < 5; i++)
        wk_job_free(jobs[i]);
}

/* A job that finished and then failed (out of memory storing it, ...) keeps no output_json. */
static void test_failed_after_finish(void **state)
{
    char line[512];
    snprintf(line, sizeof line, SCHEMA_JOB, 9);
    struct wk_job *j = finished(line, "{\"title\": \"t\"}", FINISH_STOP);
    assert_non_null(j->output_json);
    struct wk_ctx c = {.model_name = "tiny", .worker_id = "w1"};
    assert_int_equal(wk_job_finish_failed(j, &c, JOB_ERR_INTERNAL, "out of memory", 1.8e9 + 2), 0);
    assert_null(j->output_json);
    struct db_result r;
    wk_job_row(j, &c, &r);
    assert_null(r.output_json);
    wk_job_free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rows_and_lines, setup, teardown),
        cmocka_unit_test(test_failed_after_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
