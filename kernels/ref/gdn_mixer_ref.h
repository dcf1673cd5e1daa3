/*
 * The float64 oracle of the whole mixer step (SPEC 6): depthwise causal conv over a per-slot window of
 * the previous W-1 inputs, SiLU, the GDN recurrence of SPEC 1 per value head, and the gated RMSNorm.
 * It is deliberately independent of the kernels' parameter structs (gdn_kernel_params.h) and of
 * gdn_ref.c, so that GPU kernels and engine tests are checked against a second, plain reading of the
 * SPEC rather than against code that shares their plumbing. Everything is double; callers that compare
 * with an engine round the inputs to the input dtype first (the window holds raw inputs, so SPEC 6's
 * window in the input dtype loses nothing against this one).
 */
#ifndef GDN_MIXER_REF_H
#define GDN_MIXER_REF_H

#include <stddef.h>
#include <stdint.h>

#include "gdn/gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the parts, one token each ---- */

/*
 * Depthwise causal conv of one token over `channels` channels with kernel width W (2..4; 4 in both
 * models). weights [channels][W], tap j multiplying row j of [window; x], so tap W-1 meets x itself;
 * bias [channels] or NULL; window [W-1][channels], oldest first, shifted in place to the last W-1 rows
 * of [window; x]. out[ch] = conv (+ bias), through SiLU when `silu` is non-zero. out may be x (each
 * channel reads its x before writing its out), but neither may overlap the window.
 */
void gdn__ref_conv_step(int32_t channels, int32_t W, const double *weights, const double *bias, double *window,
                        const double *x, int silu, double *out);

/*
 * Gated RMSNorm of one value head: y = o * rsqrt(mean(o^2) + eps) * norm_weight * z * sigmoid(z), all
 * [V]. y may be o (the mean is taken before any write).
 */
void gdn__ref_gated_rmsnorm(int32_t V, const double *o, const double *z, const double *norm_weight, double eps,
                            double *y);

/* SPEC 1's gates: g = exp(-exp(A_log) * softplus(a + dt_bias)) with softplus's threshold at 20, and
 * beta = sigmoid(b). Either output pointer may be NULL. */
void gdn__ref_gdn_gates(double a, double b, double A_log, double dt_bias, double *g, double *beta);

/*
 * SPEC 1 for one token and one value head: S [V][K] (row v at S + v*K) updated in place, q, k [K],
 * v [V], o [V] written after the update. `scale` is used as given (no default here); with
 * use_qk_l2norm off, q and k are used raw (q still times scale). o must not overlap S, q, k or v.
 */
void gdn__ref_gdn_token(int32_t K, int32_t V, double *S, const double *q, const double *k, const double *v, double a,
                        double b, double A_log, double dt_bias, double scale, int use_qk_l2norm, double *o);

/* ---- the whole step ---- */

/* One layer's constants. The pointers are borrowed (the caller keeps them alive). */
typedef struct gdn__mixer_ref_model {
    int32_t HK, HV, K, V; /* HV a multiple of HK; value head h reads key head h / (HV / HK) */
    int use_conv;         /* off: x is q | k | v already (after conv and SiLU) */
    int32_t W;            /* conv width, 2..4; only read with use_conv */
    const double *conv_weight; /* [conv_dim][W]; only read with use_conv */
    const double *conv_bias;   /* [conv_dim] or NULL */
    int use_norm;              /* off: the output is o */
    const double *norm_weight; /* [V], shared by the value heads; only read with use_norm */
    double norm_eps;           /* 1e-6 in both models */
    const double *A_log, *dt_bias; /* [HV] */
    double scale;                  /* 0 selects K^-0.5 */
    int use_qk_l2norm;
} gdn__mixer_ref_model;

/* One request's state in one layer, owned by the slot functions below. */
typedef struct gdn__mixer_ref_slot {
    double *window; /* [W-1][conv_dim], oldest first; NULL when the model has no conv */
    double *S;      /* [HV][V][K] */
} gdn__mixer_ref_slot;

/* GDN_OK, or GDN_EINVAL for a model the functions below cannot run (sizes, HV % HK, W, a missing
 * pointer the enabled parts need). */
gdn_status gdn__ref_mixer_check(const gdn__mixer_ref_model *m);

/* 2*HK*K + HV*V: the channels of x (q | k | v, each head-major). */
int64_t gdn__ref_mixer_conv_dim(const gdn__mixer_ref_model *m);
/* Elements of slot.window ((W-1) * conv_dim, 0 without conv) and of slot.S (HV*V*K). */
int64_t gdn__ref_mixer_window_elems(const gdn__mixer_ref_model *m);
int64_t gdn__ref_mixer_state_elems(const gdn__mixer_ref_model *m);

/* A zeroed slot (a reset slot, as SPEC 6 defines reset): GDN_OK, GDN_EINVAL (bad model) or
 * GDN_ENOMEM (then *slot holds NULLs). */
gdn_status gdn__ref_mixer_slot_init(gdn__mixer_ref_slot *slot, const gdn__mixer_ref_model *m);
/* Frees what slot_init allocated; NULL pointers inside are fine. */
void gdn__ref_mixer_slot_free(gdn__mixer_ref_slot *slot);
/* dst = src (window and state), both initialised for m. */
void gdn__ref_mixer_slot_copy(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *dst, const gdn__mixer_ref_slot *src);

/*
 * One token of one request: conv (when on) over x [conv_dim] advancing slot->window, split q | k | v,
 * SPEC 1 per value head with a[h], b[h] advancing slot->S, then the gated norm with z [HV*V] (when on;
 * z may be NULL when off). out [HV*V] receives y, or o without the norm; it must not overlap the inputs.
 * GDN_EINVAL for a bad model, a NULL input or a NULL z with the norm on, GDN_ENOMEM when its conv
 * scratch cannot be had; the slot is untouched then.
 */
gdn_status gdn__ref_mixer_token(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, const double *x,
                                const double *a, const double *b, const double *z, double *out);

/*
 * T tokens in order (a decode for T = 1): token t reads x + t*conv_dim, a + t*HV, b + t*HV,
 * z + t*HV*V and writes out + t*HV*V. Errors as gdn__ref_mixer_token's, found before any token runs.
 */
gdn_status gdn__ref_mixer_run(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, int32_t T, const double *x,
                              const double *a, const double *b, const double *z, double *out);

/*
 * A verify of T tokens followed by commit(accepted) (SPEC 3 and 6): out gets all T tokens' outputs as
 * gdn__ref_mixer_run would write them, and the slot (window and S) ends as after running only the
 * first `accepted` tokens (clamped to 0..T, as commit clamps it); accepted 0 leaves it untouched.
 */
gdn_status gdn__ref_mixer_verify_commit(const gdn__mixer_ref_model *m, gdn__mixer_ref_slot *slot, int32_t T,
                                        const double *x, const double *a, const double *b, const double *z,
                                        int32_t accepted, double *out);

#ifdef __cplusplus
}
#endif

#endif /* GDN_MIXER_REF_H */
