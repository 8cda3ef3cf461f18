/* What the Redis client subcommands (enqueue, status, cancel, requeue-dead, batch, requeue)
 * share: the options -c FILE / --redis URL / --help, the configuration from them, $LLMQ_CONFIG
 * and the environment, and a connected queue handle. */
#pragma once
#include <stdio.h>

struct cfg;
struct rq;
struct option;

/* The values getopt_long gives --redis and --json; a command numbers its own long-only options
 * from CLI_REDIS_O_OWN up. */
enum { CLI_REDIS_O_REDIS = 256, CLI_REDIS_O_JSON, CLI_REDIS_O_OWN };

/* A command's own options, besides those every Redis client command takes. */
struct cli_redis_spec {
    void (*usage)(FILE *f);        /* prints the --help text */
    const char *shortopts;         /* its own short options in getopt form ("q:"), or NULL */
    const struct option *longopts; /* its own long options, NULL-terminated (at most 16), or NULL */
    void (*on_opt)(int opt, const char *arg, void *ctx); /* called for each of its own options */
    void *ctx;                                           /* passed to on_opt */
};

/* The options every Redis client command takes (borrowed from argv or static). */
struct cli_redis_args {
    const char *config; /* -c/--config FILE, else cfg_default_path() */
    const char *redis;  /* --redis URL, or NULL */
    int exit;           /* when cli_redis_getopt returns -1: the command's exit status */
};

/* Parses argv with getopt_long: -c/--config, --redis and -h/--help (prints s->usage(stdout)) into
 * *a, the command's own options through s->on_opt. A command with -f/--format also takes --json,
 * given to on_opt as 'f' with "json". Returns 0 with optind at the first operand, or
 * -1 when the command is done, with a->exit set: 0 after --help, 2 after an unknown option or one
 * without its value (reported on stderr as "llmq <cmd>: ..."). */
int cli_redis_getopt(const char *cmd, int argc, char **argv, const struct cli_redis_spec *s,
                     struct cli_redis_args *a);

/* Fills *c: defaults < the file (config, may be NULL) < LLMQ_* environment < --redis (redis_url,
 * may be NULL), validated. Returns 0, or the exit status after printing "llmq <cmd>: ..." on
 * stderr (1 for a bad file, 2 for a bad flag value). *c must be given to cfg_free either way. */
int cli_redis_config(const char *cmd, const char *config, const char *redis_url, struct cfg *c);

/* Opens and connects a queue handle for c (c must outlive it). Returns 0, or after printing why on
 * stderr (*q is then NULL) CLI_EXIT_UNREACHABLE when Redis cannot be reached, else 1 (refused credentials
 * too). */
int cli_redis_open(const char *cmd, const struct cfg *c, struct rq **q);

/* cli_redis_config from a, then cli_redis_open. Returns 0, or the exit status after printing why
 * (*q is then NULL). *c must be given to cfg_free either way, *q to rq_free. */
int cli_redis_connect(const char *cmd, const struct cli_redis_args *a, struct cfg *c, struct rq **q);

/* Checks that argv[first..argc) are job ids (1 to RQ_ID_MAX bytes). Returns 0, or 2 after
 * cli_usage_error naming the first that is not. */
int cli_redis_check_ids(const char *cmd, int argc, char **argv, int first);
