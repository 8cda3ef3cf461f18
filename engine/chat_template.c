/* The Qwen3 ChatML template, natively; see chat_template.h.
 *
 * This follows the official Qwen3 Jinja template (tokenizer_config.json "chat_template") line by
 * line for the subset we support, with Python's string semantics: split('</think>')[-1] is the text
 * after the last "</think>", split('</think>')[0] the text before the first one, and
 * strip/lstrip/rstrip('\n') remove only '\n' bytes. All of it works on bytes: '\n', "<think>" and
 * "</think>" are ASCII, so byte matching on UTF-8 is the same as Python's code-point matching. */
#include "engine/chat_template.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/buf.h"
#include "engine/util/errfmt.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define TOOL_RESPONSE_OPEN "<tool_response>"
#define TOOL_RESPONSE_CLOSE "</tool_response>"

struct chat_options chat_options_default(void)
{
    struct chat_options o = {.add_generation_prompt = true, .enable_thinking = true};
    return o;
}

/* ---- Python string helpers on a (pointer, length) view */

struct view {
    const char *p;
    size_t n;
};

static struct view view_of(const char *s)
{
    return (struct view){s, strlen(s)};
}

static struct view lstrip_nl(struct view v)
{
    while (v.n && v.p[0] == '\n') {
        v.p++;
        v.n--;
    }
    return v;
}

static struct view rstrip_nl(struct view v)
{
    while (v.n && v.p[v.n - 1] == '\n')
        v.n--;
    return v;
}

static struct view strip_nl(struct view v)
{
    return rstrip_nl(lstrip_nl(v));
}

/* First occurrence of needle in v (memmem), or NULL. */
static const char *find_first(struct view v, const char *needle)
{
    return memmem(v.p, v.n, needle, strlen(needle));
}

/* Last occurrence of needle in v, or NULL. Occurrences found by Python's split() never overlap, but
 * "</think>" and "<think>" cannot overlap themselves, so the last match is the last split point. */
static const char *find_last(struct view v, const char *needle)
{
    size_t k = strlen(needle);
    if (k > v.n)
        return NULL;
    for (size_t i = v.n - k + 1; i-- > 0;)
        if (!memcmp(v.p + i, needle, k))
            return v.p + i;
    return NULL;
}

static bool starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* ---- validation shared by chat_render and chat_messages_from_json */

static int check_role(const char *role, size_t i, char *err, size_t errlen)
{
    if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant"))
        return 0;
    return errfmt(err, errlen,
                  "messages[%zu].role: '%.64s' is not supported (only system, user and assistant)", i, role);
}

static int check_messages(const struct chat_message *msgs, size_t n, char *err, size_t errlen)
{
    if (n == 0 || !msgs)
        return errfmt(err, errlen, "messages: the list is empty");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role)
            return errfmt(err, errlen, "messages[%zu].role: missing", i);
        if (check_role(msgs[i].role, i, err, errlen))
            return -1;
        if (!msgs[i].content)
            return errfmt(err, errlen, "messages[%zu].content: missing", i);
    }
    return 0;
}

/* The template's multi_step_tool scan: the index of the last user message that is not a tool
 * response wrapped in <tool_response>...</tool_response>; n - 1 when there is none. */
static size_t last_query_index(const struct chat_message *msgs, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        const char *c = msgs[i].content;
        if (!strcmp(msgs[i].role, "user") &&
            !(starts_with(c, TOOL_RESPONSE_OPEN) && ends_with(c, TOOL_RESPONSE_CLOSE)))
            return i;
    }
    return n - 1;
}

/* One assistant turn, from '<|im_start|>assistant\n' to '<|im_end|>\n'. */
static void render_assistant(struct buf *b, const struct chat_message *m, bool after_last_query, bool last)
{
    struct view content = view_of(m->content);
    struct view reasoning = {"", 0};
    if (m->reasoning_content) {
        reasoning = view_of(m->reasoning_content);
    } else {
        const char *first_close = find_first(content, THINK_CLOSE);
        if (first_close) {
            /* reasoning: split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
            struct view before = rstrip_nl((struct view){content.p, (size_t)(first_close - content.p)});
            const char *open = find_last(before, THINK_OPEN);
            if (open) {
                const char *start = open + strlen(THINK_OPEN);
                before = (struct view){start, before.n - (size_t)(start - before.p)};
            }
            reasoning = lstrip_nl(before);
            /* content: split('</think>')[-1].lstrip('\n') */
            const char *last_close = find_last(content, THINK_CLOSE);
            const char *after = last_close + strlen(THINK_CLOSE);
            content = lstrip_nl((struct view){after, content.n - (size_t)(after - content.p)});
        }
    }
    buf_puts(b, "<|im_start|>assistant\n");
    if (after_last_query && (last || reasoning.n > 0)) {
        struct view r = strip_nl(reasoning);
        struct view c = lstrip_nl(content);
        buf_puts(b, "<think>\n");
        buf_append(b, r.p, r.n);
        buf_puts(b, "\n</think>\n\n");
        buf_append(b, c.p, c.n);
    } else {
        buf_append(b, content.p, content.n);
    }
    buf_puts(b, "<|im_end|>\n");
}

int chat_render(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out,
                char *err, size_t errlen)
{
    *out = NULL;
    if (check_messages(msgs, n, err, errlen))
        return -1;
    struct chat_options o = opt ? *opt : chat_options_default();
    struct buf b = {0};
    size_t lqi = last_query_index(msgs, n);

    for (size_t i = 0; i < n; i++) {
        const struct chat_message *m = &msgs[i];
        if (!strcmp(m->role, "assistant")) {
            render_assistant(&b, m, i > lqi, i == n - 1);
        } else {
            /* user, or system: the first message's system turn renders the same way here as the
             * template's header block does, and a later system message renders like a user turn. */
            buf_puts(&b, "<|im_start|>");
            buf_puts(&b, m->role);
            buf_puts(&b, "\n");
            buf_puts(&b, m->content);
            buf_puts(&b, "<|im_end|>\n");
        }
    }
    if (o.add_generation_prompt) {
        buf_puts(&b, "<|im_start|>assistant\n");
        if (!o.enable_thinking)
            buf_puts(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        buf_free(&b);
        return errfmt(err, errlen, "chat template: out of memory");
    }
    *out = b.p;
    return 0;
}

/* ---- messages from JSON */

/* A string member's value into *s (borrowed). null_ok: JSON null gives NULL. */
static int json_str_field(json_t *v, size_t i, const char *key, bool null_ok, const char **s, char *err,
                          size_t errlen)
{
    if (null_ok && json_is_null(v)) {
        *s = NULL;
        return 0;
    }
    if (!json_is_string(v))
        return errfmt(err, errlen, "messages[%zu].%s: expected a string%s", i, key,
                      null_ok ? " or null" : "");
    if (strlen(json_string_value(v)) != json_string_length(v))
        return errfmt(err, errlen, "messages[%zu].%s: contains a NUL character", i, key);
    *s = json_string_value(v);
    return 0;
}

static int message_from_json(json_t *obj, size_t i, struct chat_message *m, char *err, size_t errlen)
{
    if (!json_is_object(obj))
        return errfmt(err, errlen, "messages[%zu]: expected an object", i);
    *m = (struct chat_message){0};
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        if (!strcmp(key, "role")) {
            if (json_str_field(v, i, key, false, &m->role, err, errlen))
                return -1;
        } else if (!strcmp(key, "content")) {
            if (json_str_field(v, i, key, false, &m->content, err, errlen))
                return -1;
        } else if (!strcmp(key, "reasoning_content")) {
            if (json_str_field(v, i, key, true, &m->reasoning_content, err, errlen))
                return -1;
        } else if (!strcmp(key, "name")) {
            const char *ignored;
            if (json_str_field(v, i, key, false, &ignored, err, errlen))
                return -1;
        } else if (!strcmp(key, "tool_calls")) {
            /* null and [] render exactly like an absent key in the template; anything else is a call */
            if (!json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
                return errfmt(err, errlen, "messages[%zu].tool_calls: tool calls are not supported", i);
        } else {
            return errfmt(err, errlen, "messages[%zu].%.64s: unknown key", i, key);
        }
    }
    if (!m->role)
        return errfmt(err, errlen, "messages[%zu].role: missing", i);
    if (check_role(m->role, i, err, errlen))
        return -1;
    if (!m->content)
        return errfmt(err, errlen, "messages[%zu].content: missing", i);
    return 0;
}

int chat_messages_from_json(const struct json_t *messages, struct chat_message **msgs, size_t *n, char *err,
                            size_t errlen)
{
    *msgs = NULL;
    *n = 0;
    json_t *arr = (json_t *)messages; /* jansson's accessors take non-const pointers; nothing is changed */
    if (!json_is_array(arr))
        return errfmt(err, errlen, "messages: expected an array");
    size_t count = json_array_size(arr);
    if (count == 0)
        return errfmt(err, errlen, "messages: the list is empty");
    struct chat_message *out = calloc(count, sizeof *out);
    if (!out)
        return errfmt(err, errlen, "messages: out of memory");
    for (size_t i = 0; i < count; i++)
        if (message_from_json(json_array_get(arr, i), i, &out[i], err, errlen)) {
            free(out);
            return -1;
        }
    *msgs = out;
    *n = count;
    return 0;
}
