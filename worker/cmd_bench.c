/* `llmq bench`: a named workload through the real engine, one JSON line of results.
 *
 * Every request is submitted at t = 0 (random prompt ids, seeded; greedy; EOS ignored, exactly
 * output_len tokens each) and the engine steps until all are done. A warm-up request runs first
 * (not timed). The backend is wrapped (engine/bench.h) so that every step the engine runs adds
 * to the roofline: ideal time over real time is the roofline efficiency. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/bench.h"
#include "engine/engine.h"
#include "engine/gpu.h"
#include "engine/log.h"
#include "engine/model.h"
#include "engine/random_model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "worker/cli.h"
#include "worker/progress.h"
#ifdef LLMQ_HAVE_CUDA_BACKEND
#include "engine/cuda_backend.h"
#endif

static const char CMD[] = "bench";

#define PROMPT_ID_RANGE 150000 /* prompt ids are drawn from [0, min(vocab, this)), as hf_peer.py does */

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq bench (--model DIR | --random-weights SHAPE) --workload W [options]\n"
        "\n"
        "Runs a fixed workload through the engine and prints one JSON line on stdout: requests/s, output\n"
        "and total tokens/s, TTFT and inter-token latency percentiles, peak GPU memory, KV cache size,\n"
        "preemptions and the roofline efficiency. Prompts are random token ids; every request generates\n"
        "exactly its output length (EOS ignored, greedy). All requests are submitted at once.\n"
        "\n"
        "  -m, --model DIR                 a Hugging Face model folder\n"
        "  -r, --random-weights SHAPE      qwen3-14b | qwen3-8b | qwen3-0.6b, random bf16 weights, no files\n"
        "                                  (the CPU backend takes only qwen3-0.6b)\n"
        "  -w, --workload W                chat (1000 x 512 in / 128 out), decode (512 x 128 / 1024),\n"
        "                                  summarize (200 x 4096 / 256), longdoc (8 x 65536 / 256),\n"
        "                                  single (1 x 128 / 512)\n"
        "  -n, --num-prompts N             requests (default: the workload's)\n"
        "      --backend B                 auto | cpu | cuda (default auto)\n"
        "      --max-num-seqs N            sequences per step (default 256)\n"
        "      --max-num-batched-tokens N  tokens per step (default 8192)\n"
        "      --max-model-len N           longest sequence (default: input + output length)\n"
        "      --block-size N              KV block size in tokens (default 32)\n"
        "      --gpu-memory-utilization X  share of GPU memory for weights, activations and KV (default "
        "0.92)\n"
        "      --no-cuda-graphs            run decode steps eagerly\n"
        "      --threads N                 CPU backend threads (default all)\n"
        "      --seed N                    prompt seed (default 0)\n"
        "  -h, --help                      this text\n"
        "\n"
        "Exit status: 0 every request finished, 1 the run failed, 2 the command line is wrong.\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

/* Removes the files of a flat temporary folder, then the folder. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4096 + 512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%.4000s/%.255s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* A tokenizer for random-weights runs (the engine needs one for text; random ids have none):
 * the minimal byte-level one make-tiny-model writes, from a temporary folder. */
static struct tok *scratch_tokenizer(char *err, size_t errlen)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%.400s/llmq-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
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
    remove_dir(dir);
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

/* Per request: when its last token came (for inter-token latency). */
struct req {
    double last;
    bool done;
};

struct bench {
    const struct bench_workload *wl;
    int n_req, in_len, out_len;
    struct model *model;
    bool random;
    struct tok *tok;
    struct engine *eng;
    struct backend *be; /* the wrapper, owned by the engine */
    struct bench_roofline roof;
    int32_t *prompts; /* [n_req][in_len] */
    struct req *reqs;
    double *ttft, *itl;
    size_t n_ttft, n_itl, cap_itl;
    int failed;
    char first_error[512];
};

static void bench_free(struct bench *b)
{
    engine_free(b->eng);
    tok_free(b->tok);
    if (b->random)
        random_model_free(b->model);
    else
        model_free(b->model);
    free(b->prompts);
    free(b->reqs);
    free(b->ttft);
    free(b->itl);
}

/* Steps the engine until it is idle; records latencies when reqs is set. */
static int drain(struct bench *b, struct progress *bar, bool record)
{
    int64_t done = 0, tokens = 0;
    while (engine_has_work(b->eng)) {
        struct engine_seq **ch;
        int nc;
        engine_step(b->eng, &ch, &nc);
        double t = now_s();
        for (int i = 0; i < nc; i++) {
            struct engine_seq *q = ch[i];
            intptr_t idx = (intptr_t)q->user;
            if (record && idx >= 0 && q->n_new_output) {
                struct req *r = &b->reqs[idx];
                if (q->n_output == 1) {
                    b->ttft[b->n_ttft++] = q->t_first_token - q->t_arrival;
                } else if (b->n_itl < b->cap_itl) {
                    b->itl[b->n_itl++] = t - r->last;
                }
                r->last = t;
                tokens++;
            }
            if (q->finished) {
                if (q->finish == FINISH_ERROR) {
                    if (!b->failed++)
                        snprintf(b->first_error, sizeof b->first_error, "%s", q->error);
                } else if (record && q->n_output != b->out_len && !b->failed++) {
                    snprintf(b->first_error, sizeof b->first_error,
                             "a request finished with %d tokens, not %d", q->n_output, b->out_len);
                }
                if (record && idx >= 0)
                    b->reqs[idx].done = true;
                done++;
                engine_release(b->eng, q);
            }
        }
        progress_update(bar, done, tokens);
    }
    return b->failed ? -1 : 0;
}

static struct engine_request request(const int32_t *prompt, int n, int out, uint64_t seed, intptr_t user)
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
    r.user = (void *)user;
    return r;
}

static double r3(double x)
{
    return round(x * 1000) / 1000;
}
static double r1(double x)
{
    return round(x * 10) / 10;
}
static double r6(double x)
{
    return round(x * 1e6) / 1e6;
}

int cmd_bench(int argc, char **argv)
{
    enum { O_BACKEND = 256, O_SEQS, O_TOKENS, O_MML, O_BS, O_UTIL, O_NOGRAPH, O_THREADS, O_SEED };
    static const struct option longopts[] = {{"model", required_argument, NULL, 'm'},
                                             {"random-weights", required_argument, NULL, 'r'},
                                             {"workload", required_argument, NULL, 'w'},
                                             {"num-prompts", required_argument, NULL, 'n'},
                                             {"backend", required_argument, NULL, O_BACKEND},
                                             {"max-num-seqs", required_argument, NULL, O_SEQS},
                                             {"max-num-batched-tokens", required_argument, NULL, O_TOKENS},
                                             {"max-model-len", required_argument, NULL, O_MML},
                                             {"block-size", required_argument, NULL, O_BS},
                                             {"gpu-memory-utilization", required_argument, NULL, O_UTIL},
                                             {"no-cuda-graphs", no_argument, NULL, O_NOGRAPH},
                                             {"threads", required_argument, NULL, O_THREADS},
                                             {"seed", required_argument, NULL, O_SEED},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *model_dir = NULL, *shape = NULL, *workload = NULL, *backend = "auto";
    int num_prompts = 0, mml = 0, seed = 0, c, rc = 0;
    struct engine_opts eo = engine_opts_default();
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:r:w:n:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'm':
            model_dir = optarg;
            break;
        case 'r':
            shape = optarg;
            break;
        case 'w':
            workload = optarg;
            break;
        case 'n':
            rc = parse_int("--num-prompts", optarg, 1, &num_prompts);
            break;
        case O_BACKEND:
            backend = optarg;
            if (strcmp(backend, "auto") && strcmp(backend, "cpu") && strcmp(backend, "cuda"))
                rc = cli_usage_error(CMD, "--backend: '%s' (expected auto, cpu or cuda)", backend);
            break;
        case O_SEQS:
            rc = parse_int("--max-num-seqs", optarg, 1, &eo.be.max_num_seqs);
            break;
        case O_TOKENS:
            rc = parse_int("--max-num-batched-tokens", optarg, 1, &eo.be.max_num_batched_tokens);
            break;
        case O_MML:
            rc = parse_int("--max-model-len", optarg, 1, &mml);
            break;
        case O_BS:
            rc = parse_int("--block-size", optarg, 1, &eo.be.block_size);
            break;
        case O_THREADS:
            rc = parse_int("--threads", optarg, 0, &eo.be.threads);
            break;
        case O_SEED:
            rc = parse_int("--seed", optarg, 0, &seed);
            break;
        case O_UTIL: {
            char *end;
            errno = 0;
            double u = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(u > 0 && u <= 1))
                rc = cli_usage_error(CMD, "--gpu-memory-utilization: '%s' is not a number in (0, 1]", optarg);
            eo.be.gpu_memory_utilization = u;
            break;
        }
        case O_NOGRAPH:
            eo.be.cuda_graphs = false;
            break;
        default:
            return cli_bad_option(CMD, argc, argv);
        }
        if (rc)
            return rc;
    }
    if (optind < argc)
        return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!model_dir == !shape)
        return cli_usage_error(CMD, "give one of --model DIR or --random-weights SHAPE");
    if (!workload)
        return cli_usage_error(CMD, "--workload is required (%s)", bench_workload_names());
    struct bench b;
    memset(&b, 0, sizeof b);
    b.wl = bench_workload_find(workload);
    if (!b.wl)
        return cli_usage_error(CMD, "--workload: '%s' (expected %s)", workload, bench_workload_names());
    b.n_req = num_prompts ? num_prompts : b.wl->requests;
    b.in_len = b.wl->input_len;
    b.out_len = b.wl->output_len;

    char err[1024], gpu[256] = "";
    /* which backend: decided here so random weights know whether to live on the host */
    bool gpu_ok = gpu_backend_built() && gpu_describe(gpu, sizeof gpu) == 0;
    const char *be_name = strcmp(backend, "auto") ? backend : gpu_ok ? "cuda" : "cpu";
    char model_name[256];
    if (shape) {
        struct model_config cfg, small;
        if (random_model_config(shape, &cfg, err, sizeof err))
            return cli_usage_error(CMD, "--random-weights: %s", err);
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
            return 1;
        }
        b.random = true;
        b.model = random_model_create(&cfg, !strcmp(be_name, "cpu"), err, sizeof err);
        if (!b.model) {
            fprintf(stderr, "llmq %s: %s\n", CMD, err);
            return 1;
        }
        b.tok = scratch_tokenizer(err, sizeof err);
        snprintf(model_name, sizeof model_name, "%s", shape);
    } else {
        b.model = model_load(model_dir, err, sizeof err);
        if (!b.model) {
            fprintf(stderr, "llmq %s: model %s: %s\n", CMD, model_dir, err);
            return 1;
        }
        b.tok = tok_load_dir(model_dir, err, sizeof err);
        snprintf(model_name, sizeof model_name, "%s", base_name(model_dir));
    }
    if (!b.tok) {
        fprintf(stderr, "llmq %s: tokenizer: %s\n", CMD, err);
        bench_free(&b);
        return 1;
    }

    /* the engine over a measuring wrapper of the backend */
    eo.be.max_model_len = mml ? mml : b.in_len + b.out_len;
    eo.seed = (uint64_t)seed;
    struct backend *inner = backend_open(be_name, b.model, &eo.be, err, sizeof err);
    if (!inner) {
        fprintf(stderr, "llmq %s: backend %s: %s\n", CMD, be_name, err);
        bench_free(&b);
        return 1;
    }
    b.be = bench_wrap_backend(inner, &b.model->cfg, &b.roof);
    if (b.be)
        b.eng = engine_open_backend(b.model, b.tok, b.be, &eo, err, sizeof err);
    if (!b.eng) {
        fprintf(stderr, "llmq %s: engine: %s\n", CMD, b.be ? err : "out of memory");
        bench_free(&b);
        return 1;
    }
    if (b.in_len + b.out_len > engine_max_model_len(b.eng, 0)) {
        fprintf(stderr,
                "llmq %s: the workload needs %d tokens per sequence; the engine holds %d (--max-model-len, "
                "or the KV cache is too small)\n",
                CMD, b.in_len + b.out_len, engine_max_model_len(b.eng, 0));
        bench_free(&b);
        return 1;
    }

    /* prompts */
    int vocab = b.model->cfg.vocab < PROMPT_ID_RANGE ? b.model->cfg.vocab : PROMPT_ID_RANGE;
    b.prompts = malloc((size_t)b.n_req * b.in_len * sizeof *b.prompts);
    b.reqs = calloc((size_t)b.n_req, sizeof *b.reqs);
    b.ttft = malloc((size_t)b.n_req * sizeof *b.ttft);
    b.cap_itl = (size_t)b.n_req * (b.out_len > 1 ? b.out_len - 1 : 1);
    b.itl = malloc(b.cap_itl * sizeof *b.itl);
    if (!b.prompts || !b.reqs || !b.ttft || !b.itl) {
        fprintf(stderr, "llmq %s: out of memory for %d requests\n", CMD, b.n_req);
        bench_free(&b);
        return 1;
    }
    uint64_t s = (uint64_t)seed * 0x2545f4914f6cdd1dull + 1;
    for (size_t i = 0; i < (size_t)b.n_req * b.in_len; i++)
        b.prompts[i] = (int32_t)(splitmix64(&s) % (uint64_t)vocab);

    /* warm-up: one request (its own prompt) through prefill and a few decode steps, not timed */
    {
        int wn = b.in_len < eo.be.max_num_batched_tokens ? b.in_len : eo.be.max_num_batched_tokens;
        int32_t *wp = malloc((size_t)wn * sizeof *wp);
        if (!wp) {
            fprintf(stderr, "llmq %s: out of memory\n", CMD);
            bench_free(&b);
            return 1;
        }
        uint64_t ws = 0x5eedull + (uint64_t)seed;
        for (int i = 0; i < wn; i++)
            wp[i] = (int32_t)(splitmix64(&ws) % (uint64_t)vocab);
        int wout = b.out_len < 4 ? b.out_len : 4;
        if (wn + wout > engine_max_model_len(b.eng, 0))
            wout = 1;
        struct engine_request r = request(wp, wn, wout, 1, -1);
        struct engine_seq *q = engine_add(b.eng, &r, err, sizeof err);
        free(wp);
        if (!q || drain(&b, NULL, false)) {
            fprintf(stderr, "llmq %s: warm-up: %s\n", CMD, q ? b.first_error : err);
            bench_free(&b);
            return 1;
        }
    }
    struct engine_stats st0;
    engine_get_stats(b.eng, &st0);
    memset(&b.roof, 0, sizeof b.roof);

    log_info("bench: %s, workload %s: %d requests x %d in / %d out, backend %s", model_name, b.wl->name,
             b.n_req, b.in_len, b.out_len, engine_backend_name(b.eng));
    struct progress *bar = progress_new(stderr, "requests", b.n_req);
    double t0 = now_s();
    for (int i = 0; i < b.n_req; i++) {
        struct engine_request r =
            request(b.prompts + (size_t)i * b.in_len, b.in_len, b.out_len, (uint64_t)i, i);
        if (!engine_add(b.eng, &r, err, sizeof err)) {
            progress_free(bar);
            fprintf(stderr, "llmq %s: request %d: %s\n", CMD, i, err);
            bench_free(&b);
            return 1;
        }
        b.reqs[i].last = t0;
    }
    int drc = drain(&b, bar, true);
    double secs = now_s() - t0;
    progress_finish(bar);
    progress_free(bar);

    struct engine_stats st;
    engine_get_stats(b.eng, &st);
    uint64_t out_tokens = st.generated_tokens - st0.generated_tokens;
    json_t *j = json_object();
    json_object_set_new(j, "engine", json_string("llmq"));
    json_object_set_new(j, "model", json_string(model_name));
    json_object_set_new(j, "workload", json_string(b.wl->name));
    json_object_set_new(j, "requests", json_integer(b.n_req));
    json_object_set_new(j, "input_len", json_integer(b.in_len));
    json_object_set_new(j, "output_len", json_integer(b.out_len));
    json_object_set_new(j, "seconds", json_real(r3(secs)));
    json_object_set_new(j, "requests_per_s", json_real(r3(b.n_req / secs)));
    json_object_set_new(j, "output_tokens_per_s", json_real(r1((double)out_tokens / secs)));
    json_object_set_new(j, "total_tokens_per_s",
                        json_real(r1(((double)out_tokens + (double)b.n_req * b.in_len) / secs)));
    size_t n_ttft = b.n_ttft, n_itl = b.n_itl;
    json_object_set_new(j, "ttft_ms_p50", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 50))));
    json_object_set_new(j, "ttft_ms_p95", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 95))));
    json_object_set_new(j, "ttft_ms_p99", json_real(r1(1e3 * bench_percentile(b.ttft, n_ttft, 99))));
    json_object_set_new(j, "itl_ms_p50", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 50))));
    json_object_set_new(j, "itl_ms_p95", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 95))));
    json_object_set_new(j, "itl_ms_p99", json_real(r3(1e3 * bench_percentile(b.itl, n_itl, 99))));
    json_t *peak = json_null(), *dev = json_null(), *graphs = json_null();
#ifdef LLMQ_HAVE_CUDA_BACKEND
    struct cuda_backend_stats cs;
    if (cuda_backend_get_stats(bench_inner_backend(b.be), &cs) == 0) {
        peak = json_real(r1((double)cs.peak_used_bytes / 1e9));
        dev = json_string(cs.device);
        graphs = json_integer((json_int_t)cs.graph_replays);
    }
#endif
    json_object_set_new(j, "peak_gpu_mem_gb", peak);
    json_object_set_new(j, "kv_blocks", json_integer(st.kv_blocks_total));
    json_object_set_new(j, "kv_tokens", json_integer((json_int_t)st.kv_blocks_total * b.be->block_size));
    json_object_set_new(j, "preemptions", json_integer((json_int_t)(st.preemptions - st0.preemptions)));
    json_object_set_new(j, "steps", json_integer((json_int_t)b.roof.steps));
    json_object_set_new(j, "graph_replays", graphs);
    json_object_set_new(j, "ideal_s", json_real(r6(b.roof.ideal_s)));
    json_object_set_new(j, "roofline_efficiency", json_real(round(b.roof.ideal_s / secs * 1e4) / 1e4));
    json_object_set_new(j, "compute_bound_steps", json_integer((json_int_t)b.roof.compute_bound_steps));
    json_object_set_new(j, "backend", json_string(engine_backend_name(b.eng)));
    json_object_set_new(j, "gpu", dev);
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
