/* tokenizer.json components that may be a "Sequence": a normalizer or pre-tokenizer is either one
 * step {"type": T, ...} or {"type": "Sequence", "<list_key>": [component, ...]}, nested to any
 * depth. tok_seq_walk checks the shape and hands every non-Sequence step, in order, to a callback
 * of the caller's kind (tok_normalize, tok_pretok). */
#pragma once
#include <stddef.h>

struct json_t;

/* Called for each step that is not a Sequence: j is an object whose "type" is the string `type`;
 * path names j for messages ("pre_tokenizer.pretokenizers[1]"). Returns 0, or -1 with err. */
typedef int (*tok_seq_step_fn)(void *ctx, const struct json_t *j, const char *type, const char *where,
                               const char *path, char *err, size_t errlen);

/* Walks the component j found at `path` (e.g. "normalizer"); a Sequence's steps are read from
 * j[list_key] ("normalizers", "pretokenizers") and named "<path>.<list_key>[i]". `where` names the
 * file. Messages: "<where>: <path>: expected an object", "<where>: <path>.type: expected a string",
 * "<where>: <path>.<list_key>: expected an array". Returns 0, or -1 with err (from here or from
 * step), stopping at the first error. */
int tok_seq_walk(const struct json_t *j, const char *list_key, tok_seq_step_fn step, void *ctx,
                 const char *where, const char *path, char *err, size_t errlen);
