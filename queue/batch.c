/* See batch.h. */
#include "queue/batch.h"

#include <stdio.h>
#include <string.h>

#include "engine/util/uuid.h"
#include "queue/rq.h"

int rq_batch_open(struct rq *q, const char *batch_id, const char *input, bool append)
{
    if (!rq_valid_batch_id(batch_id, strlen(batch_id)))
        return rq_fail(q, "batch: \"%.80s\" is not a batch id (1 to %d letters, digits, '.', '_' or '-')",
                       batch_id, RQ_BATCH_ID_MAX);
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    const char *xk[] = {q->keys.batches};
    rq_script_cmd(q, p, RQ_SCRIPT_BATCH_OPEN, q->proc_key, xk, 1);
    rq_pipe_str(p, batch_id);
    rq_pipe_str(p, input ? input : "");
    rq_pipe_str(p, append ? "1" : "0");
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "batch");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "batch", q->err, sizeof q->err))
        return -1;
    if (r->type != REDIS_REPLY_INTEGER)
        return rq_fail(q, "batch: unexpected reply from the batch_open script");
    switch (r->integer) {
    case 1:
        return RQ_BATCH_CREATED;
    case 2:
        return RQ_BATCH_REOPENED;
    case -1:
        return RQ_BATCH_CANCELLED;
    default:
        return RQ_BATCH_EXISTS;
    }
}

long long rq_batch_seal(struct rq *q, const char *batch_id)
{
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_script_cmd(q, p, RQ_SCRIPT_BATCH_SEAL, q->proc_key, NULL, 0);
    rq_pipe_str(p, batch_id);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "batch (sealing)");
    const redisReply *r = p->reply[0];
    if (rq_reply_error(r, "batch (sealing)", q->err, sizeof q->err))
        return -1;
    return r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
}

int rq_batch_state(struct rq *q, const char *batch_id, char state[16])
{
    state[0] = 0;
    char bk[RQ_KEY_MAX];
    if (!rq_valid_batch_id(batch_id, strlen(batch_id)) || rq_key_batch(&q->keys, batch_id, bk, sizeof bk))
        return rq_fail(q, "batch: \"%.80s\" is not a batch id", batch_id);
    redisReply *r = rq_conn_command(&q->cmd, "HGET %s state", bk);
    if (!r)
        return rq_fail_conn(q, "batch");
    int rc = rq_reply_error(r, "batch", q->err, sizeof q->err) ? -1 : 0;
    if (rc == 0 && r->type == REDIS_REPLY_STRING)
        snprintf(state, 16, "%.*s", (int)r->len, r->str);
    freeReplyObject(r);
    return rc;
}

void rq_new_batch_id(char id[39])
{
    char u[UUID_TEXT_LEN + 1];
    uuid7(u);
    size_t o = (size_t)snprintf(id, 39, "batch_");
    for (const char *s = u; *s && o < 38; s++)
        if (*s != '-')
            id[o++] = *s;
    id[o] = 0;
}
