/* Which backend a name opens, the one place that knows every backend: "cpu" is engine/'s
 * (cpu_backend_open, engine/backend.h), "cuda" kernels/' (cuda_backend_open, engine/cuda_backend.h),
 * "auto" the CUDA one where it is built and a device is usable, else the CPU one.
 *
 * The choice lives here, above both backends, so that the layers call only downward: engine/
 * defines the seam and the CPU backend and names no CUDA code, kernels/ builds the CUDA backend on
 * engine/, and a caller opens a backend here and hands it to engine_open (README.md, "Layers").
 * In builds without CUDA, cuda_none.c stands in for kernels/' entry points. */
#pragma once
#include <stddef.h>

struct backend;
struct backend_opts;
struct model;

/* Opens "cpu", "cuda" or "auto" (NULL is "auto") for a loaded model. The model must outlive the
 * backend. NULL with err on failure. A max_model_len above the model's max_position_embeddings
 * enables YaRN when config.json has no rope_scaling (model_config_extend_rope, logged); the
 * backends see it through a copy of m made for the call. */
struct backend *backend_open(const char *name, const struct model *m, const struct backend_opts *o, char *err,
                             size_t errlen);
