/* The tokenizer's normalizer: Unicode normalization forms applied in order (utf8proc).
 * tokenizer.json's "normalizer" may be null, one of {"type": "NFC" | "NFD" | "NFKC" | "NFKD"}, or a
 * "Sequence" of those; anything else is rejected when loading. */
#pragma once
#include <stddef.h>

struct json_t;

#define TOK_NORM_MAX_STEPS 8

struct tok_normalizer {
    int n;                         /* steps; 0 = the identity */
    int steps[TOK_NORM_MAX_STEPS]; /* utf8proc option sets, one per step */
};

/* Reads the "normalizer" value j (NULL or JSON null: no normalizer). `where` names the file for
 * messages, e.g. "tokenizer.json: normalizer.normalizers[1].type: 'Lowercase' is not supported".
 * Returns 0 or -1 with err. */
int tok_normalizer_from_json(struct tok_normalizer *n, const struct json_t *j, const char *where, char *err,
                             size_t errlen);

/* Normalizes s[0..len) (valid UTF-8). On success *out points either at s itself (nothing changed)
 * or at a new buffer also stored in *owned (caller frees; NULL otherwise). Returns 0, or -1 when
 * out of memory. Thread-safe. */
int tok_normalize(const struct tok_normalizer *n, const char *s, size_t len, const char **out,
                  size_t *out_len, char **owned);
