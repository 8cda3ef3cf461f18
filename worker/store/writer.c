/* See writer.h. */
#include "worker/store/writer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wk_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* signals the thread: work or quit */
    pthread_cond_t done_cv; /* signals the caller: the batch is done */
    struct db *db;
    struct wk_batch *todo;    /* submitted, not yet taken by the thread */
    struct wk_batch *running; /* the thread works on it */
    struct wk_batch *done;    /* finished, not yet polled */
    bool inflight;            /* submitted and not yet polled */
    bool quit;
};

static void first_err(struct wk_batch *b, const char *what, const char *msg)
{
    if (!b->err[0])
        snprintf(b->err, sizeof b->err, "%s: %s", what, msg);
}

static void run_batch(struct db *db, struct wk_batch *b)
{
    double t0 = db_now();
    b->rc_worker = b->rc_results = b->rc_metrics = b->rc_touch = b->rc_batches = DB_OK;
    b->err[0] = 0;
    if (b->worker_row) {
        b->rc_worker = db_put_worker(db, b->worker_row);
        if (b->rc_worker)
            first_err(b, "workers row", db_errmsg(db));
    }
    if (b->nrows) {
        b->rc_results = db_put_results(db, b->rows, b->nrows, b->row_rc);
        if (b->rc_results)
            first_err(b, "results", db_errmsg(db));
    }
    /* a database that is locked for results is locked for the rest too: do not wait twice */
    bool busy = b->rc_results == DB_BUSY || b->rc_worker == DB_BUSY;
    if (b->nbatches && !busy) {
        b->rc_batches = db_put_batches(db, b->batches, b->nbatches);
        if (b->rc_batches)
            first_err(b, "batches", db_errmsg(db));
    } else if (b->nbatches) {
        b->rc_batches = DB_BUSY;
    }
    if (b->nmetrics && !busy && b->rc_worker == DB_OK) {
        b->rc_metrics = db_put_metrics(db, b->metrics, b->nmetrics);
        if (b->rc_metrics)
            first_err(b, "metrics", db_errmsg(db));
    } else if (b->nmetrics) {
        b->rc_metrics = busy ? DB_BUSY : DB_ERR;
    }
    if (b->touch_id && !busy && b->rc_worker == DB_OK) {
        b->rc_touch = db_touch_worker(db, b->touch_id, b->touch_now, b->jobs_done, b->stopped);
        if (b->rc_touch)
            first_err(b, "workers row", db_errmsg(db));
    } else if (b->touch_id) {
        b->rc_touch = busy ? DB_BUSY : DB_ERR;
    }
    b->write_ms = (db_now() - t0) * 1e3;
}

static void *thread_main(void *arg)
{
    struct wk_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->todo && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->todo)
            break; /* quit with nothing left */
        struct wk_batch *b = w->todo;
        w->todo = NULL;
        w->running = b;
        pthread_mutex_unlock(&w->mu);
        run_batch(w->db, b);
        pthread_mutex_lock(&w->mu);
        w->running = NULL;
        w->done = b;
        pthread_cond_broadcast(&w->done_cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int wk_writer_start(struct db *db, struct wk_writer **out, char *err, size_t errlen)
{
    *out = NULL;
    struct wk_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    w->db = db;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->done_cv, NULL);
    /* the thread takes no signals: SIGTERM and SIGINT are the main loop's */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->thread, NULL, thread_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        snprintf(err, errlen, "cannot start the SQLite writer thread: %s", strerror(rc));
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_cond_destroy(&w->done_cv);
        free(w);
        return -1;
    }
    *out = w;
    return 0;
}

int wk_writer_submit(struct wk_writer *w, struct wk_batch *b)
{
    pthread_mutex_lock(&w->mu);
    if (w->inflight) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    w->inflight = true;
    w->todo = b;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

bool wk_writer_busy(const struct wk_writer *w)
{
    return w->inflight; /* only the caller's thread changes it */
}

static struct wk_batch *take_done(struct wk_writer *w)
{
    struct wk_batch *b = w->done;
    if (b) {
        w->done = NULL;
        w->inflight = false;
    }
    return b;
}

struct wk_batch *wk_writer_poll(struct wk_writer *w)
{
    if (!w->inflight)
        return NULL;
    pthread_mutex_lock(&w->mu);
    struct wk_batch *b = take_done(w);
    pthread_mutex_unlock(&w->mu);
    return b;
}

struct wk_batch *wk_writer_wait(struct wk_writer *w, int timeout_ms)
{
    if (!w->inflight)
        return NULL;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->done) {
        int rc = pthread_cond_timedwait(&w->done_cv, &w->mu, &until);
        if (rc == ETIMEDOUT)
            break;
    }
    struct wk_batch *b = take_done(w);
    pthread_mutex_unlock(&w->mu);
    return b;
}

int wk_writer_stop(struct wk_writer *w, int wait_ms)
{
    if (!w)
        return 0;
    if (w->inflight)
        wk_writer_wait(w, wait_ms);
    pthread_mutex_lock(&w->mu);
    bool stuck = w->todo || w->running;
    w->quit = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (stuck) { /* leave it: the process exits soon, and the batch stays valid until then */
        pthread_detach(w->thread);
        return 1;
    }
    pthread_join(w->thread, NULL);
    db_close(w->db);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->done_cv);
    free(w);
    return 0;
}
