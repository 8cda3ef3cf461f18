/* Loading tokenizer.json / tokenizer_config.json, encoding and decoding; see tokenizer.h. */
#include "engine/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/tok_added.h"
#include "engine/tok_bpe.h"
#include "engine/tok_cache.h"
#include "engine/tok_normalize.h"
#include "engine/tok_pretok.h"
#include "engine/tok_strmap.h"
#include "engine/tok_utf8.h"
#include "engine/util/array.h"
#include "engine/util/buf.h"

enum { E_USED = 1, E_SPECIAL = 2, E_ADDED = 4 };

struct entry {
    uint32_t str_off, str_len;     /* vocabulary form in tok->strs (NUL-terminated there) */
    uint32_t bytes_off, bytes_len; /* what it decodes to, in tok->bytes */
    uint8_t flags;
};

struct tok {
    int32_t n_ids;
    struct entry *e;         /* (n_ids) */
    struct buf strs, bytes;  /* arenas for entry strings and decoded bytes */
    struct tok_strmap vocab; /* model vocabulary: vocabulary form -> id */
    struct tok_strmap added; /* added token content -> id (looked up first, as HF does) */
    struct tok_bpe bpe;
    struct tok_normalizer norm;
    struct tok_pretok pretok;
    struct tok_added_set raw_added;  /* normalized: false, matched in the raw text */
    struct tok_added_set norm_added; /* normalized: true, matched in normalized pieces */
    int32_t *prefix, *suffix;        /* post-processor special ids around a single sequence */
    size_t n_prefix, n_suffix;
    int32_t eos, bos, pad;
    bool add_bos;
    struct tok_cache *cache;
};

/* One added token as read from the files. */
struct added_def {
    char *content;
    size_t len;
    int64_t id;
    bool single_word, lstrip, rstrip, normalized, special;
};

struct loader {
    struct tok *tok;
    const char *where; /* the file being read, for messages */
    char *err;
    size_t errlen;
    struct added_def *added;
    size_t n_added;
};

static int fail(struct loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct loader *L, const char *fmt, ...)
{
    int k = snprintf(L->err, L->errlen, "%s: ", L->where);
    if (k < 0 || (size_t)k >= L->errlen)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

/* Appends n bytes (and a NUL counted as one of its bytes when nul) to an arena whose offsets are
 * stored as uint32_t. */
static int arena_add(struct buf *b, const void *p, size_t n, bool nul)
{
    if (b->len + n + (nul ? 1 : 0) > UINT32_MAX)
        return -1;
    if (buf_append(b, p, n) || (nul && buf_append(b, "", 1)))
        return -1;
    return 0;
}

void tok_free(struct tok *tok)
{
    if (!tok)
        return;
    free(tok->e);
    buf_free(&tok->strs);
    buf_free(&tok->bytes);
    tok_strmap_free(&tok->vocab);
    tok_strmap_free(&tok->added);
    tok_bpe_free(&tok->bpe);
    tok_pretok_free(&tok->pretok);
    tok_added_set_free(&tok->raw_added);
    tok_added_set_free(&tok->norm_added);
    free(tok->prefix);
    free(tok->suffix);
    tok_cache_free(tok->cache);
    free(tok);
}

/* ---- reading tokenizer.json */

/* The whole file in memory (json_loadb parses it faster than json_load_file reads it). */
static char *slurp(const char *path, size_t *len, struct loader *L)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(L, "cannot open: %s", strerror(errno));
        return NULL;
    }
    char *p = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        fail(L, "cannot read: %s", strerror(errno));
    else if (!(p = malloc((size_t)size + 1)))
        fail(L, "out of memory");
    else if (fread(p, 1, (size_t)size, f) != (size_t)size) {
        fail(L, "cannot read: %s", ferror(f) ? strerror(errno) : "file shrank");
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)size;
    return p;
}

/* flags: JSON_DECODE_INT_AS_REAL for tokenizer_config.json, where numbers such as Llama-3's
 * model_max_length (1e30 written as an integer) overflow jansson's integers and none is needed. */
static json_t *load_json(const char *path, size_t flags, struct loader *L)
{
    json_error_t je;
    size_t len;
    char *text = slurp(path, &len, L);
    if (!text)
        return NULL;
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL | flags, &je);
    free(text);
    if (!j) {
        if (je.line < 0)
            fail(L, "%s", je.text);
        else
            fail(L, "line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        fail(L, "expected a JSON object at the top level");
        json_decref(j);
        return NULL;
    }
    return j;
}

/* A string field of an object: NULL if absent; -1 and an error if present but not a string. */
static int opt_string(struct loader *L, const json_t *o, const char *key, const char *path, const char **out)
{
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return fail(L, "%s.%s: expected a string", path, key);
    *out = json_string_value(v);
    return 0;
}

static int opt_bool(struct loader *L, const json_t *o, const char *key, bool dflt, const char *path,
                    bool *out)
{
    const json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return fail(L, "%s.%s: expected true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static int read_added_def(struct loader *L, const json_t *t, const char *path, int64_t id,
                          struct added_def *d)
{
    if (!json_is_object(t))
        return fail(L, "%s: expected an object", path);
    const json_t *c = json_object_get(t, "content");
    if (!json_is_string(c))
        return fail(L, "%s.content: expected a string", path);
    memset(d, 0, sizeof *d);
    d->id = id;
    if (opt_bool(L, t, "single_word", false, path, &d->single_word) ||
        opt_bool(L, t, "lstrip", false, path, &d->lstrip) ||
        opt_bool(L, t, "rstrip", false, path, &d->rstrip) ||
        opt_bool(L, t, "normalized", true, path, &d->normalized) ||
        opt_bool(L, t, "special", false, path, &d->special))
        return -1;
    d->len = json_string_length(c);
    d->content = malloc(d->len + 1);
    if (!d->content)
        return fail(L, "out of memory");
    memcpy(d->content, json_string_value(c), d->len + 1);
    if (tok_utf8_valid_prefix(d->content, d->len) != d->len) {
        free(d->content);
        return fail(L, "%s.content: not valid UTF-8", path);
    }
    return 0;
}

static int add_added(struct loader *L, struct added_def *d)
{
    struct added_def *v = realloc(L->added, (L->n_added + 1) * sizeof *v);
    if (!v) {
        free(d->content);
        return fail(L, "out of memory");
    }
    L->added = v;
    L->added[L->n_added++] = *d;
    return 0;
}

static int read_added_tokens(struct loader *L, const json_t *root)
{
    const json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list))
        return 0;
    if (!json_is_array(list))
        return fail(L, "added_tokens: expected an array");
    for (size_t i = 0; i < json_array_size(list); i++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        const json_t *t = json_array_get(list, i);
        const json_t *id = json_object_get(t, "id");
        if (json_is_object(t) &&
            (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX))
            return fail(L, "%s.id: expected an integer in [0, %d)", path, INT32_MAX);
        struct added_def d;
        if (read_added_def(L, t, path, json_integer_value(id), &d) != 0 || add_added(L, &d) != 0)
            return -1;
    }
    return 0;
}

/* One merge, as "a b" or ["a", "b"]: the two parts into a/alen and b/blen (borrowed from j). */
static int merge_parts(struct loader *L, const json_t *m, size_t i, const char **a, size_t *alen,
                       const char **b, size_t *blen)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return fail(L, "model.merges[%zu]: expected \"a b\" (two tokens separated by one space)", i);
        *a = s;
        *alen = (size_t)(sp - s);
        *b = sp + 1;
        *blen = n - *alen - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return fail(L, "model.merges[%zu]: expected a string \"a b\" or a pair [\"a\", \"b\"]", i);
}

static int read_model(struct loader *L, const json_t *root, int32_t *max_id)
{
    struct tok *tok = L->tok;
    const json_t *model = json_object_get(root, "model");
    if (!model)
        return fail(L, "model: missing");
    if (!json_is_object(model))
        return fail(L, "model: expected an object");
    const char *type;
    if (opt_string(L, model, "type", "model", &type) != 0)
        return -1;
    if (!type)
        return fail(L, "model.type: missing (only \"BPE\" is supported)");
    if (strcmp(type, "BPE"))
        return fail(L, "model.type: '%s' is not supported (only \"BPE\")", type);

    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return fail(L, "model.dropout: BPE dropout is not supported (expected null)");
    const char *s;
    if (opt_string(L, model, "continuing_subword_prefix", "model", &s) != 0)
        return -1;
    if (s && *s)
        return fail(L, "model.continuing_subword_prefix: '%s' is not supported (expected null or \"\")", s);
    if (opt_string(L, model, "end_of_word_suffix", "model", &s) != 0)
        return -1;
    if (s && *s)
        return fail(L, "model.end_of_word_suffix: '%s' is not supported (expected null or \"\")", s);
    bool byte_fallback;
    if (opt_bool(L, model, "byte_fallback", false, "model", &byte_fallback) != 0 ||
        opt_bool(L, model, "fuse_unk", false, "model", &tok->bpe.fuse_unk) != 0 ||
        opt_bool(L, model, "ignore_merges", false, "model", &tok->bpe.ignore_merges) != 0)
        return -1;
    if (byte_fallback)
        return fail(L, "model.byte_fallback: true is not supported: llmq reads byte-level BPE (Qwen, Llama-3, "
                       "DeepSeek-V3), not SentencePiece-style BPE with byte fallback (Gemma, Llama-2, Mistral)");

    const json_t *vocab = json_object_get(model, "vocab");
    if (!vocab)
        return fail(L, "model.vocab: missing");
    if (!json_is_object(vocab))
        return fail(L, "model.vocab: expected an object of token -> id");
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, klen, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX)
            return fail(L, "model.vocab[\"%s\"]: expected an integer id in [0, %d)", key, INT32_MAX);
        int32_t id = (int32_t)json_integer_value(val);
        if (tok_strmap_put(&tok->vocab, key, klen, id) != 0)
            return fail(L, "out of memory");
        if (id > *max_id)
            *max_id = id;
    }
    if (opt_string(L, model, "unk_token", "model", &s) != 0)
        return -1;
    if (s) {
        tok->bpe.unk_id = tok_strmap_get(&tok->vocab, s, strlen(s));
        if (tok->bpe.unk_id < 0)
            return fail(L, "model.unk_token: '%s' is not in model.vocab", s);
    }
    /* the one-byte tokens: the byte-level character of each byte */
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_bytelevel_char((unsigned char)b);
        char u[4];
        size_t n = cp < 0x80 ? 1 : 2;
        if (n == 1)
            u[0] = (char)cp;
        else {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        tok->bpe.byte_id[b] = tok_strmap_get(&tok->vocab, u, n);
    }

    const json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges))
        return 0;
    if (!json_is_array(merges))
        return fail(L, "model.merges: expected an array");
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (merge_parts(L, json_array_get(merges, i), i, &a, &alen, &b, &blen) != 0)
            goto bad;
        int32_t ia = tok_strmap_get(&tok->vocab, a, alen), ib = tok_strmap_get(&tok->vocab, b, blen);
        if (ia < 0 || ib < 0) {
            fail(L, "model.merges[%zu]: token '%.*s' is not in model.vocab", i, (int)(ia < 0 ? alen : blen),
                 ia < 0 ? a : b);
            goto bad;
        }
        if (alen + blen > cat_cap) {
            cat_cap = (alen + blen) * 2;
            char *c = realloc(cat, cat_cap);
            if (!c) {
                fail(L, "out of memory");
                goto bad;
            }
            cat = c;
        }
        memcpy(cat, a, alen);
        memcpy(cat + alen, b, blen);
        int32_t im = tok_strmap_get(&tok->vocab, cat, alen + blen);
        if (im < 0) {
            fail(L, "model.merges[%zu]: '%.*s %.*s' makes '%.*s', which is not in model.vocab", i, (int)alen,
                 a, (int)blen, b, (int)(alen + blen), cat);
            goto bad;
        }
        if (tok_bpe_add_merge(&tok->bpe, ia, ib, (uint32_t)i, im) != 0) {
            fail(L, "out of memory");
            goto bad;
        }
    }
    free(cat);
    return 0;
bad:
    free(cat);
    return -1;
}

/* The decoder must be ByteLevel (alone or as the only kind in a Sequence). */
static int check_decoder(struct loader *L, const json_t *d, const char *path)
{
    if (!d || json_is_null(d))
        return fail(L, "%s: missing; a byte-level BPE tokenizer needs the ByteLevel decoder", path);
    const char *type = json_is_object(d) ? json_string_value(json_object_get(d, "type")) : NULL;
    if (!type)
        return fail(L, "%s.type: expected a string", path);
    if (!strcmp(type, "ByteLevel"))
        return 0;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list) || json_array_size(list) == 0)
            return fail(L, "%s.decoders: expected a non-empty array", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            if (check_decoder(L, json_array_get(list, i), sub) != 0)
                return -1;
        }
        return 0;
    }
    return fail(L, "%s.type: '%s' is not supported (only ByteLevel)", path, type);
}

static int id_list_add(int32_t **v, size_t *n, int32_t id)
{
    int32_t *t = realloc(*v, (*n + 1) * sizeof *t);
    if (!t)
        return -1;
    t[(*n)++] = id;
    *v = t;
    return 0;
}

static int read_template(struct loader *L, const json_t *p, const char *path)
{
    struct tok *tok = L->tok;
    const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single))
        return fail(L, "%s.single: expected an array", path);
    int32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0;
    bool seen_a = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *item = json_array_get(single, i);
        const json_t *sp = json_object_get(item, "SpecialToken"), *seq = json_object_get(item, "Sequence");
        if (json_is_object(seq)) {
            const char *sid = json_string_value(json_object_get(seq, "id"));
            if (!sid || strcmp(sid, "A")) {
                fail(L, "%s.single[%zu].Sequence.id: expected \"A\"", path, i);
                goto bad;
            }
            seen_a = true;
            continue;
        }
        const char *name = json_is_object(sp) ? json_string_value(json_object_get(sp, "id")) : NULL;
        if (!name) {
            fail(L,
                 "%s.single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": "
                 "\"A\"}}",
                 path, i);
            goto bad;
        }
        const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        if (!json_is_array(ids)) {
            fail(L, "%s.special_tokens[\"%s\"].ids: expected an array of ids", path, name);
            goto bad;
        }
        for (size_t k = 0; k < json_array_size(ids); k++) {
            const json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX) {
                fail(L, "%s.special_tokens[\"%s\"].ids[%zu]: expected an id", path, name, k);
                goto bad;
            }
            if (id_list_add(seen_a ? &post : &pre, seen_a ? &npost : &npre, (int32_t)json_integer_value(v)) !=
                0) {
                fail(L, "out of memory");
                goto bad;
            }
        }
    }
    if (!seen_a) {
        fail(L, "%s.single: has no {\"Sequence\": {\"id\": \"A\"}}", path);
        goto bad;
    }
    /* an outer template wraps what inner ones produced */
    for (size_t i = 0; i < tok->n_prefix; i++)
        if (id_list_add(&pre, &npre, tok->prefix[i]) != 0)
            goto oom;
    for (size_t i = 0; i < npost; i++)
        if (id_list_add(&tok->suffix, &tok->n_suffix, post[i]) != 0)
            goto oom;
    free(tok->prefix);
    tok->prefix = pre;
    tok->n_prefix = npre;
    free(post);
    return 0;
oom:
    fail(L, "out of memory");
bad:
    free(pre);
    free(post);
    return -1;
}

static int read_post_processor(struct loader *L, const json_t *p, const char *path)
{
    if (!p || json_is_null(p))
        return 0;
    const char *type = json_is_object(p) ? json_string_value(json_object_get(p, "type")) : NULL;
    if (!type)
        return fail(L, "%s.type: expected a string", path);
    if (!strcmp(type, "ByteLevel")) /* only trims offsets */
        return 0;
    if (!strcmp(type, "TemplateProcessing"))
        return read_template(L, p, path);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list))
            return fail(L, "%s.processors: expected an array", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if (read_post_processor(L, json_array_get(list, i), sub) != 0)
                return -1;
        }
        return 0;
    }
    return fail(L, "%s.type: '%s' is not supported (ByteLevel, TemplateProcessing, Sequence)", path, type);
}

/* ---- reading tokenizer_config.json */

/* A special-token field: "content" or {"content": "..."}; *id = -1 when absent or null. */
static int config_token(struct loader *L, const json_t *cfg, const char *key, int32_t *id)
{
    const json_t *v = json_object_get(cfg, key);
    *id = -1;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fail(L, "%s: expected a string or {\"content\": string}", key);
    *id = tok_token_to_id(L->tok, json_string_value(v));
    if (*id < 0)
        return fail(L, "%s: '%s' is not a token of this tokenizer", key, json_string_value(v));
    return 0;
}

/* added_tokens_decoder entries that tokenizer.json lacks are added (as transformers does);
 * entries it has must agree on the content. */
static int read_config_added(struct loader *L, const json_t *cfg)
{
    const json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    if (!dec || json_is_null(dec))
        return 0;
    if (!json_is_object(dec))
        return fail(L, "added_tokens_decoder: expected an object of id -> token");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)dec, key, val)
    {
        char path[96], *end;
        snprintf(path, sizeof path, "added_tokens_decoder[\"%.40s\"]", key);
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id >= INT32_MAX)
            return fail(L, "%s: the key is not a token id", path);
        struct added_def d;
        if (read_added_def(L, val, path, id, &d) != 0)
            return -1;
        size_t k = 0;
        while (k < L->n_added && L->added[k].id != id)
            k++;
        if (k < L->n_added) {
            bool same = L->added[k].len == d.len && !memcmp(L->added[k].content, d.content, d.len);
            free(d.content);
            if (!same)
                return fail(L, "%s.content: '%s', but tokenizer.json has '%s' for id %lld", path,
                            json_string_value(json_object_get(val, "content")), L->added[k].content, id);
            continue;
        }
        if (add_added(L, &d) != 0)
            return -1;
    }
    return 0;
}

/* ---- building the id table */

static int set_entry(struct tok *tok, int32_t id, const char *str, size_t len, const char *dec, size_t declen)
{
    struct entry *e = &tok->e[id];
    e->str_off = (uint32_t)tok->strs.len;
    e->str_len = (uint32_t)len;
    if (arena_add(&tok->strs, str, len, true) != 0)
        return -1;
    /* ByteLevel decoder: byte-level characters map back to bytes; a token with other characters
     * decodes to its own UTF-8 */
    unsigned char tmp[256], *raw = declen <= sizeof tmp ? tmp : malloc(declen);
    if (!raw)
        return -1;
    long n = tok_bytelevel_decode(dec, declen, raw);
    e->bytes_off = (uint32_t)tok->bytes.len;
    int rc =
        n >= 0 ? arena_add(&tok->bytes, raw, (size_t)n, false) : arena_add(&tok->bytes, dec, declen, false);
    e->bytes_len = (uint32_t)(tok->bytes.len - e->bytes_off);
    if (raw != tmp)
        free(raw);
    e->flags |= E_USED;
    return rc;
}

/* Fills the id table from the model vocabulary and the added tokens, and builds what depends on
 * it: added-token sets, special flags, the whole-token map of ignore_merges. */
static int build(struct loader *L, const json_t *root, int32_t max_id)
{
    struct tok *tok = L->tok;
    const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    /* an added token that is in the model vocabulary takes the vocabulary's id (as HF does) */
    for (size_t i = 0; i < L->n_added; i++) {
        struct added_def *d = &L->added[i];
        int32_t v = tok_strmap_get(&tok->vocab, d->content, d->len);
        if (v >= 0)
            d->id = v;
        if (d->id > max_id)
            max_id = (int32_t)d->id;
    }
    if (max_id < 0)
        return fail(L, "model.vocab: empty");
    if (max_id >= (1 << 24))
        return fail(L, "token id %d is implausibly large (at most %d)", max_id, (1 << 24) - 1);
    tok->n_ids = max_id + 1;
    tok->e = calloc((size_t)tok->n_ids, sizeof *tok->e);
    if (!tok->e)
        return fail(L, "out of memory");

    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, klen, val)
    {
        int32_t id = (int32_t)json_integer_value(val);
        if (tok->e[id].flags & E_USED)
            return fail(L, "model.vocab[\"%s\"]: id %d is also '%s'", key, id,
                        tok->strs.p + tok->e[id].str_off);
        if (set_entry(tok, id, key, klen, key, klen) != 0)
            return fail(L, "out of memory");
        if (tok->bpe.ignore_merges) {
            unsigned char tmp[512];
            long n = klen <= sizeof tmp ? tok_bytelevel_decode(key, klen, tmp) : -1;
            if (n > 0 && tok_strmap_put(&tok->bpe.whole, tmp, (size_t)n, id) != 0)
                return fail(L, "out of memory");
        }
    }

    struct tok_strmap specials;
    tok_strmap_init(&specials);
    for (size_t i = 0; i < L->n_added; i++)
        if (L->added[i].special && tok_strmap_put(&specials, L->added[i].content, L->added[i].len, 0) != 0)
            goto oom;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        struct entry *e = &tok->e[id];
        if ((e->flags & E_USED) && tok_strmap_get(&specials, tok->strs.p + e->str_off, e->str_len) >= 0)
            e->flags |= E_SPECIAL;
    }
    for (size_t i = 0; i < L->n_added; i++) {
        struct added_def *d = &L->added[i];
        int32_t id = (int32_t)d->id;
        struct entry *e = &tok->e[id];
        if ((e->flags & E_ADDED) &&
            !(e->str_len == d->len && !memcmp(tok->strs.p + e->str_off, d->content, d->len))) {
            tok_strmap_free(&specials);
            return fail(L, "added token '%s': id %d is also added token '%s'", d->content, id,
                        tok->strs.p + e->str_off);
        }
        if ((e->flags & E_USED) && !(e->flags & E_ADDED) &&
            tok_strmap_get(&tok->vocab, d->content, d->len) != id) {
            tok_strmap_free(&specials);
            return fail(L, "added token '%s': id %d is already model.vocab's '%s'", d->content, id,
                        tok->strs.p + e->str_off);
        }
        /* a normalized token is matched, and decoded, in its normalized form */
        const char *form = d->content;
        size_t form_len = d->len;
        char *owned = NULL;
        if (d->normalized && tok_normalize(&tok->norm, d->content, d->len, &form, &form_len, &owned) != 0)
            goto oom;
        int rc = set_entry(tok, id, d->content, d->len, form, form_len);
        e->flags |= E_ADDED;
        e->flags &= (uint8_t)~E_SPECIAL;
        if (tok_strmap_get(&specials, form, form_len) >= 0)
            e->flags |= E_SPECIAL;
        if (rc == 0)
            rc = tok_strmap_put(&tok->added, d->content, d->len, id);
        if (rc == 0)
            rc = tok_added_set_add(d->normalized ? &tok->norm_added : &tok->raw_added, form, form_len, id,
                                   d->single_word, d->lstrip, d->rstrip);
        free(owned);
        if (rc != 0)
            goto oom;
    }
    tok_strmap_free(&specials);
    tok_added_set_finish(&tok->raw_added);
    tok_added_set_finish(&tok->norm_added);
    return 0;
oom:
    tok_strmap_free(&specials);
    return fail(L, "out of memory");
}

static void free_added(struct loader *L)
{
    for (size_t i = 0; i < L->n_added; i++)
        free(L->added[i].content);
    free(L->added);
    L->added = NULL;
    L->n_added = 0;
}

struct tok *tok_load(const char *json_path, const char *config_path, char *err, size_t errlen)
{
    struct tok *tok = calloc(1, sizeof *tok);
    if (!tok) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    tok_bpe_init(&tok->bpe);
    tok->eos = tok->bos = tok->pad = -1;
    struct loader L = {.tok = tok, .where = json_path, .err = err, .errlen = errlen};
    json_t *root = NULL, *cfg = NULL;
    int32_t max_id = -1;
    const char *version;

    root = load_json(json_path, 0, &L);
    if (!root || opt_string(&L, root, "version", "", &version) != 0)
        goto fail;
    if (version && strcmp(version, "1.0")) {
        fail(&L, "version: '%s' is not supported (expected \"1.0\")", version);
        goto fail;
    }
    if (read_model(&L, root, &max_id) != 0 ||
        tok_normalizer_from_json(&tok->norm, json_object_get(root, "normalizer"), json_path, err, errlen) !=
            0 ||
        tok_pretok_from_json(&tok->pretok, json_object_get(root, "pre_tokenizer"), json_path, err, errlen) !=
            0 ||
        check_decoder(&L, json_object_get(root, "decoder"), "decoder") != 0 ||
        read_added_tokens(&L, root) != 0)
        goto fail;
    if (config_path) {
        L.where = config_path;
        cfg = load_json(config_path, JSON_DECODE_INT_AS_REAL, &L);
        if (!cfg || read_config_added(&L, cfg) != 0)
            goto fail;
        L.where = json_path;
    }
    if (build(&L, root, max_id) != 0 ||
        read_post_processor(&L, json_object_get(root, "post_processor"), "post_processor") != 0)
        goto fail;
    for (size_t i = 0; i < tok->n_prefix + tok->n_suffix; i++) {
        int32_t id = i < tok->n_prefix ? tok->prefix[i] : tok->suffix[i - tok->n_prefix];
        if (id >= tok->n_ids || !(tok->e[id].flags & E_USED)) {
            fail(&L, "post_processor: special token id %d is not in the vocabulary", id);
            goto fail;
        }
    }
    if (cfg) {
        L.where = config_path;
        const json_t *ab = json_object_get(cfg, "add_bos_token");
        if (ab && !json_is_null(ab) && !json_is_boolean(ab)) {
            fail(&L, "add_bos_token: expected true or false");
            goto fail;
        }
        tok->add_bos = json_is_true(ab);
        if (config_token(&L, cfg, "eos_token", &tok->eos) != 0 ||
            config_token(&L, cfg, "bos_token", &tok->bos) != 0 ||
            config_token(&L, cfg, "pad_token", &tok->pad) != 0)
            goto fail;
    }
    tok->cache = tok_cache_new(16, 256 << 10);
    if (!tok->cache) {
        fail(&L, "out of memory");
        goto fail;
    }
    json_decref(root);
    json_decref(cfg);
    free_added(&L);
    return tok;
fail:
    json_decref(root);
    json_decref(cfg);
    free_added(&L);
    tok_free(tok);
    return NULL;
}

struct tok *tok_load_dir(const char *model_dir, char *err, size_t errlen)
{
    size_t n = strlen(model_dir) + 32;
    char *json = malloc(n), *cfg = malloc(n);
    struct tok *tok = NULL;
    if (!json || !cfg) {
        snprintf(err, errlen, "out of memory");
    } else {
        struct stat st;
        snprintf(json, n, "%s/tokenizer.json", model_dir);
        snprintf(cfg, n, "%s/tokenizer_config.json", model_dir);
        tok = tok_load(json, stat(cfg, &st) == 0 ? cfg : NULL, err, errlen);
    }
    free(json);
    free(cfg);
    return tok;
}

/* ---- encoding */

struct enc {
    const struct tok *tok;
    int32_t *ids;
    size_t n, cap;
    struct tok_bpe_work bw;
    struct tok_pretok_work pw;
    struct tok_added_split *sp1, *sp2; /* splits of the raw text, of a normalized piece */
    size_t n1, cap1, n2, cap2;
    char *err;
    size_t errlen;
};

static int reserve(struct enc *E, size_t more)
{
    if (array_reserve(&E->ids, &E->cap, E->n + more, sizeof *E->ids, 256)) {
        snprintf(E->err, E->errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int push_ids(struct enc *E, const int32_t *ids, size_t n)
{
    if (n == 0)
        return 0;
    if (reserve(E, n) != 0)
        return -1;
    memcpy(E->ids + E->n, ids, n * sizeof *ids);
    E->n += n;
    return 0;
}

/* One pre-token: from the cache, or merged and then cached. */
static int emit_piece(void *ctx, const char *p, size_t len)
{
    struct enc *E = ctx;
    if (reserve(E, len) != 0)
        return -1;
    int32_t *out = E->ids + E->n;
    bool cacheable = len <= TOK_CACHE_MAX_KEY;
    uint64_t h = cacheable ? tok_hash_bytes(p, len) : 0;
    long k = cacheable ? tok_cache_get(E->tok->cache, p, len, h, out) : -1;
    if (k < 0) {
        k = tok_bpe_encode(&E->tok->bpe, (const unsigned char *)p, len, &E->bw, out);
        if (k < 0) {
            snprintf(E->err, E->errlen, "out of memory");
            return -1;
        }
        if (cacheable)
            tok_cache_put(E->tok->cache, p, len, h, out, (size_t)k);
    }
    E->n += (size_t)k;
    return 0;
}

/* A piece of normalized text: normalized added tokens out, the rest pre-tokenized and merged. */
static int encode_normalized(struct enc *E, const char *s, size_t len)
{
    const struct tok *tok = E->tok;
    if (!tok->norm_added.n)
        return tok_pretok_run(&tok->pretok, s, len, &E->pw, emit_piece, E, E->err, E->errlen);
    if (tok_added_split(&tok->norm_added, s, len, &E->sp2, &E->n2, &E->cap2) != 0) {
        snprintf(E->err, E->errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < E->n2; i++) {
        struct tok_added_split sp = E->sp2[i];
        int rc = sp.id >= 0 ? push_ids(E, &sp.id, 1)
                            : tok_pretok_run(&tok->pretok, s + sp.off, sp.len, &E->pw, emit_piece, E, E->err,
                                             E->errlen);
        if (rc != 0)
            return -1;
    }
    return 0;
}

static int encode_segment(struct enc *E, const char *s, size_t len)
{
    const char *norm;
    size_t nlen;
    char *owned;
    if (tok_normalize(&E->tok->norm, s, len, &norm, &nlen, &owned) != 0) {
        snprintf(E->err, E->errlen, "out of memory");
        return -1;
    }
    int rc = nlen ? encode_normalized(E, norm, nlen) : 0;
    free(owned);
    return rc;
}

int tok_encode_ex(const struct tok *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                  size_t *n, char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    size_t bad = tok_utf8_valid_prefix(text, len);
    if (bad != len) {
        snprintf(err, errlen, "invalid UTF-8 at byte %zu", bad);
        return -1;
    }
    struct enc E = {.tok = tok, .err = err, .errlen = errlen};
    int rc = reserve(&E, len / 3 + 16);
    if (rc == 0 && add_special)
        rc = push_ids(&E, tok->prefix, tok->n_prefix);
    if (rc == 0 && tok->raw_added.n)
        rc = tok_added_split(&tok->raw_added, text, len, &E.sp1, &E.n1, &E.cap1);
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
    else if (!tok->raw_added.n)
        rc = len ? encode_segment(&E, text, len) : 0;
    for (size_t i = 0; rc == 0 && tok->raw_added.n && i < E.n1; i++) {
        struct tok_added_split sp = E.sp1[i];
        rc = sp.id >= 0 ? push_ids(&E, &sp.id, 1) : encode_segment(&E, text + sp.off, sp.len);
    }
    if (rc == 0 && add_special)
        rc = push_ids(&E, tok->suffix, tok->n_suffix);
    tok_bpe_work_free(&E.bw);
    tok_pretok_work_free(&E.pw);
    free(E.sp1);
    free(E.sp2);
    if (rc != 0) {
        free(E.ids);
        return -1;
    }
    *ids = E.ids;
    *n = E.n;
    return 0;
}

int tok_encode(const struct tok *tok, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
               size_t errlen)
{
    return tok_encode_ex(tok, text, len, true, ids, n, err, errlen);
}

/* ---- decoding and lookups */

int tok_decode(const struct tok *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
               size_t *len, char *err, size_t errlen)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_ids || !(tok->e[ids[i]].flags & E_USED)) {
            snprintf(err, errlen, "ids[%zu]: %d is not a token id (vocabulary size %d)", i, ids[i],
                     tok->n_ids);
            return -1;
        }
        if (!(skip_special && (tok->e[ids[i]].flags & E_SPECIAL)))
            total += tok->e[ids[i]].bytes_len;
    }
    char *raw = malloc(total + 1), *out = malloc(3 * total + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct entry *e = &tok->e[ids[i]];
        if (skip_special && (e->flags & E_SPECIAL))
            continue;
        memcpy(raw + k, tok->bytes.p + e->bytes_off, e->bytes_len);
        k += e->bytes_len;
    }
    size_t olen = tok_utf8_lossy(raw, total, true, out, NULL);
    free(raw);
    out[olen] = 0;
    *text = out;
    *len = olen;
    return 0;
}

static const struct entry *entry_of(const struct tok *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_ids || !(tok->e[id].flags & E_USED))
        return NULL;
    return &tok->e[id];
}

int32_t tok_vocab_size(const struct tok *tok)
{
    return tok->n_ids;
}

int32_t tok_token_to_id(const struct tok *tok, const char *token)
{
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&tok->added, token, n);
    return id >= 0 ? id : tok_strmap_get(&tok->vocab, token, n);
}

const char *tok_id_to_token(const struct tok *tok, int32_t id)
{
    const struct entry *e = entry_of(tok, id);
    return e ? tok->strs.p + e->str_off : NULL;
}

int tok_normalize_text(const struct tok *tok, const char *text, size_t len, const char **out, size_t *out_len,
                       char **owned)
{
    return tok_normalize(&tok->norm, text, len, out, out_len, owned);
}

const char *tok_token_bytes(const struct tok *tok, int32_t id, size_t *len)
{
    const struct entry *e = entry_of(tok, id);
    *len = e ? e->bytes_len : 0;
    return e ? tok->bytes.p + e->bytes_off : NULL;
}

bool tok_is_special(const struct tok *tok, int32_t id)
{
    const struct entry *e = entry_of(tok, id);
    return e && (e->flags & E_SPECIAL);
}

bool tok_is_added(const struct tok *tok, int32_t id)
{
    const struct entry *e = entry_of(tok, id);
    return e && (e->flags & E_ADDED);
}

int32_t tok_eos_id(const struct tok *tok)
{
    return tok->eos;
}
int32_t tok_bos_id(const struct tok *tok)
{
    return tok->bos;
}
int32_t tok_pad_id(const struct tok *tok)
{
    return tok->pad;
}
bool tok_add_bos(const struct tok *tok)
{
    return tok->add_bos;
}

void tok_stats(const struct tok *tok, uint64_t *hits, uint64_t *misses)
{
    tok_cache_stats(tok->cache, hits, misses);
}
