/* `llmq requeue --batch ID --status failed`: runs a batch's finished jobs again from the requests
 * stored in SQLite (jobs.request), as new attempts of the same job keys, in one atomic step in
 * Redis (queue/batch_admin.h). docs/BATCHES.md is the user's side. */
#include <getopt.h> /* optind, struct option */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "queue/batch_admin.h"
#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"
#include "worker/store/db.h"

static const char CMD[] = "requeue";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq requeue [-c FILE] [--redis URL] [--db PATH] --batch ID [--status S]... [--dry-run]\n"
            "\n"
            "Runs the jobs of batch ID that ended with status S (default failed; --status cancelled, or\n"
            "several: --status failed,cancelled) again, from the requests the results database stored\n"
            "(jobs.request: each job as the worker received it). They are new attempts of the same jobs:\n"
            "the same keys, each hash reset to queued with attempts 0, pushed to the back of the queue\n"
            "they ran from; the batch's counts move from failed (or cancelled) back to queued and the\n"
            "batch is open again (running) until they end; a cancelled batch becomes running. When\n"
            "they end, their rows are replaced as for any re-run: a completed re-run replaces the row,\n"
            "a failed one replaces a failed row (the later wins) but not a cancelled one (SQLite's rule:\n"
            "completed > cancelled > failed). Fix what made them fail first (a worker's max_model_len, a\n"
            "template, ...), or they fail again.\n"
            "\n"
            "Refused as a whole, nothing pushed, when a job of the set is queued or running in Redis (a\n"
            "re-run already under way) or the batch is cancelled with jobs not yet ended. When the\n"
            "batch's Redis hash has expired (queues.result_ttl_s after it completed) it is made again\n"
            "from the database's rows.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis and sqlite sections\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "      --db PATH       the results database (default: the config's sqlite.path)\n"
            "  -b, --batch ID      the batch (required)\n"
            "  -s, --status S      failed (default), cancelled, or a comma list; may be repeated\n"
            "      --dry-run       list the jobs it would push (key, status, error code) and stop\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0 pushed (or nothing to push, or --dry-run), 1 refused, the database cannot be\n"
            "read, a row has no stored request, or Redis failed; 2 the command line is wrong.\n");
}

enum { O_DB = CLI_REDIS_O_OWN, O_DRY_RUN };

struct opts {
    const char *batch, *db;
    bool dry_run, bad_status;
    bool want[3]; /* by enum db_status */
    const char *bad;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct opts *o = ctx;
    switch (opt) {
    case 'b':
        o->batch = arg;
        break;
    case O_DB:
        o->db = arg;
        break;
    case O_DRY_RUN:
        o->dry_run = true;
        break;
    case 's': {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", arg);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int s = db_status_from_name(t);
            if (s == DB_FAILED || s == DB_CANCELLED)
                o->want[s] = true;
            else if (!o->bad_status) {
                o->bad_status = true;
                o->bad = arg;
            }
        }
        break;
    }
    }
}

/* The rows to push, copied out of the query. */
struct pick {
    char *id, *raw, *queue, *error_code;
    int status;
};

struct picks {
    struct pick *v;
    int n, cap;
    int no_request; /* rows without a stored request */
    const struct opts *o;
    const char *default_queue;
    bool oom;
};

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

static int on_row(void *ctx, const struct db_result *r)
{
    struct picks *p = ctx;
    if ((int)r->status < 0 || r->status > DB_CANCELLED || !p->o->want[r->status])
        return 0;
    if (!r->request) {
        fprintf(stderr, "llmq %s: job '%s' has no stored request (written before schema 3): left out\n", CMD,
                r->id);
        p->no_request++;
        return 0;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        struct pick *v = realloc(p->v, (size_t)cap * sizeof *v);
        if (!v) {
            p->oom = true;
            return 1;
        }
        p->v = v;
        p->cap = cap;
    }
    struct pick *k = &p->v[p->n++];
    k->id = strdup(r->id);
    k->raw = r->request_len ? strndup(r->request, r->request_len) : strdup(r->request);
    k->queue = dup_or_empty(r->queue && rq_valid_queue_ref(r->queue) ? r->queue : p->default_queue);
    k->error_code = dup_or_empty(r->error_code);
    k->status = (int)r->status;
    if (!k->id || !k->raw || !k->queue || !k->error_code) {
        p->oom = true;
        return 1;
    }
    return 0;
}

/* The batch as the database has it (for a Redis hash that expired): input, created_at, counts of
 * its rows. 0, or -1 (err). */
static int db_batch(struct db *db, const char *id, struct rq_batch_info *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    snprintf(b->id, sizeof b->id, "%s", id);
    sqlite3_stmt *st = NULL;
    const char *sql = "SELECT input, created_at, jobs, completed, failed, cancelled FROM batch_summary "
                      "WHERE batch_id = ?1";
    if (sqlite3_prepare_v2(db_handle(db), sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(db_handle(db)));
        return -1;
    }
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *in = sqlite3_column_text(st, 0);
        snprintf(b->input, sizeof b->input, "%s", in ? (const char *)in : "");
        b->created_at = sqlite3_column_double(st, 1);
        b->total = sqlite3_column_int64(st, 2);
        b->completed = sqlite3_column_int64(st, 3);
        b->failed = sqlite3_column_int64(st, 4);
        b->cancelled = sqlite3_column_int64(st, 5);
    }
    sqlite3_finalize(st);
    return 0;
}

int cmd_requeue(int argc, char **argv)
{
    static const struct option own[] = {
        {"batch", required_argument, NULL, 'b'},
        {"status", required_argument, NULL, 's'},
        {"dry-run", no_argument, NULL, O_DRY_RUN},
        {"db", required_argument, NULL, O_DB},
        {NULL, 0, NULL, 0},
    };
    struct opts o = {0};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "b:s:", .longopts = own, .on_opt = on_opt, .ctx = &o};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s' (the batch is named with --batch ID)",
                               argv[optind]);
    if (!o.batch)
        return cli_usage_error(CMD, "--batch ID is required (`llmq batch list` shows them)");
    if (!rq_valid_batch_id(o.batch, strlen(o.batch)))
        return cli_usage_error(CMD,
                               "--batch: '%s' is not a batch id (1 to %d letters, digits, '.', '_' or '-')",
                               o.batch, RQ_BATCH_ID_MAX);
    if (o.bad_status)
        return cli_usage_error(
            CMD, "--status: expected failed or cancelled (or both, comma-separated), got '%s'", o.bad);
    if (!o.want[DB_FAILED] && !o.want[DB_CANCELLED])
        o.want[DB_FAILED] = true;

    struct cfg c;
    int rc = cli_redis_config(CMD, a.config, a.redis, &c);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    const char *path = o.db ? o.db : c.sqlite.path;
    char err[1024];
    struct db *db = NULL;
    struct db_opts dbo = db_opts_default();
    dbo.readonly = true;
    if (access(path, F_OK) != 0 || db_open(path, &dbo, &db, err, sizeof err)) {
        if (access(path, F_OK) != 0)
            snprintf(err, sizeof err, "no database at %s (name it with --db PATH or -c FILE's sqlite.path)",
                     path);
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        return 1;
    }
    struct picks p = {.o = &o, .default_queue = "short"};
    struct db_query dq = db_query_all();
    dq.batch_id = o.batch;
    struct rq_batch_info from_db;
    int qrc = db_query_results(db, &dq, on_row, &p);
    if (qrc < 0 || (qrc == 0 && db_batch(db, o.batch, &from_db, err, sizeof err))) {
        fprintf(stderr, "llmq %s: %s\n", CMD, qrc < 0 ? db_errmsg(db) : err);
        rc = 1;
    } else if (p.oom) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    }
    db_close(db);
    const char *what = o.want[DB_FAILED] && o.want[DB_CANCELLED] ? "failed or cancelled"
                       : o.want[DB_FAILED]                       ? "failed"
                                                                 : "cancelled";
    if (rc == 0 && o.dry_run) {
        for (int i = 0; i < p.n; i++)
            printf("%s\t%s\t%s\n", p.v[i].id, db_status_name(p.v[i].status),
                   p.v[i].error_code[0] ? p.v[i].error_code : "-");
        fprintf(stderr, "llmq %s: would requeue %d %s job%s of batch %s (--dry-run: nothing pushed)\n", CMD,
                p.n, what, p.n == 1 ? "" : "s", o.batch);
    } else if (rc == 0 && p.n == 0) {
        fprintf(stderr, "llmq %s: batch %s has no %s jobs in %s\n", CMD, o.batch, what, path);
    } else if (rc == 0) {
        struct rq_batch_requeue_job *jobs = calloc((size_t)p.n, sizeof *jobs);
        struct rq *q = NULL;
        if (!jobs) {
            fprintf(stderr, "llmq %s: out of memory\n", CMD);
            rc = 1;
        } else
            rc = cli_redis_open(CMD, &c, &q);
        for (int i = 0; rc == 0 && i < p.n; i++)
            jobs[i] = (struct rq_batch_requeue_job){.raw = p.v[i].raw,
                                                    .id = p.v[i].id,
                                                    .queue = p.v[i].queue,
                                                    .status = db_status_name(p.v[i].status)};
        char why[512];
        int r = rc ? 0 : rq_batch_requeue(q, o.batch, jobs, p.n, &from_db, why, sizeof why);
        if (rc == 0 && r < 0) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        } else if (rc == 0 && r != RQ_BATCH_REQUEUE_OK) {
            fprintf(stderr, "llmq %s: refused, nothing pushed: %s\n", CMD, why);
            rc = 1;
        } else if (rc == 0) {
            printf("requeued %d %s job%s of batch %s\n", p.n, what, p.n == 1 ? "" : "s", o.batch);
        }
        free(jobs);
        rq_free(q);
    }
    if (rc == 0 && p.no_request)
        rc = 1;
    for (int i = 0; i < p.n; i++) {
        free(p.v[i].id);
        free(p.v[i].raw);
        free(p.v[i].queue);
        free(p.v[i].error_code);
    }
    free(p.v);
    cfg_free(&c);
    return rc;
}
