// SwiGLU activation: out[t, f] = silu(gate_up[t, f]) * gate_up[t, F + f], silu(g) = g / (1 + e^-g),
// fp32 math with an accurate expf, one rounding to bf16 at the store.
// Memory-bound elementwise: one thread per 8-element unit (16-byte loads of gate and up,
// a 16-byte store) when F % 8 == 0 and the buffers are 16-byte aligned, single elements otherwise.
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"

// ---- kernels

// grid (T, ceil(F8 / threads)): token blockIdx.x, unit f of 8 columns; no integer division
__global__ void __launch_bounds__(256)
    silu_mul_vec_kernel(const bf16 *__restrict__ gate_up, bf16 *__restrict__ out, int F8)
{
    pdl_enter(); // kernels/launch.cuh
    const int f = blockIdx.y * blockDim.x + threadIdx.x;
    if (f >= F8)
        return;
    const size_t t = blockIdx.x;
    const uint4 *row = (const uint4 *)gate_up + t * 2 * F8;
    uint4 g = __ldg(row + f), v = __ldg(row + F8 + f), o;
    const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&g, *v2 = (const __nv_bfloat162 *)&v;
    __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 a = __bfloat1622float2(g2[i]), b = __bfloat1622float2(v2[i]);
        o2[i] = __floats2bfloat162_rn(silu_mul1(a.x, b.x), silu_mul1(a.y, b.y));
    }
    ((uint4 *)out)[t * F8 + f] = o;
}

// grid (T, ceil(F / threads))
__global__ void __launch_bounds__(256)
    silu_mul_scalar_kernel(const bf16 *__restrict__ gate_up, bf16 *__restrict__ out, int F)
{
    pdl_enter(); // kernels/launch.cuh
    const int f = blockIdx.y * blockDim.x + threadIdx.x;
    if (f >= F)
        return;
    const size_t t = blockIdx.x;
    const bf16 *row = gate_up + t * 2 * F;
    out[t * F + f] = __float2bfloat16(silu_mul1(__bfloat162float(row[f]), __bfloat162float(row[F + f])));
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

extern "C" int k_silu_mul(const bf16 *gate_up, bf16 *out, int T, int F, cudaStream_t stream)
{
    K_REQUIRE(T >= 0 && F > 0, "k_silu_mul: bad shape T %d F %d", T, F);
    if (T == 0)
        return 0;
    K_REQUIRE(gate_up && out, "k_silu_mul: NULL pointer (gate_up %p out %p)", (const void *)gate_up,
              (void *)out);
    const bool vec = F % 8 == 0 && aligned16(gate_up) && aligned16(out);
    const int n = vec ? F / 8 : F;
    const int threads = n >= 256 ? 256 : (n + 31) / 32 * 32;
    const dim3 grid(T, (n + threads - 1) / threads);
    K_REQUIRE(grid.y <= 65535, "k_silu_mul: F %d too large", F);
    if (vec)
        K_CHECK(k_launch(silu_mul_vec_kernel, grid, threads, 0, stream, gate_up, out, n));
    else
        K_CHECK(k_launch(silu_mul_scalar_kernel, grid, threads, 0, stream, gate_up, out, n));
    return 0;
}
