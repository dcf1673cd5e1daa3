/*
 * The float64 CPU reference of the GDN layer step and of commit (SPEC sections 1 and 3). It is the
 * oracle for every test and benchmark and the CPU backend's implementation. Semantics of the
 * parameters: kernels/gdn_kernel_params.h.
 */
#ifndef GDN_REF_H
#define GDN_REF_H

#include <stddef.h>

#include "../gdn_kernel_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* softplus with beta 1 and threshold 20, as SPEC 1 writes it. */
double gdn__ref_softplus(double x);

/* The decay g = exp(-exp(A_log) * softplus(a + dt_bias)), and its log. */
double gdn__ref_log_decay(double a, double A_log, double dt_bias);
double gdn__ref_decay(double a, double A_log, double dt_bias);

/*
 * One value head of one row over T tokens, all in float64. S is [V, K] (row v at S + v*K) and is
 * updated in place; q_t, k_t are [K], v_t is [V] for token t at q + t*q_token_stride etc.; a[t], b[t]
 * are the gate inputs. out_t [V] receives o after token t (out + t*out_token_stride); after_token, if
 * not NULL, is called with S after every token (the verify cache).
 */
typedef void (*gdn__ref_token_hook)(void *user, int32_t t, const double *S);

void gdn__ref_head(int32_t T, int32_t K, int32_t V, double *S, const double *q, const double *k,
                   int64_t qk_token_stride, const double *v, int64_t v_token_stride, const double *a,
                   const double *b, double A_log, double dt_bias, double scale, int use_qk_l2norm,
                   double *out, int64_t out_token_stride, gdn__ref_token_hook after_token, void *user);

/* The same, also writing each token's correction u = beta (v - g S k^) into updates [T, V] when it is
 * not NULL (the ring strategy keeps it). */
void gdn__ref_head_updates(int32_t T, int32_t K, int32_t V, double *S, const double *q, const double *k,
                           int64_t qk_token_stride, const double *v, int64_t v_token_stride, const double *a,
                           const double *b, double A_log, double dt_bias, double scale, int use_qk_l2norm,
                           double *out, int64_t out_token_stride, gdn__ref_token_hook after_token, void *user,
                           double *updates);

/* Bytes of scratch gdn__ref_layer_step_in needs for any supported shape (K, V <= 256). */
size_t gdn__ref_scratch_bytes(void);
/* With the mixer's conv (SPEC 6): the scratch past gdn__ref_scratch_bytes() that a step needs, for
 * up to `tokens` tokens a row (folded or recorded ones plus the step's own). */
size_t gdn__ref_mixer_scratch_bytes(int32_t conv_dim, int32_t conv_width, int32_t tokens);

/* The whole layer step (every row, every value head), sequentially, using caller scratch. */
void gdn__ref_layer_step_in(const gdn__layer_params *p, void *scratch);

/* The same with scratch of its own: GDN_ENOMEM if that allocation fails, else GDN_OK. */
gdn_status gdn__ref_layer_step(const gdn__layer_params *p);

/* Commit for all layers. */
void gdn__ref_commit(const gdn__commit_params *p);

void gdn__ref_slot_copy(const gdn__slot_copy_params *p);

#ifdef __cplusplus
}
#endif

#endif /* GDN_REF_H */
