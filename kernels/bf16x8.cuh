// Eight bf16 values in one 16-byte vector (uint4) to and from fp32: the unit the vectorized element
// kernels move per lane (rmsnorm.cu, the attention prologue in rope.cuh). Included by kernels/*.cu only.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// exact
__device__ __forceinline__ void bf16x8_to_float(uint4 u, float *f)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 p = __bfloat1622float2(h[i]);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}

// round to nearest even, memory order kept
__device__ __forceinline__ uint4 float_to_bf16x8(const float *f)
{
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}
