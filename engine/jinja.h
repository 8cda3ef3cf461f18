/* A Jinja2 interpreter for chat templates: the subset that real Hugging Face chat templates use,
 * rendered as transformers' apply_chat_template does (jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True, the loopcontrols extension, HF's tojson, raise_exception
 * and strftime_now). A parsed template is immutable: jinja_render may run from several threads at
 * once on one template.
 *
 * Anything the interpreter does not support (a filter, a test, a statement, a method) is refused
 * by jinja_parse with the template's line: never a silently different output. Errors that only show
 * when rendering (an undefined attribute used in arithmetic, a type error, raise_exception) fail
 * jinja_render with a message. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct json_t; /* jansson */
struct jinja_template;

/* Limits and the clock for one render. Zero fields take the defaults. */
struct jinja_options {
    uint64_t max_steps; /* evaluation steps (nodes visited); default 10,000,000 */
    size_t max_output;  /* bytes of output; default 64 MiB */
    time_t now;         /* what strftime_now formats (local time of this instant); 0: time(NULL) */
};

/* Parses a template. `name` labels errors ("chat_template", a file path). Returns the template (free
 * with jinja_free) or NULL with a message in err naming the line and the construct, e.g.
 * "chat_template line 12: unsupported filter 'wordcount'". */
struct jinja_template *jinja_parse(const char *src, size_t len, const char *name, char *err, size_t errlen);

/* NULL is harmless. */
void jinja_free(struct jinja_template *t);

enum { JINJA_OK = 0, JINJA_ERROR = -1, JINJA_RAISED = -2 };

/* Renders t with the variables of `vars` (a JSON object: name -> value; borrowed, not modified).
 * JSON objects behave as Python dicts with their keys in the object's order, arrays as lists,
 * integers as int, reals as float, null as None. opt may be NULL for the defaults.
 * On JINJA_OK *out is a new NUL-terminated string of *out_len bytes (caller frees with free()).
 * JINJA_RAISED: the template called raise_exception(msg); err holds msg exactly.
 * JINJA_ERROR: a render error or a limit, err says which and the template's line.
 * On an error *out is NULL. */
int jinja_render(const struct jinja_template *t, const struct json_t *vars, const struct jinja_options *opt,
                 char **out, size_t *out_len, char *err, size_t errlen);
