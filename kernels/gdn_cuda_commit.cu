/*
 * Commit of a verify step (SPEC 3.1), every layer in one launch: for each batch row i whose accepted
 * path (gdn__commit_path: accepted[i] a count clamped to 0..n, or with accepted_nodes a node; with
 * parents the node's ancestors and itself) is not empty, state_l[w] = cache_l[i, last node of the
 * path] for every layer l, a plain copy in the state dtype (bit-exact with the cache). accepted[] and the slot lists are read on the device, so
 * the launch can sit in a CUDA graph right after the sampler: no host sync, no allocation.
 *
 * Launch geometry: blockIdx.z = layer, blockIdx.y = batch row, blockIdx.x = chunk of the slot's bytes.
 * Each thread copies CHUNK_VECS 16-byte vectors, all loads issued before the stores. Rows that commit
 * nothing (padding, n == 0, a slot out of range) exit after reading three integers. When a pointer or
 * stride is not 16-byte aligned the same kernel runs with 4-byte (fp32) or 2-byte (bf16) elements.
 *
 * Fold strategy (p->pending != NULL): no state copy, only pending_l[w] = n (the path's length) for
 * every layer (one CTA per (row, layer)); the next kernel that touches the slot folds the tokens.
 * Ring strategy (p->ring_count != NULL): ring_count_l[w] += n (the verify left the count at its
 * records' base). With a tree both first move the path's stored tokens or records to the front.
 *
 * The mixer's conv under the cache strategy (conv_width > 0): a second kernel moves each committed
 * row's window in every layer, one thread a channel: the last W - 1 of [window of r; the verify's
 * stored x of the accepted path (tokens 0..n-1 of a chain)], copied as 2-byte values (bit-exact).
 */
#include "cuda_common.cuh"
#include "gdn_cuda.h"

/* A commit row's slots, token count and accepted entry, read together: one round trip after the
 * wait, not one for each of them in turn. */
struct commit_row_ids {
    int64_t r, w;
    int32_t count, accepted;
};
__device__ __forceinline__ commit_row_ids read_commit_ids(const gdn__commit_params &p, int64_t i)
{
    const int64_t r = p.read_slots[i];
    return {r, p.write_slots ? (int64_t)p.write_slots[i] : r, p.token_counts ? p.token_counts[i] : p.T, p.accepted[i]};
}

#define GDN__COMMIT_THREADS 256
#define GDN__COMMIT_VECS 4 /* vectors per thread */

/* Copies `count` units of type U per (layer, row); U is int4 (16 bytes), unsigned or unsigned short. */
template <typename U>
__global__ void __launch_bounds__(GDN__COMMIT_THREADS) commit_kernel(const gdn__commit_params p, int64_t count)
{
    if (p.overlap_preceding) gdn__wait_preceding(); /* the step's last layer, and the sampler's accepted counts */
    gdn__allow_dependents();
    const int64_t i = blockIdx.y;
    const int64_t l = blockIdx.z;
    const commit_row_ids row = read_commit_ids(p, i);
    const int64_t r = row.r, w = row.w;
    if (r < 0) return;
    if (gdn__row_slots_invalid(r, w, p.num_slots)) {
        if (p.error_flag && blockIdx.x == 0 && l == 0 && threadIdx.x == 0) *p.error_flag = 1;
        return;
    }
    int32_t path[GDN_MAX_TOKENS];
    int flag = 0;
    const int32_t n = gdn__commit_path_of(&p, row.count, row.accepted, gdn__commit_row_parents(&p, i), path, &flag);
    if (flag && p.error_flag && blockIdx.x == 0 && l == 0 && threadIdx.x == 0) *p.error_flag = 1;
    if (n <= 0) return;
    const int32_t node = p.parents ? path[n - 1] : n - 1;

    /* Element offsets (in state elements) converted to units of U. */
    const int64_t elem = p.state_dtype == GDN_DTYPE_F32 ? 4 : 2;
    const int64_t slot_elems = (int64_t)p.HV * p.V * p.K;
    const int64_t src_off = l * p.cache_layer_stride + i * p.cache_row_stride + (int64_t)node * slot_elems;
    const int64_t dst_off = l * p.state_layer_stride + w * p.slot_stride;
    const U *src = reinterpret_cast<const U *>(static_cast<const char *>(p.cache) + src_off * elem);
    U *dst = reinterpret_cast<U *>(static_cast<char *>(p.state) + dst_off * elem);

    const int64_t base = (int64_t)blockIdx.x * GDN__COMMIT_THREADS * GDN__COMMIT_VECS + threadIdx.x;
    U buf[GDN__COMMIT_VECS];
#pragma unroll
    for (int j = 0; j < GDN__COMMIT_VECS; j++) {
        const int64_t idx = base + (int64_t)j * GDN__COMMIT_THREADS;
        if (idx < count) buf[j] = __ldcs(src + idx);
    }
#pragma unroll
    for (int j = 0; j < GDN__COMMIT_VECS; j++) {
        const int64_t idx = base + (int64_t)j * GDN__COMMIT_THREADS;
        if (idx < count) dst[idx] = buf[j];
    }
}

template <typename U> static gdn_status launch(const gdn__commit_params *p, int64_t slot_bytes, cudaStream_t stream)
{
    const int64_t count = slot_bytes / (int64_t)sizeof(U);
    const int64_t per_cta = (int64_t)GDN__COMMIT_THREADS * GDN__COMMIT_VECS;
    const int64_t chunks = (count + per_cta - 1) / per_cta;
    if (chunks > INT32_MAX) return GDN_ENOTSUP;
    const dim3 grid((unsigned)chunks, (unsigned)p->B, (unsigned)p->num_layers);
    GDN__CUDA_TRY(gdn__launch(commit_kernel<U>, grid, dim3(GDN__COMMIT_THREADS), 0, stream, p->overlap_preceding != 0, *p,
                              count));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

/* Fold, ring: one CTA per (row, layer). With a tree the accepted path's entries move to the front
 * first (gdn_kernel_params.h): entry j of the path (root first, so path[j] >= j) goes from position
 * path[j] to j. The entries that move are a suffix (once path[j] > j, every later one is too). They
 * move in rounds of GDN__COMMIT_MOVE_VECS units a thread, each round's loads all issued before a
 * barrier and its stores after it: a round reads only positions past every earlier round's
 * destinations, and a source that a later round overwrites was read before that round's barrier.
 * So a round costs one round trip (a loop of a load and its store costs one a unit: the compiler
 * cannot move a load past a store that may alias it). Without a tree only thread 0 works (the
 * count), so those launches take one warp. U: the copy unit. */
#define GDN__COMMIT_MOVE_THREADS 256
#define GDN__COMMIT_MOVE_VECS 8
template <typename U> __global__ void __launch_bounds__(GDN__COMMIT_MOVE_THREADS) commit_pending_kernel(const gdn__commit_params p)
{
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    const int64_t i = blockIdx.x, l = blockIdx.y;
    const commit_row_ids row = read_commit_ids(p, i);
    int32_t parents[GDN_MAX_TOKENS]; /* with a tree: the row's parents, read beside the rest */
    if (p.parents)
#pragma unroll
        for (int t = 0; t < GDN_MAX_TOKENS; t++)
            if (t < p.T) parents[t] = p.parents[i * p.T + t];
    const int64_t r = row.r, w = row.w;
    if (r < 0) return;
    const bool reports = l == 0 && threadIdx.x == 0;
    if (gdn__row_slots_invalid(r, w, p.num_slots)) {
        if (p.error_flag && reports) *p.error_flag = 1;
        return;
    }
    int32_t path[GDN_MAX_TOKENS];
    int flag = 0;
    const int32_t n = gdn__commit_path_of(&p, row.count, row.accepted, p.parents ? parents : nullptr, path, &flag);
    if (flag && p.error_flag && reports) *p.error_flag = 1;
    if (n < 0) return;
    int32_t *count = (p.ring_count ? p.ring_count : p.pending) + l * p.counts_layer_stride + w;
    if (p.parents && n > 0) {
        const int32_t base = p.ring_count ? *count : 0; /* every thread reads it before thread 0 moves it */
        if (base < 0 || base > p.entries_per_slot - 1 - path[n - 1]) { /* a corrupted count: this layer stays */
            if (p.error_flag && threadIdx.x == 0) *p.error_flag = 1;
            return;
        }
        char *slot = static_cast<char *>(p.entries) + l * p.entries_layer_bytes + w * p.entry_slot_bytes;
        const int64_t units = p.entry_bytes / (int64_t)sizeof(U);
        int32_t first = n; /* the first entry that moves */
        for (int32_t j = n - 1; j >= 0 && path[j] != j; j--) first = j;
        const int64_t moved = (int64_t)(n - first) * units;
        U *const entries = reinterpret_cast<U *>(slot + base * p.entry_bytes); /* entry j: entries + j * units */
        for (int64_t round = 0; round < moved; round += (int64_t)GDN__COMMIT_MOVE_VECS * blockDim.x) { /* uniform */
            U buf[GDN__COMMIT_MOVE_VECS];
#pragma unroll
            for (int u = 0; u < GDN__COMMIT_MOVE_VECS; u++) {
                const int64_t e = round + (int64_t)u * blockDim.x + threadIdx.x;
                if (e < moved) {
                    const int32_t j = first + (int32_t)(e / units);
                    buf[u] = entries[path[j] * units + e % units];
                }
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < GDN__COMMIT_MOVE_VECS; u++) {
                const int64_t e = round + (int64_t)u * blockDim.x + threadIdx.x;
                if (e < moved) entries[first * units + e] = buf[u];
            }
        }
        __syncthreads(); /* every thread has read the base before thread 0 moves it */
    }
    if (threadIdx.x == 0) *count = p.ring_count ? *count + n : n;
}

static gdn_status commit_counts(const gdn__commit_params *p, cudaStream_t stream)
{
    if (!p->read_slots || !p->accepted) return GDN_EINVAL;
    if (p->parents && (!p->entries || p->entry_bytes < 1 || p->entries_per_slot < 1)) return GDN_EINVAL;
    const dim3 grid((unsigned)p->B, (unsigned)p->num_layers);
    /* Every entry address is a sum of these: their common alignment picks the copy unit. */
    const auto aligned = [&](int64_t a) {
        return gdn__aligned(p->entries, a) && p->entry_bytes % a == 0 && p->entry_slot_bytes % a == 0 &&
               p->entries_layer_bytes % a == 0;
    };
    const bool wide = !p->parents || aligned(16);
    auto kernel = wide ? commit_pending_kernel<int4> : aligned(4) ? commit_pending_kernel<unsigned> : commit_pending_kernel<unsigned char>;
    const dim3 threads(p->parents ? GDN__COMMIT_MOVE_THREADS : 32);
    GDN__CUDA_TRY(gdn__launch(kernel, grid, threads, 0, stream, p->overlap_preceding != 0, *p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

#define GDN__WINDOW_THREADS 128

__global__ void __launch_bounds__(GDN__WINDOW_THREADS) commit_windows_kernel(const gdn__commit_params p)
{
    if (p.overlap_preceding) gdn__wait_preceding();
    gdn__allow_dependents();
    const int64_t i = blockIdx.y, l = blockIdx.z;
    const commit_row_ids row = read_commit_ids(p, i);
    const int64_t r = row.r, w = row.w;
    if (r < 0) return;
    if (gdn__row_slots_invalid(r, w, p.num_slots)) return; /* flagged by the state's commit */
    int flag = 0; /* raised by the state's commit */
    int32_t path[GDN_MAX_TOKENS];
    const int32_t n = gdn__commit_path_of(&p, row.count, row.accepted, gdn__commit_row_parents(&p, i), path, &flag);
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n <= 0 || c >= p.conv_dim) return;
    const int rows = p.conv_width - 1;
    unsigned short *state = static_cast<unsigned short *>(p.conv_state) + l * p.conv_layer_stride + c * p.conv_channel_stride;
    const unsigned short *x = static_cast<const unsigned short *>(p.x_store) + l * p.x_store_layer_stride +
                              i * p.x_store_tokens * (int64_t)p.conv_dim + c;
    unsigned short seq[GDN__MAX_CONV_WIDTH - 1];
    /* position rows + t of [window; path's x] is x of token path[t] (a chain: t); the last `rows`
     * positions start at n */
#pragma unroll
    for (int j = 0; j < GDN__MAX_CONV_WIDTH - 1; j++) {
        if (j >= rows) break;
        const int at = n + j;
        seq[j] = at < rows ? state[r * p.conv_slot_stride + at * p.conv_token_stride]
                           : x[(int64_t)(p.parents ? path[at - rows] : at - rows) * p.conv_dim];
    }
#pragma unroll
    for (int j = 0; j < GDN__MAX_CONV_WIDTH - 1; j++) {
        if (j >= rows) break;
        state[w * p.conv_slot_stride + j * p.conv_token_stride] = seq[j];
    }
}

static gdn_status commit_windows(const gdn__commit_params *in, cudaStream_t stream)
{
    gdn__commit_params p = *in;
    gdn__conv_window_strides(in->conv_token_stride, in->conv_channel_stride, in->conv_dim, &p.conv_token_stride,
                             &p.conv_channel_stride);
    const dim3 grid((unsigned)((p.conv_dim + GDN__WINDOW_THREADS - 1) / GDN__WINDOW_THREADS), (unsigned)p.B,
                    (unsigned)p.num_layers);
    GDN__CUDA_TRY(gdn__launch(commit_windows_kernel, grid, dim3(GDN__WINDOW_THREADS), 0, stream, p.overlap_preceding != 0, p));
    GDN__CUDA_TRY(gdn__cuda_launch_error());
    return GDN_OK;
}

extern "C" gdn_status gdn__cuda_commit(const gdn__commit_params *p, void *stream)
{
    if (!p) return GDN_EINVAL;
    if (p->state_dtype != GDN_DTYPE_F32 && p->state_dtype != GDN_DTYPE_BF16) return GDN_ENOTSUP;
    const bool windows = p->conv_width > 0 && !p->pending && !p->ring_count; /* fold: the next kernel moves them */
    if (windows && (p->conv_width < 2 || p->conv_width > GDN__MAX_CONV_WIDTH)) return GDN_ENOTSUP;
    if (windows && (!p->conv_state || !p->x_store || p->conv_dim < 1)) return GDN_EINVAL;
    if (p->B < 0 || p->B > 65535 || p->num_layers < 0 || p->num_layers > 65535) return GDN_ENOTSUP;
    if (p->T < 1 || p->T > GDN_MAX_TOKENS || p->HV < 1 || p->K < 1 || p->V < 1) return GDN_EINVAL;
    if (p->B == 0 || p->num_layers == 0) return GDN_OK;
    if (p->pending || p->ring_count) return commit_counts(p, static_cast<cudaStream_t>(stream)); /* fold, ring */
    if (!p->state || !p->cache || !p->read_slots || !p->accepted) return GDN_EINVAL;
    const int64_t elem = p->state_dtype == GDN_DTYPE_F32 ? 4 : 2;
    const int64_t slot_elems = (int64_t)p->HV * p->V * p->K;
    const int64_t slot_bytes = slot_elems * elem;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    /* Every address the kernel forms is a sum of these, so their common alignment picks the unit. */
    const bool v16 = gdn__aligned(p->state, 16) && gdn__aligned(p->cache, 16) && slot_bytes % 16 == 0 &&
                     (p->state_layer_stride * elem) % 16 == 0 && (p->slot_stride * elem) % 16 == 0 &&
                     (p->cache_layer_stride * elem) % 16 == 0 && (p->cache_row_stride * elem) % 16 == 0;
    const gdn_status copied = v16 ? launch<int4>(p, slot_bytes, s)
                              : elem == 4 ? launch<unsigned>(p, slot_bytes, s)
                                          : launch<unsigned short>(p, slot_bytes, s);
    return copied == GDN_OK && windows ? commit_windows(p, s) : copied;
}
