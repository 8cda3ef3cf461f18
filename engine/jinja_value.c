/* Jinja values with Python's semantics: JSON input, truth, equality, ordering, iteration, and the
 * UTF-8 helpers that make string lengths and indices count code points. See jinja_int.h. */
#include <jansson.h>
#include <string.h>

#include "engine/jinja_int.h"

struct jlist *jlist_new(struct jctx *c, size_t n)
{
    struct jlist *l = jalloc(&c->a, sizeof *l);
    l->n = n;
    l->v = jalloc(&c->a, (n ? n : 1) * sizeof *l->v); /* never NULL: memcpy of 0 items from it is defined */
    return l;
}

struct jdict *jdict_new(struct jctx *c, size_t cap)
{
    struct jdict *d = jalloc(&c->a, sizeof *d);
    d->cap = cap ? cap : 4;
    d->k = jalloc(&c->a, d->cap * sizeof *d->k);
    d->v = jalloc(&c->a, d->cap * sizeof *d->v);
    return d;
}

const struct jv *jdict_get(const struct jdict *d, struct jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k))
            return &d->v[i];
    return NULL;
}

const struct jv *jdict_gets(const struct jdict *d, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JT_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, key, n) == 0)
            return &d->v[i];
    return NULL;
}

void jdict_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) {
            d->v[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        struct jv *nk = jalloc(&c->a, cap * sizeof *nk), *nv = jalloc(&c->a, cap * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

struct jv jv_cstr(struct jctx *c, const char *s)
{
    size_t n = strlen(s);
    return jv_str(jstrndup(&c->a, s, n), n);
}

static struct jv from_json(struct jctx *c, const json_t *j);

struct jv jv_from_json(struct jctx *c, const json_t *j)
{
    jdepth_enter(c);
    struct jv v = from_json(c, j);
    jdepth_leave(c);
    return v;
}

static struct jv from_json(struct jctx *c, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jdict *d = jdict_new(c, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            d->k[d->n] = jv_str(k, strlen(k));
            d->v[d->n++] = jv_from_json(c, v);
        }
        return (struct jv){.t = JT_DICT, .u.d = d};
    }
    case JSON_ARRAY: {
        struct jlist *l = jlist_new(c, json_array_size(j));
        for (size_t i = 0; i < l->n; i++)
            l->v[i] = jv_from_json(c, json_array_get(j, i));
        return (struct jv){.t = JT_LIST, .u.l = l};
    }
    case JSON_STRING:
        return jv_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(true);
    case JSON_FALSE:
        return jv_bool(false);
    default:
        return jv_none();
    }
}

bool jv_truthy(struct jv v)
{
    switch (v.t) {
    case JT_UNDEF:
    case JT_NONE:
    case JT_NOARG:
        return false;
    case JT_BOOL:
        return v.u.b;
    case JT_INT:
        return v.u.i != 0;
    case JT_FLOAT:
        return v.u.f != 0;
    case JT_STR:
        return v.u.s.n > 0;
    case JT_LIST:
        return v.u.l->gen || v.u.l->n > 0;
    case JT_DICT:
        return v.u.d->n > 0;
    default:
        return true;
    }
}

bool jv_is_num(struct jv v)
{
    return v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL;
}

double jv_num(struct jv v)
{
    return v.t == JT_FLOAT ? v.u.f : v.t == JT_BOOL ? (double)v.u.b : (double)v.u.i;
}

static bool is_intlike(struct jv v)
{
    return v.t == JT_INT || v.t == JT_BOOL;
}
static int64_t intval(struct jv v)
{
    return v.t == JT_BOOL ? v.u.b : v.u.i;
}

static bool eq_at(struct jv a, struct jv b, int depth);

bool jv_eq(struct jv a, struct jv b)
{
    return eq_at(a, b, 0);
}

void jdepth_enter(struct jctx *c)
{
    if (++c->vdepth > JMAXDEPTH)
        jfail(&c->f, "value nested too deeply (more than %d levels)", JMAXDEPTH);
}

static bool eq_at(struct jv a, struct jv b, int depth)
{
    if (depth > JMAXDEPTH)
        return false;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            return intval(a) == intval(b);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JT_UNDEF:
    case JT_NONE:
        return true;
    case JT_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JT_LIST:
        if (a.u.l->gen || b.u.l->gen)
            return a.u.l == b.u.l;
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1))
                return false;
        return true;
    case JT_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const struct jv *o = jdict_get(b.u.d, a.u.d->k[i]);
            if (!o || !eq_at(a.u.d->v[i], *o, depth + 1))
                return false;
        }
        return true;
    case JT_NS:
        return a.u.d == b.u.d;
    case JT_MACRO:
        return a.u.m == b.u.m;
    case JT_LOOP:
        return a.u.loop == b.u.loop;
    case JT_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return false;
    }
}

const char *jv_typename(struct jv v)
{
    switch (v.t) {
    case JT_UNDEF:
        return "Undefined";
    case JT_NONE:
        return "NoneType";
    case JT_BOOL:
        return "bool";
    case JT_INT:
        return "int";
    case JT_FLOAT:
        return "float";
    case JT_STR:
        return "str";
    case JT_LIST:
        return v.u.l->gen ? "generator" : v.u.l->tuple ? "tuple" : "list";
    case JT_DICT:
        return "dict";
    case JT_NS:
        return "Namespace";
    case JT_LOOP:
        return "LoopContext";
    case JT_MACRO:
        return "Macro";
    default:
        return "function";
    }
}

void jv_hashable(struct jctx *c, struct jv v)
{
    if ((v.t == JT_LIST && !v.u.l->tuple && !v.u.l->gen) || v.t == JT_DICT)
        jfail(&c->f, "unhashable type: '%s'", jv_typename(v));
}

void jv_use(struct jctx *c, struct jv v)
{
    if (v.t == JT_UNDEF)
        jfail(&c->f, "%s", v.u.s.p ? v.u.s.p : "undefined value used");
}

static int sign3(int k)
{
    return (k > 0) - (k < 0);
}

int jv_cmp(struct jctx *c, struct jv a, struct jv b)
{
    jv_use(c, a);
    jv_use(c, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            return (intval(a) > intval(b)) - (intval(a) < intval(b));
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int k = memcmp(a.u.s.p, b.u.s.p, n); /* UTF-8 byte order is code point order */
        return k ? sign3(k) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->gen && !b.u.l->gen) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        int k = 0;
        jdepth_enter(c);
        for (size_t i = 0; i < n && !k; i++)
            if (!jv_eq(a.u.l->v[i], b.u.l->v[i]))
                k = jv_cmp(c, a.u.l->v[i], b.u.l->v[i]);
        jdepth_leave(c);
        return k ? k : (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jfail(&c->f, "'<' not supported between instances of '%s' and '%s'", jv_typename(a), jv_typename(b));
}

struct jlist *jv_iter(struct jctx *c, struct jv v)
{
    switch (v.t) {
    case JT_UNDEF:
        return jlist_new(c, 0);
    case JT_LIST:
        return v.u.l;
    case JT_DICT:
    case JT_NS: {
        struct jlist *l = jlist_new(c, v.u.d->n);
        memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
        return l;
    }
    case JT_STR: {
        struct jlist *l = jlist_new(c, jutf8_len(v.u.s.p, v.u.s.n));
        size_t off = 0;
        for (size_t i = 0; i < l->n; i++) {
            int32_t cp;
            size_t k = jutf8_dec(v.u.s.p + off, v.u.s.n - off, &cp);
            l->v[i] = jv_str(v.u.s.p + off, k);
            off += k;
        }
        return l;
    }
    default:
        jfail(&c->f, "'%s' object is not iterable", jv_typename(v));
    }
}

/* ---- UTF-8 */

size_t jutf8_dec(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if (k > n) {
        *cp = u[0];
        return 1;
    }
    int32_t v = k == 1 ? u[0] : u[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = u[0];
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    return k;
}

size_t jutf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t off = 0; off < n; k++) {
        int32_t cp;
        off += jutf8_dec(s + off, n - off, &cp);
    }
    return k;
}

size_t jutf8_off(const char *s, size_t n, size_t i)
{
    size_t off = 0;
    for (; i > 0 && off < n; i--) {
        int32_t cp;
        off += jutf8_dec(s + off, n - off, &cp);
    }
    return off;
}

void jutf8_enc(struct jbuf *b, int32_t cp)
{
    char t[4];
    size_t k;
    if (cp < 0x80) {
        t[0] = (char)cp, k = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6)), t[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)), t[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        t[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)), t[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    }
    jbuf_put(b, t, k);
}
