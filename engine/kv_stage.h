/* Whether a prefill over an fp8 KV cache reads bf16 copies of its blocks (the CUDA backend's default:
 * k_kv_stage_fp8 then the bf16 prefill attention, docs/CUDA_BACKEND.md "FP8 KV cache") rather than the
 * codes with their scales applied per key. LLMQ_KV_STAGE in the environment, read once per process:
 * unset or 1 on (the backend sizes the pool), 0 off (A/B runs), N >= 2 on with a pool of N blocks
 * (tests: steps whose blocks exceed it stage in rounds, and a step with a sequence longer than it
 * takes the fp8 kernel). The CPU backend's bf16 emulation follows the same switch, so the oracle
 * rounds what the kernels round. */
#pragma once
#include <stdbool.h>
#include <stdlib.h>

/* 0 off, 1 on, N >= 2 on with a pool of N blocks */
static inline int kv_stage_hook(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LLMQ_KV_STAGE");
        v = e ? atoi(e) : 1;
        v = v < 0 ? 1 : v;
    }
    return v;
}

static inline bool kv_stage_on(void)
{
    return kv_stage_hook() != 0;
}
