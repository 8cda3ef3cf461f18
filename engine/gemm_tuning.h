/* The GEMM tuning file (engine.gemm_tuning_file): what the CUDA backend's GEMMs chose by timing
 * (kernels/gemm.cu: cuBLASLt's algorithm per shape, and the GEMV or cuBLASLt per decode shape), kept
 * so that the next process on the same GPU model, libraries and llmq takes the same choices without
 * timing them again: the same results bit for bit for the same batches, and no timing at start
 * (as PyTorch's TunableOp results file). docs/CUDA_BACKEND.md, "The GEMM tuning file".
 *
 * Text, one entry a line, after two header lines:
 *   llmq-gemm-tuning 1
 *   identity <what the choices hold for, to the end of the line: device, cuBLASLt, llmq>
 *   <kind> <M> <N> <K> <y_f32> <align_x> <align_w> <align_y> <rep> <timed_M> <path> <algo>
 * kind is the caller's name for the plan's kind ([a-z0-9_-], at most 15 characters), algo cuBLASLt's
 * opaque algorithm (cublasLtMatmulAlgo_t, which its documentation allows to be stored and restored
 * with the same cuBLAS version) as 128 hex digits, 16 a 64-bit word. Empty lines and lines starting
 * with '#' are skipped. This module knows the format, not CUDA. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define GEMM_TUNING_KEY_INTS 8 /* M N K y_f32 align_x align_w align_y rep: with kind, the key */

struct gemm_tuning_entry {
    char kind[16];
    int key[GEMM_TUNING_KEY_INTS];
    int timed_M;      /* the M whose timing chose algo */
    int path;         /* the caller's choice (GEMV or cuBLASLt) for choice kinds; 0 otherwise */
    uint64_t algo[8]; /* cublasLtMatmulAlgo_t's 64 bytes; zeros for choice kinds */
};

/* A set of entries, at most one per key; zero-initialized is empty. */
struct gemm_tuning {
    struct gemm_tuning_entry *e; /* [n], owned */
    int n;
    size_t cap; /* e's room */
};

enum {
    GEMM_TUNING_LOADED = 0,   /* t holds the file's entries */
    GEMM_TUNING_NO_FILE = 1,  /* no file at path yet, or an empty one: t is empty */
    GEMM_TUNING_OTHER_ID = 2, /* a tuning file for another identity: t is empty, msg says which */
    GEMM_TUNING_BAD = -1,     /* a tuning file with a malformed line: t is empty, msg "path:line: ..." */
    GEMM_TUNING_FOREIGN = -2, /* unreadable, or not a tuning file (its first line): t is empty, msg says */
};

/* Reads path into *t (emptied first) when its identity line equals identity. Returns GEMM_TUNING_*;
 * msg (msglen bytes, NUL-terminated) says what happened for the non-zero results. */
int gemm_tuning_load(struct gemm_tuning *t, const char *path, const char *identity, char *msg, size_t msglen);

/* Writes *t to path under identity, atomically (a temporary file beside it, then rename), so that a
 * reader never sees half a file and concurrent writers leave one whole file. Returns 0, or -1 with
 * msg ("path: why"). */
int gemm_tuning_save(const struct gemm_tuning *t, const char *path, const char *identity, char *msg,
                     size_t msglen);

/* The entry of (kind, key), or NULL. The pointer lives until the next put or free. */
const struct gemm_tuning_entry *gemm_tuning_find(const struct gemm_tuning *t, const char *kind,
                                                 const int key[GEMM_TUNING_KEY_INTS]);

/* Adds *e, replacing an entry of the same kind and key. Returns 0, or -1 (out of memory, or a kind
 * that is not a token of [a-z0-9_-] of 1..15 characters; t unchanged). */
int gemm_tuning_put(struct gemm_tuning *t, const struct gemm_tuning_entry *e);

/* Empties t and frees its memory; t may be NULL. */
void gemm_tuning_free(struct gemm_tuning *t);
