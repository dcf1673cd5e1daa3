/*
 * Launchers of the CUDA kernel families (kernels/gdn_cuda_layer.cu, kernels/gdn_cuda_commit.cu).
 * Plain C: `stream` is a cudaStream_t passed as void * so that host C files need no CUDA headers.
 * Each launcher checks the shape, enqueues one kernel on the stream, never synchronises, and turns
 * cudaGetLastError() into a status.
 */
#ifndef GDN_CUDA_H_INTERNAL
#define GDN_CUDA_H_INTERNAL

#include "gdn_kernel_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GDN_OK when gdn__cuda_layer_step runs this shape (K, V in {64, 128, 256}, dtypes, T range). */
gdn_status gdn__cuda_layer_step_supported(const gdn__layer_params *p);

/* One layer step (decode in place, or verify into the cache). GDN_ENOTSUP, GDN_EINVAL or GDN_ECUDA. */
gdn_status gdn__cuda_layer_step(const gdn__layer_params *p, void *stream);

/* Commit of a verify step for all layers in one launch. */
gdn_status gdn__cuda_commit(const gdn__commit_params *p, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* GDN_CUDA_H_INTERNAL */
