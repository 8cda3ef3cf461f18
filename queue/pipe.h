/* A pipeline: commands collected first, then sent in one write and answered in one read
 * (one round trip however many commands). Arguments are binary safe; most are borrowed (they
 * must live until rq_pipe_exec returns), rq_pipe_fmt/rq_pipe_int copy.
 *
 *     rq_pipe_reset(p);
 *     rq_pipe_cmd(p, "HSET"); rq_pipe_str(p, key); rq_pipe_str(p, "progress"); rq_pipe_fmt(p, "%.4f", x);
 *     rq_pipe_cmd(p, "XADD"); ...
 *     if (rq_pipe_exec(p, conn, scripts)) -> conn->err
 *     ... p->reply[i] is the reply of command i (owned by p until the next reset/free) ...
 *
 * Scripts (rq_pipe_script) are called by EVALSHA after making sure they are loaded on this
 * connection; a NOSCRIPT reply makes rq_pipe_exec load them again and repeat just those calls. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "queue/scripts.h"

struct rq_conn;

struct rq_pipe_cmd {
    int first, argc; /* into argv */
    int script;      /* enum rq_script for EVALSHA, or -1 */
};

struct rq_pipe {
    struct rq_pipe_cmd *cmd;
    int ncmd;
    size_t capcmd;
    const char **argv;
    size_t *argl;
    int narg;
    size_t caparg; /* room of argv and of argl */
    char **own; /* copies made by rq_pipe_fmt */
    int nown;
    size_t capown;
    redisReply **reply; /* [ncmd] after a successful exec */
    int nreply;
    bool oom;
};

void rq_pipe_init(struct rq_pipe *p);
/* Forgets the commands, replies and copies; keeps the memory. */
void rq_pipe_reset(struct rq_pipe *p);
/* Frees everything. Accepts NULL. */
void rq_pipe_free(struct rq_pipe *p);

/* Starts a command named `name` (a static string). */
void rq_pipe_cmd(struct rq_pipe *p, const char *name);
/* Starts EVALSHA <sha of s> <numkeys>; keys and arguments follow with rq_pipe_arg/str. */
void rq_pipe_script(struct rq_pipe *p, enum rq_script s, int numkeys);
/* Appends an argument to the current command: borrowed bytes, a borrowed C string, a copy. */
void rq_pipe_arg(struct rq_pipe *p, const char *s, size_t n);
void rq_pipe_str(struct rq_pipe *p, const char *s);
void rq_pipe_fmt(struct rq_pipe *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rq_pipe_int(struct rq_pipe *p, long long v);

/* Sends every command, reads every reply (one round trip; a second only after NOSCRIPT).
 * 0 with p->reply[0..ncmd) set, or -1 with the reason in c->err (connection errors drop the
 * connection; out of memory while building is reported here too). */
int rq_pipe_exec(struct rq_pipe *p, struct rq_conn *c, struct rq_scripts *sc);

/* Whether reply r is a Redis error; if so writes "<what>: <message>" into err (a script's
 * "BADKEY ..." error without the script's name and line that Redis appends; an OOM refusal gets
 * a note that Redis reached maxmemory). */
bool rq_reply_error(const redisReply *r, const char *what, char *err, size_t errlen);
/* The integer of reply r; 0 when r is NULL or not an integer. */
int64_t rq_reply_int(const redisReply *r);
