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
    if ((unsigned)p->state_dtype > 3u || (unsigned)p->input_dtype > 3u || (unsigned)p->output_dtype > 3u)
        return GDN_ENOTSUP;
    switch (GDN__LAYER_KEY(p->K, (int)p->state_dtype, (int)p->input_dtype, (int)p->output_dtype)) {
        GDN__LAYER_CASES_K(launch_mixer, 128)
    default: return GDN_ENOTSUP;
    }
}
