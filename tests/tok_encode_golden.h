/* A tokenizer against Hugging Face tokenizers' goldens (header-only; include it after <cmocka.h>).
 *
 * tests/fixtures/tokenizer/<name>_encode.jsonl (made by tests/fixtures/chat/make_goldens.py on a
 * machine with Hugging Face tokenizers) has one line per text: the lines of
 * tests/fixtures/tokenizer/corpus.jsonl in order, then the script's EXTRA_TEXTS, each
 *     {"text", "ids", "ids_special", "decoded", "decoded_skip_special"[, "hf_ids_special"]}
 * (Qwen3's older fixture, made by tests/fixtures/tokenizer/make_fixtures.py, has no "ids_special":
 * its post-processor adds nothing, so the ids with special tokens must be "ids" too)
 * tok_encode_golden_check(name) loads <name>-tokenizer/ from the fetched assets (skipping the
 * program with the fetch's reason when it is absent), and checks every line exactly: the ids
 * without and with the post-processor's special tokens, both decodings of the reference ids, and
 * both again through the streaming decoder id by id. A missing or stale fixture fails the test.
 * Returns how many lines carry "hf_ids_special" (where transformers' AutoTokenizer adds other
 * special tokens than tokenizers' post-processor), for the caller to assert on. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "testutil.h"

#define TEG_CORPUS "tests/fixtures/tokenizer/corpus.jsonl"

struct teg_state {
    const char *golden; /* the fixture's path, relative to the source tree */
    int mismatches;
};

static void teg_report(struct teg_state *s, long line, const char *what, const char *text)
{
    if (++s->mismatches <= 20)
        print_error("%s:%ld: %s differs (text: \"%.60s\")\n", s->golden, line, what, text);
}

static bool teg_same_str(const json_t *want, const char *got, size_t len)
{
    return json_is_string(want) && json_string_length(want) == len && !memcmp(json_string_value(want), got, len);
}

static bool teg_same_ids(const json_t *want, const int32_t *ids, size_t n)
{
    if (!json_is_array(want) || json_array_size(want) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != ids[i])
            return false;
    return true;
}

static char *teg_stream_decode(const struct tok *tok, const int32_t *ids, size_t n, bool skip, size_t *len)
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

static void teg_check_line(struct teg_state *s, const struct tok *tok, long lineno, const json_t *row)
{
    const json_t *text = json_object_get(row, "text"), *want_ids = json_object_get(row, "ids");
    const json_t *want_special = json_object_get(row, "ids_special");
    if (!want_special) /* a fixture of a tokenizer whose post-processor adds nothing (Qwen3's) */
        want_special = want_ids;
    if (!json_is_string(text) || !json_is_array(want_ids) || !json_is_array(want_special)) {
        print_error("%s:%ld: not a {\"text\", \"ids\", \"ids_special\", ...} line\n", s->golden, lineno);
        fail();
    }
    const char *str = json_string_value(text);
    size_t slen = json_string_length(text);
    char err[256];
    for (int special = 0; special < 2; special++) {
        int32_t *ids;
        size_t n;
        if (tok_encode_ex(tok, str, slen, special, &ids, &n, err, sizeof err) != 0) {
            print_error("%s:%ld: encode failed: %s\n", s->golden, lineno, err);
            fail();
        }
        if (!teg_same_ids(special ? want_special : want_ids, ids, n))
            teg_report(s, lineno, special ? "ids_special" : "ids", str);
        free(ids);
    }
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
            print_error("%s:%ld: decode failed: %s\n", s->golden, lineno, err);
            fail();
        }
        if (!teg_same_str(want, d, len))
            teg_report(s, lineno, skip ? "decoded_skip_special" : "decoded", str);
        free(d);
        d = teg_stream_decode(tok, w, nw, skip, &len);
        if (!teg_same_str(want, d, len))
            teg_report(s, lineno, skip ? "stream decoded_skip_special" : "stream decoded", str);
        free(d);
    }
    free(w);
}

static json_t **teg_read_jsonl(const char *rel, size_t *n)
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

static size_t tok_encode_golden_check(const char *name)
{
    char golden[256], asset[256], jp[4096], cp[4096], err[512];
    snprintf(golden, sizeof golden, "tests/fixtures/tokenizer/%s_encode.jsonl", name);
    struct teg_state s = {golden, 0};
    snprintf(asset, sizeof asset, "%s-tokenizer/tokenizer.json", name);
    snprintf(jp, sizeof jp, "%s", test_asset(asset));
    snprintf(asset, sizeof asset, "%s-tokenizer/tokenizer_config.json", name);
    snprintf(cp, sizeof cp, "%s", test_asset(asset));
    struct tok *tok = tok_load(jp, cp, err, sizeof err);
    if (!tok) {
        print_error("tok_load: %s\n", err);
        fail();
    }
    size_t n, nc;
    json_t **rows = teg_read_jsonl(golden, &n), **corpus = teg_read_jsonl(TEG_CORPUS, &nc);
    if (!rows) {
        print_error("%s is missing: generate it on a machine with Hugging Face tokenizers, as "
                    "tests/fixtures/tokenizer/README.md says\n",
                    golden);
        fail();
    }
    /* the fixture must start with the current corpus, line for line */
    if (!corpus || n < nc) {
        print_error("%s has %zu lines, fewer than the %zu of %s: regenerate the fixture\n", golden, n,
                    corpus ? nc : 0, TEG_CORPUS);
        fail();
    }
    for (size_t i = 0; i < nc; i++)
        if (!json_equal(json_object_get(rows[i], "text"), json_object_get(corpus[i], "text"))) {
            print_error("%s:%zu: the text is not line %zu of %s: regenerate the fixture\n", golden, i + 1, i + 1,
                        TEG_CORPUS);
            fail();
        }
    size_t hf_differs = 0;
    for (size_t i = 0; i < n; i++) {
        teg_check_line(&s, tok, (long)i + 1, rows[i]);
        hf_differs += json_object_get(rows[i], "hf_ids_special") != NULL;
    }
    if (s.mismatches)
        print_error("%d mismatches in %zu lines\n", s.mismatches, n);
    else
        printf("# all %zu lines of %s match Hugging Face tokenizers\n", n, golden);
    for (size_t i = 0; i < n; i++)
        json_decref(rows[i]);
    for (size_t i = 0; i < nc; i++)
        json_decref(corpus[i]);
    free(rows);
    free(corpus);
    tok_free(tok);
    assert_int_equal(s.mismatches, 0);
    return hf_differs;
}
