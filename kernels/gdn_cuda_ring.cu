/*
 * The ring strategy's layer step (semantics: kernels/gdn_kernel_params.h, "Ring strategy"). A slot
 * keeps a checkpoint S0 (the pool) and h records (k as given, the scale that normalises it and the
 * log decay, and the token's fp32 correction u; with the mixer's conv raw x and a as given, and u).
 * With P_m the cumulative log decay through entry m (records 0..h-1, then the step's tokens),
 *   S after entries 0..m = exp(P_m) S0 + sum_{j <= m} exp(P_m - P_j) u_j k^_j^T,
 * so a token's S k^ and S q^ need only S0 k^ and S0 q^ (one pass over S0) and the scalars k^_j.k^,
 * k^_j.q^ per record: a decode reads the state and does not write it.
 *
 * Why it looks like this. Per (row, value head) the state is V x K and everything else is a few % of
 * the bytes, so the kernel is a memory pipeline over K-last state rows (a thread holds 16 elements of
 * a row, 16-byte loads, all of a pass's rows in flight before the first use), with the token work
 * moved into a per-CTA preparation that overlaps those loads:
 *   1. Issue the first pass's state loads (the later passes' rows are prefetched into L2), read the
 *      row's record count h and copy the records' raw k (the head's key head) and the CTA's rows of
 *      their u (cp.async into shared memory), and read their log decays, all before the wait for the
 *      preceding kernel (which writes none of them); after it, copy the step's raw k, q.
 *   2. Normalise every k and q (a few lanes a row; the conv's outputs a warp a row), prefix-sum the
 *      log decays, and form, per own token t and entry m, the coefficients of u_m in S k^_t and
 *      S q^_t (a thread a pair).
 *   3. Per pass (a CTA owns up to GDN__RING_MAX_PASSES pass tiles of one head, so that one
 *      preparation serves up to a whole head on large grids), per state row: S0.k^_t and S0.q^_t over
 *      the thread's slice, each lane adding its share of the records' terms (record j goes to lane
 *      j mod L), one lane-group sum each; the own tokens' terms, which need the corrections just
 *      computed, are added after the sum (O(T^2) a row).
 *   4. A row whose ring is full (decode), that does not fit (verify), or whose write slot differs,
 *      writes the state back: the thread's rows become exp(P) S0 + sum_j c_j u_j k^_j and are stored.
 * The step's records are written beside: u by each CTA for its rows; k (per key head) and the pairs
 * (per value head) by one CTA each, or, when they overwrite records that other CTAs of the row still
 * read (a verify that flushed in place), by the row's last CTA, which also writes the count.
 *
 * Template parameters: K, state S, input I, output O, REGS (state values a thread holds in a pass),
 * ONE_TOKEN (decode: the token's correction stays in registers for the write-back; a verify keeps its
 * tokens' corrections in shared memory).
 */
#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_mixer.cuh"
#include "gdn_cuda_rows.cuh"

/* ---------------------------------------------------------------------------------------------- */
/* Shared memory                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* A CTA's shared memory for E = h + T entries (records, then own tokens; at most capacity + T), T own
 * tokens and `rows` state rows. fp32 parts first, then the raw 2-byte k and q rows (16-byte aligned),
 * which the mixer's conv does without (its raw sequence is the mixer's part, past these). */
struct ring_shared {
    float *khat;     /* [E][K] normalised k of every entry */
    float *qhat;     /* [T][K] normalised, scaled q of the own tokens */
    float *urec;     /* [capacity][rows] the records' u of the CTA's rows */
    float *vown;     /* [T][rows] the own tokens' v of the CTA's rows */
    float *uown;     /* [T][rows] the own tokens' u (verify) */
    float *logd;     /* [E] cumulative log decay P_m */
    float *flushc;   /* [E + 1] write-back coefficients exp(P_last - P_m); [E]: exp(P_last) */
    float *gown;     /* [T] own decays */
    float *beta;     /* [T] */
    float *ck;       /* [T][E] coefficient of u_m in S k^_t (m < h + t) */
    float *cq;       /* [T][E] coefficient of u_m in S q^_t (m <= h + t) */
    float *c0;       /* [2 T] exp(P_{h+t-1}), exp(P_{h+t}): coefficients of S0.k^_t, S0.q^_t */
    uint16_t *raw;   /* [capacity + 2 T][K] raw k of the records (rows 0..h-1), own k (capacity..), own q */

    static __host__ __device__ size_t floats(int K, int capacity, int T, int rows)
    {
        const size_t E = (size_t)capacity + T;
        const size_t f = E * K + (size_t)T * K + (size_t)capacity * rows + 2 * (size_t)T * rows + E + (E + 1) +
                         2 * (size_t)T + 2 * (size_t)T * E + 2 * (size_t)T;
        return (f + 3) / 4 * 4;
    }
    static __host__ __device__ size_t bytes(int K, int capacity, int T, int rows, bool raw_rows)
    {
        return floats(K, capacity, T, rows) * sizeof(float) + (raw_rows ? ((size_t)capacity + 2 * (size_t)T) * K * 2 : 0);
    }
    __device__ ring_shared(float *base, int K, int capacity, int T, int rows)
    {
        const int E = capacity + T;
        khat = base;
        qhat = khat + (size_t)E * K;
        urec = qhat + (size_t)T * K;
        vown = urec + (size_t)capacity * rows;
        uown = vown + (size_t)T * rows;
        logd = uown + (size_t)T * rows;
        flushc = logd + E;
        gown = flushc + E + 1;
        beta = gown + T;
        ck = beta + T;
        cq = ck + (size_t)T * E;
        c0 = cq + (size_t)T * E;
        raw = reinterpret_cast<uint16_t *>(base + floats(K, capacity, T, rows));
    }
};

/* Normalises row `src` (K values: raw inputs, or the conv's fp32 outputs, in place) into fp32 `dst`,
 * times `factor` (one warp; every lane reads its values before it writes them). */
template <int K, typename E>
__device__ __forceinline__ void normalise_row(const gdn__layer_params &p, const E *src, float *dst, float factor, int lane)
{
    constexpr int KPL = K / 32;
    float x[KPL], sum = 0.0f;
#pragma unroll
    for (int e = 0; e < KPL; e++) {
        x[e] = gdn__to_f32(src[lane * KPL + e]);
        sum = fmaf(x[e], x[e], sum);
    }
    sum = group_sum<32>(sum);
    const float scale = factor * l2norm_scale(p, sum);
#pragma unroll
    for (int e = 0; e < KPL; e++) dst[lane * KPL + e] = x[e] * scale;
}

/* The same with LANES lanes a row (aligned groups of the warp; every lane of the warp calls it,
 * `store` false past the rows), in 16-byte pieces, their order rotated by `rot` so that the groups
 * of a warp start on different banks; the scale it used kept at `kept` where that is not null. */
template <int K, int LANES, typename E>
__device__ __forceinline__ void normalise_row_lanes(const gdn__layer_params &p, const E *src, float *dst, float factor,
                                                    int glane, int rot, bool store, float *kept)
{
    constexpr int VEC = 16 / (int)sizeof(E), NJ = K / (LANES * VEC);
    static_assert(K % (LANES * VEC) == 0, "whole pieces a lane");
    float x[NJ][VEC], sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int c = (((j + rot) % NJ) * LANES + glane) * VEC;
        gdn__load_vec<E, VEC>(src + c, x[j]);
#pragma unroll
        for (int e = 0; e < VEC; e++) sum = fmaf(x[j][e], x[j][e], sum);
    }
    sum = group_sum<LANES>(sum);
    const float scale = factor * l2norm_scale(p, sum);
    if (!store) return;
    if (kept && glane == 0) *kept = scale;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int c = (((j + rot) % NJ) * LANES + glane) * VEC;
#pragma unroll
        for (int e = 0; e < VEC; e += 4)
            *reinterpret_cast<float4 *>(dst + c + e) =
                make_float4(x[j][e] * scale, x[j][e + 1] * scale, x[j][e + 2] * scale, x[j][e + 3] * scale);
    }
}

/* A record's layout (gdn_kernel_params.h): raw k per key head, then per value head the pair {norm
 * scale, log decay} (at pair_offset); or with the conv raw x [conv_dim], then a per value head (at
 * a_offset); then fp32 u [HV][V]. Offsets formed where they are used, so that no register holds
 * them across the kernel. */
struct ring_record_layout {
    const gdn__layer_params &p;
    bool conv;
    __device__ int64_t bytes() const
    {
        return conv ? gdn__mixer_record_bytes(p.mixer.conv_dim, p.HV, p.V) : gdn__ring_record_bytes(p.HK, p.HV, p.K, p.V);
    }
    __device__ int64_t a_offset() const { return gdn__mixer_record_a_offset(p.mixer.conv_dim); }
    __device__ int64_t pair_offset() const { return gdn__ring_norm_decay_offset(p.HK, p.K); }
    __device__ int64_t u_offset() const
    {
        return conv ? gdn__mixer_record_u_offset(p.mixer.conv_dim, p.HV) : gdn__ring_u_offset(p.HK, p.HV, p.K);
    }
};

/* ---------------------------------------------------------------------------------------------- */
/* Kernel                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* Resident CTAs an SM (__launch_bounds__) below 64 state values a thread: 6 caps registers at 80. */
#ifndef GDN__RING_CTAS_PER_SM
#define GDN__RING_CTAS_PER_SM 6
#endif

/* A CTA owns `passes` consecutive pass tiles (pass_rows rows each) of one head of one row: the
 * preparation is shared by all of them.
 *
 * MIXER (SPEC 6; gdn_cuda_mixer.cuh): with the conv, records hold raw x and the window of a slot is
 * its checkpoint's, so a CTA copies its channels (q and k of its key head, v of its rows) of [window
 * of r; records; own tokens] into shared memory and runs the conv over them for every entry's k and
 * the own tokens' q and v. A row that writes back moves its window from those copies, as the layer
 * kernel does: each CTA its v channels (no other CTA reads them), the last CTA of a key head's
 * value heads its q and k channels. With the norm, the CTAs leave o in fp32 scratch and the last
 * CTA of each head normalises it. */
template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool MIXER>
__global__ void __launch_bounds__(128, (REGS >= 64 ? 4 : GDN__RING_CTAS_PER_SM)) ring_step_kernel(const gdn__layer_params p, int passes)
{
    using Geo = layer_geometry<K, S, REGS, true>;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT;
    /* The mixer's 16-byte window and x moves (write_window, store_own_x): element moves in the
     * verifies of small grids, where the wide ones measured slower. */
    constexpr bool WIDE_MOVES = ONE_TOKEN || REGS == big_regs<S>();
    /* The conv's approximate SiLU with bf16 state, in both passes: the ring's decodes (gathered) and
     * chain verifies (sliding) measured faster with it, and its register allocation did not hold its
     * chain verifies back as the layer kernel's did (whose verify instances keep the precise one in
     * their tree pass; bench/results/2026-11-29-h200-ring-moves-fast-silu.md). Trees not timed. */
    constexpr bool FAST_SILU = sizeof(S) == 2;
    static_assert(sizeof(I) == 2, "2-byte inputs");
    extern __shared__ __align__(16) float smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int group = lane / L, glane = lane % L;
    const int V = p.V, HV = p.HV, HK = p.HK, C = p.ring_capacity;
    const int T = ONE_TOKEN ? min(p.T, 1) : p.T; /* the one-token instance also runs write-backs (T = 0) */
    const int pass_rows = warps * Geo::ROWS_PER_WARP, span_rows = pass_rows * passes;
    const int tiles_per_head = V / pass_rows, spans_per_head = tiles_per_head / passes;
    const int head = blockIdx.x / spans_per_head, first_tile = blockIdx.x % spans_per_head * passes;
    const int64_t i = blockIdx.y;
    const int tile_row0 = first_tile * pass_rows;
    const int local_row0 = warp * Geo::ROWS_PER_WARP + group; /* row of rt = 0 within a pass */
    const int row0 = tile_row0 + local_row0;

    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    const bool out_of_range = gdn__row_slots_invalid(r, w, p.num_slots);
    O *out = static_cast<O *>(p.out);
    const int64_t out_token_stride = p.out_strides.token, out_base = gdn__at(p.out_strides, i, 0, head);
    /* Per-row token counts and token trees (SPEC 3; gdn_kernel_params.h): which own tokens run. A
     * bad count, or a decode whose token cannot run, makes the row padding. */
    const uint32_t all_tokens = (1u << T) - 1u;
    gdn__row_plan plan = {T, all_tokens, 0};
    const bool planned = T > 0 && !out_of_range && r >= 0 && (p.token_counts || p.parents);
    if (planned) {
        plan = gdn__plan_row(p.token_counts, p.parents, T, i, nullptr);
        if (plan.bad && p.error_flag && blockIdx.x == 0 && threadIdx.x == 0) *p.error_flag = 1;
    }
    if (r < 0 || out_of_range || (planned && (plan.n == 0 || (ONE_TOKEN && plan.live != all_tokens)))) {
        zero_padding_row<O, Geo>(p, out_of_range, out, out_base, T, row0, passes, pass_rows, glane);
        return;
    }

    /* 1. The state rows in flight first; then the count, and what depends on it. */
    const int64_t state_elems = (int64_t)V * K;
    const S *state_r = static_cast<const S *>(p.state) + r * p.slot_stride + head * state_elems;
    /* The first pass's rows into registers, the other passes' into L2 (read after their turn comes). */
    float st[RT][NV][EV];
    load_rows<K, S, Geo>(state_r, st, row0, glane);
    for (int pass = 1; pass < passes; pass++) prefetch_rows<K, S, Geo>(state_r, row0 + pass * pass_rows, glane);

    const bool conv = MIXER && p.mixer.conv_width > 0;
    const bool norm = MIXER && p.mixer.norm_weight != nullptr;
    ring_shared s(smem, K, C, T, span_rows);
    /* The mixer's part past the ring's: the raw sequence [window (W - 1 rows); records 0..h-1;
     * (unused up to C); own tokens (rows C..)], the conv weights, z and the norm weight. */
    const int window_rows = conv ? p.mixer.conv_width - 1 : 0;
    const int kh = head / (HV / HK);
    const mixer_channels mc(p, kh, head, tile_row0, span_rows);
    const mixer_smem parts(K, span_rows, conv ? p.mixer.conv_width : 0, C + T, T, V, sizeof(I),
                           p.mixer.conv_weight_dtype == GDN_DTYPE_F32 ? 4 : 2, norm);
    char *const mixer_base = reinterpret_cast<char *>(smem) + ring_shared::bytes(K, C, T, span_rows, !conv);
    I *const raw = reinterpret_cast<I *>(mixer_base + parts.raw);
    const bool window_async = conv && window_rows_contiguous(p.mixer);
    if (conv) { /* layer parameters and slot r's window: not written by the preceding kernel */
        stage_conv_params(p, mc, mixer_base + parts.weights, mixer_base + parts.bias);
        if (window_async) stage_window_async<I>(p, mc, raw, r);
    }
    /* Slot r's count and records before the wait too: the preceding kernel writes neither the pool
     * nor the workspace (gdn_op.h, overlap_preceding), so the wait leaves only the step's inputs on
     * the CTA's chain, not the count's round trip and then the records'. */
    constexpr int CHUNKS = K * 2 / 16; /* 16-byte pieces of a raw k or q row */
    const int h = min(max(p.ring_count[r], 0), C);
    const bool verify = p.deferred_verify && T > 0;
    bool flush, keep;
    if (T == 0) flush = h > 0, keep = false;
    else if (!verify) flush = r != w || h + 1 >= p.ring_length, keep = !flush;
    else flush = r != w || h + T > C, keep = true;
    const int base = flush ? 0 : h;
    if (T == 0 && !flush) return; /* nothing recorded: nothing to write back (and nothing in flight) */

    const int E = h + T;
    const ring_record_layout rec{p, conv};
    const int64_t record_bytes = rec.bytes(), u_offset = rec.u_offset();
    const char *ring_r = static_cast<const char *>(p.ring) + r * C * record_bytes;
    char *ring_w = static_cast<char *>(p.ring) + w * C * record_bytes;
    {
        if (conv) {
            for (int m = warp; m < h; m += warps)
                stage_conv_row<K, I>(mc, raw + (size_t)(window_rows + m) * mc.pitch,
                                     reinterpret_cast<const I *>(ring_r + m * record_bytes), lane);
        } else {
            for (int c = threadIdx.x; c < h * CHUNKS; c += blockDim.x) {
                const int m = c / CHUNKS, piece = c % CHUNKS;
                gdn__copy_async16(s.raw + (size_t)m * K + piece * 8, ring_r + m * record_bytes + (int64_t)kh * K * 2 + piece * 16);
            }
        }
        const bool u16 = span_rows % 4 == 0; /* the rows' u in 16-byte pieces, else 4-byte */
        const int per_record = u16 ? span_rows / 4 : span_rows;
        for (int c = threadIdx.x; c < h * per_record; c += blockDim.x) {
            const int j = c / per_record, piece = c % per_record;
            const float *from = reinterpret_cast<const float *>(ring_r + j * record_bytes + u_offset) +
                                (int64_t)head * V + tile_row0;
            if (u16) gdn__copy_async16(s.urec + (size_t)j * span_rows + piece * 4, from + piece * 4);
            else gdn__copy_async4(s.urec + (size_t)j * span_rows + piece, from + piece);
        }
        gdn__copy_async_commit();
    }
    const float A = expf(p.A_log[head]), dt_bias = p.dt_bias[head];
    for (int m = threadIdx.x; m < h; m += blockDim.x) { /* log decays (cumulative sums below) */
        const char *record = ring_r + m * record_bytes;
        s.logd[m] = conv ? token_log_decay(gdn__to_f32(reinterpret_cast<const I *>(record + rec.a_offset())[head]), A, dt_bias)
                         : reinterpret_cast<const float2 *>(record + rec.pair_offset())[head].y;
    }
    /* The preceding kernel (overlap_preceding) writes the step's inputs. */
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();

    /* The step's own k and q (raw rows C.. and C + T..; records take rows 0..h-1), or with the conv
     * its x, and gate inputs. */
    if (conv) {
        for (int t = warp; t < T; t += warps)
            stage_conv_row<K, I>(mc, raw + (size_t)(window_rows + C + t) * mc.pitch,
                                 static_cast<const I *>(p.mixer.x) + gdn__at(p.mixer.x_strides, i, t, 0), lane);
    } else {
        for (int c = threadIdx.x; c < 2 * T * CHUNKS; c += blockDim.x) {
            const int m = c / CHUNKS, piece = c % CHUNKS, t = m % T;
            const I *from = m < T ? static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh)
                                  : static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh);
            gdn__copy_async16(s.raw + (size_t)(C + m) * K + piece * 8, reinterpret_cast<const char *>(from) + piece * 16);
        }
    }
    float own_a = 0.0f, own_b = 0.0f;
    if ((int)threadIdx.x < T) {
        own_a = gdn__to_f32(static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, threadIdx.x, head)]);
        own_b = gdn__to_f32(static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, threadIdx.x, head)]);
    }

    /* The own tokens' records base..base+T-1 (no mixer): the row's first CTA of each head writes the
     * head's pairs where it forms them (log decays here, norm scales in the normalisation), unless
     * they overwrite records that other CTAs of the row still read (then the row's last CTA writes
     * whole records; below). Nothing of this step reads them. */
    const bool overwrites_read_records = keep && r == w && base < h;
    float *const own_pairs = keep && !overwrites_read_records && first_tile == 0 && !conv
                                 ? reinterpret_cast<float *>(ring_w + base * record_bytes + rec.pair_offset()) + 2 * head
                                 : nullptr; /* token t's at own_pairs + t * record_bytes / 4 */
    if ((int)threadIdx.x < T) {
        const float l = token_log_decay(own_a, A, dt_bias);
        s.logd[h + threadIdx.x] = l;
        s.gown[threadIdx.x] = expf(l);
        s.beta[threadIdx.x] = token_beta(own_b);
        if (own_pairs) own_pairs[threadIdx.x * record_bytes / 4 + 1] = l;
    }
    for (int e = threadIdx.x; !conv && e < T * span_rows; e += blockDim.x) { /* (with the conv: its output) */
        const int t = e / span_rows, row = e % span_rows;
        s.vown[e] = gdn__to_f32(static_cast<const I *>(p.v)[gdn__at(p.v_strides, i, t, head) + tile_row0 + row]);
    }
    if (conv && !window_async) stage_window<I>(p, mc, raw, r); /* plain loads, behind the copies */
    gdn__copy_async_wait_all();
    __syncthreads();

    /* 2. Normalised rows, cumulative decays, coefficients. With the conv, its outputs first: every
     * entry's k (rows 0..E-1 of khat), the own tokens' q and v. */
    const mixer_sequence row_seq{window_rows, h, C}; /* own tokens at raw rows C.. */
    if (conv) { /* own tokens' k at khat row h + t; the records' v are not needed (their u is): v's rows before h are never written */
        shared_tokens rows(s.khat, s.qhat, s.vown - (size_t)h * span_rows);
        if (!ONE_TOKEN && !p.parents)
            conv_pass_sliding<I, false, FAST_SILU>(p, mc, raw, mixer_base + parts.weights, mixer_base + parts.bias, row_seq,
                                                   T, rows, h);
        else
            conv_pass_gathered<I, false, FAST_SILU>(p, mc, raw, mixer_base + parts.weights, mixer_base + parts.bias, row_seq,
                                                    T, rows, gdn__row_parents(p.parents, i, T), h);
        __syncthreads();
    }
    if (conv) { /* in place, a warp a row */
        for (int item = warp; item < E + T; item += warps) {
            float *const row = item < E ? s.khat + (size_t)item * K : s.qhat + (size_t)(item - E) * K;
            normalise_row<K, float>(p, row, row, item < E ? 1.0f : p.scale, lane);
        }
    } else { /* from the raw copies (records, own k, own q), NL lanes a row */
        /* 16 values a lane with fp32 state and no mixer; 4 lanes a row elsewhere: the bf16-state
         * and mixer instances measured slower with 16 values a lane, in code outside this branch
         * (bench/results/2026-11-30-h200-ring-normalise-lanes.md). */
        constexpr int NL = sizeof(S) == 4 && !MIXER ? K / 16 : 4;
        const int sub = lane / NL, sl = lane % NL, per_warp = 32 / NL;
        for (int first = warp * per_warp; first < E + T; first += warps * per_warp) { /* uniform over the warp */
            const int item = min(first + sub, E + T - 1); /* past the end: a row read again, not stored */
            const bool store = first + sub < E + T;
            const I *raw_row = reinterpret_cast<const I *>(s.raw) + (size_t)(item < h ? item : C + item - h) * K;
            /* (the records' k too: this pass forms every norm anyway, so their stored scales save nothing
             * here; the own tokens' are kept for their records) */
            if (item < E)
                normalise_row_lanes<K, NL, I>(p, raw_row, s.khat + (size_t)item * K, 1.0f, sl, sub, store,
                                              own_pairs && item >= h ? own_pairs + (item - h) * record_bytes / 4 : nullptr);
            else
                normalise_row_lanes<K, NL, I>(p, raw_row, s.qhat + (size_t)(item - E) * K, p.scale, sl, sub, store, nullptr);
        }
    }
    /* Own token t's parent and ancestors (a chain: t - 1 and every earlier token; padding tokens
     * are no one's ancestors); its cumulative decay continues its parent's. */
    __shared__ int parent_of[GDN_MAX_TOKENS];
    __shared__ uint32_t ancestors_of[GDN_MAX_TOKENS];
    if (threadIdx.x == 0) {
        float P = 0.0f;
        for (int m = 0; m < h; m++) P += s.logd[m], s.logd[m] = P;
        for (int t = 0; t < T; t++) {
            const bool live = (plan.live >> t) & 1u;
            const int parent = !live ? -1 : p.parents ? p.parents[i * T + t] : t - 1;
            parent_of[t] = parent;
            ancestors_of[t] = parent < 0 ? 0u : ancestors_of[parent] | (1u << parent);
            s.logd[h + t] += parent < 0 ? P : s.logd[h + parent];
        }
    }
    __syncthreads();
    /* The last entry a write-back includes: h - 1 before the own tokens (verify, flush), h with the
     * decode's own token. */
    const int flushed = !verify && T == 1 ? h + 1 : h;
    /* With the conv, slot w's window after the flushed entries: the last W - 1 of [window of r;
     * records; the decode's token] up to them, from the raw copy (complete since the conv pass). */
    const int window_length = window_rows + flushed;
    if (conv && flush) write_window<I, WIDE_MOVES>(p, mc, raw, row_seq, window_length, w, 2 * K, mc.width);
    if (flush) {
        const float last = flushed > 0 ? s.logd[flushed - 1] : 0.0f;
        for (int m = threadIdx.x; m <= flushed; m += blockDim.x)
            s.flushc[m] = m < flushed ? expf(last - s.logd[m]) : expf(last);
    }
    /* The cumulative decay at token t's parent (the records' last, or 0, for a root). */
    const auto before_of = [&](int t) { return parent_of[t] >= 0 ? s.logd[h + parent_of[t]] : h > 0 ? s.logd[h - 1] : 0.0f; };
    if ((int)threadIdx.x < T) {
        const int t = threadIdx.x;
        s.c0[2 * t] = parent_of[t] >= 0 || h > 0 ? expf(before_of(t)) : 1.0f;
        s.c0[2 * t + 1] = expf(s.logd[h + t]);
    }
    /* The coefficients, a thread a (own token t, entry m) pair: both of the pair's dot products in
     * one pass over K, its 16-byte pieces in an order rotated by the pair so that the threads of a
     * warp read different banks (a warp a pair chained five shuffles a dot product, slower). */
    const int pairs = T * (h + 1) + T * (T - 1) / 2;
    for (int pair = threadIdx.x; pair < pairs; pair += blockDim.x) {
        int t = 0, m = pair;
        while (m > h + t) m -= h + t + 1, t++;
        if (!((plan.live >> t) & 1u)) continue; /* a padding token's coefficients are never read */
        if (m >= h && m < h + t && !((ancestors_of[t] >> (m - h)) & 1u)) { /* not on t's path */
            s.cq[t * E + m] = 0.0f, s.ck[t * E + m] = 0.0f;
            continue;
        }
        const float *km = s.khat + (size_t)m * K, *qt = s.qhat + (size_t)t * K, *kt = s.khat + (size_t)(h + t) * K;
        float4 aq = make_float4(0.0f, 0.0f, 0.0f, 0.0f), ak = aq;
#pragma unroll 8
        for (int c = 0; c < K / 4; c++) {
            const int col = ((c + pair) & (K / 4 - 1)) * 4;
            const float4 x = *reinterpret_cast<const float4 *>(km + col);
            const float4 y = *reinterpret_cast<const float4 *>(qt + col);
            const float4 z = *reinterpret_cast<const float4 *>(kt + col);
            aq.x = fmaf(x.x, y.x, aq.x), aq.y = fmaf(x.y, y.y, aq.y);
            aq.z = fmaf(x.z, y.z, aq.z), aq.w = fmaf(x.w, y.w, aq.w);
            ak.x = fmaf(x.x, z.x, ak.x), ak.y = fmaf(x.y, z.y, ak.y);
            ak.z = fmaf(x.z, z.z, ak.z), ak.w = fmaf(x.w, z.w, ak.w);
        }
        const float dq = (aq.x + aq.y) + (aq.z + aq.w), dk = (ak.x + ak.y) + (ak.z + ak.w);
        s.cq[t * E + m] = expf(s.logd[h + t] - s.logd[m]) * dq;
        s.ck[t * E + m] = m < h + t ? expf(before_of(t) - s.logd[m]) * dk : 0.0f;
    }
    __syncthreads();

    /* Every read of slot r's count and records is done: count this CTA in (the last one does the
     * row's bookkeeping at its end). */
    unsigned arrival = 0;
    bool kh_last = false; /* with the conv and a write-back: the last CTA of kh's heads to have read its window */
    if (threadIdx.x == 0) {
        __threadfence();
        arrival = atomicAdd(&p.arrivals[i], (unsigned)passes);
        if (conv && flush)
            kh_last = arrive_last(p.mixer.arrivals + i * (int64_t)(HK + HV) + kh, (uint32_t)((HV / HK) * spans_per_head));
    }

    float *u_records = reinterpret_cast<float *>(ring_w + u_offset) + (int64_t)head * V;
    /* Token t's output of state row tile_row0 + local: with the norm, o into the fp32 scratch (token
     * t at + t HV V) for the head's last CTA. */
    float *const o_scratch = norm ? p.mixer.norm_scratch + (i * T * HV + head) * (int64_t)V + tile_row0 : nullptr;
    const auto emit = [&](int t, int local, float o) {
        if (norm) o_scratch[(int64_t)t * HV * V + local] = o;
        else out[out_base + t * out_token_stride + tile_row0 + local] = gdn__from_f32<O>(o);
    };
    for (int pass = 0; pass < passes; pass++) {
        const int pass_row0 = pass * pass_rows; /* within the span */
        if (pass > 0) load_rows<K, S, Geo>(state_r, st, row0 + pass_row0, glane);

        /* 3. The own tokens, row by row. */
        float u_last[RT]; /* decode: the token's correction, for the write-back */
#pragma unroll
        for (int rt = 0; rt < RT; rt++) u_last[rt] = 0.0f;
        for (int t = 0; t < T; t++) {
            if (!((plan.live >> t) & 1u)) { /* padding token (uniform): zero output and correction */
                if (glane == 0)
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        const int local = pass_row0 + local_row0 + rt * G;
                        emit(t, local, 0.0f);
                        if (keep) u_records[(base + t) * record_bytes / 4 + tile_row0 + local] = 0.0f;
                        if (!ONE_TOKEN) s.uown[(size_t)t * span_rows + local] = 0.0f;
                    }
                if (!ONE_TOKEN) __syncwarp();
                continue;
            }
            /* S0.k^ and S0.q^ over the thread's columns, k^ and q^ read from shared memory a 16-byte
             * vector at a time (all rows share it), then the records' terms (lane j mod L takes record
             * j; its coefficients shared by all rows). */
            const float *khat_t = s.khat + (size_t)(h + t) * K, *qhat_t = s.qhat + (size_t)t * K;
            float dk[RT], dq[RT];
#pragma unroll
            for (int rt = 0; rt < RT; rt++) dk[rt] = 0.0f, dq[rt] = 0.0f;
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e += 4) {
                    const int col = (n * L + glane) * EV + e;
                    const float4 k4 = *reinterpret_cast<const float4 *>(khat_t + col);
                    const float4 q4 = *reinterpret_cast<const float4 *>(qhat_t + col);
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        const float *x = &st[rt][n][e];
                        dk[rt] = fmaf(x[0], k4.x, fmaf(x[1], k4.y, fmaf(x[2], k4.z, fmaf(x[3], k4.w, dk[rt]))));
                        dq[rt] = fmaf(x[0], q4.x, fmaf(x[1], q4.y, fmaf(x[2], q4.z, fmaf(x[3], q4.w, dq[rt]))));
                    }
                }
            const float c0k = s.c0[2 * t], c0q = s.c0[2 * t + 1];
#pragma unroll
            for (int rt = 0; rt < RT; rt++) dk[rt] *= c0k, dq[rt] *= c0q;
            for (int j = glane; j < h; j += L) {
                const float ckj = s.ck[t * E + j], cqj = s.cq[t * E + j];
                const float *u = s.urec + (size_t)j * span_rows + pass_row0 + local_row0;
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    dk[rt] = fmaf(ckj, u[rt * G], dk[rt]);
                    dq[rt] = fmaf(cqj, u[rt * G], dq[rt]);
                }
            }
            row_sums<L, RT, true>(dk, dq);
            const float g = s.gown[t], beta = s.beta[t];
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                const int local = pass_row0 + local_row0 + rt * G;
                float sk = dk[rt], sq = dq[rt];
                for (int t2 = 0; t2 < t; t2++) { /* own earlier tokens (verify) */
                    const float u2 = s.uown[(size_t)t2 * span_rows + local];
                    sk = fmaf(s.ck[t * E + h + t2], u2, sk);
                    sq = fmaf(s.cq[t * E + h + t2], u2, sq);
                }
                const float u = beta * (s.vown[(size_t)t * span_rows + local] - g * sk);
                const float o = fmaf(s.cq[t * E + h + t], u, sq);
                u_last[rt] = u;
                if (glane == 0) {
                    emit(t, local, o);
                    if (keep) u_records[(base + t) * record_bytes / 4 + tile_row0 + local] = u;
                    if (!ONE_TOKEN) s.uown[(size_t)t * span_rows + local] = u;
                }
            }
            if (!ONE_TOKEN) __syncwarp();
        }

        /* 4. Write-back: exp(P_last) S0 + sum_m exp(P_last - P_m) u_m k^_m over the flushed entries. */
        if (flush) {
            scale_rows<Geo>(st, s.flushc[flushed]);
            for (int m = 0; m < flushed; m++) {
                const float *khat_m = s.khat + (size_t)m * K;
                const float fm = s.flushc[m];
                float c[RT];
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
                    c[rt] = fm * (m < h ? s.urec[(size_t)m * span_rows + pass_row0 + local_row0 + rt * G] : u_last[rt]);
#pragma unroll
                for (int n = 0; n < NV; n++)
#pragma unroll
                    for (int e = 0; e < EV; e += 4) {
                        const float4 k4 = *reinterpret_cast<const float4 *>(khat_m + (n * L + glane) * EV + e);
#pragma unroll
                        for (int rt = 0; rt < RT; rt++) {
                            float *x = &st[rt][n][e];
                            x[0] = fmaf(c[rt], k4.x, x[0]), x[1] = fmaf(c[rt], k4.y, x[1]);
                            x[2] = fmaf(c[rt], k4.z, x[2]), x[3] = fmaf(c[rt], k4.w, x[3]);
                        }
                    }
            }
            store_rows<K, S, Geo, false>(static_cast<S *>(p.state) + w * p.slot_stride + head * state_elems, st, 1.0f,
                                         row0 + pass_row0, glane);
        }
    }

    /* The step's k (per key head; with the conv, x: q and k channels per key head, v per CTA) and, with
     * the conv, a (per value head; without it the pairs, above) become records base..base+T-1 of slot
     * w: written here by one CTA each unless they overwrite records that other CTAs of the row may
     * still read (a verify that wrote back in place), which the row's last CTA then writes. */
    if (keep && !overwrites_read_records && conv) {
        I *const x_records = reinterpret_cast<I *>(ring_w + base * record_bytes);
        const int64_t record_elems = record_bytes / (int64_t)sizeof(I);
        store_own_x<I, WIDE_MOVES>(mc, raw, row_seq, T, x_records, record_elems, 2 * K, mc.width);
        if (first_tile == 0 && head % (HV / HK) == 0) store_own_x<I, WIDE_MOVES>(mc, raw, row_seq, T, x_records, record_elems, 0, 2 * K);
    }
    if (keep && !overwrites_read_records && first_tile == 0) {
        constexpr int CHUNKS = K * 2 / 16;
        if (!conv && head % (HV / HK) == 0)
            for (int c = threadIdx.x; c < T * CHUNKS; c += blockDim.x) {
                const int t = c / CHUNKS, piece = c % CHUNKS;
                reinterpret_cast<uint4 *>(ring_w + (base + t) * record_bytes + (int64_t)kh * K * 2)[piece] =
                    reinterpret_cast<const uint4 *>(s.raw + (size_t)(C + t) * K)[piece];
            }
        for (int t = threadIdx.x; conv && t < T; t += blockDim.x) /* (no mixer: the pairs, above) */
            reinterpret_cast<I *>(ring_w + (base + t) * record_bytes + rec.a_offset())[head] =
                static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, head)];
    }

    /* The norm: every CTA of the head has left its rows' o in the scratch; the last one normalises. */
    if (norm && T > 0) {
        __shared__ int head_last_cta;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            head_last_cta = arrive_last(p.mixer.arrivals + i * (int64_t)(HK + HV) + HK + head, (uint32_t)spans_per_head);
        }
        __syncthreads();
        if (head_last_cta) {
            __threadfence();
            I *const z_sh = reinterpret_cast<I *>(mixer_base + parts.z);
            float *const norm_w_sh = reinterpret_cast<float *>(mixer_base + parts.norm_w);
            stage_z<I>(p, i, head, T, z_sh);
            copy_words_async(norm_w_sh, p.mixer.norm_weight, V * 4);
            gdn__copy_async_commit();
            gdn__copy_async_wait_all();
            __syncthreads();
            finish_norm<I, O, true, !ONE_TOKEN>(p, i, head, T, o_scratch - tile_row0, (int64_t)HV * V, z_sh, norm_w_sh, out,
                                                out_base);
        }
    }

    __shared__ int last_cta, kh_last_cta;
    if (threadIdx.x == 0) last_cta = arrival + passes == (unsigned)(HV * tiles_per_head), kh_last_cta = kh_last;
    __syncthreads();
    if (kh_last_cta) write_window<I, WIDE_MOVES>(p, mc, raw, row_seq, window_length, w, 0, 2 * K);
    if (!last_cta) return;
    if (overwrites_read_records) {
        if (conv) {
            const int64_t pieces = (int64_t)p.mixer.conv_dim * (int64_t)sizeof(I) / 16;
            for (int64_t c = threadIdx.x; c < T * pieces; c += blockDim.x) {
                const int t = (int)(c / pieces);
                reinterpret_cast<uint4 *>(ring_w + (base + t) * record_bytes)[c % pieces] =
                    reinterpret_cast<const uint4 *>(static_cast<const I *>(p.mixer.x) + gdn__at(p.mixer.x_strides, i, t, 0))[c % pieces];
            }
            for (int64_t c = threadIdx.x; c < (int64_t)T * HV; c += blockDim.x)
                reinterpret_cast<I *>(ring_w + (base + c / HV) * record_bytes + rec.a_offset())[c % HV] =
                    static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, c / HV, c % HV)];
        } else {
            write_input_records<K, I>(p, i, ring_w, record_bytes, base, T, threadIdx.x, blockDim.x);
        }
    }
    if (threadIdx.x == 0) {
        p.ring_count[w] = verify ? base : (keep ? h + 1 : 0);
        p.arrivals[i] = 0;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* The CTAs a launch keeps when it gives each CTA more passes over a head's rows (one preparation for
 * more state), up to GDN__RING_MAX_PASSES. */
#ifndef GDN__RING_SPAN_MIN_CTAS
#define GDN__RING_SPAN_MIN_CTAS 1024
#endif
#define GDN__RING_MAX_PASSES 4
/* With the mixer every CTA runs the conv over the records of its key head's channels, so the
 * launch keeps fewer, wider CTAs: 4 warps and longer spans down to this many CTAs. */
#ifndef GDN__RING_MIXER_MIN_CTAS
#define GDN__RING_MIXER_MIN_CTAS 256
#endif
/* A verify's preparation (every token's and record's normalised k and q, their coefficients) is a
 * chain of its own in every CTA of a head: the verifies keep CTAs of 4 warps down to this many CTAs
 * (on small grids one-warp CTAs ran that chain on one warp each, slower; bench/results/
 * 2026-11-29-h200-ring-verify-preparation.md). */
#ifndef GDN__RING_VERIFY_MIN_CTAS
#define GDN__RING_VERIFY_MIN_CTAS 256
#endif

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool MIXER>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    using Geo = layer_geometry<K, S, REGS, true>;
    const int warps =
        warps_for<Geo>(p, 1, MIXER       ? GDN__RING_MIXER_MIN_CTAS
                             : ONE_TOKEN ? GDN__SMALL_GRID_CTAS
                                         : GDN__RING_VERIFY_MIN_CTAS);
    if (p->V % (warps * Geo::ROWS_PER_WARP) != 0) return GDN_ENOTSUP;
    const int pass_rows = warps * Geo::ROWS_PER_WARP;
    int passes = 1;
    while (passes < GDN__RING_MAX_PASSES && (p->V / pass_rows) % (2 * passes) == 0 &&
           (int64_t)p->B * p->HV * (p->V / (pass_rows * 2 * passes)) >= (MIXER ? GDN__RING_MIXER_MIN_CTAS : GDN__RING_SPAN_MIN_CTAS))
        passes *= 2;
    const int span_rows = pass_rows * passes;
    const dim3 grid((unsigned)(p->HV * (p->V / span_rows)), (unsigned)p->B);
    const int T = ONE_TOKEN ? 1 : p->T;
    const bool conv = MIXER && p->mixer.conv_width > 0;
    const mixer_smem parts(K, span_rows, conv ? p->mixer.conv_width : 0, p->ring_capacity + T, T, p->V, sizeof(I),
                           p->mixer.conv_weight_dtype == GDN_DTYPE_F32 ? 4 : 2, MIXER && p->mixer.norm_weight);
    const size_t smem = ring_shared::bytes(K, p->ring_capacity, T, span_rows, !conv) + (MIXER ? parts.end : 0);
    auto kernel = ring_step_kernel<K, S, I, O, REGS, ONE_TOKEN, MIXER>;
    if (smem > 48 * 1024) { /* long rings, K = 256, long spans, the mixer: opt in once per device and instance, up to the largest case */
        constexpr int most_tokens = ONE_TOKEN ? 1 : GDN_MAX_TOKENS;
        constexpr int most_rows = GDN__RING_MAX_PASSES * 4 * Geo::ROWS_PER_WARP < GDN__MAX_HEAD_DIM
                                      ? GDN__RING_MAX_PASSES * 4 * Geo::ROWS_PER_WARP
                                      : GDN__MAX_HEAD_DIM;
        const mixer_smem largest_parts(K, most_rows, GDN__MAX_CONV_WIDTH, GDN_MAX_RING_LENGTH + most_tokens, most_tokens,
                                       GDN__MAX_HEAD_DIM, sizeof(I), 4, true);
        static std::atomic<bool> opted_in[GDN__MAX_DEVICES];
        GDN__CUDA_TRY(gdn__opt_in_shared(kernel,
                                         (int)(ring_shared::bytes(K, GDN_MAX_RING_LENGTH, most_tokens, most_rows, !MIXER) +
                                               (MIXER ? largest_parts.end : 0)),
                                         opted_in));
    }
    GDN__CUDA_TRY(gdn__launch(kernel, grid, dim3(warps * 32), smem, stream, p->overlap_preceding != 0, *p, passes));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* The instance holding as many state values a thread as state_regs_for picks for this grid. The
 * verifies take the big instance from a quarter of the usual grid (fewer CTAs, so fewer
 * preparations); with the mixer only its bf16 chains do (its trees, per-row counts and fp32 chains
 * were not measured so). */
template <int K, typename S, typename I, typename O, bool ONE_TOKEN, bool MIXER>
static gdn_status launch_tokens(const gdn__layer_params *p, cudaStream_t stream)
{
    const bool big_early = !ONE_TOKEN && (!MIXER || (sizeof(S) == 2 && !p->parents && !p->token_counts));
    switch (state_regs_for<K, S, true>(p, ONE_TOKEN, big_early ? 1 : GDN__BIG_FROM_USUAL)) {
    case state_regs::big: return launch_regs<K, S, I, O, big_regs<S>(), ONE_TOKEN, MIXER>(p, stream);
    case state_regs::tiny: return launch_regs<K, S, I, O, GDN__STATE_REGS_TINY, ONE_TOKEN, MIXER>(p, stream);
    default: return launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, ONE_TOKEN, MIXER>(p, stream);
    }
}

template <int K, typename S, typename I, typename O, bool MIXER>
static gdn_status launch_strategy(const gdn__layer_params *p, cudaStream_t stream)
{
    /* A decode and a write-back (T = 0) run the one-token instance. */
    return p->T <= 1 && !(p->deferred_verify && p->T == 1) ? launch_tokens<K, S, I, O, true, MIXER>(p, stream)
                                                          : launch_tokens<K, S, I, O, false, MIXER>(p, stream);
}
template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    return launch_strategy<K, S, I, O, false>(p, stream);
}
/* With the mixer (SPEC 6). */
template <int K, typename S, typename I, typename O>
static gdn_status launch_mixer(const gdn__layer_params *p, cudaStream_t stream)
{
    return launch_strategy<K, S, I, O, true>(p, stream);
}

static gdn_status dispatch(const gdn__layer_params *p, cudaStream_t stream, bool run)
{
    if (gdn__mixer_on(&p->mixer)) {
        GDN__MIXER_DISPATCH(launch_mixer)
    }
    GDN__LAYER_DISPATCH(launch)
}

extern "C" gdn_status gdn__cuda_ring_step(const gdn__layer_params *p, void *stream)
{
    if (gdn__cuda_ring_decode_applies(p)) return gdn__cuda_ring_decode(p, stream);
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}

extern "C" gdn_status gdn__cuda_ring_step_supported(const gdn__layer_params *p) { return dispatch(p, nullptr, false); }
