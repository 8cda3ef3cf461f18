/* kernels/quant.cu against engine/fp8.c (the host reference of the same quantization) and against
 * the unfused kernels.
 *
 *   weight   k_quant_fp8_weight vs fp8_quantize_blocks on the same bf16 values: codes and scales
 *            bit for bit (shapes with partial edge blocks, a zero block, an outlier, subnormal-range
 *            values); the NaN/inf flag.
 *   act      k_quant_fp8_act vs a host loop of fp8_scale / f32_to_e4m3 per 1x128 group: bit for bit,
 *            scales at x_scale[g * Mp + m], Mp = K_FP8_ROWS(M) (the padding entries m >= M must stay
 *            unwritten: they keep the poison).
 *   rmsnorm  k_add_rmsnorm_fp8 vs k_add_rmsnorm then k_quant_fp8_act: the residual bit for bit (the
 *            same fp32 adds); the bf16 output within one bf16 ulp (the row's sum of squares is added
 *            in another order, so rsqrt may differ by an fp32 ulp and flip a rounding; the count is
 *            printed and must stay under 1%); the codes and scales bit for bit equal to
 *            k_quant_fp8_act of the fused kernel's own bf16 output (the contract). With and without
 *            the add, with out == NULL.
 *   silu     k_silu_mul_fp8 vs k_silu_mul then k_quant_fp8_act: everything bit for bit (same formula).
 *   fp16     in fp16 mode (k_set_f16) every fp8 launcher of quant.cu, kv_stage.cu and rope.cu is refused
 *            at once (-1, a message naming it), even with arguments that make it a no-op in bf16 mode.
 * Outputs are poisoned (0xff) before every run; inputs are fresh random numbers (seed printed,
 * LLMQ_TEST_SEED=N reproduces). Timing (informational): median of 20 after warm-up on hashed non-zero
 * inputs, GB/s against the H200's 4.2 TB/s copy. */
#include <algorithm>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu/gpu_test.h"

extern "C" {
#include "engine/dtype.h"
#include "engine/fp8.h"
}

/* host bf16 values: normals * scale, with a few specials sprinkled by the caller */
static std::vector<bf16> random_bf16(size_t n, float scale, uint64_t *seed)
{
    std::vector<bf16> h(n);
    for (size_t i = 0; i < n; i++)
        h[i] = __float2bfloat16(gt_normal(seed) * scale);
    return h;
}

static std::vector<float> as_float(const std::vector<bf16> &h)
{
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); i++)
        f[i] = __bfloat162float(h[i]);
    return f;
}

template <typename T> static std::vector<T> fetch(const T *d, size_t n)
{
    std::vector<T> h(n);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

static size_t count_diff(const uint8_t *a, const uint8_t *b, size_t n, size_t *first)
{
    size_t c = 0;
    *first = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            if (!c)
                *first = i;
            c++;
        }
    return c;
}

/* ---- weights */

static void case_weight(int N, int K, uint64_t *seed, const char *what)
{
    std::vector<bf16> h = random_bf16((size_t)N * K, 0.02f, seed);
    /* an outlier, a zero block (when there are >= 2 row blocks), tiny values */
    h[(size_t)(N / 2) * K + K / 3] = __float2bfloat16(5.0f);
    if (N > 128 && K > 128)
        for (int r = 0; r < 128; r++)
            for (int c = 128; c < std::min(K, 256); c++)
                h[(size_t)r * K + c] = __float2bfloat16(0.0f);
    for (int i = 0; i < 50; i++)
        h[gt_next(seed) % h.size()] = __float2bfloat16(gt_normal(seed) * 1e-6f);
    std::vector<float> f = as_float(h);
    const int nb0 = (N + 127) / 128, nb1 = (K + 127) / 128;
    std::vector<uint8_t> q_ref((size_t)N * K);
    std::vector<float> s_ref((size_t)nb0 * nb1);
    gt_check(fp8_quantize_blocks(f.data(), N, K, 128, 128, q_ref.data(), s_ref.data()) == 0,
             "%s: host reference", what);

    bf16 *W = gt_to_device(h.data(), h.size());
    uint8_t *Wq = gt_poisoned<uint8_t>((size_t)N * K);
    float *ws = gt_poisoned<float>((size_t)nb0 * nb1);
    int *bad = gt_poisoned<int>(1);
    GPU_OK(cudaMemset(bad, 0, sizeof(int)));
    K_OK(k_quant_fp8_weight(W, N, K, Wq, ws, bad, 0));
    std::vector<uint8_t> q = fetch(Wq, (size_t)N * K);
    std::vector<float> s = fetch(ws, (size_t)nb0 * nb1);
    std::vector<int> b = fetch(bad, 1);
    size_t first;
    size_t dq = count_diff(q.data(), q_ref.data(), q.size(), &first);
    size_t ds = count_diff((const uint8_t *)s.data(), (const uint8_t *)s_ref.data(), s.size() * 4, &first);
    gt_check(dq == 0 && ds == 0 && b[0] == 0,
             "weight %s: %dx%d (%dx%d blocks): %zu code mismatches, %zu scale bytes differ, flag %d", what, N,
             K, nb0, nb1, dq, ds, b[0]);
    /* NaN and inf set the flag */
    for (int special = 0; special < 2; special++) {
        bf16 v = __float2bfloat16(special ? INFINITY : NAN);
        GPU_OK(cudaMemcpy(W + (size_t)(N - 1) * K + (K - 1), &v, sizeof v, cudaMemcpyHostToDevice));
        GPU_OK(cudaMemset(bad, 0, sizeof(int)));
        K_OK(k_quant_fp8_weight(W, N, K, Wq, ws, bad, 0));
        b = fetch(bad, 1);
        gt_check(b[0] == 1, "weight %s with a %s: flag %d", what, special ? "inf" : "NaN", b[0]);
    }
    cudaFree(W), cudaFree(Wq), cudaFree(ws), cudaFree(bad);
}

/* ---- activations: the host reference of 1x128 groups */

/* s: [G][Mp] with the padding entries (m >= M, never written by the kernels) as poisoned (0xff bytes) */
static void quant_act_host(const std::vector<float> &x, int M, int K, std::vector<uint8_t> &q,
                           std::vector<float> &s)
{
    const int G = K / 128, Mp = K_FP8_ROWS(M);
    float poison;
    memset(&poison, 0xff, sizeof poison);
    q.assign((size_t)M * K, 0);
    s.assign((size_t)G * Mp, poison);
    for (int m = 0; m < M; m++)
        for (int g = 0; g < G; g++) {
            float amax = 0;
            for (int c = 0; c < 128; c++)
                amax = std::max(amax, fabsf(x[(size_t)m * K + g * 128 + c]));
            const float sc = fp8_scale(amax);
            s[(size_t)g * Mp + m] = sc;
            for (int c = 0; c < 128; c++)
                q[(size_t)m * K + g * 128 + c] = f32_to_e4m3(x[(size_t)m * K + g * 128 + c] / sc);
        }
}

static bool same_quant(const char *what, const uint8_t *dq, const float *ds,
                       const std::vector<uint8_t> &q_ref, const std::vector<float> &s_ref)
{
    std::vector<uint8_t> q = fetch(dq, q_ref.size());
    std::vector<float> s = fetch(ds, s_ref.size());
    size_t fq, fs;
    size_t nq = count_diff(q.data(), q_ref.data(), q.size(), &fq);
    size_t ns = count_diff((const uint8_t *)s.data(), (const uint8_t *)s_ref.data(), s.size() * 4, &fs);
    char extra[160] = "";
    if (nq)
        snprintf(extra, sizeof extra, "; first code diff at %zu: 0x%02x vs 0x%02x", fq, q[fq], q_ref[fq]);
    gt_check(nq == 0 && ns == 0, "%s: %zu code mismatches, %zu scale bytes differ%s", what, nq, ns, extra);
    return nq == 0 && ns == 0;
}

static void case_act(int M, int K, uint64_t *seed)
{
    std::vector<bf16> h = random_bf16((size_t)M * K, 1.0f, seed);
    if (M > 2) { /* a zero group and a group of tiny values */
        for (int c = 0; c < 128; c++) {
            h[(size_t)1 * K + c] = __float2bfloat16(0.f);
            h[(size_t)2 * K + c] = __float2bfloat16(gt_normal(seed) * 1e-30f);
        }
    }
    std::vector<uint8_t> q_ref;
    std::vector<float> s_ref;
    quant_act_host(as_float(h), M, K, q_ref, s_ref);
    bf16 *X = gt_to_device(h.data(), h.size());
    uint8_t *Xq = gt_poisoned<uint8_t>((size_t)M * K);
    float *xs = gt_poisoned<float>((size_t)K_FP8_ROWS(M) * (K / 128));
    K_OK(k_quant_fp8_act(X, M, K, Xq, xs, 0));
    char what[96];
    snprintf(what, sizeof what, "act M %d K %d", M, K);
    same_quant(what, Xq, xs, q_ref, s_ref);
    cudaFree(X), cudaFree(Xq), cudaFree(xs);
}

/* ---- fused producers */

static void case_rmsnorm(int rows, int cols, bool add, bool with_out, uint64_t *seed)
{
    const size_t n = (size_t)rows * cols, ns = (size_t)K_FP8_ROWS(rows) * (cols / 128);
    std::vector<float> res(n);
    for (auto &v : res)
        v = gt_normal(seed) * 3.f;
    std::vector<bf16> x = random_bf16(n, 1.f, seed), w = random_bf16(cols, 0.2f, seed);
    for (auto &v : w)
        v = __float2bfloat16(1.f + __bfloat162float(v));
    float *r1 = gt_to_device(res.data(), n), *r2 = gt_to_device(res.data(), n);
    bf16 *dx = gt_to_device(x.data(), n), *dw = gt_to_device(w.data(), (size_t)cols);
    bf16 *o1 = gt_poisoned<bf16>(n), *o2 = gt_poisoned<bf16>(n);
    uint8_t *q = gt_poisoned<uint8_t>(n), *q_self = gt_poisoned<uint8_t>(n);
    float *s = gt_poisoned<float>(ns), *s_self = gt_poisoned<float>(ns);
    const float eps = 1e-6f;
    if (add)
        K_OK(k_add_rmsnorm(r1, dx, dw, o1, rows, cols, eps, 0));
    else
        K_OK(k_rmsnorm(r1, dw, o1, rows, cols, eps, 0));
    K_OK(k_add_rmsnorm_fp8(r2, add ? dx : NULL, dw, o2, q, s, rows, cols, eps, 0));
    char what[128];
    snprintf(what, sizeof what, "%s_fp8 rows %d cols %d", add ? "add_rmsnorm" : "rmsnorm", rows, cols);
    std::vector<float> h1 = fetch(r1, n), h2 = fetch(r2, n);
    gt_check(!memcmp(h1.data(), h2.data(), n * 4), "%s: residual bit for bit", what);
    std::vector<bf16> b1 = fetch(o1, n), b2 = fetch(o2, n);
    size_t diff = 0, far = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t u1, u2;
        memcpy(&u1, &b1[i], 2), memcpy(&u2, &b2[i], 2);
        diff += u1 != u2;
        far += abs((int)u1 - (int)u2) > 1 || isnan(__bfloat162float(b2[i]));
    }
    gt_check(far == 0 && diff * 100 <= n,
             "%s: bf16 out vs k_%s: %zu of %zu differ, by one ulp at most (%zu more)", what,
             add ? "add_rmsnorm" : "rmsnorm", diff, n, far);
    /* the contract: the codes are k_quant_fp8_act of the kernel's own bf16 output */
    K_OK(k_quant_fp8_act(o2, rows, cols, q_self, s_self, 0));
    std::vector<uint8_t> qs = fetch(q_self, n);
    std::vector<float> ss = fetch(s_self, ns);
    snprintf(what + strlen(what), sizeof what - strlen(what), " codes");
    same_quant(what, q, s, qs, ss);
    if (!with_out) { /* out == NULL: the same codes, nothing else written */
        float *r3 = gt_to_device(res.data(), n);
        uint8_t *q3 = gt_poisoned<uint8_t>(n);
        float *s3 = gt_poisoned<float>(ns);
        K_OK(k_add_rmsnorm_fp8(r3, add ? dx : NULL, dw, NULL, q3, s3, rows, cols, eps, 0));
        snprintf(what, sizeof what, "%s_fp8 rows %d cols %d, out NULL", add ? "add_rmsnorm" : "rmsnorm", rows,
                 cols);
        same_quant(what, q3, s3, qs, ss);
        cudaFree(r3), cudaFree(q3), cudaFree(s3);
    }
    /* and against quantizing k_add_rmsnorm's output (differs only where the bf16 values do) */
    std::vector<uint8_t> q_ref;
    std::vector<float> s_ref;
    quant_act_host(as_float(b1), rows, cols, q_ref, s_ref);
    std::vector<uint8_t> qf = fetch(q, n);
    size_t first, dq = count_diff(qf.data(), q_ref.data(), n, &first);
    printf("info %s: %zu of %zu codes differ from quantizing k_%s's output (%zu bf16 values differ)\n", what,
           dq, n, add ? "add_rmsnorm" : "rmsnorm", diff);
    cudaFree(r1), cudaFree(r2), cudaFree(dx), cudaFree(dw), cudaFree(o1), cudaFree(o2);
    cudaFree(q), cudaFree(q_self), cudaFree(s), cudaFree(s_self);
}

static void case_silu(int T, int F, bool with_out, uint64_t *seed)
{
    const size_t n = (size_t)T * F, ns = (size_t)K_FP8_ROWS(T) * (F / 128);
    std::vector<bf16> gu = random_bf16(2 * n, 2.f, seed);
    bf16 *dgu = gt_to_device(gu.data(), 2 * n), *o1 = gt_poisoned<bf16>(n), *o2 = gt_poisoned<bf16>(n);
    uint8_t *q = gt_poisoned<uint8_t>(n);
    float *s = gt_poisoned<float>(ns);
    K_OK(k_silu_mul(dgu, o1, T, F, 0));
    K_OK(k_silu_mul_fp8(dgu, with_out ? o2 : NULL, q, s, T, F, 0));
    std::vector<bf16> b1 = fetch(o1, n);
    char what[96];
    snprintf(what, sizeof what, "silu_mul_fp8 T %d F %d%s", T, F, with_out ? "" : ", out NULL");
    if (with_out) {
        std::vector<bf16> b2 = fetch(o2, n);
        gt_check(!memcmp(b1.data(), b2.data(), n * 2), "%s: bf16 out bit for bit k_silu_mul's", what);
    }
    std::vector<uint8_t> q_ref;
    std::vector<float> s_ref;
    quant_act_host(as_float(b1), T, F, q_ref, s_ref);
    snprintf(what + strlen(what), sizeof what - strlen(what), " codes");
    same_quant(what, q, s, q_ref, s_ref);
    cudaFree(dgu), cudaFree(o1), cudaFree(o2), cudaFree(q), cudaFree(s);
}

/* ---- fp16 mode: the fp8 paths are bf16 only */

static void refused(int rc, const char *name)
{
    const char *e = k_last_error();
    gt_check(rc == -1 && strstr(e, name) && strstr(e, "fp16 mode"), "fp16 mode: %s refused: \"%s\"", name, e);
}

static void case_fp16_refused(void)
{
    k_set_f16(1);
    refused(k_quant_fp8_weight(NULL, 128, 128, NULL, NULL, NULL, 0), "k_quant_fp8_weight");
    /* the rest with no work to do (a no-op in bf16 mode): the mode is checked first */
    refused(k_quant_fp8_act(NULL, 0, 256, NULL, NULL, 0), "k_quant_fp8_act");
    refused(k_add_rmsnorm_fp8(NULL, NULL, NULL, NULL, NULL, NULL, 0, 128, 1e-6f, 0), "k_add_rmsnorm_fp8");
    refused(k_silu_mul_fp8(NULL, NULL, NULL, NULL, 0, 128, 0), "k_silu_mul_fp8");
    refused(k_kv_stage_fp8(NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, 8, 128, 32, 0), "k_kv_stage_fp8");
    refused(k_qk_norm_rope_kv_fp8(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1.f, NULL, NULL, NULL, NULL,
                                  NULL, 0, 8, 2, 128, 32, 0),
            "k_qk_norm_rope_kv_fp8");
    k_set_f16(0);
    gt_check(k_quant_fp8_act(NULL, 0, 256, NULL, NULL, 0) == 0 &&
                 k_kv_stage_fp8(NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, 8, 128, 32, 0) == 0,
             "bf16 mode again: the same no-ops succeed");
}

/* ---- timing */

template <typename F> static float median_ms(F &&run)
{
    cudaEvent_t e0, e1;
    GPU_OK(cudaEventCreate(&e0));
    GPU_OK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        run();
    std::vector<float> t(20);
    for (int i = 0; i < 20; i++) {
        GPU_OK(cudaEventRecord(e0));
        run();
        GPU_OK(cudaEventRecord(e1));
        GPU_OK(cudaEventSynchronize(e1));
        GPU_OK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return t[10];
}

/* timing inputs: hashed values in [-4, 4) (zeros would time the division's zero-operand path) */
template <typename T> __global__ void fill_hashed(T *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = (T)(((float)(h & 0xffffu) / 65536.f - 0.5f) * 8.f);
    }
}

static void timing(void)
{
    const int T = 8192, C = 5120, F = 17408;
    bf16 *x = gt_poisoned<bf16>((size_t)T * 2 * F), *w = gt_poisoned<bf16>(C),
         *out = gt_poisoned<bf16>((size_t)T * F);
    float *res = gt_poisoned<float>((size_t)T * C), *s = gt_poisoned<float>((size_t)T * F / 128);
    uint8_t *q = gt_poisoned<uint8_t>((size_t)T * F);
    fill_hashed<<<1024, 256>>>(x, (size_t)T * 2 * F);
    fill_hashed<<<1024, 256>>>(w, (size_t)C);
    fill_hashed<<<1024, 256>>>(res, (size_t)T * C);
    GPU_OK(cudaGetLastError());
    float ms;
    ms = median_ms([&] { K_OK(k_quant_fp8_act(x, T, C, q, s, 0)); });
    printf("time k_quant_fp8_act T %d K %d: %.4f ms, %.2f TB/s (of 4.2)\n", T, C, ms,
           (double)T * C * 3 / ms * 1e-9);
    ms = median_ms([&] { K_OK(k_add_rmsnorm(res, x, w, out, T, C, 1e-6f, 0)); });
    printf("time k_add_rmsnorm      T %d C %d: %.4f ms, %.2f TB/s\n", T, C, ms,
           (double)T * C * 12 / ms * 1e-9);
    ms = median_ms([&] { K_OK(k_add_rmsnorm_fp8(res, x, w, NULL, q, s, T, C, 1e-6f, 0)); });
    printf("time k_add_rmsnorm_fp8  T %d C %d (no bf16 out): %.4f ms, %.2f TB/s\n", T, C, ms,
           (double)T * C * 15 / ms * 1e-9);
    ms = median_ms([&] { K_OK(k_silu_mul(x, out, T, F, 0)); });
    printf("time k_silu_mul         T %d F %d: %.4f ms, %.2f TB/s\n", T, F, ms,
           (double)T * F * 6 / ms * 1e-9);
    ms = median_ms([&] { K_OK(k_silu_mul_fp8(x, NULL, q, s, T, F, 0)); });
    printf("time k_silu_mul_fp8     T %d F %d (no bf16 out): %.4f ms, %.2f TB/s\n", T, F, ms,
           (double)T * F * 5 / ms * 1e-9);
    bf16 *W = gt_poisoned<bf16>((size_t)2 * F * C);
    GPU_OK(cudaMemset(W, 0, (size_t)2 * F * C * 2));
    uint8_t *Wq = gt_poisoned<uint8_t>((size_t)2 * F * C);
    float *ws = gt_poisoned<float>((size_t)2 * F / 128 * (C / 128));
    ms = median_ms([&] { K_OK(k_quant_fp8_weight(W, 2 * F, C, Wq, ws, NULL, 0)); });
    printf("time k_quant_fp8_weight %dx%d (load time): %.4f ms, %.2f TB/s\n", 2 * F, C, ms,
           (double)2 * F * C * 3 / ms * 1e-9);
    cudaFree(x), cudaFree(w), cudaFree(out), cudaFree(res), cudaFree(s), cudaFree(q), cudaFree(W),
        cudaFree(Wq), cudaFree(ws);
}

int main(void)
{
    gpu_require();
    uint64_t seed = gt_seed() | 1;

    /* argument checks */
    gt_check(k_quant_fp8_act(NULL, 4, 200, NULL, NULL, 0) == -1 && strstr(k_last_error(), "multiple of 128"),
             "act K 200 fails cleanly: \"%s\"", k_last_error());
    gt_check(k_quant_fp8_act(NULL, 0, 256, NULL, NULL, 0) == 0, "act M 0 is a no-op");
    gt_check(k_silu_mul_fp8(NULL, NULL, NULL, NULL, 4, 100, 0) == -1, "silu F 100 fails cleanly: \"%s\"",
             k_last_error());
    gt_check(k_add_rmsnorm_fp8(NULL, NULL, NULL, NULL, NULL, NULL, 4, 96, 1e-6f, 0) == -1,
             "rmsnorm cols 96 fails cleanly: \"%s\"", k_last_error());
    gt_check(k_quant_fp8_weight(NULL, 0, 128, NULL, NULL, NULL, 0) == -1, "weight N 0 fails cleanly: \"%s\"",
             k_last_error());
    case_fp16_refused();

    case_weight(300, 200, &seed, "edges");
    case_weight(5, 7, &seed, "smaller than a block");
    case_weight(384, 640, &seed, "aligned");
    case_weight(1024, 5120, &seed, "14B rows");
    case_weight(129, 4096, &seed, "129 rows");

    const int Ms[] = {1, 2, 7, 16, 129, 1000};
    const int Ks[] = {128, 640, 5120};
    for (int M : Ms)
        for (int K : Ks)
            case_act(M, K, &seed);

    case_rmsnorm(1, 5120, true, true, &seed);
    case_rmsnorm(7, 5120, true, false, &seed);
    case_rmsnorm(129, 1024, true, true, &seed);
    case_rmsnorm(33, 640, false, true, &seed);
    case_rmsnorm(5, 128, false, false, &seed);
    case_rmsnorm(3, 8192, true, true, &seed);    /* the widest row whose groups a thread loads at once */
    case_rmsnorm(2, 2176, true, false, &seed);   /* 17 groups: 3 for some warps, 2 for others */
    case_rmsnorm(300, 17408, true, true, &seed); /* wider than 8 warps x 128: several groups per warp */

    case_silu(1, 17408, true, &seed);
    case_silu(7, 384, false, &seed);
    case_silu(129, 3072, true, &seed);
    case_silu(1000, 128, true, &seed);

    timing();
    GPU_OK(cudaDeviceSynchronize());
    printf("%s: %d failure(s)\n", gt_failures ? "FAILED" : "PASSED", gt_failures);
    return gt_failures ? 1 : 0;
}
