/* `llmq status`'s result streams (queue/results.h): each stream's length, the entries its cap
 * dropped, and how far behind each collector group is (lag: entries not yet read; pending: read,
 * not yet acknowledged). */
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "queue/collect.h"

struct json_t;
struct rq;

#define STATUS_COLLECT_GROUPS 8 /* groups shown per stream */

struct status_collect {
    struct {
        int64_t len, dropped;
        int ngroups; /* all of them, also past STATUS_COLLECT_GROUPS */
        struct rq_group_info g[STATUS_COLLECT_GROUPS];
    } s[RQ_RS_N];
};

/* Reads both streams. 0, or -1 (rq_error). */
int status_collect_read(struct rq *q, struct status_collect *sc);
/* A "result streams:" block; nothing when both streams are empty, without groups and nothing was
 * dropped (a fleet that does not publish its rows). */
void status_collect_print(FILE *f, const struct status_collect *sc);
/* {"results": {"length": N, "dropped": N, "groups": [{"name", "consumers", "pending", "lag" (null
 * when Redis cannot tell), "last_delivered"}, ...]}, "metrics": {...}} (a new reference). */
struct json_t *status_collect_json(const struct status_collect *sc);
