/* Names of JSON value types for error messages ("must be a string, got an array"). */
#pragma once

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real number", "a boolean" or "null"; a
 * static string. */
const char *jtype_name(const json_t *v);
