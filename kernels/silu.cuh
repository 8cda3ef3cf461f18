// SwiGLU's element function, one definition for every kernel that computes it (k_silu_mul,
// k_silu_mul_fp8, the gate/up GEMV's fused epilogue), so that they agree bit for bit:
// silu(g) * u = g / (1 + e^-g) * u in fp32 with an accurate expf. Included by kernels/*.cu only.
#pragma once

__device__ __forceinline__ float silu_mul1(float g, float u)
{
    return g / (1.f + expf(-g)) * u;
}
