/* `llmq enqueue`: validates a JSONL file of jobs as a whole and pushes it onto a Redis queue as
 * one batch (queue/batch.h), or pushes nothing. docs/JOBS.md "Batches" is the user's side. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "engine/util/buf.h"
#include "engine/util/json_exact.h"
#include "queue/batch.h"
#include "queue/jobid.h"
#include "queue/keys.h"
#include "queue/push.h"
#include "queue/rq.h"
#include "worker/cli/cli.h"
#include "worker/cli/cli_redis.h"
#include "worker/cli/progress.h"
#include "worker/config/config.h"
#include "worker/jobs/job.h"
#include "worker/jobs/tpl_source.h"

static const char CMD[] = "enqueue";

#define CHUNK 1000        /* jobs per push (one script call each, all in one pipeline per lane) */
#define MAX_REPORTED 20   /* problems described on stderr; the rest are counted */
#define BYTES_PER_TOKEN 4 /* --queue auto: a rough estimate of English text */

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq enqueue [-c FILE] [--redis URL] [--queue short|long|auto] [--batch NAME [--append]]\n"
        "                    [--no-batch] [--replace] [--print-ids] [--dry-run] [IN.jsonl|-]\n"
        "       llmq enqueue [options above] --template NAME [--var NAME=TEXT | --var NAME=@FILE]...\n"
        "                    [--id ID] [--set FIELD=JSON]...\n"
        "       llmq enqueue [options above] [--template NAME] --map-reduce --var document=@FILE ...\n"
        "\n"
        "Reads jobs, one JSON object per line (llmq's form or OpenAI Batch request lines; docs/JOBS.md),\n"
        "from IN or stdin, and pushes them onto the queue as one batch, in file order (the first line is\n"
        "fetched first). The whole file is checked first, the way a worker will (fields, types, bounds,\n"
        "templates of the config), and nothing is pushed unless every line is good: bad lines and\n"
        "duplicate ids are reported with their line numbers. Blank lines are skipped. Checks that need\n"
        "the model (prompt length against max_model_len) happen in the worker.\n"
        "\n"
        "Batches: every line gets \"batch_id\" added (its text is kept otherwise). A job's id is its\n"
        "\"id\" (llmq's form; one is added when missing, a UUIDv7) or, for OpenAI lines, BATCH/custom_id:\n"
        "ids are unique within a batch, and the same custom_id in another batch is another job.\n"
        "A new batch's id (batch_ and the 32 hex digits of a UUIDv7) is printed on stdout unless\n"
        "--batch names it or --print-ids asks for the jobs' ids instead (the summary line on stderr\n"
        "names it too). Follow it with `redis-cli HGETALL llmq:batch:ID` (counts by status, state),\n"
        "or wait for its id on the channel llmq:batch-done.\n"
        "\n"
        "A job naming a model (\"model\"; OpenAI \"body.model\") goes to that model's queue\n"
        "(llmq:queue:<model>:short|long), run only by workers serving that name (model.name,\n"
        "model.aliases). A \"template\" must be in the config or published to Redis by a worker\n"
        "(llmq:templates); an unknown one is a bad line.\n"
        "\n"
        "Options:\n"
        "  -c, --config FILE   llmq.yaml (default $LLMQ_CONFIG): redis, prefix, limits, templates\n"
        "      --redis URL     redis://[user:password@]host:port[/db] (redis.url)\n"
        "  -q, --queue Q       short (default), long, or auto: long when the prompt's estimated length\n"
        "                      (its bytes / 4) is over queues.long_threshold_tokens, else short. A worker\n"
        "                      moves short-queue jobs that turn out longer to the long queue anyway\n"
        "  -b, --batch NAME    the batch's id: 1 to 64 letters, digits, '.', '_' or '-' (refused when a\n"
        "                      batch of that name exists, unless --append)\n"
        "      --append        add the jobs to the existing batch --batch NAME (created if missing)\n"
        "      --no-batch      push the jobs without a batch, as a plain Redis client would (OpenAI\n"
        "                      lines are then known by their custom_id alone)\n"
        "      --replace       run again jobs whose id is known and finished (completed, failed or\n"
        "                      cancelled, within queues.result_ttl_s): their hash is reset to queued.\n"
        "                      Their SQLite row is replaced when the new run ends at least as well\n"
        "                      (completed > cancelled > failed; a failed re-run keeps a completed row).\n"
        "                      Without it a known id refuses the file; a queued or running one always does\n"
        "      --print-ids     print each pushed job's id on stdout, one per line (instead of the\n"
        "                      batch id), for `xargs llmq wait`\n"
        "      --dry-run       check the jobs and print the summary of what would be pushed, without\n"
        "                      Redis: nothing is pushed and Redis is not asked, so templates workers\n"
        "                      published there are not seen (a job naming one is a bad line here),\n"
        "                      and an existing batch or known job id is not noticed\n"
        "      --quiet         no progress bar and no summary line when every job was pushed\n"
        "  -h, --help          this text\n"
        "\n"
        "One templated job from options instead of a file (the config must define the template):\n"
        "      --template NAME the job's \"template\"\n"
        "      --var K=TEXT    vars.K = TEXT; K=@FILE reads the file (UTF-8 text), K=@- reads stdin\n"
        "      --id ID         the job's \"id\" (default: a new UUIDv7)\n"
        "      --set F=JSON    any other job field, its value as JSON: --set max_tokens=128\n"
        "                      --set metadata='{\"file\": \"a.txt\"}' --set enable_thinking=false\n"
        "      --map-reduce    a summary of a document longer than the context (docs/JOBS.md \"Long\n"
        "                      documents\"): --var document=@FILE is the job's \"document\", --template\n"
        "                      NAME (optional) its map template; more options with\n"
        "                      --set summarize='{\"chunk_tokens\": 8192, \"max_tokens\": 256}'\n"
        "\n"
        "A progress bar is drawn on stderr while the file is checked when stderr is a terminal; a\n"
        "summary line is printed (with --quiet only when something was not pushed).\n"
        "Exit status: 0 every job was pushed (--dry-run: every job is good), 1 nothing was pushed (a bad\n"
        "line, a duplicate or known id, an existing batch, Redis failed) or, after a Redis failure part\n"
        "way, not everything, 2 the command line is wrong.\n");
}

/* One good line, ready to push. */
struct line {
    char *raw; /* the job with its id and batch_id added (owned) */
    size_t len;
    char *key;   /* its id: the Redis hash and SQLite row it will have (owned) */
    long lineno; /* 0 for the --template job */
    int lane;    /* 0 short, 1 long */
    char *model; /* the model it names (owned); NULL = none: the unnamed queues */
};

struct enq {
    struct rq *q;
    const char *batch; /* NULL: --no-batch */
    struct line *lines;
    size_t n, cap;
    const char **models; /* [nmodels] the distinct models lines name, in order of first use (borrowed) */
    size_t nmodels, models_cap;
    long bad, reported;
    struct progress *bar;
    bool push_failed; /* a push failed: some of its jobs may be queued all the same */
};

static size_t prompt_bytes(const struct job *j)
{
    if (j->prompt)
        return strlen(j->prompt);
    if (j->prompt_ids)
        return (size_t)j->n_prompt_ids * BYTES_PER_TOKEN;
    if (j->summarize)
        return j->summarize->document_len;
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(j->messages); i++) {
        json_t *c = json_object_get(json_array_get(j->messages, i), "content");
        if (json_is_string(c))
            n += json_string_length(c);
        for (size_t k = 0; json_is_array(c) && k < json_array_size(c); k++)
            n += json_string_length(json_object_get(json_array_get(c, k), "text"));
    }
    return n;
}

/* A problem with line `lineno` (0: the --template job): counted, and described while fewer than
 * MAX_REPORTED were. */
static void problem(struct enq *e, long lineno, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(struct enq *e, long lineno, const char *fmt, ...)
{
    e->bad++;
    if (e->reported++ >= MAX_REPORTED)
        return;
    progress_clear(e->bar);
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lineno)
        fprintf(stderr, "llmq %s: line %ld: %s\n", CMD, lineno, msg);
    else
        fprintf(stderr, "llmq %s: the job of the options: %s\n", CMD, msg);
}

/* One line: validate, give it an id and the batch, keep it for the push. */
/* Adds `model` (NULL = none) to e->models when it is new there. 0, or -1 out of memory. */
static int model_note(struct enq *e, const char *model)
{
    if (!model)
        return 0;
    for (size_t i = 0; i < e->nmodels; i++)
        if (!strcmp(e->models[i], model))
            return 0;
    if (array_reserve(&e->models, &e->models_cap, e->nmodels + 1, sizeof *e->models, 4))
        return -1;
    e->models[e->nmodels++] = model;
    return 0;
}

static void take(struct enq *e, const struct job_opts *jo, const struct cfg *c, int mode, const char *line,
                 size_t len, long lineno)
{
    char err[1024];
    struct job j;
    int rc = job_parse(line, len, jo, &j, err, sizeof err);
    if (rc == 0 && j.batch_id)
        rc = JOB_ERR_INVALID, snprintf(err, sizeof err,
                                       "field 'batch_id': set by llmq enqueue (--batch); "
                                       "remove it from the line");
    if (rc) {
        problem(e, lineno, "%s", err);
        job_free(&j);
        return;
    }
    int lane =
        mode == 2 ? prompt_bytes(&j) / BYTES_PER_TOKEN > (size_t)c->queues.long_threshold_tokens : mode;
    bool needs_id = !j.id;
    char *model = j.model ? strdup(j.model) : NULL;
    bool nomem = j.model && !model;
    job_free(&j);
    char *raw = NULL, *tmp = NULL;
    size_t rawlen = 0, tmplen = 0;
    int fail = 0;
    if (needs_id) { /* llmq form without an id: give it one inside the JSON, so every copy has it */
        char nid[RQ_ID_MAX + 1];
        rq_new_id(nid);
        fail = rq_job_add_id(line, len, nid, &tmp, &tmplen);
        line = tmp, len = tmplen;
    }
    if (!fail && e->batch)
        fail = rq_job_add_batch(line, len, e->batch, &raw, &rawlen);
    else if (!fail)
        raw = strndup(line, len), rawlen = len, fail = !raw;
    free(tmp);
    char key[RQ_ID_MAX + 1];
    if (!fail && rq_job_id(raw, rawlen, 0, key) != RQ_ID_FOUND) /* cannot happen: the parser took it */
        fail = -1;
    struct line *l = NULL;
    if (!fail && array_reserve(&e->lines, &e->cap, e->n + 1, sizeof *e->lines, 1024) == 0)
        l = &e->lines[e->n];
    if (l && !nomem && model_note(e, model) == 0 && (l->key = strdup(key)) != NULL) {
        l->raw = raw;
        l->len = rawlen;
        l->lineno = lineno;
        l->lane = lane;
        l->model = model;
        e->n++;
        return;
    }
    free(raw);
    free(model);
    problem(e, lineno, "out of memory");
}

static int by_key(const void *a, const void *b)
{
    const struct line *x = *(const struct line *const *)a, *y = *(const struct line *const *)b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->lineno > y->lineno) - (x->lineno < y->lineno);
}

/* Ids that occur more than once: each repeat is a problem naming the line it repeats. */
static void check_unique(struct enq *e)
{
    struct line **s = malloc((e->n ? e->n : 1) * sizeof *s);
    if (!s) {
        problem(e, 0, "out of memory");
        return;
    }
    for (size_t i = 0; i < e->n; i++)
        s[i] = &e->lines[i];
    qsort(s, e->n, sizeof *s, by_key);
    for (size_t i = 1; i < e->n; i++) {
        size_t first = i - 1;
        while (i < e->n && !strcmp(s[i]->key, s[first]->key)) {
            problem(e, s[i]->lineno, "id '%.300s' is already on line %ld (ids are unique within a batch)",
                    s[i]->key, s[first]->lineno);
            i++;
        }
    }
    free(s);
}

/* A named batch that exists (without --append) or was cancelled refuses the file before its
 * jobs are looked at (rq_batch_open checks again, atomically). 0, or 1 after printing why. */
static int check_batch(struct enq *e, bool append)
{
    char state[16];
    if (rq_batch_state(e->q, e->batch, state)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(e->q));
        return 1;
    }
    if (!state[0] || (append && strcmp(state, "cancelled")))
        return 0;
    fprintf(stderr, "llmq %s: batch '%s' %s; nothing pushed\n", CMD, e->batch,
            append ? "was cancelled: no jobs can be added to it"
                   : "exists (use --append to add jobs to it, or another --batch name)");
    return 1;
}

/* Ids Redis already knows: a problem each (finished ones are fine with --replace). */
static int check_known(struct enq *e, bool replace)
{
    for (size_t base = 0; base < e->n; base += CHUNK) {
        size_t m = e->n - base < CHUNK ? e->n - base : CHUNK;
        const char *ids[CHUNK];
        char st[CHUNK][16];
        for (size_t i = 0; i < m; i++)
            ids[i] = e->lines[base + i].key;
        if (rq_job_statuses(e->q, ids, (int)m, st)) {
            progress_clear(e->bar);
            fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(e->q));
            return -1;
        }
        for (size_t i = 0; i < m; i++) {
            bool running = !strcmp(st[i], "queued") || !strcmp(st[i], "running");
            if (!st[i][0] || (replace && !running))
                continue;
            problem(e, e->lines[base + i].lineno,
                    running
                        ? "job '%.300s' is already %s: it will run (cancel it, or wait for it)"
                        : "job '%.300s' is already %s (within queues.result_ttl_s): use --replace to run it "
                          "again",
                    e->lines[base + i].key, st[i]);
        }
    }
    return 0;
}

static bool same_model(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

/* Pushes the lines of one lane that name `model` (NULL = none) onto `queue` (that lane's queue
 * reference), in file order. Returns how many were pushed, or -1 after a Redis failure (some may
 * have been). */
static long push_lane(struct enq *e, int lane, const char *model, const char *queue, enum rq_push_mode mode)
{
    struct rq_push_item *items = calloc(CHUNK, sizeof *items);
    struct line **of = calloc(CHUNK, sizeof *of);
    long pushed = 0;
    size_t i = 0;
    while (items && of && i < e->n) {
        int m = 0;
        for (; i < e->n && m < CHUNK; i++)
            if (e->lines[i].lane == lane && same_model(e->lines[i].model, model)) {
                of[m] = &e->lines[i];
                items[m++] = (struct rq_push_item){e->lines[i].raw, e->lines[i].len, e->lines[i].key, NULL};
            }
        int refused = m ? rq_push(e->q, queue, e->batch, mode, items, m) : 0;
        if (refused < 0) {
            fprintf(stderr, "llmq %s: pushing onto queue %s failed: %s\n", CMD, queue, rq_error(e->q));
            e->push_failed = true;
            pushed = -1;
            break;
        }
        for (int k = 0; k < m; k++)
            if (items[k].refused)
                problem(e, of[k]->lineno, "job '%.300s' became %s while the file was pushed: not pushed",
                        of[k]->key, items[k].refused);
        rq_push_item_clear(items, m);
        pushed += m - refused;
    }
    if (!items || !of) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        pushed = -1;
    }
    free(items);
    free(of);
    return pushed;
}

/* Opens the batch, pushes both lanes of the unnamed queues (pushed[0], [1]) and of every model
 * queue (pushed[2]), seals the batch. Returns 0, or 1 after printing why. */
static int push_all(struct enq *e, const char *input, bool append, enum rq_push_mode mode, long pushed[3])
{
    if (e->batch) {
        int rc = rq_batch_open(e->q, e->batch, input, append);
        if (rc < 0 || rc == RQ_BATCH_EXISTS || rc == RQ_BATCH_CANCELLED) {
            if (rc < 0)
                fprintf(stderr, "llmq %s: %s\n", CMD, rq_error(e->q));
            else
                fprintf(stderr, "llmq %s: batch '%s' %s; nothing pushed\n", CMD, e->batch,
                        rc == RQ_BATCH_EXISTS
                            ? "exists (use --append to add jobs to it, or another --batch name)"
                            : "was cancelled: no jobs can be added to it");
            return 1;
        }
    }
    int rc = 0;
    static const char *const queues[2] = {"short", "long"};
    for (int lane = 0; lane < 2 && rc == 0; lane++)
        if ((pushed[lane] = push_lane(e, lane, NULL, queues[lane], mode)) < 0) {
            pushed[lane] = 0;
            rc = 1;
        }
    for (size_t m = 0; m < e->nmodels && rc == 0; m++)
        for (int lane = 0; lane < 2 && rc == 0; lane++) {
            char ref[RQ_QREF_MAX + 1];
            long k = rq_queue_ref(e->models[m], queues[lane], ref, sizeof ref)
                         ? -1 /* cannot happen: job_parse checked the name */
                         : push_lane(e, lane, e->models[m], ref, mode);
            if (k < 0)
                rc = 1;
            else
                pushed[2] += k;
        }
    if (e->batch && rq_batch_seal(e->q, e->batch) < 0) {
        fprintf(stderr, "llmq %s: batch '%s': %s (it cannot complete until an enqueue with --append ends)\n",
                CMD, e->batch, rq_error(e->q));
        rc = 1;
    }
    return rc;
}

enum {
    O_IDS = CLI_REDIS_O_OWN,
    O_VAR,
    O_ID,
    O_SET,
    O_APPEND,
    O_NO_BATCH,
    O_REPLACE,
    O_MAP_REDUCE,
    O_TEMPLATE,
    O_QUIET,
    O_DRY_RUN
};

#define MAX_OPT_ITEMS 64 /* --var and --set each */

/* enqueue's own options (the strings are borrowed from argv). */
struct enq_args {
    const char *queue;               /* -q/--queue */
    bool print_ids;                  /* --print-ids */
    const char *template_name;       /* --template */
    const char *id;                  /* --id */
    const char *vars[MAX_OPT_ITEMS]; /* --var K=V, in order */
    const char *sets[MAX_OPT_ITEMS]; /* --set F=JSON, in order */
    int n_vars, n_sets;
    bool too_many;
    const char *batch;              /* -b/--batch */
    bool append, no_batch, replace; /* --append, --no-batch, --replace */
    bool map_reduce;                /* --map-reduce */
    bool dry_run;                   /* --dry-run */
    bool quiet;                     /* --quiet */
};

static void on_opt(int opt, const char *arg, void *ctx)
{
    struct enq_args *ea = ctx;
    if (opt == 'q')
        ea->queue = arg;
    else if (opt == O_IDS)
        ea->print_ids = true;
    else if (opt == O_TEMPLATE)
        ea->template_name = arg;
    else if (opt == O_QUIET)
        ea->quiet = true;
    else if (opt == O_ID)
        ea->id = arg;
    else if (opt == 'b')
        ea->batch = arg;
    else if (opt == O_APPEND)
        ea->append = true;
    else if (opt == O_NO_BATCH)
        ea->no_batch = true;
    else if (opt == O_REPLACE)
        ea->replace = true;
    else if (opt == O_MAP_REDUCE)
        ea->map_reduce = true;
    else if (opt == O_DRY_RUN)
        ea->dry_run = true;
    else if (opt == O_VAR || opt == O_SET) {
        const char **list = opt == O_VAR ? ea->vars : ea->sets;
        int *n = opt == O_VAR ? &ea->n_vars : &ea->n_sets;
        if (*n < MAX_OPT_ITEMS)
            list[(*n)++] = arg;
        else
            ea->too_many = true;
    }
}

/* --dry-run: the summary line a push of the good jobs would print, on stderr (e->q is NULL: Redis
 * is not asked); named: the --batch NAME, or NULL. 0, or 1 when the config's key prefix is unusable. */
static int dry_run_summary(const struct enq *e, const struct cfg *c, long jobs, const char *named)
{
    struct rq_keys k;
    char err[256];
    if (rq_keys_init(&k, c->redis.prefix, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        return 1;
    }
    long n[3] = {0, 0, 0};
    for (size_t i = 0; i < e->n; i++)
        n[e->lines[i].model ? 2 : e->lines[i].lane]++;
    if (e->bad)
        fprintf(stderr, "llmq %s: dry run: %ld job%s read, %ld with problems: nothing would be pushed\n", CMD,
                jobs, jobs == 1 ? "" : "s", e->bad);
    else
        fprintf(stderr,
                "llmq %s: dry run: %s%s%s%ld job%s would be pushed (%ld to %s%s, %ld to %s%s, %ld to model "
                "queues); nothing pushed, Redis not asked\n",
                CMD, named ? "batch " : "", named ? named : "", named ? ": " : "", jobs, jobs == 1 ? "" : "s",
                n[0], k.queue_stem, "short", n[1], k.queue_stem, "long", n[2]);
    return 0;
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

/* --map-reduce: vars.document becomes the job's "document", --template its summarize.map_template
 * (over a --set summarize object). 0, or 2 after a usage error. */
static int map_reduce_job(const struct enq_args *ea, json_t *job, json_t *vars)
{
    json_t *doc = json_object_get(vars, "document");
    if (!doc)
        return cli_usage_error(CMD, "--map-reduce: the document comes from --var document=@FILE");
    json_object_set(job, "document", doc);
    json_object_del(vars, "document");
    json_t *sum = json_object_get(job, "summarize");
    if (sum && !json_is_object(sum) && !json_is_true(sum))
        return cli_usage_error(CMD, "--set summarize: expected an object");
    json_t *o = json_is_object(sum) ? json_incref(sum) : json_object();
    if (ea->template_name)
        json_object_set_new(o, "map_template", json_string(ea->template_name));
    json_object_set_new(job, "summarize", o);
    return 0;
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
    if (rc == 0 && ea->template_name && !ea->map_reduce)
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
    if (rc == 0 && ea->map_reduce)
        rc = map_reduce_job(ea, job, vars);
    if (rc == 0 && json_object_size(vars) && json_object_set(job, "vars", vars))
        rc = 1;
    *line = rc == 0 ? json_dumps_exact(job, JSON_COMPACT) : NULL;
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
        {"template", required_argument, NULL, O_TEMPLATE},
        {"var", required_argument, NULL, O_VAR},
        {"id", required_argument, NULL, O_ID},
        {"set", required_argument, NULL, O_SET},
        {"batch", required_argument, NULL, 'b'},
        {"append", no_argument, NULL, O_APPEND},
        {"no-batch", no_argument, NULL, O_NO_BATCH},
        {"replace", no_argument, NULL, O_REPLACE},
        {"map-reduce", no_argument, NULL, O_MAP_REDUCE},
        {"dry-run", no_argument, NULL, O_DRY_RUN},
        {"quiet", no_argument, NULL, O_QUIET},
        {NULL, 0, NULL, 0},
    };
    struct enq_args ea = {.queue = "short"};
    const struct cli_redis_spec spec = {
        .usage = usage, .shortopts = "q:b:", .longopts = own, .on_opt = on_opt, .ctx = &ea};
    struct cli_redis_args a;
    if (cli_redis_getopt(CMD, argc, argv, &spec, &a))
        return a.exit;
    const char *queue = ea.queue;
    int mode = !strcmp(queue, "short") ? 0 : !strcmp(queue, "long") ? 1 : !strcmp(queue, "auto") ? 2 : -1;
    if (mode < 0)
        return cli_usage_error(CMD, "--queue: expected short, long or auto, got '%s'", queue);
    if (ea.too_many)
        return cli_usage_error(CMD, "at most %d --var and %d --set options", MAX_OPT_ITEMS, MAX_OPT_ITEMS);
    if (!ea.template_name && !ea.map_reduce && (ea.n_vars || ea.n_sets || ea.id))
        return cli_usage_error(CMD, "--var, --set and --id build a job with --template NAME or --map-reduce");
    bool one_job = ea.template_name || ea.map_reduce;
    if (one_job && optind < argc)
        return cli_usage_error(
            CMD, "unexpected argument '%s' (with --template the job comes from the options)", argv[optind]);
    if (argc - optind > 1)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind + 1]);
    if (ea.batch && !rq_valid_batch_id(ea.batch, strlen(ea.batch)))
        return cli_usage_error(CMD, "--batch '%.80s': expected 1 to %d letters, digits, '.', '_' or '-'",
                               ea.batch, RQ_BATCH_ID_MAX);
    if (ea.append && !ea.batch)
        return cli_usage_error(CMD, "--append needs --batch NAME (the batch to add to)");
    if (ea.no_batch && ea.batch)
        return cli_usage_error(CMD, "--no-batch and --batch exclude each other");
    const char *input = optind < argc ? argv[optind] : "-";

    struct cfg c;
    int rc = cli_redis_config(CMD, a.config, a.redis, &c);
    if (rc) {
        cfg_free(&c);
        return rc;
    }
    char *tjob = NULL; /* the --template job */
    if (one_job && (rc = build_job(&ea, c.queues.max_job_bytes, &tjob))) {
        cfg_free(&c);
        return rc;
    }
    FILE *in = tjob ? NULL : strcmp(input, "-") ? fopen(input, "rb") : stdin;
    if (!in && !tjob) {
        fprintf(stderr, "llmq %s: cannot read %s: %s\n", CMD, input, strerror(errno));
        cfg_free(&c);
        return 1;
    }
    char new_batch[40], tinput[300];
    if (!ea.batch && !ea.no_batch)
        rq_new_batch_id(new_batch);
    if (tjob)
        snprintf(tinput, sizeof tinput, "(%s %.200s)", ea.map_reduce ? "map-reduce" : "template",
                 ea.template_name ? ea.template_name : JOB_SUMMARIZE_MAP);
    struct enq e;
    memset(&e, 0, sizeof e);
    e.batch = ea.no_batch ? NULL : ea.batch ? ea.batch : new_batch;
    if (!ea.dry_run)
        rc = cli_redis_open(CMD, &c, &e.q);
    struct tpl_source *ts = NULL;
    if (rc == 0 && !(ts = tpl_source_new(&c, e.q))) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        rc = 1;
    }
    long jobs = 0, lineno = 0, pushed[3] = {0, 0, 0};
    if (rc == 0) {
        struct job_opts jo = job_opts_default();
        job_defaults_from_cfg(&jo.defaults, &c.sampling);
        jo.max_bytes = c.queues.max_job_bytes;
        jo.template_find = tpl_source_find; /* the config's, else those workers published */
        jo.template_ctx = ts;
        jo.template_where = ea.dry_run ? "in the config (--dry-run does not see templates published in Redis)"
                                       : "in the config or published in Redis";
        e.bar = tjob || ea.quiet ? NULL : progress_new(stderr, "lines", cli_count_lines(input, false));
        progress_hide_rate(e.bar); /* nothing is generated here */
        if (tjob) {
            take(&e, &jo, &c, mode, tjob, strlen(tjob), 0);
            jobs++;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while (in && (n = getline(&line, &cap, in)) >= 0) {
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
        free(line);
        progress_update(e.bar, lineno, 0);
        progress_finish(e.bar);
        if (in && ferror(in)) {
            fprintf(stderr, "llmq %s: reading %s after line %ld: %s\n", CMD, input, lineno, strerror(errno));
            rc = 1;
        }
        if (rc == 0 && jobs == 0) {
            fprintf(stderr, "llmq %s: no jobs in %s: nothing pushed\n", CMD, input);
            rc = 1;
        }
        if (rc == 0 && ea.dry_run) {
            check_unique(&e);
            rc = dry_run_summary(&e, &c, jobs, ea.batch);
        }
        if (rc == 0 && e.batch && !ea.dry_run)
            rc = check_batch(&e, ea.append);
        if (rc == 0)
            check_unique(&e);
        if (rc == 0 && e.bad == 0 && !ea.dry_run && check_known(&e, ea.replace))
            rc = 1;
        if (rc == 0 && e.bad == 0 && !ea.dry_run) {
            enum rq_push_mode pm = ea.replace ? RQ_PUSH_REPLACE : RQ_PUSH_NEW;
            rc = push_all(&e, tjob ? tinput : input, ea.append, pm, pushed);
        }
        if (e.reported > MAX_REPORTED)
            fprintf(stderr, "llmq %s: ... and %ld more problems\n", CMD, e.reported - MAX_REPORTED);
        long total = pushed[0] + pushed[1] + pushed[2];
        if (total > 0 && e.batch && !ea.batch && !ea.print_ids)
            printf("%s\n", e.batch);
        for (size_t i = 0; ea.print_ids && total > 0 && i < e.n; i++)
            printf("%s\n", e.lines[i].key);
        if (ea.dry_run)
            ; /* dry_run_summary said it */
        else if (total == 0 && e.push_failed)
            fprintf(stderr,
                    "llmq %s: %ld job%s read; the push failed (above): some may be on the queue all the same "
                    "(llmq status)\n",
                    CMD, jobs, jobs == 1 ? "" : "s");
        else if (total == 0)
            fprintf(stderr, "llmq %s: %ld job%s read, %ld with problems: nothing pushed\n", CMD, jobs,
                    jobs == 1 ? "" : "s", e.bad);
        else if (!ea.quiet || total < jobs)
            fprintf(
                stderr,
                "llmq %s: %s%s%s%ld of %ld job%s pushed (%ld to %s%s, %ld to %s%s, %ld to model queues)%s\n",
                CMD, e.batch ? "batch " : "", e.batch ? e.batch : "", e.batch ? ": " : "", total, jobs,
                jobs == 1 ? "" : "s", pushed[0], e.q->keys.queue_stem, "short", pushed[1],
                e.q->keys.queue_stem, "long", pushed[2], total < jobs ? "; the others were not (above)" : "");
        if (e.bad)
            rc = 1;
    }
    for (size_t i = 0; i < e.n; i++) {
        free(e.lines[i].raw);
        free(e.lines[i].key);
        free(e.lines[i].model);
    }
    free(e.lines);
    free(e.models);
    tpl_source_free(ts);
    progress_free(e.bar);
    rq_free(e.q);
    if (in && in != stdin)
        fclose(in);
    free(tjob);
    cfg_free(&c);
    return rc;
}
