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
#define RQ_ID_MAX 256    /* bytes of a job id (JOB_MAX_ID_BYTES) */
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
};

/* Fills k for `prefix` (NULL = "llmq"). Fails, with the reason in err, on a prefix that is empty,
 * longer than RQ_PREFIX_MAX, ends with ':' or holds a space or control character. */
int rq_keys_init(struct rq_keys *k, const char *prefix, char *err, size_t errlen);

/* Builders: write the key into buf[len] (len >= RQ_KEY_MAX always suffices for valid names);
 * return 0, or -1 when it does not fit. */
int rq_key_queue(const struct rq_keys *k, const char *queue, char *buf, size_t len);
int rq_key_processing(const struct rq_keys *k, const char *worker, char *buf, size_t len);
int rq_key_worker(const struct rq_keys *k, const char *worker, char *buf, size_t len);
int rq_key_job(const struct rq_keys *k, const char *id, char *buf, size_t len);

/* Name rules. A worker id: 1..RQ_NAME_MAX letters, digits and . _ @ - (as worker.id in the
 * config). A queue name: 1..RQ_QUEUE_MAX letters, digits, _ and -. */
bool rq_valid_worker_id(const char *s);
bool rq_valid_queue_name(const char *s);
