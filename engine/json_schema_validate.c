/* Validating a JSON value against a compiled schema (engine/json_schema.h, js_validate). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/json_schema.h"
#include "engine/json_schema_int.h"

/* Most backtracking steps one pattern search may take: a pathological pattern fails the value instead
 * of stalling the caller. */
#define JS_PATTERN_MATCH_LIMIT 1000000

static bool is_integral(const json_t *v)
{
    if (json_is_integer(v))
        return true;
    double d = json_is_real(v) ? json_real_value(v) : NAN;
    return isfinite(d) && d == floor(d);
}

static double num(const json_t *v)
{
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

/* <0, 0, >0 as a is below, equal to, above b (both numbers). */
static int num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return (x > y) - (x < y);
    }
    double x = num(a), y = num(b);
    return (x > y) - (x < y);
}

/* JSON Schema equality: numbers by value (1 equals 1.0), objects regardless of key order. */
static bool js_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return num_cmp(a, b) == 0;
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!js_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v)
        {
            const json_t *w = json_object_get(b, k);
            if (!w || !js_equal(v, w))
                return false;
        }
        return true;
    }
    default:
        return true; /* true, false, null: the type is the value */
    }
}

static unsigned type_bits(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return JS_T_OBJECT;
    case JSON_ARRAY:
        return JS_T_ARRAY;
    case JSON_STRING:
        return JS_T_STRING;
    case JSON_INTEGER:
    case JSON_REAL:
        return is_integral(v) ? JS_T_NUMBER | JS_T_INTEGER : JS_T_NUMBER;
    case JSON_TRUE:
    case JSON_FALSE:
        return JS_T_BOOLEAN;
    default:
        return JS_T_NULL;
    }
}

static void type_names(unsigned types, char *out, size_t len)
{
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < 7; i++) {
        if (!(types & (1u << i)) || (i == 4 && (types & JS_T_NUMBER)))
            continue;
        n += (size_t)snprintf(out + n, n < len ? len - n : 0, "%s%s", n ? " or " : "", names[i]);
        if (n >= len)
            return;
    }
}

static bool digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static int two(const char *s)
{
    return (s[0] - '0') * 10 + (s[1] - '0');
}

/* YYYY-MM-DD with a day that exists in that month. */
static bool is_date(const char *s, size_t len)
{
    if (len != 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2))
        return false;
    int y = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + two(s + 2), m = two(s + 5), d = two(s + 8);
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12 || d < 1)
        return false;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= days[m - 1] + (m == 2 && leap);
}

/* RFC 3339 date-time: date, T, hh:mm:ss, optional fraction, Z or +hh:mm / -hh:mm (T and Z in either case). */
static bool is_date_time(const char *s, size_t len)
{
    if (len < 20 || !is_date(s, 10) || (s[10] != 'T' && s[10] != 't'))
        return false;
    const char *t = s + 11, *end = s + len;
    if (!digits(t, 2) || t[2] != ':' || !digits(t + 3, 2) || t[5] != ':' || !digits(t + 6, 2))
        return false;
    if (two(t) > 23 || two(t + 3) > 59 || two(t + 6) > 60)
        return false;
    t += 8;
    if (t < end && *t == '.') {
        const char *f = ++t;
        while (t < end && *t >= '0' && *t <= '9')
            t++;
        if (t == f)
            return false;
    }
    if (end - t == 1)
        return *t == 'Z' || *t == 'z';
    return end - t == 6 && (*t == '+' || *t == '-') && digits(t + 1, 2) && t[3] == ':' && digits(t + 4, 2) &&
           two(t + 1) <= 23 && two(t + 4) <= 59;
}

/* One '@' with something on both sides and no whitespace or control characters. */
static bool is_email(const char *s, size_t len)
{
    const char *at = memchr(s, '@', len);
    if (!at || at == s || at == s + len - 1 || memchr(at + 1, '@', (size_t)(s + len - at - 1)))
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f)
            return false;
    return true;
}

/* 8-4-4-4-12 hexadecimal digits, either case. */
static bool is_uuid(const char *s, size_t len)
{
    if (len != 36)
        return false;
    for (size_t i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        char c = s[i];
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (dash ? c != '-' : !hex)
            return false;
    }
    return true;
}

struct vctx {
    char *err;
    size_t errlen;
    struct ptr p;
};

static int violation(struct vctx *c, const char *fmt, const char *what)
{
    char why[512];
    snprintf(why, sizeof why, fmt, what);
    fail(c->err, c->errlen, "%s: %s", ptr_str(&c->p), why);
    return -1;
}

static int check(struct vctx *c, const struct js_node *n, const json_t *v);

static int check_string(struct vctx *c, const struct js_node *n, const json_t *v)
{
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    static const char *const fmt_names[] = {"", "date", "date-time", "email", "uuid"};
    bool ok = true;
    switch (n->format) {
    case JS_FMT_NONE:
        break;
    case JS_FMT_DATE:
        ok = is_date(s, len);
        break;
    case JS_FMT_DATE_TIME:
        ok = is_date_time(s, len);
        break;
    case JS_FMT_EMAIL:
        ok = is_email(s, len);
        break;
    case JS_FMT_UUID:
        ok = is_uuid(s, len);
        break;
    }
    if (!ok)
        return violation(c, "not a valid %s", fmt_names[n->format]);
    if (n->re) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(n->re, NULL);
        pcre2_match_context *mc = pcre2_match_context_create(NULL);
        int rc = PCRE2_ERROR_NOMEMORY;
        if (md && mc) {
            pcre2_set_match_limit(mc, JS_PATTERN_MATCH_LIMIT);
            rc = pcre2_match(n->re, (PCRE2_SPTR)s, len, 0, 0, md, mc);
        }
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        if (rc == PCRE2_ERROR_MATCHLIMIT)
            return violation(c, "pattern '%s' too costly to check", n->pattern);
        if (rc == PCRE2_ERROR_NOMEMORY)
            return violation(c, "%s", "out of memory");
        if (rc < 0)
            return violation(c, "does not match pattern '%s'", n->pattern);
    }
    return 0;
}

static int check_number(struct vctx *c, const struct js_node *n, const json_t *v)
{
    char b[64];
    if (n->min && num_cmp(v, n->min) < 0)
        return snprintf(b, sizeof b, "%.17g", num(n->min)), violation(c, "less than minimum %s", b);
    if (n->xmin && num_cmp(v, n->xmin) <= 0)
        return snprintf(b, sizeof b, "%.17g", num(n->xmin)),
               violation(c, "not greater than exclusiveMinimum %s", b);
    if (n->max && num_cmp(v, n->max) > 0)
        return snprintf(b, sizeof b, "%.17g", num(n->max)), violation(c, "greater than maximum %s", b);
    if (n->xmax && num_cmp(v, n->xmax) >= 0)
        return snprintf(b, sizeof b, "%.17g", num(n->xmax)),
               violation(c, "not less than exclusiveMaximum %s", b);
    return 0;
}

static int check_object(struct vctx *c, const struct js_node *n, const json_t *v)
{
    for (size_t i = 0; i < n->n_required; i++)
        if (!json_object_get(v, n->required[i]))
            return violation(c, "missing required property '%s'", n->required[i]);
    for (size_t i = 0; i < n->n_props; i++) {
        const json_t *pv = json_object_get(v, n->props[i].name);
        if (!pv)
            continue;
        size_t o = ptr_push(&c->p, n->props[i].name);
        if (check(c, n->props[i].node, pv))
            return -1;
        ptr_pop(&c->p, o);
    }
    if (n->closed) {
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv)
        {
            bool known = false;
            for (size_t i = 0; !known && i < n->n_props; i++)
                known = !strcmp(k, n->props[i].name);
            if (!known) {
                ptr_push(&c->p, k);
                return violation(c, "%s", "property not allowed (additionalProperties false)");
            }
        }
    }
    return 0;
}

static int check_array(struct vctx *c, const struct js_node *n, const json_t *v)
{
    char b[32];
    size_t len = json_array_size(v);
    if (len < n->min_items)
        return snprintf(b, sizeof b, "%zu", n->min_items), violation(c, "fewer items than minItems %s", b);
    if (len > n->max_items)
        return snprintf(b, sizeof b, "%zu", n->max_items), violation(c, "more items than maxItems %s", b);
    for (size_t i = 0; n->items && i < len; i++) {
        size_t o = ptr_push_index(&c->p, i);
        if (check(c, n->items, json_array_get(v, i)))
            return -1;
        ptr_pop(&c->p, o);
    }
    return 0;
}

static int check(struct vctx *c, const struct js_node *n, const json_t *v)
{
    if (n->ref)
        return check(c, n->ref, v);
    unsigned t = type_bits(v);
    if (!(t & n->types)) {
        char names[128];
        type_names(n->types, names, sizeof names);
        return violation(c, "expected type %s", names);
    }
    if (n->constv && !js_equal(v, n->constv))
        return violation(c, "%s", "not equal to const");
    if (n->enumv) {
        bool found = false;
        for (size_t i = 0; !found && i < json_array_size(n->enumv); i++)
            found = js_equal(v, json_array_get(n->enumv, i));
        if (!found)
            return violation(c, "%s", "not one of the enum values");
    }
    if (n->n_any) {
        bool found = false;
        for (size_t i = 0; !found && i < n->n_any; i++) {
            struct vctx sub = {.err = NULL, .errlen = 0, .p = c->p};
            found = check(&sub, n->any[i], v) == 0;
        }
        if (!found)
            return violation(c, "%s", "matches no anyOf branch");
    }
    if (t & JS_T_OBJECT)
        return check_object(c, n, v);
    if (t & JS_T_ARRAY)
        return check_array(c, n, v);
    if (t & JS_T_STRING)
        return check_string(c, n, v);
    if (t & JS_T_NUMBER)
        return check_number(c, n, v);
    return 0;
}

int js_validate(const struct js_schema *s, const json_t *value, char *err, size_t errlen)
{
    struct vctx c = {.err = err, .errlen = errlen, .p = {.len = 0}};
    c.p.buf[0] = '\0';
    if (!s || !value) {
        fail(err, errlen, "no schema or no value");
        return -1;
    }
    return check(&c, s->root, value);
}
