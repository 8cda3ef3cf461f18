/* Redis Sentinel, the client side: which server is the master of a named group now. hiredis has
 * no Sentinel client; the protocol is two commands:
 *
 *   1. ask a sentinel (SENTINEL get-master-addr-by-name <name>) for the master's address, the
 *      sentinels in turn until one answers;
 *   2. connect there and check with ROLE that it is a master (a sentinel can answer with an old
 *      master during a failover); when it is not, ask the next sentinel.
 *
 * queue/conn.c does step 2 with the connection it keeps; this file does step 1 and parses the
 * list of sentinels (redis.sentinels).
 *
 *     struct rq_sentinels s;
 *     if (rq_sentinels_parse("10.0.0.1:26379, 10.0.0.2:26379", &s, err, sizeof err)) ... why ...
 *     snprintf(s.master_name, sizeof s.master_name, "mymaster");
 *     int from = 0; char host[256]; int port;
 *     if (rq_sentinel_master(&s, 2000, &from, host, sizeof host, &port, msg, sizeof msg)) ... */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define RQ_SENTINELS_MAX 8

struct rq_sentinels {
    int n; /* 0 = no Sentinel: connect to the configured address */
    struct {
        char host[256]; /* IPv6 without brackets */
        int port;
    } at[RQ_SENTINELS_MAX];
    char master_name[128]; /* the name the sentinels monitor the master under */
    char user[128];        /* AUTH to the sentinels; "" = none */
    char password[256];    /* "" = no AUTH */
};

/* Parses "host:port, host:port, [v6]:port" (commas and/or spaces between; the port defaults to
 * 26379) into out->n and out->at (out's other fields are left as they are). "" gives n = 0.
 * 0, or -1 with the reason in err. */
int rq_sentinels_parse(const char *list, struct rq_sentinels *out, char *err, size_t errlen);

/* Asks the sentinels of s, starting at index *from and wrapping around, for the address of
 * s->master_name; each connect and answer is bounded by timeout_ms. 0 with host/port set and
 * *from the index of the sentinel that answered (ask it first next time), or -1 with every
 * sentinel's failure in msg ("127.0.0.1:26379: Connection refused; ..."). */
int rq_sentinel_master(const struct rq_sentinels *s, int timeout_ms, int *from, char *host, size_t hostlen,
                       int *port, char *msg, size_t msglen);

/* "host:port" of sentinel i (brackets around IPv6) into buf. */
void rq_sentinel_describe(const struct rq_sentinels *s, int i, char *buf, size_t len);
