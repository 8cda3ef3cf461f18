/* The ChatML chat template (Qwen2/2.5/3 family), rendered natively in C.
 *
 * Output is byte-identical to transformers' apply_chat_template with the official Qwen3 template
 * for what it supports: system/user/assistant messages, add_generation_prompt, enable_thinking
 * (default true; false appends "<think>\n\n</think>\n\n" after the generation prompt), and the
 * Qwen3 rule for assistant turns: reasoning (reasoning_content, or a <think>...</think> block in the
 * content) is kept only for assistant turns after the last user query, stripped from earlier ones.
 * Tool calls, tool messages and other roles are rejected with a clear error. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct json_t; /* jansson */

struct chat_message {
    const char *role;              /* "system" | "user" | "assistant" (borrowed) */
    const char *content;           /* UTF-8, may be "" (borrowed) */
    const char *reasoning_content; /* NULL when absent (borrowed) */
};

struct chat_options {
    bool add_generation_prompt; /* append "<|im_start|>assistant\n" (default true) */
    bool enable_thinking;       /* default true; false appends the empty think block */
};

/* Defaults: add_generation_prompt = true, enable_thinking = true. */
struct chat_options chat_options_default(void);

/* Renders the messages into a new NUL-terminated string *out (caller frees with free()); opt may be
 * NULL for chat_options_default().
 * Returns 0, or -1 with a message in err (e.g. "messages[2].role: 'tool' is not supported"). */
int chat_render(const struct chat_message *msgs, size_t n, const struct chat_options *opt, char **out,
                char *err, size_t errlen);

/* Reads a JSON array of {"role", "content", "reasoning_content"?} objects into *msgs (an array the
 * caller frees with free(); its strings borrow from `messages`, which must outlive it). Unknown
 * message keys other than "name", wrong types, a missing role or content, and tool calls are errors
 * naming the index: "messages[1].content: expected a string". "reasoning_content": null is the same
 * as absent; "tool_calls": null or [] is accepted (the template renders them like an absent key).
 * Returns 0 or -1 with err. */
int chat_messages_from_json(const struct json_t *messages, struct chat_message **msgs, size_t *n, char *err,
                            size_t errlen);
