/* engine/grammar_schema.c and grammar_choice.c: grammars compiled from JSON Schemas, "any JSON object"
 * and choices. A random sentence generator walks each grammar (alternatives chosen at random, the
 * shortest ones once a sentence grows long; fixed seeds) and every sentence must parse with jansson,
 * validate against the schema with js_validate and be accepted by the byte-level matcher; hand-written
 * documents must be accepted or refused byte by byte; integer ranges and dates are checked value by
 * value against js_validate; refusals name the keyword and the schema's JSON pointer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/json_schema.h"
#include "grammar_test.h"

/* ---- a random sentence generator over a grammar ---- */

#define GEN_BUDGET 400 /* bytes after which every choice is the shortest */
#define GEN_INF (1 << 30)

struct gen {
    const struct grammar *g;
    uint64_t rng;
    int32_t *minlen; /* [n_rules]: the length of the shortest sentence of each rule */
    char *out;
    size_t n, cap;
};

static uint64_t rnd(struct gen *x)
{
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    return x->rng;
}

static int32_t alt_cost(const struct grammar *g, const int32_t *minlen, int32_t p)
{
    int64_t c = 0;
    for (; g->elems[p].kind != GR_END; p++)
        c += g->elems[p].kind == GR_CLASS ? 1 : minlen[g->elems[p].arg];
    return c > GEN_INF ? GEN_INF : (int32_t)c;
}

static void gen_init(struct gen *x, const struct grammar *g, uint64_t seed)
{
    memset(x, 0, sizeof *x);
    x->g = g;
    x->rng = seed * 2654435761u + 1;
    x->minlen = malloc((size_t)g->n_rules * sizeof *x->minlen);
    for (int32_t r = 0; r < g->n_rules; r++)
        x->minlen[r] = GEN_INF;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++)
            for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
                int32_t c = alt_cost(g, x->minlen, g->alts[g->rules[r].first_alt + a]);
                if (c < x->minlen[r])
                    x->minlen[r] = c, changed = true;
            }
    }
    for (int32_t r = 0; r < g->n_rules; r++)
        if (x->minlen[r] >= GEN_INF)
            fail_msg("rule %s has no finite sentence", g->rules[r].name);
}

static void gen_free(struct gen *x)
{
    free(x->minlen);
    free(x->out);
}

static void put(struct gen *x, char ch)
{
    if (x->n + 2 > x->cap) {
        x->cap = x->cap ? x->cap * 2 : 256;
        x->out = realloc(x->out, x->cap);
    }
    x->out[x->n++] = ch;
    x->out[x->n] = '\0';
}

static void gen_rule(struct gen *x, int32_t r)
{
    const struct grammar *g = x->g;
    const struct gr_rule *rule = &g->rules[r];
    int32_t pick = 0;
    if (x->n < GEN_BUDGET) {
        pick = (int32_t)(rnd(x) % (uint64_t)rule->n_alts);
    } else {
        int32_t best = GEN_INF + 1;
        for (int32_t a = 0; a < rule->n_alts; a++) {
            int32_t c = alt_cost(g, x->minlen, g->alts[rule->first_alt + a]);
            if (c < best)
                best = c, pick = a;
        }
    }
    for (int32_t p = g->alts[rule->first_alt + pick]; g->elems[p].kind != GR_END; p++) {
        if (g->elems[p].kind == GR_RULE) {
            gen_rule(x, g->elems[p].arg);
            continue;
        }
        const struct gr_class *k = &g->classes[g->elems[p].arg];
        int members[256], n = 0;
        for (int b = 0; b < 256; b++)
            if (gr_class_has(k, (unsigned)b))
                members[n++] = b;
        assert_true(n > 0);
        put(x, (char)members[rnd(x) % (uint64_t)n]);
    }
}

/* A fresh sentence of x's grammar in x->out (x->n bytes). */
static const char *gen_sentence(struct gen *x)
{
    x->n = 0;
    put(x, 0);
    x->n = 0;
    gen_rule(x, x->g->root);
    return x->out;
}

/* ---- helpers ---- */

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j)
        fail_msg("bad test JSON %s: %s", text, je.text);
    return j;
}

static struct js_schema *schema(const char *text)
{
    char err[512] = "";
    json_t *j = parse(text);
    struct js_schema *s = js_compile(j, err, sizeof err);
    json_decref(j);
    if (!s)
        fail_msg("js_compile refused %s: %s", text, err);
    return s;
}

static struct grammar *compile(const struct js_schema *s, const char *text)
{
    char err[1300] = "";
    struct grammar *g = gr_compile_schema(s, NULL, err, sizeof err);
    if (!g)
        fail_msg("gr_compile_schema refused %s: %s", text, err);
    return g;
}

/* -1: refused at some byte; 0: accepted but incomplete; 1: accepted and complete. */
static int run(struct grammar *g, const char *text)
{
    return gt_run(g, text, strlen(text));
}

/* Called with each sentence's parsed value (for variety counts). */
typedef void (*seen_fn)(const json_t *v, int *counts);

/* n sentences of schema text's grammar: each parses, validates and is accepted by the matcher. */
static void check_sentences(const char *text, int n, uint64_t seed, seen_fn seen, int *counts)
{
    struct js_schema *s = schema(text);
    struct grammar *g = compile(s, text);
    struct gen x;
    gen_init(&x, g, seed);
    for (int i = 0; i < n; i++) {
        const char *out = gen_sentence(&x);
        json_error_t je;
        json_t *v = json_loads(out, JSON_DECODE_ANY, &je);
        if (!v)
            fail_msg("schema %s: sentence %d does not parse (%s): %s", text, i, je.text, out);
        char err[512];
        if (js_validate(s, v, err, sizeof err))
            fail_msg("schema %s: sentence %d does not validate (%s): %s", text, i, err, out);
        if (run(g, out) != 1)
            fail_msg("schema %s: the matcher refuses generated sentence %d: %s", text, i, out);
        if (seen)
            seen(v, counts);
        json_decref(v);
    }
    gen_free(&x);
    gr_unref(g);
    js_free(s);
}

static void expect_refused(const char *text, const char *want)
{
    struct js_schema *s = schema(text);
    char err[1300] = "";
    struct grammar *g = gr_compile_schema(s, NULL, err, sizeof err);
    js_free(s);
    if (g) {
        gr_unref(g);
        fail_msg("compiled %s (wanted: %s)", text, want);
    }
    assert_string_equal(err, want);
}

/* Each of docs[] gives want under schema text's grammar (1 complete, 0 incomplete, -1 refused). */
static void expect_docs(const char *text, const char *const *docs, size_t n, int want)
{
    struct js_schema *s = schema(text);
    struct grammar *g = compile(s, text);
    for (size_t i = 0; i < n; i++) {
        int got = run(g, docs[i]);
        if (want == 1 ? got != 1 : got == 1)
            fail_msg("schema %s: document %s gives %d, wanted %d", text, docs[i], got, want);
        if (want == 1) { /* a document the grammar writes must be one the schema allows */
            json_t *v = parse(docs[i]);
            char err[256];
            if (js_validate(s, v, err, sizeof err))
                fail_msg("test document %s does not validate: %s", docs[i], err);
            json_decref(v);
        }
    }
    gr_unref(g);
    js_free(s);
}

/* ---- the suite ---- */

static const char *const FLAT =
    "{\"type\":\"object\",\"properties\":{"
    "\"title\":{\"type\":\"string\"},\"summary\":{\"type\":\"string\"},"
    "\"entities\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"sentiment\":{\"enum\":[\"positive\",\"negative\",\"neutral\"]},"
    "\"score\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10},"
    "\"published\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"title\",\"summary\",\"entities\",\"sentiment\",\"score\",\"published\"],"
    "\"additionalProperties\":false}";

static const char *const TREE =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},"
    "\"required\":[\"value\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";

static const char *const SUITE[] = {
    /* flat, nested, optional properties, keys that need escaping */
    NULL, /* FLAT */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":"
    "\"boolean\"},\"c\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"c\"]},\"d\":{\"type\":\"null\"},"
    "\"e\":{}},\"required\":[\"d\"]}",
    "{\"type\":\"object\",\"properties\":{\"a\\\"b\\\\c/"
    "\\u00e9\\n\":{\"type\":\"null\"}},\"required\":[\"x\"]}",
    "{\"required\":[\"a\",\"a\"]}",
    /* arrays */
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}",
    "{\"type\":\"array\",\"minItems\":3}",
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":1}",
    "{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"maxItems\":0}",
    "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1}}",
    /* enum and const of mixed types */
    "{\"enum\":[1,\"a\",null,true,{\"x\":[1,2]},[],2.5,\"\\u00e9\\n\\\"q\",-0.125,1e300]}",
    "{\"const\":{\"a\":[1,{\"b\":null}],\"c\":\"\\t\"}}",
    "{\"type\":\"string\",\"enum\":[\"a\",1,\"b\",null]}",
    "{\"type\":\"integer\",\"enum\":[1.0,2.5,3]}",
    /* anyOf, type lists, anything */
    "{\"anyOf\":[{\"type\":\"string\",\"format\":\"uuid\"},{\"type\":\"integer\",\"minimum\":-5,"
    "\"maximum\":5},{\"type\":\"null\"}]}",
    "{\"type\":[\"string\",\"null\",\"boolean\"]}",
    "{}",
    "{\"type\":\"object\"}",
    /* recursion */
    NULL, /* TREE */
    "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#\"},"
    "{\"type\":\"null\"}]}},\"required\":[\"next\"],\"additionalProperties\":false}",
    /* integer and number bounds */
    "{\"type\":\"integer\",\"exclusiveMinimum\":-17,\"exclusiveMaximum\":1234}",
    "{\"type\":\"integer\",\"minimum\":-1000000,\"maximum\":-999}",
    "{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":7.5}",
    "{\"type\":\"integer\"}",
    "{\"type\":\"integer\",\"minimum\":0}",
    "{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":3.25}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}",
    "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
    "{\"type\":\"number\",\"maximum\":-0.5}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
    "{\"type\":\"number\",\"exclusiveMinimum\":-2,\"exclusiveMaximum\":0}",
    "{\"type\":\"number\",\"exclusiveMinimum\":-3,\"maximum\":3}",
    "{\"type\":\"number\"}",
    "{\"type\":\"integer\",\"maximum\":1e300,\"minimum\":-9007199254740993}",
    /* formats */
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date\"},\"minItems\":5,\"maxItems\":5}",
    "{\"type\":\"string\",\"format\":\"date-time\"}",
    "{\"type\":\"string\",\"format\":\"email\"}",
    "{\"type\":\"string\",\"format\":\"uuid\"}",
    "{\"type\":\"string\"}",
    /* patterns: anchored, searched, with characters JSON escapes */
    "{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2,4}$\"}",
    "{\"type\":\"string\",\"pattern\":\"ab+c\"}",
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"},"
    "\"tag\":{\"type\":[\"string\",\"null\"],\"pattern\":\"^(foo|\\\"bar\\\\\\\\)\\n?$\"}},"
    "\"required\":[\"code\",\"tag\"]}",
};

static void test_sentences_validate(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SUITE / sizeof *SUITE; i++) {
        const char *text = SUITE[i] ? SUITE[i] : i == 0 ? FLAT : TREE;
        check_sentences(text, 200, 1000 + i, NULL, NULL);
    }
}

/* counts: [0] summary absent, [1] present, [2] nested "b" absent, [3] present, [4] items > 1 */
static void seen_optional(const json_t *v, int *counts)
{
    const json_t *a = json_object_get(v, "a");
    counts[json_object_get(v, "e") ? 1 : 0]++;
    if (a)
        counts[json_object_get(a, "b") ? 3 : 2]++;
}

static void seen_lengths(const json_t *v, int *counts)
{
    counts[json_array_size(v)]++;
}

static void seen_depth(const json_t *v, int *counts)
{
    int d = 0;
    while ((v = json_object_get(v, "children")) && json_array_size(v))
        v = json_array_get(v, 0), d++;
    counts[d > 3 ? 3 : d]++;
}

/* The generator reaches variety: a test where it never did would prove little. */
static void test_generator_variety(void **state)
{
    (void)state;
    int c[8] = {0};
    check_sentences(SUITE[1], 200, 7, seen_optional, c);
    assert_true(c[0] > 10 && c[1] > 10 && c[2] > 5 && c[3] > 5);
    memset(c, 0, sizeof c);
    check_sentences(SUITE[4], 200, 8, seen_lengths, c);
    for (int k = 0; k < 8; k++)
        if (k >= 2 && k <= 4)
            assert_true(c[k] > 10);
        else
            assert_int_equal(c[k], 0);
    memset(c, 0, sizeof c);
    check_sentences(TREE, 200, 9, seen_depth, c);
    assert_true(c[0] > 10 && c[1] > 5 && c[2] > 0);
}

static void test_flat_documents(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":10,"
        "\"published\":\"2024-02-29\"}",
        "  {\n  \"title\": \"caf\xc3\xa9 \\\"x\\\" \\u00e9\\n\",\n  \"summary\": \"\",\n  \"entities\": "
        "[\"a\", "
        "\"b\"],\n  \"sentiment\": \"positive\",\n  \"score\": 1,\n  \"published\": \"2000-02-29\"\n}",
    };
    static const char *const bad[] = {
        /* missing summary */
        "{\"title\":\"T\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,\"published\":\"2024-01-"
        "01\"}",
        /* another property */
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,"
        "\"published\":\"2024-01-01\",\"x\":1}",
        /* score out of range, leading zero, exponent, fraction */
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":11",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":0",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":01",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1e1",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1.0",
        /* days that do not exist */
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,"
        "\"published\":\"2023-02-29\"",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,"
        "\"published\":\"1900-02-29\"",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,"
        "\"published\":\"2024-04-31\"",
        /* not in the enum; a raw control character; a lone surrogate escape; \u0000 */
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"happy\"",
        "{\"title\":\"a\nb\"",
        "{\"title\":\"\\ud800\"",
        "{\"title\":\"\\u0000\"",
        /* trailing comma, properties out of schema order (valid, but not what the grammar writes) */
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[\"a\",]",
        "{\"summary\":\"S\",\"title\":\"T\"",
        /* whitespace beyond GR_MAX_WS, and after the root value */
        "{             \"title\"",
        "{\"title\":\"T\",\"summary\":\"S\",\"entities\":[],\"sentiment\":\"neutral\",\"score\":1,"
        "\"published\":\"2024-01-01\"} ",
    };
    expect_docs(FLAT, good, sizeof good / sizeof *good, 1);
    expect_docs(FLAT, bad, sizeof bad / sizeof *bad, -1);
    /* the dump names rules by JSON pointer */
    struct js_schema *s = schema(FLAT);
    struct grammar *g = compile(s, FLAT);
    char *d = gr_dump(g);
    assert_non_null(strstr(d, "\n/properties/score ::= [1-9] | '1' '0'\n"));
    assert_non_null(strstr(d, "\n/properties/sentiment ::= '\"' /properties/sentiment@1\n"
                              "/properties/sentiment@1 ::= 'n' 'e' /properties/sentiment@2 | 'p' 'o'"));
    assert_non_null(strstr(d, "*root ::= ws /\n"));
    free(d);
    gr_unref(g);
    js_free(s);
}

static void test_optional_and_arrays(void **state)
{
    (void)state;
    const char *opt =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},"
        "\"c\":{\"type\":\"null\"}},\"required\":[\"b\"],\"additionalProperties\":false}";
    static const char *const good[] = {"{\"b\":null}", "{\"a\":null,\"b\":null}", "{\"b\":null,\"c\":null}",
                                       "{\"a\":null,\"b\":null,\"c\":null}",
                                       "{ \"a\" : null , \"b\" : null }"};
    static const char *const bad[] = {"{}",
                                      "{\"a\":null}",
                                      "{\"a\":null,\"c\":null}",
                                      "{,\"b\":null}",
                                      "{\"b\":null,}",
                                      "{\"b\":null\"c\":null}",
                                      "{\"b\":null,\"b\":null}"};
    expect_docs(opt, good, 5, 1);
    expect_docs(opt, bad, 7, -1);
    const char *all_opt =
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"}}}";
    static const char *const good2[] = {"{}", "{ }", "{\"a\":null}", "{\"b\":null}",
                                        "{\"a\":null,\"b\":null}"};
    static const char *const bad2[] = {"{,}", "{\"b\":null,\"a\":null}", "{\"c\":null}"};
    expect_docs(all_opt, good2, 5, 1);
    expect_docs(all_opt, bad2, 3, -1);
    const char *arr = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}";
    static const char *const good3[] = {"[1,2]", "[ 1 , 2 , 3 ]", "[1,2,3,4]"};
    static const char *const bad3[] = {"[]", "[1]", "[1,2,3,4,5]", "[1,2,]", "[,1,2]", "[1 2]"};
    expect_docs(arr, good3, 3, 1);
    expect_docs(arr, bad3, 6, -1);
    static const char *const good4[] = {"[]", "[ ]", "[\n]"};
    static const char *const bad4[] = {"[null]"};
    expect_docs("{\"type\":\"array\",\"maxItems\":0}", good4, 3, 1);
    expect_docs("{\"type\":\"array\",\"maxItems\":0}", bad4, 1, -1);
}

static void test_enum_const_documents(void **state)
{
    (void)state;
    const char *e = "{\"enum\":[1,\"a\",null,{\"x\":[1,2]},2.5,\"\\u00e9\\n\",[0.1,1e300]]}";
    static const char *const good[] = {"1",   "\"a\"",           "null", "{\"x\":[1,2]}",
                                       "2.5", "\"\xc3\xa9\\n\"", "  1",  "[0.1,1e300]"};
    static const char *const bad[] = {
        "2", "1.0", "\"b\"", "{\"x\": [1,2]}", "true", "\"\\u00e9\\n\"", "[0.10000000000000001,1e300]"};
    expect_docs(e, good, sizeof good / sizeof *good, 1);
    expect_docs(e, bad, sizeof bad / sizeof *bad, -1);
    /* the enum values the rest of the node refuses are left out */
    static const char *const good2[] = {"\"a\"", "\"b\""};
    static const char *const bad2[] = {"1", "null"};
    expect_docs("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\",null]}", good2, 2, 1);
    expect_docs("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\",null]}", bad2, 2, -1);
}

/* A large enum is a trie: after the opening quote, one stack per distinct next character. */
static void test_large_enum(void **state)
{
    (void)state;
    json_t *vals = json_array();
    for (int i = 0; i < 5000; i++)
        json_array_append_new(vals, json_sprintf("v%d", i));
    json_array_append_new(vals, json_integer(12));
    json_t *j = json_pack("{s:s,s:o}", "type", "string", "enum", vals);
    char err[512] = "";
    struct js_schema *s = js_compile(j, err, sizeof err);
    json_decref(j);
    assert_non_null(s);
    struct grammar *g = gr_compile_schema(s, NULL, err, sizeof err);
    assert_non_null(g);
    struct gr_scratch sc = {0};
    struct gr_state a = {0}, b = {0}, c = {0};
    assert_int_equal(gr_state_start(g, &a, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &a, '"', &b, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &b, 'v', &c, &sc, err, sizeof err), 1);
    assert_true(c.n_stacks <= 10); /* [0-9] */
    gr_state_free(&a), gr_state_free(&b), gr_state_free(&c);
    gr_scratch_free(&sc);
    assert_int_equal(run(g, "\"v4999\""), 1);
    assert_int_equal(run(g, "\"v0\""), 1);
    assert_int_equal(run(g, "\"v5000\""), -1);
    assert_int_equal(run(g, "\"v\""), -1);
    assert_int_equal(run(g, "12"), -1);
    struct gen x;
    gen_init(&x, g, 5);
    for (int i = 0; i < 100; i++) {
        json_t *v = parse(gen_sentence(&x));
        assert_int_equal(js_validate(s, v, err, sizeof err), 0);
        json_decref(v);
    }
    gen_free(&x);
    gr_unref(g);
    js_free(s);
}

static void test_any_of_and_recursion(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{\"value\":1}", "{\"value\":-3,\"children\":[{\"value\":2,\"children\":[]}]}",
        "{\"value\":0,\"children\":[{\"value\":1},{\"value\":2},{\"value\":3}]}"};
    static const char *const bad[] = {
        "{\"children\":[]}", "{\"value\":1,\"children\":[{}]}",
        "{\"value\":0,\"children\":[{\"value\":1},{\"value\":2},{\"value\":3},"};
    expect_docs(TREE, good, 3, 1);
    expect_docs(TREE, bad, 3, -1);
    const char *any =
        "{\"anyOf\":[{\"type\":\"string\",\"format\":\"uuid\"},{\"type\":\"integer\",\"minimum\":-5,"
        "\"maximum\":5},{\"type\":\"null\"}]}";
    static const char *const good2[] = {"\"123e4567-e89b-12d3-A456-426614174000\"", "-5", "5", "null"};
    static const char *const bad2[] = {"\"123e4567-e89b-12d3-a456-42661417400\"", "6", "-6", "\"x\"", "true"};
    expect_docs(any, good2, 4, 1);
    expect_docs(any, bad2, 5, -1);
}

/* Every integer of a window around each bound: the grammar takes it exactly when js_validate does. */
static void check_integers(const char *text, long long from, long long to)
{
    struct js_schema *s = schema(text);
    struct grammar *g = compile(s, text);
    for (long long x = from; x <= to; x++) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", x);
        json_t *v = json_integer(x);
        bool valid = js_validate(s, v, NULL, 0) == 0;
        json_decref(v);
        if ((run(g, buf) == 1) != valid)
            fail_msg("schema %s: %s is %svalid but the grammar %s it", text, buf, valid ? "" : "in",
                     valid ? "refuses" : "takes");
    }
    gr_unref(g);
    js_free(s);
}

static void test_integer_ranges(void **state)
{
    (void)state;
    check_integers("{\"type\":\"integer\",\"exclusiveMinimum\":-17,\"exclusiveMaximum\":1234}", -2000, 2000);
    check_integers("{\"type\":\"integer\",\"minimum\":-1000000,\"maximum\":-999}", -1000100, -990000);
    check_integers("{\"type\":\"integer\",\"minimum\":-1000000,\"maximum\":-999}", -1100, 100);
    check_integers("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":7.5}", -20, 20);
    check_integers("{\"type\":\"integer\",\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":7.5}", -20, 20);
    check_integers("{\"type\":\"number\",\"minimum\":-3.5,\"exclusiveMaximum\":100}", -200, 200);
    /* ranges from a fixed seed, checked around both ends and around powers of ten */
    uint64_t r = 12345;
    for (int i = 0; i < 60; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int digits_lo = (int)(r >> 33) % 8, digits_hi = (int)(r >> 40) % 8;
        long long lo = (long long)((r >> 20) % 100000000ull), hi = (long long)((r >> 5) % 100000000ull);
        for (int k = digits_lo; k < 8; k++)
            lo /= 10;
        for (int k = digits_hi; k < 8; k++)
            hi /= 10;
        if (r & 1)
            lo = -lo;
        if (lo > hi) {
            long long t = lo;
            lo = hi, hi = t;
        }
        char text[128];
        snprintf(text, sizeof text, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        check_integers(text, lo - 30, lo + 30);
        check_integers(text, hi - 30, hi + 30);
        for (long long p = 1; p <= 10000000; p *= 10)
            check_integers(text, p - 2, p + 1), check_integers(text, -p - 1, -p + 2);
    }
    /* the unbounded integer: 18 digits at most, no -0, no leading zeros */
    struct js_schema *s = schema("{\"type\":\"integer\"}");
    struct grammar *g = compile(s, "integer");
    assert_int_equal(run(g, "999999999999999999"), 1);
    assert_int_equal(run(g, "-999999999999999999"), 1);
    assert_int_equal(run(g, "1000000000000000000"), -1);
    assert_int_equal(run(g, "-0"), -1);
    assert_int_equal(run(g, "-0 "), -1);
    assert_int_equal(run(g, "00"), -1);
    assert_int_equal(run(g, "0.5"), -1);
    gr_unref(g);
    js_free(s);
}

static void test_number_documents(void **state)
{
    (void)state;
    const char *n = "{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":3.25}";
    static const char *const good[] = {"-1", "0", "3", "-0.999", "0.5", "2.999999999999999", "-0.0"};
    static const char *const bad[] = {
        "-1.5", "3.25", "3.1", "-2", "4", "1e0", "1.", ".5", "2.1234567890123456"};
    expect_docs(n, good, sizeof good / sizeof *good, 1);
    expect_docs(n, bad, sizeof bad / sizeof *bad, -1);
    const char *x = "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}";
    static const char *const good2[] = {
        "1", "9", "1.5", "8.75", "0.5", "9.5", "0.000000000000001", "9.999999999999999"};
    static const char *const bad2[] = {"0", "10", "0.0", "0.000", "10.0", "-1", "-0.5"};
    expect_docs(x, good2, 8, 1);
    expect_docs(x, bad2, 7, -1);
    /* exclusive bounds near zero cut their intervals: (-2, 0) is -1, -1.ddd and -0.ddd not all zero */
    const char *y = "{\"type\":\"number\",\"exclusiveMinimum\":-2,\"exclusiveMaximum\":0}";
    static const char *const good3[] = {"-1", "-1.5", "-1.999999999999999", "-0.5", "-0.000000000000001"};
    static const char *const bad3[] = {"-0", "-0.0", "-0.000", "0", "-2", "-2.5", "-1.9999999999999999"};
    expect_docs(y, good3, 5, 1);
    expect_docs(y, bad3, 7, -1);
}

/* Whatever number text the grammar takes validates: integers, two-digit fractions and fractions at the
 * ends of each interval, from -5 to 5; and the grammar takes at least want of them. */
static void check_numbers_sound(const char *text, int want)
{
    struct js_schema *s = schema(text);
    struct grammar *g = compile(s, text);
    int taken = 0;
    for (int k = -5; k <= 5; k++)
        for (int f = -3; f < 100; f++) {
            char buf[64];
            const char *sign = k < 0 ? "-" : "";
            int m = k < 0 ? -k : k;
            if (f == -3)
                snprintf(buf, sizeof buf, "%d", k);
            else if (f == -2)
                snprintf(buf, sizeof buf, "%s%d.000000000000001", sign, m);
            else if (f == -1)
                snprintf(buf, sizeof buf, "%s%d.999999999999999", sign, m);
            else
                snprintf(buf, sizeof buf, "%s%d.%02d", sign, m, f);
            if (run(g, buf) != 1)
                continue;
            taken++;
            json_t *v = parse(buf);
            char err[256];
            if (js_validate(s, v, err, sizeof err))
                fail_msg("schema %s: the grammar takes %s, which is invalid: %s", text, buf, err);
            json_decref(v);
        }
    if (taken < want)
        fail_msg("schema %s: the grammar takes only %d of the numbers", text, taken);
    gr_unref(g);
    js_free(s);
}

/* Pairs of bounds: what the grammar takes validates; only bounds that leave no interval are refused. */
static void test_numbers_sound(void **state)
{
    (void)state;
    static const char *const bounds[] = {
        "\"exclusiveMinimum\":0",   "\"exclusiveMaximum\":0", "\"minimum\":0",
        "\"exclusiveMinimum\":-3",  "\"exclusiveMaximum\":3", "\"minimum\":-1.5",
        "\"exclusiveMaximum\":2.5", "\"maximum\":1",          "\"exclusiveMinimum\":1"};
    int n = (int)(sizeof bounds / sizeof *bounds), refused = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            char text[256];
            snprintf(text, sizeof text, "{\"type\":\"number\",%s,%s}", bounds[i], bounds[j]);
            struct js_schema *s = schema(text);
            char err[1300];
            struct grammar *g = gr_compile_schema(s, NULL, err, sizeof err);
            js_free(s);
            if (!g) {
                assert_non_null(strstr(err, "the grammar writes no number within these bounds"));
                refused++;
                continue;
            }
            gr_unref(g);
            check_numbers_sound(text, 1);
        }
    /* some pairs leave no number (exclusiveMinimum 1 and maximum 1), most leave some */
    assert_true(refused > 0 && refused < n * n / 2);
    /* "0." then digits not all zero: 99 two-digit fractions and 0.000000000000001 and 0.999999999999999 */
    check_numbers_sound("{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}", 101);
    /* the 11 integers, and 102 fractions after each of -4 to 4 (not after 5 nor -5) */
    check_numbers_sound("{\"type\":\"number\",\"minimum\":-5,\"maximum\":5}", 11 + 9 * 102);
}

/* Every day of some years (leap by 4, not by 100, by 400), months 00 to 13, days 00 to 32: the grammar
 * takes exactly the dates js_validate takes, except in year 0 (which it never writes). */
static void test_dates(void **state)
{
    (void)state;
    const char *text = "{\"type\":\"string\",\"format\":\"date\"}";
    struct js_schema *s = schema(text);
    struct grammar *g = compile(s, text);
    static const int years[] = {0, 4, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9999};
    int taken = 0;
    for (size_t y = 0; y < sizeof years / sizeof *years; y++)
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                char buf[32];
                snprintf(buf, sizeof buf, "\"%04d-%02d-%02d\"", years[y], m, d);
                json_t *v = parse(buf);
                bool valid = js_validate(s, v, NULL, 0) == 0 && years[y] != 0; /* year 0: tighter */
                json_decref(v);
                if ((run(g, buf) == 1) != valid)
                    fail_msg("%s: js_validate says %d", buf, valid);
                taken += valid;
            }
    assert_int_equal(taken, 4 * 365 + 5 * 366); /* 4, 1996, 2000, 2024 and 2400 are leap years */
    gr_unref(g);
    js_free(s);
}

static void test_formats(void **state)
{
    (void)state;
    static const char *const good[] = {"\"2024-02-29T23:59:59Z\"", "\"1999-12-31T00:00:00.123456789+05:30\"",
                                       "\"2000-01-01T12:00:00-00:00\""};
    static const char *const bad[] = {"\"2024-02-29t23:59:59Z\"",  "\"2024-02-29T24:00:00Z\"",
                                      "\"2024-02-29T23:60:00Z\"",  "\"2024-02-29T23:59:59\"",
                                      "\"2024-02-29T23:59:59.Z\"", "\"2024-02-29T23:59:59+24:00\"",
                                      "\"2023-02-29T23:59:59Z\""};
    expect_docs("{\"type\":\"string\",\"format\":\"date-time\"}", good, 3, 1);
    expect_docs("{\"type\":\"string\",\"format\":\"date-time\"}", bad, 7, -1);
    static const char *const good2[] = {"\"a@b\"", "\"jo.doe+x@example.com\"", "\"\xc3\xa9@\xc3\xa9.fr\""};
    static const char *const bad2[] = {"\"@b\"", "\"a@\"", "\"a@b@c\"", "\"a b@c\"", "\"a\\u0040b\""};
    expect_docs("{\"type\":\"string\",\"format\":\"email\"}", good2, 3, 1);
    expect_docs("{\"type\":\"string\",\"format\":\"email\"}", bad2, 5, -1);
}

static void test_patterns(void **state)
{
    (void)state;
    const char *p = "{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2,4}$\"}";
    static const char *const good[] = {"\"ABC-12\"", "\"XYZ-1234\""};
    static const char *const bad[] = {"\"ABC-1\"", "\"ABC-12345\"", "\"abc-12\"", "\" ABC-12\""};
    expect_docs(p, good, 2, 1);
    expect_docs(p, bad, 4, -1);
    /* searched: any text around the match */
    static const char *const good2[] = {"\"abc\"", "\"xx abbbc \\\" yy\"", "\"\\n\\tabc\""};
    static const char *const bad2[] = {"\"ac\"", "\"ab c\"", "\"\""};
    expect_docs("{\"type\":\"string\",\"pattern\":\"ab+c\"}", good2, 3, 1);
    expect_docs("{\"type\":\"string\",\"pattern\":\"ab+c\"}", bad2, 3, -1);
    /* the decoded string is what the pattern sees: "bar\ then a newline, escaped */
    const char *q = "{\"type\":\"string\",\"pattern\":\"^(foo|\\\"bar\\\\\\\\)\\n?$\"}";
    static const char *const good3[] = {"\"foo\"", "\"\\\"bar\\\\\"", "\"foo\\n\""};
    static const char *const bad3[] = {"\"\"bar\\\"", "\"foo\n\"", "\"foo\\u000A\""};
    expect_docs(q, good3, 3, 1);
    expect_docs(q, bad3, 3, -1);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused(
        "{\"properties\":{\"p\":{\"pattern\":\"(?=a)b\"}}}",
        "unsupported value of 'pattern' at /properties/p: regex: unsupported lookahead at offset 0");
    expect_refused("{\"type\":\"string\",\"anyOf\":[{\"format\":\"date\"},{\"format\":\"uuid\"}]}",
                   "unsupported keyword 'type' beside 'anyOf' at /");
    expect_refused("{\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"null\"}],\"minimum\":1}}}",
                   "unsupported keyword 'minimum' beside 'anyOf' at /properties/a");
    expect_refused("{\"type\":\"string\",\"pattern\":\"^a\",\"format\":\"date\"}",
                   "unsupported keyword 'pattern' beside 'format' at /");
    expect_refused("{\"items\":{\"type\":\"array\",\"maxItems\":1025}}",
                   "unsupported value of 'maxItems' at /items: more than 1024");
    expect_refused("{\"type\":\"array\",\"minItems\":2000}",
                   "unsupported value of 'minItems' at /: more than 1024");
    expect_refused(
        "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}",
        "unsupported value of 'minimum', 'maximum' at /: the grammar writes no number within these "
        "bounds (integers, and fractions where a whole interval between two integers lies within them)");
    expect_refused(
        "{\"type\":\"number\",\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":3}",
        "unsupported value of 'exclusiveMinimum', 'exclusiveMaximum' at /: the grammar writes no number "
        "within these bounds (integers, and fractions where a whole interval between two integers lies "
        "within them)");
    expect_refused("{\"type\":\"integer\",\"minimum\":1e19}",
                   "unsupported value of 'minimum' at /: the grammar writes no number within these bounds "
                   "(integers, and fractions where a whole interval between two integers lies within them)");
    expect_refused(
        "{\"type\":\"integer\",\"exclusiveMaximum\":1e17}",
        "unsupported value of 'exclusiveMaximum' at /: a real bound beyond 2^53 is not compared exactly");
    expect_refused(
        "{\"$defs\":{\"e\":{\"type\":\"string\",\"enum\":[1,2]}},\"properties\":{\"x\":{\"$ref\":"
        "\"#/$defs/e\"}}}",
        "unsupported value of 'enum' at /$defs/e: none of its values conforms to the schema there");
    expect_refused("{\"const\":3,\"type\":\"string\"}",
                   "unsupported value of 'const' at /: none of its values conforms to the schema there");
}

static void test_json_object(void **state)
{
    (void)state;
    char err[256] = "";
    struct grammar *g = gr_compile_json_object(NULL, err, sizeof err);
    assert_non_null(g);
    struct gen x;
    gen_init(&x, g, 42);
    int nonempty = 0;
    for (int i = 0; i < 200; i++) {
        const char *out = gen_sentence(&x);
        json_error_t je;
        json_t *v = json_loads(out, JSON_DECODE_ANY, &je);
        if (!v || !json_is_object(v))
            fail_msg("sentence %d is not a JSON object (%s): %s", i, v ? "" : je.text, out);
        nonempty += json_object_size(v) > 0;
        json_decref(v);
        assert_int_equal(run(g, out), 1);
    }
    assert_true(nonempty > 20 && nonempty < 190);
    gen_free(&x);
    assert_int_equal(run(g, "{}"), 1);
    assert_int_equal(run(g, " {\"a\": [1, {\"b\": null}, -0.5, \"\\u20ac\"], \"\": {}}"), 1);
    assert_int_equal(run(g, "[]"), -1);
    assert_int_equal(run(g, "\"a\""), -1);
    assert_int_equal(run(g, "{\"a\":1,}"), -1);
    assert_int_equal(run(g, "{\"a\"}"), -1);
    assert_int_equal(run(g, "{\"a\":1"), 0);
    /* nesting is bounded: 32 levels of objects and arrays, the outer object included */
    char deep[256];
    for (int levels = 32; levels <= 33; levels++) {
        size_t n = (size_t)snprintf(deep, sizeof deep, "{\"a\":");
        for (int i = 1; i < levels; i++)
            deep[n++] = '[';
        for (int i = 1; i < levels; i++)
            deep[n++] = ']';
        deep[n++] = '}';
        deep[n] = '\0';
        assert_int_equal(run(g, deep), levels == 32 ? 1 : -1);
    }
    gr_unref(g);
}

static void test_choice(void **state)
{
    (void)state;
    const char *const choices[] = {"yes", "no", "maybe so", "no way", "no"};
    char err[256] = "";
    struct grammar *g = gr_compile_choice(choices, 5, NULL, err, sizeof err);
    assert_non_null(g);
    struct gen x;
    gen_init(&x, g, 3);
    int seen[4] = {0};
    for (int i = 0; i < 100; i++) {
        const char *out = gen_sentence(&x);
        int k = -1;
        for (int j = 0; j < 4; j++)
            if (!strcmp(out, choices[j]))
                k = j;
        if (k < 0)
            fail_msg("not a choice: '%s'", out);
        seen[k]++;
    }
    for (int j = 0; j < 4; j++)
        assert_true(seen[j] > 0);
    gen_free(&x);
    assert_int_equal(run(g, "no"), 1);
    assert_int_equal(run(g, "no way"), 1);
    assert_int_equal(run(g, "n"), 0);
    assert_int_equal(run(g, "no "), 0);
    assert_int_equal(run(g, "yes "), -1);
    assert_int_equal(run(g, "\"yes\""), -1);
    assert_int_equal(run(g, " yes"), -1);
    gr_unref(g);
    /* many choices share their prefixes (a trie): a state holds a stack per next byte, not per choice */
    enum { MANY = 6000 };
    char(*many)[16] = malloc(MANY * sizeof *many);
    const char **ptrs = malloc(MANY * sizeof *ptrs);
    for (int i = 0; i < MANY; i++)
        snprintf(many[i], sizeof many[i], "label-%d", i * 7), ptrs[i] = many[i];
    g = gr_compile_choice(ptrs, MANY, NULL, err, sizeof err);
    assert_non_null(g);
    struct gr_scratch sc = {0};
    struct gr_state st = {0};
    assert_int_equal(gr_state_start(g, &st, &sc, err, sizeof err), 1);
    assert_int_equal(st.n_stacks, 1);
    gr_state_free(&st);
    gr_scratch_free(&sc);
    assert_int_equal(run(g, "label-41993"), 1);
    assert_int_equal(run(g, "label-41994"), -1);
    assert_int_equal(run(g, "label-4199"), 0);
    assert_int_equal(run(g, "label-7"), 1);
    assert_int_equal(run(g, "label-70"), 1);
    assert_int_equal(run(g, "label-7a"), -1);
    gr_unref(g);
    free(many);
    free(ptrs);
    assert_null(gr_compile_choice(choices, 0, NULL, err, sizeof err));
    assert_string_equal(err, "choice: expected at least one choice");
    const char *const empty[] = {"a", ""};
    assert_null(gr_compile_choice(empty, 2, NULL, err, sizeof err));
    assert_string_equal(err, "choice: choice 1 is empty");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sentences_validate),
        cmocka_unit_test(test_generator_variety),
        cmocka_unit_test(test_flat_documents),
        cmocka_unit_test(test_optional_and_arrays),
        cmocka_unit_test(test_enum_const_documents),
        cmocka_unit_test(test_large_enum),
        cmocka_unit_test(test_any_of_and_recursion),
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_number_documents),
        cmocka_unit_test(test_numbers_sound),
        cmocka_unit_test(test_dates),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
