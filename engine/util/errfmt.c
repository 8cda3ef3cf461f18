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
