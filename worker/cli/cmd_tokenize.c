/* `llmq tokenize`: JSON lines in, token ids / text / rendered prompts out; and a tokenizer benchmark. */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "worker/cli/cli.h"

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

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The tokenizer and, loaded on the first line with messages, the chat template. */
struct tk {
    const struct tok *tok;
    const char *tpl_dir;  /* the folder of tokenizer_config.json */
    const char *tpl_file; /* --chat-template, or NULL */
    struct chat_template *chat;
    bool chat_tried;
    char chat_err[1024];
    bool skip_special;
};

enum { ANSWER_OK = 0, ANSWER_BAD = -1, ANSWER_RAISED = -2 };

/* {"messages", ...}: the rendered prompt and its ids into *out. */
static int answer_chat(struct tk *t, json_t *in, json_t **out, char *err, size_t errlen)
{
    json_t *msgs = json_object_get(in, "messages"), *tools = json_object_get(in, "tools"),
           *docs = json_object_get(in, "documents"), *agp = json_object_get(in, "add_generation_prompt"),
           *kwargs = json_object_get(in, "chat_template_kwargs"),
           *think = json_object_get(in, "enable_thinking");
    if (!json_is_array(msgs))
        return errfmt(err, errlen, "\"messages\": expected an array");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return errfmt(err, errlen, "\"tools\": expected an array");
    if (docs && !json_is_null(docs) && !json_is_array(docs))
        return errfmt(err, errlen, "\"documents\": expected an array");
    if (agp && !json_is_boolean(agp))
        return errfmt(err, errlen, "\"add_generation_prompt\": expected true or false");
    if (kwargs && !json_is_object(kwargs))
        return errfmt(err, errlen, "\"chat_template_kwargs\": expected an object");
    if (think && !json_is_boolean(think))
        return errfmt(err, errlen, "\"enable_thinking\": expected true or false");
    if (!t->chat_tried) {
        t->chat_tried = true;
        t->chat = chat_template_load(t->tpl_dir, t->tpl_file, t->chat_err, sizeof t->chat_err);
    }
    if (!t->chat)
        return errfmt(err, errlen, "%s", t->chat_err);
    json_t *kw = kwargs ? json_copy(kwargs) : json_object();
    if (!kw)
        return errfmt(err, errlen, "out of memory");
    if (think && !json_object_get(kw, "enable_thinking"))
        json_object_set(kw, "enable_thinking", think);
    struct chat_input ci = {.messages = msgs,
                            .tools = json_is_array(tools) ? tools : NULL,
                            .documents = json_is_array(docs) ? docs : NULL,
                            .kwargs = kw,
                            .add_generation_prompt = agp ? json_is_true(agp) : true};
    char *prompt = NULL;
    size_t len = 0;
    int rc = chat_template_render(t->chat, &ci, &prompt, &len, err, errlen);
    json_decref(kw);
    if (rc == CHAT_RAISED)
        return ANSWER_RAISED;
    if (rc)
        return ANSWER_BAD;
    int32_t *v = NULL;
    size_t n = 0;
    if (tok_encode_ex(t->tok, prompt, len, false, &v, &n, err, errlen) != 0) {
        free(prompt);
        return ANSWER_BAD;
    }
    *out = json_pack("{s:s%,s:o}", "text", prompt, len, "ids", ids_json(v, n));
    free(prompt);
    free(v);
    return ANSWER_OK;
}

/* Answers one input line: a new JSON object in *out, or an error in err (ANSWER_RAISED: err is
 * the template's own message). */
static int answer(struct tk *t, const char *line, size_t len, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    json_error_t je;
    json_t *in = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    if (!in)
        return errfmt(err, errlen, "not valid JSON: %s (column %d)", je.text, je.column);
    const json_t *text = json_object_get(in, "text"), *msgs = json_object_get(in, "messages"),
                 *ids = json_object_get(in, "ids");
    const char *key;
    json_t *val;
    int rc = ANSWER_BAD;
    if (!json_is_object(in)) {
        snprintf(err, errlen, "expected a JSON object");
        goto done;
    }
    static const char *const chat_keys[] = {
        "tools", "documents", "add_generation_prompt", "chat_template_kwargs", "enable_thinking", NULL};
    json_object_foreach(in, key, val)
    {
        bool chat_key = false;
        for (const char *const *k = chat_keys; *k; k++)
            chat_key = chat_key || !strcmp(*k, key);
        if (chat_key && !msgs) {
            snprintf(err, errlen, "\"%s\" goes with \"messages\"", key);
            goto done;
        }
        if (!chat_key && strcmp(key, "text") && strcmp(key, "messages") && strcmp(key, "ids")) {
            snprintf(err, errlen, "unknown key '%s' (expected \"text\", \"messages\" or \"ids\")", key);
            goto done;
        }
    }
    if (!!text + !!msgs + !!ids != 1) {
        snprintf(err, errlen, "expected exactly one of \"text\", \"messages\", \"ids\"");
        goto done;
    }
    int32_t *v = NULL;
    size_t n = 0;
    if (text) {
        if (!json_is_string(text)) {
            snprintf(err, errlen, "\"text\": expected a string");
            goto done;
        }
        if (tok_encode(t->tok, json_string_value(text), json_string_length(text), &v, &n, err, errlen) != 0)
            goto done;
        *out = json_pack("{s:o}", "ids", ids_json(v, n));
        free(v);
    } else if (msgs) {
        rc = answer_chat(t, in, out, err, errlen);
        if (rc != ANSWER_OK)
            goto done;
    } else {
        if (!json_is_array(ids)) {
            snprintf(err, errlen, "\"ids\": expected an array of token ids");
            goto done;
        }
        n = json_array_size(ids);
        v = malloc((n ? n : 1) * sizeof *v);
        if (!v) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(ids, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= tok_vocab_size(t->tok)) {
                if (json_is_integer(x))
                    snprintf(err, errlen, "ids[%zu]: %lld is not a token id (vocabulary size %d)", i,
                             (long long)json_integer_value(x), tok_vocab_size(t->tok));
                else
                    snprintf(err, errlen, "ids[%zu]: expected an integer", i);
                free(v);
                goto done;
            }
            v[i] = (int32_t)json_integer_value(x);
        }
        char *s = NULL;
        size_t slen;
        int drc = tok_decode(t->tok, v, n, t->skip_special, &s, &slen, err, errlen);
        free(v);
        if (drc != 0)
            goto done;
        *out = json_pack("{s:s%}", "text", s, slen);
        free(s);
    }
    rc = ANSWER_OK;
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        rc = ANSWER_BAD;
    }
done:
    json_decref(in);
    return rc;
}

static int run_lines(struct tk *t)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int status = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        char err[1024];
        json_t *out = NULL;
        int rc = answer(t, line, (size_t)len, &out, err, sizeof err);
        if (rc == ANSWER_RAISED) {
            out = json_pack("{s:s}", "error", err);
            status = 1;
        } else if (rc != ANSWER_OK) {
            char msg[1100];
            snprintf(msg, sizeof msg, "line %ld: %s", lineno, err);
            out = json_pack("{s:s}", "error", msg);
            status = 1;
        }
        char *s = out ? json_dumps(out, JSON_COMPACT) : NULL;
        if (s) {
            puts(s);
            fflush(stdout);
        } else {
            printf("{\"error\": \"line %ld: out of memory\"}\n", lineno);
            status = 1;
        }
        free(s);
        json_decref(out);
    }
    free(line);
    return status;
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
    struct tk t = {.tok = tok, .tpl_dir = dir, .tpl_file = chat_file, .skip_special = skip};
    int rc = run_lines(&t);
    chat_template_free(t.chat);
    free(dir);
    tok_free(tok);
    return rc;
}
