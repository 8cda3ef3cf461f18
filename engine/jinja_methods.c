/* Python methods that templates call on strings (startswith, split, strip, ...), dicts (items, get,
 * ...) and loop.cycle; the globals of HF's environment (raise_exception, strftime_now, namespace,
 * dict, range); and argument binding for every callable. See jinja_int.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/jinja_int.h"

/* ---- argument binding */

void jbind(struct jctx *c, const struct jcallable *f, const char *what, struct jv *pos, size_t npos,
           const char **kwname, struct jv *kw, size_t nkw, struct jv *p, struct jv **rest, size_t *nrest)
{
    size_t np = 0, npos_max = JMAXPARAM; /* parameters, and how many of them positionals may fill */
    while (np < JMAXPARAM && f->params[np]) {
        if (strcmp(f->params[np], "*") == 0 && npos_max == JMAXPARAM)
            npos_max = np;
        np++;
    }
    bool star = npos_max < JMAXPARAM;
    if (!star)
        npos_max = np;
    for (size_t i = 0; i < JMAXPARAM; i++)
        p[i].t = JT_NOARG;
    *rest = NULL;
    *nrest = 0;
    if (npos > npos_max) {
        if (!star)
            jfail(&c->f, "%s '%s' takes at most %zu argument(s), %zu given", what, f->name, npos_max, npos);
        *rest = pos + npos_max;
        *nrest = npos - npos_max;
        npos = npos_max;
    }
    for (size_t i = 0; i < npos; i++)
        p[i] = pos[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(f->params[i], kwname[k]) != 0)
            i++;
        if (i == np)
            jfail(&c->f, "%s '%s' got an unexpected keyword argument '%s'", what, f->name, kwname[k]);
        if (p[i].t != JT_NOARG)
            jfail(&c->f, "%s '%s' got multiple values for argument '%s'", what, f->name, kwname[k]);
        p[i] = kw[k];
    }
}

/* ---- string helpers */

static bool py_isspace(int32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

static struct jv need_str(struct jctx *c, struct jv v, const char *what)
{
    jv_use(c, v);
    if (v.t != JT_STR)
        jfail(&c->f, "%s must be str, not %s", what, jv_typename(v));
    return v;
}

static bool in_set(int32_t cp, struct jv chars)
{
    if (chars.t != JT_STR)
        return py_isspace(cp);
    for (size_t off = 0; off < chars.u.s.n;) {
        int32_t x;
        off += jutf8_dec(chars.u.s.p + off, chars.u.s.n - off, &x);
        if (x == cp)
            return true;
    }
    return false;
}

struct jv jstr_strip(struct jctx *c, struct jv s, struct jv chars, bool left, bool right)
{
    if (chars.t != JT_NOARG && chars.t != JT_NONE)
        need_str(c, chars, "strip arg");
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n;
    while (left && b < e) {
        int32_t cp;
        size_t k = jutf8_dec(p + b, e - b, &cp);
        if (!in_set(cp, chars))
            break;
        b += k;
    }
    while (right && e > b) {
        size_t k = 1;
        while (k < e - b && ((unsigned char)p[e - k] & 0xC0) == 0x80)
            k++;
        int32_t cp;
        jutf8_dec(p + e - k, k, &cp);
        if (!in_set(cp, chars))
            break;
        e -= k;
    }
    return jv_str(p + b, e - b);
}

static bool is_cased(int32_t cp)
{
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* jinja2's title filter splits words at runs of -, whitespace, (, {, [ and <. */
static bool jinja_word_sep(int32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
}

struct jv jstr_case(struct jctx *c, struct jv s, enum jcase mode)
{
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    bool prev_cased = false, first = true, prev_sep = false;
    for (size_t off = 0; off < s.u.s.n;) {
        int32_t cp;
        off += jutf8_dec(s.u.s.p + off, s.u.s.n - off, &cp);
        int32_t out = cp;
        if (mode == CASE_UPPER && cp == 0xDF) { /* Python's full case mapping: the one that real text meets */
            jbuf_puts(&b, "SS");
            first = false;
            continue;
        }
        switch (mode) {
        case CASE_LOWER:
            out = utf8proc_tolower(cp);
            break;
        case CASE_UPPER:
            out = utf8proc_toupper(cp);
            break;
        case CASE_TITLE:
            out = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = is_cased(cp);
            break;
        case CASE_CAPITALIZE:
            out = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
            break;
        case CASE_JINJA_TITLE: {
            bool sep = jinja_word_sep(cp);
            out = (first || sep != prev_sep) ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            prev_sep = sep;
            break;
        }
        }
        first = false;
        jutf8_enc(&b, out);
    }
    return jv_str(b.p, b.n);
}

struct jv jstr_replace(struct jctx *c, struct jv s, struct jv old, struct jv new, struct jv count)
{
    need_str(c, old, "replace() argument 1");
    need_str(c, new, "replace() argument 2");
    int64_t max = -1;
    if (count.t == JT_INT)
        max = count.u.i;
    else if (count.t != JT_NOARG && count.t != JT_NONE)
        jfail(&c->f, "replace() count must be an integer");
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (old.u.s.n == 0) { /* Python inserts `new` around every character */
        int64_t done = 0;
        for (size_t off = 0;; done++) {
            if (max < 0 || done < max)
                jbuf_put(&b, new.u.s.p, new.u.s.n);
            if (off >= s.u.s.n)
                break;
            int32_t cp;
            size_t k = jutf8_dec(p + off, s.u.s.n - off, &cp);
            jbuf_put(&b, p + off, k);
            off += k;
        }
        return jv_str(b.p, b.n);
    }
    for (int64_t done = 0; max < 0 || done < max; done++) {
        const char *hit = memmem(p, (size_t)(end - p), old.u.s.p, old.u.s.n);
        if (!hit)
            break;
        jbuf_put(&b, p, (size_t)(hit - p));
        jbuf_put(&b, new.u.s.p, new.u.s.n);
        p = hit + old.u.s.n;
    }
    jbuf_put(&b, p, (size_t)(end - p));
    return jv_str(b.p, b.n);
}

/* ---- string methods */

static struct jv affix(struct jctx *c, struct jv s, struct jv *p, bool suffix)
{
    const char *name = suffix ? "endswith" : "startswith";
    if (p[1].t != JT_NOARG || p[2].t != JT_NOARG)
        jfail(&c->f, "unsupported start/end arguments of %s", name);
    jv_use(c, p[0]);
    struct jv one = p[0];
    struct jlist single = {.n = 1, .v = &one}, *l = p[0].t == JT_LIST && p[0].u.l->tuple ? p[0].u.l : &single;
    for (size_t i = 0; i < l->n; i++) {
        struct jv a = l->v[i];
        if (a.t != JT_STR)
            jfail(&c->f, "%s first arg must be str or a tuple of str, not %s", name, jv_typename(a));
        if (a.u.s.n <= s.u.s.n && memcmp(s.u.s.p + (suffix ? s.u.s.n - a.u.s.n : 0), a.u.s.p, a.u.s.n) == 0)
            return jv_bool(true);
    }
    return jv_bool(false);
}

static struct jv m_startswith(struct jctx *c, struct jv s, struct jv *p)
{
    return affix(c, s, p, false);
}
static struct jv m_endswith(struct jctx *c, struct jv s, struct jv *p)
{
    return affix(c, s, p, true);
}

/* str.split and str.rsplit: on `sep`, or on whitespace runs when sep is None. */
static struct jv split(struct jctx *c, struct jv s, struct jv *p, bool from_right)
{
    int64_t max = -1;
    if (p[1].t == JT_INT)
        max = p[1].u.i;
    else if (p[1].t != JT_NOARG)
        jfail(&c->f, "split() maxsplit must be an integer");
    struct jv sep = p[0];
    bool ws = sep.t == JT_NOARG || sep.t == JT_NONE;
    if (!ws) {
        need_str(c, sep, "split() separator");
        if (!sep.u.s.n)
            jfail(&c->f, "empty separator");
    }
    /* split into pieces left to right; with rsplit and a limit, the limit counts from the right */
    size_t cap = 8, n = 0;
    struct jv *parts = jalloc(&c->a, cap * sizeof *parts);
    const char *str = s.u.s.p;
    size_t len = s.u.s.n, pos = 0;
    int64_t limit = from_right ? -1 : max;
    while (pos <= len) {
        size_t start = pos, end, next;
        if (ws) {
            while (start < len) {
                int32_t cp;
                size_t k = jutf8_dec(str + start, len - start, &cp);
                if (!py_isspace(cp))
                    break;
                start += k;
            }
            if (start >= len)
                break;
            end = start;
            if (limit >= 0 && (int64_t)n == limit) {
                end = len; /* the rest as it is */
                next = len + 1;
            } else {
                while (end < len) {
                    int32_t cp;
                    size_t k = jutf8_dec(str + end, len - end, &cp);
                    if (py_isspace(cp))
                        break;
                    end += k;
                }
                next = end;
            }
        } else {
            const char *hit = (limit >= 0 && (int64_t)n == limit)
                                  ? NULL
                                  : memmem(str + pos, len - pos, sep.u.s.p, sep.u.s.n);
            end = hit ? (size_t)(hit - str) : len;
            next = hit ? end + sep.u.s.n : len + 1;
        }
        if (n == cap) {
            struct jv *np = jalloc(&c->a, 2 * cap * sizeof *np);
            memcpy(np, parts, n * sizeof *np);
            parts = np;
            cap *= 2;
        }
        parts[n++] = jv_str(str + start, end - start);
        pos = next;
    }
    if (from_right && max >= 0 && (int64_t)n > max + 1) { /* rejoin the leftmost pieces */
        size_t keep = (size_t)max, first = n - keep;
        const char *e = parts[first - 1].u.s.p + parts[first - 1].u.s.n;
        struct jlist *l = jlist_new(c, keep + 1);
        l->v[0] = jv_str(str, (size_t)(e - str));
        memcpy(l->v + 1, parts + first, keep * sizeof *parts);
        return (struct jv){.t = JT_LIST, .u.l = l};
    }
    struct jlist *l = jlist_new(c, n);
    memcpy(l->v, parts, n * sizeof *parts);
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static struct jv m_split(struct jctx *c, struct jv s, struct jv *p)
{
    return split(c, s, p, false);
}
static struct jv m_rsplit(struct jctx *c, struct jv s, struct jv *p)
{
    return split(c, s, p, true);
}
static struct jv m_strip(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_strip(c, s, p[0], true, true);
}
static struct jv m_lstrip(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_strip(c, s, p[0], true, false);
}
static struct jv m_rstrip(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_strip(c, s, p[0], false, true);
}
static struct jv m_lower(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_case(c, s, CASE_LOWER);
}
static struct jv m_upper(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_case(c, s, CASE_UPPER);
}
static struct jv m_title(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_case(c, s, CASE_TITLE);
}
static struct jv m_capitalize(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_case(c, s, CASE_CAPITALIZE);
}
static struct jv m_replace(struct jctx *c, struct jv s, struct jv *p)
{
    return jstr_replace(c, s, p[0], p[1], p[2]);
}

static struct jv m_join(struct jctx *c, struct jv s, struct jv *p)
{
    jv_use(c, p[0]);
    struct jlist *l = jv_iter(c, p[0]);
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].t != JT_STR)
            jfail(&c->f, "sequence item %zu: expected str instance, %s found", i, jv_typename(l->v[i]));
        if (i)
            jbuf_put(&b, s.u.s.p, s.u.s.n);
        jbuf_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
    }
    return jv_str(b.p, b.n);
}

/* ---- dict methods */

static struct jv m_items(struct jctx *c, struct jv d, struct jv *p)
{
    struct jlist *l = jlist_new(c, d.u.d->n);
    for (size_t i = 0; i < d.u.d->n; i++) {
        struct jlist *pair = jlist_new(c, 2);
        pair->tuple = true;
        pair->v[0] = d.u.d->k[i];
        pair->v[1] = d.u.d->v[i];
        l->v[i] = (struct jv){.t = JT_LIST, .u.l = pair};
    }
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static struct jv m_keys(struct jctx *c, struct jv d, struct jv *p)
{
    return (struct jv){.t = JT_LIST, .u.l = jv_iter(c, d)};
}

static struct jv m_values(struct jctx *c, struct jv d, struct jv *p)
{
    struct jlist *l = jlist_new(c, d.u.d->n);
    memcpy(l->v, d.u.d->v, d.u.d->n * sizeof *l->v);
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static struct jv m_get(struct jctx *c, struct jv d, struct jv *p)
{
    if (p[0].t == JT_NOARG)
        jfail(&c->f, "get expected at least 1 argument, got 0");
    const struct jv *v = jdict_get(d.u.d, p[0]);
    return v ? *v : p[1].t == JT_NOARG ? jv_none() : p[1];
}

/* ---- loop.cycle */

static struct jv m_cycle(struct jctx *c, struct jv loop, struct jv *p)
{
    if (!c->nrest)
        jfail(&c->f, "no items for cycling given");
    return c->rest[loop.u.loop->i % c->nrest];
}

enum { ON_STR = 1, ON_DICT = 2, ON_LOOP = 4 };

static const struct {
    struct jcallable f;
    int on;
} methods[] = {
    {{"startswith", m_startswith, {"prefix", "start", "end"}}, ON_STR},
    {{"endswith", m_endswith, {"suffix", "start", "end"}}, ON_STR},
    {{"split", m_split, {"sep", "maxsplit"}}, ON_STR},
    {{"rsplit", m_rsplit, {"sep", "maxsplit"}}, ON_STR},
    {{"strip", m_strip, {"chars"}}, ON_STR},
    {{"lstrip", m_lstrip, {"chars"}}, ON_STR},
    {{"rstrip", m_rstrip, {"chars"}}, ON_STR},
    {{"lower", m_lower, {NULL}}, ON_STR},
    {{"upper", m_upper, {NULL}}, ON_STR},
    {{"title", m_title, {NULL}}, ON_STR},
    {{"capitalize", m_capitalize, {NULL}}, ON_STR},
    {{"replace", m_replace, {"old", "new", "count"}}, ON_STR},
    {{"join", m_join, {"iterable"}}, ON_STR},
    {{"items", m_items, {NULL}}, ON_DICT},
    {{"keys", m_keys, {NULL}}, ON_DICT},
    {{"values", m_values, {NULL}}, ON_DICT},
    {{"get", m_get, {"key", "default"}}, ON_DICT},
    {{"cycle", m_cycle, {"*"}}, ON_LOOP},
};
#define NMETHODS (sizeof methods / sizeof methods[0])

const struct jcallable *jmethod_find(const char *name)
{
    for (size_t i = 0; i < NMETHODS; i++)
        if (strcmp(methods[i].f.name, name) == 0)
            return &methods[i].f;
    return NULL;
}

const struct jcallable *jmethod_of(struct jv v, const char *name, int *id)
{
    int on = v.t == JT_STR ? ON_STR : v.t == JT_DICT ? ON_DICT : v.t == JT_LOOP ? ON_LOOP : 0;
    for (size_t i = 0; on && i < NMETHODS; i++)
        if ((methods[i].on & on) && strcmp(methods[i].f.name, name) == 0) {
            *id = (int)i;
            return &methods[i].f;
        }
    return NULL;
}

const struct jcallable *jmethod_at(int id)
{
    return &methods[id].f;
}

/* ---- globals */

static struct jv g_raise_exception(struct jctx *c, struct jv self, struct jv *p)
{
    struct jv msg = jv_to_str(c, p[0].t == JT_NOARG ? jv_undef(NULL) : p[0]);
    snprintf(c->f.err, c->f.errlen, "%.*s", (int)msg.u.s.n, msg.u.s.p);
    c->f.code = JINJA_RAISED;
    longjmp(c->f.jb, 1);
}

static struct jv g_strftime_now(struct jctx *c, struct jv self, struct jv *p)
{
    struct jv fmt = need_str(c, p[0], "strftime() format");
    struct tm tm;
    time_t now = c->now;
    localtime_r(&now, &tm);
    char *f = jstrndup(&c->a, fmt.u.s.p, fmt.u.s.n), out[512];
    size_t n = strftime(out, sizeof out, f, &tm);
    if (n == 0 && fmt.u.s.n)
        jfail(&c->f, "strftime_now: the formatted date is empty or too long");
    return jv_cstr(c, out);
}

static struct jv g_range(struct jctx *c, struct jv self, struct jv *p)
{
    int64_t a[3] = {0, 0, 1};
    if (c->nrest < 1 || c->nrest > 3)
        jfail(&c->f, "range expected 1 to 3 arguments, got %zu", c->nrest);
    for (size_t i = 0; i < c->nrest; i++) {
        struct jv v = c->rest[i];
        jv_use(c, v);
        if (v.t != JT_INT && v.t != JT_BOOL)
            jfail(&c->f, "'%s' object cannot be interpreted as an integer", jv_typename(v));
        a[c->nrest == 1 ? 1 : i] = v.t == JT_BOOL ? v.u.b : v.u.i;
    }
    if (a[2] == 0)
        jfail(&c->f, "range() arg 3 must not be zero");
    int64_t n = a[2] > 0 ? (a[1] > a[0] ? (a[1] - a[0] + a[2] - 1) / a[2] : 0)
                         : (a[0] > a[1] ? (a[0] - a[1] - a[2] - 1) / -a[2] : 0);
    if (n > 100000) /* jinja2's sandbox refuses larger ranges */
        jfail(&c->f, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    struct jlist *l = jlist_new(c, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        l->v[i] = jv_int(a[0] + i * a[2]);
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static const struct jcallable globals[] = {
    {"raise_exception", g_raise_exception, {"message"}},
    {"strftime_now", g_strftime_now, {"format"}},
    {"range", g_range, {"*"}},
    {"namespace", NULL, {NULL}}, /* built by the evaluator from keyword arguments */
    {"dict", NULL, {NULL}},
};

const struct jcallable *jglobal_find(const char *name, int *id)
{
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strcmp(globals[i].name, name) == 0) {
            *id = (int)i;
            return &globals[i];
        }
    return NULL;
}

const struct jcallable *jglobal_at(int id)
{
    return &globals[id];
}
