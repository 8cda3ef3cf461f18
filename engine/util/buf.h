/* A growable byte buffer for text built piece by piece (a result line, a rendered template, a
 * metrics page). It grows by array_reserve's doubling and keeps a NUL after the bytes, so b.p
 * reads as a C string at any time. A failed append sets b.oom and makes every later append a
 * no-op, so a builder appends freely and checks once at the end. */
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct buf {
    char *p;    /* the bytes and a NUL; owned; NULL until the first append */
    size_t len; /* bytes held, the NUL not counted */
    size_t cap; /* bytes allocated */
    bool oom;   /* an append failed for want of memory (sticky until buf_free) */
};

/* Room for `more` bytes (and the NUL) after len, allocated ahead. 0, or -1 out of memory (oom set). */
int buf_reserve(struct buf *b, size_t more);

/* Appends n bytes of s. Returns 0, or -1 when out of memory or oom was set already (nothing added). */
int buf_append(struct buf *b, const void *s, size_t n);

/* Appends the C string s. As buf_append. */
int buf_puts(struct buf *b, const char *s);

/* Appends printf-style text. As buf_append. */
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Hands the bytes over to the caller (free() them) and leaves b empty; "" (allocated) when nothing
 * was appended, NULL when out of memory or oom was set (b is freed then too). */
char *buf_take(struct buf *b);

/* Frees the bytes and zeroes b (oom included). Accepts a zeroed b. */
void buf_free(struct buf *b);
