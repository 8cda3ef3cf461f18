/* A job's key has one rule in three places (queue/jobid.h): rq_job_id in C, job_id() in the Lua
 * prelude every script starts with (queue/scripts.c), and the worker's parser (job_parse's
 * j->id). One table of job texts goes through all three against a real redis-server (EVAL of the
 * prelude); they must agree on every line, and on the lines the parser accepts it must name the
 * same key. Plus rq_job_add_batch: the text kept byte for byte, the key it gives; and the
 * one-pass reading rq_job_id tries first (queue/jobscan.h) against a full jansson parse on
 * tricky texts and every one-byte change of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "queue/jobid.h"
#include "queue/jobscan.h"
#include "queue/scripts.h"
#include "rq_test.h"
#include "worker/jobs/job.h"

#define OA(rest) "{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"p\"}" rest "}"

struct row {
    const char *raw;
    size_t max_bytes; /* 0 = no limit */
    const char *key;  /* the expected key; NULL = none */
};

static char long_id[RQ_OWN_ID_MAX + 1], batch64[RQ_BATCH_ID_MAX + 1];
static char id256_line[512], id257_line[512], e256[RQ_OWN_ID_MAX + 1], e256_line[512], eur258_line[512];
static char deep_ok[2200], deep_over[2200], big_int_ok[128], big_int_over[128], neg_int_ok[128],
    neg_int_over[128];
static char big_line[1024], longest[1024], too_long_cid[1024], batch65_line[512], longest_key[RQ_ID_MAX + 8];

/* The Lua rule's answer for raw: its key, or NULL (into buf). */
static const char *lua_key(const char *raw, size_t max_bytes, char *buf, size_t len)
{
    static char script[16384];
    snprintf(script, sizeof script,
             "%s\nlocal id, json = job_id(ARGV[13])\nreturn {id or false, json and 1 or 0}\n",
             rq_script_prelude());
    char maxb[32];
    snprintf(maxb, sizeof maxb, "%zu", max_bytes);
    const char *argv[] = {
        "EVAL", script, "4", "e",     "d",  "c", "p",           "llmq:job:",       "llmq:queue:",  "w1",
        "0",    "100",  "0", "short", maxb, "3", "llmq:batch:", "llmq:batch-done", "llmq:worker:", raw};
    enum { N = sizeof argv / sizeof argv[0] };
    size_t lens[N];
    for (int i = 0; i < N; i++)
        lens[i] = strlen(argv[i]);
    redisReply *r = redisCommandArgv(adm, N, argv, lens);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
        fail_msg("EVAL of job_id() for %s: %s", raw,
                 r && r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
    const char *out = NULL;
    if (r->element[0]->type == REDIS_REPLY_STRING) {
        snprintf(buf, len, "%.*s", (int)r->element[0]->len, r->element[0]->str);
        out = buf;
    }
    freeReplyObject(r);
    return out;
}

static void fill(void)
{
    memset(long_id, 'i', RQ_OWN_ID_MAX);
    long_id[RQ_OWN_ID_MAX] = 0;
    memset(batch64, 'b', RQ_BATCH_ID_MAX);
    batch64[RQ_BATCH_ID_MAX] = 0;
    snprintf(big_line, sizeof big_line, "{\"id\":\"big\",\"prompt\":\"%0200d\"}", 0);
    snprintf(longest, sizeof longest, OA(",\"custom_id\":\"%s\",\"batch_id\":\"%s\""), long_id, batch64);
    snprintf(longest_key, sizeof longest_key, "%s/%s", batch64, long_id);
    snprintf(too_long_cid, sizeof too_long_cid, OA(",\"custom_id\":\"%si\"") "", long_id);
    snprintf(batch65_line, sizeof batch65_line, OA(",\"custom_id\":\"r\",\"batch_id\":\"%sb\""), batch64);
    snprintf(id256_line, sizeof id256_line, "{\"id\":\"%s\"}", long_id);
    snprintf(id257_line, sizeof id257_line, "{\"id\":\"%si\"}", long_id);
    for (int i = 0; i < RQ_OWN_ID_MAX / 2; i++) /* 128 x U+00E9: 256 bytes */
        memcpy(e256 + 2 * i, "\xc3\xa9", 2);
    e256[RQ_OWN_ID_MAX] = 0;
    snprintf(e256_line, sizeof e256_line, "{\"id\":\"%s\"}", e256);
    int o = snprintf(eur258_line, sizeof eur258_line, "{\"id\":\""); /* 86 x U+20AC: 258 bytes */
    for (int i = 0; i < 86; i++)
        o += snprintf(eur258_line + o, sizeof eur258_line - (size_t)o, "\xe2\x82\xac");
    snprintf(eur258_line + o, sizeof eur258_line - (size_t)o, "\"}");
    /* nesting: the id at depth 1, a value nested to 1000 levels in all (the most both read), 1001 */
    for (int k = 0; k < 2; k++) {
        char *d = k ? deep_over : deep_ok;
        int levels = k ? 1000 : 999;
        int n = snprintf(d, 64, "{\"id\":\"deep\",\"x\":");
        memset(d + n, '[', (size_t)levels);
        memset(d + n + levels, ']', (size_t)levels);
        strcpy(d + n + 2 * levels, "}");
    }
    snprintf(big_int_ok, sizeof big_int_ok, "{\"id\":\"i\",\"x\":9223372036854775807}");
    snprintf(big_int_over, sizeof big_int_over, "{\"id\":\"i\",\"x\":9223372036854775808}");
    snprintf(neg_int_ok, sizeof neg_int_ok, "{\"id\":\"i\",\"x\":-9223372036854775808}");
    snprintf(neg_int_over, sizeof neg_int_over, "{\"id\":\"i\",\"x\":-9223372036854775809}");
}

/* Runs rows through rq_job_id, the Lua job_id() and (for a line with a key) the worker's parser,
 * printing each row where they disagree; returns their count. lax: the parser may refuse a line
 * with a key (but where it accepts one, its key must be the same). */
static int check_rows(const struct row *rows, size_t n, bool lax)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const struct row *r = &rows[i];
        size_t len = strlen(r->raw);
        char c[RQ_ID_MAX + 1], l[RQ_ID_MAX + 64];
        enum rq_idstate st = rq_job_id(r->raw, len, r->max_bytes, c);
        const char *ck = st == RQ_ID_FOUND ? c : NULL;
        const char *lk = lua_key(r->raw, r->max_bytes, l, sizeof l);
        if (!r->key) {
            if (ck || lk) {
                print_error("row %zu (%.80s): want no key, C '%.40s', Lua '%.40s'\n", i, r->raw,
                            ck ? ck : "-", lk ? lk : "-");
                bad++;
            }
            continue;
        }
        if (!ck || !lk || strcmp(ck, r->key) || strcmp(lk, r->key)) {
            print_error("row %zu (%.80s): want '%.40s', C '%.40s', Lua '%.40s'\n", i, r->raw, r->key,
                        ck ? ck : "-", lk ? lk : "-");
            bad++;
            continue;
        }
        struct job j;
        char err[512];
        struct job_opts o = job_opts_default();
        o.max_bytes = (int64_t)r->max_bytes;
        int rc = job_parse(r->raw, len, &o, &j, err, sizeof err);
        if (rc) {
            if (!lax) {
                print_error("row %zu: job_parse refused a line with a key: %s\n", i, err);
                bad++;
            }
            continue;
        }
        if (!j.id || strcmp(j.id, r->key)) {
            print_error("row %zu: the parser's key '%s', want '%s'\n", i, j.id ? j.id : "(none)", r->key);
            bad++;
        }
        job_free(&j);
    }
    return bad;
}

static void test_c_lua_parser_agree(void **state)
{
    (void)state;
    fill();
    const struct row rows[] = {
        {"{\"id\":\"a\",\"prompt\":\"x\"}", 0, "a"},
        {"{\"prompt\":\"x\"}", 0, NULL},
        {"{\"id\":null,\"prompt\":\"x\"}", 0, NULL},
        {"{\"id\":7,\"prompt\":\"x\"}", 0, NULL},
        {"{\"id\":\"\",\"prompt\":\"x\"}", 0, NULL},
        {"{\"id\":\"a\\u0001b\",\"prompt\":\"x\"}", 0, NULL},
        {"{\"id\":\"a/b\",\"batch_id\":\"night-1\",\"prompt\":\"x\"}", 0, "a/b"}, /* llmq: batch not in key */
        {"{\"id\":\"\\u00e9t\\u00e9\",\"prompt\":\"x\"}", 0, "\xc3\xa9t\xc3\xa9"},
        {OA(",\"custom_id\":\"r-1\""), 0, "r-1"},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":\"night-1\""), 0, "night-1/r-1"},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":null"), 0, "r-1"},
        {OA(",\"custom_id\":\"x/y\",\"batch_id\":\"b.2_c-3\""), 0, "b.2_c-3/x/y"},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":\"a/b\""), 0, NULL},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":\"\""), 0, NULL},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":12"), 0, NULL},
        {OA(",\"custom_id\":\"r-1\",\"batch_id\":\"sp ace\""), 0, NULL},
        {OA(",\"custom_id\":5"), 0, NULL},
        {OA(""), 0, NULL}, /* no custom_id */
        {longest, 0, longest_key},
        {too_long_cid, 0, NULL},
        {batch65_line, 0, NULL},
        {big_line, 100, NULL}, /* over max_bytes: not read */
        {big_line, 0, "big"},
        {"not json", 0, NULL},
        {"[1,2]", 0, NULL},
        {"\"id\"", 0, NULL},
    };
    assert_int_equal(check_rows(rows, sizeof rows / sizeof rows[0], false), 0);
}

/* The bytes of an id, and lines that are JSON to the Lua decoder but not to the C one, each
 * with a few members only (the parser may refuse them: no prompt). */
static void test_id_bytes_agree(void **state)
{
    (void)state;
    fill();
    const struct row rows[] = {
        /* the bytes of an id: 1..256 of valid UTF-8 without C0 controls or DEL */
        {id256_line, 0, long_id},
        {id257_line, 0, NULL},
        {e256_line, 0, e256},   /* 256 bytes, 128 characters */
        {eur258_line, 0, NULL}, /* 86 characters, 258 bytes */
        {"{\"id\":\"\xf0\x9f\x98\x80 \xe2\x82\xac/x\"}", 0, "\xf0\x9f\x98\x80 \xe2\x82\xac/x"},
        {"{\"id\":\"\\ud83d\\ude00\"}", 0, "\xf0\x9f\x98\x80"}, /* an escaped surrogate pair */
        {"{\"id\":\"a\xc2\x85\"}", 0, "a\xc2\x85"},             /* U+0085, a C1 control: allowed */
        {"{\"id\":\"a\xff\"}", 0, NULL},                        /* not UTF-8 */
        {"{\"id\":\"a\xc3\"}", 0, NULL},                        /* cut short */
        {"{\"id\":\"a\xe2\x82\"}", 0, NULL},
        {"{\"id\":\"a\x80\"}", 0, NULL},                /* a stray continuation byte */
        {"{\"id\":\"\xc3\xa9\xa9\"}", 0, NULL},         /* one continuation too many */
        {"{\"id\":\"\xc0\xaf\"}", 0, NULL},             /* overlong '/' */
        {"{\"id\":\"\xe0\x80\xaf\"}", 0, NULL},         /* overlong, 3 bytes */
        {"{\"id\":\"\xf0\x80\x80\xaf\"}", 0, NULL},     /* overlong, 4 bytes */
        {"{\"id\":\"\xed\xa0\x80\"}", 0, NULL},         /* a surrogate in UTF-8 */
        {"{\"id\":\"\xf4\x90\x80\x80\"}", 0, NULL},     /* over U+10FFFF */
        {"{\"id\":\"\xf8\x88\x80\x80\x80\"}", 0, NULL}, /* a 5-byte form */
        {"{\"id\":\"\\ud800\"}", 0, NULL},              /* a lone surrogate escape */
        {"{\"id\":\"a\\u0000\"}", 0, NULL},
        {"{\"id\":\"a\tb\"}", 0, NULL},  /* a raw control character in the string */
        {"{\"id\":\"a\\tb\"}", 0, NULL}, /* an escaped one */
        {"{\"id\":\"a\\u001fb\"}", 0, NULL},
        {"{\"id\":\"a\x7f\"}", 0, NULL},
        {"{\"id\":\"a\\u007f\"}", 0, NULL},
        {"{\"id\":\" \"}", 0, " "},
        {"{\"id\":\"a\",\"id\":\"b\"}", 0, "b"}, /* a repeated member: the last */
        /* "\u0000" outside the key: read by both (the parser refuses it) */
        {"{\"id\":\"a\",\"p\":\"x\\u0000\"}", 0, "a"},
        {"{\"id\":\"a\",\"p\":\"x\\\\u0000\"}", 0, "a"}, /* an escaped backslash, then text */
        {"{\"id\":\"a\",\"p\":\"x\\\\\\u0000\"}", 0, "a"},
        {"{\"id\":\"a\",\"p\":\"q\\\"\\ttab\"}", 0, "a"},
        {"{\n\t\"id\" :\r\n \"a\" }\n", 0, "a"},
        /* numbers as JSON writes them: what only a lax decoder reads has no key */
        {"{\"id\":\"a\",\"x\":NaN}", 0, NULL},
        {"{\"id\":\"a\",\"x\":-Infinity}", 0, NULL},
        {"{\"id\":\"a\",\"x\":0x10}", 0, NULL},
        {"{\"id\":\"a\",\"x\":01}", 0, NULL},
        {"{\"id\":\"a\",\"x\":-01}", 0, NULL},
        {"{\"id\":\"a\",\"x\":+1}", 0, NULL},
        {"{\"id\":\"a\",\"x\":[0,-0,0.5,-0.0e-05,1E+5,1e005,10,100.001,1e-400]}", 0, "a"},
        {"{\"id\":\"a\",\"x\":[true,false,null],\"e\":\"e+01 NaN 0x\"}", 0, "a"},
        {big_int_ok, 0, "i"},
        {neg_int_ok, 0, "i"},
        {"{\"id\":\"i\",\"x\":123456789012345678901234567890.5}", 0, "i"},
        {deep_ok, 0, "deep"},
        {deep_over, 0, NULL},
        {"\xef\xbb\xbf{\"id\":\"a\"}", 0, NULL}, /* a byte order mark */
        {"{\"id\":\"a\"} x", 0, NULL},
        {"", 0, NULL},
    };
    assert_int_equal(check_rows(rows, sizeof rows / sizeof rows[0], true), 0);
    /* JSON to cjson and not to jansson, outside the key's strings: the scripts find the key,
     * rq_job_id does not, and the worker's parser refuses the line (it fails the job as invalid
     * JSON under the scripts' key: docs/QUEUE.md, "A job's key") */
    const struct row lua_only[] = {
        {"{\"id\":\"a\",\"p\":\"\xff\"}", 0, "a"},
        {"{\"id\":\"a\",\"p\":\"\xed\xbf\xbf\"}", 0, "a"},
        {"{\"id\":\"a\",\"p\":\"tab\there\"}", 0, "a"},
        {"{\"id\":\"a\",\"p\":\"nl\nhere\"}", 0, "a"},
        {"{\"id\":\"a\",\"x\":1.}", 0, "a"},
        {"{\"id\":\"a\",\"x\":-.5}", 0, "a"},
        {"{\"id\":\"a\",\"x\":1e400}", 0, "a"},
        {"{\"id\":\"a\",\"x\":-1E+400}", 0, "a"},
        {big_int_over, 0, "i"},
        {neg_int_over, 0, "i"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof lua_only / sizeof lua_only[0]; i++) {
        const struct row *r = &lua_only[i];
        size_t len = strlen(r->raw);
        char c[RQ_ID_MAX + 1], l[RQ_ID_MAX + 64], err[512];
        const char *lk = lua_key(r->raw, 0, l, sizeof l);
        struct job j;
        struct job_opts o = job_opts_default();
        int parsed = job_parse(r->raw, len, &o, &j, err, sizeof err) == 0;
        if (parsed)
            job_free(&j);
        if (rq_job_id(r->raw, len, 0, c) == RQ_ID_FOUND || !lk || strcmp(lk, r->key) || parsed) {
            print_error("lua_only row %zu (%.80s): C '%s', Lua '%s', parser %s\n", i, r->raw, c[0] ? c : "-",
                        lk ? lk : "-", parsed ? "accepts" : "refuses");
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

/* "batch_id" goes in before the closing brace, the rest of the text unchanged; the key follows. */
static void test_add_batch(void **state)
{
    (void)state;
    const char *line = "{\"custom_id\": \"r-1\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                       "\"body\": {\"prompt\": \"p\"}}  ";
    char *out;
    size_t n;
    assert_int_equal(rq_job_add_batch(line, strlen(line), "night-1", &out, &n), 0);
    assert_string_equal(out, "{\"custom_id\": \"r-1\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                             "\"body\": {\"prompt\": \"p\"},\"batch_id\":\"night-1\"}  ");
    assert_int_equal(n, strlen(out));
    char key[RQ_ID_MAX + 1];
    assert_int_equal(rq_job_id(out, n, 0, key), RQ_ID_FOUND);
    assert_string_equal(key, "night-1/r-1");
    free(out);
    assert_int_equal(rq_job_add_batch("{}", 2, "b", &out, &n), 0);
    assert_string_equal(out, "{\"batch_id\":\"b\"}");
    free(out);
    /* refused: a line that has one, not an object, a bad batch id */
    assert_int_equal(rq_job_add_batch(out = "{\"batch_id\":\"x\"}", 16, "b", &out, &n), -1);
    assert_null(out);
    assert_int_equal(rq_job_add_batch("[1]", 3, "b", &out, &n), -1);
    assert_int_equal(rq_job_add_batch("{}", 2, "a/b", &out, &n), -1);
}

/* The scan and the parse agree on raw[0..len) (the scan may pass: -1); returns the scan's answer. */
static int agree(const char *raw, size_t len)
{
    char a[RQ_ID_MAX + 1], b[RQ_ID_MAX + 1];
    int sc = rq_job_scan(raw, len, a);
    enum rq_idstate ref = rq_job_id_parsed(raw, len, b);
    if (sc >= 0 && (sc != (int)ref || strcmp(a, b))) {
        char hex[1024] = "";
        for (size_t i = 0; i < len && i < 200; i++)
            snprintf(hex + strlen(hex), sizeof hex - strlen(hex),
                     (unsigned char)raw[i] < 0x20 || (unsigned char)raw[i] >= 0x7f ? "<%02x>" : "%c",
                     (unsigned char)raw[i]);
        fail_msg("scan %d '%s', parse %d '%s' for %s", sc, a, (int)ref, b, hex);
    }
    return sc;
}

static void test_scan_agrees_with_parse(void **state)
{
    (void)state;
    fill();
    const char *seeds[] = {
        "{\"id\":\"a\",\"prompt\":\"x\",\"max_tokens\":12,\"temperature\":0.5,\"stop\":[\"\\n\",\"q\"]}",
        " {\"prompt\" : \"tab\\there \\\"q\\\" \\u00e9 \\ud83d\\ude00 \xc3\xa9 \xe2\x82\xac "
        "\xf0\x9f\x98\x80\", \"id\" : null} ",
        "{\"id\":\"x\",\"id\":\"y\",\"n\":[true,false,null,-0,1.25,{\"a\":{}}],\"o\":{\"id\":5}}",
        "{\"custom_id\":\"r\",\"batch_id\":\"b-1\",\"method\":\"POST\",\"url\":\"/v1\",\"body\":{\"x\":[]}}",
        "{\"url\":null,\"custom_id\":\"c\\u0041\"}",
        "{\"\\u0069d\":\"k\"}",
        "{\"id\":\"a\",\"n\":1e5}",
        "{\"id\":\"a\",\"n\":12345678901234567890}",
        "{\"id\":\"\\ud800\"}",
        "{\"id\":\"a\",\"p\":\"\\udc00\"}",
        "{\"id\":\"a\",\"p\":\"\\u0000\"}",
        "{\"id\":\"a\",\"p\":\"\xc0\xaf\"}",
        "{\"id\":\"a\",\"p\":\"\xed\xa0\x80\"}",
        "{\"id\":\"a\",\"p\":\"\xf4\x90\x80\x80\"}",
        "{\"id\":\"a\",\"n\":01}",
        "{\"id\":\"a\",}",
        "{\"id\":\"a\"} x",
        "{\"id\":\"\x7f\"}",
        "{}",
        "[{\"id\":\"a\"}]",
        "{\"id\":\"a\",\"n\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]"
        "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
        longest,
        batch65_line,
        too_long_cid,
    };
    static const char subst[] = {'"', '\\', '{',    '}',    '[',        ']',        ',',        ':',
                                 ' ', '0',  '1',    '-',    '.',        'e',        'u',        'n',
                                 'a', '\n', '\x01', '\x7f', (char)0x80, (char)0xc3, (char)0xed, 0};
    char buf[2048];
    int decided = 0, total = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        size_t n = strlen(seeds[i]);
        assert_true(n + 1 < sizeof buf);
        decided += agree(seeds[i], n) >= 0;
        total++;
        for (size_t at = 0; at < n; at++) {
            for (size_t k = 0; k < sizeof subst; k++) { /* one byte replaced */
                memcpy(buf, seeds[i], n);
                buf[at] = subst[k];
                decided += agree(buf, n) >= 0;
                total++;
            }
            memcpy(buf, seeds[i], at); /* one byte left out */
            memcpy(buf + at, seeds[i] + at + 1, n - at - 1);
            decided += agree(buf, n - 1) >= 0;
            memcpy(buf, seeds[i], at); /* one byte added */
            buf[at] = '"';
            memcpy(buf + at + 1, seeds[i] + at, n - at);
            decided += agree(buf, n + 1) >= 0;
            total += 2;
        }
    }
    printf("the scan decided %d of %d texts\n", decided, total);
    /* it decides ordinary jobs itself (else rq_job_id is as slow as a full parse) */
    char id[RQ_ID_MAX + 1];
    assert_int_equal(rq_job_scan(seeds[1], strlen(seeds[1]), id), RQ_ID_MISSING);
    assert_int_equal(rq_job_scan(seeds[0], strlen(seeds[0]), id), RQ_ID_FOUND);
    assert_int_equal(rq_job_scan(seeds[3], strlen(seeds[3]), id), RQ_ID_FOUND);
    assert_string_equal(id, "b-1/r");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_c_lua_parser_agree),
        cmocka_unit_test(test_id_bytes_agree),
        cmocka_unit_test(test_add_batch),
        cmocka_unit_test(test_scan_agrees_with_parse),
    };
    return cmocka_run_group_tests(tests, rq_test_group_setup, rq_test_group_teardown);
}
