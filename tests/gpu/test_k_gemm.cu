/* k_gemm_bf16 (cuBLASLt) against a double reference: Y[M, N] = X[M, K] . W[N, K]^T.
 *
 * Both 16-bit modes (kernels.h, k_set_f16): every 16-bit case (small, odd, tune buckets, the Qwen3-14B
 * shapes, and k_linear on a 16-bit weight) runs in bf16 and again in fp16, inputs made in the mode's
 * type, the reference on those rounded inputs; each line names its mode. The FP8 cases run in bf16
 * only, and fp16 mode must refuse k_gemm_fp8, k_gemv_fp8 and k_linear on an fp8 weight.
 *
 * Shapes: every GEMM of Qwen3-14B (C 5120, H 40, KVH 8, D 128, F 17408, V 151936) at M = 1, 3, 16,
 * 128, 1000, 4096, checked on 2000 random (m, n) pairs plus the four corners (the reference costs
 * K multiply-adds per output), with the whole output scanned on the device for NaN/inf (outputs are
 * poisoned first, so an unwritten tile shows); small and odd shapes are checked in full.
 *
 * Tolerances. The products of bf16 inputs are exact in fp32; what differs from the double reference
 * is the fp32 accumulation (bounded, per output, by a small multiple of 2^-24 * sum_k |x_k w_k|; we
 * allow atol = 2e-6 * sum_k |x_k w_k|, 30x the random-walk estimate of sequential fp32 summation
 * and far more than blocked tensor-core summation gives) and then the output rounding:
 * - bf16 out: |got - ref| <= 2^-8 * 1.001 * |ref| + atol per element (half an ulp of bf16), and
 *   ||got - ref|| / ||ref|| <= 4e-3;
 * - fp32 out (logits): |got - ref| <= 1e-6 * |ref| + atol, norm-relative <= 5e-5.
 * fp16 mode: the products of fp16 inputs (11-bit significands) are exact in fp32 too, so atol is the
 * same, and fp16 out is |got - ref| <= 2^-11 * 1.001 * |ref| + atol (half an ulp of fp16), norm-relative
 * <= 5e-4 (the rounding's rms is ~2.1e-4 of |ref|, at most 2^-11 = 4.9e-4). A product done on
 * bf16-rounded inputs instead errs by ~2.3e-3 (rms) of each term, so by ~2.3e-3 of |ref| over the
 * sum (random signs): several times the norm tolerance, and past the per-element bound for much of
 * the output (~6e-4 at K = 5120, where sum_k |x_k w_k| ~ 45 and |ref| ~ 1), in both output types.
 * Inputs are fresh random numbers from a seeded hash on the device (seed printed; LLMQ_TEST_SEED=N
 * reproduces); X ~ N(0, 1), W ~ N(0, 1/K) so outputs are O(1).
 *
 * Alignment: cuBLASLt's bf16 tensor-core kernels want 16-byte aligned rows, so N and K multiples of
 * 8; the backend only has such shapes. Odd N or K must either compute the right answer (the
 * heuristic offers a slower kernel) or fail cleanly with a message; both are reported.
 *
 * Timing: each Qwen3-14B shape, median of 20 runs after 3 warm-ups, rotating among enough weight
 * copies (>= 256 MiB in all) that L2 (50 MiB) cannot serve them; printed as weight bandwidth (N K 2
 * bytes over the time) and TFLOP/s (2 M N K over the time), against the H200's measured 4.2 TB/s
 * copy and 776 TFLOP/s bf16 dense.
 *
 * FP8 (k_gemm_fp8, k_gemv_*, k_linear). W and X are quantized on the device (k_quant_fp8_weight,
 * k_quant_fp8_act: tested bit for bit in test_k_quant) and the reference is the double product of
 * the dequantized codes (e4m3 value x scale), so only the GEMM is judged: per element
 * |got - ref| <= 2^-8 * 1.001 * |ref| (bf16 output) + FP8_ATOL_FRAC * sum_k |x_k w_k| (Hopper's FP8
 * tensor cores add products inside a 128-deep block with fewer than fp32's bits before the fp32
 * promotion; 1e-4 of the magnitude is ~800 fp32 ulps, while a wrong scale or block index is off by
 * O(1)), norm-relative <= 4e-3. k_gemv_fp8 takes X in bf16 (not quantized): its reference is bf16 X
 * times dequantized W. k_linear must match the reference of whichever path it took (it measures and
 * chooses; cuBLASLt takes the quantized X, its GEMV bf16 X); it passes if it matches either; given bf16
 * X alone (M <= 8) it must match bf16 X. M in 1, 2,
 * 7, 16, 129, 1000; N and K odd multiples of 128 and a non-multiple N (partial scale block: correct or a
 * clean failure). k_gemm_fp8's layouts (kernels.h): Xq, x_scale and Y hold Mp = K_FP8_ROWS(M) rows (the pad
 * rows are filled with stale finite data first: they must not change the real rows) and w_scale is padded to
 * K_FP8_KB(K) blocks per row (built here from k_quant_fp8_weight's checkpoint layout; K = 256, 384, 640 have
 * 2, 3, 5 blocks). Every M >= 2 must run correctly; cuBLASLt may offer no algorithm at M = 1
 * (reported, not a failure: k_linear takes the GEMV there). Timing at the Qwen3-14B shapes for M = 1 .. 4096:
 * cuBLASLt bf16, cuBLASLt fp8, GEMV bf16, GEMV fp8, and k_linear's choice, as weight TB/s (fp8
 * moves half the bytes) and TFLOP/s (fp8 dense peak measured 1416). */
#include <algorithm>
#include <cmath>
#include <errno.h>
#include <stdarg.h>
#include <string>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu/gpu_test.h"
#include <cuda_fp16.h>

extern "C" {
#include "engine/dtype.h"
#include "engine/gemm_tuning.h"
#include "engine/util/scratch_dir.h"
}

#define BF16_RTOL (1.0 / 256 * 1.001)
#define F16_RTOL (1.0 / 2048 * 1.001)
#define F32_RTOL 1e-6
#define ATOL_FRAC 2e-6

static uint64_t base_seed;

/* A 16-bit element of the mode's type (bits in a bf16 slot) as a float, exactly. */
static float elt_f(bf16 v)
{
    uint16_t b;
    memcpy(&b, &v, 2);
    return gt_h2f(b);
}

/* ---- device helpers (test-local kernels) */

/* p[i] = bf16 (f16: fp16) of scale * approx N(0,1): the sum of four 16-bit uniforms of one hash,
 * standardized */
__global__ void fill_kernel(bf16 *p, size_t n, uint64_t seed, float scale, int f16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = gt_splitmix(seed ^ (i * 0xd1342543de82ef95ull));
        float a = 0;
        for (int j = 0; j < 4; j++)
            a += (float)((h >> (16 * j)) & 0xffff) * (1.f / 65536.f);
        const float v = (a - 2.f) * 1.7320508f * scale; /* var of 4 U(0,1) is 1/3 */
        if (f16)
            ((__half *)p)[i] = __float2half_rn(v);
        else
            p[i] = __float2bfloat16(v);
    }
}
/* in the current mode's type */
static void fill(bf16 *p, size_t n, uint64_t seed, float scale)
{
    fill_kernel<<<1024, 256>>>(p, n, seed, scale, gt_f16);
    GPU_OK(cudaGetLastError());
}

/* Y[i] as a float: fp32, fp16 (f16) or bf16 */
__device__ float y_at(const void *y, int f32, int f16, size_t i)
{
    return f32   ? ((const float *)y)[i]
           : f16 ? __half2float(((const __half *)y)[i])
                 : __bfloat162float(((const bf16 *)y)[i]);
}

__global__ void count_nonfinite_kernel(const void *y, int f32, int f16, size_t n, unsigned long long *count)
{
    unsigned long long c = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = y_at(y, f32, f16, i);
        c += !isfinite(v);
    }
    if (c)
        atomicAdd(count, c);
}
static unsigned long long count_nonfinite(const void *y, int f32, size_t n)
{
    unsigned long long *d, h = 0;
    GPU_OK(cudaMalloc(&d, sizeof *d));
    GPU_OK(cudaMemset(d, 0, sizeof *d));
    count_nonfinite_kernel<<<1024, 256>>>(y, f32, gt_f16, n, d);
    GPU_OK(cudaGetLastError());
    GPU_OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    GPU_OK(cudaFree(d));
    return h;
}

__global__ void gather_kernel(const void *y, int f32, int f16, const size_t *idx, int n, float *out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = y_at(y, f32, f16, idx[i]);
}

static std::vector<bf16> to_host(const bf16 *d, size_t n)
{
    std::vector<bf16> h(n);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    return h;
}

/* ---- one checked product */

struct gemm_case {
    const char *name;
    int M, N, K, y_f32;
    int x_off, w_off, y_off; /* element offsets into the buffers (alignment tests) */
    bool odd;                /* odd N or K: a clean failure is acceptable */
};

/* Checks Y against the reference on `pairs` (m, n) (all of them when pairs is empty).
 * X, W, Y are device pointers of the product itself. Returns false on failure. */
static bool verify(const char *what, const bf16 *X, const bf16 *W, const void *Y, int y_f32, int M, int N,
                   int K, std::vector<std::pair<int, int>> pairs)
{
    bool full = pairs.empty();
    if (full)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                pairs.push_back({m, n});
    unsigned long long bad_values = count_nonfinite(Y, y_f32, (size_t)M * N);

    /* gather the sampled outputs on the device */
    const int P = (int)pairs.size();
    std::vector<size_t> idx(P);
    for (int i = 0; i < P; i++)
        idx[i] = (size_t)pairs[i].first * N + pairs[i].second;
    size_t *didx;
    float *dout;
    GPU_OK(cudaMalloc(&didx, P * sizeof(size_t)));
    GPU_OK(cudaMalloc(&dout, P * sizeof(float)));
    GPU_OK(cudaMemcpy(didx, idx.data(), P * sizeof(size_t), cudaMemcpyHostToDevice));
    gather_kernel<<<(P + 255) / 256, 256>>>(Y, y_f32, gt_f16, didx, P, dout);
    GPU_OK(cudaGetLastError());
    std::vector<float> got(P);
    GPU_OK(cudaMemcpy(got.data(), dout, P * sizeof(float), cudaMemcpyDeviceToHost));
    GPU_OK(cudaFree(didx));
    GPU_OK(cudaFree(dout));

    /* the rows of X and W the samples need */
    std::vector<bf16> xh = to_host(X, (size_t)M * K);
    std::vector<int> rows_w;
    for (auto &p : pairs)
        rows_w.push_back(p.second);
    std::sort(rows_w.begin(), rows_w.end());
    rows_w.erase(std::unique(rows_w.begin(), rows_w.end()), rows_w.end());
    std::vector<int> w_at(N, -1);
    std::vector<bf16> wh(rows_w.size() * (size_t)K);
    if (full || rows_w.size() * 4 > (size_t)N) {
        wh = to_host(W, (size_t)N * K);
        for (int n = 0; n < N; n++)
            w_at[n] = n;
    } else
        for (size_t r = 0; r < rows_w.size(); r++) {
            GPU_OK(
                cudaMemcpy(&wh[r * K], W + (size_t)rows_w[r] * K, K * sizeof(bf16), cudaMemcpyDeviceToHost));
            w_at[rows_w[r]] = (int)r;
        }

    double num = 0, den = 0, worst = -1, worst_got = 0, worst_ref = 0;
    const double rtol = y_f32 ? F32_RTOL : gt_f16 ? F16_RTOL : BF16_RTOL;
    size_t bad = 0, nan = 0;
    int worst_m = 0, worst_n = 0;
    std::vector<float> xf(K);
    int last_m = -1;
    for (int i = 0; i < P; i++) {
        const int m = pairs[i].first, n = pairs[i].second;
        if (m != last_m) {
            for (int k = 0; k < K; k++)
                xf[k] = elt_f(xh[(size_t)m * K + k]);
            last_m = m;
        }
        const bf16 *w = &wh[(size_t)w_at[n] * K];
        double ref = 0, mag = 0;
        for (int k = 0; k < K; k++) {
            double p = (double)xf[k] * elt_f(w[k]);
            ref += p, mag += fabs(p);
        }
        if (!std::isfinite(got[i])) {
            nan++;
            continue;
        }
        double d = fabs(got[i] - ref), bound = rtol * fabs(ref) + ATOL_FRAC * mag;
        num += d * d, den += ref * ref;
        bad += d > bound;
        if (d / bound > worst)
            worst = d / bound, worst_m = m, worst_n = n, worst_got = got[i], worst_ref = ref;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num), tol = y_f32 ? 5e-5 : gt_f16 ? 5e-4 : 4e-3;
    bool ok = bad == 0 && nan == 0 && bad_values == 0 && rel <= tol;
    printf("%s %s %-46s %s %6d checked  rel %.2e (tol %.0e)  worst |d|/bound %.3f at (%d, %d) got %.6g ref "
           "%.6g  out-of-bound %zu  nan/inf in Y %llu\n",
           ok ? "ok  " : "FAIL", gt_mode_name(), what, full ? "full   " : "sampled", P, rel, tol, worst,
           worst_m, worst_n, worst_got, worst_ref, bad, bad_values);
    if (!ok)
        gt_failures++;
    return ok;
}

/* Runs and checks one small case, full comparison. */
static void small_case(struct k_gemm *g, const gemm_case &c, uint64_t seed)
{
    bf16 *xb, *wb;
    void *yb;
    const size_t ysz = c.y_f32 ? 4 : 2;
    GPU_OK(cudaMalloc(&xb, ((size_t)c.M * c.K + c.x_off) * sizeof(bf16)));
    GPU_OK(cudaMalloc(&wb, ((size_t)c.N * c.K + c.w_off) * sizeof(bf16)));
    GPU_OK(cudaMalloc(&yb, ((size_t)c.M * c.N + c.y_off) * ysz));
    bf16 *X = xb + c.x_off, *W = wb + c.w_off;
    void *Y = (char *)yb + c.y_off * ysz;
    fill(X, (size_t)c.M * c.K, seed, 1.f);
    fill(W, (size_t)c.N * c.K, seed ^ 0x5555, 1.f / sqrtf((float)c.K));
    GPU_OK(cudaMemset(Y, 0xff, (size_t)c.M * c.N * ysz));
    char what[128];
    snprintf(what, sizeof what, "%s M %d N %d K %d %s%s", c.name, c.M, c.N, c.K,
             c.y_f32 ? "f32" : gt_mode_name(), c.x_off || c.w_off || c.y_off ? " offset" : "");
    int rc = k_gemm_bf16(g, X, W, Y, c.y_f32, c.M, c.N, c.K, 0);
    if (rc != 0 && c.odd) {
        gt_check(strlen(k_last_error()) > 0, "%s %s: not supported, failed cleanly: %s", gt_mode_name(), what,
                 k_last_error());
    } else if (rc != 0) {
        gt_check(false, "%s %s: %s", gt_mode_name(), what, k_last_error());
    } else {
        GPU_OK(cudaDeviceSynchronize());
        verify(what, X, W, Y, c.y_f32, c.M, c.N, c.K, {});
        /* the cached plan, again, on fresh poison */
        GPU_OK(cudaMemset(Y, 0xff, (size_t)c.M * c.N * ysz));
        K_OK(k_gemm_bf16(g, X, W, Y, c.y_f32, c.M, c.N, c.K, 0));
        GPU_OK(cudaDeviceSynchronize());
        snprintf(what + strlen(what), sizeof what - strlen(what), " (again)");
        verify(what, X, W, Y, c.y_f32, c.M, c.N, c.K, {});
    }
    /* k_linear on the 16-bit weight (M <= 8: the GEMV or cuBLASLt, whichever it measured faster), twice:
     * the second takes the cached choice */
    const struct k_weight kw = {0, W, NULL, c.N, c.K, NULL};
    for (int again = 0; again < 2; again++) {
        char lwhat[160];
        snprintf(lwhat, sizeof lwhat, "k_linear %s M %d N %d K %d %s%s%s", c.name, c.M, c.N, c.K,
                 c.y_f32 ? "f32" : gt_mode_name(), c.x_off || c.w_off || c.y_off ? " offset" : "",
                 again ? " (cached)" : "");
        GPU_OK(cudaMemset(Y, 0xff, (size_t)c.M * c.N * ysz));
        if (k_linear(g, X, NULL, NULL, &kw, Y, c.y_f32, c.M, 0)) {
            gt_check(c.odd && strlen(k_last_error()) > 0, "%s %s: %s", gt_mode_name(), lwhat, k_last_error());
            break;
        }
        GPU_OK(cudaDeviceSynchronize());
        verify(lwhat, X, W, Y, c.y_f32, c.M, c.N, c.K, {});
    }
    GPU_OK(cudaFree(xb));
    GPU_OK(cudaFree(wb));
    GPU_OK(cudaFree(yb));
}

/* ---- Qwen3-14B shapes: sampled check and timing */

struct big_shape {
    const char *name;
    int N, K, y_f32;
};

static void big_shape_run(struct k_gemm *g, const big_shape &s, uint64_t seed,
                          std::vector<std::string> &table)
{
    const int Ms[] = {1, 3, 16, 128, 1000, 4096};
    const int Mmax = 4096;
    const size_t wbytes = (size_t)s.N * s.K * 2, ysz = s.y_f32 ? 4 : 2;
    const int copies = (int)std::min<size_t>(8, std::max<size_t>(1, ((size_t)256 << 20) / wbytes + 1));
    bf16 *X, *Wc;
    void *Y;
    GPU_OK(cudaMalloc(&X, (size_t)Mmax * s.K * 2));
    GPU_OK(cudaMalloc(&Wc, wbytes * copies));
    GPU_OK(cudaMalloc(&Y, (size_t)Mmax * s.N * ysz));
    fill(X, (size_t)Mmax * s.K, seed, 1.f);
    fill(Wc, (size_t)s.N * s.K, seed ^ 0x77, 1.f / sqrtf((float)s.K));
    for (int c = 1; c < copies; c++)
        GPU_OK(cudaMemcpy((char *)Wc + c * wbytes, Wc, wbytes, cudaMemcpyDeviceToDevice));
    cudaEvent_t e0, e1;
    GPU_OK(cudaEventCreate(&e0));
    GPU_OK(cudaEventCreate(&e1));
    uint64_t r = seed;
    for (int M : Ms) {
        /* check: fresh poison, one product, 2000 random samples and the corners */
        GPU_OK(cudaMemset(Y, 0xff, (size_t)M * s.N * ysz));
        char what[128];
        snprintf(what, sizeof what, "%-8s M %4d N %6d K %5d %s", s.name, M, s.N, s.K,
                 s.y_f32 ? "f32" : gt_mode_name());
        if (k_gemm_bf16(g, X, Wc, Y, s.y_f32, M, s.N, s.K, 0)) {
            gt_check(false, "%s %s: %s", gt_mode_name(), what, k_last_error());
            continue;
        }
        GPU_OK(cudaDeviceSynchronize());
        std::vector<std::pair<int, int>> pairs = {{0, 0}, {0, s.N - 1}, {M - 1, 0}, {M - 1, s.N - 1}};
        for (int i = 0; i < 2000; i++)
            pairs.push_back({(int)(gt_next(&r) % (uint64_t)M), (int)(gt_next(&r) % (uint64_t)s.N)});
        std::sort(pairs.begin(), pairs.end());
        verify(what, X, Wc, Y, s.y_f32, M, s.N, s.K, pairs);

        /* time: 3 warm-ups, then 20 runs each between its own events, weights rotating */
        for (int i = 0; i < 3; i++)
            K_OK(k_gemm_bf16(g, X, (bf16 *)((char *)Wc + (i % copies) * wbytes), Y, s.y_f32, M, s.N, s.K, 0));
        std::vector<float> t(20);
        for (int i = 0; i < 20; i++) {
            const bf16 *W = (const bf16 *)((const char *)Wc + (i % copies) * wbytes);
            GPU_OK(cudaEventRecord(e0));
            K_OK(k_gemm_bf16(g, X, W, Y, s.y_f32, M, s.N, s.K, 0));
            GPU_OK(cudaEventRecord(e1));
            GPU_OK(cudaEventSynchronize(e1));
            GPU_OK(cudaEventElapsedTime(&t[i], e0, e1));
        }
        std::sort(t.begin(), t.end());
        const double ms = t[10], tbs = wbytes / ms * 1e-9, tflops = 2.0 * M * s.N * s.K / ms * 1e-9;
        char line[256];
        snprintf(
            line, sizeof line,
            "time %s %-8s M %4d N %6d K %5d %s: %9.4f ms  weights %5.2f TB/s (%3.0f%% of 4.2)  %6.1f TFLOP/s "
            "(%3.0f%% of 776)",
            gt_mode_name(), s.name, M, s.N, s.K, s.y_f32 ? "f32 " : gt_mode_name(), ms, tbs, tbs / 4.2 * 100,
            tflops, tflops / 776 * 100);
        printf("%s\n", line);
        table.push_back(line);
    }
    GPU_OK(cudaEventDestroy(e0));
    GPU_OK(cudaEventDestroy(e1));
    GPU_OK(cudaFree(X));
    GPU_OK(cudaFree(Wc));
    GPU_OK(cudaFree(Y));
}

/* ---- FP8 */

#define FP8_ATOL_FRAC 1e-4

/* Host copies of a quantized operand, dequantized: rows x K; the scales of a weight in the
 * checkpoint layout [ceil(rows/128)][G], of activations [G][K_FP8_ROWS(rows)] (M-contiguous). */
static std::vector<float> dequant(const uint8_t *dq, const float *ds, int rows, int K, bool weight)
{
    const int G = K / 128 + (K % 128 != 0), RB = (rows + 127) / 128, ld = K_FP8_ROWS(rows);
    std::vector<uint8_t> q((size_t)rows * K);
    std::vector<float> sc(weight ? (size_t)RB * G : (size_t)G * ld);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(sc.data(), ds, sc.size() * 4, cudaMemcpyDeviceToHost));
    float lut[256];
    for (int i = 0; i < 256; i++)
        lut[i] = e4m3_to_f32((uint8_t)i);
    std::vector<float> f((size_t)rows * K);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < K; k++)
            f[(size_t)r * K + k] = lut[q[(size_t)r * K + k]] * (weight ? sc[(size_t)(r / 128) * G + k / 128]
                                                                       : sc[(size_t)(k / 128) * ld + r]);
    return f;
}

/* Max over sampled outputs of |got - ref| / bound and the norm-relative error against ref = X . W^T
 * (host floats); bad counts out-of-bound and non-finite values. */
struct fp8_err {
    double worst, rel;
    size_t bad, nan;
};
static fp8_err fp8_compare(const void *Y, int y_f32, int M, int N, int K, const std::vector<float> &x,
                           const std::vector<float> &w, const std::vector<std::pair<int, int>> &pairs)
{
    fp8_err e = {0, 0, 0, 0};
    double num = 0, den = 0;
    const size_t ysz = y_f32 ? 4 : 2;
    std::vector<char> yh((size_t)M * N * ysz);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(yh.data(), Y, yh.size(), cudaMemcpyDeviceToHost));
    for (auto &p : pairs) {
        const int m = p.first, n = p.second;
        double ref = 0, mag = 0;
        for (int k = 0; k < K; k++) {
            double t = (double)x[(size_t)m * K + k] * w[(size_t)n * K + k];
            ref += t, mag += fabs(t);
        }
        const size_t i = (size_t)m * N + n;
        float got = y_f32 ? ((const float *)yh.data())[i] : __bfloat162float(((const bf16 *)yh.data())[i]);
        if (!std::isfinite(got)) {
            e.nan++;
            continue;
        }
        double d = fabs(got - ref), bound = (y_f32 ? 1e-6 : BF16_RTOL) * fabs(ref) + FP8_ATOL_FRAC * mag;
        num += d * d, den += ref * ref;
        e.bad += d > bound;
        e.worst = std::max(e.worst, d / bound);
    }
    e.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return e;
}

static bool fp8_ok(const fp8_err &e)
{
    return e.bad == 0 && e.nan == 0 && e.rel <= 4e-3;
}

static std::vector<std::pair<int, int>> sample_pairs(int M, int N, uint64_t *r)
{
    std::vector<std::pair<int, int>> pairs;
    if ((size_t)M * N <= 20000) {
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                pairs.push_back({m, n});
        return pairs;
    }
    pairs = {{0, 0}, {0, N - 1}, {M - 1, 0}, {M - 1, N - 1}};
    for (int i = 0; i < 3000; i++)
        pairs.push_back({(int)(gt_next(r) % (uint64_t)M), (int)(gt_next(r) % (uint64_t)N)});
    return pairs;
}

static void fp8_case(struct k_gemm *g, int M, int N, int K, int y_f32, bool odd, uint64_t seed)
{
    const size_t ysz = y_f32 ? 4 : 2;
    const int G = K / 128, RB = (N + 127) / 128, Mp = K_FP8_ROWS(M), KBp = K_FP8_KB(K);
    bf16 *X, *W;
    uint8_t *Xq, *Wq;
    float *xs, *ws, *ws_lt;
    void *Y;
    GPU_OK(cudaMalloc(&X, (size_t)M * K * 2));
    GPU_OK(cudaMalloc(&W, (size_t)N * K * 2));
    GPU_OK(cudaMalloc(&Xq, (size_t)Mp * K));
    GPU_OK(cudaMalloc(&Wq, (size_t)N * K));
    GPU_OK(cudaMalloc(&xs, (size_t)G * Mp * 4));
    GPU_OK(cudaMalloc(&ws, (size_t)RB * G * 4));
    GPU_OK(cudaMalloc(&ws_lt, (size_t)RB * KBp * 4));
    GPU_OK(cudaMalloc(&Y, (size_t)Mp * N * ysz));
    /* stale finite data in the pad rows (e4m3 0x3c = 1.5, scales 0x3f3f3f3f = 0.747) */
    GPU_OK(cudaMemset(Xq, 0x3c, (size_t)Mp * K));
    GPU_OK(cudaMemset(xs, 0x3f, (size_t)G * Mp * 4));
    fill(X, (size_t)M * K, seed, 1.f);
    fill(W, (size_t)N * K, seed ^ 0x5555, 1.f / sqrtf((float)K));
    K_OK(k_quant_fp8_weight(W, N, K, Wq, ws, NULL, 0));
    K_OK(k_quant_fp8_act(X, M, K, Xq, xs, 0));
    /* k_gemm_fp8's weight scales: each row of ws padded to KBp blocks (padding 0) */
    GPU_OK(cudaMemset(ws_lt, 0, (size_t)RB * KBp * 4));
    GPU_OK(cudaMemcpy2D(ws_lt, (size_t)KBp * 4, ws, (size_t)G * 4, (size_t)G * 4, (size_t)RB,
                        cudaMemcpyDeviceToDevice));
    std::vector<float> xd = dequant(Xq, xs, M, K, false), wd = dequant(Wq, ws, N, K, true), xb((size_t)M * K);
    std::vector<bf16> xh = to_host(X, (size_t)M * K);
    for (size_t i = 0; i < xb.size(); i++)
        xb[i] = __bfloat162float(xh[i]);
    uint64_t r = seed;
    const std::vector<std::pair<int, int>> pairs = sample_pairs(M, N, &r);
    char what[128];
    snprintf(what, sizeof what, "fp8 M %4d N %5d K %5d %s", M, N, K, y_f32 ? "f32" : "bf16");

    /* cuBLASLt block-scaled */
    GPU_OK(cudaMemset(Y, 0xff, (size_t)Mp * N * ysz));
    int rc = k_gemm_fp8(g, Xq, xs, Wq, ws_lt, Y, y_f32, M, N, K, 0);
    if (rc) {
        bool clean = strlen(k_last_error()) > 0;
        if (M == 1 || odd)
            gt_check(clean, "%s k_gemm_fp8: not offered, failed cleanly (%s)", what, k_last_error());
        else
            gt_check(false, "%s k_gemm_fp8: %s", what, k_last_error());
    } else {
        fp8_err e = fp8_compare(Y, y_f32, M, N, K, xd, wd, pairs);
        gt_check(fp8_ok(e),
                 "%s k_gemm_fp8   %6zu checked  rel %.2e (tol 4e-3)  worst |d|/bound %.3f  out-of-bound %zu  "
                 "nan %zu",
                 what, pairs.size(), e.rel, e.worst, e.bad, e.nan);
    }
    /* the GEMV kernels, and k_linear on bf16 X alone */
    if (M <= K_GEMV_MAX_M) {
        /* one GEMV-shaped path: run on fresh poison, compare with the reference of (xr, wr) */
        auto gemv_path = [&](const char *name, const std::vector<float> &xr, const std::vector<float> &wr,
                             auto run) {
            GPU_OK(cudaMemset(Y, 0xff, (size_t)M * N * ysz));
            if (run()) {
                gt_check(false, "%s %s: %s", what, name, k_last_error());
                return;
            }
            fp8_err e = fp8_compare(Y, y_f32, M, N, K, xr, wr, pairs);
            gt_check(fp8_ok(e),
                     "%s %-12s %6zu checked  rel %.2e  worst |d|/bound %.3f  out-of-bound %zu  nan %zu", what,
                     name, pairs.size(), e.rel, e.worst, e.bad, e.nan);
        };
        std::vector<bf16> wh = to_host(W, (size_t)N * K);
        std::vector<float> wf((size_t)N * K);
        for (size_t i = 0; i < wf.size(); i++)
            wf[i] = __bfloat162float(wh[i]);
        struct k_weight kx = {1, Wq, ws, N, K, ws_lt};
        /* bf16 X and dequantized W; k_linear given bf16 X only (the GEMV on bf16 X); the bf16 GEMV on the
         * original bf16 W */
        gemv_path("k_gemv_fp8", xb, wd, [&] { return k_gemv_fp8(X, Wq, ws, Y, y_f32, M, N, K, 1, NULL, 0); });
        gemv_path("k_linear X", xb, wd, [&] { return k_linear(g, X, NULL, NULL, &kx, Y, y_f32, M, 0); });
        gemv_path("k_gemv_bf16", xb, wf, [&] { return k_gemv_bf16(X, W, Y, y_f32, M, N, K, 1, NULL, 0); });
    }
    /* k_linear with every input a backend gives it: either path's reference */
    struct k_weight kw = {1, Wq, ws, N, K, ws_lt};
    for (int again = 0; again < 2; again++) {
        GPU_OK(cudaMemset(Y, 0xff, (size_t)M * N * ysz));
        if (k_linear(g, M <= K_GEMV_MAX_M ? X : NULL, Xq, xs, &kw, Y, y_f32, M, 0)) {
            gt_check(odd, "%s k_linear%s: %s", what, again ? " (cached)" : "", k_last_error());
            break;
        }
        fp8_err a = fp8_compare(Y, y_f32, M, N, K, xd, wd, pairs),
                b = fp8_compare(Y, y_f32, M, N, K, xb, wd, pairs);
        const fp8_err &e = fp8_ok(a) || !fp8_ok(b) ? a : b;
        gt_check(fp8_ok(e), "%s k_linear%s   rel %.2e  worst |d|/bound %.3f (as %s)", what,
                 again ? " (cached)" : "", e.rel, e.worst,
                 &e == &a ? "quantized X: cuBLASLt" : "GEMV, bf16 X");
    }
    cudaFree(X), cudaFree(W), cudaFree(Xq), cudaFree(Wq), cudaFree(xs), cudaFree(ws), cudaFree(ws_lt),
        cudaFree(Y);
}

/* Timing at a 14B shape: bf16 cuBLASLt, fp8 cuBLASLt, GEMVs and k_linear per M. */
static void fp8_timing(struct k_gemm *g, const char *name, int N, int K, std::vector<std::string> &table)
{
    const int Ms[] = {1, 2, 4, 8, 16, 64, 128, 1024, 4096};
    const int Mmax = 4096, G = K / 128;
    const size_t wb16 = (size_t)N * K * 2, wb8 = (size_t)N * K + (size_t)(N / 128) * G * 4;
    const int copies =
        (int)std::min<size_t>(8, std::max<size_t>(1, ((size_t)256 << 20) / (N * (size_t)K) + 1));
    bf16 *X, *W16, *Y;
    uint8_t *Xq, *W8;
    float *xs;
    GPU_OK(cudaMalloc(&X, (size_t)Mmax * K * 2));
    GPU_OK(cudaMalloc(&Xq, (size_t)Mmax * K));
    GPU_OK(cudaMalloc(&xs, (size_t)Mmax * G * 4));
    GPU_OK(cudaMalloc(&W16, wb16 * copies));
    GPU_OK(cudaMalloc(&W8, wb8 * copies));
    GPU_OK(cudaMalloc(&Y, (size_t)Mmax * N * 2));
    fill(X, (size_t)Mmax * K, 7, 1.f);
    fill(W16, (size_t)N * K, 9, 1.f / sqrtf((float)K));
    for (int c = 0; c < copies; c++) {
        if (c)
            GPU_OK(cudaMemcpy((char *)W16 + c * wb16, W16, wb16, cudaMemcpyDeviceToDevice));
        K_OK(k_quant_fp8_weight(W16, N, K, W8 + c * wb8, (float *)(W8 + c * wb8 + (size_t)N * K), NULL, 0));
    }
    cudaEvent_t e0, e1;
    GPU_OK(cudaEventCreate(&e0));
    GPU_OK(cudaEventCreate(&e1));
    for (int M : Ms) {
        K_OK(k_quant_fp8_act(X, M, K, Xq, xs, 0));
        /* path 0 bf16 cuBLASLt, 1 fp8 cuBLASLt, 2 GEMV bf16, 3 GEMV fp8, 4 k_linear fp8, 5 k_linear bf16 */
        float ms[6];
        for (int path = 0; path < 6; path++) {
            auto run = [&](int c) -> int {
                const bf16 *w16 = (const bf16 *)((const char *)W16 + c * wb16);
                const uint8_t *w8 = W8 + c * wb8;
                const float *s8 = (const float *)(w8 + (size_t)N * K);
                /* K / 128 is 40 or 136 here, a multiple of 4: the checkpoint scales are k_gemm_fp8's */
                struct k_weight k8 = {1, w8, s8, N, K, NULL}, k16 = {0, w16, NULL, N, K, NULL};
                switch (path) {
                case 0:
                    return k_gemm_bf16(g, X, w16, Y, 0, M, N, K, 0);
                case 1:
                    return k_gemm_fp8(g, Xq, xs, w8, s8, Y, 0, M, N, K, 0);
                case 2:
                    return M <= K_GEMV_MAX_M ? k_gemv_bf16(X, w16, Y, 0, M, N, K, 1, NULL, 0) : -1;
                case 3:
                    return M <= K_GEMV_MAX_M ? k_gemv_fp8(X, w8, s8, Y, 0, M, N, K, 1, NULL, 0) : -1;
                case 4:
                    return k_linear(g, M <= K_GEMV_MAX_M ? X : NULL, Xq, xs, &k8, Y, 0, M, 0);
                default:
                    return k_linear(g, X, NULL, NULL, &k16, Y, 0, M, 0);
                }
            };
            ms[path] = -1;
            bool ok = true;
            for (int i = 0; i < 3 && ok; i++)
                ok = run(i % copies) == 0;
            if (!ok) {
                (void)cudaGetLastError();
                continue;
            }
            std::vector<float> t(20);
            for (int i = 0; i < 20; i++) {
                GPU_OK(cudaEventRecord(e0));
                K_OK(run(i % copies));
                GPU_OK(cudaEventRecord(e1));
                GPU_OK(cudaEventSynchronize(e1));
                GPU_OK(cudaEventElapsedTime(&t[i], e0, e1));
            }
            std::sort(t.begin(), t.end());
            ms[path] = t[10];
        }
        char line[512];
        size_t o = (size_t)snprintf(line, sizeof line, "time fp8 %-8s M %4d N %6d K %5d:", name, M, N, K);
        const char *label[6] = {"lt bf16", "lt fp8", "gemv bf16", "gemv fp8", "linear fp8", "linear bf16"};
        for (int path = 0; path < 6; path++) {
            if (ms[path] < 0) {
                o += (size_t)snprintf(line + o, sizeof line - o, "  %s -", label[path]);
                continue;
            }
            const bool f8 = path == 1 || path == 3 || path == 4;
            const double tbs = (f8 ? wb8 : wb16) / ms[path] * 1e-9, tf = 2.0 * M * N * K / ms[path] * 1e-9;
            o += (size_t)snprintf(line + o, sizeof line - o, "  %s %.1f us (%.2f TB/s, %.0f TFLOP/s)",
                                  label[path], ms[path] * 1000, tbs, tf);
        }
        printf("%s\n", line);
        table.push_back(line);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(X), cudaFree(Xq), cudaFree(xs), cudaFree(W16), cudaFree(W8), cudaFree(Y);
}

/* ---- tune buckets: an M <= 256 takes the algorithm timed for its bucket (1, 2, 4, multiples of 8)
 * when there is one; each step's product is checked in full, and the handle's counts must move as
 * kernels/gemm.cu says: the first M of a bucket and its top are timed, any other M borrows. Then the
 * 16-bit steps again in fp16 on the same handle: the counts must move the same way (fp16 plans are
 * their own, never bf16's), and every product must be right in fp16. */
static void tune_bucket_cases(uint64_t seed)
{
    struct k_gemm *h = k_gemm_create(0);
    if (!h) {
        gt_check(false, "k_gemm_create: %s", k_last_error());
        return;
    }
    struct step {
        int M, tuned, borrowed; /* the counts' change that M must make (tuned -1: 0 or 1) */
        bool fp8;               /* fp8 plans are keyed by K_FP8_ROWS(M) */
    };
    const step steps[] = {
        {37, 1, 0, false},  /* first of bucket 40: timed, kept as the bucket's representative */
        {38, 0, 1, false},  /* borrows 37's algorithm */
        {40, 1, 0, false},  /* the top (a graph's batch size) is timed exactly */
        {33, 0, 1, false},  /* borrows the top's */
        {3, 1, 0, false},   /* bucket 4 */
        {4, 1, 0, false},   /* its top */
        {300, 0, 0, false}, /* above 256: the heuristic's pick, never timed */
        {301, 0, 0, false}, /* nor borrowed */
        {37, -1, 0, true},  /* fp8: 40 rows, the top (timed if cuBLASLt offers more than one algorithm) */
        {33, 0, 1, true},   /* 36 rows: borrows it */
    };
    uint64_t k = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (const step &st : steps) {
            if (f16 && st.fp8)
                continue;
            gt_set_mode(f16);
            struct k_gemm_counts c0, c1;
            k_gemm_get_counts(h, &c0);
            if (st.fp8)
                fp8_case(h, st.M, 384, 640, 0, false, gt_splitmix(seed + k++));
            else
                small_case(h, {"bucket", st.M, 1024, 512, 0, 0, 0, 0, false}, gt_splitmix(seed + k++));
            k_gemm_get_counts(h, &c1);
            const int dt = c1.tuned - c0.tuned;
            gt_check((st.tuned < 0 ? dt <= 1 : dt == st.tuned) && c1.borrowed - c0.borrowed == st.borrowed,
                     "tune bucket %s M %d: timed %d, borrowed %d (want %d, %d)",
                     st.fp8 ? "fp8" : gt_mode_name(), st.M, dt, c1.borrowed - c0.borrowed, st.tuned,
                     st.borrowed);
        }
    gt_set_mode(0);
    k_gemm_free(h);
}

/* ---- the tuning file (k_gemm_use_tuning_file, engine/gemm_tuning.h) */

struct tuning_shape {
    int M, N, K, y_f32;
    bool linear; /* k_linear on a bf16 weight (the GEMV-or-cuBLASLt choice) instead of k_gemm_bf16 */
};
static const tuning_shape tuning_shapes[] = {
    {1, 5120, 5120, 0, true},    {4, 5120, 5120, 0, true},   {8, 5120, 5120, 1, false},
    {37, 1024, 512, 0, false},   {38, 1024, 512, 0, false},  {40, 1024, 512, 0, false},
    {256, 5120, 5120, 0, false}, {300, 1024, 512, 0, false},
};

/* Runs every tuning shape on h over X, W (5120 x 5120 at most) into Y; the outputs' bytes, in order. */
static std::vector<std::vector<uint8_t>> tuning_run(struct k_gemm *h, const bf16 *X, const bf16 *W, void *Y)
{
    std::vector<std::vector<uint8_t>> out;
    for (const tuning_shape &t : tuning_shapes) {
        const size_t bytes = (size_t)t.M * t.N * (t.y_f32 ? 4 : 2);
        GPU_OK(cudaMemset(Y, 0xff, bytes));
        const struct k_weight kw = {0, W, NULL, t.N, t.K, NULL};
        const int rc = t.linear ? k_linear(h, X, NULL, NULL, &kw, Y, t.y_f32, t.M, 0)
                                : k_gemm_bf16(h, X, W, Y, t.y_f32, t.M, t.N, t.K, 0);
        gt_check(rc == 0, "tuning file: %s M %d N %d K %d: %s", t.linear ? "k_linear" : "k_gemm_bf16", t.M,
                 t.N, t.K, rc ? k_last_error() : "");
        GPU_OK(cudaDeviceSynchronize());
        std::vector<uint8_t> h_y(bytes);
        GPU_OK(cudaMemcpy(h_y.data(), Y, bytes, cudaMemcpyDeviceToHost));
        out.push_back(h_y);
    }
    return out;
}

static std::string file_text(const std::string &path)
{
    std::string t;
    FILE *f = fopen(path.c_str(), "r");
    if (!f)
        return t;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        t.append(buf, n);
    fclose(f);
    return t;
}

/* A handle that writes the file, a second that reads it: the second makes no choice (no timing) and
 * computes every product bit for bit as the first; a file whose algorithms are another shape's and
 * whose choices are unsound still gives right products (checked against the reference) and makes
 * those choices again; a file for another identity is replaced; a file that is not a tuning file is
 * neither used nor written. */
static void tuning_file_cases(uint64_t seed)
{
    gt_set_mode(0);
    char dir[600];
    if (scratch_dir_make(getenv("TMPDIR"), "gemm-tuning", dir, sizeof dir)) {
        gt_check(false, "tuning file: mkdtemp: %s", strerror(errno));
        return;
    }
    const std::string path = std::string(dir) + "/gemm.tuning", foreign = std::string(dir) + "/not-ours";
    bf16 *X, *W;
    void *Y;
    GPU_OK(cudaMalloc(&X, (size_t)300 * 5120 * 2));
    GPU_OK(cudaMalloc(&W, (size_t)5120 * 5120 * 2));
    GPU_OK(cudaMalloc(&Y, (size_t)300 * 5120 * 4));
    fill(X, (size_t)300 * 5120, seed, 1.f);
    fill(W, (size_t)5120 * 5120, seed ^ 0x5555, 1.f / sqrtf(5120.f));
    char msg[1024];
    struct k_gemm_counts c;

    /* the writer */
    struct k_gemm *h1 = k_gemm_create(0);
    int rc = k_gemm_use_tuning_file(h1, path.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_NO_FILE, "tuning file: a new path is no file yet (%d: %s)", rc, msg);
    const auto out1 = tuning_run(h1, X, W, Y);
    const auto out1b = tuning_run(h1, X, W, Y); /* the same handle again: the kernels repeat themselves */
    k_gemm_get_counts(h1, &c);
    const int made1 = c.made;
    gt_check(c.made >= 8 && c.tuned > 0 && c.loaded == 0,
             "tuning file: the writer made %d choices (%d timed), "
             "loaded %d",
             c.made, c.tuned, c.loaded);
    gt_check(out1 == out1b, "tuning file: one handle twice gives the same bits");
    rc = k_gemm_save_tuning(h1, msg, sizeof msg);
    gt_check(rc == 1, "tuning file: written (%d: %s)", rc, msg);
    rc = k_gemm_save_tuning(h1, msg, sizeof msg);
    gt_check(rc == 0, "tuning file: nothing new, not written again (%d)", rc);
    k_gemm_free(h1);

    /* the reader */
    struct k_gemm *h2 = k_gemm_create(0);
    rc = k_gemm_use_tuning_file(h2, path.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_LOADED, "tuning file: read back (%d: %s)", rc, msg);
    const auto out2 = tuning_run(h2, X, W, Y);
    k_gemm_get_counts(h2, &c);
    gt_check(c.made == 0 && c.tuned == 0 && c.loaded > 0 && c.loaded <= made1,
             "tuning file: the reader made %d choices (%d timed), took %d from the file (the writer made %d)",
             c.made, c.tuned, c.loaded, made1);
    for (size_t i = 0; i < out1.size() && i < out2.size(); i++)
        gt_check(out1[i] == out2[i], "tuning file: %s M %d N %d K %d: the reader's bits are the writer's",
                 tuning_shapes[i].linear ? "k_linear" : "k_gemm_bf16", tuning_shapes[i].M, tuning_shapes[i].N,
                 tuning_shapes[i].K);
    rc = k_gemm_save_tuning(h2, msg, sizeof msg);
    gt_check(rc == 0, "tuning file: the reader has nothing new to write (%d: %s)", rc, msg);
    k_gemm_free(h2);

    /* unsound entries: every plan gets the next plan's algorithm, every choice an unknown path */
    const std::string text = file_text(path);
    const size_t id0 = text.find("\nidentity ") + 10, id1 = text.find('\n', id0);
    const std::string identity = text.substr(id0, id1 - id0);
    struct gemm_tuning t = {NULL, 0, 0};
    rc = gemm_tuning_load(&t, path.c_str(), identity.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_LOADED && t.n > 0, "tuning file: read by the format module (%d: %s)", rc, msg);
    int first = -1;
    for (int i = 0; i < t.n; i++)
        if (!strncmp(t.e[i].kind, "choice", 6))
            t.e[i].path = 7;
        else if (first < 0)
            first = i;
        else
            std::swap(t.e[i].algo, t.e[first].algo); /* a rotation through the plans */
    gt_check(gemm_tuning_save(&t, path.c_str(), identity.c_str(), msg, sizeof msg) == 0, "tuning file: %s",
             msg);
    gemm_tuning_free(&t);
    struct k_gemm *h3 = k_gemm_create(0);
    rc = k_gemm_use_tuning_file(h3, path.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_LOADED, "tuning file: the altered file read (%d: %s)", rc, msg);
    uint64_t r = seed;
    for (const tuning_shape &ts : tuning_shapes) {
        GPU_OK(cudaMemset(Y, 0xff, (size_t)ts.M * ts.N * (ts.y_f32 ? 4 : 2)));
        const struct k_weight kw = {0, W, NULL, ts.N, ts.K, NULL};
        rc = ts.linear ? k_linear(h3, X, NULL, NULL, &kw, Y, ts.y_f32, ts.M, 0)
                       : k_gemm_bf16(h3, X, W, Y, ts.y_f32, ts.M, ts.N, ts.K, 0);
        gt_check(rc == 0, "tuning file (altered): M %d N %d K %d: %s", ts.M, ts.N, ts.K,
                 rc ? k_last_error() : "");
        GPU_OK(cudaDeviceSynchronize());
        char what[96];
        snprintf(what, sizeof what, "tuning file (altered) %s M %d N %d K %d",
                 ts.linear ? "k_linear" : "gemm", ts.M, ts.N, ts.K);
        verify(what, X, W, Y, ts.y_f32, ts.M, ts.N, ts.K, sample_pairs(ts.M, ts.N, &r));
    }
    k_gemm_get_counts(h3, &c);
    gt_check(c.made > 0, "tuning file (altered): the unsound choices were made again (%d made, %d loaded)",
             c.made, c.loaded);
    k_gemm_free(h3);

    /* another identity: set aside, replaced at the save */
    t = {NULL, 0, 0};
    gt_check(gemm_tuning_save(&t, path.c_str(), "another GPU", msg, sizeof msg) == 0, "tuning file: %s", msg);
    struct k_gemm *h4 = k_gemm_create(0);
    rc = k_gemm_use_tuning_file(h4, path.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_OTHER_ID && strstr(msg, "another GPU"),
             "tuning file: another identity set aside "
             "(%d: %s)",
             rc, msg);
    tuning_run(h4, X, W, Y);
    rc = k_gemm_save_tuning(h4, msg, sizeof msg);
    gt_check(rc == 1, "tuning file: replaced (%d: %s)", rc, msg);
    k_gemm_free(h4);
    rc = gemm_tuning_load(&t, path.c_str(), identity.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_LOADED && t.n > 0,
             "tuning file: the replacement is this device's (%d, %d entries)", rc, t.n);
    gemm_tuning_free(&t);

    /* not a tuning file: neither used nor written */
    FILE *f = fopen(foreign.c_str(), "w");
    if (f) {
        fputs("engine:\n  gemm_tuning_file: here\n", f);
        fclose(f);
    }
    struct k_gemm *h5 = k_gemm_create(0);
    rc = k_gemm_use_tuning_file(h5, foreign.c_str(), msg, sizeof msg);
    gt_check(rc == GEMM_TUNING_FOREIGN, "tuning file: not a tuning file (%d: %s)", rc, msg);
    tuning_run(h5, X, W, Y);
    rc = k_gemm_save_tuning(h5, msg, sizeof msg);
    gt_check(rc == 0 && file_text(foreign) == "engine:\n  gemm_tuning_file: here\n",
             "tuning file: a foreign file is left as it was (%d)", rc);
    k_gemm_free(h5);

    GPU_OK(cudaFree(X));
    GPU_OK(cudaFree(W));
    GPU_OK(cudaFree(Y));
    scratch_dir_remove(dir);
}

/* fp16 mode has no fp8 path: the fp8 launchers fail at once (before looking at their arguments) */
static void fp8_refused_in_f16(struct k_gemm *g)
{
    gt_set_mode(1);
    int rc = k_gemm_fp8(g, NULL, NULL, NULL, NULL, NULL, 0, 4, 128, 128, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "bf16 only"), "fp16 k_gemm_fp8 refused: \"%s\"",
             k_last_error());
    rc = k_gemv_fp8(NULL, NULL, NULL, NULL, 0, 1, 128, 128, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "bf16 only"), "fp16 k_gemv_fp8 refused: \"%s\"",
             k_last_error());
    static const uint8_t dummy[16] = {0};
    const float one = 1.f;
    const struct k_weight kw = {1, dummy, &one, 128, 128, NULL};
    rc = k_linear(g, NULL, NULL, NULL, &kw, (void *)dummy, 0, 1, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "bf16 only"), "fp16 k_linear (fp8 W) refused: \"%s\"",
             k_last_error());
    gt_set_mode(0);
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();

    setenv("LLMQ_GEMM_LOG", "1", 0); /* stderr: the algorithm cuBLASLt chose for each shape */
    struct k_gemm *g = k_gemm_create(0);
    if (!g) {
        printf("FAIL k_gemm_create: %s\n", k_last_error());
        return 1;
    }
    /* argument checks */
    gt_check(k_gemm_bf16(g, NULL, NULL, NULL, 0, 0, 64, 64, 0) == 0, "gemm M 0 is a no-op");
    int rc = k_gemm_bf16(g, NULL, NULL, NULL, 0, 4, 0, 64, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "N 0"), "gemm N 0 fails cleanly: \"%s\"", k_last_error());
    rc = k_gemm_bf16(NULL, NULL, NULL, NULL, 0, 4, 8, 8, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "NULL handle"), "gemm without a handle fails cleanly: \"%s\"",
             k_last_error());

    /* small and odd shapes, full check */
    const gemm_case small[] = {
        {"small", 37, 300, 200, 0, 0, 0, 0, false},
        {"small", 37, 300, 200, 1, 0, 0, 0, false},
        {"small", 1, 8, 8, 0, 0, 0, 0, false},
        {"small", 5, 24, 64, 1, 0, 0, 0, false},
        {"small", 129, 264, 136, 0, 0, 0, 0, false},
        {"small", 64, 512, 4096, 0, 0, 0, 0, false},
        {"small", 3, 1000, 256, 1, 0, 0, 0, false}, /* offsets: 16-byte aligned, not 256 */
        {"small", 37, 304, 200, 0, 8, 8, 8, false},
        {"small", 37, 304, 200, 1, 8, 16, 4, false},
        /* odd N / K: correct, or a clean failure */
        {"odd", 37, 301, 200, 0, 0, 0, 0, true},
        {"odd", 37, 300, 203, 0, 0, 0, 0, true},
        {"odd", 7, 301, 203, 1, 0, 0, 0, true},
        {"odd", 37, 300, 200, 0, 1, 0, 0, true},
    };
    uint64_t k = 1;
    for (int f16 = 0; f16 < 2; f16++) { /* fp16 on the same handle: its plans must be its own */
        gt_set_mode(f16);
        for (const gemm_case &c : small)
            small_case(g, c, gt_splitmix(base_seed + k++));
    }
    gt_set_mode(0);
    tune_bucket_cases(gt_splitmix(base_seed + k++));
    tuning_file_cases(gt_splitmix(base_seed + k++));
    fp8_refused_in_f16(g);

    /* Qwen3-14B */
    const big_shape big[] = {
        {"qkv", (40 + 16) * 128, 5120, 0}, {"o_proj", 5120, 5120, 0},    {"gate_up", 2 * 17408, 5120, 0},
        {"down", 5120, 17408, 0},          {"lm_head", 151936, 5120, 1},
    };
    std::vector<std::string> table;
    for (int f16 = 0; f16 < 2; f16++) {
        gt_set_mode(f16);
        for (const big_shape &s : big)
            big_shape_run(g, s, gt_splitmix(base_seed + k++), table);
    }
    gt_set_mode(0);

    /* FP8: correctness at small and edge shapes, then the 14B shapes (sampled), then timing */
    const int fp8_Ms[] = {1, 2, 7, 16, 129, 1000};
    const int fp8_NK[][3] = {
        {384, 640, 0}, {896, 384, 0}, {128, 128, 0}, {400, 256, 1} /* N not a multiple of 128 */};
    for (int M : fp8_Ms)
        for (auto &nk : fp8_NK)
            fp8_case(g, M, nk[0], nk[1], 0, nk[2] != 0, gt_splitmix(base_seed + k++));
    fp8_case(g, 16, 384, 640, 1, false, gt_splitmix(base_seed + k++)); /* fp32 output */
    const int fp8_big[][2] = {{(40 + 16) * 128, 5120}, {5120, 5120}, {2 * 17408, 5120}, {5120, 17408}};
    for (auto &nk : fp8_big)
        for (int M : {1, 7, 129})
            fp8_case(g, M, nk[0], nk[1], 0, false, gt_splitmix(base_seed + k++));
    const char *fp8_names[] = {"qkv", "o_proj", "gate_up", "down"};
    for (int i = 0; i < 4; i++)
        fp8_timing(g, fp8_names[i], fp8_big[i][0], fp8_big[i][1], table);
    k_gemm_free(g);
    k_gemm_free(NULL);

    printf("\nsummary (median of 20, weights rotating through >= 256 MiB):\n");
    for (auto &l : table)
        printf("%s\n", l.c_str());
    GPU_OK(cudaDeviceSynchronize());
    printf("%s: %d failure(s)\n", gt_failures ? "FAILED" : "PASSED", gt_failures);
    return gt_failures ? 1 : 0;
}
