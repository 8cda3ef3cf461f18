/* queue/conn.c against real redis-servers: SELECT db (URL and option), unix sockets, AUTH with a
 * password and with an ACL user (created with redis-cli), clear errors for missing or wrong
 * credentials, fast failure and exponential backoff while the server is down, reconnection after
 * a restart (both connections, scripts loaded again), the NOSCRIPT fallback, client names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/ack.h"
#include "queue/batch.h"
#include "queue/fetch.h"
#include "queue/progress.h"
#include "queue/push.h"
#include "queue/replicas.h"
#include "queue/rq.h"
#include "rq_test.h"

static int setup(void **state)
{
    if (!adm || adm->err) { /* a restart in an earlier test broke it */
        if (adm)
            redisFree(adm);
        adm = redis_server_connect(&srv);
        if (!adm)
            return -1;
    }
    return rq_test_flush(state);
}

/* Short timeouts: the tests with a server down wait for them. */
static struct rq *open_url(const char *url, const char *user, const char *password, int db)
{
    struct rq_opts o = rq_test_opts(url, "w1");
    o.username = user;
    o.password = password;
    o.db = db;
    o.connect_timeout_ms = 500;
    o.block_timeout_ms = 300;
    o.reconnect_max_ms = 400;
    return rq_test_open(&o);
}

/* push + fetch + ack through q; returns 0 when it all worked */
static int round_trip(struct rq *q, const char *id)
{
    rq_test_push_id(q, "short", id);
    struct rq_source src = {"short", 1};
    struct rq_job j;
    int n = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j);
    if (n != 1)
        return -1;
    int rc = strcmp(j.id, id) ? -1 : 0;
    struct rq_result res = {
        .job = &j, .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    if (rq_ack(q, &res, 1) != 1)
        rc = -1;
    rq_job_free(&j);
    return rc;
}

static void test_select_db(void **state)
{
    struct rq *q = open_url(srv.url, NULL, NULL, 3);
    rq_test_push_id(q, "short", "in-db-3");
    assert_int_equal(ival("LLEN llmq:queue:short"), 0); /* the admin connection is on db 0 */
    run("SELECT 3");
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    run("DEL llmq:queue:short");
    assert_int_equal(round_trip(q, "again-3"), 0);
    assert_string_equal(sval("HGET llmq:job:again-3 status"), "completed");
    run("SELECT 0");
    rq_free(q);
    /* the db in the URL */
    char url[128];
    snprintf(url, sizeof url, "%s/5", srv.url);
    q = open_url(url, NULL, NULL, -1);
    rq_test_push_id(q, "short", "in-db-5");
    run("SELECT 5");
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    run("SELECT 0");
    rq_free(q);
}

static void test_unix_socket(void **state)
{
    char url[300];
    snprintf(url, sizeof url, "unix://%s?db=2", srv.sock);
    struct rq *q = open_url(url, NULL, NULL, -1);
    assert_int_equal(rq_connect(q), 0);
    rq_test_push_id(q, "short", "via-socket");
    run("SELECT 2");
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    run("DEL llmq:queue:short");
    run("SELECT 0");
    assert_int_equal(round_trip(q, "sock-2"), 0);
    rq_free(q);
    /* a bare socket path */
    q = open_url(srv.sock, NULL, NULL, -1);
    assert_int_equal(round_trip(q, "bare-path"), 0);
    rq_free(q);
}

static void test_auth_password_and_acl_user(void **state)
{
    struct redis_server sec;
    const char *extra[] = {"--requirepass", "s3cret", NULL};
    assert_int_equal(redis_server_start(&sec, extra), 0);
    /* no password: a clear error, not a crash */
    struct rq *q = open_url(sec.url, NULL, NULL, -1);
    assert_int_equal(rq_connect(q), -1);
    assert_non_null(strstr(rq_error(q), "NOAUTH"));
    assert_non_null(strstr(rq_error(q), "redis.password"));
    rq_free(q);
    /* a wrong one */
    q = open_url(sec.url, NULL, "wrong", -1);
    assert_int_equal(rq_connect(q), -1);
    assert_non_null(strstr(rq_error(q), "AUTH failed"));
    rq_free(q);
    /* the right one, as an option and in the URL */
    q = open_url(sec.url, NULL, "s3cret", -1);
    assert_int_equal(rq_connect(q), 0);
    assert_int_equal(round_trip(q, "authed"), 0);
    rq_free(q);
    char url[160];
    snprintf(url, sizeof url, "redis://:s3cret@127.0.0.1:%d/1", sec.port);
    q = open_url(url, NULL, NULL, -1);
    assert_int_equal(round_trip(q, "authed-url"), 0);
    rq_free(q);

    /* an ACL user limited to llmq's keys, made with redis-cli */
    char out[256];
    assert_int_equal(
        redis_cli(&sec, out, sizeof out, "ACL SETUSER llmqw on '>w%%rk pw' '~llmq:*' '&*' '+@all'"), 0);
    assert_non_null(strstr(out, "OK"));
    snprintf(url, sizeof url, "redis://llmqw:w%%25rk%%20pw@127.0.0.1:%d", sec.port); /* percent-encoded */
    q = open_url(url, NULL, NULL, -1);
    assert_int_equal(rq_connect(q), 0);
    assert_int_equal(round_trip(q, "acl-url"), 0);
    rq_free(q);
    q = open_url(sec.url, "llmqw", "w%rk pw", -1);
    assert_int_equal(round_trip(q, "acl-opts"), 0);
    /* the user really is limited: a key outside llmq:* is refused (so the ACL is in force) */
    redisReply *r = rq_conn_command(&q->cmd, "SET other:key 1");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "NOPERM"));
    freeReplyObject(r);
    rq_free(q);
    q = open_url(sec.url, "llmqw", "nope", -1);
    assert_int_equal(rq_connect(q), -1);
    assert_non_null(strstr(rq_error(q), "AUTH (ACL user) failed"));
    rq_free(q);
    redis_server_cleanup(&sec);
}

/* Nothing listens: operations fail fast (no hang), with the next attempt in the message, and
 * the attempts back off exponentially up to reconnect_max_ms. */
static void test_down_and_backoff(void **state)
{
    int port = redis_server_free_port();
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    struct rq *q = open_url(url, NULL, NULL, -1);
    assert_int_equal(rq_connect(q), -1);
    assert_non_null(strstr(rq_error(q), "Connection refused"));
    int64_t t0 = rq_mono_ms();
    struct rq_progress pr = {"x", 0.5, -1, -1, 0, 0, 0, 0};
    assert_int_equal(rq_progress(q, &pr, 1), -1);
    assert_true(rq_mono_ms() - t0 < 50);
    assert_non_null(strstr(rq_error(q), "progress: "));
    assert_non_null(strstr(rq_error(q), "next reconnect attempt in"));
    /* the delays double: 100, 200, 400 (the cap), 400 */
    int want[] = {200, 400, 400, 400};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(q->cmd.backoff_ms, want[i]);
        assert_int_equal(rq_conn_connect_now(&q->cmd), -1);
    }
    assert_int_equal(q->cmd.failures, 5);
    int64_t wait = rq_conn_retry_in_ms(&q->cmd);
    assert_true(wait > 0 && wait <= 480); /* 400 +- 20% */
    /* a blocking fetch while down waits out its block time instead of spinning, then fails */
    struct rq_source src = {"short", 1};
    struct rq_job j;
    t0 = rq_mono_ms();
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, RQ_BLOCK_DEFAULT, &j), -1);
    int64_t dt = rq_mono_ms() - t0;
    assert_true(dt >= 250 && dt < 1500);
    /* a server appears on that port: the next attempt after the backoff connects */
    struct redis_server late = {0};
    snprintf(late.dir, sizeof late.dir, "/tmp/llmq-redis-XXXXXX");
    assert_non_null(mkdtemp(late.dir));
    snprintf(late.sock, sizeof late.sock, "%s/redis.sock", late.dir);
    snprintf(late.log, sizeof late.log, "%s/redis.log", late.dir);
    late.port = port;
    assert_int_equal(redis_server_spawn(&late), 0);
    int ok = -1;
    t0 = rq_mono_ms();
    while (ok != 0 && rq_mono_ms() - t0 < 3000) {
        ok = rq_progress(q, &pr, 1);
        if (ok)
            redis_server_sleep_ms(20);
    }
    assert_int_equal(ok, 0);
    assert_true(rq_mono_ms() - t0 <= 600); /* within the capped backoff */
    assert_int_equal(q->cmd.failures, 0);
    assert_int_equal(q->cmd.backoff_ms, 100);
    rq_free(q);
    redis_server_cleanup(&late);
}

/* The server restarts (no persistence: its data is gone, that is Redis's behaviour); rq notices,
 * reconnects both connections, loads its scripts again and keeps working. */
static void test_reconnect_after_restart(void **state)
{
    struct rq *q = open_url(srv.url, NULL, NULL, -1);
    assert_int_equal(round_trip(q, "before"), 0);
    struct rq_source src = {"short", 1};
    struct rq_job j;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 100, &j), 0); /* the blocking one is up */
    assert_int_equal(q->cmd.connects, 1);
    assert_int_equal(q->blk.connects, 1);
    redisFree(adm);
    adm = NULL;
    assert_int_equal(redis_server_restart(&srv), 0);
    adm = redis_server_connect(&srv);
    assert_non_null(adm);
    /* the first command on the dead socket fails; the next reconnects at once */
    int fails = 0;
    struct rq_progress pr = {"x", 0.5, -1, -1, 0, 0, 0, 0};
    while (rq_progress(q, &pr, 1) != 0) {
        assert_non_null(strstr(rq_error(q), "progress: redis 127.0.0.1:"));
        assert_true(++fails < 5);
        redis_server_sleep_ms(20);
    }
    assert_true(fails <= 1);
    assert_int_equal(q->cmd.connects, 2);
    assert_int_equal(round_trip(q, "after"), 0); /* scripts loaded again on the new server */
    /* the blocking connection comes back too */
    rq_test_lpush_later(0.2, "short", "'{\"id\":\"blk\"}'");
    int n = 0;
    for (int i = 0; i < 20 && n <= 0; i++)
        n = rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 300, &j);
    assert_int_equal(n, 1);
    assert_string_equal(j.id, "blk");
    assert_int_equal(q->blk.connects, 2);
    struct rq_result res = {
        .job = &j, .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, &res, 1), 1);
    rq_job_free(&j);
    rq_free(q);
}

static void test_noscript_fallback(void **state)
{
    struct rq *q = open_url(srv.url, NULL, NULL, -1);
    assert_int_equal(round_trip(q, "s1"), 0);
    run("SCRIPT FLUSH"); /* an operator, or a failover to a fresh replica */
    rq_test_push_id(q, "short", "s2");
    struct rq_source src = {"short", 1};
    struct rq_job j;
    uint64_t epoch = q->scripts.epoch;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 1);
    assert_string_equal(j.id, "s2");
    assert_int_equal(q->scripts.epoch, epoch); /* same connection: loaded again after NOSCRIPT */
    redisReply *ex = cmd("SCRIPT EXISTS %s", q->scripts.sha[RQ_SCRIPT_FETCH]);
    assert_int_equal(ex->element[0]->integer, 1);
    freeReplyObject(ex);
    struct rq_result res = {
        .job = &j, .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, &res, 1), 1);
    rq_job_free(&j);
    rq_free(q);
}

/* redis.wait_replicas against a server without replicas, then with one (a second redis-server,
 * REPLICAOF): a push fails and says why; a fetch takes nothing while no replica is connected (ROLE),
 * and hands back what it fetched when WAIT falls short; an ack fails, keeps the job held and then
 * fails at once (ROLE) without waiting; with the replica connected the held ack goes through and
 * push and fetch succeed. */
static void test_wait_replicas(void **state)
{
    struct rq_opts o = rq_test_opts(srv.url, "w1");
    o.wait_replicas = 1;
    o.wait_timeout_ms = 100;
    struct rq *q = rq_test_open(&o);
    q->o.wait_replicas = 0; /* the batch opened without WAIT: the push below WAITs for both */
    assert_int_equal(rq_batch_open(q, "bt", NULL, false), 0);
    q->o.wait_replicas = 1;
    struct rq_push_item it = {"{\"id\":\"a\",\"prompt\":\"x\"}", 23, "a", NULL};
    assert_int_equal(rq_push(q, "short", "bt", RQ_PUSH_NEW, &it, 1), -1);
    assert_non_null(strstr(rq_error(q), "push: 0 of 1 replica confirmed within 100 ms"));
    assert_int_equal(ival("LLEN llmq:queue:short"), 1); /* on the master all the same */

    struct rq_source src = {"short", 1};
    struct rq_job j;
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 0); /* ROLE: no replica */
    assert_int_equal(ival("LLEN llmq:queue:short"), 1);
    q->wait_short = false; /* as if a replica had confirmed the last write: the fetch runs, then WAITs */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 0);
    assert_int_equal(ival("LLEN llmq:queue:short"), 1); /* handed back */
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0);
    assert_string_equal(sval("HGET llmq:job:a status"), "queued");
    assert_int_equal(q->wait_shortfalls, 2);

    q->o.wait_replicas = 0; /* a fetch without WAIT, to hold the job; the batch sealed */
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 1);
    assert_true(rq_batch_seal(q, "bt") >= 0);
    q->o.wait_replicas = 1;
    q->wait_short = false;
    struct rq_result res = {
        .job = &j, .status = RQ_STATUS_COMPLETED, .prompt_tokens = -1, .completion_tokens = -1};
    assert_int_equal(rq_ack(q, &res, 1), -1);
    assert_non_null(strstr(rq_error(q), "ack: 0 of 1 replica confirmed within 100 ms"));
    assert_int_equal(ival("LLEN llmq:processing:w1"), 0); /* done on the master */
    assert_int_equal(rq_held_count(q), 1);                /* but held until a replica has it */
    assert_true(rq_wait_short(q));
    assert_int_equal(rq_ack(q, &res, 1), -1); /* at once: ROLE shows no replica */
    assert_non_null(strstr(rq_error(q), "ack: 0 replicas connected, redis.wait_replicas asks for 1"));
    assert_int_equal(rq_held_count(q), 1);

    struct redis_server rep;
    char port[16];
    snprintf(port, sizeof port, "%d", srv.port);
    const char *extra[] = {"--replicaof", "127.0.0.1", port, NULL};
    assert_int_equal(redis_server_start(&rep, extra), 0);
    int64_t t0 = rq_mono_ms();
    int removed = -1;
    while (removed < 0 && rq_mono_ms() - t0 < 20000) { /* until the replica has synced */
        removed = rq_ack(q, &res, 1);
        if (removed < 0)
            redis_server_sleep_ms(20);
    }
    assert_int_equal(removed, 0); /* its first run took it out of the list already */
    assert_int_equal(res.batch_done, 1); /* and completed the batch: reported now */
    assert_string_equal(sval("HGET llmq:batch:bt state"), "completed");
    assert_int_equal(rq_held_count(q), 0);
    assert_false(rq_wait_short(q));
    assert_string_equal(sval("HGET llmq:job:a status"), "completed");
    rq_job_free(&j);
    it.id = "b";
    it.raw = "{\"id\":\"b\",\"prompt\":\"x\"}";
    assert_int_equal(rq_push(q, "short", NULL, RQ_PUSH_NEW, &it, 1), 0);
    rq_push_item_clear(&it, 1);
    assert_int_equal(rq_fetch(q, &src, 1, RQ_ORDER_PRIORITY, 1, 0, &j), 1);
    assert_string_equal(j.id, "b");
    assert_int_equal(q->wait_shortfalls, 3);
    rq_job_free(&j);
    rq_free(q);
    redis_server_cleanup(&rep);
}

static void test_client_names(void **state)
{
    struct rq *q = open_url(srv.url, NULL, NULL, -1);
    assert_int_equal(rq_connect(q), 0);
    const char *list = sval("CLIENT LIST");
    assert_non_null(strstr(list, "name=llmq:w1 "));
    assert_non_null(strstr(list, "name=llmq:w1:blocking "));
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_select_db, setup),
        cmocka_unit_test_setup(test_unix_socket, setup),
        cmocka_unit_test_setup(test_auth_password_and_acl_user, setup),
        cmocka_unit_test_setup(test_down_and_backoff, setup),
        cmocka_unit_test_setup(test_reconnect_after_restart, setup),
        cmocka_unit_test_setup(test_noscript_fallback, setup),
        cmocka_unit_test_setup(test_client_names, setup),
        cmocka_unit_test_setup(test_wait_replicas, setup),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
