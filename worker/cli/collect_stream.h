/* `llmq collect --redis`: the collector. Reads the result streams (queue/results.h) through a
 * consumer group (queue/collect.h) and writes their rows into one SQLite file under the rules of
 * `--from-db` (worker/store/merge.h), acknowledging each entry only after the transaction that
 * holds its row has committed. docs/FLEET.md is the user's side. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

struct db;
struct rq;

struct collect_opts {
    const char *group;    /* consumer group */
    const char *consumer; /* this collector's name in the group */
    int batch;            /* entries read (and written in one transaction) at a time */
    int claim_idle_ms;    /* entries pending this long on a consumer are taken over */
    bool once;            /* return once caught up (nothing new, nothing to claim) */
    bool quiet;           /* no log lines (errors are still printed) */
};

/* What a run did. */
struct collect_stats {
    int64_t entries;                 /* entries written and acknowledged */
    int64_t claimed;                 /* ... of which taken over from another consumer */
    int64_t jobs_written, jobs_kept; /* jobs rows: written (new, replaced, attempts raised) / kept */
    int64_t metrics_rows, worker_rows;
    int64_t malformed; /* entries without a readable row, or whose row the database refused (a rule of its
                          schema): acknowledged and skipped (logged) */
    int64_t trimmed;   /* entries trimmed from the streams after every group had them */
    double seconds;
};

/* Runs the collector on q (connected) into db until SIGINT/SIGTERM (cli_catch_interrupts) or,
 * with o->once, until caught up. Redis or SQLite failures are logged and retried (the entries stay
 * pending until written). 0, or 1 when the group cannot be created or, with once, a failure
 * persists. */
int collect_stream(struct rq *q, struct db *db, const struct collect_opts *o, struct collect_stats *st);
