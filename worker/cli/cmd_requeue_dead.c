/* `llmq requeue-dead [--all | ID...]`: puts dead-lettered jobs back on their queue. */
#include <getopt.h> /* optind, struct option */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "queue/dead.h"
#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"

static const char CMD[] = "requeue-dead";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq requeue-dead [-c FILE] [--redis URL] (--all | ID...)\n"
            "\n"
            "Puts jobs from the dead-letter list (llmq:dead) back at the end of the queue they failed on,\n"
            "with a fresh hash (status queued, attempts 0): those with the given ids, or with --all every\n"
            "entry (also those without an id, e.g. lines that were not JSON). Fix what made them fail\n"
            "first (a config template, max_model_len, the job itself), or they come back to the dead list.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "      --all           every dead entry\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0 (prints how many were requeued), 1 when an id was not in the dead list or Redis\n"
            "failed, 2 when the command line is wrong.\n");
}

enum { O_ALL = CLI_REDIS_O_OWN };

/* --all is the only option of its own: ctx is the bool it sets. */
static void on_opt(int opt, const char *arg, void *ctx)
{
    (void)arg;
    if (opt == O_ALL)
        *(bool *)ctx = true;
}

int cmd_requeue_dead(int argc, char **argv)
{
    static const struct option own[] = {
        {"all", no_argument, NULL, O_ALL},
        {NULL, 0, NULL, 0},
    };
    bool all = false;
    const struct cli_redis_spec spec = {.usage = usage, .longopts = own, .on_opt = on_opt, .ctx = &all};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    int n = argc - optind;
    if (all && n)
        return cli_usage_error(CMD, "give either --all or ids, not both");
    if (!all && !n)
        return cli_usage_error(CMD, "give the ids to requeue, or --all");
    if (cli_redis_check_ids(CMD, argc, argv, optind))
        return 2;
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc == 0) {
        int moved = rq_dead_requeue(q, (const char *const *)argv + optind, n);
        if (moved < 0) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        } else {
            printf("requeued %d job%s\n", moved, moved == 1 ? "" : "s");
            rc = !all && moved < n ? 1 : 0;
            if (rc)
                fprintf(stderr, "llmq %s: %d of the %d ids were not in %s\n", CMD, n - moved, n,
                        q->keys.dead);
        }
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}
