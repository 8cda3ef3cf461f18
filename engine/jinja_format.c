/* Values as text the way Python writes them: str() for {{ }} output, repr() inside lists and dicts,
 * float repr (the shortest digits that read back, 1.0, 1e-05, 1e+16), and json.dumps as HF's tojson
 * calls it. See jinja_int.h. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/jinja_int.h"

void jfloat_repr(char *out, size_t cap, double f)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec < 17; prec++) { /* the shortest %e that reads back as f */
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    snprintf(e, sizeof e, "%.*e", prec - 1, f);
    /* e is [-]d[.ddd]e[+-]XX: gather the digits and the decimal exponent */
    const char *p = e;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[20];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = cap;
#define PUT(...)                                                                                             \
    do {                                                                                                     \
        int k_ = snprintf(o, left, __VA_ARGS__);                                                             \
        if (k_ > 0 && (size_t)k_ < left)                                                                     \
            o += k_, left -= (size_t)k_;                                                                     \
    } while (0)
    if (neg)
        PUT("-");
    if (exp10 < -4 || exp10 >= 16) {
        PUT("%c", digits[0]);
        if (nd > 1)
            PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        PUT("0.");
        for (int i = -1; i > exp10; i--)
            PUT("0");
        PUT("%s", digits);
    } else {
        for (int i = 0; i <= exp10; i++)
            PUT("%c", (size_t)i < nd ? digits[i] : '0');
        PUT(".");
        if ((size_t)exp10 + 1 < nd)
            PUT("%s", digits + exp10 + 1);
        else
            PUT("0");
    }
#undef PUT
}

static bool py_printable(int32_t cp)
{
    if (cp == ' ')
        return true;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static void repr_str(struct jbuf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jbuf_putc(b, q);
    for (size_t off = 0; off < n;) {
        int32_t cp;
        size_t k = jutf8_dec(s + off, n - off, &cp);
        char esc[16];
        if (cp == q || cp == '\\')
            esc[0] = '\\', esc[1] = (char)cp, esc[2] = 0;
        else if (cp == '\n' || cp == '\r' || cp == '\t')
            snprintf(esc, sizeof esc, "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
        else if (py_printable(cp))
            esc[0] = 0;
        else if (cp < 0x100)
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000)
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
        else
            snprintf(esc, sizeof esc, "\\U%08x", (unsigned)cp);
        if (esc[0])
            jbuf_puts(b, esc);
        else
            jbuf_put(b, s + off, k);
        off += k;
    }
    jbuf_putc(b, q);
}

static void put_seq(struct jctx *c, struct jbuf *b, const struct jlist *l)
{
    if (l->gen) /* jinja2 prints <generator object ... at 0x...>: never a prompt anyone wants */
        jfail(&c->f, "cannot print a generator (map, select, ...): convert it with |list");
    jdepth_enter(c);
    jbuf_putc(b, l->tuple ? '(' : '[');
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jbuf_puts(b, ", ");
        jv_repr_to(c, b, l->v[i]);
    }
    if (l->tuple && l->n == 1)
        jbuf_putc(b, ',');
    jbuf_putc(b, l->tuple ? ')' : ']');
    jdepth_leave(c);
}

static void put_dict(struct jctx *c, struct jbuf *b, const struct jdict *d)
{
    jdepth_enter(c);
    jbuf_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i)
            jbuf_puts(b, ", ");
        jv_repr_to(c, b, d->k[i]);
        jbuf_puts(b, ": ");
        jv_repr_to(c, b, d->v[i]);
    }
    jbuf_putc(b, '}');
    jdepth_leave(c);
}

void jv_str_to(struct jctx *c, struct jbuf *b, struct jv v)
{
    char t[40];
    switch (v.t) {
    case JT_UNDEF:
    case JT_NOARG:
        return;
    case JT_NONE:
        jbuf_puts(b, "None");
        return;
    case JT_BOOL:
        jbuf_puts(b, v.u.b ? "True" : "False");
        return;
    case JT_INT:
        snprintf(t, sizeof t, "%" PRId64, v.u.i);
        jbuf_puts(b, t);
        return;
    case JT_FLOAT:
        jfloat_repr(t, sizeof t, v.u.f);
        jbuf_puts(b, t);
        return;
    case JT_STR:
        jbuf_put(b, v.u.s.p, v.u.s.n);
        return;
    case JT_LIST:
        put_seq(c, b, v.u.l);
        return;
    case JT_DICT:
        put_dict(c, b, v.u.d);
        return;
    case JT_NS:
        jbuf_puts(b, "<Namespace ");
        put_dict(c, b, v.u.d);
        jbuf_putc(b, '>');
        return;
    case JT_LOOP:
        snprintf(t, sizeof t, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n);
        jbuf_puts(b, t);
        return;
    case JT_MACRO:
        jbuf_puts(b, "<Macro>");
        return;
    default:
        jbuf_puts(b, "<function>");
        return;
    }
}

void jv_repr_to(struct jctx *c, struct jbuf *b, struct jv v)
{
    if (v.t == JT_STR)
        repr_str(b, v.u.s.p, v.u.s.n);
    else if (v.t == JT_UNDEF)
        jbuf_puts(b, "Undefined");
    else
        jv_str_to(c, b, v);
}

struct jv jv_to_str(struct jctx *c, struct jv v)
{
    if (v.t == JT_STR)
        return v;
    struct jbuf b = {.a = &c->a};
    jbuf_put(&b, "", 0);
    jv_str_to(c, &b, v);
    return jv_str(b.p, b.n);
}

/* ---- json.dumps */

struct jsonopt {
    bool ascii, sort;
    const char *indent, *item_sep, *key_sep;
};

static void json_str(struct jbuf *b, const char *s, size_t n, bool ascii)
{
    jbuf_putc(b, '"');
    size_t run = 0; /* bytes copied as they are, flushed in one piece */
    for (size_t off = 0; off < n;) {
        int32_t cp;
        size_t k = jutf8_dec(s + off, n - off, &cp);
        char esc[16] = "";
        switch (cp) {
        case '"':
            strcpy(esc, "\\\"");
            break;
        case '\\':
            strcpy(esc, "\\\\");
            break;
        case '\n':
            strcpy(esc, "\\n");
            break;
        case '\r':
            strcpy(esc, "\\r");
            break;
        case '\t':
            strcpy(esc, "\\t");
            break;
        case '\b':
            strcpy(esc, "\\b");
            break;
        case '\f':
            strcpy(esc, "\\f");
            break;
        default:
            if (cp < 0x20 || (ascii && cp > 0x7e && cp < 0x10000))
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            else if (ascii && cp >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                         (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
        }
        if (esc[0]) {
            jbuf_put(b, s + off - run, run);
            run = 0;
            jbuf_puts(b, esc);
        } else {
            run += k;
        }
        off += k;
    }
    jbuf_put(b, s + n - run, run);
    jbuf_putc(b, '"');
}

static void json_newline(struct jbuf *b, const struct jsonopt *o, int level)
{
    jbuf_putc(b, '\n');
    for (int i = 0; i < level; i++)
        jbuf_puts(b, o->indent);
}

/* A dict key as json.dumps coerces it: str as is, numbers, bools and None as their JSON text. */
static struct jv json_key(struct jctx *c, struct jv k)
{
    char t[40];
    switch (k.t) {
    case JT_STR:
        return k;
    case JT_NONE:
        return jv_cstr(c, "null");
    case JT_BOOL:
        return jv_cstr(c, k.u.b ? "true" : "false");
    case JT_INT:
        snprintf(t, sizeof t, "%" PRId64, k.u.i);
        return jv_cstr(c, t);
    case JT_FLOAT:
        jfloat_repr(t, sizeof t, k.u.f);
        return jv_cstr(c, t);
    default:
        jfail(&c->f, "keys must be str, int, float, bool or None, not %s", jv_typename(k));
    }
}

static void json_val(struct jctx *c, struct jbuf *b, struct jv v, const struct jsonopt *o, int level)
{
    char t[40];
    if (level > JMAXDEPTH)
        jfail(&c->f, "value nested too deeply (more than %d levels)", JMAXDEPTH);
    switch (v.t) {
    case JT_NONE:
        jbuf_puts(b, "null");
        return;
    case JT_BOOL:
        jbuf_puts(b, v.u.b ? "true" : "false");
        return;
    case JT_INT:
        snprintf(t, sizeof t, "%" PRId64, v.u.i);
        jbuf_puts(b, t);
        return;
    case JT_FLOAT:
        if (isnan(v.u.f))
            jbuf_puts(b, "NaN");
        else if (isinf(v.u.f))
            jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jfloat_repr(t, sizeof t, v.u.f), jbuf_puts(b, t);
        return;
    case JT_STR:
        json_str(b, v.u.s.p, v.u.s.n, o->ascii);
        return;
    case JT_LIST: {
        const struct jlist *l = v.u.l;
        if (l->gen)
            jfail(&c->f, "Object of type generator is not JSON serializable");
        if (!l->n) {
            jbuf_puts(b, "[]");
            return;
        }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jbuf_puts(b, o->item_sep);
            if (o->indent)
                json_newline(b, o, level + 1);
            json_val(c, b, l->v[i], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        jbuf_putc(b, ']');
        return;
    }
    case JT_DICT: {
        const struct jdict *d = v.u.d;
        if (!d->n) {
            jbuf_puts(b, "{}");
            return;
        }
        size_t *order = jalloc(&c->a, d->n * sizeof *order);
        struct jv *keys = jalloc(&c->a, d->n * sizeof *keys);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i, keys[i] = json_key(c, d->k[i]);
        if (o->sort) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jv_cmp(c, d->k[order[j - 1]], d->k[order[j]]) > 0; j--) {
                    size_t x = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = x;
                }
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jbuf_puts(b, o->item_sep);
            if (o->indent)
                json_newline(b, o, level + 1);
            struct jv k = keys[order[i]];
            json_str(b, k.u.s.p, k.u.s.n, o->ascii);
            jbuf_puts(b, o->key_sep);
            json_val(c, b, d->v[order[i]], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        jbuf_putc(b, '}');
        return;
    }
    default:
        jfail(&c->f, "Object of type %s is not JSON serializable", jv_typename(v));
    }
}

void jv_json_to(struct jctx *c, struct jbuf *b, struct jv v, bool ensure_ascii, const char *indent,
                const char *item_sep, const char *key_sep, bool sort_keys)
{
    struct jsonopt o = {
        .ascii = ensure_ascii, .sort = sort_keys, .indent = indent, .item_sep = item_sep, .key_sep = key_sep};
    json_val(c, b, v, &o, 0);
}
