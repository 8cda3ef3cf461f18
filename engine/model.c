/* See model.h. Reads config.json / generation_config.json with jansson and the weights through
 * engine/safetensors.h; every weight is checked against the shapes the config implies. */
#include "engine/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/safetensors.h"
#include "engine/util/errfmt.h"
#include "engine/util/jtype.h"

/* ---- typed JSON reads: every error names the file and the key ---- */

struct jsrc {
    const char *file; /* "config.json", for messages */
    const char *obj;  /* "" or "rope_scaling." : prefix of the key in messages */
    char *err;
    size_t errlen;
};

/* The value of key, NULL when absent or null. */
static json_t *jget(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int missing(const struct jsrc *s, const char *key)
{
    return errfmt(s->err, s->errlen, "%s: missing key \"%s%s\"", s->file, s->obj, key);
}

static int wrong_type(const struct jsrc *s, const char *key, const char *want, const json_t *v)
{
    return errfmt(s->err, s->errlen, "%s: \"%s%s\" must be %s, got %s", s->file, s->obj, key, want,
                  jtype_name(v));
}

/* An integer >= min; def when absent and !required. */
static int read_int(const struct jsrc *s, const json_t *o, const char *key, bool required, int def, int min,
                    int *out)
{
    json_t *v = jget(o, key);
    if (!v) {
        if (required)
            return missing(s, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return wrong_type(s, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < min || x > 0x7fffffff)
        return errfmt(s->err, s->errlen, "%s: \"%s%s\" is %lld, must be at least %d", s->file, s->obj, key,
                      (long long)x, min);
    *out = (int)x;
    return 0;
}

/* A number (integer or real) > 0 unless allow_zero; def when absent and !required. */
static int read_num(const struct jsrc *s, const json_t *o, const char *key, bool required, double def,
                    bool allow_zero, double *out)
{
    json_t *v = jget(o, key);
    if (!v) {
        if (required)
            return missing(s, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return wrong_type(s, key, "a number", v);
    double x = json_number_value(v);
    if (!(x > 0 || (allow_zero && x == 0)))
        return errfmt(s->err, s->errlen, "%s: \"%s%s\" is %g, must be %s", s->file, s->obj, key, x,
                      allow_zero ? "at least 0" : "positive");
    *out = x;
    return 0;
}

static int read_bool(const struct jsrc *s, const json_t *o, const char *key, bool def, bool *out)
{
    json_t *v = jget(o, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return wrong_type(s, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/* A string, or NULL when absent. */
static int read_str(const struct jsrc *s, const json_t *o, const char *key, const char **out)
{
    json_t *v = jget(o, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return wrong_type(s, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* A token id (integer >= 0, < vocab), or -1 when absent. */
static int read_id(const struct jsrc *s, const json_t *o, const char *key, int vocab, int *out)
{
    if (read_int(s, o, key, false, -1, 0, out) < 0)
        return -1;
    if (*out >= vocab)
        return errfmt(s->err, s->errlen, "%s: \"%s\" is %d, beyond the vocabulary (%d)", s->file, key, *out,
                      vocab);
    return 0;
}

/* eos_token_id: an integer or a list of them. Sets *found when the key is there. */
static int read_eos(const struct jsrc *s, const json_t *o, struct model_config *c, bool *found)
{
    json_t *v = jget(o, "eos_token_id");
    *found = v != NULL;
    if (!v)
        return 0;
    c->n_eos = 0;
    if (json_is_integer(v))
        return read_id(s, o, "eos_token_id", c->vocab, &c->eos_ids[c->n_eos++]);
    if (!json_is_array(v))
        return wrong_type(s, "eos_token_id", "an integer or a list of integers", v);
    if (json_array_size(v) > MODEL_MAX_EOS)
        return errfmt(s->err, s->errlen, "%s: \"eos_token_id\" lists %zu ids, at most %d supported", s->file,
                      json_array_size(v), MODEL_MAX_EOS);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->vocab)
            return errfmt(s->err, s->errlen, "%s: \"eos_token_id\"[%zu] must be a token id below %d", s->file,
                          i, c->vocab);
        c->eos_ids[c->n_eos++] = (int)json_integer_value(x);
    }
    return 0;
}

static json_t *load_json(const char *dir, const char *file, bool optional, bool *absent, char *err,
                         size_t errlen)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (absent)
        *absent = false;
    if (optional && stat(path, &st) != 0) {
        *absent = true;
        return NULL;
    }
    if (!optional && stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
        if (stat(dir, &st) != 0)
            errfmt(err, errlen, "not a model folder (it does not exist)");
        else if (!S_ISDIR(st.st_mode))
            errfmt(err, errlen, "not a model folder (a file)");
        else
            errfmt(err, errlen, "not a model folder (no %s)", file);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line > 0)
            errfmt(err, errlen, "%s: %s (line %d)", path, je.text, je.line);
        else /* the file could not be read: jansson's text names it */
            errfmt(err, errlen, "%s", je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        errfmt(err, errlen, "%s: not a JSON object", path);
        return NULL;
    }
    return root;
}

static int parse_dtype_name(const struct jsrc *s, const json_t *o, struct model_config *c)
{
    const char *key = jget(o, "torch_dtype") ? "torch_dtype" : "dtype", *v;
    static const struct {
        const char *name;
        enum dtype t;
    } names[] = {
        {"bfloat16", DT_BF16}, {"float16", DT_F16}, {"float32", DT_F32}, {"float8_e4m3fn", DT_F8_E4M3}};
    c->torch_dtype = DT_F32; /* transformers' default when a config names none */
    if (read_str(s, o, key, &v) < 0)
        return -1;
    if (!v)
        return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v, names[i].name)) {
            c->torch_dtype = names[i].t;
            return 0;
        }
    return errfmt(s->err, s->errlen, "%s: \"%s\" '%s' is not supported (bfloat16, float16, float32)", s->file,
                  key, v);
}

static int parse_quant(const struct jsrc *s, const json_t *o, struct model_config *c)
{
    json_t *q = jget(o, "quantization_config");
    if (!q)
        return 0;
    if (!json_is_object(q))
        return wrong_type(s, "quantization_config", "an object", q);
    struct jsrc qs = *s;
    qs.obj = "quantization_config.";
    const char *method, *fmt;
    if (read_str(&qs, q, "quant_method", &method) < 0 || read_str(&qs, q, "fmt", &fmt) < 0)
        return -1;
    if (!method)
        return missing(&qs, "quant_method");
    if (strcmp(method, "fp8"))
        return errfmt(s->err, s->errlen,
                      "%s: quantization method '%s' is not supported (only fp8 with block scales)", s->file,
                      method);
    if (fmt && strcmp(fmt, "e4m3"))
        return errfmt(s->err, s->errlen, "%s: fp8 format '%s' is not supported (only e4m3)", s->file, fmt);
    json_t *b = jget(q, "weight_block_size");
    if (!b)
        return errfmt(
            s->err, s->errlen,
            "%s: quantization_config has no weight_block_size (per-tensor fp8 scales are not supported)",
            s->file);
    if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)) || json_integer_value(json_array_get(b, 0)) < 1 ||
        json_integer_value(json_array_get(b, 1)) < 1 || json_integer_value(json_array_get(b, 0)) > 1 << 20 ||
        json_integer_value(json_array_get(b, 1)) > 1 << 20)
        return errfmt(s->err, s->errlen,
                      "%s: \"quantization_config.weight_block_size\" must be [rows, cols] > 0", s->file);
    c->fp8_blocks = true;
    c->fp8_block[0] = (int)json_integer_value(json_array_get(b, 0));
    c->fp8_block[1] = (int)json_integer_value(json_array_get(b, 1));
    return 0;
}

/* rope_scaling (or transformers 5's rope_parameters): default, yarn or llama3. */
static int parse_rope(const struct jsrc *s, const json_t *o, struct model_config *c)
{
    const char *objname = "rope_scaling";
    json_t *r = jget(o, "rope_scaling");
    if (!r && jget(o, "rope_parameters")) {
        r = jget(o, "rope_parameters");
        objname = "rope_parameters";
    }
    c->rope_scaling.type = ROPE_DEFAULT;
    if (!jget(o, "rope_theta") && r && json_is_object(r) && jget(r, "rope_theta")) {
        struct jsrc rs = *s;
        rs.obj = "rope_parameters.";
        if (read_num(&rs, r, "rope_theta", true, 0, false, &c->rope_theta) < 0)
            return -1;
    }
    if (!r)
        return 0;
    if (!json_is_object(r))
        return wrong_type(s, objname, "an object", r);
    struct jsrc rs = *s;
    rs.obj = !strcmp(objname, "rope_scaling") ? "rope_scaling." : "rope_parameters.";
    const char *type;
    if (read_str(&rs, r, jget(r, "rope_type") ? "rope_type" : "type", &type) < 0)
        return -1;
    if (!type)
        return missing(&rs, "rope_type");
    if (!strcmp(type, "default"))
        return 0;
    double factor;
    if (read_num(&rs, r, "factor", true, 0, false, &factor) < 0)
        return -1;
    c->rope_scaling.factor = factor;
    if (!strcmp(type, "yarn")) {
        c->rope_scaling.type = ROPE_YARN;
        double mscale, mscale_all;
        if (read_int(&rs, r, "original_max_position_embeddings", false, c->max_position, 1,
                     &c->rope_scaling.original_max) < 0 ||
            read_num(&rs, r, "beta_fast", false, 32, false, &c->rope_scaling.beta_fast) < 0 ||
            read_num(&rs, r, "beta_slow", false, 1, false, &c->rope_scaling.beta_slow) < 0 ||
            read_num(&rs, r, "mscale", false, 1, false, &mscale) < 0 ||
            read_num(&rs, r, "mscale_all_dim", false, 0, true, &mscale_all) < 0)
            return -1;
        /* transformers' default attention factor: get_mscale(factor, mscale) / get_mscale(factor,
         * mscale_all_dim) when both are given, else 0.1 * ln(factor) + 1 (1 for factor <= 1). */
        double ms = factor <= 1 ? 1 : 0.1 * mscale * log(factor) + 1;
        if (jget(r, "mscale") && mscale_all > 0)
            ms /= factor <= 1 ? 1 : 0.1 * mscale_all * log(factor) + 1;
        return read_num(&rs, r, "attention_factor", false, ms, false, &c->rope_scaling.attn_factor);
    }
    if (!strcmp(type, "llama3")) {
        c->rope_scaling.type = ROPE_LLAMA3;
        return read_num(&rs, r, "low_freq_factor", true, 0, false, &c->rope_scaling.low_freq_factor) < 0 ||
                       read_num(&rs, r, "high_freq_factor", true, 0, false,
                                &c->rope_scaling.high_freq_factor) < 0 ||
                       read_int(&rs, r, "original_max_position_embeddings", true, 0, 1,
                                &c->rope_scaling.original_max) < 0
                   ? -1
                   : 0;
    }
    return errfmt(s->err, s->errlen, "%s: rope scaling type '%s' is not supported (default, yarn, llama3)",
                  s->file, type);
}

/* Qwen3MoeConfig's keys, with transformers' defaults where one is absent (num_experts 128,
 * num_experts_per_tok 8, moe_intermediate_size 768, norm_topk_prob false, decoder_sparse_step 1,
 * mlp_only_layers []). num_experts 0 makes every layer dense, as in transformers. */
static int parse_moe(const struct jsrc *s, const json_t *o, struct model_config *c)
{
    if (read_int(s, o, "num_experts", false, 128, 0, &c->n_experts) < 0 ||
        read_int(s, o, "num_experts_per_tok", false, 8, 1, &c->n_experts_active) < 0 ||
        read_int(s, o, "moe_intermediate_size", false, 768, 1, &c->moe_intermediate) < 0 ||
        read_bool(s, o, "norm_topk_prob", false, &c->norm_topk_prob) < 0 ||
        read_int(s, o, "decoder_sparse_step", false, 1, 1, &c->decoder_sparse_step) < 0)
        return -1;
    if (c->n_experts > 0 && c->n_experts_active > c->n_experts)
        return errfmt(s->err, s->errlen, "%s: num_experts_per_tok (%d) is larger than num_experts (%d)",
                      s->file, c->n_experts_active, c->n_experts);
    if (c->n_experts > 0 && c->n_layers > MODEL_MAX_MOE_LAYERS)
        return errfmt(s->err, s->errlen,
                      "%s: num_hidden_layers %d: at most %d layers are supported with experts", s->file,
                      c->n_layers, MODEL_MAX_MOE_LAYERS);
    json_t *v = jget(o, "mlp_only_layers");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return wrong_type(s, "mlp_only_layers", "a list of layer indices", v);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->n_layers)
            return errfmt(s->err, s->errlen, "%s: \"mlp_only_layers\"[%zu] must be a layer index below %d",
                          s->file, i, c->n_layers);
        int l = (int)json_integer_value(x);
        if (l < MODEL_MAX_MOE_LAYERS)
            c->mlp_only[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return 0;
}

bool model_layer_moe(const struct model_config *c, int l)
{
    if (c->n_experts <= 0 || l < 0 || l >= MODEL_MAX_MOE_LAYERS || c->decoder_sparse_step < 1)
        return false;
    if (c->mlp_only[l / 64] >> (l % 64) & 1)
        return false;
    return (l + 1) % c->decoder_sparse_step == 0;
}

int model_moe_layers(const struct model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += model_layer_moe(c, l);
    return n;
}

static int parse_config(const json_t *o, struct model_config *c, char *err, size_t errlen)
{
    struct jsrc s = {"config.json", "", err, errlen};
    json_t *archs = jget(o, "architectures");
    if (!archs)
        return missing(&s, "architectures");
    if (!json_is_array(archs) || !json_is_string(json_array_get(archs, 0)))
        return wrong_type(&s, "architectures", "a list of strings", archs);
    const char *arch = json_string_value(json_array_get(archs, 0));
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    if (!strcmp(arch, "Qwen3ForCausalLM")) {
        c->arch = ARCH_QWEN3;
        c->qk_norm = true;
    } else if (!strcmp(arch, "Qwen2ForCausalLM")) {
        c->arch = ARCH_QWEN2;
        c->qkv_bias = true;
    } else if (!strcmp(arch, "LlamaForCausalLM")) {
        c->arch = ARCH_LLAMA;
    } else if (!strcmp(arch, "Qwen3MoeForCausalLM")) {
        c->arch = ARCH_QWEN3_MOE;
        c->qk_norm = true;
    } else {
        return errfmt(err, errlen,
                      "config.json: architecture '%s' is not supported (Qwen3ForCausalLM, Qwen2ForCausalLM, "
                      "LlamaForCausalLM, Qwen3MoeForCausalLM)",
                      arch);
    }
    if (read_int(&s, o, "hidden_size", true, 0, 1, &c->hidden) < 0 ||
        read_int(&s, o, "intermediate_size", true, 0, 1, &c->intermediate) < 0 ||
        read_int(&s, o, "num_hidden_layers", true, 0, 1, &c->n_layers) < 0 ||
        read_int(&s, o, "num_attention_heads", true, 0, 1, &c->n_heads) < 0 ||
        read_int(&s, o, "num_key_value_heads", false, c->n_heads, 1, &c->n_kv_heads) < 0 ||
        read_int(&s, o, "vocab_size", true, 0, 1, &c->vocab) < 0)
        return -1;
    if (c->n_heads % c->n_kv_heads)
        return errfmt(err, errlen,
                      "config.json: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                      c->n_heads, c->n_kv_heads);
    if (!jget(o, "head_dim") && c->hidden % c->n_heads)
        return errfmt(
            err, errlen,
            "config.json: no head_dim, and hidden_size (%d) is not a multiple of num_attention_heads (%d)",
            c->hidden, c->n_heads);
    double eps;
    bool attn_bias, mlp_bias, sliding;
    const char *act;
    if (read_int(&s, o, "head_dim", false, c->hidden / c->n_heads, 1, &c->head_dim) < 0 ||
        read_int(&s, o, "max_position_embeddings", false, c->arch == ARCH_LLAMA ? 2048 : 32768, 1,
                 &c->max_position) < 0 ||
        read_num(&s, o, "rms_norm_eps", false, 1e-6, false, &eps) < 0 ||
        read_num(&s, o, "rope_theta", false, 10000.0, false, &c->rope_theta) < 0 ||
        read_bool(&s, o, "tie_word_embeddings", false, &c->tie_embeddings) < 0 ||
        read_bool(&s, o, "attention_bias", false, &attn_bias) < 0 ||
        read_bool(&s, o, "mlp_bias", false, &mlp_bias) < 0 ||
        read_bool(&s, o, "use_sliding_window", false, &sliding) < 0 ||
        read_str(&s, o, "hidden_act", &act) < 0)
        return -1;
    c->rms_eps = (float)eps;
    if (attn_bias && c->arch != ARCH_QWEN2)
        return errfmt(err, errlen,
                      "config.json: attention_bias true (biases on q/k/v/o) is not supported for %s", arch);
    if (mlp_bias)
        return errfmt(err, errlen, "config.json: mlp_bias true is not supported");
    if (sliding)
        return errfmt(err, errlen, "config.json: use_sliding_window true is not supported");
    if (act && strcmp(act, "silu"))
        return errfmt(err, errlen, "config.json: hidden_act '%s' is not supported (only silu)", act);
    if (parse_dtype_name(&s, o, c) < 0 || parse_quant(&s, o, c) < 0 || parse_rope(&s, o, c) < 0 ||
        (c->arch == ARCH_QWEN3_MOE && parse_moe(&s, o, c) < 0))
        return -1;
    bool found;
    if (read_eos(&s, o, c, &found) < 0 || read_id(&s, o, "bos_token_id", c->vocab, &c->bos_id) < 0 ||
        read_id(&s, o, "pad_token_id", c->vocab, &c->pad_id) < 0)
        return -1;
    return 0;
}

static int parse_generation(const json_t *o, struct model_config *c, char *err, size_t errlen)
{
    struct jsrc s = {"generation_config.json", "", err, errlen};
    bool found;
    int bos, pad;
    if (read_eos(&s, o, c, &found) < 0 || read_id(&s, o, "bos_token_id", c->vocab, &bos) < 0 ||
        read_id(&s, o, "pad_token_id", c->vocab, &pad) < 0)
        return -1;
    if (bos >= 0)
        c->bos_id = bos;
    if (pad >= 0)
        c->pad_id = pad;
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (jget(o, keys[i]))
            c->has_sampling_defaults = true;
    double t, p, mp, rp;
    if (read_num(&s, o, "temperature", false, 1.0, true, &t) < 0 ||
        read_num(&s, o, "top_p", false, 1.0, false, &p) < 0 ||
        read_int(&s, o, "top_k", false, 0, 0, &c->gen_top_k) < 0 ||
        read_num(&s, o, "min_p", false, 0.0, true, &mp) < 0 ||
        read_num(&s, o, "repetition_penalty", false, 1.0, false, &rp) < 0)
        return -1;
    if (p > 1 || mp > 1)
        return errfmt(err, errlen, "generation_config.json: top_p and min_p must be at most 1");
    c->gen_temperature = (float)t;
    c->gen_top_p = (float)p;
    c->gen_min_p = (float)mp;
    c->gen_repetition_penalty = (float)rp;
    return 0;
}

int model_config_load(const char *dir, struct model_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = cfg->pad_id = -1;
    cfg->gen_temperature = cfg->gen_top_p = cfg->gen_repetition_penalty = 1.0f;
    json_t *root = load_json(dir, "config.json", false, NULL, err, errlen);
    if (!root)
        return -1;
    int rc = parse_config(root, cfg, err, errlen);
    json_decref(root);
    if (rc < 0)
        return rc;
    bool absent;
    root = load_json(dir, "generation_config.json", true, &absent, err, errlen);
    if (!root)
        return absent ? 0 : -1;
    rc = parse_generation(root, cfg, err, errlen);
    json_decref(root);
    return rc;
}

int model_config_extend_rope(struct model_config *c, int max_model_len, char *msg, size_t msglen)
{
    if (msglen)
        msg[0] = 0;
    int native = c->max_position;
    if (max_model_len <= 0 || native <= 0 || max_model_len <= native)
        return 0;
    if (c->rope_scaling.type != ROPE_DEFAULT) {
        int orig = c->rope_scaling.original_max > 0 ? c->rope_scaling.original_max : native;
        double reach = c->rope_scaling.factor * orig;
        if (reach < max_model_len && msglen)
            snprintf(msg, msglen,
                     "max_model_len %d is above what config.json's rope_scaling (factor %g over %d) "
                     "covers (%.0f positions); kept as configured",
                     max_model_len, c->rope_scaling.factor, orig, reach);
        return 0;
    }
    double factor = ceil((double)max_model_len / native);
    c->rope_scaling.type = ROPE_YARN;
    c->rope_scaling.factor = factor;
    c->rope_scaling.original_max = native;
    c->rope_scaling.beta_fast = 32;
    c->rope_scaling.beta_slow = 1;
    c->rope_scaling.attn_factor = 0.1 * log(factor) + 1;
    if (msglen)
        snprintf(msg, msglen,
                 "max_model_len %d is above max_position_embeddings %d: YaRN enabled, as config.json "
                 "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.1f, "
                 "\"original_max_position_embeddings\": %d} would (attention factor %.4f)",
                 max_model_len, native, factor, native, c->rope_scaling.attn_factor);
    return 1;
}

/* ---- weights ---- */

#define FLOATS ST_FLOAT_MASK

struct loader {
    struct model *m;
    char name[256];
    char *err;
    size_t errlen;
};

static int get(struct loader *L, struct tensor_view *v, unsigned mask, int ndim, int64_t d0, int64_t d1,
               const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int get(struct loader *L, struct tensor_view *v, unsigned mask, int ndim, int64_t d0, int64_t d1,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->name, sizeof L->name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    return st_get(L->m->files, L->name, mask, ndim, shape, v, L->err, L->errlen);
}

/* A linear weight (out, in): a float dtype, or F8_E4M3 with its <name>_scale_inv block scales. */
static int linear(struct loader *L, struct tensor_view *v, int64_t out, int64_t in, int layer,
                  const char *what)
{
    if (get(L, v, FLOATS | DT_MASK(DT_F8_E4M3), 2, out, in, "model.layers.%d.%s.weight", layer, what) < 0)
        return -1;
    if (v->dtype != DT_F8_E4M3)
        return 0;
    const struct model_config *c = &L->m->cfg;
    int b0 = c->fp8_blocks ? c->fp8_block[0] : 128, b1 = c->fp8_blocks ? c->fp8_block[1] : 128;
    char wname[256];
    snprintf(wname, sizeof wname, "%s", L->name);
    if (get(L, NULL, FLOATS, 2, (out + b0 - 1) / b0, (in + b1 - 1) / b1, "%s_scale_inv", wname) < 0) {
        if (!st_find(L->m->files, L->name))
            snprintf(L->err, L->errlen, "%s in %s: F8_E4M3 weight without its block scales %s", wname,
                     st_file_name(L->m->files, st_find(L->m->files, wname)), L->name);
        return -1;
    }
    v->scale_inv = &st_find(L->m->files, L->name)->view;
    v->block[0] = b0;
    v->block[1] = b1;
    return 0;
}

/* The router and the experts of MoE layer l (its layer_weights.experts already points at its [E]). */
static int load_experts(struct loader *L, int l)
{
    const struct model_config *c = &L->m->cfg;
    struct layer_weights *w = &L->m->layers[l];
    const int64_t C = c->hidden, FE = c->moe_intermediate;
    if (linear(L, &w->router, c->n_experts, C, l, "mlp.gate") < 0)
        return -1;
    for (int e = 0; e < c->n_experts; e++) {
        struct expert_weights *x = &w->experts[e];
        char g[64], u[64], d[64];
        snprintf(g, sizeof g, "mlp.experts.%d.gate_proj", e);
        snprintf(u, sizeof u, "mlp.experts.%d.up_proj", e);
        snprintf(d, sizeof d, "mlp.experts.%d.down_proj", e);
        if (linear(L, &x->w_gate, FE, C, l, g) < 0 || linear(L, &x->w_up, FE, C, l, u) < 0 ||
            linear(L, &x->w_down, C, FE, l, d) < 0)
            return -1;
    }
    return 0;
}

static int load_layer(struct loader *L, int l)
{
    const struct model_config *c = &L->m->cfg;
    struct layer_weights *w = &L->m->layers[l];
    int64_t C = c->hidden, F = c->intermediate, D = c->head_dim, QD = (int64_t)c->n_heads * D,
            KD = (int64_t)c->n_kv_heads * D;
    if (get(L, &w->attn_norm, FLOATS, 1, C, 0, "model.layers.%d.input_layernorm.weight", l) < 0 ||
        linear(L, &w->wq, QD, C, l, "self_attn.q_proj") < 0 ||
        linear(L, &w->wk, KD, C, l, "self_attn.k_proj") < 0 ||
        linear(L, &w->wv, KD, C, l, "self_attn.v_proj") < 0 ||
        linear(L, &w->wo, C, QD, l, "self_attn.o_proj") < 0 ||
        get(L, &w->mlp_norm, FLOATS, 1, C, 0, "model.layers.%d.post_attention_layernorm.weight", l) < 0)
        return -1;
    if (w->experts) {
        if (load_experts(L, l) < 0)
            return -1;
    } else if (linear(L, &w->w_gate, F, C, l, "mlp.gate_proj") < 0 ||
               linear(L, &w->w_up, F, C, l, "mlp.up_proj") < 0 ||
               linear(L, &w->w_down, C, F, l, "mlp.down_proj") < 0) {
        return -1;
    }
    if (c->qkv_bias && (get(L, &w->bq, FLOATS, 1, QD, 0, "model.layers.%d.self_attn.q_proj.bias", l) < 0 ||
                        get(L, &w->bk, FLOATS, 1, KD, 0, "model.layers.%d.self_attn.k_proj.bias", l) < 0 ||
                        get(L, &w->bv, FLOATS, 1, KD, 0, "model.layers.%d.self_attn.v_proj.bias", l) < 0))
        return -1;
    if (c->qk_norm &&
        (get(L, &w->q_norm, FLOATS, 1, D, 0, "model.layers.%d.self_attn.q_norm.weight", l) < 0 ||
         get(L, &w->k_norm, FLOATS, 1, D, 0, "model.layers.%d.self_attn.k_norm.weight", l) < 0))
        return -1;
    return 0;
}

int tensor_view_check_shape(const struct tensor_view *t, const char *name, int64_t d0, int64_t d1, char *err,
                            size_t errlen)
{
    if (d1 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1) : (t->ndim == 1 && t->shape[0] == d0))
        return 0;
    char got[96];
    st_shape_str(t->ndim, t->shape, got, sizeof got);
    if (d1)
        return errfmt(err, errlen, "%s: shape %s, expected [%lld, %lld]", name, got, (long long)d0,
                      (long long)d1);
    return errfmt(err, errlen, "%s: shape %s, expected [%lld]", name, got, (long long)d0);
}

struct model *model_load(const char *dir, char *err, size_t errlen)
{
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        errfmt(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (model_config_load(dir, &m->cfg, err, errlen) < 0)
        goto fail;
    if (!(m->files = st_open_dir(dir, err, errlen)))
        goto fail;
    const struct model_config *c = &m->cfg;
    if (!(m->layers = calloc((size_t)c->n_layers, sizeof *m->layers))) {
        errfmt(err, errlen, "out of memory");
        goto fail;
    }
    const int n_moe = model_moe_layers(c);
    if (n_moe > 0 && !(m->experts = calloc((size_t)n_moe * (size_t)c->n_experts, sizeof *m->experts))) {
        errfmt(err, errlen, "out of memory");
        goto fail;
    }
    for (int l = 0, k = 0; l < c->n_layers; l++)
        if (model_layer_moe(c, l))
            m->layers[l].experts = m->experts + (size_t)k++ * (size_t)c->n_experts;
    struct loader L = {.m = m, .err = err, .errlen = errlen};
    if (get(&L, &m->embed, FLOATS, 2, c->vocab, c->hidden, "model.embed_tokens.weight") < 0)
        goto fail;
    for (int l = 0; l < c->n_layers; l++)
        if (load_layer(&L, l) < 0)
            goto fail;
    if (get(&L, &m->final_norm, FLOATS, 1, c->hidden, 0, "model.norm.weight") < 0)
        goto fail;
    /* A tied checkpoint may still carry lm_head.weight; then it is used (it equals the embedding). */
    if (!c->tie_embeddings || st_find(m->files, "lm_head.weight")) {
        if (get(&L, &m->lm_head, FLOATS, 2, c->vocab, c->hidden, "lm_head.weight") < 0)
            goto fail;
    } else {
        m->lm_head = m->embed;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    st_free(m->files);
    free(m->layers);
    free(m->experts);
    free(m);
}

int64_t tensor_numel(const struct tensor_view *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

int tensor_to_f32(const struct tensor_view *t, float *dst, char *err, size_t errlen)
{
    const char *name = t->name ? t->name : "tensor";
    if (t->dtype != DT_F8_E4M3 || !t->scale_inv) {
        if (dtype_to_f32(t->dtype, t->data, dst, (size_t)tensor_numel(t)) < 0)
            return errfmt(err, errlen, "%s: dtype %s cannot be converted to fp32", name,
                          dtype_name(t->dtype) ? dtype_name(t->dtype) : "?");
        return 0;
    }
    const struct tensor_view *s = t->scale_inv;
    int b0 = t->block[0] > 0 ? t->block[0] : 128, b1 = t->block[1] > 0 ? t->block[1] : 128;
    if (t->ndim != 2 || s->ndim != 2 || s->shape[0] != (t->shape[0] + b0 - 1) / b0 ||
        s->shape[1] != (t->shape[1] + b1 - 1) / b1)
        return errfmt(err, errlen, "%s: block scales of shape [%lld, %lld] do not fit %dx%d blocks", name,
                      (long long)s->shape[0], (long long)(s->ndim > 1 ? s->shape[1] : 0), b0, b1);
    int64_t rows = t->shape[0], cols = t->shape[1], scols = s->shape[1];
    float *scale = malloc((size_t)tensor_numel(s) * sizeof *scale);
    if (!scale)
        return errfmt(err, errlen, "%s: out of memory", name);
    if (dtype_to_f32(s->dtype, s->data, scale, (size_t)tensor_numel(s)) < 0) {
        free(scale);
        return errfmt(err, errlen, "%s: scale dtype %s cannot be converted to fp32", name,
                      dtype_name(s->dtype) ? dtype_name(s->dtype) : "?");
    }
    float lut[256];
    for (int i = 0; i < 256; i++)
        lut[i] = e4m3_to_f32((uint8_t)i);
    const uint8_t *w = t->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *srow = scale + (r / b0) * scols;
        for (int64_t c = 0; c < cols; c++)
            dst[r * cols + c] = lut[w[r * cols + c]] * srow[c / b1];
    }
    free(scale);
    return 0;
}
