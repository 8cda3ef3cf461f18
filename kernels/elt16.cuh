// The two 16-bit float types the kernels compute in (kernels.h, "the 16-bit element type"): bf16,
// the default, and IEEE fp16 (model.dtype fp16). A kernel that reads or writes 16-bit tensors is a
// template over E (bf16 or __half) and uses these helpers for every conversion and product, so the
// two instantiations differ only in the type; its launcher picks one with k_f16(). fp32 <-> E
// conversions round to nearest even; fp16 overflows to infinity and keeps subnormals (the CPU
// oracle's f32_to_f16, engine/dtype.h). Included by kernels/*.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/kernels.h"

template <typename E> struct elt16;

template <> struct elt16<__nv_bfloat16> {
    typedef __nv_bfloat162 E2;
    static constexpr bool f16 = false;
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ float2 to_f2(E2 x) { return __bfloat1622float2(x); }
    static __device__ __forceinline__ E2 from_f2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
};

template <> struct elt16<__half> {
    typedef __half2 E2;
    static constexpr bool f16 = true;
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float2 to_f2(E2 x) { return __half22float2(x); }
    static __device__ __forceinline__ E2 from_f2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};

// Two values as one 32-bit register (lo in the low half), rounded to nearest even: an mma operand.
template <typename E> __device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    typename elt16<E>::E2 v = elt16<E>::from_f2(lo, hi);
    return *(uint32_t *)&v;
}

// The pair in a 32-bit register (lo in the low half) to fp32, exactly.
template <typename E> __device__ __forceinline__ float2 unpack2(uint32_t u)
{
    return elt16<E>::to_f2(*(typename elt16<E>::E2 *)&u);
}

// Eight values in one 16-byte vector to and from fp32 (exact; round to nearest even), memory order kept.
template <typename E> __device__ __forceinline__ void x8_to_float(uint4 u, float *f)
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 p = unpack2<E>(w[i]);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}

template <typename E> __device__ __forceinline__ uint4 float_to_x8(const float *f)
{
    /* the same values either way; each type keeps the form whose machine code was checked on the GPU
       (they schedule the decode attention's RoPE stores differently) */
    if constexpr (elt16<E>::f16) {
        return make_uint4(pack2<E>(f[0], f[1]), pack2<E>(f[2], f[3]), pack2<E>(f[4], f[5]),
                          pack2<E>(f[6], f[7]));
    } else {
        uint4 u;
        typename elt16<E>::E2 *h = (typename elt16<E>::E2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++)
            h[i] = elt16<E>::from_f2(f[2 * i], f[2 * i + 1]);
        return u;
    }
}

// d += A (16x16, row) . B (16x8, col), E in, fp32 accumulate (mma.sync m16n8k16, sm_80+).
template <typename E>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1)
{
    if constexpr (elt16<E>::f16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A launcher's pick: F(bf16 or __half) by the calling thread's k_f16(), e.g.
//   return K_ELT16(launch, args...);  with  template <typename E> int launch(args...)
#define K_ELT16(F, ...) (k_f16() ? F<__half>(__VA_ARGS__) : F<__nv_bfloat16>(__VA_ARGS__))
