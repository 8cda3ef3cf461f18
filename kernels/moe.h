/* The mixture-of-experts MLP of Qwen3-MoE on the GPU: routing, the permutation of (token, slot) pairs
 * into expert-contiguous rows and back, the experts' gate/up + SwiGLU and down products (a grouped GEMM
 * for prefill-sized steps, a GEMV per selected expert for decode-sized ones), and k_moe_mlp, the whole
 * MLP in one call. Design and bounds: docs/KERNELS.md, "Mixture of experts". Every launcher returns 0,
 * or -1 with the error recorded (k_last_error); T = 0 launches nothing and returns 0. All pointers are
 * device memory the caller owns; nothing is allocated, nothing synchronizes with the host, so every
 * launcher may be captured into a CUDA graph (grid sizes depend only on the host arguments). bf16 only:
 * every launcher fails at once in fp16 mode (k_f16).
 *
 * Sizes: T tokens, E experts (1..K_MOE_MAX_E), k experts a token (1..K_MOE_MAX_K, k <= E), hidden H,
 * expert intermediate I. P = T * k pairs; pair p = t * k + s is slot s of token t.
 *
 * Expert weights (struct k_moe_weights): all experts of a layer in one array each, expert-major, in the
 * dense layers' layouts (kernels.h, k_gemv_fp8_glu): gate_up [E][2I][H] (expert e's gate rows, then its
 * up rows: the fused gate_up matrix of a dense layer, per expert) and down [E][H][I]; bf16, or e4m3 with
 * 128x128 block scales per expert, gate_up_scale [E][ceil(2I/128)][ceil(H/128)] (the fused matrix's
 * blocks: with I % 128 == 0, as Qwen3-30B-A3B's 768, a block holds gate or up rows only) and
 * down_scale [E][ceil(H/128)][ceil(I/128)]. */
#pragma once
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K_MOE_MAX_E 512
#define K_MOE_MAX_K 16
/* k_moe_mlp takes the decode path (a GEMV per selected expert) up to this many tokens, the grouped GEMM
 * above it. */
#define K_MOE_GEMV_MAX_T 64

struct k_moe_weights {
    int E, H, I;
    int fp8;                    /* 0: bf16 weights; 1: e4m3 with the scales below */
    const void *gate_up;        /* [E][2I][H] */
    const float *gate_up_scale; /* fp8: [E][ceil(2I/128)][ceil(H/128)] */
    const void *down;           /* [E][H][I] */
    const float *down_scale;    /* fp8: [E][ceil(H/128)][ceil(I/128)] */
};

/* ---- routing (moe_route.cu) */

/* k_moe_route: per token t, the k largest of logits[t, 0..E) (fp32 [T][E]) in descending order (equal
 * logits: the lower expert first) into ids[t * k + s], and their softmax probabilities over all E
 * experts, p_e = exp(l_e - max) / sum_j exp(l_j - max) in fp32, into w[t * k + s]; norm != 0 divides
 * the k probabilities by their sum (Qwen3's norm_topk_prob). A NaN logit counts as -inf (probability 0,
 * chosen only after every other). One warp a token. */
int k_moe_route(const float *logits, int T, int E, int k, int norm, int32_t *ids, float *w,
                cudaStream_t stream);

/* ---- permutation (moe_route.cu) */

/* The expert-contiguous order of the P pairs, made by k_moe_permute from ids [P]: the pairs of expert e
 * are the rows expert_off[e] .. expert_off[e + 1] - 1, in pair order (a stable counting sort). */
struct k_moe_perm {
    int32_t *expert_off; /* [E + 1]; expert_off[E] = the pairs with an id in [0, E) (P for router ids) */
    int32_t *active;     /* [E]: the experts with at least one row, ascending, then -1 */
    int32_t *perm_tok;   /* [P]: the token of row i (pair / k); rows >= expert_off[E] are not written */
    int32_t *pair_pos;   /* [P]: the row of pair p; -1 for a pair whose id is outside [0, E) (dropped) */
};
/* One CTA (the counts of E experts over P pairs in shared memory): tens of microseconds at P = 65536. */
int k_moe_permute(const int32_t *ids, int T, int k, int E, const struct k_moe_perm *perm,
                  cudaStream_t stream);

/* k_moe_check (moe_route.cu): the checks every expert-product launcher makes: bf16 mode, the sizes
 * above, the permutation's arrays, the weights (present, shaped E x H x I with H and I positive
 * multiples of mult, of 128 for fp8 when fp8_128, 16-byte aligned) and, for T > 0, the input X (16-byte
 * aligned) and the output Y. 0, or -1 recorded under fn's name. */
int k_moe_check(const char *fn, int T, int k, const struct k_moe_perm *perm, const struct k_moe_weights *w,
                int mult, int fp8_128, const bf16 *X, const bf16 *Y);

/* k_moe_route_permute: k_moe_route and k_moe_permute in one launch of one CTA (warp w routes tokens w,
 * w + 32, ...; then the sort): the same ids, w and permutation, bit for bit. For decode-sized T (k_moe_mlp
 * takes it up to K_MOE_GEMV_MAX_T tokens), where a launch less matters more than spreading the routing. */
int k_moe_route_permute(const float *logits, int T, int E, int k, int norm, int32_t *ids, float *w,
                        const struct k_moe_perm *perm, cudaStream_t stream);

/* k_moe_combine: out[t, :] = bf16(sum over s < k of w[t * k + s] * Yp[pair_pos[t * k + s], :]), the sum
 * in fp32 in slot order (a dropped pair adds nothing): the inverse of the permutation with the routing
 * weights. Yp [P][H] bf16 (the experts' down outputs, expert-contiguous), out [T][H] bf16. H a multiple
 * of 8, 16-byte aligned rows. Deterministic (no atomics). */
int k_moe_combine(const bf16 *Yp, const struct k_moe_perm *perm, const float *w, int T, int k, int H,
                  bf16 *out, cudaStream_t stream);

/* ---- the experts' products: Hp [P][I] = silu(Xe . Wg_e^T) * (Xe . Wu_e^T) with both products rounded to
 * bf16 first (k_silu_mul of a [P][2I] product), then Yp [P][H] = Hp_e . Wd_e^T rounded to bf16, where row i
 * of expert e uses e's weights. Rows past expert_off[E] are not written. */

/* The gate/up launchers of both paths gather their rows: row i of expert e is X[perm_tok[i]] (X [T][H],
 * the tokens' hidden states). */

/* Grouped GEMM (moe_gemm.cu), for prefill-sized steps: mma.sync tiles of 128 rows of one expert (the
 * expert found from the tile's index and expert_off) x 128 weight rows, 4-stage cp.async pipeline;
 * gate/up applies SwiGLU in its epilogue. Grid (output column tiles, ceil(P / 128) + E): CTAs past the step's
 * tiles exit at once. H and I multiples of 32 (fp8: of 128), rows 16-byte aligned. fp8 weights: the products
 * use the weights' e4m3 values exactly (bf16 X, no activation quantization), each 128-k block's fp32 sum
 * times its block scale. */
int k_moe_gemm_gate_up(const bf16 *X, const struct k_moe_perm *perm, int T, int k,
                       const struct k_moe_weights *w, bf16 *Hp, cudaStream_t stream);
int k_moe_gemm_down(const bf16 *Hp, const struct k_moe_perm *perm, int T, int k,
                    const struct k_moe_weights *w, bf16 *Yp, cudaStream_t stream);

/* Decode GEMVs (moe_gemv.cu), for small T: the decode GEMV's body (kernels/gemv_body.cuh) with one CTA
 * per (16-row tile of outputs, active expert): only the selected experts' weights are read, each once
 * per 8 of its rows (an expert with more than 8 rows walks its weights again from L2). The gate/up launch
 * is the fused gate/up + SwiGLU GEMV (k_gemv_fp8_glu's tile of 8 gate and 8 up rows). Grid (column
 * tiles, min(E, P)). H and I multiples of 16 (fp8: of 128). */
int k_moe_gemv_gate_up(const bf16 *X, const struct k_moe_perm *perm, int T, int k,
                       const struct k_moe_weights *w, bf16 *Hp, cudaStream_t stream);
int k_moe_gemv_down(const bf16 *Hp, const struct k_moe_perm *perm, int T, int k,
                    const struct k_moe_weights *w, bf16 *Yp, cudaStream_t stream);

/* ---- the whole MLP (moe.cu) */

/* Workspace bytes k_moe_mlp needs for up to T tokens (256-byte aligned pieces). */
size_t k_moe_workspace(int T, int k, int E, int H, int I);
/* k_moe_mlp: out [T][H] bf16 = the MoE MLP of X [T][H] bf16 (the post-attention-norm hidden states) for
 * router logits [T][E] fp32: for T <= K_MOE_GEMV_MAX_T k_moe_route_permute and the decode GEMVs, else
 * k_moe_route, k_moe_permute and the grouped GEMMs; then k_moe_combine. ws: k_moe_workspace(T, ...)
 * bytes, 256-byte aligned, no initialization. Four launches (decode) or five (grouped), no host
 * synchronization. */
int k_moe_mlp(const bf16 *X, const float *logits, int T, int k, int norm, const struct k_moe_weights *w,
              bf16 *out, void *ws, size_t ws_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
