/* The CPU backend's Qwen3-MoE against Hugging Face transformers (fp32, eager attention).
 *
 * For each checkpoint of tests/fixtures/models/models.json's "moe_models" (every layer MoE and tied;
 * dense and MoE layers mixed by mlp_only_layers with norm_topk_prob false; decoder_sparse_step 2 with
 * one expert per token) the test re-creates it with `llmq make-tiny-model --experts ...` (the sha256 of
 * model.safetensors must equal the one the goldens were made from) and compares every prompt's greedy
 * continuation as test_hf_reference.c does: ids exactly, the chosen and top-5 logprobs within 1e-3
 * (HF_GOLDEN_TOL). Three runs per model: all prompts in one batch, one by one, and chunked with a small
 * token budget so prompt chunks share steps with decodes (the MoE rows of a step are grouped by expert
 * across sequences). The goldens come from make_hf_fixtures.py on the GPU machine; while they are
 * missing the test is skipped with the command that makes them. */
#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdio.h>

#include "cpu_test.h"
#include "hf_golden.h"

static void test_model(void **state)
{
    const struct model_config c = hf_golden_runs(*state, 96);
    assert_true(model_moe_layers(&c) > 0);
}

int main(void)
{
    return hf_golden_main("hf_reference_moe", "moe_models", "hfmoe", true, test_model);
}
