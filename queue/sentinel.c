/* See sentinel.h. */
#include "queue/sentinel.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "engine/util/errfmt.h"

#define SENTINEL_PORT 26379

/* One "host[:port]" or "[v6][:port]" entry s[0..n) into slot i. 0, or -1 with err. */
static int parse_one(const char *s, size_t n, struct rq_sentinels *out, int i, char *err, size_t errlen)
{
    const char *hend = s + n, *portp = NULL, *h = s;
    if (*s == '[') {
        const char *rb = memchr(s, ']', n);
        if (!rb)
            return errfmt(err, errlen, "\"%.*s\": unclosed '['", (int)(n > 80 ? 80 : n), s);
        if (rb + 1 < s + n) {
            if (rb[1] != ':')
                return errfmt(err, errlen, "\"%.*s\": expected ':port' after ']'", (int)(n > 80 ? 80 : n), s);
            portp = rb + 2;
        }
        h = s + 1;
        hend = rb;
    } else {
        const char *colon = memchr(s, ':', n);
        if (colon) {
            if (memchr(colon + 1, ':', (size_t)(s + n - colon - 1)))
                return errfmt(err, errlen, "\"%.*s\": put an IPv6 address in brackets: [::1]:26379",
                              (int)(n > 80 ? 80 : n), s);
            hend = colon;
            portp = colon + 1;
        }
    }
    size_t hn = (size_t)(hend - h);
    if (hn == 0 || hn >= sizeof out->at[i].host)
        return errfmt(err, errlen, "\"%.*s\": expected host:port", (int)(n > 80 ? 80 : n), s);
    memcpy(out->at[i].host, h, hn);
    out->at[i].host[hn] = 0;
    out->at[i].port = SENTINEL_PORT;
    if (portp) {
        size_t pn = (size_t)(s + n - portp);
        long port = 0;
        for (size_t k = 0; k < pn; k++)
            port = isdigit((unsigned char)portp[k]) && port <= 65535 ? port * 10 + (portp[k] - '0') : -1;
        if (pn == 0 || pn > 5 || port < 1 || port > 65535)
            return errfmt(err, errlen, "\"%.*s\": the port is not a number in [1, 65535]",
                          (int)(n > 80 ? 80 : n), s);
        out->at[i].port = (int)port;
    }
    return 0;
}

int rq_sentinels_parse(const char *list, struct rq_sentinels *out, char *err, size_t errlen)
{
    out->n = 0;
    for (const char *p = list; *p;) {
        p += strspn(p, ", \t");
        size_t n = strcspn(p, ", \t");
        if (n == 0)
            break;
        if (out->n == RQ_SENTINELS_MAX)
            return errfmt(err, errlen, "at most %d sentinels", RQ_SENTINELS_MAX);
        if (parse_one(p, n, out, out->n, err, errlen))
            return -1;
        out->n++;
        p += n;
    }
    return 0;
}

void rq_sentinel_describe(const struct rq_sentinels *s, int i, char *buf, size_t len)
{
    const char *h = s->at[i].host;
    snprintf(buf, len, strchr(h, ':') ? "[%s]:%d" : "%s:%d", h, s->at[i].port);
}

/* One sentinel's answer: 0 with host/port, or -1 with why in msg. */
static int ask(const struct rq_sentinels *s, int i, int timeout_ms, char *host, size_t hostlen, int *port,
               char *msg, size_t msglen)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    redisContext *ctx = redisConnectWithTimeout(s->at[i].host, s->at[i].port, tv);
    if (!ctx || ctx->err) {
        snprintf(msg, msglen, "%s", ctx && ctx->errstr[0] ? ctx->errstr : "cannot connect");
        redisFree(ctx);
        return -1;
    }
    redisSetTimeout(ctx, tv);
    int rc = -1;
    redisReply *r = NULL;
    if (s->password[0]) {
        r = s->user[0] ? redisCommand(ctx, "AUTH %s %s", s->user, s->password)
                       : redisCommand(ctx, "AUTH %s", s->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(msg, msglen, "AUTH: %s", r ? r->str : ctx->errstr);
            goto out;
        }
        freeReplyObject(r);
    }
    r = redisCommand(ctx, "SENTINEL get-master-addr-by-name %s", s->master_name);
    if (!r)
        snprintf(msg, msglen, "%s", ctx->errstr[0] ? ctx->errstr : "no answer");
    else if (r->type == REDIS_REPLY_ERROR)
        snprintf(msg, msglen, "%s", r->str);
    else if (r->type == REDIS_REPLY_NIL)
        snprintf(msg, msglen, "it monitors no master named \"%s\"", s->master_name);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
             r->element[1]->type != REDIS_REPLY_STRING || r->element[0]->len >= hostlen)
        snprintf(msg, msglen, "unexpected answer to SENTINEL get-master-addr-by-name");
    else {
        snprintf(host, hostlen, "%s", r->element[0]->str);
        *port = atoi(r->element[1]->str);
        rc = 0;
    }
out:
    if (r)
        freeReplyObject(r);
    redisFree(ctx);
    return rc;
}

int rq_sentinel_master(const struct rq_sentinels *s, int timeout_ms, int *from, char *host, size_t hostlen,
                       int *port, char *msg, size_t msglen)
{
    size_t used = 0;
    msg[0] = 0;
    int start = *from >= 0 && *from < s->n ? *from : 0;
    for (int k = 0; k < s->n; k++) {
        int i = (start + k) % s->n;
        char why[300], addr[300];
        if (ask(s, i, timeout_ms, host, hostlen, port, why, sizeof why) == 0) {
            *from = i;
            return 0;
        }
        rq_sentinel_describe(s, i, addr, sizeof addr);
        if (used < msglen) {
            int w = snprintf(msg + used, msglen - used, "%ssentinel %s: %s", used ? "; " : "", addr, why);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    if (s->n == 0)
        snprintf(msg, msglen, "no sentinels configured");
    return -1;
}
