/* `llmq enqueue`: validates a JSONL file of jobs and pushes the good ones onto a Redis queue. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/buf.h"
#include "queue/jobid.h"
#include "queue/push.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/cli/progress.h"
#include "worker/config/config.h"
#include "worker/jobs/job.h"

static const char CMD[] = "enqueue";

#define BATCH 1000        /* jobs per pipelined push */
#define MAX_REPORTED 20   /* bad lines described on stderr; the rest are counted */
#define BYTES_PER_TOKEN 4 /* --queue auto: a rough estimate of English text */

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq enqueue [-c FILE] [--redis URL] [--queue short|long|auto] [--print-ids] [IN.jsonl|-]\n"
        "       llmq enqueue [-c FILE] [--redis URL] [--queue Q] [--print-ids] --template NAME\n"
        "                    [--var NAME=TEXT | --var NAME=@FILE]... [--id ID] [--set FIELD=JSON]...\n"
        "\n"
        "Reads jobs, one JSON object per line (llmq's form or OpenAI Batch request lines; docs/JOBS.md),\n"
        "from IN or stdin, checks each the way a worker will (fields, types, bounds, templates of the\n"
        "config), gives llmq-form jobs without an \"id\" a new one (a UUIDv7, written into the job), and\n"
        "pushes the good ones onto the queue in pipelined batches, in file order (the first line is\n"
        "fetched first). Bad lines are reported with their line number and not pushed. Blank lines are\n"
        "skipped. Checks that need the model (prompt length against max_model_len) happen in the worker.\n"
        "\n"
        "Options:\n"
        "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): redis, prefix, limits, templates\n"
        "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
        "  -q, --queue Q       short (default), long, or auto: long when the prompt's estimated length\n"
        "                      (its bytes / 4) is over queues.long_threshold_tokens, else short. A worker\n"
        "                      moves short-queue jobs that turn out longer to the long queue anyway\n"
        "      --print-ids     print each pushed job's id on stdout, one per line (OpenAI lines: custom_id)\n"
        "  -h, --help          this text\n"
        "\n"
        "One templated job from options instead of a file (the config must define the template):\n"
        "  -t, --template NAME the job's \"template\"\n"
        "      --var K=TEXT    vars.K = TEXT; K=@FILE reads the file (UTF-8 text), K=@- reads stdin\n"
        "      --id ID         the job's \"id\" (default: a new UUIDv7)\n"
        "      --set F=JSON    any other job field, its value as JSON: --set max_tokens=128\n"
        "                      --set metadata='{\"file\": \"a.txt\"}' --set enable_thinking=false\n"
        "\n"
        "A progress bar is drawn on stderr when it is a terminal; a summary line is always printed.\n"
        "Exit status: 0 every line was pushed, 1 some lines were bad (the others were pushed) or Redis\n"
        "failed, 2 the command line is wrong.\n");
}

struct pending {
    const char *queue;
    struct rq_push_item *items;
    char **owned; /* the lines (copies) */
    int n;
};

struct enq {
    struct rq *q;
    bool print_ids;
    struct pending p[2]; /* short, long */
    long pushed[2], bad, reported;
    struct progress *bar;
    bool failed;
};

static void flush(struct enq *e, struct pending *p)
{
    if (p->n == 0 || e->failed)
        return;
    if (rq_push(e->q, p->queue, p->items, p->n)) {
        progress_clear(e->bar);
        fprintf(stderr, "llmq %s: pushing onto queue %s failed: %s\n", CMD, p->queue, rq_error(e->q));
        e->failed = true;
    } else {
        e->pushed[p == &e->p[1]] += p->n;
        if (e->print_ids)
            for (int i = 0; i < p->n; i++)
                printf("%s\n", p->items[i].id);
    }
    for (int i = 0; i < p->n; i++) {
        free(p->owned[i]);
        free((char *)p->items[i].id);
    }
    p->n = 0;
}

static size_t prompt_bytes(const struct job *j)
{
    if (j->prompt)
        return strlen(j->prompt);
    if (j->prompt_ids)
        return (size_t)j->n_prompt_ids * BYTES_PER_TOKEN;
    size_t n = 0;
    for (size_t i = 0; i < j->n_msgs; i++)
        n += j->msgs[i].content ? strlen(j->msgs[i].content) : 0;
    return n;
}

/* One line (lineno 0: the job built from --template): validate, give it an id, queue it for the
 * next push. */
static void take(struct enq *e, const struct job_opts *jo, const struct cfg *c, int mode, char *line,
                 size_t len, long lineno)
{
    char err[1024];
    struct job j;
    int rc = job_parse(line, len, jo, &j, err, sizeof err);
    if (rc) {
        e->bad++;
        if (e->reported++ < MAX_REPORTED) {
            progress_clear(e->bar);
            if (lineno)
                fprintf(stderr, "llmq %s: line %ld: %s (not pushed)\n", CMD, lineno, err);
            else
                fprintf(stderr, "llmq %s: the --template job: %s (not pushed)\n", CMD, err);
        }
        job_free(&j);
        return;
    }
    char *raw = NULL, *id = NULL;
    size_t rawlen = len;
    if (!j.id) { /* llmq form without an id: give it one inside the JSON, so every copy has it */
        char nid[RQ_ID_MAX + 1];
        rq_new_id(nid);
        id = strdup(nid);
        if (!id || rq_job_add_id(line, len, nid, &raw, &rawlen)) {
            free(id);
            e->bad++;
            fprintf(stderr, "llmq %s: line %ld: out of memory\n", CMD, lineno);
            job_free(&j);
            return;
        }
    } else {
        id = strdup(j.id);
        raw = malloc(len + 1);
        if (raw) {
            memcpy(raw, line, len);
            raw[len] = 0;
        }
    }
    int lane = mode;
    if (mode == 2)
        lane = prompt_bytes(&j) / BYTES_PER_TOKEN > (size_t)c->queues.long_threshold_tokens;
    job_free(&j);
    struct pending *p = &e->p[lane];
    if (!raw || !id) {
        free(raw);
        free(id);
        e->bad++;
        fprintf(stderr, "llmq %s: line %ld: out of memory\n", CMD, lineno);
        return;
    }
    p->owned[p->n] = raw;
    p->items[p->n] = (struct rq_push_item){.raw = raw, .len = rawlen, .id = id};
    p->n++;
    if (p->n == BATCH)
        flush(e, p);
}

enum { O_IDS = CLI_REDIS_O_OWN, O_VAR, O_ID, O_SET };

#define MAX_OPT_ITEMS 64 /* --var and --set each */

/* enqueue's own options (the strings are borrowed from argv). */
struct enq_args {
    const char *queue;               /* -q/--queue */
    bool print_ids;                  /* --print-ids */
    const char *template_name;       /* -t/--template */
    const char *id;                  /* --id */
    const char *vars[MAX_OPT_ITEMS]; /* --var K=V, in order */
    const char *sets[MAX_OPT_ITEMS]; /* --set F=JSON, in order */
    int n_vars, n_sets;
    bool too_many;
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct enq_args *ea = ctx;
    if (opt == 'q')
        ea->queue = arg;
    else if (opt == O_IDS)
        ea->print_ids = true;
    else if (opt == 't')
        ea->template_name = arg;
    else if (opt == O_ID)
        ea->id = arg;
    else if (opt == O_VAR || opt == O_SET) {
        const char **list = opt == O_VAR ? ea->vars : ea->sets;
        int *n = opt == O_VAR ? &ea->n_vars : &ea->n_sets;
        if (*n < MAX_OPT_ITEMS)
            list[(*n)++] = arg;
        else
            ea->too_many = true;
    }
}

/* The whole of f as a NUL-terminated string in *out (malloc'd), at most max bytes. Returns 0, -1 on a
 * read error, -2 when f holds more than max bytes (or memory ran out). */
static int read_all(FILE *f, int64_t max, char **out, size_t *len)
{
    struct buf b = {0};
    char chunk[65536];
    size_t got;
    while ((int64_t)b.len <= max && (got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_append(&b, chunk, got))
            break;
    if (ferror(f) || b.oom || (int64_t)b.len > max) {
        buf_free(&b);
        return ferror(f) ? -1 : -2;
    }
    *len = b.len;
    *out = buf_take(&b);
    return *out ? 0 : -2;
}

/* --var K=TEXT, K=@FILE or K=@-: the value as a JSON string, or NULL after printing why. */
static json_t *var_value(const char *opt, const char *val, int64_t max)
{
    if (val[0] != '@') {
        json_t *s = json_string(val);
        if (!s)
            fprintf(stderr, "llmq %s: --var %s: not UTF-8 text\n", CMD, opt);
        return s;
    }
    const char *file = val + 1;
    FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "llmq %s: --var %s: cannot read %s: %s\n", CMD, opt, file, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = read_all(f, max, &text, &len);
    if (f != stdin)
        fclose(f);
    if (rc) {
        fprintf(stderr, "llmq %s: --var %s: %s\n", CMD, opt,
                rc == -1 ? "read error" : "larger than queues.max_job_bytes (the job would be refused)");
        return NULL;
    }
    json_t *s = json_stringn(text, len);
    if (!s)
        fprintf(stderr, "llmq %s: --var %s: %s is not UTF-8 text without NUL bytes\n", CMD, opt, file);
    free(text);
    return s;
}

/* The job of --template/--var/--id/--set as one line of JSON in *line (malloc'd). Returns 0, 1
 * after printing why (a file could not be read), or 2 after a usage error. */
static int build_job(const struct enq_args *ea, int64_t max_bytes, char **line)
{
    json_t *job = json_object(), *vars = json_object();
    int rc = job && vars ? 0 : 1;
    if (rc == 0 && ea->id)
        rc =
            json_object_set_new(job, "id", json_string(ea->id)) ? cli_usage_error(CMD, "--id: not UTF-8") : 0;
    if (rc == 0)
        rc = json_object_set_new(job, "template", json_string(ea->template_name))
                 ? cli_usage_error(CMD, "--template: not UTF-8")
                 : 0;
    for (int i = 0; rc == 0 && i < ea->n_vars; i++) {
        const char *eq = strchr(ea->vars[i], '=');
        if (!eq || eq == ea->vars[i]) {
            rc = cli_usage_error(CMD, "--var %s: expected NAME=TEXT or NAME=@FILE", ea->vars[i]);
            break;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - ea->vars[i]), ea->vars[i]);
        if (json_object_get(vars, name)) {
            rc = cli_usage_error(CMD, "--var %s: given twice", name);
            break;
        }
        json_t *v = var_value(name, eq + 1, max_bytes);
        if (!v || json_object_set_new(vars, name, v))
            rc = 1;
    }
    for (int i = 0; rc == 0 && i < ea->n_sets; i++) {
        const char *eq = strchr(ea->sets[i], '=');
        if (!eq || eq == ea->sets[i]) {
            rc = cli_usage_error(CMD, "--set %s: expected FIELD=JSON", ea->sets[i]);
            break;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - ea->sets[i]), ea->sets[i]);
        if (!strcmp(name, "template") || !strcmp(name, "vars") || !strcmp(name, "id")) {
            rc = cli_usage_error(CMD, "--set %s: use --%s", name, !strcmp(name, "vars") ? "var" : name);
            break;
        }
        json_error_t je;
        json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, &je);
        if (!v) {
            rc = cli_usage_error(CMD,
                                 "--set %s: the value is not JSON (%s); quote strings: --set %s='\"text\"'",
                                 name, je.text, name);
            break;
        }
        json_object_set_new(job, name, v);
    }
    if (rc == 0 && json_object_set(job, "vars", vars))
        rc = 1;
    *line = rc == 0 ? json_dumps(job, JSON_COMPACT) : NULL;
    if (rc == 0 && !*line) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    }
    json_decref(vars);
    json_decref(job);
    return rc;
}

int cmd_enqueue(int argc, char **argv)
{
    static const struct option own[] = {
        {"queue", required_argument, NULL, 'q'},
        {"print-ids", no_argument, NULL, O_IDS},
        {"template", required_argument, NULL, 't'},
        {"var", required_argument, NULL, O_VAR},
        {"id", required_argument, NULL, O_ID},
        {"set", required_argument, NULL, O_SET},
        {NULL, 0, NULL, 0},
    };
    struct enq_args ea = {.queue = "short"};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "q:t:", .longopts = own, .on_opt = on_opt, .ctx = &ea};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    const char *queue = ea.queue;
    bool print_ids = ea.print_ids;
    int mode = !strcmp(queue, "short") ? 0 : !strcmp(queue, "long") ? 1 : !strcmp(queue, "auto") ? 2 : -1;
    if (mode < 0)
        return cli_usage_error(CMD, "--queue: expected short, long or auto, got '%s'", queue);
    if (ea.too_many)
        return cli_usage_error(CMD, "at most %d --var and %d --set options", MAX_OPT_ITEMS, MAX_OPT_ITEMS);
    if (!ea.template_name && (ea.n_vars || ea.n_sets || ea.id))
        return cli_usage_error(CMD, "--var, --set and --id build a job with --template NAME");
    if (ea.template_name && optind < argc)
        return cli_usage_error(
            CMD, "unexpected argument '%s' (with --template the job comes from the options)", argv[optind]);
    if (argc - optind > 1)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind + 1]);
    const char *input = optind < argc ? argv[optind] : "-";

    struct cfg c;
    int rc = cli_redis_config(CMD, a.config, a.redis, &c);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    char *tjob = NULL; /* the --template job */
    if (ea.template_name && (rc = build_job(&ea, c.queues.max_job_bytes, &tjob))) {
        cfg_free(&c);
        return rc;
    }
    FILE *in = tjob ? NULL : strcmp(input, "-") ? fopen(input, "rb") : stdin;
    if (!in && !tjob) {
        fprintf(stderr, "llmq %s: cannot read %s: %s\n", CMD, input, strerror(errno));
        cfg_free(&c);
        return 1;
    }
    struct enq e;
    memset(&e, 0, sizeof e);
    e.print_ids = print_ids;
    e.p[0].queue = "short";
    e.p[1].queue = "long";
    for (int i = 0; i < 2; i++) {
        e.p[i].items = calloc(BATCH, sizeof *e.p[i].items);
        e.p[i].owned = calloc(BATCH, sizeof *e.p[i].owned);
    }
    rc = 0;
    if (!e.p[0].items || !e.p[0].owned || !e.p[1].items || !e.p[1].owned) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    } else {
        rc = cli_redis_open(CMD, &c, &e.q);
    }
    if (rc == 0) {
        struct job_opts jo = job_opts_default();
        job_defaults_from_cfg(&jo.defaults, &c.sampling);
        jo.max_bytes = c.queues.max_job_bytes;
        if (c.n_templates) {
            jo.template_find = cfg_template_lookup;
            jo.template_ctx = &c;
        }
        e.bar = tjob ? NULL : progress_new(stderr, "lines", cli_count_lines(input, false));
        char *line = NULL;
        size_t cap = 0;
        long lineno = 0, jobs = 0;
        ssize_t n;
        if (tjob) {
            take(&e, &jo, &c, mode, tjob, strlen(tjob), 0);
            jobs++;
        }
        while (in && !e.failed && (n = getline(&line, &cap, in)) >= 0) {
            lineno++;
            size_t len = (size_t)n;
            while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                line[--len] = 0;
            size_t k = 0;
            while (k < len && (line[k] == ' ' || line[k] == '\t'))
                k++;
            if (k == len)
                continue;
            take(&e, &jo, &c, mode, line, len, lineno);
            jobs++;
            progress_update(e.bar, lineno, 0);
        }
        if (in && ferror(in)) {
            progress_clear(e.bar);
            fprintf(stderr, "llmq %s: reading %s after line %ld: %s\n", CMD, input, lineno, strerror(errno));
            e.failed = true;
        }
        free(line);
        flush(&e, &e.p[0]);
        flush(&e, &e.p[1]);
        progress_update(e.bar, lineno, 0);
        progress_finish(e.bar);
        if (e.reported > MAX_REPORTED)
            fprintf(stderr, "llmq %s: ... and %ld more bad lines\n", CMD, e.reported - MAX_REPORTED);
        fprintf(stderr,
                "llmq %s: %ld job%s read: %ld pushed (%ld to %s%s, %ld to %s%s), %ld bad (not pushed)%s\n",
                CMD, jobs, jobs == 1 ? "" : "s", e.pushed[0] + e.pushed[1], e.pushed[0], e.q->keys.queue_stem,
                "short", e.pushed[1], e.q->keys.queue_stem, "long", e.bad,
                e.failed ? "; stopped by the error above" : "");
        rc = e.failed || e.bad ? 1 : 0;
    }
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < e.p[i].n; k++) {
            free(e.p[i].owned[k]);
            free((char *)e.p[i].items[k].id);
        }
        free(e.p[i].items);
        free(e.p[i].owned);
    }
    progress_free(e.bar);
    rq_free(e.q);
    if (in && in != stdin)
        fclose(in);
    free(tjob);
    cfg_free(&c);
    return rc;
}
