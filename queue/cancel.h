/* Cancellation through the set <p>:cancel: a client (or `llmq cancel ID`) adds a job id; the
 * worker checks the ids it holds once per engine step (one SMISMEMBER for all of them) and, for
 * queued jobs, at fetch (rq_job.cancel_requested); it then stops the job, records what was
 * generated, and acks it as cancelled. Every script that makes a job final (ack, dead-letter,
 * a copy dropped as a duplicate, purge) removes its id from the set in the same atomic step. */
#pragma once
#include <stdbool.h>

struct rq;

/* What rq_cancel did for one id. */
enum rq_cancel_outcome {
    RQ_CANCEL_UNKNOWN = -1, /* no such job (no hash): nothing added */
    RQ_CANCEL_ENDED = 0,    /* its job has already ended: nothing added; status says how */
    RQ_CANCEL_ASKED = 1,    /* added to <p>:cancel */
};
struct rq_cancel_result {
    enum rq_cancel_outcome outcome;
    char status[16]; /* RQ_CANCEL_ENDED: "completed", "failed" or "cancelled"; else "" */
};

/* Asks for ids[0..n) to be cancelled, atomically: each is added to <p>:cancel when its job
 * exists (has a hash) and has not ended (completed, failed or cancelled). An addition sets the
 * set's expiry to queues.result_ttl_s, so ids nothing takes out (clients' SADDs for jobs that
 * never came) do not stay for ever. res (may be NULL) gets one result per id. Returns how many
 * were added, or -1. */
int rq_cancel(struct rq *q, const char *const *ids, int n, struct rq_cancel_result *res);

/* Whether each of ids[0..n) is in <p>:cancel, in one round trip (SMISMEMBER). 0, or -1. */
int rq_cancel_check(struct rq *q, const char *const *ids, int n, bool *out);

/* Removes ids[0..n) from <p>:cancel (rq_ack does it for the jobs it acks). 0, or -1. */
int rq_cancel_clear(struct rq *q, const char *const *ids, int n);
