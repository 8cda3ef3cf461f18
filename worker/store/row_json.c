/* See row_json.h. Each row type is a table of its columns: name, kind and where it lives. */
#include "worker/store/row_json.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "engine/util/json_exact.h"

enum kind {
    K_STR,    /* const char * (NULL = left out) */
    K_STRLEN, /* const char * with a size_t length at len_off (0 = up to the NUL) */
    K_I64,    /* int64_t */
    K_REAL,   /* double (NAN = left out) */
    K_STATUS, /* enum db_status, as its name */
    K_FORM,   /* enum db_form, as "llmq" / "openai" */
};

struct col {
    const char *name;
    enum kind kind;
    size_t off, len_off;
    bool required;
};

#define S(t, f)                                                                                              \
    {                                                                                                        \
#f, K_STR, offsetof(t, f), 0, false                                                                  \
    }
#define SL(t, f, l)                                                                                          \
    {                                                                                                        \
#f, K_STRLEN, offsetof(t, f), offsetof(t, l), false                                                  \
    }
#define I(t, f)                                                                                              \
    {                                                                                                        \
#f, K_I64, offsetof(t, f), 0, false                                                                  \
    }
#define R(t, f)                                                                                              \
    {                                                                                                        \
#f, K_REAL, offsetof(t, f), 0, false                                                                 \
    }

static const struct col result_cols[] = {
    {"id", K_STR, offsetof(struct db_result, id), 0, true},
    S(struct db_result, custom_id),
    S(struct db_result, queue),
    {"status", K_STATUS, offsetof(struct db_result, status), 0, true},
    S(struct db_result, model),
    S(struct db_result, params),
    SL(struct db_result, output, output_len),
    S(struct db_result, finish_reason),
    I(struct db_result, prompt_tokens),
    I(struct db_result, completion_tokens),
    S(struct db_result, error),
    I(struct db_result, attempts),
    S(struct db_result, worker_id),
    R(struct db_result, created_at),
    R(struct db_result, started_at),
    R(struct db_result, first_token_at),
    {"finished_at", K_REAL, offsetof(struct db_result, finished_at), 0, true},
    R(struct db_result, ttft_ms),
    R(struct db_result, latency_ms),
    R(struct db_result, queue_ms),
    S(struct db_result, metadata),
    S(struct db_result, result),
    {"request_form", K_FORM, offsetof(struct db_result, request_form), 0, false},
    S(struct db_result, batch_id),
    SL(struct db_result, request, request_len),
    S(struct db_result, error_code),
    SL(struct db_result, reasoning, reasoning_len),
    I(struct db_result, reasoning_tokens),
    S(struct db_result, output_json),
};

static const struct col batch_cols[] = {
    {"id", K_STR, offsetof(struct db_batch, id), 0, true},
    S(struct db_batch, input),
    R(struct db_batch, created_at),
    I(struct db_batch, total),
    S(struct db_batch, state),
    R(struct db_batch, finished_at),
};

static const struct col metrics_cols[] = {
    {"worker_id", K_STR, offsetof(struct db_metrics, worker_id), 0, true},
    {"ts", K_REAL, offsetof(struct db_metrics, ts), 0, true},
    R(struct db_metrics, interval_s),
    I(struct db_metrics, jobs_done),
    I(struct db_metrics, jobs_failed),
    R(struct db_metrics, prompt_tokens_per_s),
    R(struct db_metrics, generation_tokens_per_s),
    R(struct db_metrics, ttft_p50_ms),
    R(struct db_metrics, ttft_p95_ms),
    R(struct db_metrics, itl_p50_ms),
    R(struct db_metrics, itl_p95_ms),
    R(struct db_metrics, e2e_p50_ms),
    R(struct db_metrics, e2e_p95_ms),
    I(struct db_metrics, running),
    I(struct db_metrics, waiting),
    R(struct db_metrics, kv_usage),
    R(struct db_metrics, prefix_cache_hit_rate),
    I(struct db_metrics, preemptions),
    I(struct db_metrics, gpu_mem_bytes),
    I(struct db_metrics, jobs_cancelled),
    I(struct db_metrics, jobs_dead),
    I(struct db_metrics, jobs_retried),
    I(struct db_metrics, prompt_tokens),
    I(struct db_metrics, generation_tokens),
    I(struct db_metrics, prefix_cache_queries),
    I(struct db_metrics, prefix_cache_hits),
    R(struct db_metrics, queue_p50_ms),
    R(struct db_metrics, queue_p95_ms),
    I(struct db_metrics, queue_short),
    I(struct db_metrics, queue_long),
    I(struct db_metrics, retry_depth),
    I(struct db_metrics, dead_depth),
};

#define W(f) offsetof(struct db_worker_row, w) + offsetof(struct db_worker, f)
static const struct col worker_cols[] = {
    {"id", K_STR, W(id), 0, true},
    {"host", K_STR, W(host), 0, false},
    {"pid", K_I64, W(pid), 0, false},
    {"gpu", K_STR, W(gpu), 0, false},
    {"model", K_STR, W(model), 0, false},
    {"backend", K_STR, W(backend), 0, false},
    {"version", K_STR, W(version), 0, false},
    {"started_at", K_REAL, W(started_at), 0, true},
    R(struct db_worker_row, last_seen_at),
    R(struct db_worker_row, stopped_at),
    I(struct db_worker_row, jobs_done),
};

#define N(a) (sizeof a / sizeof a[0])

/* The members of row (a struct laid out as cols say) into o. -1 out of memory. */
static int put_cols(json_t *o, const void *row, const struct col *cols, size_t n)
{
    const char *base = row;
    for (size_t i = 0; i < n; i++) {
        const struct col *c = &cols[i];
        const void *p = base + c->off;
        json_t *v = NULL;
        bool given = true; /* a value that must be written (not NULL / NAN) */
        switch (c->kind) {
        case K_STR:
            given = *(const char *const *)p != NULL;
            if (*(const char *const *)p)
                v = json_string(*(const char *const *)p);
            break;
        case K_STRLEN: {
            const char *s = *(const char *const *)p;
            given = s != NULL;
            size_t len = *(const size_t *)(base + c->len_off);
            if (s)
                v = json_stringn(s, len ? len : strlen(s));
            break;
        }
        case K_I64:
            v = json_integer(*(const int64_t *)p);
            break;
        case K_REAL:
            given = !isnan(*(const double *)p);
            if (given)
                v = json_real(*(const double *)p);
            break;
        case K_STATUS:
            v = json_string(db_status_name(*(const int *)p));
            break;
        case K_FORM:
            v = json_string(*(const int *)p == DB_FORM_OPENAI ? "openai" : "llmq");
            break;
        }
        if (given && (!v || json_object_set_new(o, c->name, v))) /* out of memory, or not UTF-8 */
            return -1;
    }
    return 0;
}

/* Reads the members of o into row (laid out as cols say). -1 on a missing required member or a
 * member of the wrong type. */
static int get_cols(const json_t *o, void *row, const struct col *cols, size_t n)
{
    if (!json_is_object(o))
        return -1;
    char *base = row;
    for (size_t i = 0; i < n; i++) {
        const struct col *c = &cols[i];
        void *p = base + c->off;
        const json_t *v = json_object_get(o, c->name);
        if (!v || json_is_null(v)) {
            if (c->required)
                return -1;
            continue;
        }
        switch (c->kind) {
        case K_STR:
        case K_STRLEN:
            if (!json_is_string(v))
                return -1;
            *(const char **)p = json_string_value(v);
            if (c->kind == K_STRLEN)
                *(size_t *)(base + c->len_off) = json_string_length(v);
            break;
        case K_I64:
            if (!json_is_integer(v))
                return -1;
            *(int64_t *)p = json_integer_value(v);
            break;
        case K_REAL:
            if (!json_is_number(v))
                return -1;
            *(double *)p = json_number_value(v);
            break;
        case K_STATUS: {
            int st = json_is_string(v) ? db_status_from_name(json_string_value(v)) : -1;
            if (st < 0)
                return -1;
            *(enum db_status *)p = (enum db_status)st;
            break;
        }
        case K_FORM:
            if (!json_is_string(v))
                return -1;
            *(enum db_form *)p = !strcmp(json_string_value(v), "openai") ? DB_FORM_OPENAI : DB_FORM_LLMQ;
            break;
        }
    }
    return 0;
}

static char *dump(json_t *o, int rc)
{
    char *s = rc == 0 ? json_dumps_exact(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *row_json_result(const struct db_result *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    int rc = put_cols(o, r, result_cols, N(result_cols));
    if (rc == 0 && r->batch && r->batch->id) {
        json_t *b = json_object();
        rc = !b || put_cols(b, r->batch, batch_cols, N(batch_cols)) || json_object_set_new(o, "batch", b) ? -1
                                                                                                          : 0;
    }
    return dump(o, rc);
}

char *row_json_metrics(const struct db_metrics *m)
{
    json_t *o = json_object();
    return o ? dump(o, put_cols(o, m, metrics_cols, N(metrics_cols))) : NULL;
}

char *row_json_worker(const struct db_worker_row *w)
{
    json_t *o = json_object();
    return o ? dump(o, put_cols(o, w, worker_cols, N(worker_cols))) : NULL;
}

int row_json_read_result(const json_t *o, struct db_result *r, struct db_batch *b)
{
    *r = db_result_empty();
    if (get_cols(o, r, result_cols, N(result_cols)))
        return -1;
    const json_t *bo = json_object_get(o, "batch");
    if (bo) {
        *b = db_batch_empty();
        if (get_cols(bo, b, batch_cols, N(batch_cols)))
            return -1;
        r->batch = b;
    }
    return 0;
}

int row_json_read_metrics(const json_t *o, struct db_metrics *m)
{
    *m = db_metrics_empty();
    return get_cols(o, m, metrics_cols, N(metrics_cols));
}

int row_json_read_worker(const json_t *o, struct db_worker_row *w)
{
    memset(w, 0, sizeof *w);
    w->w.pid = -1;
    w->last_seen_at = w->stopped_at = NAN;
    return get_cols(o, w, worker_cols, N(worker_cols));
}
