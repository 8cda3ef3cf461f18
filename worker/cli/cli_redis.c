/* See cli_redis.h. */
#include "worker/cli/cli_redis.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "queue/keys.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/config/config.h"
#include "worker/config/redis_cfg.h"

enum { OWN_MAX = 16 };

int cli_redis_getopt(const char *cmd, int argc, char **argv, const struct cli_redis_spec *s,
                     struct cli_redis_args *a)
{
    struct option longopts[4 + OWN_MAX + 1] = {
        {"config", required_argument, NULL, 'c'},
        {"redis", required_argument, NULL, CLI_REDIS_O_REDIS},
        {"help", no_argument, NULL, 'h'},
    };
    int n = 3;
    bool format = false; /* the command has -f/--format: --json is --format json */
    for (const struct option *o = s->longopts; o && o->name && n < 3 + OWN_MAX; o++) {
        longopts[n++] = *o;
        format = format || (o->val == 'f' && !strcmp(o->name, "format"));
    }
    if (format)
        longopts[n++] = (struct option){"json", no_argument, NULL, CLI_REDIS_O_JSON};
    memset(&longopts[n], 0, sizeof longopts[n]);
    char shortopts[64];
    snprintf(shortopts, sizeof shortopts, "c:h%s", s->shortopts ? s->shortopts : "");

    a->config = cfg_default_path();
    a->redis = NULL;
    a->exit = 0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            s->usage(stdout);
            return -1;
        case 'c':
            a->config = optarg;
            break;
        case CLI_REDIS_O_REDIS:
            a->redis = optarg;
            break;
        case CLI_REDIS_O_JSON:
            s->on_opt('f', "json", s->ctx);
            break;
        default:
            if (opt != '?' && s->on_opt) { /* one of the command's own */
                s->on_opt(opt, optarg, s->ctx);
                break;
            }
            a->exit = cli_bad_option(cmd, argc, argv, longopts, shortopts);
            return -1;
        }
    }
    return 0;
}

int cli_redis_config(const char *cmd, const char *config, const char *redis_url, struct cfg *c)
{
    char err[1024];
    cfg_defaults(c);
    if ((config && cfg_load_file(c, config, err, sizeof err)) || cfg_load_env(c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 1;
    }
    if (redis_url && (cfg_set(c, "redis.url", redis_url, "--redis", err, sizeof err) ||
                      cfg_set(c, "redis.sentinels", "", "--redis", err, sizeof err))) { /* that server */
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 2;
    }
    if (cfg_validate(c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int cli_redis_open(const char *cmd, const struct cfg *c, struct rq **q)
{
    char err[1024];
    struct rq_opts o;
    cfg_rq_opts(&o, c);
    o.worker_id = NULL; /* a client, not a worker: <hostname>-<pid> only names its connection */
    o.quiet = true;     /* one error line below rather than the reconnect log */
    if (rq_open(&o, q, err, sizeof err)) {
        fprintf(stderr, "llmq %s: redis: %s\n", cmd, err);
        return 1;
    }
    if (rq_connect(*q)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, rq_error(*q));
        int rc = rq_auth_refused(*q) ? 1 : CLI_EXIT_UNREACHABLE; /* refused credentials: reached */
        rq_free(*q);
        *q = NULL;
        return rc;
    }
    return 0;
}

int cli_redis_connect(const char *cmd, const struct cli_redis_args *a, struct cfg *c, struct rq **q)
{
    *q = NULL;
    int rc = cli_redis_config(cmd, a->config, a->redis, c);
    if (rc == 0)
        rc = cli_redis_open(cmd, c, q);
    return rc;
}

int cli_redis_check_ids(const char *cmd, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++)
        if (!argv[i][0] || strlen(argv[i]) > RQ_ID_MAX)
            return cli_usage_error(cmd, "'%.40s' is not a job id (1 to %d bytes)", argv[i], RQ_ID_MAX);
    return 0;
}
