/* engine/think: the reasoning split and the forced close of a thinking budget, token by token, on a
 * made-up vocabulary (tags 10 and 11): a prompt that ends inside an open block (DeepSeek-R1's
 * generation prompt), an output that opens one (Qwen3 thinking), a closed block in the prompt
 * (Qwen3 with enable_thinking false), a block that never closes, a model without tags; budgets of 0
 * and more, with and without a newline before the close, and a model that closes before its budget.
 * Then the tags and closes read from the real Qwen3 tokenizer, and none from a tokenizer without
 * them. Last, the engine on the CPU backend with a tiny random Qwen3 that has that tokenizer: a
 * budget's forced close (logprob 0), the split against the unsplit text of the same seed, the
 * reasoning and text shown while running only ever growing into the final ones, and a stop string
 * inside the reasoning, ignored by default and cutting there with stop_in_reasoning. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model.h"
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

/* ---- the engine */

#include "cpu_test.h"

#define MAXSNAP 4096

/* One sequence as a reader sees it while it runs: every reasoning and text it showed must be a
 * prefix of the next one shown, and of the final one. */
struct watch {
    struct engine_seq *seq;
    char reasoning[MAXSNAP], text[MAXSNAP];
    size_t n_reasoning, n_text;
    bool grew_ok;
};

static void watch_step(struct watch *w)
{
    const struct engine_seq *q = w->seq;
    assert_true(q->reasoning_len < MAXSNAP && q->text_len < MAXSNAP);
    bool finished = q->finished;
    /* while running, what is shown only grows; at the end a stop may cut only what was held back */
    if (!finished &&
        (q->reasoning_len < w->n_reasoning || memcmp(q->reasoning, w->reasoning, w->n_reasoning) ||
         q->text_len < w->n_text || memcmp(q->text, w->text, w->n_text)))
        w->grew_ok = false;
    if (finished && (q->reasoning_len < w->n_reasoning || q->text_len < w->n_text))
        w->grew_ok = false; /* a reader saw bytes the result does not have */
    memcpy(w->reasoning, q->reasoning, q->reasoning_len);
    w->n_reasoning = q->reasoning_len;
    memcpy(w->text, q->text, q->text_len);
    w->n_text = q->text_len;
}

/* Runs the engine until it is idle, watching ws[0..n). */
static void run_watched(struct engine *e, struct watch *ws, int n)
{
    while (engine_has_work(e)) {
        struct engine_seq **changed;
        int n_changed;
        assert_int_equal(engine_step(e, &changed, &n_changed), 0);
        for (int i = 0; i < n; i++)
            watch_step(&ws[i]);
    }
}

/* Whether s[0..n) is whole UTF-8 characters (no character cut at either end). */
static bool whole_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
        if (!len || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

static void test_engine_budget_split_and_stops(void **state)
{
    (void)state;
    const char *assets = getenv("LLMQ_ASSETS");
    char tdir[4096], path[4200], dir[256], err[512];
    snprintf(tdir, sizeof tdir, "%s/qwen3-tokenizer", assets ? assets : "");
    snprintf(path, sizeof path, "%s/tokenizer.json", tdir);
    if (!assets || access(path, R_OK) != 0)
        skip();
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-think-engine", dir, sizeof dir), 0);
    struct tiny_opts to = tiny_opts_default();
    to.seed = 7;
    to.tie = false;
    to.tokenizer_dir = tdir;
    cpu_test_write_model(dir, &to);
    struct model *m;
    struct tok *t;
    cpu_test_load_dir(dir, &m, &t);
    struct engine_opts eo = engine_opts_default();
    eo.be.threads = 1;
    eo.be.block_size = 16;
    eo.be.max_model_len = 128;
    eo.be.max_num_seqs = 8;
    eo.be.kv_cache_bytes = 8 << 20;
    struct engine *e = cpu_test_engine(m, t, &eo);
    assert_true(engine_thinks(e));

    const char *ptext = "<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    int32_t *prompt;
    size_t n_prompt;
    assert_int_equal(tok_encode_ex(t, ptext, strlen(ptext), false, &prompt, &n_prompt, err, sizeof err), 0);
    assert_int_equal(prompt[n_prompt - 2], 151667);
    enum { BUDGET = 4, MAXT = 20 };
    struct engine_request r = engine_request_default();
    r.prompt = prompt;
    r.n_prompt = (int)n_prompt;
    r.sp.temperature = 1;
    r.sp.seed = 5;
    r.has_seed = true;
    r.sp.logprobs = 0;
    r.max_tokens = MAXT;
    r.ignore_eos = true;
    r.has_thinking_budget = true;
    r.thinking_budget = BUDGET;
    struct engine_request raw = r;
    raw.no_think_split = true;
    static struct watch w[4];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 4; i++)
        w[i].grew_ok = true;
    assert_non_null(w[0].seq = engine_add(e, &r, err, sizeof err));
    assert_non_null(w[1].seq = engine_add(e, &raw, err, sizeof err));
    run_watched(e, w, 2);
    struct engine_seq *a = w[0].seq, *b = w[1].seq;
    assert_true(w[0].grew_ok && w[1].grew_ok);
    /* budget: four sampled ids, then the close in place of sampled ones, with logprob 0 */
    const int32_t *out = a->tokens + a->n_prompt;
    assert_int_equal(a->n_output, MAXT);
    int close_at = out[BUDGET] == 198 ? BUDGET + 1 : BUDGET;
    assert_int_equal(out[close_at], 151668);
    assert_int_equal(out[close_at + 1], 271);
    for (int i = BUDGET; i <= close_at + 1; i++) {
        assert_int_equal(a->logprobs[i].token, out[i]);
        assert_true(a->logprobs[i].logprob == 0);
    }
    for (int i = 0; i < BUDGET; i++)
        assert_true(out[i] != 151667 && out[i] != 151668);
    assert_true(a->has_reasoning);
    assert_int_equal(a->n_reasoning_tokens, close_at + 1);
    /* the same ids without the split */
    assert_memory_equal(b->tokens, a->tokens, (size_t)(a->n_prompt + MAXT) * sizeof *a->tokens);
    assert_false(b->has_reasoning);
    assert_int_equal(b->n_reasoning_tokens, 0);
    char joined[2 * MAXSNAP];
    int nj = snprintf(joined, sizeof joined, "%s</think>%s", a->reasoning, a->text);
    assert_int_equal((size_t)nj, b->text_len);
    assert_memory_equal(joined, b->text, b->text_len);
    assert_true(a->text_len > 2 && !memcmp(a->text, "\n\n", 2));

    /* a stop string inside the reasoning that spans two tokens (the whole text of one and the first
     * character of the next), found nowhere in the answer: while the first of them is the last
     * token, the reasoning ends with a proper prefix of it, which a reader must not see */
    char stop[64] = "";
    for (int k = 0; k + 1 < BUDGET && !stop[0]; k++) {
        size_t n0, n1;
        const char *p0 = tok_token_bytes(t, out[k], &n0), *p1 = tok_token_bytes(t, out[k + 1], &n1);
        if (!p0 || !p1 || !n0 || !n1 || !whole_utf8(p0, n0) || !whole_utf8(p1, n1))
            continue;
        size_t c1 = 1;
        while (c1 < n1 && ((unsigned char)p1[c1] & 0xC0) == 0x80)
            c1++;
        if (n0 + c1 >= sizeof stop)
            continue;
        snprintf(stop, sizeof stop, "%.*s%.*s", (int)n0, p0, (int)c1, p1);
        if (strstr(a->text, stop) || strspn(stop, " \n") == strlen(stop))
            stop[0] = 0;
    }
    assert_true(stop[0]);
    const char *stops[] = {stop};
    struct engine_request c = r, d = r;
    c.stop = d.stop = stops;
    c.n_stop = d.n_stop = 1;
    c.stop_in_reasoning = true;
    char want_reasoning[MAXSNAP], want_text[MAXSNAP];
    size_t want_rlen = a->reasoning_len, want_tlen = a->text_len;
    memcpy(want_reasoning, a->reasoning, want_rlen);
    memcpy(want_text, a->text, want_tlen);
    const char *hit = strstr(a->reasoning, stop);
    size_t cut = (size_t)(hit - a->reasoning);
    engine_release(e, a);
    engine_release(e, b);
    assert_non_null(w[2].seq = engine_add(e, &c, err, sizeof err));
    assert_non_null(w[3].seq = engine_add(e, &d, err, sizeof err));
    run_watched(e, w + 2, 2);
    struct engine_seq *sc = w[2].seq, *sd = w[3].seq;
    assert_true(w[2].grew_ok && w[3].grew_ok);
    assert_int_equal(sc->finish, FINISH_STOP);
    assert_int_equal(sc->reasoning_len, cut);
    assert_memory_equal(sc->reasoning, want_reasoning, cut);
    assert_int_equal(sc->text_len, 0);
    assert_int_equal(sd->finish, FINISH_LENGTH); /* by default a stop string in the reasoning does nothing */
    assert_int_equal(sd->reasoning_len, want_rlen);
    assert_memory_equal(sd->reasoning, want_reasoning, want_rlen);
    assert_int_equal(sd->text_len, want_tlen);
    assert_memory_equal(sd->text, want_text, want_tlen);
    engine_release(e, sc);
    engine_release(e, sd);

    /* a budget < 0 is refused */
    struct engine_request neg = r;
    neg.thinking_budget = -1;
    assert_null(engine_add(e, &neg, err, sizeof err));
    assert_non_null(strstr(err, "thinking_budget must be >= 0"));
    free(prompt);
    engine_free(e);
    model_free(m);
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
        cmocka_unit_test(test_engine_budget_split_and_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
