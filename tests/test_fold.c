/*
 * The fold verify strategy (SPEC 3.2) on the CPU backend: the same random serving scenarios as the
 * cache strategy, checked against a host model with the fold rounding points, states read at every
 * step (each read folds) and only every few steps (so that the next step's kernel folds), both state
 * dtypes; pending tokens survive forks, retirement and state writes; and with bf16 state the fold
 * strategy ends at least as close to the never-rounded float64 run as the cache strategy.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "scenario.h"
#include "support.h"

static scenario_result fold_scenario(gdn_verify_strategy strategy, gdn_dtype state_dtype, int32_t check_every,
                                       uint64_t seed)
{
    scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = state_dtype, .strategy = strategy, .layers = 3, .steps = 200,
                          .num_slots = 24, .max_batch = 16, .max_tokens = 4, .check_every = check_every, .seed = seed};
    scenario_result r = run_scenario(&o);
    cr_assert_gt(r.verify_steps, 40);
    cr_assert_gt(r.accepted_zero, 5);
    cr_assert_gt(r.accepted_full, 5);
    cr_assert_gt(r.forks, 5);
    return r;
}

Test(fold, scenario_fp32_state_read_every_step, .timeout = 300)
{
    scenario_result r = fold_scenario(GDN_VERIFY_FOLD, GDN_DTYPE_F32, 1, 501);
    cr_log_info("fold fp32, checked every step: worst state %.3f%%, output %.3f%% of tolerance", 100 * r.worst_state,
                100 * r.worst_output);
}

Test(fold, scenario_fp32_state_folded_by_the_next_step, .timeout = 300)
{
    scenario_result r = fold_scenario(GDN_VERIFY_FOLD, GDN_DTYPE_F32, 7, 502);
    cr_log_info("fold fp32, checked every 7 steps: worst state %.3f%%, output %.3f%% of tolerance", 100 * r.worst_state,
                100 * r.worst_output);
}

Test(fold, scenario_bf16_state_folded_by_the_next_step, .timeout = 300)
{
    scenario_result r = fold_scenario(GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 5, 503);
    cr_log_info("fold bf16, checked every 5 steps: worst state %.3f%%, output %.3f%% of tolerance", 100 * r.worst_state,
                100 * r.worst_output);
}

/* The large-batch scenario of the GPU suite (test_gpu_fold.c) on the CPU backend: 60 live requests,
 * buckets up to 64 rows of the qwen3-next geometry. */
Test(fold, large_batches_match_the_host_model, .timeout = 300)
{
    scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = GDN_DTYPE_F32, .strategy = GDN_VERIFY_FOLD, .layers = 1, .steps = 8,
                          .num_slots = 80, .max_batch = 64, .max_tokens = 4, .check_every = 4, .min_live = 60,
                          .seed = 504};
    scenario_result r = run_scenario(&o);
    cr_assert_geq(r.largest_bucket, 32);
    cr_log_info("fold qwen3-next, B <= 64: largest bucket %d, worst state %.3f%%, output %.3f%% of tolerance",
                r.largest_bucket, 100 * r.worst_state, 100 * r.worst_output);
}

Test(fold, strategies_agree_and_fold_is_as_close_to_float64_with_bf16_state, .timeout = 300)
{
    /* The same seed gives both strategies the same requests, tokens and acceptances. */
    scenario_result cache = fold_scenario(GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 25, 504);
    scenario_result fold = fold_scenario(GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 25, 504);
    cr_assert_eq(cache.verify_steps, fold.verify_steps, "the two runs saw the same steps");
    cr_assert_eq(cache.retired, fold.retired);
    cr_log_info("bf16 state, RMS distance to the never-rounded float64 run: cache %.4g, fold %.4g",
                cache.rms_vs_exact, fold.rms_vs_exact);
    cr_assert_gt(cache.rms_vs_exact, 0.0, "bf16 storage rounds");
    cr_assert_leq(fold.rms_vs_exact, cache.rms_vs_exact, "fold rounds once per step, the cache once per commit");
    scenario_result cache32 = fold_scenario(GDN_VERIFY_CACHE, GDN_DTYPE_F32, 25, 505);
    scenario_result fold32 = fold_scenario(GDN_VERIFY_FOLD, GDN_DTYPE_F32, 25, 505);
    cr_assert_lt(cache32.rms_vs_exact, 1e-5);
    cr_assert_lt(fold32.rms_vs_exact, 1e-5);
}

Test(fold, pending_tokens_are_folded_before_a_read_and_dropped_by_a_write)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 4, 2, 3);
    c.verify_strategy = GDN_VERIFY_FOLD;
    test_rng rng = test_rng_seeded(9);
    float *params;
    gdn_engine *e = test_engine_create(&c, &rng, &params);
    const gdn_engine_config *rc = gdn_engine_get_config(e);
    int32_t s;
    gdn_slot_alloc(e, &s);
    test_fill_slot_state(e, s, &rng);
    double *before[2] = {test_read_state(e, 0, s), test_read_state(e, 1, s)};
    gdn_state_pool pool;
    gdn_engine_state_pool(e, 0, &pool);
    test_inputs in[2];
    for (int32_t l = 0; l < 2; l++) test_write_inputs(e, l, 1, 3, &rng, &in[l]);
    test_run_step(e, GDN_STEP_VERIFY, 3, 1, &s, NULL);
    const int32_t accepted[] = {2};
    test_set_accepted(e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
    /* The pool itself lags: it still holds the state before the accepted tokens. */
    const size_t elems = test_state_elems(e);
    const float *raw = (const float *)pool.data + (size_t)s * (size_t)pool.slot_stride;
    for (size_t j = 0; j < elems; j += 97) cr_assert_eq((double)raw[j], before[0][j], "the pool was written early");
    /* A read folds the two accepted tokens (every layer). */
    for (int32_t l = 0; l < 2; l++) {
        test_reference_row(rc, &in[l], 0, 2, params + l * 8, params + l * 8 + 4, before[l], NULL);
        test_round_to(before[l], elems, GDN_DTYPE_F32);
        double *now = test_read_state(e, l, s);
        cr_assert_leq(test_error_ratio(now, before[l], elems, 1e-6, 1e-6), 1.0, "layer %d", l);
        free(now);
    }
    for (size_t j = 0; j < elems; j += 97) cr_assert_eq((double)raw[j], before[0][j], "the read wrote the folded state back");
    /* A second commit-free verify step with accepted 0 changes nothing; a write drops nothing twice. */
    double *again = test_read_state(e, 1, s);
    cr_assert_eq(memcmp(again, before[1], elems * sizeof(double)), 0, "a second read folds nothing more");
    free(again);

    /* A second verify leaves two tokens pending in both layers. Writing layer 0 drops layer 0's (the
     * written state reads back exactly); layer 1 keeps its own, which its read then folds. */
    for (int32_t l = 0; l < 2; l++) test_inputs_free(&in[l]), test_write_inputs(e, l, 1, 3, &rng, &in[l]);
    test_run_step(e, GDN_STEP_VERIFY, 3, 1, &s, NULL);
    test_set_accepted(e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
    float *written = malloc(test_state_bytes(e));
    for (size_t j = 0; j < elems; j++) written[j] = (float)(test_rng_uniform(&rng) - 0.5);
    cr_assert_eq(gdn_slot_write_state(e, 0, s, written), GDN_OK);
    double *layer0 = test_read_state(e, 0, s);
    for (size_t j = 0; j < elems; j++) cr_assert_eq(layer0[j], (double)written[j], "layer 0 element %zu", j);
    test_reference_row(rc, &in[1], 0, 2, params + 8, params + 12, before[1], NULL);
    test_round_to(before[1], elems, GDN_DTYPE_F32);
    double *layer1 = test_read_state(e, 1, s);
    cr_assert_leq(test_error_ratio(layer1, before[1], elems, 1e-6, 1e-6), 1.0, "layer 1 folds its own pending tokens");
    free(written), free(layer0), free(layer1);
    for (int32_t l = 0; l < 2; l++) test_inputs_free(&in[l]), free(before[l]);
    free(params);
    gdn_engine_destroy(e);
}

Test(fold, a_freed_slot_does_not_hand_its_pending_tokens_to_the_next_request)
{
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 2, 1, 3);
    c.verify_strategy = GDN_VERIFY_FOLD;
    test_rng rng = test_rng_seeded(12);
    float *params;
    gdn_engine *e = test_engine_create(&c, &rng, &params);
    const gdn_engine_config *rc = gdn_engine_get_config(e);
    int32_t s, again;
    gdn_slot_alloc(e, &s);
    test_fill_slot_state(e, s, &rng);
    test_inputs in;
    test_write_inputs(e, 0, 1, 3, &rng, &in);
    test_run_step(e, GDN_STEP_VERIFY, 3, 1, &s, NULL);
    const int32_t accepted[] = {3};
    test_set_accepted(e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK); /* three tokens now pending on slot s */
    test_inputs_free(&in);
    cr_assert_eq(gdn_slot_free(e, s), GDN_OK);
    cr_assert_eq(gdn_slot_alloc(e, &again), GDN_OK);
    cr_assert_eq(again, s, "the freed slot is handed out again");
    /* The new request's state goes straight into the pool (CPU backend: host memory), as a prefill
     * kernel would write it; the stale tokens must not be folded into it. */
    gdn_state_pool pool;
    gdn_engine_state_pool(e, 0, &pool);
    const size_t elems = test_state_elems(e);
    float *slot_state = (float *)pool.data + (size_t)again * (size_t)pool.slot_stride;
    double *expected = malloc(sizeof(double) * elems);
    for (size_t j = 0; j < elems; j++) slot_state[j] = (float)(0.1 * test_rng_normal(&rng)), expected[j] = slot_state[j];
    double *read_back = test_read_state(e, 0, again); /* a read before any step folds nothing either */
    cr_assert_eq(memcmp(read_back, expected, sizeof(double) * elems), 0, "the read folded the last owner's tokens");
    free(read_back);
    test_write_inputs(e, 0, 1, 1, &rng, &in);
    test_run_step(e, GDN_STEP_DECODE, 1, 1, &again, NULL);
    test_reference_row(rc, &in, 0, 1, params, params + 4, expected, NULL);
    test_round_to(expected, elems, GDN_DTYPE_F32);
    double *now = test_read_state(e, 0, again);
    cr_assert_leq(test_error_ratio(now, expected, elems, 1e-6, 1e-6), 1.0, "stale pending tokens were folded in");
    free(now), free(expected), free(params);
    test_inputs_free(&in);
    gdn_engine_destroy(e);
}
