/* A document cut into chunks of at most N tokens at its best breaks (worker/jobs/chunker.h). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/tok_utf8.h"
#include "engine/tokenizer.h"
#include "engine/util/array.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "worker/jobs/chunker.h"

#define NONE SIZE_MAX

/* The whole encoding of a document and the kind of cut at each token's start. */
struct split {
    const struct tok *tok;
    const char *text;
    size_t len;
    size_t n;     /* tokens of the whole encoding */
    size_t *off;  /* [n + 1]: off[k] is the byte where token k starts; off[n] = len */
    uint8_t *cut; /* [n + 1]: enum chunk_cut of off[k]; 0 where it is inside a character */
};

/* Characters that close a quote or a bracket, end a sentence, or end a clause; in the ASCII ones
 * ending sentences and clauses count only before white space. */
static const uint32_t closers[] = {'"',    '\'',   ')',    ']',    '}',    0x00BB, 0x201D,
                                   0x2019, 0x300D, 0x300F, 0xFF09, 0x300B, 0x3009, 0x3011};
static const uint32_t sentence_ends[] = {'.', '!', '?', 0x3002, 0xFF01, 0xFF1F, 0xFF61, 0xFF0E};
static const uint32_t clause_ends[] = {',', ';', ':', 0xFF0C, 0x3001, 0xFF1B, 0xFF1A};

static bool in_set(uint32_t c, const uint32_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == c)
            return true;
    return false;
}

#define IN(c, set) in_set(c, set, sizeof set / sizeof *set)

/* The kind of a cut whose white-space run is text[a, b) holding nls newlines (counted up to 2). */
static int cut_kind(const char *text, size_t a, size_t b, int nls)
{
    if (nls >= 2)
        return CHUNK_CUT_PARAGRAPH;
    if (nls == 1)
        return CHUNK_CUT_LINE;
    bool ws = b > a;
    uint32_t x = 0;
    for (size_t p = a, i = 0; p > 0 && i < 4; i++) {
        p -= (size_t)tok_utf8_prev(text, p, &x);
        if (!IN(x, closers))
            break;
        x = 0;
    }
    if (IN(x, sentence_ends) && (ws || x >= 0x80))
        return CHUNK_CUT_SENTENCE;
    if (IN(x, clause_ends) && (ws || x >= 0x80))
        return CHUNK_CUT_CLAUSE;
    return ws ? CHUNK_CUT_SPACE : CHUNK_CUT_TOKEN;
}

static bool char_start(const struct split *s, size_t p)
{
    return p == s->len || ((unsigned char)s->text[p] & 0xC0) != 0x80;
}

/* s->cut[k] before classifying: token k starts inside a stretch the normalizer changed. */
#define INSIDE 0xFF

/* Whether the bytes of ids spell t[0..tlen): fills s->off[0..n] with the tokens' offsets into t, or
 * stores in *at where they first differ. */
static bool spell(const struct split *s, const int32_t *ids, const char *t, size_t tlen, size_t *at)
{
    size_t pos = 0;
    for (size_t k = 0; k < s->n; k++) {
        size_t bl;
        const char *b = tok_token_bytes(s->tok, ids[k], &bl);
        size_t same = 0;
        while (b && same < bl && pos + same < tlen && b[same] == t[pos + same])
            same++;
        if (!b || same < bl) {
            *at = pos + same;
            return false;
        }
        s->off[k] = pos;
        pos += bl;
    }
    s->off[s->n] = tlen;
    *at = pos;
    return pos == tlen;
}

/* A stretch the normalizer changed: text[o0, o1) became normalized[n0, n1). */
struct region {
    size_t o0, o1, n0, n1;
};

/* The normalized text being built, with the stretches that differ from the text. */
struct norm_map {
    struct buf form;
    struct region *rg;
    size_t nrg, cap;
};

/* The form of text[i, j): *form is the text itself or a new buffer also stored in *owned (caller
 * frees). Returns 0, or -1 out of memory. */
static int form_of(const struct split *s, size_t i, size_t j, const char **form, size_t *flen, char **owned)
{
    *form = s->text + i;
    *flen = j - i;
    *owned = NULL;
    bool ascii = j == i + 1 && (unsigned char)s->text[i] < 0x80;
    return ascii ? 0 : tok_normalize_text(s->tok, s->text + i, j - i, form, flen, owned);
}

static bool same_as_text(const struct split *s, size_t i, size_t j, const char *form, size_t flen)
{
    return flen == j - i && !memcmp(form, s->text + i, flen);
}

/* Appends form, the form of text[i, j), to m: a region when it differs. Returns 0, or -1 out of memory. */
static int append_form(const struct split *s, struct norm_map *m, size_t i, size_t j, const char *form,
                       size_t flen)
{
    if (!same_as_text(s, i, j, form, flen)) {
        if (array_reserve(&m->rg, &m->cap, m->nrg + 1, sizeof *m->rg, 16) < 0)
            return -1;
        m->rg[m->nrg++] = (struct region){i, j, m->form.len, m->form.len + flen};
    }
    return buf_append(&m->form, form, flen);
}

/* A character that attaches to the one before it: a combining mark or a Hangul vowel or final. */
static bool attaches(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME ||
           (c >= 0x1160 && c <= 0x11FF) || (c >= 0xD7B0 && c <= 0xD7FF) ||
           utf8proc_get_property((utf8proc_int32_t)c)->combining_class != 0;
}

/* The end of the group at g within text[g, j): a character and the ones attached to it. */
static size_t group_end(const struct split *s, size_t g, size_t j)
{
    uint32_t c;
    size_t h = g + (size_t)tok_utf8_next(s->text + g, &c);
    while (h < j) {
        int cl = tok_utf8_next(s->text + h, &c);
        if (!attaches(c))
            break;
        h += (size_t)cl;
    }
    return h;
}

/* Appends (or, with check, compares with whole[0, wlen)) the forms of the groups of text[i, j).
 * Returns 1 when they are appended or make whole, 0 when they do not, -1 out of memory. */
static int groups(const struct split *s, struct norm_map *m, size_t i, size_t j, bool check,
                  const char *whole, size_t wlen)
{
    size_t pos = 0;
    for (size_t g = i, h; g < j; g = h) {
        h = group_end(s, g, j);
        const char *form;
        size_t flen;
        char *owned;
        int rc = form_of(s, g, h, &form, &flen, &owned);
        if (rc == 0 && check)
            rc = pos + flen <= wlen && !memcmp(whole + pos, form, flen) ? 0 : 1;
        else if (rc == 0)
            rc = append_form(s, m, g, h, form, flen);
        pos += flen;
        free(owned);
        if (rc != 0)
            return rc < 0 ? -1 : 0;
    }
    return !check || pos == wlen;
}

/* Appends whole[0, wlen), the form of text[i, j) that differs from it, in the smallest pieces that
 * keep it: each character with the characters attached to it, when their forms make the whole form;
 * otherwise the whole as one region. Returns 0, or -1 out of memory. */
static int append_changed(const struct split *s, struct norm_map *m, size_t i, size_t j, const char *whole,
                          size_t wlen)
{
    int rc = groups(s, m, i, j, true, whole, wlen);
    if (rc == 1)
        return groups(s, m, i, j, false, NULL, 0) < 0 ? -1 : 0;
    return rc < 0 ? -1 : append_form(s, m, i, j, whole, wlen);
}

/* s->off for text that the normalizer changed. The text is normalized piece by piece, each piece an
 * ASCII character and the non-ASCII run after it (normalization forms never reach across an ASCII
 * character, so the pieces' forms make the form of the whole text); a piece that changes is split
 * further where that keeps its form (append_changed). Token offsets inside a changed piece are
 * marked INSIDE, the others are mapped back to the text. Returns 0 or -1 with err. */
static int normalized_offsets(struct split *s, const int32_t *ids, char *err, size_t errlen)
{
    struct norm_map m = {0};
    int rc = 0;
    for (size_t i = 0, j; i < s->len && rc == 0; i = j) {
        for (j = i + 1; j < s->len && (unsigned char)s->text[j] >= 0x80;)
            j++;
        const char *form;
        size_t flen;
        char *owned;
        rc = form_of(s, i, j, &form, &flen, &owned);
        if (rc == 0)
            rc = same_as_text(s, i, j, form, flen) ? buf_append(&m.form, form, flen)
                                                   : append_changed(s, &m, i, j, form, flen);
        free(owned);
    }
    const struct region *rg = m.rg;
    size_t nrg = m.nrg, at, r = 0;
    if (rc < 0)
        rc = errfmt(err, errlen, "out of memory");
    else if (!spell(s, ids, m.form.p, m.form.len, &at)) {
        while (r < nrg && rg[r].n1 <= at)
            r++;
        size_t o = r < nrg && rg[r].n0 < at ? rg[r].o0 : at + (r ? rg[r - 1].o1 - rg[r - 1].n1 : 0);
        rc = errfmt(err, errlen, "the tokenizer's tokens do not spell the text at byte %zu", o);
    }
    r = 0;
    for (size_t k = 0; rc == 0 && k <= s->n; k++) {
        size_t q = s->off[k];
        while (r < nrg && rg[r].n1 <= q)
            r++;
        if (r < nrg && rg[r].n0 < q)
            s->off[k] = rg[r].o0, s->cut[k] = INSIDE;
        else
            s->off[k] = q + (r ? rg[r - 1].o1 : 0) - (r ? rg[r - 1].n1 : 0);
    }
    buf_free(&m.form);
    free(m.rg);
    return rc;
}

/* Fills s->off and s->cut from the whole encoding ids[0..n). Returns 0 or -1 with err. */
static int classify(struct split *s, const int32_t *ids, char *err, size_t errlen)
{
    memset(s->cut, 0, s->n + 1);
    size_t at;
    if (!spell(s, ids, s->text, s->len, &at) && normalized_offsets(s, ids, err, errlen) < 0)
        return -1;

    /* backward: where the white space after each cut ends, and its newlines */
    size_t *b_of = malloc((s->n + 1) * sizeof *b_of);
    uint8_t *nl_after = malloc(s->n + 1);
    if (!b_of || !nl_after) {
        free(b_of);
        free(nl_after);
        return errfmt(err, errlen, "out of memory");
    }
    size_t q = s->len, b = s->len;
    int nls = 0;
    for (size_t k = s->n + 1; k-- > 0;) {
        size_t p = s->off[k];
        while (q > p) {
            uint32_t c;
            size_t cl = (size_t)tok_utf8_prev(s->text, q, &c);
            if (q - cl < p)
                break;
            if (!tok_unicode_is_space(c))
                b = q - cl, nls = 0;
            else if (c == '\n' && nls < 2)
                nls++;
            q -= cl;
        }
        b_of[k] = b;
        nl_after[k] = (uint8_t)nls;
    }
    /* forward: where the white space before each cut starts, and the kind of the cut */
    size_t a = 0;
    q = 0;
    nls = 0;
    for (size_t k = 0; k <= s->n; k++) {
        size_t p = s->off[k];
        while (q < p) {
            uint32_t c;
            size_t cl = (size_t)tok_utf8_next(s->text + q, &c);
            if (q + cl > p)
                break;
            if (!tok_unicode_is_space(c))
                a = q + cl, nls = 0;
            else if (c == '\n' && nls < 2)
                nls++;
            q += cl;
        }
        bool usable = s->cut[k] != INSIDE && char_start(s, p);
        s->cut[k] = usable ? (uint8_t)cut_kind(s->text, a, b_of[k], nls + nl_after[k]) : 0;
    }
    free(b_of);
    free(nl_after);
    return 0;
}

/* The best cut among tokens [lo, hi], the latest among equals; NONE when there is none. */
static size_t best_cut(const struct split *s, size_t lo, size_t hi)
{
    size_t best = NONE;
    int kind = 0;
    for (size_t k = hi + 1; k-- > lo && kind < CHUNK_CUT_PARAGRAPH;)
        if (s->cut[k] > kind)
            kind = s->cut[k], best = k;
    return best;
}

/* The latest cut among tokens (lo, hi]; NONE when there is none. */
static size_t last_cut(const struct split *s, size_t lo, size_t hi)
{
    for (size_t k = hi; k > lo; k--)
        if (s->cut[k])
            return k;
    return NONE;
}

/* The earliest cut among tokens [lo, hi]; NONE when there is none. */
static size_t first_cut(const struct split *s, size_t lo, size_t hi)
{
    for (size_t k = lo; k <= hi; k++)
        if (s->cut[k])
            return k;
    return NONE;
}

/* The best cut among tokens [lo, hi] after token floor, else the latest one in (floor, hi]. */
static size_t end_cut(const struct split *s, size_t floor, size_t lo, size_t hi)
{
    if (lo <= floor)
        lo = floor + 1;
    size_t e = lo <= hi ? best_cut(s, lo, hi) : NONE;
    return e != NONE ? e : last_cut(s, floor, hi < lo ? hi : lo - 1);
}

/* Tokens of text[from, to) encoded alone into *cnt. Returns 0 or -1 with err. */
static int count_tokens(const struct split *s, size_t from, size_t to, size_t *cnt, char *err, size_t errlen)
{
    int32_t *ids;
    if (tok_encode_ex(s->tok, s->text + from, to - from, false, &ids, cnt, err, errlen) < 0)
        return -1;
    free(ids);
    return 0;
}

/* The chunks of a classified split into *out / *n_out. */
static int make_chunks(const struct split *s, size_t C, size_t M, struct doc_chunk **out, int *n_out,
                       char *err, size_t errlen)
{
    struct doc_chunk *ch = NULL;
    size_t n_ch = 0, cap = 0;
    size_t st = 0, floor = 0; /* this chunk's first token; its end must lie after token floor */
    for (;;) {
        size_t hi = st + C < s->n ? st + C : s->n;
        size_t e = hi == s->n ? s->n : end_cut(s, floor, st + C / 2, hi);
        if (e == NONE) {
            free(ch);
            return errfmt(err, errlen,
                          "no token boundary falls on a character boundary in the %zu tokens after byte %zu",
                          C, s->off[st]);
        }
        size_t cnt;
        for (;;) {
            if (count_tokens(s, s->off[st], s->off[e], &cnt, err, errlen) < 0) {
                free(ch);
                return -1;
            }
            if (cnt <= C)
                break;
            size_t excess = cnt - C;
            size_t hi2 = e > floor + excess ? e - excess : floor + 1;
            e = hi2 < e ? end_cut(s, floor, st + C / 2, hi2) : NONE;
            if (e == NONE) {
                free(ch);
                return errfmt(err, errlen,
                              "the text after byte %zu encodes to more than %zu tokens wherever it is cut",
                              s->off[st], C);
            }
        }
        if (array_reserve(&ch, &cap, n_ch + 1, sizeof *ch, 16) < 0) {
            free(ch);
            return errfmt(err, errlen, "out of memory");
        }
        ch[n_ch++] = (struct doc_chunk){.start = s->off[st],
                                        .end = s->off[e],
                                        .n_tokens = (int)cnt,
                                        .end_cut = e == s->n ? 0 : s->cut[e]};
        if (e == s->n)
            break;
        /* the next start: M to M + M/2 tokens before e, within (st, e] */
        size_t hs = e > st + M ? e - M : st + 1;
        size_t ls = hs > st + M / 2 ? hs - M / 2 : st + 1;
        size_t ns = best_cut(s, ls, hs);
        if (ns == NONE)
            ns = last_cut(s, st, ls - 1);
        if (ns == NONE)
            ns = first_cut(s, hs, e);
        floor = e;
        st = ns;
    }
    *out = ch;
    *n_out = (int)n_ch;
    return 0;
}

int chunk_document(const struct tok *tok, const char *text, size_t len, int chunk_tokens, int overlap_tokens,
                   struct doc_chunk **out, int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (chunk_tokens < CHUNK_MIN_TOKENS)
        return errfmt(err, errlen, "chunk_tokens must be at least %d, not %d", CHUNK_MIN_TOKENS,
                      chunk_tokens);
    if (overlap_tokens < 0 || 2 * (long)overlap_tokens >= chunk_tokens)
        return errfmt(err, errlen,
                      "overlap_tokens must be at least 0 and less than half of chunk_tokens (%d), not %d",
                      chunk_tokens, overlap_tokens);
    if (len == 0)
        return 0;
    struct split s = {.tok = tok, .text = text, .len = len};
    int32_t *ids;
    if (tok_encode_ex(tok, text, len, false, &ids, &s.n, err, errlen) < 0)
        return -1;
    s.off = malloc((s.n + 1) * sizeof *s.off);
    s.cut = malloc(s.n + 1);
    int rc;
    if (!s.off || !s.cut)
        rc = errfmt(err, errlen, "out of memory");
    else
        rc = classify(&s, ids, err, errlen);
    free(ids);
    if (rc == 0)
        rc = make_chunks(&s, (size_t)chunk_tokens, (size_t)overlap_tokens, out, n, err, errlen);
    free(s.off);
    free(s.cut);
    return rc;
}
