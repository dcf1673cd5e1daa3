/*
 * Checks of the float64 mixer oracle (SPEC 6, kernels/ref/gdn_mixer_ref.h): hand values and closed
 * forms for the conv, the gates and the gated norm, the whole token against a step composed by hand in
 * this file, the reduction to gdn__ref_head (a separate implementation of SPEC 1) when conv and norm
 * are off, and verify-then-commit against fresh runs of the accepted prefix.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_ref.h"
#include "kernels/ref/gdn_spec.h"

static void random_vector(gdn__rng *rng, double *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = scale * gdn__rng_normal(rng);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double max_abs_diff(const double *x, const double *y, int64_t n)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs(x[i] - y[i]);
        if (!(d <= worst)) worst = d; /* NaN sticks */
    }
    return worst;
}

/* ---- fixtures: a random model, a random slot, random inputs ---- */

typedef struct rand_model {
    gdn__mixer_ref_model m;
    double *weight, *bias, *norm_w, *A_log, *dt_bias;
} rand_model;

static rand_model rand_model_make(gdn__rng *rng, int32_t HK, int32_t HV, int32_t K, int32_t V, int32_t W,
                                  int use_conv, int use_norm)
{
    rand_model r = {0};
    r.m = (gdn__mixer_ref_model){.HK = HK, .HV = HV, .K = K, .V = V, .use_conv = use_conv, .W = W,
                                 .use_norm = use_norm, .norm_eps = 1e-6, .scale = 0.0, .use_qk_l2norm = 1};
    const int64_t C = gdn__ref_mixer_conv_dim(&r.m);
    r.weight = malloc(sizeof(double) * (size_t)(C * W));
    r.bias = malloc(sizeof(double) * (size_t)C);
    r.norm_w = malloc(sizeof(double) * (size_t)V);
    r.A_log = malloc(sizeof(double) * (size_t)HV);
    r.dt_bias = malloc(sizeof(double) * (size_t)HV);
    cr_assert(r.weight && r.bias && r.norm_w && r.A_log && r.dt_bias);
    random_vector(rng, r.weight, C * W, 0.5);
    random_vector(rng, r.bias, C, 0.1);
    for (int32_t i = 0; i < V; i++) r.norm_w[i] = 1.0 + 0.1 * gdn__rng_normal(rng);
    random_vector(rng, r.A_log, HV, 0.1);
    random_vector(rng, r.dt_bias, HV, 0.1);
    r.m.conv_weight = r.weight, r.m.conv_bias = r.bias, r.m.norm_weight = r.norm_w;
    r.m.A_log = r.A_log, r.m.dt_bias = r.dt_bias;
    return r;
}

static void rand_model_free(rand_model *r)
{
    free(r->weight), free(r->bias), free(r->norm_w), free(r->A_log), free(r->dt_bias);
}

/* A slot with a random window (raw inputs, N(0,1)) and state (0.1 N(0,1)). */
static gdn__mixer_ref_slot rand_slot(gdn__rng *rng, const gdn__mixer_ref_model *m)
{
    gdn__mixer_ref_slot s;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s, m), GDN_OK);
    if (s.window) random_vector(rng, s.window, gdn__ref_mixer_window_elems(m), 1.0);
    random_vector(rng, s.S, gdn__ref_mixer_state_elems(m), 0.1);
    return s;
}

typedef struct rand_inputs {
    double *x, *a, *b, *z; /* [T][conv_dim], [T][HV], [T][HV], [T][HV*V] */
} rand_inputs;

static rand_inputs rand_inputs_make(gdn__rng *rng, const gdn__mixer_ref_model *m, int32_t T)
{
    const int64_t C = gdn__ref_mixer_conv_dim(m), HV = m->HV, HVV = (int64_t)m->HV * m->V;
    rand_inputs in = {malloc(sizeof(double) * (size_t)(T * C)), malloc(sizeof(double) * (size_t)(T * HV)),
                      malloc(sizeof(double) * (size_t)(T * HV)), malloc(sizeof(double) * (size_t)(T * HVV))};
    cr_assert(in.x && in.a && in.b && in.z);
    random_vector(rng, in.x, T * C, 1.0);
    random_vector(rng, in.a, T * HV, 0.1);
    random_vector(rng, in.b, T * HV, 0.1);
    random_vector(rng, in.z, T * HVV, 1.0);
    return in;
}

static void rand_inputs_free(rand_inputs *in) { free(in->x), free(in->a), free(in->b), free(in->z); }

static int slots_equal(const gdn__mixer_ref_model *m, const gdn__mixer_ref_slot *x, const gdn__mixer_ref_slot *y)
{
    const int64_t w = gdn__ref_mixer_window_elems(m);
    if (w > 0 && memcmp(x->window, y->window, sizeof(double) * (size_t)w) != 0) return 0;
    return memcmp(x->S, y->S, sizeof(double) * (size_t)gdn__ref_mixer_state_elems(m)) == 0;
}

/* ---- conv ---- */

Test(mixer_ref, conv_single_last_tap_passes_x_and_shifts_the_window)
{
    enum { C = 5, W = 4 };
    gdn__rng rng = gdn__rng_seeded(10);
    double w[C * W] = {0}, window[(W - 1) * C], before[(W - 1) * C], x[C], out[C];
    for (int ch = 0; ch < C; ch++) w[ch * W + W - 1] = 1.0; /* w = [0, 0, 0, 1] */
    random_vector(&rng, window, (W - 1) * C, 1.0);
    random_vector(&rng, x, C, 1.0);
    memcpy(before, window, sizeof window);
    gdn__ref_conv_step(C, W, w, NULL, window, x, 0, out);
    for (int ch = 0; ch < C; ch++) {
        cr_assert_eq(out[ch], x[ch], "channel %d: the last tap is x itself", ch);
        cr_assert_eq(window[0 * C + ch], before[1 * C + ch], "oldest row dropped");
        cr_assert_eq(window[1 * C + ch], before[2 * C + ch]);
        cr_assert_eq(window[2 * C + ch], x[ch], "x becomes the newest row");
    }
}

Test(mixer_ref, conv_each_tap_reads_its_row_oldest_first)
{
    enum { C = 3, W = 4 };
    gdn__rng rng = gdn__rng_seeded(11);
    double window[(W - 1) * C], x[C];
    random_vector(&rng, window, (W - 1) * C, 1.0);
    random_vector(&rng, x, C, 1.0);
    for (int tap = 0; tap < W; tap++) {
        double w[C * W] = {0}, win[(W - 1) * C], out[C];
        for (int ch = 0; ch < C; ch++) w[ch * W + tap] = 1.0;
        memcpy(win, window, sizeof window);
        gdn__ref_conv_step(C, W, w, NULL, win, x, 0, out);
        for (int ch = 0; ch < C; ch++)
            cr_assert_eq(out[ch], tap < W - 1 ? window[tap * C + ch] : x[ch], "tap %d channel %d", tap, ch);
    }
}

Test(mixer_ref, conv_over_several_tokens_is_the_causal_convolution_of_the_sequence)
{
    /* seq = [initial window; x_0 .. x_{n-1}]; token t's output is sum_j w[j] seq[t + j]. */
    enum { C = 3, N = 7, MAXW = 4 };
    gdn__rng rng = gdn__rng_seeded(12);
    for (int W = 2; W <= 4; W++) {
        double seq[(MAXW - 1 + N) * C], w[C * MAXW], window[(MAXW - 1) * C], out[C];
        random_vector(&rng, seq, (W - 1 + N) * C, 1.0);
        random_vector(&rng, w, C * W, 0.5);
        memcpy(window, seq, sizeof(double) * (size_t)((W - 1) * C));
        for (int t = 0; t < N; t++) {
            gdn__ref_conv_step(C, W, w, NULL, window, seq + (W - 1 + t) * C, 0, out);
            for (int ch = 0; ch < C; ch++) {
                double expected = 0.0;
                for (int j = 0; j < W; j++) expected += w[ch * W + j] * seq[(t + j) * C + ch];
                cr_assert_float_eq(out[ch], expected, 1e-14, "W %d token %d channel %d", W, t, ch);
            }
            cr_assert(memcmp(window, seq + (t + 1) * C, sizeof(double) * (size_t)((W - 1) * C)) == 0,
                      "W %d token %d: the window is the last W-1 inputs", W, t);
        }
    }
}

Test(mixer_ref, conv_silu_on_both_signs_and_bias)
{
    /* W = 2, w = [0, 1]: the pre-activation is x (+ bias). SiLU(2) = 2 sigmoid(2), SiLU(-3) = -3 sigmoid(-3). */
    const double w[2 * 2] = {0.0, 1.0, 0.0, 1.0}, x[2] = {2.0, -3.0};
    double window[2] = {0.7, -0.4}, out[2];
    gdn__ref_conv_step(2, 2, w, NULL, window, x, 1, out);
    cr_assert_float_eq(out[0], 1.7615941559557646, 1e-15);
    cr_assert_float_eq(out[1], -0.14227761953270035, 1e-15);
    cr_assert_eq(window[0], 2.0);
    cr_assert_eq(window[1], -3.0);

    /* w = [0.5, 0.25], window 2, x 4, bias 0.125: 1 + 1 + 0.125, then SiLU(2.125). */
    const double w2[2] = {0.5, 0.25}, x2[1] = {4.0}, bias[1] = {0.125};
    double win2[1] = {2.0}, out2[1];
    gdn__ref_conv_step(1, 2, w2, bias, win2, x2, 0, out2);
    cr_assert_eq(out2[0], 2.125, "bias is added to the conv");
    win2[0] = 2.0;
    gdn__ref_conv_step(1, 2, w2, bias, win2, x2, 1, out2);
    cr_assert_float_eq(out2[0], 1.8982824878654911, 1e-15, "bias goes in before the SiLU");
}

Test(mixer_ref, conv_output_may_be_its_input)
{
    enum { C = 6, W = 4 };
    gdn__rng rng = gdn__rng_seeded(13);
    double w[C * W], bias[C], win1[(W - 1) * C], win2[(W - 1) * C], x[C], out[C];
    random_vector(&rng, w, C * W, 0.5), random_vector(&rng, bias, C, 0.1);
    random_vector(&rng, win1, (W - 1) * C, 1.0), random_vector(&rng, x, C, 1.0);
    memcpy(win2, win1, sizeof win1);
    gdn__ref_conv_step(C, W, w, bias, win1, x, 1, out);
    gdn__ref_conv_step(C, W, w, bias, win2, x, 1, x); /* in place */
    cr_assert(memcmp(out, x, sizeof out) == 0);
    cr_assert(memcmp(win1, win2, sizeof win1) == 0, "the window got the input, not the output");
}

/* ---- gated norm ---- */

Test(mixer_ref, gated_rmsnorm_hand_values)
{
    /* o = [1 2 3 4]: mean(o^2) = 7.5; y = o / sqrt(7.5 + 1e-6) * w * z sigmoid(z) (values from an
     * independent evaluation of the formula). */
    const double o[4] = {1.0, 2.0, 3.0, 4.0}, w[4] = {1.0, 0.5, 2.0, -1.0}, z[4] = {0.5, 1.0, -1.0, 2.0};
    const double expected[4] = {0.11364499803327872, 0.26694483178589035, -0.5892210932459881,
                                -2.5729727788318093};
    double y[4];
    gdn__ref_gated_rmsnorm(4, o, z, w, 1e-6, y);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(y[i], expected[i], 1e-14, "element %d", i);

    /* In place gives the same. */
    double o2[4];
    memcpy(o2, o, sizeof o);
    gdn__ref_gated_rmsnorm(4, o2, z, w, 1e-6, o2);
    cr_assert(memcmp(o2, y, sizeof y) == 0);
}

Test(mixer_ref, gated_rmsnorm_properties)
{
    enum { V = 64 };
    gdn__rng rng = gdn__rng_seeded(20);
    double o[V], o3[V], z[V], w[V], y[V], y3[V], ones[V];
    random_vector(&rng, o, V, 1.0), random_vector(&rng, z, V, 1.0), random_vector(&rng, w, V, 1.0);
    /* Scale-free in o but for eps: 3o gives y times 3 sqrt(m + eps) / sqrt(9 m + eps), m = mean(o^2). */
    double m = 0.0;
    for (int i = 0; i < V; i++) o3[i] = 3.0 * o[i], m += o[i] * o[i] / V;
    gdn__ref_gated_rmsnorm(V, o, z, w, 1e-6, y);
    gdn__ref_gated_rmsnorm(V, o3, z, w, 1e-6, y3);
    const double ratio = 3.0 * sqrt(m + 1e-6) / sqrt(9.0 * m + 1e-6);
    cr_assert_neq(ratio, 1.0, "eps is visible in double");
    for (int i = 0; i < V; i++) cr_assert_float_eq(y3[i], ratio * y[i], 1e-14 * (1.0 + fabs(y[i])), "element %d", i);
    /* With w = 1 and z = 1 (a gate z sigmoid(z) of sigmoid(1)), the mean of y^2 is
     * sigmoid(1)^2 * mean(o^2) / (mean(o^2) + eps). */
    double ms = 0.0, my = 0.0;
    for (int i = 0; i < V; i++) ones[i] = 1.0, z[i] = 1.0, ms += o[i] * o[i];
    gdn__ref_gated_rmsnorm(V, o, z, ones, 1e-6, y);
    for (int i = 0; i < V; i++) my += y[i] * y[i];
    ms /= V, my /= V;
    cr_assert_float_eq(my, sigmoid(1.0) * sigmoid(1.0) * ms / (ms + 1e-6), 1e-14);
    /* eps counts: with mean(o^2) tiny, eps dominates. */
    const double small[4] = {1e-4, -1e-4, 1e-4, -1e-4}, w4[4] = {1, 1, 1, 1}, z4[4] = {30, 30, 30, 30};
    double ys[4];
    gdn__ref_gated_rmsnorm(4, small, z4, w4, 1e-6, ys);
    cr_assert_float_eq(ys[0], 1e-4 / sqrt(1e-8 + 1e-6) * 30.0 * sigmoid(30.0), 1e-14);
}

/* ---- gates and the recurrence ---- */

Test(mixer_ref, gates_against_spec_values_and_threshold_20)
{
    double g, beta;
    /* A_log = 0: g = exp(-softplus(a + dt_bias)). x = 0: softplus = log 2, g = 1/2. */
    gdn__ref_gdn_gates(0.3, 0.0, 0.0, -0.3, &g, &beta);
    cr_assert_float_eq(g, 0.5, 1e-15);
    cr_assert_eq(beta, 0.5);
    /* x = 20 is still on the log1p branch: g = 1 / (1 + e^20). */
    gdn__ref_gdn_gates(20.0, 0.0, 0.0, 0.0, &g, NULL);
    cr_assert_float_eq(g / 2.0611536181902037e-09, 1.0, 1e-13);
    /* x = 20.5 is past the threshold: softplus = x exactly, g = e^-20.5. The log1p branch would give
     * a g smaller by a relative 1.25e-9, which this tolerance tells apart. */
    gdn__ref_gdn_gates(20.25, 0.0, 0.0, 0.25, &g, NULL);
    cr_assert_float_eq(g / 1.2501528663867426e-09, 1.0, 1e-13);
    /* A_log = log 2 doubles the exponent: g = (1/2)^2 at x = 0. */
    gdn__ref_gdn_gates(0.0, 0.0, log(2.0), 0.0, &g, NULL);
    cr_assert_float_eq(g, 0.25, 1e-15);
    /* beta = sigmoid(b) at known points. */
    gdn__ref_gdn_gates(0.0, 2.0, 0.0, 0.0, NULL, &beta);
    cr_assert_float_eq(beta, 1.0 / (1.0 + exp(-2.0)), 1e-16);
    gdn__ref_gdn_gates(0.0, -INFINITY, 0.0, 0.0, NULL, &beta);
    cr_assert_eq(beta, 0.0);
    /* Far below the threshold g tends to 1 and never passes it: 1 - g = softplus(-10) to first order. */
    gdn__ref_gdn_gates(-10.0, 0.0, 0.0, 0.0, &g, NULL);
    cr_assert_float_eq((1.0 - g) / log1p(exp(-10.0)), 1.0, 1e-4);
    gdn__ref_gdn_gates(-50.0, 0.0, 0.0, 0.0, &g, NULL);
    cr_assert(g <= 1.0 && g >= 1.0 - 1e-15);
}

Test(mixer_ref, token_with_beta_zero_only_decays)
{
    enum { K = 8, V = 4 };
    gdn__rng rng = gdn__rng_seeded(30);
    double S[V * K], S0[V * K], q[K], k[K], v[V], o[V];
    random_vector(&rng, S, V * K, 0.1), random_vector(&rng, q, K, 1.0);
    random_vector(&rng, k, K, 1.0), random_vector(&rng, v, V, 1.0);
    memcpy(S0, S, sizeof S);
    const double a = 0.07, A_log = -0.05, dt_bias = 0.02, scale = 0.3;
    gdn__ref_gdn_token(K, V, S, q, k, v, a, -INFINITY, A_log, dt_bias, scale, 1, o);
    const double g = exp(-exp(A_log) * log(1.0 + exp(a + dt_bias)));
    double qq = 0.0;
    for (int c = 0; c < K; c++) qq += q[c] * q[c];
    for (int r = 0; r < V; r++) {
        double expected = 0.0;
        for (int c = 0; c < K; c++) {
            cr_assert_float_eq(S[r * K + c], g * S0[r * K + c], 1e-16);
            expected += g * S0[r * K + c] * scale * q[c] / sqrt(qq + 1e-6);
        }
        cr_assert_float_eq(o[r], expected, 1e-15);
    }
}

Test(mixer_ref, token_agrees_with_gdn_ref_head)
{
    /* gdn__ref_head is a separate implementation of SPEC 1; several tokens, norm on and off. */
    enum { K = 64, V = 32, T = 4 };
    gdn__rng rng = gdn__rng_seeded(31);
    for (int l2 = 0; l2 <= 1; l2++) {
        double S1[V * K], S2[V * K], q[T * K], k[T * K], v[T * V], a[T], b[T], o1[T * V], o2[T * V];
        random_vector(&rng, S1, V * K, 0.1);
        memcpy(S2, S1, sizeof S1);
        random_vector(&rng, q, T * K, 1.0), random_vector(&rng, k, T * K, l2 ? 1.0 : 0.1);
        random_vector(&rng, v, T * V, 1.0), random_vector(&rng, a, T, 0.1), random_vector(&rng, b, T, 0.1);
        const double A_log = 0.04, dt_bias = -0.06, scale = 0.125;
        for (int t = 0; t < T; t++)
            gdn__ref_gdn_token(K, V, S1, q + t * K, k + t * K, v + t * V, a[t], b[t], A_log, dt_bias, scale, l2,
                               o1 + t * V);
        gdn__ref_head(T, K, V, S2, q, k, K, v, V, a, b, A_log, dt_bias, scale, l2, o2, V, NULL, NULL);
        cr_assert_lt(max_abs_diff(o1, o2, T * V), 1e-12, "l2norm %d", l2);
        cr_assert_lt(max_abs_diff(S1, S2, V * K), 1e-12, "l2norm %d", l2);
    }
}

/* ---- the whole token ---- */

Test(mixer_ref, conv_off_and_norm_off_is_the_plain_recurrence)
{
    enum { HK = 2, HV = 4, K = 16, V = 8, T = 3 };
    gdn__rng rng = gdn__rng_seeded(40);
    rand_model rm = rand_model_make(&rng, HK, HV, K, V, 4, 0, 0);
    const gdn__mixer_ref_model *m = &rm.m;
    const int64_t C = gdn__ref_mixer_conv_dim(m);
    cr_assert_eq(C, 2 * HK * K + HV * V);
    gdn__mixer_ref_slot slot = rand_slot(&rng, m);
    cr_assert_null(slot.window, "no window without conv");
    double S[HV * V * K], out[T * HV * V], expected[T * HV * V];
    memcpy(S, slot.S, sizeof S);
    rand_inputs in = rand_inputs_make(&rng, m, T);
    cr_assert_eq(gdn__ref_mixer_run(m, &slot, T, in.x, in.a, in.b, NULL, out), GDN_OK);
    for (int h = 0; h < HV; h++) {
        const int kh = h / (HV / HK);
        double a[T], b[T];
        for (int t = 0; t < T; t++) a[t] = in.a[t * HV + h], b[t] = in.b[t * HV + h];
        gdn__ref_head(T, K, V, S + h * V * K, in.x + kh * K, in.x + HK * K + kh * K, C, in.x + 2 * HK * K + h * V,
                      C, a, b, rm.A_log[h], rm.dt_bias[h], 1.0 / sqrt(K), 1, expected + h * V, HV * V, NULL, NULL);
    }
    cr_assert_lt(max_abs_diff(out, expected, T * HV * V), 1e-12);
    cr_assert_lt(max_abs_diff(slot.S, S, HV * V * K), 1e-12);
    gdn__ref_mixer_slot_free(&slot);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

Test(mixer_ref, each_part_switches_on_alone)
{
    /* conv on, norm off = conv_step by hand then the conv-off model; conv off, norm on = the plain model
     * then the gated norm per value head. The same arithmetic in the same order: exact. */
    enum { HK = 1, HV = 2, K = 8, V = 8, W = 3, T = 3 };
    gdn__rng rng = gdn__rng_seeded(41);
    rand_model rm = rand_model_make(&rng, HK, HV, K, V, W, 1, 0);
    gdn__mixer_ref_model conv_on = rm.m, plain = rm.m, norm_on = rm.m;
    plain.use_conv = 0, norm_on.use_conv = 0, norm_on.use_norm = 1;
    const int64_t C = gdn__ref_mixer_conv_dim(&conv_on);
    rand_inputs in = rand_inputs_make(&rng, &conv_on, T);

    gdn__mixer_ref_slot s1 = rand_slot(&rng, &conv_on), s2;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s2, &plain), GDN_OK);
    memcpy(s2.S, s1.S, sizeof(double) * (size_t)gdn__ref_mixer_state_elems(&plain));
    double window[(W - 1) * (2 * HK * K + HV * V)], c[T * (2 * HK * K + HV * V)];
    memcpy(window, s1.window, sizeof window);
    double out1[T * HV * V], out2[T * HV * V];
    cr_assert_eq(gdn__ref_mixer_run(&conv_on, &s1, T, in.x, in.a, in.b, NULL, out1), GDN_OK);
    for (int t = 0; t < T; t++)
        gdn__ref_conv_step((int32_t)C, W, rm.weight, rm.bias, window, in.x + t * C, 1, c + t * C);
    cr_assert_eq(gdn__ref_mixer_run(&plain, &s2, T, c, in.a, in.b, NULL, out2), GDN_OK);
    cr_assert(memcmp(out1, out2, sizeof out1) == 0, "conv on, norm off");
    cr_assert(memcmp(s1.window, window, sizeof window) == 0);
    cr_assert(memcmp(s1.S, s2.S, sizeof(double) * (size_t)gdn__ref_mixer_state_elems(&plain)) == 0);

    /* s2 now runs the plain model again, and a copy of its state the norm-on model. */
    gdn__mixer_ref_slot s3;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s3, &norm_on), GDN_OK);
    gdn__ref_mixer_slot_copy(&plain, &s3, &s2);
    cr_assert_eq(gdn__ref_mixer_run(&plain, &s2, T, in.x, in.a, in.b, NULL, out1), GDN_OK);
    cr_assert_eq(gdn__ref_mixer_run(&norm_on, &s3, T, in.x, in.a, in.b, in.z, out2), GDN_OK);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HV; h++) {
            double *o = out1 + (t * HV + h) * V;
            gdn__ref_gated_rmsnorm(V, o, in.z + (t * HV + h) * V, rm.norm_w, 1e-6, o);
        }
    cr_assert(memcmp(out1, out2, sizeof out1) == 0, "conv off, norm on");
    cr_assert(memcmp(s2.S, s3.S, sizeof(double) * (size_t)gdn__ref_mixer_state_elems(&plain)) == 0,
              "the norm leaves the state alone");

    gdn__ref_mixer_slot_free(&s1), gdn__ref_mixer_slot_free(&s2), gdn__ref_mixer_slot_free(&s3);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

Test(mixer_ref, token_matches_a_hand_composed_step)
{
    /* HK = 1, HV = 2, K = V = 4, W = 4, conv with bias and norm on, over 3 tokens: every line of SPEC 6
     * written out here without the module's parts. */
    enum { HK = 1, HV = 2, K = 4, V = 4, W = 4, C = 2 * HK * K + HV * V, T = 3 };
    gdn__rng rng = gdn__rng_seeded(42);
    rand_model rm = rand_model_make(&rng, HK, HV, K, V, W, 1, 1);
    gdn__mixer_ref_slot slot = rand_slot(&rng, &rm.m);
    double win[W - 1][C], S[HV][V][K];
    memcpy(win, slot.window, sizeof win);
    memcpy(S, slot.S, sizeof S);
    rand_inputs in = rand_inputs_make(&rng, &rm.m, T);
    for (int t = 0; t < T; t++) {
        const double *x = in.x + t * C, *a = in.a + t * HV, *b = in.b + t * HV, *z = in.z + t * HV * V;
        double out[HV * V];
        cr_assert_eq(gdn__ref_mixer_token(&rm.m, &slot, x, a, b, z, out), GDN_OK);

        double seq[W][C], c[C];
        memcpy(seq, win, sizeof win);
        memcpy(seq[W - 1], x, sizeof(double) * C);
        for (int ch = 0; ch < C; ch++) {
            double acc = rm.bias[ch];
            for (int j = 0; j < W; j++) acc += rm.weight[ch * W + j] * seq[j][ch];
            c[ch] = acc / (1.0 + exp(-acc));
        }
        memcpy(win, seq[1], sizeof win);
        const double *q = c, *k = c + K; /* the one key head, shared by both value heads */
        double qq = 0.0, kk = 0.0;
        for (int i = 0; i < K; i++) qq += q[i] * q[i], kk += k[i] * k[i];
        double q_hat[K], k_hat[K];
        for (int i = 0; i < K; i++) k_hat[i] = k[i] / sqrt(kk + 1e-6), q_hat[i] = 0.5 * q[i] / sqrt(qq + 1e-6);
        for (int h = 0; h < HV; h++) {
            const double *v = c + 2 * K + h * V;
            const double g = exp(-exp(rm.A_log[h]) * log(1.0 + exp(a[h] + rm.dt_bias[h])));
            const double beta = 1.0 / (1.0 + exp(-b[h]));
            double o[V], ms = 0.0;
            for (int r = 0; r < V; r++) {
                double Sk = 0.0;
                for (int i = 0; i < K; i++) Sk += g * S[h][r][i] * k_hat[i];
                const double u = beta * (v[r] - Sk);
                o[r] = 0.0;
                for (int i = 0; i < K; i++) {
                    S[h][r][i] = g * S[h][r][i] + u * k_hat[i];
                    o[r] += S[h][r][i] * q_hat[i];
                }
                ms += o[r] * o[r] / V;
            }
            for (int r = 0; r < V; r++) {
                const double zr = z[h * V + r];
                const double y = o[r] / sqrt(ms + 1e-6) * rm.norm_w[r] * zr / (1.0 + exp(-zr));
                cr_assert_float_eq(out[h * V + r], y, 1e-12, "token %d head %d row %d", t, h, r);
            }
        }
        cr_assert(memcmp(slot.window, win, sizeof win) == 0, "token %d: window", t);
        cr_assert_lt(max_abs_diff(slot.S, &S[0][0][0], HV * V * K), 1e-13, "token %d: state", t);
    }
    gdn__ref_mixer_slot_free(&slot);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

Test(mixer_ref, value_heads_read_their_key_head)
{
    /* HK = 2, HV = 4: heads 0, 1 read key head 0, heads 2, 3 key head 1. Changing key head 1's q and k
     * changes heads 2 and 3 only. */
    enum { HK = 2, HV = 4, K = 8, V = 8 };
    gdn__rng rng = gdn__rng_seeded(43);
    rand_model rm = rand_model_make(&rng, HK, HV, K, V, 4, 0, 0);
    gdn__mixer_ref_slot s1 = rand_slot(&rng, &rm.m), s2;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s2, &rm.m), GDN_OK);
    gdn__ref_mixer_slot_copy(&rm.m, &s2, &s1);
    rand_inputs in = rand_inputs_make(&rng, &rm.m, 1);
    double x2[2 * HK * K + HV * V], o1[HV * V], o2[HV * V];
    memcpy(x2, in.x, sizeof x2);
    for (int i = 0; i < K; i++) x2[K + i] += 0.5, x2[HK * K + K + i] -= 0.5; /* q and k of key head 1 */
    cr_assert_eq(gdn__ref_mixer_token(&rm.m, &s1, in.x, in.a, in.b, NULL, o1), GDN_OK);
    cr_assert_eq(gdn__ref_mixer_token(&rm.m, &s2, x2, in.a, in.b, NULL, o2), GDN_OK);
    cr_assert(memcmp(o1, o2, sizeof(double) * 2 * V) == 0, "heads 0 and 1 do not read key head 1");
    cr_assert(memcmp(s1.S, s2.S, sizeof(double) * 2 * V * K) == 0);
    for (int h = 2; h < 4; h++) cr_assert_gt(max_abs_diff(o1 + h * V, o2 + h * V, V), 1e-6, "head %d", h);
    gdn__ref_mixer_slot_free(&s1), gdn__ref_mixer_slot_free(&s2);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

Test(mixer_ref, scale_zero_selects_inverse_sqrt_k)
{
    enum { HK = 1, HV = 1, K = 16, V = 4 };
    gdn__rng rng = gdn__rng_seeded(44);
    rand_model rm = rand_model_make(&rng, HK, HV, K, V, 4, 0, 0);
    gdn__mixer_ref_model quarter = rm.m, one = rm.m;
    quarter.scale = 0.25, one.scale = 1.0;
    gdn__mixer_ref_slot s[3];
    s[0] = rand_slot(&rng, &rm.m);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(gdn__ref_mixer_slot_init(&s[i], &rm.m), GDN_OK);
        gdn__ref_mixer_slot_copy(&rm.m, &s[i], &s[0]);
    }
    rand_inputs in = rand_inputs_make(&rng, &rm.m, 1);
    double o[3][V];
    cr_assert_eq(gdn__ref_mixer_token(&rm.m, &s[0], in.x, in.a, in.b, NULL, o[0]), GDN_OK);
    cr_assert_eq(gdn__ref_mixer_token(&quarter, &s[1], in.x, in.a, in.b, NULL, o[1]), GDN_OK);
    cr_assert_eq(gdn__ref_mixer_token(&one, &s[2], in.x, in.a, in.b, NULL, o[2]), GDN_OK);
    for (int r = 0; r < V; r++) {
        cr_assert_float_eq(o[0][r], o[1][r], 1e-15, "0 means 16^-0.5");
        cr_assert_float_eq(o[2][r], 4.0 * o[1][r], 1e-14, "o is linear in the scale");
    }
    for (int i = 0; i < 3; i++) gdn__ref_mixer_slot_free(&s[i]);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

/* ---- T tokens, verify and commit ---- */

Test(mixer_ref, run_is_tokens_in_order)
{
    enum { T = 4 };
    gdn__rng rng = gdn__rng_seeded(50);
    rand_model rm = rand_model_make(&rng, 2, 4, 8, 8, 4, 1, 1);
    const int64_t C = gdn__ref_mixer_conv_dim(&rm.m), HV = rm.m.HV, HVV = HV * rm.m.V;
    gdn__mixer_ref_slot s1 = rand_slot(&rng, &rm.m), s2;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s2, &rm.m), GDN_OK);
    gdn__ref_mixer_slot_copy(&rm.m, &s2, &s1);
    rand_inputs in = rand_inputs_make(&rng, &rm.m, T);
    double out1[T * 4 * 8], out2[T * 4 * 8];
    cr_assert_eq(gdn__ref_mixer_run(&rm.m, &s1, T, in.x, in.a, in.b, in.z, out1), GDN_OK);
    for (int t = 0; t < T; t++)
        cr_assert_eq(gdn__ref_mixer_token(&rm.m, &s2, in.x + t * C, in.a + t * HV, in.b + t * HV, in.z + t * HVV,
                                          out2 + t * HVV), GDN_OK);
    cr_assert(memcmp(out1, out2, sizeof out1) == 0);
    cr_assert(slots_equal(&rm.m, &s1, &s2));
    gdn__ref_mixer_slot_free(&s1), gdn__ref_mixer_slot_free(&s2);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}

Test(mixer_ref, verify_commit_keeps_exactly_the_accepted_prefix)
{
    enum { T = 5 };
    gdn__rng rng = gdn__rng_seeded(51);
    for (int conv = 0; conv <= 1; conv++) {
        rand_model rm = rand_model_make(&rng, 2, 4, 8, 8, 4, conv, conv);
        const gdn__mixer_ref_model *m = &rm.m;
        const int64_t C = gdn__ref_mixer_conv_dim(m), HV = m->HV, HVV = HV * m->V;
        gdn__mixer_ref_slot start = rand_slot(&rng, m), fresh, verified;
        cr_assert_eq(gdn__ref_mixer_slot_init(&fresh, m), GDN_OK);
        cr_assert_eq(gdn__ref_mixer_slot_init(&verified, m), GDN_OK);
        rand_inputs in = rand_inputs_make(&rng, m, T);
        double all[T * 4 * 8], out[T * 4 * 8], prefix[T * 4 * 8];
        gdn__ref_mixer_slot_copy(m, &fresh, &start);
        cr_assert_eq(gdn__ref_mixer_run(m, &fresh, T, in.x, in.a, in.b, in.z, all), GDN_OK);
        for (int32_t n = -1; n <= T + 1; n++) {
            const int32_t kept = n < 0 ? 0 : (n > T ? T : n);
            gdn__ref_mixer_slot_copy(m, &verified, &start);
            for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) out[i] = NAN; /* poison */
            cr_assert_eq(gdn__ref_mixer_verify_commit(m, &verified, T, in.x, in.a, in.b, in.z, n, out), GDN_OK);
            cr_assert(memcmp(out, all, sizeof(double) * (size_t)(T * HVV)) == 0, "conv %d n %d: outputs", conv, n);
            gdn__ref_mixer_slot_copy(m, &fresh, &start);
            cr_assert_eq(gdn__ref_mixer_run(m, &fresh, kept, in.x, in.a, in.b, in.z, prefix), GDN_OK);
            cr_assert(slots_equal(m, &verified, &fresh), "conv %d n %d: slot after commit", conv, n);
            cr_assert_eq(slots_equal(m, &verified, &start), kept == 0, "conv %d n %d: moved iff tokens kept", conv, n);
            if (conv && kept == 1) { /* fewer than W-1 accepted: older window rows survive, shifted */
                for (int64_t ch = 0; ch < C; ch++) {
                    cr_assert_eq(verified.window[ch], start.window[C + ch]);
                    cr_assert_eq(verified.window[C + ch], start.window[2 * C + ch]);
                    cr_assert_eq(verified.window[2 * C + ch], in.x[ch]);
                }
            }
        }
        gdn__ref_mixer_slot_free(&start), gdn__ref_mixer_slot_free(&fresh), gdn__ref_mixer_slot_free(&verified);
        rand_inputs_free(&in);
        rand_model_free(&rm);
    }
}

/* ---- slots and errors ---- */

Test(mixer_ref, slot_init_is_a_reset_slot)
{
    gdn__rng rng = gdn__rng_seeded(60);
    rand_model rm = rand_model_make(&rng, 2, 4, 8, 16, 3, 1, 1);
    cr_assert_eq(gdn__ref_mixer_window_elems(&rm.m), 2 * (2 * 2 * 8 + 4 * 16));
    cr_assert_eq(gdn__ref_mixer_state_elems(&rm.m), 4 * 16 * 8);
    gdn__mixer_ref_slot s;
    cr_assert_eq(gdn__ref_mixer_slot_init(&s, &rm.m), GDN_OK);
    for (int64_t i = 0; i < gdn__ref_mixer_window_elems(&rm.m); i++) cr_assert_eq(s.window[i], 0.0);
    for (int64_t i = 0; i < gdn__ref_mixer_state_elems(&rm.m); i++) cr_assert_eq(s.S[i], 0.0);
    gdn__ref_mixer_slot_free(&s);
    cr_assert_null(s.S);
    rand_model_free(&rm);
}

Test(mixer_ref, bad_models_and_inputs_are_refused_without_touching_the_slot)
{
    gdn__rng rng = gdn__rng_seeded(61);
    rand_model rm = rand_model_make(&rng, 2, 4, 8, 8, 4, 1, 1);
    gdn__mixer_ref_slot s = rand_slot(&rng, &rm.m), before;
    cr_assert_eq(gdn__ref_mixer_slot_init(&before, &rm.m), GDN_OK);
    gdn__ref_mixer_slot_copy(&rm.m, &before, &s);
    rand_inputs in = rand_inputs_make(&rng, &rm.m, 2);
    double out[2 * 4 * 8];
    cr_assert_eq(gdn__ref_mixer_check(&rm.m), GDN_OK);

    gdn__mixer_ref_model bad = rm.m;
    bad.HV = 3; /* not a multiple of HK */
    cr_assert_eq(gdn__ref_mixer_check(&bad), GDN_EINVAL);
    bad = rm.m, bad.W = 5;
    cr_assert_eq(gdn__ref_mixer_token(&bad, &s, in.x, in.a, in.b, in.z, out), GDN_EINVAL);
    bad = rm.m, bad.W = 1;
    cr_assert_eq(gdn__ref_mixer_check(&bad), GDN_EINVAL);
    bad = rm.m, bad.scale = -1.0;
    cr_assert_eq(gdn__ref_mixer_check(&bad), GDN_EINVAL);
    bad = rm.m, bad.norm_weight = NULL;
    cr_assert_eq(gdn__ref_mixer_check(&bad), GDN_EINVAL);
    bad.use_norm = 0;
    cr_assert_eq(gdn__ref_mixer_check(&bad), GDN_OK, "no norm, no norm weight needed");
    cr_assert_eq(gdn__ref_mixer_token(&rm.m, &s, in.x, in.a, in.b, NULL, out), GDN_EINVAL, "norm on needs z");
    cr_assert_eq(gdn__ref_mixer_run(&rm.m, &s, -1, in.x, in.a, in.b, in.z, out), GDN_EINVAL);
    cr_assert_eq(gdn__ref_mixer_verify_commit(&rm.m, &s, 2, in.x, in.a, NULL, in.z, 1, out), GDN_EINVAL);
    cr_assert(slots_equal(&rm.m, &s, &before));
    cr_assert_eq(gdn__ref_mixer_run(&rm.m, &s, 0, NULL, NULL, NULL, NULL, NULL), GDN_OK, "T = 0 does nothing");
    cr_assert(slots_equal(&rm.m, &s, &before));
    gdn__ref_mixer_slot_free(&s), gdn__ref_mixer_slot_free(&before);
    rand_inputs_free(&in);
    rand_model_free(&rm);
}
