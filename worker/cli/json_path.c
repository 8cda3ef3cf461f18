/* See json_path.h. */
#include "worker/cli/json_path.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct step {
    char *key;    /* a member name (owned), or NULL for an index */
    size_t index; /* array element */
};

struct json_path {
    struct step *steps;
    size_t n;
};

void json_path_free(struct json_path *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->steps[i].key);
    free(p->steps);
    free(p);
}

static bool plain_name_char(char c)
{
    return c != '.' && c != '[' && c != ']' && c != ',' && c != '"' && c != ' ' && c != '\0';
}

struct json_path *json_path_parse(const char *t, size_t len, char *err, size_t errlen)
{
    struct json_path *p = calloc(1, sizeof *p);
    char *key = NULL;
    if (!p || len == 0 || t[0] != '$') {
        snprintf(err, errlen, p ? "a path starts with '$'" : "out of memory");
        goto fail;
    }
    for (size_t i = 1; i < len;) {
        struct step st = {0};
        size_t at = i;
        if (t[i] == '.') {
            i++;
            if (i < len && t[i] == '"') { /* ."quoted name" */
                key = malloc(len - i + 1);
                size_t k = 0;
                for (i++; i < len && t[i] != '"'; i++) {
                    if (t[i] == '\\' && i + 1 < len && (t[i + 1] == '"' || t[i + 1] == '\\'))
                        i++;
                    if (key)
                        key[k++] = t[i];
                }
                if (i >= len) {
                    snprintf(err, errlen, "unterminated quoted name at offset %zu", at + 1);
                    goto fail;
                }
                i++;
                if (key)
                    key[k] = 0;
            } else {
                size_t s = i;
                while (i < len && plain_name_char(t[i]))
                    i++;
                if (i == s) {
                    snprintf(err, errlen, "expected a member name after '.' at offset %zu", at);
                    goto fail;
                }
                key = strndup(t + s, i - s);
            }
            if (!key) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            st.key = key;
        } else if (t[i] == '[') {
            i++;
            size_t s = i, n = 0;
            while (i < len && t[i] >= '0' && t[i] <= '9' && i - s < 9)
                n = n * 10 + (size_t)(t[i++] - '0');
            if (i == s || i >= len || t[i] != ']') {
                snprintf(err, errlen, "expected an array index [N] (N >= 0) at offset %zu", at);
                goto fail;
            }
            i++;
            st.index = n;
        } else {
            snprintf(err, errlen, "expected '.' or '[' at offset %zu, got '%c'", at, t[i]);
            goto fail;
        }
        struct step *grown = realloc(p->steps, (p->n + 1) * sizeof *grown);
        if (!grown) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        p->steps = grown;
        p->steps[p->n++] = st;
        key = NULL;
    }
    return p;
fail:
    free(key);
    json_path_free(p);
    return NULL;
}

json_t *json_path_get(const struct json_path *p, json_t *v)
{
    for (size_t i = 0; v && i < p->n; i++)
        v = p->steps[i].key ? json_object_get(v, p->steps[i].key) : json_array_get(v, p->steps[i].index);
    return v;
}
