// GEMMs through cuBLASLt: Y[M, N] = X[M, K] . W[N, K]^T, bf16 in, fp32 accumulation, bf16 or fp32 out
// (fp16 in and out in fp16 mode, below).
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
//
// FP8 (k_gemm_fp8): the same layout with A = W and B = X in e4m3, A's scales in cuBLASLt's
// BLK128x128_32F mode ([ceil(N/128)][K_FP8_KB(K)] fp32: the checkpoints' layout with each row padded
// to a multiple of 4 blocks) and B's in VEC128_32F (fp32 per row and 128-column group, M-contiguous
// with leading dimension Mp = K_FP8_ROWS(M)); compute and scale type 32F, D bf16 (or fp32). cuBLASLt
// needs both scale tensors' leading dimensions to be multiples of 4 (otherwise: no algorithm when
// M % 4 != 0, wrong results when ceil(K/128) % 4 != 0), so B and D are given Mp rows (rows M..Mp-1
// are the caller's scratch) and plans are keyed by Mp.
// The scale pointers are attributes of the operation descriptor, set before every call (a plan is
// shared by every layer's weight of one shape); a captured graph keeps the values of its capture.
//
// fp16 mode (k_f16(), kernels.h): k_gemm_bf16 takes X, W and a 16-bit Y as CUDA_R_16F (same compute
// and scale types) under its own plan kind (KIND_F16), so a plan made for one 16-bit type is never
// used for the other; k_linear's choices are keyed the same way (KIND_CHOICE_F16). k_gemm_fp8 and
// k_linear with an fp8 weight are bf16 only and fail in fp16 mode.
//
// k_linear: the backend's entry point; for M <= K_GEMV_MAX_M it measures the GEMV kernels
// (kernels/gemv.cu) against cuBLASLt once per key and keeps the faster ("choice" entries of the same
// table).
//
// The tuning file (k_gemm_use_tuning_file; engine/gemm_tuning.h): every plan's algorithm and every
// choice is also noted in the handle's gemm_tuning set, under the kind's name, and written out by
// k_gemm_save_tuning; a later handle that reads the file takes a key's algorithm or choice from it
// before it would borrow, time or ask the heuristic, so that it computes what the writer computed.
//
// cuBLASLt is not linked: k_gemm_create loads it (kernels/cublaslt_loader.h) and every call goes
// through the table k_lt.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cublaslt_loader.h"
#include "kernels/kernels.h"
#include "llmq_version.h"
extern "C" {
#include "engine/gemm_tuning.h"
}

// ---- plans and their cache

enum { KIND_BF16, KIND_FP8, KIND_CHOICE_BF16, KIND_CHOICE_FP8, KIND_F16, KIND_CHOICE_F16 };
enum { PATH_LT, PATH_GEMV };
// the kinds' names in the tuning file, by KIND_*
static const char *const kind_name[] = {"bf16", "fp8", "choice-bf16", "choice-fp8", "fp16", "choice-fp16"};
static bool kind_is_choice(int kind)
{
    return kind == KIND_CHOICE_BF16 || kind == KIND_CHOICE_FP8 || kind == KIND_CHOICE_F16;
}
static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(((gemm_tuning_entry *)0)->algo),
              "the tuning file stores cuBLASLt's algorithm as 64 bytes");

struct gemm_key {
    int kind; // KIND_*: a cuBLASLt plan of a dtype (bf16, fp8, fp16), or k_linear's measured choice of one
    int M, N, K, y_f32;
    int align_x, align_w, align_y; // bytes, 2..256 (fp8 plans: of Xq, W, Y)
    int rep; // 1: the algorithm timed for M's tune bucket (M is the bucket's top; no descriptors)
};

struct gemm_plan {
    bool used;
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d; // W, X, Y (Y is both C and D)
    cublasLtMatmulAlgo_t algo;
    int path;    // choice entries: PATH_LT or PATH_GEMV
    int timed_M; // cuBLASLt plans and bucket representatives: the M whose timing (or pick) chose algo
};

struct k_gemm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    void *gemv_ws;    // K_GEMV_WS_BYTES for the GEMV's split-K partial sums and tickets (zeroed)
    gemm_plan *plans; // [cap], cap a power of two, at most half full
    int cap, n;
    bool log; // LLMQ_GEMM_LOG=1 (k_diag): one stderr line per new plan (the algorithm the heuristic chose)
    struct k_gemm_counts counts;
    int pick; // k_gemm_set_pick: K_GEMM_PICK_TIMED (the default), _GEMV or _CUBLASLT
    // the tuning file (k_gemm_use_tuning_file): its entries and the choices made since
    struct gemm_tuning file;
    char *file_path;    // NULL: no file in use
    bool file_write;    // false: not a tuning file (or unreadable): never written
    bool file_dirty;    // something to write
    char identity[512]; // what the file's choices hold for
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
    const int v[9] = {k.kind, k.M, k.N, k.K, k.y_f32, k.align_x, k.align_w, k.align_y, k.rep};
    for (int i = 0; i < 9; i++)
        h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

static void plan_destroy(gemm_plan *p)
{
    if (p->d)
        k_lt.cublasLtMatrixLayoutDestroy(p->d);
    if (p->b)
        k_lt.cublasLtMatrixLayoutDestroy(p->b);
    if (p->a)
        k_lt.cublasLtMatrixLayoutDestroy(p->a);
    if (p->op)
        k_lt.cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

// The name of a plan kind's input type, and of its 16-bit output type.
static const char *kind_in(int kind)
{
    return kind == KIND_FP8 ? "fp8" : kind == KIND_F16 ? "fp16" : "bf16";
}
static const char *kind_out16(int kind)
{
    return kind == KIND_F16 ? "fp16" : "bf16";
}

// Reports a cuBLAS failure with the call and the shape; returns -1.
static int lt_fail(const char *file, int line, const char *call, cublasStatus_t s, const gemm_key &k)
{
    return k_failf(
        file, line,
        "%s: %s (%d) for Y[%d, %d] = X[%d, %d] . W[%d, %d]^T, %s in, %s out, alignments X %d W %d Y %d", call,
        k_lt.cublasLtGetStatusString(s), (int)s, k.M, k.N, k.M, k.K, k.N, k.K,
        k.kind == KIND_FP8 ? "fp8 block-scaled" : kind_in(k.kind), k.y_f32 ? "fp32" : kind_out16(k.kind),
        k.align_x, k.align_w, k.align_y);
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
//
// Timing is paid once per tune bucket, not once per M: M in (lo, hi] with hi = 1, 2, 4, then the
// multiples of 8 (the decode graphs' batch sizes). A bucket's top M (what a graph runs) is timed
// exactly; the first other M of a bucket is timed and its algorithm kept as the bucket's
// representative; every later M of the bucket takes the top's algorithm, or else the
// representative's, after cublasLtMatmulAlgoCheck accepts it for the new M (the fastest near M, not
// necessarily at M). Eager steps (mixed prefill/decode, the lm_head of their sampled rows) have a new
// M almost every step: timed each, they would cost 8 candidates x 4 runs with a synchronization each.
#define GEMM_TUNE_CANDIDATES 8
#define GEMM_TUNE_MAX_M 256

static int tune_bucket(int M)
{
    return M <= 2 ? M : M <= 4 ? 4 : (M + 7) / 8 * 8;
}

struct gemm_tune {
    const void *X, *W;
    void *Y;
    const float *x_scale, *w_scale; // fp8 only
    cudaStream_t stream;
};

// Points an fp8 plan's operation at this call's scales (A = W, B = X).
static cublasStatus_t set_scales(cublasLtMatmulDesc_t op, const float *x_scale, const float *w_scale)
{
    cublasStatus_t s = k_lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale,
                                                           sizeof w_scale);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = k_lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale,
                                                sizeof x_scale);
    return s;
}

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
                 k_lt.cublasLtMatmul(g->lt, p->op, &alpha, t->W, p->a, t->X, p->b, &beta, t->Y, p->d, t->Y,
                                     p->d, &cand[c].algo, g->ws, g->ws_bytes,
                                     t->stream) == CUBLAS_STATUS_SUCCESS &&
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
        fprintf(stderr, "gemm tune %s M %d N %d K %d: %d candidates, chose #%d (%.1f us)\n",
                kind_in(p->key.kind), p->key.M, p->key.N, p->key.K, n, best, best_ms * 1000.f);
    return best;
}

// Makes the operation and layout descriptors of key into *p (an fp8 plan's scale pointers are
// tune's when given); on failure *p is left empty.
static int plan_desc(const gemm_key &p_key, gemm_plan *p, const gemm_tune *tune)
{
    memset(p, 0, sizeof *p);
    const gemm_key &k = p_key;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK("cublasLtMatmulDescCreate",
             k_lt.cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK("cublasLtMatmulDescSetAttribute(TRANSA)",
             k_lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK("cublasLtMatmulDescSetAttribute(TRANSB)",
             k_lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const bool fp8 = k.kind == KIND_FP8;
    const cudaDataType_t t16 = k.kind == KIND_F16 ? CUDA_R_16F : CUDA_R_16BF; // the 16-bit type
    const cudaDataType_t in_t = fp8 ? CUDA_R_8F_E4M3 : t16;
    if (fp8) {
        const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        LT_CHECK("cublasLtMatmulDescSetAttribute(A_SCALE_MODE)",
                 k_lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                     sizeof a_mode));
        LT_CHECK("cublasLtMatmulDescSetAttribute(B_SCALE_MODE)",
                 k_lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                     sizeof b_mode));
        if (tune)
            LT_CHECK("cublasLtMatmulDescSetAttribute(scale pointers)",
                     set_scales(p->op, tune->x_scale, tune->w_scale));
    }
    LT_CHECK("cublasLtMatrixLayoutCreate(W)", k_lt.cublasLtMatrixLayoutCreate(&p->a, in_t, k.K, k.N, k.K));
    LT_CHECK("cublasLtMatrixLayoutCreate(X)", k_lt.cublasLtMatrixLayoutCreate(&p->b, in_t, k.K, k.M, k.K));
    LT_CHECK("cublasLtMatrixLayoutCreate(Y)",
             k_lt.cublasLtMatrixLayoutCreate(&p->d, k.y_f32 ? CUDA_R_32F : t16, k.N, k.M, k.N));
    p->key = k;
    return 0;
}

static void plan_log(const gemm_plan *p, size_t workspace, float waves, const char *how)
{
    const gemm_key &k = p->key;
    int id = -1, tile = -1, splitk = -1, sched = -1, stages = -1;
    uint32_t red = 0;
    size_t w;
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                              sizeof splitk, &w);
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                              sizeof red, &w);
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                              sizeof stages, &w);
    k_lt.cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &sched,
                                              sizeof sched, &w);
    fprintf(stderr,
            "gemm plan %s M %d N %d K %d %s (align X %d W %d Y %d): algo %d tile %d stages %d split-k %d "
            "reduction %u swizzle %d, workspace %zu, waves %.2f%s\n",
            kind_in(k.kind), k.M, k.N, k.K, k.y_f32 ? "f32" : kind_out16(k.kind), k.align_x, k.align_w,
            k.align_y, id, tile, stages, splitk, red, sched, workspace, waves, how);
}

// Makes the plan of key into *p with algo, if cuBLASLt accepts algo for key's shape; -1 (and *p
// empty) otherwise.
static int plan_borrow(struct k_gemm *g, const gemm_key &key, gemm_plan *p, const cublasLtMatmulAlgo_t &algo,
                       int from_M, const gemm_tune *t, bool from_file)
{
    if (plan_desc(key, p, t)) // fp8: the check wants the scale pointers
        return -1;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    if (k_lt.cublasLtMatmulAlgoCheck(g->lt, p->op, p->a, p->b, p->d, p->d, &algo, &res) !=
            CUBLAS_STATUS_SUCCESS ||
        res.state != CUBLAS_STATUS_SUCCESS || res.workspaceSize > g->ws_bytes) {
        plan_destroy(p);
        return -1;
    }
    p->algo = algo;
    p->used = true;
    p->timed_M = from_M;
    if (g->log) {
        char how[64];
        snprintf(how, sizeof how, ", from M %d's timing%s", from_M, from_file ? " in the tuning file" : "");
        plan_log(p, res.workspaceSize, res.wavesCount, how);
    }
    return 0;
}

// Makes the descriptors and picks the algorithm for key into *p (timing candidates when tune is
// not NULL and M <= GEMM_TUNE_MAX_M); on failure *p is left empty.
static int plan_make(struct k_gemm *g, const gemm_key &p_key, gemm_plan *p, const gemm_tune *tune)
{
    if (plan_desc(p_key, p, tune))
        return -1;
    const gemm_key &k = p_key;
    cublasLtMatmulPreference_t pref = NULL;
    LT_CHECK("cublasLtMatmulPreferenceCreate", k_lt.cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = g->ws_bytes;
    const uint32_t al[4] = {(uint32_t)k.align_w, (uint32_t)k.align_x, (uint32_t)k.align_y,
                            (uint32_t)k.align_y};
    cublasStatus_t s = k_lt.cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = k_lt.cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]);
    // split-K partial sums in fp32 only: bf16 partials (the in-place and output-type schemes) would
    // round more than once and break "fp32 accumulation, one rounding"
    const uint32_t schemes =
        k.y_f32 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK : (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = k_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                      &schemes, sizeof schemes);
    cublasLtMatmulHeuristicResult_t cand[GEMM_TUNE_CANDIDATES];
    memset(cand, 0, sizeof cand);
    int found = 0;
    const int want = (tune && k.M <= GEMM_TUNE_MAX_M) ? GEMM_TUNE_CANDIDATES : 1;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = k_lt.cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->d, p->d, pref, want, cand,
                                                &found);
    k_lt.cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    LT_CHECK("cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape and alignment)", s);
    LT_CHECK("cublasLtMatmulAlgoGetHeuristic (result)", cand[0].state);
    int best = 0;
    if (found > 1) {
        best = plan_tune(g, p, cand, found, tune);
        g->counts.tuned++;
    }
    const cublasLtMatmulHeuristicResult_t &res = cand[best];
    p->algo = res.algo;
    p->used = true;
    p->timed_M = k.M;
    if (g->log)
        plan_log(p, res.workspaceSize, res.wavesCount, found > 1 ? ", timed" : "");
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
    g->log = k_diag()->gemm_log;
    char why[1024];
    if (k_cublaslt_load(why, sizeof why)) {
        k_failf(__FILE__, __LINE__, "%s", why);
        k_gemm_free(g);
        return NULL;
    }
    cublasStatus_t s = k_lt.cublasLtCreate(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        k_failf(__FILE__, __LINE__, "cublasLtCreate: %s (%d)", k_lt.cublasLtGetStatusString(s), (int)s);
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
    if ((e = cudaMalloc(&g->gemv_ws, K_GEMV_WS_BYTES)) != cudaSuccess ||
        (e = cudaMemset(g->gemv_ws, 0, K_GEMV_WS_BYTES)) != cudaSuccess) {
        k_fail(__FILE__, __LINE__, "cudaMalloc(gemv workspace)", e);
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
    if (g->gemv_ws)
        cudaFree(g->gemv_ws);
    if (g->lt)
        k_lt.cublasLtDestroy(g->lt);
    gemm_tuning_free(&g->file);
    free(g->file_path);
    free(g);
}

// The used entry of key, or NULL.
static const gemm_plan *plan_find(const struct k_gemm *g, const gemm_key &key)
{
    const gemm_plan *p = slot_of(g->plans, g->cap, key);
    return p->used ? p : NULL;
}

// ---- the tuning file's side of the table

// What the file keeps: the keys whose choice a process makes by timing or by the order it meets shapes
// in — k_linear's choices and the plans of M <= GEMM_TUNE_MAX_M (timed, borrowed from their bucket, or
// the heuristic's pick inside a capture, which another process may time instead). A larger M takes
// the heuristic's first pick, the same in every process of the file's identity, so it is neither
// kept nor looked up: a worker meets a new M > 256 at nearly every prefill step, and keeping them
// would grow the file (and its saves on the step path) without end.
static bool file_keeps(const gemm_key &k)
{
    return kind_is_choice(k.kind) || k.M <= GEMM_TUNE_MAX_M;
}

static void file_key(const gemm_key &k, int v[GEMM_TUNING_KEY_INTS])
{
    const int x[GEMM_TUNING_KEY_INTS] = {k.M, k.N, k.K, k.y_f32, k.align_x, k.align_w, k.align_y, k.rep};
    memcpy(v, x, sizeof x);
}

// The tuning file's entry of key when one is in use and the entry is sound for the kind (a choice
// names a path; a plan does not), else NULL.
static const gemm_tuning_entry *file_find(const struct k_gemm *g, const gemm_key &k)
{
    if (!g->file_path || !file_keeps(k))
        return NULL;
    int v[GEMM_TUNING_KEY_INTS];
    file_key(k, v);
    const gemm_tuning_entry *e = gemm_tuning_find(&g->file, kind_name[k.kind], v);
    if (e && (kind_is_choice(k.kind) ? e->path != PATH_LT && e->path != PATH_GEMV : e->path != 0))
        return NULL;
    return e;
}

// Counts a choice the file keeps (file_keeps) and notes it, a plan's algorithm (algo) or a k_linear
// choice (path), for the next k_gemm_save_tuning.
static void file_note(struct k_gemm *g, const gemm_key &k, const cublasLtMatmulAlgo_t *algo, int timed_M,
                      int path)
{
    if (!file_keeps(k))
        return;
    g->counts.made++;
    if (!g->file_path || !g->file_write)
        return;
    gemm_tuning_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.kind, sizeof e.kind, "%s", kind_name[k.kind]);
    file_key(k, e.key);
    e.timed_M = timed_M, e.path = path;
    if (algo)
        memcpy(e.algo, algo, sizeof e.algo);
    const gemm_tuning_entry *old = gemm_tuning_find(&g->file, e.kind, e.key);
    if (old && !memcmp(old, &e, sizeof e))
        return;
    if (gemm_tuning_put(&g->file, &e) == 0) // out of memory: the entry is not kept, nothing else changes
        g->file_dirty = true;
}

// Finds or makes the plan of key: the tuning file's algorithm for it, else an algorithm already timed
// for its tune bucket, else one timed on the call's operands (unless the stream is capturing: then
// the heuristic's first pick).
static int plan_get(struct k_gemm *g, const gemm_key &key, const gemm_tune *t, gemm_plan **out)
{
    gemm_plan *p = slot_of(g->plans, g->cap, key);
    if (p->used) {
        *out = p;
        return 0;
    }
    if (2 * (g->n + 2) > g->cap) { // room for the plan and a bucket representative
        if (table_grow(g))
            return -1;
        p = slot_of(g->plans, g->cap, key);
    }
    const gemm_tuning_entry *fe = file_find(g, key);
    if (fe) {
        cublasLtMatmulAlgo_t a;
        memcpy(&a, fe->algo, sizeof a);
        if (!plan_borrow(g, key, p, a, fe->timed_M, t, true)) {
            g->counts.loaded++;
            g->n++;
            *out = p;
            return 0;
        }
    }
    const int hi = tune_bucket(key.M);
    const bool bucketed = key.M <= GEMM_TUNE_MAX_M && hi != key.M;
    gemm_key top = key, rep = key;
    top.M = rep.M = hi;
    rep.rep = 1;
    const gemm_plan *from = bucketed ? plan_find(g, top) : NULL;
    if (bucketed && !from)
        from = plan_find(g, rep);
    if (from && !plan_borrow(g, key, p, from->algo, from->timed_M, t, false)) {
        g->counts.borrowed++;
    } else {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        const bool capturing =
            cudaStreamIsCapturing(t->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone;
        if (plan_make(g, key, p, capturing ? NULL : t))
            return -1;
        if (bucketed && !capturing) { // the bucket's representative: its algorithm, no descriptors
            gemm_plan *r = slot_of(g->plans, g->cap, rep);
            if (!r->used) {
                memset(r, 0, sizeof *r);
                r->used = true, r->key = rep, r->algo = p->algo, r->timed_M = p->timed_M;
                g->n++;
            }
        }
    }
    file_note(g, key, &p->algo, p->timed_M, 0);
    g->n++;
    *out = p;
    return 0;
}

static gemm_key make_key(int kind, const void *X, const void *W, const void *Y, int y_f32, int M, int N,
                         int K)
{
    gemm_key key;
    memset(&key, 0, sizeof key); // memcmp'd: no stray bytes
    key.kind = kind, key.M = M, key.N = N, key.K = K, key.y_f32 = y_f32 ? 1 : 0;
    key.align_x = align_of(X), key.align_w = align_of(W), key.align_y = align_of(Y);
    return key;
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
    const gemm_key key = make_key(k_f16() ? KIND_F16 : KIND_BF16, X, W, Y, y_f32, M, N, K);
    const gemm_tune t = {X, W, Y, NULL, NULL, stream};
    gemm_plan *p;
    if (plan_get(g, key, &t, &p))
        return -1;
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t s = k_lt.cublasLtMatmul(g->lt, p->op, &alpha, W, p->a, X, p->b, &beta, Y, p->d, Y, p->d,
                                           &p->algo, g->ws, g->ws_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(__FILE__, __LINE__, "cublasLtMatmul", s, key);
    K_CHECK_LAUNCH();
    return 0;
}

extern "C" int k_gemm_fp8(struct k_gemm *g, const uint8_t *Xq, const float *x_scale, const uint8_t *W,
                          const float *w_scale, void *Y, int y_f32, int M, int N, int K, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_gemm_fp8: fp8 GEMMs are bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(g, "k_gemm_fp8: NULL handle");
    K_REQUIRE(M >= 0 && N > 0 && K > 0, "k_gemm_fp8: bad shape M %d N %d K %d", M, N, K);
    if (M == 0)
        return 0;
    K_REQUIRE(Xq && x_scale && W && w_scale && Y,
              "k_gemm_fp8: NULL pointer (Xq %p x_scale %p W %p w_scale %p Y %p) for M %d N %d K %d",
              (const void *)Xq, (const void *)x_scale, (const void *)W, (const void *)w_scale, Y, M, N, K);
    // cuBLASLt sees Mp rows of X and Y (the scale tensor's leading dimension must be a multiple of 4)
    const gemm_key key = make_key(KIND_FP8, Xq, W, Y, y_f32, K_FP8_ROWS(M), N, K);
    const gemm_tune t = {Xq, W, Y, x_scale, w_scale, stream};
    gemm_plan *p;
    if (plan_get(g, key, &t, &p))
        return -1;
    cublasStatus_t s = set_scales(p->op, x_scale, w_scale);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(__FILE__, __LINE__, "cublasLtMatmulDescSetAttribute(scale pointers)", s, key);
    const float alpha = 1.f, beta = 0.f;
    s = k_lt.cublasLtMatmul(g->lt, p->op, &alpha, W, p->a, Xq, p->b, &beta, Y, p->d, Y, p->d, &p->algo, g->ws,
                            g->ws_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(__FILE__, __LINE__, "cublasLtMatmul", s, key);
    K_CHECK_LAUNCH();
    return 0;
}

extern "C" void k_gemm_get_counts(const struct k_gemm *g, struct k_gemm_counts *c)
{
    *c = g->counts;
}

extern "C" void k_gemm_set_pick(struct k_gemm *g, int pick)
{
    g->pick = pick == K_GEMM_PICK_GEMV || pick == K_GEMM_PICK_CUBLASLT ? pick : K_GEMM_PICK_TIMED;
}

// ---- the tuning file

extern "C" int k_gemm_use_tuning_file(struct k_gemm *g, const char *path, char *msg, size_t msglen)
{
    gemm_tuning_free(&g->file);
    free(g->file_path);
    g->file_path = NULL, g->file_write = g->file_dirty = false;
    int dev = 0;
    cudaDeviceProp prop;
    int rt = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, dev);
    if (e == cudaSuccess)
        e = cudaRuntimeGetVersion(&rt);
    if (e != cudaSuccess) {
        snprintf(msg, msglen, "%s: not used: the device's properties: %s", path, cudaGetErrorString(e));
        return GEMM_TUNING_FOREIGN;
    }
    // what makes the choices: the device model, the libraries, our kernels (the version) and the
    // workspace cuBLASLt may use
    snprintf(g->identity, sizeof g->identity,
             "%.255s, %d SMs, sm_%d%d; cuBLASLt %zu; CUDA runtime %d; llmq %.32s; workspace %zu MiB",
             prop.name, prop.multiProcessorCount, prop.major, prop.minor, k_lt.cublasLtGetVersion(), rt,
             LLMQ_VERSION, g->ws_bytes >> 20);
    g->file_path = strdup(path);
    if (!g->file_path) {
        snprintf(msg, msglen, "%s: not used: out of host memory", path);
        return GEMM_TUNING_FOREIGN;
    }
    const int rc = gemm_tuning_load(&g->file, path, g->identity, msg, msglen);
    g->file_write = rc != GEMM_TUNING_FOREIGN;
    g->file_dirty = rc == GEMM_TUNING_OTHER_ID || rc == GEMM_TUNING_BAD; // replace it at the next save
    if (rc == GEMM_TUNING_LOADED)
        snprintf(msg, msglen, "%s: %d choices for %s", path, g->file.n, g->identity);
    return rc;
}

extern "C" int k_gemm_save_tuning(struct k_gemm *g, char *msg, size_t msglen)
{
    msg[0] = 0;
    if (!g || !g->file_path || !g->file_write || !g->file_dirty)
        return 0;
    if (gemm_tuning_save(&g->file, g->file_path, g->identity, msg, msglen))
        return -1;
    g->file_dirty = false;
    snprintf(msg, msglen, "%s: %d choices written", g->file_path, g->file.n);
    return 1;
}

// ---- k_linear: GEMV or cuBLASLt

static int run_path(struct k_gemm *g, int path, const bf16 *X, const uint8_t *Xq, const float *x_scale,
                    const struct k_weight *w, void *Y, int y_f32, int M, cudaStream_t stream)
{
    if (path == PATH_GEMV)
        return w->fp8 ? k_gemv_fp8(X, (const uint8_t *)w->w, w->scale, Y, y_f32, M, w->N, w->K, 0, g->gemv_ws,
                                   stream)
                      : k_gemv_bf16(X, (const bf16 *)w->w, Y, y_f32, M, w->N, w->K, 0, g->gemv_ws, stream);
    return w->fp8 ? k_gemm_fp8(g, Xq, x_scale, (const uint8_t *)w->w, w->scale_lt ? w->scale_lt : w->scale, Y,
                               y_f32, M, w->N, w->K, stream)
                  : k_gemm_bf16(g, X, (const bf16 *)w->w, Y, y_f32, M, w->N, w->K, stream);
}

// Median of three timed runs of path after one warm-up (which also makes a cuBLASLt plan); a
// negative value when the path fails (its error is cleared: the other path may work).
static float time_path(struct k_gemm *g, int path, const bf16 *X, const uint8_t *Xq, const float *x_scale,
                       const struct k_weight *w, void *Y, int y_f32, int M, cudaStream_t stream)
{
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess)
        return -1.f;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return -1.f;
    }
    float ms[3] = {0, 0, 0};
    bool ok = run_path(g, path, X, Xq, x_scale, w, Y, y_f32, M, stream) == 0;
    for (int r = 0; r < 3 && ok; r++)
        ok = cudaEventRecord(e0, stream) == cudaSuccess &&
             run_path(g, path, X, Xq, x_scale, w, Y, y_f32, M, stream) == 0 &&
             cudaEventRecord(e1, stream) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
             cudaEventElapsedTime(&ms[r], e0, e1) == cudaSuccess;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (!ok) {
        (void)cudaGetLastError();
        return -1.f;
    }
    return ms[0] < ms[1] ? (ms[1] < ms[2] ? ms[1] : (ms[0] < ms[2] ? ms[2] : ms[0]))
                         : (ms[0] < ms[2] ? ms[0] : (ms[1] < ms[2] ? ms[2] : ms[1]));
}

static bool gemv_ok(const bf16 *X, const struct k_weight *w, int M)
{
    return X && align_of(X) >= 16 && M <= K_GEMV_MAX_M && w->K % 16 == 0 && align_of(w->w) >= 16;
}

// The name of a weight's type as k_linear uses it (a 16-bit weight is of the calling thread's mode).
static const char *weight_type(const struct k_weight *w)
{
    return w->fp8 ? "fp8" : k_f16() ? "fp16" : "bf16";
}

extern "C" int k_linear_takes_xq(const struct k_weight *w, int M)
{
    // fp8 at M = 1 is always the GEMV (cuBLASLt has no algorithm), on bf16 X
    return w->fp8 && M > 1;
}

extern "C" int k_linear(struct k_gemm *g, const bf16 *X, const uint8_t *Xq, const float *x_scale,
                        const struct k_weight *w, void *Y, int y_f32, int M, cudaStream_t stream)
{
    K_REQUIRE(!(w && w->fp8 && k_f16()), "k_linear: fp8 weights are bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(g && w && w->w && Y, "k_linear: NULL handle, weight or output");
    K_REQUIRE(!w->fp8 || w->scale, "k_linear: fp8 weight without scales");
    K_REQUIRE(M >= 0 && w->N > 0 && w->K > 0, "k_linear: bad shape M %d N %d K %d", M, w->N, w->K);
    if (M == 0)
        return 0;
    const bool lt_in = w->fp8 ? (Xq && x_scale) : X != NULL; // what cuBLASLt needs is there
    const bool gemv_in = gemv_ok(X, w, M);
    K_REQUIRE(lt_in || gemv_in,
              "k_linear: no usable input for M %d N %d K %d (%s weight: X %p, Xq %p, x_scale %p; GEMV needs "
              "bf16 X, M <= %d, K %% 16 == 0, 16-byte aligned X and W)",
              M, w->N, w->K, weight_type(w), (const void *)X, (const void *)Xq, (const void *)x_scale,
              K_GEMV_MAX_M);
    if (!gemv_in)
        return run_path(g, PATH_LT, X, Xq, x_scale, w, Y, y_f32, M, stream);
    if (!lt_in || (w->fp8 && M == 1) || g->pick == K_GEMM_PICK_GEMV)
        return run_path(g, PATH_GEMV, X, Xq, x_scale, w, Y, y_f32, M, stream);
    if (g->pick == K_GEMM_PICK_CUBLASLT)
        return run_path(g, PATH_LT, X, Xq, x_scale, w, Y, y_f32, M, stream);

    const int kind = w->fp8 ? KIND_CHOICE_FP8 : k_f16() ? KIND_CHOICE_F16 : KIND_CHOICE_BF16;
    const gemm_key key = make_key(kind, w->fp8 ? (const void *)Xq : X, w->w, Y, y_f32, M, w->N, w->K);
    gemm_plan *p = slot_of(g->plans, g->cap, key);
    if (p->used)
        return run_path(g, p->path, X, Xq, x_scale, w, Y, y_f32, M, stream);
    int path;
    const gemm_tuning_entry *fe = file_find(g, key);
    if (fe) {
        path = fe->path;
        g->counts.loaded++;
        if (g->log)
            fprintf(stderr, "gemm choice %s M %d N %d K %d: %s, from the tuning file\n", weight_type(w), M,
                    w->N, w->K, path == PATH_GEMV ? "gemv" : "cublasLt");
    } else {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
            return run_path(g, PATH_GEMV, X, Xq, x_scale, w, Y, y_f32, M, stream); // no timing in a capture
        const float t_gemv = time_path(g, PATH_GEMV, X, Xq, x_scale, w, Y, y_f32, M, stream);
        const float t_lt = time_path(g, PATH_LT, X, Xq, x_scale, w, Y, y_f32, M, stream);
        K_REQUIRE(t_gemv >= 0 || t_lt >= 0, "k_linear: neither GEMV nor cuBLASLt runs M %d N %d K %d: %s", M,
                  w->N, w->K, k_last_error());
        path = t_lt < 0 || (t_gemv >= 0 && t_gemv <= t_lt) ? PATH_GEMV : PATH_LT;
        if (g->log)
            fprintf(stderr, "gemm choice %s M %d N %d K %d: gemv %.1f us, cublasLt %.1f us -> %s\n",
                    weight_type(w), M, w->N, w->K, t_gemv * 1000.f, t_lt * 1000.f,
                    path == PATH_GEMV ? "gemv" : "cublasLt");
        file_note(g, key, NULL, M, path);
    }
    if (2 * (g->n + 1) > g->cap && table_grow(g))
        return -1;
    p = slot_of(g->plans, g->cap, key); // cuBLASLt's plan may have grown the table meanwhile
    memset(p, 0, sizeof *p);
    p->used = true;
    p->key = key;
    p->path = path;
    g->n++;
    return run_path(g, path, X, Xq, x_scale, w, Y, y_f32, M, stream);
}
