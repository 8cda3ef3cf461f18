/* Emptying a queue, the retry set or the dead list on an operator's word (`llmq purge`): the
 * entries go, and with them the hashes of the jobs they were (so a client following a job sees
 * it gone, with a `purged` event). Each call of the purge script is atomic for the entries it
 * takes; a large list is taken in rounds of RQ_PURGE_ROUND entries, so Redis never blocks for
 * long, oldest first. docs/QUEUE.md "Job lifecycle" (Purge) has the rules for batches and hashes. */
#pragma once

struct rq;

#define RQ_PURGE_ROUND 500

enum rq_purge_what {
    RQ_PURGE_QUEUE, /* <p>:queue:<ref> */
    RQ_PURGE_RETRY, /* <p>:retry */
    RQ_PURGE_DEAD,  /* <p>:dead */
};

/* How many entries are there to purge: LLEN of the queue `ref` (a queue reference: short, long,
 * <model>:short, ...) or of the dead list, ZCARD of the retry set (ref ignored). -1 (rq_error). */
long long rq_purge_count(struct rq *q, enum rq_purge_what what, const char *ref);

/* Removes up to max entries (max > 0), oldest first: a queued job's hash is deleted and its
 * batch counts it cancelled; a dead entry's failed hash is deleted (its batch keeps it failed);
 * a hash in another state, or naming another queue (a stale copy), is left alone; every id with an entry leaves <p>:cancel and gets a
 * `purged` event. *hashes (may be NULL) gets how many hashes were deleted. Returns the entries
 * removed, or -1 (rq_error; what earlier rounds removed stays removed). */
long long rq_purge(struct rq *q, enum rq_purge_what what, const char *ref, long long max, long long *hashes);
