/* Helpers for the kernel tests (tests/gpu/test_k_*.cu): skip without a GPU, device buffers,
 * random inputs, and checks and comparisons with a printed verdict. Header-only, CUDA C++ (each test
 * is its own program, so the tally below is per program). */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
extern "C" {
#include "engine/dtype.h"
}

/* Exits 77 (ctest: skipped) with the driver's reason when no CUDA device is usable. */
static inline void gpu_require(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIPPED: no usable CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        fflush(stdout);
        exit(77);
    }
}

#define GPU_OK(call)                                                                                         \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)
/* For launchers: non-zero return -> print k_last_error() and fail. */
#define K_OK(call)                                                                                           \
    do {                                                                                                     \
        if ((call) != 0) {                                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, k_last_error());            \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* ---- the 16-bit mode (kernels.h, k_set_f16) of this thread's launches and of the test's host values,
 * which hold the mode's bits (fp16 in fp16 mode) wherever their C type says bf16 */

static int gt_f16 = 0;
static inline void gt_set_mode(int f16)
{
    gt_f16 = f16 != 0;
    k_set_f16(gt_f16);
}
static inline const char *gt_mode_name(void)
{
    return gt_f16 ? "fp16" : "bf16";
}
/* A 16-bit value of the mode to fp32 (exact), and fp32 to the mode's type (round to nearest even). */
static inline float gt_h2f(uint16_t b)
{
    return gt_f16 ? f16_to_f32(b) : bf16_to_f32(b);
}
static inline uint16_t gt_f2h(float f)
{
    return gt_f16 ? f32_to_f16(f) : f32_to_bf16(f);
}

/* ---- the tally of checks: one printed line per check, "ok   ..." or "FAIL ..." */

static int gt_failures = 0, gt_passes = 0;
/* The first lines of failed checks (gt_check keeps up to 20), for a test to repeat at its end. */
static char gt_failed[20][200];
static int gt_n_failed = 0;

/* Prints "ok   " or "FAIL " and the printf-formatted line, and counts it in gt_passes or gt_failures. */
static void gt_check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void gt_check(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok && gt_n_failed < 20) {
        va_start(ap, fmt);
        vsnprintf(gt_failed[gt_n_failed++], sizeof gt_failed[0], fmt, ap);
        va_end(ap);
    }
    ok ? gt_passes++ : gt_failures++;
}

/* splitmix64 of z: mixes a seed and a case or element index (host and device). */
__host__ __device__ static inline uint64_t gt_splitmix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The run's base seed: LLMQ_TEST_SEED, or fresh from the clock and the pid (never 0, which some
 * generators cannot leave); prints it with the device, so that a failing run can be repeated. */
static inline uint64_t gt_seed(void)
{
    const char *e = getenv("LLMQ_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    if (!seed)
        seed = 1;
    cudaDeviceProp p;
    GPU_OK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs, L2 %d MiB; seed %llu (LLMQ_TEST_SEED=%llu reproduces)\n", p.name,
           p.multiProcessorCount, p.l2CacheSize >> 20, (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

/* Deterministic random numbers for inputs (xorshift64*; seed per test case). */
static inline uint64_t gt_next(uint64_t *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static inline float gt_uniform(uint64_t *s)
{
    return (float)((gt_next(s) >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}
static inline float gt_normal(uint64_t *s)
{
    float a = 0;
    for (int i = 0; i < 4; i++)
        a += gt_uniform(s);
    return a * 0.8660254f; /* sum of 4 U(-1,1) has variance 4/3 */
}

/* A random e4m3 weight code: 90% e4m3(N(0, 1) * 64) (up to the +-448 edge), 10% uniformly random codes
 * (subnormals and every exponent; not the NaN codes 0x7f / 0xff). */
static inline uint8_t gt_random_e4m3(uint64_t *s)
{
    if (gt_next(s) % 10 == 0) {
        uint8_t b;
        do
            b = (uint8_t)(gt_next(s) >> 32);
        while ((b & 0x7f) == 0x7f);
        return b;
    }
    return f32_to_e4m3(gt_normal(s) * 64.f);
}

static inline float gt_bf16_round(float x)
{
    return __bfloat162float(__float2bfloat16(x));
}

/* Host array of n bf16 normals * scale, also returned as the rounded floats in `f` (may be NULL). */
static inline bf16 *gt_random_bf16(size_t n, float scale, uint64_t *seed, float *f)
{
    bf16 *h = (bf16 *)malloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) {
        h[i] = __float2bfloat16(gt_normal(seed) * scale);
        if (f)
            f[i] = __bfloat162float(h[i]);
    }
    return h;
}

template <typename T> static inline T *gt_to_device(const T *h, size_t n)
{
    T *d;
    GPU_OK(cudaMalloc(&d, n * sizeof(T)));
    GPU_OK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
/* Device buffer filled with 0xFF bytes (NaN for floats): unwritten outputs show up. */
template <typename T> static inline T *gt_poisoned(size_t n)
{
    T *d;
    GPU_OK(cudaMalloc(&d, n * sizeof(T)));
    GPU_OK(cudaMemset(d, 0xff, n * sizeof(T)));
    return d;
}
template <typename T> static inline T *gt_to_host(const T *d, size_t n)
{
    T *h = (T *)malloc(n * sizeof(T));
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* ||got - ref|| / ||ref|| over n values; NaN anywhere in got fails. Prints one line; returns 1 if
 * within tol. */
static inline int gt_compare(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double num = 0, den = 0, worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isinf(got[i])) {
            printf("FAIL %s: element %zu is %f (unwritten or overflow)\n", what, i, got[i]);
            return 0;
        }
        double d = (double)got[i] - ref[i];
        num += d * d, den += ref[i] * ref[i];
        if (fabs(d) > worst)
            worst = fabs(d), worst_i = i;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = rel <= tol;
    printf("%s %s: rel err %.3e (tol %.1e), worst |d| %.3e at %zu (got %f, ref %f)\n", ok ? "ok  " : "FAIL",
           what, rel, tol, worst, worst_i, got[worst_i], ref[worst_i]);
    return ok;
}
