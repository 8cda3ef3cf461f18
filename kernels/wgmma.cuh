// Hopper's warpgroup matrix multiply (wgmma.mma_async, sm_90a) for kernels that keep A in registers
// and read B from shared memory in the 128-byte-swizzled layout.
//
// The products take E = bf16 or fp16 operands (kernels/elt16.cuh: .bf16.bf16 or .f16.f16 forms of the
// same instruction, operands and layouts alike), accumulating in f32.
//
// The shared-memory tile of B is made of 1024-byte swizzle atoms: 8 rows of 128 bytes (64 elements), the
// 16-byte chunk c of row r stored at chunk c ^ (r % 8) of that row (the hardware applies the XOR to
// the address bits, so every atom must start on a 1024-byte boundary). sw128_off() gives the byte
// offset of chunk c (0..15) of row r in a [2][rows][64] 16-bit tile (a rows x 128 matrix: the two
// 64-column halves one after the other, rows * 128 bytes each), the layout the attention operands use
// (Q as a K-major A operand likewise: rows are query rows):
//   - K-major B (S = Q K^T, B = K^T: n = key, k = head dim): rows are keys; a 16-k step at head-dim
//     column 16 s starts at half s / 4, byte 32 (s % 4) of the row; 8-row groups 1024 bytes apart
//     (stride byte offset); the leading byte offset is unused for swizzled K-major layouts.
//   - N-major B (O = P V, B = V: k = key, n = head dim; imm-trans-b = 1): rows are keys (k), 64 n per
//     atom row; the two n halves rows * 128 bytes apart (leading byte offset) and 8-key groups 1024
//     bytes apart (stride byte offset); a 16-key step starts 2048 bytes on.
//
// Register fragments (per warp w of the warpgroup, rows 16 w .. 16 w + 15, g = lane / 4, t = lane % 4)
// are those of mma.sync m16n8k16: A = {row g k 2t..2t+1, row g+8 k 2t.., row g k 2t+8.., row g+8
// k 2t+8..}; the f32 accumulator of an m64nN op is N / 8 blocks of {row g cols 2t, 2t+1; row g+8
// cols 2t, 2t+1}. So code written for mma.sync's fragments feeds wgmma unchanged.
//
// Every function compiles to nothing outside sm_90a (K_WGMMA undefined); callers launch a wgmma kernel
// only where k_wgmma_on() (kernels/launch.cuh) says the device and the binary have it.
#pragma once
#include <stdint.h>

#include "kernels/elt16.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define K_WGMMA 1
#endif

__device__ __forceinline__ uint32_t sw128_off(int r, int c, int rows = 64)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptor, 128-byte swizzle, base offset 0 (atoms 1024-byte aligned).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | (uint64_t)((lbo & 0x3ffffu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3ffffu) >> 4) << 32 | (uint64_t)1 << 62;
}

// The descriptor of the operand `bytes` further on than d's (a k step within a stage): the start
// address field is the low 14 bits of addr >> 4, and shared memory ends below 256 KB, so the sum stays
// in the field; a 32-bit add.
__device__ __forceinline__ uint64_t wg_desc_at(uint64_t d, uint32_t bytes)
{
    return (d & ~0xffffffffull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

// Orders this thread's register writes before the next wgmma reads them (accumulators, A).
__device__ __forceinline__ void wg_fence()
{
#ifdef K_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Generic-proxy shared-memory writes (st.shared, cp.async) before wgmma reads them: each writer
// fences, then a barrier.
__device__ __forceinline__ void wg_fence_smem()
{
#ifdef K_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Closes the wgmmas issued since the last commit into a group.
__device__ __forceinline__ void wg_commit()
{
#ifdef K_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups are pending (groups complete in order).
template <int N> __device__ __forceinline__ void wg_wait()
{
#ifdef K_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the A fragments of an issued wgmma in their registers until its wait (the tensor cores read
// them asynchronously; the compiler must not reuse the registers before then).
template <int N> __device__ __forceinline__ void wg_keep(const uint32_t (&a)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" ::"r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across the asynchronous
// region (they are written by the tensor cores between the issue and the wait).
template <int N> __device__ __forceinline__ void wg_hold(float (&d)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}

// The "+f" operand lists of an f32 accumulator d[N / 8][4] (N = 64: 32 registers, N = 128: 64).
#define WG_D4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WG_D32 WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5), WG_D4(6), WG_D4(7)
#define WG_D64 WG_D32, WG_D4(8), WG_D4(9), WG_D4(10), WG_D4(11), WG_D4(12), WG_D4(13), WG_D4(14), WG_D4(15)

// The wgmma opcode for E operands with an f32 accumulator, as a string literal (spliced into asm).
#define WG_OP_BF16(shape) "wgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 "
#define WG_OP_F16(shape) "wgmma.mma_async.sync.aligned." shape ".f32.f16.f16 "

// d (+)= A (64 x 16 E, registers) . B (16 x 64, K-major in shared memory); accumulate = 0 ignores d.
#define WG_M64N64K16_RS(OP)                                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n" OP                                             \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "         \
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"                                             \
                 : WG_D32                                                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(0), "r"(accumulate))
template <typename E>
__device__ __forceinline__ void wg_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                             int accumulate)
{
#ifdef K_WGMMA
    if constexpr (elt16<E>::f16)
        WG_M64N64K16_RS(WG_OP_F16("m64n64k16"));
    else
        WG_M64N64K16_RS(WG_OP_BF16("m64n64k16"));
#endif
}

// d (+)= A (64 x 16 E, K-major in shared memory) . B (16 x 128, K-major in shared memory).
#define WG_M64N128K16_SS(OP)                                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" OP                                             \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "          \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "         \
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                             \
                 : WG_D64                                                                                    \
                 : "l"(a), "l"(b), "r"(accumulate))
template <typename E>
__device__ __forceinline__ void wg_m64n128k16_ss(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate)
{
#ifdef K_WGMMA
    if constexpr (elt16<E>::f16)
        WG_M64N128K16_SS(WG_OP_F16("m64n128k16"));
    else
        WG_M64N128K16_SS(WG_OP_BF16("m64n128k16"));
#endif
}

// d += A (64 x 16 E, registers) . B (16 x 128, N-major in shared memory: imm-trans-b = 1).
#define WG_M64N128K16_NMAJOR(OP)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" OP                                               \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "          \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "         \
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                               \
                 : WG_D64                                                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
template <typename E>
__device__ __forceinline__ void wg_m64n128k16_nmajor(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b)
{
#ifdef K_WGMMA
    if constexpr (elt16<E>::f16)
        WG_M64N128K16_NMAJOR(WG_OP_F16("m64n128k16"));
    else
        WG_M64N128K16_NMAJOR(WG_OP_BF16("m64n128k16"));
#endif
}
