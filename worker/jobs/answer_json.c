/* See answer_json.h. */
#include "worker/jobs/answer_json.h"

#include <jansson.h>

json_t *answer_json(enum job_constraint_kind kind, const char *text, size_t len, enum finish_reason finish,
                    bool *incomplete)
{
    *incomplete = false;
    if (!job_constraint_is_json(kind))
        return NULL;
    /* jansson takes JSON text, with whitespace around the value, as RFC 8259 has it; a NUL inside
     * a string, a duplicate key or a number out of a double's range makes it not JSON here (and
     * SQLite's json_valid would not have it either) */
    json_t *v = json_loadb(text ? text : "", text ? len : 0, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (v && finish != FINISH_STOP && json_is_number(v)) {
        json_decref(v);
        v = NULL;
    }
    *incomplete = v == NULL;
    return v;
}
