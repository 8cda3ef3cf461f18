/* A micro-benchmark of the queue path, for `llmq bench-queue` and tests/bench/test_rq_bench.c:
 * rounds of push N jobs -> fetch them (non-blocking) -> one progress update for all -> ack all,
 * timing each phase. It uses the queue `queue` of the handle's prefix; run it against a Redis
 * (or a prefix) that holds nothing else. */
#pragma once

struct rq;

struct rq_bench {
    int jobs, rounds;
    double push_ms, fetch_ms, progress_ms, ack_ms; /* mean per round */
    double round_ms;                /* fetch + progress + ack: the worker's share, mean per round */
    double best_round_ms;           /* its best round */
    double jobs_per_s;              /* jobs / round_ms */
    unsigned long long round_trips; /* of the command connection during fetch+progress+ack, per round */
};

/* Runs `rounds` rounds of `jobs` jobs of `job_bytes` bytes each. 0, or -1 (rq_error). */
int rq_bench(struct rq *q, const char *queue, int jobs, int rounds, int job_bytes, struct rq_bench *out);
