/* The llmq configuration: one typed struct, filled in this order, each step overriding the last:
 *
 *   defaults  <  the YAML file (-c FILE)  <  environment LLMQ_<SECTION>_<KEY>  <  command-line flags
 *
 * The key table in config.c is the only place keys are defined: name, type, default, bounds,
 * help. Defaults, validation, the environment names, `llmq config --keys` and the YAML writer all
 * come from it. docs/CONFIG.md describes the file; conf/llmq.yaml documents every key.
 *
 * Usage in a command (flags override the file and the environment):
 *
 *     struct cfg c;
 *     char err[512];
 *     cfg_defaults(&c);
 *     if (cfg_load_file(&c, path, err, sizeof err) || cfg_load_env(&c, err, sizeof err) ||
 *         (db && cfg_set(&c, "sqlite.path", db, "--db", err, sizeof err)) ||
 *         cfg_validate(&c, err, sizeof err)) {
 *         fprintf(stderr, "llmq worker: %s\n", err);
 *         cfg_free(&c);
 *         return 1;
 *     }
 *     ... read c.engine.block_size etc ...
 *     cfg_free(&c);
 *
 * cfg_load() does the four steps without flags. Error messages name where the bad value came
 * from and the key:
 *
 *     conf/x.yaml:12: engine.block_size: 48 is not a power of two between 8 and 256
 *     conf/x.yaml:7: unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)
 *     LLMQ_ENGINE_BLOCK_SIZE: expected an integer, got "abc"
 *     --db: must not be empty
 *
 * Strings in a struct cfg are owned by it (malloc'd, not NULL after cfg_defaults) and freed by
 * cfg_free. A struct cfg is not thread-safe to modify; reading it from many threads is fine. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* model.dtype: the dtype weights are placed in on the backend. */
enum cfg_dtype { CFG_DTYPE_AUTO, CFG_DTYPE_BF16, CFG_DTYPE_FP16, CFG_DTYPE_FP32, CFG_DTYPE_FP8 };
/* engine.backend */
enum cfg_backend { CFG_BACKEND_AUTO, CFG_BACKEND_CPU, CFG_BACKEND_CUDA };
/* model.lm_head_dtype */
enum cfg_lm_dtype { CFG_LM_AUTO, CFG_LM_BF16, CFG_LM_FP8 };

/* engine.kv_cache_dtype */
enum cfg_kv_dtype { CFG_KV_AUTO, CFG_KV_BF16, CFG_KV_FP8 };

/* engine.decode_weight_copies */
enum cfg_copies { CFG_COPIES_AUTO, CFG_COPIES_ON, CFG_COPIES_OFF };
/* worker.log_level holds an enum log_level (engine/util/log.h): debug, info, warn, error. */

struct cfg_redis {
    char *url;              /* redis://[user:password@]host:port[/db] or unix:///path.sock[?db=N] */
    char *username;         /* ACL user; "" = the URL's */
    char *password;         /* "" = the URL's */
    int db;                 /* -1 = the URL's (0 if it has none) */
    char *prefix;           /* key prefix: "llmq" -> llmq:queue:short; "{llmq}" on Redis Cluster */
    int connect_timeout_ms; /* TCP/unix connect and every non-blocking command */
    int start_timeout_s;    /* --drain: exit 1 when Redis cannot be reached this long at start */
    int block_timeout_ms;   /* BLMOVE timeout: how long shutdown can wait on an idle queue */
    int reconnect_max_ms;   /* ceiling of the exponential reconnect backoff */
    int64_t result_max_bytes; /* longest result line kept in a job hash; longer: a marker (0: always) */
    int stream_maxlen;        /* XADD llmq:stream:<id> MAXLEN ~ this */
    int stream_interval_ms;   /* streaming jobs' new text goes out at most this often */
    char *sentinels;          /* "host:port, ..." of Redis Sentinels; "" = none (redis.url is the server) */
    char *master_name;        /* the master's name at the sentinels */
    char *sentinel_username;  /* AUTH to the sentinels; "" = none */
    char *sentinel_password;  /* "" = no AUTH to the sentinels */
    int wait_replicas;        /* WAIT for this many replicas after enqueue, fetch and ack; 0 = no WAIT */
    int wait_timeout_ms;      /* WAIT's timeout */
};

struct cfg_queues {
    int long_threshold_tokens;        /* a short-queue job with a longer prompt moves to the long queue */
    int short_max_num_seqs;           /* short lane: sequences running at once */
    int short_max_num_batched_tokens; /* short lane: tokens per engine step */
    int short_max_model_len;          /* short lane: prompt + output; 0 = model.max_model_len */
    int long_max_num_seqs;            /* long lane: sequences running at once */
    int long_max_num_batched_tokens;  /* long lane: tokens per engine step (prefill chunk budget) */
    int long_max_model_len;           /* long lane: prompt + output; 0 = model.max_model_len */
    int64_t max_job_bytes;            /* a job's JSON longer than this is dead-lettered unparsed */
    int64_t fetch_max_bytes;          /* job JSON one fetch moves, a worker holds, at most */
    int max_attempts;                 /* deliveries before a job goes to the dead list */
    int max_stalls;                   /* deliveries that ran it and lost their worker, before the dead list */
    int retry_backoff_base_ms;        /* first retry delay; doubles per attempt, with jitter */
    int retry_backoff_max_ms;         /* ceiling of the retry delay */
    int result_ttl_s;                 /* llmq:job:<id> expires this long after it ends; 0 = never */
    int events_maxlen;                /* XADD llmq:events MAXLEN ~ this */
};

struct cfg_model {
    char *path;        /* Hugging Face model folder; "" = none (commands then need --model) */
    char *name;        /* name recorded in results; "" = the folder's basename */
    char *aliases;     /* more model names the worker serves, comma-separated (model queues) */
    int dtype;         /* enum cfg_dtype */
    int lm_head_dtype; /* enum cfg_lm_dtype */
    int max_model_len; /* 0 = config.json's max_position_embeddings; more enables YaRN */
    char *tokenizer;   /* folder with tokenizer.json; "" = the model folder */
    char *chat_template; /* Jinja file used instead of the model's chat template; "" = the model's */
};

struct cfg_engine {
    int backend;                   /* enum cfg_backend */
    int device;                    /* CUDA device index */
    double gpu_memory_utilization; /* share of GPU memory for weights + activations + KV */
    int block_size;                /* tokens per KV block; a power of two, 8..256 */
    int max_num_seqs;              /* sequences per engine step, both lanes together */
    int max_num_batched_tokens;    /* tokens per engine step, both lanes together */
    int kv_cache_dtype;            /* enum cfg_kv_dtype */
    int num_kv_blocks;             /* 0 = as many as memory allows; else exactly this many */
    int decode_weight_copies;      /* enum cfg_copies */
    char *gemm_tuning_file;        /* "" = none (engine/gemm_tuning.h) */
    int64_t cpu_kv_cache_bytes;    /* KV pool size of the CPU backend */
    bool enable_prefix_caching;
    double admission_reserve; /* share of max_tokens admission keeps KV blocks for */
    int priority_aging_s;     /* waiting this long raises a job's priority by 1; 0 = no aging */
    bool cuda_graphs;         /* capture decode steps as CUDA graphs */
    int cuda_graph_max_batch; /* larger decode batches run without a graph */
    int threads;              /* CPU backend OpenMP threads; 0 = all cores */
    int seed;                 /* base seed for jobs that give none (and --random-weights) */
};

struct cfg_sqlite {
    char *path;             /* database file, created with the schema if missing */
    int busy_timeout_ms;    /* PRAGMA busy_timeout */
    int commit_interval_ms; /* finished results wait at most this long for their transaction */
    int commit_max_rows;    /* ... or until this many are pending */
    /* --drain: exit 1 when the database cannot be written this long */
    int unwritable_timeout_s;
};

struct cfg_worker {
    char *id;                  /* "" = <hostname>-<pid> */
    char *queues;              /* comma list of short, long: the queues this worker fetches from */
    int heartbeat_interval_s;  /* how often llmq:worker:<id> is refreshed */
    int heartbeat_ttl_s;       /* its TTL: a crashed worker's jobs are reaped after this */
    int reaper_interval_s;     /* how often this worker looks for lapsed workers */
    int shutdown_timeout_s;    /* on SIGTERM: time to finish running jobs before pushing them back */
    int progress_every_tokens; /* progress to Redis every this many generated tokens per job */
    int log_level;             /* enum log_level */
};

/* Defaults for jobs that omit them (the job's own values always win). */
struct cfg_sampling {
    int max_tokens;
    double temperature; /* 0 = greedy */
    double top_p;       /* 1 = off */
    int top_k;          /* 0 = off */
    double min_p;       /* 0 = off */
    double repetition_penalty;
    double presence_penalty;
    double frequency_penalty;
    bool use_generation_config; /* take generation_config.json's values before these */
    bool enable_thinking;       /* chat template default for `messages` jobs */
};

struct cfg_metrics {
    bool enabled;         /* serve GET /metrics and /health */
    char *listen_address; /* bind address */
    int port;             /* 0 = any free port (logged) */
    int interval_s;       /* one worker_metrics row in SQLite per interval */
};

/* The result streams (queue/results.h): what `llmq collect --redis` reads. */
struct cfg_results_stream {
    bool enabled; /* publish each finished job's row and the metrics rows to Redis */
    int max_len;  /* entries each stream keeps at most; 0 = no cap */
};

/* Where a value came from. */
enum cfg_source { CFG_SRC_DEFAULT, CFG_SRC_FILE, CFG_SRC_ENV, CFG_SRC_FLAG };

struct cfg_origin {
    unsigned char source; /* enum cfg_source */
    int line;             /* CFG_SRC_FILE: 1-based line of the key in cfg.path */
    char name[64];        /* CFG_SRC_ENV: the variable; CFG_SRC_FLAG: the origin given to cfg_set */
};

/* templates.<name>: prompt templates jobs name with "template" (placeholders {var} filled from
 * the job's "vars"). */
struct cfg_template {
    char *name; /* owned */
    char *text; /* owned */
    struct cfg_origin origin;
};

#define CFG_MAX_KEYS 128

struct cfg {
    struct cfg_redis redis;
    struct cfg_queues queues;
    struct cfg_model model;
    struct cfg_engine engine;
    struct cfg_sqlite sqlite;
    struct cfg_worker worker;
    struct cfg_sampling sampling;
    struct cfg_metrics metrics;
    struct cfg_results_stream results_stream;
    struct cfg_template *templates; /* [n_templates], owned */
    size_t n_templates;
    char *path;                             /* the file last loaded; NULL if none (owned) */
    struct cfg_origin origin[CFG_MAX_KEYS]; /* per key, indexed like cfg_keys() */
};

/* ---- the key table */

enum cfg_type {
    CFG_T_STRING,
    CFG_T_INT,    /* int */
    CFG_T_DOUBLE, /* double */
    CFG_T_BOOL,   /* bool: true/false, yes/no, on/off, 1/0 */
    CFG_T_ENUM,   /* int: index into choices */
    CFG_T_SIZE,   /* int64_t bytes: 4096, 64KiB, 4MiB, 1GiB (k, KB, KiB are all 1024) */
    CFG_T_MAP,    /* the templates section: any name -> string */
};

enum {
    CFG_F_POW2 = 1,     /* an integer power of two within [min, max] */
    CFG_F_NONEMPTY = 2, /* a string that must not be empty */
    CFG_F_SECRET = 4,   /* hidden by `llmq config` unless --show-secrets */
    CFG_F_MIN_OPEN = 8, /* min is excluded: (min, max] */
    CFG_F_LIST = 16,    /* a string that a YAML file may also give as a sequence (joined with ", ") */
};

struct cfg_key {
    const char *section, *name; /* "engine", "block_size" */
    enum cfg_type type;
    size_t offset;              /* into struct cfg */
    const char *def;            /* the default as text, parsed like a value in the file */
    double min, max;            /* int, double and size bounds (inclusive unless CFG_F_MIN_OPEN) */
    const char *const *choices; /* CFG_T_ENUM: NULL-terminated; the stored value is the index */
    unsigned flags;             /* CFG_F_* */
    /* extra check of a parsed value (points at the typed value); writes why into msg */
    int (*check)(const void *value, char *msg, size_t msglen);
    const char *help;
};

/* The table, in file order: *n gets its length. Lives for the program. */
const struct cfg_key *cfg_keys(size_t *n);
/* The key for "section.name", or NULL. "templates.<anything>" finds the templates entry. */
const struct cfg_key *cfg_key_find(const char *dotted);
/* The Levenshtein distance between a and b; SIZE_MAX when either is longer than 63 bytes. */
size_t cfg_edit_distance(const char *a, const char *b);

/* The closest known key to a mistyped "section.name" (or section name), or NULL if none is close. */
const struct cfg_key *cfg_key_suggest(const char *dotted);
/* "LLMQ_ENGINE_BLOCK_SIZE" for engine.block_size. */
void cfg_key_env_name(const struct cfg_key *k, char *buf, size_t len);
/* "integer", "size", "enum", ... */
const char *cfg_type_name(enum cfg_type t);
/* The bounds as text: "[8, 256]", "(0, 1]", "auto|cpu|cuda", or "" when there are none. */
void cfg_key_bounds(const struct cfg_key *k, char *buf, size_t len);

/* ---- loading */

/* Sets every key to its default; no file. The struct must later be given to cfg_free. */
void cfg_defaults(struct cfg *c);
/* Reads a YAML file over the current values; a NULL path does nothing. On error writes
 * "file:line: key: what" into err, returns -1 and leaves keys set before the bad one changed.
 * c->path becomes this file (origins of values from an earlier file then name this one). */
int cfg_load_file(struct cfg *c, const char *path, char *err, size_t errlen);
/* Applies every LLMQ_<SECTION>_<KEY> that is set (an empty value counts as set). Variables that
 * name no key are ignored (see cfg_key_suggest for warnings). */
int cfg_load_env(struct cfg *c, char *err, size_t errlen);
/* Sets one key from text, as a command-line flag: origin (e.g. "--db") is recorded and starts any
 * error message. "templates.NAME" adds or replaces a template. */
int cfg_set(struct cfg *c, const char *dotted_key, const char *value, const char *origin, char *err,
            size_t errlen);
/* Checks the rules that involve more than one key (e.g. heartbeat interval vs TTL, lane limits
 * vs engine limits). Call it after the last cfg_set. */
int cfg_validate(const struct cfg *c, char *err, size_t errlen);
/* cfg_defaults + cfg_load_file (when path is not NULL) + cfg_load_env + cfg_validate. *c is
 * always initialised, so cfg_free it even on failure. */
int cfg_load(struct cfg *c, const char *path, char *err, size_t errlen);
/* Frees the strings and templates; the struct is left zeroed. Accepts NULL. */
void cfg_free(struct cfg *c);
/* $LLMQ_CONFIG when set and not empty, else NULL: the file commands read without -c. */
const char *cfg_default_path(void);

/* ---- reading */

/* The template's text, or NULL. Borrowed from c. */
const char *cfg_template_find(const struct cfg *c, const char *name);
/* cfg_template_find with the struct cfg passed as ctx: the shape of job_opts.template_find. */
const char *cfg_template_lookup(void *ctx, const char *name);
/* The name of an enum value: cfg_choice("engine.backend", c.engine.backend) -> "cuda". */
const char *cfg_choice(const char *dotted_key, int value);
/* A key's current value as text, as it would appear in the file unquoted (sizes as "4MiB"). */
void cfg_format_value(const struct cfg *c, const struct cfg_key *k, char *buf, size_t len);
/* Where a key's value came from: "default", "conf/x.yaml:12", "env LLMQ_X", "flag --db". */
void cfg_format_origin(const struct cfg *c, const struct cfg_key *k, char *buf, size_t len);

enum {
    CFG_YAML_ORIGIN = 1, /* a trailing comment on each value saying where it came from */
    CFG_YAML_REDACT = 2, /* secrets (and the password in redis.url) shown as "****" */
};
/* Writes the effective values as YAML that cfg_load_file reads back to the same struct. */
void cfg_write_yaml(const struct cfg *c, FILE *f, unsigned flags);
