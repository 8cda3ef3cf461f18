/* See jobid.h. */
#include "queue/jobid.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/uuid.h"

static bool usable(const json_t *v)
{
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > RQ_ID_MAX)
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

/* The state of a parsed root; copies a found id into id. */
static enum rq_idstate state_of(const json_t *root, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    if (!json_is_object(root))
        return RQ_ID_NONE;
    const json_t *v = json_object_get(root, openai_form(root) ? "custom_id" : "id");
    if (usable(v)) {
        memcpy(id, json_string_value(v), json_string_length(v) + 1);
        return RQ_ID_FOUND;
    }
    if (!openai_form(root) && (!v || json_is_null(v)))
        return RQ_ID_MISSING;
    return RQ_ID_NONE;
}

enum rq_idstate rq_job_id(const char *raw, size_t len, size_t max_bytes, char id[RQ_ID_MAX + 1])
{
    id[0] = 0;
    if (max_bytes > 0 && len > max_bytes)
        return RQ_ID_NONE;
    json_t *root = json_loadb(raw, len, 0, NULL);
    if (!root)
        return RQ_ID_NONE;
    enum rq_idstate st = state_of(root, id);
    json_decref(root);
    return st;
}

void rq_new_id(char id[RQ_ID_MAX + 1])
{
    _Static_assert(RQ_ID_MAX >= UUID_TEXT_LEN, "a generated id fits");
    uuid7(id);
}

int rq_job_add_id(const char *raw, size_t len, const char *id, char **out, size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    json_t *root = json_loadb(raw, len, 0, NULL);
    char old[RQ_ID_MAX + 1];
    if (!root || state_of(root, old) != RQ_ID_MISSING) {
        json_decref(root);
        return -1;
    }
    json_t *idv = json_string(id);
    if (!idv) {
        json_decref(root);
        return -1;
    }
    char *enc = json_dumps(idv, JSON_ENCODE_ANY);
    json_decref(idv);
    if (!enc) {
        json_decref(root);
        return -1;
    }
    int rc = 0;
    if (json_object_get(root, "id")) { /* "id": null: rewrite rather than duplicate the key */
        json_object_set_new(root, "id", json_string(id));
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) {
            *out = s;
            *outlen = strlen(s);
        } else {
            rc = -1;
        }
    } else {
        /* the closing brace: the last '}' (only whitespace may follow a JSON object) */
        size_t close = len;
        while (close > 0 && raw[close - 1] != '}')
            close--;
        bool empty = json_object_size(root) == 0;
        size_t el = strlen(enc), add = (empty ? 0 : 1) + 5 + el;
        char *s = close ? malloc(len + add + 1) : NULL;
        if (s) {
            size_t at = close - 1, o = 0;
            memcpy(s, raw, at);
            o = at;
            if (!empty)
                s[o++] = ',';
            memcpy(s + o, "\"id\":", 5);
            o += 5;
            memcpy(s + o, enc, el);
            o += el;
            memcpy(s + o, raw + at, len - at);
            o += len - at;
            s[o] = 0;
            *out = s;
            *outlen = o;
        } else {
            rc = -1;
        }
    }
    free(enc);
    json_decref(root);
    return rc;
}
