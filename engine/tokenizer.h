/* The tokenizer: Hugging Face byte-level BPE (Qwen2/2.5/3, Llama-3, GPT-2 style) in plain C.
 *
 * Loads tokenizer.json (model BPE with vocab and merges; normalizer null, NFC/NFD/NFKC/NFKD or a
 * Sequence of them; pre_tokenizer Split/Digits steps ending in ByteLevel; decoder ByteLevel;
 * post_processor null, ByteLevel or TemplateProcessing) and optionally tokenizer_config.json
 * (added_tokens_decoder, eos_token, bos_token, pad_token, add_bos_token). Anything else is refused
 * with an error naming the file and the JSON path. "truncation" and "padding" are ignored.
 *
 * Encoding is Hugging Face tokenizers' Tokenizer::encode, step for step:
 *   1. added tokens with normalized: false are cut out of the raw text (leftmost-longest, with
 *      their single_word / lstrip / rstrip flags, see tok_added.h);
 *   2. each remaining piece is normalized, then added tokens with normalized: true are cut out;
 *   3. the rest is pre-tokenized (tok_pretok.h) and each pre-token is BPE-merged over its bytes
 *      (tok_bpe.h), with a lock-striped cache of recent pre-tokens (tok_cache.h);
 *   4. with add_special, the post-processor's template adds its special tokens (e.g. Llama-3's BOS).
 * Decoding maps ids to their bytes (ByteLevel decoder), optionally skipping special tokens, and
 * replaces invalid UTF-8 with U+FFFD exactly as String::from_utf8_lossy does.
 *
 * Ids are int32_t in [0, tok_vocab_size). A loaded tokenizer is immutable: every function here may
 * be called from several threads at once, except tok_free, and a struct tok_stream belongs to one
 * thread at a time. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;

/* Loads tokenizer.json from json_path and, when config_path is not NULL, tokenizer_config.json.
 * Returns the tokenizer (free with tok_free) or NULL with a message in err, e.g.
 * "/m/tokenizer.json: model.merges[3]: 'a b' needs token 'ab', which is not in model.vocab". */
struct tok *tok_load(const char *json_path, const char *config_path, char *err, size_t errlen);

/* Loads model_dir/tokenizer.json and model_dir/tokenizer_config.json (the latter only if it
 * exists). Same contract as tok_load. */
struct tok *tok_load_dir(const char *model_dir, char *err, size_t errlen);

/* NULL is harmless. */
void tok_free(struct tok *tok);

/* Encodes text[0..len) (UTF-8; NUL bytes are ordinary characters) as Hugging Face's
 * tokenizer.encode(text) does with add_special_tokens=True (for Qwen that adds nothing). On success
 * *ids is a new array of *n ids (caller frees with free(); non-NULL even when *n is 0). Returns 0,
 * or -1 with err: invalid UTF-8 ("invalid UTF-8 at byte 17"; HF only takes valid strings), or out
 * of memory. Thread-safe. */
int tok_encode(const struct tok *tok, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
               size_t errlen);

/* tok_encode with the post-processor's special tokens only when add_special is true. A prompt
 * rendered by the chat template already has its special tokens: encode it with add_special false. */
int tok_encode_ex(const struct tok *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                  size_t *n, char *err, size_t errlen);

/* Normalizes text[0..len) (valid UTF-8) with tokenizer.json's "normalizer", as encoding does before
 * pre-tokenizing. *out is text itself when nothing changes (*owned NULL), else a new buffer also
 * stored in *owned (caller frees). Returns 0, or -1 when out of memory. Thread-safe. */
int tok_normalize_text(const struct tok *tok, const char *text, size_t len, const char **out, size_t *out_len,
                       char **owned);

/* Decodes ids into a new NUL-terminated UTF-8 string *text of *len bytes (caller frees with free()),
 * like HF's tokenizer.decode(ids, skip_special_tokens). Bytes that do not form valid UTF-8 become
 * U+FFFD. Returns 0, or -1 with err for an id outside [0, tok_vocab_size) (HF silently drops
 * those; we refuse them) or out of memory. */
int tok_decode(const struct tok *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
               size_t *len, char *err, size_t errlen);

/* Size of the id space: one more than the highest id of the vocabulary and added tokens
 * (151669 for Qwen3; the model's embedding table may be larger). Some ids below it may be unused
 * (tok_id_to_token gives NULL for them). */
int32_t tok_vocab_size(const struct tok *tok);

/* The id of a token given in its vocabulary form (byte-level characters, e.g. "Ġthe", or an added
 * token's content such as "<|im_end|>"); -1 if there is none. */
int32_t tok_token_to_id(const struct tok *tok, const char *token);

/* The vocabulary form of an id (NUL-terminated, owned by tok, valid until tok_free), or NULL for an
 * unused or out-of-range id. */
const char *tok_id_to_token(const struct tok *tok, int32_t id);

/* The bytes an id decodes to (not NUL-terminated, possibly a partial UTF-8 character; owned by tok),
 * with their count in *len; NULL for an unused or out-of-range id. For stop strings and logprobs. */
const char *tok_token_bytes(const struct tok *tok, int32_t id, size_t *len);

/* True for tokens marked "special" (skipped by decoding with skip_special). */
bool tok_is_special(const struct tok *tok, int32_t id);

/* True for added tokens (special or not), e.g. Qwen's <think>. */
bool tok_is_added(const struct tok *tok, int32_t id);

/* Ids of tokenizer_config.json's eos_token, bos_token and pad_token; -1 when absent (or no config). */
int32_t tok_eos_id(const struct tok *tok);
int32_t tok_bos_id(const struct tok *tok);
int32_t tok_pad_id(const struct tok *tok);

/* tokenizer_config.json's add_bos_token (false when absent). Informational: the post-processor is
 * what tok_encode follows. */
bool tok_add_bos(const struct tok *tok);

/* Pre-token cache hits and misses since loading (for benchmarks). */
void tok_stats(const struct tok *tok, uint64_t *hits, uint64_t *misses);

/* ---- incremental decoding, for streaming generated text
 *
 * Push ids one at a time; each push returns the text that became complete: whole UTF-8 characters
 * only, so a character split over several tokens comes out once its last byte arrives. Bytes that
 * can no longer form a valid character come out as U+FFFD right away. tok_stream_flush returns
 * what is left (an incomplete character becomes U+FFFD). The concatenation of all pieces equals
 * tok_decode of all ids with the same skip_special. */
struct tok_stream;

/* A decoder for tok (which must outlive it); NULL when out of memory. */
struct tok_stream *tok_stream_new(const struct tok *tok, bool skip_special);

/* NULL is harmless. */
void tok_stream_free(struct tok_stream *s);

/* Feeds one id. *text (borrowed, valid until the next call on s; NUL-terminated) and *len receive
 * the new complete text, possibly empty. Returns 0, or -1 with err for an unknown id (nothing is
 * consumed; the stream stays usable) or out of memory. */
int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen);

/* Emits whatever is pending (lossy) and resets the stream for a new sequence. Same output
 * contract as tok_stream_push; never fails. */
void tok_stream_flush(struct tok_stream *s, const char **text, size_t *len);

/* Bytes pushed but not yet emitted (0..3): part of a UTF-8 character still waiting for its end. */
size_t tok_stream_pending(const struct tok_stream *s);
