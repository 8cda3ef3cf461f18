/* The CUDA backend's entry points in builds without CUDA (engine/gpu.h, engine/cuda_backend.h):
 * no GPU, and "cuda" refuses to open. CUDA builds have kernels/ instead. */
#include <stdio.h>

#include "engine/cuda_backend.h"
#include "engine/gpu.h"

int gpu_backend_built(void)
{
    return 0;
}

int gpu_describe(char *buf, size_t n)
{
    snprintf(buf, n, "this llmq was built without CUDA");
    return -1;
}

struct backend *cuda_backend_open(const struct model *m, const struct backend_opts *o, char *err,
                                  size_t errlen)
{
    (void)m;
    (void)o;
    snprintf(err, errlen, "this llmq was built without the CUDA backend");
    return NULL;
}
