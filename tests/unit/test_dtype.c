/* engine/dtype.c against references computed another way: every bf16, f16 and e4m3 encoding is
 * decoded with ldexp from its fields, and the encoders are checked exhaustively (round trips, every
 * midpoint between neighbours, and random floats against a nearest-value search on the decoded grid). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/dtype.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Decoders from the fields of each format, with ldexp. */
static double ref_bf16(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    double v = e == 0xff ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

static double ref_f16(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double ref_e4m3(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    double v = (e == 0xf && m == 7) ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static void same_value(double want, float got, unsigned code)
{
    if (isnan(want)) {
        if (!isnan(got))
            fail_msg("encoding 0x%x: got %g, want NaN", code, (double)got);
        return;
    }
    if ((double)got != want || !signbit(got) != !signbit(want))
        fail_msg("encoding 0x%x: got %.9g, want %.9g", code, (double)got, want);
}

static void test_decode_exhaustive(void **state)
{
    for (unsigned h = 0; h < 65536; h++) {
        same_value(ref_bf16((uint16_t)h), bf16_to_f32((uint16_t)h), h);
        same_value(ref_f16((uint16_t)h), f16_to_f32((uint16_t)h), h);
    }
    for (unsigned b = 0; b < 256; b++)
        same_value(ref_e4m3((uint8_t)b), e4m3_to_f32((uint8_t)b), b);
    /* f16 NaN payloads survive the decode */
    assert_int_equal(bits(f16_to_f32(0x7e01)) & 0x7fffff, 0x201u << 13);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Rounds x to the nearest of lo < hi (two neighbouring encodings, decoded by dec), ties to the even code. */
static unsigned nearest(double x, unsigned lo, unsigned hi, double vlo, double vhi)
{
    double dl = x - vlo, dh = vhi - x;
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1) ? hi : lo;
}

static void test_bf16_encode(void **state)
{
    /* every finite value round-trips; NaN stays NaN with its sign */
    for (unsigned h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        uint16_t back = f32_to_bf16(f);
        if (isnan(f))
            assert_true(isnan(bf16_to_f32(back)) && (back >> 15) == (h >> 15));
        else
            assert_int_equal(back, h);
    }
    /* every midpoint between neighbours goes to the even code, and one fp32 ulp either side decides */
    for (unsigned h = 0; h < 0x7f7f; h++) {
        double lo = ref_bf16((uint16_t)h), hi = ref_bf16((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* 9 significant bits: exact */
        assert_int_equal(f32_to_bf16(mid), (h & 1) ? h + 1 : h);
        assert_int_equal(f32_to_bf16(-mid), 0x8000 | ((h & 1) ? h + 1 : h));
        assert_int_equal(f32_to_bf16(nextafterf(mid, 0)), h);
        assert_int_equal(f32_to_bf16(nextafterf(mid, INFINITY)), h + 1);
    }
    /* beyond the largest bf16: halfway to 2^128 and up is infinity */
    assert_int_equal(f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(f32_to_bf16((float)ldexp(255.5, 120)), 0x7f80);
    assert_int_equal(f32_to_bf16(nextafterf((float)ldexp(255.5, 120), 0)), 0x7f7f);
    assert_int_equal(f32_to_bf16(-INFINITY), 0xff80);
    /* random floats against the nearest of the two candidates */
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = next32();
        float f = from_bits(u);
        if (isnan(f) || isinf(f))
            continue;
        unsigned lo = u >> 16, hi = lo + 1; /* same sign: |f| lies between |lo| and |hi| */
        double vhi = (hi & 0x7fff) == 0x7f80 ? copysign(ldexp(1, 128), f) : ref_bf16((uint16_t)hi);
        unsigned want = nearest(fabs((double)f), lo, hi, fabs(ref_bf16((uint16_t)lo)), fabs(vhi));
        if (f32_to_bf16(f) != want)
            fail_msg("f32_to_bf16(%a) = 0x%x, want 0x%x", (double)f, f32_to_bf16(f), want);
    }
}

/* Nearest f16 by binary search over the positive codes (monotonic in value), ties to even. */
static uint16_t ref_to_f16(float f)
{
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f))
        return sign | 0x7e00;
    if (a >= 65520.0)
        return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff; /* largest code with value <= a */
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (ref_f16((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7bff)
        return sign | 0x7bff;
    return sign | (uint16_t)nearest(a, lo, lo + 1, ref_f16((uint16_t)lo), ref_f16((uint16_t)(lo + 1)));
}

static void test_f16_encode(void **state)
{
    for (unsigned h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint16_t back = f32_to_f16(f);
        if (isnan(f))
            assert_true(isnan(f16_to_f32(back)) && (back >> 15) == (h >> 15));
        else
            assert_int_equal(back, h);
    }
    for (unsigned h = 0; h < 0x7bff; h++) { /* midpoints, subnormals included */
        double lo = ref_f16((uint16_t)h), hi = ref_f16((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        assert_int_equal(f32_to_f16(mid), (h & 1) ? h + 1 : h);
        assert_int_equal(f32_to_f16(nextafterf(mid, 0)), h);
        assert_int_equal(f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
    }
    assert_int_equal(f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(f32_to_f16(ldexpf(1, -25)), 0); /* half the smallest subnormal: ties to 0 */
    assert_int_equal(f32_to_f16(ldexpf(1.5f, -25)), 1);
    for (int i = 0; i < 300000; i++) {
        /* random magnitudes over the whole f16 range and a bit beyond */
        float f = ldexpf((float)(next32() & 0xffffff) / 0x1p24f, (int)(next32() % 47) - 30);
        if (next32() & 1)
            f = -f;
        if (f32_to_f16(f) != ref_to_f16(f))
            fail_msg("f32_to_f16(%a) = 0x%x, want 0x%x", (double)f, f32_to_f16(f), ref_to_f16(f));
    }
}

static uint8_t ref_to_e4m3(float f)
{
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f))
        return sign | 0x7f;
    double a = fabs((double)f);
    if (a >= 448)
        return sign | 0x7e;
    unsigned best = 0;
    for (unsigned b = 1; b <= 0x7e; b++) /* positive codes are monotonic in value */
        if (ref_e4m3((uint8_t)b) <= a)
            best = b;
    return sign | (uint8_t)nearest(a, best, best + 1, ref_e4m3((uint8_t)best), ref_e4m3((uint8_t)(best + 1)));
}

static void test_e4m3_encode(void **state)
{
    for (unsigned b = 0; b < 256; b++) {
        float f = e4m3_to_f32((uint8_t)b);
        assert_int_equal(f32_to_e4m3(f), b); /* NaNs too: 0x7f and 0xff are the only ones */
    }
    for (unsigned b = 0; b < 0x7e; b++) {
        double lo = ref_e4m3((uint8_t)b), hi = ref_e4m3((uint8_t)(b + 1));
        float mid = (float)((lo + hi) / 2);
        assert_int_equal(f32_to_e4m3(mid), (b & 1) ? b + 1 : b);
        assert_int_equal(f32_to_e4m3(-mid), 0x80 | ((b & 1) ? b + 1 : b));
        assert_int_equal(f32_to_e4m3(nextafterf(mid, 0)), b);
        assert_int_equal(f32_to_e4m3(nextafterf(mid, INFINITY)), b + 1);
    }
    /* saturation: everything past 448, infinities included */
    assert_int_equal(f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(f32_to_e4m3(464.0f), 0x7e);
    assert_int_equal(f32_to_e4m3(1e30f), 0x7e);
    assert_int_equal(f32_to_e4m3(INFINITY), 0x7e);
    assert_int_equal(f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(f32_to_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(f32_to_e4m3(0x1p-10f), 0x00); /* half the smallest subnormal: ties to even 0 */
    assert_int_equal(f32_to_e4m3(0x1.8p-10f), 0x01);
    assert_int_equal(f32_to_e4m3(-0.0f), 0x80);
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf((float)(next32() & 0xffffff) / 0x1p24f, (int)(next32() % 22) - 12);
        if (next32() & 1)
            f = -f;
        if (f32_to_e4m3(f) != ref_to_e4m3(f))
            fail_msg("f32_to_e4m3(%a) = 0x%x, want 0x%x", (double)f, f32_to_e4m3(f), ref_to_e4m3(f));
    }
}

static void test_names_and_sizes(void **state)
{
    static const struct {
        enum dtype t;
        const char *name;
        size_t size;
    } want[] = {{DT_F32, "F32", 4}, {DT_F16, "F16", 2}, {DT_BF16, "BF16", 2}, {DT_F8_E4M3, "F8_E4M3", 1},
                {DT_I32, "I32", 4}, {DT_I64, "I64", 8}, {DT_U8, "U8", 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        enum dtype t;
        assert_string_equal(dtype_name(want[i].t), want[i].name);
        assert_int_equal(dtype_size(want[i].t), want[i].size);
        assert_int_equal(dtype_parse(want[i].name, &t), 0);
        assert_int_equal(t, want[i].t);
    }
    enum dtype t;
    assert_int_equal(dtype_parse("F64", &t), -1);
    assert_int_equal(dtype_parse("bf16", &t), -1);
    assert_int_equal(dtype_parse("", &t), -1);
    assert_null(dtype_name((enum dtype)99));
}

static void test_to_f32_arrays(void **state)
{
    uint8_t buf[2 * 257 + 1];
    float out[256];
    /* unaligned source on purpose */
    for (unsigned i = 0; i < 256; i++) {
        uint16_t h = (uint16_t)(i * 251 + 7);
        memcpy(buf + 1 + 2 * i, &h, 2);
    }
    assert_int_equal(dtype_to_f32(DT_BF16, buf + 1, out, 256), 0);
    for (unsigned i = 0; i < 256; i++)
        same_value(ref_bf16((uint16_t)(i * 251 + 7)), out[i], i);
    assert_int_equal(dtype_to_f32(DT_F16, buf + 1, out, 256), 0);
    for (unsigned i = 0; i < 256; i++)
        same_value(ref_f16((uint16_t)(i * 251 + 7)), out[i], i);
    for (unsigned i = 0; i < 256; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(dtype_to_f32(DT_F8_E4M3, buf, out, 256), 0);
    for (unsigned i = 0; i < 256; i++)
        same_value(ref_e4m3((uint8_t)i), out[i], i);
    float f[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(dtype_to_f32(DT_F32, f, out, 3), 0);
    assert_memory_equal(out, f, sizeof f);
    assert_int_equal(dtype_to_f32(DT_I32, buf, out, 1), -1);
    assert_int_equal(dtype_to_f32(DT_U8, buf, out, 1), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_exhaustive), cmocka_unit_test(test_bf16_encode),
        cmocka_unit_test(test_f16_encode),        cmocka_unit_test(test_e4m3_encode),
        cmocka_unit_test(test_names_and_sizes),   cmocka_unit_test(test_to_f32_arrays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
