/* See dtype.h. Conversions work on bit patterns; unaligned sources are read with memcpy. */
#include "engine/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    enum dtype t;
    const char *name;
    size_t size;
} dtypes[] = {
    {DT_F32, "F32", 4}, {DT_F16, "F16", 2}, {DT_BF16, "BF16", 2}, {DT_F8_E4M3, "F8_E4M3", 1},
    {DT_I32, "I32", 4}, {DT_I64, "I64", 8}, {DT_U8, "U8", 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *dtype_name(enum dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].t == t)
            return dtypes[i].name;
    return NULL;
}

int dtype_parse(const char *s, enum dtype *out)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(dtypes[i].name, s)) {
            *out = dtypes[i].t;
            return 0;
        }
    return -1;
}

size_t dtype_size(enum dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].t == t)
            return dtypes[i].size;
    return 0;
}

static inline float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float bf16_to_f32(uint16_t h)
{
    return bits_to_f32((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even; may carry to inf */
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf or NaN, payload kept */
        return bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13)); /* rebias 15 -> 127 */
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) /* >= 65520 (halfway past 65504) rounds to inf; inf stays inf */
        return sign | 0x7c00u;
    if (a < 0x38800000u) /* below 2^-14: subnormal steps of 2^-24; 1024 is the smallest normal, 0x0400 */
        return sign | (uint16_t)rintf(bits_to_f32(a) * 0x1p24f);
    uint32_t r = a - (112u << 23);  /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u); /* nearest, ties to even; a carry moves into the exponent */
    return sign | (uint16_t)(r >> 13);
}

float e4m3_to_f32(uint8_t b)
{
    int exp = (b >> 3) & 0xf;
    int man = b & 7;
    float v;
    if (exp == 0xf && man == 7)
        v = NAN;
    else if (exp == 0)
        v = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
    else
        v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return (b & 0x80) ? -v : v;
}

uint8_t f32_to_e4m3(float f)
{
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f))
        return sign | 0x7f;
    float a = fabsf(f);
    if (a >= 448.0f) /* includes infinity */
        return sign | 0x7e;
    if (a < 0x1p-6f) /* subnormal range: steps of 2^-9; q == 8 is the smallest normal, 0x08 */
        return sign | (uint8_t)rintf(a * 0x1p9f);
    int e;
    float m = frexpf(a, &e);                      /* a = m * 2^e, m in [0.5, 1) */
    e -= 1;                                       /* a = (2m) * 2^e, 2m in [1, 2) */
    int q = (int)rintf((2.0f * m - 1.0f) * 8.0f); /* exact product; rintf rounds half to even */
    if (q == 8) {
        q = 0;
        e++;
    }
    if (e > 8 || (e == 8 && q > 6)) /* cannot happen below 448, kept for safety */
        return sign | 0x7e;
    return sign | (uint8_t)(((e + 7) << 3) | q);
}

int dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    switch (t) {
    case DT_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return 0;
    case DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    case DT_F8_E4M3: {
        float lut[256];
        for (int i = 0; i < 256; i++)
            lut[i] = e4m3_to_f32((uint8_t)i);
        for (size_t i = 0; i < n; i++)
            dst[i] = lut[p[i]];
        return 0;
    }
    default:
        return -1;
    }
}
