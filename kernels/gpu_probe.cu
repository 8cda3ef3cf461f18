// GPU probe for CUDA builds (see engine/gpu.h).
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "engine/gpu.h"
}

extern "C" int gpu_backend_built(void) { return 1; }

extern "C" int gpu_describe(char *buf, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(buf, n, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return -1;
    }
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        snprintf(buf, n, "%s", cudaGetErrorString(e));
        return -1;
    }
    snprintf(buf, n, "%s, %zu MiB, sm_%d%d, %d device(s)", p.name, (size_t)(p.totalGlobalMem >> 20), p.major,
             p.minor, count);
    return 0;
}
