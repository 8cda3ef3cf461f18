/* engine_stats' prefix cache counters in tokens (vLLM's definition; docs/SCHEDULER.md).
 *
 * A tiny model on the CPU backend with a KV pool too small for the batch: requests wait for
 * blocks (looked up again at every admission attempt) and are preempted and readmitted. However
 * often that happens, prefix_query_tokens must be the sum of the prompts (each request counted
 * once, at its first admission); readmissions go to the preempted counters; first admissions
 * and readmissions together must account for every cached token the engine skipped
 * (cached_tokens); and per-lane computed tokens must add up to computed_tokens. With caching off
 * nothing is counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cpu_test.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tiny_model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "worker/backends/backend_open.h"

#define NREQ 10
#define PROMPT 40
#define SHARED 32
#define OUT 60
#define BS 16

static char dir[256];

static void run(bool caching, struct engine_stats *st)
{
    struct model *m;
    struct tok *tok;
    cpu_test_load_dir(dir, &m, &tok);
    struct engine_opts o = engine_opts_default();
    o.admission_reserve = 0; /* admit, then preempt as the jobs grow */
    o.be.block_size = BS;
    o.be.max_model_len = 128;
    o.be.threads = 1;
    /* 20 blocks: 2 x L 2 x KVH 2 x 16 tokens x D 16 x 4 bytes each; the batch needs 70 at its end */
    o.be.kv_cache_bytes = 20 * 2 * 2 * 2 * BS * 16 * 4;
    o.enable_prefix_caching = caching;
    o.num_lanes = 2;
    struct engine *e = cpu_test_engine(m, tok, &o);
    int32_t prompts[NREQ][PROMPT];
    uint64_t s = 7;
    for (int i = 0; i < NREQ; i++)
        for (int j = 0; j < PROMPT; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i][j] = i > 0 && j < SHARED ? prompts[0][j] : (int32_t)((s >> 33) % 512);
        }
    for (int i = 0; i < NREQ; i++) {
        struct engine_request r = cpu_test_request(prompts[i], PROMPT, OUT, -1);
        r.lane = i % 2;
        cpu_test_add(e, &r);
    }
    while (engine_has_work(e)) {
        struct engine_seq **ch;
        int nc;
        assert_int_equal(engine_step(e, &ch, &nc), 0);
        for (int i = 0; i < nc; i++)
            if (ch[i]->finished) {
                assert_int_equal(ch[i]->n_output, OUT);
                engine_release(e, ch[i]);
            }
    }
    engine_get_stats(e, st);
    engine_free(e);
    tok_free(tok);
    model_free(m);
}

static void test_counts(void **state)
{
    (void)state;
    struct engine_stats st;
    run(true, &st);
    printf("queries %llu hits %llu, preempted queries %llu hits %llu, cached %llu, preemptions %llu\n",
           (unsigned long long)st.prefix_query_tokens, (unsigned long long)st.prefix_hit_tokens,
           (unsigned long long)st.prefix_preempted_query_tokens,
           (unsigned long long)st.prefix_preempted_hit_tokens, (unsigned long long)st.cached_tokens,
           (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0); /* the setting did what it is for */
    assert_int_equal(st.prefix_query_tokens, NREQ * PROMPT);
    assert_true(st.prefix_hit_tokens > 0 && st.prefix_hit_tokens <= (NREQ - 1) * SHARED);
    assert_int_equal(st.prefix_hit_tokens % BS, 0);
    assert_true(st.prefix_preempted_query_tokens >= st.preemptions * PROMPT);
    assert_true(st.prefix_preempted_hit_tokens < st.prefix_preempted_query_tokens);
    assert_int_equal(st.prefix_hit_tokens + st.prefix_preempted_hit_tokens, st.cached_tokens);
    assert_int_equal(st.lane_computed_tokens[0] + st.lane_computed_tokens[1], st.computed_tokens);
    assert_true(st.lane_computed_tokens[0] > 0 && st.lane_computed_tokens[1] > 0);

    run(false, &st);
    assert_int_equal(st.prefix_query_tokens, 0);
    assert_int_equal(st.prefix_hit_tokens, 0);
    assert_int_equal(st.prefix_preempted_query_tokens, 0);
    assert_int_equal(st.prefix_preempted_hit_tokens, 0);
    assert_int_equal(st.cached_tokens, 0);
}

int main(void)
{
    if (scratch_dir_make(getenv("TMPDIR"), "pstats", dir, sizeof dir))
        return 1;
    struct tiny_opts o = tiny_opts_default();
    o.seed = 3;
    char err[512];
    if (tiny_model_write(dir, &o, err, sizeof err)) {
        fprintf(stderr, "tiny_model_write: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_counts)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    test_remove_tree(dir);
    return rc;
}
