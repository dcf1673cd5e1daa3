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

#endif /* GDN_BENCH_COMMON_H */
