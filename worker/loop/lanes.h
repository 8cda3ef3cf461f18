/* The worker's two lanes and the routing of jobs between them.
 *
 * A worker fetches from the queues in worker.queues ("short,long" by default; that order is the
 * fetch priority). A job from the short queue runs in the engine's short lane, a job from the
 * long queue in the long lane; each lane has its own caps (queues.short_* / queues.long_*), so a
 * long document never holds a short lane's batch.
 *
 * Routing: a job fetched from the short queue whose prompt has more than
 * queues.long_threshold_tokens tokens (counted by the model's tokenizer after the chat template),
 * or that does not fit the short lane's max_model_len while it would fit the long lane's (a job with
 * "truncate" that the short lane would cut, when the long lane's is larger: worker.c), is
 * moved to the long queue (rq_requeue to its front, not counted as an attempt) rather than run in
 * the long lane here: a worker that serves only the short queue never holds long documents, and
 * the long queue's own workers and caps decide when it runs. */
#pragma once
#include <stdbool.h>

#include "queue/fetch.h"

struct cfg;
struct engine;
struct engine_stats;

enum { WK_LANE_SHORT = 0, WK_LANE_LONG = 1, WK_NLANES = 2 };

struct wk_lanes {
    bool serve[WK_NLANES]; /* the worker fetches this lane's queue */
    int order[WK_NLANES];  /* lanes in fetch priority; order[1] = -1 with one queue */
    int cap[WK_NLANES];    /* most jobs held in the engine per lane (running + waiting) */
    int global_cap;        /* most jobs in the engine in all */
    int max_model_len[WK_NLANES];
    int long_threshold; /* queues.long_threshold_tokens */
};

/* "short", "long". */
const char *wk_lane_queue(int lane);
/* The lane of a queue reference ("long" and "<model>:long" are the long lane, anything else the
 * short lane). */
int wk_lane_of_queue(const char *queue);

/* From worker.queues and the queues section; max_model_len from the opened engine. Each lane
 * holds up to its max_num_seqs plus a quarter as waiting jobs, so the next admission never waits
 * for a fetch. 0, or -1 with err (a bad queue list). */
int wk_lanes_init(struct wk_lanes *l, const struct cfg *c, const struct engine *e, char *err, size_t errlen);

/* The fetch sources with the room each lane has now (st: the engine's stats), each at most the
 * global room; *total gets what may be fetched in all (the sum, at most the global room).
 * Returns how many sources (0..2); a source may have max 0. */
int wk_lanes_sources(const struct wk_lanes *l, const struct engine_stats *st, struct rq_source *src,
                     int *total);

enum wk_route {
    WK_ROUTE_HERE, /* add it to the engine in its lane */
    WK_ROUTE_LONG, /* move it to the long queue */
    WK_ROUTE_FAIL, /* fail it with job_prepare's error */
};

/* Where a job of `lane` goes after job_prepare returned prepare_rc with n_tokens prompt tokens. */
enum wk_route wk_lanes_route(const struct wk_lanes *l, int lane, int prepare_rc, int n_tokens);

/* The engine lane of a part of a summary job (worker/jobs/summarize.h, sum_start.lane; ctx is the
 * struct wk_lanes): the short one when its prompt is at most queues.long_threshold_tokens and it
 * fits the short lane's context with max_tokens, else the long one. Parts are never moved to
 * another queue: their job is. */
int wk_lanes_part(void *ctx, int n_prompt, int max_tokens);
