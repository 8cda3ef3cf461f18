/* `llmq worker`: the queue worker's command line; the loop is worker/loop/worker.c. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "worker/cli/cli.h"
#include "worker/cli/engine_flags.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/loop/signals.h"
#include "worker/loop/worker.h"

static const char CMD[] = "worker";

static void usage(FILE *f)
{
    fputs("Usage: llmq worker [-c FILE] [options]\n"
          "\n"
          "Takes generation jobs from the Redis queues (llmq:queue:short, llmq:queue:long), runs them\n"
          "through the engine with continuous batching, writes every result into SQLite and then\n"
          "acknowledges it in Redis. Runs until SIGTERM or SIGINT (or, with --drain, until there is nothing\n"
          "left to do). docs/WORKER.md explains the loop, the log lines and what happens on failures.\n"
          "\n"
          "Options (flags override the config file and LLMQ_* variables; docs/CLI.md):\n"
          "  -c, --config FILE               llmq.yaml (default $LLMQ_CONFIG); with --redis, --db and\n"
          "                                  --model no file is needed\n"
          "      --redis URL                 redis://[user:password@]host:port[/db] (redis.url)\n"
          "      --db PATH                   the SQLite results database, created if missing (sqlite.path)\n"
          "      --id NAME                   this worker's id in Redis keys (worker.id; default\n"
          "                                  <hostname>-<pid>). A worker restarted with the same id takes\n"
          "                                  back what it left behind. An id whose heartbeat is held by\n"
          "                                  another live worker is refused (exit 1, saying when that\n"
          "                                  heartbeat lapses): both would run the same jobs\n"
          "      --force-id                  take the id over even so, for when that worker is known to\n"
          "                                  be gone (a frozen VM, a partitioned host); a worker that finds\n"
          "                                  its id taken over stops with exit 1 without acknowledging\n"
          "                                  anything more\n"
          "      --queues LIST               short, long or short,long: the queues to fetch from, in\n"
          "                                  priority order (worker.queues)\n"
          "      --drain                     exit once nothing is left (for cron): the queues it serves,\n"
          "                                  the retry set and every other worker's processing list are\n"
          "                                  empty and nothing runs here. A live worker's jobs keep it\n"
          "                                  waiting (that worker may still die); a crashed worker's are\n"
          "                                  reaped once its heartbeat lapses and run here\n"
          "      --connect-timeout S         with --drain: exit 1 when Redis cannot be reached for S\n"
          "                                  seconds at the start (redis.start_timeout_s, default 30;\n"
          "                                  0 = keep trying)\n"
          "      --metrics-port N            the /metrics and /health port; 0 = any free port, logged\n"
          "                                  (metrics.port). One worker per GPU: each its own --device,\n"
          "                                  --id and --metrics-port\n"
          "      --metrics-address ADDR      the address they listen on (metrics.listen_address)\n"
          "      --chat-template FILE        a Jinja chat template used instead of the model's own\n"
          "                                  (model.chat_template; docs/CHAT_TEMPLATES.md)\n"
          "      --log-level L               debug | info | warn | error (worker.log_level)\n"
          "      --quiet                     log warnings and errors only (worker.log_level warn)\n"
          "      --stats                     log the loop's per-phase timings every metrics interval and\n"
          "                                  at exit (without it, at exit at debug level)\n"
          "  -h, --help                      this text\n"
          "      --version                   llmq's version\n"
          "\n"
          "Engine and model (the same flags as llmq run and llmq bench take):\n",
          f);
    engine_flags_usage(f, ENGINE_FLAGS_ENGINE | ENGINE_FLAGS_LANES);
    fputs("\n"
          "Signals: SIGTERM, SIGINT or SIGHUP stop fetching, let running jobs finish for up to\n"
          "worker.shutdown_timeout_s, hand the rest back to the front of their queue and exit 0; a second\n"
          "signal hands everything back at once. One during start-up exits 0 before the next step (model\n"
          "load, engine, database). SIGUSR1, SIGUSR2, SIGALRM and SIGPIPE are ignored.\n"
          "\n"
          "Exit status: 0 after a clean stop (with --drain: and no job failed), 1 when the worker cannot\n"
          "start (model, tokenizer, engine, database, its id in use) or its id was taken over, 2 when the\n"
          "command line is wrong, 3 with --drain when jobs failed or were dead-lettered during the run\n"
          "(the last log line counts them), 69 with --drain when Redis cannot be reached at the start.\n"
          "Without --drain a worker keeps trying to reach Redis.\n",
          f);
}

int cmd_worker(int argc, char **argv)
{
    wk_signals_catch(); /* first: a SIGTERM while the config is read is a clean stop too */
    enum {
        O_REDIS = 256,
        O_DB,
        O_ID,
        O_QUEUES,
        O_DRAIN,
        O_CONNECT_TIMEOUT,
        O_LOG,
        O_QUIET,
        O_STATS,
        O_FORCE_ID,
        O_METRICS_PORT,
        O_METRICS_ADDRESS,
        O_CHAT_TEMPLATE
    };
    static const struct option own[] = {
        {"config", required_argument, NULL, 'c'},
        {"redis", required_argument, NULL, O_REDIS},
        {"db", required_argument, NULL, O_DB},
        {"id", required_argument, NULL, O_ID},
        {"force-id", no_argument, NULL, O_FORCE_ID},
        {"queues", required_argument, NULL, O_QUEUES},
        {"drain", no_argument, NULL, O_DRAIN},
        {"connect-timeout", required_argument, NULL, O_CONNECT_TIMEOUT},
        {"metrics-port", required_argument, NULL, O_METRICS_PORT},
        {"metrics-address", required_argument, NULL, O_METRICS_ADDRESS},
        {"chat-template", required_argument, NULL, O_CHAT_TEMPLATE},
        {"log-level", required_argument, NULL, O_LOG},
        {"quiet", no_argument, NULL, O_QUIET},
        {"stats", no_argument, NULL, O_STATS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct option longopts[sizeof own / sizeof own[0] + ENGINE_FLAGS_MAX];
    engine_flags_longopts(longopts, own, ENGINE_FLAGS_ENGINE | ENGINE_FLAGS_LANES);
    static const char shortopts[] = "c:m:h";
    struct engine_cfg_flags flags = {0};
    const char *config = cfg_default_path();
    struct wk_opts o = {0};
    bool seqs_flag = false, connect_timeout_flag = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        int engine_flag = engine_flags_opt(&flags, opt, optarg, NULL);
        if (engine_flag < 0)
            return cli_usage_error(CMD, "too many options");
        if (engine_flag > 0)
            continue;
        const char *key = NULL, *flag = NULL, *value = optarg;
        switch (opt) {
        case 'h':
            usage(stdout);
            return 0;
        case 'c':
            config = optarg;
            continue;
        case O_DRAIN:
            o.drain = true;
            continue;
        case O_STATS:
            o.stats = true;
            continue;
        case O_FORCE_ID:
            o.force_id = true;
            continue;
        case O_REDIS:
            key = "redis.url", flag = "--redis";
            break;
        case O_DB:
            key = "sqlite.path", flag = "--db";
            break;
        case O_ID:
            key = "worker.id", flag = "--id";
            break;
        case O_QUEUES:
            key = "worker.queues", flag = "--queues";
            break;
        case O_CONNECT_TIMEOUT:
            key = "redis.start_timeout_s", flag = "--connect-timeout";
            connect_timeout_flag = true;
            break;
        case O_LOG:
            key = "worker.log_level", flag = "--log-level";
            break;
        case O_QUIET:
            key = "worker.log_level", flag = "--quiet", value = "warn";
            break;
        case O_METRICS_PORT:
            key = "metrics.port", flag = "--metrics-port";
            break;
        case O_METRICS_ADDRESS:
            key = "metrics.listen_address", flag = "--metrics-address";
            break;
        case O_CHAT_TEMPLATE:
            key = "model.chat_template", flag = "--chat-template";
            break;
        default:
            return cli_bad_option(CMD, argc, argv, longopts, shortopts);
        }
        if (engine_cfg_flag_add(&flags, key, value, flag))
            return cli_usage_error(CMD, "too many options");
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    for (int i = 0; i < flags.n; i++)
        seqs_flag = seqs_flag || !strcmp(flags.v[i].key, "engine.max_num_seqs");
    if (connect_timeout_flag && !o.drain)
        return cli_usage_error(CMD, "--connect-timeout goes with --drain (a worker without it keeps trying "
                                    "to reach Redis)");

    struct cfg c;
    char err[1024];
    int rc = engine_cfg_load(CMD, config, &flags, &c);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    /* --max-num-seqs below the lane caps lowers them too, as one expects of a global cap */
    if (seqs_flag && c.queues.short_max_num_seqs > c.engine.max_num_seqs)
        c.queues.short_max_num_seqs = c.engine.max_num_seqs;
    if (seqs_flag && c.queues.long_max_num_seqs > c.engine.max_num_seqs)
        c.queues.long_max_num_seqs = c.engine.max_num_seqs;
    if (cfg_validate(&c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&c);
        return 1;
    }
    if (!c.model.path[0]) {
        cfg_free(&c);
        return cli_usage_error(CMD, "--model is required (or model.path in the config)");
    }
    rc = wk_run(&c, &o);
    cfg_free(&c);
    return rc;
}
