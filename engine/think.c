/* The think block (see think.h). */
#include "engine/think.h"

#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"

void think_vocab_none(struct think_vocab *v)
{
    memset(v, 0, sizeof *v);
    v->open = v->close = -1;
}

bool think_vocab_ok(const struct think_vocab *v)
{
    return v->open >= 0 && v->close >= 0;
}

/* Encodes text into out[0, THINK_MAX_CLOSE); the count, or -1 when it does not fit, fails or lacks
 * the close tag. */
static int encode_close(const struct tok *tok, const char *text, int32_t close, int32_t *out)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    if (tok_encode_ex(tok, text, strlen(text), false, &ids, &n, err, sizeof err)) {
        free(ids);
        return -1;
    }
    bool has_close = false;
    for (size_t i = 0; i < n; i++)
        has_close |= ids[i] == close;
    int ret = -1;
    if (has_close && n <= THINK_MAX_CLOSE) {
        memcpy(out, ids, n * sizeof *ids);
        ret = (int)n;
    }
    free(ids);
    return ret;
}

void think_vocab_init(struct think_vocab *v, const struct tok *tok)
{
    think_vocab_none(v);
    int32_t open = tok_token_to_id(tok, "<think>"), close = tok_token_to_id(tok, "</think>");
    if (open < 0 || close < 0 || open == close || !tok_is_added(tok, open) || !tok_is_added(tok, close))
        return;
    int n_nl = encode_close(tok, "\n</think>\n\n", close, v->close_nl);
    int n_bare = encode_close(tok, "</think>\n\n", close, v->close_bare);
    if (n_nl < 0 || n_bare < 0)
        return;
    v->n_close_nl = n_nl;
    v->n_close_bare = n_bare;
    v->open = open;
    v->close = close;
}

void think_start(struct think_state *s, const struct think_vocab *v, const int32_t *prompt, int n_prompt,
                 int budget)
{
    memset(s, 0, sizeof *s);
    s->budget = budget < 0 ? -1 : budget;
    if (!think_vocab_ok(v)) {
        s->phase = THINK_NONE;
        return;
    }
    s->phase = THINK_MAYBE;
    for (int i = n_prompt - 1; i >= 0; i--) {
        if (prompt[i] == v->close)
            break;
        if (prompt[i] == v->open) {
            s->phase = THINK_IN;
            s->seen = true;
            break;
        }
    }
}

bool think_forcing(const struct think_state *s)
{
    if (s->force)
        return s->i_force < s->n_force;
    return s->phase == THINK_IN && s->budget >= 0 && s->n_inside >= s->budget;
}

int32_t think_forced(struct think_state *s, const struct think_vocab *v, bool last_nl)
{
    if (!think_forcing(s))
        return -1;
    if (!s->force) {
        s->force = last_nl ? v->close_bare : v->close_nl;
        s->n_force = last_nl ? v->n_close_bare : v->n_close_nl;
        s->i_force = 0;
    }
    return s->force[s->i_force++];
}

enum think_route think_push(struct think_state *s, const struct think_vocab *v, int32_t id)
{
    switch (s->phase) {
    case THINK_MAYBE:
        if (id == v->open) {
            s->phase = THINK_IN;
            s->seen = true;
            s->n_tokens = 1;
            return THINK_OPEN;
        }
        s->phase = THINK_NONE;
        return THINK_ANSWER;
    case THINK_IN:
        s->n_tokens++;
        if (id == v->close) {
            s->phase = THINK_AFTER;
            return THINK_CLOSE;
        }
        s->n_inside++;
        return THINK_REASONING;
    case THINK_NONE:
    case THINK_AFTER:
    default:
        return THINK_ANSWER;
    }
}
