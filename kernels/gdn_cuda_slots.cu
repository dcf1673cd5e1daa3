/*
 * Device-side slot operations (kernels/gdn_kernel_params.h, gdn__slot_copy_params): copies or zero
 * fills of a slot's regions in every layer, in one launch, 16 bytes a thread where the region allows
 * it. Blocks stride over (region, layer) pairs; threads over the bytes.
 */
#include "cuda_common.cuh"
#include "gdn_cuda.h"

__global__ void __launch_bounds__(256) gdn_slot_copy_kernel(const gdn__slot_copy_params p)
{
    if (p.set_at && blockIdx.x == 0 && threadIdx.x == 0) *p.set_at = p.set_value;
    const int pairs = p.regions * p.layers;
    for (int pair = blockIdx.x; pair < pairs; pair += gridDim.x) {
        const gdn__slot_region &g = p.region[pair / p.layers];
        const int64_t l = pair % p.layers;
        char *dst = static_cast<char *>(g.dst) + l * g.dst_layer_stride;
        const char *src = g.src ? static_cast<const char *>(g.src) + l * g.src_layer_stride : nullptr;
        const bool wide = g.bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(src) % 16 == 0; /* (src NULL: aligned) */
        if (wide) {
            for (int64_t i = threadIdx.x; i < g.bytes / 16; i += blockDim.x)
                reinterpret_cast<uint4 *>(dst)[i] = src ? reinterpret_cast<const uint4 *>(src)[i] : make_uint4(0, 0, 0, 0);
        } else {
            for (int64_t i = threadIdx.x; i < g.bytes; i += blockDim.x) dst[i] = src ? src[i] : 0;
        }
    }
}

extern "C" gdn_status gdn__cuda_slot_copy(const gdn__slot_copy_params *p, void *stream)
{
    if (!p || p->regions < 0 || p->regions > GDN__MAX_SLOT_REGIONS || p->layers < 0) return GDN_EINVAL;
    const int pairs = p->regions * p->layers;
    if (pairs == 0 && !p->set_at) return GDN_OK;
    const int blocks = pairs < 1024 ? (pairs > 0 ? pairs : 1) : 1024;
    gdn_slot_copy_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(*p);
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}
