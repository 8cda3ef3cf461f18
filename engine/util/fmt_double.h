/* Shortest decimal text for a double. */
#pragma once
#include <stddef.h>

/* Writes into buf (NUL-terminated, at most len bytes; 32 are always enough) the fewest significant
 * digits that read back (strtod) as exactly v, in printf's %g notation as %.15g would choose it:
 * 0.7 as "0.7", 100 as "100" (not "1e+02"), 0.1 + 0.2 as "0.30000000000000004", 1.5e-07 as
 * "1.5e-07", 1e+15 as "1e+15", 5e-324 as "5e-324". NaN and infinities as printf writes them. */
void fmt_double(double v, char *buf, size_t len);
