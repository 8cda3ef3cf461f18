/* What admission order costs the scheduler per step: sched_schedule timed over 300 steps with
 * about 1,900 sequences waiting behind a KV pool that holds ~150 of them (so every step may admit
 * and looks at the waiting list), all at priority 0 (the list as it is) and spread over priorities
 * -1, 0 and 1 (the merged admission order, docs/SCHEDULER.md "Priority and aging"). Prints
 * microseconds per step; asserts only that everything finishes, never a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "engine/scheduler.h"
#include "engine/util/mono.h"

enum { N = 2256, PROMPT = 32, OUT = 150, TIMED = 300 };

struct seq {
    struct sched_seq q;
    int32_t toks[PROMPT + OUT];
};

/* Microseconds per sched_schedule over TIMED steps (after 20 untimed), then runs everything out. */
static double run(int priorities)
{
    char err[256];
    struct kv_pool *kv = kv_pool_create(1024, 16, false, err, sizeof err);
    assert_non_null(kv);
    struct sched_opts o = sched_opts_default();
    o.max_num_seqs = 4096;
    o.max_num_batched_tokens = 16384;
    o.admission_reserve = 0;
    o.priority_aging_s = 60;
    struct sched *s = sched_create(&o, kv, err, sizeof err);
    assert_non_null(s);
    struct seq *q = calloc(N, sizeof *q);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < PROMPT + OUT; k++)
            q[i].toks[k] = (int32_t)(i + k);
        q[i].q.tokens = q[i].toks;
        q[i].q.n_tokens = PROMPT;
        q[i].q.max_len = PROMPT + OUT;
        q[i].q.priority = priorities > 1 ? i % priorities - 1 : 0;
        q[i].q.t_arrival = i * 1e-3;
        assert_int_equal(sched_add(s, &q[i].q, err, sizeof err), 0);
    }
    double spent = 0;
    int timed = 0, steps = 0;
    struct sched_out out;
    while (sched_has_work(s) && steps < 100000) {
        double t0 = llmq_mono_s();
        assert_int_equal(sched_schedule(s, &out), 0);
        double t1 = llmq_mono_s();
        if (steps >= 20 && timed < TIMED) {
            spent += t1 - t0;
            timed++;
        }
        steps++;
        sched_commit(s, &out);
        for (int i = 0; i < out.n_items; i++) {
            struct sched_seq *x = out.items[i].seq;
            if (!out.items[i].sample)
                continue;
            if (++x->n_tokens >= x->max_len)
                sched_finish(s, x);
        }
    }
    assert_false(sched_has_work(s));
    sched_free(s);
    kv_pool_free(kv);
    free(q);
    return 1e6 * spent / timed;
}

static void test_sched_speed(void **state)
{
    (void)state;
    double one = run(1), three = run(3);
    printf("sched_schedule with ~1900 waiting, KV-bound: %.1f us/step at one priority, %.1f us/step over "
           "three\n",
           one, three);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sched_speed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
