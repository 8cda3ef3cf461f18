/* See engine_flags.h. */
#include "worker/cli/engine_flags.h"

#include <getopt.h>
#include <string.h>

#include "worker/config/config.h"
#include "worker/config/engine_cfg.h"

/* One flag: the configuration key it sets. */
struct engine_flag {
    const char *name;  /* the long flag, "--" included */
    char letter;       /* the short flag, or 0 */
    const char *arg;   /* its value in --help; NULL: it takes none and sets `fixed` */
    const char *key;   /* the configuration key */
    const char *fixed; /* the value a flag without one sets */
    unsigned group;    /* ENGINE_FLAGS_* */
    const char *help;  /* "%s" prints the key's default */
};

/* In the order --help lists them. */
static const struct engine_flag table[] = {
    {"--model", 'm', "DIR", "model.path", NULL, ENGINE_FLAGS_ENGINE,
     "a Hugging Face model folder (model.path)"},
    {"--tokenizer", 0, "DIR", "model.tokenizer", NULL, ENGINE_FLAGS_ENGINE,
     "the tokenizer folder (model.tokenizer; default: the model's)"},
    {"--backend", 0, "B", "engine.backend", NULL, ENGINE_FLAGS_ENGINE,
     "auto | cpu | cuda, engine.backend (default %s)"},
    {"--threads", 0, "N", "engine.threads", NULL, ENGINE_FLAGS_ENGINE,
     "CPU backend threads; 0 = all cores (engine.threads)"},
    {"--device", 0, "N", "engine.device", NULL, ENGINE_FLAGS_ENGINE,
     "CUDA device index, engine.device (default %s)"},
    {"--max-num-seqs", 0, "N", "engine.max_num_seqs", NULL, ENGINE_FLAGS_ENGINE,
     "sequences per engine step, engine.max_num_seqs (default %s)"},
    {"--max-num-batched-tokens", 0, "N", "engine.max_num_batched_tokens", NULL, ENGINE_FLAGS_ENGINE,
     "tokens per step, engine.max_num_batched_tokens (default %s)"},
    {"--max-model-len", 0, "N", "model.max_model_len", NULL, ENGINE_FLAGS_ENGINE,
     "longest prompt + output; 0 = the model's; above its\n"
     "max_position_embeddings it enables YaRN (model.max_model_len)"},
    {"--block-size", 0, "N", "engine.block_size", NULL, ENGINE_FLAGS_ENGINE,
     "KV cache block size in tokens, engine.block_size (default %s)"},
    {"--gpu-memory-utilization", 0, "X", "engine.gpu_memory_utilization", NULL, ENGINE_FLAGS_ENGINE,
     "engine.gpu_memory_utilization (default %s): the share of GPU\nmemory for weights, activations and KV "
     "cache"},
    {"--no-cuda-graphs", 0, NULL, "engine.cuda_graphs", "false", ENGINE_FLAGS_ENGINE,
     "run decode steps eagerly (engine.cuda_graphs: false)"},
    {"--cuda-graph-max-batch", 0, "N", "engine.cuda_graph_max_batch", NULL, ENGINE_FLAGS_ENGINE,
     "engine.cuda_graph_max_batch (default %s): the largest decode\nbatch run as a CUDA graph"},
    {"--dtype", 0, "D", "model.dtype", NULL, ENGINE_FLAGS_ENGINE,
     "weights: auto (the checkpoint's) | bf16 | fp8 (linear weights\n"
     "quantized at load in 128x128 blocks) | fp16 (weights,\n"
     "activations and KV cache in fp16; CUDA; model.dtype)"},
    {"--lm-head-dtype", 0, "D", "model.lm_head_dtype", NULL, ENGINE_FLAGS_ENGINE,
     "auto (the checkpoint's) | bf16 | fp8 (quantized at load;\nmodel.lm_head_dtype)"},
    {"--kv-cache-dtype", 0, "D", "engine.kv_cache_dtype", NULL, ENGINE_FLAGS_ENGINE,
     "auto | bf16 | fp8 (e4m3 with a scale per token and KV head; CUDA;\nengine.kv_cache_dtype)"},
    {"--decode-weight-copies", 0, "C", "engine.decode_weight_copies", NULL, ENGINE_FLAGS_ENGINE,
     "auto | on | off: a second copy of the weights in the decode\n"
     "GEMVs' read order (CUDA; engine.decode_weight_copies; auto =\n"
     "on where the KV cache still holds every sequence)"},
    {"--gemm-tuning-file", 0, "PATH", "engine.gemm_tuning_file", NULL, ENGINE_FLAGS_ENGINE,
     "keep the GEMM algorithms chosen by timing in PATH: read at\n"
     "start, written at exit (CUDA; engine.gemm_tuning_file)"},
    {"--no-prefix-caching", 0, NULL, "engine.enable_prefix_caching", "false", ENGINE_FLAGS_ENGINE,
     "turn the prefix cache off (engine.enable_prefix_caching: false)"},
    {"--admission-reserve", 0, "X", "engine.admission_reserve", NULL, ENGINE_FLAGS_ENGINE,
     "share of max_tokens admission keeps KV blocks for, 0..1\n"
     "(engine.admission_reserve; 0 = admit, preempt later) (default %s)"},
    {"--short-max-num-seqs", 0, "N", "queues.short_max_num_seqs", NULL, ENGINE_FLAGS_LANES,
     "queues.short_max_num_seqs (default %s)"},
    {"--short-max-num-batched-tokens", 0, "N", "queues.short_max_num_batched_tokens", NULL,
     ENGINE_FLAGS_LANES, "queues.short_max_num_batched_tokens (default %s)"},
    {"--long-max-num-seqs", 0, "N", "queues.long_max_num_seqs", NULL, ENGINE_FLAGS_LANES,
     "queues.long_max_num_seqs (default %s)"},
    {"--long-max-num-batched-tokens", 0, "N", "queues.long_max_num_batched_tokens", NULL, ENGINE_FLAGS_LANES,
     "queues.long_max_num_batched_tokens (default %s)"},
};
#define N_FLAGS ((int)(sizeof table / sizeof table[0]))

static int value_of(int i)
{
    return table[i].letter ? table[i].letter : ENGINE_FLAGS_O_FIRST + i;
}

void engine_flags_longopts(struct option *out, const struct option *own, unsigned groups)
{
    _Static_assert(N_FLAGS <= ENGINE_FLAGS_MAX, "ENGINE_FLAGS_MAX is too small");
    int n = 0;
    for (; own && own[n].name; n++)
        out[n] = own[n];
    for (int i = 0; i < N_FLAGS; i++)
        if (table[i].group & groups)
            out[n++] = (struct option){table[i].name + 2, table[i].arg ? required_argument : no_argument,
                                       NULL, value_of(i)};
    out[n] = (struct option){NULL, 0, NULL, 0};
}

int engine_flags_opt(struct engine_cfg_flags *f, int opt, const char *value, bool *lanes)
{
    for (int i = 0; i < N_FLAGS; i++)
        if (value_of(i) == opt) {
            if (lanes)
                *lanes = table[i].group == ENGINE_FLAGS_LANES;
            return engine_cfg_flag_add(f, table[i].key, table[i].arg ? value : table[i].fixed, table[i].name)
                       ? -1
                       : 1;
        }
    return 0;
}

#define HELP_COLUMN 34

void engine_flags_usage_line(FILE *f, char letter, const char *name, const char *arg, const char *help)
{
    char flag[80];
    snprintf(flag, sizeof flag, "%s%c%s%s%s%s", letter ? "-" : " ", letter ? letter : ' ',
             letter ? ", " : "  ", name, arg ? " " : "", arg ? arg : "");
    fprintf(f, "  %-*s", HELP_COLUMN - 2, flag);
    if (strlen(flag) >= HELP_COLUMN - 2)
        fputs("  ", f);
    for (const char *line = help, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        nl = strchr(line, '\n');
        int len = nl ? (int)(nl - line) : (int)strlen(line);
        fprintf(f, "%*s%.*s\n", line == help ? 0 : HELP_COLUMN, "", len, line);
    }
}

void engine_flags_usage(FILE *f, unsigned groups)
{
    struct cfg c;
    cfg_defaults(&c);
    for (int i = 0; i < N_FLAGS; i++) {
        if (!(table[i].group & groups))
            continue;
        char dflt[64] = "", help[512];
        cfg_format_value(&c, cfg_key_find(table[i].key), dflt, sizeof dflt);
        snprintf(help, sizeof help, table[i].help, dflt); /* the table's own format: "%s" is the default */
        engine_flags_usage_line(f, table[i].letter, table[i].name, table[i].arg, help);
    }
    cfg_free(&c);
}
