// The guessed next decode step (docs/CUDA_BACKEND.md, "Hiding the host's turn between decode steps").
//
// At one sequence a decode step leaves the GPU idle for tens of microseconds between steps: the copy back,
// the host's wake-up and bookkeeping, the next step's uploads and launch. After a pure decode
// graph step whose sequences all allow it, the backend enqueues the next step before it reads this
// one's tokens: a small kernel turns
// the sampled tokens into the next step's inputs in the device buffers the graph reads (token, position,
// KV slot and context length one on, the sampler's step count one on), then the same graph, the sampler
// and the copy back into a second host buffer. The next call compares the step it is given with the
// guess, input by input as the host would have written them; on a match it enqueues the guess after
// that one, waits for the guessed step's outputs and returns them; otherwise it waits for the stream and
// runs the step as usual. Either way the step's results are those of the same graph on the same inputs.
//
// A guess is made only when (a) every sequence samples with no token history and nothing banned (so
// the sampler's inputs other than its step count stay as they are), (b) its next position lies in a
// block it holds: the block it writes now, or the next one, which the scheduler hands out a step early
// when it is free (engine/scheduler.h, "Lookahead"; the advance kernel then puts it into the device's
// block-table row and starts the slot there; at most K_SPEC_NEW_BLOCKS such rows), (c) its next context stays
// in the graph's context bucket and in max_model_len, and (d) the step has at most spec.max sequences
// (CB_SPEC_MAX, 4: the latency regime; in throughput runs sequences end and arrive at most steps, and a
// wrong guess costs a whole step of GPU time; a test turns guessing off: backend_test_opts.no_step_guess). A
// dropped guess leaves one K/V row per sequence written at the position after its last token, inside the
// block it was writing, which it owns alone (prefix caching shares only full blocks): whoever holds that
// block later writes its own rows before reading them and never reads past its context, so nothing anyone
// reads changes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_backend.cuh"

extern "C" {
#include "engine/util/log.h"
}

// The blocks the guessed step's rows enter (by value: the host knows them when it enqueues the guess,
// and nothing may be uploaded between the running step and the guess). -1: the row stays in its block.
#define K_SPEC_NEW_BLOCKS 32
struct spec_new_blocks {
    int32_t blk[K_SPEC_NEW_BLOCKS];
};

// rows 0 .. nd-1 of a pure decode graph step, one position on; a row whose next position starts a
// block gets that block in its block-table row (stride mb) and its slot at the block's start
__global__ void spec_advance_kernel(const int32_t *__restrict__ tok, int nd, int32_t *__restrict__ ids,
                                    int32_t *__restrict__ pos, int32_t *__restrict__ slot,
                                    int32_t *__restrict__ ctx, struct k_sample_params *__restrict__ params,
                                    int32_t *__restrict__ btab, int mb, int bs, struct spec_new_blocks nb)
{
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nd)
        return;
    const int p = pos[k] + 1;
    const int32_t blk = k < K_SPEC_NEW_BLOCKS ? nb.blk[k] : -1;
    ids[k] = tok[k];
    pos[k] = p;
    if (blk >= 0) {
        btab[(size_t)k * mb + p / bs] = blk;
        slot[k] = blk * bs;
    } else {
        slot[k] += 1;
    }
    ctx[k] += 1;
    params[k].step += 1;
}

int cb_spec_init(struct cuda_backend *b, int max)
{
    cudaError_t e;
    if ((e = cudaEventCreateWithFlags(&b->copy.ev_out, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->spec.ev[0], cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->spec.ev[1], cudaEventDisableTiming)) != cudaSuccess)
        return cb_fail_cuda(b, __FILE__, __LINE__, "cudaEventCreateWithFlags", e);
    if ((e = cudaStreamCreateWithFlags(&b->copy.stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->copy.ev_sampled, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->copy.ev_copied, cudaEventDisableTiming)) != cudaSuccess)
        return cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamCreateWithFlags(copy back)", e);
    const int m = max < b->max_seqs ? max : b->max_seqs;
    b->spec.max = m;
    if (m == 0)
        return 0;
    b->spec.ids = (int32_t *)calloc((size_t)m, 4);
    b->spec.pos = (int32_t *)calloc((size_t)m, 4);
    b->spec.slot = (int32_t *)calloc((size_t)m, 4);
    b->spec.btab = (int32_t *)calloc((size_t)m * b->max_blocks, 4);
    b->spec.params = (struct k_sample_params *)calloc((size_t)m, sizeof *b->spec.params);
    if (!b->spec.ids || !b->spec.pos || !b->spec.slot || !b->spec.btab || !b->spec.params) {
        snprintf(b->base.err, sizeof b->base.err, "out of host memory");
        return -1;
    }
    if ((e = cudaHostAlloc(&b->spec.out_h, b->io.out.cap, cudaHostAllocDefault)) != cudaSuccess) {
        b->spec.out_h = NULL;
        return cb_fail_cuda(b, __FILE__, __LINE__, "cudaHostAlloc(guessed step outputs)", e);
    }
    log_info("cuda backend: decode steps of up to %d sequences are guessed one step ahead", m);
    return 0;
}

void cb_spec_free(struct cuda_backend *b)
{
    if (b->spec.max > 0)
        log_info("cuda backend: guessed steps taken %llu, dropped %llu", (unsigned long long)b->spec.hits,
                 (unsigned long long)b->spec.misses);
    if (b->copy.ev_out)
        cudaEventDestroy(b->copy.ev_out);
    if (b->copy.ev_sampled)
        cudaEventDestroy(b->copy.ev_sampled);
    if (b->copy.ev_copied)
        cudaEventDestroy(b->copy.ev_copied);
    if (b->copy.stream)
        cudaStreamDestroy(b->copy.stream);
    for (int i = 0; i < 2; i++)
        if (b->spec.ev[i])
            cudaEventDestroy(b->spec.ev[i]);
    free(b->spec.ids);
    free(b->spec.pos);
    free(b->spec.slot);
    free(b->spec.btab);
    free(b->spec.params);
    if (b->spec.out_h)
        cudaFreeHost(b->spec.out_h);
}

void cb_spec_guess(struct cuda_backend *b, const struct be_seq *seqs, int nd, int B, int gctx)
{
    if (b->spec.live || nd < 1 || nd > b->spec.max)
        return;
    const int bs = b->base.block_size;
    struct spec_new_blocks nb;
    bool block = false;
    for (int k = 0; k < nd; k++) {
        const struct be_seq *s = &seqs[b->io.order[k]];
        const int next = s->pos + 1; // the guessed step's position; its context is next + 1
        if (!s->sample || !cb_plain_sampling(s) || next + 1 > gctx || next + 1 > b->max_model_len)
            return;
        const bool enters = next % bs == 0; // a block it holds (the lookahead) or none
        if (enters && (next / bs >= s->n_blocks || k >= K_SPEC_NEW_BLOCKS))
            return;
        if (k < K_SPEC_NEW_BLOCKS)
            nb.blk[k] = enters ? s->block_table[next / bs] : -1;
        block |= enters;
    }
    cudaGraphExec_t ex = cb_graph_find(b, B, gctx);
    if (!ex)
        return;
    const int ev = b->spec.ev_i ^ 1;
    spec_advance_kernel<<<(nd + 127) / 128, 128, 0, b->stream>>>(
        (const int32_t *)b->io.out.d, nd, (int32_t *)b->io.ids.d, (int32_t *)b->io.pos.d,
        (int32_t *)b->io.slot.d, (int32_t *)b->io.ctx_dec.d, (struct k_sample_params *)b->io.params.d,
        (int32_t *)b->io.btab_dec.d, (gctx + bs - 1) / bs, bs, nb);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaGraphLaunch(ex, b->stream);
    if (e != cudaSuccess || cb_enqueue_sample(b, seqs, nd, b->spec.out_h, b->spec.ev[ev])) {
        // the step before is enqueued and unaffected; the next step uploads all of its inputs again
        log_warn("cuda backend: enqueuing a guessed step failed (%s); steps are no longer guessed",
                 e != cudaSuccess ? cudaGetErrorString(e) : b->base.err);
        b->base.err[0] = 0;
        b->spec.max = 0;
        return;
    }
    b->graphs.replays++;
    b->spec.live = true;
    b->spec.block = block;
    b->spec.ev_i = ev;
    b->spec.nd = nd, b->spec.B = B, b->spec.gctx = gctx;
    b->spec.mb = (gctx + bs - 1) / bs;
    for (int k = 0; k < nd; k++) { // what the host would write for it (the tokens: cb_spec_expect)
        const struct be_seq *s = &seqs[b->io.order[k]];
        b->spec.pos[k] = s->pos + 1;
        b->spec.slot[k] = cb_slot(s, s->pos + 1, bs);
        // the blocks its context needs (past them the device's row is block 0 in both steps, but for
        // a block the advance kernel put there, which the step after reads too)
        memcpy(b->spec.btab + (size_t)k * b->spec.mb, s->block_table,
               (size_t)((s->pos + 2 + bs - 1) / bs) * 4);
        cb_sample_params(s, &b->spec.params[k]);
        b->spec.params[k].step += 1;
    }
}

void cb_spec_expect(struct cuda_backend *b, int nd, const int32_t *tok)
{
    for (int k = 0; k < nd && k < b->spec.nd; k++)
        b->spec.ids[k] = tok[k];
}

// Whether the step of seqs is the guessed one: every input as the host would write it.
static bool spec_matches(const struct cuda_backend *b, const struct be_seq *seqs, int n)
{
    if (n != b->spec.nd || !b->graphs.on || n > b->graphs.max_batch || cb_graph_batch(b, n) != b->spec.B)
        return false;
    const int bs = b->base.block_size;
    int max_ctx = 0;
    for (int i = 0; i < n; i++) {
        const struct be_seq *s = &seqs[i];
        if (s->n_new != 1 || !s->sample || !cb_plain_sampling(s) || s->pos != b->spec.pos[i] ||
            s->tokens[s->pos] != b->spec.ids[i] || cb_slot(s, s->pos, bs) != b->spec.slot[i])
            return false;
        // the position matched, so the blocks its context needs are as many as the guess copied
        if (memcmp(b->spec.btab + (size_t)i * b->spec.mb, s->block_table,
                   (size_t)((s->pos + 1 + bs - 1) / bs) * 4))
            return false;
        struct k_sample_params q;
        cb_sample_params(s, &q);
        if (memcmp(&q, &b->spec.params[i], sizeof q))
            return false;
        max_ctx = s->pos + 1 > max_ctx ? s->pos + 1 : max_ctx;
    }
    return cb_graph_ctx(b, max_ctx) == b->spec.gctx;
}

bool cb_spec_take(struct cuda_backend *b, const struct be_seq *seqs, int n, struct be_out *out, int *rc)
{
    b->spec.live = false;
    cudaError_t e;
    if (!spec_matches(b, seqs, n)) {
        b->spec.misses++;
        if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess) {
            *rc = cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize", e);
            return true;
        }
        return false;
    }
    b->spec.hits++;
    b->spec.hits_block += b->spec.block;
    // its outputs are on their way into spec.out_h: that buffer becomes io.out.h, and the next guess,
    // enqueued behind it before waiting, copies into the other one
    void *h = b->io.out.h;
    b->io.out.h = b->spec.out_h;
    b->spec.out_h = h;
    const int ev = b->spec.ev_i;
    for (int j = 0; j < n; j++)
        b->io.row_seq[j] = j, b->io.order[j] = j;
    cb_spec_guess(b, seqs, n, b->spec.B, b->spec.gctx);
    if ((e = cudaEventSynchronize(b->spec.ev[ev])) != cudaSuccess) {
        *rc = cb_fail_cuda(b, __FILE__, __LINE__, "cudaEventSynchronize", e);
        return true;
    }
    *rc = cb_read_outputs(b, seqs, n, b->io.out.h, out);
    if (*rc == 0 && b->spec.live)
        cb_spec_expect(b, n, (const int32_t *)b->io.out.h);
    return true;
}
