/* The private types of the Jinja interpreter (engine/jinja.h): failure, the arena that the parser
 * and each render allocate from, tokens, the syntax tree, values, scopes and the render context.
 *
 * Errors unwind with longjmp to the jinja_parse or jinja_render that armed the jfail: everything a
 * parse or a render allocates lives in its arena, so unwinding leaks nothing. */
#pragma once
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "engine/jinja.h"

/* ---- failure */

struct jfail {
    jmp_buf jb;
    char *err; /* the caller's message buffer */
    size_t errlen;
    const char *tname; /* the template's name, first word of every message */
    int line;          /* the template line being parsed or evaluated */
    int code;          /* JINJA_ERROR or JINJA_RAISED */
};

/* Writes "NAME line N: message" into f->err and jumps back to the armed jinja_parse/jinja_render. */
_Noreturn void jfail(struct jfail *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- arena: bump allocation in chunks, freed at once; a total above `limit` fails "memory limit" */

struct jchunk;
struct jarena {
    struct jchunk *head;
    size_t total, limit;
    struct jfail *fail;
};
void *jalloc(struct jarena *a, size_t n);                  /* zeroed, aligned for any type */
char *jstrndup(struct jarena *a, const char *s, size_t n); /* NUL-terminated copy */
void jarena_free(struct jarena *a);

/* A growing byte string in an arena; `max` (0: none) fails "output limit". */
struct jbuf {
    char *p;
    size_t n, cap, max;
    struct jarena *a;
};
void jbuf_put(struct jbuf *b, const char *s, size_t n);
void jbuf_puts(struct jbuf *b, const char *s);
void jbuf_putc(struct jbuf *b, char c);

/* ---- tokens (jinja_lex.c) */

enum jtk {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP
};

struct jtoken {
    enum jtk k;
    int line;
    const char *s; /* DATA, NAME, STRING (unescaped), OP: text in the parse arena, NUL-terminated */
    size_t n;
    int64_t i; /* INT */
    double f;  /* FLOAT */
};

/* Splits a template into tokens with HF's whitespace rules (trim_blocks, lstrip_blocks, `-`/`+`
 * markers, one trailing newline dropped, \r\n and \r read as \n). Ends with TK_EOF. */
struct jtoken *jlex(const char *src, size_t len, struct jarena *a, struct jfail *f, size_t *ntok);

/* ---- values (jinja_value.c) */

enum jtype {
    JT_UNDEF,
    JT_NONE,
    JT_BOOL,
    JT_INT,
    JT_FLOAT,
    JT_STR,
    JT_LIST,
    JT_DICT,
    JT_NS,     /* namespace(): a dict whose attributes `set` may change */
    JT_LOOP,   /* the `loop` of a for */
    JT_MACRO,  /* a macro or the caller of a call block */
    JT_FUNC,   /* a global function (enum jfunc) */
    JT_METHOD, /* a method bound to its object */
    JT_NOARG   /* internal: an argument not given */
};

struct jlist;
struct jdict;
struct jloop;
struct jmacro;
struct jmethod;

struct jv {
    enum jtype t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char
                *p; /* UTF-8, not NUL-terminated; for JT_UNDEF the error to give when used (NULL: generic) */
            size_t n;
        } s;
        struct jlist *l;
        struct jdict *d;
        struct jloop *loop;
        struct jmacro *m;
        struct jmethod *meth;
        int fn;
    } u;
};

struct jlist {
    size_t n;
    bool tuple; /* prints as (a, b) */
    /* a Python generator (what map, select, reject, selectattr, rejectattr, items and reverse give):
     * true even when empty, no len(), no index, nothing to print or dump; iterating works */
    bool gen;
    struct jv *v;
};
struct jdict { /* insertion order, linear lookup */
    size_t n, cap;
    struct jv *k, *v;
};
struct jloop {
    size_t i, n; /* index0, length */
    const struct jv *items;
};
struct jmacro {
    const struct jnode *def; /* NK_MACRO or NK_CALLBLOCK */
    struct jscope *closure;
    struct jv caller; /* the caller of a call block, JT_UNDEF otherwise */
};
struct jmethod {
    struct jv self;
    int id; /* index in the method table (jinja_methods.c) */
};

static inline struct jv jv_none(void)
{
    return (struct jv){.t = JT_NONE};
}
static inline struct jv jv_bool(bool b)
{
    return (struct jv){.t = JT_BOOL, .u.b = b};
}
static inline struct jv jv_int(int64_t i)
{
    return (struct jv){.t = JT_INT, .u.i = i};
}
static inline struct jv jv_float(double f)
{
    return (struct jv){.t = JT_FLOAT, .u.f = f};
}
static inline struct jv jv_str(const char *p, size_t n)
{
    return (struct jv){.t = JT_STR, .u.s = {p, n}};
}
static inline struct jv jv_undef(const char *why)
{
    return (struct jv){.t = JT_UNDEF, .u.s = {why, 0}};
}

struct jctx;

struct jv jv_from_json(struct jctx *c, const struct json_t *j); /* borrows j's strings */
struct jv jv_cstr(struct jctx *c, const char *s);               /* copies */
struct jlist *jlist_new(struct jctx *c, size_t n);
struct jdict *jdict_new(struct jctx *c, size_t cap);
void jdict_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v); /* replaces or appends */
const struct jv *jdict_get(const struct jdict *d, struct jv k);            /* NULL when absent */
const struct jv *jdict_gets(const struct jdict *d, const char *key);

bool jv_truthy(struct jv v);
/* Python ==, 1 == 1.0 == True; values nested deeper than JMAXDEPTH compare unequal. */
bool jv_eq(struct jv a, struct jv b);
/* Python's <, <=, ...: -1/0/1; fails on types Python cannot order. */
int jv_cmp(struct jctx *c, struct jv a, struct jv b);
const char *jv_typename(struct jv v); /* Python's type name for messages: "str", "dict", ... */
bool jv_is_num(struct jv v);          /* int, float or bool */
double jv_num(struct jv v);
/* Fails with the undefined's own message when v is undefined: using it is an error. */
void jv_use(struct jctx *c, struct jv v);
/* Fails as Python does where v would be a dict key or a set member: lists and dicts. */
void jv_hashable(struct jctx *c, struct jv v);

/* The items to iterate: a list's elements, a dict's keys, a string's characters; undefined is empty. */
struct jlist *jv_iter(struct jctx *c, struct jv v);

/* ---- text (jinja_format.c): Python's str(), repr() and json.dumps */

void jv_str_to(struct jctx *c, struct jbuf *b, struct jv v);  /* str(v); undefined is "" */
struct jv jv_to_str(struct jctx *c, struct jv v);             /* str(v) as a value */
void jv_repr_to(struct jctx *c, struct jbuf *b, struct jv v); /* repr(v) */
void jfloat_repr(char *out, size_t cap, double f);            /* repr(float) */
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent NULL: none. */
void jv_json_to(struct jctx *c, struct jbuf *b, struct jv v, bool ensure_ascii, const char *indent,
                const char *item_sep, const char *key_sep, bool sort_keys);

/* UTF-8 helpers: code point count, and the byte offset of code point i (i <= count). */
size_t jutf8_len(const char *s, size_t n);
size_t jutf8_off(const char *s, size_t n, size_t i);
/* Decodes one code point at s (n > 0) into *cp; returns its byte length (1 for invalid bytes). */
size_t jutf8_dec(const char *s, size_t n, int32_t *cp);
void jutf8_enc(struct jbuf *b, int32_t cp);

/* ---- syntax tree (jinja_parse.c) */

enum jnk {
    /* statements */
    NK_TEXT,
    NK_PRINT,
    NK_IF,
    NK_FOR,
    NK_SET,
    NK_SETBLOCK,
    NK_MACRO,
    NK_CALLBLOCK,
    NK_FILTERBLOCK,
    NK_BREAK,
    NK_CONTINUE,
    NK_BLOCK,
    /* expressions */
    NK_CONST,
    NK_NAME,
    NK_ATTR,
    NK_ITEM,
    NK_SLICE,
    NK_CALL,
    NK_FILTER,
    NK_TEST,
    NK_NOT,
    NK_NEG,
    NK_POS,
    NK_AND,
    NK_OR,
    NK_BIN,
    NK_CMP,
    NK_CONCAT,
    NK_COND,
    NK_LIST,
    NK_TUPLE,
    NK_DICT
};

enum jop {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN
};

struct jargs {
    size_t n, nkw;
    struct jnode **pos;
    const char **kwname;
    struct jnode **kw;
};

/* One node; the fields each kind uses:
 *   TEXT: text, textlen                PRINT: a
 *   IF: a (condition), body, else_body (an elif is an IF alone in else_body)
 *   FOR: names/nnames (targets), a (iterable), b (filter condition or NULL), body, else_body
 *   SET: names/nnames (targets), attr (ns.attr: names[0] is the namespace), a (value)
 *   SETBLOCK: names[0], body        BLOCK: body (a `generation` block)
 *   MACRO: name, names/nnames (parameters), defaults (each or NULL), body
 *   CALLBLOCK: names/defaults (the caller's parameters), a (the call), body
 *   FILTERBLOCK: a (a FILTER chain whose innermost operand is NULL), body
 *   CONST: cval      NAME: name      ATTR: a, name      ITEM: a, b      SLICE: a, items[3] (or NULL)
 *   CALL: a (callee), args           FILTER: a, filter, args         TEST: a, test, args, negate
 *   NOT/NEG/POS: a    AND/OR: a, b    BIN: op, a, b    CMP: a, ops/items/nitems (chained)
 *   CONCAT: items    COND: a (value), b (condition), c (else, or NULL)   LIST/TUPLE: items
 *   DICT: items (key, value, key, value...) */
struct jnode {
    enum jnk k;
    int line;
    struct jnode *next; /* next statement of a body */
    struct jnode *a, *b, *c;
    struct jnode *body, *else_body;
    const char *name, *attr;
    const char *text;
    size_t textlen;
    const char **names;
    struct jnode **defaults;
    size_t nnames;
    struct jnode **items;
    size_t nitems;
    enum jop op;
    enum jop *ops;
    bool negate;
    struct jargs args;
    const struct jcallable *filter, *test;
    struct jv cval;
};

struct jinja_template {
    struct jarena a;
    struct jnode *body;
    char name[256];
};

/* ---- callables: filters, tests, methods and globals, each a table of signatures */

#define JMAXPARAM 6
typedef struct jv (*jfn)(struct jctx *c, struct jv self, struct jv *p);
struct jcallable {
    const char *name;
    jfn fn;
    /* after the operand, NULL-terminated; a "*" takes the positionals beyond those before it (the
     * callable reads them from jctx.rest), and the names after it are keyword-only */
    const char *params[JMAXPARAM];
};
const struct jcallable *jfilter_find(const char *name);
const struct jcallable *jtest_find(const char *name);
const struct jcallable *jmethod_find(const char *name); /* by name only: any receiver type */
/* The method `name` of v, or NULL when v's type has none by that name. */
const struct jcallable *jmethod_of(struct jv v, const char *name, int *id);
const struct jcallable *jmethod_at(int id);
const struct jcallable *jglobal_find(const char *name, int *id);
const struct jcallable *jglobal_at(int id);

/* Binds positional and keyword values to the signature's parameters: p[i] for params[i], JT_NOARG
 * where not given; the positionals a "*" takes land in rest and nrest. Fails on a mismatch. */
void jbind(struct jctx *c, const struct jcallable *f, const char *what, struct jv *pos, size_t npos,
           const char **kwname, struct jv *kw, size_t nkw, struct jv *p, struct jv **rest, size_t *nrest);

/* Python string operations on a JT_STR (jinja_methods.c), shared by methods and filters */
enum jcase { CASE_LOWER, CASE_UPPER, CASE_TITLE, CASE_CAPITALIZE, CASE_JINJA_TITLE };
struct jv jstr_case(struct jctx *c, struct jv s, enum jcase mode);
/* strip(chars): chars JT_NOARG or None strips whitespace. */
struct jv jstr_strip(struct jctx *c, struct jv s, struct jv chars, bool left, bool right);
struct jv jstr_replace(struct jctx *c, struct jv s, struct jv old, struct jv new, struct jv count);

/* ---- rendering (jinja_eval.c) */

struct jscope {
    struct jscope *parent;
    bool captured; /* a macro or caller closes over it: a loop may not reuse it for its next item */
    size_t n, cap;
    const char **names;
    struct jv *vals;
};

struct jctx {
    struct jfail f;
    struct jarena a;
    const struct jinja_template *t;
    uint64_t steps, max_steps;
    size_t max_output;
    time_t now;
    struct jbuf *out;
    int brk;    /* 1: break, 2: continue pending */
    int depth;  /* nested evaluations and macro calls now, bounded by JMAXDEPTH */
    int vdepth; /* nesting of the value being printed, compared or dumped, bounded by JMAXDEPTH */
    struct jdict *vars;
    struct jv *rest; /* the "*" arguments of the callable being called */
    size_t nrest;
};

/* How deep evaluation and values may nest: the C stack stays small whatever the template does. */
#define JMAXDEPTH 1000
void jdepth_enter(struct jctx *c); /* ++vdepth, failing "value nested too deeply" */
static inline void jdepth_leave(struct jctx *c)
{
    c->vdepth--;
}

struct jv jcall_value(struct jctx *c, struct jv fn, struct jv *pos, size_t npos, const char **kwname,
                      struct jv *kw, size_t nkw);
/* obj.name and obj[key] as jinja2 resolves them (an attribute, else an item; undefined when neither). */
struct jv jgetattr(struct jctx *c, struct jv obj, const char *name);
struct jv jgetitem(struct jctx *c, struct jv obj, struct jv key);
/* Applies a test or filter found by name at render time (map('upper'), select('even')). */
struct jv japply_named(struct jctx *c, bool test, struct jv name, struct jv v, struct jv *args, size_t nargs);
