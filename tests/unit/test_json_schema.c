/* engine/json_schema: what js_compile accepts and refuses (exact messages with the keyword and its
 * JSON pointer), recursion through $defs and "#", the nesting limit, js_hash's independence from key
 * order, js_validate's messages on hand-made values, and js_validate against an independent
 * validator: tests/fixtures/json_schema/cases.jsonl holds python3-jsonschema's verdict on each
 * (schema, instance) pair (made by make_cases.py beside it), and every verdict must agree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/json_schema.h"
#include "testutil.h"

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j)
        fail_msg("bad test JSON %s: %s", text, je.text);
    return j;
}

static struct js_schema *compile_ok(const char *text)
{
    char err[256] = "";
    json_t *j = parse(text);
    struct js_schema *s = js_compile(j, err, sizeof err);
    json_decref(j);
    if (!s)
        fail_msg("refused %s: %s", text, err);
    return s;
}

static void expect_refused(const char *text, const char *want)
{
    char err[256] = "";
    json_t *j = parse(text);
    struct js_schema *s = js_compile(j, err, sizeof err);
    json_decref(j);
    if (s) {
        js_free(s);
        fail_msg("accepted %s (wanted: %s)", text, want);
    }
    assert_string_equal(err, want);
}

/* Validates value text against schema text: want NULL for valid, else the exact message. */
static void expect_validate(const char *schema, const char *value, const char *want)
{
    struct js_schema *s = compile_ok(schema);
    json_t *v = parse(value);
    char err[256] = "";
    int rc = js_validate(s, v, err, sizeof err);
    json_decref(v);
    js_free(s);
    if (!want) {
        if (rc)
            fail_msg("%s rejected under %s: %s", value, schema, err);
    } else {
        if (!rc)
            fail_msg("%s accepted under %s (wanted: %s)", value, schema, want);
        assert_string_equal(err, want);
    }
}

static void test_accepts_subset(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "{}",
        "{\"type\": \"string\", \"enum\": [\"a\", \"b\"], \"title\": \"t\", \"description\": \"d\"}",
        "{\"type\": [\"integer\", \"null\"], \"minimum\": 0, \"exclusiveMaximum\": 10.5}",
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}}, \"required\": [\"a\"],"
        " \"additionalProperties\": false}",
        "{\"type\": \"array\", \"items\": {\"type\": \"null\"}, \"minItems\": 0, \"maxItems\": 3}",
        "{\"type\": \"string\", \"pattern\": \"^[a-z]+$\", \"format\": \"date-time\"}",
        "{\"anyOf\": [{\"const\": 1}, {\"enum\": [[1], {\"a\": null}]}]}",
        "{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\", \"$id\": \"x\", \"$comment\": \"c\","
        " \"examples\": [1], \"default\": 1, \"type\": \"number\"}",
        "{\"$defs\": {\"a\": {\"type\": \"string\"}}, \"definitions\": {\"b\": {\"$ref\": \"#/$defs/a\"}},"
        " \"anyOf\": [{\"$ref\": \"#/definitions/b\"}, {\"items\": {\"$ref\": \"#\"}}]}",
        "{\"$defs\": {\"a/b~c\": {\"type\": \"string\"}}, \"$ref\": \"#/$defs/a~1b~0c\"}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        js_free(compile_ok(ok[i]));
    js_free(NULL);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused("{\"type\": \"object\", \"properties\": {\"tags\": {\"type\": \"object\", "
                   "\"patternProperties\": {}}}}",
                   "unsupported keyword 'patternProperties' at /properties/tags");
    expect_refused("{\"oneOf\": [{\"type\": \"string\"}]}", "unsupported keyword 'oneOf' at /");
    expect_refused("{\"anyOf\": [{\"type\": \"string\"}, {\"not\": {}}]}",
                   "unsupported keyword 'not' at /anyOf/1");
    expect_refused("{\"type\": \"array\", \"items\": {\"if\": {}, \"then\": {}}}",
                   "unsupported keyword 'if' at /items");
    expect_refused("{\"type\": \"string\", \"minLength\": 2}", "unsupported keyword 'minLength' at /");
    expect_refused("{\"type\": \"object\", \"additionalProperties\": true}",
                   "unsupported keyword 'additionalProperties' at / (only false is supported)");
    expect_refused(
        "{\"properties\": {\"a~b/c\": {\"additionalProperties\": {\"type\": \"string\"}}}}",
        "unsupported keyword 'additionalProperties' at /properties/a~0b~1c (only false is supported)");
    expect_refused("{\"type\": \"string\", \"format\": \"hostname\"}", "unsupported format 'hostname' at /");
    expect_refused("{\"type\": \"strin\"}", "unsupported type 'strin' at /");
    expect_refused(
        "{\"$ref\": \"https://example.com/s.json\"}",
        "unsupported $ref 'https://example.com/s.json' at / (only #, #/$defs/<name>, #/definitions/<name>)");
    expect_refused("{\"$defs\": {\"a\": {}}, \"items\": {\"$ref\": \"#/$defs/b\"}}",
                   "unresolved $ref '#/$defs/b' at /items");
    expect_refused(
        "{\"$defs\": {\"a\": {\"properties\": {\"x\": {}}}}, \"$ref\": \"#/$defs/a/properties/x\"}",
        "unresolved $ref '#/$defs/a/properties/x' at /");
    expect_refused("{\"$ref\": \"#/$defs/a\", \"type\": \"string\", \"$defs\": {\"a\": {}}}",
                   "unsupported keyword 'type' beside '$ref' at /");
    expect_refused("{\"$defs\": {\"a\": {\"$defs\": {}}}}",
                   "unsupported keyword '$defs' at /$defs/a (only at the root)");
    expect_refused("{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}",
                   "$ref cycle that reads no value (through $ref and anyOf only) at /anyOf/0");
    expect_refused("{\"$defs\": {\"a\": {\"anyOf\": [{\"$ref\": \"#/$defs/a\"}, {\"type\": \"null\"}]}}}",
                   "$ref cycle that reads no value (through $ref and anyOf only) at /$defs/a/anyOf/0");
    expect_refused("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"$ref\": \"#/$defs/a\"}}}",
                   "$ref cycle that reads no value (through $ref and anyOf only) at /$defs/b");
    expect_refused("{\"$defs\": {\"a\": {\"oneOf\": []}}, \"type\": \"string\"}",
                   "unsupported keyword 'oneOf' at /$defs/a");
    expect_refused("{\"type\": \"array\", \"minItems\": -1}",
                   "bad value of 'minItems' at /: expected a non-negative integer");
    expect_refused("{\"type\": \"array\", \"maxItems\": 1.5}",
                   "bad value of 'maxItems' at /: expected a non-negative integer");
    expect_refused("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}",
                   "bad value of 'minItems' at /: greater than maxItems (no array could conform)");
    expect_refused(
        "{\"properties\": {\"o\": {\"properties\": {\"a\": {}}, \"required\": [\"a\", \"b\"],"
        " \"additionalProperties\": false}}}",
        "bad value of 'required' at /properties/o: names a property that additionalProperties false forbids");
    expect_refused("{\"required\": \"a\"}", "bad value of 'required' at /: expected an array of strings");
    expect_refused("{\"enum\": []}", "bad value of 'enum' at /: expected a non-empty array");
    expect_refused("{\"minimum\": \"1\"}", "bad value of 'minimum' at /: expected a number");
    expect_refused("{\"items\": true}", "schema at /items is not an object");
    expect_refused("true", "schema at / is not an object");
    char err[256] = "";
    json_t *j = parse("{\"type\": \"string\", \"pattern\": \"a(\"}");
    assert_null(js_compile(j, err, sizeof err));
    json_decref(j);
    assert_non_null(strstr(err, "bad value of 'pattern' at /: "));
}

/* Builds {"items": {"items": ... {"type": "null"}}} with n levels of items below the root. */
static char *nested(int n)
{
    size_t cap = (size_t)n * 12 + 64;
    char *s = malloc(cap);
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "{\"items\": ");
    len += (size_t)snprintf(s + len, cap - len, "{\"type\": \"null\"}");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "}");
    return s;
}

static void test_depth_limit(void **state)
{
    (void)state;
    char *ok = nested(JS_MAX_DEPTH);
    js_free(compile_ok(ok));
    free(ok);
    char *deep = nested(JS_MAX_DEPTH + 1);
    char want[1024];
    int len = snprintf(want, sizeof want, "schema nested deeper than %d levels at ", JS_MAX_DEPTH);
    for (int i = 0; i <= JS_MAX_DEPTH; i++)
        len += snprintf(want + len, sizeof want - (size_t)len, "/items");
    expect_refused(deep, want);
    free(deep);
}

static void test_recursion(void **state)
{
    (void)state;
    const char *tree =
        "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"},"
        " \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}},"
        " \"required\": [\"v\"], \"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}";
    /* a value far deeper than the schema's nesting: recursion is through the node pointers */
    char value[8192];
    size_t len = 0;
    for (int i = 0; i < 200; i++)
        len += (size_t)snprintf(value + len, sizeof value - len, "{\"v\": %d, \"kids\": [", i);
    len += (size_t)snprintf(value + len, sizeof value - len, "{\"v\": 200}");
    for (int i = 0; i < 200; i++)
        len += (size_t)snprintf(value + len, sizeof value - len, "]}");
    expect_validate(tree, value, NULL);
    expect_validate(tree, "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": [{\"v\": \"x\"}]}]}",
                    "/kids/1/kids/0/v: expected type integer");
    expect_validate(tree, "{\"v\": 1, \"kids\": [{\"v\": 2, \"w\": 0}]}",
                    "/kids/0/w: property not allowed (additionalProperties false)");
    expect_validate("{\"type\": \"object\", \"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#\"}, "
                    "{\"type\": \"null\"}]}}}",
                    "{\"next\": {\"next\": {\"next\": 5}}}",
                    "/next: matches no anyOf branch" /* reported where the anyOf is */);
}

static void test_validate_messages(void **state)
{
    (void)state;
    const char *person =
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"},"
        " \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 3}},"
        " \"required\": [\"name\"]}";
    expect_validate(person, "{\"name\": \"a\", \"tags\": [\"x\"], \"other\": 1}", NULL);
    expect_validate(person, "{\"tags\": []}", "/: missing required property 'name'");
    expect_validate(person, "{\"name\": \"a\", \"tags\": [\"x\", \"y\", 3]}",
                    "/tags/2: expected type string");
    expect_validate(person, "{\"name\": \"a\", \"tags\": [\"1\", \"2\", \"3\", \"4\"]}",
                    "/tags: more items than maxItems 3");
    expect_validate(person, "[]", "/: expected type object");
    expect_validate("{\"type\": [\"string\", \"null\"]}", "1", "/: expected type string or null");
    expect_validate("{\"type\": \"array\", \"minItems\": 2}", "[1]", "/: fewer items than minItems 2");
    expect_validate("{\"type\": \"integer\", \"minimum\": 3}", "2", "/: less than minimum 3");
    expect_validate("{\"type\": \"number\", \"exclusiveMaximum\": 1.5}", "1.5",
                    "/: not less than exclusiveMaximum 1.5");
    expect_validate("{\"type\": \"integer\"}", "2.0", NULL);
    expect_validate("{\"enum\": [\"a\", 1]}", "1.0", NULL);
    expect_validate("{\"enum\": [\"a\", 1]}", "\"b\"", "/: not one of the enum values");
    expect_validate("{\"const\": null}", "0", "/: not equal to const");
    expect_validate("{\"properties\": {\"d\": {\"format\": \"date\"}}}", "{\"d\": \"2023-02-29\"}",
                    "/d: not a valid date");
    expect_validate("{\"format\": \"uuid\"}", "\"123e4567-e89b-12d3-a456-42661417400\"",
                    "/: not a valid uuid");
    expect_validate("{\"pattern\": \"^x+$\"}", "\"xy\"", "/: does not match pattern '^x+$'");
    /* ECMA-262 semantics where PCRE2 and Python differ: $ only at the very end, \d only ASCII digits */
    expect_validate("{\"pattern\": \"^x+$\"}", "\"xx\\n\"", "/: does not match pattern '^x+$'");
    expect_validate("{\"pattern\": \"^\\\\d$\"}", "\"\\u0663\"", "/: does not match pattern '^\\d$'");
    expect_validate("{\"pattern\": \"^\\\\d$\"}", "\"7\"", NULL);
    expect_validate("{\"pattern\": \"^(a+)+$\"}", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!\"",
                    "/: pattern '^(a+)+$' too costly to check");
    expect_validate("{\"properties\": {\"a/b\": {\"type\": \"null\"}}}", "{\"a/b\": 1}",
                    "/a~1b: expected type null");
}

static void test_hash(void **state)
{
    (void)state;
    json_t *a = parse("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\"}, \"y\": {}}}");
    json_t *b = parse("{\"properties\":{\"y\":{},\"x\":{\"type\":\"string\"}},\"type\":\"object\"}");
    json_t *c = parse("{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {}}}");
    assert_true(js_hash(a) == js_hash(b));
    assert_true(js_hash(a) != js_hash(c));
    assert_true(js_hash(a) == js_hash(a));
    /* FNV-1a 64 of {"properties":{"x":{"type":"string"}},"required":["x"],"type":"object"}, from Python */
    json_t *d = parse(
        "{\"type\": \"object\", \"required\": [\"x\"], \"properties\": {\"x\": {\"type\": \"string\"}}}");
    assert_true(js_hash(d) == 0x540ec1135a10b657ull);
    json_decref(d);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* Every (schema, instance) pair of cases.jsonl: js_validate's verdict is python3-jsonschema's. */
static void test_agrees_with_jsonschema(void **state)
{
    (void)state;
    const char *path = test_source("tests/fixtures/json_schema/cases.jsonl");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    char line[1 << 16];
    int n = 0, n_valid = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *c = parse(line);
        const char *name = json_string_value(json_object_get(c, "name"));
        char err[256] = "";
        struct js_schema *s = js_compile(json_object_get(c, "schema"), err, sizeof err);
        if (!s)
            fail_msg("case %s: refused: %s", name, err);
        bool want = json_is_true(json_object_get(c, "valid"));
        bool got = js_validate(s, json_object_get(c, "instance"), err, sizeof err) == 0;
        if (want != got) {
            char *inst = json_dumps(json_object_get(c, "instance"), JSON_ENCODE_ANY | JSON_COMPACT);
            print_error("case %s, instance %s: jsonschema says %s, js_validate %s (%s)\n", name, inst,
                        want ? "valid" : "invalid", got ? "valid" : "invalid", got ? "" : err);
            free(inst);
            bad++;
        }
        n++;
        n_valid += want;
        js_free(s);
        json_decref(c);
    }
    fclose(f);
    assert_int_equal(bad, 0);
    assert_true(n >= 100);
    assert_true(n_valid > 20 && n - n_valid > 20); /* both verdicts are well represented */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_subset),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_recursion),
        cmocka_unit_test(test_validate_messages),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_agrees_with_jsonschema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
