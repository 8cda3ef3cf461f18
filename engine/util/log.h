/* Log lines on stderr: "2026-11-29T21:55:01.123Z INFO  message". Thread-safe (one fprintf per
 * line). The level is set once at start-up; lines below it are dropped. */
#pragma once

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_set_level(enum log_level level);
/* Parses "debug|info|warn|error"; returns -1 on anything else. */
int log_parse_level(const char *s, enum log_level *out);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
