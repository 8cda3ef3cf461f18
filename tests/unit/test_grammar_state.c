/* engine/grammar_build.c and grammar_state.c: building rules, matching bytes through sets of stacks
 * (nesting, right-recursive repetition, bounded whitespace, UTF-8 characters), and gr_finish's
 * refusals of grammars whose matching would not terminate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "grammar_test.h"

/* root ::= '[' list ']' | '[' root ']';  list ::= item ',' ws list | item;  item ::= [a-c] */
static struct grammar *nested_lists(void)
{
    struct gr_builder b;
    grb_init(&b);
    struct gr_seq s = {0};
    int32_t ws = grb_ws(&b);
    int32_t list = grb_rule(&b, "list"), item = grb_rule(&b, "item"), root = grb_rule(&b, "root");
    grs_range(&b, &s, 'a', 'c');
    grb_alt(&b, item, &s);
    grs_rule(&b, &s, item);
    grs_byte(&b, &s, ',');
    grs_rule(&b, &s, ws);
    grs_rule(&b, &s, list);
    grb_alt(&b, list, &s);
    grs_rule(&b, &s, item);
    grb_alt(&b, list, &s);
    grs_byte(&b, &s, '[');
    grs_rule(&b, &s, list);
    grs_byte(&b, &s, ']');
    grb_alt(&b, root, &s);
    grs_byte(&b, &s, '[');
    grs_rule(&b, &s, root);
    grs_byte(&b, &s, ']');
    grb_alt(&b, root, &s);
    grs_free(&s);
    char err[256] = "";
    struct grammar *g = gr_finish(&b, root, NULL, err, sizeof err);
    if (!g)
        fail_msg("gr_finish: %s", err);
    return g;
}

/* -1: refused at some byte; 0: accepted but incomplete; 1: accepted and complete. */
static int run(struct grammar *g, const char *text)
{
    return gt_run(g, text, strlen(text));
}

static void test_nested_lists(void **state)
{
    (void)state;
    struct grammar *g = nested_lists();
    assert_int_equal(run(g, "[a]"), 1);
    assert_int_equal(run(g, "[a,b,   c]"), 1);
    assert_int_equal(run(g, "[[[a,\nb]]]"), 1);
    assert_int_equal(run(g, "[[a]"), 0);
    assert_int_equal(run(g, "["), 0);
    assert_int_equal(run(g, ""), 0);
    assert_int_equal(run(g, "[a,]"), -1);
    assert_int_equal(run(g, "[d]"), -1);
    assert_int_equal(run(g, "[a]]"), -1);
    /* whitespace is bounded: GR_MAX_WS bytes pass, one more does not */
    char buf[64];
    snprintf(buf, sizeof buf, "[a,%*sb]", GR_MAX_WS, "");
    assert_int_equal(run(g, buf), 1);
    snprintf(buf, sizeof buf, "[a,%*sb]", GR_MAX_WS + 1, "");
    assert_int_equal(run(g, buf), -1);
    /* a long list keeps one stack per alternative, not one per item (tail calls) */
    struct gr_matcher *m = gr_matcher_new(g);
    assert_int_equal(gr_matcher_accept_bytes(m, "[", 1), 0);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(gr_matcher_accept_bytes(m, "a,", 2), 0);
    assert_int_equal(gr_matcher_accept_bytes(m, "a]", 2), 0);
    assert_true(gr_matcher_complete(m));
    gr_matcher_free(m);
    char *d = gr_dump(g);
    assert_non_null(strstr(d, "list ::= item ',' ws list | item\n"));
    free(d);
    gr_unref(g);
}

static void test_equal_states_hash_alike(void **state)
{
    (void)state;
    struct grammar *g = nested_lists();
    struct gr_scratch sc = {0};
    struct gr_state s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    char err[128];
    assert_int_equal(gr_state_start(g, &s0, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &s0, '[', &s1, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &s1, 'a', &s2, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &s2, ',', &s3, &sc, err, sizeof err), 1);
    assert_int_equal(gr_state_advance(g, &s3, 'b', &s1, &sc, err, sizeof err), 1);
    /* "[a,b" and "[a" wait for the same things */
    assert_int_equal(s1.n, s2.n);
    assert_memory_equal(s1.v, s2.v, (size_t)s1.n * sizeof *s1.v);
    assert_true(gr_state_hash(&s1) == gr_state_hash(&s2));
    assert_true(gr_state_hash(&s1) != gr_state_hash(&s3));
    assert_int_equal(gr_state_advance(g, &s3, '!', &s1, &sc, err, sizeof err), 0);
    assert_int_equal(s1.n_stacks, 0);
    gr_state_free(&s0), gr_state_free(&s1), gr_state_free(&s2), gr_state_free(&s3);
    gr_scratch_free(&sc);
    gr_unref(g);
}

static void test_utf8_chars(void **state)
{
    (void)state;
    struct gr_builder b;
    grb_init(&b);
    struct gr_class quote = {{0}};
    quote.bits['"' >> 5] |= 1u << ('"' & 31);
    int32_t ch = grb_utf8_char_except(&b, &quote, "char");
    int32_t root = grb_rule(&b, "root"), more = grb_rule(&b, "more");
    struct gr_seq s = {0};
    grs_rule(&b, &s, ch);
    grs_rule(&b, &s, more);
    grb_alt(&b, more, &s);
    grb_alt(&b, more, &s);
    grs_byte(&b, &s, '"');
    grs_rule(&b, &s, more);
    grs_byte(&b, &s, '"');
    grb_alt(&b, root, &s);
    grs_free(&s);
    char err[256];
    struct grammar *g = gr_finish(&b, root, NULL, err, sizeof err);
    assert_non_null(g);
    assert_int_equal(run(g, "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\""), 1);
    assert_int_equal(run(g, "\"a\"b\""), -1);             /* excluded byte */
    assert_int_equal(run(g, "\"\xc0\xaf\""), -1);         /* overlong */
    assert_int_equal(run(g, "\"\xed\xa0\x80\""), -1);     /* surrogate */
    assert_int_equal(run(g, "\"\xf4\x90\x80\x80\""), -1); /* above U+10FFFF */
    assert_int_equal(run(g, "\"\x80\""), -1);             /* stray continuation */
    gr_unref(g);
}

static void test_refusals(void **state)
{
    (void)state;
    char err[256];
    struct gr_seq s = {0};
    /* A ::= B; B ::= A 'x': left recursion */
    struct gr_builder b;
    grb_init(&b);
    int32_t A = grb_rule(&b, "A"), B = grb_rule(&b, "B");
    grs_rule(&b, &s, B);
    grb_alt(&b, A, &s);
    grs_rule(&b, &s, A);
    grs_byte(&b, &s, 'x');
    grb_alt(&b, B, &s);
    assert_null(gr_finish(&b, A, NULL, err, sizeof err));
    assert_string_equal(err, "grammar: rule 'A' can reach itself without reading a byte");
    /* a rule without alternatives */
    grb_init(&b);
    A = grb_rule(&b, "A");
    B = grb_rule(&b, "B");
    grs_rule(&b, &s, B);
    grb_alt(&b, A, &s);
    assert_null(gr_finish(&b, A, NULL, err, sizeof err));
    assert_string_equal(err, "grammar: rule 'B' has no alternative");
    /* E ::= "" | N E where N ::= "" : an empty loop */
    grb_init(&b);
    int32_t E = grb_rule(&b, "E"), N = grb_rule(&b, "N");
    grb_alt(&b, N, &s);
    grb_alt(&b, E, &s);
    grs_rule(&b, &s, N);
    grs_rule(&b, &s, E);
    grb_alt(&b, E, &s);
    assert_null(gr_finish(&b, E, NULL, err, sizeof err));
    assert_string_equal(err, "grammar: rule 'E' can reach itself without reading a byte");
    grs_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_lists),
        cmocka_unit_test(test_equal_states_hash_alike),
        cmocka_unit_test(test_utf8_chars),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
