/* See templates.h. */
#include "queue/templates.h"

#include <string.h>

#include "queue/rq.h"

int rq_template_get(struct rq *q, const char *name, char **value)
{
    *value = NULL;
    redisReply *r = rq_conn_command(&q->cmd, "HGET %s %s", q->keys.templates, name);
    if (!r)
        return rq_fail_conn(q, "templates (HGET)");
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9))
        rc = rq_fail(q, "templates: BADKEY %s is not a hash", q->keys.templates);
    else if (rq_reply_error(r, "templates (HGET)", q->err, sizeof q->err))
        rc = -1;
    else if (r->type == REDIS_REPLY_STRING) {
        *value = strndup(r->str, r->len);
        rc = *value ? 1 : rq_fail(q, "templates: out of memory");
    }
    freeReplyObject(r);
    return rc;
}

int rq_template_publish(struct rq *q, const char *name, const char *value, char **existing)
{
    *existing = NULL;
    redisReply *r = rq_conn_command(&q->cmd, "HSETNX %s %s %s", q->keys.templates, name, value);
    if (!r)
        return rq_fail_conn(q, "templates (HSETNX)");
    if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9)) {
        freeReplyObject(r);
        return rq_fail(q, "templates: BADKEY %s is not a hash", q->keys.templates);
    }
    if (rq_reply_error(r, "templates (HSETNX)", q->err, sizeof q->err) || r->type != REDIS_REPLY_INTEGER) {
        if (r->type != REDIS_REPLY_ERROR)
            rq_fail(q, "templates: unexpected reply to HSETNX");
        freeReplyObject(r);
        return -1;
    }
    long long set = r->integer;
    freeReplyObject(r);
    if (set)
        return 1;
    int rc = rq_template_get(q, name, existing);
    return rc < 0 ? -1 : 0; /* deleted in between (rc 0): nothing to compare with, and nothing pinned */
}
