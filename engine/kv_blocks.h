/* The paged KV block manager: a pool of num_blocks physical blocks of block_size token slots, and
 * per-sequence block tables (logical block i of a sequence holds its positions [i*bs, (i+1)*bs)).
 *
 * Blocks are reference counted so several sequences can share one. With prefix caching on, a
 * full block whose K/V has been computed is registered under a chain hash of (parent block's
 * hash, its block_size token ids); when its last user lets go it is kept, still findable, in an
 * LRU queue of cached blocks, and only reused (evicted) when no never-cached block is free.
 * Lookups compare the stored parent hash and token ids too, so a hash collision is never a hit.
 *
 * Everything is O(1) per block: a free stack, an intrusive doubly linked LRU list of cached free
 * blocks and an open-addressing hash table keyed by chain hash. Single-threaded. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_HASH_ROOT 0x6c6c6d712d6b7631ull /* the "parent hash" of a sequence's first block */

/* A sequence's blocks. Zero-initialized (or kv_table_init) is empty. The table owns its arrays;
 * the blocks it lists hold one reference each. A table belongs to one token sequence (its hashes
 * are of those tokens): kv_table_free it before using it for other tokens. */
struct kv_table {
    int32_t *blocks; /* [n_blocks] physical block ids */
    int n_blocks;
    size_t cap;       /* blocks' room */
    uint64_t *hashes; /* [n_hashes] chain hashes of the sequence's first full blocks of tokens;
                         computed lazily and kept across kv_table_release (tokens never change) */
    int n_hashes;
    size_t hash_cap;  /* hashes' room */
    int n_registered; /* blocks[0, n_registered) are known to the prefix cache (hit or registered) */
};

struct kv_stats {
    int num_blocks, block_size;
    int used;               /* blocks with a reference */
    int free;               /* blocks without one (kv_alloc can hand out this many) */
    int cached;             /* of the free ones, those still holding a findable prefix */
    uint64_t queries, hits; /* prefix cache: full blocks looked up / found */
    uint64_t evictions;     /* cached blocks reused for something else */
};

struct kv_pool;

/* A pool of num_blocks (>= 1) blocks of block_size (>= 1) tokens. NULL with err on failure.
 * Free with kv_pool_free. */
struct kv_pool *kv_pool_create(int num_blocks, int block_size, bool prefix_caching, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p);

int kv_num_blocks(const struct kv_pool *p);
int kv_block_size(const struct kv_pool *p);
bool kv_prefix_caching(const struct kv_pool *p);
/* Blocks kv_alloc can hand out now (never-used, released, and cached-but-unreferenced ones). */
int kv_num_free(const struct kv_pool *p);
/* Blocks needed to hold n_tokens positions. */
int kv_blocks_for(const struct kv_pool *p, int n_tokens);
void kv_get_stats(const struct kv_pool *p, struct kv_stats *st);

/* ---- single blocks */

/* Takes a free block (a never-cached one first, else the least recently used cached one, which
 * leaves the cache) with one reference. Returns its id, or -1 when none is free. */
int32_t kv_alloc(struct kv_pool *p);
/* Adds a reference to a block that has one, or that is cached (it then leaves the LRU queue). */
void kv_ref(struct kv_pool *p, int32_t b);
/* Drops a reference; at zero the block is free again (cached ones stay findable). */
void kv_unref(struct kv_pool *p, int32_t b);
/* The block's reference count (for tests and assertions). */
int kv_refcount(const struct kv_pool *p, int32_t b);

/* ---- prefix cache (all no-ops / misses when prefix caching is off) */

/* Chain hash of a full block: parent is the previous block's hash, or KV_HASH_ROOT. */
uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n);

/* ---- block tables */

void kv_table_init(struct kv_table *t);
/* Frees the table's arrays; the table must hold no blocks (kv_table_release first). */
void kv_table_free(struct kv_table *t);

/* Grows t to cover n_tokens positions, all or nothing. Returns 0, -1 when the pool has too few
 * free blocks (t is unchanged), -2 when out of memory. */
int kv_table_grow(struct kv_pool *p, struct kv_table *t, int n_tokens);

/* For an empty table: takes references on the longest run of cached blocks that matches
 * tokens[0, n_tokens) block by block, and appends them. Only full blocks match, so the result is
 * a multiple of block_size and at most n_tokens. Returns the number of tokens covered (0 when
 * prefix caching is off), or -2 when out of memory. */
int kv_table_match(struct kv_pool *p, struct kv_table *t, const int32_t *tokens, int n_tokens);

/* Registers the table's full blocks whose K/V is now computed (positions < n_computed) in the
 * prefix cache. A block whose content is already cached under another id stays unregistered.
 * Returns 0, or -2 when out of memory (nothing is lost but cache entries). */
int kv_table_commit(struct kv_pool *p, struct kv_table *t, const int32_t *tokens, int n_computed);

/* Drops the table's blocks, last block first (so a sequence's tail is evicted before its head),
 * and leaves it empty; its hashes are kept for a later kv_table_match. */
void kv_table_release(struct kv_pool *p, struct kv_table *t);

/* Checks the pool's internal consistency (lists, counts, hash table). Returns 0, or -1 with
 * what is wrong in err. For tests; O(num_blocks). */
int kv_check(const struct kv_pool *p, char *err, size_t errlen);
