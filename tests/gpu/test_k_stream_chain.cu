/* Kernel test of k_stream_chain (kernels/stream_chain.cu): chains of dependent one-row fp8 GEMVs in one
 * persistent kernel, against a double-precision reference computed from the inputs each op really
 * read (the device's own output of the op before it), for every variant (consumer warps x stage size),
 * on shapes that leave most CTAs idle (one step in all), cut tiles between many CTAs (tickets),
 * write SwiGLU outputs, and on one layer of Qwen3-14B's shapes; each launched three times: the second
 * launch (of the kernel's build that reads the measurement flags, K_CHAIN_MEASURE), and a third with
 * the weights read through L2 (K_CHAIN_L2), must give the first's bits (counters and tickets are left
 * at zero, the sums' order is fixed, the products do not depend on the build or on where the weights
 * come from).
 *
 * A value passes when |got - ref| <= one bf16 ulp of ref + 1e-5 * sum_k |w_k x_k| (fp32 summation in
 * another order); a SwiGLU output silu(g) u also allows for g and u rounded to bf16 first (2^-9 each)
 * and for its own expf.
 *
 * `gpu_test_k_stream_chain --bench` instead times a 40-layer chain of Qwen3-14B's four matrices
 * (13.2 GB of fp8 weights) through the stream chain, every variant, with and without the dependency
 * waits and the products, against the same chain of k_gemv_fp8 / k_gemv_fp8_glu launches in a CUDA
 * graph (what the engine runs at one sequence, without the norms and the attention); the numbers are
 * in docs/PERFORMANCE.md. */
#include <algorithm>
#include <math.h>
#include <vector>

#include "tests/gpu/gpu_test.h"

extern "C" {
#include "engine/dtype.h"
}

static uint64_t base_seed;

struct op_shape {
    int n, k, glu, dep;
};

struct dev_chain {
    std::vector<k_chain_op> ops;
    std::vector<uint8_t *> w_rows; /* row-major copies (the GEMV chain, the reference) */
    std::vector<void *> owned;
};

static void chain_free(dev_chain &c)
{
    for (void *p : c.owned)
        GPU_OK(cudaFree(p));
    c.owned.clear();
}

template <typename T> static T *dev_alloc(dev_chain &c, size_t n)
{
    T *p;
    GPU_OK(cudaMalloc(&p, n * sizeof(T)));
    c.owned.push_back(p);
    return p;
}

static uint8_t random_code(uint64_t *s)
{
    uint8_t b;
    do
        b = (uint8_t)(gt_next(s) >> 32);
    while ((b & 0x7f) == 0x7f);
    return b;
}

/* Builds the chain on the device from host-random weights (the whole byte range but NaN; block scales
 * so that outputs stay near 1) and external inputs. */
static dev_chain make_chain(const std::vector<op_shape> &sh, uint64_t seed)
{
    dev_chain c;
    uint64_t s = seed;
    std::vector<bf16 *> ys;
    for (size_t i = 0; i < sh.size(); i++) {
        const op_shape &o = sh[i];
        const size_t nk = (size_t)o.n * o.k;
        std::vector<uint8_t> w(nk);
        for (auto &b : w)
            b = random_code(&s);
        const int sr = (o.n + 127) / 128, sc = (o.k + 127) / 128;
        std::vector<float> scale((size_t)sr * sc);
        for (auto &v : scale)
            v = (0.75f + 0.5f * (gt_uniform(&s) + 1.f) / 2.f) / (40.f * sqrtf((float)o.k));
        uint8_t *wr = dev_alloc<uint8_t>(c, nk), *wt = dev_alloc<uint8_t>(c, nk);
        GPU_OK(cudaMemcpy(wr, w.data(), nk, cudaMemcpyHostToDevice));
        float *sd = dev_alloc<float>(c, scale.size());
        GPU_OK(cudaMemcpy(sd, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice));
        const bf16 *x;
        if (o.dep < 0) {
            const size_t nx = (size_t)o.k;
            bf16 *h = gt_random_bf16(nx, 1.f, &s, NULL);
            bf16 *xd = dev_alloc<bf16>(c, nx);
            GPU_OK(cudaMemcpy(xd, h, nx * 2, cudaMemcpyHostToDevice));
            free(h);
            x = xd;
        } else
            x = ys[o.dep];
        bf16 *y = dev_alloc<bf16>(c, (size_t)(o.glu ? o.n / 2 : o.n));
        ys.push_back(y);
        c.ops.push_back({wt, sd, x, y, o.n, o.k, o.glu, o.dep});
        c.w_rows.push_back(wr);
    }
    return c;
}

/* The chain's weights in the layout of variant v on this device. */
static void relayout(dev_chain &c, int v)
{
    for (size_t i = 0; i < c.ops.size(); i++)
        K_OK(k_stream_layout_fp8(c.w_rows[i], (uint8_t *)c.ops[i].w, c.ops[i].n, c.ops[i].k, c.ops[i].glu, v,
                                 0));
}

static size_t out_len(const k_chain_op &o)
{
    return (size_t)(o.glu ? o.n / 2 : o.n);
}

/* Compares op i's output with the reference from its input as the device left it. */
static bool verify_op(const dev_chain &c, size_t i, const char *tag)
{
    const k_chain_op &o = c.ops[i];
    const size_t ny = out_len(o);
    std::vector<uint16_t> xb(o.k), yb(ny);
    std::vector<uint8_t> w((size_t)o.n * o.k);
    const int sr = (o.n + 127) / 128, sc = (o.k + 127) / 128;
    std::vector<float> scale((size_t)sr * sc);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(xb.data(), o.x, (size_t)o.k * 2, cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(yb.data(), o.y, ny * 2, cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(w.data(), c.w_rows[i], w.size(), cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(scale.data(), o.w_scale, scale.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> x(o.k);
    for (int k = 0; k < o.k; k++)
        x[k] = bf16_to_f32(xb[k]);
    float dec[256];
    for (int b = 0; b < 256; b++)
        dec[b] = e4m3_to_f32((uint8_t)b);
    /* row n's sum, and the sum of |terms| */
    auto dot = [&](int n, double *mag) {
        double r = 0, m = 0;
        const uint8_t *wr = w.data() + (size_t)n * o.k;
        const float *srow = scale.data() + (size_t)(n / 128) * sc;
        for (int k = 0; k < o.k; k++) {
            const double p = (double)dec[wr[k]] * srow[k / 128] * x[k];
            r += p, m += fabs(p);
        }
        *mag = m;
        return r;
    };
    int bad = 0, first_bad = -1;
    double worst = 0;
    for (size_t n = 0; n < ny; n++) {
        double ref, tol;
        if (o.glu) { /* silu(g) u from sums rounded to bf16 (each 2^-9 relative, plus fp32 order) */
            double mg, mu;
            const double g = dot((int)n, &mg), u = dot((int)(o.n / 2 + n), &mu);
            const double sg = g / (1 + exp(-g));
            ref = sg * u;
            tol = 1.2 * fabs(u) * (fabs(g) / 256 + 1e-5 * mg) + 1.2 * fabs(sg) * (fabs(u) / 256 + 1e-5 * mu);
        } else {
            double m;
            ref = dot((int)n, &m);
            tol = 1e-5 * m;
        }
        int e;
        frexp(ref, &e);
        tol += ldexp(1.0, e - 8); /* one bf16 ulp of the result */
        const double d = fabs(bf16_to_f32(yb[n]) - ref);
        if (!(d <= tol)) {
            if (first_bad < 0)
                first_bad = (int)n;
            bad++;
        }
        if (d / tol > worst)
            worst = d / tol;
    }
    gt_check(bad == 0,
             "%s op %zu (N %d, K %d%s, input %s): %d of %zu outside the bound (worst |d| / bound %.2f%s%d)",
             tag, i, o.n, o.k, o.glu ? ", SwiGLU out" : "", o.dep < 0 ? "external" : "op before", bad, ny,
             worst, bad ? ", first at " : "", bad ? first_bad : 0);
    return bad == 0;
}

static void run_case(const char *what, const std::vector<op_shape> &sh, uint64_t seed)
{
    dev_chain c = make_chain(sh, seed);
    for (int v = 0; v < K_CHAIN_VARIANTS; v++) {
        k_stream_chain *p;
        relayout(c, v);
        K_OK(k_stream_chain_plan(c.ops.data(), (int)c.ops.size(), v, &p));
        char desc[200], tag[300];
        k_stream_chain_describe(p, desc, sizeof desc);
        snprintf(tag, sizeof tag, "%s, variant %d (%s):", what, v, desc);
        for (auto &o : c.ops)
            GPU_OK(cudaMemset(o.y, 0xff, out_len(o) * 2));
        K_OK(k_stream_chain_run(p, 0, 0));
        GPU_OK(cudaDeviceSynchronize());
        std::vector<std::vector<uint16_t>> first;
        for (auto &o : c.ops) {
            std::vector<uint16_t> y(out_len(o));
            GPU_OK(cudaMemcpy(y.data(), o.y, y.size() * 2, cudaMemcpyDeviceToHost));
            first.push_back(y);
        }
        for (size_t i = 0; i < c.ops.size(); i++)
            verify_op(c, i, tag);
        /* a second launch, of the build that reads the measurement flags, and one through L2 (K_CHAIN_L2):
         * the same bits */
        for (int l2 = 0; l2 < 2; l2++) {
            for (auto &o : c.ops)
                GPU_OK(cudaMemset(o.y, 0xff, out_len(o) * 2));
            K_OK(k_stream_chain_run(p, l2 ? K_CHAIN_L2 : K_CHAIN_MEASURE, 0));
            GPU_OK(cudaDeviceSynchronize());
            size_t differ = 0;
            for (size_t i = 0; i < c.ops.size(); i++) {
                std::vector<uint16_t> y(out_len(c.ops[i]));
                GPU_OK(cudaMemcpy(y.data(), c.ops[i].y, y.size() * 2, cudaMemcpyDeviceToHost));
                for (size_t j = 0; j < y.size(); j++)
                    differ += y[j] != first[i][j];
            }
            gt_check(differ == 0, "%s %s gives the same bits (%zu values differ)", tag,
                     l2 ? "a launch through L2" : "a second launch (the measurement build)", differ);
        }
        k_stream_chain_free(p);
    }
    chain_free(c);
}

static void argument_checks(void)
{
    dev_chain c = make_chain({{32, 128, 0, -1}}, 7);
    k_stream_chain *p = NULL;
    k_chain_op bad = c.ops[0];
    bad.dep = 0;
    int rc = k_stream_chain_plan(&bad, 1, 0, &p);
    gt_check(rc != 0 && strstr(k_last_error(), "depends on op 0"), "an op that depends on itself: %s",
             rc ? k_last_error() : "accepted");
    bad = c.ops[0];
    bad.n = 40;
    rc = k_stream_chain_plan(&bad, 1, 0, &p);
    gt_check(rc != 0 && strstr(k_last_error(), "multiple of 16"), "N 40: %s",
             rc ? k_last_error() : "accepted");
    rc = k_stream_chain_plan(c.ops.data(), 1, K_CHAIN_VARIANTS, &p);
    gt_check(rc != 0 && strstr(k_last_error(), "variant"), "variant out of range: %s",
             rc ? k_last_error() : "accepted");
    chain_free(c);
}

/* ---- the benchmark */

__global__ void fill_codes(uint8_t *w, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint8_t b = (uint8_t)(gt_splitmix(seed + i) >> 40);
        w[i] = (b & 0x80) | (b & 0x3f); /* magnitudes below 2: no NaN, values of a normal layer */
    }
}

static double median(std::vector<float> t)
{
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

template <typename F> static double time_ms(F run)
{
    for (int i = 0; i < 2; i++)
        run();
    std::vector<float> t;
    cudaEvent_t a, b;
    GPU_OK(cudaEventCreate(&a));
    GPU_OK(cudaEventCreate(&b));
    for (int i = 0; i < 7; i++) {
        GPU_OK(cudaEventRecord(a));
        run();
        GPU_OK(cudaEventRecord(b));
        GPU_OK(cudaEventSynchronize(b));
        float ms;
        GPU_OK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    GPU_OK(cudaEventDestroy(a));
    GPU_OK(cudaEventDestroy(b));
    return median(t);
}

/* One profiled run: where a CTA's time goes, per matrix of the layer (means over CTAs and layers). */
static void profile(k_stream_chain *p, int nops)
{
    K_OK(k_stream_chain_run(p, K_CHAIN_PROFILE, 0));
    GPU_OK(cudaDeviceSynchronize());
    const int G = k_stream_chain_grid(p), W = 4 * nops + 2;
    std::vector<unsigned long long> r((size_t)G * W);
    K_OK(k_stream_chain_profile(p, r.data()));
    unsigned long long t0 = ~0ull, t1 = 0;
    double wait[4] = {0}, load[4] = {0}, body[4] = {0}, gap[4] = {0}, prod = 0, cons = 0;
    for (int c = 0; c < G; c++) {
        const unsigned long long *q = &r[(size_t)c * W];
        t0 = q[0] < t0 ? q[0] : t0;
        t1 = q[4 * (nops - 1) + 3] > t1 ? q[4 * (nops - 1) + 3] : t1;
        for (int i = 0; i < nops; i++) {
            wait[i % 4] += (double)(q[4 * i + 1] - q[4 * i]);
            load[i % 4] += (double)(q[4 * i + 2] - q[4 * i + 1]);
            body[i % 4] += (double)(q[4 * i + 3] - q[4 * i + 2]);
            if (i > 0)
                gap[i % 4] += (double)(q[4 * i] - q[4 * (i - 1) + 3]);
        }
        prod += (double)q[4 * nops], cons += (double)q[4 * nops + 1];
    }
    const double n = (double)G * nops / 4, span = (double)(t1 - t0);
    const char *name[4] = {"QKV", "o_proj", "gate/up", "down"};
    printf(
        "  profiled run: %.3f ms from the first op's start to the last store; per matrix, us (wait for the "
        "input / load it / products and stores / gap before):",
        span / 1e6);
    for (int m = 0; m < 4; m++)
        printf(" %s %.2f/%.2f/%.2f/%.2f", name[m], wait[m] / n / 1e3, load[m] / n / 1e3, body[m] / n / 1e3,
               gap[m] / n / 1e3);
    printf("; copy warp waiting for free stages %.0f%%, consumer warp 0 waiting for data %.0f%% (cycles at "
           "1.98 GHz)\n",
           100 * prod / G / (span * 1.98), 100 * cons / G / (span * 1.98));
}

static int bench(int layers, const std::vector<int> &variants)
{
    const int C = 5120, QKV = 7168, F = 17408;
    const int shapes[4][2] = {{QKV, C}, {C, C}, {2 * F, C}, {C, F}};
    dev_chain c;
    double bytes = 0;
    bf16 *x0 = dev_alloc<bf16>(c, C);
    {
        uint64_t s = base_seed;
        bf16 *h = gt_random_bf16(C, 1.f, &s, NULL);
        GPU_OK(cudaMemcpy(x0, h, C * 2, cudaMemcpyHostToDevice));
        free(h);
    }
    std::vector<float *> scales;
    std::vector<bf16 *> ys;
    uint64_t s = base_seed ^ 0x5eed;
    for (int l = 0; l < layers; l++)
        for (int m = 0; m < 4; m++) {
            const int N = shapes[m][0], K = shapes[m][1];
            const size_t nk = (size_t)N * K;
            uint8_t *wr = dev_alloc<uint8_t>(c, nk), *wt = dev_alloc<uint8_t>(c, nk);
            fill_codes<<<4096, 256>>>(wr, nk, gt_splitmix(s++));
            GPU_OK(cudaGetLastError());
            std::vector<float> sc((size_t)((N + 127) / 128) * ((K + 127) / 128));
            for (auto &v : sc)
                v = 1.2f / sqrtf((float)K);
            float *sd = dev_alloc<float>(c, sc.size());
            GPU_OK(cudaMemcpy(sd, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
            const int i = l * 4 + m;
            bf16 *y = dev_alloc<bf16>(c, (size_t)(m == 2 ? N / 2 : N));
            const bf16 *x = i == 0 ? x0 : ys[i - 1];
            c.ops.push_back({wt, sd, x, y, N, K, m == 2, i - 1});
            c.w_rows.push_back(wr);
            ys.push_back(y);
            bytes += (double)nk;
        }
    bf16 *act = dev_alloc<bf16>(c, F); /* the GEMV chain's SwiGLU output */
    void *ws = dev_alloc<uint8_t>(c, K_GEMV_WS_BYTES);
    GPU_OK(cudaMemset(ws, 0, K_GEMV_WS_BYTES));
    GPU_OK(cudaDeviceSynchronize());
    printf("\n== %d layers of Qwen3-14B's QKV, o_proj, gate/up, down: %.2f GB of fp8 weights a chain\n",
           layers, bytes / 1e9);

    cudaStream_t st;
    GPU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t gr;
    cudaGraphExec_t ex;
    GPU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int l = 0; l < layers; l++) {
        const k_chain_op *o = &c.ops[l * 4];
        const uint8_t *const *w = &c.w_rows[l * 4];
        K_OK(k_gemv_fp8_ex(o[0].x, w[0], o[0].w_scale, o[0].y, 0, 1, QKV, C, 0, 0, ws, st));
        K_OK(k_gemv_fp8_ex(o[1].x, w[1], o[1].w_scale, o[1].y, 0, 1, C, C, 0, 0, ws, st));
        K_OK(k_gemv_fp8_glu(o[2].x, w[2], o[2].w_scale, act, 1, F, C, st));
        K_OK(k_gemv_fp8_ex(act, w[3], o[3].w_scale, o[3].y, 0, 1, C, F, 0, 0, ws, st));
    }
    GPU_OK(cudaStreamEndCapture(st, &gr));
    GPU_OK(cudaGraphInstantiate(&ex, gr, 0));
    const double t_gemv = time_ms([&] { GPU_OK(cudaGraphLaunch(ex, 0)); });
    printf("GEMV chain (%d launches in a graph, PDL): %.3f ms, %.1f us a layer, %.2f TB/s\n", 4 * layers,
           t_gemv, 1e3 * t_gemv / layers, bytes / t_gemv / 1e9);
    GPU_OK(cudaGraphExecDestroy(ex));
    GPU_OK(cudaGraphDestroy(gr));
    GPU_OK(cudaStreamDestroy(st));

    /* the runs timed for each variant: what the flags take away */
    const struct {
        const char *what;
        int flags;
    } runs[] = {{"", 0},
                {", the measurement build", K_CHAIN_MEASURE},
                {", no waits", K_CHAIN_NO_WAIT},
                {", no waits, no products", K_CHAIN_NO_WAIT | K_CHAIN_NO_MATH},
                {", no copies (the consumers alone)", K_CHAIN_NO_COPY},
                {", no copies, no waits", K_CHAIN_NO_COPY | K_CHAIN_NO_WAIT}};
    for (int v : variants) {
        k_stream_chain *p;
        relayout(c, v);
        if (k_stream_chain_plan(c.ops.data(), (int)c.ops.size(), v, &p)) {
            printf("variant %d: %s\n", v, k_last_error());
            continue;
        }
        char desc[200];
        k_stream_chain_describe(p, desc, sizeof desc);
        for (const auto &r : runs) {
            const double t = time_ms([&] { K_OK(k_stream_chain_run(p, r.flags, 0)); });
            printf("stream chain v%d (%s%s): %.3f ms, %.1f us a layer, %.2f TB/s, %.3fx the GEMV chain's "
                   "speed\n",
                   v, desc, r.what, t, 1e3 * t / layers, bytes / t / 1e9, t_gemv / t);
        }
        profile(p, (int)c.ops.size());
        k_stream_chain_free(p);
    }
    chain_free(c);
    return 0;
}

/* ---- `--bench-copy`: how fast one CTA an SM streams bytes into the SM (no products), for the chain's
 * design choices: the copy engine into a ring of shared-memory stages against 16-byte register loads,
 * each SM over its own contiguous region or all SMs over neighbouring chunks (stage j of CTA c is
 * chunk j G + c). */

#include "kernels/tma.cuh"

template <int NW>
__global__ void __launch_bounds__((NW + 1) * 32, 1)
    copy_probe(const uint8_t *__restrict__ buf, size_t per_sm, int stage, int nst, int mode, unsigned *sink)
{
#ifdef K_WGMMA
    extern __shared__ __align__(1024) unsigned char sm[];
    const int G = gridDim.x, c = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long chunks = (long long)(per_sm / stage);
    auto at = [&](long long j) {
        return buf + (mode & 1 ? ((size_t)j * G + c) * stage : (size_t)c * per_sm + (size_t)j * stage);
    };
    if (mode >= 2) { /* registers: warp w takes 4 KB pieces w, w + NW + 1, ... of the chunks in order */
        unsigned x = 0;
        const int pieces = stage / 4096;
        for (long long q = warp; q < chunks * pieces; q += NW + 1) {
            const uint8_t *p = at(q / pieces) + (size_t)(q % pieces) * 4096 + lane * 16;
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                             : "l"(p + u * 512));
#pragma unroll
            for (int u = 0; u < 8; u++)
                x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        if (x == 0x12345678u)
            *sink = x;
        return;
    }
    uint64_t *bars = (uint64_t *)(sm + (size_t)nst * stage);
    const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * nst;
    if (threadIdx.x == 0)
        for (int i = 0; i < nst; i++)
            mbar_init(full0 + 8 * i, 1), mbar_init(empty0 + 8 * i, NW);
    __syncthreads();
    if (warp == NW) {
        if (lane == 0)
            for (long long j = 0; j < chunks; j++) {
                const int slot = (int)(j % nst);
                if (j >= nst)
                    mbar_wait(empty0 + 8 * slot, (uint32_t)((j / nst - 1) & 1));
                mbar_arrive_expect_tx(full0 + 8 * slot, stage);
                bulk_load(ring0 + (uint32_t)slot * stage, at(j), stage, full0 + 8 * slot);
            }
        return;
    }
    for (long long j = 0; j < chunks; j++) {
        const int slot = (int)(j % nst);
        mbar_wait(full0 + 8 * slot, (uint32_t)((j / nst) & 1));
        __syncwarp();
        if (lane == 0)
            mbar_arrive(empty0 + 8 * slot);
    }
#endif
}

static int bench_copy(void)
{
    int sms, smem_max;
    GPU_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    GPU_OK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    const size_t total = (size_t)8 << 30, per_sm = (total / sms) & ~(size_t)0xffff;
    uint8_t *buf;
    unsigned *sink;
    GPU_OK(cudaMalloc(&buf, total));
    GPU_OK(cudaMemset(buf, 1, total));
    GPU_OK(cudaMalloc(&sink, 4));
    const double bytes = (double)per_sm * sms;
    printf("\n== one CTA an SM streaming %.2f GB (%.1f MB an SM), no products\n", bytes / 1e9, per_sm / 1e6);
    const char *mn[4] = {"copy engine, own region", "copy engine, neighbouring chunks",
                         "registers, own region", "registers, neighbouring chunks"};
    for (int mode = 0; mode < 4; mode++)
        for (int kb : {4, 8, 16, 32, 64})
            for (int ring_kb : {96, 192}) {
                if (mode >= 2 && (ring_kb != 96 || kb < 16))
                    continue;
                const int stage = kb << 10, nst = ring_kb / kb;
                if (mode < 2 && nst < 2)
                    continue;
                const size_t smem = mode < 2 ? (size_t)nst * stage + 16 * nst : 0;
                auto kern = copy_probe<16>;
                GPU_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                const double t = time_ms([&] {
                    kern<<<sms, 17 * 32, smem>>>(buf, per_sm, stage, nst, mode, sink);
                    GPU_OK(cudaGetLastError());
                });
                if (mode < 2)
                    printf("%-34s stages of %2d KB x %2d (%3d KB in flight): %.2f TB/s\n", mn[mode], kb, nst,
                           nst * kb, bytes / t / 1e9);
                else
                    printf("%-34s 17 warps, 8 loads of 16 B in flight a lane, %2d KB chunks: %.2f TB/s\n",
                           mn[mode], kb, bytes / t / 1e9);
            }
    GPU_OK(cudaFree(buf));
    GPU_OK(cudaFree(sink));
    return 0;
}

int main(int argc, char **argv)
{
    gpu_require();
    base_seed = gt_seed();
    {
        dev_chain c = make_chain({{16, 64, 0, -1}}, 1);
        k_stream_chain *p = NULL;
        if (k_stream_chain_plan(c.ops.data(), 1, 0, &p) != 0 && strstr(k_last_error(), "sm_90a")) {
            printf("SKIPPED: %s\n", k_last_error());
            return 77;
        }
        k_stream_chain_free(p);
        chain_free(c);
    }
    if (argc > 1 && !strcmp(argv[1], "--bench-copy"))
        return bench_copy();
    /* --bench [layers [variant...]] (default: every variant) */
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        std::vector<int> vs;
        for (int a = 3; a < argc; a++)
            vs.push_back(atoi(argv[a]));
        if (vs.empty())
            for (int v = 0; v < K_CHAIN_VARIANTS; v++)
                vs.push_back(v);
        return bench(argc > 2 ? atoi(argv[2]) : 40, vs);
    }
    uint64_t k = 1;
    auto seed = [&]() { return gt_splitmix(base_seed + k++); };

    printf("\n== argument errors\n");
    argument_checks();

    printf("\n== small chains, every variant\n");
    run_case("one step in all (most CTAs idle)", {{16, 64, 0, -1}}, seed());
    run_case("SwiGLU output, external input", {{96, 128, 1, -1}}, seed());
    run_case("two layers of a small model",
             {{512, 256, 0, -1},
              {256, 256, 0, 0},
              {768, 256, 1, 1},
              {256, 384, 0, 2},
              {512, 256, 0, 3},
              {256, 256, 0, 4},
              {768, 256, 1, 5},
              {256, 384, 0, 6}},
             seed());
    run_case("tiles cut between CTAs (3 steps a CTA; 50-step tiles over ~19 CTAs)",
             {{2128, 192, 0, -1}, {112, 2112, 0, 0}, {64, 64, 0, 1}}, seed());

    printf("\n== one layer of Qwen3-14B's shapes, then the next QKV\n");
    run_case("Qwen3-14B",
             {{7168, 5120, 0, -1},
              {5120, 5120, 0, 0},
              {34816, 5120, 1, 1},
              {5120, 17408, 0, 2},
              {7168, 5120, 0, 3}},
             seed());

    printf("\n%d passed, %d failed\n", gt_passes, gt_failures);
    for (int i = 0; i < gt_n_failed; i++)
        printf("  failed: %s\n", gt_failed[i]);
    return gt_failures ? 1 : 0;
}
