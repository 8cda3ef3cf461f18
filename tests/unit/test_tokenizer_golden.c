/* engine/tokenizer with the real Qwen3 tokenizer against Hugging Face tokenizers itself: every
 * line of tests/fixtures/tokenizer/qwen3_encode.jsonl ({"text", "ids", "decoded",
 * "decoded_skip_special"}, made by make_fixtures.py from the corpus in corpus.jsonl) must match
 * exactly: the ids without and with special tokens (Qwen3 adds none), both decodings, and both
 * again through the streaming decoder, id by id (tests/tok_encode_golden.h).
 * A missing or stale fixture is a failure, not a skip; only a missing tokenizer asset skips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tok_encode_golden.h"

static void test_golden(void **state)
{
    assert_int_equal(tok_encode_golden_check("qwen3"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
