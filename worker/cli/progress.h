/* A one-line progress bar for long work: jobs done / total, tokens/s, elapsed and ETA, redrawn in
 * place on a terminal and at most ~10 times a second. When the stream is not a terminal it draws
 * nothing at all (logs and pipes stay clean).
 *
 *     [=========>          ]  412/1000 jobs  41%  1,830 tok/s  0:42 elapsed  ETA 1:00
 *
 * Usage:
 *     struct progress *p = progress_new(stderr, "jobs", total);   // total 0 = unknown
 *     ... progress_update(p, done, tokens); ...
 *     progress_finish(p);                                          // last draw + newline
 *     progress_free(p);
 * Not thread-safe: one thread draws. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct progress;

/* A bar on f, active when f is a terminal (isatty) and $TERM is not "dumb". `unit` names what is
 * counted ("jobs"; borrowed, must outlive the bar). NULL when out of memory (callers may pass NULL
 * to every function below). */
struct progress *progress_new(FILE *f, const char *unit, int64_t total);

/* The same with the terminal test decided by the caller (tests; a forced --progress). */
struct progress *progress_new_ex(FILE *f, const char *unit, int64_t total, bool active);

/* Whether the bar draws anything. */
bool progress_active(const struct progress *p);

/* What the rate counts ("tok/s" unless set; borrowed, must outlive the bar): the second number of
 * progress_update is then counted in it (e.g. "MB/s" with megabytes). */
void progress_set_rate_unit(struct progress *p, const char *rate_unit);

/* Leaves the rate out of the line (when the second number of progress_update means nothing). */
void progress_hide_rate(struct progress *p);

/* Work under way, in done's unit: e.g. 2.4 when the running jobs have generated 2.4 jobs' worth of
 * their tokens. The bar's fill, the percent and the ETA count done + partial (so they move before
 * the first item is done); the count shown is done's. Kept until set again. */
void progress_set_partial(struct progress *p, double partial);

/* Whether progress_update would draw now (an active bar whose last draw is old enough): for
 * callers whose partial takes some work to count. */
bool progress_due(const struct progress *p);

/* Changes the total (e.g. once the input's length is known); 0 = unknown. */
void progress_set_total(struct progress *p, int64_t total);

/* Records done items and the tokens generated so far, redrawing if the last draw is more than
 * 100 ms old. */
void progress_update(struct progress *p, int64_t done, int64_t tokens);

/* Draws the line for `done`/`tokens` into buf (what progress_update prints, without the
 * carriage return and padding), for tests and for one-off status lines. elapsed_s is the time
 * since the bar started, width the terminal's columns. */
void progress_format(const struct progress *p, int64_t done, int64_t tokens, double elapsed_s, int width,
                     char *buf, size_t len);

/* Redraws with the last values and ends the line (only if anything was drawn). */
void progress_finish(struct progress *p);

/* Clears the line so other output can be printed; the next update draws it again. */
void progress_clear(struct progress *p);

void progress_free(struct progress *p);
