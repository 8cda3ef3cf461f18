/* engine/tokenizer on tiny hand-written tokenizer.json files: results small enough to work out by
 * hand from Hugging Face tokenizers' rules, plus the UTF-8 helpers against the Unicode standard's
 * own examples, the pre-tokenizer against HF's own split tests, and every load error path.
 * (The real Qwen3 tokenizer is tested in test_tokenizer_qwen3.c and test_tokenizer_golden.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "engine/tok_bpe.h"
#include "engine/tok_normalize.h"
#include "engine/tok_pretok.h"
#include "engine/tok_utf8.h"
#include "engine/tokenizer.h"
#include "testutil.h"

/* ---- building tiny tokenizers */

/* The byte-level character of byte b, as UTF-8 (what a vocabulary key holds). */
static const char *bl(unsigned char b)
{
    static char s[8][4];
    static int k;
    char *o = s[k++ & 7];
    uint32_t cp = tok_bytelevel_char(b);
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
    } else {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        o[2] = 0;
    }
    return o;
}

/* The base tokenizer: every byte b is token b; then "ab" 256, "bc" 257, "abc" 258, "Ġa" 259,
 * "Ġab" 260, "aa" 261, "z" x 100 262 with merges (rank order) "b c", "a b", "a bc", "Ġ a", "Ġa b", "a a";
 * pre-tokenizer ByteLevel with the GPT-2 regex, decoder ByteLevel, no added tokens. */
static json_t *base_json(void)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++)
        json_object_set_new(vocab, bl((unsigned char)b), json_integer(b));
    const char *extra[] = {"ab",
                           "bc",
                           "abc",
                           "\xc4\xa0"
                           "a",
                           "\xc4\xa0"
                           "ab",
                           "aa"};
    for (int i = 0; i < 6; i++)
        json_object_set_new(vocab, extra[i], json_integer(256 + i));
    char longtok[101]; /* a vocabulary entry longer than the stream decoder's first buffer */
    memset(longtok, 'z', 100);
    longtok[100] = 0;
    json_object_set_new(vocab, longtok, json_integer(262));
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:[], s:n, s:{s:s, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b}, "
        "s:{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:[s,s,s,s,s,s]}}",
        "version", "1.0", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "type",
        "ByteLevel", "add_prefix_space", 0, "use_regex", 1, "post_processor", "decoder", "type", "ByteLevel",
        "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE", "dropout",
        "unk_token", "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
        "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", "b c", "a b", "a bc", "\xc4\xa0 a",
        "\xc4\xa0"
        "a b",
        "a a");
    assert_non_null(root);
    return root;
}

static void add_token(json_t *root, int id, const char *content, int special, int normalized, int single_word,
                      int lstrip, int rstrip)
{
    json_array_append_new(json_object_get(root, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                                    "single_word", single_word, "lstrip", lstrip, "rstrip", rstrip,
                                    "normalized", normalized, "special", special));
}

/* Writes j (stolen) to a temporary file; returns its path (static buffer per slot). */
static const char *write_tmp(json_t *j, int slot)
{
    static char path[2][64];
    snprintf(path[slot], sizeof path[slot], "/tmp/llmq_test_tok_%d_%d.json", (int)getpid(), slot);
    assert_int_equal(json_dump_file(j, path[slot], 0), 0);
    json_decref(j);
    return path[slot];
}

static const char *write_text(const char *text, int slot)
{
    static char path[2][64];
    snprintf(path[slot], sizeof path[slot], "/tmp/llmq_test_tok_%d_%d.json", (int)getpid(), slot);
    FILE *f = fopen(path[slot], "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path[slot];
}

static struct tok *load_json_obj(json_t *j)
{
    char err[512] = "";
    const char *p = write_tmp(j, 0);
    struct tok *t = tok_load(p, NULL, err, sizeof err);
    if (!t) {
        print_error("tok_load: %s\n", err);
        fail();
    }
    unlink(p);
    return t;
}

/* Encodes s (len: strlen) and compares with the expected ids (terminated by -1). */
static void expect_ids(const struct tok *t, const char *s, size_t len, const int32_t *want)
{
    int32_t *ids;
    size_t n, nw = 0;
    char err[256];
    while (want[nw] >= 0)
        nw++;
    if (tok_encode(t, s, len, &ids, &n, err, sizeof err) != 0) {
        print_error("encode \"%s\": %s\n", s, err);
        fail();
    }
    bool same = n == nw && !memcmp(ids, want, n * sizeof *ids);
    if (!same) {
        print_error("encode \"%s\": got", s);
        for (size_t i = 0; i < n; i++)
            print_error(" %d", ids[i]);
        print_error(", want");
        for (size_t i = 0; i < nw; i++)
            print_error(" %d", want[i]);
        print_error("\n");
    }
    free(ids);
    assert_true(same);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})
#define EXPECT(t, s, ...) expect_ids(t, s, strlen(s), IDS(__VA_ARGS__))

static char *decode(const struct tok *t, const int32_t *ids, size_t n, bool skip)
{
    char *s, err[256];
    size_t len;
    if (tok_decode(t, ids, n, skip, &s, &len, err, sizeof err) != 0) {
        print_error("decode: %s\n", err);
        fail();
    }
    assert_int_equal(strlen(s), len);
    return s;
}

/* ---- UTF-8 */

static void test_utf8_valid(void **state)
{
    struct {
        const char *s;
        size_t valid;
    } cases[] = {
        {"plain ascii", 11},
        {"caf\xc3\xa9", 5},
        {"\xf0\x9f\x98\x80!", 5},
        {"ab\xc0\x80", 2},
        /* overlong NUL */ {"\xed\xa0\x80", 0}, /* surrogate */
        {"x\xf4\x90\x80\x80", 1},
        /* above U+10FFFF */ {"\xe2\x82", 0}, /* truncated */
        {"\xe2\x82\xac", 3},
        {"12345678\xff", 8},
        {"\x80", 0},
        {"\xef\xbf\xbf", 3},
        /* U+FFFF is valid */ {"\xf4\x8f\xbf\xbf", 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(tok_utf8_valid_prefix(cases[i].s, strlen(cases[i].s)), cases[i].valid);
}

/* Lossy decoding replaces each maximal ill-formed subpart with one U+FFFD. The first case is
 * Table 3-8 of the Unicode Standard (ch. 3.9); the expected strings of all of them are what Python's
 * bytes.decode("utf-8", "replace") gives (the same practice as Rust's from_utf8_lossy). */
static void test_utf8_lossy(void **state)
{
#define R "\xef\xbf\xbd"
    struct {
        const char *in, *out;
    } cases[] = {
        {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", "a" R R R "b" R "c" R R "d"},
        {"\xE2\x82", R},
        {"\xC0\x80", R R},
        {"\xED\xA0\x80", R R R},
        {"\xF4\x90\x80\x80", R R R R},
        {"\xF0\x9F", R},
        {"\xF0\x9F\x98", R},
        {"\xE0\x80\x9F", R R R},
        {"\xF0\x80\x80\x80", R R R R},
        {"\xFF", R},
        {"\xE2\x82\x61", R "a"},
        {"ok \xe2\x82\xac", "ok \xe2\x82\xac"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[64];
        size_t used, n = tok_utf8_lossy(cases[i].in, strlen(cases[i].in), true, out, &used);
        assert_int_equal(used, strlen(cases[i].in));
        out[n] = 0;
        assert_string_equal(out, cases[i].out);
    }
    /* not final: a well-formed but unfinished tail is held back, nothing else */
    char out[64];
    size_t used, n = tok_utf8_lossy("a\xF0\x9F\x98", 4, false, out, &used);
    assert_int_equal(n, 1);
    assert_int_equal(used, 1);
    n = tok_utf8_lossy("a\xF0\x41", 3, false, out, &used); /* F0 41 can never complete */
    assert_int_equal(used, 3);
    out[n] = 0;
    assert_string_equal(out, "a" R "A");
#undef R
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 map in order to
 * U+0100...; the familiar ones are space 'Ġ' (U+0120), newline 'Ċ' (U+010A), tab 'ĉ' (U+0109). */
static void test_bytelevel_table(void **state)
{
    assert_int_equal(tok_bytelevel_char(' '), 0x120);
    assert_int_equal(tok_bytelevel_char('\n'), 0x10A);
    assert_int_equal(tok_bytelevel_char('\t'), 0x109);
    assert_int_equal(tok_bytelevel_char(0), 0x100);
    assert_int_equal(tok_bytelevel_char(0x7F), 0x121); /* after the 33 bytes 0x00..0x20 */
    assert_int_equal(tok_bytelevel_char(0xAD), 0x143); /* the last one: soft hyphen */
    assert_int_equal(tok_bytelevel_char('A'), 'A');
    assert_int_equal(tok_bytelevel_char(0xE9), 0xE9);
    bool seen[512] = {false};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_bytelevel_char((unsigned char)b);
        assert_true(cp < 512);
        assert_false(seen[cp]);
        seen[cp] = true;
        assert_int_equal(tok_bytelevel_byte(cp), b);
    }
    assert_int_equal(tok_bytelevel_byte(' '), -1);
    assert_int_equal(tok_bytelevel_byte(0x144), -1);
    unsigned char raw[8];
    assert_int_equal(tok_bytelevel_decode("\xc4\xa0hi\xc4\x8a", 6, raw), 4);
    assert_memory_equal(raw, " hi\n", 4);
    assert_int_equal(tok_bytelevel_decode("a b", 3, raw), -1);
}

/* ---- BPE */

static void test_merge_order(void **state)
{
    struct tok *t = load_json_obj(base_json());
    EXPECT(t, "abc", 258);             /* "b c" (rank 0) first, then "a bc" */
    EXPECT(t, " ab", 32, 256);         /* "a b" (rank 1) beats "Ġ a" (rank 3); "Ġ ab" is no merge */
    EXPECT(t, "ab abc", 256, 32, 258); /* pieces "ab" and " abc" never merge across */
    EXPECT(t, "aaa", 261, 97);         /* equal ranks: leftmost first */
    EXPECT(t, "aaaa", 261, 261);
    EXPECT(t, "cab", 99, 256);
    EXPECT(t, "x", 120);
    tok_free(t);

    /* the same vocabulary with the first two merges swapped: "a b" now wins */
    json_t *j = base_json();
    json_t *m = json_object_get(json_object_get(j, "model"), "merges");
    json_array_set_new(m, 0, json_string("a b"));
    json_array_set_new(m, 1, json_string("b c"));
    t = load_json_obj(j);
    EXPECT(t, "abc", 256, 99);
    tok_free(t);
}

static void test_merges_as_pairs(void **state)
{
    json_t *j = base_json();
    json_t *m = json_array();
    const char *pairs[][2] = {{"b", "c"},
                              {"a", "b"},
                              {"a", "bc"},
                              {"\xc4\xa0", "a"},
                              {"\xc4\xa0"
                               "a",
                               "b"},
                              {"a", "a"}};
    for (int i = 0; i < 6; i++)
        json_array_append_new(m, json_pack("[s,s]", pairs[i][0], pairs[i][1]));
    json_object_set_new(json_object_get(j, "model"), "merges", m);
    struct tok *t = load_json_obj(j);
    EXPECT(t, "abc", 258);
    EXPECT(t, " ab", 32, 256);
    tok_free(t);
}

static void test_ignore_merges(void **state)
{
    /* with ignore_merges a pre-token that is a vocabulary entry is taken whole: " ab" is "Ġab" */
    json_t *j = base_json();
    json_object_set_new(json_object_get(j, "model"), "ignore_merges", json_true());
    struct tok *t = load_json_obj(j);
    EXPECT(t, " ab", 260);
    EXPECT(t, " abc", 32, 258);
    tok_free(t);
}

static void test_unknown_bytes(void **state)
{
    /* without "d" in the vocabulary: dropped without an unk token (as HF does), else unk, fused or not */
    json_t *j = base_json();
    json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
    json_object_del(vocab, "d");
    json_object_set_new(vocab, "<unk>", json_integer(300));
    struct tok *t = load_json_obj(json_deep_copy(j));
    EXPECT(t, "add", 97);
    tok_free(t);
    json_object_set_new(json_object_get(j, "model"), "unk_token", json_string("<unk>"));
    t = load_json_obj(json_deep_copy(j));
    EXPECT(t, "add", 97, 300, 300);
    tok_free(t);
    json_object_set_new(json_object_get(j, "model"), "fuse_unk", json_true());
    t = load_json_obj(j);
    EXPECT(t, "addad", 97, 300, 97, 300);
    tok_free(t);
}

/* ---- added tokens */

static json_t *with_added(void)
{
    json_t *j = base_json();
    add_token(j, 400, "<s>", 1, 0, 0, 0, 0);
    add_token(j, 401, "<s>x", 0, 0, 0, 0, 0);
    add_token(j, 402, "hi", 0, 0, 1, 0, 0);
    add_token(j, 403, "<l>", 1, 0, 0, 1, 0);
    add_token(j, 404, "<r>", 1, 0, 0, 0, 1);
    add_token(j, 405, "e\xcc\x81", 0, 1, 0, 0, 0); /* e + COMBINING ACUTE, normalized: true */
    return j;
}

static void test_added_tokens(void **state)
{
    struct tok *t = load_json_obj(with_added());
    EXPECT(t, "a<s>b", 97, 400, 98);
    EXPECT(t, "<s>", 400);
    EXPECT(t, "<s><s>", 400, 400);
    EXPECT(t, "<s>xy", 401, 121); /* the longest token at the leftmost position */
    EXPECT(t, "<s", 60, 115);
    EXPECT(t, "hi there", 402, 32, 116, 104, 101, 114, 101);
    EXPECT(t, "this", 116, 104, 105, 115); /* single_word: "hi" inside a word is no match */
    EXPECT(t, "hit", 104, 105, 116);
    EXPECT(t, "hi!", 402, 33);
    EXPECT(t, "a  <l>b", 97, 403, 98); /* lstrip takes the spaces before */
    EXPECT(t, "<s>  <l>", 400, 403);
    EXPECT(t, "<r>  b", 404, 98); /* rstrip the spaces after */
    EXPECT(t, "a <r>\n\tb", 97, 32, 404, 98);
    /* no normalizer: the normalized token matches its content as is */
    EXPECT(t, "cafe\xcc\x81", 99, 97, 102, 405);
    EXPECT(t, "caf\xc3\xa9", 99, 97, 102, 195, 169);
    assert_true(tok_is_special(t, 400));
    assert_false(tok_is_special(t, 401));
    assert_true(tok_is_added(t, 401));
    assert_false(tok_is_added(t, 97));
    assert_int_equal(tok_token_to_id(t, "<s>x"), 401);
    assert_string_equal(tok_id_to_token(t, 403), "<l>");
    assert_int_equal(tok_vocab_size(t), 406);
    assert_null(tok_id_to_token(t, 350)); /* a gap */
    assert_null(tok_id_to_token(t, 406));
    assert_null(tok_id_to_token(t, -1));

    char *s = decode(t, IDS(97, 400, 98, 401), 4, false);
    assert_string_equal(s, "a<s>b<s>x");
    free(s);
    s = decode(t, IDS(97, 400, 98, 401), 4, true);
    assert_string_equal(s, "ab<s>x");
    free(s);
    tok_free(t);
}

static void test_normalized_added_token(void **state)
{
    /* with NFC the token is matched, and decoded, in its normalized form "é" (U+00E9) */
    json_t *j = with_added();
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    struct tok *t = load_json_obj(j);
    EXPECT(t, "caf\xc3\xa9", 99, 97, 102, 405);
    EXPECT(t, "cafe\xcc\x81", 99, 97, 102, 405);
    /* HF decodes an added token through its normalized form, and the ByteLevel decoder reads
     * U+00E9 as the byte-level character of byte 0xE9, which alone is no UTF-8: U+FFFD */
    char *s = decode(t, IDS(405), 1, false);
    assert_string_equal(s, "\xef\xbf\xbd");
    free(s);
    tok_free(t);
}

static void test_normalizer_nfc(void **state)
{
    /* decomposed input is composed before BPE: "e" U+0301 -> U+00E9 -> bytes C3 A9 */
    json_t *j = base_json();
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s, s:[{s:s}]}", "type", "Sequence", "normalizers", "type", "NFC"));
    struct tok *t = load_json_obj(j);
    EXPECT(t, "e\xcc\x81", 195, 169);
    EXPECT(t, "\xe2\x84\xab", 195, 133); /* ANGSTROM SIGN -> Å (a singleton) */
    tok_free(t);
}

/* The piecewise NFC shortcut must agree with utf8proc's NFC of the whole string. */
static void test_nfc_pieces(void **state)
{
    static const uint32_t pool[] = {'a',    'e',    ' ',    'Z',    0xE9,   0x300,  0x301,  0x323,  0x302,
                                    0x1100, 0x1161, 0x11A8, 0xAC00, 0x212B, 0x2126, 0x0958, 0x2ADC, 0xF900,
                                    0x1E0A, 0x0344, 0x0F73, 0x3099, 0x304B, 0x0627, 0x0653, 0x2FF,  0x1F600};
    struct tok_normalizer n = {.n = 1, .steps = {UTF8PROC_STABLE | UTF8PROC_COMPOSE}};
    srand(42);
    for (int iter = 0; iter < 3000; iter++) {
        char s[256];
        size_t len = 0;
        int k = 1 + rand() % 12;
        for (int i = 0; i < k; i++)
            len += (size_t)utf8proc_encode_char((utf8proc_int32_t)pool[rand() % (sizeof pool / sizeof *pool)],
                                                (utf8proc_uint8_t *)s + len);
        s[len] = 0;
        const char *out;
        size_t olen;
        char *owned;
        assert_int_equal(tok_normalize(&n, s, len, &out, &olen, &owned), 0);
        char *want = (char *)utf8proc_NFC((const utf8proc_uint8_t *)s);
        assert_int_equal(olen, strlen(want));
        assert_memory_equal(out, want, olen);
        free(want);
        free(owned);
    }
}

/* ---- encoding edge cases */

static void test_empty_and_invalid(void **state)
{
    struct tok *t = load_json_obj(base_json());
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode(t, "", 0, &ids, &n, err, sizeof err), 0);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    const char *bad[] = {"ab\xff", "ab\xc0\x80", "ab\xed\xa0\x80", "ab\xe2\x82"};
    for (int i = 0; i < 4; i++) {
        ids = (int32_t *)&n;
        assert_int_equal(tok_encode(t, bad[i], strlen(bad[i]), &ids, &n, err, sizeof err), -1);
        assert_null(ids);
        assert_string_equal(err, "invalid UTF-8 at byte 2");
    }
    /* NUL is an ordinary character */
    expect_ids(t, "a\0b", 3, IDS(97, 0, 98));
    tok_free(t);
}

static void test_decode_lossy_and_stream(void **state)
{
    struct tok *t = load_json_obj(with_added());
    char *s = decode(t, IDS(0xE2, 0x82, 'a'), 3, false);
    assert_string_equal(s, "\xef\xbf\xbd"
                           "a");
    free(s);
    s = decode(t, IDS(0xF0, 0x9F, 0x98, 0x80), 4, false);
    assert_string_equal(s, "\xf0\x9f\x98\x80");
    free(s);
    char err[128];
    size_t len;
    assert_int_equal(tok_decode(t, IDS(97, 999), 2, false, &s, &len, err, sizeof err), -1);
    assert_string_equal(err, "ids[1]: 999 is not a token id (vocabulary size 406)");
    assert_int_equal(tok_decode(t, IDS(350), 1, false, &s, &len, err, sizeof err), -1);

    /* the stream emits a character once its last byte is in */
    struct tok_stream *st = tok_stream_new(t, false);
    const char *out;
    assert_int_equal(tok_stream_push(st, 0xF0, &out, &len, err, sizeof err), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tok_stream_pending(st), 1);
    assert_int_equal(tok_stream_push(st, 0x9F, &out, &len, err, sizeof err), 0);
    assert_int_equal(tok_stream_push(st, 0x98, &out, &len, err, sizeof err), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tok_stream_push(st, 0x80, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "\xf0\x9f\x98\x80");
    assert_int_equal(tok_stream_push(st, 258, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "abc");
    assert_int_equal(tok_stream_push(st, 0xE2, &out, &len, err, sizeof err), 0);
    assert_int_equal(tok_stream_push(st, 999, &out, &len, err, sizeof err), -1); /* refused, state kept */
    assert_int_equal(tok_stream_pending(st), 1);
    tok_stream_flush(st, &out, &len);
    assert_string_equal(out, "\xef\xbf\xbd");
    assert_int_equal(tok_stream_pending(st), 0);
    tok_stream_free(st);
    tok_free(t);
}

/* Pushing ids one at a time gives exactly tok_decode of them all, for random id sequences that
 * split characters, break them, and mix in special tokens. */
static void test_stream_matches_decode(void **state)
{
    struct tok *t = load_json_obj(with_added());
    static const int32_t pool[] = {0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9,
                                   0xED, 0xA0, 0xC0, 0xFF, 'a',  ' ',  256,  258,  400,
                                   401,  403,  405,  0xBF, 0xF4, 0x8F, 262};
    srand(7);
    for (int iter = 0; iter < 2000; iter++) {
        int32_t ids[40];
        int n = rand() % 40;
        for (int i = 0; i < n; i++)
            ids[i] = pool[rand() % (sizeof pool / sizeof *pool)];
        for (int skip = 0; skip < 2; skip++) {
            char *want = decode(t, ids, (size_t)n, skip), got[8192], err[64];
            size_t glen = 0, len;
            const char *out;
            struct tok_stream *st = tok_stream_new(t, skip);
            for (int i = 0; i < n; i++) {
                assert_int_equal(tok_stream_push(st, ids[i], &out, &len, err, sizeof err), 0);
                memcpy(got + glen, out, len);
                glen += len;
            }
            tok_stream_flush(st, &out, &len);
            memcpy(got + glen, out, len);
            glen += len;
            assert_int_equal(glen, strlen(want));
            assert_memory_equal(got, want, glen);
            tok_stream_free(st);
            free(want);
        }
    }
    tok_free(t);
}

/* ---- pre-tokenizer steps */

struct pieces {
    char buf[512];
    size_t len;
};

static int collect(void *ctx, const char *p, size_t n)
{
    struct pieces *c = ctx;
    c->len += (size_t)snprintf(c->buf + c->len, sizeof c->buf - c->len, "[%.*s]", (int)n, p);
    return 0;
}

static void expect_pieces(const char *pretok_json, const char *text, const char *want)
{
    json_error_t je;
    json_t *j = json_loads(pretok_json, 0, &je);
    assert_non_null(j);
    struct tok_pretok p;
    char err[256];
    if (tok_pretok_from_json(&p, j, "t.json", err, sizeof err) != 0) {
        print_error("%s\n", err);
        fail();
    }
    struct tok_pretok_work w = {0};
    struct pieces c = {.len = 0};
    c.buf[0] = 0;
    assert_int_equal(tok_pretok_run(&p, text, strlen(text), &w, collect, &c, err, sizeof err), 0);
    if (strcmp(c.buf, want))
        print_error("pieces of \"%s\": %s, want %s\n", text, c.buf, want);
    assert_string_equal(c.buf, want);
    tok_pretok_work_free(&w);
    tok_pretok_free(&p);
    json_decref(j);
}

#define SPLIT(behavior, invert)                                                                              \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[^"       \
    "\\\\w\\\\s]+\"},"                                                                                       \
    "\"behavior\":\"" behavior "\",\"invert\":" invert "},"                                                  \
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}"

/* The expected pieces are those of HF tokenizers' own tests (pre_tokenizers/split.rs). */
static void test_split_behaviors(void **state)
{
    const char *s = "How are you doing?";
    expect_pieces(SPLIT("Removed", "true"), s, "[How][are][you][doing][?]");
    expect_pieces(SPLIT("Isolated", "true"), s, "[How][ ][are][ ][you][ ][doing][?]");
    expect_pieces(SPLIT("MergedWithPrevious", "true"), s, "[How ][are ][you ][doing][?]");
    expect_pieces(SPLIT("MergedWithNext", "true"), s, "[How][ are][ you][ doing][?]");
    expect_pieces(SPLIT("Contiguous", "true"), s, "[How][ ][are][ ][you][ ][doing?]");
    /* a String pattern is literal */
    expect_pieces(
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\".\"},"
        "\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"ByteLevel\",\"use_regex\":false,"
        "\"add_prefix_space\":false}]}",
        "a.b.c", "[a][b][c]");
    /* ByteLevel alone: GPT-2's regex, and add_prefix_space */
    expect_pieces("{\"type\":\"ByteLevel\",\"add_prefix_space\":false}", "Hello my friend, how's it?",
                  "[Hello][ my][ friend][,][ how]['s][ it][?]");
    expect_pieces("{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", "Hey  you", "[ Hey][ ][ you]");
}

/* Categories follow Unicode 15 as HF's Oniguruma does, even where the linked PCRE2's tables are
 * older: U+1FABF GOOSE and U+1FACE MOOSE (Unicode 15 So) are symbols to \p{S}, in a class and out
 * of one, and U+31350 (CJK Extension H, Unicode 15 Lo) is a letter to \p{L}; \P{S} excludes them. */
static void test_regex_unicode15(void **state)
{
#define ONE(re)                                                                                              \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"" re "\"},"       \
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"         \
    "\"use_regex\":false}]}"
    expect_pieces(ONE(" ?[\\\\p{P}\\\\p{S}]+|\\\\s+|."), "a \xf0\x9f\xaa\xbf\xf0\x9f\xab\x8e!",
                  "[a][ \xf0\x9f\xaa\xbf\xf0\x9f\xab\x8e!]");
    expect_pieces(ONE("\\\\p{S}+|."), "x\xf0\x9f\xaa\xbf\xf0\x9f\xab\x8e", "[x][\xf0\x9f\xaa\xbf\xf0\x9f\xab\x8e]");
    expect_pieces(ONE("\\\\P{S}+|."), "ab\xf0\x9f\xaa\xbf", "[ab][\xf0\x9f\xaa\xbf]");
    expect_pieces(ONE("\\\\p{L}+|."), "a\xf0\xb1\x8d\x90" "b!", "[a\xf0\xb1\x8d\x90" "b][!]");
#undef ONE
}

/* Oniguruma's \s is Unicode White_Space; PCRE2's adds U+180E. The Qwen pattern must keep
 * " U+180E" together (punctuation-like run) and "x" apart, as Oniguruma does. */
static void test_regex_whitespace(void **state)
{
    const char *qwen =
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
        "\"add_prefix_space\":false,\"use_regex\":false}]}";
    expect_pieces(qwen, "a \xe1\xa0\x8ex", "[a][ \xe1\xa0\x8e][x]");
    expect_pieces(qwen, "a \xc2\x85x", "[a][ ][\xc2\x85x]"); /* NEL is White_Space */
    expect_pieces(qwen, "It'S  OK\r\n\n  x 123", "[It]['S][ ][ OK][\r\n\n][ ][ x][ ][1][2][3]");
    /* the rewrite itself: \s and \w in and out of classes, \S and \W outside; an escaped backslash
     * stays as it is */
#define SET                                                                                                  \
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define WORD "\\p{L}\\p{M}\\p{N}\\p{Pc}"
    char *p = tok_pretok_translate_regex("[^\\s\\p{L}]\\S\\\\s[a\\]\\s]\\s\\w+[^\\w]\\W");
    assert_non_null(p);
    assert_string_equal(p, "[^" SET "\\p{L}][^" SET "]\\\\s[a\\]" SET "][" SET "][" WORD "]+[^" WORD
                           "][^" WORD "]");
    free(p);
#undef SET
#undef WORD
}

/* ---- post-processor and config */

static void test_template_and_config(void **state)
{
    /* Llama-3's shape: a BOS before the sequence */
    json_t *j = base_json();
    add_token(j, 400, "<s>", 1, 0, 0, 0, 0);
    add_token(j, 401, "</s>", 1, 0, 0, 0, 0);
    json_error_t je;
    json_t *pp =
        json_loads("{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},{\"type\":"
                   "\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                   "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\","
                   "\"ids\":[400],\"tokens\":[\"<s>\"]}}}]}",
                   0, &je);
    assert_non_null(pp);
    json_object_set_new(j, "post_processor", pp);
    const char *jp = write_tmp(j, 0);
    const char *cp =
        write_text("{\"eos_token\": {\"content\": \"</s>\"}, \"bos_token\": \"<s>\", \"pad_token\": null,"
                   " \"add_bos_token\": true, \"added_tokens_decoder\": {\"401\": {\"content\": \"</s>\","
                   " \"special\": true}, \"402\": {\"content\": \"<extra>\", \"special\": false,"
                   " \"normalized\": false}}}",
                   1);
    char err[256];
    struct tok *t = tok_load(jp, cp, err, sizeof err);
    if (!t)
        print_error("%s\n", err);
    assert_non_null(t);
    EXPECT(t, "ab", 400, 256);
    int32_t *ids;
    size_t n;
    assert_int_equal(tok_encode_ex(t, "ab", 2, false, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 256);
    free(ids);
    EXPECT(t, "", 400);
    EXPECT(t, "x<extra>", 400, 120, 402); /* added by tokenizer_config.json only */
    assert_int_equal(tok_eos_id(t), 401);
    assert_int_equal(tok_bos_id(t), 400);
    assert_int_equal(tok_pad_id(t), -1);
    assert_true(tok_add_bos(t));
    tok_free(t);
    unlink(jp);
    unlink(cp);
}

/* ---- load errors name the file and the JSON path */

struct bad_case {
    const char *what;
    void (*mutate)(json_t *j);
    const char *want;
};

static void m_no_model(json_t *j)
{
    json_object_del(j, "model");
}
static void m_model_type(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "type", json_string("WordPiece"));
}
static void m_model_str(json_t *j)
{
    json_object_set_new(j, "model", json_string("BPE"));
}
static void m_vocab_arr(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "vocab", json_array());
}
static void m_vocab_val(json_t *j)
{
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "ab", json_string("x"));
}
static json_t *merges(json_t *j)
{
    return json_object_get(json_object_get(j, "model"), "merges");
}
static void m_merge_3(json_t *j)
{
    json_array_set_new(merges(j), 2, json_string("a b c"));
}
static void m_merge_num(json_t *j)
{
    json_array_set_new(merges(j), 1, json_integer(5));
}
static void m_merge_unk(json_t *j)
{
    json_array_set_new(merges(j), 1, json_string("a qq"));
}
static void m_merge_res(json_t *j)
{
    json_array_set_new(merges(j), 3, json_string("c a"));
}
static void m_merges_obj(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "merges", json_object());
}
static void m_dropout(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "dropout", json_real(0.1));
}
static void m_fallback(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "byte_fallback", json_true());
}
static void m_unk(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "unk_token", json_string("<nope>"));
}
static void m_prefix(json_t *j)
{
    json_object_set_new(json_object_get(j, "model"), "continuing_subword_prefix", json_string("##"));
}
static void m_norm(json_t *j)
{
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "Lowercase"));
}
static void m_norm_seq(json_t *j)
{
    json_object_set_new(j, "normalizer",
                        json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "Sequence", "normalizers", "type", "NFC",
                                  "type", "Strip"));
}
static void m_no_pretok(json_t *j)
{
    json_object_set_new(j, "pre_tokenizer", json_null());
}
static void m_pretok_nobl(json_t *j)
{
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "Regex", "\\s+",
                                  "behavior", "Isolated", "invert", 0));
}
static void m_pretok_regex(json_t *j)
{
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s}]}", "type", "Sequence",
                                  "pretokenizers", "type", "Split", "pattern", "Regex", "(ab", "behavior",
                                  "Isolated", "invert", 0, "type", "ByteLevel"));
}
static void m_pretok_beh(json_t *j)
{
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s}]}", "type", "Sequence",
                                  "pretokenizers", "type", "Split", "pattern", "Regex", "a", "behavior",
                                  "Sideways", "invert", 0, "type", "ByteLevel"));
}
static void m_pretok_type(json_t *j)
{
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s}", "type", "Metaspace"));
}
static void m_decoder(json_t *j)
{
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "WordPiece"));
}
static void m_no_decoder(json_t *j)
{
    json_object_del(j, "decoder");
}
static void m_added_content(json_t *j)
{
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i,s:i}", "id", 400, "content", 7));
}
static void m_added_id(json_t *j)
{
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:s,s:s}", "id", "x", "content", "<x>"));
}
static void m_added_clash(json_t *j)
{
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i,s:s}", "id", 97, "content", "<x>"));
}
static void m_added_flag(json_t *j)
{
    json_array_append_new(json_object_get(j, "added_tokens"),
                          json_pack("{s:i,s:s,s:s}", "id", 400, "content", "<x>", "special", "yes"));
}
static void m_post(json_t *j)
{
    json_object_set_new(j, "post_processor", json_pack("{s:s}", "type", "BertProcessing"));
}
static void m_version(json_t *j)
{
    json_object_set_new(j, "version", json_string("2.0"));
}

static void test_load_errors(void **state)
{
    struct bad_case cases[] = {
        {"no model", m_no_model, "model: missing"},
        {"model type", m_model_type, "model.type: 'WordPiece' is not supported"},
        {"model not object", m_model_str, "model: expected an object"},
        {"vocab array", m_vocab_arr, "model.vocab: expected an object"},
        {"vocab value", m_vocab_val, "model.vocab[\"ab\"]: expected an integer id"},
        {"merge 3 parts", m_merge_3, "model.merges[2]: expected \"a b\""},
        {"merge number", m_merge_num, "model.merges[1]: expected a string \"a b\" or a pair"},
        {"merge unknown", m_merge_unk, "model.merges[1]: token 'qq' is not in model.vocab"},
        {"merge result", m_merge_res, "model.merges[3]: 'c a' makes 'ca', which is not in model.vocab"},
        {"merges object", m_merges_obj, "model.merges: expected an array"},
        {"dropout", m_dropout, "model.dropout"},
        {"byte_fallback", m_fallback, "model.byte_fallback"},
        {"unk_token", m_unk, "model.unk_token: '<nope>' is not in model.vocab"},
        {"subword prefix", m_prefix, "model.continuing_subword_prefix"},
        {"normalizer", m_norm, "normalizer.type: 'Lowercase' is not supported"},
        {"normalizer seq", m_norm_seq, "normalizer.normalizers[1].type: 'Strip' is not supported"},
        {"no pre_tokenizer", m_no_pretok, "pre_tokenizer: missing"},
        {"no ByteLevel", m_pretok_nobl, "pre_tokenizer: no ByteLevel step"},
        {"bad regex", m_pretok_regex,
         "pre_tokenizer.pretokenizers[0].pattern.Regex: the pattern does not compile"},
        {"bad behavior", m_pretok_beh, "pre_tokenizer.pretokenizers[0].behavior: expected one of"},
        {"pretok type", m_pretok_type, "pre_tokenizer.type: 'Metaspace' is not supported"},
        {"decoder", m_decoder, "decoder.type: 'WordPiece' is not supported"},
        {"no decoder", m_no_decoder, "decoder: missing"},
        {"added content", m_added_content, "added_tokens[0].content: expected a string"},
        {"added id", m_added_id, "added_tokens[0].id: expected an integer"},
        {"added clash", m_added_clash, "added token '<x>': id 97 is already model.vocab's 'a'"},
        {"added flag", m_added_flag, "added_tokens[0].special: expected true or false"},
        {"post_processor", m_post, "post_processor.type: 'BertProcessing' is not supported"},
        {"version", m_version, "version: '2.0' is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = base_json();
        cases[i].mutate(j);
        const char *p = write_tmp(j, 0);
        char err[512] = "";
        struct tok *t = tok_load(p, NULL, err, sizeof err);
        if (t || strncmp(err, p, strlen(p)) || !strstr(err, cases[i].want)) {
            print_error("%s: got \"%s\", want \"%s: ...%s...\"\n", cases[i].what, t ? "(loaded)" : err, p,
                        cases[i].want);
            fail();
        }
        unlink(p);
    }
}

static void test_file_errors(void **state)
{
    char err[512];
    assert_null(tok_load("/nonexistent/tokenizer.json", NULL, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
    const char *p = write_text("{\"model\": ", 0);
    assert_null(tok_load(p, NULL, err, sizeof err));
    assert_non_null(strstr(err, "line 1"));
    p = write_text("[1, 2]", 0);
    assert_null(tok_load(p, NULL, err, sizeof err));
    assert_non_null(strstr(err, "expected a JSON object"));
    unlink(p);
    assert_null(tok_load_dir("/nonexistent", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));

    /* tokenizer_config.json errors name that file */
    const char *cfgs[][2] = {
        {"{\"eos_token\": \"<nope>\"}", "eos_token: '<nope>' is not a token of this tokenizer"},
        {"{\"bos_token\": 5}", "bos_token: expected a string or {\"content\": string}"},
        {"{\"add_bos_token\": \"yes\"}", "add_bos_token: expected true or false"},
        {"{\"added_tokens_decoder\": {\"abc\": {\"content\": \"x\"}}}",
         "added_tokens_decoder[\"abc\"]: the key is not a token id"},
        {"{\"added_tokens_decoder\": {\"400\": {\"special\": true}}}",
         "added_tokens_decoder[\"400\"].content: expected a string"},
        {"{\"added_tokens_decoder\": {\"400\": {\"content\": \"<t>\"}}}",
         "added_tokens_decoder[\"400\"].content: '<t>', but tokenizer.json has '<s>'"},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        json_t *j = base_json();
        add_token(j, 400, "<s>", 1, 0, 0, 0, 0);
        const char *jp = write_tmp(j, 0), *cp = write_text(cfgs[i][0], 1);
        struct tok *t = tok_load(jp, cp, err, sizeof err);
        if (t || strncmp(err, cp, strlen(cp)) || !strstr(err, cfgs[i][1])) {
            print_error("config %s: got \"%s\", want \"%s\"\n", cfgs[i][0], t ? "(loaded)" : err, cfgs[i][1]);
            fail();
        }
        unlink(jp);
        unlink(cp);
    }
    tok_free(NULL);
    tok_stream_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_valid),
        cmocka_unit_test(test_utf8_lossy),
        cmocka_unit_test(test_bytelevel_table),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_merges_as_pairs),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_unknown_bytes),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_normalized_added_token),
        cmocka_unit_test(test_normalizer_nfc),
        cmocka_unit_test(test_nfc_pieces),
        cmocka_unit_test(test_empty_and_invalid),
        cmocka_unit_test(test_decode_lossy_and_stream),
        cmocka_unit_test(test_stream_matches_decode),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_regex_whitespace),
        cmocka_unit_test(test_regex_unicode15),
        cmocka_unit_test(test_template_and_config),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_file_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
