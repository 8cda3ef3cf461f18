/* Byte-level alphabet and the BPE merge loop; see tok_bpe.h. */
#include "engine/tok_bpe.h"

#include <stdlib.h>
#include <string.h>

#include "engine/tok_utf8.h"

struct tok_bpe_merge {
    uint64_t key;   /* (left << 32) | right; UINT64_MAX marks an empty slot */
    uint32_t rank;  /* position in the merges list: lower merges first */
    int32_t merged; /* id of left + right */
};

struct tok_bpe_sym {
    int32_t id;
    int32_t prev, next; /* neighbours, -1 at the ends */
    int32_t alive;      /* 0 once merged into its left neighbour */
};

struct tok_bpe_heap_entry {
    uint64_t order; /* (rank << 32) | position: the heap pops the smallest */
    int32_t merged;
};

#define EMPTY_KEY UINT64_MAX

/* ---- byte-level alphabet */

/* Bytes that stand for themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF; the other 68 bytes map to
 * U+0100, U+0101, ... in byte order. */
static bool printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

/* The 68 others, in byte order: 0x00..0x20 (33 bytes), 0x7F..0xA0 (34 bytes), 0xAD. */
uint32_t tok_bytelevel_char(unsigned char b)
{
    if (printable(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b <= 0xA0)
        return 0x100 + 33 + (uint32_t)(b - 0x7F);
    return 0x100 + 67; /* 0xAD */
}

int tok_bytelevel_byte(uint32_t cp)
{
    if (cp < 0x100)
        return printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 0x100;
    if (n < 33)
        return (int)n;
    if (n < 67)
        return (int)(0x7F + n - 33);
    return n == 67 ? 0xAD : -1;
}

long tok_bytelevel_decode(const char *s, size_t len, unsigned char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)tok_utf8_next(s + i, &cp);
        int b = tok_bytelevel_byte(cp);
        if (b < 0)
            return -1;
        out[o++] = (unsigned char)b;
    }
    return (long)o;
}

/* ---- merge table */

static inline uint64_t pair_key(int32_t l, int32_t r)
{
    return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
}

static inline size_t slot_of(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static const struct tok_bpe_merge *merge_get(const struct tok_bpe *b, int32_t l, int32_t r)
{
    if (!b->merges_cap)
        return NULL;
    uint64_t key = pair_key(l, r);
    for (size_t i = slot_of(key, b->merges_cap);; i = (i + 1) & (b->merges_cap - 1)) {
        const struct tok_bpe_merge *m = &b->merges[i];
        if (m->key == key)
            return m;
        if (m->key == EMPTY_KEY)
            return NULL;
    }
}

void tok_bpe_init(struct tok_bpe *b)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++)
        b->byte_id[i] = -1;
    b->unk_id = -1;
    tok_strmap_init(&b->whole);
}

void tok_bpe_free(struct tok_bpe *b)
{
    if (!b)
        return;
    free(b->merges);
    tok_strmap_free(&b->whole);
    b->merges = NULL;
    b->merges_cap = b->n_merges = 0;
}

void tok_bpe_work_free(struct tok_bpe_work *w)
{
    if (!w)
        return;
    free(w->sym);
    free(w->heap);
    memset(w, 0, sizeof *w);
}

static int merges_grow(struct tok_bpe *b)
{
    size_t cap = b->merges_cap ? b->merges_cap * 2 : 1024;
    struct tok_bpe_merge *t = malloc(cap * sizeof *t);
    if (!t)
        return -1;
    for (size_t i = 0; i < cap; i++)
        t[i].key = EMPTY_KEY;
    for (size_t i = 0; i < b->merges_cap; i++) {
        if (b->merges[i].key == EMPTY_KEY)
            continue;
        size_t j = slot_of(b->merges[i].key, cap);
        while (t[j].key != EMPTY_KEY)
            j = (j + 1) & (cap - 1);
        t[j] = b->merges[i];
    }
    free(b->merges);
    b->merges = t;
    b->merges_cap = cap;
    return 0;
}

int tok_bpe_add_merge(struct tok_bpe *b, int32_t left, int32_t right, uint32_t rank, int32_t merged)
{
    if ((b->n_merges + 1) * 2 > b->merges_cap && merges_grow(b) != 0)
        return -1;
    uint64_t key = pair_key(left, right);
    size_t i = slot_of(key, b->merges_cap);
    while (b->merges[i].key != EMPTY_KEY && b->merges[i].key != key)
        i = (i + 1) & (b->merges_cap - 1);
    if (b->merges[i].key == EMPTY_KEY)
        b->n_merges++;
    b->merges[i] = (struct tok_bpe_merge){.key = key, .rank = rank, .merged = merged};
    return 0;
}

/* ---- the merge loop */

static void heap_push(struct tok_bpe_heap_entry *h, size_t *n, uint64_t order, int32_t merged)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].order <= order)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i].order = order;
    h[i].merged = merged;
}

static struct tok_bpe_heap_entry heap_pop(struct tok_bpe_heap_entry *h, size_t *n)
{
    struct tok_bpe_heap_entry top = h[0], last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1].order < h[c].order)
            c++;
        if (h[c].order >= last.order)
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = last;
    return top;
}

static int work_reserve(struct tok_bpe_work *w, size_t n)
{
    if (n > w->sym_cap) {
        size_t cap = n < 64 ? 64 : n * 2;
        struct tok_bpe_sym *s = realloc(w->sym, cap * sizeof *s);
        if (!s)
            return -1;
        w->sym = s;
        w->sym_cap = cap;
    }
    /* each merge pushes at most two entries on top of the initial n - 1 */
    if (3 * n > w->heap_cap) {
        size_t cap = 3 * n < 192 ? 192 : 6 * n;
        struct tok_bpe_heap_entry *h = realloc(w->heap, cap * sizeof *h);
        if (!h)
            return -1;
        w->heap = h;
        w->heap_cap = cap;
    }
    return 0;
}

long tok_bpe_encode(const struct tok_bpe *b, const unsigned char *piece, size_t len, struct tok_bpe_work *w,
                    int32_t *out)
{
    if (len == 0)
        return 0;
    if (b->ignore_merges) {
        int32_t id = tok_strmap_get(&b->whole, piece, len);
        if (id >= 0) {
            out[0] = id;
            return 1;
        }
    }
    if (len > INT32_MAX / 4 || work_reserve(w, len) != 0)
        return -1;
    struct tok_bpe_sym *s = w->sym;
    int32_t n = 0;
    bool pending_unk = false;
    for (size_t i = 0; i < len; i++) {
        int32_t id = b->byte_id[piece[i]];
        if (id < 0) {
            if (b->unk_id < 0)
                continue; /* HF drops characters it has no token for when there is no unk_token */
            if (pending_unk && b->fuse_unk)
                continue;
            id = b->unk_id;
            pending_unk = true;
        } else {
            pending_unk = false;
        }
        s[n] = (struct tok_bpe_sym){.id = id, .prev = n - 1, .next = -1, .alive = 1};
        if (n > 0)
            s[n - 1].next = n;
        n++;
    }
    if (n == 0)
        return 0;

    struct tok_bpe_heap_entry *h = w->heap;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) {
        const struct tok_bpe_merge *m = merge_get(b, s[i].id, s[i + 1].id);
        if (m)
            heap_push(h, &nh, ((uint64_t)m->rank << 32) | (uint32_t)i, m->merged);
    }
    while (nh) {
        struct tok_bpe_heap_entry top = heap_pop(h, &nh);
        int32_t pos = (int32_t)(uint32_t)top.order;
        struct tok_bpe_sym *cur = &s[pos];
        if (!cur->alive || cur->next < 0)
            continue;
        struct tok_bpe_sym *right = &s[cur->next];
        /* an expired entry: the pair at pos no longer merges into the same token */
        const struct tok_bpe_merge *m = merge_get(b, cur->id, right->id);
        if (!m || m->merged != top.merged)
            continue;
        cur->id = top.merged;
        cur->next = right->next;
        right->alive = 0;
        if (cur->next >= 0)
            s[cur->next].prev = pos;
        if (cur->prev >= 0) {
            m = merge_get(b, s[cur->prev].id, cur->id);
            if (m)
                heap_push(h, &nh, ((uint64_t)m->rank << 32) | (uint32_t)cur->prev, m->merged);
        }
        if (cur->next >= 0) {
            m = merge_get(b, cur->id, s[cur->next].id);
            if (m)
                heap_push(h, &nh, ((uint64_t)m->rank << 32) | (uint32_t)pos, m->merged);
        }
    }
    long k = 0;
    for (int32_t i = 0; i >= 0; i = s[i].next)
        out[k++] = s[i].id;
    return k;
}
