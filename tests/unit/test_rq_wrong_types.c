/* Keys of the wrong type (queue/badkey.h) against a real redis-server, one test per script
 * family: fetch and start, ack, retry and the retry mover, dead and requeue-dead, the reaper,
 * requeue, cancel, push and the batch scripts; and the heartbeat, progress, the published templates, the
 * --drain check and `llmq status`. Each plants keys of the wrong type where llmq keeps a hash, list, set,
 * zset or stream, and checks that the script either goes on without a job's own bad key or fails naming the
 * key with nothing written, and that no job is lost: every job is in exactly one of the lists where it was or
 * where it should go, and the planted keys are left as they were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "queue/ack.h"
#include "queue/badkey.h"
#include "queue/batch.h"
#include "queue/batch_admin.h"
#include "queue/cancel.h"
#include "queue/dead.h"
#include "queue/drain.h"
#include "queue/fetch.h"
#include "queue/heartbeat.h"
#include "queue/progress.h"
#include "queue/purge.h"
#include "queue/push.h"
#include "queue/reaper.h"
#include "queue/requeue.h"
#include "queue/retry.h"
#include "queue/rq.h"
#include "queue/stats.h"
#include "queue/templates.h"
#include "rq_test.h"

#define EVIL "{\"id\":\"evil\",\"prompt\":\"x\"}"

static struct rq *open_rq(const char *worker)
{
    struct rq_opts o = rq_test_opts(srv.url, worker);
    o.max_attempts = 3;
    o.retry_backoff_base_ms = 10;
    o.retry_backoff_max_ms = 10;
    return rq_test_open(&o);
}

static int fetch_n(struct rq *q, const char *queue, int max, struct rq_job *out)
{
    struct rq_source src = {queue, max};
    return rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, max, 0, out);
}

/* The last operation failed naming `key` as a key of the wrong type. */
static void assert_badkey(struct rq *q, const char *key)
{
    const char *e = rq_badkey_error(q);
    if (!e || !strstr(e, key))
        fail_msg("want an error naming %s, got: %s", key, rq_error(q));
}

/* Whether raw is an element of list key. */
static bool in_list(const char *key, const char *raw)
{
    redisReply *r = redisCommand(adm, "LPOS %s %s", key, raw);
    assert_non_null(r);
    bool in = r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    return in;
}

/* A job whose hash (or its batch's hash) is a string is handed out without an id, its keys left
 * alone, by the fetch script and by the start script after a blocking fetch; it is acked like a
 * job without an id. A source queue that is a string is skipped, the others fetched. A
 * processing list that is a string stops the fetch, with nothing moved. */
static void test_fetch_and_start(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:job:evil x");
    run("LPUSH llmq:queue:short %s", EVIL);
    rq_test_push_n(q, "short", "g", 2);
    run("HSET llmq:job:inb status queued batch_id bx");
    run("SET llmq:batch:bx x");
    run("LPUSH llmq:queue:short %s", "{\"id\":\"inb\",\"prompt\":\"x\"}");
    run("SET llmq:queue:other x");
    struct rq_source src[2] = {{"other", 10}, {"short", 10}};
    struct rq_job j[8];
    assert_int_equal(rq_fetch(q, src, 2, RQ_ORDER_PRIORITY, 10, 0, j), 4);
    assert_string_equal(j[0].id, ""); /* evil: its hash is a string */
    assert_string_equal(j[0].raw, EVIL);
    assert_string_equal(j[1].id, "g0");
    assert_string_equal(j[2].id, "g1");
    assert_string_equal(j[3].id, ""); /* inb: its batch's hash is a string */
    assert_int_equal(ival("LLEN llmq:processing:w1"), 4);
    assert_string_equal(sval("GET llmq:job:evil"), "x");
    assert_string_equal(sval("GET llmq:batch:bx"), "x");
    assert_string_equal(sval("HGET llmq:job:inb status"), "queued");
    assert_string_equal(sval("GET llmq:queue:other"), "x");
    assert_string_equal(sval("HGET llmq:job:g0 status"), "running");
    struct rq_result res[4];
    for (int i = 0; i < 4; i++)
        res[i] = (struct rq_result){
            .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, 4), 4);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_string_equal(sval("GET llmq:job:evil"), "x");
    assert_string_equal(sval("HGET llmq:job:g1 status"), "completed");
    for (int i = 0; i < 4; i++)
        rq_job_free(&j[i]);

    /* the blocking path: BLMOVE, then the start script */
    rq_test_lpush_later(0.2, "short", "'" EVIL "'");
    assert_int_equal(rq_fetch(q, &src[1], 1, RQ_ORDER_PRIORITY, 1, 3000, j), 1);
    assert_string_equal(j[0].id, "");
    assert_string_equal(j[0].raw, EVIL);
    assert_true(in_list("llmq:processing:w1", EVIL));
    assert_string_equal(sval("GET llmq:job:evil"), "x");
    res[0] = (struct rq_result){
        .job = &j[0], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, 1), 1);
    rq_job_free(&j[0]);

    /* the processing list is a string: nothing moves, the error names it */
    run("SET llmq:processing:w1 x");
    rq_test_push_id(q, "short", "g2");
    assert_int_equal(fetch_n(q, "short", 5, j), -1);
    assert_badkey(q, "llmq:processing:w1");
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    assert_string_equal(sval("HGET llmq:job:g2 status"), "queued");
    rq_free(q);
}

/* A hash that became a string while its job ran, and a cancel set that is a string, do not stop
 * the ack of the batch: every job leaves the processing list, the keys stay as they were. */
static void test_ack(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "a", 2);
    struct rq_job j[2];
    assert_int_equal(fetch_n(q, "short", 2, j), 2);
    run("SET llmq:job:a0 x");
    run("SET llmq:cancel x");
    run("SET llmq:events x");
    struct rq_result res[2];
    for (int i = 0; i < 2; i++)
        res[i] = (struct rq_result){
            .job = &j[i], .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, res, 2), 2);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_string_equal(sval("GET llmq:job:a0"), "x");
    assert_string_equal(sval("HGET llmq:job:a1 status"), "completed");
    assert_string_equal(sval("GET llmq:cancel"), "x");
    assert_string_equal(sval("GET llmq:events"), "x");
    for (int i = 0; i < 2; i++)
        rq_job_free(&j[i]);
    rq_free(q);
}

/* Retry and dead with a dead list or retry set of the wrong type fail naming it, the job still
 * in the processing list and its hash unchanged; once fixed they go through. A job whose hash is
 * a string is dead-lettered (no attempts to count it by). The retry mover with a target queue of
 * the wrong type moves nothing. */
static void test_retry_and_dead(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    rq_test_push_n(q, "short", "r", 2);
    struct rq_job j[2];
    assert_int_equal(fetch_n(q, "short", 2, j), 2);
    int64_t delay;
    run("SET llmq:dead x");
    assert_int_equal(rq_retry(q, &j[0], "engine_error", "boom", NULL, &delay, NULL), -1);
    assert_badkey(q, "llmq:dead");
    assert_int_equal(rq_dead(q, &j[1], "invalid_request", "bad", NULL, NULL, NULL), -1);
    assert_badkey(q, "llmq:dead");
    assert_int_equal(ival("LLEN llmq:processing:w1"), 2);
    assert_string_equal(sval("HGET llmq:job:r0 status"), "running");
    assert_string_equal(sval("GET llmq:dead"), "x");
    run("DEL llmq:dead");
    run("SET llmq:retry x");
    assert_int_equal(rq_retry(q, &j[0], "engine_error", "boom", NULL, &delay, NULL), -1);
    assert_badkey(q, "llmq:retry");
    assert_int_equal(ival("LLEN llmq:processing:w1"), 2);
    run("DEL llmq:retry");
    assert_int_equal(rq_retry(q, &j[0], "engine_error", "boom", NULL, &delay, NULL), RQ_RETRY_SCHEDULED);
    assert_int_equal(ival("ZCARD llmq:retry"), 1);
    /* the mover: its target queue is a string */
    run("SET llmq:queue:short x");
    usleep(50 * 1000);
    assert_int_equal(rq_retry_due(q, 10), -1);
    assert_badkey(q, "llmq:queue:short");
    assert_int_equal(ival("ZCARD llmq:retry"), 1);
    run("DEL llmq:queue:short");
    assert_int_equal(rq_retry_due(q, 10), 1);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    /* a job whose hash became a string: dead-lettered, the hash left alone */
    run("SET llmq:job:r1 x");
    assert_int_equal(rq_retry(q, &j[1], "engine_error", "boom", NULL, &delay, NULL), RQ_RETRY_DEAD);
    assert_int_equal(ival("LLEN llmq:dead"), 1);
    assert_non_null(strstr(sval("LINDEX llmq:dead 0"), "r1"));
    assert_string_equal(sval("GET llmq:job:r1"), "x");
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    for (int i = 0; i < 2; i++)
        rq_job_free(&j[i]);
    /* rq_dead of a job whose hash is a string: r0 again, back from the retry set */
    struct rq_job d;
    assert_int_equal(fetch_n(q, "short", 1, &d), 1);
    assert_string_equal(d.id, "r0");
    run("SET llmq:job:r0 x");
    assert_int_equal(rq_dead(q, &d, "invalid_request", "bad", NULL, NULL, NULL), 1);
    assert_int_equal(ival("LLEN llmq:dead"), 2);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_string_equal(sval("GET llmq:job:r0"), "x");
    rq_job_free(&d);
    rq_free(q);
}

/* Requeue-dead refuses with the key named when an entry's hash or queue has the wrong type, the
 * dead list unchanged; a dead list that is not a list fails the same way. */
static void test_dead_requeue(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    rq_test_push_id(q, "short", "d1");
    struct rq_job j;
    assert_int_equal(fetch_n(q, "short", 1, &j), 1);
    assert_int_equal(rq_dead(q, &j, "invalid_request", "bad", NULL, NULL, NULL), 1);
    rq_job_free(&j);
    const char *ids[] = {"d1"};
    run("SET llmq:job:d1 x");
    assert_int_equal(rq_dead_requeue(q, ids, 1), -1);
    assert_badkey(q, "llmq:job:d1");
    assert_int_equal(ival("LLEN llmq:dead"), 1);
    run("DEL llmq:job:d1");
    run("SET llmq:queue:short x");
    assert_int_equal(rq_dead_requeue(q, NULL, 0), -1);
    assert_badkey(q, "llmq:queue:short");
    assert_int_equal(ival("LLEN llmq:dead"), 1);
    run("DEL llmq:queue:short");
    assert_int_equal(rq_dead_requeue(q, ids, 1), 1);
    assert_int_equal(ival("LLEN llmq:dead"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    run("SET llmq:dead x");
    assert_int_equal(rq_dead_requeue(q, NULL, 0), -1);
    assert_badkey(q, "llmq:dead");
    rq_free(q);
}

/* The reaper on a lapsed worker: a dead list or target queue of the wrong type fails it naming
 * the key, the lapsed worker's list intact; then it requeues everything, a job whose hash is a
 * string among them (its hash left alone). */
static void test_reaper(void **state)
{
    (void)state;
    run("SADD llmq:workers ghost");
    rq_test_lapsed_long_ago("ghost");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"g1\",\"prompt\":\"a\"}");
    run("LPUSH llmq:processing:ghost %s", "{\"id\":\"g2\",\"prompt\":\"b\"}");
    run("HSET llmq:job:g1 status running queue short attempts 1 worker ghost");
    run("SET llmq:job:g2 x");
    struct rq *q = open_rq("w1");
    struct rq_reap_result rr;
    run("SET llmq:dead x");
    assert_int_equal(rq_reap(q, &rr), -1);
    assert_badkey(q, "llmq:dead");
    assert_int_equal(ival("LLEN llmq:processing:ghost"), 2);
    run("DEL llmq:dead");
    run("SET llmq:queue:short x");
    assert_int_equal(rq_reap(q, &rr), -1);
    assert_badkey(q, "llmq:queue:short");
    assert_int_equal(ival("LLEN llmq:processing:ghost"), 2);
    run("DEL llmq:queue:short");
    run("SET llmq:lines x"); /* only informs: neither read nor written, nothing blocked */
    assert_true(rq_reap(q, &rr) >= 0);
    assert_int_equal(rr.requeued, 2);
    assert_int_equal(ival("LLEN llmq:processing:ghost"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 2);
    assert_string_equal(sval("GET llmq:job:g2"), "x");
    assert_string_equal(sval("HGET llmq:job:g1 status"), "queued");
    struct rq_job j[2];
    assert_int_equal(fetch_n(q, "short", 2, j), 2); /* g2 is started without its id: <p>:lines would be read */
    assert_string_equal(sval("GET llmq:lines"), "x");
    rq_job_free(&j[0]);
    rq_job_free(&j[1]);
    rq_free(q);
}

/* Requeue to a queue of the wrong type fails naming it, the job still held; once fixed it goes. */
static void test_requeue(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    rq_test_push_id(q, "short", "q1");
    struct rq_job j;
    assert_int_equal(fetch_n(q, "short", 1, &j), 1);
    const struct rq_job *jp = &j;
    run("SET llmq:queue:short x");
    assert_int_equal(rq_requeue(q, &jp, 1, NULL, "shutdown"), -1);
    assert_badkey(q, "llmq:queue:short");
    assert_int_equal(ival("LLEN llmq:processing:w1"), 1);
    assert_string_equal(sval("HGET llmq:job:q1 status"), "running");
    run("DEL llmq:queue:short");
    assert_int_equal(rq_requeue(q, &jp, 1, NULL, "shutdown"), 1);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    rq_job_free(&j);
    rq_free(q);
}

/* Cancel: a cancel set or a job hash of the wrong type is refused naming it, nothing added; the
 * worker's cancel check names the set; a fetch goes on (nothing pending). */
static void test_cancel(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    rq_test_push_id(q, "short", "c1");
    const char *ids[] = {"c1"};
    run("SET llmq:cancel x");
    assert_int_equal(rq_cancel(q, ids, 1, NULL), -1);
    assert_badkey(q, "llmq:cancel");
    bool flag;
    assert_int_equal(rq_cancel_check(q, ids, 1, &flag), -1);
    assert_badkey(q, "llmq:cancel");
    struct rq_job j;
    assert_int_equal(fetch_n(q, "short", 1, &j), 1);
    assert_false(j.cancel_requested);
    rq_job_free(&j);
    run("DEL llmq:cancel");
    run("SET llmq:job:c2 x");
    const char *ids2[] = {"c1", "c2"};
    assert_int_equal(rq_cancel(q, ids2, 2, NULL), -1);
    assert_badkey(q, "llmq:job:c2");
    assert_int_equal(ival("EXISTS llmq:cancel"), 0);
    rq_free(q);
}

/* Purge: a queue of the wrong type is refused naming it, by the count and by the script; a job
 * whose hash is of the wrong type loses its entry, its hash is left as it is. */
static void test_purge(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:retry x");
    assert_int_equal(rq_purge_count(q, RQ_PURGE_RETRY, NULL), -1);
    assert_badkey(q, "llmq:retry");
    assert_int_equal(rq_purge(q, RQ_PURGE_RETRY, NULL, 10, NULL), -1);
    assert_badkey(q, "llmq:retry");
    assert_string_equal(sval("GET llmq:retry"), "x");
    rq_test_push_id(q, "short", "u1");
    rq_test_push_id(q, "short", "u2");
    run("DEL llmq:job:u1");
    run("SET llmq:job:u1 x");
    long long hashes = -1;
    assert_int_equal(rq_purge(q, RQ_PURGE_QUEUE, "short", 10, &hashes), 2);
    assert_int_equal(hashes, 1);
    assert_string_equal(sval("GET llmq:job:u1"), "x");
    assert_int_equal(ival("EXISTS llmq:job:u2"), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 0);
    rq_free(q);
}

/* Push and the batch scripts refuse with the key named, nothing written. */
static void test_push_and_batches(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:job:p1 x");
    struct rq_push_item it[2] = {{"{\"id\":\"p0\"}", 11, "p0", NULL}, {"{\"id\":\"p1\"}", 11, "p1", NULL}};
    assert_int_equal(rq_push(q, "short", NULL, RQ_PUSH_FORCE, it, 2), -1);
    assert_badkey(q, "llmq:job:p1");
    assert_int_equal(ival("EXISTS llmq:queue:short"), 0);
    assert_int_equal(ival("EXISTS llmq:job:p0"), 0);
    run("SET llmq:queue:long x");
    assert_int_equal(rq_push(q, "long", NULL, RQ_PUSH_FORCE, it, 1), -1);
    assert_badkey(q, "llmq:queue:long");
    assert_int_equal(ival("EXISTS llmq:job:p0"), 0);

    /* the model queues' index is a string: the job is pushed all the same */
    run("SET llmq:models x");
    struct rq_push_item mj = {"{\"id\":\"m0\"}", 11, "m0", NULL};
    assert_int_equal(rq_push(q, "qwen:short", NULL, RQ_PUSH_FORCE, &mj, 1), 0);
    assert_int_equal(ival("LLEN llmq:queue:qwen:short"), 1);
    assert_string_equal(sval("GET llmq:models"), "x");
    run("DEL llmq:models");

    run("SET llmq:batch:b1 x");
    assert_int_equal(rq_batch_open(q, "b1", "in.jsonl", false), -1);
    assert_badkey(q, "llmq:batch:b1");
    assert_int_equal(rq_batch_seal(q, "b1"), -1);
    assert_badkey(q, "llmq:batch:b1");
    long long asked, queued;
    assert_int_equal(rq_batch_cancel(q, "b1", &asked, &queued), -1);
    assert_badkey(q, "llmq:batch:b1");
    assert_string_equal(sval("GET llmq:batch:b1"), "x");
    run("SET llmq:batches x");
    assert_int_equal(rq_batch_open(q, "b2", "in.jsonl", false), -1);
    assert_badkey(q, "llmq:batches");
    assert_int_equal(ival("EXISTS llmq:batch:b2"), 0);
    run("DEL llmq:batches");
    /* a batch that exists, a job of it whose hash is a string: push refuses it */
    assert_int_equal(rq_batch_open(q, "b2", "in.jsonl", false), RQ_BATCH_CREATED);
    struct rq_push_item bj = {"{\"id\":\"p1\",\"batch_id\":\"b2\"}", 28, "p1", NULL};
    assert_int_equal(rq_push(q, "short", "b2", RQ_PUSH_FORCE, &bj, 1), -1);
    assert_badkey(q, "llmq:job:p1");
    assert_string_equal(sval("HGET llmq:batch:b2 total"), "0");
    const struct rq_batch_requeue_job rj = {"{\"id\":\"p1\",\"batch_id\":\"b2\"}", "p1", "short", "failed"};
    struct rq_batch_info db = {.total = 1, .failed = 1};
    snprintf(db.input, sizeof db.input, "in.jsonl");
    char why[256];
    assert_int_equal(rq_batch_requeue(q, "b2", &rj, 1, &db, why, sizeof why), -1);
    assert_badkey(q, "llmq:job:p1");
    assert_int_equal(ival("EXISTS llmq:queue:short"), 0);
    rq_free(q);
}

/* The heartbeat names its own key or the workers set of the wrong type, and the events stream,
 * which the scripts skip while it is of the wrong type (noted once, not a failure). */
static void test_heartbeat(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:events x");
    assert_int_equal(rq_heartbeat(q, NULL), 0);
    assert_false(rq_badkey_first(q, "BADKEY llmq:events is a string, not a stream")); /* noted already */
    run("SET llmq:worker:w1 x");
    assert_int_equal(rq_heartbeat(q, NULL), -1);
    assert_badkey(q, "llmq:worker:w1");
    run("DEL llmq:worker:w1");
    run("SET llmq:workers x");
    assert_int_equal(rq_heartbeat(q, NULL), -1);
    assert_badkey(q, "llmq:workers");
    rq_free(q);
}

/* Published templates of the wrong type: reading and publishing fail naming the key (the worker
 * then fails the jobs that need such a template instead of handing them back for ever). */
static void test_templates(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:templates x");
    char *v = NULL;
    assert_int_equal(rq_template_get(q, "t", &v), -1);
    assert_badkey(q, "llmq:templates");
    assert_null(v);
    assert_int_equal(rq_template_publish(q, "t", "{}", &v), -1);
    assert_badkey(q, "llmq:templates");
    assert_string_equal(sval("GET llmq:templates"), "x");
    rq_free(q);
}

/* Progress (plain commands, not a script) names a job hash or an events stream of the wrong type;
 * the other writes of the pipeline are done. */
static void test_progress(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("HSET llmq:job:p0 status running");
    run("SET llmq:job:p1 x");
    struct rq_progress pr[2] = {{"p0", 0.5, -1, 3, 0, 0, 0, 0}, {"p1", 0.5, -1, 3, 0, 0, 0, 0}};
    assert_int_equal(rq_progress(q, pr, 2), -1);
    assert_badkey(q, "llmq:job:p1");
    assert_string_equal(sval("HGET llmq:job:p0 completion_tokens"), "3");
    run("SET llmq:events x");
    assert_int_equal(rq_progress(q, pr, 1), -1);
    assert_badkey(q, "llmq:events");
    rq_free(q);
}

/* The --drain check counts a queue, retry set or another worker's processing list of the wrong
 * type as empty (they hold no job), so a draining worker can still finish. */
static void test_drain(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    run("SET llmq:queue:short x");
    run("SET llmq:retry x");
    run("SADD llmq:workers w2");
    run("SET llmq:processing:w2 x");
    rq_test_push_id(q, "long", "l0");
    const char *queues[] = {"short", "long"};
    struct rq_drain d;
    assert_int_equal(rq_drain_check(q, queues, 2, &d), 0);
    assert_int_equal(d.queued, 1);
    assert_int_equal(d.retry, 0);
    assert_int_equal(d.held, 0);
    rq_drain_free(&d);
    rq_free(q);
}

/* `llmq status` names a key of the wrong type instead of Redis's bare WRONGTYPE. */
static void test_stats(void **state)
{
    (void)state;
    struct rq *q = open_rq("w1");
    const char *queues[] = {"short"};
    struct rq_stats st;
    run("SET llmq:dead x");
    assert_int_equal(rq_stats(q, queues, 1, false, &st), -1);
    assert_badkey(q, "llmq:dead");
    rq_stats_free(&st);
    run("DEL llmq:dead");
    run("SADD llmq:workers w2");
    run("SET llmq:processing:w2 x");
    assert_int_equal(rq_stats(q, queues, 1, false, &st), -1);
    assert_badkey(q, "llmq:processing:w2");
    rq_stats_free(&st);
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fetch_and_start, rq_test_flush),
        cmocka_unit_test_setup(test_ack, rq_test_flush),
        cmocka_unit_test_setup(test_retry_and_dead, rq_test_flush),
        cmocka_unit_test_setup(test_dead_requeue, rq_test_flush),
        cmocka_unit_test_setup(test_reaper, rq_test_flush),
        cmocka_unit_test_setup(test_requeue, rq_test_flush),
        cmocka_unit_test_setup(test_cancel, rq_test_flush),
        cmocka_unit_test_setup(test_purge, rq_test_flush),
        cmocka_unit_test_setup(test_push_and_batches, rq_test_flush),
        cmocka_unit_test_setup(test_heartbeat, rq_test_flush),
        cmocka_unit_test_setup(test_templates, rq_test_flush),
        cmocka_unit_test_setup(test_progress, rq_test_flush),
        cmocka_unit_test_setup(test_drain, rq_test_flush),
        cmocka_unit_test_setup(test_stats, rq_test_flush),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
