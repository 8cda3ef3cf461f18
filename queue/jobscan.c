/* See jobscan.h. */
#include "queue/jobscan.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "queue/keys.h"

enum { BAD = -2, UNSURE = -1, OK = 0 };
enum { MAX_DEPTH = 64 };

struct scan {
    const unsigned char *p, *end;
};

/* What a top-level member the key is read from holds. */
enum kind { K_ABSENT, K_STRING, K_NULL, K_OTHER };

struct member {
    enum kind kind;
    const char *s; /* K_STRING: its bytes (no escapes) */
    size_t n;
};

static void ws(struct scan *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hex4(const unsigned char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned h = p[i], d;
        if (h >= '0' && h <= '9')
            d = h - '0';
        else if (h >= 'a' && h <= 'f')
            d = h - 'a' + 10;
        else if (h >= 'A' && h <= 'F')
            d = h - 'A' + 10;
        else
            return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

/* One UTF-8 sequence starting at c->p (a byte >= 0x80), as jansson's utf8_check_first/full. */
static int utf8(struct scan *c)
{
    unsigned char b = *c->p;
    int n = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (!n || c->end - c->p < n)
        return BAD;
    uint32_t v = b & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (int i = 1; i < n; i++) {
        if ((c->p[i] & 0xC0) != 0x80)
            return BAD;
        v = v << 6 | (c->p[i] & 0x3F);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (n == 3 && v < 0x800) || (n == 4 && v < 0x10000))
        return BAD;
    c->p += n;
    return OK;
}

/* A string at c->p (the opening quote); *esc tells whether it held an escape. */
static int string(struct scan *c, bool *esc)
{
    *esc = false;
    c->p++;
    while (c->p < c->end) {
        unsigned char b = *c->p;
        if (b == '"') {
            c->p++;
            return OK;
        }
        if (b < 0x20)
            return BAD;
        if (b >= 0x80) {
            if (utf8(c))
                return BAD;
            continue;
        }
        if (b != '\\') {
            c->p++;
            continue;
        }
        *esc = true;
        if (c->end - c->p < 2)
            return BAD;
        unsigned char e = c->p[1];
        if (e != 'u') {
            if (!strchr("\"\\/bfnrt", e) || e == 0)
                return BAD;
            c->p += 2;
            continue;
        }
        unsigned v, w;
        if (c->end - c->p < 6 || hex4(c->p + 2, &v) || (v >= 0xDC00 && v <= 0xDFFF))
            return BAD;
        if (v == 0) /* read with JSON_ALLOW_NUL, as cjson reads it: the full parse decides */
            return UNSURE;
        c->p += 6;
        if (v >= 0xD800 && v <= 0xDBFF) { /* a pair's first half: its second must follow */
            if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || hex4(c->p + 2, &w) || w < 0xDC00 ||
                w > 0xDFFF)
                return BAD;
            c->p += 6;
        }
    }
    return BAD;
}

static bool digit(const struct scan *c)
{
    return c->p < c->end && *c->p >= '0' && *c->p <= '9';
}

/* A number; UNSURE where jansson could refuse it as too large (an exponent, or more than 18
 * integer digits). */
static int number(struct scan *c)
{
    if (*c->p == '-')
        c->p++;
    if (!digit(c))
        return BAD;
    const unsigned char *start = c->p;
    if (*c->p == '0') {
        c->p++;
        if (digit(c))
            return BAD;
    } else {
        while (digit(c))
            c->p++;
    }
    if (c->p - start > 18)
        return UNSURE;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!digit(c))
            return BAD;
        while (digit(c))
            c->p++;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E'))
        return UNSURE;
    return OK;
}

static int literal(struct scan *c, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n))
        return BAD;
    c->p += n;
    return OK;
}

static int value(struct scan *c, int depth);

/* An object or array at c->p. */
static int container(struct scan *c, int depth)
{
    if (depth >= MAX_DEPTH)
        return UNSURE;
    bool obj = *c->p == '{';
    unsigned char close = obj ? '}' : ']';
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return OK;
    }
    for (;;) {
        int rc;
        if (obj) {
            bool esc;
            if (c->p >= c->end || *c->p != '"')
                return BAD;
            if ((rc = string(c, &esc)) != OK)
                return rc;
            ws(c);
            if (c->p >= c->end || *c->p != ':')
                return BAD;
            c->p++;
            ws(c);
        }
        if ((rc = value(c, depth + 1)) != OK)
            return rc;
        ws(c);
        if (c->p >= c->end)
            return BAD;
        if (*c->p == close) {
            c->p++;
            return OK;
        }
        if (*c->p != ',')
            return BAD;
        c->p++;
        ws(c);
    }
}

static int value(struct scan *c, int depth)
{
    if (c->p >= c->end)
        return BAD;
    bool esc;
    switch (*c->p) {
    case '{':
    case '[':
        return container(c, depth);
    case '"':
        return string(c, &esc);
    case 't':
        return literal(c, "true");
    case 'f':
        return literal(c, "false");
    case 'n':
        return literal(c, "null");
    default:
        return number(c);
    }
}

static const char *const names[] = {"id", "custom_id", "batch_id", "body", "url", "method"};
enum { M_ID, M_CUSTOM_ID, M_BATCH_ID, M_BODY, M_URL, M_METHOD, NMEMBERS };

/* The top-level object, its members of names[] into m (the last of a repeated key wins, as in
 * jansson). */
static int top(struct scan *c, struct member m[NMEMBERS])
{
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return OK;
    }
    for (;;) {
        bool esc;
        if (c->p >= c->end || *c->p != '"')
            return BAD;
        const unsigned char *k = c->p + 1;
        int src = string(c, &esc);
        if (src != OK)
            return src;
        size_t kn = (size_t)(c->p - 1 - k);
        if (esc)
            return UNSURE; /* it could spell one of names[] */
        int which = -1;
        for (int i = 0; i < NMEMBERS && which < 0; i++)
            if (strlen(names[i]) == kn && !memcmp(names[i], k, kn))
                which = i;
        ws(c);
        if (c->p >= c->end || *c->p != ':')
            return BAD;
        c->p++;
        ws(c);
        const unsigned char *v = c->p;
        int rc;
        if (which >= 0 && c->p < c->end && *c->p == '"') {
            if ((rc = string(c, &esc)) != OK)
                return rc;
            if (esc)
                return UNSURE;
            m[which] = (struct member){K_STRING, (const char *)v + 1, (size_t)(c->p - 1 - (v + 1))};
        } else {
            if ((rc = value(c, 1)) != OK)
                return rc;
            if (which >= 0)
                m[which] =
                    (struct member){c->p - v == 4 && !memcmp(v, "null", 4) ? K_NULL : K_OTHER, NULL, 0};
        }
        ws(c);
        if (c->p >= c->end)
            return BAD;
        if (*c->p == '}') {
            c->p++;
            return OK;
        }
        if (*c->p != ',')
            return BAD;
        c->p++;
        ws(c);
    }
}

/* jobid.c's usable(): a string of 1..RQ_OWN_ID_MAX bytes without control characters. */
static bool usable(const struct member *m)
{
    if (m->kind != K_STRING || m->n == 0 || m->n > RQ_OWN_ID_MAX)
        return false;
    for (size_t i = 0; i < m->n; i++)
        if ((unsigned char)m->s[i] < 0x20 || m->s[i] == 0x7f)
            return false;
    return true;
}

int rq_job_scan(const char *raw, size_t len, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    if (memchr(raw, 0, len)) /* jansson skips a NUL byte in some places and refuses it in others */
        return -1;
    struct scan c = {(const unsigned char *)raw, (const unsigned char *)raw + len};
    ws(&c);
    if (c.p >= c.end || *c.p != '{') /* not an object, JSON or not: no key */
        return RQ_ID_NONE;
    struct member m[NMEMBERS] = {{K_ABSENT, NULL, 0}};
    int rc = top(&c, m);
    if (rc == OK) {
        ws(&c);
        if (c.p != c.end)
            rc = BAD;
    }
    if (rc == UNSURE)
        return -1;
    if (rc == BAD)
        return RQ_ID_NONE;
    if (m[M_CUSTOM_ID].kind || m[M_BODY].kind || m[M_URL].kind || m[M_METHOD].kind) { /* an OpenAI line */
        const struct member *b = &m[M_BATCH_ID];
        if (!usable(&m[M_CUSTOM_ID]))
            return RQ_ID_NONE;
        bool batch = b->kind != K_ABSENT && b->kind != K_NULL;
        if (batch && !(b->kind == K_STRING && rq_valid_batch_id(b->s, b->n)))
            return RQ_ID_NONE;
        char cid[RQ_OWN_ID_MAX + 1], bid[RQ_BATCH_ID_MAX + 1];
        memcpy(cid, m[M_CUSTOM_ID].s, m[M_CUSTOM_ID].n);
        cid[m[M_CUSTOM_ID].n] = 0;
        if (batch) {
            memcpy(bid, b->s, b->n);
            bid[b->n] = 0;
        }
        rq_openai_key(batch ? bid : NULL, cid, id);
        return RQ_ID_FOUND;
    }
    if (usable(&m[M_ID])) {
        memcpy(id, m[M_ID].s, m[M_ID].n);
        id[m[M_ID].n] = 0;
        return RQ_ID_FOUND;
    }
    return m[M_ID].kind == K_ABSENT || m[M_ID].kind == K_NULL ? RQ_ID_MISSING : RQ_ID_NONE;
}
