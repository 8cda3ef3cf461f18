/* The Jinja interpreter's memory and failure: one arena per parse and per render, growing byte
 * strings in it, and the error exit; see jinja_int.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja_int.h"

struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    _Alignas(max_align_t) unsigned char data[];
};

#define JCHUNK_MIN (16 * 1024)

void jfail(struct jfail *f, const char *fmt, ...)
{
    int k = snprintf(f->err, f->errlen, "%s line %d: ", f->tname, f->line);
    if (k < 0 || (size_t)k >= f->errlen)
        k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err + k, f->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    f->code = JINJA_ERROR;
    longjmp(f->jb, 1);
}

void *jalloc(struct jarena *a, size_t n)
{
    n = (n + _Alignof(max_align_t) - 1) & ~(size_t)(_Alignof(max_align_t) - 1);
    struct jchunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > JCHUNK_MIN ? n : JCHUNK_MIN;
        if (h && cap < h->cap * 2 && h->cap * 2 <= 1024 * 1024)
            cap = h->cap * 2;
        if (a->limit && a->total + cap > a->limit)
            jfail(a->fail, "memory limit of %zu bytes reached", a->limit);
        struct jchunk *c = malloc(sizeof *c + cap);
        if (!c)
            jfail(a->fail, "out of memory");
        c->used = 0;
        c->cap = cap;
        a->total += cap;
        if (h && h->cap - h->used >= JCHUNK_MIN / 4) { /* keep bumping in the roomier old chunk */
            c->next = h->next;
            h->next = c;
            c->used = n;
            memset(c->data, 0, n);
            return c->data;
        }
        c->next = h;
        a->head = h = c;
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

char *jstrndup(struct jarena *a, const char *s, size_t n)
{
    char *p = jalloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jarena_free(struct jarena *a)
{
    for (struct jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

void jbuf_put(struct jbuf *b, const char *s, size_t n)
{
    if (b->max && b->n + n > b->max)
        jfail(b->a->fail, "output limit of %zu bytes reached", b->max);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = jalloc(b->a, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_puts(struct jbuf *b, const char *s)
{
    jbuf_put(b, s, strlen(s));
}

void jbuf_putc(struct jbuf *b, char c)
{
    jbuf_put(b, &c, 1);
}
