/*
 * The layer-step kernel's mixer instances (SPEC 6: the causal conv with its window, the recurrence and
 * the gated RMSNorm in one kernel; gdn_cuda_layer_kernel.cuh with MIXER, gdn_cuda_mixer.cuh), in
 * their own translation unit so that the two families compile side by side. K = 128 only (both
 * Qwen3-Next and Qwen3.5); other head sizes are GDN_ENOTSUP with a mixer.
 */
#include "gdn_cuda_layer_kernel.cuh"

template <int K, typename S, typename I, typename O>
static gdn_status launch_mixer(const gdn__layer_params *p, cudaStream_t stream)
{
    return launch_strategy<K, S, I, O, true>(p, stream);
}

extern "C" gdn_status gdn__cuda_mixer_step(const gdn__layer_params *p, void *stream_ptr, int run)
{
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    GDN__MIXER_DISPATCH(launch_mixer)
}
GDN__PHASE_TRACE_DUMPER(mixer)
