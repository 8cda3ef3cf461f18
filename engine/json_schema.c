/* JSON Schema subset: compile into a node tree, validate values against it (engine/json_schema.h). */
#include "engine/json_schema.h"
#include "engine/json_schema_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct js_def {
    const char *prefix; /* "$defs" or "definitions" */
    const char *name;
    const json_t *json;
    struct js_node *node;
};

struct ctx {
    struct js_schema *s;
    struct js_def *defs;
    size_t n_defs;
    char *err;
    size_t errlen;
};

/* ---- compile ---- */

static struct js_node *node_new(struct ctx *c)
{
    struct js_schema *s = c->s;
    if (s->n_nodes == s->cap_nodes) {
        size_t cap = s->cap_nodes ? 2 * s->cap_nodes : 16;
        struct js_node **n = realloc(s->nodes, cap * sizeof *n);
        if (!n)
            return NULL;
        s->nodes = n;
        s->cap_nodes = cap;
    }
    struct js_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->types = JS_T_ANY;
    n->max_items = SIZE_MAX;
    s->nodes[s->n_nodes++] = n;
    return n;
}

static bool is_annotation(const char *k)
{
    static const char *const names[] = {"title",   "description", "examples", "default",
                                        "$schema", "$id",         "$comment"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(k, names[i]))
            return true;
    return false;
}

static unsigned type_bit(const char *name)
{
    static const struct {
        const char *name;
        unsigned bit;
    } types[] = {{"object", JS_T_OBJECT}, {"array", JS_T_ARRAY},     {"string", JS_T_STRING},
                 {"number", JS_T_NUMBER}, {"integer", JS_T_INTEGER}, {"boolean", JS_T_BOOLEAN},
                 {"null", JS_T_NULL}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcmp(name, types[i].name))
            return types[i].bit;
    return 0;
}

static int bad_value(struct ctx *c, const char *key, const struct ptr *p, const char *why)
{
    fail(c->err, c->errlen, "bad value of '%s' at %s: %s", key, ptr_str(p), why);
    return -1;
}

static int compile_node(struct ctx *c, struct js_node *n, const json_t *j, struct ptr *p, int depth);

/* Compiles the subschema j (at pointer p, depth schemas below the root) into a new node *out. */
static int compile_child(struct ctx *c, struct js_node **out, const json_t *j, struct ptr *p, int depth)
{
    if (depth > JS_MAX_DEPTH) {
        fail(c->err, c->errlen, "schema nested deeper than %d levels at %s", JS_MAX_DEPTH, ptr_str(p));
        return -1;
    }
    struct js_node *n = node_new(c);
    if (!n) {
        fail(c->err, c->errlen, "out of memory");
        return -1;
    }
    *out = n;
    return compile_node(c, n, j, p, depth);
}

static int get_count(struct ctx *c, const json_t *v, const char *key, const struct ptr *p, size_t *out)
{
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (!json_is_number(v) || d < 0 || d != floor(d) || d > 1e15)
        return bad_value(c, key, p, "expected a non-negative integer");
    *out = (size_t)d;
    return 0;
}

static int compile_bound(struct ctx *c, json_t **b, const json_t *v, const char *key, const struct ptr *p)
{
    if (!json_is_number(v))
        return bad_value(c, key, p, "expected a number");
    *b = json_deep_copy(v);
    return *b ? 0 : bad_value(c, key, p, "out of memory");
}

static int compile_ref(struct ctx *c, struct js_node *n, const char *ref, const struct ptr *p)
{
    if (!strcmp(ref, "#")) {
        n->ref = c->s->root;
        return 0;
    }
    for (size_t i = 0; i < c->n_defs; i++) {
        struct js_def *d = &c->defs[i];
        size_t pl = strlen(d->prefix);
        if (strncmp(ref, "#/", 2) || strncmp(ref + 2, d->prefix, pl) || ref[2 + pl] != '/')
            continue;
        /* the rest is one pointer token: compare with the name's escaped form */
        struct ptr want = {.len = 0};
        ptr_push(&want, d->name);
        if (!strcmp(ref + 2 + pl, want.buf)) {
            n->ref = d->node;
            return 0;
        }
    }
    if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14) || !strcmp(ref, "#/$defs") ||
        !strcmp(ref, "#/definitions"))
        fail(c->err, c->errlen, "unresolved $ref '%s' at %s", ref, ptr_str(p));
    else
        fail(c->err, c->errlen, "unsupported $ref '%s' at %s (only #, #/$defs/<name>, #/definitions/<name>)",
             ref, ptr_str(p));
    return -1;
}

static int compile_format(struct ctx *c, struct js_node *n, const json_t *v, const struct ptr *p)
{
    static const struct {
        const char *name;
        enum js_format f;
    } formats[] = {{"date", JS_FMT_DATE},
                   {"date-time", JS_FMT_DATE_TIME},
                   {"email", JS_FMT_EMAIL},
                   {"uuid", JS_FMT_UUID}};
    if (!json_is_string(v))
        return bad_value(c, "format", p, "expected a string");
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (!strcmp(json_string_value(v), formats[i].name)) {
            n->format = formats[i].f;
            return 0;
        }
    fail(c->err, c->errlen, "unsupported format '%s' at %s", json_string_value(v), ptr_str(p));
    return -1;
}

static int compile_pattern(struct ctx *c, struct js_node *n, const json_t *v, const struct ptr *p)
{
    if (!json_is_string(v))
        return bad_value(c, "pattern", p, "expected a string");
    int code;
    PCRE2_SIZE off;
    n->re = pcre2_compile((PCRE2_SPTR)json_string_value(v), json_string_length(v),
                          PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &code, &off, NULL);
    if (!n->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char why[256];
        snprintf(why, sizeof why, "%s at offset %zu", (const char *)msg, (size_t)off);
        return bad_value(c, "pattern", p, why);
    }
    n->pattern = strdup(json_string_value(v));
    return n->pattern ? 0 : bad_value(c, "pattern", p, "out of memory");
}

static int compile_object_keys(struct ctx *c, struct js_node *n, const json_t *j, struct ptr *p, int depth)
{
    const json_t *v = json_object_get(j, "properties");
    if (v) {
        if (!json_is_object(v))
            return bad_value(c, "properties", p, "expected an object");
        n->props = calloc(json_object_size(v) + 1, sizeof *n->props);
        if (!n->props)
            return bad_value(c, "properties", p, "out of memory");
        const char *k;
        json_t *sub;
        size_t o1 = ptr_push(p, "properties");
        json_object_foreach((json_t *)v, k, sub)
        {
            struct js_prop *pr = &n->props[n->n_props++];
            size_t o2 = ptr_push(p, k);
            pr->name = strdup(k);
            if (!pr->name || compile_child(c, &pr->node, sub, p, depth + 1))
                return pr->name ? -1 : bad_value(c, "properties", p, "out of memory");
            ptr_pop(p, o2);
        }
        ptr_pop(p, o1);
    }
    v = json_object_get(j, "required");
    if (v) {
        if (!json_is_array(v))
            return bad_value(c, "required", p, "expected an array of strings");
        n->required = calloc(json_array_size(v) + 1, sizeof *n->required);
        if (!n->required)
            return bad_value(c, "required", p, "out of memory");
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *s = json_array_get(v, i);
            if (!json_is_string(s))
                return bad_value(c, "required", p, "expected an array of strings");
            if (!(n->required[n->n_required++] = strdup(json_string_value(s))))
                return bad_value(c, "required", p, "out of memory");
        }
    }
    v = json_object_get(j, "additionalProperties");
    if (v) {
        if (!json_is_false(v)) {
            fail(c->err, c->errlen,
                 "unsupported keyword 'additionalProperties' at %s (only false is supported)", ptr_str(p));
            return -1;
        }
        n->closed = true;
        for (size_t i = 0; i < n->n_required; i++) {
            bool known = false;
            for (size_t k = 0; !known && k < n->n_props; k++)
                known = !strcmp(n->required[i], n->props[k].name);
            if (!known) /* no object could have it: the schema admits no object at all */
                return bad_value(c, "required", p,
                                 "names a property that additionalProperties false forbids");
        }
    }
    return 0;
}

static int compile_node(struct ctx *c, struct js_node *n, const json_t *j, struct ptr *p, int depth)
{
    if (!(n->at = strdup(ptr_str(p)))) {
        fail(c->err, c->errlen, "out of memory");
        return -1;
    }
    if (!json_is_object(j)) {
        fail(c->err, c->errlen, "schema at %s is not an object", ptr_str(p));
        return -1;
    }
    static const char *const known[] = {"type",
                                        "enum",
                                        "const",
                                        "anyOf",
                                        "$ref",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "items",
                                        "minItems",
                                        "maxItems",
                                        "pattern",
                                        "format",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "$defs",
                                        "definitions"};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v)
    {
        bool ok = is_annotation(k);
        for (size_t i = 0; !ok && i < sizeof known / sizeof *known; i++)
            ok = !strcmp(k, known[i]);
        if (!ok) {
            fail(c->err, c->errlen, "unsupported keyword '%s' at %s", k, ptr_str(p));
            return -1;
        }
        if ((!strcmp(k, "$defs") || !strcmp(k, "definitions")) && depth != 0) {
            fail(c->err, c->errlen, "unsupported keyword '%s' at %s (only at the root)", k, ptr_str(p));
            return -1;
        }
    }
    if ((v = json_object_get(j, "$ref"))) {
        json_object_foreach((json_t *)j, k, v)
        {
            if (strcmp(k, "$ref") && strcmp(k, "$defs") && strcmp(k, "definitions") && !is_annotation(k)) {
                fail(c->err, c->errlen, "unsupported keyword '%s' beside '$ref' at %s", k, ptr_str(p));
                return -1;
            }
        }
        v = json_object_get(j, "$ref");
        if (!json_is_string(v))
            return bad_value(c, "$ref", p, "expected a string");
        return compile_ref(c, n, json_string_value(v), p);
    }
    if ((v = json_object_get(j, "type"))) {
        n->types = 0;
        if (json_is_string(v)) {
            n->types = type_bit(json_string_value(v));
            if (!n->types) {
                fail(c->err, c->errlen, "unsupported type '%s' at %s", json_string_value(v), ptr_str(p));
                return -1;
            }
        } else if (json_is_array(v) && json_array_size(v) > 0) {
            for (size_t i = 0; i < json_array_size(v); i++) {
                const json_t *t = json_array_get(v, i);
                unsigned b = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
                if (!b) {
                    fail(c->err, c->errlen, "unsupported type '%s' at %s",
                         json_is_string(t) ? json_string_value(t) : "?", ptr_str(p));
                    return -1;
                }
                n->types |= b;
            }
        } else {
            return bad_value(c, "type", p, "expected a type name or a non-empty array of them");
        }
        if (n->types & JS_T_NUMBER)
            n->types |= JS_T_INTEGER;
    }
    if ((v = json_object_get(j, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v))
            return bad_value(c, "enum", p, "expected a non-empty array");
        if (!(n->enumv = json_deep_copy(v)))
            return bad_value(c, "enum", p, "out of memory");
    }
    if ((v = json_object_get(j, "const")) && !(n->constv = json_deep_copy(v)))
        return bad_value(c, "const", p, "out of memory");
    if ((v = json_object_get(j, "anyOf"))) {
        if (!json_is_array(v) || !json_array_size(v))
            return bad_value(c, "anyOf", p, "expected a non-empty array of schemas");
        n->any = calloc(json_array_size(v), sizeof *n->any);
        if (!n->any)
            return bad_value(c, "anyOf", p, "out of memory");
        size_t o1 = ptr_push(p, "anyOf");
        for (size_t i = 0; i < json_array_size(v); i++) {
            size_t o2 = ptr_push_index(p, i);
            if (compile_child(c, &n->any[n->n_any++], json_array_get(v, i), p, depth + 1))
                return -1;
            ptr_pop(p, o2);
        }
        ptr_pop(p, o1);
    }
    if (compile_object_keys(c, n, j, p, depth))
        return -1;
    if ((v = json_object_get(j, "items"))) {
        size_t o = ptr_push(p, "items");
        if (compile_child(c, &n->items, v, p, depth + 1))
            return -1;
        ptr_pop(p, o);
    }
    if ((v = json_object_get(j, "minItems")) && get_count(c, v, "minItems", p, &n->min_items))
        return -1;
    if ((v = json_object_get(j, "maxItems")) && get_count(c, v, "maxItems", p, &n->max_items))
        return -1;
    if (n->min_items > n->max_items)
        return bad_value(c, "minItems", p, "greater than maxItems (no array could conform)");
    if ((v = json_object_get(j, "pattern")) && compile_pattern(c, n, v, p))
        return -1;
    if ((v = json_object_get(j, "format")) && compile_format(c, n, v, p))
        return -1;
    if ((v = json_object_get(j, "minimum")) && compile_bound(c, &n->min, v, "minimum", p))
        return -1;
    if ((v = json_object_get(j, "exclusiveMinimum")) && compile_bound(c, &n->xmin, v, "exclusiveMinimum", p))
        return -1;
    if ((v = json_object_get(j, "maximum")) && compile_bound(c, &n->max, v, "maximum", p))
        return -1;
    if ((v = json_object_get(j, "exclusiveMaximum")) && compile_bound(c, &n->xmax, v, "exclusiveMaximum", p))
        return -1;
    return 0;
}

/* Finds a cycle through $ref and anyOf edges alone (a schema that refers to itself without reading a
 * value deeper), which no value could ever settle. Returns the $ref node that closes the cycle, or
 * NULL. Colours: 0 unseen, 1 on the path, 2 done. */
static const struct js_node *empty_cycle(struct js_node *n)
{
    if (n->mark)
        return NULL;
    n->mark = 1;
    if (n->ref) {
        if (n->ref->mark == 1)
            return n;
        const struct js_node *r = empty_cycle(n->ref);
        if (r)
            return r;
    }
    for (size_t i = 0; i < n->n_any; i++) {
        if (n->any[i]->mark == 1)
            return n->any[i]; /* unreachable: anyOf branches are fresh nodes, only $ref closes a loop */
        const struct js_node *r = empty_cycle(n->any[i]);
        if (r)
            return r;
    }
    n->mark = 2;
    return NULL;
}

static int collect_defs(struct ctx *c, const json_t *schema, const char *prefix)
{
    const json_t *defs = json_object_get(schema, prefix);
    if (!defs)
        return 0;
    struct ptr p = {.len = 0};
    if (!json_is_object(defs))
        return bad_value(c, prefix, &p, "expected an object of schemas");
    struct js_def *d = realloc(c->defs, (c->n_defs + json_object_size(defs) + 1) * sizeof *d);
    if (!d)
        return bad_value(c, prefix, &p, "out of memory");
    c->defs = d;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)defs, k, v)
    {
        struct js_node *n = node_new(c);
        if (!n)
            return bad_value(c, prefix, &p, "out of memory");
        c->defs[c->n_defs++] = (struct js_def){.prefix = prefix, .name = k, .json = v, .node = n};
    }
    return 0;
}

struct js_schema *js_compile(const json_t *schema, char *err, size_t errlen)
{
    struct js_schema *s = calloc(1, sizeof *s);
    struct ctx c = {.s = s, .err = err, .errlen = errlen};
    struct ptr p = {.len = 0};
    if (!s) {
        fail(err, errlen, "out of memory");
        return NULL;
    }
    if (!json_is_object(schema)) {
        fail(err, errlen, "schema at / is not an object");
        goto bad;
    }
    if (!(s->root = node_new(&c))) {
        fail(err, errlen, "out of memory");
        goto bad;
    }
    if (collect_defs(&c, schema, "$defs") || collect_defs(&c, schema, "definitions"))
        goto bad;
    for (size_t i = 0; i < c.n_defs; i++) {
        size_t o1 = ptr_push(&p, c.defs[i].prefix);
        size_t o2 = ptr_push(&p, c.defs[i].name);
        if (compile_node(&c, c.defs[i].node, c.defs[i].json, &p, 1))
            goto bad;
        ptr_pop(&p, o2);
        ptr_pop(&p, o1);
    }
    if (compile_node(&c, s->root, schema, &p, 0))
        goto bad;
    for (size_t i = 0; i < s->n_nodes; i++) {
        const struct js_node *r = empty_cycle(s->nodes[i]);
        if (r) {
            fail(err, errlen, "$ref cycle that reads no value (through $ref and anyOf only) at %s", r->at);
            goto bad;
        }
    }
    free(c.defs);
    return s;
bad:
    free(c.defs);
    js_free(s);
    return NULL;
}

void js_free(struct js_schema *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_nodes; i++) {
        struct js_node *n = s->nodes[i];
        json_decref(n->enumv);
        json_decref(n->constv);
        free(n->any);
        for (size_t k = 0; k < n->n_props; k++)
            free(n->props[k].name);
        free(n->props);
        for (size_t k = 0; k < n->n_required; k++)
            free(n->required[k]);
        free(n->required);
        free(n->pattern);
        free(n->at);
        pcre2_code_free(n->re);
        json_decref(n->min);
        json_decref(n->xmin);
        json_decref(n->max);
        json_decref(n->xmax);
        free(n);
    }
    free(s->nodes);
    free(s);
}

uint64_t js_hash(const json_t *schema)
{
    uint64_t h = 0xcbf29ce484222325ull;
    char *text = schema
                     ? json_dumps(schema, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENSURE_ASCII | JSON_ENCODE_ANY)
                     : NULL;
    const char *t = text ? text : "null";
    for (const unsigned char *c = (const unsigned char *)t; *c; c++) {
        h ^= *c;
        h *= 0x100000001b3ull;
    }
    free(text);
    return h;
}
