/* Shared command-line helpers; see cli.h. */
#include "worker/cli/cli.h"

#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
    if (optopt > 0 && optopt < 256 && optopt != '?') /* a long option's value (>= 256) names no letter */
        return cli_usage_error(cmd, "option '-%c' is unknown or needs a value", optopt);
    return cli_usage_error(cmd, "option '%s' is unknown or needs a value", opt);
}

long cli_count_lines(const char *path, bool skip_blank)
{
    struct stat st;
    if (!strcmp(path, "-") || stat(path, &st) || !S_ISREG(st.st_mode))
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char buf[1 << 14];
    long n = 0;
    bool open = false, nonblank = false; /* the current line has bytes; has bytes that are not blank */
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < got; i++) {
            char ch = buf[i];
            if (ch == '\n') {
                n += skip_blank ? nonblank : 1;
                open = nonblank = false;
            } else {
                open = true;
                nonblank |= ch != ' ' && ch != '\t' && ch != '\r';
            }
        }
    fclose(f);
    return n + (skip_blank ? nonblank : open);
}

static volatile sig_atomic_t interrupted;

static void on_interrupt(int s)
{
    (void)s;
    interrupted = 1;
}

void cli_catch_interrupts(void)
{
    interrupted = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool cli_interrupted(void)
{
    return interrupted;
}
