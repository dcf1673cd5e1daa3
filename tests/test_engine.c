/*
 * Engine semantics on the CPU backend (SPEC 3), each checked against an independent float64
 * reference run of the same rows (tests/support.c: straight through gdn__ref_head) or against
 * bit-exact snapshots: decode, padding, verify, commit, read != write slots, bad input, misuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/alloc.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_ref.h"
#include "scenario.h"
#include "slot_ops_checks.h"
#include "support.h"

typedef struct fixture {
    gdn_engine_config config;
    gdn_engine *e;
    float *params; /* [L][2][HV] */
    test_rng rng;
    int32_t slots[16];
    int32_t num_slots_allocated;
} fixture;

static void setup(fixture *f, gdn_dtype state_dtype, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->rng = test_rng_seeded(seed);
    f->config = test_config("tiny", 2, state_dtype, 12, 8, 4);
    f->e = test_engine_create(&f->config, &f->rng, &f->params);
    f->config = *gdn_engine_get_config(f->e);
    /* Allocate every slot, give each a random state, then use them in a scattered order. */
    for (int32_t i = 0; i < 12; i++) {
        cr_assert_eq(gdn_slot_alloc(f->e, &f->slots[i]), GDN_OK);
        test_fill_slot_state(f->e, f->slots[i], &f->rng);
    }
    f->num_slots_allocated = 12;
}

static void teardown(fixture *f)
{
    gdn_engine_destroy(f->e);
    free(f->params);
}

static const float *A_log_of(const fixture *f, int32_t layer) { return f->params + (size_t)layer * 2 * 4; }
static const float *dt_bias_of(const fixture *f, int32_t layer) { return A_log_of(f, layer) + 4; }

/* Tolerances for engine-vs-reference on the CPU backend: the backend is the reference, so only the
 * storage rounding separates them. */
static double state_tol(gdn_dtype d) { return d == GDN_DTYPE_BF16 ? 0.0 : 1e-6; }

/* Writes inputs for every layer and returns them (array of L). */
static test_inputs *write_all_inputs(fixture *f, int32_t B, int32_t T)
{
    test_inputs *in = calloc(2, sizeof *in); /* the fixture has 2 layers */
    cr_assert_eq(f->config.model.num_layers, 2);
    for (int32_t l = 0; l < f->config.model.num_layers; l++) {
        test_write_inputs(f->e, l, B, T, &f->rng, &in[l]);
        test_poison_outputs(f->e, l);
    }
    return in;
}

static void free_all_inputs(fixture *f, test_inputs *in)
{
    for (int32_t l = 0; l < f->config.model.num_layers; l++) test_inputs_free(&in[l]);
    free(in);
}

/* Reads slot `slot` of every layer as double, [L][elems]. */
static double *read_all_layers(fixture *f, int32_t slot)
{
    const size_t n = test_state_elems(f->e);
    double *all = malloc(sizeof(double) * n * (size_t)f->config.model.num_layers);
    for (int32_t l = 0; l < f->config.model.num_layers; l++) {
        double *s = test_read_state(f->e, l, slot);
        memcpy(all + n * (size_t)l, s, sizeof(double) * n);
        free(s);
    }
    return all;
}

/* Expected state of `slot` (read before the step into `before`) after `tokens` tokens of `row`, and
 * the expected outputs of those tokens when out != NULL ([tokens, HV, V] per layer, L of them). */
static void expect_row(fixture *f, const test_inputs *in, const double *before, int32_t row, int32_t tokens,
                       double *state_out, double *out)
{
    const size_t n = test_state_elems(f->e), per_out = (size_t)tokens * 4 * 64;
    memcpy(state_out, before, sizeof(double) * n * (size_t)f->config.model.num_layers);
    for (int32_t l = 0; l < f->config.model.num_layers; l++)
        test_reference_row(&f->config, &in[l], row, tokens, A_log_of(f, l), dt_bias_of(f, l), state_out + n * (size_t)l,
                           out ? out + per_out * (size_t)l : NULL);
    test_round_to(state_out, n * (size_t)f->config.model.num_layers, f->config.state_dtype);
}

static void assert_slot_matches(fixture *f, int32_t slot, const double *expected, double abs_tol, double rel_tol)
{
    double *actual = read_all_layers(f, slot);
    const double ratio = test_error_ratio(actual, expected, test_state_elems(f->e) * (size_t)f->config.model.num_layers,
                                          abs_tol, rel_tol);
    cr_assert_leq(ratio, 1.0, "slot %d: error is %.1f%% of tolerance", slot, 100.0 * ratio);
    free(actual);
}

/* Outputs of row `row` (all T tokens) of layer `layer` against expected [T, HV, V]. */
static void assert_row_outputs(fixture *f, int32_t layer, int32_t B, int32_t T, int32_t row, int32_t tokens,
                               const double *expected)
{
    double *o = test_read_outputs(f->e, layer, B, T);
    const size_t per_token = 4 * 64;
    const gdn_dtype od = f->config.output_dtype;
    double *exp_rounded = malloc(sizeof(double) * per_token * (size_t)tokens);
    memcpy(exp_rounded, expected, sizeof(double) * per_token * (size_t)tokens);
    test_round_to(exp_rounded, per_token * (size_t)tokens, od);
    const double ratio = test_error_ratio(o + (size_t)row * T * per_token, exp_rounded, per_token * (size_t)tokens,
                                          1e-6, od == GDN_DTYPE_BF16 ? 1e-2 : 1e-6);
    cr_assert_leq(ratio, 1.0, "layer %d row %d outputs: %.1f%% of tolerance", layer, row, 100.0 * ratio);
    free(o), free(exp_rounded);
}

static void assert_row_zero(fixture *f, int32_t layer, int32_t B, int32_t T, int32_t row)
{
    double *o = test_read_outputs(f->e, layer, B, T);
    for (size_t i = 0; i < (size_t)T * 4 * 64; i++)
        cr_assert_eq(o[(size_t)row * T * 4 * 64 + i], 0.0, "padding row %d must output zeros", row);
    free(o);
}

/* ---------------------------------------------------------------------------------------------- */

static void decode_matches_reference(gdn_dtype state_dtype, gdn_dtype input_dtype, gdn_dtype output_dtype)
{
    fixture f;
    memset(&f, 0, sizeof f);
    f.rng = test_rng_seeded(100 + state_dtype * 10 + input_dtype * 3 + output_dtype);
    f.config = test_config("tiny", 2, state_dtype, 12, 8, 4);
    f.config.input_dtype = input_dtype;
    f.config.output_dtype = output_dtype;
    f.e = test_engine_create(&f.config, &f.rng, &f.params);
    f.config = *gdn_engine_get_config(f.e);
    for (int32_t i = 0; i < 12; i++) {
        gdn_slot_alloc(f.e, &f.slots[i]);
        test_fill_slot_state(f.e, f.slots[i], &f.rng);
    }
    const int32_t rows[] = {9, 2, 11, 0, 5}; /* scattered; bucket 8 pads rows 5..7 */
    const int32_t B = 5, L = 2;
    double *before[5];
    for (int32_t i = 0; i < B; i++) before[i] = read_all_layers(&f, rows[i]);
    test_inputs *in = write_all_inputs(&f, B, 1);
    int32_t bucket = 0;
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = B, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, &bucket), GDN_OK);
    cr_assert_eq(bucket, 8);
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_OK);

    const size_t n = test_state_elems(f.e);
    double *expected = malloc(sizeof(double) * n * L), *expected_out = malloc(sizeof(double) * 4 * 64 * L);
    for (int32_t i = 0; i < B; i++) {
        expect_row(&f, in, before[i], i, 1, expected, expected_out);
        assert_slot_matches(&f, rows[i], expected, state_tol(state_dtype), state_tol(state_dtype));
        for (int32_t l = 0; l < L; l++) assert_row_outputs(&f, l, B, 1, i, 1, expected_out + (size_t)l * 4 * 64);
        free(before[i]);
    }
    for (int32_t l = 0; l < L; l++)
        for (int32_t pad = B; pad < bucket; pad++) assert_row_zero(&f, l, bucket, 1, pad);
    free(expected), free(expected_out);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, decode_matches_reference_fp32_state)
{
    decode_matches_reference(GDN_DTYPE_F32, GDN_DTYPE_BF16, GDN_DTYPE_BF16);
}

Test(engine, decode_matches_reference_bf16_state)
{
    decode_matches_reference(GDN_DTYPE_BF16, GDN_DTYPE_BF16, GDN_DTYPE_BF16);
}

Test(engine, decode_matches_reference_fp16_inputs_fp32_outputs)
{
    decode_matches_reference(GDN_DTYPE_F32, GDN_DTYPE_F16, GDN_DTYPE_F32);
}

Test(engine, gva_heads_share_their_key_head)
{
    /* tiny: HV 4, HK 2. From a zero state, o[h] = beta_h v_h (k^.q^ of key head h/2) * scale. */
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 2, 1, 1);
    c.output_dtype = GDN_DTYPE_F32;
    test_rng rng = test_rng_seeded(7);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t s;
    gdn_slot_alloc(e, &s);
    test_inputs in;
    test_write_inputs(e, 0, 1, 1, &rng, &in);
    test_run_step(e, GDN_STEP_DECODE, 1, 1, &s, NULL);
    double *o = test_read_outputs(e, 0, 1, 1);
    for (int32_t h = 0; h < 4; h++) {
        const int32_t kh = h / 2;
        const double *q = in.q + kh * 64, *k = in.k + kh * 64;
        double qq = 0, kk = 0, kq = 0;
        for (int i = 0; i < 64; i++) qq += q[i] * q[i], kk += k[i] * k[i], kq += k[i] * q[i];
        const double cos_kq = kq / sqrt((qq + 1e-6) * (kk + 1e-6));
        const double beta = 1.0 / (1.0 + exp(-in.b[h]));
        for (int32_t row = 0; row < 64; row++) {
            const double expected = beta * in.v[h * 64 + row] * cos_kq * 0.125;
            cr_assert_float_eq(o[h * 64 + row], expected, 1e-5 + 1e-5 * fabs(expected), "head %d row %d", h, row);
        }
    }
    free(o);
    test_inputs_free(&in);
    gdn_engine_destroy(e);
}

Test(engine, slots_not_in_the_step_are_bit_exact)
{
    fixture f;
    setup(&f, GDN_DTYPE_BF16, 21);
    unsigned char *before[12];
    for (int32_t s = 0; s < 12; s++) before[s] = test_snapshot_slot(f.e, s);
    const int32_t rows[] = {3, 7, 1};
    test_inputs *in = write_all_inputs(&f, 3, 1);
    test_run_step(f.e, GDN_STEP_DECODE, 1, 3, rows, NULL);
    for (int32_t s = 0; s < 12; s++) {
        unsigned char *after = test_snapshot_slot(f.e, s);
        const int in_step = s == 3 || s == 7 || s == 1;
        const int same = memcmp(before[s], after, 2 * test_state_bytes(f.e)) == 0;
        cr_assert(in_step ? !same : same, "slot %d: in step %d, unchanged %d", s, in_step, same);
        free(after), free(before[s]);
    }
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, padding_rows_output_zero_and_change_no_state)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 22);
    const int32_t rows[] = {4, -1, 6, -7, 2}; /* explicit padding rows in the middle */
    unsigned char *before[12];
    for (int32_t s = 0; s < 12; s++) before[s] = test_snapshot_slot(f.e, s);
    double *b4 = read_all_layers(&f, 4);
    test_inputs *in = write_all_inputs(&f, 5, 1);
    test_run_step(f.e, GDN_STEP_DECODE, 1, 5, rows, NULL);
    for (int32_t l = 0; l < 2; l++) {
        assert_row_zero(&f, l, 8, 1, 1);
        assert_row_zero(&f, l, 8, 1, 3);
        for (int32_t pad = 5; pad < 8; pad++) assert_row_zero(&f, l, 8, 1, pad);
    }
    for (int32_t s = 0; s < 12; s++) {
        unsigned char *after = test_snapshot_slot(f.e, s);
        if (s != 4 && s != 6 && s != 2) cr_assert_eq(memcmp(before[s], after, 2 * test_state_bytes(f.e)), 0);
        free(after), free(before[s]);
    }
    /* The live row after the padding row still used its own inputs (row index 0). */
    double *expected = malloc(sizeof(double) * test_state_elems(f.e) * 2);
    expect_row(&f, in, b4, 0, 1, expected, NULL);
    assert_slot_matches(&f, 4, expected, 1e-6, 1e-6);
    free(expected), free(b4);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, verify_outputs_every_token_and_leaves_the_pool_untouched)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 23);
    const int32_t rows[] = {8, 3, 10};
    const int32_t B = 3, T = 4;
    unsigned char *before_bytes[12];
    for (int32_t s = 0; s < 12; s++) before_bytes[s] = test_snapshot_slot(f.e, s);
    double *before[3];
    for (int32_t i = 0; i < B; i++) before[i] = read_all_layers(&f, rows[i]);
    test_inputs *in = write_all_inputs(&f, B, T);
    test_run_step(f.e, GDN_STEP_VERIFY, T, B, rows, NULL);
    for (int32_t s = 0; s < 12; s++) {
        unsigned char *after = test_snapshot_slot(f.e, s);
        cr_assert_eq(memcmp(before_bytes[s], after, 2 * test_state_bytes(f.e)), 0, "verify wrote slot %d", s);
        free(after), free(before_bytes[s]);
    }
    double *state = malloc(sizeof(double) * test_state_elems(f.e) * 2);
    double *out = malloc(sizeof(double) * T * 4 * 64 * 2);
    for (int32_t i = 0; i < B; i++) {
        expect_row(&f, in, before[i], i, T, state, out);
        for (int32_t l = 0; l < 2; l++) assert_row_outputs(&f, l, B, T, i, T, out + (size_t)l * T * 4 * 64);
        free(before[i]);
    }
    free(state), free(out);
    free_all_inputs(&f, in);
    teardown(&f);
}

/* Verify T tokens on `rows`, commit `accepted`, and check each slot against the reference of its
 * accepted prefix (bit-exact on the CPU backend: the cache entry is the reference's rounded state). */
static void verify_commit_check(gdn_dtype state_dtype, const int32_t *accepted_counts, uint64_t seed)
{
    fixture f;
    setup(&f, state_dtype, seed);
    const int32_t rows[] = {5, 0, 9, 2, 7};
    const int32_t B = 5, T = 4;
    double *before[5];
    for (int32_t i = 0; i < B; i++) before[i] = read_all_layers(&f, rows[i]);
    test_inputs *in = write_all_inputs(&f, B, T);
    test_run_step(f.e, GDN_STEP_VERIFY, T, B, rows, NULL);
    test_set_accepted(f.e, accepted_counts, B);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    int clamped = 0; /* a count outside 0..T is clamped and raises the device flag (cleared by the check) */
    for (int32_t i = 0; i < B; i++) clamped |= accepted_counts[i] < 0 || accepted_counts[i] > T;
    cr_assert_eq(gdn_engine_check_device_error(f.e, NULL), clamped ? GDN_EDEVICE : GDN_OK);
    cr_assert_eq(gdn_engine_check_device_error(f.e, NULL), GDN_OK);
    double *expected = malloc(sizeof(double) * test_state_elems(f.e) * 2);
    for (int32_t i = 0; i < B; i++) {
        int32_t n = accepted_counts[i] < 0 ? 0 : (accepted_counts[i] > T ? T : accepted_counts[i]);
        if (n == 0) {
            memcpy(expected, before[i], sizeof(double) * test_state_elems(f.e) * 2);
        } else {
            expect_row(&f, in, before[i], i, n, expected, NULL);
        }
        double *actual = read_all_layers(&f, rows[i]);
        cr_assert_eq(memcmp(actual, expected, sizeof(double) * test_state_elems(f.e) * 2), 0,
                     "row %d (accepted %d) is not bit-exact with the reference", i, n);
        free(actual);
        free(before[i]);
    }
    free(expected);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, commit_advances_each_row_by_its_accepted_count_fp32)
{
    const int32_t accepted[] = {0, 1, 2, 3, 4};
    verify_commit_check(GDN_DTYPE_F32, accepted, 31);
}

Test(engine, commit_advances_each_row_by_its_accepted_count_bf16)
{
    const int32_t accepted[] = {4, 3, 0, 2, 1};
    verify_commit_check(GDN_DTYPE_BF16, accepted, 32);
}

Test(engine, commit_clamps_accepted_counts_out_of_range)
{
    const int32_t accepted[] = {-3, 99, 4, 0, -1};
    verify_commit_check(GDN_DTYPE_F32, accepted, 33);
}

Test(engine, committing_a_tokens_equals_a_decode_steps)
{
    /* Same tokens: verify T=4 + commit 3 on one engine, three decode steps on a twin engine. */
    const int32_t T = 4, a = 3, B = 2;
    const int32_t rows[] = {1, 4};
    fixture f, g;
    setup(&f, GDN_DTYPE_F32, 41);
    setup(&g, GDN_DTYPE_F32, 41); /* identical states and parameters */
    test_inputs *in = write_all_inputs(&f, B, T);
    test_run_step(f.e, GDN_STEP_VERIFY, T, B, rows, NULL);
    const int32_t accepted[] = {a, a};
    test_set_accepted(f.e, accepted, B);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);

    /* Feed the twin the same tokens one at a time, in its input dtype (bf16: exact copies). */
    const size_t esize = 2, HK = 2, HV = 4, D = 64;
    uint16_t *buf = malloc(esize * HV * D * (size_t)B);
    for (int32_t t = 0; t < a; t++) {
        for (int32_t l = 0; l < 2; l++) {
            gdn_layer_io io;
            gdn_engine_layer_io(g.e, l, &io);
            struct { void *dst; const double *src; size_t per_token; } parts[] = {
                {io.q, in[l].q, HK * D}, {io.k, in[l].k, HK * D}, {io.v, in[l].v, HV * D}, {io.a, in[l].a, HV}, {io.b, in[l].b, HV},
            };
            for (size_t p = 0; p < 5; p++) {
                for (int32_t i = 0; i < B; i++)
                    for (size_t j = 0; j < parts[p].per_token; j++)
                        buf[(size_t)i * parts[p].per_token + j] =
                            gdn__f32_to_bf16((float)parts[p].src[((size_t)i * T + t) * parts[p].per_token + j]);
                gdn_engine_upload(g.e, parts[p].dst, buf, esize * parts[p].per_token * (size_t)B, NULL);
            }
        }
        test_run_step(g.e, GDN_STEP_DECODE, 1, B, rows, NULL);
    }
    for (int32_t i = 0; i < B; i++) {
        double *via_commit = read_all_layers(&f, rows[i]);
        double *via_decode = read_all_layers(&g, rows[i]);
        const double ratio = test_error_ratio(via_commit, via_decode, test_state_elems(f.e) * 2, 1e-6, 1e-5);
        cr_assert_leq(ratio, 1.0, "row %d: %.1f%% of tolerance", i, 100 * ratio);
        free(via_commit), free(via_decode);
    }
    free(buf);
    free_all_inputs(&f, in);
    teardown(&f);
    teardown(&g);
}

Test(engine, separate_write_slots_leave_the_read_slot_unchanged)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 51);
    const int32_t reads[] = {2, 6}, writes[] = {3, 6}; /* row 0 forks 2 -> 3; row 1 in place */
    unsigned char *read_before = test_snapshot_slot(f.e, 2);
    double *b2 = read_all_layers(&f, 2), *b6 = read_all_layers(&f, 6);
    test_inputs *in = write_all_inputs(&f, 2, 1);
    test_run_step(f.e, GDN_STEP_DECODE, 1, 2, reads, writes);
    unsigned char *read_after = test_snapshot_slot(f.e, 2);
    cr_assert_eq(memcmp(read_before, read_after, 2 * test_state_bytes(f.e)), 0);
    double *expected = malloc(sizeof(double) * test_state_elems(f.e) * 2);
    expect_row(&f, in, b2, 0, 1, expected, NULL);
    assert_slot_matches(&f, 3, expected, 1e-6, 1e-6);
    expect_row(&f, in, b6, 1, 1, expected, NULL);
    assert_slot_matches(&f, 6, expected, 1e-6, 1e-6);
    /* Verify + commit with a separate write slot: the commit lands in the write slot. */
    const int32_t reads2[] = {8}, writes2[] = {9};
    double *b8 = read_all_layers(&f, 8);
    free_all_inputs(&f, in);
    in = write_all_inputs(&f, 1, 3);
    test_run_step(f.e, GDN_STEP_VERIFY, 3, 1, reads2, writes2);
    const int32_t accepted[] = {2};
    test_set_accepted(f.e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    expect_row(&f, in, b8, 0, 2, expected, NULL);
    assert_slot_matches(&f, 9, expected, 1e-6, 1e-6);
    double *a8 = read_all_layers(&f, 8);
    cr_assert_eq(memcmp(a8, b8, sizeof(double) * test_state_elems(f.e) * 2), 0);
    free(read_before), free(read_after), free(b2), free(b6), free(b8), free(a8), free(expected);
    free_all_inputs(&f, in);
    teardown(&f);
}

/* ---- bad input: each its own status, and nothing changes ---------------------------------------- */

Test(engine, bad_steps_return_their_status_and_change_nothing)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 61);
    /* A verify step that is run but not yet committed: every failed begin below must leave it
     * committable, and must not touch any state. */
    const int32_t rows[] = {1, 2};
    double *b1 = read_all_layers(&f, 1);
    test_inputs *in = write_all_inputs(&f, 2, 3);
    test_run_step(f.e, GDN_STEP_VERIFY, 3, 2, rows, NULL);
    unsigned char *snap[12];
    for (int32_t s = 0; s < 12; s++) snap[s] = test_snapshot_slot(f.e, s);

    cr_assert_eq(gdn_slot_free(f.e, 11), GDN_OK); /* slot 11 is now free */
    const int32_t ok[] = {3, 4}, dup_read[] = {3, 3}, out_of_range[] = {3, 12}, freed[] = {11},
                  dup_write_reads[] = {3, 4}, dup_write[] = {5, 5}, conflict_writes[] = {4, 4};
    struct { gdn_step step; gdn_status expected; } cases[] = {
        {{.kind = (gdn_step_kind)5, .tokens = 1, .batch = 2, .slots = ok}, GDN_ESTEP_KIND},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 9, .slots = ok}, GDN_ESTEP_BATCH},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = -1, .slots = ok}, GDN_ESTEP_BATCH},
        {{.kind = GDN_STEP_DECODE, .tokens = 2, .batch = 2, .slots = ok}, GDN_ESTEP_TOKENS},
        {{.kind = GDN_STEP_VERIFY, .tokens = 0, .batch = 2, .slots = ok}, GDN_ESTEP_TOKENS},
        {{.kind = GDN_STEP_VERIFY, .tokens = 5, .batch = 2, .slots = ok}, GDN_ESTEP_TOKENS},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = out_of_range}, GDN_ESLOT_RANGE},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = freed}, GDN_ESLOT_FREE},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = dup_read}, GDN_ESLOT_DUP},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = dup_write_reads, .write_slots = dup_write}, GDN_ESLOT_DUP},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = dup_write_reads, .write_slots = conflict_writes}, GDN_ESLOT_DUP},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = ok, .write_slots = freed}, GDN_ESLOT_FREE},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = ok, .write_slots = out_of_range + 1}, GDN_ESLOT_RANGE},
        {{.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = NULL}, GDN_EINVAL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t bucket = -5;
        gdn_status got = gdn_engine_begin_step(f.e, &cases[c].step, NULL, &bucket);
        cr_assert_eq(got, cases[c].expected, "case %zu: got %s, wanted %s", c, gdn_status_name(got),
                     gdn_status_name(cases[c].expected));
        cr_assert_eq(bucket, -5, "case %zu wrote the bucket", c);
    }
    cr_assert_eq(gdn_engine_begin_step(f.e, NULL, NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_begin_step(NULL, &cases[0].step, NULL, NULL), GDN_EINVAL);
    for (int32_t s = 0; s < 11; s++) {
        unsigned char *now = test_snapshot_slot(f.e, s);
        cr_assert_eq(memcmp(now, snap[s], 2 * test_state_bytes(f.e)), 0, "slot %d changed", s);
        free(now);
    }
    /* The verify step survived all of that. */
    const int32_t accepted[] = {2, 0};
    test_set_accepted(f.e, accepted, 2);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    double *expected = malloc(sizeof(double) * test_state_elems(f.e) * 2);
    expect_row(&f, in, b1, 0, 2, expected, NULL);
    assert_slot_matches(&f, 1, expected, 1e-6, 1e-6);
    for (int32_t s = 0; s < 12; s++) free(snap[s]);
    free(expected), free(b1);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, commit_out_of_order_is_misuse)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 62);
    const int32_t rows[] = {1};
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE, "no step yet");
    test_inputs *in = write_all_inputs(&f, 1, 2);
    test_run_step(f.e, GDN_STEP_DECODE, 1, 1, rows, NULL);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE, "a decode step has nothing to commit");
    gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 1, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(f.e, &verify, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(f.e, 1, NULL), GDN_OK);
    unsigned char *before = test_snapshot_slot(f.e, 1);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE, "layer 0 has not run");
    unsigned char *after = test_snapshot_slot(f.e, 1);
    cr_assert_eq(memcmp(before, after, 2 * test_state_bytes(f.e)), 0);
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_OK);
    const int32_t accepted[] = {1};
    test_set_accepted(f.e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE, "committed twice");
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_EMISUSE, "running a committed step");
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_EMISUSE);
    cr_assert_eq(gdn_engine_commit(NULL, NULL), GDN_EINVAL);
    free(before), free(after);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, run_layer_checks_its_arguments)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 63);
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_EMISUSE, "no step begun");
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_EMISUSE);
    const int32_t rows[] = {1};
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(f.e, 2, NULL), GDN_ELAYER);
    cr_assert_eq(gdn_engine_run_layer(f.e, -1, NULL), GDN_ELAYER);
    cr_assert_eq(gdn_engine_run_layer(NULL, 0, NULL), GDN_EINVAL);
    gdn_layer_io io;
    cr_assert_eq(gdn_engine_layer_io(f.e, 2, &io), GDN_ELAYER);
    cr_assert_eq(gdn_engine_layer_io(f.e, 0, NULL), GDN_EINVAL);
    gdn_state_pool pool;
    cr_assert_eq(gdn_engine_state_pool(f.e, 5, &pool), GDN_ELAYER);
    cr_assert_eq(gdn_engine_state_pool(f.e, 1, &pool), GDN_OK);
    cr_assert_eq(pool.num_slots, 12);
    cr_assert_eq(pool.slot_stride, 4 * 64 * 64);
    cr_assert_eq(pool.dtype, GDN_DTYPE_F32);
    const float params[4] = {0};
    cr_assert_eq(gdn_engine_set_layer_params(f.e, 2, params, params), GDN_ELAYER);
    cr_assert_eq(gdn_engine_set_layer_params(f.e, 0, NULL, params), GDN_EINVAL);
    cr_assert_eq(gdn_engine_upload(f.e, NULL, params, 4, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_download(f.e, (void *)params, NULL, 4, NULL), GDN_EINVAL);
    cr_assert_null(gdn_engine_accepted(NULL));
    teardown(&f);
}

Test(engine, state_pool_exposes_the_slot_layout)
{
    /* Writing through the pool pointer (CPU backend: host memory) is what the slot API reads back. */
    fixture f;
    setup(&f, GDN_DTYPE_F32, 64);
    gdn_state_pool pool;
    cr_assert_eq(gdn_engine_state_pool(f.e, 1, &pool), GDN_OK);
    float *p = (float *)pool.data + 5 * pool.slot_stride + (2 * 64 + 3) * 64 + 7; /* slot 5, h 2, v 3, k 7 */
    *p = 1234.5f;
    double *s = test_read_state(f.e, 1, 5);
    cr_assert_eq(s[(2 * 64 + 3) * 64 + 7], 1234.5);
    free(s);
    teardown(&f);
}

Test(engine, empty_step_runs_and_commits_nothing)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 65);
    unsigned char *before = test_snapshot_slot(f.e, 0);
    test_run_step(f.e, GDN_STEP_VERIFY, 2, 0, NULL, NULL);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    unsigned char *after = test_snapshot_slot(f.e, 0);
    cr_assert_eq(memcmp(before, after, 2 * test_state_bytes(f.e)), 0);
    free(before), free(after);
    teardown(&f);
}

Test(engine, begin_step_picks_the_smallest_bucket)
{
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 40, 40, 1);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    int32_t slots[40];
    for (int32_t i = 0; i < 40; i++) gdn_slot_alloc(e, &slots[i]);
    const int32_t batches[] = {1, 2, 3, 5, 8, 9, 17, 33, 40}, buckets[] = {1, 2, 4, 8, 8, 16, 24, 40, 40};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = batches[i], .slots = slots};
        int32_t bucket = 0;
        cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, &bucket), GDN_OK);
        cr_assert_eq(bucket, buckets[i], "batch %d", batches[i]);
    }
    gdn_engine_destroy(e);
}

Test(engine, uncommitted_verify_is_dropped_by_the_next_step)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 66);
    const int32_t rows[] = {4};
    unsigned char *before = test_snapshot_slot(f.e, 4);
    test_inputs *in = write_all_inputs(&f, 1, 3);
    test_run_step(f.e, GDN_STEP_VERIFY, 3, 1, rows, NULL);
    const int32_t other[] = {5};
    test_run_step(f.e, GDN_STEP_DECODE, 1, 1, other, NULL);
    unsigned char *after = test_snapshot_slot(f.e, 4);
    cr_assert_eq(memcmp(before, after, 2 * test_state_bytes(f.e)), 0);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE);
    free(before), free(after);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, layers_run_one_by_one_equal_a_whole_step)
{
    fixture f, g;
    setup(&f, GDN_DTYPE_BF16, 67);
    setup(&g, GDN_DTYPE_BF16, 67);
    test_inputs *in_f = write_all_inputs(&f, 2, 1);
    test_inputs *in_g = write_all_inputs(&g, 2, 1); /* same seed: identical inputs */
    const int32_t rows[] = {6, 1};
    test_run_step(f.e, GDN_STEP_DECODE, 1, 2, rows, NULL);
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(g.e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(g.e, 1, NULL), GDN_OK); /* reverse order */
    cr_assert_eq(gdn_engine_run_layer(g.e, 0, NULL), GDN_OK);
    for (int32_t i = 0; i < 2; i++) {
        unsigned char *a = test_snapshot_slot(f.e, rows[i]), *b = test_snapshot_slot(g.e, rows[i]);
        cr_assert_eq(memcmp(a, b, 2 * test_state_bytes(f.e)), 0);
        free(a), free(b);
    }
    free_all_inputs(&f, in_f);
    free_all_inputs(&g, in_g);
    teardown(&f);
    teardown(&g);
}

Test(engine, reference_treats_out_of_range_slots_as_padding_and_flags_them)
{
    /* The host API refuses such slots, so drive the reference directly, as a kernel would see it. */
    const int32_t HV = 4, K = 64, V = 64, B = 2;
    float *state = calloc((size_t)2 * HV * V * K, sizeof(float));
    for (size_t i = 0; i < (size_t)2 * HV * V * K; i++) state[i] = 0.01f * (float)(i % 97);
    float *copy = malloc(sizeof(float) * 2 * HV * V * K);
    memcpy(copy, state, sizeof(float) * 2 * HV * V * K);
    uint16_t in_qk[B * 2 * 64], in_v[B * HV * 64], in_g[B * HV];
    for (size_t i = 0; i < sizeof in_qk / 2; i++) in_qk[i] = 0x3f80; /* 1.0 */
    for (size_t i = 0; i < sizeof in_v / 2; i++) in_v[i] = 0x3f80;
    for (size_t i = 0; i < sizeof in_g / 2; i++) in_g[i] = 0;
    float out[B * HV * 64], A_log[4] = {0}, dt_bias[4] = {0};
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) out[i] = 99.0f;
    const int32_t reads[] = {2, 1}; /* row 0: slot 2 >= num_slots 2 */
    int32_t flag = 0;
    gdn__layer_params p = {.B = B, .T = 1, .HK = 2, .HV = HV, .K = K, .V = V, .scale = 0.125f, .use_qk_l2norm = 1,
                           .input_dtype = GDN_DTYPE_BF16, .q = in_qk, .k = in_qk, .v = in_v, .a = in_g, .b = in_g,
                           .A_log = A_log, .dt_bias = dt_bias, .state_dtype = GDN_DTYPE_F32, .state = state,
                           .num_slots = 2, .slot_stride = (int64_t)HV * V * K, .read_slots = reads,
                           .output_dtype = GDN_DTYPE_F32, .out = out, .error_flag = &flag};
    cr_assert_eq(gdn__ref_layer_step(&p), GDN_OK);
    cr_assert_eq(flag, 1);
    for (int i = 0; i < HV * 64; i++) cr_assert_eq(out[i], 0.0f);
    cr_assert_neq(out[HV * 64], 99.0f, "the valid row ran");
    cr_assert_eq(memcmp(state, copy, sizeof(float) * HV * V * K), 0, "slot 0 untouched");
    free(state), free(copy);
}

Test(engine, cpu_backend_reports_no_device_error)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 68);
    cr_assert_eq(gdn_engine_backend(f.e), GDN_BACKEND_CPU);
    cr_assert_eq(gdn_engine_check_device_error(f.e, NULL), GDN_OK);
    cr_assert_str_eq(gdn_engine_last_error(f.e), "");
    teardown(&f);
}

Test(engine, step_path_allocates_no_host_memory)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 69);
    test_inputs *in = write_all_inputs(&f, 3, 4);
    const int32_t rows[] = {0, 5, 9}, accepted[] = {1, 4, 0};
    test_set_accepted(f.e, accepted, 3);
    gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 4, .batch = 3, .slots = rows};
    gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 3, .slots = rows};
    const uint64_t before = gdn__thread_allocated_bytes(), calls_before = gdn__allocation_count();
    gdn_status s1 = gdn_engine_begin_step(f.e, &verify, NULL, NULL);
    gdn_status s2 = gdn_engine_run_step(f.e, NULL);
    gdn_status s3 = gdn_engine_commit(f.e, NULL);
    gdn_status s4 = gdn_engine_begin_step(f.e, &decode, NULL, NULL);
    gdn_status s5 = gdn_engine_run_step(f.e, NULL);
    const uint64_t after = gdn__thread_allocated_bytes(), calls_after = gdn__allocation_count();
    cr_assert(s1 == GDN_OK && s2 == GDN_OK && s3 == GDN_OK && s4 == GDN_OK && s5 == GDN_OK);
    cr_assert_gt(before, 0, "jemalloc's thread.allocated counter is readable");
    cr_assert_eq(after, before, "the step path allocated %llu bytes", (unsigned long long)(after - before));
    cr_assert_eq(calls_after, calls_before, "the step path called gdn__malloc");
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, a_layer_runs_at_most_once_per_step)
{
    fixture f, g;
    setup(&f, GDN_DTYPE_F32, 70);
    setup(&g, GDN_DTYPE_F32, 70);
    test_inputs *in_f = write_all_inputs(&f, 1, 1), *in_g = write_all_inputs(&g, 1, 1);
    const int32_t rows[] = {3};
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_EMISUSE, "a second run would apply the token twice");
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_EMISUSE, "run_step after run_layer would repeat layer 0");
    cr_assert_eq(gdn_engine_run_layer(f.e, 1, NULL), GDN_OK);
    test_run_step(g.e, GDN_STEP_DECODE, 1, 1, rows, NULL); /* the twin runs each layer once */
    unsigned char *a = test_snapshot_slot(f.e, 3), *b = test_snapshot_slot(g.e, 3);
    cr_assert_eq(memcmp(a, b, 2 * test_state_bytes(f.e)), 0, "the refused calls changed the state");
    free(a), free(b);
    free_all_inputs(&f, in_f), free_all_inputs(&g, in_g);
    teardown(&f), teardown(&g);
}

/* What a step still needs cannot be freed or reset (gdn.h: reset has "the same errors as free"):
 * the read and write slots while a layer is left to run, the verify's slots until its commit; a
 * refused call changes no byte; a slot outside the step, or of a finished step, is released. */
typedef gdn_status (*slot_release)(gdn_engine *engine, int32_t slot);
static gdn_status release_by_free(gdn_engine *e, int32_t slot) { return gdn_slot_free(e, slot); }
static gdn_status release_by_reset(gdn_engine *e, int32_t slot) { return gdn_slot_reset(e, slot, NULL); }

static void slots_of_an_unfinished_step_are_refused(slot_release release, uint64_t seed)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, seed);
    test_inputs *in = write_all_inputs(&f, 2, 2);
    const int32_t reads[] = {2, 4}, writes[] = {2, 5};
    gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 2, .slots = reads, .write_slots = writes};
    cr_assert_eq(gdn_engine_begin_step(f.e, &decode, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_layer(f.e, 0, NULL), GDN_OK);
    unsigned char *before4 = test_snapshot_slot(f.e, 4), *before5 = test_snapshot_slot(f.e, 5);
    cr_assert_eq(release(f.e, 4), GDN_ESLOT_BUSY, "read slot, layer 1 still to run");
    cr_assert_eq(release(f.e, 5), GDN_ESLOT_BUSY, "write slot, layer 1 still to run");
    cr_assert(gdn_slot_is_allocated(f.e, 4) && gdn_slot_is_allocated(f.e, 5));
    unsigned char *after4 = test_snapshot_slot(f.e, 4), *after5 = test_snapshot_slot(f.e, 5);
    cr_assert_eq(memcmp(before4, after4, 2 * test_state_bytes(f.e)), 0, "a refused call changed slot 4");
    cr_assert_eq(memcmp(before5, after5, 2 * test_state_bytes(f.e)), 0, "a refused call changed slot 5");
    free(before4), free(before5), free(after4), free(after5);
    cr_assert_eq(release(f.e, 7), GDN_OK, "a slot outside the step may go");
    cr_assert_eq(gdn_engine_run_layer(f.e, 1, NULL), GDN_OK);
    cr_assert_eq(release(f.e, 4), GDN_OK, "a finished decode step needs nothing more");

    gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 1, .slots = reads};
    test_run_step(f.e, verify.kind, verify.tokens, verify.batch, verify.slots, NULL);
    cr_assert_eq(release(f.e, 2), GDN_ESLOT_BUSY, "the verify step's commit would write slot 2");
    const int32_t accepted[] = {1};
    test_set_accepted(f.e, accepted, 1);
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_OK);
    cr_assert_eq(release(f.e, 2), GDN_OK);
    free_all_inputs(&f, in);
    teardown(&f);
}

Test(engine, slots_of_an_unfinished_step_cannot_be_freed) { slots_of_an_unfinished_step_are_refused(release_by_free, 71); }
Test(engine, slots_of_an_unfinished_step_cannot_be_reset) { slots_of_an_unfinished_step_are_refused(release_by_reset, 72); }

/* State reads and writes in the middle of a step: a write to a slot the step still needs is refused
 * under every strategy (it would change what a layer still to run reads, or be lost at the commit);
 * a read is refused under the ring strategy only (it would write back the records the commit is
 * about to count), and elsewhere returns the state the pool holds. After the commit both work, and
 * the committed state is the one a step without the attempts gives. */
static void state_access_mid_step(gdn_verify_strategy strategy, uint64_t seed)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 6, 4, 3);
    c.verify_strategy = strategy;
    c.ring_length = 4;
    gdn_engine *e[2];
    int32_t slots[2];
    for (int k = 0; k < 2; k++) {
        test_rng rng = test_rng_seeded(seed);
        e[k] = test_engine_create(&c, &rng, NULL);
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(gdn_slot_alloc(e[k], &slots[i]), GDN_OK);
            test_fill_slot_state(e[k], slots[i], &rng);
        }
    }
    const size_t bytes = test_state_bytes(e[0]);
    unsigned char *buf = malloc(bytes);
    const int32_t accepted[2] = {2, 1};
    for (int k = 0; k < 2; k++) {
        test_run_step(e[k], GDN_STEP_DECODE, 1, 2, slots, NULL); /* records / pending work in place */
        test_set_accepted(e[k], accepted, 2);
        gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 3, .batch = 2, .slots = slots};
        cr_assert_eq(gdn_engine_begin_step(e[k], &verify, NULL, NULL), GDN_OK);
        if (k == 1) { /* between begin and the layers */
            cr_assert_eq(gdn_slot_write_state(e[k], 0, slots[0], buf), GDN_ESLOT_BUSY);
            cr_assert_eq(gdn_slot_read_state(e[k], 0, slots[0], buf),
                         strategy == GDN_VERIFY_RING ? GDN_ESLOT_BUSY : GDN_OK);
        }
        cr_assert_eq(gdn_engine_run_step(e[k], NULL), GDN_OK);
        if (k == 1) { /* between the verify and its commit */
            cr_assert_eq(gdn_slot_write_state(e[k], 1, slots[1], buf), GDN_ESLOT_BUSY);
            cr_assert_eq(gdn_slot_read_state(e[k], 1, slots[1], buf),
                         strategy == GDN_VERIFY_RING ? GDN_ESLOT_BUSY : GDN_OK);
        }
        cr_assert_eq(gdn_engine_commit(e[k], NULL), GDN_OK);
    }
    for (int i = 0; i < 2; i++) {
        unsigned char *a = test_snapshot_slot(e[0], slots[i]), *b = test_snapshot_slot(e[1], slots[i]);
        cr_assert_eq(memcmp(a, b, 2 * bytes), 0, "slot %d after the commit", slots[i]);
        free(a), free(b);
    }
    cr_assert_eq(gdn_slot_write_state(e[1], 0, slots[0], buf), GDN_OK, "after the commit");
    free(buf);
    gdn_engine_destroy(e[0]);
    gdn_engine_destroy(e[1]);
}

Test(engine, state_access_mid_step_cache) { state_access_mid_step(GDN_VERIFY_CACHE, 93); }
Test(engine, state_access_mid_step_fold) { state_access_mid_step(GDN_VERIFY_FOLD, 94); }
Test(engine, state_access_mid_step_ring) { state_access_mid_step(GDN_VERIFY_RING, 95); }

Test(engine, null_engine_queries_are_safe)
{
    cr_assert_eq(gdn_engine_backend(NULL), GDN_BACKEND_AUTO);
    cr_assert_null(gdn_engine_get_config(NULL));
    cr_assert_str_eq(gdn_engine_last_error(NULL), "");
    cr_assert_eq(gdn_slot_count(NULL), 0);
    cr_assert_eq(gdn_engine_memory(NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_synchronize(NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_check_device_error(NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_reset(NULL, 0, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_state_pool(NULL, 0, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_layer_io(NULL, 0, NULL), GDN_EINVAL);
}

Test(engine, k_not_equal_v_and_l2norm_off) { run_odd_geometry_steps(GDN_BACKEND_CPU); }

/* ---------------------------------------------------------------------------------------------- */
/* Caller-owned work (GDN_STEP_CALLER_WORK)                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Twin engines, one driven the ordinary way (run_step, commit), one with caller-owned work
 * (begin_step with GDN_STEP_CALLER_WORK, then enqueue_rows, the layers in reverse order, and the
 * commit), over steps with padding, forks, every accepted count and slots freed and reused (their
 * pending tokens / ring records cleared by the next step's fetch): outputs and raw pools bit-exact. */
static void caller_work_matches_engine_work(gdn_verify_strategy strategy, uint64_t seed)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 10, 6, 3);
    c.verify_strategy = strategy;
    c.ring_length = 4;
    gdn_engine *e[2];
    for (int k = 0; k < 2; k++) {
        test_rng rng = test_rng_seeded(seed);
        e[k] = test_engine_create(&c, &rng, NULL);
        for (int32_t s = 0; s < 10; s++) {
            int32_t slot;
            cr_assert_eq(gdn_slot_alloc(e[k], &slot), GDN_OK);
            test_fill_slot_state(e[k], slot, &rng);
        }
    }
    test_rng plan = test_rng_seeded(seed + 1);
    for (int step = 0; step < 24; step++) {
        const int verify = step % 3 != 2;
        const int32_t T = verify ? 1 + test_rng_below(&plan, 3) : 1, B = test_rng_below(&plan, 7);
        int32_t rows[6], writes[6], accepted[6], used[10] = {0};
        for (int32_t i = 0; i < B; i++) {
            int32_t s;
            do s = test_rng_below(&plan, 10);
            while (used[s]);
            used[s] = 1;
            rows[i] = test_rng_below(&plan, 6) == 0 ? -1 : s;
            writes[i] = rows[i];
            accepted[i] = test_rng_below(&plan, T + 1);
        }
        int fork = 0;
        for (int32_t s = 0; s < 10 && B > 0 && rows[0] >= 0 && step % 4 == 1; s++)
            if (!used[s]) writes[0] = s, fork = 1, s = 10;
        for (int k = 0; k < 2; k++) {
            test_rng inputs = test_rng_seeded(seed * 100 + (uint64_t)step);
            for (int32_t l = 0; l < 2; l++) {
                test_inputs in;
                test_write_inputs(e[k], l, B, T, &inputs, &in);
                test_inputs_free(&in);
                test_poison_outputs(e[k], l);
            }
            gdn_step st = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = B, .slots = rows,
                           .write_slots = fork ? writes : NULL, .flags = k == 1 ? GDN_STEP_CALLER_WORK : 0};
            cr_assert_eq(gdn_engine_begin_step(e[k], &st, NULL, NULL), GDN_OK);
            if (k == 0) {
                cr_assert_eq(gdn_engine_run_step(e[k], NULL), GDN_OK);
            } else {
                cr_assert_eq(gdn_engine_run_layer(e[k], 0, NULL), GDN_EMISUSE, "the caller owns this step's work");
                cr_assert_eq(gdn_engine_enqueue_rows(e[k], NULL), GDN_OK);
                cr_assert_eq(gdn_engine_enqueue_layer(e[k], 1, NULL), GDN_OK);
                cr_assert_eq(gdn_engine_enqueue_layer(e[k], 0, NULL), GDN_OK);
            }
            if (verify) {
                test_set_accepted(e[k], accepted, B > 0 ? B : 1);
                cr_assert_eq(k == 0 ? gdn_engine_commit(e[k], NULL) : gdn_engine_enqueue_commit(e[k], NULL), GDN_OK);
            } else if (k == 1) {
                cr_assert_eq(gdn_engine_enqueue_commit(e[k], NULL), GDN_EMISUSE, "a decode step has no commit");
            }
            /* Retire one slot of the step now and take it back (the next step clears its tokens). */
            if (B > 0 && rows[B - 1] >= 0 && step % 2 == 0) {
                int32_t again;
                cr_assert_eq(gdn_slot_free(e[k], rows[B - 1]), GDN_OK, "a finished step frees its slots");
                cr_assert_eq(gdn_slot_alloc(e[k], &again), GDN_OK);
                cr_assert_eq(again, rows[B - 1]);
            }
        }
        test_assert_twins_match(e[0], e[1], B, T, step);
    }
    for (int k = 0; k < 2; k++) gdn_engine_destroy(e[k]);
}

Test(engine, caller_work_matches_engine_work_cache) { caller_work_matches_engine_work(GDN_VERIFY_CACHE, 81); }
Test(engine, caller_work_matches_engine_work_fold) { caller_work_matches_engine_work(GDN_VERIFY_FOLD, 82); }
Test(engine, caller_work_matches_engine_work_ring) { caller_work_matches_engine_work(GDN_VERIFY_RING, 83); }

Test(engine, enqueue_calls_need_a_caller_work_step)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 84);
    cr_assert_eq(gdn_engine_enqueue_rows(f.e, NULL), GDN_EMISUSE, "no step begun");
    cr_assert_eq(gdn_engine_enqueue_layer(f.e, 0, NULL), GDN_EMISUSE);
    const int32_t rows[] = {1, 3};
    gdn_step step = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 2, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_enqueue_rows(f.e, NULL), GDN_EMISUSE, "an engine-tracked step");
    cr_assert_eq(gdn_engine_enqueue_layer(f.e, 1, NULL), GDN_EMISUSE);
    cr_assert_eq(gdn_engine_enqueue_commit(f.e, NULL), GDN_EMISUSE);
    step.flags = 2;
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, NULL), GDN_EMISUSE, "an unknown flag");
    step.flags = GDN_STEP_CALLER_WORK;
    cr_assert_eq(gdn_engine_begin_step(f.e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_enqueue_layer(f.e, 2, NULL), GDN_ELAYER);
    cr_assert_eq(gdn_engine_enqueue_layer(f.e, -1, NULL), GDN_ELAYER);
    cr_assert_eq(gdn_engine_run_step(f.e, NULL), GDN_EMISUSE, "the caller owns the work");
    cr_assert_eq(gdn_engine_commit(f.e, NULL), GDN_EMISUSE, "committed by the caller's work");
    cr_assert_eq(gdn_engine_enqueue_rows(NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_enqueue_layer(NULL, 0, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_enqueue_commit(NULL, NULL), GDN_EINVAL);
    teardown(&f);
}

/* The step's device rows, as the kernels read them (host memory on the CPU backend). */
Test(engine, step_rows_are_the_rows_the_kernels_read)
{
    fixture f;
    setup(&f, GDN_DTYPE_F32, 85);
    const int32_t *reads = NULL, *writes = NULL;
    int32_t bucket = 0;
    cr_assert_eq(gdn_engine_step_rows(f.e, &reads, &writes, &bucket), GDN_EMISUSE, "no step begun");
    cr_assert_eq(gdn_engine_step_rows(NULL, &reads, &writes, &bucket), GDN_EINVAL);
    test_inputs *in = write_all_inputs(&f, 3, 1);
    const int32_t rows[] = {4, -1, 7}, fork[] = {4, -1, 9};
    test_run_step(f.e, GDN_STEP_DECODE, 1, 3, rows, fork);
    cr_assert_eq(gdn_engine_step_rows(f.e, &reads, &writes, &bucket), GDN_OK);
    cr_assert_eq(bucket, 4);
    const int32_t want_r[] = {4, -1, 7, -1}, want_w[] = {4, -1, 9, -1};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(reads[i], want_r[i], "read row %d", i);
        cr_assert_eq(writes[i], want_w[i], "write row %d", i);
    }
    cr_assert_eq(gdn_engine_step_rows(f.e, NULL, NULL, NULL), GDN_OK, "every output may be NULL");
    free_all_inputs(&f, in);
    teardown(&f);
}

/* ---------------------------------------------------------------------------------------------- */
/* Device-side slot operations                                                                      */
/* ---------------------------------------------------------------------------------------------- */

Test(engine, slot_operations_cache) { slot_ops_keep_current_states(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, 91); }
Test(engine, slot_operations_fold) { slot_ops_keep_current_states(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, 92); }
Test(engine, slot_operations_ring) { slot_ops_keep_current_states(GDN_BACKEND_CPU, GDN_VERIFY_RING, 93); }

Test(engine, slot_operations_refuse_and_change_nothing)
{
    gdn_engine *e = slot_ops_engine_with_pending(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, 94);
    float *buf = calloc(2 * 4 * 64 * 64, sizeof(float));
    unsigned char *before[8];
    for (int32_t s = 0; s < 8; s++) before[s] = test_snapshot_pool(e, s);
    cr_assert_eq(gdn_slot_copy_async(e, 1, 1, NULL), GDN_EINVAL, "dst == src");
    cr_assert_eq(gdn_slot_copy_async(e, 8, 1, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_slot_import_async(e, 1, NULL, 4 * 64 * 64, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_import_async(e, 1, buf, 4 * 64 * 64 - 1, NULL), GDN_EINVAL, "layer stride too small");
    cr_assert_eq(gdn_slot_export_async(e, 1, NULL, 4 * 64 * 64, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_copy_async(NULL, 1, 2, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_free(e, 7), GDN_OK);
    cr_assert_eq(gdn_slot_copy_async(e, 7, 1, NULL), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_export_async(e, 7, buf, 4 * 64 * 64, NULL), GDN_ESLOT_FREE);
    const int32_t rows[] = {2, 3};
    gdn_step step = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 2, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_slot_copy_async(e, 2, 1, NULL), GDN_ESLOT_BUSY, "dst read by the current step");
    cr_assert_eq(gdn_slot_copy_async(e, 1, 3, NULL), GDN_ESLOT_BUSY, "src read by the current step");
    cr_assert_eq(gdn_slot_import_async(e, 2, buf, 4 * 64 * 64, NULL), GDN_ESLOT_BUSY);
    cr_assert_eq(gdn_slot_export_async(e, 3, buf, 4 * 64 * 64, NULL), GDN_ESLOT_BUSY);
    for (int32_t s = 0; s < 8; s++) {
        unsigned char *now = test_snapshot_pool(e, s);
        cr_assert_eq(memcmp(now, before[s], 2 * test_state_bytes(e)), 0, "a refused operation changed slot %d", s);
        free(now), free(before[s]);
    }
    free(buf);
    gdn_engine_destroy(e);
}

/* ---------------------------------------------------------------------------------------------- */
/* Caller-owned pools and tensors                                                                  */
/* ---------------------------------------------------------------------------------------------- */

enum { OWN_L = 2, OWN_SLOTS = 6, OWN_ROWS = 4, OWN_T = 3, OWN_HK = 2, OWN_HV = 4, OWN_D = 64 };

/* Per layer and token: q | k | v | 8 spare in one fused projection (rows padded by 16), (a, b)
 * interleaved per head (rows padded by 1), heads of o padded by 8. */
#define OWN_N (2 * OWN_HK * OWN_D + OWN_HV * OWN_D + 8)
typedef struct own_memory {
    float *pool;
    uint16_t *proj[OWN_L], *gates[OWN_L];
    uint16_t *out[OWN_L];
    gdn_layer_views views[OWN_L];
} own_memory;

static const int64_t own_slot_stride = OWN_HV * OWN_D * OWN_D + 64, own_layer_stride = OWN_SLOTS * (OWN_HV * OWN_D * OWN_D + 64) + 128;

static void own_memory_init(own_memory *m)
{
    m->pool = malloc(sizeof(float) * (size_t)(OWN_L * own_layer_stride));
    for (int64_t i = 0; i < OWN_L * own_layer_stride; i++) m->pool[i] = -4096.0f; /* the gaps must survive */
    const int64_t proj_row = OWN_T * OWN_N + 16, gate_row = OWN_T * 2 * OWN_HV + 1;
    const int64_t o_head = OWN_D + 8, o_token = OWN_HV * o_head, o_row = OWN_T * o_token;
    for (int l = 0; l < OWN_L; l++) {
        m->proj[l] = aligned_alloc(64, sizeof(uint16_t) * (size_t)(OWN_ROWS * proj_row + 64));
        m->gates[l] = calloc((size_t)(OWN_ROWS * gate_row + 8), sizeof(uint16_t));
        m->out[l] = calloc((size_t)(OWN_ROWS * o_row), sizeof(uint16_t));
        m->views[l] = (gdn_layer_views){
            .q = {m->proj[l], proj_row, OWN_N, OWN_D},
            .k = {m->proj[l] + OWN_HK * OWN_D, proj_row, OWN_N, OWN_D},
            .v = {m->proj[l] + 2 * OWN_HK * OWN_D, proj_row, OWN_N, OWN_D},
            .a = {m->gates[l], gate_row, 2 * OWN_HV, 2},
            .b = {m->gates[l] + 1, gate_row, 2 * OWN_HV, 2},
            .o = {m->out[l], o_row, o_token, o_head},
        };
    }
}

static void own_memory_free(own_memory *m)
{
    free(m->pool);
    for (int l = 0; l < OWN_L; l++) free(m->proj[l]), free(m->gates[l]), free(m->out[l]);
}

static uint16_t *view_at(const gdn_view *v, int32_t i, int32_t t, int32_t h)
{
    return (uint16_t *)v->data + i * v->row_stride + t * v->token_stride + h * v->head_stride;
}

/* Twin engines, one with its own memory and one over the caller's pool (gaps between slots and
 * layers) and the caller's fused tensors: the same steps give bit-exact outputs and states, the
 * gaps stay untouched, and the engine reports no pool or io memory of its own. */
Test(engine, caller_pools_and_views_match_engine_memory)
{
    own_memory mem;
    own_memory_init(&mem);
    gdn_engine_config c = test_config("tiny", OWN_L, GDN_DTYPE_F32, OWN_SLOTS, OWN_ROWS, OWN_T);
    c.verify_strategy = GDN_VERIFY_FOLD;
    gdn_engine *e[2];
    for (int k = 0; k < 2; k++) {
        gdn_engine_config ck = c;
        if (k == 1) {
            ck.state_pool = mem.pool, ck.state_slot_stride = own_slot_stride, ck.state_layer_stride = own_layer_stride;
            ck.io_views = mem.views;
        }
        test_rng rng = test_rng_seeded(101);
        e[k] = test_engine_create(&ck, &rng, NULL);
        for (int32_t s = 0; s < OWN_SLOTS; s++) {
            int32_t slot;
            cr_assert_eq(gdn_slot_alloc(e[k], &slot), GDN_OK);
            test_fill_slot_state(e[k], slot, &rng);
        }
    }
    gdn_memory_report m;
    cr_assert_eq(gdn_engine_memory(e[1], &m), GDN_OK);
    cr_assert_eq(m.state_pools, 0);
    cr_assert_eq(m.io_buffers, 0);
    gdn_layer_io io;
    cr_assert_eq(gdn_engine_layer_io(e[1], 1, &io), GDN_OK);
    cr_assert_eq(io.q, mem.views[1].q.data);
    cr_assert_eq(gdn_engine_get_config(e[1])->io_views[1].o.data, mem.views[1].o.data);
    test_rng rng = test_rng_seeded(102);
    for (int step = 0; step < 12; step++) {
        const int verify = step % 2;
        const int32_t T = verify ? 1 + test_rng_below(&rng, OWN_T) : 1, B = 1 + test_rng_below(&rng, OWN_ROWS);
        const int32_t rows[OWN_ROWS] = {(step + 1) % OWN_SLOTS, (step + 3) % OWN_SLOTS, -1, (step + 4) % OWN_SLOTS};
        int32_t accepted[OWN_ROWS];
        for (int32_t i = 0; i < B; i++) accepted[i] = test_rng_below(&rng, T + 1);
        for (int32_t l = 0; l < OWN_L; l++) {
            test_inputs in;
            test_write_inputs(e[0], l, B, T, &rng, &in); /* dense, into the engine's own buffers */
            gdn_layer_io own;
            gdn_engine_layer_io(e[0], l, &own);
            const uint16_t *q = own.q, *k = own.k, *v = own.v, *a = own.a, *b = own.b;
            const gdn_layer_views *w = &mem.views[l];
            for (int32_t i = 0; i < B; i++)
                for (int32_t t = 0; t < T; t++) {
                    const int64_t tok = (int64_t)i * T + t;
                    for (int32_t h = 0; h < OWN_HK; h++) {
                        memcpy(view_at(&w->q, i, t, h), q + (tok * OWN_HK + h) * OWN_D, 2 * OWN_D);
                        memcpy(view_at(&w->k, i, t, h), k + (tok * OWN_HK + h) * OWN_D, 2 * OWN_D);
                    }
                    for (int32_t h = 0; h < OWN_HV; h++) {
                        memcpy(view_at(&w->v, i, t, h), v + (tok * OWN_HV + h) * OWN_D, 2 * OWN_D);
                        *view_at(&w->a, i, t, h) = a[tok * OWN_HV + h];
                        *view_at(&w->b, i, t, h) = b[tok * OWN_HV + h];
                    }
                }
            test_inputs_free(&in);
        }
        for (int k = 0; k < 2; k++) {
            test_run_step(e[k], verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, B, rows, NULL);
            if (verify) {
                test_set_accepted(e[k], accepted, B);
                cr_assert_eq(gdn_engine_commit(e[k], NULL), GDN_OK);
            }
        }
        for (int32_t l = 0; l < OWN_L; l++) {
            gdn_layer_io own;
            gdn_engine_layer_io(e[0], l, &own);
            const uint16_t *o = own.o;
            for (int32_t i = 0; i < B; i++)
                for (int32_t t = 0; t < T; t++)
                    for (int32_t h = 0; h < OWN_HV; h++)
                        cr_assert_eq(memcmp(view_at(&mem.views[l].o, i, t, h), o + (((int64_t)i * T + t) * OWN_HV + h) * OWN_D,
                                            2 * OWN_D), 0, "step %d layer %d row %d token %d head %d: outputs differ",
                                     step, l, i, t, h);
        }
    }
    for (int32_t l = 0; l < OWN_L; l++)
        for (int32_t s = 0; s < OWN_SLOTS; s++) {
            double *x = test_read_state(e[0], l, s), *y = test_read_state(e[1], l, s);
            cr_assert_eq(memcmp(x, y, test_state_elems(e[0]) * sizeof(double)), 0, "layer %d slot %d", l, s);
            free(x), free(y);
        }
    for (int64_t i = 0; i < OWN_L * own_layer_stride; i++) {
        const int64_t in_layer = i % own_layer_stride;
        const int gap = in_layer >= OWN_SLOTS * own_slot_stride || in_layer % own_slot_stride >= OWN_HV * OWN_D * OWN_D;
        if (gap) cr_assert_eq(mem.pool[i], -4096.0f, "the engine wrote a gap of the caller's pool (element %lld)", (long long)i);
    }
    for (int k = 0; k < 2; k++) gdn_engine_destroy(e[k]);
    own_memory_free(&mem);
}

Test(engine, caller_pool_and_view_refusals)
{
    own_memory mem;
    own_memory_init(&mem);
    gdn_engine_config c = test_config("tiny", OWN_L, GDN_DTYPE_F32, OWN_SLOTS, OWN_ROWS, OWN_T);
    c.backend = GDN_BACKEND_CPU;
    gdn_engine *e = NULL;
    gdn_engine_config bad = c;
    bad.state_pool = mem.pool, bad.state_slot_stride = OWN_HV * OWN_D * OWN_D - 4;
    cr_assert_eq(gdn_engine_create(&bad, &e), GDN_ECONFIG_POOL, "slot stride below HV V K");
    bad.state_slot_stride = own_slot_stride, bad.state_layer_stride = own_slot_stride * OWN_SLOTS - 4;
    cr_assert_eq(gdn_engine_create(&bad, &e), GDN_ECONFIG_POOL, "layer stride below num_slots x slot stride");
    bad.state_layer_stride = 0, bad.state_slot_stride = own_slot_stride + 1;
    cr_assert_eq(gdn_engine_create(&bad, &e), GDN_ECONFIG_POOL, "slot stride not a multiple of 16 bytes");
    bad = c;
    gdn_layer_views views[OWN_L];
    memcpy(views, mem.views, sizeof views);
    bad.io_views = views;
    views[1].o.data = NULL;
    cr_assert_eq(gdn_engine_create(&bad, &e), GDN_ECONFIG_VIEWS, "a view without data");
    memcpy(views, mem.views, sizeof views);
    views[0].k.token_stride += 1;
    cr_assert_eq(gdn_engine_create(&bad, &e), GDN_ECONFIG_VIEWS, "k heads not 16-byte aligned");
    cr_assert_null(e);
    own_memory_free(&mem);
}
