/* Building grammars (engine/grammar_int.h): rules, alternatives and byte classes into the flat
 * representation the matcher walks, with the checks that keep matching finite. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/util/array.h"
#include "engine/util/buf.h"

void grb_init(struct gr_builder *b)
{
    memset(b, 0, sizeof *b);
}

void grb_release(struct gr_builder *b)
{
    if (!b)
        return;
    free(b->elems);
    free(b->pending);
    for (int32_t i = 0; i < b->n_rules; i++)
        free(b->rules[i].name);
    free(b->rules);
    free(b->classes);
    memset(b, 0, sizeof *b);
}

void grb_fail(struct gr_builder *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    b->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
}

/* Grows *p (n used of *cap elements of size sz) to hold one more; false (b failed) when it cannot. */
static bool grow(struct gr_builder *b, void **p, int32_t n, int32_t *cap, size_t sz)
{
    if (n < *cap)
        return true;
    if (n >= GR_MAX_ELEMS) {
        grb_fail(b, "grammar too large (more than %d elements)", GR_MAX_ELEMS);
        return false;
    }
    size_t c = (size_t)*cap;
    if (array_reserve(p, &c, (size_t)n + 1, sz, 16)) {
        grb_fail(b, "out of memory building a grammar");
        return false;
    }
    *cap = (int32_t)c; /* at most twice GR_MAX_ELEMS */
    return true;
}

int32_t grb_rule(struct gr_builder *b, const char *name)
{
    if (b->failed || !grow(b, (void **)&b->rules, b->n_rules, &b->cap_rules, sizeof *b->rules))
        return -1;
    char *nm = strdup(name ? name : "");
    if (!nm) {
        grb_fail(b, "out of memory building a grammar");
        return -1;
    }
    b->rules[b->n_rules] = (struct gr_rule){.first_alt = 0, .n_alts = 0, .name = nm};
    return b->n_rules++;
}

static void push_elem(struct gr_builder *b, struct gr_seq *s, int32_t kind, int32_t arg)
{
    if (b->failed || !grow(b, (void **)&s->e, s->n, &s->cap, sizeof *s->e))
        return;
    s->e[s->n++] = (struct gr_elem){kind, arg};
}

void grb_alt(struct gr_builder *b, int32_t rule, struct gr_seq *s)
{
    if (b->failed) {
        s->n = 0;
        return;
    }
    if (rule < 0 || rule >= b->n_rules) {
        grb_fail(b, "grammar: alternative for unknown rule %d", rule);
        return;
    }
    if (!grow(b, (void **)&b->pending, b->n_pending, &b->cap_pending, sizeof *b->pending))
        return;
    int32_t first = b->n_elems;
    for (int32_t i = 0; i <= s->n; i++) {
        if (!grow(b, (void **)&b->elems, b->n_elems, &b->cap_elems, sizeof *b->elems))
            return;
        b->elems[b->n_elems++] = i < s->n ? s->e[i] : (struct gr_elem){GR_END, 0};
    }
    b->pending[b->n_pending].rule = rule;
    b->pending[b->n_pending].first = first;
    b->n_pending++;
    s->n = 0;
}

int32_t grb_class(struct gr_builder *b, const struct gr_class *c)
{
    if (b->failed)
        return -1;
    for (int32_t i = 0; i < b->n_classes; i++)
        if (!memcmp(&b->classes[i], c, sizeof *c))
            return i;
    if (!grow(b, (void **)&b->classes, b->n_classes, &b->cap_classes, sizeof *b->classes))
        return -1;
    b->classes[b->n_classes] = *c;
    return b->n_classes++;
}

void grs_class(struct gr_builder *b, struct gr_seq *s, const struct gr_class *c)
{
    int32_t k = grb_class(b, c);
    if (k >= 0)
        push_elem(b, s, GR_CLASS, k);
}

void grs_range(struct gr_builder *b, struct gr_seq *s, uint8_t lo, uint8_t hi)
{
    struct gr_class c = {{0}};
    for (unsigned x = lo; x <= hi; x++)
        c.bits[x >> 5] |= 1u << (x & 31);
    grs_class(b, s, &c);
}

void grs_byte(struct gr_builder *b, struct gr_seq *s, uint8_t c)
{
    grs_range(b, s, c, c);
}

void grs_lit(struct gr_builder *b, struct gr_seq *s, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        grs_byte(b, s, (uint8_t)bytes[i]);
}

void grs_rule(struct gr_builder *b, struct gr_seq *s, int32_t rule)
{
    if (rule < 0) {
        grb_fail(b, "grammar: reference to a rule that failed to build");
        return;
    }
    push_elem(b, s, GR_RULE, rule);
}

void grs_free(struct gr_seq *s)
{
    if (!s)
        return;
    free(s->e);
    memset(s, 0, sizeof *s);
}

/* The rule named name when the builder already has it (convenience rules are made once). */
static int32_t find_rule(const struct gr_builder *b, const char *name)
{
    for (int32_t i = 0; i < b->n_rules; i++)
        if (!strcmp(b->rules[i].name, name))
            return i;
    return -1;
}

int32_t grb_ws(struct gr_builder *b)
{
    int32_t r = find_rule(b, "ws");
    if (r >= 0 || b->failed)
        return r;
    /* ws_k matches at most k bytes: ws_k ::= "" | [ \t\n] ws_{k-1}, ws_0 ::= "" */
    struct gr_class c = {{0}};
    c.bits[0] |= 1u << '\t' | 1u << '\n';
    c.bits[1] |= 1u << (' ' - 32);
    struct gr_seq s = {0};
    int32_t prev = -1;
    char name[32];
    for (int k = 0; k <= GR_MAX_WS; k++) {
        if (k == GR_MAX_WS)
            snprintf(name, sizeof name, "ws");
        else
            snprintf(name, sizeof name, "ws%d", k);
        int32_t cur = grb_rule(b, name);
        grb_alt(b, cur, &s);
        if (prev >= 0) {
            grs_class(b, &s, &c);
            grs_rule(b, &s, prev);
            grb_alt(b, cur, &s);
        }
        prev = cur;
    }
    grs_free(&s);
    return b->failed ? -1 : prev;
}

int32_t grb_utf8_char_except(struct gr_builder *b, const struct gr_class *excluded, const char *name)
{
    int32_t r = find_rule(b, name);
    if (r >= 0 || b->failed)
        return r;
    r = grb_rule(b, name);
    struct gr_seq s = {0};
    struct gr_class ascii = {{0}};
    for (unsigned x = 0; x < 0x80; x++)
        if (!gr_class_has(excluded, x))
            ascii.bits[x >> 5] |= 1u << (x & 31);
    bool any = false;
    for (int w = 0; w < 4; w++)
        any |= ascii.bits[w] != 0;
    if (any) {
        grs_class(b, &s, &ascii);
        grb_alt(b, r, &s);
    }
    /* Shortest-form UTF-8 of U+0080..U+10FFFF without surrogates (RFC 3629's table). */
    static const uint8_t seqs[][4][2] = {
        {{0xC2, 0xDF}, {0x80, 0xBF}, {0, 0}, {0, 0}},
        {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}, {0, 0}},
        {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}, {0, 0}},
        {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
        {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
    };
    for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
        for (int j = 0; j < 4 && seqs[i][j][0]; j++)
            grs_range(b, &s, seqs[i][j][0], seqs[i][j][1]);
        grb_alt(b, r, &s);
    }
    grs_free(&s);
    return b->failed ? -1 : r;
}

/* Which rules can match the empty string (fixed point). */
static void nullable_rules(const struct grammar *g, bool *nullable)
{
    memset(nullable, 0, (size_t)g->n_rules * sizeof *nullable);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            for (int32_t a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                int32_t p = g->alts[g->rules[r].first_alt + a];
                while (g->elems[p].kind == GR_RULE && nullable[g->elems[p].arg])
                    p++;
                if (g->elems[p].kind == GR_END)
                    nullable[r] = changed = true;
            }
        }
    }
}

/* Depth-first search for a cycle of rules that reads no byte: an edge r -> s when some alternative of
 * r can reach a reference to s having read nothing (every element before it nullable). */
static int32_t empty_cycle(const struct grammar *g, const bool *nullable, int32_t r, uint8_t *colour)
{
    colour[r] = 1;
    for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
        for (int32_t p = g->alts[g->rules[r].first_alt + a]; g->elems[p].kind == GR_RULE; p++) {
            int32_t s = g->elems[p].arg;
            if (colour[s] == 1)
                return s;
            if (colour[s] == 0) {
                int32_t c = empty_cycle(g, nullable, s, colour);
                if (c >= 0)
                    return c;
            }
            if (!nullable[s])
                break;
        }
    }
    colour[r] = 2;
    return -1;
}

struct grammar *gr_finish(struct gr_builder *b, int32_t root, const struct gr_vocab *v, char *err,
                          size_t errlen)
{
    struct grammar *g = NULL;
    bool *nullable = NULL;
    uint8_t *colour = NULL;
    if (!b->failed && (root < 0 || root >= b->n_rules))
        grb_fail(b, "grammar: no root rule");
    if (b->failed)
        goto fail;
    g = calloc(1, sizeof *g);
    if (!g)
        goto oom;
    g->refs = 1;
    g->vocab = v;
    g->root = root;
    /* Alternatives grouped by rule, in order of addition within a rule. */
    g->n_alts = b->n_pending;
    g->alts = malloc(((size_t)b->n_pending + 1) * sizeof *g->alts);
    int32_t *count = calloc((size_t)b->n_rules + 1, sizeof *count);
    if (!g->alts || !count) {
        free(count);
        goto oom;
    }
    for (int32_t i = 0; i < b->n_pending; i++)
        count[b->pending[i].rule]++;
    int32_t at = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        b->rules[r].first_alt = at;
        at += count[r];
        count[r] = 0;
    }
    for (int32_t i = 0; i < b->n_pending; i++) {
        int32_t r = b->pending[i].rule;
        g->alts[b->rules[r].first_alt + count[r]++] = b->pending[i].first;
    }
    for (int32_t r = 0; r < b->n_rules; r++)
        b->rules[r].n_alts = count[r];
    free(count);
    g->elems = b->elems, g->n_elems = b->n_elems;
    g->rules = b->rules, g->n_rules = b->n_rules;
    g->classes = b->classes, g->n_classes = b->n_classes;
    b->elems = NULL, b->rules = NULL, b->classes = NULL;
    b->n_rules = 0;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (g->rules[r].n_alts == 0) {
            grb_fail(b, "grammar: rule '%s' has no alternative", g->rules[r].name);
            goto fail;
        }
    for (int32_t p = 0; p < g->n_elems; p++) {
        const struct gr_elem *e = &g->elems[p];
        if ((e->kind == GR_RULE && (e->arg < 0 || e->arg >= g->n_rules)) ||
            (e->kind == GR_CLASS && (e->arg < 0 || e->arg >= g->n_classes))) {
            grb_fail(b, "grammar: element %d refers to a missing rule or class", p);
            goto fail;
        }
    }
    nullable = malloc((size_t)g->n_rules * sizeof *nullable);
    colour = calloc((size_t)g->n_rules, 1);
    if (!nullable || !colour)
        goto oom;
    nullable_rules(g, nullable);
    for (int32_t r = 0; r < g->n_rules; r++) {
        int32_t c = colour[r] ? -1 : empty_cycle(g, nullable, r, colour);
        if (c >= 0) {
            grb_fail(b, "grammar: rule '%s' can reach itself without reading a byte", g->rules[c].name);
            goto fail;
        }
    }
    free(nullable);
    free(colour);
    if (gr_cache_init(g) < 0)
        goto oom;
    grb_release(b);
    return g;
oom:
    grb_fail(b, "out of memory building a grammar");
fail:
    snprintf(err, errlen, "%s", b->err);
    free(nullable);
    free(colour);
    gr_destroy(g);
    grb_release(b);
    return NULL;
}

void gr_destroy(struct grammar *g)
{
    if (!g)
        return;
    gr_cache_free(g);
    free(g->elems);
    free(g->alts);
    for (int32_t i = 0; i < g->n_rules; i++)
        free(g->rules[i].name);
    free(g->rules);
    free(g->classes);
    free(g);
}

const struct gr_vocab *gr_grammar_vocab(const struct grammar *g)
{
    return g ? g->vocab : NULL;
}

struct grammar *gr_ref(struct grammar *g)
{
    if (g)
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void gr_unref(struct grammar *g)
{
    if (g && __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) == 0)
        gr_destroy(g);
}

static void dump_byte(struct buf *sb, unsigned z)
{
    if (z >= 0x21 && z < 0x7f && z != ']' && z != '\\' && z != '-' && z != '\'')
        buf_printf(sb, "%c", (char)z);
    else
        buf_printf(sb, "\\x%02X", z);
}

static void dump_class(struct buf *sb, const struct gr_class *c)
{
    int n = 0;
    for (unsigned x = 0; x < 256; x++)
        n += gr_class_has(c, x);
    if (n == 1) {
        for (unsigned x = 0; x < 256; x++)
            if (gr_class_has(c, x)) {
                buf_printf(sb, "'");
                dump_byte(sb, x);
                buf_printf(sb, "'");
            }
        return;
    }
    buf_printf(sb, "[");
    for (unsigned x = 0; x < 256; x++) {
        if (!gr_class_has(c, x))
            continue;
        unsigned y = x;
        while (y + 1 < 256 && gr_class_has(c, y + 1))
            y++;
        dump_byte(sb, x);
        if (y > x) {
            if (y > x + 1)
                buf_printf(sb, "-");
            dump_byte(sb, y);
        }
        x = y;
    }
    buf_printf(sb, "]");
}

char *gr_dump(const struct grammar *g)
{
    struct buf sb = {0};
    for (int32_t r = 0; r < g->n_rules; r++) {
        buf_printf(&sb, "%s%s ::=", r == g->root ? "*" : "", g->rules[r].name);
        for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
            buf_printf(&sb, "%s", a ? " |" : "");
            int32_t p = g->alts[g->rules[r].first_alt + a];
            if (g->elems[p].kind == GR_END)
                buf_printf(&sb, " \"\"");
            for (; g->elems[p].kind != GR_END; p++) {
                buf_printf(&sb, " ");
                if (g->elems[p].kind == GR_RULE)
                    buf_printf(&sb, "%s", g->rules[g->elems[p].arg].name);
                else
                    dump_class(&sb, &g->classes[g->elems[p].arg]);
            }
        }
        buf_printf(&sb, "\n");
    }
    return buf_take(&sb);
}
