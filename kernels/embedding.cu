// Embedding gather: out[t, :] = table[ids[t], :]; an id outside [0, vocab) gives a row of zeros.
// Memory-bound copy: one block per token, 16-byte loads (8 bf16) when hidden % 8 == 0 and the
// pointers are 16-byte aligned, one element per thread otherwise.
#include "kernels/kernels.h"
#include "kernels/launch.cuh"

// ---- kernels

template <typename T> __device__ __forceinline__ void store8(T *dst, uint4 v);
template <> __device__ __forceinline__ void store8<bf16>(bf16 *dst, uint4 v)
{
    *(uint4 *)dst = v;
}
template <> __device__ __forceinline__ void store8<float>(float *dst, uint4 v)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
    ((float4 *)dst)[0] = make_float4(a.x, a.y, b.x, b.y);
    ((float4 *)dst)[1] = make_float4(c.x, c.y, d.x, d.y);
}

template <typename T> __device__ __forceinline__ T from_bf16(bf16 v);
template <> __device__ __forceinline__ bf16 from_bf16<bf16>(bf16 v)
{
    return v;
}
template <> __device__ __forceinline__ float from_bf16<float>(bf16 v)
{
    return __bfloat162float(v);
}

// grid (n_tokens), block (threads): row t, 8 elements per step
template <typename T>
__global__ void embedding_vec_kernel(const int32_t *ids, const bf16 *table, int vocab, int hidden, T *out)
{
    pdl_enter(); // kernels/launch.cuh
    const int t = blockIdx.x;
    const int id = ids[t];
    const int n8 = hidden / 8;
    T *dst = out + (size_t)t * hidden;
    if (id < 0 || id >= vocab) {
        for (int i = threadIdx.x; i < n8; i += blockDim.x)
            store8<T>(dst + (size_t)i * 8, make_uint4(0, 0, 0, 0));
        return;
    }
    const uint4 *src = (const uint4 *)(table + (size_t)id * hidden);
    for (int i = threadIdx.x; i < n8; i += blockDim.x)
        store8<T>(dst + (size_t)i * 8, __ldg(src + i));
}

template <typename T>
__global__ void embedding_scalar_kernel(const int32_t *ids, const bf16 *table, int vocab, int hidden, T *out)
{
    pdl_enter(); // kernels/launch.cuh
    const int t = blockIdx.x;
    const int id = ids[t];
    T *dst = out + (size_t)t * hidden;
    const bool ok = id >= 0 && id < vocab;
    const bf16 *src = table + (ok ? (size_t)id * hidden : 0);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        dst[i] = ok ? from_bf16<T>(src[i]) : from_bf16<T>(__float2bfloat16(0.f));
}

// ---- launchers

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

template <typename T>
static int embedding_launch(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden,
                            T *out, cudaStream_t stream)
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
            k_launch(embedding_vec_kernel<T>, n_tokens, threads, 0, stream, ids, table, vocab, hidden, out));
    } else {
        int threads = hidden >= 256 ? 256 : (hidden + 31) / 32 * 32;
        K_CHECK(k_launch(embedding_scalar_kernel<T>, n_tokens, threads, 0, stream, ids, table, vocab, hidden,
                         out));
    }
    return 0;
}

extern "C" int k_embedding(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden,
                           bf16 *out, cudaStream_t stream)
{
    return embedding_launch<bf16>(ids, n_tokens, table, vocab, hidden, out, stream);
}

extern "C" int k_embedding_f32(const int32_t *ids, int n_tokens, const bf16 *table, int vocab, int hidden,
                               float *out, cudaStream_t stream)
{
    return embedding_launch<float>(ids, n_tokens, table, vocab, hidden, out, stream);
}
