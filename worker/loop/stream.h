/* The worker's side of text streaming (queue/stream.h has the Redis side and the entries): the
 * new text of running jobs that asked for it goes out in one round trip at most every
 * redis.stream_interval_ms, and each such job's last entry (the rest of its text and how it
 * ended) once its hash is final. Nothing is done while no running job streams.
 *
 * Best effort: a failed flush is logged once (until one succeeds again) and its text is sent
 * with the next one; a failed end entry is dropped. A job's result never depends on it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "engine/util/list.h"
#include "queue/stream.h"
#include "worker/loop/held.h"

struct rq;

struct wk_stream {
    double interval_s; /* redis.stream_interval_ms */
    double next_flush; /* monotonic time of the next flush */
    bool active;       /* a running job may stream (wk_stream_admit; a flush finding none clears it) */
    bool trouble;      /* a failure was logged; the next success is logged too */
    struct rq_stream_entry *e; /* [cap]: one flush's entries */
    struct wk_job **jobs;      /* [cap]: each entry's job */
    size_t cap;
};

void wk_stream_init(struct wk_stream *s, int interval_ms);
/* Frees the arrays. Accepts NULL. */
void wk_stream_free(struct wk_stream *s);

/* Whether j streams: it asked ("stream": true), parsed, and has a hash id to name the stream by. */
bool wk_stream_wants(const struct wk_job *j);
/* j was added to the engine: from now on flushes look for its text. */
void wk_stream_admit(struct wk_stream *s, const struct wk_job *j);

/* When the interval has passed: the new text of every job of `running` that streams (seq set), up
 * to its last complete UTF-8 character, in one round trip. */
void wk_stream_flush(struct wk_stream *s, struct rq *q, const struct list *running, double now_mono);

/* The end entries of jobs[0..n) that stream (others are skipped), whose hash is final now: the
 * text not sent yet, status, finish_reason, error. One round trip. */
void wk_stream_end(struct wk_stream *s, struct rq *q, struct wk_job *const *jobs, int n);
