/*
 * The float64 model of one saved row for the fuzz driver and the soak (SPEC 1 through
 * gdn__ref_gdn_token, independent of the library's kernels and of its reference's plumbing). A row is
 * saved as q [T][HK][K], k [T][HK][K], v [T][HV][V], a [T][HV], b [T][HV], all double.
 */
#ifndef GDN_TESTS_ROW_MODEL_H
#define GDN_TESTS_ROW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ref/gdn_mixer_ref.h"

typedef struct test_row_model {
    int32_t HK, HV, K, V;
    const float *A_log, *dt_bias; /* [HV] of the layer */
    double scale;
    int use_qk_l2norm;
} test_row_model;

/* Token t of a row of T tokens applied to S [HV][V][K]; its outputs [HV][V] into out when not NULL. */
static inline void test_model_token(const test_row_model *m, const double *row, int32_t T, int32_t t, double *S,
                                    double *out)
{
    const double *q = row, *k = q + (size_t)T * m->HK * m->K, *v = k + (size_t)T * m->HK * m->K;
    const double *a = v + (size_t)T * m->HV * m->V, *b = a + (size_t)T * m->HV;
    double unused[256];
    const int32_t per_key = m->HV / m->HK;
    for (int32_t h = 0; h < m->HV; h++) {
        const int32_t kh = h / per_key;
        gdn__ref_gdn_token(m->K, m->V, S + (size_t)h * m->V * m->K, q + ((size_t)t * m->HK + kh) * m->K,
                           k + ((size_t)t * m->HK + kh) * m->K, v + ((size_t)t * m->HV + h) * m->V,
                           a[(size_t)t * m->HV + h], b[(size_t)t * m->HV + h], m->A_log[h], m->dt_bias[h], m->scale,
                           m->use_qk_l2norm, out ? out + (size_t)h * m->V : unused);
    }
}

#endif /* GDN_TESTS_ROW_MODEL_H */
