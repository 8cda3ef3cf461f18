// The mixture-of-experts decode GEMVs (kernels/moe.h: k_moe_gemv_gate_up, k_moe_gemv_down): the decode
// GEMV's body (kernels/gemv_body.cuh; its lane mapping and configurations: kernels/gemv.cu) run by one
// CTA per (tile of outputs, active expert). blockIdx.y = j picks the j-th expert with rows
// (k_moe_permute's active list; -1: the CTA leaves), whose rows expert_off[e] .. expert_off[e + 1] - 1 are
// Y's rows and X's (gate/up: X's rows are gathered, row i is X[perm_tok[i]]); the CTA runs the body over its
// weights for 8 rows at a time (the mma's 8 columns), so an expert's weights are streamed from memory once
// for its first 8 rows and from L2 for the next. gate/up: the fused gate/up + SwiGLU tile (gemv_body's GLU: 8
// gate rows and the matching 8 up rows, the store rounds both sums to bf16 and writes silu(g) * u,
// kernels/silu.cuh); down: 16-row tiles. Configurations: the wide ones of the dense GEMV (gemv.cu,
// GEMV_CONFIGS: fp8 8 warps x 2 load steps, 16-bit 8 warps x 4 load steps with two accumulation chains), with
// the registers for fewer CTAs an SM (fp8 3, 16-bit 2; at the dense GEMV's 4 the loop over an expert's rows
// spills): 16-bit, 2 CTAs keep 64 KiB of weight loads in flight an SM.
//
// Which expert a CTA works for is known only after the PDL wait (the permutation is the step's), so the
// first weights are loaded after it, not before as in the dense GEMV.
#include <stdint.h>

#include "kernels/gemv_body.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.cuh"
#include "kernels/moe.h"

template <int WARPS, int U, int MINB, bool FP8, int DC, bool GLU>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    moe_gemv_kernel(const bf16 *__restrict__ X, const void *__restrict__ W, const float *__restrict__ w_scale,
                    bf16 *__restrict__ Y, int N, int K, const int32_t *__restrict__ expert_off,
                    const int32_t *__restrict__ active, const int32_t *__restrict__ perm_tok)
{
    pdl_wait(); // kernels/launch.cuh; gemv_body's pdl_enter then waits no more
    const int e = ld_dep(active + blockIdx.y);
    if (e < 0)
        return;
    const int r0 = ld_dep(expert_off + e), r1 = ld_dep(expert_off + e + 1);
    const int rows = GLU ? 2 * N : N; // the expert's weight rows
    const char *We = (const char *)W + (size_t)e * rows * K * (FP8 ? 1 : 2);
    const float *Se = FP8 ? w_scale + (size_t)e * ((rows + 127) / 128) * ((K + 127) / 128) : w_scale;
    for (int m0 = r0; m0 < r1; m0 += K_GEMV_MAX_M) {
        if (m0 != r0) // every thread has read the body's shared sums of the rows before
            __syncthreads();
        const int M = min(K_GEMV_MAX_M, r1 - m0);
        if (GLU) // gate/up: row i is X[perm_tok[i]]
            gemv_body<__nv_bfloat16, WARPS, U, 1, FP8, DC, GLU, false, true>(
                X, We, Se, Y + (size_t)m0 * N, 0, M, N, K, 1, NULL, NULL, perm_tok + m0);
        else
            gemv_body<__nv_bfloat16, WARPS, U, 1, FP8, DC, GLU>(
                X + (size_t)m0 * K, We, Se, Y + (size_t)m0 * N, 0, M, N, K, 1, NULL, NULL);
    }
}

// Y rows of N outputs from X rows of K for every active expert; GLU: N = I outputs from 2I weight rows, X's
// rows gathered through perm_tok.
template <bool GLU>
static int moe_gemv_run(const bf16 *X, const void *W, const float *s, bool fp8, bf16 *Y, int N, int K,
                        const struct k_moe_perm *perm, int ctas_y, cudaStream_t stream)
{
    const dim3 grid(GLU ? (N + 7) / 8 : (N + 15) / 16, ctas_y);
    const int32_t *off = perm->expert_off, *act = perm->active, *tok = perm->perm_tok;
    if (fp8)
        K_CHECK(k_launch(moe_gemv_kernel<8, 2, 3, true, 1, GLU>, grid, 256, 0, stream, X, W, s, Y, N, K, off,
                         act, tok));
    else
        K_CHECK(k_launch(moe_gemv_kernel<8, 4, 2, false, 2, GLU>, grid, 256, 0, stream, X, W,
                         (const float *)NULL, Y, N, K, off, act, tok));
    return 0;
}

static int ctas_y(int T, int k, int E)
{
    return (long)T * k < E ? T * k : E;
}

// Either launcher: gate/up (GLU) from X [T][H] into Hp [P][I], or down from Hp into Yp [P][H].
static int moe_gemv(const char *fn, bool glu, const bf16 *X, bf16 *Y, int T, int k,
                    const struct k_moe_perm *perm, const struct k_moe_weights *w, cudaStream_t stream)
{
    if (k_moe_check(fn, T, k, perm, w, 16, 0, X, Y))
        return -1;
    if (T == 0)
        return 0;
    const int ny = ctas_y(T, k, w->E);
    return glu ? moe_gemv_run<true>(X, w->gate_up, w->gate_up_scale, w->fp8, Y, w->I, w->H, perm, ny, stream)
               : moe_gemv_run<false>(X, w->down, w->down_scale, w->fp8, Y, w->H, w->I, perm, ny, stream);
}

extern "C" int k_moe_gemv_gate_up(const bf16 *X, const struct k_moe_perm *perm, int T, int k,
                                  const struct k_moe_weights *w, bf16 *Hp, cudaStream_t stream)
{
    return moe_gemv("k_moe_gemv_gate_up", true, X, Hp, T, k, perm, w, stream);
}

extern "C" int k_moe_gemv_down(const bf16 *Hp, const struct k_moe_perm *perm, int T, int k,
                               const struct k_moe_weights *w, bf16 *Yp, cudaStream_t stream)
{
    return moe_gemv("k_moe_gemv_down", false, Hp, Yp, T, k, perm, w, stream);
}
