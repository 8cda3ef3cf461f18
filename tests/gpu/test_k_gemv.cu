/* k_gemv_bf16 / k_gemv_fp8 (kernels/gemv.cu) against a double reference: Y[M, N] = X[M, K] . W[N, K]^T
 * for M = 1 .. K_GEMV_MAX_M, plus the split's parts left to the caller (k_gemv_fp8_parts: their sum is
 * k_gemv_fp8's Y bit for bit), argument errors, graph capture, and timing beside k_gemm_bf16 (cuBLASLt).
 * Both of a weight type's configurations (kernels/gemv.cu, gemv_pick) are reached through the shapes
 * that choose them: N below 16 rows an SM (narrow) and N of at least that (wide).
 *
 * Inputs are fresh random numbers per run (seed printed; LLMQ_TEST_SEED=N reproduces a run):
 * X ~ N(0, 1) bf16; bf16 W ~ N(0, 1/K); fp8 W: 90% of the codes are e4m3(N(0, 1) * 64) (so up to
 * the +-448 edge), 10% are uniformly random codes (subnormals and every exponent; not the NaN codes
 * 0x7f / 0xff), with fp32 block scales drawn in [0.5, 2] / (64 sqrt(K)) per 128 x 128 block. The
 * reference decodes the same bytes with engine/dtype.h's e4m3_to_f32 (not the kernel's bit trick)
 * and sums x * w * scale in double.
 *
 * Tolerance, per element: |got - ref| <= rtol * |ref| + atol with
 *   rtol = 2^-8 * 1.001 for bf16 Y (half an ulp of bf16 is <= 2^-9 of the value: 2x margin),
 *          2^-22 for fp32 Y (one fp32 rounding is 2^-24);
 *   atol = 2^-16 * sqrt(K) * max_k |x_k w_k s_k|: fp32 accumulation. The products are exact in
 *          fp32 (bf16 x bf16); each add errs by <= 2^-23 of a partial sum (tensor cores may
 *          truncate), partial sums grow like sqrt(k) * rms|xw|, and the K/16 adds' errors add up
 *          like a random walk: about 2^-23 * K / 4 * rms|xw| in all, 1.5e-4 rms|xw| at K = 5120,
 *          against atol = 1.1e-3 max|xw| there. A dropped or doubled product (~ rms|xw|) or a
 *          wrong scale fails it by orders of magnitude.
 * and per case the norm-relative error ||got - ref|| <= tol * ||ref|| + rms(atol) with tol 4e-3 (bf16
 * Y; uniform rounding gives ~1.1e-3) or 5e-5 (fp32 Y). rms(atol), one output's
 * accumulation allowance, is for the cases of a single output (N = 1, M = 1), whose relative error
 * is that output's: a sum that cancels to near zero would fail on its fp32 accumulation error alone
 * (fp32 Y: a simulation of these inputs' fp32 sums puts 0.05-0.2 % of single-output cases past 5e-5,
 * about one run in a hundred: the likely cause of the one unexplained failure of this test). Over a
 * case of n outputs the term weighs 1 / sqrt(n) as much against tol * ||ref|| as at one output, so
 * the large cases still see a systematic relative error at about the tol level. Y is poisoned (0xFF
 * bytes: NaN) before every run, followed by a 64-element poisoned guard that must stay untouched;
 * any NaN/inf in Y fails.
 *
 * fp16 mode (kernels.h, k_set_f16): the 16-bit-weight GEMV runs again with X, W and a 16-bit Y in
 * IEEE fp16 (inputs drawn as above and rounded to fp16, the reference on those values, Y read as
 * fp16): the whole grid of M = 1 .. 8, odd N and K, y_f32 both ways; the wide configuration; offsets;
 * large x; split K; graph capture; and a sampled check with auto, split and k_gemm timing at the
 * Qwen3-14B shapes (M = 1, 2, 4, 8).
 * Tolerances: the products of fp16 inputs are exact in fp32 too (11-bit significands), so atol is the
 * same; rtol for fp16 Y is 2^-10 * 1.001 (half an ulp of fp16 is <= 2^-11 of the value: 2x margin) and
 * the norm tolerance 5e-4 (the rounding's rms is ~2.1e-4 of |Y|, at most 2^-11 = 4.9e-4). A product
 * done in bf16 instead (inputs rounded to 8-bit significands) errs by ~2.3e-3 (rms) of each term, so
 * by ~2.3e-3 of |Y| at any K (random signs): several times the norm tolerance of either output type,
 * and (fp32 Y) over 2^-22 by far. fp16 mode must refuse every fp8 launcher at once (-1, "bf16 only"),
 * M = 0 included.
 *
 * Timing (informational, never asserted): every Qwen3-14B projection at M = 1, 2, 4, 8 (the 8B
 * and 0.6B ones at M = 1 and 8), each after a sampled check of its output: median of 20 launches
 * after 3 warm-ups, issued back to back with an event between each two (no host gap), weights
 * rotating through >= 256 MiB of copies so that L2 (50 MiB) cannot serve them; printed as weight
 * TB/s against the H200's 4.2 TB/s copy bandwidth, for the automatic choice without and with the split
 * of K, and k_gemm_bf16 on the same shape (cuBLASLt). */
#include <algorithm>
#include <cmath>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <map>
#include <stdarg.h>
#include <string>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu/gpu_test.h"

extern "C" {
#include "engine/dtype.h"
}

#define BF16_RTOL (1.0 / 256 * 1.001)
#define F16_RTOL (1.0 / 1024 * 1.001)
#define F32_RTOL (1.0 / 4194304)
#define ATOL_FRAC (1.0 / 65536)
#define GUARD 64

static uint64_t base_seed;

/* ---- host problems (small cases): inputs, reference, check */

struct problem {
    bool fp8;
    bool f16; /* 16-bit W in fp16 mode: x and wb hold fp16 bits, Y (16-bit) is fp16 */
    int M, N, K;
    std::vector<uint16_t> x;  /* [M][K] bf16 (f16: fp16) bits */
    std::vector<uint16_t> wb; /* [N][K] bf16 (f16: fp16) bits (16-bit W) */
    std::vector<uint8_t> wq;  /* [N][K] e4m3 (fp8) */
    std::vector<float> sc;    /* [ceil(N/128)][ceil(K/128)] (fp8) */
    std::vector<double> ref, atol;
};

/* a 16-bit value of the mode's type (f16: IEEE fp16, else bf16) to and from float */
static float e16f(bool f16, uint16_t b)
{
    return f16 ? f16_to_f32(b) : bf16_to_f32(b);
}
static uint16_t f_e16(bool f16, float f)
{
    return f16 ? f32_to_f16(f) : f32_to_bf16(f);
}

static const char *dt_name(const problem &p)
{
    return p.fp8 ? "fp8 " : p.f16 ? "fp16" : "bf16";
}

/* kind: 0 normal inputs; 1 fp8 codes restricted to subnormals and zero, scale 1 (a decode that
 * flushes subnormals gives 0); 2 X with large magnitudes (x 1000, a few outliers of 3e4).
 * f16 (16-bit W only): X and W in fp16, for fp16 mode. */
static void make_problem(problem &p, bool fp8, int M, int N, int K, uint64_t seed, int kind = 0,
                         bool f16 = false)
{
    uint64_t s = seed | 1;
    p.fp8 = fp8, p.f16 = !fp8 && f16, p.M = M, p.N = N, p.K = K;
    p.x.resize((size_t)M * K);
    for (auto &v : p.x) {
        float f = gt_normal(&s);
        if (kind == 2) {
            f *= gt_next(&s) % 97 == 0 ? 30000.f : 1000.f;
            if (p.f16) /* fp16's largest finite value is 65504 */
                f = fmaxf(-60000.f, fminf(60000.f, f));
        }
        v = f_e16(p.f16, f);
    }
    const int nb = (N + 127) / 128, kb = (K + 127) / 128;
    if (!fp8) {
        p.wb.resize((size_t)N * K);
        const float sd = 1.f / sqrtf((float)K);
        for (auto &v : p.wb)
            v = f_e16(p.f16, gt_normal(&s) * sd);
    } else {
        p.wq.resize((size_t)N * K);
        for (auto &v : p.wq) {
            if (kind == 1) {
                const uint8_t sub = (uint8_t)(gt_next(&s) % 8); /* 0 .. 7: zero and the subnormals */
                v = sub | (gt_next(&s) & 1 ? 0x80 : 0);
            } else
                v = gt_random_e4m3(&s);
        }
        p.sc.resize((size_t)nb * kb);
        for (auto &v : p.sc)
            v = kind == 1 ? 1.f : (0.5f + 0.75f * (gt_uniform(&s) + 1.f)) / (64.f * sqrtf((float)K));
    }
    /* reference */
    p.ref.assign((size_t)M * N, 0), p.atol.assign((size_t)M * N, 0);
    std::vector<double> xf((size_t)M * K), wrow(K);
    for (size_t i = 0; i < xf.size(); i++)
        xf[i] = e16f(p.f16, p.x[i]);
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++)
            wrow[k] =
                fp8 ? (double)e4m3_to_f32(p.wq[(size_t)n * K + k]) * p.sc[(size_t)(n / 128) * kb + k / 128]
                    : (double)e16f(p.f16, p.wb[(size_t)n * K + k]);
        for (int m = 0; m < M; m++) {
            double acc = 0, mx = 0;
            const double *x = &xf[(size_t)m * K];
            for (int k = 0; k < K; k++) {
                const double pr = x[k] * wrow[k];
                acc += pr, mx = std::max(mx, fabs(pr));
            }
            p.ref[(size_t)m * N + n] = acc;
            p.atol[(size_t)m * N + n] = ATOL_FRAC * sqrt((double)K) * mx;
        }
    }
}

struct dev_problem {
    char *xa = nullptr, *wa = nullptr;
    bf16 *X = nullptr;
    void *W = nullptr;
    float *S = nullptr;
    void *Y = nullptr; /* M*N + GUARD elements */
};

/* off: byte offset of X and W inside their allocations (16-byte multiples are valid) */
static dev_problem upload(const problem &p, size_t off = 0)
{
    dev_problem d;
    const size_t xb = p.x.size() * 2, wb = p.fp8 ? p.wq.size() : p.wb.size() * 2;
    GPU_OK(cudaMalloc(&d.xa, xb + off));
    GPU_OK(cudaMalloc(&d.wa, wb + off));
    d.X = (bf16 *)(d.xa + off), d.W = d.wa + off;
    GPU_OK(cudaMemcpy(d.X, p.x.data(), xb, cudaMemcpyHostToDevice));
    GPU_OK(cudaMemcpy(d.W, p.fp8 ? (const void *)p.wq.data() : (const void *)p.wb.data(), wb,
                      cudaMemcpyHostToDevice));
    if (p.fp8) {
        GPU_OK(cudaMalloc(&d.S, p.sc.size() * 4));
        GPU_OK(cudaMemcpy(d.S, p.sc.data(), p.sc.size() * 4, cudaMemcpyHostToDevice));
    }
    GPU_OK(cudaMalloc(&d.Y, ((size_t)p.M * p.N + GUARD) * 4));
    return d;
}

static void release(dev_problem &d)
{
    GPU_OK(cudaFree(d.xa));
    GPU_OK(cudaFree(d.wa));
    GPU_OK(cudaFree(d.S));
    GPU_OK(cudaFree(d.Y));
    d = dev_problem();
}

static void poison(const problem &p, dev_problem &d, int y_f32, cudaStream_t st = 0)
{
    GPU_OK(cudaMemsetAsync(d.Y, 0xff, ((size_t)p.M * p.N + GUARD) * (y_f32 ? 4 : 2), st));
}

/* the split-K workspace (K_GEMV_WS_BYTES, zeroed once in main) */
static void *g_ws;
/* the device's SMs: N of at least 16 x g_sms rows takes the wide configuration, less the narrow one */
static int g_sms;

/* in the problem's mode (fp16 for p.f16), then back to bf16; ks 1: no split and no workspace, otherwise
 * that split (0 = automatic) with g_ws */
static int launch(const problem &p, dev_problem &d, int y_f32, cudaStream_t st = 0, int ks = 1)
{
    k_set_f16(p.f16 ? 1 : 0);
    void *ws = ks == 1 ? NULL : g_ws;
    const int rc = p.fp8 ? k_gemv_fp8(d.X, (const uint8_t *)d.W, d.S, d.Y, y_f32, p.M, p.N, p.K, ks, ws, st)
                         : k_gemv_bf16(d.X, (const bf16 *)d.W, d.Y, y_f32, p.M, p.N, p.K, ks, ws, st);
    k_set_f16(0);
    return rc;
}

/* Compares Y (and its guard) with the reference; one line. */
static bool verify(const char *what, const problem &p, dev_problem &d, int y_f32)
{
    const size_t n = (size_t)p.M * p.N, es = y_f32 ? 4 : 2;
    std::vector<uint8_t> raw((n + GUARD) * es);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(raw.data(), d.Y, raw.size(), cudaMemcpyDeviceToHost));
    size_t guard_bad = 0, nonfinite = 0, bad = 0, worst_i = 0;
    for (size_t i = n * es; i < raw.size(); i++)
        guard_bad += raw[i] != 0xff;
    double num = 0, den = 0, aa = 0, worst = -1;
    std::vector<float> got(n);
    /* the per-element rtol and the norm tolerance of a 16-bit Y, by its type */
    const double rtol = y_f32 ? F32_RTOL : p.f16 ? F16_RTOL : BF16_RTOL, tol16 = p.f16 ? 5e-4 : 4e-3;
    for (size_t i = 0; i < n; i++) {
        if (y_f32)
            memcpy(&got[i], &raw[i * 4], 4);
        else {
            uint16_t b;
            memcpy(&b, &raw[i * 2], 2);
            got[i] = e16f(p.f16, b);
        }
        if (!std::isfinite(got[i])) {
            nonfinite++;
            continue;
        }
        const double dd = fabs(got[i] - p.ref[i]), bound = rtol * fabs(p.ref[i]) + p.atol[i];
        num += dd * dd, den += p.ref[i] * p.ref[i], aa += p.atol[i] * p.atol[i];
        bad += dd > bound;
        if (dd / bound > worst)
            worst = dd / bound, worst_i = i;
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num), tol = y_f32 ? 5e-5 : tol16;
    const bool ok = !nonfinite && !guard_bad && !bad && sqrt(num) <= tol * sqrt(den) + sqrt(aa / (n ? n : 1));
    gt_check(
        ok,
        "%-44s rel %.2e (tol %.0e) worst |d|/bound %.3f at (m %zu, n %zu) got %.6g ref %.6g  out-of-bound "
        "%zu  "
        "nan/inf %zu  guard %s",
        what, rel, tol, worst, worst_i / p.N, worst_i % p.N, got[worst_i], p.ref[worst_i], bad, nonfinite,
        guard_bad ? "OVERWRITTEN" : "ok");
    if (ok && rel > tol) // passed on the accumulation allowance alone (the header): worth seeing
        printf("note: %s passed on the accumulation allowance (rel %.2e over tol %.0e; |ref| %.3g, rms atol "
               "%.3g)\n",
               what, rel, tol, sqrt(den / (n ? n : 1)), sqrt(aa / (n ? n : 1)));
    return ok;
}

/* runs: launches (each on fresh poison, so a split's second launch checks the tickets were left at 0) */
static void run_case(const problem &p, int y_f32, const char *tag, size_t off = 0, int ks = 1, int runs = 1)
{
    dev_problem d = upload(p, off);
    for (int r = 0; r < runs; r++) {
        poison(p, d, y_f32);
        char what[160];
        const char *yt = y_f32 ? "f32 " : p.f16 ? "fp16" : "bf16";
        snprintf(what, sizeof what, "%s %s M %d N %4d K %4d %s%s ks %d run %d", tag, dt_name(p), p.M, p.N,
                 p.K, yt, off ? " +off" : "", ks, r + 1);
        if (launch(p, d, y_f32, 0, ks))
            gt_check(false, "%s: %s", what, k_last_error());
        else
            verify(what, p, d, y_f32);
    }
    release(d);
}

/* k_gemv_fp8_parts (ks as given) against k_gemv_fp8 with the same split: the parts added in part
 * order from 0 and rounded to bf16 are Y bit for bit, nothing past the parts is written, and the number
 * of parts is the split's (capped at K's chunks). Also checks Y itself against the reference. */
static void parts_case(const problem &p, int ks)
{
    dev_problem d = upload(p);
    const size_t mn = (size_t)p.M * p.N, cap = K_GEMV_MAX_SPLIT * mn + GUARD;
    float *parts = nullptr;
    GPU_OK(cudaMalloc(&parts, cap * 4));
    GPU_OK(cudaMemset(parts, 0xff, cap * 4));
    poison(p, d, 0);
    char what[160];
    snprintf(what, sizeof what, "parts M %d N %4d K %5d ks %d", p.M, p.N, p.K, ks);
    const int n = k_gemv_fp8_parts(d.X, (const uint8_t *)d.W, d.S, parts, p.M, p.N, p.K, ks, 0);
    if (n < 1 || k_gemv_fp8(d.X, (const uint8_t *)d.W, d.S, d.Y, 0, p.M, p.N, p.K, ks, g_ws, 0)) {
        gt_check(false, "%s: %s", what, k_last_error());
        GPU_OK(cudaFree(parts));
        release(d);
        return;
    }
    const int chunks = (p.K + 127) / 128;
    std::vector<float> h(cap);
    std::vector<uint16_t> y(mn);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h.data(), parts, cap * 4, cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(y.data(), d.Y, mn * 2, cudaMemcpyDeviceToHost));
    size_t differ = 0, guard = 0;
    for (size_t i = 0; i < mn; i++) {
        float sum = 0.f;
        for (int q = 0; q < n; q++)
            sum += h[(size_t)q * mn + i];
        differ += f_e16(false, sum) != y[i];
    }
    for (size_t i = (size_t)n * mn; i < cap; i++) {
        uint32_t b;
        memcpy(&b, &h[i], 4);
        guard += b != 0xffffffffu;
    }
    const bool parts_ok = ks == 0 ? n >= 1 && n <= K_GEMV_MAX_SPLIT : n == std::min(ks, chunks);
    gt_check(!differ && !guard && parts_ok,
             "%-44s %d parts: %zu of %zu sums differ from k_gemv_fp8, %zu floats written past the parts",
             what, n, differ, mn, guard);
    verify(what, p, d, 0);
    GPU_OK(cudaFree(parts));
    release(d);
}

/* ---- argument errors */

static void argument_checks(void)
{
    bf16 *x;
    uint8_t *w;
    float *s, *y;
    GPU_OK(cudaMalloc(&x, 4096));
    GPU_OK(cudaMalloc(&w, 4096));
    GPU_OK(cudaMalloc(&s, 4096));
    GPU_OK(cudaMalloc(&y, 4096));
    const bf16 *wb = (const bf16 *)w;
    gt_check(k_gemv_bf16(NULL, NULL, NULL, 0, 0, 16, 16, 1, NULL, 0) == 0, "bf16 M 0 is a no-op returning 0");
    gt_check(k_gemv_fp8(NULL, NULL, NULL, NULL, 0, 0, 16, 16, 1, NULL, 0) == 0,
             "fp8 M 0 is a no-op returning 0");
    struct {
        const char *what;
        int rc;
    } cases[] = {
        {"bf16 M 9", k_gemv_bf16(x, wb, y, 0, 9, 16, 16, 1, NULL, 0)},
        {"bf16 M -1", k_gemv_bf16(x, wb, y, 0, -1, 16, 16, 1, NULL, 0)},
        {"fp8 M 9", k_gemv_fp8(x, w, s, y, 0, 9, 16, 16, 1, NULL, 0)},
        {"bf16 K 40", k_gemv_bf16(x, wb, y, 0, 1, 16, 40, 1, NULL, 0)},
        {"fp8 K 8", k_gemv_fp8(x, w, s, y, 0, 1, 16, 8, 1, NULL, 0)},
        {"bf16 K 0", k_gemv_bf16(x, wb, y, 0, 1, 16, 0, 1, NULL, 0)},
        {"bf16 N 0", k_gemv_bf16(x, wb, y, 0, 1, 0, 16, 1, NULL, 0)},
        {"bf16 X NULL", k_gemv_bf16(NULL, wb, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"bf16 W NULL", k_gemv_bf16(x, NULL, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"bf16 Y NULL", k_gemv_bf16(x, wb, NULL, 0, 1, 16, 16, 1, NULL, 0)},
        {"fp8 w_scale NULL", k_gemv_fp8(x, w, NULL, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"fp8 W NULL", k_gemv_fp8(x, NULL, s, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"bf16 X misaligned", k_gemv_bf16(x + 1, wb, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"fp8 W misaligned", k_gemv_fp8(x, w + 8, s, y, 0, 1, 16, 16, 1, NULL, 0)},
        {"fp8 ks 9", k_gemv_fp8(x, w, s, y, 0, 1, 16, 256, K_GEMV_MAX_SPLIT + 1, g_ws, 0)},
        {"bf16 ks -1", k_gemv_bf16(x, wb, y, 0, 1, 16, 256, -1, g_ws, 0)},
        {"bf16 ks 2 without a workspace", k_gemv_bf16(x, wb, y, 0, 1, 16, 256, 2, NULL, 0)},
        {"parts ks 9", k_gemv_fp8_parts(x, w, s, y, 1, 16, 256, K_GEMV_MAX_SPLIT + 1, 0)},
        {"parts NULL", k_gemv_fp8_parts(x, w, s, NULL, 1, 16, 256, 0, 0)},
        {"glu M 9", k_gemv_fp8_glu(x, w, s, (bf16 *)y, 9, 16, 16, 0)},
        {"glu w_scale NULL", k_gemv_fp8_glu(x, w, NULL, (bf16 *)y, 1, 16, 16, 0)},
        {"glu K 40", k_gemv_fp8_glu(x, w, s, (bf16 *)y, 1, 16, 40, 0)},
        {"glu F 12", k_gemv_fp8_glu(x, w, s, (bf16 *)y, 1, 12, 16, 0)},
    };
    for (auto &c : cases)
        gt_check(c.rc == -1, "%s fails with -1 (rc %d)", c.what, c.rc);
    /* the messages (k_last_error holds the latest only) */
    int rc = k_gemv_bf16(x, wb, y, 0, 9, 16, 16, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "M 9"), "M 9 message: \"%s\"", k_last_error());
    rc = k_gemv_bf16(x, wb, y, 0, 1, 16, 40, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "K 40"), "K 40 message: \"%s\"", k_last_error());
    rc = k_gemv_fp8(x, w, s, y, 0, 1, 0, 16, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "N 0"), "N 0 message: \"%s\"", k_last_error());
    rc = k_gemv_fp8(x, w, NULL, y, 0, 1, 16, 16, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "NULL"), "NULL w_scale message: \"%s\"", k_last_error());
    rc = k_gemv_bf16(x + 4, wb, y, 0, 1, 16, 16, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "aligned"), "misaligned X message: \"%s\"", k_last_error());
    rc = k_gemv_fp8(x, w, s, y, 0, 1, 16, 256, 2, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "workspace"), "split without workspace message: \"%s\"",
             k_last_error());
    gt_check(k_gemv_bf16(NULL, NULL, NULL, 0, 0, 16, 16, 2, NULL, 0) == 0, "split M 0 is a no-op");

    /* fp16 mode: the 16-bit GEMV checks its arguments as in bf16; every fp8 launcher fails at once
     * (M 0 included: no fp8 path exists in fp16 mode), then bf16 mode is restored */
    k_set_f16(1);
    gt_check(k_gemv_bf16(NULL, NULL, NULL, 0, 0, 16, 16, 1, NULL, 0) == 0, "fp16 M 0 is a no-op returning 0");
    rc = k_gemv_bf16(x, wb, y, 0, 9, 16, 16, 1, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "M 9"), "fp16 M 9 message: \"%s\"", k_last_error());
    rc = k_gemv_bf16(x, wb, y, 0, 1, 16, 256, 2, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "workspace"), "fp16 split without workspace message: \"%s\"",
             k_last_error());
    /* rc is the call's, and k_last_error() still its message when the check runs */
    auto refused = [](const char *what, int rc) {
        gt_check(rc == -1 && strstr(k_last_error(), "bf16 only"), "fp16 %s refused (rc %d): \"%s\"", what, rc,
                 k_last_error());
    };
    refused("k_gemv_fp8", k_gemv_fp8(x, w, s, y, 0, 1, 16, 16, 1, NULL, 0));
    refused("k_gemv_fp8 M 0", k_gemv_fp8(NULL, NULL, NULL, NULL, 0, 0, 16, 16, 1, NULL, 0));
    refused("k_gemv_fp8 split", k_gemv_fp8(x, w, s, y, 0, 1, 16, 256, 2, g_ws, 0));
    refused("k_gemv_fp8_parts", k_gemv_fp8_parts(x, w, s, y, 1, 16, 256, 0, 0));
    refused("k_gemv_fp8_glu", k_gemv_fp8_glu(x, w, s, (bf16 *)y, 1, 16, 16, 0));
    k_set_f16(0);
    gt_check(k_f16() == 0 && k_gemv_fp8(NULL, NULL, NULL, NULL, 0, 0, 16, 16, 1, NULL, 0) == 0,
             "bf16 mode restored: fp8 M 0 is a no-op again");
    GPU_OK(cudaGetLastError()); /* no launch happened: no sticky error either */
    GPU_OK(cudaFree(x));
    GPU_OK(cudaFree(w));
    GPU_OK(cudaFree(s));
    GPU_OK(cudaFree(y));
}

/* ---- k_gemv_fp8_glu against k_gemv_fp8 in the same configuration + k_silu_mul: the same bits. The fused
 * kernel computes in the wide configuration, so the unfused GEMV runs on a matrix of at least 16 rows an
 * SM: the 2F rows of gate_up, then (for a small F) more random rows, which only make the shape wide.
 * graph: the fused launch captured into a graph and replayed twice instead of launched directly. */

static void glu_case(int M, int F, int K, uint64_t seed, bool graph)
{
    problem p;
    make_problem(p, true, M, std::max(2 * F, 16 * g_sms), K, seed); /* rows 0 .. 2F-1: gate_up */
    dev_problem d = upload(p);
    bf16 *ref, *got;
    const size_t n = (size_t)M * F;
    GPU_OK(cudaMalloc(&ref, n * 2));
    GPU_OK(cudaMalloc(&got, (n + GUARD) * 2));
    char what[96];
    snprintf(what, sizeof what, "glu M %d F %4d K %4d%s", M, F, K, graph ? " graph x2" : "");
    poison(p, d, 0);
    int rc = launch(p, d, 0);
    if (!rc) {
        verify(what, p, d, 0); /* the unfused gate_up itself against the double reference */
        for (int m = 0; m < M && !rc; m++)
            rc = k_silu_mul((const bf16 *)d.Y + (size_t)m * p.N, ref + (size_t)m * F, 1, F, 0);
    }
    cudaStream_t st;
    GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraphExec_t exec = NULL;
    if (!rc && graph) {
        cudaGraph_t gr;
        GPU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        rc = k_gemv_fp8_glu(d.X, (const uint8_t *)d.W, d.S, got, M, F, K, st);
        GPU_OK(cudaStreamEndCapture(st, &gr));
        GPU_OK(cudaGraphInstantiate(&exec, gr, 0));
        GPU_OK(cudaGraphDestroy(gr));
    }
    for (int rep = 0; rep < (graph ? 2 : 1) && !rc; rep++) {
        GPU_OK(cudaMemsetAsync(got, 0xff, (n + GUARD) * 2, st));
        if (graph)
            GPU_OK(cudaGraphLaunch(exec, st));
        else
            rc = k_gemv_fp8_glu(d.X, (const uint8_t *)d.W, d.S, got, M, F, K, st);
        GPU_OK(cudaStreamSynchronize(st));
        std::vector<uint16_t> a(n), b(n + GUARD);
        GPU_OK(cudaMemcpy(a.data(), ref, n * 2, cudaMemcpyDeviceToHost));
        GPU_OK(cudaMemcpy(b.data(), got, (n + GUARD) * 2, cudaMemcpyDeviceToHost));
        size_t diff = 0, guard = 0, first = n;
        for (size_t i = 0; i < n; i++)
            if (a[i] != b[i] && diff++ == 0)
                first = i;
        for (size_t i = n; i < n + GUARD; i++)
            guard += b[i] != 0xffff;
        gt_check(!diff && !guard,
                 "%s run %d: fused = gate_up GEMV + k_silu_mul bit for bit (%zu differ%s%s), guard %s", what,
                 rep + 1, diff, diff ? ", first at " : "",
                 diff ? (std::to_string(first / F) + "," + std::to_string(first % F)).c_str() : "",
                 guard ? "OVERWRITTEN" : "ok");
    }
    if (rc)
        gt_check(false, "%s: %s", what, k_last_error());
    if (exec)
        GPU_OK(cudaGraphExecDestroy(exec));
    GPU_OK(cudaStreamDestroy(st));
    GPU_OK(cudaFree(ref));
    GPU_OK(cudaFree(got));
    release(d);
}

/* ---- CUDA graph capture: both launchers captured on a non-blocking stream, replayed twice */

static void graph_check(uint64_t seed)
{
    problem pb, pf, ph;
    make_problem(pb, false, 3, 300, 640, seed);
    make_problem(pf, true, 5, 257, 656, seed ^ 0xabc);
    make_problem(ph, false, 4, 300, 640, seed ^ 0x123, 0, true); /* fp16, captured in fp16 mode */
    dev_problem db = upload(pb), df = upload(pf), dh = upload(ph);
    cudaStream_t st;
    GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GPU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    int rb = launch(pb, db, 0, st), rf = launch(pf, df, 1, st, 3); /* fp8: K split in 3 */
    int rh = launch(ph, dh, 0, st, 2);                             /* fp16: split in 2 */
    GPU_OK(cudaStreamEndCapture(st, &graph));
    gt_check(rb == 0 && rf == 0 && rh == 0, "launchers inside stream capture return 0 (%d, %d, %d) %s", rb,
             rf, rh, rb || rf || rh ? k_last_error() : "");
    GPU_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; rep++) {
        poison(pb, db, 0, st);
        poison(pf, df, 1, st);
        poison(ph, dh, 0, st);
        GPU_OK(cudaGraphLaunch(exec, st)); /* in bf16 mode: the graph keeps the fp16 kernel it captured */
        GPU_OK(cudaStreamSynchronize(st));
        verify(rep ? "graph replay 2 bf16 M 3 N 300 K 640" : "graph replay 1 bf16 M 3 N 300 K 640", pb, db,
               0);
        verify(rep ? "graph replay 2 fp8 M 5 N 257 K 656 f32 ks 3"
                   : "graph replay 1 fp8 M 5 N 257 K 656 f32 ks 3",
               pf, df, 1);
        verify(rep ? "graph replay 2 fp16 M 4 N 300 K 640 ks 2" : "graph replay 1 fp16 M 4 N 300 K 640 ks 2",
               ph, dh, 0);
    }
    GPU_OK(cudaGraphExecDestroy(exec));
    GPU_OK(cudaGraphDestroy(graph));
    GPU_OK(cudaStreamDestroy(st));
    release(db);
    release(df);
    release(dh);
}

/* ---- big shapes: device-side random inputs, sampled check, timing */

/* f16: the values in IEEE fp16 (bits in the bf16 slots) */
__global__ void fill_bf16_kernel(bf16 *p, size_t n, uint64_t seed, float scale, int f16 = 0)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = gt_splitmix(seed ^ (i * 0xd1342543de82ef95ull));
        float a = 0;
        for (int j = 0; j < 4; j++)
            a += (float)((h >> (16 * j)) & 0xffff) * (1.f / 65536.f);
        const float v = (a - 2.f) * 1.7320508f * scale; /* 4 U(0,1): mean 2, var 1/3 */
        if (f16)
            ((__half *)p)[i] = __float2half_rn(v);
        else
            p[i] = __float2bfloat16(v);
    }
}

__global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = gt_splitmix(seed ^ (i * 0xd1342543de82ef95ull));
        float a = 0;
        for (int j = 0; j < 4; j++)
            a += (float)((h >> (16 * j)) & 0xffff) * (1.f / 65536.f);
        p[i] = (uint8_t)__nv_cvt_float_to_fp8((a - 2.f) * 1.7320508f * 64.f, __NV_SATFINITE, __NV_E4M3);
    }
}

__global__ void fill_scale_kernel(float *p, size_t n, uint64_t seed, float base)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = base * (0.5f + 1.5f * (float)(gt_splitmix(seed ^ i) >> 40) * (1.f / 16777216.f));
}

struct big_shape {
    const char *model, *name;
    int N, K, y_f32;
};

struct timing {
    double ms = 0, tbs = 0;
};

/* median of 20 back-to-back launches (3 warm-ups), an event between each two */
template <typename F> static timing time_it(F launch_i, double bytes)
{
    cudaEvent_t ev[21];
    for (auto &e : ev)
        GPU_OK(cudaEventCreate(&e));
    bool failed = false;
    for (int i = 0; i < 3 && !failed; i++)
        failed = launch_i(i) != 0;
    GPU_OK(cudaEventRecord(ev[0]));
    for (int i = 0; i < 20 && !failed; i++) {
        failed = launch_i(i + 3) != 0;
        GPU_OK(cudaEventRecord(ev[i + 1]));
    }
    GPU_OK(cudaDeviceSynchronize());
    timing r;
    if (!failed) {
        std::vector<float> t(20);
        for (int i = 0; i < 20; i++)
            GPU_OK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
        std::sort(t.begin(), t.end());
        r.ms = 0.5 * (t[9] + t[10]);
        r.tbs = bytes / r.ms * 1e-9;
    } else
        printf("note: a timed launch failed: %s\n", k_last_error());
    for (auto &e : ev)
        GPU_OK(cudaEventDestroy(e));
    return r;
}

/* Sampled check of Y (the automatic choice) on 64 rows n (0, N-1 and 62 random) for every m. */
static void big_verify(const char *what, bool fp8, const bf16 *X, const void *W, const float *S,
                       const void *Y, int y_f32, int M, int N, int K, uint64_t *rng, bool f16 = false)
{
    std::vector<int> rows = {0, N - 1};
    for (int i = 0; i < 62 && i < N - 2; i++)
        rows.push_back((int)(gt_next(rng) % (uint64_t)N));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    const int kb = (K + 127) / 128;
    std::vector<uint16_t> xh((size_t)M * K);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(xh.data(), X, xh.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> xd((size_t)M * K);
    for (size_t i = 0; i < xd.size(); i++)
        xd[i] = e16f(f16, xh[i]);
    /* every output must be finite */
    const size_t es = y_f32 ? 4 : 2;
    std::vector<uint8_t> yraw((size_t)M * N * es);
    GPU_OK(cudaMemcpy(yraw.data(), Y, yraw.size(), cudaMemcpyDeviceToHost));
    auto yval = [&](size_t i) {
        if (y_f32) {
            float f;
            memcpy(&f, &yraw[i * 4], 4);
            return f;
        }
        uint16_t b;
        memcpy(&b, &yraw[i * 2], 2);
        return e16f(f16, b);
    };
    size_t nonfinite = 0;
    for (size_t i = 0; i < (size_t)M * N; i++)
        nonfinite += !std::isfinite(yval(i));
    std::vector<uint16_t> wb(K);
    std::vector<uint8_t> wq(K);
    std::vector<float> sc(kb);
    std::vector<double> w(K);
    double num = 0, den = 0, aa = 0, worst = -1, wgot = 0, wref = 0;
    const double rtol = y_f32 ? F32_RTOL : f16 ? F16_RTOL : BF16_RTOL, tol16 = f16 ? 5e-4 : 4e-3;
    size_t bad = 0, checked = 0;
    int wm = 0, wn = 0;
    for (int n : rows) {
        if (fp8) {
            GPU_OK(cudaMemcpy(wq.data(), (const uint8_t *)W + (size_t)n * K, K, cudaMemcpyDeviceToHost));
            GPU_OK(cudaMemcpy(sc.data(), S + (size_t)(n / 128) * kb, kb * 4, cudaMemcpyDeviceToHost));
            for (int k = 0; k < K; k++)
                w[k] = (double)e4m3_to_f32(wq[k]) * sc[k / 128];
        } else {
            GPU_OK(cudaMemcpy(wb.data(), (const bf16 *)W + (size_t)n * K, K * 2, cudaMemcpyDeviceToHost));
            for (int k = 0; k < K; k++)
                w[k] = e16f(f16, wb[k]);
        }
        for (int m = 0; m < M; m++) {
            double ref = 0, mx = 0;
            for (int k = 0; k < K; k++) {
                const double pr = xd[(size_t)m * K + k] * w[k];
                ref += pr, mx = std::max(mx, fabs(pr));
            }
            const double got = yval((size_t)m * N + n);
            if (!std::isfinite(got))
                continue;
            const double atol = ATOL_FRAC * sqrt((double)K) * mx;
            const double d = fabs(got - ref), bound = rtol * fabs(ref) + atol;
            num += d * d, den += ref * ref, aa += atol * atol, checked++;
            bad += d > bound;
            if (d / bound > worst)
                worst = d / bound, wm = m, wn = n, wgot = got, wref = ref;
        }
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num), tol = y_f32 ? 5e-5 : tol16;
    gt_check(
        !nonfinite && !bad && sqrt(num) <= tol * sqrt(den) + sqrt(aa / (checked ? checked : 1)),
        "%-44s sampled %4zu  rel %.2e (tol %.0e) worst |d|/bound %.3f at (m %d, n %d) got %.6g ref %.6g  "
        "out-of-bound %zu  nan/inf in Y %zu",
        what, checked, rel, tol, worst, wm, wn, wgot, wref, bad, nonfinite);
}

/* f16: the 16-bit GEMV in fp16 mode too (its own fp16 X and W) */
static void big_shape_run(struct k_gemm *g, const big_shape &s, const std::vector<int> &Ms, uint64_t seed,
                          std::vector<std::string> &summary, bool f16 = false)
{
    const size_t nk = (size_t)s.N * s.K, ysz = s.y_f32 ? 4 : 2;
    const int nb = (s.N + 127) / 128, kb = (s.K + 127) / 128;
    const size_t bytes_bf16 = nk * 2, bytes_fp8 = nk + (size_t)nb * kb * 4;
    const size_t min_total = (size_t)256 << 20;
    const int copies16 = (int)(min_total / bytes_bf16 + 1);
    const int copies8 = (int)(min_total / nk + 1);
    bf16 *X, *Wb, *X16 = NULL, *W16 = NULL;
    uint8_t *Wq;
    float *S;
    void *Y;
    GPU_OK(cudaMalloc(&X, (size_t)K_GEMV_MAX_M * s.K * 2));
    GPU_OK(cudaMalloc(&Wb, bytes_bf16 * copies16));
    GPU_OK(cudaMalloc(&Wq, nk * copies8));
    GPU_OK(cudaMalloc(&S, (size_t)nb * kb * 4 * copies8));
    GPU_OK(cudaMalloc(&Y, (size_t)K_GEMV_MAX_M * s.N * ysz));
    if (f16) {
        GPU_OK(cudaMalloc(&X16, (size_t)K_GEMV_MAX_M * s.K * 2));
        GPU_OK(cudaMalloc(&W16, bytes_bf16 * copies16));
        fill_bf16_kernel<<<1024, 256>>>(X16, (size_t)K_GEMV_MAX_M * s.K, seed ^ 0x16, 1.f, 1);
        fill_bf16_kernel<<<1024, 256>>>(W16, nk, seed ^ 0x1616, 1.f / sqrtf((float)s.K), 1);
        GPU_OK(cudaGetLastError());
        for (int c = 1; c < copies16; c++)
            GPU_OK(cudaMemcpy((char *)W16 + c * bytes_bf16, W16, bytes_bf16, cudaMemcpyDeviceToDevice));
    }
    fill_bf16_kernel<<<1024, 256>>>(X, (size_t)K_GEMV_MAX_M * s.K, seed, 1.f);
    fill_bf16_kernel<<<1024, 256>>>(Wb, nk, seed ^ 0x77, 1.f / sqrtf((float)s.K));
    fill_e4m3_kernel<<<1024, 256>>>(Wq, nk, seed ^ 0x99);
    fill_scale_kernel<<<64, 256>>>(S, (size_t)nb * kb, seed ^ 0x55, 1.f / (64.f * sqrtf((float)s.K)));
    GPU_OK(cudaGetLastError());
    for (int c = 1; c < copies16; c++)
        GPU_OK(cudaMemcpy((char *)Wb + c * bytes_bf16, Wb, bytes_bf16, cudaMemcpyDeviceToDevice));
    for (int c = 1; c < copies8; c++) {
        GPU_OK(cudaMemcpy(Wq + c * nk, Wq, nk, cudaMemcpyDeviceToDevice));
        GPU_OK(cudaMemcpy(S + (size_t)c * nb * kb, S, (size_t)nb * kb * 4, cudaMemcpyDeviceToDevice));
    }
    GPU_OK(cudaDeviceSynchronize());
    uint64_t rng = seed | 1;
    uint64_t rot = 0; /* the next weight copy: every launch takes the next one */
    for (int M : Ms) {
        char what[128];
        for (int mode = 0; mode < (f16 ? 3 : 2); mode++) { /* bf16, fp8, fp16 */
            const bool fp8 = mode == 1, h = mode == 2;
            const char *dt = fp8 ? "fp8 " : h ? "fp16" : "bf16";
            bf16 *const X_ = h ? X16 : X, *const Wb_ = h ? W16 : Wb; /* the 16-bit path's operands */
            k_set_f16(h);                                            /* back to bf16 at the end of the mode */
            /* check the automatic choice on fresh poison */
            const char *yt = s.y_f32 ? "f32 " : h ? "fp16" : "bf16";
            snprintf(what, sizeof what, "%s %-7s M %d N %6d K %5d %s %s", s.model, s.name, M, s.N, s.K, dt,
                     yt);
            GPU_OK(cudaMemset(Y, 0xff, (size_t)M * s.N * ysz));
            int rc = fp8 ? k_gemv_fp8(X, Wq, S, Y, s.y_f32, M, s.N, s.K, 1, NULL, 0)
                         : k_gemv_bf16(X_, Wb_, Y, s.y_f32, M, s.N, s.K, 1, NULL, 0);
            if (rc) {
                gt_check(false, "%s: %s", what, k_last_error());
                k_set_f16(0);
                continue;
            }
            big_verify(what, fp8, X_, fp8 ? (const void *)Wq : (const void *)Wb_, S, Y, s.y_f32, M, s.N, s.K,
                       &rng, h);

            /* time: the automatic choice without (ks 1) and with the split of K (ks 0), and k_gemm_bf16 */
            timing t[2], tc;
            for (int split = 0; split < 2; split++) {
                const int ks = split ? 0 : 1;
                void *ws = split ? g_ws : NULL;
                if (fp8)
                    t[split] = time_it(
                        [&](int) {
                            const int c = (int)(rot++ % copies8);
                            return k_gemv_fp8(X, Wq + c * nk, S + (size_t)c * nb * kb, Y, s.y_f32, M, s.N,
                                              s.K, ks, ws, 0);
                        },
                        (double)bytes_fp8);
                else
                    t[split] = time_it(
                        [&](int) {
                            return k_gemv_bf16(
                                X_, (const bf16 *)((const char *)Wb_ + (rot++ % copies16) * bytes_bf16), Y,
                                s.y_f32, M, s.N, s.K, ks, ws, 0);
                        },
                        (double)bytes_bf16);
            }
            if (!fp8 && g)
                tc = time_it(
                    [&](int) {
                        return k_gemm_bf16(
                            g, X_, (const bf16 *)((const char *)Wb_ + (rot++ % copies16) * bytes_bf16), Y,
                            s.y_f32, M, s.N, s.K, 0);
                    },
                    (double)bytes_bf16);
            k_set_f16(0);
            char line[512];
            int o = snprintf(
                line, sizeof line,
                "%s %-7s N %6d K %5d M %d %s: auto %7.4f ms %4.2f TB/s (%3.0f%%), split %7.4f ms "
                "%4.2f TB/s",
                s.model, s.name, s.N, s.K, M, dt, t[0].ms, t[0].tbs, t[0].tbs / 4.2 * 100, t[1].ms, t[1].tbs);
            if (!fp8)
                o += snprintf(line + o, sizeof line - o, " | k_gemm %7.4f ms %4.2f TB/s", tc.ms, tc.tbs);
            printf("time %s\n", line);
            /* the summary line: TB/s only */
            snprintf(line, sizeof line, "%-4s %-7s M %d %s auto %4.2f  split %4.2f  %s %4.2f", s.model,
                     s.name, M, dt, t[0].tbs, t[1].tbs, fp8 ? "      " : "k_gemm", fp8 ? 0.0 : tc.tbs);
            summary.push_back(line);
        }
    }
    GPU_OK(cudaFree(X));
    GPU_OK(cudaFree(Wb));
    GPU_OK(cudaFree(Wq));
    GPU_OK(cudaFree(S));
    GPU_OK(cudaFree(Y));
    GPU_OK(cudaFree(X16));
    GPU_OK(cudaFree(W16));
}

/* ---- the diagonal mapping of one-row fp8 GEMVs (k_gemv_fp8_diag): shapes of at least one 16-row
 * tile (8 GLU outputs) per SM, where it replaces the wide configuration: partial tiles, K not a
 * multiple of its 512-k step, split K with tickets (twice: tickets left at 0) and as parts, the GLU
 * kernel against the same GEMV + k_silu_mul in a graph, large inputs and subnormal codes. Then one
 * check that it is another kernel than the tile mapping (the fp32 sums of a long K differ somewhere). */
template <typename SEED> static void diag_cases(SEED &seed)
{
    printf("\n== the diagonal mapping at M = 1 (k_gemv_fp8_diag)\n");
    const int was = k_gemv_fp8_diag(1);
    const int sms = g_sms;
    const int N1 = 16 * sms + 8, N2 = 5120; /* a partial last tile; Qwen3-14B's o_proj and down */
    for (int N : {N1, N2})
        for (int K : {16, 144, 528, 656, 5120, 17408}) {
            problem p;
            make_problem(p, true, 1, N, K, seed());
            run_case(p, K & 16 ? 1 : 0, "diag");
            run_case(p, 1, "diag split", 0, 3, 2);
            if (K >= 5120) {
                run_case(p, 0, "diag split", 0, 0, 2);
                parts_case(p, 0);
                parts_case(p, 4);
            }
            parts_case(p, 1);
        }
    for (int kind : {1, 2}) { /* subnormal codes with scale 1; large x with outliers */
        problem p;
        make_problem(p, true, 1, N1, kind == 1 ? 256 : 17408, seed(), kind);
        run_case(p, 1, kind == 1 ? "diag fp8 subnormal codes only" : "diag large x (1e3, outliers 3e4)");
    }
    glu_case(1, 8 * sms + 8, 656, seed(), false);
    glu_case(1, 17408, 5120, seed(), true); /* Qwen3-14B's gate/up, in a graph */
    {
        problem p;
        make_problem(p, true, 1, N1, 17408, seed());
        dev_problem d = upload(p);
        std::vector<float> a(p.N), b(p.N);
        K_OK(k_gemv_fp8(d.X, (const uint8_t *)d.W, d.S, d.Y, 1, 1, p.N, p.K, 1, NULL, 0));
        GPU_OK(cudaMemcpy(a.data(), d.Y, (size_t)p.N * 4, cudaMemcpyDeviceToHost));
        k_gemv_fp8_diag(0);
        K_OK(k_gemv_fp8(d.X, (const uint8_t *)d.W, d.S, d.Y, 1, 1, p.N, p.K, 1, NULL, 0));
        k_gemv_fp8_diag(1);
        GPU_OK(cudaMemcpy(b.data(), d.Y, (size_t)p.N * 4, cudaMemcpyDeviceToHost));
        size_t differ = 0;
        for (int i = 0; i < p.N; i++)
            differ += memcmp(&a[i], &b[i], 4) != 0;
        gt_check(differ > 0, "diag: the diagonal kernel is not the tile mapping (%zu of %d fp32 sums differ)",
                 differ, p.N);
        release(d);
    }
    k_gemv_fp8_diag(was);
}

/* ---- the tile-order copies (k_gemv_*_tile_order, k_gemv_*_tiled)
 *
 * op writes `bytes` of Y. Runs it four times on fresh poison: on the row-major matrix; with W's copy in
 * tile order registered (the same bits: the same products in the same order); with a 2 KB block of the
 * copy spoiled (other bits: the copy is what is read); after the registration is forgotten (the
 * row-major bits again). kind: 0 fp8, 1 fp8 fused gate/up of 2N rows, 2 bf16. */
template <typename OP>
static void tiled_check(const char *what, const void *W, int N, int K, int kind, void *Y, size_t bytes, OP op)
{
    const size_t wb = (size_t)(kind == 1 ? 2 * N : N) * K * (kind == 2 ? 2 : 1);
    uint8_t *wt;
    GPU_OK(cudaMalloc(&wt, wb));
    auto run = [&]() {
        std::vector<uint8_t> h(bytes);
        GPU_OK(cudaMemset(Y, 0xff, bytes));
        if (op() < 0) {
            gt_check(false, "%s: %s", what, k_last_error());
            return h;
        }
        GPU_OK(cudaDeviceSynchronize());
        GPU_OK(cudaMemcpy(h.data(), Y, bytes, cudaMemcpyDeviceToHost));
        return h;
    };
    auto reg = [&](const void *copy) {
        return kind == 2 ? k_gemv_bf16_tiled((const bf16 *)W, (const bf16 *)copy, N, K)
                         : k_gemv_fp8_tiled((const uint8_t *)W, (const uint8_t *)copy, N, K, kind);
    };
    const std::vector<uint8_t> ref = run();
    K_OK(kind == 2 ? k_gemv_bf16_tile_order((const bf16 *)W, (bf16 *)wt, N, K, 0)
                   : k_gemv_fp8_tile_order((const uint8_t *)W, wt, N, K, kind, 0));
    K_OK(reg(wt));
    const std::vector<uint8_t> same = run();
    GPU_OK(cudaMemset(wt + wb / 2 / 2048 * 2048, 0x3f, 2048)); /* a block of 1.875 (fp8) or 0.746 (bf16) */
    const std::vector<uint8_t> spoiled = run();
    K_OK(reg(NULL));
    const std::vector<uint8_t> back = run();
    gt_check(same == ref && spoiled != ref && back == ref,
             "%-44s copy = row-major bits: %s, spoiled copy read: %s, forgotten = row-major: %s", what,
             same == ref ? "yes" : "NO", spoiled != ref ? "yes" : "NO", back == ref ? "yes" : "NO");
    GPU_OK(cudaFree(wt));
}

/* Every launcher that reads the copies (k_gemv_fp8 and k_gemv_bf16 in both configurations, wide shapes
 * first, then narrow ones, with and without a split; k_gemv_fp8_parts; k_gemv_fp8_glu), one to eight rows,
 * Qwen3-14B's shapes; the automatic choice also against the reference; the argument errors. */
template <typename SEED> static void tiled_cases(SEED &seed)
{
    printf("\n== the tile-order copies (k_gemv_*_tile_order, k_gemv_*_tiled)\n");
    const int was = k_gemv_fp8_diag(0); /* the row-major side in the tile mapping: same order */
    const int sms = g_sms;
    const int shapes[][2] = {{16 * sms + 16, 128}, {16 * sms + 16, 640}, {7168, 5120},
                             {5120, 17408},        {96, 1024},           {16 * sms - 16, 128},
                             {16 * sms - 16, 640}, {1024, 5120},         {1024, 17408}};
    for (int fp8 = 1; fp8 >= 0; fp8--)
        for (auto &sh : shapes)
            for (int M : {1, 3, 8}) {
                if (!fp8 && sh[1] == 17408 && M != 1)
                    continue; /* the host reference of the big bf16 shape: once */
                problem p;
                make_problem(p, fp8, M, sh[0], sh[1], seed());
                dev_problem d = upload(p);
                const void *W = d.W;
                const int kind = fp8 ? 0 : 2;
                const size_t ybytes = ((size_t)p.M * p.N + GUARD) * 2;
                const char *cfg = p.N >= 16 * sms ? "wide" : "narrow";
                for (int ks : {1, 3, 0}) {
                    char what[128];
                    snprintf(what, sizeof what, "tiled %s M %d N %5d K %5d %s ks %d", fp8 ? "fp8 " : "bf16",
                             M, p.N, p.K, cfg, ks);
                    void *ws = ks == 1 ? NULL : g_ws;
                    tiled_check(what, W, p.N, p.K, kind, d.Y, ybytes, [&]() {
                        return fp8 ? k_gemv_fp8(d.X, (const uint8_t *)W, d.S, d.Y, 0, M, p.N, p.K, ks, ws, 0)
                                   : k_gemv_bf16(d.X, (const bf16 *)W, d.Y, 0, M, p.N, p.K, ks, ws, 0);
                    });
                }
                /* the automatic choice with the copy, against the double reference */
                uint8_t *wt;
                GPU_OK(cudaMalloc(&wt, (size_t)p.N * p.K * (fp8 ? 1 : 2)));
                if (fp8) {
                    K_OK(k_gemv_fp8_tile_order((const uint8_t *)W, wt, p.N, p.K, 0, 0));
                    K_OK(k_gemv_fp8_tiled((const uint8_t *)W, wt, p.N, p.K, 0));
                } else {
                    K_OK(k_gemv_bf16_tile_order((const bf16 *)W, (bf16 *)wt, p.N, p.K, 0));
                    K_OK(k_gemv_bf16_tiled((const bf16 *)W, (const bf16 *)wt, p.N, p.K));
                }
                poison(p, d, 1);
                char what[128];
                snprintf(what, sizeof what, "tiled %s auto M %d N %5d K %5d vs reference",
                         fp8 ? "fp8 " : "bf16", M, p.N, p.K);
                if (fp8 ? k_gemv_fp8(d.X, (const uint8_t *)W, d.S, d.Y, 1, M, p.N, p.K, 0, g_ws, 0)
                        : k_gemv_bf16(d.X, (const bf16 *)W, d.Y, 1, M, p.N, p.K, 0, g_ws, 0))
                    gt_check(false, "%s: %s", what, k_last_error());
                else
                    verify(what, p, d, 1);
                K_OK(fp8 ? k_gemv_fp8_tiled((const uint8_t *)W, NULL, 0, 0, 0)
                         : k_gemv_bf16_tiled((const bf16 *)W, NULL, 0, 0));
                GPU_OK(cudaFree(wt));
                if (fp8) {
                    float *parts;
                    const size_t pbytes = (size_t)K_GEMV_MAX_SPLIT * M * p.N * 4;
                    GPU_OK(cudaMalloc(&parts, pbytes));
                    for (int ks : {0, 1, 4}) {
                        snprintf(what, sizeof what, "tiled parts M %d N %5d K %5d ks %d", M, p.N, p.K, ks);
                        tiled_check(what, W, p.N, p.K, 0, parts, pbytes, [&]() {
                            return k_gemv_fp8_parts(d.X, (const uint8_t *)W, d.S, parts, M, p.N, p.K, ks, 0);
                        });
                    }
                    GPU_OK(cudaFree(parts));
                }
                release(d);
            }
    for (int M : {1, 2, 8})
        for (auto F_K : {std::pair<int, int>{8, 128}, {8 * sms + 8, 640}, {17408, 5120}}) {
            problem p;
            make_problem(p, true, M, 2 * F_K.first, F_K.second, seed()); /* gate_up: 2F rows */
            dev_problem d = upload(p);
            const int F = F_K.first, K = F_K.second;
            const size_t ybytes = ((size_t)M * F + GUARD) * 2;
            char what[128];
            snprintf(what, sizeof what, "tiled glu M %d F %5d K %5d", M, F, K);
            tiled_check(what, d.W, F, K, 1, d.Y, ybytes, [&]() {
                return k_gemv_fp8_glu(d.X, (const uint8_t *)d.W, d.S, (bf16 *)d.Y, M, F, K, 0);
            });
            release(d);
        }
    /* argument errors: the shapes the layout needs */
    uint8_t *a, *b;
    GPU_OK(cudaMalloc(&a, 1 << 16));
    GPU_OK(cudaMalloc(&b, 1 << 16));
    const struct {
        const char *why;
        int rc;
    } errs[] = {
        {"fp8 tile_order N % 16", k_gemv_fp8_tile_order(a, b, 24, 128, 0, 0)},
        {"fp8 tile_order glu F % 8", k_gemv_fp8_tile_order(a, b, 12, 128, 1, 0)},
        {"fp8 tile_order K % 128", k_gemv_fp8_tile_order(a, b, 16, 192, 0, 0)},
        {"fp8 tile_order NULL Wt", k_gemv_fp8_tile_order(a, NULL, 16, 128, 0, 0)},
        {"fp8 tile_order misaligned", k_gemv_fp8_tile_order(a + 8, b, 16, 128, 0, 0)},
        {"bf16 tile_order K % 64", k_gemv_bf16_tile_order((bf16 *)a, (bf16 *)b, 16, 96, 0)},
        {"bf16 tile_order N % 16", k_gemv_bf16_tile_order((bf16 *)a, (bf16 *)b, 8, 64, 0)},
        {"fp8 tiled N % 16", k_gemv_fp8_tiled(a, b, 24, 128, 0)},
        {"fp8 tiled K % 128", k_gemv_fp8_tiled(a, b, 16, 64, 0)},
        {"fp8 tiled NULL W", k_gemv_fp8_tiled(NULL, b, 16, 128, 0)},
        {"bf16 tiled K % 64", k_gemv_bf16_tiled((bf16 *)a, (bf16 *)b, 16, 32)},
    };
    for (auto &e : errs)
        gt_check(e.rc == -1, "tiled argument error: %s refused (%s)", e.why,
                 e.rc == -1 ? k_last_error() : "accepted");
    GPU_OK(cudaFree(a));
    GPU_OK(cudaFree(b));
    k_gemv_fp8_diag(was);
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();
    GPU_OK(cudaMalloc(&g_ws, K_GEMV_WS_BYTES));
    GPU_OK(cudaMemset(g_ws, 0, K_GEMV_WS_BYTES));
    GPU_OK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    uint64_t k = 1;
    auto seed = [&]() { return gt_splitmix(base_seed + k++); };
    /* the tile mapping everywhere but in diag_cases (the device's default may be the diagonal one) */
    printf("note: this device's default one-row fp8 mapping: %s\n", k_gemv_fp8_diag(0) ? "diagonal" : "tile");

    printf("\n== argument errors\n");
    argument_checks();

    printf("\n== every M, odd N and K, y_f32 both ways (narrow shapes: N < 16 x %d SMs)\n", g_sms);
    const int Ns[] = {1, 7, 17, 129, 1000};
    const int Ks[] = {16, 48, 128, 144, 640, 656, 5120};
    for (int mode = 0; mode < 3; mode++) /* bf16, fp8, fp16 */
        for (int M = 1; M <= K_GEMV_MAX_M; M++)
            for (int ni = 0; ni < 5; ni++)
                for (int ki = 0; ki < 7; ki++) {
                    problem p;
                    make_problem(p, mode == 1, M, Ns[ni], Ks[ki], seed(), 0, mode == 2);
                    run_case(p, (ni + ki + M) & 1, "grid");
                }

    printf("\n== wide shapes (N >= 16 x %d SMs: the other configuration)\n", g_sms);
    const int W0 = 16 * g_sms;
    const int vshape[][2] = {{W0 + 33, 144}, {W0 + 129, 656}, {W0 + 1000, 5120}, {W0 + 300, 2048}};
    for (int mode = 0; mode < 3; mode++) /* bf16, fp8, fp16 */
        for (int M : {1, 5, 8})
            for (int si = 0; si < 4; si++) {
                problem p;
                make_problem(p, mode == 1, M, vshape[si][0], vshape[si][1], seed(), 0, mode == 2);
                run_case(p, (M + si) & 1, "wide");
            }

    printf("\n== special inputs\n");
    for (int M : {1, 2, 8}) {
        problem p;
        make_problem(p, true, M, 33, 256, seed(), 1);
        run_case(p, 1, "fp8 subnormal codes only, scale 1");
    }
    for (int dt = 0; dt < 3; dt++) /* bf16, fp8, fp16 */
        for (int M : {1, 8}) {
            problem p;
            make_problem(p, dt == 1, M, 257, 17408, seed(), 2, dt == 2);
            run_case(p, M & 1, "large x (1e3, outliers 3e4)");
        }
    for (int dt = 0; dt < 3; dt++) { /* bf16, fp8, fp16 */
        problem p;
        make_problem(p, dt == 1, 4, 200, 528, seed(), 0, dt == 2);
        run_case(p, 0, "16-byte offset pointers", 16);
        run_case(p, 1, "48-byte offset pointers", 48);
    }

    printf("\n== split K: explicit parts, uneven chunk counts, more parts than chunks, the automatic choice "
           "(N 2200 K 17408: 138 CTAs, 136 chunks -> 4 parts); each twice\n");
    const int sshape[][2] = {{300, 2048}, {257, 656}, {33, 144}, {2200, 17408}};
    for (int mode = 0; mode < 3; mode++) /* bf16, fp8, fp16 */
        for (int M : {1, 4, 8})
            for (auto &sh : sshape)
                for (int ks : {0, 2, 3, 4, 8}) {
                    if (sh[1] == 17408 && ks != 0 && ks != 3)
                        continue; /* the big shape: the automatic split and an uneven one */
                    problem p;
                    make_problem(p, mode == 1, M, sh[0], sh[1], seed(), 0, mode == 2);
                    run_case(p, (M + ks) & 1, "split", 0, ks, 2);
                }

    printf("\n== split K with the parts left to the caller (k_gemv_fp8_parts)\n");
    for (int M : {1, 4})
        for (auto &sh : sshape)
            for (int ks : {0, 1, 2, 3, 4, 8}) {
                if (sh[1] == 17408 && ks != 0 && ks != 3)
                    continue;
                problem p;
                make_problem(p, true, M, sh[0], sh[1], seed());
                parts_case(p, ks);
            }
    {
        problem p; /* Qwen3-14B's down at one row, as the engine runs it */
        make_problem(p, true, 1, 5120, 17408, seed());
        parts_case(p, 0);
    }

    printf("\n== gate/up + SwiGLU fused (k_gemv_fp8_glu)\n");
    for (int M : {1, 2, 5, 8})
        for (int F : {8, 16, 136, 1000})
            for (int K : {16, 144, 656, 5120})
                glu_case(M, F, K, seed(), false);
    glu_case(1, 17408, 5120, seed(), true); /* Qwen3-14B's gate/up, in a graph */
    glu_case(3, 304, 1024, seed(), true);

    printf("\n== graph capture\n");
    graph_check(seed());

    diag_cases(seed);
    tiled_cases(seed);

    printf("\n== timing (median of 20; TB/s = weight bytes / time)\n");
    struct k_gemm *g = k_gemm_create(0);
    if (!g)
        printf("note: k_gemm_create failed (%s): no k_gemm column\n", k_last_error());
    const big_shape b14[] = {
        {"14B", "qkv", 7168, 5120, 0},       {"14B", "o_proj", 5120, 5120, 0},
        {"14B", "gate_up", 34816, 5120, 0},  {"14B", "down", 5120, 17408, 0},
        {"14B", "lm_head", 151936, 5120, 1},
    };
    const big_shape bsmall[] = {
        {"8B", "qkv", 6144, 4096, 0},       {"8B", "o_proj", 4096, 4096, 0},
        {"8B", "gate_up", 24576, 4096, 0},  {"8B", "down", 4096, 12288, 0},
        {"8B", "lm_head", 151936, 4096, 1}, {"0.6B", "qkv", 4096, 1024, 0},
        {"0.6B", "o_proj", 1024, 2048, 0},  {"0.6B", "gate_up", 6144, 1024, 0},
        {"0.6B", "down", 1024, 3072, 0},    {"0.6B", "lm_head", 151936, 1024, 1},
    };
    std::vector<std::string> summary;
    for (const big_shape &s : b14) /* bf16, fp8 and fp16 */
        big_shape_run(g, s, {1, 2, 4, 8}, seed(), summary, true);
    for (const big_shape &s : bsmall)
        big_shape_run(g, s, {1, 8}, seed(), summary);
    k_gemm_free(g);

    printf(
        "\nsummary: weight TB/s (copy ceiling 4.2); auto = what k_gemv_* launches without a split, split = "
        "with the automatic split of K; k_gemm = k_gemm_bf16 on the same shape\n");
    for (auto &l : summary)
        printf("%s\n", l.c_str());
    GPU_OK(cudaFree(g_ws));
    for (int i = 0; i < gt_n_failed; i++)
        printf("FAILED: %s\n", gt_failed[i]);
    GPU_OK(cudaDeviceSynchronize());
    printf("%d passed, %d failed\n", gt_passes, gt_failures);
    return gt_failures ? 1 : 0;
}
