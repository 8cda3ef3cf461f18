/* A JSON grammar written with the grammar builder (engine/grammar_int.h), for the tests and the
 * benchmark of token masks (header-only; each test is its own program). Any JSON value with bounded
 * whitespace between tokens; strings with escapes and UTF-8 characters; numbers with an optional
 * fraction. Objects and arrays have two alternatives that start alike ('{' ws '}' and '{' ws member
 * ...), so their states hold several stacks. */
#pragma once
#include <stdio.h>

#include "engine/grammar_int.h"

/* How g takes the n bytes of text from its start: -1 refused at some byte, 0 accepted but incomplete,
 * 1 a complete sentence; -2 when no matcher could be made (out of memory). */
static inline int gt_run(struct grammar *g, const char *text, size_t n)
{
    struct gr_matcher *m = gr_matcher_new(g);
    if (!m)
        return -2;
    int r = gr_matcher_accept_bytes(m, text, n);
    int out = r < 0 ? -1 : gr_matcher_complete(m) ? 1 : 0;
    gr_matcher_free(m);
    return out;
}

static inline struct gr_class gt_class_of(const char *chars)
{
    struct gr_class c = {{0}};
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++)
        c.bits[*p >> 5] |= 1u << (*p & 31);
    return c;
}

/* Returns the grammar bound to v (may be NULL), or NULL with err. */
static inline struct grammar *gt_json_grammar(const struct gr_vocab *v, char *err, size_t errlen)
{
    struct gr_builder b;
    grb_init(&b);
    struct gr_seq s = {0};
    int32_t ws = grb_ws(&b);
    int32_t root = grb_rule(&b, "root"), value = grb_rule(&b, "value"), object = grb_rule(&b, "object"),
            member = grb_rule(&b, "member"), more = grb_rule(&b, "more"), array = grb_rule(&b, "array"),
            items = grb_rule(&b, "items"), string = grb_rule(&b, "string"), chars = grb_rule(&b, "chars"),
            ch = grb_rule(&b, "ch"), number = grb_rule(&b, "number"), intpart = grb_rule(&b, "int"),
            digits = grb_rule(&b, "digits"), frac = grb_rule(&b, "frac");
    /* root ::= ws value ws */
    grs_rule(&b, &s, ws), grs_rule(&b, &s, value), grs_rule(&b, &s, ws), grb_alt(&b, root, &s);
    /* value ::= object | array | string | number | "true" | "false" | "null" */
    int32_t alts[] = {object, array, string, number};
    for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++)
        grs_rule(&b, &s, alts[i]), grb_alt(&b, value, &s);
    const char *lits[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++)
        grs_lit(&b, &s, lits[i], strlen(lits[i])), grb_alt(&b, value, &s);
    /* object ::= '{' ws '}' | '{' ws member more '}' */
    grs_byte(&b, &s, '{'), grs_rule(&b, &s, ws), grs_byte(&b, &s, '}'), grb_alt(&b, object, &s);
    grs_byte(&b, &s, '{'), grs_rule(&b, &s, ws), grs_rule(&b, &s, member), grs_rule(&b, &s, more);
    grs_byte(&b, &s, '}'), grb_alt(&b, object, &s);
    /* member ::= string ws ':' ws value ws */
    grs_rule(&b, &s, string), grs_rule(&b, &s, ws), grs_byte(&b, &s, ':'), grs_rule(&b, &s, ws);
    grs_rule(&b, &s, value), grs_rule(&b, &s, ws), grb_alt(&b, member, &s);
    /* more ::= ',' ws member more | "" */
    grs_byte(&b, &s, ','), grs_rule(&b, &s, ws), grs_rule(&b, &s, member), grs_rule(&b, &s, more);
    grb_alt(&b, more, &s);
    grb_alt(&b, more, &s);
    /* array ::= '[' ws ']' | '[' ws value ws items ']' */
    grs_byte(&b, &s, '['), grs_rule(&b, &s, ws), grs_byte(&b, &s, ']'), grb_alt(&b, array, &s);
    grs_byte(&b, &s, '['), grs_rule(&b, &s, ws), grs_rule(&b, &s, value), grs_rule(&b, &s, ws);
    grs_rule(&b, &s, items), grs_byte(&b, &s, ']'), grb_alt(&b, array, &s);
    /* items ::= ',' ws value ws items | "" */
    grs_byte(&b, &s, ','), grs_rule(&b, &s, ws), grs_rule(&b, &s, value), grs_rule(&b, &s, ws);
    grs_rule(&b, &s, items), grb_alt(&b, items, &s);
    grb_alt(&b, items, &s);
    /* string ::= '"' chars '"';  chars ::= ch chars | "" */
    grs_byte(&b, &s, '"'), grs_rule(&b, &s, chars), grs_byte(&b, &s, '"'), grb_alt(&b, string, &s);
    grs_rule(&b, &s, ch), grs_rule(&b, &s, chars), grb_alt(&b, chars, &s);
    grb_alt(&b, chars, &s);
    /* ch ::= a UTF-8 character but '"', '\' and controls | '\' ["\/bfnrt] | '\u' hex{4} */
    struct gr_class excl = gt_class_of("\"\\");
    for (unsigned c = 0; c < 0x20; c++)
        excl.bits[0] |= 1u << c;
    grs_rule(&b, &s, grb_utf8_char_except(&b, &excl, "utf8")), grb_alt(&b, ch, &s);
    struct gr_class esc = gt_class_of("\"\\/bfnrt"), hex = gt_class_of("0123456789abcdefABCDEF");
    grs_byte(&b, &s, '\\'), grs_class(&b, &s, &esc), grb_alt(&b, ch, &s);
    grs_lit(&b, &s, "\\u", 2);
    for (int i = 0; i < 4; i++)
        grs_class(&b, &s, &hex);
    grb_alt(&b, ch, &s);
    /* number ::= int frac;  int ::= '-'? ('0' | [1-9] digits);  frac ::= "" | '.' [0-9] digits */
    grs_rule(&b, &s, intpart), grs_rule(&b, &s, frac), grb_alt(&b, number, &s);
    for (int neg = 0; neg < 2; neg++) {
        if (neg)
            grs_byte(&b, &s, '-');
        grs_byte(&b, &s, '0'), grb_alt(&b, intpart, &s);
        if (neg)
            grs_byte(&b, &s, '-');
        grs_range(&b, &s, '1', '9'), grs_rule(&b, &s, digits), grb_alt(&b, intpart, &s);
    }
    grs_range(&b, &s, '0', '9'), grs_rule(&b, &s, digits), grb_alt(&b, digits, &s);
    grb_alt(&b, digits, &s);
    grb_alt(&b, frac, &s);
    grs_byte(&b, &s, '.'), grs_range(&b, &s, '0', '9'), grs_rule(&b, &s, digits), grb_alt(&b, frac, &s);
    grs_free(&s);
    return gr_finish(&b, root, v, err, errlen);
}
