/*
 * The ring verify strategy (GDN_VERIFY_RING) on the CPU backend. Each slot keeps per layer a checkpoint
 * (the pool) and h ring records (the tokens since the checkpoint); the pool is written, rounded to the
 * state dtype, only at a write-back: a decode whose ring would hold ring_length records, a verify whose
 * T tokens do not fit the capacity C = max(ring_length, max_tokens), a fork (write slot != read slot),
 * and a state read. The random serving scenarios of the other strategies run against a host model with
 * those write-back points (states read every step, so that each read writes back, and every few steps,
 * so that rings fill and write back in the kernels), for rings of 4, 5, 16 and 32 records and T up to
 * 16; directed tests pin the write-back points byte by byte against the raw pools (read through
 * gdn_engine_state_pool, since a read through the API writes back), reads in the middle of a ring, reset
 * and free with records, verifies that do not fit, forks, slots outside the step and padding rows, the
 * configuration, and how close the strategies end to the never-rounded float64 run.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/alloc.h"
#include "kernels/gdn_kernel_params.h"
#include "ring_checks.h"
#include "scenario.h"
#include "support.h"

/* ---- random scenarios ---- */

static scenario_result ring_scenario(gdn_dtype state_dtype, int32_t ring_length, int32_t max_tokens,
                                     int32_t check_every, int32_t steps, uint64_t seed)
{
    scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = state_dtype, .strategy = GDN_VERIFY_RING, .layers = 2, .steps = steps,
                          .num_slots = 24, .max_batch = 16, .max_tokens = max_tokens, .check_every = check_every,
                          .ring_length = ring_length, .request_scale = ring_length >= 16 ? 4 : 1, .seed = seed};
    scenario_result r = run_scenario(&o);
    cr_log_info("ring L=%d C=%d T<=%d %s, checked every %d steps: worst state %.1f%%, output %.1f%% of tolerance; "
                "write-backs: decode %d, verify %d, fork %d, read %d; most records %d; positions %#llx, "
                "write-back depths %#llx",
                ring_length, r.ring_capacity, max_tokens, state_dtype == GDN_DTYPE_BF16 ? "bf16" : "fp32", check_every,
                100 * r.worst_state, 100 * r.worst_output, r.ring_flush_decode, r.ring_flush_verify, r.ring_flush_fork,
                r.ring_flush_read, r.ring_largest, (unsigned long long)r.ring_positions,
                (unsigned long long)r.ring_flush_depths);
    const int32_t length = ring_length       ? ring_length
                           : max_tokens > 1 ? GDN_DEFAULT_RING_LENGTH
                                            : GDN_DEFAULT_DECODE_RING_LENGTH;
    cr_assert_eq(r.ring_capacity, length > max_tokens ? length : max_tokens);
    cr_assert_gt(r.verify_steps, steps / 5);
    cr_assert_gt(r.accepted_zero, 3);
    cr_assert_gt(r.accepted_full, 3);
    cr_assert_gt(r.forks, 3);
    cr_assert_gt(r.padding_rows, 3);
    if (state_dtype == GDN_DTYPE_F32) cr_assert_lt(r.rms_vs_exact, 1e-5, "fp32: %.3g", r.rms_vs_exact);
    return r;
}

static uint64_t low_bits(int32_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* Every record position 0..C-1 was written by some step. */
static void expect_every_position(const scenario_result *r)
{
    const uint64_t all = low_bits(r->ring_capacity);
    cr_assert_eq(r->ring_positions & all, all, "positions written %#llx of %#llx", (unsigned long long)r->ring_positions,
                 (unsigned long long)all);
}

/* Kernels wrote a state back after every number of records 0..C (0: forks of an empty ring). */
static void expect_write_backs_at_every_depth(const scenario_result *r)
{
    const uint64_t depths = low_bits(r->ring_capacity + 1);
    cr_assert_eq(r->ring_flush_depths & depths, depths, "write-back depths %#llx", (unsigned long long)r->ring_flush_depths);
}

/* Buckets of up to 4 rows write through (of 1, 2, 4, 8, 16): both dtypes, random serving. */
Test(ring, scenario_small_decodes_write_through, .timeout = 300)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .strategy = GDN_VERIFY_RING, .layers = 2, .steps = 120,
                              .num_slots = 24, .max_batch = 16, .max_tokens = 4, .check_every = 7, .ring_length = 8,
                              .ring_write_through = 4, .seed = 606 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("ring write-through <= 4 rows %s: worst state %.1f%%, output %.1f%%; write-throughs %d, "
                    "decode write-backs %d, verify %d",
                    d ? "bf16" : "fp32", 100 * r.worst_state, 100 * r.worst_output, r.ring_write_throughs, r.ring_flush_decode,
                    r.ring_flush_verify);
        cr_assert_gt(r.ring_write_throughs, 5);
        cr_assert_gt(r.largest_bucket, 4, "larger buckets append");
        if (dtypes[d] == GDN_DTYPE_F32) cr_assert_lt(r.rms_vs_exact, 1e-5, "fp32: %.3g", r.rms_vs_exact);
    }
}

Test(ring, scenario_fp32_ring_of_4_read_every_step, .timeout = 300)
{
    /* Each read writes back: rings hold at most one step's tokens when a step begins. */
    scenario_result r = ring_scenario(GDN_DTYPE_F32, 4, 4, 1, 120, 601);
    cr_assert_gt(r.ring_flush_read, 50);
    cr_assert_leq(r.ring_largest, 4);
}

Test(ring, scenario_fp32_ring_of_4_written_back_by_the_kernels, .timeout = 300)
{
    scenario_result r = ring_scenario(GDN_DTYPE_F32, 4, 4, 9, 200, 602);
    cr_assert_gt(r.ring_flush_decode, 10, "full rings written back by decodes");
    cr_assert_gt(r.ring_flush_verify, 10, "verifies that did not fit");
    cr_assert_gt(r.ring_flush_fork, 2, "forks of requests with records");
    cr_assert_eq(r.ring_largest, 4, "a committed verify fills the ring to its capacity");
    expect_every_position(&r);
    expect_write_backs_at_every_depth(&r);
}

Test(ring, scenario_bf16_ring_of_5_written_back_by_the_kernels, .timeout = 300)
{
    scenario_result r = ring_scenario(GDN_DTYPE_BF16, 5, 3, 11, 200, 603);
    cr_assert_gt(r.ring_flush_decode, 10);
    cr_assert_gt(r.ring_flush_verify, 5);
    expect_every_position(&r);
    expect_write_backs_at_every_depth(&r);
}

Test(ring, scenario_bf16_ring_of_4_with_sixteen_token_verifies, .timeout = 300)
{
    /* C = max(4, 16) = 16: a verify may leave more records than ring_length, and the next decode writes
     * them back. */
    scenario_result r = ring_scenario(GDN_DTYPE_BF16, 4, 16, 6, 100, 604);
    cr_assert_eq(r.ring_capacity, 16);
    cr_assert_gt(r.ring_largest, 4);
    cr_assert_gt(r.ring_flush_decode, 5);
    cr_assert_gt(r.ring_flush_verify, 5);
    expect_every_position(&r);
}

Test(ring, scenario_fp32_ring_of_16_with_sixteen_token_verifies, .timeout = 300)
{
    scenario_result r = ring_scenario(GDN_DTYPE_F32, 16, 16, 12, 100, 605);
    cr_assert_gt(r.ring_flush_decode + r.ring_flush_verify, 10);
    cr_assert_gt(r.ring_largest, 12);
    expect_every_position(&r);
}

Test(ring, scenario_bf16_ring_of_32, .timeout = 300)
{
    scenario_result r = ring_scenario(GDN_DTYPE_BF16, 32, 8, 40, 160, 606);
    cr_assert_eq(r.ring_capacity, 32);
    cr_assert_gt(r.ring_flush_decode, 0, "a ring of 32 filled by decodes");
    cr_assert_gt(r.ring_flush_verify, 3);
    cr_assert_geq(r.ring_largest, 31);
    expect_every_position(&r);
}

/* The large-batch scenario of the GPU suite on the CPU backend: 60 live requests, buckets up to 64 rows
 * of the qwen3-next geometry (the host model's check for test_gpu_fold's ring test). */
Test(ring, large_batches_match_the_host_model, .timeout = 300)
{
    scenario_options o = {.preset = "qwen3-next", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = GDN_DTYPE_BF16, .strategy = GDN_VERIFY_RING, .layers = 1, .steps = 6,
                          .num_slots = 80, .max_batch = 64, .max_tokens = 4, .check_every = 3, .min_live = 60,
                          .ring_length = 4, .seed = 607};
    scenario_result r = run_scenario(&o);
    cr_assert_geq(r.largest_bucket, 32);
    cr_assert_gt(r.ring_flush_decode + r.ring_flush_verify, 0);
}

/* With bf16 state the ring rounds the state only at its write-backs: it must not end farther from the
 * never-rounded float64 run than the cache strategy (which rounds at every commit), and the three
 * strategies, run on the same requests, tokens and acceptances, end at the same states. */
Test(ring, strategies_agree_and_the_ring_is_as_close_to_float64_with_bf16_state, .timeout = 300)
{
    const gdn_verify_strategy strategies[] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_RING};
    const char *names[] = {"cache", "fold", "ring"};
    const int32_t layers = 2, slots = 24;
    const size_t elems = 4 * 64 * 64, per_run = elems * (size_t)layers * (size_t)slots;
    double *final_states = malloc(sizeof(double) * per_run * 3);
    scenario_result r[3];
    for (int s = 0; s < 3; s++) {
        scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = GDN_DTYPE_BF16, .strategy = strategies[s], .layers = layers, .steps = 200,
                              .num_slots = slots, .max_batch = 16, .max_tokens = 4, .check_every = 25,
                              .ring_length = 0 /* the default, 16 */, .seed = 608,
                              .final_states = final_states + per_run * (size_t)s};
        r[s] = run_scenario(&o);
        cr_log_info("bf16 %s: RMS distance to the never-rounded float64 run %.4g", names[s], r[s].rms_vs_exact);
    }
    cr_assert_eq(r[2].ring_capacity, GDN_DEFAULT_RING_LENGTH);
    for (int s = 1; s < 3; s++) {
        cr_assert_eq(r[s].verify_steps, r[0].verify_steps, "the runs saw the same steps");
        cr_assert_eq(r[s].retired, r[0].retired);
        cr_assert_eq(r[s].accepted_full, r[0].accepted_full);
    }
    cr_assert_gt(r[0].rms_vs_exact, 0.0, "bf16 storage rounds");
    cr_assert_leq(r[2].rms_vs_exact, r[0].rms_vs_exact, "the ring rounds at write-backs only, the cache at every commit");
    /* Request by request (zeros for the requests not live at the end, in every run alike). */
    for (int s = 1; s < 3; s++) {
        const gdn__tolerance bf16 = gdn__spec4_tolerance(GDN_DTYPE_BF16);
        const double ratio = test_error_ratio(final_states + per_run * (size_t)s, final_states, per_run, bf16.state_abs,
                                              bf16.state_rel);
        cr_log_info("%s vs cache: final states at %.1f%% of the bf16 state tolerance", names[s], 100 * ratio);
        cr_assert_leq(ratio, 1.0, "%s vs cache: final states at %.0f%% of tolerance", names[s], 100 * ratio);
    }
    free(final_states);
}

/* ---- directed checks (ring_checks.c), on the CPU backend ---- */

Test(ring, write_back_points_are_exact) { ring_check_write_back_points_are_exact(GDN_BACKEND_CPU); }

Test(ring, a_read_in_the_middle_of_a_ring_returns_the_current_state)
{
    ring_check_a_read_in_the_middle_of_a_ring_returns_the_current_state(GDN_BACKEND_CPU);
}

Test(ring, a_write_in_the_middle_of_a_ring_replaces_it)
{
    ring_check_a_write_in_the_middle_of_a_ring_replaces_it(GDN_BACKEND_CPU);
}

Test(ring, reset_and_free_in_the_middle_of_a_ring) { ring_check_reset_and_free_in_the_middle_of_a_ring(GDN_BACKEND_CPU); }

Test(ring, a_verify_that_does_not_fit_writes_back_first)
{
    ring_check_a_verify_that_does_not_fit_writes_back_first(GDN_BACKEND_CPU);
}

Test(ring, forks_write_back_into_the_new_slot) { ring_check_forks_write_back_into_the_new_slot(GDN_BACKEND_CPU); }

Test(ring, slots_outside_the_step_and_padding_rows_are_bit_exact)
{
    ring_check_slots_outside_the_step_and_padding_rows_are_bit_exact(GDN_BACKEND_CPU);
}

Test(ring, small_decodes_write_through) { ring_check_small_decodes_write_through(GDN_BACKEND_CPU); }

/* The step path allocates no host memory with the ring strategy either: verifies that do not fit
 * (written back) and their commits, decodes that fill rings and that write them back, and the first
 * step after a slot with records was freed (its counts cleared with the step). */
Test(ring, step_path_allocates_no_host_memory)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_BF16, 8, 4, 4);
    c.verify_strategy = GDN_VERIFY_RING;
    c.ring_length = 4;
    test_rng rng = test_rng_seeded(690);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t slots[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(gdn_slot_alloc(e, &slots[i]), GDN_OK);
        test_fill_slot_state(e, slots[i], &rng);
    }
    test_inputs in[2];
    for (int32_t l = 0; l < 2; l++) test_write_inputs(e, l, 4, 4, &rng, &in[l]);
    const int32_t accepted[] = {4, 2, 0, 1};
    test_set_accepted(e, accepted, 4);
    test_run_step(e, GDN_STEP_DECODE, 1, 4, slots, NULL); /* one record each */
    gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 4, .batch = 4, .slots = slots};
    gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 4, .slots = slots};
    const uint64_t before = gdn__thread_allocated_bytes(), calls_before = gdn__allocation_count();
    gdn_status worst = GDN_OK;
    for (int round = 0; round < 3; round++) {
        const gdn_status s[] = {gdn_engine_begin_step(e, &verify, NULL, NULL), gdn_engine_run_step(e, NULL),
                                gdn_engine_commit(e, NULL), gdn_engine_begin_step(e, &decode, NULL, NULL),
                                gdn_engine_run_step(e, NULL), gdn_engine_begin_step(e, &decode, NULL, NULL),
                                gdn_engine_run_step(e, NULL)};
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) worst = worst ? worst : s[i];
    }
    const gdn_status freed = gdn_slot_free(e, slots[3]), again = gdn_slot_alloc(e, &slots[3]);
    const gdn_status s1 = gdn_engine_begin_step(e, &decode, NULL, NULL), s2 = gdn_engine_run_step(e, NULL);
    const uint64_t after = gdn__thread_allocated_bytes(), calls_after = gdn__allocation_count();
    cr_assert_eq(worst, GDN_OK, "%s", gdn_status_name(worst));
    cr_assert(freed == GDN_OK && again == GDN_OK && s1 == GDN_OK && s2 == GDN_OK);
    cr_assert_gt(before, 0, "jemalloc's thread.allocated counter is readable");
    cr_assert_eq(after, before, "the step path allocated %llu bytes", (unsigned long long)(after - before));
    cr_assert_eq(calls_after, calls_before, "the step path called gdn__malloc");
    for (int32_t l = 0; l < 2; l++) test_inputs_free(&in[l]);
    gdn_engine_destroy(e);
}

/* A decode-only engine (max_tokens 1) with the default strategy above GDN_AUTO_RING_HEADS_F32
 * row-heads runs the ring with the decode-only ring length and matches the host model through its
 * write-backs (tiny: 4 value heads; the CUDA twin: test_gpu_fold.c). */
Test(ring, decode_only_auto_takes_the_ring_and_matches_the_host_model, .timeout = 300)
{
    const int32_t max_batch = GDN_AUTO_RING_HEADS_F32 / 4 + 8;
    scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = GDN_DTYPE_F32, .strategy = GDN_VERIFY_AUTO, .layers = 2, .steps = 60,
                          .num_slots = max_batch + max_batch / 4, .max_batch = max_batch, .max_tokens = 1,
                          .check_every = 10, .min_live = max_batch - 4, .seed = 791};
    scenario_result r = run_scenario(&o);
    cr_log_info("tiny fp32 decode only, AUTO, max_batch %d: worst state %.1f%%, output %.1f%% of tolerance; decode "
                "write-backs %d, read %d",
                max_batch, 100 * r.worst_state, 100 * r.worst_output, r.ring_flush_decode, r.ring_flush_read);
    cr_assert_eq(r.strategy, GDN_VERIFY_RING);
    cr_assert_eq(r.ring_capacity, GDN_DEFAULT_DECODE_RING_LENGTH);
    cr_assert_gt(r.decode_steps, 30);
    if (test_full_length()) cr_assert_gt(r.ring_flush_decode, 0);
    cr_assert_lt(r.worst_state, 1.0);
    cr_assert_lt(r.worst_output, 1.0);
}

/* (g) Configuration: ring_length 0 resolves to 16 (8 with max_tokens 1), 4..32 is valid, 3 and 33 are GDN_ECONFIG_RING; the
 * ring strategy allocates its rings and neither the cache nor the token store. */
Test(ring, configuration_and_memory)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 8, 8, 4);
    c.verify_strategy = GDN_VERIFY_RING;
    const int32_t bad[] = {3, 33, -1, 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.ring_length = bad[i];
        cr_assert_eq(gdn_engine_config_validate(&c), GDN_ECONFIG_RING, "ring_length %d", bad[i]);
        gdn_engine *e = (gdn_engine *)(uintptr_t)0x1234;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_ECONFIG_RING);
        cr_assert_eq(e, (gdn_engine *)(uintptr_t)0x1234, "a failed create must not write *out");
    }
    const int32_t good[] = {0, GDN_MIN_RING_LENGTH, 5, 16, GDN_MAX_RING_LENGTH};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        c.ring_length = good[i];
        cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK, "ring_length %d", good[i]);
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
        const gdn_engine_config *r = gdn_engine_get_config(e);
        cr_assert_eq(r->verify_strategy, GDN_VERIFY_RING);
        cr_assert_eq(r->ring_length, good[i] ? good[i] : GDN_DEFAULT_RING_LENGTH);
        cr_assert_eq(c.ring_length, good[i], "create must not change the caller's config");
        gdn_memory_report m;
        cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
        cr_assert_eq(m.verify_cache, 0);
        cr_assert_eq(m.token_store, 0);
        /* At least 2 layers x 8 slots x C records (C = max(L, 4) = L here). */
        const uint64_t records = 2ull * 8 * (uint64_t)r->ring_length * (uint64_t)gdn__ring_record_bytes(2, 4, 64, 64);
        cr_assert_geq(m.ring, records, "ring %llu bytes < %llu", (unsigned long long)m.ring, (unsigned long long)records);
        cr_assert_lt(m.ring, 2 * records);
        cr_assert_eq(m.total, m.state_pools + m.ring + m.io_buffers + m.parameters + m.indices);
        gdn_engine_destroy(e);
    }
    cr_assert_eq(GDN_DEFAULT_RING_LENGTH, 16);
    { /* a decode-only engine (max_tokens 1) takes the shorter default: half the memory */
        gdn_engine_config d = test_config("tiny", 2, GDN_DTYPE_F32, 8, 8, 1);
        d.verify_strategy = GDN_VERIFY_RING;
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&d, &e), GDN_OK);
        cr_assert_eq(gdn_engine_get_config(e)->ring_length, GDN_DEFAULT_DECODE_RING_LENGTH);
        gdn_memory_report m;
        cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
        const uint64_t records = 2ull * 8 * GDN_DEFAULT_DECODE_RING_LENGTH * (uint64_t)gdn__ring_record_bytes(2, 4, 64, 64);
        cr_assert_geq(m.ring, records);
        cr_assert_lt(m.ring, records / GDN_DEFAULT_DECODE_RING_LENGTH * (GDN_DEFAULT_DECODE_RING_LENGTH + 1),
                     "capacity 8 records a slot, not 16");
        gdn_engine_destroy(e);
    }
    /* The capacity is max(ring_length, max_tokens): a ring of 4 with 16-token verifies holds 16. */
    c = test_config("tiny", 1, GDN_DTYPE_BF16, 4, 2, 16);
    c.verify_strategy = GDN_VERIFY_RING;
    c.ring_length = 4;
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    gdn_memory_report m;
    cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
    cr_assert_geq(m.ring, 4ull * 16 * (uint64_t)gdn__ring_record_bytes(2, 4, 64, 64));
    gdn_engine_destroy(e);
    /* Other strategies hold no ring. */
    c = test_config("tiny", 2, GDN_DTYPE_F32, 8, 8, 4);
    c.verify_strategy = GDN_VERIFY_FOLD;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
    cr_assert_eq(m.ring, 0);
    gdn_engine_destroy(e);
}
