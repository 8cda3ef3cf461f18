// The mixture-of-experts MLP in one call (kernels/moe.h: k_moe_workspace, k_moe_mlp): routing,
// permutation, the experts' products by the decode GEMVs or the grouped GEMM, and the weighted
// combination, on one stream and a workspace carved into the step's arrays.
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/moe.h"

// The workspace's arrays for T tokens; base NULL only sizes them. Returns the bytes used.
struct moe_ws {
    int32_t *ids;
    float *w;
    struct k_moe_perm perm;
    bf16 *y; // [P][H]: the experts' down outputs
    bf16 *h; // [P][I]: the SwiGLU outputs
};

static size_t moe_carve(char *base, int T, int k, int E, int H, int I, struct moe_ws *ws)
{
    const size_t P = (size_t)T * k;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        void *p = base ? base + at : NULL;
        at += (bytes + 255) / 256 * 256;
        return p;
    };
    ws->ids = (int32_t *)take(P * 4);
    ws->w = (float *)take(P * 4);
    ws->perm.expert_off = (int32_t *)take(((size_t)E + 1) * 4);
    ws->perm.active = (int32_t *)take((size_t)E * 4);
    ws->perm.perm_tok = (int32_t *)take(P * 4);
    ws->perm.pair_pos = (int32_t *)take(P * 4);
    ws->y = (bf16 *)take(P * H * 2);
    ws->h = (bf16 *)take(P * I * 2);
    return at;
}

extern "C" size_t k_moe_workspace(int T, int k, int E, int H, int I)
{
    struct moe_ws ws;
    return moe_carve(NULL, T, k, E, H, I, &ws);
}

extern "C" int k_moe_mlp(const bf16 *X, const float *logits, int T, int k, int norm,
                         const struct k_moe_weights *w, bf16 *out, void *ws, size_t ws_bytes,
                         cudaStream_t stream)
{
    K_REQUIRE(w, "k_moe_mlp: NULL weights");
    if (T == 0)
        return 0;
    struct moe_ws a;
    const size_t need = moe_carve((char *)ws, T, k, w->E, w->H, w->I, &a);
    K_REQUIRE(ws && ws_bytes >= need && (uintptr_t)ws % 256 == 0,
              "k_moe_mlp: workspace %p of %zu bytes; %zu needed, 256-byte aligned", ws, ws_bytes, need);
    if (T <= K_MOE_GEMV_MAX_T) {
        if (k_moe_route_permute(logits, T, w->E, k, norm, a.ids, a.w, &a.perm, stream) ||
            k_moe_gemv_gate_up(X, &a.perm, T, k, w, a.h, stream) ||
            k_moe_gemv_down(a.h, &a.perm, T, k, w, a.y, stream))
            return -1;
    } else if (k_moe_route(logits, T, w->E, k, norm, a.ids, a.w, stream) ||
               k_moe_permute(a.ids, T, k, w->E, &a.perm, stream) ||
               k_moe_gemm_gate_up(X, &a.perm, T, k, w, a.h, stream) ||
               k_moe_gemm_down(a.h, &a.perm, T, k, w, a.y, stream)) {
        return -1;
    }
    return k_moe_combine(a.y, &a.perm, a.w, T, k, w->H, out, stream);
}
