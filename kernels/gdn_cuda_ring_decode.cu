/*
 * The ring strategy's decode in two kernels (semantics: kernels/gdn_kernel_params.h, "Ring strategy";
 * the math: kernels/gdn_cuda_ring.cu's header), run for small grids (gdn__cuda_ring_decode_applies).
 * The one-kernel step (gdn_cuda_ring.cu) repeats the token preparation (normalised k and q, the
 * records' dot products, the cumulative decays) in every CTA of a row, a long dependent chain after
 * the CTA's state rows arrive. Here:
 *   1. ring_decode_prep_kernel, a CTA per (row, value head): reads the row's record count h, forms
 *      the coefficients of the records' u in S k^ and S q^ and of the write-back, writes them and
 *      the token's scalars to p.ring_prep, and appends the token's a (and, once per key head, its
 *      k) as record h unless the row writes back. It is the only reader of the count.
 *   2. ring_decode_state_kernel: the cache decode's memory pipeline over S0 (state rows in flight
 *      before the wait for kernel 1), then per state row S0.k^ and S0.q^ and the records' terms
 *      (lane j mod L takes record j's u) in one lane-group sum. A row that writes back (ring full,
 *      or write slot != read slot) writes S_{h+1} in the same pass. It moves the count.
 * Kernel 2 launches while kernel 1 runs (programmatic dependent launch, when the layer's launch asks
 * for overlap) and waits for it only after its state loads are issued.
 */
#include <stdlib.h>

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_rows.cuh"

/* The scratch of one (row, value head): header slots, then three arrays of capacity + 1 at
 * PREP_HEADER + {0, 1, 2} gdn__ring_prep_stride(capacity):
 *   fk[m] = exp(P_h - P_m) times the scale that normalises raw k_m (m <= h, m = h the token): the
 *     write-back is exp(P_h) S0 + sum_m fk[m] u_m raw_k_m;
 *   ck[j] = exp(P_{h-1} - P_j) k^_j.k^, cq[j] = exp(P_h - P_j) k^_j.q^ (j < h): the records' terms. */
enum {
    PREP_COUNT,   /* h (a small integer, exact in fp32) */
    PREP_FLUSH,   /* 1: the row writes S_{h+1} back, 0: it appends record h */
    PREP_C0K,     /* exp(P_{h-1}) (1 when h = 0) times rk: coefficient of S0.k (raw k) in S_h k^ */
    PREP_C0Q,     /* exp(P_h) times rq: coefficient of S0.q (raw q) in S_{h+1} q^ */
    PREP_DECAY_ALL, /* exp(P_h): coefficient of S0 in the write-back */
    PREP_KQ,      /* k^.q^: the token's own u in its output */
    PREP_DECAY,   /* g of the token */
    PREP_BETA,    /* beta of the token */
    PREP_HEADER = 16
};

/* ---------------------------------------------------------------------------------------------- */
/* 1. Preparation                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

#define PREP_THREADS 128

template <int K, typename I> __global__ void __launch_bounds__(PREP_THREADS) ring_decode_prep_kernel(const gdn__layer_params p)
{
    constexpr int GL = 8;        /* lanes per K-vector: four vectors a warp, sixteen a CTA at once */
    constexpr int KPL = K / GL;  /* elements a lane holds */
    static_assert(KPL % 8 == 0, "16-byte pieces of 2-byte inputs");
    __shared__ float dot_k[GDN_MAX_RING_LENGTH], dot_q[GDN_MAX_RING_LENGTH], norm_of[GDN_MAX_RING_LENGTH + 1],
        logd[GDN_MAX_RING_LENGTH + 1];
    __shared__ float scalars[4]; /* rk, rq, k.q raw, the token's log decay */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = lane / GL, glane = lane % GL;
    const int vh = blockIdx.x;
    const int64_t i = blockIdx.y;
    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    if (r < 0 || gdn__row_slots_invalid(r, w, p.num_slots)) return; /* padding: kernel 2 reads nothing */

    const int HV = p.HV, HK = p.HK, C = p.ring_capacity, per_key = HV / HK, kh = vh / per_key;
    float *out = p.ring_prep + (i * HV + vh) * gdn__ring_prep_floats(C);
    const int stride = gdn__ring_prep_stride(C);
    /* What does not depend on the record count first: the token's k, q, a, b. */
    float k[KPL], q[KPL];
    const I *k_in = static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, 0, kh) + glane * KPL;
    const I *q_in = static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, 0, kh) + glane * KPL;
#pragma unroll
    for (int e = 0; e < KPL; e += 8) {
        gdn__load_vec<I, 8>(k_in + e, *reinterpret_cast<float(*)[8]>(&k[e]));
        gdn__load_vec<I, 8>(q_in + e, *reinterpret_cast<float(*)[8]>(&q[e]));
    }
    const I own_a = static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, 0, vh)];
    const float own_b = gdn__to_f32(static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, 0, vh)]);
    const float A = expf(p.A_log[vh]), dt_bias = p.dt_bias[vh];
    const int h = min(max(p.ring_count[r], 0), C);
    const bool flush = r != w || h + 1 >= p.ring_length;
    const int64_t record_bytes = gdn__ring_record_bytes(HK, HV, K, p.V), a_offset = gdn__ring_a_offset(HK, K);
    const char *ring_r = static_cast<const char *>(p.ring) + r * C * record_bytes;
    char *ring_w = static_cast<char *>(p.ring) + w * C * record_bytes;

    if ((int)threadIdx.x < h)
        logd[threadIdx.x] = token_log_decay(gdn__to_f32(reinterpret_cast<const I *>(ring_r + threadIdx.x * record_bytes + a_offset)[vh]),
                                            A, dt_bias);

    float kk = 0.0f, qq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int e = 0; e < KPL; e++) kk = fmaf(k[e], k[e], kk), qq = fmaf(q[e], q[e], qq), kq = fmaf(k[e], q[e], kq);
    kk = group_sum<GL>(kk), qq = group_sum<GL>(qq), kq = group_sum<GL>(kq);
    float rk, rq;
    norm_scales(p, kk, qq, rk, rq);
    if (threadIdx.x == 0) {
        const float l = token_log_decay(gdn__to_f32(own_a), A, dt_bias);
        logd[h] = l;
        scalars[0] = rk, scalars[1] = rq, scalars[2] = kq, scalars[3] = l;
    }

    /* The records' k: sixteen at a time (a lane group each), a uniform trip count for the shuffles. */
    for (int j0 = 0; j0 < h; j0 += 16) {
        const int j = j0 + warp * 4 + group;
        float x[KPL];
        if (j < h) {
            const I *rec = reinterpret_cast<const I *>(ring_r + j * record_bytes) + (int64_t)kh * K + glane * KPL;
#pragma unroll
            for (int e = 0; e < KPL; e += 8) gdn__load_vec<I, 8>(rec + e, *reinterpret_cast<float(*)[8]>(&x[e]));
        } else {
#pragma unroll
            for (int e = 0; e < KPL; e++) x[e] = 0.0f;
        }
        float xx = 0.0f, xk = 0.0f, xq = 0.0f;
#pragma unroll
        for (int e = 0; e < KPL; e++) xx = fmaf(x[e], x[e], xx), xk = fmaf(x[e], k[e], xk), xq = fmaf(x[e], q[e], xq);
        xx = group_sum<GL>(xx), xk = group_sum<GL>(xk), xq = group_sum<GL>(xq);
        if (j < h && glane == 0) {
            const float rj = p.use_qk_l2norm ? rsqrtf(xx + 1e-6f) : 1.0f;
            dot_k[j] = rj * rk * xk;
            dot_q[j] = rj * rq * xq;
            norm_of[j] = rj;
        }
    }
    __syncthreads();

    /* Warp 0: cumulative log decays P_0..P_h (32 a chunk), then every coefficient. */
    if (warp == 0) {
        float P[2], carry = 0.0f;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int j = c * 32 + lane;
            float x = j <= h ? logd[j] : 0.0f;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, x, off);
                if (lane >= off) x += y;
            }
            P[c] = x + carry;
            carry = __shfl_sync(0xffffffffu, P[c], 31);
        }
        const float after = __shfl_sync(0xffffffffu, h < 32 ? P[0] : P[1], h % 32);
        const float before = h > 0 ? __shfl_sync(0xffffffffu, h - 1 < 32 ? P[0] : P[1], (h - 1) % 32) : 0.0f;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int j = c * 32 + lane;
            if (j < h) {
                out[PREP_HEADER + j] = expf(after - P[c]) * norm_of[j];
                out[PREP_HEADER + stride + j] = expf(before - P[c]) * dot_k[j];
                out[PREP_HEADER + 2 * stride + j] = expf(after - P[c]) * dot_q[j];
            } else if (j == h) {
                out[PREP_HEADER + j] = rk;
            }
        }
        if (lane == 0) {
            out[PREP_COUNT] = (float)h;
            out[PREP_FLUSH] = flush ? 1.0f : 0.0f;
            out[PREP_C0K] = (h > 0 ? expf(before) : 1.0f) * rk;
            out[PREP_C0Q] = expf(after) * rq;
            out[PREP_DECAY_ALL] = expf(after);
            out[PREP_KQ] = rk * rq * kq;
            out[PREP_DECAY] = expf(scalars[3]);
            out[PREP_BETA] = 1.0f / (1.0f + expf(-own_b));
            if (!flush) reinterpret_cast<I *>(ring_w + h * record_bytes + a_offset)[vh] = own_a;
        }
    }
    if (!flush && vh % per_key == 0 && warp == 1) { /* record h's k, once per key head */
        const uint4 *from = reinterpret_cast<const uint4 *>(static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, 0, kh));
        uint4 *to = reinterpret_cast<uint4 *>(ring_w + h * record_bytes + (int64_t)kh * K * 2);
        for (int c = lane; c < K * 2 / 16; c += 32) to[c] = from[c];
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* 2. State pass                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

template <int K, typename S, typename I, typename O, int REGS>
__global__ void __launch_bounds__(128, (REGS >= 64 ? 4 : 6)) ring_decode_state_kernel(const gdn__layer_params p)
{
    using Geo = layer_geometry<K, S, REGS, true>;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT;
    static_assert(sizeof(I) == 2, "2-byte inputs");

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int group = lane / L, glane = lane % L;
    const int V = p.V, HV = p.HV, HK = p.HK;
    const int pass_rows = warps * Geo::ROWS_PER_WARP, tiles_per_head = V / pass_rows;
    const int head = blockIdx.x / tiles_per_head;
    const int64_t i = blockIdx.y;
    const int row0 = blockIdx.x % tiles_per_head * pass_rows + warp * Geo::ROWS_PER_WARP + group;

    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    const bool out_of_range = gdn__row_slots_invalid(r, w, p.num_slots);
    O *out = static_cast<O *>(p.out);
    const int64_t out_base = gdn__at(p.out_strides, i, 0, head);
    if (r < 0 || out_of_range) {
        zero_padding_row<O, Geo>(p, out_of_range, out, out_base, 1, row0, 1, pass_rows, glane);
        return;
    }

    const int64_t state_elems = (int64_t)V * K;
    float st[RT][NV][EV];
    load_rows<K, S, Geo>(static_cast<const S *>(p.state) + r * p.slot_stride + head * state_elems, st, row0, glane);
    if (p.overlap_preceding) gdn__wait_preceding(); /* the preparation (and, before it, the inputs) */
    gdn__allow_dependents();

    /* The preparation's scalars, the token's k, q and v; then the records' u (after h). */
    const int C = p.ring_capacity, kh = head / (HV / HK), stride = gdn__ring_prep_stride(C);
    const float *prep = p.ring_prep + (i * HV + head) * gdn__ring_prep_floats(C);
    const float *fk = prep + PREP_HEADER, *ck = fk + stride, *cq = ck + stride;
    const I *k_in = static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, 0, kh);
    const I *q_in = static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, 0, kh);
    float kx[NV][EV], qx[NV][EV];
#pragma unroll
    for (int n = 0; n < NV; n++) {
        gdn__load_vec<I, EV>(k_in + (n * L + glane) * EV, kx[n]);
        gdn__load_vec<I, EV>(q_in + (n * L + glane) * EV, qx[n]);
    }
    const I *v_in = static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, 0, head);
    float v[RT];
#pragma unroll
    for (int rt = 0; rt < RT; rt++) v[rt] = gdn__to_f32(v_in[row0 + rt * G]);
    const int h = (int)prep[PREP_COUNT];
    const bool flush = prep[PREP_FLUSH] != 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0) p.ring_count[w] = flush ? 0 : h + 1; /* kernel 1 has read it */
    const int64_t record_bytes = gdn__ring_record_bytes(HK, HV, K, V), u_offset = gdn__ring_u_offset(HK, HV, K);
    const char *ring_r = static_cast<const char *>(p.ring) + r * C * record_bytes;
    const auto u_of = [&](const char *ring, int j) {
        return reinterpret_cast<const float *>(ring + j * record_bytes + u_offset) + (int64_t)head * V;
    };

    /* S0.k and S0.q (raw k, q) over the thread's columns, scaled, and the records' terms (lane j mod
     * L takes record j) in one lane-group sum. */
    const float c0k = prep[PREP_C0K], c0q = prep[PREP_C0Q];
    float dk[RT], dq[RT];
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
        float sk = 0.0f, sq = 0.0f;
#pragma unroll
        for (int n = 0; n < NV; n++)
#pragma unroll
            for (int e = 0; e < EV; e++) sk = fmaf(st[rt][n][e], kx[n][e], sk), sq = fmaf(st[rt][n][e], qx[n][e], sq);
        dk[rt] = sk * c0k, dq[rt] = sq * c0q;
    }
    for (int j = glane; j < h; j += L) {
        const float ckj = ck[j], cqj = cq[j];
        const float *u = u_of(ring_r, j);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const float uj = u[row0 + rt * G];
            dk[rt] = fmaf(ckj, uj, dk[rt]);
            dq[rt] = fmaf(cqj, uj, dq[rt]);
        }
    }
    row_sums<L, RT, true>(dk, dq);

    const float g = prep[PREP_DECAY], beta = prep[PREP_BETA], kq = prep[PREP_KQ];
    float u_own[RT];
    float *u_record = const_cast<float *>(u_of(static_cast<const char *>(p.ring) + w * C * record_bytes, h));
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
        u_own[rt] = beta * (v[rt] - g * dk[rt]);
        if (glane == 0) {
            out[out_base + row0 + rt * G] = gdn__from_f32<O>(fmaf(kq, u_own[rt], dq[rt]));
            if (!flush) u_record[row0 + rt * G] = u_own[rt];
        }
    }
    if (!flush) return;

    /* Write-back: S_{h+1} = exp(P_h) S0 + sum_{m <= h} fk[m] u_m raw_k_m. */
    scale_rows<Geo>(st, prep[PREP_DECAY_ALL]);
    for (int m = 0; m <= h; m++) {
        float c[RT], kr[NV][EV];
        if (m < h) {
            const float *u = u_of(ring_r, m);
            const I *k_rec = reinterpret_cast<const I *>(ring_r + m * record_bytes) + (int64_t)kh * K;
#pragma unroll
            for (int rt = 0; rt < RT; rt++) c[rt] = fk[m] * u[row0 + rt * G];
#pragma unroll
            for (int n = 0; n < NV; n++) gdn__load_vec<I, EV>(k_rec + (n * L + glane) * EV, kr[n]);
        } else {
#pragma unroll
            for (int rt = 0; rt < RT; rt++) c[rt] = fk[m] * u_own[rt];
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e++) kr[n][e] = kx[n][e];
        }
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e++) st[rt][n][e] = fmaf(c[rt], kr[n][e], st[rt][n][e]);
    }
    store_rows<K, S, Geo, false>(static_cast<S *>(p.state) + w * p.slot_stride + head * state_elems, st, 1.0f, row0, glane);
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

template <int K, typename S, typename I, typename O, int REGS>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    using Geo = layer_geometry<K, S, REGS, true>;
    const int warps = warps_for<Geo>(p, 1, GDN__SMALL_GRID_CTAS);
    if (p->V % (warps * Geo::ROWS_PER_WARP) != 0) return GDN_ENOTSUP;
    const bool overlap = p->overlap_preceding != 0;
    GDN__CUDA_TRY(gdn__launch(ring_decode_prep_kernel<K, I>, dim3((unsigned)p->HV, (unsigned)p->B), dim3(PREP_THREADS), 0,
                              stream, overlap, *p));
    const dim3 grid((unsigned)(p->HV * (p->V / (warps * Geo::ROWS_PER_WARP))), (unsigned)p->B);
    GDN__CUDA_TRY(gdn__launch(ring_decode_state_kernel<K, S, I, O, REGS>, grid, dim3(warps * 32), 0, stream, overlap, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* State values a thread holds: as the one-kernel step's decode (state_regs_for). */
template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    switch (state_regs_for<K, S, true>(p, true)) {
    case state_regs::big: return launch_regs<K, S, I, O, big_regs<S>()>(p, stream);
    case state_regs::tiny: return launch_regs<K, S, I, O, GDN__STATE_REGS_TINY>(p, stream);
    default: return launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL>(p, stream);
    }
}

static gdn_status dispatch(const gdn__layer_params *p, cudaStream_t stream, bool run)
{
    GDN__LAYER_DISPATCH(launch)
}

/* (row, value head) pairs above which the one-kernel step runs the decode (fp32 state, bf16 state):
 * on large grids the preparation kernel's waves cost more than the repeated per-CTA preparation they
 * save (bench/results/2026-11-24-h100-ring-decode.md). */
#ifndef GDN__RING_SPLIT_MAX_HEADS_F32
#define GDN__RING_SPLIT_MAX_HEADS_F32 1024
#endif
#ifndef GDN__RING_SPLIT_MAX_HEADS_BF16
#define GDN__RING_SPLIT_MAX_HEADS_BF16 2048
#endif

extern "C" int gdn__cuda_ring_decode_applies(const gdn__layer_params *p)
{
    /* GDN_RING_ONE_KERNEL=1: the one-kernel step for every decode (A/B runs). */
    static const int one_kernel = [] {
        const char *e = getenv("GDN_RING_ONE_KERNEL");
        return e && e[0] == '1';
    }();
    return !one_kernel && p->ring_prep && p->T == 1 && !p->deferred_verify && !p->token_counts && !p->parents &&
           !gdn__mixer_on(&p->mixer) && p->ring_capacity <= GDN_MAX_RING_LENGTH &&
           (int64_t)p->B * p->HV <= (p->state_dtype == GDN_DTYPE_F32 ? GDN__RING_SPLIT_MAX_HEADS_F32 : GDN__RING_SPLIT_MAX_HEADS_BF16);
}

extern "C" gdn_status gdn__cuda_ring_decode(const gdn__layer_params *p, void *stream)
{
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}
