/* See engine_cfg.h. */
#include "worker/config/engine_cfg.h"

#include <stdio.h>
#include <string.h>

#include "worker/config/config.h"

struct engine_opts engine_cfg_opts(const struct cfg *c)
{
    struct engine_opts o = engine_opts_default();
    o.be.block_size = c->engine.block_size;
    o.be.max_num_seqs = c->engine.max_num_seqs;
    o.be.max_num_batched_tokens = c->engine.max_num_batched_tokens;
    o.be.max_model_len = c->model.max_model_len;
    o.be.threads = c->engine.threads;
    o.be.device = c->engine.device;
    o.be.gpu_memory_utilization = c->engine.gpu_memory_utilization;
    o.be.cpu_kv_cache_bytes = c->engine.cpu_kv_cache_bytes; /* the CPU backend's only (not a CUDA cap) */
    o.be.num_kv_blocks = c->engine.num_kv_blocks;
    if (c->engine.kv_cache_dtype == CFG_KV_FP8)
        o.be.kv_dtype = DT_F8_E4M3;
    o.be.decode_weight_copies = c->engine.decode_weight_copies == CFG_COPIES_ON    ? BE_COPIES_ON
                                : c->engine.decode_weight_copies == CFG_COPIES_OFF ? BE_COPIES_OFF
                                                                                   : BE_COPIES_AUTO;
    o.be.gemm_tuning_file = c->engine.gemm_tuning_file; /* borrowed: c outlives the engine's open */
    o.be.cuda_graphs = c->engine.cuda_graphs;
    o.be.cuda_graph_max_batch = c->engine.cuda_graph_max_batch;
    /* model.dtype: fp8 quantizes linear weights at load; bf16 keeps (or dequantizes) 16-bit weights;
     * fp16 is the CUDA backend's fp16 mode (weights, activations and the 16-bit KV cache in fp16;
     * docs/CUDA_BACKEND.md); auto and fp32 keep the checkpoint's (the CUDA backend computes fp16/fp32
     * checkpoints in bf16 unless model.dtype says fp16) */
    o.be.weight_dtype = c->model.dtype == CFG_DTYPE_FP8    ? BE_WEIGHTS_FP8
                        : c->model.dtype == CFG_DTYPE_BF16 ? BE_WEIGHTS_BF16
                        : c->model.dtype == CFG_DTYPE_FP16 ? BE_WEIGHTS_F16
                                                           : BE_WEIGHTS_AUTO;
    /* the 16-bit cache follows the activations; an explicit bf16 or fp8 cache is refused at open */
    if (c->model.dtype == CFG_DTYPE_FP16 && c->engine.kv_cache_dtype == CFG_KV_AUTO)
        o.be.kv_dtype = DT_F16;
    o.be.lm_head_dtype = c->model.lm_head_dtype == CFG_LM_FP8    ? BE_WEIGHTS_FP8
                         : c->model.lm_head_dtype == CFG_LM_BF16 ? BE_WEIGHTS_BF16
                                                                 : BE_WEIGHTS_AUTO;
    o.enable_prefix_caching = c->engine.enable_prefix_caching;
    o.admission_reserve = c->engine.admission_reserve;
    o.priority_aging_s = c->engine.priority_aging_s;
    o.seed = (uint64_t)c->engine.seed;
    return o;
}

const char *engine_cfg_backend(const struct cfg *c)
{
    const char *backend = cfg_choice("engine.backend", c->engine.backend);
    return backend ? backend : "auto";
}

void engine_cfg_lanes(struct engine_opts *o, const struct cfg *c)
{
    const struct cfg_queues *q = &c->queues;
    o->num_lanes = 2;
    o->lanes[ENGINE_CFG_LANE_SHORT] = (struct engine_lane){
        .max_num_seqs = q->short_max_num_seqs,
        .max_num_batched_tokens = q->short_max_num_batched_tokens,
        .max_model_len = q->short_max_model_len,
    };
    o->lanes[ENGINE_CFG_LANE_LONG] = (struct engine_lane){
        .max_num_seqs = q->long_max_num_seqs,
        .max_num_batched_tokens = q->long_max_num_batched_tokens,
        .max_model_len = q->long_max_model_len,
    };
}

int engine_cfg_flag_add(struct engine_cfg_flags *f, const char *key, const char *value, const char *flag)
{
    if (f->n == (int)(sizeof f->v / sizeof f->v[0]))
        return -1;
    f->v[f->n].key = key;
    f->v[f->n].value = value;
    f->v[f->n].flag = flag;
    f->n++;
    return 0;
}

int engine_cfg_load(const char *cmd, const char *config, const struct engine_cfg_flags *f, struct cfg *c)
{
    char err[1024];
    cfg_defaults(c);
    if ((config && cfg_load_file(c, config, err, sizeof err)) || cfg_load_env(c, err, sizeof err)) {
        fprintf(stderr, "llmq %s: %s\n", cmd, err);
        return 1;
    }
    for (int i = 0; i < f->n; i++)
        if (cfg_set(c, f->v[i].key, f->v[i].value, f->v[i].flag, err, sizeof err)) {
            fprintf(stderr, "llmq %s: %s\n", cmd, err);
            return 2;
        }
    return 0;
}

void engine_cfg_model_name(const struct cfg *c, char *out, size_t len)
{
    if (c->model.name[0]) {
        snprintf(out, len, "%s", c->model.name);
        return;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", c->model.path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = 0;
    const char *slash = strrchr(tmp, '/');
    snprintf(out, len, "%s", slash && slash[1] ? slash + 1 : tmp);
}
