/* See truncate.h. */
#include "worker/jobs/truncate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"

static const char *const mode_names[] = {NULL, "start", "end", "middle"};

const char *trunc_mode_name(enum job_truncate mode)
{
    return (unsigned)mode < sizeof mode_names / sizeof mode_names[0] ? mode_names[mode] : NULL;
}

enum job_truncate trunc_mode_of(const char *s)
{
    for (size_t i = 1; s && i < sizeof mode_names / sizeof mode_names[0]; i++)
        if (!strcmp(s, mode_names[i]))
            return (enum job_truncate)i;
    return JOB_TRUNCATE_NONE;
}

int trunc_budget(const struct job *j, int max_model_len)
{
    long long out = j->max_tokens;
    if (!j->max_tokens_given) {
        if (out > max_model_len / 2)
            out = max_model_len / 2;
        if (out < 1)
            out = 1;
    }
    long long b = max_model_len - out;
    return b < -1 ? -1 : (int)b;
}

/* Of `keep` kept items, how many come from the front and how many from the back. */
static void split_kept(enum job_truncate mode, size_t keep, size_t *front, size_t *back)
{
    *front = mode == JOB_TRUNCATE_START ? 0 : mode == JOB_TRUNCATE_END ? keep : (keep + 1) / 2;
    *back = keep - *front;
}

int trunc_ids(int32_t *ids, size_t *n, size_t head, size_t tail, size_t budget, enum job_truncate mode)
{
    if (*n <= budget)
        return 0;
    if (head + tail > budget || head + tail > *n)
        return -1;
    size_t body = *n - head - tail, keep = budget - head - tail, front, back;
    split_kept(mode, keep, &front, &back);
    memmove(ids + head + front, ids + head + body - back, (back + tail) * sizeof *ids);
    *n = budget;
    return (int)(body - keep);
}

/* ---- UTF-8 edges of a cut */

/* The length of s[0..n) without an incomplete character at its end. */
static size_t whole_chars_end(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    unsigned char lead = (unsigned char)s[i];
    size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
    return i + need > n ? i : n;
}

/* How many bytes at the start of s[0..n) continue a character that began before it. */
static size_t partial_chars_start(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

/* The bytes of ids[0..n) appended to b. */
static void append_token_bytes(struct buf *b, const struct tok *tok, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *p = tok_token_bytes(tok, ids[i], &len);
        if (p)
            buf_append(b, p, len);
    }
}

/* The text kept of content ids c[0..m) when `keep` of them stay: the front and back tokens' bytes,
 * each cut back to whole characters where the cut is. A new string (free()), NULL out of memory. */
static char *kept_text(const struct tok *tok, const int32_t *c, size_t m, size_t keep, enum job_truncate mode,
                       size_t *len)
{
    size_t front, back;
    split_kept(mode, keep, &front, &back);
    struct buf f = {0}, k = {0};
    append_token_bytes(&f, tok, c, front);
    append_token_bytes(&k, tok, c + m - back, back);
    size_t skip = partial_chars_start(k.p ? k.p : "", k.len);
    struct buf out = {0};
    buf_append(&out, f.p ? f.p : "", whole_chars_end(f.p ? f.p : "", f.len));
    buf_append(&out, (k.p ? k.p : "") + skip, k.len - skip);
    bool oom = f.oom || k.oom;
    buf_free(&f);
    buf_free(&k);
    *len = out.len;
    char *s = buf_take(&out);
    if (oom) {
        free(s);
        return NULL;
    }
    return s;
}

/* ---- messages */

/* The longest text content of msgs (the first of equal ones): the object that holds it and its key
 * ("content" of a message, "text" of a part), and its name for messages. false when there is none. */
static bool longest_text(json_t *msgs, json_t **holder, const char **key, char *name, size_t namelen)
{
    size_t best = 0, i, k;
    bool found = false;
    json_t *m, *p;
    json_array_foreach(msgs, i, m)
    {
        json_t *c = json_object_get(m, "content");
        if (json_is_string(c) && (!found || json_string_length(c) > best)) {
            best = json_string_length(c), found = true;
            *holder = m, *key = "content";
            snprintf(name, namelen, "messages[%zu].content", i);
        }
        if (json_is_array(c))
            json_array_foreach(c, k, p)
            {
                json_t *t = json_object_get(p, "text");
                if (json_is_string(t) && (!found || json_string_length(t) > best)) {
                    best = json_string_length(t), found = true;
                    *holder = p, *key = "text";
                    snprintf(name, namelen, "messages[%zu].content[%zu].text", i, k);
                }
            }
    }
    return found;
}

/* The job's messages rendered with j's chat settings and msgs in place of its messages, tokenized
 * as job_prepare does. */
static int render_tokens(const struct job *j, json_t *msgs, const struct tok *tok,
                         const struct chat_template *ct, int32_t **ids, size_t *n, char *err, size_t errlen)
{
    struct job k = *j; /* a shallow view: nothing of it is freed here */
    k.messages = msgs;
    char *text = NULL;
    size_t len = 0;
    int rc = job_render_chat(&k, ct, &text, &len, err, errlen);
    if (rc)
        return rc;
    rc = tok_encode_ex(tok, text, len, false, ids, n, err, errlen);
    free(text);
    return rc ? JOB_ERR_INVALID : JOB_OK;
}

static int fit_chat(const struct job *j, const struct tok *tok, const struct chat_template *ct, size_t budget,
                    int max_model_len, int32_t **tokens, size_t *n, int *dropped, char *err, size_t errlen)
{
    json_t *msgs = json_deep_copy(j->messages), *holder = NULL;
    const char *key = NULL;
    char name[96];
    int32_t *c = NULL, *ids = NULL;
    size_t m = 0, n_ids = *n;
    int rc = JOB_OK;
    if (!msgs)
        return errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "out of memory");
    if (!longest_text(msgs, &holder, &key, name, sizeof name)) {
        rc = errfmt_rc(err, errlen, JOB_ERR_CONTEXT,
                       "the prompt has %zu tokens, over the %zu that max_model_len (%d) leaves beside the "
                       "output, and no message has text content that \"truncate\" could cut",
                       *n, budget, max_model_len);
        goto out;
    }
    json_t *orig = json_incref(json_object_get(holder, key));
    if (tok_encode_ex(tok, json_string_value(orig), json_string_length(orig), false, &c, &m, err, errlen)) {
        json_decref(orig);
        rc = JOB_ERR_INVALID;
        goto out;
    }
    json_decref(orig);
    size_t drop = *n - budget;
    for (int round = 0; round < TRUNC_MAX_ROUNDS; round++) {
        size_t keep = drop < m ? m - drop : 0, len = 0;
        char *text = kept_text(tok, c, m, keep, j->truncate, &len);
        json_t *s = text ? json_stringn(text, len) : NULL;
        if (!s || json_object_set_new(holder, key, s)) {
            rc = text
                     ? errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "the cut text of %s is not valid UTF-8", name)
                     : errfmt_rc(err, errlen, JOB_ERR_INTERNAL, "out of memory");
            free(text);
            goto out;
        }
        free(text);
        free(ids);
        ids = NULL;
        if ((rc = render_tokens(j, msgs, tok, ct, &ids, &n_ids, err, errlen)))
            goto out;
        if (n_ids <= budget)
            break;
        if (keep == 0) {
            rc = errfmt_rc(
                err, errlen, JOB_ERR_CONTEXT,
                "even with %s (the longest text) emptied by \"truncate\", the prompt has %zu tokens, "
                "over the %zu that max_model_len (%d) leaves beside the output",
                name, n_ids, budget, max_model_len);
            goto out;
        }
        drop += n_ids - budget;
    }
    if (n_ids > budget) {
        rc = errfmt_rc(err, errlen, JOB_ERR_CONTEXT,
                       "\"truncate\" did not bring the prompt under %zu tokens in %d renders of %s", budget,
                       TRUNC_MAX_ROUNDS, name);
        goto out;
    }
    *dropped = (int)(*n - n_ids);
    free(*tokens);
    *tokens = ids;
    *n = n_ids;
    ids = NULL;
out:
    free(ids);
    free(c);
    json_decref(msgs);
    return rc;
}

/* ---- prompts */

/* How many of ids[0..n) the post-processor added at the front (*head) and the back (*tail): ids is
 * text's encoding with specials, found around its encoding without them. */
static int added_specials(const struct tok *tok, const char *text, const int32_t *ids, size_t n, size_t *head,
                          size_t *tail, char *err, size_t errlen)
{
    int32_t *plain;
    size_t np;
    *head = *tail = 0;
    if (tok_encode_ex(tok, text, strlen(text), false, &plain, &np, err, errlen))
        return JOB_ERR_INVALID;
    for (size_t p = 0; np <= n && p <= n - np; p++)
        if (!memcmp(ids + p, plain, np * sizeof *ids)) {
            *head = p;
            *tail = n - np - p;
            break;
        }
    free(plain);
    return JOB_OK;
}

int trunc_fit(const struct job *j, const struct tok *tok, const struct chat_template *ct, int max_model_len,
              int32_t **tokens, size_t *n, int *dropped, char *err, size_t errlen)
{
    *dropped = 0;
    if (j->truncate == JOB_TRUNCATE_NONE || max_model_len <= 0)
        return JOB_OK;
    int budget = trunc_budget(j, max_model_len);
    if (budget >= 0 && *n <= (size_t)budget)
        return JOB_OK;
    if (budget < 1)
        return errfmt_rc(
            err, errlen, JOB_ERR_CONTEXT,
            "max_tokens is %d and max_model_len is %d: no room is left for a prompt, truncated or "
            "not",
            j->max_tokens, max_model_len);
    if (j->messages)
        return fit_chat(j, tok, ct, (size_t)budget, max_model_len, tokens, n, dropped, err, errlen);
    size_t head = 0, tail = 0;
    if (j->prompt_ids) {
        head = tok_bos_id(tok) >= 0 && (*tokens)[0] == tok_bos_id(tok);
    } else {
        int rc = added_specials(tok, j->prompt, *tokens, *n, &head, &tail, err, errlen);
        if (rc)
            return rc;
    }
    int d = trunc_ids(*tokens, n, head, tail, (size_t)budget, j->truncate);
    if (d < 0)
        return errfmt_rc(err, errlen, JOB_ERR_CONTEXT,
                         "the tokenizer's %zu special tokens alone are over the %d tokens max_model_len (%d) "
                         "leaves beside the output",
                         head + tail, budget, max_model_len);
    *dropped = d;
    return JOB_OK;
}
