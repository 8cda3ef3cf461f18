/* What keeps a `llmq worker --drain` from exiting: jobs in the queues it serves, in the retry set,
 * or in any other worker's processing list, live or lapsed.
 *
 * A live worker's list counts too: the worker may still die (kill -9, OOM, power) with it, and
 * then nobody would be left to run those jobs; when it finishes them instead, the list empties.
 * A lapsed worker's list goes back to the queues at the next reaper run (queue/reaper.h), so the
 * drain worker runs those jobs itself. For each holder the answer says when its heartbeat
 * lapses at the latest (if it has died), so the caller can reap at that moment (rq_tick_reap_in)
 * rather than at the reaper's next round. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "queue/keys.h"

struct rq;

#define RQ_DRAIN_MAX_QUEUES 32

/* A worker other than the caller whose processing list holds jobs. */
struct rq_drain_holder {
    char id[RQ_NAME_MAX + 1];
    int64_t jobs;     /* LLEN of its processing list */
    int64_t lapse_ms; /* PTTL of its heartbeat: ms until it lapses unless renewed; -2 lapsed
                         already (gone), -1 set without a TTL (never lapses) */
};

struct rq_drain {
    int64_t queued;                  /* jobs in the queues asked about */
    int64_t retry;                   /* ZCARD <p>:retry */
    int64_t held;                    /* jobs in the holders' lists, all together */
    struct rq_drain_holder *holders; /* [nholders], owned; sorted by id */
    int nholders;
};

/* Reads what keeps a drain from ending, for the queues in queues[0..nq) (nq <=
 * RQ_DRAIN_MAX_QUEUES): two round trips (SMEMBERS of the workers set, then one pipeline of LLEN,
 * ZCARD and PTTL). The caller's own list is not counted: what it holds is its own business.
 * A queue, retry set or processing list of the wrong type holds no job: it counts as empty
 * (logged once, queue/badkey.h). 0, or -1 with rq_error. d must be given to rq_drain_free either
 * way. */
int rq_drain_check(struct rq *q, const char *const *queues, int nq, struct rq_drain *d);
/* Frees d's holders. Accepts NULL and a zeroed or freed d. */
void rq_drain_free(struct rq_drain *d);

/* Whether d shows nothing left: the queues, the retry set and every other worker's list empty. */
bool rq_drain_done(const struct rq_drain *d);
