// The step's rows: the first kernel of every CUDA step (inside its graph, or launched before a direct
// step). It copies the step's padded read and write slots (its "entry") into the engine's device row
// buffer, applies the entry's pending-count clears (fold strategy), advances the device's sequence
// number and publishes it to the host.
//
// Entry layout (int32): [0] = count of row values (2 * bucket read and write slots, then the step's
// counts and parents when it has them), [1 .. count] = the values, [1 + count] = number of clears,
// then the cleared slots.
//
// The entry travels in the launch's own parameters when it fits (inline_length > 0): a direct launch
// carries it, and the engine sets it in its graph's fetch node before a replay whose entry differs
// from the last one set. The kernel then reads nothing but its parameters: a read of host memory is a
// PCIe round trip on the critical path of every step. A graph the caller captured and replays on its
// own cannot be given new parameters; there, and for entries too long to carry, the host writes the
// entry into the next slot of a ring in mapped pinned host memory (no CUDA call) and the kernel reads
// the entry the device is due to consume, which the device's sequence number names (only ring entries
// advance it). The host reuses a ring slot only after the device published that it consumed it.
//
// Ring reads do not wait for the device's sequence number to learn which entry is due: the kernel
// reads the first FETCH_PEEK values of every entry (the due one was written before the launch; the
// others may be mid-write and are not used), then picks the due one; the due entry's next values, up
// to FETCH_HEAD, are read once the sequence number is known, in the same host round trip. Only
// entries longer than that read their rest in a second one.
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "gdn_cuda.h"

constexpr int FETCH_THREADS = 256, FETCH_PEEK = 32, FETCH_RING_MAX = 64, FETCH_HEAD = 1024;
constexpr int FETCH_PEEK_BATCH = FETCH_PEEK * FETCH_RING_MAX / FETCH_THREADS;
constexpr int FETCH_HEAD_BATCH = (FETCH_HEAD - FETCH_PEEK + FETCH_THREADS - 1) / FETCH_THREADS;

// The entry's rows into dst and its clears into pending; `at(i)` reads value i of the entry.
template <typename At> __device__ void apply_entry(const gdn__fetch_params &p, int32_t length, At at)
{
    const int32_t count = min(at(0), length - 1);
    for (int32_t i = threadIdx.x; i < count; i += FETCH_THREADS) p.dst[i] = at(1 + i);
    if (p.pending) {
        const int32_t clears = count + 2 <= length ? min(at(1 + count), length - 2 - count) : 0;
        for (int64_t j = threadIdx.x; j < (int64_t)clears * p.num_layers; j += FETCH_THREADS)
            p.pending[(j % p.num_layers) * p.counts_layer_stride + at(2 + count + j / p.num_layers)] = 0;
    }
}

__global__ void __launch_bounds__(FETCH_THREADS) gdn_fetch_rows_kernel(gdn__fetch_params p)
{
    __shared__ int32_t peeked[FETCH_RING_MAX * FETCH_PEEK], head[FETCH_HEAD];
    if (p.overlap_preceding) gdn__wait_preceding(); /* the previous step's kernels may still read the row buffer */
    gdn__allow_dependents();
    if (p.inline_length > 0) {
        apply_entry(p, min(p.inline_length, GDN__FETCH_INLINE_MAX), [&](int64_t i) { return p.inline_entry[i]; });
        return;
    }
    const int32_t peek = min(p.entry_stride, FETCH_PEEK);
    int32_t peek_values[FETCH_PEEK_BATCH];
#pragma unroll
    for (int j = 0; j < FETCH_PEEK_BATCH; ++j) { // all loads in flight before the first store
        const int32_t i = j * FETCH_THREADS + (int32_t)threadIdx.x, e = i / FETCH_PEEK, k = i % FETCH_PEEK;
        if (e < p.ring_entries && k < peek) peek_values[j] = ((const volatile int32_t *)p.ring)[(size_t)e * p.entry_stride + k];
    }
    // The due entry's values past the peek go out as soon as the device's sequence number is back (a
    // device read), beside the peek: a long entry costs one host round trip too.
    const long long seq = *p.device_seq;
    const int64_t due = seq % p.ring_entries;
    const volatile int32_t *entry = p.ring + (size_t)due * (size_t)p.entry_stride;
    const int32_t head_length = min(p.entry_stride, FETCH_HEAD);
    int32_t head_values[FETCH_HEAD_BATCH];
#pragma unroll
    for (int j = 0; j < FETCH_HEAD_BATCH; ++j) {
        const int32_t i = FETCH_PEEK + j * FETCH_THREADS + (int32_t)threadIdx.x;
        if (i < head_length) head_values[j] = entry[i];
    }
#pragma unroll
    for (int j = 0; j < FETCH_PEEK_BATCH; ++j) {
        const int32_t i = j * FETCH_THREADS + (int32_t)threadIdx.x, e = i / FETCH_PEEK, k = i % FETCH_PEEK;
        if (e < p.ring_entries && k < peek) peeked[i] = peek_values[j];
    }
#pragma unroll
    for (int j = 0; j < FETCH_HEAD_BATCH; ++j) {
        const int32_t i = FETCH_PEEK + j * FETCH_THREADS + (int32_t)threadIdx.x;
        if (i < head_length) head[i] = head_values[j];
    }
    __syncthreads();
    const int32_t *due_peek = peeked + due * FETCH_PEEK;
    apply_entry(p, p.entry_stride, [&](int64_t i) { return i < peek ? due_peek[i] : i < head_length ? head[i] : entry[i]; });
    __syncthreads(); // every read of the entry has returned (its values are stored): it may be reused
    if (threadIdx.x == 0) {
        *p.device_seq = seq + 1;
        *(volatile long long *)p.host_done = seq + 1;
    }
}

static bool fetch_params_valid(const gdn__fetch_params *p)
{
    return p && p->ring && p->device_seq && p->host_done && p->dst && p->ring_entries >= 1 &&
           p->ring_entries <= FETCH_RING_MAX && p->entry_stride >= 2 && p->inline_length >= 0 &&
           p->inline_length <= GDN__FETCH_INLINE_MAX && (!p->pending || (p->num_layers >= 1 && p->counts_layer_stride >= 1));
}

extern "C" gdn_status gdn__cuda_fetch_rows(const gdn__fetch_params *p, void *stream)
{
    if (!fetch_params_valid(p)) return GDN_EINVAL;
    GDN__CUDA_TRY(gdn__launch(gdn_fetch_rows_kernel, dim3(1), dim3(FETCH_THREADS), 0, (cudaStream_t)stream,
                              p->overlap_preceding != 0, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

extern "C" void *gdn__cuda_fetch_node(void *graph)
{
    size_t count = 0;
    if (!graph || cudaGraphGetRootNodes((cudaGraph_t)graph, nullptr, &count) != cudaSuccess || count == 0) return nullptr;
    cudaGraphNode_t roots[8];
    if (count > 8) count = 8;
    if (cudaGraphGetRootNodes((cudaGraph_t)graph, roots, &count) != cudaSuccess) return nullptr;
    for (size_t n = 0; n < count; n++) {
        cudaGraphNodeType type;
        cudaKernelNodeParams params;
        if (cudaGraphNodeGetType(roots[n], &type) == cudaSuccess && type == cudaGraphNodeTypeKernel &&
            cudaGraphKernelNodeGetParams(roots[n], &params) == cudaSuccess &&
            params.func == reinterpret_cast<void *>(gdn_fetch_rows_kernel))
            return roots[n];
    }
    return nullptr;
}

extern "C" gdn_status gdn__cuda_fetch_rows_update(void *exec, void *node, const gdn__fetch_params *p)
{
    if (!exec || !node || !fetch_params_valid(p)) return GDN_EINVAL;
    gdn__fetch_params copy = *p;
    void *args[] = {&copy};
    cudaKernelNodeParams params = {};
    params.func = reinterpret_cast<void *>(gdn_fetch_rows_kernel);
    params.gridDim = dim3(1);
    params.blockDim = dim3(FETCH_THREADS);
    params.kernelParams = args;
    GDN__CUDA_TRY(cudaGraphExecKernelNodeSetParams((cudaGraphExec_t)exec, (cudaGraphNode_t)node, &params));
    return GDN_OK;
}

extern "C" const char *gdn__cuda_failure_detail(void) { return gdn__cuda_error_detail(); }

extern "C" void gdn__cuda_fail_next_launch(void) { gdn__cuda_launch_failure_armed() = true; }
