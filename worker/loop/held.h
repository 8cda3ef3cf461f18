/* A job the worker holds: fetched from Redis and not yet let go. It goes through these states,
 * each a list in the worker (worker/loop/worker.c):
 *
 *   RUNNING     in the engine (seq set)
 *   PENDING     finished: its SQLite row waits for the next transaction
 *   COMMITTING  its row is in the transaction the writer thread runs now
 *   COMMITTED   its row is committed: it waits for the Redis side (ack, or the dead list)
 *   ROUTE       to be moved to another queue (route says which): a short-queue job too long for
 *               the short lane, a job naming a model this worker does not serve, or a job handed
 *               back because its template could not be read from Redis
 *   RETRY       the engine failed it: to be scheduled for another attempt (rq_retry)
 *
 * A job leaves the worker (wk_job_free) only after Redis confirmed the last step, so a crash at
 * any point leaves it in the processing list for the reaper (at-least-once delivery). */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "engine/util/list.h"
#include "queue/ack.h"
#include "queue/fetch.h"
#include "worker/jobs/job.h"
#include "worker/jobs/summarize.h"
#include "worker/store/db.h"

struct tok;

enum wk_state { WK_RUNNING, WK_PENDING, WK_COMMITTING, WK_COMMITTED, WK_ROUTE, WK_RETRY, WK_NSTATES };

/* Where a ROUTE job goes. */
enum wk_to {
    WK_TO_LONG,   /* the long queue (of its model queue's model, if it came from one) */
    WK_TO_MODEL,  /* the queue of the model it names, same lane */
    WK_TO_ORIGIN, /* back where it came from */
};

/* What the Redis side does once the row is committed. */
enum wk_after {
    WK_AFTER_ACK,  /* rq_ack with the job's status */
    WK_AFTER_DEAD, /* rq_dead with its error (bad input, or out of attempts) */
    WK_AFTER_NONE, /* nothing: Redis already let it go (a retry that dead-lettered it) */
};

struct wk_job {
    struct list_node link;  /* in the list of its state */
    int state;              /* enum wk_state; -1 while in no list */
    struct rq_job rj;       /* as held in Redis (owned) */
    struct job job;         /* parsed (job_parse always initialises it; owned) */
    bool parsed;            /* job_parse succeeded */
    bool metadata_dropped;  /* parsed metadata let go while it runs (wk_job_admitted) */
    struct engine_seq *seq; /* RUNNING: borrowed from the engine until engine_release */
    struct sum_run run;     /* the user of seq: run.owner is this job, run.part NULL */
    /* A map-reduce summary job (job.summarize): its tree of parts, which run as seqs of their own
     * (seq stays NULL); NULL for any other job. Owned. */
    struct sum_job *sum;
    int parts_running; /* its parts in the engine */
    int lane;          /* engine lane */
    enum wk_to route;  /* ROUTE: where to */
    int max_tokens;    /* of the engine request (progress = tokens / max_tokens) */
    int prompt_tokens;
    int truncated_tokens;                          /* prompt tokens its "truncate" dropped */
    double fetched_mono;                           /* monotonic seconds at fetch (the engine's clock) */
    double created_at, started_at, first_token_at; /* unix seconds; NAN = unknown */
    int reported_tokens;                           /* completion tokens in the last progress sent */
    int progress_phase; /* progress goes out when (tokens + phase) % every == 0: jobs that run
                           in lockstep report on different steps */
    bool cancel_sent;   /* engine_cancel was called */
    bool progress_due;  /* a progress update waits for the next flush */
    bool count_due;     /* it started running; its delivery is not yet counted in Redis (rq_attempt) */

    /* once finished */
    enum wk_after after;
    enum rq_status status;     /* completed, failed (a timeout too), cancelled */
    const char *finish_reason; /* static string or NULL */
    int completion_tokens;
    char *output; /* owned; NULL for failed (a timeout keeps its text so far) */
    size_t output_len;
    char *reasoning; /* owned; NULL when the output had no think block */
    size_t reasoning_len;
    int reasoning_tokens;             /* -1 with no reasoning */
    char *error;                      /* owned; NULL unless failed */
    int error_rc;                     /* enum job_error of a failure */
    char *params, *metadata, *result; /* JSON text (owned, may be NULL) */
    /* a json_schema / json_object job's answer when it parsed (answer_json.h), as JSON text (owned) */
    char *output_json;
    double finished_at;          /* unix seconds */
    double ttft_ms, latency_ms;  /* NAN = unknown */
    bool degraded;               /* the row was rejected once; now written without its JSON columns */
    char row_id[JOB_ID_LEN + 1]; /* the row's id when the job has none of its own (not JSON, ...) */
    char *hash_result;           /* wk_job_hash_result's string when it made one (owned) */

    size_t stream_sent;  /* bytes of the output sent to <p>:stream:<id> (worker/loop/stream.h) */
    size_t stream_rsent; /* bytes of the reasoning sent there */
    /* its batch as Redis had it at fetch (rj.batch_id's hash), for the `batches` row; batch.id NULL =
     * none. The strings are owned. */
    struct db_batch batch;
};

/* What finishing a job needs from the worker. */
struct wk_ctx {
    const char *model_name;
    const char *worker_id;
    const struct tok *tok; /* for the token strings of OpenAI logprobs; may be NULL */
};

/* The job a list node of a state's list belongs to; NULL for NULL. */
static inline struct wk_job *wk_job_of(struct list_node *n)
{
    return LIST_ITEM(n, struct wk_job, link);
}

/* A new record that takes over *rj (zeroed). NULL when out of memory (*rj is then untouched). */
struct wk_job *wk_job_new(struct rq_job *rj, double now_mono, double now_wall);
/* Frees the record and everything it owns (not the engine seq). Accepts NULL. */
void wk_job_free(struct wk_job *j);

/* The job is in the engine (which holds its tokens): frees its parsed input, and for a large
 * job (over WK_BIG_JOB_BYTES of JSON) its parsed metadata too, read again from its text when it
 * finishes. A held job then keeps about its text alone while it runs. */
void wk_job_admitted(struct wk_job *j);
#define WK_BIG_JOB_BYTES (64 * 1024)

/* The id of the job's row and Redis hash: its own id, the one rq gave it, or a new one. */
const char *wk_job_id(const struct wk_job *j);

/* Finishes a job from its finished engine seq (completed, cancelled, failed for FINISH_ERROR, or
 * failed with its text so far for FINISH_TIMEOUT): copies the text and counters, builds the result
 * line. The seq is not released.
 * 0, or -1 out of memory (the job is then failed with that message). */
int wk_job_finish_seq(struct wk_job *j, const struct wk_ctx *c, const struct engine_seq *s, double now_mono,
                      double now_wall);
/* Finishes a map-reduce summary job (worker/jobs/summarize.h) that ended how, as wk_job_finish_seq
 * finishes one that ran in one piece, from sum_result (its usage also has chunks and depth); how
 * FINISH_ERROR fails it with error_rc (0: JOB_ERR_ENGINE) and error. 0, or -1 out of memory (the job
 * is then failed with that message). */
int wk_job_finish_summary(struct wk_job *j, const struct wk_ctx *c, enum finish_reason how, int error_rc,
                          const char *error, double now_mono, double now_wall);
/* Finishes a job that never ran: failed with rc (enum job_error) and err. */
int wk_job_finish_failed(struct wk_job *j, const struct wk_ctx *c, int rc, const char *err, double now_wall);
/* Finishes a job cancelled before it ran (status cancelled, empty output). */
int wk_job_finish_cancelled(struct wk_job *j, const struct wk_ctx *c, double now_wall);

/* The code of how the job ended (job_error_code): NULL when completed, "cancelled", or its
 * failure's code. */
const char *wk_job_error_code(const struct wk_job *j);

/* Sets the job's batch (copies of id, input and state; the rest as given). 0, or -1 out of memory. */
int wk_job_set_batch(struct wk_job *j, const struct db_batch *b);

/* The job's SQLite row (borrowing from j and c). */
void wk_job_row(const struct wk_job *j, const struct wk_ctx *c, struct db_result *r);

/* The job hash's `result` field (docs/QUEUE.md): the line `llmq results` exports for the job's
 * row (worker/store/result_line.h), or, when that is longer than max_bytes, the marker
 * {"truncated":true,"in":"sqlite","bytes":N} (N: the line's length). Borrowed from j (valid until
 * it is freed or finished again); NULL when out of memory. */
const char *wk_job_hash_result(struct wk_job *j, const struct wk_ctx *c, int64_t max_bytes);

/* After SQLite rejected the row: drops the JSON columns (params, metadata, result) so the rest
 * can be written. */
void wk_job_degrade(struct wk_job *j);
