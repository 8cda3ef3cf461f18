/* Compiling a list of choices into a grammar (engine/grammar.h, gr_compile_choice): the output is the
 * raw text of one choice, byte for byte. */
#include <stdio.h>
#include <string.h>

#include "engine/grammar_int.h"

struct grammar *gr_compile_choice(const char *const *choices, size_t n, const struct gr_vocab *v, char *err,
                                  size_t errlen)
{
    if (!choices || n == 0) {
        snprintf(err, errlen, "choice: expected at least one choice");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!choices[i] || !choices[i][0]) {
            snprintf(err, errlen, "choice: choice %zu is empty", i);
            return NULL;
        }
    struct gr_builder b;
    grb_init(&b);
    int32_t root = grb_rule(&b, "choice");
    struct gr_seq s = {0};
    for (size_t i = 0; i < n; i++) {
        grs_lit(&b, &s, choices[i], strlen(choices[i]));
        grb_alt(&b, root, &s);
    }
    grs_free(&s);
    return gr_finish(&b, root, v, err, errlen);
}
