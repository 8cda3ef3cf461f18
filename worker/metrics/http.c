/* See http.h. */
#include "worker/metrics/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "engine/util/log.h"

struct wk_http {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    int published;          /* a snapshot is there */
    struct wk_snapshot *s;  /* the last published (owned) */
    struct wk_snapshot *rd; /* the handler's copy (owned; one request at a time: one thread) */
    double next_log;        /* monotonic: no libmicrohttpd line before this */
    int suppressed;         /* its lines not shown since the last one */
};

/* Connections: far more than scrapers and probes need, so that a few dozen idle or slow ones (a
 * port scan, a slowloris client) leave room for /health; each is closed after IDLE_S without a
 * byte. The server polls (not select), so descriptors past FD_SETSIZE are no problem. */
#define MAX_CONNECTIONS 256u
#define IDLE_S 3u
#define LOG_EVERY_S 10.0 /* libmicrohttpd's lines (a refused connection each): at most one per this */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs on the server's thread only. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct wk_http *h = cls;
    double now = mono_s();
    if (now < h->next_log) {
        h->suppressed++;
        return;
    }
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    if (h->suppressed)
        log_warn("metrics http: %s (%d more such line%s in the last %.0f s not shown)", msg, h->suppressed,
                 h->suppressed == 1 ? "" : "s", LOG_EVERY_S);
    else
        log_warn("metrics http: %s", msg);
    h->suppressed = 0;
    h->next_log = now + LOG_EVERY_S;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type, char *body,
                             size_t len, int owned)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned code, const char *msg)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s\n", msg);
    return reply(c, code, "text/plain; charset=utf-8", buf,
                 n < 0                    ? 0
                 : (size_t)n < sizeof buf ? (size_t)n
                                          : sizeof buf - 1,
                 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct wk_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD");
    int is_metrics = !strcmp(url, "/metrics"), is_health = !strcmp(url, "/health");
    if (!is_metrics && !is_health)
        return text(c, MHD_HTTP_NOT_FOUND,
                    strcmp(url, "/") ? "not found (try /metrics or /health)"
                                     : "llmq worker: /metrics, /health");
    pthread_mutex_lock(&h->mu);
    int have = h->published;
    if (have)
        *h->rd = *h->s;
    pthread_mutex_unlock(&h->mu);
    if (is_health) {
        char why[512];
        if (!have)
            return text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "starting: the engine is not ready");
        int ok = wk_metrics_health(h->rd, why, sizeof why);
        return text(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, why);
    }
    if (!have)
        return text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "starting: no metrics yet");
    struct prom p;
    prom_init(&p);
    if (wk_metrics_format(h->rd, &p)) {
        char msg[300];
        snprintf(msg, sizeof msg, "formatting the metrics failed: %s", p.errmsg);
        log_error("metrics http: %s", msg);
        prom_free(&p);
        return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, msg);
    }
    size_t len;
    char *body = prom_take(&p, &len);
    if (!body)
        return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    return reply(c, MHD_HTTP_OK, PROM_CONTENT_TYPE, body, len, 1);
}

int wk_http_start(const char *address, int port, struct wk_http **out, char *err, size_t errlen)
{
    *out = NULL;
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "metrics: port %d is out of range", port);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
                    *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int g = getaddrinfo(address, service, &hints, &ai);
    if (g || !ai) {
        snprintf(err, errlen, "metrics: listen address \"%s\": %s", address,
                 g ? gai_strerror(g) : "no address");
        if (ai)
            freeaddrinfo(ai);
        return -1;
    }
    struct wk_http *h = calloc(1, sizeof *h);
    if (h) {
        h->s = calloc(1, sizeof *h->s);
        h->rd = calloc(1, sizeof *h->rd);
    }
    if (!h || !h->s || !h->rd) {
        if (h) {
            free(h->s);
            free(h->rd);
        }
        free(h);
        freeaddrinfo(ai);
        snprintf(err, errlen, "metrics: out of memory");
        return -1;
    }
    pthread_mutex_init(&h->mu, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* the server's thread inherits this mask: signals go to the worker loop */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                            MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, IDLE_S, MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    freeaddrinfo(ai);
    if (!h->d) {
        snprintf(err, errlen, "metrics: cannot listen on %s port %d (in use, or not an address of this host)",
                 address, port);
        wk_http_stop(h);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di && di->port ? di->port : port;
    *out = h;
    return 0;
}

int wk_http_port(const struct wk_http *h)
{
    return h->port;
}

void wk_http_publish(struct wk_http *h, const struct wk_snapshot *s)
{
    pthread_mutex_lock(&h->mu);
    *h->s = *s;
    h->published = 1;
    pthread_mutex_unlock(&h->mu);
}

void wk_http_stop(struct wk_http *h)
{
    if (!h)
        return;
    if (h->d)
        MHD_stop_daemon(h->d);
    if (h->suppressed) /* the server's thread has ended */
        log_warn("metrics http: %d more line%s (refused or broken connections) in the last %.0f s not shown",
                 h->suppressed, h->suppressed == 1 ? "" : "s", LOG_EVERY_S);
    pthread_mutex_destroy(&h->mu);
    free(h->s);
    free(h->rd);
    free(h);
}
