/*
 * The GDN layer-step kernel family: decode (T = 1, state updated in place) and verify (T = 2..16, the
 * state after every token written to the intermediate-state cache, the pool left alone). Semantics:
 * kernels/gdn_kernel_params.h and ../shared/SPEC.md sections 1 and 3.
 *
 * Why it looks like this. The step is memory-bound: per (row, value head) it reads a V x K state once
 * and writes it once (or T times into the cache), and everything else (q, k, v, a, b, o) is about 1%
 * of the traffic. So the design goal is moving the state at copy speed:
 *   - K-last state: a row of the state (K elements) is contiguous, so a group of L lanes reads one
 *     row with 16-byte vectors, coalesced (K = 128 fp32: one row per warp; bf16: two rows per warp).
 *   - Each thread owns RT rows of its warp's row tile, and loads all of them (RT * NV 16-byte vectors,
 *     32 fp32 values) before the first use, so many loads are in flight per thread.
 *   - The state stays in fp32 registers across the T tokens; it is rounded to the storage type only at
 *     the stores (the cache after each token, the pool once at the end).
 *   - One pass over a row computes both dot products, S_old.k^ and S_old.q^, using
 *       o[v] = g * (S_old[v,:] . q^) + u[v] * (k^ . q^),  u[v] = beta * (v[v] - g * S_old[v,:] . k^),
 *     and the new row g * S_old + u * k^ is formed in registers and stored.
 *   - Gates, norms of q and k and k^.q^ are recomputed by every lane group (a few hundred bytes from L2
 *     or L1; cheaper than a shared-memory round trip and a barrier).
 *
 * Launch geometry: blockIdx.y = batch row i, blockIdx.x = value head h * tiles_per_head + row tile.
 * A CTA has `warps` warps (1, 2 or 4, chosen at launch so that small batches still spread over the
 * SMs: at B = 1 a 32-head layer runs as hundreds of one-warp CTAs); a warp covers ROWS_PER_WARP
 * consecutive state rows of one head. Padding rows exit before touching the state.
 *
 * Template parameters: K (64, 128, 256), state storage S (float, bf16), input storage I (bf16, fp16),
 * output storage O (bf16, float), REPLAY (the replay verify strategy: the token loop starts with the
 * slot's pending tokens from its token store, t < 0, without outputs; EXPERIMENTAL, not yet run on a
 * GPU: the engine enables it only with GDN_EXPERIMENTAL_CUDA_REPLAY=1). V, T, HK, HV and the cache
 * flag are runtime values. With REPLAY false every replay branch is a compile-time constant.
 */
#include "cuda_common.cuh"
#include "gdn_cuda.h"

/* ---------------------------------------------------------------------------------------------- */
/* Geometry derived from the template parameters                                                    */
/* ---------------------------------------------------------------------------------------------- */

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

/* Minimum resident 128-thread CTAs per SM (__launch_bounds__), i.e. the register cap, measured on
 * H200 (bench/results/2026-11-21-h100-kernels.md): 64 values per thread: 4 (128 registers); fp32
 * decode: uncapped; otherwise 6 (80 registers, no spills). */
template <typename S, bool ONE_TOKEN, int REGS> constexpr int min_blocks()
{
    return REGS >= 64 ? 4 : ONE_TOKEN && sizeof(S) == 4 && REGS >= 32 ? 1 : 6;
}

template <int K, typename S, int REGS> struct layer_geometry {
    static constexpr int EV = gdn__vec16<S>::elems;          /* state elements per 16-byte vector */
    static constexpr int VEC_PER_ROW = K / EV;               /* 16-byte vectors in one state row */
    static constexpr int L = VEC_PER_ROW < 32 ? VEC_PER_ROW : 32; /* lanes sharing one row */
    static constexpr int NV = VEC_PER_ROW / L;               /* vectors per lane per row */
    static constexpr int G = 32 / L;                         /* rows a warp covers at once */
    static constexpr int RT = (REGS / (NV * EV)) > 0 ? REGS / (NV * EV) : 1; /* rows per thread */
    static constexpr int ROWS_PER_WARP = RT * G;
    static_assert(K % EV == 0 && VEC_PER_ROW % L == 0 && 32 % L == 0, "row split");
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

/* One token's inputs as a lane needs them: its NV slices of q and k (key head kh), v of its RT rows,
 * and the gate inputs a, b of value head h; all as fp32. */
template <typename I, int NV, int EV, int RT> struct token_inputs {
    float k[NV][EV], q[NV][EV], v[RT], a, b;

    __device__ __forceinline__ void load(const gdn__layer_params &p, const I *kp, const I *qp, const I *vp,
                                         const I *ap, const I *bp, int64_t tok, int kh, int h, int row0, int G,
                                         int glane, int L)
    {
        const int K = p.K;
        const int64_t qk_base = (tok * p.HK + kh) * K;
#pragma unroll
        for (int n = 0; n < NV; n++) {
            gdn__load_vec<I, EV>(kp + qk_base + (n * L + glane) * EV, k[n]);
            gdn__load_vec<I, EV>(qp + qk_base + (n * L + glane) * EV, q[n]);
        }
        const int64_t gate = tok * p.HV + h;
        a = gdn__to_f32(ap[gate]);
        b = gdn__to_f32(bp[gate]);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) v[rt] = gdn__to_f32(vp[gate * p.V + row0 + rt * G]);
    }
};

/* ---------------------------------------------------------------------------------------------- */
/* Kernel template                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

/* Stores the thread's state rows (rounded once to S) into a head's [V, K] block at dst. */
template <int K, typename S, typename Geo>
__device__ __forceinline__ void store_rows(S *dst, const float (&st)[Geo::RT][Geo::NV][Geo::EV], int row0, int glane)
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
            gdn__store_vec<S, Geo::EV>(dst + (int64_t)(row0 + rt * Geo::G) * K + (n * Geo::L + glane) * Geo::EV, st[rt][n]);
}

/* Replay verify: saves v of this thread's rows of token `t` (one lane a row; exact in the input
 * type) as slot w's stored token t. Each CTA reads and writes only its own rows' v, so this may run
 * right after the CTA's own fold; k, a and b, which other CTAs of the row fold from, are stored by the
 * row's last CTA (store_shared_inputs). */
template <int K, typename I, int RT, int G>
__device__ __forceinline__ void store_token_v(const gdn__layer_params &p, const float (&v)[RT], int64_t w, int t, int h,
                                              int row0, int glane)
{
    const int HV = p.HV, V = p.V;
    I *vs = static_cast<I *>(p.token_store) + (w * p.store_tokens + t) * gdn__token_elems(p.HK, HV, K, V) +
            (int64_t)p.HK * K + (int64_t)h * V;
    if (glane == 0)
#pragma unroll
        for (int rt = 0; rt < RT; rt++) vs[row0 + rt * G] = gdn__from_f32<I>(v[rt]);
}

/* Replay verify, by the row's last CTA (every fold from the read slot's tokens is done): copies k
 * [HK, K], a [HV] and b [HV] of row i's T tokens into slot w's stored tokens, with all its threads. */
template <int K, typename I>
__device__ __forceinline__ void store_shared_inputs(const gdn__layer_params &p, int64_t i, int64_t w, int T)
{
    const int64_t qk = (int64_t)p.HK * K, gates = p.HV, token = gdn__token_elems(p.HK, p.HV, K, p.V);
    const I *k = static_cast<const I *>(p.k), *a = static_cast<const I *>(p.a), *b = static_cast<const I *>(p.b);
    for (int t = 0; t < T; t++) {
        I *dst = static_cast<I *>(p.token_store) + (w * p.store_tokens + t) * token;
        const int64_t tok = i * T + t;
        for (int64_t e = threadIdx.x; e < qk; e += blockDim.x) dst[e] = k[tok * qk + e];
        I *g = dst + qk + (int64_t)p.HV * p.V;
        for (int64_t e = threadIdx.x; e < gates; e += blockDim.x) {
            g[e] = a[tok * gates + e];
            g[gates + e] = b[tok * gates + e];
        }
    }
}

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool REPLAY>
__global__ void __launch_bounds__(128, (min_blocks<S, ONE_TOKEN, REGS>())) layer_step_kernel(const gdn__layer_params p)
{
    using Geo = layer_geometry<K, S, REGS>;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int group = lane / L;   /* which of the G rows of a warp step */
    const int glane = lane % L;   /* lane within the row group */
    const int warps = blockDim.x >> 5;
    const int V = p.V, T = ONE_TOKEN ? 1 : p.T, HV = p.HV;
    const int tile_rows = warps * Geo::ROWS_PER_WARP;
    const int tiles_per_head = V / tile_rows;
    const int h = blockIdx.x / tiles_per_head;
    const int tile = blockIdx.x % tiles_per_head;
    const int64_t i = blockIdx.y;
    const int row0 = tile * tile_rows + warp * Geo::ROWS_PER_WARP + group; /* row of rt = 0 */

    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    const bool out_of_range = r >= p.num_slots || w >= p.num_slots;
    O *out = static_cast<O *>(p.out);
    const int64_t out_token_stride = (int64_t)HV * V;
    const int64_t out_base = (i * T * HV + h) * V; /* (i, t = 0, h, row 0) */

    if (r < 0 || out_of_range) {
        if (out_of_range && p.error_flag && threadIdx.x == 0) *p.error_flag = 1;
        if (glane == 0)
            for (int t = 0; t < T; t++)
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
                    out[out_base + t * out_token_stride + row0 + rt * G] = gdn__from_f32<O>(0.0f);
        return;
    }

    /* Load every owned state row before the first use: RT * NV independent 16-byte loads. */
    const int64_t state_elems = (int64_t)V * K;
    const S *src = static_cast<const S *>(p.state) + r * p.slot_stride + h * state_elems;
    float st[RT][NV][EV];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int n = 0; n < NV; n++)
            gdn__load_vec_stream<S, EV>(src + (int64_t)(row0 + rt * G) * K + (n * L + glane) * EV, st[rt][n]);

    const int kh = h / (HV / p.HK);
    const float A = expf(p.A_log[h]);
    const float dt_bias = p.dt_bias[h];
    const I *qp = static_cast<const I *>(p.q), *kp = static_cast<const I *>(p.k);
    const I *vp = static_cast<const I *>(p.v), *ap = static_cast<const I *>(p.a);
    const I *bp = static_cast<const I *>(p.b);
    S *cache = static_cast<S *>(p.cache);
    const int64_t cache_token_stride = (int64_t)HV * state_elems;

    /* Replay: tokens -pending..-1 are the read slot's accepted tokens of its last verify. */
    const int pending = REPLAY ? p.pending[r] : 0;

    /* (Loading token t + 1's inputs during token t was measured slower: the extra registers cost
     * more occupancy than the hidden latency gained.) */
    for (int t = -pending; t < T; t++) {
        token_inputs<I, NV, EV, RT> cur;
        if (REPLAY && t < 0) {
            const I *tb = static_cast<const I *>(p.token_store) +
                          (r * p.store_tokens + (t + pending)) * gdn__token_elems(p.HK, HV, K, V);
            const I *va = tb + (int64_t)p.HK * K, *ga = va + (int64_t)HV * V;
            cur.load(p, tb, tb, va, ga, ga + HV, 0, kh, h, row0, G, glane, L);
        } else {
            cur.load(p, kp, qp, vp, ap, bp, i * T + t, kh, h, row0, G, glane, L);
        }
        if (REPLAY && p.replay_verify && t == 0) /* the pool gets the folded state; own tokens stay pending */
            store_rows<K, S, Geo>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems, st, row0, glane);
        if (REPLAY && p.replay_verify && t >= 0) store_token_v<K, I, RT, G>(p, cur.v, w, t, h, row0, glane);
        float(&kv)[NV][EV] = cur.k;
        float(&qv)[NV][EV] = cur.q;
        const float(&vrow)[RT] = cur.v;
        const float x = cur.a + dt_bias;
        const float beta = 1.0f / (1.0f + expf(-cur.b));

        const float sp = x <= 20.0f ? log1pf(expf(x)) : x;
        const float g = expf(-A * sp);
        float kk = 0.0f, qq = 0.0f, kq = 0.0f;
#pragma unroll
        for (int n = 0; n < NV; n++)
#pragma unroll
            for (int e = 0; e < EV; e++) {
                kk = fmaf(kv[n][e], kv[n][e], kk);
                qq = fmaf(qv[n][e], qv[n][e], qq);
                kq = fmaf(kv[n][e], qv[n][e], kq);
            }
        kk = group_sum<L>(kk);
        qq = group_sum<L>(qq);
        kq = group_sum<L>(kq);
        const float rk = p.use_qk_l2norm ? rsqrtf(kk + 1e-6f) : 1.0f;
        const float rq = p.scale * (p.use_qk_l2norm ? rsqrtf(qq + 1e-6f) : 1.0f);
        const float kq_hat = kq * rk * rq;
#pragma unroll
        for (int n = 0; n < NV; n++)
#pragma unroll
            for (int e = 0; e < EV; e++) {
                kv[n][e] *= rk;
                qv[n][e] *= rq;
            }

        /* Both dot products of every owned row with the old state, then the update. */
        float dk[RT], dq[RT];
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e++) {
                    a0 = fmaf(st[rt][n][e], kv[n][e], a0);
                    a1 = fmaf(st[rt][n][e], qv[n][e], a1);
                }
            dk[rt] = a0;
            dq[rt] = a1;
        }
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1)
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                dk[rt] += __shfl_xor_sync(0xffffffffu, dk[rt], off);
                dq[rt] += __shfl_xor_sync(0xffffffffu, dq[rt], off);
            }

        S *dst_tok = cache && !(REPLAY && t < 0) ? cache + i * p.cache_row_stride + t * cache_token_stride + h * state_elems
                                                 : nullptr;
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const float u = beta * (vrow[rt] - g * dk[rt]);
            const float o = g * dq[rt] + u * kq_hat;
            if (glane == 0 && !(REPLAY && t < 0)) out[out_base + t * out_token_stride + row0 + rt * G] = gdn__from_f32<O>(o);
#pragma unroll
            for (int n = 0; n < NV; n++) {
#pragma unroll
                for (int e = 0; e < EV; e++) st[rt][n][e] = fmaf(g, st[rt][n][e], u * kv[n][e]);
                if (dst_tok)
                    gdn__store_vec<S, EV>(dst_tok + (int64_t)(row0 + rt * G) * K + (n * L + glane) * EV, st[rt][n]);
            }
        }
    }

    if (!cache && !(REPLAY && p.replay_verify))
        store_rows<K, S, Geo>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems, st, row0, glane);

    if constexpr (REPLAY) { /* the row's last CTA: every CTA has read pending[r] and folded */
        __shared__ int last_cta;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            last_cta = atomicAdd(&p.arrivals[i], 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (last_cta) {
            if (p.replay_verify) store_shared_inputs<K, I>(p, i, w, T);
            if (threadIdx.x == 0) {
                p.pending[w] = 0;
                p.arrivals[i] = 0;
                __threadfence();
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* CTAs below which a launch uses fewer warps per CTA (more, smaller CTAs) to reach more SMs. */
#define GDN__SMALL_GRID_CTAS 1024

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool REPLAY>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    using Geo = layer_geometry<K, S, REGS>;
    int warps = 4;
    while (warps > 1 && ((int64_t)p->V % (warps * Geo::ROWS_PER_WARP) != 0 ||
                         (int64_t)p->B * p->HV * (p->V / (warps * Geo::ROWS_PER_WARP)) < GDN__SMALL_GRID_CTAS))
        warps /= 2;
    const int tiles_per_head = p->V / (warps * Geo::ROWS_PER_WARP);
    const dim3 grid((unsigned)(p->HV * tiles_per_head), (unsigned)p->B);
    layer_step_kernel<K, S, I, O, REGS, ONE_TOKEN, REPLAY><<<grid, warps * 32, 0, stream>>>(*p);
    GDN__CUDA_TRY(cudaGetLastError());
    return GDN_OK;
}

/* Large grids: more state per thread (more bytes in flight per SM); small grids: less state per
 * thread, so that the work spreads over more warps and SMs. */
template <int K, typename S, typename I, typename O, bool ONE_TOKEN, bool REPLAY>
static gdn_status launch_tokens(const gdn__layer_params *p, cudaStream_t stream)
{
    constexpr int BIG = big_regs<S>();
    using Big = layer_geometry<K, S, BIG>;
    using Small = layer_geometry<K, S, GDN__STATE_REGS_SMALL>;
    const int64_t big_warps = (int64_t)p->B * p->HV * (p->V / Big::ROWS_PER_WARP);
    const int64_t small_warps = (int64_t)p->B * p->HV * (p->V / Small::ROWS_PER_WARP);
    if (big_warps >= 4 * GDN__SMALL_GRID_CTAS) return launch_regs<K, S, I, O, BIG, ONE_TOKEN, REPLAY>(p, stream);
    /* The smallest decode grids (e.g. B = 1 of a 32-head layer): fewer rows per warp, shorter chains. */
    if (ONE_TOKEN && small_warps < 2 * GDN__SMALL_GRID_CTAS)
        return launch_regs<K, S, I, O, GDN__STATE_REGS_TINY, ONE_TOKEN, REPLAY>(p, stream);
    return launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, ONE_TOKEN, REPLAY>(p, stream);
}

template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    if (p->token_store) /* replay; T = 0 is a flush (fold only) */
        return p->T == 1 ? launch_tokens<K, S, I, O, true, true>(p, stream) : launch_tokens<K, S, I, O, false, true>(p, stream);
    return p->T == 1 ? launch_tokens<K, S, I, O, true, false>(p, stream) : launch_tokens<K, S, I, O, false, false>(p, stream);
}

/* ---------------------------------------------------------------------------------------------- */
/* Dispatch: runtime values to template instances                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* One switch over (K, state, input, output); any combination not listed is GDN_ENOTSUP. */
#define GDN__LAYER_KEY(K, s, in, out) (((K) << 8) | ((s) << 4) | ((in) << 2) | (out))
#define GDN__LAYER_CASE(K, s, S, in, I, out, O)                                                    \
    case GDN__LAYER_KEY(K, GDN_DTYPE_##s, GDN_DTYPE_##in, GDN_DTYPE_##out):                        \
        return run ? launch<K, S, I, O>(p, stream) : GDN_OK;
#define GDN__LAYER_CASES_K(K)                                                                      \
    GDN__LAYER_CASE(K, F32, float, BF16, __nv_bfloat16, BF16, __nv_bfloat16)                       \
    GDN__LAYER_CASE(K, F32, float, BF16, __nv_bfloat16, F32, float)                                \
    GDN__LAYER_CASE(K, F32, float, F16, __half, BF16, __nv_bfloat16)                               \
    GDN__LAYER_CASE(K, F32, float, F16, __half, F32, float)                                        \
    GDN__LAYER_CASE(K, BF16, __nv_bfloat16, BF16, __nv_bfloat16, BF16, __nv_bfloat16)              \
    GDN__LAYER_CASE(K, BF16, __nv_bfloat16, BF16, __nv_bfloat16, F32, float)                       \
    GDN__LAYER_CASE(K, BF16, __nv_bfloat16, F16, __half, BF16, __nv_bfloat16)                      \
    GDN__LAYER_CASE(K, BF16, __nv_bfloat16, F16, __half, F32, float)

static gdn_status dispatch(const gdn__layer_params *p, cudaStream_t stream, bool run)
{
    if ((unsigned)p->state_dtype > 3u || (unsigned)p->input_dtype > 3u || (unsigned)p->output_dtype > 3u)
        return GDN_ENOTSUP;
    switch (GDN__LAYER_KEY(p->K, (int)p->state_dtype, (int)p->input_dtype, (int)p->output_dtype)) {
        GDN__LAYER_CASES_K(64)
        GDN__LAYER_CASES_K(128)
        GDN__LAYER_CASES_K(256)
    default: return GDN_ENOTSUP;
    }
}

/* Shape and alignment checks shared by both entry points (GDN_ENOTSUP for what no instance runs). */
static gdn_status check_shape(const gdn__layer_params *p)
{
    if (p->T < (p->token_store ? 0 : 1) || p->T > GDN_MAX_TOKENS || p->B < 0 || p->B > 65535) return GDN_ENOTSUP;
    if (p->token_store && (p->cache || !p->pending || !p->arrivals || p->store_tokens < 1))
        return GDN_EINVAL;
    if (p->V != 64 && p->V != 128 && p->V != 256) return GDN_ENOTSUP;
    if (p->HK < 1 || p->HV < 1 || p->HV % p->HK != 0) return GDN_ENOTSUP;
    if ((int64_t)p->HV * p->V > 65536 * 16) return GDN_ENOTSUP; /* grid x stays far below its limit */
    const int64_t elem = p->state_dtype == GDN_DTYPE_F32 ? 4 : 2;
    /* 16-byte vector accesses: the pool, its slots and the cache rows must stay 16-byte aligned. */
    if (!gdn__aligned(p->state, 16) || (p->slot_stride * elem) % 16 != 0) return GDN_ENOTSUP;
    if (p->cache && (!gdn__aligned(p->cache, 16) || (p->cache_row_stride * elem) % 16 != 0)) return GDN_ENOTSUP;
    if (!gdn__aligned(p->q, 16) || !gdn__aligned(p->k, 16)) return GDN_ENOTSUP;
    return dispatch(p, nullptr, false);
}

extern "C" gdn_status gdn__cuda_layer_step_supported(const gdn__layer_params *p)
{
    if (!p) return GDN_EINVAL;
    return check_shape(p);
}

extern "C" gdn_status gdn__cuda_layer_step(const gdn__layer_params *p, void *stream)
{
    if (!p) return GDN_EINVAL;
    const gdn_status shape = check_shape(p);
    if (shape != GDN_OK) return shape;
    if (p->B == 0) return GDN_OK;
    if (!p->q || !p->k || !p->v || !p->a || !p->b || !p->A_log || !p->dt_bias || !p->state || !p->out ||
        !p->read_slots || p->slot_stride < (int64_t)p->HV * p->V * p->K || p->num_slots < 0)
        return GDN_EINVAL;
    if (p->cache && p->cache_row_stride < (int64_t)p->T * p->HV * p->V * p->K) return GDN_EINVAL;
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}
