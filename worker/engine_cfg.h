/* The engine's options from the configuration: one function shared by every command that opens
 * an engine (`llmq run`, `llmq worker`), so a key of the engine section means the same thing
 * everywhere. */
#pragma once
#include "engine/engine.h"

struct cfg;

/* Lanes of the worker's engine (engine_request.lane). */
enum { ENGINE_CFG_LANE_SHORT = 0, ENGINE_CFG_LANE_LONG = 1 };

/* engine_opts_default() with the model and engine sections of c applied: block size, global
 * caps, max_model_len, threads, memory, KV dtype, CUDA graphs, backend, prefix caching, seed.
 * One lane with the global caps. */
struct engine_opts engine_cfg_opts(const struct cfg *c);

/* Adds the worker's two lanes to o from the queues section: lane ENGINE_CFG_LANE_SHORT with the
 * short_* caps and ENGINE_CFG_LANE_LONG with the long_* caps (0 = the global value). */
void engine_cfg_lanes(struct engine_opts *o, const struct cfg *c);
