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

/* The ring strategy's layer step (kernels/gdn_cuda_ring.cu), after gdn__cuda_layer_step's checks. */
gdn_status gdn__cuda_ring_step(const gdn__layer_params *p, void *stream);
/* GDN_OK when an instance runs p's (K, state, input, output) combination, else GDN_ENOTSUP. */
gdn_status gdn__cuda_ring_step_supported(const gdn__layer_params *p);
/* The ring decode in two kernels (kernels/gdn_cuda_ring_decode.cu): whether it runs this step (a
 * chain decode with p->ring_prep scratch; GDN_RING_ONE_KERNEL=1 turns it off), and the launch. */
int gdn__cuda_ring_decode_applies(const gdn__layer_params *p);
gdn_status gdn__cuda_ring_decode(const gdn__layer_params *p, void *stream);

/* The mixer's instances of the layer step (kernels/gdn_cuda_mixer.cu), after gdn__cuda_layer_step's
 * checks; run == 0: only whether an instance exists (GDN_OK) or not (GDN_ENOTSUP). */
gdn_status gdn__cuda_mixer_step(const gdn__layer_params *p, void *stream, int run);

/* Commit of a verify step for all layers in one launch. */
gdn_status gdn__cuda_commit(const gdn__commit_params *p, void *stream);

gdn_status gdn__cuda_slot_copy(const gdn__slot_copy_params *p, void *stream);

/* The step's rows (kernels/gdn_cuda_fetch.cu): copies the row values of the step's entry into dst
 * and, when pending is not NULL (fold strategy), zeroes pending[l * counts_layer_stride + s] for
 * every layer l and every slot s the entry lists as a clear. The entry is inline_entry when
 * inline_length > 0 (the launch carries it), else ring entry (*device_seq % ring_entries), after
 * which the kernel advances *device_seq and publishes it to *host_done. */
#define GDN__FETCH_INLINE_MAX 256
typedef struct gdn__fetch_params {
    const int32_t *ring;    /* mapped pinned host memory [ring_entries][entry_stride] */
    int32_t ring_entries;
    int32_t entry_stride;   /* int32 values per entry, header included */
    long long *device_seq;  /* device memory: entries consumed so far */
    long long *host_done;   /* mapped pinned host memory: the same count, for the host */
    int32_t *dst;           /* device memory, >= entry_stride - 1 values */
    int32_t *pending;       /* fold, ring: layer 0's device counts; NULL: no clears */
    int32_t num_layers;
    long long counts_layer_stride; /* int32 elements between layers' counts */
    int32_t overlap_preceding;     /* may launch before the preceding kernel ends (it waits before any access) */
    int32_t inline_length;         /* values of inline_entry in use; 0: the entry is in the ring */
    int32_t inline_entry[GDN__FETCH_INLINE_MAX]; /* an entry in the ring's layout */
} gdn__fetch_params;

gdn_status gdn__cuda_fetch_rows(const gdn__fetch_params *p, void *stream);

/* The fetch's node in a captured graph (cudaGraph_t), or NULL; and a new entry for that node of the
 * graph's instance (cudaGraphExec_t), for its next launches. */
void *gdn__cuda_fetch_node(void *graph);
gdn_status gdn__cuda_fetch_rows_update(void *exec, void *node, const gdn__fetch_params *p);

/* The text of the last CUDA failure a launcher on this thread returned GDN_ECUDA for
 * ("file:line: expr: error string"); the launchers have consumed the error itself. */
const char *gdn__cuda_failure_detail(void);

/* Test hook: the next kernel launch on this thread fails with a real CUDA error. */
void gdn__cuda_fail_next_launch(void);

#ifdef __cplusplus
}
#endif

#endif /* GDN_CUDA_H_INTERNAL */
