/* See errfmt.h. */
#include "engine/util/errfmt.h"

#include <stdarg.h>
#include <stdio.h>

static void vformat(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
}

int errfmt(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int errfmt_rc(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat(err, errlen, fmt, ap);
    va_end(ap);
    return rc;
}

const char *errfmt_quote(const char *s, char *buf, size_t len)
{
    size_t n = 0;
    buf[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 8 < len; p++) {
        if (p - (const unsigned char *)s >= 60) {
            n += (size_t)snprintf(buf + n, len - n, "...");
            break;
        }
        if (*p == '"' || *p == '\\')
            n += (size_t)snprintf(buf + n, len - n, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            n += (size_t)snprintf(buf + n, len - n, "\\x%02x", *p);
        else
            buf[n++] = (char)*p;
    }
    snprintf(buf + n, len - n, "\"");
    return buf;
}
