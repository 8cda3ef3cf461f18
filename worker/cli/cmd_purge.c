/* `llmq purge --queue short|long|retry|dead [--model NAME] [--yes]`: empties a queue, the retry
 * set or the dead list, with the hashes of the jobs in it (queue/purge.h). */
#include <getopt.h> /* optind, struct option */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "queue/keys.h"
#include "queue/purge.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"

static const char CMD[] = "purge";

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq purge [-c FILE] [--redis URL] --queue short|long|retry|dead [--model NAME] [--yes]\n"
        "\n"
        "Removes every entry of a queue (llmq:queue:short, llmq:queue:long, or with --model NAME the\n"
        "model's queue llmq:queue:NAME:short|long), of the retry set (llmq:retry) or of the dead list\n"
        "(llmq:dead), oldest first, with the hashes of their jobs:\n"
        "  - a queued job (queue, retry) whose hash says queued loses its hash; its batch counts it\n"
        "    cancelled, as `llmq cancel` would (no SQLite row is written: it never ran);\n"
        "  - a dead entry's job loses its hash when that says failed; its batch keeps counting it failed;\n"
        "  - a hash in another state (the job was pushed again, or runs) or naming another queue (the\n"
        "    entry was a stale copy) is left alone.\n"
        "Each removed job's id leaves llmq:cancel and gets a `purged` event, so `llmq wait` on it ends\n"
        "(exit 1, status purged). It removes at most the entries there when it started, oldest first,\n"
        "so jobs pushed meanwhile stay. Running jobs are not touched: cancel them with `llmq cancel`\n"
        "or `llmq batch cancel`.\n"
        "\n"
        "Without --yes nothing is removed: it prints how many entries it would remove and exits 2.\n"
        "\n"
        "Options:\n"
        "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
        "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
        "      --queue Q       short, long, retry or dead\n"
        "      --model NAME    with --queue short|long: that model's queue\n"
        "      --yes           remove them\n"
        "  -h, --help          this text\n"
        "\n"
        "Exit status: 0 removed (or nothing to remove), 1 Redis failed part way, 2 the command line is\n"
        "wrong or --yes was not given, 69 Redis cannot be reached.\n");
}

enum { O_QUEUE = CLI_REDIS_O_OWN, O_MODEL, O_YES };

struct purge_args {
    const char *queue, *model;
    bool yes;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct purge_args *pa = ctx;
    if (opt == O_QUEUE)
        pa->queue = arg;
    else if (opt == O_MODEL)
        pa->model = arg;
    else if (opt == O_YES)
        pa->yes = true;
}

int cmd_purge(int argc, char **argv)
{
    static const struct option own[] = {
        {"queue", required_argument, NULL, O_QUEUE},
        {"model", required_argument, NULL, O_MODEL},
        {"yes", no_argument, NULL, O_YES},
        {NULL, 0, NULL, 0},
    };
    struct purge_args pa = {0};
    const struct cli_redis_spec spec = {.usage = usage, .longopts = own, .on_opt = on_opt, .ctx = &pa};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!pa.queue)
        return cli_usage_error(CMD, "name what to purge: --queue short|long|retry|dead");
    enum rq_purge_what what;
    bool lane = !strcmp(pa.queue, "short") || !strcmp(pa.queue, "long");
    if (lane)
        what = RQ_PURGE_QUEUE;
    else if (!strcmp(pa.queue, "retry"))
        what = RQ_PURGE_RETRY;
    else if (!strcmp(pa.queue, "dead"))
        what = RQ_PURGE_DEAD;
    else
        return cli_usage_error(CMD, "--queue: expected short, long, retry or dead, got '%s'", pa.queue);
    if (pa.model && !lane)
        return cli_usage_error(CMD, "--model goes with --queue short or long (retry and dead are shared)");
    if (pa.model && !rq_valid_model_name(pa.model))
        return cli_usage_error(CMD, "--model '%.80s': not a model name (letters, digits, '.', '_', '-', '/')",
                               pa.model);
    char ref[RQ_QREF_MAX + 1] = "";
    if (lane && rq_queue_ref(pa.model, pa.queue, ref, sizeof ref))
        return cli_usage_error(CMD, "--model '%.80s': too long", pa.model);

    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    char key[RQ_KEY_MAX];
    if (rc == 0 && what == RQ_PURGE_QUEUE && rq_key_queue(&q->keys, ref, key, sizeof key))
        rc = cli_usage_error(CMD, "--model '%.80s': too long", pa.model);
    else if (rc == 0 && what != RQ_PURGE_QUEUE)
        snprintf(key, sizeof key, "%s", what == RQ_PURGE_RETRY ? q->keys.retry : q->keys.dead);
    long long n = rc ? 0 : rq_purge_count(q, what, ref);
    if (rc == 0 && n < 0) {
        fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
        rc = 1;
    } else if (rc == 0 && n == 0) {
        printf("%s is empty: nothing to purge\n", key);
    } else if (rc == 0 && !pa.yes) {
        printf("would remove %lld entr%s of %s and the hashes of their jobs\n", n, n == 1 ? "y" : "ies", key);
        fprintf(stderr, "llmq %s: nothing removed: run it again with --yes to remove them\n", CMD);
        rc = 2;
    } else if (rc == 0) {
        long long hashes = 0;
        long long done = rq_purge(q, what, ref, n, &hashes);
        if (done < 0) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        } else {
            printf("removed %lld entr%s of %s and %lld job hash%s\n", done, done == 1 ? "y" : "ies", key,
                   hashes, hashes == 1 ? "" : "es");
        }
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}
