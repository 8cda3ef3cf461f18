/* queue/ without a server: the key layout, job ids (checked against the worker's own job
 * parser, worker/jobs/job.c, which is what finally reads the job), id insertion, the retry backoff,
 * and option checking in rq_open. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "queue/fetch.h"
#include "queue/jobid.h"
#include "queue/keys.h"
#include "queue/retry.h"
#include "queue/route.h"
#include "queue/rq.h"
#include "worker/jobs/job.h"

static void test_keys(void **state)
{
    struct rq_keys k;
    char err[256], buf[RQ_KEY_MAX];
    assert_int_equal(rq_keys_init(&k, NULL, err, sizeof err), 0);
    assert_string_equal(k.workers, "llmq:workers");
    assert_string_equal(k.events, "llmq:events");
    assert_string_equal(k.retry, "llmq:retry");
    assert_string_equal(k.dead, "llmq:dead");
    assert_string_equal(k.cancel, "llmq:cancel");
    assert_string_equal(k.job_stem, "llmq:job:");
    assert_string_equal(k.queue_stem, "llmq:queue:");
    assert_int_equal(rq_key_queue(&k, "short", buf, sizeof buf), 0);
    assert_string_equal(buf, "llmq:queue:short");
    assert_int_equal(rq_key_processing(&k, "gpu1-42", buf, sizeof buf), 0);
    assert_string_equal(buf, "llmq:processing:gpu1-42");
    assert_int_equal(rq_key_worker(&k, "gpu1-42", buf, sizeof buf), 0);
    assert_string_equal(buf, "llmq:worker:gpu1-42");
    assert_int_equal(rq_key_job(&k, "abc", buf, sizeof buf), 0);
    assert_string_equal(buf, "llmq:job:abc");
    /* a stem is the key with an empty name: the Lua scripts append names to it */
    rq_key_job(&k, "", buf, sizeof buf);
    assert_string_equal(buf, k.job_stem);

    /* Redis Cluster: a hash tag keeps every key in one slot */
    assert_int_equal(rq_keys_init(&k, "{llmq}", err, sizeof err), 0);
    rq_key_queue(&k, "long", buf, sizeof buf);
    assert_string_equal(buf, "{llmq}:queue:long");
    assert_string_equal(k.dead, "{llmq}:dead");

    /* too small a buffer is reported, never overrun */
    char tiny[8];
    assert_int_equal(rq_key_queue(&k, "short", tiny, sizeof tiny), -1);

    assert_int_equal(rq_keys_init(&k, "", err, sizeof err), -1);
    assert_int_equal(rq_keys_init(&k, "llmq:", err, sizeof err), -1);
    assert_non_null(strstr(err, "must not end with ':'"));
    assert_int_equal(rq_keys_init(&k, "ll mq", err, sizeof err), -1);
    assert_non_null(strstr(err, "space"));

    assert_true(rq_valid_worker_id("gpu1.example.com-4242"));
    assert_true(rq_valid_worker_id("a@b_c"));
    assert_false(rq_valid_worker_id(""));
    assert_false(rq_valid_worker_id("a b"));
    assert_false(rq_valid_worker_id("a:b"));
    assert_true(rq_valid_queue_name("short"));
    assert_true(rq_valid_queue_name("batch_2-x"));
    assert_false(rq_valid_queue_name("a:b"));
    assert_false(rq_valid_queue_name(""));
}

/* The model-name rule and queue references (<model>:<queue>), joined and split only by keys.c. */
static void test_model_names(void **state)
{
    (void)state;
    assert_true(rq_valid_model_name("qwen3-8b"));
    assert_true(rq_valid_model_name("Qwen/Qwen3-8B-Instruct_v1.5"));
    assert_false(rq_valid_model_name(""));
    assert_false(rq_valid_model_name("qwen3:8b")); /* ':' separates the model from the queue */
    assert_false(rq_valid_model_name("a b"));
    assert_false(rq_valid_model_name("-x"));
    assert_false(rq_valid_model_name("/x"));
    char longest[RQ_MODEL_MAX + 2];
    memset(longest, 'm', sizeof longest);
    longest[RQ_MODEL_MAX] = 0;
    assert_true(rq_valid_model_name(longest));
    longest[RQ_MODEL_MAX] = 'm';
    longest[RQ_MODEL_MAX + 1] = 0;
    assert_false(rq_valid_model_name(longest));

    assert_true(rq_valid_queue_ref("short"));
    assert_true(rq_valid_queue_ref("Qwen/Qwen3-8B:long"));
    assert_false(rq_valid_queue_ref("a b:short"));
    assert_false(rq_valid_queue_ref(":short"));
    assert_false(rq_valid_queue_ref("m:"));
    assert_false(rq_valid_queue_ref("a:b:short"));

    char ref[RQ_QREF_MAX + 1], model[RQ_MODEL_MAX + 1];
    assert_int_equal(rq_queue_ref("qwen3-8b", "short", ref, sizeof ref), 0);
    assert_string_equal(ref, "qwen3-8b:short");
    assert_int_equal(rq_queue_ref(NULL, "long", ref, sizeof ref), 0);
    assert_string_equal(ref, "long");
    assert_int_equal(rq_queue_ref("", "long", ref, sizeof ref), 0);
    assert_string_equal(ref, "long");
    assert_int_equal(rq_queue_ref("bad name", "long", ref, sizeof ref), -1);
    assert_int_equal(rq_queue_ref("m", "bad:queue", ref, sizeof ref), -1);
    assert_string_equal(rq_queue_ref_queue("Qwen/Qwen3-8B:long"), "long");
    assert_string_equal(rq_queue_ref_queue("short"), "short");
    assert_int_equal(rq_queue_ref_model("Qwen/Qwen3-8B:long", model, sizeof model), 0);
    assert_string_equal(model, "Qwen/Qwen3-8B");
    assert_int_equal(rq_queue_ref_model("short", model, sizeof model), 0);
    assert_string_equal(model, "");

    struct rq_keys k;
    char err[256], key[RQ_KEY_MAX];
    assert_int_equal(rq_keys_init(&k, "{llmq}", err, sizeof err), 0);
    assert_int_equal(rq_key_queue(&k, "qwen3-8b:short", key, sizeof key), 0);
    assert_string_equal(key, "{llmq}:queue:qwen3-8b:short");
    assert_string_equal(k.models, "{llmq}:models");
    assert_string_equal(k.templates, "{llmq}:templates");
    assert_true(rq_models_has("tiny,other-8b", "other-8b"));
    assert_true(rq_models_has("tiny", "tiny"));
    assert_false(rq_models_has("tiny,other-8b", "other"));
    assert_false(rq_models_has("", "tiny"));
    assert_false(rq_models_has("Tiny", "tiny")); /* exact: case matters */
}

/* rq_job_id must find exactly the id the worker's parser finds, for every job it accepts. */
static void test_job_id_matches_parser(void **state)
{
    static const char *const jobs[] = {
        "{\"id\":\"job-1\",\"prompt\":\"hi\"}",
        "{\"prompt\":\"hi\",\"max_tokens\":4,\"id\":\"x/y:z\"}",
        "{\"custom_id\":\"req-7\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\","
        "\"body\":{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}",
        "{\"custom_id\":\"req-8\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\","
        "\"prompt\":\"hi\"}}",
        "  {\"id\" : \"\\u00e9t\\u00e9\", \"prompt\" : \"x\"}  ",
    };
    struct job_opts o = job_opts_default();
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
        struct job j;
        char err[512], id[RQ_ID_MAX + 1];
        int rc = job_parse(jobs[i], strlen(jobs[i]), &o, &j, err, sizeof err);
        if (rc != 0)
            fail_msg("job %zu: the parser rejected it: %s", i, err);
        assert_int_equal(rq_job_id(jobs[i], strlen(jobs[i]), 0, id), RQ_ID_FOUND);
        assert_non_null(j.id);
        assert_string_equal(id, j.id);
        job_free(&j);
    }
}

static void test_job_id_states(void **state)
{
    char id[RQ_ID_MAX + 1];
#define ID(s, max) rq_job_id(s, strlen(s), max, id)
    assert_int_equal(ID("{\"prompt\":\"hi\"}", 0), RQ_ID_MISSING);
    assert_string_equal(id, "");
    assert_int_equal(ID("{\"id\":null,\"prompt\":\"hi\"}", 0), RQ_ID_MISSING);
    assert_int_equal(ID("{}", 0), RQ_ID_MISSING);
    assert_int_equal(ID("not json", 0), RQ_ID_NONE);
    assert_int_equal(ID("[1,2]", 0), RQ_ID_NONE);
    assert_int_equal(ID("\"str\"", 0), RQ_ID_NONE);
    assert_int_equal(ID("{\"id\":5,\"prompt\":\"hi\"}", 0), RQ_ID_NONE);
    assert_int_equal(ID("{\"id\":\"\",\"prompt\":\"hi\"}", 0), RQ_ID_NONE);
    assert_int_equal(ID("{\"id\":\"a\\nb\",\"prompt\":\"hi\"}", 0), RQ_ID_NONE);
    /* an OpenAI line is known by custom_id only, and never gets an "id" added */
    assert_int_equal(ID("{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", 0), RQ_ID_NONE);
    assert_int_equal(ID("{\"custom_id\":\"c1\",\"id\":\"other\",\"body\":{}}", 0), RQ_ID_FOUND);
    assert_string_equal(id, "c1");
    /* over max_bytes: not even parsed */
    assert_int_equal(ID("{\"id\":\"big\",\"prompt\":\"hello\"}", 10), RQ_ID_NONE);
    assert_int_equal(ID("{\"id\":\"big\",\"prompt\":\"hello\"}", 1000), RQ_ID_FOUND);
    /* 256 bytes is the longest id */
    char big[400];
    snprintf(big, sizeof big, "{\"id\":\"%0256d\"}", 0);
    assert_int_equal(ID(big, 0), RQ_ID_FOUND);
    snprintf(big, sizeof big, "{\"id\":\"%0257d\"}", 0);
    assert_int_equal(ID(big, 0), RQ_ID_NONE);
#undef ID
}

/* The id is inserted without touching the rest of the text, and the result parses (with the
 * worker's parser, which rejects duplicate keys) to the same job with that id. */
static void test_add_id(void **state)
{
    static const char *const jobs[] = {
        "{\"prompt\":\"hi\",\"temperature\":0.7,\"max_tokens\":5}",
        "{\"prompt\":\"numbers stay as written\",\"seed\":1234567890123,\"top_p\":0.90,\"min_p\":1e-2}",
        "  {\"prompt\":\"trailing space\"}  \n",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"}\"}]}",
    };
    struct job_opts o = job_opts_default();
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
        char *out;
        size_t n;
        assert_int_equal(rq_job_add_id(jobs[i], strlen(jobs[i]), "new-id-1", &out, &n), 0);
        assert_int_equal(n, strlen(out));
        /* everything but the insertion is byte for byte the original */
        const char *ins = strstr(out, ",\"id\":\"new-id-1\"");
        assert_non_null(ins);
        size_t at = (size_t)(ins - out), il = strlen(",\"id\":\"new-id-1\"");
        assert_int_equal(n, strlen(jobs[i]) + il);
        assert_memory_equal(out, jobs[i], at);
        assert_string_equal(out + at + il, jobs[i] + at);
        char id[RQ_ID_MAX + 1];
        assert_int_equal(rq_job_id(out, n, 0, id), RQ_ID_FOUND);
        assert_string_equal(id, "new-id-1");
        struct job j;
        char err[512];
        int rc = job_parse(out, n, &o, &j, err, sizeof err);
        if (rc != 0)
            fail_msg("job %zu with id: %s", i, err);
        assert_string_equal(j.id, "new-id-1");
        job_free(&j);
        free(out);
    }
    /* an empty object: no leading comma */
    char *out;
    size_t n;
    assert_int_equal(rq_job_add_id("{}", 2, "e", &out, &n), 0);
    assert_string_equal(out, "{\"id\":\"e\"}");
    free(out);
    /* "id": null is replaced, not duplicated */
    const char *nul = "{\"id\":null,\"prompt\":\"p\"}";
    assert_int_equal(rq_job_add_id(nul, strlen(nul), "z", &out, &n), 0);
    json_error_t je;
    json_t *root = json_loadb(out, n, JSON_REJECT_DUPLICATES, &je);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "id")), "z");
    assert_string_equal(json_string_value(json_object_get(root, "prompt")), "p");
    json_decref(root);
    free(out);
    /* ids with characters JSON must escape */
    const char *plain = "{\"prompt\":\"p\"}";
    assert_int_equal(rq_job_add_id(plain, strlen(plain), "q\"uo\\te", &out, &n), 0);
    char id[RQ_ID_MAX + 1];
    assert_int_equal(rq_job_id(out, n, 0, id), RQ_ID_FOUND);
    assert_string_equal(id, "q\"uo\\te");
    free(out);
    /* refused: has an id already, not an object, an OpenAI line, JSON jansson cannot read (the
     * worker's parser fails it too) */
    const char *huge = "{\"prompt\":\"p\",\"seed\":18446744073709551615}";
    assert_int_equal(rq_job_add_id(huge, strlen(huge), "b", &out, &n), -1);
    assert_int_equal(rq_job_id(huge, strlen(huge), 0, id), RQ_ID_NONE);
    assert_int_equal(rq_job_add_id("{\"id\":\"a\"}", 10, "b", &out, &n), -1);
    assert_null(out);
    assert_int_equal(rq_job_add_id("nope", 4, "b", &out, &n), -1);
    const char *oai = "{\"method\":\"POST\",\"body\":{}}";
    assert_int_equal(rq_job_add_id(oai, strlen(oai), "b", &out, &n), -1);

    /* new ids: 36-character UUIDv7, distinct */
    char a[RQ_ID_MAX + 1], b[RQ_ID_MAX + 1];
    rq_new_id(a);
    rq_new_id(b);
    assert_int_equal(strlen(a), 36);
    assert_int_equal(a[14], '7');
    assert_string_not_equal(a, b);
}

static void test_backoff(void **state)
{
    /* base * 2^(attempt-1), times [0.75, 1.25), capped */
    assert_int_equal(rq_backoff_ms(100, 10000, 1, 0.0), 75);
    assert_int_equal(rq_backoff_ms(100, 10000, 1, 0.5), 100);
    assert_in_range(rq_backoff_ms(100, 10000, 1, 0.999), 124, 125);
    assert_int_equal(rq_backoff_ms(100, 10000, 2, 0.5), 200);
    assert_int_equal(rq_backoff_ms(100, 10000, 4, 0.5), 800);
    assert_int_equal(rq_backoff_ms(100, 1000, 5, 0.5), 1000); /* 1600 capped at 1000 */
    assert_int_equal(rq_backoff_ms(100, 1000, 5, 0.0), 750);
    assert_int_equal(rq_backoff_ms(100, 1000, 5, 0.99), 1000); /* the jitter never passes the cap */
    assert_int_equal(rq_backoff_ms(100, 1000, 60, 0.5), 1000); /* no overflow */
    assert_int_equal(rq_backoff_ms(100, 1000, 0, 0.5), 100);   /* attempt < 1 counts as 1 */
    /* jitter spreads the delays */
    int64_t lo = rq_backoff_ms(1000, 60000, 3, 0.0), hi = rq_backoff_ms(1000, 60000, 3, 0.99);
    assert_true(hi - lo > 1900);
}

static void test_open_options(void **state)
{
    struct rq_opts o;
    struct rq *q;
    char err[512];
    rq_opts_default(&o);
    o.worker_id = "w1";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    assert_string_equal(rq_worker_id(q), "w1");
    assert_string_equal(q->proc_key, "llmq:processing:w1");
    assert_string_equal(q->hb_key, "llmq:worker:w1");
    assert_string_equal(q->cmd.addr.host, "127.0.0.1");
    assert_int_equal(q->cmd.addr.port, 6379);
    rq_free(q);

    /* default worker id: <host>-<pid> */
    o.worker_id = NULL;
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "-%ld", (long)getpid());
    assert_non_null(strstr(rq_worker_id(q), pid));
    assert_true(rq_valid_worker_id(rq_worker_id(q)));
    rq_free(q);

    /* URL, then username/password/db override it */
    o.url = "redis://alice:pw%40x@10.0.0.1:7000/3";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    assert_string_equal(q->cmd.addr.user, "alice");
    assert_string_equal(q->cmd.addr.password, "pw@x");
    assert_int_equal(q->cmd.addr.db, 3);
    assert_int_equal(q->blk.addr.port, 7000);
    rq_free(q);
    o.username = "bob";
    o.password = "other";
    o.db = 5;
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    assert_string_equal(q->cmd.addr.user, "bob");
    assert_string_equal(q->cmd.addr.password, "other");
    assert_int_equal(q->cmd.addr.db, 5);
    rq_free(q);
    rq_opts_default(&o);

    /* a bare socket path and a unix:// URL */
    o.url = "/run/redis/redis.sock";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    assert_string_equal(q->cmd.addr.unix_path, "/run/redis/redis.sock");
    rq_free(q);
    o.url = "unix:///tmp/r.sock?db=2";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), 0);
    assert_string_equal(q->cmd.addr.unix_path, "/tmp/r.sock");
    assert_int_equal(q->cmd.addr.db, 2);
    rq_free(q);

    /* refused */
    o.url = "rediss://host";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), -1);
    assert_null(q);
    assert_non_null(strstr(err, "TLS"));
    rq_opts_default(&o);
    o.worker_id = "bad id";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), -1);
    assert_non_null(strstr(err, "worker id"));
    rq_opts_default(&o);
    o.prefix = "x:";
    assert_int_equal(rq_open(&o, &q, err, sizeof err), -1);
    rq_free(NULL); /* harmless */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_model_names),
        cmocka_unit_test(test_job_id_matches_parser),
        cmocka_unit_test(test_job_id_states),
        cmocka_unit_test(test_add_id),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_open_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
