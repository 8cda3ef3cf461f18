/* See stream.h. */
#include "queue/stream.h"

#include <stdlib.h>

#include "queue/rq.h"

int rq_stream_add(struct rq *q, const struct rq_stream_entry *e, int n)
{
    if (n <= 0)
        return 0;
    char(*key)[RQ_KEY_MAX] = malloc((size_t)n * sizeof *key);
    if (!key)
        return rq_fail(q, "stream: out of memory");
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int i = 0; i < n; i++) {
        if (rq_key_stream(&q->keys, e[i].id, key[i], RQ_KEY_MAX)) {
            free(key);
            return rq_fail(q, "stream: job id too long for a key");
        }
        rq_pipe_cmd(p, "XADD");
        rq_pipe_str(p, key[i]);
        rq_pipe_str(p, "MAXLEN");
        rq_pipe_str(p, "~");
        rq_pipe_int(p, q->o.stream_maxlen > 0 ? q->o.stream_maxlen : 1);
        rq_pipe_str(p, "*");
        rq_pipe_str(p, "offset");
        rq_pipe_int(p, (long long)e[i].offset);
        rq_pipe_str(p, "text");
        rq_pipe_arg(p, e[i].text ? e[i].text : "", e[i].text ? e[i].text_len : 0);
        if (e[i].has_reasoning) {
            rq_pipe_str(p, "reasoning_offset");
            rq_pipe_int(p, (long long)e[i].reasoning_offset);
            rq_pipe_str(p, "reasoning");
            rq_pipe_arg(p, e[i].reasoning ? e[i].reasoning : "", e[i].reasoning ? e[i].reasoning_len : 0);
        }
        if (e[i].end) {
            rq_pipe_str(p, "end");
            rq_pipe_str(p, "1");
            rq_pipe_str(p, "status");
            rq_pipe_str(p, e[i].status ? e[i].status : "failed");
            if (e[i].finish_reason) {
                rq_pipe_str(p, "finish_reason");
                rq_pipe_str(p, e[i].finish_reason);
            }
            if (e[i].error) {
                rq_pipe_str(p, "error");
                rq_pipe_str(p, e[i].error);
            }
        }
        if (q->o.result_ttl_s > 0) {
            rq_pipe_cmd(p, "EXPIRE");
            rq_pipe_str(p, key[i]);
            rq_pipe_str(p, q->ttl_s);
        }
    }
    int rc = rq_pipe_exec(p, &q->cmd, &q->scripts);
    free(key);
    if (rc)
        return rq_fail_conn(q, "stream");
    for (int i = 0; i < p->nreply; i++)
        if (rq_reply_error(p->reply[i], "stream", q->err, sizeof q->err))
            return -1;
    return 0;
}
