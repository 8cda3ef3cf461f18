/* Shared command-line helpers; see cli.h. */
#include "worker/cli/cli.h"

#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/config/config.h"

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

/* The nearest long option to the name typed (len bytes of it), or NULL when none is close. */
static const char *nearest_option(const struct option *longopts, const char *typed, size_t len)
{
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)len, typed);
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (const struct option *o = longopts; o->name; o++) {
        size_t d = cfg_edit_distance(name, o->name);
        if (d < best_d)
            best_d = d, best = o->name;
    }
    size_t d = cfg_edit_distance(name, "version"); /* every subcommand takes it (main.c) */
    if (d < best_d)
        best_d = d, best = "version";
    return best && best_d <= (len > 6 ? 3 : 2) && best_d < len ? best : NULL;
}

int cli_bad_option(const char *cmd, int argc, char **argv, const struct option *longopts,
                   const char *shortopts)
{
    const char *typed = optind >= 1 && optind - 1 < argc ? argv[optind - 1] : "";
    if (!strncmp(typed, "--", 2) && typed[2]) {
        const char *name = typed + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct option *match = NULL;
        int prefixes = 0;
        for (const struct option *o = longopts; o->name; o++)
            if (!strncmp(o->name, name, len)) {
                if (strlen(o->name) == len) { /* exact: no ambiguity */
                    match = o, prefixes = 1;
                    break;
                }
                match = o, prefixes++;
            }
        if (optopt != 0 && !(prefixes == 1 && match->val == optopt))
            goto short_option; /* typed is done with; getopt stopped inside a later "-xy" */
        if (prefixes == 1 && match->has_arg == no_argument && eq)
            return cli_usage_error(cmd, "--%.*s takes no value", (int)len, name);
        if (prefixes == 1)
            return cli_usage_error(cmd, "--%.*s needs a value", (int)len, name);
        if (prefixes > 1) {
            char list[512] = "";
            size_t at = 0;
            for (const struct option *o = longopts; o->name && at < sizeof list - 1; o++)
                if (!strncmp(o->name, name, len))
                    at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s", at ? ", " : "", o->name);
            return cli_usage_error(cmd, "option --%.*s is ambiguous (%s)", (int)len, name, list);
        }
        const char *near = nearest_option(longopts, name, len);
        return cli_usage_error(cmd, "unknown option --%.*s%s%s%s", (int)len, name,
                               near ? " (did you mean --" : "", near ? near : "", near ? "?)" : "");
    }
short_option:
    if (optopt > 0 && optopt < 256 && optopt != ':' && strchr(shortopts, optopt))
        return cli_usage_error(cmd, "-%c needs a value", optopt);
    if (optopt > 0 && optopt < 256)
        return cli_usage_error(cmd, "unknown option -%c", optopt);
    return cli_usage_error(cmd, "unknown option '%s'", typed);
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
