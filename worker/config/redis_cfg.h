/* The Redis side's options from the configuration: the endpoint a worker connects to and the queue
 * handle's options (queue/rq.h), so that the queue layer knows nothing of the configuration. */
#pragma once
#include <stddef.h>

#include "queue/redis_url.h"

struct cfg;
struct rq_opts;

/* The address to connect to: redis.url, then redis.username / password / db where set. 0, or -1 with
 * err reading "redis.url: <why>". */
int cfg_redis_endpoint(const struct cfg *c, struct rq_addr *out, char *err, size_t errlen);

/* rq_opts_default() with the redis, queues and worker sections of c applied; o borrows c's strings
 * (c must outlive rq_open). */
void cfg_rq_opts(struct rq_opts *o, const struct cfg *c);
