/* Unicode normalization steps for the tokenizer; see tok_normalize.h. */
#include "engine/tok_normalize.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/tok_seq.h"
#include "engine/tok_utf8.h"
#include "engine/util/buf.h"

static int add_step(void *ctx, const json_t *j, const char *type, const char *where, const char *path,
                    char *err, size_t errlen);

int tok_normalizer_from_json(struct tok_normalizer *n, const json_t *j, const char *where, char *err,
                             size_t errlen)
{
    n->n = 0;
    if (!j || json_is_null(j))
        return 0;
    return tok_seq_walk(j, "normalizers", add_step, n, where, "normalizer", err, errlen);
}

/* One normalization form (tok_seq_step_fn; ctx is the struct tok_normalizer). */
static int add_step(void *ctx, const json_t *j, const char *type, const char *where, const char *path,
                    char *err, size_t errlen)
{
    (void)j;
    struct tok_normalizer *n = ctx;
    int opt;
    if (!strcmp(type, "NFC"))
        opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD"))
        opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC"))
        opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD"))
        opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else {
        snprintf(err, errlen, "%s: %s.type: '%s' is not supported (NFC, NFD, NFKC, NFKD, Sequence)", where,
                 path, type);
        return -1;
    }
    if (n->n == TOK_NORM_MAX_STEPS) {
        snprintf(err, errlen, "%s: %s: more than %d normalizer steps", where, path, TOK_NORM_MAX_STEPS);
        return -1;
    }
    n->steps[n->n++] = opt;
    return 0;
}

/* NFC needs work only around code points >= U+0300: every character below U+0300 is a starter
 * (canonical combining class 0) that NFC keeps as it is and that never composes with a character
 * before it (the first combining mark is U+0300). So text may be cut before any such character
 * and normalized piece by piece. In UTF-8, a byte below 0xCC that is not a continuation byte starts
 * a character below U+0300. */
static bool low_start(unsigned char b)
{
    return b < 0x80 || (b >= 0xC0 && b < 0xCC);
}

/* NFC of s into a new buffer, calling utf8proc only on the spans of characters >= U+0300 (with
 * the character before each, which they may compose with). */
static int nfc(const char *s, size_t len, char **out, size_t *out_len)
{
    struct buf o = {0};
    size_t done = 0, i = 0;
    while (i < len) {
        if ((unsigned char)s[i] < 0xCC) {
            i++;
            continue;
        }
        size_t start = i;
        if (start > done) { /* the character before the span */
            uint32_t cp;
            start -= (size_t)tok_utf8_prev(s, i, &cp);
        }
        size_t end = i + 1;
        while (end < len && !low_start((unsigned char)s[end]))
            end++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(end - start), &dst,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0 || buf_append(&o, s + done, start - done) != 0 || buf_append(&o, dst, (size_t)r) != 0) {
            free(dst);
            buf_free(&o);
            return -1;
        }
        free(dst);
        done = i = end;
    }
    if (buf_append(&o, s + done, len - done) != 0) {
        buf_free(&o);
        return -1;
    }
    *out_len = o.len;
    *out = buf_take(&o);
    return 0;
}

int tok_normalize(const struct tok_normalizer *n, const char *s, size_t len, const char **out,
                  size_t *out_len, char **owned)
{
    *out = s;
    *out_len = len;
    *owned = NULL;
    for (int i = 0; i < n->n; i++) {
        char *dst = NULL;
        size_t dlen = 0;
        if (n->steps[i] == (UTF8PROC_STABLE | UTF8PROC_COMPOSE)) {
            size_t k = 0;
            while (k < *out_len && (unsigned char)(*out)[k] < 0xCC)
                k++;
            if (k == *out_len)
                continue; /* already NFC */
            if (nfc(*out, *out_len, &dst, &dlen) != 0)
                goto oom;
        } else {
            utf8proc_uint8_t *d = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)*out, (utf8proc_ssize_t)*out_len, &d,
                                              (utf8proc_option_t)n->steps[i]);
            if (r < 0)
                goto oom; /* the input is valid UTF-8, so only memory can fail */
            dst = (char *)d;
            dlen = (size_t)r;
        }
        free(*owned);
        *owned = dst;
        *out = dst;
        *out_len = dlen;
    }
    return 0;
oom:
    free(*owned);
    *owned = NULL;
    return -1;
}
