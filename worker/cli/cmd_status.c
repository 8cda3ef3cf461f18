/* `llmq status`: what is queued, retrying, dead and running, and who runs it; with --watch a live
 * view that redraws in place on a terminal (ANSI cursor home + clear to end, no curses) and
 * prints frame after frame when stdout is a pipe or file. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "engine/util/json_exact.h"
#include "queue/conn.h"
#include "queue/route.h"
#include "queue/rq.h"
#include "queue/stats.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/cli/status_collect.h"
#include "worker/cli/status_models.h"
#include "worker/config/config.h"

static const char CMD[] = "status";

#define MAX_JOBS_SHOWN 20 /* running jobs listed in the text form (a terminal: as many as fit) */
#define BAR_JOB 20        /* width of a job's progress bar */
#define BAR_KV 10         /* width of a worker's KV cache bar */
#define RATE_WINDOW 8     /* frames kept for the jobs/s estimate */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq status [-c FILE] [--redis URL] [--json] [--watch [--interval S]]\n"
            "\n"
            "Shows the queue depths (llmq:queue:short, llmq:queue:long), how many jobs wait for a retry,\n"
            "are dead-lettered or have a cancel request, the workers from their heartbeats (running and\n"
            "waiting sequences, KV cache usage, tokens/s), and the running jobs with their progress.\n"
            "Jobs that name a model wait in that model's queues (llmq:queue:<model>:short|long): each\n"
            "model with jobs is listed, flagged when no live worker serves it (model.name, model.aliases).\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): the redis section\n"
            "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
            "  -f, --format F      text (default: the table) or json: one JSON object (all running jobs)\n"
            "      --json          the same as --format json\n"
            "  -w, --watch         a live view, redrawn in place every interval until Ctrl-C; with\n"
            "                      --json, or when stdout is not a terminal, one frame after another\n"
            "      --interval S    seconds between refreshes (default 1; 0.1 to 3600; implies --watch)\n"
            "  -h, --help          this text\n"
            "\n"
            "Examples:\n"
            "  llmq status -c /etc/llmq/llmq.yaml           # one look\n"
            "  llmq status --watch                          # live view; Ctrl-C to leave\n"
            "  llmq status -w --interval 5 --json >> status.jsonl  # a JSON line every 5 s\n"
            "  llmq status --json | jq '.queues.short'      # the short queue's depth\n"
            "  llmq status --json | jq '.models'            # jobs waiting per model, and who serves it\n"
            "\n"
            "Exit status: 0 (also when --watch is stopped with Ctrl-C), 1 when Redis fails, 2 when the\n"
            "command line is wrong, 69 when Redis cannot be reached.\n");
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

/* "[#####-----]" for a fraction 0..1 (clamped) of `width` cells into buf. */
static void fmt_bar(double frac, int width, char *buf, size_t len)
{
    if (frac < 0)
        frac = 0;
    if (frac > 1)
        frac = 1;
    int full = (int)(frac * width + 0.5);
    size_t n = 0;
    if (len < (size_t)width + 3)
        width = (int)len - 3;
    buf[n++] = '[';
    for (int i = 0; i < width; i++)
        buf[n++] = i < full ? '#' : '-';
    buf[n++] = ']';
    buf[n] = 0;
}

/* A frame being written: lines end with "clear to end of line" on a live terminal, and the
 * number of lines is counted so the job list fits the screen. */
struct frame {
    FILE *f;
    bool live;
    int cols; /* a live terminal's width: longer lines are cut (a wrapped line would break the
                 redraw in place); 0 = no limit */
    int lines;
};

static void line(struct frame *fr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(struct frame *fr, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    if (fr->cols > 0 && n > fr->cols)
        n = fr->cols;
    fwrite(buf, 1, (size_t)n, fr->f);
    fputs(fr->live ? "\033[K\n" : "\n", fr->f);
    fr->lines++;
}

/* What the live view remembers between frames: jobs done by all workers over time. */
struct rate {
    double t[RATE_WINDOW];
    int64_t done[RATE_WINDOW];
    int n;
};

static void rate_add(struct rate *r, double t, int64_t done)
{
    if (r->n == RATE_WINDOW) {
        memmove(r->t, r->t + 1, (RATE_WINDOW - 1) * sizeof r->t[0]);
        memmove(r->done, r->done + 1, (RATE_WINDOW - 1) * sizeof r->done[0]);
        r->n--;
    }
    r->t[r->n] = t;
    r->done[r->n] = done;
    r->n++;
}

/* The text form. max_jobs < 0 = MAX_JOBS_SHOWN; rate may be NULL (one look). */
static void print_text(struct frame *fr, const struct rq_stats *s, const char *prefix, int max_jobs,
                       const struct rate *rate)
{
    double now = rq_wall_s();
    char buf[512];
    size_t n = 0;
    for (int i = 0; i < s->nqueues && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "  %s %lld", s->queues[i].name,
                              (long long)s->queues[i].len);
    line(fr, "queues:%s   retry %lld   dead %lld   cancel requests %lld   running %lld   (prefix %s)", buf,
         (long long)s->retry, (long long)s->dead, (long long)s->cancel, (long long)s->running, prefix);
    int alive = 0;
    double tps = 0;
    for (int i = 0; i < s->nworkers; i++)
        if (s->workers[i].alive) {
            alive++;
            tps += s->workers[i].tokens_per_s;
        }
    n = (size_t)snprintf(buf, sizeof buf, "throughput: %.1f generated tok/s (live workers' last interval)",
                         tps);
    if (rate && rate->n >= 2 && rate->t[rate->n - 1] > rate->t[0]) {
        double dt = rate->t[rate->n - 1] - rate->t[0];
        int64_t dj = rate->done[rate->n - 1] - rate->done[0];
        snprintf(buf + n, sizeof buf - n, ", %.2f jobs/s (last %.0f s)", dj > 0 ? (double)dj / dt : 0.0, dt);
    }
    line(fr, "%s", buf);
    line(fr, "%s", "");
    line(fr, "workers: %d live, %d lapsed", alive, s->nworkers - alive);
    if (s->nworkers)
        line(fr, "  %-24s %-6s %-14s %-8s %-18s %4s %4s %-17s %9s %9s %7s %7s %9s", "ID", "STATE", "HOST",
             "PID", "MODEL", "RUN", "WAIT", "KV CACHE", "JOBS_DONE", "TOK/S", "HOLDING", "UPTIME",
             "LAST_SEEN");
    for (int i = 0; i < s->nworkers; i++) {
        const struct rq_worker_stat *w = &s->workers[i];
        char up[32], seen[32], kv[48], bar[BAR_KV + 3];
        fmt_age(now, w->started_at, up, sizeof up);
        fmt_age(now, w->last_seen, seen, sizeof seen);
        if (w->kv_usage >= 0 && w->alive) {
            fmt_bar(w->kv_usage, BAR_KV, bar, sizeof bar);
            snprintf(kv, sizeof kv, "%s %3.0f%%", bar, 100 * w->kv_usage);
        } else {
            snprintf(kv, sizeof kv, "-");
        }
        line(fr, "  %-24.24s %-6s %-14.14s %-8ld %-18.18s %4d %4d %-17s %9lld %9.1f %7lld %7s %9s", w->id,
             w->alive ? "live" : "lapsed", w->host[0] ? w->host : "-", w->pid, w->model[0] ? w->model : "-",
             w->running, w->waiting, kv, (long long)w->jobs_done, w->tokens_per_s, (long long)w->holding, up,
             seen);
    }
    line(fr, "%s", "");
    line(fr, "running jobs: %d", s->njobs);
    if (s->njobs)
        line(fr, "  %-32s %-20s %-6s %-27s %7s %7s %4s %8s", "ID", "WORKER", "QUEUE", "PROGRESS", "TOKENS",
             "TOK/S", "TRY", "ELAPSED");
    if (max_jobs < 0)
        max_jobs = MAX_JOBS_SHOWN;
    int shown = s->njobs <= max_jobs ? s->njobs : max_jobs > 1 ? max_jobs - 1 : 1;
    for (int i = 0; i < s->njobs && i < shown; i++) {
        const struct rq_running_job *j = &s->jobs[i];
        char prog[64], bar[BAR_JOB + 3], el[32], rate_s[32];
        if (j->progress >= 0 && j->parts_total > 0) { /* a summary job: its parts */
            fmt_bar(j->progress, BAR_JOB, bar, sizeof bar);
            snprintf(prog, sizeof prog, "%s %d/%d L%d", bar, j->parts_done, j->parts_total, j->level);
        } else if (j->progress >= 0) {
            fmt_bar(j->progress, BAR_JOB, bar, sizeof bar);
            snprintf(prog, sizeof prog, "%s %3.0f%%", bar, 100 * j->progress);
        } else {
            snprintf(prog, sizeof prog, "-");
        }
        double gen_s = j->updated_at - j->first_token_at;
        if (j->first_token_at > 0 && gen_s > 0 && j->completion_tokens > 1)
            snprintf(rate_s, sizeof rate_s, "%.1f", (double)(j->completion_tokens - 1) / gen_s);
        else
            snprintf(rate_s, sizeof rate_s, "-");
        fmt_age(now, j->started_at, el, sizeof el);
        line(fr, "  %-32.32s %-20.20s %-6s %-27s %7lld %7s %4d %8s", j->id, j->worker,
             j->queue[0] ? j->queue : "-", prog, (long long)j->completion_tokens, rate_s, j->attempts, el);
    }
    if (s->njobs > shown)
        line(fr, "  ... and %d more (--json lists them all)", s->njobs - shown);
}

static void print_json(FILE *f, const struct rq_stats *s, const struct rq_model_queue *mq, int nmq,
                       const struct status_collect *sc, const char *prefix)
{
    json_t *o = json_object(), *qs = json_object(), *ws = json_array(), *js = json_array();
    for (int i = 0; i < s->nqueues; i++)
        json_object_set_new(qs, s->queues[i].name, json_integer(s->queues[i].len));
    for (int i = 0; i < s->nworkers; i++) {
        const struct rq_worker_stat *w = &s->workers[i];
        json_t *x =
            json_pack("{s:s, s:b, s:i, s:s, s:I, s:s, s:s, s:f, s:f, s:I, s:f, s:I, s:i, s:i}", "id", w->id,
                      "alive", w->alive, "ttl_s", w->ttl_s, "host", w->host, "pid", (json_int_t)w->pid, "gpu",
                      w->gpu, "model", w->model, "started_at", w->started_at, "last_seen", w->last_seen,
                      "jobs_done", (json_int_t)w->jobs_done, "tokens_per_s", w->tokens_per_s, "holding",
                      (json_int_t)w->holding, "running", w->running, "waiting", w->waiting);
        json_object_set_new(x, "kv_usage", w->kv_usage >= 0 ? json_real(w->kv_usage) : json_null());
        json_array_append_new(ws, x);
    }
    for (int i = 0; i < s->njobs; i++) {
        const struct rq_running_job *j = &s->jobs[i];
        json_t *x =
            json_pack("{s:s, s:s, s:s, s:I, s:I, s:i, s:f}", "id", j->id, "worker", j->worker, "queue",
                      j->queue, "prompt_tokens", (json_int_t)j->prompt_tokens, "completion_tokens",
                      (json_int_t)j->completion_tokens, "attempts", j->attempts, "started_at", j->started_at);
        json_object_set_new(x, "progress", j->progress >= 0 ? json_real(j->progress) : json_null());
        if (j->parts_total > 0) {
            json_object_set_new(x, "parts_done", json_integer(j->parts_done));
            json_object_set_new(x, "parts_total", json_integer(j->parts_total));
            json_object_set_new(x, "level", json_integer(j->level));
        }
        json_array_append_new(js, x);
    }
    json_object_set_new(o, "time", json_real(rq_wall_s()));
    json_object_set_new(o, "prefix", json_string(prefix));
    json_object_set_new(o, "queues", qs);
    json_object_set_new(o, "models", status_models_json(mq, nmq));
    json_object_set_new(o, "retry", json_integer(s->retry));
    json_object_set_new(o, "dead", json_integer(s->dead));
    json_object_set_new(o, "cancel", json_integer(s->cancel));
    json_object_set_new(o, "running", json_integer(s->running));
    json_object_set_new(o, "workers", ws);
    json_object_set_new(o, "jobs", js);
    json_object_set_new(o, "collect", status_collect_json(sc));
    char *txt = json_dumps_exact(o, JSON_COMPACT);
    if (txt)
        fprintf(f, "%s\n", txt);
    free(txt);
    json_decref(o);
}

enum { O_JSON = CLI_REDIS_O_OWN, O_INTERVAL };

/* status's own options. */
struct status_args {
    bool json;          /* --json or --format json */
    bool watch;         /* -w/--watch */
    const char *ivl;    /* --interval, or NULL */
    const char *format; /* -f/--format, or NULL */
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct status_args *sa = ctx;
    if (opt == O_JSON)
        sa->json = true;
    else if (opt == 'w')
        sa->watch = true;
    else if (opt == O_INTERVAL)
        sa->ivl = arg;
    else if (opt == 'f')
        sa->format = arg;
}

/* The terminal's rows and columns, 0 when unknown. */
static void term_size(int *rows, int *cols)
{
    struct winsize ws;
    *rows = *cols = 0;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

/* Sleeps up to `secs`, in short steps, returning early on a signal. */
static void pause_for(double secs)
{
    double end = rq_wall_s() + secs;
    while (!cli_interrupted()) {
        double left = end - rq_wall_s();
        if (left <= 0)
            break;
        if (left > 0.1)
            left = 0.1;
        struct timespec ts = {0, (long)(left * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* The --watch loop: frame after frame until SIGINT/SIGTERM. Returns the exit status (0). */
static int watch_loop(struct rq *q, const struct cfg *c, bool json, double interval)
{
    static const char *const queues[] = {"short", "long"};
    bool live = !json && isatty(STDOUT_FILENO);
    char where[300];
    rq_conn_describe(&q->cmd, where, sizeof where);
    struct rate rate = {0};
    if (live)
        fputs("\033[?25l\033[2J", stdout); /* hide the cursor, clear the screen once */
    while (!cli_interrupted()) {
        struct rq_stats s;
        struct rq_model_queue *mq = NULL;
        int nmq = 0;
        int rc = rq_stats(q, queues, 2, true, &s);
        if (rc == 0)
            rc = rq_model_queues(q, &mq, &nmq);
        struct status_collect sc;
        if (rc == 0)
            rc = status_collect_read(q, &sc);
        double now = rq_wall_s();
        char *buf = NULL;
        size_t len = 0;
        int rows = 0, cols = 0;
        if (live)
            term_size(&rows, &cols);
        struct frame fr = {.f = open_memstream(&buf, &len), .live = live, .cols = cols};
        if (!fr.f) {
            rq_stats_free(&s);
            free(mq);
            break;
        }
        if (json) {
            if (rc)
                fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            else
                print_json(fr.f, &s, mq, nmq, &sc, c->redis.prefix);
        } else {
            char clock[64];
            time_t tt = (time_t)now;
            struct tm tm;
            localtime_r(&tt, &tm);
            strftime(clock, sizeof clock, "%Y-%m-%d %H:%M:%S", &tm);
            if (live)
                fputs("\033[H", fr.f);
            line(&fr, "llmq status   redis %s   %s   every %gs%s", where, clock, interval,
                 live ? ", Ctrl-C to stop" : "");
            if (rc) {
                line(&fr, "redis: %s (trying again)", rq_error(q));
            } else {
                int64_t done = 0;
                for (int i = 0; i < s.nworkers; i++)
                    done += s.workers[i].jobs_done;
                rate_add(&rate, now, done);
                /* what fits below the queue and worker lines: 9 lines of headers and gaps */
                int max_jobs = rows ? rows - 9 - s.nworkers - 1 : -1;
                if (rows && max_jobs < 3)
                    max_jobs = 3;
                print_text(&fr, &s, c->redis.prefix, max_jobs, &rate);
                status_models_print(fr.f, mq, nmq);
                status_collect_print(fr.f, &sc);
            }
            if (live)
                fputs("\033[J", fr.f); /* clear what the last frame left below */
            else
                fputs("\n", fr.f);
        }
        fclose(fr.f);
        fwrite(buf, 1, len, stdout);
        fflush(stdout);
        free(buf);
        rq_stats_free(&s);
        free(mq);
        pause_for(interval);
    }
    if (live)
        fputs("\033[?25h\n", stdout); /* the cursor back, below the last frame */
    fflush(stdout);
    return 0;
}

int cmd_status(int argc, char **argv)
{
    static const struct option own[] = {
        {"json", no_argument, NULL, O_JSON},
        {"watch", no_argument, NULL, 'w'},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"format", required_argument, NULL, 'f'},
        {NULL, 0, NULL, 0},
    };
    struct status_args st = {0};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "wf:", .longopts = own, .on_opt = on_opt, .ctx = &st};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    if (st.format && !strcmp(st.format, "json"))
        st.json = true;
    else if (st.format && strcmp(st.format, "text"))
        return cli_usage_error(CMD, "--format: expected text or json, got '%s'", st.format);
    double interval = 1;
    if (st.ivl) {
        char *end;
        interval = strtod(st.ivl, &end);
        if (end == st.ivl || *end || !(interval >= 0.1 && interval <= 3600))
            return cli_usage_error(CMD, "--interval: expected seconds between 0.1 and 3600, got '%s'",
                                   st.ivl);
        st.watch = true;
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    struct cfg c;
    struct rq *q;
    int rc = cli_redis_connect(CMD, &a, &c, &q);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    if (st.watch) {
        cli_catch_interrupts();
        rc = watch_loop(q, &c, st.json, interval);
    } else {
        static const char *const queues[] = {"short", "long"};
        struct rq_stats s;
        struct rq_model_queue *mq = NULL;
        int nmq = 0;
        struct status_collect sc;
        if (rq_stats(q, queues, 2, true, &s) || rq_model_queues(q, &mq, &nmq) ||
            status_collect_read(q, &sc)) {
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(q));
            rc = 1;
        } else if (st.json) {
            print_json(stdout, &s, mq, nmq, &sc, c.redis.prefix);
        } else {
            struct frame fr = {.f = stdout};
            print_text(&fr, &s, c.redis.prefix, -1, NULL);
            status_models_print(stdout, mq, nmq);
            status_collect_print(stdout, &sc);
        }
        rq_stats_free(&s);
        free(mq);
    }
    rq_free(q);
    cfg_free(&c);
    return rc;
}
