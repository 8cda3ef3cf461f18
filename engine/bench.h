/* What `llmq bench` measures with: the named workloads, the roofline model of a step, a backend
 * wrapper that applies it to every step the engine runs, and percentiles.
 *
 * The roofline (docs/CUDA_BACKEND.md explains it): a step's ideal time is
 *     max(bytes / BENCH_COPY_BPS, flops / BENCH_BF16_FLOPS)
 * with bytes = every weight read once (bf16; the lm_head only when some row samples; the embedding
 * only the rows gathered) + K and V of every sequence's whole context read once + K and V of the new
 * tokens written, and flops = 2 * (linear weights) * tokens + 2 * V * C * sampled rows + attention
 * (4 * H * D per layer per query-key pair of the causal mask). Activations are not counted. The
 * rates are the H200's measured ceilings: 4.2 TB/s copy, 776 TFLOP/s dense bf16, 1416 TFLOP/s fp8.
 * With fp8 weights the linear weights count 1 byte each (their scales are 1/16384 of that) and their
 * flops run at the fp8 rate; with an fp8 KV cache a token's K and V count 2 * KVH * (D + 4) bytes a
 * layer (e4m3 codes and an fp32 scale per KV head); with an fp8 output projection (model.lm_head_dtype)
 * its V * C weights count 1 byte each and its flops run at the fp8 rate.
 *
 * Attention's part of the floor: per step max(K/V bytes read / BENCH_COPY_BPS, attention flops /
 * BENCH_BF16_FLOPS), never more than the step's ideal time (each term is part of the step's).
 *
 * Mixture of experts (engine/model.h): a MoE layer's router counts as a linear weight read and run by
 * every token; its experts are read as E (1 - (1 - K/E)^T) distinct experts of 3 FE C weights each (the
 * expected number under uniform routing of T tokens' K picks: all E once T K >> E) and run as K experts
 * per token. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/model.h"

#define BENCH_COPY_BPS 4.2e12
#define BENCH_BF16_FLOPS 776e12
#define BENCH_FP8_FLOPS 1416e12

struct bench_workload {
    const char *name;
    int requests, input_len, output_len;
};
/* mapreduce's requests are documents of BENCH_MAPREDUCE_DOC_LEN tokens, summarized in chunks of
 * input_len tokens of which BENCH_MAPREDUCE_OVERLAP are also the next chunk's (in proportion to
 * input_len when another is given), output_len tokens a summary (docs/BENCH.md). */
#define BENCH_MAPREDUCE_DOC_LEN 200000
#define BENCH_MAPREDUCE_OVERLAP 128
/* chat 1000 x 512 / 128, decode 512 x 128 / 1024, summarize 200 x 4096 / 256, longdoc 8 x 65536 / 256,
 * single 1 x 128 / 512 (DESIGN.md), mapreduce 50 documents in chunks of 8192 / 256. NULL for an
 * unknown name. */
const struct bench_workload *bench_workload_find(const char *name);
/* "chat, decode, summarize, longdoc, single, mapreduce" */
const char *bench_workload_names(void);

struct bench_roofline {
    bool fp8_weights, fp8_kv; /* set by the caller: what the backend stores (see above) */
    bool fp8_lm_head;         /* the output projection in fp8 (model.lm_head_dtype) */
    uint64_t steps, tokens, sampled;
    double bytes, flops;        /* summed over steps */
    double ideal_s;             /* sum of each step's max(bytes / bw, flops / rate) */
    double attn_ideal_s;        /* sum of each step's attention floor (above) */
    double compute_bound_steps; /* steps whose flops term was the larger */
};

/* Adds one step (the sequences a backend was given) to r for a model of config c. */
void bench_roofline_step(struct bench_roofline *r, const struct model_config *c, const struct be_seq *seqs,
                         int n);

/* A backend that runs `inner` and adds every step to *r (which must outlive it). Freeing it frees
 * inner. NULL when out of memory (inner is then freed too). */
struct backend *bench_wrap_backend(struct backend *inner, const struct model_config *c,
                                   struct bench_roofline *r);
/* The backend a wrapper runs (borrowed), or be itself when it is not a wrapper. */
struct backend *bench_inner_backend(struct backend *be);

/* The p-th percentile (0..100, linear interpolation between closest ranks, as numpy's default) of
 * v[0..n); sorts v in place. 0 when n is 0. */
double bench_percentile(double *v, size_t n, double p);
