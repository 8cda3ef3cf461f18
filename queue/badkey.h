/* Keys of the wrong type (docs/QUEUE.md, "Keys of the wrong type"): a key llmq writes that holds
 * another type (a string where a job hash belongs, a `<p>:dead` that is not a list, ...).
 *
 * The scripts (queue/scripts.c) check the keys they will write before their first write. A
 * shared key of the wrong type fails the script with nothing written and an error
 * "BADKEY <key> is a <type>, not a <type>" (in rq_error after the operation's name); the caller
 * tries again later, and the jobs concerned stay where they were. A job's own keys (its hash, its
 * batch's hash) do not stop anything: the job goes on without them and the fetch names the key
 * in a note. Either way the key is logged once per struct rq, not at every attempt. */
#pragma once
#include <stdbool.h>

struct rq;

/* The "BADKEY ..." text of rq_error(q) when the last failure was a key of the wrong type, else NULL. */
const char *rq_badkey_error(const struct rq *q);

/* Whether q meets `text` (a BADKEY error or a note naming a key) for the first time; it is
 * remembered then (the last RQ_BADKEY_MEMORY texts). */
bool rq_badkey_first(struct rq *q, const char *text);

/* Logs, the first time for q, that `key` is a `type` where llmq keeps a `want` and that `doing`
 * ("job x runs without it"). */
void rq_badkey_note(struct rq *q, const char *key, const char *type, const char *want, const char *doing);
