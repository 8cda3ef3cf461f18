/* See status_models.h. */
#include "worker/cli/status_models.h"

#include <jansson.h>

#include "queue/route.h"

void status_models_print(FILE *f, const struct rq_model_queue *mq, int n)
{
    if (n <= 0)
        return;
    fprintf(f, "model queues:\n");
    for (int i = 0; i < n; i++) {
        const struct rq_model_queue *m = &mq[i];
        long long waiting = (long long)(m->len_short + m->len_long);
        fprintf(f, "  %-24s short %lld  long %lld  ", m->model, (long long)m->len_short,
                (long long)m->len_long);
        if (m->live_workers)
            fprintf(f, "served by %d live worker%s\n", m->live_workers, m->live_workers == 1 ? "" : "s");
        else if (waiting)
            fprintf(f, "waiting for model '%s': %lld job%s, no live worker serves it\n", m->model, waiting,
                    waiting == 1 ? "" : "s");
        else
            fprintf(f, "no live worker serves it\n");
    }
}

struct json_t *status_models_json(const struct rq_model_queue *mq, int n)
{
    json_t *o = json_object();
    for (int i = 0; o && i < n; i++)
        json_object_set_new(o, mq[i].model,
                            json_pack("{s:I, s:I, s:i, s:b}", "short", (json_int_t)mq[i].len_short, "long",
                                      (json_int_t)mq[i].len_long, "live_workers", mq[i].live_workers,
                                      "served", mq[i].live_workers > 0));
    return o;
}
