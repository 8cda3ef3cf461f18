/* engine/scheduler: token budgets and max_num_seqs, chunked prefill,
 * bucket grouping and arrival order, preemption by recompute and readmission, failure of a
 * sequence that can never fit, the block handed out a step early (lookahead), lanes, priorities
 * (admission order, aging by the sequences' own arrival times, bucket mates, preemption with and
 * without aging), and a random stress run that checks the invariants after every step (budgets, no
 * block leaked or owned twice, every K/V slot a step reads holds the token of its position, every
 * sequence finishes). No backend: a step "computes" by writing the tokens into a shadow of the KV
 * pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/scheduler.h"

#define MAXTOK 512

struct tseq {
    struct sched_seq q;
    int32_t toks[MAXTOK];
    int target; /* finishes when it holds this many tokens */
    int id;
    bool finished;
};

struct harness {
    struct sched_seq *added[512]; /* finished at h_close */
    int n_added;
    struct kv_pool *kv;
    struct sched *s;
    int32_t *shadow; /* [num_blocks * block_size]: the token whose K/V each slot holds, -1 none */
    int bs, nb;
};

static void h_open(struct harness *h, int nb, int bs, bool prefix, const struct sched_opts *o)
{
    char err[256] = "";
    h->kv = kv_pool_create(nb, bs, prefix, err, sizeof err);
    assert_non_null(h->kv);
    h->s = sched_create(o, h->kv, err, sizeof err);
    if (!h->s) {
        print_error("sched_create: %s\n", err);
        fail();
    }
    h->bs = bs;
    h->nb = nb;
    h->n_added = 0;
    h->shadow = malloc((size_t)nb * bs * sizeof *h->shadow);
    memset(h->shadow, 0xff, (size_t)nb * bs * sizeof *h->shadow);
}

static void h_close(struct harness *h)
{
    for (int i = 0; i < h->n_added; i++)
        sched_finish(h->s, h->added[i]);
    sched_free(h->s);
    kv_pool_free(h->kv);
    free(h->shadow);
}

static struct sched_opts opts(int max_seqs, int budget, int mml)
{
    struct sched_opts o = sched_opts_default();
    o.max_num_seqs = max_seqs;
    o.max_num_batched_tokens = budget;
    o.max_model_len = mml;
    o.watermark_blocks = 0;
    return o;
}

/* The token generated at position pos of sequence id (deterministic, a small alphabet). */
static int32_t gen_token(int id, int pos)
{
    return (int32_t)((id * 131 + pos * 7) % 13);
}

static void seq_init(struct tseq *t, int id, int n_prompt, int target, int lane)
{
    memset(t, 0, sizeof *t);
    t->id = id;
    t->target = target;
    for (int i = 0; i < n_prompt; i++)
        t->toks[i] = (int32_t)(1000 + id * 1000 + i);
    t->q.tokens = t->toks;
    t->q.n_tokens = n_prompt;
    t->q.max_len = target;
    t->q.lane = lane;
    t->q.user = t;
}

static void add(struct harness *h, struct tseq *t)
{
    char err[256] = "";
    if (sched_add(h->s, &t->q, err, sizeof err)) {
        print_error("sched_add: %s\n", err);
        fail();
    }
    assert_true(h->n_added < 512);
    h->added[h->n_added++] = &t->q;
}

/* Checks what the backend would be handed: positions below pos must hold the right K/V, the block
 * table must cover pos + n_new. Then "computes" the new positions. */
static void h_compute(struct harness *h, const struct sched_out *out)
{
    for (int i = 0; i < out->n_items; i++) {
        const struct sched_item *it = &out->items[i];
        const struct sched_seq *q = it->seq;
        assert_int_equal(q->state, SCHED_RUNNING);
        assert_int_equal(it->pos, q->n_computed);
        assert_true(it->n_new >= 1);
        assert_true(it->pos + it->n_new <= q->n_tokens);
        assert_int_equal(it->sample, it->pos + it->n_new == q->n_tokens);
        assert_true(q->kv.n_blocks * h->bs >= it->pos + it->n_new);
        for (int p = 0; p < it->pos; p++) {
            int32_t slot = q->kv.blocks[p / h->bs] * h->bs + p % h->bs;
            if (h->shadow[slot] != q->tokens[p]) {
                print_error("seq %d position %d: the cache holds token %d, expected %d\n",
                            ((struct tseq *)q->user)->id, p, h->shadow[slot], q->tokens[p]);
                fail();
            }
        }
    }
    for (int i = 0; i < out->n_items; i++) {
        const struct sched_item *it = &out->items[i];
        for (int p = it->pos; p < it->pos + it->n_new; p++)
            h->shadow[it->seq->kv.blocks[p / h->bs] * h->bs + p % h->bs] = it->seq->tokens[p];
    }
}

/* One step: plan, compute, commit, append sampled tokens, finish those at their target. */
static void h_step(struct harness *h, struct sched_out *out)
{
    assert_int_equal(sched_schedule(h->s, out), 0);
    h_compute(h, out);
    sched_commit(h->s, out);
    for (int i = 0; i < out->n_items; i++) {
        if (!out->items[i].sample)
            continue;
        struct tseq *t = out->items[i].seq->user;
        t->toks[t->q.n_tokens] = gen_token(t->id, t->q.n_tokens);
        t->q.n_tokens++;
        if (t->q.n_tokens >= t->target) {
            sched_finish(h->s, &t->q);
            t->finished = true;
        }
    }
    for (int i = 0; i < out->n_failed; i++)
        ((struct tseq *)out->failed[i]->user)->finished = true;
}

static int item_of(const struct sched_out *out, const struct tseq *t)
{
    for (int i = 0; i < out->n_items; i++)
        if (out->items[i].seq == &t->q)
            return i;
    return -1;
}

/* ---- tests */

static void test_bucket(void **state)
{
    (void)state;
    assert_int_equal(sched_bucket(1), 0);
    assert_int_equal(sched_bucket(2), 1);
    assert_int_equal(sched_bucket(3), 1);
    assert_int_equal(sched_bucket(4), 2);
    assert_int_equal(sched_bucket(1023), 9);
    assert_int_equal(sched_bucket(1024), 10);
}

static void test_add_errors(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 64, 100);
    o.num_lanes = 2;
    o.lanes[1].max_model_len = 50;
    h_open(&h, 64, 4, false, &o);
    char err[256];
    struct tseq t;
    seq_init(&t, 0, 10, 101, 0);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_model_len 100"));
    seq_init(&t, 0, 10, 51, 1);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_model_len 50"));
    seq_init(&t, 0, 10, 20, 2);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), -1);
    assert_non_null(strstr(err, "lane 2"));
    seq_init(&t, 0, 0, 20, 0);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), -1);
    seq_init(&t, 0, 10, 100, 0);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), 0);
    assert_int_equal(sched_add(h.s, &t.q, err, sizeof err), -1); /* twice */
    sched_finish(h.s, &t.q);
    assert_false(sched_has_work(h.s));
    sched_finish(h.s, &t.q); /* harmless twice */
    /* bad options */
    struct sched_opts bad = opts(0, 64, 100);
    assert_null(sched_create(&bad, h.kv, err, sizeof err));
    h_close(&h);
}

static void test_budget_and_max_num_seqs(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 100, 256);
    h_open(&h, 64, 4, false, &o);
    struct tseq t[10];
    for (int i = 0; i < 10; i++) {
        seq_init(&t[i], i, 5, 8, 0);
        add(&h, &t[i]);
    }
    struct sched_out out;
    h_step(&h, &out);
    assert_int_equal(out.n_items, 4);
    assert_int_equal(out.n_tokens, 20);
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(out.items[i].seq, &t[i].q); /* arrival order */
        assert_int_equal(out.items[i].n_new, 5);
        assert_true(out.items[i].sample);
    }
    assert_int_equal(sched_num_running(h.s, -1), 4);
    assert_int_equal(sched_num_waiting(h.s, -1), 6);
    h_step(&h, &out); /* 4 decodes, nobody admitted: max_num_seqs */
    assert_int_equal(out.n_items, 4);
    assert_int_equal(out.n_tokens, 4);
    assert_int_equal(out.n_prefill_items, 0);
    h_step(&h, &out);
    h_step(&h, &out); /* t0..t3 reach 8 tokens and finish */
    assert_true(t[0].finished && t[3].finished && !t[4].finished);
    h_step(&h, &out);
    assert_int_equal(out.n_items, 4);
    assert_ptr_equal(out.items[0].seq, &t[4].q);
    /* a budget smaller than the batch of prompts */
    struct harness h2;
    struct sched_opts o2 = opts(8, 12, 256);
    h_open(&h2, 64, 4, false, &o2);
    struct tseq u[3];
    for (int i = 0; i < 3; i++) {
        seq_init(&u[i], i, 5, 20, 0);
        add(&h2, &u[i]);
    }
    h_step(&h2, &out);
    assert_int_equal(out.n_tokens, 12); /* 5 + 5 + a chunk of 2 */
    assert_int_equal(out.n_items, 3);
    assert_int_equal(out.items[2].n_new, 2);
    assert_false(out.items[2].sample);
    h_step(&h2, &out); /* 2 decodes + the rest (3) of u2 */
    assert_int_equal(out.n_tokens, 5);
    assert_int_equal(out.items[2].pos, 2);
    assert_int_equal(out.items[2].n_new, 3);
    assert_true(out.items[2].sample);
    h_close(&h);
    h_close(&h2);
}

static void test_chunked_prefill(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 8, 256);
    h_open(&h, 64, 4, false, &o);
    struct tseq a;
    seq_init(&a, 0, 20, 23, 0);
    add(&h, &a);
    struct sched_out out;
    int want[][3] = {{0, 8, 0}, {8, 8, 0}, {16, 4, 1}, {20, 1, 1}, {21, 1, 1}};
    for (int s = 0; s < 5; s++) {
        h_step(&h, &out);
        assert_int_equal(out.n_items, 1);
        assert_int_equal(out.items[0].pos, want[s][0]);
        assert_int_equal(out.items[0].n_new, want[s][1]);
        assert_int_equal(out.items[0].sample, want[s][2]);
    }
    assert_true(a.finished);
    assert_false(sched_has_work(h.s));
    h_close(&h);

    /* long_prefill_chunk caps one sequence's share; the rest of the budget admits others */
    o.max_num_batched_tokens = 32;
    o.long_prefill_chunk = 10;
    h_open(&h, 64, 4, false, &o);
    struct tseq b, c;
    seq_init(&b, 1, 25, 30, 0);
    seq_init(&c, 2, 6, 30, 0);
    add(&h, &b);
    add(&h, &c);
    h_step(&h, &out);
    assert_int_equal(out.n_items, 2);
    assert_int_equal(out.items[0].n_new, 10);
    assert_int_equal(out.items[1].n_new, 6);
    h_close(&h);
}

static void test_bucket_grouping(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(3, 1000, 512);
    h_open(&h, 256, 4, false, &o);
    int lens[] = {100, 5, 110, 6, 120};
    struct tseq t[5];
    for (int i = 0; i < 5; i++) {
        seq_init(&t[i], i, lens[i], lens[i] + 2, 0);
        add(&h, &t[i]);
    }
    struct sched_out out;
    h_step(&h, &out);
    assert_int_equal(out.n_items, 3);
    assert_ptr_equal(out.items[0].seq, &t[0].q); /* the oldest first */
    assert_ptr_equal(out.items[1].seq, &t[2].q); /* then its bucket (64..127) */
    assert_ptr_equal(out.items[2].seq, &t[4].q);
    h_step(&h, &out);
    h_step(&h, &out); /* the three finish */
    h_step(&h, &out);
    assert_int_equal(out.n_items, 2);
    assert_ptr_equal(out.items[0].seq, &t[1].q);
    assert_ptr_equal(out.items[1].seq, &t[3].q);
    h_close(&h);

    /* a bucket mate that does not fit whole is passed over; the rest go in arrival order, chunked */
    o = opts(10, 250, 512);
    h_open(&h, 256, 4, false, &o);
    int lens2[] = {100, 5, 110, 120};
    for (int i = 0; i < 4; i++) {
        seq_init(&t[i], i, lens2[i], lens2[i] + 2, 0);
        add(&h, &t[i]);
    }
    h_step(&h, &out);
    assert_int_equal(out.n_items, 4);
    assert_ptr_equal(out.items[0].seq, &t[0].q);
    assert_ptr_equal(out.items[1].seq, &t[2].q);
    assert_ptr_equal(out.items[2].seq, &t[1].q);
    assert_ptr_equal(out.items[3].seq, &t[3].q);
    assert_int_equal(out.items[3].n_new, 250 - 100 - 110 - 5);
    h_close(&h);
}

/* Bucket preference never lets a young sequence starve an old one: the oldest waiting one is
 * admitted first whenever anything is. */
static void test_arrival_fairness(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(2, 1000, 512);
    h_open(&h, 256, 4, false, &o);
    struct tseq t[40];
    int next = 0, admitted_order[40], n_adm = 0;
    bool seen[40] = {false};
    struct sched_out out;
    /* a stream of short ones with an occasional long one */
    for (int s = 0; s < 400 && (next < 40 || sched_has_work(h.s)); s++) {
        if (next < 40 && s % 2 == 0) {
            int len = next % 7 == 3 ? 200 : 4 + next % 3;
            seq_init(&t[next], next, len, len + 3, 0);
            add(&h, &t[next]);
            next++;
        }
        h_step(&h, &out);
        for (int i = 0; i < out.n_items; i++) {
            struct tseq *q = out.items[i].seq->user;
            if (!seen[q->id]) {
                seen[q->id] = true;
                admitted_order[n_adm++] = q->id;
                /* every sequence older than q is admitted already or is admitted in this step */
                for (int j = 0; j < q->id; j++)
                    if (!seen[j]) {
                        bool same_step = item_of(&out, &t[j]) >= 0;
                        if (!same_step) {
                            print_error("seq %d admitted before the older seq %d\n", q->id, j);
                            fail();
                        }
                    }
            }
        }
    }
    assert_int_equal(n_adm, 40);
    for (int i = 0; i < 40; i++)
        assert_true(t[i].finished);
    (void)admitted_order;
    h_close(&h);
}

static void test_preemption_and_recompute(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(8, 64, 256);
    o.admission_reserve = 0;      /* growth must preempt (test_admission_reserve: the reserve avoids it) */
    h_open(&h, 10, 4, false, &o); /* 40 token slots */
    struct tseq a, b, c, d;
    seq_init(&a, 0, 12, 24, 0); /* 3 blocks, grows to 6 */
    seq_init(&b, 1, 12, 24, 0);
    seq_init(&c, 2, 12, 24, 0);
    seq_init(&d, 3, 4, 8, 0);
    add(&h, &a);
    add(&h, &b);
    add(&h, &c);
    struct sched_out out;
    h_step(&h, &out); /* 9 of 10 blocks used; each sampled its 13th token */
    assert_int_equal(out.n_items, 3);
    add(&h, &d);
    /* a takes the last free block for position 12; b needs one too and preempts the most recently
       admitted running sequence, c; nobody is admitted in a step that preempted */
    h_step(&h, &out);
    assert_int_equal(out.n_preempted, 1);
    assert_ptr_equal(out.preempted[0], &c.q);
    assert_int_equal(out.n_items, 2);
    assert_int_equal(d.q.state, SCHED_WAITING);
    struct tseq *victim = &c;
    assert_int_equal(victim->q.state, SCHED_WAITING);
    assert_int_equal(victim->q.kv.n_blocks, 0);
    assert_int_equal(victim->q.n_computed, 0);
    assert_int_equal(victim->q.n_preemptions, 1);
    /* run to the end: the victims come back before d (front of waiting), recomputing their
       generated tokens as prompt, and every K/V they read is right (h_compute checks) */
    int n_before = victim->q.n_tokens;
    bool readmitted = false;
    for (int s = 0; s < 200 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        int k = item_of(&out, victim);
        if (!readmitted && k >= 0) {
            readmitted = true;
            assert_int_equal(out.items[k].pos, 0);
            assert_int_equal(out.items[k].n_new, n_before); /* all of it, generated token included */
            assert_true(out.items[k].sample);
        }
        if (!readmitted)
            assert_int_equal(d.q.state, SCHED_WAITING);
        for (int i = 0; i < out.n_preempted; i++)
            assert_ptr_not_equal(out.preempted[i], &a.q);
    }
    assert_true(readmitted);
    assert_true(a.finished && b.finished && c.finished && d.finished);
    assert_int_equal(kv_num_free(h.kv), 10);
    /* the generated tokens are what they would be without preemption */
    for (int p = 12; p < 24; p++)
        assert_int_equal(victim->toks[p], gen_token(victim->id, p));
    h_close(&h);
}

/* A preempted sequence goes to the front of the waiting queue: nothing that waited behind it
 * runs before it is back. */
static void test_preempted_goes_first(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(2, 64, 256);
    o.admission_reserve = 0;
    h_open(&h, 6, 4, false, &o); /* 24 slots */
    struct tseq a, b, c;
    seq_init(&a, 0, 8, 20, 0);
    seq_init(&b, 1, 8, 20, 0);
    seq_init(&c, 2, 2, 4, 0);
    add(&h, &a);
    add(&h, &b);
    add(&h, &c); /* waits: max_num_seqs 2 */
    struct sched_out out;
    h_step(&h, &out);
    int preempted_at = -1;
    for (int s = 0; s < 100 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        if (out.n_preempted && preempted_at < 0) {
            preempted_at = s;
            assert_ptr_equal(out.preempted[0], &b.q);
        }
        if (preempted_at >= 0 && !b.finished && item_of(&out, &c) >= 0 && item_of(&out, &b) < 0 &&
            b.q.state == SCHED_WAITING) {
            print_error("c ran while the preempted b waited\n");
            fail();
        }
    }
    assert_true(preempted_at >= 0);
    assert_true(a.finished && b.finished && c.finished);
    h_close(&h);
}

/* The growth reserve: in the scene of test_preemption_and_recompute (there: preemptions) a sequence
 * is admitted only with the blocks it and the running ones will grow into, so nobody is preempted;
 * and sequences that stop early (EOS) lower the share, so more run at once. */
static void test_admission_reserve(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(8, 64, 256); /* admission_reserve 1 by default */
    assert_true(o.admission_reserve == 1.0);
    h_open(&h, 10, 4, false, &o);
    struct tseq a, b, c;
    seq_init(&a, 0, 12, 24, 0);
    seq_init(&b, 1, 12, 24, 0);
    seq_init(&c, 2, 12, 24, 0);
    add(&h, &a);
    add(&h, &b);
    add(&h, &c);
    struct sched_out out;
    h_step(&h, &out); /* a runs alone: with b, 3 + 3 blocks each to grow into, 12 > 10 */
    assert_int_equal(out.n_items, 1);
    assert_int_equal(b.q.state, SCHED_WAITING);
    assert_int_equal(c.q.state, SCHED_WAITING);
    int steps = 0, preempted = 0;
    while (sched_has_work(h.s) && steps++ < 200) {
        h_step(&h, &out);
        preempted += out.n_preempted;
    }
    assert_int_equal(preempted, 0);
    assert_true(a.finished && b.finished && c.finished);
    assert_true(sched_reserve_share(h.s) == 1.0); /* they generated all of max_tokens */
    h_close(&h);

    /* 40 blocks of 4; prompts of 4 tokens, max_len 40 (9 blocks to grow into), stopping after 4
       tokens (EOS): at share 1 a sequence takes 1 + 9 blocks, so 4 run at once */
    o = opts(64, 256, 256);
    h_open(&h, 40, 4, false, &o);
    enum { N = 48 };
    struct tseq *t = calloc(N, sizeof *t);
    int first_running[2] = {0, 0};
    double share_after[2] = {0, 0};
    for (int wave = 0; wave < 2; wave++) {
        for (int i = wave * 24; i < wave * 24 + 24; i++) {
            seq_init(&t[i], i, 4, 8, 0);
            t[i].q.max_len = 40;
            add(&h, &t[i]);
        }
        steps = preempted = 0;
        while (sched_has_work(h.s) && steps++ < 500) {
            h_step(&h, &out);
            preempted += out.n_preempted;
            if (steps == 1)
                first_running[wave] = out.n_items;
        }
        assert_int_equal(preempted, 0);
        for (int i = wave * 24; i < wave * 24 + 24; i++)
            assert_true(t[i].finished);
        share_after[wave] = sched_reserve_share(h.s);
    }
    /* 24 finished at 4 / 36 of max_tokens: (8 * 1 + 24 / 9) / 32 = 1 / 3; then 48: (8 + 48 / 9) / 56 */
    assert_true(fabs(share_after[0] - 1.0 / 3) < 1e-9);
    assert_true(fabs(share_after[1] - (8 + 48.0 / 9) / 56) < 1e-9);
    assert_int_equal(first_running[0], 4);  /* 1 + 9 blocks each */
    assert_int_equal(first_running[1], 10); /* share 1/3: 4 + 12 tokens, 4 blocks each */
    free(t);
    h_close(&h);

    /* 0: no reserve, nothing learned */
    o = opts(8, 64, 256);
    o.admission_reserve = 0;
    h_open(&h, 10, 4, false, &o);
    assert_true(sched_reserve_share(h.s) == 0);
    h_close(&h);
    o.admission_reserve = 1.5;
    char err[128] = "";
    struct kv_pool *kv = kv_pool_create(10, 4, false, err, sizeof err);
    assert_null(sched_create(&o, kv, err, sizeof err));
    assert_non_null(strstr(err, "admission_reserve"));
    kv_pool_free(kv);
}

static void test_never_fits(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 64, 256);
    h_open(&h, 4, 4, false, &o); /* 16 slots */
    struct tseq big, grows, ok;
    seq_init(&big, 0, 20, 22, 0);   /* the prompt alone needs 5 blocks */
    seq_init(&grows, 1, 10, 30, 0); /* fits at first, outgrows the pool */
    seq_init(&ok, 2, 3, 5, 0);
    add(&h, &big);
    add(&h, &grows);
    add(&h, &ok);
    struct sched_out out;
    h_step(&h, &out);
    assert_int_equal(out.n_failed, 1);
    assert_ptr_equal(out.failed[0], &big.q);
    assert_int_equal(big.q.state, SCHED_DONE);
    assert_non_null(strstr(big.q.error, "5 KV blocks"));
    assert_non_null(strstr(big.q.error, "4 blocks"));
    bool grows_failed = false;
    for (int s = 0; s < 100 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        for (int i = 0; i < out.n_failed; i++)
            if (out.failed[i] == &grows.q)
                grows_failed = true;
    }
    assert_true(grows_failed);
    assert_int_equal(grows.q.n_tokens, 17); /* failed when it needed a 5th block */
    assert_true(ok.finished);
    assert_int_equal(kv_num_free(h.kv), 4);
    h_close(&h);
}

/* A sampling item whose next step starts a new block gets it a step early, only out of what is free
 * beyond the watermark, and not when no next step will come. */
static void test_lookahead(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 64, 256);
    h_open(&h, 16, 4, false, &o);
    struct tseq a;
    seq_init(&a, 0, 3, 9, 0); /* runs positions 0..7 */
    add(&h, &a);
    struct sched_out out;
    h_step(&h, &out); /* prefill 0..2; the next step writes 3: same block */
    assert_int_equal(out.n_lookahead, 0);
    assert_int_equal(a.q.kv.n_blocks, 1);
    h_step(&h, &out); /* writes 3; the next writes 4, which starts block 1 */
    assert_int_equal(out.n_lookahead, 1);
    assert_int_equal(a.q.kv.n_blocks, 2);
    h_step(&h, &out); /* writes 4 in the block it already holds */
    assert_int_equal(out.n_lookahead, 0);
    assert_int_equal(a.q.kv.n_blocks, 2);
    for (int i = 0; i < 3; i++) /* writes 5, 6, 7; 7 ends it (9 tokens): no block for 8 */
        h_step(&h, &out), assert_int_equal(out.n_lookahead, 0);
    assert_true(a.finished);
    assert_int_equal(kv_num_free(h.kv), 16);
    h_close(&h);

    /* the watermark: 3 blocks, 1 of them kept free */
    o.watermark_blocks = 1;
    h_open(&h, 3, 4, false, &o);
    struct tseq b;
    seq_init(&b, 1, 3, 13, 0);
    add(&h, &b);
    h_step(&h, &out);
    h_step(&h, &out); /* the next step starts block 1: 2 free, 1 beyond the watermark */
    assert_int_equal(out.n_lookahead, 1);
    for (int i = 0; i < 4; i++)
        h_step(&h, &out);
    assert_int_equal(b.q.n_computed, 8); /* the next step starts block 2: only the watermark's free */
    assert_int_equal(out.n_lookahead, 0);
    assert_int_equal(b.q.kv.n_blocks, 2);
    h_step(&h, &out); /* which the step itself still takes */
    assert_int_equal(b.q.kv.n_blocks, 3);
    h_close(&h);
}

static void test_lanes(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(6, 100, 512);
    o.num_lanes = 2;
    o.lanes[0].max_num_seqs = 4;
    o.lanes[1].max_num_seqs = 2;
    o.lanes[1].max_num_batched_tokens = 40;
    h_open(&h, 256, 4, false, &o);
    struct tseq lng[3], sh[6];
    for (int i = 0; i < 3; i++) {
        seq_init(&lng[i], 10 + i, 300, 310, 1);
        add(&h, &lng[i]);
    }
    for (int i = 0; i < 6; i++) {
        seq_init(&sh[i], i, 8, 12, 0);
        add(&h, &sh[i]);
    }
    struct sched_out out;
    h_step(&h, &out);
    int lane_tok[2] = {0, 0}, lane_n[2] = {0, 0};
    for (int i = 0; i < out.n_items; i++) {
        lane_tok[out.items[i].seq->lane] += out.items[i].n_new;
        lane_n[out.items[i].seq->lane]++;
    }
    assert_int_equal(lane_n[0], 4); /* short lane: its max_num_seqs */
    assert_int_equal(lane_tok[0], 32);
    assert_true(lane_n[1] <= 2);
    assert_int_equal(lane_tok[1], 40); /* long lane: its own budget */
    assert_int_equal(sched_num_running(h.s, 0), 4);
    assert_int_equal(sched_num_waiting(h.s, 0), 2);
    for (int s = 0; s < 200 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        int t1 = 0, n1 = 0;
        for (int i = 0; i < out.n_items; i++)
            if (out.items[i].seq->lane == 1) {
                t1 += out.items[i].n_new;
                n1++;
            }
        assert_true(t1 <= 40 && n1 <= 2);
        assert_true(sched_num_running(h.s, 1) <= 2);
    }
    for (int i = 0; i < 6; i++)
        assert_true(sh[i].finished);
    for (int i = 0; i < 3; i++)
        assert_true(lng[i].finished);
    h_close(&h);
}

static void test_prefix_cache_admission(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(4, 256, 256);
    h_open(&h, 32, 4, true, &o);
    struct tseq a, b, c;
    seq_init(&a, 0, 18, 20, 0);
    seq_init(&b, 0, 18, 20, 0); /* same id: same prompt */
    b.id = 1;
    add(&h, &a);
    struct sched_out out;
    h_step(&h, &out);
    h_step(&h, &out);
    assert_true(a.finished);
    add(&h, &b);
    h_step(&h, &out);
    /* 4 full blocks of the prompt are cached (16 tokens); the rest runs */
    assert_int_equal(out.items[0].pos, 16);
    assert_int_equal(out.items[0].n_new, 2);
    assert_int_equal(b.q.n_cached, 16);
    h_step(&h, &out);
    assert_true(b.finished);
    /* a prompt of exactly 4 blocks, fully cached: its last block runs again */
    seq_init(&c, 0, 16, 18, 0);
    c.id = 2;
    add(&h, &c);
    h_step(&h, &out);
    assert_int_equal(out.items[0].pos, 12);
    assert_int_equal(out.items[0].n_new, 4);
    h_close(&h);
}

/* ---- priorities */

/* Admits one sequence per step (max_num_seqs 1; each finishes at its first token) and writes the ids
 * in the order they ran into order[0 .. n). */
static void admission_order(struct harness *h, struct tseq *t, int n, int *order)
{
    struct sched_out out;
    int k = 0;
    for (int s = 0; s < 4 * n && sched_has_work(h->s); s++) {
        h_step(h, &out);
        assert_true(out.n_items <= 1);
        if (out.n_items)
            order[k++] = ((struct tseq *)out.items[0].seq->user)->id;
    }
    assert_int_equal(k, n);
    for (int i = 0; i < n; i++)
        assert_true(t[i].finished);
}

/* Higher priority first, arrival between equals; aging (by t_arrival, no clock) lets an old
 * low-priority sequence pass younger high ones once it has waited priority_aging_s per level. */
static void test_priority_order(void **state)
{
    (void)state;
    static const struct {
        int priority;
        double t; /* t_arrival */
    } in[] = {{-1, 0}, {0, 5}, {-1, 6}, {1, 7}, {0, 10}, {0, 15}};
    enum { N = sizeof in / sizeof in[0] };
    static const int want_plain[N] = {3, 1, 4, 5, 0, 2};
    /* aging 10 s: ranks by t - 10 * priority: -1:10, 0:5, -1:16, 1:-3, 0:10 (ties: 0 first, added
     * before 4), 0:15 */
    static const int want_aged[N] = {3, 1, 0, 4, 5, 2};
    for (int aged = 0; aged < 2; aged++) {
        struct harness h;
        struct sched_opts o = opts(1, 100, 64);
        o.priority_aging_s = aged ? 10 : 0;
        h_open(&h, 64, 4, false, &o);
        struct tseq t[N];
        for (int i = 0; i < N; i++) {
            seq_init(&t[i], i, 4, 5, 0);
            t[i].q.priority = in[i].priority;
            t[i].q.t_arrival = in[i].t;
            add(&h, &t[i]);
        }
        int order[N];
        admission_order(&h, t, N, order);
        const int *want = aged ? want_aged : want_plain;
        for (int i = 0; i < N; i++)
            if (order[i] != want[i]) {
                print_error("aging %d: position %d ran seq %d, expected %d\n", aged, i, order[i], want[i]);
                fail();
            }
        h_close(&h);
    }
}

/* Bucket grouping stays inside the first sequence's priority: a same-bucket sequence of a lower
 * priority does not take the slot of a higher one from another bucket. */
static void test_priority_bucket_mates(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(2, 1000, 512);
    h_open(&h, 256, 4, false, &o);
    struct tseq a, lo, b;
    seq_init(&a, 0, 100, 102, 0);  /* bucket 64..127 */
    seq_init(&lo, 1, 110, 112, 0); /* same bucket, priority -1 */
    seq_init(&b, 2, 5, 7, 0);      /* bucket 4..7 */
    lo.q.priority = -1;
    add(&h, &a);
    add(&h, &lo);
    add(&h, &b);
    struct sched_out out;
    h_step(&h, &out);
    assert_int_equal(out.n_items, 2);
    assert_ptr_equal(out.items[0].seq, &a.q);
    assert_ptr_equal(out.items[1].seq, &b.q);
    assert_int_equal(lo.q.state, SCHED_WAITING);
    h_close(&h);
}

/* Growth preempts the lowest priority first, even when it is the oldest, and the victim waits at
 * the front of its priority only: a waiting higher one is readmitted first. */
static void test_priority_preemption(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(8, 64, 256);
    o.admission_reserve = 0;
    h_open(&h, 10, 4, false, &o); /* 40 token slots */
    struct tseq lo, b, c, d;
    seq_init(&lo, 0, 12, 24, 0); /* 3 blocks, grows to 6 */
    seq_init(&b, 1, 12, 24, 0);
    seq_init(&c, 2, 12, 24, 0);
    seq_init(&d, 3, 4, 8, 0);
    lo.q.priority = -1;
    add(&h, &lo);
    add(&h, &b);
    add(&h, &c);
    struct sched_out out;
    h_step(&h, &out); /* 9 of 10 blocks */
    assert_int_equal(out.n_items, 3);
    assert_ptr_equal(out.items[0].seq, &b.q); /* running order: priority, then arrival */
    assert_ptr_equal(out.items[2].seq, &lo.q);
    add(&h, &d); /* priority 0, waits behind nobody of its priority */
    h_step(&h, &out);
    assert_int_equal(out.n_preempted, 1);
    assert_ptr_equal(out.preempted[0], &lo.q); /* by arrival it would have been c */
    bool d_ran = false;
    for (int s = 0; s < 300 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        d_ran = d_ran || item_of(&out, &d) >= 0;
        if (item_of(&out, &lo) >= 0 && lo.q.n_preemptions == 1 && !d_ran) {
            print_error("the preempted priority -1 sequence ran again before the waiting priority 0 one\n");
            fail();
        }
        for (int i = 0; i < out.n_preempted; i++)
            assert_ptr_not_equal(out.preempted[i], &b.q); /* the first running one always progresses */
    }
    assert_true(lo.finished && b.finished && c.finished && d.finished);
    assert_int_equal(kv_num_free(h.kv), 10);
    h_close(&h);
}

/* With aging the running order is the admission order: a priority -1 sequence that has waited past
 * younger priority 0 ones runs first and is not their victim; the youngest is. */
static void test_priority_preemption_aged(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(8, 64, 256);
    o.admission_reserve = 0;
    o.priority_aging_s = 10;
    h_open(&h, 10, 4, false, &o); /* 40 token slots */
    struct tseq lo, b, c;
    seq_init(&lo, 0, 12, 24, 0); /* 3 blocks, grows to 6 */
    seq_init(&b, 1, 12, 24, 0);
    seq_init(&c, 2, 12, 24, 0);
    lo.q.priority = -1;
    lo.q.t_arrival = 0; /* ranks like a priority 0 sequence that arrived at 10 */
    b.q.t_arrival = c.q.t_arrival = 100;
    add(&h, &lo);
    add(&h, &b);
    add(&h, &c);
    struct sched_out out;
    h_step(&h, &out); /* 9 of 10 blocks */
    assert_int_equal(out.n_items, 3);
    assert_ptr_equal(out.items[0].seq, &lo.q);
    h_step(&h, &out);
    assert_int_equal(out.n_preempted, 1);
    assert_ptr_equal(out.preempted[0], &c.q); /* without aging it would have been lo */
    for (int s = 0; s < 300 && sched_has_work(h.s); s++) {
        h_step(&h, &out);
        for (int i = 0; i < out.n_preempted; i++)
            assert_ptr_not_equal(out.preempted[i], &lo.q);
    }
    assert_true(lo.finished && b.finished && c.finished);
    assert_int_equal(kv_num_free(h.kv), 10);
    h_close(&h);
}

/* Random arrivals, lengths, budgets, tiny pools, prefix sharing and cancellations (and, with prio,
 * priorities -1..1 with or without aging); the invariants hold after every step and everything
 * finishes. */
static void stress(bool prefix, bool prio, unsigned seed)
{
    srand(seed);
    enum { N = 120 };
    int bs = 1 << (rand() % 4); /* 1..8 */
    int nb = 12 + rand() % 40;
    struct sched_opts o = opts(1 + rand() % 12, 4 + rand() % 60, nb * bs);
    o.long_prefill_chunk = rand() % 3 ? 0 : 1 + rand() % 16;
    o.watermark_blocks = rand() % 3;
    o.admission_reserve = (rand() % 3) * 0.5;
    o.num_lanes = 1 + rand() % 2;
    o.lanes[1].max_num_seqs = rand() % 4;
    o.lanes[1].max_num_batched_tokens = rand() % 20;
    o.priority_aging_s = prio ? (rand() % 3) * 2.5 : 0;
    struct harness h;
    h_open(&h, nb, bs, prefix, &o);
    struct tseq *t = calloc(N, sizeof *t);
    int next = 0, cancelled = 0;
    struct sched_out out;
    int steps = 0;
    while ((next < N || sched_has_work(h.s)) && steps < 20000) {
        steps++;
        for (int k = rand() % 4; k > 0 && next < N; k--) {
            int cap = nb * bs < MAXTOK ? nb * bs : MAXTOK;
            int np = 1 + rand() % (cap / 2);
            int target = np + 1 + rand() % (cap - np);
            seq_init(&t[next], next, np, target, rand() % o.num_lanes);
            t[next].q.priority = prio ? rand() % 3 - 1 : 0;
            t[next].q.t_arrival = steps * 0.5; /* a step takes half a second */
            if (prefix && rand() % 2) /* share a family prefix */
                for (int i = 0; i < np; i++)
                    t[next].toks[i] = (int32_t)(7 + (next % 3) * 1000 + (i < 3 * bs ? i : 100 + next + i));
            add(&h, &t[next]);
            next++;
        }
        if (rand() % 60 == 0 && next > 0) { /* cancel somebody */
            struct tseq *v = &t[rand() % next];
            if (!v->finished) {
                sched_finish(h.s, &v->q);
                v->finished = true;
                cancelled++;
            }
        }
        int first_running = -1; /* by effective priority (t_arrival - priority * aging), then arrival */
        for (int i = 0; i < next; i++) {
            const struct sched_seq *q = &t[i].q, *f = first_running < 0 ? NULL : &t[first_running].q;
            if (q->state != SCHED_RUNNING)
                continue;
            double kq = q->t_arrival - q->priority * o.priority_aging_s;
            double kf = f ? f->t_arrival - f->priority * o.priority_aging_s : 0;
            bool before = !f || (q->priority == f->priority ? q->arrival < f->arrival
                                 : o.priority_aging_s == 0  ? q->priority > f->priority
                                 : kq != kf                 ? kq < kf
                                                            : q->arrival < f->arrival);
            if (before)
                first_running = i;
        }
        int running_before = sched_num_running(h.s, -1);
        h_step(&h, &out);
        /* budgets and caps */
        assert_true(out.n_tokens <= o.max_num_batched_tokens);
        assert_true(out.n_items <= o.max_num_seqs);
        assert_true(sched_num_running(h.s, -1) <= o.max_num_seqs);
        int lt[2] = {0, 0}, ln[2] = {0, 0};
        for (int i = 0; i < out.n_items; i++) {
            lt[out.items[i].seq->lane] += out.items[i].n_new;
            ln[out.items[i].seq->lane]++;
            if (o.long_prefill_chunk && out.items[i].n_new > 1)
                assert_true(out.items[i].n_new <= o.long_prefill_chunk);
        }
        if (o.num_lanes > 1 && o.lanes[1].max_num_batched_tokens)
            assert_true(lt[1] <= o.lanes[1].max_num_batched_tokens);
        if (o.num_lanes > 1 && o.lanes[1].max_num_seqs)
            assert_true(sched_num_running(h.s, 1) <= o.lanes[1].max_num_seqs);
        /* never the first running one */
        for (int i = 0; i < out.n_preempted; i++)
            assert_true(first_running < 0 || out.preempted[i] != &t[first_running].q);
        /* progress: a step with running sequences always runs something */
        if (running_before > 0)
            assert_true(out.n_items > 0 || out.n_failed > 0);
        /* blocks: refcounts equal the tables that list them; waiting ones hold none */
        char err[256];
        if (kv_check(h.kv, err, sizeof err)) {
            print_error("kv_check: %s\n", err);
            fail();
        }
        int *refs = calloc((size_t)nb, sizeof *refs);
        for (int i = 0; i < next; i++) {
            if (t[i].q.state == SCHED_RUNNING) {
                assert_true(t[i].q.kv.n_blocks >= kv_blocks_for(h.kv, t[i].q.n_computed));
                for (int j = 0; j < t[i].q.kv.n_blocks; j++)
                    refs[t[i].q.kv.blocks[j]]++;
            } else {
                assert_int_equal(t[i].q.kv.n_blocks, 0);
            }
        }
        for (int b = 0; b < nb; b++)
            if (refs[b] != kv_refcount(h.kv, b)) {
                print_error("block %d: %d tables list it, refcount %d\n", b, refs[b], kv_refcount(h.kv, b));
                fail();
            }
        free(refs);
    }
    for (int i = 0; i < N; i++)
        if (!t[i].finished) {
            print_error("seq %d never finished (seed %u, %d steps)\n", i, seed, steps);
            fail();
        }
    assert_int_equal(kv_num_free(h.kv), nb);
    assert_int_equal(sched_num_running(h.s, -1), 0);
    (void)cancelled;
    h_close(&h);
    free(t);
}

/* Isolated sequences run one at a time; the unisolated ones behind them in arrival order are
 * admitted meanwhile, and the next isolated one starts once the first finishes. */
static void test_isolation(void **state)
{
    (void)state;
    struct harness h;
    struct sched_opts o = opts(8, 100, 256);
    h_open(&h, 64, 4, false, &o);
    struct tseq t[5];
    for (int i = 0; i < 5; i++) {
        seq_init(&t[i], i, 5, i == 0 ? 7 : 12, 0);
        t[i].q.isolated = i < 3; /* t0, t1, t2 isolated; t3, t4 not */
        add(&h, &t[i]);
    }
    struct sched_out out;
    h_step(&h, &out);
    assert_int_equal(out.n_items, 3); /* t0, t3, t4 */
    assert_true(item_of(&out, &t[0]) >= 0 && item_of(&out, &t[3]) >= 0 && item_of(&out, &t[4]) >= 0);
    assert_int_equal(item_of(&out, &t[1]), -1);
    assert_int_equal(sched_num_waiting(h.s, -1), 2);
    while (!t[0].finished) {
        assert_int_equal(item_of(&out, &t[1]), -1);
        assert_int_equal(item_of(&out, &t[2]), -1);
        h_step(&h, &out);
    }
    h_step(&h, &out); /* t0 gone: t1 (first in arrival order), not t2 */
    assert_true(item_of(&out, &t[1]) >= 0);
    assert_int_equal(item_of(&out, &t[2]), -1);
    assert_int_equal(sched_num_running(h.s, -1), 3);
    h_close(&h);
}

static void test_stress(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 30; seed++) {
        stress(false, false, seed);
        stress(true, false, 1000 + seed);
        stress(seed % 2, true, 2000 + seed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_add_errors),
        cmocka_unit_test(test_budget_and_max_num_seqs),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_bucket_grouping),
        cmocka_unit_test(test_arrival_fairness),
        cmocka_unit_test(test_preemption_and_recompute),
        cmocka_unit_test(test_preempted_goes_first),
        cmocka_unit_test(test_admission_reserve),
        cmocka_unit_test(test_never_fits),
        cmocka_unit_test(test_lookahead),
        cmocka_unit_test(test_lanes),
        cmocka_unit_test(test_prefix_cache_admission),
        cmocka_unit_test(test_priority_order),
        cmocka_unit_test(test_priority_bucket_mates),
        cmocka_unit_test(test_priority_preemption),
        cmocka_unit_test(test_priority_preemption_aged),
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
