/* `llmq run`: an offline batch without Redis. Every input line is a job (worker/jobs/job.h); all go
 * through one engine with continuous batching; one result line per job comes out, in input order
 * (worker/jobs/result.h).
 *
 * Memory stays bounded: at most WINDOW lines are between "read" and "written" at any time. Lines
 * finish out of order, so a finished result waits in its slot until every earlier line is written;
 * reading pauses when the window is full. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/util/errfmt.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "worker/backends/backend_open.h"
#include "worker/cli/cli.h"
#include "worker/cli/engine_flags.h"
#include "worker/cli/progress.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/jobs/grammar_cache.h"
#include "worker/jobs/job.h"
#include "worker/jobs/result.h"
#include "worker/jobs/summarize.h"

static const char CMD[] = "run";

#define WINDOW 4096     /* lines read but not yet written */
#define MAX_REPORTED 10 /* failed lines described on stderr; the rest are counted */

static void usage(FILE *f)
{
    fputs("Usage: llmq run --model DIR --input IN.jsonl --output OUT.jsonl [options]\n"
          "\n"
          "Runs a batch of jobs through the engine without Redis. Every line of IN is a job, in llmq's form\n"
          "({\"id\", \"prompt\" | \"messages\", \"max_tokens\", ...}) or as an OpenAI Batch request line\n"
          "({\"custom_id\", \"method\", \"url\", \"body\"}); docs/JOBS.md lists every field. OUT gets one "
          "line\n"
          "per job in input order: llmq's result object, or an OpenAI Batch output line for OpenAI lines.\n"
          "A bad line gets a failed result with the reason and the batch goes on. Blank lines are skipped.\n"
          "IN and OUT may be '-' for stdin and stdout.\n"
          "\n"
          "Options (flags override the config file and LLMQ_* variables; docs/CLI.md):\n"
          "  -i, --input FILE                jobs, one JSON object per line\n"
          "  -o, --output FILE               results, one JSON object per line (overwritten)\n"
          "  -c, --config FILE               llmq.yaml (default $LLMQ_CONFIG; sampling defaults,\n"
          "                                  limits, templates)\n"
          "      --chat-template FILE        a Jinja chat template used instead of the model's own\n"
          "                                  (model.chat_template; docs/CHAT_TEMPLATES.md)\n"
          "      --quiet                     no progress bar and no summary line\n"
          "  -h, --help                      this text\n"
          "      --version                   llmq's version\n"
          "\n"
          "Engine and model (the same flags as llmq worker and llmq bench take):\n",
          f);
    engine_flags_usage(f, ENGINE_FLAGS_ENGINE);
    fputs("\n"
          "A progress bar (jobs, tokens/s, ETA) is drawn on stderr when it is a terminal; a summary line\n"
          "is printed there at the end (neither with --quiet; failed lines are still reported).\n"
          "\n"
          "Exit status: 0 the batch ran (even if some jobs failed), 1 it could not run (input missing,\n"
          "model or tokenizer did not load, output not writable), 2 the command line is wrong.\n",
          f);
}

/* One input line on its way to the output. */
struct slot {
    struct job job;
    struct engine_seq *seq; /* while in the engine */
    struct sum_run ref;     /* the user of seq: ref.owner is the slot */
    struct sum_job *sum;    /* a map-reduce summary job's parts (worker/jobs/summarize.h), else NULL */
    char *out;              /* the result line, once finished */
    long lineno;
    int truncated_tokens; /* prompt tokens its "truncate" dropped */
    int max_tokens;       /* its request's, for the progress bar */
    double deadline;      /* engine_request.deadline of its requests (0 = none) */
    bool done;
};

struct run {
    struct cfg cfg;
    struct model *model;
    struct tok *tok;
    struct chat_template *chat; /* the model's chat template, parsed once */
    struct engine *eng;
    struct grammar_cache *grammars; /* jobs' structured-output grammars, compiled once each */
    struct job_opts jopts;
    char model_name[256];
    int max_model_len;
    FILE *in, *out;
    const char *out_path;
    struct progress *bar;
    struct slot *slots; /* [WINDOW], a ring indexed by job number % WINDOW */
    long head, tail;    /* job numbers: head is the next to write, tail the next to read */
    long completed, failed, reported;
    uint64_t prompt_tokens, generated_tokens;
    bool write_failed, read_failed;
    bool quiet; /* --quiet: no progress bar, no summary line */
};

static const char *token_bytes(const void *ctx, int32_t id, size_t *len)
{
    return tok_token_bytes((const struct tok *)ctx, id, len);
}

static void report_failure(struct run *r, const struct slot *s, const char *err)
{
    r->failed++;
    if (r->reported++ < MAX_REPORTED) {
        progress_clear(r->bar);
        bool named = s->job.id && !s->job.id_generated;
        fprintf(stderr, "llmq run: line %ld%s%s%s: %s\n", s->lineno, named ? " (" : "",
                named ? s->job.id : "", named ? ")" : "", err);
    }
}

/* Turns a slot into its output line, marks it done. */
static void finish_slot(struct run *r, struct slot *s, const struct res_output *o)
{
    s->out = res_line(&s->job, o, token_bytes, r->tok);
    if (!s->out) { /* out of memory for a big result: still answer the line */
        struct res_output f = res_failed(JOB_ERR_INTERNAL, "out of memory while writing the result");
        s->out = res_line(&s->job, &f, NULL, NULL);
    }
    s->done = true;
    sum_free(s->sum); /* before the job it borrows from */
    s->sum = NULL;
    job_free(&s->job);
}

static void fail_slot(struct run *r, struct slot *s, int rc, const char *err)
{
    sum_stop_parts(s->sum, r->eng);
    report_failure(r, s, err);
    struct res_output o = res_failed(rc, err);
    o.model = r->model_name;
    finish_slot(r, s, &o);
}

/* ---- map-reduce summary jobs: every part is a seq; a level starts when the one below is done */

/* The waiting parts of a summary job into the engine. 0, or an enum job_error with err. */
static int pump_parts(struct run *r, struct slot *s, char *err, size_t errlen)
{
    struct sum_start st = {.eng = r->eng, .grammars = r->grammars, .owner = s, .deadline = s->deadline};
    int started = 0;
    return sum_start_parts(s->sum, &st, &started, err, errlen);
}

/* A part finished: kept, and the next level starts when it completes one; the root's ends the
 * job, and so does a part that failed, timed out or was cancelled. */
static void take_part(struct run *r, struct sum_run *ref, struct engine_seq *q)
{
    struct slot *s = ref->owner;
    struct sum_part *p = ref->part;
    p->user = NULL;
    free(ref);
    r->prompt_tokens += (uint64_t)q->n_prompt;
    r->generated_tokens += (uint64_t)q->n_output;
    char err[1024];
    int rc = 0;
    enum finish_reason f = q->finish;
    if (f == FINISH_STOP || f == FINISH_LENGTH) {
        if (sum_done(s->sum, p, q->text, q->text_len, q->n_prompt, q->n_output, f))
            rc = errfmt_rc(err, sizeof err, JOB_ERR_INTERNAL, "out of memory");
        else if (!p->root && !(rc = sum_committed(s->sum, p, err, sizeof err)))
            rc = pump_parts(r, s, err, sizeof err);
    } else if (f == FINISH_ERROR) {
        rc = errfmt_rc(err, sizeof err, JOB_ERR_ENGINE, "level %d, part %d: %s", p->level, p->index + 1,
                       q->error[0] ? q->error : "the engine failed");
    }
    engine_release(r->eng, q);
    if (rc) {
        fail_slot(r, s, rc, err);
        return;
    }
    if (f == FINISH_STOP || f == FINISH_LENGTH) {
        if (!p->root)
            return;
    }
    sum_stop_parts(s->sum, r->eng);
    struct res_output o = {.model = r->model_name, .created = (int64_t)time(NULL)};
    sum_result(s->sum, f, &o);
    if (f == FINISH_TIMEOUT) {
        job_timeout_error(&s->job, o.completion_tokens, err, sizeof err);
        o.error = err;
        o.error_rc = JOB_ERR_TIMEOUT;
        report_failure(r, s, err);
    } else {
        r->completed++;
    }
    finish_slot(r, s, &o);
}

/* Reads one job line into a new slot: parse, tokenize, add to the engine (or fail it). */
static void take_line(struct run *r, const char *line, size_t len, long lineno)
{
    struct slot *s = &r->slots[r->tail % WINDOW];
    memset(s, 0, sizeof *s);
    s->lineno = lineno;
    r->tail++;
    char err[1024];
    int rc = job_parse(line, len, &r->jopts, &s->job, err, sizeof err);
    if (s->job.form == JOB_FORM_LLMQ && job_assign_id(&s->job)) {
        fail_slot(r, s, JOB_ERR_INTERNAL, "out of memory");
        return;
    }
    if (rc) {
        fail_slot(r, s, rc, err);
        return;
    }
    s->ref.owner = s;
    s->deadline = job_deadline(&s->job, engine_now(r->eng)); /* timeout_s counts from here */
    if (s->job.summarize) {
        rc = sum_open(&s->job, r->tok, r->chat, r->max_model_len, &s->sum, err, sizeof err);
        if (!rc)
            rc = pump_parts(r, s, err, sizeof err);
        if (rc)
            fail_slot(r, s, rc, err);
        return;
    }
    struct job_input in;
    rc = job_prepare(&s->job, r->tok, r->chat, r->max_model_len, &in, err, sizeof err);
    if (rc == 0) {
        in.req.user = &s->ref;
        s->truncated_tokens = in.truncated_tokens;
        s->max_tokens = in.req.max_tokens;
        in.req.deadline = s->deadline;
        rc = grammar_cache_for_job(r->grammars, &s->job, r->eng, &in.req.grammar, err, sizeof err);
        s->seq = rc ? NULL : engine_add(r->eng, &in.req, err, sizeof err);
        if (!rc && !s->seq)
            rc = JOB_ERR_ENGINE;
    }
    job_input_free(&in);
    if (rc)
        fail_slot(r, s, rc, err);
}

/* A finished sequence: its result into its slot, its memory back to the engine. */
static void take_seq(struct run *r, struct engine_seq *q)
{
    struct sum_run *ref = q->user;
    if (!ref) { /* a part of a summary job that ended without it */
        engine_release(r->eng, q);
        return;
    }
    if (ref->part) {
        take_part(r, ref, q);
        return;
    }
    struct slot *s = ref->owner;
    struct res_output o = {
        .finish = q->finish,
        .text = q->text,
        .text_len = q->text_len,
        .reasoning = q->reasoning,
        .reasoning_len = q->reasoning_len,
        .has_reasoning = q->has_reasoning,
        .reasoning_tokens = q->n_reasoning_tokens,
        .prompt_tokens = q->n_prompt,
        .completion_tokens = q->n_output,
        .truncated_tokens = s->truncated_tokens,
        .prompt_ids = q->tokens,
        .token_ids = q->tokens + q->n_prompt,
        .logprobs = q->logprobs,
        .model = r->model_name,
        .created = (int64_t)time(NULL),
    };
    r->prompt_tokens += (uint64_t)q->n_prompt;
    r->generated_tokens += (uint64_t)q->n_output;
    char why[160];
    if (q->finish == FINISH_ERROR) {
        o.error = q->error[0] ? q->error : "the engine failed";
        o.error_rc = JOB_ERR_ENGINE;
        report_failure(r, s, o.error);
    } else if (q->finish == FINISH_TIMEOUT) {
        job_timeout_error(&s->job, q->n_output, why, sizeof why);
        o.error = why;
        o.error_rc = JOB_ERR_TIMEOUT;
        report_failure(r, s, o.error);
    } else {
        r->completed++;
    }
    finish_slot(r, s, &o);
    s->seq = NULL;
    engine_release(r->eng, q);
}

/* Writes every finished slot at the head of the window. */
static void flush_ready(struct run *r)
{
    while (r->head < r->tail && r->slots[r->head % WINDOW].done) {
        struct slot *s = &r->slots[r->head % WINDOW];
        if (!r->write_failed && (fputs(s->out ? s->out : "{}", r->out) < 0 || fputc('\n', r->out) < 0))
            r->write_failed = true;
        free(s->out);
        s->out = NULL;
        r->head++;
    }
}

/* The progress bar's work under way, in jobs: a finished job not yet written counts whole, a
 * running one its tokens over what it is expected to generate (its max_tokens, or the finished
 * jobs' mean when that is less), at most 0.95 of a job; so the bar and its ETA move with the
 * tokens, not only with written lines. */
static double jobs_under_way(const struct run *r)
{
    long finished = r->completed + r->failed;
    double mean = finished > 0 ? (double)r->generated_tokens / (double)finished : 0;
    double partial = 0;
    for (long i = r->head; i < r->tail; i++) {
        const struct slot *s = &r->slots[i % WINDOW];
        if (s->done) { /* finished, waiting for an earlier line to be written */
            partial += 1;
            continue;
        }
        if (!s->seq || s->max_tokens <= 0)
            continue;
        double expect = mean >= 1 && mean < s->max_tokens ? mean : s->max_tokens;
        double f = (double)s->seq->n_output / expect;
        partial += f < 0.95 ? f : 0.95;
    }
    return partial;
}

/* Strips a trailing newline / CR; true when what is left is only whitespace. */
static bool blank(char *line, size_t *len)
{
    while (*len && (line[*len - 1] == '\n' || line[*len - 1] == '\r'))
        line[--*len] = 0;
    for (size_t i = 0; i < *len; i++)
        if (line[i] != ' ' && line[i] != '\t')
            return false;
    return true;
}

/* `llmq run` has one lane: the worker's per-queue caps do not apply, so they follow the engine's
 * (otherwise --max-num-seqs 2 would fail cfg_validate against queues.short_max_num_seqs). */
static void clamp_lanes(struct cfg *c)
{
    struct cfg_queues *q = &c->queues;
    const struct cfg_engine *e = &c->engine;
    int mlen = c->model.max_model_len;
    if (q->short_max_num_seqs > e->max_num_seqs)
        q->short_max_num_seqs = e->max_num_seqs;
    if (q->long_max_num_seqs > e->max_num_seqs)
        q->long_max_num_seqs = e->max_num_seqs;
    if (q->short_max_num_batched_tokens > e->max_num_batched_tokens)
        q->short_max_num_batched_tokens = e->max_num_batched_tokens;
    if (q->long_max_num_batched_tokens > e->max_num_batched_tokens)
        q->long_max_num_batched_tokens = e->max_num_batched_tokens;
    if (mlen && q->short_max_model_len > mlen)
        q->short_max_model_len = mlen;
    if (mlen && q->long_max_model_len > mlen)
        q->long_max_model_len = mlen;
    if (q->short_max_model_len && q->long_threshold_tokens >= q->short_max_model_len)
        q->long_threshold_tokens = q->short_max_model_len - 1;
}

static void run_free(struct run *r)
{
    if (r->slots) {
        for (long i = r->head; i < r->tail; i++) {
            sum_free(r->slots[i % WINDOW].sum);
            job_free(&r->slots[i % WINDOW].job);
            free(r->slots[i % WINDOW].out);
        }
        free(r->slots);
    }
    grammar_cache_free(r->grammars);
    engine_free(r->eng);
    tok_free(r->tok);
    chat_template_free(r->chat);
    model_free(r->model);
    if (r->in && r->in != stdin)
        fclose(r->in);
    if (r->out && r->out != stdout)
        fclose(r->out);
    progress_free(r->bar);
    cfg_free(&r->cfg);
}

/* Loads everything; returns 0, or the exit status. */
static int setup(struct run *r, const char *input, const char *output)
{
    char err[1024];
    struct stat si, so;
    if (strcmp(input, "-") && strcmp(output, "-") && stat(input, &si) == 0 && stat(output, &so) == 0 &&
        si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return cli_usage_error(CMD, "--input and --output are the same file");
    r->in = strcmp(input, "-") ? fopen(input, "rb") : stdin;
    if (!r->in) {
        fprintf(stderr, "llmq %s: cannot read %s: %s\n", CMD, input, strerror(errno));
        return 1;
    }
    const struct cfg *c = &r->cfg;
    r->model = model_load(c->model.path, err, sizeof err);
    if (!r->model) {
        fprintf(stderr, "llmq %s: model %s: %s\n", CMD, c->model.path, err);
        return 1;
    }
    const char *tok_dir = c->model.tokenizer[0] ? c->model.tokenizer : c->model.path;
    r->tok = tok_load_dir(tok_dir, err, sizeof err);
    if (!r->tok) {
        fprintf(stderr, "llmq %s: tokenizer %s: %s\n", CMD, tok_dir, err);
        return 1;
    }
    r->chat = chat_template_load(tok_dir, c->model.chat_template, err, sizeof err);
    if (!r->chat) {
        fprintf(stderr, "llmq %s: model %s: %s\n", CMD, c->model.path, err);
        return 1;
    }
    struct engine_opts eo = engine_cfg_opts(c);
    struct backend *be = backend_open(engine_cfg_backend(c), r->model, &eo.be, err, sizeof err);
    r->eng = be ? engine_open(r->model, r->tok, be, &eo, err, sizeof err) : NULL;
    if (!r->eng) {
        fprintf(stderr, "llmq %s: engine: %s\n", CMD, err);
        return 1;
    }
    r->grammars = grammar_cache_new();
    if (!r->grammars) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        return 1;
    }
    r->max_model_len = engine_max_model_len(r->eng, 0);
    engine_cfg_model_name(c, r->model_name, sizeof r->model_name);

    r->jopts = job_opts_default();
    job_defaults_from_cfg(&r->jopts.defaults, &c->sampling);
    if (c->sampling.use_generation_config)
        job_defaults_from_model(&r->jopts.defaults, &r->model->cfg, r->model->dir);
    r->jopts.max_bytes = c->queues.max_job_bytes;
    if (c->n_templates) {
        r->jopts.template_find = cfg_template_lookup;
        r->jopts.template_ctx = (void *)c;
    }
    r->slots = calloc(WINDOW, sizeof *r->slots);
    if (!r->slots) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        return 1;
    }
    r->out_path = output;
    r->out = strcmp(output, "-") ? fopen(output, "wb") : stdout;
    if (!r->out) {
        fprintf(stderr, "llmq %s: cannot write %s: %s\n", CMD, output, strerror(errno));
        return 1;
    }
    if (!r->quiet)
        r->bar = progress_new(stderr, "jobs", cli_count_lines(input, true));
    return 0;
}

/* The batch: read, step, write until every line is answered. Returns the exit status. */
static int run_batch(struct run *r)
{
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    bool eof = false;
    double t0 = llmq_mono_s();
    while (!eof || r->head < r->tail) {
        while (!eof && r->tail - r->head < WINDOW) {
            errno = 0;
            ssize_t n = getline(&line, &cap, r->in);
            if (n < 0) {
                if (ferror(r->in)) {
                    progress_clear(r->bar);
                    fprintf(stderr, "llmq %s: reading the input after line %ld: %s\n", CMD, lineno,
                            strerror(errno ? errno : EIO));
                    r->read_failed = true;
                }
                eof = true;
                break;
            }
            lineno++;
            size_t len = (size_t)n;
            if (!blank(line, &len))
                take_line(r, line, len, lineno);
        }
        flush_ready(r);
        if (engine_has_work(r->eng)) {
            struct engine_seq **changed;
            int n_changed = 0;
            engine_step(r->eng, &changed, &n_changed); /* a failed step finishes its seqs with FINISH_ERROR */
            for (int i = 0; i < n_changed; i++)
                if (changed[i]->finished)
                    take_seq(r, changed[i]);
            flush_ready(r);
        } else if (r->head < r->tail && !r->slots[r->head % WINDOW].done) {
            /* nothing runs, yet a line waits: the engine lost it; answer it rather than hang */
            struct slot *s = &r->slots[r->head % WINDOW];
            fail_slot(r, s, JOB_ERR_ENGINE, "the engine dropped the job");
        }
        struct engine_stats st;
        engine_get_stats(r->eng, &st);
        if (progress_due(r->bar))
            progress_set_partial(r->bar, jobs_under_way(r));
        progress_update(r->bar, r->head, (int64_t)st.generated_tokens);
    }
    free(line);
    progress_finish(r->bar);
    double dt = llmq_mono_s() - t0;
    if (fflush(r->out) || ferror(r->out) || r->write_failed) {
        fprintf(stderr, "llmq %s: writing %s failed: %s\n", CMD, r->out_path, strerror(errno ? errno : EIO));
        return 1;
    }
    if (r->reported > MAX_REPORTED)
        fprintf(stderr, "llmq %s: ... and %ld more failed lines\n", CMD, r->reported - MAX_REPORTED);
    if (!r->quiet)
        fprintf(
            stderr,
            "llmq %s: %ld job%s: %ld completed, %ld failed in %.2f s; %llu prompt + %llu generated tokens, "
            "%.1f generated tokens/s (%s backend)\n",
            CMD, r->completed + r->failed, r->completed + r->failed == 1 ? "" : "s", r->completed, r->failed,
            dt, (unsigned long long)r->prompt_tokens, (unsigned long long)r->generated_tokens,
            dt > 0 ? (double)r->generated_tokens / dt : 0.0, engine_backend_name(r->eng));
    return r->read_failed ? 1 : 0; /* what was read ran, but the input was not all read */
}

int cmd_run(int argc, char **argv)
{
    enum { O_CHAT_TEMPLATE = 256, O_QUIET };
    static const struct option own[] = {
        {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"config", required_argument, NULL, 'c'},
        {"chat-template", required_argument, NULL, O_CHAT_TEMPLATE},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct option longopts[sizeof own / sizeof own[0] + ENGINE_FLAGS_MAX];
    engine_flags_longopts(longopts, own, ENGINE_FLAGS_ENGINE);
    static const char shortopts[] = "m:i:o:c:h";
    /* flags are applied after the file, in the order given */
    struct engine_cfg_flags flags = {0};
    const char *input = NULL, *output = NULL, *config = cfg_default_path();
    bool quiet = false;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        int engine_flag = engine_flags_opt(&flags, opt, optarg, NULL);
        if (engine_flag < 0)
            return cli_usage_error(CMD, "too many options");
        if (engine_flag > 0)
            continue;
        switch (opt) {
        case 'h':
            usage(stdout);
            return 0;
        case 'i':
            input = optarg;
            continue;
        case 'o':
            output = optarg;
            continue;
        case 'c':
            config = optarg;
            continue;
        case O_CHAT_TEMPLATE:
            if (engine_cfg_flag_add(&flags, "model.chat_template", optarg, "--chat-template"))
                return cli_usage_error(CMD, "too many options");
            continue;
        case O_QUIET:
            quiet = true;
            continue;
        default:
            return cli_bad_option(CMD, argc, argv, longopts, shortopts);
        }
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!input)
        return cli_usage_error(CMD, "--input is required");
    if (!output)
        return cli_usage_error(CMD, "--output is required");

    struct run r;
    memset(&r, 0, sizeof r);
    r.quiet = quiet;
    char err[1024];
    int rc = engine_cfg_load(CMD, config, &flags, &r.cfg);
    if (rc) {
        cfg_free(&r.cfg);
        return rc;
    }
    clamp_lanes(&r.cfg);
    if (cfg_validate(&r.cfg, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", CMD, err);
        cfg_free(&r.cfg);
        return 1;
    }
    if (!r.cfg.model.path[0]) {
        cfg_free(&r.cfg);
        return cli_usage_error(CMD, "--model is required (or model.path in the config)");
    }
    rc = setup(&r, input, output);
    if (rc == 0)
        rc = run_batch(&r);
    run_free(&r);
    return rc;
}
