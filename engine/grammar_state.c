/* Matcher states of a grammar (engine/grammar_int.h): sets of stacks of positions, advanced one byte
 * at a time, kept in a canonical form so that equal states compare and hash alike. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/util/array.h"

void gr_scratch_free(struct gr_scratch *sc)
{
    if (!sc)
        return;
    free(sc->cur);
    gr_state_free(&sc->raw);
    free(sc->offs);
    memset(sc, 0, sizeof *sc);
}

void gr_state_free(struct gr_state *s)
{
    if (!s)
        return;
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int reserve(int32_t **p, int32_t *cap, int64_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = (size_t)*cap;
    if (need > INT32_MAX || array_reserve(p, &c, (size_t)need, sizeof **p, 64) || c > INT32_MAX)
        return -1;
    *cap = (int32_t)c;
    return 0;
}

int gr_state_copy(const struct gr_state *in, struct gr_state *out)
{
    if (reserve(&out->v, &out->cap, in->n) < 0)
        return -1;
    if (in->n)
        memcpy(out->v, in->v, (size_t)in->n * sizeof *in->v);
    out->n = in->n;
    out->n_stacks = in->n_stacks;
    out->complete = in->complete;
    return 0;
}

uint64_t gr_state_hash(const struct gr_state *s)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)s->v;
    for (size_t i = 0; i < (size_t)s->n * sizeof *s->v; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

struct expand {
    const struct grammar *g;
    struct gr_scratch *sc;
    char *err;
    size_t errlen;
    int failed; /* 0, or -1 after an error */
};

/* Appends the stack cur[0..len) to the raw list. */
static void emit(struct expand *x, int32_t len)
{
    struct gr_scratch *sc = x->sc;
    if (sc->raw.n_stacks >= GR_MAX_STACKS * 4) {
        snprintf(x->err, x->errlen, "grammar state too large (more than %d stacks)", GR_MAX_STACKS);
        x->failed = -1;
        return;
    }
    if (reserve(&sc->raw.v, &sc->raw.cap, (int64_t)sc->raw.n + len + 1) < 0 ||
        reserve(&sc->offs, &sc->cap_offs, (int64_t)sc->raw.n_stacks + 1) < 0) {
        snprintf(x->err, x->errlen, "out of memory matching a grammar");
        x->failed = -1;
        return;
    }
    sc->offs[sc->raw.n_stacks++] = sc->raw.n;
    sc->raw.v[sc->raw.n++] = len;
    memcpy(sc->raw.v + sc->raw.n, sc->cur, (size_t)len * sizeof *sc->cur);
    sc->raw.n += len;
}

/* Expands the stack cur[0..len) until its top is a byte class (or it is empty), emitting every
 * stack that results. cur[0..len) is as it was on return. */
static void expand(struct expand *x, int32_t len)
{
    if (x->failed)
        return;
    struct gr_scratch *sc = x->sc;
    const struct grammar *g = x->g;
    if (len == 0) {
        emit(x, 0);
        return;
    }
    int32_t top = sc->cur[len - 1];
    const struct gr_elem *e = &g->elems[top];
    if (e->kind == GR_CLASS) {
        emit(x, len);
        return;
    }
    if (e->kind == GR_END) {
        expand(x, len - 1);
        sc->cur[len - 1] = top;
        return;
    }
    /* A rule: replace the top by its continuation (none after a tail call), push each alternative. */
    int32_t n = len;
    if (g->elems[top + 1].kind != GR_END)
        sc->cur[len - 1] = top + 1;
    else
        n = len - 1;
    if (n + 1 > GR_MAX_STACK_DEPTH) {
        snprintf(x->err, x->errlen, "grammar nesting too deep (more than %d levels)", GR_MAX_STACK_DEPTH);
        x->failed = -1;
        sc->cur[len - 1] = top;
        return;
    }
    if (reserve(&sc->cur, &sc->cap_cur, (int64_t)n + 1) < 0) {
        snprintf(x->err, x->errlen, "out of memory matching a grammar");
        x->failed = -1;
        return;
    }
    const struct gr_rule *r = &g->rules[e->arg];
    for (int32_t a = 0; a < r->n_alts && !x->failed; a++) {
        sc->cur[n] = g->alts[r->first_alt + a];
        expand(x, n + 1);
    }
    sc->cur[len - 1] = top;
}

/* qsort has no context argument: the comparison reads the raw list of the calling thread here. */
static __thread const int32_t *cmp_base;

/* The order of the canonical form: shorter stacks first, then by positions from the bottom. */
static inline int cmp_stacks(const int32_t *a, const int32_t *b)
{
    if (a[0] != b[0])
        return a[0] < b[0] ? -1 : 1;
    for (int32_t i = 1; i <= a[0]; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

static int cmp_stack(const void *pa, const void *pb)
{
    return cmp_stacks(cmp_base + *(const int32_t *)pa, cmp_base + *(const int32_t *)pb);
}

/* Sorts offs[0..n) by the stacks they point to in base: insertion sort for the few stacks of most
 * states (no call per comparison), qsort beyond. */
static void sort_stacks(const int32_t *base, int32_t *offs, int32_t n)
{
    if (n > 24) {
        cmp_base = base;
        qsort(offs, (size_t)n, sizeof *offs, cmp_stack);
        return;
    }
    for (int32_t i = 1; i < n; i++) {
        int32_t o = offs[i], j = i;
        while (j > 0 && cmp_stacks(base + offs[j - 1], base + o) > 0) {
            offs[j] = offs[j - 1];
            j--;
        }
        offs[j] = o;
    }
}

/* Sorts the raw stacks, drops repeats, writes the canonical form into out. */
static int canonicalize(struct expand *x, struct gr_state *out)
{
    struct gr_scratch *sc = x->sc;
    int32_t ns = sc->raw.n_stacks;
    const int32_t *base = sc->raw.v;
    if (ns > 1)
        sort_stacks(base, sc->offs, ns);
    out->n = 0;
    out->n_stacks = 0;
    out->complete = false;
    if (reserve(&out->v, &out->cap, sc->raw.n) < 0) {
        snprintf(x->err, x->errlen, "out of memory matching a grammar");
        return -1;
    }
    int32_t prev = -1;
    for (int32_t i = 0; i < ns; i++) {
        const int32_t *s = base + sc->offs[i];
        if (prev >= 0 && !cmp_stacks(base + sc->offs[prev], s))
            continue;
        prev = i;
        if (out->n_stacks >= GR_MAX_STACKS) {
            snprintf(x->err, x->errlen, "grammar state too large (more than %d stacks)", GR_MAX_STACKS);
            return -1;
        }
        memcpy(out->v + out->n, s, ((size_t)s[0] + 1) * sizeof *s);
        out->n += s[0] + 1;
        out->n_stacks++;
        if (s[0] == 0)
            out->complete = true;
    }
    return 0;
}

static void begin(struct expand *x, const struct grammar *g, struct gr_scratch *sc, char *err, size_t errlen)
{
    *x = (struct expand){.g = g, .sc = sc, .err = err, .errlen = errlen};
    sc->raw.n = 0;
    sc->raw.n_stacks = 0;
}

int gr_state_start(const struct grammar *g, struct gr_state *out, struct gr_scratch *sc, char *err,
                   size_t errlen)
{
    struct expand x;
    begin(&x, g, sc, err, errlen);
    if (reserve(&sc->cur, &sc->cap_cur, 1) < 0) {
        snprintf(err, errlen, "out of memory matching a grammar");
        return -1;
    }
    const struct gr_rule *r = &g->rules[g->root];
    for (int32_t a = 0; a < r->n_alts && !x.failed; a++) {
        sc->cur[0] = g->alts[r->first_alt + a];
        expand(&x, 1);
    }
    if (x.failed || canonicalize(&x, out) < 0)
        return -1;
    return 1;
}

int gr_state_advance(const struct grammar *g, const struct gr_state *in, uint8_t byte, struct gr_state *out,
                     struct gr_scratch *sc, char *err, size_t errlen)
{
    struct expand x;
    begin(&x, g, sc, err, errlen);
    for (int32_t i = 0; i < in->n && !x.failed;) {
        const int32_t *s = in->v + i;
        int32_t len = s[0];
        i += len + 1;
        if (len == 0)
            continue;
        int32_t top = s[len];
        const struct gr_elem *e = &g->elems[top];
        if (e->kind != GR_CLASS || !gr_class_has(&g->classes[e->arg], byte))
            continue;
        if (reserve(&sc->cur, &sc->cap_cur, len) < 0) {
            snprintf(err, errlen, "out of memory matching a grammar");
            return -1;
        }
        memcpy(sc->cur, s + 1, (size_t)len * sizeof *s);
        sc->cur[len - 1] = top + 1;
        expand(&x, len);
    }
    if (x.failed || canonicalize(&x, out) < 0)
        return -1;
    return out->n_stacks > 0;
}
