/* `llmq cancel ID...`: asks for jobs to be cancelled (queued or running). */
#include <getopt.h> /* optind */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/cancel.h"
#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"

static const char CMD[] = "cancel";

static void usage(FILE *f)
{
    fprintf(f, "Usage: llmq cancel [-c FILE] [--redis URL] ID...\n"
               "\n"
               "Asks for the jobs with these ids to be cancelled (SADD llmq:cancel ID). A queued job is\n"
               "cancelled when a worker fetches it, a running one at its next engine step; either way its\n"
               "SQLite row says status 'cancelled' with what was generated so far, and its hash says\n"
               "'cancelled'. A job that has already ended (completed, failed, cancelled) is left alone.\n"
               "\n"
               "Options:\n"
               "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
               "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
               "  -h, --help          this text\n"
               "\n"
               "Prints one line per id. Exit status: 0 every id was accepted, 1 some had already ended (or\n"
               "Redis failed), 2 the command line is wrong.\n");
}

int cmd_cancel(int argc, char **argv)
{
    const struct cli_redis_spec spec = {.usage = usage};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    int n = argc - optind;
    if (n < 1)
        return cli_usage_error(CMD, "give the ids of the jobs to cancel");
    if (cli_redis_check_ids(CMD, argc, argv, optind))
        return 2;
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    bool *ok = rc ? NULL : calloc((size_t)n, sizeof *ok);
    if (rc == 0 && !ok) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    }
    if (rc == 0) {
        int added = rq_cancel(q, (const char *const *)argv + optind, n, ok);
        if (added < 0) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        } else {
            for (int i = 0; i < n; i++)
                printf("%s: %s\n", argv[optind + i],
                       ok[i] ? "cancel requested" : "already ended, left alone");
            rc = added == n ? 0 : 1;
        }
    }
    free(ok);
    rq_free(q);
    cfg_free(&c);
    return rc;
}
