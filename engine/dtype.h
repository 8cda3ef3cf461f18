/* Element types of tensors in checkpoints and on backends, and conversions to fp32. */
#pragma once
#include <stddef.h>
#include <stdint.h>

enum dtype { DT_F32, DT_F16, DT_BF16, DT_F8_E4M3, DT_I32, DT_I64, DT_U8 };

/* "F32", "BF16", ... as safetensors spells them; NULL for an unknown value. */
const char *dtype_name(enum dtype t);
/* Parses a safetensors dtype string; -1 if unsupported. */
int dtype_parse(const char *s, enum dtype *out);
/* Bytes per element (1 for F8_E4M3). */
size_t dtype_size(enum dtype t);

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f); /* round to nearest even (subnormals too); overflow to inf; NaN stays NaN */
float e4m3_to_f32(uint8_t b); /* OCP FP8 E4M3 (fn): no infinities, 0x7f/0xff are NaN */
uint8_t f32_to_e4m3(float f); /* round to nearest even, saturating at ±448 */

/* Converts n elements of type t at src to fp32 at dst. Returns -1 for a type that is not a float. */
int dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n);
