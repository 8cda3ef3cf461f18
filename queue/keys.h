/* The Redis key layout: the one place llmq's key names are built (DESIGN.md "Redis keys").
 *
 *   <p>:queue:<name>        list    job JSON; clients LPUSH, workers move from the RIGHT
 *   <p>:processing:<worker> list    the jobs a worker holds (newest at the left)
 *   <p>:worker:<worker>     hash    heartbeat, with a TTL
 *   <p>:workers             set     known worker ids
 *   <p>:job:<id>            hash    a job's state and counters
 *   <p>:events              stream  state changes and progress, MAXLEN ~ capped
 *   <p>:retry               zset    raw job JSON scored by its due time (unix milliseconds)
 *   <p>:dead                list    dead-letter entries (JSON), newest at the left
 *   <p>:cancel              set     job ids a client asked to cancel
 *   <p>:stream:<id>         stream  generated text of a job that asked for streaming (stream.h)
 *   <p>:queue:<model>:<q>   list    jobs that name a model (q: short, long); see "Model queues"
 *   <p>:models              set     model names that have (had) a model queue
 *   <p>:templates           hash    prompt templates published by workers: name -> JSON
 *   <p>:batch:<id>          hash    a batch: input, created_at, total, counts by status, state
 *   <p>:batches             zset    batch ids scored by created_at
 *   <p>:batch-done          channel a batch id is PUBLISHed when its last job becomes final
 *   <p>:results             stream  finished jobs' rows for `llmq collect --redis` (results.h)
 *   <p>:metrics             stream  workers' and worker_metrics rows for the same
 *   <p>:stream-dropped      hash    entries the length cap took from those streams, by stream
 *
 * Model queues. A job that names a model (llmq "model", OpenAI "body.model") waits in its model's
 * queues; the unnamed queues keep jobs that name none. Inside llmq a queue is named by a "queue
 * reference": a plain queue name ("short") or "<model>:<queue>" ("qwen3-8b:short"). The reference
 * is what a job's hash keeps in its `queue` field, so the reaper, retries and requeues put a job
 * back where it came from by appending it to <p>:queue:. Only this file joins and splits them.
 *
 * <p> is the prefix ("llmq" by default; "{llmq}" on Redis Cluster, so every key hashes to one
 * slot). Lua scripts receive the stems (the key with an empty name, e.g. "llmq:job:") and only
 * append names to them. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define RQ_PREFIX_MAX 64 /* bytes of a prefix */
#define RQ_NAME_MAX 128  /* bytes of a worker id */
#define RQ_QUEUE_MAX 32  /* bytes of a queue name */
#define RQ_MODEL_MAX 128 /* bytes of a model name */
#define RQ_QREF_MAX (RQ_MODEL_MAX + 1 + RQ_QUEUE_MAX) /* bytes of a queue reference */
#define RQ_OWN_ID_MAX 256  /* bytes of a job's own "id" or "custom_id" (JOB_MAX_ID_BYTES) */
#define RQ_BATCH_ID_MAX 64 /* bytes of a batch id */
/* bytes of a job's key: its own id, or "<batch_id>/<custom_id>" (queue/jobid.h) */
#define RQ_ID_MAX (RQ_BATCH_ID_MAX + 1 + RQ_OWN_ID_MAX)
#define RQ_KEY_MAX (RQ_PREFIX_MAX + RQ_ID_MAX + 32)

struct rq_keys {
    char prefix[RQ_PREFIX_MAX + 1];
    char workers[RQ_KEY_MAX];     /* <p>:workers */
    char events[RQ_KEY_MAX];      /* <p>:events */
    char retry[RQ_KEY_MAX];       /* <p>:retry */
    char dead[RQ_KEY_MAX];        /* <p>:dead */
    char cancel[RQ_KEY_MAX];      /* <p>:cancel */
    char job_stem[RQ_KEY_MAX];    /* <p>:job: */
    char queue_stem[RQ_KEY_MAX];  /* <p>:queue: */
    char worker_stem[RQ_KEY_MAX]; /* <p>:worker: */
    char proc_stem[RQ_KEY_MAX];   /* <p>:processing: */
    char stream_stem[RQ_KEY_MAX]; /* <p>:stream: */
    char models[RQ_KEY_MAX];      /* <p>:models */
    char templates[RQ_KEY_MAX];   /* <p>:templates */
    char batch_stem[RQ_KEY_MAX];  /* <p>:batch: */
    char batches[RQ_KEY_MAX];     /* <p>:batches */
    char batch_done[RQ_KEY_MAX];  /* <p>:batch-done (a pub/sub channel) */
    char lines[RQ_KEY_MAX];       /* <p>:lines: lines without an id put back by the reaper */
    char results[RQ_KEY_MAX];     /* <p>:results */
    char metrics[RQ_KEY_MAX];     /* <p>:metrics */
    char dropped[RQ_KEY_MAX];     /* <p>:stream-dropped */
};

/* Fills k for `prefix` (NULL = "llmq"). Fails, with the reason in err, on a prefix that is empty,
 * longer than RQ_PREFIX_MAX, ends with ':' or holds a space or control character. */
int rq_keys_init(struct rq_keys *k, const char *prefix, char *err, size_t errlen);

/* Builders: write the key into buf[len] (len >= RQ_KEY_MAX always suffices for valid names);
 * return 0, or -1 when it does not fit. */
int rq_key_queue(const struct rq_keys *k, const char *queue, char *buf, size_t len); /* queue: a reference */
int rq_key_processing(const struct rq_keys *k, const char *worker, char *buf, size_t len);
int rq_key_worker(const struct rq_keys *k, const char *worker, char *buf, size_t len);
/* <p>:lapsed:<worker>: a reaper's mark that the worker's heartbeat was found lapsed (queue/reaper.h) */
int rq_key_lapsed(const struct rq_keys *k, const char *worker, char *buf, size_t len);
int rq_key_job(const struct rq_keys *k, const char *id, char *buf, size_t len);
int rq_key_stream(const struct rq_keys *k, const char *id, char *buf, size_t len);
int rq_key_batch(const struct rq_keys *k, const char *batch_id, char *buf, size_t len);

/* Name rules. A worker id: 1..RQ_NAME_MAX letters, digits and . _ @ - (as worker.id in the
 * config). A queue name: 1..RQ_QUEUE_MAX letters, digits, _ and -. A batch id: 1..RQ_BATCH_ID_MAX
 * letters, digits, ., _ and - (no '/', so a job key "<batch_id>/<custom_id>" splits at its first
 * '/'); the same rule is in the Lua prelude (queue/scripts.c). */
bool rq_valid_worker_id(const char *s);
bool rq_valid_queue_name(const char *s);
bool rq_valid_batch_id(const char *s, size_t n);

/* A model name: 1..RQ_MODEL_MAX bytes of letters, digits and . _ - /, starting with a letter or
 * digit ("qwen3-8b", "Qwen/Qwen3-8B"). No ':' (it separates the model from the queue in a
 * reference) and no spaces. Names are compared exactly (case matters), as vLLM's
 * --served-model-name does. */
bool rq_valid_model_name(const char *s);
/* A queue reference: a queue name, or "<model>:<queue name>". */
bool rq_valid_queue_ref(const char *s);
/* Writes the reference of `queue` for `model` (NULL or "" = the unnamed queue: queue itself) into
 * buf[len]. 0, or -1 when a name is invalid or it does not fit (len > RQ_QREF_MAX suffices). */
int rq_queue_ref(const char *model, const char *queue, char *buf, size_t len);
/* The queue name of a reference ("short" for "qwen3-8b:short"; borrowed from ref). */
const char *rq_queue_ref_queue(const char *ref);
/* The model of a reference into buf[len] ("" for an unnamed queue). 0, or -1 when it does not fit. */
int rq_queue_ref_model(const char *ref, char *buf, size_t len);
