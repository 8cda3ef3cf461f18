/* See moe.h. */
#include "engine/moe.h"

#include <math.h>

/* Whether logit a of expert i ranks before logit b of expert j: larger first, NaN last, ties to the lower
 * index. */
static bool ranks_before(float a, int i, float b, int j)
{
    if (isnan(a) || isnan(b))
        return !isnan(a) || (isnan(b) && i < j);
    return a > b || (a == b && i < j);
}

void moe_route(const float *logits, int E, int K, bool norm_topk_prob, int *idx, float *w)
{
    /* selection by insertion into the K best so far: E is at most a few hundred */
    int n = 0;
    for (int e = 0; e < E; e++) {
        if (n == K && !ranks_before(logits[e], e, logits[idx[K - 1]], idx[K - 1]))
            continue;
        int at = n < K ? n++ : K - 1;
        while (at > 0 && ranks_before(logits[e], e, logits[idx[at - 1]], idx[at - 1])) {
            idx[at] = idx[at - 1];
            at--;
        }
        idx[at] = e;
    }
    float mx = logits[idx[0]];
    double sum = 0;
    for (int e = 0; e < E; e++)
        sum += (double)expf(logits[e] - mx);
    double sel = 0;
    for (int k = 0; k < K; k++)
        sel += (double)expf(logits[idx[k]] - mx);
    /* p_e / sum_S p_j == exp(l_e - max) / sum_S exp(l_j - max) */
    for (int k = 0; k < K; k++)
        w[k] = (float)((double)expf(logits[idx[k]] - mx) / (norm_topk_prob ? sel : sum));
}
