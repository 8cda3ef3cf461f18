/* See owned.h. */
#include "queue/owned.h"

#include <stdlib.h>
#include <string.h>

#include "queue/fetch.h"
#include "queue/rq.h"

int rq_owned(struct rq *q, const struct rq_job *const *jobs, int n, bool *owned)
{
    redisReply *r = rq_conn_command(&q->cmd, "LRANGE %s 0 -1", q->proc_key);
    if (!r)
        return rq_fail_conn(q, "processing list");
    if (rq_reply_error(r, "processing list", q->err, sizeof q->err) || r->type != REDIS_REPLY_ARRAY) {
        if (r->type != REDIS_REPLY_ERROR)
            rq_fail(q, "processing list: LRANGE answered with a reply of type %d", r->type);
        freeReplyObject(r);
        return -1;
    }
    /* an entry matches one job at most: two held copies of one text need two entries */
    bool *used = r->elements ? calloc(r->elements, sizeof *used) : NULL;
    if (r->elements && !used) {
        freeReplyObject(r);
        return rq_fail(q, "processing list: out of memory");
    }
    for (int i = 0; i < n; i++) {
        owned[i] = false;
        for (size_t k = 0; k < r->elements; k++) {
            const redisReply *e = r->element[k];
            if (!used[k] && e->type == REDIS_REPLY_STRING && e->len == jobs[i]->len &&
                memcmp(e->str, jobs[i]->raw, e->len) == 0) {
                used[k] = owned[i] = true;
                break;
            }
        }
    }
    free(used);
    freeReplyObject(r);
    return 0;
}
