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
 *   - Cache strategy (decode, verify): gates, norms of q and k and k^.q^ are recomputed by every lane
 *     group (a few hundred bytes from L2 or L1; cheaper than a shared-memory round trip and a barrier).
 *   - Fold strategy: a row first folds up to max_tokens stored tokens, so the step is no longer
 *     purely memory-bound (profiled: instruction issue and latency). Its CTAs prepare each token once
 *     (k^, q^, v of the CTA's rows, g, beta, k^.q^) in shared memory, one warp a token, from raw
 *     inputs all copied in one round trip (cp.async, issued before the state loads; a per-CTA trace
 *     showed the first data of a CTA arriving ~10 us after its start under the full memory load,
 *     so each extra dependent read costs that much), and a thread holds 16 elements of a row, so
 *     that a row's dot products take log2(K / 16) shuffle levels instead of log2(32). A fold CTA runs up to four row sets of the head one after the other,
 *     the next set's state streaming into shared memory (cp.async) during the current set's token
 *     loop, so the transfers overlap the compute within a CTA and the tokens are prepared once for
 *     all sets. (The chunked form on tensor cores was measured slower: its per-CTA preparation is a
 *     long latency chain; bench/results/2026-11-22-h100-chunked-replay.md.)
 *
 * Launch geometry: blockIdx.y = batch row i, blockIdx.x = value head h * tiles_per_head + row tile.
 * A CTA has `warps` warps (1, 2 or 4, chosen at launch so that small batches still spread over the
 * SMs: at B = 1 a 32-head layer runs as hundreds of one-warp CTAs); a warp covers ROWS_PER_WARP
 * consecutive state rows of one head, per row set (one set, except fold). Padding rows exit before
 * touching the state.
 *
 * Template parameters: K (64, 128, 256), state storage S (float, bf16), input storage I (bf16, fp16),
 * output storage O (bf16, float), REGS (state values a thread holds), ONE_TOKEN, FOLD (the fold
 * verify strategy: the slot's pending tokens are folded first, without outputs). V, T, HK, HV and the
 * cache flag are runtime values. With FOLD false every fold branch is a compile-time constant.
 */
#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_fold.cuh"
#include "gdn_cuda_prepare.cuh"
#include "gdn_cuda_rows.cuh"
#include "gdn_cuda_update.cuh"

/* ---------------------------------------------------------------------------------------------- */
/* Geometry derived from the template parameters                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* Minimum resident 128-thread CTAs per SM (__launch_bounds__), i.e. the register cap, measured on
 * H200 (bench/results/2026-11-21-h200-kernels.md): 64 values per thread: 4 (128 registers); fp32
 * decode of the cache strategy: uncapped; otherwise 6 (80 registers). */
template <typename S, bool ONE_TOKEN, int REGS, bool FOLD> constexpr int min_blocks()
{
    return REGS >= 64 ? 4 : ONE_TOKEN && !FOLD && sizeof(S) == 4 && REGS >= 32 ? 1 : 6;
}

/* ---------------------------------------------------------------------------------------------- */
/* Kernel template                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

/* Token staging: the fold strategy folds up to max_tokens stored tokens per row before its own, so
 * its CTAs prepare every token once in shared memory and use short row reductions (SHARED); the cache
 * strategy's decode and verify are faster with each lane group preparing its own token (measured on
 * the H100, bench/results/2026-11-22-h100-kernels.md). */
template <bool FOLD> constexpr bool shared_staging() { return FOLD; }

/* Row sets per CTA, at most. Fold: up to four, run one after the other; the next set's state is
 * copied into shared memory while the current set's token loop runs (long enough to hide it), and
 * the tokens are prepared once for all of them. The cache strategy's loop is short: one set, state in
 * registers only. */
template <bool FOLD> constexpr int row_sets() { return FOLD ? 4 : 1; }

/* Shared memory (in floats) holding one set's state for `threads` threads, while it is in flight. */
template <typename Geo, int SETS> __host__ __device__ constexpr size_t staged_floats(int threads)
{
    return SETS > 1 ? (size_t)Geo::RT * Geo::NV * 4 * threads : 0;
}

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool FOLD>
__global__ void __launch_bounds__(128, (min_blocks<S, ONE_TOKEN, REGS, FOLD>())) layer_step_kernel(const gdn__layer_params p)
{
    constexpr bool SHARED = shared_staging<FOLD>();
    constexpr int SETS = row_sets<FOLD>();
    constexpr bool DECAY_OUTSIDE = FOLD && sizeof(S) == 2;
    using Geo = layer_geometry<K, S, REGS, SHARED>;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT;
    extern __shared__ __align__(16) float smem[];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int group = lane / L;   /* which of the G rows of a warp step */
    const int glane = lane % L;   /* lane within the row group */
    const int warps = blockDim.x >> 5;
    const int V = p.V, T = ONE_TOKEN ? 1 : p.T, HV = p.HV, HK = p.HK;
    const int tile_rows = warps * Geo::ROWS_PER_WARP; /* rows of one set */
    const int tiles_per_head = SETS > 1 ? (int)gridDim.x / HV : V / tile_rows;
    const int cta_rows = V / tiles_per_head;
    const int sets = SETS > 1 ? cta_rows / tile_rows : 1; /* chosen by the launcher */
    const int h = blockIdx.x / tiles_per_head;
    const int tile = blockIdx.x % tiles_per_head;
    const int64_t i = blockIdx.y;
    const int tile_row0 = tile * cta_rows;
    const int local_row0 = warp * Geo::ROWS_PER_WARP + group; /* row of rt = 0 within the first set */
    const int row0 = tile_row0 + local_row0;

    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    const bool out_of_range = gdn__row_slots_invalid(r, w, p.num_slots);
    O *out = static_cast<O *>(p.out);
    const int64_t out_token_stride = p.out_strides.token;
    const int64_t out_base = gdn__at(p.out_strides, i, 0, h); /* (i, t = 0, h, row 0) */

    if (r < 0 || out_of_range) {
        if (p.overlap_preceding) gdn__wait_preceding(); /* the preceding kernel may still read the output */
        gdn__allow_dependents();
        if (out_of_range && p.error_flag && threadIdx.x == 0) *p.error_flag = 1;
        if (glane == 0)
            for (int t = 0; t < T; t++)
                for (int set = 0; set < sets; set++)
#pragma unroll
                    for (int rt = 0; rt < RT; rt++)
                        out[out_base + t * out_token_stride + row0 + set * tile_rows + rt * G] = gdn__from_f32<O>(0.0f);
        return;
    }

    const int kh = h / (HV / HK);
    const float A = expf(p.A_log[h]), dt_bias = p.dt_bias[h];
    /* Fold: prepared tokens 0..store_tokens-1 are slot r's stored tokens (the first pending[r] of
     * them, its accepted tokens of its last verify, are folded), own token t is prepared token
     * own0 + t. All stored tokens are staged, whatever pending[r] is, so that no read waits for
     * another: read_slots[i], then the tokens, pending[r] and the state all in flight together. */
    const int own0 = FOLD ? p.store_tokens : 0;
    const int tokens = own0 + T;
    shared_tokens s(smem + staged_floats<Geo, SETS>(blockDim.x), K, cta_rows,
                    shared_tokens::capacity(FOLD, p.store_tokens, T), T);
    const int64_t token_elems = gdn__token_elems(HK, HV, K, V);
    /* Before the wait for the preceding kernel (which writes this step's inputs; overlap_preceding):
     * only what no kernel of the step writes before this one, slot r's stored tokens and state. */
    if constexpr (SHARED)
        for (int j = warp; j < own0; j += warps) {
            const I *tb = static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * token_elems;
            stage_token<K, I, false>(s, j, 0, tb + (int64_t)kh * K, nullptr, tb + (int64_t)HK * K + (int64_t)h * V + tile_row0,
                                     cta_rows, lane);
        }

    /* Load every owned state row of the first set before the first use: RT * NV independent 16-byte
     * loads, in flight while the tokens are prepared; the next set's go to shared memory (each thread
     * copies exactly the vectors it will read back, so no barrier orders them). */
    const int64_t state_elems = (int64_t)V * K;
    const S *src = static_cast<const S *>(p.state) + r * p.slot_stride + h * state_elems;
    float st[RT][NV][EV];
    /* Large grids (the most state per thread) are bandwidth-bound: the step's inputs are better
     * loaded beside the state, so they wait first; small grids are latency-bound: their state loads
     * go out before the wait. */
    constexpr bool STATE_BEFORE_WAIT = FOLD || REGS != big_regs<S>();
    if constexpr (!STATE_BEFORE_WAIT) {
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
    }
    load_rows<K, S, Geo>(src, st, row0, glane);
    if constexpr (STATE_BEFORE_WAIT) {
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
    }

    float a_raw = 0.0f, b_raw = 0.0f; /* token threadIdx.x's gate inputs */
    if constexpr (SHARED) {
        for (int j = own0 + warp; j < tokens; j += warps) {
            const int t = j - own0;
            stage_token<K, I, true>(s, j, t, static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh),
                                    static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh),
                                    static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, t, h) + tile_row0, cta_rows, lane);
        }
        gdn__copy_async_commit(); /* the tokens: one group, before the next set's state */
        if ((int)threadIdx.x < tokens) {
            const int j = threadIdx.x;
            const I *ap, *bp;
            if (FOLD && j < own0) {
                ap = static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * token_elems + (int64_t)HK * K +
                     (int64_t)HV * V + h;
                bp = ap + HV;
            } else {
                ap = static_cast<const I *>(p.a) + gdn__at(p.a_strides, i, j - own0, h);
                bp = static_cast<const I *>(p.b) + gdn__at(p.b_strides, i, j - own0, h);
            }
            a_raw = gdn__to_f32(*ap);
            b_raw = gdn__to_f32(*bp);
        }
    }

    uint4 *staged = reinterpret_cast<uint4 *>(smem); /* [RT * NV][threads]: conflict-free */
    /* `after` is 0, computed from values just read from `staged`: the copies cannot overtake them. */
    const auto stage_set = [&](int set, uint32_t after) {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int n = 0; n < NV; n++)
                gdn__copy_async16(staged + (rt * NV + n) * blockDim.x + threadIdx.x + after,
                                  src + (int64_t)(row0 + set * tile_rows + rt * G) * K + (n * L + glane) * EV);
        gdn__copy_async_commit();
    };
    if (SETS > 1 && sets > 1) stage_set(1, 0);

    const int folds = FOLD ? min(p.pending[r], p.store_tokens) : 0;
    if constexpr (SHARED) {
        if ((int)threadIdx.x < tokens) token_gate(a_raw, b_raw, A, dt_bias, s.gate[threadIdx.x], s.beta[threadIdx.x]);
        if (SETS > 1 && sets > 1) gdn__copy_async_wait_group<1>(); /* the tokens; the next set's state may go on */
        else gdn__copy_async_wait_all();
        __syncwarp();
        for (int j = warp; j < tokens; j += warps) {
            if (!FOLD || j >= own0) prepare_token<K, I, true>(p, s, j, j - own0, cta_rows, lane);
            else if (j < folds) prepare_token<K, I, false>(p, s, j, 0, cta_rows, lane); /* (the rest: staged, unused) */
        }
        __syncthreads();
    }

    /* Fold: the CTA has read pending[r] and its share of slot r's stored tokens (before the barrier
     * above). It counts itself in now and learns at its end whether it was the row's last, so the
     * atomic's round trip overlaps the token loop; that last CTA then does the row's bookkeeping. */
    unsigned arrival = 0;
    if (FOLD && threadIdx.x == 0) arrival = atomicAdd(&p.arrivals[i], 1u);

    if (FOLD && p.deferred_verify) {
        /* Verify: this CTA's rows of v of the own tokens become slot w's stored v, from the prepared
         * copy (exact: v converted from I and back; the preparation above read slot r's rows before
         * the barrier, and no other CTA reads these rows). */
        I *store = static_cast<I *>(p.token_store);
        for (int e = threadIdx.x; e < T * cta_rows; e += blockDim.x) {
            const int t = e / cta_rows, row = e % cta_rows;
            store[(w * p.store_tokens + t) * token_elems + (int64_t)HK * K + (int64_t)h * V + tile_row0 + row] =
                gdn__from_f32<I>(s.v[(size_t)(own0 + t) * cta_rows + row]);
        }
    }

    S *cache = static_cast<S *>(p.cache);
    const int64_t cache_token_stride = (int64_t)HV * state_elems;
    for (int set = 0; set < sets; set++) {
        const int set_row0 = row0 + set * tile_rows, set_local_row0 = local_row0 + set * tile_rows;
        if (set > 0) { /* this set's state, copied to shared memory during the previous set's work */
            gdn__copy_async_wait_all();
            uint32_t read = 0;
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int n = 0; n < NV; n++) {
                    const uint4 raw = staged[(rt * NV + n) * blockDim.x + threadIdx.x];
                    read |= raw.x;
                    gdn__load_vec<S, EV>(reinterpret_cast<const S *>(&raw), st[rt][n]);
                }
            if (set + 1 < sets) stage_set(set + 1, gdn__zero_after(read));
        }
        float o[RT], decay = 1.0f;
        if constexpr (FOLD) {
            for (int j = 0; j < folds; j++) {
                token_values<Geo> tv;
                tv.template load_shared<false>(s, j, 0, K, cta_rows, set_local_row0, glane);
                apply_token<Geo, false, DECAY_OUTSIDE>(st, decay, tv, o);
            }
            if (p.deferred_verify) /* the pool gets the folded state; the own tokens stay pending */
                store_rows<K, S, Geo, DECAY_OUTSIDE>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems,
                                                     st, decay, set_row0, glane);
        }

        /* (Loading token t + 1's inputs during token t was measured slower: the extra registers
         * cost more occupancy than the hidden latency gained.) */
        for (int t = 0; t < T; t++) {
            token_values<Geo> tv;
            if constexpr (SHARED) tv.template load_shared<true>(s, own0 + t, t, K, cta_rows, set_local_row0, glane);
            else tv.template load_direct<K, I>(p, i, t, kh, h, set_row0, glane, A, dt_bias);
            apply_token<Geo, true, DECAY_OUTSIDE>(st, decay, tv, o);
            if (glane == 0)
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
                    out[out_base + t * out_token_stride + set_row0 + rt * G] = gdn__from_f32<O>(o[rt]);
            if (cache)
                store_rows<K, S, Geo, DECAY_OUTSIDE>(
                    cache + i * p.cache_row_stride + t * cache_token_stride + h * state_elems, st, decay, set_row0, glane);
        }

        if (!cache && !(FOLD && p.deferred_verify))
            store_rows<K, S, Geo, DECAY_OUTSIDE>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems, st,
                                                 decay, set_row0, glane);
    }

    if constexpr (FOLD) { /* every CTA of the row has read slot r's tokens: slot w's may change */
        __shared__ int last_cta;
        if (threadIdx.x == 0) last_cta = arrival == gridDim.x - 1;
        __syncthreads();
        if (last_cta) {
            if (p.deferred_verify) store_shared_inputs<K, I>(p, i, w, T);
            if (threadIdx.x == 0) {
                p.pending[w] = 0;
                p.arrivals[i] = 0;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* CTAs below which a launch uses fewer warps per CTA (more, smaller CTAs) to reach more SMs. */
#define GDN__SMALL_GRID_CTAS 1024

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool FOLD>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    using Geo = layer_geometry<K, S, REGS, shared_staging<FOLD>()>;
    constexpr int SETS = row_sets<FOLD>();
    const auto ctas = [&](int warps, int sets) { return (int64_t)p->B * p->HV * (p->V / (sets * warps * Geo::ROWS_PER_WARP)); };
    int warps = 4, sets = SETS; /* fewer sets, then fewer warps, until small grids reach every SM */
    while (sets > 1 && (p->V % (sets * warps * Geo::ROWS_PER_WARP) != 0 || ctas(warps, sets) < GDN__SMALL_GRID_CTAS))
        sets /= 2;
    /* Fold keeps more warps per CTA on small grids: its CTA prepares every token (one warp a
     * token) and does the row's bookkeeping, fixed costs that one-warp CTAs run serially (B = 1,
     * qwen3-next, T = 4: 1024 one-warp CTAs, each a ~9 us chain of ~3200 instructions). */
    const int64_t min_ctas = FOLD ? GDN__SMALL_GRID_CTAS / 4 : GDN__SMALL_GRID_CTAS;
    while (warps > 1 && (p->V % (warps * Geo::ROWS_PER_WARP) != 0 || ctas(warps, sets) < min_ctas))
        warps /= 2;
    const int cta_rows = sets * warps * Geo::ROWS_PER_WARP;
    const int tiles_per_head = p->V / cta_rows;
    const dim3 grid((unsigned)(p->HV * tiles_per_head), (unsigned)p->B);
    const int T = ONE_TOKEN ? 1 : p->T;
    const size_t smem = shared_staging<FOLD>() ? sizeof(float) * (staged_floats<Geo, SETS>(warps * 32) +
                                                                    shared_tokens::floats(K, cta_rows,
                                                                                          shared_tokens::capacity(FOLD, p->store_tokens, T), T))
                                                 : 0;
    auto kernel = layer_step_kernel<K, S, I, O, REGS, ONE_TOKEN, FOLD>;
    if (smem > 48 * 1024) { /* K = 256 with many tokens: opt in once per device and instance, up to the largest case */
        constexpr int most_tokens = GDN_MAX_TOKENS;
        static std::atomic<bool> opted_in[GDN__MAX_DEVICES];
        GDN__CUDA_TRY(gdn__opt_in_shared(
            kernel,
            (int)(sizeof(float) * (staged_floats<Geo, SETS>(128) +
                                   shared_tokens::floats(K, GDN__MAX_HEAD_DIM,
                                                         shared_tokens::capacity(true, most_tokens, most_tokens), most_tokens))),
            opted_in));
    }
    GDN__CUDA_TRY(gdn__launch(kernel, grid, dim3(warps * 32), smem, stream, p->overlap_preceding != 0, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* Large grids: more state per thread (more bytes in flight per SM); small grids: less state per
 * thread, so that the work spreads over more warps and SMs. */
template <int K, typename S, typename I, typename O, bool ONE_TOKEN, bool FOLD>
static gdn_status launch_tokens(const gdn__layer_params *p, cudaStream_t stream)
{
    constexpr int BIG = big_regs<S>();
    using Big = layer_geometry<K, S, BIG, shared_staging<FOLD>()>;
    using Small = layer_geometry<K, S, GDN__STATE_REGS_SMALL, shared_staging<FOLD>()>;
    const int64_t big_warps = (int64_t)p->B * p->HV * (p->V / Big::ROWS_PER_WARP);
    const int64_t small_warps = (int64_t)p->B * p->HV * (p->V / Small::ROWS_PER_WARP);
    if (big_warps >= 4 * GDN__SMALL_GRID_CTAS) return launch_regs<K, S, I, O, BIG, ONE_TOKEN, FOLD>(p, stream);
    /* The smallest decode grids (e.g. B = 1 of a 32-head layer): fewer rows per warp, shorter chains. */
    if (ONE_TOKEN && small_warps < 2 * GDN__SMALL_GRID_CTAS)
        return launch_regs<K, S, I, O, GDN__STATE_REGS_TINY, ONE_TOKEN, FOLD>(p, stream);
    return launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, ONE_TOKEN, FOLD>(p, stream);
}

template <int K, typename S, typename I, typename O>
static gdn_status launch(const gdn__layer_params *p, cudaStream_t stream)
{
    if (p->token_store) /* fold; T = 0 is a flush (fold only) */
        return p->T == 1 ? launch_tokens<K, S, I, O, true, true>(p, stream) : launch_tokens<K, S, I, O, false, true>(p, stream);
    return p->T == 1 ? launch_tokens<K, S, I, O, true, false>(p, stream) : launch_tokens<K, S, I, O, false, false>(p, stream);
}

/* ---------------------------------------------------------------------------------------------- */
/* Dispatch: runtime values to template instances                                                   */
/* ---------------------------------------------------------------------------------------------- */

static gdn_status dispatch(const gdn__layer_params *p, cudaStream_t stream, bool run)
{
    GDN__LAYER_DISPATCH(launch)
}

/* True when every stride of `s` is a multiple of `elements` (keeps the alignment of the data pointer). */
static bool strides_keep(gdn__strides s, int64_t elements)
{
    return s.row % elements == 0 && s.token % elements == 0 && s.head % elements == 0;
}

/* Shape and alignment checks shared by both entry points (GDN_ENOTSUP for what no instance runs). */
static gdn_status check_shape(const gdn__layer_params *p)
{
    if (gdn__mixer_on(&p->mixer)) return GDN_ENOTSUP; /* the mixer (SPEC 6) runs on the CPU reference only, so far */
    if (p->token_counts || p->parents) return GDN_ENOTSUP; /* per-row counts, token trees (SPEC 3): CPU reference only, so far */
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
    return p->ring ? gdn__cuda_ring_step_supported(p) : dispatch(p, nullptr, false);
}

extern "C" gdn_status gdn__cuda_layer_step(const gdn__layer_params *params, void *stream)
{
    if (!params) return GDN_EINVAL;
    const gdn__layer_params resolved = gdn__layer_params_resolved(params), *p = &resolved;
    const gdn_status shape = check_shape(p);
    if (shape != GDN_OK) return shape;
    if (p->B == 0) return GDN_OK;
    if (!p->q || !p->k || !p->v || !p->a || !p->b || !p->A_log || !p->dt_bias || !p->state || !p->out ||
        !p->read_slots || p->slot_stride < (int64_t)p->HV * p->V * p->K || p->num_slots < 0)
        return GDN_EINVAL;
    if (p->cache && p->cache_row_stride < (int64_t)p->T * p->HV * p->V * p->K) return GDN_EINVAL;
    if (p->ring) return gdn__cuda_ring_step(p, stream);
    return dispatch(p, static_cast<cudaStream_t>(stream), true);
}
