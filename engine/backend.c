/* What every backend shares: RoPE frequencies, the step checks, backend_free. */
#include "engine/backend.h"

#include <math.h>
#include <stdio.h>

#include "engine/model.h"

void backend_free(struct backend *be)
{
    if (be)
        be->ops->free(be);
}

/* The float32 arithmetic below mirrors transformers' torch code operation by operation (python
 * scalars meet float32 tensors as floats; python-side arithmetic stays double). */
int backend_rope_freqs(const struct model_config *cfg, float *inv_freq, float *attn_scale, char *err,
                       size_t errlen)
{
    const int dim = cfg->head_dim, half = dim / 2;
    if (dim <= 0 || dim % 2) {
        snprintf(err, errlen, "head_dim %d: RoPE needs an even head dimension", dim);
        return -1;
    }
    if (!(cfg->rope_theta > 0)) {
        snprintf(err, errlen, "rope_theta %g: must be positive", cfg->rope_theta);
        return -1;
    }
    const float base = (float)cfg->rope_theta;
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim); /* base ** (arange / dim) */
    *attn_scale = 1.0f;
    const double factor = cfg->rope_scaling.factor;

    switch (cfg->rope_scaling.type) {
    case ROPE_DEFAULT:
        return 0;

    case ROPE_YARN: {
        if (!(factor > 0)) {
            snprintf(err, errlen, "rope_scaling yarn: factor %g must be positive", factor);
            return -1;
        }
        int orig = cfg->rope_scaling.original_max > 0 ? cfg->rope_scaling.original_max : cfg->max_position;
        double beta_fast = cfg->rope_scaling.beta_fast > 0 ? cfg->rope_scaling.beta_fast : 32;
        double beta_slow = cfg->rope_scaling.beta_slow > 0 ? cfg->rope_scaling.beta_slow : 1;
        double af = cfg->rope_scaling.attn_factor;
        if (!(af > 0))
            af = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
        *attn_scale = (float)af;
        /* find_correction_range with truncate = True */
        double lb = 2 * log((double)base);
        double low = floor(dim * log(orig / (beta_fast * 2 * M_PI)) / lb);
        double high = ceil(dim * log(orig / (beta_slow * 2 * M_PI)) / lb);
        low = low > 0 ? low : 0;
        high = high < dim - 1 ? high : dim - 1;
        if (low == high)
            high += 0.001;
        for (int i = 0; i < half; i++) {
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extra = 1.0f - ramp;
            float inter = 1.0f / ((float)factor * powf(base, (float)(2 * i) / (float)dim));
            inv_freq[i] = inter * (1.0f - extra) + inv_freq[i] * extra;
        }
        return 0;
    }

    case ROPE_LLAMA3: {
        double lf = cfg->rope_scaling.low_freq_factor, hf = cfg->rope_scaling.high_freq_factor;
        int old = cfg->rope_scaling.original_max;
        if (!(factor > 0) || !(lf > 0) || !(hf > lf) || old <= 0) {
            snprintf(err, errlen,
                     "rope_scaling llama3: needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                     "original_max_position_embeddings > 0 (got %g, %g, %g, %d)",
                     factor, lf, hf, old);
            return -1;
        }
        float low_wl = (float)(old / lf), high_wl = (float)(old / hf);
        for (int i = 0; i < half; i++) {
            float inv = inv_freq[i];
            float wl = (float)(2 * M_PI) / inv;
            float l = wl > low_wl ? inv / (float)factor : inv;
            float smooth = ((float)old / wl - (float)lf) / (float)(hf - lf);
            float smoothed = (1.0f - smooth) * l / (float)factor + smooth * l;
            bool medium = !(wl < high_wl) && !(wl > low_wl);
            inv_freq[i] = medium ? smoothed : l;
        }
        return 0;
    }
    }
    snprintf(err, errlen, "unknown rope_scaling type %d", (int)cfg->rope_scaling.type);
    return -1;
}

int backend_check_model(const struct model_config *c, char *err, size_t errlen)
{
    if (c->hidden <= 0 || c->intermediate <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->vocab <= 0 || c->n_heads % c->n_kv_heads) {
        snprintf(err, errlen,
                 "unsupported model shape: hidden %d, intermediate %d, layers %d, heads %d, kv heads %d, "
                 "head_dim %d, vocab %d",
                 c->hidden, c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab);
        return -1;
    }
    return 0;
}

int backend_check_seq(struct backend *be, const struct be_seq *s, int i, int vocab, int max_model_len)
{
    const int bs = be->block_size;
    char *err = be->err;
    size_t el = sizeof be->err;
    if (!s->tokens || s->n_new < 1 || s->pos < 0 || s->n_prompt < 0 || s->n_prompt > s->n_tokens ||
        s->pos + s->n_new > s->n_tokens) {
        snprintf(err, el, "sequence %d: bad step: pos %d, n_new %d, n_prompt %d, n_tokens %d", i, s->pos,
                 s->n_new, s->n_prompt, s->n_tokens);
        return -1;
    }
    int end = s->pos + s->n_new, need = (end + bs - 1) / bs;
    if (max_model_len > 0 && end > max_model_len) {
        snprintf(err, el, "sequence %d: %d positions exceed max_model_len %d of this backend", i, end,
                 max_model_len);
        return -1;
    }
    if (!s->block_table || s->n_blocks < need) {
        snprintf(err, el, "sequence %d: %d KV blocks for %d positions, need %d of %d tokens", i, s->n_blocks,
                 end, need, bs);
        return -1;
    }
    for (int k = 0; k < need; k++)
        if (s->block_table[k] < 0 || s->block_table[k] >= be->num_blocks) {
            snprintf(err, el, "sequence %d: block_table[%d] = %d is outside the pool of %d blocks", i, k,
                     s->block_table[k], be->num_blocks);
            return -1;
        }
    for (int p = s->pos; p < end; p++)
        if (s->tokens[p] < 0 || s->tokens[p] >= vocab) {
            snprintf(err, el, "sequence %d: token %d at position %d is outside the vocabulary of %d", i,
                     s->tokens[p], p, vocab);
            return -1;
        }
    if (s->sample && (!s->sp || end != s->n_tokens)) {
        snprintf(err, el, "sequence %d: sample set but %s", i,
                 !s->sp ? "no sampling parameters" : "the step does not reach the last token");
        return -1;
    }
    return 0;
}
