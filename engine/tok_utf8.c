/* UTF-8 validation, lossy decoding and character classes; see tok_utf8.h. */
#include "engine/tok_utf8.h"

#include <string.h>
#include <utf8proc.h>

/* Length of the sequence that a lead byte starts, and the allowed range of its second byte
 * (Unicode Table 3-7, "Well-Formed UTF-8 Byte Sequences"); 0 for a byte that cannot start one. */
static int lead_info(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b == 0xE0) {
        *lo = 0xA0;
        return 3;
    }
    if (b >= 0xE1 && b <= 0xEC)
        return 3;
    if (b == 0xED) {
        *hi = 0x9F;
        return 3;
    }
    if (b == 0xEE || b == 0xEF)
        return 3;
    if (b == 0xF0) {
        *lo = 0x90;
        return 4;
    }
    if (b >= 0xF1 && b <= 0xF3)
        return 4;
    if (b == 0xF4) {
        *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* How many bytes from s[0] form a well-formed prefix of one character (at most `need`, the
 * sequence length); stops at the end of input. */
static int good_bytes(const unsigned char *s, size_t avail, int need, unsigned char lo, unsigned char hi)
{
    int k = 1;
    while (k < need && (size_t)k < avail) {
        unsigned char c = s[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h)
            break;
        k++;
    }
    return k;
}

size_t tok_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, eight bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        unsigned char lo, hi;
        int need = lead_info(s[i], &lo, &hi);
        if (need == 0 || good_bytes(s + i, len - i, need, lo, hi) != need)
            return i;
        i += (size_t)need;
    }
    return len;
}

int tok_utf8_next(const char *str, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] < 0xE0) {
        *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] < 0xF0) {
        *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
    return 4;
}

int tok_utf8_prev(const char *s, size_t end, uint32_t *cp)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && end - i < 4)
        i--;
    tok_utf8_next(s + i, cp);
    return (int)(end - i);
}

size_t tok_utf8_lossy(const char *in, size_t len, bool final, char *out, size_t *consumed)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, o = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        unsigned char lo, hi;
        int need = lead_info(s[i], &lo, &hi);
        int good = need ? good_bytes(s + i, len - i, need, lo, hi) : 1;
        if (good == need) {
            memcpy(out + o, s + i, (size_t)need);
            o += (size_t)need;
            i += (size_t)need;
            continue;
        }
        /* a well-formed but truncated prefix at the very end may still be completed */
        if (!final && need && i + (size_t)good == len)
            break;
        memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD for the maximal ill-formed subpart */
        o += 3;
        i += (size_t)good;
    }
    if (consumed)
        *consumed = i;
    return o;
}

bool tok_unicode_is_space(uint32_t c)
{
    if (c <= 0x20)
        return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85)
        return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool tok_unicode_is_word(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D)
        return true;
    /* Other_Alphabetic symbols: circled and squared Latin letters */
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
        (c >= 0x1F170 && c <= 0x1F189))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}
