/* Helpers for the cmocka tests of the CPU backend, tests/unit/test_cpu_*.c (header-only; each test is
 * its own program). Include it after <cmocka.h>.
 *
 *   - a tiny checkpoint (engine/tiny_model.h) written to a temporary folder and loaded;
 *   - a CPU backend opened from given options, a step, a greedy sampling with logprobs, and a
 *     one-sequence step description (struct be_seq);
 *   - a checkpoint folder's model and tokenizer loaded together;
 *   - a row of logits turned into log-probabilities in place (the C references);
 *   - splitmix64, the tests' seeded random numbers.
 * Every helper fails the test (cmocka) on an error. */
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"
#include "worker/backends/backend_open.h"

/* splitmix64: the next number of the sequence whose state is *s. */
static inline uint64_t cpu_test_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* model_load and tok_load_dir of dir; the caller frees both. */
static inline void cpu_test_load_dir(const char *dir, struct model **m, struct tok **tok)
{
    char err[512] = "";
    if (!(*m = model_load(dir, err, sizeof err)))
        fail_msg("model_load: %s", err);
    if (!(*tok = tok_load_dir(dir, err, sizeof err)))
        fail_msg("tok_load_dir: %s", err);
}

/* row[0 .. n) = log_softmax(row), in double. */
static inline void cpu_test_log_softmax(double *row, int n)
{
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < n; i++)
        z += exp(row[i] - mx);
    for (int i = 0; i < n; i++)
        row[i] -= mx + log(z);
}

/* A tiny checkpoint in its own temporary folder, loaded. */
struct cpu_test_fixture {
    char dir[256];
    struct model *m; /* owned; freed by cpu_test_fixture_close */
};

/* Writes a tiny checkpoint of options `o` into $TMPDIR (or /tmp)/llmq-<tag>-XXXXXX and loads it. */
static inline void cpu_test_fixture_open(struct cpu_test_fixture *f, const struct tiny_opts *o,
                                         const char *tag)
{
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), tag, f->dir, sizeof f->dir), 0);
    char err[512] = "";
    if (tiny_model_write(f->dir, o, err, sizeof err) || !(f->m = model_load(f->dir, err, sizeof err))) {
        print_error("fixture: %s\n", err);
        fail();
    }
}

/* Frees the model and removes the folder (and the files in it). */
static inline void cpu_test_fixture_close(struct cpu_test_fixture *f)
{
    model_free(f->m);
    scratch_dir_remove(f->dir);
}

/* backend_open("cpu", m, o); fails the test with the backend's message if it cannot. The caller
 * frees the backend (backend_free); `m` must outlive it. */
static inline struct backend *cpu_test_backend(const struct model *m, const struct backend_opts *o)
{
    char err[512] = "";
    struct backend *be = backend_open("cpu", m, o, err, sizeof err);
    if (!be) {
        print_error("backend_open: %s\n", err);
        fail();
    }
    return be;
}

/* Greedy, with the top `ntop` logprobs. */
static inline struct sampling_params cpu_test_greedy(int ntop)
{
    struct sampling_params sp = sampling_params_default();
    sp.temperature = 0;
    sp.logprobs = ntop;
    return sp;
}

/* One step of a sequence `tok` running tokens [pos, pos + n_new) with blocks table[0 .. n_blocks),
 * sampling (with `sp`) at its last token. Borrows tok, table and sp. */
static inline struct be_seq cpu_test_seq(const int32_t *tok, int pos, int n_new, const int32_t *table,
                                         int n_blocks, const struct sampling_params *sp)
{
    struct be_seq b;
    memset(&b, 0, sizeof b);
    b.tokens = tok;
    b.pos = pos;
    b.n_new = n_new;
    b.n_tokens = pos + n_new; /* the step always samples: logits at its last token */
    b.n_prompt = b.n_tokens;
    b.block_table = table;
    b.n_blocks = n_blocks;
    b.sample = true;
    b.sp = sp;
    return b;
}

/* backend_step(be, seqs, n, out); fails the test with the backend's error if it fails. */
static inline void cpu_test_step(struct backend *be, const struct be_seq *seqs, int n, struct be_out *out)
{
    if (backend_step(be, seqs, n, out) != 0) {
        print_error("step failed: %s\n", be->err);
        fail();
    }
}
