/* See committed.h. */
#include "worker/loop/committed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/log.h"
#include "queue/ack.h"
#include "worker/store/db.h"
#include "worker/store/row_json.h"

struct wk_committed {
    struct db *db;
    int64_t max_bytes;
};

struct wk_committed *wk_committed_open(const char *path, int busy_timeout_ms, int64_t max_bytes, char *err,
                                       size_t errlen)
{
    struct wk_committed *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = busy_timeout_ms;
    o.readonly = true;
    if (db_open(path, &o, &c->db, err, errlen)) {
        free(c);
        return NULL;
    }
    c->max_bytes = max_bytes;
    return c;
}

void wk_committed_close(struct wk_committed *c)
{
    if (!c)
        return;
    db_close(c->db);
    free(c);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

struct found {
    const struct wk_committed *c;
    struct rq_done *out;
    int ok; /* 1 found and copied, -1 out of memory */
};

static int take_row(void *ctx, const struct db_result *r)
{
    struct found *f = ctx;
    struct rq_done *d = f->out;
    d->worker = dup_or_null(r->worker_id);
    d->id = dup_or_null(r->id);
    d->started_at = r->started_at;
    d->status = r->status == DB_COMPLETED ? RQ_STATUS_COMPLETED
                : r->status == DB_CANCELLED ? RQ_STATUS_CANCELLED
                                            : RQ_STATUS_FAILED;
    d->finish_reason = dup_or_null(r->finish_reason);
    d->error = dup_or_null(r->error);
    d->error_code = dup_or_null(r->error_code);
    d->prompt_tokens = (int)r->prompt_tokens;
    d->completion_tokens = (int)r->completion_tokens;
    d->first_token_at = r->first_token_at > 0 ? r->first_token_at : 0; /* NAN compares false */
    if (r->result) {
        size_t n = strlen(r->result);
        if (f->c->max_bytes > 0 && (int64_t)n > f->c->max_bytes) {
            char marker[96];
            snprintf(marker, sizeof marker, "{\"truncated\":true,\"in\":\"sqlite\",\"bytes\":%zu}", n);
            d->result = strdup(marker);
        } else {
            d->result = strdup(r->result);
        }
    }
    d->row = row_json_result(r); /* published with the ack when results_stream is on */
    f->ok = d->id && d->worker && d->result && d->row ? 1 : -1;
    return 1; /* one row is all there is (id is the key) */
}

int wk_committed_lookup(void *ctx, const char *id, const char *worker, const char *line, size_t len, int nth,
                        struct rq_done *out)
{
    struct wk_committed *c = ctx;
    struct found f = {c, out, 0};
    int rc;
    if (id) {
        struct db_query q = db_query_all();
        q.id = id;
        q.limit = 1;
        rc = db_query_results(c->db, &q, take_row, &f);
    } else {
        rc = db_find_failed_line(c->db, worker, line, len, nth, take_row, &f);
    }
    if (rc < 0) {
        log_warn("sqlite: looking up %s%s before taking it back from a lapsed worker: %s", id ? "job " : "a line without an id",
                 id ? id : "", db_errmsg(c->db));
        return 0;
    }
    if (f.ok < 0) { /* a row without worker or result cannot be acknowledged as it was */
        rq_done_clear(out);
        return 0;
    }
    return f.ok;
}

int wk_committed_parts(struct wk_committed *c, const char *job_id, const char *plan, db_part_fn fn, void *ctx)
{
    int rc = db_get_parts(c->db, job_id, plan, fn, ctx);
    if (rc == DB_ERR || rc == DB_BUSY) {
        log_warn("sqlite: %s; the job's parts are computed again", db_errmsg(c->db));
        return -1;
    }
    return rc;
}
