/* The engine's options from the configuration: what every command that opens an engine (`llmq
 * run`, `llmq worker`) shares, from loading its configuration with command-line flags to the
 * engine options and the model's name, so a key means the same thing everywhere. */
#pragma once
#include <stddef.h>

#include "engine/engine.h"

struct cfg;

/* Lanes of the worker's engine (engine_request.lane). */
enum { ENGINE_CFG_LANE_SHORT = 0, ENGINE_CFG_LANE_LONG = 1 };

/* engine_opts_default() with the model and engine sections of c applied: block size, global
 * caps, max_model_len, threads, CUDA device, memory, KV dtype, weight dtype (model.dtype), CUDA graphs,
 * prefix caching, seed. One lane with the global caps. */
struct engine_opts engine_cfg_opts(const struct cfg *c);

/* engine.backend: "auto", "cpu" or "cuda", the name backend_open takes (a static string). */
const char *engine_cfg_backend(const struct cfg *c);

/* Adds the worker's two lanes to o from the queues section: lane ENGINE_CFG_LANE_SHORT with the
 * short_* caps and ENGINE_CFG_LANE_LONG with the long_* caps (0 = the global value). */
void engine_cfg_lanes(struct engine_opts *o, const struct cfg *c);

/* Command-line flags that set configuration keys (--model sets model.path, ...; the table is
 * worker/cli/engine_flags.c), kept in the order given. The strings are borrowed (argv and literals)
 * and must outlive the list. */
struct engine_cfg_flags {
    struct {
        const char *key, *value, *flag;
    } v[32];
    int n;
};

/* Appends one flag to f; returns 0, or -1 when f is full (nothing added). */
int engine_cfg_flag_add(struct engine_cfg_flags *f, const char *key, const char *value, const char *flag);

/* Fills *c for a command that opens an engine: defaults < the file (config, may be NULL) < LLMQ_*
 * environment < the flags f, in order; not yet validated (the caller adjusts, then validates).
 * Returns 0, or the exit status after printing "llmq <cmd>: ..." on stderr (1 for a bad file or
 * environment, 2 for a bad flag value). *c must be given to cfg_free either way. */
int engine_cfg_load(const char *cmd, const char *config, const struct engine_cfg_flags *f, struct cfg *c);

/* The model's name as reported: model.name, or else the last component of model.path (trailing
 * slashes ignored). Writes at most len bytes, NUL-terminated, into out. */
void engine_cfg_model_name(const struct cfg *c, char *out, size_t len);
