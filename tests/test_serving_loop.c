/*
 * The serving loop (admission with written and zeroed states, mixed decode and verify steps over
 * changing batches, commits, retirement) checked against the float64 reference on the CPU backend:
 * the check that the serving-loop example carried before it moved to the public API only. The GPU
 * twin is in test_gpu_engine.c.
 */
#include <criterion/criterion.h>

#include "serving_loop_check.h"

static int run(const char *verify, const char *state)
{
    char *argv[] = {"serving-loop-check", "--backend", "cpu", "--steps", "48", "--verify", (char *)verify,
                    "--state", (char *)state, "--check-every", "12"};
    return gdn_serving_loop_check((int)(sizeof argv / sizeof argv[0]), argv);
}

Test(serving_loop, cache_strategy_fp32_state_matches_the_reference) { cr_assert_eq(run("cache", "f32"), 0); }
Test(serving_loop, fold_strategy_bf16_state_matches_the_reference) { cr_assert_eq(run("fold", "bf16"), 0); }
Test(serving_loop, bad_arguments_are_refused)
{
    char *argv[] = {"serving-loop-check", "--steps", "-3"};
    cr_assert_eq(gdn_serving_loop_check(3, argv), 2);
}

static int run_tree(const char *verify, const char *state)
{
    char *argv[] = {"serving-loop-check", "--backend", "cpu", "--steps", "40", "--verify", (char *)verify, "--state",
                    (char *)state, "--max-tokens", "16", "--max-batch", "8", "--tree", "--check-every", "10"};
    return gdn_serving_loop_check((int)(sizeof argv / sizeof argv[0]), argv);
}

Test(serving_loop, token_trees_cache_bf16_state_match_the_reference) { cr_assert_eq(run_tree("cache", "bf16"), 0); }
Test(serving_loop, token_trees_fold_fp32_state_match_the_reference) { cr_assert_eq(run_tree("fold", "f32"), 0); }
