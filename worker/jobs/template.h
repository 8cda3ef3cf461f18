/* Prompt templates: the config's `templates: {summarize: "Summarize:\n\n{document}"}`, which a
 * job names with "template" and fills from its "vars".
 *
 * Syntax (as Python's str.format with plain names only):
 *   {name}   replaced by vars.name; a name is 1 to TMPL_MAX_NAME letters, digits, '_', '-', '.'
 *   {{  }}   a literal '{' / '}'
 * Anything else with a brace is a syntax error: a lone '}', a '{' without its '}', or a
 * placeholder whose name is empty or has other characters ("{a b}", "{"x": 1}": double the braces
 * of literal JSON). The config loader checks every template with tmpl_check, so a bad template
 * fails at start-up, not on each job.
 *
 * Values: a string as it is; an integer as its decimal digits; a real as the shortest text that
 * reads back as the same double (Python's repr: 0.1, 1e+20). Any other JSON type is refused. Vars
 * the template does not use are ignored.
 *
 * Usage (worker/jobs/job.c):
 *
 *     char *text = NULL, var[TMPL_MAX_NAME + 1], err[256];
 *     int rc = tmpl_render(template_text, vars, &text, var, err, sizeof err);
 *     if (rc == TMPL_ERR_MISSING) ... "needs '<var>'"; if (rc == TMPL_ERR_TYPE) ... vars.<var> is bad
 *     ... free(text);
 *
 * Pure functions, thread-safe. */
#pragma once
#include <stddef.h>

struct json_t; /* jansson */

#define TMPL_MAX_NAME 64

enum tmpl_error {
    TMPL_OK = 0,
    TMPL_ERR_SYNTAX = -1,  /* the template itself is malformed; err says where */
    TMPL_ERR_MISSING = -2, /* a placeholder has no value in vars; its name in var */
    TMPL_ERR_TYPE = -3,    /* vars.<var> is not a string or a number; its name in var */
    TMPL_ERR_NOMEM = -4,
};

/* Checks text's syntax. Returns TMPL_OK, or TMPL_ERR_SYNTAX with a message such as
 * "unmatched '{' at byte 5 (write {{ for a literal brace)" in err. */
int tmpl_check(const char *text, char *err, size_t errlen);

/* Renders text with vars (a JSON object, or NULL for none) into *out (malloc'd, NUL-terminated,
 * owned by the caller; NULL on failure). Checks the syntax first, so nothing is rendered from a
 * malformed template. On TMPL_ERR_MISSING / TMPL_ERR_TYPE the placeholder's name is written into
 * var (TMPL_MAX_NAME + 1 bytes; may be NULL); err gets a message either way. */
int tmpl_render(const char *text, const struct json_t *vars, char **out, char var[TMPL_MAX_NAME + 1],
                char *err, size_t errlen);
