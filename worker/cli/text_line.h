/* The common input line of `llmq tokenize`, {"text": "..."}, read straight from its bytes without
 * building a JSON tree. It takes only lines that jansson reads the same way (one key "text" spelled
 * plainly, a string of valid UTF-8 and JSON escapes, whitespace around); anything else is left to
 * jansson, which gives the same text or the error. */
#pragma once
#include <stddef.h>

#include "engine/util/buf.h"

/* line[0..len) of the form {"text": "..."}: 1 with the string's bytes (escapes undone) in *text,
 * which is emptied first; 0 when the line is anything else; -1 when out of memory. */
int text_line_read(const char *line, size_t len, struct buf *text);
