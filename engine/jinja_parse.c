/* The Jinja parser: tokens to the syntax tree of jinja_int.h, with jinja2's grammar and operator
 * precedence. Filters, tests, methods, functions and statements outside the supported subset are
 * refused here, naming the construct and its line. jinja_parse and jinja_free live here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja_int.h"

#define MAXNAMES 256
#define MAXDEPTH 200 /* the parser and the evaluator recurse this deep at most, whatever the input */

struct parser {
    struct jtoken *tok;
    size_t pos;
    struct jarena *a;
    struct jfail *f;
    int loops; /* for loops around the statement being parsed (break/continue need one) */
    int depth; /* nesting of expressions and blocks being parsed, bounded by MAXDEPTH */
    /* names called as functions, and names bound anywhere; checked when the parse ends */
    const char *called[MAXNAMES];
    int called_line[MAXNAMES];
    size_t ncalled;
    const char *bound[MAXNAMES];
    size_t nbound;
};

static struct jtoken *cur(struct parser *P)
{
    return &P->tok[P->pos];
}
static struct jtoken *peek(struct parser *P, size_t k)
{
    return &P->tok[P->pos + k];
}

static struct jtoken *next(struct parser *P)
{
    struct jtoken *t = cur(P);
    P->f->line = t->line;
    if (t->k != TK_EOF)
        P->pos++;
    return t;
}

static bool is_op(const struct jtoken *t, const char *op)
{
    return t->k == TK_OP && strcmp(t->s, op) == 0;
}
static bool is_name(const struct jtoken *t, const char *n)
{
    return t->k == TK_NAME && strcmp(t->s, n) == 0;
}

static const char *describe(const struct jtoken *t)
{
    switch (t->k) {
    case TK_EOF:
        return "end of template";
    case TK_DATA:
        return "template data";
    case TK_VAR_BEGIN:
        return "'{{'";
    case TK_VAR_END:
        return "'}}'";
    case TK_BLOCK_BEGIN:
        return "'{%'";
    case TK_BLOCK_END:
        return "'%}'";
    default:
        return t->s;
    }
}

static _Noreturn void unexpected(struct parser *P, const struct jtoken *t, const char *want)
{
    P->f->line = t->line;
    if (want)
        jfail(P->f, "unexpected %s, expected %s", describe(t), want);
    jfail(P->f, "unexpected %s", describe(t));
}

static void expect_op(struct parser *P, const char *op)
{
    if (!is_op(cur(P), op)) {
        char w[8];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, cur(P), w);
    }
    next(P);
}

static void expect_end(struct parser *P)
{
    if (cur(P)->k != TK_BLOCK_END)
        unexpected(P, cur(P), "'%}'");
    next(P);
}

static const char *expect_name(struct parser *P)
{
    if (cur(P)->k != TK_NAME)
        unexpected(P, cur(P), "a name");
    return next(P)->s;
}

static void enter(struct parser *P)
{
    if (++P->depth > MAXDEPTH)
        jfail(P->f, "template nested too deeply (more than %d levels)", MAXDEPTH);
}

static struct jnode *node(struct parser *P, enum jnk k, int line)
{
    struct jnode *n = jalloc(P->a, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static void bind_name(struct parser *P, const char *name)
{
    if (P->nbound < MAXNAMES)
        P->bound[P->nbound++] = name;
}

/* A growing array of node pointers in the parse arena. */
struct nvec {
    struct jnode **v;
    size_t n, cap;
};
static void push(struct parser *P, struct nvec *v, struct jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = jalloc(P->a, cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static struct jnode *parse_expr(struct parser *P, bool condexpr);
static struct jnode *parse_tuple(struct parser *P, bool condexpr);
static struct jnode *parse_unary(struct parser *P, bool with_filter);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_postfix(struct parser *P, struct jnode *n);

/* ---- expressions */

/* Call arguments after '(' through ')': positionals, then name=value pairs. */
static struct jargs parse_args(struct parser *P)
{
    struct nvec pos = {0}, kw = {0};
    const char *kwname[64];
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (pos.n + kw.n)
            expect_op(P, ",");
        if (is_op(cur(P), ")"))
            break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            jfail(P->f, "unsupported syntax '%s' in a call", cur(P)->s);
        if (cur(P)->k == TK_NAME && is_op(peek(P, 1), "=")) {
            if (kw.n == 64)
                jfail(P->f, "too many keyword arguments");
            kwname[kw.n] = next(P)->s;
            next(P);
            push(P, &kw, parse_expr(P, true));
        } else {
            if (kw.n)
                jfail(P->f, "positional argument after a keyword argument");
            push(P, &pos, parse_expr(P, true));
        }
    }
    next(P);
    struct jargs a = {.n = pos.n, .nkw = kw.n, .pos = pos.v, .kw = kw.v};
    a.kwname = jalloc(P->a, (kw.n + 1) * sizeof *a.kwname);
    memcpy(a.kwname, kwname, kw.n * sizeof *kwname);
    return a;
}

/* Refuses keyword arguments that the filter or test does not take. */
static void check_kwargs(struct parser *P, const struct jcallable *f, const struct jargs *a, const char *what)
{
    for (size_t i = 0; i < a->nkw; i++) {
        bool ok = false;
        for (int k = 0; k < JMAXPARAM && f->params[k]; k++)
            ok |= strcmp(f->params[k], a->kwname[i]) == 0;
        if (!ok)
            jfail(P->f, "unsupported argument '%s' of %s '%s'", a->kwname[i], what, f->name);
    }
}

static struct jnode *parse_filter(struct parser *P, struct jnode *operand)
{
    struct jtoken *t = next(P); /* the name */
    if (t->k != TK_NAME)
        unexpected(P, t, "a filter name");
    struct jnode *n = node(P, NK_FILTER, t->line);
    n->a = operand;
    n->name = t->s;
    n->filter = jfilter_find(t->s);
    if (!n->filter)
        jfail(P->f, "unsupported filter '%s'", t->s);
    if (is_op(cur(P), "("))
        n->args = parse_args(P);
    check_kwargs(P, n->filter, &n->args, "filter");
    /* map('name') and select('name') name a filter or test: check it exists */
    bool by_filter = strcmp(t->s, "map") == 0,
         by_test = strcmp(t->s, "select") == 0 || strcmp(t->s, "reject") == 0;
    bool by_attr_test = strcmp(t->s, "selectattr") == 0 || strcmp(t->s, "rejectattr") == 0;
    size_t at = by_attr_test ? 1 : 0;
    if ((by_filter || by_test || by_attr_test) && n->args.n > at && n->args.pos[at]->k == NK_CONST &&
        n->args.pos[at]->cval.t == JT_STR) {
        const char *name = n->args.pos[at]->cval.u.s.p;
        if (by_filter && !jfilter_find(name))
            jfail(P->f, "unsupported filter '%s'", name);
        if (!by_filter && !jtest_find(name))
            jfail(P->f, "unsupported test '%s'", name);
    }
    return n;
}

static struct jnode *parse_test(struct parser *P, struct jnode *operand)
{
    struct jtoken *is = next(P);
    struct jnode *n = node(P, NK_TEST, is->line);
    n->a = operand;
    if (is_name(cur(P), "not")) {
        next(P);
        n->negate = true;
    }
    struct jtoken *t = next(P);
    if (t->k != TK_NAME)
        unexpected(P, t, "a test name");
    n->name = t->s;
    n->test = jtest_find(t->s);
    if (!n->test)
        jfail(P->f, "unsupported test '%s'", t->s);
    struct jtoken *c = cur(P);
    if (is_op(c, "(")) {
        n->args = parse_args(P);
    } else if ((c->k == TK_NAME || c->k == TK_STRING || c->k == TK_INT || c->k == TK_FLOAT || is_op(c, "[") ||
                is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            jfail(P->f, "you cannot chain multiple tests with is");
        struct jnode *arg = parse_postfix(P, parse_primary(P));
        n->args.n = 1;
        n->args.pos = jalloc(P->a, sizeof *n->args.pos);
        n->args.pos[0] = arg;
    }
    check_kwargs(P, n->test, &n->args, "test");
    return n;
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *n)
{
    for (;;) {
        if (is_op(cur(P), "|")) {
            next(P);
            n = parse_filter(P, n);
        } else if (is_name(cur(P), "is")) {
            n = parse_test(P, n);
        } else if (is_op(cur(P), "(")) {
            struct jnode *call = node(P, NK_CALL, cur(P)->line);
            call->a = n;
            call->args = parse_args(P);
            n = call;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_subscript(struct parser *P, struct jnode *obj, int line)
{
    struct jnode *part[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(cur(P), "]"))
            break;
        if (is_op(cur(P), ":")) {
            if (k == 2)
                unexpected(P, cur(P), "']'");
            next(P);
            slice = true;
            k++;
            continue;
        }
        if (part[k])
            unexpected(P, cur(P), "':' or ']'");
        part[k] = slice ? parse_expr(P, true) : parse_tuple(P, true);
    }
    next(P);
    struct jnode *n = node(P, slice ? NK_SLICE : NK_ITEM, line);
    n->a = obj;
    if (slice) {
        n->items = jalloc(P->a, 3 * sizeof *n->items);
        memcpy(n->items, part, sizeof part);
        n->nitems = 3;
    } else {
        if (!part[0])
            unexpected(P, cur(P), "an index");
        n->b = part[0];
    }
    return n;
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *n)
{
    for (;;) {
        struct jtoken *t = cur(P);
        if (is_op(t, ".")) {
            next(P);
            struct jtoken *a = next(P);
            if (a->k == TK_NAME) {
                struct jnode *x = node(P, NK_ATTR, a->line);
                x->a = n;
                x->name = a->s;
                n = x;
            } else if (a->k == TK_INT) {
                struct jnode *x = node(P, NK_ITEM, a->line), *k = node(P, NK_CONST, a->line);
                k->cval = jv_int(a->i);
                x->a = n;
                x->b = k;
                n = x;
            } else {
                unexpected(P, a, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            next(P);
            n = parse_subscript(P, n, t->line);
        } else if (is_op(t, "(")) {
            struct jnode *call = node(P, NK_CALL, t->line);
            call->a = n;
            call->args = parse_args(P);
            if (n->k == NK_ATTR && !jmethod_find(n->name))
                jfail(P->f, "unsupported method '%s'", n->name);
            if (n->k == NK_NAME && P->ncalled < MAXNAMES) {
                P->called[P->ncalled] = n->name;
                P->called_line[P->ncalled++] = t->line;
            }
            n = call;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_seq(struct parser *P, enum jnk k, const char *close, int line)
{
    struct nvec v = {0};
    while (!is_op(cur(P), close)) {
        if (v.n)
            expect_op(P, ",");
        if (is_op(cur(P), close))
            break;
        if (k == NK_DICT) {
            push(P, &v, parse_expr(P, true));
            expect_op(P, ":");
        }
        push(P, &v, parse_expr(P, true));
    }
    next(P);
    struct jnode *n = node(P, k, line);
    n->items = v.v;
    n->nitems = v.n;
    return n;
}

static struct jnode *parse_primary(struct parser *P)
{
    struct jtoken *t = next(P);
    struct jnode *n;
    switch (t->k) {
    case TK_NAME:
        n = node(P, NK_CONST, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->cval = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->cval = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->cval = jv_none();
        else
            n->k = NK_NAME, n->name = t->s;
        return n;
    case TK_STRING: {
        n = node(P, NK_CONST, t->line);
        struct jbuf b = {.a = P->a};
        jbuf_put(&b, t->s, t->n);
        while (cur(P)->k == TK_STRING) { /* adjacent literals join */
            struct jtoken *s = next(P);
            jbuf_put(&b, s->s, s->n);
        }
        n->cval = jv_str(b.p, b.n);
        return n;
    }
    case TK_INT:
        n = node(P, NK_CONST, t->line);
        n->cval = jv_int(t->i);
        return n;
    case TK_FLOAT:
        n = node(P, NK_CONST, t->line);
        n->cval = jv_float(t->f);
        return n;
    case TK_OP:
        if (is_op(t, "(")) {
            if (is_op(cur(P), ")")) {
                next(P);
                n = node(P, NK_TUPLE, t->line);
                return n;
            }
            n = parse_tuple(P, true);
            expect_op(P, ")");
            return n;
        }
        if (is_op(t, "["))
            return parse_seq(P, NK_LIST, "]", t->line);
        if (is_op(t, "{"))
            return parse_seq(P, NK_DICT, "}", t->line);
        break;
    default:
        break;
    }
    unexpected(P, t, NULL);
}

/* A sign binds tighter than filters: `-3|abs` is `(-3)|abs`. */
static struct jnode *parse_unary(struct parser *P, bool with_filter)
{
    struct jtoken *t = cur(P);
    struct jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(P);
        n = node(P, is_op(t, "-") ? NK_NEG : NK_POS, t->line);
        enter(P);
        n->a = parse_unary(P, false);
        P->depth--;
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    return with_filter ? parse_filter_expr(P, n) : n;
}

static struct jnode *binop(struct parser *P, enum jop op, struct jnode *a, struct jnode *b, int line)
{
    struct jnode *n = node(P, NK_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *P)
{
    struct jnode *n = parse_unary(P, true);
    while (is_op(cur(P), "**")) {
        int line = next(P)->line;
        n = binop(P, OP_POW, n, parse_unary(P, true), line);
    }
    return n;
}

static struct jnode *parse_math2(struct parser *P)
{
    struct jnode *n = parse_pow(P);
    for (;;) {
        struct jtoken *t = cur(P);
        enum jop op;
        if (is_op(t, "*"))
            op = OP_MUL;
        else if (is_op(t, "/"))
            op = OP_DIV;
        else if (is_op(t, "//"))
            op = OP_FLOORDIV;
        else if (is_op(t, "%"))
            op = OP_MOD;
        else
            return n;
        next(P);
        if (op == OP_MOD && n->k == NK_CONST && n->cval.t == JT_STR)
            jfail(P->f, "unsupported string formatting with '%%'");
        n = binop(P, op, n, parse_pow(P), t->line);
    }
}

static struct jnode *parse_concat(struct parser *P)
{
    struct jnode *first = parse_math2(P);
    if (!is_op(cur(P), "~"))
        return first;
    struct nvec v = {0};
    push(P, &v, first);
    int line = cur(P)->line;
    while (is_op(cur(P), "~")) {
        next(P);
        push(P, &v, parse_math2(P));
    }
    struct jnode *n = node(P, NK_CONCAT, line);
    n->items = v.v;
    n->nitems = v.n;
    return n;
}

static struct jnode *parse_math1(struct parser *P)
{
    struct jnode *n = parse_concat(P);
    while (is_op(cur(P), "+") || is_op(cur(P), "-")) {
        struct jtoken *t = next(P);
        n = binop(P, is_op(t, "+") ? OP_ADD : OP_SUB, n, parse_concat(P), t->line);
    }
    return n;
}

static struct jnode *parse_compare(struct parser *P)
{
    struct jnode *first = parse_math1(P);
    struct nvec v = {0};
    enum jop ops[32];
    size_t nops = 0;
    int line = cur(P)->line;
    for (;;) {
        struct jtoken *t = cur(P);
        enum jop op;
        if (is_op(t, "=="))
            op = OP_EQ;
        else if (is_op(t, "!="))
            op = OP_NE;
        else if (is_op(t, "<"))
            op = OP_LT;
        else if (is_op(t, "<="))
            op = OP_LE;
        else if (is_op(t, ">"))
            op = OP_GT;
        else if (is_op(t, ">="))
            op = OP_GE;
        else if (is_name(t, "in"))
            op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in"))
            op = OP_NOTIN, next(P);
        else
            break;
        next(P);
        if (nops == 32)
            jfail(P->f, "comparison chain too long");
        ops[nops++] = op;
        push(P, &v, parse_math1(P));
    }
    if (!nops)
        return first;
    struct jnode *n = node(P, NK_CMP, line);
    n->a = first;
    n->items = v.v;
    n->nitems = v.n;
    n->ops = jalloc(P->a, nops * sizeof *n->ops);
    memcpy(n->ops, ops, nops * sizeof *ops);
    return n;
}

static struct jnode *parse_not(struct parser *P)
{
    if (is_name(cur(P), "not")) {
        struct jnode *n = node(P, NK_NOT, next(P)->line);
        enter(P);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P)
{
    struct jnode *n = parse_not(P);
    while (is_name(cur(P), "and")) {
        struct jnode *x = node(P, NK_AND, next(P)->line);
        x->a = n;
        x->b = parse_not(P);
        n = x;
    }
    return n;
}

static struct jnode *parse_or(struct parser *P)
{
    struct jnode *n = parse_and(P);
    while (is_name(cur(P), "or")) {
        struct jnode *x = node(P, NK_OR, next(P)->line);
        x->a = n;
        x->b = parse_and(P);
        n = x;
    }
    return n;
}

static struct jnode *parse_expr(struct parser *P, bool condexpr)
{
    enter(P);
    struct jnode *n = parse_or(P);
    while (condexpr && is_name(cur(P), "if")) {
        struct jnode *x = node(P, NK_COND, next(P)->line);
        x->a = n;
        x->b = parse_or(P);
        if (is_name(cur(P), "else")) {
            next(P);
            x->c = parse_expr(P, true);
        }
        n = x;
    }
    P->depth--;
    return n;
}

/* An expression, or a tuple of them when commas follow (`{{ a, b }}`, `set x = 1, 2`). */
static struct jnode *parse_tuple(struct parser *P, bool condexpr)
{
    int line = cur(P)->line;
    struct jnode *first = parse_expr(P, condexpr);
    if (!is_op(cur(P), ","))
        return first;
    struct nvec v = {0};
    push(P, &v, first);
    while (is_op(cur(P), ",")) {
        next(P);
        if (cur(P)->k == TK_BLOCK_END || cur(P)->k == TK_VAR_END || is_op(cur(P), ")") || is_op(cur(P), "]"))
            break;
        push(P, &v, parse_expr(P, condexpr));
    }
    struct jnode *n = node(P, NK_TUPLE, line);
    n->items = v.v;
    n->nitems = v.n;
    return n;
}

/* ---- statements */

static struct jnode *parse_body(struct parser *P, const char *const *ends, const char **found);

/* Target names of for/set: `a` or `a, b` (or `(a, b)`). */
static void parse_targets(struct parser *P, struct jnode *n)
{
    const char *names[16];
    size_t k = 0;
    bool paren = is_op(cur(P), "(");
    if (paren)
        next(P);
    do {
        if (k && is_op(cur(P), ","))
            next(P);
        if (k == 16)
            jfail(P->f, "too many targets");
        names[k++] = expect_name(P);
        bind_name(P, names[k - 1]);
    } while (is_op(cur(P), ","));
    if (paren)
        expect_op(P, ")");
    n->names = jalloc(P->a, k * sizeof *names);
    memcpy(n->names, names, k * sizeof *names);
    n->nnames = k;
}

/* Macro or caller parameters: `(a, b=default, ...)`. */
static void parse_params(struct parser *P, struct jnode *n)
{
    const char *names[32];
    struct jnode *defaults[32];
    size_t k = 0;
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (k)
            expect_op(P, ",");
        if (k == 32)
            jfail(P->f, "too many parameters");
        names[k] = expect_name(P);
        bind_name(P, names[k]);
        defaults[k] = NULL;
        if (is_op(cur(P), "=")) {
            next(P);
            defaults[k] = parse_expr(P, true);
        } else {
            for (size_t i = 0; i < k; i++)
                if (defaults[i])
                    jfail(P->f, "non-default argument follows default argument");
        }
        k++;
    }
    next(P);
    n->names = jalloc(P->a, (k + 1) * sizeof *names);
    n->defaults = jalloc(P->a, (k + 1) * sizeof *defaults);
    memcpy(n->names, names, k * sizeof *names);
    memcpy(n->defaults, defaults, k * sizeof *defaults);
    n->nnames = k;
}

static struct jnode *parse_if(struct parser *P, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jnode *n = node(P, NK_IF, line);
    n->a = parse_tuple(P, true);
    expect_end(P);
    const char *found;
    n->body = parse_body(P, ends, &found);
    if (strcmp(found, "elif") == 0) {
        n->else_body = parse_if(P, P->f->line);
    } else if (strcmp(found, "else") == 0) {
        static const char *const endif[] = {"endif", NULL};
        expect_end(P);
        n->else_body = parse_body(P, endif, &found);
        expect_end(P);
    } else {
        expect_end(P);
    }
    return n;
}

static struct jnode *parse_for(struct parser *P, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL}, *const endfor[] = {"endfor", NULL};
    struct jnode *n = node(P, NK_FOR, line);
    parse_targets(P, n);
    if (!is_name(cur(P), "in"))
        unexpected(P, cur(P), "'in'");
    next(P);
    n->a = parse_tuple(P, false);
    if (is_name(cur(P), "if")) {
        next(P);
        n->b = parse_expr(P, true);
    }
    if (is_name(cur(P), "recursive"))
        jfail(P->f, "unsupported recursive for loop");
    expect_end(P);
    const char *found;
    P->loops++;
    n->body = parse_body(P, ends, &found);
    P->loops--;
    expect_end(P);
    if (strcmp(found, "else") == 0) {
        n->else_body = parse_body(P, endfor, &found);
        expect_end(P);
    }
    return n;
}

static struct jnode *parse_set(struct parser *P, int line)
{
    struct jnode *n = node(P, NK_SET, line);
    if (cur(P)->k == TK_NAME && is_op(peek(P, 1), ".")) {
        n->names = jalloc(P->a, sizeof *n->names);
        n->names[0] = next(P)->s;
        n->nnames = 1;
        next(P);
        n->attr = expect_name(P);
    } else {
        parse_targets(P, n);
    }
    if (is_op(cur(P), "=")) {
        next(P);
        n->a = parse_tuple(P, true);
        expect_end(P);
        return n;
    }
    if (n->attr || n->nnames != 1)
        unexpected(P, cur(P), "'='");
    if (is_op(cur(P), "|"))
        jfail(P->f, "unsupported filtered block set");
    static const char *const ends[] = {"endset", NULL};
    const char *found;
    expect_end(P);
    n->k = NK_SETBLOCK;
    n->body = parse_body(P, ends, &found);
    expect_end(P);
    return n;
}

static struct jnode *parse_macro(struct parser *P, int line)
{
    static const char *const ends[] = {"endmacro", NULL};
    struct jnode *n = node(P, NK_MACRO, line);
    n->name = expect_name(P);
    bind_name(P, n->name);
    parse_params(P, n);
    expect_end(P);
    const char *found;
    int loops = P->loops;
    P->loops = 0;
    n->body = parse_body(P, ends, &found);
    P->loops = loops;
    if (cur(P)->k == TK_NAME)
        next(P); /* {% endmacro name %} */
    expect_end(P);
    return n;
}

static struct jnode *parse_call_block(struct parser *P, int line)
{
    static const char *const ends[] = {"endcall", NULL};
    struct jnode *n = node(P, NK_CALLBLOCK, line);
    if (is_op(cur(P), "("))
        parse_params(P, n);
    n->a = parse_expr(P, true);
    if (n->a->k != NK_CALL)
        jfail(P->f, "expected a call after 'call'");
    expect_end(P);
    const char *found;
    int loops = P->loops;
    P->loops = 0;
    n->body = parse_body(P, ends, &found);
    P->loops = loops;
    expect_end(P);
    return n;
}

static struct jnode *parse_filter_block(struct parser *P, int line)
{
    static const char *const ends[] = {"endfilter", NULL};
    struct jnode *n = node(P, NK_FILTERBLOCK, line);
    n->a = parse_filter(P, NULL);
    while (is_op(cur(P), "|")) {
        next(P);
        n->a = parse_filter(P, n->a);
    }
    expect_end(P);
    const char *found;
    n->body = parse_body(P, ends, &found);
    expect_end(P);
    return n;
}

static struct jnode *parse_statement_in(struct parser *P);

static struct jnode *parse_statement(struct parser *P)
{
    enter(P);
    struct jnode *n = parse_statement_in(P);
    P->depth--;
    return n;
}

static struct jnode *parse_statement_in(struct parser *P)
{
    struct jtoken *t = next(P);
    if (t->k != TK_NAME)
        unexpected(P, t, "a statement name");
    const char *s = t->s;
    if (strcmp(s, "if") == 0)
        return parse_if(P, t->line);
    if (strcmp(s, "for") == 0)
        return parse_for(P, t->line);
    if (strcmp(s, "set") == 0)
        return parse_set(P, t->line);
    if (strcmp(s, "macro") == 0)
        return parse_macro(P, t->line);
    if (strcmp(s, "call") == 0)
        return parse_call_block(P, t->line);
    if (strcmp(s, "filter") == 0)
        return parse_filter_block(P, t->line);
    if (strcmp(s, "break") == 0 || strcmp(s, "continue") == 0) {
        if (!P->loops)
            jfail(P->f, "'%s' outside of a loop", s);
        struct jnode *n = node(P, s[0] == 'b' ? NK_BREAK : NK_CONTINUE, t->line);
        expect_end(P);
        return n;
    }
    if (strcmp(s, "generation") == 0) { /* transformers' AssistantTracker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        struct jnode *n = node(P, NK_BLOCK, t->line);
        const char *found;
        expect_end(P);
        n->body = parse_body(P, ends, &found);
        expect_end(P);
        return n;
    }
    jfail(P->f, "unsupported statement '%s'", s);
}

/* Statements up to a `{% name` in `ends` (consumed through the name, which *found gets) or the end
 * of the template when ends is NULL. */
static struct jnode *parse_body(struct parser *P, const char *const *ends, const char **found)
{
    struct jnode *head = NULL, **tail = &head;
    for (;;) {
        struct jtoken *t = cur(P);
        struct jnode *n;
        if (t->k == TK_EOF) {
            if (ends) {
                P->f->line = t->line;
                size_t last = 0;
                while (ends[last + 1])
                    last++;
                jfail(P->f, "unexpected end of template, expected '%s'", ends[last]);
            }
            return head;
        }
        if (t->k == TK_DATA) {
            next(P);
            n = node(P, NK_TEXT, t->line);
            n->text = t->s;
            n->textlen = t->n;
        } else if (t->k == TK_VAR_BEGIN) {
            next(P);
            n = node(P, NK_PRINT, t->line);
            n->a = parse_tuple(P, true);
            if (cur(P)->k != TK_VAR_END)
                unexpected(P, cur(P), "'}}'");
            next(P);
        } else if (t->k == TK_BLOCK_BEGIN) {
            struct jtoken *name = peek(P, 1);
            for (size_t i = 0; ends && ends[i] && name->k == TK_NAME; i++)
                if (strcmp(ends[i], name->s) == 0) {
                    next(P);
                    next(P);
                    *found = ends[i];
                    return head;
                }
            next(P);
            if (name->k == TK_NAME && strncmp(name->s, "end", 3) == 0)
                jfail(P->f, "unexpected '%s'", name->s);
            if (name->k == TK_NAME && (strcmp(name->s, "elif") == 0 || strcmp(name->s, "else") == 0))
                jfail(P->f, "unexpected '%s'", name->s);
            n = parse_statement(P);
        } else {
            unexpected(P, t, NULL);
        }
        *tail = n;
        tail = &n->next;
    }
}

/* Every name called as a function must be a global, a macro, `caller`, or a name the template binds. */
static void check_calls(struct parser *P)
{
    for (size_t i = 0; i < P->ncalled; i++) {
        const char *name = P->called[i];
        int id;
        bool ok = jglobal_find(name, &id) || strcmp(name, "caller") == 0;
        for (size_t k = 0; k < P->nbound && !ok; k++)
            ok = strcmp(P->bound[k], name) == 0;
        if (!ok) {
            P->f->line = P->called_line[i];
            jfail(P->f, "unsupported function '%s'", name);
        }
    }
}

struct jinja_template *jinja_parse(const char *src, size_t len, const char *name, char *err, size_t errlen)
{
    struct jinja_template *volatile t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "%s: out of memory", name);
        return NULL;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    struct jfail f = {.err = err, .errlen = errlen, .tname = t->name, .line = 1};
    struct parser P = {.a = &t->a, .f = &f};
    t->a.fail = &f;
    if (setjmp(f.jb)) {
        jinja_free(t);
        return NULL;
    }
    size_t ntok;
    P.tok = jlex(src, len, &t->a, &f, &ntok);
    t->body = parse_body(&P, NULL, NULL);
    check_calls(&P);
    t->a.fail = NULL;
    if (errlen)
        err[0] = 0;
    return t;
}

void jinja_free(struct jinja_template *t)
{
    if (!t)
        return;
    jarena_free(&t->a);
    free(t);
}
