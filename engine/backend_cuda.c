/*
 * The CUDA backend: backend memory is device memory, work is enqueued on the caller's stream, and
 * the math is the kernels of kernels/gdn_cuda_*.cu. Staged uploads (the slot indices of each step) go
 * through a ring of pinned host buffers, each guarded by an event, so the caller's host array can be
 * reused at once and the host waits only if the GPU is a whole ring of steps behind.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "alloc.h"
#include "backend_impl.h"
#include "graphs/graph_cuda.h"
#include "kernels/gdn_cuda.h"

#define STAGING_RING 16

typedef struct cuda_backend {
    int device;
    size_t staging_bytes;
    unsigned char *staging;            /* pinned [STAGING_RING][staging_bytes] */
    cudaEvent_t staging_done[STAGING_RING];
    int staging_next;
    cudaStream_t capture_stream; /* private: graphs are captured here, replayed on the caller's */
    char last_error[256];
} cuda_backend;

/* Records the failing call and converts it to GDN_ECUDA (GDN_ENOMEM for allocation failures). */
static gdn_status record_error(cuda_backend *cu, cudaError_t err, const char *expr, int line)
{
    snprintf(cu->last_error, sizeof cu->last_error, "%s: %s (%s:%d)", expr, cudaGetErrorString(err),
             __FILE__, line);
    return err == cudaErrorMemoryAllocation ? GDN_ENOMEM : GDN_ECUDA;
}

#define GDN__CUDA_TRY(cu, expr)                                             \
    do {                                                                    \
        cudaError_t gdn__err = (expr);                                      \
        if (gdn__err != cudaSuccess) return record_error((cu), gdn__err, #expr, __LINE__); \
    } while (0)

static gdn_status cuda_alloc(void *ctx, size_t bytes, void **out)
{
    cuda_backend *cu = ctx;
    *out = NULL;
    GDN__CUDA_TRY(cu, cudaMalloc(out, bytes ? bytes : 1));
    cudaError_t err = cudaMemset(*out, 0, bytes);
    if (err != cudaSuccess) {
        cudaFree(*out);
        *out = NULL;
        return record_error(cu, err, "cudaMemset(*out, 0, bytes)", __LINE__);
    }
    return GDN_OK;
}

static void cuda_free(void *ctx, void *ptr)
{
    (void)ctx;
    if (ptr) cudaFree(ptr);
}

static gdn_status cuda_zero(void *ctx, void *ptr, size_t bytes, void *stream)
{
    GDN__CUDA_TRY((cuda_backend *)ctx, cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream));
    return GDN_OK;
}

static gdn_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, void *stream)
{
    GDN__CUDA_TRY((cuda_backend *)ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return GDN_OK;
}

static gdn_status cuda_upload_staged(void *ctx, void *dst, const void *host_src, size_t bytes, void *stream)
{
    cuda_backend *cu = ctx;
    if (bytes > cu->staging_bytes) return GDN_EINVAL;
    const int slot = cu->staging_next;
    cu->staging_next = (slot + 1) % STAGING_RING;
    /* Back-pressure only: the buffer is busy while the GPU has not reached its last copy. */
    GDN__CUDA_TRY(cu, cudaEventSynchronize(cu->staging_done[slot]));
    unsigned char *staged = cu->staging + (size_t)slot * cu->staging_bytes;
    memcpy(staged, host_src, bytes);
    GDN__CUDA_TRY(cu, cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    GDN__CUDA_TRY(cu, cudaEventRecord(cu->staging_done[slot], (cudaStream_t)stream));
    return GDN_OK;
}

static gdn_status cuda_layer_step(void *ctx, const gdn__layer_params *params, void *stream)
{
    gdn_status status = gdn__cuda_layer_step(params, stream);
    if (status == GDN_ECUDA) record_error(ctx, cudaGetLastError(), "gdn__cuda_layer_step", __LINE__);
    return status;
}

static gdn_status cuda_commit(void *ctx, const gdn__commit_params *params, void *stream)
{
    gdn_status status = gdn__cuda_commit(params, stream);
    if (status == GDN_ECUDA) record_error(ctx, cudaGetLastError(), "gdn__cuda_commit", __LINE__);
    return status;
}

static gdn_status cuda_synchronize(void *ctx, void *stream)
{
    if (stream) GDN__CUDA_TRY((cuda_backend *)ctx, cudaStreamSynchronize((cudaStream_t)stream));
    else GDN__CUDA_TRY((cuda_backend *)ctx, cudaDeviceSynchronize());
    return GDN_OK;
}

static gdn_status cuda_capture_begin(void *ctx, void **capture_stream)
{
    cuda_backend *cu = ctx;
    GDN__CUDA_TRY(cu, gdn__graph_capture_begin(cu->capture_stream));
    *capture_stream = cu->capture_stream;
    return GDN_OK;
}

static gdn_status cuda_capture_end(void *ctx, int keep, void **graph)
{
    cuda_backend *cu = ctx;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = gdn__graph_capture_end(cu->capture_stream, keep, &exec);
    *graph = exec;
    if (err != cudaSuccess) return record_error(cu, err, "gdn__graph_capture_end", __LINE__);
    return GDN_OK;
}

static gdn_status cuda_graph_launch(void *ctx, void *graph, void *stream)
{
    GDN__CUDA_TRY((cuda_backend *)ctx, gdn__graph_launch((cudaGraphExec_t)graph, (cudaStream_t)stream));
    return GDN_OK;
}

static void cuda_graph_destroy(void *ctx, void *graph)
{
    (void)ctx;
    gdn__graph_destroy((cudaGraphExec_t)graph);
}

static const char *cuda_last_error(const void *ctx) { return ((const cuda_backend *)ctx)->last_error; }

static void cuda_destroy(void *ctx)
{
    cuda_backend *cu = ctx;
    if (!cu) return;
    for (int i = 0; i < STAGING_RING; i++)
        if (cu->staging_done[i]) cudaEventDestroy(cu->staging_done[i]);
    if (cu->staging) cudaFreeHost(cu->staging);
    if (cu->capture_stream) cudaStreamDestroy(cu->capture_stream);
    gdn__free(cu);
}

static const gdn__backend_iface cuda_iface = {
    .kind = GDN_BACKEND_CUDA,
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .upload = cuda_copy,
    .download = cuda_copy,
    .upload_staged = cuda_upload_staged,
    .layer_step = cuda_layer_step,
    .commit = cuda_commit,
    .synchronize = cuda_synchronize,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .last_error = cuda_last_error,
    .destroy = cuda_destroy,
};

gdn_status gdn__backend_cuda_create(int32_t device, size_t staging_bytes, gdn__backend *out)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || device < 0 || device >= count) {
        cudaGetLastError(); /* clear the sticky "no device" error for later callers */
        return GDN_ENODEV;
    }
    if (cudaSetDevice(device) != cudaSuccess) return GDN_ENODEV;
    cuda_backend *cu = gdn__calloc(1, sizeof *cu);
    if (!cu) return GDN_ENOMEM;
    cu->device = device;
    cu->staging_bytes = staging_bytes;
    gdn_status status = GDN_OK;
    cudaError_t err = cudaMallocHost((void **)&cu->staging, STAGING_RING * staging_bytes);
    for (int i = 0; err == cudaSuccess && i < STAGING_RING; i++)
        err = cudaEventCreateWithFlags(&cu->staging_done[i], cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&cu->capture_stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) status = err == cudaErrorMemoryAllocation ? GDN_ENOMEM : GDN_ECUDA;
    if (status != GDN_OK) {
        cuda_destroy(cu);
        return status;
    }
    out->iface = &cuda_iface;
    out->ctx = cu;
    return GDN_OK;
}
