/* The command-line flags that set engine and model configuration keys (--dtype sets model.dtype,
 * ...): one table that `llmq run`, `llmq worker` and `llmq bench` all take, so a setting has the
 * same flag, meaning and --help line everywhere. A flag overrides the config file and LLMQ_*. */
#pragma once
#include <stdbool.h>
#include <stdio.h>

struct engine_cfg_flags;
struct option;

/* getopt_long values: --model is 'm' (the command's short options must include "m:"), the others
 * ENGINE_FLAGS_O_FIRST and up; a command numbers its own long options below ENGINE_FLAGS_O_FIRST. */
enum { ENGINE_FLAGS_O_FIRST = 0x1000 };

/* Which flags a command takes: the engine's always; the worker's two lanes (queues.short_* and
 * queues.long_*) with ENGINE_FLAGS_LANES. */
enum { ENGINE_FLAGS_ENGINE = 1, ENGINE_FLAGS_LANES = 2 };

/* The most flags the table has: a command's getopt_long table needs this many entries besides its
 * own. */
enum { ENGINE_FLAGS_MAX = 32 };

/* Writes into out a getopt_long table: the command's own options (own, NULL-terminated), then the
 * flags in groups (ENGINE_FLAGS_*), then the terminator. out must hold the own entries plus
 * ENGINE_FLAGS_MAX + 1. */
void engine_flags_longopts(struct option *out, const struct option *own, unsigned groups);

/* When getopt_long's value opt is one of the flags: appends its key and value (value, or the fixed
 * value of a flag without one) to f and sets *lanes to whether the flag is a lane's. Returns 1 when
 * handled, 0 when opt is not an engine flag (f untouched), -1 when f is full. lanes may be NULL. */
int engine_flags_opt(struct engine_cfg_flags *f, int opt, const char *value, bool *lanes);

/* The --help lines of the flags in groups, each "  -m, --model DIR   help" with the key's default
 * from the configuration's defaults where the help names one. */
void engine_flags_usage(FILE *f, unsigned groups);

/* One --help line: "  -x, --name ARG" (name: "--name") padded to a column, then help; each '\n' in help
 * starts a continuation line under the first. letter 0: no short flag; arg NULL: the flag takes no value. */
void engine_flags_usage_line(FILE *f, char letter, const char *name, const char *arg, const char *help);
