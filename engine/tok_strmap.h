/* A hash map from byte strings to non-negative int32 values (token ids), for the tokenizer's
 * vocabularies. Keys are copied into the map; lookups are thread-safe once building is done. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct tok_strmap {
    struct tok_strmap_slot *slots; /* open addressing, linear probing; NULL while empty */
    size_t cap;                    /* number of slots, a power of two */
    size_t count;                  /* keys stored */
    char *keys;                    /* the key bytes, back to back */
    size_t keys_len, keys_cap;
};

/* A fresh empty map (all zero is also a valid empty map). */
void tok_strmap_init(struct tok_strmap *m);

/* Releases the map's memory; the map is empty afterwards. NULL is harmless. */
void tok_strmap_free(struct tok_strmap *m);

/* Sets key -> value (value >= 0), replacing an existing value. Returns 0, or -1 when out of memory. */
int tok_strmap_put(struct tok_strmap *m, const void *key, size_t len, int32_t value);

/* The value for key, or -1 when absent. */
int32_t tok_strmap_get(const struct tok_strmap *m, const void *key, size_t len);

/* 64-bit hash of a byte string (also used by the pre-token cache). */
uint64_t tok_hash_bytes(const void *key, size_t len);
