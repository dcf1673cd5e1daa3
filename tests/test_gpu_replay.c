/*
 * The replay verify strategy's CUDA path: the same random scenarios as on the CPU backend (random
 * acceptance including 0 and T, retirement, padding, states read back) against the host model with
 * the replay rounding points, for both strategies and both state dtypes, and the bf16 closeness
 * comparison (replay rounds once per step, so it must not end farther from the float64 run).
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "scenario.h"
#include "support.h"

#ifdef GDN_HAVE_CUDA

Test(gpu_replay, both_strategies_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    double rms[2][2] = {{0}};
    for (int d = 0; d < 2; d++) {
        for (int strategy = 0; strategy < 2; strategy++) {
            scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = strategy ? GDN_VERIFY_REPLAY : GDN_VERIFY_CACHE,
                                  .layers = 3, .steps = 200, .num_slots = 24, .max_batch = 16, .max_tokens = 4,
                                  .check_every = 5, .seed = 700 + (uint64_t)d};
            scenario_result r = run_scenario(&o);
            rms[d][strategy] = r.rms_vs_exact;
            cr_log_info("tiny %s %s: worst state %.1f%%, output %.1f%% of tolerance, RMS to float64 %.4g",
                        d ? "bf16" : "fp32", strategy ? "replay" : "cache", 100 * r.worst_state, 100 * r.worst_output,
                        r.rms_vs_exact);
        }
        scenario_options q = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_REPLAY, .layers = 2, .steps = 30,
                              .num_slots = 24, .max_batch = 16, .max_tokens = 4, .check_every = 3, .seed = 710 + (uint64_t)d};
        const scenario_result large = run_scenario(&q);
        /* Bucket 16 of qwen3-next: the fp32 replay kernel runs two row sets per CTA there. */
        cr_assert_geq(large.largest_bucket, 16);
    }
    cr_assert_leq(rms[1][1], rms[1][0] * 1.02, "bf16: replay %.4g vs cache %.4g from the float64 run", rms[1][1], rms[1][0]);
}

/* Verify steps of up to 16 tokens after up to 16 accepted ones: the replay kernel's longest chunks
 * (32 tokens in a verify, 17 in a decode), for K = 64, 128 and 256. */
Test(gpu_replay, sixteen_token_verifies_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const char *presets[] = {"tiny", "qwen3-next", "wide"};
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int pi = 0; pi < 3; pi++)
        for (int d = 0; d < 2; d++) {
            scenario_options o = {.preset = presets[pi], .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = GDN_VERIFY_REPLAY, .layers = 2,
                                  .steps = pi == 1 ? 20 : 40, .num_slots = 16, .max_batch = 8, .max_tokens = GDN_MAX_TOKENS,
                                  .check_every = 4, .seed = 720 + (uint64_t)(2 * pi + d)};
            scenario_result r = run_scenario(&o);
            cr_log_info("%s %s, T <= 16: worst state %.1f%%, output %.1f%% of tolerance", presets[pi], d ? "bf16" : "fp32",
                        100 * r.worst_state, 100 * r.worst_output);
            cr_assert_gt(r.verify_steps, 0);
            cr_assert_gt(r.accepted_full, 0);
        }
}

/* Batches of up to 64 rows: the replay kernel's launches with three and four row sets per CTA (the
 * next set's state staged in shared memory while the current one runs) only happen on large grids. */
Test(gpu_replay, large_batches_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_REPLAY, .layers = 1, .steps = 40,
                              .num_slots = 80, .max_batch = 64, .max_tokens = 4, .check_every = 4,
                              .min_live = 60, .seed = 730 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s, B <= 64: worst state %.1f%%, output %.1f%% of tolerance, largest bucket %d",
                    d ? "bf16" : "fp32", 100 * r.worst_state, 100 * r.worst_output, r.largest_bucket);
        cr_assert_gt(r.verify_steps, 0);
        cr_assert_geq(r.largest_bucket, 32); /* qwen3-next: four row sets per CTA from B = 32 on */
    }
}

#else /* no CUDA in this build: one test that says so by skipping */

Test(gpu_replay, skipped_without_cuda)
{
    test_require_gpu();
    cr_assert_fail("a build without CUDA cannot have a usable GPU");
}

#endif
