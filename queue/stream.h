/* Text streaming: the generated text of a job that asked for it (`"stream": true`), appended to
 * the Redis stream <p>:stream:<id> (the job hash's id) while the job runs, for a client doing
 * XREAD. docs/QUEUE.md is the client's side. Entries (all fields strings):
 *
 *   text   {"offset": "0", "text": "Once upon"}       new text; `offset` is its byte offset in the
 *                                                      attempt's output (the answer, on a model that
 *                                                      thinks)
 *          {"offset": "0", "text": "", "reasoning_offset": "0", "reasoning": "Let me"}
 *                                                      new reasoning (a model that thinks), at its own
 *                                                      offset in the attempt's reasoning; any entry
 *                                                      may carry both
 *   end    {"offset": "9", "text": " a time", "end": "1", "status": "completed",
 *           "finish_reason": "length", "error"?: "..."}   the last one, once the job's hash is final
 *
 * A client keeps out = out[0:offset] + text for every entry, and reasoning =
 * reasoning[0:reasoning_offset] + reasoning for every entry that has them: a job that runs again (a retry, or
 * handed back at shutdown) starts over at offset 0, and an entry sent twice changes nothing.
 * `text` never splits a UTF-8 character. Every XADD trims the stream to about stream_maxlen
 * entries (MAXLEN ~) and sets its TTL to result_ttl_s (none when that is 0), so it expires with
 * the job's hash.
 *
 * Streaming is best effort: a failed call loses nothing the job needs (its result goes to SQLite
 * and the hash as always); the caller may send the same text again later. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct rq;

/* One entry. Strings are borrowed for the call. */
struct rq_stream_entry {
    const char *id;   /* the job hash's id (not empty) */
    size_t offset;    /* where text starts in the output */
    const char *text; /* text_len bytes (NULL with 0) */
    size_t text_len;
    bool has_reasoning;      /* the entry carries reasoning_offset and reasoning */
    size_t reasoning_offset; /* where reasoning starts in the attempt's reasoning */
    const char *reasoning;   /* reasoning_len bytes (NULL with 0) */
    size_t reasoning_len;
    bool end;                  /* the last entry: status (and finish_reason, error) follow */
    const char *status;        /* end: "completed", "failed", "cancelled" */
    const char *finish_reason; /* end: NULL = none */
    const char *error;         /* end: NULL = none */
};

/* Appends e[0..n) to their jobs' streams in one round trip (XADD MAXLEN ~ and EXPIRE per entry).
 * 0, or -1 (rq_error; some entries may have been added: sending them again is harmless). */
int rq_stream_add(struct rq *q, const struct rq_stream_entry *e, int n);
