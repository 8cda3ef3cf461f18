/* Alternatives of literal byte strings, shared as a trie (grb_literals), and the grammar of a list of
 * choices built from them (engine/grammar.h, gr_compile_choice): the output is the raw text of one
 * choice, byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"

struct lit {
    const char *s;
    size_t n;
};

static int cmp_lit(const void *pa, const void *pb)
{
    const struct lit *a = pa, *b = pb;
    size_t n = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->s, b->s, n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

struct trie {
    struct gr_builder *b;
    const char *name;
    int next_id;
};

/* Alternatives of rule for l[0..n) (sorted, distinct), which share their first d bytes: the empty
 * string when one of them ends at d, then per next byte its common run and, when the run is shared by
 * several, a new rule for what follows. */
static void build(struct trie *t, int32_t rule, const struct lit *l, size_t n, size_t d)
{
    struct gr_builder *b = t->b;
    struct gr_seq s = {0};
    size_t i = 0;
    if (n && l[0].n == d) {
        grb_alt(b, rule, &s);
        i = 1;
    }
    while (i < n && !b->failed) {
        size_t j = i + 1;
        while (j < n && l[j].s[d] == l[i].s[d])
            j++;
        /* [i, j) share byte d; the run they share ends where the first and the last part */
        size_t e = d + 1;
        if (j - i == 1)
            e = l[i].n;
        else
            while (e < l[i].n && e < l[j - 1].n && l[i].s[e] == l[j - 1].s[e])
                e++;
        grs_lit(b, &s, l[i].s + d, e - d);
        if (j - i > 1) {
            char nm[300];
            snprintf(nm, sizeof nm, "%s@%d", t->name, ++t->next_id);
            int32_t child = grb_rule(b, nm);
            grs_rule(b, &s, child);
            grb_alt(b, rule, &s);
            build(t, child, l + i, j - i, e);
        } else {
            grb_alt(b, rule, &s);
        }
        i = j;
    }
    grs_free(&s);
}

void grb_literals(struct gr_builder *b, int32_t rule, const char *const *texts, const size_t *lens, size_t n,
                  const char *name)
{
    if (b->failed)
        return;
    struct lit *l = malloc((n + 1) * sizeof *l);
    if (!l) {
        grb_fail(b, "out of memory building a grammar");
        return;
    }
    for (size_t i = 0; i < n; i++)
        l[i] = (struct lit){texts[i], lens[i]};
    qsort(l, n, sizeof *l, cmp_lit);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!k || cmp_lit(&l[k - 1], &l[i]))
            l[k++] = l[i];
    struct trie t = {.b = b, .name = name, .next_id = 0};
    build(&t, rule, l, k, 0);
    free(l);
}

struct grammar *gr_compile_choice(const char *const *choices, size_t n, const struct gr_vocab *v, char *err,
                                  size_t errlen)
{
    if (!choices || n == 0) {
        snprintf(err, errlen, "choice: expected at least one choice");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!choices[i] || !choices[i][0]) {
            snprintf(err, errlen, "choice: choice %zu is empty", i);
            return NULL;
        }
    size_t *lens = malloc(n * sizeof *lens);
    if (!lens) {
        snprintf(err, errlen, "out of memory building a grammar");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(choices[i]);
    struct gr_builder b;
    grb_init(&b);
    int32_t root = grb_rule(&b, "choice");
    grb_literals(&b, root, choices, lens, n, "choice");
    free(lens);
    return gr_finish(&b, root, v, err, errlen);
}
