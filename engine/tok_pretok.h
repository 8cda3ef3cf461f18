/* The pre-tokenizer: splits normalized text into the pieces that BPE encodes one by one.
 *
 * tokenizer.json's "pre_tokenizer" is a step or a "Sequence" of steps, applied in order, each to
 * every piece the previous one produced (Hugging Face tokenizers semantics):
 *   - Split {pattern: {"Regex": r} | {"String": s}, behavior, invert}: regex matches, compiled with
 *     PCRE2 (UTF, UCP, JIT). HF compiles these with Oniguruma; the syntax is the same for the
 *     patterns in use, except that PCRE2's `\s` also matches U+180E and its `\w` lacks marks, so
 *     `\s`, `\S`, `\w` and `\W` are rewritten to Oniguruma's sets (Unicode White_Space; L, M, N, Pc)
 *     before compiling, and `^`/`$` match at line boundaries as in Oniguruma (PCRE2_MULTILINE).
 *     Each `\p{X}` also matches the code points of category X that the linked PCRE2's Unicode
 *     tables lack but utf8proc's have (PCRE2 10.42 is Unicode 14, HF's Oniguruma and utf8proc 2.8
 *     Unicode 15), found once per process when the first pattern is compiled.
 *   - Digits {individual_digits}: numbers split off (\p{N} one by one, or runs).
 *   - ByteLevel {add_prefix_space, use_regex}: optionally a leading space on every piece that lacks
 *     one and the GPT-2 split regex. It must be the last step, and it must be present: it is what
 *     makes the model byte-level (the byte -> character mapping itself is implicit in tok_bpe).
 * Empty pieces are dropped. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct json_t;

struct tok_pretok_step; /* one Split/Digits/ByteLevel step, compiled */

struct tok_pretok {
    struct tok_pretok_step *steps;
    int n;
};

/* Scratch for tok_pretok_run; zero-initialize, reuse across calls by one thread, free with
 * tok_pretok_work_free. */
struct tok_pretok_work {
    struct pcre2_real_match_data_8 *md;
    struct pcre2_real_match_context_8 *mctx; /* match limit, and a large JIT stack when needed */
    struct pcre2_real_jit_stack_8 *jit_stack;
    struct tok_pretok_level *levels; /* per step: the current piece's splits */
    int nlevels;
};

/* Reads and compiles the "pre_tokenizer" value j; `where` names the file for messages
 * ("tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: ..."). Returns 0 or -1 with err. */
int tok_pretok_from_json(struct tok_pretok *p, const struct json_t *j, const char *where, char *err,
                         size_t errlen);
void tok_pretok_free(struct tok_pretok *p);
void tok_pretok_work_free(struct tok_pretok_work *w);

/* Called for each piece in order; a non-zero return stops the run and is returned by it. */
typedef int (*tok_piece_fn)(void *ctx, const char *piece, size_t len);

/* Splits s[0..len) (valid UTF-8) into pieces and hands each to emit. Returns 0, what emit
 * returned, or -1 with err (out of memory, regex resource limits). */
int tok_pretok_run(const struct tok_pretok *p, const char *s, size_t len, struct tok_pretok_work *w,
                   tok_piece_fn emit, void *ctx, char *err, size_t errlen);

/* Rewrites an Oniguruma-syntax pattern for PCRE2 (see above). Returns a new string (caller frees)
 * or NULL when out of memory. Exposed for tests. */
char *tok_pretok_translate_regex(const char *pattern);
