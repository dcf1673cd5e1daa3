#ifndef GDN_CUDA_LAYER_KERNEL_CUH
#define GDN_CUDA_LAYER_KERNEL_CUH
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
 *   - Fold strategy (its verify; its decode on large grids, elsewhere the decode runs as the cache's,
 *     reading the tokens it folds directly): a row first folds up to max_tokens stored tokens, so the
 *     step is no longer purely memory-bound (profiled: instruction issue and latency). Its CTAs
 *     prepare each token once (k^, q^, v of the CTA's rows, g, beta, k^.q^) in shared memory, one
 *     warp a token, from raw inputs all copied in one round trip (cp.async, issued before the state
 *     loads; a per-CTA trace showed the first data of a CTA arriving ~10 us after its start under the
 *     full memory load, so each extra dependent read costs that much), and a thread holds 16
 *     elements of a row, so that a row's dot products take log2(K / 16) shuffle levels instead of
 *     log2(32). A fold CTA runs up to four row sets of the head one after the other,
 *     the next set's state streaming into shared memory (cp.async) during the current set's token
 *     loop, so the transfers overlap the compute within a CTA and the tokens are prepared once for
 *     all sets. On the smallest grids (folds_early) the first set's folds run before the wait for
 *     the preceding kernel, since they read only slot r's own data. (The chunked form on tensor
 *     cores was measured slower: its per-CTA preparation is a long latency chain;
 *     bench/results/2026-11-22-h100-chunked-replay.md.)
 *
 * Launch geometry: blockIdx.y = batch row i, blockIdx.x = value head h * tiles_per_head + row tile.
 * A CTA has `warps` warps (1, 2, 4 or 8, chosen at launch so that small batches still spread over
 * the SMs, cta_warps_max below); a warp covers ROWS_PER_WARP consecutive state rows of one head, per
 * row set (one set, except fold). Padding rows exit before touching the state.
 *
 * Template parameters: K (64, 128, 256), state storage S (float, bf16), input storage I (bf16, fp16),
 * output storage O (bf16, float), REGS (state values a thread holds), ONE_TOKEN, FOLD (the fold
 * verify strategy: the slot's pending tokens are folded first, without outputs), MIXER (the whole
 * mixer step, SPEC 6: gdn_cuda_mixer.cuh; its conv and norm each switch on at run time), RING (the
 * ring's write-through decode: a cache decode, or with the mixer's conv a fold decode whose stored
 * tokens are the ring's records), STAGED (tokens prepared in shared memory: see staged_by_default),
 * KEEP_KEYS (the fold verify on small grids: keeps_keys_on), EARLY_FOLD (its twin that folds
 * before the wait: folds_early) and DIRECT_SETS (the big fold verify's twin without the staging
 * region, whose later row sets load their own state: launch_regs). V, T, HK, HV and the cache flag
 * are runtime values. With FOLD or MIXER false their branches are compile-time constants.
 */
#include <type_traits>

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_fold.cuh"
#include "gdn_cuda_mixer.cuh"
#include "gdn_phase_trace.cuh"
#include "gdn_cuda_prepare.cuh"
#include "gdn_cuda_rows.cuh"
#include "gdn_cuda_tree.cuh"
#include "gdn_cuda_update.cuh"

/* ---------------------------------------------------------------------------------------------- */
/* Geometry derived from the template parameters                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* Minimum resident 128-thread CTAs per SM (__launch_bounds__), i.e. the register cap, measured on
 * H200 (bench/results/2026-11-21-h200-kernels.md): 64 values per thread: 4 (128 registers); fp32
 * decode without staging (cache, direct fold): uncapped; that decode's small instance: 8 (64
 * registers; mid-size grids of about a wave at 8 CTAs an SM, which 72 registers made two; measured on
 * the H100, bench/results/2026-11-26-h100-ring-write-through.md); otherwise 6 (80 registers). */
template <typename S, bool UNSTAGED_DECODE, int REGS> constexpr int min_blocks()
{
    if (UNSTAGED_DECODE && REGS == GDN__STATE_REGS_SMALL) return 8;
    return REGS >= 64 ? 4 : UNSTAGED_DECODE && sizeof(S) == 4 && REGS >= 32 ? 1 : 6;
}

/* The ring strategy's write-through decode (gdn.h, ring_write_through; the kernels' rule with ring
 * length 1) runs as this family's decode: slot r's h ring records are applied to the registers first
 * (S = g_j S + u_j k^_j^T, with u_j, k_j's norm scale and log g_j as the record holds them), then the
 * token, and the state is stored into slot w. Records are read straight into registers,
 * GDN__RING_THROUGH_BATCH at a time (one round trip a batch; one at a time where a thread holds 64
 * state values, the bf16 big instance, whose registers hold no second record without spilling), so
 * the instance needs no shared memory, like the cache decode it is (a kernel with shared memory
 * measured slower on these grids). */
#define GDN__RING_THROUGH_BATCH 2
template <int K, typename I, typename Geo>
__device__ __forceinline__ void apply_ring_records(const gdn__layer_params &p, float (&st)[Geo::RT][Geo::NV][Geo::EV],
                                                   int64_t r, int h, int kh, int records, int row0, int glane)
{
    constexpr int EV = Geo::EV, NV = Geo::NV, L = Geo::L, G = Geo::G, RT = Geo::RT;
    constexpr int BATCH = RT * Geo::EPT >= 64 ? 1 : GDN__RING_THROUGH_BATCH;
    const int64_t record_bytes = gdn__ring_record_bytes(p.HK, p.HV, K, p.V);
    const int64_t u_offset = gdn__ring_u_offset(p.HK, p.HV, K), pair_offset = gdn__ring_norm_decay_offset(p.HK, K);
    const char *ring_r = static_cast<const char *>(p.ring) + r * p.ring_capacity * record_bytes;
    for (int m0 = 0; m0 < records; m0 += BATCH) {
        float k[BATCH][NV][EV], u[BATCH][RT];
        float2 scale_decay[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) { /* past the last record: the last one again, not applied */
            const char *rec = ring_r + min(m0 + b, records - 1) * record_bytes;
#pragma unroll
            for (int n = 0; n < NV; n++) gdn__load_vec<I, EV>(reinterpret_cast<const I *>(rec) + kh * K + (n * L + glane) * EV, k[b][n]);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) u[b][rt] = reinterpret_cast<const float *>(rec + u_offset)[(int64_t)h * p.V + row0 + rt * G];
            scale_decay[b] = reinterpret_cast<const float2 *>(rec + pair_offset)[h];
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            if (m0 + b >= records) break; /* uniform over the CTA */
            const float rk = scale_decay[b].x, g = expf(scale_decay[b].y);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                const float c = u[b][rt] * rk;
#pragma unroll
                for (int n = 0; n < NV; n++)
#pragma unroll
                    for (int e = 0; e < EV; e++) st[rt][n][e] = fmaf(g, st[rt][n][e], c * k[b][n][e]);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Kernel template                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

/* Token staging (the kernel's STAGED parameter): the fold strategy folds up to max_tokens stored
 * tokens per row before its own, so its CTAs prepare every token once in shared memory and use short
 * row reductions; the cache strategy's decode and verify are faster with each lane group preparing
 * its own token (measured on the H100, bench/results/2026-11-22-h100-kernels.md). The mixer runs the
 * conv once per channel of a CTA, so it stages too. The fold decode stages only on large grids
 * (fold_decode_staged): elsewhere it runs as the cache decode does, each lane group reading the
 * tokens it folds straight from the store. A decode seldom has any (the first after a verify), and
 * on small and mid-size grids the staging's barrier and preparation chain cost every decode more
 * than the direct reads cost the decodes that fold; on large grids the folds' per-lane-group
 * preparation costs more (bench/results/2026-11-26-h100-fold-decode.md). */
template <bool ONE_TOKEN, bool FOLD, bool MIXER> constexpr bool staged_by_default() { return MIXER || (FOLD && !ONE_TOKEN); }
template <int K, typename S> inline bool fold_decode_staged(const gdn__layer_params *p)
{
    using Big = layer_geometry<K, S, big_regs<S>(), true>;
    return (int64_t)p->B * p->HV * (p->V / Big::ROWS_PER_WARP) > 4 * GDN__SMALL_GRID_CTAS;
}

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

/* Where the mixer's part of shared memory starts (floats from the start, 16-byte aligned), past the
 * staged state and the prepared tokens; and the whole size in bytes (mixer_smem: its parts). */
template <typename Geo, int SETS>
__host__ __device__ size_t mixer_smem_floats(int threads, int K, int cta_rows, int capacity, int T, int keep_heads)
{
    return (staged_floats<Geo, SETS>(threads) + shared_tokens::floats(K, cta_rows, capacity, T, keep_heads) + 3) / 4 * 4;
}
template <typename Geo, int SETS>
__host__ __device__ size_t staging_bytes(int threads, int K, int cta_rows, int capacity, int T, int keep_heads, bool mixer,
                                         const mixer_smem &parts)
{
    if (!mixer)
        return sizeof(float) * (staged_floats<Geo, SETS>(threads) + shared_tokens::floats(K, cta_rows, capacity, T, keep_heads));
    return sizeof(float) * mixer_smem_floats<Geo, SETS>(threads, K, cta_rows, capacity, T, keep_heads) + parts.end;
}
/* The fold verify on small grids (the kernel's KEEP_KEYS instance, keeps_keys_on: at most
 * GDN__KEPT_ROW_HEADS_PER_TOKEN row-heads a token, at most GDN__KEPT_HEADS_MAX value heads a key
 * head) keeps its own tokens' raw k and gates for the token store (store_own_keys): kept_heads, the
 * value heads of a key head, else 0 and the row's last CTA copies them (store_shared_inputs).
 * Measured on the H100 (bench/results/2026-11-26-h100-fold-verify-keys.md): small grids wait for that
 * last copy; the largest ran slower with the kept copies, and also with the code compiled in but not
 * taken, so the other instances do not have it. Up to 64 row-heads a token every measured grid gained,
 * with the fold verify's row sets of staged_verify_sets (2026-11-26-h100-fold-verify-sets.md); up to
 * 128 since the kept copies are stored in the middle of the kernel
 * (2026-11-27-h100-fold-counts-before-the-wait.md). */
#define GDN__KEPT_HEADS_MAX 8
#define GDN__KEPT_ROW_HEADS_PER_TOKEN 128
inline bool keeps_keys_on(const gdn__layer_params *p)
{
    return p->deferred_verify && p->T > 0 && p->key_arrivals && p->HV / p->HK <= GDN__KEPT_HEADS_MAX &&
           (int64_t)p->B * p->HV <= (int64_t)GDN__KEPT_ROW_HEADS_PER_TOKEN * p->T;
}
template <bool KEEP_KEYS> __host__ __device__ int kept_heads(const gdn__layer_params &p) { return KEEP_KEYS ? p.HV / p.HK : 0; }

/* The small-grid decodes (the cache strategy's, the ring's write-through, fold's direct decode and
 * the mixer's) allow their dependents to launch first thing on grids of up to
 * GDN__ALLOW_FIRST_ROW_HEADS row-heads, where it measured faster (bench/results/
 * 2026-11-26-h100-dependents-first.md, 2026-11-27-h100-fetch-and-mixer-first.md): the next kernel's
 * launch and its state loads leave the chain from this kernel's wait to its end. Not after the rows'
 * fetch (rows_from_preceding): the kernel after it reads the rows before its wait. */
#define GDN__ALLOW_FIRST_ROW_HEADS 256
inline bool allows_dependents_first(const gdn__layer_params &p)
{
    return p.overlap_preceding && !p.rows_from_preceding && (int64_t)p.B * p.HV <= GDN__ALLOW_FIRST_ROW_HEADS;
}
/* The instances that handle rows_from_preceding and allow_dependents_first: the decodes of small and
 * tiny grids (the big-grid decode measured slower with the code in it). */
template <typename S, int REGS, bool ONE_TOKEN> constexpr bool small_decode() { return ONE_TOKEN && REGS != big_regs<S>(); }

/* The kept-keys fold verify folds the slot's pending tokens before it waits for the preceding kernel
 * (the kernel's EARLY_FOLD instance): off the chain from that kernel's end to this one's, but on the
 * chain of launches (a kernel's dependents launch once all of its CTAs have passed the wait). Taken
 * where it measured faster on the H100 (bench/results/2026-11-26-h100-fold-early.md,
 * 2026-11-27-h100-fetch-and-mixer-first.md): from three to eight tokens on grids of up to
 * GDN__EARLY_FOLD_TOKEN_ROW_HEADS row-heads times tokens (three since the step's rows ride in the
 * launch; before, three was slower), and with two tokens at GDN__EARLY_FOLD_TWO_TOKEN_ROW_HEADS
 * row-heads, and at half that with bf16 state (since the kept-keys verify counts in before its wait;
 * 2026-11-27-h100-fold-counts-before-the-wait.md); with two tokens elsewhere it is slower in the
 * kernel sweep (fp32 at half the row-heads, both states below), and level or slower on larger grids. */
#define GDN__EARLY_FOLD_TOKEN_ROW_HEADS 512
#define GDN__EARLY_FOLD_TWO_TOKEN_ROW_HEADS 128
template <typename S> inline bool folds_early(const gdn__layer_params *p)
{
    const int64_t row_heads = (int64_t)p->B * p->HV;
    if (p->T == 2)
        return row_heads == GDN__EARLY_FOLD_TWO_TOKEN_ROW_HEADS ||
               (sizeof(S) == 2 && row_heads == GDN__EARLY_FOLD_TWO_TOKEN_ROW_HEADS / 2);
    return p->T >= 3 && p->T <= 8 && row_heads * p->T <= GDN__EARLY_FOLD_TOKEN_ROW_HEADS;
}

/* Warps a CTA may have. A decode (every strategy) on a grid of fewer than GDN__SMALL_GRID_CTAS
 * four-warp CTAs: up to 8, in as few CTAs as still cover the SMs twice (GDN__DECODE_GRID_CTAS). A
 * dependent chain of kernels pays per CTA at every launch and completion, so 256 eight-warp CTAs
 * finish a B = 1 step sooner than 1024 two-warp ones (bench/results/2026-11-26-h100-decode-ctas.md;
 * the verify instances, and the decode at 1024 four-warp CTAs, measured slower with 8). Otherwise
 * 4, in at least GDN__SMALL_GRID_CTAS CTAs (fold and mixer: a quarter) where the grid allows. The
 * register cap (min_blocks, in 128-thread CTAs) is the same whatever the CTA size. */
#define GDN__DECODE_GRID_CTAS 256
template <typename S, int REGS, bool ONE_TOKEN> constexpr int cta_warps_max()
{
    return ONE_TOKEN && REGS != big_regs<S>() ? 8 : 4;
}
/* min_blocks in CTAs of this instance's size (__launch_bounds__). The mixer's small bf16 decodes, but
 * the ring's write-through: four eight-warp CTAs an SM (64 registers, no spill), so that their grid
 * and the next layer's can be resident at once (measured faster; the ring's was not tried). */
template <typename S, int REGS, bool ONE_TOKEN, bool STAGED, bool MIXER, bool RING> constexpr int resident_ctas()
{
    if (MIXER && !RING && ONE_TOKEN && sizeof(S) == 2 && REGS == GDN__STATE_REGS_SMALL) return 4;
    constexpr int ctas = min_blocks<S, ONE_TOKEN && !STAGED, REGS>() * 4 / cta_warps_max<S, REGS, ONE_TOKEN>();
    return ctas > 0 ? ctas : 1;
}

/* The staged verify's row sets (fold, and the mixer's cache and fold) on grids of at most
 * GDN__SMALL_GRID_CTAS four-warp CTAs (`sets`: the default rule's, which leaves such grids one set a
 * CTA, or two). Each CTA prepares every token, so fewer, longer CTAs prepare less, and gain more the
 * more tokens there are. Taken where they measured faster on the H100
 * (bench/results/2026-11-26-h100-fold-verify-sets.md), from two to eight tokens (16-token chains and
 * trees ran slower): two sets a CTA down to 512 CTAs, down to 256 (two an SM) from four tokens; four
 * sets only where they come down to 256, from three tokens; the big fp32 instance's longer sets not
 * below 1024 CTAs at two tokens (except the mixer's, whose CTAs each also run their key head's conv:
 * bench/results/2026-11-27-h100-mixer-verify-conv.md). The launcher takes more sets only where the
 * grid still runs in one wave (gdn__in_one_wave: the mixer's shared memory grows with the CTA's rows), and
 * fewer not for the mixer (each of its CTAs also runs the conv of its key head's channels).
 * `ctas(s)`: the grid of s sets of four warps, 0 where they do not divide V. */
template <int SETS, typename Ctas> inline int staged_verify_sets(int sets, int T, bool long_sets, const Ctas &ctas)
{
    if (T < 2 || T > 8 || ctas(sets) > GDN__SMALL_GRID_CTAS) return sets;
    for (int s = SETS; s > 1; s /= 2) {
        const int64_t n = ctas(s);
        const bool enough = n >= (s == 2 && T < 4 ? 2 * GDN__DECODE_GRID_CTAS : GDN__DECODE_GRID_CTAS);
        const bool four_fit = s <= 2 || (n <= GDN__DECODE_GRID_CTAS && T >= 3);
        if (enough && four_fit && !(long_sets && T < 3 && n < GDN__SMALL_GRID_CTAS)) return s;
    }
    return sets;
}
/* The big fold verify: the fold strategy's staged verify with the most state a thread (large grids),
 * neither the mixer's nor the kept-keys one. Its tree form and its DIRECT_SETS twin are its own. */
template <typename S, int REGS, bool ONE_TOKEN, bool FOLD, bool MIXER, bool STAGED, bool KEEP_KEYS>
constexpr bool big_fold_verify()
{
    return FOLD && STAGED && !ONE_TOKEN && !MIXER && !KEEP_KEYS && REGS == big_regs<S>();
}
template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool FOLD, bool MIXER, bool RING, bool STAGED,
          bool KEEP_KEYS, bool EARLY_FOLD, bool DIRECT_SETS>
__global__ void __launch_bounds__(32 * cta_warps_max<S, REGS, ONE_TOKEN>(),
                                  (resident_ctas<S, REGS, ONE_TOKEN, STAGED, MIXER, RING>())) layer_step_kernel(const gdn__layer_params p)
{
    static_assert(!RING || (ONE_TOKEN && FOLD == MIXER),
                  "the ring's write-through is a decode of the cache strategy, or with the mixer of the fold strategy");
    static_assert(STAGED == staged_by_default<ONE_TOKEN, FOLD, MIXER>() || (FOLD && ONE_TOKEN && !MIXER),
                  "only the fold decode chooses its staging");
    static_assert(!KEEP_KEYS || (FOLD && STAGED && !ONE_TOKEN && !MIXER), "only the fold verify keeps its keys");
    static_assert(!EARLY_FOLD || KEEP_KEYS, "only the kept-keys instance folds before the wait");
    static_assert(!DIRECT_SETS || big_fold_verify<S, REGS, ONE_TOKEN, FOLD, MIXER, STAGED, KEEP_KEYS>(),
                  "only the big fold verify loads its later sets directly");
    constexpr bool SHARED = STAGED;
    constexpr bool DIRECT_FOLD = FOLD && !SHARED; /* a fold decode that reads its stored tokens directly */
    constexpr int SETS = row_sets<SHARED>();
    constexpr bool DECAY_OUTSIDE = FOLD && SHARED && sizeof(S) == 2;
    using Geo = layer_geometry<K, S, REGS, SHARED>;
    constexpr int EV = Geo::EV, L = Geo::L, NV = Geo::NV, G = Geo::G, RT = Geo::RT;
    /* The fold verify's big instance runs a tree in the big instances' form (gdn_cuda_tree.cuh); the
     * others keep the form they were measured with. */
    constexpr bool BIG_TREE = big_fold_verify<S, REGS, ONE_TOKEN, FOLD, MIXER, STAGED, KEEP_KEYS>();
    /* The ring's write-through with the mixer's conv (launch_strategy): the fold decode, its stored
     * tokens slot r's records (raw x, a and u, which it applies as given: apply_record) and its
     * pending count the ring's count (the launcher points token_store, store_tokens and pending at
     * them). Its conv runs over [window; records; own token] as fold's does, and moves the window. */
    constexpr bool RING_FOLD = RING && MIXER;
    /* Its bf16 form: the lane plan, the vector v store and the staging of the folded tokens only
     * (bench/results/2026-11-27-h100-tree-path-rounds.md; the other instances measured slower so). */
    constexpr bool BIG_BF16 = BIG_TREE && sizeof(S) == 2;
    /* The folded tokens alone, staged once the state's loads are out: BIG_BF16 and the big bf16 mixer
     * fold verify. */
    constexpr bool STAGE_PENDING =
        BIG_BF16 || RING_FOLD || (MIXER && FOLD && !ONE_TOKEN && REGS == big_regs<S>() && sizeof(S) == 2);
    extern __shared__ __align__(16) float smem[];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int group = lane / L;   /* which of the G rows of a warp step */
    const int glane = lane % L;   /* lane within the row group */
    const int warps = blockDim.x >> 5;
    const int V = p.V, T = ONE_TOKEN ? 1 : p.T, HV = p.HV, HK = p.HK;
    const int tile_rows = warps * Geo::ROWS_PER_WARP; /* rows of one set */
    /* The big-grid decodes' shorter chains (measured on the H200, bench/results/
     * 2026-11-28-h200-cache-decode-chains.md and 2026-11-28-h200-fold-decode-chains.md). BIG_DECODE
     * (the cache decode and the direct fold decode): a head's tiles by shifts (V, the rows of a warp
     * and the warps are powers of two), the key head by an fp32 quotient, the state's bf16 pairs
     * widened a word at a time, the one-token loop's tests compile-time (ONE_LIVE_ROOT), and the
     * cache decode's inputs read right behind its state (INPUTS_WITH_STATE below). The staged fold
     * decode with bf16 state: the widening and the loop's tests. In the other instances the same
     * changes measured slower (the 36-layer step; the staged fold decode with fp32 state). */
    constexpr bool BIG_DECODE = ONE_TOKEN && !SHARED && REGS == big_regs<S>();
    constexpr bool BIG_STAGED_FOLD_DECODE = ONE_TOKEN && FOLD && SHARED && !MIXER && REGS == big_regs<S>() && sizeof(S) == 2;
    constexpr bool WORDS = BIG_DECODE || BIG_STAGED_FOLD_DECODE;
    const int tiles_log2 = __ffs(V) - __ffs(tile_rows); /* (BIG_DECODE) */
    const int tiles_per_head = BIG_DECODE ? 1 << tiles_log2 : SETS > 1 ? (int)gridDim.x / HV : V / tile_rows;
    const int cta_rows = BIG_DECODE ? V >> tiles_log2 : V / tiles_per_head;
    const int sets = SETS > 1 ? cta_rows / tile_rows : 1; /* chosen by the launcher */
    const int h = BIG_DECODE ? (int)blockIdx.x >> tiles_log2 : (int)(blockIdx.x / tiles_per_head);
    const int tile = BIG_DECODE ? (int)blockIdx.x & (tiles_per_head - 1) : (int)(blockIdx.x % tiles_per_head);
    const int64_t i = blockIdx.y;
    GDN__PHASE_BEGIN();
    const int tile_row0 = tile * cta_rows;
    const int local_row0 = warp * Geo::ROWS_PER_WARP + group; /* row of rt = 0 within the first set */
    const int row0 = tile_row0 + local_row0;

    /* The kept-keys verify compiles the same branch, never taken (the launcher sets neither field for
     * it): with it its T = 3 and T = 4 steps measured faster on the H100 (bench/results/
     * 2026-11-27-h100-fetch-and-mixer-first.md), a code-generation effect not understood. */
    if constexpr (small_decode<S, REGS, ONE_TOKEN>() || KEEP_KEYS) { /* (the launcher sets neither for the others) */
        if (p.rows_from_preceding) gdn__wait_preceding();
        else if (p.allow_dependents_first) gdn__allow_dependents();
    }
    const int64_t r = p.read_slots[i];
    const int64_t w = p.write_slots ? (int64_t)p.write_slots[i] : r;
    const bool out_of_range = gdn__row_slots_invalid(r, w, p.num_slots);
    O *out = static_cast<O *>(p.out);
    const int64_t out_token_stride = p.out_strides.token;
    const int64_t out_base = gdn__at(p.out_strides, i, 0, h); /* (i, t = 0, h, row 0) */

    /* Per-row token counts and token trees (SPEC 3; gdn_kernel_params.h): which own tokens run. A
     * bad count, or a decode whose token cannot run, makes the row padding. */
    const uint32_t all_tokens = (1u << T) - 1u;
    gdn__row_plan plan = {T, all_tokens, 0};
    const bool planned = T > 0 && !out_of_range && r >= 0 && (p.token_counts || p.parents);
    bool row_chain = true; /* (BIG_TREE) */
    if (planned) {
        if constexpr (BIG_BF16) plan = plan_row_by_lanes(p.token_counts, p.parents, T, i, lane, row_chain);
        else if constexpr (BIG_TREE) plan = plan_row_at_once(p.token_counts, p.parents, T, i, row_chain);
        else plan = gdn__plan_row(p.token_counts, p.parents, T, i, nullptr);
        if (plan.bad && p.error_flag && blockIdx.x == 0 && threadIdx.x == 0) *p.error_flag = 1;
    }
    if (r < 0 || out_of_range || (planned && (plan.n == 0 || (ONE_TOKEN && plan.live != all_tokens)))) {
        zero_padding_row<O, Geo>(p, out_of_range, out, out_base, T, row0, sets, tile_rows, glane);
        return;
    }

    const int kh = BIG_DECODE ? gdn__small_quotient(h, gdn__small_quotient(HV, HK)) : h / (HV / HK);
    const float A = expf(p.A_log[h]), dt_bias = p.dt_bias[h];
    /* A fold verify (the direct fold decode runs decodes only: the launcher gives a verify of one
     * token to the verify instance). A function, not a variable, so that the flag is read where it is
     * used rather than held in a register through the kernel. */
    const auto verifying = [&p] { return FOLD && !DIRECT_FOLD && p.deferred_verify; };
    /* Fold: prepared tokens 0..store_tokens-1 are slot r's stored tokens (the first pending[r] of
     * them, its accepted tokens of its last verify, are folded), own token t is prepared token
     * own0 + t. All stored tokens are staged, whatever pending[r] is, so that no read waits for
     * another: read_slots[i], then the tokens, pending[r] and the state all in flight together. The
     * big bf16 instance (large grids, where a CTA's instructions and L2 reads count more than one
     * round trip) stages only the first pending[r], those its folds use, once its state loads are
     * issued. */
    const int own0 = FOLD ? p.store_tokens : 0;
    const int tokens = own0 + T;
    const int keep_heads = kept_heads<KEEP_KEYS>(p);
    /* Later row sets: their state is copied into shared memory during the previous set's work, or,
     * in the DIRECT_SETS instance (launch_regs picks it), loaded at the set's start, and the region
     * is not there. */
    const bool stage_sets = SETS > 1 && sets > 1 && !DIRECT_SETS;
    const size_t no_staging = DIRECT_SETS ? staged_floats<Geo, SETS>(blockDim.x) : 0;
    shared_tokens s(smem + staged_floats<Geo, SETS>(blockDim.x) - no_staging, K, cta_rows,
                    shared_tokens::capacity(FOLD, p.store_tokens, T), T, keep_heads);
    /* The mixer (SPEC 6; gdn_cuda_mixer.cuh): with the conv, the CTA's channels of the raw inputs as
     * one sequence [window of slot r; stored tokens; own tokens] in shared memory past the tokens. */
    const bool conv = MIXER && p.mixer.conv_width > 0;
    const bool norm = MIXER && p.mixer.norm_weight != nullptr;
    const int window_rows = conv ? p.mixer.conv_width - 1 : 0;
    const mixer_channels mc(p, kh, h, tile_row0, cta_rows);
    const mixer_smem parts(K, cta_rows, window_rows ? window_rows + 1 : 0, shared_tokens::capacity(FOLD, p.store_tokens, T), T,
                           V, sizeof(I), p.mixer.conv_weight_dtype == GDN_DTYPE_F32 ? 4 : 2, norm);
    char *mixer_base = reinterpret_cast<char *>(
        smem + mixer_smem_floats<Geo, SETS>(blockDim.x, K, cta_rows, shared_tokens::capacity(FOLD, p.store_tokens, T), T,
                                            keep_heads) - no_staging);
    /* Fold with a tree that is not a chain (a one-token step's never is): the tree form
     * (gdn_cuda_tree.cuh), its coefficients where the mixer's part would be. */
    const bool tree_form = !ONE_TOKEN && verifying() && !(BIG_TREE ? row_chain : row_is_chain(p.parents, i, T, plan.n));
    const tree_shared ts(reinterpret_cast<float *>(mixer_base + (MIXER ? parts.end : 0)), T, cta_rows);
    I *raw = reinterpret_cast<I *>(mixer_base + parts.raw);
    I *z_sh = reinterpret_cast<I *>(mixer_base + parts.z);
    float *norm_w_sh = reinterpret_cast<float *>(mixer_base + parts.norm_w);
    float *o_sh = reinterpret_cast<float *>(mixer_base + parts.o);
    /* With the norm, a CTA that holds all of its head's rows normalises them itself (large grids run
     * sequential row sets); otherwise the head's last CTA does, from fp32 scratch. */
    const bool local_norm = norm && tiles_per_head == 1;
    const bool window_async = conv && window_rows_contiguous(p.mixer);
    /* The conv with bf16 state takes the approximate SiLU in chain verifies (bench/results/
     * 2026-11-29-h200-fold-verify-chain-forms.md) and decodes (2026-11-29-h200-ring-moves-fast-silu.md).
     * The verify instances' gathered pass (trees) keeps the precise one: with the approximate one
     * their chain verifies, which compile it too, measured slower (register allocation). With
     * fp32 state it measured slower, also from register allocation (2026-11-27-h100-mixer-verify-conv.md). */
    constexpr bool FAST_SILU = sizeof(S) == 2;
    constexpr bool FAST_SILU_GATHERED = FAST_SILU && ONE_TOKEN;
    /* The window's and x's moves in 16-byte pieces in the fold verifies and the big decodes; the small
     * decodes and the cache verifies measured slower so (gdn_cuda_mixer.cuh). */
    constexpr bool WIDE_MOVES = ONE_TOKEN ? REGS == big_regs<S>() : FOLD;
    /* The mixer's instances stage the conv weights, bias, window and norm weight before the wait
     * (layer parameters and slot r's window). STATE_FIRST: its decodes with bf16 state and its big
     * verifies (large grids) but the bf16 cache one issue their state's loads before those copies;
     * the big bf16 decodes that fold also slide their conv's taps as a chain verify does (a decode
     * is never a tree; with nothing to fold every decode takes conv_pass_decode). Measured faster
     * so, the other instances slower or level, and 16-byte copies slower (bench/results/
     * 2026-11-29-h200-mixer-decode-state-first.md). Not the ring's write-through decode (slower
     * so); with fp32 state the sliding pass spilled. */
    constexpr bool BIG_MIXER_DECODE = MIXER && ONE_TOKEN && !RING && REGS == big_regs<S>() && sizeof(S) == 2;
    constexpr bool STATE_FIRST =
        MIXER && !RING &&
        ((ONE_TOKEN && sizeof(S) == 2) || (!ONE_TOKEN && REGS == big_regs<S>() && (FOLD || sizeof(S) == 4)));
    const int64_t token_elems = RING_FOLD ? gdn__mixer_record_bytes(p.mixer.conv_dim, HV, V) / (int64_t)sizeof(I)
                                : conv    ? gdn__mixer_token_elems(p.mixer.conv_dim, HV)
                                          : gdn__token_elems(HK, HV, K, V);
    /* Slot r's stored token j into shared memory: its raw inputs with the conv, else k and v; a ring
     * record's u of the CTA's rows where a token's v goes. */
    const auto stage_stored = [&](int j) {
        const I *tb = static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * token_elems;
        if (RING_FOLD) {
            const float *u = reinterpret_cast<const float *>(reinterpret_cast<const char *>(tb) +
                                                             gdn__mixer_record_u_offset(p.mixer.conv_dim, HV)) +
                             (int64_t)h * V + tile_row0;
            for (int c = lane; c < cta_rows; c += 32) gdn__copy_async4(s.v + (size_t)j * cta_rows + c, u + c);
        }
        if (conv)
            stage_conv_row<K, I>(mc, raw + (size_t)(window_rows + j) * mc.pitch, tb, lane);
        else
            stage_token<K, I, false>(s, j, 0, tb + (int64_t)kh * K, nullptr,
                                     tb + gdn__token_v_offset(HK, K) + (int64_t)h * V + tile_row0, cta_rows, lane);
    };
    /* Before the wait for the preceding kernel (which writes this step's inputs; overlap_preceding):
     * only what no kernel of the step writes before this one, slot r's stored tokens, window and state. */
    if constexpr (SHARED && !STATE_FIRST) {
        if constexpr (MIXER) { /* layer parameters and slot r's window: asynchronous copies */
            if (conv) stage_conv_params(p, mc, mixer_base + parts.weights, mixer_base + parts.bias);
            if (window_async) stage_window_async<I>(p, mc, raw, r);
            if (norm) copy_words_async(norm_w_sh, p.mixer.norm_weight, V * 4);
        }
        for (int j = warp; j < (STAGE_PENDING ? 0 : own0); j += warps) stage_stored(j);
    }

    /* Load every owned state row of the first set before the first use: RT * NV independent 16-byte
     * loads, in flight while the tokens are prepared; the next set's go to shared memory (each thread
     * copies exactly the vectors it will read back, so no barrier orders them). */
    const int64_t state_elems = (int64_t)V * K;
    const S *src = static_cast<const S *>(p.state) + r * p.slot_stride + h * state_elems;
    float st[RT][NV][EV];
    /* Large grids (the most state per thread) are bandwidth-bound: the step's inputs are better
     * loaded beside the state, so they wait first; small grids are latency-bound: their state loads
     * go out before the wait. The mixer's instances stage their inputs in shared memory whatever the
     * grid, and their state loads go out before the wait too: the cache strategy's big mixer decode
     * and verify measured faster so (bench/results/2026-11-29-h200-ring-write-through-fold.md). */
    constexpr bool STATE_BEFORE_WAIT = FOLD || MIXER || REGS != big_regs<S>();
    if constexpr (!STATE_BEFORE_WAIT) {
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
    }
    /* The ring's write-through decode: slot r's count is read beside the state (the preceding
     * kernel does not write it), but its records are applied after the wait, so that the wait does
     * not wait for the count (most steps find none). */
    const int ring_records = RING && !MIXER ? min(max(p.ring_count[r], 0), p.ring_capacity) : 0;
    load_rows<K, S, Geo, WORDS>(src, st, row0, glane);
    /* The same copies, once the state's loads are out (written twice: as one lambda called at either
     * place, the machine code of every other instance changed). */
    if constexpr (STATE_FIRST) {
        if (conv) stage_conv_params(p, mc, mixer_base + parts.weights, mixer_base + parts.bias);
        if (window_async) stage_window_async<I>(p, mc, raw, r);
        if (norm) copy_words_async(norm_w_sh, p.mixer.norm_weight, V * 4);
        for (int j = warp; j < (STAGE_PENDING ? 0 : own0); j += warps) stage_stored(j);
    }
    GDN__PHASE(GDN__PHASE_ISSUED);
    /* The big-grid cache decode (it waits before its state loads) reads its token's inputs right
     * behind them, with no branch between them and the token's use (the token loop's live and
     * parent tests are compile-time there), so that both are in flight together: read in the token
     * loop, they went out only once the state had arrived, a second round trip per CTA. */
    constexpr bool INPUTS_WITH_STATE = BIG_DECODE && !FOLD;
    /* (A one-token step's token is live and a root: its row is padding otherwise.) */
    constexpr bool ONE_LIVE_ROOT = BIG_DECODE || BIG_STAGED_FOLD_DECODE;
    static_assert(!INPUTS_WITH_STATE || !STATE_BEFORE_WAIT, "its inputs are read after the wait");
    typename token_values<Geo>::template raw_inputs<I> state_inputs;
    if constexpr (INPUTS_WITH_STATE) token_values<Geo>::template read_direct<K, I>(p, i, 0, kh, h, row0, glane, state_inputs);
    int pending_tokens = own0; /* (STAGE_PENDING: those staged) */
    if constexpr (STAGE_PENDING) { /* the stored tokens that the folds use (above) */
        pending_tokens = max(0, min(p.pending[r], own0));
        for (int j = warp; j < pending_tokens; j += warps) stage_stored(j);
    }
    if (conv && !window_async) stage_window<I>(p, mc, raw, r); /* plain loads, behind the state's */
    /* KEEP_KEYS (the fold verify on small grids): every read of slot r's count and stored tokens
     * completes before the wait (gdn_op.h: the preceding kernel writes none of them), and then the CTA
     * counts itself in, on its row's count and its key head's. So the counts' answers are back by the
     * time they are used: after the inputs' preparation, the key head's last CTA stores the own
     * tokens' keys and gates, and the row's last resets the pending count, in the middle of the
     * kernel. At its end they would delay its completion by their round trips, on the chain of small
     * grids. EARLY_FOLD (folds_early): the folds depend only on slot r too, so they also run before
     * the wait, while the preceding kernel still runs, and leave the chain from its end to this
     * kernel's; the folded state is stored after the wait (nothing else is written before it). Token
     * j is prepared by the warp that staged it (its copies are all it waits for), its gates by thread j. */
    int kept_folds = 0;
    float early_decay = 1.0f; /* the first set's decay after the early folds */
    unsigned row_arrival = 0, key_arrival = 0;
    /* The counts' answers, read after the preparation barrier. EARLY_FOLD counts in after its folds
     * and puts both here at once: held in registers through the folds they spilled at its register
     * cap. The other instances count in right after the barrier below and hold theirs in registers
     * (measured faster there); the key head's goes here just before the preparation barrier. */
    __shared__ int keys_last_cta, row_last_cta;
    if constexpr (KEEP_KEYS) {
        kept_folds = max(0, min(p.pending[r], p.store_tokens));
        gdn__copy_async_commit();
        gdn__copy_async_wait_all();
        if ((int)threadIdx.x < kept_folds) {
            const I *ap = static_cast<const I *>(p.token_store) + (r * p.store_tokens + threadIdx.x) * token_elems +
                          gdn__token_gates_offset(HK, HV, K, V) + h;
            token_gate(gdn__to_f32(ap[0]), gdn__to_f32(ap[HV]), A, dt_bias, s.gate[threadIdx.x], s.beta[threadIdx.x]);
        }
        if constexpr (EARLY_FOLD) {
            __syncwarp();
            for (int j = warp; j < kept_folds; j += warps) prepare_token<K, I, false>(p, s, j, 0, cta_rows, lane);
        }
        __syncthreads();
        if (!EARLY_FOLD && threadIdx.x == 0) {
            row_arrival = atomicAdd(&p.arrivals[i], 1u);
            key_arrival = atomicAdd(p.key_arrivals + i * HK + kh, 1u);
        }
    }
    const int early_folds = EARLY_FOLD ? kept_folds : 0;
    if constexpr (EARLY_FOLD) {
        float unused[RT];
        for (int j = 0; j < early_folds; j++) {
            token_values<Geo> tv;
            tv.template load_shared<false>(s, j, 0, K, cta_rows, local_row0, glane);
            apply_token<Geo, false, DECAY_OUTSIDE>(st, early_decay, tv, unused);
        }
        if (threadIdx.x == 0) {
            row_last_cta = atomicAdd(&p.arrivals[i], 1u) == gridDim.x - 1;
            keys_last_cta = atomicAdd(p.key_arrivals + i * HK + kh, 1u) == (uint32_t)(keep_heads * tiles_per_head) - 1u;
        }
    }
    if constexpr (STATE_BEFORE_WAIT) {
        if (p.overlap_preceding) gdn__wait_preceding();
        gdn__allow_dependents();
        GDN__PHASE(GDN__PHASE_WAITED);
    }
    if (RING && !MIXER && ring_records > 0) /* uniform over the CTA */
        apply_ring_records<K, I, Geo>(p, st, r, h, kh, ring_records, row0, glane);

    /* Token threadIdx.x's gate inputs; EARLY_FOLD holds them as read, so that no conversion waits for
     * the reads before the kept gates' stores below (the other instances measured slower with it). */
    using GateInput = std::conditional_t<EARLY_FOLD, I, float>;
    GateInput a_in = GateInput(0.0f), b_in = a_in;
    if constexpr (SHARED) {
        /* Token j is staged and prepared (below) by warp j % warps: the same warp, so that its own
         * copies are all the preparation waits for. */
        for (int j = warp; j < tokens; j += warps) {
            if (j < own0) continue;
            const int t = j - own0;
            if (conv) {
                stage_conv_row<K, I>(mc, raw + (size_t)(window_rows + j) * mc.pitch,
                                     static_cast<const I *>(p.mixer.x) + gdn__at(p.mixer.x_strides, i, t, 0), lane);
                continue;
            }
            stage_token<K, I, true>(s, j, t, static_cast<const I *>(p.k) + gdn__at(p.k_strides, i, t, kh),
                                    static_cast<const I *>(p.q) + gdn__at(p.q_strides, i, t, kh),
                                    static_cast<const I *>(p.v) + gdn__at(p.v_strides, i, t, h) + tile_row0, cta_rows, lane);
        }
        if (norm) stage_z<I>(p, i, h, T, z_sh);
        gdn__copy_async_commit(); /* the tokens: one group, before the next set's state */
        /* KEEP_KEYS (the fold verify): a and b of the key head's value heads, for the token store.
         * EARLY_FOLD reads them into registers here and stores them after the gates' reads are issued
         * (one round trip for all); the other instance measured slower so and copies them here. */
        if constexpr (KEEP_KEYS && !EARLY_FOLD)
            for (int e = threadIdx.x; e < keep_heads * T; e += blockDim.x) {
                const int head = kh * keep_heads + e / T, t = e % T;
                I *gates = static_cast<I *>(s.raw_gates);
                gates[e] = static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, head)];
                gates[keep_heads * T + e] = static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, t, head)];
            }
        constexpr int KEPT_READS = EARLY_FOLD ? GDN__KEPT_HEADS_MAX * GDN_MAX_TOKENS / 32 : 0;
        I kept_a[KEPT_READS > 0 ? KEPT_READS : 1], kept_b[KEPT_READS > 0 ? KEPT_READS : 1];
        if constexpr (EARLY_FOLD)
#pragma unroll
            for (int u = 0; u < KEPT_READS; u++) {
                const int e = threadIdx.x + u * blockDim.x;
                if (e >= keep_heads * T) break;
                const int head = kh * keep_heads + e / T, t = e % T;
                kept_a[u] = static_cast<const I *>(p.a)[gdn__at(p.a_strides, i, t, head)];
                kept_b[u] = static_cast<const I *>(p.b)[gdn__at(p.b_strides, i, t, head)];
            }
        /* (RING_FOLD: the gates of the records it applies; a record has no b, its u is stored.) */
        if ((int)threadIdx.x < tokens && (!KEEP_KEYS || (int)threadIdx.x >= own0) &&
            (!RING_FOLD || (int)threadIdx.x < pending_tokens || (int)threadIdx.x >= own0)) {
            const int j = threadIdx.x;
            const I *ap, *bp;
            if (FOLD && j < own0) {
                ap = static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * token_elems +
                     (conv ? (int64_t)p.mixer.conv_dim : gdn__token_gates_offset(HK, HV, K, V)) + h;
                bp = RING_FOLD ? ap : ap + HV;
            } else {
                ap = static_cast<const I *>(p.a) + gdn__at(p.a_strides, i, j - own0, h);
                bp = static_cast<const I *>(p.b) + gdn__at(p.b_strides, i, j - own0, h);
            }
            a_in = static_cast<GateInput>(*ap);
            b_in = static_cast<GateInput>(*bp);
        }
        if constexpr (EARLY_FOLD)
#pragma unroll
            for (int u = 0; u < KEPT_READS; u++) {
                const int e = threadIdx.x + u * blockDim.x;
                if (e >= keep_heads * T) break;
                I *gates = static_cast<I *>(s.raw_gates);
                gates[e] = kept_a[u];
                gates[keep_heads * T + e] = kept_b[u];
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
    if (stage_sets) stage_set(1, 0);

    const int folds = KEEP_KEYS ? kept_folds : FOLD ? max(0, min(p.pending[r], p.store_tokens)) : 0;
    /* The direct fold decode's own token: its reads in flight with pending[r]'s, held raw across the
     * folds (which come first in the state but seldom exist). */
    typename token_values<Geo>::template raw_inputs<I> own_raw;
    if constexpr (DIRECT_FOLD) token_values<Geo>::template read_direct<K, I>(p, i, 0, kh, h, row0, glane, own_raw);
    const mixer_sequence seq{window_rows, folds, own0};
    /* The conv's window of slot w after this step: the last W - 1 of [window; folded tokens; own
     * tokens unless they stay pending (fold verify)]; a cache verify leaves it to the commit. */
    const bool window_moves = conv && (FOLD || !p.cache);
    const int window_length = window_rows + folds + (verifying() ? 0 : T);
    if constexpr (SHARED) {
        if ((int)threadIdx.x < tokens && (!KEEP_KEYS || (int)threadIdx.x >= own0))
            token_gate(gdn__to_f32(a_in), gdn__to_f32(b_in), A, dt_bias, s.gate[threadIdx.x], s.beta[threadIdx.x]);
        if constexpr (RING_FOLD) /* a full ring of 32 records and the own token in a one-warp CTA */
            for (int j = threadIdx.x + blockDim.x; j < tokens; j += blockDim.x) {
                if (j >= pending_tokens && j < own0) continue;
                const I *ap = j < own0 ? static_cast<const I *>(p.token_store) + (r * p.store_tokens + j) * token_elems +
                                             p.mixer.conv_dim + h
                                       : static_cast<const I *>(p.a) + gdn__at(p.a_strides, i, j - own0, h);
                const I *bp = j < own0 ? ap : static_cast<const I *>(p.b) + gdn__at(p.b_strides, i, j - own0, h);
                token_gate(gdn__to_f32(*ap), gdn__to_f32(*bp), A, dt_bias, s.gate[j], s.beta[j]);
            }
        if (tree_form && (int)threadIdx.x >= own0 && (int)threadIdx.x < tokens)
            ts.logd[threadIdx.x - own0] = token_log_decay(gdn__to_f32(a_in), A, dt_bias);
        if (stage_sets) gdn__copy_async_wait_group<1>(); /* the tokens; the next set's state may go on */
        else gdn__copy_async_wait_all();
        if (conv) {
            __syncthreads(); /* the whole raw sequence (each thread waited for its own copies) */
            GDN__PHASE(GDN__PHASE_INPUTS);
            if (ONE_TOKEN && folds == 0)
                /* the small bf16 fold decodes: a thread's channels unrolled, measured faster there only
                 * (bench/results/2026-11-29-h200-mixer-decode-conv-taps.md, G) */
                conv_pass_decode<I, FAST_SILU, sizeof(S) == 2 && FOLD && !RING && REGS != big_regs<S>() ? 3 : 1>(
                    p, mc, raw, mixer_base + parts.weights, mixer_base + parts.bias, own0, s);
            else if (BIG_MIXER_DECODE || (!ONE_TOKEN && !p.parents)) /* (neither is the ring's) */
                conv_pass_sliding<I, true, FAST_SILU>(p, mc, raw, mixer_base + parts.weights, mixer_base + parts.bias, seq, T, s);
            else
                conv_pass_gathered<I, !RING_FOLD, FAST_SILU_GATHERED>(p, mc, raw, mixer_base + parts.weights,
                                                                       mixer_base + parts.bias, seq, T, s,
                                                                       gdn__row_parents(p.parents, i, T), own0);
            __syncthreads();
            GDN__PHASE(GDN__PHASE_CONV);
            for (int j = warp; j < tokens; j += warps) {
                if (j >= own0) normalise_token<K, true>(p, s, j, j - own0, lane);
                else if (j < folds) normalise_token<K, false>(p, s, j, 0, lane);
            }
            /* v channels of the CTA's rows: read by no other CTA, written now (the raw copy is complete) */
            if (window_moves) write_window<I, WIDE_MOVES>(p, mc, raw, seq, window_length, w, 2 * K, mc.width);
            if (!FOLD && p.cache && p.mixer.x_store) { /* a cache verify keeps x for the commit */
                I *x_row = static_cast<I *>(p.mixer.x_store) + i * p.mixer.x_store_tokens * (int64_t)p.mixer.conv_dim;
                store_own_x<I, WIDE_MOVES>(mc, raw, seq, T, x_row, p.mixer.conv_dim, 2 * K, mc.width);
                if (h % (HV / HK) == 0 && tile == 0) store_own_x<I, WIDE_MOVES>(mc, raw, seq, T, x_row, p.mixer.conv_dim, 0, 2 * K);
            }
        } else {
            __syncwarp();
            for (int j = warp; j < tokens; j += warps) {
                if (!FOLD || j >= own0) prepare_token<K, I, true>(p, s, j, j - own0, cta_rows, lane);
                else if (!EARLY_FOLD && j < folds) prepare_token<K, I, false>(p, s, j, 0, cta_rows, lane); /* (the rest: staged, unused) */
            }
        }
        if (KEEP_KEYS && !EARLY_FOLD && threadIdx.x == 0) keys_last_cta = key_arrival == (uint32_t)(keep_heads * tiles_per_head) - 1u;
        __syncthreads();
        GDN__PHASE(GDN__PHASE_PREPARED);
        if constexpr (KEEP_KEYS) { /* the counts' answers (above): the own keys and gates are in shared memory now */
            if (keys_last_cta) store_own_keys<K, I>(p, s, w, kh, keep_heads, T);
            if (threadIdx.x == 0) {
                if (keys_last_cta) p.key_arrivals[i * HK + kh] = 0;
                if (EARLY_FOLD ? row_last_cta : row_arrival == gridDim.x - 1) {
                    p.pending[w] = 0;
                    p.arrivals[i] = 0;
                }
            }
        }
        if (tree_form) {
            if constexpr (BIG_TREE) {
                tree_coefficients_listed<K>(ts, s, p.parents + i * T, plan.live, T, own0, lane, warp, warps);
                if constexpr (L == 8 && sizeof(S) == 2) tree_path_matrix(ts, s, plan.live, T, own0, cta_rows, lane, warp, warps);
                else if constexpr (L == 8 && DIRECT_SETS) nodes_to_bf16_pairs<K>(s.khat + (size_t)own0 * K, s.qhat, T);
            } else tree_coefficients<K>(ts, s, p.parents + i * T, plan.live, T, own0, lane, warp, warps);
        }
    }

    /* Fold: the CTA has read pending[r] and its share of slot r's stored tokens (before the barrier
     * above). It counts itself in now and learns at its end whether it was the row's last, so the
     * atomic's round trip overlaps the token loop; that last CTA then does the row's bookkeeping
     * (KEEP_KEYS did its own before and after its preparation barrier, above). A decode in place
     * with nothing to fold leaves slot w's tokens and count as they are: its row has no bookkeeping,
     * and its CTAs do not count in (on small grids, every CTA of the row on one counter). */
    const bool row_bookkeeping = !KEEP_KEYS && FOLD && (!ONE_TOKEN || verifying() || folds > 0 || r != w);
    unsigned arrival = 0;
    if (SHARED && row_bookkeeping && threadIdx.x == 0) arrival = atomicAdd(&p.arrivals[i], 1u);
    /* The same for the CTAs of key head kh's value heads with the mixer's conv: they have read its
     * window channels. */
    bool kh_last = false;
    uint32_t *mixer_counts = MIXER ? p.mixer.arrivals + i * (int64_t)(HK + HV) : nullptr;
    const bool kh_writes = window_moves || (conv && verifying());
    if (kh_writes && threadIdx.x == 0) kh_last = arrive_last(mixer_counts + kh, (uint32_t)((HV / HK) * tiles_per_head));

    if (verifying() && conv) /* the same for the raw x of its v channels */
        store_own_x<I, WIDE_MOVES>(mc, raw, seq, T, static_cast<I *>(p.token_store) + w * p.store_tokens * token_elems, token_elems,
                       2 * K, mc.width);
    else if (verifying()) {
        /* Verify: this CTA's rows of v of the own tokens become slot w's stored v, from the prepared
         * copy (exact: v converted from I and back; the preparation above read slot r's rows before
         * the barrier, and no other CTA reads these rows). */
        I *store = static_cast<I *>(p.token_store);
        /* The big bf16 instance stores 16-byte vectors where every token's rows allow them (the small
         * grids' 36-layer verify measured slower so; the fp32 instances were not measured apart). */
        constexpr int VW = 16 / (int)sizeof(I);
        static_assert(VW == 8, "2-byte inputs");
        I *const v_rows = store + w * p.store_tokens * token_elems + gdn__token_v_offset(HK, K) + (int64_t)h * V + tile_row0;
        if (BIG_BF16 && cta_rows % VW == 0 && token_elems % VW == 0 &&
            (reinterpret_cast<uintptr_t>(v_rows) & 15) == 0) {
            const int chunks = cta_rows / VW;
            for (int e = threadIdx.x; e < T * chunks; e += blockDim.x) {
                const int t = e / chunks, c = e % chunks;
                const float4 *from = reinterpret_cast<const float4 *>(s.v + (size_t)(own0 + t) * cta_rows + c * VW);
                const float4 lo = from[0], hi = from[1];
                const float x[VW] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                gdn__store_vec<I, VW>(v_rows + t * token_elems + c * VW, x);
            }
        } else {
            const int row_bits = __ffs(cta_rows) - 1; /* (BIG_TREE: cta_rows is a power of two) */
            for (int e = threadIdx.x; e < T * cta_rows; e += blockDim.x) {
                const int t = BIG_TREE ? e >> row_bits : e / cta_rows, row = BIG_TREE ? e & (cta_rows - 1) : e % cta_rows;
                store[(w * p.store_tokens + t) * token_elems + gdn__token_v_offset(HK, K) + (int64_t)h * V + tile_row0 + row] =
                    gdn__from_f32<I>(s.v[(size_t)(own0 + t) * cta_rows + row]);
            }
        }
    }

    S *cache = static_cast<S *>(p.cache);
    const int64_t cache_token_stride = (int64_t)HV * state_elems;
    for (int set = 0; set < sets; set++) {
        const int set_row0 = row0 + set * tile_rows, set_local_row0 = local_row0 + set * tile_rows;
        if (DIRECT_SETS && set > 0) load_rows<K, S, Geo, WORDS>(src, st, set_row0, glane);
        else if (set > 0) { /* this set's state, copied to shared memory during the previous set's work */
            gdn__copy_async_wait_all();
            uint32_t read = 0;
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int n = 0; n < NV; n++) {
                    const uint4 raw = staged[(rt * NV + n) * blockDim.x + threadIdx.x];
                    read |= raw.x;
                    gdn__load_vec<S, EV, WORDS>(reinterpret_cast<const S *>(&raw), st[rt][n]);
                }
            if (set + 1 < sets) stage_set(set + 1, gdn__zero_after(read));
        }
        float o[RT], decay = EARLY_FOLD && set == 0 ? early_decay : 1.0f;
        if constexpr (FOLD) {
            for (int j = EARLY_FOLD && set == 0 ? folds : 0; j < folds; j++) {
                token_values<Geo> tv;
                if constexpr (SHARED) tv.template load_shared<false>(s, j, 0, K, cta_rows, set_local_row0, glane);
                else tv.template load_stored<K, I>(p, r, j, kh, h, set_row0, glane, A, dt_bias);
                if constexpr (RING_FOLD) apply_record<Geo, DECAY_OUTSIDE>(st, decay, tv);
                else apply_token<Geo, false, DECAY_OUTSIDE>(st, decay, tv, o);
            }
            if (verifying()) /* the pool gets the folded state; the own tokens stay pending */
                store_rows<K, S, Geo, DECAY_OUTSIDE>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems,
                                                     st, decay, set_row0, glane);
        }

        if constexpr (BIG_TREE) {
            if (tree_form) {
                if constexpr (L == 8 && sizeof(S) == 2) { /* K = 128: on the tensor cores; one node tile up to 8 */
                    if (T <= 8) tree_set_mma<K, O, Geo, 1>(st, decay, s, ts, plan.live, own0, T, cta_rows, set_local_row0 - group,
                                            set_row0 - group, lane, out, out_base, out_token_stride);
                    else
                        tree_set_mma<K, O, Geo, 2>(st, decay, s, ts, plan.live, own0, T, cta_rows, set_local_row0 - group,
                                                   set_row0 - group, lane, out, out_base, out_token_stride);
                } else if constexpr (L == 8) /* (fp32 state: split operands) */
                    tree_set_mma_split<K, O, Geo, DIRECT_SETS>(st, decay, s, ts, plan.live, own0, T, cta_rows, set_local_row0 - group,
                                                  set_row0 - group, lane, out, out_base, out_token_stride);
                else
                    tree_set_scattered<K, O, Geo>(st, decay, s, ts, plan.live, own0, T, cta_rows, set_local_row0, set_row0,
                                                  glane, out, out_base, out_token_stride);
                continue;
            }
        }
        /* (Loading token t + 1's inputs during token t was measured slower: the extra registers
         * cost more occupancy than the hidden latency gained.) */
        int held = -1; /* the token whose state the registers hold (-1: the row's start) */
        for (int t = 0; t < T; t++) {
            if (!ONE_LIVE_ROOT && !((plan.live >> t) & 1u)) { /* padding token (uniform over the CTA): zero output, no state */
#pragma unroll
                for (int rt = 0; rt < RT; rt++) o[rt] = 0.0f;
                if (tree_form) {
                    if (glane == 0)
#pragma unroll
                        for (int rt = 0; rt < RT; rt++) ts.uown[(size_t)t * cta_rows + set_local_row0 + rt * G] = 0.0f;
                    __syncwarp(); /* read by the group's other lanes at the next token */
                }
            } else if (tree_form) {
                token_values<Geo> tv;
                tv.template load_shared<true>(s, own0 + t, t, K, cta_rows, set_local_row0, glane);
                tree_token<Geo>(st, decay, tv, ts, t, T, cta_rows, set_local_row0, glane, o);
            } else {
                /* A chain applies token t to the registers. The cache strategy's branch starts from its
                 * parent's state: from the cache with fp32 state; with bf16 (which the cache rounds) the
                 * slot's state runs the parent's path again first, root first, through the same
                 * application (one code path: replayed tokens' outputs are overwritten). */
                const int parent = ONE_LIVE_ROOT ? -1 : p.parents ? p.parents[i * T + t] : t - 1;
                int replays = 0;
                if (!FOLD && parent != held) {
                    if constexpr (sizeof(S) == 4) {
                        load_rows<K, S, Geo>(parent < 0 ? src : cache + i * p.cache_row_stride + parent * cache_token_stride +
                                                                    h * state_elems,
                                             st, set_row0, glane);
                    } else {
                        load_rows<K, S, Geo>(src, st, set_row0, glane);
                        for (int a = parent; a >= 0; a = p.parents[i * T + a]) replays++; /* live: parents checked */
                    }
                }
                for (int step = replays; step >= 0; step--) { /* step > 0: the ancestor step - 1 above the parent */
                    int token = t;
                    if (step > 0) {
                        token = parent;
                        for (int up = 1; up < step; up++) token = p.parents[i * T + token];
                    }
                    token_values<Geo> tv;
                    if constexpr (SHARED) tv.template load_shared<true>(s, own0 + token, token, K, cta_rows, set_local_row0, glane);
                    else if constexpr (DIRECT_FOLD) tv.template prepare_direct<K, I>(p, own_raw, A, dt_bias); /* read above */
                    else if constexpr (INPUTS_WITH_STATE) tv.template prepare_direct<K, I>(p, state_inputs, A, dt_bias);
                    else tv.template load_direct<K, I>(p, i, token, kh, h, set_row0, glane, A, dt_bias);
                    apply_token<Geo, true, DECAY_OUTSIDE>(st, decay, tv, o);
                }
                held = t;
            }
            if (glane == 0) {
                if (local_norm) /* o for the norm below */
#pragma unroll
                    for (int rt = 0; rt < RT; rt++)
                        o_sh[t * V + set_row0 + rt * G] = o[rt];
                else if (norm) /* o for the head's last CTA, which normalises it */
#pragma unroll
                    for (int rt = 0; rt < RT; rt++)
                        p.mixer.norm_scratch[((i * T + t) * HV + h) * (int64_t)V + set_row0 + rt * G] = o[rt];
                else
#pragma unroll
                    for (int rt = 0; rt < RT; rt++)
                        out[out_base + t * out_token_stride + set_row0 + rt * G] = gdn__from_f32<O>(o[rt]);
            }
            if (cache && ((plan.live >> t) & 1u))
                store_rows<K, S, Geo, DECAY_OUTSIDE>(
                    cache + i * p.cache_row_stride + t * cache_token_stride + h * state_elems, st, decay, set_row0, glane);
        }

        if (!cache && !verifying())
            store_rows<K, S, Geo, DECAY_OUTSIDE>(static_cast<S *>(p.state) + w * p.slot_stride + h * state_elems, st,
                                                 decay, set_row0, glane);
        GDN__PHASE(GDN__PHASE_SET0 + min(set, 3));
    }

    /* Ring write-through: slot w's ring is empty now. The row's last CTA says so, once every CTA has
     * read slot r's count. */
    if (RING && !MIXER && (ring_records > 0 || r != w)) { /* uniform over the CTA */
        __syncthreads();
        if (threadIdx.x == 0 && arrive_last(&p.arrivals[i], gridDim.x)) p.ring_count[w] = 0;
    }

    if constexpr (FOLD) {
        if (row_bookkeeping) { /* every CTA of the row has read slot r's tokens: slot w's may change */
            if constexpr (!SHARED) { /* the direct fold decode: every thread has read them by now */
                __syncthreads();
                if (threadIdx.x == 0) arrival = atomicAdd(&p.arrivals[i], 1u);
            }
            __shared__ int last_cta;
            if (threadIdx.x == 0) last_cta = arrival == gridDim.x - 1;
            __syncthreads();
            if (last_cta) {
                if (verifying() && conv) store_mixer_gates<I>(p, i, w, T);
                else if (verifying() && !KEEP_KEYS) store_shared_inputs<K, I>(p, i, w, T);
                if (threadIdx.x == 0) {
                    p.pending[w] = 0;
                    p.arrivals[i] = 0;
                }
            }
        }
    }

    if constexpr (MIXER) {
        __shared__ int kh_last_cta, head_last_cta;
        if (threadIdx.x == 0) kh_last_cta = kh_last;
        __syncthreads();
        if (kh_last_cta) { /* every CTA of kh's heads has read its window channels: q and k of kh move */
            if (window_moves) write_window<I, WIDE_MOVES>(p, mc, raw, seq, window_length, w, 0, 2 * K);
            if (verifying())
                store_own_x<I, WIDE_MOVES>(mc, raw, seq, T, static_cast<I *>(p.token_store) + w * p.store_tokens * token_elems,
                               token_elems, 0, 2 * K);
        }
        GDN__PHASE(GDN__PHASE_NORM);
        if (local_norm && T > 0) {
            finish_norm<I, O, false, !ONE_TOKEN>(p, i, h, T, o_sh, V, z_sh, norm_w_sh, out, out_base);
        } else if (norm && T > 0) {
            /* every thread's o before the count: the barrier above, then thread 0's fence (cumulative;
             * counting in before the state stores instead, with a barrier in the set loop, was
             * measured slower at buckets 4-8) */
            if (threadIdx.x == 0) {
                __threadfence();
                head_last_cta = arrive_last(mixer_counts + HK + h, (uint32_t)tiles_per_head);
            }
            __syncthreads();
            if (head_last_cta) {
                __threadfence();
                finish_norm<I, O, true, !ONE_TOKEN>(p, i, h, T, p.mixer.norm_scratch + (i * T * HV + h) * (int64_t)V,
                                                    (int64_t)HV * V, z_sh, norm_w_sh, out, out_base);
            }
        }
    }
    GDN__PHASE_FINISH();
}

/* ---------------------------------------------------------------------------------------------- */
/* Launcher                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

template <int K, typename S, typename I, typename O, int REGS, bool ONE_TOKEN, bool FOLD, bool MIXER, bool RING,
          bool STAGED = staged_by_default<ONE_TOKEN, FOLD, MIXER>(), bool KEEP_KEYS = false, bool EARLY_FOLD = false>
static gdn_status launch_regs(const gdn__layer_params *p, cudaStream_t stream)
{
    constexpr bool SHARED = STAGED;
    using Geo = layer_geometry<K, S, REGS, SHARED>;
    constexpr int SETS = row_sets<SHARED>();
    const auto ctas = [&](int warps, int sets) { return (int64_t)p->B * p->HV * (p->V / (sets * warps * Geo::ROWS_PER_WARP)); };
    const int T = ONE_TOKEN ? 1 : p->T;
    const int capacity = shared_tokens::capacity(FOLD, p->store_tokens, T);
    /* A fold verify with a tree keeps its coefficients past the mixer's part (or where it would be). */
    constexpr bool TREE_FORM = FOLD && !ONE_TOKEN;
    const int keep_heads = kept_heads<KEEP_KEYS>(*p);
    const auto tree_staging = [](int threads, int rows, int tokens, int capacity_, int keep_heads_, const mixer_smem &parts_) {
        return sizeof(float) * mixer_smem_floats<Geo, SETS>(threads, K, rows, capacity_, tokens, keep_heads_) +
               (MIXER ? parts_.end : 0) +
               sizeof(float) * tree_shared::floats(tokens, rows);
    };
    const auto smem_for = [&](int warps_, int cta_rows_) -> size_t {
        const mixer_smem parts(K, cta_rows_, MIXER ? p->mixer.conv_width : 0, capacity, T, p->V, sizeof(I),
                               p->mixer.conv_weight_dtype == GDN_DTYPE_F32 ? 4 : 2, MIXER && p->mixer.norm_weight);
        return TREE_FORM && p->parents ? tree_staging(warps_ * 32, cta_rows_, T, capacity, keep_heads, parts)
               : SHARED                ? staging_bytes<Geo, SETS>(warps_ * 32, K, cta_rows_, capacity, T, keep_heads, MIXER, parts)
                                       : 0;
    };
    auto kernel = layer_step_kernel<K, S, I, O, REGS, ONE_TOKEN, FOLD, MIXER, RING, STAGED, KEEP_KEYS, EARLY_FOLD, false>;
    /* K = 256, many tokens, the mixer: opt in once per device and instance, up to the largest case,
     * before a launch or an occupancy query needs more than 48 KiB (the runtime answers no CTA an SM
     * for a size past the kernel's limit, which the memo would then keep). A query whose opt-in
     * fails (a device with less shared memory) answers no and leaves no error behind. */
    const auto largest_smem = [&] {
        constexpr int most_tokens = GDN_MAX_TOKENS;
        /* shared_tokens::capacity(true, ...): the fold's stored tokens, or the ring's records */
        constexpr int most_capacity = (RING ? GDN_MAX_RING_LENGTH : most_tokens) + most_tokens;
        const mixer_smem largest_parts(K, GDN__MAX_HEAD_DIM, MIXER ? GDN__MAX_CONV_WIDTH : 0, most_capacity, most_tokens,
                                       GDN__MAX_HEAD_DIM, sizeof(I), 4, MIXER);
        const int most_kept = KEEP_KEYS ? GDN__KEPT_HEADS_MAX : 0;
        size_t largest =
            staging_bytes<Geo, SETS>(128, K, GDN__MAX_HEAD_DIM, most_capacity, most_tokens, most_kept, MIXER, largest_parts);
        if constexpr (TREE_FORM) {
            const size_t largest_tree = tree_staging(128, GDN__MAX_HEAD_DIM, most_tokens, most_capacity, most_kept, largest_parts);
            if (largest_tree > largest) largest = largest_tree;
        }
        return (int)largest;
    };
    static std::atomic<bool> opted_in[GDN__MAX_DEVICES];
    const auto opt_in_for = [&](size_t bytes) { return bytes > 48 * 1024 ? gdn__opt_in_shared(kernel, largest_smem(), opted_in) : cudaSuccess; };
    const auto fits_after_opt_in = [&](size_t bytes) {
        if (opt_in_for(bytes) == cudaSuccess) return true;
        (void)cudaGetLastError();
        return false;
    };
    int warps = 4, sets = SETS; /* fewer sets, then fewer warps, until small grids reach every SM */
    while (sets > 1 && (p->V % (sets * warps * Geo::ROWS_PER_WARP) != 0 || ctas(warps, sets) < GDN__SMALL_GRID_CTAS))
        sets /= 2;
    if constexpr (SETS > 1 && !ONE_TOKEN) { /* the staged verify: fold, and the mixer's */
        const int more = staged_verify_sets<SETS>(sets, T, !MIXER && sizeof(S) == 4 && REGS == big_regs<S>(),
                                                  [&](int s) { return p->V % (s * 4 * Geo::ROWS_PER_WARP) == 0 ? ctas(4, s) : 0; });
        static std::atomic<uint64_t> occupancy_memo{0};
        const size_t more_smem = smem_for(4, more * 4 * Geo::ROWS_PER_WARP);
        if (more > sets ? fits_after_opt_in(more_smem) && gdn__in_one_wave(kernel, 128, more_smem, ctas(4, more), occupancy_memo)
                        : !MIXER)
            sets = more;
    }
    /* The staged instances (fold verify, the mixer) keep more warps per CTA on small grids: a CTA
     * prepares every token (one warp a token) and does the row's bookkeeping, fixed costs that
     * one-warp CTAs run serially (B = 1, qwen3-next, T = 4: 1024 one-warp CTAs, each a ~9 us chain of
     * ~3200 instructions). */
    constexpr int MAX_WARPS = cta_warps_max<S, REGS, ONE_TOKEN>();
    /* The mixer's decode CTAs each also stage their key head's q and k window and run its conv, a
     * cost per CTA: it takes the larger CTAs on grids up to twice as large
     * (bench/results/2026-11-27-h100-mixer-decode-wave.md). */
    constexpr int64_t MORE_WARPS_BELOW = MIXER && ONE_TOKEN ? 2 * GDN__SMALL_GRID_CTAS : GDN__SMALL_GRID_CTAS;
    if (MAX_WARPS > 4 && ctas(4, sets) < MORE_WARPS_BELOW)
        warps = warps_for<Geo>(p, sets, GDN__DECODE_GRID_CTAS, MAX_WARPS);
    else
        warps = warps_for<Geo>(p, sets, SHARED ? GDN__SMALL_GRID_CTAS / 4 : GDN__SMALL_GRID_CTAS);
    /* The mixer's decode, whose CTAs each also stage their key head's q and k window and run its
     * conv: more row sets a CTA where that brings its grid into one wave (a second wave of them
     * costs as much again), else as above. */
    if constexpr (MIXER && ONE_TOKEN && SETS > 1) {
        /* a memo for each (sets, warps) pair it may ask about, so that launches outside graphs ask
         * the runtime once each */
        static std::atomic<uint64_t> decode_memo[3 * 4];
        const auto resident = [&](int s, int grids) { /* `grids` such grids at once */
            const int slot = (s >= 4 ? 2 : s - 1) * 4 + (warps >= 8 ? 3 : warps >= 4 ? 2 : warps - 1);
            const size_t bytes = smem_for(warps, s * warps * Geo::ROWS_PER_WARP);
            return fits_after_opt_in(bytes) &&
                   gdn__in_one_wave(kernel, warps * 32, bytes, grids * ctas(warps, s), decode_memo[slot]);
        };
        /* With the preceding kernel overlapped (PDL), the next layer's grid starts while this one runs.
         * On the tiny instance's fold grids of at most GDN__DECODE_GRID_CTAS CTAs of one set (one row of
         * qwen3-next) the fewest sets that leave room for both grids come first, so that every CTA of
         * the next one starts before this one ends. Measured faster there only: the cache's level, the
         * small instance's grid of as many CTAs (two rows) slower
         * (bench/results/2026-11-29-h200-mixer-small-grids.md). */
        const bool two_grids = FOLD && REGS == GDN__STATE_REGS_TINY && p->overlap_preceding &&
                               ctas(warps, sets) <= GDN__DECODE_GRID_CTAS;
        const auto fewest_sets = [&](int grids) { /* that many grids resident at once; 0: none */
            for (int s = sets;; s *= 2) {
                if (resident(s, grids)) return s;
                if (s >= SETS || p->V % (2 * s * warps * Geo::ROWS_PER_WARP) != 0) return 0;
            }
        };
        int found = two_grids ? fewest_sets(2) : 0;
        if (found == 0) found = fewest_sets(1);
        if (found > 0) sets = found;
    }
    const int cta_rows = sets * warps * Geo::ROWS_PER_WARP;
    const int tiles_per_head = p->V / cta_rows;
    const dim3 grid((unsigned)(p->HV * tiles_per_head), (unsigned)p->B);
    size_t smem = smem_for(warps, cta_rows);
    GDN__CUDA_TRY(opt_in_for(smem));
    /* The big fold verify's later row sets: its DIRECT_SETS instance loads them at each set's start
     * and has no staging region. It runs where that adds CTAs an SM and the grid would take more than
     * two waves with the region (16-token steps at large batches; on smaller grids the exposed loads
     * cost more than the CTAs gain: bench/results/2026-11-28-h200-tree-direct-sets.md). */
    auto chosen = kernel;
    if constexpr (big_fold_verify<S, REGS, ONE_TOKEN, FOLD, MIXER, STAGED, KEEP_KEYS>())
        if (sets > 1) {
            auto direct = layer_step_kernel<K, S, I, O, REGS, ONE_TOKEN, FOLD, MIXER, RING, STAGED, KEEP_KEYS, EARLY_FOLD, true>;
            const size_t direct_smem = smem - sizeof(float) * staged_floats<Geo, SETS>(warps * 32);
            if (direct_smem > 48 * 1024) {
                static std::atomic<bool> direct_opted_in[GDN__MAX_DEVICES];
                GDN__CUDA_TRY(gdn__opt_in_shared(direct, largest_smem(), direct_opted_in));
            }
            static std::atomic<uint64_t> staged_memo{0}, direct_memo{0};
            const int staged_per_sm = gdn__ctas_per_sm(kernel, warps * 32, smem, staged_memo);
            const int direct_per_sm = gdn__ctas_per_sm(direct, warps * 32, direct_smem, direct_memo);
            if (direct_per_sm > staged_per_sm && (int64_t)grid.x * grid.y > 2 * (int64_t)staged_per_sm * gdn__sm_count()) {
                chosen = direct;
                smem = direct_smem;
            }
        }
    gdn__layer_params q = *p;
    constexpr bool SMALL_DECODE = small_decode<S, REGS, ONE_TOKEN>();
    if (!SMALL_DECODE && q.rows_from_preceding) q.rows_from_preceding = q.overlap_preceding = 0;
    q.allow_dependents_first = SMALL_DECODE && allows_dependents_first(q);
    GDN__CUDA_TRY(gdn__launch(chosen, grid, dim3(warps * 32), smem, stream, q.overlap_preceding != 0, q));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* Where the big instance starts (state_regs_for's big_from, in GDN__SMALL_GRID_CTAS of its warps):
 * GDN__BIG_FROM_USUAL unless another measured faster.
 * - From 1, the verifies with bf16 state (fold and cache) and the mixer's fp32 fold verify: the small
 *   instance runs several times the warps, in more CTAs, each preparing every token (and with the
 *   mixer running its key head's conv), which costs those verifies more than the big one's fewer
 *   warps an SM (bench/results/2026-11-29-h200-verify-big-early.md). The other fp32 verifies
 *   measured slower or level there.
 * - bf16 decodes: from 1 with the mixer (the small instance's CTAs each run their key head's conv),
 *   from 2 without; the fp32 cache decode without the mixer from 2. The other fp32 decodes measured
 *   slower there (bench/results/2026-11-29-h200-small-bucket-instances.md). The ring's write-through
 *   runs the cache decode's instances (with the mixer's conv the fold decode's), under their rule. */
template <typename S, bool ONE_TOKEN, bool FOLD, bool MIXER> constexpr int layer_big_from()
{
    if constexpr (!ONE_TOKEN) return sizeof(S) == 2 || (MIXER && FOLD) ? 1 : GDN__BIG_FROM_USUAL;
    else if constexpr (sizeof(S) == 2) return MIXER ? 1 : 2;
    else return !FOLD && !MIXER ? 2 : GDN__BIG_FROM_USUAL;
}
/* The instance holding as many state values a thread as state_regs_for picks for this grid. */
template <int K, typename S, typename I, typename O, bool ONE_TOKEN, bool FOLD, bool MIXER, bool RING = false>
static gdn_status launch_tokens(const gdn__layer_params *p, cudaStream_t stream)
{
    switch (state_regs_for<K, S, staged_by_default<ONE_TOKEN, FOLD, MIXER>()>(p, ONE_TOKEN,
                                                                           layer_big_from<S, ONE_TOKEN, FOLD, MIXER>())) {
    case state_regs::big:
        if constexpr (FOLD && ONE_TOKEN && !MIXER)
            if (fold_decode_staged<K, S>(p)) return launch_regs<K, S, I, O, big_regs<S>(), true, true, false, false, true>(p, stream);
        return launch_regs<K, S, I, O, big_regs<S>(), ONE_TOKEN, FOLD, MIXER, RING>(p, stream);
    case state_regs::tiny: return launch_regs<K, S, I, O, GDN__STATE_REGS_TINY, ONE_TOKEN, FOLD, MIXER, RING>(p, stream);
    default:
        if constexpr (FOLD && !ONE_TOKEN && !MIXER)
            if (keeps_keys_on(p))
                return folds_early<S>(p) ? launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, false, true, false, false, true, true, true>(p, stream)
                                      : launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, false, true, false, false, true, true>(p, stream);
        return launch_regs<K, S, I, O, GDN__STATE_REGS_SMALL, ONE_TOKEN, FOLD, MIXER, RING>(p, stream);
    }
}

/* The instances of one (K, state, input, output) combination: fold or cache, decode or not. The
 * ring's write-through decode: the cache decode's RING instance, or with the mixer (its conv; the
 * layer kernel's entry point sends no other mixer here) the fold decode's, over the ring's records
 * as its stored tokens and the ring's count as its pending count. */
template <int K, typename S, typename I, typename O, bool MIXER>
static gdn_status launch_strategy(const gdn__layer_params *p, cudaStream_t stream)
{
    if (p->ring) {
        if constexpr (!MIXER) {
            return launch_tokens<K, S, I, O, true, false, false, true>(p, stream);
        } else {
            gdn__layer_params records = *p;
            records.token_store = records.ring;
            records.store_tokens = records.ring_capacity;
            records.pending = records.ring_count;
            return launch_tokens<K, S, I, O, true, true, true, true>(&records, stream);
        }
    }
    if (p->token_store) /* fold; T = 0 is a flush (fold only); a verify of one token runs as a verify, but
                         * in the mixer's one-token instance (which stages) */
        return p->T == 1 && (MIXER || !p->deferred_verify) ? launch_tokens<K, S, I, O, true, true, MIXER>(p, stream)
                         : launch_tokens<K, S, I, O, false, true, MIXER>(p, stream);
    return p->T == 1 ? launch_tokens<K, S, I, O, true, false, MIXER>(p, stream)
                     : launch_tokens<K, S, I, O, false, false, MIXER>(p, stream);
}

#endif /* GDN_CUDA_LAYER_KERNEL_CUH */
