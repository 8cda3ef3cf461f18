/* Following a grammar token by token (engine/grammar.h): matchers, and the cache of token masks per
 * grammar state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"

struct gr_mask_cache {
    struct gr_stats stats;
};

int gr_cache_init(struct grammar *g)
{
    g->cache = calloc(1, sizeof *g->cache);
    return g->cache ? 0 : -1;
}

void gr_cache_free(struct grammar *g)
{
    free(g->cache);
    g->cache = NULL;
}

struct gr_matcher {
    struct grammar *g;
    struct gr_state st, tmp;
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
    gr_scratch_free(&m->sc);
    gr_unref(m->g);
    free(m);
}

int gr_matcher_accept_bytes(struct gr_matcher *m, const char *bytes, size_t n)
{
    if (m->ended)
        return n ? -1 : 0;
    struct gr_state cur = {0};
    if (gr_state_copy(&m->st, &cur) < 0)
        return -1;
    char err[128];
    for (size_t i = 0; i < n; i++) {
        if (gr_state_advance(m->g, &cur, (uint8_t)bytes[i], &m->tmp, &m->sc, err, sizeof err) != 1) {
            gr_state_free(&cur);
            return -1;
        }
        struct gr_state t = cur;
        cur = m->tmp;
        m->tmp = t;
    }
    gr_state_free(&m->st);
    m->st = cur;
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
