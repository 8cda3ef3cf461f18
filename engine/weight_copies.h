/* Whether the CUDA backend keeps second copies of its weights in the order the decode GEMVs read them
 * (engine.decode_weight_copies, kernels/cuda_weights.cu cb_tile_copies; docs/CUDA_BACKEND.md).
 *
 * The copies make decode of a few sequences faster (the GEMVs read 512 contiguous bytes a load) and
 * cost their bytes of KV cache: ~15 GB for Qwen3-14B
 * in fp8, ~28 GB in bf16. They help only steps of a few sequences, and those need little cache; the
 * steps that need a large cache are large batches, which the copies do not speed up. So "auto" makes
 * them only where the memory would otherwise sit idle: where the cache that is left still holds every
 * sequence the engine may run at its longest (max_num_seqs x max_model_len tokens), or, with
 * engine.num_kv_blocks, where those blocks still fit. "on" makes them whatever the cache loses; "off"
 * never.
 *
 * Plain C, also compiled as CUDA C++; unit-tested on its own (tests/unit/test_weight_copies.c). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/backend.h"

struct weight_copies_in {
    enum be_copies mode;
    double copy_bytes;   /* what the copies take (0: nothing to copy) */
    double kv_budget;    /* bytes the KV cache could take without the copies */
    double kv_cap;       /* the cache takes at most this (kv_cache_bytes, num_kv_blocks); 0 = no cap */
    double block_bytes;  /* one KV block over all layers */
    int block_size;      /* tokens per block */
    int64_t need_tokens; /* what the cache must still hold: max_num_seqs x max_model_len, or the
                          * num_kv_blocks asked for */
};

/* 1: make the copies, 0: not. why (may be NULL) gets the reason in words, for the open log. */
static inline int weight_copies_decide(const struct weight_copies_in *in, char *why, size_t n)
{
    char scratch[256];
    if (!why)
        why = scratch, n = sizeof scratch;
    if (in->copy_bytes <= 0) {
        snprintf(why, n, "no matrix of a shape the copies take");
        return 0;
    }
    if (in->mode == BE_COPIES_OFF) {
        snprintf(why, n, "engine.decode_weight_copies off");
        return 0;
    }
    if (in->mode == BE_COPIES_ON) {
        snprintf(why, n, "engine.decode_weight_copies on");
        return 1;
    }
    double kv = in->kv_budget - in->copy_bytes;
    if (in->kv_cap > 0 && in->kv_cap < kv)
        kv = in->kv_cap;
    const double blocks = kv > 0 && in->block_bytes > 0 ? (double)(int64_t)(kv / in->block_bytes) : 0;
    const double tokens = blocks * in->block_size;
    if (tokens < (double)in->need_tokens) {
        snprintf(why, n,
                 "auto: the KV cache would hold %.0f tokens beside them, less than the %lld it must "
                 "(max_num_seqs x max_model_len, or num_kv_blocks)",
                 tokens, (long long)in->need_tokens);
        return 0;
    }
    snprintf(why, n, "auto: the KV cache still holds %.0f tokens beside them, at least the %lld it must",
             tokens, (long long)in->need_tokens);
    return 1;
}
