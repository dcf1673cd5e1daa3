/*
 * The fold verify strategy's CUDA path: the same random scenarios as on the CPU backend (random
 * acceptance including 0 and T, retirement, padding, states read back) against the host model with
 * the fold rounding points, for both strategies and both state dtypes, and the bf16 closeness
 * comparison (fold rounds once per step, so it must not end farther from the float64 run). The ring
 * strategy's CUDA path: the same scenarios with rings of 4 to 32 records (the host model writes back
 * where the engine must, and the raw pools are compared with it before every read), T up to 16 for
 * K = 64, 128 and 256, large batches, and the directed checks of ring_checks.c (write-back points,
 * reads, reset and free, forks, bit-exact pools outside the step).
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "engine/alloc.h"
#include "engine/backend_impl.h"
#include "ring_checks.h"
#include "scenario.h"
#include "support.h"

#ifdef GDN_HAVE_CUDA

Test(gpu_fold, both_strategies_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    double rms[2][2] = {{0}};
    for (int d = 0; d < 2; d++) {
        for (int strategy = 0; strategy < 2; strategy++) {
            scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = strategy ? GDN_VERIFY_FOLD : GDN_VERIFY_CACHE,
                                  .layers = 3, .steps = 200, .num_slots = 24, .max_batch = 16, .max_tokens = 4,
                                  .check_every = 5, .seed = 700 + (uint64_t)d};
            scenario_result r = run_scenario(&o);
            rms[d][strategy] = r.rms_vs_exact;
            cr_log_info("tiny %s %s: worst state %.1f%%, output %.1f%% of tolerance, RMS to float64 %.4g",
                        d ? "bf16" : "fp32", strategy ? "fold" : "cache", 100 * r.worst_state, 100 * r.worst_output,
                        r.rms_vs_exact);
        }
        scenario_options q = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_FOLD, .layers = 2, .steps = 30,
                              .num_slots = 24, .max_batch = 16, .max_tokens = 4, .check_every = 3, .seed = 710 + (uint64_t)d};
        const scenario_result large = run_scenario(&q);
        /* Bucket 16 of qwen3-next: the fp32 fold kernel runs two row sets per CTA there. */
        cr_assert_geq(large.largest_bucket, 16);
    }
    cr_assert_leq(rms[1][1], rms[1][0] * 1.02, "bf16: fold %.4g vs cache %.4g from the float64 run", rms[1][1], rms[1][0]);
}

/* Verify steps of up to 16 tokens after up to 16 accepted ones: the fold kernel's longest chunks
 * (32 tokens in a verify, 17 in a decode), for K = 64, 128 and 256. */
Test(gpu_fold, sixteen_token_verifies_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const char *presets[] = {"tiny", "qwen3-next", "wide"};
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int pi = 0; pi < 3; pi++)
        for (int d = 0; d < 2; d++) {
            scenario_options o = {.preset = presets[pi], .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = GDN_VERIFY_FOLD, .layers = 2,
                                  .steps = pi == 1 ? 20 : 40, .num_slots = 16, .max_batch = 8, .max_tokens = GDN_MAX_TOKENS,
                                  .check_every = 4, .seed = 720 + (uint64_t)(2 * pi + d)};
            scenario_result r = run_scenario(&o);
            cr_log_info("%s %s, T <= 16: worst state %.1f%%, output %.1f%% of tolerance", presets[pi], d ? "bf16" : "fp32",
                        100 * r.worst_state, 100 * r.worst_output);
            if (test_full_length()) cr_assert_gt(r.verify_steps, 0);
            if (test_full_length()) cr_assert_gt(r.accepted_full, 0);
        }
}

/* qwen3-next on batches of up to 64 rows, both state dtypes, verify steps of up to max_tokens tokens:
 * `steps` steps, seeded seed (fp32) and seed + 1 (bf16). */
static void check_large_batches(int32_t max_tokens, int32_t steps, uint64_t seed)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_FOLD, .layers = 1, .steps = steps,
                              .num_slots = 80, .max_batch = 64, .max_tokens = max_tokens, .check_every = 4,
                              .min_live = 60, .seed = seed + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s, B <= 64, T <= %d: worst state %.1f%%, output %.1f%% of tolerance, largest bucket %d",
                    d ? "bf16" : "fp32", max_tokens, 100 * r.worst_state, 100 * r.worst_output, r.largest_bucket);
        if (test_full_length()) cr_assert_gt(r.verify_steps, 0);
        cr_assert_geq(r.largest_bucket, 32); /* qwen3-next: four row sets per CTA from B = 32 on */
    }
}

/* Batches of up to 64 rows: the fold kernel's launches with three and four row sets per CTA (the
 * next set's state staged in shared memory while the current one runs) only happen on large grids. */
Test(gpu_fold, large_batches_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    check_large_batches(4, 40, 730);
}

/* Verify steps of up to 16 tokens on batches of up to 64 rows: there the fold kernel's large grids
 * run its DIRECT_SETS instance (no staging region; each later row set loads its own state). */
Test(gpu_fold, sixteen_token_verifies_on_large_batches_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    check_large_batches(GDN_MAX_TOKENS, 24, 740);
}

/* The ring strategy on the tiny preset, both state dtypes, rings of 4 and 16 records (T <= 4): rings
 * that fill and write back in the kernels (states read every 5 or 20 steps; longer requests for the
 * longer ring), and with bf16 state the ring must not end farther from the float64 run than the cache
 * strategy on the same requests. */
Test(gpu_fold, ring_matches_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    const int32_t lengths[] = {4, 16};
    for (int d = 0; d < 2; d++)
        for (int li = 0; li < 2; li++) {
            scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 3, .steps = 200,
                                  .num_slots = 24, .max_batch = 16, .max_tokens = 4, .check_every = li ? 20 : 5,
                                  .ring_length = lengths[li], .request_scale = li ? 4 : 1, .seed = 740 + (uint64_t)d};
            scenario_result r = run_scenario(&o);
            cr_log_info("tiny %s ring %d: worst state %.1f%%, output %.1f%% of tolerance, RMS to float64 %.4g; write-backs: "
                        "decode %d, verify %d, fork %d, read %d; most records %d",
                        d ? "bf16" : "fp32", lengths[li], 100 * r.worst_state, 100 * r.worst_output, r.rms_vs_exact,
                        r.ring_flush_decode, r.ring_flush_verify, r.ring_flush_fork, r.ring_flush_read, r.ring_largest);
            if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
            if (test_full_length()) cr_assert_gt(r.ring_flush_verify, 0);
            if (d == 1 && li == 1) {
                o.strategy = GDN_VERIFY_CACHE;
                const scenario_result cache = run_scenario(&o);
                cr_assert_leq(r.rms_vs_exact, cache.rms_vs_exact * 1.02, "bf16: ring %.4g vs cache %.4g from the float64 run",
                              r.rms_vs_exact, cache.rms_vs_exact);
            }
        }
}

/* Verifies of up to 16 tokens with rings of 4 (capacity 16: a verify may leave more records than
 * ring_length, written back by the next decode) and 32 (the longest ring, filled by long requests), for
 * K = 64, 128 and 256; each preset runs one ring length per state dtype. */
Test(gpu_fold, ring_sixteen_token_verifies_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const char *presets[] = {"tiny", "qwen3-next", "wide"};
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int pi = 0; pi < 3; pi++)
        for (int li = 0; li < 2; li++) {
            const int32_t ring_length = li ? 32 : 4;
            const int d = (li + pi) % 2;
            scenario_options o = {.preset = presets[pi], .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                                  .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 2,
                                  .steps = pi == 1 ? 20 : 40, .num_slots = 16, .max_batch = 8, .max_tokens = GDN_MAX_TOKENS,
                                  .check_every = li ? 15 : 4, .ring_length = ring_length, .request_scale = li ? 4 : 1,
                                  .seed = 750 + (uint64_t)(2 * pi + li)};
            scenario_result r = run_scenario(&o);
            cr_log_info("%s %s ring %d, T <= 16: worst state %.1f%%, output %.1f%% of tolerance; write-backs: decode %d, "
                        "verify %d, fork %d, read %d; most records %d",
                        presets[pi], d ? "bf16" : "fp32", ring_length, 100 * r.worst_state, 100 * r.worst_output,
                        r.ring_flush_decode, r.ring_flush_verify, r.ring_flush_fork, r.ring_flush_read, r.ring_largest);
            if (test_full_length()) cr_assert_gt(r.verify_steps, 0);
            if (test_full_length()) cr_assert_gt(r.accepted_full, 0);
            if (ring_length == 4 && test_full_length())
                cr_assert_gt(r.ring_flush_decode + r.ring_flush_verify, 0, "write-backs in the kernels");
            else if (test_full_length())
                cr_assert_gt(r.ring_largest, GDN_MAX_TOKENS, "rings held more than one verify's tokens");
        }
}

/* The ring verify's streamed tensor-core pass (bf16 state and inputs, chains of 2..8 tokens) on
 * qwen3-next's heads at batches of up to 64, rings of 16 records: every token prepares over the
 * records (their norm scales and log decays as the records hold them) and its own earlier tokens
 * (up to seven, their norms formed by the pass), against the host model; verifies of 8 tokens
 * (seven earlier tokens) must occur. */
Test(gpu_fold, ring_streamed_verifies_of_up_to_eight_tokens_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = GDN_DTYPE_BF16, .strategy = GDN_VERIFY_RING, .layers = 2, .steps = 60,
                          .num_slots = 80, .max_batch = 64, .max_tokens = 8, .check_every = 8, .min_live = 40,
                          .ring_length = 16, .seed = 796};
    scenario_result r = run_scenario(&o);
    cr_log_info("qwen3-next bf16 ring 16, T <= 8, B <= 64: worst state %.1f%%, output %.1f%% of tolerance; verifies %d "
                "(%d of 8 tokens); write-backs: decode %d, verify %d; most records %d",
                100 * r.worst_state, 100 * r.worst_output, r.verify_steps, r.verify_steps_of_max_tokens, r.ring_flush_decode,
                r.ring_flush_verify, r.ring_largest);
    if (test_full_length()) cr_assert_gt(r.verify_steps_of_max_tokens, 0);
    if (test_full_length()) cr_assert_gt(r.ring_largest, 8, "verifies over rings holding records");
}

/* qwen3-next with its default write-through (GDN_RING_WRITE_THROUGH_HEADS_F32 / _BF16 row-heads: buckets
 * of up to 8 rows with fp32 state, 32 with bf16, on the big instance from bucket 4 with fp32 and 8 with
 * bf16) beside the ring's own decodes in the buckets above: random serving, both dtypes, against the
 * host model. */
Test(gpu_fold, ring_small_decodes_write_through_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    const int32_t heads[] = {GDN_RING_WRITE_THROUGH_HEADS_F32, GDN_RING_WRITE_THROUGH_HEADS_BF16};
    for (int d = 0; d < 2; d++) {
        const int32_t through = heads[d] / 32, max_batch = 2 * through; /* qwen3-next: 32 value heads */
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 1, .steps = 60,
                              .num_slots = max_batch + max_batch / 4, .max_batch = max_batch, .max_tokens = 4,
                              .check_every = 6, .min_live = through + through / 4, .ring_length = 8,
                              .ring_write_through = through, .seed = 770 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s ring write-through <= %d rows: worst state %.1f%%, output %.1f%% of tolerance; "
                    "write-throughs %d (largest bucket %d), decode write-backs %d, verify %d, fork %d; largest bucket %d",
                    d ? "bf16" : "fp32", through, 100 * r.worst_state, 100 * r.worst_output, r.ring_write_throughs,
                    r.ring_largest_through_bucket, r.ring_flush_decode, r.ring_flush_verify, r.ring_flush_fork,
                    r.largest_bucket);
        if (test_full_length()) cr_assert_gt(r.ring_write_throughs, 5);
        if (test_full_length()) cr_assert_gt(r.verify_steps, 0);
        if (test_full_length()) cr_assert_eq(r.ring_largest_through_bucket, through, "write-throughs on the largest grid");
        if (test_full_length()) cr_assert_gt(r.largest_bucket, through, "the ring's own decodes above it");
    }
}

/* Batches of up to 64 rows of qwen3-next with the ring strategy (large grids). */
Test(gpu_fold, ring_large_batches_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    const int32_t lengths[] = {8, 4};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 1, .steps = 40,
                              .num_slots = 80, .max_batch = 64, .max_tokens = 4, .check_every = 2 * lengths[d],
                              .min_live = 60, .ring_length = lengths[d], .seed = 760 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s ring %d, B <= 64: worst state %.1f%%, output %.1f%% of tolerance, largest bucket %d; "
                    "write-backs: decode %d, verify %d, fork %d, read %d",
                    d ? "bf16" : "fp32", lengths[d], 100 * r.worst_state, 100 * r.worst_output, r.largest_bucket,
                    r.ring_flush_decode, r.ring_flush_verify, r.ring_flush_fork, r.ring_flush_read);
        if (test_full_length()) cr_assert_gt(r.verify_steps, 0);
        cr_assert_geq(r.largest_bucket, 32);
        if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
        if (test_full_length()) cr_assert_gt(r.ring_flush_verify, 0);
    }
}

/* The fp32 decode's streamed pass on large grids as a programmatic dependent launch: two layers, so
 * that the second follows the first with launch_overlap (the first follows the fetch, in stream
 * order), where the pass reads the counts and stages its first items' records and tokens before its
 * wait; batches of up to 64 rows of qwen3-next. */
Test(gpu_fold, ring_large_batches_overlapped_match_the_host_model, .timeout = 900)
{
    test_require_gpu();
    scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = GDN_DTYPE_F32, .strategy = GDN_VERIFY_RING, .layers = 2, .steps = 24,
                          .num_slots = 80, .max_batch = 64, .max_tokens = 4, .check_every = 8, .min_live = 60,
                          .ring_length = 8, .seed = 765};
    scenario_result r = run_scenario(&o);
    cr_log_info("qwen3-next fp32 ring 8, two layers, B <= 64: worst state %.1f%%, output %.1f%% of tolerance, largest "
                "bucket %d; write-backs: decode %d, verify %d",
                100 * r.worst_state, 100 * r.worst_output, r.largest_bucket, r.ring_flush_decode, r.ring_flush_verify);
    cr_assert_geq(r.largest_bucket, 32);
    if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
}

/* A decode-only engine (max_tokens 1) of qwen3-next's heads with the default strategy above
 * GDN_AUTO_RING_HEADS_F32 / _BF16 row-heads runs the ring (ring_length 8 by default), steps of up to
 * the write-through's rows writing through as by default and larger ones appending, and matches the
 * host model through its write-backs; and the cache strategy's decode-only engine, which keeps no
 * verify cache, with its graphs captured at creation (decodes only). */
Test(gpu_fold, decode_only_auto_takes_the_ring_and_matches_the_host_model, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    const int32_t above[] = {GDN_AUTO_RING_HEADS_F32, GDN_AUTO_RING_HEADS_BF16};
    const int32_t through[] = {GDN_RING_WRITE_THROUGH_HEADS_F32, GDN_RING_WRITE_THROUGH_HEADS_BF16};
    for (int d = 0; d < 2; d++) {
        const int32_t max_batch = above[d] / 32 + 8; /* qwen3-next: 32 value heads */
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_AUTO, .layers = 1, .steps = 40,
                              .num_slots = max_batch + max_batch / 4, .max_batch = max_batch, .max_tokens = 1,
                              .check_every = 8, .min_live = max_batch - 4, .ring_write_through = through[d] / 32,
                              .seed = 790 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s decode only, AUTO, max_batch %d: worst state %.1f%%, output %.1f%% of tolerance; "
                    "ring capacity %d, decode write-backs %d, read %d; largest bucket %d",
                    d ? "bf16" : "fp32", max_batch, 100 * r.worst_state, 100 * r.worst_output, r.ring_capacity,
                    r.ring_flush_decode, r.ring_flush_read, r.largest_bucket);
        cr_assert_eq(r.strategy, GDN_VERIFY_RING);
        cr_assert_eq(r.ring_capacity, GDN_DEFAULT_DECODE_RING_LENGTH);
        cr_assert_gt(r.largest_bucket, through[d] / 32, "steps past the write-through ran the ring decode");
        if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
        cr_assert_lt(r.worst_state, 1.0);
        cr_assert_lt(r.worst_output, 1.0);
    }
    /* The cache strategy's decode-only engine (no verify cache), every graph captured at creation. */
    scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_AT_CREATE,
                          .state_dtype = GDN_DTYPE_BF16, .strategy = GDN_VERIFY_CACHE, .layers = 1, .steps = 30,
                          .num_slots = 40, .max_batch = 32, .max_tokens = 1, .check_every = 6, .min_live = 28,
                          .seed = 792};
    scenario_result r = run_scenario(&o);
    cr_log_info("qwen3-next bf16 decode only, cache: worst state %.1f%%, output %.1f%% of tolerance; largest bucket %d",
                100 * r.worst_state, 100 * r.worst_output, r.largest_bucket);
    cr_assert_eq(r.strategy, GDN_VERIFY_CACHE);
    cr_assert_eq(r.verify_steps, 0);
    cr_assert_gt(r.largest_bucket, 16);
    cr_assert_lt(r.worst_state, 1.0);
    cr_assert_lt(r.worst_output, 1.0);
}

/* The ring strategy's step path allocates neither host memory of the library's nor device memory, with
 * every graph captured at creation: verifies that do not fit and their commits, decodes that fill and
 * write back rings, and steps after a slot with records was freed and handed out again. */
Test(gpu_fold, ring_no_allocation_after_creation, .timeout = 300)
{
    test_require_gpu();
    gdn_engine_config c = test_config("qwen3-next", 2, GDN_DTYPE_BF16, 40, 32, 4);
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = GDN_GRAPHS_AT_CREATE;
    c.verify_strategy = GDN_VERIFY_RING;
    c.ring_length = 4;
    test_rng rng = test_rng_seeded(770);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t slots[32], accepted[32];
    for (int i = 0; i < 32; i++) {
        cr_assert_eq(gdn_slot_alloc(e, &slots[i]), GDN_OK);
        accepted[i] = i % 5;
    }
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    const uint64_t device_before = gdn__cuda_device_allocations(), library_before = gdn__allocation_count();
    gdn_status worst = GDN_OK;
    for (int32_t round = 0; round < 3; round++)
        for (int32_t B = 1; B <= 32; B += 3)
            for (int32_t T = 1; T <= 4; T++) {
                gdn_step st = {.kind = T == 1 ? GDN_STEP_DECODE : GDN_STEP_VERIFY, .tokens = T, .batch = B, .slots = slots};
                gdn_status s[] = {gdn_engine_begin_step(e, &st, NULL, NULL), gdn_engine_run_step(e, NULL), GDN_OK, GDN_OK,
                                  GDN_OK};
                if (T > 1) {
                    s[2] = gdn_engine_upload(e, gdn_engine_accepted(e), accepted, sizeof(int32_t) * (size_t)B, NULL);
                    s[3] = gdn_engine_commit(e, NULL);
                }
                if (B == 31 && T == 4) { /* a slot with records freed and handed out again */
                    const int32_t victim = slots[round];
                    s[4] = gdn_slot_free(e, victim);
                    if (s[4] == GDN_OK) s[4] = gdn_slot_alloc(e, &slots[round]);
                }
                for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) worst = worst ? worst : s[i];
            }
    const uint64_t library_after = gdn__allocation_count();
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    cr_assert_eq(worst, GDN_OK, "a step failed: %s", gdn_status_name(worst));
    /* counts 3 and 4 exceed T = 2 and 3: clamped and flagged; the check clears the flag */
    cr_assert_eq(gdn_engine_check_device_error(e, NULL), GDN_EDEVICE);
    cr_assert_eq(gdn_engine_check_device_error(e, NULL), GDN_OK);
    cr_assert_eq(library_after, library_before, "the library allocated %llu times on the step path",
                 (unsigned long long)(library_after - library_before));
    cr_assert_eq(gdn__cuda_device_allocations(), device_before, "the library allocated device memory on the step path");
    gdn_engine_destroy(e);
}

/* The directed checks of the CPU suite (test_ring.c) on the CUDA backend. */
Test(gpu_fold, ring_write_back_points_are_exact)
{
    test_require_gpu();
    ring_check_write_back_points_are_exact(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_a_read_in_the_middle_of_a_ring_returns_the_current_state)
{
    test_require_gpu();
    ring_check_a_read_in_the_middle_of_a_ring_returns_the_current_state(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_a_write_in_the_middle_of_a_ring_replaces_it)
{
    test_require_gpu();
    ring_check_a_write_in_the_middle_of_a_ring_replaces_it(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_reset_and_free_in_the_middle_of_a_ring)
{
    test_require_gpu();
    ring_check_reset_and_free_in_the_middle_of_a_ring(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_a_verify_that_does_not_fit_writes_back_first)
{
    test_require_gpu();
    ring_check_a_verify_that_does_not_fit_writes_back_first(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_forks_write_back_into_the_new_slot)
{
    test_require_gpu();
    ring_check_forks_write_back_into_the_new_slot(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_slots_outside_the_step_and_padding_rows_are_bit_exact)
{
    test_require_gpu();
    ring_check_slots_outside_the_step_and_padding_rows_are_bit_exact(GDN_BACKEND_CUDA);
}

Test(gpu_fold, ring_small_decodes_write_through)
{
    test_require_gpu();
    ring_check_small_decodes_write_through(GDN_BACKEND_CUDA);
}

/* The ring decode's streamed state pass runs by default only from mid-size grids (2-byte state from
 * 1024 row-heads, fp32 from 512), its one-warp preparation from 1024; GDN_RING_STATE_PASS=stream puts
 * every decode on it (sm_90 code; its 64-row tiles divide the V of every preset here) and
 * GDN_RING_PREP_NARROW=1 gives it the one-warp preparation, so that the directed checks (write-backs
 * at every ring position, padding rows, slots outside the step) and small batches of both dtypes hold
 * on them too. Criterion runs each test in its own process: the settings stay in this test. */
Test(gpu_fold, ring_streamed_state_pass_on_every_grid, .timeout = 900)
{
    test_require_gpu();
    cr_assert_eq(setenv("GDN_RING_STATE_PASS", "stream", 1), 0);
    cr_assert_eq(setenv("GDN_RING_PREP_NARROW", "1", 1), 0);
    ring_check_write_back_points_are_exact(GDN_BACKEND_CUDA);
    ring_check_slots_outside_the_step_and_padding_rows_are_bit_exact(GDN_BACKEND_CUDA);
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 2, .steps = 60,
                              .num_slots = 20, .max_batch = 8, .max_tokens = 4, .check_every = 6, .ring_length = 4,
                              .seed = 790 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("qwen3-next %s ring 4, streamed state pass, B <= 8: worst state %.1f%%, output %.1f%% of tolerance; "
                    "write-backs: decode %d, verify %d",
                    d ? "bf16" : "fp32", 100 * r.worst_state, 100 * r.worst_output, r.ring_flush_decode, r.ring_flush_verify);
        if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
    }
}

#else /* no CUDA in this build: one test that says so by skipping */

Test(gpu_fold, skipped_without_cuda)
{
    test_require_gpu();
    cr_assert_fail("a build without CUDA cannot have a usable GPU");
}

#endif
