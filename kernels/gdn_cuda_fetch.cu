// Slot-row mailbox fetch: the first kernel of every CUDA step (inside its graph, or launched before a
// direct step). The host writes each step's padded read and write slots into the next entry of a
// ring in mapped pinned host memory (no CUDA call); this kernel copies the entry the device is due
// to consume into the engine's device row buffer, applies the entry's pending-count clears (fold
// strategy), advances the device's sequence number and publishes it to the host, which reuses an
// entry only after the GPU has consumed it. A replayed graph thus needs no host-to-device copy and
// no event of its own: its only host cost is the launch.
//
// Entry layout (int32): [0] = count of row values (2 * bucket read and write slots, then the step's counts and parents when it has them), [1 .. count] = the values,
// [1 + count] = number of clears, then the cleared slots.
//
// Host memory is a PCIe round trip away (several microseconds, on the critical path of every step),
// so the kernel reads the entry's head (count, rows, clears) in one round trip before it knows how
// much of it is used; only longer entries (buckets above 511, or many clears) read more.
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "gdn_cuda.h"

constexpr int FETCH_THREADS = 256, FETCH_BATCH = 4, FETCH_HEAD = FETCH_THREADS * FETCH_BATCH;

__global__ void __launch_bounds__(FETCH_THREADS) gdn_fetch_rows_kernel(gdn__fetch_params p)
{
    __shared__ int32_t head[FETCH_HEAD];
    if (p.overlap_preceding) gdn__wait_preceding(); /* the previous step's kernels may still read the row buffer */
    gdn__allow_dependents();
    const long long seq = *p.device_seq;
    const volatile int32_t *entry = p.ring + (size_t)(seq % p.ring_entries) * (size_t)p.entry_stride;
    const int32_t head_len = min(p.entry_stride, FETCH_HEAD);
    int32_t values[FETCH_BATCH];
#pragma unroll
    for (int j = 0; j < FETCH_BATCH; ++j) { // all loads in flight before the first store
        const int32_t i = j * FETCH_THREADS + (int32_t)threadIdx.x;
        if (i < head_len) values[j] = entry[i];
    }
#pragma unroll
    for (int j = 0; j < FETCH_BATCH; ++j) {
        const int32_t i = j * FETCH_THREADS + (int32_t)threadIdx.x;
        if (i < head_len) head[i] = values[j];
    }
    __syncthreads();
    const auto at = [&](int64_t i) { return i < head_len ? head[i] : entry[i]; };
    const int32_t count = min(head[0], p.entry_stride - 1);
    for (int32_t i = threadIdx.x; i < count; i += FETCH_THREADS) p.dst[i] = at(1 + i);
    if (p.pending) {
        const int32_t clears = count + 2 <= p.entry_stride ? min(at(1 + count), p.entry_stride - 2 - count) : 0;
        for (int64_t j = threadIdx.x; j < (int64_t)clears * p.num_layers; j += FETCH_THREADS)
            p.pending[(j % p.num_layers) * p.counts_layer_stride + at(2 + count + j / p.num_layers)] = 0;
    }
    __syncthreads(); // every read of the entry has returned: it may be reused
    if (threadIdx.x == 0) {
        *p.device_seq = seq + 1;
        __threadfence_system();
        *(volatile long long *)p.host_done = seq + 1;
    }
}

extern "C" gdn_status gdn__cuda_fetch_rows(const gdn__fetch_params *p, void *stream)
{
    if (!p || !p->ring || !p->device_seq || !p->host_done || !p->dst || p->ring_entries < 1 || p->entry_stride < 2 ||
        (p->pending && (p->num_layers < 1 || p->counts_layer_stride < 1)))
        return GDN_EINVAL;
    GDN__CUDA_TRY(gdn__launch(gdn_fetch_rows_kernel, dim3(1), dim3(FETCH_THREADS), 0, (cudaStream_t)stream,
                              p->overlap_preceding != 0, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

extern "C" const char *gdn__cuda_failure_detail(void) { return gdn__cuda_error_detail(); }

extern "C" void gdn__cuda_fail_next_launch(void) { gdn__cuda_launch_failure_armed() = true; }
