/* See push.h. */
#include "queue/push.h"

#include <stdlib.h>
#include <string.h>

#include "engine/util/log.h"
#include "queue/badkey.h"
#include "queue/replicas.h"
#include "queue/rq.h"

#define CHUNK 1000 /* jobs per script call */

void rq_push_item_clear(struct rq_push_item *items, int n)
{
    for (int i = 0; i < n; i++) {
        free(items[i].refused);
        items[i].refused = NULL;
    }
}

int rq_push(struct rq *q, const char *queue, const char *batch_id, enum rq_push_mode mode,
            struct rq_push_item *items, int n)
{
    if (n <= 0)
        return 0;
    if (!rq_valid_queue_ref(queue))
        return rq_fail(q, "push: \"%.160s\" is not a queue name", queue);
    if (batch_id && !rq_valid_batch_id(batch_id, strlen(batch_id)))
        return rq_fail(q, "push: \"%.80s\" is not a batch id", batch_id);
    static const char *const modes[] = {
        [RQ_PUSH_NEW] = "new", [RQ_PUSH_REPLACE] = "replace", [RQ_PUSH_FORCE] = "force"};
    char qk[RQ_KEY_MAX];
    rq_key_queue(&q->keys, queue, qk, sizeof qk);
    const char *xk[] = {qk};
    rq_stamp(q);
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    int first = rq_model_add_cmd(q, p, queue); /* 1 when it added an SADD first */
    for (int base = 0; base < n; base += CHUNK) {
        int m = n - base < CHUNK ? n - base : CHUNK;
        rq_script_cmd(q, p, RQ_SCRIPT_PUSH, q->proc_key, xk, 1);
        rq_pipe_str(p, batch_id ? batch_id : "");
        rq_pipe_str(p, modes[mode]);
        rq_pipe_int(p, m);
        for (int i = base; i < base + m; i++) {
            items[i].refused = NULL;
            rq_pipe_arg(p, items[i].raw, items[i].len);
            rq_pipe_str(p, items[i].id ? items[i].id : "");
        }
    }
    int waits = rq_wait_cmd(q, p); /* after every script call, in the same round trip */
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "push");
    int refused = 0;
    for (int i = 0; i < first; i++) {
        const redisReply *r = p->reply[i];
        if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9)) {
            /* the index of model queues only: the jobs are pushed all the same */
            if (rq_badkey_first(q, "BADKEY models (push)"))
                log_warn(
                    "redis: %s is not a set: this model's queue is not listed (by `llmq status`) until the "
                    "key is deleted or renamed",
                    q->keys.models);
        } else if (rq_reply_error(r, "push (SADD)", q->err, sizeof q->err)) {
            return -1;
        }
    }
    for (int c = 0; c + first + waits < p->nreply; c++) {
        const redisReply *r = p->reply[c + first];
        if (rq_reply_error(r, "push", q->err, sizeof q->err))
            return -1;
        int base = c * CHUNK, m = n - base < CHUNK ? n - base : CHUNK;
        if (r->type != REDIS_REPLY_ARRAY || (int)r->elements != m)
            return rq_fail(q, "push: unexpected reply from the push script");
        for (int i = 0; i < m; i++) {
            const redisReply *x = r->element[i];
            if (x->type == REDIS_REPLY_STRING && x->len > 0) {
                items[base + i].refused = strndup(x->str, x->len);
                refused++;
            }
        }
    }
    if (waits && rq_wait_check(q, p->reply[p->nreply - 1], "push"))
        return -1;
    return refused;
}

int rq_job_statuses(struct rq *q, const char *const *ids, int n, char (*status)[16])
{
    if (n <= 0)
        return 0;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int i = 0; i < n; i++) {
        char hk[RQ_KEY_MAX];
        if (rq_key_job(&q->keys, ids[i], hk, sizeof hk))
            return rq_fail(q, "checking job ids: \"%.80s\" is too long for a key", ids[i]);
        rq_pipe_cmd(p, "HGET");
        rq_pipe_fmt(p, "%s", hk); /* a copy: hk is gone before the exec */
        rq_pipe_str(p, "status");
    }
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "checking job ids");
    for (int i = 0; i < n; i++) {
        const redisReply *r = p->reply[i];
        if (rq_reply_error(r, "checking job ids", q->err, sizeof q->err))
            return -1;
        status[i][0] = 0;
        if (r->type == REDIS_REPLY_STRING) {
            size_t k = r->len < 15 ? r->len : 15;
            memcpy(status[i], r->str, k);
            status[i][k] = 0;
        }
    }
    return 0;
}
