/* Whether a prefill over an fp8 KV cache reads bf16 copies of its blocks (the CUDA backend's default:
 * k_kv_stage_fp8 then the bf16 prefill attention, docs/CUDA_BACKEND.md "FP8 KV cache") rather than the
 * codes with their scales applied per key. LLMQ_KV_STAGE=0 in the environment turns it off, for A/B
 * runs; read once per process. The CPU backend's bf16 emulation follows the same switch, so the
 * oracle rounds what the kernels round. */
#pragma once
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool kv_stage_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMQ_KV_STAGE");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on != 0;
}
