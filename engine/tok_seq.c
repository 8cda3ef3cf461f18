/* The walk over a tokenizer.json component that may be a Sequence; see tok_seq.h. */
#include "engine/tok_seq.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

int tok_seq_walk(const json_t *j, const char *list_key, tok_seq_step_fn step, void *ctx, const char *where,
                 const char *path, char *err, size_t errlen)
{
    if (!json_is_object(j)) {
        snprintf(err, errlen, "%s: %s: expected an object", where, path);
        return -1;
    }
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) {
        snprintf(err, errlen, "%s: %s.type: expected a string", where, path);
        return -1;
    }
    if (strcmp(type, "Sequence") != 0)
        return step(ctx, j, type, where, path, err, errlen);
    const json_t *list = json_object_get(j, list_key);
    if (!json_is_array(list)) {
        snprintf(err, errlen, "%s: %s.%s: expected an array", where, path, list_key);
        return -1;
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, list_key, i);
        if (tok_seq_walk(json_array_get(list, i), list_key, step, ctx, where, sub, err, errlen) != 0)
            return -1;
    }
    return 0;
}
