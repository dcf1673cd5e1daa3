/*
 * The CUDA backend: backend memory is device memory, work is enqueued on the caller's stream, and
 * the math is the kernels of kernels/gdn_cuda_*.cu. Each step's rows go through a mailbox: a ring in
 * mapped pinned host memory that the step's first kernel reads (kernels/gdn_cuda_fetch.cu), so a
 * step costs the host one graph launch and no copy call; the host waits only if the GPU is a whole
 * ring of steps behind.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "alloc.h"
#include "backend_impl.h"
#include "graphs/graph_cuda.h"
#include "kernels/gdn_cuda.h"

#define ROW_RING_ENTRIES 64

/* The backend's graph handle: the instance, the captured graph it came from, and the fetch node
 * whose entry each launch sets (NULL: the graph has none, or a caller's fetch that reads the ring). */
typedef struct cuda_graph {
    cudaGraphExec_t exec;
    cudaGraph_t graph;
    void *fetch_node;
    gdn__fetch_params fetch;
} cuda_graph;

typedef struct cuda_backend {
    int device;
    /* Step-row mailbox (kernels/gdn_cuda_fetch.cu): a ring in mapped pinned host memory. */
    int32_t *ring;              /* [ROW_RING_ENTRIES][entry_stride] */
    int32_t entry_stride;       /* int32 values per entry: count, then the rows */
    volatile long long *done;   /* mapped pinned: entries the device has consumed */
    long long *device_seq;      /* device memory: the same count, for the fetch kernel */
    long long host_seq;         /* entries handed to the device (staged and consumed) */
    /* The staged entry, for launches that carry it (kernels/gdn_cuda_fetch.cu); length 0: it is in the
     * ring (a caller's graph reads it there, or it is too long to carry). */
    int32_t staged[GDN__FETCH_INLINE_MAX];
    int32_t staged_length;
    /* The fetch recorded in the capture under way, carrying its entry: the graph's launches set it. */
    gdn__fetch_params captured_fetch;
    int captured_fetch_inline;
    cudaStream_t capture_stream; /* private: graphs are captured here, replayed on the caller's */
    cudaStream_t own_stream;     /* private: the engine's synchronous calls and zero fills */
    cudaEvent_t order_event;     /* orders own_stream after a caller's stream */
    char last_error[256];
} cuda_backend;

/* Every call that touches the GPU runs on the engine's device and gives the caller's current device
 * back (one thread may drive engines on several GPUs). */
typedef struct device_guard {
    int previous;
    int switched;
} device_guard;

static device_guard enter_device(const void *ctx)
{
    const cuda_backend *cu = ctx;
    device_guard guard = {0, 0};
    if (cudaGetDevice(&guard.previous) == cudaSuccess && guard.previous != cu->device)
        guard.switched = cudaSetDevice(cu->device) == cudaSuccess;
    return guard;
}

static void leave_device(device_guard guard)
{
    if (guard.switched) cudaSetDevice(guard.previous);
}

/* A backend entry point `name` whose body, name##_here, runs with the engine's device current. */
#define GDN__ON_DEVICE(name, params, args)                                                          \
    static gdn_status name params                                                                  \
    {                                                                                              \
        const device_guard guard = enter_device(ctx);                                              \
        const gdn_status result = name##_here args;                                                \
        leave_device(guard);                                                                       \
        return result;                                                                             \
    }
#define GDN__ON_DEVICE_VOID(name, params, args)                                                     \
    static void name params                                                                        \
    {                                                                                              \
        const device_guard guard = enter_device(ctx);                                              \
        name##_here args;                                                                          \
        leave_device(guard);                                                                       \
    }

/* Records the failing call and converts it to GDN_ECUDA (GDN_ENOMEM for allocation failures). */
static gdn_status record_error(cuda_backend *cu, cudaError_t err, const char *expr, int line)
{
    snprintf(cu->last_error, sizeof cu->last_error, "%s: %s (%s:%d)", expr, cudaGetErrorString(err),
             __FILE__, line);
    return err == cudaErrorMemoryAllocation ? GDN_ENOMEM : GDN_ECUDA;
}

/* A launcher's GDN_ECUDA: its CUDA error was consumed where it happened; keep the text it recorded. */
static void record_launch_failure(cuda_backend *cu, const char *launcher)
{
    snprintf(cu->last_error, sizeof cu->last_error, "%s: %s", launcher, gdn__cuda_failure_detail());
}

#define GDN__CUDA_TRY(cu, expr)                                             \
    do {                                                                    \
        cudaError_t gdn__err = (expr);                                      \
        if (gdn__err != cudaSuccess) return record_error((cu), gdn__err, #expr, __LINE__); \
    } while (0)

/* Device allocations made by the library (all engines), for the test that proves steps make none. */
static atomic_uint_fast64_t device_allocations;
static atomic_int_fast64_t live_allocations;

uint64_t gdn__cuda_device_allocations(void) { return atomic_load_explicit(&device_allocations, memory_order_relaxed); }
int64_t gdn__cuda_live_allocations(void) { return atomic_load_explicit(&live_allocations, memory_order_relaxed); }

/* Fault injection (tests): the n-th next device allocation or graph capture fails (-1: none). */
static atomic_int_fast64_t fail_alloc_countdown = -1, fail_capture_countdown = -1;
void gdn__cuda_fail_alloc_after(int64_t n) { atomic_store(&fail_alloc_countdown, n); }
void gdn__cuda_fail_capture_after(int64_t n) { atomic_store(&fail_capture_countdown, n); }
static int injected_failure(atomic_int_fast64_t *countdown)
{
    const int_fast64_t left = atomic_load(countdown);
    if (left < 0) return 0;
    atomic_store(countdown, left - 1);
    return left == 0;
}

static gdn_status cuda_alloc_here(void *ctx, size_t bytes, void **out)
{
    cuda_backend *cu = ctx;
    *out = NULL;
    if (injected_failure(&fail_alloc_countdown))
        return record_error(cu, cudaErrorMemoryAllocation, "cudaMalloc (injected failure)", __LINE__);
    GDN__CUDA_TRY(cu, cudaMalloc(out, bytes ? bytes : 1));
    atomic_fetch_add_explicit(&device_allocations, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&live_allocations, 1, memory_order_relaxed);
    /* On the private stream: the engine waits for it once, when creation is done. */
    cudaError_t err = cudaMemsetAsync(*out, 0, bytes, cu->own_stream);
    if (err != cudaSuccess) {
        cudaFree(*out);
        atomic_fetch_sub_explicit(&live_allocations, 1, memory_order_relaxed);
        *out = NULL;
        return record_error(cu, err, "cudaMemsetAsync(*out, 0, bytes, own_stream)", __LINE__);
    }
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_alloc, (void *ctx, size_t bytes, void **out), (ctx, bytes, out))

static void cuda_free_here(void *ctx, void *ptr)
{
    (void)ctx;
    if (!ptr) return;
    cudaFree(ptr);
    atomic_fetch_sub_explicit(&live_allocations, 1, memory_order_relaxed);
}
GDN__ON_DEVICE_VOID(cuda_free, (void *ctx, void *ptr), (ctx, ptr))

static gdn_status cuda_zero_here(void *ctx, void *ptr, size_t bytes, void *stream)
{
    GDN__CUDA_TRY((cuda_backend *)ctx, cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream));
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_zero, (void *ctx, void *ptr, size_t bytes, void *stream), (ctx, ptr, bytes, stream))

static gdn_status cuda_copy_here(void *ctx, void *dst, const void *src, size_t bytes, void *stream)
{
    GDN__CUDA_TRY((cuda_backend *)ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_copy, (void *ctx, void *dst, const void *src, size_t bytes, void *stream),
               (ctx, dst, src, bytes, stream))

static gdn_status cuda_stage_rows(void *ctx, const int32_t *rows, int32_t count, const int32_t *clears, int32_t n_clears,
                                  int carry)
{
    cuda_backend *cu = ctx;
    if (count < 0 || n_clears < 0 || (int64_t)count + n_clears + 2 > cu->entry_stride) return GDN_EINVAL;
    const int32_t length = count + n_clears + 2;
    cu->staged_length = carry && length <= GDN__FETCH_INLINE_MAX ? length : 0;
    int32_t *entry = cu->staged; /* the launch carries it: the ring is not involved */
    if (!cu->staged_length) {
        /* Back-pressure only: the entry is free once the device consumed the step a ring ago. */
        while (cu->host_seq - *cu->done >= ROW_RING_ENTRIES) sched_yield();
        entry = cu->ring + (size_t)(cu->host_seq % ROW_RING_ENTRIES) * (size_t)cu->entry_stride;
    }
    memcpy(entry + 1, rows, sizeof(int32_t) * (size_t)count);
    entry[1 + count] = n_clears; /* read only by the fold strategy's fetch */
    if (n_clears) memcpy(entry + 2 + count, clears, sizeof(int32_t) * (size_t)n_clears);
    entry[0] = count;
    atomic_thread_fence(memory_order_release); /* a ring entry is complete before any launch that reads it */
    return GDN_OK;
}

/* The staged entry into a fetch's parameters, when it fits. */
static void carry_staged(const cuda_backend *cu, gdn__fetch_params *p)
{
    p->inline_length = cu->staged_length;
    if (cu->staged_length) memcpy(p->inline_entry, cu->staged, sizeof(int32_t) * (size_t)cu->staged_length);
}

static gdn_status cuda_fetch_rows_here(void *ctx, int32_t *dst, int32_t *pending, int32_t num_layers,
                                       int64_t counts_layer_stride, int overlap, int carry, void *stream)
{
    cuda_backend *cu = ctx;
    gdn__fetch_params p = {
        .ring = cu->ring,
        .ring_entries = ROW_RING_ENTRIES,
        .entry_stride = cu->entry_stride,
        .device_seq = cu->device_seq,
        .host_done = (long long *)cu->done,
        .dst = dst,
        .pending = pending,
        .num_layers = num_layers,
        .counts_layer_stride = counts_layer_stride,
        .overlap_preceding = overlap != 0,
    };
    if (carry) carry_staged(cu, &p);
    gdn_status status = gdn__cuda_fetch_rows(&p, stream);
    if (status == GDN_OK && carry && stream == (void *)cu->capture_stream) {
        cu->captured_fetch = p;
        cu->captured_fetch_inline = 1;
    }
    if (status == GDN_ECUDA) record_launch_failure(cu, "gdn__cuda_fetch_rows");
    return status;
}
GDN__ON_DEVICE(cuda_fetch_rows,
               (void *ctx, int32_t *dst, int32_t *pending, int32_t num_layers, int64_t counts_layer_stride, int overlap,
                int carry, void *stream),
               (ctx, dst, pending, num_layers, counts_layer_stride, overlap, carry, stream))

static void cuda_consume_rows(void *ctx)
{
    cuda_backend *cu = ctx;
    if (!cu->staged_length) cu->host_seq++; /* an entry the launch carried took no ring slot */
}

static gdn_status cuda_layer_step_here(void *ctx, const gdn__layer_params *params, void *stream)
{
    gdn_status status = gdn__cuda_layer_step(params, stream);
    if (status == GDN_ECUDA) record_launch_failure(ctx, "gdn__cuda_layer_step");
    return status;
}
GDN__ON_DEVICE(cuda_layer_step, (void *ctx, const gdn__layer_params *params, void *stream), (ctx, params, stream))

static gdn_status cuda_commit_here(void *ctx, const gdn__commit_params *params, void *stream)
{
    gdn_status status = gdn__cuda_commit(params, stream);
    if (status == GDN_ECUDA) record_launch_failure(ctx, "gdn__cuda_commit");
    return status;
}
GDN__ON_DEVICE(cuda_commit, (void *ctx, const gdn__commit_params *params, void *stream), (ctx, params, stream))

static gdn_status cuda_slot_copy_here(void *ctx, const gdn__slot_copy_params *params, void *stream)
{
    gdn_status status = gdn__cuda_slot_copy(params, stream);
    if (status == GDN_ECUDA) record_launch_failure(ctx, "gdn__cuda_slot_copy");
    return status;
}
GDN__ON_DEVICE(cuda_slot_copy, (void *ctx, const gdn__slot_copy_params *params, void *stream),
               (ctx, params, stream))

static gdn_status cuda_synchronize_here(void *ctx, void *stream)
{
    if (stream) GDN__CUDA_TRY((cuda_backend *)ctx, cudaStreamSynchronize((cudaStream_t)stream));
    else GDN__CUDA_TRY((cuda_backend *)ctx, cudaDeviceSynchronize());
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_synchronize, (void *ctx, void *stream), (ctx, stream))

static void *cuda_own_stream(void *ctx) { return ((cuda_backend *)ctx)->own_stream; }

static gdn_status cuda_order_after_here(void *ctx, void *stream)
{
    cuda_backend *cu = ctx;
    if ((cudaStream_t)stream == cu->own_stream) return GDN_OK;
    GDN__CUDA_TRY(cu, cudaEventRecord(cu->order_event, (cudaStream_t)stream));
    GDN__CUDA_TRY(cu, cudaStreamWaitEvent(cu->own_stream, cu->order_event, 0));
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_order_after, (void *ctx, void *stream), (ctx, stream))

static gdn_status cuda_capture_begin_here(void *ctx, void **capture_stream)
{
    cuda_backend *cu = ctx;
    GDN__CUDA_TRY(cu, gdn__graph_capture_begin(cu->capture_stream));
    cu->captured_fetch_inline = 0;
    *capture_stream = cu->capture_stream;
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_capture_begin, (void *ctx, void **capture_stream), (ctx, capture_stream))

static gdn_status cuda_capture_end_here(void *ctx, int keep, void **graph)
{
    cuda_backend *cu = ctx;
    cudaGraphExec_t exec = NULL;
    cudaGraph_t captured = NULL;
    *graph = NULL;
    const int inject = keep && injected_failure(&fail_capture_countdown);
    cudaError_t err = gdn__graph_capture_end(cu->capture_stream, keep && !inject, &exec, &captured);
    if (inject && err == cudaSuccess) err = cudaErrorStreamCaptureInvalidated;
    if (err != cudaSuccess) return record_error(cu, err, "gdn__graph_capture_end", __LINE__);
    if (!exec) return GDN_OK;
    cuda_graph *g = gdn__calloc(1, sizeof *g);
    if (!g) {
        gdn__graph_destroy(exec, captured);
        return GDN_ENOMEM;
    }
    g->exec = exec;
    g->graph = captured;
    if (cu->captured_fetch_inline) { /* its replays must be given their rows */
        g->fetch = cu->captured_fetch;
        g->fetch_node = gdn__cuda_fetch_node(captured);
        if (!g->fetch_node) {
            gdn__graph_destroy(exec, captured);
            gdn__free(g);
            snprintf(cu->last_error, sizeof cu->last_error, "gdn__cuda_fetch_node: the capture has no fetch node");
            return GDN_ECUDA;
        }
    }
    *graph = g;
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_capture_end, (void *ctx, int keep, void **graph), (ctx, keep, graph))

static gdn_status cuda_graph_launch_here(void *ctx, void *graph, void *stream)
{
    cuda_backend *cu = ctx;
    cuda_graph *g = graph;
    /* The staged entry (or the ring) for this launch, unless the node holds it already (a decode of
     * the same rows as the graph's last launch: the update costs more host time than the launch). */
    if (g->fetch_node && (cu->staged_length != g->fetch.inline_length ||
                          memcmp(cu->staged, g->fetch.inline_entry, sizeof(int32_t) * (size_t)cu->staged_length) != 0)) {
        gdn__fetch_params next = g->fetch;
        carry_staged(cu, &next);
        gdn_status status = gdn__cuda_fetch_rows_update(g->exec, g->fetch_node, &next);
        if (status == GDN_ECUDA) record_launch_failure(cu, "gdn__cuda_fetch_rows_update");
        if (status != GDN_OK) return status;
        g->fetch = next;
    }
    GDN__CUDA_TRY(cu, gdn__graph_launch(g->exec, (cudaStream_t)stream));
    return GDN_OK;
}
GDN__ON_DEVICE(cuda_graph_launch, (void *ctx, void *graph, void *stream), (ctx, graph, stream))

static void cuda_graph_destroy_here(void *ctx, void *graph)
{
    (void)ctx;
    cuda_graph *g = graph;
    if (!g) return;
    gdn__graph_destroy(g->exec, g->graph);
    gdn__free(g);
}
GDN__ON_DEVICE_VOID(cuda_graph_destroy, (void *ctx, void *graph), (ctx, graph))

static const char *cuda_last_error(const void *ctx) { return ((const cuda_backend *)ctx)->last_error; }

static void cuda_destroy(void *ctx)
{
    cuda_backend *cu = ctx;
    if (!cu) return;
    const device_guard guard = enter_device(cu);
    if (cu->ring) cudaFreeHost(cu->ring);
    if (cu->device_seq) cudaFree(cu->device_seq);
    if (cu->capture_stream) cudaStreamDestroy(cu->capture_stream);
    if (cu->own_stream) cudaStreamDestroy(cu->own_stream);
    if (cu->order_event) cudaEventDestroy(cu->order_event);
    leave_device(guard);
    gdn__free(cu);
}

static int cuda_stream_capturing(void *ctx, void *stream)
{
    (void)ctx;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &status) != cudaSuccess) {
        cudaGetLastError(); /* an invalidated capture reports an error here: it is still not ours */
        return 1;
    }
    return status != cudaStreamCaptureStatusNone;
}

static const gdn__backend_iface cuda_iface = {
    .kind = GDN_BACKEND_CUDA,
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .upload = cuda_copy,
    .download = cuda_copy,
    .stage_rows = cuda_stage_rows,
    .fetch_rows = cuda_fetch_rows,
    .consume_rows = cuda_consume_rows,
    .layer_step = cuda_layer_step,
    .commit = cuda_commit,
    .slot_copy = cuda_slot_copy,
    .stream_capturing = cuda_stream_capturing,
    .synchronize = cuda_synchronize,
    .own_stream = cuda_own_stream,
    .order_after = cuda_order_after,
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
    cuda_backend *cu = gdn__calloc(1, sizeof *cu);
    if (!cu) return GDN_ENOMEM;
    cu->device = device;
    const device_guard guard = enter_device(cu); /* the caller's current device comes back below */
    /* Entries of 16-byte multiples: the count, the rows, padding. */
    cu->entry_stride = (int32_t)((staging_bytes / sizeof(int32_t) + 2 + 3) & ~(size_t)3);
    gdn_status status = GDN_OK;
    const size_t ring_bytes = (size_t)ROW_RING_ENTRIES * (size_t)cu->entry_stride * sizeof(int32_t);
    void *block = NULL;
    /* One mapped pinned block: the ring, then the consumed counter (device-visible under UVA). */
    cudaError_t err = cudaHostAlloc(&block, ring_bytes + 64, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess) {
        memset(block, 0, ring_bytes + 64);
        cu->ring = block;
        cu->done = (volatile long long *)((char *)block + ring_bytes);
        err = cudaMalloc((void **)&cu->device_seq, sizeof(long long));
    }
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&cu->capture_stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&cu->own_stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&cu->order_event, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaMemsetAsync(cu->device_seq, 0, sizeof(long long), cu->own_stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(cu->own_stream);
    if (err != cudaSuccess) status = err == cudaErrorMemoryAllocation ? GDN_ENOMEM : GDN_ECUDA;
    if (status != GDN_OK) {
        cuda_destroy(cu);
        leave_device(guard);
        return status;
    }
    leave_device(guard);
    out->iface = &cuda_iface;
    out->ctx = cu;
    return GDN_OK;
}
