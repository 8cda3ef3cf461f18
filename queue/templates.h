/* Published prompt templates: the hash <p>:templates, name -> a JSON value the worker layer
 * writes and reads (worker/jobs/tpl_source.h: text, version, who published it and when). This
 * file only stores and reads the values; it knows nothing of their content.
 *
 * A name, once published, is pinned: publishing uses HSETNX, so the first value stays and a
 * later publisher learns what is there (to compare it with its own). Replacing one is an
 * operator's act: HDEL <p>:templates NAME, then start a worker whose config has the new text. */
#pragma once

struct rq;

/* Publishes `value` under `name` unless the name is taken. Returns 1 when it was published, 0
 * when it was there already (its value in *existing, malloc'd; the caller frees it), -1 on a
 * Redis error (rq_error). */
int rq_template_publish(struct rq *q, const char *name, const char *value, char **existing);

/* The published value of `name` into *value (malloc'd; the caller frees it). Returns 1 found, 0
 * not published (*value NULL), -1 on a Redis error. */
int rq_template_get(struct rq *q, const char *name, char **value);
