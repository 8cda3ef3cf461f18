/* A real redis-server for integration tests (header-only; each test program is its own process).
 *
 *     struct redis_server srv;
 *     redis_server_require();                        // exit 77 with a reason if redis-server is missing
 *     const char *extra[] = {"--requirepass", "s3cret", NULL};
 *     if (redis_server_start(&srv, extra)) ... srv.log says why ...
 *     ... connect to srv.url (redis://127.0.0.1:<port>) or srv.sock (unix socket) ...
 *     redis_server_restart(&srv);                    // same port, dir and options
 *     redis_server_kill(&srv);                       // SIGKILL: a crash, no shutdown work
 *     redis_server_cleanup(&srv);                    // kill if running, remove the temp dir
 *
 * The server listens on a free loopback port and a unix socket in a fresh temp dir, with
 * `--save "" --appendonly no` unless the extra options say otherwise (they come last and win),
 * and dies with the test process (PR_SET_PDEATHSIG). redis_server_start waits until PING is
 * answered (any answer but -LOADING, which a server gives while it reads its AOF: NOAUTH counts). */
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define REDIS_SERVER_MAX_EXTRA 24

struct redis_server {
    pid_t pid;      /* 0 when not running */
    int port;       /* TCP port on 127.0.0.1 */
    char dir[128];  /* temp dir: the working dir of the server (AOF), its log and socket */
    char sock[192]; /* unix socket path */
    char url[64];   /* redis://127.0.0.1:<port> */
    char log[192];  /* the server's log file */
    const char *extra[REDIS_SERVER_MAX_EXTRA + 1]; /* extra options, kept for restarts (borrowed) */
    char password[128];                            /* from --requirepass in extra, for redis_server_connect */
};

/* Whether `prog` is an executable in $PATH. */
static inline bool redis_server_in_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    char buf[1024];
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, path, prog);
        if (access(buf, X_OK) == 0)
            return true;
        path += n + (path[n] == ':');
    }
    return false;
}

/* Skips the test (exit 77) when redis-server or redis-cli is not installed. */
static inline void redis_server_require(void)
{
    if (!redis_server_in_path("redis-server"))
        test_skip("redis-server is not installed (apt-get install redis-server); the Redis integration tests "
                  "need it");
    if (!redis_server_in_path("redis-cli"))
        test_skip("redis-cli is not installed (apt-get install redis-tools)");
}

static inline int redis_server_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static inline void redis_server_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A plain hiredis connection to the server (AUTHed when it has a password), for assertions.
 * NULL on failure. The caller frees it with redisFree. */
static inline redisContext *redis_server_connect(const struct redis_server *s)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    if (s->password[0]) {
        redisReply *r = redisCommand(c, "AUTH %s", s->password);
        if (r)
            freeReplyObject(r);
    }
    return c;
}

/* Forks and execs the server on s->port; waits up to 10 s for PING. 0, or -1 (the child
 * exited, e.g. the port was taken, or it never answered). */
static inline int redis_server_spawn(struct redis_server *s)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    const char *argv[REDIS_SERVER_MAX_EXTRA + 32];
    int n = 0;
    argv[n++] = "redis-server";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--dir";
    argv[n++] = s->dir;
    argv[n++] = "--unixsocket";
    argv[n++] = s->sock;
    argv[n++] = "--unixsocketperm";
    argv[n++] = "700";
    argv[n++] = "--logfile";
    argv[n++] = s->log;
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    for (int i = 0; s->extra[i]; i++)
        argv[n++] = s->extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
        }
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            return -1;
        }
        redisContext *c = redis_server_connect(s);
        if (c) {
            redisReply *r = redisCommand(c, "PING");
            /* a server still loading its AOF or RDB answers -LOADING: not ready yet */
            bool ok = r != NULL && !(r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "LOADING", 7));
            if (r)
                freeReplyObject(r);
            redisFree(c);
            if (ok)
                return 0;
        }
        redis_server_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    s->pid = 0;
    return -1;
}

/* Starts a fresh server with extra options (NULL-terminated, borrowed for the life of s). */
static inline int redis_server_start(struct redis_server *s, const char *const *extra)
{
    memset(s, 0, sizeof *s);
    int ne = 0;
    for (; extra && extra[ne] && ne < REDIS_SERVER_MAX_EXTRA; ne++) {
        s->extra[ne] = extra[ne];
        if (!strcmp(extra[ne], "--requirepass") && extra[ne + 1])
            snprintf(s->password, sizeof s->password, "%s", extra[ne + 1]);
    }
    s->extra[ne] = NULL;
    /* /tmp, not $TMPDIR (scratch_dir_make): the socket path must fit sun_path's 108 bytes */
    snprintf(s->dir, sizeof s->dir, "/tmp/llmq-redis-XXXXXX");
    if (!mkdtemp(s->dir))
        return -1;
    snprintf(s->sock, sizeof s->sock, "%s/redis.sock", s->dir);
    snprintf(s->log, sizeof s->log, "%s/redis.log", s->dir);
    for (int tries = 0; tries < 5; tries++) { /* another process may grab the port first */
        s->port = redis_server_free_port();
        if (s->port <= 0)
            continue;
        snprintf(s->url, sizeof s->url, "redis://127.0.0.1:%d", s->port);
        if (redis_server_spawn(s) == 0)
            return 0;
    }
    return -1;
}

/* Stops the server (SIGTERM: a clean shutdown, which with AOF on flushes it) and waits. */
static inline void redis_server_stop(struct redis_server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return;
        }
        redis_server_sleep_ms(10);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* SIGKILL: the server dies as in a crash or an OOM kill. */
static inline void redis_server_kill(struct redis_server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* Starts the server again on the same port, dir and options (after stop or kill). */
static inline int redis_server_again(struct redis_server *s)
{
    for (int i = 0; i < 50; i++) { /* the port can take a moment to be free again */
        if (redis_server_spawn(s) == 0)
            return 0;
        redis_server_sleep_ms(100);
    }
    return -1;
}

/* Stops (cleanly) and starts the server again. */
static inline int redis_server_restart(struct redis_server *s)
{
    redis_server_stop(s);
    return redis_server_again(s);
}

/* Kills the server if it runs and removes its temp dir. */
static inline void redis_server_cleanup(struct redis_server *s)
{
    redis_server_kill(s);
    if (s->dir[0]) {
        if (test_remove_tree(s->dir))
            fprintf(stderr, "could not remove %s\n", s->dir);
        s->dir[0] = 0;
    }
}

/* Runs `redis-cli -p <port> [-a password] <args>` through the shell (args are shell text: quote
 * them), its stdout into out (may be NULL). Returns the exit status, or -1. */
static inline int redis_cli(const struct redis_server *s, char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int redis_cli(const struct redis_server *s, char *out, size_t outlen, const char *fmt, ...)
{
    char args[4096], cmd[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "redis-cli -p %d %s%s%s %s 2>&1", s->port,
             s->password[0] ? "--no-auth-warning -a '" : "", s->password, s->password[0] ? "'" : "", args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = 0;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        if (out && n + 1 < outlen) {
            size_t c = k < outlen - 1 - n ? k : outlen - 1 - n;
            memcpy(out + n, buf, c);
            n += c;
        }
    if (out && outlen)
        out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#ifdef cmocka_unit_test /* assertions on a plain connection, for cmocka tests */

/* A reply of redisvCommand, checked: fails the test when there is none (the connection failed)
 * and, with no_error, when it is an error reply. */
static inline redisReply *rs_checked(redisContext *c, redisReply *r, bool no_error)
{
    if (!r)
        fail_msg("redis (test connection): %s", c->errstr);
    if (no_error && r->type == REDIS_REPLY_ERROR)
        fail_msg("redis (test connection): %s", r->str);
    return r;
}

/* A command that must succeed (any reply but an error); fails the test otherwise. The caller
 * frees the reply. */
static inline redisReply *rs_cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    return rs_checked(c, r, true);
}

/* A command whose reply must be an integer. */
static inline long long rs_int(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    rs_checked(c, r, false);
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("expected an integer reply, got type %d (%s)", r->type, r->str ? r->str : "");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* A command whose reply is not needed (it must not be an error). */
static inline void rs_do(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    freeReplyObject(rs_checked(c, r, true));
}

/* A string reply as a string; "(nil)" for a nil or any other reply. It stays valid for the
 * next 31 calls (a ring of buffers owned here; do not free it). */
static inline const char *rs_str(redisContext *c, const char *fmt, ...)
{
    static char *ring[32];
    static unsigned next;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    rs_checked(c, r, false);
    char *s = r->type == REDIS_REPLY_STRING ? strndup(r->str, r->len) : strdup("(nil)");
    freeReplyObject(r);
    unsigned i = next++ % 32;
    free(ring[i]);
    ring[i] = s;
    return s;
}

/* The value of `field` in a stream entry's field list (a reply of XRANGE), or NULL. */
static inline const char *rs_stream_field(const redisReply *entry, const char *field)
{
    const redisReply *f = entry->element[1];
    for (size_t i = 0; i + 1 < f->elements; i += 2)
        if (!strcmp(f->element[i]->str, field))
            return f->element[i + 1]->str;
    return NULL;
}
#endif
