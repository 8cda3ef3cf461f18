/* Byte-string -> int32 hash map; see tok_strmap.h. */
#include "engine/tok_strmap.h"

#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"

struct tok_strmap_slot {
    uint32_t hash; /* low 32 bits of the key's hash */
    uint32_t len;  /* key length */
    uint64_t off;  /* key offset in m->keys */
    int32_t value; /* -1: empty slot */
};

uint64_t tok_hash_bytes(const void *key, size_t len)
{
    /* FNV-1a over 8-byte words then the tail, with a final avalanche: short keys are the norm */
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull ^ (len * 0x9E3779B97F4A7C15ull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    if (len)
        memcpy(&w, p, len);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

void tok_strmap_init(struct tok_strmap *m)
{
    memset(m, 0, sizeof *m);
}

void tok_strmap_free(struct tok_strmap *m)
{
    if (!m)
        return;
    free(m->slots);
    free(m->keys);
    memset(m, 0, sizeof *m);
}

static struct tok_strmap_slot *find(const struct tok_strmap *m, const void *key, size_t len, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        struct tok_strmap_slot *s = &m->slots[i];
        if (s->value < 0)
            return s;
        if (s->hash == (uint32_t)h && s->len == len && !memcmp(m->keys + s->off, key, len))
            return s;
    }
}

static int grow(struct tok_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct tok_strmap_slot *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < cap; i++)
        slots[i].value = -1;
    struct tok_strmap old = *m;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old.cap; i++) {
        if (old.slots[i].value < 0)
            continue;
        struct tok_strmap_slot *s = &old.slots[i];
        size_t j = (size_t)(tok_hash_bytes(m->keys + s->off, s->len) >> 32) & (cap - 1);
        while (slots[j].value >= 0)
            j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(old.slots);
    return 0;
}

int tok_strmap_put(struct tok_strmap *m, const void *key, size_t len, int32_t value)
{
    if (len > UINT32_MAX || value < 0)
        return -1;
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0)
        return -1;
    uint64_t h = tok_hash_bytes(key, len);
    struct tok_strmap_slot *s = find(m, key, len, h);
    if (s->value >= 0) {
        s->value = value;
        return 0;
    }
    if (array_reserve(&m->keys, &m->keys_cap, m->keys_len + len, 1, 4096))
        return -1;
    memcpy(m->keys + m->keys_len, key, len);
    s->hash = (uint32_t)h;
    s->len = (uint32_t)len;
    s->off = m->keys_len;
    s->value = value;
    m->keys_len += len;
    m->count++;
    return 0;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const void *key, size_t len)
{
    if (!m->cap)
        return -1;
    return find(m, key, len, tok_hash_bytes(key, len))->value;
}
