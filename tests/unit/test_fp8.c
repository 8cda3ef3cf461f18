/* engine/fp8.c against references computed another way: every code is checked against a nearest-
 * value search over the 256 decoded e4m3 codes (ties to the even code, saturation at 448), scales
 * against the block maxima found in double, and the dequantized values against the format's error
 * bound. Edge blocks, zero blocks, NaN/inf rejection, the fp8 rule of the backends and the values
 * the CPU oracle computes with, and the GPU quantizers' quotient from a shared reciprocal against the
 * division it replaces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/dtype.h"
#include "engine/fp8.h"
#include "engine/fp8_quotient.h"
#include "engine/model.h"

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* roughly normal, scaled */
static float rnd(uint64_t *s, float scale)
{
    double a = 0;
    for (int i = 0; i < 4; i++)
        a += (double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1;
    return (float)(a * 0.866 * scale);
}

/* e4m3 value of a code from its fields (sign, 4-bit exponent with bias 7, 3-bit mantissa) */
static double code_value(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

/* The code nearest to v (ties to the even mantissa), saturating at +-448; by search. */
static uint8_t nearest_code(double v)
{
    if (v > 448)
        v = 448;
    if (v < -448)
        v = -448;
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        double x = code_value(c);
        if (isnan(x) || (c == 0x80)) /* -0 only for negative zero inputs; +0 covers 0 */
            continue;
        if ((x > 0 && v < 0) || (x < 0 && v > 0))
            continue;
        double d = fabs(x - v);
        if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1))
            bd = d, best = c;
    }
    /* a negative value rounding to zero keeps its sign */
    if (code_value(best) == 0 && signbit(v))
        best = 0x80;
    return (uint8_t)best;
}

static void check_quant(const float *w, int N, int K, int b0, int b1, const char *what)
{
    const int nb0 = (N + b0 - 1) / b0, nb1 = (K + b1 - 1) / b1;
    uint8_t *q = malloc((size_t)N * K);
    float *s = malloc((size_t)nb0 * nb1 * sizeof *s), *d = malloc((size_t)N * K * sizeof *d);
    assert_non_null(q);
    assert_non_null(s);
    assert_non_null(d);
    assert_int_equal(fp8_quantize_blocks(w, N, K, b0, b1, q, s), 0);
    fp8_dequantize_blocks(q, s, N, K, b0, b1, d);
    int bad_code = 0, bad_bound = 0;
    for (int br = 0; br < nb0; br++)
        for (int bc = 0; bc < nb1; bc++) {
            double amax = 0;
            for (int r = br * b0; r < N && r < (br + 1) * b0; r++)
                for (int c = bc * b1; c < K && c < (bc + 1) * b1; c++)
                    amax = fmax(amax, fabs((double)w[(size_t)r * K + c]));
            const float sc = s[br * nb1 + bc];
            float want = amax == 0 ? 1.0f : (float)amax / 448.0f;
            if (amax > 0 && want < FLT_MIN)
                want = FLT_MIN;
            assert_true(sc == want);
            for (int r = br * b0; r < N && r < (br + 1) * b0; r++)
                for (int c = bc * b1; c < K && c < (bc + 1) * b1; c++) {
                    const size_t i = (size_t)r * K + c;
                    if (q[i] != nearest_code((double)(w[i] / sc)))
                        bad_code++;
                    /* e4m3: 3 mantissa bits, half an ulp is 2^-4 relative; subnormal steps 2^-9 */
                    double err = fabs((double)d[i] - w[i]),
                           bound = fmax(ldexp(fabs(w[i]), -4), ldexp(sc, -10));
                    if (err > bound * (1 + 1e-6))
                        bad_bound++;
                    if (fabs(w[i]) == amax && amax > 0) /* the block's largest value maps to 448 */
                        if (!(fabs(fabs((double)d[i]) - amax) <= amax * 1e-6)) {
                            printf("block (%d, %d) max %g -> code 0x%02x scale %g -> %g\n", br, bc, amax,
                                   q[i], sc, d[i]);
                            fail();
                        }
                }
        }
    printf("%s: %dx%d in %dx%d blocks: %d code mismatches, %d values outside the bound\n", what, N, K, b0, b1,
           bad_code, bad_bound);
    assert_int_equal(bad_code, 0);
    assert_int_equal(bad_bound, 0);
    free(q);
    free(s);
    free(d);
}

static void test_scale(void **state)
{
    (void)state;
    assert_true(fp8_scale(0.0f) == 1.0f);
    assert_true(fp8_scale(448.0f) == 1.0f);
    assert_true(fp8_scale(1.0f) == 1.0f / 448.0f);
    assert_true(fp8_scale(1e-40f) == FLT_MIN); /* subnormal quotient -> smallest normal */
    assert_true(fp8_scale(FLT_MIN * 448.0f) == FLT_MIN);
    assert_true(fp8_scale(3e38f) == 3e38f / 448.0f);
}

static void test_round_trip_edges(void **state)
{
    (void)state;
    uint64_t seed = 42;
    /* 300 x 200 in 128x128: full, right-edge, bottom-edge and corner blocks */
    const int N = 300, K = 200;
    float *w = malloc((size_t)N * K * sizeof *w);
    assert_non_null(w);
    for (int i = 0; i < N * K; i++)
        w[i] = rnd(&seed, 0.02f);
    /* an outlier (one block's scale set by it, its small values into the subnormal range), a zero block
     * (rows 128..255, columns 128..199), an exact midpoint and exact +-448 * scale */
    w[5 * K + 7] = 3.0f;
    for (int r = 128; r < 256; r++)
        for (int c = 128; c < K; c++)
            w[(size_t)r * K + c] = 0.0f;
    w[290 * K + 199] = -1e-30f; /* corner block of one tiny value and randoms */
    check_quant(w, N, K, 128, 128, "normal weights");
    /* small odd blocks: every index path */
    check_quant(w, N, K, 3, 7, "3x7 blocks");
    /* a matrix smaller than one block */
    check_quant(w, 5, 7, 128, 128, "5x7 in one block");
    /* values spread over many binades, so that every exponent and the subnormals are hit */
    for (int i = 0; i < N * K; i++)
        w[i] = rnd(&seed, 1.0f) * ldexpf(1.0f, (int)(rng_next(&seed) % 30) - 20);
    check_quant(w, N, K, 128, 128, "wide dynamic range");
    free(w);
}

static void test_zero_block(void **state)
{
    (void)state;
    float w[4 * 4] = {0};
    w[0] = -0.0f;
    uint8_t q[16];
    float s[1];
    assert_int_equal(fp8_quantize_blocks(w, 4, 4, 128, 128, q, s), 0);
    assert_true(s[0] == 1.0f);
    for (int i = 1; i < 16; i++)
        assert_int_equal(q[i], 0);
    assert_true(e4m3_to_f32(q[0]) == 0.0f);
}

static void test_reject_nonfinite(void **state)
{
    (void)state;
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint8_t q[6];
    float s[1];
    w[4] = NAN;
    assert_int_equal(fp8_quantize_blocks(w, 2, 3, 128, 128, q, s), -1);
    w[4] = INFINITY;
    assert_int_equal(fp8_quantize_blocks(w, 2, 3, 128, 128, q, s), -1);
    w[4] = -INFINITY;
    assert_int_equal(fp8_quantize_blocks(w, 2, 3, 128, 128, q, s), -1);
    w[4] = 5;
    assert_int_equal(fp8_quantize_blocks(w, 2, 3, 128, 128, q, s), 0);
    assert_int_equal(fp8_quantize_blocks(w, 0, 3, 128, 128, q, s), -1);
}

static struct tensor_view view(const char *name, enum dtype t, int64_t rows, int64_t cols, const void *data)
{
    struct tensor_view v;
    memset(&v, 0, sizeof v);
    v.name = name, v.dtype = t, v.ndim = 2, v.shape[0] = rows, v.shape[1] = cols, v.data = data;
    return v;
}

static void test_linear_use(void **state)
{
    (void)state;
    char why[256];
    struct tensor_view q = view("q", DT_BF16, 256, 512, NULL), k = view("k", DT_BF16, 128, 512, NULL),
                       odd = view("odd", DT_BF16, 64, 512, NULL),
                       oddk = view("oddk", DT_BF16, 256, 200, NULL);
    const struct tensor_view *fused[2] = {&q, &k}, *bad[2] = {&q, &odd}, *badk[1] = {&oddk};
    assert_false(fp8_linear_use(BE_WEIGHTS_AUTO, fused, 2, why, sizeof why)); /* bf16 checkpoint: as is */
    assert_string_equal(why, "");
    assert_false(fp8_linear_use(BE_WEIGHTS_BF16, fused, 2, why, sizeof why));
    assert_true(fp8_linear_use(BE_WEIGHTS_FP8, fused, 2, why, sizeof why));
    assert_false(fp8_linear_use(BE_WEIGHTS_FP8, bad, 2, why, sizeof why)); /* a part of 64 rows */
    assert_non_null(strstr(why, "bf16"));
    assert_false(fp8_linear_use(BE_WEIGHTS_FP8, badk, 1, why, sizeof why)); /* K 200 */
    /* fp8 checkpoint tensors */
    struct tensor_view sc = view("q_scale_inv", DT_F32, 2, 4, NULL);
    struct tensor_view f8 = view("q8", DT_F8_E4M3, 256, 512, NULL), f8b = f8;
    f8.scale_inv = &sc, f8.block[0] = 128, f8.block[1] = 128;
    f8b.scale_inv = &sc, f8b.block[0] = 64, f8b.block[1] = 128;
    const struct tensor_view *ck[1] = {&f8}, *ckb[1] = {&f8b}, *mixed[2] = {&f8, &k};
    assert_true(fp8_linear_use(BE_WEIGHTS_AUTO, ck, 1, why, sizeof why));
    assert_false(fp8_linear_use(BE_WEIGHTS_AUTO, mixed, 2, why, sizeof why)); /* auto: only all-fp8 */
    assert_true(fp8_linear_use(BE_WEIGHTS_FP8, mixed, 2, why, sizeof why));
    assert_false(fp8_linear_use(BE_WEIGHTS_AUTO, ckb, 1, why, sizeof why)); /* 64x128 blocks */
    assert_non_null(strstr(why, "64x128"));
    assert_false(fp8_linear_use(BE_WEIGHTS_BF16, ck, 1, why, sizeof why));
}

static void test_linear_values(void **state)
{
    (void)state;
    const int N = 256, K = 384;
    uint64_t seed = 7;
    float *w = malloc((size_t)N * K * 4), *got = malloc((size_t)N * K * 4), *want = malloc((size_t)N * K * 4);
    uint16_t *h = malloc((size_t)N * K * 2);
    uint8_t *q = malloc((size_t)N * K);
    float s[2 * 3];
    assert_true(w && got && want && h && q);
    for (int i = 0; i < N * K; i++)
        w[i] = rnd(&seed, 0.05f);
    /* an fp32 view: rounded to bf16 first, then quantized (what the GPU does with its bf16 copy) */
    struct tensor_view v = view("w", DT_F32, N, K, w);
    char err[256];
    assert_int_equal(fp8_linear_values(&v, true, got, err, sizeof err), 0);
    for (int i = 0; i < N * K; i++) {
        h[i] = f32_to_bf16(w[i]);
        want[i] = bf16_to_f32(h[i]);
    }
    assert_int_equal(fp8_quantize_blocks(want, N, K, 128, 128, q, s), 0);
    fp8_dequantize_blocks(q, s, N, K, 128, 128, want);
    assert_memory_equal(got, want, (size_t)N * K * 4);
    /* the bf16 view of the same values gives the same */
    struct tensor_view vb = view("wb", DT_BF16, N, K, h);
    assert_int_equal(fp8_linear_values(&vb, true, got, err, sizeof err), 0);
    assert_memory_equal(got, want, (size_t)N * K * 4);
    /* without fp8: the plain values */
    assert_int_equal(fp8_linear_values(&v, false, got, err, sizeof err), 0);
    assert_memory_equal(got, w, (size_t)N * K * 4);
    /* an fp8 view: its dequantized values, not quantized again */
    struct tensor_view sv = view("w8_scale_inv", DT_F32, 2, 3, s);
    struct tensor_view v8 = view("w8", DT_F8_E4M3, N, K, q);
    v8.scale_inv = &sv, v8.block[0] = 128, v8.block[1] = 128;
    assert_int_equal(fp8_linear_values(&v8, true, got, err, sizeof err), 0);
    assert_memory_equal(got, want, (size_t)N * K * 4);
    /* a NaN cannot be quantized */
    w[100] = NAN;
    assert_int_equal(fp8_linear_values(&v, true, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "NaN"));
    free(w), free(got), free(want), free(h), free(q);
}

/* bf16 bit pattern -> float */
static float bf16_bits(uint32_t b)
{
    union {
        uint32_t u;
        float f;
    } x = {b << 16};
    return x.f;
}

/* For s = fp8_scale(amax) and every bf16 v with 0 < v <= amax, for the bf16 amax of the given exponent
 * fields: fp8_divide's quotient has the e4m3 code of v / s, and is v / s bit for bit where that is
 * 2^-11 or more (below, both give code 0). Negative v mirror positive ones exactly (every step rounds
 * to nearest even) and v = 0 gives 0. Returns the pairs checked; *n_fast: those on the reciprocal path. */
static uint64_t check_quotients(const int *exps, int n_exps, uint64_t *n_fast)
{
    uint64_t n = 0, bad = 0;
    *n_fast = 0;
    for (int e = 0; e < n_exps; e++)
        for (uint32_t m = 0; m < 128; m++) {
            const uint32_t ab = (uint32_t)exps[e] << 7 | m;
            if (ab == 0)
                continue;
            const float amax = bf16_bits(ab), s = fp8_scale(amax);
            for (uint32_t vb = 1; vb <= ab; vb++) {
                const float v = bf16_bits(vb), want = v / s;
                float got;
                fp8_divide(&got, &v, 1, s);
                const bool same = f32_to_e4m3(want) == f32_to_e4m3(got) &&
                                  (memcmp(&want, &got, 4) == 0 || fabsf(want) < 0x1p-11f);
                if (!same && bad++ < 5)
                    fprintf(stderr, "v %a / s %a (amax %a): want %a, got %a\n", (double)v, (double)s,
                            (double)amax, (double)want, (double)got);
                n++;
                *n_fast += s >= FP8Q_MIN_SCALE;
            }
        }
    assert_int_equal(bad, 0);
    return n;
}

static void test_quotient(void **state)
{
    (void)state;
    /* every exponent field of amax: all (amax, v) pairs, ~5e8 (LLMQ_TEST_EXHAUSTIVE=1) */
    const char *ex = getenv("LLMQ_TEST_EXHAUSTIVE");
    if (ex && strcmp(ex, "1") == 0) {
        int all[255];
        for (int e = 0; e < 255; e++)
            all[e] = e;
        uint64_t fast, n = check_quotients(all, 255, &fast);
        printf("fp8 quotient: %llu pairs (%llu by the reciprocal), all equal\n", (unsigned long long)n,
               (unsigned long long)fast);
        return;
    }
    /* otherwise: subnormal and tiny amax (scale FLT_MIN, by division), amax around 2^-107 (exponent
     * field 20: where the reciprocal path would first go wrong, were FP8Q_MIN_SCALE below ~2^-100),
     * amax where the scale crosses FP8Q_MIN_SCALE (448 x 2^-60 is 1.75 x 2^-52: exponent field 75),
     * amax near 1 and near 448, and the largest exponents, each with every mantissa */
    const int some[] = {0,  1,   2,   3,   18,  20,  22,  73,  74,  75,  76,
                        77, 126, 127, 128, 134, 135, 136, 250, 252, 253, 254};
    uint64_t fast, n = check_quotients(some, (int)(sizeof some / sizeof some[0]), &fast);
    printf("fp8 quotient: %llu pairs (%llu by the reciprocal), all equal\n", (unsigned long long)n,
           (unsigned long long)fast);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale),      cmocka_unit_test(test_round_trip_edges),
        cmocka_unit_test(test_zero_block), cmocka_unit_test(test_reject_nonfinite),
        cmocka_unit_test(test_linear_use), cmocka_unit_test(test_linear_values),
        cmocka_unit_test(test_quotient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
