/* `llmq results`: exports finished jobs from the SQLite results database as JSON lines, CSV or an
 * OpenAI Batch output file, filtered by status and time, streamed row by row from one read
 * snapshot (nothing is held in memory but the current row). docs/RESULTS.md is the user's side. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/atomic_file.h"
#include "worker/cli/cli.h"
#include "worker/config/config.h"
#include "worker/store/db.h"
#include "worker/store/result_line.h"

static const char CMD[] = "results";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq results [-c FILE | --db PATH] [--batch ID] [--status S] [--since T] [--until T]\n"
            "                    [--format jsonl|csv|openai [--errors FILE]] [--output FILE] [--limit N]\n"
            "\n"
            "Exports finished jobs from the SQLite results database, oldest first (by finished_at).\n"
            "\n"
            "Formats:\n"
            "  jsonl    one result per line, as `llmq run` writes it: llmq's result object for jobs in\n"
            "           llmq's form, the OpenAI Batch output line for jobs that came as batch lines\n"
            "  csv      RFC 4180 with a header row: every column of the jobs table but `result` and\n"
            "           `request` (NULL is an empty field, an empty string is \"\")\n"
            "  openai   an OpenAI Batch output file: only the jobs that came as OpenAI batch lines.\n"
            "           With --errors FILE, as OpenAI splits them: the output holds the completed\n"
            "           requests, FILE the failed and cancelled ones ({\"id\", \"custom_id\",\n"
            "           \"response\": null, \"error\": {\"code\", \"message\"}} per line)\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): its sqlite.path names the database\n"
            "      --db PATH       the database file (overrides the config; default llmq.db)\n"
            "  -b, --batch ID      only the jobs of batch ID (llmq enqueue's batch; `llmq batch list`)\n"
            "  -s, --status S      completed, failed or cancelled (default: all)\n"
            "      --since T       finished at or after T: ISO 8601 (2025-06-01, 2025-06-01T22:00:00Z,\n"
            "                      2025-06-01 22:00+02:00; no zone = local time), unix seconds, or an\n"
            "                      age: 30m, 12h, 7d (that long ago)\n"
            "      --until T       finished before T (same forms)\n"
            "  -f, --format F      jsonl (default), csv or openai\n"
            "  -o, --output FILE   write FILE (complete or not at all: a temporary file is renamed at\n"
            "                      the end); default or '-': stdout\n"
            "  -e, --errors FILE   with --format openai: the failed and cancelled requests go to FILE\n"
            "                      (written the same way, also when empty), the output gets the rest\n"
            "  -n, --limit N       at most N rows\n"
            "  -h, --help          this text\n"
            "\n"
            "Examples:\n"
            "  llmq results -c llmq.yaml --since 1d > last-day.jsonl\n"
            "  llmq results --db llmq.db --status failed --format csv -o failed.csv\n"
            "  llmq results -c llmq.yaml --format openai --since 2025-06-01T00:00:00Z -o batch_output.jsonl\n"
            "  llmq results --db llmq.db --limit 5 | jq -r .text\n"
            "  llmq results -c llmq.yaml --batch nightly-2025-06-01 --format openai -o out.jsonl -e "
            "errors.jsonl\n"
            "\n"
            "Exit status: 0 (also when no row matches), 1 when the database cannot be read or the output\n"
            "not written, 2 when the command line is wrong.\n");
}

/* ---- times */

/* "2025-06-01", "2025-06-01T22:00", "2025-06-01 22:00:05.5Z", "...+02:00" / "+0200" / "-05",
 * unix seconds ("1748800000", "1748800000.25") or an age ("30s", "15m", "12h", "7d", "2w") into
 * unix seconds. No zone = local time. 0, or -1 with err. */
static int parse_time(const char *s, double now, double *out, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s && isdigit((unsigned char)s[0])) {
        if (!*end && isfinite(v)) { /* unix seconds */
            *out = v;
            return 0;
        }
        static const struct {
            char c;
            double s;
        } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 7 * 86400}};
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (end[0] == units[i].c && !end[1] && isfinite(v)) {
                *out = now - v * units[i].s;
                return 0;
            }
    }
    int y, mo, d, h = 0, mi = 0, n = 0;
    double sec = 0;
    const char *p = s;
    if (sscanf(p, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10)
        goto bad;
    p += n;
    if (*p == 'T' || *p == 't' || *p == ' ') {
        p++;
        n = 0;
        if (sscanf(p, "%2d:%2d%n", &h, &mi, &n) != 2 || n != 5)
            goto bad;
        p += n;
        if (*p == ':') {
            p++;
            if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]))
                goto bad;
            sec = strtod(p, &end);
            p = end;
        }
    }
    bool utc = false;
    int off = 0; /* seconds east of UTC */
    if (*p == 'Z' || *p == 'z') {
        utc = true;
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1, oh = 0, om = 0;
        p++;
        if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]))
            goto bad;
        oh = (p[0] - '0') * 10 + (p[1] - '0');
        p += 2;
        if (*p == ':')
            p++;
        if (isdigit((unsigned char)p[0]) && isdigit((unsigned char)p[1])) {
            om = (p[0] - '0') * 10 + (p[1] - '0');
            p += 2;
        }
        if (oh > 23 || om > 59)
            goto bad;
        utc = true;
        off = sign * (oh * 3600 + om * 60);
    }
    if (*p || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || !(sec >= 0 && sec < 61))
        goto bad;
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = (int)sec,
                    .tm_isdst = -1};
    time_t t = utc ? timegm(&tm) : mktime(&tm);
    if (t == (time_t)-1 || tm.tm_mday != d || tm.tm_mon != mo - 1) /* normalised: Feb 30 moved on */
        goto bad;
    *out = (double)t - off + (sec - floor(sec));
    return 0;
bad:
    snprintf(err, errlen,
             "'%.60s' is not a time: expected ISO 8601 (2025-06-01, 2025-06-01T22:00:00Z), unix seconds "
             "or an age like 12h or 7d",
             s);
    return -1;
}

/* ---- writers */

enum fmt { F_JSONL, F_CSV, F_OPENAI };

struct out {
    FILE *f;
    enum fmt fmt;
    int64_t rows;    /* written */
    int64_t skipped; /* openai: rows without a stored result line */
    FILE *err;       /* openai --errors: where failed and cancelled rows go (NULL = with the rest) */
    int64_t err_rows;
};

/* The shortest text that reads back as exactly v. */
static void put_real(FILE *f, double v)
{
    char b[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v)
            break;
    }
    fputs(b, f);
}

/* One CSV field (RFC 4180): quoted when it holds a comma, quote, CR or LF, or is empty (so that
 * an empty string differs from NULL, which is written as nothing). */
static void put_csv_str(FILE *f, const char *s, size_t len)
{
    if (!s)
        return;
    bool quote = len == 0;
    for (size_t i = 0; i < len && !quote; i++)
        quote = s[i] == ',' || s[i] == '"' || s[i] == '\r' || s[i] == '\n';
    if (!quote) {
        fwrite(s, 1, len, f);
        return;
    }
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '"')
            fputc('"', f);
        fputc(s[i], f);
    }
    fputc('"', f);
}

static void put_csv_text(FILE *f, const char *s)
{
    put_csv_str(f, s, s ? strlen(s) : 0);
}

static void put_csv_real(FILE *f, double v)
{
    if (!isnan(v))
        put_real(f, v);
}

/* The columns, in the order of schemas/NNN_*.sql (result and request left out: the request is
 * the job as received, for re-running it, not for a spreadsheet). */
static const char CSV_HEADER[] =
    "id,custom_id,queue,status,model,params,output,finish_reason,prompt_tokens,"
    "completion_tokens,error,attempts,worker_id,created_at,started_at,"
    "first_token_at,finished_at,ttft_ms,latency_ms,queue_ms,metadata,request_form,batch_id,error_code,"
    "reasoning,reasoning_tokens";

static void put_csv_row(FILE *f, const struct db_result *r)
{
    put_csv_text(f, r->id);
    fputc(',', f);
    put_csv_text(f, r->custom_id);
    fputc(',', f);
    put_csv_text(f, r->queue);
    fputc(',', f);
    put_csv_text(f, db_status_name(r->status));
    fputc(',', f);
    put_csv_text(f, r->model);
    fputc(',', f);
    put_csv_text(f, r->params);
    fputc(',', f);
    put_csv_str(f, r->output, r->output ? (r->output_len ? r->output_len : strlen(r->output)) : 0);
    fputc(',', f);
    put_csv_text(f, r->finish_reason);
    fprintf(f, ",%lld,%lld,", (long long)r->prompt_tokens, (long long)r->completion_tokens);
    put_csv_text(f, r->error);
    fprintf(f, ",%lld,", (long long)r->attempts);
    put_csv_text(f, r->worker_id);
    const double times[] = {r->created_at, r->started_at, r->first_token_at, r->finished_at,
                            r->ttft_ms,    r->latency_ms, r->queue_ms};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        fputc(',', f);
        put_csv_real(f, times[i]);
    }
    fputc(',', f);
    put_csv_text(f, r->metadata);
    fputc(',', f);
    put_csv_text(f, r->request_form == DB_FORM_OPENAI ? "openai" : "llmq");
    fputc(',', f);
    put_csv_text(f, r->batch_id);
    fputc(',', f);
    put_csv_text(f, r->error_code);
    fputc(',', f);
    put_csv_str(f, r->reasoning,
                r->reasoning ? (r->reasoning_len ? r->reasoning_len : strlen(r->reasoning)) : 0);
    fputc(',', f);
    if (r->reasoning_tokens >= 0)
        fprintf(f, "%lld", (long long)r->reasoning_tokens);
    fputs("\r\n", f);
}

static int on_row(void *ctx, const struct db_result *r)
{
    struct out *o = ctx;
    switch (o->fmt) {
    case F_CSV:
        put_csv_row(o->f, r);
        break;
    case F_OPENAI:
        if (!r->result) {
            o->skipped++;
            return 0;
        }
        if (o->err && r->status != DB_COMPLETED) { /* OpenAI's error file */
            fprintf(o->err, "%s\n", r->result);
            o->err_rows++;
            return ferror(o->err) ? 1 : 0;
        }
        fprintf(o->f, "%s\n", r->result);
        break;
    case F_JSONL: {
        char *owned;
        const char *line = db_result_line(r, &owned);
        if (line)
            fprintf(o->f, "%s\n", line);
        free(owned);
        break;
    }
    }
    o->rows++;
    return ferror(o->f) ? 1 : 0; /* a full disk or a closed pipe: stop */
}

/* ---- the command */

enum { O_DB = 256, O_SINCE, O_UNTIL };

/* Commits (ok) or removes a --output / --errors file; 0, or 1 after saying why. */
static int finish_file(struct atomic_file *af, bool ok, const char *path, int64_t rows)
{
    char err[1024];
    if (!ok) {
        atomic_file_abort(af);
        return 1;
    }
    if (atomic_file_commit(af, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        return 1;
    }
    fprintf(stderr, "llmq %s: %lld row%s written to %s\n", CMD, (long long)rows, rows == 1 ? "" : "s", path);
    return 0;
}

int cmd_results(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db", required_argument, NULL, O_DB},
        {"status", required_argument, NULL, 's'},
        {"since", required_argument, NULL, O_SINCE},
        {"until", required_argument, NULL, O_UNTIL},
        {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, 'o'},
        {"limit", required_argument, NULL, 'n'},
        {"batch", required_argument, NULL, 'b'},
        {"errors", required_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = cfg_default_path(), *dbpath = NULL, *output = NULL, *errors = NULL;
    const char *since_s = NULL, *until_s = NULL;
    struct db_query dq = db_query_all();
    enum fmt fmt = F_JSONL;
    char err[1024];
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "c:s:f:o:n:b:e:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return 0;
        case 'c':
            config = optarg;
            break;
        case O_DB:
            dbpath = optarg;
            break;
        case 's':
            dq.status = db_status_from_name(optarg);
            if (dq.status < 0)
                return cli_usage_error(CMD, "--status: expected completed, failed or cancelled, got '%s'",
                                       optarg);
            break;
        case O_SINCE:
            since_s = optarg;
            break;
        case O_UNTIL:
            until_s = optarg;
            break;
        case 'f':
            if (!strcmp(optarg, "jsonl") || !strcmp(optarg, "json"))
                fmt = F_JSONL;
            else if (!strcmp(optarg, "csv"))
                fmt = F_CSV;
            else if (!strcmp(optarg, "openai"))
                fmt = F_OPENAI;
            else
                return cli_usage_error(CMD, "--format: expected jsonl, csv or openai, got '%s'", optarg);
            break;
        case 'o':
            output = optarg;
            break;
        case 'e':
            errors = optarg;
            break;
        case 'b':
            if (!*optarg || strlen(optarg) > 64)
                return cli_usage_error(CMD, "--batch: expected a batch id (1 to 64 characters), got '%s'",
                                       optarg);
            dq.batch_id = optarg;
            break;
        case 'n': {
            char *end;
            errno = 0;
            long long n = strtoll(optarg, &end, 10);
            if (end == optarg || *end || errno || n < 1)
                return cli_usage_error(CMD, "--limit: expected a number of rows >= 1, got '%s'", optarg);
            dq.limit = n;
            break;
        }
        default:
            return cli_bad_option(CMD, argc, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    double now = db_now();
    if (since_s && parse_time(since_s, now, &dq.since, err, sizeof err))
        return cli_usage_error(CMD, "--since: %s", err);
    if (until_s && parse_time(until_s, now, &dq.until, err, sizeof err))
        return cli_usage_error(CMD, "--until: %s", err);
    if (fmt == F_OPENAI)
        dq.form = DB_FORM_OPENAI;
    if (errors && fmt != F_OPENAI)
        return cli_usage_error(CMD, "--errors is for --format openai (OpenAI's error file)");
    if (errors && (!strcmp(errors, "-") || (output && !strcmp(output, errors))))
        return cli_usage_error(CMD, "--errors: name a file other than the output");

    /* the database: --db, else the config's sqlite.path (file < environment) */
    struct cfg c;
    cfg_defaults(&c);
    if ((config && cfg_load_file(&c, config, err, sizeof err)) || cfg_load_env(&c, err, sizeof err) ||
        (dbpath && cfg_set(&c, "sqlite.path", dbpath, "--db", err, sizeof err))) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        return dbpath && strstr(err, "--db") ? 2 : 1;
    }
    struct db_opts o = db_opts_default();
    o.readonly = true;
    o.busy_timeout_ms = c.sqlite.busy_timeout_ms;
    struct db *db = NULL;
    if (access(c.sqlite.path, F_OK) != 0) {
        fprintf(stderr, "llmq %s: no database at %s (name it with --db PATH or -c FILE's sqlite.path)\n", CMD,
                c.sqlite.path);
        cfg_free(&c);
        return 1;
    }
    if (db_open(c.sqlite.path, &o, &db, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        return 1;
    }

    /* the output: stdout, or a temporary file renamed into place at the end */
    struct out out = {.f = stdout, .fmt = fmt};
    struct atomic_file af = {0};
    bool to_file = output && strcmp(output, "-");
    if (to_file) {
        if (atomic_file_open(&af, output, err, sizeof err)) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            db_close(db);
            cfg_free(&c);
            return 1;
        }
        out.f = af.f;
    }
    struct atomic_file ef = {0};
    if (errors) {
        if (atomic_file_open(&ef, errors, err, sizeof err)) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            if (to_file)
                atomic_file_abort(&af);
            db_close(db);
            cfg_free(&c);
            return 1;
        }
        out.err = ef.f;
    }
    if (fmt == F_CSV)
        fprintf(out.f, "%s\r\n", CSV_HEADER);
    int rc = db_query_results(db, &dq, on_row, &out);
    int ret = 0;
    if (rc < 0) {
        fprintf(stderr, "llmq %s: %s\n", CMD, db_errmsg(db));
        ret = 1;
    }
    if (!to_file && (fflush(out.f) || ferror(out.f))) {
        fprintf(stderr, "llmq %s: writing stdout: %s\n", CMD, strerror(errno));
        ret = 1;
    }
    if (errors)
        ret |= finish_file(&ef, ret == 0, errors, out.err_rows);
    if (to_file)
        ret |= finish_file(&af, ret == 0, output, out.rows);
    if (out.skipped)
        fprintf(stderr, "llmq %s: %lld OpenAI-form row%s without a stored result line left out\n", CMD,
                (long long)out.skipped, out.skipped == 1 ? "" : "s");
    if (!ret && fmt == F_OPENAI && out.rows + out.err_rows == 0)
        fprintf(stderr, "llmq %s: no job that came as an OpenAI batch line matches\n", CMD);
    db_close(db);
    cfg_free(&c);
    return ret;
}
