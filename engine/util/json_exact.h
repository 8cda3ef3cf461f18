/* JSON text whose real numbers read as they were stored: jansson writes a double with 17 digits
 * (0.7 as 0.69999999999999996, a Unix time as 1796603375.0109999); these functions write the
 * shortest digits that read back as the same double (0.7, 1796603375.011). */
#pragma once
#include <jansson.h>

/* json_dumps(v, flags), every real written as the fewest significant digits that read back as
 * the same double, in the same notation jansson uses (fixed below 1e17 and down to 1e-4, else an
 * exponent; a ".0" when it would read as an integer). A JSON_REAL_PRECISION in flags is ignored.
 * malloc'd; NULL when out of memory or when json_dumps fails. */
char *json_dumps_exact(const json_t *v, size_t flags);

/* The text json_dumps_exact writes for the double x into buf (at least 32 bytes). */
void json_real_text(double x, char *buf, size_t len);
