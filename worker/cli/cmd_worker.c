/* `llmq worker`: the queue worker's command line; the loop is worker/loop/worker.c. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "worker/cli/cli.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/loop/signals.h"
#include "worker/loop/worker.h"

static const char CMD[] = "worker";

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq worker [-c FILE] [options]\n"
        "\n"
        "Takes generation jobs from the Redis queues (llmq:queue:short, llmq:queue:long), runs them\n"
        "through the engine with continuous batching, writes every result into SQLite and then\n"
        "acknowledges it in Redis. Runs until SIGTERM or SIGINT (or, with --drain, until there is nothing\n"
        "left to do). docs/WORKER.md explains the loop, the log lines and what happens on failures.\n"
        "\n"
        "Options (flags override the config file and the environment):\n"
        "  -c, --config FILE     llmq.yaml (default $LLMQ_CONFIG); with --redis, --db and --model no file\n"
        "                        is needed\n"
        "      --redis URL       redis://[user:password@]host:port[/db] (redis.url)\n"
        "      --db PATH         the SQLite results database, created if missing (sqlite.path)\n"
        "  -m, --model DIR       Hugging Face model folder (model.path)\n"
        "      --backend B       auto | cpu | cuda (engine.backend)\n"
        "      --id NAME         this worker's id in Redis keys (worker.id; default <hostname>-<pid>).\n"
        "                        A worker restarted with the same id takes back what it left behind.\n"
        "                        An id whose heartbeat is held by another live worker is refused (exit\n"
        "                        1, saying when that heartbeat lapses): both would run the same jobs\n"
        "      --force-id        take the id over even so, for when that worker is known to be gone\n"
        "                        (a frozen VM, a partitioned host); a worker that finds its id taken\n"
        "                        over stops with exit 1 without acknowledging anything more\n"
        "      --queues LIST     short, long or short,long: the queues to fetch from, in priority order\n"
        "                        (worker.queues)\n"
        "      --drain           exit once nothing is left (for cron): the queues it serves, the retry\n"
        "                        set and every other worker's processing list are empty and nothing\n"
        "                        runs here. A live worker's jobs keep it waiting (that worker may still\n"
        "                        die); a crashed worker's are reaped once its heartbeat lapses and run\n"
        "                        here\n"
        "      --connect-timeout S\n"
        "                        with --drain: exit 1 when Redis cannot be reached for S seconds at the\n"
        "                        start (redis.start_timeout_s, default 30; 0 = keep trying)\n"
        "      --threads N       CPU backend threads; 0 = all cores (engine.threads)\n"
        "      --device N        CUDA device index (engine.device; default 0). One worker per GPU: start\n"
        "                        one each with --device 0, 1, ... and its own --id and metrics.port\n"
        "      --max-num-seqs N  sequences per engine step, both lanes (engine.max_num_seqs)\n"
        "      --chat-template FILE\n"
        "                        a Jinja chat template used instead of the model's own\n"
        "                        (model.chat_template; docs/CHAT_TEMPLATES.md)\n"
        "      --log-level L     debug | info | warn | error (worker.log_level)\n"
        "      --stats           log the loop's per-phase timings every metrics interval and at exit\n"
        "                        (without it, at exit at debug level)\n"
        "  -h, --help            this text\n"
        "\n"
        "Signals: SIGTERM, SIGINT or SIGHUP stop fetching, let running jobs finish for up to\n"
        "worker.shutdown_timeout_s, hand the rest back to the front of their queue and exit 0; a second\n"
        "signal hands everything back at once. One during start-up exits 0 before the next step (model\n"
        "load, engine, database). SIGUSR1, SIGUSR2, SIGALRM and SIGPIPE are ignored.\n"
        "\n"
        "Exit status: 0 after a clean stop (with --drain: and no job failed), 1 when the worker cannot\n"
        "start (model, tokenizer, engine, database, its id in use; with --drain, Redis unreachable) or\n"
        "its id was taken over, 2 when the command\n"
        "line is wrong, 3 with --drain when jobs failed or were dead-lettered during the run (the last\n"
        "log line counts them). Without --drain a worker keeps trying to reach Redis.\n");
}

int cmd_worker(int argc, char **argv)
{
    wk_signals_catch(); /* first: a SIGTERM while the config is read is a clean stop too */
    enum {
        O_REDIS = ENGINE_CFG_O_NEXT,
        O_DB,
        O_ID,
        O_QUEUES,
        O_DRAIN,
        O_CONNECT_TIMEOUT,
        O_LOG,
        O_STATS,
        O_FORCE_ID
    };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"redis", required_argument, NULL, O_REDIS},
        {"db", required_argument, NULL, O_DB},
        ENGINE_CFG_LONGOPTS, /* --model, --backend, --threads, --device, --max-num-seqs */
        {"id", required_argument, NULL, O_ID},
        {"force-id", no_argument, NULL, O_FORCE_ID},
        {"queues", required_argument, NULL, O_QUEUES},
        {"drain", no_argument, NULL, O_DRAIN},
        {"connect-timeout", required_argument, NULL, O_CONNECT_TIMEOUT},
        {"log-level", required_argument, NULL, O_LOG},
        {"stats", no_argument, NULL, O_STATS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct engine_cfg_flags flags = {0};
    const char *config = cfg_default_path();
    struct wk_opts o = {0};
    bool seqs_flag = false, connect_timeout_flag = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "c:m:h", longopts, NULL)) != -1) {
        if (opt == ENGINE_CFG_O_SEQS)
            seqs_flag = true;
        int engine_flag = engine_cfg_flag_opt(&flags, opt, optarg);
        if (engine_flag < 0)
            return cli_usage_error(CMD, "too many options");
        if (engine_flag > 0)
            continue;
        const char *key = NULL, *flag = NULL;
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
        default:
            return cli_bad_option(CMD, argc, argv);
        }
        if (engine_cfg_flag_add(&flags, key, optarg, flag))
            return cli_usage_error(CMD, "too many options");
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
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
