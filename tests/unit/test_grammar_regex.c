/* engine/grammar_regex.c and grammar_regex_parse.c against PCRE2, compiled as engine/json_schema.c
 * compiles a schema's pattern (PCRE2_UTF | PCRE2_DOLLAR_ENDONLY): for each pattern of a suite and for
 * random patterns, in both contexts (raw bytes, JSON string content decoded by jansson) and both modes
 * (anchored full match, unanchored search),
 *   - random sentences of the grammar (a random walk over its rules, fixed seeds) all match, and in a
 *     JSON string are spelled as jansson writes them;
 *   - every string over a small alphabet chosen for the pattern (multibyte characters included), up
 *     to a length, is accepted by the grammar exactly when PCRE2 matches it;
 * code point ranges probed at the edges of UTF-8's byte ranges; the characters where ECMA-262, PCRE2
 * and Python's re differ, one by one; matcher states of searches kept small; and the refusals, which
 * name the construct and its offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/grammar_int.h"
#include "grammar_test.h"

/* ---- the reference ---- */

/* pattern with \uHHHH and \u{H..} written as PCRE2's \x{H..} (PCRE2 refuses \u; engine/json_schema.c
 * never sees one, since a JSON string holds the character itself). */
static pcre2_code *ref_compile(const char *pattern)
{
    char buf[1024];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 16 < sizeof buf;) {
        if (p[0] == '\\' && p[1] == 'u') {
            unsigned long v;
            char *end;
            if (p[2] == '{') {
                v = strtoul(p + 3, &end, 16);
                end++;
            } else {
                char h[5] = {p[2], p[3], p[4], p[5], 0};
                v = strtoul(h, NULL, 16);
                end = (char *)p + 6;
            }
            o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x{%lX}", v);
            p = end;
        } else if (p[0] == '\\' && p[1]) {
            buf[o++] = *p++;
            buf[o++] = *p++;
        } else
            buf[o++] = *p++;
    }
    buf[o] = 0;
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY,
                                   &code, &off, NULL);
    if (!re)
        fail_msg("PCRE2 refuses '%s' (code %d at %zu)", buf, code, (size_t)off);
    return re;
}

/* 1 match, 0 none; fails the test on a PCRE2 error (invalid UTF-8 included). */
static int ref_match(pcre2_code *re, const char *s, size_t n, bool anchored)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc =
        pcre2_match(re, (PCRE2_SPTR)s, n, 0, anchored ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0, md, NULL);
    pcre2_match_data_free(md);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
        fail_msg("pcre2_match: error %d on '%.*s'", rc, (int)n, s);
    return rc >= 0;
}

/* The JSON string content jansson writes for s[0..n) (no quotes). */
static char *json_content(const char *s, size_t n, size_t *out_n)
{
    json_t *j = json_stringn(s, n);
    assert_non_null(j);
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    assert_non_null(d);
    size_t k = strlen(d);
    assert_true(k >= 2);
    memmove(d, d + 1, k - 2);
    d[k - 2] = 0;
    *out_n = k - 2;
    return d;
}

/* ---- the grammar ---- */

static struct grammar *build(const char *pattern, bool anchored, enum gr_regex_ctx ctx)
{
    struct gr_builder b;
    grb_init(&b);
    int32_t root = gr_regex_rule(&b, pattern, anchored, ctx, "re");
    char err[256] = "";
    struct grammar *g = gr_finish(&b, root, NULL, err, sizeof err);
    if (!g)
        fail_msg("'%s': %s", pattern, err);
    return g;
}

/* -1 refused at some byte, 0 accepted but incomplete, 1 complete (tests/grammar_test.h). */
static int run(struct grammar *g, const char *s, size_t n)
{
    return gt_run(g, s, n);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct buf {
    char s[4096];
    size_t n;
};

/* The shortest sentence length of each rule (fixed point). */
static int32_t *min_lengths(const struct grammar *g)
{
    int32_t *ml = malloc((size_t)g->n_rules * sizeof *ml);
    assert_non_null(ml);
    for (int32_t r = 0; r < g->n_rules; r++)
        ml[r] = INT32_MAX;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++)
            for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
                int64_t len = 0;
                for (int32_t p = g->alts[g->rules[r].first_alt + a]; g->elems[p].kind != GR_END; p++)
                    len += g->elems[p].kind == GR_CLASS ? 1 : ml[g->elems[p].arg];
                if (len < ml[r]) {
                    ml[r] = (int32_t)len;
                    changed = true;
                }
            }
    }
    return ml;
}

/* A random sentence of rule r: random alternatives while out is shorter than budget, then the
 * shortest ones. */
static void walk(const struct grammar *g, const int32_t *ml, int32_t r, struct buf *out, uint64_t *seed,
                 size_t budget)
{
    const struct gr_rule *rule = &g->rules[r];
    int32_t pick = 0;
    if (out->n < budget) {
        pick = (int32_t)(rng_next(seed) % (uint64_t)rule->n_alts);
    } else {
        int64_t best = INT64_MAX;
        for (int32_t a = 0; a < rule->n_alts; a++) {
            int64_t len = 0;
            for (int32_t p = g->alts[rule->first_alt + a]; g->elems[p].kind != GR_END; p++)
                len += g->elems[p].kind == GR_CLASS ? 1 : ml[g->elems[p].arg];
            if (len < best)
                best = len, pick = a;
        }
    }
    for (int32_t p = g->alts[rule->first_alt + pick]; g->elems[p].kind != GR_END; p++) {
        if (g->elems[p].kind == GR_RULE) {
            walk(g, ml, g->elems[p].arg, out, seed, budget);
            continue;
        }
        const struct gr_class *c = &g->classes[g->elems[p].arg];
        int n = 0;
        for (unsigned x = 0; x < 256; x++)
            n += gr_class_has(c, x);
        int k = (int)(rng_next(seed) % (uint64_t)n);
        for (unsigned x = 0; x < 256; x++)
            if (gr_class_has(c, x) && k-- == 0) {
                assert_true(out->n < sizeof out->s - 1);
                out->s[out->n++] = (char)x;
                break;
            }
    }
}

/* ---- the suite ---- */

struct pat {
    const char *pattern;
    const char *alpha; /* the characters of the strings enumerated (UTF-8) */
};

static const struct pat suite[] = {
    {"abc", "abcx"},
    {"a|b|cd", "abcd"},
    {"[a-c]+", "abcd"},
    {"[^a-c]", "ab\xc3\xa9z"},
    {"a*b?c{2}", "abc"},
    {"(ab|c){1,3}", "abc"},
    {"(?:a|bc)*d", "abcd"},
    {"(?<y>\\d{2})-(?<m>\\d)", "1-a"},
    {"^\\d{2}-\\d$", "19-"},
    {"[\\w.+-]+@[\\w-]+\\.[a-z]{2}", "a.@-x"},
    {"^\\+?\\d{1,2}[- ]?\\d$", "+1- "},
    {"\xc3\xa9+|\xe2\x82\xac", "\xc3\xa9\xe2\x82\xac"
                               "e"},
    {"[\xc3\xa0-\xc3\xbf]x", "\xc3\xa0\xc3\xbf\xc3\x9f"
                             "x"},
    {"[^\xc3\xa9]", "\xc3\xa9"
                    "e\xe2\x82\xac\xf0\x9f\x98\x80"},
    {"[\\u0100-\\u07FF]+", "\xc3\xbf\xc4\x80\xdf\xbf\xe0\xa0\x80"},
    {"[\\u{1F600}-\\u{1F602}]", "\xf0\x9f\x98\x80\xf0\x9f\x98\x82\xf0\x9f\x98\x83"
                                "a"},
    {"[^\\x01-\\x7F]", "a\xc2\x80\xe2\x82\xac\xf0\x9f\x98\x80"},
    {"[\\u07FF-\\u0801\\uFFFF\\u{10000}]",
     "\xdf\xbf\xe0\xa0\x80\xe0\xa0\x81\xe0\xa0\x82\xef\xbf\xbf\xf0\x90\x80\x80"},
    {".", "a\n\xc3\xa9\xf0\x9f\x98\x80"},
    {".+x", "ax\n"},
    {"\\s\\S", " \t\na"},
    {"\\w\\W", "a_9-\xe2\x82\xac"},
    {"\\d\\D", "1a\xe2\x82\xac"},
    {"[\\d\\s]", "1 a\x0b"},
    {"[^\\d\\s]", "1 a\x0b"},
    {"[^\\W\\d]", "1a_-"},
    {"a\\.b\\*c\\(\\)", "a.b*c()"},
    {"\\t\\n\\x41\\u00e9", "\t\nA\xc3\xa9"},
    {"(a|)+", "ab"},
    {"(a*)*b", "ab"},
    {"(a?b?)*c", "abc"},
    {"a{0,3}", "ab"},
    {"a{2,}", "ab"},
    {"x{2}?y??", "xy"},
    {"^a|b$", "abc"},
    {"^$", "a"},
    {"", "ab"},
    {"[-a][a-][a\\-z]", "a-z"},
    {"[\\]\\[]+", "[]a"},
    {"\"|\\\\", "\"\\a"},
    {"[\\x01-\\x1f]", "\x01\x1f\n\t\x08"
                      "a"},
    {"\\cJ[\\b]", "\n\x08"
                  "b"},
    {"((a|b)(c|d)){2}", "abcd"},
    {"[a-z]{2,3}-\\d+", "ab-1"},
    {"^[0-9a-f]{4}-[0-9a-f]{2}$", "0af-"},
    {"colou?r|gr[ae]y", "colurgae"},
    {"\\/\\-\\#", "/-#"},
    {"^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$", "(1)-"},
    {"^\\S+@\\S+\\.\\S+$", "a@. "},
    {"^https?://[^/\\s]+", "hps:/a "},
    {"^#?([a-f0-9]{6}|[a-f0-9]{3})$", "#a0g"},
    {"^\\+?[1-9]\\d{1,14}$", "+102"},
    {"^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}(:\\d{2}(\\.\\d+)?)?(Z|[+-]\\d{2}:\\d{2})$", "1-T:Z"},
    {"[\\u0081-\\u00C1\\u0901-\\u0A41]",
     "\xc2\x80\xc2\x81\xc2\x90\xc3\x81\xc3\x82\xe0\xa4\x80\xe0\xa4\x81\xe0\xa5\x90\xe0\xa9\x81\xe0\xa9\x82"},
};

/* The code points of s as UTF-8 strings in items[] (each NUL-terminated in room). */
static int split_chars(const char *s, char items[][5])
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; n++) {
        int len = *p < 0x80 ? 1 : *p < 0xE0 ? 2 : *p < 0xF0 ? 3 : 4;
        memcpy(items[n], p, (size_t)len);
        items[n][len] = 0;
        p += len;
    }
    return n;
}

struct enum_ctx {
    struct grammar *g;
    pcre2_code *re;
    bool anchored, json;
    char items[16][5];
    char enc[16][8]; /* each item as the grammar reads it */
    int n_items, max_len;
    char raw[64], in[256];
    struct gr_scratch sc;
    long checked;
    const char *pattern;
};

/* Every extension of raw[0..rn) (in[0..in_n) as the grammar reads it, state st or dead) up to max_len
 * characters. */
static void enumerate(struct enum_ctx *c, size_t rn, size_t in_n, const struct gr_state *st, int len)
{
    bool acc = st && st->complete;
    int want = ref_match(c->re, c->raw, rn, c->anchored);
    if (acc != (want == 1))
        fail_msg("'%s' (%s, %s): '%.*s' grammar %s, PCRE2 %s", c->pattern,
                 c->anchored ? "anchored" : "search", c->json ? "json" : "raw", (int)rn, c->raw,
                 acc ? "accepts" : "rejects", want ? "matches" : "does not");
    c->checked++;
    if (len == c->max_len)
        return;
    struct gr_state next = {0}, tmp = {0};
    char err[128];
    for (int i = 0; i < c->n_items; i++) {
        size_t il = strlen(c->items[i]), el = strlen(c->enc[i]);
        memcpy(c->raw + rn, c->items[i], il);
        memcpy(c->in + in_n, c->enc[i], el);
        bool alive = st != NULL;
        if (alive) {
            assert_int_equal(gr_state_copy(st, &next), 0);
            for (size_t k = 0; k < el && alive; k++) {
                int r = gr_state_advance(c->g, &next, (uint8_t)c->enc[i][k], &tmp, &c->sc, err, sizeof err);
                if (r < 0)
                    fail_msg("%s", err);
                alive = r == 1;
                struct gr_state t = next;
                next = tmp;
                tmp = t;
            }
        }
        enumerate(c, rn + il, in_n + el, alive ? &next : NULL, len + 1);
    }
    gr_state_free(&next);
    gr_state_free(&tmp);
}

static void check_pattern(const struct pat *pt, bool anchored, bool json, uint64_t seed)
{
    struct grammar *g = build(pt->pattern, anchored, json ? GR_RX_JSON_STRING : GR_RX_RAW);
    pcre2_code *re = ref_compile(pt->pattern);
    /* (1) random sentences match */
    int32_t *ml = min_lengths(g);
    for (int i = 0; i < 60; i++) {
        struct buf out = {.n = 0};
        walk(g, ml, g->root, &out, &seed, (size_t)(rng_next(&seed) % 24));
        assert_int_equal(run(g, out.s, out.n), 1);
        if (!json) {
            if (!ref_match(re, out.s, out.n, anchored))
                fail_msg("'%s' (%s, raw): generated '%.*s' does not match", pt->pattern,
                         anchored ? "anchored" : "search", (int)out.n, out.s);
            continue;
        }
        char quoted[4200];
        snprintf(quoted, sizeof quoted, "\"%.*s\"", (int)out.n, out.s);
        json_error_t jerr;
        json_t *j = json_loads(quoted, JSON_DECODE_ANY, &jerr);
        if (!j || !json_is_string(j))
            fail_msg("'%s': generated %s is not a JSON string: %s", pt->pattern, quoted, jerr.text);
        if (!ref_match(re, json_string_value(j), json_string_length(j), anchored))
            fail_msg("'%s' (%s, json): generated %s does not match", pt->pattern,
                     anchored ? "anchored" : "search", quoted);
        /* written one way: as jansson writes the decoded string */
        size_t cn;
        char *canon = json_content(json_string_value(j), json_string_length(j), &cn);
        if (cn != out.n || memcmp(canon, out.s, cn))
            fail_msg("'%s': generated %s, jansson writes \"%s\"", pt->pattern, quoted, canon);
        free(canon);
        json_decref(j);
    }
    free(ml);
    /* (2) every string over the alphabet: the grammar accepts exactly PCRE2's matches */
    struct enum_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->g = g, c->re = re, c->anchored = anchored, c->json = json, c->pattern = pt->pattern;
    c->n_items = split_chars(pt->alpha, c->items);
    for (int i = 0; i < c->n_items; i++) {
        size_t n;
        char *e = json ? json_content(c->items[i], strlen(c->items[i]), &n) : strdup(c->items[i]);
        snprintf(c->enc[i], sizeof c->enc[i], "%s", e);
        free(e);
    }
    c->max_len = 1;
    for (long total = c->n_items; total * c->n_items <= 1500 && c->max_len < 7; total *= c->n_items)
        c->max_len++;
    struct gr_state st = {0};
    char err[128];
    assert_int_equal(gr_state_start(g, &st, &c->sc, err, sizeof err), 1);
    enumerate(c, 0, 0, &st, 0);
    gr_state_free(&st);
    gr_scratch_free(&c->sc);
    free(c);
    pcre2_code_free(re);
    gr_unref(g);
}

static void test_suite_anchored_raw(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof suite / sizeof *suite; i++)
        check_pattern(&suite[i], true, false, 0x9E3779B97F4A7C15ull + i);
}

static void test_suite_search_raw(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof suite / sizeof *suite; i++)
        check_pattern(&suite[i], false, false, 0xD1B54A32D192ED03ull + i);
}

static void test_suite_anchored_json(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof suite / sizeof *suite; i++)
        check_pattern(&suite[i], true, true, 0x2545F4914F6CDD1Dull + i);
}

static void test_suite_search_json(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof suite / sizeof *suite; i++)
        check_pattern(&suite[i], false, true, 0x94D049BB133111EBull + i);
}

static int put_utf8(uint32_t c, char *o)
{
    if (c < 0x80)
        return o[0] = (char)c, 1;
    if (c < 0x800)
        return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 0x3F)),
               o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* A code point near one of the boundaries of UTF-8's byte ranges (or anywhere), never a surrogate. */
static uint32_t some_cp(uint64_t *seed)
{
    static const uint32_t edges[] = {0x1,    0x7F,   0x80,   0x7FF,   0x800,   0xFFF,   0x1000,
                                     0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF};
    uint32_t c;
    do {
        uint64_t r = rng_next(seed);
        if (r % 4 == 0)
            c = (uint32_t)(rng_next(seed) % 0x10FFFF) + 1;
        else if (r % 4 == 1)
            c = (uint32_t)((rng_next(seed) % 0x4400) * 64 +
                           (rng_next(seed) % 3 == 0 ? 63 : rng_next(seed) % 2));
        else
            c = edges[rng_next(seed) % (sizeof edges / sizeof *edges)] + (uint32_t)(rng_next(seed) % 5) - 2;
    } while (c == 0 || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000));
    return c;
}

/* Ranges of code points cut into UTF-8 byte ranges: [lo-hi] and [^lo-hi] accept exactly the code
 * points PCRE2 puts in them, probed at the edges of the range and of UTF-8's byte ranges. */
static void test_utf8_ranges(void **state)
{
    (void)state;
    uint64_t seed = 0x853C49E6748FEA9Bull;
    for (int i = 0; i < 300; i++) {
        uint32_t lo = some_cp(&seed), hi = some_cp(&seed);
        if (lo > hi) {
            uint32_t t = lo;
            lo = hi, hi = t;
        }
        char pat[64];
        snprintf(pat, sizeof pat, "[%s\\u{%X}-\\u{%X}]", i % 2 ? "^" : "", lo, hi);
        struct grammar *g = build(pat, true, i % 3 ? GR_RX_RAW : GR_RX_JSON_STRING);
        pcre2_code *re = ref_compile(pat);
        for (int k = 0; k < 40; k++) {
            uint32_t c = k < 6 ? (uint32_t[]){lo - 1, lo, lo + 1, hi - 1, hi, hi + 1}[k] : some_cp(&seed);
            if (c == 0 || c > 0x10FFFF || (c >= 0xD800 && c < 0xE000))
                continue;
            char s[8];
            size_t n = (size_t)put_utf8(c, s), en;
            s[n] = 0;
            char *e = i % 3 ? strdup(s) : json_content(s, n, &en);
            int want = ref_match(re, s, n, true);
            if ((run(g, e, strlen(e)) == 1) != want)
                fail_msg("%s: U+%04X grammar %s", pat, c, want ? "rejects" : "accepts");
            free(e);
        }
        pcre2_code_free(re);
        gr_unref(g);
    }
}

/* A random pattern over a, b, 1, space, €: atoms, classes, groups, alternation and quantifiers,
 * nested up to depth (quantified parts that may match "" included). */
static void random_pattern(uint64_t *seed, int depth, char *out, size_t cap)
{
    static const char *const atoms[] = {"a",
                                        "b",
                                        "[ab]",
                                        "[^a]",
                                        ".",
                                        "\xe2\x82\xac",
                                        "\\d",
                                        "[a1]",
                                        "\\W",
                                        "()",
                                        "\\s",
                                        "\\S",
                                        "[^\\d\\s]",
                                        "[\xe2\x82\xa0-\xe2\x82\xbf]",
                                        "[^\xe2\x82\xac ]",
                                        "\\x20",
                                        "[ -a]"};
    static const char *const quants[] = {"*",    "+",  "?",     "{0,2}", "{1,2}",  "{2}",
                                         "{2,}", "*?", "{0,1}", "{3}",   "{1,4}?", "{0,}"};
    size_t n = strlen(out);
    uint64_t r = rng_next(seed) % 10;
    if (depth >= 3 || r < 3) {
        snprintf(out + n, cap - n, "%s", atoms[rng_next(seed) % (sizeof atoms / sizeof *atoms)]);
    } else if (r < 5) {
        random_pattern(seed, depth + 1, out, cap);
        random_pattern(seed, depth + 1, out, cap);
    } else if (r < 7) {
        snprintf(out + n, cap - n, "(%s", rng_next(seed) % 2 ? "?:" : "");
        random_pattern(seed, depth + 1, out, cap);
        n = strlen(out);
        snprintf(out + n, cap - n, "|");
        random_pattern(seed, depth + 1, out, cap);
        n = strlen(out);
        snprintf(out + n, cap - n, ")");
    } else {
        snprintf(out + n, cap - n, "(?:");
        random_pattern(seed, depth + 1, out, cap);
        n = strlen(out);
        snprintf(out + n, cap - n, ")%s", quants[rng_next(seed) % (sizeof quants / sizeof *quants)]);
    }
}

/* Random patterns: the grammar accepts exactly PCRE2's matches over their alphabet. */
static void test_random_patterns(void **state)
{
    (void)state;
    uint64_t seed = 0x6A09E667F3BCC909ull;
    for (int i = 0; i < 150; i++) {
        char pat[512] = "";
        if (rng_next(&seed) % 4 == 0)
            strcat(pat, "^");
        random_pattern(&seed, 0, pat, sizeof pat - 2);
        if (rng_next(&seed) % 4 == 0)
            strcat(pat, "$");
        if (rng_next(&seed) % 3 == 0) { /* a second top-level alternative, with its own anchors */
            strcat(pat, rng_next(&seed) % 2 ? "|^" : "|");
            random_pattern(&seed, 1, pat, sizeof pat - 2);
            if (rng_next(&seed) % 2)
                strcat(pat, "$");
        }
        struct pat pt = {pat, "ab1 \xe2\x82\xac"};
        check_pattern(&pt, i % 2, i % 3 == 0, seed);
    }
}

/* A search keeps few matcher stacks: repetition at an unanchored end is cut to its minimum, and a
 * character's alternatives share their first bytes. */
static void test_search_states_small(void **state)
{
    (void)state;
    static const char *const pats[] = {"[^\"]{0,100}", "[a-z]{1,64}", "(a{1,30}){1,30}", "\\d+\\.\\d*",
                                       "(x|a)*y"};
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) {
        struct grammar *g = build(pats[i], false, GR_RX_JSON_STRING);
        struct gr_scratch sc = {0};
        struct gr_state s = {0}, t = {0};
        char err[128];
        assert_int_equal(gr_state_start(g, &s, &sc, err, sizeof err), 1);
        int most = 0;
        for (int k = 0; k < 400; k++) {
            uint8_t c = (uint8_t)("aaxa1.\\ny"[k % 9]);
            assert_int_equal(gr_state_advance(g, &s, c, &t, &sc, err, sizeof err), 1);
            struct gr_state u = s;
            s = t, t = u;
            most = s.n_stacks > most ? s.n_stacks : most;
        }
        if (most > 40)
            fail_msg("'%s': %d stacks", pats[i], most);
        gr_state_free(&s), gr_state_free(&t);
        gr_scratch_free(&sc);
        gr_unref(g);
    }
}

/* Where ECMA-262 and PCRE2 differ, the grammar generates only what both match. */
static void test_engines_differ(void **state)
{
    (void)state;
    struct {
        const char *pattern, *text;
        int grammar, pcre;
    } cases[] = {
        {".", "\r", 0, 1},           /* ECMA's . excludes line terminators, PCRE2's only \n */
        {".", "\xe2\x80\xa8", 0, 1}, /* U+2028 */
        {"\\S", "\xc2\xa0", 0, 1},   /* ECMA's \s includes U+00A0, PCRE2's (no UCP) does not */
        {"\\s", "\xc2\xa0", 0, 0},
        {"\\s", "\x0b", 1, 1},
        {"\\S", "\xef\xbb\xbf", 0, 1},    /* U+FEFF */
        {"[^\\s]", "\xe3\x80\x80", 0, 1}, /* U+3000 */
        {"\\v", "\x0b", 1, 1},            /* ECMA: U+000B alone; PCRE2: vertical space */
        {"\\v", "\n", 0, 1},
        {"[^\\v]", "\n", 0, 0},
        {"[^\\v]", "\x0b", 0, 0},
        {"\\d", "\xd9\xa3", 0, 0}, /* ASCII digits only */
        /* Python's re (python3-jsonschema) gives \d \w \s their Unicode meaning: their complements
         * leave out what any of the three engines puts in them */
        {"\\D", "\xd9\xa3", 0, 1},    /* U+0663 ARABIC-INDIC DIGIT THREE */
        {"\\W", "\xc3\xa9", 0, 1},    /* a letter */
        {"[^\\w]", "\xc2\xb2", 0, 1}, /* superscript two (No) */
        {"\\W", "\xcd\xb8", 0, 1},    /* U+0378, unassigned */
        {"\\S", "\x1c", 0, 1},        /* Python's whitespace */
        {"\\S", "\xc2\x85", 0, 1},
        {"\\W", "\xe2\x82\xac", 1, 1}, /* a symbol is no word character anywhere */
        {"\\D\\S", "\xcc\x81-", 1, 1}, /* a combining mark */
        {"\\w", "\xc3\xa9", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct grammar *g = build(cases[i].pattern, true, GR_RX_RAW);
        pcre2_code *re = ref_compile(cases[i].pattern);
        size_t n = strlen(cases[i].text);
        if ((run(g, cases[i].text, n) == 1) != cases[i].grammar ||
            ref_match(re, cases[i].text, n, true) != cases[i].pcre)
            fail_msg("case %zu '%s'", i, cases[i].pattern);
        pcre2_code_free(re);
        gr_unref(g);
    }
}

/* JSON string content: each code point one way; U+0000 never. */
static void test_json_one_way(void **state)
{
    (void)state;
    struct grammar *g = build("[A/\\n\\x7f\\u001f\\u00e9]", true, GR_RX_JSON_STRING);
    assert_int_equal(run(g, "A", 1), 1);
    assert_int_equal(run(g, "\\u0041", 6), -1);
    assert_int_equal(run(g, "/", 1), 1);
    assert_int_equal(run(g, "\\/", 2), -1);
    assert_int_equal(run(g, "\\n", 2), 1);
    assert_int_equal(run(g, "\n", 1), -1);
    assert_int_equal(run(g, "\\u000a", 6), -1);
    assert_int_equal(run(g, "\\u000A", 6), -1);
    assert_int_equal(run(g, "\x7f", 1), 1);
    assert_int_equal(run(g, "\\u001F", 6), 1);
    assert_int_equal(run(g, "\\u001f", 6), -1);
    assert_int_equal(run(g, "\x1f", 1), -1);
    assert_int_equal(run(g, "\xc3\xa9", 2), 1);
    assert_int_equal(run(g, "\\u00e9", 6), -1);
    gr_unref(g);
    g = build("a\\0?b", true, GR_RX_JSON_STRING);
    assert_int_equal(run(g, "ab", 2), 1);
    assert_int_equal(run(g, "a\\u0000b", 8), -1);
    gr_unref(g);
    g = build("[^a]", true, GR_RX_RAW);
    assert_int_equal(run(g, "\0", 1), -1);
    gr_unref(g);
}

/* As a schema uses it: two patterns in one builder, each inside the quotes of a JSON string. */
static void test_in_json_strings(void **state)
{
    (void)state;
    struct gr_builder b;
    grb_init(&b);
    int32_t r1 = gr_regex_rule(&b, "^\\d{3}$", false, GR_RX_JSON_STRING, "/properties/a/pattern");
    int32_t r2 = gr_regex_rule(&b, "x\"", false, GR_RX_JSON_STRING, "/properties/b/pattern");
    int32_t root = grb_rule(&b, "root");
    struct gr_seq s = {0};
    grs_byte(&b, &s, '"');
    grs_rule(&b, &s, r1);
    grs_lit(&b, &s, "\",\"", 3);
    grs_rule(&b, &s, r2);
    grs_byte(&b, &s, '"');
    grb_alt(&b, root, &s);
    grs_free(&s);
    char err[256];
    struct grammar *g = gr_finish(&b, root, NULL, err, sizeof err);
    assert_non_null(g);
    const char *good[] = {"\"123\",\"x\\\"\"", "\"123\",\"\\n\u00e9x\\\"\\\"\""};
    const char *bad[] = {"\"1234\",\"x\\\"\"", "\"123\",\"x\"\"", "\"123\",\"x\\\"\"\""};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(run(g, good[i], strlen(good[i])), 1);
    for (size_t i = 0; i < 3; i++)
        assert_int_not_equal(run(g, bad[i], strlen(bad[i])), 1);
    gr_unref(g);
}

static void test_compile_regex(void **state)
{
    (void)state;
    char err[256];
    struct grammar *g = gr_compile_regex("^(yes|no)$", NULL, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(run(g, "yes", 3), 1);
    assert_int_equal(run(g, "no", 2), 1);
    assert_int_equal(run(g, "nope", 4), -1);
    assert_int_equal(run(g, "ye", 2), 0);
    gr_unref(g);
    /* implicitly anchored */
    g = gr_compile_regex("\\d+", NULL, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(run(g, "a1", 2), -1);
    assert_int_equal(run(g, "123", 3), 1);
    gr_unref(g);
    /* the largest repetitions within bounds compile */
    g = gr_compile_regex("a{1000}(b{1,1000}){2}", NULL, err, sizeof err);
    assert_non_null(g);
    gr_unref(g);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *pattern, *err;
    } cases[] = {
        {"a(?=b)", "regex: unsupported lookahead at offset 1"},
        {"a(?!b)", "regex: unsupported lookahead at offset 1"},
        {"(?<=a)b", "regex: unsupported lookbehind at offset 0"},
        {"(?<!a)b", "regex: unsupported lookbehind at offset 0"},
        {"(a)\\1", "regex: unsupported backreference at offset 3"},
        {"(?<n>a)\\k<n>", "regex: unsupported named backreference \\k at offset 7"},
        {"a\\bc", "regex: unsupported word boundary \\b at offset 1"},
        {"\\Ba", "regex: unsupported word boundary \\B at offset 0"},
        {"(?i)a", "regex: unsupported group syntax or inline flags (? at offset 0"},
        {"(?P<n>a)", "regex: unsupported group syntax or inline flags (? at offset 0"},
        {"\\p{L}", "regex: unsupported Unicode property escape at offset 0"},
        {"a\\z", "regex: unsupported escape \\z at offset 1"},
        {"a^b", "regex: unsupported ^ other than at the start of the pattern or of a top-level alternative "
                "at offset 1"},
        {"(^a)", "regex: unsupported ^ other than at the start of the pattern or of a top-level alternative "
                 "at offset 1"},
        {"a$b", "regex: unsupported $ other than at the end of the pattern or of a top-level alternative at "
                "offset 1"},
        {"(a$)", "regex: unsupported $ other than at the end of the pattern or of a top-level alternative at "
                 "offset 2"},
        {"a++", "regex: unsupported possessive quantifier at offset 2"},
        {"a{2}{3}", "regex: nothing to repeat at offset 4"},
        {"a**", "regex: nothing to repeat at offset 2"},
        {"*a", "regex: nothing to repeat at offset 0"},
        {"a{,3}", "regex: unsupported literal { (write \\{) at offset 1"},
        {"a{1001}", "regex: repetition too large (bounds above 1000) at offset 1"},
        {"a{3,2}", "regex: repetition bounds out of order at offset 1"},
        {"[]", "regex: unsupported empty class [] at offset 0"},
        {"x[^]", "regex: unsupported class [^] (ECMA-262 and PCRE2 differ) at offset 1"},
        {"[[:alpha:]]", "regex: unsupported POSIX class syntax at offset 1"},
        {"[\\d-z]", "regex: unsupported range with a class escape at offset 3"},
        {"[z-a]", "regex: class range out of order at offset 1"},
        {"[ab", "regex: unterminated class at offset 0"},
        {"(ab", "regex: missing ) for this ( at offset 0"},
        {"ab)", "regex: unmatched ) at offset 2"},
        {"ab\\", "regex: trailing backslash at offset 2"},
        {"\\x4", "regex: malformed \\x escape (expected 2 hex digits) at offset 0"},
        {"\\u12", "regex: malformed \\u escape (expected 4 hex digits) at offset 0"},
        {"\\uD800", "regex: unsupported lone surrogate \\u escape at offset 0"},
        {"\\01", "regex: unsupported octal escape at offset 0"},
        {"a\xff", "regex: invalid UTF-8 at offset 1"},
        {"[^\\s\\S]", "regex: matches no string that can be generated (U+0000 is never generated)"},
        {"\\0", "regex: matches no string that can be generated (U+0000 is never generated)"},
        {"a{1000}a{1000}a{1000}a{1000}a{1000}a{1000}a{1000}a{1000}a{1000}a{1000}b+",
         "regex: repetition too large (more than 10000 copies in all) at offset 71"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        struct grammar *g = gr_compile_regex(cases[i].pattern, NULL, err, sizeof err);
        if (g || strcmp(err, cases[i].err))
            fail_msg("'%s': got '%s', want '%s'", cases[i].pattern, g ? "(compiled)" : err, cases[i].err);
    }
    /* a starred group of optional parts repeats its parts: (a?b?)* is (a|b)*, without ambiguity */
    char pat[1024] = "(?:";
    for (int i = 0; i < 150; i++)
        strcat(pat, i % 2 ? "a?" : "(?:b|a)?");
    strcat(pat, ")*");
    char err[256] = "";
    struct grammar *g = gr_compile_regex(pat, NULL, err, sizeof err);
    assert_non_null(g);
    struct gr_matcher *m = gr_matcher_new(g);
    for (int i = 0; i < 100; i++)
        assert_int_equal(gr_matcher_accept_bytes(m, "aab", 3), 0);
    assert_true(gr_matcher_complete(m));
    gr_matcher_free(m);
    gr_unref(g);
    /* the schema's path: the builder fails with the message */
    struct gr_builder b;
    grb_init(&b);
    assert_int_equal(gr_regex_rule(&b, "a(?=b)", false, GR_RX_JSON_STRING, "/pattern"), -1);
    assert_true(b.failed);
    assert_string_equal(b.err, "regex: unsupported lookahead at offset 1");
    grb_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suite_anchored_raw),  cmocka_unit_test(test_suite_search_raw),
        cmocka_unit_test(test_suite_anchored_json), cmocka_unit_test(test_suite_search_json),
        cmocka_unit_test(test_utf8_ranges),         cmocka_unit_test(test_search_states_small),
        cmocka_unit_test(test_random_patterns),     cmocka_unit_test(test_engines_differ),
        cmocka_unit_test(test_json_one_way),        cmocka_unit_test(test_in_json_strings),
        cmocka_unit_test(test_compile_regex),       cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
