/* Model queues seen from Redis: which models have jobs waiting and whether a live worker serves
 * them (what `llmq status` shows). Jobs move into model queues in queue/push.c (a client naming
 * a model), queue/requeue.c (a worker routing a job that names a model it does not serve) and
 * the scripts that put a job back where its hash says it came from (queue/scripts.c).
 *
 * Model queues are found through <p>:models (a set every writer of a model queue adds the model
 * to, rq_model_add_cmd), never with KEYS. A plain Redis client that pushes to a model queue
 * itself should SADD the model there too; one that pushes to the unnamed queue need not: the
 * first worker that fetches the job moves it and adds the model. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "queue/keys.h"

struct rq;

struct rq_model_queue {
    char model[RQ_MODEL_MAX + 1];
    int64_t len_short, len_long; /* LLEN of <p>:queue:<model>:short and :long */
    int live_workers;            /* live workers (heartbeat present) whose "models" field names it */
};

/* Every model of <p>:models with its queue lengths and how many live workers serve it, sorted by
 * name, into *out (owned; free()) and *n. Names in the set that are not model names are skipped.
 * 0, or -1 (rq_error). */
int rq_model_queues(struct rq *q, struct rq_model_queue **out, int *n);

/* Whether the comma-separated list `models` (a heartbeat's "models" field) holds `model`
 * (exact match). */
bool rq_models_has(const char *models, const char *model);
