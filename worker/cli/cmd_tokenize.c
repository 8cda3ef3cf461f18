/* `llmq tokenize`: JSON lines in, token ids / text / rendered prompts out; and a tokenizer benchmark. */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "worker/cli/cli.h"
#include "worker/cli/tokenize_lines.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: llmq tokenize (--model DIR | --tokenizer FILE) [--chat-template FILE]\n"
        "                     [--skip-special-tokens] [--bench FILE [--threads N]]\n"
        "\n"
        "Reads JSON lines on stdin and writes one JSON line per input line on stdout:\n"
        "  {\"text\": \"...\"}                        -> {\"ids\": [...]}\n"
        "  {\"messages\": [...], \"tools\": [...], \"documents\": [...], \"add_generation_prompt\": bool,\n"
        "   \"chat_template_kwargs\": {...}, \"enable_thinking\": bool}\n"
        "                                         -> {\"text\": \"<rendered prompt>\", \"ids\": [...]}\n"
        "  {\"ids\": [...]}                         -> {\"text\": \"...\"}\n"
        "Messages are rendered with the model's chat template as transformers' apply_chat_template\n"
        "does (add_generation_prompt defaults to true; enable_thinking and chat_template_kwargs reach\n"
        "the template only when given, the kwargs' enable_thinking first). A template that calls\n"
        "raise_exception gets {\"error\": \"<its message>\"}; any other bad line gets\n"
        "{\"error\": \"line N: ...\"}. The rest still runs and the exit status is 1.\n"
        "\"text\" is encoded as Hugging Face's tokenizer.encode(text) does; a rendered chat prompt\n"
        "already has its special tokens and gets none added.\n"
        "\n"
        "Options:\n"
        "  --model DIR             a model folder with tokenizer.json (and tokenizer_config.json)\n"
        "  --tokenizer FILE        a tokenizer.json; tokenizer_config.json is read from beside it\n"
        "  --chat-template FILE    a Jinja chat template used instead of the model's own\n"
        "                          (docs/CHAT_TEMPLATES.md)\n"
        "  --skip-special-tokens   leave special tokens out when decoding ids\n"
        "  --bench FILE            instead: time loading, and encoding FILE whole and line by line\n"
        "                          (MB/s: 10^6 bytes of FILE per second, one thread)\n"
        "  --threads N             with --bench, also encode the lines from N threads at once\n"
        "  -h, --help              this text\n"
        "\n"
        "Exit status: 0 ok, 1 a line failed or the tokenizer did not load, 2 the command line is wrong.\n");
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

/* CPU time of the calling thread: on a shared machine the honest measure of one core's rate. */
static double cpu_now(void)
{
    return clock_s(CLOCK_THREAD_CPUTIME_ID);
}

static struct tok *load(const char *model, const char *file, char *err, size_t errlen)
{
    if (model)
        return tok_load_dir(model, err, errlen);
    /* tokenizer_config.json beside the file, if there is one */
    size_t n = strlen(file);
    char *cfg = malloc(n + 32);
    if (!cfg) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    const char *slash = strrchr(file, '/');
    size_t dir = slash ? (size_t)(slash - file) + 1 : 0;
    memcpy(cfg, file, dir);
    strcpy(cfg + dir, "tokenizer_config.json");
    struct stat st;
    struct tok *tok = tok_load(file, stat(cfg, &st) == 0 ? cfg : NULL, err, errlen);
    free(cfg);
    return tok;
}

/* ---- --bench */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct buf b = {0};
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0 && buf_append(&b, chunk, k) == 0)
        ;
    fclose(f);
    *len = b.len;
    return buf_take(&b); /* NULL when out of memory */
}

/* Encodes text whole (lines = false) or line by line; returns seconds and the token count. */
static int encode_pass(const struct tok *tok, const char *text, size_t len, bool lines, double *secs,
                       double *cpu, size_t *tokens)
{
    char err[512];
    double t0 = now(), c0 = cpu_now();
    size_t total = 0;
    for (size_t off = 0; off < len || (!lines && off == 0 && len == 0);) {
        size_t end = len;
        if (lines) {
            const char *nl = memchr(text + off, '\n', len - off);
            end = nl ? (size_t)(nl - text) + 1 : len;
        }
        int32_t *ids;
        size_t n;
        if (tok_encode(tok, text + off, end - off, &ids, &n, err, sizeof err) != 0) {
            fprintf(stderr, "llmq tokenize: --bench: %s\n", err);
            return -1;
        }
        free(ids);
        total += n;
        off = end;
        if (off >= len)
            break;
    }
    *secs = now() - t0;
    *cpu = cpu_now() - c0;
    *tokens = total;
    return 0;
}

struct share {
    const struct tok *tok;
    const char *text;
    size_t len;
    int runs, rc;
};

static void *encode_share(void *arg)
{
    struct share *sh = arg;
    double secs, cpu;
    size_t tokens;
    for (int i = 0; i < sh->runs && sh->rc == 0; i++)
        sh->rc = encode_pass(sh->tok, sh->text, sh->len, true, &secs, &cpu, &tokens);
    return NULL;
}

/* The lines of text split into n contiguous shares, each encoded `runs` times by its own thread
 * with the one shared tokenizer; prints the combined rate. */
static int bench_threads(const struct tok *tok, const char *text, size_t len, int n)
{
    struct share *sh = calloc((size_t)n, sizeof *sh);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!sh || !th) {
        free(sh);
        free(th);
        return -1;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t end = i == n - 1 ? len : len / (size_t)n * (size_t)(i + 1);
        while (end < len && end > off && text[end - 1] != '\n')
            end++;
        sh[i] = (struct share){tok, text + off, end > off ? end - off : 0, 5, 0};
        off = end > off ? end : off;
    }
    double t0 = now();
    int rc = 0, started = 0;
    for (int i = 0; i < n; i++, started++)
        if (pthread_create(&th[i], NULL, encode_share, &sh[i]) != 0) {
            rc = -1;
            break;
        }
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        rc = rc ? rc : sh[i].rc;
    }
    double secs = now() - t0;
    if (rc == 0)
        printf("by lines, %d threads: %.1f MB/s together, wall-clock (%d runs each)\n", n,
               (double)len * 5 / secs / 1e6, 5);
    free(sh);
    free(th);
    return rc;
}

static int bench(const char *model, const char *file, const char *path, int threads)
{
    char err[1024];
    size_t len;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "llmq tokenize: --bench: cannot read %s\n", path);
        return 1;
    }
    double best_load = 1e9, best_load_cpu = 1e9, worst_load = 0;
    struct tok *tok = NULL;
    for (int i = 0; i < 3; i++) {
        tok_free(tok);
        double t0 = now(), c0 = cpu_now();
        tok = load(model, file, err, sizeof err);
        double t = now() - t0, c = cpu_now() - c0;
        if (!tok) {
            fprintf(stderr, "llmq tokenize: %s\n", err);
            free(text);
            return 1;
        }
        best_load = t < best_load ? t : best_load;
        best_load_cpu = c < best_load_cpu ? c : best_load_cpu;
        worst_load = t > worst_load ? t : worst_load;
    }
    printf("tokenizer: %s (%d ids)\n", model ? model : file, tok_vocab_size(tok));
    printf("load: %.3f s best of 3 (worst %.3f s); CPU time %.3f s\n", best_load, worst_load, best_load_cpu);
    printf("input: %s, %zu bytes; MB/s below are 10^6 input bytes per second of this thread's CPU time\n",
           path, len);
    int rc = 0;
    for (int lines = 0; lines < 2 && rc == 0; lines++) {
        double first, first_cpu, secs, cpu, wall = 0, total = 0, best = 1e9;
        size_t tokens;
        rc = encode_pass(tok, text, len, lines, &first, &first_cpu, &tokens);
        int runs = 0;
        while (rc == 0 && (runs < 3 || total < 2.0) && runs < 100) {
            rc = encode_pass(tok, text, len, lines, &secs, &cpu, &tokens);
            total += cpu;
            wall += secs;
            best = cpu < best ? cpu : best;
            runs++;
        }
        if (rc == 0)
            printf("%-11s %zu tokens (%.2f bytes/token): first pass %.1f MB/s; repeated %.1f MB/s mean, %.1f "
                   "best (%d runs); wall-clock mean %.1f MB/s\n",
                   lines ? "by lines:" : "whole file:", tokens, tokens ? (double)len / (double)tokens : 0.0,
                   (double)len / first_cpu / 1e6, (double)len * runs / total / 1e6, (double)len / best / 1e6,
                   runs, (double)len * runs / wall / 1e6);
    }
    if (rc == 0 && threads > 1)
        rc = bench_threads(tok, text, len, threads);
    uint64_t hits, misses;
    tok_stats(tok, &hits, &misses);
    printf("pre-token cache: %llu hits, %llu misses\n", (unsigned long long)hits, (unsigned long long)misses);
    tok_free(tok);
    free(text);
    return rc ? 1 : 0;
}

int cmd_tokenize(int argc, char **argv)
{
    enum { OPT_MODEL = 256, OPT_TOKENIZER, OPT_SKIP, OPT_BENCH, OPT_THREADS, OPT_CHAT_TEMPLATE };
    static const struct option opts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
        {"skip-special-tokens", no_argument, NULL, OPT_SKIP},
        {"bench", required_argument, NULL, OPT_BENCH},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *file = NULL, *bench_file = NULL, *chat_file = NULL;
    bool skip = false;
    int opt, threads = 1;
    char *end;
    static const char shortopts[] = ":h";
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        switch (opt) {
        case OPT_MODEL:
            model = optarg;
            break;
        case OPT_TOKENIZER:
            file = optarg;
            break;
        case OPT_CHAT_TEMPLATE:
            chat_file = optarg;
            break;
        case OPT_SKIP:
            skip = true;
            break;
        case OPT_BENCH:
            bench_file = optarg;
            break;
        case OPT_THREADS:
            threads = (int)strtol(optarg, &end, 10);
            if (*end || threads < 1 || threads > 256)
                return cli_usage_error("tokenize", "--threads: expected a number from 1 to 256, got '%s'",
                                       optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return cli_bad_option("tokenize", argc, argv, opts, shortopts);
        }
    }
    if (optind < argc)
        return cli_usage_error("tokenize", "unexpected argument '%s'", argv[optind]);
    if (!model == !file)
        return cli_usage_error("tokenize", "give exactly one of --model DIR and --tokenizer FILE");
    if (threads > 1 && !bench_file)
        return cli_usage_error("tokenize", "--threads goes with --bench");
    if (bench_file)
        return bench(model, file, bench_file, threads);
    char err[1024];
    struct tok *tok = load(model, file, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "llmq tokenize: %s\n", err);
        return 1;
    }
    /* the chat template lives beside tokenizer_config.json: the model folder, or the file's folder */
    char *dir = strdup(model ? model : file);
    if (!dir) {
        tok_free(tok);
        fprintf(stderr, "llmq tokenize: out of memory\n");
        return 1;
    }
    if (!model) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    struct tokenize_lines_opts lo = {.tok = tok,
                                     .tpl_dir = dir,
                                     .tpl_file = chat_file,
                                     .skip_special = skip,
                                     .threads = cores < 1 ? 1 : cores > 8 ? 8 : (int)cores};
    int rc = tokenize_lines(STDIN_FILENO, stdout, &lo);
    free(dir);
    tok_free(tok);
    return rc;
}
