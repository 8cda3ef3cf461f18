/* Kernel tests: embedding, rmsnorm, add_rmsnorm, qk_norm_rope_kv, silu_mul against plain double
 * references computed here from the same 16-bit/fp32 inputs, plus timing lines at realistic sizes.
 * Everything runs twice, in bf16 mode and in fp16 mode (k_set_f16, kernels.h): the 16-bit inputs are
 * uploaded as the mode's type (rounded to nearest even by engine/dtype.h), the reference reads them
 * back as the kernel does, and every printed line names the mode. The fp8 cache cases run in bf16 mode
 * only (in fp16 mode the fp8 launcher must refuse, checked once).
 *
 * Tolerances (each check prints its numbers):
 * - 16-bit outputs are computed in fp32 and rounded once: round-to-nearest moves a value by at most
 *   half an ulp, <= 2^-8 of its magnitude in bf16 (7 stored mantissa bits), <= 2^-11 in fp16 (10 bits).
 *   Every element must satisfy |got - ref| <= rtol * |ref| + atol with rtol = BF16_RTOL = 2^-8 * 1.001
 *   or F16_RTOL = 2^-11 * 1.01; the 0.1% (1%) over the half ulp covers fp32 vs double arithmetic before
 *   the rounding: a value next to a rounding boundary may round the other way. fp16's share is larger
 *   in relative terms because its half ulp is 8x smaller while the fp32 evaluation errors (a row's
 *   sum of squares, rsqrt, sincosf: up to ~1e-6 relative) stay the same; 1% of 2^-11 is 4.9e-6, still
 *   a hundred times less than the 2^-9 a bf16 rounding would leave, so an fp16 kernel that rounded to
 *   bf16 (or read fp16 inputs as bf16) fails. atol (1e-5 to 1e-6, far below the values' scale of ~1;
 *   fp16's subnormal spacing 2^-24 is smaller still) covers cancellation in RoPE, where fp32 errors are
 *   relative to the inputs, not to the small result.
 *   The norm-relative error ||got - ref|| / ||ref|| (about 1.1e-3 for uniform rounding to bf16, 1.4e-4
 *   to fp16) must be <= 4e-3 (bf16) or 5e-4 (fp16). The elementwise bound is the strict one: a single
 *   wrong element fails it.
 * - fp32 outputs (the residual after add, the fp32 embedding): one fp32 rounding of the exact value,
 *   rtol 2^-23; copies must be bit-exact.
 * - NaN/inf anywhere fails: outputs are poisoned (0xFF bytes = NaN) before every run, so an
 *   unwritten element shows. The paged KV cache is poisoned too and every slot the test did not
 *   map must still hold the poison afterwards.
 * - fp8 KV writes (k_qk_norm_rope_kv_fp8): per (token, KV head) the scale must be amax / 448 of the
 *   double reference's vector within 1e-4 relative (fp32 vs double before the amax), and every code,
 *   read as u = e4m3(code), must be a nearest e4m3 value to x / scale: |u - x / scale| <= half the e4m3
 *   step at x / scale (x the double reference), + 1e-4 relative and 448 * 4e-7 absolute (a few fp32
 *   ulps of the vector's amax) for the fp32-vs-double difference (a value on a rounding boundary may
 *   go either way; the first H200 run met one 5e-6 past the half step). Codes equal to f32_to_e4m3 of the
 * reference are counted and printed. Inputs are fresh random numbers per run (seed printed; LLMQ_TEST_SEED=N
 * reproduces a run). */
#include <algorithm>
#include <cmath>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu/gpu_test.h"
extern "C" {
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"
}

#define BF16_RTOL (1.0 / 256 * 1.001)
#define BF16_NORM_TOL 4e-3
#define F16_RTOL (1.0 / 2048 * 1.01)
#define F16_NORM_TOL 5e-4
#define F32_RTOL (1.0 / 8388608) /* 2^-23 */

static uint64_t base_seed;

/* every host array of `bf16` holds the mode's bits (gt_set_mode, gpu_test.h) */
/* the elementwise and norm-relative tolerances of a 16-bit output in the mode (top comment) */
static double rtol16(void)
{
    return gt_f16 ? F16_RTOL : BF16_RTOL;
}
static double norm_tol16(void)
{
    return gt_f16 ? F16_NORM_TOL : BF16_NORM_TOL;
}

/* The xorshift state of test case k: base_seed and k mixed (splitmix64), never 0. */
static uint64_t case_seed(uint64_t k)
{
    uint64_t z = base_seed + k * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) | 1;
}

/* ---- comparison: elementwise bound and norm-relative error, one printed line */

struct acc {
    double num = 0, den = 0, worst = -1, worst_got = 0, worst_ref = 0;
    size_t n = 0, bad = 0, worst_i = 0, nonfinite = 0, first_nonfinite = 0;
};
static void acc_add(acc &a, double got, double ref, double rtol, double atol)
{
    if (!std::isfinite(got)) {
        if (!a.nonfinite++)
            a.first_nonfinite = a.n;
        a.n++;
        return;
    }
    double d = fabs(got - ref), bound = rtol * fabs(ref) + atol;
    a.num += d * d, a.den += ref * ref;
    if (d > bound)
        a.bad++;
    double ratio = d / bound;
    if (ratio > a.worst)
        a.worst = ratio, a.worst_i = a.n, a.worst_got = got, a.worst_ref = ref;
    a.n++;
}
/* Prints "ok  " or "FAIL" with the numbers; counts a failure. */
static bool acc_report(const acc &a, const char *what, double norm_tol)
{
    double rel = a.den > 0 ? sqrt(a.num / a.den) : sqrt(a.num);
    bool ok = a.nonfinite == 0 && a.bad == 0 && rel <= norm_tol && a.n > 0;
    printf("%s %s %-53s n %9zu  rel %.2e (tol %.0e)  worst |d|/bound %.3f at %zu (got %.6g ref %.6g)  "
           "out-of-bound %zu"
           "  nan/inf %zu",
           ok ? "ok  " : "FAIL", gt_mode_name(), what, a.n, rel, norm_tol, a.worst, a.worst_i, a.worst_got,
           a.worst_ref, a.bad, a.nonfinite);
    if (a.nonfinite)
        printf(" (first at %zu)", a.first_nonfinite);
    printf("\n");
    if (!ok)
        gt_failures++;
    return ok;
}

/* ---- helpers */

static uint16_t bits(bf16 h)
{
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
/* a 16-bit value of the mode, exactly */
static float h2f(bf16 h)
{
    return gt_h2f(bits(h));
}
/* x rounded to the mode's 16-bit type (nearest even) */
static bf16 f2h(float x)
{
    __nv_bfloat16_raw r;
    r.x = gt_f2h(x);
    return bf16(r); /* the bits, whichever type they encode */
}
/* normals * scale + offset in the mode's type (|values| < 10: well inside fp16's range) */
static std::vector<bf16> rand16(size_t n, float scale, float offset, uint64_t *s)
{
    std::vector<bf16> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = f2h(offset + gt_normal(s) * scale);
    return v;
}
/* Cheaper for 10^8 elements: uniform in [-scale, scale]. */
static std::vector<bf16> rand16_uniform(size_t n, float scale, uint64_t *s)
{
    std::vector<bf16> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = f2h(gt_uniform(s) * scale);
    return v;
}
template <typename T> static T *dev(const std::vector<T> &h)
{
    return gt_to_device(h.data(), h.size());
}
template <typename T> static std::vector<T> host(const T *d, size_t n)
{
    std::vector<T> h(n);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* Median time in ms of fn() over reps runs after 3 warm-ups, each timed with its own events. */
template <typename F> static double median_ms(F fn, int reps = 20)
{
    cudaEvent_t a, b;
    GPU_OK(cudaEventCreate(&a));
    GPU_OK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        K_OK(fn());
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        GPU_OK(cudaEventRecord(a));
        K_OK(fn());
        GPU_OK(cudaEventRecord(b));
        GPU_OK(cudaEventSynchronize(b));
        GPU_OK(cudaEventElapsedTime(&t[i], a, b));
    }
    GPU_OK(cudaEventDestroy(a));
    GPU_OK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[reps / 2];
}
static void print_time(const char *what, double ms, double bytes)
{
    printf("time %s %-53s %8.4f ms  %7.1f GB/s  (%.0f%% of 4.2 TB/s copy)\n", gt_mode_name(), what, ms,
           bytes / ms * 1e-6, bytes / ms * 1e-6 / 4200 * 100);
}

/* ---- embedding */

static void test_embedding_case(int V, int hidden, int n, int out_offset, uint64_t seed)
{
    uint64_t s = seed;
    std::vector<bf16> table = rand16(V * (size_t)hidden, 1.f, 0.f, &s);
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(gt_next(&s) % (uint64_t)V);
    const int32_t bad[] = {-1, V, V + 12345, INT32_MIN, INT32_MAX};
    if (n >= 8) /* a few out-of-range ids at random places */
        for (int j = 0; j < 5; j++)
            ids[gt_next(&s) % (uint64_t)n] = bad[j];
    else if (n >= 2)
        ids[n - 1] = -1;
    bf16 *dtab = dev(table);
    int32_t *dids = dev(ids);
    size_t total = (size_t)n * hidden + out_offset;
    float *o32 = gt_poisoned<float>(total);
    K_OK(k_embedding_f32(dids, n, dtab, V, hidden, o32 + out_offset, 0));
    std::vector<float> g32 = host(o32 + out_offset, (size_t)n * hidden);
    size_t wrong32 = 0, first = (size_t)-1;
    int n_bad_ids = 0;
    for (int t = 0; t < n; t++) {
        bool in = ids[t] >= 0 && ids[t] < V;
        n_bad_ids += !in;
        for (int c = 0; c < hidden; c++) {
            size_t i = (size_t)t * hidden + c;
            float want32 = in ? h2f(table[(size_t)ids[t] * hidden + c]) : 0.f;
            uint32_t g32b, w32b;
            memcpy(&g32b, &g32[i], 4);
            memcpy(&w32b, &want32, 4);
            if (g32b != w32b) {
                wrong32++;
                first = std::min(first, i);
            }
        }
    }
    gt_check(wrong32 == 0,
             "%s embedding V %6d hidden %5d n %5d out+%d (%d out-of-range ids -> zeros): bit-exact, "
             "%zu fp32 elements wrong%s",
             gt_mode_name(), V, hidden, n, out_offset, n_bad_ids, wrong32,
             first != (size_t)-1 ? " (see first index)" : "");
    if (first != (size_t)-1)
        printf("     first wrong element %zu\n", first);
    GPU_OK(cudaFree(dtab));
    GPU_OK(cudaFree(dids));
    GPU_OK(cudaFree(o32));
}

static void test_embedding(void)
{
    test_embedding_case(5000, 5120, 300, 0, case_seed(1));
    test_embedding_case(1000, 64, 7, 0, case_seed(2));
    test_embedding_case(777, 100, 33, 0, case_seed(3)); /* hidden % 8 != 0: scalar path */
    test_embedding_case(50, 1024, 1, 0, case_seed(4));
    test_embedding_case(300, 1024, 9, 1, case_seed(5)); /* misaligned output: scalar path */
    gt_check(k_embedding_f32(NULL, 0, NULL, 10, 64, NULL, 0) == 0, "%s embedding n_tokens 0 is a no-op",
             gt_mode_name());
    int rc = k_embedding_f32(NULL, 4, NULL, 10, 64, NULL, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "embedding"),
             "%s embedding NULL pointers fail cleanly: \"%s\"", gt_mode_name(), k_last_error());

    /* timing: 8192 tokens of a 5120-wide table */
    const int T = 8192, C = 5120, V = 32768;
    uint64_t s = case_seed(6);
    std::vector<bf16> table = rand16_uniform((size_t)V * C, 1.f, &s);
    std::vector<int32_t> ids(T);
    for (int i = 0; i < T; i++)
        ids[i] = (int32_t)(gt_next(&s) % V);
    bf16 *dtab = dev(table);
    int32_t *dids = dev(ids);
    float *o32 = gt_poisoned<float>((size_t)T * C);
    double ms = median_ms([&] { return k_embedding_f32(dids, T, dtab, V, C, o32, 0); });
    print_time("k_embedding_f32 T 8192 C 5120 (read 2 B + write 4 B)", ms, (double)T * C * 6);
    GPU_OK(cudaFree(dtab));
    GPU_OK(cudaFree(dids));
    GPU_OK(cudaFree(o32));
}

/* ---- rmsnorm and add_rmsnorm */

/* out (rows x cols, the mode's type) against norm(res) * w in double, into a */
static void acc_norm_out(acc &a, const float *res, const std::vector<bf16> &out, const std::vector<bf16> &w,
                         int rows, int cols, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *v = res + (size_t)r * cols;
        double ss = 0;
        for (int c = 0; c < cols; c++)
            ss += (double)v[c] * v[c];
        const double rr = 1.0 / sqrt(ss / cols + eps);
        for (int c = 0; c < cols; c++)
            acc_add(a, h2f(out[(size_t)r * cols + c]), v[c] * rr * h2f(w[c]), rtol16(), 1e-6);
    }
}

static void test_rmsnorm_case(int rows, int cols, int res_offset, uint64_t seed)
{
    uint64_t s = seed;
    const float eps = 1e-6f;
    const size_t n = (size_t)rows * cols;
    std::vector<float> res(n + res_offset);
    for (int r = 0; r < rows; r++) {
        /* rows of very different scales: 0.01 .. 100 */
        float scale = powf(10.f, -2.f + 4.f * (gt_uniform(&s) * 0.5f + 0.5f));
        for (int c = 0; c < cols; c++)
            res[res_offset + (size_t)r * cols + c] = gt_normal(&s) * scale;
    }
    std::vector<bf16> x = rand16(n, 0.5f, 0.f, &s), w = rand16(cols, 0.2f, 1.f, &s);
    float *dres = dev(res);
    bf16 *dx = dev(x), *dw = dev(w), *dout = gt_poisoned<bf16>(n);
    float *r0 = dres + res_offset;
    char what[128];

    /* k_rmsnorm: out = norm(residual) * w, residual untouched */
    K_OK(k_rmsnorm(r0, dw, dout, rows, cols, eps, 0));
    std::vector<bf16> out = host(dout, n);
    std::vector<float> res_after = host(r0, n);
    acc a;
    acc_norm_out(a, &res[res_offset], out, w, rows, cols, eps);
    snprintf(what, sizeof what, "rmsnorm rows %4d cols %5d%s", rows, cols, res_offset ? " (misaligned)" : "");
    acc_report(a, what, norm_tol16());
    gt_check(!memcmp(res_after.data(), &res[res_offset], n * sizeof(float)),
             "%s rmsnorm rows %4d cols %5d: residual left unchanged", gt_mode_name(), rows, cols);

    /* k_add_rmsnorm: residual += x, out = norm(residual) * w */
    GPU_OK(cudaMemset(dout, 0xff, n * sizeof(bf16)));
    K_OK(k_add_rmsnorm(r0, dx, dw, dout, rows, cols, eps, 0));
    out = host(dout, n);
    res_after = host(r0, n);
    acc ar, ao;
    for (int r = 0; r < rows; r++) {
        const float *v = &res[res_offset + (size_t)r * cols];
        const bf16 *xr = &x[(size_t)r * cols];
        std::vector<double> sum(cols);
        double ss = 0;
        for (int c = 0; c < cols; c++) {
            double exact = (double)v[c] + h2f(xr[c]);
            acc_add(ar, res_after[(size_t)r * cols + c], exact, F32_RTOL, 0);
            sum[c] = (double)(float)exact; /* the stored residual the norm sees */
            ss += sum[c] * sum[c];
        }
        double rr = 1.0 / sqrt(ss / cols + eps);
        for (int c = 0; c < cols; c++)
            acc_add(ao, h2f(out[(size_t)r * cols + c]), sum[c] * rr * h2f(w[c]), rtol16(), 1e-6);
    }
    snprintf(what, sizeof what, "add_rmsnorm rows %4d cols %5d%s: residual", rows, cols,
             res_offset ? " (misaligned)" : "");
    acc_report(ar, what, 2e-7);
    snprintf(what, sizeof what, "add_rmsnorm rows %4d cols %5d%s: out", rows, cols,
             res_offset ? " (misaligned)" : "");
    acc_report(ao, what, norm_tol16());
    GPU_OK(cudaFree(dres));
    GPU_OK(cudaFree(dx));
    GPU_OK(cudaFree(dw));
    GPU_OK(cudaFree(dout));
}

/* k_add_parts_rmsnorm: residual += E(parts[0] + ... + parts[ks - 1]), then the norm. Against
 * k_add_rmsnorm on x = the parts added in part order from 0 in fp32 and rounded to the mode's type (on
 * the host here): the residual bit for bit always; out bit for bit where both lay the row out alike
 * (same_layout: kernels/rmsnorm.cu, at most 4 parts and 4 units a thread), else within the norm's
 * tolerance of a double reference over that residual (another block-sum order). */
static void test_parts_rmsnorm_case(int rows, int cols, int res_offset, int ks, bool same_layout,
                                    uint64_t seed)
{
    uint64_t s = seed;
    const float eps = 1e-6f;
    const size_t n = (size_t)rows * cols;
    std::vector<float> res(n + res_offset), parts((size_t)ks * n);
    for (auto &v : res)
        v = gt_normal(&s) * 3.f;
    for (auto &v : parts) /* a split GEMV's sums: terms of mixed sign that partly cancel */
        v = gt_normal(&s) * 0.7f;
    std::vector<bf16> x(n), w = rand16(cols, 0.2f, 1.f, &s);
    for (size_t i = 0; i < n; i++) {
        float sum = 0.f;
        for (int q = 0; q < ks; q++)
            sum += parts[(size_t)q * n + i];
        x[i] = f2h(sum);
    }
    float *da = dev(res), *db = dev(res), *dp = dev(parts);
    bf16 *dx = dev(x), *dw = dev(w), *oa = gt_poisoned<bf16>(n), *ob = gt_poisoned<bf16>(n);
    K_OK(k_add_rmsnorm(da + res_offset, dx, dw, oa, rows, cols, eps, 0));
    K_OK(k_add_parts_rmsnorm(db + res_offset, dp, ks, dw, ob, rows, cols, eps, 0));
    std::vector<float> ra = host(da, n + res_offset), rb = host(db, n + res_offset);
    std::vector<bf16> ya = host(oa, n), yb = host(ob, n);
    char what[160];
    snprintf(what, sizeof what, "add_parts_rmsnorm rows %4d cols %5d ks %d%s", rows, cols, ks,
             res_offset ? " (misaligned)" : "");
    gt_check(!memcmp(ra.data(), rb.data(), ra.size() * 4), "%s %s: residual equals add_rmsnorm's bit for bit",
             gt_mode_name(), what);
    if (same_layout) {
        gt_check(!memcmp(ya.data(), yb.data(), n * 2), "%s %s: out equals add_rmsnorm's bit for bit",
                 gt_mode_name(), what);
    } else {
        acc ao;
        acc_norm_out(ao, &rb[res_offset], yb, w, rows, cols, eps);
        snprintf(what + strlen(what), sizeof what - strlen(what), ": out");
        acc_report(ao, what, norm_tol16());
    }
    for (void *p : {(void *)da, (void *)db, (void *)dp, (void *)dx, (void *)dw, (void *)oa, (void *)ob})
        GPU_OK(cudaFree(p));
}

static void test_rmsnorm(void)
{
    const int cols[] = {64, 1024, 5120, 4096 + 8};
    const int rows[] = {1, 7, 4096};
    uint64_t k = 100;
    for (int c : cols)
        for (int r : rows)
            test_rmsnorm_case(r, c, 0, case_seed(k++));
    test_rmsnorm_case(7, 1001, 0, case_seed(k++)); /* cols % 8 != 0: scalar path */
    test_rmsnorm_case(300, 1001, 0, case_seed(k++));
    test_rmsnorm_case(5, 1024, 1, case_seed(k++));    /* residual not 16-byte aligned: scalar path */
    test_rmsnorm_case(300, 16384, 0, case_seed(k++)); /* 8 units a thread, 256 threads */
    test_rmsnorm_case(3, 24576, 0, case_seed(k++));   /* 8 units a thread, 384 threads */
    test_rmsnorm_case(2, 40000, 0, case_seed(k++));   /* too wide for registers: scalar path */
    /* the parts: the vector path (<= 4 parts, <= 4 units a thread), the scalar path otherwise */
    for (int ks : {1, 2, 3, 4, 5, 8}) /* a decode row of Qwen3-14B (5 and 8 parts: the scalar path) */
        test_parts_rmsnorm_case(1, 5120, 0, ks, ks <= 4, case_seed(k++));
    test_parts_rmsnorm_case(7, 1024, 0, 4, true, case_seed(k++));
    test_parts_rmsnorm_case(300, 4096 + 8, 0, 3, true, case_seed(k++));
    test_parts_rmsnorm_case(7, 1001, 0, 4, true, case_seed(k++));   /* cols % 8 != 0: both scalar */
    test_parts_rmsnorm_case(5, 1024, 1, 2, true, case_seed(k++));   /* residual misaligned: both scalar */
    test_parts_rmsnorm_case(3, 24576, 0, 4, false, case_seed(k++)); /* 8 units a thread: the scalar path */
    const int rcp = k_add_parts_rmsnorm(NULL, NULL, K_GEMV_MAX_SPLIT + 1, NULL, NULL, 1, 64, 1e-6f, 0);
    gt_check(rcp == -1 && strstr(k_last_error(), "parts"),
             "%s add_parts_rmsnorm %d parts fails cleanly: \"%s\"", gt_mode_name(), K_GEMV_MAX_SPLIT + 1,
             k_last_error());
    gt_check(k_rmsnorm(NULL, NULL, NULL, 0, 64, 1e-6f, 0) == 0, "%s rmsnorm rows 0 is a no-op",
             gt_mode_name());
    int rc = k_add_rmsnorm(NULL, NULL, NULL, NULL, 3, 0, 1e-6f, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "cols 0"), "%s add_rmsnorm cols 0 fails cleanly: \"%s\"",
             gt_mode_name(), k_last_error());

    /* timing at T = 8192, C = 5120 */
    const int T = 8192, C = 5120;
    uint64_t s = case_seed(199);
    std::vector<float> res((size_t)T * C);
    for (auto &v : res)
        v = gt_uniform(&s);
    std::vector<bf16> x = rand16_uniform((size_t)T * C, 0.1f, &s), w = rand16(C, 0.2f, 1.f, &s);
    float *dres = dev(res);
    bf16 *dx = dev(x), *dw = dev(w), *dout = gt_poisoned<bf16>((size_t)T * C);
    double ms = median_ms([&] { return k_rmsnorm(dres, dw, dout, T, C, 1e-6f, 0); });
    print_time("k_rmsnorm T 8192 C 5120 (read 4 B + write 2 B / element)", ms, (double)T * C * 6);
    ms = median_ms([&] { return k_add_rmsnorm(dres, dx, dw, dout, T, C, 1e-6f, 0); });
    print_time("k_add_rmsnorm T 8192 C 5120 (read 4+2 B + write 4+2 B)", ms, (double)T * C * 12);
    GPU_OK(cudaFree(dres));
    GPU_OK(cudaFree(dx));
    GPU_OK(cudaFree(dw));
    GPU_OK(cudaFree(dout));
}

/* ---- qk_norm_rope_kv */

struct rope_case {
    enum model_arch arch; /* QWEN3: q/k norms; QWEN2: bias; LLAMA: neither */
    int D, H, KVH, T, block_size;
    enum rope_type rope;
    int max_pos;    /* positions drawn from [0, max_pos) */
    int qkv_offset; /* elements: a misaligned qkv exercises the scalar path */
};

static const char *arch_name(enum model_arch a)
{
    return a == ARCH_QWEN3 ? "qwen3" : a == ARCH_QWEN2 ? "qwen2" : "llama";
}

/* e4m3's step at |u| (u in its range): 2^-9 in the subnormals, else 2^(exponent - 3) */
static double e4m3_step(double u)
{
    u = fabs(u);
    if (u < 0x1p-6)
        return 0x1p-9;
    return ldexp(1.0, (int)floor(log2(u)) - 3);
}

static void test_rope_case(const rope_case &rc, uint64_t seed, bool f8 = false)
{
    uint64_t s = seed;
    const int D = rc.D, H = rc.H, KVH = rc.KVH, T = rc.T, bs = rc.block_size, half = D / 2;
    const int NH = H + 2 * KVH, QKV = NH * D;
    const bool norms = rc.arch == ARCH_QWEN3, bias = rc.arch == ARCH_QWEN2;
    const float eps = 1e-6f;

    struct model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = rc.arch;
    cfg.head_dim = D;
    cfg.max_position = 40960;
    cfg.rope_theta = rc.arch == ARCH_LLAMA ? 500000.0 : 1000000.0;
    cfg.rope_scaling.type = rc.rope;
    if (rc.rope == ROPE_YARN) {
        cfg.rope_scaling.factor = 4.0;
        cfg.rope_scaling.original_max = 32768;
    } else if (rc.rope == ROPE_LLAMA3) {
        cfg.rope_scaling.factor = 8.0;
        cfg.rope_scaling.low_freq_factor = 1.0;
        cfg.rope_scaling.high_freq_factor = 4.0;
        cfg.rope_scaling.original_max = 8192;
    }
    std::vector<float> inv_freq(half);
    float attn_scale = 0;
    char err[256];
    if (backend_rope_freqs(&cfg, inv_freq.data(), &attn_scale, err, sizeof err)) {
        gt_check(false, "%s backend_rope_freqs: %s", gt_mode_name(), err);
        return;
    }

    /* inputs */
    std::vector<bf16> qkv = rand16((size_t)T * QKV, norms ? 2.f : 1.f, 0.f, &s);
    std::vector<bf16> b = rand16(QKV, 0.5f, 0.f, &s);
    std::vector<bf16> qn = rand16(D, 0.2f, 1.f, &s), kn = rand16(D, 0.2f, 1.f, &s);
    std::vector<int32_t> pos(T), slot(T);
    for (int t = 0; t < T; t++)
        pos[t] = (int32_t)(gt_next(&s) % (uint64_t)rc.max_pos);
    pos[0] = T > 1 ? 0 : rc.max_pos - 1; /* the extremes */
    if (T > 1)
        pos[T - 1] = rc.max_pos - 1;
    /* the cache: shuffled physical blocks; token t goes to a random distinct logical slot, ~10% skipped */
    const int nblocks = (T + bs - 1) / bs + 3;
    std::vector<int> blocks(nblocks), logical(T);
    for (int i = 0; i < nblocks; i++)
        blocks[i] = i;
    for (int i = nblocks - 1; i > 0; i--)
        std::swap(blocks[i], blocks[gt_next(&s) % (uint64_t)(i + 1)]);
    for (int i = 0; i < T; i++)
        logical[i] = i;
    for (int i = T - 1; i > 0; i--)
        std::swap(logical[i], logical[gt_next(&s) % (uint64_t)(i + 1)]);
    int skipped = 0;
    for (int t = 0; t < T; t++) {
        bool skip = T > 1 && gt_next(&s) % 10 == 0;
        slot[t] = skip ? -1 : blocks[logical[t] / bs] * bs + logical[t] % bs;
        skipped += skip;
    }
    const size_t cache_n = (size_t)nblocks * KVH * bs * D;

    bf16 *dqkv_base = gt_poisoned<bf16>((size_t)T * QKV + rc.qkv_offset), *dqkv = dqkv_base + rc.qkv_offset;
    GPU_OK(cudaMemcpy(dqkv, qkv.data(), qkv.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    bf16 *db = dev(b), *dqn = dev(qn), *dkn = dev(kn);
    int32_t *dpos = dev(pos), *dslot = dev(slot);
    float *dfreq = dev(inv_freq);
    bf16 *dk = f8 ? NULL : gt_poisoned<bf16>(cache_n), *dv = f8 ? NULL : gt_poisoned<bf16>(cache_n);
    uint8_t *dk8 = f8 ? gt_poisoned<uint8_t>(cache_n) : NULL,
            *dv8 = f8 ? gt_poisoned<uint8_t>(cache_n) : NULL;
    float *dks = f8 ? gt_poisoned<float>(cache_n / D) : NULL,
          *dvs = f8 ? gt_poisoned<float>(cache_n / D) : NULL;
    if (f8)
        K_OK(k_qk_norm_rope_kv_fp8(dqkv, bias ? db : NULL, norms ? dqn : NULL, norms ? dkn : NULL, eps, dpos,
                                   dfreq, attn_scale, dslot, dk8, dv8, dks, dvs, T, H, KVH, D, bs, 0));
    else
        K_OK(k_qk_norm_rope_kv(dqkv, bias ? db : NULL, norms ? dqn : NULL, norms ? dkn : NULL, eps, dpos,
                               dfreq, attn_scale, dslot, dk, dv, T, H, KVH, D, bs, 0));
    std::vector<bf16> gq = host(dqkv, (size_t)T * QKV), gk, gv;
    std::vector<uint8_t> gk8, gv8;
    std::vector<float> gks, gvs;
    if (f8) {
        gk8 = host(dk8, cache_n), gv8 = host(dv8, cache_n), gks = host(dks, cache_n / D),
        gvs = host(dvs, cache_n / D);
    } else {
        gk = host(dk, cache_n), gv = host(dv, cache_n);
    }
    long q_bad = 0, q_n = 0, q_exact = 0,
         s_bad = 0; /* fp8: codes off the nearest, codes, exact, scales off */
    char q_first[200] = "";

    /* reference, in double from the 16-bit inputs; the angle is rounded to fp32 as transformers does */
    acc aq, ak, av;
    std::vector<char> written(cache_n, 0);
    std::vector<double> x(D), c(half), sn(half);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            c[i] = cos((double)ang) * attn_scale, sn[i] = sin((double)ang) * attn_scale;
        }
        for (int hh = 0; hh < NH; hh++) {
            const int kind = hh < H ? 0 : hh < H + KVH ? 1 : 2;
            for (int i = 0; i < D; i++)
                x[i] = (double)h2f(qkv[(size_t)t * QKV + hh * D + i]) + (bias ? h2f(b[hh * D + i]) : 0.0);
            if (norms && kind < 2) {
                double ss = 0;
                for (int i = 0; i < D; i++)
                    ss += x[i] * x[i];
                double r = 1.0 / sqrt(ss / D + eps);
                const std::vector<bf16> &w = kind == 0 ? qn : kn;
                for (int i = 0; i < D; i++)
                    x[i] = x[i] * r * h2f(w[i]);
            }
            if (kind < 2)
                for (int i = 0; i < half; i++) {
                    double a0 = x[i], a1 = x[i + half];
                    x[i] = a0 * c[i] - a1 * sn[i];
                    x[i + half] = a1 * c[i] + a0 * sn[i];
                }
            if (kind == 0) {
                for (int i = 0; i < D; i++)
                    acc_add(aq, h2f(gq[(size_t)t * QKV + hh * D + i]), x[i], rtol16(), 1e-5);
            } else if (slot[t] >= 0 && f8) {
                const int g = hh - H - (kind == 2 ? KVH : 0);
                const size_t at = (((size_t)(slot[t] / bs) * KVH + g) * bs + slot[t] % bs) * D;
                double am = 0;
                for (int i = 0; i < D; i++)
                    am = std::max(am, fabs(x[i]));
                const float sc = (kind == 1 ? gks : gvs)[at / D];
                if (!(fabs(sc - am / 448) <= 1e-4 * am / 448)) {
                    if (!s_bad++)
                        snprintf(q_first, sizeof q_first, "token %d head %d: scale %g, reference %g", t, hh,
                                 (double)sc, am / 448);
                }
                for (int i = 0; i < D; i++) {
                    const uint8_t code = (kind == 1 ? gk8 : gv8)[at + i];
                    const double u = sc > 0 ? x[i] / sc : 0.0, got = e4m3_to_f32(code);
                    q_n++;
                    q_exact += code == f32_to_e4m3(am > 0 ? (float)(x[i] * (448.0 / am)) : 0.f);
                    // + fp32 vs double: an element's evaluation error scales with its vector (RoPE mixes
                    // pairs, the norm scales them all), a few fp32 ulps of amax = 448 code units
                    if (!(fabs(got - u) <= 0.5 * e4m3_step(u) + 1e-4 * fabs(u) + 448 * 4e-7)) {
                        if (!q_bad++ && !s_bad)
                            snprintf(q_first, sizeof q_first,
                                     "token %d head %d element %d: code 0x%02x = %g, x / scale = %g", t, hh,
                                     i, code, got, u);
                    }
                    written[at + i] = 1;
                }
            } else if (slot[t] >= 0) {
                const int g = hh - H - (kind == 2 ? KVH : 0);
                const size_t at = (((size_t)(slot[t] / bs) * KVH + g) * bs + slot[t] % bs) * D;
                for (int i = 0; i < D; i++) {
                    acc_add(kind == 1 ? ak : av, h2f((kind == 1 ? gk : gv)[at + i]), x[i], rtol16(), 1e-5);
                    written[at + i] = 1;
                }
            }
        }
    }
    size_t clobbered = 0, first = 0;
    for (size_t i = 0; i < cache_n; i++) {
        bool kept;
        if (f8) {
            uint32_t sk, sv;
            memcpy(&sk, &gks[i / D], 4), memcpy(&sv, &gvs[i / D], 4);
            kept = gk8[i] == 0xff && gv8[i] == 0xff && sk == 0xffffffffu && sv == 0xffffffffu;
        } else {
            kept = bits(gk[i]) == 0xffff && bits(gv[i]) == 0xffff;
        }
        if (!written[i] && !kept)
            if (!clobbered++)
                first = i;
    }

    char what[160];
    snprintf(what, sizeof what, "rope%s %s D %3d H %2d KVH %d T %4d bs %2d%s%s%s", f8 ? " fp8" : "",
             arch_name(rc.arch), D, H, KVH, T, bs,
             rc.rope == ROPE_YARN     ? " yarn"
             : rc.rope == ROPE_LLAMA3 ? " llama3"
                                      : "",
             rc.qkv_offset ? " misaligned" : "", rc.max_pos > 105615 ? " long" : "");
    char w2[200];
    snprintf(w2, sizeof w2, "%s: q", what);
    acc_report(aq, w2, norm_tol16());
    if (f8) {
        gt_check(
            q_bad == 0 && s_bad == 0 && q_n > 0,
            "%s %s: fp8 k/v cache: %ld codes, %ld not a nearest e4m3 value, %ld scales off (%s); %ld codes "
            "(%.4f%%) "
            "equal to f32_to_e4m3 of the reference",
            gt_mode_name(), what, q_n, q_bad, s_bad, q_first[0] ? q_first : "none", q_exact,
            q_n ? 100.0 * q_exact / q_n : 0.0);
    } else {
        snprintf(w2, sizeof w2, "%s: k cache", what);
        acc_report(ak, w2, norm_tol16());
        snprintf(w2, sizeof w2, "%s: v cache", what);
        acc_report(av, w2, norm_tol16());
    }
    gt_check(clobbered == 0,
             "%s %s: %zu unmapped cache elements overwritten (first %zu), %d tokens skipped, attn_scale %g",
             gt_mode_name(), what, clobbered, first, skipped, attn_scale);

    GPU_OK(cudaFree(dqkv_base));
    GPU_OK(cudaFree(db));
    GPU_OK(cudaFree(dqn));
    GPU_OK(cudaFree(dkn));
    GPU_OK(cudaFree(dpos));
    GPU_OK(cudaFree(dslot));
    GPU_OK(cudaFree(dfreq));
    GPU_OK(cudaFree(dk));
    GPU_OK(cudaFree(dv));
    GPU_OK(cudaFree(dk8));
    GPU_OK(cudaFree(dv8));
    GPU_OK(cudaFree(dks));
    GPU_OK(cudaFree(dvs));
}

static void test_rope(void)
{
    const enum model_arch archs[] = {ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA};
    const int Ds[] = {64, 128};
    const int heads[][2] = {{40, 8}, {16, 8}, {4, 4}};
    const int Ts[] = {1, 37, 300};
    uint64_t k = 300;
    int i = 0;
    for (enum model_arch a : archs)
        for (int D : Ds)
            for (auto &h : heads) {
                const int T = Ts[i % 3], bs = i % 2 ? 16 : 32;
                i++;
                test_rope_case({a, D, h[0], h[1], T, bs, ROPE_DEFAULT, 100000, 0}, case_seed(k++));
            }
    /* the other vector widths, the scalar fallback, rope scalings, long positions, misalignment */
    test_rope_case({ARCH_QWEN3, 16, 4, 2, 50, 32, ROPE_DEFAULT, 4096, 0}, case_seed(k++)); /* tiny models */
    test_rope_case({ARCH_QWEN3, 32, 8, 2, 50, 16, ROPE_DEFAULT, 4096, 0}, case_seed(k++));
    test_rope_case({ARCH_QWEN3, 256, 8, 2, 40, 32, ROPE_DEFAULT, 100000, 0}, case_seed(k++));
    test_rope_case({ARCH_QWEN2, 96, 12, 4, 40, 32, ROPE_DEFAULT, 100000, 0},
                   case_seed(k++));                                                          /* scalar path */
    test_rope_case({ARCH_QWEN3, 80, 8, 8, 40, 16, ROPE_DEFAULT, 100000, 0}, case_seed(k++)); /* scalar path */
    test_rope_case({ARCH_QWEN3, 128, 40, 8, 100, 32, ROPE_YARN, 131072, 0}, case_seed(k++));
    test_rope_case({ARCH_LLAMA, 128, 32, 8, 100, 32, ROPE_LLAMA3, 131072, 0}, case_seed(k++));
    test_rope_case({ARCH_QWEN3, 128, 40, 8, 64, 32, ROPE_DEFAULT, 1000000, 0}, case_seed(k++));
    test_rope_case({ARCH_QWEN3, 128, 40, 8, 64, 32, ROPE_DEFAULT, 100000, 4}, case_seed(k++));
    test_rope_case({ARCH_QWEN2, 64, 16, 8, 64, 32, ROPE_DEFAULT, 100000, 1}, case_seed(k++));
    /* fp8 cache (bf16 only): the vector widths, block sizes 16 and 32, biases, yarn, one token */
    if (gt_f16) {
        int rc8 = k_qk_norm_rope_kv_fp8(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1.f, NULL, NULL, NULL,
                                        NULL, NULL, 0, 8, 2, 64, 32, 0);
        gt_check(rc8 == -1 && strstr(k_last_error(), "k_qk_norm_rope_kv_fp8") &&
                     strstr(k_last_error(), "fp16"),
                 "%s rope fp8 refuses fp16 mode (even a T 0 no-op): \"%s\"", gt_mode_name(), k_last_error());
        k += 8;
    } else {
        test_rope_case({ARCH_QWEN3, 128, 40, 8, 300, 32, ROPE_DEFAULT, 100000, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN3, 128, 16, 8, 1, 16, ROPE_DEFAULT, 100000, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN2, 128, 12, 2, 37, 16, ROPE_DEFAULT, 100000, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN3, 64, 4, 2, 50, 16, ROPE_DEFAULT, 4096, 0}, case_seed(k++), true);
        test_rope_case({ARCH_LLAMA, 64, 16, 8, 100, 32, ROPE_DEFAULT, 100000, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN3, 16, 4, 2, 50, 32, ROPE_DEFAULT, 4096, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN3, 256, 8, 2, 40, 32, ROPE_DEFAULT, 100000, 0}, case_seed(k++), true);
        test_rope_case({ARCH_QWEN3, 128, 40, 8, 100, 32, ROPE_YARN, 131072, 0}, case_seed(k++), true);
        int rc8 = k_qk_norm_rope_kv_fp8(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1.f, NULL, NULL, NULL,
                                        NULL, NULL, 4, 8, 2, 96, 32, 0);
        gt_check(rc8 == -1 && strstr(k_last_error(), "head_dim 96"), "%s rope fp8 D 96 fails cleanly: \"%s\"",
                 gt_mode_name(), k_last_error());
    }
    gt_check(k_qk_norm_rope_kv(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1.f, NULL, NULL, NULL, 0, 8, 2, 64,
                               32, 0) == 0,
             "%s rope T 0 is a no-op", gt_mode_name());
    int rc = k_qk_norm_rope_kv(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1.f, NULL, NULL, NULL, 4, 8, 3, 64,
                               32, 0);
    gt_check(rc == -1 && strstr(k_last_error(), "KVH 3"), "%s rope H %% KVH != 0 fails cleanly: \"%s\"",
             gt_mode_name(), k_last_error());

    /* timing: Qwen3-14B, T = 8192 tokens */
    const int T = 8192, H = 40, KVH = 8, D = 128, bs = 32, NH = H + 2 * KVH;
    uint64_t s = case_seed(399);
    std::vector<bf16> qkv = rand16_uniform((size_t)T * NH * D, 2.f, &s), qn = rand16(D, 0.2f, 1.f, &s);
    std::vector<int32_t> pos(T), slot(T);
    for (int t = 0; t < T; t++)
        pos[t] = t, slot[t] = t;
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; i++)
        inv_freq[i] = 1.0f / powf(1e6f, (float)(2 * i) / D);
    bf16 *dqkv = dev(qkv), *dqn = dev(qn), *dk = gt_poisoned<bf16>((size_t)T * KVH * D),
         *dv = gt_poisoned<bf16>((size_t)T * KVH * D);
    int32_t *dpos = dev(pos), *dslot = dev(slot);
    float *dfreq = dev(inv_freq);
    double ms = median_ms([&] {
        return k_qk_norm_rope_kv(dqkv, NULL, dqn, dqn, 1e-6f, dpos, dfreq, 1.f, dslot, dk, dv, T, H, KVH, D,
                                 bs, 0);
    });
    print_time("k_qk_norm_rope_kv Qwen3-14B T 8192 (qkv read, q+k+v written)", ms,
               (double)T * NH * D * 2 * 2);
    if (!gt_f16) {
        uint8_t *dk8 = (uint8_t *)dk, *dv8 = (uint8_t *)dv; /* codes in the 16-bit caches' first halves */
        float *dks = (float *)(dk8 + (size_t)T * KVH * D), *dvs = (float *)(dv8 + (size_t)T * KVH * D);
        double ms8 = median_ms([&] {
            return k_qk_norm_rope_kv_fp8(dqkv, NULL, dqn, dqn, 1e-6f, dpos, dfreq, 1.f, dslot, dk8, dv8, dks,
                                         dvs, T, H, KVH, D, bs, 0);
        });
        print_time("k_qk_norm_rope_kv_fp8 Qwen3-14B T 8192 (qkv read, q, k/v codes+scales written)", ms8,
                   (double)T * NH * D * 2 + (double)T * H * D * 2 + (double)T * KVH * 2 * (D + 4));
    }
    GPU_OK(cudaFree(dqkv));
    GPU_OK(cudaFree(dqn));
    GPU_OK(cudaFree(dk));
    GPU_OK(cudaFree(dv));
    GPU_OK(cudaFree(dpos));
    GPU_OK(cudaFree(dslot));
    GPU_OK(cudaFree(dfreq));
}

/* ---- silu_mul */

static void test_silu_case(int T, int F, uint64_t seed)
{
    uint64_t s = seed;
    std::vector<bf16> gu = rand16_uniform((size_t)T * 2 * F, 6.f, &s);
    bf16 *dgu = dev(gu), *dout = gt_poisoned<bf16>((size_t)T * F);
    K_OK(k_silu_mul(dgu, dout, T, F, 0));
    std::vector<bf16> out = host(dout, (size_t)T * F);
    acc a;
    for (int t = 0; t < T; t++)
        for (int f = 0; f < F; f++) {
            double g = h2f(gu[(size_t)t * 2 * F + f]), u = h2f(gu[(size_t)t * 2 * F + F + f]);
            acc_add(a, h2f(out[(size_t)t * F + f]), g / (1.0 + exp(-g)) * u, rtol16(), 1e-6);
        }
    char what[96];
    snprintf(what, sizeof what, "silu_mul T %4d F %5d", T, F);
    acc_report(a, what, norm_tol16());
    GPU_OK(cudaFree(dgu));
    GPU_OK(cudaFree(dout));
}

static void test_silu(void)
{
    const int Ts[] = {1, 7, 100, 4096};
    uint64_t k = 500;
    for (int T : Ts)
        test_silu_case(T, 17408, case_seed(k++));
    test_silu_case(33, 1003, case_seed(k++)); /* F % 8 != 0: scalar path */
    test_silu_case(5, 24, case_seed(k++));
    test_silu_case(3, 3000, case_seed(k++)); /* F / 8 = 375: two blocks a row */
    gt_check(k_silu_mul(NULL, NULL, 0, 17408, 0) == 0, "%s silu_mul T 0 is a no-op", gt_mode_name());

    const int T = 8192, F = 17408;
    uint64_t s = case_seed(599);
    std::vector<bf16> gu = rand16_uniform((size_t)T * 2 * F, 6.f, &s);
    bf16 *dgu = dev(gu), *dout = gt_poisoned<bf16>((size_t)T * F);
    double ms = median_ms([&] { return k_silu_mul(dgu, dout, T, F, 0); });
    print_time("k_silu_mul T 8192 F 17408 (read 4 B + write 2 B / output)", ms, (double)T * F * 6);
    GPU_OK(cudaFree(dgu));
    GPU_OK(cudaFree(dout));
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();
    for (int f16 = 0; f16 < 2; f16++) {
        gt_set_mode(f16);
        test_embedding();
        test_rmsnorm();
        test_rope();
        test_silu();
    }
    gt_set_mode(0);
    GPU_OK(cudaDeviceSynchronize());
    printf("%s: %d failure(s)\n", gt_failures ? "FAILED" : "PASSED", gt_failures);
    return gt_failures ? 1 : 0;
}
