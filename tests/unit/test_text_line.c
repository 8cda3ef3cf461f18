/* worker/cli/text_line.c against jansson: for hand-picked lines (escapes, surrogate pairs, lone
 * surrogates, invalid and overlong UTF-8, raw control bytes, whitespace, other keys, trailing
 * bytes) and 20,000 random ones built from those pieces, a line it takes gives the same bytes as
 * jansson's json_loadb(JSON_ALLOW_NUL) "text" string, and every line jansson reads as exactly
 * {"text": <string>} with the key spelled plainly is taken. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "worker/cli/text_line.h"

static int n_taken, n_left;

/* Checks one line against jansson. */
static void check(const char *line, size_t len)
{
    struct buf text = {0};
    int rc = text_line_read(line, len, &text);
    json_t *j = json_loadb(line, len, JSON_ALLOW_NUL, NULL);
    const json_t *t = json_is_object(j) && json_object_size(j) == 1 ? json_object_get(j, "text") : NULL;
    /* the key written plainly, once: jansson also reads "te\u0078t", and a repeated key, which are
     * left to it */
    const char *k = memchr(line, '"', len);
    bool plain_key = k && (size_t)(line + len - k) >= 6 && !memcmp(k, "\"text\"", 6) &&
                     !memmem(k + 6, (size_t)(line + len - k - 6), "\"text\"", 6);
    if (rc == 1) {
        n_taken++;
        if (!json_is_string(t)) {
            fprintf(stderr, "taken but jansson says otherwise: %.*s\n", (int)len, line);
            fail();
        }
        assert_int_equal(text.len, json_string_length(t));
        assert_memory_equal(text.len ? text.p : "", json_string_value(t), text.len);
    } else {
        n_left++;
        assert_int_equal(rc, 0);
        if (json_is_string(t) && plain_key) {
            fprintf(stderr, "left to jansson though plain: %.*s\n", (int)len, line);
            fail();
        }
    }
    json_decref(j);
    buf_free(&text);
}

static void check_str(const char *s)
{
    check(s, strlen(s));
}

static void test_cases(void **state)
{
    (void)state;
    static const char *const lines[] = {
        "{\"text\": \"Hello\"}",
        "{\"text\":\"\"}",
        "  {  \"text\"\t:\r\n \"a b\"  }  \r",
        "{\"text\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}",
        "{\"text\": \"\\u00e9\\u4E2D\\u0000x\"}",
        "{\"text\": \"\\ud83d\\ude80\"}",
        "{\"text\": \"\\ud83d\"}",
        "{\"text\": \"\\ud83d\\u0041\"}",
        "{\"text\": \"\\ude80\"}",
        "{\"text\": \"\\u12\"}",
        "{\"text\": \"\\u12g4\"}",
        "{\"text\": \"\\x\"}",
        "{\"text\": \"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x9a\x80\"}",
        "{\"text\": \"\xff\"}",
        "{\"text\": \"\xc0\xaf\"}",
        "{\"text\": \"\xe0\x80\xaf\"}",
        "{\"text\": \"\xed\xa0\x80\"}",
        "{\"text\": \"\xf4\x90\x80\x80\"}",
        "{\"text\": \"\xe4\xb8\"}",
        "{\"text\": \"a\x01\"}",
        "{\"text\": \"a\x7f\"}",
        "{\"text\": \"a\"} x",
        "{\"text\": \"a\",}",
        "{\"text\": \"a\", \"text\": \"b\"}",
        "{\"text\": 5}",
        "{\"texts\": \"a\"}",
        "{\"te\\u0078t\": \"a\"}",
        "{\"text\" \"a\"}",
        "{\"text\": \"a\"",
        "{\"text\": \"a",
        "[\"text\"]",
        "",
        "{}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        check_str(lines[i]);
    check("{\"text\": \"a\0b\"}", 15); /* a raw NUL */
}

static void test_random(void **state)
{
    (void)state;
    static const char *const pieces[] = {"a",
                                         " ",
                                         "\\\"",
                                         "\\\\",
                                         "\\/",
                                         "\\n",
                                         "\\t",
                                         "\\u0041",
                                         "\\u00E9",
                                         "\\ud800",
                                         "\\udc00",
                                         "\\uDBFF\\uDFFF",
                                         "\\u",
                                         "\\q",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xc3",
                                         "\x80",
                                         "\xf5\x80\x80\x80",
                                         "\t",
                                         "\x1f",
                                         "\"",
                                         "}",
                                         "\\u0000",
                                         "\xef\xbf\xbf",
                                         "\xed\x9f\xbf",
                                         "\xee\x80\x80"};
    static const char *const heads[] = {"{\"text\": \"", "{\"text\":\"", " {\"text\" : \"", "{\"txt\": \""};
    static const char *const tails[] = {"\"}", "\"} ", "\" }\r", "\"", "\"}}", "\"}\t"};
    srand(57);
    char line[512];
    for (int n = 0; n < 20000; n++) {
        size_t len = 0;
        const char *h = heads[rand() % 4];
        memcpy(line + len, h, strlen(h)), len += strlen(h);
        int k = rand() % 12;
        for (int i = 0; i < k; i++) {
            const char *p = pieces[rand() % (int)(sizeof pieces / sizeof *pieces)];
            memcpy(line + len, p, strlen(p)), len += strlen(p);
        }
        const char *t = tails[rand() % 6];
        memcpy(line + len, t, strlen(t)), len += strlen(t);
        check(line, len);
    }
    assert_true(n_taken > 1000 && n_left > 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
