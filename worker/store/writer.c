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
    /* the worker's row, written again into a database created anew at the path (borrowed) */
    const struct db_worker *worker_row;
    bool need_worker_row; /* the database was created anew and has no workers row yet */
};

static void first_err(struct wk_batch *b, const char *what, const char *msg)
{
    if (!b->err[0])
        snprintf(b->err, sizeof b->err, "%s: %s", what, msg);
}

/* The writes of one batch, in order, on w->db. */
static void write_all(struct wk_writer *w, struct wk_batch *b)
{
    struct db *db = w->db;
    b->rc_worker = b->rc_results = b->rc_metrics = b->rc_touch = b->rc_batches = b->rc_parts = DB_OK;
    b->err[0] = 0;
    const struct db_worker *row = b->worker_row ? b->worker_row : w->need_worker_row ? w->worker_row : NULL;
    if (row) {
        int rc = db_put_worker(db, row);
        if (rc)
            first_err(b, "workers row", db_errmsg(db));
        else
            w->need_worker_row = false;
        if (b->worker_row || rc == DB_BUSY || rc == DB_UNWRITABLE)
            b->rc_worker = rc; /* the touch and the metrics below need the row */
    }
    if (b->nparts) {
        b->rc_parts = db_put_parts(db, b->parts, b->nparts);
        if (b->rc_parts)
            first_err(b, "job parts", db_errmsg(db));
    }
    if (b->nrows) {
        b->rc_results = db_put_results(db, b->rows, b->nrows, b->row_rc);
        if (b->rc_results)
            first_err(b, "results", db_errmsg(db));
    }
    /* a database that is locked (or unwritable) for results is so for the rest too: do not wait
     * twice; the rest is kept for the next batch */
    int halt = b->rc_results == DB_BUSY || b->rc_results == DB_UNWRITABLE ? b->rc_results
               : b->rc_parts == DB_BUSY || b->rc_parts == DB_UNWRITABLE   ? b->rc_parts
               : b->rc_worker == DB_BUSY || b->rc_worker == DB_UNWRITABLE ? b->rc_worker
                                                                          : DB_OK;
    if (b->nbatches && !halt) {
        b->rc_batches = db_put_batches(db, b->batches, b->nbatches);
        if (b->rc_batches)
            first_err(b, "batches", db_errmsg(db));
    } else if (b->nbatches) {
        b->rc_batches = halt;
    }
    if (b->nmetrics && !halt && b->rc_worker == DB_OK) {
        b->rc_metrics = db_put_metrics(db, b->metrics, b->nmetrics);
        if (b->rc_metrics)
            first_err(b, "metrics", db_errmsg(db));
    } else if (b->nmetrics) {
        b->rc_metrics = halt ? halt : DB_ERR;
    }
    if (b->touch_id && !halt && b->rc_worker == DB_OK) {
        b->rc_touch = db_touch_worker(db, b->touch_id, b->touch_now, b->jobs_done, b->stopped);
        if (b->rc_touch)
            first_err(b, "workers row", db_errmsg(db));
    } else if (b->touch_id) {
        b->rc_touch = halt ? halt : DB_ERR;
    }
}

/* Every write of b failed with DB_UNWRITABLE (why). */
static void all_unwritable(struct wk_batch *b, const char *why)
{
    b->rc_worker = b->worker_row ? DB_UNWRITABLE : DB_OK;
    b->rc_results = b->nrows ? DB_UNWRITABLE : DB_OK;
    b->rc_metrics = b->nmetrics ? DB_UNWRITABLE : DB_OK;
    b->rc_batches = b->nbatches ? DB_UNWRITABLE : DB_OK;
    b->rc_parts = b->nparts ? DB_UNWRITABLE : DB_OK;
    b->rc_touch = b->touch_id ? DB_UNWRITABLE : DB_OK;
    snprintf(b->err, sizeof b->err, "%s", why);
}

/* The path no longer names the open database (db_file_moved): opens it again. When the
 * connection was open until now, b->moved says what happened. DB_OK or db_reopen's code. */
static int reopen(struct wk_writer *w, struct wk_batch *b)
{
    bool was_open = db_handle(w->db) != NULL;
    char why[512];
    snprintf(why, sizeof why, "%s", db_errmsg(w->db));
    int rc = db_reopen(w->db);
    if (rc == DB_OK)
        w->need_worker_row = true;
    if (was_open && rc == DB_OK)
        snprintf(b->moved, sizeof b->moved,
                 "%s; a new database was created at %.300s and the rows of this "
                 "batch were written into it",
                 why, db_path(w->db));
    else if (was_open)
        snprintf(b->moved, sizeof b->moved, "%s; creating it again failed: %.600s", why, db_errmsg(w->db));
    return rc;
}

/* A batch: its writes, and again into a new database when the path turns out to name another file
 * (deleted or replaced), so that nothing counts as written that is not in the file at the path. */
static void run_batch(struct wk_writer *w, struct wk_batch *b)
{
    double t0 = db_now();
    b->moved[0] = 0;
    if (!w->db) /* no database (sqlite.path ""): every write succeeds, nothing is written */
        return;
    if (b->worker_row)
        w->worker_row = b->worker_row;
    for (int round = 0;; round++) {
        if (round == 3) { /* replaced again at every try */
            all_unwritable(b, db_errmsg(w->db));
            break;
        }
        if (db_file_moved(w->db) && reopen(w, b) != DB_OK) {
            all_unwritable(b, db_errmsg(w->db));
            break;
        }
        write_all(w, b);
        if (!db_file_moved(w->db))
            break;
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
        run_batch(w, b);
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
