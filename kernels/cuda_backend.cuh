// The CUDA backend's state, shared by its four files (private to kernels/):
//   cuda_backend.cu  open/free, memory plan, one step (host descriptors, forward, sampling)
//   cuda_weights.cu  weights to the device: bf16 conversion or fp8 (e4m3, 128x128 blocks), QKV and
//                    gate/up fusion, random weights
//   cuda_graphs.cu   decode steps as CUDA graphs, one per (batch bucket, context bucket)
//   cuda_spec.cu     the next decode step guessed and enqueued before the host has read this one
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/kernels.h"

extern "C" {
#include "engine/backend.h"
#include "engine/model.h"
}

#define CB_TOP 20         // top logprobs per row the sampler writes (SAMPLING_MAX_LOGPROBS)
#define CB_MAX_GRAPHS 256 // decode graphs kept (batch buckets x context buckets)
#define CB_GEMM_WORKSPACE (32u << 20)
#define CB_SPEC_MAX 4 // most sequences of a decode step guessed one step ahead (cuda_spec.cu)

struct cb_layer {
    const bf16 *attn_norm;       // (C)
    struct k_weight wqkv;        // (QKV, C): q rows, k rows, v rows; bf16 or fp8 (k_linear)
    const bf16 *bqkv;            // (QKV) or NULL
    const bf16 *q_norm, *k_norm; // (D) or NULL
    struct k_weight wo;          // (C, HD)
    const bf16 *mlp_norm;        // (C)
    struct k_weight wgu;         // (2F, C): gate rows, up rows
    struct k_weight wdown;       // (C, F)
    void *k_cache, *v_cache;     // (NB, KVH, bs, D) bf16, or e4m3 bytes with an fp8 cache (cb_kv)
    float *k_scale, *v_scale;    // fp8 cache: (NB, KVH, bs), one per (token, KV head); else NULL
};

// A host array mirrored on the device: pinned host h, device d, both `cap` bytes.
struct cb_buf {
    void *h, *d;
    size_t cap;
};

// fp8 cache: prefill sequences k0 .. k1-1 of a step, whose blocks are staged together as bf16 blocks
// b0 .. b0+nb-1 of the step's staging list (k_kv_stage_fp8) before their attention; max_q and max_ctx
// over those sequences.
struct cb_stage_group {
    int k0, k1, b0, nb, max_q, max_ctx;
};

// What one forward pass runs (device pointers inside point at fixed buffers, so a pass can be
// captured into a graph and replayed after the buffers are refilled).
struct cb_plan {
    int T;  // rows (tokens, dummy rows of a padded graph batch included)
    int nd; // rows 0 .. nd-1: one decode query each (k_attention_decode)
    int np; // prefill sequences, rows nd .. T-1 (k_attention_prefill)
    struct k_attn_batch dec, pre;
    int n_logits; // rows that get logits
    bool gather;  // logits rows are gathered through last_rows; else rows 0 .. n_logits-1
    // fp8 cache: the prefill attention over bf16 copies of its blocks, group by group (0: the fp8
    // prefill kernel over the cache itself)
    int n_stage;
    const struct cb_stage_group *stage;
};

struct cb_graph {
    int batch, ctx; // bucket: padded rows, context bound (max_ctx_len of the capture)
    cudaGraphExec_t exec;
};

// Phases of a step's host time (struct cb_host_times): between steps (the engine and its caller),
// layout and uploads, forward enqueued, sampler enqueued, waiting for the GPU, outputs read.
enum { CB_HT_BETWEEN, CB_HT_PREPARE, CB_HT_FORWARD, CB_HT_SAMPLER, CB_HT_WAIT, CB_HT_READ, CB_HT_N };

// Shapes below: C hidden, F intermediate, L layers, H / KVH query / KV heads of D, V vocabulary, HD = H * D,
// QKV = (H + 2 KVH) * D; S = max_seqs, R = rows (activation rows), MB = max_blocks, NB = the KV pool's
// blocks, bs = the block size.

// The weights: one allocation. Linear weights are bf16, or e4m3 with fp32 128x128 block scales
// (backend_opts.weight_dtype, engine/fp8.h decides per matrix); embeddings and norms bf16; the output
// projection bf16, or fp8 by the same rule under backend_opts.lm_head_dtype. In fp16 mode every 16-bit
// tensor holds fp16 instead (struct cuda_backend's f16). The layers' matrices are in cuda_backend.layers.
struct cb_weights {
    void *buf;
    size_t bytes;
    enum be_weights dtype, lm_dtype;
    int n_fp8;                      // linear matrices (of 4 L) held in fp8
    void *copies;                   // the decode GEMVs' weight copies (cb_tile_copies), or NULL
    size_t copies_bytes;            // their size
    const bf16 *embed, *final_norm; // (V, C), (C)
    struct k_weight lm;             // lm_head (V, C): bf16 (the embedding itself when tied), or fp8
    float *inv_freq;                // (D/2) device
    float attn_scale;
};

// The paged KV cache: one allocation, [L][K|V][NB][KVH][bs][D] bf16; with fp8 the same in e4m3 bytes, then
// (256-byte aligned) the scales [L][K|V][NB][KVH][bs] fp32. Each layer's pointers are in its cb_layer.
struct cb_kv {
    bool fp8;
    void *pool;
    size_t bytes;
};

// fp8 cache: the prefill attention's bf16 staging pool, [cap][KVH][bs][D] for K and for V (cap 0: none);
// a step's staged blocks, round after round (cache block ids, int32 (S * MB)) and its prefill block
// tables remapped to their places in the pool (int32 (S * MB)); groups [S] host: the rounds.
struct cb_stage {
    bf16 *k, *v;
    int cap;
    struct cb_buf src, btab;
    struct cb_stage_group *groups;
    uint32_t *mark, epoch; // [NB] host: the staging round that holds a cache block
    int32_t *at;           // [NB] host: its place in the pool in that round
};

// Activations and workspaces (device), [R, .] unless said.
struct cb_acts {
    float *resid;      // (R, C) fp32 residual stream
    bf16 *h;           // (R, C) normed input of a sublayer
    bf16 *qkv;         // (R, QKV)
    bf16 *att;         // (R, HD)
    bf16 *tmp;         // (R, C) sublayer output, added to resid by the next add_rmsnorm
    float *down_parts; // (K_GEMV_MAX_SPLIT, C) a one-row down GEMV's parts of K (cb_forward)
    bf16 *gu;          // (R, 2F)
    bf16 *act;         // (R, F)
    float *resid_last; // (S, C) gathered last rows
    bf16 *tmp_last;    // (S, C)
    bf16 *h_last;      // (S, C)
    float *logits;     // (S, V)
    int32_t *qs_dec;   // (S + 1) 0, 1, ..., S (constant)
    uint8_t *xq;       // (R, max(C, HD, F)) e4m3 GEMM input of an fp8 matrix (NULL without fp8)
    float *xs;         // (max(C, HD, F) / 128, R) its 1x128 group scales, ld K_FP8_ROWS(T)
    size_t xq_bytes;   // one allocation: xq then xs
    void *attn_ws;     // the decode attention's split workspace
    size_t attn_ws_bytes;
    void *samp_ws; // the sampler's
    size_t samp_ws_bytes;
};

// A step's inputs, host (pinned) and device, and its outputs.
struct cb_io {
    struct cb_buf ids, pos, slot;                                   // int32 (R)
    struct cb_buf ctx_dec, btab_dec;                                // int32 (S), (S * MB)
    struct cb_buf qs_pre, ctx_pre, btab_pre;                        // int32 (S + 1), (S), (S * MB)
    struct cb_buf last_rows;                                        // int32 (S)
    struct cb_buf params;                                           // struct k_sample_params (S)
    struct cb_buf hist, hist_start, n_prompt, banned, banned_start; // sampler, CSR; hist and banned grow
    struct cb_buf allow, allow_row; // grammar masks (grows; words per row (V + 31) / 32), row -> mask or -1
    // outputs: token (S) int32, logprob (S) f32, top ids (S, 20) int32, top lp (S, 20) f32
    struct cb_buf out;
    int *row_seq; // [S] host: sequence index of each sampler row
    int *order;   // [S] host: sequences in row order (decode first)
};

// Decode steps as CUDA graphs (cuda_graphs.cu).
struct cb_graphs {
    bool on;
    int max_batch; // largest decode batch run as a graph (engine/decode_split.h)
    struct cb_graph g[CB_MAX_GRAPHS];
    int n;
    uint64_t replays, eager_steps, captures_failed;
};

// The guessed next step (cuda_spec.cu): a pure decode graph step enqueued before the host has read the
// tokens of the step before, its inputs advanced on the device.
struct cb_spec {
    int max;                   // most sequences a guessed step may have; 0 = never guess
    bool live;                 // a guessed step is on the stream
    int nd, B, gctx;           // its sequences, graph batch and context buckets
    int32_t *ids, *pos, *slot; // [S] host: its inputs, row by row, as the device holds them
    int32_t *btab;             // [S * MB] stride mb: the blocks each row's context needs
    int mb;
    struct k_sample_params *params; // [S]
    void *out_h;                    // pinned, io.out.cap bytes: the guessed step's outputs
    cudaEvent_t ev[2];              // its outputs copied back (two: one guess is enqueued behind another
    int ev_i;                       // before that one is waited for)
    uint64_t hits, misses;
    bool block;          // the live guess has a row entering a block
    uint64_t hits_block; // guesses taken with such a row
};

// The copy back of a step's outputs, on its own stream, off the chain of kernels from one step's sampler
// to the next guessed step: ev_sampled orders it after the sampler, ev_copied the next sampler (which
// rewrites io.out.d) after it; ev_out: a step's outputs copied back.
struct cb_copyback {
    cudaStream_t stream;
    cudaEvent_t ev_out, ev_sampled, ev_copied;
};

// The host's part of each step, by phase (seconds, summed; logged at close): [0] graph steps, [1] eager
// steps (cuda_backend.cu, host_times_log).
struct cb_host_times {
    double t[2][CB_HT_N];
    uint64_t steps[2];
    double returned; // when cb_step last returned, CLOCK_MONOTONIC seconds (0: not yet)
};

// engine.gemm_tuning_file: in use, when a step last offered it a save (CLOCK_MONOTONIC seconds), and the
// seconds between such saves (CB_TUNING_SAVE_S; 0 for backend_test_opts.tuning_save_every_step).
struct cb_tuning {
    bool on;
    double saved, save_s;
};

struct cuda_backend {
    struct backend base; // first: a struct backend * is a struct cuda_backend *
    struct model_config cfg;
    int C, F, L, H, KVH, D, V, QKV, HD, KVD;
    float eps;
    int max_seqs;   // S: most sequences per step
    int max_tokens; // most new tokens per step (max_num_batched_tokens)
    int rows;       // R: activation rows allocated, max(max_tokens, largest graph bucket) rounded up to 4
    int max_model_len;
    int max_blocks; // MB: per sequence, ceil(max_model_len / block_size)
    bool broken;    // a sticky CUDA error: every later step fails at once
    int device;
    char device_name[256];
    size_t total_mem;
    // fp16 mode (weight_dtype BE_WEIGHTS_F16): every 16-bit tensor (weights, activations, the KV cache)
    // holds fp16 instead of bf16; every entry point sets the kernels' mode (k_set_f16) for its thread and
    // gives the caller's back
    bool f16;

    cudaStream_t stream;
    struct k_gemm *gemm;

    struct cb_weights w;
    struct cb_layer *layers; // [L]: each layer's weights and KV cache
    struct cb_kv kv;
    struct cb_stage stage;
    struct cb_acts acts;
    struct cb_io io;
    struct cb_graphs graphs;
    struct cb_spec spec;
    struct cb_copyback copy;
    struct cb_host_times ht;
    struct cb_tuning tuning;

    // memory accounting
    size_t alloc_bytes; // device bytes this backend allocated (KV pool included)
    size_t peak_used;   // highest total - free seen
};

// ---- cuda_backend.cu
// Records "what: CUDA message" in be->err; marks the backend broken on a sticky error. Returns -1.
int cb_fail_cuda(struct cuda_backend *b, const char *file, int line, const char *what, cudaError_t e);
// Records a launcher's failure (k_last_error()). Returns -1.
int cb_fail_k(struct cuda_backend *b, const char *what);
int cb_malloc(struct cuda_backend *b, void **p, size_t bytes, const char *what);
int cb_forward(struct cuda_backend *b, const struct cb_plan *p);

#define CB_CUDA(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t cb_e_ = (call);                                                                          \
        if (cb_e_ != cudaSuccess)                                                                            \
            return cb_fail_cuda(b, __FILE__, __LINE__, #call, cb_e_);                                        \
    } while (0)
#define CB_K(call)                                                                                           \
    do {                                                                                                     \
        if ((call) != 0)                                                                                     \
            return cb_fail_k(b, #call);                                                                      \
    } while (0)

// ---- cuda_weights.cu: allocates b->w.buf and fills every weight pointer from m. 0, or -1 with
// b->base.err.
int cb_load_weights(struct cuda_backend *b, const struct model *m);
// The decode GEMVs' weight copies (engine.decode_weight_copies): cb_tile_copies_bytes is what they would
// take (every linear matrix of a shape they take, and the output projection; 0 in fp16 mode);
// cb_tile_copies makes them in b->w.copies and registers them with k_gemv_*_tiled (why: for the log), 0 or
// -1 with b->base.err; cb_tile_copies_free forgets the registrations.
size_t cb_tile_copies_bytes(struct cuda_backend *b);
int cb_tile_copies(struct cuda_backend *b, const char *why);
void cb_tile_copies_free(struct cuda_backend *b);

// ---- cuda_graphs.cu
// Padded batch size for n decode rows (1, 2, 4, 8, 16, 24, 32, ... multiples of 8), and the
// context bucket for a longest context of ctx (engine/decode_split.h: 512 * 2^k, capped at max_model_len).
int cb_graph_batch(const struct cuda_backend *b, int n);
int cb_graph_ctx(const struct cuda_backend *b, int ctx);
// Runs plan p (a padded pure-decode step of bucket (batch, ctx)) through its graph, capturing it
// on first use (the first use runs eagerly, then captures). 0, or -1 with b->base.err.
int cb_graph_run(struct cuda_backend *b, const struct cb_plan *p, int batch, int ctx);
// the graph of (batch, ctx) buckets, or NULL when none was captured
cudaGraphExec_t cb_graph_find(const struct cuda_backend *b, int batch, int ctx);

// ---- cuda_backend.cu: pieces of a step the guessed step shares
// The KV slot of position p of a sequence (block size bs).
int cb_slot(const struct be_seq *s, int p, int bs);
// The sampler's parameters of a sampling sequence, as a step uploads them (padding zeroed).
void cb_sample_params(const struct be_seq *s, struct k_sample_params *q);
// Whether a sequence's sampling needs no token history and bans nothing.
bool cb_plain_sampling(const struct be_seq *s);
// k_sample over rows 0 .. n_samp-1 (row j samples seqs[b->row_seq[j]]) and the copy of its outputs
// into host (pinned, out.cap bytes), enqueued; done is recorded after the copy.
int cb_enqueue_sample(struct cuda_backend *b, const struct be_seq *seqs, int n_samp, void *host,
                      cudaEvent_t done);
// The copied-back outputs of those rows into out[]; -1 with be->err on a token outside the vocabulary.
int cb_read_outputs(struct cuda_backend *b, const struct be_seq *seqs, int n_samp, const void *host,
                    struct be_out *out);

// ---- cuda_spec.cu: the guessed next step
// Guesses steps of up to max sequences (0: none; capped at max_num_seqs).
int cb_spec_init(struct cuda_backend *b, int max);
void cb_spec_free(struct cuda_backend *b);
// After a pure decode graph step of nd sequences (rows 0 .. nd-1 = seqs[0 .. nd-1]) is enqueued:
// enqueues the same step one position on when every sequence allows it (spec.live then).
void cb_spec_guess(struct cuda_backend *b, const struct be_seq *seqs, int nd, int B, int gctx);
// Once that step's tokens are read: the guessed step's inputs as the host would write them.
void cb_spec_expect(struct cuda_backend *b, int nd, const int32_t *tok);
// At the start of a step while a guess is live: when the step is the guessed one, waits for it, writes
// out (*rc its result), may guess the next, and returns true; otherwise waits for the stream to drain,
// drops the guess and returns false.
bool cb_spec_take(struct cuda_backend *b, const struct be_seq *seqs, int n, struct be_out *out, int *rc);
void cb_graphs_free(struct cuda_backend *b);
