/* `llmq cancel ID...`: asks for jobs to be cancelled (queued or running). */
#include <getopt.h> /* optind */
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
    fprintf(f,
            "Usage: llmq cancel [-c FILE] [--redis URL] ID...\n"
            "\n"
            "Asks for the jobs with these ids to be cancelled (SADD llmq:cancel ID, in one atomic step\n"
            "with the checks below). A queued job is cancelled when a worker fetches it, a running one at\n"
            "its next engine step; either way its SQLite row says status 'cancelled' with what was\n"
            "generated so far, and its hash says 'cancelled'. An id without a job hash (never pushed,\n"
            "pushed without one, or expired after it ended) is refused; a job that has already ended\n"
            "(completed, failed, cancelled) is left alone with a note. An id leaves llmq:cancel when its\n"
            "job ends; the set itself expires queues.result_ttl_s after the last id this command adds.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "  -h, --help          this text\n"
            "\n"
            "Prints one line per id (unknown ids on stderr). Exit status: 0 every id was asked to stop or\n"
            "had already ended, 1 some id is unknown (the others are still asked) or Redis failed, 2 the\n"
            "command line is wrong.\n");
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
    struct rq_cancel_result *res = rc ? NULL : calloc((size_t)n, sizeof *res);
    if (rc == 0 && !res) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    }
    if (rc == 0 && rq_cancel(q, (const char *const *)argv + optind, n, res) < 0) {
        fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
        rc = 1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        const char *id = argv[optind + i];
        if (res[i].outcome == RQ_CANCEL_ASKED)
            printf("%s: cancel requested\n", id);
        else if (res[i].outcome == RQ_CANCEL_ENDED)
            printf("%s: already %s, nothing to cancel\n", id, res[i].status);
    }
    for (int i = 0; rc == 0 && i < n; i++)
        if (res[i].outcome == RQ_CANCEL_UNKNOWN)
            fprintf(stderr, "llmq %s: %s: no such job (no hash %s%s); nothing done\n", CMD, argv[optind + i],
                    q->keys.job_stem, argv[optind + i]);
    for (int i = 0; rc == 0 && i < n; i++)
        if (res[i].outcome == RQ_CANCEL_UNKNOWN)
            rc = 1;
    free(res);
    rq_free(q);
    cfg_free(&c);
    return rc;
}
