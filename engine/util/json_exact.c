/* See json_exact.h. */
#include "engine/util/json_exact.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/buf.h"
#include "engine/util/fmt_double.h"

void json_real_text(double x, char *buf, size_t len)
{
    char t[40];
    fmt_double(x, t, sizeof t);
    char *e = strchr(t, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (e && exp10 >= 0 && exp10 < 17) { /* %g chose an exponent for fewer digits: fixed, as %.17g */
        char fixed[40];
        size_t k = 0, n = 0;
        if (t[0] == '-')
            fixed[k++] = '-';
        for (const char *c = t; c < e; c++)
            if (*c >= '0' && *c <= '9')
                fixed[k++] = *c, n++;
        for (int z = exp10 - (int)n + 1; z > 0; z--) /* %g keeps an exponent only past its digits */
            fixed[k++] = '0';
        memcpy(fixed + k, ".0", 3);
        snprintf(buf, len, "%s", fixed);
        return;
    }
    bool has_point = strpbrk(t, ".eEin") != NULL; /* "inf"/"nan" never come from jansson */
    snprintf(buf, len, "%s%s", t, has_point ? "" : ".0");
}

char *json_dumps_exact(const json_t *v, size_t flags)
{
    char *s = json_dumps(v, (flags & ~(size_t)JSON_REAL_PRECISION(31)) | JSON_REAL_PRECISION(17));
    if (!s)
        return NULL;
    struct buf b = {0};
    size_t n = strlen(s), from = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9'))
            continue;
        size_t j = i;
        bool real = false;
        while (j < n && strchr("+-0123456789.eE", s[j])) {
            real = real || s[j] == '.' || s[j] == 'e' || s[j] == 'E';
            j++;
        }
        if (real) {
            char num[40];
            json_real_text(strtod(s + i, NULL), num, sizeof num);
            buf_append(&b, s + from, i - from);
            buf_append(&b, num, strlen(num));
            from = j;
        }
        i = j - 1;
    }
    if (from == 0) /* no reals: the text as it is */
        return s;
    buf_append(&b, s + from, n - from);
    free(s);
    return buf_take(&b);
}
