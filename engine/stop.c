/* Stop strings (see stop.h). Stop strings are short and few, so plain memmem per string is the
 * whole algorithm; each call only looks at the new text plus max_len - 1 bytes before it. */
#include "engine/stop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stop_init(struct stop_matcher *m, const char *const *stops, int n, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (n < 0) {
        snprintf(err, errlen, "stop: %d strings", n);
        return -1;
    }
    if (n == 0)
        return 0;
    for (int i = 0; i < n; i++)
        if (!stops || !stops[i] || !stops[i][0]) {
            snprintf(err, errlen, "stop[%d] is empty", i);
            return -1;
        }
    m->stops = calloc((size_t)n, sizeof *m->stops);
    m->lens = calloc((size_t)n, sizeof *m->lens);
    if (!m->stops || !m->lens)
        goto oom;
    for (int i = 0; i < n; i++) {
        m->lens[i] = strlen(stops[i]);
        if (!(m->stops[i] = strdup(stops[i])))
            goto oom;
        m->n = i + 1;
        if (m->lens[i] > m->max_len)
            m->max_len = m->lens[i];
    }
    return 0;
oom:
    m->n = n; /* stop_free skips the NULL entries */
    stop_free(m);
    snprintf(err, errlen, "stop: out of memory");
    return -1;
}

void stop_free(struct stop_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; m->stops && i < m->n; i++)
        free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    memset(m, 0, sizeof *m);
}

long stop_find(const struct stop_matcher *m, const char *text, size_t len, size_t old_len)
{
    long best = -1;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->lens[i];
        if (L > len)
            continue;
        /* an occurrence ending after old_len starts at or after old_len - (L - 1) */
        size_t from = old_len >= L ? old_len - L + 1 : 0;
        if (best >= 0 && from >= (size_t)best)
            continue;
        const char *hit = memmem(text + from, len - from, m->stops[i], L);
        if (hit && (best < 0 || hit - text < best))
            best = hit - text;
    }
    return best;
}

size_t stop_visible_len(const struct stop_matcher *m, const char *text, size_t len)
{
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->lens[i];
        for (size_t k = L - 1 < len ? L - 1 : len; k > hold; k--)
            if (!memcmp(text + len - k, m->stops[i], k)) {
                hold = k;
                break;
            }
    }
    return len - hold;
}
