/* The compiled tree of a JSON Schema, shared by the compiler (json_schema.c) and the validator
 * (json_schema_validate.c); nothing outside engine/json_schema*.c sees it. */
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum {
    JS_T_OBJECT = 1 << 0,
    JS_T_ARRAY = 1 << 1,
    JS_T_STRING = 1 << 2,
    JS_T_NUMBER = 1 << 3,
    JS_T_INTEGER = 1 << 4, /* a number with no fractional part */
    JS_T_BOOLEAN = 1 << 5,
    JS_T_NULL = 1 << 6,
    JS_T_ANY = (1 << 7) - 1,
};

enum js_format { JS_FMT_NONE, JS_FMT_DATE, JS_FMT_DATE_TIME, JS_FMT_EMAIL, JS_FMT_UUID };

struct js_prop {
    char *name;
    struct js_node *node;
};

/* One schema. Every keyword present applies at once (all must hold); a keyword about one type
 * constrains only values of that type, as in JSON Schema. */
struct js_node {
    unsigned types;       /* JS_T_* a value may have; JS_T_ANY without "type" */
    json_t *enumv;        /* array of allowed values, or NULL */
    json_t *constv;       /* the one allowed value, or NULL */
    struct js_node *ref;  /* $ref's target, or NULL (then nothing else is set) */
    struct js_node **any; /* anyOf branches */
    size_t n_any;
    struct js_prop *props; /* object: properties in schema order */
    size_t n_props;
    char **required; /* object: names that must be present */
    size_t n_required;
    bool closed;                 /* object: additionalProperties false */
    struct js_node *items;       /* array: schema of every item, or NULL */
    size_t min_items, max_items; /* array: max_items SIZE_MAX when unset */
    char *pattern;               /* string: the ECMA-style pattern as written, or NULL */
    pcre2_code *re;              /* pattern compiled (unanchored search) */
    enum js_format format;
    json_t *min, *xmin, *max, *xmax; /* number/integer bounds (integer or real), or NULL */
    char *at;                        /* the schema's JSON pointer in the document, for messages */
    int mark;                        /* compile-time only: cycle check colour */
};

/* Owns every node; nodes point at each other freely ($ref cycles included). */
struct js_schema {
    struct js_node *root;
    struct js_node **nodes; /* every node, for js_free */
    size_t n_nodes, cap_nodes;
};

/* A JSON pointer being built, one token per level; truncated (never overflowed) when very long. */
struct ptr {
    char buf[1024];
    size_t len;
};

static inline size_t ptr_push(struct ptr *p, const char *tok)
{
    size_t old = p->len;
    if (p->len + 1 < sizeof p->buf)
        p->buf[p->len++] = '/';
    for (const char *c = tok; *c && p->len + 2 < sizeof p->buf; c++) {
        if (*c == '~' || *c == '/') {
            p->buf[p->len++] = '~';
            p->buf[p->len++] = *c == '~' ? '0' : '1';
        } else {
            p->buf[p->len++] = *c;
        }
    }
    p->buf[p->len] = '\0';
    return old;
}

static inline size_t ptr_push_index(struct ptr *p, size_t i)
{
    char tok[32];
    snprintf(tok, sizeof tok, "%zu", i);
    return ptr_push(p, tok);
}

static inline void ptr_pop(struct ptr *p, size_t old)
{
    p->len = old;
    p->buf[old] = '\0';
}

/* The pointer as text; the root is written "/". */
static inline const char *ptr_str(const struct ptr *p)
{
    return p->len ? p->buf : "/";
}

/* Formats a message into err (when err and errlen allow). */
__attribute__((format(printf, 3, 4))) static inline void fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
