/* engine/kv_blocks: allocation, reference counts, exhaustion, block tables, the prefix cache
 * (hits, partial hits, LRU eviction order, duplicates) and a random run against a shadow model
 * of every block's reference count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_blocks.h"

static struct kv_pool *pool(int n, int bs, bool prefix)
{
    char err[256] = "";
    struct kv_pool *p = kv_pool_create(n, bs, prefix, err, sizeof err);
    if (!p) {
        print_error("kv_pool_create: %s\n", err);
        fail();
    }
    return p;
}

static void check(const struct kv_pool *p)
{
    char err[256] = "";
    if (kv_check(p, err, sizeof err)) {
        print_error("kv_check: %s\n", err);
        fail();
    }
}

static void test_create_errors(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(kv_pool_create(0, 16, false, err, sizeof err));
    assert_non_null(strstr(err, "blocks"));
    assert_null(kv_pool_create(4, 0, false, err, sizeof err));
    kv_pool_free(NULL);
}

static void test_alloc_free_exhaustion(void **state)
{
    (void)state;
    struct kv_pool *p = pool(8, 4, false);
    int seen[8] = {0};
    int32_t ids[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = kv_alloc(p);
        assert_true(ids[i] >= 0 && ids[i] < 8);
        assert_int_equal(seen[ids[i]]++, 0); /* never handed out twice */
        assert_int_equal(kv_refcount(p, ids[i]), 1);
        assert_int_equal(kv_num_free(p), 7 - i);
        check(p);
    }
    assert_int_equal(kv_alloc(p), -1);
    kv_unref(p, ids[3]);
    assert_int_equal(kv_num_free(p), 1);
    assert_int_equal(kv_alloc(p), ids[3]);
    assert_int_equal(kv_alloc(p), -1);
    for (int i = 0; i < 8; i++)
        kv_unref(p, ids[i]);
    assert_int_equal(kv_num_free(p), 8);
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.free, 8);
    assert_int_equal(st.num_blocks, 8);
    assert_int_equal(st.block_size, 4);
    check(p);
    kv_pool_free(p);
}

static void test_refcount_sharing(void **state)
{
    (void)state;
    struct kv_pool *p = pool(2, 4, false);
    int32_t b = kv_alloc(p);
    kv_ref(p, b);
    kv_ref(p, b);
    assert_int_equal(kv_refcount(p, b), 3);
    kv_unref(p, b);
    kv_unref(p, b);
    assert_int_equal(kv_num_free(p), 1); /* still held once */
    check(p);
    kv_unref(p, b);
    assert_int_equal(kv_num_free(p), 2);
    check(p);
    kv_pool_free(p);
}

static void test_tables(void **state)
{
    (void)state;
    struct kv_pool *p = pool(10, 4, false);
    assert_int_equal(kv_blocks_for(p, 0), 0);
    assert_int_equal(kv_blocks_for(p, 1), 1);
    assert_int_equal(kv_blocks_for(p, 4), 1);
    assert_int_equal(kv_blocks_for(p, 5), 2);
    struct kv_table a, b;
    kv_table_init(&a);
    kv_table_init(&b);
    assert_int_equal(kv_table_grow(p, &a, 5), 0); /* 2 blocks */
    assert_int_equal(a.n_blocks, 2);
    assert_int_equal(kv_table_grow(p, &a, 8), 0); /* still 2 */
    assert_int_equal(a.n_blocks, 2);
    assert_int_equal(kv_table_grow(p, &a, 9), 0);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(kv_table_grow(p, &b, 28), 0); /* 7 blocks: the pool is full */
    assert_int_equal(kv_num_free(p), 0);
    /* all or nothing */
    assert_int_equal(kv_table_grow(p, &a, 13), -1);
    assert_int_equal(a.n_blocks, 3);
    for (int i = 0; i < a.n_blocks; i++)
        for (int j = 0; j < b.n_blocks; j++)
            assert_int_not_equal(a.blocks[i], b.blocks[j]);
    check(p);
    kv_table_release(p, &b);
    assert_int_equal(b.n_blocks, 0);
    assert_int_equal(kv_num_free(p), 7);
    assert_int_equal(kv_table_grow(p, &a, 40), 0); /* 10 blocks: grows in place */
    assert_int_equal(a.n_blocks, 10);
    kv_table_release(p, &a);
    assert_int_equal(kv_num_free(p), 10);
    check(p);
    kv_table_free(&a);
    kv_table_free(&b);
    kv_pool_free(p);
}

/* Tokens 0..n-1 with `seed` mixed in from position `from`. */
static void fill(int32_t *t, int n, int from, int seed)
{
    for (int i = 0; i < n; i++)
        t[i] = i < from ? 1000 + i : 5000 + seed * 100 + i;
}

static void test_prefix_hit_and_share(void **state)
{
    (void)state;
    const int bs = 4;
    struct kv_pool *p = pool(16, bs, true);
    int32_t ta[14], tb[14];
    fill(ta, 14, 14, 0);
    fill(tb, 14, 9, 1); /* shares blocks 0 and 1 (positions 0..7) and one token of block 2 */
    struct kv_table a, b;
    kv_table_init(&a);
    kv_table_init(&b);
    /* a: nothing cached yet */
    assert_int_equal(kv_table_match(p, &a, ta, 13), 0);
    assert_int_equal(kv_table_grow(p, &a, 14), 0);
    /* only computed full blocks are registered */
    assert_int_equal(kv_table_commit(p, &a, ta, 7), 0);
    assert_int_equal(a.n_registered, 1);
    assert_int_equal(kv_table_commit(p, &a, ta, 14), 0);
    assert_int_equal(a.n_registered, 3);
    check(p);
    /* b while a runs: shares a's first two blocks */
    assert_int_equal(kv_table_match(p, &b, tb, 13), 8);
    assert_int_equal(b.n_blocks, 2);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    assert_int_equal(kv_refcount(p, a.blocks[0]), 2);
    assert_int_equal(kv_refcount(p, a.blocks[2]), 1);
    assert_int_equal(kv_table_grow(p, &b, 14), 0);
    assert_int_not_equal(b.blocks[2], a.blocks[2]);
    check(p);
    /* a ends: its blocks stay cached (block 2 and its partial block 3: only block 2 is full) */
    kv_table_release(p, &a);
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_int_equal(st.cached, 1); /* block 2 of a; blocks 0, 1 still used by b */
    assert_int_equal(st.used, 4);   /* b's 4 blocks */
    check(p);
    /* a again: the whole cached prefix comes back, capped at full blocks within n_tokens */
    assert_int_equal(kv_table_match(p, &a, ta, 13), 12);
    assert_int_equal(a.n_blocks, 3);
    kv_table_release(p, &a);
    assert_int_equal(kv_table_match(p, &a, ta, 11), 8); /* block 2 ends at 12 > 11 */
    kv_table_release(p, &a);
    kv_get_stats(p, &st);
    assert_true(st.hits >= 2 + 3 + 2);
    assert_true(st.queries > st.hits);
    kv_table_release(p, &b);
    kv_table_free(&a);
    kv_table_free(&b);
    check(p);
    kv_pool_free(p);
}

static void test_prefix_off(void **state)
{
    (void)state;
    struct kv_pool *p = pool(8, 4, false);
    int32_t t[12];
    fill(t, 12, 12, 0);
    struct kv_table a;
    kv_table_init(&a);
    assert_int_equal(kv_table_grow(p, &a, 12), 0);
    assert_int_equal(kv_table_commit(p, &a, t, 12), 0);
    kv_table_release(p, &a);
    assert_int_equal(kv_table_match(p, &a, t, 12), 0);
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_int_equal(st.cached, 0);
    kv_table_free(&a);
    kv_pool_free(p);
}

static void test_lru_eviction(void **state)
{
    (void)state;
    const int bs = 2;
    struct kv_pool *p = pool(6, bs, true);
    int32_t ta[6], tb[4];
    fill(ta, 6, 0, 1);
    fill(tb, 4, 0, 2);
    struct kv_table a, b, c;
    kv_table_init(&a);
    kv_table_init(&b);
    kv_table_init(&c);
    assert_int_equal(kv_table_grow(p, &a, 6), 0);
    kv_table_commit(p, &a, ta, 6);
    assert_int_equal(kv_table_grow(p, &b, 4), 0);
    kv_table_commit(p, &b, tb, 4);
    int32_t a0 = a.blocks[0], a1 = a.blocks[1], a2 = a.blocks[2];
    kv_table_release(p, &a); /* LRU now: a2 a1 a0 (a's tail goes first) */
    kv_table_release(p, &b); /* then b1 b0 */
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_int_equal(st.cached, 5);
    assert_int_equal(st.free, 6);
    /* the never-cached block goes first, then the LRU order */
    int32_t first = kv_alloc(p);
    kv_get_stats(p, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(kv_alloc(p), a2);
    assert_int_equal(kv_alloc(p), a1);
    kv_get_stats(p, &st);
    assert_int_equal(st.evictions, 2);
    (void)first;
    check(p);
    /* a's first block survives; its second does not, so the match stops there */
    assert_int_equal(kv_table_match(p, &c, ta, 6), 2);
    assert_int_equal(c.blocks[0], a0);
    kv_table_release(p, &c);
    kv_table_free(&c); /* a table's hashes belong to its tokens: a fresh one for other tokens */
    /* b still fully cached; a hit moves its blocks out of the LRU list */
    assert_int_equal(kv_table_match(p, &c, tb, 4), 4);
    kv_get_stats(p, &st);
    assert_int_equal(st.cached, 1); /* a0 */
    check(p);
    kv_table_release(p, &c);
    kv_table_free(&a);
    kv_table_free(&b);
    kv_table_free(&c);
    kv_pool_free(p);
}

static void test_duplicate_content(void **state)
{
    (void)state;
    struct kv_pool *p = pool(8, 4, true);
    int32_t t[8];
    fill(t, 8, 8, 0);
    struct kv_table a, b, c;
    kv_table_init(&a);
    kv_table_init(&b);
    kv_table_init(&c);
    /* both compute the same prefix at once (neither found it cached) */
    assert_int_equal(kv_table_grow(p, &a, 8), 0);
    assert_int_equal(kv_table_grow(p, &b, 8), 0);
    kv_table_commit(p, &a, t, 8);
    kv_table_commit(p, &b, t, 8);
    check(p);
    kv_table_release(p, &a);
    kv_table_release(p, &b);
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_int_equal(st.cached, 2); /* one copy of each block */
    assert_int_equal(kv_table_match(p, &c, t, 8), 8);
    check(p);
    kv_table_release(p, &c);
    kv_table_free(&a);
    kv_table_free(&b);
    kv_table_free(&c);
    kv_pool_free(p);
}

/* A different token anywhere in an earlier block breaks every later block's match, even when the
 * later blocks' own tokens are equal (the chain hash covers the whole prefix). */
static void test_chain_hash(void **state)
{
    (void)state;
    struct kv_pool *p = pool(8, 2, true);
    int32_t ta[6] = {1, 2, 3, 4, 5, 6}, tb[6] = {9, 2, 3, 4, 5, 6};
    struct kv_table a, b;
    kv_table_init(&a);
    kv_table_init(&b);
    assert_int_equal(kv_table_grow(p, &a, 6), 0);
    kv_table_commit(p, &a, ta, 6);
    assert_int_equal(kv_table_match(p, &b, tb, 6), 0);
    assert_int_not_equal(kv_hash_block(KV_HASH_ROOT, ta, 2), kv_hash_block(KV_HASH_ROOT, tb, 2));
    assert_int_not_equal(kv_hash_block(1, ta + 2, 2), kv_hash_block(2, ta + 2, 2));
    kv_table_release(p, &a);
    kv_table_free(&a);
    kv_table_free(&b);
    kv_pool_free(p);
}

/* Random tables growing, committing, matching and releasing; every block's reference count must
 * equal the number of tables that list it, and a matched block must hold the same tokens. */
static void test_random_against_shadow(void **state)
{
    (void)state;
    enum { NB = 40, BS = 4, NT = 12, MAXTOK = 48 };
    struct kv_pool *p = pool(NB, BS, true);
    struct kv_table t[NT];
    int32_t toks[NT][MAXTOK];
    int ntok[NT], ncomp[NT];
    bool active[NT] = {false};
    /* what each physical block holds, as the tables that wrote it say: -1 unknown */
    int32_t content[NB][BS];
    memset(content, 0xff, sizeof content);
    for (int i = 0; i < NT; i++) {
        kv_table_init(&t[i]);
        ntok[i] = ncomp[i] = 0;
    }
    srand(1234);
    for (int it = 0; it < 20000; it++) {
        int i = rand() % NT, op = rand() % 10;
        if (!active[i]) {
            active[i] = true;
            /* start: tokens from a small alphabet so prefixes repeat */
            ntok[i] = 1 + rand() % MAXTOK;
            int fam = rand() % 3;
            for (int k = 0; k < ntok[i]; k++)
                toks[i][k] = k < 16 ? fam * 7 + k % 5 : rand() % 4;
            kv_table_free(&t[i]); /* new tokens: the old hashes must go */
            int hit = kv_table_match(p, &t[i], toks[i], ntok[i] - 1);
            assert_true(hit >= 0 && hit % BS == 0 && hit <= ntok[i] - 1);
            for (int k = 0; k < hit; k++)
                assert_int_equal(content[t[i].blocks[k / BS]][k % BS], toks[i][k]);
            ncomp[i] = hit;
        } else if (op < 7 && ncomp[i] < ntok[i]) {
            int upto = ncomp[i] + 1 + rand() % (ntok[i] - ncomp[i]);
            if (kv_table_grow(p, &t[i], upto) == 0) {
                for (int k = ncomp[i]; k < upto; k++) /* "compute" K/V: the block now holds the tokens */
                    content[t[i].blocks[k / BS]][k % BS] = toks[i][k];
                ncomp[i] = upto;
                assert_int_equal(kv_table_commit(p, &t[i], toks[i], ncomp[i]), 0);
            }
        } else {
            kv_table_release(p, &t[i]);
            ncomp[i] = 0;
            active[i] = false;
        }
        if (it % 97 == 0) {
            check(p);
            int refs[NB] = {0};
            for (int k = 0; k < NT; k++)
                for (int j = 0; j < t[k].n_blocks; j++)
                    refs[t[k].blocks[j]]++;
            int used = 0;
            for (int b = 0; b < NB; b++) {
                assert_int_equal(refs[b], kv_refcount(p, b));
                used += refs[b] > 0;
            }
            assert_int_equal(used + kv_num_free(p), NB);
        }
    }
    for (int i = 0; i < NT; i++) {
        kv_table_release(p, &t[i]);
        kv_table_free(&t[i]);
    }
    assert_int_equal(kv_num_free(p), NB);
    check(p);
    struct kv_stats st;
    kv_get_stats(p, &st);
    assert_true(st.hits > 100); /* the run did exercise sharing */
    assert_true(st.evictions > 10);
    kv_pool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_errors),        cmocka_unit_test(test_alloc_free_exhaustion),
        cmocka_unit_test(test_refcount_sharing),     cmocka_unit_test(test_tables),
        cmocka_unit_test(test_prefix_hit_and_share), cmocka_unit_test(test_prefix_off),
        cmocka_unit_test(test_lru_eviction),         cmocka_unit_test(test_duplicate_content),
        cmocka_unit_test(test_chain_hash),           cmocka_unit_test(test_random_against_shadow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
