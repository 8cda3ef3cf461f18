/* Stop strings: matched on the detokenized output text, across token boundaries.
 *
 * OpenAI/vLLM semantics: the output ends right before the first stop string found, which is not
 * included. The engine calls stop_find after each piece of new text with the text length before
 * it, so every match is found in the step that completes it; while the sequence runs it shows
 * only stop_visible_len bytes, so a reader never sees text that a later match would cut. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct stop_matcher {
    char **stops; /* [n] owned copies */
    size_t *lens; /* [n] */
    int n;
    size_t max_len; /* longest stop string; 0 when n == 0 */
};

/* Copies n stop strings (NULL allowed when n == 0). Returns 0, or -1 with err for a NULL or empty
 * string or out of memory (m is then empty). */
int stop_init(struct stop_matcher *m, const char *const *stops, int n, char *err, size_t errlen);
/* Frees the copies; m is empty afterwards. Harmless on an empty or zeroed matcher. */
void stop_free(struct stop_matcher *m);

/* The earliest start of a stop string in text[0, len) among the occurrences that end after
 * old_len (those that involve text added since the last call), or -1 when there is none. */
long stop_find(const struct stop_matcher *m, const char *text, size_t len, size_t old_len);

/* How much of text[0, len) can be shown while more text may come: len minus the longest suffix
 * that is a proper prefix of some stop string (such a suffix may still become a match). */
size_t stop_visible_len(const struct stop_matcher *m, const char *text, size_t len);
