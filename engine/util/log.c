/* See log.h. */
#include "engine/util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum log_level min_level = LOG_INFO;
static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_set_level(enum log_level level) { min_level = level; }

int log_parse_level(const char *s, enum log_level *out)
{
    static const char *const lower[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, lower[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    return -1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if (level < min_level)
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%03ldZ %-5s ", ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
