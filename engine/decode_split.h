/* The decode attention's split over the context (flash-decoding partitions), and the decode graphs'
 * buckets that choose it for a graph: one definition for the CUDA backend (kernels/attention_decode.cu,
 * kernels/cuda_graphs.cu) and the CPU backend's emulation of the CUDA numerics
 * (engine/cpu_backend.c), because the split decides where the kernel rounds its probabilities and
 * both must take the same one (docs/CUDA_BACKEND.md, "The emulation").
 *
 * Automatic split (part_keys == 0) for n_seqs sequences whose longest context is max_ctx_len: as few
 * partitions as keep the GPU busy, because each one is a CTA that fills its copy pipeline, drains it
 * and merges its warps on its own (a few microseconds that no other work hides, so longer partitions
 * stream closer to the copy rate). The count is the largest of
 *   - floor(ctx / 2048) (partitions of >= 2048 keys; at least one),
 *   - min(ceil(128 / n_seqs), floor(ctx / 512)): a batch of fewer than 128 sequences is split, down to
 *     512-key partitions, until n_seqs x partitions >= 128 (~4 waves of CTAs at 8 KV heads),
 *   - min(ceil(ctx / 64), 32 / n_seqs): a batch of few sequences down to 64-key partitions, so that
 *     its KV heads x partitions CTAs cover the SMs (one sequence of 512 keys at 8 KV heads: 64 CTAs of
 *     64 keys instead of 8 of 512),
 * and at most max(1, 4096 / n_seqs) (bounds the workspace at ~4096 * H * (4 D + 8) bytes). The same
 * rule over a bf16 and an fp8 cache. part_keys > 0: that many keys (rounded up to a multiple of 64);
 * < 0: one partition. *part is max_ctx_len when it does not split.
 * *n_bound (may be NULL): the partitions a workspace must hold for every context up to max_ctx_len
 * (the rounding to whole tiles can make n_part dip as the context grows; n does not).
 * Plain C, also compiled as CUDA C++. */
#pragma once

#define DECODE_SPLIT_TILE 64    /* keys per K/V tile of the decode kernel: partitions are whole tiles */
#define DECODE_SPLIT_PART 2048  /* partitions of >= 2048 keys ... */
#define DECODE_SPLIT_MIN 512    /* ... or of >= 512 keys, */
#define DECODE_SPLIT_WAVE 128   /* until n_seqs x partitions >= 128 */
#define DECODE_SPLIT_SLOTS 4096 /* at most max(1, 4096 / n_seqs) partitions per sequence */
#define DECODE_SPLIT_FILL 32    /* >= min(ceil(ctx / 64), 32 / n_seqs) partitions */

static inline void decode_split(int n_seqs, int max_ctx_len, int part_keys, int *part, int *n_part,
                                int *n_bound)
{
    const int ctx = max_ctx_len > 0 ? max_ctx_len : 1, ns = n_seqs > 1 ? n_seqs : 1;
    if (part_keys < 0) {
        *part = ctx, *n_part = 1;
        if (n_bound)
            *n_bound = 1;
        return;
    }
    int n = 0;
    if (part_keys == 0) {
        const int cap = DECODE_SPLIT_SLOTS / ns > 1 ? DECODE_SPLIT_SLOTS / ns : 1;
        const int tiles = (ctx + DECODE_SPLIT_TILE - 1) / DECODE_SPLIT_TILE, f = DECODE_SPLIT_FILL / ns;
        const int nf = f < tiles ? f : tiles;
        const int w = (DECODE_SPLIT_WAVE + ns - 1) / ns, wmax = ctx / DECODE_SPLIT_MIN;
        const int nw = w < wmax ? w : wmax;
        n = ctx / DECODE_SPLIT_PART;
        n = n > 1 ? n : 1;
        n = n > nw ? n : nw;
        n = n > nf ? n : nf;
        n = n < cap ? n : cap;
        part_keys = (ctx + n - 1) / n;
    }
    *part = (part_keys + DECODE_SPLIT_TILE - 1) / DECODE_SPLIT_TILE * DECODE_SPLIT_TILE;
    *n_part = (ctx + *part - 1) / *part;
    if (n_bound)
        *n_bound = n > *n_part ? n : *n_part; /* automatic: n >= n_part */
    if (*n_part == 1)
        *part = ctx; /* never split: part >= ctx */
}

/* A pure decode step of n <= graph_max sequences runs as the CUDA graph of its batch bucket (1, 2,
 * 4, then multiples of 8, at most graph_max: padded rows) and context bucket (DECODE_GRAPH_MIN_CTX *
 * 2^k for its longest context ctx, capped at max_len rounded up to the block size bs), and the
 * graph's attention takes the split of (batch bucket, context bucket). A larger step runs eagerly,
 * unpadded. graph_max is engine.cuda_graph_max_batch (0 = no cap) at most max_num_seqs. */
#define DECODE_GRAPH_MIN_CTX 512

static inline int decode_graph_max(int cuda_graph_max_batch, int max_seqs)
{
    return cuda_graph_max_batch > 0 && cuda_graph_max_batch < max_seqs ? cuda_graph_max_batch : max_seqs;
}

static inline int decode_graph_batch(int n, int graph_max)
{
    const int B = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : (n + 7) / 8 * 8;
    return B < graph_max ? B : graph_max;
}

static inline int decode_graph_ctx(int ctx, int max_len, int bs)
{
    const int cap = (max_len + bs - 1) / bs * bs;
    int c = DECODE_GRAPH_MIN_CTX;
    while (c < ctx && c < cap)
        c *= 2;
    if (c > cap)
        c = cap;
    return c < ctx ? ctx : c;
}
