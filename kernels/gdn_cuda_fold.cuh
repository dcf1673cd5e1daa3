/*
 * The fold strategy's bookkeeping in the layer-step kernel (gdn_cuda_layer.cu): what a verify's
 * row leaves for its next kernel (the stored token inputs), written by the row's last CTA.
 */
#ifndef GDN_CUDA_FOLD_CUH
#define GDN_CUDA_FOLD_CUH

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_prepare.cuh"
#include "gdn_cuda_rows.cuh"

/* Fold verify, by the row's last CTA (every fold from the read slot's tokens is done): copies k
 * [HK, K], a [HV] and b [HV] of row i's T tokens into slot w's stored tokens, with all its threads.
 * It runs at the end of the row's last CTA, on the critical path of small grids (B = 1: one 32-thread
 * CTA copies T x 4 KB), so every thread issues a batch of independent loads before its stores: one
 * memory round trip per batch, not one per element (measured: the element-wise copy made a B = 1
 * verify of T = 4 cost ~55 us a layer instead of ~8). */
template <int K, typename I>
__device__ __forceinline__ void store_shared_inputs(const gdn__layer_params &p, int64_t i, int64_t w, int T)
{
    constexpr int BATCH = 4;
    const int64_t gates = p.HV, token = gdn__token_elems(p.HK, p.HV, K, p.V);
    I *store = static_cast<I *>(p.token_store) + w * p.store_tokens * token;
    /* k: 16-byte pieces of each (token, key head) row (K * 2 bytes is a multiple of 16; the input's
     * heads and the stored tokens are 16-byte aligned). */
    constexpr int head_pieces = K * (int)sizeof(I) / 16; /* a power of two */
    const int pieces = p.HK * head_pieces, all = T * pieces; /* small: 32-bit index arithmetic */
    for (int base = threadIdx.x; base < all; base += BATCH * blockDim.x) {
        uint4 piece[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int e = base + u * blockDim.x;
            if (e < all) {
                const int t = e / pieces, within = e - t * pieces;
                piece[u] = __ldg(reinterpret_cast<const uint4 *>(static_cast<const I *>(p.k) +
                                                                 gdn__at(p.k_strides, i, t, within / head_pieces)) +
                                 within % head_pieces);
            }
        }
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int e = base + u * blockDim.x;
            if (e < all) {
                const int t = e / pieces;
                reinterpret_cast<uint4 *>(store + t * token)[e - t * pieces] = piece[u];
            }
        }
    }
    const I *a = static_cast<const I *>(p.a), *b = static_cast<const I *>(p.b);
    const int all_gates = T * (int)gates;
    for (int base = threadIdx.x; base < all_gates; base += BATCH * blockDim.x) {
        I av[BATCH], bv[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int e = base + u * blockDim.x;
            if (e < all_gates) {
                const int t = e / (int)gates, h = e - t * (int)gates;
                av[u] = a[gdn__at(p.a_strides, i, t, h)], bv[u] = b[gdn__at(p.b_strides, i, t, h)];
            }
        }
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            const int64_t e = base + u * blockDim.x;
            if (e >= T * gates) continue;
            I *g = store + (e / gates) * token + gdn__token_gates_offset(p.HK, p.HV, K, p.V);
            g[e % gates] = av[u];
            g[gates + e % gates] = bv[u];
        }
    }
}

/* Fold verify, by the last CTA of row i to read key head kh's stored k (every CTA of the heads that
 * share it): the own tokens' k of that key head and a, b of its value heads become slot w's, from the
 * raw copies the CTA kept in shared memory (shared_tokens::raw_k, raw_gates), so that no CTA waits
 * for a read at its end. The copy is spread over the row's key heads instead of one CTA copying the
 * whole row after every CTA of it (store_shared_inputs), the tail of small grids
 * (bench/results/2026-11-26-h100-fold-verify-keys.md). */
template <int K, typename I>
__device__ __forceinline__ void store_own_keys(const gdn__layer_params &p, const shared_tokens &s, int64_t w, int kh,
                                               int heads_per_key, int T)
{
    const int64_t token = gdn__token_elems(p.HK, p.HV, K, p.V);
    I *store = static_cast<I *>(p.token_store) + w * p.store_tokens * token;
    constexpr int PIECES = K * (int)sizeof(I) / 16; /* 16-byte pieces of a k row */
    for (int e = threadIdx.x; e < T * PIECES; e += blockDim.x) {
        const int t = e / PIECES;
        reinterpret_cast<uint4 *>(store + t * token + (int64_t)kh * K)[e - t * PIECES] = static_cast<const uint4 *>(s.raw_k)[e];
    }
    const I *gates = static_cast<const I *>(s.raw_gates);
    for (int e = threadIdx.x; e < heads_per_key * T; e += blockDim.x) {
        const int head = kh * heads_per_key + e / T, t = e % T;
        I *g = store + t * token + gdn__token_gates_offset(p.HK, p.HV, K, p.V);
        g[head] = gates[e];
        g[p.HV + head] = gates[heads_per_key * T + e];
    }
}

#endif /* GDN_CUDA_FOLD_CUH */
