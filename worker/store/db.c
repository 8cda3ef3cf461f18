/* The SQLite store; see db.h for the contract and schemas/NNN_*.sql for the tables. */
#include "worker/store/db.h"

#include <assert.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "engine/util/buf.h"

#define LLMQ_APPLICATION_ID 0x6c6c6d71 /* "llmq": PRAGMA application_id of our databases */
#define MAX_BACKOFF_MS 1000

/* ---- the column tables: one entry per column of a table written from a C struct, in the order
 * of the DDL. They drive the INSERT, the upsert's SET list, the binding and the reading back;
 * tests/unit/test_db.c checks them against PRAGMA table_info so the two cannot drift apart. */

enum col_kind {
    C_TEXT,    /* const char * (NULL = NULL) */
    C_OUTPUT,  /* const char * with its size_t length right after it */
    C_INT,     /* int64_t */
    C_INT_OPT, /* int64_t, negative = NULL */
    C_REAL,    /* double, NAN = NULL */
    C_STATUS,  /* enum db_status as its name */
    C_FORM,    /* enum db_form as 'llmq' | 'openai' */
    C_JSON,    /* const char * of JSON text (NULL = NULL), stored minified by SQLite's json() */
};

struct col {
    const char *name;
    enum col_kind kind;
    size_t off;
};

#define JCOL(f, k)                                                                                           \
    {                                                                                                        \
#f, k, offsetof(struct db_result, f)                                                                 \
    }
static const struct col job_cols[] = {
    JCOL(id, C_TEXT),           JCOL(custom_id, C_TEXT),
    JCOL(queue, C_TEXT),        JCOL(status, C_STATUS),
    JCOL(model, C_TEXT),        JCOL(params, C_TEXT),
    JCOL(output, C_OUTPUT),     JCOL(finish_reason, C_TEXT),
    JCOL(prompt_tokens, C_INT), JCOL(completion_tokens, C_INT),
    JCOL(error, C_TEXT),        JCOL(attempts, C_INT),
    JCOL(worker_id, C_TEXT),    JCOL(created_at, C_REAL),
    JCOL(started_at, C_REAL),   JCOL(first_token_at, C_REAL),
    JCOL(finished_at, C_REAL),  JCOL(ttft_ms, C_REAL),
    JCOL(latency_ms, C_REAL),   JCOL(queue_ms, C_REAL),
    JCOL(metadata, C_TEXT),     JCOL(result, C_TEXT),
    JCOL(request_form, C_FORM), JCOL(batch_id, C_TEXT),
    JCOL(request, C_OUTPUT),    JCOL(error_code, C_TEXT),
    JCOL(reasoning, C_OUTPUT),  JCOL(reasoning_tokens, C_INT_OPT),
    JCOL(output_json, C_JSON),
};
#define N_JOB_COLS (sizeof job_cols / sizeof job_cols[0])

#define MCOL(f, k)                                                                                           \
    {                                                                                                        \
#f, k, offsetof(struct db_metrics, f)                                                                \
    }
static const struct col metric_cols[] = {
    MCOL(worker_id, C_TEXT),
    MCOL(ts, C_REAL),
    MCOL(interval_s, C_REAL),
    MCOL(jobs_done, C_INT),
    MCOL(jobs_failed, C_INT),
    MCOL(prompt_tokens_per_s, C_REAL),
    MCOL(generation_tokens_per_s, C_REAL),
    MCOL(ttft_p50_ms, C_REAL),
    MCOL(ttft_p95_ms, C_REAL),
    MCOL(itl_p50_ms, C_REAL),
    MCOL(itl_p95_ms, C_REAL),
    MCOL(e2e_p50_ms, C_REAL),
    MCOL(e2e_p95_ms, C_REAL),
    MCOL(running, C_INT),
    MCOL(waiting, C_INT),
    MCOL(kv_usage, C_REAL),
    MCOL(prefix_cache_hit_rate, C_REAL),
    MCOL(preemptions, C_INT),
    MCOL(gpu_mem_bytes, C_INT_OPT),
    MCOL(jobs_cancelled, C_INT),
    MCOL(jobs_dead, C_INT),
    MCOL(jobs_retried, C_INT),
    MCOL(prompt_tokens, C_INT),
    MCOL(generation_tokens, C_INT),
    MCOL(prefix_cache_queries, C_INT),
    MCOL(prefix_cache_hits, C_INT),
    MCOL(queue_p50_ms, C_REAL),
    MCOL(queue_p95_ms, C_REAL),
    MCOL(queue_short, C_INT_OPT),
    MCOL(queue_long, C_INT_OPT),
    MCOL(retry_depth, C_INT_OPT),
    MCOL(dead_depth, C_INT_OPT),
};
#define N_METRIC_COLS (sizeof metric_cols / sizeof metric_cols[0])

#define BCOL(f, k)                                                                                           \
    {                                                                                                        \
#f, k, offsetof(struct db_batch, f)                                                                  \
    }
static const struct col batch_cols[] = {
    BCOL(id, C_TEXT),       BCOL(input, C_TEXT), BCOL(created_at, C_REAL),
    BCOL(total, C_INT_OPT), BCOL(state, C_TEXT), BCOL(finished_at, C_REAL),
};
#define N_BATCH_COLS (sizeof batch_cols / sizeof batch_cols[0])

#define PCOL(f, k)                                                                                           \
    {                                                                                                        \
#f, k, offsetof(struct db_part, f)                                                                   \
    }
static const struct col part_cols[] = {
    PCOL(job_id, C_TEXT),        PCOL(level, C_INT),         PCOL(part, C_INT),
    PCOL(plan, C_TEXT),          PCOL(first, C_INT),         PCOL(last, C_INT),
    PCOL(doc_start, C_INT),      PCOL(doc_end, C_INT),       PCOL(output, C_OUTPUT),
    PCOL(prompt_tokens, C_INT),  PCOL(completion_tokens, C_INT), PCOL(finish_reason, C_TEXT),
    PCOL(worker_id, C_TEXT),     PCOL(created_at, C_REAL),
};
#define N_PART_COLS (sizeof part_cols / sizeof part_cols[0])

#define WCOL(f, k)                                                                                           \
    {                                                                                                        \
#f, k, offsetof(struct db_worker_row, f)                                                             \
    }
static const struct col worker_cols[] = {
    {"id", C_TEXT, offsetof(struct db_worker_row, w.id)},
    {"host", C_TEXT, offsetof(struct db_worker_row, w.host)},
    {"pid", C_INT_OPT, offsetof(struct db_worker_row, w.pid)},
    {"gpu", C_TEXT, offsetof(struct db_worker_row, w.gpu)},
    {"model", C_TEXT, offsetof(struct db_worker_row, w.model)},
    {"backend", C_TEXT, offsetof(struct db_worker_row, w.backend)},
    {"started_at", C_REAL, offsetof(struct db_worker_row, w.started_at)},
    WCOL(last_seen_at, C_REAL),
    WCOL(stopped_at, C_REAL),
    WCOL(jobs_done, C_INT),
    {"version", C_TEXT, offsetof(struct db_worker_row, w.version)},
};
#define N_WORKER_COLS (sizeof worker_cols / sizeof worker_cols[0])

/* For the test that compares these tables with the schema: the column names of `table`, in
 * order, or NULL for a table without one. Not in db.h: only tests declare it. */
const char *db_test_column(const char *table, size_t i);
const char *db_test_column(const char *table, size_t i)
{
    if (!strcmp(table, "jobs"))
        return i < N_JOB_COLS ? job_cols[i].name : NULL;
    if (!strcmp(table, "worker_metrics"))
        return i < N_METRIC_COLS ? metric_cols[i].name : NULL;
    if (!strcmp(table, "batches"))
        return i < N_BATCH_COLS ? batch_cols[i].name : NULL;
    if (!strcmp(table, "job_parts"))
        return i < N_PART_COLS ? part_cols[i].name : NULL;
    if (!strcmp(table, "workers"))
        return i < N_WORKER_COLS ? worker_cols[i].name : NULL;
    return NULL;
}

/* ---- cached statements */

/* The rank of a status in the upsert: a write replaces the row when its rank is at least the
 * row's (completed > cancelled > failed). */
#define RANK(t) "(CASE " t ".status WHEN 'completed' THEN 2 WHEN 'cancelled' THEN 1 ELSE 0 END)"

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_JOB_UPSERT,   /* built from job_cols */
    ST_JOB_ATTEMPTS, /* the kept row of a lower-ranked replay still counts its attempt */
    ST_WORKER,
    ST_TOUCH,
    ST_METRICS,   /* built from metric_cols */
    ST_BATCH_NEW, /* a job's batch, unless it is there (only its unknown columns are filled in) */
    ST_BATCH,     /* a batch's state (db_put_batches) */
    ST_PART,      /* a map-reduce job's part (db_put_parts), built from part_cols */
    ST_PART_STALE, /* the job's parts of another plan */
    ST_PART_GET,  /* db_get_parts */
    ST_WORKER_ROW, /* a whole worker row (db_put_worker_rows), built from worker_cols */
    ST_COUNT
};

static const char *const fixed_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_JOB_ATTEMPTS] = "UPDATE jobs SET attempts = ?2 WHERE id = ?1 AND attempts < ?2",
    [ST_WORKER] =
        "INSERT INTO workers (id, host, pid, gpu, model, backend, version, started_at, last_seen_at, "
        "stopped_at, jobs_done) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, NULL, 0) "
        "ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, gpu = excluded.gpu, "
        "model = excluded.model, backend = excluded.backend, version = excluded.version, "
        "started_at = excluded.started_at, last_seen_at = excluded.last_seen_at, stopped_at = NULL, "
        "jobs_done = 0",
    [ST_TOUCH] = "UPDATE workers SET last_seen_at = ?2, jobs_done = ?3, "
                 "stopped_at = CASE WHEN ?4 THEN ?2 ELSE stopped_at END WHERE id = ?1",
    [ST_BATCH_NEW] = "INSERT INTO batches (id, input, created_at, total, state, finished_at) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO UPDATE SET "
                     "input = coalesce(batches.input, excluded.input), "
                     "created_at = coalesce(batches.created_at, excluded.created_at), "
                     "total = coalesce(batches.total, excluded.total), "
                     "state = coalesce(batches.state, excluded.state)",
    [ST_BATCH] = "INSERT INTO batches (id, input, created_at, total, state, finished_at) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO UPDATE SET "
                 "input = coalesce(batches.input, excluded.input), "
                 "created_at = coalesce(batches.created_at, excluded.created_at), "
                 "total = coalesce(excluded.total, batches.total), "
                 "state = coalesce(excluded.state, batches.state), "
                 "finished_at = coalesce(excluded.finished_at, batches.finished_at)",
    [ST_PART_STALE] = "DELETE FROM job_parts WHERE job_id = ?1 AND plan <> ?2",
};

/* Which file a path named when the connection opened it: the database, its -wal and its -shm. */
enum { F_MAIN, F_WAL, F_SHM, F_COUNT };
static const char *const file_suffix[F_COUNT] = {"", "-wal", "-shm"};
struct file_id {
    bool known; /* the file existed at open (not for an in-memory database) */
    dev_t dev;
    ino_t ino;
};

struct db {
    sqlite3 *h; /* NULL after a db_reopen that failed */
    char *path;
    struct file_id files[F_COUNT];
    struct db_opts o;
    int version;
    sqlite3_stmt *st[ST_COUNT];
    unsigned rng; /* backoff jitter */
    char err[1024];
};

struct db_opts db_opts_default(void)
{
    struct db_opts o = {.busy_timeout_ms = 5000, .busy_retries = 2, .backoff_ms = 50};
    return o;
}

struct db_result db_result_empty(void)
{
    struct db_result r = {
        .status = DB_COMPLETED, .attempts = 1, .request_form = DB_FORM_LLMQ, .reasoning_tokens = -1};
    r.created_at = r.started_at = r.first_token_at = r.finished_at = NAN;
    r.ttft_ms = r.latency_ms = r.queue_ms = NAN;
    return r;
}

struct db_batch db_batch_empty(void)
{
    struct db_batch b = {.total = -1, .created_at = NAN, .finished_at = NAN};
    return b;
}

struct db_metrics db_metrics_empty(void)
{
    struct db_metrics m = {.gpu_mem_bytes = -1};
    m.ts = m.interval_s = NAN;
    m.prompt_tokens_per_s = m.generation_tokens_per_s = NAN;
    m.ttft_p50_ms = m.ttft_p95_ms = m.itl_p50_ms = m.itl_p95_ms = m.e2e_p50_ms = m.e2e_p95_ms = NAN;
    m.kv_usage = m.prefix_cache_hit_rate = NAN;
    m.queue_p50_ms = m.queue_p95_ms = NAN;
    m.queue_short = m.queue_long = m.retry_depth = m.dead_depth = -1;
    return m;
}

struct db_query db_query_all(void)
{
    struct db_query q = {.status = -1, .since = NAN, .until = NAN, .form = -1};
    return q;
}

static const char *const status_names[] = {"completed", "failed", "cancelled"};

const char *db_status_name(int status)
{
    return status >= 0 && status < 3 ? status_names[status] : NULL;
}

int db_status_from_name(const char *name)
{
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, status_names[i]))
            return i;
    return -1;
}

int db_status_rank(int status)
{
    return status == DB_COMPLETED ? 2 : status == DB_CANCELLED ? 1 : 0;
}

double db_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *db_errmsg(const struct db *db)
{
    return db ? db->err : "no database";
}
const char *db_path(const struct db *db)
{
    return db ? db->path : NULL;
}
int db_schema_version(const struct db *db)
{
    return db ? db->version : 0;
}
struct sqlite3 *db_handle(struct db *db)
{
    return db ? db->h : NULL;
}

/* ---- errors */

/* db->err = "<path>: <fmt...>". */
static void set_err(struct db *db, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct db *db, const char *fmt, ...)
{
    int n = snprintf(db->err, sizeof db->err, "%s: ", db->path);
    if (n < 0 || (size_t)n >= sizeof db->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(db->err + n, sizeof db->err - (size_t)n, fmt, ap);
    va_end(ap);
}

static bool is_busy(int rc)
{
    return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
}

/* A failure that retrying soon will not mend: a read-only file, directory or file system, no
 * permission, a file that cannot be opened or created, an I/O error. */
static bool is_unwritable(int rc)
{
    int p = rc & 0xff;
    return p == SQLITE_READONLY || p == SQLITE_CANTOPEN || p == SQLITE_PERM || p == SQLITE_IOERR ||
           p == SQLITE_AUTH;
}

/* A failure of one row that leaves the transaction usable: the row breaks a rule of the schema. */
static bool is_row_error(int rc)
{
    int p = rc & 0xff;
    return p == SQLITE_CONSTRAINT || p == SQLITE_TOOBIG || p == SQLITE_MISMATCH || p == SQLITE_RANGE;
}

/* ---- statements and binding */

/* "INSERT INTO t (a, b, ...) VALUES (?1, ?2, ...) ON CONFLICT (<key>) DO UPDATE SET b = excluded.b,
 * ..." with the key columns (the first n_key) left out of the SET list, then `tail`. */
static char *build_upsert(const char *table, const struct col *cols, size_t n, size_t n_key, const char *key,
                          const char *tail)
{
    size_t cap = 4096;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t len = (size_t)snprintf(s, cap, "INSERT INTO %s (", table);
#define ADD(...) len += (size_t)snprintf(s + len, len < cap ? cap - len : 0, __VA_ARGS__)
    for (size_t i = 0; i < n; i++)
        ADD("%s%s", i ? ", " : "", cols[i].name);
    ADD(") VALUES (");
    for (size_t i = 0; i < n; i++) /* JSON minified when it is JSON, else as is, for the CHECK to refuse */
        if (cols[i].kind == C_JSON)
            ADD("%sCASE WHEN json_valid(?%zu) THEN json(?%zu) ELSE ?%zu END", i ? ", " : "", i + 1, i + 1,
                i + 1);
        else
            ADD("%s?%zu", i ? ", " : "", i + 1);
    ADD(") ON CONFLICT (%s) DO UPDATE SET ", key);
    for (size_t i = n_key; i < n; i++)
        ADD("%s%s = excluded.%s", i > n_key ? ", " : "", cols[i].name, cols[i].name);
    ADD("%s", tail);
#undef ADD
    if (len >= cap) {
        free(s);
        return NULL;
    }
    return s;
}

/* The cached statement `which`, prepared on first use; NULL with db->err on failure. */
/* "SELECT <cols> FROM <table><tail>": a new string, or NULL when out of memory. */
static char *build_select(const char *table, const struct col *cols, size_t n, const char *tail)
{
    struct buf b = {0};
    buf_puts(&b, "SELECT ");
    for (size_t i = 0; i < n; i++)
        buf_printf(&b, "%s%s", i ? ", " : "", cols[i].name);
    buf_printf(&b, " FROM %s%s", table, tail);
    return buf_take(&b);
}

static sqlite3_stmt *stmt(struct db *db, int which)
{
    if (db->st[which])
        return db->st[which];
    char *built = NULL;
    if (which == ST_JOB_UPSERT)
        built = build_upsert(
            "jobs", job_cols, N_JOB_COLS, 1, "id",
            ", attempts = max(jobs.attempts, excluded.attempts) WHERE " RANK("excluded") " >= " RANK("jobs"));
    else if (which == ST_METRICS)
        built = build_upsert("worker_metrics", metric_cols, N_METRIC_COLS, 2, "worker_id, ts", "");
    else if (which == ST_WORKER_ROW)
        built = build_upsert("workers", worker_cols, N_WORKER_COLS, 1, "id", "");
    else if (which == ST_PART)
        built = build_upsert("job_parts", part_cols, N_PART_COLS, 3, "job_id, level, part", "");
    else if (which == ST_PART_GET)
        built = build_select("job_parts", part_cols, N_PART_COLS,
                             " WHERE job_id = ?1 AND plan = ?2 ORDER BY level, part");
    const char *sql = built ? built : fixed_sql[which];
    if (!sql) {
        set_err(db, "out of memory");
        return NULL;
    }
    int rc = sqlite3_prepare_v3(db->h, sql, -1, SQLITE_PREPARE_PERSISTENT, &db->st[which], NULL);
    free(built);
    if (rc != SQLITE_OK) {
        set_err(db, "preparing a statement: %s", sqlite3_errmsg(db->h));
        sqlite3_finalize(db->st[which]);
        db->st[which] = NULL;
    }
    return db->st[which];
}

/* Binds the columns of one struct (base) to st's parameters ?1..?n. */
static int bind_cols(sqlite3_stmt *st, const struct col *cols, size_t n, const void *base)
{
    int rc = SQLITE_OK;
    for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
        const char *p = (const char *)base + cols[i].off;
        int k = (int)i + 1;
        switch (cols[i].kind) {
        case C_TEXT:
        case C_JSON: {
            const char *s = *(const char *const *)p;
            rc = s ? sqlite3_bind_text(st, k, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, k);
            break;
        }
        case C_OUTPUT: {
            const char *s = *(const char *const *)p;
            size_t len = *(const size_t *)(p + sizeof(const char *));
            if (s && len == 0)
                len = strlen(s);
            rc =
                s ? sqlite3_bind_text64(st, k, s, len, SQLITE_STATIC, SQLITE_UTF8) : sqlite3_bind_null(st, k);
            break;
        }
        case C_INT:
            rc = sqlite3_bind_int64(st, k, *(const int64_t *)p);
            break;
        case C_INT_OPT: {
            int64_t x = *(const int64_t *)p;
            rc = x < 0 ? sqlite3_bind_null(st, k) : sqlite3_bind_int64(st, k, x);
            break;
        }
        case C_REAL: {
            double x = *(const double *)p;
            rc = isnan(x) ? sqlite3_bind_null(st, k) : sqlite3_bind_double(st, k, x);
            break;
        }
        case C_STATUS: {
            const char *s = db_status_name(*(const int *)p);
            rc = s ? sqlite3_bind_text(st, k, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, k);
            break;
        }
        case C_FORM: {
            int f = *(const int *)p;
            const char *s = f == DB_FORM_LLMQ ? "llmq" : f == DB_FORM_OPENAI ? "openai" : NULL;
            rc = s ? sqlite3_bind_text(st, k, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, k);
            break;
        }
        }
    }
    return rc;
}

/* Reads the columns of the current row of st (in table order from column 0) into base. Strings
 * point into st's row: valid until the next step or reset. */
static void read_cols(sqlite3_stmt *st, const struct col *cols, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        char *p = (char *)base + cols[i].off;
        int k = (int)i;
        bool null = sqlite3_column_type(st, k) == SQLITE_NULL;
        switch (cols[i].kind) {
        case C_TEXT:
        case C_JSON:
            *(const char **)p = null ? NULL : (const char *)sqlite3_column_text(st, k);
            break;
        case C_OUTPUT:
            *(const char **)p = null ? NULL : (const char *)sqlite3_column_text(st, k);
            *(size_t *)(p + sizeof(const char *)) = null ? 0 : (size_t)sqlite3_column_bytes(st, k);
            break;
        case C_INT:
            *(int64_t *)p = sqlite3_column_int64(st, k);
            break;
        case C_INT_OPT:
            *(int64_t *)p = null ? -1 : sqlite3_column_int64(st, k);
            break;
        case C_REAL:
            *(double *)p = null ? NAN : sqlite3_column_double(st, k);
            break;
        case C_STATUS: {
            int s = db_status_from_name((const char *)sqlite3_column_text(st, k));
            *(int *)p = s < 0 ? DB_FAILED : s;
            break;
        }
        case C_FORM: {
            const char *s = (const char *)sqlite3_column_text(st, k);
            *(int *)p = s && !strcmp(s, "openai") ? DB_FORM_OPENAI : DB_FORM_LLMQ;
            break;
        }
        }
    }
}

/* Steps a write statement once and resets it; returns the step's result code (SQLITE_DONE = ok). */
static int step_reset(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc;
}

/* The string of a text column of base (C_TEXT, C_JSON, C_OUTPUT) and its length; NULL for others. */
static const char *col_text(const struct col *c, const void *base, size_t *len)
{
    const char *p = (const char *)base + c->off;
    if (c->kind != C_TEXT && c->kind != C_JSON && c->kind != C_OUTPUT)
        return NULL;
    const char *s = *(const char *const *)p;
    size_t n = c->kind == C_OUTPUT ? *(const size_t *)(p + sizeof(const char *)) : 0;
    *len = s && n == 0 ? strlen(s) : n;
    return s;
}

struct db_result *db_result_dup(const struct db_result *r)
{
    size_t total = sizeof *r, len;
    for (size_t i = 0; i < N_JOB_COLS; i++)
        if (col_text(&job_cols[i], r, &len))
            total += len + 1;
    struct db_result *d = malloc(total);
    if (!d)
        return NULL;
    *d = *r;
    d->batch = NULL;
    char *at = (char *)(d + 1);
    for (size_t i = 0; i < N_JOB_COLS; i++) {
        const char *s = col_text(&job_cols[i], r, &len);
        if (!s)
            continue;
        memcpy(at, s, len);
        at[len] = 0;
        char *p = (char *)d + job_cols[i].off;
        *(const char **)p = at;
        if (job_cols[i].kind == C_OUTPUT)
            *(size_t *)(p + sizeof(const char *)) = len;
        at += len + 1;
    }
    return d;
}

/* Whether a and b (structs of cols) hold the same value in every column (NULL equals NULL). */
static bool same_cols(const struct col *cols, size_t n, const void *a, const void *b)
{
    for (size_t i = 0; i < n; i++) {
        const struct col *c = &cols[i];
        const char *pa = (const char *)a + c->off, *pb = (const char *)b + c->off;
        size_t la, lb;
        const char *sa = col_text(c, a, &la), *sb = col_text(c, b, &lb);
        bool same;
        if (c->kind == C_TEXT || c->kind == C_JSON || c->kind == C_OUTPUT)
            same = (!sa && !sb) || (sa && sb && la == lb && !memcmp(sa, sb, la));
        else if (c->kind == C_REAL) {
            double x = *(const double *)pa, y = *(const double *)pb;
            same = x == y || (isnan(x) && isnan(y));
        } else if (c->kind == C_INT || c->kind == C_INT_OPT)
            same = *(const int64_t *)pa == *(const int64_t *)pb;
        else
            same = *(const int *)pa == *(const int *)pb;
        if (!same)
            return false;
    }
    return true;
}

bool db_result_same(const struct db_result *a, const struct db_result *b)
{
    return same_cols(job_cols, N_JOB_COLS, a, b);
}

bool db_metrics_same(const struct db_metrics *a, const struct db_metrics *b)
{
    return same_cols(metric_cols, N_METRIC_COLS, a, b);
}

/* ---- transactions with retries */

static void backoff(struct db *db, int attempt)
{
    long ms = db->o.backoff_ms > 0 ? db->o.backoff_ms : 1;
    for (int i = 0; i < attempt && ms < MAX_BACKOFF_MS; i++)
        ms *= 2;
    if (ms > MAX_BACKOFF_MS)
        ms = MAX_BACKOFF_MS;
    db->rng ^= db->rng << 13, db->rng ^= db->rng >> 17, db->rng ^= db->rng << 5;
    ms = ms / 2 + (long)(db->rng % (unsigned)(ms / 2 + 1)); /* jitter: [ms/2, ms] */
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The body of a write transaction: returns SQLITE_OK, or the result code that ends the attempt
 * (it leaves sqlite3_errmsg as the failing call set it). It may run more than once. */
typedef int (*txn_body)(struct db *db, void *arg);

/* Runs body inside BEGIN IMMEDIATE ... COMMIT. When the database is locked past busy_timeout,
 * rolls back and tries again, up to busy_retries more times with backoff; then DB_BUSY. Any other
 * failure rolls back and is DB_ERR. `what` names the work in error messages. */
static int write_txn(struct db *db, const char *what, txn_body body, void *arg)
{
    if (db->o.readonly) {
        set_err(db, "%s: the database was opened read-only", what);
        return DB_ERR;
    }
    if (!db->h) {
        set_err(db, "%s: the database is not open (it could not be opened again)", what);
        return DB_UNWRITABLE;
    }
    double t0 = db_now();
    for (int attempt = 0;; attempt++) {
        sqlite3_stmt *begin = stmt(db, ST_BEGIN), *commit = stmt(db, ST_COMMIT);
        if (!begin || !commit)
            return DB_ERR;
        int rc = step_reset(begin);
        if (rc == SQLITE_DONE) {
            rc = body(db, arg);
            if (rc == SQLITE_OK || rc == SQLITE_DONE)
                rc = step_reset(commit);
        }
        if (rc == SQLITE_DONE)
            return DB_OK;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sqlite3_errmsg(db->h));
        if (!sqlite3_get_autocommit(db->h)) {
            sqlite3_stmt *rb = stmt(db, ST_ROLLBACK);
            if (rb)
                step_reset(rb);
        }
        if (!is_busy(rc)) {
            set_err(db, "%s: %s", what, msg);
            return is_unwritable(rc) ? DB_UNWRITABLE : DB_ERR;
        }
        if (attempt >= db->o.busy_retries) {
            set_err(db, "%s: %s (gave up after %d tries in %.1f s, busy_timeout %d ms); nothing was written",
                    what, msg, attempt + 1, db_now() - t0, db->o.busy_timeout_ms);
            return DB_BUSY;
        }
        backoff(db, attempt);
    }
}

/* ---- jobs */

struct put_results {
    const struct db_result *rows;
    size_t n;
    int *row_rc;
    size_t rejected;
};

/* The rules the C side checks before SQLite sees a row (the schema checks the rest). */
static const char *row_problem(const struct db_result *r)
{
    if (!r->id || !r->id[0])
        return "no id";
    if (!db_status_name((int)r->status))
        return "status out of range";
    if ((int)r->request_form != DB_FORM_LLMQ && (int)r->request_form != DB_FORM_OPENAI)
        return "request_form out of range";
    if (!isfinite(r->finished_at))
        return "finished_at is missing";
    return NULL;
}

static int put_results_body(struct db *db, void *arg)
{
    struct put_results *p = arg;
    sqlite3_stmt *up = stmt(db, ST_JOB_UPSERT), *att = stmt(db, ST_JOB_ATTEMPTS);
    sqlite3_stmt *bn = stmt(db, ST_BATCH_NEW);
    if (!up || !att || !bn)
        return SQLITE_ERROR;
    p->rejected = 0;
    for (size_t i = 0; i < p->n; i++) {
        const struct db_result *r = &p->rows[i];
        const char *problem = row_problem(r);
        int rc = SQLITE_CONSTRAINT;
        if (!problem && r->batch && r->batch->id) {
            rc = bind_cols(bn, batch_cols, N_BATCH_COLS, r->batch);
            rc = rc == SQLITE_OK ? step_reset(bn) : rc;
            sqlite3_clear_bindings(bn);
            if (rc != SQLITE_DONE && !is_row_error(rc))
                return rc; /* busy, I/O, full: the whole transaction. A refused batch row only loses itself */
            rc = SQLITE_CONSTRAINT;
        }
        if (!problem) {
            rc = bind_cols(up, job_cols, N_JOB_COLS, r);
            if (rc == SQLITE_OK)
                rc = step_reset(up);
            else
                sqlite3_clear_bindings(up);
            if (rc == SQLITE_DONE && sqlite3_changes(db->h) == 0) { /* a lower-ranked replay: row kept */
                sqlite3_bind_text(att, 1, r->id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(att, 2, r->attempts);
                rc = step_reset(att);
            }
        }
        if (p->row_rc)
            p->row_rc[i] = 0;
        if (rc == SQLITE_DONE)
            continue;
        if (!problem && !is_row_error(rc))
            return rc; /* busy, I/O, full: the whole transaction */
        if (p->row_rc)
            p->row_rc[i] = DB_ERR_ROW;
        if (p->rejected++ == 0)
            set_err(db, "job '%.300s' (row %zu of %zu) rejected: %s", r->id ? r->id : "(no id)", i + 1, p->n,
                    problem ? problem : sqlite3_errmsg(db->h));
    }
    return SQLITE_OK;
}

int db_put_results(struct db *db, const struct db_result *rows, size_t n, int *row_rc)
{
    assert(db && (rows || n == 0));
    if (n == 0)
        return DB_OK;
    struct put_results p = {rows, n, row_rc, 0};
    char what[64];
    snprintf(what, sizeof what, "writing %zu result%s", n, n == 1 ? "" : "s");
    int rc = write_txn(db, what, put_results_body, &p);
    if (rc != DB_OK || p.rejected == 0)
        return rc;
    size_t len = strlen(db->err);
    if (p.rejected > 1) /* "...; 3 more rows rejected" */
        snprintf(db->err + len, sizeof db->err - len, "; %zu more row%s rejected", p.rejected - 1,
                 p.rejected == 2 ? "" : "s");
    return DB_ERR_ROW;
}

/* Rows of one table, each written with statement `which` from its column table. */
struct put_rows {
    int which;
    const struct col *cols;
    size_t ncols;
    const void *rows; /* n structs of `size` bytes */
    size_t size, n;
};

static int put_rows_body(struct db *db, void *arg)
{
    const struct put_rows *p = arg;
    sqlite3_stmt *st = stmt(db, p->which);
    if (!st)
        return SQLITE_ERROR;
    for (size_t i = 0; i < p->n; i++) {
        int rc = bind_cols(st, p->cols, p->ncols, (const char *)p->rows + i * p->size);
        rc = rc == SQLITE_OK ? step_reset(st) : rc;
        if (rc != SQLITE_DONE)
            return rc;
    }
    return SQLITE_OK;
}

/* The rows of p in one transaction of body, named "writing N <noun>s" in errors; DB_OK for none. */
static int put_rows_txn(struct db *db, struct put_rows *p, const char *noun, txn_body body)
{
    if (p->n == 0)
        return DB_OK;
    char what[64];
    snprintf(what, sizeof what, "writing %zu %s%s", p->n, noun, p->n == 1 ? "" : "s");
    return write_txn(db, what, body, p);
}

int db_put_batches(struct db *db, const struct db_batch *rows, size_t n)
{
    assert(db && (rows || n == 0));
    for (size_t i = 0; i < n; i++)
        if (!rows[i].id || !rows[i].id[0]) {
            set_err(db, "writing batches: row %zu has no id", i + 1);
            return DB_ERR;
        }
    struct put_rows p = {ST_BATCH, batch_cols, N_BATCH_COLS, rows, sizeof *rows, n};
    return put_rows_txn(db, &p, "batch row", put_rows_body);
}

static int put_parts_body(struct db *db, void *arg)
{
    const struct put_rows *p = arg;
    sqlite3_stmt *st = stmt(db, ST_PART), *stale = stmt(db, ST_PART_STALE);
    if (!st || !stale)
        return SQLITE_ERROR;
    const struct db_part *parts = p->rows;
    for (size_t i = 0; i < p->n; i++) {
        const struct db_part *r = &parts[i];
        if (i == 0 || strcmp(r->job_id, parts[i - 1].job_id) || strcmp(r->plan, parts[i - 1].plan)) {
            sqlite3_bind_text(stale, 1, r->job_id, -1, SQLITE_STATIC);
            sqlite3_bind_text(stale, 2, r->plan, -1, SQLITE_STATIC);
            int rc = step_reset(stale);
            if (rc != SQLITE_DONE)
                return rc;
        }
        int rc = bind_cols(st, p->cols, p->ncols, r);
        rc = rc == SQLITE_OK ? step_reset(st) : rc;
        if (rc != SQLITE_DONE)
            return rc;
    }
    return SQLITE_OK;
}

int db_put_parts(struct db *db, const struct db_part *parts, size_t n)
{
    assert(db && (parts || n == 0));
    for (size_t i = 0; i < n; i++)
        if (!parts[i].job_id || !parts[i].job_id[0] || !parts[i].plan || !parts[i].output) {
            set_err(db, "writing job parts: row %zu has no job id, plan or output", i + 1);
            return DB_ERR;
        }
    struct put_rows p = {ST_PART, part_cols, N_PART_COLS, parts, sizeof *parts, n};
    return put_rows_txn(db, &p, "job part", put_parts_body);
}

int db_get_parts(struct db *db, const char *job_id, const char *plan, db_part_fn fn, void *ctx)
{
    assert(db && job_id && plan && fn);
    sqlite3_stmt *st = stmt(db, ST_PART_GET);
    if (!st)
        return DB_ERR;
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, plan, -1, SQLITE_STATIC);
    int ret = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct db_part r;
        read_cols(st, part_cols, N_PART_COLS, &r);
        if ((ret = fn(ctx, &r)) != 0)
            break;
    }
    if (ret == 0 && rc != SQLITE_DONE) {
        set_err(db, "reading the parts of job '%.300s': %s", job_id, sqlite3_errmsg(db->h));
        ret = rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? DB_BUSY : DB_ERR;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return ret;
}

/* A typed row callback (db_batch_fn, db_worker_fn, db_metrics_fn) and its context. */
struct row_fn {
    int (*call)(const struct row_fn *f, const void *row);
    void (*fn)(void); /* the typed callback, cast back by call */
    void *ctx;
};
static int call_batch(const struct row_fn *f, const void *row)
{
    return ((db_batch_fn)f->fn)(f->ctx, row);
}
static int call_worker(const struct row_fn *f, const void *row)
{
    return ((db_worker_fn)f->fn)(f->ctx, row);
}
static int call_metrics(const struct row_fn *f, const void *row)
{
    return ((db_metrics_fn)f->fn)(f->ctx, row);
}

/* Streams the rows of "SELECT <cols> FROM table<tail>" to f (its parameters: text p1, then real
 * p2 when not NAN), each read into a struct of `size` bytes. 0, f's value, DB_ERR or DB_BUSY. */
static int query_rows(struct db *db, const char *table, const struct col *cols, size_t n, size_t size,
                      const char *tail, const char *p1, double p2, const struct row_fn *f)
{
    if (!db->h) {
        set_err(db, "reading %s: the database is not open", table);
        return DB_ERR;
    }
    char *sql = build_select(table, cols, n, tail);
    sqlite3_stmt *st = NULL;
    if (!sql || sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
        set_err(db, "reading %s: %s", table, sql ? sqlite3_errmsg(db->h) : "out of memory");
        free(sql);
        return DB_ERR;
    }
    free(sql);
    if (p1)
        sqlite3_bind_text(st, 1, p1, -1, SQLITE_STATIC);
    if (!isnan(p2))
        sqlite3_bind_double(st, 2, p2);
    char row[512];
    assert(size <= sizeof row);
    int rc, ret = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        memset(row, 0, size);
        read_cols(st, cols, n, row);
        if ((ret = f->call(f, row)) != 0)
            break;
    }
    if (!ret && rc != SQLITE_DONE) {
        set_err(db, "reading %s: %s", table, sqlite3_errmsg(db->h));
        ret = is_busy(rc) ? DB_BUSY : DB_ERR;
    }
    sqlite3_finalize(st);
    return ret;
}

int db_query_batches(struct db *db, const char *id, db_batch_fn fn, void *ctx)
{
    assert(db && fn);
    return query_rows(db, "batches", batch_cols, N_BATCH_COLS, sizeof(struct db_batch),
                      id ? " WHERE id = ?1" : " ORDER BY id", id, NAN,
                      &(struct row_fn){call_batch, (void (*)(void))fn, ctx});
}

int db_query_workers(struct db *db, const char *id, db_worker_fn fn, void *ctx)
{
    assert(db && fn);
    return query_rows(db, "workers", worker_cols, N_WORKER_COLS, sizeof(struct db_worker_row),
                      id ? " WHERE id = ?1" : " ORDER BY id", id, NAN,
                      &(struct row_fn){call_worker, (void (*)(void))fn, ctx});
}

int db_query_metrics(struct db *db, const char *worker_id, double ts, db_metrics_fn fn, void *ctx)
{
    assert(db && fn);
    const char *tail = !worker_id  ? " ORDER BY worker_id, ts"
                       : isnan(ts) ? " WHERE worker_id = ?1 ORDER BY ts"
                                   : " WHERE worker_id = ?1 AND ts = ?2";
    return query_rows(db, "worker_metrics", metric_cols, N_METRIC_COLS, sizeof(struct db_metrics), tail,
                      worker_id, worker_id ? ts : NAN,
                      &(struct row_fn){call_metrics, (void (*)(void))fn, ctx});
}

int db_query_results(struct db *db, const struct db_query *q, db_row_fn fn, void *ctx)
{
    assert(db && fn);
    struct db_query all = db_query_all();
    if (!q)
        q = &all;
    char sql[2048];
    size_t len = (size_t)snprintf(sql, sizeof sql, "SELECT ");
    for (size_t i = 0; i < N_JOB_COLS; i++)
        len += (size_t)snprintf(sql + len, sizeof sql - len, "%s%s", i ? ", " : "", job_cols[i].name);
    len += (size_t)snprintf(sql + len, sizeof sql - len, " FROM jobs WHERE 1");
    /* Parameters by name so each filter is independent of the others. */
    if (q->status >= 0)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND status = :status");
    if (!isnan(q->since))
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND finished_at >= :since");
    if (!isnan(q->until))
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND finished_at < :until");
    if (q->id)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND id = :id");
    if (q->custom_id)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND custom_id = :custom_id");
    if (q->batch_id)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND batch_id = :batch_id");
    if (q->form >= 0)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " AND request_form = :form");
    len += (size_t)snprintf(sql + len, sizeof sql - len, " ORDER BY finished_at, id");
    if (q->limit > 0)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " LIMIT :limit");
    assert(len < sizeof sql);

    sqlite3_stmt *st = NULL;
    if (!db->h) {
        set_err(db, "reading results: the database is not open");
        return DB_ERR;
    }
    if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
        set_err(db, "reading results: %s", sqlite3_errmsg(db->h));
        return DB_ERR;
    }
    if (q->status >= 0)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":status"), db_status_name(q->status), -1,
                          SQLITE_STATIC);
    if (!isnan(q->since))
        sqlite3_bind_double(st, sqlite3_bind_parameter_index(st, ":since"), q->since);
    if (!isnan(q->until))
        sqlite3_bind_double(st, sqlite3_bind_parameter_index(st, ":until"), q->until);
    if (q->id)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":id"), q->id, -1, SQLITE_STATIC);
    if (q->custom_id)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":custom_id"), q->custom_id, -1,
                          SQLITE_STATIC);
    if (q->batch_id)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":batch_id"), q->batch_id, -1, SQLITE_STATIC);
    if (q->form >= 0)
        sqlite3_bind_text(st, sqlite3_bind_parameter_index(st, ":form"),
                          q->form == DB_FORM_OPENAI ? "openai" : "llmq", -1, SQLITE_STATIC);
    if (q->limit > 0)
        sqlite3_bind_int64(st, sqlite3_bind_parameter_index(st, ":limit"), q->limit);

    int rc, ret = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct db_result r = db_result_empty(); /* `batch` is not a column: NULL */
        read_cols(st, job_cols, N_JOB_COLS, &r);
        ret = fn(ctx, &r);
        if (ret)
            break;
    }
    if (!ret && rc != SQLITE_DONE) {
        set_err(db, "reading results: %s", sqlite3_errmsg(db->h));
        ret = is_busy(rc) ? DB_BUSY : DB_ERR;
    }
    sqlite3_finalize(st);
    return ret;
}

int db_find_failed_line(struct db *db, const char *worker_id, const char *line, size_t len, int nth, db_row_fn fn,
                        void *ctx)
{
    assert(db && worker_id && line && fn && nth >= 1);
    char sql[1024];
    size_t n = (size_t)snprintf(sql, sizeof sql, "SELECT ");
    for (size_t i = 0; i < N_JOB_COLS; i++)
        n += (size_t)snprintf(sql + n, sizeof sql - n, "%s%s", i ? ", " : "", job_cols[i].name);
    n += (size_t)snprintf(sql + n, sizeof sql - n,
                          " FROM jobs WHERE status = 'failed' AND worker_id = ?1 AND request = ?2"
                          " ORDER BY finished_at DESC, id DESC LIMIT 1 OFFSET ?3");
    assert(n < sizeof sql);
    if (!db->h) {
        set_err(db, "reading results: the database is not open");
        return DB_ERR;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
        set_err(db, "reading results: %s", sqlite3_errmsg(db->h));
        return DB_ERR;
    }
    sqlite3_bind_text(st, 1, worker_id, -1, SQLITE_STATIC);
    sqlite3_bind_text64(st, 2, line, len, SQLITE_STATIC, SQLITE_UTF8);
    sqlite3_bind_int(st, 3, nth - 1);
    int rc = sqlite3_step(st), ret = 0;
    if (rc == SQLITE_ROW) {
        struct db_result r = db_result_empty();
        read_cols(st, job_cols, N_JOB_COLS, &r);
        ret = fn(ctx, &r);
    } else if (rc != SQLITE_DONE) {
        set_err(db, "reading results: %s", sqlite3_errmsg(db->h));
        ret = is_busy(rc) ? DB_BUSY : DB_ERR;
    }
    sqlite3_finalize(st);
    return ret;
}

/* ---- workers and metrics */

static int put_worker_body(struct db *db, void *arg)
{
    const struct db_worker *w = arg;
    sqlite3_stmt *st = stmt(db, ST_WORKER);
    if (!st)
        return SQLITE_ERROR;
    const char *text[] = {w->id, w->host, NULL, w->gpu, w->model, w->backend, w->version};
    for (int i = 0; i < 7; i++) {
        if (i == 2)
            sqlite3_bind_int64(st, 3, w->pid);
        else if (text[i])
            sqlite3_bind_text(st, i + 1, text[i], -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, i + 1);
    }
    sqlite3_bind_double(st, 8, w->started_at);
    int rc = step_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int db_put_worker(struct db *db, const struct db_worker *w)
{
    assert(db && w);
    if (!w->id || !w->id[0] || !isfinite(w->started_at)) {
        set_err(db, "writing worker '%s': %s", w->id ? w->id : "",
                !w->id || !w->id[0] ? "no id" : "no started_at");
        return DB_ERR;
    }
    char what[320];
    snprintf(what, sizeof what, "writing worker '%.256s'", w->id);
    return write_txn(db, what, put_worker_body, (void *)w);
}

struct touch {
    const char *id;
    double now;
    int64_t jobs_done;
    bool stopped;
    int changes;
};

static int touch_body(struct db *db, void *arg)
{
    struct touch *t = arg;
    sqlite3_stmt *st = stmt(db, ST_TOUCH);
    if (!st)
        return SQLITE_ERROR;
    sqlite3_bind_text(st, 1, t->id, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, t->now);
    sqlite3_bind_int64(st, 3, t->jobs_done);
    sqlite3_bind_int(st, 4, t->stopped);
    int rc = step_reset(st);
    t->changes = sqlite3_changes(db->h);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int db_touch_worker(struct db *db, const char *id, double now, int64_t jobs_done, bool stopped)
{
    assert(db && id);
    struct touch t = {id, now, jobs_done, stopped, 0};
    char what[320];
    snprintf(what, sizeof what, "updating worker '%.256s'", id);
    int rc = write_txn(db, what, touch_body, &t);
    if (rc == DB_OK && t.changes == 0) {
        set_err(db, "%s: no such worker (db_put_worker first)", what);
        return DB_ERR;
    }
    return rc;
}

int db_put_metrics(struct db *db, const struct db_metrics *rows, size_t n)
{
    assert(db && (rows || n == 0));
    for (size_t i = 0; i < n; i++)
        if (!rows[i].worker_id || !isfinite(rows[i].ts) || !isfinite(rows[i].interval_s)) {
            set_err(db, "writing metrics: row %zu has no %s", i + 1,
                    !rows[i].worker_id      ? "worker_id"
                    : !isfinite(rows[i].ts) ? "ts"
                                            : "interval_s");
            return DB_ERR;
        }
    if (n == 0)
        return DB_OK;
    struct put_rows p = {ST_METRICS, metric_cols, N_METRIC_COLS, rows, sizeof *rows, n};
    char what[64];
    snprintf(what, sizeof what, "writing %zu metrics row%s", n, n == 1 ? "" : "s");
    return write_txn(db, what, put_rows_body, &p);
}

int db_put_worker_rows(struct db *db, const struct db_worker_row *rows, size_t n)
{
    assert(db && (rows || n == 0));
    for (size_t i = 0; i < n; i++)
        if (!rows[i].w.id || !rows[i].w.id[0] || !isfinite(rows[i].w.started_at)) {
            set_err(db, "writing workers: row %zu has no %s", i + 1,
                    !rows[i].w.id || !rows[i].w.id[0] ? "id" : "started_at");
            return DB_ERR;
        }
    struct put_rows p = {ST_WORKER_ROW, worker_cols, N_WORKER_COLS, rows, sizeof *rows, n};
    return put_rows_txn(db, &p, "worker row", put_rows_body);
}

/* ---- opening and migrating */

/* The integer a one-row query returns (PRAGMAs, counts); -1 with db->err on failure. */
static int64_t query_int(struct db *db, const char *sql, int *rc_out)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    int64_t v = -1;
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            v = sqlite3_column_int64(st, 0);
            rc = SQLITE_OK;
        }
    }
    if (rc != SQLITE_OK)
        set_err(db, "%s: %s", sql, sqlite3_errmsg(db->h));
    sqlite3_finalize(st);
    if (rc_out)
        *rc_out = rc;
    return v;
}

static int exec(struct db *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        set_err(db, "%s: %s", sql, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return rc;
}

struct migrate {
    const struct db_migration *m;
    char msg[512]; /* why it failed, from sqlite3_exec */
};

/* One migration, inside write_txn's transaction. Another process may have applied it since we
 * looked: the version is read again under the write lock. */
static int migrate_body(struct db *db, void *arg)
{
    struct migrate *mg = arg;
    int rc;
    int64_t v = query_int(db, "PRAGMA user_version", &rc);
    if (rc != SQLITE_OK)
        return rc;
    if (v >= mg->m->version)
        return SQLITE_OK;
    char *msg = NULL;
    rc = sqlite3_exec(db->h, mg->m->sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        snprintf(mg->msg, sizeof mg->msg, "%s", msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc;
    }
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d", mg->m->version,
             LLMQ_APPLICATION_ID);
    return sqlite3_exec(db->h, sql, NULL, NULL, NULL);
}

/* Checks what the file holds: an llmq database (or an empty file) whose version this binary
 * knows. Sets db->version. */
static int check_schema(struct db *db)
{
    /* One read transaction, so the three answers come from one snapshot (another process may be
     * creating the schema right now). */
    int rc = exec(db, "BEGIN");
    int64_t app = rc == SQLITE_OK ? query_int(db, "PRAGMA application_id", &rc) : -1;
    int64_t ver = rc == SQLITE_OK ? query_int(db, "PRAGMA user_version", &rc) : -1;
    int64_t objects = rc == SQLITE_OK ? query_int(db, "SELECT count(*) FROM sqlite_schema", &rc) : -1;
    if (!sqlite3_get_autocommit(db->h))
        sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return is_busy(rc) ? DB_BUSY : DB_ERR; /* e.g. "file is not a database" */
    int n = db->o.n_migrations;
    if (app != 0 && app != LLMQ_APPLICATION_ID) {
        set_err(db, "not an llmq database (its PRAGMA application_id is %lld)", (long long)app);
        return DB_ERR;
    }
    if (app == 0 && (ver != 0 || objects != 0)) {
        set_err(db, "not an llmq database (it has tables or a user_version, but no llmq schema); "
                    "give llmq a new file");
        return DB_ERR;
    }
    if (ver > n) {
        set_err(db,
                "the database has schema version %lld, newer than this llmq knows (%d): upgrade llmq to "
                "use it",
                (long long)ver, n);
        return DB_ERR_NEWER;
    }
    db->version = (int)ver;
    if (ver < n && db->o.readonly) {
        set_err(db,
                "the database has schema version %lld, older than this llmq's %d: open it once read-write "
                "(e.g. with a worker) to migrate it",
                (long long)ver, n);
        return DB_ERR_OLDER;
    }
    return DB_OK;
}

/* Applies the migrations after db->version, each in its own transaction. */
static int migrate(struct db *db)
{
    int rc, n = db->o.n_migrations;
    for (int i = db->version; i < n; i++) {
        const struct db_migration *m = &db->o.migrations[i];
        if (m->version != i + 1) {
            set_err(db, "migration %s has version %d, expected %d", m->name, m->version, i + 1);
            return DB_ERR;
        }
        struct migrate mg = {m, ""};
        char what[160];
        snprintf(what, sizeof what, "migrating to schema version %d (%s)", m->version, m->name);
        rc = write_txn(db, what, migrate_body, &mg);
        if (rc != DB_OK) {
            if (mg.msg[0]) /* sqlite3_exec's message names the failing statement's problem */
                set_err(db, "%s: %s; the database stays at version %d", what, mg.msg, db->version);
            return rc;
        }
        db->version = m->version;
    }
    return DB_OK;
}

/* Connection settings: busy_timeout first (the others may wait for a lock), then WAL. */
static int configure(struct db *db)
{
    sqlite3_extended_result_codes(db->h, 1);
    sqlite3_busy_timeout(db->h, db->o.busy_timeout_ms);
    if (exec(db, "PRAGMA foreign_keys = ON"))
        return DB_ERR;
    return DB_OK;
}

static int set_wal_once(struct db *db);

/* Switching a new file to WAL takes an exclusive lock, and SQLite answers SQLITE_BUSY at once
 * (without the busy handler) when another connection is switching or migrating the same new file
 * at that moment: several workers starting together on an empty path. Retried with backoff for up
 * to busy_timeout. */
static int set_wal(struct db *db)
{
    double t0 = db_now();
    int rc, pause_ms = 5;
    while ((rc = set_wal_once(db)) == DB_BUSY && (db_now() - t0) * 1000.0 < db->o.busy_timeout_ms) {
        usleep((useconds_t)pause_ms * 1000);
        pause_ms = pause_ms < 100 ? pause_ms * 2 : 100;
    }
    return rc;
}

static int set_wal_once(struct db *db)
{
    /* journal_mode answers the mode it ended in: "wal", or "memory" for an in-memory database
     * (which cannot use WAL and needs no locking). Anything else is an error. */
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *mode = (const char *)sqlite3_column_text(st, 0);
        if (mode && strcmp(mode, "wal") && strcmp(mode, "memory")) {
            set_err(db, "cannot use WAL (journal_mode is %s): is the file on a network file system?", mode);
            sqlite3_finalize(st);
            return DB_ERR;
        }
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK) {
        set_err(db, "PRAGMA journal_mode = WAL: %s", sqlite3_errmsg(db->h));
        sqlite3_finalize(st);
        return is_busy(rc) ? DB_BUSY : DB_ERR;
    }
    sqlite3_finalize(st);
    /* NORMAL is durable across application crashes in WAL mode (a power loss may lose the last
     * commits, which Redis then replays); the WAL file is truncated back to 64 MiB after a
     * checkpoint. */
    if (exec(db, "PRAGMA synchronous = NORMAL") || exec(db, "PRAGMA journal_size_limit = 67108864"))
        return DB_ERR;
    return DB_OK;
}

/* A real write, so that a database this process cannot write is found at open and not with the
 * first results: PRAGMA user_version rewritten with its value, inside a write transaction. */
static int probe_body(struct db *db, void *arg)
{
    (void)arg;
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", db->version);
    return sqlite3_exec(db->h, sql, NULL, NULL, NULL);
}

/* Notes which files the path and its -wal and -shm name now (after a read-write open, when the
 * connection has all three open). */
static void note_files(struct db *db)
{
    for (int i = 0; i < F_COUNT; i++) {
        char name[4096];
        struct stat st;
        db->files[i].known =
            snprintf(name, sizeof name, "%s%s", db->path, file_suffix[i]) < (int)sizeof name &&
            stat(name, &st) == 0;
        db->files[i].dev = db->files[i].known ? st.st_dev : 0;
        db->files[i].ino = db->files[i].known ? st.st_ino : 0;
    }
}

/* When the folder of db->path is why the database cannot be made or written (missing, or not
 * writable by this process: SQLite makes the file and its -wal and -shm files there), says so in
 * db->err and returns true. */
static bool folder_to_blame(struct db *db)
{
    char dir[4096];
    const char *slash = strrchr(db->path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == db->path ? 1 : (int)(slash - db->path), db->path);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        set_err(db, "cannot create it: the folder %s does not exist", dir);
    else if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0)
        set_err(db, "permission denied: this process cannot write in the folder %s (SQLite keeps the database "
                    "and its -wal and -shm files there)",
                dir);
    else
        return false;
    return true;
}

/* Opens db->path with db->o into db->h: the connection, its settings, the schema; for a read-write
 * open also a write to prove it can write, and the files it opened. DB_OK or the code with db->err. */
static int open_conn(struct db *db)
{
    int flags = db->o.readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    db->version = 0;
    int rc = sqlite3_open_v2(db->path, &db->h, flags, NULL);
    if (rc != SQLITE_OK) {
        if (db->o.readonly || !folder_to_blame(db))
            set_err(db, "cannot open: %s", db->h ? sqlite3_errmsg(db->h) : sqlite3_errstr(rc));
        return DB_ERR;
    }
    if ((rc = configure(db)) != DB_OK || (rc = check_schema(db)) != DB_OK || db->o.readonly)
        return rc;
    if (sqlite3_db_readonly(db->h, "main") == 1) { /* SQLite fell back to reading */
        set_err(db, "cannot write: the file is read-only for this process (its permissions, or a read-only "
                    "file system)");
        return DB_UNWRITABLE;
    }
    if ((rc = set_wal(db)) != DB_OK) {
        folder_to_blame(db); /* no -wal file can be made beside it */
        return rc;
    }
    if ((rc = migrate(db)) != DB_OK)
        return rc;
    /* Locked by another writer: the file takes writes, and what is written later waits for the
     * lock as any write does; the open does not wait for it (a migration it needed has run). */
    int retries = db->o.busy_retries;
    db->o.busy_retries = 0;
    sqlite3_busy_timeout(db->h, 0);
    rc = write_txn(db, "checking that the database can be written", probe_body, NULL);
    sqlite3_busy_timeout(db->h, db->o.busy_timeout_ms);
    db->o.busy_retries = retries;
    if (rc == DB_BUSY)
        rc = DB_OK;
    if (rc == DB_OK)
        note_files(db);
    return rc;
}

int db_open(const char *path, const struct db_opts *o, struct db **out, char *err, size_t errlen)
{
    assert(path && out);
    *out = NULL;
    struct db *db = calloc(1, sizeof *db);
    if (db)
        db->path = strdup(path);
    if (!db || !db->path) {
        free(db);
        snprintf(err, errlen, "%s: out of memory", path);
        return DB_ERR;
    }
    db->o = o ? *o : db_opts_default();
    if (db->o.busy_timeout_ms < 0)
        db->o.busy_timeout_ms = 0;
    if (db->o.busy_retries < 0)
        db->o.busy_retries = 0;
    if (!db->o.migrations) {
        db->o.migrations = db_migrations;
        db->o.n_migrations = db_n_migrations;
    }
    db->rng = (unsigned)(time(NULL) ^ ((unsigned)getpid() << 16) ^ (unsigned)(uintptr_t)db) | 1u;

    int rc = open_conn(db);
    if (rc != DB_OK) {
        snprintf(err, errlen, "%s", db->err);
        db_close(db);
        return rc;
    }
    db->err[0] = 0;
    *out = db;
    return DB_OK;
}

/* The name of file i of the database (the path with its suffix) into name[4096]. */
static void file_name(const struct db *db, int i, char *name)
{
    snprintf(name, 4096, "%s%s", db->path, file_suffix[i]);
}

/* 1 when file i is what the path names now, 0 when the path names another file, -1 when nothing. */
static int same_file(const struct db *db, int i)
{
    char name[4096];
    struct stat st;
    file_name(db, i, name);
    if (stat(name, &st) != 0)
        return -1;
    return st.st_dev == db->files[i].dev && st.st_ino == db->files[i].ino;
}

bool db_file_moved(struct db *db)
{
    assert(db);
    if (!db->h) {
        set_err(db, "the database is not open: opening it again failed");
        return true;
    }
    for (int i = 0; i < F_COUNT; i++) {
        int same = db->files[i].known ? same_file(db, i) : 1;
        if (same == 1)
            continue;
        char name[4096];
        file_name(db, i, name);
        set_err(db,
                "%s%s was %s while the database was open (what is written goes into the old file, which "
                "nobody sees again)",
                i == F_MAIN ? "the file" : "its file ", i == F_MAIN ? "" : name,
                same < 0 ? "deleted" : "replaced");
        return true;
    }
    return false;
}

/* Closes the connection without touching the files at the path that are another's by now. */
static void close_conn(struct db *db)
{
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(db->st[i]);
        db->st[i] = NULL;
    }
    bool main_moved = db->files[F_MAIN].known && same_file(db, F_MAIN) != 1;
    if (db->h) { /* closing would otherwise delete <path>-wal and -shm: maybe the new database's */
        int keep = 1;
        sqlite3_file_control(db->h, "main", SQLITE_FCNTL_PERSIST_WAL, &keep);
        sqlite3_close_v2(db->h);
    }
    db->h = NULL;
    /* SQLite does not checkpoint a database whose file has moved, so when its -wal is still at the
     * path, it holds frames that a new file there would take for its own: remove it and its -shm */
    for (int i = F_WAL; main_moved && i < F_COUNT; i++)
        if (db->files[i].known && same_file(db, i) == 1) {
            char name[4096];
            file_name(db, i, name);
            unlink(name);
        }
    memset(db->files, 0, sizeof db->files);
}

int db_reopen(struct db *db)
{
    assert(db && !db->o.readonly);
    close_conn(db);
    int rc = open_conn(db);
    if (rc == DB_OK)
        return DB_OK;
    close_conn(db);
    return rc == DB_BUSY ? DB_BUSY : DB_UNWRITABLE;
}

void db_close(struct db *db)
{
    if (!db)
        return;
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(db->st[i]);
    sqlite3_close_v2(db->h); /* a no-op on NULL */
    free(db->path);
    free(db);
}
