/* worker/config/config.c: every type, every bound, every error message, the precedence of file,
 * environment and flags, Redis URLs, and a write/read round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/util/log.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"
#include "worker/config/redis_cfg.h"

static char dir[128];
static char path[192]; /* the YAML file each test writes */

static int setup(void **state)
{
    if (scratch_dir_make(getenv("TMPDIR"), "test-config", dir, sizeof dir))
        return -1;
    snprintf(path, sizeof path, "%s/llmq.yaml", dir);
    return 0;
}

static int teardown(void **state)
{
    unlink(path);
    char p2[160];
    snprintf(p2, sizeof p2, "%s/out.yaml", dir);
    unlink(p2);
    rmdir(dir);
    return 0;
}

static void write_file(const char *p, const char *text, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

/* defaults + the YAML text as a file */
static int load_text(struct cfg *c, const char *yaml, char *err, size_t errlen)
{
    write_file(path, yaml, strlen(yaml));
    cfg_defaults(c);
    return cfg_load_file(c, path, err, errlen);
}

/* The file must fail with exactly "<path>:<want>". */
static void file_error(const char *yaml, const char *want)
{
    struct cfg c;
    char err[1024] = "", full[1024];
    int rc = load_text(&c, yaml, err, sizeof err);
    snprintf(full, sizeof full, "%s:%s", path, want);
    if (rc == 0)
        fail_msg("no error for:\n%s", yaml);
    assert_string_equal(err, full);
    cfg_free(&c);
}

/* The file must fail with a message starting "<path>:<prefix>" and containing `has`. */
static void file_error_like(const char *yaml, const char *prefix, const char *has)
{
    struct cfg c;
    char err[1024] = "", full[1024];
    int rc = load_text(&c, yaml, err, sizeof err);
    snprintf(full, sizeof full, "%s:%s", path, prefix);
    if (rc == 0)
        fail_msg("no error for:\n%s", yaml);
    if (strncmp(err, full, strlen(full)) || !strstr(err, has))
        fail_msg("error \"%s\" does not start with \"%s\" and contain \"%s\"", err, full, has);
    cfg_free(&c);
}

/* cfg_set must fail with exactly `want`. */
static void set_error(const char *key, const char *value, const char *want)
{
    struct cfg c;
    char err[1024] = "";
    cfg_defaults(&c);
    int rc = cfg_set(&c, key, value, "--x", err, sizeof err);
    if (rc == 0)
        fail_msg("no error for %s=%s", key, value);
    assert_string_equal(err, want);
    cfg_free(&c);
}

static void value_of(const struct cfg *c, const char *key, char *buf, size_t len)
{
    const struct cfg_key *k = cfg_key_find(key);
    assert_non_null(k);
    cfg_format_value(c, k, buf, len);
}

static const struct cfg_origin *origin_of(const struct cfg *c, const char *key)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    const struct cfg_key *k = cfg_key_find(key);
    assert_non_null(k);
    return &c->origin[k - keys];
}

/* ---- the table and the defaults */

static void test_defaults(void **state)
{
    struct cfg c;
    char err[512];
    cfg_defaults(&c);
    /* the values the issues and DESIGN.md ask for */
    assert_string_equal(c.redis.url, "redis://127.0.0.1:6379/0");
    assert_string_equal(c.redis.prefix, "llmq");
    assert_int_equal(c.redis.db, -1);
    assert_true(c.redis.block_timeout_ms <= 1000);
    assert_string_equal(c.model.path, "");
    assert_int_equal(c.model.dtype, CFG_DTYPE_AUTO);
    assert_int_equal(c.model.max_model_len, 0);
    assert_int_equal(c.engine.backend, CFG_BACKEND_AUTO);
    assert_true(c.engine.gpu_memory_utilization == 0.92);
    assert_int_equal(c.engine.block_size, 32);
    assert_int_equal(c.engine.max_num_seqs, 512);
    assert_int_equal(c.engine.max_num_batched_tokens, 16384);
    assert_int_equal(c.engine.kv_cache_dtype, CFG_KV_AUTO);
    assert_int_equal(c.engine.decode_weight_copies, CFG_COPIES_AUTO);
    assert_string_equal(c.engine.gemm_tuning_file, "");
    assert_true(c.engine.enable_prefix_caching);
    assert_true(c.engine.cuda_graphs);
    assert_int_equal(c.engine.threads, 0);
    assert_string_equal(c.sqlite.path, "llmq.db");
    assert_string_equal(c.worker.id, "");
    assert_string_equal(c.worker.queues, "short,long");
    assert_int_equal(c.worker.heartbeat_ttl_s, 30);
    assert_true(c.worker.heartbeat_ttl_s <= 60);
    assert_int_equal(c.worker.log_level, LOG_INFO);
    assert_true(c.sampling.use_generation_config);
    assert_true(c.sampling.temperature == 1.0 && c.sampling.top_p == 1.0);
    assert_int_equal(c.queues.max_job_bytes, 4 << 20);
    assert_int_equal(c.engine.cpu_kv_cache_bytes, (int64_t)1 << 30);
    assert_string_equal(c.metrics.listen_address, "127.0.0.1");
    assert_int_equal(c.n_templates, 0);
    assert_null(c.path);
    /* every string is allocated, every origin is "default", and the defaults pass the cross-key rules */
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].type == CFG_T_STRING)
            assert_non_null(*(char **)((char *)&c + keys[i].offset));
        assert_int_equal(c.origin[i].source, CFG_SRC_DEFAULT);
    }
    if (cfg_validate(&c, err, sizeof err))
        fail_msg("defaults do not validate: %s", err);
    /* the engine options the default configuration gives (llmq run, llmq worker) are the engine's own
     * defaults (llmq bench without --config): two places hold them, one test keeps them equal */
    assert_int_equal(c.engine.cuda_graph_max_batch, 512);
    const struct engine_opts dflt = engine_opts_default(), eo = engine_cfg_opts(&c);
    assert_int_equal(eo.be.block_size, dflt.be.block_size);
    assert_int_equal(eo.be.max_num_seqs, dflt.be.max_num_seqs);
    assert_int_equal(eo.be.max_num_batched_tokens, dflt.be.max_num_batched_tokens);
    assert_int_equal(eo.be.max_model_len, dflt.be.max_model_len);
    assert_int_equal(eo.be.threads, dflt.be.threads);
    assert_int_equal(eo.be.device, dflt.be.device);
    assert_int_equal(eo.be.num_kv_blocks, dflt.be.num_kv_blocks);
    /* engine.cpu_kv_cache_bytes sizes the CPU backend's pool only: it once reached kv_cache_bytes, which
     * the CUDA backend takes as a cap, so `llmq run` and `llmq worker` on a GPU had a 1 GiB KV cache */
    assert_int_equal(eo.be.kv_cache_bytes, dflt.be.kv_cache_bytes);
    assert_int_equal(eo.be.kv_cache_bytes, 0);
    assert_int_equal(eo.be.cpu_kv_cache_bytes, (int64_t)1 << 30);
    assert_true(eo.be.gpu_memory_utilization == dflt.be.gpu_memory_utilization);
    assert_int_equal(eo.be.kv_dtype, dflt.be.kv_dtype);
    assert_int_equal(eo.be.weight_dtype, dflt.be.weight_dtype);
    assert_int_equal(eo.be.lm_head_dtype, dflt.be.lm_head_dtype);
    assert_int_equal(eo.be.decode_weight_copies, dflt.be.decode_weight_copies);
    assert_int_equal(eo.be.decode_weight_copies, BE_COPIES_AUTO);
    assert_int_equal(eo.be.cuda_graphs, dflt.be.cuda_graphs);
    assert_int_equal(eo.be.cuda_graph_max_batch, dflt.be.cuda_graph_max_batch);
    assert_string_equal(engine_cfg_backend(&c), "auto");
    assert_int_equal(eo.enable_prefix_caching, dflt.enable_prefix_caching);
    assert_int_equal(eo.seed, dflt.seed);
    cfg_free(&c);
    cfg_free(&c); /* harmless twice (zeroed) */
    cfg_free(NULL);
}

static void test_table(void **state)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    assert_true(n > 60 && n <= CFG_MAX_KEYS);
    static const char *const sections[] = {"redis",  "queues",   "model",   "engine",         "sqlite",
                                           "worker", "sampling", "metrics", "results_stream", "templates"};
    for (size_t s = 0; s < sizeof sections / sizeof sections[0]; s++) {
        bool found = false;
        for (size_t i = 0; i < n; i++)
            found |= !strcmp(keys[i].section, sections[s]);
        if (!found)
            fail_msg("no section %s", sections[s]);
    }
    for (size_t i = 0; i < n; i++) {
        const struct cfg_key *k = &keys[i];
        char dotted[128], env[96], want[96], err[512];
        snprintf(dotted, sizeof dotted, "%s.%s", k->section, k->name);
        assert_ptr_equal(cfg_key_find(dotted), k); /* unique and findable */
        assert_true(k->help && *k->help);
        if (k->type == CFG_T_MAP)
            continue;
        /* the default parses as a value of its own key */
        struct cfg c;
        cfg_defaults(&c);
        if (cfg_set(&c, dotted, k->def, "default", err, sizeof err))
            fail_msg("default of %s: %s", dotted, err);
        cfg_free(&c);
        if (k->type == CFG_T_INT || k->type == CFG_T_DOUBLE || k->type == CFG_T_SIZE)
            assert_true(k->min < k->max);
        if (k->type == CFG_T_ENUM)
            assert_non_null(k->choices);
        cfg_key_env_name(k, env, sizeof env);
        snprintf(want, sizeof want, "LLMQ_%s_%s", k->section, k->name);
        for (char *p = want; *p; p++)
            if (*p >= 'a' && *p <= 'z')
                *p = (char)(*p - 'a' + 'A');
        assert_string_equal(env, want);
    }
}

static void test_key_api(void **state)
{
    char buf[128];
    const struct cfg_key *k = cfg_key_find("engine.block_size");
    assert_non_null(k);
    assert_string_equal(k->section, "engine");
    assert_string_equal(k->name, "block_size");
    assert_int_equal(k->type, CFG_T_INT);
    cfg_key_env_name(k, buf, sizeof buf);
    assert_string_equal(buf, "LLMQ_ENGINE_BLOCK_SIZE");
    cfg_key_bounds(k, buf, sizeof buf);
    assert_string_equal(buf, "[8, 256], a power of two");
    cfg_key_bounds(cfg_key_find("engine.gpu_memory_utilization"), buf, sizeof buf);
    assert_string_equal(buf, "(0, 1]");
    cfg_key_bounds(cfg_key_find("queues.max_job_bytes"), buf, sizeof buf);
    assert_string_equal(buf, "[1KiB, 1GiB]");
    cfg_key_bounds(cfg_key_find("engine.backend"), buf, sizeof buf);
    assert_string_equal(buf, "auto|cpu|cuda");
    cfg_key_bounds(cfg_key_find("metrics.listen_address"), buf, sizeof buf);
    assert_string_equal(buf, "not empty");
    assert_null(cfg_key_find("engine"));
    assert_null(cfg_key_find("engine."));
    assert_null(cfg_key_find("engine.nope"));
    assert_null(cfg_key_find("nope.block_size"));
    assert_int_equal(cfg_key_find("templates.anything")->type, CFG_T_MAP);
    assert_string_equal(cfg_type_name(CFG_T_SIZE), "size");
    assert_string_equal(cfg_type_name(CFG_T_DOUBLE), "number");
    assert_string_equal(cfg_choice("engine.backend", CFG_BACKEND_CUDA), "cuda");
    assert_string_equal(cfg_choice("model.dtype", CFG_DTYPE_FP8), "fp8");
    assert_string_equal(cfg_choice("engine.kv_cache_dtype", CFG_KV_BF16), "bf16");
    assert_string_equal(cfg_choice("worker.log_level", LOG_WARN), "warn");
    assert_null(cfg_choice("engine.backend", 3));
    assert_null(cfg_choice("engine.block_size", 0));
    /* suggestions */
    assert_ptr_equal(cfg_key_suggest("engine.blok_size"), k);
    assert_ptr_equal(cfg_key_suggest("engine.block_sizes"), k);
    assert_ptr_equal(cfg_key_suggest("model.block_size"), k); /* right name, wrong section */
    assert_ptr_equal(cfg_key_suggest("block_size"), k);       /* a key outside any section */
    assert_string_equal(cfg_key_suggest("enigne")->section, "engine");
    assert_null(cfg_key_suggest("engine.zzzzzzzzzz"));
    assert_null(cfg_key_suggest("qqqqqq"));
    /* $LLMQ_CONFIG */
    unsetenv("LLMQ_CONFIG");
    assert_null(cfg_default_path());
    setenv("LLMQ_CONFIG", "", 1);
    assert_null(cfg_default_path());
    setenv("LLMQ_CONFIG", "/etc/llmq/llmq.yaml", 1);
    assert_string_equal(cfg_default_path(), "/etc/llmq/llmq.yaml");
    unsetenv("LLMQ_CONFIG");
}

/* conf/llmq.yaml loads, sets every key (so it documents every one), with a comment on each,
 * and its values are the defaults. */
static void test_example_file(void **state)
{
    const char *conf = test_source("conf/llmq.yaml");
    struct cfg c, d;
    char err[512];
    if (cfg_load(&c, conf, err, sizeof err))
        fail_msg("%s", err);
    cfg_defaults(&d);
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    FILE *f = fopen(conf, "r");
    assert_non_null(f);
    char lines[400][512];
    int nl = 0;
    while (nl < 400 && fgets(lines[nl], sizeof lines[nl], f))
        nl++;
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].type == CFG_T_MAP)
            continue;
        char a[256], b[256];
        if (c.origin[i].source != CFG_SRC_FILE)
            fail_msg("conf/llmq.yaml does not set %s.%s", keys[i].section, keys[i].name);
        cfg_format_value(&c, &keys[i], a, sizeof a);
        cfg_format_value(&d, &keys[i], b, sizeof b);
        if (strcmp(a, b))
            fail_msg("conf/llmq.yaml: %s.%s is %s, the default is %s", keys[i].section, keys[i].name, a, b);
        int line = c.origin[i].line;
        assert_true(line >= 2 && line <= nl);
        const char *prev = lines[line - 2];
        while (*prev == ' ')
            prev++;
        if (*prev != '#' && !strchr(lines[line - 1], '#'))
            fail_msg("conf/llmq.yaml:%d: %s has no comment", line, keys[i].name);
    }
    assert_non_null(cfg_template_find(&c, "summarize"));
    assert_non_null(strstr(cfg_template_find(&c, "summarize"), "{document}"));
    assert_null(cfg_template_find(&c, "nope"));
    cfg_free(&c);
    cfg_free(&d);
}

/* ---- values of every type */

static void test_types(void **state)
{
    struct cfg c;
    char err[512], v[64];
    int rc = load_text(&c,
                       "redis:\n"
                       "  url: unix:///run/redis.sock\n" /* plain string */
                       "  password: 'it''s'\n"           /* single-quoted */
                       "  username: ~\n"                 /* null string = "" */
                       "  db: -1\n"
                       "  prefix: \"{llmq}\"\n"
                       "model:\n"
                       "  path: |\n"
                       "    /models/qwen\n" /* block scalar (ends in a newline) */
                       "  name:\n"          /* empty = "" */
                       "  dtype: BF16\n"    /* enums ignore case */
                       "  max_model_len: +4096\n"
                       "engine:\n"
                       "  backend: cuda\n"
                       "  gpu_memory_utilization: 5e-1\n"
                       "  block_size: 16\n"
                       "  enable_prefix_caching: no\n"
                       "  cuda_graphs: Off\n"
                       "  cpu_kv_cache_bytes: 2G\n"
                       "  num_kv_blocks: \"100\"\n" /* a quoted number is still a number */
                       "sampling:\n"
                       "  temperature: 0\n"
                       "  top_p: .95\n"
                       "  use_generation_config: FALSE\n"
                       "  enable_thinking: 0\n"
                       "  presence_penalty: -1.5\n"
                       "queues:\n"
                       "  max_job_bytes: 64 KiB\n"
                       "  events_maxlen: 1000\n"
                       "metrics:\n"
                       "  enabled: yes\n"
                       "worker:\n"
                       "  log_level: debug\n",
                       err, sizeof err);
    if (rc)
        fail_msg("%s", err);
    assert_string_equal(c.redis.url, "unix:///run/redis.sock");
    assert_string_equal(c.redis.password, "it's");
    assert_string_equal(c.redis.username, "");
    assert_string_equal(c.redis.prefix, "{llmq}");
    assert_string_equal(c.model.path, "/models/qwen\n");
    assert_string_equal(c.model.name, "");
    assert_int_equal(c.model.dtype, CFG_DTYPE_BF16);
    assert_int_equal(c.model.max_model_len, 4096);
    assert_int_equal(c.engine.backend, CFG_BACKEND_CUDA);
    assert_true(c.engine.gpu_memory_utilization == 0.5);
    assert_int_equal(c.engine.block_size, 16);
    assert_false(c.engine.enable_prefix_caching);
    assert_false(c.engine.cuda_graphs);
    assert_int_equal(c.engine.cpu_kv_cache_bytes, (int64_t)2 << 30);
    assert_int_equal(c.engine.num_kv_blocks, 100);
    assert_true(c.sampling.temperature == 0.0);
    assert_true(c.sampling.top_p == 0.95);
    assert_false(c.sampling.use_generation_config);
    assert_false(c.sampling.enable_thinking);
    assert_true(c.sampling.presence_penalty == -1.5);
    assert_int_equal(c.queues.max_job_bytes, 65536);
    assert_true(c.metrics.enabled);
    assert_int_equal(c.worker.log_level, LOG_DEBUG);
    value_of(&c, "queues.max_job_bytes", v, sizeof v);
    assert_string_equal(v, "64KiB");
    value_of(&c, "model.dtype", v, sizeof v);
    assert_string_equal(v, "bf16");
    /* origins: file lines */
    assert_int_equal(origin_of(&c, "redis.url")->source, CFG_SRC_FILE);
    assert_int_equal(origin_of(&c, "redis.url")->line, 2);
    assert_int_equal(origin_of(&c, "engine.block_size")->line, 16);
    assert_int_equal(origin_of(&c, "engine.threads")->source, CFG_SRC_DEFAULT);
    char o[256], want[256];
    cfg_format_origin(&c, cfg_key_find("engine.block_size"), o, sizeof o);
    snprintf(want, sizeof want, "%s:16", path);
    assert_string_equal(o, want);
    cfg_format_origin(&c, cfg_key_find("engine.threads"), o, sizeof o);
    assert_string_equal(o, "default");
    cfg_free(&c);

    /* sizes: every suffix; k, KB and KiB are all 1024 */
    static const struct {
        const char *text;
        int64_t bytes;
    } sizes[] = {{"1024", 1024},   {"1k", 1024},      {"1K", 1024},      {"1KB", 1024},     {"1KiB", 1024},
                 {"3b", 3},        {"5m", 5 << 20},   {"5MB", 5 << 20},  {"5mib", 5 << 20}, {"1g", 1 << 30},
                 {"1GB", 1 << 30}, {"1GiB", 1 << 30}, {"1 MiB", 1 << 20}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cfg_defaults(&c);
        int r = cfg_set(&c, "engine.cpu_kv_cache_bytes", "16MiB", "--x", err, sizeof err);
        assert_int_equal(r, 0);
        r = cfg_set(&c, "queues.max_job_bytes", sizes[i].text, "--x", err, sizeof err);
        if (sizes[i].bytes < 1024) {
            assert_int_equal(r, -1);
        } else {
            if (r)
                fail_msg("%s: %s", sizes[i].text, err);
            assert_int_equal(c.queues.max_job_bytes, sizes[i].bytes);
        }
        cfg_free(&c);
    }
    cfg_defaults(&c);
    assert_int_equal(cfg_set(&c, "engine.cpu_kv_cache_bytes", "1t", "--x", err, sizeof err), 0);
    assert_int_equal(c.engine.cpu_kv_cache_bytes, (int64_t)1 << 40);
    assert_int_equal(cfg_set(&c, "engine.cpu_kv_cache_bytes", "1TiB", "--x", err, sizeof err), 0);
    cfg_free(&c);
}

/* empty files, comments only, a lone "---", empty sections: all fine */
static void test_empty(void **state)
{
    struct cfg c0;
    char err0[64];
    cfg_defaults(&c0);
    assert_int_equal(cfg_load_file(&c0, NULL, err0, sizeof err0), 0); /* no file: nothing to do */
    assert_null(c0.path);
    cfg_free(&c0);
    static const char *const texts[] = {"",           "# nothing\n",  "---\n",
                                        "---\n...\n", "engine:\n",    "engine:\nredis: ~\n",
                                        "{}\n",       "engine: {}\n", "templates:\n"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct cfg c;
        char err[512];
        if (load_text(&c, texts[i], err, sizeof err))
            fail_msg("\"%s\": %s", texts[i], err);
        assert_int_equal(c.engine.block_size, 32);
        assert_string_equal(c.path, path);
        cfg_free(&c);
    }
}

static void test_type_errors(void **state)
{
    file_error("engine:\n  threads: abc\n", "2: engine.threads: expected an integer, got \"abc\"");
    file_error("engine:\n  threads: 1.5\n", "2: engine.threads: expected an integer, got \"1.5\"");
    file_error("engine:\n  threads: 0x10\n", "2: engine.threads: expected an integer, got \"0x10\"");
    file_error("engine:\n  threads: \"\"\n", "2: engine.threads: expected an integer, got \"\"");
    file_error("engine:\n  threads:\n", "2: engine.threads: expected an integer, got an empty value");
    file_error("engine:\n  threads: ~\n", "2: engine.threads: expected an integer, got an empty value");
    file_error("engine:\n  threads: [1, 2]\n", "2: engine.threads: expected an integer, got a sequence");
    file_error("engine:\n  threads: {a: 1}\n", "2: engine.threads: expected an integer, got a mapping");
    file_error("engine:\n  gpu_memory_utilization: lots\n",
               "2: engine.gpu_memory_utilization: expected a number, got \"lots\"");
    file_error("engine:\n  gpu_memory_utilization: nan\n",
               "2: engine.gpu_memory_utilization: expected a number, got \"nan\"");
    file_error("engine:\n  gpu_memory_utilization: .inf\n",
               "2: engine.gpu_memory_utilization: expected a number, got \".inf\"");
    file_error("engine:\n  gpu_memory_utilization: 1e400\n",
               "2: engine.gpu_memory_utilization: expected a number, got \"1e400\"");
    file_error("engine:\n  cuda_graphs: maybe\n",
               "2: engine.cuda_graphs: expected true or false, got \"maybe\"");
    file_error("engine:\n  cuda_graphs:\n",
               "2: engine.cuda_graphs: expected true or false, got an empty value");
    file_error("engine:\n  backend: tpu\n", "2: engine.backend: expected one of auto|cpu|cuda, got \"tpu\"");
    file_error("model:\n  dtype: bf17\n",
               "2: model.dtype: expected one of auto|bf16|fp16|fp32|fp8, got \"bf17\"");
    file_error("engine:\n  kv_cache_dtype: fp16\n",
               "2: engine.kv_cache_dtype: expected one of auto|bf16|fp8, got \"fp16\"");
    file_error("worker:\n  log_level: verbose\n",
               "2: worker.log_level: expected one of debug|info|warn|error, got \"verbose\"");
    const char *sz = "expected a size in bytes (4096, 64KiB, 4MiB, 1GiB)";
    char want[256], yaml[256];
    static const char *const bad_sizes[] = {"abc", "-1", "4XB", "1.5MiB", "MiB", "4 M B"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        snprintf(yaml, sizeof yaml, "queues:\n  max_job_bytes: %s\n", bad_sizes[i]);
        snprintf(want, sizeof want, "2: queues.max_job_bytes: %s, got \"%s\"", sz, bad_sizes[i]);
        file_error(yaml, want);
    }
    file_error("model:\n  path: [a]\n", "2: model.path: expected a string, got a sequence");
    file_error("model:\n  path: \"a\\0b\"\n", "2: model.path: contains a NUL byte");
    /* long and odd values are quoted, escaped and cut in messages */
    file_error("engine:\n  threads: \"a\\tb\\\"c\"\n",
               "2: engine.threads: expected an integer, got \"a\\x09b\\\"c\"");
    char a60[61];
    memset(a60, 'a', 60);
    a60[60] = 0;
    snprintf(yaml, sizeof yaml, "engine:\n  threads: %sbbbbbbbb\n", a60);
    snprintf(want, sizeof want, "2: engine.threads: expected an integer, got \"%s...\"", a60);
    file_error(yaml, want);
}

/* Every bound of every numeric key: the bound itself passes, one step past it fails with
 * "<value> is out of range <bounds>" (or the power-of-two message). */
static void test_every_bound(void **state)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    int checked = 0, numeric = 0;
    for (size_t i = 0; i < n; i++) {
        const struct cfg_key *k = &keys[i];
        if (k->type != CFG_T_INT && k->type != CFG_T_DOUBLE && k->type != CFG_T_SIZE)
            continue;
        numeric++;
        char dotted[128], lo[64], hi[64], below[64], above[64], bounds[128], err[512], want[512];
        snprintf(dotted, sizeof dotted, "%s.%s", k->section, k->name);
        cfg_key_bounds(k, bounds, sizeof bounds);
        if (k->type == CFG_T_DOUBLE) {
            snprintf(lo, sizeof lo, "%.17g", k->min);
            snprintf(hi, sizeof hi, "%.17g", k->max);
            snprintf(below, sizeof below, "%.17g", k->min - 1e-9);
            snprintf(above, sizeof above, "%.17g", k->max + 1e-9);
        } else {
            snprintf(lo, sizeof lo, "%.0f", k->min);
            snprintf(hi, sizeof hi, "%.0f", k->max);
            snprintf(below, sizeof below, "%.0f", k->min - 1);
            snprintf(above, sizeof above, "%.0f", k->max + 1);
        }
        struct cfg c;
        cfg_defaults(&c);
        bool min_ok = !(k->flags & CFG_F_MIN_OPEN);
        int rc = cfg_set(&c, dotted, lo, "--x", err, sizeof err);
        if (min_ok && rc)
            fail_msg("%s = its minimum %s: %s", dotted, lo, err);
        if (!min_ok && !rc)
            fail_msg("%s = %s passed an open lower bound", dotted, lo);
        if (cfg_set(&c, dotted, hi, "--x", err, sizeof err))
            fail_msg("%s = its maximum %s: %s", dotted, hi, err);
        const char *out[2] = {min_ok ? below : lo, above};
        for (int j = 0; j < 2; j++) {
            if (k->type == CFG_T_SIZE && out[j][0] == '-') { /* a size whose minimum is 0 */
                checked++; /* a negative size is a type error, tested above */
                continue;
            }
            if (!cfg_set(&c, dotted, out[j], "--x", err, sizeof err))
                fail_msg("%s = %s passed", dotted, out[j]);
            if (k->flags & CFG_F_POW2)
                snprintf(want, sizeof want, "--x: %s is not a power of two between %s and %s", out[j], lo,
                         hi);
            else
                snprintf(want, sizeof want, "--x: %s is out of range %s", out[j], bounds);
            assert_string_equal(err, want);
            checked++;
        }
        cfg_free(&c);
    }
    assert_true(numeric > 40);
    assert_int_equal(checked, 2 * numeric); /* both sides of every key */
    /* the messages, spelled out */
    set_error("engine.max_num_seqs", "0", "--x: 0 is out of range [1, 4096]");
    set_error("engine.gpu_memory_utilization", "0", "--x: 0 is out of range (0, 1]");
    set_error("engine.gpu_memory_utilization", "1.01", "--x: 1.01 is out of range (0, 1]");
    set_error("queues.max_job_bytes", "2GiB", "--x: 2GiB is out of range [1KiB, 1GiB]");
    set_error("queues.max_job_bytes", "99999999999999999999T",
              "--x: 99999999999999999999T is out of range [1KiB, 1GiB]");
    set_error("engine.threads", "99999999999999999999",
              "--x: 99999999999999999999 is out of range [0, 1024]");
    set_error("engine.threads", "-99999999999999999999",
              "--x: -99999999999999999999 is out of range [0, 1024]");
    set_error("worker.heartbeat_ttl_s", "61", "--x: 61 is out of range [2, 60]");
    set_error("metrics.port", "65536", "--x: 65536 is out of range [0, 65535]");
    set_error("sampling.top_p", "0", "--x: 0 is out of range (0, 1]");
    set_error("sampling.presence_penalty", "-2.5", "--x: -2.5 is out of range [-2, 2]");
    file_error("engine:\n  block_size: 48\n",
               "2: engine.block_size: 48 is not a power of two between 8 and 256");
    file_error("engine:\n  block_size: 512\n",
               "2: engine.block_size: 512 is not a power of two between 8 and 256");
    file_error("engine:\n  block_size: 4\n",
               "2: engine.block_size: 4 is not a power of two between 8 and 256");
    file_error("engine:\n  block_size: 0\n",
               "2: engine.block_size: 0 is not a power of two between 8 and 256");
    file_error("engine:\n  block_size: -32\n",
               "2: engine.block_size: -32 is not a power of two between 8 and 256");
    /* every power of two in range passes */
    for (int b = 8; b <= 256; b *= 2) {
        struct cfg c;
        char yaml[64], err[256];
        snprintf(yaml, sizeof yaml, "engine:\n  block_size: %d\n", b);
        if (load_text(&c, yaml, err, sizeof err))
            fail_msg("%s", err);
        assert_int_equal(c.engine.block_size, b);
        cfg_free(&c);
    }
}

/* strings with rules of their own */
static void test_string_rules(void **state)
{
    set_error("redis.url", "", "--x: must not be empty");
    set_error("metrics.listen_address", "", "--x: must not be empty");
    set_error("worker.queues", "", "--x: must not be empty");
    set_error("redis.prefix", "", "--x: must not be empty");
    set_error("redis.prefix", "my app", "--x: \"my app\" contains a space or control character");
    set_error("redis.prefix",
              "llmq:", "--x: \"llmq:\" must not end with ':' (llmq adds it: <prefix>:queue:short)");
    set_error("redis.prefix", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
              "--x: longer than 64 characters");
    set_error("worker.id", "a b", "--x: \"a b\": use letters, digits and . _ @ - only");
    set_error("worker.id", "a:b", "--x: \"a:b\": use letters, digits and . _ @ - only");
    set_error("worker.queues", "short,short",
              "--x: \"short,short\" is not a comma list of short and long (each at most once)");
    set_error("worker.queues", "medium",
              "--x: \"medium\" is not a comma list of short and long (each at most once)");
    set_error("worker.queues", "short,",
              "--x: \"short,\" is not a comma list of short and long (each at most once)");
    set_error("redis.url", "http://x",
              "--x: expected redis://host:port[/db] or unix:///path.sock, got \"http://x\"");
    set_error("redis.url", "redis://h:0", "--x: port \"0\" is not a number in [1, 65535]");
    file_error("redis:\n  url: redis://h:70000/1\n",
               "2: redis.url: port \"70000\" is not a number in [1, 65535]");
    file_error("metrics:\n  listen_address:\n", "2: metrics.listen_address: must not be empty");
    struct cfg c;
    char err[256];
    cfg_defaults(&c);
    assert_int_equal(cfg_set(&c, "worker.queues", "long,short", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "worker.queues", "long", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "worker.id", "gpu-3.host_a@dc", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "redis.prefix", "{llmq}", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "model.path", "", "--x", err, sizeof err), 0); /* may be empty */
    cfg_free(&c);
}

/* redis.sentinels: a YAML list (flow or block) or one string; its entries checked */
static void test_sentinels_list(void **state)
{
    const char *forms[] = {
        "redis:\n  sentinels: [10.0.0.1:26379, \"[::1]:26380\", host3]\n",
        "redis:\n  sentinels:\n    - 10.0.0.1:26379\n    - \"[::1]:26380\"\n    - host3\n",
        "redis:\n  sentinels: \"10.0.0.1:26379, [::1]:26380, host3\"\n",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        struct cfg c;
        char err[512] = "", v[256];
        assert_int_equal(load_text(&c, forms[i], err, sizeof err), 0);
        value_of(&c, "redis.sentinels", v, sizeof v);
        assert_string_equal(v, "10.0.0.1:26379, [::1]:26380, host3");
        cfg_free(&c);
    }
    file_error("redis:\n  sentinels: [a:1, {b: 2}]\n",
               "2: redis.sentinels: expected a list of strings, got a mapping in it");
    file_error("redis:\n  sentinels: [a:99999]\n",
               "2: redis.sentinels: \"a:99999\": the port is not a number in [1, 65535]");
    file_error("redis:\n  sentinels: [\"a,b\"]\n",
               "2: redis.sentinels: expected a list of strings, got \"a,b\" in it");
    file_error("redis:\n  prefix: [a]\n", "2: redis.prefix: expected a string, got a sequence");
    set_error("redis.sentinels", "::1:26379",
              "--x: \"::1:26379\": put an IPv6 address in brackets: [::1]:26379");
    set_error("redis.sentinels", "a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9", "--x: at most 8 sentinels");
}

/* the structure of the file */
static void test_file_errors(void **state)
{
    file_error("engine:\n  block_size: 16\n  blok_size: 8\n",
               "3: unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)");
    file_error("engine:\n  zzzzzzzzzzzz: 8\n", "2: unknown key 'engine.zzzzzzzzzzzz'");
    file_error("engine:\n  max_model_len: 8\n",
               "2: unknown key 'engine.max_model_len' (did you mean 'model.max_model_len'?)");
    file_error("enigne:\n  block_size: 16\n", "1: unknown section 'enigne' (did you mean 'engine'?)");
    file_error("\n\nplugins:\n  a: 1\n", "3: unknown section 'plugins'");
    file_error(
        "block_size: 16\n",
        "1: unknown section 'block_size' (did you mean 'engine.block_size'? keys go inside their section)");
    file_error("engine:\n  block_size: 16\n  threads: 2\n  block_size: 8\n",
               "4: engine.block_size: duplicate key (first on line 2)");
    file_error("engine:\n  threads: 2\nredis:\n  db: 1\nengine:\n  block_size: 8\n",
               "5: duplicate section 'engine' (first on line 1)");
    file_error("engine: 5\n", "1: engine: expected a mapping of keys under the section, got \"5\"");
    file_error("engine:\n  - block_size\n",
               "1: engine: expected a mapping of keys under the section, got a sequence");
    file_error("- engine\n", "1: expected a mapping of sections (redis:, engine:, ...), got a sequence");
    file_error("hello\n", "1: expected a mapping of sections (redis:, engine:, ...), got \"hello\"");
    file_error("? [a]\n: 1\n", "1: expected a section name, got a sequence");
    file_error("engine:\n  ? {a: 1}\n  : 1\n", "2: engine: expected a key name, got a mapping");
    file_error("engine:\n  threads: &n 4\n  device: *n\n", "3: YAML aliases (*n) are not supported");
    file_error("engine:\n  threads: 4\n---\nengine:\n  threads: 5\n",
               "3: more than one YAML document; llmq reads one");
    /* malformed YAML: libyaml's own words, with line and column */
    file_error("engine:\n  block_size: 16\n threads: 8\n",
               "3:2: invalid YAML: did not find expected key (while parsing a block mapping at line 1)");
    file_error_like("engine:\n  backend: \"cuda\n", "3:1: invalid YAML: ", "found unexpected end of stream");
    file_error(
        "engine:\n\tblock_size: 8\n",
        "2:1: invalid YAML: found character that cannot start any token (a tab: YAML indents with spaces)");
    file_error_like("engine: {block_size: 8\n", "2:1: invalid YAML: ", "did not find expected");
    file_error_like("engine:\n  block_size: 8: 9\n", "2:", "mapping values are not allowed");
    /* invalid UTF-8: a reader error, located by line */
    file_error_like("engine:\n  threads: 4\n  device: \xff\n",
                    "3: invalid YAML: ", "invalid leading UTF-8 octet");
    /* templates */
    file_error("templates:\n  \"a b\": x\n",
               "2: templates.a b: use letters, digits and _ - . in template names");
    file_error("templates:\n  t: x\n  t: y\n", "3: templates.t: duplicate key (first on line 2)");
    file_error("templates:\n  t: [x]\n", "2: templates.t: expected a string, got a sequence");
    file_error("templates:\n  t:\n", "2: templates.t: must not be empty");
    file_error("templates: x\n", "1: templates: expected a mapping of keys under the section, got \"x\"");
    /* a file that cannot be read */
    struct cfg c;
    char err[512], want[512];
    cfg_defaults(&c);
    snprintf(want, sizeof want, "%s/missing.yaml: cannot open: No such file or directory", dir);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.yaml", dir);
    assert_int_equal(cfg_load_file(&c, missing, err, sizeof err), -1);
    assert_string_equal(err, want);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    cfg_free(&c);
    assert_int_equal(cfg_load(&c, missing, err, sizeof err), -1); /* cfg_load re-initialises */
    assert_string_equal(err, want);
    cfg_free(&c);
}

static void set_env(const char *k, const char *v)
{
    assert_int_equal(setenv(k, v, 1), 0);
}

/* defaults < file < environment < cfg_set */
static void test_precedence(void **state)
{
    struct cfg c;
    char err[512], o[256], want[256];
    const char *yaml = "engine:\n  block_size: 16\n  threads: 3\nredis:\n  url: redis://file:1/1\n";
    write_file(path, yaml, strlen(yaml));

    if (cfg_load(&c, path, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.engine.block_size, 16); /* file over default */
    assert_int_equal(c.engine.max_num_seqs, 512);
    cfg_free(&c);

    set_env("LLMQ_ENGINE_BLOCK_SIZE", " 64 "); /* blanks around numbers are fine */
    set_env("LLMQ_REDIS_URL", "redis://env:2/2");
    set_env("LLMQ_ENGINE_MAX_NUM_SEQS", "8");
    set_env("LLMQ_QUEUES_SHORT_MAX_NUM_SEQS", "8");
    set_env("LLMQ_QUEUES_LONG_MAX_NUM_SEQS", "8");
    set_env("LLMQ_ENGINE_CUDA_GRAPHS", "off");
    set_env("LLMQ_MODEL_DTYPE", "fp8");
    set_env("LLMQ_MODEL_LM_HEAD_DTYPE", "fp8");
    set_env("LLMQ_ENGINE_DEVICE", "3");
    set_env("LLMQ_ENGINE_NUM_KV_BLOCKS", "77");
    set_env("LLMQ_ENGINE_DECODE_WEIGHT_COPIES", "off");
    set_env("LLMQ_ENGINE_GEMM_TUNING_FILE", "/var/lib/llmq/h200.tuning");
    set_env("LLMQ_QUEUES_MAX_JOB_BYTES", "8MiB");
    set_env("LLMQ_SAMPLING_TOP_P", "0.9");
    set_env("LLMQ_ENGINE_BLOK_SIZE", "48"); /* names no key: ignored */
    if (cfg_load(&c, path, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.engine.block_size, 64); /* env over file */
    assert_int_equal(c.engine.threads, 3);     /* file, env silent */
    assert_string_equal(c.redis.url, "redis://env:2/2");
    assert_int_equal(c.engine.max_num_seqs, 8); /* env over default */
    assert_false(c.engine.cuda_graphs);
    assert_int_equal(c.model.dtype, CFG_DTYPE_FP8);
    assert_int_equal(c.model.lm_head_dtype, CFG_LM_FP8);
    {
        const struct engine_opts eo = engine_cfg_opts(&c); /* what the backend is then opened with */
        assert_int_equal(eo.be.weight_dtype, BE_WEIGHTS_FP8);
        assert_int_equal(eo.be.lm_head_dtype, BE_WEIGHTS_FP8);
        assert_int_equal(eo.be.device, 3); /* engine.device reaches the backend (it used to stop here) */
        assert_int_equal(eo.be.num_kv_blocks, 77); /* and so does engine.num_kv_blocks */
        assert_int_equal(eo.be.decode_weight_copies, BE_COPIES_OFF);
        assert_string_equal(eo.be.gemm_tuning_file, "/var/lib/llmq/h200.tuning"); /* reaches the backend */
        assert_int_equal(eo.be.kv_dtype, DT_BF16);
    }
    /* model.dtype fp16: the CUDA backend's fp16 mode, whose KV cache follows it (kv_cache_dtype auto);
     * an explicit kv_cache_dtype is passed on (the backend refuses it with fp16) */
    if (cfg_set(&c, "model.dtype", "fp16", "--dtype", err, sizeof err))
        fail_msg("%s", err);
    {
        const struct engine_opts eo = engine_cfg_opts(&c);
        assert_int_equal(eo.be.weight_dtype, BE_WEIGHTS_F16);
        assert_int_equal(eo.be.kv_dtype, DT_F16);
    }
    if (cfg_set(&c, "engine.kv_cache_dtype", "fp8", "--kv-cache-dtype", err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(engine_cfg_opts(&c).be.kv_dtype, DT_F8_E4M3);
    if (cfg_set(&c, "engine.kv_cache_dtype", "auto", "--kv-cache-dtype", err, sizeof err) ||
        cfg_set(&c, "model.dtype", "fp8", "--dtype", err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.queues.max_job_bytes, 8 << 20);
    assert_true(c.sampling.top_p == 0.9);
    assert_int_equal(origin_of(&c, "engine.block_size")->source, CFG_SRC_ENV);
    assert_string_equal(origin_of(&c, "engine.block_size")->name, "LLMQ_ENGINE_BLOCK_SIZE");
    cfg_format_origin(&c, cfg_key_find("engine.block_size"), o, sizeof o);
    assert_string_equal(o, "env LLMQ_ENGINE_BLOCK_SIZE");
    cfg_format_origin(&c, cfg_key_find("engine.threads"), o, sizeof o);
    snprintf(want, sizeof want, "%s:3", path);
    assert_string_equal(o, want);

    /* flags over env */
    if (cfg_set(&c, "engine.block_size", "128", "--block-size", err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.engine.block_size, 128);
    cfg_format_origin(&c, cfg_key_find("engine.block_size"), o, sizeof o);
    assert_string_equal(o, "flag --block-size");
    if (cfg_set(&c, "redis.url", "redis://flag:3/3", "--redis", err, sizeof err))
        fail_msg("%s", err);
    assert_string_equal(c.redis.url, "redis://flag:3/3");
    cfg_free(&c);

    /* without a file: env over defaults */
    cfg_defaults(&c);
    assert_int_equal(cfg_load_env(&c, err, sizeof err), 0);
    assert_int_equal(c.engine.block_size, 64);
    cfg_free(&c);

    /* unset again: back to the file */
    static const char *const vars[] = {"LLMQ_ENGINE_BLOCK_SIZE",
                                       "LLMQ_REDIS_URL",
                                       "LLMQ_ENGINE_MAX_NUM_SEQS",
                                       "LLMQ_QUEUES_SHORT_MAX_NUM_SEQS",
                                       "LLMQ_QUEUES_LONG_MAX_NUM_SEQS",
                                       "LLMQ_ENGINE_CUDA_GRAPHS",
                                       "LLMQ_MODEL_DTYPE",
                                       "LLMQ_MODEL_LM_HEAD_DTYPE",
                                       "LLMQ_ENGINE_DEVICE",
                                       "LLMQ_ENGINE_NUM_KV_BLOCKS",
                                       "LLMQ_ENGINE_DECODE_WEIGHT_COPIES",
                                       "LLMQ_ENGINE_GEMM_TUNING_FILE",
                                       "LLMQ_QUEUES_MAX_JOB_BYTES",
                                       "LLMQ_SAMPLING_TOP_P",
                                       "LLMQ_ENGINE_BLOK_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    if (cfg_load(&c, path, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(c.engine.block_size, 16);
    assert_string_equal(c.redis.url, "redis://file:1/1");
    cfg_free(&c);
}

static void env_error(const char *var, const char *value, const char *want)
{
    struct cfg c;
    char err[512];
    set_env(var, value);
    int rc = cfg_load(&c, NULL, err, sizeof err);
    unsetenv(var);
    if (rc == 0)
        fail_msg("%s=%s passed", var, value);
    assert_string_equal(err, want);
    cfg_free(&c);
}

static void test_env_errors(void **state)
{
    env_error("LLMQ_ENGINE_BLOCK_SIZE", "48",
              "LLMQ_ENGINE_BLOCK_SIZE: 48 is not a power of two between 8 and 256");
    env_error("LLMQ_ENGINE_THREADS", "abc", "LLMQ_ENGINE_THREADS: expected an integer, got \"abc\"");
    env_error("LLMQ_ENGINE_THREADS", "", "LLMQ_ENGINE_THREADS: expected an integer, got \"\"");
    env_error("LLMQ_ENGINE_BACKEND", "tpu",
              "LLMQ_ENGINE_BACKEND: expected one of auto|cpu|cuda, got \"tpu\"");
    env_error("LLMQ_METRICS_ENABLED", "sure", "LLMQ_METRICS_ENABLED: expected true or false, got \"sure\"");
    env_error(
        "LLMQ_SQLITE_PATH", "",
        "LLMQ_SQLITE_PATH: sqlite.path () may be \"\" (no local database) only with results_stream.enabled "
        "(false)");
    env_error("LLMQ_WORKER_HEARTBEAT_TTL_S", "90", "LLMQ_WORKER_HEARTBEAT_TTL_S: 90 is out of range [2, 60]");
    env_error("LLMQ_REDIS_URL", "rediss://h",
              "LLMQ_REDIS_URL: rediss:// (TLS) is not supported; use redis:// or unix://");
    /* a cross-key rule broken by the environment names the variable */
    env_error("LLMQ_WORKER_HEARTBEAT_INTERVAL_S", "20",
              "LLMQ_WORKER_HEARTBEAT_INTERVAL_S: worker.heartbeat_interval_s (20) must be at most half of "
              "worker.heartbeat_ttl_s (30)");
    /* an empty string is a value for strings */
    struct cfg c;
    char err[256];
    set_env("LLMQ_MODEL_PATH", "");
    set_env("LLMQ_REDIS_PASSWORD", "s3cret");
    assert_int_equal(cfg_load(&c, NULL, err, sizeof err), 0);
    assert_string_equal(c.model.path, "");
    assert_int_equal(origin_of(&c, "model.path")->source, CFG_SRC_ENV);
    assert_string_equal(c.redis.password, "s3cret");
    unsetenv("LLMQ_MODEL_PATH");
    unsetenv("LLMQ_REDIS_PASSWORD");
    cfg_free(&c);
}

static void test_cfg_set(void **state)
{
    set_error("engine.blok_size", "8",
              "--x: unknown key 'engine.blok_size' (did you mean 'engine.block_size'?)");
    set_error("engine", "8", "--x: unknown key 'engine' (write section.key, e.g. engine.block_size)");
    set_error("nothing.here", "8", "--x: unknown key 'nothing.here'");
    set_error("engine.block_size", "48", "--x: 48 is not a power of two between 8 and 256");
    set_error("templates.a/b", "x", "--x: template name 'a/b': use letters, digits and _ - . only");
    set_error("templates.t", "", "--x: must not be empty");
    struct cfg c;
    char err[256], o[128];
    cfg_defaults(&c);
    /* strings are replaced (the old one freed: run under ASan to see) */
    assert_int_equal(cfg_set(&c, "sqlite.path", "/a.db", "--db", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "sqlite.path", "/b.db", "--db", err, sizeof err), 0);
    assert_string_equal(c.sqlite.path, "/b.db");
    cfg_format_origin(&c, cfg_key_find("sqlite.path"), o, sizeof o);
    assert_string_equal(o, "flag --db");
    /* NULL origin reads "flag" */
    assert_int_equal(cfg_set(&c, "engine.threads", "x", NULL, err, sizeof err), -1);
    assert_string_equal(err, "flag: expected an integer, got \"x\"");
    /* a failed set leaves the value alone */
    assert_int_equal(cfg_set(&c, "engine.block_size", "48", "--x", err, sizeof err), -1);
    assert_int_equal(c.engine.block_size, 32);
    /* templates: add, replace, find */
    assert_int_equal(cfg_set(&c, "templates.sum", "Sum: {doc}", "--t", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "templates.q-a.v2", "Q: {q}", "--t", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "templates.sum", "Summary of {doc}", "--t", err, sizeof err), 0);
    assert_int_equal(c.n_templates, 2);
    assert_string_equal(cfg_template_find(&c, "sum"), "Summary of {doc}");
    assert_string_equal(cfg_template_find(&c, "q-a.v2"), "Q: {q}");
    assert_int_equal(c.templates[0].origin.source, CFG_SRC_FLAG);
    /* a long origin is cut, not overflowed */
    char longo[200];
    memset(longo, 'o', sizeof longo - 1);
    longo[sizeof longo - 1] = 0;
    assert_int_equal(cfg_set(&c, "engine.threads", "2", longo, err, sizeof err), 0);
    assert_int_equal(strlen(origin_of(&c, "engine.threads")->name), sizeof c.origin[0].name - 1);
    cfg_free(&c);
}

static void rule_error(const char *const *sets, const char *want)
{
    struct cfg c;
    char err[512];
    cfg_defaults(&c);
    for (int i = 0; sets[i]; i += 2)
        if (cfg_set(&c, sets[i], sets[i + 1], "--x", err, sizeof err))
            fail_msg("%s", err);
    if (cfg_validate(&c, err, sizeof err) == 0)
        fail_msg("no error for %s", want);
    assert_string_equal(err, want);
    cfg_free(&c);
}

static void rule_ok(const char *const *sets)
{
    struct cfg c;
    char err[512];
    cfg_defaults(&c);
    for (int i = 0; sets[i]; i += 2)
        if (cfg_set(&c, sets[i], sets[i + 1], "--x", err, sizeof err))
            fail_msg("%s", err);
    if (cfg_validate(&c, err, sizeof err))
        fail_msg("%s", err);
    cfg_free(&c);
}

static void test_cross_rules(void **state)
{
#define SETS(...) ((const char *const[]){__VA_ARGS__, NULL})
    rule_error(SETS("worker.heartbeat_interval_s", "16"),
               "--x: worker.heartbeat_interval_s (16) must be at most half of worker.heartbeat_ttl_s (30)");
    rule_ok(SETS("worker.heartbeat_interval_s", "15"));
    rule_error(SETS("redis.block_timeout_ms", "5001"),
               "--x: redis.block_timeout_ms (5001) must not exceed (in ms) worker.heartbeat_interval_s (5)");
    rule_ok(SETS("redis.block_timeout_ms", "5000"));
    rule_error(
        SETS("queues.retry_backoff_base_ms", "60001"),
        "--x: queues.retry_backoff_base_ms (60001) must not exceed queues.retry_backoff_max_ms (60000)");
    rule_error(SETS("engine.max_num_seqs", "100"),
               "--x: queues.short_max_num_seqs (512) must not exceed engine.max_num_seqs (100)");
    rule_error(SETS("queues.long_max_num_seqs", "600"),
               "--x: queues.long_max_num_seqs (600) must not exceed engine.max_num_seqs (512)");
    rule_error(SETS("queues.short_max_num_batched_tokens", "16385"),
               "--x: queues.short_max_num_batched_tokens (16385) must not exceed "
               "engine.max_num_batched_tokens (16384)");
    rule_error(SETS("queues.long_max_num_batched_tokens", "20000"),
               "--x: queues.long_max_num_batched_tokens (20000) must not exceed "
               "engine.max_num_batched_tokens (16384)");
    rule_error(
        SETS("queues.short_max_model_len", "4096"),
        "--x: queues.long_threshold_tokens (4096) must be less than queues.short_max_model_len (4096)");
    rule_ok(SETS("queues.short_max_model_len", "4097"));
    rule_error(SETS("model.max_model_len", "8192", "queues.short_max_model_len", "9000"),
               "--x: queues.short_max_model_len (9000) must not exceed model.max_model_len (8192)");
    rule_error(SETS("model.max_model_len", "8192", "queues.long_max_model_len", "9000"),
               "--x: queues.long_max_model_len (9000) must not exceed model.max_model_len (8192)");
    rule_ok(SETS("model.max_model_len", "8192", "queues.long_max_model_len", "8192",
                 "queues.short_max_model_len", "8192"));
    /* the message starts where the later of the two values came from */
    struct cfg c;
    char err[512];
    const char *yaml = "worker:\n  heartbeat_ttl_s: 8\n";
    write_file(path, yaml, strlen(yaml));
    assert_int_equal(cfg_load(&c, path, err, sizeof err), -1);
    char want[512];
    snprintf(want, sizeof want,
             "%s:2: worker.heartbeat_interval_s (5) must be at most half of "
             "worker.heartbeat_ttl_s (8)",
             path);
    assert_string_equal(err, want);
    cfg_free(&c);
#undef SETS
}

/* ---- Redis URLs */

static void test_redis_url(void **state)
{
    static const struct {
        const char *url, *host, *unix_path, *user, *password;
        int port, db;
    } ok[] = {
        {"redis://127.0.0.1:6379/0", "127.0.0.1", "", "", "", 6379, 0},
        {"redis://localhost", "localhost", "", "", "", 6379, 0},
        {"redis://localhost/", "localhost", "", "", "", 6379, 0},
        {"REDIS://h:1/15", "h", "", "", "", 1, 15},
        {"redis://:secret@h:6380/2", "h", "", "", "secret", 6380, 2},
        {"redis://alice:s%40c%3Aret%2F@h", "h", "", "alice", "s@c:ret/", 6379, 0},
        {"redis://alice@h", "h", "", "alice", "", 6379, 0},
        {"redis://u:p@ss@h:7", "h", "", "u", "p@ss", 7, 0},
        {"redis://[::1]:6390/3", "::1", "", "", "", 6390, 3},
        {"redis://[fe80::1]", "fe80::1", "", "", "", 6379, 0},
        {"redis://h:65535?db=4", "h", "", "", "", 65535, 4},
        {"unix:///run/redis/redis.sock", "", "/run/redis/redis.sock", "", "", 6379, 0},
        {"unix:///tmp/r.sock?db=9", "", "/tmp/r.sock", "", "", 6379, 9},
        {"unix://u:pw@/tmp/r.sock", "", "/tmp/r.sock", "u", "pw", 6379, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct rq_addr a;
        char err[256];
        if (rq_url_parse(ok[i].url, &a, err, sizeof err))
            fail_msg("%s: %s", ok[i].url, err);
        assert_string_equal(a.host, ok[i].host);
        assert_string_equal(a.unix_path, ok[i].unix_path);
        assert_string_equal(a.user, ok[i].user);
        assert_string_equal(a.password, ok[i].password);
        assert_int_equal(a.port, ok[i].port);
        assert_int_equal(a.db, ok[i].db);
    }
    static const struct {
        const char *url, *err;
    } bad[] = {
        {"rediss://h", "rediss:// (TLS) is not supported; use redis:// or unix://"},
        {"http://h", "expected redis://host:port[/db] or unix:///path.sock, got \"http://h\""},
        {"127.0.0.1:6379", "expected redis://host:port[/db] or unix:///path.sock, got \"127.0.0.1:6379\""},
        {"redis://", "missing host: redis://host:port"},
        {"redis://:6379", "missing host: redis://host:port"},
        {"redis://u:p@/0", "missing host: redis://host:port"},
        {"redis://h:", "port \"\" is not a number in [1, 65535]"},
        {"redis://h:abc", "port \"abc\" is not a number in [1, 65535]"},
        {"redis://h:0", "port \"0\" is not a number in [1, 65535]"},
        {"redis://h:65536", "port \"65536\" is not a number in [1, 65535]"},
        {"redis://h:-1", "port \"-1\" is not a number in [1, 65535]"},
        {"redis://h/x", "database must be a number in [0, 65535], got \"x\""},
        {"redis://h/-1", "database must be a number in [0, 65535], got \"-1\""},
        {"redis://h/65536", "database must be a number in [0, 65535], got \"65536\""},
        {"redis://h?db=", "unknown URL parameter \"db=\" (only db=N)"},
        {"redis://h?timeout=5", "unknown URL parameter \"timeout=5\" (only db=N)"},
        {"redis://h?db=z", "database must be a number in [0, 65535], got \"z\""},
        {"redis://[::1", "unclosed '[' in the host"},
        {"redis://[::1]x", "expected ':port' after ']'"},
        {"redis://u:%zz@h", "bad password in the URL (a % escape or too long)"},
        {"redis://%4@h", "bad user name in the URL (a % escape or too long)"},
        {"unix://", "missing socket path: unix:///path/to/redis.sock"},
        {"unix:///", "missing socket path: unix:///path/to/redis.sock"},
        {"unix://host/tmp/r.sock", "a unix:// URL takes no host: unix:///path/to/redis.sock"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rq_addr a;
        char err[256] = "";
        if (rq_url_parse(bad[i].url, &a, err, sizeof err) == 0)
            fail_msg("%s parsed", bad[i].url);
        if (strcmp(err, bad[i].err))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].url, err, bad[i].err);
    }
    /* too long parts are refused, not cut */
    char url[1200];
    snprintf(url, sizeof url, "redis://%0300d:p@h", 0);
    struct rq_addr a;
    char err[256];
    assert_int_equal(rq_url_parse(url, &a, err, sizeof err), -1);
    snprintf(url, sizeof url, "unix:///%0600d", 0);
    assert_int_equal(rq_url_parse(url, &a, err, sizeof err), -1);
    assert_string_equal(err, "socket path too long");
    snprintf(url, sizeof url, "redis://%0300d", 0);
    assert_int_equal(rq_url_parse(url, &a, err, sizeof err), -1);
    assert_string_equal(err, "host name too long");

    /* the endpoint: the URL, then username/password/db where set */
    struct cfg c;
    cfg_defaults(&c);
    assert_int_equal(cfg_redis_endpoint(&c, &a, err, sizeof err), 0);
    assert_string_equal(a.host, "127.0.0.1");
    assert_int_equal(a.port, 6379);
    assert_int_equal(a.db, 0);
    assert_int_equal(cfg_set(&c, "redis.url", "redis://u:p@h:7/5", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_redis_endpoint(&c, &a, err, sizeof err), 0);
    assert_string_equal(a.user, "u");
    assert_string_equal(a.password, "p");
    assert_int_equal(a.db, 5);
    assert_int_equal(cfg_set(&c, "redis.username", "acl", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "redis.password", "pw2", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_set(&c, "redis.db", "0", "--x", err, sizeof err), 0);
    assert_int_equal(cfg_redis_endpoint(&c, &a, err, sizeof err), 0);
    assert_string_equal(a.user, "acl");
    assert_string_equal(a.password, "pw2");
    assert_int_equal(a.db, 0);
    assert_string_equal(a.host, "h");
    assert_int_equal(a.port, 7);
    cfg_free(&c);
}

/* ---- the writer */

/* A valid value for k that differs from its default, as text. */
static void other_value(const struct cfg_key *k, char *buf, size_t len)
{
    char dotted[128];
    snprintf(dotted, sizeof dotted, "%s.%s", k->section, k->name);
    switch (k->type) {
    case CFG_T_INT: {
        double def = atof(k->def);
        snprintf(buf, len, "%.0f", def != k->max ? k->max : k->min);
        break;
    }
    case CFG_T_DOUBLE:
        snprintf(buf, len, "%.17g", k->min + (k->max - k->min) * 0.31415926535897931);
        break;
    case CFG_T_BOOL:
        snprintf(buf, len, "%s", !strcmp(k->def, "true") ? "false" : "true");
        break;
    case CFG_T_ENUM: {
        int last = 0;
        while (k->choices[last + 1])
            last++;
        snprintf(buf, len, "%s", strcasecmp(k->def, k->choices[last]) ? k->choices[last] : k->choices[0]);
        break;
    }
    case CFG_T_SIZE:
        snprintf(buf, len, "%.0f", k->min + 1);
        break; /* not a whole KiB: written in bytes */
    default:
        if (!strcmp(dotted, "redis.url"))
            snprintf(buf, len, "unix://u:p%%40w@/tmp/r.sock?db=3");
        else if (!strcmp(dotted, "redis.prefix"))
            snprintf(buf, len, "{llmq}");
        else if (!strcmp(dotted, "worker.id"))
            snprintf(buf, len, "gpu-7.box@a");
        else if (!strcmp(dotted, "worker.queues"))
            snprintf(buf, len, "long");
        else if (!strcmp(dotted, "model.aliases"))
            snprintf(buf, len, "qwen3-8b,Qwen/Qwen3-8B");
        else if (!strcmp(dotted, "redis.sentinels"))
            snprintf(buf, len, "10.0.0.1:26379, [::1]:26380");
        else
            snprintf(buf, len, "%s: say \"hi\" \\ # é\n\ttab\x01 ''", k->name);
    }
}

static void test_round_trip(void **state)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    struct cfg a, b, d;
    char err[512], out[160];
    snprintf(out, sizeof out, "%s/out.yaml", dir);
    cfg_defaults(&a);
    cfg_defaults(&d);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].type == CFG_T_MAP)
            continue;
        char dotted[128], v[256], x[512], y[512];
        snprintf(dotted, sizeof dotted, "%s.%s", keys[i].section, keys[i].name);
        other_value(&keys[i], v, sizeof v);
        if (cfg_set(&a, dotted, v, "--x", err, sizeof err))
            fail_msg("%s", err);
        cfg_format_value(&a, &keys[i], x, sizeof x);
        cfg_format_value(&d, &keys[i], y, sizeof y);
        if (!strcmp(x, y))
            fail_msg("%s: %s is its default", dotted, x);
    }
    assert_int_equal(
        cfg_set(&a, "templates.sum", "Summarize:\n\n{document}\n\"quoted\" \\ end", "--x", err, sizeof err),
        0);
    assert_int_equal(cfg_set(&a, "templates.t2", "plain", "--x", err, sizeof err), 0);
    for (unsigned flags = 0; flags <= CFG_YAML_ORIGIN; flags += CFG_YAML_ORIGIN) {
        FILE *f = fopen(out, "w");
        assert_non_null(f);
        cfg_write_yaml(&a, f, flags);
        fclose(f);
        cfg_defaults(&b);
        if (cfg_load_file(&b, out, err, sizeof err))
            fail_msg("reading back (flags %u): %s", flags, err);
        for (size_t i = 0; i < n; i++) {
            const struct cfg_key *k = &keys[i];
            const char *pa = (const char *)&a + k->offset, *pb = (const char *)&b + k->offset;
            switch (k->type) {
            case CFG_T_STRING:
                assert_string_equal(*(char *const *)pa, *(char *const *)pb);
                break;
            case CFG_T_INT:
            case CFG_T_ENUM:
                assert_int_equal(*(const int *)pa, *(const int *)pb);
                break;
            case CFG_T_DOUBLE:
                if (*(const double *)pa != *(const double *)pb)
                    fail_msg("%s: %.17g != %.17g", k->name, *(const double *)pa, *(const double *)pb);
                break;
            case CFG_T_BOOL:
                assert_int_equal(*(const bool *)pa, *(const bool *)pb);
                break;
            case CFG_T_SIZE:
                assert_int_equal(*(const int64_t *)pa, *(const int64_t *)pb);
                break;
            case CFG_T_MAP:
                break;
            }
            if (k->type != CFG_T_MAP)
                assert_int_equal(b.origin[i].source, CFG_SRC_FILE);
        }
        assert_int_equal(b.n_templates, 2);
        assert_string_equal(cfg_template_find(&b, "sum"), cfg_template_find(&a, "sum"));
        assert_string_equal(cfg_template_find(&b, "t2"), "plain");
        cfg_free(&b);
    }
    /* redaction hides secrets and the URL's password, and nothing else */
    char *text = NULL;
    size_t tlen = 0;
    FILE *m = open_memstream(&text, &tlen);
    cfg_write_yaml(&a, m, CFG_YAML_REDACT | CFG_YAML_ORIGIN);
    fclose(m);
    assert_non_null(strstr(text, "  password: \"****\""));
    assert_non_null(strstr(text, "  url: \"unix://u:****@/tmp/r.sock?db=3\""));
    assert_null(strstr(text, "p%40w"));
    assert_non_null(strstr(text, "# flag --x"));
    assert_non_null(strstr(text, "  username: \"username: say"));
    free(text);
    /* a raw '@' inside the password: the parser ends the credentials at the last '@' before the
     * path, so must the redaction */
    char red[256];
    rq_url_redact("redis://u:p@ss@host:6379/0", red, sizeof red);
    assert_string_equal(red, "redis://u:****@host:6379/0");
    rq_url_redact("redis://host:6379/0", red, sizeof red);
    assert_string_equal(red, "redis://host:6379/0");
    cfg_free(&a);
    /* defaults written with their origins, and an empty templates section, read back too */
    cfg_defaults(&a);
    FILE *f = fopen(out, "w");
    cfg_write_yaml(&a, f, CFG_YAML_ORIGIN);
    fclose(f);
    if (cfg_load(&b, out, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(b.engine.block_size, 32);
    assert_int_equal(b.n_templates, 0);
    cfg_free(&a);
    cfg_free(&b);
    cfg_free(&d);
}

/* every key can be set from the environment, under its documented name */
static void test_every_env(void **state)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    for (size_t i = 0; i < n; i++) {
        if (keys[i].type == CFG_T_MAP)
            continue;
        char env[96], v[256], want[512], got[512], err[512];
        cfg_key_env_name(&keys[i], env, sizeof env);
        other_value(&keys[i], v, sizeof v);
        struct cfg c, ref;
        cfg_defaults(&ref);
        char dotted[128];
        snprintf(dotted, sizeof dotted, "%s.%s", keys[i].section, keys[i].name);
        assert_int_equal(cfg_set(&ref, dotted, v, "--x", err, sizeof err), 0);
        set_env(env, v);
        cfg_defaults(&c);
        int rc = cfg_load_env(&c, err, sizeof err);
        unsetenv(env);
        if (rc)
            fail_msg("%s: %s", env, err);
        cfg_format_value(&c, &keys[i], got, sizeof got);
        cfg_format_value(&ref, &keys[i], want, sizeof want);
        assert_string_equal(got, want);
        assert_int_equal(c.origin[i].source, CFG_SRC_ENV);
        cfg_free(&c);
        cfg_free(&ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),       cmocka_unit_test(test_table),
        cmocka_unit_test(test_key_api),        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_types),          cmocka_unit_test(test_empty),
        cmocka_unit_test(test_type_errors),    cmocka_unit_test(test_every_bound),
        cmocka_unit_test(test_string_rules),   cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_sentinels_list), cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_env_errors),     cmocka_unit_test(test_cfg_set),
        cmocka_unit_test(test_cross_rules),    cmocka_unit_test(test_redis_url),
        cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_every_env),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
