// SwiGLU activation: out[t, f] = silu(gate_up[t, f]) * gate_up[t, F + f], silu(g) = g / (1 + e^-g),
// fp32 math with an accurate expf, one rounding to the 16-bit element type E (bf16 or fp16,
// kernels/elt16.cuh) at the store.
// Memory-bound elementwise: one thread per 8-element unit (16-byte loads of gate and up,
// a 16-byte store) when F % 8 == 0 and the buffers are 16-byte aligned, single elements otherwise.
#include "kernels/elt16.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"

// ---- kernels

// grid (T, ceil(F8 / threads)): token blockIdx.x, unit f of 8 columns; no integer division
template <typename E>
__global__ void __launch_bounds__(256)
    silu_mul_vec_kernel(const E *__restrict__ gate_up, E *__restrict__ out, int F8)
{
    pdl_enter(); // kernels/launch.cuh
    const int f = blockIdx.y * blockDim.x + threadIdx.x;
    if (f >= F8)
        return;
    const size_t t = blockIdx.x;
    const uint4 *row = (const uint4 *)gate_up + t * 2 * F8;
    const uint4 g = ld_dep(row + f), v = ld_dep(row + F8 + f);
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, vw[4] = {v.x, v.y, v.z, v.w};
    uint32_t ow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = unpack2<E>(gw[i]), b = unpack2<E>(vw[i]);
        ow[i] = pack2<E>(silu_mul1(a.x, b.x), silu_mul1(a.y, b.y));
    }
    ((uint4 *)out)[t * F8 + f] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
}

// grid (T, ceil(F / threads))
template <typename E>
__global__ void __launch_bounds__(256)
    silu_mul_scalar_kernel(const E *__restrict__ gate_up, E *__restrict__ out, int F)
{
    pdl_enter(); // kernels/launch.cuh
    const int f = blockIdx.y * blockDim.x + threadIdx.x;
    if (f >= F)
        return;
    const size_t t = blockIdx.x;
    const E *row = gate_up + t * 2 * F;
    out[t * F + f] =
        elt16<E>::from_f(silu_mul1(elt16<E>::to_f(ld_dep(row + f)), elt16<E>::to_f(ld_dep(row + F + f))));
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

template <typename E>
static int silu_mul_launch(const bf16 *gate_up16, bf16 *out16, int T, int F, cudaStream_t stream)
{
    const E *gate_up = (const E *)gate_up16;
    E *out = (E *)out16;
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
        K_CHECK(k_launch(silu_mul_vec_kernel<E>, grid, threads, 0, stream, gate_up, out, n));
    else
        K_CHECK(k_launch(silu_mul_scalar_kernel<E>, grid, threads, 0, stream, gate_up, out, n));
    return 0;
}

extern "C" int k_silu_mul(const bf16 *gate_up, bf16 *out, int T, int F, cudaStream_t stream)
{
    return K_ELT16(silu_mul_launch, gate_up, out, T, F, stream);
}
