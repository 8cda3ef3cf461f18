/* Redis addresses: the redis.url syntax, its redaction for display, and the endpoint a worker
 * connects to (redis.url with redis.username / password / db applied over it). Included by
 * worker/config/config.h; the cfg_ names are the configuration's.
 *
 *     struct cfg_redis_addr a;
 *     if (cfg_redis_endpoint(&cfg, &a, err, sizeof err)) ... "redis.url: <why>" ...
 *     ... a.unix_path[0] ? connect to a.unix_path : connect to a.host:a.port; AUTH; SELECT a.db ...
 */
#pragma once
#include <stddef.h>

struct cfg;

struct cfg_redis_addr {
    char host[256];      /* "" for a unix socket; IPv6 without brackets */
    int port;            /* 6379 when absent */
    char unix_path[512]; /* "" for TCP */
    char user[128];      /* "" = none (percent-decoded) */
    char password[256];  /* "" = none (percent-decoded) */
    int db;              /* 0 when absent */
};

/* Parses redis://[[user]:password@]host[:port][/db][?db=N] (host may be [IPv6]) and
 * unix://[[user]:password@]/path.sock[?db=N]. rediss:// (TLS) is refused. 0, or -1 with the
 * reason in err; *out is zeroed first either way. */
int cfg_redis_url_parse(const char *url, struct cfg_redis_addr *out, char *err, size_t errlen);
/* The address to connect to: redis.url, then redis.username/password/db where set. On error
 * err reads "redis.url: <why>". */
int cfg_redis_endpoint(const struct cfg *c, struct cfg_redis_addr *out, char *err, size_t errlen);
/* url with the password in its userinfo shown as "****" (redis://user:secret@host ->
 * redis://user:****@host); anything else is copied as is, cut to fit buf. */
void cfg_redis_url_redact(const char *url, char *buf, size_t len);
