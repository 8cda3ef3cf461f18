/* The CUDA backend's entry points beyond engine/backend.h: its constructor, and what it tells its
 * callers (memory, graphs) for `llmq bench` and the logs. Implemented by kernels/cuda_backend.cu;
 * called only from the layers above kernels/ (worker/backends/backend_open.c, the worker, the
 * CLI, tests), never from engine/. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct backend;
struct backend_opts;
struct model;

/* Opens the CUDA backend for a loaded model that outlives it; NULL with err on failure (in builds
 * without CUDA always, worker/backends/cuda_none.c). Callers go through backend_open. */
struct backend *cuda_backend_open(const struct model *m, const struct backend_opts *o, char *err,
                                  size_t errlen);

struct cuda_backend_stats {
    char device[128]; /* "NVIDIA H200" */
    int64_t device_total_bytes;
    int64_t weights_bytes;   /* bf16 weights on the device */
    int64_t copy_bytes;      /* the decode GEMVs' weight copies (engine.decode_weight_copies); 0: none */
    int64_t kv_bytes;        /* the KV pool */
    int64_t alloc_bytes;     /* everything this backend allocated (weights, KV, activations, workspaces) */
    int64_t peak_used_bytes; /* highest (total - free) device memory seen: all allocations, graphs, context */
    int graphs;              /* decode graphs captured */
    uint64_t graph_replays;  /* steps run by replaying a graph */
    uint64_t eager_steps;    /* steps launched kernel by kernel */
    uint64_t guesses_taken;  /* decode steps enqueued one step ahead and taken (kernels/cuda_spec.cu) */
    uint64_t guesses_dropped;   /* ... and dropped: the step asked for was another */
    uint64_t guesses_new_block; /* of those taken, steps in which a sequence entered a block (the
                                 * scheduler's lookahead block) */
    int gemm_made;              /* GEMM algorithms (M <= 256) and GEMV/cuBLASLt choices made here */
    int gemm_loaded;            /* ... and taken from the tuning file (engine.gemm_tuning_file) */
};

/* Fills *st for a backend opened as "cuda" (directly or through "auto"). Returns 0, or -1 when be
 * is not a CUDA backend. Only in builds with LLMQ_HAVE_CUDA_BACKEND. */
int cuda_backend_get_stats(const struct backend *be, struct cuda_backend_stats *st);
