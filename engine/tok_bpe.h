/* Byte-level BPE: the GPT-2 byte <-> character alphabet, and the merge loop that turns the bytes of
 * one pre-token into token ids by merge rank.
 *
 * The loop is Hugging Face tokenizers' Word::merge_all, step for step: every adjacent pair with a
 * merge goes into a min-heap keyed by (rank, position); the lowest is merged, stale entries are
 * dropped when popped, and the new neighbour pairs are pushed. O(n log n) per pre-token.
 * All functions are thread-safe on a built struct tok_bpe (each thread brings its own work area). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tok_strmap.h"

struct tok_bpe_merge; /* one (left, right) -> (rank, merged id) entry */

struct tok_bpe {
    int32_t byte_id[256];         /* id of the token that is exactly this byte; -1 when absent */
    struct tok_bpe_merge *merges; /* hash table of merges (open addressing) */
    size_t merges_cap, n_merges;  /* slots (a power of two), entries */
    bool ignore_merges;           /* a pre-token that is a whole vocabulary entry maps to it directly */
    struct tok_strmap whole;      /* raw bytes -> id of every byte-level vocabulary entry (ignore_merges) */
    int32_t unk_id;               /* token for bytes without a token; -1: such bytes are dropped (as HF) */
    bool fuse_unk;                /* consecutive unknown bytes become one unk token */
};

/* Scratch memory for tok_bpe_encode; zero-initialize, reuse across calls, free with tok_bpe_work_free. */
struct tok_bpe_work {
    struct tok_bpe_sym *sym;
    struct tok_bpe_heap_entry *heap;
    size_t sym_cap, heap_cap;
};

/* An empty model: no byte tokens, no merges. */
void tok_bpe_init(struct tok_bpe *b);
void tok_bpe_free(struct tok_bpe *b);
void tok_bpe_work_free(struct tok_bpe_work *w);

/* Adds the merge (left, right) -> merged with the given rank; a later call for the same pair
 * replaces the earlier one, as in HF's merge map. Returns 0 or -1 when out of memory. */
int tok_bpe_add_merge(struct tok_bpe *b, int32_t left, int32_t right, uint32_t rank, int32_t merged);

/* Encodes one pre-token (raw bytes, len > 0) and writes its ids to out, which must hold len ids.
 * Returns the number of ids, or -1 when out of memory. */
long tok_bpe_encode(const struct tok_bpe *b, const unsigned char *piece, size_t len, struct tok_bpe_work *w,
                    int32_t *out);

/* The byte-level alphabet (GPT-2's bytes_to_unicode): the code point that stands for byte b. */
uint32_t tok_bytelevel_char(unsigned char b);

/* The byte a code point stands for, or -1 when it is not in the alphabet. */
int tok_bytelevel_byte(uint32_t cp);

/* Maps a byte-level string (valid UTF-8) back to raw bytes in out (capacity >= len). Returns the
 * number of bytes, or -1 when some character is not in the alphabet. */
long tok_bytelevel_decode(const char *s, size_t len, unsigned char *out);
