/* Cancellation through the set <p>:cancel: a client (or `llmq cancel ID`) adds a job id; the
 * worker checks the ids it holds once per engine step (one SMISMEMBER for all of them) and, for
 * queued jobs, at fetch (rq_job.cancel_requested); it then stops the job, records what was
 * generated, and acks it as cancelled, which removes the id from the set. */
#pragma once
#include <stdbool.h>

struct rq;

/* Asks for ids[0..n) to be cancelled: each is added to <p>:cancel unless its job has already
 * ended (completed, failed or cancelled). accepted (may be NULL) gets 1/0 per id. Returns how
 * many were added, or -1. */
int rq_cancel(struct rq *q, const char *const *ids, int n, bool *accepted);

/* Whether each of ids[0..n) is in <p>:cancel, in one round trip (SMISMEMBER). 0, or -1. */
int rq_cancel_check(struct rq *q, const char *const *ids, int n, bool *out);

/* Removes ids[0..n) from <p>:cancel (rq_ack does it for the jobs it acks). 0, or -1. */
int rq_cancel_clear(struct rq *q, const char *const *ids, int n);
