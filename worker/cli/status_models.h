/* `llmq status`'s model queues: each model's waiting jobs, flagged when no live worker serves it. */
#pragma once
#include <stdio.h>

struct json_t;
struct rq_model_queue;

/* Lines such as "  qwen3-8b  short 120  long 0  waiting for model 'qwen3-8b': 120 jobs, no live
 * worker serves it" under a "model queues:" header; nothing when there are none. */
void status_models_print(FILE *f, const struct rq_model_queue *mq, int n);
/* {"<model>": {"short": N, "long": N, "live_workers": N, "served": bool}, ...} (a new reference). */
struct json_t *status_models_json(const struct rq_model_queue *mq, int n);
