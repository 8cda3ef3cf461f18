/* engine/grammar_mask.c, grammar_vocab.c and grammar_match.c: token masks on small made-up
 * vocabularies, checked bit for bit against a brute-force check of every id (its bytes advanced one
 * by one from the state with gr_state_advance; an eos id iff the state is complete), in states
 * reached by random valid byte walks of hand-built grammars whose tokens cross rule boundaries
 * ('",' closing a string and going on, '}]', UTF-8 characters split across tokens). Also the memo's
 * fallback, the mask cache (hits, LRU eviction, a cached mask equal to a fresh one), accepting ids
 * and several threads masking one grammar; random grammars likewise. (The real Qwen3 vocabulary:
 * test_grammar_mask_qwen3.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "grammar_test.h"

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A grammar with a made-up vocabulary: toks[id] (NULL: unusable), eos ids with bytes of their own
 * (which must not matter), and a mask wider than the ids. */
struct fx {
    struct grammar *g;
    struct gr_vocab *v;
    char **toks;
    size_t *lens;
    int32_t n, vocab, eos[2];
};

/* -1: refused; else 1 and *out is the state after bytes[0..n) from in. */
static int advance_all(const struct grammar *g, const struct gr_state *in, const char *bytes, size_t n,
                       struct gr_state *out, struct gr_scratch *sc)
{
    char err[128];
    struct gr_state a = {0}, b = {0};
    assert_int_equal(gr_state_copy(in, &a), 0);
    for (size_t i = 0; i < n; i++) {
        int r = gr_state_advance(g, &a, (uint8_t)bytes[i], &b, sc, err, sizeof err);
        assert_true(r >= 0);
        if (r == 0) {
            gr_state_free(&a), gr_state_free(&b);
            return -1;
        }
        struct gr_state t = a;
        a = b;
        b = t;
    }
    if (out)
        assert_int_equal(gr_state_copy(&a, out), 0);
    gr_state_free(&a), gr_state_free(&b);
    return 1;
}

/* The bytes accepted from st, into acc[256]. Returns how many. */
static int accepted_bytes(const struct grammar *g, const struct gr_state *st, bool *acc,
                          struct gr_scratch *sc)
{
    char err[128];
    struct gr_state t = {0};
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int r = gr_state_advance(g, st, (uint8_t)c, &t, sc, err, sizeof err);
        if (r < 0)
            fail_msg("gr_state_advance: %s", err);
        acc[c] = r == 1;
        n += r == 1;
    }
    gr_state_free(&t);
    return n;
}

/* A random valid byte walk of at most max bytes from the start of g (stops early where no byte goes
 * on); structural bytes preferred so that walks leave strings. Returns its length. */
static size_t random_walk(const struct grammar *g, uint64_t *rng, char *out, size_t max)
{
    static const char preferred[] = "{}[],:\" \\0123456789.-abtrufalsenul";
    struct gr_scratch sc = {0};
    struct gr_state st = {0}, nx = {0};
    char err[128];
    assert_int_equal(gr_state_start(g, &st, &sc, err, sizeof err), 1);
    size_t n = 0;
    while (n < max) {
        bool acc[256];
        if (!accepted_bytes(g, &st, acc, &sc))
            break;
        int pick = -1;
        if (rng_next(rng) % 10 < 7) {
            int cands[64], nc = 0;
            for (const char *p = preferred; *p; p++)
                if (acc[(uint8_t)*p])
                    cands[nc++] = (uint8_t)*p;
            if (nc)
                pick = cands[rng_next(rng) % (uint64_t)nc];
        }
        if (pick < 0) {
            int cands[256], nc = 0;
            for (int c = 0; c < 256; c++)
                if (acc[c])
                    cands[nc++] = c;
            pick = cands[rng_next(rng) % (uint64_t)nc];
        }
        out[n++] = (char)pick;
        assert_int_equal(gr_state_advance(g, &st, (uint8_t)pick, &nx, &sc, err, sizeof err), 1);
        struct gr_state t = st;
        st = nx;
        nx = t;
    }
    gr_state_free(&st), gr_state_free(&nx), gr_scratch_free(&sc);
    return n;
}

static void add_tok(struct fx *f, const char *bytes, size_t len)
{
    f->toks = realloc(f->toks, ((size_t)f->n + 1) * sizeof *f->toks);
    f->lens = realloc(f->lens, ((size_t)f->n + 1) * sizeof *f->lens);
    f->toks[f->n] = NULL;
    f->lens[f->n] = len;
    if (bytes) {
        f->toks[f->n] = malloc(len + 1);
        memcpy(f->toks[f->n], bytes, len);
    }
    f->n++;
}

/* The vocabulary of f: every single byte, the hand-written tokens, pieces of random valid walks of g
 * of at most walk_max bytes (tokens that fit somewhere), random strings over alphabet, unusable and
 * empty ids, a duplicate, and two eos ids; then g rebuilt against it by make. */
static void make_fx(struct fx *f, struct grammar *(*make)(const struct gr_vocab *), const char *const *hand,
                    const char *alphabet, uint64_t seed, int32_t vocab_extra, size_t walk_max)
{
    memset(f, 0, sizeof *f);
    struct grammar *g0 = make(NULL);
    uint64_t rng = seed;
    for (int c = 0; c < 256; c++) {
        char b = (char)c;
        add_tok(f, &b, 1);
    }
    add_tok(f, NULL, 0);
    add_tok(f, "", 0);
    for (const char *const *h = hand; *h; h++)
        add_tok(f, *h, strlen(*h));
    add_tok(f, hand[0], strlen(hand[0])); /* a duplicate */
    char walk[128];
    for (int i = 0; i < 400; i++) {
        size_t n = random_walk(g0, &rng, walk, walk_max < sizeof walk ? walk_max : sizeof walk);
        if (n < 2)
            continue;
        size_t len = 2 + rng_next(&rng) % 7;
        if (len > n)
            len = n;
        size_t at = rng_next(&rng) % (n - len + 1);
        add_tok(f, walk + at, len);
        if (i % 41 == 0)
            add_tok(f, NULL, 0);
    }
    size_t na = strlen(alphabet);
    for (int i = 0; i < 100; i++) {
        char t[8];
        size_t len = 1 + rng_next(&rng) % 6;
        for (size_t k = 0; k < len; k++)
            t[k] = alphabet[rng_next(&rng) % na];
        add_tok(f, t, len);
    }
    f->eos[0] = f->n;
    add_tok(f, "}", 1);
    f->eos[1] = f->n;
    add_tok(f, "<eos>", 5);
    f->vocab = f->n + vocab_extra;
    char err[256];
    f->v = gr_vocab_from_bytes((const char *const *)f->toks, f->lens, f->n, f->vocab, f->eos, 2, err,
                               sizeof err);
    if (!f->v)
        fail_msg("gr_vocab_from_bytes: %s", err);
    gr_unref(g0);
    f->g = make(f->v);
}

static void free_fx(struct fx *f)
{
    gr_unref(f->g);
    gr_vocab_free(f->v);
    for (int32_t i = 0; i < f->n; i++)
        free(f->toks[i]);
    free(f->toks);
    free(f->lens);
}

static bool is_eos(const struct fx *f, int32_t id)
{
    return id == f->eos[0] || id == f->eos[1];
}

/* How many ids of mask differ from the brute-force verdict in state st (the first in *bad). */
static int mismatches(const struct fx *f, const struct gr_state *st, const uint32_t *mask, int32_t *bad)
{
    struct gr_scratch sc = {0};
    int n = 0;
    for (int32_t id = 0; id < f->vocab; id++) {
        bool want;
        if (is_eos(f, id))
            want = st->complete;
        else if (id >= f->n || !f->toks[id] || !f->lens[id])
            want = false;
        else
            want = advance_all(f->g, st, f->toks[id], f->lens[id], NULL, &sc) == 1;
        if (want != ((mask[id >> 5] >> (id & 31)) & 1u) && !n++)
            *bad = id;
    }
    for (int32_t id = f->vocab; id < gr_vocab_mask_words(f->v) * 32; id++)
        if (((mask[id >> 5] >> (id & 31)) & 1u) && !n++)
            *bad = id;
    gr_scratch_free(&sc);
    return n;
}

/* Every id of mask against the brute-force verdict in state st. */
static void check_mask(const struct fx *f, const struct gr_state *st, const uint32_t *mask, const char *where)
{
    struct gr_scratch sc = {0};
    for (int32_t id = 0; id < f->vocab; id++) {
        bool want;
        if (is_eos(f, id))
            want = st->complete;
        else if (id >= f->n || !f->toks[id] || !f->lens[id])
            want = false;
        else
            want = advance_all(f->g, st, f->toks[id], f->lens[id], NULL, &sc) == 1;
        bool got = (mask[id >> 5] >> (id & 31)) & 1u;
        if (got != want)
            fail_msg("%s: id %d (%.*s) is %s but should be %s", where, (int)id,
                     id < f->n && f->toks[id] ? (int)f->lens[id] : 0,
                     id < f->n && f->toks[id] ? f->toks[id] : "", got ? "allowed" : "refused",
                     want ? "allowed" : "refused");
    }
    for (int32_t id = f->vocab; id < gr_vocab_mask_words(f->v) * 32; id++)
        assert_false((mask[id >> 5] >> (id & 31)) & 1u);
    gr_scratch_free(&sc);
}

/* Random walks of f's grammar; at every step the matcher's mask, and at every third step a walk
 * without memo and a walk whose memo is bounded by small_bytes, against the brute force. Returns how
 * many computations of the latter went without the memo. */
static int64_t check_walks(const struct fx *f, uint64_t seed, int walks, size_t max_len, size_t small_bytes)
{
    int words = gr_vocab_mask_words(f->v);
    uint32_t *mask = malloc((size_t)words * sizeof *mask), *other = malloc((size_t)words * sizeof *other);
    struct gr_walk *plain = gr_walk_new(f->g), *small = gr_walk_new(f->g);
    assert_non_null(plain), assert_non_null(small);
    gr_walk_set_max_bytes(plain, 0);
    gr_walk_set_max_bytes(small, small_bytes);
    struct gr_scratch sc = {0};
    char err[256], walk[128], where[300];
    uint64_t rng = seed;
    int computed = 0;
    for (int w = 0; w < walks; w++) {
        size_t n = random_walk(f->g, &rng, walk, 1 + rng_next(&rng) % max_len);
        struct gr_matcher *m = gr_matcher_new(f->g);
        struct gr_state st = {0}, nx = {0};
        assert_int_equal(gr_state_start(f->g, &st, &sc, err, sizeof err), 1);
        for (size_t i = 0;; i++) {
            snprintf(where, sizeof where, "walk %d after '%.*s'", w, (int)i, walk);
            assert_int_equal(gr_matcher_complete(m), st.complete);
            if (gr_matcher_mask(m, mask, err, sizeof err) < 0)
                fail_msg("gr_matcher_mask: %s", err);
            check_mask(f, &st, mask, where);
            if (i % 3 == 0) {
                assert_int_equal(gr_walk_mask(plain, f->v, &st, other, err, sizeof err), 0);
                assert_memory_equal(mask, other, (size_t)words * sizeof *mask);
                assert_int_equal(gr_walk_mask(small, f->v, &st, other, err, sizeof err), 0);
                assert_memory_equal(mask, other, (size_t)words * sizeof *mask);
            }
            if (i == n)
                break;
            assert_int_equal(gr_matcher_accept_bytes(m, walk + i, 1), 0);
            assert_int_equal(gr_state_advance(f->g, &st, (uint8_t)walk[i], &nx, &sc, err, sizeof err), 1);
            struct gr_state t = st;
            st = nx;
            nx = t;
        }
        gr_state_free(&st), gr_state_free(&nx);
        gr_matcher_free(m);
        computed += n / 3 + 1;
    }
    printf("# %d of %d computations without the memo under a bound of %zu bytes\n",
           (int)gr_walk_fallbacks(small), computed, small_bytes);
    assert_int_equal(gr_walk_fallbacks(plain), computed);
    int64_t fallbacks = gr_walk_fallbacks(small);
    gr_scratch_free(&sc);
    gr_walk_free(plain), gr_walk_free(small);
    free(mask), free(other);
    return fallbacks;
}

static struct grammar *json(const struct gr_vocab *v)
{
    char err[256];
    struct grammar *g = gt_json_grammar(v, err, sizeof err);
    if (!g)
        fail_msg("gt_json_grammar: %s", err);
    return g;
}

static const char *const json_hand[] = {
    "\",",      "\", \"",   "\":",      "\": \"",   "\"}",          "\"]",    "}]",       "]}",
    "}}",       "},",       "}, {",     "{\"",      "[\"",          "[{",     "[[",       "],",
    "\\\"",     "\\u00",    "e9",       "\\n",      "true",         "tru",    "e,",       "null]",
    "-0.",      ".5",       "12",       "0,",       "00",           "  ",     "\n ",      "\xc3",
    "\xa9",     "\xc3\xa9", "\xe2\x82", "\x82\xac", "\xe2\x82\xac", "\xac\"", "\xf0\x9f", "\x98\x80\"",
    "\xed\xa0", "\xc0\xaf", NULL};

/* root ::= '[' list ']' | '[' root ']';  list ::= item ',' ws list | item;  item ::= [a-c] */
static struct grammar *nested_lists(const struct gr_vocab *v)
{
    struct gr_builder b;
    grb_init(&b);
    struct gr_seq s = {0};
    int32_t ws = grb_ws(&b);
    int32_t list = grb_rule(&b, "list"), item = grb_rule(&b, "item"), root = grb_rule(&b, "root");
    grs_range(&b, &s, 'a', 'c'), grb_alt(&b, item, &s);
    grs_rule(&b, &s, item), grs_byte(&b, &s, ','), grs_rule(&b, &s, ws), grs_rule(&b, &s, list);
    grb_alt(&b, list, &s);
    grs_rule(&b, &s, item), grb_alt(&b, list, &s);
    grs_byte(&b, &s, '['), grs_rule(&b, &s, list), grs_byte(&b, &s, ']'), grb_alt(&b, root, &s);
    grs_byte(&b, &s, '['), grs_rule(&b, &s, root), grs_byte(&b, &s, ']'), grb_alt(&b, root, &s);
    grs_free(&s);
    char err[256];
    struct grammar *g = gr_finish(&b, root, v, err, sizeof err);
    if (!g)
        fail_msg("gr_finish: %s", err);
    return g;
}

static const char *const lists_hand[] = {"[a", "a,",  ", ", ",b]",  "a]", "]]",
                                         "[[", "]],", "  ", "[[a,", NULL};

/* Alternatives that overlap for a while, so states hold several stacks:
 * root ::= as 'b' | 'a' as 'c' | ab;  as ::= 'a' as | "";  ab ::= "ab" ab | "ab" */
static struct grammar *overlapping(const struct gr_vocab *v)
{
    struct gr_builder b;
    grb_init(&b);
    struct gr_seq s = {0};
    int32_t root = grb_rule(&b, "root"), as = grb_rule(&b, "as"), ab = grb_rule(&b, "ab");
    grs_rule(&b, &s, as), grs_byte(&b, &s, 'b'), grb_alt(&b, root, &s);
    grs_byte(&b, &s, 'a'), grs_rule(&b, &s, as), grs_byte(&b, &s, 'c'), grb_alt(&b, root, &s);
    grs_rule(&b, &s, ab), grb_alt(&b, root, &s);
    grs_byte(&b, &s, 'a'), grs_rule(&b, &s, as), grb_alt(&b, as, &s);
    grb_alt(&b, as, &s);
    grs_lit(&b, &s, "ab", 2), grs_rule(&b, &s, ab), grb_alt(&b, ab, &s);
    grs_lit(&b, &s, "ab", 2), grb_alt(&b, ab, &s);
    grs_free(&s);
    char err[256];
    struct grammar *g = gr_finish(&b, root, v, err, sizeof err);
    if (!g)
        fail_msg("gr_finish: %s", err);
    return g;
}

static const char *const overlapping_hand[] = {"aa", "ab", "abab", "ac", "aaa", "ba", "bab", "aab", NULL};

static void test_json_masks(void **state)
{
    (void)state;
    struct fx f;
    make_fx(&f, json, json_hand, "{}[],:\" \\abeflnrtu019.-\xc3\xa9\xe2\x82\xac", 1, 45, 128);
    /* the bound is met midway through some computations, which then start again without the memo */
    assert_true(check_walks(&f, 11, 40, 60, 20000) > 0);
    free_fx(&f);
}

static void test_lists_masks(void **state)
{
    (void)state;
    struct fx f;
    make_fx(&f, nested_lists, lists_hand, "[],abc d", 2, 3, 128);
    check_walks(&f, 12, 30, 40, 20000);
    free_fx(&f);
}

static void test_overlapping_masks(void **state)
{
    (void)state;
    struct fx f;
    make_fx(&f, overlapping, overlapping_hand, "abc", 3, 0, 128);
    check_walks(&f, 13, 30, 20, 20000);
    free_fx(&f);
}

/* Random grammars over a few bytes (some of them UTF-8 lead and continuation bytes, NUL and 0xFF): up
 * to 8 rules of up to 3 alternatives of up to 4 elements, each a random byte class or a reference to
 * a random rule; those gr_finish refuses (a cycle that reads no byte) are drawn again. The same seed
 * gives the same grammar. */
static uint64_t grammar_seed;
static const uint8_t random_bytes[] = {'a', 'b', 'c', 'd', 'e', 0x00, 0x80, 0xc3, 0xff};

/* Whether random valid walks of 14 bytes from the start of g stay well within the limits of a state
 * (an ambiguous grammar can double its stacks at every byte). */
static bool tame(const struct grammar *g, uint64_t rng)
{
    struct gr_scratch sc = {0};
    struct gr_state st = {0}, nx[sizeof random_bytes] = {{0}};
    char err[128];
    bool ok = true;
    for (int w = 0; w < 100 && ok; w++) {
        ok = gr_state_start(g, &st, &sc, err, sizeof err) == 1;
        for (int i = 0; i < 14 && ok; i++) {
            int live[sizeof random_bytes], n_live = 0;
            for (size_t k = 0; k < sizeof random_bytes && ok; k++) {
                int r = gr_state_advance(g, &st, random_bytes[k], &nx[k], &sc, err, sizeof err);
                ok = r >= 0 && nx[k].n_stacks < 256;
                if (r == 1)
                    live[n_live++] = (int)k;
            }
            if (!ok || !n_live)
                break;
            int k = live[rng_next(&rng) % (uint64_t)n_live];
            struct gr_state t = st;
            st = nx[k];
            nx[k] = t;
        }
    }
    gr_state_free(&st), gr_scratch_free(&sc);
    for (size_t k = 0; k < sizeof random_bytes; k++)
        gr_state_free(&nx[k]);
    return ok;
}

static struct grammar *random_grammar(const struct gr_vocab *v)
{
    uint64_t rng = grammar_seed;
    for (;;) {
        struct gr_builder b;
        grb_init(&b);
        struct gr_seq s = {0};
        int32_t n_rules = 2 + (int32_t)(rng_next(&rng) % 7), rules[8];
        for (int32_t r = 0; r < n_rules; r++) {
            char name[16];
            snprintf(name, sizeof name, "r%d", (int)r);
            rules[r] = grb_rule(&b, name);
        }
        for (int32_t r = 0; r < n_rules; r++) {
            int n_alts = 1 + (int)(rng_next(&rng) % 3);
            for (int a = 0; a < n_alts; a++) {
                int n_el = (int)(rng_next(&rng) % 5);
                for (int e = 0; e < n_el; e++) {
                    if (rng_next(&rng) % 10 < 6) {
                        struct gr_class c = {{0}};
                        for (size_t k = 0; k < sizeof random_bytes; k++)
                            if (rng_next(&rng) % 10 < 4)
                                c.bits[random_bytes[k] >> 5] |= 1u << (random_bytes[k] & 31);
                        c.bits['a' >> 5] |= rng_next(&rng) % 2 ? 0 : 1u << ('a' & 31);
                        grs_class(&b, &s, &c);
                    } else {
                        grs_rule(&b, &s, rules[rng_next(&rng) % (uint64_t)n_rules]);
                    }
                }
                grb_alt(&b, rules[r], &s);
            }
        }
        grs_free(&s);
        char err[256];
        struct grammar *g = gr_finish(&b, rules[0], v, err, sizeof err);
        if (g && tame(g, rng))
            return g;
        gr_unref(g);
    }
}

static void test_random_grammars(void **state)
{
    (void)state;
    char alphabet[sizeof random_bytes + 1];
    memcpy(alphabet, random_bytes, sizeof random_bytes);
    alphabet[0] = 'a', alphabet[5] = 'b'; /* no NUL: the alphabet is a C string */
    alphabet[sizeof random_bytes] = 0;
    for (uint64_t i = 0; i < 24; i++) {
        grammar_seed = 1000 + i * 7919;
        struct fx f;
        const char *const hand[] = {"ab", NULL};
        make_fx(&f, random_grammar, hand, alphabet, 20 + i, 5, 8);
        check_walks(&f, 30 + i, 6, 8, 20000);
        free_fx(&f);
    }
}

static int32_t id_of(const struct fx *f, const char *s)
{
    for (int32_t id = 0; id < f->n; id++)
        if (f->toks[id] && f->lens[id] == strlen(s) && !memcmp(f->toks[id], s, f->lens[id]) && !is_eos(f, id))
            return id;
    fail_msg("no token '%s'", s);
    return -1;
}

static bool allowed(const uint32_t *mask, int32_t id)
{
    return (mask[id >> 5] >> (id & 31)) & 1u;
}

static void test_accept(void **state)
{
    (void)state;
    struct fx f;
    make_fx(&f, json, json_hand, "{}[]", 4, 45, 128);
    int words = gr_vocab_mask_words(f.v);
    uint32_t *mask = malloc((size_t)words * sizeof *mask), *before = malloc((size_t)words * sizeof *before);
    char err[256];
    struct gr_matcher *m = gr_matcher_new(f.g);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "[{")), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\"")), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\xc3")), 0); /* half a character */
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    assert_true(allowed(mask, id_of(&f, "\xa9")));
    assert_false(allowed(mask, id_of(&f, "\xc3\xa9")));
    assert_false(allowed(mask, id_of(&f, "\"")));
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\xa9")), 0);
    /* a refused token leaves the matcher as it was */
    assert_int_equal(gr_matcher_mask(m, before, err, sizeof err), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\xed\xa0")), -1); /* a surrogate */
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\"]")), -1);      /* a key needs ':' */
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    assert_memory_equal(mask, before, (size_t)words * sizeof *mask);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\": \"")), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\xe2\x82")), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "\xac\"")), 0);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "}]")), 0);
    /* unusable ids: unused, empty, beyond the tokenizer, beyond the mask, negative */
    assert_int_equal(gr_matcher_accept(m, 256), -1);
    assert_int_equal(gr_matcher_accept(m, 257), -1);
    assert_int_equal(gr_matcher_accept(m, f.n + 1), -1);
    assert_int_equal(gr_matcher_accept(m, f.vocab), -1);
    assert_int_equal(gr_matcher_accept(m, -1), -1);
    assert_true(gr_matcher_complete(m));
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    assert_true(allowed(mask, f.eos[0]) && allowed(mask, f.eos[1]));
    assert_true(allowed(mask, id_of(&f, "  ")));
    assert_int_equal(gr_matcher_accept(m, f.eos[1]), 0);
    assert_true(gr_matcher_ended(m));
    assert_int_equal(gr_matcher_accept(m, id_of(&f, " ")), -1);
    assert_int_equal(gr_matcher_accept(m, f.eos[0]), -1);
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    for (int i = 0; i < words; i++)
        assert_int_equal(mask[i], 0);
    gr_matcher_free(m);
    /* eos before the end is refused */
    m = gr_matcher_new(f.g);
    assert_int_equal(gr_matcher_accept(m, id_of(&f, "[{")), 0);
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    assert_false(allowed(mask, f.eos[0]));
    assert_true(allowed(mask, id_of(&f, "}")));
    assert_false(allowed(mask, id_of(&f, "]}")));
    assert_int_equal(gr_matcher_accept(m, f.eos[0]), -1); /* its bytes "}" do not matter */
    assert_false(gr_matcher_ended(m));
    gr_matcher_free(m);
    /* a grammar without a vocabulary cannot mask or accept ids */
    struct grammar *bare = json(NULL);
    m = gr_matcher_new(bare);
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), -1);
    assert_non_null(strstr(err, "no vocabulary"));
    assert_int_equal(gr_matcher_accept(m, 0), -1);
    gr_matcher_free(m);
    gr_unref(bare);
    free(mask), free(before);
    free_fx(&f);
}

static void test_vocab_refusals(void **state)
{
    (void)state;
    const char *toks[] = {"a", "b"};
    size_t lens[] = {1, 1};
    char err[256];
    int32_t eos = 5;
    assert_null(gr_vocab_from_bytes(toks, lens, 2, 5, &eos, 1, err, sizeof err));
    assert_string_equal(err, "eos id 5 is outside the vocabulary [0, 5)");
    struct gr_vocab *v = gr_vocab_from_bytes(toks, lens, 2, 6, &eos, 1, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(gr_vocab_mask_words(v), 1);
    gr_vocab_free(v);
    gr_vocab_free(NULL);
    /* a mask narrower than the tokenizer: ids beyond it are never allowed */
    const char *lists[] = {"[a]", "[b]", "[c]"};
    size_t list_lens[] = {3, 3, 3};
    v = gr_vocab_from_bytes(lists, list_lens, 3, 2, NULL, 0, err, sizeof err);
    assert_non_null(v);
    struct grammar *g = nested_lists(v);
    struct gr_matcher *m = gr_matcher_new(g);
    uint32_t mask;
    assert_int_equal(gr_matcher_mask(m, &mask, err, sizeof err), 0);
    assert_int_equal(mask, 3);
    assert_int_equal(gr_matcher_accept(m, 2), -1);
    assert_int_equal(gr_matcher_accept(m, 1), 0);
    assert_true(gr_matcher_complete(m));
    gr_matcher_free(m);
    gr_unref(g);
    gr_vocab_free(v);
}

/* The cache: hits on a repeated state (whatever the path to it), a cached mask equal to a fresh one,
 * and least-recently-used eviction within the bound. */
static void test_cache(void **state)
{
    (void)state;
    struct fx f;
    /* wide masks (they dominate an entry's size) so that the bound counts entries */
    make_fx(&f, json, json_hand, "{}[]", 5, 1 << 17, 128);
    int words = gr_vocab_mask_words(f.v);
    size_t mb = (size_t)words * sizeof(uint32_t);
    uint32_t *mask = malloc(mb), *fresh = malloc(mb);
    char err[256];
    struct gr_stats st;
    struct gr_matcher *a = gr_matcher_new(f.g), *b = gr_matcher_new(f.g), *c = gr_matcher_new(f.g);
    assert_int_equal(gr_matcher_accept_bytes(a, "\"ab", 3), 0);
    assert_int_equal(gr_matcher_accept_bytes(b, "[", 1), 0);
    assert_int_equal(gr_matcher_accept_bytes(c, "{", 1), 0);
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 0 && st.misses == 1 && st.cache_bytes > mb && st.cache_bytes < mb + 4096);
    assert_true(st.compute_s >= 0);
    size_t one = st.cache_bytes;
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 1 && st.misses == 1);
    /* "\"abcd" waits for what "\"ab" waits for: the same state, from another matcher */
    struct gr_matcher *a2 = gr_matcher_new(f.g);
    assert_int_equal(gr_matcher_accept_bytes(a2, "\"abcd", 5), 0);
    assert_int_equal(gr_matcher_mask(a2, fresh, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 2 && st.misses == 1);
    assert_memory_equal(mask, fresh, mb);
    /* the cached mask equals one computed afresh */
    struct gr_walk *w = gr_walk_new(f.g);
    struct gr_state s = {0};
    struct gr_scratch sc = {0};
    assert_int_equal(gr_state_start(f.g, &s, &sc, err, sizeof err), 1);
    assert_int_equal(advance_all(f.g, &s, "\"ab", 3, &s, &sc), 1);
    assert_int_equal(gr_walk_mask(w, f.v, &s, fresh, err, sizeof err), 0);
    assert_memory_equal(mask, fresh, mb);
    check_mask(&f, &s, mask, "cached");
    /* room for two entries: a, b, a (hit), c evicts b, a (hit), b evicts c */
    gr_cache_set_max_bytes(f.g, one * 5 / 2);
    assert_int_equal(gr_matcher_mask(b, mask, err, sizeof err), 0);
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    assert_int_equal(gr_matcher_mask(c, mask, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 3 && st.misses == 3);
    assert_true(st.cache_bytes <= one * 5 / 2);
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    assert_int_equal(gr_matcher_mask(b, mask, err, sizeof err), 0);
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 5 && st.misses == 4);
    assert_int_equal(gr_matcher_mask(c, mask, err, sizeof err), 0);
    gr_get_stats(f.g, &st);
    assert_true(st.hits == 5 && st.misses == 5);
    assert_true(st.cache_bytes <= one * 5 / 2);
    /* a bound below one entry keeps nothing, and masks stay right */
    gr_cache_set_max_bytes(f.g, 100);
    assert_int_equal(gr_matcher_mask(a, mask, err, sizeof err), 0);
    check_mask(&f, &s, mask, "uncached");
    gr_get_stats(f.g, &st);
    assert_true(st.cache_bytes == 0 && st.misses == 6);
    gr_state_free(&s), gr_scratch_free(&sc);
    gr_walk_free(w);
    gr_matcher_free(a), gr_matcher_free(a2), gr_matcher_free(b), gr_matcher_free(c);
    free(mask), free(fresh);
    free_fx(&f);
}

struct thread_arg {
    const struct fx *f;
    uint64_t seed;
    int masks, wrong;
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    int words = gr_vocab_mask_words(a->f->v);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    char err[256], walk[64];
    struct gr_scratch sc = {0};
    uint64_t rng = a->seed;
    for (int w = 0; w < 12; w++) {
        size_t n = random_walk(a->f->g, &rng, walk, 24);
        struct gr_matcher *m = gr_matcher_new(a->f->g);
        struct gr_state st = {0};
        assert_int_equal(gr_state_start(a->f->g, &st, &sc, err, sizeof err), 1);
        for (size_t i = 0; i <= n; i++) {
            assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
            a->masks++;
            int32_t bad;
            a->wrong += mismatches(a->f, &st, mask, &bad);
            if (i < n) {
                assert_int_equal(gr_matcher_accept_bytes(m, walk + i, 1), 0);
                assert_int_equal(advance_all(a->f->g, &st, walk + i, 1, &st, &sc), 1);
            }
        }
        gr_state_free(&st);
        gr_matcher_free(m);
    }
    gr_scratch_free(&sc);
    free(mask);
    return NULL;
}

/* Threads masking one grammar, each checked against the brute force; walks from the same seeds meet
 * the same states, so threads hit what others computed. */
static void test_threads(void **state)
{
    (void)state;
    struct fx f;
    make_fx(&f, json, json_hand, "{}[],:\" ab", 6, 45, 128);
    enum { N = 4 };
    pthread_t th[N];
    struct thread_arg args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct thread_arg){.f = &f, .seed = 100 + (uint64_t)(i % 2)};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        total += args[i].masks;
        assert_int_equal(args[i].wrong, 0);
    }
    struct gr_stats st;
    gr_get_stats(f.g, &st);
    assert_int_equal((int)(st.hits + st.misses), total);
    assert_true(st.hits > 0);
    free_fx(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_masks),        cmocka_unit_test(test_lists_masks),
        cmocka_unit_test(test_overlapping_masks), cmocka_unit_test(test_accept),
        cmocka_unit_test(test_vocab_refusals),    cmocka_unit_test(test_cache),
        cmocka_unit_test(test_threads),           cmocka_unit_test(test_random_grammars),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
