// GEMMs through cuBLASLt: Y[M, N] = X[M, K] . W[N, K]^T, bf16 in, fp32 accumulation, bf16 or fp32 out.
//
// cuBLASLt is column-major. Row-major W[N, K] is the column-major K x N matrix (ld K), row-major
// X[M, K] is column-major K x M (ld K) and row-major Y[M, N] is column-major N x M (ld N), so
//     D (N x M) = op(A) . B   with A = W (K x N, ld K, op T) and B = X (K x M, ld K, op N).
//
// A plan (operation and layout descriptors, and the algorithm from cublasLtMatmulAlgoGetHeuristic)
// is made the first time a (M, N, K, out type, pointer alignments) key is seen and cached in an
// open-addressing hash table that grows; later calls are one lookup and one cublasLtMatmul. The
// alignments (the largest power of two <= 256 dividing each pointer) are part of the key because
// the heuristic is told them: an algorithm chosen for 256-byte-aligned buffers may not run on a
// pointer into the middle of a buffer. cuBLASLt's bf16 tensor-core kernels want 16-byte aligned
// rows (K and N multiples of 8); other shapes get whatever the heuristic offers, or a clean error.
// Everything is host work except the matmul itself, so a plan made before graph capture replays.
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

// ---- plans and their cache

struct gemm_key {
    int M, N, K, y_f32;
    int align_x, align_w, align_y; // bytes, 2..256
};

struct gemm_plan {
    bool used;
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d; // W, X, Y (Y is both C and D)
    cublasLtMatmulAlgo_t algo;
};

struct k_gemm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    gemm_plan *plans; // [cap], cap a power of two, at most half full
    int cap, n;
    bool log; // LLMQ_GEMM_LOG set: one stderr line per new plan (the algorithm the heuristic chose)
};

static int align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al)
        al >>= 1;
    return al;
}

static bool key_eq(const gemm_key &x, const gemm_key &y)
{
    return !memcmp(&x, &y, sizeof x);
}

static uint32_t key_hash(const gemm_key &k)
{
    uint64_t h = 1469598103934665603ull; // FNV-1a over the key's ints, then a final mix
    const int v[7] = {k.M, k.N, k.K, k.y_f32, k.align_x, k.align_w, k.align_y};
    for (int i = 0; i < 7; i++)
        h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

static void plan_destroy(gemm_plan *p)
{
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

// Reports a cuBLAS failure with the call and the shape; returns -1.
static int lt_fail(const char *file, int line, const char *call, cublasStatus_t s, const gemm_key &k)
{
    return k_failf(file, line,
                   "%s: %s (%d) for Y[%d, %d] = X[%d, %d] . W[%d, %d]^T, %s out, alignments X %d W %d Y %d",
                   call, cublasLtGetStatusString(s), (int)s, k.M, k.N, k.M, k.K, k.N, k.K,
                   k.y_f32 ? "fp32" : "bf16", k.align_x, k.align_w, k.align_y);
}
#define LT_CHECK(name, call)                                                                                 \
    do {                                                                                                     \
        cublasStatus_t s_ = (call);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                   \
            plan_destroy(p);                                                                                 \
            return lt_fail(__FILE__, __LINE__, name, s_, p_key);                                             \
        }                                                                                                    \
    } while (0)

// Skinny GEMMs (decode steps: M <= GEMM_TUNE_MAX_M) are weight-bandwidth bound, and the heuristic's
// first pick moves the weights at only ~50% of the copy bandwidth for some Qwen3-14B shapes (QKV,
// o_proj at M = 1). For those, the first call times the heuristic's best GEMM_TUNE_CANDIDATES
// algorithms on the call's own operands (one warm-up, then the median of three) and keeps the
// fastest. Not while the stream is being captured into a graph (then the first pick is kept; the
// backend runs each graph's step eagerly once before capturing it, so its plans are tuned).
#define GEMM_TUNE_CANDIDATES 8
#define GEMM_TUNE_MAX_M 256

struct gemm_tune {
    const void *X, *W;
    void *Y;
    cudaStream_t stream;
};

// Returns the index of the fastest candidate that runs; 0 when timing is not possible.
static int plan_tune(struct k_gemm *g, gemm_plan *p, const cublasLtMatmulHeuristicResult_t *cand, int n,
                     const gemm_tune *t)
{
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess)
        return 0;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return 0;
    }
    const float alpha = 1.f, beta = 0.f;
    int best = 0;
    float best_ms = 1e30f;
    for (int c = 0; c < n; c++) {
        if (cand[c].state != CUBLAS_STATUS_SUCCESS || cand[c].workspaceSize > g->ws_bytes)
            continue;
        float ms[3];
        bool ok = true;
        for (int r = -1; r < 3 && ok; r++) {
            ok = cudaEventRecord(e0, t->stream) == cudaSuccess &&
                 cublasLtMatmul(g->lt, p->op, &alpha, t->W, p->a, t->X, p->b, &beta, t->Y, p->d, t->Y, p->d,
                                &cand[c].algo, g->ws, g->ws_bytes, t->stream) == CUBLAS_STATUS_SUCCESS &&
                 cudaEventRecord(e1, t->stream) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess;
            if (ok && r >= 0)
                ok = cudaEventElapsedTime(&ms[r], e0, e1) == cudaSuccess;
        }
        if (!ok) {
            (void)cudaGetLastError();
            continue;
        }
        float med = ms[0] < ms[1] ? (ms[1] < ms[2] ? ms[1] : (ms[0] < ms[2] ? ms[2] : ms[0]))
                                  : (ms[0] < ms[2] ? ms[0] : (ms[1] < ms[2] ? ms[2] : ms[1]));
        if (med < best_ms)
            best_ms = med, best = c;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (g->log)
        fprintf(stderr, "gemm tune M %d N %d K %d: %d candidates, chose #%d (%.1f us)\n", p->key.M, p->key.N,
                p->key.K, n, best, best_ms * 1000.f);
    return best;
}

// Makes the descriptors and picks the algorithm for key into *p (timing candidates when tune is
// not NULL); on failure *p is left empty.
static int plan_make(struct k_gemm *g, const gemm_key &p_key, gemm_plan *p, const gemm_tune *tune)
{
    memset(p, 0, sizeof *p);
    const gemm_key &k = p_key;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK("cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK("cublasLtMatmulDescSetAttribute(TRANSA)",
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK("cublasLtMatmulDescSetAttribute(TRANSB)",
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK("cublasLtMatrixLayoutCreate(W)", cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k.K, k.N, k.K));
    LT_CHECK("cublasLtMatrixLayoutCreate(X)", cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k.K, k.M, k.K));
    LT_CHECK("cublasLtMatrixLayoutCreate(Y)",
             cublasLtMatrixLayoutCreate(&p->d, k.y_f32 ? CUDA_R_32F : CUDA_R_16BF, k.N, k.M, k.N));

    cublasLtMatmulPreference_t pref = NULL;
    LT_CHECK("cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = g->ws_bytes;
    const uint32_t al[4] = {(uint32_t)k.align_w, (uint32_t)k.align_x, (uint32_t)k.align_y,
                            (uint32_t)k.align_y};
    cublasStatus_t s =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]);
    // split-K partial sums in fp32 only: bf16 partials (the in-place and output-type schemes) would
    // round more than once and break "fp32 accumulation, one rounding"
    const uint32_t schemes =
        k.y_f32 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK : (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                 sizeof schemes);
    cublasLtMatmulHeuristicResult_t cand[GEMM_TUNE_CANDIDATES];
    memset(cand, 0, sizeof cand);
    int found = 0;
    const int want = (tune && k.M <= GEMM_TUNE_MAX_M) ? GEMM_TUNE_CANDIDATES : 1;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->d, p->d, pref, want, cand, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    LT_CHECK("cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape and alignment)", s);
    LT_CHECK("cublasLtMatmulAlgoGetHeuristic (result)", cand[0].state);
    p->key = k;
    int best = found > 1 ? plan_tune(g, p, cand, found, tune) : 0;
    const cublasLtMatmulHeuristicResult_t &res = cand[best];
    p->algo = res.algo;
    p->key = k;
    p->used = true;
    if (g->log) {
        int id = -1, tile = -1, splitk = -1, sched = -1, stages = -1;
        uint32_t red = 0;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof splitk, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                             sizeof red, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                             &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sched,
                                             sizeof sched, &w);
        fprintf(stderr,
                "gemm plan M %d N %d K %d %s (align X %d W %d Y %d): algo %d tile %d stages %d split-k %d "
                "reduction %u swizzle %d, workspace %zu, waves %.2f\n",
                k.M, k.N, k.K, k.y_f32 ? "f32" : "bf16", k.align_x, k.align_w, k.align_y, id, tile, stages,
                splitk, red, sched, res.workspaceSize, res.wavesCount);
    }
    return 0;
}

// The slot of key in the table: its plan, or the empty slot where it belongs.
static gemm_plan *slot_of(gemm_plan *plans, int cap, const gemm_key &k)
{
    uint32_t i = key_hash(k) & (uint32_t)(cap - 1);
    while (plans[i].used && !key_eq(plans[i].key, k))
        i = (i + 1) & (uint32_t)(cap - 1);
    return &plans[i];
}

static int table_grow(struct k_gemm *g)
{
    int cap = g->cap ? g->cap * 2 : 64;
    gemm_plan *np = (gemm_plan *)calloc((size_t)cap, sizeof *np);
    K_REQUIRE(np, "k_gemm: out of host memory for %d plans", cap);
    for (int i = 0; i < g->cap; i++)
        if (g->plans[i].used)
            *slot_of(np, cap, g->plans[i].key) = g->plans[i];
    free(g->plans);
    g->plans = np, g->cap = cap;
    return 0;
}

// ---- the handle

extern "C" struct k_gemm *k_gemm_create(size_t workspace_bytes)
{
    struct k_gemm *g = (struct k_gemm *)calloc(1, sizeof *g);
    if (!g) {
        k_failf(__FILE__, __LINE__, "k_gemm_create: out of host memory");
        return NULL;
    }
    g->ws_bytes = workspace_bytes ? workspace_bytes : (size_t)32 << 20;
    const char *log = getenv("LLMQ_GEMM_LOG");
    g->log = log && *log && strcmp(log, "0");
    cublasStatus_t s = cublasLtCreate(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        k_failf(__FILE__, __LINE__, "cublasLtCreate: %s (%d)", cublasLtGetStatusString(s), (int)s);
        g->lt = NULL;
        k_gemm_free(g);
        return NULL;
    }
    cudaError_t e = cudaMalloc(&g->ws, g->ws_bytes);
    if (e != cudaSuccess) {
        k_fail(__FILE__, __LINE__, "cudaMalloc(gemm workspace)", e);
        g->ws = NULL;
        k_gemm_free(g);
        return NULL;
    }
    if (table_grow(g)) {
        k_gemm_free(g);
        return NULL;
    }
    return g;
}

extern "C" void k_gemm_free(struct k_gemm *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->cap; i++)
        if (g->plans[i].used)
            plan_destroy(&g->plans[i]);
    free(g->plans);
    if (g->ws)
        cudaFree(g->ws);
    if (g->lt)
        cublasLtDestroy(g->lt);
    free(g);
}

extern "C" int k_gemm_bf16(struct k_gemm *g, const bf16 *X, const bf16 *W, void *Y, int y_f32, int M, int N,
                           int K, cudaStream_t stream)
{
    K_REQUIRE(g, "k_gemm_bf16: NULL handle");
    K_REQUIRE(M >= 0 && N > 0 && K > 0, "k_gemm_bf16: bad shape M %d N %d K %d", M, N, K);
    if (M == 0)
        return 0;
    K_REQUIRE(X && W && Y, "k_gemm_bf16: NULL pointer (X %p W %p Y %p) for M %d N %d K %d", (const void *)X,
              (const void *)W, Y, M, N, K);
    gemm_key key;
    memset(&key, 0, sizeof key); // memcmp'd: no stray bytes
    key.M = M, key.N = N, key.K = K, key.y_f32 = y_f32 ? 1 : 0;
    key.align_x = align_of(X), key.align_w = align_of(W), key.align_y = align_of(Y);

    gemm_plan *p = slot_of(g->plans, g->cap, key);
    if (!p->used) {
        if (2 * (g->n + 1) > g->cap) {
            if (table_grow(g))
                return -1;
            p = slot_of(g->plans, g->cap, key);
        }
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        const bool capturing = cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone;
        const gemm_tune t = {X, W, Y, stream};
        if (plan_make(g, key, p, capturing ? NULL : &t))
            return -1;
        g->n++;
    }
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t s = cublasLtMatmul(g->lt, p->op, &alpha, W, p->a, X, p->b, &beta, Y, p->d, Y, p->d,
                                      &p->algo, g->ws, g->ws_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(__FILE__, __LINE__, "cublasLtMatmul", s, key);
    K_CHECK_LAUNCH();
    return 0;
}
