/* What a worker serves: its model names (model.name, then model.aliases) and the queues they feed.
 *
 * A worker fetches, for each lane it serves (worker.queues), from its model names' queues
 * (<p>:queue:<name>:<lane>) and from the unnamed queue of the lane; the lane's room is one budget
 * for all of them (rq_fetch_grouped). Fairness: each fetch starts with the next queue of the lane
 * in turn (round robin over fetches), so neither a flood of named jobs nor of unnamed ones holds
 * the others back for longer than a fetch.
 *
 * A job that names a model (queue/keys.h's name rule; compared exactly, as vLLM's
 * --served-model-name) runs here only when it is one of these names; otherwise the worker moves it
 * to that model's queue of the same lane (reason route_model), never running or failing it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "queue/fetch.h"
#include "queue/keys.h"
#include "worker/loop/lanes.h"

#define WK_MAX_SERVED 8 /* model.name and up to 7 aliases */

struct wk_models {
    char name[WK_MAX_SERVED][RQ_MODEL_MAX + 1];
    int n;
    char csv[WK_MAX_SERVED * (RQ_MODEL_MAX + 1)]; /* the names comma-separated (the heartbeat's "models") */
    char refs[WK_NLANES][WK_MAX_SERVED + 1]
             [RQ_QREF_MAX + 1]; /* per lane: the model queues, then the unnamed */
    unsigned rot;               /* which queue of a lane the next fetch starts with */
};

/* From the model's name (model.name or the folder's) and model.aliases (comma list, checked by
 * the config). A name outside the rule is not served (a warning in warn[] then; "" otherwise):
 * the worker takes only the unnamed queues for it. */
void wk_models_init(struct wk_models *m, const char *model_name, const char *aliases, char *warn,
                    size_t warnlen);
/* Whether the worker serves `model` (exact match). */
bool wk_models_serves(const struct wk_models *m, const char *model);
/* The lanes' sources (wk_lanes_sources) expanded to every queue of each lane: out and group get
 * up to nlanes * (n + 1) entries (group: the lane's index + 1). Returns how many. Advances rot. */
int wk_models_sources(struct wk_models *m, const struct rq_source *lanes, int nlanes, struct rq_source *out,
                      int *group);
/* The lane queues of every served model, then the unnamed ones, for the lanes in `lanes` (--drain
 * waits for all of them): into out (room for WK_NLANES * (WK_MAX_SERVED + 1)). Returns how many. */
int wk_models_queues(const struct wk_models *m, const struct wk_lanes *lanes, const char **out);
