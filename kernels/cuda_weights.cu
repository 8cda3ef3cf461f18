// Weights to the device (see cuda_backend.cuh): every tensor in bf16 in one allocation, q/k/v fused
// into one (H + 2 KVH) D x C matrix and gate/up into one 2F x C matrix (biases likewise), a tied
// lm_head sharing the embedding. Sources: BF16 is copied as is; F32 and F16 are converted on the
// device in chunks; F8_E4M3 (with or without block scales) is dequantized on the host by
// tensor_to_f32 and then takes the F32 path. A view with data == NULL and a name is a random weight
// (engine/random_model.h) and is filled on the device by the same rule the host uses.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda_backend.cuh"

extern "C" {
#include "engine/log.h"
#include "engine/random_model.h"
}

#define STAGE_BYTES ((size_t)64 << 20) // device staging for converted tensors

// ---- kernels

__device__ __forceinline__ uint64_t splitmix64_d(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// random_model_value, operation for operation (no contraction: explicit _rn intrinsics)
__global__ void fill_random_kernel(bf16 *dst, size_t n, uint64_t seed, float amp, float base)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = splitmix64_d(seed + i);
        float u = (float)(uint32_t)(h >> 40) * (1.0f / 16777216.0f);
        float x = __fsub_rn(__fmul_rn(2.0f, u), 1.0f);
        dst[i] = __float2bfloat16_rn(__fadd_rn(base, __fmul_rn(amp, x)));
    }
}

__global__ void f32_to_bf16_kernel(const float *src, bf16 *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void f16_to_bf16_kernel(const __half *src, bf16 *dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(__half2float(src[i]));
}

static unsigned grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 8192 ? (g ? g : 1) : 8192);
}

// ---- loading

struct loader {
    struct cuda_backend *b;
    char *stage;                        // device staging (STAGE_BYTES)
    size_t uploaded, random, converted; // bytes of bf16 written by each path
};

static const char *tname(const struct tensor_view *t, const char *what, int layer, char *buf, size_t n)
{
    if (t->name)
        return t->name;
    if (layer >= 0)
        snprintf(buf, n, "layer %d %s", layer, what);
    else
        snprintf(buf, n, "%s", what);
    return buf;
}

// Converts n fp32 (host) into dst through the staging buffer.
static int put_f32(struct loader *ld, const float *src, bf16 *dst, size_t n)
{
    struct cuda_backend *b = ld->b;
    const size_t chunk = STAGE_BYTES / sizeof(float);
    for (size_t o = 0; o < n; o += chunk) {
        size_t k = n - o < chunk ? n - o : chunk;
        CB_CUDA(cudaMemcpyAsync(ld->stage, src + o, k * sizeof(float), cudaMemcpyHostToDevice, b->stream));
        f32_to_bf16_kernel<<<grid_for(k), 256, 0, b->stream>>>((const float *)ld->stage, dst + o, k);
        CB_CUDA(cudaGetLastError());
    }
    return 0;
}

// One tensor of the expected shape (d1 == 0: a vector) into dst (bf16, numel elements).
static int put(struct loader *ld, const struct tensor_view *t, const char *what, int layer, int64_t d0,
               int64_t d1, bf16 *dst)
{
    struct cuda_backend *b = ld->b;
    char nb[128];
    const char *name = tname(t, what, layer, nb, sizeof nb);
    bool ok =
        d1 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1) : (t->ndim == 1 && t->shape[0] == d0);
    if (!ok) {
        char got[96] = "";
        size_t o = 0;
        for (int i = 0; i < t->ndim && i < 4 && o < sizeof got; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (d1)
            snprintf(b->base.err, sizeof b->base.err, "%s: shape [%s], expected [%lld, %lld]", name, got,
                     (long long)d0, (long long)d1);
        else
            snprintf(b->base.err, sizeof b->base.err, "%s: shape [%s], expected [%lld]", name, got,
                     (long long)d0);
        return -1;
    }
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    if (!t->data) {
        if (!t->name) {
            snprintf(b->base.err, sizeof b->base.err, "%s: missing", name);
            return -1;
        }
        struct random_fill r = random_model_fill(t->name);
        fill_random_kernel<<<grid_for(n), 256, 0, b->stream>>>(dst, n, r.seed, r.amp, r.base);
        CB_CUDA(cudaGetLastError());
        ld->random += n * 2;
        return 0;
    }
    switch (t->dtype) {
    case DT_BF16:
        CB_CUDA(cudaMemcpyAsync(dst, t->data, n * sizeof(bf16), cudaMemcpyHostToDevice, b->stream));
        ld->uploaded += n * 2;
        return 0;
    case DT_F32:
        ld->converted += n * 2;
        return put_f32(ld, (const float *)t->data, dst, n);
    case DT_F16: {
        const size_t chunk = STAGE_BYTES / 2;
        const uint16_t *src = (const uint16_t *)t->data;
        for (size_t o = 0; o < n; o += chunk) {
            size_t k = n - o < chunk ? n - o : chunk;
            CB_CUDA(cudaMemcpyAsync(ld->stage, src + o, k * 2, cudaMemcpyHostToDevice, b->stream));
            f16_to_bf16_kernel<<<grid_for(k), 256, 0, b->stream>>>((const __half *)ld->stage, dst + o, k);
            CB_CUDA(cudaGetLastError());
        }
        ld->converted += n * 2;
        return 0;
    }
    default: { // F8_E4M3 (block scales or not): dequantize on the host
        float *f = (float *)malloc(n * sizeof(float));
        if (!f) {
            snprintf(b->base.err, sizeof b->base.err, "%s: out of host memory for %.1f MiB of fp32", name,
                     (double)n * 4 / (1 << 20));
            return -1;
        }
        char e2[256];
        if (tensor_to_f32(t, f, e2, sizeof e2)) {
            snprintf(b->base.err, sizeof b->base.err, "%s: %s", name, e2);
            free(f);
            return -1;
        }
        int rc = put_f32(ld, f, dst, n);
        // the staging copy must finish before f goes away
        if (rc == 0 && cudaStreamSynchronize(b->stream) != cudaSuccess)
            rc = cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize", cudaGetLastError());
        free(f);
        ld->converted += n * 2;
        return rc;
    }
    }
}

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

int cb_load_weights(struct cuda_backend *b, const struct model *m)
{
    const struct model_config *c = &b->cfg;
    const size_t C = b->C, F = b->F, D = b->D, V = b->V, QKV = b->QKV, HD = b->HD, KVD = b->KVD;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    // the size table: offsets of every tensor in one allocation (elements, 256-byte aligned)
    size_t layer_bytes = align256(C * 2) + align256(QKV * C * 2) + (c->qkv_bias ? align256(QKV * 2) : 0) +
                         (c->qk_norm ? 2 * align256(D * 2) : 0) + align256(C * HD * 2) + align256(C * 2) +
                         align256(2 * F * C * 2) + align256(C * F * 2);
    size_t total = align256(V * C * 2) * (c->tie_embeddings ? 1 : 2) + align256(C * 2) + layer_bytes * b->L;
    if (cb_malloc(b, &b->wbuf, total, "weights"))
        return -1;
    b->wbytes = total;
    b->layers = (struct cb_layer *)calloc((size_t)b->L, sizeof *b->layers);
    if (!b->layers) {
        snprintf(b->base.err, sizeof b->base.err, "out of host memory");
        return -1;
    }
    struct loader ld = {b, NULL, 0, 0, 0};
    if (cb_malloc(b, (void **)&ld.stage, STAGE_BYTES, "weight staging")) // freed when loading is done
        return -1;

    char *p = (char *)b->wbuf;
#define TAKE(dst, elems)                                                                                     \
    do {                                                                                                     \
        (dst) = (bf16 *)p;                                                                                   \
        p += align256((size_t)(elems)*2);                                                                    \
    } while (0)
    bf16 *w;
    int rc = -1;
    TAKE(w, V * C);
    if (put(&ld, &m->embed, "embed_tokens", -1, V, C, w))
        goto out;
    b->embed = w;
    if (c->tie_embeddings) {
        b->lm_head = b->embed;
    } else {
        TAKE(w, V * C);
        if (put(&ld, &m->lm_head, "lm_head", -1, V, C, w))
            goto out;
        b->lm_head = w;
    }
    TAKE(w, C);
    if (put(&ld, &m->final_norm, "norm", -1, C, 0, w))
        goto out;
    b->final_norm = w;
    for (int l = 0; l < b->L; l++) {
        const struct layer_weights *lw = &m->layers[l];
        struct cb_layer *cl = &b->layers[l];
        TAKE(w, C);
        if (put(&ld, &lw->attn_norm, "input_layernorm", l, C, 0, w))
            goto out;
        cl->attn_norm = w;
        TAKE(w, QKV * C);
        if (put(&ld, &lw->wq, "q_proj", l, HD, C, w) || put(&ld, &lw->wk, "k_proj", l, KVD, C, w + HD * C) ||
            put(&ld, &lw->wv, "v_proj", l, KVD, C, w + (HD + KVD) * C))
            goto out;
        cl->wqkv = w;
        if (c->qkv_bias) {
            TAKE(w, QKV);
            if (put(&ld, &lw->bq, "q_proj.bias", l, HD, 0, w) ||
                put(&ld, &lw->bk, "k_proj.bias", l, KVD, 0, w + HD) ||
                put(&ld, &lw->bv, "v_proj.bias", l, KVD, 0, w + HD + KVD))
                goto out;
            cl->bqkv = w;
        }
        if (c->qk_norm) {
            TAKE(w, D);
            if (put(&ld, &lw->q_norm, "q_norm", l, D, 0, w))
                goto out;
            cl->q_norm = w;
            TAKE(w, D);
            if (put(&ld, &lw->k_norm, "k_norm", l, D, 0, w))
                goto out;
            cl->k_norm = w;
        }
        TAKE(w, C * HD);
        if (put(&ld, &lw->wo, "o_proj", l, C, HD, w))
            goto out;
        cl->wo = w;
        TAKE(w, C);
        if (put(&ld, &lw->mlp_norm, "post_attention_layernorm", l, C, 0, w))
            goto out;
        cl->mlp_norm = w;
        TAKE(w, 2 * F * C);
        if (put(&ld, &lw->w_gate, "gate_proj", l, F, C, w) ||
            put(&ld, &lw->w_up, "up_proj", l, F, C, w + F * C))
            goto out;
        cl->wgu = w;
        TAKE(w, C * F);
        if (put(&ld, &lw->w_down, "down_proj", l, C, F, w))
            goto out;
        cl->wdown = w;
    }
#undef TAKE
    if (cudaStreamSynchronize(b->stream) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize(weights)", cudaGetLastError());
        goto out;
    }
    rc = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    log_info(
        "cuda backend: weights %.2f GB bf16 in %.1f s (%.2f GB copied, %.2f GB converted, %.2f GB random)%s",
        (double)total / 1e9, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9,
        (double)ld.uploaded / 1e9, (double)ld.converted / 1e9, (double)ld.random / 1e9,
        c->tie_embeddings ? ", lm_head tied to the embedding" : "");
out:
    if (ld.stage) {
        cudaStreamSynchronize(b->stream);
        cudaFree(ld.stage);
        b->alloc_bytes -= STAGE_BYTES;
    }
    return rc;
}
