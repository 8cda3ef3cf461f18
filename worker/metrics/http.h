/* The worker's HTTP endpoint (libmicrohttpd): GET /metrics (Prometheus text, docs/METRICS.md)
 * and GET /health (200 "ok", or 503 with the reason).
 *
 *     struct wk_http *h;
 *     if (wk_http_start("127.0.0.1", 9464, &h, err, sizeof err)) ... err ...;
 *     log("metrics on port %d", wk_http_port(h));     // the bound port (port 0 = any free one)
 *     wk_http_publish(h, &snapshot);                    // from the worker loop, now and then
 *     wk_http_stop(h);
 *
 * Threading: libmicrohttpd answers on its own thread (MHD_USE_INTERNAL_POLLING_THREAD). That
 * thread reads only the last published snapshot, copied under a mutex; it never touches the
 * engine, Redis or SQLite. SIGTERM, SIGINT and SIGHUP are blocked on it, so signals reach the
 * worker loop's thread. Until the first publish, /metrics answers 503 and /health "starting".
 *
 * Hostile clients: up to 256 connections at once, each closed after 3 s without a byte, so a few
 * dozen slow or idle ones leave /health answering; libmicrohttpd's own lines (one per refused
 * connection) are logged at most once per 10 s with a count of those not shown. */
#pragma once
#include <stddef.h>

#include "worker/metrics/metrics.h"

struct wk_http;

/* Binds address:port (a numeric IPv4 or IPv6 address, or a host name resolved once) and starts
 * serving. 0 with *out (the caller owns it: wk_http_stop), or -1 with err (address in use, bad
 * address, ...). */
int wk_http_start(const char *address, int port, struct wk_http **out, char *err, size_t errlen);

/* The port it listens on. */
int wk_http_port(const struct wk_http *h);

/* Copies s as what the next requests see. */
void wk_http_publish(struct wk_http *h, const struct wk_snapshot *s);

/* Stops the thread (requests in progress finish) and frees h. Accepts NULL. */
void wk_http_stop(struct wk_http *h);
