/* `llmq results`: exports finished jobs from the SQLite results database as JSON lines, CSV or an
 * OpenAI Batch output file, filtered by status and time, streamed row by row from one read
 * snapshot (nothing is held in memory but the current row). docs/RESULTS.md is the user's side. */
#include <ctype.h>
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

#include "engine/util/atomic_file.h"
#include "engine/util/fmt_double.h"
#include "engine/util/json_exact.h"
#include "worker/cli/cli.h"
#include "worker/cli/json_path.h"
#include "worker/config/config.h"
#include "worker/store/db.h"
#include "worker/store/result_line.h"

static const char CMD[] = "results";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq results [-c FILE | --db PATH] [--batch ID] [--status S] [--since T] [--until T]\n"
            "                    [--format jsonl|csv [--columns LIST]|openai [--errors FILE]] [--output FILE]\n"
            "                    [--limit N]\n"
            "\n"
            "Exports finished jobs from the SQLite results database, oldest first (by finished_at).\n"
            "\n"
            "Formats:\n"
            "  jsonl    one result per line, as `llmq run` writes it: llmq's result object for jobs in\n"
            "           llmq's form, the OpenAI Batch output line for jobs that came as batch lines\n"
            "  csv      RFC 4180 with a header row: every column of the jobs table but `result` and\n"
            "           `request` (NULL is an empty field, an empty string is \"\"), or those of --columns\n"
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
            "  -f, --format F      jsonl (default; json is the same), csv or openai\n"
            "      --json          the same as --format json\n"
            "  -o, --output FILE   write FILE (complete or not at all: a temporary file is renamed at\n"
            "                      the end); default or '-': stdout\n"
            "  -e, --errors FILE   with --format openai: the failed and cancelled requests go to FILE\n"
            "                      (written the same way, also when empty), the output gets the rest\n"
            "      --columns LIST  with --format csv: these columns only, in this order, comma-separated:\n"
            "                      names of the jobs table (id, status, output, ...) and JSON paths into\n"
            "                      output_json, a structured-output answer (docs/RESULTS.md): $.title,\n"
            "                      $.entities[0].name, $.\"a, b\". A path's field is the value's text (a\n"
            "                      string unquoted, an object or array as JSON); empty when the row has no\n"
            "                      such value, as json_extract's NULL\n"
            "  -n, --limit N       at most N rows\n"
            "  -h, --help          this text\n"
            "\n"
            "Examples:\n"
            "  llmq results -c llmq.yaml --since 1d > last-day.jsonl\n"
            "  llmq results --db llmq.db --status failed --format csv -o failed.csv\n"
            "  llmq results -c llmq.yaml --format openai --since 2025-06-01T00:00:00Z -o batch_output.jsonl\n"
            "  llmq results --db llmq.db --limit 5 | jq -r .text\n"
            "  llmq results --db llmq.db --format csv --columns 'id,$.title,$.sentiment' -o fields.csv\n"
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
    const struct colspec *cols; /* csv --columns (NULL = every column) */
    size_t n_cols;
};

/* The shortest text that reads back as exactly v. */
static void put_real(FILE *f, double v)
{
    char b[40];
    fmt_double(v, b, sizeof b);
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
static const char *const csv_cols[] = {
    "id",
    "custom_id",
    "queue",
    "status",
    "model",
    "params",
    "output",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "attempts",
    "worker_id",
    "created_at",
    "started_at",
    "first_token_at",
    "finished_at",
    "ttft_ms",
    "latency_ms",
    "queue_ms",
    "metadata",
    "request_form",
    "batch_id",
    "error_code",
    "reasoning",
    "reasoning_tokens",
    "output_json",
};
#define N_CSV_COLS (sizeof csv_cols / sizeof csv_cols[0])

/* Column k of csv_cols for row r. */
static void put_csv_col(FILE *f, const struct db_result *r, size_t k)
{
    const double times[] = {r->created_at, r->started_at, r->first_token_at, r->finished_at,
                            r->ttft_ms,    r->latency_ms, r->queue_ms};
    switch (k) {
    case 0:
        put_csv_text(f, r->id);
        break;
    case 1:
        put_csv_text(f, r->custom_id);
        break;
    case 2:
        put_csv_text(f, r->queue);
        break;
    case 3:
        put_csv_text(f, db_status_name(r->status));
        break;
    case 4:
        put_csv_text(f, r->model);
        break;
    case 5:
        put_csv_text(f, r->params);
        break;
    case 6:
        put_csv_str(f, r->output, r->output ? (r->output_len ? r->output_len : strlen(r->output)) : 0);
        break;
    case 7:
        put_csv_text(f, r->finish_reason);
        break;
    case 8:
        fprintf(f, "%lld", (long long)r->prompt_tokens);
        break;
    case 9:
        fprintf(f, "%lld", (long long)r->completion_tokens);
        break;
    case 10:
        put_csv_text(f, r->error);
        break;
    case 11:
        fprintf(f, "%lld", (long long)r->attempts);
        break;
    case 12:
        put_csv_text(f, r->worker_id);
        break;
    case 13:
    case 14:
    case 15:
    case 16:
    case 17:
    case 18:
    case 19:
        put_csv_real(f, times[k - 13]);
        break;
    case 20:
        put_csv_text(f, r->metadata);
        break;
    case 21:
        put_csv_text(f, r->request_form == DB_FORM_OPENAI ? "openai" : "llmq");
        break;
    case 22:
        put_csv_text(f, r->batch_id);
        break;
    case 23:
        put_csv_text(f, r->error_code);
        break;
    case 24:
        put_csv_str(f, r->reasoning,
                    r->reasoning ? (r->reasoning_len ? r->reasoning_len : strlen(r->reasoning)) : 0);
        break;
    case 25:
        if (r->reasoning_tokens >= 0)
            fprintf(f, "%lld", (long long)r->reasoning_tokens);
        break;
    case 26:
        put_csv_text(f, r->output_json);
        break;
    }
}

/* --columns: each CSV column is a column of the table or a JSON path into output_json. */
struct colspec {
    int col;                /* index into csv_cols, or -1 for a path */
    struct json_path *path; /* owned */
    char *name;             /* the header (owned) */
};

/* The value at a path as a CSV field: a string as its text, a number as written (reals the
 * shortest that reads back), true/false, an object or array as compact JSON; a missing value or
 * null as an empty field, as json_extract's NULL. */
static void put_csv_json(FILE *f, const json_t *v)
{
    if (!v || json_is_null(v))
        return;
    if (json_is_string(v)) {
        put_csv_str(f, json_string_value(v), json_string_length(v));
    } else if (json_is_integer(v)) {
        fprintf(f, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        put_real(f, json_real_value(v));
    } else if (json_is_boolean(v)) {
        fputs(json_is_true(v) ? "true" : "false", f);
    } else {
        char *s = json_dumps_exact(v, JSON_COMPACT);
        put_csv_text(f, s);
        free(s);
    }
}

static void put_csv_row(FILE *f, const struct db_result *r, const struct colspec *cs, size_t n_cs)
{
    if (!cs) {
        for (size_t k = 0; k < N_CSV_COLS; k++) {
            if (k)
                fputc(',', f);
            put_csv_col(f, r, k);
        }
        fputs("\r\n", f);
        return;
    }
    json_t *answer = NULL; /* output_json, parsed once for the row's paths */
    bool parsed = false;
    for (size_t i = 0; i < n_cs; i++) {
        if (i)
            fputc(',', f);
        if (cs[i].col >= 0) {
            put_csv_col(f, r, (size_t)cs[i].col);
            continue;
        }
        if (!parsed) {
            answer = r->output_json ? json_loads(r->output_json, JSON_DECODE_ANY, NULL) : NULL;
            parsed = true;
        }
        put_csv_json(f, json_path_get(cs[i].path, answer));
    }
    json_decref(answer);
    fputs("\r\n", f);
}

/* Splits --columns at the commas outside quotes into cs (a new array of *n); 0, or -1 with err. */
static int parse_columns(const char *list, struct colspec **out, size_t *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    size_t cap = 8;
    struct colspec *cs = calloc(cap, sizeof *cs);
    if (!cs)
        goto oom;
    const char *p = list;
    for (;;) {
        const char *s = p;
        bool quoted = false;
        for (; *p && (quoted || *p != ','); p++) {
            if (quoted && *p == '\\' && p[1])
                p++;
            else if (*p == '"')
                quoted = !quoted;
        }
        size_t len = (size_t)(p - s);
        while (len && (*s == ' ' || *s == '\t'))
            s++, len--;
        while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
            len--;
        if (*n == cap) {
            struct colspec *g = realloc(cs, 2 * cap * sizeof *g);
            if (!g)
                goto oom;
            memset(g + cap, 0, cap * sizeof *g);
            cs = g;
            cap *= 2;
        }
        struct colspec *c = &cs[(*n)++];
        c->col = -1;
        c->name = strndup(s, len);
        if (!c->name)
            goto oom;
        if (len == 0) {
            snprintf(err, errlen, "an empty column name (entry %zu)", *n);
            goto fail;
        }
        if (s[0] == '$') {
            char why[256];
            c->path = json_path_parse(s, len, why, sizeof why);
            if (!c->path) {
                snprintf(err, errlen, "bad JSON path '%s': %s", c->name, why);
                goto fail;
            }
        } else {
            for (size_t k = 0; k < N_CSV_COLS && c->col < 0; k++)
                if (!strcmp(csv_cols[k], c->name))
                    c->col = (int)k;
            if (c->col < 0) {
                snprintf(
                    err, errlen,
                    "unknown column '%s' (a column of the jobs table such as id, status, output, or a JSON "
                    "path into output_json such as $.title)",
                    c->name);
                goto fail;
            }
        }
        if (!*p)
            break;
        p++;
    }
    *out = cs;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    for (size_t i = 0; cs && i < *n; i++) {
        free(cs[i].name);
        json_path_free(cs[i].path);
    }
    free(cs);
    *n = 0;
    return -1;
}

static void free_columns(struct colspec *cs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(cs[i].name);
        json_path_free(cs[i].path);
    }
    free(cs);
}

static int on_row(void *ctx, const struct db_result *r)
{
    struct out *o = ctx;
    switch (o->fmt) {
    case F_CSV:
        put_csv_row(o->f, r, o->cols, o->n_cols);
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

enum { O_DB = 256, O_SINCE, O_UNTIL, O_COLUMNS, O_JSON };

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
        {"columns", required_argument, NULL, O_COLUMNS},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = cfg_default_path(), *dbpath = NULL, *output = NULL, *errors = NULL;
    const char *since_s = NULL, *until_s = NULL, *columns = NULL;
    struct db_query dq = db_query_all();
    enum fmt fmt = F_JSONL;
    char err[1024];
    int opt;
    static const char shortopts[] = "c:s:f:o:n:b:e:h";
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
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
        case O_JSON:
            fmt = F_JSONL;
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
        case O_COLUMNS:
            columns = optarg;
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
            return cli_bad_option(CMD, argc, argv, longopts, shortopts);
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
    if (columns && fmt != F_CSV)
        return cli_usage_error(CMD, "--columns is for --format csv");
    struct colspec *cols = NULL;
    size_t n_cols = 0;
    if (columns && parse_columns(columns, &cols, &n_cols, err, sizeof err))
        return cli_usage_error(CMD, "--columns: %s", err);

    /* the database: --db, else the config's sqlite.path (file < environment) */
    struct cfg c;
    cfg_defaults(&c);
    if ((config && cfg_load_file(&c, config, err, sizeof err)) || cfg_load_env(&c, err, sizeof err) ||
        (dbpath && cfg_set(&c, "sqlite.path", dbpath, "--db", err, sizeof err))) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        free_columns(cols, n_cols);
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
        free_columns(cols, n_cols);
        return 1;
    }
    if (db_open(c.sqlite.path, &o, &db, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        free_columns(cols, n_cols);
        return 1;
    }

    /* the output: stdout, or a temporary file renamed into place at the end */
    struct out out = {.f = stdout, .fmt = fmt, .cols = cols, .n_cols = n_cols};
    struct atomic_file af = {0};
    bool to_file = output && strcmp(output, "-");
    if (to_file) {
        if (atomic_file_open(&af, output, err, sizeof err)) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            db_close(db);
            cfg_free(&c);
            free_columns(cols, n_cols);
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
            free_columns(cols, n_cols);
            return 1;
        }
        out.err = ef.f;
    }
    if (fmt == F_CSV) {
        for (size_t k = 0; k < (cols ? n_cols : N_CSV_COLS); k++) {
            if (k)
                fputc(',', out.f);
            put_csv_text(out.f, cols ? cols[k].name : csv_cols[k]);
        }
        fputs("\r\n", out.f);
    }
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
    free_columns(cols, n_cols);
    return ret;
}
