/*
 * Host allocation faults (issue 17.4, host part). engine/alloc.c is the library's only host
 * allocator; its test hook (gdn__alloc_fail_after) makes one chosen allocation fail. For each verify
 * strategy, every host allocation that gdn_engine_create makes (CPU backend, where backend memory is
 * host memory too) fails in turn: create returns GDN_ENOMEM, leaves *out alone, frees everything it
 * had allocated (the live-allocation count returns to where it was; the sanitizer build's
 * LeakSanitizer checks the same), and the next create succeeds. The op layer (gdn_op_*) allocates
 * nothing: a whole round of its calls runs with a failure armed, and the allocation counters do not
 * move.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/alloc.h"
#include "gdn/gdn.h"
#include "gdn/gdn_op.h"
#include "support.h"

/* Every test leaves the hook disarmed, whatever happened. */
static void disarm(void) { gdn__alloc_fail_after(-1); }

TestSuite(faults, .fini = disarm);

Test(faults, the_hook_fails_exactly_the_chosen_allocation)
{
    const uint64_t calls = gdn__allocation_count();
    const int64_t live = gdn__allocation_live();
    gdn__alloc_fail_after(2);
    void *a = gdn__malloc(8), *b = gdn__calloc(2, 8);
    cr_assert(a && b, "the first two allocations go through");
    cr_assert_null(gdn__malloc(0), "a zero-size request is NULL and does not count");
    cr_assert_null(gdn__calloc(SIZE_MAX, 2), "an overflowing request is NULL and does not count");
    cr_assert_null(gdn__malloc(8), "the third one fails");
    void *c = gdn__malloc(8);
    cr_assert_not_null(c, "the hook disarms itself after one failure");
    cr_assert_eq(gdn__allocation_count(), calls + 3);
    cr_assert_eq(gdn__allocation_live(), live + 3);
    gdn__free(a), gdn__free(b), gdn__free(c);
    cr_assert_eq(gdn__allocation_live(), live);
    gdn__alloc_fail_after(0);
    gdn__alloc_fail_after(-1);
    void *d = gdn__malloc(8);
    cr_assert_not_null(d, "-1 disarms");
    gdn__free(d);
}

static const char *strategy_name(gdn_verify_strategy s)
{
    return s == GDN_VERIFY_CACHE ? "cache" : s == GDN_VERIFY_FOLD ? "fold" : "ring";
}

/* Every allocation of one create fails in turn (graphs do not exist on the CPU backend). */
static void every_create_allocation_fails_in_turn(gdn_verify_strategy strategy)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 8, 4, 4);
    c.verify_strategy = strategy;
    c.ring_length = strategy == GDN_VERIFY_RING ? 4 : 0;
    const int64_t live = gdn__allocation_live();

    /* How many host allocations a successful create makes. */
    const uint64_t calls = gdn__allocation_count();
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    const int64_t n = (int64_t)(gdn__allocation_count() - calls);
    cr_assert_geq(n, 10, "%s: create made %lld allocations", strategy_name(strategy), (long long)n);
    gdn_engine_destroy(e);
    cr_assert_eq(gdn__allocation_live(), live, "%s: destroy frees every allocation", strategy_name(strategy));

    for (int64_t i = 0; i < n; i++) {
        gdn_engine *sentinel = (gdn_engine *)(uintptr_t)0x1234, *out = sentinel;
        const uint64_t before = gdn__allocation_count();
        gdn__alloc_fail_after(i);
        const gdn_status status = gdn_engine_create(&c, &out);
        disarm();
        cr_assert_eq(status, GDN_ENOMEM, "%s: allocation %lld failed, create gave %s", strategy_name(strategy),
                     (long long)i, gdn_status_name(status));
        cr_assert_eq(out, sentinel, "%s: a failed create must not write *out", strategy_name(strategy));
        /* The allocations before the failed one went through (some code allocates a few, then checks). */
        cr_assert_geq(gdn__allocation_count() - before, (uint64_t)i, "%s: allocation %lld", strategy_name(strategy),
                      (long long)i);
        cr_assert_eq(gdn__allocation_live(), live, "%s: allocation %lld failed and %lld allocations leaked",
                     strategy_name(strategy), (long long)i, (long long)(gdn__allocation_live() - live));
    }

    /* The failure armed past the last allocation never comes: create succeeds. */
    gdn__alloc_fail_after(n);
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    disarm();
    gdn_engine_destroy(e);
    /* And an unarmed create after all those failures works, with a usable engine. */
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    int32_t slot = -1;
    cr_assert_eq(gdn_slot_alloc(e, &slot), GDN_OK);
    cr_assert_eq(gdn_slot_reset(e, slot, NULL), GDN_OK);
    const gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = &slot};
    cr_assert_eq(gdn_engine_begin_step(e, &decode, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    gdn_engine_destroy(e);
    cr_assert_eq(gdn__allocation_live(), live);
}

Test(faults, every_create_allocation_fails_in_turn_cache)
{
    every_create_allocation_fails_in_turn(GDN_VERIFY_CACHE);
}

Test(faults, every_create_allocation_fails_in_turn_fold)
{
    every_create_allocation_fails_in_turn(GDN_VERIFY_FOLD);
}

Test(faults, every_create_allocation_fails_in_turn_ring)
{
    every_create_allocation_fails_in_turn(GDN_VERIFY_RING);
}

/* ---- the op layer allocates nothing ---- */

enum { ROWS = 4, TOKENS = 4, SLOTS = 8 };

/* bf16 1.0 everywhere (q, k, v), 0 in the gates: finite, normalisable inputs. */
static void *bf16_filled(size_t elems, uint16_t bits)
{
    uint16_t *p = malloc(elems * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < elems; i++) p[i] = bits;
    return p;
}

static void op_round_allocates_nothing(gdn_verify_strategy strategy)
{
    gdn_model_config m;
    cr_assert_eq(gdn_model_preset("tiny", 1, &m), GDN_OK);
    const size_t HK = (size_t)m.num_k_heads, HV = (size_t)m.num_v_heads, K = (size_t)m.head_dim_k,
                 V = (size_t)m.head_dim_v, state = HV * V * K, rows = (size_t)ROWS * TOKENS;
    void *q = bf16_filled(rows * HK * K, 0x3f80), *k = bf16_filled(rows * HK * K, 0x3f80);
    void *v = bf16_filled(rows * HV * V, 0x3f80), *a = bf16_filled(rows * HV, 0), *b = bf16_filled(rows * HV, 0);
    float *o = calloc(rows * HV * V, sizeof(float)), *pool = calloc(SLOTS * state, sizeof(float));
    float *params = calloc(2 * HV, sizeof(float)), *host_state = calloc(state, sizeof(float));
    int32_t read_slots[ROWS] = {0, 3, -1, 5}, write_slots[ROWS] = {0, 4, -1, 5}, accepted[ROWS] = {2, 3, 0, 1};
    int32_t flush_slots[ROWS] = {0, 4, 5, -1}, error_flag = 0;
    gdn_op_layer op = {.backend = GDN_BACKEND_CPU, .model = m, .input_dtype = GDN_DTYPE_BF16,
                       .output_dtype = GDN_DTYPE_F32, .kind = GDN_STEP_DECODE, .tokens = 1, .batch = ROWS,
                       .q = {q, 0, 0, 0}, .k = {k, 0, 0, 0}, .v = {v, 0, 0, 0}, .a = {a, 0, 0, 0}, .b = {b, 0, 0, 0},
                       .o = {o, 0, 0, 0}, .A_log = params, .dt_bias = params + HV,
                       .pool = {pool, GDN_DTYPE_F32, SLOTS, (int64_t)state}, .read_slots = read_slots,
                       .write_slots = write_slots, .error_flag = &error_flag, .strategy = strategy,
                       .max_batch = ROWS, .max_tokens = TOKENS, .ring_length = strategy == GDN_VERIFY_RING ? 4 : 0};
    const size_t ws_bytes = gdn_op_workspace_bytes(&op);
    cr_assert_gt(ws_bytes, 0);
    op.workspace = calloc(1, ws_bytes);
    cr_assert(q && k && v && a && b && o && pool && params && host_state && op.workspace);

    /* A whole round of op calls with a failure armed at the very next allocation. */
    const uint64_t calls = gdn__allocation_count(), bytes = gdn__thread_allocated_bytes();
    gdn__alloc_fail_after(0);
    gdn_status s[12];
    int n = 0;
    s[n++] = gdn_op_workspace_bytes(&op) == ws_bytes ? GDN_OK : GDN_EINVAL;
    s[n++] = gdn_op_layer_step(&op, NULL); /* decode */
    op.kind = GDN_STEP_VERIFY, op.tokens = 3;
    s[n++] = gdn_op_layer_step(&op, NULL);
    s[n++] = gdn_op_commit(&op, accepted, NULL);
    op.kind = GDN_STEP_DECODE, op.tokens = 1, op.write_slots = NULL;
    s[n++] = gdn_op_layer_step(&op, NULL);
    s[n++] = gdn_op_flush(&op, flush_slots, 3, NULL);
    s[n++] = gdn_op_slot_copy(&op, 6, 5, NULL);
    s[n++] = gdn_op_slot_import(&op, 7, host_state, NULL);
    s[n++] = gdn_op_slot_reset(&op, 2, NULL);
    s[n++] = gdn_op_slot_export(&op, 6, host_state, NULL);
    s[n++] = gdn_op_slot_export(&op, 0, host_state, NULL);
    const uint64_t calls_after = gdn__allocation_count(), bytes_after = gdn__thread_allocated_bytes();
    void *probe = gdn__malloc(1); /* the armed failure is still waiting: nothing consumed it */
    disarm();

    for (int i = 0; i < n; i++)
        cr_assert_eq(s[i], GDN_OK, "%s: op call %d gave %s", strategy_name(strategy), i, gdn_status_name(s[i]));
    cr_assert_eq(error_flag, 0);
    cr_assert_eq(calls_after, calls, "%s: the op layer called gdn__malloc", strategy_name(strategy));
    cr_assert_eq(bytes_after, bytes, "%s: the op layer allocated %llu bytes on this thread", strategy_name(strategy),
                 (unsigned long long)(bytes_after - bytes));
    cr_assert_null(probe, "%s: an op allocated (the armed failure was consumed)", strategy_name(strategy));
    for (size_t i = 0; i < rows * HV * V; i++) cr_assert(o[i] == o[i], "finite outputs");

    void *all[] = {q, k, v, a, b, o, pool, params, host_state, op.workspace};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

Test(faults, the_op_layer_allocates_nothing_cache) { op_round_allocates_nothing(GDN_VERIFY_CACHE); }
Test(faults, the_op_layer_allocates_nothing_fold) { op_round_allocates_nothing(GDN_VERIFY_FOLD); }
Test(faults, the_op_layer_allocates_nothing_ring) { op_round_allocates_nothing(GDN_VERIFY_RING); }
