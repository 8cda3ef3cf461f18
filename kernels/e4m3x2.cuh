// Two e4m3 (OCP fn) codes to fp32, exactly: the hardware fp8x2 -> f16x2 conversion (cvt.rn.f16x2.e4m3x2
// on sm_89+, emulated in software below that), then f16 -> f32. e4m3 has 4 significant bits and an exponent
// range inside f16's normal range, its subnormals included, so neither step rounds. Used by the fp8 attention
// kernels (attention.cuh) and the cache staging (kv_stage.cu). Included by kernels/*.cu only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

// the codes in the low 16 bits of v, low byte first (x), as f16x2 bits
__device__ __forceinline__ __half2_raw e4m3x2_to_half2_raw(uint32_t v)
{
    return __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v)
{
    return __half22float2(__half2(e4m3x2_to_half2_raw(v)));
}

// the same two codes to an f16x2 register (low byte -> low half), one conversion, exact
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v)
{
    const __half2_raw h = e4m3x2_to_half2_raw(v);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
