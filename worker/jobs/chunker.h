/* Splitting a document into chunks of at most N tokens, for map-reduce jobs: each chunk is a byte
 * range of the document, cut where the text breaks best, with a small overlap between neighbours.
 *
 * The document is tokenized once (tok_encode_ex, no special tokens). With byte-level BPE tokenizers
 * (Qwen3, Llama-3, DeepSeek-V3) the bytes of the tokens (tok_token_bytes) spell the text, which
 * gives every token its byte offset; "token k" below is the k-th token of this whole encoding, and
 * a "cut" is the byte offset where a token starts (or the end of the text) that is also the start of
 * a UTF-8 character. Chunk starts and ends are always cuts: never inside a character or a token.
 * When the tokenizer's normalizer changes the text (e.g. decomposed accents under Qwen3's NFC), the
 * tokens spell the normalized text instead: it is built piece by piece (a character with the marks
 * attached to it; normalization never joins across such pieces, which is checked), token offsets
 * map back to the text outside the changed pieces, and a token starting inside one is no cut.
 *
 * Each cut gets a kind from the text around it. W is the run of white space (Unicode White_Space)
 * around the cut, and X is the last character before W once closing quotes and brackets
 * (" ' ) ] } » ” ’ 」 』 ） 》 〉 】) are skipped. Best first:
 *   CHUNK_CUT_PARAGRAPH  W holds two or more '\n' (a blank line)
 *   CHUNK_CUT_LINE       W holds one '\n'
 *   CHUNK_CUT_SENTENCE   X is . ! ? and W is not empty, or X is 。！？｡．
 *   CHUNK_CUT_CLAUSE     X is , ; : and W is not empty, or X is ，、；：
 *   CHUNK_CUT_SPACE      W is not empty
 *   CHUNK_CUT_TOKEN      any other cut
 *
 * With C = chunk_tokens and M = overlap_tokens, a chunk starting at token s ends:
 *   - at the end of the text when at most C tokens are left;
 *   - otherwise at the best kind of cut among tokens [s + C/2, s + C] (and after the previous
 *     chunk's end), the latest one among equals. Chunks therefore hold at least half of C (of the
 *     whole encoding), except the last and chunks shrunk by the next rule.
 * The chunk's text is then encoded alone; that can give other tokens than the slice of the whole
 * encoding at its edges. While it has more than C tokens, the end moves back by the excess (to the
 * best cut again). n_tokens is the final count, always <= C.
 * The next chunk starts at the best kind of cut among tokens [e - M - M/2, e - M] of the previous
 * chunk's end e, the latest one among equals. So consecutive chunks share between M and M + M/2
 * tokens of the whole encoding (M = 0: they touch). The only exceptions, which ordinary text never
 * meets: no cut in that range (runs of tokens that each end inside a character), where the nearest
 * cut below (more overlap), else above (less), is taken; and a previous chunk shrunk to M tokens or
 * fewer, where the overlap is what the chunk allows.
 * Chunks come in document order, cover every byte, and each starts after its predecessor's start and
 * ends after its predecessor's end.
 *
 * Speed: one encoding of the whole text plus one of each chunk (more for one that shrinks). A 1 MiB
 * document takes 0.06 to 0.1 s (English or Chinese prose) and 0.26 s (random words, which the
 * tokenizer's cache of pre-tokens cannot help) on a 2-core VM with the Qwen3 tokenizer
 * (`ctest -C bench -R chunk_speed -V`). Thread-safe: the tokenizer is immutable, nothing else is
 * shared. */
#pragma once
#include <stddef.h>

struct tok;

/* Kinds of cut, worst to best (see above). */
enum chunk_cut {
    CHUNK_CUT_TOKEN = 1,
    CHUNK_CUT_SPACE,
    CHUNK_CUT_CLAUSE,
    CHUNK_CUT_SENTENCE,
    CHUNK_CUT_LINE,
    CHUNK_CUT_PARAGRAPH,
};

/* The smallest chunk_tokens chunk_document accepts. */
#define CHUNK_MIN_TOKENS 16

struct doc_chunk {
    size_t start, end; /* bytes [start, end) of the document */
    int n_tokens;      /* tokens of text[start, end) encoded alone (no special tokens), <= chunk_tokens */
    int end_cut;       /* enum chunk_cut of the end; 0 for the end of the document */
};

/* Splits text[0..len) into chunks of at most chunk_tokens tokens (>= CHUNK_MIN_TOKENS) with about
 * overlap_tokens tokens shared by neighbours (0 <= overlap_tokens, 2 * overlap_tokens < chunk_tokens),
 * by the rules above. Returns 0 with a new array in *out (caller frees with free()) of *n chunks:
 * none (and *out NULL) for an empty text, at least one otherwise. Returns -1 with err for bad
 * arguments, invalid UTF-8 (the tokenizer's message with the byte offset), a tokenizer whose tokens
 * spell neither the text nor its normalized form ("... tokens do not spell the text at byte N"; e.g.
 * an added token with lstrip in the text), text with no cut in a whole window of chunk_tokens tokens
 * (tokens that all end inside characters; not seen even in random code points), a text that
 * re-encodes to more than chunk_tokens tokens wherever it is cut, or out of memory. */
int chunk_document(const struct tok *tok, const char *text, size_t len, int chunk_tokens, int overlap_tokens,
                   struct doc_chunk **out, int *n, char *err, size_t errlen);
