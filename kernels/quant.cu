// FP8 (OCP e4m3) quantization for the block-scaled GEMMs, bit for bit engine/fp8.c: a group's scale
// is amax / 448 (one correctly rounded division; 1 for an all-zero group, FLT_MIN where the quotient
// is smaller), and each value becomes e4m3(v / scale) (a correctly rounded division, then the
// hardware's round-to-nearest-even saturating conversion, which is f32_to_e4m3 for finite inputs).
// The activation quantizers take a group's quotients from one reciprocal of its scale
// (engine/fp8_quotient.h: the same codes as the division, checked for every bf16 input).
//
//   k_quant_fp8_weight  128x128 blocks of a bf16 weight, one CTA per block (load time only)
//   k_quant_fp8_act     1x128 groups of bf16 activations, 16 lanes a group: each lane holds 8
//                       consecutive values (a 16-byte load), a half-warp max, an 8-byte store
//   k_add_rmsnorm_fp8   k_add_rmsnorm (or k_rmsnorm) that also writes the quantized output
//   k_silu_mul_fp8      k_silu_mul that also writes the quantized output (16 lanes a group, as above)
// The two elementwise ones take a 2-D grid (row, unit of 8 columns), so a lane finds its group without
// a division (a 64-bit division of the warp index made them issue-bound).
// bf16 only: every launcher fails in fp16 mode (k_f16(), kernels.h).
// The fused producers round their result to bf16 first (the value k_add_rmsnorm / k_silu_mul would
// store) and quantize that, so their e4m3 output is k_quant_fp8_act of their bf16 output exactly.
// Activation scales are stored M-contiguous with a leading dimension of K_FP8_ROWS(M) (a multiple of
// 4): x_scale[g * K_FP8_ROWS(M) + m], the layout cuBLASLt's VEC128_32F scale mode reads for the B
// operand (it needs the leading dimension a multiple of 4). Padding entries are not written.
#include <cuda_fp8.h>
#include <float.h>

#include "engine/fp8_quotient.h"
#include "kernels/elt16.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/silu.cuh"

#define QBLK 128

// ---- device helpers

__device__ __forceinline__ float fp8_scale_d(float amax)
{
    if (amax == 0.f)
        return 1.f;
    float s = __fdiv_rn(amax, 448.f);
    return s < FLT_MIN ? FLT_MIN : s;
}

__device__ __forceinline__ uint8_t to_e4m3(float v, float s)
{
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Four quotients to their e4m3 codes (round to nearest even, saturating), packed low byte first.
__device__ __forceinline__ uint32_t e4m3x4(const float d[4])
{
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(d[0], d[1]), __NV_SATFINITE, __NV_E4M3) |
           (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(d[2], d[3]), __NV_SATFINITE, __NV_E4M3) << 16;
}

// Quantizes one 128-column group held by L lanes, N = 128 / L values each (L = 32: the whole warp, 4
// values a lane; L = 16: lanes 0-15 or 16-31, 8 values a lane, a half-warp active or not as a whole):
// writes the lane's N bytes at q and, from the group's first lane, the scale at *scale. The max is
// exact in any order, so both shapes give the same codes and scale for the same group.
template <int L>
__device__ __forceinline__ void quant_group(const float (&v)[128 / L], uint8_t *q, float *scale)
{
    constexpr int N = 128 / L;
    static_assert(L == 16 || L == 32, "a group is held by a half-warp or a warp");
    const unsigned lane = threadIdx.x & 31;
    const unsigned mask = L == 32 ? 0xffffffffu : lane < 16 ? 0x0000ffffu : 0xffff0000u;
    float a = fabsf(v[0]);
#pragma unroll
    for (int i = 1; i < N; i++)
        a = fmaxf(a, fabsf(v[i]));
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
        a = fmaxf(a, __shfl_xor_sync(mask, a, o));
    const float s = fp8_scale_d(a);
    float d[N];
    fp8_divide(d, v, N, s); // engine/fp8_quotient.h: v / s from one reciprocal
    if constexpr (N == 4)
        *(uint32_t *)q = e4m3x4(d);
    else
        *(uint2 *)q = make_uint2(e4m3x4(d), e4m3x4(d + 4));
    if ((lane & (L - 1)) == 0)
        *scale = s;
}

// Four bf16 as floats: DEP for what an earlier kernel of the step wrote (ld_dep, kernels/launch.cuh),
// else weights.
template <bool DEP = false> __device__ __forceinline__ void load_bf16x4(const bf16 *p, float v[4])
{
    const uint2 u = DEP ? ld_dep((const uint2 *)p) : *(const uint2 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

__device__ __forceinline__ void store_bf16x4(bf16 *p, const float v[4])
{
    uint2 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
    h[0] = __floats2bfloat162_rn(v[0], v[1]);
    h[1] = __floats2bfloat162_rn(v[2], v[3]);
    *(uint2 *)p = u;
}

__device__ __forceinline__ float bf16r_d(float x)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

// ---- kernels

// grid (ceil(K/128), ceil(N/128)), 256 threads: pass 1 the block's amax (and a NaN/inf check),
// pass 2 the codes. Each thread handles columns c = tid % 128 of rows tid / 128, +2, ...
__global__ void __launch_bounds__(256)
    quant_weight_kernel(const bf16 *__restrict__ W, int N, int K, uint8_t *__restrict__ Wq,
                        float *__restrict__ w_scale, int *bad)
{
    __shared__ float part[8];
    const int c = blockIdx.x * QBLK + threadIdx.x % QBLK, r0 = blockIdx.y * QBLK;
    const int r1 = r0 + QBLK < N ? r0 + QBLK : N;
    float amax = 0.f;
    bool finite = true;
    if (c < K)
        for (int r = r0 + threadIdx.x / QBLK; r < r1; r += 2) {
            float a = fabsf(__bfloat162float(W[(size_t)r * K + c]));
            finite &= isfinite(a);
            amax = fmaxf(amax, a);
        }
    if (!finite && bad)
        atomicOr(bad, 1);
    amax = warp_max(amax);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = amax;
    __syncthreads();
    float m = part[0];
    for (int i = 1; i < 8; i++)
        m = fmaxf(m, part[i]);
    const float s = fp8_scale_d(m);
    if (threadIdx.x == 0)
        w_scale[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = s;
    if (c < K)
        for (int r = r0 + threadIdx.x / QBLK; r < r1; r += 2)
            Wq[(size_t)r * K + c] = to_e4m3(__bfloat162float(W[(size_t)r * K + c]), s);
}

// grid (M, ceil(K / 8 / 256)): row blockIdx.x, unit u of 8 columns (group u / 16). K is a multiple of
// 128, so a CTA's units past K / 8 are whole half-warps. (Two or four rows a CTA run no faster.)
__global__ void __launch_bounds__(256) quant_act_kernel(const bf16 *__restrict__ X, int M, int K,
                                                        uint8_t *__restrict__ Xq, float *__restrict__ x_scale)
{
    pdl_enter(); // kernels/launch.cuh
    const int u = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= K / 8)
        return;
    const size_t m = blockIdx.x, off = m * K + (size_t)u * 8;
    float v[8];
    x8_to_float<bf16>(ld_dep((const uint4 *)(X + off)), v);
    quant_group<16>(v, Xq + off, x_scale + (size_t)(u / 16) * K_FP8_ROWS(M) + m);
}

// Block sum (every thread gets it); blockDim.x = 256.
__device__ __forceinline__ float block_sum256(float v)
{
    __shared__ float part[8];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < 8 ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

// A lane's 4 columns of one group: the residual v times rr and the norm weights, rounded to bf16 (written
// to out when given), then the group's e4m3 codes and scale (quant_group<32>: the warp holds the group).
__device__ __forceinline__ void norm_quant_group(float4 v, float rr, const float wf[4], bf16 *out, uint8_t *q,
                                                 float *scale)
{
    float y[4];
    y[0] = bf16r_d(v.x * rr * wf[0]), y[1] = bf16r_d(v.y * rr * wf[1]);
    y[2] = bf16r_d(v.z * rr * wf[2]), y[3] = bf16r_d(v.w * rr * wf[3]);
    if (out)
        store_bf16x4(out, y);
    quant_group<32>(y, q, scale);
}

// One CTA (256 threads, 8 warps) per row. Pass 1: residual += x (4 columns per thread at a time)
// and the sum of squares; pass 2: warp w normalizes groups w, w + 8, ... (re-reading its residual,
// which the same thread wrote: no barrier needed beyond the reduction's), rounds to bf16, writes out
// and the group's e4m3 codes and scale. NG > 0: the row has at most 8 NG groups (cols <= 1024 NG),
// and a thread's NG groups are loaded at once (the norm weights before the PDL wait, the residual
// and x right after it), which at decode is the kernel's latency; NG = 0: any cols, one group at a
// time. The same sums in the same order either way.
template <bool ADD, int NG>
__global__ void __launch_bounds__(256)
    add_rmsnorm_fp8_kernel(float *__restrict__ residual, const bf16 *__restrict__ x,
                           const bf16 *__restrict__ w, bf16 *__restrict__ out, uint8_t *__restrict__ outq,
                           float *__restrict__ out_scale, int rows, int cols, float eps)
{
    const size_t row = (size_t)blockIdx.x * cols;
    float *res = residual + row;
    const int G = cols / QBLK, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    // thread (warp, lane) owns columns g * 128 + lane * 4 .. + 3 of groups g = warp, warp + 8, ...
    if (NG > 0) {
        constexpr int N = NG > 0 ? NG : 1;
        float wf[N][4], xf[N][4];
        float4 v[N];
#pragma unroll
        for (int j = 0; j < N; j++)
            if (warp + 8 * j < G)
                load_bf16x4(w + (warp + 8 * j) * QBLK + lane * 4, wf[j]);
        pdl_enter_early(); // kernels/launch.cuh: the trigger first (it precedes a GEMV at decode)
#pragma unroll
        for (int j = 0; j < N; j++)
            if (warp + 8 * j < G) {
                const int c = (warp + 8 * j) * QBLK + lane * 4;
                v[j] = ld_dep((const float4 *)(res + c));
                if (ADD)
                    load_bf16x4<true>(x + row + c, xf[j]);
            }
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < N; j++)
            if (warp + 8 * j < G) {
                if (ADD) {
                    v[j].x += xf[j][0], v[j].y += xf[j][1], v[j].z += xf[j][2], v[j].w += xf[j][3];
                    *(float4 *)(res + (warp + 8 * j) * QBLK + lane * 4) = v[j];
                }
                ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
            }
        const float rr = rsqrtf(block_sum256(ss) / (float)cols + eps);
#pragma unroll
        for (int j = 0; j < N; j++)
            if (warp + 8 * j < G) {
                const int g = warp + 8 * j, c = g * QBLK + lane * 4;
                norm_quant_group(v[j], rr, wf[j], out ? out + row + c : NULL, outq + row + c,
                                 out_scale + (size_t)g * K_FP8_ROWS(rows) + blockIdx.x);
            }
        return;
    }
    pdl_enter_early(); // kernels/launch.cuh
    float ss = 0.f;
    for (int g = warp; g < G; g += 8) {
        const int c = g * QBLK + lane * 4;
        float4 v = ld_dep((const float4 *)(res + c));
        if (ADD) {
            float xf[4];
            load_bf16x4<true>(x + row + c, xf);
            v.x += xf[0], v.y += xf[1], v.z += xf[2], v.w += xf[3];
            *(float4 *)(res + c) = v;
        }
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float rr = rsqrtf(block_sum256(ss) / (float)cols + eps);
    for (int g = warp; g < G; g += 8) {
        const int c = g * QBLK + lane * 4;
        const float4 v = ld_dep((const float4 *)(res + c));
        float wf[4];
        load_bf16x4(w + c, wf);
        norm_quant_group(v, rr, wf, out ? out + row + c : NULL, outq + row + c,
                         out_scale + (size_t)g * K_FP8_ROWS(rows) + blockIdx.x);
    }
}

// grid (T, ceil(F / 8 / 256)): token blockIdx.x, unit u of 8 outputs (group u / 16), as quant_act_kernel.
__global__ void __launch_bounds__(256)
    silu_mul_fp8_kernel(const bf16 *__restrict__ gate_up, bf16 *__restrict__ out, uint8_t *__restrict__ outq,
                        float *__restrict__ out_scale, int T, int F)
{
    pdl_enter(); // kernels/launch.cuh
    const int u = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= F / 8)
        return;
    const size_t t = blockIdx.x;
    const bf16 *row = gate_up + t * 2 * F + (size_t)u * 8;
    float gv[8], uv[8], y[8];
    x8_to_float<bf16>(ld_dep((const uint4 *)row), gv);
    x8_to_float<bf16>(ld_dep((const uint4 *)(row + F)), uv);
#pragma unroll
    for (int i = 0; i < 8; i++)
        y[i] = bf16r_d(silu_mul1(gv[i], uv[i]));
    if (out)
        *(uint4 *)(out + t * F + (size_t)u * 8) = float_to_x8<bf16>(y);
    quant_group<16>(y, outq + t * F + (size_t)u * 8, out_scale + (size_t)(u / 16) * K_FP8_ROWS(T) + t);
}

// ---- launchers

static bool aligned(const void *p, unsigned a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

// (rows, units of 8 columns over 256-thread CTAs) for quant_act_kernel and silu_mul_fp8_kernel
static dim3 unit_grid(int rows, int cols)
{
    return dim3((unsigned)rows, (unsigned)((cols / 8 + 255) / 256));
}

extern "C" int k_quant_fp8_weight(const bf16 *W, int N, int K, uint8_t *Wq, float *w_scale, int *bad,
                                  cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_quant_fp8_weight: bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(N > 0 && K > 0, "k_quant_fp8_weight: bad shape N %d K %d", N, K);
    K_REQUIRE(W && Wq && w_scale, "k_quant_fp8_weight: NULL pointer");
    const dim3 grid((K + QBLK - 1) / QBLK, (N + QBLK - 1) / QBLK);
    K_REQUIRE(grid.y <= 65535, "k_quant_fp8_weight: N %d too large", N);
    quant_weight_kernel<<<grid, 256, 0, stream>>>(W, N, K, Wq, w_scale, bad);
    K_CHECK_LAUNCH();
    return 0;
}

extern "C" int k_quant_fp8_act(const bf16 *X, int M, int K, uint8_t *Xq, float *x_scale, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_quant_fp8_act: bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(M >= 0 && K > 0 && K % QBLK == 0, "k_quant_fp8_act: bad shape M %d K %d (K a multiple of 128)",
              M, K);
    if (M == 0)
        return 0;
    K_REQUIRE(X && Xq && x_scale, "k_quant_fp8_act: NULL pointer");
    K_REQUIRE(aligned(X, 16) && aligned(Xq, 8) && aligned(x_scale, 4),
              "k_quant_fp8_act: misaligned pointer (X 16 bytes, Xq 8, x_scale 4)");
    K_CHECK(k_launch(quant_act_kernel, unit_grid(M, K), 256, 0, stream, X, M, K, Xq, x_scale));
    return 0;
}

extern "C" int k_add_rmsnorm_fp8(float *residual, const bf16 *x, const bf16 *w, bf16 *out, uint8_t *outq,
                                 float *out_scale, int rows, int cols, float eps, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_add_rmsnorm_fp8: bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(rows >= 0 && cols > 0 && cols % QBLK == 0,
              "k_add_rmsnorm_fp8: bad shape rows %d cols %d (cols a multiple of 128)", rows, cols);
    if (rows == 0)
        return 0;
    K_REQUIRE(residual && w && outq && out_scale, "k_add_rmsnorm_fp8: NULL pointer");
    K_REQUIRE(!(eps < 0), "k_add_rmsnorm_fp8: eps %g < 0", (double)eps);
    K_REQUIRE(aligned(residual, 16) && aligned(w, 8) && (!x || aligned(x, 8)) && (!out || aligned(out, 8)) &&
                  aligned(outq, 4) && aligned(out_scale, 4),
              "k_add_rmsnorm_fp8: misaligned pointer");
    const int ng = (cols / QBLK + 7) / 8; // groups per thread
    switch (x ? ng : -ng) {
#define NORM_CASE(N)                                                                                         \
    case N:                                                                                                  \
        K_CHECK(k_launch(add_rmsnorm_fp8_kernel<true, N>, rows, 256, 0, stream, residual, x, w, out, outq,   \
                         out_scale, rows, cols, eps));                                                       \
        break;                                                                                               \
    case -N:                                                                                                 \
        K_CHECK(k_launch(add_rmsnorm_fp8_kernel<false, N>, rows, 256, 0, stream, residual, x, w, out, outq,  \
                         out_scale, rows, cols, eps));                                                       \
        break;
        NORM_CASE(1)
        NORM_CASE(2)
        NORM_CASE(3)
        NORM_CASE(4)
        NORM_CASE(5)
        NORM_CASE(6)
        NORM_CASE(7)
        NORM_CASE(8)
#undef NORM_CASE
    default: // cols > 8192
        if (x)
            K_CHECK(k_launch(add_rmsnorm_fp8_kernel<true, 0>, rows, 256, 0, stream, residual, x, w, out, outq,
                             out_scale, rows, cols, eps));
        else
            K_CHECK(k_launch(add_rmsnorm_fp8_kernel<false, 0>, rows, 256, 0, stream, residual, x, w, out,
                             outq, out_scale, rows, cols, eps));
    }
    return 0;
}

extern "C" int k_silu_mul_fp8(const bf16 *gate_up, bf16 *out, uint8_t *outq, float *out_scale, int T, int F,
                              cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_silu_mul_fp8: bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(T >= 0 && F > 0 && F % QBLK == 0, "k_silu_mul_fp8: bad shape T %d F %d (F a multiple of 128)",
              T, F);
    if (T == 0)
        return 0;
    K_REQUIRE(gate_up && outq && out_scale, "k_silu_mul_fp8: NULL pointer");
    K_REQUIRE(aligned(gate_up, 16) && (!out || aligned(out, 16)) && aligned(outq, 8) && aligned(out_scale, 4),
              "k_silu_mul_fp8: misaligned pointer (gate_up and out 16 bytes, outq 8, out_scale 4)");
    K_CHECK(
        k_launch(silu_mul_fp8_kernel, unit_grid(T, F), 256, 0, stream, gate_up, out, outq, out_scale, T, F));
    return 0;
}
