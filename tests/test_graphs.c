/*
 * Step graphs, backend-neutral parts: the graph table's keys, the capture callback's contract (on the
 * CPU backend it runs directly, so its semantics are tested here too), configuration, and the random
 * 200-step scenario against the float64 host reference.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "graphs/graph_cache.h"
#include "scenario.h"
#include "support.h"

Test(graphs, a_change_in_any_key_field_misses)
{
    gdn__graph_cache cache;
    cr_assert_eq(gdn__graph_cache_init(&cache, 3, 4), GDN_OK);
    const gdn__graph_key key = gdn__graph_key_make(GDN_STEP_VERIFY, 3, 8, 0);
    gdn__graph_entry *slot = gdn__graph_cache_slot(&cache, &key, 1);
    cr_assert_not_null(slot);
    cr_assert_null(gdn__graph_cache_find(&cache, &key, 1), "nothing captured yet");
    slot->key = key;
    slot->exec = (void *)0x1;
    cr_assert_eq(gdn__graph_cache_find(&cache, &key, 1), slot);
    gdn__graph_key other = key;
    other.kind = GDN_STEP_DECODE;
    cr_assert_null(gdn__graph_cache_find(&cache, &other, 1), "kind");
    other = key, other.tokens = 2;
    cr_assert_null(gdn__graph_cache_find(&cache, &other, 1), "tokens");
    other = key, other.bucket = 16;
    cr_assert_null(gdn__graph_cache_find(&cache, &other, 1), "bucket");
    for (int32_t variant = 1; variant < GDN__GRAPH_VARIANTS; variant++) {
        other = key, other.variant = variant;
        cr_assert_null(gdn__graph_cache_find(&cache, &other, 1), "variant %d", variant);
        cr_assert_not_null(gdn__graph_cache_slot(&cache, &other, 1));
        cr_assert_neq(gdn__graph_cache_slot(&cache, &other, 1), slot, "variant %d has its own entry", variant);
        other.kind = GDN__GRAPH_COMMIT;
        cr_assert_neq(gdn__graph_cache_slot(&cache, &other, 1), slot, "and so does its commit");
    }
    other = key, other.kind = GDN_STEP_DECODE, other.tokens = 1, other.variant = GDN__VARIANT_COUNTS;
    cr_assert_null(gdn__graph_cache_slot(&cache, &other, 1), "decode steps are plain");
    cr_assert_null(gdn__graph_cache_find(&cache, &key, 2), "bucket index");
    cr_assert_null(gdn__graph_cache_slot(&cache, &key, 3), "bucket index past the table");
    const gdn__graph_key too_long = gdn__graph_key_make(GDN_STEP_VERIFY, 5, 8, 0);
    cr_assert_null(gdn__graph_cache_slot(&cache, &too_long, 0), "T past max_tokens");
    const gdn__graph_key decode = gdn__graph_key_make(GDN_STEP_DECODE, 1, 8, 0);
    cr_assert_neq(gdn__graph_cache_slot(&cache, &decode, 1), slot, "decode and verify T=3 have their own entries");
    const gdn__graph_key commit = gdn__graph_key_make(GDN__GRAPH_COMMIT, 3, 8, 0);
    cr_assert_not_null(gdn__graph_cache_slot(&cache, &commit, 1));
    cr_assert_neq(gdn__graph_cache_slot(&cache, &commit, 1), slot, "commit of T=3 has its own entry");
    cr_assert_null(gdn__graph_cache_find(&cache, &commit, 1), "and it misses the verify graph");
    const gdn__graph_key decode_t2 = gdn__graph_key_make(GDN_STEP_DECODE, 2, 8, 0);
    cr_assert_null(gdn__graph_cache_slot(&cache, &decode_t2, 1), "decode has T = 1 only");
    cr_assert_eq(gdn__graph_cache_size(&cache), 3 * (1 + 2 * GDN__GRAPH_VARIANTS * 4));
    gdn__graph_cache_release(&cache);
}

Test(graphs, bad_graph_mode_is_its_own_status)
{
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 4, 4, 2);
    c.graph_mode = (gdn_graph_mode)9;
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_ECONFIG_GRAPHS);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_ECONFIG_GRAPHS);
    cr_assert_null(e);
}

/* A capture callback that records its calls and runs the layers (optionally committing, skipping
 * one, or failing). */
typedef struct callback_log {
    int calls;
    gdn_step_kind kind;
    int32_t tokens, bucket;
    int commit_inside, skip_layer, fail;
} callback_log;

static gdn_status step_callback(void *user, gdn_engine *e, gdn_step_kind kind, int32_t tokens, int32_t bucket,
                                void *stream)
{
    callback_log *log = user;
    log->calls++, log->kind = kind, log->tokens = tokens, log->bucket = bucket;
    if (log->fail) return GDN_ENOTSUP;
    const int32_t L = gdn_engine_get_config(e)->model.num_layers;
    for (int32_t l = 0; l < L; l++) {
        if (l == log->skip_layer - 1) continue;
        gdn_status s = gdn_engine_run_layer(e, l, stream);
        if (s != GDN_OK) return s;
    }
    if (log->commit_inside && kind == GDN_STEP_VERIFY) return gdn_engine_commit(e, stream);
    return GDN_OK;
}

static gdn_engine *engine_with_callback(callback_log *log, gdn_graph_mode mode)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 6, 4, 3);
    c.capture = step_callback;
    c.capture_user = log;
    c.graph_mode = mode;
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    int32_t s;
    for (int i = 0; i < 6; i++) gdn_slot_alloc(e, &s);
    return e;
}

Test(graphs, capture_callback_defines_the_step_work)
{
    callback_log log = {0};
    gdn_engine *e = engine_with_callback(&log, GDN_GRAPHS_LAZY);
    test_rng rng = test_rng_seeded(3);
    test_fill_slot_state(e, 2, &rng);
    unsigned char *before = test_snapshot_slot(e, 2);
    const int32_t rows[] = {2, 4, 1};
    test_run_step(e, GDN_STEP_VERIFY, 3, 3, rows, NULL);
    cr_assert_eq(log.calls, 1);
    cr_assert_eq(log.kind, GDN_STEP_VERIFY);
    cr_assert_eq(log.tokens, 3);
    cr_assert_eq(log.bucket, 4);
    const int32_t accepted[] = {2, 1, 3};
    test_set_accepted(e, accepted, 3);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK, "the callback did not commit: the caller does");
    unsigned char *after = test_snapshot_slot(e, 2);
    cr_assert_neq(memcmp(before, after, 2 * test_state_bytes(e)), 0, "the callback's layers ran");
    free(before), free(after);
    gdn_engine_destroy(e);
}

Test(graphs, capture_callback_may_commit_inside_the_step)
{
    callback_log log = {.commit_inside = 1};
    gdn_engine *e = engine_with_callback(&log, GDN_GRAPHS_LAZY);
    const int32_t rows[] = {0}, accepted[] = {2};
    test_set_accepted(e, accepted, 1); /* the sampler's counts are in place before the step runs */
    test_rng rng = test_rng_seeded(4);
    test_fill_slot_state(e, 0, &rng);
    unsigned char *before = test_snapshot_slot(e, 0);
    test_run_step(e, GDN_STEP_VERIFY, 2, 1, rows, NULL);
    unsigned char *after = test_snapshot_slot(e, 0);
    cr_assert_neq(memcmp(before, after, 2 * test_state_bytes(e)), 0, "the step committed");
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_EMISUSE, "already committed by the step");
    free(before), free(after);
    gdn_engine_destroy(e);
}

Test(graphs, capture_callback_errors_reach_the_caller)
{
    callback_log log = {.skip_layer = 2};
    gdn_engine *e = engine_with_callback(&log, GDN_GRAPHS_LAZY);
    const int32_t rows[] = {1};
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_EMISUSE, "a callback that skips a layer is misuse");
    gdn_engine_destroy(e);

    callback_log failing = {.fail = 1};
    e = engine_with_callback(&failing, GDN_GRAPHS_LAZY);
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_ENOTSUP, "the callback's own status");
    gdn_engine_destroy(e);
}

Test(graphs, cpu_backend_ignores_graph_modes)
{
    callback_log log = {0};
    gdn_engine *e = engine_with_callback(&log, GDN_GRAPHS_AT_CREATE);
    cr_assert_eq(log.calls, 0, "the CPU backend captures nothing at creation");
    const int32_t rows[] = {3};
    test_run_step(e, GDN_STEP_DECODE, 1, 1, rows, NULL);
    cr_assert_eq(log.calls, 1);
    gdn_engine_destroy(e);
}

static void scenario_on_cpu(gdn_dtype state_dtype, uint64_t seed)
{
    scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CPU, .graph_mode = GDN_GRAPHS_LAZY,
                          .state_dtype = state_dtype, .layers = 3, .steps = 200, .num_slots = 24, .max_batch = 16,
                          .max_tokens = 4, .seed = seed};
    scenario_result r = run_scenario(&o);
    cr_assert_gt(r.decode_steps, 40);
    cr_assert_gt(r.verify_steps, 40);
    cr_assert_geq(r.buckets_seen, 4, "only %d buckets used", r.buckets_seen);
    cr_assert_gt(r.retired, 20);
    cr_assert_gt(r.forks, 5);
    cr_assert_gt(r.padding_rows, 5);
    cr_assert_gt(r.accepted_zero, 5);
    cr_assert_gt(r.accepted_full, 5);
    cr_log_info("200 steps: %d decode, %d verify, %d admitted, %d retired, %d forks, %d buckets; worst state %.2f%%,"
                " output %.2f%% of tolerance", r.decode_steps, r.verify_steps, r.admitted, r.retired, r.forks,
                r.buckets_seen, 100 * r.worst_state, 100 * r.worst_output);
}

Test(graphs, random_200_step_scenario_fp32_state, .timeout = 300) { scenario_on_cpu(GDN_DTYPE_F32, 91); }
Test(graphs, random_200_step_scenario_bf16_state, .timeout = 300) { scenario_on_cpu(GDN_DTYPE_BF16, 92); }
