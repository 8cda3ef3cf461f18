/* See lanes.h. */
#include "worker/loop/lanes.h"

#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "queue/keys.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/jobs/job.h"

_Static_assert((int)WK_LANE_SHORT == (int)ENGINE_CFG_LANE_SHORT &&
                   (int)WK_LANE_LONG == (int)ENGINE_CFG_LANE_LONG,
               "worker lanes are the engine's lanes");

const char *wk_lane_queue(int lane)
{
    return lane == WK_LANE_LONG ? "long" : "short";
}

int wk_lane_of_queue(const char *queue)
{
    return queue && !strcmp(rq_queue_ref_queue(queue), "long") ? WK_LANE_LONG : WK_LANE_SHORT;
}

static int with_headroom(int n)
{
    return n + (n + 3) / 4;
}

int wk_lanes_init(struct wk_lanes *l, const struct cfg *c, const struct engine *e, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    l->order[0] = l->order[1] = -1;
    int k = 0;
    const char *p = c->worker.queues;
    while (*p) {
        size_t n = strcspn(p, ", ");
        int lane = n == 5 && !strncmp(p, "short", 5)  ? WK_LANE_SHORT
                   : n == 4 && !strncmp(p, "long", 4) ? WK_LANE_LONG
                                                      : -1;
        if (n && (lane < 0 || l->serve[lane] || k == WK_NLANES)) {
            snprintf(err, errlen, "worker.queues: \"%s\" is not a comma list of short and long",
                     c->worker.queues);
            return -1;
        }
        if (n) {
            l->serve[lane] = true;
            l->order[k++] = lane;
        }
        p += n;
        while (*p == ',' || *p == ' ')
            p++;
    }
    if (k == 0) {
        snprintf(err, errlen, "worker.queues: no queue to fetch from");
        return -1;
    }
    l->cap[WK_LANE_SHORT] = with_headroom(c->queues.short_max_num_seqs);
    l->cap[WK_LANE_LONG] = with_headroom(c->queues.long_max_num_seqs);
    l->global_cap = with_headroom(c->engine.max_num_seqs);
    for (int i = 0; i < WK_NLANES; i++)
        l->max_model_len[i] = engine_max_model_len(e, i);
    l->long_threshold = c->queues.long_threshold_tokens;
    return 0;
}

int wk_lanes_sources(const struct wk_lanes *l, const struct engine_stats *st, struct rq_source *src,
                     int *total)
{
    int n = 0, sum = 0;
    int global = l->global_cap - st->running - st->waiting;
    for (int k = 0; k < WK_NLANES; k++) {
        int lane = l->order[k];
        if (lane < 0)
            continue;
        int room = l->cap[lane] - st->lane_running[lane] - st->lane_waiting[lane];
        if (room > global)
            room = global;
        if (room < 0)
            room = 0;
        src[n].queue = wk_lane_queue(lane);
        src[n].max = room;
        sum += room;
        n++;
    }
    /* each lane may use the global room; the fetch takes at most that much from all together */
    *total = sum < global ? sum : global > 0 ? global : 0;
    return n;
}

enum wk_route wk_lanes_route(const struct wk_lanes *l, int lane, int prepare_rc, int n_tokens)
{
    if (lane != WK_LANE_SHORT)
        return prepare_rc == JOB_OK ? WK_ROUTE_HERE : WK_ROUTE_FAIL;
    if (prepare_rc == JOB_OK)
        return n_tokens > l->long_threshold ? WK_ROUTE_LONG : WK_ROUTE_HERE;
    if (prepare_rc == JOB_ERR_CONTEXT && l->max_model_len[WK_LANE_LONG] > l->max_model_len[WK_LANE_SHORT])
        return WK_ROUTE_LONG;
    return WK_ROUTE_FAIL;
}

int wk_lanes_part(void *ctx, int n_prompt, int max_tokens)
{
    const struct wk_lanes *l = ctx;
    bool short_fits = n_prompt <= l->long_threshold &&
                      (long long)n_prompt + max_tokens <= l->max_model_len[WK_LANE_SHORT];
    return short_fits ? WK_LANE_SHORT : WK_LANE_LONG;
}
