/* The configuration: the key table, the YAML reader (libyaml events), environment and flag
 * overrides, cross-key checks and the YAML writer. See config.h. */
#include "worker/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "engine/util/errfmt.h"
#include "engine/util/fmt_double.h"
#include "engine/util/log.h"
#include "queue/keys.h"
#include "queue/redis_url.h"
#include "queue/sentinel.h"
#include "worker/jobs/template.h"

/* ---- per-key checks beyond type and bounds */

static int check_redis_url(const void *v, char *msg, size_t len)
{
    struct rq_addr a;
    return rq_url_parse(*(char *const *)v, &a, msg, len);
}

/* -1 with "longer than <max> characters" in msg when s is */
static int check_length(const char *s, size_t max, char *msg, size_t len)
{
    if (strlen(s) <= max)
        return 0;
    snprintf(msg, len, "longer than %zu characters", max);
    return -1;
}

/* Whether s has only letters, digits and characters of `extra`. */
static bool only_chars(const char *s, const char *extra)
{
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
            return false;
    return true;
}

static int check_prefix(const void *v, char *msg, size_t len)
{
    const char *s = *(char *const *)v;
    if (check_length(s, 64, msg, len))
        return -1;
    for (const char *p = s; *p; p++)
        if (isspace((unsigned char)*p) || iscntrl((unsigned char)*p)) {
            snprintf(msg, len, "\"%s\" contains a space or control character", s);
            return -1;
        }
    if (*s && s[strlen(s) - 1] == ':') {
        snprintf(msg, len, "\"%s\" must not end with ':' (llmq adds it: <prefix>:queue:short)", s);
        return -1;
    }
    return 0;
}

static int check_worker_id(const void *v, char *msg, size_t len)
{
    const char *s = *(char *const *)v;
    if (check_length(s, 128, msg, len))
        return -1;
    if (!only_chars(s, "._@-")) {
        snprintf(msg, len, "\"%s\": use letters, digits and . _ @ - only", s);
        return -1;
    }
    return 0;
}

static int check_queue_list(const void *v, char *msg, size_t len)
{
    const char *s = *(char *const *)v;
    int seen[2] = {0, 0};
    const char *p = s;
    for (;;) {
        size_t n = strcspn(p, ",");
        int q = (n == 5 && !strncmp(p, "short", 5)) ? 0 : (n == 4 && !strncmp(p, "long", 4)) ? 1 : -1;
        if (q < 0 || seen[q]++) {
            snprintf(msg, len, "\"%s\" is not a comma list of short and long (each at most once)", s);
            return -1;
        }
        if (!p[n])
            break;
        p += n + 1;
    }
    return 0;
}

/* model.aliases: a comma list of model names (queue/keys.h's rule), each once, at most 7 */
static int check_aliases(const void *v, char *msg, size_t len)
{
    const char *s = *(char *const *)v;
    char names[8][RQ_MODEL_MAX + 1];
    int n = 0;
    for (const char *p = s; *p;) {
        size_t k = strcspn(p, ","), b = 0, e = k;
        while (b < e && p[b] == ' ')
            b++;
        while (e > b && p[e - 1] == ' ')
            e--;
        char name[RQ_MODEL_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(e - b), p + b);
        if (e - b > RQ_MODEL_MAX || !rq_valid_model_name(name)) {
            snprintf(msg, len,
                     "\"%.*s\" is not a model name (1 to %d letters, digits, . _ - /, starting with a letter "
                     "or digit)",
                     (int)(e - b > 80 ? 80 : e - b), p + b, RQ_MODEL_MAX);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (!strcmp(names[i], name)) {
                snprintf(msg, len, "\"%s\" is given twice", name);
                return -1;
            }
        if (n == 7) {
            snprintf(msg, len, "at most 7 aliases");
            return -1;
        }
        memcpy(names[n++], name, strlen(name) + 1);
        p += k + (p[k] == ',');
    }
    return 0;
}

/* redis.sentinels: host:port entries (queue/sentinel.h) */
static int check_sentinels(const void *v, char *msg, size_t len)
{
    struct rq_sentinels s;
    return rq_sentinels_parse(*(char *const *)v, &s, msg, len);
}

/* templates.<name>: the template's syntax (braces balanced, placeholders are names) */
static int check_template(const void *v, char *msg, size_t len)
{
    return tmpl_check(*(char *const *)v, msg, len) ? -1 : 0;
}

/* ---- the table: the only place keys are defined */

static const char *const dtype_choices[] = {"auto", "bf16", "fp16", "fp32", "fp8", NULL};
static const char *const lm_dtype_choices[] = {"auto", "bf16", "fp8", NULL};
static const char *const backend_choices[] = {"auto", "cpu", "cuda", NULL};
static const char *const kv_choices[] = {"auto", "bf16", "fp8", NULL};
static const char *const copies_choices[] = {"auto", "on", "off", NULL};
static const char *const level_choices[] = {"debug", "info", "warn", "error", NULL};
_Static_assert(LOG_DEBUG == 0 && LOG_INFO == 1 && LOG_WARN == 2 && LOG_ERROR == 3,
               "worker.log_level's choices follow enum log_level");

/* clang-format off */
#define OFF(field) offsetof(struct cfg, field)
#define STR(sec, key, field, def, flags, check, help) \
    {sec, key, CFG_T_STRING, OFF(field), def, 0, 0, NULL, flags, check, help}
#define INT(sec, key, field, def, lo, hi, help) \
    {sec, key, CFG_T_INT, OFF(field), def, lo, hi, NULL, 0, NULL, help}
#define DBL(sec, key, field, def, lo, hi, flags, help) \
    {sec, key, CFG_T_DOUBLE, OFF(field), def, lo, hi, NULL, flags, NULL, help}
#define BOOL(sec, key, field, def, help) \
    {sec, key, CFG_T_BOOL, OFF(field), def, 0, 0, NULL, 0, NULL, help}
#define ENUM(sec, key, field, def, choices, help) \
    {sec, key, CFG_T_ENUM, OFF(field), def, 0, 0, choices, 0, NULL, help}
#define SIZE(sec, key, field, def, lo, hi, help) \
    {sec, key, CFG_T_SIZE, OFF(field), def, lo, hi, NULL, 0, NULL, help}
/* clang-format on */

#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define GiB (1024.0 * MiB)
#define TiB (1024.0 * GiB)
#define MAX_LEN 2097152 /* 2M tokens: the largest context any key accepts */

static const struct cfg_key keys[] = {
    STR("redis", "url", redis.url, "redis://127.0.0.1:6379/0", CFG_F_NONEMPTY, check_redis_url,
        "redis://[user:password@]host:port[/db] or unix:///path.sock[?db=N]"),
    STR("redis", "username", redis.username, "", 0, NULL, "ACL user name; \"\" = the URL's"),
    STR("redis", "password", redis.password, "", CFG_F_SECRET, NULL, "password; \"\" = the URL's"),
    INT("redis", "db", redis.db, "-1", -1, 65535, "database number; -1 = the URL's (0 if it has none)"),
    STR("redis", "prefix", redis.prefix, "llmq", CFG_F_NONEMPTY, check_prefix,
        "key prefix (llmq:queue:short ...); set \"{llmq}\" on Redis Cluster"),
    INT("redis", "connect_timeout_ms", redis.connect_timeout_ms, "2000", 100, 600000,
        "connect and command timeout"),
    INT("redis", "start_timeout_s", redis.start_timeout_s, "30", 0, 86400,
        "worker --drain (--connect-timeout): exit 69 when Redis cannot be reached this long at start; 0 = "
        "keep trying"),
    INT("redis", "block_timeout_ms", redis.block_timeout_ms, "1000", 10, 60000,
        "longest blocking fetch; shutdown waits at most this long on idle queues"),
    INT("redis", "reconnect_max_ms", redis.reconnect_max_ms, "5000", 100, 300000,
        "ceiling of the exponential backoff between reconnect attempts"),
    SIZE("redis", "result_max_bytes", redis.result_max_bytes, "1MiB", 0, 512 * MiB,
         "largest result line stored in a finished job's hash (result field); a longer one is "
         "replaced by a marker that it is in SQLite only; 0 = always the marker"),
    INT("redis", "stream_maxlen", redis.stream_maxlen, "10000", 10, 100000000,
        "approximate length cap of a streaming job's text stream (llmq:stream:<id>)"),
    INT("redis", "stream_interval_ms", redis.stream_interval_ms, "100", 0, 60000,
        "new text of streaming jobs goes to Redis at most this often (one round trip for all)"),
    STR("redis", "sentinels", redis.sentinels, "", CFG_F_LIST, check_sentinels,
        "Redis Sentinels to ask for the master (host:port list); \"\" = none: redis.url is the server"),
    STR("redis", "master_name", redis.master_name, "mymaster", CFG_F_NONEMPTY, NULL,
        "the name the sentinels monitor the master under (redis.sentinels)"),
    STR("redis", "sentinel_username", redis.sentinel_username, "", 0, NULL,
        "ACL user name for the sentinels; \"\" = none"),
    STR("redis", "sentinel_password", redis.sentinel_password, "", CFG_F_SECRET, NULL,
        "password of the sentinels; \"\" = none"),
    INT("redis", "wait_replicas", redis.wait_replicas, "0", 0, 64,
        "WAIT for this many replicas after enqueue, fetch and ack, so a failover cannot take them back "
        "(docs/FLEET.md); 0 = no WAIT"),
    INT("redis", "wait_timeout_ms", redis.wait_timeout_ms, "1000", 1, 600000,
        "WAIT's timeout: fewer confirmations by then fail the enqueue, hand the fetched jobs back and "
        "hold the ack"),

    INT("queues", "long_threshold_tokens", queues.long_threshold_tokens, "4096", 1, MAX_LEN,
        "a short-queue job whose prompt has more tokens moves to the long queue"),
    INT("queues", "short_max_num_seqs", queues.short_max_num_seqs, "512", 1, 4096,
        "short lane: sequences running at once"),
    INT("queues", "short_max_num_batched_tokens", queues.short_max_num_batched_tokens, "16384", 16, 1048576,
        "short lane: tokens per engine step"),
    INT("queues", "short_max_model_len", queues.short_max_model_len, "0", 0, MAX_LEN,
        "short lane: prompt + output tokens; 0 = model.max_model_len"),
    INT("queues", "long_max_num_seqs", queues.long_max_num_seqs, "16", 1, 4096,
        "long lane: sequences running at once"),
    INT("queues", "long_max_num_batched_tokens", queues.long_max_num_batched_tokens, "4096", 16, 1048576,
        "long lane: tokens per engine step (its prefill chunk)"),
    INT("queues", "long_max_model_len", queues.long_max_model_len, "0", 0, MAX_LEN,
        "long lane: prompt + output tokens; 0 = model.max_model_len"),
    SIZE("queues", "max_job_bytes", queues.max_job_bytes, "4MiB", KiB, GiB,
         "a job's JSON larger than this is dead-lettered without parsing"),
    SIZE("queues", "fetch_max_bytes", queues.fetch_max_bytes, "8MiB", KiB, GiB,
         "job JSON one fetch moves, and a worker holds, at most (one job always)"),
    INT("queues", "max_attempts", queues.max_attempts, "3", 1, 100,
        "deliveries (first + retries) before a job goes to the dead list; those that lost their worker count "
        "as stalls"),
    INT("queues", "max_stalls", queues.max_stalls, "10", 1, 100,
        "deliveries that ran a job and lost their worker (kill -9, a crash) before it goes to the dead list; "
        "from the second it runs isolated"),
    INT("queues", "retry_backoff_base_ms", queues.retry_backoff_base_ms, "1000", 0, 3600000,
        "first retry delay; doubles each attempt, with jitter"),
    INT("queues", "retry_backoff_max_ms", queues.retry_backoff_max_ms, "60000", 0, 86400000,
        "longest retry delay"),
    INT("queues", "result_ttl_s", queues.result_ttl_s, "86400", 0, 31536000,
        "a finished job's Redis hash expires after this; 0 = never (SQLite keeps results anyway)"),
    INT("queues", "events_maxlen", queues.events_maxlen, "100000", 100, 100000000,
        "approximate length cap of the events stream"),

    STR("model", "path", model.path, "", 0, NULL, "Hugging Face model folder; \"\" = none (give --model)"),
    STR("model", "name", model.name, "", 0, NULL,
        "model name recorded in results and served to jobs naming a model; \"\" = the folder's name"),
    STR("model", "aliases", model.aliases, "", 0, check_aliases,
        "more model names this worker serves (comma list, up to 7): jobs naming one run here"),
    ENUM("model", "dtype", model.dtype, "auto", dtype_choices,
         "weight dtype on the backend; auto = the checkpoint's (fp32 on cpu); fp8 quantizes at load; fp16 "
         "= cuda's fp16 mode (weights, activations and KV cache in fp16: nearer fp32 than bf16; a weight "
         "beyond 65504 fails the load)"),
    ENUM("model", "lm_head_dtype", model.lm_head_dtype, "auto", lm_dtype_choices,
         "output projection dtype; auto = the checkpoint's (bf16 in the Qwen3 FP8 checkpoints); fp8 "
         "quantizes it at load (128x128 blocks): ~3 % faster one-sequence decode, slightly different "
         "logprobs"),
    INT("model", "max_model_len", model.max_model_len, "0", 0, MAX_LEN,
        "longest prompt + output; 0 = the model's; more than native enables YaRN"),
    STR("model", "tokenizer", model.tokenizer, "", 0, NULL, "folder with tokenizer.json; \"\" = model.path"),
    STR("model", "chat_template", model.chat_template, "", 0, NULL,
        "a Jinja chat template file used instead of the model's own (--chat-template); \"\" = the "
        "tokenizer folder's chat_template.jinja or tokenizer_config.json's chat_template"),

    ENUM("engine", "backend", engine.backend, "auto", backend_choices,
         "auto = cuda when a GPU is usable, else cpu"),
    INT("engine", "device", engine.device, "0", 0, 255,
        "CUDA device the backend runs on (--device); one worker per GPU"),
    DBL("engine", "gpu_memory_utilization", engine.gpu_memory_utilization, "0.92", 0, 1, CFG_F_MIN_OPEN,
        "share of GPU memory for weights, activations and the KV cache"),
    {"engine", "block_size", CFG_T_INT, OFF(engine.block_size), "32", 8, 256, NULL, CFG_F_POW2, NULL,
     "tokens per KV cache block; a power of two"},
    INT("engine", "max_num_seqs", engine.max_num_seqs, "512", 1, 4096,
        "sequences per engine step, both lanes"),
    INT("engine", "max_num_batched_tokens", engine.max_num_batched_tokens, "16384", 16, 1048576,
        "tokens per engine step (prefill chunks + decodes), both lanes"),
    ENUM("engine", "kv_cache_dtype", engine.kv_cache_dtype, "auto", kv_choices,
         "KV cache element type; auto = bf16 on cuda (fp32 on cpu), whatever the weights; fp8 = e4m3 + a "
         "scale per token and KV head (its prefill reads bf16 copies of a step's blocks from a staging pool "
         "of about one max_model_len sequence, taken from the cache's memory)"),
    INT("engine", "num_kv_blocks", engine.num_kv_blocks, "0", 0, 16777216,
        "0 = as many as memory allows; else exactly this many (over gpu_memory_utilization and "
        "cpu_kv_cache_bytes)"),
    ENUM("engine", "decode_weight_copies", engine.decode_weight_copies, "auto", copies_choices,
         "cuda: a second copy of the linear weights and the output projection in the order the decode "
         "GEMVs read them (one-sequence decode of Qwen3-14B on an H200 6 % faster in fp8, 8 % in bf16; "
         "15 / 28 GB taken from the KV cache); auto = on where the KV cache still holds max_num_seqs "
         "sequences of max_model_len beside them"),
    STR("engine", "gemm_tuning_file", engine.gemm_tuning_file, "", 0, NULL,
        "cuda: file keeping the GEMM algorithms chosen by timing, read at start and written at exit: the "
        "next start on the same GPU model, libraries and llmq version takes the same ones (the same "
        "results for the same batches, no timing); \"\" = time at every start"),
    SIZE("engine", "cpu_kv_cache_bytes", engine.cpu_kv_cache_bytes, "1GiB", 16 * MiB, TiB,
         "KV cache size of the cpu backend (cuda sizes its cache from gpu_memory_utilization)"),
    BOOL("engine", "enable_prefix_caching", engine.enable_prefix_caching, "true",
         "share KV blocks of identical prompt prefixes"),
    DBL("engine", "admission_reserve", engine.admission_reserve, "1.0", 0, 1, 0,
        "a job starts only when the KV cache also holds this share of its and the running jobs' "
        "max_tokens; learned from finished jobs after the first; 0 = admit, preempt later"),
    INT("engine", "priority_aging_s", engine.priority_aging_s, "60", 0, 86400,
        "a waiting job's priority rises by 1 for every this many seconds it waits, so low priorities "
        "never starve; 0 = no aging (priority, then arrival)"),
    BOOL("engine", "cuda_graphs", engine.cuda_graphs, "true", "run decode steps as CUDA graphs"),
    INT("engine", "cuda_graph_max_batch", engine.cuda_graph_max_batch, "512", 1, 4096,
        "largest decode batch captured as a graph; larger ones run eagerly"),
    INT("engine", "threads", engine.threads, "0", 0, 1024, "cpu backend threads; 0 = all cores"),
    INT("engine", "seed", engine.seed, "0", 0, INT_MAX,
        "base seed for jobs without one and for random weights"),

    STR("sqlite", "path", sqlite.path, "llmq.db", 0, NULL,
        "results database; created with its schema if missing; \"\" = none (a worker then needs "
        "results_stream.enabled: its rows are only in Redis until a collector has them)"),
    INT("sqlite", "busy_timeout_ms", sqlite.busy_timeout_ms, "5000", 0, 600000,
        "wait this long for a lock before retrying with backoff"),
    INT("sqlite", "commit_interval_ms", sqlite.commit_interval_ms, "50", 0, 60000,
        "a finished result waits at most this long for its transaction"),
    INT("sqlite", "commit_max_rows", sqlite.commit_max_rows, "256", 1, 100000,
        "... or until this many results are pending"),
    INT("sqlite", "unwritable_timeout_s", sqlite.unwritable_timeout_s, "60", 0, 86400,
        "--drain: exit 1 when the database cannot be written (read-only, no permission, I/O errors) this "
        "long"),

    STR("worker", "id", worker.id, "", 0, check_worker_id,
        "worker name in Redis keys; \"\" = <hostname>-<pid>"),
    STR("worker", "queues", worker.queues, "short,long", CFG_F_NONEMPTY, check_queue_list,
        "queues this worker fetches from"),
    INT("worker", "heartbeat_interval_s", worker.heartbeat_interval_s, "5", 1, 30,
        "heartbeat refresh interval"),
    INT("worker", "heartbeat_ttl_s", worker.heartbeat_ttl_s, "30", 2, 60,
        "heartbeat lifetime: a crashed worker's jobs are requeued this long (plus `heartbeat_interval_s`, "
        "the reaper's grace) after its last beat; a worker that cannot heartbeat writes no rows past it"),
    INT("worker", "reaper_interval_s", worker.reaper_interval_s, "10", 1, 300,
        "how often to look for workers whose heartbeat lapsed"),
    INT("worker", "shutdown_timeout_s", worker.shutdown_timeout_s, "30", 0, 3600,
        "on SIGTERM, time to finish running jobs before pushing them back"),
    INT("worker", "progress_every_tokens", worker.progress_every_tokens, "16", 1, 100000,
        "report a job's progress to Redis every this many tokens"),
    ENUM("worker", "log_level", worker.log_level, "info", level_choices, "lowest level logged on stderr"),

    INT("sampling", "max_tokens", sampling.max_tokens, "256", 1, MAX_LEN,
        "output tokens when a job gives none"),
    DBL("sampling", "temperature", sampling.temperature, "1.0", 0, 100, 0, "0 = greedy"),
    DBL("sampling", "top_p", sampling.top_p, "1.0", 0, 1, CFG_F_MIN_OPEN, "nucleus sampling; 1 = off"),
    INT("sampling", "top_k", sampling.top_k, "0", 0, 1048576, "0 = off"),
    DBL("sampling", "min_p", sampling.min_p, "0.0", 0, 1, 0, "0 = off"),
    DBL("sampling", "repetition_penalty", sampling.repetition_penalty, "1.0", 0, 10, CFG_F_MIN_OPEN,
        "1 = off; over prompt and output tokens"),
    DBL("sampling", "presence_penalty", sampling.presence_penalty, "0.0", -2, 2, 0, "0 = off"),
    DBL("sampling", "frequency_penalty", sampling.frequency_penalty, "0.0", -2, 2, 0, "0 = off"),
    BOOL("sampling", "use_generation_config", sampling.use_generation_config, "true",
         "take the model's generation_config.json values before these"),
    BOOL("sampling", "enable_thinking", sampling.enable_thinking, "true",
         "chat template's enable_thinking for messages jobs that don't say"),

    BOOL("metrics", "enabled", metrics.enabled, "true", "serve GET /metrics (Prometheus) and GET /health"),
    STR("metrics", "listen_address", metrics.listen_address, "127.0.0.1", CFG_F_NONEMPTY, NULL,
        "address the metrics server binds"),
    INT("metrics", "port", metrics.port, "9464", 0, 65535, "metrics port; 0 = any free port (logged)"),
    INT("metrics", "interval_s", metrics.interval_s, "10", 1, 3600,
        "one worker_metrics row in SQLite per interval"),

    BOOL("results_stream", "enabled", results_stream.enabled, "false",
         "publish each finished job's row to `<prefix>:results` and the workers and metrics rows to "
         "`<prefix>:metrics`, for `llmq collect --redis` (a fleet's one database)"),
    INT("results_stream", "max_len", results_stream.max_len, "1000000", 0, 1000000000,
        "entries each of those streams keeps at most; past it the oldest are dropped (counted in "
        "<prefix>:stream-dropped, shown by `llmq status`); 0 = no cap"),

    {"templates", "<name>", CFG_T_MAP, OFF(templates), "", 0, 0, NULL, 0, check_template,
     "prompt template a job names with \"template\"; {var} is filled from its \"vars\". summarize_map and "
     "summarize_reduce replace the built-in templates of summary jobs (\"document\" with \"summarize\")"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])
_Static_assert(N_KEYS <= CFG_MAX_KEYS, "raise CFG_MAX_KEYS");

const struct cfg_key *cfg_keys(size_t *n)
{
    *n = N_KEYS;
    return keys;
}

static bool is_map(const struct cfg_key *k)
{
    return k->type == CFG_T_MAP;
}

static const struct cfg_key *find_key(const char *sec, size_t seclen, const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strlen(keys[i].section) == seclen && !strncmp(keys[i].section, sec, seclen) &&
            (is_map(&keys[i]) || !strcmp(keys[i].name, name)))
            return &keys[i];
    return NULL;
}

const struct cfg_key *cfg_key_find(const char *dotted)
{
    const char *dot = strchr(dotted, '.');
    if (!dot || !dot[1])
        return NULL;
    return find_key(dotted, (size_t)(dot - dotted), dot + 1);
}

static bool section_known(const char *sec)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].section, sec))
            return true;
    return false;
}

size_t cfg_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return SIZE_MAX;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The key (not the templates entry) named `name` in any section, or NULL. */
static const struct cfg_key *key_named(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!is_map(&keys[i]) && !strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

/* The key whose section (full: whose "section.name"; the templates entry left out) is the
 * nearest to s in edit distance, which goes into *dist. */
static const struct cfg_key *nearest_key(const char *s, bool full, size_t *dist)
{
    const struct cfg_key *best = NULL;
    *dist = SIZE_MAX;
    for (size_t i = 0; i < N_KEYS; i++) {
        char text[128];
        if (full && is_map(&keys[i]))
            continue;
        if (full)
            snprintf(text, sizeof text, "%s.%s", keys[i].section, keys[i].name);
        else
            snprintf(text, sizeof text, "%s", keys[i].section);
        size_t d = cfg_edit_distance(s, text);
        if (d < *dist) {
            *dist = d;
            best = &keys[i];
        }
    }
    return best;
}

const struct cfg_key *cfg_key_suggest(const char *dotted)
{
    const char *dot = strchr(dotted, '.');
    const char *name = dot ? dot + 1 : dotted;
    /* the right name in the wrong section, or written outside its section */
    const struct cfg_key *k = key_named(name);
    if (k)
        return k;
    size_t d;
    k = nearest_key(dotted, dot != NULL, &d);
    if (!dot) /* a mistyped section name */
        return d <= 2 && d < strlen(dotted) ? k : NULL;
    return d <= 3 && d < strlen(name) ? k : NULL;
}

void cfg_key_env_name(const struct cfg_key *k, char *buf, size_t len)
{
    if (is_map(k)) {
        snprintf(buf, len, "%s", "");
        return;
    }
    snprintf(buf, len, "LLMQ_%s_%s", k->section, k->name);
    for (char *p = buf; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

const char *cfg_type_name(enum cfg_type t)
{
    switch (t) {
    case CFG_T_STRING:
        return "string";
    case CFG_T_INT:
        return "integer";
    case CFG_T_DOUBLE:
        return "number";
    case CFG_T_BOOL:
        return "bool";
    case CFG_T_ENUM:
        return "enum";
    case CFG_T_SIZE:
        return "size";
    case CFG_T_MAP:
        return "string map";
    }
    return "?";
}

static void format_size(int64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int u = 0; u < 4; u++) {
        int64_t m = (int64_t)1 << (10 * (4 - u));
        if (v != 0 && v % m == 0) {
            snprintf(buf, len, "%lld%s", (long long)(v / m), units[u]);
            return;
        }
    }
    snprintf(buf, len, "%lld", (long long)v);
}

static void format_bound(const struct cfg_key *k, double v, char *buf, size_t len)
{
    if (k->type == CFG_T_SIZE)
        format_size((int64_t)v, buf, len);
    else if (k->type == CFG_T_DOUBLE)
        fmt_double(v, buf, len);
    else
        snprintf(buf, len, "%.0f", v);
}

void cfg_key_bounds(const struct cfg_key *k, char *buf, size_t len)
{
    char lo[32], hi[32];
    buf[0] = 0;
    switch (k->type) {
    case CFG_T_INT:
    case CFG_T_DOUBLE:
    case CFG_T_SIZE:
        format_bound(k, k->min, lo, sizeof lo);
        format_bound(k, k->max, hi, sizeof hi);
        snprintf(buf, len, "%s%s, %s]%s", k->flags & CFG_F_MIN_OPEN ? "(" : "[", lo, hi,
                 k->flags & CFG_F_POW2 ? ", a power of two" : "");
        break;
    case CFG_T_ENUM: {
        size_t n = 0;
        for (const char *const *c = k->choices; *c && n + 1 < len; c++)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", c == k->choices ? "" : "|", *c);
        break;
    }
    case CFG_T_BOOL:
        snprintf(buf, len, "true|false");
        break;
    case CFG_T_STRING:
        if (k->flags & CFG_F_NONEMPTY)
            snprintf(buf, len, "not empty");
        break;
    case CFG_T_MAP:
        break;
    }
}

/* ---- parsing one value */

union cfg_val {
    char *s;
    int i;
    double d;
    bool b;
    int64_t z;
};

static const char *expected(const struct cfg_key *k, char *buf, size_t len)
{
    switch (k->type) {
    case CFG_T_INT:
        return "expected an integer";
    case CFG_T_DOUBLE:
        return "expected a number";
    case CFG_T_BOOL:
        return "expected true or false";
    case CFG_T_SIZE:
        return "expected a size in bytes (4096, 64KiB, 4MiB, 1GiB)";
    case CFG_T_ENUM: {
        char b[128];
        cfg_key_bounds(k, b, sizeof b);
        snprintf(buf, len, "expected one of %s", b);
        return buf;
    }
    default:
        return "expected a string";
    }
}

static bool parse_size(const char *s, int64_t *out)
{
    static const struct {
        const char *suffix;
        int shift;
    } units[] = {{"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
                 {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40}};
    if (!isdigit((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        v = ULLONG_MAX;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].suffix)) {
            if (v > (unsigned long long)INT64_MAX >> units[i].shift)
                *out = INT64_MAX;
            else
                *out = (int64_t)(v << units[i].shift);
            return true;
        }
    return false;
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return true;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return true;
        }
    }
    return false;
}

static int range_error(const struct cfg_key *k, const char *text, char *msg, size_t len)
{
    char b[96];
    if (k->flags & CFG_F_POW2) {
        char lo[32], hi[32];
        format_bound(k, k->min, lo, sizeof lo);
        format_bound(k, k->max, hi, sizeof hi);
        snprintf(msg, len, "%s is not a power of two between %s and %s", text, lo, hi);
    } else {
        cfg_key_bounds(k, b, sizeof b);
        snprintf(msg, len, "%s is out of range %s", text, b);
    }
    return -1;
}

static bool in_range(const struct cfg_key *k, double v)
{
    if (k->flags & CFG_F_MIN_OPEN ? !(v > k->min) : !(v >= k->min))
        return false;
    return v <= k->max;
}

/* Parses text (is_null: YAML's null, ~ or nothing) into *out for key k. Strings are malloc'd into
 * out->s for the caller. On error writes the reason (without key or origin) into msg. */
static int parse_value(const struct cfg_key *k, const char *text, bool is_null, union cfg_val *out, char *msg,
                       size_t len)
{
    char q[96], e[160];
    if (k->type == CFG_T_STRING || k->type == CFG_T_MAP) {
        if (is_null)
            text = "";
        if ((k->flags & CFG_F_NONEMPTY || k->type == CFG_T_MAP) && !*text) {
            snprintf(msg, len, "must not be empty");
            return -1;
        }
        if (k->check && k->check(&text, msg, len))
            return -1;
        if (!(out->s = strdup(text))) {
            snprintf(msg, len, "out of memory");
            return -1;
        }
        return 0;
    }
    if (is_null) {
        snprintf(msg, len, "%s, got an empty value", expected(k, e, sizeof e));
        return -1;
    }
    /* surrounding blanks (from the environment or a flag) are not part of a number */
    char buf[128];
    while (isspace((unsigned char)*text))
        text++;
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1]))
        n--;
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    memcpy(buf, text, n);
    buf[n] = 0;
    bool ok = false;
    switch (k->type) {
    case CFG_T_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        ok = n && *end == 0 && (isdigit((unsigned char)buf[0]) || buf[0] == '-' || buf[0] == '+');
        if (ok && (errno == ERANGE || !in_range(k, (double)v)))
            return range_error(k, buf, msg, len);
        if (ok && k->flags & CFG_F_POW2 && (v & (v - 1)))
            return range_error(k, buf, msg, len);
        out->i = (int)v;
        break;
    }
    case CFG_T_DOUBLE: {
        char *end;
        double v = strtod(buf, &end);
        ok = n && *end == 0 && isfinite(v) && !isalpha((unsigned char)buf[n - 1]);
        if (ok && !in_range(k, v))
            return range_error(k, buf, msg, len);
        out->d = v;
        break;
    }
    case CFG_T_BOOL:
        ok = parse_bool(buf, &out->b);
        break;
    case CFG_T_SIZE:
        ok = parse_size(buf, &out->z);
        if (ok && !in_range(k, (double)out->z))
            return range_error(k, buf, msg, len);
        break;
    case CFG_T_ENUM:
        for (int i = 0; k->choices[i]; i++)
            if (!strcasecmp(buf, k->choices[i])) {
                out->i = i;
                ok = true;
            }
        break;
    default:
        break;
    }
    if (!ok) {
        snprintf(msg, len, "%s, got %s", expected(k, e, sizeof e), errfmt_quote(text, q, sizeof q));
        return -1;
    }
    if (k->check && k->check(out, msg, len))
        return -1;
    return 0;
}

static void *field(struct cfg *c, const struct cfg_key *k)
{
    return (char *)c + k->offset;
}
static const void *cfield(const struct cfg *c, const struct cfg_key *k)
{
    return (const char *)c + k->offset;
}

static void store(struct cfg *c, const struct cfg_key *k, union cfg_val v)
{
    void *p = field(c, k);
    switch (k->type) {
    case CFG_T_STRING:
        free(*(char **)p);
        *(char **)p = v.s;
        break;
    case CFG_T_INT:
    case CFG_T_ENUM:
        *(int *)p = v.i;
        break;
    case CFG_T_DOUBLE:
        *(double *)p = v.d;
        break;
    case CFG_T_BOOL:
        *(bool *)p = v.b;
        break;
    case CFG_T_SIZE:
        *(int64_t *)p = v.z;
        break;
    case CFG_T_MAP:
        break;
    }
}

static void set_origin(struct cfg_origin *o, int source, int line, const char *name)
{
    o->source = (unsigned char)source;
    o->line = line;
    size_t n = name ? strnlen(name, sizeof o->name - 1) : 0; /* long flag names are cut */
    memcpy(o->name, name ? name : "", n);
    o->name[n] = 0;
}

static bool template_name_ok(const char *s)
{
    return *s && strlen(s) <= 64 && only_chars(s, "_-.");
}

/* Adds or replaces a template; takes ownership of text. */
static int template_put(struct cfg *c, const char *name, char *text, struct cfg_origin o)
{
    for (size_t i = 0; i < c->n_templates; i++)
        if (!strcmp(c->templates[i].name, name)) {
            free(c->templates[i].text);
            c->templates[i].text = text;
            c->templates[i].origin = o;
            return 0;
        }
    struct cfg_template *t = realloc(c->templates, (c->n_templates + 1) * sizeof *t);
    char *nm = strdup(name);
    if (t)
        c->templates = t;
    if (!t || !nm) {
        free(nm);
        free(text);
        return -1;
    }
    t[c->n_templates++] = (struct cfg_template){nm, text, o};
    return 0;
}

/* ---- loading */

void cfg_defaults(struct cfg *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++) {
        if (is_map(&keys[i]))
            continue;
        union cfg_val v;
        char msg[256];
        /* defaults parse (test_config checks each); only out of memory leaves a string NULL */
        if (parse_value(&keys[i], keys[i].def, false, &v, msg, sizeof msg) == 0)
            store(c, &keys[i], v);
    }
}

void cfg_free(struct cfg *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].type == CFG_T_STRING)
            free(*(char **)field(c, &keys[i]));
    for (size_t i = 0; i < c->n_templates; i++) {
        free(c->templates[i].name);
        free(c->templates[i].text);
    }
    free(c->templates);
    free(c->path);
    memset(c, 0, sizeof *c);
}

const char *cfg_default_path(void)
{
    const char *p = getenv("LLMQ_CONFIG");
    return p && *p ? p : NULL;
}

/* "(did you mean 'x'?)" or "" */
static const char *suggestion(const char *dotted, char *buf, size_t len)
{
    const struct cfg_key *k = cfg_key_suggest(dotted);
    buf[0] = 0;
    if (k && !strchr(dotted, '.') && strcmp(k->name, dotted))
        snprintf(buf, len, " (did you mean '%s'?)", k->section);
    else if (k && !strchr(dotted, '.'))
        snprintf(buf, len, " (did you mean '%s.%s'? keys go inside their section)", k->section, k->name);
    else if (k)
        snprintf(buf, len, " (did you mean '%s.%s'?)", k->section, k->name);
    return buf;
}

int cfg_set(struct cfg *c, const char *dotted, const char *value, const char *origin, char *err,
            size_t errlen)
{
    char msg[384], sug[160];
    const struct cfg_key *k = cfg_key_find(dotted);
    if (!origin)
        origin = "flag";
    if (!k && !strchr(dotted, '.')) {
        snprintf(err, errlen, "%s: unknown key '%s' (write section.key, e.g. engine.block_size)", origin,
                 dotted);
        return -1;
    }
    if (!k) {
        snprintf(err, errlen, "%s: unknown key '%s'%s", origin, dotted, suggestion(dotted, sug, sizeof sug));
        return -1;
    }
    union cfg_val v;
    if (parse_value(k, value, false, &v, msg, sizeof msg)) {
        snprintf(err, errlen, "%s: %s", origin, msg);
        return -1;
    }
    struct cfg_origin o;
    set_origin(&o, CFG_SRC_FLAG, 0, origin);
    if (is_map(k)) {
        const char *name = strchr(dotted, '.') + 1;
        if (!template_name_ok(name)) {
            free(v.s);
            snprintf(err, errlen, "%s: template name '%s': use letters, digits and _ - . only", origin, name);
            return -1;
        }
        if (template_put(c, name, v.s, o)) {
            snprintf(err, errlen, "%s: out of memory", origin);
            return -1;
        }
        return 0;
    }
    store(c, k, v);
    c->origin[k - keys] = o;
    return 0;
}

int cfg_load_env(struct cfg *c, char *err, size_t errlen)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (is_map(&keys[i]))
            continue;
        char name[96], msg[384];
        cfg_key_env_name(&keys[i], name, sizeof name);
        const char *s = getenv(name);
        if (!s)
            continue;
        union cfg_val v;
        if (parse_value(&keys[i], s, false, &v, msg, sizeof msg)) {
            snprintf(err, errlen, "%s: %s", name, msg);
            return -1;
        }
        store(c, &keys[i], v);
        set_origin(&c->origin[i], CFG_SRC_ENV, 0, name);
    }
    return 0;
}

/* -- the YAML file, through libyaml's event parser */

struct yreader {
    struct cfg *c;
    const char *path;
    const char *text; /* the whole file, for line numbers of reader errors */
    size_t size;
    yaml_parser_t parser;
    char *err;
    size_t errlen;
    int key_line[N_KEYS]; /* where each key was set in this file, 0 = not yet */
    char **tnames;        /* templates set in this file, for duplicates */
    int *tlines;
    size_t ntnames;
};

static int yfail(struct yreader *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int yfail(struct yreader *r, int line, const char *fmt, ...)
{
    int n = snprintf(r->err, r->errlen, "%s:%d: ", r->path, line);
    if (n < 0 || (size_t)n >= r->errlen)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static int line_of(const yaml_event_t *ev)
{
    return (int)ev->start_mark.line + 1;
}

static int syntax_error(struct yreader *r)
{
    yaml_parser_t *p = &r->parser;
    const char *problem = p->problem ? p->problem : "unknown problem";
    if (p->error == YAML_MEMORY_ERROR) {
        snprintf(r->err, r->errlen, "%s: out of memory", r->path);
    } else if (p->error == YAML_READER_ERROR) {
        int line = 1;
        for (size_t i = 0; i < p->problem_offset && i < r->size; i++)
            line += r->text[i] == '\n';
        snprintf(r->err, r->errlen, "%s:%d: invalid YAML: %s (byte %zu)", r->path, line, problem,
                 p->problem_offset);
    } else if (p->problem_mark.index < r->size && r->text[p->problem_mark.index] == '\t') {
        snprintf(r->err, r->errlen, "%s:%zu:%zu: invalid YAML: %s (a tab: YAML indents with spaces)", r->path,
                 p->problem_mark.line + 1, p->problem_mark.column + 1, problem);
    } else if (p->context) {
        snprintf(r->err, r->errlen, "%s:%zu:%zu: invalid YAML: %s (%s at line %zu)", r->path,
                 p->problem_mark.line + 1, p->problem_mark.column + 1, problem, p->context,
                 p->context_mark.line + 1);
    } else {
        snprintf(r->err, r->errlen, "%s:%zu:%zu: invalid YAML: %s", r->path, p->problem_mark.line + 1,
                 p->problem_mark.column + 1, problem);
    }
    return -1;
}

/* The next event; aliases are refused here so no caller sees one. */
static int next(struct yreader *r, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&r->parser, ev))
        return syntax_error(r);
    if (ev->type == YAML_ALIAS_EVENT) {
        yfail(r, line_of(ev), "YAML aliases (*%s) are not supported", (const char *)ev->data.alias.anchor);
        yaml_event_delete(ev);
        return -1;
    }
    return 0;
}

static const char *scalar(const yaml_event_t *ev)
{
    return (const char *)ev->data.scalar.value;
}

static bool is_null(const yaml_event_t *ev)
{
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = scalar(ev);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* "a mapping", "a sequence", or a scalar's text in quotes, for messages */
static const char *kind(const yaml_event_t *ev, char *buf, size_t len)
{
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT:
        return "a mapping";
    case YAML_SEQUENCE_START_EVENT:
        return "a sequence";
    case YAML_SCALAR_EVENT:
        return errfmt_quote(scalar(ev), buf, len);
    default:
        return "nothing";
    }
}

static int read_template(struct yreader *r, const struct cfg_key *k, const yaml_event_t *key,
                         const yaml_event_t *val)
{
    const char *name = scalar(key);
    int line = line_of(key);
    char msg[384], q[96];
    if (!template_name_ok(name))
        return yfail(r, line, "templates.%s: use letters, digits and _ - . in template names", name);
    for (size_t i = 0; i < r->ntnames; i++)
        if (!strcmp(r->tnames[i], name))
            return yfail(r, line, "templates.%s: duplicate key (first on line %d)", name, r->tlines[i]);
    if (val->type != YAML_SCALAR_EVENT)
        return yfail(r, line, "templates.%s: expected a string, got %s", name, kind(val, q, sizeof q));
    union cfg_val v;
    if (parse_value(k, scalar(val), is_null(val), &v, msg, sizeof msg))
        return yfail(r, line, "templates.%s: %s", name, msg);
    char **tn = realloc(r->tnames, (r->ntnames + 1) * sizeof *tn);
    if (tn)
        r->tnames = tn;
    int *tl = realloc(r->tlines, (r->ntnames + 1) * sizeof *tl);
    if (tl)
        r->tlines = tl;
    char *dup = strdup(name);
    if (!tn || !tl || !dup) {
        free(dup);
        free(v.s);
        return yfail(r, line, "out of memory");
    }
    r->tnames[r->ntnames] = dup;
    r->tlines[r->ntnames++] = line;
    struct cfg_origin o;
    set_origin(&o, CFG_SRC_FILE, line, NULL);
    if (template_put(r->c, name, v.s, o))
        return yfail(r, line, "out of memory");
    return 0;
}

/* After a SEQUENCE_START: its scalars up to SEQUENCE_END joined with ", " into *out (malloc). 0, or
 * -1 (yfail). */
static int read_list(struct yreader *r, const char *dotted, char **out)
{
    size_t n = 0;
    char *s = calloc(1, 1), q[96];
    for (;;) {
        yaml_event_t ev;
        if (!s || next(r, &ev)) {
            free(s);
            return s ? -1 : yfail(r, 0, "out of memory");
        }
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            *out = s;
            return 0;
        }
        if (ev.type != YAML_SCALAR_EVENT || memchr(scalar(&ev), 0, ev.data.scalar.length) ||
            strchr(scalar(&ev), ',')) {
            int rc = yfail(r, line_of(&ev), "%s: expected a list of strings, got %s in it", dotted,
                           kind(&ev, q, sizeof q));
            yaml_event_delete(&ev);
            free(s);
            return rc;
        }
        size_t k = ev.data.scalar.length;
        char *t = realloc(s, n + k + 3);
        if (t) {
            s = t;
            n += (size_t)sprintf(s + n, "%s%s", n ? ", " : "", scalar(&ev));
        }
        yaml_event_delete(&ev);
        if (!t) {
            free(s);
            return yfail(r, 0, "out of memory");
        }
    }
}

static int read_key(struct yreader *r, const char *sec, const yaml_event_t *key, const yaml_event_t *val)
{
    const char *name = scalar(key);
    int line = line_of(key);
    char dotted[256], msg[384], e[160], q[96];
    snprintf(dotted, sizeof dotted, "%s.%s", sec, name);
    const struct cfg_key *k = find_key(sec, strlen(sec), name);
    if (!k)
        return yfail(r, line, "unknown key '%s'%s", dotted, suggestion(dotted, e, sizeof e));
    if (is_map(k))
        return read_template(r, k, key, val);
    size_t i = (size_t)(k - keys);
    if (r->key_line[i])
        return yfail(r, line, "%s: duplicate key (first on line %d)", dotted, r->key_line[i]);
    char *joined = NULL;
    if (val->type == YAML_SEQUENCE_START_EVENT && (k->flags & CFG_F_LIST)) {
        if (read_list(r, dotted, &joined))
            return -1;
    } else if (val->type != YAML_SCALAR_EVENT) {
        return yfail(r, line, "%s: %s, got %s", dotted, expected(k, e, sizeof e), kind(val, q, sizeof q));
    } else if (memchr(scalar(val), 0, val->data.scalar.length)) {
        return yfail(r, line, "%s: contains a NUL byte", dotted);
    }
    union cfg_val v;
    int prc = parse_value(k, joined ? joined : scalar(val), !joined && is_null(val), &v, msg, sizeof msg);
    free(joined);
    if (prc)
        return yfail(r, line, "%s: %s", dotted, msg);
    store(r->c, k, v);
    r->key_line[i] = line;
    set_origin(&r->c->origin[i], CFG_SRC_FILE, line, NULL);
    return 0;
}

/* After the section's MAPPING_START: key/value pairs up to MAPPING_END. */
static int read_section(struct yreader *r, const char *sec)
{
    char q[96];
    for (;;) {
        yaml_event_t key, val;
        if (next(r, &key))
            return -1;
        if (key.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&key);
            return 0;
        }
        if (key.type != YAML_SCALAR_EVENT) {
            int rc = yfail(r, line_of(&key), "%s: expected a key name, got %s", sec, kind(&key, q, sizeof q));
            yaml_event_delete(&key);
            return rc;
        }
        if (next(r, &val)) {
            yaml_event_delete(&key);
            return -1;
        }
        int rc = read_key(r, sec, &key, &val);
        yaml_event_delete(&key);
        yaml_event_delete(&val);
        if (rc)
            return rc;
    }
}

/* After the top MAPPING_START: sections up to MAPPING_END. */
static int read_top(struct yreader *r)
{
    char seen[16][32];
    int seen_line[16], nseen = 0;
    for (;;) {
        yaml_event_t sec, val;
        char sug[160], q[96];
        if (next(r, &sec))
            return -1;
        if (sec.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&sec);
            return 0;
        }
        int line = line_of(&sec), rc = 0;
        if (sec.type != YAML_SCALAR_EVENT) {
            rc = yfail(r, line, "expected a section name, got %s", kind(&sec, q, sizeof q));
            yaml_event_delete(&sec);
            return rc;
        }
        const char *name = scalar(&sec);
        if (!section_known(name)) {
            rc = yfail(r, line, "unknown section '%s'%s", name, suggestion(name, sug, sizeof sug));
        } else {
            for (int i = 0; i < nseen && !rc; i++)
                if (!strcmp(seen[i], name))
                    rc = yfail(r, line, "duplicate section '%s' (first on line %d)", name, seen_line[i]);
            if (!rc && nseen < 16) {
                snprintf(seen[nseen], sizeof seen[nseen], "%s", name);
                seen_line[nseen++] = line;
            }
        }
        if (!rc && next(r, &val) == 0) {
            if (val.type == YAML_MAPPING_START_EVENT)
                rc = read_section(r, name);
            else if (!is_null(&val))
                rc = yfail(r, line, "%s: expected a mapping of keys under the section, got %s", name,
                           kind(&val, q, sizeof q));
            yaml_event_delete(&val);
        } else if (!rc) {
            rc = -1;
        }
        yaml_event_delete(&sec);
        if (rc)
            return rc;
    }
}

static int read_stream(struct yreader *r)
{
    yaml_event_t ev;
    if (next(r, &ev)) /* STREAM_START */
        return -1;
    yaml_event_delete(&ev);
    if (next(r, &ev))
        return -1;
    if (ev.type == YAML_STREAM_END_EVENT) { /* empty, or only comments */
        yaml_event_delete(&ev);
        return 0;
    }
    yaml_event_delete(&ev); /* DOCUMENT_START */
    if (next(r, &ev))
        return -1;
    int rc = 0;
    char q[96];
    if (ev.type == YAML_MAPPING_START_EVENT)
        rc = read_top(r);
    else if (!is_null(&ev))
        rc = yfail(r, line_of(&ev), "expected a mapping of sections (redis:, engine:, ...), got %s",
                   kind(&ev, q, sizeof q));
    yaml_event_delete(&ev);
    if (rc)
        return rc;
    if (next(r, &ev)) /* DOCUMENT_END */
        return -1;
    yaml_event_delete(&ev);
    if (next(r, &ev))
        return -1;
    if (ev.type == YAML_DOCUMENT_START_EVENT)
        rc = yfail(r, line_of(&ev), "more than one YAML document; llmq reads one");
    yaml_event_delete(&ev);
    return rc;
}

#define CFG_FILE_MAX (16 << 20)

int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen)
{
    if (!path)
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *text = malloc(CFG_FILE_MAX + 1);
    size_t size = text ? fread(text, 1, CFG_FILE_MAX + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!text || rerr || size > CFG_FILE_MAX) {
        snprintf(err, errlen, "%s: %s", path,
                 !text  ? "out of memory"
                 : rerr ? "read error"
                        : "larger than 16 MiB; not a config file");
        free(text);
        return -1;
    }
    char *p = strdup(path);
    if (p) {
        free(c->path);
        c->path = p;
    }
    struct yreader *r = p ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(text);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    *r = (struct yreader){.c = c, .path = path, .text = text, .size = size, .err = err, .errlen = errlen};
    yaml_parser_initialize(&r->parser);
    yaml_parser_set_input_string(&r->parser, (const unsigned char *)text, size);
    int rc = read_stream(r);
    yaml_parser_delete(&r->parser);
    for (size_t i = 0; i < r->ntnames; i++)
        free(r->tnames[i]);
    free(r->tnames);
    free(r->tlines);
    free(r);
    free(text);
    return rc;
}

/* ---- cross-key rules */

static const struct cfg_key *key_of(const char *dotted)
{
    return cfg_key_find(dotted);
}

/* "where" a pair of keys comes from: the origin of the one set last (highest precedence) */
static void blame(const struct cfg *c, const char *a, const char *b, char *buf, size_t len)
{
    const struct cfg_key *ka = key_of(a), *kb = key_of(b);
    const struct cfg_origin *oa = &c->origin[ka - keys], *ob = &c->origin[kb - keys];
    const struct cfg_key *k = ob->source > oa->source ? kb : ka;
    const struct cfg_origin *o = &c->origin[k - keys];
    if (o->source == CFG_SRC_FILE)
        snprintf(buf, len, "%s:%d", c->path ? c->path : "?", o->line);
    else if (o->source == CFG_SRC_DEFAULT)
        snprintf(buf, len, "defaults");
    else
        snprintf(buf, len, "%s", o->name);
}

static int rule(const struct cfg *c, bool ok, const char *a, const char *b, const char *what, char *err,
                size_t errlen)
{
    if (ok)
        return 0;
    char where[128], va[64], vb[64];
    blame(c, a, b, where, sizeof where);
    cfg_format_value(c, key_of(a), va, sizeof va);
    cfg_format_value(c, key_of(b), vb, sizeof vb);
    snprintf(err, errlen, "%s: %s (%s) %s %s (%s)", where, a, va, what, b, vb);
    return -1;
}

int cfg_validate(const struct cfg *c, char *err, size_t errlen)
{
    const struct cfg_queues *q = &c->queues;
    const struct cfg_engine *e = &c->engine;
    int mlen = c->model.max_model_len;
    if (rule(c, 2 * c->worker.heartbeat_interval_s <= c->worker.heartbeat_ttl_s,
             "worker.heartbeat_interval_s", "worker.heartbeat_ttl_s", "must be at most half of", err,
             errlen) ||
        rule(c, c->redis.block_timeout_ms <= 1000 * c->worker.heartbeat_interval_s, "redis.block_timeout_ms",
             "worker.heartbeat_interval_s", "must not exceed (in ms)", err, errlen) ||
        rule(c, q->retry_backoff_base_ms <= q->retry_backoff_max_ms, "queues.retry_backoff_base_ms",
             "queues.retry_backoff_max_ms", "must not exceed", err, errlen) ||
        rule(c, q->short_max_num_seqs <= e->max_num_seqs, "queues.short_max_num_seqs", "engine.max_num_seqs",
             "must not exceed", err, errlen) ||
        rule(c, q->long_max_num_seqs <= e->max_num_seqs, "queues.long_max_num_seqs", "engine.max_num_seqs",
             "must not exceed", err, errlen) ||
        rule(c, q->short_max_num_batched_tokens <= e->max_num_batched_tokens,
             "queues.short_max_num_batched_tokens", "engine.max_num_batched_tokens", "must not exceed", err,
             errlen) ||
        rule(c, q->long_max_num_batched_tokens <= e->max_num_batched_tokens,
             "queues.long_max_num_batched_tokens", "engine.max_num_batched_tokens", "must not exceed", err,
             errlen) ||
        rule(c, !q->short_max_model_len || q->long_threshold_tokens < q->short_max_model_len,
             "queues.long_threshold_tokens", "queues.short_max_model_len", "must be less than", err,
             errlen) ||
        rule(c, !mlen || q->short_max_model_len <= mlen, "queues.short_max_model_len", "model.max_model_len",
             "must not exceed", err, errlen) ||
        rule(c, !mlen || q->long_max_model_len <= mlen, "queues.long_max_model_len", "model.max_model_len",
             "must not exceed", err, errlen) ||
        rule(c, c->sqlite.path[0] || c->results_stream.enabled, "sqlite.path", "results_stream.enabled",
             "may be \"\" (no local database) only with", err, errlen))
        return -1;
    return 0;
}

int cfg_load(struct cfg *c, const char *path, char *err, size_t errlen)
{
    cfg_defaults(c);
    if (path && cfg_load_file(c, path, err, errlen))
        return -1;
    if (cfg_load_env(c, err, errlen))
        return -1;
    return cfg_validate(c, err, errlen);
}

/* ---- reading */

const char *cfg_template_find(const struct cfg *c, const char *name)
{
    for (size_t i = 0; i < c->n_templates; i++)
        if (!strcmp(c->templates[i].name, name))
            return c->templates[i].text;
    return NULL;
}

const char *cfg_template_lookup(void *ctx, const char *name)
{
    return cfg_template_find(ctx, name);
}

/* The name of value in an enum key's choices, or NULL when it is none of them. */
static const char *choice_name(const struct cfg_key *k, int value)
{
    for (int i = 0; k->choices[i]; i++)
        if (i == value)
            return k->choices[i];
    return NULL;
}

const char *cfg_choice(const char *dotted, int value)
{
    const struct cfg_key *k = cfg_key_find(dotted);
    if (!k || k->type != CFG_T_ENUM)
        return NULL;
    return choice_name(k, value);
}

void cfg_format_value(const struct cfg *c, const struct cfg_key *k, char *buf, size_t len)
{
    const void *p = cfield(c, k);
    switch (k->type) {
    case CFG_T_STRING:
        snprintf(buf, len, "%s", *(char *const *)p ? *(char *const *)p : "");
        break;
    case CFG_T_INT:
        snprintf(buf, len, "%d", *(const int *)p);
        break;
    case CFG_T_DOUBLE:
        fmt_double(*(const double *)p, buf, len);
        break;
    case CFG_T_BOOL:
        snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false");
        break;
    case CFG_T_ENUM: {
        const char *s = choice_name(k, *(const int *)p);
        snprintf(buf, len, "%s", s ? s : "?");
        break;
    }
    case CFG_T_SIZE:
        format_size(*(const int64_t *)p, buf, len);
        break;
    case CFG_T_MAP:
        snprintf(buf, len, "(%zu templates)", c->n_templates);
        break;
    }
}

static void format_origin(const struct cfg *c, const struct cfg_origin *o, char *buf, size_t len)
{
    switch (o->source) {
    case CFG_SRC_FILE:
        snprintf(buf, len, "%s:%d", c->path ? c->path : "?", o->line);
        break;
    case CFG_SRC_ENV:
        snprintf(buf, len, "env %s", o->name);
        break;
    case CFG_SRC_FLAG:
        snprintf(buf, len, "flag %s", o->name);
        break;
    default:
        snprintf(buf, len, "default");
        break;
    }
}

void cfg_format_origin(const struct cfg *c, const struct cfg_key *k, char *buf, size_t len)
{
    format_origin(c, &c->origin[k - keys], buf, len);
}

/* A YAML double-quoted scalar. */
static void write_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\x%02x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* "  key: value", the value quoted or as is */
static void write_key_value(FILE *f, const char *key, const char *val, bool quote)
{
    fprintf(f, "  %s: ", key);
    if (quote)
        write_quoted(f, val);
    else
        fputs(val, f);
}

static void write_line(FILE *f, const char *key, const char *val, bool quote, const char *comment)
{
    char line[1024];
    FILE *m = fmemopen(line, sizeof line, "w");
    if (m) {
        write_key_value(m, key, val, quote);
        fclose(m);
    }
    if (!m || strlen(line) >= sizeof line - 1) { /* too long to align: write it directly */
        write_key_value(f, key, val, quote);
        line[0] = 0;
    } else {
        fputs(line, f);
    }
    if (comment)
        fprintf(f, "%*s # %s", line[0] && strlen(line) < 44 ? (int)(44 - strlen(line)) : 0, "", comment);
    fputc('\n', f);
}

void cfg_write_yaml(const struct cfg *c, FILE *f, unsigned flags)
{
    const char *sec = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const struct cfg_key *k = &keys[i];
        if (strcmp(k->section, sec)) {
            if (is_map(k) && c->n_templates == 0) {
                fprintf(f, "%s%s: {}\n", *sec ? "\n" : "", k->section);
                break;
            }
            fprintf(f, "%s%s:\n", *sec ? "\n" : "", k->section);
            sec = k->section;
        }
        char comment[256];
        if (is_map(k)) {
            for (size_t t = 0; t < c->n_templates; t++) {
                format_origin(c, &c->templates[t].origin, comment, sizeof comment);
                write_line(f, c->templates[t].name, c->templates[t].text, true,
                           flags & CFG_YAML_ORIGIN ? comment : NULL);
            }
            continue;
        }
        char val[1024];
        cfg_format_value(c, k, val, sizeof val);
        if (flags & CFG_YAML_REDACT && k->flags & CFG_F_SECRET && *val)
            snprintf(val, sizeof val, "****");
        if (flags & CFG_YAML_REDACT && k->check == check_redis_url) {
            char tmp[1024];
            rq_url_redact(val, tmp, sizeof tmp);
            memcpy(val, tmp, sizeof val);
        }
        cfg_format_origin(c, k, comment, sizeof comment);
        if (k->type == CFG_T_STRING) {
            const char *s = *(char *const *)cfield(c, k);
            bool hide = flags & CFG_YAML_REDACT && (k->flags & CFG_F_SECRET || k->check == check_redis_url);
            write_line(f, k->name, hide ? val : s, true, flags & CFG_YAML_ORIGIN ? comment : NULL);
        } else {
            write_line(f, k->name, val, false, flags & CFG_YAML_ORIGIN ? comment : NULL);
        }
    }
}
