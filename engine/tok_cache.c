/* Lock-striped pre-token cache; see tok_cache.h. */
#include "engine/tok_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* An entry in a stripe's arena: header, key bytes padded to 4, then the ids. */
struct entry {
    uint32_t hash;
    uint16_t klen, n;
};

struct stripe {
    pthread_mutex_t lock;
    uint32_t *slots; /* arena offset + 1 of an entry, 0 = empty; linear probing */
    uint32_t nslots, count;
    char *arena;
    size_t used, size;
    uint64_t hits, misses;
    char pad[64]; /* keep neighbouring locks off one cache line */
};

struct tok_cache {
    unsigned nstripes;
    struct stripe *s;
};

static size_t entry_size(size_t klen, size_t n)
{
    return sizeof(struct entry) + ((klen + 3) & ~(size_t)3) + 4 * n;
}

struct tok_cache *tok_cache_new(unsigned stripes, size_t bytes_per_stripe)
{
    if (stripes == 0 || (stripes & (stripes - 1)))
        return NULL;
    struct tok_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->s = calloc(stripes, sizeof *c->s);
    if (!c->s) {
        free(c);
        return NULL;
    }
    c->nstripes = stripes;
    /* about one slot per 32 arena bytes, at most half full */
    uint32_t nslots = 64;
    while ((size_t)nslots * 16 < bytes_per_stripe)
        nslots *= 2;
    for (unsigned i = 0; i < stripes; i++) {
        struct stripe *s = &c->s[i];
        pthread_mutex_init(&s->lock, NULL);
        s->nslots = nslots;
        s->slots = calloc(nslots, sizeof *s->slots);
        s->size = bytes_per_stripe;
        s->arena = malloc(bytes_per_stripe);
        if (!s->slots || !s->arena) {
            c->nstripes = i + 1;
            tok_cache_free(c);
            return NULL;
        }
    }
    return c;
}

void tok_cache_free(struct tok_cache *c)
{
    if (!c)
        return;
    for (unsigned i = 0; i < c->nstripes; i++) {
        pthread_mutex_destroy(&c->s[i].lock);
        free(c->s[i].slots);
        free(c->s[i].arena);
    }
    free(c->s);
    free(c);
}

static struct stripe *stripe_of(struct tok_cache *c, uint64_t hash)
{
    return &c->s[(hash >> 58) & (c->nstripes - 1)];
}

/* The slot holding key, or the empty slot where it would go. Called with the lock held. */
static uint32_t *find(struct stripe *s, const void *key, size_t len, uint32_t h32)
{
    uint32_t mask = s->nslots - 1;
    for (uint32_t i = h32 & mask;; i = (i + 1) & mask) {
        uint32_t v = s->slots[i];
        if (!v)
            return &s->slots[i];
        const struct entry *e = (const struct entry *)(s->arena + v - 1);
        if (e->hash == h32 && e->klen == len && !memcmp(e + 1, key, len))
            return &s->slots[i];
    }
}

long tok_cache_get(struct tok_cache *c, const void *key, size_t len, uint64_t hash, int32_t *out)
{
    if (!c || len > TOK_CACHE_MAX_KEY)
        return -1;
    struct stripe *s = stripe_of(c, hash);
    long n = -1;
    pthread_mutex_lock(&s->lock);
    uint32_t v = *find(s, key, len, (uint32_t)hash);
    if (v) {
        const struct entry *e = (const struct entry *)(s->arena + v - 1);
        n = e->n;
        memcpy(out, (const char *)(e + 1) + ((len + 3) & ~(size_t)3), 4 * (size_t)n);
        s->hits++;
    } else {
        s->misses++;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

void tok_cache_put(struct tok_cache *c, const void *key, size_t len, uint64_t hash, const int32_t *ids,
                   size_t n)
{
    if (!c || len > TOK_CACHE_MAX_KEY || n > len)
        return;
    struct stripe *s = stripe_of(c, hash);
    size_t need = entry_size(len, n);
    pthread_mutex_lock(&s->lock);
    if (s->used + need > s->size || (s->count + 1) * 2 > s->nslots) { /* full: start over */
        memset(s->slots, 0, s->nslots * sizeof *s->slots);
        s->used = 0;
        s->count = 0;
    }
    uint32_t *slot = find(s, key, len, (uint32_t)hash);
    if (!*slot) {
        struct entry *e = (struct entry *)(s->arena + s->used);
        e->hash = (uint32_t)hash;
        e->klen = (uint16_t)len;
        e->n = (uint16_t)n;
        memcpy(e + 1, key, len);
        memcpy((char *)(e + 1) + ((len + 3) & ~(size_t)3), ids, 4 * n);
        *slot = (uint32_t)s->used + 1;
        s->used += need;
        s->count++;
    }
    pthread_mutex_unlock(&s->lock);
}

void tok_cache_stats(struct tok_cache *c, uint64_t *hits, uint64_t *misses)
{
    uint64_t h = 0, m = 0;
    for (unsigned i = 0; c && i < c->nstripes; i++) {
        struct stripe *s = &c->s[i];
        pthread_mutex_lock(&s->lock);
        h += s->hits;
        m += s->misses;
        pthread_mutex_unlock(&s->lock);
    }
    *hits = h;
    *misses = m;
}
