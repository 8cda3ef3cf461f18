/* Added tokens (special or not): found in the text before normalization and pre-tokenization, the
 * way Hugging Face tokenizers' AddedVocabulary does it by default.
 *
 * A set holds the tokens of one kind (normalized: false ones, matched in the raw text; or
 * normalized: true ones, matched in each normalized piece). Matching is leftmost-longest and
 * non-overlapping over all tokens of the set, and only then are the flags applied to each match:
 * single_word drops a match with a word character (Rust regex \w) right before or after it (the
 * text it covered is not searched again); lstrip widens a match over the whitespace before it (not
 * into the previous match); rstrip over the whitespace after it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok_added_token {
    char *content; /* what is matched (owned; the normalized form for normalized tokens) */
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip;
};

struct tok_added_set {
    struct tok_added_token *tokens; /* sorted by content */
    size_t n;
    uint8_t first[256]; /* first[b]: some token starts with byte b */
};

/* One piece of a split: text (id < 0) or an added token (covering the text it consumed). */
struct tok_added_split {
    size_t off, len;
    int32_t id;
};

void tok_added_set_init(struct tok_added_set *s);
void tok_added_set_free(struct tok_added_set *s);

/* Adds a token (content copied; empty content is ignored, as in HF). Call tok_added_set_finish when
 * all are in. Returns 0 or -1 when out of memory. */
int tok_added_set_add(struct tok_added_set *s, const char *content, size_t len, int32_t id, bool single_word,
                      bool lstrip, bool rstrip);
void tok_added_set_finish(struct tok_added_set *s);

/* Splits s[0..len) (valid UTF-8) into text and token pieces covering it in order; *out is a
 * growable array (caller frees) with capacity *cap, *n the number of pieces. Returns 0, or -1 when
 * out of memory. Thread-safe. */
int tok_added_split(const struct tok_added_set *set, const char *s, size_t len, struct tok_added_split **out,
                    size_t *n, size_t *cap);
