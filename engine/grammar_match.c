/* Following a grammar token by token (engine/grammar.h): matchers, and the cache of token masks per
 * grammar state shared by all the matchers of a grammar. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/util/mono.h"

/* A cached mask: the state's canonical form and the mask, in one allocation. */
struct centry {
    struct centry *hnext;       /* in its hash bucket */
    struct centry *prev, *next; /* in the LRU list, most recent first */
    uint64_t hash;
    size_t bytes; /* of this allocation */
    int32_t n;    /* key[0..n) */
    int32_t *key;
    uint32_t *mask;
};

/* Idle walks kept per grammar for the next misses (one per thread computing at once), each only while
 * it holds at most WALK_KEEP_BYTES (a memo grown larger by an unusual state is freed). */
#define WALK_POOL_MAX 8
#define WALK_KEEP_BYTES ((size_t)1 << 20)

struct gr_mask_cache {
    pthread_mutex_t mu; /* guards everything below */
    struct gr_stats stats;
    struct centry **buckets; /* [n_buckets], a power of two */
    size_t n_buckets, n_entries;
    struct centry lru; /* sentinel of the LRU list */
    size_t max_bytes;
    struct gr_walk *pool[WALK_POOL_MAX]; /* idle walks */
    int n_pool;
};

int gr_cache_init(struct grammar *g)
{
    struct gr_mask_cache *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    if (pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        return -1;
    }
    c->lru.prev = c->lru.next = &c->lru;
    c->max_bytes = GR_CACHE_MAX_BYTES;
    g->cache = c;
    return 0;
}

void gr_cache_free(struct grammar *g)
{
    struct gr_mask_cache *c = g->cache;
    if (!c)
        return;
    for (struct centry *e = c->lru.next, *nx; e != &c->lru; e = nx) {
        nx = e->next;
        free(e);
    }
    for (int i = 0; i < c->n_pool; i++)
        gr_walk_free(c->pool[i]);
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
    g->cache = NULL;
}

static void evict(struct gr_mask_cache *c, struct centry *e);

void gr_cache_set_max_bytes(struct grammar *g, size_t max_bytes)
{
    struct gr_mask_cache *c = g->cache;
    pthread_mutex_lock(&c->mu);
    c->max_bytes = max_bytes;
    while (c->stats.cache_bytes > c->max_bytes)
        evict(c, c->lru.prev);
    pthread_mutex_unlock(&c->mu);
}

void gr_get_stats(struct grammar *g, struct gr_stats *st)
{
    pthread_mutex_lock(&g->cache->mu);
    *st = g->cache->stats;
    pthread_mutex_unlock(&g->cache->mu);
}

/* ---- the cache (callers hold mu) ---- */

static struct centry *find(struct gr_mask_cache *c, uint64_t h, const struct gr_state *s)
{
    if (!c->n_buckets)
        return NULL;
    for (struct centry *e = c->buckets[h & (c->n_buckets - 1)]; e; e = e->hnext)
        if (e->hash == h && e->n == s->n && !memcmp(e->key, s->v, (size_t)s->n * sizeof *s->v))
            return e;
    return NULL;
}

static void lru_unlink(struct centry *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_front(struct gr_mask_cache *c, struct centry *e)
{
    e->next = c->lru.next;
    e->prev = &c->lru;
    c->lru.next->prev = e;
    c->lru.next = e;
}

static void evict(struct gr_mask_cache *c, struct centry *e)
{
    struct centry **pp = &c->buckets[e->hash & (c->n_buckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(e);
    c->stats.cache_bytes -= e->bytes;
    c->n_entries--;
    free(e);
}

/* Adds e (not in the cache), evicting the least recently used entries to stay within the bound;
 * frees e instead when it cannot be kept. */
static void insert(struct gr_mask_cache *c, struct centry *e)
{
    if (e->bytes > c->max_bytes) {
        free(e);
        return;
    }
    while (c->stats.cache_bytes + e->bytes > c->max_bytes && c->lru.prev != &c->lru)
        evict(c, c->lru.prev);
    if (c->n_entries + 1 > c->n_buckets) {
        size_t nb = c->n_buckets ? c->n_buckets * 2 : 64;
        struct centry **b = calloc(nb, sizeof *b);
        if (!b) {
            free(e);
            return;
        }
        for (struct centry *x = c->lru.next; x != &c->lru; x = x->next) {
            x->hnext = b[x->hash & (nb - 1)];
            b[x->hash & (nb - 1)] = x;
        }
        free(c->buckets);
        c->buckets = b;
        c->n_buckets = nb;
    }
    e->hnext = c->buckets[e->hash & (c->n_buckets - 1)];
    c->buckets[e->hash & (c->n_buckets - 1)] = e;
    lru_front(c, e);
    c->n_entries++;
    c->stats.cache_bytes += e->bytes;
}

/* ---- matchers ---- */

struct gr_matcher {
    struct grammar *g;
    struct gr_state st, tmp, tmp2; /* the state; buffers for advancing */
    struct gr_scratch sc;
    bool ended;
};

struct gr_matcher *gr_matcher_new(struct grammar *g)
{
    struct gr_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->g = gr_ref(g);
    char err[128];
    if (gr_state_start(g, &m->st, &m->sc, err, sizeof err) < 0) {
        gr_matcher_free(m);
        return NULL;
    }
    return m;
}

void gr_matcher_free(struct gr_matcher *m)
{
    if (!m)
        return;
    gr_state_free(&m->st);
    gr_state_free(&m->tmp);
    gr_state_free(&m->tmp2);
    gr_scratch_free(&m->sc);
    gr_unref(m->g);
    free(m);
}

int gr_matcher_mask(struct gr_matcher *m, uint32_t *mask, char *err, size_t errlen)
{
    const struct gr_vocab *v = m->g->vocab;
    struct gr_mask_cache *c = m->g->cache;
    if (!v) {
        snprintf(err, errlen, "grammar has no vocabulary to compute token masks against");
        return -1;
    }
    size_t mask_bytes = (size_t)v->mask_words * sizeof *mask;
    if (m->ended) {
        memset(mask, 0, mask_bytes);
        return 0;
    }
    uint64_t h = gr_state_hash(&m->st);
    pthread_mutex_lock(&c->mu);
    struct centry *e = find(c, h, &m->st);
    if (e) {
        memcpy(mask, e->mask, mask_bytes);
        lru_unlink(e);
        lru_front(c, e);
        c->stats.hits++;
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    struct gr_walk *w = c->n_pool ? c->pool[--c->n_pool] : NULL;
    pthread_mutex_unlock(&c->mu);

    /* compute outside the lock */
    double t0 = llmq_mono_s();
    if (!w && !(w = gr_walk_new(m->g))) {
        snprintf(err, errlen, "out of memory computing a token mask");
        return -1;
    }
    int rc = gr_walk_mask(w, v, &m->st, mask, err, errlen);
    size_t key_bytes = (size_t)m->st.n * sizeof *m->st.v;
    size_t bytes = sizeof *e + key_bytes + mask_bytes;
    e = rc == 0 ? malloc(bytes) : NULL;
    if (e) {
        e->hash = h;
        e->bytes = bytes;
        e->n = m->st.n;
        e->mask = (uint32_t *)(e + 1);
        e->key = (int32_t *)((char *)e->mask + mask_bytes);
        memcpy(e->mask, mask, mask_bytes);
        memcpy(e->key, m->st.v, key_bytes);
    }
    double dt = llmq_mono_s() - t0;

    pthread_mutex_lock(&c->mu);
    if (c->n_pool < WALK_POOL_MAX && gr_walk_bytes(w) <= WALK_KEEP_BYTES) {
        c->pool[c->n_pool++] = w;
        w = NULL;
    }
    c->stats.misses++;
    c->stats.compute_s += dt;
    if (e) {
        if (find(c, h, &m->st)) /* another thread computed it meanwhile */
            free(e);
        else
            insert(c, e);
    }
    pthread_mutex_unlock(&c->mu);
    gr_walk_free(w);
    return rc;
}

int gr_matcher_accept(struct gr_matcher *m, int32_t token)
{
    const struct gr_vocab *v = m->g->vocab;
    if (m->ended || !v || token < 0 || token >= v->vocab)
        return -1;
    if (gr_vocab_is_eos(v, token)) {
        if (!m->st.complete)
            return -1;
        m->ended = true;
        return 0;
    }
    if (token >= v->n_ids || v->off[token + 1] == v->off[token])
        return -1;
    return gr_matcher_accept_bytes(m, v->bytes + v->off[token], (size_t)(v->off[token + 1] - v->off[token]));
}

int gr_matcher_accept_bytes(struct gr_matcher *m, const char *bytes, size_t n)
{
    if (m->ended)
        return n ? -1 : 0;
    /* advance through two buffers so that m->st stays as it is until every byte is accepted */
    struct gr_state *bufs[2] = {&m->tmp, &m->tmp2};
    const struct gr_state *in = &m->st;
    char err[128];
    for (size_t i = 0; i < n; i++) {
        struct gr_state *out = bufs[i & 1];
        if (gr_state_advance(m->g, in, (uint8_t)bytes[i], out, &m->sc, err, sizeof err) != 1)
            return -1;
        in = out;
    }
    if (n) {
        struct gr_state *fin = bufs[(n - 1) & 1], t = m->st;
        m->st = *fin;
        *fin = t;
    }
    return 0;
}

bool gr_matcher_complete(const struct gr_matcher *m)
{
    return m->st.complete;
}

bool gr_matcher_ended(const struct gr_matcher *m)
{
    return m->ended;
}
