/* See cli_redis.h. */
#include "worker/cli_redis.h"

#include <stdio.h>

#include "queue/rq.h"
#include "worker/config.h"

int cli_redis_config(const char *cmd, const char *config, const char *redis_url, struct cfg *c)
{
    char err[1024];
    cfg_defaults(c);
    if ((config && cfg_load_file(c, config, err, sizeof err)) || cfg_load_env(c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 1;
    }
    if (redis_url && cfg_set(c, "redis.url", redis_url, "--redis", err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 2;
    }
    if (cfg_validate(c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int cli_redis_open(const char *cmd, const struct cfg *c, struct rq **q)
{
    char err[1024];
    struct rq_opts o;
    rq_opts_from_cfg(&o, c);
    o.worker_id = NULL; /* a client, not a worker: <hostname>-<pid> only names its connection */
    o.quiet = true;     /* one error line below rather than the reconnect log */
    if (rq_open(&o, q, err, sizeof err)) {
        fprintf(stderr, "llmq %s: redis: %s\n", cmd, err);
        return 1;
    }
    if (rq_connect(*q)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, rq_error(*q));
        rq_free(*q);
        *q = NULL;
        return 1;
    }
    return 0;
}
