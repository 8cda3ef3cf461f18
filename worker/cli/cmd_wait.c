/* `llmq wait ID...`: blocks until the named jobs reach a final status (completed, failed,
 * cancelled), following the events stream, and prints each result as it arrives: the job hash's
 * fields and its result line (the hash's `result` field), or the result line and text from SQLite
 * when the hash has none (expired, or over redis.result_max_bytes) and the database is at hand.
 *
 * No event is missed between the first look and the first XREAD: the stream's last entry id is
 * read before the job hashes are, and XREAD starts after it (the fixed form of XREAD's "$"). The
 * hashes of the jobs still pending are read again every few seconds as well, so a trimmed stream
 * or a Redis restart cannot leave the command waiting for an event that is gone. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/json_exact.h"
#include "queue/conn.h"
#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"
#include "worker/store/db.h"

static const char CMD[] = "wait";

#define EXIT_TIMEOUT 124
#define EXIT_INTERRUPTED 130
#define EXIT_UNREACHABLE CLI_EXIT_UNREACHABLE
#define RECHECK_S 5.0    /* pending hashes are read again at least this often */
#define XREAD_COUNT 1000 /* events read per round */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq wait [-c FILE] [--redis URL] [--db PATH] [--timeout S] [--format text|json] ID...\n"
            "\n"
            "Waits until every named job has finished (completed, failed or cancelled), following the\n"
            "events stream (llmq:events), and prints each job's result as soon as it is final. A job\n"
            "that finished before the command started is printed at once; a job Redis does not know yet\n"
            "(not pushed yet, or pushed without a hash) is waited for. The ids are llmq job ids, or the\n"
            "custom_id of OpenAI batch lines.\n"
            "\n"
            "The result comes from the job's hash (llmq:job:<id>: status, tokens, error, and the result\n"
            "line with the text in its `result` field), so Redis alone is enough. A result too large for\n"
            "the hash (redis.result_max_bytes), or a job whose hash has expired (queues.result_ttl_s), is\n"
            "read from the SQLite database when it is readable here (-c FILE's sqlite.path, or --db PATH).\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis and sqlite sections\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "      --db PATH       the results database (sqlite.path); without it the configured one is\n"
            "                      used when the file exists; without one, a result that is in SQLite\n"
            "                      only is printed without its text\n"
            "  -t, --timeout S     give up after S seconds (exit 124); default 0: wait as long as it takes\n"
            "  -f, --format F      text (default): a line per job, then its text indented by two spaces;\n"
            "                      json: one JSON object per job and line, with its result line (as\n"
            "                      `llmq results` exports it) under \"result\"\n"
            "      --json          the same as --format json\n"
            "  -h, --help          this text\n"
            "\n"
            "Examples:\n"
            "  llmq enqueue --print-ids jobs.jsonl | xargs llmq wait --timeout 600\n"
            "  llmq wait -c llmq.yaml doc-1 && echo done\n"
            "  llmq wait --format json doc-1 doc-2 | jq -r .result.text\n"
            "\n"
            "A job whose hash disappears before it ends (`llmq purge` removed it from its queue, or the\n"
            "hash was deleted) ends the wait for it with status purged (or gone) and no result.\n"
            "\n"
            "Exit status: 0 when every job completed; 1 when any failed (dead-lettered included), was\n"
            "cancelled or purged; 124 on --timeout (the jobs still pending are listed on stderr); 130 on\n"
            "Ctrl-C; 2 when the command line is wrong; 69 when Redis (or a database named with --db)\n"
            "cannot be reached.\n");
}

/* The job hash fields read, in this order. */
static const char *const FIELDS[] = {
    "status", "finish_reason", "error",      "prompt_tokens", "completion_tokens", "attempts",
    "worker", "queue",         "created_at", "started_at",    "finished_at",       "result"};
enum {
    F_STATUS,
    F_FINISH,
    F_ERROR,
    F_PT,
    F_CT,
    F_ATT,
    F_WORKER,
    F_QUEUE,
    F_CREATED,
    F_STARTED,
    F_FINISHED,
    F_RESULT, /* not among the printed fields: the result line itself */
    NF
};

struct wjob {
    const char *id; /* borrowed from argv */
    bool done;
    bool failed; /* failed or cancelled */
    bool check;  /* an event said it ended: read its hash */
    bool seen;   /* its hash was seen while it had not ended */
    bool purged; /* a `purged` event named it (llmq purge) */
};

struct waiter {
    struct rq *q;
    struct db *db;      /* NULL when no database is readable (yet) */
    const char *dbpath; /* sqlite.path: opened when it appears (a worker creates it) */
    int busy_ms;        /* sqlite.busy_timeout_ms */
    bool db_told;       /* a failure to open it was reported */
    bool json;
    struct wjob *jobs; /* [n], sorted by id (bsearch from events) */
    int n, pending;
};

static bool final_status(const char *s)
{
    return s && (!strcmp(s, "completed") || !strcmp(s, "failed") || !strcmp(s, "cancelled"));
}

static int cmp_job(const void *a, const void *b)
{
    return strcmp(((const struct wjob *)a)->id, ((const struct wjob *)b)->id);
}

static struct wjob *find_job(struct waiter *w, const char *id, size_t len)
{
    char key[RQ_ID_MAX + 1];
    if (len > RQ_ID_MAX)
        return NULL;
    memcpy(key, id, len);
    key[len] = 0;
    struct wjob k = {.id = key};
    return bsearch(&k, w->jobs, (size_t)w->n, sizeof *w->jobs, cmp_job);
}

/* ---- the SQLite row */

struct row {
    bool found;
    bool in_sqlite; /* result is the hash's marker: the text is in SQLite only, not readable here */
    json_t *obj; /* the fields below as JSON, owned */
    char *output;
    char *result;
};

static json_t *jstr(const char *s)
{
    return s ? json_string(s) : json_null();
}
static json_t *jreal(double v)
{
    return isnan(v) ? json_null() : json_real(v);
}

static int on_row(void *ctx, const struct db_result *r)
{
    struct row *x = ctx;
    x->found = true;
    x->output = r->output ? strndup(r->output, r->output_len ? r->output_len : strlen(r->output)) : NULL;
    x->result = r->result ? strdup(r->result) : NULL;
    x->obj = json_object();
    json_object_set_new(x->obj, "status", json_string(db_status_name(r->status)));
    json_object_set_new(x->obj, "finish_reason", jstr(r->finish_reason));
    json_object_set_new(x->obj, "error", jstr(r->error));
    json_object_set_new(x->obj, "prompt_tokens", json_integer(r->prompt_tokens));
    json_object_set_new(x->obj, "completion_tokens", json_integer(r->completion_tokens));
    json_object_set_new(x->obj, "attempts", json_integer(r->attempts));
    json_object_set_new(x->obj, "worker", jstr(r->worker_id));
    json_object_set_new(x->obj, "queue", jstr(r->queue));
    json_object_set_new(x->obj, "created_at", jreal(r->created_at));
    json_object_set_new(x->obj, "started_at", jreal(r->started_at));
    json_object_set_new(x->obj, "finished_at", jreal(r->finished_at));
    return 1; /* one row is enough */
}

/* Opens the database read-only if it is not open yet and exists. 0, or -1 with err. */
static int db_try_open(struct waiter *w, char *err, size_t errlen)
{
    if (w->db || access(w->dbpath, F_OK) != 0)
        return 0;
    struct db_opts o = db_opts_default();
    o.readonly = true;
    o.busy_timeout_ms = w->busy_ms;
    return db_open(w->dbpath, &o, &w->db, err, errlen) ? -1 : 0;
}

static void row_lookup(struct waiter *w, const char *id, struct row *x)
{
    memset(x, 0, sizeof *x);
    char err[1024];
    if (db_try_open(w, err, sizeof err) && !w->db_told) {
        fprintf(stderr, "llmq %s: %s (results are printed without their text)\n", CMD, err);
        w->db_told = true;
    }
    if (!w->db)
        return;
    struct db_query dq = db_query_all();
    dq.id = id;
    dq.limit = 1;
    if (db_query_results(w->db, &dq, on_row, x) < 0)
        fprintf(stderr, "llmq %s: %s\n", CMD, db_errmsg(w->db));
}

/* The text of a result line: llmq's "text", or an OpenAI body's message content or text. */
static const char *result_text(json_t *res)
{
    json_t *t = json_object_get(res, "text");
    if (json_is_string(t))
        return json_string_value(t);
    json_t *c0 = json_array_get(
        json_object_get(json_object_get(json_object_get(res, "response"), "body"), "choices"), 0);
    t = json_object_get(json_object_get(c0, "message"), "content");
    if (!json_is_string(t))
        t = json_object_get(c0, "text");
    return json_string_value(t);
}

/* The row's result line and text from the hash's `result` field. false when there is none, or
 * only the marker that it is in SQLite (then *marker is set to it: a new string, or NULL). */
static bool row_from_hash(const redisReply *r, struct row *x, char **marker)
{
    memset(x, 0, sizeof *x);
    *marker = NULL;
    if (r->type != REDIS_REPLY_STRING)
        return false;
    json_t *res = json_loadb(r->str, r->len, 0, NULL);
    if (!json_is_object(res)) {
        json_decref(res);
        return false;
    }
    if (json_is_true(json_object_get(res, "truncated"))) {
        *marker = strndup(r->str, r->len);
        json_decref(res);
        return false;
    }
    const char *text = result_text(res);
    x->result = strndup(r->str, r->len);
    x->output = text ? strdup(text) : NULL;
    json_decref(res);
    return true;
}

/* The fields of a job whose hash disappeared before it ended (purged, or deleted by hand), with
 * no row either: status "purged" (a `purged` event said so) or "gone", and why, in x->obj. */
static void gone_row(const struct wjob *j, struct row *x)
{
    memset(x, 0, sizeof *x);
    x->obj = json_object();
    for (int i = 0; i < F_RESULT; i++)
        json_object_set_new(x->obj, FIELDS[i], json_null());
    json_object_set_new(x->obj, "status", json_string(j->purged ? "purged" : "gone"));
    json_object_set_new(x->obj, "error",
                        json_string(j->purged ? "removed from its queue by llmq purge before it ran; no result"
                                              : "its job hash disappeared before it ended (deleted); no result"));
}

static void row_free(struct row *x)
{
    json_decref(x->obj);
    free(x->output);
    free(x->result);
    memset(x, 0, sizeof *x);
}

/* ---- printing */

/* The hash's fields as a JSON object (numbers as numbers; absent ones null). */
static json_t *hash_obj(const redisReply *h)
{
    json_t *o = json_object();
    for (int i = 0; i < F_RESULT; i++) {
        const redisReply *e = h->element[i];
        json_t *v = json_null();
        if (e->type == REDIS_REPLY_STRING) {
            if (i == F_PT || i == F_CT || i == F_ATT)
                v = json_integer(strtoll(e->str, NULL, 10));
            else if (i == F_CREATED || i == F_STARTED || i == F_FINISHED)
                v = json_real(strtod(e->str, NULL));
            else
                v = json_stringn(e->str, e->len);
        }
        json_object_set_new(o, FIELDS[i], v);
    }
    return o;
}

static const char *ostr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* Prints one finished job: o (owned, taken) holds the fields; x the SQLite row, if any. */
static void print_job(struct waiter *w, const char *id, json_t *o, const struct row *x)
{
    if (w->json) {
        json_t *line = json_pack("{s:s}", "id", id);
        json_object_update(line, o);
        json_t *res = x->result ? json_loads(x->result, 0, NULL) : NULL;
        json_object_set_new(line, "result", res ? res : json_null());
        char *txt = json_dumps_exact(line, JSON_COMPACT);
        if (txt)
            printf("%s\n", txt);
        free(txt);
        json_decref(line);
    } else {
        const char *status = ostr(o, "status");
        printf("%s: %s", id, status);
        if (*ostr(o, "finish_reason"))
            printf(" (%s)", ostr(o, "finish_reason"));
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        if (json_is_integer(ct))
            printf(", %lld prompt + %lld completion tokens", (long long)json_integer_value(pt),
                   (long long)json_integer_value(ct));
        double st = json_real_value(json_object_get(o, "started_at")),
               fin = json_real_value(json_object_get(o, "finished_at"));
        if (st > 0 && fin >= st)
            printf(", %.2f s", fin - st);
        if (*ostr(o, "worker"))
            printf(", worker %s", ostr(o, "worker"));
        printf("\n");
        if (*ostr(o, "error"))
            printf("  error: %s\n", ostr(o, "error"));
        if (x->in_sqlite)
            printf("  (the result is in SQLite only: name the database with --db or -c)\n");
        if (x->output && strcmp(status, "failed")) {
            const char *p = x->output;
            while (*p) {
                const char *nl = strchr(p, '\n');
                size_t len = nl ? (size_t)(nl - p) : strlen(p);
                printf("  %.*s\n", (int)len, p);
                p += len + (nl ? 1 : 0);
            }
        }
    }
    fflush(stdout);
    json_decref(o);
}

/* Marks j done and prints it, from the hash reply h (its status final), or from the row. */
static void finish(struct waiter *w, struct wjob *j, const redisReply *h, struct row *x)
{
    json_t *o = h ? hash_obj(h) : json_incref(x->obj);
    const char *status = ostr(o, "status");
    j->done = true;
    j->failed = strcmp(status, "completed") != 0;
    w->pending--;
    print_job(w, j->id, o, x);
}

/* Reads the hashes of the pending jobs (all, or those marked by an event) and finishes those
 * that ended. `first`: also tells on stderr about jobs Redis does not know. 0, or -1 (rq_error). */
static int check_jobs(struct waiter *w, bool all, bool first)
{
    struct rq *q = w->q;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    int *which = malloc(((size_t)w->n + 1) * sizeof *which), nw = 0;
    if (!which)
        return rq_fail(q, "wait: out of memory");
    for (int i = 0; i < w->n; i++) {
        struct wjob *j = &w->jobs[i];
        if (j->done || !(all || j->check))
            continue;
        rq_pipe_cmd(p, "HMGET");
        rq_pipe_fmt(p, "%s%s", q->keys.job_stem, j->id); /* a copy: the pipe borrows rq_pipe_str's */
        for (int f = 0; f < NF; f++)
            rq_pipe_str(p, FIELDS[f]);
        which[nw++] = i;
    }
    if (nw && rq_pipe_exec(p, &q->cmd, &q->scripts)) {
        free(which);
        return rq_fail_conn(q, "wait");
    }
    for (int k = 0; k < nw; k++) {
        struct wjob *j = &w->jobs[which[k]];
        const redisReply *h = p->reply[k];
        j->check = false;
        if (h->type != REDIS_REPLY_ARRAY || (int)h->elements != NF)
            continue;
        const redisReply *s = h->element[F_STATUS];
        bool known = s->type == REDIS_REPLY_STRING;
        if (known && !final_status(s->str))
            j->seen = true;
        if (known && final_status(s->str)) {
            struct row x;
            char *marker;
            if (!row_from_hash(h->element[F_RESULT], &x, &marker)) {
                row_lookup(w, j->id, &x);
                if (!x.found && marker) { /* no database here: say where the result is */
                    free(x.result);
                    x.result = marker;
                    marker = NULL;
                    x.in_sqlite = true;
                }
            }
            free(marker);
            finish(w, j, h, &x);
            row_free(&x);
        } else if (!known) { /* no hash: never seen, or expired after it ended */
            struct row x;
            row_lookup(w, j->id, &x);
            if (!x.found && (j->purged || j->seen)) {
                row_free(&x);
                gone_row(j, &x);
                finish(w, j, NULL, &x);
            } else if (x.found)
                finish(w, j, NULL, &x);
            else if (first)
                fprintf(stderr, "llmq %s: %s: not known to Redis yet (no job hash); waiting for it\n", CMD,
                        j->id);
            row_free(&x);
        }
    }
    free(which);
    return 0;
}

/* The stream's last entry id into last ("0-0" when it is empty or missing). 0, or -1. */
static int stream_tail(struct rq *q, char *last, size_t len)
{
    redisReply *r = rq_conn_command(&q->cmd, "XREVRANGE %s + - COUNT 1", q->keys.events);
    if (!r)
        return rq_fail_conn(q, "wait");
    snprintf(last, len, "0-0");
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 && r->element[0]->type == REDIS_REPLY_ARRAY &&
        r->element[0]->elements >= 1 && r->element[0]->element[0]->type == REDIS_REPLY_STRING)
        snprintf(last, len, "%s", r->element[0]->element[0]->str);
    int rc = rq_reply_error(r, "wait (XREVRANGE)", q->err, sizeof q->err);
    freeReplyObject(r);
    return rc ? -1 : 0;
}

/* One XREAD BLOCK of at most block_ms on the blocking connection: marks the pending jobs an
 * event says ended, advances last. Returns how many were marked, or -1. */
static int read_events(struct waiter *w, char *last, size_t len, int block_ms)
{
    struct rq *q = w->q;
    redisReply *r = rq_conn_command(&q->blk, "XREAD COUNT %d BLOCK %d STREAMS %s %s", XREAD_COUNT, block_ms,
                                    q->keys.events, last);
    if (!r)
        return rq_fail(q, "wait: %s", q->blk.err);
    int marked = 0;
    if (rq_reply_error(r, "wait (XREAD)", q->err, sizeof q->err)) {
        freeReplyObject(r);
        return -1;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 && r->element[0]->type == REDIS_REPLY_ARRAY &&
        r->element[0]->elements == 2) {
        const redisReply *entries = r->element[0]->element[1];
        for (size_t e = 0; entries->type == REDIS_REPLY_ARRAY && e < entries->elements; e++) {
            const redisReply *en = entries->element[e];
            if (en->type != REDIS_REPLY_ARRAY || en->elements != 2 ||
                en->element[0]->type != REDIS_REPLY_STRING)
                continue;
            snprintf(last, len, "%s", en->element[0]->str);
            const redisReply *kv = en->element[1];
            const redisReply *id = NULL, *st = NULL;
            for (size_t k = 0; kv->type == REDIS_REPLY_ARRAY && k + 1 < kv->elements; k += 2) {
                const redisReply *f = kv->element[k];
                if (f->type != REDIS_REPLY_STRING)
                    continue;
                if (!strcmp(f->str, "id"))
                    id = kv->element[k + 1];
                else if (!strcmp(f->str, "status"))
                    st = kv->element[k + 1];
            }
            if (!id || !st || id->type != REDIS_REPLY_STRING || st->type != REDIS_REPLY_STRING)
                continue;
            bool purged = !strcmp(st->str, "purged");
            if (!purged && !final_status(st->str))
                continue;
            struct wjob *j = find_job(w, id->str, id->len);
            if (j && purged)
                j->purged = true;
            if (j && !j->done && !j->check) {
                j->check = true;
                marked++;
            }
        }
    }
    freeReplyObject(r);
    return marked;
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= 0) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

enum { O_TIMEOUT = CLI_REDIS_O_OWN, O_DB };

struct wait_args {
    const char *timeout, *format, *db;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct wait_args *wa = ctx;
    if (opt == 't' || opt == O_TIMEOUT)
        wa->timeout = arg;
    else if (opt == 'f')
        wa->format = arg;
    else if (opt == O_DB)
        wa->db = arg;
}

int cmd_wait(int argc, char **argv)
{
    static const struct option own[] = {
        {"timeout", required_argument, NULL, 't'},
        {"format", required_argument, NULL, 'f'},
        {"db", required_argument, NULL, O_DB},
        {NULL, 0, NULL, 0},
    };
    struct wait_args wa = {0};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "t:f:", .longopts = own, .on_opt = on_opt, .ctx = &wa};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    double timeout = 0;
    if (wa.timeout && parse_seconds(wa.timeout, &timeout))
        return cli_usage_error(CMD, "--timeout: expected seconds >= 0, got '%s'", wa.timeout);
    bool json = false;
    if (wa.format && !strcmp(wa.format, "json"))
        json = true;
    else if (wa.format && strcmp(wa.format, "text"))
        return cli_usage_error(CMD, "--format: expected text or json, got '%s'", wa.format);
    if (optind >= argc)
        return cli_usage_error(CMD, "name the jobs to wait for (one or more ids)");
    int rc = cli_redis_check_ids(CMD, argc, argv, optind);
    if (rc)
        return rc;

    struct cfg c;
    rc = cli_redis_config(CMD, a.config, a.redis, &c);
    char err[1024];
    if (!rc && wa.db && cfg_set(&c, "sqlite.path", wa.db, "--db", err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        rc = 2;
    }
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    /* the database: the one named with --db must open; the configured one is used once it exists */
    struct waiter w = {.json = json, .dbpath = c.sqlite.path, .busy_ms = c.sqlite.busy_timeout_ms};
    if (wa.db && (access(w.dbpath, F_OK) != 0 || db_try_open(&w, err, sizeof err))) {
        if (access(w.dbpath, F_OK))
            fprintf(stderr, "llmq %s: --db: no database at %s\n", CMD, w.dbpath);
        else
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        return EXIT_UNREACHABLE;
    }
    if (cli_redis_open(CMD, &c, &w.q)) {
        db_close(w.db);
        cfg_free(&c);
        return EXIT_UNREACHABLE;
    }

    /* the jobs, sorted by id, each once */
    w.jobs = calloc((size_t)(argc - optind), sizeof *w.jobs);
    if (!w.jobs) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rq_free(w.q);
        db_close(w.db);
        cfg_free(&c);
        return 1;
    }
    for (int i = optind; i < argc; i++)
        w.jobs[w.n++].id = argv[i];
    qsort(w.jobs, (size_t)w.n, sizeof *w.jobs, cmp_job);
    int uniq = 0;
    for (int i = 0; i < w.n; i++)
        if (uniq == 0 || strcmp(w.jobs[uniq - 1].id, w.jobs[i].id))
            w.jobs[uniq++] = w.jobs[i];
    w.n = w.pending = uniq;

    cli_catch_interrupts();

    double start = rq_wall_s(), deadline = timeout > 0 ? start + timeout : INFINITY;
    char last[64];
    bool trouble = false; /* Redis failed; told once until it works again */
    bool started = false; /* the stream's tail is known and the first look is done */
    double next_check = 0;
    while (w.pending > 0 && !cli_interrupted()) {
        double now = rq_wall_s();
        if (now >= deadline)
            break;
        int r = 0;
        if (!started) {
            r = stream_tail(w.q, last, sizeof last);
            if (r == 0)
                r = check_jobs(&w, true, true);
            if (r == 0) {
                started = true;
                next_check = now + RECHECK_S;
            }
        } else {
            double left_ms = (deadline - now) * 1000;
            int block = w.q->o.block_timeout_ms;
            if (block > 1000)
                block = 1000; /* Ctrl-C is seen within a second */
            if (left_ms < block)
                block = left_ms < 1 ? 1 : (int)left_ms;
            r = read_events(&w, last, sizeof last, block);
            if (r > 0)
                r = check_jobs(&w, false, false);
            if (r >= 0 && rq_wall_s() >= next_check) {
                r = check_jobs(&w, true, false);
                next_check = rq_wall_s() + RECHECK_S;
            }
        }
        if (r < 0) {
            if (!trouble)
                fprintf(stderr, "llmq %s: %s (trying again)\n", CMD, rq_error(w.q));
            trouble = true;
            struct timespec ts = {0, 200000000L};
            nanosleep(&ts, NULL);
        } else if (trouble) {
            fprintf(stderr, "llmq %s: redis is back\n", CMD);
            trouble = false;
        }
    }

    int ret = 0;
    for (int i = 0; i < w.n; i++)
        if (w.jobs[i].done && w.jobs[i].failed)
            ret = 1;
    if (w.pending > 0) {
        ret = cli_interrupted() ? EXIT_INTERRUPTED : EXIT_TIMEOUT;
        fprintf(stderr, "llmq %s: %s after %.1f s; %d of %d job%s still pending:", CMD,
                cli_interrupted() ? "interrupted" : "timed out", rq_wall_s() - start, w.pending, w.n,
                w.n == 1 ? "" : "s");
        int shown = 0;
        for (int i = 0; i < w.n && shown < 20; i++)
            if (!w.jobs[i].done) {
                fprintf(stderr, " %s", w.jobs[i].id);
                shown++;
            }
        fprintf(stderr, "%s\n", w.pending > shown ? " ..." : "");
    }
    free(w.jobs);
    rq_free(w.q);
    db_close(w.db);
    cfg_free(&c);
    return ret;
}
