/* The paged KV block manager (see kv_blocks.h).
 *
 * A block is in exactly one of three states:
 *   ref > 0                in use by ref tables (it may also be registered in the prefix cache);
 *   ref == 0, !cached      on the free stack (linked through next);
 *   ref == 0, cached       on the LRU list of cached free blocks (prev/next), head evicted first.
 * The hash table maps chain hash -> block id for every cached block, in use or not. */
#include "engine/kv_blocks.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"

struct kv_blk {
    int32_t ref;
    int32_t prev, next; /* LRU links, or the free stack's next; -1 ends */
    bool cached;        /* registered in the hash table under hash */
    uint64_t hash, parent;
};

struct kv_pool {
    int num_blocks, block_size;
    bool prefix;
    struct kv_blk *blk; /* [num_blocks] */
    int32_t *tokens;    /* [num_blocks * block_size] token ids of cached blocks (prefix only) */
    int32_t free_top;   /* free stack of never-cached blocks */
    int n_free_stack;
    int32_t lru_head, lru_tail;
    int n_lru;
    int used;
    int32_t *slots; /* hash table: block ids, -1 empty; cap a power of two */
    size_t mask;
    int n_slots_used;
    uint64_t queries, hits, evictions;
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t kv_hash_block(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++)
        h = mix64(h + (uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull);
    return h;
}

struct kv_pool *kv_pool_create(int num_blocks, int block_size, bool prefix_caching, char *err, size_t errlen)
{
    if (num_blocks < 1 || block_size < 1) {
        snprintf(err, errlen, "KV pool: %d blocks of %d tokens (both must be >= 1)", num_blocks, block_size);
        return NULL;
    }
    struct kv_pool *p = calloc(1, sizeof *p);
    if (!p)
        goto oom;
    p->num_blocks = num_blocks;
    p->block_size = block_size;
    p->prefix = prefix_caching;
    p->blk = calloc((size_t)num_blocks, sizeof *p->blk);
    if (!p->blk)
        goto oom;
    /* The free stack pops block 0 first. */
    for (int i = 0; i < num_blocks; i++) {
        p->blk[i].prev = -1;
        p->blk[i].next = i + 1 < num_blocks ? i + 1 : -1;
    }
    p->free_top = 0;
    p->n_free_stack = num_blocks;
    p->lru_head = p->lru_tail = -1;
    if (prefix_caching) {
        p->tokens = malloc((size_t)num_blocks * (size_t)block_size * sizeof *p->tokens);
        size_t cap = 16;
        while (cap < 2 * (size_t)num_blocks)
            cap *= 2;
        p->slots = malloc(cap * sizeof *p->slots);
        if (!p->tokens || !p->slots)
            goto oom;
        memset(p->slots, 0xff, cap * sizeof *p->slots);
        p->mask = cap - 1;
    }
    return p;
oom:
    kv_pool_free(p);
    snprintf(err, errlen, "KV pool: out of memory for %d blocks", num_blocks);
    return NULL;
}

void kv_pool_free(struct kv_pool *p)
{
    if (!p)
        return;
    free(p->blk);
    free(p->tokens);
    free(p->slots);
    free(p);
}

int kv_num_blocks(const struct kv_pool *p)
{
    return p->num_blocks;
}
int kv_block_size(const struct kv_pool *p)
{
    return p->block_size;
}
bool kv_prefix_caching(const struct kv_pool *p)
{
    return p->prefix;
}
int kv_num_free(const struct kv_pool *p)
{
    return p->n_free_stack + p->n_lru;
}
int kv_blocks_for(const struct kv_pool *p, int n_tokens)
{
    return n_tokens <= 0 ? 0 : (n_tokens + p->block_size - 1) / p->block_size;
}

void kv_get_stats(const struct kv_pool *p, struct kv_stats *st)
{
    st->num_blocks = p->num_blocks;
    st->block_size = p->block_size;
    st->used = p->used;
    st->free = kv_num_free(p);
    st->cached = p->n_lru;
    st->queries = p->queries;
    st->hits = p->hits;
    st->evictions = p->evictions;
}

/* ---- hash table (linear probing, backward-shift deletion) */

static size_t home(const struct kv_pool *p, uint64_t h)
{
    return (size_t)(h ^ (h >> 29)) & p->mask;
}

static int32_t ht_find(const struct kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    for (size_t i = home(p, hash);; i = (i + 1) & p->mask) {
        int32_t b = p->slots[i];
        if (b < 0)
            return -1;
        const struct kv_blk *k = &p->blk[b];
        if (k->hash == hash && k->parent == parent &&
            !memcmp(p->tokens + (size_t)b * p->block_size, tokens, (size_t)p->block_size * sizeof *tokens))
            return b;
    }
}

/* Is any block registered under this hash (whatever its content)? */
static bool ht_has_hash(const struct kv_pool *p, uint64_t hash)
{
    for (size_t i = home(p, hash);; i = (i + 1) & p->mask) {
        int32_t b = p->slots[i];
        if (b < 0)
            return false;
        if (p->blk[b].hash == hash)
            return true;
    }
}

static void ht_insert(struct kv_pool *p, int32_t b)
{
    size_t i = home(p, p->blk[b].hash);
    while (p->slots[i] >= 0)
        i = (i + 1) & p->mask;
    p->slots[i] = b;
    p->n_slots_used++;
}

static void ht_remove(struct kv_pool *p, int32_t b)
{
    size_t i = home(p, p->blk[b].hash);
    while (p->slots[i] != b) {
        assert(p->slots[i] >= 0);
        i = (i + 1) & p->mask;
    }
    /* Backward shift: pull later entries of the cluster into the hole when their home allows. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        int32_t c = p->slots[j];
        if (c < 0)
            break;
        size_t k = home(p, p->blk[c].hash);
        if (((j - k) & p->mask) >= ((j - i) & p->mask)) {
            p->slots[i] = c;
            i = j;
        }
    }
    p->slots[i] = -1;
    p->n_slots_used--;
}

/* ---- lists */

static void lru_unlink(struct kv_pool *p, int32_t b)
{
    struct kv_blk *k = &p->blk[b];
    if (k->prev >= 0)
        p->blk[k->prev].next = k->next;
    else
        p->lru_head = k->next;
    if (k->next >= 0)
        p->blk[k->next].prev = k->prev;
    else
        p->lru_tail = k->prev;
    k->prev = k->next = -1;
    p->n_lru--;
}

static void lru_push_tail(struct kv_pool *p, int32_t b)
{
    struct kv_blk *k = &p->blk[b];
    k->next = -1;
    k->prev = p->lru_tail;
    if (p->lru_tail >= 0)
        p->blk[p->lru_tail].next = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* ---- single blocks */

int32_t kv_alloc(struct kv_pool *p)
{
    int32_t b;
    if (p->free_top >= 0) {
        b = p->free_top;
        p->free_top = p->blk[b].next;
        p->n_free_stack--;
    } else if (p->lru_head >= 0) {
        b = p->lru_head;
        lru_unlink(p, b);
        ht_remove(p, b);
        p->blk[b].cached = false;
        p->evictions++;
    } else {
        return -1;
    }
    struct kv_blk *k = &p->blk[b];
    assert(k->ref == 0 && !k->cached);
    k->ref = 1;
    k->prev = k->next = -1;
    p->used++;
    return b;
}

void kv_ref(struct kv_pool *p, int32_t b)
{
    assert(b >= 0 && b < p->num_blocks);
    struct kv_blk *k = &p->blk[b];
    if (k->ref == 0) {
        assert(k->cached); /* a free never-cached block is taken with kv_alloc */
        lru_unlink(p, b);
        p->used++;
    }
    k->ref++;
}

void kv_unref(struct kv_pool *p, int32_t b)
{
    assert(b >= 0 && b < p->num_blocks);
    struct kv_blk *k = &p->blk[b];
    assert(k->ref > 0);
    if (--k->ref > 0)
        return;
    p->used--;
    if (k->cached) {
        lru_push_tail(p, b);
    } else {
        k->prev = -1;
        k->next = p->free_top;
        p->free_top = b;
        p->n_free_stack++;
    }
}

int kv_refcount(const struct kv_pool *p, int32_t b)
{
    return p->blk[b].ref;
}

/* ---- tables */

void kv_table_init(struct kv_table *t)
{
    memset(t, 0, sizeof *t);
}

void kv_table_free(struct kv_table *t)
{
    if (!t)
        return;
    assert(t->n_blocks == 0);
    free(t->blocks);
    free(t->hashes);
    kv_table_init(t);
}

static int reserve_blocks(struct kv_table *t, int n)
{
    return array_reserve(&t->blocks, &t->cap, (size_t)n, sizeof *t->blocks, 8) ? -2 : 0;
}

/* Makes hashes[0, n_full) valid for the tokens. */
static int ensure_hashes(const struct kv_pool *p, struct kv_table *t, const int32_t *tokens, int n_full)
{
    if (n_full <= t->n_hashes)
        return 0;
    if (array_reserve(&t->hashes, &t->hash_cap, (size_t)n_full, sizeof *t->hashes, 8))
        return -2;
    for (int i = t->n_hashes; i < n_full; i++) {
        uint64_t parent = i ? t->hashes[i - 1] : KV_HASH_ROOT;
        t->hashes[i] = kv_hash_block(parent, tokens + (size_t)i * p->block_size, p->block_size);
    }
    t->n_hashes = n_full;
    return 0;
}

int kv_table_grow(struct kv_pool *p, struct kv_table *t, int n_tokens)
{
    int need = kv_blocks_for(p, n_tokens) - t->n_blocks;
    if (need <= 0)
        return 0;
    if (need > kv_num_free(p))
        return -1;
    if (reserve_blocks(t, t->n_blocks + need))
        return -2;
    for (int i = 0; i < need; i++) {
        int32_t b = kv_alloc(p);
        assert(b >= 0);
        t->blocks[t->n_blocks++] = b;
    }
    return 0;
}

int kv_table_match(struct kv_pool *p, struct kv_table *t, const int32_t *tokens, int n_tokens)
{
    if (!p->prefix || t->n_blocks != 0)
        return 0;
    int n_full = n_tokens / p->block_size;
    if (n_full == 0)
        return 0;
    if (ensure_hashes(p, t, tokens, n_full) || reserve_blocks(t, n_full))
        return -2;
    int n = 0;
    while (n < n_full) {
        uint64_t parent = n ? t->hashes[n - 1] : KV_HASH_ROOT;
        p->queries++;
        int32_t b = ht_find(p, t->hashes[n], parent, tokens + (size_t)n * p->block_size);
        if (b < 0)
            break;
        p->hits++;
        kv_ref(p, b);
        t->blocks[n++] = b;
    }
    t->n_blocks = n;
    t->n_registered = n;
    return n * p->block_size;
}

int kv_table_commit(struct kv_pool *p, struct kv_table *t, const int32_t *tokens, int n_computed)
{
    if (!p->prefix)
        return 0;
    int n_full = n_computed / p->block_size;
    if (n_full > t->n_blocks)
        n_full = t->n_blocks;
    if (n_full <= t->n_registered)
        return 0;
    if (ensure_hashes(p, t, tokens, n_full))
        return -2;
    for (int i = t->n_registered; i < n_full; i++) {
        int32_t b = t->blocks[i];
        struct kv_blk *k = &p->blk[b];
        if (k->cached || ht_has_hash(p, t->hashes[i]))
            continue; /* the same content (or a colliding hash) is cached already */
        k->hash = t->hashes[i];
        k->parent = i ? t->hashes[i - 1] : KV_HASH_ROOT;
        memcpy(p->tokens + (size_t)b * p->block_size, tokens + (size_t)i * p->block_size,
               (size_t)p->block_size * sizeof *tokens);
        k->cached = true;
        ht_insert(p, b);
    }
    t->n_registered = n_full;
    return 0;
}

void kv_table_release(struct kv_pool *p, struct kv_table *t)
{
    for (int i = t->n_blocks - 1; i >= 0; i--)
        kv_unref(p, t->blocks[i]);
    t->n_blocks = 0;
    t->n_registered = 0;
}

int kv_check(const struct kv_pool *p, char *err, size_t errlen)
{
    int used = 0, n_cached = 0;
    for (int b = 0; b < p->num_blocks; b++) {
        const struct kv_blk *k = &p->blk[b];
        if (k->ref < 0) {
            snprintf(err, errlen, "block %d has refcount %d", b, k->ref);
            return -1;
        }
        used += k->ref > 0;
        if (k->cached) {
            n_cached++;
            if (!p->prefix || ht_find(p, k->hash, k->parent, p->tokens + (size_t)b * p->block_size) != b) {
                snprintf(err, errlen, "cached block %d is not findable under its hash", b);
                return -1;
            }
        }
    }
    if (used != p->used) {
        snprintf(err, errlen, "%d blocks referenced, counter says %d", used, p->used);
        return -1;
    }
    if (p->prefix && n_cached != p->n_slots_used) {
        snprintf(err, errlen, "%d cached blocks, hash table holds %d", n_cached, p->n_slots_used);
        return -1;
    }
    int n = 0;
    for (int32_t b = p->free_top; b >= 0; b = p->blk[b].next) {
        if (p->blk[b].ref || p->blk[b].cached || ++n > p->num_blocks) {
            snprintf(err, errlen, "free stack holds block %d (ref %d, cached %d) or loops", b, p->blk[b].ref,
                     p->blk[b].cached);
            return -1;
        }
    }
    if (n != p->n_free_stack) {
        snprintf(err, errlen, "free stack has %d blocks, counter says %d", n, p->n_free_stack);
        return -1;
    }
    n = 0;
    for (int32_t b = p->lru_head, prev = -1; b >= 0; prev = b, b = p->blk[b].next) {
        if (p->blk[b].ref || !p->blk[b].cached || p->blk[b].prev != prev || ++n > p->num_blocks) {
            snprintf(err, errlen, "LRU list holds block %d (ref %d, cached %d) or is mislinked", b,
                     p->blk[b].ref, p->blk[b].cached);
            return -1;
        }
    }
    if (n != p->n_lru) {
        snprintf(err, errlen, "LRU list has %d blocks, counter says %d", n, p->n_lru);
        return -1;
    }
    if (used + p->n_free_stack + p->n_lru != p->num_blocks) {
        snprintf(err, errlen, "%d used + %d free + %d cached != %d blocks", used, p->n_free_stack, p->n_lru,
                 p->num_blocks);
        return -1;
    }
    return 0;
}
