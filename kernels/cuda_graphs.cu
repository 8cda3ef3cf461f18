// Decode steps as CUDA graphs (see cuda_backend.cuh).
//
// A pure decode step (every sequence runs one token) is padded to a batch bucket (1, 2, 4, then
// multiples of 8 up to max_num_seqs) with dummy rows (token 0, position 0, KV slot -1 so nothing is
// written, one key of block 0 to attend to; their logits are computed and ignored), and its decode
// attention is sized for a context bucket (512 * 2^k up to max_model_len): the kernels' grids and
// the block-table stride are frozen into the graph, so a graph serves every step whose longest
// context fits its bucket. A graph reads only fixed device buffers (ids, positions, slots, ctx_len,
// block tables), which the step fills before the replay; sampling runs after it, outside.
//
// The first step of a bucket runs eagerly (which also warms the cuBLASLt algorithm cache for its
// shapes), then the same plan is captured and instantiated; later steps of the bucket replay it.
// A capture that fails is logged once and graphs are turned off: the step itself already ran.
#include <stdio.h>
#include <time.h>

#include "kernels/cuda_backend.cuh"

extern "C" {
#include "engine/decode_split.h"
#include "engine/util/log.h"
#include "engine/util/mono.h"
}

int cb_graph_batch(const struct cuda_backend *b, int n)
{
    return decode_graph_batch(n, b->graphs.max_batch);
}

int cb_graph_ctx(const struct cuda_backend *b, int ctx)
{
    return decode_graph_ctx(ctx, b->max_model_len, b->base.block_size);
}

// Captures plan p into a new graph; 0 when stored, -1 when capture is not possible (graphs are then
// turned off; the error is logged, not returned: the step already ran).
static int capture(struct cuda_backend *b, const struct cb_plan *p, int batch, int ctx)
{
    double t0 = llmq_mono_ms();
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    char why[sizeof b->base.err];
    why[0] = 0;
    cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        snprintf(why, sizeof why, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    } else {
        int rc = cb_forward(b, p);
        if (rc)
            snprintf(why, sizeof why, "%s", b->base.err);
        e = cudaStreamEndCapture(b->stream, &g);
        if (!rc && e != cudaSuccess)
            snprintf(why, sizeof why, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
        if (!why[0]) {
            e = cudaGraphInstantiate(&ex, g, 0);
            if (e != cudaSuccess) {
                snprintf(why, sizeof why, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
                ex = NULL;
            }
        }
    }
    if (g)
        cudaGraphDestroy(g);
    if (why[0]) {
        (void)cudaGetLastError();
        b->base.err[0] = 0;
        b->graphs.on = false;
        b->graphs.captures_failed++;
        log_warn(
            "cuda backend: capturing the decode graph for batch %d, context %d failed (%s); decode steps run "
            "eagerly from now on",
            batch, ctx, why);
        return -1;
    }
    struct cb_graph *gr = &b->graphs.g[b->graphs.n++];
    gr->batch = batch;
    gr->ctx = ctx;
    gr->exec = ex;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > b->peak_used)
        b->peak_used = tot - fr;
    log_info("cuda backend: decode graph %d captured: batch %d, context <= %d, %.1f ms", b->graphs.n, batch,
             ctx, llmq_mono_ms() - t0);
    return 0;
}

int cb_graph_run(struct cuda_backend *b, const struct cb_plan *p, int batch, int ctx)
{
    for (int i = 0; i < b->graphs.n; i++)
        if (b->graphs.g[i].batch == batch && b->graphs.g[i].ctx == ctx) {
            CB_CUDA(cudaGraphLaunch(b->graphs.g[i].exec, b->stream));
            b->graphs.replays++;
            return 0;
        }
    if (cb_forward(b, p))
        return -1;
    b->graphs.eager_steps++;
    if (b->graphs.n < CB_MAX_GRAPHS)
        capture(b, p, batch, ctx);
    return 0;
}

cudaGraphExec_t cb_graph_find(const struct cuda_backend *b, int batch, int ctx)
{
    for (int i = 0; i < b->graphs.n; i++)
        if (b->graphs.g[i].batch == batch && b->graphs.g[i].ctx == ctx)
            return b->graphs.g[i].exec;
    return NULL;
}

void cb_graphs_free(struct cuda_backend *b)
{
    for (int i = 0; i < b->graphs.n; i++)
        if (b->graphs.g[i].exec)
            cudaGraphExecDestroy(b->graphs.g[i].exec);
    b->graphs.n = 0;
}
