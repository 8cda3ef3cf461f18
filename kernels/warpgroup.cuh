// Warp specialization on Hopper (sm_90a): a CTA's warpgroups take different roles (one copies tiles,
// the others compute), move registers between them, and order their work with named barriers.
//
//   - setmaxnreg: a warpgroup gives registers back to the CTA's pool (dec) or takes them (inc, blocking
//     until the pool has them). ptxas honours it only where it knows the count at entry: the kernel
//     needs __launch_bounds__(threads, 1), which sets that count to 65536 / threads (rounded down to a
//     multiple of 8: 168 for 384 threads); the roles' counts must add up to no more (24 x 128 +
//     240 x 256 = 168 x 384).
//   - Named barriers 1..15 (0 is __syncthreads): bar.sync waits until n threads have arrived, counting
//     itself; bar.arrive counts itself and goes on. Two warpgroups take turns with two of them: each
//     waits on its own and arrives on the other's.
//
// Device functions compile to nothing outside sm_90a (K_WGMMA undefined); callers launch such a kernel
// only where k_wgmma_on() (kernels/launch.cuh) says the device and the binary have it.
#pragma once
#include <stdint.h>

#include "kernels/wgmma.cuh"

template <int N> __device__ __forceinline__ void wg_reg_dealloc()
{
#ifdef K_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> __device__ __forceinline__ void wg_reg_alloc()
{
#ifdef K_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Named barrier id (1..15) of n threads (a multiple of 32): wait for all n.
__device__ __forceinline__ void named_bar_sync(int id, int n)
{
#ifdef K_WGMMA
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
#endif
}
// Named barrier id of n threads: count this warp's threads and go on.
__device__ __forceinline__ void named_bar_arrive(int id, int n)
{
#ifdef K_WGMMA
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
#endif
}
