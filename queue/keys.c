/* See keys.h. */
#include "queue/keys.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static int build(char *buf, size_t len, const char *prefix, const char *kind, const char *name)
{
    int n = snprintf(buf, len, "%s:%s%s", prefix, kind, name);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int rq_keys_init(struct rq_keys *k, const char *prefix, char *err, size_t errlen)
{
    memset(k, 0, sizeof *k);
    if (!prefix)
        prefix = "llmq";
    size_t n = strlen(prefix);
    if (n == 0 || n > RQ_PREFIX_MAX) {
        snprintf(err, errlen, "redis prefix \"%.80s\": expected 1 to %d bytes", prefix, RQ_PREFIX_MAX);
        return -1;
    }
    if (prefix[n - 1] == ':') {
        snprintf(err, errlen, "redis prefix \"%s\" must not end with ':' (llmq adds it)", prefix);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (isspace((unsigned char)prefix[i]) || iscntrl((unsigned char)prefix[i])) {
            snprintf(err, errlen, "redis prefix \"%s\" contains a space or control character", prefix);
            return -1;
        }
    memcpy(k->prefix, prefix, n + 1);
    build(k->workers, RQ_KEY_MAX, prefix, "workers", "");
    build(k->events, RQ_KEY_MAX, prefix, "events", "");
    build(k->retry, RQ_KEY_MAX, prefix, "retry", "");
    build(k->dead, RQ_KEY_MAX, prefix, "dead", "");
    build(k->cancel, RQ_KEY_MAX, prefix, "cancel", "");
    build(k->job_stem, RQ_KEY_MAX, prefix, "job:", "");
    build(k->queue_stem, RQ_KEY_MAX, prefix, "queue:", "");
    build(k->worker_stem, RQ_KEY_MAX, prefix, "worker:", "");
    build(k->proc_stem, RQ_KEY_MAX, prefix, "processing:", "");
    build(k->stream_stem, RQ_KEY_MAX, prefix, "stream:", "");
    build(k->models, RQ_KEY_MAX, prefix, "models", "");
    build(k->templates, RQ_KEY_MAX, prefix, "templates", "");
    build(k->batch_stem, RQ_KEY_MAX, prefix, "batch:", "");
    build(k->batches, RQ_KEY_MAX, prefix, "batches", "");
    build(k->batch_done, RQ_KEY_MAX, prefix, "batch-done", "");
    build(k->lines, RQ_KEY_MAX, prefix, "lines", "");
    build(k->results, RQ_KEY_MAX, prefix, "results", "");
    build(k->metrics, RQ_KEY_MAX, prefix, "metrics", "");
    build(k->dropped, RQ_KEY_MAX, prefix, "stream-dropped", "");
    return 0;
}

int rq_key_queue(const struct rq_keys *k, const char *queue, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "queue:", queue);
}

int rq_key_processing(const struct rq_keys *k, const char *worker, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "processing:", worker);
}

int rq_key_worker(const struct rq_keys *k, const char *worker, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "worker:", worker);
}

int rq_key_lapsed(const struct rq_keys *k, const char *worker, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "lapsed:", worker);
}

int rq_key_job(const struct rq_keys *k, const char *id, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "job:", id);
}

int rq_key_stream(const struct rq_keys *k, const char *id, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "stream:", id);
}

int rq_key_batch(const struct rq_keys *k, const char *batch_id, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "batch:", batch_id);
}

bool rq_valid_worker_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > RQ_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._@-", s[i]))
            return false;
    return true;
}

bool rq_valid_queue_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > RQ_QUEUE_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

bool rq_valid_model_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > RQ_MODEL_MAX || !isalnum((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-/", s[i]))
            return false;
    return true;
}

bool rq_valid_queue_ref(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon)
        return rq_valid_queue_name(s);
    char model[RQ_MODEL_MAX + 1];
    size_t n = (size_t)(colon - s);
    if (n > RQ_MODEL_MAX)
        return false;
    memcpy(model, s, n);
    model[n] = 0;
    return rq_valid_model_name(model) && rq_valid_queue_name(colon + 1);
}

int rq_queue_ref(const char *model, const char *queue, char *buf, size_t len)
{
    if (!rq_valid_queue_name(queue) || (model && model[0] && !rq_valid_model_name(model)))
        return -1;
    int n = model && model[0] ? snprintf(buf, len, "%s:%s", model, queue) : snprintf(buf, len, "%s", queue);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

const char *rq_queue_ref_queue(const char *ref)
{
    const char *colon = strrchr(ref, ':');
    return colon ? colon + 1 : ref;
}

int rq_queue_ref_model(const char *ref, char *buf, size_t len)
{
    const char *colon = strrchr(ref, ':');
    size_t n = colon ? (size_t)(colon - ref) : 0;
    if (n >= len)
        return -1;
    memcpy(buf, ref, n);
    buf[n] = 0;
    return 0;
}

bool rq_valid_batch_id(const char *s, size_t n)
{
    if (n == 0 || n > RQ_BATCH_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return false;
    return true;
}
