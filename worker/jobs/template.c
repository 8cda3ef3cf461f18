/* Prompt templates: {name} placeholders, {{ and }} escapes. See template.h. */
#include "worker/jobs/template.h"

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "engine/util/fmt_double.h"

static bool name_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '_' || ch == '-' || ch == '.';
}

/* Appends vars.name to b; TMPL_OK or TMPL_ERR_MISSING / TMPL_ERR_TYPE. */
static int put_var(struct buf *b, const json_t *vars, const char *name)
{
    const json_t *v = vars ? json_object_get(vars, name) : NULL;
    char num[64];
    if (!v)
        return TMPL_ERR_MISSING;
    if (json_is_string(v)) {
        buf_append(b, json_string_value(v), json_string_length(v));
    } else if (json_is_integer(v)) {
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        buf_append(b, num, strlen(num));
    } else if (json_is_real(v)) {
        fmt_double(json_real_value(v), num, sizeof num);
        buf_append(b, num, strlen(num));
    } else {
        return TMPL_ERR_TYPE;
    }
    return TMPL_OK;
}

/* Walks text once. With b == NULL only checks the syntax; else renders into b from vars. */
static int scan(const char *text, const json_t *vars, struct buf *b, char *var, char *err, size_t errlen)
{
    const char *p = text;
    while (*p) {
        size_t at = (size_t)(p - text);
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            if (b)
                buf_append(b, p, 1);
            p += 2;
        } else if (*p == '}') {
            return errfmt_rc(err, errlen, TMPL_ERR_SYNTAX,
                             "unmatched '}' at byte %zu (write }} for a literal brace)", at);
        } else if (*p == '{') {
            const char *end = p + 1;
            while (*end && *end != '}' && *end != '{')
                end++;
            if (*end != '}')
                return errfmt_rc(err, errlen, TMPL_ERR_SYNTAX,
                                 "unmatched '{' at byte %zu (write {{ for a literal brace)", at);
            size_t n = (size_t)(end - p - 1);
            if (n == 0)
                return errfmt_rc(err, errlen, TMPL_ERR_SYNTAX,
                                 "empty placeholder {} at byte %zu (write {{}} for literal braces)", at);
            for (const char *q = p + 1; q < end; q++)
                if (!name_char(*q))
                    return errfmt_rc(err, errlen, TMPL_ERR_SYNTAX,
                                     "placeholder at byte %zu: '%.*s' is not a name (letters, digits, _ - .; "
                                     "write {{ and }} for literal braces)",
                                     at, n > 40 ? 40 : (int)n, p + 1);
            if (n > TMPL_MAX_NAME)
                return errfmt_rc(err, errlen, TMPL_ERR_SYNTAX,
                                 "placeholder at byte %zu: a name longer than %d characters", at,
                                 TMPL_MAX_NAME);
            if (b) {
                char name[TMPL_MAX_NAME + 1];
                memcpy(name, p + 1, n);
                name[n] = 0;
                int rc = put_var(b, vars, name);
                if (rc) {
                    if (var)
                        memcpy(var, name, n + 1);
                    return errfmt_rc(err, errlen, rc,
                                     rc == TMPL_ERR_MISSING ? "no value for placeholder '%s'"
                                                            : "the value of '%s' is not a string or a number",
                                     name);
                }
            }
            p = end + 1;
        } else {
            const char *q = p;
            while (*q && *q != '{' && *q != '}')
                q++;
            if (b)
                buf_append(b, p, (size_t)(q - p));
            p = q;
        }
    }
    return TMPL_OK;
}

int tmpl_check(const char *text, char *err, size_t errlen)
{
    return scan(text, NULL, NULL, NULL, err, errlen);
}

int tmpl_render(const char *text, const json_t *vars, char **out, char var[TMPL_MAX_NAME + 1], char *err,
                size_t errlen)
{
    *out = NULL;
    if (var)
        var[0] = 0;
    int rc = tmpl_check(text, err, errlen);
    if (rc)
        return rc;
    struct buf b = {0};
    buf_append(&b, "", 0); /* an empty template renders to "", not NULL */
    rc = scan(text, vars, &b, var, err, errlen);
    if (rc == TMPL_OK && b.oom)
        rc = errfmt_rc(err, errlen, TMPL_ERR_NOMEM, "out of memory");
    if (rc) {
        buf_free(&b);
        return rc;
    }
    *out = b.p;
    return TMPL_OK;
}
