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

int rq_key_job(const struct rq_keys *k, const char *id, char *buf, size_t len)
{
    return build(buf, len, k->prefix, "job:", id);
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
