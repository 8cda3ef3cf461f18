// The pieces of the decode GEMVs (kernels/gemv.cu) and the attention kernels: the weight stream's 16-byte
// load, one m16n8k16 bf16 mma, the f16 one, and the exact e4m3 -> bf16 decode of four weight bytes whose
// lane mapping kernels/gemv.cu explains at its top; and the permutation of 16 bf16 X values into the pairs
// that decode yields. Included by kernels/*.cu only.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// Weight stream: read-only, used once (skip L1 allocation).
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// d += A (16x16, row) . B (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += A (16x16, row) . B (16x8, col), f16 in, fp32 accumulate; a[] in the order of mma_bf16's a0..a3.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v)
{
    return *(uint32_t *)&v;
}
__device__ __forceinline__ __nv_bfloat162 bits_bf162(uint32_t u)
{
    return *(__nv_bfloat162 *)&u;
}

// Four e4m3 bytes b0..b3 of q -> lo = bf16x2 (b0, b2), hi = bf16x2 (b1, b3), exact. e4m3 NaN
// (0x7f, 0xff) decodes as +-480 (checkpoints have none).
__device__ __forceinline__ void e4m3x4_to_bf16(uint32_t q, uint32_t &lo, uint32_t &hi)
{
    const uint32_t h = (q & 0x80008000u) | ((q >> 4) & 0x07f007f0u);
    const uint32_t l = ((q << 8) & 0x80008000u) | ((q << 4) & 0x07f007f0u);
    const __nv_bfloat162 two120 = bits_bf162(0x7b807b80u); // 2^120 in both halves
    lo = bf162_bits(__hmul2(bits_bf162(l), two120));
    hi = bf162_bits(__hmul2(bits_bf162(h), two120));
}

// X words 2j, 2j+1 of a lane's 16 k (xv0 = k 0..7, xv1 = k 8..15) hold x[4j .. 4j+3]; the decode
// above pairs bytes (0, 2) and (1, 3), so the B operands of the four mmas of those 16 k are
// xb0[j] = (x[4j], x[4j+2]) and xb1[j] = (x[4j+1], x[4j+3]).
__device__ __forceinline__ void x_pairs16(const uint4 &xv0, const uint4 &xv1, uint32_t (&xb0)[4],
                                          uint32_t (&xb1)[4])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 &xs = j < 2 ? xv0 : xv1;
        const uint32_t w0 = (j & 1) ? xs.z : xs.x, w1 = (j & 1) ? xs.w : xs.y;
        xb0[j] = __byte_perm(w0, w1, 0x5410);
        xb1[j] = __byte_perm(w0, w1, 0x7632);
    }
}
