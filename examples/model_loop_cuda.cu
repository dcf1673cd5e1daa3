/*
 * gdn-model-loop's CUDA backend (model_loop.c has the loop and the check): the caller's side of the
 * step in device memory. Built only when the build has CUDA; links cuBLAS from the CUDA toolkit.
 *
 * Device tensors (cudaMalloc, fixed for the run: the step graphs bake them in): fp32 copies of the
 * embedding and the projection weights, the hidden states h [R][T_MAX][D] in fp32, the fused
 * projection [R][T_MAX][N] per layer in bf16 (the engine's x, z, a, b views), y per layer in fp32 (the
 * engine's output), the step's tokens and the "sampler's" accepted counts.
 *
 * The projections are cuBLAS GEMMs computed in fp32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32 or other
 * reduced-precision shortcut, whatever the math mode or NVIDIA_TF32_OVERRIDE say). cuBLAS has no
 * fp32 x fp32 -> bf16 GEMM (a bf16 output needs bf16 inputs, and rounding h or the weights to bf16
 * would be a different model than the float64 run's), so the input projection writes fp32 into a
 * scratch tensor and a small kernel rounds it to bf16 with round-to-nearest-even, as the CPU
 * backend's to_bf16 rounds its (fp32-rounded) sums. An fp32 sum can land on the other side of a bf16
 * rounding boundary than the float64 run's: that is a one-bf16-step difference in an input, which the
 * float64 check absorbs (about the size of the CPU backend's own fp32-output effect; measured with the
 * same projections emulated on the CPU: the default run stays at ~2% of SPEC 4's tolerance), and the
 * windows are checked bit for bit against the inputs given, not against the float64 run's.
 *
 * Every function that runs in a step only enqueues on the stream it is given (the engine's capture
 * stream while the engine captures the step graph): no allocation, no synchronisation. cuBLAS gets a
 * fixed workspace (cublasSetWorkspace) so that a capture never makes it allocate one, and every GEMM
 * shape and kernel runs once at open, before any capture.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_loop.h"

#define CU(call)                                                                                    \
    do {                                                                                            \
        cudaError_t err_ = (call);                                                                  \
        if (err_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));  \
            return -1;                                                                              \
        }                                                                                           \
    } while (0)
#define BLAS(call)                                                                                  \
    do {                                                                                            \
        cublasStatus_t st_ = (call);                                                                \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasGetStatusString(st_)); \
            return -1;                                                                              \
        }                                                                                           \
    } while (0)

namespace {

constexpr size_t kWorkspaceBytes = 4u << 20;
constexpr int kRows = R * T_MAX; /* every token slot of every row: the step tensors' rows */

struct cuda_ctx {
    const model *m;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *workspace;
    float *embed;             /* [VOCAB][D] */
    float *in_w[MAX_L];       /* [D][N] */
    float *out_w[MAX_L];      /* [HV V][D] */
    float *h;                 /* [R][T_MAX][D] */
    float *fused32;           /* [R][T_MAX][N]: the input projection before its rounding to bf16 */
    uint16_t *fused[MAX_L];   /* [R][T_MAX][N] bf16 */
    float *y[MAX_L];          /* [R][T_MAX][HV V] */
    int32_t *tokens;          /* [R][T_MAX], -1: none */
    int32_t *accepted;        /* [R] */
    float *h_host;            /* read_back's staging */
};

__global__ void embed_kernel(const int32_t *tokens, const float *embed, float *h)
{
    const int row = blockIdx.x, d = threadIdx.x, token = tokens[row];
    h[row * D + d] = token >= 0 ? embed[token * D + d] : 0.0f;
}

/* fp32 -> bf16, round to nearest even: model_loop.c's to_bf16 on a float. */
__global__ void round_bf16_kernel(const float *src, uint16_t *dst, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t u = __float_as_uint(src[i]);
    dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* cuBLAS on the given stream with the fixed workspace (cublasSetStream resets the workspace). */
int bind(cuda_ctx *c, cudaStream_t stream)
{
    BLAS(cublasSetStream(c->blas, stream));
    BLAS(cublasSetWorkspace(c->blas, c->workspace, kWorkspaceBytes));
    return 0;
}

int cuda_embed(void *ctx, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    embed_kernel<<<kRows, D, 0, (cudaStream_t)stream>>>(c->tokens, c->embed, c->h);
    CU(cudaGetLastError());
    return 0;
}

/* fused[l] = bf16(h in_w[l]) for every row: row-major [rows][N] = [rows][D] [D][N], which cuBLAS
 * (column-major) sees as in_w^T (N x D, ld N) times h^T (D x rows, ld D). */
int cuda_in_proj(void *ctx, int32_t l, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const int N = (int)c->m->N;
    const float one = 1.0f, zero = 0.0f;
    if (bind(c, (cudaStream_t)stream)) return -1;
    BLAS(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, kRows, D, &one, c->in_w[l], CUDA_R_32F, N, c->h,
                      CUDA_R_32F, D, &zero, c->fused32, CUDA_R_32F, N, CUBLAS_COMPUTE_32F_PEDANTIC,
                      CUBLAS_GEMM_DEFAULT));
    const int64_t n = (int64_t)kRows * N;
    round_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(c->fused32, c->fused[l], n);
    CU(cudaGetLastError());
    return 0;
}

/* h[i][t < T] += y[l][i][t] out_w[l] for each row i: one batch entry per row (the step's T tokens of
 * it), out_w shared (stride 0), the residual through beta = 1. */
int cuda_out_proj(void *ctx, int32_t l, int32_t T, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const int HVV = c->m->HV * c->m->V;
    const float one = 1.0f;
    if (bind(c, (cudaStream_t)stream)) return -1;
    BLAS(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, D, T, HVV, &one, c->out_w[l], CUDA_R_32F, D,
                                    0, c->y[l], CUDA_R_32F, HVV, (long long)T_MAX * HVV, &one, c->h, CUDA_R_32F,
                                    D, (long long)T_MAX * D, R, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* The "sampler": a real one would write the counts it decides; this one copies the simulated ones. */
int cuda_sample(void *ctx, int32_t *accepted, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    CU(cudaMemcpyAsync(accepted, c->accepted, sizeof(int32_t) * R, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return 0;
}

int cuda_set_inputs(void *ctx, const int32_t *tokens, const int32_t *accepted, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    CU(cudaMemcpyAsync(c->tokens, tokens, sizeof(int32_t) * kRows, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    CU(cudaMemcpyAsync(c->accepted, accepted, sizeof(int32_t) * R, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return 0;
}

int cuda_read_back(void *ctx, double *host_h, uint16_t *host_fused, void *stream)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t fused_elements = (size_t)kRows * (size_t)c->m->N;
    CU(cudaMemcpyAsync(c->h_host, c->h, sizeof(float) * kRows * D, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    for (int32_t l = 0; l < c->m->L; l++)
        CU(cudaMemcpyAsync(host_fused + l * fused_elements, c->fused[l], 2 * fused_elements, cudaMemcpyDeviceToHost,
                           (cudaStream_t)stream));
    CU(cudaStreamSynchronize((cudaStream_t)stream));
    for (int i = 0; i < kRows * D; i++) host_h[i] = c->h_host[i];
    return 0;
}

void cuda_close(void *ctx)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) cublasDestroy(c->blas);
    for (int32_t l = 0; l < MAX_L; l++) cudaFree(c->in_w[l]), cudaFree(c->out_w[l]), cudaFree(c->fused[l]), cudaFree(c->y[l]);
    cudaFree(c->embed), cudaFree(c->h), cudaFree(c->fused32), cudaFree(c->tokens), cudaFree(c->accepted);
    cudaFree(c->workspace);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->h_host);
    free(c);
}

/* A float64 host array as fp32 device memory. */
int upload_f32(float **dst, const double *src, int64_t n)
{
    float *tmp = (float *)malloc(sizeof(float) * (size_t)n);
    if (!tmp) return -1;
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)src[i];
    cudaError_t err = cudaMalloc((void **)dst, sizeof(float) * (size_t)n);
    if (err == cudaSuccess) err = cudaMemcpy(*dst, tmp, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    free(tmp);
    CU(err);
    return 0;
}

int open_into(cuda_ctx *c, const model *m)
{
    const int64_t N = m->N, HVV = (int64_t)m->HV * m->V;
    CU(cudaSetDevice(0)); /* the engine's device (gdn_engine_config.device) */
    CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    BLAS(cublasCreate(&c->blas));
    CU(cudaMalloc(&c->workspace, kWorkspaceBytes));
    if (upload_f32(&c->embed, m->embed, (int64_t)VOCAB * D)) return -1;
    for (int32_t l = 0; l < m->L; l++) {
        if (upload_f32(&c->in_w[l], m->in_w[l], D * N) || upload_f32(&c->out_w[l], m->out_w[l], HVV * D)) return -1;
        CU(cudaMalloc((void **)&c->fused[l], 2 * (size_t)(kRows * N)));
        CU(cudaMalloc((void **)&c->y[l], sizeof(float) * (size_t)(kRows * HVV)));
        CU(cudaMemset(c->fused[l], 0, 2 * (size_t)(kRows * N)));
        CU(cudaMemset(c->y[l], 0, sizeof(float) * (size_t)(kRows * HVV)));
    }
    CU(cudaMalloc((void **)&c->h, sizeof(float) * kRows * D));
    CU(cudaMalloc((void **)&c->fused32, sizeof(float) * (size_t)(kRows * N)));
    CU(cudaMalloc((void **)&c->tokens, sizeof(int32_t) * kRows));
    CU(cudaMalloc((void **)&c->accepted, sizeof(int32_t) * R));
    CU(cudaMemset(c->tokens, 0xff, sizeof(int32_t) * kRows)); /* -1: no token */
    CU(cudaMemset(c->accepted, 0, sizeof(int32_t) * R));
    c->h_host = (float *)malloc(sizeof(float) * kRows * D);
    if (!c->h_host) return -1;
    /* Every kernel and GEMM shape once, outside any capture (cuBLAS picks and loads its kernels on the
     * first call of a shape); with no tokens h, fused and the residual stay zero. */
    if (cuda_embed(c, c->stream)) return -1;
    for (int32_t l = 0; l < m->L; l++) {
        if (cuda_in_proj(c, l, c->stream)) return -1;
        for (int32_t T = 1; T <= T_MAX; T++)
            if (cuda_out_proj(c, l, T, c->stream)) return -1;
    }
    CU(cudaStreamSynchronize(c->stream));
    return 0;
}

void *cuda_open(const model *m, step_tensors *t, void **stream)
{
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return NULL;
    c->m = m;
    if (open_into(c, m)) {
        fprintf(stderr, "gdn-model-loop: CUDA backend: could not set up the caller's device tensors\n");
        cuda_close(c);
        return NULL;
    }
    for (int32_t l = 0; l < m->L; l++) t->fused[l] = c->fused[l], t->y[l] = c->y[l];
    *stream = (void *)c->stream;
    return c;
}

} // namespace

extern "C" const proj_backend model_loop_cuda_proj = {"cuda", cuda_open, cuda_set_inputs, cuda_embed, cuda_in_proj,
                                                      cuda_out_proj, cuda_sample, cuda_read_back, cuda_close};

extern "C" int model_loop_cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver, or no device: not sticky, but clear it */
        return 0;
    }
    return count;
}
