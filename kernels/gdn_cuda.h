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

/* One layer step (decode in place, or verify into the cache). GDN_ENOTSUP, GDN_EINVAL or GDN_ECUDA. */
gdn_status gdn__cuda_layer_step(const gdn__layer_params *p, void *stream);

/* Commit of a verify step for all layers in one launch. */
gdn_status gdn__cuda_commit(const gdn__commit_params *p, void *stream);

/* The step-row mailbox (kernels/gdn_cuda_fetch.cu): copies ring entry (*device_seq % ring_entries)
 * into dst, then advances *device_seq and publishes it to *host_done. */
typedef struct gdn__fetch_params {
    const int32_t *ring;    /* mapped pinned host memory [ring_entries][entry_stride] */
    int32_t ring_entries;
    int32_t entry_stride;   /* int32 values per entry, header included */
    long long *device_seq;  /* device memory: entries consumed so far */
    long long *host_done;   /* mapped pinned host memory: the same count, for the host */
    int32_t *dst;           /* device memory, >= entry_stride - 1 values */
} gdn__fetch_params;

gdn_status gdn__cuda_fetch_rows(const gdn__fetch_params *p, void *stream);

/* Replay strategy: before the fetch of the same entry, zeroes
 * pending[l * num_slots + s] for every layer l and every clear s staged after the entry's rows
 * ([1 + count] = number of clears, then the slots). Uses ring, ring_entries, entry_stride and
 * device_seq of p (reads the entry the next fetch will consume; advances nothing). */
gdn_status gdn__cuda_clear_pending(const gdn__fetch_params *p, int32_t *pending, int32_t num_layers, int64_t num_slots,
                                   void *stream);

#ifdef __cplusplus
}
#endif

#endif /* GDN_CUDA_H_INTERNAL */
