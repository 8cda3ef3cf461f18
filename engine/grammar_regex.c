/* Regular expressions into grammar rules (engine/grammar_int.h, gr_regex_rule; engine/grammar.h,
 * gr_compile_regex): the tree of a pattern (engine/grammar_regex_parse.c) written as rules whose
 * terminals are the bytes of its code points, raw UTF-8 or the content of a JSON string written one
 * way; an unanchored pattern gets any text around it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_regex_int.h"

/* A product of byte classes: every byte string whose i-th byte is in c[i] (a piece of a set's UTF-8
 * encodings, or of its JSON escapes). */
struct bseq {
    struct gr_class c[6];
    int32_t n;
};

struct bseqs {
    struct bseq *v;
    int32_t n, cap;
};

static void class_add(struct gr_class *c, unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi; b++)
        c->bits[b >> 5] |= 1u << (b & 31);
}

/* Appends the product of byte ranges lo[i]..hi[i], i < n. */
static int bs_push(struct bseqs *s, const uint8_t *lo, const uint8_t *hi, int32_t n)
{
    if (s->n == s->cap) {
        int32_t nc = s->cap ? s->cap * 2 : 8;
        struct bseq *v = realloc(s->v, (size_t)nc * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = nc;
    }
    struct bseq *q = &s->v[s->n++];
    memset(q, 0, sizeof *q);
    q->n = n;
    for (int32_t i = 0; i < n; i++)
        class_add(&q->c[i], lo[i], hi[i]);
    return 0;
}

static int utf8_encode(uint32_t c, uint8_t *out)
{
    if (c < 0x80) {
        out[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (uint8_t)(0xC0 | c >> 6);
        out[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (uint8_t)(0xE0 | c >> 12);
        out[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | c >> 18);
    out[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Adds the UTF-8 encodings of code points lo..hi (no surrogates inside) to s: the range is cut until
 * each piece's encodings are all the byte strings with each byte between the lowest code point's and
 * the highest's. */
static int utf8_ranges(struct bseqs *s, uint32_t lo, uint32_t hi)
{
    static const uint32_t len_end[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_end[i] && hi > len_end[i])
            return utf8_ranges(s, lo, len_end[i]) | utf8_ranges(s, len_end[i] + 1, hi);
    for (int k = 1; k < 4 && hi >= 0x80; k++) {
        uint32_t m = (1u << (6 * k)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_ranges(s, lo, lo | m) | utf8_ranges(s, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return utf8_ranges(s, lo, (hi & ~m) - 1) | utf8_ranges(s, hi & ~m, hi);
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    return bs_push(s, a, b, n);
}

/* Merges products that differ in one position only (their union is the product with that position's
 * classes joined), until none do: fewer alternatives, so fewer matcher stacks. */
static void bs_merge(struct bseqs *s)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < s->n; i++)
            for (int32_t j = i + 1; j < s->n; j++) {
                struct bseq *p = &s->v[i], *q = &s->v[j];
                if (p->n != q->n)
                    continue;
                int32_t diff = -1, n_diff = 0;
                for (int32_t k = 0; k < p->n && n_diff < 2; k++)
                    if (memcmp(&p->c[k], &q->c[k], sizeof p->c[k]))
                        diff = k, n_diff++;
                if (n_diff > 1)
                    continue;
                if (diff >= 0)
                    for (int w = 0; w < 8; w++)
                        p->c[diff].bits[w] |= q->c[diff].bits[w];
                memmove(q, q + 1, (size_t)(s->n - j - 1) * sizeof *q);
                s->n--;
                j--;
                changed = true;
            }
    }
}

/* The byte strings of code point set c in x's context, as merged products. */
static int set_seqs(const struct rx *x, const struct rx_cset *c, struct bseqs *s)
{
    for (int32_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[2 * i], hi = c->r[2 * i + 1];
        if (x->ctx != GR_RX_JSON_STRING) {
            if (utf8_ranges(s, lo, hi) < 0)
                return -1;
            continue;
        }
        /* JSON string content: '"', '\\' and U+0001..U+001F escaped, each one way (as jansson writes
         * them: the two-character escapes where JSON has one, else \u00XX in upper case). */
        for (uint32_t cp = lo; cp <= hi && cp < 0x80; cp++) {
            static const char short_esc[] = "\b\f\n\r\t\"\\";
            static const char letter[] = "bfnrt\"\\";
            static const char hex[] = "0123456789ABCDEF";
            const char *e = cp ? strchr(short_esc, (int)cp) : NULL;
            uint8_t q[6];
            int32_t n = 1;
            q[0] = (uint8_t)cp;
            if (e) {
                q[0] = '\\', q[1] = (uint8_t)letter[e - short_esc];
                n = 2;
            } else if (cp < 0x20) {
                memcpy(q, "\\u00", 4);
                q[4] = (uint8_t)hex[cp >> 4], q[5] = (uint8_t)hex[cp & 15];
                n = 6;
            }
            if (bs_push(s, q, q, n) < 0)
                return -1;
        }
        if (hi >= 0x80 && utf8_ranges(s, lo < 0x80 ? 0x80 : lo, hi) < 0)
            return -1;
    }
    bs_merge(s);
    return 0;
}

static void emit_node(struct rx *x, struct gr_seq *seq, int32_t node);

static int32_t sub_rule(struct rx *x, const char *what)
{
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%s%d", x->name, what, x->n_sub++);
    return grb_rule(x->b, nm);
}

/* A rule for the byte strings of v[0..n) from position at on, left-factored: products that start
 * with the same class share one alternative, their common prefix followed by a rule of the rests
 * (so a matcher waiting for a character holds one stack per distinct first class). */
static int32_t seqs_rule(struct rx *x, struct bseq *v, int32_t n, int32_t at)
{
    int32_t r = sub_rule(x, "c");
    struct gr_seq a = {0};
    bool *done = calloc((size_t)n, sizeof *done);
    if (!done) {
        rx_oom(x);
        return -1;
    }
    for (int32_t i = 0; i < n && !rx_failed(x); i++) {
        if (done[i])
            continue;
        if (v[i].n == at) { /* nothing left */
            done[i] = true;
            grb_alt(x->b, r, &a);
            continue;
        }
        /* the products that start like v[i], gathered after it */
        int32_t m = 1;
        for (int32_t j = i + 1; j < n; j++)
            if (!done[j] && v[j].n > at && !memcmp(&v[j].c[at], &v[i].c[at], sizeof v[i].c[at])) {
                struct bseq t = v[j];
                memmove(&v[i + m + 1], &v[i + m], (size_t)(j - i - m) * sizeof *v);
                memmove(&done[i + m + 1], &done[i + m], (size_t)(j - i - m) * sizeof *done);
                v[i + m] = t;
                done[i + m] = false;
                m++;
            }
        int32_t common = 1;
        for (bool same = true; same && m > 1;) {
            int32_t k = at + common;
            for (int32_t j = i; j < i + m && same; j++)
                same = v[j].n > k && !memcmp(&v[j].c[k], &v[i].c[k], sizeof v[i].c[k]);
            if (same)
                common++;
        }
        if (m == 1)
            common = v[i].n - at;
        for (int32_t k = at; k < at + common; k++)
            grs_class(x->b, &a, &v[i].c[k]);
        if (m > 1)
            grs_rule(x->b, &a, seqs_rule(x, v + i, m, at + common));
        grb_alt(x->b, r, &a);
        for (int32_t j = i; j < i + m; j++)
            done[j] = true;
    }
    free(done);
    grs_free(&a);
    return r;
}

/* Appends one code point of c to seq: its bytes inline when c has one byte sequence, else a rule of
 * c's alternatives (made once per distinct set). */
static void emit_cset(struct rx *x, struct gr_seq *seq, const struct rx_cset *c, int32_t *memo)
{
    if (memo && *memo >= 0) {
        grs_rule(x->b, seq, *memo);
        return;
    }
    struct bseqs s = {0};
    if (set_seqs(x, c, &s) < 0) {
        free(s.v);
        rx_oom(x);
        return;
    }
    if (s.n == 1) {
        for (int32_t j = 0; j < s.v[0].n; j++)
            grs_class(x->b, seq, &s.v[0].c[j]);
        free(s.v);
        return;
    }
    int32_t r = seqs_rule(x, s.v, s.n, 0);
    free(s.v);
    if (memo)
        *memo = r;
    grs_rule(x->b, seq, r);
}

/* A rule for node alone (for repetition). */
static int32_t node_rule(struct rx *x, int32_t node)
{
    int32_t r = sub_rule(x, "g");
    struct gr_seq a = {0};
    emit_node(x, &a, node);
    grb_alt(x->b, r, &a);
    grs_free(&a);
    return r;
}

/* Counts n copies of repeated parts against GR_RX_MAX_COPIES (b fails past it). */
static void count_copies(struct rx *x, int64_t n, int32_t off)
{
    x->copies += n;
    if (x->copies > GR_RX_MAX_COPIES)
        grb_fail(x->b, "regex: repetition too large (more than %d copies in all) at offset %d",
                 GR_RX_MAX_COPIES, off);
}

static void emit_rep(struct rx *x, struct gr_seq *seq, const struct rx_node *nd)
{
    int32_t kid = x->kids[nd->first];
    int32_t min = nd->min, max = nd->max;
    if (max < 0 && x->nodes[kid].nullable) {
        /* (k){min,} with k nullable is k* */
        kid = rx_star_body(x, kid, nd->off);
        min = 0;
        if (kid < 0 || rx_kind(x, kid) == RX_NONE)
            return;
    }
    count_copies(x, max < 0 ? (int64_t)min + 1 : max, nd->off);
    if (rx_failed(x))
        return;
    /* one element per copy: a set's inline bytes when it has one byte sequence, else a rule */
    int32_t r = -1;
    bool inline_set = false;
    if (rx_kind(x, kid) == RX_SET) {
        struct gr_seq probe = {0};
        emit_node(x, &probe, kid);
        inline_set = probe.n == 1;
        if (!inline_set && probe.n > 0 && probe.e[0].kind == GR_RULE && probe.n == 1)
            r = probe.e[0].arg;
        grs_free(&probe);
    }
    if (!inline_set && r < 0)
        r = node_rule(x, kid);
    for (int32_t i = 0; i < min; i++) {
        if (inline_set)
            emit_node(x, seq, kid);
        else
            grs_rule(x->b, seq, r);
    }
    struct gr_seq a = {0};
    if (max < 0) {
        /* star ::= "" | kid star */
        int32_t star = sub_rule(x, "s");
        grb_alt(x->b, star, &a);
        if (inline_set)
            emit_node(x, &a, kid);
        else
            grs_rule(x->b, &a, r);
        grs_rule(x->b, &a, star);
        grb_alt(x->b, star, &a);
        grs_rule(x->b, seq, star);
    } else if (max > min) {
        /* opt_1 ::= "" | kid;  opt_j ::= "" | kid opt_{j-1} */
        int32_t prev = -1;
        for (int32_t j = 1; j <= max - min && !rx_failed(x); j++) {
            int32_t o = sub_rule(x, "o");
            grb_alt(x->b, o, &a);
            if (inline_set)
                emit_node(x, &a, kid);
            else
                grs_rule(x->b, &a, r);
            if (prev >= 0)
                grs_rule(x->b, &a, prev);
            grb_alt(x->b, o, &a);
            prev = o;
        }
        grs_rule(x->b, seq, prev);
    }
    grs_free(&a);
}

static void emit_node(struct rx *x, struct gr_seq *seq, int32_t node)
{
    if (rx_failed(x))
        return;
    /* a copy: writing a repetition may add nodes (and move x->nodes) */
    const struct rx_node nd = x->nodes[node];
    switch (nd.kind) {
    case RX_EMPTY:
        return;
    case RX_SET:
        /* equal sets share one rule */
        if (x->n_set_rule < x->n_sets) {
            int32_t *q = realloc(x->set_rule, (size_t)x->n_sets * sizeof *q);
            if (!q) {
                rx_oom(x);
                return;
            }
            for (int32_t j = x->n_set_rule; j < x->n_sets; j++)
                q[j] = -1;
            x->set_rule = q;
            x->n_set_rule = x->n_sets;
        }
        for (int32_t j = 0; j < x->n_sets && x->set_rule[nd.set] < 0; j++)
            if (x->set_rule[j] >= 0 && rx_cs_equal(&x->sets[j], &x->sets[nd.set]))
                x->set_rule[nd.set] = x->set_rule[j];
        emit_cset(x, seq, &x->sets[nd.set], &x->set_rule[nd.set]);
        return;
    case RX_CAT:
        for (int32_t i = 0; i < nd.n; i++)
            emit_node(x, seq, x->kids[nd.first + i]);
        return;
    case RX_ALT: {
        int32_t r = sub_rule(x, "a");
        struct gr_seq a = {0};
        for (int32_t i = 0; i < nd.n; i++) {
            emit_node(x, &a, x->kids[nd.first + i]);
            grb_alt(x->b, r, &a);
        }
        grs_free(&a);
        grs_rule(x->b, seq, r);
        return;
    }
    case RX_REP:
        emit_rep(x, seq, &nd);
        return;
    default:
        grb_fail(x->b, "regex: internal error (a part that matches nothing)");
    }
}

/* Any number of any code points (the text around an unanchored match). */
static int32_t any_star(struct rx *x)
{
    if (x->any_star >= 0)
        return x->any_star;
    int32_t any = rx_any_char(x);
    if (any < 0)
        return -1;
    int32_t star = sub_rule(x, "any");
    struct gr_seq a = {0};
    grb_alt(x->b, star, &a);
    emit_node(x, &a, any);
    grs_rule(x->b, &a, star);
    grb_alt(x->b, star, &a);
    grs_free(&a);
    x->any_star = star;
    return star;
}

int32_t gr_regex_rule(struct gr_builder *b, const char *pattern, bool anchored, enum gr_regex_ctx ctx,
                      const char *name)
{
    if (b->failed)
        return -1;
    if (!pattern) {
        grb_fail(b, "regex: no pattern");
        return -1;
    }
    struct rx x = {.b = b,
                   .pat = pattern,
                   .len = strlen(pattern),
                   .ctx = ctx,
                   .name = name ? name : "regex",
                   .any_star = -1};
    int32_t root = -1;
    if (rx_parse(&x) < 0)
        goto out;
    bool any = false;
    for (int32_t i = 0; i < x.n_tops; i++)
        any |= rx_kind(&x, x.tops[i].node) != RX_NONE;
    if (!any) {
        grb_fail(b, "regex: matches no string that can be generated (U+0000 is never generated)");
        goto out;
    }
    root = grb_rule(b, x.name);
    struct gr_seq seq = {0};
    for (int32_t i = 0; i < x.n_tops && !b->failed; i++) {
        const struct rx_top *t = &x.tops[i];
        if (rx_kind(&x, t->node) == RX_NONE)
            continue;
        int32_t body = t->node;
        if (!anchored && !t->dollar)
            body = rx_trim(&x, body, true);
        if (!anchored && !t->caret)
            body = rx_trim(&x, body, false);
        if (body < 0)
            break;
        if (!anchored && !t->caret)
            grs_rule(b, &seq, any_star(&x));
        emit_node(&x, &seq, body);
        if (!anchored && !t->dollar && (t->caret || rx_kind(&x, body) != RX_EMPTY))
            grs_rule(b, &seq, any_star(&x));
        grb_alt(b, root, &seq);
    }
    grs_free(&seq);
out:
    rx_free(&x);
    free(x.set_rule);
    return b->failed ? -1 : root;
}

struct grammar *gr_compile_regex(const char *pattern, const struct gr_vocab *v, char *err, size_t errlen)
{
    struct gr_builder b;
    grb_init(&b);
    int32_t root = gr_regex_rule(&b, pattern, true, GR_RX_RAW, "regex");
    return gr_finish(&b, root, v, err, errlen);
}
