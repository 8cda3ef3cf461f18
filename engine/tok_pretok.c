/* Pre-tokenizer steps (Split, Digits, ByteLevel) compiled with PCRE2; see tok_pretok.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tok_pretok.h"

#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/tok_seq.h"
#include "engine/tok_utf8.h"
#include "engine/util/array.h"
#include "engine/util/buf.h"

enum step_kind { STEP_SPLIT, STEP_BYTELEVEL };

/* SplitDelimiterBehavior */
enum behavior { B_REMOVED, B_ISOLATED, B_MERGED_WITH_PREVIOUS, B_MERGED_WITH_NEXT, B_CONTIGUOUS };

struct tok_pretok_step {
    enum step_kind kind;
    pcre2_code *re;         /* NULL for a ByteLevel step without its regex */
    enum behavior behavior; /* what happens to the matches */
    bool invert;            /* the pattern matches what lies between the delimiters */
    bool prefix_space;      /* ByteLevel add_prefix_space */
};

struct seg {
    size_t off, len;
    bool match;
};

struct tok_pretok_level {
    struct seg *v; /* the current piece's splits at this step */
    size_t n, cap;
    char *buf; /* the piece with a space in front (ByteLevel add_prefix_space) */
    size_t buf_cap;
};

/* GPT-2's pattern, used by ByteLevel with use_regex (as in HF's byte_level.rs). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Oniguruma's \w: letters, marks, numbers, connector punctuation (PCRE2 10.42's lacks marks). */
#define WORD_SET "\\p{L}\\p{M}\\p{N}\\p{Pc}"

/* Oniguruma's (and Rust's) \s: Unicode White_Space. PCRE2's also has U+180E. */
#define SPACE_SET                                                                                            \
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

char *tok_pretok_translate_regex(const char *pat)
{
    size_t n = strlen(pat);
    struct buf out = {0};
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            if (e == 's')
                buf_printf(&out, in_class ? "%s" : "[%s]", SPACE_SET);
            else if (e == 'S' && !in_class)
                buf_printf(&out, "[^%s]", SPACE_SET);
            else if (e == 'w')
                buf_printf(&out, in_class ? "%s" : "[%s]", WORD_SET);
            else if (e == 'W' && !in_class)
                buf_printf(&out, "[^%s]", WORD_SET);
            else
                buf_append(&out, pat + i - 1, 2); /* the escape as it is */
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            buf_append(&out, &c, 1);
            if (i + 1 < n && pat[i + 1] == '^')
                buf_append(&out, &pat[++i], 1);
            if (i + 1 < n && pat[i + 1] == ']') /* a leading ']' is a literal */
                buf_append(&out, &pat[++i], 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* [:alpha:] inside a class */
            const char *end = strstr(pat + i + 2, ":]");
            if (end) {
                size_t k = (size_t)(end + 2 - (pat + i));
                buf_append(&out, pat + i, k);
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']')
            in_class = false;
        buf_append(&out, &c, 1);
    }
    return buf_take(&out); /* NULL when out of memory */
}

/* ---- Unicode categories newer than PCRE2's tables
 *
 * Hugging Face tokenizers matches with Oniguruma's Unicode 15 tables; the PCRE2 we link may be older
 * (10.42: Unicode 14), so code points assigned since are unassigned (Cn) to it and \p{S} or \p{L}
 * misses them (DeepSeek-V3's pattern splits " 🪿" apart). utf8proc (the normalizer's tables) knows
 * them: every \p{X} of a pattern also gets the code points PCRE2 calls Cn whose utf8proc category
 * is X. With a PCRE2 as new as utf8proc the list is empty and patterns stay as they are. */

struct new_cp {
    int32_t cp;
    char cat[3]; /* utf8proc's two-letter category */
};
static struct new_cp *new_cps;
static size_t n_new_cps;
static pthread_once_t new_cps_once = PTHREAD_ONCE_INIT;

static void find_new_cps(void)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *cn = pcre2_compile((PCRE2_SPTR) "^\\p{Cn}$", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code,
                                   &at, NULL);
    pcre2_match_data *md = cn ? pcre2_match_data_create_from_pattern(cn, NULL) : NULL;
    size_t cap = 0;
    if (!md)
        goto out;
    pcre2_jit_compile(cn, PCRE2_JIT_COMPLETE);
    for (int32_t cp = 0; cp <= 0x10FFFF; cp++) {
        utf8proc_category_t c = utf8proc_category(cp);
        if (c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CS)
            continue;
        utf8proc_uint8_t u[4];
        utf8proc_ssize_t k = utf8proc_encode_char(cp, u);
        if (pcre2_match(cn, u, (PCRE2_SIZE)k, 0, 0, md, NULL) < 0)
            continue; /* PCRE2 knows it */
        if (n_new_cps == cap) {
            struct new_cp *v = realloc(new_cps, (cap = cap ? 2 * cap : 256) * sizeof *v);
            if (!v)
                break; /* out of memory: patterns stay as PCRE2 reads them */
            new_cps = v;
        }
        const char *name = utf8proc_category_string(cp);
        new_cps[n_new_cps].cp = cp;
        snprintf(new_cps[n_new_cps].cat, sizeof new_cps[n_new_cps].cat, "%s", name);
        n_new_cps++;
    }
out:
    pcre2_match_data_free(md);
    pcre2_code_free(cn);
}

/* Appends the ranges of new code points whose category is `name` (one or two letters) to out as
 * class items; returns how many ranges. */
static int append_new_ranges(struct buf *out, const char *name, size_t len)
{
    int n = 0;
    if (len < 1 || len > 2)
        return 0;
    for (size_t i = 0; i < n_new_cps;) {
        const char *c = new_cps[i].cat;
        if (c[0] != name[0] || (len == 2 && c[1] != name[1])) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < n_new_cps && new_cps[j + 1].cp == new_cps[j].cp + 1 && new_cps[j + 1].cat[0] == name[0] &&
               (len == 1 || new_cps[j + 1].cat[1] == name[1]))
            j++;
        if (j == i)
            buf_printf(out, "\\x{%x}", (unsigned)new_cps[i].cp);
        else
            buf_printf(out, "\\x{%x}-\\x{%x}", (unsigned)new_cps[i].cp, (unsigned)new_cps[j].cp);
        n++;
        i = j + 1;
    }
    return n;
}

/* Rewrites each \p{X} of a PCRE2 pattern (as tok_pretok_translate_regex writes it) to also match the
 * code points of category X that PCRE2's tables lack: inside a class the ranges follow it, outside
 * it becomes a class [\p{X}ranges]; \P{X} outside a class becomes [^\p{X}ranges]. Returns a new
 * string or NULL when out of memory. */
static char *add_new_cps(const char *pat)
{
    pthread_once(&new_cps_once, find_new_cps);
    size_t n = strlen(pat);
    struct buf out = {0};
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[i + 1];
            const char *close = (e == 'p' || e == 'P') && i + 2 < n && pat[i + 2] == '{' ? strchr(pat + i + 3, '}')
                                                                                            : NULL;
            if (close) {
                const char *name = pat + i + 3;
                size_t len = (size_t)(close - name), whole = (size_t)(close + 1 - (pat + i));
                struct buf extra = {0};
                int k = append_new_ranges(&extra, name, len);
                char *ranges = buf_take(&extra);
                if (k > 0 && !ranges) {
                    free(buf_take(&out));
                    return NULL;
                }
                if (k == 0 || (e == 'P' && in_class))
                    buf_append(&out, pat + i, whole);
                else if (in_class)
                    buf_printf(&out, "%.*s%s", (int)whole, pat + i, ranges);
                else
                    buf_printf(&out, "[%s\\p{%.*s}%s]", e == 'P' ? "^" : "", (int)len, name, ranges);
                free(ranges);
                i += whole - 1;
                continue;
            }
            buf_append(&out, pat + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            buf_append(&out, &c, 1);
            if (i + 1 < n && pat[i + 1] == '^')
                buf_append(&out, &pat[++i], 1);
            if (i + 1 < n && pat[i + 1] == ']')
                buf_append(&out, &pat[++i], 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') {
            const char *end = strstr(pat + i + 2, ":]");
            if (end) {
                size_t k = (size_t)(end + 2 - (pat + i));
                buf_append(&out, pat + i, k);
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']')
            in_class = false;
        buf_append(&out, &c, 1);
    }
    return buf_take(&out);
}

/* ---- loading */

static int compile(pcre2_code **re, const char *pattern, bool literal, const char *where, const char *path,
                   char *err, size_t errlen)
{
    char *onig = literal ? NULL : tok_pretok_translate_regex(pattern);
    char *pat = onig ? add_new_cps(onig) : NULL;
    free(onig);
    if (!literal && !pat) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int code;
    PCRE2_SIZE at;
    /* Oniguruma's ^ and $ match at line boundaries (Ruby semantics): PCRE2_MULTILINE.
     * PCRE2_LITERAL refuses UCP and MULTILINE. */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), PCRE2_ZERO_TERMINATED, opts, &code, &at, NULL);
    free(pat);
    if (!*re) {
        char msg[256];
        pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(err, errlen, "%s: %s: the pattern does not compile with PCRE2 at offset %zu: %s", where,
                 path, (size_t)at, msg);
        return -1;
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* without JIT (not built in) it still works, slower */
    return 0;
}

static int get_bool(const json_t *o, const char *key, bool dflt, bool *out, const char *where,
                    const char *path, char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "%s: %s.%s: expected true or false", where, path, key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* One Split, Digits or ByteLevel step (tok_seq_step_fn; ctx is the struct tok_pretok). */
static int add_step(void *ctx, const json_t *j, const char *type, const char *where, const char *path,
                    char *err, size_t errlen)
{
    struct tok_pretok *p = ctx;
    if (p->n > 0 && p->steps[p->n - 1].kind == STEP_BYTELEVEL) {
        snprintf(err, errlen, "%s: %s: a step after ByteLevel is not supported", where, path);
        return -1;
    }
    struct tok_pretok_step *t = realloc(p->steps, (size_t)(p->n + 1) * sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    p->steps = t;
    struct tok_pretok_step *s = &p->steps[p->n];
    memset(s, 0, sizeof *s);
    char sub[300];
    if (!strcmp(type, "Split")) {
        s->kind = STEP_SPLIT;
        const json_t *pat = json_object_get(j, "pattern");
        const char *regex = json_string_value(json_object_get(pat, "Regex"));
        const char *literal = json_string_value(json_object_get(pat, "String"));
        if (!json_is_object(pat) || (!regex && !literal)) {
            snprintf(err, errlen, "%s: %s.pattern: expected {\"Regex\": string} or {\"String\": string}",
                     where, path);
            return -1;
        }
        const char *bname = json_string_value(json_object_get(j, "behavior"));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int b = -1;
        for (int i = 0; bname && i < 5; i++)
            if (!strcmp(bname, names[i]))
                b = i;
        if (b < 0) {
            snprintf(
                err, errlen,
                "%s: %s.behavior: expected one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                "Contiguous",
                where, path);
            return -1;
        }
        s->behavior = (enum behavior)b;
        if (get_bool(j, "invert", false, &s->invert, where, path, err, errlen) != 0)
            return -1;
        snprintf(sub, sizeof sub, "%s.pattern.%s", path, regex ? "Regex" : "String");
        if (regex && literal) {
            snprintf(err, errlen, "%s: %s.pattern: both Regex and String", where, path);
            return -1;
        }
        if (literal && !*literal) { /* HF: an empty String pattern matches nothing */
            if (compile(&s->re, "(*FAIL)", false, where, sub, err, errlen) != 0)
                return -1;
        } else if (compile(&s->re, regex ? regex : literal, !regex, where, sub, err, errlen) != 0)
            return -1;
    } else if (!strcmp(type, "Digits")) {
        bool individual;
        if (get_bool(j, "individual_digits", false, &individual, where, path, err, errlen) != 0)
            return -1;
        s->kind = STEP_SPLIT;
        s->behavior = B_ISOLATED;
        snprintf(sub, sizeof sub, "%s.individual_digits", path);
        if (compile(&s->re, individual ? "\\p{N}" : "\\p{N}+", false, where, sub, err, errlen) != 0)
            return -1;
    } else if (!strcmp(type, "ByteLevel")) {
        bool use_regex;
        s->kind = STEP_BYTELEVEL;
        s->behavior = B_ISOLATED;
        if (get_bool(j, "add_prefix_space", true, &s->prefix_space, where, path, err, errlen) != 0 ||
            get_bool(j, "use_regex", true, &use_regex, where, path, err, errlen) != 0)
            return -1;
        snprintf(sub, sizeof sub, "%s.use_regex", path);
        if (use_regex && compile(&s->re, GPT2_PATTERN, false, where, sub, err, errlen) != 0)
            return -1;
    } else {
        snprintf(err, errlen, "%s: %s.type: '%s' is not supported (Split, Digits, ByteLevel, Sequence)",
                 where, path, type);
        return -1;
    }
    p->n++;
    return 0;
}

int tok_pretok_from_json(struct tok_pretok *p, const json_t *j, const char *where, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!j || json_is_null(j)) {
        snprintf(err, errlen, "%s: pre_tokenizer: missing; a byte-level BPE tokenizer needs a ByteLevel step",
                 where);
        return -1;
    }
    if (tok_seq_walk(j, "pretokenizers", add_step, p, where, "pre_tokenizer", err, errlen) != 0) {
        tok_pretok_free(p);
        return -1;
    }
    if (p->n == 0 || p->steps[p->n - 1].kind != STEP_BYTELEVEL) {
        snprintf(err, errlen,
                 "%s: pre_tokenizer: no ByteLevel step; only byte-level BPE tokenizers are supported", where);
        tok_pretok_free(p);
        return -1;
    }
    return 0;
}

void tok_pretok_free(struct tok_pretok *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->steps[i].re);
    free(p->steps);
    p->steps = NULL;
    p->n = 0;
}

void tok_pretok_work_free(struct tok_pretok_work *w)
{
    if (!w)
        return;
    pcre2_match_data_free(w->md);
    pcre2_match_context_free(w->mctx);
    pcre2_jit_stack_free(w->jit_stack);
    for (int i = 0; i < w->nlevels; i++) {
        free(w->levels[i].v);
        free(w->levels[i].buf);
    }
    free(w->levels);
    memset(w, 0, sizeof *w);
}

/* ---- running */

static int push(struct tok_pretok_level *l, size_t off, size_t len, bool match)
{
    if (array_reserve(&l->v, &l->cap, l->n + 1, sizeof *l->v, 64))
        return -1;
    l->v[l->n++] = (struct seg){off, len, match};
    return 0;
}

/* One pcre2_match. The split patterns backtrack at most linearly, but over a long run (megabytes
 * of spaces) that exceeds PCRE2's default match limit of 10^7, so the limit grows with the
 * subject. A match that needs more than the default 32 KiB JIT stack is retried with 16 MiB. */
static int match_at(const pcre2_code *re, const char *s, size_t len, size_t start, struct tok_pretok_work *w,
                    char *err, size_t errlen)
{
    uint64_t limit = 10000000 + 64 * (uint64_t)len;
    pcre2_set_match_limit(w->mctx, limit > UINT32_MAX ? UINT32_MAX : (uint32_t)limit);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !w->jit_stack) {
        w->jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
        if (!w->jit_stack) {
            snprintf(err, errlen, "out of memory");
            return -2;
        }
        pcre2_jit_stack_assign(w->mctx, NULL, w->jit_stack);
        rc = pcre2_match(re, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        char msg[256];
        pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(err, errlen, "pre-tokenizer regex failed on a %zu-byte piece: %s", len, msg);
        return -2;
    }
    return 1;
}

/* The (offsets, is_match) list of HF's Pattern::find_matches for SysRegex (Oniguruma's
 * find_iter: an empty match right where the previous match ended is skipped). */
static int find_matches(const pcre2_code *re, const char *s, size_t len, struct tok_pretok_work *w,
                        struct tok_pretok_level *l, char *err, size_t errlen)
{
    size_t start = 0, prev = 0, last_end = 0;
    bool any = false;
    l->n = 0;
    while (start <= len) {
        int rc = match_at(re, s, len, start, w, err, errlen);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && any && me == last_end) {
            if (start >= len)
                break;
            uint32_t cp;
            start += (size_t)tok_utf8_next(s + start, &cp);
            continue;
        }
        if (prev != ms && push(l, prev, ms - prev, false) != 0)
            goto oom;
        if (push(l, ms, me - ms, true) != 0)
            goto oom;
        prev = me;
        start = me;
        last_end = me;
        any = true;
    }
    if (prev != len && push(l, prev, len - prev, false) != 0)
        goto oom;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* NormalizedString::split's folds: rewrites l->v in place into the pieces to keep (match = false
 * marks a piece to keep; true one to drop, used by Removed). */
static void apply_behavior(struct tok_pretok_level *l, enum behavior b, bool invert)
{
    struct seg *v = l->v;
    size_t n = l->n, k = 0;
    if (invert)
        for (size_t i = 0; i < n; i++)
            v[i].match = !v[i].match;
    switch (b) {
    case B_REMOVED:
        return;
    case B_ISOLATED:
        for (size_t i = 0; i < n; i++)
            v[i].match = false;
        return;
    case B_CONTIGUOUS: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool m = v[i].match;
            if (m == prev && k > 0)
                v[k - 1].len = v[i].off + v[i].len - v[k - 1].off;
            else
                v[k++] = (struct seg){v[i].off, v[i].len, false};
            prev = m;
        }
        break;
    }
    case B_MERGED_WITH_PREVIOUS: {
        bool prev = false;
        for (size_t i = 0; i < n; i++) {
            bool m = v[i].match;
            if (m && !prev && k > 0)
                v[k - 1].len = v[i].off + v[i].len - v[k - 1].off;
            else
                v[k++] = (struct seg){v[i].off, v[i].len, false};
            prev = m;
        }
        break;
    }
    case B_MERGED_WITH_NEXT: { /* the same fold from the right */
        bool prev = false;
        k = n;
        for (size_t i = n; i-- > 0;) {
            bool m = v[i].match;
            if (m && !prev && k < n)
                v[k].len = v[k].off + v[k].len - v[i].off, v[k].off = v[i].off;
            else
                v[--k] = (struct seg){v[i].off, v[i].len, false};
            prev = m;
        }
        memmove(v, v + k, (n - k) * sizeof *v);
        k = n - k;
        break;
    }
    }
    l->n = k;
}

static int run_level(const struct tok_pretok *p, int k, const char *s, size_t len, struct tok_pretok_work *w,
                     tok_piece_fn emit, void *ctx, char *err, size_t errlen)
{
    if (len == 0)
        return 0;
    if (k == p->n)
        return emit(ctx, s, len);
    const struct tok_pretok_step *st = &p->steps[k];
    struct tok_pretok_level *l = &w->levels[k];
    if (st->kind == STEP_BYTELEVEL && st->prefix_space && s[0] != ' ') {
        if (len + 1 > l->buf_cap) {
            char *b = realloc(l->buf, len + 64);
            if (!b) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            l->buf = b;
            l->buf_cap = len + 64;
        }
        l->buf[0] = ' ';
        memcpy(l->buf + 1, s, len);
        s = l->buf;
        len++;
    }
    if (!st->re)
        return run_level(p, k + 1, s, len, w, emit, ctx, err, errlen);
    if (find_matches(st->re, s, len, w, l, err, errlen) != 0)
        return -1;
    apply_behavior(l, st->behavior, st->invert);
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].match) /* Removed */
            continue;
        int rc = run_level(p, k + 1, s + l->v[i].off, l->v[i].len, w, emit, ctx, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int tok_pretok_run(const struct tok_pretok *p, const char *s, size_t len, struct tok_pretok_work *w,
                   tok_piece_fn emit, void *ctx, char *err, size_t errlen)
{
    if (!w->md) {
        w->md = pcre2_match_data_create(1, NULL);
        w->mctx = pcre2_match_context_create(NULL);
        if (!w->md || !w->mctx) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (w->nlevels < p->n) {
        struct tok_pretok_level *lv = realloc(w->levels, (size_t)p->n * sizeof *lv);
        if (!lv) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        memset(lv + w->nlevels, 0, (size_t)(p->n - w->nlevels) * sizeof *lv);
        w->levels = lv;
        w->nlevels = p->n;
    }
    return run_level(p, 0, s, len, w, emit, ctx, err, errlen);
}
