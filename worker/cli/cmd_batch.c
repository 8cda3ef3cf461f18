/* `llmq batch list|status|wait|cancel`: batches (one `llmq enqueue` each) as first-class objects.
 * The dispatcher, list, status and cancel are here; wait is in cmd_batch_wait.c. docs/BATCHES.md
 * is the user's side. */
#include <errno.h>
#include <getopt.h> /* optind, struct option */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "queue/batch_admin.h"
#include "queue/rq.h"
#include "worker/cli/batch_show.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"
#include "worker/store/db.h"

static void usage(FILE *f)
{
    fprintf(f, "Usage: llmq batch list   [-c FILE] [--redis URL] [--limit N] [--format text|json]\n"
               "       llmq batch status [-c FILE] [--redis URL] [--db PATH] [--format text|json] ID\n"
               "       llmq batch wait   [-c FILE] [--redis URL] [--timeout S] ID\n"
               "       llmq batch cancel [-c FILE] [--redis URL] ID\n"
               "\n"
               "A batch is the jobs of one `llmq enqueue` (its id is printed by enqueue, or named with\n"
               "--batch NAME), like an OpenAI Batch: counts by status, and a state (queued, running,\n"
               "completed when every job has a final row, cancelled).\n"
               "\n"
               "  list     the newest batches first: id, state, created, counts, input\n"
               "  status   one batch: its counts and state from Redis, and from SQLite (--db, or the\n"
               "           config's sqlite.path when the file exists) its tokens and latency p50/p95\n"
               "  wait     block until the batch has finished (no polling: it listens on llmq:batch-done);\n"
               "           the exit status says how it ended\n"
               "  cancel   cancel every job of the batch that has not ended\n"
               "\n"
               "Related: llmq results --batch ID (its results, an OpenAI output and errors file),\n"
               "llmq requeue --batch ID --status failed (run its failed jobs again).\n"
               "'llmq batch <command> --help' explains one command and its exit status.\n");
}

/* ---- list */

static void list_usage(FILE *f)
{
    fprintf(f, "Usage: llmq batch list [-c FILE] [--redis URL] [-n N] [--format text|json]\n"
               "\n"
               "Lists the newest batches first (from llmq:batches): id, state, when created, the counts by\n"
               "status, and the input file. A batch whose hash has expired (queues.result_ttl_s after it\n"
               "completed) is listed as 'expired' without counts; its rows stay in SQLite.\n"
               "\n"
               "Options:\n"
               "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
               "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
               "  -n, --limit N       at most N batches (default 20; 0 = all)\n"
               "  -f, --format F      text (default: a table) or json (one object per line)\n"
               "      --json          the same as --format json\n"
               "  -h, --help          this text\n"
               "\n"
               "Exit status: 0, 1 when Redis fails, 2 when the command line is wrong.\n");
}

struct opts {
    const char *format, *limit, *db, *timeout;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct opts *o = ctx;
    if (opt == 'f')
        o->format = arg;
    else if (opt == 'n')
        o->limit = arg;
    else if (opt == 'd')
        o->db = arg;
    else if (opt == 't')
        o->timeout = arg;
}

/* --format: 0 text, 1 json, -1 after reporting a bad value */
static int parse_format(const char *cmd, const char *s)
{
    if (!s || !strcmp(s, "text"))
        return 0;
    if (!strcmp(s, "json"))
        return 1;
    cli_usage_error(cmd, "--format: expected text or json, got '%s'", s);
    return -1;
}

static int batch_list(int argc, char **argv)
{
    static const char CMD[] = "batch list";
    static const struct option own[] = {
        {"format", required_argument, NULL, 'f'},
        {"limit", required_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    struct opts o = {0};
    const struct cli_redis_spec spec = {
        .usage = list_usage, .shortopts = "f:n:", .longopts = own, .on_opt = on_opt, .ctx = &o};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int json = parse_format(CMD, o.format);
    if (json < 0)
        return 2;
    long limit = 20;
    if (o.limit) {
        char *end;
        errno = 0;
        limit = strtol(o.limit, &end, 10);
        if (end == o.limit || *end || errno || limit < 0 || limit > 1000000)
            return cli_usage_error(CMD, "--limit: expected a number of batches >= 0, got '%s'", o.limit);
    }
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    struct rq_batch_info *b = NULL;
    int n = 0;
    if (rc == 0 && rq_batch_list(q, (int)limit, &b, &n)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
        rc = 1;
    }
    if (rc == 0 && !json && n)
        printf("%-40s %-9s %-19s %7s %7s %7s %9s %7s %9s  %s\n", "ID", "STATE", "CREATED", "TOTAL", "QUEUED",
               "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "INPUT");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (json) {
            batch_show_put_json(stdout, batch_show_json(&b[i]));
            continue;
        }
        char t[32];
        if (!b[i].exists)
            printf("%-40s %-9s\n", b[i].id, "expired");
        else
            printf("%-40s %-9s %-19s %7lld %7lld %7lld %9lld %7lld %9lld  %s\n", b[i].id, b[i].state,
                   batch_show_time(b[i].created_at, t, sizeof t), b[i].total, b[i].queued, b[i].running,
                   b[i].completed, b[i].failed, b[i].cancelled, b[i].input);
    }
    if (rc == 0 && !json && !n)
        fprintf(stderr, "llmq %s: no batches\n", CMD);
    free(b);
    rq_free(q);
    cfg_free(&c);
    return rc;
}

/* ---- status */

static void status_usage(FILE *f)
{
    fprintf(f, "Usage: llmq batch status [-c FILE] [--redis URL] [--db PATH] [--format text|json] ID\n"
               "\n"
               "Shows one batch: state, input, created and finished times, and its jobs by status, from its\n"
               "Redis hash (llmq:batch:ID). From the results database (--db PATH, else the config's\n"
               "sqlite.path when that file exists) it adds the rows the database holds for the batch, their\n"
               "prompt and completion tokens and the latency p50/p95 of its completed jobs (the\n"
               "batch_summary view); a batch whose hash has expired is shown from the database alone.\n"
               "\n"
               "Options:\n"
               "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis and sqlite sections\n"
               "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
               "      --db PATH       the results database (an error when it cannot be read)\n"
               "  -f, --format F      text (default) or json (one object; \"db\" holds the database's part)\n"
               "      --json          the same as --format json\n"
               "  -h, --help          this text\n"
               "\n"
               "Exit status: 0 the batch was found, 1 neither Redis nor the database knows it (or Redis\n"
               "failed, or --db cannot be read), 2 the command line is wrong.\n");
}

/* The batch_summary row of batch id in the database at path: into *b (when Redis had nothing) and
 * *sum. 1 found, 0 not, -1 (err). */
struct db_summary {
    long long rows, prompt_tokens, completion_tokens;
    double p50_ms, p95_ms; /* NAN when no completed job */
};

static int read_summary(const char *path, const char *id, struct rq_batch_info *b, struct db_summary *sum,
                        char *err, size_t errlen)
{
    struct db_opts o = db_opts_default();
    o.readonly = true;
    struct db *db = NULL;
    if (db_open(path, &o, &db, err, errlen))
        return -1;
    sqlite3_stmt *st = NULL;
    int found = 0;
    const char *sql = "SELECT input, state, total, jobs, completed, failed, cancelled, prompt_tokens, "
                      "completion_tokens, latency_p50_ms, latency_p95_ms, created_at, finished_at "
                      "FROM batch_summary WHERE batch_id = ?1";
    if (sqlite3_prepare_v2(db_handle(db), sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, sqlite3_errmsg(db_handle(db)));
        db_close(db);
        return -1;
    }
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        found = 1;
        sum->rows = sqlite3_column_int64(st, 3);
        sum->prompt_tokens = sqlite3_column_int64(st, 7);
        sum->completion_tokens = sqlite3_column_int64(st, 8);
        sum->p50_ms = sqlite3_column_type(st, 9) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 9);
        sum->p95_ms = sqlite3_column_type(st, 10) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 10);
        if (!b->exists) { /* the hash expired: what the database knows */
            const unsigned char *in = sqlite3_column_text(st, 0), *state = sqlite3_column_text(st, 1);
            snprintf(b->input, sizeof b->input, "%s", in ? (const char *)in : "");
            snprintf(b->state, sizeof b->state, "%s", state ? (const char *)state : "");
            b->total = sqlite3_column_type(st, 2) == SQLITE_NULL ? sum->rows : sqlite3_column_int64(st, 2);
            b->completed = sqlite3_column_int64(st, 4);
            b->failed = sqlite3_column_int64(st, 5);
            b->cancelled = sqlite3_column_int64(st, 6);
            b->created_at = sqlite3_column_double(st, 11);
            b->finished_at = sqlite3_column_double(st, 12);
        }
    }
    sqlite3_finalize(st);
    db_close(db);
    return found;
}

static int batch_status(int argc, char **argv)
{
    static const char CMD[] = "batch status";
    static const struct option own[] = {
        {"format", required_argument, NULL, 'f'},
        {"db", required_argument, NULL, 'd'},
        {NULL, 0, NULL, 0},
    };
    struct opts o = {0};
    const struct cli_redis_spec spec = {
        .usage = status_usage, .shortopts = "f:", .longopts = own, .on_opt = on_opt, .ctx = &o};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (argc - optind != 1)
        return cli_usage_error(CMD, "give one batch id");
    const char *id = argv[optind];
    int json = parse_format(CMD, o.format);
    if (json < 0)
        return 2;
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    struct rq_batch_info b;
    int found = 0;
    if (rc == 0 && (found = rq_batch_get(q, id, &b)) < 0) {
        fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
        rc = 1;
    }
    struct db_summary sum = {0};
    int in_db = 0;
    const char *path = o.db ? o.db : c.sqlite.path;
    if (rc == 0 && (o.db || (path && access(path, F_OK) == 0))) {
        char err[1024];
        in_db = read_summary(path, id, &b, &sum, err, sizeof err);
        if (in_db < 0) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            rc = o.db ? 1 : 0; /* the config's database is a bonus; --db was asked for */
            in_db = 0;
        }
    }
    if (rc == 0 && !found && !in_db) {
        fprintf(stderr, "llmq %s: no batch '%s' (not in Redis%s)\n", CMD, id,
                path && access(path, F_OK) == 0 ? " nor in the database" : "; name the database with --db");
        rc = 1;
    }
    if (rc == 0 && json) {
        json_t *j = batch_show_json(&b);
        if (!found && j) { /* from the database alone */
            json_object_set_new(j, "state", json_string(b.state));
            json_object_set_new(j, "expired", json_true());
        }
        if (in_db && j) {
            json_t *d = json_object();
            json_object_set_new(d, "rows", json_integer(sum.rows));
            json_object_set_new(d, "prompt_tokens", json_integer(sum.prompt_tokens));
            json_object_set_new(d, "completion_tokens", json_integer(sum.completion_tokens));
            json_object_set_new(d, "latency_p50_ms", isnan(sum.p50_ms) ? json_null() : json_real(sum.p50_ms));
            json_object_set_new(d, "latency_p95_ms", isnan(sum.p95_ms) ? json_null() : json_real(sum.p95_ms));
            json_object_set_new(j, "db", d);
        }
        batch_show_put_json(stdout, j);
    } else if (rc == 0) {
        char t[32];
        printf("batch %s: %s%s\n", id, b.state,
               found ? "" : " (its Redis hash has expired; from the database)");
        printf("  input     %s\n", b.input);
        printf("  created   %s\n", batch_show_time(b.created_at, t, sizeof t));
        printf("  finished  %s\n", batch_show_time(b.finished_at, t, sizeof t));
        printf("  jobs      ");
        batch_show_counts(stdout, &b);
        printf("%s\n", b.enqueuing ? " (an enqueue is still adding jobs)" : "");
        if (in_db) {
            printf("  database  %lld rows, %lld prompt + %lld completion tokens", sum.rows, sum.prompt_tokens,
                   sum.completion_tokens);
            if (!isnan(sum.p50_ms))
                printf(", latency p50 %.0f ms, p95 %.0f ms", sum.p50_ms, sum.p95_ms);
            printf("\n");
        }
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}

/* ---- cancel */

static void cancel_usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq batch cancel [-c FILE] [--redis URL] ID\n"
            "\n"
            "Cancels every job of the batch that has not ended, in one atomic step in Redis:\n"
            "  - the batch's state becomes 'cancelled';\n"
            "  - its running jobs are asked to stop (as `llmq cancel` does): the worker stops each at its\n"
            "    next step and writes its row, status cancelled, with what it generated so far;\n"
            "  - its queued jobs stay in their queue lists until a worker fetches them, which then\n"
            "    cancels each at once without running it (a row with status cancelled, error_code\n"
            "    cancelled, no tokens). So every job still gets its row, and `llmq requeue --batch ID\n"
            "    --status cancelled` can run them later.\n"
            "Jobs that already ended keep their result. The counts stay exact as jobs end; the batch\n"
            "finishes (finished_at, a batch_completed event, a message on llmq:batch-done) when the\n"
            "last one has, with state 'cancelled'. `llmq batch wait ID` waits for that.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0 cancelled (also when it was cancelled before), 1 no such batch, it has\n"
            "completed already, or Redis failed, 2 the command line is wrong.\n");
}

static int batch_cancel(int argc, char **argv)
{
    static const char CMD[] = "batch cancel";
    const struct cli_redis_spec spec = {.usage = cancel_usage};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (argc - optind != 1)
        return cli_usage_error(CMD, "give one batch id");
    const char *id = argv[optind];
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc == 0) {
        long long asked, queued;
        int r = rq_batch_cancel(q, id, &asked, &queued);
        switch (r) {
        case RQ_BATCH_CANCEL_DONE:
        case RQ_BATCH_CANCEL_ALREADY:
            printf(
                "batch %s: %scancelled; %lld running job%s asked to stop, %lld queued job%s cancelled when a "
                "worker takes them\n",
                id, r == RQ_BATCH_CANCEL_ALREADY ? "already " : "", asked, asked == 1 ? "" : "s", queued,
                queued == 1 ? "" : "s");
            break;
        case RQ_BATCH_CANCEL_UNKNOWN:
            fprintf(stderr, "llmq %s: no batch '%s' in Redis\n", CMD, id);
            rc = 1;
            break;
        case RQ_BATCH_CANCEL_COMPLETED:
            fprintf(stderr, "llmq %s: batch '%s' has completed: nothing to cancel\n", CMD, id);
            rc = 1;
            break;
        default:
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        }
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}

/* ---- the dispatcher */

int cmd_batch(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } sub[] = {
        {"list", batch_list},
        {"status", batch_status},
        {"wait", cmd_batch_wait},
        {"cancel", batch_cancel},
    };
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++)
        if (!strcmp(argv[1], sub[i].name))
            return sub[i].run(argc - 1, argv + 1);
    return cli_usage_error("batch", "unknown command '%s': expected list, status, wait or cancel", argv[1]);
}
