/* jinja2's filters and tests that chat templates use, with jinja2's semantics (and HF's tojson:
 * json.dumps with ensure_ascii=False unless asked). Anything not in these tables is refused when a
 * template is parsed. See jinja_int.h. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja_int.h"

static bool given(struct jv v)
{
    return v.t != JT_NOARG;
}
static struct jv list_of(struct jlist *l)
{
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static struct jv gen_of(struct jlist *l)
{
    l->gen = true;
    return list_of(l);
}

/* str(v) for the string filters; undefined reads as "". */
static struct jv soft_str(struct jctx *c, struct jv v)
{
    return jv_to_str(c, v);
}

/* ---- string filters */

static struct jv f_trim(struct jctx *c, struct jv v, struct jv *p)
{
    return jstr_strip(c, soft_str(c, v), p[0], true, true);
}
static struct jv f_upper(struct jctx *c, struct jv v, struct jv *p)
{
    return jstr_case(c, soft_str(c, v), CASE_UPPER);
}
static struct jv f_lower(struct jctx *c, struct jv v, struct jv *p)
{
    return jstr_case(c, soft_str(c, v), CASE_LOWER);
}
static struct jv f_title(struct jctx *c, struct jv v, struct jv *p)
{
    return jstr_case(c, soft_str(c, v), CASE_JINJA_TITLE);
}
static struct jv f_capitalize(struct jctx *c, struct jv v, struct jv *p)
{
    return jstr_case(c, soft_str(c, v), CASE_CAPITALIZE);
}
static struct jv f_string(struct jctx *c, struct jv v, struct jv *p)
{
    return soft_str(c, v);
}
static struct jv f_safe(struct jctx *c, struct jv v, struct jv *p)
{
    return v;
}

static struct jv f_replace(struct jctx *c, struct jv v, struct jv *p)
{
    struct jv old = p[0].t == JT_STR ? p[0] : soft_str(c, p[0]),
              new = p[1].t == JT_STR ? p[1] : soft_str(c, p[1]);
    return jstr_replace(c, soft_str(c, v), old, new, p[2]);
}

/* Python's str.splitlines: the lines of s without their line breaks. */
static struct jlist *splitlines(struct jctx *c, struct jv s)
{
    struct jlist *l = jlist_new(c, s.u.s.n + 1);
    l->n = 0;
    size_t start = 0;
    for (size_t off = 0; off < s.u.s.n;) {
        int32_t cp;
        size_t k = jutf8_dec(s.u.s.p + off, s.u.s.n - off, &cp);
        bool brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
                   cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            off += k;
            continue;
        }
        l->v[l->n++] = jv_str(s.u.s.p + start, off - start);
        off += k;
        if (cp == '\r' && off < s.u.s.n && s.u.s.p[off] == '\n')
            off++;
        start = off;
    }
    if (start < s.u.s.n)
        l->v[l->n++] = jv_str(s.u.s.p + start, s.u.s.n - start);
    return l;
}

/* indent(width=4, first=False, blank=False), jinja2 3.1's: every line but the first (with first,
 * that one too) and but blank ones (with blank, those too) gets the indentation. */
static struct jv f_indent(struct jctx *c, struct jv v, struct jv *p)
{
    jv_use(c, v);
    if (v.t != JT_STR)
        jfail(&c->f, "unsupported operand type(s) for +=: '%s' and 'str'", jv_typename(v));
    struct jv ind = jv_str("    ", 4);
    if (given(p[0]) && p[0].t == JT_STR) {
        ind = p[0];
    } else if (given(p[0])) {
        if (p[0].t != JT_INT && p[0].t != JT_BOOL)
            jfail(&c->f, "indent: width must be an integer or a string");
        int64_t w = p[0].t == JT_BOOL ? p[0].u.b : p[0].u.i;
        if (w > (int64_t)c->max_output)
            jfail(&c->f, "output limit of %zu bytes reached", c->max_output);
        char *sp = jalloc(&c->a, (size_t)(w > 0 ? w : 0) + 1);
        memset(sp, ' ', (size_t)(w > 0 ? w : 0));
        ind = jv_str(sp, (size_t)(w > 0 ? w : 0));
    }
    bool first = given(p[1]) && jv_truthy(p[1]), blank = given(p[2]) && jv_truthy(p[2]);
    char *nl = jalloc(&c->a, v.u.s.n + 1); /* jinja2 appends a newline before splitting */
    memcpy(nl, v.u.s.p, v.u.s.n);
    nl[v.u.s.n] = '\n';
    struct jlist *lines = splitlines(c, jv_str(nl, v.u.s.n + 1));
    struct jbuf b = {.a = &c->a, .max = c->max_output};
    jbuf_put(&b, "", 0);
    if (first)
        jbuf_put(&b, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < lines->n; i++) {
        struct jv line = lines->v[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if (blank || line.u.s.n)
                jbuf_put(&b, ind.u.s.p, ind.u.s.n);
        }
        jbuf_put(&b, line.u.s.p, line.u.s.n);
    }
    return jv_str(b.p, b.n);
}

/* ---- tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */

static struct jv f_tojson(struct jctx *c, struct jv v, struct jv *p)
{
    const char *indent = NULL, *item_sep = ", ", *key_sep = ": ";
    if (given(p[1]) && p[1].t != JT_NONE) {
        if (p[1].t == JT_INT) {
            int64_t k = p[1].u.i < 0 ? 0 : p[1].u.i;
            char *s = jalloc(&c->a, (size_t)k + 1);
            memset(s, ' ', (size_t)k);
            indent = s;
        } else if (p[1].t == JT_STR) {
            indent = jstrndup(&c->a, p[1].u.s.p, p[1].u.s.n);
        } else {
            jfail(&c->f, "tojson: indent must be an integer or a string");
        }
        item_sep = ",";
    }
    if (given(p[2]) && p[2].t != JT_NONE) {
        struct jv s = p[2];
        if (s.t != JT_LIST || s.u.l->n != 2 || s.u.l->v[0].t != JT_STR || s.u.l->v[1].t != JT_STR)
            jfail(&c->f, "tojson: separators must be a pair of strings");
        item_sep = jstrndup(&c->a, s.u.l->v[0].u.s.p, s.u.l->v[0].u.s.n);
        key_sep = jstrndup(&c->a, s.u.l->v[1].u.s.p, s.u.l->v[1].u.s.n);
    }
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    jv_json_to(c, &b, v, given(p[0]) && jv_truthy(p[0]), indent, item_sep, key_sep,
               given(p[3]) && jv_truthy(p[3]));
    return jv_str(b.p, b.n);
}

/* ---- sequences */

static struct jv f_length(struct jctx *c, struct jv v, struct jv *p)
{
    switch (v.t) {
    case JT_UNDEF:
        return jv_int(0);
    case JT_STR:
        return jv_int((int64_t)jutf8_len(v.u.s.p, v.u.s.n));
    case JT_LIST:
        if (v.u.l->gen)
            jfail(&c->f, "object of type 'generator' has no len()");
        return jv_int((int64_t)v.u.l->n);
    case JT_DICT:
    case JT_NS:
        return jv_int((int64_t)v.u.d->n);
    case JT_LOOP:
        return jv_int((int64_t)v.u.loop->n);
    default:
        jfail(&c->f, "object of type '%s' has no len()", jv_typename(v));
    }
}

/* first and last of an undefined value: undefined, as iterating and reversing it gives nothing */
static struct jv f_first(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *l = jv_iter(c, v);
    return l->n ? l->v[0] : jv_undef("No first item, sequence was empty.");
}

static struct jv f_last(struct jctx *c, struct jv v, struct jv *p)
{
    if ((v.t != JT_LIST && v.t != JT_STR && v.t != JT_UNDEF) || (v.t == JT_LIST && v.u.l->gen))
        jfail(&c->f, "'%s' object is not reversible", jv_typename(v));
    struct jlist *l = jv_iter(c, v);
    return l->n ? l->v[l->n - 1] : jv_undef("No last item, sequence was empty.");
}

static struct jv f_list(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *src = jv_iter(c, v), *l = jlist_new(c, src->n);
    memcpy(l->v, src->v, src->n * sizeof *l->v);
    return list_of(l);
}

static struct jv f_reverse(struct jctx *c, struct jv v, struct jv *p)
{
    jv_use(c, v);
    struct jlist *src = jv_iter(c, v), *l = jlist_new(c, src->n);
    for (size_t i = 0; i < src->n; i++)
        l->v[i] = src->v[src->n - 1 - i];
    if (v.t == JT_LIST && v.u.l->gen) /* reversed() refuses a generator: jinja2 makes a list */
        return list_of(l);
    if (v.t != JT_STR)
        return gen_of(l);
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    for (size_t i = 0; i < l->n; i++)
        jbuf_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
    return jv_str(b.p, b.n);
}

static struct jv f_items(struct jctx *c, struct jv v, struct jv *p)
{
    if (v.t == JT_UNDEF)
        return gen_of(jlist_new(c, 0));
    if (v.t != JT_DICT && v.t != JT_NS)
        jfail(&c->f, "Can only get item pairs from a mapping.");
    struct jlist *l = jlist_new(c, v.u.d->n);
    for (size_t i = 0; i < v.u.d->n; i++) {
        struct jlist *pair = jlist_new(c, 2);
        pair->tuple = true;
        pair->v[0] = v.u.d->k[i];
        pair->v[1] = v.u.d->v[i];
        l->v[i] = list_of(pair);
    }
    return gen_of(l);
}

/* jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0. */
static struct jv attr_path(struct jctx *c, struct jv v, struct jv attr)
{
    if (attr.t == JT_INT)
        return jgetitem(c, v, attr);
    if (attr.t != JT_STR)
        jfail(&c->f, "attribute must be a string or an integer");
    const char *s = attr.u.s.p, *end = s + attr.u.s.n;
    while (s <= end) {
        const char *dot = memchr(s, '.', (size_t)(end - s));
        const char *e = dot ? dot : end;
        char *part = jstrndup(&c->a, s, (size_t)(e - s));
        char *num_end;
        long long k = strtoll(part, &num_end, 10);
        v = (*part && !*num_end) ? jgetitem(c, v, jv_int(k)) : jgetitem(c, v, jv_str(part, (size_t)(e - s)));
        s = e + 1;
    }
    return v;
}

static struct jv f_join(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *l = jv_iter(c, v);
    struct jv sep = given(p[0]) ? soft_str(c, p[0]) : jv_str("", 0);
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jbuf_put(&b, sep.u.s.p, sep.u.s.n);
        jv_str_to(c, &b, given(p[1]) && p[1].t != JT_NONE ? attr_path(c, l->v[i], p[1]) : l->v[i]);
    }
    return jv_str(b.p, b.n);
}

/* map('filter', args...) or map(attribute=..., default=...): p[1] is attribute, p[2] default, and
 * the positionals (the filter's name, then its arguments) are the rest. */
static struct jv f_map(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *src = jv_iter(c, v), *l = jlist_new(c, src->n);
    struct jv *rest = c->rest;
    size_t nrest = c->nrest;
    if (given(p[1])) {
        if (nrest)
            jfail(&c->f, "map: a filter name and attribute= together");
        for (size_t i = 0; i < src->n; i++) {
            struct jv x = attr_path(c, src->v[i], p[1]);
            l->v[i] = x.t == JT_UNDEF && given(p[2]) ? p[2] : x;
        }
        return gen_of(l);
    }
    if (!nrest)
        jfail(&c->f, "map requires a filter argument");
    for (size_t i = 0; i < src->n; i++)
        l->v[i] = japply_named(c, false, rest[0], src->v[i], rest + 1, nrest - 1);
    return gen_of(l);
}

/* select/reject (attr absent) and selectattr/rejectattr: keep the items whose test result is `keep`. */
static struct jv select_items(struct jctx *c, struct jv v, struct jv attr, struct jv test, bool keep)
{
    struct jv *args = c->rest;
    size_t nargs = c->nrest;
    struct jlist *src = jv_iter(c, v), *l = jlist_new(c, src->n);
    l->n = 0;
    for (size_t i = 0; i < src->n; i++) {
        struct jv x = given(attr) ? attr_path(c, src->v[i], attr) : src->v[i];
        bool r = given(test) ? jv_truthy(japply_named(c, true, test, x, args, nargs)) : jv_truthy(x);
        if (r == keep)
            l->v[l->n++] = src->v[i];
    }
    return gen_of(l);
}

static struct jv none_arg(void)
{
    return (struct jv){.t = JT_NOARG};
}
static struct jv f_select(struct jctx *c, struct jv v, struct jv *p)
{
    return select_items(c, v, none_arg(), p[0], true);
}
static struct jv f_reject(struct jctx *c, struct jv v, struct jv *p)
{
    return select_items(c, v, none_arg(), p[0], false);
}

static struct jv f_selectattr(struct jctx *c, struct jv v, struct jv *p)
{
    if (!given(p[0]))
        jfail(&c->f, "selectattr requires an attribute");
    return select_items(c, v, p[0], p[1], true);
}

static struct jv f_rejectattr(struct jctx *c, struct jv v, struct jv *p)
{
    if (!given(p[0]))
        jfail(&c->f, "rejectattr requires an attribute");
    return select_items(c, v, p[0], p[1], false);
}

/* sort(reverse=False, case_sensitive=False, attribute=None): stable, strings compared lowercased. */
static struct jv f_sort(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *src = jv_iter(c, v);
    size_t n = src->n;
    struct jv *key = jalloc(&c->a, (n + 1) * sizeof *key);
    size_t *idx = jalloc(&c->a, (n + 1) * sizeof *idx);
    bool rev = given(p[0]) && jv_truthy(p[0]), cs = given(p[1]) && jv_truthy(p[1]);
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        key[i] = given(p[2]) && p[2].t != JT_NONE ? attr_path(c, src->v[i], p[2]) : src->v[i];
        if (!cs && key[i].t == JT_STR)
            key[i] = jstr_case(c, key[i], CASE_LOWER);
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: stable, and lists in templates are short */
        for (size_t j = i; j > 0; j--) {
            int k = jv_cmp(c, key[idx[j - 1]], key[idx[j]]);
            if (rev ? k >= 0 : k <= 0)
                break;
            size_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    struct jlist *l = jlist_new(c, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = src->v[idx[i]];
    return list_of(l);
}

/* The key of x for min, max and unique: x, or its attribute path; a string lowercased unless
 * case_sensitive (jinja2's make_attrgetter with ignore_case). */
static struct jv agg_key(struct jctx *c, struct jv x, struct jv case_sensitive, struct jv attr)
{
    struct jv k = given(attr) && attr.t != JT_NONE ? attr_path(c, x, attr) : x;
    if (!(given(case_sensitive) && jv_truthy(case_sensitive)) && k.t == JT_STR)
        k = jstr_case(c, k, CASE_LOWER);
    return k;
}

/* min / max (case_sensitive=False, attribute=None): the first smallest (largest) item, as Python's
 * min / max; an empty sequence gives undefined. */
static struct jv min_or_max(struct jctx *c, struct jv v, struct jv *p, int sign)
{
    struct jlist *src = jv_iter(c, v);
    if (src->n == 0)
        return jv_undef("No aggregated item, sequence was empty.");
    size_t best = 0;
    struct jv bk = agg_key(c, src->v[0], p[0], p[1]);
    for (size_t i = 1; i < src->n; i++) {
        struct jv k = agg_key(c, src->v[i], p[0], p[1]);
        if (sign * jv_cmp(c, k, bk) < 0) {
            best = i;
            bk = k;
        }
    }
    return src->v[best];
}

static struct jv f_min(struct jctx *c, struct jv v, struct jv *p)
{
    return min_or_max(c, v, p, 1);
}

static struct jv f_max(struct jctx *c, struct jv v, struct jv *p)
{
    return min_or_max(c, v, p, -1);
}

/* unique(case_sensitive=False, attribute=None): the items whose key was not seen before, in order
 * (a generator, as jinja2's). */
static struct jv f_unique(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *src = jv_iter(c, v);
    struct jlist *l = jlist_new(c, src->n);
    struct jv *keys = jalloc(&c->a, (src->n + 1) * sizeof *keys);
    size_t n = 0;
    for (size_t i = 0; i < src->n; i++) {
        struct jv k = agg_key(c, src->v[i], p[0], p[1]);
        jv_hashable(c, k);
        bool seen = false;
        for (size_t j = 0; j < n && !seen; j++)
            seen = jv_eq(keys[j], k);
        if (!seen) {
            keys[n] = k;
            l->v[n++] = src->v[i];
        }
    }
    l->n = n;
    return gen_of(l);
}

/* dictsort(case_sensitive=False, by='key', reverse=False): the (key, value) pairs of a mapping,
 * sorted by key or value (strings compared lowercased unless case_sensitive), as a list. */
static struct jv f_dictsort(struct jctx *c, struct jv v, struct jv *p)
{
    if (v.t != JT_DICT && v.t != JT_NS)
        jfail(&c->f, "You can only sort by either \"key\" or \"value\"");
    int by = 0;
    if (given(p[1])) {
        if (p[1].t == JT_STR && p[1].u.s.n == 3 && !memcmp(p[1].u.s.p, "key", 3))
            by = 0;
        else if (p[1].t == JT_STR && p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "value", 5))
            by = 1;
        else
            jfail(&c->f, "You can only sort by either \"key\" or \"value\"");
    }
    size_t n = v.u.d->n;
    bool rev = given(p[2]) && jv_truthy(p[2]), cs = given(p[0]) && jv_truthy(p[0]);
    size_t *idx = jalloc(&c->a, (n + 1) * sizeof *idx);
    struct jv *key = jalloc(&c->a, (n + 1) * sizeof *key);
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
        key[i] = by ? v.u.d->v[i] : v.u.d->k[i];
        if (!cs && key[i].t == JT_STR)
            key[i] = jstr_case(c, key[i], CASE_LOWER);
    }
    for (size_t i = 1; i < n; i++) /* stable, as Python's sorted */
        for (size_t j = i; j > 0; j--) {
            int k = jv_cmp(c, key[idx[j - 1]], key[idx[j]]);
            if (rev ? k >= 0 : k <= 0)
                break;
            size_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    struct jlist *l = jlist_new(c, n);
    for (size_t i = 0; i < n; i++) {
        struct jlist *pair = jlist_new(c, 2);
        pair->tuple = true;
        pair->v[0] = v.u.d->k[idx[i]];
        pair->v[1] = v.u.d->v[idx[i]];
        l->v[i] = list_of(pair);
    }
    return list_of(l);
}

static struct jv f_sum(struct jctx *c, struct jv v, struct jv *p)
{
    struct jlist *src = jv_iter(c, v);
    struct jv acc = given(p[1]) ? p[1] : jv_int(0);
    for (size_t i = 0; i < src->n; i++) {
        struct jv x = given(p[0]) && p[0].t != JT_NONE ? attr_path(c, src->v[i], p[0]) : src->v[i];
        jv_use(c, x);
        if (!jv_is_num(x) || !jv_is_num(acc))
            jfail(&c->f, "unsupported operand type(s) for +: '%s' and '%s'", jv_typename(acc),
                  jv_typename(x));
        if (acc.t == JT_FLOAT || x.t == JT_FLOAT)
            acc = jv_float(jv_num(acc) + jv_num(x));
        else if (__builtin_add_overflow((int64_t)jv_num(acc), (int64_t)jv_num(x), &acc.u.i))
            jfail(&c->f, "integer overflow");
        else
            acc.t = JT_INT;
    }
    return acc;
}

/* ---- values */

static struct jv f_default(struct jctx *c, struct jv v, struct jv *p)
{
    bool boolean = given(p[1]) && jv_truthy(p[1]);
    if (v.t == JT_UNDEF || (boolean && !jv_truthy(v)))
        return given(p[0]) ? p[0] : jv_str("", 0);
    return v;
}

/* s stripped of surrounding whitespace and of the underscores Python allows between digits
 * ("1_000"), NUL-terminated; NULL when an underscore stands anywhere else. */
static char *number_text(struct jctx *c, struct jv s)
{
    struct jv t = jstr_strip(c, s, none_arg(), true, true);
    char *z = jalloc(&c->a, t.u.s.n + 1);
    size_t k = 0;
    for (size_t i = 0; i < t.u.s.n; i++) {
        char ch = t.u.s.p[i];
        if (ch == '_') {
            bool between = i > 0 && i + 1 < t.u.s.n && isalnum((unsigned char)t.u.s.p[i - 1]) &&
                           isalnum((unsigned char)t.u.s.p[i + 1]);
            if (!between)
                return NULL;
            continue;
        }
        z[k++] = ch;
    }
    z[k] = 0;
    return z;
}

/* Python's float(str): surrounding whitespace allowed, the whole rest must be a number. */
static bool parse_float(struct jctx *c, struct jv s, double *out)
{
    char *z = number_text(c, s), *end;
    if (!z || !*z)
        return false;
    errno = 0;
    *out = strtod(z, &end);
    return *end == 0 && (strncmp(z, "0x", 2) != 0 && strncmp(z, "-0x", 3) != 0);
}

static struct jv f_int(struct jctx *c, struct jv v, struct jv *p)
{
    jv_use(c, v); /* int(Undefined) raises, as jinja2's Undefined does */
    struct jv dflt = given(p[0]) ? p[0] : jv_int(0);
    int base = 10;
    if (given(p[1])) {
        if (p[1].t != JT_INT)
            jfail(&c->f, "int: base must be an integer");
        base = (int)p[1].u.i;
    }
    switch (v.t) {
    case JT_INT:
        return v;
    case JT_BOOL:
        return jv_int(v.u.b);
    case JT_FLOAT:
        if (!isfinite(v.u.f))
            return dflt;
        return jv_int((int64_t)v.u.f);
    case JT_STR: {
        char *z = number_text(c, v), *end;
        errno = 0;
        long long k = z ? strtoll(z, &end, base) : 0;
        if (z && *z && *end == 0 && errno == 0)
            return jv_int(k);
        double f;
        if (base == 10 && parse_float(c, v, &f) && isfinite(f))
            return jv_int((int64_t)f);
        return dflt;
    }
    default:
        return dflt;
    }
}

static struct jv f_float(struct jctx *c, struct jv v, struct jv *p)
{
    jv_use(c, v); /* int(Undefined) raises, as jinja2's Undefined does */
    struct jv dflt = given(p[0]) ? p[0] : jv_float(0.0);
    double f;
    switch (v.t) {
    case JT_INT:
    case JT_BOOL:
    case JT_FLOAT:
        return jv_float(jv_num(v));
    case JT_STR:
        return parse_float(c, v, &f) ? jv_float(f) : dflt;
    default:
        return dflt;
    }
}

static struct jv f_abs(struct jctx *c, struct jv v, struct jv *p)
{
    jv_use(c, v);
    if (v.t == JT_FLOAT)
        return jv_float(fabs(v.u.f));
    if (v.t == JT_INT || v.t == JT_BOOL) {
        int64_t k = v.t == JT_BOOL ? v.u.b : v.u.i;
        if (k == INT64_MIN)
            jfail(&c->f, "integer overflow");
        return jv_int(k < 0 ? -k : k);
    }
    jfail(&c->f, "bad operand type for abs(): '%s'", jv_typename(v));
}

static const struct jcallable filters[] = {
    {"abs", f_abs, {NULL}},
    {"capitalize", f_capitalize, {NULL}},
    {"count", f_length, {NULL}},
    {"d", f_default, {"default_value", "boolean"}},
    {"dictsort", f_dictsort, {"case_sensitive", "by", "reverse"}},
    {"default", f_default, {"default_value", "boolean"}},
    {"first", f_first, {NULL}},
    {"float", f_float, {"default"}},
    {"indent", f_indent, {"width", "first", "blank"}},
    {"int", f_int, {"default", "base"}},
    {"items", f_items, {NULL}},
    {"join", f_join, {"d", "attribute"}},
    {"last", f_last, {NULL}},
    {"length", f_length, {NULL}},
    {"list", f_list, {NULL}},
    {"lower", f_lower, {NULL}},
    {"map", f_map, {"*", "attribute", "default"}},
    {"max", f_max, {"case_sensitive", "attribute"}},
    {"min", f_min, {"case_sensitive", "attribute"}},
    {"reject", f_reject, {"test", "*"}},
    {"rejectattr", f_rejectattr, {"attr", "test", "*"}},
    {"replace", f_replace, {"old", "new", "count"}},
    {"reverse", f_reverse, {NULL}},
    {"safe", f_safe, {NULL}},
    {"select", f_select, {"test", "*"}},
    {"selectattr", f_selectattr, {"attr", "test", "*"}},
    {"sort", f_sort, {"reverse", "case_sensitive", "attribute"}},
    {"string", f_string, {NULL}},
    {"sum", f_sum, {"attribute", "start"}},
    {"title", f_title, {NULL}},
    {"tojson", f_tojson, {"ensure_ascii", "indent", "separators", "sort_keys"}},
    {"trim", f_trim, {"chars"}},
    {"unique", f_unique, {"case_sensitive", "attribute"}},
    {"upper", f_upper, {NULL}},
};

const struct jcallable *jfilter_find(const char *name)
{
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (strcmp(filters[i].name, name) == 0)
            return &filters[i];
    return NULL;
}

/* ---- tests */

static struct jv arg1(struct jctx *c, struct jv *p, const char *test)
{
    if (!given(p[0]))
        jfail(&c->f, "test '%s' needs an argument", test);
    return p[0];
}

static struct jv t_defined(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t != JT_UNDEF);
}
static struct jv t_undefined(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_UNDEF);
}
static struct jv t_none(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_NONE);
}
static struct jv t_boolean(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_BOOL);
}
static struct jv t_true(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_BOOL && v.u.b);
}
static struct jv t_false(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_BOOL && !v.u.b);
}
static struct jv t_integer(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_INT);
}
static struct jv t_float(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_FLOAT);
}
static struct jv t_number(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_is_num(v));
}
static struct jv t_string(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_STR);
}
static struct jv t_mapping(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_DICT);
}

static struct jv t_iterable(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_UNDEF || v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT);
}

static struct jv t_sequence(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_UNDEF || v.t == JT_STR || (v.t == JT_LIST && !v.u.l->gen) || v.t == JT_DICT);
}

static struct jv t_callable(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(v.t == JT_MACRO || v.t == JT_FUNC || v.t == JT_METHOD);
}

static struct jv t_eq(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_eq(v, arg1(c, p, "eq")));
}
static struct jv t_ne(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(!jv_eq(v, arg1(c, p, "ne")));
}
static struct jv t_lt(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_cmp(c, v, arg1(c, p, "lt")) < 0);
}
static struct jv t_le(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_cmp(c, v, arg1(c, p, "le")) <= 0);
}
static struct jv t_gt(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_cmp(c, v, arg1(c, p, "gt")) > 0);
}
static struct jv t_ge(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(jv_cmp(c, v, arg1(c, p, "ge")) >= 0);
}

/* `is sameas`: identity; for the singletons None, True and False the same as equality of type and value. */
static struct jv t_sameas(struct jctx *c, struct jv v, struct jv *p)
{
    struct jv o = arg1(c, p, "sameas");
    if (v.t != o.t)
        return jv_bool(false);
    if (v.t == JT_NONE || v.t == JT_BOOL)
        return jv_bool(jv_eq(v, o));
    if (v.t == JT_LIST)
        return jv_bool(v.u.l == o.u.l);
    if (v.t == JT_DICT || v.t == JT_NS)
        return jv_bool(v.u.d == o.u.d);
    return jv_bool(jv_eq(v, o));
}

static struct jv t_in(struct jctx *c, struct jv v, struct jv *p)
{
    struct jv seq = arg1(c, p, "in");
    if (seq.t == JT_STR) {
        if (v.t != JT_STR)
            jfail(&c->f, "'in <string>' requires string as left operand, not %s", jv_typename(v));
        return jv_bool(!v.u.s.n || memmem(seq.u.s.p, seq.u.s.n, v.u.s.p, v.u.s.n));
    }
    if (seq.t == JT_DICT || seq.t == JT_NS)
        return jv_bool(jdict_get(seq.u.d, v) != NULL);
    struct jlist *l = jv_iter(c, seq);
    for (size_t i = 0; i < l->n; i++)
        if (jv_eq(l->v[i], v))
            return jv_bool(true);
    return jv_bool(false);
}

static int64_t need_int(struct jctx *c, struct jv v, const char *test)
{
    jv_use(c, v);
    if (v.t != JT_INT && v.t != JT_BOOL)
        jfail(&c->f, "test '%s' needs an integer, not %s", test, jv_typename(v));
    return v.t == JT_BOOL ? v.u.b : v.u.i;
}

static struct jv t_even(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(need_int(c, v, "even") % 2 == 0);
}
static struct jv t_odd(struct jctx *c, struct jv v, struct jv *p)
{
    return jv_bool(need_int(c, v, "odd") % 2 != 0);
}

static struct jv t_divisibleby(struct jctx *c, struct jv v, struct jv *p)
{
    int64_t d = need_int(c, arg1(c, p, "divisibleby"), "divisibleby");
    if (d == 0)
        jfail(&c->f, "integer division or modulo by zero");
    return jv_bool(need_int(c, v, "divisibleby") % d == 0);
}

static struct jv t_lower(struct jctx *c, struct jv v, struct jv *p)
{
    struct jv s = soft_str(c, v);
    struct jv l = jstr_case(c, s, CASE_LOWER);
    return jv_bool(jv_eq(s, l) && !jv_eq(s, jstr_case(c, s, CASE_UPPER)));
}

static struct jv t_upper(struct jctx *c, struct jv v, struct jv *p)
{
    struct jv s = soft_str(c, v);
    struct jv u = jstr_case(c, s, CASE_UPPER);
    return jv_bool(jv_eq(s, u) && !jv_eq(s, jstr_case(c, s, CASE_LOWER)));
}

static const struct jcallable tests[] = {
    {"!=", t_ne, {"other"}},
    {"<", t_lt, {"other"}},
    {"<=", t_le, {"other"}},
    {"==", t_eq, {"other"}},
    {">", t_gt, {"other"}},
    {">=", t_ge, {"other"}},
    {"boolean", t_boolean, {NULL}},
    {"callable", t_callable, {NULL}},
    {"defined", t_defined, {NULL}},
    {"divisibleby", t_divisibleby, {"num"}},
    {"eq", t_eq, {"other"}},
    {"equalto", t_eq, {"other"}},
    {"even", t_even, {NULL}},
    {"false", t_false, {NULL}},
    {"float", t_float, {NULL}},
    {"ge", t_ge, {"other"}},
    {"greaterthan", t_gt, {"other"}},
    {"gt", t_gt, {"other"}},
    {"in", t_in, {"seq"}},
    {"integer", t_integer, {NULL}},
    {"iterable", t_iterable, {NULL}},
    {"le", t_le, {"other"}},
    {"lessthan", t_lt, {"other"}},
    {"lower", t_lower, {NULL}},
    {"lt", t_lt, {"other"}},
    {"mapping", t_mapping, {NULL}},
    {"ne", t_ne, {"other"}},
    {"none", t_none, {NULL}},
    {"number", t_number, {NULL}},
    {"odd", t_odd, {NULL}},
    {"sameas", t_sameas, {"other"}},
    {"sequence", t_sequence, {NULL}},
    {"string", t_string, {NULL}},
    {"true", t_true, {NULL}},
    {"undefined", t_undefined, {NULL}},
    {"upper", t_upper, {NULL}},
};

const struct jcallable *jtest_find(const char *name)
{
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (strcmp(tests[i].name, name) == 0)
            return &tests[i];
    return NULL;
}
