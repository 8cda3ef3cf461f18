/* Parsing a regular expression (the ECMA-262 subset of docs/STRUCTURED_OUTPUT.md, "Regular
 * expressions") into the tree of engine/grammar_regex_int.h, and the rewrites of that tree that keep
 * the same language with fewer ways to match. Where ECMA-262 and PCRE2 (the validator of
 * engine/json_schema.c) give an escape different meanings (\s, \S, \v, .), the set is the code
 * points both accept, so that every generated string matches under either. U+0000 is never in a
 * set. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/grammar_regex_int.h"
#include "engine/util/array.h"

#define RX_MAX_CP 0x10FFFF
#define RX_MAX_DEPTH 200 /* most nested groups */

/* ---- sets of code points: sorted, disjoint, non-adjacent inclusive ranges once normalized ---- */

static int cs_add(struct rx_cset *c, uint32_t lo, uint32_t hi)
{
    if (c->n == c->cap) {
        int32_t nc = c->cap ? c->cap * 2 : 8;
        uint32_t *q = realloc(c->r, (size_t)nc * 2 * sizeof *q);
        if (!q)
            return -1;
        c->r = q;
        c->cap = nc;
    }
    c->r[2 * c->n] = lo;
    c->r[2 * c->n + 1] = hi;
    c->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void cs_norm(struct rx_cset *c)
{
    if (c->n < 2)
        return;
    qsort(c->r, (size_t)c->n, 2 * sizeof *c->r, cmp_range);
    int32_t k = 0;
    for (int32_t i = 1; i < c->n; i++) {
        if (c->r[2 * i] <= c->r[2 * k + 1] + 1) {
            if (c->r[2 * i + 1] > c->r[2 * k + 1])
                c->r[2 * k + 1] = c->r[2 * i + 1];
        } else {
            k++;
            c->r[2 * k] = c->r[2 * i];
            c->r[2 * k + 1] = c->r[2 * i + 1];
        }
    }
    c->n = k + 1;
}

/* out = the complement of c (normalized) in [0, RX_MAX_CP]. */
static int cs_invert(const struct rx_cset *c, struct rx_cset *out)
{
    out->n = 0;
    uint32_t next = 0;
    for (int32_t i = 0; i < c->n; i++) {
        if (c->r[2 * i] > next && cs_add(out, next, c->r[2 * i] - 1) < 0)
            return -1;
        next = c->r[2 * i + 1] + 1;
    }
    if (next <= RX_MAX_CP && cs_add(out, next, RX_MAX_CP) < 0)
        return -1;
    return 0;
}

/* out = a & b (both normalized). */
static int cs_and(const struct rx_cset *a, const struct rx_cset *b, struct rx_cset *out)
{
    out->n = 0;
    for (int32_t i = 0, j = 0; i < a->n && j < b->n;) {
        uint32_t lo = a->r[2 * i] > b->r[2 * j] ? a->r[2 * i] : b->r[2 * j];
        uint32_t hi = a->r[2 * i + 1] < b->r[2 * j + 1] ? a->r[2 * i + 1] : b->r[2 * j + 1];
        if (lo <= hi && cs_add(out, lo, hi) < 0)
            return -1;
        if (a->r[2 * i + 1] < b->r[2 * j + 1])
            i++;
        else
            j++;
    }
    return 0;
}

bool rx_cs_equal(const struct rx_cset *a, const struct rx_cset *b)
{
    return a->n == b->n && !memcmp(a->r, b->r, (size_t)a->n * 2 * sizeof *a->r);
}

/* The code points a grammar may generate: scalar values but U+0000. */
static const uint32_t universe[] = {1, 0xD7FF, 0xE000, RX_MAX_CP};
/* ECMA-262's WhiteSpace and LineTerminator (\s), and PCRE2's \s without PCRE2_UCP. */
static const uint32_t ecma_space[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680,
                                      0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x202F,
                                      0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
static const uint32_t pcre_space[] = {0x09, 0x0D, 0x20, 0x20};
/* PCRE2's \v (vertical space); ECMA-262's \v is U+000B alone. */
static const uint32_t pcre_vspace[] = {0x0A, 0x0D, 0x85, 0x85, 0x2028, 0x2029};
static const uint32_t digit[] = {'0', '9'};
static const uint32_t word[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
/* What `.` does not match (ECMA-262's LineTerminator; PCRE2 excludes only \n). */
static const uint32_t line_end[] = {0x0A, 0x0A, 0x0D, 0x0D, 0x2028, 0x2029};

/* Adds the ranges r[0..2 n) (sorted, disjoint), or their complement when negate, to c. */
static int cs_add_ranges(struct rx_cset *c, const uint32_t *r, size_t n, bool negate)
{
    struct rx_cset tmp = {0}, inv = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = cs_add(&tmp, r[2 * i], r[2 * i + 1]);
    if (rc == 0 && negate) {
        cs_norm(&tmp);
        rc = cs_invert(&tmp, &inv);
        struct rx_cset t2 = tmp;
        tmp = inv;
        inv = t2;
    }
    for (int32_t i = 0; i < tmp.n && rc == 0; i++)
        rc = cs_add(c, tmp.r[2 * i], tmp.r[2 * i + 1]);
    free(tmp.r);
    free(inv.r);
    return rc;
}
#define CS_TABLE(c, t, neg) cs_add_ranges((c), (t), sizeof(t) / sizeof *(t) / 2, (neg))

/* Python's re (with which python3-jsonschema checks `pattern`) gives \d, \w and \s their Unicode
 * meaning: decimal digits (Nd), alphanumerics (letters and numbers) and '_', and str.isspace(). The
 * sets come from utf8proc's categories, with the unassigned code points counted in (another Unicode
 * version may assign them), so that their complements are safe. Built once. */
static const uint32_t py_space_table[] = {0x09,   0x0D,   0x1C,   0x20,   0x85,   0x85,   0xA0,
                                          0xA0,   0x1680, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                                          0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000};
static struct rx_cset py_digit, py_word, py_space;
static bool py_ok;
static pthread_once_t py_once = PTHREAD_ONCE_INIT;

/* Adds code point cp, above every code point in c, to c. */
static int cs_append(struct rx_cset *c, uint32_t cp)
{
    if (c->n > 0 && c->r[2 * c->n - 1] + 1 == cp) {
        c->r[2 * c->n - 1] = cp;
        return 0;
    }
    return cs_add(c, cp, cp);
}

static void py_init(void)
{
    int rc = 0;
    for (uint32_t c = 1; c <= RX_MAX_CP && rc == 0; c++) {
        if (c >= 0xD800 && c < 0xE000)
            continue;
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
        bool unassigned = k == UTF8PROC_CATEGORY_CN;
        if (unassigned || k == UTF8PROC_CATEGORY_ND)
            rc |= cs_append(&py_digit, c);
        if (unassigned || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
            (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) || c == '_')
            rc |= cs_append(&py_word, c);
        if (unassigned)
            rc |= cs_append(&py_space, c);
    }
    rc |= CS_TABLE(&py_space, py_space_table, false);
    cs_norm(&py_space);
    py_ok = rc == 0;
}

/* The engines whose meanings a generated string must satisfy. */
enum { ENG_ECMA, ENG_PCRE, ENG_PY, N_ENG };

static void cs_free(struct rx_cset *sets)
{
    for (int i = 0; i < N_ENG; i++) {
        free(sets[i].r);
        memset(&sets[i], 0, sizeof sets[i]);
    }
}

/* ---- the tree ---- */

void rx_oom(struct rx *x)
{
    grb_fail(x->b, "out of memory building a grammar");
}

static bool grow(struct rx *x, void **p, int32_t n, int32_t *cap, size_t sz)
{
    if (n < *cap)
        return true;
    size_t c = (size_t)*cap;
    if (array_reserve(p, &c, (size_t)n + 1, sz, 16) || c > INT32_MAX) {
        rx_oom(x);
        return false;
    }
    *cap = (int32_t)c;
    return true;
}

static int32_t new_node(struct rx *x, int32_t kind, int32_t off)
{
    if (rx_failed(x) || !grow(x, (void **)&x->nodes, x->n_nodes, &x->cap_nodes, sizeof *x->nodes))
        return -1;
    x->nodes[x->n_nodes] =
        (struct rx_node){.kind = kind, .off = off, .set = -1, .nullable = kind == RX_EMPTY};
    return x->n_nodes++;
}

static int32_t mk_simple(struct rx *x, int32_t kind)
{
    return new_node(x, kind, 0);
}

/* A set node for c (normalized; restricted here to the universe). Takes c's memory. */
static int32_t mk_set(struct rx *x, struct rx_cset *c, int32_t off)
{
    struct rx_cset u = {0}, s = {0};
    if (rx_failed(x))
        goto out;
    for (size_t i = 0; i < sizeof universe / sizeof *universe; i += 2)
        if (cs_add(&u, universe[i], universe[i + 1]) < 0) {
            rx_oom(x);
            goto out;
        }
    if (cs_and(c, &u, &s) < 0) {
        rx_oom(x);
        goto out;
    }
    free(u.r);
    free(c->r);
    memset(c, 0, sizeof *c);
    if (s.n == 0) {
        free(s.r);
        return mk_simple(x, RX_NONE);
    }
    if (!grow(x, (void **)&x->sets, x->n_sets, &x->cap_sets, sizeof *x->sets)) {
        free(s.r);
        return -1;
    }
    int32_t n = new_node(x, RX_SET, off);
    if (n < 0) {
        free(s.r);
        return -1;
    }
    x->sets[x->n_sets] = s;
    x->nodes[n].set = x->n_sets++;
    return n;
out:
    free(u.r);
    free(s.r);
    free(c->r);
    memset(c, 0, sizeof *c);
    return -1;
}

static int32_t mk_char(struct rx *x, uint32_t cp, int32_t off)
{
    struct rx_cset c = {0};
    if (cs_add(&c, cp, cp) < 0) {
        rx_oom(x);
        return -1;
    }
    return mk_set(x, &c, off);
}

/* A concatenation (kind RX_CAT) or alternation (RX_ALT) of k[0..n), simplified: EMPTY parts of a
 * concatenation and NONE branches of an alternation dropped, a NONE part makes a NONE concatenation. */
static int32_t mk_list(struct rx *x, int32_t kind, const int32_t *k, int32_t n, int32_t off)
{
    if (rx_failed(x))
        return -1;
    int32_t m = 0, only = -1;
    bool none = false, nullable = kind == RX_CAT;
    for (int32_t i = 0; i < n; i++) {
        int32_t kk = rx_kind(x, k[i]);
        if (kind == RX_CAT && kk == RX_NONE)
            none = true;
        if ((kind == RX_CAT && kk == RX_EMPTY) || (kind == RX_ALT && kk == RX_NONE))
            continue;
        m++;
        only = k[i];
        if (kind == RX_CAT)
            nullable &= x->nodes[k[i]].nullable;
        else
            nullable |= x->nodes[k[i]].nullable;
    }
    if (none || (kind == RX_ALT && m == 0))
        return mk_simple(x, RX_NONE);
    if (kind == RX_ALT && m > 1) {
        /* branches that are single characters become one set: a|b|[cd] is [a-d] */
        int32_t n_sets = 0, first_set = -1;
        for (int32_t i = 0; i < n; i++)
            if (rx_kind(x, k[i]) == RX_SET)
                n_sets++, first_set = first_set < 0 ? i : first_set;
        if (n_sets > 1) {
            struct rx_cset u = {0};
            for (int32_t i = 0; i < n; i++) {
                const struct rx_cset *c = rx_kind(x, k[i]) == RX_SET ? &x->sets[x->nodes[k[i]].set] : NULL;
                for (int32_t j = 0; c && j < c->n; j++)
                    if (cs_add(&u, c->r[2 * j], c->r[2 * j + 1]) < 0) {
                        free(u.r);
                        rx_oom(x);
                        return -1;
                    }
            }
            cs_norm(&u);
            int32_t *k2 = malloc((size_t)n * sizeof *k2);
            if (!k2) {
                free(u.r);
                rx_oom(x);
                return -1;
            }
            int32_t n2 = 0;
            for (int32_t i = 0; i < n; i++)
                if (i == first_set)
                    k2[n2++] = mk_set(x, &u, x->nodes[k[i]].off);
                else if (rx_kind(x, k[i]) != RX_SET)
                    k2[n2++] = k[i];
            int32_t r = rx_failed(x) ? -1 : mk_list(x, kind, k2, n2, off);
            free(k2);
            return r;
        }
    }
    if (m == 0)
        return mk_simple(x, RX_EMPTY);
    if (m == 1)
        return only;
    int32_t node = new_node(x, kind, off);
    if (node < 0)
        return -1;
    x->nodes[node].first = x->n_kids;
    x->nodes[node].n = m;
    x->nodes[node].nullable = nullable;
    for (int32_t i = 0; i < n; i++) {
        int32_t kk = rx_kind(x, k[i]);
        if ((kind == RX_CAT && kk == RX_EMPTY) || (kind == RX_ALT && kk == RX_NONE))
            continue;
        if (!grow(x, (void **)&x->kids, x->n_kids, &x->cap_kids, sizeof *x->kids))
            return -1;
        x->kids[x->n_kids++] = k[i];
    }
    return node;
}

static int32_t mk_rep(struct rx *x, int32_t kid, int32_t min, int32_t max, int32_t off)
{
    if (rx_failed(x))
        return -1;
    int32_t kk = rx_kind(x, kid);
    if (kk == RX_NONE)
        return mk_simple(x, min == 0 ? RX_EMPTY : RX_NONE);
    if (max == 0 || kk == RX_EMPTY)
        return mk_simple(x, RX_EMPTY);
    if (min == 1 && max == 1)
        return kid;
    int32_t node = new_node(x, RX_REP, off);
    if (node < 0 || !grow(x, (void **)&x->kids, x->n_kids, &x->cap_kids, sizeof *x->kids))
        return -1;
    x->nodes[node].first = x->n_kids;
    x->nodes[node].n = 1;
    x->kids[x->n_kids++] = kid;
    x->nodes[node].min = min;
    x->nodes[node].max = max;
    x->nodes[node].nullable = min == 0 || x->nodes[kid].nullable;
    return node;
}

/* Parts whose repetition any number of times is node's (node nullable): node* = (p1 | .. | pk)*,
 * each part non-nullable, so that the right-recursive rule of the repetition reads a byte before it
 * recurses. A concatenation of nullable parts or a nullable alternation gives its parts' parts
 * ((a?b?)* is (a|b)*), a repetition its part's. Appended to *out. */
static void star_parts(struct rx *x, int32_t node, int32_t **out, int32_t *n, int32_t *cap)
{
    if (rx_failed(x))
        return;
    const struct rx_node nd = x->nodes[node];
    if (!nd.nullable) {
        if (grow(x, (void **)out, *n, cap, sizeof **out))
            (*out)[(*n)++] = node;
        return;
    }
    if (nd.kind == RX_CAT || nd.kind == RX_ALT || nd.kind == RX_REP)
        for (int32_t i = 0; i < nd.n; i++)
            star_parts(x, x->kids[nd.first + i], out, n, cap);
}

/* ---- parsing ---- */

static void rx_refuse(struct rx *x, size_t off, const char *what)
{
    grb_fail(x->b, "regex: unsupported %s at offset %zu", what, off);
}

static void rx_bad(struct rx *x, size_t off, const char *what)
{
    grb_fail(x->b, "regex: %s at offset %zu", what, off);
}

/* Decodes the UTF-8 code point at x->pos (advancing); -1 (x failed) on invalid UTF-8. */
static int32_t next_cp(struct rx *x)
{
    const unsigned char *s = (const unsigned char *)x->pat + x->pos;
    size_t left = x->len - x->pos;
    uint32_t c = s[0];
    int n = c < 0x80                ? 1
            : c >= 0xC2 && c < 0xE0 ? 2
            : c >= 0xE0 && c < 0xF0 ? 3
            : c >= 0xF0 && c < 0xF5 ? 4
                                    : 0;
    if (n == 0 || (size_t)n > left) {
        rx_bad(x, x->pos, "invalid UTF-8");
        return -1;
    }
    if (n > 1)
        c &= 0x3Fu >> (n - 1);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            rx_bad(x, x->pos, "invalid UTF-8");
            return -1;
        }
        c = c << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < least[n] || c > RX_MAX_CP || (c >= 0xD800 && c < 0xE000)) {
        rx_bad(x, x->pos, "invalid UTF-8");
        return -1;
    }
    x->pos += (size_t)n;
    return (int32_t)c;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* n hex digits at x->pos (advancing); -1 when they are not there. */
static int32_t hex_digits(struct rx *x, int n)
{
    int32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (x->pos + (size_t)i >= x->len || hexval(x->pat[x->pos + (size_t)i]) < 0)
            return -1;
        v = v * 16 + hexval(x->pat[x->pos + (size_t)i]);
    }
    x->pos += (size_t)n;
    return v;
}

/* \u escapes after the 'u' (x->pos just past it): HHHH (a surrogate pair of two \u escapes makes one
 * code point) or {H...}. -1 (x failed) when malformed. */
static int32_t unicode_escape(struct rx *x, size_t at)
{
    if (x->pos < x->len && x->pat[x->pos] == '{') {
        x->pos++;
        int32_t v = 0;
        size_t start = x->pos;
        while (x->pos < x->len && hexval(x->pat[x->pos]) >= 0 && v <= RX_MAX_CP)
            v = v * 16 + hexval(x->pat[x->pos++]);
        if (x->pos == start || x->pos >= x->len || x->pat[x->pos] != '}' || v > RX_MAX_CP) {
            rx_bad(x, at, "malformed \\u{...} escape");
            return -1;
        }
        x->pos++;
        if (v >= 0xD800 && v < 0xE000) {
            rx_refuse(x, at, "surrogate code point");
            return -1;
        }
        return v;
    }
    int32_t v = hex_digits(x, 4);
    if (v < 0) {
        rx_bad(x, at, "malformed \\u escape (expected 4 hex digits)");
        return -1;
    }
    if (v >= 0xD800 && v < 0xDC00 && x->pos + 6 <= x->len && x->pat[x->pos] == '\\' &&
        x->pat[x->pos + 1] == 'u') {
        size_t save = x->pos;
        x->pos += 2;
        int32_t lo = hex_digits(x, 4);
        if (lo >= 0xDC00 && lo < 0xE000)
            return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        x->pos = save;
    }
    if (v >= 0xD800 && v < 0xE000) {
        rx_refuse(x, at, "lone surrogate \\u escape");
        return -1;
    }
    return v;
}

/* What an escape or a class item stands for: one code point (cp >= 0), or (cp < 0) a class, whose
 * code points under each engine were added to the sets of parse_escape. */
struct item {
    int32_t cp;
};

/* Parses the escape whose backslash is at x->pos. A code point goes to it->cp; a class escape is
 * added to s[ENG_*], its meaning under each engine (it->cp = -1). 0, or -1 with x failed. */
static int parse_escape(struct rx *x, bool in_class, struct item *it, struct rx_cset *s)
{
    size_t at = x->pos;
    x->pos++;
    if (x->pos >= x->len) {
        rx_bad(x, at, "trailing backslash");
        return -1;
    }
    unsigned char c = (unsigned char)x->pat[x->pos];
    it->cp = -1;
    int rc = 0;
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S': {
        pthread_once(&py_once, py_init);
        if (!py_ok) {
            rx_oom(x);
            return -1;
        }
        bool neg = c < 'a';
        const struct rx_cset *py = c == 'd' || c == 'D'   ? &py_digit
                                   : c == 'w' || c == 'W' ? &py_word
                                                          : &py_space;
        if (c == 'd' || c == 'D')
            rc = CS_TABLE(&s[ENG_ECMA], digit, neg) | CS_TABLE(&s[ENG_PCRE], digit, neg);
        else if (c == 'w' || c == 'W')
            rc = CS_TABLE(&s[ENG_ECMA], word, neg) | CS_TABLE(&s[ENG_PCRE], word, neg);
        else
            rc = CS_TABLE(&s[ENG_ECMA], ecma_space, neg) | CS_TABLE(&s[ENG_PCRE], pcre_space, neg);
        rc |= cs_add_ranges(&s[ENG_PY], py->r, (size_t)py->n, neg);
        x->pos++;
        break;
    }
    case 'v':
        x->pos++;
        rc = cs_add(&s[ENG_ECMA], 0x0B, 0x0B) | CS_TABLE(&s[ENG_PCRE], pcre_vspace, false) |
             cs_add(&s[ENG_PCRE], 0x0B, 0x0B) | cs_add(&s[ENG_PY], 0x0B, 0x0B);
        break;
    case 't':
        it->cp = '\t', x->pos++;
        return 0;
    case 'n':
        it->cp = '\n', x->pos++;
        return 0;
    case 'r':
        it->cp = '\r', x->pos++;
        return 0;
    case 'f':
        it->cp = '\f', x->pos++;
        return 0;
    case 'b':
        if (in_class) {
            it->cp = '\b', x->pos++;
            return 0;
        }
        rx_refuse(x, at, "word boundary \\b");
        return -1;
    case 'B':
        rx_refuse(x, at, "word boundary \\B");
        return -1;
    case '0':
        x->pos++;
        if (x->pos < x->len && x->pat[x->pos] >= '0' && x->pat[x->pos] <= '9') {
            rx_refuse(x, at, "octal escape");
            return -1;
        }
        it->cp = 0;
        return 0;
    case 'x': {
        x->pos++;
        int32_t v = hex_digits(x, 2);
        if (v < 0) {
            rx_bad(x, at, "malformed \\x escape (expected 2 hex digits)");
            return -1;
        }
        it->cp = v;
        return 0;
    }
    case 'u':
        x->pos++;
        it->cp = unicode_escape(x, at);
        return it->cp < 0 ? -1 : 0;
    case 'c':
        x->pos++;
        if (x->pos < x->len && ((x->pat[x->pos] >= 'a' && x->pat[x->pos] <= 'z') ||
                                (x->pat[x->pos] >= 'A' && x->pat[x->pos] <= 'Z'))) {
            it->cp = x->pat[x->pos++] % 32;
            return 0;
        }
        rx_bad(x, at, "malformed \\c escape (expected a letter)");
        return -1;
    case 'k':
        rx_refuse(x, at, "named backreference \\k");
        return -1;
    case 'p':
    case 'P':
        rx_refuse(x, at, "Unicode property escape");
        return -1;
    default:
        if (c >= '1' && c <= '9') {
            rx_refuse(x, at, "backreference");
            return -1;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            char what[32];
            snprintf(what, sizeof what, "escape \\%c", c);
            rx_refuse(x, at, what);
            return -1;
        }
        /* an escaped punctuation or non-ASCII character stands for itself */
        it->cp = next_cp(x);
        return it->cp < 0 ? -1 : 0;
    }
    if (rc) {
        rx_oom(x);
        return -1;
    }
    return 0;
}

/* The set of an escape or class: what every engine puts in it, s[0] & s[1] & .., or when negated
 * ~s[0] & ~s[1] & ... Takes the sets' memory. */
static int32_t class_node(struct rx *x, struct rx_cset *s, bool negate, int32_t off)
{
    struct rx_cset acc = {0}, t = {0}, u = {0};
    int rc = cs_add(&acc, 0, RX_MAX_CP);
    for (int i = 0; i < N_ENG; i++) {
        cs_norm(&s[i]);
        if (negate) {
            rc |= cs_invert(&s[i], &t);
            rc |= cs_and(&acc, &t, &u);
        } else
            rc |= cs_and(&acc, &s[i], &u);
        struct rx_cset w = acc;
        acc = u;
        u = w;
        free(s[i].r);
        memset(&s[i], 0, sizeof s[i]);
    }
    free(t.r), free(u.r);
    if (rc) {
        free(acc.r);
        rx_oom(x);
        return -1;
    }
    return mk_set(x, &acc, off);
}

/* A class: x->pos at its '['. */
static int32_t parse_class(struct rx *x)
{
    size_t at = x->pos;
    x->pos++;
    bool negate = false;
    if (x->pos < x->len && x->pat[x->pos] == '^')
        negate = true, x->pos++;
    if (x->pos < x->len && x->pat[x->pos] == ']') {
        rx_refuse(x, at, negate ? "class [^] (ECMA-262 and PCRE2 differ)" : "empty class []");
        return -1;
    }
    struct rx_cset sets[N_ENG] = {{0}};
    for (;;) {
        if (x->pos >= x->len) {
            rx_bad(x, at, "unterminated class");
            goto fail;
        }
        if (x->pat[x->pos] == ']') {
            x->pos++;
            break;
        }
        size_t item_at = x->pos;
        struct item lo = {-1}, hi = {-1};
        if (x->pat[x->pos] == '[' && x->pos + 1 < x->len && strchr(":.=", x->pat[x->pos + 1])) {
            rx_refuse(x, item_at, "POSIX class syntax");
            goto fail;
        }
        if (x->pat[x->pos] == '\\') {
            if (parse_escape(x, true, &lo, sets) < 0)
                goto fail;
        } else if ((lo.cp = next_cp(x)) < 0) {
            goto fail;
        }
        if (x->pos + 1 < x->len && x->pat[x->pos] == '-' && x->pat[x->pos + 1] != ']') {
            size_t dash = x->pos;
            x->pos++;
            if (x->pat[x->pos] == '\\') {
                if (parse_escape(x, true, &hi, sets) < 0)
                    goto fail;
            } else if ((hi.cp = next_cp(x)) < 0) {
                goto fail;
            }
            if (lo.cp < 0 || hi.cp < 0) {
                rx_refuse(x, dash, "range with a class escape");
                goto fail;
            }
            if (lo.cp > hi.cp) {
                rx_bad(x, item_at, "class range out of order");
                goto fail;
            }
        } else {
            hi.cp = lo.cp;
        }
        for (int i = 0; i < N_ENG && lo.cp >= 0; i++)
            if (cs_add(&sets[i], (uint32_t)lo.cp, (uint32_t)hi.cp) < 0) {
                rx_oom(x);
                goto fail;
            }
    }
    return class_node(x, sets, negate, (int32_t)at);
fail:
    cs_free(sets);
    return -1;
}

/* A decimal number at x->pos (advancing), capped just above GR_RX_MAX_REPEAT; -1 when none. */
static int32_t number(struct rx *x)
{
    size_t start = x->pos;
    int32_t v = 0;
    while (x->pos < x->len && x->pat[x->pos] >= '0' && x->pat[x->pos] <= '9') {
        v = v * 10 + (x->pat[x->pos++] - '0');
        if (v > GR_RX_MAX_REPEAT)
            v = GR_RX_MAX_REPEAT + 1;
    }
    return x->pos == start ? -1 : v;
}

/* A quantifier at x->pos: 1 (min, max set, x->pos past it, its lazy '?' included), 0 when there is
 * none, -1 with x failed when it is malformed. */
static int quantifier(struct rx *x, int32_t *min, int32_t *max)
{
    if (x->pos >= x->len)
        return 0;
    size_t at = x->pos;
    char c = x->pat[x->pos];
    if (c == '*')
        *min = 0, *max = -1, x->pos++;
    else if (c == '+')
        *min = 1, *max = -1, x->pos++;
    else if (c == '?')
        *min = 0, *max = 1, x->pos++;
    else if (c == '{') {
        x->pos++;
        int32_t lo = number(x), hi = lo;
        if (lo >= 0 && x->pos < x->len && x->pat[x->pos] == ',') {
            x->pos++;
            hi = number(x);
        }
        if (lo < 0 || x->pos >= x->len || x->pat[x->pos] != '}') {
            x->pos = at;
            rx_refuse(x, at, "literal { (write \\{)");
            return -1;
        }
        x->pos++;
        if (lo > GR_RX_MAX_REPEAT || hi > GR_RX_MAX_REPEAT) {
            char what[64];
            snprintf(what, sizeof what, "repetition too large (bounds above %d)", GR_RX_MAX_REPEAT);
            rx_bad(x, at, what);
            return -1;
        }
        if (hi >= 0 && hi < lo) {
            rx_bad(x, at, "repetition bounds out of order");
            return -1;
        }
        *min = lo, *max = hi;
    } else
        return 0;
    if (x->pos < x->len && x->pat[x->pos] == '?')
        x->pos++; /* lazy: the same language */
    else if (x->pos < x->len && x->pat[x->pos] == '+') {
        rx_refuse(x, x->pos, "possessive quantifier");
        return -1;
    }
    return 1;
}

static int32_t parse_disjunction(struct rx *x, int depth);

/* A group: x->pos at its '('. */
static int32_t parse_group(struct rx *x, int depth)
{
    size_t at = x->pos;
    if (depth >= RX_MAX_DEPTH) {
        rx_bad(x, at, "groups nested too deep");
        return -1;
    }
    x->pos++;
    if (x->pos < x->len && x->pat[x->pos] == '?') {
        const char *s = x->pat + x->pos + 1;
        size_t left = x->len - x->pos - 1;
        if (left >= 1 && s[0] == ':') {
            x->pos += 2;
        } else if (left >= 1 && (s[0] == '=' || s[0] == '!')) {
            rx_refuse(x, at, "lookahead");
            return -1;
        } else if (left >= 2 && s[0] == '<' && (s[1] == '=' || s[1] == '!')) {
            rx_refuse(x, at, "lookbehind");
            return -1;
        } else if (left >= 1 && s[0] == '<') {
            size_t i = 1;
            while (i < left && (s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                                (i > 1 && s[i] >= '0' && s[i] <= '9')))
                i++;
            if (i == 1 || i >= left || s[i] != '>') {
                rx_refuse(x, at, "group name (letters, digits and _ only)");
                return -1;
            }
            x->pos += 1 + i + 1;
        } else {
            rx_refuse(x, at, "group syntax or inline flags (?");
            return -1;
        }
    }
    int32_t r = parse_disjunction(x, depth + 1);
    if (r < 0)
        return -1;
    if (x->pos >= x->len || x->pat[x->pos] != ')') {
        rx_bad(x, at, "missing ) for this (");
        return -1;
    }
    x->pos++;
    return r;
}

/* An atom and its quantifiers; -1 with x failed. */
static int32_t parse_term(struct rx *x, int depth)
{
    size_t at = x->pos;
    char c = x->pat[x->pos];
    int32_t a;
    int32_t min, max;
    if (c == '(') {
        a = parse_group(x, depth);
    } else if (c == '[') {
        a = parse_class(x);
    } else if (c == '.') {
        x->pos++;
        struct rx_cset sets[N_ENG] = {{0}};
        if (CS_TABLE(&sets[ENG_ECMA], line_end, false) | cs_add(&sets[ENG_PCRE], '\n', '\n') |
            cs_add(&sets[ENG_PY], '\n', '\n')) {
            cs_free(sets);
            rx_oom(x);
            return -1;
        }
        a = class_node(x, sets, true, (int32_t)at);
    } else if (c == '\\') {
        struct rx_cset sets[N_ENG] = {{0}};
        struct item it;
        if (parse_escape(x, false, &it, sets) < 0) {
            cs_free(sets);
            return -1;
        }
        if (it.cp >= 0) {
            cs_free(sets);
            a = mk_char(x, (uint32_t)it.cp, (int32_t)at);
        } else
            a = class_node(x, sets, false, (int32_t)at);
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        int q = quantifier(x, &min, &max);
        if (q > 0)
            rx_bad(x, at, "nothing to repeat");
        return -1;
    } else if (c == '^') {
        rx_refuse(x, at, "^ other than at the start of the pattern or of a top-level alternative");
        return -1;
    } else if (c == '$') {
        rx_refuse(x, at, "$ other than at the end of the pattern or of a top-level alternative");
        return -1;
    } else {
        int32_t cp = next_cp(x);
        if (cp < 0)
            return -1;
        a = mk_char(x, (uint32_t)cp, (int32_t)at);
    }
    for (;;) {
        if (a < 0)
            return -1;
        size_t qat = x->pos;
        int q = quantifier(x, &min, &max);
        if (q < 0)
            return -1;
        if (q == 0)
            return a;
        if (x->pos < x->len && strchr("*+?", x->pat[x->pos])) {
            rx_bad(x, x->pos, "nothing to repeat");
            return -1;
        }
        a = mk_rep(x, a, min, max, (int32_t)qat);
        if (x->pos < x->len && x->pat[x->pos] == '{') {
            rx_bad(x, x->pos, "nothing to repeat");
            return -1;
        }
    }
}

/* Terms up to '|', ')' or the end. At depth 0, a '$' before '|' or the end sets *dollar. */
static int32_t parse_alternative(struct rx *x, int depth, bool *dollar)
{
    int32_t *k = NULL;
    int32_t n = 0, cap = 0;
    size_t at = x->pos;
    while (x->pos < x->len && x->pat[x->pos] != '|' && x->pat[x->pos] != ')') {
        if (depth == 0 && x->pat[x->pos] == '$' &&
            (x->pos + 1 == x->len || x->pat[x->pos + 1] == '|' || x->pat[x->pos + 1] == ')')) {
            x->pos++;
            *dollar = true;
            break;
        }
        int32_t t = parse_term(x, depth);
        if (t < 0 || !grow(x, (void **)&k, n, &cap, sizeof *k)) {
            free(k);
            return -1;
        }
        k[n++] = t;
    }
    int32_t r = mk_list(x, RX_CAT, k, n, (int32_t)at);
    free(k);
    return r;
}

static int32_t parse_disjunction(struct rx *x, int depth)
{
    int32_t *k = NULL;
    int32_t n = 0, cap = 0;
    size_t at = x->pos;
    for (;;) {
        bool dollar = false;
        int32_t a = parse_alternative(x, depth, &dollar);
        if (a < 0 || !grow(x, (void **)&k, n, &cap, sizeof *k)) {
            free(k);
            return -1;
        }
        k[n++] = a;
        if (x->pos >= x->len || x->pat[x->pos] != '|')
            break;
        x->pos++;
    }
    int32_t r = mk_list(x, RX_ALT, k, n, (int32_t)at);
    free(k);
    return r;
}

/* The whole pattern: top-level alternatives, each with its own ^ and $. 0, or -1 with x failed. */
int rx_parse(struct rx *x)
{
    for (;;) {
        struct rx_top t = {0};
        if (x->pos < x->len && x->pat[x->pos] == '^')
            t.caret = true, x->pos++;
        t.node = parse_alternative(x, 0, &t.dollar);
        if (t.node < 0)
            return -1;
        if (x->pos < x->len && x->pat[x->pos] == ')') {
            rx_bad(x, x->pos, "unmatched )");
            return -1;
        }
        if (x->pos < x->len && x->pat[x->pos] != '|') {
            rx_refuse(x, x->pos, "$ other than at the end of the pattern or of a top-level alternative");
            return -1;
        }
        if (!grow(x, (void **)&x->tops, x->n_tops, &x->cap_tops, sizeof *x->tops))
            return -1;
        x->tops[x->n_tops++] = t;
        if (x->pos >= x->len)
            return 0;
        x->pos++; /* '|' */
    }
}

/* For a search, where any text may follow (at_end) or precede the match: a part of node that
 * matches the same texts once that text is added, with less repetition at that end. It keeps only
 * words of node, and every word of node still ends (starts) with one of them: a{2,5} becomes a{2},
 * b* and a nullable alternation nothing. Fewer ways to match the same text, so fewer matcher
 * stacks. */
int32_t rx_trim(struct rx *x, int32_t node, bool at_end)
{
    if (node < 0 || rx_failed(x))
        return -1;
    const struct rx_node nd = x->nodes[node];
    if (nd.nullable)
        return mk_simple(x, RX_EMPTY);
    switch (nd.kind) {
    case RX_REP:
        return mk_rep(x, x->kids[nd.first], nd.min, nd.min, nd.off);
    case RX_ALT: {
        int32_t *k = malloc((size_t)nd.n * sizeof *k);
        if (!k) {
            rx_oom(x);
            return -1;
        }
        for (int32_t i = 0; i < nd.n; i++)
            k[i] = rx_trim(x, x->kids[nd.first + i], at_end);
        int32_t r = rx_failed(x) ? -1 : mk_list(x, RX_ALT, k, nd.n, nd.off);
        free(k);
        return r;
    }
    case RX_CAT: {
        int32_t *k = malloc((size_t)nd.n * sizeof *k);
        if (!k) {
            rx_oom(x);
            return -1;
        }
        memcpy(k, x->kids + nd.first, (size_t)nd.n * sizeof *k);
        int32_t edge = at_end ? nd.n - 1 : 0;
        k[edge] = rx_trim(x, k[edge], at_end);
        int32_t r = rx_failed(x) ? -1 : mk_list(x, RX_CAT, k, nd.n, nd.off);
        free(k);
        return r;
    }
    default:
        return node;
    }
}

/* An unbounded repetition of kid (nullable) as the repetition of a non-nullable part: kid* is
 * (p1 | .. | pk)*. */
int32_t rx_star_body(struct rx *x, int32_t kid, int32_t off)
{
    int32_t *parts = NULL, n_parts = 0, cap = 0;
    star_parts(x, kid, &parts, &n_parts, &cap);
    int32_t r = rx_failed(x) ? -1 : mk_list(x, RX_ALT, parts, n_parts, off);
    free(parts);
    return r;
}

int32_t rx_any_char(struct rx *x)
{
    struct rx_cset all = {0};
    for (size_t i = 0; i < sizeof universe / sizeof *universe; i += 2)
        if (cs_add(&all, universe[i], universe[i + 1]) < 0) {
            free(all.r);
            rx_oom(x);
            return -1;
        }
    return mk_set(x, &all, 0);
}

void rx_free(struct rx *x)
{
    free(x->nodes);
    free(x->kids);
    for (int32_t i = 0; i < x->n_sets; i++)
        free(x->sets[i].r);
    free(x->sets);
    free(x->tops);
    x->nodes = NULL, x->kids = NULL, x->sets = NULL, x->tops = NULL;
}
