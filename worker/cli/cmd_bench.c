/* `llmq bench`: a named workload through the real engine, one JSON line of results.
 *
 * Every request is submitted at t = 0 (random prompt ids, seeded; greedy; EOS ignored, exactly
 * output_len tokens each) and the engine steps until all are done. A warm-up request runs first
 * (not timed). The backend is wrapped (engine/bench.h) so that every step the engine runs adds
 * to the roofline: ideal time over real time is the roofline efficiency.
 *
 * --shared-prefix N gives every prompt the same first N tokens (a summarization pipeline's
 * instruction); the JSON reports the prefix cache's queries and hits in tokens over the timed
 * requests (engine_stats.prefix_query_tokens / prefix_hit_tokens).
 *
 * --background W[:N] runs the worker's two lanes (queues.* caps, as `llmq worker` sets them): N
 * requests of workload W go to the long lane first, and once the long lane has run a step the
 * timed workload is submitted to the short lane. The timed numbers are the foreground's; when
 * its last request finishes, the background's progress is recorded and the rest of it cancelled.
 *
 * --workload mapreduce summarizes documents longer than a context (bench_mapreduce.h): the map
 * level's requests are submitted at t = 0, and each reduce level's as its document's level before
 * finishes, into the same running engine; the run ends when every document has its summary.
 * docs/BENCH.md describes every key of the output. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/bench.h"
#include "engine/engine.h"
#include "engine/fp8.h"
#include "engine/gpu.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/model.h"
#include "engine/random_model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/hash.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "engine/util/scratch_dir.h"
#include "worker/backends/backend_open.h"
#include "worker/cli/bench_mapreduce.h"
#include "worker/cli/cli.h"
#include "worker/cli/engine_flags.h"
#include "worker/cli/progress.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#ifdef LLMQ_HAVE_CUDA_BACKEND
#include "engine/cuda_backend.h"
#endif

static const char CMD[] = "bench";

#define PROMPT_ID_RANGE 150000 /* prompt ids are drawn from [0, min(vocab, this)), as the peer does */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int parse_int(const char *flag, const char *s, int lo, int *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > 0x7fffffffLL)
        return cli_usage_error(CMD, "%s: '%s' is not an integer >= %d", flag, s, lo);
    *out = (int)v;
    return 0;
}

/* {"engine.num_kv_blocks": {"value": "60", "from": "env LLMQ_ENGINE_NUM_KV_BLOCKS"}, ...}: every key of
 * the model, engine and queues sections that is not at its default, and where it came from (the file,
 * an LLMQ_* variable, a flag), so that a benchmark line says what it ran; those from the environment
 * are also logged, as nothing on the command line shows them. */
static json_t *non_default_settings(const struct cfg *c)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    json_t *o = json_object();
    for (size_t i = 0; o && i < n; i++) {
        const struct cfg_key *k = &keys[i];
        if (c->origin[i].source == CFG_SRC_DEFAULT ||
            (strcmp(k->section, "model") && strcmp(k->section, "engine") && strcmp(k->section, "queues")))
            continue;
        char key[128], value[512], from[512];
        snprintf(key, sizeof key, "%s.%s", k->section, k->name);
        cfg_format_value(c, k, value, sizeof value);
        cfg_format_origin(c, k, from, sizeof from);
        json_object_set_new(o, key, json_pack("{s:s, s:s}", "value", value, "from", from));
        if (c->origin[i].source == CFG_SRC_ENV)
            log_info("bench: %s = %s from the environment (%s)", key, value, c->origin[i].name);
    }
    return o;
}

/* A tokenizer for random-weights runs (the engine needs one for text; random ids have none):
 * the minimal byte-level one make-tiny-model writes, from a temporary folder. */
static struct tok *scratch_tokenizer(char *err, size_t errlen)
{
    char dir[512];
    if (scratch_dir_make(getenv("TMPDIR"), "bench", dir, sizeof dir)) {
        snprintf(err, errlen, "cannot create a temporary folder %s: %s", dir, strerror(errno));
        return NULL;
    }
    struct tiny_opts o = tiny_opts_default();
    o.layers = 1;
    o.hidden = 16;
    o.intermediate = 16;
    o.heads = 2;
    o.kv_heads = 1;
    struct tok *t = NULL;
    if (tiny_model_write(dir, &o, err, errlen) == 0)
        t = tok_load_dir(dir, err, errlen);
    scratch_dir_remove(dir);
    return t;
}

static const char *base_name(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/')
        s--;
    return s;
}

/* Whether wl is the map-reduce workload, whose requests its plan makes (bench_mapreduce.h). */
static bool is_mapreduce(const struct bench_workload *wl)
{
    return !strcmp(wl->name, "mapreduce");
}

/* One group of requests: the timed foreground, or the background in the long lane. */
struct group {
    const struct bench_workload *wl;
    int n_req, in_len, out_len, lane;
    int32_t *prompts;        /* [n_req][in_len] */
    struct engine_seq **seq; /* [n_req], NULL once released */
    double *last;            /* [n_req] when its last token came (for inter-token latency) */
    uint64_t *digest;        /* [n_req] FNV-1a of the request's output ids (output_digest) */
    int done;                /* released */
};

/* One run of `llmq bench`, from its settings to the numbers of its line. */
struct bench {
    /* settings: the flags over the configuration */
    struct engine_opts eo;  /* the engine's options */
    const char *backend;    /* engine.backend: auto, cpu or cuda */
    const char *be_name;    /* the backend it runs: cpu or cuda */
    int max_model_len;      /* model.max_model_len; 0: decided in open_engine */
    char model_dir[4096];   /* model.path (--model) */
    char tok_dir[4096];     /* model.tokenizer; "": the model's folder */
    char tuning_file[4096]; /* engine.gemm_tuning_file (eo.be borrows it) */
    json_t *settings;       /* non_default_settings(), for the line */
    bool lanes;             /* in the worker's two lanes */
    int shared;             /* --shared-prefix */
    uint64_t seed;          /* the prompts' seed */
    /* what runs */
    struct group fg, bg;
    bool has_bg;
    /* mapreduce: --input-len, --doc-len, --overlap, documents (--num-prompts), a reduce prompt's
     * summary tokens; its plan (fg's requests are its slots; NULL for other workloads); the prompt
     * being submitted [bench_mr_max_prompt] */
    int chunk, doc_len, overlap, n_docs, mr_budget;
    struct bench_mr *mr;
    int32_t *mr_prompt;
    struct model *model;
    bool random;
    char model_name[256];
    struct tok *tok;
    int vocab; /* prompt ids are below this */
    struct engine *eng;
    struct backend *be;         /* the wrapper, owned by the engine */
    struct bench_roofline roof; /* what the wrapper adds up, step by step */
    struct grammar *grammar;    /* --response-format: every timed request's; NULL without */
    char rf_name[256];          /* its file's base name */
    double compile_s;           /* compiling it (schema check and grammar) */
    /* the timed run */
    double *ttft, *itl;
    size_t n_ttft, n_itl, cap_itl;
    int64_t fg_tokens; /* generated by the foreground while recorded */
    int failed;
    char first_error[512];
    int run_rc;                       /* run_engine's: -1 when a request failed */
    struct engine_stats st0, st;      /* the engine's counters before the timed run and at its end */
    struct bench_roofline roof_timed; /* the roofline when the foreground finished */
    double t_bg, t0;                  /* monotonic: the background's submission, the workload's */
    double secs;                      /* the workload's seconds */
    double wall;                      /* the roofline's window: from the first submission */
    /* the background at the moment the foreground finished */
    int bg_finished, bg_prefilled;
    int64_t bg_output_tokens;
};

static void group_free(struct group *g)
{
    free(g->prompts);
    free(g->seq);
    free(g->last);
    free(g->digest);
}

static void bench_free(struct bench *b)
{
    gr_unref(b->grammar);
    engine_free(b->eng);
    bench_mr_free(b->mr);
    free(b->mr_prompt);
    tok_free(b->tok);
    if (b->random)
        random_model_free(b->model);
    else
        model_free(b->model);
    group_free(&b->fg);
    group_free(&b->bg);
    free(b->ttft);
    free(b->itl);
    json_decref(b->settings);
}

/* A request's user pointer: its index + 1 in the foreground, minus index + 1 in the background,
 * 0 for the warm-up. */
static void on_failure(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void on_failure(struct bench *b, const char *fmt, ...)
{
    if (b->failed++)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->first_error, sizeof b->first_error, fmt, ap);
    va_end(ap);
}

static struct engine_request request(const int32_t *prompt, int n, int out, uint64_t seed, int lane,
                                     intptr_t user);

/* mapreduce: submits every request of the plan that is ready (user id: its slot + 1, seed: its slot). */
static void mr_submit(struct bench *b)
{
    char err[1024];
    int n, s;
    double t = llmq_mono_s();
    while ((s = bench_mr_next(b->mr, b->mr_prompt, &n)) >= 0) {
        struct engine_request r = request(b->mr_prompt, n, b->fg.out_len, (uint64_t)s, b->fg.lane, s + 1);
        b->fg.seq[s] = engine_add(b->eng, &r, err, sizeof err);
        if (!b->fg.seq[s])
            on_failure(b, "a %d-token request: %s", n, err);
        b->fg.last[s] = t;
    }
}

/* mapreduce: slot idx's summary is done (before q is released). */
static void mr_finished(struct bench *b, int idx, const struct engine_seq *q, double t)
{
    char err[256];
    if (bench_mr_finished(b->mr, idx, q->tokens + q->n_prompt, q->n_output, t, err, sizeof err))
        on_failure(b, "%s", err);
}

enum until {
    UNTIL_IDLE,       /* the engine has no work */
    UNTIL_FG_DONE,    /* every foreground request is done */
    UNTIL_BG_STARTED, /* the background's lane has run tokens */
};

/* Steps the engine until `until`. Records the foreground's latencies and tokens when record is set. */
static int run_engine(struct bench *b, struct progress *bar, bool record, enum until until)
{
    struct engine_stats st;
    uint64_t bg0 = 0;
    if (until == UNTIL_BG_STARTED) {
        engine_get_stats(b->eng, &st);
        bg0 = st.lane_computed_tokens[b->bg.lane];
    }
    while (engine_has_work(b->eng)) {
        if (until == UNTIL_FG_DONE && b->fg.done == b->fg.n_req)
            break;
        if (until == UNTIL_BG_STARTED) {
            engine_get_stats(b->eng, &st);
            if (st.lane_computed_tokens[b->bg.lane] != bg0)
                break;
        }
        struct engine_seq **ch;
        int nc;
        engine_step(b->eng, &ch, &nc);
        double t = llmq_mono_s();
        for (int i = 0; i < nc; i++) {
            struct engine_seq *q = ch[i];
            intptr_t u = (intptr_t)q->user;
            struct group *g = u > 0 ? &b->fg : u < 0 ? &b->bg : NULL;
            int idx = u > 0 ? (int)u - 1 : u < 0 ? (int)-u - 1 : -1;
            if (record && g == &b->fg && q->n_new_output) {
                if (q->n_output == 1)
                    b->ttft[b->n_ttft++] = q->t_first_token - q->t_arrival;
                else if (b->n_itl < b->cap_itl)
                    b->itl[b->n_itl++] = t - g->last[idx];
                g->last[idx] = t;
                b->fg_tokens++;
            }
            if (!q->finished)
                continue;
            if (q->finish == FINISH_ERROR)
                on_failure(b, "%s", q->error);
            else if (g && q->finish != FINISH_CANCELLED && q->n_output != g->out_len && !b->grammar)
                on_failure(b, "a request finished with %d tokens, not %d", q->n_output, g->out_len);
            else if (g == &b->fg && b->mr && q->finish != FINISH_CANCELLED) /* its level may be complete */
                mr_finished(b, idx, q, t);
            if (g) {
                g->digest[idx] =
                    fnv1a(FNV1A_INIT, q->tokens + q->n_prompt, (size_t)q->n_output * sizeof *q->tokens);
                g->seq[idx] = NULL;
                g->done++;
            }
            engine_release(b->eng, q);
        }
        if (b->mr && record)
            mr_submit(b); /* the next levels of documents whose level finished */
        progress_update(bar, b->fg.done, b->fg_tokens);
    }
    return b->failed ? -1 : 0;
}

static struct engine_request request(const int32_t *prompt, int n, int out, uint64_t seed, int lane,
                                     intptr_t user)
{
    struct engine_request r = engine_request_default();
    r.prompt = prompt;
    r.n_prompt = n;
    r.sp.temperature = 0;
    r.sp.seed = seed;
    r.has_seed = true;
    r.max_tokens = out;
    r.min_tokens = out;
    r.ignore_eos = true;
    r.lane = lane;
    r.user = (void *)user;
    return r;
}

/* Random prompts of g; the first `shared` tokens of each come from one draw. For mapreduce only
 * room for its requests: its plan makes the prompts. */
static int make_prompts(struct group *g, int vocab, uint64_t seed, int shared)
{
    bool planned = is_mapreduce(g->wl);
    g->prompts = planned ? NULL : malloc((size_t)g->n_req * (size_t)g->in_len * sizeof *g->prompts);
    g->seq = calloc((size_t)g->n_req, sizeof *g->seq);
    g->last = calloc((size_t)g->n_req, sizeof *g->last);
    g->digest = calloc((size_t)g->n_req, sizeof *g->digest);
    if ((!g->prompts && !planned) || !g->seq || !g->last || !g->digest)
        return -1;
    if (planned)
        return 0;
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1, ps = seed * 0x9e3779b97f4a7c15ull + 0x70726566ull;
    for (int i = 0; i < g->n_req; i++)
        for (int j = 0; j < g->in_len; j++) {
            int32_t *p = &g->prompts[(size_t)i * g->in_len + j];
            if (j < shared)
                *p = i == 0 ? (int32_t)(splitmix64(&ps) % (uint64_t)vocab) : g->prompts[j];
            else
                *p = (int32_t)(splitmix64(&s) % (uint64_t)vocab);
        }
    return 0;
}

/* Submits every request of g (user ids as run_engine reads them). */
static int submit(struct bench *b, struct group *g, bool background, char *err, size_t errlen)
{
    double t = llmq_mono_s();
    for (int i = 0; i < g->n_req; i++) {
        intptr_t user = background ? -(intptr_t)(i + 1) : (intptr_t)(i + 1);
        uint64_t seed = (uint64_t)i + (background ? 1000000007ull : 0);
        struct engine_request r =
            request(g->prompts + (size_t)i * g->in_len, g->in_len, g->out_len, seed, g->lane, user);
        if (b->grammar && !background) { /* the output ends where the grammar allows EOS, or at out_len */
            r.grammar = b->grammar;
            r.ignore_eos = false;
            r.min_tokens = 0;
        }
        g->seq[i] = engine_add(b->eng, &r, err, errlen);
        if (!g->seq[i])
            return -1;
        g->last[i] = t;
    }
    return 0;
}

static double r3(double x)
{
    return round(x * 1000) / 1000;
}
static double r1(double x)
{
    return round(x * 10) / 10;
}
static double r4(double x)
{
    return round(x * 1e4) / 1e4;
}
static double r6(double x)
{
    return round(x * 1e6) / 1e6;
}

static int parse_background(const char *s, const struct bench_workload **wl, int *n)
{
    char name[64];
    const char *colon = strchr(s, ':');
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    if (len >= sizeof name)
        return cli_usage_error(CMD, "--background: '%s' (expected W or W:N, W one of %s)", s,
                               bench_workload_names());
    memcpy(name, s, len);
    name[len] = 0;
    *wl = bench_workload_find(name);
    if (!*wl)
        return cli_usage_error(CMD, "--background: workload '%s' (expected %s)", name,
                               bench_workload_names());
    if (is_mapreduce(*wl))
        return cli_usage_error(CMD, "--background: %s does not run as a background", name);
    *n = 0;
    if (colon)
        return parse_int("--background (its :N)", colon + 1, 1, n);
    return 0;
}

/* ---- the command line: one table, parsed by one loop, --help printed from it */

/* What the flags give besides configuration keys. */
struct bench_args {
    const char *shape;                  /* --random-weights */
    const char *workload;               /* --workload */
    const char *config;                 /* --config */
    int num_prompts, in_len, out_len;   /* 0: the workload's */
    int doc_len, overlap;               /* mapreduce's --doc-len (0) and --overlap (-1: the workload's) */
    int shared;                         /* --shared-prefix */
    const struct bench_workload *bg_wl; /* --background W; NULL without */
    int bg_n, bg_in, bg_out;            /* its :N and lengths; 0: W's */
    int seed;                           /* --seed; -1 when not given (prompts use 0) */
    const char *response_format;        /* --response-format FILE */
    bool lanes;                         /* the worker's two lanes (--lanes, or implied) */
    struct engine_cfg_flags flags;      /* configuration keys the flags set, in order */
};

enum opt_kind {
    OPT_INT,        /* an int of struct bench_args at `field`, at least `min` */
    OPT_STR,        /* a string of struct bench_args at `field` */
    OPT_TRUE,       /* no argument: a bool of struct bench_args at `field` */
    OPT_BACKGROUND, /* W[:N] into bg_wl and bg_n */
    OPT_HELP,
};

struct bench_opt {
    const char *name; /* the long flag, "--" included */
    char letter;      /* the short flag, or 0 */
    const char *arg;  /* its argument in --help; NULL: it takes none */
    enum opt_kind kind;
    size_t field;      /* OPT_INT, OPT_STR, OPT_TRUE: offsetof(struct bench_args, ...) */
    int min;           /* OPT_INT: the least value */
    bool lanes;        /* implies --lanes */
    const char *help;  /* --help text; each '\n' starts a continuation line */
};

#define ARG(f) offsetof(struct bench_args, f)

/* In the order --help lists them. */
static const struct bench_opt opts[] = {
    {"--random-weights", 'r', "SHAPE", OPT_STR, .field = ARG(shape),
     .help = "qwen3-14b | qwen3-8b | qwen3-0.6b | qwen3-30b-a3b (Qwen3-MoE),\n"
             "random bf16 weights, no files (the CPU backend takes only\n"
             "qwen3-0.6b)"},
    {"--workload", 0, "W", OPT_STR, .field = ARG(workload),
     .help = "chat (1000 x 512 in / 128 out), decode (512 x 128 / 1024),\n"
             "summarize (200 x 4096 / 256), longdoc (8 x 65536 / 256),\n"
             "single (1 x 128 / 512), mapreduce (50 documents x 200000\n"
             "tokens, chunks of 8192, 256-token summaries, reduced in a tree)"},
    {"--num-prompts", 'n', "N", OPT_INT, .field = ARG(num_prompts), .min = 1,
     .help = "requests (default: the workload's; mapreduce: documents)"},
    {"--input-len", 0, "N", OPT_INT, .field = ARG(in_len), .min = 1,
     .help = "prompt tokens per request (default: the workload's; mapreduce:\n"
             "a chunk's document tokens)"},
    {"--output-len", 0, "N", OPT_INT, .field = ARG(out_len), .min = 1,
     .help = "generated tokens per request (default: the workload's)"},
    {"--doc-len", 0, "N", OPT_INT, .field = ARG(doc_len), .min = 1,
     .help = "mapreduce: tokens per document (default 200000)"},
    {"--overlap", 0, "N", OPT_INT, .field = ARG(overlap), .min = 0,
     .help = "mapreduce: tokens a chunk shares with the next (default: 1/64\n"
             "of the chunk, 128 for 8192)"},
    {"--shared-prefix", 0, "N", OPT_INT, .field = ARG(shared), .min = 0,
     .help = "the first N prompt tokens are the same in every request"},
    {"--background", 0, "W[:N]", OPT_BACKGROUND, .lanes = true,
     .help = "N requests (default: W's) of workload W run in the long lane\n"
             "while the workload runs in the short lane (implies --lanes)"},
    {"--background-input-len", 0, "N", OPT_INT, .field = ARG(bg_in), .min = 1,
     .help = "the background's prompt tokens (default: W's)"},
    {"--background-output-len", 0, "N", OPT_INT, .field = ARG(bg_out), .min = 1,
     .help = "the background's generated tokens (default: W's)"},
    {"--lanes", 0, NULL, OPT_TRUE, .field = ARG(lanes),
     .help = "run in the worker's short lane of two (queues.short_*/long_*)"},
    {"--config", 'c', "FILE", OPT_STR, .field = ARG(config), .lanes = true,
     .help = "the model, engine and queues sections of this llmq.yaml (as\n"
             "llmq worker reads them); implies --lanes"},
    {"--seed", 0, "N", OPT_INT, .field = ARG(seed), .min = 0, .help = "prompt seed (default 0)"},
    {"--response-format", 0, "FILE", OPT_STR, .field = ARG(response_format),
     .help = "every request of the workload under this structured output: a JSON file holding\n"
             "a response_format ({\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}\n"
             "or {\"type\": \"json_object\"}) or a bare JSON Schema; outputs then end where\n"
             "the grammar allows EOS (or at the output length)"},
    {"--help", 'h', NULL, OPT_HELP, .help = "this text"},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

/* --help: the flags from the tables; the engine's defaults printed are the configuration's (llmq
 * config), so the text cannot drift from them. */
static void usage(FILE *f)
{
    fputs(
        "Usage: llmq bench (--model DIR | --random-weights SHAPE) --workload W [options]\n"
        "\n"
        "Runs a fixed workload through the engine and prints one JSON line on stdout: requests/s, output\n"
        "and total tokens/s, TTFT and inter-token latency percentiles, peak GPU memory, KV cache size,\n"
        "preemptions, prefix cache hits and the roofline efficiency. Prompts are random token ids; every\n"
        "request generates exactly its output length (EOS ignored, greedy). All requests are submitted\n"
        "at once. docs/BENCH.md explains the output. The engine's options come as `llmq run` and `llmq\n"
        "worker` take them: the defaults below, then --config FILE, then LLMQ_* variables, then the flags.\n"
        "\n",
        f);
    for (size_t i = 0; i < N_OPTS; i++)
        engine_flags_usage_line(f, opts[i].letter, opts[i].name, opts[i].arg, opts[i].help);
    engine_flags_usage_line(f, 0, "--version", NULL, "llmq's version");
    fputs("\nEngine and model (the same flags as llmq run and llmq worker take; without --config,\n"
          "--max-model-len defaults to the longest request; a lane's cap implies --lanes):\n",
          f);
    engine_flags_usage(f, ENGINE_FLAGS_ENGINE | ENGINE_FLAGS_LANES);
    fputs("\nExit status: 0 every request finished, 1 the run failed, 2 the command line is wrong.\n", f);
}

/* Parses argv into *a. Returns 0, -1 after --help (printed), or the exit status of a usage error. */
static int parse_args(int argc, char **argv, struct bench_args *a)
{
    struct option own[N_OPTS + 1];
    char shortopts[2 * N_OPTS + 3] = "m:"; /* --model is an engine flag */
    size_t ns = 2;
    for (size_t i = 0; i < N_OPTS; i++) {
        int val = opts[i].letter ? opts[i].letter : 256 + (int)i;
        own[i] = (struct option){opts[i].name + 2, opts[i].arg ? required_argument : no_argument, NULL, val};
        if (opts[i].letter) {
            shortopts[ns++] = opts[i].letter;
            if (opts[i].arg)
                shortopts[ns++] = ':';
        }
    }
    own[N_OPTS] = (struct option){NULL, 0, NULL, 0};
    shortopts[ns] = 0;
    struct option longopts[N_OPTS + ENGINE_FLAGS_MAX + 1];
    engine_flags_longopts(longopts, own, ENGINE_FLAGS_ENGINE | ENGINE_FLAGS_LANES);
    memset(a, 0, sizeof *a);
    a->seed = -1;
    a->overlap = -1;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        bool lanes = false;
        int engine_flag = engine_flags_opt(&a->flags, c, optarg, &lanes); /* applied over --config, LLMQ_* */
        if (engine_flag < 0)
            return cli_usage_error(CMD, "too many options");
        a->lanes = a->lanes || lanes;
        if (engine_flag > 0)
            continue;
        const struct bench_opt *o = NULL;
        for (size_t i = 0; i < N_OPTS && !o; i++)
            if (c == (opts[i].letter ? opts[i].letter : 256 + (int)i))
                o = &opts[i];
        if (!o)
            return cli_bad_option(CMD, argc, argv, longopts, shortopts);
        char *field = (char *)a + o->field;
        int rc = 0;
        switch (o->kind) {
        case OPT_INT:
            rc = parse_int(o->name, optarg, o->min, (int *)(void *)field);
            break;
        case OPT_STR:
            *(const char **)(void *)field = optarg;
            break;
        case OPT_TRUE:
            *(bool *)field = true;
            break;
        case OPT_BACKGROUND:
            rc = parse_background(optarg, &a->bg_wl, &a->bg_n);
            break;
        case OPT_HELP:
            usage(stdout);
            return -1;
        }
        if (rc)
            return rc;
        a->lanes = a->lanes || o->lanes;
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    bool model_given = false;
    for (int i = 0; i < a->flags.n; i++)
        model_given = model_given || !strcmp(a->flags.v[i].key, "model.path");
    if (model_given && a->shape)
        return cli_usage_error(CMD, "give one of --model DIR or --random-weights SHAPE, not both");
    if (!a->workload)
        return cli_usage_error(CMD, "--workload is required (%s)", bench_workload_names());
    if ((a->bg_in || a->bg_out) && !a->bg_wl)
        return cli_usage_error(CMD, "--background-input-len and --background-output-len need --background");
    if (strcmp(a->workload, "mapreduce") && (a->doc_len || a->overlap >= 0))
        return cli_usage_error(CMD, "--doc-len and --overlap are for --workload mapreduce");
    if (!strcmp(a->workload, "mapreduce") && (a->shared || a->bg_wl || a->response_format))
        return cli_usage_error(CMD, "--workload mapreduce takes no --shared-prefix, --background or "
                                    "--response-format");
    return 0;
}

/* ---- the workload: settings, model, engine, requests, the timed run, the line */

/* Sizes of the timed workload and of the background from the flags; the engine's options as
 * `llmq run` and `llmq worker` take them: defaults < --config < LLMQ_* < flags, with lanes the
 * worker's two from the queues section. Returns 0 or an exit status after printing why. */
static int bench_settings(struct bench *b, const struct bench_args *a)
{
    b->fg.wl = bench_workload_find(a->workload);
    if (!b->fg.wl)
        return cli_usage_error(CMD, "--workload: '%s' (expected %s)", a->workload, bench_workload_names());
    b->fg.n_req = a->num_prompts ? a->num_prompts : b->fg.wl->requests;
    b->fg.in_len = a->in_len ? a->in_len : b->fg.wl->input_len;
    b->fg.out_len = a->out_len ? a->out_len : b->fg.wl->output_len;
    if (is_mapreduce(b->fg.wl)) { /* mapreduce: n_req documents; the longest prompt is a chunk's */
        b->chunk = b->fg.in_len;
        b->doc_len = a->doc_len ? a->doc_len : BENCH_MAPREDUCE_DOC_LEN;
        /* the workload's overlap in proportion to the chunk: 1/64 of it, 128 for 8192 */
        b->overlap = a->overlap >= 0
                         ? a->overlap
                         : (int)((long long)b->chunk * BENCH_MAPREDUCE_OVERLAP / b->fg.wl->input_len);
        if (b->overlap >= b->chunk)
            return cli_usage_error(CMD, "--overlap %d is not below the chunk (--input-len %d)", b->overlap,
                                   b->chunk);
        b->fg.in_len = b->chunk + BENCH_MR_TEMPLATE_TOKENS;
    }
    if (a->shared > b->fg.in_len)
        return cli_usage_error(CMD, "--shared-prefix %d is longer than the prompts (%d tokens)", a->shared,
                               b->fg.in_len);
    if (a->bg_wl) {
        b->has_bg = true;
        b->bg.wl = a->bg_wl;
        b->bg.n_req = a->bg_n ? a->bg_n : a->bg_wl->requests;
        b->bg.in_len = a->bg_in ? a->bg_in : a->bg_wl->input_len;
        b->bg.out_len = a->bg_out ? a->bg_out : a->bg_wl->output_len;
    }
    b->lanes = a->lanes;
    b->shared = a->shared;
    b->seed = a->seed < 0 ? 0 : (uint64_t)a->seed;

    struct cfg cf;
    int rc = engine_cfg_load(CMD, a->config, &a->flags, &cf);
    if (rc == 0) {
        b->eo = engine_cfg_opts(&cf);
        b->backend = engine_cfg_backend(&cf);
        if (b->lanes)
            engine_cfg_lanes(&b->eo, &cf);
        b->max_model_len = cf.model.max_model_len;
        snprintf(b->model_dir, sizeof b->model_dir, "%s", cf.model.path);
        snprintf(b->tok_dir, sizeof b->tok_dir, "%s", cf.model.tokenizer);
        snprintf(b->tuning_file, sizeof b->tuning_file, "%s", cf.engine.gemm_tuning_file);
        b->eo.be.gemm_tuning_file = b->tuning_file;
        b->settings = non_default_settings(&cf);
    }
    cfg_free(&cf);
    if (rc)
        return rc;
    if (!a->shape && !b->model_dir[0])
        return cli_usage_error(CMD, "give one of --model DIR or --random-weights SHAPE (or model.path "
                                    "in --config)");
    if (b->lanes) {
        b->fg.lane = ENGINE_CFG_LANE_SHORT;
        b->bg.lane = ENGINE_CFG_LANE_LONG;
    }
    return 0;
}

/* The model (random weights of a shape, or a folder) and its tokenizer, and which backend runs
 * them: decided here so random weights know whether to live on the host. */
static int open_model(struct bench *b, const struct bench_args *a)
{
    char err[1024], gpu[256] = "";
    bool gpu_ok = gpu_backend_built() && gpu_describe(gpu, sizeof gpu) == 0;
    b->be_name = strcmp(b->backend, "auto") ? b->backend : gpu_ok ? "cuda" : "cpu";
    if (a->shape) {
        struct model_config cfg, small;
        if (random_model_config(a->shape, &cfg, err, sizeof err))
            return cli_usage_error(CMD, "--random-weights: %s", err);
        random_model_config("qwen3-0.6b", &small, err, sizeof err);
        if (!strcmp(b->be_name, "cpu") && random_model_params(&cfg) > random_model_params(&small)) {
            fprintf(stderr,
                    "llmq %s: --random-weights %s (%.1f B parameters) needs the CUDA backend%s; the CPU "
                    "backend runs "
                    "random weights only up to qwen3-0.6b\n",
                    CMD, a->shape, (double)random_model_params(&cfg) / 1e9,
                    !strcmp(b->backend, "auto")
                        ? (gpu_backend_built() ? " (no usable GPU here)" : " (not built in)")
                        : "");
            return 1;
        }
        b->random = true;
        b->model = random_model_create(&cfg, !strcmp(b->be_name, "cpu"), err, sizeof err);
        if (!b->model) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            return 1;
        }
        /* model.tokenizer when given (real masks for --response-format), else a scratch one */
        b->tok =
            b->tok_dir[0] ? tok_load_dir(b->tok_dir, err, sizeof err) : scratch_tokenizer(err, sizeof err);
        snprintf(b->model_name, sizeof b->model_name, "%s", a->shape);
    } else {
        b->model = model_load(b->model_dir, err, sizeof err);
        if (!b->model) {
            fprintf(stderr, "llmq %s: model %s: %s\n", CMD, b->model_dir, err);
            return 1;
        }
        b->tok = tok_load_dir(b->tok_dir[0] ? b->tok_dir : b->model_dir, err, sizeof err);
        snprintf(b->model_name, sizeof b->model_name, "%.200s", base_name(b->model_dir));
    }
    if (!b->tok) {
        fprintf(stderr, "llmq %s: tokenizer: %s\n", CMD, err);
        return 1;
    }
    return 0;
}

/* The engine over a measuring wrapper of the backend, with room for the longest request. */
static int open_engine(struct bench *b, const struct bench_args *a)
{
    char err[1024];
    int longest = b->fg.in_len + b->fg.out_len;
    if (b->has_bg && b->bg.in_len + b->bg.out_len > longest)
        longest = b->bg.in_len + b->bg.out_len;
    /* max_model_len: the flag or the file's; else with --config the worker's rule (the model's), so that
     * the engine is the worker's; else the longest request (no memory or graphs for unused length) */
    b->eo.be.max_model_len = b->max_model_len ? b->max_model_len
                             : a->config      ? b->model->cfg.max_position
                                              : longest;
    if (a->seed >= 0)
        b->eo.seed = (uint64_t)a->seed;
    struct backend *inner = backend_open(b->be_name, b->model, &b->eo.be, err, sizeof err);
    if (!inner) {
        fprintf(stderr, "llmq %s: backend %s: %s\n", CMD, b->be_name, err);
        return 1;
    }
    b->be = bench_wrap_backend(inner, &b->model->cfg, &b->roof);
    if (b->be)
        b->eng = engine_open(b->model, b->tok, b->be, &b->eo, err, sizeof err);
    if (!b->eng) {
        fprintf(stderr, "llmq %s: engine: %s\n", CMD, b->be ? err : "out of memory");
        return 1;
    }
    for (int gi = 0; gi < (b->has_bg ? 2 : 1); gi++) {
        const struct group *g = gi ? &b->bg : &b->fg;
        int cap = engine_max_model_len(b->eng, g->lane);
        if (g->in_len + g->out_len > cap) {
            fprintf(stderr,
                    "llmq %s: the %s needs %d tokens per sequence; the engine holds %d in its lane "
                    "(--max-model-len, or the KV cache is too small)\n",
                    CMD, gi ? "background" : "workload", g->in_len + g->out_len, cap);
            return 1;
        }
    }
    return 0;
}

/* --response-format: the file's schema compiled into a grammar against the engine's vocabulary. */
static int compile_response_format(struct bench *b, const char *path)
{
    char err[1024];
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        fprintf(stderr, "llmq %s: --response-format %s:%d: %s\n", CMD, path, je.line, je.text);
        return 1;
    }
    snprintf(b->rf_name, sizeof b->rf_name, "%s", base_name(path));
    double t0 = llmq_mono_s();
    const struct gr_vocab *v = engine_grammar_vocab(b->eng, err, sizeof err);
    double t1 = llmq_mono_s();
    const char *type = json_string_value(json_object_get(j, "type"));
    const json_t *schema = j;
    bool any_object = type && !strcmp(type, "json_object");
    if (type && !strcmp(type, "json_schema"))
        schema = json_object_get(json_object_get(j, "json_schema"), "schema");
    struct js_schema *js = NULL;
    if (v && !any_object) {
        js = schema ? js_compile(schema, err, sizeof err) : NULL;
        if (!schema)
            snprintf(err, sizeof err, "json_schema.schema is missing");
    }
    if (v && (any_object || js))
        b->grammar = any_object ? gr_compile_json_object(v, err, sizeof err)
                                : gr_compile_schema(js, v, err, sizeof err);
    b->compile_s = llmq_mono_s() - t1;
    js_free(js);
    json_decref(j);
    if (!b->grammar) {
        fprintf(stderr, "llmq %s: --response-format %s: %s\n", CMD, path, err);
        return 1;
    }
    log_info("bench: response format %s compiled in %.1f ms (vocabulary trie %.1f ms)", b->rf_name,
             b->compile_s * 1e3, (t1 - t0) * 1e3);
    return 0;
}

/* mapreduce: the plan of its documents' trees (the reduce budget: the lane's max_model_len less the
 * output and the template); the foreground's requests become its slots. */
static int make_plan(struct bench *b)
{
    char err[512];
    int max_len = engine_max_model_len(b->eng, b->fg.lane);
    struct bench_mr_opts o = {.docs = b->fg.n_req,
                              .doc_len = b->doc_len,
                              .chunk = b->chunk,
                              .overlap = b->overlap,
                              .out_len = b->fg.out_len,
                              .budget = max_len - b->fg.out_len - BENCH_MR_TEMPLATE_TOKENS,
                              .vocab = b->vocab,
                              .seed = b->seed};
    b->mr = bench_mr_new(&o, err, sizeof err);
    if (!b->mr) {
        fprintf(stderr, "llmq %s: mapreduce: %s\n", CMD, err);
        return 1;
    }
    b->mr_prompt = malloc((size_t)bench_mr_max_prompt(b->mr) * sizeof *b->mr_prompt);
    if (!b->mr_prompt) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        return 1;
    }
    log_info(
        "bench: mapreduce: %d documents x %d tokens in %d chunks of %d (overlap %d), %d-token summaries, "
        "%d summary tokens a reduce prompt: depth %d, at most %d requests",
        o.docs, o.doc_len, bench_mr_chunks(b->mr), o.chunk, o.overlap, o.out_len, o.budget,
        bench_mr_predicted_depth(b->mr), bench_mr_slots(b->mr));
    b->n_docs = o.docs;
    b->mr_budget = o.budget;
    b->fg.n_req = bench_mr_slots(b->mr);
    return 0;
}

/* The prompts of both groups and room for the foreground's latencies. */
static int make_requests(struct bench *b)
{
    b->vocab = b->model->cfg.vocab < PROMPT_ID_RANGE ? b->model->cfg.vocab : PROMPT_ID_RANGE;
    if (is_mapreduce(b->fg.wl) && make_plan(b))
        return 1;
    b->ttft = malloc((size_t)b->fg.n_req * sizeof *b->ttft);
    b->cap_itl = (size_t)b->fg.n_req * (size_t)(b->fg.out_len > 1 ? b->fg.out_len - 1 : 1);
    b->itl = malloc(b->cap_itl * sizeof *b->itl);
    if (!b->ttft || !b->itl || make_prompts(&b->fg, b->vocab, b->seed, b->shared) ||
        (b->has_bg && make_prompts(&b->bg, b->vocab, b->seed + 0x6267ull, 0))) {
        fprintf(stderr, "llmq %s: out of memory for %d requests\n", CMD, b->fg.n_req + b->bg.n_req);
        return 1;
    }
    return 0;
}

/* One request (its own prompt) through prefill and a few decode steps, not timed. */
static int warm_up(struct bench *b)
{
    char err[1024];
    int wn = b->fg.in_len < b->eo.be.max_num_batched_tokens ? b->fg.in_len : b->eo.be.max_num_batched_tokens;
    int32_t *wp = malloc((size_t)wn * sizeof *wp);
    if (!wp) {
        fprintf(stderr, "llmq %s: out of memory\n", CMD);
        return 1;
    }
    uint64_t ws = 0x5eedull + b->seed;
    for (int i = 0; i < wn; i++)
        wp[i] = (int32_t)(splitmix64(&ws) % (uint64_t)b->vocab);
    int wout = b->fg.out_len < 4 ? b->fg.out_len : 4;
    if (wn + wout > engine_max_model_len(b->eng, b->fg.lane))
        wout = 1;
    struct engine_request r = request(wp, wn, wout, 1, b->fg.lane, 0);
    struct engine_seq *q = engine_add(b->eng, &r, err, sizeof err);
    free(wp);
    if (!q || run_engine(b, NULL, false, UNTIL_IDLE)) {
        fprintf(stderr, "llmq %s: warm-up: %s\n", CMD, q ? b->first_error : err);
        return 1;
    }
    return 0;
}

/* The timed run: the background first (until the long lane has run a step), then every request of
 * the workload at once, stepped until the last is done; the background's progress is recorded and
 * the rest of it cancelled. b->run_rc says whether a request failed. */
static int run_timed(struct bench *b)
{
    char err[1024];
    engine_get_stats(b->eng, &b->st0);
    memset(&b->roof, 0, sizeof b->roof);
    const struct backend_opts *bo = &b->eo.be;
    b->roof.fp8_weights = bo->weight_dtype == BE_WEIGHTS_FP8 ||
                          (bo->weight_dtype == BE_WEIGHTS_AUTO && b->model->cfg.fp8_blocks);
    b->roof.fp8_kv = bo->kv_dtype == DT_F8_E4M3;
    const struct tensor_view *lm[1] = {b->model->cfg.tie_embeddings ? &b->model->embed : &b->model->lm_head};
    char why[256];
    b->roof.fp8_lm_head = bo->weight_dtype != BE_WEIGHTS_F16 && /* fp16 mode: never fp8 */
                          fp8_linear_use(bo->lm_head_dtype, lm, 1, why, sizeof why);

    if (b->has_bg)
        log_info("bench: %s, background %s: %d requests x %d in / %d out in the long lane", b->model_name,
                 b->bg.wl->name, b->bg.n_req, b->bg.in_len, b->bg.out_len);
    if (!b->mr)
        log_info("bench: %s, workload %s: %d requests x %d in / %d out%s, backend %s", b->model_name,
                 b->fg.wl->name, b->fg.n_req, b->fg.in_len, b->fg.out_len,
                 b->lanes ? " in the short lane" : "", engine_backend_name(b->eng));
    b->t_bg = llmq_mono_s();
    if (b->has_bg) {
        if (submit(b, &b->bg, true, err, sizeof err)) {
            fprintf(stderr, "llmq %s: background request: %s\n", CMD, err);
            return 1;
        }
        run_engine(b, NULL, false, UNTIL_BG_STARTED);
    }
    struct progress *bar = progress_new(stderr, "requests", b->fg.n_req);
    b->t0 = llmq_mono_s();
    if (b->mr)
        mr_submit(b); /* the map level; the reduce levels follow in run_engine */
    else if (submit(b, &b->fg, false, err, sizeof err)) {
        progress_free(bar);
        fprintf(stderr, "llmq %s: request: %s\n", CMD, err);
        return 1;
    }
    b->run_rc = run_engine(b, bar, true, UNTIL_FG_DONE);
    double t_end = llmq_mono_s();
    b->secs = t_end - b->t0;
    b->wall = b->has_bg ? t_end - b->t_bg : b->secs; /* the roofline's window: from the first submission */
    progress_finish(bar);
    progress_free(bar);
    engine_get_stats(b->eng, &b->st);
    b->roof_timed = b->roof;
    if (b->has_bg) {
        for (int i = 0; i < b->bg.n_req; i++) {
            struct engine_seq *q = b->bg.seq[i];
            if (!q)
                continue;
            b->bg_output_tokens += q->n_output;
            b->bg_prefilled += q->n_output > 0;
            engine_cancel(b->eng, q);
        }
        b->bg_finished = b->bg.done;
        b->bg_prefilled += b->bg.done;
        b->bg_output_tokens += (int64_t)b->bg.done * b->bg.out_len;
        run_engine(b, NULL, false, UNTIL_IDLE);
    }
    return 0;
}

/* "lanes" of the line: the caps in force in each of the worker's two lanes; null without lanes. */
static json_t *lanes_json(const struct bench *b)
{
    if (!b->lanes)
        return json_null();
    json_t *lj = json_object();
    static const char *const names[2] = {"short", "long"};
    for (int l = 0; l < 2; l++) { /* the caps in force: a lane's, at most the global one */
        int seqs = b->eo.lanes[l].max_num_seqs, toks = b->eo.lanes[l].max_num_batched_tokens;
        seqs = seqs > 0 && seqs < b->eo.be.max_num_seqs ? seqs : b->eo.be.max_num_seqs;
        toks = toks > 0 && toks < b->eo.be.max_num_batched_tokens ? toks : b->eo.be.max_num_batched_tokens;
        json_object_set_new(lj, names[l],
                            json_pack("{s:i, s:i, s:i}", "max_num_seqs", seqs, "max_num_batched_tokens", toks,
                                      "max_model_len", engine_max_model_len(b->eng, l)));
    }
    return lj;
}

/* "background" of the line: the long lane's load while the workload ran; null without one. */
static json_t *background_json(const struct bench *b)
{
    if (!b->has_bg)
        return json_null();
    json_t *bj = json_object();
    uint64_t bg_computed = b->st.lane_computed_tokens[b->bg.lane] - b->st0.lane_computed_tokens[b->bg.lane];
    json_object_set_new(bj, "workload", json_string(b->bg.wl->name));
    json_object_set_new(bj, "lane", json_string("long"));
    json_object_set_new(bj, "requests", json_integer(b->bg.n_req));
    json_object_set_new(bj, "input_len", json_integer(b->bg.in_len));
    json_object_set_new(bj, "output_len", json_integer(b->bg.out_len));
    json_object_set_new(bj, "lead_s", json_real(r3(b->t0 - b->t_bg)));
    json_object_set_new(bj, "seconds", json_real(r3(b->wall)));
    json_object_set_new(bj, "finished", json_integer(b->bg_finished));
    json_object_set_new(bj, "prefilled", json_integer(b->bg_prefilled));
    json_object_set_new(bj, "computed_tokens", json_integer((json_int_t)bg_computed));
    json_object_set_new(bj, "output_tokens", json_integer((json_int_t)b->bg_output_tokens));
    json_object_set_new(bj, "computed_tokens_per_s", json_real(r1((double)bg_computed / b->wall)));
    json_object_set_new(
        bj, "progress",
        json_real(r4((double)bg_computed / ((double)b->bg.n_req * (double)(b->bg.in_len + b->bg.out_len)))));
    return bj;
}

/* "mapreduce" of the line: the documents, the trees and each level; null for other workloads. Sets
 * *requests and *prompt_tokens to the run's (every level). */
static json_t *mapreduce_json(const struct bench *b, int *requests, double *prompt_tokens)
{
    if (!b->mr)
        return json_null();
    const struct bench_mr_level *lv;
    const double *t_docs;
    int n_levels = bench_mr_levels(b->mr, &lv), done = bench_mr_docs_done(b->mr, &t_docs);
    json_t *m = json_object(), *req = json_array(), *pt = json_array(), *ot = json_array(),
           *end = json_array();
    for (int l = 0; l < n_levels; l++) {
        *requests += lv[l].requests;
        *prompt_tokens += (double)lv[l].prompt_tokens;
        json_array_append_new(req, json_integer(lv[l].requests));
        json_array_append_new(pt, json_integer(lv[l].prompt_tokens));
        json_array_append_new(ot, json_integer(lv[l].output_tokens));
        json_array_append_new(end, json_real(r3(lv[l].t_end > 0 ? lv[l].t_end - b->t0 : 0)));
    }
    double map_s = lv[0].t_end > 0 ? lv[0].t_end - b->t0 : 0;
    json_object_set_new(m, "documents", json_integer(b->n_docs));
    json_object_set_new(m, "doc_len", json_integer(b->doc_len));
    json_object_set_new(m, "chunk_len", json_integer(b->chunk));
    json_object_set_new(m, "overlap", json_integer(b->overlap));
    json_object_set_new(m, "chunks", json_integer(bench_mr_chunks(b->mr)));
    json_object_set_new(m, "template_tokens", json_integer(BENCH_MR_TEMPLATE_TOKENS));
    json_object_set_new(m, "sep_tokens", json_integer(BENCH_MR_SEP_TOKENS));
    json_object_set_new(m, "reduce_budget", json_integer(b->mr_budget));
    json_object_set_new(m, "depth", json_integer(bench_mr_depth(b->mr)));
    json_object_set_new(m, "predicted_depth", json_integer(bench_mr_predicted_depth(b->mr)));
    json_object_set_new(m, "documents_done", json_integer(done));
    json_object_set_new(m, "requests_per_level", req);
    json_object_set_new(m, "prompt_tokens_per_level", pt);
    json_object_set_new(m, "output_tokens_per_level", ot);
    json_object_set_new(m, "level_end_s", end);
    json_object_set_new(m, "map_seconds", json_real(r3(map_s)));
    json_object_set_new(
        m, "map_tokens_per_s",
        json_real(r1(map_s > 0 ? ((double)lv[0].prompt_tokens + (double)lv[0].output_tokens) / map_s : 0)));
    double *ds = malloc((size_t)b->n_docs * sizeof *ds);
    int nd = 0;
    for (int d = 0; ds && d < b->n_docs; d++)
        if (t_docs[d] > 0)
            ds[nd++] = t_docs[d] - b->t0;
    json_object_set_new(m, "doc_seconds_p50", json_real(r3(ds ? bench_percentile(ds, (size_t)nd, 50) : 0)));
    json_object_set_new(m, "doc_seconds_max", json_real(r3(ds ? bench_percentile(ds, (size_t)nd, 100) : 0)));
    free(ds);
    return m;
}

/* The one JSON line on stdout (docs/BENCH.md names every key). */
static void print_line(const struct bench *b)
{
    const struct bench_roofline *roof = &b->roof_timed;
    uint64_t out_tokens = (uint64_t)b->fg_tokens;
    int requests = b->mr ? 0 : b->fg.n_req;
    double prompt_tokens = b->mr ? 0 : (double)b->fg.n_req * b->fg.in_len;
    json_t *mr = mapreduce_json(b, &requests, &prompt_tokens);
    json_t *j = json_object();
    json_object_set_new(j, "engine", json_string("llmq"));
    json_object_set_new(j, "model", json_string(b->model_name));
    json_object_set_new(j, "workload", json_string(b->fg.wl->name));
    json_object_set_new(j, "requests", json_integer(requests));
    json_object_set_new(j, "input_len", json_integer(b->mr ? b->chunk : b->fg.in_len));
    json_object_set_new(j, "output_len", json_integer(b->fg.out_len));
    json_object_set_new(j, "seconds", json_real(r3(b->secs)));
    json_object_set_new(j, "requests_per_s", json_real(r3(requests / b->secs)));
    json_object_set_new(j, "output_tokens_per_s", json_real(r1((double)out_tokens / b->secs)));
    json_object_set_new(j, "total_tokens_per_s",
                        json_real(r1(((double)out_tokens + prompt_tokens) / b->secs)));
    size_t n_ttft = b->n_ttft, n_itl = b->n_itl;
    json_object_set_new(j, "ttft_ms_p50", json_real(r1(1e3 * bench_percentile(b->ttft, n_ttft, 50))));
    json_object_set_new(j, "ttft_ms_p95", json_real(r1(1e3 * bench_percentile(b->ttft, n_ttft, 95))));
    json_object_set_new(j, "ttft_ms_p99", json_real(r1(1e3 * bench_percentile(b->ttft, n_ttft, 99))));
    json_object_set_new(j, "itl_ms_p50", json_real(r3(1e3 * bench_percentile(b->itl, n_itl, 50))));
    json_object_set_new(j, "itl_ms_p95", json_real(r3(1e3 * bench_percentile(b->itl, n_itl, 95))));
    json_object_set_new(j, "itl_ms_p99", json_real(r3(1e3 * bench_percentile(b->itl, n_itl, 99))));
    /* prefix cache over the timed requests (vLLM's token counts) */
    uint64_t pq = b->st.prefix_query_tokens - b->st0.prefix_query_tokens;
    uint64_t ph = b->st.prefix_hit_tokens - b->st0.prefix_hit_tokens;
    json_object_set_new(j, "shared_prefix", json_integer(b->shared));
    json_object_set_new(j, "prefix_caching", json_boolean(b->eo.enable_prefix_caching));
    json_object_set_new(j, "prefix_cache_queries", json_integer((json_int_t)pq));
    json_object_set_new(j, "prefix_cache_hits", json_integer((json_int_t)ph));
    json_object_set_new(j, "prefix_cache_hit_rate", json_real(pq ? r4((double)ph / (double)pq) : 0));
    json_t *peak = json_null(), *dev = json_null(), *graphs = json_null(), *taken = json_null(),
           *dropped = json_null(), *copies = json_null(), *gemm_made = json_null(),
           *gemm_loaded = json_null();
#ifdef LLMQ_HAVE_CUDA_BACKEND
    struct cuda_backend_stats cs;
    if (cuda_backend_get_stats(bench_inner_backend(b->be), &cs) == 0) {
        peak = json_real(r1((double)cs.peak_used_bytes / 1e9));
        copies = json_real(r3((double)cs.copy_bytes / 1e9));
        dev = json_string(cs.device);
        graphs = json_integer((json_int_t)cs.graph_replays);
        taken = json_integer((json_int_t)cs.guesses_taken);
        dropped = json_integer((json_int_t)cs.guesses_dropped);
        gemm_made = json_integer(cs.gemm_made);
        gemm_loaded = json_integer(cs.gemm_loaded);
    }
#endif
    json_object_set_new(j, "peak_gpu_mem_gb", peak);
    json_object_set_new(j, "weight_dtype",
                        json_string(b->eo.be.weight_dtype == BE_WEIGHTS_FP8    ? "fp8"
                                    : b->eo.be.weight_dtype == BE_WEIGHTS_BF16 ? "bf16"
                                    : b->eo.be.weight_dtype == BE_WEIGHTS_F16  ? "fp16"
                                                                               : "auto"));
    const char *w16 = b->eo.be.weight_dtype == BE_WEIGHTS_F16 ? "fp16" : "bf16"; /* the 16-bit type */
    json_object_set_new(j, "lm_head_dtype", json_string(b->roof.fp8_lm_head ? "fp8" : w16));
    json_object_set_new(j, "kv_cache_dtype", json_string(b->eo.be.kv_dtype == DT_F8_E4M3 ? "fp8" : w16));
    json_object_set_new(j, "decode_weight_copies_gb", copies);
    json_object_set_new(j, "gemm_choices_made", gemm_made);
    json_object_set_new(j, "gemm_choices_from_file", gemm_loaded);
    json_object_set_new(j, "kv_blocks", json_integer(b->st.kv_blocks_total));
    json_object_set_new(j, "kv_tokens", json_integer((json_int_t)b->st.kv_blocks_total * b->be->block_size));
    json_object_set_new(j, "max_model_len", json_integer(engine_max_model_len(b->eng, -1)));
    json_object_set_new(j, "preemptions", json_integer((json_int_t)(b->st.preemptions - b->st0.preemptions)));
    json_object_set_new(j, "admission_reserve", json_real(b->eo.admission_reserve));
    json_object_set_new(j, "steps", json_integer((json_int_t)roof->steps));
    json_object_set_new(j, "graph_replays", graphs);
    json_object_set_new(j, "guessed_steps", taken);
    json_object_set_new(j, "dropped_guesses", dropped);
    json_object_set_new(j, "ideal_s", json_real(r6(roof->ideal_s)));
    json_object_set_new(j, "roofline_efficiency", json_real(round(roof->ideal_s / b->wall * 1e4) / 1e4));
    json_object_set_new(j, "compute_bound_steps", json_integer((json_int_t)roof->compute_bound_steps));
    json_object_set_new(j, "attention_ideal_s", json_real(r6(roof->attn_ideal_s)));
    json_object_set_new(
        j, "attention_ideal_share",
        json_real(roof->ideal_s > 0 ? round(roof->attn_ideal_s / roof->ideal_s * 1e4) / 1e4 : 0.0));
    json_object_set_new(j, "backend", json_string(engine_backend_name(b->eng)));
    json_object_set_new(j, "gpu", dev);
    json_object_set_new(j, "lanes", lanes_json(b));
    json_object_set_new(j, "settings", b->settings ? json_incref(b->settings) : json_object());
    json_object_set_new(j, "background", background_json(b));
    char digest[17];
    snprintf(digest, sizeof digest, "%016llx",
             (unsigned long long)fnv1a(FNV1A_INIT, b->fg.digest, (size_t)b->fg.n_req * sizeof *b->fg.digest));
    json_object_set_new(j, "output_digest", json_string(digest));
    json_t *rf = json_null();
    if (b->grammar) {
        struct gr_stats gs;
        gr_get_stats(b->grammar, &gs);
        uint64_t masks = b->st.grammar_masks - b->st0.grammar_masks;
        double mask_s = b->st.grammar_mask_s - b->st0.grammar_mask_s;
        rf = json_object();
        json_object_set_new(rf, "file", json_string(b->rf_name));
        json_object_set_new(rf, "compile_ms", json_real(r3(b->compile_s * 1e3)));
        json_object_set_new(rf, "masks", json_integer((json_int_t)masks));
        json_object_set_new(rf, "mask_us_mean", json_real(r3(masks ? mask_s / (double)masks * 1e6 : 0)));
        json_object_set_new(rf, "mask_ms_per_step",
                            json_real(r4(roof->steps ? mask_s / (double)roof->steps * 1e3 : 0)));
        json_object_set_new(rf, "mask_share", json_real(r4(mask_s / b->secs)));
        json_object_set_new(rf, "cache_hits", json_integer((json_int_t)gs.hits));
        json_object_set_new(rf, "cache_misses", json_integer((json_int_t)gs.misses));
        json_object_set_new(rf, "miss_ms_mean",
                            json_real(r3(gs.misses ? gs.compute_s / (double)gs.misses * 1e3 : 0)));
        json_object_set_new(rf, "mean_output_len", json_real(r1((double)out_tokens / b->fg.n_req)));
    }
    json_object_set_new(j, "response_format", rf);
    json_object_set_new(j, "mapreduce", mr);
    json_object_set_new(j, "failed", json_integer(b->failed));
    char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(j);
    if (line) {
        printf("%s\n", line);
        fflush(stdout);
        free(line);
    }
}

int cmd_bench(int argc, char **argv)
{
    struct bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc; /* -1: --help */
    struct bench b;
    memset(&b, 0, sizeof b);
    rc = bench_settings(&b, &a);
    if (!rc)
        rc = open_model(&b, &a);
    if (!rc)
        rc = open_engine(&b, &a);
    if (!rc && a.response_format)
        rc = compile_response_format(&b, a.response_format);
    if (!rc)
        rc = make_requests(&b);
    if (!rc)
        rc = warm_up(&b);
    if (!rc)
        rc = run_timed(&b);
    if (!rc) {
        print_line(&b);
        if (b.run_rc) {
            fprintf(stderr, "llmq %s: %d requests failed; the first: %s\n", CMD, b.failed, b.first_error);
            rc = 1;
        }
    }
    bench_free(&b);
    return rc;
}
