/*
 * The GDN layer-step kernels without the mixer (the kernel template and its launchers:
 * gdn_cuda_layer_kernel.cuh; the mixer's instances: gdn_cuda_mixer.cu), the shape checks and the
 * entry point of every layer-step strategy.
 */
#include "gdn_cuda_layer_kernel.cuh"

template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    return launch_strategy<K, S, I, O, false>(p, stream);
}

/* ---------------------------------------------------------------------------------------------- */
/* Dispatch: runtime values to template instances                                                   */
/* ---------------------------------------------------------------------------------------------- */

static gdn_status dispatch(const gdn__layer_params *p, cudaStream_t stream, bool run)
{
    if (gdn__mixer_on(&p->mixer)) return gdn__cuda_mixer_step(p, stream, run);
    GDN__LAYER_DISPATCH(launch)
}

/* True when every stride of `s` is a multiple of `elements` (keeps the alignment of the data pointer). */
static bool strides_keep(gdn__strides s, int64_t elements)
{
    return s.row % elements == 0 && s.token % elements == 0 && s.head % elements == 0;
}

/* The mixer's own checks (SPEC 6; the fused kernels: the layer kernel's mixer instances, the ring's). */
static gdn_status check_mixer(const gdn__layer_params *p)
{
    const gdn__mixer_params *m = &p->mixer;
    if (!m->arrivals || (m->norm_weight && p->T > 0 && (!m->norm_scratch || !m->z))) return GDN_EINVAL;
    if (m->conv_width == 0) return GDN_OK;
    if (m->conv_width < 2 || m->conv_width > GDN__MAX_CONV_WIDTH) return GDN_ENOTSUP;
    if (m->conv_dim != 2 * p->HK * p->K + p->HV * p->V || !m->conv_weight || !m->conv_state) return GDN_EINVAL;
    if (m->conv_weight_dtype != GDN_DTYPE_F32 && m->conv_weight_dtype != GDN_DTYPE_BF16) return GDN_ENOTSUP;
    if (!gdn__aligned(m->conv_weight, 4) || !gdn__aligned(m->conv_bias, 4)) return GDN_ENOTSUP; /* 4-byte copies */
    if (p->cache && !m->x_store) return GDN_EINVAL; /* the commit's window needs the verify's x */
    if (p->T > 0 && (!m->x || !gdn__aligned(m->x, 16) || m->x_strides.row % 8 != 0 || m->x_strides.token % 8 != 0))
        return !m->x ? GDN_EINVAL : GDN_ENOTSUP; /* x's rows in 16-byte pieces */
    return GDN_OK;
}

/* The mixer's dense defaults: a window with both strides 0 is [W - 1][conv_dim], an x with row and
 * token strides 0 is [B, T, conv_dim], a z with all strides 0 is [B, T, HV, V]. */
static void resolve_mixer(gdn__layer_params *p)
{
    gdn__mixer_params *m = &p->mixer;
    gdn__conv_window_strides(m->conv_token_stride, m->conv_channel_stride, m->conv_dim, &m->conv_token_stride,
                             &m->conv_channel_stride);
    if (m->x_strides.row == 0 && m->x_strides.token == 0) m->x_strides = gdn__dense(p->T, 1, m->conv_dim);
    m->z_strides = gdn__strides_or_dense(m->z_strides, p->T, p->HV, p->V);
}

/* A ring decode that writes every row back (ring length 1: the op layer's write-through rule) runs in
 * the layer kernel: the cache strategy's decode, which applies the row's records first, or with the
 * mixer's conv the fold strategy's, whose stored tokens are the records (gdn_cuda_layer_kernel.cuh).
 * With a mixer but no conv (records as the plain ring keeps them, beside the norm) the ring kernel
 * runs it. */
static bool ring_writes_through(const gdn__layer_params *p)
{
    return p->ring && p->ring_length == 1 && p->T == 1 && !p->deferred_verify && !p->token_counts && !p->parents &&
           (!gdn__mixer_on(&p->mixer) || p->mixer.conv_width > 0);
}

/* Shape and alignment checks shared by both entry points (GDN_ENOTSUP for what no instance runs). */
static gdn_status check_shape(const gdn__layer_params *p)
{
    if (gdn__mixer_on(&p->mixer)) {
        const gdn_status mixer = check_mixer(p);
        if (mixer != GDN_OK) return mixer;
    }
    if (p->T < (p->token_store || p->ring ? 0 : 1) || p->T > GDN_MAX_TOKENS || p->B < 0 || p->B > 65535)
        return GDN_ENOTSUP;
    if (p->ring && (p->cache || p->token_store || !p->ring_count || !p->arrivals || p->ring_length < 1))
        return GDN_EINVAL;
    if (p->ring && (p->ring_capacity < 1 || p->ring_capacity > GDN_MAX_RING_LENGTH || p->ring_capacity < p->T))
        return GDN_ENOTSUP;
    if (p->ring && (!gdn__aligned(p->ring, 16) || !gdn__aligned(p->v, 4) || !gdn__aligned(p->a, 2))) return GDN_ENOTSUP;
    if (p->token_store && (p->cache || !p->pending || !p->arrivals || p->store_tokens < 1))
        return GDN_EINVAL;
    if (p->token_store && p->store_tokens > GDN_MAX_TOKENS) return GDN_ENOTSUP; /* a warp's worth of tokens */
    if (p->V != 64 && p->V != 128 && p->V != 256) return GDN_ENOTSUP;
    if (p->HK < 1 || p->HV < 1 || p->HV % p->HK != 0) return GDN_ENOTSUP;
    if ((int64_t)p->HV * p->V > 65536 * 16) return GDN_ENOTSUP; /* grid x stays far below its limit */
    const int64_t elem = p->state_dtype == GDN_DTYPE_F32 ? 4 : 2;
    /* 16-byte vector accesses: the pool, its slots and the cache rows must stay 16-byte aligned. */
    if (!gdn__aligned(p->state, 16) || (p->slot_stride * elem) % 16 != 0) return GDN_ENOTSUP;
    if (p->cache && (!gdn__aligned(p->cache, 16) || (p->cache_row_stride * elem) % 16 != 0)) return GDN_ENOTSUP;
    if (!gdn__aligned(p->q, 16) || !gdn__aligned(p->k, 16) || !strides_keep(p->q_strides, 8) ||
        !strides_keep(p->k_strides, 8))
        return GDN_ENOTSUP;
    if ((p->token_store || p->ring) && !strides_keep(p->v_strides, 2)) return GDN_ENOTSUP; /* v in 4-byte pairs */
    if (p->token_store && (!gdn__aligned(p->token_store, 16) || !gdn__aligned(p->v, 4))) return GDN_ENOTSUP; /* cp.async */
    return p->ring && !ring_writes_through(p) ? gdn__cuda_ring_step_supported(p) : dispatch(p, nullptr, false);
}

extern "C" gdn_status gdn__cuda_layer_step(const gdn__layer_params *params, void *stream)
{
    if (!params) return GDN_EINVAL;
    gdn__layer_params resolved = gdn__layer_params_resolved(params);
    resolve_mixer(&resolved);
    const gdn__layer_params *p = &resolved;
    const gdn_status shape = check_shape(p);
    if (shape != GDN_OK) return shape;
    if (p->B == 0) return GDN_OK;
    const bool qkv_read = p->mixer.conv_width == 0; /* with the conv, x instead */
    if ((qkv_read && (!p->q || !p->k || !p->v)) || !p->a || !p->b || !p->A_log || !p->dt_bias || !p->state || !p->out ||
        !p->read_slots || p->slot_stride < (int64_t)p->HV * p->V * p->K || p->num_slots < 0)
        return GDN_EINVAL;
    if (p->cache && p->cache_row_stride < (int64_t)p->T * p->HV * p->V * p->K) return GDN_EINVAL;
    if (p->ring && !ring_writes_through(p)) return gdn__cuda_ring_step(p, stream);
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}
GDN__PHASE_TRACE_DUMPER(layer)
