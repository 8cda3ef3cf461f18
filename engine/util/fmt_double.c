/* See fmt_double.h. */
#include "engine/util/fmt_double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fmt_double(double v, char *buf, size_t len)
{
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (prec == 17)
        snprintf(buf, len, "%.17g", v);
    /* %g writes an exponent once the decimal exponent reaches the precision (100 at 1 digit as
     * 1e+02): below 15, write the integer digits instead, as %.15g does; the added digits are
     * zeros, which %g drops after a decimal point */
    const char *e = strchr(buf, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (e && exp10 >= prec && exp10 < 15)
        snprintf(buf, len, "%.*g", exp10 + 1, v);
}
