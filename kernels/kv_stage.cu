// The fp8 KV cache staged as bf16 for a prefill step: the blocks the step's prefill sequences read,
// dequantized (code * scale, rounded to bf16 once) into a small bf16 pool in the cache's own block
// layout, so the bf16 prefill attention (tensor-map loads, wgmma) reads them through a remapped block
// table. Why: the fp8 prefill kernel converts its tiles in shared memory between the two products,
// which leaves it at less than half the bf16 kernel's rate; a copy of the
// blocks costs one pass over them per layer, a small fraction of the attention that reads each of them
// once per 128 query rows.
//
// Memory-bound: 16 codes (one 16-byte load; D % 16 == 0, so one row and one scale) to 16 bf16 (two
// 16-byte stores) per thread.
#include "kernels/e4m3x2.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"

namespace
{

constexpr int STAGE_THREADS = 256;

// e4m3 codes lo, hi (exact in fp32, kernels/e4m3x2.cuh) times s: the product rounds once to fp32, then
// once to bf16
__device__ __forceinline__ uint32_t dequant2(uint32_t v, float s)
{
    const float2 f = e4m3x2_to_float2(v);
    __nv_bfloat162 r = __floats2bfloat162_rn(f.x * s, f.y * s);
    return *reinterpret_cast<uint32_t *>(&r);
}

// grid (units of a block / STAGE_THREADS, n_blocks, K | V): staged block j = cache block blocks[j]
__global__ void __launch_bounds__(STAGE_THREADS)
    kv_stage_kernel(const uint8_t *__restrict__ kc, const uint8_t *__restrict__ vc,
                    const float *__restrict__ ks, const float *__restrict__ vs,
                    const int32_t *__restrict__ blocks, bf16 *__restrict__ ko, bf16 *__restrict__ vo,
                    int units, int D)
{
    pdl_enter(); // kernels/launch.cuh
    const int u = blockIdx.x * STAGE_THREADS + threadIdx.x;
    if (u >= units)
        return;
    const bool is_v = blockIdx.z != 0;
    const size_t per_block = (size_t)units * 16; // codes of one block (KVH * bs rows of D)
    const size_t src = (size_t)blocks[blockIdx.y] * per_block + (size_t)u * 16;
    // the cache rows the step's RoPE kernel may have just written: through L2 (kernels/launch.cuh)
    const uint4 w = ld_dep(reinterpret_cast<const uint4 *>((is_v ? vc : kc) + src));
    const float s = ld_dep((is_v ? vs : ks) + src / D);
    uint4 lo, hi;
    lo.x = dequant2(w.x, s), lo.y = dequant2(w.x >> 16, s), lo.z = dequant2(w.y, s),
    lo.w = dequant2(w.y >> 16, s);
    hi.x = dequant2(w.z, s), hi.y = dequant2(w.z >> 16, s), hi.z = dequant2(w.w, s),
    hi.w = dequant2(w.w >> 16, s);
    uint4 *dst =
        reinterpret_cast<uint4 *>((is_v ? vo : ko) + (size_t)blockIdx.y * per_block + (size_t)u * 16);
    dst[0] = lo;
    dst[1] = hi;
}

} // namespace

extern "C" int k_kv_stage_fp8(const uint8_t *k_cache, const uint8_t *v_cache, const float *k_scale,
                              const float *v_scale, const int32_t *blocks, int n_blocks, bf16 *k_out,
                              bf16 *v_out, int KVH, int D, int block_size, cudaStream_t stream)
{
    K_REQUIRE(!k_f16(), "k_kv_stage_fp8: stages to bf16 only (no fp8 path in fp16 mode)");
    K_REQUIRE(n_blocks >= 0 && n_blocks <= 65535, "k_kv_stage_fp8: %d blocks (0 .. 65535 per launch)",
              n_blocks);
    if (n_blocks == 0)
        return 0;
    K_REQUIRE(k_cache && v_cache && k_scale && v_scale && blocks && k_out && v_out,
              "k_kv_stage_fp8: NULL pointer");
    K_REQUIRE(KVH > 0 && block_size > 0 && D > 0 && D % 16 == 0,
              "k_kv_stage_fp8: KVH %d, D %d (a multiple of 16), block_size %d", KVH, D, block_size);
    K_REQUIRE(((uintptr_t)k_cache | (uintptr_t)v_cache | (uintptr_t)k_out | (uintptr_t)v_out) % 16 == 0 &&
                  ((uintptr_t)k_scale | (uintptr_t)v_scale) % 4 == 0,
              "k_kv_stage_fp8: caches and outputs must be 16-byte aligned, scales 4-byte");
    const long long units = (long long)KVH * block_size * D / 16;
    K_REQUIRE(units <= 0x7fffffff - STAGE_THREADS, "k_kv_stage_fp8: blocks of %lld codes too large",
              units * 16);
    dim3 grid((unsigned)((units + STAGE_THREADS - 1) / STAGE_THREADS), (unsigned)n_blocks, 2);
    K_CHECK(k_launch(kv_stage_kernel, grid, STAGE_THREADS, 0, stream, k_cache, v_cache, k_scale, v_scale,
                     blocks, k_out, v_out, (int)units, D));
    return 0;
}
