/* engine/tokenizer with the real Qwen3 tokenizer (fetched by tests/assets/fetch.sh): its tables
 * against the file itself, and properties that must hold for any text: decoding an encoding gives
 * the NFC form of the text back (utf8proc is the reference), added tokens split the text around
 * them, streaming equals whole decoding, several threads get what one thread gets, and long
 * runs that make regexes backtrack still work. The exact ids are checked against Hugging Face in
 * test_tokenizer_golden.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "engine/tokenizer.h"
#include "engine/util/mono.h"
#include "testutil.h"

static char json_path[4096], config_path[4096];
static struct tok *tok;

/* The committed corpus (tests/fixtures/tokenizer/corpus.jsonl) plus random strings. */
static char **texts;
static size_t *text_lens, n_texts;

static void add_text(const char *s, size_t len)
{
    texts = realloc(texts, (n_texts + 1) * sizeof *texts);
    text_lens = realloc(text_lens, (n_texts + 1) * sizeof *text_lens);
    texts[n_texts] = malloc(len + 1);
    memcpy(texts[n_texts], s, len);
    texts[n_texts][len] = 0;
    text_lens[n_texts++] = len;
}

static int setup(void **state)
{
    snprintf(json_path, sizeof json_path, "%s", test_asset("qwen3-tokenizer/tokenizer.json"));
    snprintf(config_path, sizeof config_path, "%s", test_asset("qwen3-tokenizer/tokenizer_config.json"));
    char err[512];
    double t0 = llmq_mono_s();
    tok = tok_load(json_path, config_path, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "tok_load: %s\n", err);
        return -1;
    }
    printf("# loaded the Qwen3 tokenizer in %.3f s\n", llmq_mono_s() - t0);

    FILE *f = fopen(test_source("tests/fixtures/tokenizer/corpus.jsonl"), "r");
    if (!f) {
        fprintf(stderr, "tests/fixtures/tokenizer/corpus.jsonl is missing\n");
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &je);
        const json_t *t = json_object_get(j, "text");
        if (json_is_string(t))
            add_text(json_string_value(t), json_string_length(t));
        json_decref(j);
    }
    free(line);
    fclose(f);
    /* random code points from every plane (no surrogates), biased to interesting ranges */
    srand(1234);
    for (int i = 0; i < 600; i++) {
        char s[400];
        size_t len = 0;
        int k = 1 + rand() % 40;
        for (int c = 0; c < k; c++) {
            uint32_t cp;
            switch (rand() % 6) {
            case 0:
                cp = 0x20 + (uint32_t)rand() % 0x5F;
                break;
            case 1:
                cp = (uint32_t)rand() % 0x80;
                break;
            case 2:
                cp = 0x300 + (uint32_t)rand() % 0x70;
                break; /* combining marks */
            case 3:
                cp = 0x1100 + (uint32_t)rand() % 0x200;
                break; /* Hangul jamo */
            case 4:
                cp = (uint32_t)rand() % 0xD800;
                break;
            default:
                cp = 0xE000 + (uint32_t)rand() % (0x110000 - 0xE000);
                break;
            }
            len += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)s + len);
        }
        add_text(s, len);
    }
    return 0;
}

static int teardown(void **state)
{
    tok_free(tok);
    for (size_t i = 0; i < n_texts; i++)
        free(texts[i]);
    free(texts);
    free(text_lens);
    return 0;
}

static int32_t *encode(const char *s, size_t len, size_t *n)
{
    int32_t *ids;
    char err[256];
    if (tok_encode(tok, s, len, &ids, n, err, sizeof err) != 0) {
        print_error("encode: %s\n", err);
        fail();
    }
    return ids;
}

static char *decode(const int32_t *ids, size_t n, bool skip, size_t *len)
{
    char *s, err[256];
    if (tok_decode(tok, ids, n, skip, &s, len, err, sizeof err) != 0) {
        print_error("decode: %s\n", err);
        fail();
    }
    return s;
}

/* ---- the tables are the file's */

static void test_vocab_matches_file(void **state)
{
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je), *cfg = json_load_file(config_path, 0, &je);
    assert_non_null(root);
    assert_non_null(cfg);
    const char *key;
    json_t *v;
    int32_t max_id = -1;
    json_object_foreach(json_object_get(json_object_get(root, "model"), "vocab"), key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        assert_int_equal(tok_token_to_id(tok, key), id);
        assert_string_equal(tok_id_to_token(tok, id), key);
        assert_false(tok_is_special(tok, id));
        max_id = id > max_id ? id : max_id;
    }
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, v)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        assert_int_equal(tok_token_to_id(tok, content), id);
        assert_string_equal(tok_id_to_token(tok, id), content);
        assert_int_equal(tok_is_special(tok, id), json_is_true(json_object_get(v, "special")));
        assert_true(tok_is_added(tok, id));
        max_id = id > max_id ? id : max_id;
    }
    assert_int_equal(tok_vocab_size(tok), max_id + 1);
    assert_int_equal(tok_token_to_id(tok, "no such token"), -1);
    assert_null(tok_id_to_token(tok, max_id + 1));
    /* tokenizer_config.json: eos_token and pad_token are strings, bos_token null */
    assert_int_equal(tok_eos_id(tok),
                     tok_token_to_id(tok, json_string_value(json_object_get(cfg, "eos_token"))));
    assert_int_equal(tok_pad_id(tok),
                     tok_token_to_id(tok, json_string_value(json_object_get(cfg, "pad_token"))));
    assert_true(json_is_null(json_object_get(cfg, "bos_token")));
    assert_int_equal(tok_bos_id(tok), -1);
    assert_int_equal(tok_add_bos(tok), json_is_true(json_object_get(cfg, "add_bos_token")));
    /* the bytes of a byte token: "Ġ" is a space */
    size_t len;
    const char *b = tok_token_bytes(tok, tok_token_to_id(tok, "\xc4\xa0"), &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], ' ');
    json_decref(root);
    json_decref(cfg);
}

/* ---- properties over many texts */

static void test_roundtrip_is_nfc(void **state)
{
    for (size_t i = 0; i < n_texts; i++) {
        if (memchr(texts[i], 0, text_lens[i]))
            continue; /* utf8proc_NFC stops at NUL */
        size_t n, len;
        int32_t *ids = encode(texts[i], text_lens[i], &n);
        char *back = decode(ids, n, false, &len);
        char *want = (char *)utf8proc_NFC((const utf8proc_uint8_t *)texts[i]);
        if (len != strlen(want) || memcmp(back, want, len)) {
            print_error("text %zu does not round-trip: \"%s\" -> \"%s\"\n", i, texts[i], back);
            fail();
        }
        free(want);
        free(back);
        free(ids);
    }
}

static void test_added_tokens_split_text(void **state)
{
    static const char *const around[][2] = {
        {"x", "y"}, {"Hello ", " world"}, {"\n", "\n\n"}, {"", "e\xcc\x81"}};
    for (int32_t id = 0; id < tok_vocab_size(tok); id++) {
        if (!tok_is_added(tok, id))
            continue;
        const char *content = tok_id_to_token(tok, id);
        for (int k = 0; k < 4; k++) {
            char s[256];
            int len = snprintf(s, sizeof s, "%s%s%s", around[k][0], content, around[k][1]);
            size_t n, na, nb;
            int32_t *ids = encode(s, (size_t)len, &n);
            int32_t *a = encode(around[k][0], strlen(around[k][0]), &na);
            int32_t *b = encode(around[k][1], strlen(around[k][1]), &nb);
            assert_int_equal(n, na + 1 + nb);
            assert_memory_equal(ids, a, na * sizeof *ids);
            assert_int_equal(ids[na], id);
            assert_memory_equal(ids + na + 1, b, nb * sizeof *ids);
            free(ids);
            free(a);
            free(b);
        }
    }
    /* skip_special drops special tokens only: <think> is an added token but not special */
    int32_t ids[] = {tok_token_to_id(tok, "<|im_start|>"), tok_token_to_id(tok, "hi"),
                     tok_token_to_id(tok, "<think>"), tok_token_to_id(tok, "<|im_end|>")};
    size_t len;
    char *s = decode(ids, 4, true, &len);
    assert_string_equal(s, "hi<think>");
    free(s);
    s = decode(ids, 4, false, &len);
    assert_string_equal(s, "<|im_start|>hi<think><|im_end|>");
    free(s);
}

static void check_stream(const int32_t *ids, size_t n, bool skip)
{
    size_t wlen, glen = 0, len;
    char *want = decode(ids, n, skip, &wlen), *got = malloc(wlen + 16), err[128];
    const char *out;
    struct tok_stream *st = tok_stream_new(tok, skip);
    assert_non_null(st);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(tok_stream_push(st, ids[i], &out, &len, err, sizeof err), 0);
        assert_true(glen + len <= wlen);
        /* only whole characters come out */
        assert_true(utf8proc_decompose((const utf8proc_uint8_t *)out, (utf8proc_ssize_t)len, NULL, 0, 0) >=
                    0);
        memcpy(got + glen, out, len);
        glen += len;
    }
    tok_stream_flush(st, &out, &len);
    assert_true(glen + len <= wlen);
    memcpy(got + glen, out, len);
    glen += len;
    assert_int_equal(glen, wlen);
    assert_memory_equal(got, want, wlen);
    tok_stream_free(st);
    free(want);
    free(got);
}

static void test_stream_equals_decode(void **state)
{
    for (size_t i = 0; i < n_texts; i++) {
        size_t n;
        int32_t *ids = encode(texts[i], text_lens[i], &n);
        check_stream(ids, n, false);
        check_stream(ids, n, true);
        free(ids);
    }
    /* random ids from the whole vocabulary: partial and broken characters everywhere */
    srand(99);
    for (int iter = 0; iter < 2000; iter++) {
        int32_t ids[64];
        size_t n = (size_t)(rand() % 64);
        for (size_t i = 0; i < n; i++) {
            do
                ids[i] = rand() % tok_vocab_size(tok);
            while (!tok_id_to_token(tok, ids[i]));
        }
        check_stream(ids, n, iter & 1);
    }
}

static void test_invalid_input(void **state)
{
    int32_t *ids;
    size_t n;
    char err[128];
    assert_int_equal(tok_encode(tok, "caf\xc3", 4, &ids, &n, err, sizeof err), -1);
    assert_string_equal(err, "invalid UTF-8 at byte 3");
    int32_t bad[] = {1, tok_vocab_size(tok)};
    char *s;
    assert_int_equal(tok_decode(tok, bad, 2, false, &s, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "ids[1]"));
}

/* Runs of one class of character make the split regex backtrack; they must still work (and
 * not take long: printed, not asserted). */
static void test_long_runs(void **state)
{
    const char *unit[] = {" ", "\n", "a", "7", "!", " \n", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "e\xcc\x81"};
    size_t total = 1 << 20;
    char *s = malloc(total + 8);
    for (int u = 0; u < 9; u++) {
        size_t ul = strlen(unit[u]), len = 0;
        while (len + ul <= total) {
            memcpy(s + len, unit[u], ul);
            len += ul;
        }
        s[len++] = 'x';
        double t0 = llmq_mono_s();
        size_t n, blen;
        int32_t *ids = encode(s, len, &n);
        double t = llmq_mono_s() - t0;
        char *back = decode(ids, n, false, &blen);
        char *want = (char *)utf8proc_NFC((const utf8proc_uint8_t *)(s[len] = 0, s));
        assert_int_equal(blen, strlen(want));
        assert_memory_equal(back, want, blen);
        printf("# %zu bytes of \"%s\": %zu tokens in %.3f s\n", len,
               u == 1   ? "\\n"
               : u == 5 ? " \\n"
                        : unit[u],
               n, t);
        free(want);
        free(back);
        free(ids);
    }
    free(s);
}

/* ---- threads */

struct job {
    int32_t **ids;
    size_t *n;
    int seed;
};

static void *encode_all(void *arg)
{
    struct job *j = arg;
    char err[256];
    for (int rep = 0; rep < 3; rep++)
        for (size_t k = 0; k < n_texts; k++) {
            size_t i = (k * 7919 + (size_t)j->seed * 104729) % n_texts; /* each thread its own order */
            free(j->ids[i]);
            if (tok_encode(tok, texts[i], text_lens[i], &j->ids[i], &j->n[i], err, sizeof err) != 0)
                j->n[i] = (size_t)-1;
        }
    return NULL;
}

static void test_threads(void **state)
{
    enum { T = 4 };
    struct job jobs[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        jobs[t] = (struct job){calloc(n_texts, sizeof(int32_t *)), calloc(n_texts, sizeof(size_t)), t};
        assert_int_equal(pthread_create(&th[t], NULL, encode_all, &jobs[t]), 0);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    for (size_t i = 0; i < n_texts; i++) {
        size_t n;
        int32_t *want = encode(texts[i], text_lens[i], &n);
        for (int t = 0; t < T; t++) {
            assert_int_equal(jobs[t].n[i], n);
            assert_memory_equal(jobs[t].ids[i], want, n * sizeof *want);
        }
        free(want);
    }
    for (int t = 0; t < T; t++) {
        for (size_t i = 0; i < n_texts; i++)
            free(jobs[t].ids[i]);
        free(jobs[t].ids);
        free(jobs[t].n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_matches_file),
        cmocka_unit_test(test_roundtrip_is_nfc),
        cmocka_unit_test(test_added_tokens_split_text),
        cmocka_unit_test(test_stream_equals_decode),
        cmocka_unit_test(test_invalid_input),
        cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_threads),
    };
    test_asset("qwen3-tokenizer/tokenizer.json"); /* skips the whole program when it is missing */
    return cmocka_run_group_tests(tests, setup, teardown);
}
