/*
 * Hand-derived checks of the float64 reference (SPEC 1): closed forms that do not reuse the code
 * under test, and the bf16/fp16 conversions every comparison relies on.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_ref.h"
#include "support.h"

#define KD 64
#define VD 64

static void random_vector(test_rng *rng, double *x, int n, double scale)
{
    for (int i = 0; i < n; i++) x[i] = scale * test_rng_normal(rng);
}

static double dot(const double *x, const double *y, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

Test(math, softplus_below_and_above_threshold)
{
    cr_assert_float_eq(gdn__ref_softplus(0.0), log(2.0), 1e-15);
    cr_assert_float_eq(gdn__ref_softplus(-3.0), log(1.0 + exp(-3.0)), 1e-15);
    cr_assert_float_eq(gdn__ref_softplus(20.0), log(1.0 + exp(20.0)), 1e-12, "20 is still below the threshold");
    cr_assert_eq(gdn__ref_softplus(20.5), 20.5, "above 20 softplus is the identity");
    cr_assert_eq(gdn__ref_softplus(1000.0), 1000.0, "no overflow far above the threshold");
    cr_assert_gt(gdn__ref_softplus(-800.0), -1e-300, "tiny but not negative far below");
}

Test(math, decay_formula)
{
    /* g = exp(-exp(A_log) * softplus(a + dt_bias)) */
    const double a = 0.3, A_log = -0.2, dt_bias = 0.1;
    const double expected = exp(-exp(-0.2) * log(1.0 + exp(0.4)));
    cr_assert_float_eq(gdn__ref_decay(a, A_log, dt_bias), expected, 1e-15);
    cr_assert_float_eq(gdn__ref_decay(30.0, 0.0, 0.0), exp(-30.0), 1e-20, "threshold branch");
    const double g = gdn__ref_decay(-5.0, 1.0, 0.0);
    cr_assert(g > 0.0 && g <= 1.0);
}

Test(math, decay_only_when_beta_is_zero)
{
    /* b = -inf gives beta = 0: S' = g S exactly, and o = g S q^. */
    test_rng rng = test_rng_seeded(1);
    double S[VD * KD], S0[VD * KD], q[KD], k[KD], v[VD], out[VD];
    random_vector(&rng, S, VD * KD, 0.1);
    memcpy(S0, S, sizeof S);
    random_vector(&rng, q, KD, 1.0), random_vector(&rng, k, KD, 1.0), random_vector(&rng, v, VD, 1.0);
    const double a[1] = {0.05}, b[1] = {-INFINITY};
    const double A_log = 0.02, dt_bias = -0.03, scale = 0.125;
    gdn__ref_head(1, KD, VD, S, q, k, KD, v, VD, a, b, A_log, dt_bias, scale, 1, out, VD, NULL, NULL);
    const double g = exp(-exp(A_log) * log1p(exp(a[0] + dt_bias)));
    double q_hat[KD];
    const double qn = 1.0 / sqrt(dot(q, q, KD) + 1e-6);
    for (int i = 0; i < KD; i++) q_hat[i] = scale * q[i] * qn;
    for (int row = 0; row < VD; row++) {
        for (int c = 0; c < KD; c++) cr_assert_float_eq(S[row * KD + c], g * S0[row * KD + c], 1e-15);
        cr_assert_float_eq(out[row], g * dot(S0 + row * KD, q_hat, KD), 1e-13);
    }
}

Test(math, single_token_from_zero_state)
{
    /* From S = 0: u = beta v, S' = beta v k^T (outer), o = beta v (k^ . q^). */
    test_rng rng = test_rng_seeded(2);
    double S[VD * KD] = {0}, q[KD], k[KD], v[VD], out[VD];
    random_vector(&rng, q, KD, 1.0), random_vector(&rng, k, KD, 1.0), random_vector(&rng, v, VD, 1.0);
    const double a[1] = {0.1}, b[1] = {0.4}, scale = 0.125;
    gdn__ref_head(1, KD, VD, S, q, k, KD, v, VD, a, b, 0.0, 0.0, scale, 1, out, VD, NULL, NULL);
    const double beta = 1.0 / (1.0 + exp(-0.4));
    const double kn = 1.0 / sqrt(dot(k, k, KD) + 1e-6), qn = 1.0 / sqrt(dot(q, q, KD) + 1e-6);
    const double kq = dot(k, q, KD) * kn * qn * scale;
    for (int row = 0; row < VD; row++) {
        for (int c = 0; c < KD; c++) cr_assert_float_eq(S[row * KD + c], beta * v[row] * k[c] * kn, 1e-14);
        cr_assert_float_eq(out[row], beta * v[row] * kq, 1e-13);
    }
}

Test(math, l2norm_off_uses_raw_q_and_k)
{
    /* Without the norm: S' = beta v k^T and o = beta v (k . q) scale, with the raw vectors. */
    test_rng rng = test_rng_seeded(3);
    double S[VD * KD] = {0}, q[KD], k[KD], v[VD], out[VD];
    random_vector(&rng, q, KD, 1.0), random_vector(&rng, k, KD, 1.0), random_vector(&rng, v, VD, 1.0);
    const double a[1] = {0.0}, b[1] = {0.0}, scale = 0.5;
    gdn__ref_head(1, KD, VD, S, q, k, KD, v, VD, a, b, 0.0, 0.0, scale, 0, out, VD, NULL, NULL);
    const double kq = dot(k, q, KD);
    for (int row = 0; row < VD; row++) {
        cr_assert_float_eq(S[row * KD + 3], 0.5 * v[row] * k[3], 1e-14);
        cr_assert_float_eq(out[row], 0.5 * v[row] * kq * scale, 1e-12);
    }
}

Test(math, l2norm_on_makes_the_update_scale_free)
{
    /* With the norm, scaling k and q by any positive factor changes nothing (up to the 1e-6 eps). */
    test_rng rng = test_rng_seeded(4);
    double S1[VD * KD], S2[VD * KD], q[KD], k[KD], q2[KD], k2[KD], v[VD], o1[VD], o2[VD];
    random_vector(&rng, S1, VD * KD, 0.1);
    memcpy(S2, S1, sizeof S1);
    random_vector(&rng, q, KD, 1.0), random_vector(&rng, k, KD, 1.0), random_vector(&rng, v, VD, 1.0);
    for (int i = 0; i < KD; i++) q2[i] = 7.0 * q[i], k2[i] = 3.0 * k[i];
    const double a[1] = {0.2}, b[1] = {0.3};
    gdn__ref_head(1, KD, VD, S1, q, k, KD, v, VD, a, b, 0.1, 0.1, 0.125, 1, o1, VD, NULL, NULL);
    gdn__ref_head(1, KD, VD, S2, q2, k2, KD, v, VD, a, b, 0.1, 0.1, 0.125, 1, o2, VD, NULL, NULL);
    for (int i = 0; i < VD; i++) cr_assert_float_eq(o1[i], o2[i], 1e-7);
    for (int i = 0; i < VD * KD; i++) cr_assert_float_eq(S1[i], S2[i], 1e-7);
}

Test(math, delta_rule_removes_the_stored_value_with_beta_one)
{
    /* With g = 1 (A_log = -inf) and beta = 1 (b = +inf), S' k^ = v: the new association is exact. */
    test_rng rng = test_rng_seeded(5);
    double S[VD * KD], q[KD], k[KD], v[VD], out[VD];
    random_vector(&rng, S, VD * KD, 0.1);
    random_vector(&rng, q, KD, 1.0), random_vector(&rng, k, KD, 1.0), random_vector(&rng, v, VD, 1.0);
    const double a[1] = {0.0}, b[1] = {INFINITY};
    gdn__ref_head(1, KD, VD, S, q, k, KD, v, VD, a, b, -INFINITY, 0.0, 0.125, 1, out, VD, NULL, NULL);
    const double kn = 1.0 / sqrt(dot(k, k, KD) + 1e-6);
    double k_hat[KD];
    for (int i = 0; i < KD; i++) k_hat[i] = k[i] * kn;
    for (int row = 0; row < VD; row++) cr_assert_float_eq(dot(S + row * KD, k_hat, KD), v[row], 1e-6); /* |k^|^2 = 1 - eps/|k|^2 */
}

Test(math, tokens_apply_in_order)
{
    /* Two tokens in one call equal two one-token calls. */
    test_rng rng = test_rng_seeded(6);
    double S1[VD * KD], S2[VD * KD], q[2 * KD], k[2 * KD], v[2 * VD], o1[2 * VD], o2[VD];
    random_vector(&rng, S1, VD * KD, 0.1);
    memcpy(S2, S1, sizeof S1);
    random_vector(&rng, q, 2 * KD, 1.0), random_vector(&rng, k, 2 * KD, 1.0), random_vector(&rng, v, 2 * VD, 1.0);
    const double a[2] = {0.1, -0.2}, b[2] = {0.05, 0.3};
    gdn__ref_head(2, KD, VD, S1, q, k, KD, v, VD, a, b, 0.1, 0.0, 0.125, 1, o1, VD, NULL, NULL);
    gdn__ref_head(1, KD, VD, S2, q, k, KD, v, VD, a, b, 0.1, 0.0, 0.125, 1, o2, VD, NULL, NULL);
    for (int i = 0; i < VD; i++) cr_assert_eq(o1[i], o2[i]);
    gdn__ref_head(1, KD, VD, S2, q + KD, k + KD, KD, v + VD, VD, a + 1, b + 1, 0.1, 0.0, 0.125, 1, o2, VD, NULL, NULL);
    for (int i = 0; i < VD; i++) cr_assert_eq(o1[VD + i], o2[i]);
    cr_assert_eq(memcmp(S1, S2, sizeof S1), 0);
}

Test(dtype, bf16_rounds_to_nearest_even)
{
    cr_assert_eq(gdn__f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(gdn__f32_to_bf16(-2.0f), 0xc000);
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0). */
    cr_assert_eq(gdn__f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
    /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up. */
    cr_assert_eq(gdn__f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
    cr_assert_eq(gdn__f32_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81, "above halfway rounds up");
    cr_assert_eq(gdn__f32_to_bf16(INFINITY), 0x7f80);
    cr_assert(isnan(gdn__bf16_to_f32(gdn__f32_to_bf16(NAN))));
    cr_assert_eq(gdn__bf16_to_f32(0x3f80), 1.0f);
}

Test(dtype, f16_round_trips_and_rounds)
{
    cr_assert_eq(gdn__f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(gdn__f32_to_f16(-2.5f), 0xc100);
    cr_assert_eq(gdn__f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(gdn__f32_to_f16(65520.0f), 0x7c00, "rounds to infinity");
    cr_assert_eq(gdn__f32_to_f16(0x1.0p-24f), 0x0001, "smallest subnormal");
    cr_assert_eq(gdn__f32_to_f16(0x1.0p-26f), 0x0000, "below half the smallest subnormal");
    cr_assert_eq(gdn__f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00, "tie to even");
    cr_assert_eq(gdn__f32_to_f16(1.0f + 3 * 0x1.0p-11f), 0x3c02, "tie to even, upward");
    for (uint32_t h = 0; h < 0x7c00; h += 7) { /* every 7th finite positive half round-trips */
        const float f = gdn__f16_to_f32((uint16_t)h);
        cr_assert_eq(gdn__f32_to_f16(f), h, "half 0x%04x", h);
        cr_assert_eq(gdn__f32_to_f16(-f), h | 0x8000u);
    }
    cr_assert(isnan(gdn__f16_to_f32(gdn__f32_to_f16(NAN))));
}
