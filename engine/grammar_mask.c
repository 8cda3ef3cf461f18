/* Computing the token mask of a grammar state (engine/grammar_int.h, "computing masks"): one pass
 * over the vocabulary trie in preorder, the state at each depth, dead subtrees skipped, transitions
 * taken from a memo of the states met so far. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"

enum {
    T_UNKNOWN = -1, /* a transition not computed yet */
    T_DEAD = -2,    /* the byte is refused */
    T_ERROR = -3,   /* err is set */
    T_FULL = -4,    /* the memo reached its bound */
};

struct memo_state {
    int64_t off; /* its canonical form is sv[off .. off + n) */
    int32_t n;
    int32_t n_stacks;
    uint64_t hash;
    bool complete;
};

struct gr_walk {
    const struct grammar *g;
    uint8_t bcls[256]; /* byte -> its class of equivalent bytes (alike in every class of g) */
    int32_t n_bcls;
    size_t max_bytes;  /* bound of the memo */
    int64_t fallbacks; /* computations finished without the memo */
    /* the memo: interned states, their transitions [n_st][n_bcls], a hash index */
    int32_t *sv;
    int64_t n_sv, cap_sv;
    struct memo_state *st;
    int32_t n_st, cap_st;
    int32_t *rows; /* [cap_st * n_bcls] */
    int32_t *ht;   /* [ht_cap] state index or -1 */
    uint32_t ht_cap;
    /* the state index (memo) or state (byte by byte) at each depth of the trie */
    int32_t *path;
    struct gr_state *depth;
    int32_t cap_depth;
    struct gr_state tmp;
    struct gr_scratch sc;
};

/* Bytes that every class of g either holds or lacks together behave alike in every state. */
static void byte_partition(const struct grammar *g, uint8_t *bcls, int32_t *n_bcls)
{
    memset(bcls, 0, 256);
    int32_t n = 1;
    int16_t split[512];
    for (int32_t c = 0; c < g->n_classes && n < 256; c++) {
        for (int i = 0; i < 2 * n; i++)
            split[i] = -1;
        int32_t m = 0;
        for (unsigned b = 0; b < 256; b++) {
            int k = 2 * bcls[b] + gr_class_has(&g->classes[c], b);
            if (split[k] < 0)
                split[k] = (int16_t)m++;
            bcls[b] = (uint8_t)split[k];
        }
        n = m;
    }
    *n_bcls = n;
}

struct gr_walk *gr_walk_new(const struct grammar *g)
{
    struct gr_walk *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->g = g;
    w->max_bytes = GR_WALK_MAX_BYTES;
    byte_partition(g, w->bcls, &w->n_bcls);
    return w;
}

static void memo_clear(struct gr_walk *w)
{
    w->n_sv = 0;
    w->n_st = 0;
    if (w->ht)
        memset(w->ht, 0xff, (size_t)w->ht_cap * sizeof *w->ht);
}

void gr_walk_free(struct gr_walk *w)
{
    if (!w)
        return;
    free(w->sv);
    free(w->st);
    free(w->rows);
    free(w->ht);
    free(w->path);
    for (int32_t d = 0; d < w->cap_depth; d++)
        gr_state_free(&w->depth[d]);
    free(w->depth);
    gr_state_free(&w->tmp);
    gr_scratch_free(&w->sc);
    free(w);
}

static size_t memo_bytes(const struct gr_walk *w)
{
    return (size_t)w->cap_sv * sizeof *w->sv + (size_t)w->cap_st * sizeof *w->st +
           (size_t)w->cap_st * (size_t)w->n_bcls * sizeof *w->rows + (size_t)w->ht_cap * sizeof *w->ht;
}

size_t gr_walk_bytes(const struct gr_walk *w)
{
    size_t b = sizeof *w + memo_bytes(w) + (size_t)w->cap_depth * (sizeof *w->path + sizeof *w->depth);
    for (int32_t d = 0; d < w->cap_depth; d++)
        b += (size_t)w->depth[d].cap * sizeof(int32_t);
    return b + (size_t)w->tmp.cap * sizeof(int32_t);
}

void gr_walk_set_max_bytes(struct gr_walk *w, size_t max_bytes)
{
    w->max_bytes = max_bytes;
}

int64_t gr_walk_fallbacks(const struct gr_walk *w)
{
    return w->fallbacks;
}

static uint64_t hash_words(const int32_t *v, int32_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        h = (h ^ (uint32_t)v[i]) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    return h;
}

/* Doubles the hash index when it is half full (or makes it). 0, or T_ERROR when out of memory. */
static int grow_index(struct gr_walk *w)
{
    if (w->ht && (uint64_t)(w->n_st + 1) * 2 <= w->ht_cap)
        return 0;
    uint32_t cap = w->ht_cap ? w->ht_cap * 2 : 256;
    int32_t *ht = malloc((size_t)cap * sizeof *ht);
    if (!ht)
        return T_ERROR;
    memset(ht, 0xff, (size_t)cap * sizeof *ht);
    for (int32_t i = 0; i < w->n_st; i++) {
        uint32_t k = (uint32_t)w->st[i].hash & (cap - 1);
        while (ht[k] >= 0)
            k = (k + 1) & (cap - 1);
        ht[k] = i;
    }
    free(w->ht);
    w->ht = ht;
    w->ht_cap = cap;
    return 0;
}

/* The memo index of state s, added when new. T_FULL when adding it would pass the bound, T_ERROR
 * when out of memory. */
static int32_t intern(struct gr_walk *w, const struct gr_state *s)
{
    uint64_t h = hash_words(s->v, s->n);
    if (w->ht) {
        for (uint32_t k = (uint32_t)h & (w->ht_cap - 1);; k = (k + 1) & (w->ht_cap - 1)) {
            int32_t i = w->ht[k];
            if (i < 0)
                break;
            const struct memo_state *m = &w->st[i];
            if (m->hash == h && m->n == s->n && !memcmp(w->sv + m->off, s->v, (size_t)s->n * sizeof *s->v))
                return i;
        }
    }
    /* grow what must grow, within the bound */
    int64_t cap_sv = w->cap_sv, cap_st = w->cap_st;
    while (w->n_sv + s->n > cap_sv)
        cap_sv = cap_sv ? cap_sv * 2 : 1024;
    if (w->n_st + 1 > cap_st)
        cap_st = cap_st ? cap_st * 2 : 64;
    size_t need = (size_t)cap_sv * sizeof *w->sv + (size_t)cap_st * sizeof *w->st +
                  (size_t)cap_st * (size_t)w->n_bcls * sizeof *w->rows +
                  (size_t)(w->ht_cap ? w->ht_cap : 256) * 2 * sizeof *w->ht;
    if (need > w->max_bytes || cap_st > INT32_MAX / 2)
        return T_FULL;
    if (cap_sv != w->cap_sv) {
        int32_t *p = realloc(w->sv, (size_t)cap_sv * sizeof *p);
        if (!p)
            return T_ERROR;
        w->sv = p;
        w->cap_sv = cap_sv;
    }
    if (cap_st != w->cap_st) {
        struct memo_state *p = realloc(w->st, (size_t)cap_st * sizeof *p);
        if (!p)
            return T_ERROR;
        w->st = p;
        int32_t *r = realloc(w->rows, (size_t)cap_st * (size_t)w->n_bcls * sizeof *r);
        if (!r)
            return T_ERROR;
        w->rows = r;
        w->cap_st = (int32_t)cap_st;
    }
    if (grow_index(w) < 0)
        return T_ERROR;
    int32_t i = w->n_st++;
    w->st[i] = (struct memo_state){
        .off = w->n_sv, .n = s->n, .n_stacks = s->n_stacks, .hash = h, .complete = s->complete};
    memcpy(w->sv + w->n_sv, s->v, (size_t)s->n * sizeof *s->v);
    w->n_sv += s->n;
    for (int32_t c = 0; c < w->n_bcls; c++)
        w->rows[(int64_t)i * w->n_bcls + c] = T_UNKNOWN;
    uint32_t k = (uint32_t)h & (w->ht_cap - 1);
    while (w->ht[k] >= 0)
        k = (k + 1) & (w->ht_cap - 1);
    w->ht[k] = i;
    return i;
}

/* The memo index of the state after byte from state p (T_DEAD when refused), computed and
 * remembered. */
static int32_t transition(struct gr_walk *w, int32_t p, uint8_t byte, char *err, size_t errlen)
{
    const struct memo_state *m = &w->st[p];
    struct gr_state in = {
        .v = w->sv + m->off, .n = m->n, .cap = m->n, .n_stacks = m->n_stacks, .complete = m->complete};
    int r = gr_state_advance(w->g, &in, byte, &w->tmp, &w->sc, err, errlen);
    if (r < 0)
        return T_ERROR;
    int32_t t = r ? intern(w, &w->tmp) : T_DEAD;
    if (t == T_ERROR)
        snprintf(err, errlen, "out of memory computing a token mask");
    if (t >= 0 || t == T_DEAD)
        w->rows[(int64_t)p * w->n_bcls + w->bcls[byte]] = t;
    return t;
}

static int reserve_depth(struct gr_walk *w, int32_t n)
{
    if (n <= w->cap_depth)
        return 0;
    int32_t *p = realloc(w->path, (size_t)n * sizeof *p);
    if (!p)
        return -1;
    w->path = p;
    struct gr_state *d = realloc(w->depth, (size_t)n * sizeof *d);
    if (!d)
        return -1;
    memset(d + w->cap_depth, 0, (size_t)(n - w->cap_depth) * sizeof *d);
    w->depth = d;
    w->cap_depth = n;
    return 0;
}

static inline void set_ids(const struct gr_vocab *v, const struct gr_trie_node *nd, uint32_t *mask)
{
    for (int32_t k = nd[0].ids; k < nd[1].ids; k++) {
        int32_t id = v->trie_ids[k];
        mask[id >> 5] |= 1u << (id & 31);
    }
}

/* The walk through the memo: 0, T_FULL or T_ERROR. */
static int walk_memo(struct gr_walk *w, const struct gr_vocab *v, const struct gr_state *st, uint32_t *mask,
                     char *err, size_t errlen)
{
    int32_t root = intern(w, st);
    if (root == T_ERROR)
        snprintf(err, errlen, "out of memory computing a token mask");
    if (root < 0)
        return root;
    int32_t *path = w->path;
    path[0] = root;
    const struct gr_trie_node *nodes = v->nodes;
    const uint8_t *bcls = w->bcls;
    const int32_t nb = w->n_bcls;
    for (int32_t i = 1, n = v->n_nodes; i < n;) {
        const struct gr_trie_node *nd = &nodes[i];
        int32_t p = path[nd->depth - 1];
        int32_t t = w->rows[(int64_t)p * nb + bcls[nd->byte]];
        if (t == T_UNKNOWN) {
            t = transition(w, p, nd->byte, err, errlen);
            if (t < T_DEAD)
                return t;
        }
        if (t == T_DEAD) {
            i = nd->next;
            continue;
        }
        path[nd->depth] = t;
        set_ids(v, nd, mask);
        i++;
    }
    return 0;
}

/* The walk without the memo, advancing a state at every node: 0 or T_ERROR. */
static int walk_plain(struct gr_walk *w, const struct gr_vocab *v, const struct gr_state *st, uint32_t *mask,
                      char *err, size_t errlen)
{
    const struct gr_trie_node *nodes = v->nodes;
    for (int32_t i = 1, n = v->n_nodes; i < n;) {
        const struct gr_trie_node *nd = &nodes[i];
        const struct gr_state *in = nd->depth == 1 ? st : &w->depth[nd->depth - 1];
        int r = gr_state_advance(w->g, in, nd->byte, &w->depth[nd->depth], &w->sc, err, errlen);
        if (r < 0)
            return T_ERROR;
        if (!r) {
            i = nd->next;
            continue;
        }
        set_ids(v, nd, mask);
        i++;
    }
    return 0;
}

int gr_walk_mask(struct gr_walk *w, const struct gr_vocab *v, const struct gr_state *st, uint32_t *mask,
                 char *err, size_t errlen)
{
    memset(mask, 0, (size_t)v->mask_words * sizeof *mask);
    if (reserve_depth(w, v->max_depth + 1) < 0) {
        snprintf(err, errlen, "out of memory computing a token mask");
        return -1;
    }
    if (st->n_stacks > 0) {
        /* keep at least half of the bound for this computation */
        size_t used = (size_t)w->n_sv * sizeof *w->sv +
                      (size_t)w->n_st * (sizeof *w->st + (size_t)w->n_bcls * sizeof *w->rows);
        if (used > w->max_bytes / 2)
            memo_clear(w);
        int r = walk_memo(w, v, st, mask, err, errlen);
        if (r == T_FULL) {
            memo_clear(w);
            w->fallbacks++;
            memset(mask, 0, (size_t)v->mask_words * sizeof *mask);
            r = walk_plain(w, v, st, mask, err, errlen);
        }
        if (r == T_ERROR) {
            memo_clear(w);
            return -1;
        }
    }
    if (st->complete)
        for (int i = 0; i < v->n_eos; i++)
            mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    return 0;
}
