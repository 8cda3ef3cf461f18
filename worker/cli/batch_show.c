/* See batch_show.h. */
#include "worker/cli/batch_show.h"

#include <stdlib.h>
#include <time.h>

#include "engine/util/json_exact.h"
#include "queue/batch_admin.h"

const char *batch_show_time(double t, char *buf, size_t len)
{
    if (t <= 0) {
        snprintf(buf, len, "-");
        return buf;
    }
    time_t s = (time_t)t;
    struct tm tm;
    localtime_r(&s, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

void batch_show_counts(FILE *f, const struct rq_batch_info *b)
{
    fprintf(f, "%lld job%s: %lld queued, %lld running, %lld completed, %lld failed, %lld cancelled", b->total,
            b->total == 1 ? "" : "s", b->queued, b->running, b->completed, b->failed, b->cancelled);
}

json_t *batch_show_json(const struct rq_batch_info *b)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "id", json_string(b->id));
    json_object_set_new(o, "state", json_string(b->exists ? b->state : "expired"));
    if (!b->exists)
        return o;
    json_object_set_new(o, "input", json_string(b->input));
    json_object_set_new(o, "created_at", json_real(b->created_at));
    json_object_set_new(o, "finished_at", b->finished_at > 0 ? json_real(b->finished_at) : json_null());
    const char *names[] = {"total", "queued", "running", "completed", "failed", "cancelled"};
    const long long v[] = {b->total, b->queued, b->running, b->completed, b->failed, b->cancelled};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        json_object_set_new(o, names[i], json_integer(v[i]));
    return o;
}

void batch_show_put_json(FILE *f, json_t *j)
{
    char *s = j ? json_dumps_exact(j, JSON_COMPACT) : NULL;
    if (s)
        fprintf(f, "%s\n", s);
    free(s);
    json_decref(j);
}
