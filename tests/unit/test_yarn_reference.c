/* YaRN on the CPU backend against Hugging Face transformers, at positions past the native length.
 *
 * For each entry of models.json's "yarn_models" (a tiny Qwen3 with rope_scaling yarn, factor 4
 * over a native 256, prompts of up to 1000 tokens) the test re-creates the checkpoint with `llmq
 * make-tiny-model` (its sha256 must equal the fixture's), and compares greedy continuations with
 * tests/fixtures/models/<name>.jsonl (made by make_hf_fixtures.py in fp32) twice:
 *   - "config": config.json carries the entry's rope_scaling, as transformers read it;
 *   - "by max_model_len": config.json has no rope_scaling and max_position_embeddings 256, and the
 *     engine runs with max_model_len 1024, so llmq enables the same YaRN itself
 *     (model_config_extend_rope): the "enabled by model.max_model_len above the native
 *     length" against transformers' own numbers.
 * Generated ids must be equal and every logprob (chosen and top-5) within 1e-3, the bar of
 * test_hf_reference.c (a wrong ramp, factor or attention factor moves them by > 0.1).
 * Each in one batch with a large budget and in a chunked run (block size 8, budget 200 tokens).
 * Until the goldens exist (generated on the GPU machine) the test is skipped, saying so. Reading the
 * goldens, making the checkpoint and the comparison are tests/hf_golden.h's. */
#include <setjmp.h> /* before cmocka.h */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <stdio.h>

#include "cpu_test.h"
#include "hf_golden.h"

static void run_and_compare(struct hf_goldens *f, const char *label, int block_size, int budget)
{
    struct model *m;
    struct tok *tok;
    cpu_test_load_dir(f->dir, &m, &tok);
    struct engine_opts o = hf_golden_engine_opts(
        block_size, budget, (int)json_integer_value(json_object_get(f->entry, "max_model_len")));
    double worst = hf_golden_compare(f, m, tok, &o, 0, f->n, label);
    int past = 0;
    for (int i = 0; i < f->n; i++)
        past += f->g[i].n_prompt > 256;
    assert_true(past > 0); /* the point: positions past the native length */
    printf("%-12s %-28s %d prompts (%d past 256 tokens): ids equal, max |dlogprob| %.2e\n", f->name, label,
           f->n, past, worst);
    tok_free(tok);
    model_free(m);
}

static void test_entry(void **state)
{
    struct hf_goldens f;
    hf_goldens_load(&f, *state);
    /* the keys of the entry's config written into config.json, as make_hf_fixtures.py does */
    cpu_test_set_config(f.dir, json_object_get(f.entry, "config"));
    run_and_compare(&f, "config rope_scaling, batch", 16, 4096);
    run_and_compare(&f, "config rope_scaling, chunked", 8, 200);
    cpu_test_set_config(f.dir, json_object_get(f.entry, "native_config"));
    run_and_compare(&f, "by max_model_len, batch", 16, 4096);
    run_and_compare(&f, "by max_model_len, chunked", 8, 200);
    hf_goldens_free(&f);
}

int main(void)
{
    return hf_golden_main("yarn_reference", "yarn_models", "yarnref", true, test_entry);
}
