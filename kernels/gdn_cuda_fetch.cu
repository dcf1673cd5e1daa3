// Slot-row mailbox fetch: the first kernel of every CUDA step (inside its graph, or launched before a
// direct step). The host writes each step's padded read and write slots into the next entry of a
// ring in mapped pinned host memory (no CUDA call); this kernel copies the entry the device is due
// to consume into the engine's device row buffer, advances the device's sequence number and
// publishes it to the host, which reuses an entry only after the GPU has consumed it. A replayed
// graph thus needs no host-to-device copy and no event of its own: its only host cost is the launch.
//
// Entry layout (int32): [0] = number of values that follow (2 * bucket), [1..] = the values.
#include <cuda_runtime.h>

#include "cuda_common.cuh"
#include "gdn_cuda.h"

__global__ void __launch_bounds__(256) gdn_fetch_rows_kernel(gdn__fetch_params p)
{
    const long long seq = *p.device_seq;
    const volatile int32_t *entry = p.ring + (size_t)(seq % p.ring_entries) * (size_t)p.entry_stride;
    const int32_t count = entry[0];
    for (int32_t i = threadIdx.x; i < count && i < p.entry_stride - 1; i += blockDim.x) p.dst[i] = entry[1 + i];
    __syncthreads();
    if (threadIdx.x == 0) {
        *p.device_seq = seq + 1;
        __threadfence_system();
        *(volatile long long *)p.host_done = seq + 1; // the entry may be reused from now on
    }
}

__global__ void __launch_bounds__(256) gdn_clear_pending_kernel(gdn__fetch_params p, int32_t *pending, int32_t layers,
                                                                 long long num_slots)
{
    const long long seq = *p.device_seq;
    const volatile int32_t *entry = p.ring + (size_t)(seq % p.ring_entries) * (size_t)p.entry_stride;
    const int32_t count = entry[0];
    const int32_t clears = entry[1 + count];
    for (int64_t j = threadIdx.x; j < (int64_t)clears * layers; j += blockDim.x)
        pending[(j % layers) * num_slots + entry[2 + count + j / layers]] = 0;
}

extern "C" gdn_status gdn__cuda_clear_pending(const gdn__fetch_params *p, int32_t *pending, int32_t num_layers,
                                              int64_t num_slots, void *stream)
{
    if (!p || !p->ring || !p->device_seq || !pending || num_layers < 1 || num_slots < 1) return GDN_EINVAL;
    gdn_clear_pending_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(*p, pending, num_layers, (long long)num_slots);
    GDN__CUDA_TRY(cudaGetLastError());
    return GDN_OK;
}

extern "C" gdn_status gdn__cuda_fetch_rows(const gdn__fetch_params *p, void *stream)
{
    if (!p || !p->ring || !p->device_seq || !p->host_done || !p->dst || p->ring_entries < 1 || p->entry_stride < 2)
        return GDN_EINVAL;
    gdn_fetch_rows_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(*p);
    GDN__CUDA_TRY(cudaGetLastError());
    return GDN_OK;
}
