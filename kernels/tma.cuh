// Hopper's tensor memory accelerator (cp.async.bulk.tensor, sm_90a) and the shared-memory barriers
// (mbarrier) its copies complete on: one thread issues a tile's copies and announces their bytes;
// the readers wait on the barrier's phase; no thread spends registers or issue slots on addresses.
//
// A 2-D map (k_tma_map_rows) describes a row-major [rows][cols] bf16 array; a copy brings a box of
// box_rows x 64 columns (128 bytes a row) into shared memory in the 128-byte-swizzled layout of
// kernels/wgmma.cuh (the hardware applies the same XOR), so a box's destination must start on a
// 1024-byte boundary. Device functions compile to nothing outside sm_90a (K_WGMMA undefined);
// callers use them only where k_wgmma_on() says the device and the binary have them.
#pragma once
#include <cuda.h>
#include <stdint.h>

#include "kernels/wgmma.cuh"

// Fills *m for a [rows][cols] bf16 array at base (rows of row_bytes, a multiple of 16; base 16-byte
// aligned) read in boxes of box_rows x 64 columns, 128-byte swizzle; rows may be larger than what is
// allocated as long as no copy reaches past it. 0, or -1 with the error recorded (k_last_error).
int k_tma_map_rows(CUtensorMap *m, const void *base, uint64_t rows, int cols, size_t row_bytes, int box_rows);

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
#ifdef K_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival that also announces bytes more to come from copies completing on bar.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
#ifdef K_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
#endif
}

// Waits until the phase of parity `parity` of bar has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
#ifdef K_WGMMA
    // The retry loop is inside the asm: a C loop around try_wait made ptxas serialize the wgmmas of a
    // loop that waits on barriers (C7513).
    asm volatile("{\n .reg .pred p;\n"
                 "mbar_wait_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra mbar_wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#endif
}

// The box at (column col, row row) of map into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int col, int row,
                                            uint32_t bar)
{
#ifdef K_WGMMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
        : "memory");
#endif
}

// Announces bytes more to come from copies completing on bar, without an arrival.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
#ifdef K_WGMMA
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
#endif
}

// One arrival on bar (no bytes announced): a consumer saying it is done with what bar guards.
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
#ifdef K_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned) by the copy engine,
// completing on bar (the issuing thread announces them with mbar_arrive_expect_tx or mbar_expect_tx).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
#ifdef K_WGMMA
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
#endif
}

// Asks the memory system to bring bytes (a multiple of 16) at global src (16-byte aligned) into L2, with
// nothing to wait for.
__device__ __forceinline__ void bulk_prefetch_l2(const void *src, uint32_t bytes)
{
#ifdef K_WGMMA
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
