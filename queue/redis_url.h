/* Redis addresses: the redis:// and unix:// URL syntax, and its redaction for display.
 *
 *     struct rq_addr a;
 *     if (rq_url_parse(url, &a, err, sizeof err)) ... err says why ...
 *     ... a.unix_path[0] ? connect to a.unix_path : connect to a.host:a.port; AUTH; SELECT a.db ...
 */
#pragma once
#include <stddef.h>

struct rq_addr {
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
int rq_url_parse(const char *url, struct rq_addr *out, char *err, size_t errlen);
/* url with the password in its userinfo shown as "****" (redis://user:secret@host ->
 * redis://user:****@host); anything else is copied as is, cut to fit buf. */
void rq_url_redact(const char *url, char *buf, size_t len);
