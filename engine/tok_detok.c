/* Incremental decoding for streaming (struct tok_stream, declared in tokenizer.h).
 *
 * Pending bytes are at most one unfinished UTF-8 character (3 bytes). Each push decodes pending +
 * the new token's bytes with tok_utf8_lossy in non-final mode: complete characters and ill-formed
 * bytes (as U+FFFD) come out, a well-formed but unfinished tail stays pending. Lossy decoding
 * decides each position from the bytes at and after it only, so emitting early gives exactly what
 * decoding everything at once gives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tok_utf8.h"
#include "engine/tokenizer.h"

struct tok_stream {
    const struct tok *tok;
    bool skip_special;
    char pend[4];
    size_t npend;
    char *in, *out; /* scratch: pending + token bytes, and their decoding */
    size_t in_cap, out_cap;
};

struct tok_stream *tok_stream_new(const struct tok *tok, bool skip_special)
{
    struct tok_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->tok = tok;
    s->skip_special = skip_special;
    s->in_cap = 64;
    s->out_cap = 3 * s->in_cap + 1;
    s->in = malloc(s->in_cap);
    s->out = malloc(s->out_cap);
    if (!s->in || !s->out) {
        tok_stream_free(s);
        return NULL;
    }
    return s;
}

void tok_stream_free(struct tok_stream *s)
{
    if (!s)
        return;
    free(s->in);
    free(s->out);
    free(s);
}

static int reserve(struct tok_stream *s, size_t n)
{
    if (n <= s->in_cap)
        return 0;
    size_t cap = n * 2;
    char *in = realloc(s->in, cap);
    if (!in)
        return -1;
    s->in = in;
    s->in_cap = cap;
    char *out = realloc(s->out, 3 * cap + 1);
    if (!out)
        return -1;
    s->out = out;
    s->out_cap = 3 * cap + 1;
    return 0;
}

int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen)
{
    size_t n;
    const char *bytes = tok_token_bytes(s->tok, id, &n);
    s->out[0] = 0;
    *text = s->out;
    *len = 0;
    if (!bytes) {
        snprintf(err, errlen, "%d is not a token id (vocabulary size %d)", id, tok_vocab_size(s->tok));
        return -1;
    }
    if (s->skip_special && tok_is_special(s->tok, id))
        return 0;
    if (reserve(s, s->npend + n) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(s->in, s->pend, s->npend);
    memcpy(s->in + s->npend, bytes, n);
    size_t total = s->npend + n, used;
    size_t o = tok_utf8_lossy(s->in, total, false, s->out, &used);
    s->out[o] = 0;
    s->npend = total - used;
    memcpy(s->pend, s->in + used, s->npend);
    *text = s->out; /* reserve may have moved it */
    *len = o;
    return 0;
}

void tok_stream_flush(struct tok_stream *s, const char **text, size_t *len)
{
    size_t o = tok_utf8_lossy(s->pend, s->npend, true, s->out, NULL);
    s->out[o] = 0;
    s->npend = 0;
    *text = s->out;
    *len = o;
}

size_t tok_stream_pending(const struct tok_stream *s)
{
    return s->npend;
}
