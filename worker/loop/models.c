/* See models.h. */
#include "worker/loop/models.h"

#include <stdio.h>
#include <string.h>

static void add(struct wk_models *m, const char *name, size_t len)
{
    if (m->n == WK_MAX_SERVED || len == 0 || len > RQ_MODEL_MAX)
        return;
    char tmp[RQ_MODEL_MAX + 1];
    memcpy(tmp, name, len);
    tmp[len] = 0;
    if (!rq_valid_model_name(tmp) || wk_models_serves(m, tmp))
        return;
    memcpy(m->name[m->n++], tmp, len + 1);
}

void wk_models_init(struct wk_models *m, const char *model_name, const char *aliases, char *warn,
                    size_t warnlen)
{
    memset(m, 0, sizeof *m);
    warn[0] = 0;
    if (!rq_valid_model_name(model_name))
        snprintf(
            warn, warnlen,
            "model name \"%.80s\" is not a model name for queues (letters, digits, . _ - /): this worker "
            "serves no model queue under it; set model.name",
            model_name);
    add(m, model_name, strlen(model_name));
    for (const char *s = aliases ? aliases : ""; *s;) {
        size_t k = strcspn(s, ",");
        size_t b = 0, e = k;
        while (b < e && s[b] == ' ')
            b++;
        while (e > b && s[e - 1] == ' ')
            e--;
        add(m, s + b, e - b);
        s += k + (s[k] == ',');
    }
    size_t off = 0;
    for (int i = 0; i < m->n; i++)
        off += (size_t)snprintf(m->csv + off, sizeof m->csv - off, "%s%s", i ? "," : "", m->name[i]);
    for (int lane = 0; lane < WK_NLANES; lane++) {
        for (int i = 0; i < m->n; i++)
            rq_queue_ref(m->name[i], wk_lane_queue(lane), m->refs[lane][i], RQ_QREF_MAX + 1);
        rq_queue_ref(NULL, wk_lane_queue(lane), m->refs[lane][m->n], RQ_QREF_MAX + 1);
    }
}

bool wk_models_serves(const struct wk_models *m, const char *model)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->name[i], model))
            return true;
    return false;
}

int wk_models_sources(struct wk_models *m, const struct rq_source *lanes, int nlanes, struct rq_source *out,
                      int *group)
{
    int k = m->n + 1, n = 0;
    for (int i = 0; i < nlanes; i++) {
        int lane = wk_lane_of_queue(lanes[i].queue);
        for (int j = 0; j < k; j++) {
            out[n] = (struct rq_source){.queue = m->refs[lane][(m->rot + (unsigned)j) % (unsigned)k],
                                        .max = lanes[i].max};
            group[n++] = i + 1;
        }
    }
    m->rot++;
    return n;
}

int wk_models_queues(const struct wk_models *m, const struct wk_lanes *lanes, const char **out)
{
    int n = 0;
    for (int k = 0; k < WK_NLANES; k++) {
        int lane = lanes->order[k];
        if (lane < 0)
            continue;
        for (int i = 0; i <= m->n; i++)
            out[n++] = m->refs[lane][i];
    }
    return n;
}
