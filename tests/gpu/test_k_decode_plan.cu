/* The decode attention's split over the context (decode_split, engine/decode_split.h, through
 * k_attention_decode_parts) and its workspace bound (k_attention_decode_workspace): host logic, so
 * this test runs without a GPU (it calls no CUDA function). The backend sizes the workspace once, at
 * max_model_len, and every later launch (eager, or a graph captured at a context bucket) must fit in
 * it; a split must cover the context with partitions of whole 64-key tiles and no empty one.
 *
 * Checked for batches of 1 .. 256 sequences (the rule is the same over a bf16 and an fp8 cache), every
 * context 1 .. 131072:
 *   - the partitions cover the context: n_part * part >= ctx > (n_part - 1) * part, part % 64 == 0
 *     when split (part == ctx when not);
 *   - need(ctx) <= workspace(ctx) and workspace(ctx) never decreases with ctx, so a workspace sized at
 *     any max_model_len holds every shorter context; need = n_seqs * H * n_part * (4 D + 8) bytes (each
 *     partition of each sequence and head writes D fp32 outputs and its (max, sum) pair) when split;
 *   - the documented rule at a few points: a lone sequence of 512 keys in 8 partitions of 64 keys;
 *     a batch of >= 128 sequences in partitions of >= 2048 keys; a smaller one split down to 512-key
 *     partitions until sequences x partitions >= 128; the 4096 / n_seqs cap; a forced split
 *     (part_keys 100 -> 128) and no split (-1);
 *   - the decode graphs' batch buckets (decode_graph_max, decode_graph_batch): 1, 2, 4, then multiples
 *     of 8, never above engine.cuda_graph_max_batch or max_num_seqs. */
#include <stdlib.h>

#include "gpu/gpu_test.h"

extern "C" {
#include "engine/decode_split.h"
}

#define H 40
#define D 128

static size_t need_bytes(int n_seqs, int n_part)
{
    return n_part > 1 ? (size_t)n_seqs * H * n_part * (4 * D + 8) : 0;
}

static void sweep(int n_seqs)
{
    const int max_ctx = 131072;
    long bad_cover = 0, bad_ws = 0, bad_mono = 0;
    int first_cover = 0, first_ws = 0, first_mono = 0;
    size_t prev_ws = 0;
    for (int ctx = 1; ctx <= max_ctx; ctx++) {
        int part = 0;
        const int n = k_attention_decode_parts(n_seqs, ctx, 0, &part);
        const bool covers =
            n == 1 ? part == ctx : part % 64 == 0 && (long)n * part >= ctx && (long)(n - 1) * part < ctx;
        if (!covers && !bad_cover++)
            first_cover = ctx;
        const size_t ws = k_attention_decode_workspace(n_seqs, H, D, ctx);
        if (need_bytes(n_seqs, n) > ws && !bad_ws++)
            first_ws = ctx;
        if (ws < prev_ws && !bad_mono++)
            first_mono = ctx;
        prev_ws = ws;
    }
    gt_check(bad_cover == 0, "%3d seqs: partitions cover every context 1..%d (%ld bad, first at %d)", n_seqs,
             max_ctx, bad_cover, first_cover);
    gt_check(bad_ws == 0 && bad_mono == 0,
             "%3d seqs: need <= workspace at every context, workspace non-decreasing (%ld / %ld bad, first "
             "at %d / %d)",
             n_seqs, bad_ws, bad_mono, first_ws, first_mono);
}

static void point(const char *what, int n_seqs, int ctx, int part_keys, int want_n, int want_part)
{
    int part = 0;
    const int n = k_attention_decode_parts(n_seqs, ctx, part_keys, &part);
    gt_check(n == want_n && part == want_part,
             "%s: %d seqs, ctx %d, part_keys %d: %d partitions of %d keys (want %d of %d)", what, n_seqs, ctx,
             part_keys, n, part, want_n, want_part);
}

int main(void)
{
    for (int n : {1, 2, 3, 4, 5, 8, 16, 31, 32, 33, 64, 256})
        sweep(n);

    point("lone sequence: 64-key partitions", 1, 512, 0, 8, 64);
    point("lone sequence: 10 partitions of 64", 1, 640, 0, 10, 64);
    point("lone sequence: at most 32 partitions short of 16k", 1, 4096, 0, 32, 128);
    point("lone sequence: 128 partitions past 64k", 1, 131072, 0, 128, 1024);
    point("4 sequences: 32 / 4 = 8 partitions", 4, 1000, 0, 8, 128);
    point("33 sequences: no partition below 512 keys", 33, 1000, 0, 1, 1000);
    point("33 sequences: 4 partitions for 132 >= 128", 33, 4096, 0, 4, 1024);
    point("8 sequences: >= 2048 keys a partition", 8, 65536, 0, 32, 2048);
    point("144 sequences: >= 2048 keys a partition", 144, 4352, 0, 2, 2176);
    point("256 sequences: one partition below 4096 keys", 256, 4095, 0, 1, 4095);
    point("256 sequences: the 4096 / n_seqs cap", 256, 65536, 0, 16, 4096);
    point("a single key", 1, 1, 0, 1, 1);
    point("forced 100 keys -> 128", 3, 1000, 100, 8, 128);
    point("no split", 1, 32768, -1, 1, 32768);

    const struct {
        int cap, max_seqs, want;
    } caps[] = {{0, 512, 512}, {512, 256, 256}, {16, 64, 16}, {1, 8, 1}};
    for (const auto &c : caps)
        gt_check(decode_graph_max(c.cap, c.max_seqs) == c.want, "graph cap %d, max_num_seqs %d: %d (want %d)",
                 c.cap, c.max_seqs, decode_graph_max(c.cap, c.max_seqs), c.want);
    const struct {
        int n, gmax, want;
    } buckets[] = {{1, 512, 1},     {2, 512, 2},     {3, 512, 4},  {5, 512, 8}, {13, 16, 16},
                   {500, 512, 504}, {509, 512, 512}, {13, 14, 14}, {3, 3, 3}};
    for (const auto &b : buckets)
        gt_check(decode_graph_batch(b.n, b.gmax) == b.want,
                 "graph batch of %d sequences, cap %d: %d (want %d)", b.n, b.gmax,
                 decode_graph_batch(b.n, b.gmax), b.want);

    printf("%s: %d of %d checks passed\n", gt_failures ? "FAIL" : "PASS", gt_passes, gt_passes + gt_failures);
    return gt_failures ? 1 : 0;
}
