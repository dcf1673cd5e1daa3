/*
 * The backend interface: what the engine needs from a place that holds state and runs the math.
 * Two implementations: backend_cpu.c (the float64 reference, host memory) and backend_cuda.c (the
 * CUDA kernels, device memory). The engine (engine.c) owns all policy; backends only move bytes and
 * run kernels. `stream` is a cudaStream_t on CUDA and ignored on CPU.
 */
#ifndef GDN_ENGINE_BACKEND_IMPL_H
#define GDN_ENGINE_BACKEND_IMPL_H

#include "gdn/gdn.h"
#include "kernels/gdn_kernel_params.h"

typedef struct gdn__backend_iface {
    gdn_backend_kind kind;
    const char *name;

    /* Backend memory, zero-filled. GDN_ENOMEM on failure. */
    gdn_status (*alloc)(void *ctx, size_t bytes, void **out);
    /* NULL is a no-op. */
    void (*free)(void *ctx, void *ptr);
    /* Enqueues a zero fill of backend memory. */
    gdn_status (*zero)(void *ctx, void *ptr, size_t bytes, void *stream);
    /* Enqueue copies between caller host memory and backend memory (host memory must live until
     * the stream reaches the copy). */
    gdn_status (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes, void *stream);
    gdn_status (*download)(void *ctx, void *host_dst, const void *src, size_t bytes, void *stream);
    /* A step's rows travel in three moves, so that a replayed graph needs no copy call of its own:
     * stage_rows copies `count` values (at most the staging size given at creation) and the slots
     * freed since the last step from transient host memory into the backend's staging, with no CUDA
     * call (it waits only while the device is a whole staging ring behind); fetch_rows enqueues, or
     * inside a capture records, the step's first work: the copy of the staged rows into `dst` and,
     * when `pending` is not NULL (fold, ring), pending[l * counts_layer_stride + s] = 0 for every
     * layer l and every staged clear s (so that the next request in a freed slot does not fold the previous
     * one's tokens); consume_rows tells the backend that work holding a fetch of the staged rows was
     * launched, so the next stage_rows takes a new entry. With `overlap` the fetch may launch before
     * the preceding kernel ends (it waits for it before any access). With `carry` (the same for a
     * step's stage_rows and fetch_rows) the launch may carry the staged rows in its parameters (a
     * graph's launches then set them, graph_launch), so that the device need not read them from host
     * memory; without, the device reads them from the staging (a caller's graph, which the engine
     * does not launch). */
    gdn_status (*stage_rows)(void *ctx, const int32_t *rows, int32_t count, const int32_t *clears, int32_t n_clears,
                             int carry);
    gdn_status (*fetch_rows)(void *ctx, int32_t *dst, int32_t *pending, int32_t num_layers,
                             int64_t counts_layer_stride, int overlap, int carry, void *stream);
    void (*consume_rows)(void *ctx);
    /* Enqueue the kernels (kernels/gdn_kernel_params.h gives the semantics). */
    gdn_status (*layer_step)(void *ctx, const gdn__layer_params *params, void *stream);
    gdn_status (*commit)(void *ctx, const gdn__commit_params *params, void *stream);
    gdn_status (*slot_copy)(void *ctx, const gdn__slot_copy_params *params, void *stream);
    /* Waits for the stream (NULL: for all work on the backend's device). */
    gdn_status (*synchronize)(void *ctx, void *stream);
    /* The backend's private stream (NULL on CPU): the engine's synchronous calls (admission, reads,
     * parameters) run there, so that none touches the legacy default stream or waits for another
     * stream's unrelated work. order_after makes it wait for the work enqueued so far on `stream`. */
    void *(*own_stream)(void *ctx);
    gdn_status (*order_after)(void *ctx, void *stream);
    /* (optional) Step graphs; NULL on backends without them, which then always launch directly.
     * capture_begin hands out the stream to enqueue the captured work on; capture_end stops the
     * capture and, when keep is nonzero, instantiates it into *graph (else discards it). */
    gdn_status (*capture_begin)(void *ctx, void **capture_stream);
    gdn_status (*capture_end)(void *ctx, int keep, void **graph);
    gdn_status (*graph_launch)(void *ctx, void *graph, void *stream);
    void (*graph_destroy)(void *ctx, void *graph);
    /* (optional) Nonzero when `stream` is being captured into a graph that the engine is not
     * capturing itself (NULL on backends without graphs). */
    int (*stream_capturing)(void *ctx, void *stream);
    /* The last runtime error as text, "" if none. */
    const char *(*last_error)(const void *ctx);
    /* Frees the context (all backend memory must already be freed). */
    void (*destroy)(void *ctx);
} gdn__backend_iface;

typedef struct gdn__backend {
    const gdn__backend_iface *iface;
    void *ctx;
} gdn__backend;

/* Creates the CPU backend. staging_bytes: the largest upload_staged. */
gdn_status gdn__backend_cpu_create(size_t staging_bytes, gdn__backend *out);
/* The same with extra_scratch bytes of the reference's scratch past gdn__ref_scratch_bytes() (the
 * mixer's conv: gdn__ref_mixer_scratch_bytes). */
gdn_status gdn__backend_cpu_create_scratch(size_t staging_bytes, size_t extra_scratch, gdn__backend *out);

/* Device allocations the CUDA backend has made so far (all engines; tests difference two readings). */
uint64_t gdn__cuda_device_allocations(void);
/* Device allocations of the library not freed yet (all engines). */
int64_t gdn__cuda_live_allocations(void);
/* Fault injection for tests: the n-th next device allocation (GDN_ENOMEM) or graph capture
 * (GDN_ECUDA) fails; -1 turns it off. CUDA builds only. */
void gdn__cuda_fail_alloc_after(int64_t n);
void gdn__cuda_fail_capture_after(int64_t n);

/* Creates the CUDA backend on `device`: GDN_ENODEV when this build has no CUDA or no GPU is usable. */
gdn_status gdn__backend_cuda_create(int32_t device, size_t staging_bytes, gdn__backend *out);

#endif /* GDN_ENGINE_BACKEND_IMPL_H */
