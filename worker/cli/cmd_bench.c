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
#include "engine/model.h"
#include "engine/random_model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
#include "engine/util/scratch_dir.h"
#include "worker/backends/backend_open.h"
#include "worker/cli/cli.h"
#include "worker/cli/progress.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#ifdef LLMQ_HAVE_CUDA_BACKEND
#include "engine/cuda_backend.h"
#endif

static const char CMD[] = "bench";

#define PROMPT_ID_RANGE 150000 /* prompt ids are drawn from [0, min(vocab, this)), as hf_peer.py does */

// The defaults printed are the ones the command uses (engine_opts_default(), the queues section's
// defaults of worker/config/config.c), so the text cannot drift from them.
static void usage(FILE *f)
{
    const struct engine_opts d = engine_opts_default();
    struct cfg c;
    cfg_defaults(&c);
    const struct cfg_queues *q = &c.queues;
    fprintf(
        f,
        "Usage: llmq bench (--model DIR | --random-weights SHAPE) --workload W [options]\n"
        "\n"
        "Runs a fixed workload through the engine and prints one JSON line on stdout: requests/s, output\n"
        "and total tokens/s, TTFT and inter-token latency percentiles, peak GPU memory, KV cache size,\n"
        "preemptions, prefix cache hits and the roofline efficiency. Prompts are random token ids; every\n"
        "request generates exactly its output length (EOS ignored, greedy). All requests are submitted\n"
        "at once. docs/BENCH.md explains the output. The engine's options come as `llmq run` and `llmq\n"
        "worker` take them: the defaults below, then --config FILE, then LLMQ_* variables, then the flags.\n"
        "\n"
        "  -m, --model DIR                 a Hugging Face model folder (default: model.path of --config)\n"
        "  -r, --random-weights SHAPE      qwen3-14b | qwen3-8b | qwen3-0.6b, random bf16 weights, no files\n"
        "                                  (the CPU backend takes only qwen3-0.6b)\n"
        "  -w, --workload W                chat (1000 x 512 in / 128 out), decode (512 x 128 / 1024),\n"
        "                                  summarize (200 x 4096 / 256), longdoc (8 x 65536 / 256),\n"
        "                                  single (1 x 128 / 512)\n"
        "  -n, --num-prompts N             requests (default: the workload's)\n"
        "      --input-len N               prompt tokens per request (default: the workload's)\n"
        "      --output-len N              generated tokens per request (default: the workload's)\n"
        "      --shared-prefix N           the first N prompt tokens are the same in every request\n"
        "      --no-prefix-caching         turn the prefix cache off (engine.enable_prefix_caching)\n"
        "      --admission-reserve X       share of max_tokens admission keeps KV blocks for, 0..1\n"
        "                                  (engine.admission_reserve, default 1; 0 = admit, preempt later)\n"
        "      --background W[:N]          N requests (default: W's) of workload W run in the long lane\n"
        "                                  while the workload runs in the short lane (implies --lanes)\n"
        "      --background-input-len N    the background's prompt tokens (default: W's)\n"
        "      --background-output-len N   the background's generated tokens (default: W's)\n"
        "      --lanes                     run in the worker's short lane of two (queues.short_*/long_*)\n"
        "      --config FILE               the model, engine and queues sections of this llmq.yaml (as\n"
        "                                  llmq worker reads them); implies --lanes\n"
        "      --long-max-num-seqs N       queues.long_max_num_seqs (default %d)\n"
        "      --long-max-num-batched-tokens N  queues.long_max_num_batched_tokens (default %d)\n"
        "      --short-max-num-seqs N      queues.short_max_num_seqs (default %d)\n"
        "      --short-max-num-batched-tokens N queues.short_max_num_batched_tokens (default %d)\n"
        "      --backend B                 auto | cpu | cuda (default auto)\n"
        "      --max-num-seqs N            sequences per step (default %d)\n"
        "      --max-num-batched-tokens N  tokens per step (default %d)\n"
        "      --max-model-len N           longest sequence (default: the longest request; with --config\n"
        "                                  the model's, as the worker); above the\n"
        "                                  model's max_position_embeddings it enables YaRN\n"
        "      --block-size N              KV block size in tokens (default %d)\n"
        "      --gpu-memory-utilization X  share of GPU memory for weights, activations and KV (default "
        "%.2f)\n"
        "      --no-cuda-graphs            run decode steps eagerly\n"
        "      --cuda-graph-max-batch N    largest decode batch run as a graph (default %d)\n"
        "      --dtype D                   weights: auto (the checkpoint's) | bf16 | fp8 (linear weights\n"
        "                                  quantized at load in 128x128 blocks) | fp16 (weights,\n"
        "                                  activations and KV cache in fp16; CUDA; model.dtype)\n"
        "      --lm-head-dtype D           auto (the checkpoint's) | bf16 | fp8 (quantized at load;\n"
        "                                  model.lm_head_dtype)\n"
        "      --kv-cache-dtype D          bf16 | fp8 (e4m3 with a scale per token and KV head; CUDA)\n"
        "      --decode-weight-copies C    auto | on | off: a second copy of the weights in the decode\n"
        "                                  GEMVs' read order (CUDA; engine.decode_weight_copies; auto =\n"
        "                                  on where the KV cache still holds every sequence)\n"
        "      --gemm-tuning-file PATH     keep the GEMM algorithms chosen by timing in PATH: read at\n"
        "                                  start, written at exit (CUDA; engine.gemm_tuning_file)\n"
        "      --threads N                 CPU backend threads (default all)\n"
        "      --device N                  CUDA device index (default 0; engine.device)\n"
        "      --seed N                    prompt seed (default 0)\n"
        "  -h, --help                      this text\n"
        "\n"
        "Exit status: 0 every request finished, 1 the run failed, 2 the command line is wrong.\n",
        q->long_max_num_seqs, q->long_max_num_batched_tokens, q->short_max_num_seqs,
        q->short_max_num_batched_tokens, d.be.max_num_seqs, d.be.max_num_batched_tokens, d.be.block_size,
        d.be.gpu_memory_utilization, d.be.cuda_graph_max_batch);
    cfg_free(&c);
}

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

/* One group of requests: the timed foreground, or the background in the long lane. */
struct group {
    const struct bench_workload *wl;
    int n_req, in_len, out_len, lane;
    int32_t *prompts;        /* [n_req][in_len] */
    struct engine_seq **seq; /* [n_req], NULL once released */
    double *last;            /* [n_req] when its last token came (for inter-token latency) */
    int done;                /* released */
};

struct bench {
    struct group fg, bg;
    bool has_bg;
    struct model *model;
    bool random;
    struct tok *tok;
    struct engine *eng;
    struct backend *be; /* the wrapper, owned by the engine */
    struct bench_roofline roof;
    double *ttft, *itl;
    size_t n_ttft, n_itl, cap_itl;
    int64_t fg_tokens; /* generated by the foreground while recorded */
    int failed;
    char first_error[512];
    /* the background at the moment the foreground finished */
    int bg_finished, bg_prefilled;
    int64_t bg_output_tokens;
    json_t *settings; /* non_default_settings(), for the line */
};

static void group_free(struct group *g)
{
    free(g->prompts);
    free(g->seq);
    free(g->last);
}

static void bench_free(struct bench *b)
{
    engine_free(b->eng);
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
            else if (g && q->finish != FINISH_CANCELLED && q->n_output != g->out_len)
                on_failure(b, "a request finished with %d tokens, not %d", q->n_output, g->out_len);
            if (g) {
                g->seq[idx] = NULL;
                g->done++;
            }
            engine_release(b->eng, q);
        }
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

/* Random prompts of g; the first `shared` tokens of each come from one draw. */
static int make_prompts(struct group *g, int vocab, uint64_t seed, int shared)
{
    g->prompts = malloc((size_t)g->n_req * (size_t)g->in_len * sizeof *g->prompts);
    g->seq = calloc((size_t)g->n_req, sizeof *g->seq);
    g->last = calloc((size_t)g->n_req, sizeof *g->last);
    if (!g->prompts || !g->seq || !g->last)
        return -1;
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
    *n = 0;
    if (colon)
        return parse_int("--background (its :N)", colon + 1, 1, n);
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    enum {
        O_UTIL = ENGINE_CFG_O_NEXT,
        O_RESERVE,
        O_NOGRAPH,
        O_GRAPH_MAX,
        O_SEED,
        O_IN,
        O_OUT,
        O_SHARED,
        O_NOPREFIX,
        O_BG,
        O_BG_IN,
        O_BG_OUT,
        O_LANES,
        O_CONFIG,
        O_LONG_SEQS,
        O_LONG_TOKENS,
        O_SHORT_SEQS,
        O_SHORT_TOKENS,
        O_DTYPE,
        O_KVDTYPE,
        O_LMDTYPE,
        O_COPIES,
        O_TUNING,
    };
    static const struct option longopts[] = {
        ENGINE_CFG_LONGOPTS,       /* --model, --backend, --threads, --device, --max-num-seqs */
        ENGINE_CFG_LONGOPTS_SHAPE, /* --max-num-batched-tokens, --max-model-len, --block-size */
        {"random-weights", required_argument, NULL, 'r'},
        {"workload", required_argument, NULL, 'w'},
        {"num-prompts", required_argument, NULL, 'n'},
        {"input-len", required_argument, NULL, O_IN},
        {"output-len", required_argument, NULL, O_OUT},
        {"shared-prefix", required_argument, NULL, O_SHARED},
        {"no-prefix-caching", no_argument, NULL, O_NOPREFIX},
        {"admission-reserve", required_argument, NULL, O_RESERVE},
        {"background", required_argument, NULL, O_BG},
        {"background-input-len", required_argument, NULL, O_BG_IN},
        {"background-output-len", required_argument, NULL, O_BG_OUT},
        {"lanes", no_argument, NULL, O_LANES},
        {"config", required_argument, NULL, O_CONFIG},
        {"long-max-num-seqs", required_argument, NULL, O_LONG_SEQS},
        {"long-max-num-batched-tokens", required_argument, NULL, O_LONG_TOKENS},
        {"short-max-num-seqs", required_argument, NULL, O_SHORT_SEQS},
        {"short-max-num-batched-tokens", required_argument, NULL, O_SHORT_TOKENS},
        {"gpu-memory-utilization", required_argument, NULL, O_UTIL},
        {"no-cuda-graphs", no_argument, NULL, O_NOGRAPH},
        {"cuda-graph-max-batch", required_argument, NULL, O_GRAPH_MAX},
        {"seed", required_argument, NULL, O_SEED},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"kv-cache-dtype", required_argument, NULL, O_KVDTYPE},
        {"lm-head-dtype", required_argument, NULL, O_LMDTYPE},
        {"decode-weight-copies", required_argument, NULL, O_COPIES},
        {"gemm-tuning-file", required_argument, NULL, O_TUNING},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *shape = NULL, *workload = NULL, *config = NULL;
    int num_prompts = 0, seed = 0, in_len = 0, out_len = 0, shared = 0, bg_n = 0, bg_in = 0, bg_out = 0, c,
        rc = 0;
    bool lanes = false, seed_given = false, model_given = false;
    const struct bench_workload *bg_wl = NULL;
    struct engine_cfg_flags flags = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:r:w:n:h", longopts, NULL)) != -1) {
        /* the engine's flags are configuration keys, applied over --config and LLMQ_* below: those
         * every engine command shares (engine_cfg.h), then bench's own */
        int engine_flag = engine_cfg_flag_opt(&flags, c, optarg);
        if (engine_flag < 0)
            return cli_usage_error(CMD, "too many options");
        if (engine_flag > 0) {
            model_given = model_given || c == 'm';
            continue;
        }
        const char *key = NULL, *flag = NULL, *value = NULL; /* a key the option sets (value: optarg) */
        bool lane_key = false;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'r':
            shape = optarg;
            break;
        case 'w':
            workload = optarg;
            break;
        case 'n':
            rc = parse_int("--num-prompts", optarg, 1, &num_prompts);
            break;
        case O_IN:
            rc = parse_int("--input-len", optarg, 1, &in_len);
            break;
        case O_OUT:
            rc = parse_int("--output-len", optarg, 1, &out_len);
            break;
        case O_SHARED:
            rc = parse_int("--shared-prefix", optarg, 0, &shared);
            break;
        case O_NOPREFIX:
            key = "engine.enable_prefix_caching", flag = "--no-prefix-caching", value = "false";
            break;
        case O_BG:
            rc = parse_background(optarg, &bg_wl, &bg_n);
            lanes = true;
            break;
        case O_BG_IN:
            rc = parse_int("--background-input-len", optarg, 1, &bg_in);
            break;
        case O_BG_OUT:
            rc = parse_int("--background-output-len", optarg, 1, &bg_out);
            break;
        case O_LANES:
            lanes = true;
            break;
        case O_CONFIG:
            config = optarg;
            break;
        case O_LONG_SEQS:
            key = "queues.long_max_num_seqs", flag = "--long-max-num-seqs", lane_key = true;
            break;
        case O_LONG_TOKENS:
            key = "queues.long_max_num_batched_tokens", flag = "--long-max-num-batched-tokens",
            lane_key = true;
            break;
        case O_SHORT_SEQS:
            key = "queues.short_max_num_seqs", flag = "--short-max-num-seqs", lane_key = true;
            break;
        case O_SHORT_TOKENS:
            key = "queues.short_max_num_batched_tokens", flag = "--short-max-num-batched-tokens",
            lane_key = true;
            break;
        case O_UTIL:
            key = "engine.gpu_memory_utilization", flag = "--gpu-memory-utilization";
            break;
        case O_RESERVE:
            key = "engine.admission_reserve", flag = "--admission-reserve";
            break;
        case O_NOGRAPH:
            key = "engine.cuda_graphs", flag = "--no-cuda-graphs", value = "false";
            break;
        case O_GRAPH_MAX:
            key = "engine.cuda_graph_max_batch", flag = "--cuda-graph-max-batch";
            break;
        case O_DTYPE:
            key = "model.dtype", flag = "--dtype";
            break;
        case O_LMDTYPE:
            key = "model.lm_head_dtype", flag = "--lm-head-dtype";
            break;
        case O_COPIES:
            key = "engine.decode_weight_copies", flag = "--decode-weight-copies";
            break;
        case O_TUNING:
            key = "engine.gemm_tuning_file", flag = "--gemm-tuning-file";
            break;
        case O_KVDTYPE:
            key = "engine.kv_cache_dtype", flag = "--kv-cache-dtype";
            break;
        case O_SEED:
            rc = parse_int("--seed", optarg, 0, &seed);
            seed_given = true;
            break;
        default:
            return cli_bad_option(CMD, argc, argv);
        }
        if (key) {
            lanes = lanes || lane_key;
            if (engine_cfg_flag_add(&flags, key, value ? value : optarg, flag))
                return cli_usage_error(CMD, "too many options");
        }
        if (rc)
            return rc;
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (model_given && shape)
        return cli_usage_error(CMD, "give one of --model DIR or --random-weights SHAPE, not both");
    if (!workload)
        return cli_usage_error(CMD, "--workload is required (%s)", bench_workload_names());
    if ((bg_in || bg_out) && !bg_wl)
        return cli_usage_error(CMD, "--background-input-len and --background-output-len need --background");
    if (config)
        lanes = true;
    struct bench b;
    memset(&b, 0, sizeof b);
    b.fg.wl = bench_workload_find(workload);
    if (!b.fg.wl)
        return cli_usage_error(CMD, "--workload: '%s' (expected %s)", workload, bench_workload_names());
    b.fg.n_req = num_prompts ? num_prompts : b.fg.wl->requests;
    b.fg.in_len = in_len ? in_len : b.fg.wl->input_len;
    b.fg.out_len = out_len ? out_len : b.fg.wl->output_len;
    if (shared > b.fg.in_len)
        return cli_usage_error(CMD, "--shared-prefix %d is longer than the prompts (%d tokens)", shared,
                               b.fg.in_len);
    if (bg_wl) {
        b.has_bg = true;
        b.bg.wl = bg_wl;
        b.bg.n_req = bg_n ? bg_n : bg_wl->requests;
        b.bg.in_len = bg_in ? bg_in : bg_wl->input_len;
        b.bg.out_len = bg_out ? bg_out : bg_wl->output_len;
    }

    /* the engine's options as `llmq run` and `llmq worker` take them: defaults < --config < LLMQ_* <
     * flags; with lanes, the worker's two from the queues section */
    struct engine_opts eo;
    const char *backend = "auto"; /* engine.backend */
    int mml;
    char cfg_model[4096] = "", cfg_tok[4096] = ""; /* model.path and model.tokenizer */
    char cfg_tuning[4096] = "";                    /* engine.gemm_tuning_file (eo.be borrows it) */
    {
        struct cfg cf;
        int lrc = engine_cfg_load(CMD, config, &flags, &cf);
        if (lrc == 0) {
            eo = engine_cfg_opts(&cf);
            backend = engine_cfg_backend(&cf);
            if (lanes)
                engine_cfg_lanes(&eo, &cf);
            mml = cf.model.max_model_len;
            snprintf(cfg_model, sizeof cfg_model, "%s", cf.model.path);
            snprintf(cfg_tok, sizeof cfg_tok, "%s", cf.model.tokenizer);
            snprintf(cfg_tuning, sizeof cfg_tuning, "%s", cf.engine.gemm_tuning_file);
            eo.be.gemm_tuning_file = cfg_tuning;
            b.settings = non_default_settings(&cf);
        }
        cfg_free(&cf);
        if (lrc)
            return lrc;
    }
    const char *model_dir = shape ? NULL : cfg_model; /* --model or model.path */
    if (!shape && !cfg_model[0]) {
        bench_free(&b);
        return cli_usage_error(CMD, "give one of --model DIR or --random-weights SHAPE (or model.path "
                                    "in --config)");
    }
    if (lanes) {
        b.fg.lane = ENGINE_CFG_LANE_SHORT;
        b.bg.lane = ENGINE_CFG_LANE_LONG;
    }

    char err[1024], gpu[256] = "";
    /* which backend: decided here so random weights know whether to live on the host */
    bool gpu_ok = gpu_backend_built() && gpu_describe(gpu, sizeof gpu) == 0;
    const char *be_name = strcmp(backend, "auto") ? backend : gpu_ok ? "cuda" : "cpu";
    char model_name[256];
    if (shape) {
        struct model_config cfg, small;
        if (random_model_config(shape, &cfg, err, sizeof err)) {
            bench_free(&b);
            return cli_usage_error(CMD, "--random-weights: %s", err);
        }
        random_model_config("qwen3-0.6b", &small, err, sizeof err);
        if (!strcmp(be_name, "cpu") && random_model_params(&cfg) > random_model_params(&small)) {
            fprintf(stderr,
                    "llmq %s: --random-weights %s (%.1f B parameters) needs the CUDA backend%s; the CPU "
                    "backend runs "
                    "random weights only up to qwen3-0.6b\n",
                    CMD, shape, (double)random_model_params(&cfg) / 1e9,
                    !strcmp(backend, "auto")
                        ? (gpu_backend_built() ? " (no usable GPU here)" : " (not built in)")
                        : "");
            bench_free(&b);
            return 1;
        }
        b.random = true;
        b.model = random_model_create(&cfg, !strcmp(be_name, "cpu"), err, sizeof err);
        if (!b.model) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            bench_free(&b);
            return 1;
        }
        b.tok = scratch_tokenizer(err, sizeof err);
        snprintf(model_name, sizeof model_name, "%s", shape);
    } else {
        b.model = model_load(model_dir, err, sizeof err);
        if (!b.model) {
            fprintf(stderr, "llmq %s: model %s: %s\n", CMD, model_dir, err);
            bench_free(&b);
            return 1;
        }
        b.tok = tok_load_dir(cfg_tok[0] ? cfg_tok : model_dir, err, sizeof err);
        snprintf(model_name, sizeof model_name, "%.200s", base_name(model_dir));
    }
    if (!b.tok) {
        fprintf(stderr, "llmq %s: tokenizer: %s\n", CMD, err);
        bench_free(&b);
        return 1;
    }

    /* the engine over a measuring wrapper of the backend */
    int longest = b.fg.in_len + b.fg.out_len;
    if (b.has_bg && b.bg.in_len + b.bg.out_len > longest)
        longest = b.bg.in_len + b.bg.out_len;
    /* max_model_len: the flag or the file's; else with --config the worker's rule (the model's), so that
     * the engine is the worker's; else the longest request (no memory or graphs for unused length) */
    eo.be.max_model_len = mml ? mml : config ? b.model->cfg.max_position : longest;
    if (seed_given)
        eo.seed = (uint64_t)seed;
    struct backend *inner = backend_open(be_name, b.model, &eo.be, err, sizeof err);
    if (!inner) {
        fprintf(stderr, "llmq %s: backend %s: %s\n", CMD, be_name, err);
        bench_free(&b);
        return 1;
    }
    b.be = bench_wrap_backend(inner, &b.model->cfg, &b.roof);
    if (b.be)
        b.eng = engine_open(b.model, b.tok, b.be, &eo, err, sizeof err);
    if (!b.eng) {
        fprintf(stderr, "llmq %s: engine: %s\n", CMD, b.be ? err : "out of memory");
        bench_free(&b);
        return 1;
    }
    for (int gi = 0; gi < (b.has_bg ? 2 : 1); gi++) {
        const struct group *g = gi ? &b.bg : &b.fg;
        int cap = engine_max_model_len(b.eng, g->lane);
        if (g->in_len + g->out_len > cap) {
            fprintf(stderr,
                    "llmq %s: the %s needs %d tokens per sequence; the engine holds %d in its lane "
                    "(--max-model-len, or the KV cache is too small)\n",
                    CMD, gi ? "background" : "workload", g->in_len + g->out_len, cap);
            bench_free(&b);
            return 1;
        }
    }

    /* prompts */
    int vocab = b.model->cfg.vocab < PROMPT_ID_RANGE ? b.model->cfg.vocab : PROMPT_ID_RANGE;
    b.ttft = malloc((size_t)b.fg.n_req * sizeof *b.ttft);
    b.cap_itl = (size_t)b.fg.n_req * (size_t)(b.fg.out_len > 1 ? b.fg.out_len - 1 : 1);
    b.itl = malloc(b.cap_itl * sizeof *b.itl);
    if (!b.ttft || !b.itl || make_prompts(&b.fg, vocab, (uint64_t)seed, shared) ||
        (b.has_bg && make_prompts(&b.bg, vocab, (uint64_t)seed + 0x6267ull, 0))) {
        fprintf(stderr, "llmq %s: out of memory for %d requests\n", CMD, b.fg.n_req + b.bg.n_req);
        bench_free(&b);
        return 1;
    }

    /* warm-up: one request (its own prompt) through prefill and a few decode steps, not timed */
    {
        int wn = b.fg.in_len < eo.be.max_num_batched_tokens ? b.fg.in_len : eo.be.max_num_batched_tokens;
        int32_t *wp = malloc((size_t)wn * sizeof *wp);
        if (!wp) {
            fprintf(stderr, "llmq %s: out of memory\n", CMD);
            bench_free(&b);
            return 1;
        }
        uint64_t ws = 0x5eedull + (uint64_t)seed;
        for (int i = 0; i < wn; i++)
            wp[i] = (int32_t)(splitmix64(&ws) % (uint64_t)vocab);
        int wout = b.fg.out_len < 4 ? b.fg.out_len : 4;
        if (wn + wout > engine_max_model_len(b.eng, b.fg.lane))
            wout = 1;
        struct engine_request r = request(wp, wn, wout, 1, b.fg.lane, 0);
        struct engine_seq *q = engine_add(b.eng, &r, err, sizeof err);
        free(wp);
        if (!q || run_engine(&b, NULL, false, UNTIL_IDLE)) {
            fprintf(stderr, "llmq %s: warm-up: %s\n", CMD, q ? b.first_error : err);
            bench_free(&b);
            return 1;
        }
    }
    struct engine_stats st0;
    engine_get_stats(b.eng, &st0);
    memset(&b.roof, 0, sizeof b.roof);
    b.roof.fp8_weights = eo.be.weight_dtype == BE_WEIGHTS_FP8 ||
                         (eo.be.weight_dtype == BE_WEIGHTS_AUTO && b.model->cfg.fp8_blocks);
    b.roof.fp8_kv = eo.be.kv_dtype == DT_F8_E4M3;
    {
        const struct tensor_view *lm[1] = {b.model->cfg.tie_embeddings ? &b.model->embed : &b.model->lm_head};
        char why[256];
        b.roof.fp8_lm_head = eo.be.weight_dtype != BE_WEIGHTS_F16 && /* fp16 mode: never fp8 */
                             fp8_linear_use(eo.be.lm_head_dtype, lm, 1, why, sizeof why);
    }

    if (b.has_bg)
        log_info("bench: %s, background %s: %d requests x %d in / %d out in the long lane", model_name,
                 b.bg.wl->name, b.bg.n_req, b.bg.in_len, b.bg.out_len);
    log_info("bench: %s, workload %s: %d requests x %d in / %d out%s, backend %s", model_name, b.fg.wl->name,
             b.fg.n_req, b.fg.in_len, b.fg.out_len, lanes ? " in the short lane" : "",
             engine_backend_name(b.eng));
    double t_bg = llmq_mono_s();
    if (b.has_bg) { /* the background first, until the long lane has run a step */
        if (submit(&b, &b.bg, true, err, sizeof err)) {
            fprintf(stderr, "llmq %s: background request: %s\n", CMD, err);
            bench_free(&b);
            return 1;
        }
        run_engine(&b, NULL, false, UNTIL_BG_STARTED);
    }
    struct progress *bar = progress_new(stderr, "requests", b.fg.n_req);
    double t0 = llmq_mono_s();
    if (submit(&b, &b.fg, false, err, sizeof err)) {
        progress_free(bar);
        fprintf(stderr, "llmq %s: request: %s\n", CMD, err);
        bench_free(&b);
        return 1;
    }
    int drc = run_engine(&b, bar, true, UNTIL_FG_DONE);
    double t_end = llmq_mono_s(), secs = t_end - t0;
    double wall = b.has_bg ? t_end - t_bg : secs; /* the roofline's window: from the first submission */
    progress_finish(bar);
    progress_free(bar);
    struct engine_stats st;
    engine_get_stats(b.eng, &st);
    struct bench_roofline roof = b.roof;
    if (b.has_bg) { /* record the background's progress, then stop it */
        for (int i = 0; i < b.bg.n_req; i++) {
            struct engine_seq *q = b.bg.seq[i];
            if (!q)
                continue;
            b.bg_output_tokens += q->n_output;
            b.bg_prefilled += q->n_output > 0;
            engine_cancel(b.eng, q);
        }
        b.bg_finished = b.bg.done;
        b.bg_prefilled += b.bg.done;
        b.bg_output_tokens += (int64_t)b.bg.done * b.bg.out_len;
        run_engine(&b, NULL, false, UNTIL_IDLE);
    }

    uint64_t out_tokens = (uint64_t)b.fg_tokens;
    json_t *j = json_object();
    json_object_set_new(j, "engine", json_string("llmq"));
    json_object_set_new(j, "model", json_string(model_name));
    json_object_set_new(j, "workload", json_string(b.fg.wl->name));
    json_object_set_new(j, "requests", json_integer(b.fg.n_req));
    json_object_set_new(j, "input_len", json_integer(b.fg.in_len));
    json_object_set_new(j, "output_len", json_integer(b.fg.out_len));
    json_object_set_new(j, "seconds", json_real(r3(secs)));
    json_object_set_new(j, "requests_per_s", json_real(r3(b.fg.n_req / secs)));
    json_object_set_new(j, "output_tokens_per_s", json_real(r1((double)out_tokens / secs)));
    json_object_set_new(j, "total_tokens_per_s",
                        json_real(r1(((double)out_tokens + (double)b.fg.n_req * b.fg.in_len) / secs)));
    size_t n_ttft = b.n_ttft, n_itl = b.n_itl;
    json_object_set_new(j, "ttft_ms_p50", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 50))));
    json_object_set_new(j, "ttft_ms_p95", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 95))));
    json_object_set_new(j, "ttft_ms_p99", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 99))));
    json_object_set_new(j, "itl_ms_p50", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 50))));
    json_object_set_new(j, "itl_ms_p95", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 95))));
    json_object_set_new(j, "itl_ms_p99", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 99))));
    /* prefix cache over the timed requests (vLLM's token counts) */
    uint64_t pq = st.prefix_query_tokens - st0.prefix_query_tokens;
    uint64_t ph = st.prefix_hit_tokens - st0.prefix_hit_tokens;
    json_object_set_new(j, "shared_prefix", json_integer(shared));
    json_object_set_new(j, "prefix_caching", json_boolean(eo.enable_prefix_caching));
    json_object_set_new(j, "prefix_cache_queries", json_integer((json_int_t)pq));
    json_object_set_new(j, "prefix_cache_hits", json_integer((json_int_t)ph));
    json_object_set_new(j, "prefix_cache_hit_rate", json_real(pq ? r4((double)ph / (double)pq) : 0));
    json_t *peak = json_null(), *dev = json_null(), *graphs = json_null(), *taken = json_null(),
           *dropped = json_null(), *copies = json_null(), *gemm_made = json_null(),
           *gemm_loaded = json_null();
#ifdef LLMQ_HAVE_CUDA_BACKEND
    struct cuda_backend_stats cs;
    if (cuda_backend_get_stats(bench_inner_backend(b.be), &cs) == 0) {
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
                        json_string(eo.be.weight_dtype == BE_WEIGHTS_FP8    ? "fp8"
                                    : eo.be.weight_dtype == BE_WEIGHTS_BF16 ? "bf16"
                                    : eo.be.weight_dtype == BE_WEIGHTS_F16  ? "fp16"
                                                                            : "auto"));
    const char *w16 = eo.be.weight_dtype == BE_WEIGHTS_F16 ? "fp16" : "bf16"; /* the 16-bit type */
    json_object_set_new(j, "lm_head_dtype", json_string(b.roof.fp8_lm_head ? "fp8" : w16));
    json_object_set_new(j, "kv_cache_dtype", json_string(eo.be.kv_dtype == DT_F8_E4M3 ? "fp8" : w16));
    json_object_set_new(j, "decode_weight_copies_gb", copies);
    json_object_set_new(j, "gemm_choices_made", gemm_made);
    json_object_set_new(j, "gemm_choices_from_file", gemm_loaded);
    json_object_set_new(j, "kv_blocks", json_integer(st.kv_blocks_total));
    json_object_set_new(j, "kv_tokens", json_integer((json_int_t)st.kv_blocks_total * b.be->block_size));
    json_object_set_new(j, "max_model_len", json_integer(engine_max_model_len(b.eng, -1)));
    json_object_set_new(j, "preemptions", json_integer((json_int_t)(st.preemptions - st0.preemptions)));
    json_object_set_new(j, "admission_reserve", json_real(eo.admission_reserve));
    json_object_set_new(j, "steps", json_integer((json_int_t)roof.steps));
    json_object_set_new(j, "graph_replays", graphs);
    json_object_set_new(j, "guessed_steps", taken);
    json_object_set_new(j, "dropped_guesses", dropped);
    json_object_set_new(j, "ideal_s", json_real(r6(roof.ideal_s)));
    json_object_set_new(j, "roofline_efficiency", json_real(round(roof.ideal_s / wall * 1e4) / 1e4));
    json_object_set_new(j, "compute_bound_steps", json_integer((json_int_t)roof.compute_bound_steps));
    json_object_set_new(j, "attention_ideal_s", json_real(r6(roof.attn_ideal_s)));
    json_object_set_new(
        j, "attention_ideal_share",
        json_real(roof.ideal_s > 0 ? round(roof.attn_ideal_s / roof.ideal_s * 1e4) / 1e4 : 0.0));
    json_object_set_new(j, "backend", json_string(engine_backend_name(b.eng)));
    json_object_set_new(j, "gpu", dev);
    json_t *lj = json_null();
    if (lanes) {
        lj = json_object();
        static const char *const names[2] = {"short", "long"};
        for (int l = 0; l < 2; l++) { /* the caps in force: a lane's, at most the global one */
            int seqs = eo.lanes[l].max_num_seqs, toks = eo.lanes[l].max_num_batched_tokens;
            seqs = seqs > 0 && seqs < eo.be.max_num_seqs ? seqs : eo.be.max_num_seqs;
            toks = toks > 0 && toks < eo.be.max_num_batched_tokens ? toks : eo.be.max_num_batched_tokens;
            json_object_set_new(lj, names[l],
                                json_pack("{s:i, s:i, s:i}", "max_num_seqs", seqs, "max_num_batched_tokens",
                                          toks, "max_model_len", engine_max_model_len(b.eng, l)));
        }
    }
    json_object_set_new(j, "lanes", lj);
    json_object_set_new(j, "settings", b.settings ? json_incref(b.settings) : json_object());
    json_t *bj = json_null();
    if (b.has_bg) {
        uint64_t bg_computed = st.lane_computed_tokens[b.bg.lane] - st0.lane_computed_tokens[b.bg.lane];
        bj = json_object();
        json_object_set_new(bj, "workload", json_string(b.bg.wl->name));
        json_object_set_new(bj, "lane", json_string("long"));
        json_object_set_new(bj, "requests", json_integer(b.bg.n_req));
        json_object_set_new(bj, "input_len", json_integer(b.bg.in_len));
        json_object_set_new(bj, "output_len", json_integer(b.bg.out_len));
        json_object_set_new(bj, "lead_s", json_real(r3(t0 - t_bg)));
        json_object_set_new(bj, "seconds", json_real(r3(wall)));
        json_object_set_new(bj, "finished", json_integer(b.bg_finished));
        json_object_set_new(bj, "prefilled", json_integer(b.bg_prefilled));
        json_object_set_new(bj, "computed_tokens", json_integer((json_int_t)bg_computed));
        json_object_set_new(bj, "output_tokens", json_integer((json_int_t)b.bg_output_tokens));
        json_object_set_new(bj, "computed_tokens_per_s", json_real(r1((double)bg_computed / wall)));
        json_object_set_new(
            bj, "progress",
            json_real(r4((double)bg_computed / ((double)b.bg.n_req * (double)(b.bg.in_len + b.bg.out_len)))));
    }
    json_object_set_new(j, "background", bj);
    json_object_set_new(j, "failed", json_integer(b.failed));
    char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(j);
    if (line) {
        printf("%s\n", line);
        fflush(stdout);
        free(line);
    }
    if (drc)
        fprintf(stderr, "llmq %s: %d requests failed; the first: %s\n", CMD, b.failed, b.first_error);
    bench_free(&b);
    return drc ? 1 : 0;
}
