/* Mixture-of-experts routing: which experts a token's MLP runs and with what weights (engine/model.h
 * gives the whole MoE MLP). The reference the backends and kernel tests share.
 *
 * For one token's router logits l[0 .. E) (fp32):
 *   the selection S: the K largest logits, in descending order, ties to the lower expert index (a NaN
 *     logit ranks below every number);
 *   p_e = exp(l_e - max l) / sum_j exp(l_j - max l), the softmax over all E experts, exp in fp32 and the
 *     sum in double;
 *   w_e = p_e / sum_{j in S} p_j when norm_topk_prob, else p_e; each w_e is one rounding to fp32 of
 *     exp(l_e - max) / (the double sum over S, or over all E).
 * Softmax is monotonic, so S is also the K largest probabilities (transformers takes torch.topk of them;
 * rounding can make two probabilities of distinct logits equal, where its choice is unspecified). */
#pragma once
#include <stdbool.h>

/* Routes one token: idx[0 .. K) the selected experts in descending logit order, w[0 .. K) their
 * weights (above). 1 <= K <= E. Reads logits only. */
void moe_route(const float *logits, int E, int K, bool norm_topk_prob, int *idx, float *w);
