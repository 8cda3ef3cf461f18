/* engine/think: the reasoning split and the forced close of a thinking budget, token by token, on a
 * made-up vocabulary (tags 10 and 11): a prompt that ends inside an open block (DeepSeek-R1's
 * generation prompt), an output that opens one (Qwen3 thinking), a closed block in the prompt
 * (Qwen3 with enable_thinking false), a block that never closes, a model without tags; budgets of 0
 * and more, with and without a newline before the close, and a model that closes before its budget.
 * Then the tags and closes read from the real Qwen3 tokenizer, and none from a tokenizer without
 * them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/think.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"

#define OPEN 10
#define CLOSE 11
#define NL 5   /* "\n" */
#define NLNL 6 /* "\n\n" */

static struct think_vocab vocab(void)
{
    struct think_vocab v;
    think_vocab_none(&v);
    v.open = OPEN;
    v.close = CLOSE;
    v.close_nl[0] = NL, v.close_nl[1] = CLOSE, v.close_nl[2] = NLNL;
    v.n_close_nl = 3;
    v.close_bare[0] = CLOSE, v.close_bare[1] = NLNL;
    v.n_close_bare = 2;
    return v;
}

/* Pushes ids[0..n) and checks each route against want[0..n). */
static void push_all(struct think_state *s, const struct think_vocab *v, const int32_t *ids,
                     const enum think_route *want, int n)
{
    for (int i = 0; i < n; i++) {
        assert_false(think_forcing(s));
        assert_int_equal(think_push(s, v, ids[i]), want[i]);
    }
}

static void test_prompt_open(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    const int32_t prompt[] = {1, CLOSE, 2, OPEN, NL}; /* an older block closed, then "<think>\n" */
    think_start(&s, &v, prompt, 5, -1);
    assert_int_equal(s.phase, THINK_IN);
    assert_true(s.seen);
    const int32_t out[] = {3, 4, CLOSE, NLNL, 7, OPEN, CLOSE};
    const enum think_route want[] = {THINK_REASONING, THINK_REASONING, THINK_CLOSE, THINK_ANSWER,
                                     THINK_ANSWER,    THINK_ANSWER,    THINK_ANSWER};
    push_all(&s, &v, out, want, 7);
    assert_int_equal(s.n_tokens, 3); /* 3, 4 and the close */
    assert_int_equal(s.n_inside, 2);
    assert_int_equal(s.phase, THINK_AFTER);
}

static void test_output_open(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    const int32_t prompt[] = {1, 2};
    think_start(&s, &v, prompt, 2, -1);
    assert_int_equal(s.phase, THINK_MAYBE);
    assert_false(s.seen);
    const int32_t out[] = {OPEN, NL, 3, NL, CLOSE, NLNL, 4};
    const enum think_route want[] = {THINK_OPEN,  THINK_REASONING, THINK_REASONING, THINK_REASONING,
                                     THINK_CLOSE, THINK_ANSWER,    THINK_ANSWER};
    push_all(&s, &v, out, want, 7);
    assert_true(s.seen);
    assert_int_equal(s.n_tokens, 5); /* both tags and the three inside */
    assert_int_equal(s.n_inside, 3);
}

static void test_closed_in_prompt(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    /* Qwen3 with enable_thinking false: "<think>\n\n</think>\n\n" ends the generation prompt */
    const int32_t prompt[] = {1, OPEN, NLNL, CLOSE, NLNL};
    think_start(&s, &v, prompt, 5, 4);
    assert_int_equal(s.phase, THINK_MAYBE);
    const int32_t out[] = {3, OPEN, 4, CLOSE};
    const enum think_route want[] = {THINK_ANSWER, THINK_ANSWER, THINK_ANSWER, THINK_ANSWER};
    push_all(&s, &v, out, want, 4); /* a tag after the answer started is text; no budget applies */
    assert_false(s.seen);
    assert_int_equal(s.n_tokens, 0);
    assert_int_equal(s.phase, THINK_NONE);
}

static void test_never_closed(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    const int32_t prompt[] = {OPEN};
    think_start(&s, &v, prompt, 1, -1);
    for (int i = 0; i < 50; i++)
        assert_int_equal(think_push(&s, &v, 20 + i), THINK_REASONING);
    assert_int_equal(s.n_tokens, 50);
    assert_int_equal(s.phase, THINK_IN);
    assert_false(think_forcing(&s));
    assert_int_equal(think_forced(&s, &v, false), -1);
}

static void test_no_tags(void **state)
{
    (void)state;
    struct think_vocab v;
    think_vocab_none(&v);
    assert_false(think_vocab_ok(&v));
    struct think_state s;
    const int32_t prompt[] = {OPEN, -1};
    think_start(&s, &v, prompt, 2, 3);
    assert_int_equal(s.phase, THINK_NONE);
    for (int i = 0; i < 10; i++)
        assert_int_equal(think_push(&s, &v, i == 0 ? OPEN : i), THINK_ANSWER);
    assert_false(s.seen);
    assert_false(think_forcing(&s));
    assert_int_equal(s.n_tokens, 0);
}

/* Runs a sequence whose sampler always proposes `sampled` until n_out tokens exist, taking the
 * forced ids where there are; out[] gets the ids, the return value is the count. */
static int run(struct think_state *s, const struct think_vocab *v, int32_t sampled, bool last_nl, int n_out,
               int32_t *out, enum think_route *routes)
{
    for (int i = 0; i < n_out; i++) {
        int32_t t = think_forcing(s) ? think_forced(s, v, last_nl) : sampled;
        assert_true(t >= 0);
        out[i] = t;
        routes[i] = think_push(s, v, t);
    }
    return n_out;
}

static void test_budget_prompt_open(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    const int32_t prompt[] = {OPEN, NL};
    int32_t out[16];
    enum think_route r[16];
    /* budget 3: three sampled ids, then "\n</think>\n\n", then sampling again */
    think_start(&s, &v, prompt, 2, 3);
    run(&s, &v, 9, false, 8, out, r);
    const int32_t want[] = {9, 9, 9, NL, CLOSE, NLNL, 9, 9};
    const enum think_route want_r[] = {THINK_REASONING, THINK_REASONING, THINK_REASONING, THINK_REASONING,
                                       THINK_CLOSE,     THINK_ANSWER,    THINK_ANSWER,    THINK_ANSWER};
    assert_memory_equal(out, want, sizeof want);
    assert_memory_equal(r, want_r, sizeof want_r);
    assert_int_equal(s.n_tokens, 5); /* three sampled, the forced newline and the close */
    assert_false(think_forcing(&s));

    /* the text so far ends with a newline: the close goes without one of its own */
    think_start(&s, &v, prompt, 2, 2);
    run(&s, &v, NL, true, 6, out, r);
    const int32_t want2[] = {NL, NL, CLOSE, NLNL, NL, NL};
    assert_memory_equal(out, want2, sizeof want2);
    assert_int_equal(s.n_tokens, 3);

    /* budget 0: the close comes first */
    think_start(&s, &v, prompt, 2, 0);
    assert_true(think_forcing(&s));
    run(&s, &v, 9, true, 3, out, r);
    const int32_t want3[] = {CLOSE, NLNL, 9};
    assert_memory_equal(out, want3, sizeof want3);
    assert_int_equal(s.n_tokens, 1);
    assert_int_equal(s.n_inside, 0);
}

static void test_budget_output_open(void **state)
{
    (void)state;
    struct think_vocab v = vocab();
    struct think_state s;
    const int32_t prompt[] = {1};
    int32_t out[16];
    enum think_route r[16];
    /* budget 0, the model opens the block: the close follows the tag at once */
    think_start(&s, &v, prompt, 1, 0);
    assert_false(think_forcing(&s)); /* nothing is forced before the block opens */
    assert_int_equal(think_push(&s, &v, OPEN), THINK_OPEN);
    assert_true(think_forcing(&s));
    run(&s, &v, 9, false, 4, out, r);
    const int32_t want[] = {NL, CLOSE, NLNL, 9};
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(s.n_tokens, 3); /* the open tag, the newline, the close */

    /* the model closes before its budget: nothing is forced */
    think_start(&s, &v, prompt, 1, 5);
    const int32_t ids[] = {OPEN, 3, CLOSE, 4, 4, 4, 4, 4};
    for (int i = 0; i < 8; i++) {
        assert_false(think_forcing(&s));
        think_push(&s, &v, ids[i]);
    }
    assert_int_equal(s.n_tokens, 3);
    assert_false(think_forcing(&s));

    /* an output that does not open a block is never forced, whatever the budget */
    think_start(&s, &v, prompt, 1, 0);
    run(&s, &v, 9, false, 5, out, r);
    for (int i = 0; i < 5; i++)
        assert_int_equal(out[i], 9);
}

static void test_qwen3_vocab(void **state)
{
    (void)state;
    const char *assets = getenv("LLMQ_ASSETS");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/qwen3-tokenizer", assets ? assets : "");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!assets || access(path, R_OK) != 0)
        skip(); /* tests/assets/fetch.sh did not get it */
    char err[512];
    struct tok *t = tok_load_dir(dir, err, sizeof err);
    if (!t)
        fail_msg("tok_load_dir: %s", err);
    struct think_vocab v;
    think_vocab_init(&v, t);
    assert_true(think_vocab_ok(&v));
    assert_int_equal(v.open, 151667);
    assert_int_equal(v.close, 151668);
    const int32_t nl[] = {198, 151668, 271}, bare[] = {151668, 271}; /* "\n", "</think>", "\n\n" */
    assert_int_equal(v.n_close_nl, 3);
    assert_memory_equal(v.close_nl, nl, sizeof nl);
    assert_int_equal(v.n_close_bare, 2);
    assert_memory_equal(v.close_bare, bare, sizeof bare);
    tok_free(t);
}

static void test_tokenizer_without_tags(void **state)
{
    (void)state;
    char dir[256], err[512];
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-think", dir, sizeof dir), 0);
    struct tiny_opts o = tiny_opts_default(); /* the minimal tokenizer: no think tags */
    assert_int_equal(tiny_model_write(dir, &o, err, sizeof err), 0);
    struct tok *t = tok_load_dir(dir, err, sizeof err);
    if (!t)
        fail_msg("tok_load_dir: %s", err);
    struct think_vocab v;
    think_vocab_init(&v, t);
    assert_false(think_vocab_ok(&v));
    tok_free(t);
    scratch_dir_remove(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_open),
        cmocka_unit_test(test_output_open),
        cmocka_unit_test(test_closed_in_prompt),
        cmocka_unit_test(test_never_closed),
        cmocka_unit_test(test_no_tags),
        cmocka_unit_test(test_budget_prompt_open),
        cmocka_unit_test(test_budget_output_open),
        cmocka_unit_test(test_qwen3_vocab),
        cmocka_unit_test(test_tokenizer_without_tags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
