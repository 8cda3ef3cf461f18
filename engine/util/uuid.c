/* See uuid.h. */
#include "engine/util/uuid.h"

#include <stdint.h>
#include <sys/random.h>
#include <time.h>

void uuid7(char out[UUID_TEXT_LEN + 1])
{
    unsigned char b[16];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    if (getrandom(b + 6, 10, 0) != 10) { /* never on Linux >= 3.17 for 10 bytes; fall back anyway */
        uint64_t x = ms ^ (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)out;
        for (int i = 6; i < 16; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (unsigned char)x;
        }
    }
    for (int i = 0; i < 6; i++)
        b[i] = (unsigned char)(ms >> (40 - 8 * i));
    b[6] = (unsigned char)(0x70 | (b[6] & 0x0f)); /* version 7 */
    b[8] = (unsigned char)(0x80 | (b[8] & 0x3f)); /* variant 10 */
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hex[b[i] >> 4];
        *p++ = hex[b[i] & 15];
    }
    *p = 0;
}
