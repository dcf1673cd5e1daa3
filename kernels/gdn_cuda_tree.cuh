/*
 * Token trees (SPEC 3) in the fold strategy's verify, without forming any node's state. With B the
 * rows' state after the folds (the registers, never updated by the tree), P_m the cumulative log
 * decay from B along node m's path, and u_j node j's correction (the ring strategy's form,
 * gdn_cuda_ring.cu), a token t with parent p reads
 *   S_p k^_t = exp(P_p) B k^_t + sum_{j ancestor of t} exp(P_p - P_j) (k^_j . k^_t) u_j
 *   u_t = beta_t (v_t - g_t S_p k^_t),   o_t = g_t S_p q^_t + u_t (k^_t . q^_t)
 * (S_p q^_t the same with k^_j . q^_t), so a node costs one pass over B (two dot products, no
 * update) and O(depth) scalars a row, whatever the tree's shape; nothing is reloaded. A row whose
 * parents form a chain keeps the sequential update, bit-exact with the chain path.
 */
#ifndef GDN_CUDA_TREE_CUH
#define GDN_CUDA_TREE_CUH

#include "cuda_common.cuh"
#include "gdn_cuda_prepare.cuh"
#include "gdn_cuda_rows.cuh"
#include "gdn_cuda_update.cuh"

/* The tree's part of a CTA's shared memory: T own tokens, `rows` state rows. */
struct tree_shared {
    float *uown;   /* [T][rows] corrections u of the CTA's rows (0 for padding tokens) */
    float *c0;     /* [T] exp(P_parent): the coefficient of B k^_t and B q^_t */
    float *ck;     /* [T][T] coefficient of u_j in S_p k^_t (read for ancestors j of t only) */
    float *cq;     /* [T][T] the same in S_p q^_t */
    float *logd;   /* [T] each own token's log decay, then its P */
    uint32_t *ancestors; /* [T] bit j: token j is an ancestor of token t */

    static __host__ __device__ size_t floats(int T, int rows)
    {
        return ((size_t)T * rows + T + 2 * (size_t)T * T + 2 * (size_t)T + 3) / 4 * 4;
    }
    __device__ tree_shared(float *base, int T, int rows)
    {
        uown = base;
        c0 = uown + (size_t)T * rows;
        ck = c0 + T;
        cq = ck + (size_t)T * T;
        logd = cq + (size_t)T * T;
        ancestors = reinterpret_cast<uint32_t *>(logd + T);
    }
};

/* Whether row i's first n tokens form a chain (p = t - 1); NULL parents: always. */
__device__ __forceinline__ bool row_is_chain(const int32_t *parents, int64_t i, int T, int n)
{
    if (!parents) return true;
    for (int t = 0; t < n; t++)
        if (parents[i * T + t] != t - 1) return false;
    return true;
}

/* The coefficients above from the prepared own tokens (own token t: k^ at s.khat row own0 + t, q^
 * at s.qhat row t) and ts.logd (each token's log decay, written before the barrier that precedes
 * this call). The whole CTA calls it; it ends with a barrier. */
template <int K>
__device__ void tree_coefficients(const tree_shared &ts, const shared_tokens &s, const int32_t *row_parents, uint32_t live,
                                  int T, int own0, int lane, int warp, int warps)
{
    if (threadIdx.x == 0) /* parents precede children: one pass in token order */
        for (int t = 0; t < T; t++) {
            const bool is_live = (live >> t) & 1u;
            const int p = is_live ? row_parents[t] : -1;
            ts.ancestors[t] = !is_live || p < 0 ? 0u : ts.ancestors[p] | (1u << p);
            ts.c0[t] = !is_live ? 0.0f : p < 0 ? 1.0f : expf(ts.logd[p]);
            ts.logd[t] = (p < 0 ? 0.0f : ts.logd[p]) + ts.logd[t];
        }
    __syncthreads();
    for (int item = warp; item < T * T; item += warps) {
        const int t = item / T, j = item % T;
        if (!((ts.ancestors[t] >> j) & 1u)) { /* uniform over the warp */
            if (lane == 0) ts.ck[item] = 0.0f, ts.cq[item] = 0.0f;
            continue;
        }
        const float *kj = s.khat + (size_t)(own0 + j) * K;
        const float dk = warp_dot<K>(kj, s.khat + (size_t)(own0 + t) * K, lane);
        const float dq = warp_dot<K>(kj, s.qhat + (size_t)t * K, lane);
        if (lane == 0) {
            const float f = expf(ts.logd[row_parents[t]] - ts.logd[j]);
            ts.ck[item] = f * dk, ts.cq[item] = f * dq;
        }
    }
    __syncthreads();
}

/* Own token t of a tree for the thread's rows: o[rt] from B = decay * st (st unchanged), its
 * corrections into ts.uown (lane 0 of each group; the group's warp syncs before the next token). */
template <typename Geo>
__device__ __forceinline__ void tree_token(const float (&st)[Geo::RT][Geo::NV][Geo::EV], float decay,
                                           const token_values<Geo> &tv, const tree_shared &ts, int t, int T, int rows,
                                           int local_row0, int glane, float (&o)[Geo::RT])
{
    float dk[Geo::RT], dq[Geo::RT];
    row_products<Geo, true>(st, tv, dk, dq);
    const float base = ts.c0[t] * decay;
    const uint32_t ancestors = ts.ancestors[t];
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++) {
        const int local = local_row0 + rt * Geo::G;
        float sk = base * dk[rt], sq = base * dq[rt];
        for (uint32_t rest = ancestors; rest; rest &= rest - 1) { /* the path only: O(depth), not O(t) */
            const int j = __ffs(rest) - 1;
            const float u = ts.uown[(size_t)j * rows + local];
            sk = fmaf(ts.ck[t * T + j], u, sk);
            sq = fmaf(ts.cq[t * T + j], u, sq);
        }
        const float u = tv.beta * (tv.v[rt] - tv.g * sk);
        o[rt] = tv.g * sq + u * tv.kq;
        if (glane == 0) ts.uown[(size_t)t * rows + local] = u;
    }
    __syncwarp();
}

#endif /* GDN_CUDA_TREE_CUH */
