/* JSON paths for `llmq results --columns`: the subset of SQLite's json_extract paths that names one
 * value, so a column reads the same as json_extract(output_json, path) in SQL.
 *
 *   $            the whole value
 *   .name        a member (name: one or more characters other than '.', '[', ',', '"' and space)
 *   ."any name"  a member whose name has those (\" and \\ escape a quote and a backslash)
 *   [N]          array element N (0-based, N >= 0)
 *
 * e.g. $.title, $.entities[0].name, $."first name". */
#pragma once
#include <stddef.h>

struct json_t; /* jansson */
struct json_path;

/* Parses text[0..len). Returns the path (free with json_path_free), or NULL with err naming what is
 * wrong and at which byte offset, e.g. "expected a member name after '.' at offset 2". */
struct json_path *json_path_parse(const char *text, size_t len, char *err, size_t errlen);
void json_path_free(struct json_path *p);
/* The value at p in v (borrowed from v), or NULL when v lacks it (or v is NULL). */
struct json_t *json_path_get(const struct json_path *p, struct json_t *v);
