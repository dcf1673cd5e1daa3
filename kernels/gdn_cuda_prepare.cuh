/*
 * Token preparation for the layer-step kernel (gdn_cuda_layer.cu): a token's normalised k^ and q^, v of
 * the thread's rows, the gates and k^.q^, either prepared once per CTA in shared memory (two passes:
 * all copies in flight, then normalisation) or by each lane group straight from the inputs.
 */
#ifndef GDN_CUDA_PREPARE_CUH
#define GDN_CUDA_PREPARE_CUH

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_rows.cuh"

/* The largest V: the most rows whose v a fold CTA prepares. */
#define GDN__MAX_HEAD_DIM 256

/* Computed once per CTA before the token loop, in fp32 shared memory: normalised k^ (every token) and
 * q^ (own tokens), v of the CTA's rows, the decay g, beta and k^.q^. Tokens 0..store_tokens-1 are the
 * read slot's stored tokens (fold), then the step's own T tokens. Sized for capacity tokens. With
 * keep_heads > 0 (the fold verify: the value heads of a key head), also, in the input type, the own
 * tokens' raw k as read ([T][K], 16-byte aligned) and the raw a and b of those heads ([2][heads][T]),
 * which the token store gets. */
struct shared_tokens {
    float *khat, *qhat, *v, *gate, *beta, *kq;
    void *raw_k, *raw_gates; /* or nullptr */

    /* Tokens a CTA prepares at most: the read slot's stored tokens (fold; up to store_tokens) and the step's T. */
    static __host__ __device__ int capacity(bool fold, int store_tokens, int T) { return (fold ? store_tokens : 0) + T; }
    static __host__ __device__ size_t prepared_floats(int K, int tile_rows, int capacity, int T)
    {
        return ((size_t)capacity * (K + tile_rows + 2) + (size_t)T * (K + 1) + 3) / 4 * 4;
    }
    static __host__ __device__ size_t floats(int K, int tile_rows, int capacity, int T, int keep_heads)
    {
        return prepared_floats(K, tile_rows, capacity, T) + (keep_heads > 0 ? (size_t)T * (K / 2 + keep_heads) : 0);
    }
    __device__ shared_tokens(float *base, int K, int tile_rows, int capacity, int T, int keep_heads)
    {
        khat = base;
        qhat = khat + (size_t)capacity * K;
        v = qhat + (size_t)T * K;
        gate = v + (size_t)capacity * tile_rows;
        beta = gate + capacity;
        kq = beta + capacity;
        raw_k = keep_heads > 0 ? base + prepared_floats(K, tile_rows, capacity, T) : nullptr;
        raw_gates = keep_heads > 0 ? static_cast<float *>(raw_k) + (size_t)T * K / 2 : nullptr;
    }
    /* A view of k^, q^ and v rows that live elsewhere (the ring kernel's, for the mixer's conv pass). */
    __device__ shared_tokens(float *khat_, float *qhat_, float *v_)
        : khat(khat_), qhat(qhat_), v(v_), gate(nullptr), beta(nullptr), kq(nullptr), raw_k(nullptr), raw_gates(nullptr)
    {
    }
};

/* Token preparation runs in two passes so that every global read of a CTA's tokens is in flight at
 * once (one memory round trip, not one per token; under a saturated memory system each round trip
 * costs microseconds). Pass 1, stage_token: a warp copies token j's raw k, q (own tokens) and v of
 * the CTA's rows into shared memory with cp.async, into the upper half of the fp32 rows they become
 * (inputs are 2 bytes). Pass 2, prepare_token: the same warp normalises them in place. */
template <int K, typename I> __device__ __forceinline__ I *raw_row(float *row) { return reinterpret_cast<I *>(row) + K; }

template <int K, typename I, bool WITH_Q>
__device__ __forceinline__ void stage_token(shared_tokens &s, int j, int t, const I *k, const I *q, const I *v,
                                            int tile_rows, int lane)
{
    static_assert(sizeof(I) == 2, "2-byte inputs");
    constexpr int CHUNKS = K * 2 / 16; /* 16-byte pieces of a k or q row */
    for (int c = lane; c < CHUNKS; c += 32) {
        gdn__copy_async16(raw_row<K, I>(s.khat + (size_t)j * K) + c * 8, k + c * 8);
        if (WITH_Q) gdn__copy_async16(raw_row<K, I>(s.qhat + (size_t)t * K) + c * 8, q + c * 8);
    }
    /* v in 4-byte pairs. tile_rows is a power of two, so odd means one row (K = 256 on small grids,
     * where tile_row0 may be odd too): that element is read directly. */
    I *raw_v = reinterpret_cast<I *>(s.v + (size_t)j * tile_rows) + tile_rows;
    for (int c = lane; c < tile_rows / 2; c += 32) gdn__copy_async4(raw_v + c * 2, v + c * 2);
    if (tile_rows == 1 && lane == 0) raw_v[0] = v[0];
}

/* One token's k (and q) held by a warp, K / 32 values per lane: k^ (and q^, each norm one warp
 * reduction) into its prepared rows, and k^.q^ into s.kq[t]. */
template <int K, bool WITH_Q>
__device__ __forceinline__ void store_normalised(const gdn__layer_params &p, shared_tokens &s, const float (&kx)[K / 32],
                                                 const float (&qx)[K / 32], float *krow, float *qrow, int t, int lane)
{
    constexpr int KPL = K / 32;
    float kk = 0.0f, qq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int e = 0; e < KPL; e++) {
        kk = fmaf(kx[e], kx[e], kk);
        if (WITH_Q) {
            qq = fmaf(qx[e], qx[e], qq);
            kq = fmaf(kx[e], qx[e], kq);
        }
    }
    kk = group_sum<32>(kk);
    if (WITH_Q) {
        qq = group_sum<32>(qq);
        kq = group_sum<32>(kq);
    }
    float rk, rq;
    norm_scales(p, kk, qq, rk, rq);
#pragma unroll
    for (int e = 0; e < KPL; e++) {
        krow[lane * KPL + e] = kx[e] * rk;
        if (WITH_Q) qrow[lane * KPL + e] = qx[e] * rq;
    }
    if (WITH_Q && lane == 0) s.kq[t] = kq * rk * rq;
}

/* Pass 2 for token j (its copies waited for and visible to the warp): k^, q^, v in fp32, k^.q^.
 * Every lane reads its raw values before any lane overwrites them. */
template <int K, typename I, bool WITH_Q>
__device__ __forceinline__ void prepare_token(const gdn__layer_params &p, shared_tokens &s, int j, int t, int tile_rows,
                                              int lane)
{
    constexpr int KPL = K / 32; /* elements of k and q per lane */
    float *krow = s.khat + (size_t)j * K, *qrow = s.qhat + (size_t)t * K, *vrow = s.v + (size_t)j * tile_rows;
    float kx[KPL], qx[KPL];
#pragma unroll
    for (int e = 0; e < KPL; e++) {
        kx[e] = gdn__to_f32(raw_row<K, I>(krow)[lane * KPL + e]);
        if (WITH_Q) qx[e] = gdn__to_f32(raw_row<K, I>(qrow)[lane * KPL + e]);
    }
    constexpr int VPL = GDN__MAX_HEAD_DIM / 32; /* rows of v per lane, at most */
    float vx[VPL];
    const I *raw_v = reinterpret_cast<const I *>(vrow) + tile_rows;
#pragma unroll
    for (int c = 0; c < VPL; c++)
        if (lane + c * 32 < tile_rows) vx[c] = gdn__to_f32(raw_v[lane + c * 32]);
    __syncwarp();
    if (WITH_Q && s.raw_k) /* an own token's k as read (exact: I to fp32 and back) */
#pragma unroll
        for (int e = 0; e < KPL; e++) static_cast<I *>(s.raw_k)[(size_t)t * K + lane * KPL + e] = gdn__from_f32<I>(kx[e]);
    store_normalised<K, WITH_Q>(p, s, kx, qx, krow, qrow, t, lane);
#pragma unroll
    for (int c = 0; c < VPL; c++)
        if (lane + c * 32 < tile_rows) vrow[lane + c * 32] = vx[c];
}

/* One token as a thread uses it: its slices of k^ and q^, v of its rows, g, beta, k^.q^. */
template <typename Geo> struct token_values {
    float k[Geo::NV][Geo::EV], q[Geo::NV][Geo::EV], v[Geo::RT], g, beta, kq;

    /* From the CTA's prepared tokens (SHARED staging); q only for tokens with outputs. */
    template <bool WITH_Q>
    __device__ __forceinline__ void load_shared(const shared_tokens &s, int j, int t, int K, int tile_rows, int local_row0,
                                                int glane)
    {
        load_slice<Geo>(s.khat + (size_t)j * K, k, glane);
        if (WITH_Q) load_slice<Geo>(s.qhat + (size_t)t * K, q, glane);
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) v[rt] = s.v[(size_t)j * tile_rows + local_row0 + rt * Geo::G];
        g = s.gate[j];
        beta = s.beta[j];
        kq = WITH_Q ? s.kq[t] : 0.0f;
    }

    /* A token's inputs as read (2-byte values, packed), before load_direct's preparation. */
    template <typename I> struct raw_inputs {
        gdn__raw_vec<I, Geo::EV> k[Geo::NV], q[Geo::NV];
        I v[Geo::RT], a, b;
    };

    /* Straight from the inputs, every lane group for itself (direct staging): the norms are lane-group
     * reductions; nothing waits for the rest of the CTA. In two halves, so that a caller can hold the
     * reads in flight (and in few registers) across other work. */
    template <int K, typename I>
    static __device__ __forceinline__ void read_direct(const gdn__layer_params &p, int64_t i, int t, int kh, int h, int row0,
                                                       int glane, raw_inputs<I> &raw)
    {
        const I *kp = static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh);
        const I *qp = static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh);
        const I *vp = static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, t, h);
#pragma unroll
        for (int n = 0; n < Geo::NV; n++) {
            raw.k[n] = *reinterpret_cast<const gdn__raw_vec<I, Geo::EV> *>(kp + (n * Geo::L + glane) * Geo::EV);
            raw.q[n] = *reinterpret_cast<const gdn__raw_vec<I, Geo::EV> *>(qp + (n * Geo::L + glane) * Geo::EV);
        }
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) raw.v[rt] = vp[row0 + rt * Geo::G];
        raw.a = static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, h)];
        raw.b = static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, t, h)];
    }
    template <int K, typename I>
    __device__ __forceinline__ void prepare_direct(const gdn__layer_params &p, const raw_inputs<I> &raw, float A, float dt_bias)
    {
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) {
                k[n][e] = gdn__to_f32(raw.k[n].v[e]);
                q[n][e] = gdn__to_f32(raw.q[n].v[e]);
            }
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) v[rt] = gdn__to_f32(raw.v[rt]);
        token_gate(gdn__to_f32(raw.a), gdn__to_f32(raw.b), A, dt_bias, g, beta);
        float kk = 0.0f, qq = 0.0f, kqr = 0.0f;
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) {
                kk = fmaf(k[n][e], k[n][e], kk);
                qq = fmaf(q[n][e], q[n][e], qq);
                kqr = fmaf(k[n][e], q[n][e], kqr);
            }
        kk = group_sum<Geo::L>(kk);
        qq = group_sum<Geo::L>(qq);
        kqr = group_sum<Geo::L>(kqr);
        float rk, rq;
        norm_scales(p, kk, qq, rk, rq);
        kq = kqr * rk * rq;
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) {
                k[n][e] *= rk;
                q[n][e] *= rq;
            }
    }
    template <int K, typename I>
    __device__ __forceinline__ void load_direct(const gdn__layer_params &p, int64_t i, int t, int kh, int h, int row0,
                                                int glane, float A, float dt_bias)
    {
        raw_inputs<I> raw;
        read_direct<K, I>(p, i, t, kh, h, row0, glane, raw);
        prepare_direct<K, I>(p, raw, A, dt_bias);
    }

    /* Stored token j of slot r (fold; no output, so no q), straight from the token store (its layout:
     * gdn_kernel_params.h), every lane group for itself. */
    template <int K, typename I>
    __device__ __forceinline__ void load_stored(const gdn__layer_params &p, int64_t r, int j, int kh, int h, int row0,
                                                int glane, float A, float dt_bias)
    {
        const I *tb = static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * gdn__token_elems(p.HK, p.HV, K, p.V);
        const I *vp = tb + gdn__token_v_offset(p.HK, K) + (int64_t)h * p.V, *ap = tb + gdn__token_gates_offset(p.HK, p.HV, K, p.V) + h;
#pragma unroll
        for (int n = 0; n < Geo::NV; n++) gdn__load_vec<I, Geo::EV>(tb + (int64_t)kh * K + (n * Geo::L + glane) * Geo::EV, k[n]);
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) v[rt] = gdn__to_f32(vp[row0 + rt * Geo::G]);
        token_gate(gdn__to_f32(ap[0]), gdn__to_f32(ap[p.HV]), A, dt_bias, g, beta);
        float kk = 0.0f;
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) kk = fmaf(k[n][e], k[n][e], kk);
        const float rk = l2norm_scale(p, group_sum<Geo::L>(kk));
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) k[n][e] *= rk;
        kq = 0.0f;
    }
};

#endif /* GDN_CUDA_PREPARE_CUH */
