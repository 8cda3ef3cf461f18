/* A model's chat template: found in its tokenizer folder (or given as a file), parsed once with the
 * Jinja interpreter (engine/jinja.h), and rendered with the variables that transformers'
 * apply_chat_template passes. docs/CHAT_TEMPLATES.md is the user's reference.
 *
 * Where the template comes from, first match wins:
 *   1. an override file (the config's model.chat_template, a command's --chat-template FILE);
 *   2. chat_template.jinja beside tokenizer_config.json (transformers lets it replace the config's);
 *   3. "chat_template" in tokenizer_config.json: a string, or a list of {"name", "template"} of which
 *      "default" is used, and "tool_use" when the job passes tools and the list has it.
 * A folder with none of these loads as a chat template that is absent: chat_template_render then
 * refuses every conversation with CHAT_NONE and a message saying so (prompts need no template).
 *
 * Rendering passes messages, tools, documents, add_generation_prompt, the special tokens of
 * tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, sep_token, cls_token,
 * mask_token, additional_special_tokens; an AddedToken object counts as its "content"), and every
 * key of the caller's kwargs (which may replace a special token but not the four names before).
 *
 * A loaded chat template is immutable; renders may run from several threads at once. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct json_t; /* jansson */
struct chat_template;

/* Loads the chat template of the tokenizer folder `dir` (tokenizer_config.json, chat_template.jinja),
 * or of `override_file` when that is non-NULL and non-empty. Returns the template, or NULL with a
 * message in err when a file cannot be read or a template does not parse (the interpreter's message
 * names the template and the line, e.g. "chat_template line 12: unsupported filter 'wordcount'"). */
struct chat_template *chat_template_load(const char *dir, const char *override_file, char *err,
                                         size_t errlen);

/* NULL is harmless. */
void chat_template_free(struct chat_template *ct);

/* Whether the model has a template at all (false: messages are refused, prompts still run). */
bool chat_template_present(const struct chat_template *ct);

/* Where the template came from, for logs: "tokenizer_config.json", "chat_template.jinja", the
 * override file's path, or "none". */
const char *chat_template_origin(const struct chat_template *ct);

/* What one render gets. The JSON values are borrowed. */
struct chat_input {
    const struct json_t *messages;  /* the conversation: a JSON array of message objects */
    const struct json_t *tools;     /* a JSON array, or NULL for none (the template sees None) */
    const struct json_t *documents; /* a JSON array, or NULL for none (the template sees None) */
    const struct json_t *kwargs;    /* a JSON object of more variables (chat_template_kwargs), or NULL */
    bool add_generation_prompt;
    /* false (the worker's way, as vLLM's): a message's list of text parts reaches a template that
     * never loops over message content as one string, the parts' texts joined with "\n"; a template
     * that loops over content gets the list. true: lists are passed as given, as transformers does. */
    bool parts_as_given;
};

enum {
    CHAT_OK = 0,
    CHAT_ERROR = -1,  /* a render error or a limit of the interpreter (err says which, with the line) */
    CHAT_RAISED = -2, /* the template called raise_exception(msg): err holds msg exactly */
    CHAT_NONE = -3,   /* the model has no chat template */
};

/* Renders the conversation with the template (the list form: "tool_use" when in->tools is given and
 * the list has it, else "default"). On CHAT_OK *out is a new NUL-terminated string of *out_len bytes
 * (free with free()); otherwise *out is NULL and err says why. */
int chat_template_render(const struct chat_template *ct, const struct chat_input *in, char **out,
                         size_t *out_len, char *err, size_t errlen);
