/* A thread-safe cache from pre-token bytes to their BPE ids, shared by all threads that encode with
 * one tokenizer. Lock-striped: the key's hash picks one of `stripes` shards, each a small hash
 * table with its own mutex and a fixed memory budget; a full shard is simply emptied. Only speed
 * depends on it, never results. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok_cache;

/* A cache of `stripes` shards (a power of two) of about `bytes_per_stripe` each. NULL when out of
 * memory. */
struct tok_cache *tok_cache_new(unsigned stripes, size_t bytes_per_stripe);
void tok_cache_free(struct tok_cache *c);

/* Longest key worth caching; longer pre-tokens are rare and cheap to miss. */
#define TOK_CACHE_MAX_KEY 128

/* Looks key up (hash = tok_hash_bytes(key, len)); on a hit copies the ids into out (capacity
 * >= len ids) and returns their number, otherwise returns -1. */
long tok_cache_get(struct tok_cache *c, const void *key, size_t len, uint64_t hash, int32_t *out);

/* Stores key -> ids (n <= len); ignored for keys over TOK_CACHE_MAX_KEY. */
void tok_cache_put(struct tok_cache *c, const void *key, size_t len, uint64_t hash, const int32_t *ids,
                   size_t n);

/* Hits and misses so far (for the benchmark; approximate under concurrency). */
void tok_cache_stats(struct tok_cache *c, uint64_t *hits, uint64_t *misses);
