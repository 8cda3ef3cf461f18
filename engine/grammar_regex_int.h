/* The tree of a regular expression: what engine/grammar_regex_parse.c makes of a pattern and
 * engine/grammar_regex.c writes as grammar rules. Nothing outside those two files sees it.
 *
 * The tree is over Unicode code points: sets of code points (never containing U+0000 or a
 * surrogate), concatenation, alternation and bounded or unbounded repetition; nodes live in one array
 * and are built simplified (a part that matches nothing makes its concatenation match nothing, and
 * is dropped from an alternation), so a pattern that can match nothing ends as RX_NONE. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar_int.h"

/* A set of code points: sorted, disjoint, non-adjacent inclusive ranges. */
struct rx_cset {
    uint32_t *r; /* [2 * n]: lo, hi */
    int32_t n, cap;
};

bool rx_cs_equal(const struct rx_cset *a, const struct rx_cset *b);

enum rx_kind {
    RX_NONE,  /* matches nothing */
    RX_EMPTY, /* matches "" */
    RX_SET,   /* one code point of sets[set] (never empty) */
    RX_CAT,   /* kids in order */
    RX_ALT,   /* one of kids */
    RX_REP,   /* kids[0] repeated min..max times (max -1: unbounded) */
};

struct rx_node {
    int32_t kind;
    int32_t off; /* byte offset in the pattern, for messages */
    int32_t set;
    int32_t first, n; /* kids: rx.kids[first .. first + n) */
    int32_t min, max;
    bool nullable;
};

/* One top-level alternative: its body and whether it was written with ^ and $. */
struct rx_top {
    int32_t node;
    bool caret, dollar;
};

/* A pattern being parsed and written; failures go to b (sticky), with the pattern's offset. */
struct rx {
    struct gr_builder *b;
    const char *pat;
    size_t len, pos;
    struct rx_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *kids;
    int32_t n_kids, cap_kids;
    struct rx_cset *sets;
    int32_t n_sets, cap_sets;
    struct rx_top *tops;
    int32_t n_tops, cap_tops;
    /* writing rules */
    enum gr_regex_ctx ctx;
    const char *name;
    int32_t n_sub;     /* sub-rules named so far */
    int32_t *set_rule; /* [n_set_rule]: the rule of a set, -1 none yet */
    int32_t n_set_rule;
    int32_t any_star; /* rule: any number of any code points; -1 none yet */
    int64_t copies;   /* copies made by repetitions */
};

static inline bool rx_failed(const struct rx *x)
{
    return x->b->failed;
}

static inline int32_t rx_kind(const struct rx *x, int32_t node)
{
    return x->nodes[node].kind;
}

/* b fails with "out of memory building a grammar". */
void rx_oom(struct rx *x);
/* Parses x->pat[0..len) into x->tops. 0, or -1 with x->b failed (the message names the construct
 * and its offset). */
int rx_parse(struct rx *x);
/* For a search, where any text may follow (at_end) or precede the match: a part of node that matches
 * the same texts once that text is added, with less repetition at that end. -1 with x failed. */
int32_t rx_trim(struct rx *x, int32_t node, bool at_end);
/* The part whose unbounded repetition is that of kid (kid nullable), itself not nullable (so that a
 * right-recursive rule reads a byte before it recurses). -1 with x failed. */
int32_t rx_star_body(struct rx *x, int32_t kid, int32_t off);
/* A set node of every code point a grammar may generate. -1 with x failed. */
int32_t rx_any_char(struct rx *x);
/* Frees the tree (not the rule-writing fields). */
void rx_free(struct rx *x);
