/*
 * The whole mixer step (SPEC 6) inside the layer-step kernel (gdn_cuda_layer_kernel.cuh, MIXER
 * instances): the causal conv of a CTA's channels, the moves of the conv window and the gated RMSNorm.
 *
 * A CTA reads the conv inputs of its channels only: q and k of its key head kh (2 K channels) and v
 * of its rows. It copies them raw into shared memory as a sequence, [window of slot r (W - 1 rows);
 * stored tokens (fold); own tokens], runs the conv once per channel over that sequence (fp32, SiLU)
 * into the prepared-token rows that the recurrence reads, and normalises k and q per token as the
 * plain path does. What it writes back it writes from the same raw copy:
 *   - v channels of its rows: read by no other CTA, so the CTA moves their window (and stores their
 *     x) as soon as its copy is complete;
 *   - q and k channels of kh: read by every CTA of kh's value heads, so the last of them to arrive
 *     (a count per row and key head) moves their window (and stores their x);
 *   - the norm needs a whole head's o: each CTA leaves its rows' o in fp32 scratch and the last CTA
 *     of the head (a count per row and value head) normalises the head.
 * The counts live in gdn__mixer_params.arrivals and are left at zero by the CTA that completes them.
 */
#ifndef GDN_CUDA_MIXER_CUH
#define GDN_CUDA_MIXER_CUH

#include "cuda_common.cuh"
#include "gdn_cuda_prepare.cuh"

/* A CTA's conv channels: local channel c < K is q[c] of key head kh, K <= c < 2 K is k[c - K], and
 * 2 K <= c < 2 K + rows is v of the CTA's row c - 2 K. A raw row (one position of the sequence)
 * holds them padded to 8 elements, so that every row starts 16-byte aligned. */
struct mixer_channels {
    int K, rows, width, pitch;
    int64_t q0, k0, v0; /* the global channel of each segment's first local channel */

    __device__ mixer_channels(const gdn__layer_params &p, int kh, int h, int tile_row0, int cta_rows)
    {
        K = p.K;
        rows = cta_rows;
        width = 2 * K + rows;
        pitch = (width + 7) / 8 * 8;
        q0 = (int64_t)kh * K;
        k0 = (int64_t)p.HK * K + q0;
        v0 = 2 * (int64_t)p.HK * K + (int64_t)h * p.V + tile_row0;
    }
    __device__ __forceinline__ int64_t global(int c) const { return c < K ? q0 + c : c < 2 * K ? k0 + (c - K) : v0 + (c - 2 * K); }
    /* Whether runs of `n` channels from a multiple of n stay inside one segment and start at a global
     * channel that is a multiple of n (the vector moves below). */
    __device__ __forceinline__ bool runs_of(int n) const
    {
        return K % n == 0 && rows % n == 0 && q0 % n == 0 && k0 % n == 0 && v0 % n == 0;
    }
    static __host__ __device__ size_t bytes(int K, int rows, int conv_width, int capacity, size_t elem)
    {
        return (size_t)(conv_width - 1 + capacity) * (size_t)((2 * K + rows + 7) / 8 * 8) * elem;
    }
};

/* Where a position of the row's logical sequence [window; folded tokens; own tokens] lies in the raw
 * copy, which holds every stored token (folded or not) before the own ones. */
struct mixer_sequence {
    int window_rows, folds, own0;
    __device__ __forceinline__ int physical(int logical) const
    {
        return logical < window_rows + folds ? logical : logical + (own0 - folds);
    }
};

/* The mixer's shared memory past the prepared tokens, byte offsets (each part 16-byte aligned): the
 * raw sequence, the CTA's conv weights and bias (their storage type), the head's z (T x V, input
 * type), the norm weight (V fp32) and, for a CTA that holds a whole head, its o (T x V fp32). Host
 * and device compute it alike from the launch's values. */
struct mixer_smem {
    size_t raw, weights, bias, z, norm_w, o, end;
    __host__ __device__ mixer_smem(int K, int cta_rows, int conv_width, int capacity, int T, int V, size_t in_elem,
                                   size_t weight_elem, bool norm)
    {
        const size_t width = 2 * (size_t)K + cta_rows;
        const bool conv = conv_width > 0;
        size_t at = 0;
        raw = at, at += conv ? mixer_channels::bytes(K, cta_rows, conv_width, capacity, in_elem) : 0, at = (at + 15) / 16 * 16;
        weights = at, at += conv ? width * conv_width * weight_elem : 0, at = (at + 15) / 16 * 16;
        bias = at, at += conv ? width * weight_elem : 0, at = (at + 15) / 16 * 16;
        z = at, at += norm ? (size_t)T * V * in_elem : 0, at = (at + 15) / 16 * 16;
        norm_w = at, at += norm ? (size_t)V * 4 : 0, at = (at + 15) / 16 * 16;
        o = at, at += norm ? (size_t)T * V * 4 : 0, at = (at + 15) / 16 * 16;
        end = at;
    }
};

/* Copies `bytes` (a multiple of 4, both ends 4-byte aligned) into shared memory with 4-byte cp.async,
 * the CTA's threads striding: part of the copy group that the kernel waits for before the tokens.
 * (16-byte pieces where alignment allows made the big verify instances spill.) */
__device__ __forceinline__ void copy_words_async(void *dst, const void *src, int bytes)
{
    for (int e = threadIdx.x; e < bytes / 4; e += blockDim.x)
        gdn__copy_async4(static_cast<char *>(dst) + 4 * e, static_cast<const char *>(src) + 4 * e);
}

/* The conv weights and bias of the CTA's three channel segments (each a contiguous run of channels,
 * [channel][W] and [channel]), asynchronously: they are layer parameters, so they go out before the
 * wait for the preceding kernel, beside the state. */
__device__ __forceinline__ void stage_conv_params(const gdn__layer_params &p, const mixer_channels &mc, char *weights,
                                                  char *bias)
{
    const gdn__mixer_params &m = p.mixer;
    const int W = m.conv_width, e = m.conv_weight_dtype == GDN_DTYPE_F32 ? 4 : 2;
    const int64_t first[3] = {mc.q0, mc.k0, mc.v0};
    const int count[3] = {mc.K, mc.K, mc.rows}, local[3] = {0, mc.K, 2 * mc.K};
    for (int seg = 0; seg < 3; seg++) {
        copy_words_async(weights + (size_t)local[seg] * W * e, static_cast<const char *>(m.conv_weight) + first[seg] * W * e,
                         count[seg] * W * e);
        if (m.conv_bias)
            copy_words_async(bias + (size_t)local[seg] * e, static_cast<const char *>(m.conv_bias) + first[seg] * e, count[seg] * e);
    }
}

/* True when slot windows are channel-contiguous rows with 4-byte aligned runs (the engine's dense
 * layout and any [W-1][conv_dim] pool): they can be copied asynchronously. vLLM's [conv_dim][W-1]
 * layout is read with plain loads instead. */
__device__ __forceinline__ bool window_rows_contiguous(const gdn__mixer_params &m)
{
    return m.conv_channel_stride == 1 && m.conv_token_stride % 2 == 0 && m.conv_slot_stride % 2 == 0 &&
           gdn__aligned(m.conv_state, 4);
}

/* The window of slot r as raw rows 0..W-2, asynchronously (window_rows_contiguous). */
template <typename I>
__device__ __forceinline__ void stage_window_async(const gdn__layer_params &p, const mixer_channels &mc, I *raw, int64_t r)
{
    const gdn__mixer_params &m = p.mixer;
    const I *win = static_cast<const I *>(m.conv_state) + r * m.conv_slot_stride;
    for (int j = 0; j + 1 < m.conv_width; j++) {
        const I *row = win + j * m.conv_token_stride;
        copy_words_async(raw + (size_t)j * mc.pitch, row + mc.q0, mc.K * (int)sizeof(I));
        copy_words_async(raw + (size_t)j * mc.pitch + mc.K, row + mc.k0, mc.K * (int)sizeof(I));
        copy_words_async(raw + (size_t)j * mc.pitch + 2 * mc.K, row + mc.v0, mc.rows * (int)sizeof(I));
    }
}

/* Head h's z of row i's T tokens into shared memory [T][V]: asynchronously when 4-byte aligned,
 * else with plain loads. */
template <typename I>
__device__ __forceinline__ void stage_z(const gdn__layer_params &p, int64_t i, int h, int T, I *z_sh)
{
    const gdn__mixer_params &m = p.mixer;
    const I *z = static_cast<const I *>(m.z);
    for (int t = 0; t < T; t++) {
        const I *src = z + gdn__at(m.z_strides, i, t, h);
        if (gdn__aligned(src, 4)) {
            copy_words_async(z_sh + (size_t)t * p.V, src, p.V * (int)sizeof(I));
        } else {
            for (int c = threadIdx.x; c < p.V; c += blockDim.x) z_sh[(size_t)t * p.V + c] = src[c];
        }
    }
}

/* The window of slot r, every channel of the CTA, into raw rows 0..W-2 with plain loads (any
 * strides; issued after the CTA's state loads, which are then in flight). */
template <typename I>
__device__ __forceinline__ void stage_window(const gdn__layer_params &p, const mixer_channels &mc, I *raw, int64_t r)
{
    const gdn__mixer_params &m = p.mixer;
    const I *win = static_cast<const I *>(m.conv_state) + r * m.conv_slot_stride;
    const int n = (m.conv_width - 1) * mc.width;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int j = e / mc.width, c = e - j * mc.width;
        raw[j * mc.pitch + c] = win[j * m.conv_token_stride + mc.global(c) * m.conv_channel_stride];
    }
}

/* One position's conv inputs (src: its channel 0, 16-byte aligned) into a raw row, by one warp with
 * cp.async: q and k in 16-byte pieces, v in 4-byte pairs (one row: a plain copy). */
template <int K, typename I>
__device__ __forceinline__ void stage_conv_row(const mixer_channels &mc, I *raw_row, const I *src, int lane)
{
    constexpr int PIECES = K * (int)sizeof(I) / 16;
    for (int c = lane; c < 2 * PIECES; c += 32) {
        const int seg = c / PIECES, piece = c - seg * PIECES;
        gdn__copy_async16(raw_row + seg * K + piece * 8, src + (seg ? mc.k0 : mc.q0) + piece * 8);
    }
    I *rv = raw_row + 2 * K;
    const I *sv = src + mc.v0;
    for (int c = lane; c < mc.rows / 2; c += 32) gdn__copy_async4(rv + c * 2, sv + c * 2);
    if (mc.rows == 1 && lane == 0) rv[0] = sv[0];
}

/* Element `at` of a conv weight or bias array (F32 or BF16), widened. */
__device__ __forceinline__ float conv_param(const void *base, gdn_dtype dtype, int64_t at)
{
    return dtype == GDN_DTYPE_F32 ? static_cast<const float *>(base)[at]
                                  : gdn__to_f32(static_cast<const __nv_bfloat16 *>(base)[at]);
}

/* SiLU, x sigmoid(x): the conv's activation and the norm's gate. FAST: the hardware's approximate
 * exponential and division (a few ulp; 0 for x below about -87, as the precise form). */
template <bool FAST = false> __device__ __forceinline__ float silu(float x)
{
    return FAST ? __fdividef(x, 1.0f + __expf(-x)) : x / (1.0f + expf(-x));
}

/* The conv over the raw sequence, every channel of the CTA by one thread: SiLU(bias + sum_j w[c, j]
 * seq[P - W + 1 + j][c]) for the folded tokens (k and v channels; their q is not used) and the own
 * tokens, into the prepared rows (k^ and q^ before their norms, v final). With a token tree
 * (row_parents: the row's parents, or NULL for a chain) an own token's taps follow its path: its
 * parent, grandparent, ..., then the positions before the own tokens. Each output gathers its taps
 * (trees; the decodes that fold, on small grids, with fp32 state and in the ring's write-through,
 * one position a channel); chain verifies and the big bf16 decodes that fold slide them
 * (conv_pass_sliding); a decode with nothing to fold loads its W taps at once (conv_pass_decode).
 * The caller syncs.
 * STORED_V false (the ring: its records keep their corrections): no v of the stored tokens, and the
 * own tokens' k and v rows start at ring_own_row0, not at seq.own0 (their place in the raw copy), so
 * that s.v's rows before ring_own_row0 may be another buffer's. FAST_SILU: silu's approximate form. */
template <typename I, bool STORED_V = true, bool FAST_SILU = false>
__device__ __forceinline__ void conv_pass_gathered(const gdn__layer_params &p, const mixer_channels &mc, const I *raw,
                                                   const char *weights_sh, const char *bias_sh,
                                                   const mixer_sequence &seq, int T, shared_tokens &s,
                                                   const int32_t *row_parents, int ring_own_row0 = 0)
{
    const int own_row0 = STORED_V ? seq.own0 : ring_own_row0;
    const gdn__mixer_params &m = p.mixer;
    const int W = m.conv_width, K = mc.K;
    const int own_start = seq.window_rows + seq.folds; /* logical position of own token 0 */
    for (int c = threadIdx.x; c < mc.width; c += blockDim.x) {
        float w[GDN__MAX_CONV_WIDTH];
#pragma unroll
        for (int j = 0; j < GDN__MAX_CONV_WIDTH; j++) w[j] = j < W ? conv_param(weights_sh, m.conv_weight_dtype, (int64_t)c * W + j) : 0.0f;
        const float bias = m.conv_bias ? conv_param(bias_sh, m.conv_weight_dtype, c) : 0.0f;
        const auto conv_at = [&](int logical) { /* the conv output of the token at this logical position */
            int at[GDN__MAX_CONV_WIDTH]; /* the logical position of tap j */
            at[GDN__MAX_CONV_WIDTH - 1] = logical;
            int node = row_parents && logical >= own_start ? logical - own_start : -1; /* a tree's own token */
#pragma unroll
            for (int j = GDN__MAX_CONV_WIDTH - 2; j >= 0; j--) {
                const int newer = at[j + 1];
                if (node >= 0) { /* the parent's position, or the last one before the own tokens */
                    const int parent = row_parents[node];
                    node = parent >= -1 && parent < node ? parent : -1; /* a bad parent: a padding token's */
                    at[j] = node >= 0 ? own_start + node : own_start - 1;
                } else {
                    at[j] = newer - 1;
                }
            }
            float acc = bias;
#pragma unroll
            for (int j = 0; j < GDN__MAX_CONV_WIDTH; j++)
                if (j < W)
                    acc = fmaf(w[j], gdn__to_f32(raw[seq.physical(at[GDN__MAX_CONV_WIDTH - W + j]) * mc.pitch + c]), acc);
            return silu<FAST_SILU>(acc);
        };
        for (int j = c < K || (!STORED_V && c >= 2 * K) ? seq.folds : 0; j < seq.folds; j++) { /* folded tokens: k and v */
            const float y = conv_at(seq.window_rows + j);
            if (c < 2 * K) s.khat[(size_t)j * K + (c - K)] = y;
            else s.v[(size_t)j * mc.rows + (c - 2 * K)] = y;
        }
        for (int t = 0; t < T; t++) {
            const float y = conv_at(seq.window_rows + seq.folds + t);
            const int j = own_row0 + t;
            if (c < K) s.qhat[(size_t)t * K + c] = y;
            else if (c < 2 * K) s.khat[(size_t)j * K + (c - K)] = y;
            else s.v[(size_t)j * mc.rows + (c - 2 * K)] = y;
        }
    }
}

/* The same conv for a chain (no parents: a chain verify, the big bf16 decodes that fold): every
 * channel's taps slide along its sequence in registers, one shared read a position instead of W.
 * Weights and taps are aligned to the newest tap (index GDN__MAX_CONV_WIDTH - 1), so that the runtime
 * W indexes nothing at run time. */
template <typename I, bool STORED_V = true, bool FAST_SILU = false>
__device__ __forceinline__ void conv_pass_sliding(const gdn__layer_params &p, const mixer_channels &mc, const I *raw,
                                                  const char *weights_sh, const char *bias_sh, const mixer_sequence &seq,
                                                  int T, shared_tokens &s, int ring_own_row0 = 0)
{
    constexpr int MW = GDN__MAX_CONV_WIDTH;
    const gdn__mixer_params &m = p.mixer;
    const int W = m.conv_width, K = mc.K;
    const int own_start = seq.window_rows + seq.folds; /* logical position of own token 0 */
    const int length = own_start + T;
    for (int c = threadIdx.x; c < mc.width; c += blockDim.x) {
        float w[MW];
#pragma unroll
        for (int j = 0; j < MW; j++)
            w[j] = j >= MW - W ? conv_param(weights_sh, m.conv_weight_dtype, (int64_t)c * W + j - (MW - W)) : 0.0f;
        const float bias = m.conv_bias ? conv_param(bias_sh, m.conv_weight_dtype, c) : 0.0f;
        /* The output at a logical position goes to prepared token own0 + t for own token t (q^: row
         * t), to folded token j for the one at window_rows + j (k and v only). */
        const bool is_q = c < K, is_k = !is_q && c < 2 * K;
        float *const dst = is_q ? s.qhat + c : is_k ? s.khat + (c - K) : s.v + (c - 2 * K);
        const int stride = is_k || is_q ? K : mc.rows;
        const int own_row0 = is_q ? 0 : STORED_V ? seq.own0 : ring_own_row0;
        const int first = is_q || (!STORED_V && !is_k) ? own_start : seq.window_rows;
        float x[MW];
#pragma unroll
        for (int j = 0; j < MW; j++) x[j] = 0.0f;
        for (int at = first - (W - 1); at < length; at++) { /* (first - (W - 1) >= 0: the window) */
#pragma unroll
            for (int j = 0; j + 1 < MW; j++) x[j] = x[j + 1];
            x[MW - 1] = gdn__to_f32(raw[seq.physical(at) * mc.pitch + c]);
            if (at < first) continue;
            float acc = bias;
#pragma unroll
            for (int j = 0; j < MW; j++)
                if (j >= MW - W) acc = fmaf(w[j], x[j], acc);
            const int row = at < own_start ? at - seq.window_rows : own_row0 + (at - own_start);
            dst[(size_t)row * stride] = silu<FAST_SILU>(acc);
        }
    }
}

/* The same conv for a decode with nothing to fold (every strategy's usual decode): one output a
 * channel from its W taps (the window's rows, then the own token's, raw row own0 + W - 1), every
 * tap's and weight's load issued before the first use, where the other passes wait for each tap in
 * turn; measured faster in every decode instance (bench/results/
 * 2026-11-29-h200-mixer-decode-conv-taps.md). The same sums in the same order as the other passes.
 * UNROLL_CHANNELS: the channel loop's unroll. */
template <typename I, bool FAST_SILU, int UNROLL_CHANNELS = 1>
__device__ __forceinline__ void conv_pass_decode(const gdn__layer_params &p, const mixer_channels &mc, const I *raw,
                                                 const char *weights_sh, const char *bias_sh, int own0, shared_tokens &s)
{
    constexpr int MW = GDN__MAX_CONV_WIDTH;
    const gdn__mixer_params &m = p.mixer;
    const int W = m.conv_width, K = mc.K;
    const I *const own_row = raw + (size_t)(W - 1 + own0) * mc.pitch;
#pragma unroll UNROLL_CHANNELS
    for (int c = threadIdx.x; c < mc.width; c += blockDim.x) {
        float w[MW], x[MW];
#pragma unroll
        for (int j = 0; j < MW; j++) { /* tap j - (MW - W): a window row, the last one the own token */
            const int tap = j - (MW - W);
            w[j] = tap >= 0 ? conv_param(weights_sh, m.conv_weight_dtype, (int64_t)c * W + tap) : 0.0f;
            x[j] = tap >= 0 ? gdn__to_f32((tap < W - 1 ? raw + (size_t)tap * mc.pitch : own_row)[c]) : 0.0f;
        }
        float acc = m.conv_bias ? conv_param(bias_sh, m.conv_weight_dtype, c) : 0.0f;
#pragma unroll
        for (int j = 0; j < MW; j++)
            if (j >= MW - W) acc = fmaf(w[j], x[j], acc);
        const float y = silu<FAST_SILU>(acc);
        if (c < K) s.qhat[c] = y;
        else if (c < 2 * K) s.khat[(size_t)own0 * K + (c - K)] = y;
        else s.v[(size_t)own0 * mc.rows + (c - 2 * K)] = y;
    }
}

/* Normalises a token's conv outputs in place (one warp): k^ (and q^ with k^.q^ for own tokens), as
 * prepare_token does for raw inputs. */
template <int K, bool WITH_Q>
__device__ __forceinline__ void normalise_token(const gdn__layer_params &p, shared_tokens &s, int j, int t, int lane)
{
    constexpr int KPL = K / 32;
    float *krow = s.khat + (size_t)j * K, *qrow = s.qhat + (size_t)t * K;
    float kx[KPL], qx[KPL];
#pragma unroll
    for (int e = 0; e < KPL; e++) {
        kx[e] = krow[lane * KPL + e];
        if (WITH_Q) qx[e] = qrow[lane * KPL + e];
    }
    store_normalised<K, WITH_Q>(p, s, kx, qx, krow, qrow, t, lane);
}

/* Slot w's window for local channels [c0, c1): the last W - 1 positions of the logical sequence of
 * `length` positions, from the raw copy (complete and synced). WIDE: 16-byte moves where the window's
 * rows allow them (the layer kernel's WIDE_MOVES says where they measured faster). */
template <typename I, bool WIDE>
__device__ __forceinline__ void write_window(const gdn__layer_params &p, const mixer_channels &mc, const I *raw,
                                             const mixer_sequence &seq, int length, int64_t w, int c0, int c1)
{
    const gdn__mixer_params &m = p.mixer;
    I *win = static_cast<I *>(m.conv_state) + w * m.conv_slot_stride;
    const int span = c1 - c0, n = seq.window_rows * span;
    constexpr int VW = 16 / (int)sizeof(I);
    if (WIDE && m.conv_channel_stride == 1 && m.conv_token_stride % VW == 0 && gdn__aligned(win, 16) && mc.runs_of(VW)) {
        const int runs = span / VW; /* (span: 2 K or the CTA's rows) */
#pragma unroll 1
        for (int e = threadIdx.x; e < seq.window_rows * runs; e += blockDim.x) {
            const int j = e / runs, c = c0 + (e - j * runs) * VW;
            *reinterpret_cast<uint4 *>(win + j * m.conv_token_stride + mc.global(c)) =
                *reinterpret_cast<const uint4 *>(raw + seq.physical(length - seq.window_rows + j) * mc.pitch + c);
        }
        return;
    }
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int j = e / span, c = c0 + (e - j * span);
        win[j * m.conv_token_stride + mc.global(c) * m.conv_channel_stride] =
            raw[seq.physical(length - seq.window_rows + j) * mc.pitch + c];
    }
}

/* Own tokens' raw x of local channels [c0, c1) to dst (token t at dst + t * token_elems, channel ch
 * at + ch): the fold's stored tokens of slot w, or the cache strategy's x store of the row. WIDE:
 * 16-byte moves where the destination allows them (as write_window). */
template <typename I, bool WIDE>
__device__ __forceinline__ void store_own_x(const mixer_channels &mc, const I *raw, const mixer_sequence &seq, int T,
                                            I *dst, int64_t token_elems, int c0, int c1)
{
    const int span = c1 - c0, n = T * span;
    constexpr int VW = 16 / (int)sizeof(I);
    if (WIDE && token_elems % VW == 0 && gdn__aligned(dst, 16) && mc.runs_of(VW)) {
        const int runs = span / VW; /* (span: 2 K or the CTA's rows) */
#pragma unroll 1
        for (int e = threadIdx.x; e < T * runs; e += blockDim.x) {
            const int t = e / runs, c = c0 + (e - t * runs) * VW;
            *reinterpret_cast<uint4 *>(dst + t * token_elems + mc.global(c)) =
                *reinterpret_cast<const uint4 *>(raw + (seq.window_rows + seq.own0 + t) * mc.pitch + c);
        }
        return;
    }
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int t = e / span, c = c0 + (e - t * span);
        dst[t * token_elems + mc.global(c)] = raw[(seq.window_rows + seq.own0 + t) * mc.pitch + c];
    }
}

/* Fold verify with the conv, by the row's last CTA: a and b of the row's T tokens into slot w's
 * stored tokens (x [conv_dim], then a [HV], b [HV]). */
template <typename I>
__device__ __forceinline__ void store_mixer_gates(const gdn__layer_params &p, int64_t i, int64_t w, int T)
{
    const int64_t token = gdn__mixer_token_elems(p.mixer.conv_dim, p.HV);
    I *store = static_cast<I *>(p.token_store) + w * p.store_tokens * token + p.mixer.conv_dim;
    const I *a = static_cast<const I *>(p.a), *b = static_cast<const I *>(p.b);
    for (int e = threadIdx.x; e < T * p.HV; e += blockDim.x) {
        const int t = e / p.HV, h = e - t * p.HV;
        const I av = a[gdn__at(p.a_strides, i, t, h)], bv = b[gdn__at(p.b_strides, i, t, h)];
        store[t * token + h] = av;
        store[t * token + p.HV + h] = bv;
    }
}

/* Counts the CTA in (thread 0; after a barrier that follows what it counts) and returns whether it
 * completed the count of `expected`, resetting it then. */
__device__ __forceinline__ bool arrive_last(uint32_t *count, uint32_t expected)
{
    const bool last = atomicAdd(count, 1u) == expected - 1;
    if (last) *count = 0;
    return last;
}

/* The gated RMSNorm of head h of row i: y = o rsqrt(mean_V(o^2) + eps) w silu(z) for each of the T
 * tokens, with z and w staged in shared memory. o is token t's [V] at o + t * o_token_stride: the
 * CTA's own shared copy when it holds the whole head, else the fp32 scratch every CTA of the head
 * left (each wrote, fenced, then counted in; read through L2 by the head's last CTA). A decode's
 * token is reduced by every thread; with WARP_PER_TOKEN (a verify's tokens) one warp reduces a token,
 * so that one barrier serves them all. */
template <typename I, typename O, bool FROM_SCRATCH, bool WARP_PER_TOKEN>
__device__ __forceinline__ void finish_norm(const gdn__layer_params &p, int64_t i, int h, int T, const float *o,
                                            int64_t o_token_stride, const I *z_sh, const float *norm_w_sh, O *out,
                                            int64_t out_base)
{
    const gdn__mixer_params &m = p.mixer;
    const int V = p.V, warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float eps = m.norm_eps > 0.0f ? m.norm_eps : 1e-6f;
    const auto o_at = [](const float *ot, int c) { return FROM_SCRATCH ? __ldcg(ot + c) : ot[c]; }; /* scratch: through L2 */
    const auto store = [&](int t, float scale) {
        const float *ot = o + t * o_token_stride;
        for (int c = threadIdx.x; c < V; c += blockDim.x) {
            const float zc = gdn__to_f32(z_sh[(size_t)t * V + c]);
            const float x = o_at(ot, c);
            out[out_base + t * p.out_strides.token + c] = gdn__from_f32<O>(x * scale * norm_w_sh[c] * silu(zc));
        }
    };
    if constexpr (WARP_PER_TOKEN) {
        __shared__ float scales[GDN_MAX_TOKENS];
        for (int t = warp; t < T; t += warps) {
            const float *ot = o + t * o_token_stride;
            float ss = 0.0f;
            for (int c = lane; c < V; c += 32) {
                const float x = o_at(ot, c);
                ss = fmaf(x, x, ss);
            }
            ss = group_sum<32>(ss);
            if (lane == 0) scales[t] = rsqrtf(ss / (float)V + eps);
        }
        __syncthreads();
        for (int t = 0; t < T; t++) store(t, scales[t]);
    } else {
        __shared__ float partial[32];
        for (int t = 0; t < T; t++) {
            const float *ot = o + t * o_token_stride;
            float ss = 0.0f;
            for (int c = threadIdx.x; c < V; c += blockDim.x) {
                const float x = o_at(ot, c);
                ss = fmaf(x, x, ss);
            }
            ss = group_sum<32>(ss);
            if (lane == 0) partial[warp] = ss;
            __syncthreads();
            float total = 0.0f;
            for (int n = 0; n < warps; n++) total += partial[n];
            __syncthreads(); /* partial is reused by the next token */
            store(t, rsqrtf(total / (float)V + eps));
        }
    }
}

#endif /* GDN_CUDA_MIXER_CUH */
