/* Grammars that constrain decoding (structured output, docs/STRUCTURED_OUTPUT.md).
 *
 * A grammar is a context-free grammar over bytes, compiled from a JSON Schema (engine/json_schema.h),
 * from "any JSON object", from a regular expression or from a list of choices. It is immutable once
 * built, reference counted, and shared by every sequence that uses it; it also owns the cache of
 * token masks computed against one vocabulary (a gr_vocab, which must outlive it).
 *
 * A sequence follows a grammar with a gr_matcher: gr_matcher_mask gives the set of token ids whose
 * bytes keep the output inside the grammar (byte-level BPE tokens that cross grammar boundaries are
 * judged exactly, byte by byte), plus the end-of-sequence ids once the output is a complete
 * sentence; gr_matcher_accept moves the matcher over the token that was sampled.
 *
 * What each compiler generates (the whitespace policy, property order, numbers) is written in
 * docs/STRUCTURED_OUTPUT.md, "What the grammar generates". Every sentence a grammar generates from a
 * schema validates against it (js_validate); the converse is not promised (properties come in schema
 * order, numbers without exponents, whitespace bounded).
 *
 * Thread safety: a grammar may be used by several matchers on several threads at once (its mask cache
 * is locked); one matcher is used by one thread at a time. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;
struct js_schema;
struct grammar;
struct gr_vocab;
struct gr_matcher;

/* ---- vocabulary ---- */

/* The byte strings of tok's ids, in a trie, for computing masks. Ids that are added tokens (special
 * or not: chat markers, think tags), unused ids and ids with no bytes are never allowed by a grammar;
 * eos_ids[0..n_eos) are allowed exactly where the grammar may end. vocab is the width of a mask in ids
 * (the model's logits row; >= tok_vocab_size: ids from tok_vocab_size on are never allowed). tok is
 * only read during the call (the vocabulary keeps its own copy of the bytes). Returns NULL with err
 * when an eos id is outside [0, vocab) or memory runs out. Free with gr_vocab_free (NULL harmless). */
struct gr_vocab *gr_vocab_new(const struct tok *tok, int vocab, const int32_t *eos_ids, int n_eos, char *err,
                              size_t errlen);
void gr_vocab_free(struct gr_vocab *v);
/* Words of a mask: (vocab + 31) / 32 uint32_t, bit (id & 31) of word (id >> 5) set = id allowed. */
int gr_vocab_mask_words(const struct gr_vocab *v);

/* ---- compiling ---- */

/* Each compiler returns a grammar with one reference, or NULL with err. v may be NULL for a grammar
 * that is only matched byte by byte (tests); gr_matcher_mask then fails. v is borrowed and must
 * outlive the grammar. */

/* Values that validate against s (s is only read during the call). Refuses, with err, bounds it cannot
 * express exactly (docs/STRUCTURED_OUTPUT.md). */
struct grammar *gr_compile_schema(const struct js_schema *s, const struct gr_vocab *v, char *err,
                                  size_t errlen);
/* Any JSON object (response_format json_object). */
struct grammar *gr_compile_json_object(const struct gr_vocab *v, char *err, size_t errlen);
/* Outputs the whole of which matches pattern (ECMA-262 syntax, the subset in
 * docs/STRUCTURED_OUTPUT.md; implicitly anchored at both ends). Refuses what it cannot express with
 * err naming the construct and its offset in the pattern. */
struct grammar *gr_compile_regex(const char *pattern, const struct gr_vocab *v, char *err, size_t errlen);
/* Outputs equal to one of choices[0..n) (n >= 1; raw text, not JSON). */
struct grammar *gr_compile_choice(const char *const *choices, size_t n, const struct gr_vocab *v, char *err,
                                  size_t errlen);

/* Reference counting: gr_ref adds a reference and returns g; gr_unref drops one and frees g at zero.
 * NULL is harmless. */
struct grammar *gr_ref(struct grammar *g);
void gr_unref(struct grammar *g);

/* The vocabulary g was compiled against (borrowed), or NULL. */
const struct gr_vocab *gr_grammar_vocab(const struct grammar *g);

/* Mask cache figures of g since it was built (for metrics and `llmq bench`): masks served from the
 * cache, masks computed, and the seconds spent computing them. */
struct gr_stats {
    uint64_t hits, misses;
    double compute_s;
    size_t cache_bytes;
};
void gr_get_stats(struct grammar *g, struct gr_stats *st);

/* ---- matching ---- */

/* A matcher at the start of g (takes a reference to g, released by gr_matcher_free). NULL when out of
 * memory. */
struct gr_matcher *gr_matcher_new(struct grammar *g);
void gr_matcher_free(struct gr_matcher *m);

/* Writes the allowed ids of m's current state into mask[gr_vocab_mask_words]: every id whose bytes can
 * follow the output so far, and the eos ids when the output so far is a complete sentence; none once
 * m has ended. From g's cache when the state was seen before. Returns 0, or -1 with err (no
 * vocabulary; a limit of the grammar's states; out of memory). */
int gr_matcher_mask(struct gr_matcher *m, uint32_t *mask, char *err, size_t errlen);
/* Moves m over token: its bytes, or the end when it is an eos id (then gr_matcher_ended). Returns 0,
 * or -1 when the grammar does not allow it (m is unchanged): an eos id before the output is complete,
 * an id no mask allows (added, unused, outside the vocabulary), any id after the end. */
int gr_matcher_accept(struct gr_matcher *m, int32_t token);
/* Moves m over raw bytes (tests, and forced text). Returns 0, or -1 when the grammar does not allow
 * them (m is unchanged). */
int gr_matcher_accept_bytes(struct gr_matcher *m, const char *bytes, size_t n);
/* Whether the bytes so far form a complete sentence of the grammar (it may still go on). */
bool gr_matcher_complete(const struct gr_matcher *m);
/* Whether an eos id has been accepted. */
bool gr_matcher_ended(const struct gr_matcher *m);
