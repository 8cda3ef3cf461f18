/* See pipe.h. */
#include "queue/pipe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "queue/conn.h"

void rq_pipe_init(struct rq_pipe *p)
{
    memset(p, 0, sizeof *p);
}

static void free_replies(struct rq_pipe *p)
{
    for (int i = 0; i < p->nreply; i++)
        if (p->reply[i])
            freeReplyObject(p->reply[i]);
    free(p->reply);
    p->reply = NULL;
    p->nreply = 0;
}

void rq_pipe_reset(struct rq_pipe *p)
{
    free_replies(p);
    for (int i = 0; i < p->nown; i++)
        free(p->own[i]);
    p->nown = 0;
    p->ncmd = 0;
    p->narg = 0;
    p->oom = false;
}

void rq_pipe_free(struct rq_pipe *p)
{
    if (!p)
        return;
    rq_pipe_reset(p);
    free(p->cmd);
    free(p->argv);
    free(p->argl);
    free(p->own);
    memset(p, 0, sizeof *p);
}

void rq_pipe_arg(struct rq_pipe *p, const char *s, size_t n)
{
    if (p->oom || p->ncmd == 0)
        return;
    if ((size_t)p->narg + 1 > p->caparg) { /* argv and argl share one capacity */
        size_t cap = array_grown_cap(p->caparg, (size_t)p->narg + 1, 256);
        if (array_resize(&p->argv, cap, sizeof *p->argv) || array_resize(&p->argl, cap, sizeof *p->argl)) {
            p->oom = true;
            return;
        }
        p->caparg = cap;
    }
    p->argv[p->narg] = s;
    p->argl[p->narg] = n;
    p->narg++;
    p->cmd[p->ncmd - 1].argc++;
}

void rq_pipe_str(struct rq_pipe *p, const char *s)
{
    rq_pipe_arg(p, s, strlen(s));
}

void rq_pipe_cmd(struct rq_pipe *p, const char *name)
{
    if (p->oom)
        return;
    if (array_reserve(&p->cmd, &p->capcmd, (size_t)p->ncmd + 1, sizeof *p->cmd, 64)) {
        p->oom = true;
        return;
    }
    p->cmd[p->ncmd++] = (struct rq_pipe_cmd){.first = p->narg, .argc = 0, .script = -1};
    rq_pipe_str(p, name);
}

void rq_pipe_script(struct rq_pipe *p, enum rq_script s, int numkeys)
{
    rq_pipe_cmd(p, "EVALSHA");
    if (p->oom)
        return;
    p->cmd[p->ncmd - 1].script = (int)s;
    rq_pipe_arg(p, "", 0); /* the SHA, filled in by rq_pipe_exec */
    rq_pipe_int(p, numkeys);
}

void rq_pipe_fmt(struct rq_pipe *p, const char *fmt, ...)
{
    if (p->oom)
        return;
    if (array_reserve(&p->own, &p->capown, (size_t)p->nown + 1, sizeof *p->own, 64)) {
        p->oom = true;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        p->oom = true;
        return;
    }
    p->own[p->nown++] = s;
    rq_pipe_arg(p, s, (size_t)n);
}

void rq_pipe_int(struct rq_pipe *p, long long v)
{
    rq_pipe_fmt(p, "%lld", v);
}

static int send_cmd(struct rq_pipe *p, int i, struct rq_conn *c, struct rq_scripts *sc)
{
    struct rq_pipe_cmd *k = &p->cmd[i];
    if (k->script >= 0) {
        p->argv[k->first + 1] = sc->sha[k->script];
        p->argl[k->first + 1] = 40;
    }
    return rq_conn_append_argv(c, k->argc, p->argv + k->first, p->argl + k->first);
}

static bool is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 && !memcmp(r->str, "NOSCRIPT", 8);
}

int rq_pipe_exec(struct rq_pipe *p, struct rq_conn *c, struct rq_scripts *sc)
{
    free_replies(p);
    if (p->oom) {
        snprintf(c->err, sizeof c->err, "out of memory building a Redis pipeline");
        return -1;
    }
    if (p->ncmd <= 0)
        return 0;
    if (rq_conn_ready(c))
        return -1;
    rq_conn_discard(c);
    bool scripts = false;
    for (int i = 0; i < p->ncmd && !scripts; i++)
        scripts = p->cmd[i].script >= 0;
    if (scripts && rq_scripts_load(sc, c, 0))
        return -1;
    p->reply = calloc((unsigned)p->ncmd, sizeof *p->reply);
    if (!p->reply) {
        snprintf(c->err, sizeof c->err, "out of memory");
        return -1;
    }
    p->nreply = p->ncmd;
    for (int i = 0; i < p->ncmd; i++)
        if (send_cmd(p, i, c, sc))
            goto fail;
    int noscript = 0;
    for (int i = 0; i < p->ncmd; i++) {
        if (rq_conn_read(c, &p->reply[i]))
            goto fail;
        noscript += is_noscript(p->reply[i]);
    }
    if (noscript) { /* scripts flushed on the server: load again, repeat those calls */
        if (rq_scripts_load(sc, c, 1))
            goto fail;
        for (int i = 0; i < p->ncmd; i++)
            if (is_noscript(p->reply[i]) && send_cmd(p, i, c, sc))
                goto fail;
        for (int i = 0; i < p->ncmd; i++)
            if (is_noscript(p->reply[i])) {
                freeReplyObject(p->reply[i]);
                p->reply[i] = NULL;
                if (rq_conn_read(c, &p->reply[i]))
                    goto fail;
            }
    }
    return 0;
fail:
    free_replies(p);
    return -1;
}

bool rq_reply_error(const redisReply *r, const char *what, char *err, size_t errlen)
{
    if (!r) {
        snprintf(err, errlen, "%s: no reply", what);
        return true;
    }
    if (r->type != REDIS_REPLY_ERROR)
        return false;
    size_t len = r->len > 400 ? 400 : r->len;
    if (strncmp(r->str, "BADKEY ", 7) == 0) { /* a script's own error: without Redis's " script: <sha>..." */
        const char *tail = strstr(r->str, " script: ");
        if (tail && (size_t)(tail - r->str) < len)
            len = (size_t)(tail - r->str);
    }
    /* "OOM command not allowed ...", also inside a script's error (older servers) */
    bool oom = r->str && memmem(r->str, r->len, "OOM command not allowed", 23) != NULL;
    snprintf(err, errlen, "%s: %.*s%s", what, (int)len, r->str,
             oom ? " (Redis is out of memory: maxmemory is reached and it refuses writes)" : "");
    return true;
}

int64_t rq_reply_int(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
}
