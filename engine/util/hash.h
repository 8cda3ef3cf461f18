/* 64-bit FNV-1a over bytes: a fast, non-cryptographic hash for fingerprints, hash tables and digests.
 *
 *     uint64_t h = fnv1a(FNV1A_INIT, buf, len);      // one buffer
 *     h = fnv1a(h, more, more_len);                 // continued over the next bytes
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define FNV1A_INIT 0xcbf29ce484222325ull /* the offset basis */

/* h continued over n bytes at p (FNV1A_INIT to start). */
static inline uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The same over a NUL-terminated string (NULL: h unchanged). */
static inline uint64_t fnv1a_str(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}
