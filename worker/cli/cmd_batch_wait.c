/* `llmq batch wait ID`: blocks until a batch has finished, without polling. It subscribes to
 * <p>:batch-done first and reads the batch's hash after, so a completion between the two is
 * still seen (in the hash); then it waits for the batch's id on the channel. A read of the hash
 * every SAFETY_MS covers a message lost with the connection (a Redis restart). */
#include <errno.h>
#include <getopt.h> /* optind, struct option */
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue/batch_admin.h"
#include "queue/conn.h"
#include "queue/rq.h"
#include "worker/cli/batch_show.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/config/config.h"

static const char CMD[] = "batch wait";

enum {
    SAFETY_MS = 5000, /* the hash is read at least this often */
    SLICE_MS = 1000,  /* longest single wait, so Ctrl-C and --timeout are seen promptly */
    EXIT_FAILED = 1,  /* completed, some jobs failed or were cancelled */
    EXIT_REDIS = 3,   /* Redis has no such batch, or fails while waiting */
    EXIT_CANCELLED = 4,
    EXIT_TIMEOUT = 124,
    EXIT_INTERRUPTED = 130,
};

static void usage(FILE *f)
{
    fprintf(f, "Usage: llmq batch wait [-c FILE] [--redis URL] [--timeout S] ID\n"
               "\n"
               "Blocks until batch ID has finished (every job has a final status and its row in SQLite),\n"
               "then prints its counts. It listens on llmq:batch-done (SUBSCRIBE first, then one look at\n"
               "the batch's hash, so nothing is missed) and reads the hash again every 5 s in case a\n"
               "message was lost (Redis restarted); it does not poll. A batch that has finished already\n"
               "returns at once.\n"
               "\n"
               "Options:\n"
               "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
               "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
               "  -t, --timeout S     give up after S seconds (fractions allowed; default 0: no limit)\n"
               "  -h, --help          this text\n"
               "\n"
               "Exit status:\n"
               "    0  completed, every job completed\n"
               "    1  completed, and some jobs failed (or were cancelled one by one)\n"
               "    4  the batch was cancelled (llmq batch cancel); every job has ended\n"
               "  124  --timeout passed first (the counts so far are printed)\n"
               "  130  interrupted (Ctrl-C, SIGTERM)\n"
               "   69  Redis cannot be reached at the start\n"
               "    3  Redis has no such batch, or fails while waiting\n"
               "    2  the command line is wrong\n");
}

static void on_opt(int opt, const char *arg, void *ctx)
{
    if (opt == 't')
        *(const char **)ctx = arg;
}

/* SUBSCRIBE <channel> on sub and read its confirmation. 0, or -1 (sub->err). */
static int subscribe(struct rq_conn *sub, const char *channel)
{
    const char *argv[] = {"SUBSCRIBE", channel};
    redisReply *r = NULL;
    if (rq_conn_ready(sub) || rq_conn_append_argv(sub, 2, argv, NULL) || rq_conn_read(sub, &r))
        return -1;
    bool ok = r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[0]->type == REDIS_REPLY_STRING &&
              !strcmp(r->element[0]->str, "subscribe");
    freeReplyObject(r);
    if (!ok) {
        rq_conn_drop(sub, "unexpected reply to SUBSCRIBE");
        return -1;
    }
    return 0;
}

/* Takes the messages hiredis has read already; whether one carried batch id. -1 on a protocol
 * error (the connection is dropped). */
static int take_messages(struct rq_conn *sub, const char *id)
{
    int hit = 0;
    for (;;) {
        void *v = NULL;
        if (redisGetReplyFromReader(sub->ctx, &v) != REDIS_OK) {
            rq_conn_drop(sub, "protocol error on the subscription");
            return -1;
        }
        if (!v)
            return hit;
        redisReply *r = v;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[2]->type == REDIS_REPLY_STRING &&
            !strcmp(r->element[2]->str, id))
            hit = 1;
        freeReplyObject(r);
    }
}

/* Waits up to ms for a message about batch id on the subscription: 1 one came, 0 none, -1 the
 * subscription was lost. */
static int await_message(struct rq_conn *sub, const char *id, int ms)
{
    int hit = take_messages(sub, id);
    if (hit)
        return hit;
    struct pollfd pf = {.fd = sub->ctx->fd, .events = POLLIN};
    int n = poll(&pf, 1, ms);
    if (n < 0)
        return errno == EINTR ? 0 : -1;
    if (n == 0)
        return 0;
    if (redisBufferRead(sub->ctx) != REDIS_OK) {
        rq_conn_drop(sub, sub->ctx->errstr[0] ? sub->ctx->errstr : "connection closed");
        return -1;
    }
    return take_messages(sub, id);
}

static void print_final(const struct rq_batch_info *b, const char *how)
{
    printf("batch %s: %s; ", b->id, how);
    batch_show_counts(stdout, b);
    printf("\n");
    fflush(stdout);
}

int cmd_batch_wait(int argc, char **argv)
{
    static const struct option own[] = {
        {"timeout", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0},
    };
    const char *timeout_s = NULL;
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "t:", .longopts = own, .on_opt = on_opt, .ctx = &timeout_s};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (argc - optind != 1)
        return cli_usage_error(CMD, "give one batch id");
    const char *id = argv[optind];
    double timeout = 0;
    if (timeout_s) {
        char *end;
        errno = 0;
        timeout = strtod(timeout_s, &end);
        if (end == timeout_s || *end || errno || !(timeout >= 0) || !isfinite(timeout))
            return cli_usage_error(CMD, "--timeout: expected seconds >= 0, got '%s'", timeout_s);
    }
    cli_catch_interrupts();
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc) {
        cfg_free(&c);
        return rc == CLI_EXIT_UNREACHABLE || rc == 2 ? rc : EXIT_REDIS;
    }
    int64_t start = rq_mono_ms();
    int64_t deadline = timeout > 0 ? start + (int64_t)(timeout * 1000) : INT64_MAX;
    struct rq_conn sub;
    rq_conn_init(&sub, &q->cmd.addr, "subscribe", q->o.connect_timeout_ms, 0, q->o.reconnect_max_ms);
    sub.quiet = true;
    sub.sentinel = q->cmd.sentinel;
    bool subscribed = subscribe(&sub, q->keys.batch_done) == 0;
    bool first = true, warned = false;
    int64_t next_check = 0; /* read the hash now */
    struct rq_batch_info b;
    memset(&b, 0, sizeof b);
    snprintf(b.id, sizeof b.id, "%s", id);
    for (;;) {
        int64_t now = rq_mono_ms();
        if (now >= next_check) {
            struct rq_batch_info cur;
            int found = rq_batch_get(q, id, &cur);
            if (found < 0) {
                if (first) {
                    fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
                    rc = EXIT_REDIS;
                    break;
                }
                if (!warned)
                    fprintf(stderr, "llmq %s: %s (trying again)\n", CMD, rq_error(q));
                warned = true;
            } else if (found == 0) {
                fprintf(stderr, "llmq %s: no batch '%s' in Redis%s\n", CMD, id,
                        first ? "" : " any more (its hash expired)");
                rc = EXIT_REDIS;
                break;
            } else {
                b = cur;
                warned = false;
                if (b.finished_at > 0) {
                    bool cancelled = !strcmp(b.state, "cancelled");
                    print_final(&b, cancelled ? "cancelled" : "completed");
                    rc = cancelled ? EXIT_CANCELLED : (b.failed || b.cancelled) ? EXIT_FAILED : 0;
                    break;
                }
            }
            first = false;
            next_check = now + SAFETY_MS;
        }
        if (cli_interrupted()) {
            fprintf(stderr, "llmq %s: interrupted\n", CMD);
            rc = EXIT_INTERRUPTED;
            break;
        }
        if (now >= deadline) {
            fprintf(stderr, "llmq %s: --timeout %s s passed; the batch is %s\n", CMD, timeout_s, b.state);
            print_final(&b, "still open");
            rc = EXIT_TIMEOUT;
            break;
        }
        int64_t ms = next_check - now;
        if (ms > SLICE_MS)
            ms = SLICE_MS;
        if (deadline - now < ms)
            ms = deadline - now;
        if (!subscribed) {
            poll(NULL, 0, (int)ms);
            /* a new subscription may have missed a message: read the hash after it */
            if (subscribe(&sub, q->keys.batch_done) == 0) {
                subscribed = true;
                next_check = 0;
            }
            continue;
        }
        int got = await_message(&sub, id, (int)ms);
        if (got > 0)
            next_check = 0;
        else if (got < 0)
            subscribed = false;
    }
    rq_conn_close(&sub);
    rq_free(q);
    cfg_free(&c);
    return rc;
}
