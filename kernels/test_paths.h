/* Entries for the kernel tests (tests/gpu/) only: each reaches a path that the automatic rule takes only
 * on another device, or when a resource is missing, so that one test machine checks every path the engine
 * can take. The engine never calls them. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* The prefill attention kernel the next k_attention_prefill(_fp8) calls in this process take:
 *   K_TEST_PREFILL_AUTO     the automatic choice (the default);
 *   K_TEST_PREFILL_MMA      the mma.sync kernel: what a device without wgmma runs (sm_80, or a build
 *                           without sm_90a), and every device at D = 64;
 *   K_TEST_PREFILL_CPASYNC  the wgmma kernel (sm_90a, D = 128) with its 16-bit K/V tiles loaded by cp.async
 *                           and no warp specialization: what runs where no tensor map can be made (a
 *                           driver without cuTensorMapEncodeTiled, a block size below 8). An fp8 cache's
 *                           wgmma kernel always loads so; it is K_TEST_PREFILL_AUTO's there.
 * Returns 1 when the path needs wgmma and this device or build has none (the automatic choice runs), else
 * 0; -1 for an unknown path. */
enum { K_TEST_PREFILL_AUTO = 0, K_TEST_PREFILL_MMA = 1, K_TEST_PREFILL_CPASYNC = 2 };
int k_test_prefill_path(int path);

#ifdef __cplusplus
}
#endif
