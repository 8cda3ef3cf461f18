/* Writer of the Prometheus text exposition format, version 0.0.4 (what GET /metrics serves;
 * https://prometheus.io/docs/instrumenting/exposition_formats/):
 *
 *     # HELP llmq_prompt_tokens_total Prompt tokens of the jobs added to the engine.
 *     # TYPE llmq_prompt_tokens_total counter
 *     llmq_prompt_tokens_total 1234
 *     # HELP llmq_queue_depth Jobs waiting in a Redis queue.
 *     # TYPE llmq_queue_depth gauge
 *     llmq_queue_depth{queue="short"} 7
 *
 *     struct prom p;
 *     prom_init(&p);
 *     prom_family(&p, "llmq_queue_depth", PROM_GAUGE, "Jobs waiting in a Redis queue.");
 *     prom_sample(&p, (struct prom_label[]){{"queue", "short"}}, 1, 7);
 *     prom_histogram(&p, NULL, 0, &h);        // after a PROM_HISTOGRAM family
 *     if (p.err) ... p.errmsg ...; else use p.text.p[0..p.text.len) (NUL-terminated)
 *     prom_free(&p);
 *
 * The rules it keeps: metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 * [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"; a family's HELP and TYPE come once, before its
 * samples, and a name is declared once; HELP text escapes \ and newline, label values escape \, "
 * and newline; values are Go-style floats ("+Inf", "-Inf", "NaN", integers without a fraction);
 * a histogram writes cumulative <name>_bucket{le="..."} lines ending with le="+Inf", then
 * <name>_sum and <name>_count, and its own labels may not be "le". A broken rule (or running out
 * of memory) makes the writer sticky-failed: p.err = -1, p.errmsg says which, later calls do
 * nothing. */
#pragma once
#include <stddef.h>

#include "engine/util/buf.h"
#include "worker/metrics/histogram.h"

enum prom_type { PROM_COUNTER, PROM_GAUGE, PROM_HISTOGRAM, PROM_UNTYPED };

struct prom_label {
    const char *name, *value;
};

struct prom {
    struct buf text; /* the text so far (prom_take hands it over) */
    int err;         /* 0, or -1 once a rule was broken or memory ran out */
    char errmsg[200];
    struct buf names; /* "\n"-separated names declared so far */
    char family[128]; /* the family being written */
    enum prom_type type;
};

void prom_init(struct prom *p);
/* Frees the buffers. Accepts NULL. */
void prom_free(struct prom *p);
/* The text (caller frees with free()), leaving p empty; NULL after an error or out of memory. */
char *prom_take(struct prom *p, size_t *len);

/* Starts a family: the HELP and TYPE lines. help may be NULL (no HELP line). 0, or -1. */
int prom_family(struct prom *p, const char *name, enum prom_type type, const char *help);
/* A sample of the current counter, gauge or untyped family. 0, or -1. */
int prom_sample(struct prom *p, const struct prom_label *labels, int nlabels, double value);
/* The _bucket, _sum and _count samples of h under the current histogram family. 0, or -1. */
int prom_histogram(struct prom *p, const struct prom_label *labels, int nlabels, const struct hist *h);

/* The Content-Type of this format. */
#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* v as the format writes it into buf (at least 32 bytes): the shortest text that reads back as
 * the same double; integers up to 2^53 without exponent or fraction; +Inf, -Inf, NaN. */
void prom_format_value(double v, char *buf, size_t n);

/* Whether s is a valid metric name / label name. */
int prom_valid_metric_name(const char *s);
int prom_valid_label_name(const char *s);
