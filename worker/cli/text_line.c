/* See text_line.h. */
#include "worker/cli/text_line.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <utf8proc.h>

static size_t skip_ws(const char *s, size_t i, size_t len)
{
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* The length of the valid UTF-8 sequence at s[0..n) (no overlong forms, no surrogates, nothing
 * over U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        k = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        k = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (n < k || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return k;
}

/* Four hex digits at s: their value, or -1. */
static long hex4(const char *s)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

int text_line_read(const char *line, size_t len, struct buf *text)
{
    static const char head[] = "\"text\"";
    text->len = 0;
    if (text->p)
        text->p[0] = 0;
    size_t i = skip_ws(line, 0, len);
    if (i >= len || line[i] != '{')
        return 0;
    i = skip_ws(line, i + 1, len);
    if (len - i < sizeof head - 1 || memcmp(line + i, head, sizeof head - 1))
        return 0;
    i = skip_ws(line, i + sizeof head - 1, len);
    if (i >= len || line[i] != ':')
        return 0;
    i = skip_ws(line, i + 1, len);
    if (i >= len || line[i] != '"')
        return 0;
    i++;
    if (buf_reserve(text, len - i))
        return -1;
    for (;;) {
        size_t run = i; /* plain ASCII up to the next quote, backslash, control or non-ASCII byte */
        while (run < len && (unsigned char)line[run] >= 0x20 && (unsigned char)line[run] < 0x80 &&
               line[run] != '"' && line[run] != '\\')
            run++;
        buf_append(text, line + i, run - i);
        i = run;
        if (i >= len)
            return 0;
        unsigned char c = (unsigned char)line[i];
        if (c == '"')
            break;
        if (c < 0x20)
            return 0;
        if (c >= 0x80) {
            size_t k = utf8_len((const unsigned char *)line + i, len - i);
            if (!k)
                return 0;
            buf_append(text, line + i, k);
            i += k;
            continue;
        }
        /* a backslash */
        if (i + 1 >= len)
            return 0;
        char e = line[i + 1], ch;
        switch (e) {
        case '"':
            ch = '"';
            break;
        case '\\':
            ch = '\\';
            break;
        case '/':
            ch = '/';
            break;
        case 'b':
            ch = '\b';
            break;
        case 'f':
            ch = '\f';
            break;
        case 'n':
            ch = '\n';
            break;
        case 'r':
            ch = '\r';
            break;
        case 't':
            ch = '\t';
            break;
        case 'u': {
            long v = len - i >= 6 ? hex4(line + i + 2) : -1;
            if (v < 0 || (v >= 0xDC00 && v <= 0xDFFF))
                return 0;
            i += 6;
            if (v >= 0xD800 && v <= 0xDBFF) { /* a high surrogate: its low half must follow */
                long lo = len - i >= 6 && line[i] == '\\' && line[i + 1] == 'u' ? hex4(line + i + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return 0;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            utf8proc_uint8_t u[4];
            buf_append(text, u, (size_t)utf8proc_encode_char((utf8proc_int32_t)v, u));
            continue;
        }
        default:
            return 0;
        }
        buf_append(text, &ch, 1);
        i += 2;
    }
    i = skip_ws(line, i + 1, len);
    if (i >= len || line[i] != '}')
        return 0;
    if (skip_ws(line, i + 1, len) != len)
        return 0;
    return text->oom ? -1 : 1;
}
