// llmq_overlap_probe: can a large decode step's attention run beside its GEMMs? (docs/CUDA_BACKEND.md,
// "Where the model and the engine part")
//
// A decode step of B sequences runs, layer by layer, its projections and MLP (compute-bound at large
// B) and then its attention (bandwidth-bound), one after the other. Split into two nano-batches of B / 2
// on two streams, one half's attention could run while the other half's GEMMs run, if the two kinds of
// kernel can share the SMs. This program measures that on the real kernels, with the device split by
// green contexts (k SMs for attention, the rest for the GEMMs):
//   serial:  one layer of the step as the engine runs it: attention over B sequences, then the four
//            GEMMs of a Qwen3-14B layer at M = B, each on the whole device;
//   per k:   attention over B / 2 sequences alone on k SMs, the GEMMs at M = B / 2 alone on the rest,
//            both at once; a layer of two nano-batches takes about twice "both at once".
// The GEMMs are cuBLASLt's (bf16, the heuristic's first algorithm, told the SM count it runs on); the
// attention is k_attention_decode over a bf16 paged cache with shuffled blocks (bs 32).
//
// usage: llmq_overlap_probe [--batch B] [--ctx N] [--sms k1,k2,...] [--reps R]
// defaults: B 512, N 640 (chat's decode steps), k 16,32,48,64,80, R 50. Prints one table; exits 1 on
// a CUDA error, 77 without a GPU (or without green contexts: CUDA 12.4+ driver, sm_60+).
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#include "contrib/lab/probe_check.h"
#include "engine/util/mono.h"
#include "kernels/kernels.h"

#define CU(x)                                                                                                \
    do {                                                                                                     \
        if (CUresult r_ = (x))                                                                               \
            probe_fail(__FILE__, __LINE__, #x, "CUresult", (int)r_);                                         \
    } while (0)
#define LT(x)                                                                                                \
    do {                                                                                                     \
        if (cublasStatus_t s_ = (x))                                                                         \
            probe_fail(__FILE__, __LINE__, #x, "cuBLAS status", (int)s_);                                    \
    } while (0)

// The driver API through the runtime's entry points, so that the program needs no libcuda at link
// time and runs (to its skip) on machines without a GPU.
#define DRIVER_FNS(X)                                                                                        \
    X(cuDeviceGet)                                                                                           \
    X(cuDeviceGetDevResource)                                                                                \
    X(cuDevSmResourceSplitByCount)                                                                           \
    X(cuDevResourceGenerateDesc)                                                                             \
    X(cuGreenCtxCreate) X(cuGreenCtxStreamCreate) X(cuStreamDestroy) X(cuGreenCtxDestroy)
#define DECLARE_FN(name) static decltype(&name) p_##name;
DRIVER_FNS(DECLARE_FN)

static bool load_driver(void)
{
    cudaDriverEntryPointQueryResult q;
#define LOAD_FN(name)                                                                                        \
    if (cudaGetDriverEntryPointByVersion(#name, (void **)&p_##name, CUDA_VERSION, cudaEnableDefault, &q) !=  \
            cudaSuccess ||                                                                                   \
        q != cudaDriverEntryPointSuccess || !p_##name)                                                       \
        return false;
    DRIVER_FNS(LOAD_FN)
    return true;
}

// Qwen3-14B
static const int C = 5120, F = 17408, H = 40, KVH = 8, D = 128, BS = 32;

__global__ void fill_kernel(__nv_bfloat16 *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = __float2bfloat16(((float)(h & 0xffffu) / 65536.f - 0.5f) * 0.25f);
    }
}

static __nv_bfloat16 *rand_bf16(size_t n, uint32_t seed)
{
    __nv_bfloat16 *p = NULL;
    CK(cudaMalloc(&p, n * sizeof *p));
    fill_kernel<<<1024, 256>>>(p, n, seed);
    CK(cudaGetLastError());
    return p;
}

// One GEMM Y[M, N] = X[M, K] W[N, K]^T in bf16 through cuBLASLt, planned for `sms` SMs.
struct gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    const __nv_bfloat16 *X, *W;
    __nv_bfloat16 *Y;
};

static void gemm_plan(cublasLtHandle_t lt, gemm *g, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                      __nv_bfloat16 *Y, int M, int N, int K, int sms, size_t ws_bytes)
{
    g->X = X, g->W = W, g->Y = Y;
    LT(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
    // column-major: Y^T [N, M] = W [K, N]^T X^T [K, M]
    LT(cublasLtMatrixLayoutCreate(&g->a, CUDA_R_16BF, K, N, K));
    LT(cublasLtMatrixLayoutCreate(&g->b, CUDA_R_16BF, K, M, K));
    LT(cublasLtMatrixLayoutCreate(&g->c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->a, g->b, g->c, g->c, pref, 1, &res, &found));
    if (found < 1) {
        fprintf(stderr, "no cuBLASLt algorithm for M %d N %d K %d\n", M, N, K);
        exit(1);
    }
    g->algo = res.algo;
    LT(cublasLtMatmulPreferenceDestroy(pref));
}

static void gemm_run(cublasLtHandle_t lt, const gemm *g, void *ws, size_t ws_bytes, cudaStream_t s)
{
    const float one = 1.f, zero = 0.f;
    LT(cublasLtMatmul(lt, g->desc, &one, g->W, g->a, g->X, g->b, &zero, g->Y, g->c, g->Y, g->c, &g->algo, ws,
                      ws_bytes, s));
}

// A layer's four GEMMs at M rows (QKV, o_proj, gate/up, down) planned for `sms` SMs, with their workspace.
struct layer_gemms {
    gemm g[4];
    void *ws;
    size_t ws_bytes;
    __nv_bfloat16 *x, *y; /* operands: x [M, F] (the first M x K of it), y [M, 2F] */
};

struct weights {
    __nv_bfloat16 *qkv, *o, *gu, *down;
};

static void layer_plan(cublasLtHandle_t lt, layer_gemms *L, const weights &w, int M, int sms)
{
    L->ws_bytes = 32u << 20;
    CK(cudaMalloc(&L->ws, L->ws_bytes));
    const int QKV = (H + 2 * KVH) * D;
    __nv_bfloat16 *x = L->x = rand_bf16((size_t)M * F, 11), *y = L->y = rand_bf16((size_t)M * 2 * F, 12);
    gemm_plan(lt, &L->g[0], x, w.qkv, y, M, QKV, C, sms, L->ws_bytes);
    gemm_plan(lt, &L->g[1], x, w.o, y, M, C, H * D, sms, L->ws_bytes);
    gemm_plan(lt, &L->g[2], x, w.gu, y, M, 2 * F, C, sms, L->ws_bytes);
    gemm_plan(lt, &L->g[3], x, w.down, y, M, C, F, sms, L->ws_bytes);
}

static void layer_free(layer_gemms *L)
{
    for (int i = 0; i < 4; i++) {
        cublasLtMatmulDescDestroy(L->g[i].desc);
        cublasLtMatrixLayoutDestroy(L->g[i].a);
        cublasLtMatrixLayoutDestroy(L->g[i].b);
        cublasLtMatrixLayoutDestroy(L->g[i].c);
    }
    cudaFree(L->ws), cudaFree(L->x), cudaFree(L->y);
}

static void layer_run(cublasLtHandle_t lt, const layer_gemms *L, cudaStream_t s)
{
    for (int i = 0; i < 4; i++)
        gemm_run(lt, &L->g[i], L->ws, L->ws_bytes, s);
}

// The decode attention of n sequences of ctx keys each over a shuffled paged cache.
struct attn {
    k_attn_batch b;
    __nv_bfloat16 *q, *out;
    const __nv_bfloat16 *k, *v;
    void *ws;
    size_t ws_bytes;
};

static void attn_plan(attn *a, int n, int ctx, const __nv_bfloat16 *k, const __nv_bfloat16 *v, int n_blocks,
                      uint32_t seed)
{
    const int mb = (ctx + BS - 1) / BS;
    std::vector<int32_t> qs(n), cl(n, ctx), bt((size_t)n * mb);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        qs[i] = i;
        for (int j = 0; j < mb; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            bt[(size_t)i * mb + j] = (int32_t)(s % (uint64_t)n_blocks);
        }
    }
    int32_t *d = NULL;
    CK(cudaMalloc(&d, (2 * (size_t)n + bt.size()) * sizeof *d));
    CK(cudaMemcpy(d, qs.data(), n * sizeof *d, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d + n, cl.data(), n * sizeof *d, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d + 2 * n, bt.data(), bt.size() * sizeof *d, cudaMemcpyHostToDevice));
    a->b = k_attn_batch{n, d, d + n, d + 2 * n, mb, 1, ctx};
    a->q = rand_bf16((size_t)n * H * D, seed + 1);
    CK(cudaMalloc(&a->out, (size_t)n * H * D * sizeof *a->out));
    a->k = k, a->v = v;
    a->ws_bytes = k_attention_decode_workspace(n, H, D, ctx);
    CK(cudaMalloc(&a->ws, a->ws_bytes ? a->ws_bytes : 16));
}

static void attn_run(const attn *a, cudaStream_t s)
{
    if (k_attention_decode(a->q, H * D, a->k, a->v, &a->b, a->out, H, KVH, D, BS, 0.0883883f, a->ws,
                           a->ws_bytes, s)) {
        fprintf(stderr, "k_attention_decode: %s\n", k_last_error());
        exit(1);
    }
}

// Seconds a repetition of once() (which enqueues on the streams given), over reps after one warm-up
// (host clock, the streams synchronized).
template <typename Fn> static double timed(int reps, Fn once, std::vector<cudaStream_t> streams)
{
    once();
    for (cudaStream_t s : streams)
        CK(cudaStreamSynchronize(s));
    const double t0 = llmq_mono_s();
    for (int i = 0; i < reps; i++)
        once();
    for (cudaStream_t s : streams)
        CK(cudaStreamSynchronize(s));
    return (llmq_mono_s() - t0) / reps;
}

int main(int argc, char **argv)
{
    int B = 512, ctx = 640, reps = 50;
    std::vector<int> sms = {16, 32, 48, 64, 80};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sms") && i + 1 < argc) {
            sms.clear();
            for (char *p = strtok(argv[++i], ","); p; p = strtok(NULL, ","))
                sms.push_back(atoi(p));
        } else {
            fprintf(stderr, "usage: %s [--batch B] [--ctx N] [--sms k1,k2,...] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (B < 2 || B % 2 || ctx < 1 || reps < 1 || sms.empty()) {
        fprintf(stderr, "--batch must be even and >= 2, --ctx and --reps >= 1, --sms not empty\n");
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    CK(cudaSetDevice(0));
    CK(cudaFree(0)); // the primary context, which the green contexts retain
    CUdevice dev;
    CUdevResource all;
    if (!load_driver() || p_cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        p_cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS) {
        printf("skipped: this driver has no green contexts\n");
        return 77;
    }
    const int n_sm = (int)all.sm.smCount;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));

    // one layer's weights, the cache (every sequence's blocks drawn from a pool 4x their number)
    weights w;
    w.qkv = rand_bf16((size_t)(H + 2 * KVH) * D * C, 1);
    w.o = rand_bf16((size_t)C * H * D, 2);
    w.gu = rand_bf16((size_t)2 * F * C, 3);
    w.down = rand_bf16((size_t)C * F, 4);
    const int n_blocks = 4 * B * ((ctx + BS - 1) / BS);
    const size_t cache_elems = (size_t)n_blocks * KVH * BS * D;
    const __nv_bfloat16 *kc = rand_bf16(cache_elems, 5), *vc = rand_bf16(cache_elems, 6);
    attn full_attn, half_attn;
    attn_plan(&full_attn, B, ctx, kc, vc, n_blocks, 7);
    attn_plan(&half_attn, B / 2, ctx, kc, vc, n_blocks, 8);
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    layer_gemms full_gemm;
    layer_plan(lt, &full_gemm, w, B, n_sm);
    CK(cudaDeviceSynchronize());

    const double kv_bytes = (double)B * ctx * KVH * D * 2 * 2; /* K and V, bf16 */
    const double flops = 2.0 * B * ((double)(H + 2 * KVH) * D * C + (double)C * H * D + 3.0 * F * C);
    const double t_att = timed(reps, [&] { attn_run(&full_attn, s0); }, {s0});
    const double t_gem = timed(reps, [&] { layer_run(lt, &full_gemm, s0); }, {s0});
    printf("%s, %d SMs: a decode step of %d sequences x %d keys, one Qwen3-14B layer (bf16)\n", prop.name,
           n_sm, B, ctx);
    printf("serial on all SMs: attention %.3f ms (%.0f GB/s) + GEMMs at M = %d %.3f ms (%.0f TFLOP/s) = %.3f "
           "ms\n",
           t_att * 1e3, kv_bytes / t_att * 1e-9, B, t_gem * 1e3, flops / t_gem * 1e-12,
           (t_att + t_gem) * 1e3);
    printf("\n%8s %8s %14s %14s %12s %16s %8s\n", "attn SMs", "GEMM SMs", "attn B/2, ms", "GEMMs B/2, ms",
           "both, ms", "2 x both, ms", "vs serial");
    for (int k : sms) {
        CUdevResource part, rest;
        unsigned int n_groups = 1;
        if (p_cuDevSmResourceSplitByCount(&part, &n_groups, &all, &rest, 0, (unsigned)k) != CUDA_SUCCESS ||
            n_groups < 1 || rest.sm.smCount == 0) {
            printf("%8d  (no split of %d SMs into %d and the rest)\n", k, n_sm, k);
            continue;
        }
        CUdevResourceDesc da, db;
        CU(p_cuDevResourceGenerateDesc(&da, &part, 1));
        CU(p_cuDevResourceGenerateDesc(&db, &rest, 1));
        CUgreenCtx ga, gb;
        CU(p_cuGreenCtxCreate(&ga, da, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CU(p_cuGreenCtxCreate(&gb, db, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CUstream sa, sb;
        CU(p_cuGreenCtxStreamCreate(&sa, ga, CU_STREAM_NON_BLOCKING, 0));
        CU(p_cuGreenCtxStreamCreate(&sb, gb, CU_STREAM_NON_BLOCKING, 0));
        layer_gemms half_gemm;
        layer_plan(lt, &half_gemm, w, B / 2, (int)rest.sm.smCount);
        CK(cudaDeviceSynchronize());
        const double ta = timed(reps, [&] { attn_run(&half_attn, sa); }, {sa});
        const double tg = timed(reps, [&] { layer_run(lt, &half_gemm, sb); }, {sb});
        const double tb =
            timed(reps, [&] { attn_run(&half_attn, sa), layer_run(lt, &half_gemm, sb); }, {sa, sb});
        printf("%8u %8u %14.3f %14.3f %12.3f %16.3f %7.2fx\n", part.sm.smCount, rest.sm.smCount, ta * 1e3,
               tg * 1e3, tb * 1e3, 2 * tb * 1e3, (t_att + t_gem) / (2 * tb));
        CK(cudaStreamSynchronize(sa));
        CK(cudaStreamSynchronize(sb));
        layer_free(&half_gemm);
        CU(p_cuStreamDestroy(sa));
        CU(p_cuStreamDestroy(sb));
        CU(p_cuGreenCtxDestroy(ga));
        CU(p_cuGreenCtxDestroy(gb));
    }
    printf("\n(vs serial > 1: two nano-batches on split SMs would beat the engine's serial layer; the GEMM\n"
           "operands of each row are fresh, the attention's K/V the same cache)\n");
    return 0;
}
