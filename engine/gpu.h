/* What the program knows about GPUs before any backend is opened. Implemented by kernels/gpu_probe.cu
 * in CUDA builds and worker/backends/cuda_none.c otherwise; called only from above kernels/. */
#pragma once
#include <stddef.h>

/* 1 when this binary contains the CUDA backend. */
int gpu_backend_built(void);

/* Writes "<name>, <MiB> MiB, sm_<major><minor>" of device 0 into buf; 0 ok, -1 when no
 * usable device (buf then holds the driver's reason). */
int gpu_describe(char *buf, size_t n);
