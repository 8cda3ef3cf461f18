/* `llmq status`: what is queued, retrying, dead and running, and who runs it. */
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queue/conn.h"
#include "queue/rq.h"
#include "queue/stats.h"
#include "worker/cli.h"
#include "worker/cli_redis.h"
#include "worker/config.h"

static const char CMD[] = "status";

#define MAX_JOBS_SHOWN 20 /* running jobs listed in the text form */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq status [-c FILE] [--redis URL] [--json] [--watch]\n"
            "\n"
            "Shows the queue depths (llmq:queue:short, llmq:queue:long), how many jobs wait for a retry,\n"
            "are dead-lettered or have a cancel request, the workers with their heartbeat and throughput,\n"
            "and the running jobs with their progress.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "      --json          one JSON object instead of the table (all running jobs)\n"
            "  -w, --watch         redraw every second until Ctrl-C (with --json: one object per second)\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0, 1 when Redis cannot be reached, 2 when the command line is wrong.\n");
}

static volatile sig_atomic_t g_stop;

static void on_sigint(int s)
{
    (void)s;
    g_stop = 1;
}

static void fmt_age(double now, double t, char *buf, size_t len)
{
    if (t <= 0) {
        snprintf(buf, len, "-");
        return;
    }
    double d = now - t;
    if (d < 0)
        d = 0;
    if (d < 120)
        snprintf(buf, len, "%.0fs", d);
    else if (d < 7200)
        snprintf(buf, len, "%.0fm", d / 60);
    else
        snprintf(buf, len, "%.1fh", d / 3600);
}

static void print_text(const struct rq_stats *s, const char *prefix)
{
    double now = rq_wall_s();
    printf("queues:");
    for (int i = 0; i < s->nqueues; i++)
        printf("  %s %lld", s->queues[i].name, (long long)s->queues[i].len);
    printf("   retry %lld   dead %lld   cancel requests %lld   running %lld   (prefix %s)\n",
           (long long)s->retry, (long long)s->dead, (long long)s->cancel, (long long)s->running, prefix);
    int alive = 0;
    for (int i = 0; i < s->nworkers; i++)
        alive += s->workers[i].alive;
    printf("\nworkers: %d live, %d lapsed\n", alive, s->nworkers - alive);
    if (s->nworkers)
        printf("  %-28s %-5s %-16s %-8s %-20s %9s %9s %7s %7s %9s\n", "ID", "STATE", "HOST", "PID", "MODEL",
               "JOBS_DONE", "TOK/S", "HOLDING", "UPTIME", "LAST_SEEN");
    for (int i = 0; i < s->nworkers; i++) {
        const struct rq_worker_stat *w = &s->workers[i];
        char up[32], seen[32];
        fmt_age(now, w->started_at, up, sizeof up);
        fmt_age(now, w->last_seen, seen, sizeof seen);
        printf("  %-28.28s %-5s %-16.16s %-8ld %-20.20s %9lld %9.1f %7lld %7s %9s\n", w->id,
               w->alive ? "live" : "lapsed", w->host[0] ? w->host : "-", w->pid, w->model[0] ? w->model : "-",
               (long long)w->jobs_done, w->tokens_per_s, (long long)w->holding, up, seen);
    }
    printf("\nrunning jobs: %d\n", s->njobs);
    if (s->njobs)
        printf("  %-38s %-28s %-6s %8s %7s %8s %8s\n", "ID", "WORKER", "QUEUE", "PROGRESS", "TOKENS",
               "ATTEMPTS", "ELAPSED");
    for (int i = 0; i < s->njobs && i < MAX_JOBS_SHOWN; i++) {
        const struct rq_running_job *j = &s->jobs[i];
        char prog[16], el[32];
        if (j->progress >= 0)
            snprintf(prog, sizeof prog, "%.0f%%", 100 * j->progress);
        else
            snprintf(prog, sizeof prog, "-");
        fmt_age(now, j->started_at, el, sizeof el);
        printf("  %-38.38s %-28.28s %-6s %8s %7lld %8d %8s\n", j->id, j->worker, j->queue[0] ? j->queue : "-",
               prog, (long long)j->completion_tokens, j->attempts, el);
    }
    if (s->njobs > MAX_JOBS_SHOWN)
        printf("  ... and %d more (--json lists them all)\n", s->njobs - MAX_JOBS_SHOWN);
}

static void print_json(const struct rq_stats *s, const char *prefix)
{
    json_t *o = json_object(), *qs = json_object(), *ws = json_array(), *js = json_array();
    for (int i = 0; i < s->nqueues; i++)
        json_object_set_new(qs, s->queues[i].name, json_integer(s->queues[i].len));
    for (int i = 0; i < s->nworkers; i++) {
        const struct rq_worker_stat *w = &s->workers[i];
        json_array_append_new(ws, json_pack("{s:s, s:b, s:i, s:s, s:I, s:s, s:s, s:f, s:f, s:I, s:f, s:I}",
                                            "id", w->id, "alive", w->alive, "ttl_s", w->ttl_s, "host",
                                            w->host, "pid", (json_int_t)w->pid, "gpu", w->gpu, "model",
                                            w->model, "started_at", w->started_at, "last_seen", w->last_seen,
                                            "jobs_done", (json_int_t)w->jobs_done, "tokens_per_s",
                                            w->tokens_per_s, "holding", (json_int_t)w->holding));
    }
    for (int i = 0; i < s->njobs; i++) {
        const struct rq_running_job *j = &s->jobs[i];
        json_t *x = json_pack("{s:s, s:s, s:s, s:I, s:i, s:f}", "id", j->id, "worker", j->worker, "queue",
                              j->queue, "completion_tokens", (json_int_t)j->completion_tokens, "attempts",
                              j->attempts, "started_at", j->started_at);
        json_object_set_new(x, "progress", j->progress >= 0 ? json_real(j->progress) : json_null());
        json_array_append_new(js, x);
    }
    json_object_set_new(o, "prefix", json_string(prefix));
    json_object_set_new(o, "queues", qs);
    json_object_set_new(o, "retry", json_integer(s->retry));
    json_object_set_new(o, "dead", json_integer(s->dead));
    json_object_set_new(o, "cancel", json_integer(s->cancel));
    json_object_set_new(o, "running", json_integer(s->running));
    json_object_set_new(o, "workers", ws);
    json_object_set_new(o, "jobs", js);
    char *txt = json_dumps(o, JSON_COMPACT);
    if (txt)
        printf("%s\n", txt);
    free(txt);
    json_decref(o);
}

enum { O_JSON = CLI_REDIS_O_OWN };

/* status's own options. */
struct status_args {
    bool json;  /* --json */
    bool watch; /* -w/--watch */
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct status_args *sa = ctx;
    (void)arg;
    if (opt == O_JSON)
        sa->json = true;
    else if (opt == 'w')
        sa->watch = true;
}

int cmd_status(int argc, char **argv)
{
    static const struct option own[] = {
        {"json", no_argument, NULL, O_JSON},
        {"watch", no_argument, NULL, 'w'},
        {NULL, 0, NULL, 0},
    };
    struct status_args st = {0};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "w", .longopts = own, .on_opt = on_opt, .ctx = &st};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    bool json = st.json, watch = st.watch;
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    if (watch) {
        g_stop = 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    bool tty = isatty(STDOUT_FILENO);
    static const char *const queues[] = {"short", "long"};
    do {
        struct rq_stats s;
        if (rq_stats(q, queues, 2, true, &s)) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rq_stats_free(&s);
            if (!watch) {
                rc = 1;
                break;
            }
        } else {
            if (watch && tty && !json)
                printf("\033[H\033[2J");
            if (json)
                print_json(&s, c.redis.prefix);
            else
                print_text(&s, c.redis.prefix);
            if (watch && !json)
                printf("\n(every second; Ctrl-C to stop)\n");
            fflush(stdout);
            rq_stats_free(&s);
        }
        for (int i = 0; watch && i < 10 && !g_stop; i++) {
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
        }
    } while (watch && !g_stop);
    rq_free(q);
    cfg_free(&c);
    return rc;
}
