/* See redis_gate.h. */
#include "worker/loop/redis_gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue/conn.h"

#define PROBE_MS 200 /* between two failed probes */

/* The probe thread's state. Owned by the gate until wk_gate_stop, then by the thread. */
struct wk_probe {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rq_conn conn;
    bool want;     /* the gate is closed: probe */
    bool answered; /* Redis answered since `want` was set */
    bool stop;
    char err[400];
};

static void probe_free(struct wk_probe *p)
{
    rq_conn_close(&p->conn);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Connect and PING; 0 when Redis answered. The connection is closed again either way: an idle
 * probe holds no connection. */
static int probe_once(struct wk_probe *p, char *err, size_t len)
{
    int rc = -1;
    redisReply *r = rq_conn_connect_now(&p->conn) ? NULL : rq_conn_command(&p->conn, "PING");
    if (r) {
        rc = r->type == REDIS_REPLY_ERROR ? -1 : 0;
        if (rc)
            snprintf(err, len, "PING: %.*s", (int)r->len, r->str);
        freeReplyObject(r);
    } else {
        snprintf(err, len, "%.*s", (int)len - 1, p->conn.last_error[0] ? p->conn.last_error : p->conn.err);
    }
    rq_conn_close(&p->conn);
    return rc;
}

static void *probe_main(void *arg)
{
    struct wk_probe *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (!p->want || p->answered) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        pthread_mutex_unlock(&p->mu);
        char err[sizeof p->err];
        int rc = probe_once(p, err, sizeof err);
        pthread_mutex_lock(&p->mu);
        if (rc == 0) {
            p->answered = true;
            continue;
        }
        snprintf(p->err, sizeof p->err, "%s", err);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += PROBE_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&p->mu);
    probe_free(p);
    return NULL;
}

int wk_gate_start(struct wk_gate *g, const struct rq_conn *like, const char *client_name, char *err,
                  size_t errlen)
{
    memset(g, 0, sizeof *g);
    struct wk_probe *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rq_conn_init(&p->conn, &like->addr, "probe", like->connect_timeout_ms, like->cmd_timeout_ms,
                 like->reconnect_max_ms);
    p->conn.quiet = true; /* the worker logs the outage once for all its connections */
    p->conn.sentinel = like->sentinel; /* with Sentinel, the probe asks where the master is now */
    snprintf(p->conn.client_name, sizeof p->conn.client_name, "%s", client_name);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = pthread_create(&p->th, NULL, probe_main, p);
    if (rc) {
        snprintf(err, errlen, "redis: cannot start the probe thread: %s", strerror(rc));
        probe_free(p);
        return -1;
    }
    g->probe = p;
    return 0;
}

void wk_gate_stop(struct wk_gate *g)
{
    struct wk_probe *p = g->probe;
    if (!p)
        return;
    g->probe = NULL;
    pthread_t th = p->th;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_detach(th); /* p is the thread's from here on */
}

void wk_gate_close(struct wk_gate *g, double now)
{
    if (g->closed)
        return;
    g->closed = true;
    g->closed_since = now;
    struct wk_probe *p = g->probe;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->want = true;
    p->answered = false;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

bool wk_gate_answered(struct wk_gate *g)
{
    struct wk_probe *p = g->probe;
    if (!g->closed)
        return false;
    if (!p) /* no probe (it could not start): try again at every check */
        return true;
    pthread_mutex_lock(&p->mu);
    bool a = p->answered;
    pthread_mutex_unlock(&p->mu);
    return a;
}

void wk_gate_reopen(struct wk_gate *g)
{
    g->closed = false;
    g->next_log = 0;
    struct wk_probe *p = g->probe;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->want = false;
    p->answered = false;
    pthread_mutex_unlock(&p->mu);
}

void wk_gate_error(struct wk_gate *g, char *buf, size_t len)
{
    struct wk_probe *p = g->probe;
    if (!p) {
        snprintf(buf, len, "no probe");
        return;
    }
    pthread_mutex_lock(&p->mu);
    snprintf(buf, len, "%s", p->err[0] ? p->err : "no answer yet");
    pthread_mutex_unlock(&p->mu);
}

void wk_gate_lease(struct wk_gate *g, double sent, int ttl_s)
{
    g->lease_until = sent + ttl_s;
}

bool wk_gate_leased(const struct wk_gate *g, double now)
{
    return now < g->lease_until;
}
