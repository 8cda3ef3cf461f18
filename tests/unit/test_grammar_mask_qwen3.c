/* Token masks against the real Qwen3 vocabulary (fetched by tests/assets/fetch.sh), a mask row wider
 * than the tokenizer (151936 logits for 151669 ids): in states of a JSON grammar along a JSON text
 * (start, keys, string values, a UTF-8 character cut in half, an escape, numbers, literals, the
 * end), every one of the 151936 bits against a brute force over the tokenizer's own byte strings;
 * then the text's own encoding accepted token by token, each allowed by the mask before it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_int.h"
#include "engine/tokenizer.h"
#include "grammar_test.h"
#include "testutil.h"

#define QWEN3_LOGITS 151936

static struct tok *tok;

static const char text[] =
    "{\"title\": \"Zo\xc3\xab's \\\"caf\xc3\xa9\\\" \xe2\x98\x95\", \"tags\": [\"a\", \"b\"], "
    "\"n\": -12.5, \"ok\": true, \"none\": null}";

static int setup(void **state)
{
    (void)state;
    char json_path[4096], config_path[4096], err[512];
    snprintf(json_path, sizeof json_path, "%s", test_asset("qwen3-tokenizer/tokenizer.json"));
    snprintf(config_path, sizeof config_path, "%s", test_asset("qwen3-tokenizer/tokenizer_config.json"));
    tok = tok_load(json_path, config_path, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "tok_load: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tok_free(tok);
    return 0;
}

/* Whether bytes[0..n) are accepted one after another from st. */
static bool accepts(const struct grammar *g, const struct gr_state *st, const char *bytes, size_t n,
                    struct gr_state *a, struct gr_state *b, struct gr_scratch *sc)
{
    char err[128];
    const struct gr_state *in = st;
    for (size_t i = 0; i < n; i++) {
        struct gr_state *out = i & 1 ? b : a;
        int r = gr_state_advance(g, in, (uint8_t)bytes[i], out, sc, err, sizeof err);
        assert_true(r >= 0);
        if (!r)
            return false;
        in = out;
    }
    return true;
}

static void test_qwen3_json(void **state)
{
    (void)state;
    int32_t eos[2] = {tok_token_to_id(tok, "<|im_end|>"), tok_token_to_id(tok, "<|endoftext|>")};
    assert_true(eos[0] >= 0 && eos[1] >= 0);
    char err[256];
    struct gr_vocab *v = gr_vocab_new(tok, QWEN3_LOGITS, eos, 2, err, sizeof err);
    if (!v)
        fail_msg("gr_vocab_new: %s", err);
    assert_int_equal(gr_vocab_mask_words(v), QWEN3_LOGITS / 32);
    struct grammar *g = gt_json_grammar(v, err, sizeof err);
    if (!g)
        fail_msg("gt_json_grammar: %s", err);
    uint32_t *mask = malloc(QWEN3_LOGITS / 8);
    struct gr_scratch sc = {0};
    struct gr_state st = {0}, a = {0}, b = {0};
    /* prefixes of text whose states are checked */
    const char *cuts[] = {
        "",
        "{",
        "{\"ti",
        "{\"title\": ",
        "{\"title\": \"Zo",
        "{\"title\": \"Zo\xc3",
        "{\"title\": \"Zo\xc3\xab's \\",
        "{\"title\": \"Zo\xc3\xab's \\\"caf\xc3\xa9\\\" \xe2\x98",
        "{\"title\": \"Zo\xc3\xab's \\\"caf\xc3\xa9\\\" \xe2\x98\x95\", \"tags\": [",
        "{\"title\": \"Zo\xc3\xab's \\\"caf\xc3\xa9\\\" \xe2\x98\x95\", \"tags\": [\"a\", \"b\"], "
        "\"n\": -1",
        "{\"title\": \"Zo\xc3\xab's \\\"caf\xc3\xa9\\\" \xe2\x98\x95\", \"tags\": [\"a\", \"b\"], "
        "\"n\": -12.5, \"ok\": tr",
        text};
    int32_t quote_comma = tok_token_to_id(tok, "\",");
    int32_t think = tok_token_to_id(tok, "<think>");
    assert_true(quote_comma >= 0 && think >= 0);
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        size_t n = strlen(cuts[c]);
        assert_memory_equal(cuts[c], text, n);
        struct gr_matcher *m = gr_matcher_new(g);
        assert_int_equal(gr_matcher_accept_bytes(m, cuts[c], n), 0);
        assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
        assert_int_equal(gr_state_start(g, &st, &sc, err, sizeof err), 1);
        assert_true(accepts(g, &st, cuts[c], n, &a, &b, &sc));
        assert_int_equal(gr_state_copy(n ? (n & 1 ? &a : &b) : &st, &st), 0);
        assert_int_equal(st.complete, gr_matcher_complete(m));
        int allowed = 0;
        for (int32_t id = 0; id < QWEN3_LOGITS; id++) {
            bool want = false;
            if (id == eos[0] || id == eos[1])
                want = st.complete;
            else if (id < tok_vocab_size(tok) && !tok_is_added(tok, id)) {
                size_t len = 0;
                const char *p = tok_token_bytes(tok, id, &len);
                want = p && len && accepts(g, &st, p, len, &a, &b, &sc);
            }
            bool got = (mask[id >> 5] >> (id & 31)) & 1u;
            if (got != want)
                fail_msg("after %zu bytes: id %d (%s) is %s but should be %s", n, (int)id,
                         tok_id_to_token(tok, id) ? tok_id_to_token(tok, id) : "-",
                         got ? "allowed" : "refused", want ? "allowed" : "refused");
            allowed += got;
        }
        printf("# after %zu bytes: %d ids allowed\n", n, allowed);
        if (c == 4) { /* inside a string value: most of the vocabulary, '",' closing it, no added token */
            assert_true(allowed > 100000);
            assert_true((mask[quote_comma >> 5] >> (quote_comma & 31)) & 1u);
            assert_false((mask[think >> 5] >> (think & 31)) & 1u);
        }
        gr_matcher_free(m);
    }
    /* the text's own tokens, each allowed by the mask, then the end */
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tok_encode(tok, text, strlen(text), &ids, &n_ids, err, sizeof err), 0);
    struct gr_matcher *m = gr_matcher_new(g);
    for (size_t i = 0; i < n_ids; i++) {
        assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
        assert_true((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u);
        assert_false((mask[eos[0] >> 5] >> (eos[0] & 31)) & 1u);
        assert_int_equal(gr_matcher_accept(m, ids[i]), 0);
    }
    assert_int_equal(gr_matcher_mask(m, mask, err, sizeof err), 0);
    assert_true((mask[eos[0] >> 5] >> (eos[0] & 31)) & 1u);
    assert_int_equal(gr_matcher_accept(m, eos[0]), 0);
    assert_true(gr_matcher_ended(m));
    gr_matcher_free(m);
    free(ids);
    struct gr_stats stats;
    gr_get_stats(g, &stats);
    printf("# cache: %llu hits, %llu misses\n", (unsigned long long)stats.hits,
           (unsigned long long)stats.misses);
    assert_true(stats.hits > 0);
    gr_state_free(&st), gr_state_free(&a), gr_state_free(&b), gr_scratch_free(&sc);
    free(mask);
    gr_unref(g);
    gr_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3_json)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
