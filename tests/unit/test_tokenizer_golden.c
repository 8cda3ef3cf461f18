/* engine/tokenizer against Hugging Face tokenizers itself: every line of
 * tests/fixtures/tokenizer/qwen3_encode.jsonl ({"text", "ids", "decoded", "decoded_skip_special"},
 * made by make_fixtures.py from the corpus in corpus.jsonl) must match exactly: the ids, both
 * decodings, and both decodings again through the streaming decoder, id by id.
 * A missing or stale fixture is a failure, not a skip; only a missing tokenizer asset skips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "testutil.h"

#define GOLDEN "tests/fixtures/tokenizer/qwen3_encode.jsonl"
#define CORPUS "tests/fixtures/tokenizer/corpus.jsonl"

static int mismatches;

static void report(long line, const char *what, const char *text)
{
    if (++mismatches <= 20)
        print_error(GOLDEN ":%ld: %s differs (text: \"%.60s\")\n", line, what, text);
}

static bool same_str(const json_t *want, const char *got, size_t len)
{
    return json_is_string(want) && json_string_length(want) == len &&
           !memcmp(json_string_value(want), got, len);
}

static char *stream_decode(const struct tok *tok, const int32_t *ids, size_t n, bool skip, size_t *len)
{
    struct tok_stream *st = tok_stream_new(tok, skip);
    size_t cap = 64, k = 0, l;
    char *all = malloc(cap), err[128];
    const char *out;
    assert_non_null(st);
    for (size_t i = 0; i <= n; i++) {
        if (i < n)
            assert_int_equal(tok_stream_push(st, ids[i], &out, &l, err, sizeof err), 0);
        else
            tok_stream_flush(st, &out, &l);
        while (k + l + 1 > cap)
            all = realloc(all, cap *= 2);
        memcpy(all + k, out, l);
        k += l;
    }
    tok_stream_free(st);
    *len = k;
    return all;
}

static void check_line(const struct tok *tok, long lineno, const json_t *row)
{
    const json_t *text = json_object_get(row, "text"), *want_ids = json_object_get(row, "ids");
    if (!json_is_string(text) || !json_is_array(want_ids)) {
        print_error(GOLDEN ":%ld: not a {\"text\", \"ids\", ...} line\n", lineno);
        fail();
    }
    const char *s = json_string_value(text);
    int32_t *ids, *ids2;
    size_t n, n2;
    char err[256];
    if (tok_encode_ex(tok, s, json_string_length(text), false, &ids, &n, err, sizeof err) != 0) {
        print_error(GOLDEN ":%ld: encode failed: %s\n", lineno, err);
        fail();
    }
    bool ok = n == json_array_size(want_ids);
    for (size_t i = 0; ok && i < n; i++)
        ok = json_integer_value(json_array_get(want_ids, i)) == ids[i];
    if (!ok)
        report(lineno, "ids", s);
    /* with the post-processor's special tokens: Qwen3's adds none, as the fixture script checked */
    assert_int_equal(tok_encode(tok, s, json_string_length(text), &ids2, &n2, err, sizeof err), 0);
    if (n2 != n || memcmp(ids, ids2, n * sizeof *ids))
        report(lineno, "ids with add_special", s);
    free(ids2);

    /* decode the reference ids, not ours, so a decoding bug shows even where encoding differs */
    size_t nw = json_array_size(want_ids);
    int32_t *w = malloc((nw + 1) * sizeof *w);
    for (size_t i = 0; i < nw; i++)
        w[i] = (int32_t)json_integer_value(json_array_get(want_ids, i));
    for (int skip = 0; skip < 2; skip++) {
        const json_t *want = json_object_get(row, skip ? "decoded_skip_special" : "decoded");
        char *d;
        size_t len;
        if (tok_decode(tok, w, nw, skip, &d, &len, err, sizeof err) != 0) {
            print_error(GOLDEN ":%ld: decode failed: %s\n", lineno, err);
            fail();
        }
        if (!same_str(want, d, len))
            report(lineno, skip ? "decoded_skip_special" : "decoded", s);
        free(d);
        d = stream_decode(tok, w, nw, skip, &len);
        if (!same_str(want, d, len))
            report(lineno, skip ? "stream decoded_skip_special" : "stream decoded", s);
        free(d);
    }
    free(w);
    free(ids);
}

static json_t **read_jsonl(const char *rel, size_t *n)
{
    FILE *f = fopen(test_source(rel), "r");
    if (!f)
        return NULL;
    json_t **rows = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    *n = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        rows = realloc(rows, (*n + 1) * sizeof *rows);
        rows[*n] = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, &je);
        if (!rows[*n]) {
            print_error("%s:%zu: %s\n", rel, *n + 1, je.text);
            fail();
        }
        (*n)++;
    }
    free(line);
    fclose(f);
    return rows;
}

static void test_golden(void **state)
{
    char jp[4096], err[512];
    snprintf(jp, sizeof jp, "%s", test_asset("qwen3-tokenizer/tokenizer.json"));
    struct tok *tok = tok_load(jp, test_asset("qwen3-tokenizer/tokenizer_config.json"), err, sizeof err);
    if (!tok) {
        print_error("tok_load: %s\n", err);
        fail();
    }
    size_t n, nc;
    json_t **rows = read_jsonl(GOLDEN, &n), **corpus = read_jsonl(CORPUS, &nc);
    if (!rows) {
        print_error(
            "%s is missing: generate it with tests/fixtures/tokenizer/make_fixtures.py on a machine with "
            "Hugging Face tokenizers (see tests/fixtures/tokenizer/README.md)\n",
            GOLDEN);
        fail();
    }
    /* the fixture must be of the current corpus, line for line */
    if (!corpus || nc != n) {
        print_error("%s has %zu lines but %s has %zu: regenerate the fixture\n", GOLDEN, n, CORPUS,
                    corpus ? nc : 0);
        fail();
    }
    for (size_t i = 0; i < n; i++)
        if (!json_equal(json_object_get(rows[i], "text"), json_object_get(corpus[i], "text"))) {
            print_error("%s:%zu: the text is not line %zu of %s: regenerate the fixture\n", GOLDEN, i + 1,
                        i + 1, CORPUS);
            fail();
        }
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++)
        check_line(tok, (long)i + 1, rows[i]);
    if (mismatches)
        print_error("%d mismatches in %zu lines\n", mismatches, n);
    else
        printf("# all %zu lines match Hugging Face tokenizers\n", n);
    for (size_t i = 0; i < n; i++)
        json_decref(rows[i]);
    for (size_t i = 0; i < nc; i++)
        json_decref(corpus[i]);
    free(rows);
    free(corpus);
    tok_free(tok);
    assert_int_equal(mismatches, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
