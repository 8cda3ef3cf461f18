/* `llmq dead list`: the dead-letter list <p>:dead (queue/dead.h), newest first, with each job's
 * error. */
#include <errno.h>
#include <getopt.h> /* optind, struct option */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"

static const char CMD[] = "dead list";

#define ERROR_COLS 120 /* characters of the error a text line shows */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq dead list [-c FILE] [--redis URL] [--limit N] [--format text|json | --json]\n"
            "\n"
            "Lists the dead-lettered jobs (llmq:dead), newest first: when each failed, its id, its error\n"
            "code and error, its attempts and the queue it failed on (docs/QUEUE.md \"Dead letters\").\n"
            "Put them back with `llmq requeue-dead`, or drop them with `llmq purge --queue dead`.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "      --limit N       at most N entries (default 20; 0 = all)\n"
            "      --format F      text (default): a table, the error cut to %d characters, and a count\n"
            "                      line; json: each entry as stored, one JSON object per line (the job's\n"
            "                      own text under \"job\"; schemas/redis-dead-entry.schema.json)\n"
            "      --json          --format json\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0 (also when the list is empty), 1 Redis failed, 2 the command line is wrong, 69\n"
            "Redis cannot be reached.\n",
            ERROR_COLS);
}

enum { O_FORMAT = CLI_REDIS_O_OWN, O_JSON, O_LIMIT };

struct dead_args {
    const char *format, *limit;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct dead_args *da = ctx;
    if (opt == O_FORMAT)
        da->format = arg;
    else if (opt == O_JSON)
        da->format = "json";
    else if (opt == O_LIMIT)
        da->limit = arg;
}

/* One entry as a table line. */
static void print_entry(const char *raw, size_t len)
{
    json_t *d = json_loadb(raw, len, 0, NULL);
    if (!json_is_object(d)) {
        printf("%-19s  %-36s  %-24s  %8s  %-12s  %s\n", "-", "-", "-", "-", "-", "(not a dead-letter entry)");
        json_decref(d);
        return;
    }
    char when[32] = "-";
    json_t *fa = json_object_get(d, "failed_at");
    if (json_is_number(fa)) {
        time_t t = (time_t)json_number_value(fa);
        struct tm tm;
        if (gmtime_r(&t, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    }
    const char *id = json_string_value(json_object_get(d, "id"));
    const char *code = json_string_value(json_object_get(d, "error_code"));
    const char *queue = json_string_value(json_object_get(d, "queue"));
    const char *err = json_string_value(json_object_get(d, "error"));
    json_t *att = json_object_get(d, "attempts");
    char attempts[24] = "-";
    if (json_is_integer(att))
        snprintf(attempts, sizeof attempts, "%lld", (long long)json_integer_value(att));
    char e[ERROR_COLS + 4];
    size_t k = 0;
    for (const char *p = err ? err : ""; *p && k < ERROR_COLS; p++)
        e[k++] = *p == '\n' || *p == '\r' || *p == '\t' ? ' ' : *p;
    if (err && strlen(err) > ERROR_COLS)
        e[k++] = '.', e[k++] = '.', e[k++] = '.';
    e[k] = 0;
    printf("%-19s  %-36s  %-24s  %8s  %-12s  %s\n", when, id ? id : "(none)", code ? code : "-", attempts,
           queue ? queue : "-", e);
    json_decref(d);
}

int cmd_dead(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "list")) {
        if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            usage(stdout);
            return 0;
        }
        if (argc < 2)
            return cli_usage_error("dead", "give a command: list");
        return cli_usage_error("dead", "unknown command '%s' (expected list)", argv[1]);
    }
    argc--, argv++;
    static const struct option own[] = {
        {"format", required_argument, NULL, O_FORMAT},
        {"json", no_argument, NULL, O_JSON},
        {"limit", required_argument, NULL, O_LIMIT},
        {NULL, 0, NULL, 0},
    };
    struct dead_args da = {0};
    const struct cli_redis_spec spec = {.usage = usage, .longopts = own, .on_opt = on_opt, .ctx = &da};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    bool json = false;
    if (da.format && !strcmp(da.format, "json"))
        json = true;
    else if (da.format && strcmp(da.format, "text"))
        return cli_usage_error(CMD, "--format: expected text or json, got '%s'", da.format);
    long limit = 20;
    if (da.limit) {
        char *end;
        errno = 0;
        limit = strtol(da.limit, &end, 10);
        if (end == da.limit || *end || errno || limit < 0 || limit > 100000000)
            return cli_usage_error(CMD, "--limit: expected a number of entries >= 0, got '%s'", da.limit);
    }
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc == 0) {
        struct rq_pipe *p = &q->pipe;
        rq_pipe_reset(p);
        rq_pipe_cmd(p, "LLEN");
        rq_pipe_str(p, q->keys.dead);
        rq_pipe_cmd(p, "LRANGE");
        rq_pipe_str(p, q->keys.dead);
        rq_pipe_str(p, "0");
        rq_pipe_fmt(p, "%ld", limit - 1);
        if (rq_pipe_exec(p, &q->cmd, &q->scripts)) {
            rq_fail_conn(q, "dead list");
            rc = 1;
        } else if (rq_reply_error(p->reply[0], "dead list (LLEN)", q->err, sizeof q->err) ||
                   rq_reply_error(p->reply[1], "dead list (LRANGE)", q->err, sizeof q->err)) {
            rc = 1;
        }
        if (rc)
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
    }
    if (rc == 0) {
        const redisReply *r = q->pipe.reply[1];
        long long total = rq_reply_int(q->pipe.reply[0]);
        size_t n = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
        if (!json && n)
            printf("%-19s  %-36s  %-24s  %8s  %-12s  %s\n", "FAILED_AT (UTC)", "ID", "ERROR_CODE", "ATTEMPTS",
                   "QUEUE", "ERROR");
        for (size_t i = 0; i < n; i++) {
            const redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_STRING)
                continue;
            if (json)
                printf("%.*s\n", (int)e->len, e->str);
            else
                print_entry(e->str, e->len);
        }
        if (!json)
            printf("%lld dead entr%s in %s%s\n", total, total == 1 ? "y" : "ies", q->keys.dead,
                   (long long)n < total ? " (the newest shown; --limit 0 for all)" : "");
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}
