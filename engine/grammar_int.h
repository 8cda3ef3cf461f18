/* The inside of a grammar (engine/grammar.h), shared by its builder (grammar_build.c), its
 * compilers (grammar_schema.c, grammar_regex.c) and its matcher (grammar_match.c); nothing outside
 * engine/grammar*.c sees it.
 *
 * Representation: rules, each a list of alternatives, each alternative a sequence of elements in one
 * flat array, ended by a GR_END element:
 *
 *     elems: [CLASS 3][RULE 5][END] [CLASS 0][END] ...
 *              ^ alternative 0 of rule 2    ^ alternative 1 of rule 2
 *
 * A position is an index into elems. A GR_CLASS element matches one byte of class arg (a 256-bit
 * set); a GR_RULE element matches a sentence of rule arg. An alternative may be empty (its first
 * element GR_END): the rule then matches the empty string. Grammars have no left recursion and no
 * cycle of rules that reads no byte (the compilers never build one; gr_finish refuses it).
 *
 * A matcher state is a set of stacks of positions, like an NFA's state set extended with a return
 * stack: the top of each stack is a GR_CLASS position (the next byte must match it), the positions
 * below are where to go on once the rule above completes. An empty stack means the input so far is a
 * complete sentence. A rule reference followed by GR_END pushes no return position (tail call), so
 * repetition written as right recursion (`list ::= item list | ""`) does not grow the stack. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"

enum gr_kind {
    GR_END = 0,   /* end of an alternative */
    GR_CLASS = 1, /* one byte in classes[arg] */
    GR_RULE = 2,  /* a sentence of rules[arg] */
};

struct gr_elem {
    int32_t kind; /* enum gr_kind */
    int32_t arg;  /* class or rule index; 0 for GR_END */
};

/* A set of bytes: bit (b & 31) of word (b >> 5). */
struct gr_class {
    uint32_t bits[8];
};

static inline bool gr_class_has(const struct gr_class *c, unsigned b)
{
    return (c->bits[(b & 255) >> 5] >> (b & 31)) & 1u;
}

struct gr_rule {
    int32_t first_alt; /* index into alts */
    int32_t n_alts;
    char *name; /* for messages and dumps, e.g. "/properties/title" or "string" */
};

struct gr_mask_cache; /* grammar_match.c */

struct grammar {
    int refs;              /* atomically counted */
    struct gr_elem *elems; /* [n_elems] */
    int32_t n_elems;
    int32_t *alts; /* [n_alts]: the position of each alternative's first element */
    int32_t n_alts;
    struct gr_rule *rules; /* [n_rules] */
    int32_t n_rules;
    struct gr_class *classes; /* [n_classes], distinct */
    int32_t n_classes;
    int32_t root;                 /* the start rule */
    const struct gr_vocab *vocab; /* borrowed; NULL: no masks */
    struct gr_mask_cache *cache;  /* owned; created by gr_finish */
};

/* ---- building (grammar_build.c) ----
 *
 * A compiler makes rules with grb_rule, fills sequences of elements (gr_seq) and adds each as an
 * alternative of a rule with grb_alt. Rules may be referenced before they get alternatives (recursion).
 * Errors are sticky: after the first failure (out of memory, a limit) every call does nothing and
 * gr_finish returns NULL with the message. */

struct gr_seq {
    struct gr_elem *e;
    int32_t n, cap;
};

struct gr_builder {
    struct gr_elem *elems;
    int32_t n_elems, cap_elems;
    struct {
        int32_t rule;
        int32_t first;
    } * pending; /* alternatives in order of addition */
    int32_t n_pending, cap_pending;
    struct gr_rule *rules;
    int32_t n_rules, cap_rules;
    struct gr_class *classes;
    int32_t n_classes, cap_classes;
    bool failed;
    char err[256];
};

#define GR_MAX_ELEMS (1 << 22) /* most elements of one grammar (the builder fails beyond) */

void grb_init(struct gr_builder *b);
/* Frees what b holds (after gr_finish, or to abandon a build). */
void grb_release(struct gr_builder *b);
/* Fails b with a message (printf-style) unless it has already failed. */
__attribute__((format(printf, 2, 3))) void grb_fail(struct gr_builder *b, const char *fmt, ...);
/* A new rule with no alternative yet; returns its index (-1 after a failure). name is copied. */
int32_t grb_rule(struct gr_builder *b, const char *name);
/* Adds s as an alternative of rule (s may be empty: the rule then matches ""). s is emptied (its
 * memory kept for reuse). */
void grb_alt(struct gr_builder *b, int32_t rule, struct gr_seq *s);
/* The index of class c (added when new; equal classes share an index). */
int32_t grb_class(struct gr_builder *b, const struct gr_class *c);

/* Appending elements to a sequence (b is where failures go). */
void grs_class(struct gr_builder *b, struct gr_seq *s, const struct gr_class *c);
void grs_byte(struct gr_builder *b, struct gr_seq *s, uint8_t c);
void grs_range(struct gr_builder *b, struct gr_seq *s, uint8_t lo, uint8_t hi);
void grs_lit(struct gr_builder *b, struct gr_seq *s, const char *bytes, size_t n);
void grs_rule(struct gr_builder *b, struct gr_seq *s, int32_t rule);
void grs_free(struct gr_seq *s);

/* Convenience rules, each made once per builder on first use and returned by index afterwards. */
/* Bounded JSON whitespace: 0 to GR_MAX_WS bytes of space, tab or newline. */
#define GR_MAX_WS 12
int32_t grb_ws(struct gr_builder *b);
/* One UTF-8 character (a valid, shortest-form encoding of a scalar value) other than those in the
 * ASCII class excluded (bytes >= 0x80 in it are ignored). */
int32_t grb_utf8_char_except(struct gr_builder *b, const struct gr_class *excluded, const char *name);
/* Adds to rule the alternatives of the byte strings texts[i][0..lens[i]) (i < n; repeats harmless),
 * shared as a trie so that a matcher state holds one stack per distinct next byte, not one per string;
 * the inner rules are named name@1, name@2, ... (grammar_choice.c). */
void grb_literals(struct gr_builder *b, int32_t rule, const char *const *texts, const size_t *lens, size_t n,
                  const char *name);

/* The grammar b describes, starting at rule root, bound to v (may be NULL). Checks that every rule has
 * an alternative, that every reference resolves, and that no cycle of rules reads no byte (left
 * recursion, an empty loop). b is released either way. NULL with err on failure. */
struct grammar *gr_finish(struct gr_builder *b, int32_t root, const struct gr_vocab *v, char *err,
                          size_t errlen);

/* The mask cache of g (grammar_match.c): made by gr_finish (0, or -1 when out of memory), freed by
 * gr_destroy (harmless when never made). */
int gr_cache_init(struct grammar *g);
void gr_cache_free(struct grammar *g);

/* Frees g now, whatever its references (gr_unref calls it at zero). */
void gr_destroy(struct grammar *g);

/* Writes g as text, one rule per line (`name ::= alt | alt`, classes as [..]), for tests and
 * debugging. Returns a malloc'd string. */
char *gr_dump(const struct grammar *g);

/* ---- matcher states (grammar_state.c) ----
 *
 * A state is a set of stacks, stored canonically so that equal states have equal bytes (the key of
 * the mask cache): stacks concatenated, each as its length then its positions from bottom to top,
 * sorted (shorter first, then by positions) and distinct. The empty stack, when present, comes first
 * and means the input so far is a complete sentence. */

struct gr_state {
    int32_t *v; /* [n] the flat canonical form */
    int32_t n, cap;
    int32_t n_stacks; /* the empty stack included */
    bool complete;    /* the empty stack is in the set */
};

#define GR_MAX_STACKS 4096      /* most stacks in one state */
#define GR_MAX_STACK_DEPTH 4096 /* most positions in one stack (nesting of rules) */

/* Scratch for computing states; one per thread. Zero-initialize; free with gr_scratch_free. */
struct gr_scratch {
    int32_t *cur; /* the stack being expanded */
    int32_t cap_cur;
    struct gr_state raw; /* stacks before sorting */
    int32_t *offs;       /* offsets of the stacks in raw */
    int32_t cap_offs;
};
void gr_scratch_free(struct gr_scratch *sc);

/* The start state of g into *out (its memory reused). Returns 1, or -1 with err (a limit, out of
 * memory). */
int gr_state_start(const struct grammar *g, struct gr_state *out, struct gr_scratch *sc, char *err,
                   size_t errlen);
/* The state after byte from in, into *out (its memory reused; out != in). Returns 1 when the byte is
 * accepted, 0 when it is not (out is then empty), -1 with err (a limit, out of memory). */
int gr_state_advance(const struct grammar *g, const struct gr_state *in, uint8_t byte, struct gr_state *out,
                     struct gr_scratch *sc, char *err, size_t errlen);
/* Copies in into *out (its memory reused). 0, or -1 when out of memory. */
int gr_state_copy(const struct gr_state *in, struct gr_state *out);
void gr_state_free(struct gr_state *s);
/* FNV-1a over the canonical form. */
uint64_t gr_state_hash(const struct gr_state *s);

/* ---- compiling a regex into rules (grammar_regex.c) ---- */

/* How the bytes a regex matches are emitted. */
enum gr_regex_ctx {
    GR_RX_RAW,         /* as they are (a whole-output regex constraint) */
    GR_RX_JSON_STRING, /* as the content of a JSON string: '"', '\\' and control characters escaped
                          (the decoded string is what the regex matches) */
};

/* Bounds that keep a regex's grammar small: the largest n or m of a {n}, {n,}, {n,m} quantifier, and
 * the most copies of repeated parts in one pattern (each {n,m} counts m, each {n,} n + 1, each * or +
 * one or two; nested repetitions add, they do not multiply). */
#define GR_RX_MAX_REPEAT 1000
#define GR_RX_MAX_COPIES 10000

/* Adds rules to b for the sentences that match pattern (ECMA-262 syntax, subset in
 * docs/STRUCTURED_OUTPUT.md), anchored at both ends when anchored, else searched (any text may come
 * before and after the match, as JSON Schema's pattern). Returns the rule index, or -1 with b failed
 * (the message names the construct and its offset: "regex: unsupported lookahead at offset 3"). */
int32_t gr_regex_rule(struct gr_builder *b, const char *pattern, bool anchored, enum gr_regex_ctx ctx,
                      const char *name);

/* ---- the vocabulary (grammar_vocab.c) ----
 *
 * The byte strings of the usable ids in a trie laid out in depth-first preorder, so that a mask is one
 * pass over an array: node i's subtree is nodes [i, nodes[i].next), and a walk that rejects node i
 * jumps to nodes[i].next. The ids whose bytes end at node i are trie_ids[nodes[i].ids ..
 * nodes[i + 1].ids) (a sentinel node ends the array). Node 0 is the root (the empty string). */

struct gr_trie_node {
    int32_t next;  /* the first node after this node's subtree */
    int32_t ids;   /* the first of this node's ids in trie_ids */
    int32_t depth; /* bytes from the root to here (the root: 0) */
    uint8_t byte;  /* the last byte of the path (the root: 0) */
};

struct gr_vocab {
    int32_t vocab;      /* width of a mask in ids */
    int32_t mask_words; /* (vocab + 31) / 32 */
    int32_t n_ids;      /* ids with a byte string slot: [0, n_ids), n_ids <= vocab */
    char *bytes;        /* every usable id's bytes, concatenated */
    int64_t *off;       /* [n_ids + 1]: id i's bytes are bytes[off[i] .. off[i + 1]); empty: unusable */
    int32_t *eos;       /* [n_eos] distinct, each in [0, vocab) */
    int32_t n_eos;
    struct gr_trie_node *nodes; /* [n_nodes + 1], the last a sentinel (ids = n_trie_ids) */
    int32_t n_nodes;
    int32_t *trie_ids; /* [n_trie_ids] */
    int32_t n_trie_ids;
    int32_t max_depth; /* the longest byte string */
};

/* The vocabulary of ids [0, n) with bytes[i][0..lens[i]) (bytes[i] NULL or lens[i] 0: the id is never
 * allowed), vocab >= n wide, eos ids eos[0..n_eos) (each in [0, vocab); they are allowed only where the
 * grammar may end, whatever their bytes). gr_vocab_new gives this the tokenizer's strings; tests give
 * made-up ones. NULL with err when out of memory or an eos id is out of range. */
struct gr_vocab *gr_vocab_from_bytes(const char *const *bytes, const size_t *lens, int32_t n, int32_t vocab,
                                     const int32_t *eos, int n_eos, char *err, size_t errlen);
/* Whether id is one of v's eos ids. */
bool gr_vocab_is_eos(const struct gr_vocab *v, int32_t id);

/* ---- computing masks (grammar_mask.c) ----
 *
 * A walk is the scratch of one mask computation for one grammar: the state at each depth of the trie
 * and a memo of transitions (a lazily built automaton over the states met: for each state and each
 * class of equivalent bytes, the state after it, or dead). Inside a JSON string most tokens lead
 * back to a few states, so nearly every trie node costs one table look-up instead of a state advance.
 * The memo is kept between computations of the same walk and cleared when it grows past
 * GR_WALK_MAX_BYTES; a single computation that would outgrow it finishes without the memo, advancing
 * states byte by byte (slower, same mask). One walk is used by one thread at a time. */

#define GR_WALK_MAX_BYTES ((size_t)16 << 20)

struct gr_walk;
/* A walk for g (which must outlive it). NULL when out of memory. */
struct gr_walk *gr_walk_new(const struct grammar *g);
void gr_walk_free(struct gr_walk *w);
/* Bytes the walk holds (its memo and buffers). */
size_t gr_walk_bytes(const struct gr_walk *w);
/* Lowers the memo's bound (tests: 0 makes every computation advance byte by byte). */
void gr_walk_set_max_bytes(struct gr_walk *w, size_t max_bytes);
/* How many of w's computations finished without the memo (the memo full). */
int64_t gr_walk_fallbacks(const struct gr_walk *w);
/* Writes into mask[v->mask_words] the ids allowed in state st of w's grammar against vocabulary v: an
 * id whose bytes are accepted one after another from st, an eos id when st is complete. Returns 0, or
 * -1 with err (a limit of the grammar's states, out of memory). */
int gr_walk_mask(struct gr_walk *w, const struct gr_vocab *v, const struct gr_state *st, uint32_t *mask,
                 char *err, size_t errlen);

/* ---- the mask cache (grammar_match.c) ----
 *
 * Masks by state (canonical form), shared by every matcher of a grammar, at most
 * GR_CACHE_MAX_BYTES of masks and keys per grammar (the least recently used go first). */

#define GR_CACHE_MAX_BYTES ((size_t)64 << 20)

/* Lowers g's cache bound (tests of eviction), evicting down to it now. */
void gr_cache_set_max_bytes(struct grammar *g, size_t max_bytes);
