/*
 * What gdn-model-loop's two halves share: model_loop.c (the loop, the CPU backend's side of the step,
 * the float64 check; plain C11) and model_loop_cuda.cu (the CUDA backend's side: device tensors,
 * cuBLAS GEMMs; built only when the build has CUDA). Public API only (gdn/gdn.h).
 */
#ifndef GDN_EXAMPLES_MODEL_LOOP_H
#define GDN_EXAMPLES_MODEL_LOOP_H

#include <stdint.h>

#include <gdn/gdn.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MAX_L = 8, R = 3, T_MAX = 4, SLOTS = 4, VOCAB = 64, D = 128, W = 4 };

/* The model (tiny GDN heads: HK 2, HV 4, K = V = 64), host memory, float64. */
typedef struct model {
    int32_t L, HK, HV, K, V;
    int64_t C, N;            /* conv_dim; fused projection width N = C + HV V + 2 HV */
    double *embed;           /* [VOCAB][D] */
    double *in_w[MAX_L];     /* [D][N] */
    double *out_w[MAX_L];    /* [HV V][D] */
    double *conv_w[MAX_L];   /* [C][W], fp32 values */
    double *norm_w[MAX_L];   /* [V] */
    double *A_log[MAX_L], *dt_bias[MAX_L]; /* [HV] */
} model;

/*
 * The caller's step tensors in backend memory (host memory for the CPU backend, device memory for
 * CUDA), fixed for the engine's life: the engine's views of x, z, a, b and y point into them, and the
 * step graphs the CUDA backend captures bake every address in.
 */
typedef struct step_tensors {
    uint16_t *fused[MAX_L]; /* [R][T_MAX][N] bf16: x | z | a | b, the input projection's output */
    float *y[MAX_L];        /* [R][T_MAX][HV V] fp32: the engine's output */
} step_tensors;

/*
 * The caller's side of a step, one table per backend. The step is embed, then per layer in_proj, the
 * engine's layer, out_proj, then for a verify step the sampler and the engine's commit: model_loop.c's
 * capture callback calls them in that order (directly on the CPU backend; inside the engine's
 * capture of the step graph on CUDA, where they only enqueue on `stream`). Functions returning int
 * give 0 on success, else print why on stderr.
 */
typedef struct proj_backend {
    const char *name;
    /* Allocates the step tensors and uploads the weights; *stream: the stream to drive the engine on. */
    void *(*open)(const model *m, step_tensors *t, void **stream);
    /* Before a step (outside any capture): the step's tokens [R][T_MAX] (-1: no token at that slot)
     * and the accepted counts [R] that its "sampler" will write, into the backend's input buffers. */
    int (*set_inputs)(void *ctx, const int32_t *tokens, const int32_t *accepted, void *stream);
    int (*embed)(void *ctx, void *stream);                    /* h = embedding of each token, or 0 */
    int (*in_proj)(void *ctx, int32_t l, void *stream);       /* fused[l] = bf16(h in_w[l]), every row */
    int (*out_proj)(void *ctx, int32_t l, int32_t T, void *stream); /* h[i][t < T] += y[l][i][t] out_w[l] */
    int (*sample)(void *ctx, int32_t *accepted, void *stream); /* the engine's accepted counts */
    /* After a step, waiting for the stream: h [R][T_MAX][D] and every layer's fused input
     * [L][R][T_MAX][N] (what the engine was given) to the host, for the check. */
    int (*read_back)(void *ctx, double *host_h, uint16_t *host_fused, void *stream);
    void (*close)(void *ctx);
} proj_backend;

#ifdef GDN_MODEL_LOOP_CUDA
/* model_loop_cuda.cu: the CUDA backend's table, and the number of CUDA devices (0 when none or the
 * driver is missing). */
extern const proj_backend model_loop_cuda_proj;
int model_loop_cuda_device_count(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* GDN_EXAMPLES_MODEL_LOOP_H */
