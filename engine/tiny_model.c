/* See tiny_model.h. */
#include "engine/tiny_model.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/util/array.h"
#include "engine/util/errfmt.h"

#define LOGIT_GAIN 4.0    /* embed_tokens and lm_head: N(0, LOGIT_GAIN / sqrt(hidden)) */
#define OUT_GAIN 4.0      /* o_proj and down_proj: N(0, OUT_GAIN / sqrt(in)) */
#define NORM_STD 0.1      /* norm weights: 1 + N(0, NORM_STD) */
#define BIAS_STD 0.5      /* q/k/v biases */
#define ROUTER_GAIN 2.0   /* MoE router: N(0, ROUTER_GAIN / sqrt(hidden)) */
#define FP8_BLOCK 128     /* weight_block_size [128, 128] */
#define QWEN_VOCAB 151936 /* Qwen3's padded vocab_size, the default with a Qwen tokenizer that fits */
#define TINY_VOCAB 512    /* the default with the minimal tokenizer */

struct tiny_opts tiny_opts_default(void)
{
    return (struct tiny_opts){.arch = ARCH_QWEN3,
                              .arch_from_tokenizer = true,
                              .hidden = 64,
                              .intermediate = 128,
                              .layers = 2,
                              .heads = 4,
                              .kv_heads = 2,
                              .head_dim = 0,
                              .vocab = 0,
                              .max_position = 4096,
                              .rope_theta = 10000.0,
                              .tie = true,
                              .experts = 0,
                              .experts_per_token = 2,
                              .moe_intermediate = 0,
                              .norm_topk_prob = true,
                              .decoder_sparse_step = 1,
                              .dtype = DT_BF16,
                              .shards = 1,
                              .seed = 0,
                              .tokenizer_dir = NULL,
                              .threads = 0};
}

/* ---- deterministic random numbers: splitmix64, one stream per tensor ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately N(0, 1): the sum of 4 uniforms (mean 2, variance 1/3), rescaled. Only exact or
 * correctly rounded IEEE operations, so the bits are the same everywhere. */
static double normal(uint64_t *s)
{
    double u = 0;
    for (int i = 0; i < 4; i++)
        u += (double)(splitmix64(s) >> 11) * 0x1p-53;
    return (u - 2.0) * 1.7320508075688772;
}

static uint64_t stream_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 1099511628211ull;
    uint64_t s = seed ^ 0x6a09e667f3bcc909ull;
    return splitmix64(&s) ^ h;
}

/* ---- the tensor list ---- */

enum kind { K_EMBED, K_LINEAR, K_NORM, K_BIAS, K_LM_HEAD, K_SCALE, K_ROUTER };

struct spec {
    char name[96];
    enum kind kind;
    enum dtype dtype;
    int ndim;
    int64_t shape[2];
    int unit; /* tensors of one unit (a weight and its scales) share a shard */
    uint8_t *data;
};

struct plan {
    struct spec *t;
    int n, n_units;
    size_t cap; /* t's room */
};

static int add(struct plan *p, enum kind k, enum dtype dt, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int add(struct plan *p, enum kind k, enum dtype dt, int64_t d0, int64_t d1, const char *fmt, ...)
{
    if (array_reserve(&p->t, &p->cap, (size_t)p->n + 1, sizeof *p->t, 64))
        return -1;
    struct spec *s = &p->t[p->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->kind = k;
    s->dtype = dt;
    s->ndim = d1 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->unit = k == K_SCALE ? p->n_units - 1 : p->n_units++;
    return 0;
}

static int add_linear(struct plan *p, const struct tiny_opts *o, int64_t out, int64_t in, int l,
                      const char *what)
{
    bool fp8 = o->dtype == DT_F8_E4M3;
    if (add(p, K_LINEAR, fp8 ? DT_F8_E4M3 : o->dtype, out, in, "model.layers.%d.%s.weight", l, what) < 0)
        return -1;
    if (fp8 && add(p, K_SCALE, DT_BF16, (out + FP8_BLOCK - 1) / FP8_BLOCK, (in + FP8_BLOCK - 1) / FP8_BLOCK,
                   "model.layers.%d.%s.weight_scale_inv", l, what) < 0)
        return -1;
    return 0;
}

/* The model_config of the options' MoE settings, for model_layer_moe. */
static struct model_config moe_config(const struct tiny_opts *o)
{
    struct model_config c = {.n_layers = o->layers,
                             .n_experts = o->experts,
                             .n_experts_active = o->experts_per_token,
                             .moe_intermediate = o->moe_intermediate,
                             .decoder_sparse_step = o->decoder_sparse_step};
    memcpy(c.mlp_only, o->mlp_only, sizeof c.mlp_only);
    return c;
}

/* The MLP of layer l: dense (gate/up/down of intermediate) or router + experts. */
static int add_mlp(struct plan *p, const struct tiny_opts *o, int l)
{
    const struct model_config mc = moe_config(o);
    const int64_t C = o->hidden, F = o->intermediate, FE = o->moe_intermediate;
    if (!model_layer_moe(&mc, l))
        return add_linear(p, o, F, C, l, "mlp.gate_proj") < 0 ||
                       add_linear(p, o, F, C, l, "mlp.up_proj") < 0 ||
                       add_linear(p, o, C, F, l, "mlp.down_proj") < 0
                   ? -1
                   : 0;
    enum dtype dt = o->dtype == DT_F8_E4M3 ? DT_BF16 : o->dtype;
    if (add(p, K_ROUTER, dt, o->experts, C, "model.layers.%d.mlp.gate.weight", l) < 0)
        return -1;
    for (int e = 0; e < o->experts; e++) {
        char g[64], u[64], d[64];
        snprintf(g, sizeof g, "mlp.experts.%d.gate_proj", e);
        snprintf(u, sizeof u, "mlp.experts.%d.up_proj", e);
        snprintf(d, sizeof d, "mlp.experts.%d.down_proj", e);
        if (add_linear(p, o, FE, C, l, g) < 0 || add_linear(p, o, FE, C, l, u) < 0 ||
            add_linear(p, o, C, FE, l, d) < 0)
            return -1;
    }
    return 0;
}

static int make_plan(struct plan *p, const struct tiny_opts *o)
{
    enum dtype dt = o->dtype == DT_F8_E4M3 ? DT_BF16 : o->dtype; /* non-linear tensors */
    int64_t C = o->hidden, D = o->head_dim, QD = (int64_t)o->heads * D, KD = (int64_t)o->kv_heads * D;
    if (add(p, K_EMBED, dt, o->vocab, C, "model.embed_tokens.weight") < 0)
        return -1;
    for (int l = 0; l < o->layers; l++) {
        if (add(p, K_NORM, dt, C, 0, "model.layers.%d.input_layernorm.weight", l) < 0 ||
            add_linear(p, o, QD, C, l, "self_attn.q_proj") < 0 ||
            add_linear(p, o, KD, C, l, "self_attn.k_proj") < 0 ||
            add_linear(p, o, KD, C, l, "self_attn.v_proj") < 0)
            return -1;
        if (o->arch == ARCH_QWEN2 &&
            (add(p, K_BIAS, dt, QD, 0, "model.layers.%d.self_attn.q_proj.bias", l) < 0 ||
             add(p, K_BIAS, dt, KD, 0, "model.layers.%d.self_attn.k_proj.bias", l) < 0 ||
             add(p, K_BIAS, dt, KD, 0, "model.layers.%d.self_attn.v_proj.bias", l) < 0))
            return -1;
        if ((o->arch == ARCH_QWEN3 || o->arch == ARCH_QWEN3_MOE) &&
            (add(p, K_NORM, dt, D, 0, "model.layers.%d.self_attn.q_norm.weight", l) < 0 ||
             add(p, K_NORM, dt, D, 0, "model.layers.%d.self_attn.k_norm.weight", l) < 0))
            return -1;
        if (add_linear(p, o, C, QD, l, "self_attn.o_proj") < 0 ||
            add(p, K_NORM, dt, C, 0, "model.layers.%d.post_attention_layernorm.weight", l) < 0 ||
            add_mlp(p, o, l) < 0)
            return -1;
    }
    if (add(p, K_NORM, dt, C, 0, "model.norm.weight") < 0)
        return -1;
    if (!o->tie && add(p, K_LM_HEAD, dt, o->vocab, C, "lm_head.weight") < 0)
        return -1;
    return 0;
}

static size_t spec_bytes(const struct spec *s)
{
    return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1) * dtype_size(s->dtype);
}

static void store(enum dtype dt, uint8_t *dst, size_t i, float v)
{
    uint16_t h;
    switch (dt) {
    case DT_F32:
        memcpy(dst + 4 * i, &v, 4);
        break;
    case DT_F16:
        h = f32_to_f16(v);
        memcpy(dst + 2 * i, &h, 2);
        break;
    default: /* DT_BF16 */
        h = f32_to_bf16(v);
        memcpy(dst + 2 * i, &h, 2);
        break;
    }
}

/* Draws tensor t (and, for an fp8 weight, its scales in t[1]). */
static int generate(struct spec *t, const struct tiny_opts *o)
{
    size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
    uint64_t s = stream_seed(o->seed, t->name);
    double mean = 0, std = 1;
    switch (t->kind) {
    case K_EMBED:
    case K_LM_HEAD:
        std = LOGIT_GAIN / sqrt((double)t->shape[1]);
        break;
    case K_LINEAR:
        std = 1.0 / sqrt((double)t->shape[1]);
        if (strstr(t->name, ".o_proj.") || strstr(t->name, ".down_proj."))
            std *= OUT_GAIN;
        break;
    case K_NORM:
        mean = 1, std = NORM_STD;
        break;
    case K_BIAS:
        std = BIAS_STD;
        break;
    case K_ROUTER:
        std = ROUTER_GAIN / sqrt((double)t->shape[1]);
        break;
    case K_SCALE:
        return 0; /* drawn with its weight */
    }
    float *w = malloc(n * sizeof *w);
    t->data = malloc(spec_bytes(t));
    if (!w || !t->data) {
        free(w);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        w[i] = (float)(mean + std * normal(&s));
    if (t->dtype != DT_F8_E4M3) {
        for (size_t i = 0; i < n; i++)
            store(t->dtype, t->data, i, w[i]);
        free(w);
        return 0;
    }
    struct spec *sc = t + 1; /* K_SCALE follows its weight */
    if (!(sc->data = malloc(spec_bytes(sc)))) {
        free(w);
        return -1;
    }
    int64_t rows = t->shape[0], cols = t->shape[1], scols = sc->shape[1];
    for (int64_t br = 0; br < sc->shape[0]; br++)
        for (int64_t bc = 0; bc < scols; bc++) {
            float amax = 0;
            for (int64_t r = br * FP8_BLOCK; r < rows && r < (br + 1) * FP8_BLOCK; r++)
                for (int64_t c = bc * FP8_BLOCK; c < cols && c < (bc + 1) * FP8_BLOCK; c++)
                    amax = fmaxf(amax, fabsf(w[r * cols + c]));
            uint16_t sb = f32_to_bf16(amax > 0 ? amax / 448.0f : 1.0f);
            float scale = bf16_to_f32(sb);
            memcpy(sc->data + 2 * (br * scols + bc), &sb, 2);
            for (int64_t r = br * FP8_BLOCK; r < rows && r < (br + 1) * FP8_BLOCK; r++)
                for (int64_t c = bc * FP8_BLOCK; c < cols && c < (bc + 1) * FP8_BLOCK; c++)
                    t->data[r * cols + c] = f32_to_e4m3(w[r * cols + c] / scale);
        }
    free(w);
    return 0;
}

/* ---- files ---- */

static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        bool end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(path, 0755) < 0 && errno != EEXIST)
                return errfmt(err, errlen, "%s: %s", path, strerror(errno));
            if (end)
                break;
            *p = '/';
        }
    }
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return errfmt(err, errlen, "%s: not a directory", dir);
    return 0;
}

/* model.safetensors, its index, and model-NNNNN-of-NNNNN.safetensors */
static bool is_weight_file(const char *n)
{
    if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json"))
        return true;
    unsigned a, b;
    int len = 0;
    return strlen(n) == 32 && sscanf(n, "model-%5u-of-%5u.safetensors%n", &a, &b, &len) == 2 && len == 32;
}

static int remove_old_weights(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return errfmt(err, errlen, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)))
        if (is_weight_file(e->d_name)) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) < 0) {
                rc = errfmt(err, errlen, "%s: %s", path, strerror(errno));
                break;
            }
        }
    closedir(d);
    return rc;
}

/* Writes json (stolen) as dir/name, pretty and with sorted keys like transformers. */
static int write_json(const char *dir, const char *name, json_t *j, bool sort, char *err, size_t errlen)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!j)
        return errfmt(err, errlen, "%s: out of memory", path);
    size_t flags = JSON_INDENT(2) | JSON_REAL_PRECISION(15) | (sort ? JSON_SORT_KEYS : 0);
    char *text = json_dumps(j, flags);
    json_decref(j);
    if (!text)
        return errfmt(err, errlen, "%s: out of memory", path);
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    int e = errno;
    if (f && fclose(f) != 0 && ok) {
        e = errno;
        ok = false;
    }
    free(text);
    if (!ok)
        return errfmt(err, errlen, "%s: cannot write: %s", path, strerror(e));
    return 0;
}

static int copy_file(const char *from, const char *to, char *err, size_t errlen)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return errfmt(err, errlen, "%s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return errfmt(err, errlen, "%s: %s", to, strerror(errno));
    }
    char buf[65536];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0)
        ok = false;
    return ok ? 0 : errfmt(err, errlen, "copying %s to %s failed", from, to);
}

/* ---- tokenizer ---- */

struct tok_info {
    int max_id;     /* highest id in vocab and added_tokens */
    int eos_ids[4]; /* eos_token of tokenizer_config, then those of END_TOKENS it has, distinct */
    int n_eos;
    int bos;   /* bos_token of tokenizer_config, else <|endoftext|>, or -1 */
    bool qwen; /* tokenizer_class names Qwen2's tokenizer */
};

/* Tokens that end a turn or a text in the families llmq runs, added to the model's eos ids when the
 * tokenizer has them (Qwen's <|endoftext|>, Llama-3's <|eot_id|> and <|end_of_text|>). */
static const char *const END_TOKENS[] = {"<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"};

/* GPT-2's bytes_to_unicode: the printable bytes map to themselves, the rest to U+0100 upwards; token
 * i is the i-th byte in that order, as in Qwen's vocab ('!' is 0). Writes the UTF-8 of token i. */
static void byte_token(int i, char *out)
{
    unsigned cp[256];
    int n = 0, extra = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            if (pass == 0 && printable)
                cp[n++] = (unsigned)b;
            else if (pass == 1 && !printable)
                cp[n++] = 256u + (unsigned)extra++;
        }
    unsigned c = cp[i];
    if (c < 0x80) {
        out[0] = (char)c;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3f));
        out[2] = 0;
    }
}

#define SP "\xc4\xa0" /* 'Ġ', the byte-level symbol of a space */
static const char *const merges[][2] = {
    {SP, "t"},  {"h", "e"}, {SP "t", "he"}, {"i", "n"}, {SP, "a"},   {"e", "r"}, {"o", "n"}, {"r", "e"},
    {"a", "t"}, {SP, "s"},  {"e", "n"},     {"o", "r"}, {"in", "g"}, {SP, "o"},  {SP, "w"},  {"a", "n"},
};
#define N_MERGES ((int)(sizeof merges / sizeof merges[0]))
static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define MIN_TOKENS (256 + N_MERGES + 3)

static const char CHATML[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% "
    "endif %}";
static const char QWEN_SPLIT[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *byte_level(void)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", 0);
}

static json_t *added_token(const char *content, bool with_id, int id)
{
    json_t *t = json_object();
    if (with_id)
        json_object_set_new(t, "id", json_integer(id));
    json_object_set_new(t, "content", json_string(content));
    json_object_set_new(t, "single_word", json_false());
    json_object_set_new(t, "lstrip", json_false());
    json_object_set_new(t, "rstrip", json_false());
    json_object_set_new(t, "normalized", json_false());
    json_object_set_new(t, "special", json_true());
    return t;
}

static int write_min_tokenizer(const char *dir, const struct tiny_opts *o, struct tok_info *ti, char *err,
                               size_t errlen)
{
    json_t *vocab = json_object(), *jm = json_array(), *added = json_array(), *decoder = json_object();
    char sym[4], merged[64];
    for (int i = 0; i < 256; i++) {
        byte_token(i, sym);
        json_object_set_new(vocab, sym, json_integer(i));
    }
    for (int i = 0; i < N_MERGES; i++) {
        json_array_append_new(jm, json_pack("[s, s]", merges[i][0], merges[i][1]));
        snprintf(merged, sizeof merged, "%s%s", merges[i][0], merges[i][1]);
        json_object_set_new(vocab, merged, json_integer(256 + i));
    }
    for (int i = 0; i < 3; i++) {
        int id = 256 + N_MERGES + i;
        char key[16];
        snprintf(key, sizeof key, "%d", id);
        json_array_append_new(added, added_token(specials[i], true, id));
        json_object_set_new(decoder, key, added_token(specials[i], false, 0));
    }
    json_t *model =
        json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                  "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback",
                  0, "ignore_merges", 0, "vocab", vocab, "merges", jm);
    json_t *pre =
        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type",
                  "Split", "pattern", "Regex", QWEN_SPLIT, "behavior", "Isolated", "invert", 0, byte_level());
    json_t *tok =
        json_pack("{s:s, s:n, s:n, s:o, s:{s:s}, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                  "padding", "added_tokens", added, "normalizer", "type", "NFC", "pre_tokenizer", pre,
                  "post_processor", byte_level(), "decoder", byte_level(), "model", model);
    if (write_json(dir, "tokenizer.json", tok, false, err, errlen) < 0) {
        json_decref(decoder);
        return -1;
    }
    json_t *cfg = json_pack(
        "{s:b, s:b, s:o, s:[s, s], s:n, s:s, s:b, s:s, s:s, s:i, s:s, s:b, s:s, s:n}", "add_bos_token", 0,
        "add_prefix_space", 0, "added_tokens_decoder", decoder, "additional_special_tokens", specials[1],
        specials[2], "bos_token", "chat_template", CHATML, "clean_up_tokenization_spaces", 0, "eos_token",
        specials[2], "errors", "replace", "model_max_length", o->max_position, "pad_token", specials[0],
        "split_special_tokens", 0, "tokenizer_class", "Qwen2Tokenizer", "unk_token");
    if (write_json(dir, "tokenizer_config.json", cfg, false, err, errlen) < 0)
        return -1;
    ti->max_id = MIN_TOKENS - 1;
    ti->eos_ids[0] = 256 + N_MERGES + 2; /* <|im_end|> */
    ti->eos_ids[1] = 256 + N_MERGES;     /* <|endoftext|> */
    ti->n_eos = 2;
    ti->bos = 256 + N_MERGES;
    return 0;
}

/* Reads what the config needs from a tokenizer folder (its files are copied later). The tokenizer
 * must be one llmq loads, so a folder made with it runs. */
static int read_tokenizer(const char *tdir, struct tok_info *ti, char *err, size_t errlen)
{
    char path[4400], why[1024];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tdir);
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--tokenizer: %s: %s", path, je.text);
    struct tok *tok = tok_load_dir(tdir, why, sizeof why);
    if (!tok) {
        json_decref(cfg);
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--tokenizer: llmq cannot load this tokenizer: %s", why);
    }
    int rc = 0;
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    ti->qwen = cls && !strncmp(cls, "Qwen2Tokenizer", strlen("Qwen2Tokenizer"));
    ti->max_id = tok_vocab_size(tok) - 1;
    if (ti->max_id < 0 || ti->max_id >= 1 << 30) {
        rc = errfmt_rc(err, errlen, TINY_EBADOPT, "--tokenizer: %s/tokenizer.json has no usable vocab", tdir);
        goto out;
    }
    ti->n_eos = 0;
    if (tok_eos_id(tok) >= 0)
        ti->eos_ids[ti->n_eos++] = tok_eos_id(tok);
    for (size_t i = 0; i < sizeof END_TOKENS / sizeof END_TOKENS[0]; i++) {
        int id = tok_token_to_id(tok, END_TOKENS[i]);
        bool seen = id < 0;
        for (int k = 0; k < ti->n_eos; k++)
            seen = seen || ti->eos_ids[k] == id;
        if (!seen)
            ti->eos_ids[ti->n_eos++] = id;
    }
    if (ti->n_eos == 0) {
        rc = errfmt_rc(err, errlen, TINY_EBADOPT,
                       "--tokenizer: %s names no eos_token that tokenizer.json has", tdir);
        goto out;
    }
    ti->bos = tok_bos_id(tok) >= 0 ? tok_bos_id(tok) : tok_token_to_id(tok, "<|endoftext|>");
out:
    tok_free(tok);
    json_decref(cfg);
    return rc;
}

static int copy_tokenizer(const char *tdir, const char *dir, char *err, size_t errlen)
{
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",   "vocab.json",
                                        "merges.txt",     "special_tokens_map.json", "added_tokens.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[4400], to[4400];
        struct stat st;
        snprintf(from, sizeof from, "%s/%s", tdir, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (i >= 2 && stat(from, &st) != 0)
            continue;
        if (copy_file(from, to, err, errlen) < 0)
            return -1;
    }
    return 0;
}

/* ---- config files ---- */

static const char *arch_class(enum model_arch a)
{
    return a == ARCH_QWEN2       ? "Qwen2ForCausalLM"
           : a == ARCH_LLAMA     ? "LlamaForCausalLM"
           : a == ARCH_QWEN3_MOE ? "Qwen3MoeForCausalLM"
                                 : "Qwen3ForCausalLM";
}

/* Qwen3MoeConfig's keys (transformers' configuration_qwen3_moe.py). */
static void moe_keys(json_t *c, const struct tiny_opts *o)
{
    json_object_set_new(c, "num_experts", json_integer(o->experts));
    json_object_set_new(c, "num_experts_per_tok", json_integer(o->experts_per_token));
    json_object_set_new(c, "moe_intermediate_size", json_integer(o->moe_intermediate));
    json_object_set_new(c, "norm_topk_prob", json_boolean(o->norm_topk_prob));
    json_object_set_new(c, "decoder_sparse_step", json_integer(o->decoder_sparse_step));
    json_t *only = json_array();
    for (int l = 0; l < o->layers && l < MODEL_MAX_MOE_LAYERS; l++)
        if (o->mlp_only[l / 64] >> (l % 64) & 1)
            json_array_append_new(only, json_integer(l));
    json_object_set_new(c, "mlp_only_layers", only);
    json_object_set_new(c, "output_router_logits", json_false());
    json_object_set_new(c, "router_aux_loss_coef", json_real(0.001));
}

static int write_configs(const char *dir, const struct tiny_opts *o, const struct tok_info *ti, char *err,
                         size_t errlen)
{
    static const char *const dtnames[] = {
        [DT_F32] = "float32", [DT_F16] = "float16", [DT_BF16] = "bfloat16", [DT_F8_E4M3] = "bfloat16"};
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", arch_class(o->arch)));
    json_object_set_new(c, "model_type",
                        json_string(o->arch == ARCH_QWEN2       ? "qwen2"
                                    : o->arch == ARCH_LLAMA     ? "llama"
                                    : o->arch == ARCH_QWEN3_MOE ? "qwen3_moe"
                                                                : "qwen3"));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(o->intermediate));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_position));
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(o->tie));
    json_object_set_new(c, "torch_dtype", json_string(dtnames[o->dtype]));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "bos_token_id", ti->bos >= 0 ? json_integer(ti->bos) : json_null());
    json_object_set_new(c, "eos_token_id", json_integer(ti->eos_ids[0]));
    if (o->arch != ARCH_QWEN2)
        json_object_set_new(c, "attention_bias", json_false());
    if (o->arch == ARCH_LLAMA) {
        json_object_set_new(c, "mlp_bias", json_false());
        json_object_set_new(c, "pretraining_tp", json_integer(1));
    } else {
        json_object_set_new(c, "use_sliding_window", json_false());
        json_object_set_new(c, "sliding_window", json_null());
        json_object_set_new(c, "max_window_layers", json_integer(o->layers));
    }
    if (o->arch == ARCH_QWEN3_MOE)
        moe_keys(c, o);
    if (o->dtype == DT_F8_E4M3)
        json_object_set_new(c, "quantization_config",
                            json_pack("{s:s, s:s, s:s, s:[i, i]}", "activation_scheme", "dynamic", "fmt",
                                      "e4m3", "quant_method", "fp8", "weight_block_size", FP8_BLOCK,
                                      FP8_BLOCK));
    if (write_json(dir, "config.json", c, true, err, errlen) < 0)
        return -1;
    json_t *eos = json_array();
    for (int i = 0; i < ti->n_eos; i++)
        json_array_append_new(eos, json_integer(ti->eos_ids[i]));
    json_t *g = json_object();
    if (ti->bos >= 0) {
        json_object_set_new(g, "bos_token_id", json_integer(ti->bos));
        json_object_set_new(g, "pad_token_id", json_integer(ti->bos));
    }
    json_object_set_new(g, "eos_token_id", eos);
    return write_json(dir, "generation_config.json", g, true, err, errlen);
}

/* ---- weights ---- */

/* Tensors [first, last) of a plan drawn by a pool of threads, each taking the next tensor; the calling
 * thread reports progress meanwhile. */
struct draw_pool {
    struct spec *t;
    const struct tiny_opts *o;
    int last;
    atomic_int next;
    atomic_int failed;           /* the first tensor that could not be drawn + 1, or 0 */
    atomic_uint_least64_t bytes; /* bytes of the tensors drawn so far */
};

static void *draw_worker(void *arg)
{
    struct draw_pool *d = arg;
    for (int i; (i = atomic_fetch_add(&d->next, 1)) < d->last;) {
        if (generate(&d->t[i], d->o) < 0) {
            int zero = 0;
            atomic_compare_exchange_strong(&d->failed, &zero, i + 1);
            continue;
        }
        atomic_fetch_add(&d->bytes, spec_bytes(&d->t[i])); /* a scale tensor counts when it is reached */
    }
    return NULL;
}

static int tiny_threads(const struct tiny_opts *o)
{
    if (o->threads > 0)
        return o->threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 16 ? 16 : (int)n;
}

/* Draws tensors [first, last) of p with up to o->threads threads; done counts the bytes before. */
static int draw_range(struct plan *p, int first, int last, const struct tiny_opts *o, uint64_t done,
                      uint64_t total, char *err, size_t errlen)
{
    struct draw_pool d = {.t = p->t, .o = o, .last = last};
    atomic_init(&d.next, first);
    atomic_init(&d.failed, 0);
    atomic_init(&d.bytes, 0);
    int n = tiny_threads(o);
    if (n > last - first)
        n = last - first;
    pthread_t th[64];
    if (n > 64)
        n = 64;
    int started = 0;
    while (started < n - 1 && pthread_create(&th[started], NULL, draw_worker, &d) == 0)
        started++;
    if (o->progress) {
        /* the calling thread reports while the pool draws, then draws what is left itself */
        while (started > 0 && atomic_load(&d.next) < last) {
            o->progress(o->progress_arg, done + atomic_load(&d.bytes), total);
            nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
        }
    }
    draw_worker(&d);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    int bad = atomic_load(&d.failed);
    if (bad)
        return errfmt(err, errlen, "out of memory drawing %s", p->t[bad - 1].name);
    return 0;
}

/* Draws and writes the tensors of plan p (its data buffers are freed as shards are written). */
static int write_weights(const char *dir, const struct tiny_opts *o, struct plan *pp, char *err,
                         size_t errlen)
{
    struct plan p = *pp;
    int rc = -1;
    json_t *wmap = json_object();
    struct st_write *w = calloc((size_t)p.n, sizeof *w);
    if (!wmap || !w) {
        errfmt(err, errlen, "out of memory");
        goto out;
    }
    uint64_t total = 0, all = 0;
    for (int i = 0; i < p.n; i++)
        all += spec_bytes(&p.t[i]);
    for (int first = 0, shard = 0; shard < o->shards; shard++) {
        int last = first; /* tensors [first, last) go to this shard: units [u0, u1) */
        int u1 = (int)(((int64_t)(shard + 1) * p.n_units) / o->shards);
        while (last < p.n && p.t[last].unit < u1)
            last++;
        char name[64], path[4400];
        if (o->shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, o->shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (draw_range(&p, first, last, o, total, all, err, errlen) < 0)
            goto out;
        for (int i = first; i < last; i++) {
            w[i - first] = (struct st_write){.name = p.t[i].name,
                                             .dtype = p.t[i].dtype,
                                             .ndim = p.t[i].ndim,
                                             .shape = {p.t[i].shape[0], p.t[i].shape[1]},
                                             .data = p.t[i].data};
            json_object_set_new(wmap, p.t[i].name, json_string(name));
            total += spec_bytes(&p.t[i]);
        }
        int wrc = st_write_file(path, w, last - first, err, errlen);
        for (int i = first; i < last; i++) {
            free(p.t[i].data);
            p.t[i].data = NULL;
        }
        if (wrc < 0)
            goto out;
        if (o->progress)
            o->progress(o->progress_arg, total, all);
        first = last;
    }
    if (o->shards > 1) {
        json_t *idx =
            json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        if (write_json(dir, "model.safetensors.index.json", idx, true, err, errlen) < 0)
            goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < p.n; i++) {
        free(p.t[i].data);
        p.t[i].data = NULL;
    }
    free(w);
    json_decref(wmap);
    return rc;
}

static int check_opts(const struct tiny_opts *o, char *err, size_t errlen)
{
    const struct {
        const char *flag;
        long long v, min, max;
    } r[] = {{"--hidden", o->hidden, 1, 1 << 16},  {"--intermediate", o->intermediate, 1, 1 << 18},
             {"--layers", o->layers, 1, 1024},     {"--heads", o->heads, 1, 1024},
             {"--kv-heads", o->kv_heads, 1, 1024}, {"--head-dim", o->head_dim, 0, 4096},
             {"--vocab", o->vocab, 0, 1 << 30},    {"--max-position", o->max_position, 1, 1 << 30},
             {"--shards", o->shards, 1, 99999}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].min || r[i].v > r[i].max)
            return errfmt_rc(err, errlen, TINY_EBADOPT, "%s %lld is out of range [%lld, %lld]", r[i].flag,
                             r[i].v, r[i].min, r[i].max);
    if (o->heads % o->kv_heads)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--heads %d is not a multiple of --kv-heads %d", o->heads,
                         o->kv_heads);
    if (!o->head_dim && o->hidden % o->heads)
        return errfmt_rc(err, errlen, TINY_EBADOPT,
                         "--hidden %d is not a multiple of --heads %d (or give --head-dim)", o->hidden,
                         o->heads);
    if (!(o->rope_theta > 0) || o->rope_theta > 1e12)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--rope-theta %g must be positive", o->rope_theta);
    if (o->dtype != DT_BF16 && o->dtype != DT_F16 && o->dtype != DT_F32 && o->dtype != DT_F8_E4M3)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "dtype %s cannot be written (bf16, f16, f32, fp8)",
                         dtype_name(o->dtype) ? dtype_name(o->dtype) : "?");
    if (o->arch != ARCH_QWEN3 && o->arch != ARCH_QWEN2 && o->arch != ARCH_LLAMA)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "unknown architecture");
    if (o->experts < 0 || o->experts > 4096)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--experts %d is out of range [0, 4096]", o->experts);
    if (!o->experts)
        return 0;
    if (o->arch != ARCH_QWEN3)
        return errfmt_rc(err, errlen, TINY_EBADOPT,
                         "--experts: mixture of experts is Qwen3-MoE (--arch qwen3)");
    if (o->experts_per_token < 1 || o->experts_per_token > o->experts)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--experts-per-token %d is out of range [1, %d]",
                         o->experts_per_token, o->experts);
    if (o->moe_intermediate < 0 || o->moe_intermediate > 1 << 18)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--moe-intermediate %d is out of range [0, %d]",
                         o->moe_intermediate, 1 << 18);
    if (o->decoder_sparse_step < 1 || o->decoder_sparse_step > 1024)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--decoder-sparse-step %d is out of range [1, 1024]",
                         o->decoder_sparse_step);
    if (o->layers > MODEL_MAX_MOE_LAYERS)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--layers %d: at most %d with --experts", o->layers,
                         MODEL_MAX_MOE_LAYERS);
    for (int l = o->layers; l < MODEL_MAX_MOE_LAYERS; l++)
        if (o->mlp_only[l / 64] >> (l % 64) & 1)
            return errfmt_rc(err, errlen, TINY_EBADOPT, "--mlp-only-layers: %d is not a layer (0 .. %d)", l,
                             o->layers - 1);
    return 0;
}

int tiny_model_write(const char *dir, const struct tiny_opts *opts, char *err, size_t errlen)
{
    struct tiny_opts o = *opts;
    struct tok_info ti = {0};
    int rc = check_opts(&o, err, errlen);
    if (rc < 0)
        return rc;
    if (!o.head_dim)
        o.head_dim = o.hidden / o.heads;
    if (o.tokenizer_dir && (rc = read_tokenizer(o.tokenizer_dir, &ti, err, errlen)) < 0)
        return rc;
    if (o.tokenizer_dir && o.arch_from_tokenizer)
        o.arch = ti.qwen || o.experts ? ARCH_QWEN3 : ARCH_LLAMA;
    if (o.experts) {
        o.arch = ARCH_QWEN3_MOE;
        if (!o.moe_intermediate)
            o.moe_intermediate = o.intermediate;
    }
    int need = o.tokenizer_dir ? ti.max_id + 1 : MIN_TOKENS;
    if (!o.vocab)
        o.vocab = !o.tokenizer_dir                ? TINY_VOCAB
                  : ti.qwen && need <= QWEN_VOCAB ? QWEN_VOCAB
                                                  : (need + 127) / 128 * 128;
    if (o.vocab < need)
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--vocab %d is smaller than the tokenizer's %d tokens",
                         o.vocab, need);
    struct plan p = {0};
    if (make_plan(&p, &o) < 0) {
        free(p.t);
        return errfmt(err, errlen, "out of memory");
    }
    if (o.shards > p.n_units) {
        free(p.t);
        return errfmt_rc(err, errlen, TINY_EBADOPT, "--shards %d: the model has only %d weight tensors",
                         o.shards, p.n_units);
    }
    /* every check is done: only now touch the folder */
    rc = -1;
    if (mkdir_p(dir, err, errlen) < 0 || remove_old_weights(dir, err, errlen) < 0)
        goto out;
    if (o.tokenizer_dir ? copy_tokenizer(o.tokenizer_dir, dir, err, errlen) < 0
                        : write_min_tokenizer(dir, &o, &ti, err, errlen) < 0)
        goto out;
    if (write_configs(dir, &o, &ti, err, errlen) < 0)
        goto out;
    rc = write_weights(dir, &o, &p, err, errlen);
out:
    free(p.t);
    return rc;
}
