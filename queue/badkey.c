/* See badkey.h. */
#include "queue/badkey.h"

#include <stdio.h>
#include <string.h>

#include "engine/util/log.h"
#include "queue/rq.h"

const char *rq_badkey_error(const struct rq *q)
{
    return strstr(q->err, "BADKEY ");
}

bool rq_badkey_first(struct rq *q, const char *text)
{
    uint64_t h = rq_hash(text, strlen(text));
    for (int i = 0; i < q->nbadkeys && i < RQ_BADKEY_MEMORY; i++)
        if (q->badkeys[i] == h)
            return false;
    q->badkeys[q->nbadkeys++ % RQ_BADKEY_MEMORY] = h;
    return true;
}

void rq_badkey_note(struct rq *q, const char *key, const char *type, const char *want, const char *doing)
{
    char text[RQ_KEY_MAX + 64];
    snprintf(text, sizeof text, "BADKEY %s is a %s, not a %s", key, type, want);
    if (rq_badkey_first(q, text))
        log_warn("redis: key %s is a %s, not a %s: %s (the key is left as it is; delete or rename it)", key,
                 type, want, doing);
}
