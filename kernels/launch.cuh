// Kernel launches for the per-step kernels: programmatic dependent launch (PDL), a Hopper (sm_90)
// feature. Included by kernels/*.cu (and contrib/lab/handoff_probe for pdl_wait / pdl_launch_dependents).
//
// PDL. A kernel launched with k_launch may start while the kernel before it on the stream is still
// running: its CTAs become resident as soon as every CTA of that kernel has called
// pdl_launch_dependents() (or exited) and there is room on an SM, run whatever does not depend on
// it (the GEMV loads its first weights, see kernels/gemv.cu), and block in pdl_wait() until it has
// completed and its writes are visible. What this buys is the gap between two
// dependent kernels — launch, CTA rasterization and the ramp of the first loads — which at decode (T = 1) is
// most of a small kernel's time: a token of Qwen3-14B is ~450 kernels of 3–50 µs. It is captured into CUDA
// graphs as programmatic edges.
//
// The rule every kernel launched this way keeps (a kernel that breaks it can let a later kernel
// read data that is not written yet):
//   - every CTA calls pdl_wait() before it reads anything an earlier kernel wrote, before it writes
//     anything, and before any early return: a kernel's completion must imply its predecessor's,
//     so that waiting on one kernel transitively waits on all before it;
//   - what runs before pdl_wait() reads only data no kernel of the step writes: weights, and the
//     step's inputs the host uploaded before it (positions, slots, context lengths, block tables).
//   - what it reads after pdl_wait() that an earlier kernel of the step wrote, it reads with ld_dep()
//     (ld.global.ca: an ordinary load, which the wait's visibility guarantee covers), never through the
//     non-coherent read-only path (__ldg, or a plain load from a const __restrict__ pointer, which nvcc
//     compiles to ld.global.nc, defined only for data that no one writes while the kernel runs, and
//     under PDL the kernel runs while the one before writes: the norms reading the residual and the
//     o_proj output that way made Qwen3-14B's decode steps differ from run to run). CI checks it:
//     tests/tools/pdl_reads (tests/cli/test_pdl_reads.sh) lists each kernel's ld.global.nc reads after the
//     wait and fails on a parameter tests/tools/pdl_reads/allowed.txt does not allow.
// pdl_wait() and pdl_launch_dependents() are no-ops in a kernel launched without the attribute
// (kernel tests, cc < 9.0) and compile to nothing below sm_90.
//
// LLMQ_PDL=0 in the environment turns the attribute off (for A/B measurements and as an escape
// hatch). LLMQ_PDL_SKIP=name[,name...] (for finding a kernel that breaks the rule) launches the kernels
// whose (mangled) names contain one of the names without it. Both are diagnostics (kernels/diagnostics.cu).
#pragma once
#include <cuda_runtime.h>
#include <utility>

#include "kernels/kernels.h"

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A load of what an earlier kernel of the step wrote, after pdl_wait() (the rule above): ld.global.ca,
// cached in L1 like __ldg but coherent with the wait. Not ld.global.cg (L2 only), which is as right but
// takes the GEMV's re-reads of X out of L1, which costs a one-sequence decode step a quarter of its speed.
template <typename T> __device__ __forceinline__ T ld_dep(const T *p)
{
    return __ldca(p);
}

// The wait and the trigger together (most kernels): the trigger comes after the wait, so at most one
// kernel waits ahead of the running one.
__device__ __forceinline__ void pdl_enter()
{
    pdl_wait();
    pdl_launch_dependents();
}

// The trigger first, then the wait: for the kernels that follow a one-wave GEMV at decode, RMSNorm
// (after down and o_proj, before QKV and gate/up) and q/k norm + RoPE (after QKV, before attention).
// The next kernel's CTAs become resident during the GEMV before, in the SM space that one-wave GEMV
// leaves free, and issue what they can before their own wait (the GEMV its first weights, the
// attention its K/V tiles). Only these two: other kernels triggering first made one-sequence decode
// slower (the CTAs of a GEMV launched early wait on the SM space the multi-wave gate/up still needs).
__device__ __forceinline__ void pdl_enter_early()
{
    pdl_launch_dependents();
    pdl_wait();
}

// Whether k_launch asks for PDL: compute capability >= 9.0 and LLMQ_PDL is not "0" (decided once per
// process).
bool k_pdl_on(void);

// Whether LLMQ_PDL_SKIP names kern (false at once when it is not set).
bool k_pdl_skip(const void *kern);

// SMs of the current device (132 on the H200), cached per device; 132 if it cannot be read.
int k_sm_count(void);

// Whether the current device runs this binary's sm_90a code (wgmma): compute capability 9.0 and a
// build for 90a (LLMQ_HAVE_SM90A). Decided on first use.
bool k_wgmma_on(void);

// kern<<<grid, block, smem, stream>>>(args...), with the PDL attribute when k_pdl_on().
template <typename... P, typename... A>
static inline cudaError_t k_launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t stream, A &&...args)
{
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    const bool pdl = k_pdl_on() && !k_pdl_skip((const void *)kern);
    cfg.attrs = pdl ? &at : NULL;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);
}
