/* Slot allocator: order, exhaustion, double free, reset, and slot 0 as an ordinary slot. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn.h"
#include "support.h"

static gdn_engine *small_engine(int32_t slots)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, slots, 4, 4);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    return e;
}

Test(slots, fresh_engine_hands_out_zero_first_then_in_order)
{
    gdn_engine *e = small_engine(4);
    for (int32_t want = 0; want < 4; want++) {
        int32_t s = -1;
        cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
        cr_assert_eq(s, want);
        cr_assert(gdn_slot_is_allocated(e, s));
    }
    cr_assert_eq(gdn_slot_count(e), 4);
    gdn_engine_destroy(e);
}

Test(slots, exhaustion_is_reported_and_changes_nothing)
{
    gdn_engine *e = small_engine(2);
    int32_t s;
    cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
    cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
    int32_t untouched = 77;
    cr_assert_eq(gdn_slot_alloc(e, &untouched), GDN_ESLOT_EXHAUSTED);
    cr_assert_eq(untouched, 77);
    cr_assert_eq(gdn_slot_count(e), 2);
    cr_assert_eq(gdn_slot_free(e, 1), GDN_OK);
    cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
    cr_assert_eq(s, 1, "the freed slot is reused");
    gdn_engine_destroy(e);
}

Test(slots, double_free_and_bad_indices_are_errors)
{
    gdn_engine *e = small_engine(3);
    int32_t s;
    cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
    cr_assert_eq(gdn_slot_free(e, s), GDN_OK);
    cr_assert_eq(gdn_slot_free(e, s), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_free(e, 2), GDN_ESLOT_FREE, "never allocated");
    cr_assert_eq(gdn_slot_free(e, 3), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_slot_free(e, -1), GDN_EINVAL);
    cr_assert_eq(gdn_slot_count(e), 0);
    cr_assert_eq(gdn_slot_alloc(e, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_alloc(NULL, &s), GDN_EINVAL);
    cr_assert_eq(gdn_slot_free(NULL, 0), GDN_EINVAL);
    cr_assert_not(gdn_slot_is_allocated(e, 99));
    cr_assert_not(gdn_slot_is_allocated(NULL, 0));
    gdn_engine_destroy(e);
}

Test(slots, reset_zeroes_every_layer_of_that_slot_only)
{
    gdn_engine *e = small_engine(3);
    test_rng rng = test_rng_seeded(11);
    int32_t a, b;
    gdn_slot_alloc(e, &a);
    gdn_slot_alloc(e, &b);
    test_fill_slot_state(e, a, &rng);
    test_fill_slot_state(e, b, &rng);
    unsigned char *before_b = test_snapshot_slot(e, b);
    cr_assert_eq(gdn_slot_reset(e, a, NULL), GDN_OK);
    for (int32_t l = 0; l < 2; l++) {
        double *s = test_read_state(e, l, a);
        for (size_t i = 0; i < test_state_elems(e); i++) cr_assert_eq(s[i], 0.0);
        free(s);
    }
    unsigned char *after_b = test_snapshot_slot(e, b);
    cr_assert_eq(memcmp(before_b, after_b, 2 * test_state_bytes(e)), 0, "the other slot is untouched");
    cr_assert_eq(gdn_slot_reset(e, 2, NULL), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_reset(e, 3, NULL), GDN_ESLOT_RANGE);
    free(before_b), free(after_b);
    gdn_engine_destroy(e);
}

Test(slots, state_access_checks_layer_and_slot)
{
    gdn_engine *e = small_engine(2);
    int32_t s;
    gdn_slot_alloc(e, &s);
    void *buf = malloc(test_state_bytes(e));
    cr_assert_eq(gdn_slot_read_state(e, 2, s, buf), GDN_ELAYER);
    cr_assert_eq(gdn_slot_read_state(e, -1, s, buf), GDN_ELAYER);
    cr_assert_eq(gdn_slot_read_state(e, 0, 1, buf), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_write_state(e, 0, 5, buf), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_slot_read_state(e, 0, s, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_write_state(NULL, 0, s, buf), GDN_EINVAL);
    free(buf);
    gdn_engine_destroy(e);
}

Test(slots, slot_zero_is_an_ordinary_slot)
{
    /* Slot 0 takes part in a step like any other: its state changes and matches the reference. */
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 2, 2, 1);
    test_rng rng = test_rng_seeded(5);
    float *params;
    gdn_engine *e = test_engine_create(&c, &rng, &params);
    int32_t s0, s1;
    gdn_slot_alloc(e, &s0);
    gdn_slot_alloc(e, &s1);
    cr_assert_eq(s0, 0);
    test_fill_slot_state(e, s0, &rng);
    double *expected = test_read_state(e, 0, s0);
    test_inputs in;
    test_write_inputs(e, 0, 1, 1, &rng, &in);
    const int32_t rows[] = {0};
    test_run_step(e, GDN_STEP_DECODE, 1, 1, rows, NULL);
    test_reference_row(gdn_engine_get_config(e), &in, 0, 1, params, params + 4, expected, NULL);
    double *actual = test_read_state(e, 0, s0);
    cr_assert_leq(test_error_ratio(actual, expected, test_state_elems(e), 1e-6, 1e-6), 1.0);
    test_inputs_free(&in);
    free(expected), free(actual), free(params);
    gdn_engine_destroy(e);
}
