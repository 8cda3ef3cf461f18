/* See array.h. */
#include "engine/util/array.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t array_grown_cap(size_t cap, size_t need, size_t min_cap)
{
    if (need <= cap)
        return cap;
    size_t c = cap ? cap : min_cap ? min_cap : 1;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return SIZE_MAX;
        c *= 2;
    }
    return c;
}

int array_resize(void *arrp, size_t n, size_t elem)
{
    if (elem && n > SIZE_MAX / elem)
        return -1;
    void *old;
    memcpy(&old, arrp, sizeof old); /* arrp is a T **: read and write the T * through its bytes */
    size_t bytes = n * elem;
    void *p = realloc(old, bytes ? bytes : 1); /* never 0: realloc(p, 0) may free p */
    if (!p)
        return -1;
    memcpy(arrp, &p, sizeof p);
    return 0;
}

int array_reserve(void *arrp, size_t *cap, size_t need, size_t elem, size_t min_cap)
{
    if (need <= *cap)
        return 0;
    size_t c = array_grown_cap(*cap, need, min_cap);
    if (array_resize(arrp, c, elem))
        return -1;
    *cap = c;
    return 0;
}
