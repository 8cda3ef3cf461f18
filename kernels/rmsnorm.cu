// RMSNorm over the fp32 residual stream, optionally fused with the residual add:
//   k_rmsnorm:           out = E(residual * rsqrt(mean(residual^2) + eps) * w)
//   k_add_rmsnorm:       residual += x; then the same.
//   k_add_parts_rmsnorm: residual += E(parts[0] + ... + parts[ks - 1]) (a split-K GEMV's fp32 sums,
//                        added in part order and rounded to E as the GEMV's own last part would); then
//                        the same.
// x, w and out hold the 16-bit element type E (bf16 or fp16, kernels/elt16.cuh); the math is fp32.
// One block per row. Vector path (cols % 8 == 0, 16-byte aligned pointers): each thread owns R
// units of 8 columns, loads them once into registers (2 x float4 of residual, 16 bytes of x),
// writes the updated residual, and after a block reduction of the sum of squares writes 16 bytes of
// out per unit: every byte moves once. Scalar path otherwise: two passes over the row (the second
// re-reads the residual from L1/L2).
#include "kernels/elt16.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"

// ---- kernels

// Sum of v over the block; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? part[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

// What is added to the residual: nothing, x (E), or the parts (fp32, [ks][rows][cols], stride pstride).
enum { ADD_NONE, ADD_X, ADD_PARTS };

// The vector kernel's parts path takes at most this many parts and units a thread (all loads of a thread
// in flight at once, up to 255 registers: its blocks are at most 256 threads); the scalar kernel takes
// any number.
#define VEC_MAX_PARTS 4
#define VEC_MAX_PARTS_R 4

// grid (rows), block (threads, a multiple of 32, <= 512); unit u of the row = columns [8u, 8u + 8), thread
// tid owns units tid, tid + threads, ... (R of them, coalesced across the block).
template <typename E, int R, int ADD>
__global__ void __launch_bounds__(ADD == ADD_PARTS ? 256 : 512)
    rmsnorm_vec_kernel(float *__restrict__ residual, const E *__restrict__ x, const float *__restrict__ parts,
                       int ks, size_t pstride, const E *__restrict__ w, E *__restrict__ out, int cols,
                       float eps)
{
    const int n8 = cols / 8;
    const size_t row = (size_t)blockIdx.x * cols;
    float4 *res = (float4 *)(residual + row);
    const uint4 *xr = ADD == ADD_X ? (const uint4 *)(x + row) : nullptr;
    const uint4 *wr = (const uint4 *)w;
    uint4 *o = (uint4 *)(out + row);

    // the norm weights before the wait (kernels/launch.cuh): at decode they are off the latency chain
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int u = r * blockDim.x + threadIdx.x;
        wv[r] = u < n8 ? __ldg(wr + u) : make_uint4(0, 0, 0, 0);
    }
    pdl_enter_early(); // kernels/launch.cuh: the trigger first
    float v[R][8];
    uint4 xv[R];
    constexpr int PR = ADD == ADD_PARTS ? R : 1, PQ = ADD == ADD_PARTS ? VEC_MAX_PARTS : 1;
    float4 pv[PR][PQ][2]; // the parts of each unit (ks <= VEC_MAX_PARTS)
    // all loads first, so that R independent loads are in flight per thread
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int u = r * blockDim.x + threadIdx.x;
        if (u < n8) {
            const float4 a = ld_dep(res + 2 * u), b = ld_dep(res + 2 * u + 1);
            v[r][0] = a.x, v[r][1] = a.y, v[r][2] = a.z, v[r][3] = a.w;
            v[r][4] = b.x, v[r][5] = b.y, v[r][6] = b.z, v[r][7] = b.w;
            if constexpr (ADD == ADD_X)
                xv[r] = ld_dep(xr + u);
            if constexpr (ADD == ADD_PARTS) {
                const float4 *p = (const float4 *)(parts + row) + 2 * u;
#pragma unroll
                for (int q = 0; q < PQ; q++)
                    if (q < ks) {
                        pv[r][q][0] = __ldcg(p + q * (pstride / 4));
                        pv[r][q][1] = __ldcg(p + q * (pstride / 4) + 1);
                    }
            }
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int u = r * blockDim.x + threadIdx.x;
        if (u < n8) {
            if constexpr (ADD != ADD_NONE) {
                float xf[8];
                if constexpr (ADD == ADD_X) {
                    x8_to_float<E>(xv[r], xf);
                } else { // the parts in part order from 0, rounded to E: the GEMV's own sum and store
                    float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int q = 0; q < PQ; q++)
                        if (q < ks) {
                            const float4 lo = pv[r][q][0], hi = pv[r][q][1];
                            a[0] += lo.x, a[1] += lo.y, a[2] += lo.z, a[3] += lo.w;
                            a[4] += hi.x, a[5] += hi.y, a[6] += hi.z, a[7] += hi.w;
                        }
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        xf[i] = elt16<E>::to_f(elt16<E>::from_f(a[i]));
                }
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[r][i] += xf[i];
                res[2 * u] = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
                res[2 * u + 1] = make_float4(v[r][4], v[r][5], v[r][6], v[r][7]);
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                ss += v[r][i] * v[r][i];
        }
    }
    const float rr = rsqrtf(block_sum(ss) / (float)cols + eps);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int u = r * blockDim.x + threadIdx.x;
        if (u < n8) {
            float wf[8], y[8];
            x8_to_float<E>(wv[r], wf);
#pragma unroll
            for (int i = 0; i < 8; i++)
                y[i] = v[r][i] * rr * wf[i];
            o[u] = float_to_x8<E>(y);
        }
    }
}

// Any cols, any alignment: pass 1 adds (ADD) and sums squares, pass 2 re-reads and normalizes.
template <typename E, int ADD>
__global__ void __launch_bounds__(256)
    rmsnorm_scalar_kernel(float *__restrict__ residual, const E *__restrict__ x,
                          const float *__restrict__ parts, int ks, size_t pstride, const E *__restrict__ w,
                          E *__restrict__ out, int cols, float eps)
{
    pdl_enter_early(); // kernels/launch.cuh: the trigger first
    const size_t row = (size_t)blockIdx.x * cols;
    float *res = residual + row;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = ld_dep(res + i);
        if (ADD == ADD_X)
            v += elt16<E>::to_f(ld_dep(x + row + i));
        if (ADD == ADD_PARTS) {
            float s = 0.f;
            for (int q = 0; q < ks; q++)
                s += __ldcg(parts + q * pstride + row + i);
            v += elt16<E>::to_f(elt16<E>::from_f(s));
        }
        if (ADD != ADD_NONE)
            res[i] = v;
        ss += v * v;
    }
    const float rr = rsqrtf(block_sum(ss) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[row + i] = elt16<E>::from_f(ld_dep(res + i) * rr * elt16<E>::to_f(w[i]));
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

template <typename E, int ADD>
static int rmsnorm_launch(float *residual, const bf16 *x16, const float *parts, int ks, const bf16 *w16,
                          bf16 *out16, int rows, int cols, float eps, cudaStream_t stream)
{
    const char *name = ADD == ADD_PARTS ? "k_add_parts_rmsnorm"
                       : ADD == ADD_X   ? "k_add_rmsnorm"
                                        : "k_rmsnorm";
    const E *x = (const E *)x16, *w = (const E *)w16;
    E *out = (E *)out16;
    K_REQUIRE(rows >= 0 && cols > 0, "%s: bad shape rows %d cols %d", name, rows, cols);
    if (rows == 0)
        return 0;
    K_REQUIRE(ADD != ADD_PARTS || (ks >= 1 && ks <= K_GEMV_MAX_SPLIT), "%s: %d parts (1..%d)", name, ks,
              K_GEMV_MAX_SPLIT);
    K_REQUIRE(residual && w && out && (ADD != ADD_X || x) && (ADD != ADD_PARTS || parts), "%s: NULL pointer",
              name);
    K_REQUIRE(!(eps < 0), "%s: eps %g < 0", name, (double)eps);
    const size_t pstride = (size_t)rows * cols;

    const bool vec = cols % 8 == 0 && aligned16(residual) && aligned16(w) && aligned16(out) &&
                     (ADD != ADD_X || aligned16(x)) &&
                     (ADD != ADD_PARTS || (aligned16(parts) && ks <= VEC_MAX_PARTS));
    const int n8 = cols / 8;
    int R = 0, threads = 0;
    if (vec) {
        // the fewest units per thread that keeps the block at <= 256 threads; wider blocks (up to
        // 512, 128 registers a thread: no spills at R = 8) only for rows over 16384 columns. The parts
        // path lays a row out the same way (so its block sum adds in the same order and its output is
        // k_add_rmsnorm's bit for bit) where it can hold a thread's parts: R <= VEC_MAX_PARTS_R.
        for (int r = 1; r <= 8 && !R; r *= 2) {
            int t = ((n8 + r - 1) / r + 31) / 32 * 32;
            if (t <= 256 || (r == 8 && t <= 512))
                R = r, threads = t;
        }
        if (ADD == ADD_PARTS && R > VEC_MAX_PARTS_R)
            R = 0;
    }
#define RMS_VEC(RR)                                                                                          \
    K_CHECK(k_launch(rmsnorm_vec_kernel<E, RR, ADD>, rows, threads, 0, stream, residual, x, parts, ks,       \
                     pstride, w, out, cols, eps))
    if (R == 1) {
        RMS_VEC(1);
    } else if (R == 2) {
        RMS_VEC(2);
    } else if (R == 4) {
        RMS_VEC(4);
    } else if (R == 8) {
        if constexpr (ADD != ADD_PARTS) // (R <= VEC_MAX_PARTS_R there)
            RMS_VEC(8);
    } else {
        threads = cols >= 256 ? 256 : (cols + 31) / 32 * 32;
        K_CHECK(k_launch(rmsnorm_scalar_kernel<E, ADD>, rows, threads, 0, stream, residual, x, parts, ks,
                         pstride, w, out, cols, eps));
    }
#undef RMS_VEC
    return 0;
}

extern "C" int k_rmsnorm(const float *residual, const bf16 *w, bf16 *out, int rows, int cols, float eps,
                         cudaStream_t stream)
{
    // the non-ADD kernels never write the residual
    return k_f16() ? rmsnorm_launch<__half, ADD_NONE>((float *)residual, nullptr, nullptr, 0, w, out, rows,
                                                      cols, eps, stream)
                   : rmsnorm_launch<bf16, ADD_NONE>((float *)residual, nullptr, nullptr, 0, w, out, rows,
                                                    cols, eps, stream);
}

extern "C" int k_add_rmsnorm(float *residual, const bf16 *x, const bf16 *w, bf16 *out, int rows, int cols,
                             float eps, cudaStream_t stream)
{
    return k_f16() ? rmsnorm_launch<__half, ADD_X>(residual, x, nullptr, 0, w, out, rows, cols, eps, stream)
                   : rmsnorm_launch<bf16, ADD_X>(residual, x, nullptr, 0, w, out, rows, cols, eps, stream);
}

extern "C" int k_add_parts_rmsnorm(float *residual, const float *parts, int ks, const bf16 *w, bf16 *out,
                                   int rows, int cols, float eps, cudaStream_t stream)
{
    return k_f16() ? rmsnorm_launch<__half, ADD_PARTS>(residual, nullptr, parts, ks, w, out, rows, cols, eps,
                                                       stream)
                   : rmsnorm_launch<bf16, ADD_PARTS>(residual, nullptr, parts, ks, w, out, rows, cols, eps,
                                                     stream);
}
