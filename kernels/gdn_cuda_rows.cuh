/*
 * What the CUDA layer kernels share (gdn_cuda_layer.cu: cache and fold strategies; gdn_cuda_ring.cu:
 * the ring strategy): how a head's state rows are split over threads, lane-group sums, the per-token
 * gates of SPEC 1, and the store of a thread's rows.
 */
#ifndef GDN_CUDA_ROWS_CUH
#define GDN_CUDA_ROWS_CUH

#include "cuda_common.cuh"
#include "gdn_kernel_params.h"

/* Tuning knobs (fixed after measurement; overridable for experiments): state values per thread for
 * large grids and for small grids (B = 1 needs many small CTAs), and the minimum resident CTAs per SM
 * given to __launch_bounds__. */
#ifndef GDN__STATE_REGS_SMALL
#define GDN__STATE_REGS_SMALL 16
#endif
#ifndef GDN__STATE_REGS_TINY
#define GDN__STATE_REGS_TINY 8
#endif

/* State values per thread on large grids. bf16 state holds 64 (16-byte loads carry 8 values, so 32
 * would leave too few bytes in flight per SM); fp32 holds 32. */
template <typename S> constexpr int big_regs() { return sizeof(S) == 2 ? 64 : 32; }
/* (The fold instances too: 32 bf16 values per thread, more warps for the token loop, was measured
 * slower on the H100, 2026-11-22.) */

/* SHARED (tokens prepared once per CTA in shared memory, see below): a thread holds 16 elements of
 * a row (EPT), so that a row's dot product needs only log2(K / 16) shuffle levels; otherwise a row is
 * split into 16-byte vectors over up to 32 lanes, the widest coalesced access. */
template <int K, typename S, int REGS, bool SHARED> struct layer_geometry {
    static constexpr int EV = gdn__vec16<S>::elems;          /* state elements per 16-byte vector */
    static constexpr int VEC_PER_ROW = K / EV;               /* 16-byte vectors in one state row */
    static constexpr int L = SHARED ? K / (REGS < 16 ? REGS : 16) : (VEC_PER_ROW < 32 ? VEC_PER_ROW : 32);
    static constexpr int NV = VEC_PER_ROW / L;               /* vectors per lane per row */
    static constexpr int EPT = NV * EV;                      /* elements of one row a thread holds */
    static constexpr int G = 32 / L;                         /* rows a warp covers at once */
    static constexpr int RT = REGS / EPT > 0 ? REGS / EPT : 1; /* rows per thread */
    static constexpr int ROWS_PER_WARP = RT * G;
    static_assert(K % EV == 0 && NV >= 1 && VEC_PER_ROW % L == 0 && 32 % L == 0, "row split");
    static_assert(64 % ROWS_PER_WARP == 0, "a warp tile must divide every V (64, 128, 256)");
};

/* Sum over the L lanes of a lane group (L a power of two <= 32). A butterfly: every lane of the
 * group ends with the same, bit-identical, sum. */
template <int L> __device__ __forceinline__ float group_sum(float x)
{
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* The per-token scalars of SPEC 1, in one place for both staging paths: the decay g = exp(-A
 * softplus(a + dt_bias)) (its log, for the ring strategy's cumulative decays) and beta = sigmoid(b); and
 * the scales that normalise k and q. */
__device__ __forceinline__ float token_log_decay(float a, float A, float dt_bias)
{
    const float x = a + dt_bias;
    const float sp = x <= 20.0f ? log1pf(expf(x)) : x;
    return -A * sp;
}
__device__ __forceinline__ float token_beta(float b) { return 1.0f / (1.0f + expf(-b)); }
__device__ __forceinline__ void token_gate(float a, float b, float A, float dt_bias, float &g, float &beta)
{
    g = expf(token_log_decay(a, A, dt_bias));
    beta = token_beta(b);
}
__device__ __forceinline__ float l2norm_scale(const gdn__layer_params &p, float xx)
{
    return p.use_qk_l2norm ? rsqrtf(xx + 1e-6f) : 1.0f;
}
__device__ __forceinline__ void norm_scales(const gdn__layer_params &p, float kk, float qq, float &rk, float &rq)
{
    rk = l2norm_scale(p, kk);
    rq = p.scale * l2norm_scale(p, qq);
}

/* The ring strategy (no mixer): row i's step inputs become records base..base+T-1 of ring_w
 * (gdn_kernel_params.h's layout): every key head's raw k and every value head's pair {norm scale of
 * its key head's k, log decay}, a thread (of `threads`, tid 0..) a (token, key head), its k's loads
 * in flight together (the row's last CTA or warp runs this at the end of its kernel: a few round
 * trips a thread). */
template <int K, typename I>
__device__ __forceinline__ void write_input_records(const gdn__layer_params &p, int64_t i, char *ring_w, int64_t record_bytes,
                                                    int base, int T, int tid, int threads)
{
    constexpr int PER_PIECE = 16 / (int)sizeof(I), PIECES = K / PER_PIECE, CHUNK = PIECES < 8 ? PIECES : 8;
    const int HK = p.HK, per_key = p.HV / HK;
    const int64_t pair_offset = gdn__ring_norm_decay_offset(HK, K);
    for (int row = tid; row < T * HK; row += threads) {
        const int t = row / HK, kh = row % HK;
        char *const record = ring_w + (base + t) * record_bytes;
        const uint4 *from = reinterpret_cast<const uint4 *>(static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh));
        uint4 *to = reinterpret_cast<uint4 *>(record + (int64_t)kh * K * (int64_t)sizeof(I));
        float xx = 0.0f;
#pragma unroll
        for (int c0 = 0; c0 < PIECES; c0 += CHUNK) {
            uint4 bits[CHUNK];
#pragma unroll
            for (int c = 0; c < CHUNK; c++) bits[c] = from[c0 + c];
#pragma unroll
            for (int c = 0; c < CHUNK; c++) {
                to[c0 + c] = bits[c];
                gdn__raw_vec<I, PER_PIECE> raw;
                memcpy(&raw, &bits[c], 16);
                float x[PER_PIECE];
                gdn__widen_raw<I, PER_PIECE>(raw, x);
#pragma unroll
                for (int e = 0; e < PER_PIECE; e++) xx = fmaf(x[e], x[e], xx);
            }
        }
        const float scale = l2norm_scale(p, xx);
        for (int vh = kh * per_key; vh < (kh + 1) * per_key; vh++) {
            const float a = gdn__to_f32(static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, vh)]);
            reinterpret_cast<float2 *>(record + pair_offset)[vh] = make_float2(scale, token_log_decay(a, expf(p.A_log[vh]), p.dt_bias[vh]));
        }
    }
}

/* A row whose read slot is padding (< 0) or whose slots cannot be used (out_of_range: the flag is
 * raised): the thread's output rows of its head are zero for every token, nothing else is touched.
 * The thread's rows: row0 + b * block_rows + rt * G for b < blocks (row sets, or the ring's passes).
 * With overlap, the zeros wait for the preceding kernel, which may still read the output. */
template <typename O, typename Geo>
__device__ __forceinline__ void zero_padding_row(const gdn__layer_params &p, bool out_of_range, O *out, int64_t out_base,
                                                 int T, int row0, int blocks, int block_rows, int glane)
{
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    if (out_of_range && p.error_flag && threadIdx.x == 0) *p.error_flag = 1;
    if (glane == 0)
        for (int t = 0; t < T; t++)
            for (int b = 0; b < blocks; b++)
#pragma unroll
                for (int rt = 0; rt < Geo::RT; rt++)
                    out[out_base + t * p.out_strides.token + row0 + b * block_rows + rt * Geo::G] = gdn__from_f32<O>(0.0f);
}

/* Loads the thread's state rows of a head's [V, K] block at src into fp32 registers: RT * NV
 * independent 16-byte loads, evict-first (a step reads the state once), all issued before any use. */
template <int K, typename S, typename Geo, bool WORDS = false>
__device__ __forceinline__ void load_rows(const S *src, float (&st)[Geo::RT][Geo::NV][Geo::EV], int row0, int glane)
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
            gdn__load_vec_stream<S, Geo::EV, WORDS>(src + (int64_t)(row0 + rt * Geo::G) * K + (n * Geo::L + glane) * Geo::EV,
                                             st[rt][n]);
}

/* Prefetches into L2 the lines that load_rows would read at row0 (one lane per 128-byte line), so that
 * a later pass over them waits on L2, not DRAM. */
template <int K, typename S, typename Geo> __device__ __forceinline__ void prefetch_rows(const S *src, int row0, int glane)
{
    constexpr int LANES_PER_LINE = 128 / (Geo::EV * (int)sizeof(S));
    if (glane % LANES_PER_LINE != 0) return;
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
            gdn__prefetch_l2(src + (int64_t)(row0 + rt * Geo::G) * K + (n * Geo::L + glane) * Geo::EV);
}

/* The thread's slice of an fp32 row of K values in shared memory (the columns its state values hold). */
template <typename Geo>
__device__ __forceinline__ void load_slice(const float *row, float (&x)[Geo::NV][Geo::EV], int glane)
{
#pragma unroll
    for (int n = 0; n < Geo::NV; n++)
#pragma unroll
        for (int e = 0; e < Geo::EV; e += 4)
            *reinterpret_cast<float4 *>(&x[n][e]) = *reinterpret_cast<const float4 *>(row + (n * Geo::L + glane) * Geo::EV + e);
}

/* Sums a[rt] (and b[rt] when BOTH) over each row's L lanes, all rows' shuffles interleaved. */
template <int L, int RT, bool BOTH> __device__ __forceinline__ void row_sums(float (&a)[RT], float (&b)[RT])
{
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1)
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            a[rt] += __shfl_xor_sync(0xffffffffu, a[rt], off);
            if (BOTH) b[rt] += __shfl_xor_sync(0xffffffffu, b[rt], off);
        }
}

/* Multiplies every state value the thread holds by f. */
template <typename Geo> __device__ __forceinline__ void scale_rows(float (&st)[Geo::RT][Geo::NV][Geo::EV], float f)
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) st[rt][n][e] *= f;
}

/* Stores the thread's state rows (times `decay` when DECAY_OUTSIDE), rounded once to S, into a
 * head's [V, K] block at dst. */
template <int K, typename S, typename Geo, bool DECAY_OUTSIDE>
__device__ __forceinline__ void store_rows(S *dst, const float (&st)[Geo::RT][Geo::NV][Geo::EV], float decay, int row0,
                                           int glane)
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++) {
            S *at = dst + (int64_t)(row0 + rt * Geo::G) * K + (n * Geo::L + glane) * Geo::EV;
            if constexpr (DECAY_OUTSIDE) {
                float x[Geo::EV];
#pragma unroll
                for (int e = 0; e < Geo::EV; e++) x[e] = st[rt][n][e] * decay;
                gdn__store_vec<S, Geo::EV>(at, x);
            } else {
                gdn__store_vec<S, Geo::EV>(at, st[rt][n]);
            }
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* Launch shapes, shared by the layer and ring launchers                                            */
/* ---------------------------------------------------------------------------------------------- */

/* CTAs below which a launch uses fewer warps per CTA (more, smaller CTAs) to reach more SMs, and
 * the scale of the grids that take fewer state values a thread. */
#ifndef GDN__SMALL_GRID_CTAS
#define GDN__SMALL_GRID_CTAS 1024
#endif

/* State values a thread holds (layer_geometry's REGS) on p's grid: more on large grids (more bytes in
 * flight per SM), fewer on small ones so that the work spreads over more warps and SMs, fewest on
 * the smallest one-token grids (e.g. B = 1 of a 32-head layer: shorter chains). The big instance
 * starts at `big_from` GDN__SMALL_GRID_CTAS of its warps: GDN__BIG_FROM_USUAL, fewer where the launchers
 * measured it faster (layer_big_from; the ring's launch_tokens). */
enum class state_regs { big, small, tiny };
constexpr int GDN__BIG_FROM_USUAL = 4;
template <int K, typename S, bool SHARED>
inline state_regs state_regs_for(const gdn__layer_params *p, bool one_token, int big_from = GDN__BIG_FROM_USUAL)
{
    using Big = layer_geometry<K, S, big_regs<S>(), SHARED>;
    using Small = layer_geometry<K, S, GDN__STATE_REGS_SMALL, SHARED>;
    const int64_t heads = (int64_t)p->B * p->HV;
    if (heads * (p->V / Big::ROWS_PER_WARP) >= big_from * GDN__SMALL_GRID_CTAS) return state_regs::big;
    if (one_token && heads * (p->V / Small::ROWS_PER_WARP) < 2 * GDN__SMALL_GRID_CTAS) return state_regs::tiny;
    return state_regs::small;
}

/* Warps per CTA (max_warps, halved down to 1) for CTAs of `sets` row sets: halved while a CTA's
 * warps' rows do not divide V or the grid would have fewer than min_ctas CTAs. */
template <typename Geo> inline int warps_for(const gdn__layer_params *p, int sets, int64_t min_ctas, int max_warps = 4)
{
    int warps = max_warps;
    while (warps > 1 && (p->V % (warps * Geo::ROWS_PER_WARP) != 0 ||
                         (int64_t)p->B * p->HV * (p->V / (sets * warps * Geo::ROWS_PER_WARP)) < min_ctas))
        warps /= 2;
    return warps;
}

/* One switch from runtime (K, state, input, output) to template instances, for each kernel family's
 * launcher LAUNCH<K, S, I, O>(p, stream); a combination not listed is GDN_ENOTSUP. */
#define GDN__LAYER_KEY(K, s, in, out) (((K) << 8) | ((s) << 4) | ((in) << 2) | (out))
#define GDN__LAYER_CASE(LAUNCH, K, s, S, in, I, out, O)                                            \
    case GDN__LAYER_KEY(K, GDN_DTYPE_##s, GDN_DTYPE_##in, GDN_DTYPE_##out):                        \
        return run ? LAUNCH<K, S, I, O>(p, stream) : GDN_OK;
#define GDN__LAYER_CASES_K(LAUNCH, K)                                                              \
    GDN__LAYER_CASE(LAUNCH, K, F32, float, BF16, __nv_bfloat16, BF16, __nv_bfloat16)               \
    GDN__LAYER_CASE(LAUNCH, K, F32, float, BF16, __nv_bfloat16, F32, float)                        \
    GDN__LAYER_CASE(LAUNCH, K, F32, float, F16, __half, BF16, __nv_bfloat16)                       \
    GDN__LAYER_CASE(LAUNCH, K, F32, float, F16, __half, F32, float)                                \
    GDN__LAYER_CASE(LAUNCH, K, BF16, __nv_bfloat16, BF16, __nv_bfloat16, BF16, __nv_bfloat16)      \
    GDN__LAYER_CASE(LAUNCH, K, BF16, __nv_bfloat16, BF16, __nv_bfloat16, F32, float)               \
    GDN__LAYER_CASE(LAUNCH, K, BF16, __nv_bfloat16, F16, __half, BF16, __nv_bfloat16)              \
    GDN__LAYER_CASE(LAUNCH, K, BF16, __nv_bfloat16, F16, __half, F32, float)
/* The body of a dispatch function over `p`, `stream` and `run` (false: only check the case exists),
 * over the given cases (GDN__LAYER_CASES_K of each head size that runs). */
#define GDN__LAYER_DISPATCH_CASES(CASES)                                                           \
    if ((unsigned)p->state_dtype > 3u || (unsigned)p->input_dtype > 3u || (unsigned)p->output_dtype > 3u) \
        return GDN_ENOTSUP;                                                                        \
    switch (GDN__LAYER_KEY(p->K, (int)p->state_dtype, (int)p->input_dtype, (int)p->output_dtype)) { \
        CASES                                                                                      \
    default: return GDN_ENOTSUP;                                                               \
    }
#define GDN__LAYER_DISPATCH(LAUNCH)                                                                \
    GDN__LAYER_DISPATCH_CASES(GDN__LAYER_CASES_K(LAUNCH, 64) GDN__LAYER_CASES_K(LAUNCH, 128)       \
                                  GDN__LAYER_CASES_K(LAUNCH, 256))
/* With the mixer: K = 128 only, both Qwen models (the host's gdn__cuda_mixer_runs says the same). */
#define GDN__MIXER_DISPATCH(LAUNCH) GDN__LAYER_DISPATCH_CASES(GDN__LAYER_CASES_K(LAUNCH, 128))

#endif /* GDN_CUDA_ROWS_CUH */
