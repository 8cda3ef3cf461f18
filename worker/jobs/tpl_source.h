/* Where a job's "template" comes from: the config's templates first, else the ones other workers
 * published to Redis (<p>:templates, queue/templates.h), so a template resolves to the same text
 * on every worker and at `llmq enqueue`.
 *
 * A published value is JSON: {"text": "...", "version": "<FNV-1a-64 of the text, 16 hex>",
 * "worker": "<id>", "published_at": <unix seconds>}. A worker publishes its config's templates
 * before its first fetch (tpl_source_publish). A name is pinned to the first text published under
 * it: a worker whose config has another text under that name refuses to run (the fleet would
 * render one job two ways); the operator replaces a template with HDEL <p>:templates NAME and
 * restarts the workers with the new config.
 *
 * Lookups from Redis are cached per name (found or not) for TPL_CACHE_S seconds: a job naming a
 * published template costs one HGET per name and interval, never one per job.
 *
 *     struct tpl_source *ts = tpl_source_new(cfg, q);   // q may be NULL: the config only
 *     jopts.template_find = tpl_source_find; jopts.template_ctx = ts;
 *     rc = job_parse(...);                              // calls tpl_source_find
 *     if (rc && tpl_source_failed(ts)) ... Redis was unreachable: the job is not at fault ...
 *     tpl_source_free(ts);
 *
 * One thread uses a tpl_source. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct cfg;
struct rq;

#define TPL_CACHE_S 30.0
#define TPL_VERSION_LEN 16

struct tpl_source;

/* c and q are borrowed for the source's lifetime. NULL when out of memory. */
struct tpl_source *tpl_source_new(const struct cfg *c, struct rq *q);
/* Accepts NULL. */
void tpl_source_free(struct tpl_source *s);

/* The shape of job_opts.template_find (ctx: the tpl_source). The text of template `name`, or NULL
 * when neither the config nor Redis has it, or Redis could not be asked (tpl_source_failed). A
 * <p>:templates of the wrong type (queue/badkey.h) counts as Redis not having it: it is logged
 * once, and the jobs naming such a template fail instead of going back and forth.
 * The text is valid until the next call. */
const char *tpl_source_find(void *ctx, const char *name);
/* Whether the last tpl_source_find returned NULL because Redis could not be asked. */
bool tpl_source_failed(const struct tpl_source *s);
/* What the last failed lookup said (Redis's error), "" otherwise. */
const char *tpl_source_error(const struct tpl_source *s);

/* Publishes every template of the config under worker_id. 0 when each is published or already
 * published with the same text; -1 on a Redis error (try again later; rq_error); -2 when a name
 * is published with another text (err says which, both versions, and how to replace it). */
int tpl_source_publish(struct tpl_source *s, const char *worker_id, char *err, size_t errlen);

/* The version of a template's text: its FNV-1a-64 as 16 lower-case hex digits. */
void tpl_version(const char *text, char out[TPL_VERSION_LEN + 1]);
