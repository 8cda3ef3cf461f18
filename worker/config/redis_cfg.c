/* See redis_cfg.h. */
#include "worker/config/redis_cfg.h"

#include <stdio.h>

#include "queue/rq.h"
#include "worker/config/config.h"

int cfg_redis_endpoint(const struct cfg *c, struct rq_addr *out, char *err, size_t errlen)
{
    char msg[256];
    if (rq_url_parse(c->redis.url, out, msg, sizeof msg)) {
        snprintf(err, errlen, "redis.url: %s", msg);
        return -1;
    }
    if (*c->redis.username)
        snprintf(out->user, sizeof out->user, "%s", c->redis.username);
    if (*c->redis.password)
        snprintf(out->password, sizeof out->password, "%s", c->redis.password);
    if (c->redis.db >= 0)
        out->db = c->redis.db;
    return 0;
}

void cfg_rq_opts(struct rq_opts *o, const struct cfg *c)
{
    rq_opts_default(o);
    o->url = c->redis.url;
    o->username = c->redis.username;
    o->password = c->redis.password;
    o->db = c->redis.db;
    o->prefix = c->redis.prefix;
    o->worker_id = c->worker.id;
    o->connect_timeout_ms = c->redis.connect_timeout_ms;
    o->block_timeout_ms = c->redis.block_timeout_ms;
    o->reconnect_max_ms = c->redis.reconnect_max_ms;
    o->max_attempts = c->queues.max_attempts;
    o->max_stalls = c->queues.max_stalls;
    o->retry_backoff_base_ms = c->queues.retry_backoff_base_ms;
    o->retry_backoff_max_ms = c->queues.retry_backoff_max_ms;
    o->result_ttl_s = c->queues.result_ttl_s;
    o->events_maxlen = c->queues.events_maxlen;
    o->stream_maxlen = c->redis.stream_maxlen;
    o->heartbeat_ttl_s = c->worker.heartbeat_ttl_s;
    o->heartbeat_interval_s = c->worker.heartbeat_interval_s;
    o->reaper_interval_s = c->worker.reaper_interval_s;
    o->max_job_bytes = c->queues.max_job_bytes;
    o->fetch_max_bytes = c->queues.fetch_max_bytes;
    o->results_maxlen = c->results_stream.enabled ? c->results_stream.max_len : -1;
    o->sentinels = c->redis.sentinels;
    o->master_name = c->redis.master_name;
    o->sentinel_username = c->redis.sentinel_username;
    o->sentinel_password = c->redis.sentinel_password;
    o->wait_replicas = c->redis.wait_replicas;
    o->wait_timeout_ms = c->redis.wait_timeout_ms;
}
