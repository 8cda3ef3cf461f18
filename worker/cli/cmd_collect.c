/* `llmq collect --from-db FILE... [--db CENTRAL]`: merges worker databases into one central
 * database under the upsert rules of the store (worker/store/merge.h); `llmq collect --redis URL`
 * collects the rows workers publish to the result streams (collect_stream.h) under the same
 * rules. docs/FLEET.md is the user's side. */
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/cli/collect_stream.h"
#include "worker/config/config.h"
#include "worker/store/db.h"
#include "worker/store/merge.h"

static const char CMD[] = "collect";

/* Rows per transaction in the target. */
enum { BATCH_ROWS = 1000 };

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq collect --from-db FILE [--from-db FILE ...] [-c FILE | --db PATH] [--quiet]\n"
            "                    [--format json]\n"
            "       llmq collect (--redis URL | --stream) [-c FILE | --db PATH] [--group G]\n"
            "                    [--consumer NAME] [--once] [--claim-idle-ms MS] [--batch-size N]\n"
            "\n"
            "Merges llmq databases (a worker's sqlite.path file from each host) into one central\n"
            "database, for SQL over a fleet's results and for backfills of hosts that were offline.\n"
            "Each source is opened read-only and never changed (one with an older schema is copied\n"
            "beside the target, the copy migrated and removed). For each job id the central row is\n"
            "the one that ranks highest: completed > cancelled > failed, then the later finished_at;\n"
            "attempts is the largest any copy had. Merging again changes nothing, and the order of\n"
            "the sources does not matter. Batches, workers and worker_metrics are merged too\n"
            "(docs/FLEET.md says how); job_parts are not. Rows go in transactions of %d.\n"
            "\n"
            "With --redis (or --stream: the config's redis) it is the collector of a fleet whose\n"
            "workers publish their rows (results_stream.enabled): it reads <prefix>:results and\n"
            "<prefix>:metrics through a consumer group, writes the rows under the same rules and\n"
            "acknowledges each entry only after its row is committed, then trims the streams below\n"
            "what every group has acknowledged. Collectors sharing a group split the entries; each\n"
            "group gets them all (one central database each). Entries a dead collector left pending\n"
            "are taken over once idle for --claim-idle-ms. It runs until SIGINT/SIGTERM.\n"
            "\n"
            "Options:\n"
            "      --from-db FILE  a database to merge (repeat for more; they are merged in order)\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): its sqlite.path is the target\n"
            "      --db PATH       the target database (overrides the config; created when missing)\n"
            "  -f, --format F      text (default: one summary line per source on stderr) or json\n"
            "                      (one JSON object on stdout)\n"
            "      --json          the same as --format json\n"
            "      --quiet         no summary lines (errors are still printed)\n"
            "      --redis URL     collect from the result streams of this Redis\n"
            "      --stream        the same, from the config's redis (url, prefix, credentials)\n"
            "      --group G       the consumer group (default collect)\n"
            "      --consumer NAME this collector's name in the group (default <hostname>-<pid>)\n"
            "      --once          exit when caught up: nothing new, nothing pending in the group\n"
            "      --claim-idle-ms MS  take over entries pending this long on another consumer\n"
            "                      (default 60000)\n"
            "      --batch-size N  entries read, and rows written in one transaction (default 1000)\n"
            "  -h, --help          this text\n"
            "\n"
            "Counts per source and table: read (rows in the source), written (new rows, replaced\n"
            "rows, or a kept row's attempts raised), kept (the target's row was the same or ranks\n"
            "higher: nothing written); the text line gives batches, workers and metrics rows as\n"
            "read/written/kept.\n"
            "\n"
            "Exit status: 0 every source merged (the collector: stopped by a signal, or caught up\n"
            "with --once), 1 a source or the target failed (the other sources are still merged;\n"
            "what a failed source committed stays, and merging it again completes it), 2 the command\n"
            "line is wrong, 69 Redis cannot be reached.\n",
            BATCH_ROWS);
}

enum {
    O_DB = 256,
    O_FROM_DB,
    O_JSON,
    O_QUIET,
    O_REDIS,
    O_STREAM,
    O_GROUP,
    O_CONSUMER,
    O_ONCE,
    O_CLAIM,
    O_BATCH
};

/* A whole number in [lo, hi] from s, else -1. */
static long num_arg(const char *s, long lo, long hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= lo && v <= hi ? v : -1;
}

static json_t *count_json(const struct merge_count *c)
{
    return json_pack("{sIsIsI}", "read", (json_int_t)c->read, "written", (json_int_t)c->written, "kept",
                     (json_int_t)c->kept);
}

/* The collector over Redis (--redis / --stream) into db. Returns the exit status. */
static int run_collector(const struct cfg *c, struct db *db, const struct collect_opts *co, bool json,
                         bool quiet)
{
    struct rq *q;
    int rc = cli_redis_open(CMD, c, &q);
    if (rc)
        return rc;
    cli_catch_interrupts();
    struct collect_opts o = *co;
    o.quiet = quiet;
    struct collect_stats st;
    rc = collect_stream(q, db, &o, &st);
    if (json) {
        json_t *out =
            json_pack("{sssbsssIsIsIsIsIsIsIsIsf}", "target", db_path(db), "ok", rc == 0, "group", o.group,
                      "entries", (json_int_t)st.entries, "claimed", (json_int_t)st.claimed, "jobs_written",
                      (json_int_t)st.jobs_written, "jobs_kept", (json_int_t)st.jobs_kept, "worker_rows",
                      (json_int_t)st.worker_rows, "metrics_rows", (json_int_t)st.metrics_rows, "malformed",
                      (json_int_t)st.malformed, "trimmed", (json_int_t)st.trimmed, "seconds", st.seconds);
        char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(out);
    } else if (!quiet) {
        fprintf(stderr,
                "llmq %s: %lld entries of group %s into %s in %.1f s (%lld claimed): jobs %lld written, %lld "
                "kept; "
                "%lld workers rows, %lld metrics rows, %lld malformed; %lld trimmed\n",
                CMD, (long long)st.entries, o.group, db_path(db), st.seconds, (long long)st.claimed,
                (long long)st.jobs_written, (long long)st.jobs_kept, (long long)st.worker_rows,
                (long long)st.metrics_rows, (long long)st.malformed, (long long)st.trimmed);
    }
    rq_free(q);
    return rc;
}

int cmd_collect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db", required_argument, NULL, O_DB},
        {"from-db", required_argument, NULL, O_FROM_DB},
        {"format", required_argument, NULL, 'f'},
        {"json", no_argument, NULL, O_JSON},
        {"quiet", no_argument, NULL, O_QUIET},
        {"redis", required_argument, NULL, O_REDIS},
        {"stream", no_argument, NULL, O_STREAM},
        {"group", required_argument, NULL, O_GROUP},
        {"consumer", required_argument, NULL, O_CONSUMER},
        {"once", no_argument, NULL, O_ONCE},
        {"claim-idle-ms", required_argument, NULL, O_CLAIM},
        {"batch-size", required_argument, NULL, O_BATCH},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *redis_url = NULL;
    bool stream = false;
    struct collect_opts co = {.group = "collect", .batch = 1000, .claim_idle_ms = 60000};
    char consumer[300];
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(consumer, sizeof consumer, "%s-%ld", host, (long)getpid());
    co.consumer = consumer;
    static const char shortopts[] = "c:f:h";
    const char *config = cfg_default_path(), *dbpath = NULL;
    bool json = false, quiet = false;
    const char **from = calloc((size_t)argc, sizeof *from);
    size_t n_from = 0;
    if (!from) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        return 1;
    }
    int opt, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            free(from);
            return 0;
        case 'c':
            config = optarg;
            break;
        case O_DB:
            dbpath = optarg;
            break;
        case O_FROM_DB:
            if (!*optarg)
                rc = cli_usage_error(CMD, "--from-db: expected a file name, got ''");
            from[n_from++] = optarg;
            break;
        case 'f':
            if (!strcmp(optarg, "json"))
                json = true;
            else if (!strcmp(optarg, "text"))
                json = false;
            else
                rc = cli_usage_error(CMD, "--format: expected text or json, got '%s'", optarg);
            break;
        case O_JSON:
            json = true;
            break;
        case O_QUIET:
            quiet = true;
            break;
        case O_REDIS:
            redis_url = optarg;
            stream = true;
            break;
        case O_STREAM:
            stream = true;
            break;
        case O_GROUP:
        case O_CONSUMER:
            if (!rq_valid_worker_id(optarg))
                rc = cli_usage_error(CMD, "--%s: expected 1 to 128 letters, digits and . _ @ -, got '%s'",
                                     opt == O_GROUP ? "group" : "consumer", optarg);
            *(opt == O_GROUP ? &co.group : &co.consumer) = optarg;
            break;
        case O_ONCE:
            co.once = true;
            break;
        case O_CLAIM:
            if ((co.claim_idle_ms = (int)num_arg(optarg, 1, 86400000)) < 0)
                rc = cli_usage_error(CMD, "--claim-idle-ms: expected 1 to 86400000, got '%s'", optarg);
            break;
        case O_BATCH:
            if ((co.batch = (int)num_arg(optarg, 1, 100000)) < 0)
                rc = cli_usage_error(CMD, "--batch-size: expected 1 to 100000, got '%s'", optarg);
            break;
        default:
            rc = cli_bad_option(CMD, argc, argv, longopts, shortopts);
        }
    }
    if (rc == 0 && optind < argc)
        rc = cli_usage_error(CMD, "unexpected argument '%s' (name each source with --from-db)", argv[optind]);
    if (rc == 0 && n_from == 0 && !stream)
        rc = cli_usage_error(CMD, "name a database to merge (--from-db FILE) or the Redis to collect from "
                                  "(--redis URL, --stream)");
    if (rc == 0 && n_from > 0 && stream)
        rc = cli_usage_error(CMD,
                             "--from-db and --redis/--stream are two modes: run them one after the other");
    if (rc) {
        free(from);
        return rc;
    }

    /* the target: --db, else the config's sqlite.path (file < environment) */
    char err[1024];
    struct cfg c;
    cfg_defaults(&c);
    if ((config && cfg_load_file(&c, config, err, sizeof err)) || cfg_load_env(&c, err, sizeof err) ||
        (dbpath && cfg_set(&c, "sqlite.path", dbpath, "--db", err, sizeof err)) ||
        (redis_url && cfg_set(&c, "redis.url", redis_url, "--redis", err, sizeof err))) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        free(from);
        return (dbpath && strstr(err, "--db")) || (redis_url && strstr(err, "--redis")) ? 2 : 1;
    }
    struct db_opts o = db_opts_default();
    o.busy_timeout_ms = c.sqlite.busy_timeout_ms;
    struct db *db = NULL;
    if (!c.sqlite.path[0] || db_open(c.sqlite.path, &o, &db, err, sizeof err)) {
        if (!c.sqlite.path[0])
            fprintf(stderr, "llmq %s: no target database: name it with --db PATH or -c FILE's sqlite.path\n",
                    CMD);
        else
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        free(from);
        return 1;
    }

    if (stream) {
        rc = run_collector(&c, db, &co, json, quiet);
        db_close(db);
        cfg_free(&c);
        free(from);
        return rc;
    }

    json_t *sources = json_array();
    for (size_t i = 0; i < n_from; i++) {
        struct merge_stats st;
        int r = merge_db(db, from[i], BATCH_ROWS, &st, err, sizeof err);
        if (r)
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
        if (r == 0 && !quiet && !json)
            fprintf(stderr,
                    "llmq %s: %s into %s: jobs %lld read, %lld written, %lld kept; batches %lld/%lld/%lld, "
                    "workers %lld/%lld/%lld, metrics rows %lld/%lld/%lld\n",
                    CMD, from[i], c.sqlite.path, (long long)st.jobs.read, (long long)st.jobs.written,
                    (long long)st.jobs.kept, (long long)st.batches.read, (long long)st.batches.written,
                    (long long)st.batches.kept, (long long)st.workers.read, (long long)st.workers.written,
                    (long long)st.workers.kept, (long long)st.metrics.read, (long long)st.metrics.written,
                    (long long)st.metrics.kept);
        json_t *s = json_pack("{sssbsosososo}", "path", from[i], "ok", r == 0, "jobs", count_json(&st.jobs),
                              "batches", count_json(&st.batches), "workers", count_json(&st.workers),
                              "worker_metrics", count_json(&st.metrics));
        if (s && r)
            json_object_set_new(s, "error", json_string(err));
        json_array_append_new(sources, s);
        if (r)
            rc = 1;
    }
    if (json) {
        json_t *out = json_pack("{sssbso}", "target", c.sqlite.path, "ok", rc == 0, "sources", sources);
        char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(out);
    } else {
        json_decref(sources);
    }
    db_close(db);
    cfg_free(&c);
    free(from);
    return rc;
}
