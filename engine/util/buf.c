/* See buf.h. */
#include "engine/util/buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"

#define BUF_MIN_CAP 64

int buf_reserve(struct buf *b, size_t more)
{
    if (b->oom)
        return -1;
    if (more > (size_t)-1 - 1 - b->len || array_reserve(&b->p, &b->cap, b->len + more + 1, 1, BUF_MIN_CAP)) {
        b->oom = true;
        return -1;
    }
    return 0;
}

int buf_append(struct buf *b, const void *s, size_t n)
{
    if (buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int buf_puts(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

int buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    if (b->oom)
        return -1;
    va_list again;
    va_copy(again, ap);
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap);
    if (n >= 0 && (size_t)n >= room) { /* it did not fit: make room and format again */
        if (buf_reserve(b, (size_t)n)) {
            va_end(again);
            return -1;
        }
        n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, again);
    }
    va_end(again);
    if (n < 0) { /* an encoding error: nothing appended */
        if (b->p)
            b->p[b->len] = 0;
        return -1;
    }
    b->len += (size_t)n;
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

char *buf_take(struct buf *b)
{
    if (!b->oom && !b->p)
        buf_append(b, "", 0); /* "" rather than NULL */
    if (b->oom) {
        buf_free(b);
        return NULL;
    }
    char *p = b->p;
    *b = (struct buf){0};
    return p;
}

void buf_free(struct buf *b)
{
    free(b->p);
    *b = (struct buf){0};
}
