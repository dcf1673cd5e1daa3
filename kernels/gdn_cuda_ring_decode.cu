/*
 * The ring strategy's decode in two kernels (semantics: kernels/gdn_kernel_params.h, "Ring strategy";
 * the math: kernels/gdn_cuda_ring.cu's header), run where gdn__cuda_ring_decode_applies says.
 * The one-kernel step (gdn_cuda_ring.cu) repeats the token preparation (normalised k and q, the
 * records' dot products, the cumulative decays) in every CTA of a row, a long dependent chain after
 * the CTA's state rows arrive. Here:
 *   1. ring_decode_prep_kernel, a CTA per (row, value head): reads the row's record count h, forms
 *      the coefficients of the records' u in S k^ and S q^ and of the write-back, writes them and
 *      the token's scalars to p.ring_prep, and appends the token's norm scale and log decay (and,
 *      once per key head, its k) as record h unless the row writes back.
 *   2. ring_decode_state_kernel: the cache decode's memory pipeline over S0 (state rows in flight
 *      before the wait for kernel 1), then per state row S0.k^ and S0.q^ and the records' terms
 *      (lane j mod L takes record j's u) in one lane-group sum. A row that writes back (ring full,
 *      or write slot != read slot) writes S_{h+1} in the same pass. It moves the count.
 *   2'. or, on mid-size and large grids with sm_90 code, ring_decode_stream_kernel: the same math,
 *      with the state tiles streamed into shared memory by producer warps (section 2'). After
 *      kernel 1 it reads the counts itself and stages its first items' records and tokens before
 *      its wait, which then holds back only kernel 1's blocks; the row's last item moves the count. Its
 *      tensor-core form (bf16 state and inputs) runs alone: each consumer warp prepares its item's
 *      token itself (prepare_decode, the same math as kernel 1), from records staged with the item.
 *      It also runs the verify of a 2..8-token chain (consume_mma_verify), the group's warps sharing
 *      the tokens' preparations: token t is a decode over the records and tokens 0..t-1.
 * Kernel 2 launches while kernel 1 runs (programmatic dependent launch, when the layer's launch asks
 * for overlap) and waits for it only after its state loads are issued.
 */
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <type_traits>

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_rows.cuh"
#include "gdn_phase_trace.cuh"

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
/* The streamed pass's preparation on grids of GDN__RING_PREP_NARROW_MIN_HEADS (row, value head) pairs
 * and more: a warp a pair, so that a stream CTA fits beside the preparation's first wave and issues
 * its first state copies while it runs (128-thread CTAs fill the SMs' registers there). On smaller
 * grids the 128-thread form leaves that room and its shorter chain measured faster. */
#define PREP_THREADS_BESIDE_STREAM 32
#ifndef GDN__RING_PREP_NARROW_MIN_HEADS
#define GDN__RING_PREP_NARROW_MIN_HEADS 1024
#endif

/* Inclusive prefix sum over the warp's lanes. */
__device__ __forceinline__ float warp_inclusive_sum(float x, int lane)
{
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    return x;
}

/* The lane's KPL values of a record's raw k from rec (global or shared memory), zeros where the record
 * is not live (j >= h: the lane group still joins its shuffles; rec is not read). */
template <int KPL, typename I> __device__ __forceinline__ void record_k_values(const I *rec, bool live, float (&x)[KPL])
{
    if (live) {
#pragma unroll
        for (int e = 0; e < KPL; e += 8) gdn__load_vec<I, 8>(rec + e, *reinterpret_cast<float(*)[8]>(&x[e]));
    } else {
#pragma unroll
        for (int e = 0; e < KPL; e++) x[e] = 0.0f;
    }
}

/* acc[nt] += the warp's 16 A rows (the lane's two: row_top, row_bottom, 8 apart) times n-tile nt's 8 B
 * columns, over all K columns, for n-tiles 0..tiles - 1. The reduction visits a row's columns in an order that A and B
 * share: lane qt reads 8 consecutive columns 32 c + 8 qt .. + 7 of each 32 (one 16-byte read a row,
 * at most 2-way bank conflicts in the unpadded tile), the first four for MMA step 2 c, the last four
 * for step 2 c + 1; b_at(nt, col) gives the lane's B column's 16 bytes at col. */
template <int K, int NT, typename BAt>
__device__ __forceinline__ void rows_times_columns(const unsigned char *row_top, const unsigned char *row_bottom, int qt, int tiles, BAt b_at,
                                                   float (&acc)[NT][4])
{
#pragma unroll
    for (int c32 = 0; c32 < K / 32; c32++) {
        const int col = c32 * 32 + qt * 8;
        const uint4 a_top = *reinterpret_cast<const uint4 *>(row_top + col * 2);
        const uint4 a_bottom = *reinterpret_cast<const uint4 *>(row_bottom + col * 2);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= tiles) break;
            const uint4 b = b_at(nt, col);
            gdn__mma_bf16_m16n8k16(acc[nt], a_top.x, a_bottom.x, a_top.y, a_bottom.y, b.x, b.y);
            gdn__mma_bf16_m16n8k16(acc[nt], a_top.z, a_bottom.z, a_top.w, a_bottom.w, b.z, b.w);
        }
    }
}
/* The same over rows rowA and rowB of a tile of K columns at a pitch of K. */
template <int K, int NT, typename BAt>
__device__ __forceinline__ void tile_times_columns(const unsigned char *tile_s, int rowA, int rowB, int qt, int tiles, BAt b_at,
                                                   float (&acc)[NT][4])
{
    rows_times_columns<K>(tile_s + rowA * K * 2, tile_s + rowB * K * 2, qt, tiles, b_at, acc);
}

/* A decode's preparation of one (row, value head), by THREADS threads (tid 0.., whole warps; sync()
 * joins them): the coefficients of the scratch above into out (arrays `stride` floats apart), from
 * the token's raw k and q (k_in, q_in: key head kh), entry j's raw k (rec_k(j)) and its pair
 * rec_pair(j) = {norm scale of its k, log decay}, the token's log decay (own_log_decay(), called once
 * the token's loads are issued) and raw b, for h entries with write-back flag flush (count(h, flush,
 * stored), read then too). Entries below `stored` are ring records, their pairs as the record holds
 * them; a verify's token t prepares as a decode over h + t entries, the ring's h and then its own
 * earlier tokens, whose pairs give only the log decay: their norms are formed here (at most
 * GDN__RING_VERIFY_MAX_TOKENS - 1 of them). dot_k, dot_q, norm_of (h floats, may alias out's ck, cq,
 * fk: each is read and then overwritten by the same thread) and logd (h + 1 floats) are scratch.
 * Unless the row writes back, it appends the token (its k once per key head, its pair) as record h of
 * the write slot's ring ring_w (nullptr: another caller appends). Warp 0 writes out; the caller syncs
 * before reading it. The preparation kernel reads global memory, the streamed pass its stage. With
 * WRITE_BACK_OF_RECORDS, fk and PREP_DECAY_ALL describe S_h (the entries without the token:
 * exp(P_{h-1}) S0 + sum_{m < h} fk[m] u_m raw_k_m), the verify's write-back. */
template <int K, typename I, int THREADS, bool MMA_DOTS, bool WRITE_BACK_OF_RECORDS = false, typename Count, typename RecK,
          typename RecPair, typename OwnLogDecay, typename Sync>
__device__ __forceinline__ void prepare_decode(const gdn__layer_params &p, int tid, int vh, const I *k_in, const I *q_in, Count count,
                                               RecK rec_k, RecPair rec_pair, OwnLogDecay own_log_decay, float own_b, char *ring_w,
                                               float *out, int stride, float *dot_k, float *dot_q, float *norm_of, float *logd, Sync sync)
{
    /* Lanes per K-vector (THREADS / GL vectors at once) and the elements a lane holds: at most 16 where
     * the records' dot products run here too, else (the tensor cores take them) 4 or 8, for the
     * streamed pass's registers. */
    constexpr int GL = MMA_DOTS ? (K / 4 > 32 ? 32 : K / 4) : K / 16 < 8 ? 8 : K / 16 > 32 ? 32 : K / 16;
    constexpr int KPL = K / GL, VEC = KPL % 8 == 0 ? 8 : 4;
    static_assert(KPL % VEC == 0 && (MMA_DOTS || VEC == 8), "8- or 16-byte pieces of 2-byte inputs");
    const int lane = tid & 31, glane = lane % GL;
    const int per_key = p.HV / p.HK, kh = vh / per_key;
    float k[KPL], q[KPL];
#pragma unroll
    for (int e = 0; e < KPL; e += VEC) {
        gdn__load_vec<I, VEC>(k_in + glane * KPL + e, *reinterpret_cast<float(*)[VEC]>(&k[e]));
        gdn__load_vec<I, VEC>(q_in + glane * KPL + e, *reinterpret_cast<float(*)[VEC]>(&q[e]));
    }
    int h, stored;
    bool flush;
    count(h, flush, stored);
    const float own_l = own_log_decay();
    char *const append = ring_w ? ring_w + h * gdn__ring_record_bytes(p.HK, p.HV, K, p.V) : nullptr;
    for (int j = tid; j < h; j += THREADS) logd[j] = rec_pair(j).y;

    float kk = 0.0f, qq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int e = 0; e < KPL; e++) kk = fmaf(k[e], k[e], kk), qq = fmaf(q[e], q[e], qq), kq = fmaf(k[e], q[e], kq);
    kk = group_sum<GL>(kk), qq = group_sum<GL>(qq), kq = group_sum<GL>(kq);
    float rk, rq;
    norm_scales(p, kk, qq, rk, rq);
    if (tid == 0) logd[h] = own_l;

    if constexpr (MMA_DOTS) {
        /* One warp, bf16 entries in shared memory (rec_k(j) for every j of the last m-tile: rows past h
         * may hold anything): 16 entries an m-tile on the tensor cores, times B columns raw k, raw q
         * and the first six own entries' k (stored.., zeros past them), whose column on their own row
         * gives their norm. A seventh (a verify's eighth token) sums its squares on the lanes. */
        static_assert(THREADS == 32 && std::is_same<I, __nv_bfloat16>::value, "one warp, bf16");
        static_assert(GDN__RING_VERIFY_MAX_TOKENS <= 8, "at most seven own entries");
        const int qg = lane >> 2, qt = lane & 3, own = h - stored;
        const I *const column = qg == 0 ? k_in : qg == 1 ? q_in : qg - 2 < own ? rec_k(stored + qg - 2) : nullptr;
        float seventh_xx = 0.0f;
        if (own > 6) { /* uniform */
            const I *x = rec_k(stored + 6);
            for (int c = lane; c < K; c += 32) seventh_xx = fmaf(gdn__to_f32(x[c]), gdn__to_f32(x[c]), seventh_xx);
            seventh_xx = group_sum<32>(seventh_xx);
        }
        for (int m0 = 0; m0 < h; m0 += 16) {
            const unsigned char *top = reinterpret_cast<const unsigned char *>(rec_k(m0 + qg));
            const unsigned char *bottom = reinterpret_cast<const unsigned char *>(rec_k(m0 + qg + 8));
            float acc[1][4] = {};
            rows_times_columns<K>(top, bottom, qt, 1,
                                  [&](int, int col) { return column ? *reinterpret_cast<const uint4 *>(column + col) : make_uint4(0u, 0u, 0u, 0u); },
                                  acc);
            /* Own entry e (< 6) on the lane's row: its norm in column 2 + e, on lane 4 qg + (2 + e) / 2,
             * element (2 + e) % 2 of the row's pair; the entry's dot products sit on lane 4 qg. */
            float own_xx[2] = {0.0f, 0.0f};
            if (own > 0) { /* uniform */
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int e = m0 + qg + 8 * half - stored;
                    const float give = e & 1 ? acc[0][2 * half + 1] : acc[0][2 * half];
                    own_xx[half] = __shfl_sync(0xffffffffu, give, 4 * qg + (e >= 0 && e < 6 ? (2 + e) / 2 : 0));
                }
            }
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int j = m0 + qg + 8 * half;
                if (qt == 0 && j < h) {
                    const int e = j - stored;
                    const float rj = e < 0 ? rec_pair(j).x : l2norm_scale(p, e < 6 ? own_xx[half] : seventh_xx);
                    dot_k[j] = rj * rk * acc[0][2 * half];
                    dot_q[j] = rj * rq * acc[0][2 * half + 1];
                    norm_of[j] = rj;
                }
            }
        }
    }
    /* The entries' k: THREADS / GL at a time (a lane group each), a uniform trip count for the shuffles;
     * the norms only of own entries. */
    for (int j0 = 0; !MMA_DOTS && j0 < h; j0 += THREADS / GL) {
        const int j = j0 + tid / GL;
        const bool own_norms = j0 + THREADS / GL > stored; /* uniform */
        float x[KPL];
        record_k_values<KPL, I>(rec_k(j) + glane * KPL, j < h, x);
        float xx = 0.0f, xk = 0.0f, xq = 0.0f;
#pragma unroll
        for (int e = 0; e < KPL; e++) xk = fmaf(x[e], k[e], xk), xq = fmaf(x[e], q[e], xq);
        xk = group_sum<GL>(xk), xq = group_sum<GL>(xq);
        if (own_norms) {
#pragma unroll
            for (int e = 0; e < KPL; e++) xx = fmaf(x[e], x[e], xx);
            xx = group_sum<GL>(xx);
        }
        if (j < h && glane == 0) {
            const float rj = j < stored ? rec_pair(j).x : l2norm_scale(p, xx);
            dot_k[j] = rj * rk * xk;
            dot_q[j] = rj * rq * xq;
            norm_of[j] = rj;
        }
    }
    sync();

    /* Warp 0: cumulative log decays P_0..P_h (32 a chunk), then every coefficient. */
    if (tid < 32) {
        float P[2];
        P[0] = warp_inclusive_sum(lane <= h ? logd[lane] : 0.0f, lane);
        P[1] = 0.0f;
        if (h >= 32) /* a second chunk only for a full ring of 32 */
            P[1] = warp_inclusive_sum(32 + lane <= h ? logd[32 + lane] : 0.0f, lane) + __shfl_sync(0xffffffffu, P[0], 31);
        const float after = __shfl_sync(0xffffffffu, h < 32 ? P[0] : P[1], h % 32);
        const float before = h > 0 ? __shfl_sync(0xffffffffu, h - 1 < 32 ? P[0] : P[1], (h - 1) % 32) : 0.0f;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int j = c * 32 + lane;
            if (j < h) {
                const float fk = expf((WRITE_BACK_OF_RECORDS ? before : after) - P[c]) * norm_of[j], ck = expf(before - P[c]) * dot_k[j],
                            cq = expf(after - P[c]) * dot_q[j];
                out[PREP_HEADER + j] = fk;
                out[PREP_HEADER + stride + j] = ck;
                out[PREP_HEADER + 2 * stride + j] = cq;
            } else if (j == h) {
                out[PREP_HEADER + j] = rk;
            }
        }
        if (lane == 0) {
            out[PREP_COUNT] = (float)h;
            out[PREP_FLUSH] = flush ? 1.0f : 0.0f;
            out[PREP_C0K] = (h > 0 ? expf(before) : 1.0f) * rk;
            out[PREP_C0Q] = expf(after) * rq;
            out[PREP_DECAY_ALL] = WRITE_BACK_OF_RECORDS ? (h > 0 ? expf(before) : 1.0f) : expf(after);
            out[PREP_KQ] = rk * rq * kq;
            out[PREP_DECAY] = expf(own_l);
            out[PREP_BETA] = token_beta(own_b);
            if (!flush && append) reinterpret_cast<float2 *>(append + gdn__ring_norm_decay_offset(p.HK, K))[vh] = make_float2(rk, own_l);
        }
    }
    constexpr int COPY_WARP = THREADS > 32 ? 1 : 0; /* beside warp 0's scan where there are two warps */
    if (!flush && append && vh % per_key == 0 && tid / 32 == COPY_WARP) { /* record h's k, once per key head */
        const uint4 *from = reinterpret_cast<const uint4 *>(k_in);
        uint4 *to = reinterpret_cast<uint4 *>(append + (int64_t)kh * K * 2);
        for (int c = lane; c < K * 2 / 16; c += 32) to[c] = from[c];
    }
}

/* A preparation CTA's row i: its read and write slots, read before the wait for the preceding kernel;
 * false for a padding or out-of-range row (the state pass reads nothing of it). EARLY: the record
 * count h is read then too (the count and the records are in the workspace, which that kernel does
 * not write: gdn_op.h's overlap_preceding), and the lines of the records that the preparation reads
 * (key head kh's k, value head vh's pair) are sent toward L2, by THREADS threads. */
template <int K, typename I, int THREADS, bool EARLY>
__device__ __forceinline__ bool prep_row_slots(const gdn__layer_params &p, int64_t i, int kh, int vh, int64_t &r, int64_t &w, int &h)
{
    r = p.read_slots[i];
    w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    if constexpr (!EARLY) {
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
        return r >= 0 && !gdn__row_slots_invalid(r, w, p.num_slots);
    }
    const bool row = r >= 0 && !gdn__row_slots_invalid(r, w, p.num_slots);
    h = 0;
    if (row) {
        const int C = p.ring_capacity;
        h = min(max(p.ring_count[r], 0), C);
        const int64_t record_bytes = gdn__ring_record_bytes(p.HK, p.HV, K, p.V);
        const char *ring_r = static_cast<const char *>(p.ring) + r * C * record_bytes;
        constexpr int LINES = (K * (int)sizeof(I) + 127) / 128 + 1; /* a record's k lines, then its pair */
        for (int c = threadIdx.x; c < h * LINES; c += THREADS) {
            const char *record = ring_r + c / LINES * record_bytes;
            const int line = c % LINES;
            gdn__prefetch_l2(line < LINES - 1 ? record + (int64_t)kh * K * sizeof(I) + line * 128
                                              : record + gdn__ring_norm_decay_offset(p.HK, K) + vh * 8);
        }
    }
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    return row;
}

template <int K, typename I, int THREADS, bool EARLY>
__global__ void __launch_bounds__(THREADS) ring_decode_prep_kernel(const gdn__layer_params p)
{
    __shared__ float dot_k[GDN_MAX_RING_LENGTH], dot_q[GDN_MAX_RING_LENGTH], norm_of[GDN_MAX_RING_LENGTH + 1],
        logd[GDN_MAX_RING_LENGTH + 1];
    const int vh = blockIdx.x;
    const int64_t i = blockIdx.y;
    int64_t r, w;
    int count, HV, HK, C, kh;
    if constexpr (EARLY) { /* the key head first: the records' lines are its */
        HV = p.HV, HK = p.HK, C = p.ring_capacity, kh = vh / (HV / HK);
        if (!prep_row_slots<K, I, THREADS, true>(p, i, kh, vh, r, w, count)) return;
    } else {
        if (!prep_row_slots<K, I, THREADS, false>(p, i, 0, vh, r, w, count)) return;
        HV = p.HV, HK = p.HK, C = p.ring_capacity, kh = vh / (HV / HK);
    }
    /* What does not depend on the record count first: the token's a and b (k and q in prepare_decode). */
    const float own_a = gdn__to_f32(static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, 0, vh)]);
    const float own_b = gdn__to_f32(static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, 0, vh)]);
    const float A_log = p.A_log[vh], dt_bias = p.dt_bias[vh];
    const int64_t record_bytes = gdn__ring_record_bytes(HK, HV, K, p.V), pair_offset = gdn__ring_norm_decay_offset(HK, K);
    const char *ring_r = static_cast<const char *>(p.ring) + r * C * record_bytes;
    char *ring_w = static_cast<char *>(p.ring) + w * C * record_bytes;
    /* One warp with bf16 inputs: the records' dot products on the tensor cores, 16 records a load round
     * (whole m-tiles: the rows past the count read the last record again, and are discarded). */
    constexpr bool MMA_DOTS = THREADS == 32 && std::is_same<I, __nv_bfloat16>::value;
    int records = 0;
    prepare_decode<K, I, THREADS, MMA_DOTS>(
        p, (int)threadIdx.x, vh, static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, 0, kh),
        static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, 0, kh),
        [&](int &h, bool &flush, int &stored) {
            h = EARLY ? count : min(max(p.ring_count[r], 0), C); /* else read after the token's loads are issued */
            flush = r != w || h + 1 >= p.ring_length;
            records = stored = h;
        },
        [&](int j) { return reinterpret_cast<const I *>(ring_r + (MMA_DOTS ? min(j, records - 1) : j) * record_bytes) + (int64_t)kh * K; },
        [&](int j) { return reinterpret_cast<const float2 *>(ring_r + j * record_bytes + pair_offset)[vh]; },
        [&] { return token_log_decay(own_a, expf(A_log), dt_bias); }, own_b, ring_w,
        p.ring_prep + (i * HV + vh) * gdn__ring_prep_floats(C), gdn__ring_prep_stride(C), dot_k, dot_q, norm_of, logd,
        [] { __syncthreads(); });
}

/* ---------------------------------------------------------------------------------------------- */
/* 2. State pass                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* The row math both state passes share; they differ only in where the records' u and k come from:
 * u_at(j, rt) is record j's u at the thread's row rt, k_at(m) record m's raw k (K values, the head's
 * key head). */

/* dk, dq: S0.k and S0.q (raw k, q) over the thread's columns, scaled by c0k, c0q, plus the records'
 * terms (lane j mod L takes record j), before the lane-group sum. */
template <typename Geo, typename UAt>
__device__ __forceinline__ void row_terms(const float (&st)[Geo::RT][Geo::NV][Geo::EV], const float (&kx)[Geo::NV][Geo::EV],
                                          const float (&qx)[Geo::NV][Geo::EV], const float *prep, const float *ck, const float *cq,
                                          int h, UAt u_at, int glane, float (&dk)[Geo::RT], float (&dq)[Geo::RT])
{
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, RT = Geo::RT;
    const float c0k = prep[PREP_C0K], c0q = prep[PREP_C0Q];
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
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const float uj = u_at(j, rt);
            dk[rt] = fmaf(ckj, uj, dk[rt]);
            dq[rt] = fmaf(cqj, uj, dq[rt]);
        }
    }
}

/* Write-back: st becomes S_{h+1} = exp(P_h) S0 + sum_{m <= h} fk[m] u_m raw_k_m, entry h the token's
 * own (u_own, kx). */
template <typename Geo, typename I, typename UAt, typename KAt>
__device__ __forceinline__ void write_back_rows(float (&st)[Geo::RT][Geo::NV][Geo::EV], const float *prep, const float *fk, int h,
                                                UAt u_at, KAt k_at, const float (&u_own)[Geo::RT],
                                                const float (&kx)[Geo::NV][Geo::EV], int glane)
{
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, RT = Geo::RT;
    scale_rows<Geo>(st, prep[PREP_DECAY_ALL]);
    for (int m = 0; m <= h; m++) {
        float c[RT], kr[NV][EV];
        if (m < h) {
            const I *k_rec = k_at(m);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) c[rt] = fk[m] * u_at(m, rt);
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
}

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

    /* S0.k and S0.q and the records' terms in one lane-group sum. */
    const auto u_at = [&](int j, int rt) { return u_of(ring_r, j)[row0 + rt * G]; };
    float dk[RT], dq[RT];
    row_terms<Geo>(st, kx, qx, prep, ck, cq, h, u_at, glane, dk, dq);
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

    const auto k_at = [&](int m) { return reinterpret_cast<const I *>(ring_r + m * record_bytes) + (int64_t)kh * K; };
    write_back_rows<Geo, I>(st, prep, fk, h, u_at, k_at, u_own, kx, glane);
    store_rows<K, S, Geo, false>(static_cast<S *>(p.state) + w * p.slot_stride + head * state_elems, st, 1.0f, row0, glane);
}

/* ---------------------------------------------------------------------------------------------- */
/* 2'. Streamed state pass                                                                          */
/* ---------------------------------------------------------------------------------------------- */

/* The same math as ring_decode_state_kernel, but the memory side is decoupled from the math: a
 * persistent grid (STREAM_CTAS_PER_SM CTAs an SM) walks work items (row, value head, tile of R state
 * rows); a producer warp copies each item's state tile, preparation block, records' u (and, for a
 * write-back, records' k), and the token's k, q and v into a ring of shared-memory stages with the
 * bulk-copy engine, up to `stages` items ahead, and eight consumer warps do the math from shared
 * memory (with bf16 state and inputs: on the tensor cores, in two groups of four on alternate items,
 * a producer warp each; see stream_layout). So the state bytes in flight do not end when a CTA's
 * loads do, and the stores and the records' latency run while the next items stream in. The state
 * copies of the first stages are issued before the wait for the preceding kernel; after a
 * preparation kernel, so are their records and tokens (that kernel lets this one launch only after
 * its own wait, so the tokens' writer has ended), and only its blocks come after the wait. The tensor-core
 * decode has no preparation kernel: the producer reads the record count and stages every record's k
 * and pair instead of a preparation block, each consumer warp prepares (records' dot products on the
 * tensor cores), a group takes a row-head's tiles in a row on large grids (group_walk), and the
 * row's last item to finish moves the count. Bulk copies and mbarrier transaction counts need sm_90;
 * it runs on the grids stream_state_pass_applies names. */

#define STREAM_CONSUMER_WARPS 8
/* A producer warp for each consumer group (stream_groups) */
#define STREAM_THREADS(GROUPS) ((STREAM_CONSUMER_WARPS + (GROUPS)) * 32)
#define STREAM_CTAS_PER_SM 2
#define STREAM_MAX_STAGES 8
#define STREAM_HEADER_BYTES 32

/* State values a consumer thread holds: 32 with K >= 128 (64 rows an item: 32 KB tiles of fp32 state,
 * 16 KB of 2-byte state), else 16; R divides every V. */
template <int K, typename S> constexpr int stream_regs() { return K >= 128 ? 32 : 16; }

/* MMA: bf16 state and bf16 inputs take S0.k and S0.q from the tensor cores (mma.sync m16n8k16, the
 * token's raw k and q as the B columns; bf16 products are exact, sums in fp32), a warp 16 state rows
 * of an item; the consumer warps form two groups that take alternate items (R = 64 rows an item, so
 * that as many stages fit as in the register form). */
template <bool MMA> constexpr int stream_groups() { return MMA ? 2 : 1; }
/* TOK: 1 for a decode; for the verify, the chain's most tokens (4 or GDN__RING_VERIFY_MAX_TOKENS: room
 * for that many tokens' k, q, v and coefficients; the smaller stage lets as many stages fit as a
 * decode's). */
template <int K, typename S, bool MMA, int TOK = 1> struct stream_layout {
    using Geo = layer_geometry<K, S, stream_regs<K, S>(), true>;
    static constexpr int GROUP_WARPS = STREAM_CONSUMER_WARPS / stream_groups<MMA>(); /* consumer warps an item */
    static constexpr int R = MMA ? GROUP_WARPS * 16 : GROUP_WARPS * Geo::ROWS_PER_WARP; /* state rows an item */
    static constexpr int U_STRIDE = MMA ? R + 8 : R + 4; /* floats between records' u rows (bank spread) */
    static constexpr int TOKENS = TOK;
    /* The tensor-core form prepares its tokens itself (prepare_decode), from the records' k and pairs
     * (the 16 bytes holding the head's) staged with the item, into blocks after the stages: a decode in
     * each consumer warp's own block (no barrier between the group's warps), a verify's token t in
     * block t of the group (its warps share the tokens, then meet at a barrier). A group takes a
     * (row, value head)'s tiles in a row, so that the first tile's preparation serves the others. The
     * other forms copy into each stage what a preparation kernel wrote. */
    static constexpr bool PREPARES = MMA;
    static constexpr int BLOCKS = PREPARES ? (TOK > 1 ? stream_groups<MMA>() * TOK : STREAM_CONSUMER_WARPS) : 0;
    /* a block's arrays hold a coefficient for each of the records and a verify's earlier tokens */
    int coef_stride, block_floats, scratch_floats;
    int64_t tile, prep, u, krec, kin, qin, vin, pairs, bytes, blocks_bytes;
    __host__ __device__ stream_layout(int C)
    {
        coef_stride = gdn__ring_prep_stride(C + TOK - 1);
        block_floats = 16 + 3 * coef_stride;
        scratch_floats = (C + TOK + 3) / 4 * 4; /* the cumulative decays, a consumer warp's */
        blocks_bytes = PREPARES ? ((int64_t)BLOCKS * block_floats + (int64_t)STREAM_CONSUMER_WARPS * scratch_floats) * 4 : 0;
        tile = STREAM_HEADER_BYTES;
        prep = tile + (int64_t)R * K * sizeof(S);
        u = prep + (PREPARES ? 0 : (int64_t)gdn__ring_prep_floats(C) * 4);
        krec = u + (int64_t)C * U_STRIDE * 4;
        kin = krec + (int64_t)(PREPARES ? (C + 15) / 16 * 16 : C) * K * 2; /* whole m-tiles of records (prepare_decode) */
        qin = kin + TOK * K * 2;
        vin = qin + TOK * K * 2;
        pairs = vin + (TOK * R * 2 + 15) / 16 * 16;
        bytes = pairs + (PREPARES ? (int64_t)C * 16 : 0);
    }
};

__device__ __forceinline__ uint32_t shared_address(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void barrier_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t *bar)
{
    asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(shared_address(bar)) : "memory");
}
/* sm_90: adds `bytes` to what the barrier's current phase waits for, and copies `bytes` (a multiple of
 * 16, both addresses 16-byte aligned) from global to shared memory with the bulk-copy engine,
 * counting them off on `bar` when they land. */
__device__ __forceinline__ void barrier_expect_bytes(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(void *shared_dst, const void *global_src, uint32_t bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     shared_address(shared_dst)),
                 "l"(global_src), "r"(bytes), "r"(shared_address(bar))
                 : "memory");
#endif
}
/* Arrives when every cp.async this thread has issued so far has landed (counted in the init). */
__device__ __forceinline__ void barrier_arrive_after_copies(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
/* Waits for the phase of parity `parity` to complete. try_wait (sm_90) suspends the thread in hardware
 * until the phase completes or a time limit passes; older targets poll with a short sleep. Either way
 * the waiting warps leave the issue slots and the shared-memory pipe to the producer's copies. */
__device__ __forceinline__ void barrier_wait(uint64_t *bar, unsigned parity)
{
    uint32_t done;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(shared_address(bar)), "r"(parity)
                     : "memory");
    } while (!done);
#else
    for (;;) {
        asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(shared_address(bar)), "r"(parity)
                     : "memory");
        if (done) break;
        __nanosleep(32);
    }
#endif
}

/* Consumer group g's (0 or 1) WARPS warps meet (named barriers 1 and 2: 0 is __syncthreads'; constant
 * ids, so that the kernel reserves only those). */
template <int WARPS> __device__ __forceinline__ void group_barrier(int g)
{
    if (g == 0) asm volatile("bar.sync 1, %0;\n" ::"n"(WARPS * 32) : "memory");
    else asm volatile("bar.sync 2, %0;\n" ::"n"(WARPS * 32) : "memory");
}

/* A CTA's walk over work items blockIdx.x, blockIdx.x + gridDim.x, ... of the grid's (row i, value
 * head, tile) items, the coordinates carried from item to item without a division. */
struct item_walk {
    int i, head, tile, step_i, step_head, step_tile;
    __device__ item_walk(int start, int step, int HV, int tiles)
    {
        tile = start % tiles, head = start / tiles % HV, i = start / tiles / HV;
        step_tile = step % tiles, step_head = step / tiles % HV, step_i = step / tiles / HV;
    }
    __device__ __forceinline__ void next(int HV, int tiles)
    {
        tile += step_tile;
        const int carry = tile >= tiles;
        if (carry) tile -= tiles;
        head += step_head + carry;
        i += step_i;
        if (head >= HV) head -= HV, i++;
    }
};

/* A consumer group's walk: units blockIdx.x + (g + GROUPS k) gridDim.x, k = 0, 1, ... of the grid's units,
 * a unit one (row, value head, tile) item, or with runs a (row, value head) whose tiles come in a row. */
struct group_walk {
    item_walk at;
    int tile, run;
    __device__ group_walk(int start, int step, int HV, int tiles, bool runs)
        : at(start, step, HV, runs ? 1 : tiles), tile(runs ? 0 : at.tile), run(runs ? tiles : 0)
    {
    }
    __device__ __forceinline__ void next(int HV, int tiles)
    {
        if (run) {
            if (++tile == run) tile = 0, at.next(HV, 1);
        } else {
            at.next(HV, tiles), tile = at.tile;
        }
    }
};

/* header ints; kind: 0 padding, 1 out of range, 2 a row; a decode's record count and write-back flag */
enum { ITEM_READ, ITEM_WRITE, ITEM_KIND, ITEM_COUNT, ITEM_FLUSH };

/* A write-back in the MMA form's layout: rows rowA and rowB of `to` become decay S0 + sum_{m < entries}
 * coef(m, row) k_row(m) over the lane's 8 columns of each 32, CHUNK 32-column groups a pass (what
 * fits in registers beside the caller's live values). */
template <int K, int CHUNK, typename I, typename Coef, typename KRow>
__device__ __forceinline__ void write_back_mma_rows(const unsigned char *tile_s, int rowA, int rowB, int qt, float decay, int entries,
                                                    Coef coef, KRow k_row, __nv_bfloat16 *to)
{
    using S = __nv_bfloat16;
    constexpr int PITCH = K * 2;
#pragma unroll 1
    for (int c0 = 0; c0 < K / 32; c0 += CHUNK) {
        float xa[CHUNK][8], xb[CHUNK][8];
#pragma unroll
        for (int c = 0; c < CHUNK; c++) {
            const int col = (c0 + c) * 32 + qt * 8;
            gdn__load_vec<S, 8>(reinterpret_cast<const S *>(tile_s + rowA * PITCH) + col, xa[c]);
            gdn__load_vec<S, 8>(reinterpret_cast<const S *>(tile_s + rowB * PITCH) + col, xb[c]);
#pragma unroll
            for (int e = 0; e < 8; e++) xa[c][e] *= decay, xb[c][e] *= decay;
        }
        for (int m = 0; m < entries; m++) {
            const float ca = coef(m, rowA), cb = coef(m, rowB);
            const I *km = k_row(m);
#pragma unroll
            for (int c = 0; c < CHUNK; c++) {
                float kv[8];
                gdn__load_vec<I, 8>(km + (c0 + c) * 32 + qt * 8, kv);
#pragma unroll
                for (int e = 0; e < 8; e++) xa[c][e] = fmaf(ca, kv[e], xa[c][e]), xb[c][e] = fmaf(cb, kv[e], xb[c][e]);
            }
        }
#pragma unroll
        for (int c = 0; c < CHUNK; c++) {
            const int col = (c0 + c) * 32 + qt * 8;
            gdn__store_vec<S, 8>(to + (int64_t)rowA * K + col, xa[c]);
            gdn__store_vec<S, 8>(to + (int64_t)rowB * K + col, xb[c]);
        }
    }
}

/* The same write-back on the tensor cores, for rows rowA and rowB (quad qg, place qt) and entries < 32:
 * A[row][m] = coef(m, row) as a bf16 pair hi + lo (each product then carries about 2^-17 of its
 * size, far below the bf16 state's rounding), B[m][col] = raw k_m[col] from krec_s (bf16, exact;
 * zero past `entries`, where the stage may hold stale bytes), the accumulator starting at decay S0;
 * an 8-column tile at a time. */
template <int K, typename I, typename Coef>
__device__ __forceinline__ void write_back_tensor_rows(const unsigned char *tile_s, int rowA, int rowB, int qg, int qt, float decay,
                                                       int entries, Coef coef, const I *krec_s, __nv_bfloat16 *to)
{
    static_assert(GDN_MAX_RING_LENGTH <= 32, "two k-steps of 16 entries");
    constexpr int PITCH = K * 2;
    const int ksteps = (entries + 15) / 16;
    uint32_t a_hi[2][4], a_lo[2][4];
#pragma unroll
    for (int ks = 0; ks < 2; ks++)
#pragma unroll
        for (int reg = 0; reg < 4; reg++) { /* a0..a3 of the m16n8k16 A fragment: rows rowA / rowB, entries m, m + 1 */
            const int m = ks * 16 + qt * 2 + (reg >> 1) * 8, row = reg & 1 ? rowB : rowA;
            const float x0 = m < entries ? coef(m, row) : 0.0f, x1 = m + 1 < entries ? coef(m + 1, row) : 0.0f;
            gdn__split_bf16x2(x0, x1, a_hi[ks][reg], a_lo[ks][reg]);
        }
    const unsigned short *k_bits = reinterpret_cast<const unsigned short *>(krec_s);
#pragma unroll 2
    for (int nt = 0; nt < K / 8; nt++) {
        const int col = nt * 8 + qt * 2; /* the accumulator's columns col, col + 1 */
        const float2 top = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(tile_s + rowA * PITCH + col * 2));
        const float2 bottom = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(tile_s + rowB * PITCH + col * 2));
        float acc[4] = {decay * top.x, decay * top.y, decay * bottom.x, decay * bottom.y};
        const int bcol = nt * 8 + qg; /* the B fragment's column */
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            if (ks >= ksteps) break;
            uint32_t b[2];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int m = ks * 16 + qt * 2 + half * 8;
                const uint32_t lo_bits = m < entries ? k_bits[m * K + bcol] : 0u, hi_bits = m + 1 < entries ? k_bits[(m + 1) * K + bcol] : 0u;
                b[half] = lo_bits | hi_bits << 16;
            }
            gdn__mma_bf16_m16n8k16(acc, a_hi[ks][0], a_hi[ks][1], a_hi[ks][2], a_hi[ks][3], b[0], b[1]);
            gdn__mma_bf16_m16n8k16(acc, a_lo[ks][0], a_lo[ks][1], a_lo[ks][2], a_lo[ks][3], b[0], b[1]);
        }
        *reinterpret_cast<__nv_bfloat162 *>(to + (int64_t)rowA * K + col) = __floats2bfloat162_rn(acc[0], acc[1]);
        *reinterpret_cast<__nv_bfloat162 *>(to + (int64_t)rowB * K + col) = __floats2bfloat162_rn(acc[2], acc[3]);
    }
}

/* A consumer warp's part of an item in the MMA form: state rows warp * 16 + (0..15) of the tile (warp:
 * its place in its group; leader: the group's first thread). A quad of lanes (qg = lane / 4) holds
 * rows rowA = warp * 16 + qg and rowB = rowA + 8 (tile_times_columns). B's column 0 is the token's
 * raw k, column 1 its raw q, the rest zero: the quad's lane 0 gets S0.k and S0.q of both rows, the others zeros, and the
 * records' terms (record j on lane j mod 4) join them in one quad sum. */
template <int K, typename I, typename O, typename Lay>
__device__ __forceinline__ void consume_mma(const gdn__layer_params &p, const unsigned char *stage, const Lay &lay, const float *prep,
                                            int kind, int head, int tile, int64_t out_base, int warp, int lane, bool leader)
{
    using S = __nv_bfloat16;
    constexpr int R = Lay::R, US = Lay::U_STRIDE;
    const int qg = lane >> 2, qt = lane & 3;
    const int rowA = warp * 16 + qg, rowB = rowA + 8;
    const int V = p.V, C = p.ring_capacity;
    O *out = static_cast<O *>(p.out);
    if (kind != 2) {
        if (kind == 1 && p.error_flag && leader) *p.error_flag = 1;
        if (qt < 2) out[out_base + tile * R + (qt == 0 ? rowA : rowB)] = gdn__from_f32<O>(0.0f);
        return;
    }
    const int64_t w = reinterpret_cast<const int *>(stage)[ITEM_WRITE];
    const int stride = lay.coef_stride;
    const float *fk = prep + PREP_HEADER, *ck = fk + stride, *cq = ck + stride;
    const float *u_s = reinterpret_cast<const float *>(stage + lay.u);
    const I *k_s = reinterpret_cast<const I *>(stage + lay.kin), *q_s = reinterpret_cast<const I *>(stage + lay.qin);
    const I *v_s = reinterpret_cast<const I *>(stage + lay.vin);
    const unsigned char *tile_s = stage + lay.tile;
    const int h = (int)prep[PREP_COUNT];
    const bool flush = prep[PREP_FLUSH] != 0.0f;

    float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    const I *column = qg == 0 ? k_s : q_s;
    tile_times_columns<K>(tile_s, rowA, rowB, qt, 1,
                          [&](int, int col) { return qg < 2 ? *reinterpret_cast<const uint4 *>(column + col) : make_uint4(0u, 0u, 0u, 0u); },
                          acc);
    const float c0k = prep[PREP_C0K], c0q = prep[PREP_C0Q];
    float ka = c0k * acc[0][0], qa = c0q * acc[0][1], kb = c0k * acc[0][2], qb = c0q * acc[0][3];
    for (int j = qt; j < h; j += 4) {
        const float ckj = ck[j], cqj = cq[j], ua = u_s[j * US + rowA], ub = u_s[j * US + rowB];
        ka = fmaf(ckj, ua, ka), qa = fmaf(cqj, ua, qa), kb = fmaf(ckj, ub, kb), qb = fmaf(cqj, ub, qb);
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        ka += __shfl_xor_sync(0xffffffffu, ka, off), qa += __shfl_xor_sync(0xffffffffu, qa, off);
        kb += __shfl_xor_sync(0xffffffffu, kb, off), qb += __shfl_xor_sync(0xffffffffu, qb, off);
    }

    const float g = prep[PREP_DECAY], beta = prep[PREP_BETA], kq = prep[PREP_KQ];
    const float u_top = beta * (gdn__to_f32(v_s[rowA]) - g * ka), u_bottom = beta * (gdn__to_f32(v_s[rowB]) - g * kb);
    if (qt < 2) {
        const int row = tile * R + (qt == 0 ? rowA : rowB);
        const float u = qt == 0 ? u_top : u_bottom;
        out[out_base + row] = gdn__from_f32<O>(fmaf(kq, u, qt == 0 ? qa : qb));
        if (!flush) {
            const int64_t record_bytes = gdn__ring_record_bytes(p.HK, p.HV, K, V), u_offset = gdn__ring_u_offset(p.HK, p.HV, K);
            float *u_record = reinterpret_cast<float *>(static_cast<char *>(p.ring) + (w * C + h) * record_bytes + u_offset);
            u_record[(int64_t)head * V + row] = u;
        }
    }
    if (!flush) return;

    /* Write-back: S_{h+1} = exp(P_h) S0 + sum_{m <= h} fk[m] u_m raw_k_m (entry h the token's own), 64
     * columns a pass (no spills). */
    const I *krec_s = reinterpret_cast<const I *>(stage + lay.krec);
    write_back_mma_rows<K, (K < 64 ? K / 32 : 2), I>(
        tile_s, rowA, rowB, qt, prep[PREP_DECAY_ALL], h + 1,
        [&](int m, int row) { return fk[m] * (m < h ? u_s[m * US + row] : row == rowA ? u_top : u_bottom); },
        [&](int m) { return m < h ? krec_s + m * K : k_s; },
        static_cast<S *>(p.state) + w * p.slot_stride + ((int64_t)head * V + tile * R) * K);
}

/* The verify's consumer (a chain of T = 2..8 tokens, records base..base+T-1 appended; semantics as the
 * one-kernel step's verify), from the group's token blocks: token t's is a decode's preparation over
 * the h records and then tokens 0..t-1 (prepare_decode). The MMA's B columns are k_1 q_1 k_2 q_2 ...
 * (a second n-tile for tokens 4..7), so lane qt of a quad holds S0.k_t and S0.q_t of both its rows
 * for tokens t = qt and qt + 4. Each lane adds its tokens' records' terms; then the quad runs the
 * tokens in order, the owner of token t forming u_t (both rows) and the quad receiving it by
 * shuffles, each lane adding the own tokens' terms of its tokens. A row that does not fit, or forks,
 * writes S_h back (records only), and its tokens become records 0..T-1 over records that the row's
 * other items may still stage: the row's last item to finish writes their k and pairs and moves the
 * count (the u are the item's own rows, staged before it began). */
template <int K, typename I, typename O, typename Lay>
__device__ __forceinline__ void consume_mma_verify(const gdn__layer_params &p, const unsigned char *stage, const Lay &lay, const float *blocks,
                                                   int kind, int64_t i, int head, int tile, int64_t out_base, int warp, int lane, bool leader)
{
    using S = __nv_bfloat16;
    constexpr int R = Lay::R, US = Lay::U_STRIDE, TM = Lay::TOKENS, NT = (TM + 3) / 4; /* n-tiles of 4 tokens */
    const int qg = lane >> 2, qt = lane & 3, quad0 = lane & ~3;
    const int rowA = warp * 16 + qg, rowB = rowA + 8;
    const int V = p.V, C = p.ring_capacity, T = p.T, HV = p.HV, HK = p.HK;
    const int64_t out_tok = p.out_strides.token;
    O *out = static_cast<O *>(p.out);
    if (kind != 2) {
        if (kind == 1 && p.error_flag && leader) *p.error_flag = 1;
        for (int t = qt; t < T; t += 4) {
            out[out_base + t * out_tok + tile * R + rowA] = gdn__from_f32<O>(0.0f);
            out[out_base + t * out_tok + tile * R + rowB] = gdn__from_f32<O>(0.0f);
        }
        return;
    }
    const int *header = reinterpret_cast<const int *>(stage);
    const int64_t w = header[ITEM_WRITE];
    const int h = header[ITEM_COUNT];
    const bool flush = header[ITEM_FLUSH] != 0;
    const int base = flush ? 0 : h;
    const int CS = lay.coef_stride, BF = lay.block_floats;
    const float *u_s = reinterpret_cast<const float *>(stage + lay.u);
    const I *k_s = reinterpret_cast<const I *>(stage + lay.kin), *q_s = reinterpret_cast<const I *>(stage + lay.qin);
    const I *v_s = reinterpret_cast<const I *>(stage + lay.vin);
    const unsigned char *tile_s = stage + lay.tile;

    /* S0 rows times the tokens' raw k and q: n-tile nt holds tokens 4 nt .. 4 nt + 3. */
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    tile_times_columns<K>(tile_s, rowA, rowB, qt, (T + 3) / 4,
                          [&](int nt, int col) {
                              const int t = nt * 4 + qg / 2; /* B column qg: token t's k (even) or q (odd) */
                              return t < T ? *reinterpret_cast<const uint4 *>((qg & 1 ? q_s : k_s) + t * K + col) : make_uint4(0u, 0u, 0u, 0u);
                          },
                          acc);

    /* The lane's tokens (qt, qt + 4): S0 terms and the records' terms. */
    float ka[NT], qa[NT], kb[NT], qb[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int t = nt * 4 + qt;
        ka[nt] = qa[nt] = kb[nt] = qb[nt] = 0.0f;
        if (t >= T) continue;
        const float *blk = blocks + t * BF, *ck = blk + PREP_HEADER + CS, *cq = ck + CS;
        const float c0k = blk[PREP_C0K], c0q = blk[PREP_C0Q];
        ka[nt] = c0k * acc[nt][0], qa[nt] = c0q * acc[nt][1], kb[nt] = c0k * acc[nt][2], qb[nt] = c0q * acc[nt][3];
        for (int j = 0; j < h; j++) {
            const float ckj = ck[j], cqj = cq[j], ua = u_s[j * US + rowA], ub = u_s[j * US + rowB];
            ka[nt] = fmaf(ckj, ua, ka[nt]), qa[nt] = fmaf(cqj, ua, qa[nt]), kb[nt] = fmaf(ckj, ub, kb[nt]), qb[nt] = fmaf(cqj, ub, qb[nt]);
        }
    }

    /* The tokens in order: u_t from its owner lane (quad place t % 4) to the whole quad; token t's own
     * earlier tokens are its records h + t2. */
    float u_top[TM], u_bottom[TM], own_top[NT], own_bottom[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) own_top[nt] = own_bottom[nt] = 0.0f;
#pragma unroll
    for (int t = 0; t < TM; t++) {
        if (t >= T) break;
        const int nt = t / 4;
        const float *blk = blocks + t * BF, *ck_own = blk + PREP_HEADER + CS + h;
        float sk_a = ka[nt], sk_b = kb[nt];
#pragma unroll
        for (int t2 = 0; t2 < t; t2++) {
            const float c = ck_own[t2];
            sk_a = fmaf(c, u_top[t2], sk_a), sk_b = fmaf(c, u_bottom[t2], sk_b);
        }
        const float g = blk[PREP_DECAY], beta = blk[PREP_BETA];
        const float ua = beta * (gdn__to_f32(v_s[t * R + rowA]) - g * sk_a), ub = beta * (gdn__to_f32(v_s[t * R + rowB]) - g * sk_b);
        if (qt == t % 4) own_top[nt] = ua, own_bottom[nt] = ub;
        u_top[t] = __shfl_sync(0xffffffffu, ua, quad0 + t % 4);
        u_bottom[t] = __shfl_sync(0xffffffffu, ub, quad0 + t % 4);
    }

    /* Outputs and the tokens' u records (the owner of each token). */
    const int64_t record_bytes = gdn__ring_record_bytes(HK, HV, K, V), u_offset = gdn__ring_u_offset(HK, HV, K);
    char *ring_w = static_cast<char *>(p.ring) + w * C * record_bytes;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int t = nt * 4 + qt;
        if (t >= T) continue;
        const float *blk = blocks + t * BF, *cq_own = blk + PREP_HEADER + 2 * CS + h;
        const float kq = blk[PREP_KQ];
        float oa = fmaf(kq, own_top[nt], qa[nt]), ob = fmaf(kq, own_bottom[nt], qb[nt]);
#pragma unroll
        for (int t2 = 0; t2 < TM; t2++) {
            if (t2 >= t) break;
            const float c = cq_own[t2];
            oa = fmaf(c, u_top[t2], oa), ob = fmaf(c, u_bottom[t2], ob);
        }
        out[out_base + t * out_tok + tile * R + rowA] = gdn__from_f32<O>(oa);
        out[out_base + t * out_tok + tile * R + rowB] = gdn__from_f32<O>(ob);
        float *u_record = reinterpret_cast<float *>(ring_w + (base + t) * record_bytes + u_offset) + (int64_t)head * V + tile * R;
        u_record[rowA] = own_top[nt];
        u_record[rowB] = own_bottom[nt];
    }
    if (!flush) return;

    /* S_h = exp(P_{h-1}) S0 + sum_{m < h} fk[m] u_m raw_k_m (token 0's block), written to slot w, on the
     * tensor cores. */
    const I *krec_s = reinterpret_cast<const I *>(stage + lay.krec);
    const float *fk = blocks + PREP_HEADER;
    write_back_tensor_rows<K, I>(tile_s, rowA, rowB, qg, qt, blocks[PREP_DECAY_ALL], h, [&](int m, int row) { return fk[m] * u_s[m * US + row]; },
                                 krec_s, static_cast<S *>(p.state) + w * p.slot_stride + ((int64_t)head * V + tile * R) * K);

    /* The row's last item (its group's first warp) writes the tokens as records 0..T-1 and moves the
     * count to 0. */
    if (warp == 0) {
        unsigned last = 0;
        if (lane == 0) last = atomicAdd(&p.arrivals[i], 1u) + 1u == (unsigned)(HV * (V / R));
        if (__shfl_sync(0xffffffffu, last, 0)) {
            __threadfence();
            write_input_records<K, I>(p, i, ring_w, record_bytes, 0, T, lane, 32);
            if (lane == 0) p.ring_count[w] = 0, p.arrivals[i] = 0;
        }
    }
}

template <int K, typename S, typename I, typename O, bool MMA, int TOK>
__global__ void __launch_bounds__(STREAM_THREADS(stream_groups<MMA>()), STREAM_CTAS_PER_SM)
    ring_decode_stream_kernel(const gdn__layer_params p, int stages, bool runs, bool speculate)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Lay = stream_layout<K, S, MMA, TOK>;
    static_assert(TOK == 1 || MMA, "the verify runs the tensor-core form only");
    static_assert(!MMA || (std::is_same<S, __nv_bfloat16>::value && std::is_same<I, __nv_bfloat16>::value), "bf16 MMA");
    using Geo = typename Lay::Geo;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT, R = Lay::R;
    constexpr uint32_t TILE_BYTES = R * K * sizeof(S), U_BYTES = R * 4, K_BYTES = K * 2;
    static_assert(sizeof(I) == 2, "2-byte inputs");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t full[STREAM_MAX_STAGES], empty[STREAM_MAX_STAGES];

    const int C = p.ring_capacity, HV = p.HV, HK = p.HK, V = p.V;
    const Lay lay(C);
    const int tiles = V / R, row_items = HV * tiles;
    constexpr int GROUPS = stream_groups<MMA>();
    /* runs: a group takes a (row, value head)'s tiles in a row (group_walk), on the grids
     * launch_stream_as names */
    const int run = runs ? tiles : 1;
    const int units = p.B * (runs ? HV : row_items); /* < 2^31: B <= 65535, HV * V <= 2^20 */
    const int my_units = units > (int)blockIdx.x ? (units - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    /* group g's items, and the (row, value head) of its k-th */
    const auto group_items = [&](int g) { return (my_units > g ? (my_units - g + GROUPS - 1) / GROUPS : 0) * run; };
    const auto pair_of = [&](int g, int k) {
        const int unit = (int)blockIdx.x + (g + GROUPS * (k / run)) * (int)gridDim.x;
        return runs ? unit : unit / tiles;
    };
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t record_bytes = gdn__ring_record_bytes(HK, HV, K, V), u_offset = gdn__ring_u_offset(HK, HV, K);
    const int prep_floats = gdn__ring_prep_floats(C); /* what a preparation kernel wrote (forms that do not prepare) */
    const int T = TOK > 1 ? p.T : 1;
    /* Phase trace (-Dphase_trace=true): start, issued / waited / inputs by group 0's producer (the
     * first stages' copies, past the wait, the first item's tokens), conv / prepared / set 0 by
     * consumer thread 0 (its first stage landed, its tokens prepared, its first item done). */
    GDN__PHASE_BEGIN();

    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) barrier_init(&full[s], 33), barrier_init(&empty[s], Lay::GROUP_WARPS * 32);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= STREAM_CONSUMER_WARPS) {
        /* Producer of consumer group pg: the group's items (group_walk) into that group's stages. Lane
         * j holds the slots (and, after the wait, the record count and write-back flag) of its item
         * k0 + j; units are shared round-robin over the grid. */
        const int pg = warp - STREAM_CONSUMER_WARPS;
        const int my_count = group_items(pg);
        int batch_r = -1, batch_w = -1, batch_h = 0, batch_flush = 0, batch_kind = 0;
        const auto load_slots = [&](int k0) {
            const int k = k0 + lane;
            batch_kind = 0, batch_r = -1, batch_w = -1;
            if (k < my_count) {
                const int i = pair_of(pg, k) / HV;
                batch_r = p.read_slots[i];
                batch_w = p.write_slots ? p.write_slots[i] : batch_r;
                batch_kind = batch_r < 0 ? 0 : gdn__row_slots_invalid(batch_r, batch_w, p.num_slots) ? 1 : 2;
            }
        };
        const auto load_counts = [&](int k0) {
            const int k = k0 + lane;
            batch_h = 0, batch_flush = 0;
            if (k < my_count && batch_kind == 2) { /* the rules of gdn_kernel_params.h's "Ring strategy" */
                batch_h = min(max(p.ring_count[batch_r], 0), C);
                batch_flush = batch_r != batch_w || (TOK > 1 ? batch_h + T > C : batch_h + 1 >= p.ring_length);
            }
        };
        const auto copy_state = [&](int head, int tile, int r, unsigned char *stage, uint64_t *bar) {
            if (lane != 0) return;
            barrier_expect_bytes(bar, TILE_BYTES);
            bulk_copy(stage + lay.tile, static_cast<const S *>(p.state) + r * p.slot_stride + ((int64_t)head * V + tile * R) * K,
                      TILE_BYTES, bar);
        };
        /* The item's tokens: k and q (lanes 1..2T, T of each) and v (cp.async, counted by the lanes'
         * barrier_arrive_after_copies). */
        const auto copy_tokens = [&](int i, int head, int tile, unsigned char *stage, uint64_t *bar) {
            const int kh = head / (HV / HK);
            if (lane == 0) barrier_expect_bytes(bar, 2 * T * K_BYTES);
            __syncwarp();
            if (lane >= 1 && lane <= 2 * T) { /* lanes 1..T: the tokens' k, T+1..2T: their q */
                const int t = (lane - 1) % T;
                if (lane <= T) bulk_copy(stage + lay.kin + t * K_BYTES, static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh), K_BYTES, bar);
                else bulk_copy(stage + lay.qin + t * K_BYTES, static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh), K_BYTES, bar);
            }
            for (int c = lane; c < T * R / 2; c += 32) {
                const int t = c / (R / 2);
                const char *v_in = reinterpret_cast<const char *>(static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, t, head) + tile * R);
                gdn__copy_async4(stage + lay.vin + t * R * 2 + c % (R / 2) * 4, v_in + c % (R / 2) * 4);
            }
        };

        /* Records 0..n-1 of slot r's ring for an item: their u (the tile's rows), and k (the key
         * head's) and pair (the 16 bytes holding the head's) where asked. */
        const auto copy_records = [&](int head, int tile, int r, int n, bool with_k, unsigned char *stage, uint64_t *bar) {
            if (lane == 0) barrier_expect_bytes(bar, n * (U_BYTES + (with_k ? K_BYTES : 0)));
            __syncwarp();
            if (lane < n) {
                const char *record = static_cast<const char *>(p.ring) + ((int64_t)r * C + lane) * record_bytes;
                bulk_copy(stage + lay.u + lane * Lay::U_STRIDE * 4, record + u_offset + ((int64_t)head * V + tile * R) * 4, U_BYTES, bar);
                if (with_k) bulk_copy(stage + lay.krec + lane * K_BYTES, record + head / (HV / HK) * K_BYTES, K_BYTES, bar);
                if (Lay::PREPARES)
                    gdn__copy_async16(stage + lay.pairs + lane * 16, record + gdn__ring_norm_decay_offset(HK, K) + head / 2 * 16);
            }
        };

        load_slots(0);
        /* Every form reads the record counts before the wait: like the records, they are not written by
         * the preceding kernel (the workspace: gdn_op.h's overlap_preceding; in the engine a commit is
         * followed by the next step's fetch, which its first layer waits for), and the pass itself moves
         * them, once every item's producer has read them. The forms after a preparation kernel read
         * them first, to stage the first items' records. */
        if constexpr (!Lay::PREPARES) load_counts(0);
        const int per_group = stages / GROUPS; /* the group's stages: pg, pg + GROUPS, ... */
        const int first = my_count < per_group ? my_count : per_group;
        /* speculate (grids of at most an item an SM, where the step is a chain of latencies): the
         * tensor-core form copies every record of the ring with the state tile, not only the
         * count's (read below): records are not written by the preceding kernel, and those past
         * the count are not used. */
        const bool speculate_records = Lay::PREPARES && speculate && my_count <= per_group;
        group_walk at((int)blockIdx.x + pg * (int)gridDim.x, GROUPS * (int)gridDim.x, HV, tiles, runs);
        /* The forms after a preparation kernel stage the first items' records and tokens here too: that
         * kernel lets this one launch only after its own wait, so the kernel before it, which wrote
         * the tokens, has ended; only the preparation's blocks wait. */
        constexpr bool TOKENS_FIRST = !Lay::PREPARES;
        for (int k = 0; k < first; k++, at.next(HV, tiles)) {
            const int r = __shfl_sync(0xffffffffu, batch_r, k);
            const int st = pg + GROUPS * k;
            if (__shfl_sync(0xffffffffu, batch_kind, k) == 2) {
                copy_state(at.at.head, at.tile, r, smem + st * lay.bytes, &full[st]);
                if (speculate_records) copy_records(at.at.head, at.tile, r, C, true, smem + st * lay.bytes, &full[st]);
                if constexpr (TOKENS_FIRST) {
                    const int h = __shfl_sync(0xffffffffu, batch_h, k);
                    const bool flush = __shfl_sync(0xffffffffu, batch_flush, k) != 0;
                    copy_records(at.at.head, at.tile, r, h, flush, smem + st * lay.bytes, &full[st]);
                    copy_tokens(at.at.i, at.at.head, at.tile, smem + st * lay.bytes, &full[st]);
                }
            }
        }
        at = group_walk((int)blockIdx.x + pg * (int)gridDim.x, GROUPS * (int)gridDim.x, HV, tiles, runs);
        const bool traces = pg == 0 && lane == 0;
        if (traces) GDN__PHASE_BY(GDN__PHASE_ISSUED);
        if constexpr (Lay::PREPARES) load_counts(0);
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
        if (traces) GDN__PHASE_BY(GDN__PHASE_WAITED);

        for (int it = 0, s = pg, use = 0; it < my_count;
             it++, at.next(HV, tiles), s += GROUPS, use += s >= stages, s -= s >= stages ? stages : 0) {
            const int j = it % 32;
            if (j == 0 && it > 0) load_slots(it), load_counts(it);
            unsigned char *stage = smem + s * lay.bytes;
            const int r = __shfl_sync(0xffffffffu, batch_r, j), w = __shfl_sync(0xffffffffu, batch_w, j);
            const int kind = __shfl_sync(0xffffffffu, batch_kind, j);
            const int h = __shfl_sync(0xffffffffu, batch_h, j);
            const bool flush = __shfl_sync(0xffffffffu, batch_flush, j) != 0;
            if (use > 0) {
                barrier_wait(&empty[s], (unsigned)(use - 1) & 1);
                if (kind == 2) copy_state(at.at.head, at.tile, r, stage, &full[s]);
            }
            if (kind == 2 && Lay::PREPARES) {
                const int i = at.at.i, head = at.at.head, tile = at.tile, kh = head / (HV / HK);
                /* the tensor-core form prepares from every record's k and pair; it copies the tokens as
                 * copy_tokens does, but with their bytes expected first and no __syncwarp between
                 * (through copy_tokens it measured slower: bench/results/2026-11-28-h200-ring-prep-bubble.md) */
                if (lane == 0) barrier_expect_bytes(&full[s], 2 * T * K_BYTES);
                copy_records(head, tile, r, speculate_records ? 0 : h, true, stage, &full[s]);
                if (lane >= 1 && lane <= 2 * T) { /* lanes 1..T: the tokens' k, T+1..2T: their q */
                    const int t = (lane - 1) % T;
                    if (lane <= T) bulk_copy(stage + lay.kin + t * K_BYTES, static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh), K_BYTES, &full[s]);
                    else bulk_copy(stage + lay.qin + t * K_BYTES, static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh), K_BYTES, &full[s]);
                }
                for (int c = lane; c < T * R / 2; c += 32) {
                    const int t = c / (R / 2);
                    const char *v_in = reinterpret_cast<const char *>(static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, t, head) + tile * R);
                    gdn__copy_async4(stage + lay.vin + t * R * 2 + c % (R / 2) * 4, v_in + c % (R / 2) * 4);
                }
            } else if (kind == 2) {
                const int i = at.at.i, head = at.at.head, tile = at.tile;
                if (use > 0) { /* else staged before the wait; a write-back needs the records' k */
                    copy_records(head, tile, r, h, flush, stage, &full[s]);
                    copy_tokens(i, head, tile, stage, &full[s]);
                }
                if (lane == 0) {
                    barrier_expect_bytes(&full[s], (uint32_t)prep_floats * 4);
                    bulk_copy(stage + lay.prep, p.ring_prep + ((int64_t)i * HV + head) * prep_floats, prep_floats * 4, &full[s]);
                }
            }
            if (lane == 0) {
                int *header = reinterpret_cast<int *>(stage);
                header[ITEM_READ] = r, header[ITEM_WRITE] = w, header[ITEM_KIND] = kind, header[ITEM_COUNT] = h, header[ITEM_FLUSH] = flush;
                barrier_arrive(&full[s]);
            }
            barrier_arrive_after_copies(&full[s]);
            if (traces && it == 0) GDN__PHASE_BY(GDN__PHASE_INPUTS);
        }
        return;
    }

    /* Consumers. */
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    const int cgroup = warp / Lay::GROUP_WARPS, gwarp = warp % Lay::GROUP_WARPS; /* the group's walk: group_walk */
    const int group = lane / L, glane = lane % L;
    const int lrow0 = gwarp * Geo::ROWS_PER_WARP + group; /* the thread's rows in a tile: lrow0 + rt * G */
    const int stride = gdn__ring_prep_stride(C);
    O *out = static_cast<O *>(p.out);
    group_walk at((int)blockIdx.x + cgroup * (int)gridDim.x, GROUPS * (int)gridDim.x, HV, tiles, runs);
    const int my_count = group_items(cgroup);
    /* The preparation blocks after the stages (the tensor-core form): a decode's warp's own, or the
     * verify's group's token blocks; then the warp's scratch. */
    float *const blocks = reinterpret_cast<float *>(smem + stages * lay.bytes);
    float *const prep_blocks = blocks + (TOK > 1 ? cgroup * TOK : warp) * lay.block_floats;
    float *const scratch = blocks + Lay::BLOCKS * lay.block_floats + warp * lay.scratch_floats;
    /* stages is a multiple of GROUPS (launch_stream_as), so stage s serves one group only */
    for (int it = 0, s = cgroup, use = 0; it < my_count;
         it++, at.next(HV, tiles), s += GROUPS, use += s >= stages, s -= s >= stages ? stages : 0) {
        const unsigned char *stage = smem + s * lay.bytes;
        const int i = at.at.i, head = at.at.head, tile = at.tile, row0 = tile * R + lrow0;
        float own_a = 0.0f, own_b = 0.0f, A_log = 0.0f, dt_bias = 0.0f; /* a verify's: lane t's token t's */
        const bool prepare = Lay::PREPARES && (tile == 0 || !runs); /* a run's first tile prepares for the others */
        if (prepare) { /* the tokens' gate inputs and the head's parameters, loaded beside the wait */
            const int t = TOK > 1 ? lane : 0;
            if (t < T) {
                own_a = gdn__to_f32(static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, head)]);
                own_b = gdn__to_f32(static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, t, head)]);
            }
            A_log = p.A_log[head], dt_bias = p.dt_bias[head];
        }
        barrier_wait(&full[s], (unsigned)use & 1);
        if (it == 0) GDN__PHASE(GDN__PHASE_CONV);
        const int *header = reinterpret_cast<const int *>(stage);
        const int kind = header[ITEM_KIND];
        /* The forms after a preparation kernel: the row moves its count once its last item has begun
         * (every item's producer and the preparation kernel have read it by then); the add is issued
         * here and its result used after the stage is released, so that its latency stays off the
         * pass. The tensor-core decode: once its last item has finished (measured faster there). */
        const bool counts_in = !Lay::PREPARES && kind == 2 && gwarp == 0 && lane == 0;
        unsigned arrival = 0;
        int count_slot = 0, next_count = 0;
        if (counts_in) {
            arrival = atomicAdd(&p.arrivals[i], 1u);
            count_slot = header[ITEM_WRITE], next_count = header[ITEM_FLUSH] ? 0 : header[ITEM_COUNT] + 1;
        }
        const int64_t out_base = gdn__at(p.out_strides, i, 0, head);
        if constexpr (Lay::PREPARES) {
            if (kind == 2 && prepare) {
                const int h = header[ITEM_COUNT];
                const bool flush = header[ITEM_FLUSH] != 0;
                const I *krec_s = reinterpret_cast<const I *>(stage + lay.krec), *kin_s = reinterpret_cast<const I *>(stage + lay.kin);
                const unsigned char *pairs_s = stage + lay.pairs;
                const int CS = lay.coef_stride;
                const float own_l = token_log_decay(own_a, expf(A_log), dt_bias); /* a verify's: lane t's token t's */
                /* the row's first tile appends the records (a decode's by the group's first warp) */
                char *const ring_w = tile == 0 && !flush ? static_cast<char *>(p.ring) + (int64_t)header[ITEM_WRITE] * C * record_bytes : nullptr;
                const auto prepare_token = [&](int t, float *prep, auto rec_k, auto rec_pair, char *append) {
                    prepare_decode<K, I, 32, true, (TOK > 1)>(
                        p, lane, head, kin_s + t * K, reinterpret_cast<const I *>(stage + lay.qin) + t * K,
                        [&](int &count, bool &f, int &stored) { count = h + t, f = flush, stored = h; }, rec_k, rec_pair,
                        [&] { return TOK > 1 ? __shfl_sync(0xffffffffu, own_l, t) : own_l; },
                        TOK > 1 ? __shfl_sync(0xffffffffu, own_b, t) : own_b, append, prep, CS, prep + PREP_HEADER + CS,
                        prep + PREP_HEADER + 2 * CS, prep + PREP_HEADER, scratch, [] { __syncwarp(); });
                    __syncwarp();
                };
                const auto record_pair = [&](int j) { return reinterpret_cast<const float2 *>(pairs_s + j * 16)[head % 2]; };
                if constexpr (TOK == 1) { /* each warp into its own block: no barrier with the others */
                    prepare_token(0, prep_blocks, [&](int j) { return krec_s + j * K; }, record_pair, gwarp == 0 ? ring_w : nullptr);
                } else {
                    /* The group's warps share the tokens (token t is a decode over the records and tokens
                     * 0..t-1, rows h.. of its m-tiles from the staged tokens' k); first they wait until
                     * the whole group is done with the previous run's blocks. */
                    group_barrier<Lay::GROUP_WARPS>(cgroup);
                    /* the earlier tokens' log decays for entries j = lane and lane + 32 (lanes >= h) */
                    const float entry_l0 = __shfl_sync(0xffffffffu, own_l, (lane - h) & 31);
                    const float entry_l1 = __shfl_sync(0xffffffffu, own_l, (lane + 32 - h) & 31);
                    const auto entry_k = [&](int j) { return j < h ? krec_s + j * K : j < h + T ? kin_s + (j - h) * K : krec_s + (j & 15) * K; };
                    /* (an own entry's norm scale is formed by prepare_decode) */
                    const auto entry_pair = [&](int j) { return j < h ? record_pair(j) : make_float2(0.0f, j < 32 ? entry_l0 : entry_l1); };
                    /* One token a warp: one call, not a loop (a loop here costs the item loop registers:
                     * spills). Two: a loop (measured faster than two calls). */
                    if constexpr (TOK <= Lay::GROUP_WARPS) {
                        if (gwarp < T) prepare_token(gwarp, prep_blocks + gwarp * lay.block_floats, entry_k, entry_pair, ring_w);
                    } else {
                        for (int t = gwarp; t < T; t += Lay::GROUP_WARPS)
                            prepare_token(t, prep_blocks + t * lay.block_floats, entry_k, entry_pair, ring_w);
                    }
                    group_barrier<Lay::GROUP_WARPS>(cgroup);
                }
            }
        }
        if (it == 0) GDN__PHASE(GDN__PHASE_PREPARED);
        if constexpr (MMA) {
            if constexpr (TOK > 1)
                consume_mma_verify<K, I, O, Lay>(p, stage, lay, prep_blocks, kind, i, head, tile, out_base, gwarp, lane, gwarp == 0 && lane == 0);
            else
                consume_mma<K, I, O, Lay>(p, stage, lay, prep_blocks, kind, head, tile, out_base, gwarp, lane, gwarp == 0 && lane == 0);
        } else if (kind != 2) {
            if (kind == 1 && p.error_flag && threadIdx.x == 0) *p.error_flag = 1;
            if (glane == 0)
#pragma unroll
                for (int rt = 0; rt < RT; rt++) out[out_base + row0 + rt * G] = gdn__from_f32<O>(0.0f);
        } else {
            const int64_t w = header[ITEM_WRITE];
            const float *prep = reinterpret_cast<const float *>(stage + lay.prep);
            const float *fk = prep + PREP_HEADER, *ck = fk + stride, *cq = ck + stride;
            const float *u_s = reinterpret_cast<const float *>(stage + lay.u);
            const I *k_s = reinterpret_cast<const I *>(stage + lay.kin), *q_s = reinterpret_cast<const I *>(stage + lay.qin);
            const I *v_s = reinterpret_cast<const I *>(stage + lay.vin);
            const S *tile_s = reinterpret_cast<const S *>(stage + lay.tile);
            float st[RT][NV][EV], kx[NV][EV], qx[NV][EV];
#pragma unroll
            for (int n = 0; n < NV; n++) {
                gdn__load_vec<I, EV>(k_s + (n * L + glane) * EV, kx[n]);
                gdn__load_vec<I, EV>(q_s + (n * L + glane) * EV, qx[n]);
            }
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int n = 0; n < NV; n++)
                    gdn__load_vec<S, EV>(tile_s + (lrow0 + rt * G) * K + (n * L + glane) * EV, st[rt][n]);
            const int h = (int)prep[PREP_COUNT];
            const bool flush = prep[PREP_FLUSH] != 0.0f;
            const auto u_at = [&](int j, int rt) { return u_s[j * Lay::U_STRIDE + lrow0 + rt * G]; };
            float dk[RT], dq[RT];
            row_terms<Geo>(st, kx, qx, prep, ck, cq, h, u_at, glane, dk, dq);
            row_sums<L, RT, true>(dk, dq);

            const float g = prep[PREP_DECAY], beta = prep[PREP_BETA], kq = prep[PREP_KQ];
            const int64_t record_base = w * C * record_bytes + h * record_bytes + u_offset;
            float *u_record = reinterpret_cast<float *>(static_cast<char *>(p.ring) + record_base) + (int64_t)head * V;
            float u_own[RT];
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                u_own[rt] = beta * (gdn__to_f32(v_s[lrow0 + rt * G]) - g * dk[rt]);
                if (glane == 0) {
                    out[out_base + row0 + rt * G] = gdn__from_f32<O>(fmaf(kq, u_own[rt], dq[rt]));
                    if (!flush) u_record[row0 + rt * G] = u_own[rt];
                }
            }
            if (flush) {
                const I *krec_s = reinterpret_cast<const I *>(stage + lay.krec);
                write_back_rows<Geo, I>(st, prep, fk, h, u_at, [&](int m) { return krec_s + m * K; }, u_own, kx, glane);
                store_rows<K, S, Geo, false>(static_cast<S *>(p.state) + w * p.slot_stride + (int64_t)head * V * K, st, 1.0f,
                                             row0, glane);
            }
        }
        if constexpr (Lay::PREPARES && TOK == 1) {
            /* The row's last item to finish moves the count: every item's producer has read it by then. */
            if (kind == 2 && gwarp == 0 && lane == 0) {
                if (atomicAdd(&p.arrivals[i], 1u) + 1u == (unsigned)row_items) {
                    p.ring_count[header[ITEM_WRITE]] = header[ITEM_FLUSH] ? 0 : header[ITEM_COUNT] + 1;
                    p.arrivals[i] = 0;
                }
            }
        }
        /* Every lane releases the stage after its own reads of it: with one lane releasing for the
         * warp after a __syncwarp, compute-sanitizer's racecheck does not see the order (it reports
         * every read of the stage against the producer's next writes; a two-warp probe of the
         * pattern shows the same, bench/results/2026-11-27-h100-ring-racecheck.md). */
        barrier_arrive(&empty[s]);
        if (it == 0) GDN__PHASE(GDN__PHASE_SET0);
        if (counts_in && arrival + 1u == (unsigned)row_items) {
            p.ring_count[count_slot] = next_count;
            p.arrivals[i] = 0;
        }
    }
    GDN__PHASE_FINISH();
#else
    __trap(); /* launched only where sm_90 code is loaded (stream_state_pass_applies) */
#endif
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* The preparation kernel's launch, THREADS threads a CTA: EARLY (the count read and the records sent
 * toward L2 before the wait) where its grid runs in one wave; on more waves the later CTAs start
 * after the preceding kernel, and a count read ahead of the token's loads measured slower there
 * (bench/results/2026-11-28-h100-ring-decode-narrow-prep.md). */
template <int K, typename I, int THREADS> static cudaError_t launch_prep(const gdn__layer_params *p, cudaStream_t stream)
{
    static std::atomic<uint64_t> occupancy_memo;
    const int64_t ctas = (int64_t)p->B * p->HV;
    const dim3 grid((unsigned)p->HV, (unsigned)p->B);
    const bool overlap = p->overlap_preceding != 0;
    if (gdn__in_one_wave(ring_decode_prep_kernel<K, I, THREADS, true>, THREADS, 0, ctas, occupancy_memo))
        return gdn__launch(ring_decode_prep_kernel<K, I, THREADS, true>, grid, dim3(THREADS), 0, stream, overlap, *p);
    return gdn__launch(ring_decode_prep_kernel<K, I, THREADS, false>, grid, dim3(THREADS), 0, stream, overlap, *p);
}

/* The streamed state pass's launch, after the preparation kernel its form reads (none for the
 * tensor-core decode): STREAM_CTAS_PER_SM CTAs an SM, as many stages as the shared memory of each
 * holds, up to STREAM_MAX_STAGES; GDN_ENOTSUP, having launched nothing, when fewer than two fit or the
 * tile does not divide V (the register state pass runs then). */
template <int K, typename S, typename I, typename O, bool MMA, int TOK = 1>
static gdn_status launch_stream_as(const gdn__layer_params *p, cudaStream_t stream)
{
    using Lay = stream_layout<K, S, MMA, TOK>;
    if (p->V % Lay::R != 0) return GDN_ENOTSUP;
    const Lay lay(p->ring_capacity);
    int device = 0, sms = 0, per_sm_bytes = 0, per_block_bytes = 0;
    GDN__CUDA_TRY(cudaGetDevice(&device));
    GDN__CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    GDN__CUDA_TRY(cudaDeviceGetAttribute(&per_sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    GDN__CUDA_TRY(cudaDeviceGetAttribute(&per_block_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    int reserved_bytes = 0;
    GDN__CUDA_TRY(cudaDeviceGetAttribute(&reserved_bytes, cudaDevAttrReservedSharedMemoryPerBlock, device));
    static const int64_t static_bytes = [] { /* the barriers; asked once (a conservative 1 KB if the query fails) */
        cudaFuncAttributes attributes;
        return cudaFuncGetAttributes(&attributes, ring_decode_stream_kernel<K, S, I, O, MMA, TOK>) == cudaSuccess
                   ? (int64_t)attributes.sharedSizeBytes
                   : (int64_t)1024;
    }();
    /* a CTA's share of the SM, less the runtime's reserve and the static shared memory */
    int64_t budget = per_sm_bytes / STREAM_CTAS_PER_SM - reserved_bytes - static_bytes;
    if (budget > per_block_bytes - static_bytes) budget = per_block_bytes - static_bytes;
    int64_t stages = (budget - lay.blocks_bytes) / lay.bytes;
    if (stages > STREAM_MAX_STAGES) stages = STREAM_MAX_STAGES;
    /* Each consumer group keeps to its own stages: a stage's phases must not be waited on by a group
     * that could run a whole phase ahead of the other group's use of it (parity waits). */
    stages -= stages % stream_groups<MMA>();
    if (stages < 2) return GDN_ENOTSUP;
    /* The tensor-core form's groups take whole (row, value head) runs (group_walk), so that a group
     * prepares once for a run's tiles instead of once a tile: a verify where there are more items
     * than groups (with no more, each group takes one item at most, and a run's tiles would wait on
     * one another), a decode, whose preparation costs less, where there is a run for each group. */
    const int64_t pairs = (int64_t)p->B * p->HV, items = pairs * (p->V / Lay::R);
    const int64_t groups = (int64_t)sms * STREAM_CTAS_PER_SM * stream_groups<MMA>();
    const bool runs = Lay::PREPARES && (TOK > 1 ? items > groups : pairs >= groups);
    const int64_t units = runs ? pairs : items;
    /* At most an item an SM: the producers copy every record before the wait, not only the count's
     * (more bytes, one dependent load fewer before the math). */
    const bool speculate = Lay::PREPARES && items <= sms;
    int64_t ctas = (int64_t)sms * STREAM_CTAS_PER_SM;
    if (ctas > units) ctas = units;
    const int smem = (int)(stages * lay.bytes + lay.blocks_bytes);
    static std::atomic<bool> opted_in[GDN__MAX_DEVICES];
    GDN__CUDA_TRY(gdn__opt_in_shared(ring_decode_stream_kernel<K, S, I, O, MMA, TOK>, (int)budget, opted_in));
    if constexpr (!Lay::PREPARES) {
        /* GDN_RING_PREP_NARROW=0 or 1: the 128-thread or the one-warp preparation on every grid (A/B runs) */
        static const int narrow_override = [] {
            const char *e = getenv("GDN_RING_PREP_NARROW");
            return !e ? -1 : e[0] == '1' ? 1 : e[0] == '0' ? 0 : -1;
        }();
        if (narrow_override >= 0 ? narrow_override == 1 : pairs >= GDN__RING_PREP_NARROW_MIN_HEADS)
            GDN__CUDA_TRY((launch_prep<K, I, PREP_THREADS_BESIDE_STREAM>(p, stream)));
        else
            GDN__CUDA_TRY((launch_prep<K, I, PREP_THREADS>(p, stream)));
    }
    GDN__CUDA_TRY(gdn__launch(ring_decode_stream_kernel<K, S, I, O, MMA, TOK>, dim3((unsigned)ctas), dim3(STREAM_THREADS(stream_groups<MMA>())), smem, stream,
                              p->overlap_preceding != 0, *p, (int)stages, runs, speculate));
    return GDN_OK;
}

/* Whether bf16 state with bf16 inputs takes the tensor-core form (GDN_RING_STREAM_MMA=0: never, for
 * A/B runs). */
static bool stream_mma_enabled()
{
    static const bool on = [] {
        const char *e = getenv("GDN_RING_STREAM_MMA");
        return !(e && e[0] == '0');
    }();
    return on;
}

/* Whether p's streamed pass takes the tensor-core form: bf16 state and inputs, the form's items divide
 * V, and it is not turned off (one rule for the launch and for the grid rule below). */
static bool stream_mma_applies(const gdn__layer_params *p)
{
    return p->state_dtype == GDN_DTYPE_BF16 && p->input_dtype == GDN_DTYPE_BF16 && stream_mma_enabled() &&
           p->V % stream_layout<128, __nv_bfloat16, true>::R == 0; /* R does not depend on K */
}

template <int K, typename S, typename I, typename O>
static gdn_status launch_stream(const gdn__layer_params *p, cudaStream_t stream)
{
    if constexpr (std::is_same<S, __nv_bfloat16>::value && std::is_same<I, __nv_bfloat16>::value) {
        if (stream_mma_applies(p)) {
            const gdn_status st = launch_stream_as<K, S, I, O, true>(p, stream);
            if (st != GDN_ENOTSUP) return st;
        }
    }
    return launch_stream_as<K, S, I, O, false>(p, stream);
}

/* The (row, value head) pairs for which a decode streams its state (the streamed pass): every grid
 * with bf16 state and bf16 inputs (the tensor-core form, which needs no preparation kernel), from
 * 1024 with other 2-byte cases, from 512 with fp32 state; elsewhere the register pass measured
 * faster (bench/results/2026-11-25-h100-ring-stream.md, bench/results/2026-11-25-h100-ring-stream-mma.md,
 * bench/results/2026-11-26-h100-ring-verify-prepares.md, bench/results/2026-11-28-h100-ring-decode-narrow-prep.md). */
#ifndef GDN__RING_STREAM_MIN_HEADS_MMA
#define GDN__RING_STREAM_MIN_HEADS_MMA 0
#endif
#ifndef GDN__RING_STREAM_MIN_HEADS_BF16
#define GDN__RING_STREAM_MIN_HEADS_BF16 1024
#endif
#ifndef GDN__RING_STREAM_MIN_HEADS_F32
#define GDN__RING_STREAM_MIN_HEADS_F32 512
#endif

/* Whether the streamed state pass runs: on the grids above, with sm_90 code (bulk copies), the
 * condition under which the library's kernels also overlap their launches. GDN_RING_STATE_PASS=tiles
 * (never) or =stream (every grid) overrides the grid rule, for A/B runs. */
static int stream_state_pass_override()
{
    static const int mode = [] {
        const char *e = getenv("GDN_RING_STATE_PASS");
        return !e ? 0 : strcmp(e, "tiles") == 0 ? -1 : strcmp(e, "stream") == 0 ? 1 : 0;
    }();
    return mode;
}

static bool stream_state_pass_applies(const gdn__layer_params *p)
{
    if (!gdn__overlap_supported()) return false;
    const int mode = stream_state_pass_override();
    if (mode != 0) return mode > 0;
    const int64_t pairs = (int64_t)p->B * p->HV;
    if (p->state_dtype == GDN_DTYPE_F32) return pairs >= GDN__RING_STREAM_MIN_HEADS_F32;
    return pairs >= (stream_mma_applies(p) ? GDN__RING_STREAM_MIN_HEADS_MMA : GDN__RING_STREAM_MIN_HEADS_BF16);
}

template <int K, typename S, typename I, typename O, int REGS>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    using Geo = layer_geometry<K, S, REGS, true>;
    const int warps = warps_for<Geo>(p, 1, GDN__SMALL_GRID_CTAS);
    if (p->V % (warps * Geo::ROWS_PER_WARP) != 0) return GDN_ENOTSUP;
    const bool overlap = p->overlap_preceding != 0;
    if (stream_state_pass_applies(p)) { /* with the preparation its form needs */
        const gdn_status streamed = launch_stream<K, S, I, O>(p, stream);
        if (streamed != GDN_ENOTSUP) {
            if (streamed != GDN_OK) return streamed;
            GDN__CUDA_TRY(gdn__cuda_launch_error());
            return GDN_OK;
        }
    }
    GDN__CUDA_TRY((launch_prep<K, I, PREP_THREADS>(p, stream)));
    const dim3 grid((unsigned)(p->HV * (p->V / (warps * Geo::ROWS_PER_WARP))), (unsigned)p->B);
    GDN__CUDA_TRY(gdn__launch(ring_decode_state_kernel<K, S, I, O, REGS>, grid, dim3(warps * 32), 0, stream, overlap, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* Whether a verify runs on the streamed tensor-core pass (which prepares its tokens itself): chains
 * of 2..GDN__RING_VERIFY_MAX_TOKENS tokens with bf16 state and inputs, K <= 128 (two stages fit at
 * every ring capacity), without the mixer (GDN_RING_VERIFY_STREAM=0: never). */
static bool verify_stream_applies(const gdn__layer_params *p)
{
    static const bool on = [] {
        const char *e = getenv("GDN_RING_VERIFY_STREAM");
        return !(e && e[0] == '0');
    }();
    return on && p->arrivals && p->deferred_verify && p->T >= 2 && p->T <= GDN__RING_VERIFY_MAX_TOKENS && p->K <= 128 &&
           !p->token_counts && !p->parents && !gdn__mixer_on(&p->mixer) &&
           p->state_dtype == GDN_DTYPE_BF16 && p->input_dtype == GDN_DTYPE_BF16 && gdn__overlap_supported() && stream_mma_enabled() &&
           p->V % stream_layout<128, __nv_bfloat16, true>::R == 0 && p->ring_capacity <= GDN_MAX_RING_LENGTH;
}

template <int K, typename S, typename I, typename O>
static gdn_status launch_verify(const gdn__layer_params *p, cudaStream_t stream)
{
    if constexpr (std::is_same<S, __nv_bfloat16>::value && std::is_same<I, __nv_bfloat16>::value && K <= 128) {
        constexpr int TM = GDN__RING_VERIFY_MAX_TOKENS;
        const bool short_chain = p->T <= 4;
        const gdn_status st = short_chain ? launch_stream_as<K, S, I, O, true, 4>(p, stream) : launch_stream_as<K, S, I, O, true, TM>(p, stream);
        if (st != GDN_OK) return st;
        GDN__CUDA_TRY(gdn__cuda_launch_error());
        return GDN_OK;
    } else {
        return GDN_ENOTSUP;
    }
}

/* State values a thread holds: as the one-kernel step's decode (state_regs_for). */
template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    if (p->T > 1) return launch_verify<K, S, I, O>(p, stream);
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
    if (!one_kernel && verify_stream_applies(p)) return 1;
    return !one_kernel && p->ring_prep && p->T == 1 && !p->deferred_verify && !p->token_counts && !p->parents &&
           !gdn__mixer_on(&p->mixer) && p->ring_capacity <= GDN_MAX_RING_LENGTH &&
           (stream_state_pass_applies(p) ||
            (int64_t)p->B * p->HV <= (p->state_dtype == GDN_DTYPE_F32 ? GDN__RING_SPLIT_MAX_HEADS_F32 : GDN__RING_SPLIT_MAX_HEADS_BF16));
}

extern "C" gdn_status gdn__cuda_ring_decode(const gdn__layer_params *p, void *stream)
{
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}

GDN__PHASE_TRACE_DUMPER(ring_decode)
