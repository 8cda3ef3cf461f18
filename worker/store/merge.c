/* Merging one llmq database into another; see merge.h. */
#include "worker/store/merge.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "engine/util/array.h"
#include "worker/store/db.h"

/* What a callback returns to stop the read when it failed (err is set): not a DB_* code. */
enum { STOP = 1 };

struct merge {
    struct db *src, *dst;
    size_t cap; /* rows per transaction */
    struct merge_stats *st;
    struct db_result **jobs; /* pending rows, each from db_result_dup */
    struct db_result *flat;  /* their values, for db_put_results */
    int *row_rc;
    size_t n_jobs;
    struct db_batch *batches; /* pending batch rows; strings owned (free_batch) */
    size_t n_batches;
    struct db_worker_row *workers; /* pending worker rows; strings owned (free_worker) */
    size_t n_workers;
    struct db_metrics *metrics; /* pending metrics rows; worker_id owned */
    size_t n_metrics;
    struct db_result *found; /* the target's row of the id being merged (lookup) */
    char *err;
    size_t errlen;
    char rejected_err[512]; /* why the first row the target refused was refused */
};

/* ---- jobs */

static int take_found(void *ctx, const struct db_result *row)
{
    struct merge *m = ctx;
    m->found = db_result_dup(row);
    return m->found ? 0 : STOP;
}

/* Whether a, of the same rank as b, is the later processing: finished_at, then worker_id. */
static bool later(const struct db_result *a, const struct db_result *b)
{
    if (a->finished_at != b->finished_at)
        return a->finished_at > b->finished_at;
    const char *wa = a->worker_id ? a->worker_id : "", *wb = b->worker_id ? b->worker_id : "";
    return strcmp(wa, wb) > 0;
}

static int flush_jobs(struct merge *m)
{
    if (m->n_jobs == 0)
        return 0;
    for (size_t i = 0; i < m->n_jobs; i++)
        m->flat[i] = *m->jobs[i];
    int rc = db_put_results(m->dst, m->flat, m->n_jobs, m->row_rc);
    size_t written = m->n_jobs;
    if (rc == DB_ERR_ROW) { /* the others are committed: the refused ones are counted, not retried */
        for (size_t i = 0; i < m->n_jobs; i++)
            if (m->row_rc[i] == DB_ERR_ROW) {
                written--;
                m->st->jobs.rejected++;
            }
        if (!m->rejected_err[0])
            snprintf(m->rejected_err, sizeof m->rejected_err, "%s", db_errmsg(m->dst));
        rc = DB_OK;
    }
    for (size_t i = 0; i < m->n_jobs; i++)
        free(m->jobs[i]);
    m->n_jobs = 0;
    if (rc != DB_OK) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return STOP;
    }
    m->st->jobs.written += (int64_t)written;
    return 0;
}

/* One source row: compared with the target's row of its id, queued for writing when it changes it. */
static int merge_job(void *ctx, const struct db_result *row)
{
    struct merge *m = ctx;
    m->st->jobs.read++;
    struct db_query q = db_query_all();
    q.id = row->id;
    m->found = NULL;
    int rc = db_query_results(m->dst, &q, take_found, m);
    struct db_result *t = m->found, *put = NULL;
    m->found = NULL;
    if (rc) {
        snprintf(m->err, m->errlen, "%s", rc == STOP ? "out of memory" : db_errmsg(m->dst));
        free(t);
        return STOP;
    }
    bool oom = false;
    if (!t) {
        oom = !(put = db_result_dup(row));
    } else if (!db_result_same(row, t)) {
        int rs = db_status_rank((int)row->status), rt = db_status_rank((int)t->status);
        if (rs > rt || (rs == rt && later(row, t))) {
            oom = !(put = db_result_dup(row)); /* the upsert keeps the larger attempts */
        } else if (row->attempts > t->attempts) {
            t->attempts = row->attempts; /* the target's row stays, counting the source's attempts */
            put = t;
            t = NULL;
        }
    }
    free(t);
    if (oom) {
        snprintf(m->err, m->errlen, "out of memory");
        return STOP;
    }
    if (!put) {
        m->st->jobs.kept++;
        return 0;
    }
    m->jobs[m->n_jobs++] = put;
    return m->n_jobs == m->cap ? flush_jobs(m) : 0;
}

/* ---- batches */

static void free_batch(struct db_batch *b)
{
    free((char *)b->id);
    free((char *)b->input);
    free((char *)b->state);
}

/* A copy of b with its strings owned; false when out of memory (then nothing is owned). */
static bool dup_batch(const struct db_batch *b, struct db_batch *out)
{
    *out = *b;
    out->id = strdup(b->id);
    out->input = b->input ? strdup(b->input) : NULL;
    out->state = b->state ? strdup(b->state) : NULL;
    if (out->id && (out->input || !b->input) && (out->state || !b->state))
        return true;
    free_batch(out);
    return false;
}

/* queued 0 < running 1 < completed, cancelled 2; NULL (unknown) -1. */
static int state_rank(const char *s)
{
    if (!s)
        return -1;
    return !strcmp(s, "queued") ? 0 : !strcmp(s, "running") ? 1 : 2;
}

static bool same_text(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Whether batch a is further along than b: its state (queued < running < completed, cancelled),
 * then the later finished_at, then the larger total (a batch grows with enqueue --append). */
static bool batch_later(const struct db_batch *a, const struct db_batch *b)
{
    int ra = state_rank(a->state), rb = state_rank(b->state);
    if (ra != rb)
        return ra > rb;
    double fa = isnan(a->finished_at) ? -1 : a->finished_at, fb = isnan(b->finished_at) ? -1 : b->finished_at;
    if (fa != fb)
        return fa > fb;
    return a->total > b->total;
}

static bool same_batch(const struct db_batch *a, const struct db_batch *b)
{
    bool fin = a->finished_at == b->finished_at || (isnan(a->finished_at) && isnan(b->finished_at));
    bool cre = a->created_at == b->created_at || (isnan(a->created_at) && isnan(b->created_at));
    return same_text(a->input, b->input) && same_text(a->state, b->state) && a->total == b->total && fin &&
           cre;
}

/* The row the target should hold after src meets its row t (borrowing their strings): the later
 * of the two, with input and created_at filled in from the other where it has none. */
static struct db_batch merged_batch(const struct db_batch *src, const struct db_batch *t)
{
    struct db_batch m = batch_later(src, t) ? *src : *t;
    const struct db_batch *o = batch_later(src, t) ? t : src;
    if (!m.input)
        m.input = o->input;
    if (isnan(m.created_at))
        m.created_at = o->created_at;
    if (m.total < 0)
        m.total = o->total;
    if (!m.state)
        m.state = o->state;
    return m;
}

static int flush_batches(struct merge *m)
{
    if (m->n_batches == 0)
        return 0;
    int rc = db_put_batches(m->dst, m->batches, m->n_batches);
    size_t n = m->n_batches;
    for (size_t i = 0; i < n; i++)
        free_batch(&m->batches[i]);
    m->n_batches = 0;
    if (rc != DB_OK) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return STOP;
    }
    m->st->batches.written += (int64_t)n;
    return 0;
}

struct batch_probe {
    struct merge *m;
    const struct db_batch *src;
    int found; /* -1 the target has no row, 0 its row stays as it is, 1 queued for writing, 2 no memory */
};

static int probe_batch(void *ctx, const struct db_batch *t)
{
    struct batch_probe *p = ctx;
    struct db_batch want = merged_batch(p->src, t);
    p->found = 0;
    if (same_batch(&want, t))
        return 0;
    p->found = dup_batch(&want, &p->m->batches[p->m->n_batches]) ? 1 : 2;
    return 0;
}

static int merge_batch(void *ctx, const struct db_batch *b)
{
    struct merge *m = ctx;
    m->st->batches.read++;
    struct batch_probe p = {m, b, -1};
    int rc = db_query_batches(m->dst, b->id, probe_batch, &p);
    if (rc) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return STOP;
    }
    if (p.found == 0) {
        m->st->batches.kept++;
        return 0;
    }
    if (p.found == 2 || (p.found == -1 && !dup_batch(b, &m->batches[m->n_batches]))) {
        snprintf(m->err, m->errlen, "out of memory");
        return STOP;
    }
    m->n_batches++;
    return m->n_batches == m->cap ? flush_batches(m) : 0;
}

/* ---- workers and metrics */

static void free_worker(struct db_worker_row *w)
{
    free((char *)w->w.id);
    free((char *)w->w.host);
    free((char *)w->w.gpu);
    free((char *)w->w.model);
    free((char *)w->w.backend);
    free((char *)w->w.version);
}

static char *dup_opt(const char *s, bool *oom)
{
    char *d = s ? strdup(s) : NULL;
    *oom |= s && !d;
    return d;
}

static int flush_workers(struct merge *m)
{
    int rc = m->n_workers ? db_put_worker_rows(m->dst, m->workers, m->n_workers) : DB_OK;
    for (size_t i = 0; i < m->n_workers; i++)
        free_worker(&m->workers[i]);
    if (rc == DB_OK)
        m->st->workers.written += (int64_t)m->n_workers;
    m->n_workers = 0;
    if (rc != DB_OK)
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
    return rc == DB_OK ? 0 : STOP;
}

struct worker_probe {
    const struct db_worker_row *src;
    bool found, write;
};

static int probe_worker(void *ctx, const struct db_worker_row *t)
{
    struct worker_probe *p = ctx;
    const struct db_worker_row *s = p->src;
    p->found = true;
    p->write = s->w.started_at != t->w.started_at ? s->w.started_at > t->w.started_at
                                                  : s->last_seen_at > t->last_seen_at;
    return 0;
}

static int merge_worker(void *ctx, const struct db_worker_row *row)
{
    struct merge *m = ctx;
    m->st->workers.read++;
    struct worker_probe p = {row, false, false};
    if (db_query_workers(m->dst, row->w.id, probe_worker, &p)) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return STOP;
    }
    if (p.found && !p.write) {
        m->st->workers.kept++;
        return 0;
    }
    struct db_worker_row *d = &m->workers[m->n_workers];
    bool oom = false;
    *d = *row;
    d->w.id = dup_opt(row->w.id, &oom);
    d->w.host = dup_opt(row->w.host, &oom);
    d->w.gpu = dup_opt(row->w.gpu, &oom);
    d->w.model = dup_opt(row->w.model, &oom);
    d->w.backend = dup_opt(row->w.backend, &oom);
    d->w.version = dup_opt(row->w.version, &oom);
    if (oom) {
        free_worker(d);
        snprintf(m->err, m->errlen, "out of memory");
        return STOP;
    }
    m->n_workers++;
    return m->n_workers == m->cap ? flush_workers(m) : 0;
}

static int flush_metrics(struct merge *m)
{
    int rc = m->n_metrics ? db_put_metrics(m->dst, m->metrics, m->n_metrics) : DB_OK;
    for (size_t i = 0; i < m->n_metrics; i++)
        free((char *)m->metrics[i].worker_id);
    if (rc == DB_OK)
        m->st->metrics.written += (int64_t)m->n_metrics;
    m->n_metrics = 0;
    if (rc != DB_OK)
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
    return rc == DB_OK ? 0 : STOP;
}

static int found_metrics(void *ctx, const struct db_metrics *row)
{
    (void)row;
    *(bool *)ctx = true;
    return 0;
}

static int merge_metrics(void *ctx, const struct db_metrics *row)
{
    struct merge *m = ctx;
    m->st->metrics.read++;
    bool found = false;
    if (db_query_metrics(m->dst, row->worker_id, row->ts, found_metrics, &found)) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return STOP;
    }
    if (found) {
        m->st->metrics.kept++;
        return 0;
    }
    struct db_metrics *d = &m->metrics[m->n_metrics];
    *d = *row;
    if (!(d->worker_id = strdup(row->worker_id))) {
        snprintf(m->err, m->errlen, "out of memory");
        return STOP;
    }
    m->n_metrics++;
    return m->n_metrics == m->cap ? flush_metrics(m) : 0;
}

/* ---- the source */

/* Whether a and b name the same file (b may not exist yet: then not). */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Copies the database at src into the new file at dst (VACUUM INTO, from a read-only connection). */
static int copy_db(const char *src, const char *dst, char *err, size_t errlen)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_open_v2(src, &h, SQLITE_OPEN_READONLY, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(h, "VACUUM INTO ?1", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, dst, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc != SQLITE_OK)
        snprintf(err, errlen, "%s: copying its older schema to %s to migrate the copy: %s", src, dst,
                 h ? sqlite3_errmsg(h) : sqlite3_errstr(rc));
    sqlite3_finalize(st);
    sqlite3_close(h);
    return rc == SQLITE_OK ? 0 : -1;
}

static void remove_db_files(const char *path)
{
    char name[4200];
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        snprintf(name, sizeof name, "%s%s", path, suffix[i]);
        unlink(name);
    }
}

/* Opens the source for reading: itself, or a migrated copy at tmp (tmp[0] = 0 when none). */
static int open_source(struct db *target, const char *path, struct db **out, char *tmp, size_t tmplen,
                       char *err, size_t errlen)
{
    tmp[0] = 0;
    if (access(path, F_OK) != 0) {
        snprintf(err, errlen, "%s: cannot read it: %s", path, strerror(errno));
        return -1;
    }
    if (same_file(path, db_path(target))) {
        snprintf(err, errlen, "%s: it is the target database itself; name another file", path);
        return -1;
    }
    struct db_opts o = db_opts_default();
    o.readonly = true;
    int rc = db_open(path, &o, out, err, errlen);
    if (rc != DB_ERR_OLDER)
        return rc ? -1 : 0;
    snprintf(tmp, tmplen, "%s.merge-XXXXXX", db_path(target));
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, errlen, "%s: its schema is older; a temporary copy %s cannot be made: %s", path, tmp,
                 strerror(errno));
        tmp[0] = 0;
        return -1;
    }
    close(fd);
    if (copy_db(path, tmp, err, errlen) != 0)
        return -1;
    if (db_open(tmp, NULL, out, err, errlen) != DB_OK)
        return -1;
    return 0;
}

/* ---- rows one at a time */

struct merge *merge_open(struct db *target, size_t batch_rows, struct merge_stats *st, char *err,
                         size_t errlen)
{
    struct merge *m = calloc(1, sizeof *m);
    if (m) {
        *m = (struct merge){
            .dst = target, .cap = batch_rows ? batch_rows : 1000, .st = st, .err = err, .errlen = errlen};
        memset(st, 0, sizeof *st);
    }
    if (!m || array_resize(&m->jobs, m->cap, sizeof *m->jobs) ||
        array_resize(&m->flat, m->cap, sizeof *m->flat) ||
        array_resize(&m->row_rc, m->cap, sizeof *m->row_rc) ||
        array_resize(&m->batches, m->cap, sizeof *m->batches) ||
        array_resize(&m->workers, m->cap, sizeof *m->workers) ||
        array_resize(&m->metrics, m->cap, sizeof *m->metrics)) {
        snprintf(err, errlen, "out of memory");
        merge_close(m);
        return NULL;
    }
    return m;
}

void merge_close(struct merge *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_jobs; i++)
        free(m->jobs[i]);
    for (size_t i = 0; i < m->n_batches; i++)
        free_batch(&m->batches[i]);
    for (size_t i = 0; i < m->n_workers; i++)
        free_worker(&m->workers[i]);
    for (size_t i = 0; i < m->n_metrics; i++)
        free((char *)m->metrics[i].worker_id);
    free(m->workers);
    free(m->metrics);
    free(m->jobs);
    free(m->flat);
    free(m->row_rc);
    free(m->batches);
    free(m);
}

int merge_add_job(struct merge *m, const struct db_result *row)
{
    return merge_job(m, row) ? -1 : 0;
}

int merge_add_batch(struct merge *m, const struct db_batch *row)
{
    return merge_batch(m, row) ? -1 : 0;
}

int merge_add_worker(struct merge *m, const struct db_worker_row *row)
{
    /* written at once: a later row of the same worker is then compared with this one */
    return flush_workers(m) || merge_worker(m, row) || flush_workers(m) ? -1 : 0;
}

static int found_worker(void *ctx, const struct db_worker_row *row)
{
    (void)row;
    *(bool *)ctx = true;
    return 0;
}

int merge_add_metrics(struct merge *m, const struct db_metrics *row)
{
    if (flush_workers(m))
        return -1;
    bool known = false;
    if (db_query_workers(m->dst, row->worker_id, found_worker, &known)) {
        snprintf(m->err, m->errlen, "%s", db_errmsg(m->dst));
        return -1;
    }
    if (!known) { /* its workers row never came: a placeholder any real row replaces */
        struct db_worker_row w = {.w = {.id = row->worker_id, .pid = -1, .started_at = 0}};
        w.last_seen_at = w.stopped_at = NAN;
        if (merge_worker(m, &w) || flush_workers(m))
            return -1;
    }
    return merge_metrics(m, row) ? -1 : 0;
}

const char *merge_rejected(const struct merge *m)
{
    return m->rejected_err;
}

int merge_flush(struct merge *m)
{
    /* after the workers: a metrics row names its worker (a foreign key) */
    return flush_batches(m) || flush_workers(m) || flush_metrics(m) || flush_jobs(m) ? -1 : 0;
}

int merge_db(struct db *target, const char *source_path, size_t batch_rows, struct merge_stats *st, char *err,
             size_t errlen)
{
    memset(st, 0, sizeof *st);
    char tmp[4200];
    struct db *src = NULL;
    if (open_source(target, source_path, &src, tmp, sizeof tmp, err, errlen) != 0) {
        if (tmp[0])
            remove_db_files(tmp);
        return -1;
    }
    struct merge *m = merge_open(target, batch_rows, st, err, errlen);
    int rc = -1;
    if (m) {
        /* STOP: a callback or flush failed and set err; DB_ERR / DB_BUSY: reading the source failed */
        int q = db_query_batches(src, NULL, merge_batch, m);
        if (q == 0)
            q = flush_batches(m);
        if (q == 0)
            q = db_query_workers(src, NULL, merge_worker, m);
        if (q == 0)
            q = flush_workers(m);
        if (q == 0) /* after the workers: a metrics row names its worker (a foreign key) */
            q = db_query_metrics(src, NULL, NAN, merge_metrics, m);
        if (q == 0)
            q = flush_metrics(m);
        if (q == 0)
            q = db_query_results(src, NULL, merge_job, m);
        if (q == 0)
            q = flush_jobs(m);
        if (q != 0 && q != STOP)
            snprintf(err, errlen, "%s", db_errmsg(src));
        rc = q == 0 ? 0 : -1;
        if (rc == 0 && st->jobs.rejected) {
            snprintf(err, errlen, "%s: %lld rows refused by the target (the others are merged): %s",
                     source_path, (long long)st->jobs.rejected, m->rejected_err);
            rc = -1;
        }
    }
    merge_close(m);
    db_close(src);
    if (tmp[0])
        remove_db_files(tmp);
    return rc;
}
