/* Kernel tests: k_attention_prefill and k_attention_decode (kernels/attention.cu) against a
 * double-precision reference computed here by plain loops over the same paged cache, plus timing.
 *
 * Inputs: the KV pool is poisoned (bf16 0xFFFF = NaN) and only the slots of each sequence's
 * positions 0 .. ctx-1 get random values; block tables are a random permutation of the pool, so a
 * sequence's blocks are shuffled and non-contiguous; table entries past a sequence's blocks point
 * at spare (poisoned) blocks. Reading a wrong block, a slot past the context, or a key the causal
 * mask excludes makes NaN. q sits inside a qkv-shaped buffer (stride (H + 2*KVH) * D) whose k/v
 * parts are poisoned too. Outputs are poisoned before every run and every element of every row must
 * be finite afterwards, also in rows whose value is not compared.
 *
 * Tolerance. The kernels compute S = Q K^T exactly enough (bf16 products, fp32 sums), the softmax
 * in fp32, round the probabilities P to bf16 for the P·V tensor-core product (relative error
 * <= 2^-9 per weight, random across keys) and round the output to bf16 (<= 2^-9 per element). Each
 * rounding alone gives a norm-relative error of about 2^-9 / sqrt(3) = 1.1e-3, so ~2e-3 is
 * expected. Checks: ||got - ref|| / ||ref|| over a case <= 1e-2, and the worst single (token, head)
 * row's relative error <= 2.5e-2 (a row has only D elements, so its error is noisier). A missing or
 * extra key moves a row by about its softmax weight, far above 1e-2 for the short rows and for
 * the sharp score distributions these inputs have (q ~ 2 N(0,1), k ~ N(0,1): scores ~ N(0, 4)).
 *
 * fp8 cache (k_attention_prefill_fp8 / k_attention_decode_fp8): the same cases over an e4m3 pool with
 * one fp32 scale per (token, KV head), quantized here from random vectors whose magnitudes vary by
 * 2^-4 .. 2^2 from vector to vector (so the scales matter) with engine/dtype.h's f32_to_e4m3; the
 * reference dequantizes the same bytes (e4m3_to_f32(code) * scale) in double. Unwritten codes are
 * 0x7F (NaN) and unwritten scales NaN. The kernels' arithmetic over the codes is the bf16 path's
 * (codes are exact in bf16; the scales multiply fp32 scores and the probabilities before their bf16
 * rounding), so the tolerances are the same. Every fp8 prefill case also runs as the engine runs it:
 * the blocks staged as bf16 (k_kv_stage_fp8, itself checked bit for bit by stage_case), then the bf16
 * kernels over them, against the reference over the staged (bf16-rounded) values.
 *
 * Every prefill case runs each kernel the engine can take on some device (k_test_prefill_path,
 * kernels/test_paths.h): the automatic choice, the mma.sync kernel of devices without wgmma (and of D = 64),
 * and on sm_90a the wgmma kernel's cp.async fallback.
 *
 * fp16 mode (k_set_f16(1), model.dtype fp16): the 16-bit launchers' cases (every prefill path, decode,
 * split decode, the decode with the RoPE prologue folded in)
 * run again with q, the cache and the rope weights uploaded as fp16 and the reference reading the fp16
 * values, over a representative subset to bound the run time: D 64 and 128, GQA 1 to 16, block sizes
 * 16..256 (the tensor-map shapes), short and 32k contexts, automatic, forced and no splits. The fp8
 * launchers are bf16 only and must refuse fp16 mode (fp16_refusals). Tolerance: the same two roundings
 * (P for P·V, the output) with fp16's 10-bit mantissa, 2^3 times finer than bf16's: a relative error
 * of ~2^-10 / sqrt(12) ~ 2e-4 each (bf16: 1.7e-3), ~3e-4 together. Checks: norm <= 8e-4, worst row
 * <= 3e-3 (the bf16 tolerances / 8, the norm one a little tighter still). A single bf16 rounding left
 * in an fp16 path (P, the output, Q or a cache row) adds >= 1.7e-3 to the norm error and fails.
 *
 * Every check line names the mode ("bf16" or "fp16").
 *
 * Large cases check a random sample of query rows (always the first and last rows of each
 * sequence) against the reference to bound the host time. Seeds are fresh per run (printed;
 * LLMQ_TEST_SEED=N reproduces a run). */
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <time.h>
#include <vector>

#include "gpu/gpu_test.h"
#include "kernels/test_paths.h"

extern "C" {
#include "engine/dtype.h"
#include "engine/fp8.h"
}

#define TOL_NORM 1e-2
#define TOL_ROW 2.5e-2
#define TOL_NORM_F16 8e-4 /* fp16 mode: header comment */
#define TOL_ROW_F16 3e-3
#define Q_SCALE 2.0f
#define REF_BUDGET 2e10 /* double flops of reference per prefill case before rows are sampled */

static int failures = 0, cases = 0;
static uint64_t base_seed;

static uint64_t case_seed(uint64_t k)
{
    uint64_t z = base_seed + k * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) | 1;
}

static double tol_norm(void)
{
    return gt_f16 ? TOL_NORM_F16 : TOL_NORM;
}
static double tol_row(void)
{
    return gt_f16 ? TOL_ROW_F16 : TOL_ROW;
}

/* Runs f(i) for i in [0, n) on all host cores. */
template <typename F> static void parallel_for(int n, F f)
{
    int nt = (int)std::thread::hardware_concurrency();
    nt = std::max(1, std::min(nt, 64));
    std::atomic<int> next(0);
    std::vector<std::thread> th;
    for (int t = 0; t < nt; t++)
        th.emplace_back([&]() {
            for (int i; (i = next.fetch_add(1)) < n;)
                f(i);
        });
    for (auto &t : th)
        t.join();
}

struct cfg {
    int H, KVH, D, bs;
};

/* One batch over one layer's paged cache, on the host and the device. */
struct paged {
    cfg c{};
    int n = 0, max_blocks = 0, num_blocks = 0, max_q = 0, max_ctx = 0, total_q = 0, q_stride = 0;
    std::vector<int> nq, ctx;
    std::vector<int32_t> q_start, btab;
    std::vector<uint16_t> k, v, q; /* bf16 bits: pool [num_blocks][KVH][bs][D], q [total_q][q_stride] */
    bf16 *dk = nullptr, *dv = nullptr, *dq = nullptr, *dout = nullptr;
    int32_t *dqs = nullptr, *dctx = nullptr, *dbt = nullptr;
    /* fp8 cache: codes [num_blocks][KVH][bs][D], scales [num_blocks][KVH][bs] (k and v unused);
       staged: the reference reads each value as k_kv_stage_fp8 leaves it (rounded to bf16) */
    bool f8 = false, staged = false;
    std::vector<uint8_t> k8, v8;
    std::vector<float> ks, vs;
    uint8_t *dk8 = nullptr, *dv8 = nullptr;
    float *dks = nullptr, *dvs = nullptr;

    size_t slot(int s, int j, int kvh) const
    {
        size_t blk = (size_t)btab[(size_t)s * max_blocks + j / c.bs];
        return (blk * c.KVH + kvh) * c.bs + j % c.bs;
    }
    const uint16_t *krow(int s, int j, int kvh) const { return &k[slot(s, j, kvh) * c.D]; }
    const uint16_t *vrow(int s, int j, int kvh) const { return &v[slot(s, j, kvh) * c.D]; }
    /* row j of K (or V) as the kernels must see it, in double */
    void row(bool is_v, int s, int j, int kvh, double *out) const
    {
        const size_t at = slot(s, j, kvh);
        if (f8) {
            const uint8_t *cd = &(is_v ? v8 : k8)[at * c.D];
            const double sc = (is_v ? vs : ks)[at];
            for (int d = 0; d < c.D; d++)
                out[d] = staged ? bf16_to_f32(f32_to_bf16(e4m3_to_f32(cd[d]) * (float)sc))
                                : (double)e4m3_to_f32(cd[d]) * sc;
        } else {
            const uint16_t *r = &(is_v ? v : k)[at * c.D];
            for (int d = 0; d < c.D; d++)
                out[d] = gt_h2f(r[d]);
        }
    }
    k_attn_batch batch() const
    {
        k_attn_batch b;
        b.n_seqs = n, b.q_start = dqs, b.ctx_len = dctx, b.block_tables = dbt, b.max_blocks = max_blocks;
        b.max_q_len = max_q, b.max_ctx_len = max_ctx;
        return b;
    }
    size_t out_elems() const { return (size_t)total_q * c.H * c.D; }
    void free_dev()
    {
        cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dqs), cudaFree(dctx),
            cudaFree(dbt), cudaFree(dk8), cudaFree(dv8), cudaFree(dks), cudaFree(dvs);
        dk = dv = dq = dout = nullptr, dqs = dctx = dbt = nullptr, dk8 = dv8 = nullptr, dks = dvs = nullptr;
    }
};

/* Builds the pool (bf16, or fp8 when f8), tables and q for sequences (nq[s], ctx[s]) and uploads them. */
static void build(paged &P, const cfg &c, const std::vector<int> &nq, const std::vector<int> &ctx,
                  uint64_t seed, bool f8 = false)
{
    P.c = c, P.nq = nq, P.ctx = ctx, P.n = (int)nq.size(), P.f8 = f8;
    std::vector<int> need(P.n);
    int used = 0;
    P.max_blocks = 1, P.max_q = 0, P.max_ctx = 0, P.total_q = 0;
    P.q_start.assign(P.n + 1, 0);
    for (int s = 0; s < P.n; s++) {
        need[s] = (ctx[s] + c.bs - 1) / c.bs;
        used += need[s];
        P.max_blocks = std::max(P.max_blocks, need[s] + 1); /* one spare column: entries past the end */
        P.max_q = std::max(P.max_q, nq[s]), P.max_ctx = std::max(P.max_ctx, ctx[s]);
        P.q_start[s + 1] = P.q_start[s] + nq[s];
    }
    P.total_q = P.q_start[P.n];
    const int spare = std::max(8, used / 16);
    P.num_blocks = used + spare;
    std::vector<int32_t> perm(P.num_blocks);
    for (int i = 0; i < P.num_blocks; i++)
        perm[i] = i;
    for (int i = P.num_blocks - 1; i > 0; i--)
        std::swap(perm[i], perm[gt_next(&seed) % (uint64_t)(i + 1)]);
    P.btab.assign((size_t)P.n * P.max_blocks, 0);
    int off = 0;
    for (int s = 0; s < P.n; s++) {
        for (int b = 0; b < P.max_blocks; b++)
            P.btab[(size_t)s * P.max_blocks + b] =
                b < need[s] ? perm[off + b] : perm[used + (int)(gt_next(&seed) % (uint64_t)spare)];
        off += need[s];
    }
    const size_t pool = (size_t)P.num_blocks * c.KVH * c.bs * c.D;
    std::vector<uint64_t> seeds(P.n);
    for (int s = 0; s < P.n; s++)
        seeds[s] = gt_next(&seed) | 1;
    if (f8) {
        P.k8.assign(pool, 0x7F), P.v8.assign(pool, 0x7F); /* NaN codes */
        P.ks.assign(pool / c.D, NAN), P.vs.assign(pool / c.D, NAN);
        parallel_for(P.n, [&](int s) {
            uint64_t st = seeds[s];
            std::vector<float> xk(c.D), xv(c.D);
            for (int j = 0; j < P.ctx[s]; j++)
                for (int h = 0; h < c.KVH; h++) {
                    /* vector magnitudes 2^-4 .. 2^2 (K: 2^-1 .. 2^1, keeping the scores' spread) */
                    const float mk = exp2f(gt_uniform(&st)), mv = exp2f(gt_uniform(&st) * 3.f - 1.f);
                    for (int d = 0; d < c.D; d++)
                        xk[d] = gt_normal(&st) * mk, xv[d] = gt_normal(&st) * mv;
                    const size_t at = P.slot(s, j, h);
                    P.ks[at] = fp8_kv_quantize(xk.data(), c.D, &P.k8[at * c.D]);
                    P.vs[at] = fp8_kv_quantize(xv.data(), c.D, &P.v8[at * c.D]);
                }
        });
        P.dk8 = gt_to_device(P.k8.data(), pool);
        P.dv8 = gt_to_device(P.v8.data(), pool);
        P.dks = gt_to_device(P.ks.data(), pool / c.D);
        P.dvs = gt_to_device(P.vs.data(), pool / c.D);
    } else {
        P.k.assign(pool, 0xFFFF), P.v.assign(pool, 0xFFFF);
        parallel_for(P.n, [&](int s) {
            uint64_t st = seeds[s];
            for (int j = 0; j < P.ctx[s]; j++)
                for (int h = 0; h < c.KVH; h++) {
                    uint16_t *kr = const_cast<uint16_t *>(P.krow(s, j, h)),
                             *vr = const_cast<uint16_t *>(P.vrow(s, j, h));
                    for (int d = 0; d < c.D; d++)
                        kr[d] = gt_f2h(gt_normal(&st)), vr[d] = gt_f2h(gt_normal(&st));
                }
        });
        P.dk = gt_to_device((const bf16 *)P.k.data(), pool);
        P.dv = gt_to_device((const bf16 *)P.v.data(), pool);
    }
    P.q_stride = (c.H + 2 * c.KVH) * c.D;
    P.q.assign((size_t)std::max(P.total_q, 1) * P.q_stride, 0xFFFF);
    for (int t = 0; t < P.total_q; t++)
        for (int i = 0; i < c.H * c.D; i++)
            P.q[(size_t)t * P.q_stride + i] = gt_f2h(gt_normal(&seed) * Q_SCALE);

    P.dq = gt_to_device((const bf16 *)P.q.data(), P.q.size());
    P.dqs = gt_to_device(P.q_start.data(), P.q_start.size());
    std::vector<int32_t> ctx32(ctx.begin(), ctx.end());
    P.dctx = gt_to_device(ctx32.data(), ctx32.size());
    P.dbt = gt_to_device(P.btab.data(), P.btab.size());
    P.dout = gt_poisoned<bf16>(std::max<size_t>(P.out_elems(), 1));
}

/* Reference output of query i of sequence s, head h (D doubles). */
static void ref_row(const paged &P, int s, int i, int h, double *out)
{
    const cfg &c = P.c;
    const int G = c.H / c.KVH, kvh = h / G;
    const int qpos = P.ctx[s] - P.nq[s] + i;
    const uint16_t *qr = &P.q[(size_t)(P.q_start[s] + i) * P.q_stride + (size_t)h * c.D];
    std::vector<double> q(c.D), sc(qpos + 1), kr(c.D), vr(c.D);
    for (int d = 0; d < c.D; d++)
        q[d] = gt_h2f(qr[d]);
    const double scale = 1.0 / sqrt((double)c.D);
    double m = -INFINITY;
    for (int j = 0; j <= qpos; j++) {
        P.row(false, s, j, kvh, kr.data());
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (int d = 0; d < c.D; d += 4) {
            a0 += q[d] * kr[d], a1 += q[d + 1] * kr[d + 1];
            a2 += q[d + 2] * kr[d + 2], a3 += q[d + 3] * kr[d + 3];
        }
        sc[j] = (a0 + a1 + a2 + a3) * scale;
        m = std::max(m, sc[j]);
    }
    double sum = 0;
    for (int d = 0; d < c.D; d++)
        out[d] = 0;
    for (int j = 0; j <= qpos; j++) {
        const double p = exp(sc[j] - m);
        sum += p;
        P.row(true, s, j, kvh, vr.data());
        for (int d = 0; d < c.D; d++)
            out[d] += p * vr[d];
    }
    for (int d = 0; d < c.D; d++)
        out[d] /= sum;
}

struct qrow {
    int s, i;
};

/* Reference outputs of the given rows, all heads: [rows][H][D]. */
static std::vector<double> reference(const paged &P, const std::vector<qrow> &rows)
{
    const int HD = P.c.H * P.c.D;
    std::vector<double> ref((size_t)rows.size() * HD);
    parallel_for((int)rows.size() * P.c.H, [&](int k) {
        const int r = k / P.c.H, h = k % P.c.H;
        ref_row(P, rows[r].s, rows[r].i, h, &ref[(size_t)r * HD + (size_t)h * P.c.D]);
    });
    return ref;
}

/* Compares the device output with the reference on the given rows (all heads); every row of the
 * output must be finite. One printed line; returns 1 on pass. */
static int check(const char *what, const paged &P, const std::vector<qrow> &rows,
                 const std::vector<double> &ref)
{
    const cfg &c = P.c;
    const size_t n_out = P.out_elems();
    std::vector<uint16_t> got(n_out);
    GPU_OK(cudaDeviceSynchronize());
    GPU_OK(cudaMemcpy(got.data(), P.dout, n_out * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n_out; i++) {
        float f = gt_h2f(got[i]);
        if (!std::isfinite(f)) {
            size_t t = i / ((size_t)c.H * c.D), h = i / c.D % c.H;
            printf("FAIL %s %s: output row %zu head %zu element %zu is %f (unwritten or bad read)\n",
                   gt_mode_name(), what, t, h, i % c.D, f);
            return 0;
        }
    }
    const int HD = c.H * c.D;
    double num = 0, den = 0, worst_row = 0;
    int wr_s = 0, wr_i = 0, wr_h = 0;
    for (size_t r = 0; r < rows.size(); r++) {
        const size_t t = (size_t)P.q_start[rows[r].s] + rows[r].i;
        for (int h = 0; h < c.H; h++) {
            double rn = 0, rd = 0;
            for (int d = 0; d < c.D; d++) {
                const double g = gt_h2f(got[t * HD + (size_t)h * c.D + d]),
                             e = ref[r * HD + (size_t)h * c.D + d];
                rn += (g - e) * (g - e), rd += e * e;
            }
            num += rn, den += rd;
            const double rel = sqrt(rn / std::max(rd, 1e-30));
            if (rel > worst_row)
                worst_row = rel, wr_s = rows[r].s, wr_i = rows[r].i, wr_h = h;
        }
    }
    const double rel = sqrt(num / std::max(den, 1e-30));
    const int ok = rel <= tol_norm() && worst_row <= tol_row();
    printf("%s %s %s: rel err %.3e (tol %.0e), worst row %.3e (tol %.1e; seq %d query %d head %d), %zu rows "
           "checked\n",
           ok ? "ok  " : "FAIL", gt_mode_name(), what, rel, tol_norm(), worst_row, tol_row(), wr_s, wr_i,
           wr_h, rows.size());
    fflush(stdout);
    return ok;
}

static void tally(int ok)
{
    cases++;
    if (!ok)
        failures++;
}

static const char *cfg_name(const cfg &c, char *buf, size_t n)
{
    snprintf(buf, n, "H%d/KVH%d D%d bs%d", c.H, c.KVH, c.D, c.bs);
    return buf;
}

/* ---- prefill */

/* The prefill paths a case runs (k_test_prefill_path): the mma.sync kernel everywhere; the automatic choice
 * and the cp.async fallback only at D = 128 where the device and the build have wgmma (elsewhere both are
 * the mma.sync kernel). */
static bool prefill_runs(int path, int D)
{
    if (path == K_TEST_PREFILL_MMA)
        return true;
    const bool on = D == 128 && k_test_prefill_path(K_TEST_PREFILL_CPASYNC) == 0;
    k_test_prefill_path(K_TEST_PREFILL_AUTO);
    return on;
}

/* Every prefill path, and whether a case runs it: an fp8 cache's wgmma kernel always loads by cp.async
 * (its automatic path). */
static const int prefill_paths[] = {K_TEST_PREFILL_MMA, K_TEST_PREFILL_AUTO, K_TEST_PREFILL_CPASYNC};
static bool prefill_case_runs(int path, int D, bool f8)
{
    return prefill_runs(path, D) && !(f8 && path == K_TEST_PREFILL_CPASYNC);
}

static const char *prefill_path_name(int path)
{
    return path == K_TEST_PREFILL_AUTO      ? "wgmma, 128 rows/CTA"
           : path == K_TEST_PREFILL_CPASYNC ? "wgmma, 128 rows/CTA, cp.async tiles"
                                            : "mma.sync, 128 rows/CTA";
}

/* The engine's fp8 prefill: every block the batch reads staged as bf16 (k_kv_stage_fp8, blocks listed
 * sequence by sequence, each sequence's table remapped to its staged blocks, entries past its blocks to
 * staged block 0), then the bf16 kernels over the staged pool, against the reference over the staged
 * values (stage_case checks them bit for bit). Against the unrounded fp8 values the staging's one more
 * rounding (relative 2^-9 on K and V, like a bf16 cache's own, 32 times below e4m3's) moves these sharp
 * rows by up to ~4e-2 (measured on the H200), over the per-row tolerance meant for the kernels'
 * arithmetic. */
static void staged_prefill(const char *label, paged &P, const std::vector<qrow> &rows)
{
    P.staged = true;
    const std::vector<double> ref = reference(P, rows);
    const cfg &c = P.c;
    std::vector<int32_t> list, remap((size_t)P.n * P.max_blocks, 0);
    for (int s = 0; s < P.n; s++) {
        const int need = (P.ctx[s] + c.bs - 1) / c.bs;
        for (int j = 0; j < need; j++) {
            remap[(size_t)s * P.max_blocks + j] = (int32_t)list.size();
            list.push_back(P.btab[(size_t)s * P.max_blocks + j]);
        }
    }
    const size_t blk = (size_t)c.KVH * c.bs * c.D, n_st = std::max<size_t>(list.size(), 1);
    int32_t *dlist = gt_to_device(list.data(), std::max<size_t>(list.size(), 1)),
            *dremap = gt_to_device(remap.data(), remap.size());
    bf16 *sk = gt_poisoned<bf16>(n_st * blk), *sv = gt_poisoned<bf16>(n_st * blk);
    K_OK(k_kv_stage_fp8(P.dk8, P.dv8, P.dks, P.dvs, dlist, (int)list.size(), sk, sv, c.KVH, c.D, c.bs, 0));
    k_attn_batch b = P.batch();
    b.block_tables = dremap;
    const float scale = 1.f / sqrtf((float)c.D);
    char name[220], cn[64];
    for (int v : {K_TEST_PREFILL_MMA, K_TEST_PREFILL_AUTO}) {
        if (!prefill_runs(v, c.D))
            continue;
        k_test_prefill_path(v);
        GPU_OK(cudaMemset(P.dout, 0xff, P.out_elems() * 2));
        K_OK(k_attention_prefill(P.dq, P.q_stride, sk, sv, &b, P.dout, c.H, c.KVH, c.D, c.bs, scale, 0));
        snprintf(name, sizeof name, "prefill fp8 staged as bf16 %s %s (%d seqs, max n_q %d, max ctx %d, %s)",
                 label, cfg_name(c, cn, sizeof cn), P.n, P.max_q, P.max_ctx, prefill_path_name(v));
        tally(check(name, P, rows, ref));
    }
    k_test_prefill_path(K_TEST_PREFILL_AUTO);
    P.staged = false;
    cudaFree(dlist), cudaFree(dremap), cudaFree(sk), cudaFree(sv);
}

/* k_kv_stage_fp8 bit for bit against e4m3_to_f32(code) * scale in fp32, rounded to bf16 (f32_to_bf16):
 * every code (NaN ones too: NaN in, NaN out), scales of many magnitudes and 0, blocks listed out of
 * order and twice; the outputs past the listed blocks keep their poison. */
static void stage_case(int KVH, int D, int bs, uint64_t seed)
{
    cases++;
    const int num_blocks = 37, n_list = 50;
    const size_t blk = (size_t)KVH * bs * D, rows = (size_t)num_blocks * KVH * bs;
    std::vector<uint8_t> k8(num_blocks * blk), v8(num_blocks * blk);
    std::vector<float> ks(rows), vs(rows);
    for (size_t i = 0; i < k8.size(); i++)
        k8[i] = (uint8_t)gt_next(&seed), v8[i] = (uint8_t)(i * 7 + 3);
    for (size_t i = 0; i < rows; i++) {
        ks[i] = i % 97 == 0 ? 0.f : exp2f(gt_uniform(&seed) * 40.f - 30.f) * (1.f + gt_uniform(&seed));
        vs[i] = exp2f(gt_uniform(&seed) * 12.f - 10.f);
    }
    std::vector<int32_t> list(n_list);
    for (int j = 0; j < n_list; j++)
        list[j] = (int32_t)(gt_next(&seed) % num_blocks);
    uint8_t *dk8 = gt_to_device(k8.data(), k8.size()), *dv8 = gt_to_device(v8.data(), v8.size());
    float *dks = gt_to_device(ks.data(), rows), *dvs = gt_to_device(vs.data(), rows);
    int32_t *dl = gt_to_device(list.data(), list.size());
    /* one spare block past the list: it must stay poisoned */
    bf16 *ok = gt_poisoned<bf16>((n_list + 1) * blk), *ov = gt_poisoned<bf16>((n_list + 1) * blk);
    K_OK(k_kv_stage_fp8(dk8, dv8, dks, dvs, dl, n_list, ok, ov, KVH, D, bs, 0));
    std::vector<uint16_t> gk((n_list + 1) * blk), gv((n_list + 1) * blk);
    GPU_OK(cudaMemcpy(gk.data(), ok, gk.size() * 2, cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(gv.data(), ov, gv.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int j = 0; j < n_list; j++)
            for (size_t e = 0; e < blk; e++) {
                const size_t at = (size_t)list[j] * blk + e;
                const float x = e4m3_to_f32((kv ? v8 : k8)[at]) * (kv ? vs : ks)[at / D];
                const uint16_t want = f32_to_bf16(x), got = (kv ? gv : gk)[(size_t)j * blk + e];
                const bool same = std::isnan(x) ? (got & 0x7fff) > 0x7f80 : got == want;
                if (!same && !bad++)
                    first = (size_t)kv << 40 | (size_t)j * blk + e;
            }
    for (size_t e = 0; e < blk; e++)
        if (gk[(size_t)n_list * blk + e] != 0xffff || gv[(size_t)n_list * blk + e] != 0xffff)
            bad++;
    printf("%s: %s kv stage fp8 -> bf16 KVH%d D%d bs%d (%d blocks): %zu elements differ%s\n",
           bad ? "FAIL" : "ok", gt_mode_name(), KVH, D, bs, n_list, bad,
           bad ? " (or the spare block was written)" : "");
    if (bad) {
        failures++;
        printf("  first: %s, staged block %zu, element %zu\n", first >> 40 ? "V" : "K",
               (first & (((size_t)1 << 40) - 1)) / blk, (first & (((size_t)1 << 40) - 1)) % blk);
    }
    cudaFree(dk8), cudaFree(dv8), cudaFree(dks), cudaFree(dvs), cudaFree(dl), cudaFree(ok), cudaFree(ov);
}

static void prefill_case(const char *label, const cfg &c, const std::vector<int> &nq,
                         const std::vector<int> &ctx, uint64_t seed, bool f8 = false)
{
    paged P;
    build(P, c, nq, ctx, seed, f8);
    /* rows to check: all, or a random sample within REF_BUDGET (first/last two of each sequence kept) */
    double cost = 0;
    for (int s = 0; s < P.n; s++)
        cost += (double)nq[s] * ctx[s] * c.H * c.D * 4;
    const double frac = std::min(1.0, REF_BUDGET / std::max(cost, 1.0));
    std::vector<qrow> rows;
    uint64_t st = seed ^ 0x5555;
    for (int s = 0; s < P.n; s++)
        for (int i = 0; i < nq[s]; i++)
            if (i < 2 || i >= nq[s] - 2 || frac >= 1.0 ||
                (gt_next(&st) >> 11) * (1.0 / 9007199254740992.0) < frac)
                rows.push_back({s, i});

    const std::vector<double> ref = reference(P, rows);
    k_attn_batch b = P.batch();
    const float scale = 1.f / sqrtf((float)c.D);
    char name[200], cn[64];
    for (int v : prefill_paths) {
        if (!prefill_case_runs(v, c.D, f8))
            continue; /* no wgmma here (said once, in main) */
        k_test_prefill_path(v);
        GPU_OK(cudaMemset(P.dout, 0xff, P.out_elems() * 2));
        if (f8)
            K_OK(k_attention_prefill_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H, c.KVH,
                                         c.D, c.bs, scale, 0));
        else
            K_OK(k_attention_prefill(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, c.bs, scale,
                                     0));
        snprintf(name, sizeof name, "prefill%s %s %s (%d seqs, max n_q %d, max ctx %d, %s)", f8 ? " fp8" : "",
                 label, cfg_name(c, cn, sizeof cn), P.n, P.max_q, P.max_ctx, prefill_path_name(v));
        tally(check(name, P, rows, ref));
    }
    k_test_prefill_path(K_TEST_PREFILL_AUTO);
    if (f8)
        staged_prefill(label, P, rows);
    P.free_dev();
}

/* ---- decode */

static void decode_case(const cfg &c, const std::vector<int> &ctx, int split_part, uint64_t seed,
                        bool f8 = false)
{
    paged P;
    std::vector<int> nq(ctx.size(), 1);
    build(P, c, nq, ctx, seed, f8);
    std::vector<qrow> rows;
    for (int s = 0; s < P.n; s++)
        rows.push_back({s, 0});
    const std::vector<double> ref = reference(P, rows);
    k_attn_batch b = P.batch();
    const float scale = 1.f / sqrtf((float)c.D);
    char name[200], cn[64];
    struct mode {
        const char *name;
        int part; /* 0 auto, -1 none, > 0 forced */
    } modes[] = {{"auto", 0}, {"no split", -1}, {"split", split_part}};
    for (const mode &m : modes) {
        const size_t ws_bytes = m.part == 0
                                    ? k_attention_decode_workspace(P.n, c.H, c.D, P.max_ctx)
                                    : k_attention_decode_workspace_split(P.n, c.H, c.D, P.max_ctx, m.part);
        void *ws = nullptr;
        if (ws_bytes) {
            GPU_OK(cudaMalloc(&ws, ws_bytes));
            GPU_OK(cudaMemset(ws, 0xff, ws_bytes));
        }
        GPU_OK(cudaMemset(P.dout, 0xff, P.out_elems() * 2));
        if (f8 && m.part == 0)
            K_OK(k_attention_decode_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H, c.KVH,
                                        c.D, c.bs, scale, ws, ws_bytes, 0));
        else if (f8)
            K_OK(k_attention_decode_split_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H,
                                              c.KVH, c.D, c.bs, scale, m.part, ws, ws_bytes, 0));
        else if (m.part == 0)
            K_OK(k_attention_decode(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, c.bs, scale,
                                    ws, ws_bytes, 0));
        else
            K_OK(k_attention_decode_split(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, c.bs,
                                          scale, m.part, ws, ws_bytes, 0));
        char part[32] = "";
        if (m.part > 0)
            snprintf(part, sizeof part, " %d keys", m.part);
        snprintf(name, sizeof name, "decode%s %s %d seqs, ctx %d..%d, %s%s (workspace %.1f MB)",
                 f8 ? " fp8" : "", cfg_name(c, cn, sizeof cn), P.n, *std::min_element(ctx.begin(), ctx.end()),
                 P.max_ctx, m.name, part, ws_bytes / 1e6);
        tally(check(name, P, rows, ref));
        GPU_OK(cudaFree(ws));
    }
    P.free_dev();
}

/* k_attention_decode_rope against its two-kernel equivalent, k_qk_norm_rope_kv then
 * k_attention_decode_split, on the same raw qkv rows and cache: the outputs and both whole cache pools
 * must be equal bit for bit (the prologue's per-lane arithmetic is one function), and qkv untouched.
 * The new key of each sequence is at position ctx - 1; partitions of part keys cover the cases where
 * its tile is one of the stages loaded before the wait and where the main loop reads it back. The
 * folded kernel's output is also checked against the reference over the two-kernel path's q (normalized
 * and rotated in place) and cache, with check()'s tolerances: the comparison is not only with a kernel
 * that computes the same way. */
/* RoPE inverse frequencies at theta 1e6 (Qwen3's) for head dim D */
static std::vector<float> rope_inv_freq(int D)
{
    std::vector<float> inv(D / 2);
    for (int i = 0; i < D / 2; i++)
        inv[i] = (float)pow(1e6, -2.0 * i / D);
    return inv;
}

static void rope_fold_case(const cfg &c, const std::vector<int> &ctx, int part, bool bias, bool norms,
                           float attn_scale, uint64_t seed)
{
    paged P;
    build(P, c, std::vector<int>(ctx.size(), 1), ctx, seed);
    const int n = P.n, QS = P.q_stride;
    std::vector<uint16_t> qkv((size_t)n * QS), hb(QS), hqn(c.D), hkn(c.D);
    uint64_t st = seed ^ 0x9e3779b97f4a7c15ull;
    for (auto &x : qkv)
        x = gt_f2h(gt_normal(&st) * Q_SCALE);
    for (auto &x : hb)
        x = gt_f2h(gt_normal(&st) * 0.5f);
    for (int d = 0; d < c.D; d++)
        hqn[d] = gt_f2h(1.f + 0.3f * gt_normal(&st)), hkn[d] = gt_f2h(1.f + 0.3f * gt_normal(&st));
    const std::vector<float> inv = rope_inv_freq(c.D);
    std::vector<int32_t> pos(n), slot(n);
    for (int s = 0; s < n; s++) {
        const int j = ctx[s] - 1;
        pos[s] = j;
        slot[s] = P.btab[(size_t)s * P.max_blocks + j / c.bs] * c.bs + j % c.bs;
    }
    const size_t pool = (size_t)P.num_blocks * c.KVH * c.bs * c.D, outn = (size_t)n * c.H * c.D;
    bf16 *q_raw = gt_to_device((const bf16 *)qkv.data(), qkv.size());
    bf16 *q_a = gt_to_device((const bf16 *)qkv.data(), qkv.size());
    bf16 *db = bias ? gt_to_device((const bf16 *)hb.data(), hb.size()) : nullptr;
    bf16 *dqn = norms ? gt_to_device((const bf16 *)hqn.data(), hqn.size()) : nullptr;
    bf16 *dkn = norms ? gt_to_device((const bf16 *)hkn.data(), hkn.size()) : nullptr;
    float *dinv = gt_to_device(inv.data(), inv.size());
    int32_t *dpos = gt_to_device(pos.data(), pos.size()), *dslot = gt_to_device(slot.data(), slot.size());
    bf16 *kc[2], *vc[2], *out[2];
    for (int i = 0; i < 2; i++) {
        GPU_OK(cudaMalloc(&kc[i], pool * 2));
        GPU_OK(cudaMalloc(&vc[i], pool * 2));
        GPU_OK(cudaMemcpy(kc[i], P.dk, pool * 2, cudaMemcpyDeviceToDevice));
        GPU_OK(cudaMemcpy(vc[i], P.dv, pool * 2, cudaMemcpyDeviceToDevice));
        out[i] = gt_poisoned<bf16>(outn);
    }
    const size_t wsb = k_attention_decode_workspace_split(n, c.H, c.D, P.max_ctx, part);
    void *ws = nullptr;
    if (wsb)
        GPU_OK(cudaMalloc(&ws, wsb));
    const k_attn_batch b = P.batch();
    const float scale = 1.f / sqrtf((float)c.D), eps = 1e-6f;
    K_OK(k_qk_norm_rope_kv(q_a, db, dqn, dkn, eps, dpos, dinv, attn_scale, dslot, kc[0], vc[0], n, c.H, c.KVH,
                           c.D, c.bs, 0));
    K_OK(k_attention_decode_split(q_a, QS, kc[0], vc[0], &b, out[0], c.H, c.KVH, c.D, c.bs, scale, part, ws,
                                  wsb, 0));
    const k_rope_in rope = {db, dqn, dkn, eps, dpos, dinv, attn_scale, dslot};
    K_OK(k_attention_decode_rope(q_raw, &rope, kc[1], vc[1], &b, out[1], c.H, c.KVH, c.D, c.bs, scale, part,
                                 ws, wsb, 0));
    GPU_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> ha(pool), hb2(pool), oa(outn), ob(outn), qb(qkv.size());
    int bad = 0;
    const char *what = "";
    GPU_OK(cudaMemcpy(oa.data(), out[0], outn * 2, cudaMemcpyDeviceToHost));
    GPU_OK(cudaMemcpy(ob.data(), out[1], outn * 2, cudaMemcpyDeviceToHost));
    if (oa != ob)
        bad = 1, what = "attention output";
    for (int kv = 0; kv < 2 && !bad; kv++) {
        GPU_OK(cudaMemcpy(ha.data(), kv ? vc[0] : kc[0], pool * 2, cudaMemcpyDeviceToHost));
        GPU_OK(cudaMemcpy(hb2.data(), kv ? vc[1] : kc[1], pool * 2, cudaMemcpyDeviceToHost));
        if (ha != hb2)
            bad = 1, what = kv ? "v cache" : "k cache";
    }
    GPU_OK(cudaMemcpy(qb.data(), q_raw, qkv.size() * 2, cudaMemcpyDeviceToHost));
    if (!bad && qb != qkv)
        bad = 1, what = "qkv (written)";
    if (!bad) { /* the two-kernel path really wrote the new keys (the comparison is not vacuous) */
        for (int s = 0; s < n && !bad; s++)
            if (memcmp(&ha[(size_t)((slot[s] / c.bs * c.KVH) * c.bs + slot[s] % c.bs) * c.D],
                       &P.v[(size_t)((slot[s] / c.bs * c.KVH) * c.bs + slot[s] % c.bs) * c.D], c.D * 2) == 0)
                bad = 1, what = "v cache row not written";
    }
    char cn[64], name[200];
    printf("%s %s decode+rope %s %d seqs, ctx %d..%d, part %d%s%s%s: %s\n", bad ? "FAIL" : "ok  ",
           gt_mode_name(), cfg_name(c, cn, sizeof cn), n, *std::min_element(ctx.begin(), ctx.end()),
           P.max_ctx, part, bias ? ", bias" : "", norms ? ", q/k norms" : "",
           attn_scale != 1.f ? ", attn_scale" : "", bad ? what : "equal to the two kernels bit for bit");
    tally(!bad);
    { /* the folded kernel's output against the reference over the rotated q and the written cache */
        GPU_OK(cudaMemcpy(P.q.data(), q_a, (size_t)n * QS * 2, cudaMemcpyDeviceToHost));
        GPU_OK(cudaMemcpy(P.k.data(), kc[1], pool * 2, cudaMemcpyDeviceToHost));
        GPU_OK(cudaMemcpy(P.v.data(), vc[1], pool * 2, cudaMemcpyDeviceToHost));
        GPU_OK(cudaMemcpy(P.dout, out[1], outn * 2, cudaMemcpyDeviceToDevice));
        std::vector<qrow> rows;
        for (int s = 0; s < n; s++)
            rows.push_back({s, 0});
        snprintf(name, sizeof name, "decode+rope %s %d seqs, ctx %d..%d, part %d, against the reference",
                 cfg_name(c, cn, sizeof cn), n, *std::min_element(ctx.begin(), ctx.end()), P.max_ctx, part);
        tally(check(name, P, rows, reference(P, rows)));
    }
    for (int i = 0; i < 2; i++)
        cudaFree(kc[i]), cudaFree(vc[i]), cudaFree(out[i]);
    cudaFree(ws), cudaFree(q_raw), cudaFree(q_a), cudaFree(db), cudaFree(dqn), cudaFree(dkn), cudaFree(dinv),
        cudaFree(dpos), cudaFree(dslot);
    P.free_dev();
}

/* Launcher argument checks: bad arguments are refused with a message, nothing launched. */
static void argument_checks(void)
{
    const cfg c = {8, 2, 128, 16};
    paged P;
    build(P, c, {1, 1}, {3000, 40}, case_seed(999));
    k_attn_batch b = P.batch();
    int ok = 1;
    const size_t need = k_attention_decode_workspace_split(P.n, c.H, c.D, P.max_ctx, 64);
    void *ws = nullptr;
    GPU_OK(cudaMalloc(&ws, need));
    if (k_attention_decode_split(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, c.bs, 0.1f, 64,
                                 ws, need - 1, 0) == 0 ||
        !strstr(k_last_error(), "workspace"))
        ok = 0, printf("     short workspace not refused (%s)\n", k_last_error());
    if (k_attention_prefill(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, 96, c.bs, 0.1f, 0) == 0)
        ok = 0, printf("     D = 96 not refused\n");
    if (k_attention_prefill(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, 9, c.KVH, c.D, c.bs, 0.1f, 0) == 0)
        ok = 0, printf("     H %% KVH != 0 not refused\n");
    if (k_attention_decode(P.dq, 34 * c.D, P.dk, P.dv, &b, P.dout, 34, 2, c.D, c.bs, 0.1f, ws, need, 0) ==
            0 ||
        !strstr(k_last_error(), "query heads"))
        ok = 0, printf("     17 query heads per KV head not refused by decode (%s)\n", k_last_error());
    if (k_attention_decode(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, 24, 0.1f, ws, need,
                           0) == 0 ||
        !strstr(k_last_error(), "power of two"))
        ok = 0, printf("     block size 24 not refused by decode (%s)\n", k_last_error());
    if (k_attention_prefill(P.dq, P.q_stride, P.dk, P.dv, &b, P.dout, c.H, c.KVH, c.D, 24, 0.1f, 0) == 0 ||
        !strstr(k_last_error(), "power of two"))
        ok = 0, printf("     block size 24 not refused by prefill (%s)\n", k_last_error());
    const uint8_t *k8 = (const uint8_t *)P.dk, *v8 = (const uint8_t *)P.dv; /* any 16-byte aligned memory */
    if (k_attention_prefill_fp8(P.dq, P.q_stride, k8, v8, NULL, (const float *)P.dv, &b, P.dout, c.H, c.KVH,
                                c.D, c.bs, 0.1f, 0) == 0 ||
        !strstr(k_last_error(), "scale"))
        ok = 0, printf("     fp8 prefill without k_scale not refused (%s)\n", k_last_error());
    if (k_attention_decode_fp8(P.dq, P.q_stride, k8, v8, (const float *)P.dk, NULL, &b, P.dout, c.H, c.KVH,
                               c.D, c.bs, 0.1f, ws, need, 0) == 0 ||
        !strstr(k_last_error(), "scale"))
        ok = 0, printf("     fp8 decode without v_scale not refused (%s)\n", k_last_error());
    bf16 *so = P.dout; /* staging: a NULL list, D not a multiple of 16, a misaligned output */
    if (k_kv_stage_fp8(k8, v8, (const float *)P.dk, (const float *)P.dv, NULL, 1, so, so, c.KVH, c.D, c.bs,
                       0) == 0 ||
        !strstr(k_last_error(), "NULL"))
        ok = 0, printf("     staging without a block list not refused (%s)\n", k_last_error());
    if (k_kv_stage_fp8(k8, v8, (const float *)P.dk, (const float *)P.dv, P.dbt, 1, so, so, c.KVH, 24, c.bs,
                       0) == 0 ||
        !strstr(k_last_error(), "multiple of 16"))
        ok = 0, printf("     staging at D = 24 not refused (%s)\n", k_last_error());
    if (k_kv_stage_fp8(k8, v8, (const float *)P.dk, (const float *)P.dv, P.dbt, 1, so + 1, so, c.KVH, c.D,
                       c.bs, 0) == 0 ||
        !strstr(k_last_error(), "aligned"))
        ok = 0, printf("     staging to a misaligned output not refused (%s)\n", k_last_error());
    GPU_OK(cudaGetLastError());
    printf("%s %s argument checks (last message: %s)\n", ok ? "ok  " : "FAIL", gt_mode_name(),
           k_last_error());
    tally(ok);
    GPU_OK(cudaFree(ws));
    P.free_dev();
}

/* The fp8 cache's launchers are bf16 only: in fp16 mode each fails at once (-1, nothing launched, the
 * reason in k_last_error) on arguments it accepts in bf16 mode; then bf16 mode again. */
static void fp16_refusals(void)
{
    const cfg c = {8, 2, 64, 16};
    paged P;
    build(P, c, {1, 1}, {300, 40}, case_seed(998), true);
    const k_attn_batch b = P.batch();
    const float scale = 1.f / sqrtf((float)c.D);
    const size_t need = k_attention_decode_workspace_split(P.n, c.H, c.D, P.max_ctx, 64);
    void *ws = nullptr;
    GPU_OK(cudaMalloc(&ws, std::max<size_t>(need, 16)));
    int ok = 1;
    gt_set_mode(1);
    const int rp = k_attention_prefill_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H,
                                           c.KVH, c.D, c.bs, scale, 0);
    const bool mp = strstr(k_last_error(), "fp16 mode") != nullptr;
    const int rd = k_attention_decode_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H,
                                          c.KVH, c.D, c.bs, scale, ws, need, 0);
    const bool md = strstr(k_last_error(), "fp16 mode") != nullptr;
    const int rs = k_attention_decode_split_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H,
                                                c.KVH, c.D, c.bs, scale, 64, ws, need, 0);
    const bool ms = strstr(k_last_error(), "fp16 mode") != nullptr;
    const char *last = k_last_error();
    if (rp != -1 || !mp || rd != -1 || !md || rs != -1 || !ms)
        ok = 0,
        printf("     fp8 attention in fp16 mode: prefill %d, decode %d, split %d (want -1, -1, -1; %s)\n", rp,
               rd, rs, last);
    printf("%s fp16 fp8 attention launchers refuse fp16 mode (last message: %s)\n", ok ? "ok  " : "FAIL",
           last);
    gt_set_mode(0);
    /* and run again in bf16 mode */
    if (k_attention_prefill_fp8(P.dq, P.q_stride, P.dk8, P.dv8, P.dks, P.dvs, &b, P.dout, c.H, c.KVH, c.D,
                                c.bs, scale, 0) != 0)
        ok = 0, printf("FAIL bf16 fp8 prefill after fp16 mode: %s\n", k_last_error());
    GPU_OK(cudaDeviceSynchronize());
    tally(ok);
    GPU_OK(cudaFree(ws));
    P.free_dev();
}

/* ---- timing (informational) */

__global__ void fill_random_kernel(bf16 *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        p[i] = __float2bfloat16(((float)(z >> 40) * (1.f / 16777216.f) * 2.f - 1.f) * scale);
    }
}
static void fill_random(bf16 *p, size_t n, uint64_t seed, float scale)
{
    fill_random_kernel<<<2048, 256>>>(p, n, seed, scale);
    GPU_OK(cudaGetLastError());
}

__global__ void fill_codes_kernel(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 31;
        uint8_t c = (uint8_t)(z >> 40);
        p[i] = (c & 0x7f) == 0x7f ? c - 1 : c; /* no NaN codes */
    }
}
__global__ void fill_scales_kernel(float *p, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        p[i] = (1.f + (float)(z >> 40) * (1.f / 16777216.f)) / 448.f;
    }
}
static void fill_codes(uint8_t *p, size_t n, uint64_t seed)
{
    fill_codes_kernel<<<2048, 256>>>(p, n, seed);
    GPU_OK(cudaGetLastError());
}
static void fill_scales(float *p, size_t n, uint64_t seed)
{
    fill_scales_kernel<<<2048, 256>>>(p, n, seed);
    GPU_OK(cudaGetLastError());
}

/* Median time in ms of fn() over `reps` runs after 3 warm-ups. A cool chip at full clock: the engine's
   prefill runs under the board's power cap, which the GEMMs reach and this table does not. */
template <typename F> static double time_ms(int reps, F fn)
{
    cudaEvent_t a, b;
    GPU_OK(cudaEventCreate(&a));
    GPU_OK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        fn();
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        GPU_OK(cudaEventRecord(a));
        fn();
        GPU_OK(cudaEventRecord(b));
        GPU_OK(cudaEventSynchronize(b));
        GPU_OK(cudaEventElapsedTime(&t[i], a, b));
    }
    GPU_OK(cudaEventDestroy(a));
    GPU_OK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[reps / 2];
}

/* Device batch of sequences with nq[s] new tokens at context ctx[s] each, over a shared random pool. */
struct dev_batch {
    int32_t *qs, *ctx, *bt;
    int max_blocks;
};
static dev_batch make_dev_batch(const std::vector<int> &nq, const std::vector<int> &ctx, int bs,
                                int num_blocks, uint64_t seed)
{
    dev_batch d;
    const int n_seqs = (int)nq.size();
    d.max_blocks = (*std::max_element(ctx.begin(), ctx.end()) + bs - 1) / bs;
    std::vector<int32_t> perm(num_blocks), qs(n_seqs + 1, 0), cl(ctx.begin(), ctx.end()),
        bt((size_t)n_seqs * d.max_blocks);
    for (int i = 0; i < num_blocks; i++)
        perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--)
        std::swap(perm[i], perm[gt_next(&seed) % (uint64_t)(i + 1)]);
    for (size_t i = 0; i < bt.size(); i++)
        bt[i] = perm[i % num_blocks];
    for (int s = 0; s < n_seqs; s++)
        qs[s + 1] = qs[s] + nq[s];
    d.qs = gt_to_device(qs.data(), qs.size());
    d.ctx = gt_to_device(cl.data(), cl.size());
    d.bt = gt_to_device(bt.data(), bt.size());
    return d;
}
/* n_seqs sequences of n_q new tokens each at context ctx */
static dev_batch make_dev_batch(int n_seqs, int n_q, int ctx, int bs, int num_blocks, uint64_t seed)
{
    return make_dev_batch(std::vector<int>(n_seqs, n_q), std::vector<int>(n_seqs, ctx), bs, num_blocks, seed);
}
static void free_dev_batch(dev_batch &d)
{
    cudaFree(d.qs), cudaFree(d.ctx), cudaFree(d.bt);
}

/* A timing section's buffers: a K and a V pool of num_blocks blocks (KVH x bs x D bf16 each), q of
   q_rows rows of q_stride and out of q_rows rows of H x D (none when q_rows is 0), random values
   from seeds seed, seed + 1, seed + 2. */
struct timing_bufs {
    bf16 *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
    size_t pool = 0;
    timing_bufs(int num_blocks, int KVH, int bs, int D, size_t q_rows, int q_stride, int H, uint64_t seed)
        : pool((size_t)num_blocks * KVH * bs * D)
    {
        GPU_OK(cudaMalloc(&k, pool * 2));
        GPU_OK(cudaMalloc(&v, pool * 2));
        fill_random(k, pool, seed, 1.f), fill_random(v, pool, seed + 1, 1.f);
        if (q_rows) {
            GPU_OK(cudaMalloc(&q, q_rows * q_stride * 2));
            GPU_OK(cudaMalloc(&out, q_rows * H * D * 2));
            fill_random(q, q_rows * q_stride, seed + 2, 1.f);
        }
    }
    ~timing_bufs() { cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(out); }
};

static void timing(void)
{
    const int H = 40, KVH = 8, D = 128, bs = 32;
    const int q_stride = (H + 2 * KVH) * D;
    const float scale = 1.f / sqrtf((float)D);
    cudaDeviceProp prop;
    GPU_OK(cudaGetDeviceProperties(&prop, 0));
    printf("timing on %s (%d SMs); ceilings 776 TFLOP/s bf16 dense, 4.2 TB/s copy\n", prop.name,
           prop.multiProcessorCount);

    { /* prefill: 8 x 4096 new tokens, causal, no earlier context */
        const int n = 8, T = 4096, num_blocks = n * T / bs;
        timing_bufs t(num_blocks, KVH, bs, D, (size_t)n * T, q_stride, H, 11);
        bf16 *k = t.k, *v = t.v, *q = t.q, *out = t.out;
        const size_t pool = t.pool;
        dev_batch d = make_dev_batch(n, T, T, bs, num_blocks, case_seed(7001));
        k_attn_batch b = {n, d.qs, d.ctx, d.bt, d.max_blocks, T, T};
        const double flops = (double)n * 2 * 2 * T * (double)T / 2 * D * H;
        /* the fp8 pool: the bf16 buffers' first halves as codes (random bits, NaN codes cleared), scales */
        uint8_t *k8 = (uint8_t *)k, *v8 = (uint8_t *)v;
        float *ks, *vs;
        GPU_OK(cudaMalloc(&ks, pool / D * 4));
        GPU_OK(cudaMalloc(&vs, pool / D * 4));
        fill_codes(k8, pool, 14), fill_codes(v8, pool, 15);
        fill_scales(ks, pool / D, 16), fill_scales(vs, pool / D, 17);
        for (int f8 = 0; f8 < 2; f8++)
            for (int var : prefill_paths) {
                if (!prefill_case_runs(var, D, f8))
                    continue;
                k_test_prefill_path(var);
                const double ms = time_ms(10, [&]() {
                    if (f8)
                        K_OK(k_attention_prefill_fp8(q, q_stride, k8, v8, ks, vs, &b, out, H, KVH, D, bs,
                                                     scale, 0));
                    else
                        K_OK(k_attention_prefill(q, q_stride, k, v, &b, out, H, KVH, D, bs, scale, 0));
                });
                printf("time prefill %s %d x %d causal H%d/KVH%d D%d bs%d, %s: %.3f ms, %.1f TFLOP/s "
                       "(%.0f%% of 776)\n",
                       f8 ? "fp8 " : "bf16", n, T, H, KVH, D, bs, prefill_path_name(var), ms,
                       flops / ms / 1e9, flops / ms / 1e9 / 776 * 100);
            }
        { /* the engine's fp8 prefill: the blocks staged as bf16 (the table's blocks in order, so the
             staged table is 0, 1, 2, ...), then the default bf16 kernel; and the staging alone */
            const int nb = n * d.max_blocks;
            std::vector<int32_t> iota(nb);
            for (int i = 0; i < nb; i++)
                iota[i] = i;
            int32_t *dio = gt_to_device(iota.data(), iota.size());
            bf16 *sk, *sv;
            GPU_OK(cudaMalloc(&sk, (size_t)nb * KVH * bs * D * 2));
            GPU_OK(cudaMalloc(&sv, (size_t)nb * KVH * bs * D * 2));
            k_attn_batch bs8 = b;
            bs8.block_tables = dio;
            const double st_ms =
                time_ms(10, [&]() { K_OK(k_kv_stage_fp8(k8, v8, ks, vs, d.bt, nb, sk, sv, KVH, D, bs, 0)); });
            const double ms = time_ms(10, [&]() {
                K_OK(k_kv_stage_fp8(k8, v8, ks, vs, d.bt, nb, sk, sv, KVH, D, bs, 0));
                K_OK(k_attention_prefill(q, q_stride, sk, sv, &bs8, out, H, KVH, D, bs, scale, 0));
            });
            const double bytes = (double)nb * KVH * bs * (D * 3 + 4) * 2;
            printf(
                "time prefill fp8  %d x %d causal H%d/KVH%d D%d bs%d, staged as bf16 + default kernel: %.3f "
                "ms, %.1f TFLOP/s (%.0f%% of 776); the staging alone %.3f ms, %.0f GB/s\n",
                n, T, H, KVH, D, bs, ms, flops / ms / 1e9, flops / ms / 1e9 / 776 * 100, st_ms,
                bytes / st_ms / 1e6);
            cudaFree(dio), cudaFree(sk), cudaFree(sv);
        }
        /* the default kernel on two more shapes over the same pool: 4 prompts of 4096 (half the CTAs), and
           a summarize prefill step (16,384 tokens: the 144-token rest of a prompt after 3,952 cached
           ones, 3 whole prompts, the first 3,952 of the next) */
        k_test_prefill_path(K_TEST_PREFILL_AUTO);
        const std::vector<std::vector<int>> nqs = {
            {4096, 4096, 4096, 4096}, {144, 4096, 4096, 4096, 3952}, {144, 4096, 4096, 4096, 3952}};
        const std::vector<std::vector<int>> ctxs = {
            {4096, 4096, 4096, 4096}, {4096, 4096, 4096, 4096, 3952}, {4096, 4096, 4096, 4096, 3952}};
        /* the third: the same step with its blocks spread over a pool of 20,480 (1.3 GB of K, as an
           engine's layer has), not 1,024 */
        const int big_blocks = 20480;
        timing_bufs big(big_blocks, KVH, bs, D, 0, q_stride, H, 18);
        bf16 *kb = big.k, *vb = big.v;
        for (size_t sh = 0; sh < nqs.size(); sh++) {
            const bool big = sh == 2;
            dev_batch e =
                make_dev_batch(nqs[sh], ctxs[sh], bs, big ? big_blocks : num_blocks, case_seed(7003 + sh));
            k_attn_batch be = {(int)nqs[sh].size(), e.qs, e.ctx, e.bt, e.max_blocks, 4096, 4096};
            double fl = 0;
            for (size_t i = 0; i < nqs[sh].size(); i++) /* query i of a sequence sees past + i + 1 keys */
                for (int t = 0; t < nqs[sh][i]; t++)
                    fl += 4.0 * (ctxs[sh][i] - nqs[sh][i] + t + 1) * D * H;
            const double ms = time_ms(10, [&]() {
                K_OK(k_attention_prefill(q, q_stride, big ? kb : k, big ? vb : v, &be, out, H, KVH, D, bs,
                                         scale, 0));
            });
            printf("time prefill bf16 %s H%d/KVH%d D%d bs%d, default kernel: %.3f ms, %.1f TFLOP/s (%.0f%% "
                   "of 776)\n",
                   sh == 0 ? "4 x 4096 causal" : "a summarize step (144 after 3952, 3 x 4096, 3952)", H, KVH,
                   D, bs, ms, fl / ms / 1e9, fl / ms / 1e9 / 776 * 100);
            if (big)
                printf("  (its blocks spread over %d, not %d)\n", big_blocks, num_blocks);
            free_dev_batch(e);
        }
        GPU_OK(cudaFree(ks));
        GPU_OK(cudaFree(vs));
        free_dev_batch(d);
    }
    { /* decode: one random pool of 16384 blocks (2.1 GB of K and V), four batch shapes: 256 x 2048,
         8 x 65,536 (longdoc), 512 x 576 (chat's decode steps) and 512 x 256 (the decode workload's first
         steps: CTAs of a few tiles, where a CTA's prologue and merge weigh most) */
        const int num_blocks = 16384;
        timing_bufs t(num_blocks, KVH, bs, D, 512, q_stride, H, 21);
        bf16 *k = t.k, *v = t.v, *q = t.q, *out = t.out;
        const size_t pool = t.pool;
        uint8_t *k8 = (uint8_t *)k, *v8 = (uint8_t *)v;
        float *ks, *vs;
        GPU_OK(cudaMalloc(&ks, pool / D * 4));
        GPU_OK(cudaMalloc(&vs, pool / D * 4));
        const int shapes[4][2] = {{256, 2048}, {8, 65536}, {512, 576}, {512, 256}};
        for (const auto &sh : shapes) {
            const int n = sh[0], ctx = sh[1];
            dev_batch d = make_dev_batch(n, 1, ctx, bs, num_blocks, case_seed(7002 + n));
            k_attn_batch b = {n, d.qs, d.ctx, d.bt, d.max_blocks, 1, ctx};
            double ms_bf16[2] = {0, 0};
            for (int f8 = 0; f8 < 2; f8++) {
                if (f8) { /* the same memory refilled as codes and scales */
                    fill_codes(k8, pool, 24), fill_codes(v8, pool, 25);
                    fill_scales(ks, pool / D, 26), fill_scales(vs, pool / D, 27);
                }
                /* bytes that must move: K and V of every key (fp8: D codes + a 4-byte scale each) */
                const double bytes = (double)n * ctx * KVH * 2 * (f8 ? D + 4 : D * 2);
                for (int pi = 0; pi < 2; pi++) {
                    const int part = pi == 0 ? 0 : -1;
                    const size_t wsb = k_attention_decode_workspace_split(n, H, D, ctx, part);
                    void *ws = nullptr;
                    if (wsb)
                        GPU_OK(cudaMalloc(&ws, wsb));
                    const double ms = time_ms(20, [&]() {
                        if (f8)
                            K_OK(k_attention_decode_split_fp8(q, q_stride, k8, v8, ks, vs, &b, out, H, KVH, D,
                                                              bs, scale, part, ws, wsb, 0));
                        else
                            K_OK(k_attention_decode_split(q, q_stride, k, v, &b, out, H, KVH, D, bs, scale,
                                                          part, ws, wsb, 0));
                    });
                    char vs_bf16[64] = "";
                    if (f8)
                        snprintf(vs_bf16, sizeof vs_bf16, ", %.2fx the bf16 time", ms / ms_bf16[pi]);
                    else
                        ms_bf16[pi] = ms;
                    printf("time decode %s %d seqs x %d ctx H%d/KVH%d D%d bs%d, %s: %.3f ms, %.1f MB moved, "
                           "%.0f "
                           "GB/s (%.0f%% of 4200)%s\n",
                           f8 ? "fp8 " : "bf16", n, ctx, H, KVH, D, bs, part == 0 ? "auto split" : "no split",
                           ms, bytes / 1e6, bytes / ms / 1e6, bytes / ms / 1e6 / 4200 * 100, vs_bf16);
                    GPU_OK(cudaFree(ws));
                }
            }
            free_dev_batch(d);
        }
        GPU_OK(cudaFree(ks));
        GPU_OK(cudaFree(vs));
    }
    { /* decode at summarize's shape (the first wave of 200 x 4096 / 256: 144 sequences of ~4,224 keys),
         over a pool of 20,480 blocks (2.7 GB), split as the decode graph of its bucket (4,352) splits it
         and at other partition sizes; plain and with the RoPE prologue folded in */
        const int n = 144, ctx = 4224, bucket = 4352, num_blocks = 20480;
        timing_bufs t(num_blocks, KVH, bs, D, n, q_stride, H, 31);
        bf16 *k = t.k, *v = t.v, *q = t.q, *out = t.out;
        dev_batch d = make_dev_batch(n, 1, ctx, bs, num_blocks, case_seed(7100));
        k_attn_batch b = {n, d.qs, d.ctx, d.bt, d.max_blocks, 1, bucket};
        const std::vector<float> inv = rope_inv_freq(D);
        std::vector<int32_t> pos(n, ctx - 1), slot(n, -1);
        float *dinv = gt_to_device(inv.data(), inv.size());
        int32_t *dpos = gt_to_device(pos.data(), pos.size()), *dslot = gt_to_device(slot.data(), slot.size());
        const k_rope_in rope = {nullptr, nullptr, nullptr, 1e-6f, dpos, dinv, 1.f, dslot};
        const double bytes = (double)n * ctx * KVH * 2 * D * 2;
        for (int part : {0, 512, 1024, -1})
            for (int fold = 0; fold < 2; fold++) {
                const size_t wsb = k_attention_decode_workspace_split(n, H, D, bucket, part);
                void *ws = nullptr;
                if (wsb)
                    GPU_OK(cudaMalloc(&ws, wsb));
                int keys = 0;
                const int parts = k_attention_decode_parts(n, bucket, part, &keys);
                const double ms = time_ms(20, [&]() {
                    if (fold)
                        K_OK(k_attention_decode_rope(q, &rope, k, v, &b, out, H, KVH, D, bs, scale, part, ws,
                                                     wsb, 0));
                    else
                        K_OK(k_attention_decode_split(q, q_stride, k, v, &b, out, H, KVH, D, bs, scale, part,
                                                      ws, wsb, 0));
                });
                printf("time decode bf16 %d seqs x %d ctx H%d/KVH%d D%d bs%d%s, %d partitions of %d keys: "
                       "%.3f ms, "
                       "%.1f MB moved, %.0f GB/s (%.0f%% of 4200)\n",
                       n, ctx, H, KVH, D, bs, fold ? ", RoPE folded" : "", parts, keys, ms, bytes / 1e6,
                       bytes / ms / 1e6, bytes / ms / 1e6 / 4200 * 100);
                GPU_OK(cudaFree(ws));
            }
        free_dev_batch(d);
        GPU_OK(cudaFree(dinv));
        GPU_OK(cudaFree(dpos));
        GPU_OK(cudaFree(dslot));
    }
}

/* prefill: one sequence's shapes, and a mixed batch: fresh prompts, chunks continuing after ~3000 cached
 * tokens, decode-like rows */
static const cfg single[] = {{40, 8, 128, 32}, {16, 8, 64, 16}};
static const std::vector<int> mix_nq = {1, 7, 300, 130, 1, 64, 513, 17, 1000, 129};
static const std::vector<int> mix_ctx = {1, 7, 300, 3130, 3001, 3064, 513, 3017, 4000, 129};
/* decode of short contexts (single-sequence decode): 2-16 partitions of one or a few tiles, and batches
 * whose sequences have fewer partitions than the launch (idle CTAs) */
static const std::vector<std::vector<int>> shorts = {{100},  {512},          {640},
                                                     {1000}, {450, 200, 64}, {77, 1, 300}};

/* The cases of the 16-bit launchers in the calling thread's mode (gt_set_mode); subset: the fp16 mode's
 * representative subset (header comment): every prefill path at D 128 and 64 with and without GQA
 * and over every tensor-map shape but one, decode and split decode at D 128 and 64 from 1 to 32k keys,
 * the folded decode at GQA 1, 5 and 16 with every split. k: the running case seed index. */
static void cases16(uint64_t &k, bool prefill_only, bool subset)
{
    /* prefill, one sequence, n_q = ctx */
    for (const cfg &c : single)
        for (int n : {1, 7, 128, 1000, 4097})
            if (!subset || n == 7 || n == 1000)
                prefill_case("single", c, {n}, {n}, case_seed(k++));

    /* prefill, mixed batches */
    const cfg heads[] = {{40, 8, 128, 32}, {16, 8, 128, 16}, {32, 8, 128, 32}, {4, 4, 128, 16},
                         {40, 8, 64, 16},  {16, 8, 64, 32},  {32, 8, 64, 16},  {4, 4, 64, 32}};
    for (int i = 0; i < 8; i++)
        if (!subset || i == 0 || i == 3 || i == 4 || i == 7) /* D 128 and 64, GQA 5 and 1 */
            prefill_case("mixed", heads[i], mix_nq, mix_ctx, case_seed(k++));
    /* the tensor-map copies' other shapes (block sizes 64, 128, 256: 64 keys a copy, two lanes a tile; 128,
       one lane; 128 of a 256-key block) */
    for (const cfg &c : {cfg{40, 8, 128, 64}, cfg{16, 8, 128, 128}, cfg{8, 2, 128, 256}})
        if (!subset || c.bs != 128)
            prefill_case("mixed", c, mix_nq, mix_ctx, case_seed(k++));

    /* decode: batches 1, 3, 64, 256 with contexts from 1 to 32k mixed in one batch */
    for (int i = 0; i < 8; i++) {
        const cfg &c = heads[i];
        if (prefill_only)
            break;
        if (subset && i != 0 && i != 5) /* D 128 bs 32 and D 64 bs 32 */
            continue;
        for (int n : {1, 3, 64, 256}) {
            if (subset && n != 3 && n != 64) /* 1 .. 32k keys, splits of 64 and 256 keys */
                continue;
            uint64_t st = case_seed(k++);
            std::vector<int> ctx(n);
            for (int s = 0; s < n; s++) {
                const double maxlog = log(n == 256 ? 8192.0 : 32768.0);
                ctx[s] = (int)exp((gt_next(&st) >> 11) * (1.0 / 9007199254740992.0) * maxlog);
                ctx[s] = std::max(1, ctx[s]);
            }
            if (n == 1)
                ctx[0] = 32767;
            if (n >= 3)
                ctx[0] = 1, ctx[1] = 32768, ctx[2] = n == 3 ? 1000 : 17;
            decode_case(c, ctx, n <= 3 ? 64 : n <= 64 ? 256 : 512, st);
        }
    }

    /* decode of short contexts (single-sequence decode) */
    for (const cfg &c : {heads[0], heads[5]})
        for (const std::vector<int> &ctx : prefill_only ? std::vector<std::vector<int>>{} : shorts)
            if (!subset || ctx == std::vector<int>{640} || (c.D == 128 && ctx[0] == 450))
                decode_case(c, ctx, 128, case_seed(k++));

    /* the decode attention with the q/k norm + RoPE prologue folded in (GQA 1..16, bias, no norms) */
    const cfg rope_cfgs[] = {
        {40, 8, 128, 32}, {16, 8, 64, 16}, {4, 4, 128, 16}, {32, 2, 64, 32}, {12, 1, 128, 16}};
    const std::vector<std::vector<int>> rope_ctx = {{1}, {65}, {640}, {3000}, {450, 1, 200, 64}};
    int ri = 0;
    for (const cfg &c : rope_cfgs)
        for (const std::vector<int> &ctx : prefill_only ? std::vector<std::vector<int>>{} : rope_ctx)
            for (int part : {0, -1, 64, 512}) {
                if (subset &&
                    (c.H == 16 || c.H == 12 || ctx == std::vector<int>{1} || ctx == std::vector<int>{640}))
                    continue; /* GQA 5, 16 and 1; D 128 and 64; 65 .. 3000 keys and a mixed batch */
                const int v = ri++;
                rope_fold_case(c, ctx, part, v % 3 == 1, v % 4 != 3, v % 5 == 2 ? 1.25f : 1.f,
                               case_seed(k++));
            }
}

int main(void)
{
    gpu_require();
    base_seed = gt_seed();
    uint64_t k = 0;

    argument_checks();
    fp16_refusals();
    /* LLMQ_TEST_TIMING_ONLY=1: the timing table alone (tuning; no checks) */
    const char *to = getenv("LLMQ_TEST_TIMING_ONLY");
    if (to && strcmp(to, "1") == 0) {
        timing();
        return 0;
    }
    /* LLMQ_TEST_PREFILL_ONLY=1: the prefill cases and the timing table only (tuning the prefill kernels) */
    const char *po = getenv("LLMQ_TEST_PREFILL_ONLY");
    const bool prefill_only = po && strcmp(po, "1") == 0;
    if (!prefill_runs(K_TEST_PREFILL_AUTO, 128))
        printf("note: no sm_90a device or build: the wgmma prefill kernel is not tested here\n");
    /* LLMQ_TEST_FP16_ONLY=1: the fp16 cases alone (the bf16 and fp8 ones take most of the time) */
    const char *fo = getenv("LLMQ_TEST_FP16_ONLY");
    if (fo && strcmp(fo, "1") == 0) {
        gt_set_mode(1);
        cases16(k, prefill_only, true);
        gt_set_mode(0);
        printf("%s: %d of %d checks passed\n", failures ? "FAIL" : "PASS", cases - failures, cases);
        return failures ? 1 : 0;
    }

    cases16(k, prefill_only, false);

    /* the fp8 cache staged as bf16 for the prefill (the staged prefill itself runs in the fp8 cases) */
    stage_case(8, 128, 32, case_seed(k++));
    stage_case(4, 64, 16, case_seed(k++));
    stage_case(1, 16, 8, case_seed(k++));

    /* fp8 cache: the same kinds of cases, block sizes 16 and 32, GQA 1..8, 1 token, > 4096 keys (bf16 mode
       only; fp16 mode refuses them, fp16_refusals) */
    for (const cfg &c : single)
        for (int n : {1, 7, 1000, 4097})
            prefill_case("single", c, {n}, {n}, case_seed(k++), true);
    const cfg heads8[] = {{40, 8, 128, 32}, {16, 8, 128, 16}, {4, 4, 64, 32}, {32, 8, 64, 16}};
    for (const cfg &c : heads8)
        prefill_case("mixed", c, mix_nq, mix_ctx, case_seed(k++), true);
    for (const cfg &c : heads8) {
        if (prefill_only)
            break;
        for (int n : {1, 3, 64, 256}) {
            uint64_t st = case_seed(k++);
            std::vector<int> ctx(n);
            for (int s = 0; s < n; s++) {
                const double maxlog = log(n == 256 ? 8192.0 : 32768.0);
                ctx[s] = std::max(1, (int)exp((gt_next(&st) >> 11) * (1.0 / 9007199254740992.0) * maxlog));
            }
            if (n == 1)
                ctx[0] = 32767;
            if (n >= 3)
                ctx[0] = 1, ctx[1] = 32768, ctx[2] = n == 3 ? 4097 : 17;
            decode_case(c, ctx, n <= 3 ? 64 : n <= 64 ? 256 : 512, st, true);
        }
    }
    for (const std::vector<int> &ctx : prefill_only ? std::vector<std::vector<int>>{} : shorts)
        decode_case(heads8[0], ctx, 128, case_seed(k++), true);

    /* fp16 mode: the 16-bit launchers again, over a representative subset */
    gt_set_mode(1);
    cases16(k, prefill_only, true);
    gt_set_mode(0);

    timing();
    printf("%s: %d of %d checks passed\n", failures ? "FAIL" : "PASS", cases - failures, cases);
    return failures ? 1 : 0;
}
