// Weights to the device (see cuda_backend.cuh): every tensor in one allocation, q/k/v fused into one
// (H + 2 KVH) D x C matrix and gate/up into one 2F x C matrix (biases likewise), a tied lm_head
// sharing the embedding (an fp8 lm_head, model.lm_head_dtype, is its own copy: see below).
//
// bf16 tensors. Sources: BF16 is copied as is; F32 and F16 are converted on the device in chunks;
// F8_E4M3 (with or without block scales) is dequantized on the host by tensor_to_f32 and then takes
// the F32 path. A view with data == NULL and a name is a random weight (engine/random_model.h) and
// is filled on the device by the same rule the host uses.
//
// fp16 mode (b->f16): the same tensors in fp16. F16 is copied as is, BF16 and F32 are converted on the
// device (round to nearest even), random weights are rounded to fp16 from the same fp32 values; a
// finite value beyond fp16's range (|w| >= 65520 rounds to infinity) fails the load.
//
// fp8 linear weights (fp8_linear_use of engine/fp8.h, per fused matrix, from
// backend_opts.weight_dtype): e4m3 codes [N, K] followed by fp32 scales [N/128][K/128] (so a fused
// matrix's parts are stacked in both). An F8_E4M3 checkpoint tensor in 128x128 blocks is copied as
// is (its scale_inv, bf16 or fp32, converted to fp32 on the host); any other source is made bf16 in
// a staging buffer, a chunk of 128-row blocks at a time, by the bf16 path above, and quantized there
// by k_quant_fp8_weight (bit for bit fp8_quantize_blocks of those bf16 values: what the CPU oracle
// computes with). A NaN or infinity in such a weight fails the load. The output projection follows
// the same rule under backend_opts.lm_head_dtype.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda_backend.cuh"
#include "kernels/elt16.cuh"

extern "C" {
#include "engine/fp8.h"
#include "engine/random_model.h"
#include "engine/util/log.h"
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
// dst[i] = element i0 + i of the tensor
// dst[i] = element i0 + i of the tensor, in E
template <typename E>
__global__ void fill_random_kernel(E *dst, size_t n, size_t i0, uint64_t seed, float amp, float base)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = splitmix64_d(seed + i0 + i);
        float u = (float)(uint32_t)(h >> 40) * (1.0f / 16777216.0f);
        float x = __fsub_rn(__fmul_rn(2.0f, u), 1.0f);
        dst[i] = elt16<E>::from_f(__fadd_rn(base, __fmul_rn(amp, x)));
    }
}

// S (float, bf16 or __half) -> E, round to nearest even; *over = 1 where a finite value became infinite
// (over NULL: not checked)
template <typename S> __device__ __forceinline__ float src_f(S x)
{
    if constexpr (sizeof(S) == 4)
        return x;
    else
        return elt16<S>::to_f(x);
}

template <typename S, typename E> __global__ void convert_kernel(const S *src, E *dst, size_t n, int *over)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float x = src_f(src[i]);
        const E y = elt16<E>::from_f(x);
        dst[i] = y;
        if (over && isinf(elt16<E>::to_f(y)) && isfinite(x))
            *over = 1;
    }
}

static unsigned grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 8192 ? (g ? g : 1) : 8192);
}

// ---- loading

// One part of a (fused) linear matrix: its tensor, name for messages, and rows.
struct part_spec {
    const struct tensor_view *t;
    const char *what;
    int64_t rows;
};

struct loader {
    struct cuda_backend *b;
    char *stage;                        // device staging (STAGE_BYTES)
    bf16 *qstage;                       // device staging of bf16 rows to quantize (STAGE_BYTES; fp8 only)
    int *bad;                           // device flag: a weight to quantize held a NaN or infinity
    int *over;                          // device flag (fp16 mode): a weight beyond fp16's range
    size_t uploaded, random, converted; // bytes of bf16 written by each path
    size_t fp8_copied, fp8_quantized; // bytes of e4m3 (+ scales) copied from fp8 checkpoints, quantized here
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

// Converts n host elements of S (float, bf16 or __half) into dst, the backend's 16-bit type, through the
// staging buffer.
template <typename S> static int put_conv(struct loader *ld, const S *src, bf16 *dst, size_t n)
{
    struct cuda_backend *b = ld->b;
    const size_t chunk = STAGE_BYTES / sizeof(S);
    for (size_t o = 0; o < n; o += chunk) {
        size_t k = n - o < chunk ? n - o : chunk;
        CB_CUDA(cudaMemcpyAsync(ld->stage, src + o, k * sizeof(S), cudaMemcpyHostToDevice, b->stream));
        if (b->f16)
            convert_kernel<<<grid_for(k), 256, 0, b->stream>>>((const S *)ld->stage, (__half *)dst + o, k,
                                                               ld->over);
        else
            convert_kernel<<<grid_for(k), 256, 0, b->stream>>>((const S *)ld->stage, dst + o, k, (int *)NULL);
        CB_CUDA(cudaGetLastError());
    }
    return 0;
}

static int put_f32(struct loader *ld, const float *src, bf16 *dst, size_t n)
{
    return put_conv(ld, src, dst, n);
}

// Checks that t has the expected shape (d1 == 0: a vector); -1 with b->base.err if not.
static int check_shape(struct cuda_backend *b, const struct tensor_view *t, const char *name, int64_t d0,
                       int64_t d1)
{
    return tensor_view_check_shape(t, name, d0, d1, b->base.err, sizeof b->base.err);
}

// Elements i0 .. i0 + n - 1 of t (in row-major order) into dst as bf16. An F8_E4M3 tensor only whole
// (i0 == 0, n all of it): it is dequantized on the host.
static int put_elems(struct loader *ld, const struct tensor_view *t, const char *name, size_t i0, size_t n,
                     bf16 *dst)
{
    struct cuda_backend *b = ld->b;
    if (!t->data) {
        if (!t->name) {
            snprintf(b->base.err, sizeof b->base.err, "%s: missing", name);
            return -1;
        }
        struct random_fill r = random_model_fill(t->name);
        if (b->f16)
            fill_random_kernel<<<grid_for(n), 256, 0, b->stream>>>((__half *)dst, n, i0, r.seed, r.amp,
                                                                   r.base);
        else
            fill_random_kernel<<<grid_for(n), 256, 0, b->stream>>>(dst, n, i0, r.seed, r.amp, r.base);
        CB_CUDA(cudaGetLastError());
        ld->random += n * 2;
        return 0;
    }
    const enum dtype native = b->f16 ? DT_F16 : DT_BF16; // copied as is
    if (t->dtype == native) {
        CB_CUDA(cudaMemcpyAsync(dst, (const uint16_t *)t->data + i0, n * sizeof(bf16), cudaMemcpyHostToDevice,
                                b->stream));
        ld->uploaded += n * 2;
        return 0;
    }
    switch (t->dtype) {
    case DT_F32:
        ld->converted += n * 2;
        return put_f32(ld, (const float *)t->data + i0, dst, n);
    case DT_F16:
        ld->converted += n * 2;
        return put_conv(ld, (const __half *)t->data + i0, dst, n);
    case DT_BF16:
        ld->converted += n * 2;
        return put_conv(ld, (const __nv_bfloat16 *)t->data + i0, dst, n);
    default: { // F8_E4M3 (block scales or not): dequantize on the host
        if (i0 != 0 || (int64_t)n != tensor_numel(t)) {
            snprintf(b->base.err, sizeof b->base.err, "%s: internal: part of an F8_E4M3 tensor requested",
                     name);
            return -1;
        }
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

// One tensor of the expected shape (d1 == 0: a vector) into dst (bf16, numel elements).
static int put(struct loader *ld, const struct tensor_view *t, const char *what, int layer, int64_t d0,
               int64_t d1, bf16 *dst)
{
    char nb[128];
    const char *name = tname(t, what, layer, nb, sizeof nb);
    if (check_shape(ld->b, t, name, d0, d1))
        return -1;
    return put_elems(ld, t, name, 0, (size_t)d0 * (size_t)(d1 ? d1 : 1), dst);
}

// One part (rows x K) of an fp8 matrix: its codes at q (rows x K bytes) and scales at scale
// (rows/128 x K/128 floats). fp8_linear_use has checked that rows and K are multiples of 128 and
// that an F8_E4M3 part has 128x128 blocks.
static int put_fp8(struct loader *ld, const struct tensor_view *t, const char *what, int layer, int64_t rows,
                   int64_t K, uint8_t *q, float *scale)
{
    struct cuda_backend *b = ld->b;
    char nb[128];
    const char *name = tname(t, what, layer, nb, sizeof nb);
    if (check_shape(b, t, name, rows, K))
        return -1;
    const size_t KB = (size_t)K / FP8_BLOCK, ns = (size_t)rows / FP8_BLOCK * KB;
    if (t->data && t->dtype == DT_F8_E4M3) { // as published: codes as they are, scales to fp32
        const struct tensor_view *sv = t->scale_inv;
        float *hs = (float *)malloc(ns * sizeof(float));
        if (!hs) {
            snprintf(b->base.err, sizeof b->base.err, "%s: out of host memory", name);
            return -1;
        }
        if (!sv || tensor_numel(sv) != (int64_t)ns || dtype_to_f32(sv->dtype, sv->data, hs, ns)) {
            snprintf(b->base.err, sizeof b->base.err, "%s: block scales missing, of the wrong size or type",
                     name);
            free(hs);
            return -1;
        }
        cudaError_t e = cudaMemcpy(scale, hs, ns * sizeof(float), cudaMemcpyHostToDevice); // hs is freed next
        free(hs);
        if (e != cudaSuccess)
            return cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemcpy(fp8 scales)", e);
        CB_CUDA(cudaMemcpyAsync(q, t->data, (size_t)rows * K, cudaMemcpyHostToDevice, b->stream));
        ld->fp8_copied += (size_t)rows * K + ns * 4;
        return 0;
    }
    // bf16 rows in chunks of whole 128-row blocks, quantized on the device
    int64_t chunk = (int64_t)(STAGE_BYTES / 2 / (size_t)K) / FP8_BLOCK * FP8_BLOCK;
    if (chunk < FP8_BLOCK) {
        snprintf(b->base.err, sizeof b->base.err, "%s: rows of %lld columns do not fit the staging buffer",
                 name, (long long)K);
        return -1;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        if (put_elems(ld, t, name, (size_t)(r0 * K), (size_t)(nr * K), ld->qstage))
            return -1;
        CB_K(k_quant_fp8_weight(ld->qstage, (int)nr, (int)K, q + (size_t)r0 * K,
                                scale + (size_t)(r0 / FP8_BLOCK) * KB, ld->bad, b->stream));
    }
    ld->fp8_quantized += (size_t)rows * K + ns * 4;
    return 0;
}

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

// Bytes of the padded copy of an fp8 matrix's scales that k_gemm_fp8 reads ([N/128][K_FP8_KB(K)]),
// 0 when the checkpoint layout [N/128][K/128] is already that (K/128 a multiple of 4).
static size_t scale_lt_bytes(size_t N, size_t K)
{
    const size_t KB = K / FP8_BLOCK, KBp = (size_t)K_FP8_KB(K);
    return KBp == KB ? 0 : align256(N / FP8_BLOCK * KBp * 4);
}

// Bytes of one linear matrix [N, K] in the weight allocation: bf16, or e4m3 codes then fp32 scales
// (then their padded copy for cuBLASLt where it differs).
static size_t linear_bytes(size_t N, size_t K, bool fp8)
{
    return fp8 ? align256(N * K) + align256(N / FP8_BLOCK * (K / FP8_BLOCK) * 4) + scale_lt_bytes(N, K)
               : align256(N * K * 2);
}

// Copies the scales [N/128][K/128] at kw->scale into k_gemm_fp8's layout [N/128][K_FP8_KB(K)] at
// kw->scale_lt (padding 0: it multiplies no real column), on b->stream.
static int put_scale_lt(struct loader *ld, const struct k_weight *kw)
{
    struct cuda_backend *b = ld->b;
    const size_t KB = (size_t)kw->K / FP8_BLOCK, KBp = (size_t)K_FP8_KB(kw->K),
                 NB = (size_t)kw->N / FP8_BLOCK;
    // the scales were written by synchronous copies (default stream) or by kernels on b->stream
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemsetAsync((void *)kw->scale_lt, 0, NB * KBp * 4, b->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync((void *)kw->scale_lt, KBp * 4, kw->scale, KB * 4, KB * 4, NB,
                              cudaMemcpyDeviceToDevice, b->stream);
    if (e != cudaSuccess)
        return cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemcpy2DAsync(padded fp8 scales)", e);
    return 0;
}

// A linear matrix [N, K] stacked from parts (by rows) at *p, which moves past it: bf16, or e4m3 codes
// then fp32 scales (and their padded copy); *kw describes it for k_linear.
static int put_linear(struct loader *ld, char **p, struct k_weight *kw, bool fp8, size_t N, size_t K,
                      const struct part_spec *ps, int nps, int layer)
{
    kw->fp8 = fp8, kw->N = (int)N, kw->K = (int)K, kw->w = *p, kw->scale = NULL, kw->scale_lt = NULL;
    if (fp8) {
        kw->scale = (const float *)(*p + align256(N * K));
        kw->scale_lt =
            scale_lt_bytes(N, K)
                ? (const float *)(*p + align256(N * K) + align256(N / FP8_BLOCK * (K / FP8_BLOCK) * 4))
                : kw->scale;
    }
    size_t row = 0;
    for (int i = 0; i < nps; i++) {
        const struct part_spec *s = &ps[i];
        int rc = fp8 ? put_fp8(ld, s->t, s->what, layer, s->rows, (int64_t)K, (uint8_t *)*p + row * K,
                               (float *)kw->scale + row / FP8_BLOCK * (K / FP8_BLOCK))
                     : put(ld, s->t, s->what, layer, s->rows, (int64_t)K, (bf16 *)*p + row * K);
        if (rc)
            return -1;
        row += (size_t)s->rows;
    }
    if (fp8 && kw->scale_lt != kw->scale && put_scale_lt(ld, kw))
        return -1;
    *p += linear_bytes(N, K, fp8);
    return 0;
}

// The linear matrices of one layer and whether each runs in fp8.
struct layer_plan {
    bool qkv, o, gu, down;
};

static bool use_fp8(struct cuda_backend *b, const struct tensor_view *const *parts, int n, int layer)
{
    char why[256];
    bool use = fp8_linear_use(b->w.dtype, parts, n, why, sizeof why);
    if (why[0] && layer == 0)
        log_info("cuda backend: %s (and likewise in every layer)", why);
    return use;
}

// *set = a device flag's value (the stream is synchronized); -1 with b->base.err on a CUDA error.
static int read_flag(struct cuda_backend *b, const int *flag, const char *what, int *set)
{
    cudaError_t e = cudaMemcpy(set, flag, sizeof *set, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        char w[64];
        snprintf(w, sizeof w, "cudaMemcpy(%s)", what);
        return cb_fail_cuda(b, __FILE__, __LINE__, w, e);
    }
    return 0;
}

int cb_load_weights(struct cuda_backend *b, const struct model *m)
{
    const struct model_config *c = &b->cfg;
    const size_t C = b->C, F = b->F, D = b->D, V = b->V, QKV = b->QKV, HD = b->HD, KVD = b->KVD;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    // which matrices are fp8, then the size table: offsets of every tensor in one allocation
    struct layer_plan *lp = (struct layer_plan *)calloc((size_t)b->L, sizeof *lp);
    b->layers = (struct cb_layer *)calloc((size_t)b->L, sizeof *b->layers);
    if (!lp || !b->layers) {
        free(lp);
        snprintf(b->base.err, sizeof b->base.err, "out of host memory");
        return -1;
    }
    // the output projection: bf16 (shared with the embedding when tied) or fp8 (its own copy)
    const struct tensor_view *lm_src = c->tie_embeddings ? &m->embed : &m->lm_head, *lm_parts[1] = {lm_src};
    char lm_why[256];
    const bool lm_fp8 = fp8_linear_use(b->w.lm_dtype, lm_parts, 1, lm_why, sizeof lm_why);
    if (lm_why[0])
        log_info("cuda backend: lm_head: %s", lm_why);
    size_t total = align256(V * C * 2) +
                   (lm_fp8              ? linear_bytes(V, C, true)
                    : c->tie_embeddings ? 0
                                        : align256(V * C * 2)) +
                   align256(C * 2),
           fp8_bytes = lm_fp8 ? linear_bytes(V, C, true) : 0;
    b->w.n_fp8 = 0;
    for (int l = 0; l < b->L; l++) {
        const struct layer_weights *lw = &m->layers[l];
        const struct tensor_view *pq[3] = {&lw->wq, &lw->wk, &lw->wv}, *po[1] = {&lw->wo},
                                 *pg[2] = {&lw->w_gate, &lw->w_up}, *pd[1] = {&lw->w_down};
        lp[l].qkv = use_fp8(b, pq, 3, l), lp[l].o = use_fp8(b, po, 1, l);
        lp[l].gu = use_fp8(b, pg, 2, l), lp[l].down = use_fp8(b, pd, 1, l);
        b->w.n_fp8 += lp[l].qkv + lp[l].o + lp[l].gu + lp[l].down;
        const size_t lin[4] = {linear_bytes(QKV, C, lp[l].qkv), linear_bytes(C, HD, lp[l].o),
                               linear_bytes(2 * F, C, lp[l].gu), linear_bytes(C, F, lp[l].down)};
        const bool f[4] = {lp[l].qkv, lp[l].o, lp[l].gu, lp[l].down};
        for (int i = 0; i < 4; i++)
            fp8_bytes += f[i] ? lin[i] : 0;
        total += align256(C * 2) + lin[0] + (c->qkv_bias ? align256(QKV * 2) : 0) +
                 (c->qk_norm ? 2 * align256(D * 2) : 0) + lin[1] + align256(C * 2) + lin[2] + lin[3];
    }
    struct loader ld;
    memset(&ld, 0, sizeof ld);
    ld.b = b;
    int rc = -1;
    if (cb_malloc(b, &b->w.buf, total, "weights")) {
        free(lp);
        return -1;
    }
    b->w.bytes = total;
    if (cb_malloc(b, (void **)&ld.stage, STAGE_BYTES, "weight staging")) // freed when loading is done
        goto out;
    if (b->f16) {
        if (cb_malloc(b, (void **)&ld.over, sizeof(int), "fp16 range flag"))
            goto out;
        if (cudaMemsetAsync(ld.over, 0, sizeof(int), b->stream) != cudaSuccess) {
            cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemsetAsync", cudaGetLastError());
            goto out;
        }
    }
    if (b->w.n_fp8 || lm_fp8) {
        // the fp8 GEMM input (one buffer for every matrix in turn) and the quantization staging
        const size_t kmax = C > HD ? (C > F ? C : F) : (HD > F ? HD : F), R = (size_t)b->rows;
        b->acts.xq_bytes = align256(R * kmax) + align256(kmax / FP8_BLOCK * R * 4);
        if (cb_malloc(b, (void **)&b->acts.xq, b->acts.xq_bytes, "fp8 activations"))
            goto out;
        b->acts.xs = (float *)((char *)b->acts.xq + align256(R * kmax));
        // rows past a step's token count (up to K_FP8_ROWS) are read by cuBLASLt: never NaN codes
        if (cudaMemsetAsync(b->acts.xq, 0, b->acts.xq_bytes, b->stream) != cudaSuccess) {
            cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemsetAsync(fp8 activations)", cudaGetLastError());
            goto out;
        }
        if (cb_malloc(b, (void **)&ld.qstage, STAGE_BYTES, "fp8 quantization staging") ||
            cb_malloc(b, (void **)&ld.bad, sizeof(int), "fp8 flag"))
            goto out;
        if (cudaMemsetAsync(ld.bad, 0, sizeof(int), b->stream) != cudaSuccess) {
            cb_fail_cuda(b, __FILE__, __LINE__, "cudaMemsetAsync", cudaGetLastError());
            goto out;
        }
    }
    {
        char *p = (char *)b->w.buf;
#define TAKE(dst, elems)                                                                                     \
    do {                                                                                                     \
        (dst) = (bf16 *)p;                                                                                   \
        p += align256((size_t)(elems)*2);                                                                    \
    } while (0)
        bf16 *w;
        TAKE(w, V * C);
        if (put(&ld, &m->embed, "embed_tokens", -1, V, C, w))
            goto out;
        b->w.embed = w;
        if (lm_fp8) {
            const struct part_spec sl[1] = {
                {lm_src, c->tie_embeddings ? "embed_tokens" : "lm_head", (int64_t)V}};
            if (put_linear(&ld, &p, &b->w.lm, true, V, C, sl, 1, -1))
                goto out;
        } else if (c->tie_embeddings) {
            b->w.lm = (struct k_weight){0, b->w.embed, NULL, (int)V, (int)C, NULL};
        } else {
            TAKE(w, V * C);
            if (put(&ld, &m->lm_head, "lm_head", -1, V, C, w))
                goto out;
            b->w.lm = (struct k_weight){0, w, NULL, (int)V, (int)C, NULL};
        }
        TAKE(w, C);
        if (put(&ld, &m->final_norm, "norm", -1, C, 0, w))
            goto out;
        b->w.final_norm = w;
        for (int l = 0; l < b->L; l++) {
            const struct layer_weights *lw = &m->layers[l];
            struct cb_layer *cl = &b->layers[l];
            TAKE(w, C);
            if (put(&ld, &lw->attn_norm, "input_layernorm", l, C, 0, w))
                goto out;
            cl->attn_norm = w;
            const struct part_spec sq[3] = {{&lw->wq, "q_proj", (int64_t)HD},
                                            {&lw->wk, "k_proj", (int64_t)KVD},
                                            {&lw->wv, "v_proj", (int64_t)KVD}};
            if (put_linear(&ld, &p, &cl->wqkv, lp[l].qkv, QKV, C, sq, 3, l))
                goto out;
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
            const struct part_spec so[1] = {{&lw->wo, "o_proj", (int64_t)C}};
            if (put_linear(&ld, &p, &cl->wo, lp[l].o, C, HD, so, 1, l))
                goto out;
            TAKE(w, C);
            if (put(&ld, &lw->mlp_norm, "post_attention_layernorm", l, C, 0, w))
                goto out;
            cl->mlp_norm = w;
            const struct part_spec sg[2] = {{&lw->w_gate, "gate_proj", (int64_t)F},
                                            {&lw->w_up, "up_proj", (int64_t)F}};
            if (put_linear(&ld, &p, &cl->wgu, lp[l].gu, 2 * F, C, sg, 2, l))
                goto out;
            const struct part_spec sd[1] = {{&lw->w_down, "down_proj", (int64_t)C}};
            if (put_linear(&ld, &p, &cl->wdown, lp[l].down, C, F, sd, 1, l))
                goto out;
        }
#undef TAKE
    }
    if (cudaStreamSynchronize(b->stream) != cudaSuccess) {
        cb_fail_cuda(b, __FILE__, __LINE__, "cudaStreamSynchronize(weights)", cudaGetLastError());
        goto out;
    }
    if (ld.bad) {
        int bad = 0;
        if (read_flag(b, ld.bad, "fp8 flag", &bad))
            goto out;
        if (bad) {
            snprintf(b->base.err, sizeof b->base.err,
                     "a linear weight holds a NaN or an infinity: it cannot be quantized to fp8 (model.dtype "
                     "fp8); "
                     "the checkpoint is broken, or load it with model.dtype bf16");
            goto out;
        }
    }
    if (ld.over) {
        int over = 0;
        if (read_flag(b, ld.over, "fp16 flag", &over))
            goto out;
        if (over) {
            snprintf(b->base.err, sizeof b->base.err,
                     "a weight is beyond fp16's range (|w| > 65504): model.dtype fp16 cannot hold this "
                     "checkpoint; load it with model.dtype bf16 (or auto)");
            goto out;
        }
    }
    rc = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    log_info(
        "cuda backend: weights %.2f GB in %.1f s: %s (%.2f GB copied, %.2f GB converted, %.2f GB random as "
        "%s%s)%s",
        (double)total / 1e9, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9,
        b->f16                   ? "all fp16"
        : b->w.n_fp8 == 0        ? "all bf16"
        : b->w.n_fp8 == 4 * b->L ? "linear weights fp8 e4m3 (128x128 blocks), the rest bf16"
                                 : "some linear weights fp8 e4m3, the rest bf16",
        (double)ld.uploaded / 1e9, (double)ld.converted / 1e9, (double)ld.random / 1e9,
        b->f16 ? "fp16" : "bf16", b->w.n_fp8 || lm_fp8 ? "; fp8 staging included" : "",
        lm_fp8              ? ", lm_head fp8"
        : c->tie_embeddings ? ", lm_head tied to the embedding"
                            : "");
    if (b->w.n_fp8 || lm_fp8)
        log_info(
            "cuda backend: %d of %d linear matrices in fp8%s: %.2f GB (%.2f GB copied from the checkpoint as "
            "fp8, %.2f GB quantized at load)",
            b->w.n_fp8, 4 * b->L, lm_fp8 ? ", and lm_head" : "", (double)fp8_bytes / 1e9,
            (double)ld.fp8_copied / 1e9, (double)ld.fp8_quantized / 1e9);
out:
    free(lp);
    if (ld.stage || ld.qstage || ld.bad || ld.over)
        cudaStreamSynchronize(b->stream);
    if (ld.stage) {
        cudaFree(ld.stage);
        b->alloc_bytes -= STAGE_BYTES;
    }
    if (ld.qstage) {
        cudaFree(ld.qstage);
        b->alloc_bytes -= STAGE_BYTES;
    }
    if (ld.bad) {
        cudaFree(ld.bad);
        b->alloc_bytes -= sizeof(int);
    }
    if (ld.over) {
        cudaFree(ld.over);
        b->alloc_bytes -= sizeof(int);
    }
    return rc;
}

// ---- second copies of the weights in the GEMVs' tile order (engine.decode_weight_copies)
//
// Every linear matrix of the layers whose shape allows it, and the output projection, gets a copy in
// the order the decode-sized GEMV's lanes read it (k_gemv_*_tile_order), all in one allocation made
// right before the KV cache sizes itself, registered with k_gemv_*_tiled and forgotten at close.
// Whether to make them is engine/weight_copies.h's rule (cuda_backend.cu). The row-major matrices stay
// for cuBLASLt's prefill GEMMs; the bits of every step are unchanged.

// N a multiple of 16 (a fused gate/up of 2F rows: F a multiple of 8), rows a multiple of 128 bytes
static bool tile_copy_fits(const struct k_weight *w)
{
    return w->N % 16 == 0 && w->K % (w->fp8 ? 128 : 64) == 0;
}

// f(w, glu) for every matrix that gets a copy (glu: an fp8 fused gate/up, which the GLU kernel reads);
// none in fp16 mode, whose GEMVs have no tile-order path
template <typename FN> static void each_tile_mat(struct cuda_backend *b, FN f)
{
    if (b->f16)
        return;
    for (int l = 0; l < b->L; l++) {
        struct cb_layer *cl = &b->layers[l];
        const struct k_weight *mats[4] = {&cl->wqkv, &cl->wo, &cl->wgu, &cl->wdown};
        for (int j = 0; j < 4; j++)
            if (tile_copy_fits(mats[j]))
                f(mats[j], j == 2 && mats[j]->fp8);
    }
    if (tile_copy_fits(&b->w.lm))
        f(&b->w.lm, false);
}

static size_t tile_copy_bytes(const struct k_weight *w)
{
    return align256((size_t)w->N * w->K * (w->fp8 ? 1 : 2));
}

size_t cb_tile_copies_bytes(struct cuda_backend *b)
{
    size_t bytes = 0;
    each_tile_mat(b, [&](const struct k_weight *w, bool) { bytes += tile_copy_bytes(w); });
    return bytes;
}

int cb_tile_copies(struct cuda_backend *b, const char *why)
{
    const size_t bytes = cb_tile_copies_bytes(b);
    if (bytes == 0)
        return 0;
    if (cb_malloc(b, &b->w.copies, bytes, "the decode GEMVs' weight copies (engine.decode_weight_copies)"))
        return -1;
    b->w.copies_bytes = bytes;
    uint8_t *p = (uint8_t *)b->w.copies;
    int n = 0, rc = 0;
    each_tile_mat(b, [&](const struct k_weight *w, bool glu) {
        const int N = glu ? w->N / 2 : w->N;
        if (rc == 0 && (w->fp8 ? k_gemv_fp8_tile_order((const uint8_t *)w->w, p, N, w->K, glu, b->stream) ||
                                     k_gemv_fp8_tiled((const uint8_t *)w->w, p, N, w->K, glu)
                               : k_gemv_bf16_tile_order((const bf16 *)w->w, (bf16 *)p, N, w->K, b->stream) ||
                                     k_gemv_bf16_tiled((const bf16 *)w->w, (const bf16 *)p, N, w->K)))
            rc = cb_fail_k(b, "k_gemv_*_tile_order");
        p += tile_copy_bytes(w);
        n++;
    });
    if (rc)
        return rc;
    log_info("cuda backend: %d matrices also in the decode GEMVs' read order, %.2f GB (%s)", n,
             (double)bytes / 1e9, why);
    return 0;
}

void cb_tile_copies_free(struct cuda_backend *b)
{
    if (b->w.copies && b->layers)
        each_tile_mat(b, [](const struct k_weight *w, bool) {
            if (w->fp8)
                k_gemv_fp8_tiled((const uint8_t *)w->w, NULL, 0, 0, 0);
            else
                k_gemv_bf16_tiled((const bf16 *)w->w, NULL, 0, 0);
        });
}
