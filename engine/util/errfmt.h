/* Error messages into a caller's buffer: the `char *err, size_t errlen` pair that functions which
 * can fail take, filled printf-style on the failing path. */
#pragma once

#include <stddef.h>

/* Formats fmt into err[0..errlen), cut (and always terminated) when longer; writes nothing when err
 * is NULL or errlen is 0. Returns -1, so a failing path reads `return errfmt(err, errlen, ...);`. */
int errfmt(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* errfmt returning rc instead, for functions whose failures are other negative codes. */
int errfmt_rc(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* s in double quotes for an error message: '"' and '\\' escaped, control bytes as \xNN, cut after 60
 * characters with "...". Returns buf (len >= 16). */
const char *errfmt_quote(const char *s, char *buf, size_t len);
