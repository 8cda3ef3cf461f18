/* The vocabulary a grammar's masks are computed against (engine/grammar.h, engine/grammar_int.h): the
 * byte strings of the usable ids in a trie laid out in depth-first preorder, the eos ids and the
 * width of a mask. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/tokenizer.h"

struct entry {
    const char *p;
    int64_t len;
    int32_t id;
};

/* Bytes in order (unsigned), a prefix before its extensions, equal strings by id. */
static int cmp_entry(const void *pa, const void *pb)
{
    const struct entry *a = pa, *b = pb;
    int64_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, (size_t)n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

bool gr_vocab_is_eos(const struct gr_vocab *v, int32_t id)
{
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id)
            return true;
    return false;
}

void gr_vocab_free(struct gr_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->eos);
    free(v->nodes);
    free(v->trie_ids);
    free(v);
}

int gr_vocab_mask_words(const struct gr_vocab *v)
{
    return v->mask_words;
}

/* Builds v->nodes and v->trie_ids from the usable ids sorted by bytes. */
static int build_trie(struct gr_vocab *v, const struct entry *e, int32_t n)
{
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += e[i].len;
    if (total + 2 > INT32_MAX)
        return -1;
    v->nodes = malloc((size_t)(total + 2) * sizeof *v->nodes);
    v->trie_ids = malloc(((size_t)n + 1) * sizeof *v->trie_ids);
    int32_t *open = malloc(((size_t)v->max_depth + 1) * sizeof *open); /* the open node at each depth */
    if (!v->nodes || !v->trie_ids || !open) {
        free(open);
        return -1;
    }
    v->nodes[0] = (struct gr_trie_node){.next = 0, .ids = 0, .depth = 0, .byte = 0};
    open[0] = 0;
    int32_t nn = 1, ni = 0;
    const struct entry *prev = NULL;
    for (int32_t i = 0; i < n; i++) {
        int64_t l = 0;
        if (prev)
            while (l < prev->len && l < e[i].len && prev->p[l] == e[i].p[l])
                l++;
        for (int64_t d = prev ? prev->len : 0; d > l; d--)
            v->nodes[open[d]].next = nn;
        for (int64_t d = l + 1; d <= e[i].len; d++) {
            v->nodes[nn] = (struct gr_trie_node){
                .next = 0, .ids = ni, .depth = (int32_t)d, .byte = (uint8_t)e[i].p[d - 1]};
            open[d] = nn++;
        }
        v->trie_ids[ni++] = e[i].id;
        prev = &e[i];
    }
    for (int64_t d = prev ? prev->len : 0; d >= 0; d--)
        v->nodes[open[d]].next = nn;
    v->nodes[nn] = (struct gr_trie_node){.next = nn, .ids = ni, .depth = 0, .byte = 0};
    v->n_nodes = nn;
    v->n_trie_ids = ni;
    free(open);
    struct gr_trie_node *shrunk = realloc(v->nodes, ((size_t)nn + 1) * sizeof *v->nodes);
    if (shrunk)
        v->nodes = shrunk;
    return 0;
}

struct gr_vocab *gr_vocab_from_bytes(const char *const *bytes, const size_t *lens, int32_t n, int32_t vocab,
                                     const int32_t *eos, int n_eos, char *err, size_t errlen)
{
    if (vocab < 1 || n < 0 || n_eos < 0) {
        snprintf(err, errlen, "bad vocabulary size %d (tokenizer ids: %d)", (int)vocab, (int)n);
        return NULL;
    }
    for (int i = 0; i < n_eos; i++)
        if (eos[i] < 0 || eos[i] >= vocab) {
            snprintf(err, errlen, "eos id %d is outside the vocabulary [0, %d)", (int)eos[i], (int)vocab);
            return NULL;
        }
    struct gr_vocab *v = calloc(1, sizeof *v);
    struct entry *e = NULL;
    if (!v)
        goto oom;
    v->vocab = vocab;
    v->mask_words = (int32_t)(((int64_t)vocab + 31) / 32);
    v->n_ids = n < vocab ? n : vocab;
    v->eos = malloc(((size_t)n_eos + 1) * sizeof *v->eos);
    v->off = malloc(((size_t)v->n_ids + 1) * sizeof *v->off);
    if (!v->eos || !v->off)
        goto oom;
    for (int i = 0; i < n_eos; i++)
        if (!gr_vocab_is_eos(v, eos[i]))
            v->eos[v->n_eos++] = eos[i];
    int64_t total = 0;
    int32_t n_usable = 0;
    for (int32_t id = 0; id < v->n_ids; id++)
        if (bytes[id] && lens[id] && !gr_vocab_is_eos(v, id)) {
            total += (int64_t)lens[id];
            n_usable++;
        }
    v->bytes = malloc((size_t)total + 1);
    e = malloc(((size_t)n_usable + 1) * sizeof *e);
    if (!v->bytes || !e)
        goto oom;
    int64_t at = 0;
    n_usable = 0;
    for (int32_t id = 0; id < v->n_ids; id++) {
        v->off[id] = at;
        if (bytes[id] && lens[id] && !gr_vocab_is_eos(v, id)) {
            memcpy(v->bytes + at, bytes[id], lens[id]);
            e[n_usable++] = (struct entry){.p = v->bytes + at, .len = (int64_t)lens[id], .id = id};
            at += (int64_t)lens[id];
            if ((int64_t)lens[id] > v->max_depth)
                v->max_depth = (int32_t)lens[id];
        }
    }
    v->off[v->n_ids] = at;
    qsort(e, (size_t)n_usable, sizeof *e, cmp_entry);
    if (build_trie(v, e, n_usable) < 0)
        goto oom;
    free(e);
    return v;
oom:
    snprintf(err, errlen, "out of memory building the vocabulary trie");
    free(e);
    gr_vocab_free(v);
    return NULL;
}

struct gr_vocab *gr_vocab_new(const struct tok *tok, int vocab, const int32_t *eos_ids, int n_eos, char *err,
                              size_t errlen)
{
    int32_t n = tok_vocab_size(tok);
    if (n > vocab)
        n = vocab;
    if (n < 0)
        n = 0;
    const char **bytes = calloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = calloc((size_t)n + 1, sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        snprintf(err, errlen, "out of memory building the vocabulary trie");
        return NULL;
    }
    for (int32_t id = 0; id < n; id++)
        if (!tok_is_added(tok, id))
            bytes[id] = tok_token_bytes(tok, id, &lens[id]);
    struct gr_vocab *v = gr_vocab_from_bytes(bytes, lens, n, vocab, eos_ids, n_eos, err, errlen);
    free(bytes);
    free(lens);
    return v;
}
