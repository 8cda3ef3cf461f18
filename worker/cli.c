/* Shared command-line helpers; see cli.h. */
#include "worker/cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "llmq %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nRun 'llmq %s --help' for usage.\n", cmd);
    return 2;
}

int cli_bad_option(const char *cmd, int argc, char **argv)
{
    const char *opt = (optind - 1 < argc && optind > 0) ? argv[optind - 1] : "?";
    if (optopt && optopt != '?')
        return cli_usage_error(cmd, "option '-%c' is unknown or needs a value", optopt);
    return cli_usage_error(cmd, "option '%s' is unknown or needs a value", opt);
}
