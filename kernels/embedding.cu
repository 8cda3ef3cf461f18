// Embedding gather into the fp32 residual stream: out[t, :] = table[ids[t], :] widened exactly; an id
// outside [0, vocab) gives a row of zeros. The table holds the 16-bit element type (bf16 or fp16,
// kernels/elt16.cuh). Memory-bound copy: one block per token, 16-byte loads (8 elements) when
// hidden % 8 == 0 and the pointers are 16-byte aligned, one element per thread otherwise.
#include "kernels/elt16.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"

// ---- kernels

// 8 table elements (E) to 8 fp32 outputs (exact widening)
template <typename E> __device__ __forceinline__ void store8(float *dst, uint4 v)
{
    float f[8];
    x8_to_float<E>(v, f);
    ((float4 *)dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// grid (n_tokens), block (threads): row t, 8 elements per step
template <typename E>
__global__ void embedding_vec_kernel(const int32_t *ids, const E *table, int vocab, int hidden, float *out)
{
    pdl_enter(); // kernels/launch.cuh
    const int t = blockIdx.x;
    const int id = ids[t];
    const int n8 = hidden / 8;
    float *dst = out + (size_t)t * hidden;
    if (id < 0 || id >= vocab) {
        for (int i = threadIdx.x; i < n8; i += blockDim.x)
            store8<E>(dst + (size_t)i * 8, make_uint4(0, 0, 0, 0));
        return;
    }
    const uint4 *src = (const uint4 *)(table + (size_t)id * hidden);
    for (int i = threadIdx.x; i < n8; i += blockDim.x)
        store8<E>(dst + (size_t)i * 8, __ldg(src + i));
}

template <typename E>
__global__ void embedding_scalar_kernel(const int32_t *ids, const E *table, int vocab, int hidden, float *out)
{
    pdl_enter(); // kernels/launch.cuh
    const int t = blockIdx.x;
    const int id = ids[t];
    float *dst = out + (size_t)t * hidden;
    const bool ok = id >= 0 && id < vocab;
    const E *src = table + (ok ? (size_t)id * hidden : 0);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        dst[i] = ok ? elt16<E>::to_f(src[i]) : elt16<E>::to_f(elt16<E>::from_f(0.f));
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

template <typename E>
static int embedding_launch(const int32_t *ids, int n_tokens, const E *table, int vocab, int hidden,
                            float *out, cudaStream_t stream)
{
    K_REQUIRE(n_tokens >= 0 && vocab > 0 && hidden > 0, "embedding: bad shape n_tokens %d vocab %d hidden %d",
              n_tokens, vocab, hidden);
    if (n_tokens == 0)
        return 0;
    K_REQUIRE(ids && table && out, "embedding: NULL pointer (ids %p table %p out %p)", (const void *)ids,
              (const void *)table, (void *)out);
    if (hidden % 8 == 0 && aligned16(table) && aligned16(out)) {
        int n8 = hidden / 8;
        int threads = n8 >= 256 ? 256 : (n8 + 31) / 32 * 32;
        K_CHECK(
            k_launch(embedding_vec_kernel<E>, n_tokens, threads, 0, stream, ids, table, vocab, hidden, out));
    } else {
        int threads = hidden >= 256 ? 256 : (hidden + 31) / 32 * 32;
        K_CHECK(k_launch(embedding_scalar_kernel<E>, n_tokens, threads, 0, stream, ids, table, vocab, hidden,
                         out));
    }
    return 0;
}

extern "C" int k_embedding_f32(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden,
                               float *out, cudaStream_t stream)
{
    if (k_f16())
        return embedding_launch<__half>(ids, n_tokens, (const __half *)table, vocab, hidden, out, stream);
    return embedding_launch<bf16>(ids, n_tokens, table, vocab, hidden, out, stream);
}
