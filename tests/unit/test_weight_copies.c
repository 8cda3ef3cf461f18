/* engine.decode_weight_copies' rule (engine/weight_copies.h): on and off as told, auto only where the
 * KV cache beside the copies still holds what it must, with the cap of kv_cache_bytes / num_kv_blocks
 * and whole blocks counted; the reason in words either way. */
#include <string.h>

#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine/weight_copies.h"

#define GB 1e9
#define BLOCK (32 * 160.0 * 1024) /* Qwen3-14B bf16: 32 tokens of 160 KiB */

/* Qwen3-14B fp8 on an H200 after weights and activations: ~115 GB for the cache, copies 14.77 GB */
static struct weight_copies_in base(void)
{
    struct weight_copies_in in = {
        .mode = BE_COPIES_AUTO,
        .copy_bytes = 14.77 * GB,
        .kv_budget = 115 * GB,
        .kv_cap = 0,
        .block_bytes = BLOCK,
        .block_size = 32,
        .need_tokens = 512 * 640,
    };
    return in;
}

static void test_auto_fits(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    char why[256];
    assert_int_equal(weight_copies_decide(&in, why, sizeof why), 1);
    assert_non_null(strstr(why, "auto"));
    assert_non_null(strstr(why, "327680")); /* what the cache must hold, in tokens */
}

static void test_auto_too_little_cache(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    in.need_tokens = 512LL * 40960; /* the default max_model_len: far beyond the device */
    char why[256];
    assert_int_equal(weight_copies_decide(&in, why, sizeof why), 0);
    assert_non_null(strstr(why, "less than"));
    /* on: whatever the cache loses */
    in.mode = BE_COPIES_ON;
    assert_int_equal(weight_copies_decide(&in, why, sizeof why), 1);
    assert_non_null(strstr(why, "on"));
}

/* the boundary in whole blocks: exactly enough tokens beside the copies is enough, one block less is not */
static void test_auto_boundary(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    in.kv_budget = in.copy_bytes + 100 * BLOCK + BLOCK / 2; /* 100 whole blocks beside the copies */
    in.need_tokens = 100 * 32;
    assert_int_equal(weight_copies_decide(&in, NULL, 0), 1);
    in.need_tokens = 100 * 32 + 1;
    assert_int_equal(weight_copies_decide(&in, NULL, 0), 0);
    /* a budget smaller than the copies themselves */
    in.kv_budget = in.copy_bytes / 2;
    in.need_tokens = 1;
    assert_int_equal(weight_copies_decide(&in, NULL, 0), 0);
}

/* a cap (kv_cache_bytes, num_kv_blocks) bounds the cache whether or not the copies are there: copies
 * that fit beside the capped cache cost nothing, copies that cut into it are not made */
static void test_auto_cap(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    in.kv_cap = 200 * BLOCK;
    in.need_tokens = 200 * 32; /* num_kv_blocks 200 */
    assert_int_equal(weight_copies_decide(&in, NULL, 0), 1);
    in.kv_budget = in.copy_bytes + 199 * BLOCK; /* the 200 blocks would not fit beside the copies */
    assert_int_equal(weight_copies_decide(&in, NULL, 0), 0);
}

static void test_off(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    char why[256];
    in.mode = BE_COPIES_OFF;
    assert_int_equal(weight_copies_decide(&in, why, sizeof why), 0);
    assert_non_null(strstr(why, "off"));
}

/* nothing of a shape the copies take (fp16 mode, unaligned matrices): never, whatever the mode */
static void test_nothing_to_copy(void **state)
{
    (void)state;
    struct weight_copies_in in = base();
    in.copy_bytes = 0;
    for (int mode = BE_COPIES_AUTO; mode <= BE_COPIES_OFF; mode++) {
        in.mode = (enum be_copies)mode;
        assert_int_equal(weight_copies_decide(&in, NULL, 0), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_fits),     cmocka_unit_test(test_auto_too_little_cache),
        cmocka_unit_test(test_auto_boundary), cmocka_unit_test(test_auto_cap),
        cmocka_unit_test(test_off),           cmocka_unit_test(test_nothing_to_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
