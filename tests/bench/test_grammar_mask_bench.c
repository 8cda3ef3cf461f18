/* The cost of a token mask against the Qwen3 vocabulary (from the build's assets; 151936 logits) in
 * states of a JSON grammar: a miss on a fresh walk (its memo empty), a miss on a walk whose memo has
 * seen the grammar before (as in a running worker), the same without the memo (states advanced byte
 * by byte), and a cache hit. Not a timed test: it checks only that the three computations agree,
 * and prints the numbers for docs/STRUCTURED_OUTPUT.md (wall time of this thread, best of runs). */
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
#include "engine/util/mono.h"
#include "grammar_test.h"
#include "testutil.h"

#define QWEN3_LOGITS 151936
#define RUNS 7

static void bench(void **state)
{
    (void)state;
    char err[512];
    struct tok *tok = tok_load(test_asset("qwen3-tokenizer/tokenizer.json"), NULL, err, sizeof err);
    if (!tok)
        fail_msg("tok_load: %s", err);
    int32_t eos[1] = {tok_token_to_id(tok, "<|endoftext|>")};
    double t0 = llmq_mono_s();
    struct gr_vocab *v = gr_vocab_new(tok, QWEN3_LOGITS, eos, 1, err, sizeof err);
    double t_vocab = llmq_mono_s() - t0;
    assert_non_null(v);
    printf("# vocabulary: %d ids in the trie, %d nodes, longest %d bytes, built in %.1f ms\n",
           (int)v->n_trie_ids, (int)v->n_nodes, (int)v->max_depth, 1e3 * t_vocab);
    struct grammar *g = gt_json_grammar(v, err, sizeof err);
    assert_non_null(g);
    const char *prefixes[] = {"",
                              "{\"title\": \"A summary of",
                              "{\"title\": \"A summary of ",
                              "{\"ti",
                              "{\"title\": ",
                              "{\"title\": \"x\", \"n\": -12",
                              "{\"title\": \"x\", \"tags\": [",
                              "{\"title\": \"x\", \"tags\": [\"a\"]"};
    size_t words = (size_t)gr_vocab_mask_words(v);
    uint32_t *mask = malloc(words * 4), *ref = malloc(words * 4);
    struct gr_walk *warm = gr_walk_new(g);
    struct gr_scratch sc = {0};
    struct gr_state st = {0}, nx = {0};
    printf("# %-40s %8s %9s %9s %9s %9s\n", "state after", "allowed", "cold ms", "warm ms", "plain ms",
           "hit us");
    double sum_cold = 0, sum_warm = 0;
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        assert_int_equal(gr_state_start(g, &st, &sc, err, sizeof err), 1);
        for (const char *c = prefixes[p]; *c; c++) {
            assert_int_equal(gr_state_advance(g, &st, (uint8_t)*c, &nx, &sc, err, sizeof err), 1);
            struct gr_state t = st;
            st = nx;
            nx = t;
        }
        double cold = 1e9, warm_s = 1e9, plain = 1e9, hit = 1e9;
        for (int r = 0; r < RUNS; r++) {
            struct gr_walk *w = gr_walk_new(g);
            t0 = llmq_mono_s();
            assert_int_equal(gr_walk_mask(w, v, &st, mask, err, sizeof err), 0);
            double dt = llmq_mono_s() - t0;
            cold = dt < cold ? dt : cold;
            gr_walk_free(w);
            t0 = llmq_mono_s();
            assert_int_equal(gr_walk_mask(warm, v, &st, mask, err, sizeof err), 0);
            dt = llmq_mono_s() - t0;
            warm_s = dt < warm_s ? dt : warm_s;
        }
        struct gr_walk *w = gr_walk_new(g);
        gr_walk_set_max_bytes(w, 0);
        for (int r = 0; r < 2; r++) {
            t0 = llmq_mono_s();
            assert_int_equal(gr_walk_mask(w, v, &st, ref, err, sizeof err), 0);
            double dt = llmq_mono_s() - t0;
            plain = dt < plain ? dt : plain;
        }
        gr_walk_free(w);
        assert_memory_equal(mask, ref, words * 4);
        struct gr_matcher *m = gr_matcher_new(g);
        assert_int_equal(gr_matcher_accept_bytes(m, prefixes[p], strlen(prefixes[p])), 0);
        assert_int_equal(gr_matcher_mask(m, ref, err, sizeof err), 0);
        for (int r = 0; r < RUNS; r++) {
            t0 = llmq_mono_s();
            assert_int_equal(gr_matcher_mask(m, ref, err, sizeof err), 0);
            double dt = llmq_mono_s() - t0;
            hit = dt < hit ? dt : hit;
        }
        assert_memory_equal(mask, ref, words * 4);
        gr_matcher_free(m);
        int allowed = 0;
        for (size_t i = 0; i < words; i++)
            allowed += __builtin_popcount(mask[i]);
        char label[64];
        snprintf(label, sizeof label, "'%s'", prefixes[p]);
        printf("# %-40s %8d %9.2f %9.2f %9.1f %9.1f\n", label, allowed, 1e3 * cold, 1e3 * warm_s, 1e3 * plain,
               1e6 * hit);
        sum_cold += cold;
        sum_warm += warm_s;
    }
    size_t n = sizeof prefixes / sizeof prefixes[0];
    printf("# mean of the states: %.2f ms per miss on a fresh walk, %.2f ms on a warm one (%.0f KiB)\n",
           1e3 * sum_cold / n, 1e3 * sum_warm / n, gr_walk_bytes(warm) / 1024.0);
    gr_state_free(&st), gr_state_free(&nx), gr_scratch_free(&sc);
    gr_walk_free(warm);
    free(mask), free(ref);
    gr_unref(g);
    gr_vocab_free(v);
    tok_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(bench)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
