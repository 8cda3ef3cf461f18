/* The JSON Schema front end of structured output: a schema is checked against the subset llmq
 * supports and compiled into an immutable tree of nodes, which a value can be validated against.
 *
 * The subset (docs/STRUCTURED_OUTPUT.md, "Supported JSON Schema"): type (a name or a list of names:
 * object, array, string, number, integer, boolean, null); object properties, required and
 * additionalProperties false; array items, minItems, maxItems; string pattern and format (date,
 * date-time, email, uuid); number and integer minimum, maximum, exclusiveMinimum, exclusiveMaximum;
 * enum and const of any JSON value; anyOf; $ref to "#", "#/$defs/<name>" or "#/definitions/<name>"
 * (recursion allowed), with $defs/definitions at the root. Annotations (title, description,
 * examples, default, $schema, $id, $comment) are ignored. Anything else is refused with the keyword
 * and the JSON pointer of the schema that holds it, e.g.
 *   unsupported keyword 'patternProperties' at /properties/tags
 * (the root is written "/"). Nesting deeper than JS_MAX_DEPTH schemas is refused too.
 *
 * Validation follows JSON Schema 2020-12 for this subset: numbers compare by value (1 and 1.0 are
 * equal; 1.0 is an integer), formats are asserted, a keyword applies only to values of its type.
 *
 * Not yet used by jobs or the engine: this is the front end of the decoding-time grammar. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct json_t; /* jansson */
struct js_schema;

#define JS_MAX_DEPTH 32 /* most nested schemas below the root (through properties, items, anyOf, $defs) */

/* Compiles schema (a JSON object; boolean schemas are refused) into a tree the caller frees with
 * js_free. The schema is not kept: the tree owns copies of what it needs. Returns NULL with a
 * message in err (the keyword and its JSON pointer) when the schema uses anything outside the subset,
 * has a keyword with a malformed value, a $ref that does not resolve, a cycle of $ref/anyOf that
 * reads no input (it could never be validated or generated), minItems above maxItems or a required
 * property that additionalProperties false forbids (no value could conform), or nests deeper than
 * JS_MAX_DEPTH; or when memory runs out. */
struct js_schema *js_compile(const struct json_t *schema, char *err, size_t errlen);
/* Frees s and every node in it; NULL is harmless. */
void js_free(struct js_schema *s);
/* A stable 64-bit hash (FNV-1a) of the schema's canonical text (keys sorted, compact, ASCII), so two
 * schemas that differ only in key order or whitespace hash alike (1 and 1.0 are different texts).
 * Any JSON value is accepted; NULL
 * hashes as the text "null". Meant as the key of a compile cache (compare the schemas on a hit). */
uint64_t js_hash(const struct json_t *schema);
/* Validates value against s. Returns 0 when it conforms, or -1 with err naming the JSON pointer of the
 * first violation found in the value (depth first, properties in schema order) and what is wrong, e.g.
 *   /tags/2: expected type string
 * Never changes s; several threads may validate against one schema at once. */
int js_validate(const struct js_schema *s, const struct json_t *value, char *err, size_t errlen);
