/* The CUDA backend refuses a Qwen3-MoE model at open while its MoE path is not wired
 * (docs/CUDA_BACKEND.md, "Mixture of experts"), with a message that names the MoE layers and points at
 * the CPU backend, before it touches the device (so it holds without a GPU too). Builds without CUDA
 * skip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "engine/gpu.h"
#include "engine/util/log.h"

#include "cpu_test.h"

static void test_refused(void **state)
{
    (void)state;
    struct tiny_opts o = tiny_opts_default();
    o.hidden = 128, o.heads = 2, o.kv_heads = 1, o.head_dim = 64, o.layers = 3;
    o.experts = 4, o.experts_per_token = 2, o.moe_intermediate = 64, o.decoder_sparse_step = 2;
    struct cpu_test_fixture f;
    cpu_test_fixture_open(&f, &o, "moecuda");
    struct backend_opts bo = cpu_test_opts(16, 4, 256, 256);
    bo.kv_dtype = DT_BF16;
    char err[512] = "";
    struct backend *be = backend_open("cuda", f.m, &bo, err, sizeof err);
    assert_null(be);
    assert_string_equal(err, "Qwen3MoeForCausalLM: 1 of 3 layers are mixture-of-experts (4 experts, 2 per "
                             "token); the CUDA backend does not run MoE layers yet (the CPU backend does: "
                             "engine.backend cpu)");
    cpu_test_fixture_close(&f);
}

int main(void)
{
    if (!gpu_backend_built()) {
        printf("SKIPPED: this llmq was built without the CUDA backend\n");
        return 77;
    }
    log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
