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
    float *logd;   /* [T] each own token's log decay */
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

/* Lanes that share one pair of tokens' dot products in the coefficient pass (a short reduction). */
#define GDN__PAIR_LANES 8

/* The coefficients above from the prepared own tokens (own token t: k^ at s.khat row own0 + t, q^
 * at s.qhat row t) and ts.logd (each own token's log decay, written before the barrier that precedes
 * this call). Each own token's path (thread t) and each pair j < t with j on t's path (a group of
 * GDN__PAIR_LANES lanes) are independent, so the pass has no serial part. The whole CTA calls it; it
 * ends with a barrier. */
template <int K>
__device__ void tree_coefficients(const tree_shared &ts, const shared_tokens &s, const int32_t *row_parents, uint32_t live,
                                  int T, int own0, int lane, int warp, int warps)
{
    if ((int)threadIdx.x < T) {
        const int t = threadIdx.x;
        const bool is_live = (live >> t) & 1u;
        uint32_t ancestors = 0;
        float path = 0.0f; /* P of t's parent */
        if (is_live)
            for (int a = row_parents[t]; a >= 0; a = row_parents[a]) { /* parents precede children: live, checked */
                ancestors |= 1u << a;
                path += ts.logd[a];
            }
        ts.ancestors[t] = ancestors;
        ts.c0[t] = is_live ? expf(path) : 0.0f;
    }
    constexpr int PL = GDN__PAIR_LANES, GROUPS = 32 / PL;
    const int pairs = T * (T - 1) / 2, pl = lane % PL;
    for (int m0 = warp * GROUPS; m0 < pairs; m0 += warps * GROUPS) {
        const int m = min(m0 + lane / PL, pairs - 1); /* pair m = (t, j): t (t - 1) / 2 + j, j < t */
        int t = 1;
        while ((t + 1) * t / 2 <= m) t++;
        const int j = m - t * (t - 1) / 2;
        bool on_path = m0 + lane / PL < pairs && ((live >> t) & 1u);
        float log_factor = 0.0f; /* P_p - P_j: the log decays after j up to the parent */
        if (on_path) {
            int a = row_parents[t];
            for (; a > j; a = row_parents[a]) log_factor += ts.logd[a];
            on_path = a == j;
        }
        if (!__any_sync(0xffffffffu, on_path)) continue; /* uniform over the warp: the sums below shuffle */
        const float *kj = s.khat + (size_t)(own0 + j) * K, *kt = s.khat + (size_t)(own0 + t) * K, *qt = s.qhat + (size_t)t * K;
        float dk = 0.0f, dq = 0.0f;
#pragma unroll 1 /* few registers: the state rows are already held */
        for (int e = 0; e < K / (4 * PL); e++) {
            const int at = (e * PL + pl) * 4;
            const float4 x = *reinterpret_cast<const float4 *>(kj + at), y = *reinterpret_cast<const float4 *>(kt + at),
                         z = *reinterpret_cast<const float4 *>(qt + at);
            dk = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, dk))));
            dq = fmaf(x.x, z.x, fmaf(x.y, z.y, fmaf(x.z, z.z, fmaf(x.w, z.w, dq))));
        }
        dk = group_sum<PL>(dk);
        dq = group_sum<PL>(dq);
        if (on_path && pl == 0) {
            const float f = expf(log_factor);
            ts.ck[t * T + j] = f * dk, ts.cq[t * T + j] = f * dq;
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
    if constexpr (Geo::RT > 1) {
        /* Ancestor by ancestor, its coefficients and shared addresses formed once for all of the
         * thread's rows (each row's sums keep the order below). With one row a thread both orders
         * are the same work, and the small instances keep the form below. */
        float sk[Geo::RT], sq[Geo::RT];
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) sk[rt] = base * dk[rt], sq[rt] = base * dq[rt];
        for (uint32_t rest = ancestors; rest; rest &= rest - 1) {
            const int j = __ffs(rest) - 1;
            const float cj = ts.ck[t * T + j], qj = ts.cq[t * T + j];
            const float *uj = ts.uown + (size_t)j * rows + local_row0;
#pragma unroll
            for (int rt = 0; rt < Geo::RT; rt++) {
                sk[rt] = fmaf(cj, uj[rt * Geo::G], sk[rt]);
                sq[rt] = fmaf(qj, uj[rt * Geo::G], sq[rt]);
            }
        }
#pragma unroll
        for (int rt = 0; rt < Geo::RT; rt++) {
            const float u = tv.beta * (tv.v[rt] - tv.g * sk[rt]);
            o[rt] = tv.g * sq[rt] + u * tv.kq;
            if (glane == 0) ts.uown[(size_t)t * rows + local_row0 + rt * Geo::G] = u;
        }
    } else {
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
    }
    __syncwarp();
}

#endif /* GDN_CUDA_TREE_CUH */
