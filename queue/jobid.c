/* See jobid.h. */
#include "queue/jobid.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/uuid.h"
#include "queue/jobscan.h"

static bool usable(const json_t *v)
{
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > RQ_OWN_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

static bool openai_form(const json_t *root)
{
    return json_object_get(root, "custom_id") || json_object_get(root, "body") ||
           json_object_get(root, "url") || json_object_get(root, "method");
}

/* The state of a parsed root; writes a found key into id. */
static enum rq_idstate state_of(const json_t *root, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    if (!json_is_object(root))
        return RQ_ID_NONE;
    if (openai_form(root)) {
        const json_t *c = json_object_get(root, "custom_id"), *b = json_object_get(root, "batch_id");
        if (!usable(c))
            return RQ_ID_NONE;
        if (b && !json_is_null(b) &&
            !(json_is_string(b) && rq_valid_batch_id(json_string_value(b), json_string_length(b))))
            return RQ_ID_NONE;
        rq_openai_key(b && !json_is_null(b) ? json_string_value(b) : NULL, json_string_value(c), id);
        return RQ_ID_FOUND;
    }
    const json_t *v = json_object_get(root, "id");
    if (usable(v)) {
        memcpy(id, json_string_value(v), json_string_length(v) + 1);
        return RQ_ID_FOUND;
    }
    return !v || json_is_null(v) ? RQ_ID_MISSING : RQ_ID_NONE;
}

/* Whether raw nests arrays and objects deeper than RQ_JSON_MAX_DEPTH (the Lua side's cjson does
 * not read those, jansson does). */
static bool too_deep(const char *raw, size_t len)
{
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = raw[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > RQ_JSON_MAX_DEPTH)
                return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}

enum rq_idstate rq_job_id(const char *raw, size_t len, size_t max_bytes, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    if ((max_bytes > 0 && len > max_bytes) || too_deep(raw, len))
        return RQ_ID_NONE;
    int st = rq_job_scan(raw, len, id);
    return st >= 0 ? (enum rq_idstate)st : rq_job_id_parsed(raw, len, id);
}

enum rq_idstate rq_job_id_parsed(const char *raw, size_t len, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    json_t *root = json_loadb(raw, len, JSON_ALLOW_NUL, NULL); /* cjson reads "\u0000" too */
    if (!root)
        return RQ_ID_NONE;
    enum rq_idstate st = state_of(root, id);
    json_decref(root);
    return st;
}

void rq_openai_key(const char *batch_id, const char *custom_id, char id[RQ_ID_MAX + 1])
{
    size_t b = batch_id ? strnlen(batch_id, RQ_BATCH_ID_MAX) : 0, c = strnlen(custom_id, RQ_OWN_ID_MAX);
    size_t o = 0;
    if (b) {
        memcpy(id, batch_id, b);
        id[b] = '/';
        o = b + 1;
    }
    memcpy(id + o, custom_id, c);
    id[o + c] = 0;
}

void rq_new_id(char id[RQ_ID_MAX + 1])
{
    _Static_assert(RQ_ID_MAX >= UUID_TEXT_LEN, "a generated id fits");
    uuid7(id);
}

/* raw[0..len) (a JSON object; `empty` when it has no member) with `"<name>":<enc>` inserted
 * before its closing brace, into *out (malloc'd). 0, or -1. */
static int insert_member(const char *raw, size_t len, bool empty, const char *name, const char *enc,
                         char **out, size_t *outlen)
{
    size_t close = len; /* the last '}' (only whitespace may follow a JSON object) */
    while (close > 0 && raw[close - 1] != '}')
        close--;
    size_t nl = strlen(name), el = strlen(enc), add = (empty ? 0 : 1) + nl + 3 + el;
    char *s = close ? malloc(len + add + 1) : NULL;
    if (!s)
        return -1;
    size_t at = close - 1, o = at;
    memcpy(s, raw, at);
    if (!empty)
        s[o++] = ',';
    s[o++] = '"';
    memcpy(s + o, name, nl);
    o += nl;
    s[o++] = '"';
    s[o++] = ':';
    memcpy(s + o, enc, el);
    o += el;
    memcpy(s + o, raw + at, len - at);
    o += len - at;
    s[o] = 0;
    *out = s;
    *outlen = o;
    return 0;
}

/* `value` as a JSON string (malloc'd), or NULL. */
static char *encode(const char *value)
{
    json_t *v = json_string(value);
    char *enc = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    return enc;
}

int rq_job_add_id(const char *raw, size_t len, const char *id, char **out, size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    json_t *root = json_loadb(raw, len, JSON_ALLOW_NUL, NULL);
    char old[RQ_ID_MAX + 1];
    char *enc = root && state_of(root, old) == RQ_ID_MISSING ? encode(id) : NULL;
    int rc = -1;
    if (enc && json_object_get(root, "id")) { /* "id": null: rewrite rather than duplicate the key */
        json_object_set_new(root, "id", json_string(id));
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) {
            *out = s;
            *outlen = strlen(s);
            rc = 0;
        }
    } else if (enc) {
        rc = insert_member(raw, len, json_object_size(root) == 0, "id", enc, out, outlen);
    }
    free(enc);
    json_decref(root);
    return rc;
}

int rq_job_add_batch(const char *raw, size_t len, const char *batch_id, char **out, size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    if (!rq_valid_batch_id(batch_id, strlen(batch_id)))
        return -1;
    json_t *root = json_loadb(raw, len, 0, NULL);
    char *enc = json_is_object(root) && !json_object_get(root, "batch_id") ? encode(batch_id) : NULL;
    int rc = enc ? insert_member(raw, len, json_object_size(root) == 0, "batch_id", enc, out, outlen) : -1;
    free(enc);
    json_decref(root);
    return rc;
}
