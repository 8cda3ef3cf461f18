/* Redis addresses: parsing redis:// and unix:// URLs and redacting their passwords. See redis_url.h. */
#include "queue/redis_url.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/util/errfmt.h"

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Percent-decodes s[0..n) into out; -1 on a bad escape or when it does not fit. */
static int pct_decode(const char *s, size_t n, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (i + 2 >= n)
                return -1;
            int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
            if (h < 0 || l < 0)
                return -1;
            ch = h * 16 + l;
            i += 2;
        }
        if (o + 1 >= outlen)
            return -1;
        out[o++] = (char)ch;
    }
    out[o] = 0;
    return 0;
}

/* s[0..n) as a decimal number in [lo, 65535]; -1 when it is empty, longer than max_digits, has
 * anything but digits or is out of range. */
static long parse_u16(const char *s, size_t n, size_t max_digits, long lo)
{
    char buf[16];
    if (n == 0 || n > max_digits || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)buf[i]))
            return -1;
    long v = strtol(buf, NULL, 10);
    return v < lo || v > 65535 ? -1 : v;
}

static int parse_db(const char *s, size_t n, int *db, char *err, size_t errlen)
{
    long v = parse_u16(s, n, 15, 0);
    if (v < 0)
        return errfmt(err, errlen, "database must be a number in [0, 65535], got \"%.*s\"",
                      (int)(n > 20 ? 20 : n), s);
    *db = (int)v;
    return 0;
}

int rq_url_parse(const char *url, struct rq_addr *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->port = 6379;
    bool unix_sock;
    const char *p;
    if (!strncasecmp(url, "rediss://", 9))
        return errfmt(err, errlen, "rediss:// (TLS) is not supported; use redis:// or unix://");
    if (!strncasecmp(url, "redis://", 8)) {
        unix_sock = false;
        p = url + 8;
    } else if (!strncasecmp(url, "unix://", 7)) {
        unix_sock = true;
        p = url + 7;
    } else {
        char q[96];
        return errfmt(err, errlen, "expected redis://host:port[/db] or unix:///path.sock, got %s",
                      errfmt_quote(url, q, sizeof q));
    }
    const char *query = strchr(p, '?');
    const char *end = query ? query : p + strlen(p);
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *auth_end = slash ? slash : end;
    /* userinfo: the last '@' before the path */
    const char *at = NULL;
    for (const char *s = p; s < auth_end; s++)
        if (*s == '@')
            at = s;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
        if (pct_decode(p, ulen, out->user, sizeof out->user))
            return errfmt(err, errlen, "bad user name in the URL (a %% escape or too long)");
        if (colon && pct_decode(colon + 1, (size_t)(at - colon - 1), out->password, sizeof out->password))
            return errfmt(err, errlen, "bad password in the URL (a %% escape or too long)");
        p = at + 1;
    }
    if (unix_sock) {
        if (p != auth_end)
            return errfmt(err, errlen, "a unix:// URL takes no host: unix:///path/to/redis.sock");
        size_t n = (size_t)(end - p);
        if (n < 2)
            return errfmt(err, errlen, "missing socket path: unix:///path/to/redis.sock");
        if (n >= sizeof out->unix_path)
            return errfmt(err, errlen, "socket path too long");
        memcpy(out->unix_path, p, n);
        out->unix_path[n] = 0;
    } else {
        const char *hend = auth_end, *portp = NULL;
        if (*p == '[') {
            const char *rb = memchr(p, ']', (size_t)(auth_end - p));
            if (!rb)
                return errfmt(err, errlen, "unclosed '[' in the host");
            if (rb + 1 < auth_end) {
                if (rb[1] != ':')
                    return errfmt(err, errlen, "expected ':port' after ']'");
                portp = rb + 2;
            }
            p++;
            hend = rb;
        } else {
            const char *colon = memchr(p, ':', (size_t)(auth_end - p));
            if (colon) {
                hend = colon;
                portp = colon + 1;
            }
        }
        size_t hn = (size_t)(hend - p);
        if (hn == 0)
            return errfmt(err, errlen, "missing host: redis://host:port");
        if (hn >= sizeof out->host)
            return errfmt(err, errlen, "host name too long");
        memcpy(out->host, p, hn);
        out->host[hn] = 0;
        if (portp) {
            size_t pn = (size_t)(auth_end - portp);
            long port = parse_u16(portp, pn, 9, 1);
            if (port < 0)
                return errfmt(err, errlen, "port \"%.*s\" is not a number in [1, 65535]",
                              (int)(pn > 20 ? 20 : pn), portp);
            out->port = (int)port;
        }
        if (slash && slash + 1 < end && parse_db(slash + 1, (size_t)(end - slash - 1), &out->db, err, errlen))
            return -1;
    }
    if (query) {
        const char *s = query + 1;
        while (*s) {
            size_t n = strcspn(s, "&");
            if (n > 3 && !strncmp(s, "db=", 3)) {
                if (parse_db(s + 3, n - 3, &out->db, err, errlen))
                    return -1;
            } else {
                return errfmt(err, errlen, "unknown URL parameter \"%.*s\" (only db=N)",
                              (int)(n > 40 ? 40 : n), s);
            }
            s += n + (s[n] == '&');
        }
    }
    return 0;
}

void rq_url_redact(const char *url, char *buf, size_t len)
{
    snprintf(buf, len, "%s", url);
    char *auth = strstr(buf, "://");
    if (!auth)
        return;
    auth += 3;
    /* the parser takes the LAST '@' before the path as the end of the credentials */
    char *slash = strchr(auth, '/');
    char *at = NULL;
    for (char *p = auth; *p && (!slash || p < slash); p++)
        if (*p == '@')
            at = p;
    if (!at)
        return;
    char *colon = memchr(auth, ':', (size_t)(at - auth));
    if (!colon || colon + 1 == at)
        return;
    char rest[512];
    snprintf(rest, sizeof rest, "%s", at);
    snprintf(colon + 1, len - (size_t)(colon + 1 - buf), "****%s", rest);
}
