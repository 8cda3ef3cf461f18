/* Safetensors files: mmap'd, header parsed and checked, tensors looked up by name.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 *   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
 * and the data section; offsets are relative to the data section. Parsing checks everything a
 * loader relies on: the header fits in the file and is at most ST_MAX_HEADER bytes of valid JSON
 * without duplicate names; each dtype is one of engine/dtype.h; at most 4 non-negative dims;
 * begin <= end <= the data section's size; (product of shape) * dtype size == end - begin.
 * Overlapping, unsorted or gapped offsets are accepted. "__metadata__" is ignored.
 *
 * A set is one model's files: `model.safetensors`, or the shards that
 * `model.safetensors.index.json` ("weight_map": name -> file) names. Every error message names
 * the file, and the tensor when there is one. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/dtype.h"
#include "engine/model.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* the format's own limit: 100 MB of JSON */
#define ST_MAX_DIMS 4

/* A dtype set for st_get: DT_MASK(DT_BF16) | DT_MASK(DT_F32) ... */
#define DT_MASK(t) (1u << (unsigned)(t))
#define ST_FLOAT_MASK (DT_MASK(DT_F32) | DT_MASK(DT_F16) | DT_MASK(DT_BF16))

/* One tensor of a file. view.name is owned by the tensor (freed with its file or header), view.data
 * points into the mapped (or parsed) bytes, view.scale_inv is NULL (model_load sets it on its copies). */
struct st_tensor {
    struct tensor_view view;
    uint64_t begin, end; /* byte offsets in the data section */
    int file;            /* index in st_set.files (0 for st_parse_header) */
};

struct st_file {
    char *path;       /* full path */
    const char *name; /* base name inside path, for messages */
    void *map;        /* the whole file, read-only */
    size_t size;
    struct st_tensor *tensors; /* in header order */
    int n_tensors;
};

struct st_set {
    char *dir;
    const char *source; /* "model.safetensors" or "model.safetensors.index.json" */
    struct st_file *files;
    int n_files;
    int n_tensors;            /* over all files */
    struct st_tensor **slots; /* open-addressing hash table of n_slots (a power of 2), NULL = empty */
    size_t n_slots;
};

/* Parses and checks the header of a whole safetensors file held in buf[0, len) (as mmap'd); `fname`
 * only names the file in messages. On success *tensors is a malloc'd array of *n (in header order)
 * whose views point into buf: free it with st_tensors_free. On failure returns -1 with err set and
 * *tensors NULL. Safe on any input (it is the fuzz target). */
int st_parse_header(const void *buf, size_t len, const char *fname, struct st_tensor **tensors, int *n,
                    char *err, size_t errlen);
void st_tensors_free(struct st_tensor *tensors, int n);

/* Opens the safetensors of a model folder: model.safetensors if present, otherwise the shards of
 * model.safetensors.index.json (every weight_map entry must exist in its shard; shard names must be
 * plain file names). A name in two files is an error. NULL with err on failure; free with st_free. */
struct st_set *st_open_dir(const char *dir, char *err, size_t errlen);
/* Opens a list of files as one set (no index). */
struct st_set *st_open_files(const char *const *paths, int n, char *err, size_t errlen);
void st_free(struct st_set *s);

/* The tensor called `name`, or NULL. The pointer lives as long as the set. */
const struct st_tensor *st_find(const struct st_set *s, const char *name);
/* Base name of the file that holds t. */
const char *st_file_name(const struct st_set *s, const struct st_tensor *t);

/* Looks `name` up and checks it: its dtype must be in dtype_mask (DT_MASK bits), it must have `ndim`
 * dims equal to shape[] (a negative expected dim matches any size). On success copies its view into
 * *out (may be NULL) and returns 0; otherwise -1 with e.g.
 *   "model.norm.weight in model.safetensors: shape [32], expected [64]"
 *   "model.norm.weight in model.safetensors: dtype I32, expected BF16|F16|F32"
 *   "model.norm.weight: missing (not in model.safetensors)" */
int st_get(const struct st_set *s, const char *name, unsigned dtype_mask, int ndim, const int64_t *shape,
           struct tensor_view *out, char *err, size_t errlen);

/* Formats "[a, b, c]" into buf; returns buf. */
char *st_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

/* One tensor to write. */
struct st_write {
    const char *name;
    enum dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* product(shape) * dtype_size bytes */
};

/* Writes a safetensors file with the tensors in the given order (header JSON compact, padded with
 * spaces to a multiple of 8, "__metadata__": {"format": "pt"}). Same input, same bytes. 0 or -1. */
int st_write_file(const char *path, const struct st_write *t, int n, char *err, size_t errlen);
