/* Helpers shared by the gdn-bench modes: status checks that print and return -1, time, medians. */
#ifndef GDN_BENCH_COMMON_H
#define GDN_BENCH_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gdn/gdn.h"

#define CHECK_CUDA(expr)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (expr);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

#define CHECK_GDN(expr)                                                                            \
    do {                                                                                           \
        gdn_status st_ = (expr);                                                                   \
        if (st_ != GDN_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, gdn_status_name(st_));   \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* Monotonic wall-clock seconds. */
static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline int bench_compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* "1,2,4" -> out[] (at most max entries); returns the count. */
static inline int bench_parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
    }
    return n;
}

/* Shared between the gdn-bench modes (definitions in the file named). */
int gdn_bench_spin(cudaStream_t stream, double milliseconds);          /* bench_spin.cu: a busy kernel */
int gdn_bench_copy_ceiling(cudaStream_t stream, double *gbps);         /* gdn_bench.c: 2 GiB D2D copy */
/* The benches' random source (gdn_bench.c): xorshift64*, one stream per process; a mode that wants
 * its own reproducible sequence seeds it when it starts. */
void gdn_bench_rng_seed(uint64_t seed);
uint64_t gdn_bench_rng_next(void);
double gdn_bench_rng_normal(void); /* N(0, 1), Box-Muller */
void gdn_bench_shuffle(int32_t *a, int n); /* Fisher-Yates, from the same source */
int gdn_bench_fill_inputs(gdn_engine *e, const gdn_engine_config *c); /* bench_engine.c: random io */
int gdn_bench_engine_main(int argc, char **argv);                      /* bench_engine.c */
int gdn_bench_strategies_main(int argc, char **argv);                  /* bench_strategies.c */
int gdn_bench_drift_main(int argc, char **argv);                       /* bench_drift.c */
int gdn_bench_tree_main(int argc, char **argv);                        /* bench_tree.c */
int gdn_bench_ceilings_main(int argc, char **argv);                    /* bench_ceilings.cu */
/* bench_separate.cu: the mixer's conv and gated norm as separate kernels around the recurrence (the
 * baseline of gdn-bench --engine --separate). x [rows][conv_dim], z and y [rows][HV][V] (rows = batch
 * x tokens), window [layers][num_slots][W - 1][conv_dim], weight [conv_dim][W], bias [conv_dim]: bf16;
 * norm_weight [V] fp32. */
typedef struct gdn_bench_separate {
    int32_t HK, HV, K, V, conv_width, conv_dim, num_slots;
    float norm_eps;
    void *x, *window, *weight, *bias, *z, *y;
    float *norm_weight;
} gdn_bench_separate;
int gdn_bench_separate_conv(const gdn_bench_separate *c, int32_t layer, const int32_t *read_slots, int32_t bucket,
                            int32_t T, void *q, void *k, void *v, cudaStream_t s);
int gdn_bench_separate_norm(const gdn_bench_separate *c, const void *o, int o_is_f32, const int32_t *read_slots,
                            int32_t bucket, int32_t T, cudaStream_t s);

#endif /* GDN_BENCH_COMMON_H */
