/* UTF-8 and Unicode character helpers for the tokenizer.
 *
 * Validation follows the Unicode standard (no overlong forms, no surrogates, nothing above
 * U+10FFFF), so "valid" here means exactly what Rust's `str` accepts. Lossy decoding replaces each
 * maximal ill-formed subsequence with one U+FFFD, byte for byte what Rust's
 * String::from_utf8_lossy (and therefore Hugging Face's ByteLevel decoder) produces. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length of the longest valid UTF-8 prefix of s: len when all of s is valid, otherwise the offset
 * of the first byte of the first ill-formed sequence. */
size_t tok_utf8_valid_prefix(const char *s, size_t len);

/* Decodes the character at s (which must be valid UTF-8 with at least one byte); returns its
 * length in bytes (1..4) and stores the code point in *cp. */
int tok_utf8_next(const char *s, uint32_t *cp);

/* Decodes the character that ends at s + end (valid UTF-8, end > 0); returns its length. */
int tok_utf8_prev(const char *s, size_t end, uint32_t *cp);

/* Lossy decoding of in[0..len) into out, which must hold 3 * len bytes. Invalid bytes become
 * U+FFFD as from_utf8_lossy does. When `final` is false, an incomplete but so far valid sequence
 * at the very end is not decoded: *consumed says how many input bytes were (the rest must be
 * presented again with more bytes, or with final = true). Returns the number of bytes written. */
size_t tok_utf8_lossy(const char *in, size_t len, bool final, char *out, size_t *consumed);

/* Rust's `\s` / Unicode White_Space: U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680,
 * U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
bool tok_unicode_is_space(uint32_t cp);

/* Rust regex's Unicode `\w`: letters, marks, decimal and letter numbers, connector punctuation
 * and the joiners U+200C/U+200D (general categories from utf8proc). */
bool tok_unicode_is_word(uint32_t cp);
