/* GPU probe for builds without CUDA (see engine/gpu.h). */
#include "engine/gpu.h"

#include <stdio.h>

int gpu_backend_built(void) { return 0; }

int gpu_describe(char *buf, size_t n)
{
    snprintf(buf, n, "this llmq was built without CUDA");
    return -1;
}
