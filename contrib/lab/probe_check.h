// The CUDA error check of the developer probes (contrib/lab/overlap_probe, contrib/lab/handoff_probe): a
// failing call prints file:line, the call and the error, and the probe exits 1.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static inline void probe_fail(const char *file, int line, const char *what, const char *err, int code)
{
    fprintf(stderr, "%s:%d: %s: %s %d\n", file, line, what, err, code);
    exit(1);
}

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess)                                                                               \
            probe_fail(__FILE__, __LINE__, #x, cudaGetErrorString(e_), (int)e_);                             \
    } while (0)
