/* Compiling a JSON Schema (engine/json_schema.h) into a grammar (engine/grammar.h): one rule per schema
 * node, named by the node's JSON pointer and built once (so $ref recursion is a rule that refers to
 * itself), plus shared rules for any JSON value, strings, numbers and formats. What the sentences look
 * like, and where the grammar is tighter than the schema, is in docs/STRUCTURED_OUTPUT.md, "What the
 * grammar generates". A schema node the grammar cannot express exactly is refused, never loosened. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/json_schema.h"
#include "engine/json_schema_int.h"

#define GR_ANY_DEPTH 32                    /* most nested objects and arrays in any JSON value */
#define GR_MAX_ITEMS 1024                  /* largest maxItems (or minItems when unbounded) expanded */
#define GR_INT_DIGITS 18                   /* integers have at most this many digits */
#define GR_INT_CAP 999999999999999999LL    /* so |an integer| <= GR_INT_CAP */
#define GR_FRAC_DIGITS 15                  /* most digits after the decimal point */
#define GR_FRAC_INT_LIMIT 1000000000000000 /* a number with a fraction has |integer part| + 1 <= this */
#define GR_EXACT_DOUBLE 9007199254740992.0 /* 2^53: integers up to here are exact doubles */
#define GR_FAR_DOUBLE 2e18                 /* a real bound beyond this lies beyond every integer written */
/* Intervals an exclusive bound cuts are written within [-GR_EDGE, GR_EDGE], where 15 fraction digits
 * stay apart from the bound as doubles (the spacing of doubles below 16 is under 2e-15). */
#define GR_EDGE 10

struct sc {
    struct gr_builder *b;
    const struct js_schema *s;
    int32_t *memo; /* [s->n_nodes]: rule of each node, -1 before it is built */
    int32_t r_value[GR_ANY_DEPTH + 1], r_object[GR_ANY_DEPTH + 1], r_array[GR_ANY_DEPTH + 1];
    int32_t r_string, r_chars, r_number, r_frac;
    int32_t r_opt_digits[GR_INT_DIGITS + 1]; /* r_opt_digits[k]: 0 to k digits */
    bool refused;
    char err[1200];
};

/* Refuses the schema with a message (the first one wins) and stops the builder. */
__attribute__((format(printf, 2, 3))) static void refuse(struct sc *c, const char *fmt, ...)
{
    if (c->refused || c->b->failed)
        return;
    c->refused = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    grb_fail(c->b, "%s", c->err);
}

static void lit(struct sc *c, struct gr_seq *s, const char *text)
{
    grs_lit(c->b, s, text, strlen(text));
}

static struct gr_class class_of(const char *bytes)
{
    struct gr_class k = {{0}};
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++)
        k.bits[*p >> 5] |= 1u << (*p & 31);
    return k;
}

static void set(struct sc *c, struct gr_seq *s, const char *bytes)
{
    struct gr_class k = class_of(bytes);
    grs_class(c->b, s, &k);
}

static void digit(struct sc *c, struct gr_seq *s)
{
    grs_range(c->b, s, '0', '9');
}

/* A rule made once, found by name. */
static int32_t named(struct sc *c, const char *name, bool *fresh)
{
    for (int32_t i = 0; i < c->b->n_rules; i++)
        if (!strcmp(c->b->rules[i].name, name)) {
            *fresh = false;
            return i;
        }
    *fresh = true;
    return grb_rule(c->b, name);
}

/* ---- numbers ---- */

/* 0 to k decimal digits (a chain, so a matcher state holds one stack per digit read). */
static int32_t opt_digits(struct sc *c, int k)
{
    if (c->r_opt_digits[k] >= 0 || c->b->failed)
        return c->r_opt_digits[k];
    char name[32];
    snprintf(name, sizeof name, "digits0-%d", k);
    int32_t r = grb_rule(c->b, name);
    c->r_opt_digits[k] = r;
    struct gr_seq s = {0};
    grb_alt(c->b, r, &s);
    if (k > 0) {
        digit(c, &s);
        grs_rule(c->b, &s, opt_digits(c, k - 1));
        grb_alt(c->b, r, &s);
    }
    grs_free(&s);
    return r;
}

/* '.' and 1 to GR_FRAC_DIGITS digits. */
static int32_t fraction(struct sc *c)
{
    if (c->r_frac >= 0 || c->b->failed)
        return c->r_frac;
    int32_t r = c->r_frac = grb_rule(c->b, "fraction");
    struct gr_seq s = {0};
    grs_byte(c->b, &s, '.');
    digit(c, &s);
    grs_rule(c->b, &s, opt_digits(c, GR_FRAC_DIGITS - 1));
    grb_alt(c->b, r, &s);
    grs_free(&s);
    return r;
}

/* The digits of a numeral being built: one class per position. */
struct numeral {
    struct gr_class pos[GR_INT_DIGITS + 1];
    int n;
};

static void numeral_alt(struct sc *c, int32_t r, const char *prefix, const struct numeral *d, int32_t tail)
{
    struct gr_seq s = {0};
    lit(c, &s, prefix);
    for (int i = 0; i < d->n; i++)
        grs_class(c->b, &s, &d->pos[i]);
    if (tail >= 0)
        grs_rule(c->b, &s, tail);
    grb_alt(c->b, r, &s);
    grs_free(&s);
}

static void push_range(struct numeral *d, char lo, char hi)
{
    struct gr_class k = {{0}};
    for (unsigned x = (unsigned char)lo; x <= (unsigned char)hi; x++)
        k.bits[x >> 5] |= 1u << (x & 31);
    d->pos[d->n++] = k;
}

static bool all(const char *s, int n, char ch)
{
    for (int i = 0; i < n; i++)
        if (s[i] != ch)
            return false;
    return true;
}

/* Alternatives of r for the numerals of n digits from lo to hi (digit strings, lo <= hi), each after
 * d's digits: the usual split of a range into runs of the form a[b-c][0-9]*. */
static void same_length(struct sc *c, int32_t r, const char *prefix, struct numeral *d, const char *lo,
                        const char *hi, int n, int32_t tail)
{
    int at = d->n;
    if (n == 0) {
        numeral_alt(c, r, prefix, d, tail);
    } else if (all(lo + 1, n - 1, '0') && all(hi + 1, n - 1, '9')) {
        push_range(d, lo[0], hi[0]);
        for (int i = 1; i < n; i++)
            push_range(d, '0', '9');
        numeral_alt(c, r, prefix, d, tail);
    } else if (lo[0] == hi[0]) {
        push_range(d, lo[0], lo[0]);
        same_length(c, r, prefix, d, lo + 1, hi + 1, n - 1, tail);
    } else {
        char nines[GR_INT_DIGITS + 1], zeros[GR_INT_DIGITS + 1];
        memset(nines, '9', sizeof nines);
        memset(zeros, '0', sizeof zeros);
        /* lo[0] with the rest of lo and up, the first digits in between with anything, hi[0] with up to
         * the rest of hi; a first digit whose rest is a whole run joins the middle */
        char a = lo[0], z = hi[0];
        if (!all(lo + 1, n - 1, '0')) {
            push_range(d, lo[0], lo[0]);
            same_length(c, r, prefix, d, lo + 1, nines, n - 1, tail);
            d->n = at;
            a++;
        }
        bool hi_part = !all(hi + 1, n - 1, '9');
        if (hi_part)
            z--;
        if (a <= z) {
            push_range(d, a, z);
            for (int i = 1; i < n; i++)
                push_range(d, '0', '9');
            numeral_alt(c, r, prefix, d, tail);
            d->n = at;
        }
        if (hi_part) {
            push_range(d, hi[0], hi[0]);
            same_length(c, r, prefix, d, zeros, hi + 1, n - 1, tail);
        }
    }
    d->n = at;
}

static int n_digits(long long x)
{
    int n = 1;
    while (x >= 10)
        x /= 10, n++;
    return n;
}

static long long pow10ll(int n)
{
    long long p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* Alternatives of r for the decimal numerals (no leading zeros) of lo..hi (0 <= lo, hi <= GR_INT_CAP),
 * after prefix and followed by tail (a rule, or -1). Nothing when lo > hi. */
static void uint_range(struct sc *c, int32_t r, const char *prefix, long long lo, long long hi, int32_t tail)
{
    if (lo > hi)
        return;
    struct numeral d = {.n = 0};
    if (lo == 0) {
        push_range(&d, '0', '0');
        numeral_alt(c, r, prefix, &d, tail);
        d.n = 0;
        lo = 1;
        if (lo > hi)
            return;
    }
    int dl = n_digits(lo), dh = n_digits(hi);
    /* Whole digit counts in the middle (every numeral of that length) share one chain. */
    int full_from = lo == pow10ll(dl - 1) ? dl : dl + 1;
    int full_to = hi == pow10ll(dh) - 1 ? dh : dh - 1;
    for (int k = dl; k <= dh; k++) {
        if (k >= full_from && k <= full_to) {
            if (k == full_from) {
                struct gr_seq s = {0};
                lit(c, &s, prefix);
                grs_range(c->b, &s, '1', '9');
                for (int i = 1; i < full_from; i++)
                    digit(c, &s);
                if (full_to > full_from)
                    grs_rule(c->b, &s, opt_digits(c, full_to - full_from));
                if (tail >= 0)
                    grs_rule(c->b, &s, tail);
                grb_alt(c->b, r, &s);
                grs_free(&s);
            }
            continue;
        }
        long long a = lo > pow10ll(k - 1) ? lo : pow10ll(k - 1);
        long long z = hi < pow10ll(k) - 1 ? hi : pow10ll(k) - 1;
        char la[24], ha[24]; /* both have k digits */
        snprintf(la, sizeof la, "%lld", a);
        snprintf(ha, sizeof ha, "%lld", z);
        same_length(c, r, prefix, &d, la, ha, k, tail);
    }
}

/* Alternatives of r for the integers lo..hi (|each| <= GR_INT_CAP; "-0" never), each followed by tail. */
static void int_range(struct sc *c, int32_t r, long long lo, long long hi, int32_t tail)
{
    if (hi >= 0)
        uint_range(c, r, "", lo > 0 ? lo : 0, hi, tail);
    if (lo < 0)
        uint_range(c, r, "-", hi < 0 ? -hi : 1, -lo, tail);
}

static const char *const bound_names[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};

/* Narrows lo..hi to the integers that satisfy bound kind (0 minimum, 1 exclusiveMinimum, 2 maximum,
 * 3 exclusiveMaximum) of value v, as js_validate compares them; -1 (refused) when a real bound is too
 * large to be compared exactly with the integers written. */
static int narrow(struct sc *c, const struct js_node *n, int kind, const json_t *v, long long *lo,
                  long long *hi)
{
    long long far = GR_INT_CAP + 2, x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
        x = x > far ? far : x < -far ? -far : x;
        x += kind == 1 ? 1 : kind == 3 ? -1 : 0;
    } else {
        double d = json_real_value(v);
        if (d >= GR_FAR_DOUBLE)
            x = far + (kind == 1) - (kind == 3);
        else if (d <= -GR_FAR_DOUBLE)
            x = -far + (kind == 1) - (kind == 3);
        else if (fabs(d) > GR_EXACT_DOUBLE && (kind == 1 || kind == 3)) {
            refuse(c, "unsupported value of '%s' at %s: a real bound beyond 2^53 is not compared exactly",
                   bound_names[kind], n->at);
            return -1;
        } else if (kind == 0)
            x = (long long)ceil(d);
        else if (kind == 1)
            x = (long long)floor(d) + 1;
        else if (kind == 2)
            x = (long long)floor(d);
        else
            x = (long long)ceil(d) - 1;
    }
    if (kind < 2 && x > *lo)
        *lo = x;
    if (kind >= 2 && x < *hi)
        *hi = x;
    return 0;
}

/* The integers a number or integer of n may be written as (its bounds within +-GR_INT_CAP). */
static int int_bounds(struct sc *c, const struct js_node *n, long long *lo, long long *hi)
{
    const json_t *b[4] = {n->min, n->xmin, n->max, n->xmax};
    *lo = -GR_INT_CAP;
    *hi = GR_INT_CAP;
    for (int k = 0; k < 4; k++)
        if (b[k] && narrow(c, n, k, b[k], lo, hi) < 0)
            return -1;
    return 0;
}

static double bound_value(const json_t *v)
{
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

/* Whether x (a small integer, exact as a double) satisfies n's bounds. */
static bool satisfies(const struct js_node *n, double x)
{
    return (!n->min || x >= bound_value(n->min)) && (!n->xmin || x > bound_value(n->xmin)) &&
           (!n->max || x <= bound_value(n->max)) && (!n->xmax || x < bound_value(n->xmax));
}

/* Whether every number strictly between k and k + 1 satisfies n's bounds. */
static bool open_inside(const struct js_node *n, double k)
{
    const json_t *lower[2] = {n->min, n->xmin}, *upper[2] = {n->max, n->xmax};
    for (int i = 0; i < 2; i++)
        if ((lower[i] && k < bound_value(lower[i])) || (upper[i] && k + 1 > bound_value(upper[i])))
            return false;
    return true;
}

static void refuse_bounds(struct sc *c, const struct js_node *n)
{
    const json_t *b[4] = {n->min, n->xmin, n->max, n->xmax};
    char which[160] = "";
    size_t len = 0;
    for (int k = 0; k < 4; k++)
        if (b[k])
            len +=
                (size_t)snprintf(which + len, sizeof which - len, "%s'%s'", len ? ", " : "", bound_names[k]);
    refuse(c,
           "unsupported value of %s at %s: the grammar writes no number within these bounds (integers, and "
           "fractions where a whole interval between two integers lies within them)",
           which, n->at);
}

/* '.' and 1 to GR_FRAC_DIGITS digits, not all zero. */
static int32_t fraction_nonzero(struct sc *c)
{
    bool fresh;
    int32_t r = named(c, "fraction-nonzero", &fresh);
    if (!fresh)
        return r;
    /* nonzero_k: k digit places left, a non-zero digit still owed */
    int32_t prev = -1, cur = -1;
    char name[32];
    struct gr_seq s = {0};
    for (int k = 1; k <= GR_FRAC_DIGITS; k++) {
        snprintf(name, sizeof name, "nonzero-digits%d", k);
        cur = grb_rule(c->b, name);
        grs_range(c->b, &s, '1', '9');
        grs_rule(c->b, &s, opt_digits(c, k - 1));
        grb_alt(c->b, cur, &s);
        if (prev >= 0) {
            grs_byte(c->b, &s, '0');
            grs_rule(c->b, &s, prev);
            grb_alt(c->b, cur, &s);
        }
        prev = cur;
    }
    grs_byte(c->b, &s, '.');
    grs_rule(c->b, &s, cur);
    grb_alt(c->b, r, &s);
    grs_free(&s);
    return r;
}

/* Alternatives of r for numbers: the integers lo..hi, and when n is given, numbers with a fraction
 * whose closed interval [k, k+1] (or [-(k+1), -k]) lies within lo..hi, so that the value, even rounded
 * to a double, stays within the bounds. Near zero, where doubles are fine enough, also the intervals
 * an exclusive integer bound cuts: (0, 1) under exclusiveMinimum 0 is "0." and digits not all zero. */
static void number_alts(struct sc *c, int32_t r, long long lo, long long hi, const struct js_node *n)
{
    int_range(c, r, lo, hi, -1);
    if (!n)
        return;
    long long lim = GR_FRAC_INT_LIMIT - 1;
    long long a = lo > 0 ? lo : 0, z = hi - 1 < lim ? hi - 1 : lim;
    uint_range(c, r, "", a, z, fraction(c));
    a = hi < 0 ? -hi : 0;
    z = -lo - 1 < lim ? -lo - 1 : lim;
    uint_range(c, r, "-", a, z, fraction(c));
    for (int k = -GR_EDGE; k < GR_EDGE; k++) {
        bool lo_ok = satisfies(n, k), hi_ok = satisfies(n, k + 1);
        if ((lo_ok && hi_ok) || !open_inside(n, k))
            continue; /* written above, or not within the bounds */
        /* k.ddd is k up to (not reaching) k+1; -j.ddd is -j down to (not reaching) -(j+1) */
        char text[8];
        bool at_end_ok = k >= 0 ? lo_ok : hi_ok;
        snprintf(text, sizeof text, "%s%d", k >= 0 ? "" : "-", k >= 0 ? k : -(k + 1));
        struct gr_seq s = {0};
        lit(c, &s, text);
        grs_rule(c->b, &s, at_end_ok ? fraction(c) : fraction_nonzero(c));
        grb_alt(c->b, r, &s);
        grs_free(&s);
    }
}

/* The shared rule of any number (bounded as docs/STRUCTURED_OUTPUT.md says). */
static int32_t any_number(struct sc *c)
{
    if (c->r_number >= 0 || c->b->failed)
        return c->r_number;
    c->r_number = grb_rule(c->b, "number");
    static const struct js_node unbounded = {.types = JS_T_NUMBER};
    number_alts(c, c->r_number, -GR_INT_CAP, GR_INT_CAP, &unbounded);
    return c->r_number;
}

/* ---- strings ---- */

/* The content of a JSON string: raw UTF-8 characters other than '"', '\' and controls, and escapes
 * (\uXXXX only of a non-zero code point outside the surrogates). */
static int32_t string_chars(struct sc *c)
{
    if (c->r_chars >= 0 || c->b->failed)
        return c->r_chars;
    struct gr_builder *b = c->b;
    int32_t r = c->r_chars = grb_rule(b, "string-chars");
    struct gr_class ex = {{0}};
    ex.bits[0] = 0xffffffffu;
    ex.bits['"' >> 5] |= 1u << ('"' & 31);
    ex.bits['\\' >> 5] |= 1u << ('\\' & 31);
    int32_t ch = grb_utf8_char_except(b, &ex, "char");
    int32_t esc = grb_rule(b, "escape");
    struct gr_seq s = {0};
    grs_byte(b, &s, '\\');
    set(c, &s, "\"\\/bfnrt");
    grb_alt(b, esc, &s);
    static const char *const hex4[][4] = {
        {"123456789abcefABCEF", "0123456789abcdefABCDEF", "0123456789abcdefABCDEF", "0123456789abcdefABCDEF"},
        {"dD", "01234567", "0123456789abcdefABCDEF", "0123456789abcdefABCDEF"},
        {"0", "123456789abcdefABCDEF", "0123456789abcdefABCDEF", "0123456789abcdefABCDEF"},
        {"0", "0", "123456789abcdefABCDEF", "0123456789abcdefABCDEF"},
        {"0", "0", "0", "123456789abcdefABCDEF"},
    };
    for (size_t i = 0; i < sizeof hex4 / sizeof hex4[0]; i++) {
        lit(c, &s, "\\u");
        for (int k = 0; k < 4; k++)
            set(c, &s, hex4[i][k]);
        grb_alt(b, esc, &s);
    }
    grb_alt(b, r, &s);
    grs_rule(b, &s, ch);
    grs_rule(b, &s, r);
    grb_alt(b, r, &s);
    grs_rule(b, &s, esc);
    grs_rule(b, &s, r);
    grb_alt(b, r, &s);
    grs_free(&s);
    return r;
}

static int32_t any_string(struct sc *c)
{
    if (c->r_string >= 0 || c->b->failed)
        return c->r_string;
    int32_t r = c->r_string = grb_rule(c->b, "string");
    struct gr_seq s = {0};
    grs_byte(c->b, &s, '"');
    grs_rule(c->b, &s, string_chars(c));
    grs_byte(c->b, &s, '"');
    grb_alt(c->b, r, &s);
    grs_free(&s);
    return r;
}

/* Adds alternatives of text pairs: a rule that is "<a[0]><a[1]>" | ... for two-byte classes. */
static void two_alts(struct sc *c, int32_t r, const char *const (*pairs)[2], size_t n)
{
    struct gr_seq s = {0};
    for (size_t i = 0; i < n; i++) {
        set(c, &s, pairs[i][0]);
        set(c, &s, pairs[i][1]);
        grb_alt(c->b, r, &s);
    }
    grs_free(&s);
}

/* YYYY-MM-DD of a day that exists (leap years by the Gregorian rule, as js_validate). */
static int32_t date_rule(struct sc *c)
{
    bool fresh;
    int32_t r = named(c, "date", &fresh);
    if (!fresh)
        return r;
    struct gr_builder *b = c->b;
    const char *D = "0123456789";
    int32_t year = grb_rule(b, "year"), leap = grb_rule(b, "leap-year");
    int32_t d28 = grb_rule(b, "day28"), d30 = grb_rule(b, "day30"), d31 = grb_rule(b, "day31");
    int32_t m30 = grb_rule(b, "month30"), m31 = grb_rule(b, "month31");
    struct gr_seq s = {0};
    /* 0001 to 9999 (year 0 is valid to js_validate, not to every validator: left out) */
    for (int z = 0; z < 4; z++) {
        for (int i = 0; i < 4; i++)
            set(c, &s, i < z ? "0" : i == z ? "123456789" : D);
        grb_alt(b, year, &s);
    }
    /* divisible by 4 and not by 100, or by 400: two digits that are a non-zero multiple of 4, after
     * any two digits or before "00" */
    static const char *const mult4[][2] = {{"0", "48"}, {"2468", "048"}, {"13579", "26"}};
    for (int i = 0; i < 3; i++) {
        set(c, &s, D), set(c, &s, D), set(c, &s, mult4[i][0]), set(c, &s, mult4[i][1]);
        grb_alt(b, leap, &s);
        set(c, &s, mult4[i][0]), set(c, &s, mult4[i][1]), lit(c, &s, "00");
        grb_alt(b, leap, &s);
    }
    static const char *const d28p[][2] = {{"0", "123456789"}, {"1", "0123456789"}, {"2", "012345678"}};
    two_alts(c, d28, d28p, 3);
    grs_rule(b, &s, d28);
    grb_alt(b, d30, &s);
    static const char *const d30p[][2] = {{"2", "9"}, {"3", "0"}};
    two_alts(c, d30, d30p, 2);
    grs_rule(b, &s, d30);
    grb_alt(b, d31, &s);
    lit(c, &s, "31");
    grb_alt(b, d31, &s);
    static const char *const m30p[][2] = {{"0", "469"}, {"1", "1"}};
    static const char *const m31p[][2] = {{"0", "13578"}, {"1", "02"}};
    two_alts(c, m30, m30p, 2);
    two_alts(c, m31, m31p, 2);
    const int32_t months[] = {m31, m30};
    const int32_t days[] = {d31, d30};
    for (int i = 0; i < 2; i++) {
        grs_rule(b, &s, year), grs_byte(b, &s, '-'), grs_rule(b, &s, months[i]), grs_byte(b, &s, '-');
        grs_rule(b, &s, days[i]);
        grb_alt(b, r, &s);
    }
    grs_rule(b, &s, year), lit(c, &s, "-02-"), grs_rule(b, &s, d28);
    grb_alt(b, r, &s);
    grs_rule(b, &s, leap), lit(c, &s, "-02-29");
    grb_alt(b, r, &s);
    grs_free(&s);
    return r;
}

/* date 'T' hh:mm:ss, an optional fraction of 1 to 9 digits, 'Z' or +hh:mm / -hh:mm. */
static int32_t date_time_rule(struct sc *c)
{
    bool fresh;
    int32_t r = named(c, "date-time", &fresh);
    if (!fresh)
        return r;
    struct gr_builder *b = c->b;
    int32_t hh = grb_rule(b, "hour"), mm = grb_rule(b, "minute"), frac = grb_rule(b, "second-fraction");
    int32_t off = grb_rule(b, "offset");
    static const char *const hp[][2] = {{"01", "0123456789"}, {"2", "0123"}};
    static const char *const mp[][2] = {{"012345", "0123456789"}};
    two_alts(c, hh, hp, 2);
    two_alts(c, mm, mp, 1);
    struct gr_seq s = {0};
    grb_alt(b, frac, &s);
    grs_byte(b, &s, '.'), digit(c, &s), grs_rule(b, &s, opt_digits(c, 8));
    grb_alt(b, frac, &s);
    grs_byte(b, &s, 'Z');
    grb_alt(b, off, &s);
    set(c, &s, "+-"), grs_rule(b, &s, hh), grs_byte(b, &s, ':'), grs_rule(b, &s, mm);
    grb_alt(b, off, &s);
    grs_rule(b, &s, date_rule(c)), grs_byte(b, &s, 'T'), grs_rule(b, &s, hh), grs_byte(b, &s, ':');
    grs_rule(b, &s, mm), grs_byte(b, &s, ':'), grs_rule(b, &s, mm), grs_rule(b, &s, frac),
        grs_rule(b, &s, off);
    grb_alt(b, r, &s);
    grs_free(&s);
    return r;
}

/* One or more raw characters, then '@', then one or more: no whitespace, control, '@', '"' or '\'. */
static int32_t email_rule(struct sc *c)
{
    bool fresh;
    int32_t r = named(c, "email", &fresh);
    if (!fresh)
        return r;
    struct gr_builder *b = c->b;
    struct gr_class ex = class_of("\"\\@ \x7f");
    ex.bits[0] = 0xffffffffu;
    int32_t ch = grb_utf8_char_except(b, &ex, "email-char");
    int32_t part = grb_rule(b, "email-part");
    struct gr_seq s = {0};
    grs_rule(b, &s, ch), grs_rule(b, &s, part);
    grb_alt(b, part, &s);
    grs_rule(b, &s, ch);
    grb_alt(b, part, &s);
    grs_rule(b, &s, part), grs_byte(b, &s, '@'), grs_rule(b, &s, part);
    grb_alt(b, r, &s);
    grs_free(&s);
    return r;
}

/* 8-4-4-4-12 hexadecimal digits. */
static int32_t uuid_rule(struct sc *c)
{
    bool fresh;
    int32_t r = named(c, "uuid", &fresh);
    if (!fresh)
        return r;
    struct gr_seq s = {0};
    const int groups[] = {8, 4, 4, 4, 12};
    for (int g = 0; g < 5; g++) {
        if (g)
            grs_byte(c->b, &s, '-');
        for (int i = 0; i < groups[g]; i++)
            set(c, &s, "0123456789abcdefABCDEF");
    }
    grb_alt(c->b, r, &s);
    grs_free(&s);
    return r;
}

static void string_alts(struct sc *c, int32_t r, const struct js_node *n)
{
    int32_t body = -1;
    if (n->pattern && n->format != JS_FMT_NONE) {
        refuse(c, "unsupported keyword 'pattern' beside 'format' at %s", n->at);
        return;
    }
    if (n->pattern) {
        char name[1100];
        snprintf(name, sizeof name, "%s%spattern", n->at, n->at[1] ? "/" : "");
        body = gr_regex_rule(c->b, n->pattern, false, GR_RX_JSON_STRING, name);
        if (body < 0 && c->b->failed && !c->refused) {
            char why[256];
            snprintf(why, sizeof why, "%s", c->b->err);
            c->b->failed = false;
            refuse(c, "unsupported value of 'pattern' at %s: %s", n->at, why);
            return;
        }
    } else if (n->format == JS_FMT_DATE) {
        body = date_rule(c);
    } else if (n->format == JS_FMT_DATE_TIME) {
        body = date_time_rule(c);
    } else if (n->format == JS_FMT_EMAIL) {
        body = email_rule(c);
    } else if (n->format == JS_FMT_UUID) {
        body = uuid_rule(c);
    }
    struct gr_seq s = {0};
    if (body < 0) {
        grs_rule(c->b, &s, any_string(c));
    } else {
        grs_byte(c->b, &s, '"');
        grs_rule(c->b, &s, body);
        grs_byte(c->b, &s, '"');
    }
    grb_alt(c->b, r, &s);
    grs_free(&s);
}

/* ---- any JSON value ---- */

static int32_t any_value_at(struct sc *c, int d);

/* open rest; rest ::= close | item more; more ::= ws close | ws ',' ws item more (names suffixed by the
 * depth left, as "object", "object-rest", "object-more" for the outermost level and "object.7" ...). */
static int32_t any_container(struct sc *c, const char *name, int d, char open, char close, int32_t item)
{
    struct gr_builder *b = c->b;
    char nm[64], sfx[16] = "";
    if (d < GR_ANY_DEPTH)
        snprintf(sfx, sizeof sfx, ".%d", d);
    int32_t ws = grb_ws(b);
    snprintf(nm, sizeof nm, "%s%s", name, sfx);
    int32_t r = grb_rule(b, nm);
    snprintf(nm, sizeof nm, "%s-rest%s", name, sfx);
    int32_t rest = grb_rule(b, nm);
    snprintf(nm, sizeof nm, "%s-more%s", name, sfx);
    int32_t more = grb_rule(b, nm);
    struct gr_seq s = {0};
    grs_byte(b, &s, (uint8_t)open), grs_rule(b, &s, ws), grs_rule(b, &s, rest);
    grb_alt(b, r, &s);
    grs_byte(b, &s, (uint8_t)close);
    grb_alt(b, rest, &s);
    grs_rule(b, &s, item), grs_rule(b, &s, more);
    grb_alt(b, rest, &s);
    grs_rule(b, &s, ws), grs_byte(b, &s, (uint8_t)close);
    grb_alt(b, more, &s);
    grs_rule(b, &s, ws), grs_byte(b, &s, ','), grs_rule(b, &s, ws), grs_rule(b, &s, item),
        grs_rule(b, &s, more);
    grb_alt(b, more, &s);
    grs_free(&s);
    return r;
}

/* Any object holding at most d levels of objects and arrays, itself included (1 <= d). */
static int32_t any_object_at(struct sc *c, int d)
{
    if (c->r_object[d] >= 0 || c->b->failed)
        return c->r_object[d];
    struct gr_builder *b = c->b;
    char nm[32] = "member";
    if (d < GR_ANY_DEPTH)
        snprintf(nm, sizeof nm, "member.%d", d);
    int32_t ws = grb_ws(b), member = grb_rule(b, nm);
    c->r_object[d] = any_container(c, "object", d, '{', '}', member);
    struct gr_seq s = {0};
    grs_rule(b, &s, any_string(c)), grs_rule(b, &s, ws), grs_byte(b, &s, ':'), grs_rule(b, &s, ws);
    grs_rule(b, &s, any_value_at(c, d - 1));
    grb_alt(b, member, &s);
    grs_free(&s);
    return c->r_object[d];
}

static int32_t any_array_at(struct sc *c, int d)
{
    if (c->r_array[d] < 0 && !c->b->failed)
        c->r_array[d] = any_container(c, "array", d, '[', ']', any_value_at(c, d - 1));
    return c->r_array[d];
}

/* Any JSON value with at most d levels of objects and arrays (0: a string, number, true, false, null). */
static int32_t any_value_at(struct sc *c, int d)
{
    if (c->r_value[d] >= 0 || c->b->failed)
        return c->r_value[d];
    char nm[32] = "value";
    if (d < GR_ANY_DEPTH)
        snprintf(nm, sizeof nm, "value.%d", d);
    int32_t r = c->r_value[d] = grb_rule(c->b, nm);
    struct gr_seq s = {0};
    if (d > 0) {
        grs_rule(c->b, &s, any_object_at(c, d));
        grb_alt(c->b, r, &s);
        grs_rule(c->b, &s, any_array_at(c, d));
        grb_alt(c->b, r, &s);
    }
    grs_rule(c->b, &s, any_string(c));
    grb_alt(c->b, r, &s);
    grs_rule(c->b, &s, any_number(c));
    grb_alt(c->b, r, &s);
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        lit(c, &s, words[i]);
        grb_alt(c->b, r, &s);
    }
    grs_free(&s);
    return r;
}

static int32_t any_value(struct sc *c)
{
    return any_value_at(c, GR_ANY_DEPTH);
}

static int32_t any_object(struct sc *c)
{
    return any_object_at(c, GR_ANY_DEPTH);
}

static int32_t any_array(struct sc *c)
{
    return any_array_at(c, GR_ANY_DEPTH);
}

/* ---- schema nodes ---- */

static int32_t node_rule(struct sc *c, const struct js_node *n);

/* A sub-rule of node n, named after its pointer. */
static int32_t sub_rule(struct sc *c, const struct js_node *n, const char *what, size_t i)
{
    char name[1100];
    snprintf(name, sizeof name, "%s@%s%zu", n->at, what, i);
    return grb_rule(c->b, name);
}

/* The compact JSON text of v with its reals written with the fewest digits that read back as the same
 * doubles (0.1, not 0.10000000000000001); malloc'd, NULL when out of memory. */
static char *literal_text(const json_t *v)
{
    const size_t flags = JSON_COMPACT | JSON_ENCODE_ANY;
    char *exact = json_dumps(v, flags | JSON_REAL_PRECISION(17));
    for (int p = 1; exact && p < 17; p++) {
        char *t = json_dumps(v, flags | JSON_REAL_PRECISION(p));
        json_t *back = t ? json_loads(t, JSON_DECODE_ANY, NULL) : NULL;
        char *again = back ? json_dumps(back, flags | JSON_REAL_PRECISION(17)) : NULL;
        bool same = again && !strcmp(again, exact);
        json_decref(back);
        free(again);
        if (same) {
            free(exact);
            return t;
        }
        free(t);
    }
    return exact;
}

/* enum / const: the compact JSON text of each value that validates against n (all of n's keywords),
 * and that reads back as itself. */
static void literal_alts(struct sc *c, int32_t r, const struct js_node *n)
{
    const json_t *vals = n->constv ? n->constv : n->enumv;
    size_t count = n->constv ? 1 : json_array_size(vals), kept = 0;
    struct js_schema one = {.root = (struct js_node *)n};
    char **texts = calloc(count + 1, sizeof *texts);
    size_t *lens = calloc(count + 1, sizeof *lens);
    if (!texts || !lens) {
        free(texts);
        free(lens);
        grb_fail(c->b, "out of memory building a grammar");
        return;
    }
    for (size_t i = 0; i < count; i++) {
        const json_t *v = n->constv ? n->constv : json_array_get(vals, i);
        char *text = literal_text(v);
        if (!text) {
            grb_fail(c->b, "out of memory building a grammar");
            break;
        }
        json_t *back = json_loads(text, JSON_DECODE_ANY, NULL);
        if (back && js_validate(&one, back, NULL, 0) == 0) {
            lens[kept] = strlen(text);
            texts[kept++] = text;
        } else {
            free(text);
        }
        json_decref(back);
    }
    grb_literals(c->b, r, (const char *const *)texts, lens, kept, n->at);
    for (size_t i = 0; i < kept; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    if (!kept)
        refuse(c, "unsupported value of '%s' at %s: none of its values conforms to the schema there",
               n->constv ? "const" : "enum", n->at);
}

/* The first keyword of n, other than anyOf/enum/const, that constrains values, or NULL. */
static const char *constraining_keyword(const struct js_node *n)
{
    if (n->types != JS_T_ANY)
        return "type";
    if (n->n_props)
        return "properties";
    if (n->n_required)
        return "required";
    if (n->closed)
        return "additionalProperties";
    if (n->items)
        return "items";
    if (n->min_items)
        return "minItems";
    if (n->max_items != SIZE_MAX)
        return "maxItems";
    if (n->pattern)
        return "pattern";
    if (n->format != JS_FMT_NONE)
        return "format";
    const json_t *b[4] = {n->min, n->xmin, n->max, n->xmax};
    for (int k = 0; k < 4; k++)
        if (b[k])
            return bound_names[k];
    return NULL;
}

struct member {
    const char *name;
    const struct js_node *node; /* NULL: any value */
    bool required;
};

static bool is_required(const struct js_node *n, const char *name)
{
    for (size_t i = 0; i < n->n_required; i++)
        if (!strcmp(n->required[i], name))
            return true;
    return false;
}

/* '{' ws first_0 '}' where, with members m_0..m_k-1 in schema order:
 *   first_i ::= m_i next_i+1 | first_i+1 (the second only when m_i is optional); first_k ::= ""
 *   next_i  ::= ws ',' ws m_i next_i+1 | next_i+1 (likewise);                   next_k  ::= ws
 * so every subset that holds the required members comes out with its commas right. */
static void object_alts(struct sc *c, int32_t r, const struct js_node *n)
{
    struct gr_builder *b = c->b;
    struct gr_seq s = {0};
    if (!n->closed && !n->n_props && !n->n_required) {
        grs_rule(b, &s, any_object(c));
        grb_alt(b, r, &s);
        grs_free(&s);
        return;
    }
    struct member *m = calloc(n->n_props + n->n_required + 1, sizeof *m);
    if (!m) {
        grb_fail(b, "out of memory building a grammar");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n->n_props; i++)
        m[k++] = (struct member){n->props[i].name, n->props[i].node, is_required(n, n->props[i].name)};
    for (size_t i = 0; i < n->n_required; i++) { /* required names without a schema: any value */
        bool seen = false;
        for (size_t j = 0; j < k && !seen; j++)
            seen = !strcmp(m[j].name, n->required[i]);
        if (!seen)
            m[k++] = (struct member){n->required[i], NULL, true};
    }
    int32_t ws = grb_ws(b);
    int32_t *first = calloc(2 * (k + 1), sizeof *first), *next = first ? first + k + 1 : NULL;
    if (!first) {
        free(m);
        grb_fail(b, "out of memory building a grammar");
        return;
    }
    for (size_t i = 0; i <= k; i++) {
        first[i] = sub_rule(c, n, "first", i);
        next[i] = sub_rule(c, n, "next", i);
    }
    grb_alt(b, first[k], &s);
    grs_rule(b, &s, ws);
    grb_alt(b, next[k], &s);
    for (size_t i = 0; i < k && !b->failed; i++) {
        json_t *tmp = json_string(m[i].name);
        char *key = tmp ? json_dumps(tmp, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(tmp);
        if (!key) {
            grb_fail(b, "out of memory building a grammar");
            break;
        }
        int32_t val = m[i].node ? node_rule(c, m[i].node) : any_value(c);
        for (int pass = 0; pass < 2; pass++) {
            int32_t at = pass ? next[i] : first[i];
            if (pass)
                grs_rule(b, &s, ws), grs_byte(b, &s, ','), grs_rule(b, &s, ws);
            lit(c, &s, key);
            grs_rule(b, &s, ws), grs_byte(b, &s, ':'), grs_rule(b, &s, ws), grs_rule(b, &s, val);
            grs_rule(b, &s, next[i + 1]);
            grb_alt(b, at, &s);
            if (!m[i].required) {
                grs_rule(b, &s, pass ? next[i + 1] : first[i + 1]);
                grb_alt(b, at, &s);
            }
        }
        free(key);
    }
    grs_byte(b, &s, '{'), grs_rule(b, &s, ws), grs_rule(b, &s, first[0]), grs_byte(b, &s, '}');
    grb_alt(b, r, &s);
    grs_free(&s);
    free(first);
    free(m);
}

/* '[' ws then after_0, where after_j follows j items: ']' or ws ']' once j >= minItems, another item
 * while j < maxItems; the last one loops when maxItems is unset. Linear in max(minItems, maxItems). */
static void array_alts(struct sc *c, int32_t r, const struct js_node *n)
{
    struct gr_builder *b = c->b;
    size_t lo = n->min_items, hi = n->max_items;
    if (hi != SIZE_MAX && hi > GR_MAX_ITEMS) {
        refuse(c, "unsupported value of 'maxItems' at %s: more than %d", n->at, GR_MAX_ITEMS);
        return;
    }
    if (lo > GR_MAX_ITEMS) {
        refuse(c, "unsupported value of 'minItems' at %s: more than %d", n->at, GR_MAX_ITEMS);
        return;
    }
    struct gr_seq s = {0};
    int32_t item = n->items ? node_rule(c, n->items) : any_value(c);
    if (!n->items && lo == 0 && hi == SIZE_MAX) {
        grs_rule(b, &s, any_array(c));
        grb_alt(b, r, &s);
        grs_free(&s);
        return;
    }
    int32_t ws = grb_ws(b);
    size_t last = hi == SIZE_MAX ? (lo > 1 ? lo : 1) : hi;
    int32_t *after = malloc((last + 1) * sizeof *after);
    if (!after) {
        grb_fail(b, "out of memory building a grammar");
        return;
    }
    for (size_t j = 0; j <= last; j++)
        after[j] = sub_rule(c, n, "after", j);
    for (size_t j = 0; j <= last; j++) {
        if (j >= lo) {
            if (j)
                grs_rule(b, &s, ws);
            grs_byte(b, &s, ']');
            grb_alt(b, after[j], &s);
        }
        if (j < last || hi == SIZE_MAX) {
            if (j)
                grs_rule(b, &s, ws), grs_byte(b, &s, ','), grs_rule(b, &s, ws);
            grs_rule(b, &s, item);
            grs_rule(b, &s, after[j < last ? j + 1 : last]);
            grb_alt(b, after[j], &s);
        }
    }
    grs_byte(b, &s, '['), grs_rule(b, &s, ws), grs_rule(b, &s, after[0]);
    grb_alt(b, r, &s);
    grs_free(&s);
    free(after);
}

/* How many alternatives rule r has so far. */
static int32_t alts_of(const struct gr_builder *b, int32_t r)
{
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_pending; i++)
        n += b->pending[i].rule == r;
    return n;
}

static void node_alts(struct sc *c, int32_t r, const struct js_node *n)
{
    if (n->constv || n->enumv) {
        literal_alts(c, r, n);
        return;
    }
    struct gr_seq s = {0};
    if (n->n_any) {
        const char *k = constraining_keyword(n);
        if (k) {
            refuse(c, "unsupported keyword '%s' beside 'anyOf' at %s", k, n->at);
            return;
        }
        for (size_t i = 0; i < n->n_any && !c->b->failed; i++) {
            grs_rule(c->b, &s, node_rule(c, n->any[i]));
            grb_alt(c->b, r, &s);
        }
        grs_free(&s);
        return;
    }
    if (n->types & JS_T_OBJECT)
        object_alts(c, r, n);
    if (n->types & JS_T_ARRAY)
        array_alts(c, r, n);
    if (n->types & JS_T_STRING)
        string_alts(c, r, n);
    if (n->types & (JS_T_NUMBER | JS_T_INTEGER)) {
        long long lo, hi;
        int32_t before = alts_of(c->b, r);
        if (int_bounds(c, n, &lo, &hi) == 0)
            number_alts(c, r, lo, hi, n->types & JS_T_NUMBER ? n : NULL);
        if (alts_of(c->b, r) == before)
            refuse_bounds(c, n);
    }
    if (n->types & JS_T_BOOLEAN) {
        lit(c, &s, "true");
        grb_alt(c->b, r, &s);
        lit(c, &s, "false");
        grb_alt(c->b, r, &s);
    }
    if (n->types & JS_T_NULL) {
        lit(c, &s, "null");
        grb_alt(c->b, r, &s);
    }
    grs_free(&s);
}

/* The rule of node n ($ref followed), built on first use: made before its alternatives, so a node
 * that reaches itself refers to its own rule. */
static int32_t node_rule(struct sc *c, const struct js_node *n)
{
    while (n->ref)
        n = n->ref;
    size_t i = 0;
    while (i < c->s->n_nodes && c->s->nodes[i] != n)
        i++;
    if (i == c->s->n_nodes) {
        grb_fail(c->b, "grammar: schema node outside its schema");
        return -1;
    }
    if (c->memo[i] >= 0 || c->b->failed)
        return c->memo[i];
    int32_t r = c->memo[i] = grb_rule(c->b, n->at);
    node_alts(c, r, n);
    return r;
}

static void sc_init(struct sc *c, struct gr_builder *b, const struct js_schema *s)
{
    memset(c, 0, sizeof *c);
    c->b = b;
    c->s = s;
    c->r_string = c->r_chars = c->r_number = c->r_frac = -1;
    for (int d = 0; d <= GR_ANY_DEPTH; d++)
        c->r_value[d] = c->r_object[d] = c->r_array[d] = -1;
    for (int k = 0; k <= GR_INT_DIGITS; k++)
        c->r_opt_digits[k] = -1;
}

/* root ::= ws <rule made by body> */
static struct grammar *finish(struct sc *c, int32_t body, const struct gr_vocab *v, char *err, size_t errlen)
{
    struct gr_builder *b = c->b;
    int32_t root = grb_rule(b, "root");
    struct gr_seq s = {0};
    grs_rule(b, &s, grb_ws(b));
    grs_rule(b, &s, body);
    grb_alt(b, root, &s);
    grs_free(&s);
    struct grammar *g = gr_finish(b, root, v, err, errlen);
    if (!g && c->refused)
        snprintf(err, errlen, "%s", c->err);
    return g;
}

struct grammar *gr_compile_schema(const struct js_schema *s, const struct gr_vocab *v, char *err,
                                  size_t errlen)
{
    if (!s || !s->root) {
        snprintf(err, errlen, "no schema");
        return NULL;
    }
    struct gr_builder b;
    grb_init(&b);
    struct sc c;
    sc_init(&c, &b, s);
    c.memo = malloc((s->n_nodes + 1) * sizeof *c.memo);
    if (!c.memo) {
        snprintf(err, errlen, "out of memory building a grammar");
        return NULL;
    }
    for (size_t i = 0; i < s->n_nodes; i++)
        c.memo[i] = -1;
    int32_t body = node_rule(&c, s->root);
    struct grammar *g = finish(&c, body, v, err, errlen);
    free(c.memo);
    return g;
}

struct grammar *gr_compile_json_object(const struct gr_vocab *v, char *err, size_t errlen)
{
    struct gr_builder b;
    grb_init(&b);
    struct sc c;
    sc_init(&c, &b, NULL);
    int32_t body = any_object(&c);
    return finish(&c, body, v, err, errlen);
}
