/* The Jinja evaluator: walks the syntax tree of a parsed template with the variables of one render,
 * with jinja2's scoping (a for body is a fresh scope each iteration, a macro a scope over where it
 * was defined, if/else none), Python's operators, and the step and output limits. jinja_render
 * lives here. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja_int.h"

#define DEFAULT_MAX_STEPS 10000000ull
#define DEFAULT_MAX_OUTPUT (64u << 20)

static struct jv eval(struct jctx *c, const struct jnode *n, struct jscope *s);
static void exec_body(struct jctx *c, const struct jnode *n, struct jscope *s);

static void step(struct jctx *c, const struct jnode *n)
{
    c->f.line = n->line;
    if (++c->steps > c->max_steps)
        jfail(&c->f, "step limit of %llu reached", (unsigned long long)c->max_steps);
}

/* ---- scopes */

static struct jscope *scope_new(struct jctx *c, struct jscope *parent)
{
    struct jscope *s = jalloc(&c->a, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(struct jctx *c, struct jscope *s, const char *name, struct jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        const char **nn = jalloc(&c->a, cap * sizeof *nn);
        struct jv *nv = jalloc(&c->a, cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static struct jv lookup(struct jctx *c, struct jscope *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (strcmp(s->names[i], name) == 0)
                return s->vals[i];
    const struct jv *v = jdict_gets(c->vars, name);
    if (v)
        return *v;
    int id;
    if (jglobal_find(name, &id))
        return (struct jv){.t = JT_FUNC, .u.fn = id};
    char *why = jalloc(&c->a, strlen(name) + 20);
    sprintf(why, "'%s' is undefined", name);
    return jv_undef(why);
}

static struct jv undef_attr(struct jctx *c, struct jv obj, const char *what, const char *name)
{
    char *why = jalloc(&c->a, strlen(name) + 64);
    sprintf(why, "'%s object' has no %s '%s'", jv_typename(obj), what, name);
    return jv_undef(why);
}

/* ---- attribute and item access */

static struct jv loop_attr(struct jctx *c, struct jv v, const char *name)
{
    const struct jloop *L = v.u.loop;
    if (strcmp(name, "index0") == 0)
        return jv_int((int64_t)L->i);
    if (strcmp(name, "index") == 0)
        return jv_int((int64_t)L->i + 1);
    if (strcmp(name, "revindex0") == 0)
        return jv_int((int64_t)(L->n - L->i - 1));
    if (strcmp(name, "revindex") == 0)
        return jv_int((int64_t)(L->n - L->i));
    if (strcmp(name, "first") == 0)
        return jv_bool(L->i == 0);
    if (strcmp(name, "last") == 0)
        return jv_bool(L->i + 1 == L->n);
    if (strcmp(name, "length") == 0)
        return jv_int((int64_t)L->n);
    if (strcmp(name, "previtem") == 0)
        return L->i > 0 ? L->items[L->i - 1] : jv_undef("there is no previous item");
    if (strcmp(name, "nextitem") == 0)
        return L->i + 1 < L->n ? L->items[L->i + 1] : jv_undef("there is no next item");
    if (strcmp(name, "depth") == 0)
        return jv_int(1);
    if (strcmp(name, "depth0") == 0)
        return jv_int(0);
    return undef_attr(c, v, "attribute", name);
}

struct jv jgetattr(struct jctx *c, struct jv obj, const char *name)
{
    jv_use(c, obj);
    int id;
    if (jmethod_of(obj, name, &id)) {
        struct jmethod *m = jalloc(&c->a, sizeof *m);
        m->self = obj;
        m->id = id;
        return (struct jv){.t = JT_METHOD, .u.meth = m};
    }
    switch (obj.t) {
    case JT_DICT: {
        static const char *const mutators[] = {"pop",   "popitem", "setdefault", "update",
                                               "clear", "copy",    "fromkeys",   NULL};
        for (int i = 0; mutators[i]; i++)
            if (strcmp(name, mutators[i]) == 0)
                jfail(&c->f, "unsupported dict attribute '%s'", name);
    } /* fallthrough */
    case JT_NS: {
        const struct jv *v = jdict_gets(obj.u.d, name);
        return v ? *v : undef_attr(c, obj, "attribute", name);
    }
    case JT_LOOP:
        return loop_attr(c, obj, name);
    default:
        return undef_attr(c, obj, "attribute", name);
    }
}

static bool as_index(struct jv k, int64_t *i)
{
    if (k.t == JT_INT || k.t == JT_BOOL) {
        *i = k.t == JT_BOOL ? k.u.b : k.u.i;
        return true;
    }
    return false;
}

struct jv jgetitem(struct jctx *c, struct jv obj, struct jv key)
{
    jv_use(c, obj);
    int64_t i;
    switch (obj.t) {
    case JT_DICT:
    case JT_NS: {
        const struct jv *v = jdict_get(obj.u.d, key);
        if (v)
            return *v;
        break;
    }
    case JT_LIST:
        if (obj.u.l->gen)
            return jv_undef("'generator' object is not subscriptable");
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0)
                i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : jv_undef("list index out of range");
        }
        break;
    case JT_STR:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)jutf8_len(obj.u.s.p, obj.u.s.n);
            if (i < 0)
                i += n;
            if (i < 0 || i >= n)
                return jv_undef("string index out of range");
            size_t a = jutf8_off(obj.u.s.p, obj.u.s.n, (size_t)i);
            int32_t cp;
            return jv_str(obj.u.s.p + a, jutf8_dec(obj.u.s.p + a, obj.u.s.n - a, &cp));
        }
        break;
    default:
        break;
    }
    if (key.t == JT_STR) {
        char *name = jstrndup(&c->a, key.u.s.p, key.u.s.n);
        return jgetattr(c, obj, name);
    }
    struct jv k = jv_to_str(c, key);
    return undef_attr(c, obj, "element", jstrndup(&c->a, k.u.s.p, k.u.s.n));
}

/* Python's slice.indices: clamps start/stop for a sequence of n with step. */
static void slice_indices(struct jctx *c, struct jv *part, int64_t n, int64_t *start, int64_t *stop,
                          int64_t *stepv)
{
    int64_t st = 1;
    if (part[2].t != JT_NONE && !as_index(part[2], &st))
        jfail(&c->f, "slice indices must be integers or None");
    if (st == 0)
        jfail(&c->f, "slice step cannot be zero");
    int64_t lo = st < 0 ? -1 : 0, hi = st < 0 ? n - 1 : n;
    int64_t b = st < 0 ? hi : lo, e = st < 0 ? lo : hi;
    for (int k = 0; k < 2; k++) {
        int64_t x;
        if (part[k].t == JT_NONE)
            continue;
        if (!as_index(part[k], &x))
            jfail(&c->f, "slice indices must be integers or None");
        if (x < 0) {
            x += n;
            if (x < lo)
                x = lo;
        } else if (x > hi) {
            x = hi;
        }
        if (k == 0)
            b = x;
        else
            e = x;
    }
    *start = b;
    *stop = e;
    *stepv = st;
}

static struct jv do_slice(struct jctx *c, struct jv obj, struct jv *part)
{
    jv_use(c, obj);
    int64_t n, b, e, st;
    if (obj.t == JT_LIST && !obj.u.l->gen) {
        n = (int64_t)obj.u.l->n;
        slice_indices(c, part, n, &b, &e, &st);
        size_t cnt = 0;
        for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
            cnt++;
        struct jlist *l = jlist_new(c, cnt);
        l->tuple = obj.u.l->tuple;
        cnt = 0;
        for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
            l->v[cnt++] = obj.u.l->v[i];
        return (struct jv){.t = JT_LIST, .u.l = l};
    }
    if (obj.t == JT_STR) {
        struct jlist *chars = jv_iter(c, obj);
        n = (int64_t)chars->n;
        slice_indices(c, part, n, &b, &e, &st);
        struct jbuf out = {.a = &c->a};
        jbuf_put(&out, "", 0);
        for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
            jbuf_put(&out, chars->v[i].u.s.p, chars->v[i].u.s.n);
        return jv_str(out.p, out.n);
    }
    /* jinja2 slices with Python's own [a:b:c], not its forgiving getitem: an error */
    jfail(&c->f, "'%s' object is not subscriptable", jv_typename(obj));
}

/* ---- operators */

static _Noreturn void bad_operands(struct jctx *c, const char *op, struct jv a, struct jv b)
{
    if (a.t == JT_STR && strcmp(op, "+") == 0)
        jfail(&c->f, "can only concatenate str (not \"%s\") to str", jv_typename(b));
    jfail(&c->f, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_typename(a), jv_typename(b));
}

static int64_t ival(struct jv v)
{
    return v.t == JT_BOOL ? v.u.b : v.u.i;
}
static bool both_int(struct jv a, struct jv b)
{
    return (a.t == JT_INT || a.t == JT_BOOL) && (b.t == JT_INT || b.t == JT_BOOL);
}

static struct jv repeat(struct jctx *c, struct jv seq, int64_t k)
{
    if (k < 0)
        k = 0;
    if (seq.t == JT_STR) {
        if (seq.u.s.n && (uint64_t)k > c->max_output / seq.u.s.n)
            jfail(&c->f, "output limit of %zu bytes reached", c->max_output);
        struct jbuf b = {.a = &c->a};
        jbuf_put(&b, "", 0);
        for (int64_t i = 0; i < k; i++)
            jbuf_put(&b, seq.u.s.p, seq.u.s.n);
        return jv_str(b.p, b.n);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > c->max_steps / n)
        jfail(&c->f, "step limit of %llu reached", (unsigned long long)c->max_steps);
    struct jlist *l = jlist_new(c, n * (size_t)k);
    l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        memcpy(l->v + (size_t)i * n, seq.u.l->v, n * sizeof *l->v);
    return (struct jv){.t = JT_LIST, .u.l = l};
}

static double py_fmod(double a, double b)
{
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0)))
        m += b;
    return m;
}

/* CPython's float_floor_div. */
static double py_floordiv(double x, double y)
{
    double mod = fmod(x, y), div = (x - mod) / y;
    if (mod != 0 && ((y < 0) != (mod < 0)))
        div -= 1.0;
    if (div == 0)
        return copysign(0.0, x / y);
    double f = floor(div);
    return div - f > 0.5 ? f + 1.0 : f;
}

static struct jv binop(struct jctx *c, enum jop op, struct jv a, struct jv b)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    jv_use(c, a);
    jv_use(c, b);
    int64_t r;
    if (op == OP_ADD && a.t == JT_STR && b.t == JT_STR) {
        char *p = jalloc(&c->a, a.u.s.n + b.u.s.n + 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        return jv_str(p, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == JT_LIST && b.t == JT_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->gen &&
        !b.u.l->gen) {
        struct jlist *l = jlist_new(c, a.u.l->n + b.u.l->n);
        l->tuple = a.u.l->tuple;
        memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        return (struct jv){.t = JT_LIST, .u.l = l};
    }
    bool seq_a = a.t == JT_STR || (a.t == JT_LIST && !a.u.l->gen);
    bool seq_b = b.t == JT_STR || (b.t == JT_LIST && !b.u.l->gen);
    if (op == OP_MUL && seq_a && (b.t == JT_INT || b.t == JT_BOOL))
        return repeat(c, a, ival(b));
    if (op == OP_MUL && seq_b && (a.t == JT_INT || a.t == JT_BOOL))
        return repeat(c, b, ival(a));
    if (!jv_is_num(a) || !jv_is_num(b))
        bad_operands(c, names[op], a, b);
    if (both_int(a, b)) {
        int64_t x = ival(a), y = ival(b);
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &r))
                break;
            return jv_int(r);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &r))
                break;
            return jv_int(r);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &r))
                break;
            return jv_int(r);
        case OP_DIV:
            if (y == 0)
                jfail(&c->f, "division by zero");
            return jv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0)
                jfail(&c->f, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                break;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
                q--, m += y;
            return jv_int(op == OP_MOD ? m : q);
        }
        case OP_POW:
            if (y < 0 && x == 0)
                jfail(&c->f, "0.0 cannot be raised to a negative power");
            if (y < 0)
                return jv_float(pow((double)x, (double)y));
            r = 1;
            for (int64_t i = 0; i < y; i++)
                if (__builtin_mul_overflow(r, x, &r))
                    jfail(&c->f, "integer overflow");
            return jv_int(r);
        default:
            break;
        }
        jfail(&c->f, "integer overflow");
    }
    double x = jv_num(a), y = jv_num(b);
    switch (op) {
    case OP_ADD:
        return jv_float(x + y);
    case OP_SUB:
        return jv_float(x - y);
    case OP_MUL:
        return jv_float(x * y);
    case OP_DIV:
        if (y == 0)
            jfail(&c->f, "float division by zero");
        return jv_float(x / y);
    case OP_FLOORDIV:
        if (y == 0)
            jfail(&c->f, "float floor division by zero");
        return jv_float(py_floordiv(x, y));
    case OP_MOD:
        if (y == 0)
            jfail(&c->f, "float modulo");
        return jv_float(py_fmod(x, y));
    default:
        if (x == 0 && y < 0)
            jfail(&c->f, "0.0 cannot be raised to a negative power");
        return jv_float(pow(x, y));
    }
}

static bool contains(struct jctx *c, struct jv container, struct jv item)
{
    switch (container.t) {
    case JT_UNDEF:
        return false;
    case JT_STR:
        if (item.t != JT_STR)
            jfail(&c->f, "'in <string>' requires string as left operand, not %s", jv_typename(item));
        return item.u.s.n == 0 || memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case JT_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_eq(container.u.l->v[i], item))
                return true;
        return false;
    case JT_DICT:
    case JT_NS:
        jv_hashable(c, item);
        return jdict_get(container.u.d, item) != NULL;
    default:
        jfail(&c->f, "argument of type '%s' is not iterable", jv_typename(container));
    }
}

static bool compare(struct jctx *c, enum jop op, struct jv a, struct jv b)
{
    switch (op) {
    case OP_EQ:
        return jv_eq(a, b);
    case OP_NE:
        return !jv_eq(a, b);
    case OP_LT:
        return jv_cmp(c, a, b) < 0;
    case OP_LE:
        return jv_cmp(c, a, b) <= 0;
    case OP_GT:
        return jv_cmp(c, a, b) > 0;
    case OP_GE:
        return jv_cmp(c, a, b) >= 0;
    case OP_IN:
        return contains(c, b, a);
    default:
        return !contains(c, b, a);
    }
}

/* ---- calls */

static struct jv capture(struct jctx *c, const struct jnode *body, struct jscope *s)
{
    struct jbuf b = {.a = &c->a, .max = c->max_output}, *saved = c->out;
    jbuf_put(&b, "", 0);
    c->out = &b;
    exec_body(c, body, s);
    c->out = saved;
    return jv_str(b.p, b.n);
}

static struct jv call_macro(struct jctx *c, const struct jmacro *m, struct jv *pos, size_t npos,
                            const char **kwname, struct jv *kw, size_t nkw)
{
    const struct jnode *def = m->def;
    const char *name = def->k == NK_MACRO ? def->name : "caller";
    if (npos > def->nnames)
        jfail(&c->f, "macro '%s' takes not more than %zu argument(s)", name, def->nnames);
    struct jscope *s = scope_new(c, m->closure);
    struct jv *vals = jalloc(&c->a, (def->nnames + 1) * sizeof *vals);
    for (size_t i = 0; i < def->nnames; i++)
        vals[i].t = JT_NOARG;
    for (size_t i = 0; i < npos; i++)
        vals[i] = pos[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < def->nnames && strcmp(def->names[i], kwname[k]) != 0)
            i++;
        if (i == def->nnames)
            jfail(&c->f, "macro '%s' takes no keyword argument '%s'", name, kwname[k]);
        if (vals[i].t != JT_NOARG)
            jfail(&c->f, "macro '%s' got multiple values for argument '%s'", name, kwname[k]);
        vals[i] = kw[k];
    }
    for (size_t i = 0; i < def->nnames; i++) {
        if (vals[i].t == JT_NOARG) {
            if (def->defaults[i]) {
                vals[i] = eval(c, def->defaults[i], s);
            } else {
                char *why = jalloc(&c->a, strlen(def->names[i]) + 40);
                sprintf(why, "parameter '%s' was not provided", def->names[i]);
                vals[i] = jv_undef(why);
            }
        }
        scope_set(c, s, def->names[i], vals[i]);
    }
    if (m->caller.t == JT_MACRO)
        scope_set(c, s, "caller", m->caller);
    int line = c->f.line;
    struct jv out = capture(c, def->body, s);
    c->f.line = line;
    return out;
}

/* namespace(...) and dict(...): a mapping to copy, then keyword pairs. */
static struct jv make_mapping(struct jctx *c, enum jtype t, struct jv *pos, size_t npos, const char **kwname,
                              struct jv *kw, size_t nkw)
{
    struct jdict *d = jdict_new(c, npos + nkw + 4);
    if (npos > 1)
        jfail(&c->f, "expected at most 1 positional argument, got %zu", npos);
    if (npos) {
        if (pos[0].t != JT_DICT && pos[0].t != JT_NS)
            jfail(&c->f, "cannot convert '%s' to a mapping", jv_typename(pos[0]));
        for (size_t i = 0; i < pos[0].u.d->n; i++)
            jdict_set(c, d, pos[0].u.d->k[i], pos[0].u.d->v[i]);
    }
    for (size_t i = 0; i < nkw; i++)
        jdict_set(c, d, jv_cstr(c, kwname[i]), kw[i]);
    return (struct jv){.t = t, .u.d = d};
}

struct jv jcall_value(struct jctx *c, struct jv fn, struct jv *pos, size_t npos, const char **kwname,
                      struct jv *kw, size_t nkw)
{
    jv_use(c, fn);
    struct jv p[JMAXPARAM];
    const struct jcallable *f;
    struct jv self = jv_none();
    switch (fn.t) {
    case JT_MACRO:
        return call_macro(c, fn.u.m, pos, npos, kwname, kw, nkw);
    case JT_FUNC:
        f = jglobal_at(fn.u.fn);
        if (strcmp(f->name, "namespace") == 0 || strcmp(f->name, "dict") == 0)
            return make_mapping(c, f->name[0] == 'n' ? JT_NS : JT_DICT, pos, npos, kwname, kw, nkw);
        break;
    case JT_METHOD:
        f = jmethod_at(fn.u.meth->id);
        self = fn.u.meth->self;
        break;
    default:
        jfail(&c->f, "'%s' object is not callable", jv_typename(fn));
    }
    jbind(c, f, "function", pos, npos, kwname, kw, nkw, p, &c->rest, &c->nrest);
    return f->fn(c, self, p);
}

/* Evaluated arguments of a call, filter or test node. */
static void eval_args(struct jctx *c, const struct jargs *a, struct jscope *s, struct jv **pos,
                      struct jv **kw)
{
    *pos = jalloc(&c->a, (a->n + 1) * sizeof **pos);
    *kw = jalloc(&c->a, (a->nkw + 1) * sizeof **kw);
    for (size_t i = 0; i < a->n; i++)
        (*pos)[i] = eval(c, a->pos[i], s);
    for (size_t i = 0; i < a->nkw; i++)
        (*kw)[i] = eval(c, a->kw[i], s);
}

static struct jv apply(struct jctx *c, const struct jcallable *f, const char *what, struct jv v,
                       struct jv *pos, size_t npos, const char **kwname, struct jv *kw, size_t nkw)
{
    struct jv p[JMAXPARAM];
    jbind(c, f, what, pos, npos, kwname, kw, nkw, p, &c->rest, &c->nrest);
    return f->fn(c, v, p);
}

struct jv japply_named(struct jctx *c, bool test, struct jv name, struct jv v, struct jv *args, size_t nargs)
{
    if (name.t != JT_STR)
        jfail(&c->f, "a %s name must be a string", test ? "test" : "filter");
    const char *n = jstrndup(&c->a, name.u.s.p, name.u.s.n);
    const struct jcallable *f = test ? jtest_find(n) : jfilter_find(n);
    if (!f)
        jfail(&c->f, "unsupported %s '%s'", test ? "test" : "filter", n);
    return apply(c, f, test ? "test" : "filter", v, args, nargs, NULL, NULL, 0);
}

/* A filter node over `operand` (the value of n->a, or the body of a filter block). */
static struct jv eval_filter(struct jctx *c, const struct jnode *n, struct jv operand, struct jscope *s)
{
    struct jv *pos, *kw;
    eval_args(c, &n->args, s, &pos, &kw);
    c->f.line = n->line;
    return apply(c, n->filter, "filter", operand, pos, n->args.n, n->args.kwname, kw, n->args.nkw);
}

static struct jv filter_chain(struct jctx *c, const struct jnode *n, struct jv operand, struct jscope *s)
{
    if (n->a)
        operand = filter_chain(c, n->a, operand, s);
    return eval_filter(c, n, operand, s);
}

/* ---- expressions */

static struct jv eval_node(struct jctx *c, const struct jnode *n, struct jscope *s);

static void enter(struct jctx *c)
{
    if (++c->depth > JMAXDEPTH)
        jfail(&c->f, "nested too deeply (more than %d levels of expressions and macro calls)", JMAXDEPTH);
}

static struct jv eval(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    enter(c);
    struct jv v = eval_node(c, n, s);
    c->depth--;
    return v;
}

static struct jv eval_node(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    step(c, n);
    struct jv a, b, *pos, *kw;
    switch (n->k) {
    case NK_CONST:
        return n->cval;
    case NK_NAME:
        return lookup(c, s, n->name);
    case NK_ATTR:
        a = eval(c, n->a, s);
        c->f.line = n->line;
        return jgetattr(c, a, n->name);
    case NK_ITEM:
        a = eval(c, n->a, s);
        b = eval(c, n->b, s);
        c->f.line = n->line;
        return jgetitem(c, a, b);
    case NK_SLICE: {
        struct jv part[3];
        a = eval(c, n->a, s);
        for (int i = 0; i < 3; i++)
            part[i] = n->items[i] ? eval(c, n->items[i], s) : jv_none();
        c->f.line = n->line;
        return do_slice(c, a, part);
    }
    case NK_CALL:
        a = eval(c, n->a, s);
        eval_args(c, &n->args, s, &pos, &kw);
        c->f.line = n->line;
        return jcall_value(c, a, pos, n->args.n, n->args.kwname, kw, n->args.nkw);
    case NK_FILTER:
        return eval_filter(c, n, eval(c, n->a, s), s);
    case NK_TEST: {
        a = eval(c, n->a, s);
        eval_args(c, &n->args, s, &pos, &kw);
        c->f.line = n->line;
        bool r = jv_truthy(apply(c, n->test, "test", a, pos, n->args.n, n->args.kwname, kw, n->args.nkw));
        return jv_bool(n->negate ? !r : r);
    }
    case NK_NOT:
        return jv_bool(!jv_truthy(eval(c, n->a, s)));
    case NK_NEG:
    case NK_POS:
        a = eval(c, n->a, s);
        jv_use(c, a);
        if (!jv_is_num(a))
            jfail(&c->f, "bad operand type for unary %c: '%s'", n->k == NK_NEG ? '-' : '+', jv_typename(a));
        if (n->k == NK_POS)
            return a.t == JT_BOOL ? jv_int(a.u.b) : a;
        if (a.t == JT_FLOAT)
            return jv_float(-a.u.f);
        if (a.t == JT_INT && a.u.i == INT64_MIN)
            jfail(&c->f, "integer overflow");
        return jv_int(-ival(a));
    case NK_AND:
        a = eval(c, n->a, s);
        return jv_truthy(a) ? eval(c, n->b, s) : a;
    case NK_OR:
        a = eval(c, n->a, s);
        return jv_truthy(a) ? a : eval(c, n->b, s);
    case NK_BIN:
        a = eval(c, n->a, s);
        b = eval(c, n->b, s);
        c->f.line = n->line;
        return binop(c, n->op, a, b);
    case NK_CMP:
        a = eval(c, n->a, s);
        for (size_t i = 0; i < n->nitems; i++) {
            b = eval(c, n->items[i], s);
            c->f.line = n->line;
            if (!compare(c, n->ops[i], a, b))
                return jv_bool(false);
            a = b;
        }
        return jv_bool(true);
    case NK_CONCAT: {
        struct jbuf out = {.a = &c->a};
        jbuf_put(&out, "", 0);
        for (size_t i = 0; i < n->nitems; i++)
            jv_str_to(c, &out, eval(c, n->items[i], s));
        return jv_str(out.p, out.n);
    }
    case NK_COND:
        if (jv_truthy(eval(c, n->b, s)))
            return eval(c, n->a, s);
        return n->c ? eval(c, n->c, s)
                    : jv_undef("the inline if expression evaluated to false and no else section was defined");
    case NK_LIST:
    case NK_TUPLE: {
        struct jlist *l = jlist_new(c, n->nitems);
        l->tuple = n->k == NK_TUPLE;
        for (size_t i = 0; i < n->nitems; i++)
            l->v[i] = eval(c, n->items[i], s);
        return (struct jv){.t = JT_LIST, .u.l = l};
    }
    case NK_DICT: {
        struct jdict *d = jdict_new(c, n->nitems / 2);
        for (size_t i = 0; i + 1 < n->nitems; i += 2) {
            a = eval(c, n->items[i], s);
            jv_use(c, a);
            jv_hashable(c, a);
            jdict_set(c, d, a, eval(c, n->items[i + 1], s));
        }
        return (struct jv){.t = JT_DICT, .u.d = d};
    }
    default:
        jfail(&c->f, "internal error: node %d is not an expression", (int)n->k);
    }
}

/* ---- statements */

/* Binds for/set targets: one name takes v, several unpack a sequence of that length. */
static void assign(struct jctx *c, struct jscope *s, const struct jnode *n, struct jv v)
{
    if (n->nnames == 1) {
        scope_set(c, s, n->names[0], v);
        return;
    }
    jv_use(c, v);
    struct jlist *l = jv_iter(c, v);
    if (l->n != n->nnames)
        jfail(&c->f, "%s values to unpack (expected %zu, got %zu)",
              l->n > n->nnames ? "too many" : "not enough", n->nnames, l->n);
    for (size_t i = 0; i < l->n; i++)
        scope_set(c, s, n->names[i], l->v[i]);
}

/* The scope for a loop's next item: `prev` emptied, or a new one when a macro closed over prev. */
static struct jscope *fresh_scope(struct jctx *c, struct jscope *prev, struct jscope *parent)
{
    if (prev->captured)
        return scope_new(c, parent);
    prev->n = 0;
    return prev;
}

static void exec_for(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    struct jv seq = eval(c, n->a, s);
    c->f.line = n->line;
    struct jlist *items = jv_iter(c, seq);
    struct jscope *it = scope_new(c, s);
    if (n->b) { /* `for x in xs if cond`: the loop sees only the items that pass */
        struct jlist *kept = jlist_new(c, items->n);
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            step(c, n);
            struct jscope *fs = fresh_scope(c, it, s);
            assign(c, fs, n, items->v[i]);
            if (jv_truthy(eval(c, n->b, fs)))
                kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    struct jloop *L = jalloc(&c->a, sizeof *L);
    L->n = items->n;
    L->items = items->v;
    for (size_t i = 0; i < items->n; i++) {
        step(c, n);
        it = fresh_scope(c, it, s);
        L->i = i;
        assign(c, it, n, items->v[i]);
        scope_set(c, it, "loop", (struct jv){.t = JT_LOOP, .u.loop = L});
        exec_body(c, n->body, it);
        int brk = c->brk;
        c->brk = 0;
        if (brk == 1)
            break;
    }
    if (!items->n)
        exec_body(c, n->else_body, s);
}

static void capture_scopes(struct jscope *s)
{
    for (; s && !s->captured; s = s->parent)
        s->captured = true;
}

static void exec_node(struct jctx *c, const struct jnode *n, struct jscope *s);

static void exec_stmt(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    enter(c);
    exec_node(c, n, s);
    c->depth--;
}

static void exec_node(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    step(c, n);
    struct jv v;
    switch (n->k) {
    case NK_TEXT:
        jbuf_put(c->out, n->text, n->textlen);
        return;
    case NK_PRINT:
        v = eval(c, n->a, s);
        jv_str_to(c, c->out, v);
        return;
    case NK_IF:
        if (jv_truthy(eval(c, n->a, s)))
            exec_body(c, n->body, s);
        else
            exec_body(c, n->else_body, s);
        return;
    case NK_FOR:
        exec_for(c, n, s);
        return;
    case NK_SET:
        v = eval(c, n->a, s);
        c->f.line = n->line;
        if (n->attr) {
            struct jv ns = lookup(c, s, n->names[0]);
            if (ns.t != JT_NS)
                jfail(&c->f, "cannot assign attribute on non-namespace object");
            jdict_set(c, ns.u.d, jv_cstr(c, n->attr), v);
        } else {
            assign(c, s, n, v);
        }
        return;
    case NK_SETBLOCK:
        scope_set(c, s, n->names[0], capture(c, n->body, s));
        return;
    case NK_MACRO: {
        struct jmacro *m = jalloc(&c->a, sizeof *m);
        m->def = n;
        m->closure = s;
        m->caller = jv_undef(NULL);
        capture_scopes(s);
        scope_set(c, s, n->name, (struct jv){.t = JT_MACRO, .u.m = m});
        return;
    }
    case NK_CALLBLOCK: {
        struct jmacro *caller = jalloc(&c->a, sizeof *caller);
        caller->def = n;
        caller->closure = s;
        caller->caller = jv_undef(NULL);
        capture_scopes(s);
        struct jv fn = eval(c, n->a->a, s), *pos, *kw;
        eval_args(c, &n->a->args, s, &pos, &kw);
        c->f.line = n->line;
        if (fn.t != JT_MACRO)
            jfail(&c->f, "a call block must call a macro");
        struct jmacro with = *fn.u.m;
        with.caller = (struct jv){.t = JT_MACRO, .u.m = caller};
        v = call_macro(c, &with, pos, n->a->args.n, n->a->args.kwname, kw, n->a->args.nkw);
        jbuf_put(c->out, v.u.s.p, v.u.s.n);
        return;
    }
    case NK_FILTERBLOCK:
        v = filter_chain(c, n->a, capture(c, n->body, s), s);
        jv_str_to(c, c->out, v);
        return;
    case NK_BREAK:
        c->brk = 1;
        return;
    case NK_CONTINUE:
        c->brk = 2;
        return;
    case NK_BLOCK:
        exec_body(c, n->body, s);
        return;
    default:
        jfail(&c->f, "internal error: node %d is not a statement", (int)n->k);
    }
}

static void exec_body(struct jctx *c, const struct jnode *n, struct jscope *s)
{
    for (; n && !c->brk; n = n->next)
        exec_stmt(c, n, s);
}

int jinja_render(const struct jinja_template *t, const struct json_t *vars, const struct jinja_options *opt,
                 char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (errlen)
        err[0] = 0;
    struct jctx *volatile c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "%s: out of memory", t->name);
        return JINJA_ERROR;
    }
    c->t = t;
    c->max_steps = opt && opt->max_steps ? opt->max_steps : DEFAULT_MAX_STEPS;
    c->max_output = opt && opt->max_output ? opt->max_output : DEFAULT_MAX_OUTPUT;
    c->now = opt && opt->now ? opt->now : time(NULL);
    c->f = (struct jfail){.err = err, .errlen = errlen, .tname = t->name, .line = 1};
    c->a.fail = &c->f;
    c->a.limit = 4 * c->max_output + (64u << 20);
    volatile int rc = JINJA_OK;
    if (setjmp(c->f.jb)) {
        rc = c->f.code;
    } else {
        if (!vars || !json_is_object(vars))
            jfail(&c->f, "the variables must be a JSON object");
        c->vars = jv_from_json(c, vars).u.d;
        struct jbuf b = {.a = &c->a, .max = c->max_output};
        jbuf_put(&b, "", 0);
        c->out = &b;
        exec_body(c, t->body, scope_new(c, NULL));
        char *s = malloc(b.n + 1);
        if (!s) {
            snprintf(err, errlen, "%s: out of memory", t->name);
            rc = JINJA_ERROR;
        } else {
            memcpy(s, b.p, b.n + 1);
            *out = s;
            if (out_len)
                *out_len = b.n;
        }
    }
    jarena_free(&c->a);
    free(c);
    return rc;
}
