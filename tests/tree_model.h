/*
 * Token trees for the tests (SPEC 3), header-only so that the op-layer suite (test_tree.c) and the
 * engine suites (engine_tree_checks.c) share one generator and one model: a random tree of n nodes,
 * the path of a node, and SPEC 1 written out for one token on one value head in float64 (no library
 * code: an independent model of what the kernels and the reference compute).
 */
#ifndef GDN_TESTS_TREE_MODEL_H
#define GDN_TESTS_TREE_MODEL_H

#include <math.h>
#include <stdint.h>

#include "support.h"

/* Most nodes a tree may have (GDN_MAX_TOKENS). */
enum { TREE_MAX_NODES = 16 };

/* A random tree of n nodes (parents par[0..n) in -1..t-1): depth at most a random 1..n, at most a
 * random 1..4 children a node (more only when every node within the depth is full). */
static inline void tree_random(test_rng *rng, int32_t n, int32_t *par)
{
    const int32_t max_depth = 1 + test_rng_below(rng, n), max_children = 1 + test_rng_below(rng, 4);
    int32_t depth[TREE_MAX_NODES], children[TREE_MAX_NODES + 1] = {0}; /* children[p + 1] */
    for (int32_t t = 0; t < n; t++) {
        int32_t pick[TREE_MAX_NODES + 1], m = 0;
        for (int pass = 0; pass < 2 && m == 0; pass++)
            for (int32_t p = -1; p < t; p++)
                if ((p < 0 || depth[p] < max_depth) && (pass == 1 || children[p + 1] < max_children)) pick[m++] = p;
        par[t] = pick[test_rng_below(rng, m)];
        depth[t] = par[t] < 0 ? 1 : depth[par[t]] + 1;
        children[par[t] + 1]++;
    }
}

/* The path of `node` (-1..n-1) in `par` (NULL: a chain), root first, into path[]: its length (0 for
 * node -1). */
static inline int32_t tree_path(const int32_t *par, int32_t node, int32_t *path)
{
    int32_t len = 0;
    for (int32_t t = node; t >= 0; t = par ? par[t] : t - 1) path[len++] = t;
    for (int32_t j = 0; j < len / 2; j++) {
        const int32_t x = path[j];
        path[j] = path[len - 1 - j], path[len - 1 - j] = x;
    }
    return len;
}

/*
 * One token on one value head (SPEC 1): S [V][K] (row v holds S[v, :]) advances in place; o [V] (may
 * be NULL) receives S q^ after the update. q, k [K] and v [V] as the kernels read them (already rounded
 * to the input dtype), a and b the raw gate inputs.
 */
static inline void tree_model_token(int32_t K, int32_t V, double *S, const double *q, const double *k, const double *v,
                                    double a, double b, double A_log, double dt_bias, double scale, int use_qk_l2norm,
                                    double *o)
{
    double qn[256], kn[256], qs = 0, ks = 0;
    for (int32_t c = 0; c < K; c++) qs += q[c] * q[c], ks += k[c] * k[c];
    const double qf = use_qk_l2norm ? 1.0 / sqrt(qs + 1e-6) : 1.0, kf = use_qk_l2norm ? 1.0 / sqrt(ks + 1e-6) : 1.0;
    for (int32_t c = 0; c < K; c++) qn[c] = q[c] * qf * scale, kn[c] = k[c] * kf;
    const double x = a + dt_bias;
    const double g = exp(-exp(A_log) * (x <= 20 ? log1p(exp(x)) : x));
    const double beta = 1.0 / (1.0 + exp(-b));
    for (int32_t r = 0; r < V; r++) {
        double *row = S + (int64_t)r * K, sk = 0, out = 0;
        for (int32_t c = 0; c < K; c++) row[c] *= g, sk += row[c] * kn[c];
        const double u = beta * (v[r] - sk);
        for (int32_t c = 0; c < K; c++) row[c] += u * kn[c], out += row[c] * qn[c];
        if (o) o[r] = out;
    }
}

#endif /* GDN_TESTS_TREE_MODEL_H */
