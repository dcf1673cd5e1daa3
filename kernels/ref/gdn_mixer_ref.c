/*
 * float64 oracle of the mixer step (SPEC 6). Written for clarity, not speed: each function reads like
 * the SPEC's lines, and the whole step is only these parts composed in the SPEC's order.
 */
#include "gdn_mixer_ref.h"

#include <math.h>
#include <string.h>

#include "../../engine/alloc.h"

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

void gdn__ref_conv_step(int32_t channels, int32_t W, const double *weights, const double *bias, double *window,
                        const double *x, int silu, double *out)
{
    for (int32_t ch = 0; ch < channels; ch++) {
        const double *w = weights + (int64_t)ch * W;
        /* Rows 0..W-2 of [window; x] are the window, row W-1 is x. */
        double c = w[W - 1] * x[ch];
        for (int32_t j = 0; j < W - 1; j++) c += w[j] * window[(int64_t)j * channels + ch];
        if (bias) c += bias[ch];
        /* The window moves before out is written, so out may be x. */
        for (int32_t j = 0; j + 1 < W - 1; j++)
            window[(int64_t)j * channels + ch] = window[(int64_t)(j + 1) * channels + ch];
        if (W > 1) window[(int64_t)(W - 2) * channels + ch] = x[ch];
        out[ch] = silu ? c * sigmoid(c) : c;
    }
}

void gdn__ref_gated_rmsnorm(int32_t V, const double *o, const double *z, const double *norm_weight, double eps,
                            double *y)
{
    double sum = 0.0;
    for (int32_t i = 0; i < V; i++) sum += o[i] * o[i];
    const double inv = 1.0 / sqrt(sum / V + eps);
    for (int32_t i = 0; i < V; i++) y[i] = o[i] * inv * norm_weight[i] * z[i] * sigmoid(z[i]);
}

void gdn__ref_gdn_gates(double a, double b, double A_log, double dt_bias, double *g, double *beta)
{
    const double x = a + dt_bias;
    const double sp = x <= 20.0 ? log1p(exp(x)) : x;
    if (g) *g = exp(-exp(A_log) * sp);
    if (beta) *beta = sigmoid(b);
}

/* factor / sqrt(sum x^2 + 1e-6), or factor alone without the L2 norm: what multiplies x to give x^. */
static double l2_factor(int32_t n, const double *x, double factor, int use_l2norm)
{
    if (!use_l2norm) return factor;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += x[i] * x[i];
    return factor / sqrt(sum + 1e-6);
}

void gdn__ref_gdn_token(int32_t K, int32_t V, double *S, const double *q, const double *k, const double *v, double a,
                        double b, double A_log, double dt_bias, double scale, int use_qk_l2norm, double *o)
{
    double g, beta;
    gdn__ref_gdn_gates(a, b, A_log, dt_bias, &g, &beta);
    /* k^ = k * kf and q^ = q * qf, formed element by element so that no head size limits a buffer. */
    const double kf = l2_factor(K, k, 1.0, use_qk_l2norm);
    const double qf = l2_factor(K, q, scale, use_qk_l2norm);
    for (int32_t row = 0; row < V; row++) {
        double *S_row = S + (int64_t)row * K;
        double Sk = 0.0;
        for (int32_t c = 0; c < K; c++) {
            S_row[c] *= g;
            Sk += S_row[c] * (k[c] * kf);
        }
        const double u = beta * (v[row] - Sk);
        double acc = 0.0;
        for (int32_t c = 0; c < K; c++) {
            S_row[c] += u * (k[c] * kf);
            acc += S_row[c] * (q[c] * qf);
        }
        o[row] = acc;
    }
}

gdn_status gdn__ref_mixer_check(const gdn__mixer_ref_model *m)
{
    if (!m || m->HK < 1 || m->HV < 1 || m->HV % m->HK != 0 || m->K < 1 || m->V < 1) return GDN_EINVAL;
    if (!m->A_log || !m->dt_bias || !(m->scale >= 0.0)) return GDN_EINVAL;
    if (m->use_conv && (m->W < 2 || m->W > 4 || !m->conv_weight)) return GDN_EINVAL;
    if (m->use_norm && !m->norm_weight) return GDN_EINVAL;
    return GDN_OK;
}

int64_t gdn__ref_mixer_conv_dim(const gdn__mixer_ref_model *m)
{
    return 2 * (int64_t)m->HK * m->K + (int64_t)m->HV * m->V;
}

int64_t gdn__ref_mixer_window_elems(const gdn__mixer_ref_model *m)
{
    return m->use_conv ? (int64_t)(m->W - 1) * gdn__ref_mixer_conv_dim(m) : 0;
}

int64_t gdn__ref_mixer_state_elems(const gdn__mixer_ref_model *m) { return (int64_t)m->HV * m->V * m->K; }

gdn_status gdn__ref_mixer_slot_init(gdn__mixer_ref_slot *slot, const gdn__mixer_ref_model *m)
{
    if (!slot) return GDN_EINVAL;
    slot->window = NULL, slot->S = NULL;
    const gdn_status status = gdn__ref_mixer_check(m);
    if (status != GDN_OK) return status;
    const int64_t window = gdn__ref_mixer_window_elems(m);
    slot->S = gdn__calloc((size_t)gdn__ref_mixer_state_elems(m), sizeof(double));
    if (window > 0) slot->window = gdn__calloc((size_t)window, sizeof(double));
    if (!slot->S || (window > 0 && !slot->window)) {
        gdn__ref_mixer_slot_free(slot);
        return GDN_ENOMEM;
    }
    return GDN_OK;
}

void gdn__ref_mixer_slot_free(gdn__mixer_ref_slot *slot)
{
    if (!slot) return;
    gdn__free(slot->window);
    gdn__free(slot->S);
    slot->window = NULL, slot->S = NULL;
}

void gdn__ref_mixer_slot_copy(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *dst, const gdn__mixer_ref_slot *src)
{
    const int64_t window = gdn__ref_mixer_window_elems(m);
    if (window > 0) memcpy(dst->window, src->window, (size_t)window * sizeof(double));
    memcpy(dst->S, src->S, (size_t)gdn__ref_mixer_state_elems(m) * sizeof(double));
}

/* Everything the step checks before it touches the slot. */
static gdn_status check_step(const gdn__mixer_ref_model *m, const gdn__mixer_ref_slot *slot, int32_t T,
                             const double *x, const double *a, const double *b, const double *z, const double *out)
{
    const gdn_status status = gdn__ref_mixer_check(m);
    if (status != GDN_OK) return status;
    if (T < 0 || !slot || !slot->S || (m->use_conv && !slot->window)) return GDN_EINVAL;
    if (T > 0 && (!x || !a || !b || !out || (m->use_norm && !z))) return GDN_EINVAL;
    return GDN_OK;
}

/* One token with caller scratch c [conv_dim] (unused without conv). */
static void mixer_token_in(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, const double *x,
                           const double *a, const double *b, const double *z, double *out, double *c)
{
    const int64_t conv_dim = gdn__ref_mixer_conv_dim(m);
    if (m->use_conv) gdn__ref_conv_step((int32_t)conv_dim, m->W, m->conv_weight, m->conv_bias, slot->window, x, 1, c);
    const double *qkv = m->use_conv ? c : x;
    const double *q = qkv, *k = qkv + (int64_t)m->HK * m->K, *v = qkv + 2 * (int64_t)m->HK * m->K;
    const double scale = m->scale == 0.0 ? 1.0 / sqrt((double)m->K) : m->scale;
    const int32_t heads_per_key = m->HV / m->HK;
    for (int32_t h = 0; h < m->HV; h++) {
        const int32_t kh = h / heads_per_key;
        double *o = out + (int64_t)h * m->V;
        gdn__ref_gdn_token(m->K, m->V, slot->S + (int64_t)h * m->V * m->K, q + (int64_t)kh * m->K,
                           k + (int64_t)kh * m->K, v + (int64_t)h * m->V, a[h], b[h], m->A_log[h], m->dt_bias[h],
                           scale, m->use_qk_l2norm, o);
        if (m->use_norm) gdn__ref_gated_rmsnorm(m->V, o, z + (int64_t)h * m->V, m->norm_weight, m->norm_eps, o);
    }
}

/* T tokens with caller scratch; the inputs were checked. */
static void mixer_run_in(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, int32_t T, const double *x,
                         const double *a, const double *b, const double *z, double *out, double *c)
{
    const int64_t conv_dim = gdn__ref_mixer_conv_dim(m), hv = m->HV, hvv = (int64_t)m->HV * m->V;
    for (int32_t t = 0; t < T; t++)
        mixer_token_in(m, slot, x + t * conv_dim, a + t * hv, b + t * hv, m->use_norm ? z + t * hvv : NULL,
                       out + t * hvv, c);
}

/* Scratch for the conv output: NULL without conv, where none is needed. */
static gdn_status conv_scratch(const gdn__mixer_ref_model *m, double **c)
{
    *c = NULL;
    if (!m->use_conv) return GDN_OK;
    *c = gdn__malloc((size_t)gdn__ref_mixer_conv_dim(m) * sizeof(double));
    return *c ? GDN_OK : GDN_ENOMEM;
}

gdn_status gdn__ref_mixer_token(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, const double *x,
                                const double *a, const double *b, const double *z, double *out)
{
    return gdn__ref_mixer_run(m, slot, 1, x, a, b, z, out);
}

gdn_status gdn__ref_mixer_run(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, int32_t T, const double *x,
                              const double *a, const double *b, const double *z, double *out)
{
    gdn_status status = check_step(m, slot, T, x, a, b, z, out);
    if (status != GDN_OK || T == 0) return status;
    double *c;
    if ((status = conv_scratch(m, &c)) != GDN_OK) return status;
    mixer_run_in(m, slot, T, x, a, b, z, out, c);
    gdn__free(c);
    return GDN_OK;
}

gdn_status gdn__ref_mixer_verify_commit(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, int32_t T,
                                        const double *x, const double *a, const double *b, const double *z,
                                        int32_t accepted, double *out)
{
    gdn_status status = check_step(m, slot, T, x, a, b, z, out);
    if (status != GDN_OK || T == 0) return status;
    const int32_t n = accepted < 0 ? 0 : (accepted > T ? T : accepted);
    /* The verify runs on a copy, token by token, as a verify cache would see it; the commit then takes
     * the copy as it stood after token n-1. The slot itself is only ever written by that copy. */
    gdn__mixer_ref_slot work;
    if ((status = gdn__ref_mixer_slot_init(&work, m)) != GDN_OK) return status;
    double *c;
    if ((status = conv_scratch(m, &c)) != GDN_OK) {
        gdn__ref_mixer_slot_free(&work);
        return status;
    }
    gdn__ref_mixer_slot_copy(m, &work, slot);
    const int64_t conv_dim = gdn__ref_mixer_conv_dim(m), hv = m->HV, hvv = (int64_t)m->HV * m->V;
    for (int32_t t = 0; t < T; t++) {
        mixer_run_in(m, &work, 1, x + t * conv_dim, a + t * hv, b + t * hv, m->use_norm ? z + t * hvv : NULL,
                     out + t * hvv, c);
        if (t + 1 == n) gdn__ref_mixer_slot_copy(m, slot, &work);
    }
    gdn__free(c);
    gdn__ref_mixer_slot_free(&work);
    return GDN_OK;
}
