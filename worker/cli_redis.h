/* What the Redis client subcommands (enqueue, status, cancel, requeue-dead) share: the
 * configuration from -c FILE / $LLMQ_CONFIG, the environment and --redis URL, and a connected
 * queue handle. */
#pragma once

struct cfg;
struct rq;

/* Fills *c: defaults < the file (config, may be NULL) < LLMQ_* environment < --redis (redis_url,
 * may be NULL), validated. Returns 0, or the exit status after printing "llmq <cmd>: ..." on
 * stderr (1 for a bad file, 2 for a bad flag value). *c must be given to cfg_free either way. */
int cli_redis_config(const char *cmd, const char *config, const char *redis_url, struct cfg *c);

/* Opens and connects a queue handle for c (c must outlive it). Returns 0, or 1 after printing
 * why on stderr (*q is then NULL). */
int cli_redis_open(const char *cmd, const struct cfg *c, struct rq **q);
