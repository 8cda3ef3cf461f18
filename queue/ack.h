/* Acknowledging finished jobs. The caller commits the results to SQLite first and acks after
 * (at-least-once delivery: a crash in between replays the job, and the SQLite upsert keyed by
 * job id makes the replay harmless).
 *
 * For every job, atomically, and for the whole batch in one script call (one round trip): LREM
 * from the processing list; HSET the hash's final status, finished_at, counters, error,
 * error_code and result (so a client that sees the final status finds the result with it);
 * EXPIRE after result_ttl; SREM from <p>:cancel; XADD the state change to <p>:events; the count
 * of the job's batch moves with its status, and the ack that makes a batch's last job final
 * completes the batch (queue/scripts.h); with results_stream on, the job's row goes onto
 * <p>:results in the same script (queue/results.h). */
#pragma once

#include "queue/fetch.h"

struct rq;

/* The states of a job's hash (the `status` field). */
enum rq_status {
    RQ_STATUS_QUEUED,
    RQ_STATUS_RUNNING,
    RQ_STATUS_COMPLETED,
    RQ_STATUS_FAILED,
    RQ_STATUS_CANCELLED,
};
/* "queued", "running", "completed", "failed", "cancelled". */
const char *rq_status_name(enum rq_status s);

/* How one job ended. */
struct rq_result {
    const struct rq_job *job;  /* borrowed */
    enum rq_status status;     /* completed, failed or cancelled */
    const char *error;         /* NULL = none (an error left by an earlier attempt is removed) */
    const char *error_code;    /* "invalid_request", "cancelled", ...; NULL = none (removed) */
    const char *finish_reason; /* "stop", "length", ...; NULL = not recorded */
    int prompt_tokens;         /* < 0 = leave as it is */
    int completion_tokens;     /* < 0 = leave as it is */
    double first_token_at;     /* unix seconds; 0 = leave as it is */
    const char *result;        /* the hash's `result` field (the exported result line, or the marker
                                  that it is in SQLite only); NULL = none written */
    const char *row_id;        /* the row published onto <p>:results with the ack (queue/results.h): its id */
    const char *row;           /* ... and its JSON; NULL = none (or q publishes no rows) */
    /* set by rq_ack */
    long long batch_done; /* > 0: this ack completed the job's batch (job->batch_id), of this many jobs */
};

/* Acks res[0..n) in one script call. Returns how many of the jobs were still in this worker's
 * processing list (the others were taken back by a reaper, or Redis lost them in a restart
 * without persistence; their hash is updated all the same), or -1 (rq_error; nothing changed,
 * the jobs are still held, try again). Sets res[i].batch_done. */
int rq_ack(struct rq *q, struct rq_result *res, int n);
