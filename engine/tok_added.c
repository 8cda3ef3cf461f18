/* Finding added tokens in text; see tok_added.h. */
#include "engine/tok_added.h"

#include <stdlib.h>
#include <string.h>

#include "engine/tok_utf8.h"
#include "engine/util/array.h"

void tok_added_set_init(struct tok_added_set *s)
{
    memset(s, 0, sizeof *s);
}

void tok_added_set_free(struct tok_added_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->tokens[i].content);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

int tok_added_set_add(struct tok_added_set *s, const char *content, size_t len, int32_t id, bool single_word,
                      bool lstrip, bool rstrip)
{
    if (len == 0)
        return 0;
    struct tok_added_token *t = realloc(s->tokens, (s->n + 1) * sizeof *t);
    if (!t)
        return -1;
    s->tokens = t;
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, content, len);
    c[len] = 0;
    s->tokens[s->n++] = (struct tok_added_token){c, len, id, single_word, lstrip, rstrip};
    return 0;
}

static int by_content(const void *a, const void *b)
{
    const struct tok_added_token *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->content, y->content, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

void tok_added_set_finish(struct tok_added_set *s)
{
    if (s->n)
        qsort(s->tokens, s->n, sizeof *s->tokens, by_content);
    memset(s->first, 0, sizeof s->first);
    for (size_t i = 0; i < s->n; i++)
        s->first[(unsigned char)s->tokens[i].content[0]] = 1;
}

/* The longest token that occurs at s[i], or NULL. Tokens with the same first byte are adjacent. */
static const struct tok_added_token *longest_at(const struct tok_added_set *set, const char *s, size_t len,
                                                size_t i)
{
    unsigned char b = (unsigned char)s[i];
    size_t lo = 0, hi = set->n;
    while (lo < hi) { /* first token whose first byte is >= b */
        size_t mid = (lo + hi) / 2;
        if ((unsigned char)set->tokens[mid].content[0] < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    const struct tok_added_token *best = NULL;
    for (size_t k = lo; k < set->n && (unsigned char)set->tokens[k].content[0] == b; k++) {
        const struct tok_added_token *t = &set->tokens[k];
        if (t->len <= len - i && (!best || t->len > best->len) && !memcmp(s + i, t->content, t->len))
            best = t;
    }
    return best;
}

static int push(struct tok_added_split **out, size_t *n, size_t *cap, size_t off, size_t len, int32_t id)
{
    if (array_reserve(out, cap, *n + 1, sizeof **out, 16))
        return -1;
    (*out)[(*n)++] = (struct tok_added_split){off, len, id};
    return 0;
}

static bool word_before(const char *s, size_t i)
{
    uint32_t cp;
    return i > 0 && (tok_utf8_prev(s, i, &cp), tok_unicode_is_word(cp));
}

static bool word_at(const char *s, size_t len, size_t i)
{
    uint32_t cp;
    return i < len && (tok_utf8_next(s + i, &cp), tok_unicode_is_word(cp));
}

int tok_added_split(const struct tok_added_set *set, const char *s, size_t len, struct tok_added_split **out,
                    size_t *n, size_t *cap)
{
    *n = 0;
    size_t done = 0; /* end of the last accepted token (HF's start_offset) */
    size_t i = 0;
    while (set->n && i < len) {
        if (!set->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        const struct tok_added_token *t = longest_at(set, s, len, i);
        if (!t) {
            i++;
            continue;
        }
        size_t start = i, stop = i + t->len;
        i = stop; /* matches never overlap, whatever the flags do below */
        if (t->single_word && (word_before(s, start) || word_at(s, len, stop)))
            continue;
        if (t->lstrip) {
            uint32_t cp;
            size_t ws = start;
            while (ws > done) {
                int k = tok_utf8_prev(s, ws, &cp);
                if (!tok_unicode_is_space(cp))
                    break;
                ws -= (size_t)k;
            }
            start = ws;
        }
        if (t->rstrip) {
            uint32_t cp;
            while (stop < len) {
                int k = tok_utf8_next(s + stop, &cp);
                if (!tok_unicode_is_space(cp))
                    break;
                stop += (size_t)k;
            }
        }
        /* HF would emit overlapping pieces when a token starting with whitespace follows an rstrip
         * token that swallowed it; we keep pieces disjoint. */
        if (start < done)
            start = done;
        if (done < start && push(out, n, cap, done, start - done, -1) != 0)
            return -1;
        if (push(out, n, cap, start, stop - start, t->id) != 0)
            return -1;
        done = stop;
        if (i < done)
            i = done;
    }
    if (done < len && push(out, n, cap, done, len - done, -1) != 0)
        return -1;
    return 0;
}
