/* See result_line.h. */
#include "worker/store/result_line.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/json_exact.h"
/* llmq's result object from the columns (the shape of worker/jobs/result.h, without what only
 * the stored line has: token ids, logprobs). */
static char *built_line(const struct db_result *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "id", json_string(r->id));
    if (r->batch_id)
        json_object_set_new(o, "batch_id", json_string(r->batch_id));
    json_object_set_new(o, "status", json_string(db_status_name(r->status)));
    if (r->error_code)
        json_object_set_new(o, "error_code", json_string(r->error_code));
    if (r->status == DB_FAILED) {
        json_object_set_new(o, "error", json_string(r->error ? r->error : ""));
    } else {
        json_object_set_new(o, "text",
                            r->output
                                ? json_stringn(r->output, r->output_len ? r->output_len : strlen(r->output))
                                : json_string(""));
        json_t *answer = r->output_json ? json_loads(r->output_json, JSON_DECODE_ANY, NULL) : NULL;
        if (answer) /* a structured-output answer; an incomplete one is not told apart from none */
            json_object_set_new(o, "json", answer);
        json_object_set_new(o, "finish_reason",
                            r->finish_reason ? json_string(r->finish_reason) : json_null());
        json_object_set_new(o, "usage",
                            json_pack("{s:I, s:I}", "prompt_tokens", (json_int_t)r->prompt_tokens,
                                      "completion_tokens", (json_int_t)r->completion_tokens));
    }
    json_t *md = r->metadata ? json_loads(r->metadata, 0, NULL) : NULL;
    if (md)
        json_object_set_new(o, "metadata", md);
    char *txt = json_dumps_exact(o, JSON_COMPACT);
    json_decref(o);
    return txt;
}

const char *db_result_line(const struct db_result *r, char **owned)
{
    *owned = NULL;
    if (r->result)
        return r->result;
    *owned = built_line(r);
    return *owned;
}
