/* engine/stop: stop strings across token boundaries, the text shown while running, multi-byte
 * UTF-8, overlapping stops, a stop at the very start; then random streams against a brute-force
 * reference (strstr over each prefix of the text as it grows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stop.h"

/* Feeds pieces to a matcher as the engine does. Returns the final text in out (cut before the
 * match, or everything), and checks that every text shown while running is a prefix of it. */
static bool run_stream(const char *const *stops, int n_stops, const char *const *pieces, int n_pieces,
                       char *out, size_t outlen)
{
    struct stop_matcher m;
    char err[128];
    assert_int_equal(stop_init(&m, stops, n_stops, err, sizeof err), 0);
    char text[4096] = "", shown[64][4096];
    size_t len = 0;
    int n_shown = 0;
    bool stopped = false;
    for (int i = 0; i < n_pieces && !stopped; i++) {
        size_t old = len;
        size_t pl = strlen(pieces[i]);
        assert_true(len + pl < sizeof text);
        memcpy(text + len, pieces[i], pl);
        len += pl;
        text[len] = 0;
        long at = stop_find(&m, text, len, old);
        if (at >= 0) {
            len = (size_t)at;
            text[len] = 0;
            stopped = true;
            break;
        }
        size_t vis = stop_visible_len(&m, text, len);
        assert_true(vis <= len);
        assert_true(vis + (m.max_len ? m.max_len - 1 : 0) >= len); /* holds back no more than it must */
        if (n_shown < 64) {
            memcpy(shown[n_shown], text, vis);
            shown[n_shown++][vis] = 0;
        }
    }
    snprintf(out, outlen, "%s", text);
    for (int i = 0; i < n_shown; i++)
        if (strncmp(shown[i], out, strlen(shown[i]))) {
            print_error("showed \"%s\" while running, but the final text is \"%s\"\n", shown[i], out);
            fail();
        }
    stop_free(&m);
    return stopped;
}

#define N(a) ((int)(sizeof(a) / sizeof(a)[0]))

static void expect(const char *const *stops, int ns, const char *const *pieces, int np, bool stopped,
                   const char *want)
{
    char out[4096];
    assert_int_equal(run_stream(stops, ns, pieces, np, out, sizeof out), stopped);
    assert_string_equal(out, want);
}

static void test_across_tokens(void **state)
{
    (void)state;
    const char *stops[] = {"lo wo"};
    const char *pieces[] = {"Hel", "lo", " ", "wor", "ld"};
    expect(stops, 1, pieces, N(pieces), true, "Hel");
    const char *stops2[] = {"\n\n"};
    const char *pieces2[] = {"a\n", "\nb"};
    expect(stops2, 1, pieces2, N(pieces2), true, "a");
}

static void test_no_match(void **state)
{
    (void)state;
    const char *stops[] = {"xyz"};
    const char *pieces[] = {"x", "y", "a", "xy"};
    expect(stops, 1, pieces, N(pieces), false, "xyaxy");
    expect(NULL, 0, pieces, N(pieces), false, "xyaxy");
}

static void test_at_start(void **state)
{
    (void)state;
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"ST", "OP", "after"};
    expect(stops, 1, pieces, N(pieces), true, "");
    const char *p2[] = {"STOPafter"};
    expect(stops, 1, p2, 1, true, "");
}

static void test_overlapping(void **state)
{
    (void)state;
    /* both complete in the same piece: the earlier start wins */
    const char *stops[] = {"bcd", "abc"};
    const char *pieces[] = {"x", "abcd"};
    expect(stops, 2, pieces, N(pieces), true, "x");
    /* "c" completes first, before "abcd" could */
    const char *stops2[] = {"abcd", "c"};
    const char *pieces2[] = {"ab", "c", "d"};
    expect(stops2, 2, pieces2, N(pieces2), true, "ab");
    /* a stop that overlaps itself */
    const char *stops3[] = {"aab"};
    const char *pieces3[] = {"a", "a", "a", "b", "c"};
    expect(stops3, 1, pieces3, N(pieces3), true, "a");
    /* one stop is a prefix of another */
    const char *stops4[] = {"ab", "a"};
    const char *pieces4[] = {"x", "ab"};
    expect(stops4, 2, pieces4, N(pieces4), true, "x");
}

static void test_utf8(void **state)
{
    (void)state;
    const char *stops[] = {"日本"};
    const char *pieces[] = {"今", "日", "本", "語"};
    expect(stops, 1, pieces, N(pieces), true, "今");
    /* a partial multi-byte stop is held back, whole characters only */
    struct stop_matcher m;
    char err[64];
    const char *s2[] = {"é!", "日本"};
    assert_int_equal(stop_init(&m, s2, 2, err, sizeof err), 0);
    const char *t = "caf\xc3\xa9"; /* café */
    assert_int_equal(stop_visible_len(&m, t, strlen(t)), 3);
    const char *t2 = "caf\xc3\xa9x";
    assert_int_equal(stop_visible_len(&m, t2, strlen(t2)), strlen(t2));
    const char *t3 = "今日";
    assert_int_equal(stop_visible_len(&m, t3, strlen(t3)), 3);
    assert_int_equal(stop_find(&m, "caf\xc3\xa9!", 7, 5), 3);
    stop_free(&m);
    const char *pieces2[] = {"caf", "\xc3\xa9", "!", "x"};
    expect(s2, 2, pieces2, N(pieces2), true, "caf");
}

static void test_visible(void **state)
{
    (void)state;
    struct stop_matcher m;
    char err[64];
    const char *stops[] = {"</answer>", "END"};
    assert_int_equal(stop_init(&m, stops, 2, err, sizeof err), 0);
    assert_int_equal(m.max_len, 9);
    assert_int_equal(stop_visible_len(&m, "hello", 5), 5);
    assert_int_equal(stop_visible_len(&m, "hello</ans", 10), 5);
    assert_int_equal(stop_visible_len(&m, "hello E", 7), 6);
    assert_int_equal(stop_visible_len(&m, "hello EN", 8), 6);
    assert_int_equal(stop_visible_len(&m, "hello <", 7), 6);
    assert_int_equal(stop_visible_len(&m, "<", 1), 0);
    assert_int_equal(stop_visible_len(&m, "", 0), 0);
    /* only matches that end in the new text are reported */
    assert_int_equal(stop_find(&m, "xEND", 4, 3), 1);
    assert_int_equal(stop_find(&m, "xENDyy", 6, 5), -1);
    stop_free(&m);
    stop_free(&m); /* harmless twice */
}

static void test_init_errors(void **state)
{
    (void)state;
    struct stop_matcher m;
    char err[64] = "";
    const char *bad[] = {"ok", ""};
    assert_int_equal(stop_init(&m, bad, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "stop[1]"));
    assert_int_equal(m.n, 0);
    const char *bad2[] = {NULL};
    assert_int_equal(stop_init(&m, bad2, 1, err, sizeof err), -1);
    assert_int_equal(stop_init(&m, NULL, 0, err, sizeof err), 0);
    assert_int_equal(m.n, 0);
    stop_free(&m);
}

/* The reference: after each piece, the earliest start of any stop string in the text so far
 * (strstr over the whole prefix); the first piece that makes one appear decides. */
static bool reference(const char *const *stops, int ns, const char *const *pieces, int np, char *out)
{
    char text[4096] = "";
    for (int i = 0; i < np; i++) {
        strcat(text, pieces[i]);
        long best = -1;
        for (int k = 0; k < ns; k++) {
            const char *hit = strstr(text, stops[k]);
            if (hit && (best < 0 || hit - text < best))
                best = hit - text;
        }
        if (best >= 0) {
            text[best] = 0;
            strcpy(out, text);
            return true;
        }
    }
    strcpy(out, text);
    return false;
}

static void test_random_streams(void **state)
{
    (void)state;
    const char *alphabet[] = {"a", "b", "ab", "ba", "\xc3\xa9", "日", "!", " ", "aa"};
    srand(77);
    int n_stopped = 0;
    for (int it = 0; it < 20000; it++) {
        const char *pieces[30];
        int np = 1 + rand() % 30;
        for (int i = 0; i < np; i++)
            pieces[i] = alphabet[rand() % N(alphabet)];
        char stopbuf[3][32];
        const char *stops[3];
        int ns = rand() % 4;
        for (int k = 0; k < ns; k++) {
            stopbuf[k][0] = 0;
            for (int j = 1 + rand() % 3; j > 0; j--)
                strcat(stopbuf[k], alphabet[rand() % N(alphabet)]);
            stops[k] = stopbuf[k];
        }
        char got[4096], want[4096];
        bool s1 = run_stream(stops, ns, pieces, np, got, sizeof got);
        bool s2 = reference(stops, ns, pieces, np, want);
        if (s1 != s2 || strcmp(got, want)) {
            print_error("iteration %d: got \"%s\" (%d), reference \"%s\" (%d)\n", it, got, s1, want, s2);
            fail();
        }
        n_stopped += s1;
    }
    assert_true(n_stopped > 5000 && n_stopped < 18000); /* both outcomes were exercised */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_across_tokens), cmocka_unit_test(test_no_match),
        cmocka_unit_test(test_at_start),      cmocka_unit_test(test_overlapping),
        cmocka_unit_test(test_utf8),          cmocka_unit_test(test_visible),
        cmocka_unit_test(test_init_errors),   cmocka_unit_test(test_random_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
