/* See collect.h. */
#include "queue/collect.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "queue/rq.h"

const char *rq_rstream_name(int s)
{
    return s == RQ_RS_METRICS ? "metrics" : "results";
}

const char *rq_rstream_key(const struct rq *q, int s)
{
    return s == RQ_RS_METRICS ? q->keys.metrics : q->keys.results;
}

void rq_entries_clear(struct rq_entries *es)
{
    for (int i = 0; i < es->nreply; i++)
        freeReplyObject(es->reply[i]);
    es->nreply = 0;
    es->n = 0;
}

void rq_entries_free(struct rq_entries *es)
{
    if (!es)
        return;
    rq_entries_clear(es);
    free(es->reply);
    free(es->e);
    memset(es, 0, sizeof *es);
}

/* Keeps reply r in es (es frees it). -1 out of memory (r freed). */
static int keep(struct rq_entries *es, redisReply *r)
{
    if (array_reserve(&es->reply, &es->capreply, (size_t)es->nreply + 1, sizeof *es->reply, 8)) {
        freeReplyObject(r);
        return -1;
    }
    es->reply[es->nreply++] = r;
    return 0;
}

/* Appends the entries of x (an array of [id, [field, value, ...]]) of stream s. Returns how many,
 * or -1 out of memory. */
static int take_entries(struct rq_entries *es, int s, const redisReply *x)
{
    if (!x || x->type != REDIS_REPLY_ARRAY)
        return 0;
    int added = 0;
    for (size_t i = 0; i < x->elements; i++) {
        const redisReply *en = x->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || en->element[0]->type != REDIS_REPLY_STRING)
            continue;
        if (array_reserve(&es->e, &es->cap, (size_t)es->n + 1, sizeof *es->e, 64))
            return -1;
        struct rq_entry *e = &es->e[es->n++];
        memset(e, 0, sizeof *e);
        e->stream = s;
        snprintf(e->eid, sizeof e->eid, "%s", en->element[0]->str);
        const redisReply *f = en->element[1];
        for (size_t k = 0; f->type == REDIS_REPLY_ARRAY && k + 1 < f->elements; k += 2) {
            const redisReply *name = f->element[k], *v = f->element[k + 1];
            if (name->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
                continue;
            if (!strcmp(name->str, "row")) {
                e->row = v->str;
                e->row_len = v->len;
            } else if (!strcmp(name->str, "kind")) {
                e->kind = v->str;
            }
        }
        added++;
    }
    return added;
}

static int stream_of(const struct rq *q, const redisReply *name)
{
    if (name->type == REDIS_REPLY_STRING && !strcmp(name->str, q->keys.metrics))
        return RQ_RS_METRICS;
    return RQ_RS_RESULTS;
}

int rq_group_create(struct rq *q, const char *group)
{
    for (int s = 0; s < RQ_RS_N; s++) {
        redisReply *r =
            rq_conn_command(&q->cmd, "XGROUP CREATE %s %s 0 MKSTREAM", rq_rstream_key(q, s), group);
        if (!r)
            return rq_fail_conn(q, "collect");
        bool busy = r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "BUSYGROUP", 9);
        bool bad = !busy && rq_reply_error(r, "collect: XGROUP CREATE", q->err, sizeof q->err);
        freeReplyObject(r);
        if (bad)
            return -1;
    }
    return 0;
}

int rq_group_claim(struct rq *q, const char *group, const char *consumer, int64_t min_idle_ms, int count,
                   struct rq_entries *out)
{
    int total = 0;
    for (int s = 0; s < RQ_RS_N && total < count; s++) {
        char cursor[48] = "0-0";
        do {
            redisReply *r =
                rq_conn_command(&q->cmd, "XAUTOCLAIM %s %s %s %" PRId64 " %s COUNT %d", rq_rstream_key(q, s),
                                group, consumer, min_idle_ms, cursor, count - total);
            if (!r)
                return rq_fail_conn(q, "collect: XAUTOCLAIM");
            if (rq_reply_error(r, "collect: XAUTOCLAIM", q->err, sizeof q->err)) {
                freeReplyObject(r);
                return -1;
            }
            if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
                r->element[0]->type != REDIS_REPLY_STRING) {
                freeReplyObject(r);
                return rq_fail(q, "collect: XAUTOCLAIM: unexpected reply");
            }
            snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
            int n = take_entries(out, s, r->element[1]);
            if (n < 0 || keep(out, r))
                return rq_fail(q, "collect: out of memory");
            total += n;
        } while (strcmp(cursor, "0-0") && total < count);
    }
    return total;
}

int rq_group_read(struct rq *q, const char *group, const char *consumer, int count, int block_ms, bool own,
                  struct rq_entries *out)
{
    if (block_ms > q->o.block_timeout_ms)
        block_ms = q->o.block_timeout_ms;
    if (own)
        block_ms = 0;
    const char *from = own ? "0" : ">";
    redisReply *r;
    if (block_ms > 0)
        r = rq_conn_command(&q->blk, "XREADGROUP GROUP %s %s COUNT %d BLOCK %d STREAMS %s %s %s %s", group,
                            consumer, count, block_ms, q->keys.results, q->keys.metrics, from, from);
    else
        r = rq_conn_command(&q->cmd, "XREADGROUP GROUP %s %s COUNT %d STREAMS %s %s %s %s", group, consumer,
                            count, q->keys.results, q->keys.metrics, from, from);
    if (!r)
        return rq_fail(q, "collect: XREADGROUP: %s", (block_ms > 0 ? &q->blk : &q->cmd)->err);
    if (rq_reply_error(r, "collect: XREADGROUP", q->err, sizeof q->err)) {
        freeReplyObject(r);
        return -1;
    }
    int total = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *st = r->element[i];
        if (st->type != REDIS_REPLY_ARRAY || st->elements != 2)
            continue;
        int n = take_entries(out, stream_of(q, st->element[0]), st->element[1]);
        if (n < 0) {
            freeReplyObject(r);
            return rq_fail(q, "collect: out of memory");
        }
        total += n;
    }
    if (keep(out, r))
        return rq_fail(q, "collect: out of memory");
    return total;
}

int rq_group_ack(struct rq *q, const char *group, const struct rq_entries *es)
{
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    for (int s = 0; s < RQ_RS_N; s++) {
        bool any = false;
        for (int i = 0; i < es->n; i++) {
            if (es->e[i].stream != s)
                continue;
            if (!any) {
                rq_pipe_cmd(p, "XACK");
                rq_pipe_str(p, rq_rstream_key(q, s));
                rq_pipe_str(p, group);
                any = true;
            }
            rq_pipe_str(p, es->e[i].eid);
        }
    }
    if (p->ncmd == 0)
        return 0;
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "collect: XACK");
    for (int i = 0; i < p->nreply; i++)
        if (rq_reply_error(p->reply[i], "collect: XACK", q->err, sizeof q->err))
            return -1;
    return 0;
}

/* An entry id as its two numbers; false when it is not one. */
static bool parse_id(const char *s, uint64_t *ms, uint64_t *seq)
{
    return sscanf(s, "%" SCNu64 "-%" SCNu64, ms, seq) == 2;
}

/* id < other (both parsed). */
static bool id_less(uint64_t ams, uint64_t aseq, uint64_t bms, uint64_t bseq)
{
    return ams < bms || (ams == bms && aseq < bseq);
}

/* The value of field `name` in a flat [name, value, ...] reply, or NULL. */
static const redisReply *field(const redisReply *m, const char *name)
{
    for (size_t k = 0; m->type == REDIS_REPLY_ARRAY && k + 1 < m->elements; k += 2)
        if (m->element[k]->type == REDIS_REPLY_STRING && !strcmp(m->element[k]->str, name))
            return m->element[k + 1];
    return NULL;
}

/* The first id every group of stream s still needs (MINID for XTRIM) into *ms and *seq; 0 when
 * there is one, 1 when the stream has no group (nothing to trim), -1 (rq_error). */
static int floor_of(struct rq *q, int s, uint64_t *ms, uint64_t *seq)
{
    const char *key = rq_rstream_key(q, s);
    redisReply *r = rq_conn_command(&q->cmd, "XINFO GROUPS %s", key);
    if (!r)
        return rq_fail_conn(q, "collect: XINFO GROUPS");
    if (r->type == REDIS_REPLY_ERROR) { /* no such key */
        freeReplyObject(r);
        return 1;
    }
    int rc = 1;
    for (size_t g = 0; r->type == REDIS_REPLY_ARRAY && g < r->elements; g++) {
        const redisReply *m = r->element[g], *name = field(m, "name"), *pend = field(m, "pending"),
                         *last = field(m, "last-delivered-id");
        if (!name || name->type != REDIS_REPLY_STRING || !last || last->type != REDIS_REPLY_STRING) {
            rc = rq_fail(q, "collect: XINFO GROUPS %s: unexpected reply", key);
            break;
        }
        uint64_t gms, gseq;
        if (!parse_id(last->str, &gms, &gseq)) {
            rc = rq_fail(q, "collect: XINFO GROUPS %s: bad id %s", key, last->str);
            break;
        }
        gseq++; /* everything through the last delivered entry, unless one is pending */
        if (gseq == 0)
            gms++;
        if (pend && pend->type == REDIS_REPLY_INTEGER && pend->integer > 0) {
            redisReply *x = rq_conn_command(&q->cmd, "XPENDING %s %s", key, name->str);
            if (!x) {
                freeReplyObject(r);
                return rq_fail_conn(q, "collect: XPENDING");
            }
            bool ok = x->type == REDIS_REPLY_ARRAY && x->elements >= 2 &&
                      x->element[1]->type == REDIS_REPLY_STRING && parse_id(x->element[1]->str, &gms, &gseq);
            freeReplyObject(x);
            if (!ok) { /* acknowledged meanwhile: the next trim takes it */
                rc = 0;
                *ms = *seq = 0;
                break;
            }
        }
        if (rc == 1 || id_less(gms, gseq, *ms, *seq)) {
            *ms = gms;
            *seq = gseq;
        }
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

int rq_streams_trim(struct rq *q, int64_t *trimmed)
{
    if (trimmed)
        *trimmed = 0;
    for (int s = 0; s < RQ_RS_N; s++) {
        uint64_t ms = 0, seq = 0;
        int rc = floor_of(q, s, &ms, &seq);
        if (rc < 0)
            return -1;
        if (rc == 1 || (ms == 0 && seq == 0))
            continue;
        redisReply *r =
            rq_conn_command(&q->cmd, "XTRIM %s MINID %" PRIu64 "-%" PRIu64, rq_rstream_key(q, s), ms, seq);
        if (!r)
            return rq_fail_conn(q, "collect: XTRIM");
        if (rq_reply_error(r, "collect: XTRIM", q->err, sizeof q->err)) {
            freeReplyObject(r);
            return -1;
        }
        if (trimmed && r->type == REDIS_REPLY_INTEGER)
            *trimmed += r->integer;
        freeReplyObject(r);
    }
    return 0;
}

int rq_rstream_info(struct rq *q, int s, int64_t *len, int64_t *dropped, struct rq_group_info *g, int max,
                    int *ng)
{
    const char *key = rq_rstream_key(q, s);
    *len = *dropped = 0;
    *ng = 0;
    struct rq_pipe *p = &q->pipe;
    rq_pipe_reset(p);
    rq_pipe_cmd(p, "XLEN");
    rq_pipe_str(p, key);
    rq_pipe_cmd(p, "HGET");
    rq_pipe_str(p, q->keys.dropped);
    rq_pipe_str(p, rq_rstream_name(s));
    rq_pipe_cmd(p, "XINFO");
    rq_pipe_str(p, "GROUPS");
    rq_pipe_str(p, key);
    if (rq_pipe_exec(p, &q->cmd, &q->scripts))
        return rq_fail_conn(q, "status: the result streams");
    if (p->reply[0]->type == REDIS_REPLY_INTEGER)
        *len = p->reply[0]->integer;
    if (p->reply[1]->type == REDIS_REPLY_STRING)
        *dropped = strtoll(p->reply[1]->str, NULL, 10);
    const redisReply *r = p->reply[2];
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        int k = (*ng)++;
        if (k >= max)
            continue;
        const redisReply *m = r->element[i], *v;
        memset(&g[k], 0, sizeof g[k]);
        g[k].lag = -1;
        if ((v = field(m, "name")) && v->type == REDIS_REPLY_STRING)
            snprintf(g[k].name, sizeof g[k].name, "%s", v->str);
        if ((v = field(m, "consumers")) && v->type == REDIS_REPLY_INTEGER)
            g[k].consumers = v->integer;
        if ((v = field(m, "pending")) && v->type == REDIS_REPLY_INTEGER)
            g[k].pending = v->integer;
        if ((v = field(m, "lag")) && v->type == REDIS_REPLY_INTEGER)
            g[k].lag = v->integer;
        if ((v = field(m, "last-delivered-id")) && v->type == REDIS_REPLY_STRING)
            snprintf(g[k].last_id, sizeof g[k].last_id, "%s", v->str);
    }
    return 0;
}
