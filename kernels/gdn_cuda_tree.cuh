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

    static __host__ __device__ size_t parts_floats(int T, int rows)
    {
        return ((size_t)T * rows + T + 2 * (size_t)T * T + 2 * (size_t)T + 3) / 4 * 4;
    }
    /* With the tensor-core form's two [T][T] matrices (tree_path_matrix): in uown where it has room
     * (rows >= 2 T), else past the parts. */
    static __host__ __device__ size_t floats(int T, int rows)
    {
        return parts_floats(T, rows) + (rows >= 2 * T ? 0 : 2 * (size_t)T * T);
    }
    __device__ float *matrices(int T, int rows) const { return rows >= 2 * T ? uown : uown + parts_floats(T, rows); }
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

/* k^_j.k^_t and k^_j.q^_t over a group of PL lanes (pl: the lane's place in it), every lane of the
 * group getting both sums. */
template <int K, int PL>
__device__ __forceinline__ void pair_dots(const float *kj, const float *kt, const float *qt, int pl, float &dk, float &dq)
{
    dk = 0.0f, dq = 0.0f;
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
}

/* sum + coef[j] u_j over the ancestors j of a token, lowest first (u_j: token j's correction of
 * row `local`, in ts.uown): every form's order, so that they agree. */
__device__ __forceinline__ float ancestor_sum(uint32_t ancestors, const float *coef, const float *uown, int rows, int local,
                                             float sum)
{
    for (uint32_t rest = ancestors; rest; rest &= rest - 1) {
        const int j = __ffs(rest) - 1;
        sum = fmaf(coef[j], uown[(size_t)j * rows + local], sum);
    }
    return sum;
}

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
        float dk, dq;
        pair_dots<K, PL>(kj, kt, qt, pl, dk, dq);
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


/* ---------------------------------------------------------------------------------------------- */
/* The big instances' tree form (a thread holds several rows): the same math, laid out so that no   */
/* part of a node's work is repeated by every lane of a row group                                  */
/* ---------------------------------------------------------------------------------------------- */

/* gdn__plan_row for row i, with the row's T parents read at once (every load in flight, not one round
 * trip a token), and whether its first n tokens form a chain (row_is_chain). The same plan; the big
 * fp32 instances' (plan_row_by_lanes, below, measured 2-3% slower there on 16-token chains, which do
 * not run it: a code-generation effect, not understood). */
__device__ __forceinline__ gdn__row_plan plan_row_at_once(const int32_t *token_counts, const int32_t *parents, int T, int64_t i,
                                                          bool &chain)
{
    int32_t parent[GDN_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < GDN_MAX_TOKENS; t++) parent[t] = parents && t < T ? parents[i * T + t] : t - 1;
    gdn__row_plan plan = gdn__plan_start(token_counts, T, i);
    chain = true;
    if (plan.bad) return plan;
#pragma unroll
    for (int t = 0; t < GDN_MAX_TOKENS; t++) {
        if (t >= plan.n) break;
        const int32_t up = parent[t];
        chain = chain && up == t - 1;
        if (up < -1 || up >= t) plan.bad = 1;
        else if (up < 0 || ((plan.live >> up) & 1u)) plan.live |= 1u << t;
    }
    return plan;
}

/* The same for the big bf16 instances, computed by a warp's lanes (lane t: token t; every lane of
 * the warp calls it and gets the same plan). The parents are read at once, one a lane, and a token's
 * path is checked by pointer jumping: after round r a lane has checked the 2^r nearest tokens on its
 * path and points at the next, so GDN_MAX_TOKENS paths take log2(GDN_MAX_TOKENS) rounds, not a pass
 * over the tokens. (The small instances keep gdn__plan_row: there the lanes' values took up to 9
 * more registers, with small spills, in code that small grids depend on.) */
__device__ __forceinline__ gdn__row_plan plan_row_by_lanes(const int32_t *token_counts, const int32_t *parents, int T, int64_t i,
                                                           int lane, bool &chain)
{
    static_assert(GDN_MAX_TOKENS <= 32, "a token a lane");
    const int32_t up = parents && lane < T ? parents[i * T + lane] : lane - 1;
    gdn__row_plan plan = gdn__plan_start(token_counts, T, i);
    chain = true;
    if (plan.bad) return plan;
    const bool runs = lane < plan.n, ok = up >= -1 && up < lane;
    plan.bad = __any_sync(0xffffffffu, runs && !ok) ? 1 : 0;
    chain = __all_sync(0xffffffffu, !runs || up == lane - 1);
    bool good = runs && ok; /* so far: every token checked on the path is in range */
    int next = good ? up : -1; /* the next token on the path to check (-1: the root is passed) */
#pragma unroll
    for (int reach = 1; reach < GDN_MAX_TOKENS; reach *= 2) {
        const int from = next >= 0 ? next : 0;
        const bool next_good = __shfl_sync(0xffffffffu, good, from);
        const int next_next = __shfl_sync(0xffffffffu, next, from);
        if (next >= 0) good = good && next_good, next = next_next;
    }
    plan.live = __ballot_sync(0xffffffffu, good);
    return plan;
}

/* tree_coefficients for the big instances: only the pairs (t, j) with j an ancestor of t get a dot
 * product (a tree of depth d has at most d T of them, not T (T - 1) / 2). Warp 0 walks every own
 * token's path at once (lane t: token t; the parents through shuffles), writes each pair's decay
 * factor into ck and the pair into a list (kept in ts.uown, unused until the node loop), then the
 * CTA's lane groups take the listed pairs. The sums keep tree_coefficients' order. Ends with a barrier. */
template <int K>
__device__ void tree_coefficients_listed(const tree_shared &ts, const shared_tokens &s, const int32_t *row_parents,
                                         uint32_t live, int T, int own0, int lane, int warp, int warps)
{
    __shared__ int pair_count;
    int *pairs = reinterpret_cast<int *>(ts.uown); /* (t << 8) | j */
    if (warp == 0) {
        const int t = lane;
        const bool is_live = t < T && ((live >> t) & 1u);
        const int up = is_live ? row_parents[t] : -1; /* live: every parent on the path checked */
        uint32_t ancestors = 0;
        float path = 0.0f; /* P of the parent: the log decays from a (the walk's position) up to t's parent */
        int a = up;
        while (__any_sync(0xffffffffu, a >= 0)) {
            const int next = __shfl_sync(0xffffffffu, up, a >= 0 ? a : 0);
            if (a >= 0) {
                ts.ck[t * T + a] = expf(path); /* the pair's factor exp(P_p - P_a), before a's own decay */
                ancestors |= 1u << a;
                path += ts.logd[a];
                a = next;
            }
        }
        if (t < T) {
            ts.ancestors[t] = ancestors;
            ts.c0[t] = is_live ? expf(path) : 0.0f;
        }
        const int count = __popc(ancestors);
        int first = count; /* inclusive scan over the lanes, then exclusive */
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, first, off);
            if (lane >= off) first += x;
        }
        if (lane == 31) pair_count = first;
        first -= count;
        for (uint32_t rest = ancestors; rest; rest &= rest - 1) pairs[first++] = (t << 8) | (__ffs(rest) - 1);
    }
    __syncthreads();
    constexpr int PL = GDN__PAIR_LANES, GROUPS = 32 / PL;
    const int total = pair_count, pl = lane % PL;
    for (int m0 = warp * GROUPS; m0 < total; m0 += warps * GROUPS) { /* uniform over the warp: the sums shuffle */
        const int m = min(m0 + lane / PL, total - 1);
        const int pair = pairs[m], t = pair >> 8, j = pair & 0xff;
        const float *kj = s.khat + (size_t)(own0 + j) * K, *kt = s.khat + (size_t)(own0 + t) * K, *qt = s.qhat + (size_t)t * K;
        float dk, dq;
        pair_dots<K, PL>(kj, kt, qt, pl, dk, dq);
        if (m0 + lane / PL < total && pl == 0) {
            const float f = ts.ck[t * T + j];
            ts.ck[t * T + j] = f * dk, ts.cq[t * T + j] = f * dq;
        }
    }
    __syncthreads();
}

/* Reduce-scatter over a row group's L lanes: x[0..M) are a lane's partial sums; afterwards x[0..MV)
 * (MV = max(M / L, 1)) hold whole sums, of indices [base, base + MV) (scatter_base). Levels that
 * would split fewer than two values sum instead (every lane of a pair then holds the same sums). */
template <int OFF, int MREM, int M> __device__ __forceinline__ void scatter_sums(float (&x)[M], int glane)
{
    if constexpr (OFF > 0) {
        if constexpr (MREM > 1) {
            constexpr int HALF = MREM / 2;
            const bool upper = (glane & OFF) != 0;
#pragma unroll
            for (int k = 0; k < HALF; k++) {
                const float send = upper ? x[k] : x[k + HALF], keep = upper ? x[k + HALF] : x[k];
                x[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
            }
            scatter_sums<OFF / 2, HALF, M>(x, glane);
        } else {
            x[0] += __shfl_xor_sync(0xffffffffu, x[0], OFF);
            scatter_sums<OFF / 2, 1, M>(x, glane);
        }
    }
}
template <int L, int M> __device__ __forceinline__ int scatter_base(int glane)
{
    int base = 0, m = M;
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1)
        if (m > 1) {
            m /= 2;
            if (glane & off) base += m;
        }
    return base;
}

/* A row set's own tokens of a tree, for the big instances: o of every live token from B = decay * st,
 * stored to out, and each token's corrections into ts.uown. Each lane group's partial products for
 * its RT rows (S.k^ and S.q^ of each) are reduce-scattered so that each lane ends with one kind of
 * product for its own rows: lanes with the k products form u (row by row along the path), their
 * partners (lane ^ L / 2) with the q products form o, so a node's scalar work is not repeated by
 * the group's lanes. Each row's ancestor sums keep tree_token's order. */
template <int K, typename O, typename Geo>
__device__ __forceinline__ void tree_set_scattered(const float (&st)[Geo::RT][Geo::NV][Geo::EV], float decay, const shared_tokens &s,
                                                   const tree_shared &ts, uint32_t live, int own0, int T, int rows,
                                                   int set_local_row0, int set_row0, int glane, O *out, int64_t out_base,
                                                   int64_t out_token_stride)
{
    constexpr int RT = Geo::RT, NV = Geo::NV, EV = Geo::EV, L = Geo::L, G = Geo::G, M = 2 * RT;
    constexpr int MV = M > L ? M / L : 1;
    const int base = scatter_base<L, M>(glane);
    const bool q_kind = base >= RT; /* this lane's products: S.q^ (o), else S.k^ (u) */
    const int rt0 = q_kind ? base - RT : base;
    const bool writer = M >= L || (glane & (L / M - 1)) == 0; /* the first of lanes holding the same sums */
    for (int t = 0; t < T; t++) {
        if (!((live >> t) & 1u)) { /* padding token: zero output and correction */
            if (writer)
#pragma unroll
                for (int v = 0; v < MV; v++) {
                    const int rt = rt0 + v;
                    if (q_kind) out[out_base + t * out_token_stride + set_row0 + rt * G] = gdn__from_f32<O>(0.0f);
                    else ts.uown[(size_t)t * rows + set_local_row0 + rt * G] = 0.0f;
                }
            __syncwarp();
            continue;
        }
        float k[NV][EV], q[NV][EV], pk[RT], pq[RT], x[M];
        load_slice<Geo>(s.khat + (size_t)(own0 + t) * K, k, glane);
        load_slice<Geo>(s.qhat + (size_t)t * K, q, glane);
        row_partials<Geo, true>(st, k, q, pk, pq);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) x[rt] = pk[rt], x[RT + rt] = pq[rt];
        scatter_sums<L / 2, M, M>(x, glane);
        const float base_coef = ts.c0[t] * decay, g = s.gate[own0 + t], beta = s.beta[own0 + t], kq = s.kq[t];
        const uint32_t ancestors = ts.ancestors[t];
        const float *coef = (q_kind ? ts.cq : ts.ck) + t * T;
#pragma unroll
        for (int v = 0; v < MV; v++) {
            const int local = set_local_row0 + (rt0 + v) * G;
            const float sum = ancestor_sum(ancestors, coef, ts.uown, rows, local, base_coef * x[v]);
            const float u = beta * (s.v[(size_t)(own0 + t) * rows + local] - g * sum); /* the k lanes' */
            const float u_k = __shfl_xor_sync(0xffffffffu, u, L / 2);                  /* the q lanes' partner's */
            if (writer) {
                if (q_kind) out[out_base + t * out_token_stride + set_row0 + (rt0 + v) * G] = gdn__from_f32<O>(g * sum + u_k * kq);
                else ts.uown[(size_t)t * rows + local] = u;
            }
        }
        __syncwarp(); /* the corrections, read by both lanes of each row at the next tokens */
    }
}


/* The two tensor-core forms below (K = 128: a row group is two quads, each lane 16 elements of a row).
 * The rows' registers once packed into fragments: dead from here (the next set loads its own), but
 * the compiler cannot tell across the set loop; without this their registers stay held and the
 * instances spill. */
template <typename Geo> __device__ __forceinline__ void release_rows(float (&st)[Geo::RT][Geo::NV][Geo::EV])
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++)
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) st[rt][n][e] = 0.0f;
}
/* Chunk c (4 elements) of nodes tq (top) and tq + 8 (bottom): the elements that quad lane q of the
 * quads holding half hf of a row holds, in its registers' order; zero for nodes past T. */
template <typename Geo>
__device__ __forceinline__ void node_chunk(const float *top, const float *bottom, bool top_live, bool bottom_live, int hf, int q, int c,
                                           float4 &x_top, float4 &x_bottom)
{
    const int n = 4 * c / Geo::EV, e0 = 4 * c % Geo::EV;
    const int at = n * Geo::L * Geo::EV + (hf * 4 + q) * Geo::EV + e0;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    x_top = top_live ? *reinterpret_cast<const float4 *>(top + at) : zero;
    x_bottom = bottom_live ? *reinterpret_cast<const float4 *>(bottom + at) : zero;
}

/* With fp32 state (tree_set_mma_split, PRESPLIT): each pair of the own nodes' k^ and q^ values
 * becomes its bf16 hi and lo words (gdn__split_bf16x2) in place, once a CTA instead of once a warp
 * and row set. Call after the pair dots' barrier. Ends with a barrier. */
template <int K> __device__ __forceinline__ void nodes_to_bf16_pairs(float *k_own, float *qhat, int T)
{
    const int chunks = T * K / 4; /* a region's, of 4 values */
#pragma unroll 1
    for (int c = threadIdx.x; c < 2 * chunks; c += blockDim.x) {
        float4 *at = reinterpret_cast<float4 *>(c < chunks ? k_own : qhat) + c % chunks;
        const float4 x = *at;
        uint4 w;
        gdn__split_bf16x2(x.x, x.y, w.x, w.y);
        gdn__split_bf16x2(x.z, x.w, w.z, w.w);
        *reinterpret_cast<uint4 *>(at) = w;
    }
    __syncthreads();
}

/* For the tensor-core form below (own tokens T <= 16): with N[t][j] = beta_t g_t ck[t][j] and
 * P[t][j] = g_t cq[t][j] for j an ancestor of t, P[t][t] = kq_t, the corrections are
 * U = (I + N)^-1 R, R_t = beta_t (v_t - g_t c0_t B k^_t), and the outputs O = g c0 B q^ + P U, so
 * M = P (I + N)^-1 turns a set's corrections and outputs into one product M R. Entry [t][m] of
 * (I + N)^-1 and of M needs only the entries [j][m] of t's ancestors j, so the entries are formed
 * in rounds by t's depth, every warp for its own columns m (a lane's columns two at a time, over
 * one walk of t's ancestors; the rounds sync the warp only), each sum over t's ancestors in index
 * order. M is stored [T][T] at ts.matrices (uown is unused once the pairs are formed), (I + N)^-1
 * after it (in registers it would spill the rows, live here); padding tokens' rows and columns are
 * zero. Ends with a barrier. */
__device__ __forceinline__ void tree_path_matrix(const tree_shared &ts, const shared_tokens &s, uint32_t live, int T, int own0,
                                                 int rows, int lane, int warp, int warps)
{
    float *const product = ts.matrices(T, rows), *const inverse = product + T * T; /* M, (I + N)^-1: [t][m] */
    const int t = lane % 16, half = lane / 16;
    const bool has_row = t < T;
    const uint32_t ancestors = has_row ? ts.ancestors[t] : 0u;
    const int depth = __popc(ancestors), deepest = __reduce_max_sync(0xffffffffu, has_row ? depth : 0);
    const bool is_live = has_row && ((live >> t) & 1u);
    const float g = is_live ? s.gate[own0 + t] : 0.0f, beta_g = is_live ? s.beta[own0 + t] * g : 0.0f;
    const float kq = is_live ? s.kq[t] : 0.0f;
    for (int round = 0; round <= deepest; round++) {
        if (has_row && depth == round)
            for (int m0 = warp + half * warps; m0 < T; m0 += 4 * warps) { /* two columns at once: m0 and m1 */
                const int m1 = m0 + 2 * warps;
                const bool on0 = is_live && (m0 == t || ((ancestors >> m0) & 1u)); /* else m is not on t's path: zero */
                const bool on1 = is_live && m1 < T && (m1 == t || ((ancestors >> m1) & 1u));
                float acc0 = m0 == t ? 1.0f : 0.0f, acc1 = m1 == t ? 1.0f : 0.0f, sum0 = 0.0f, sum1 = 0.0f;
                if (on0 || on1) {
                    for (uint32_t rest = ancestors; rest; rest &= rest - 1) {
                        const int j = __ffs(rest) - 1;
                        const float n = -beta_g * ts.ck[t * T + j], c = ts.cq[t * T + j];
                        const float w0 = inverse[j * T + m0], w1 = m1 < T ? inverse[j * T + m1] : 0.0f;
                        acc0 = fmaf(n, w0, acc0);
                        sum0 = fmaf(c, w0, sum0);
                        acc1 = fmaf(n, w1, acc1);
                        sum1 = fmaf(c, w1, sum1);
                    }
                }
                inverse[t * T + m0] = on0 ? acc0 : 0.0f;
                product[t * T + m0] = on0 ? fmaf(g, sum0, kq * acc0) : 0.0f;
                if (m1 < T) {
                    inverse[t * T + m1] = on1 ? acc1 : 0.0f;
                    product[t * T + m1] = on1 ? fmaf(g, sum1, kq * acc1) : 0.0f;
                }
            }
        __syncwarp();
    }
    __syncthreads();
}

/* A row set's own tokens of a tree for the big bf16 instances with K = 128 (a row group is two quads),
 * on the tensor cores. The warp's 16 rows (rounded to bf16, as their store rounds them) times all
 * T <= 16 nodes' k^ and q^ are m16n8k16 bf16 MMAs with the rows as A: m-rows 0-7 are the 8 quads'
 * halves of rows rt, 8-15 of rt + 1, each quad's k values its own elements of K in a permuted order
 * that the nodes' B values follow. A pass takes one half of K, so each quad keeps the pass of the half
 * it holds; the two quads of a row group then reduce-scatter, each keeping two of the four rts, so
 * that its lanes hold products of rows along m and nodes along n: the A layout of the next MMA, in
 * which R (the corrections' right-hand side) times M^T (tree_path_matrix), as bf16 hi + lo pairs,
 * added to g c0 B q^, gives the outputs. (With fp32 state the fixed cost of M, a serial pass and a
 * barrier, outweighs its 8 rows a warp: tree_set_mma_split.) NT node tiles of 8: a tree of up to 8 nodes
 * takes one, so that no MMA or load runs for nodes that are not there. */
template <int K, typename O, typename Geo, int NT>
__device__ __forceinline__ void tree_set_mma(float (&st)[Geo::RT][Geo::NV][Geo::EV], float decay, const shared_tokens &s,
                                             const tree_shared &ts, uint32_t live, int own0, int T, int rows, int warp_local_row0,
                                             int warp_row0, int lane, O *out, int64_t out_base, int64_t out_token_stride)
{
    constexpr int RT = Geo::RT, EV = Geo::EV, L = Geo::L, G = Geo::G, CH = Geo::NV * Geo::EV / 4, KEPT = RT / 2;
    static_assert(L == 8 && G == 4 && RT == 4 && EV % 4 == 0, "two quads a row group, two rt pairs");
    const int q = lane & 3, tq = lane >> 2, group = lane >> 3, half = tq & 1;
    uint32_t sa[RT][CH][2]; /* the rows as A fragment words: k 2q.. and 2q + 8.. of chunk c */
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int n = 4 * c / EV, e0 = 4 * c % EV;
            sa[rt][c][0] = gdn__pack_word<__nv_bfloat16>(&st[rt][n][e0]);
            sa[rt][c][1] = gdn__pack_word<__nv_bfloat16>(&st[rt][n][e0 + 2]);
        }
    release_rows<Geo>(st);
    const bool top_live = tq < T, bottom_live = NT > 1 && tq + 8 < T;
    /* The rows times all nodes' k^ (q_side false) or q^: x[nt][2 kr + b] of the warp's row
     * (KEPT half + kr) G + group and node 8 nt + 2 q + b. */
    const auto products = [&](bool q_side, float (&x)[2][2 * KEPT]) {
        float d[KEPT][2][4]; /* [rt pair][node tile][c]: the pass of this quad's half */
        const float *base = q_side ? s.qhat : s.khat + (size_t)own0 * K;
        const float *top = base + (size_t)tq * K, *bottom = base + (size_t)(tq + 8) * K;
#pragma unroll 1 /* one pass's loads in flight at a time */
        for (int hf = 0; hf < 2; hf++) { /* the nodes' elements that the quads holding half hf hold */
            float acc[KEPT][2][4];
#pragma unroll
            for (int pr = 0; pr < KEPT; pr++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[pr][nt][c] = 0.0f;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                float4 x0, x1;
                node_chunk<Geo>(top, bottom, top_live, bottom_live, hf, q, c, x0, x1);
                const uint32_t b[2][2] = {/* [node tile][k half] */
                                          {gdn__pack_word<__nv_bfloat16>(&x0.x), gdn__pack_word<__nv_bfloat16>(&x0.z)},
                                          {gdn__pack_word<__nv_bfloat16>(&x1.x), gdn__pack_word<__nv_bfloat16>(&x1.z)}};
#pragma unroll
                for (int pr = 0; pr < KEPT; pr++) {
                    const int ra = 2 * pr, rb = 2 * pr + 1;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        gdn__mma_bf16_m16n8k16(acc[pr][nt], sa[ra][c][0], sa[rb][c][0], sa[ra][c][1], sa[rb][c][1], b[nt][0], b[nt][1]);
                }
            }
#pragma unroll
            for (int pr = 0; pr < KEPT; pr++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) d[pr][nt][c] = hf == half ? acc[pr][nt][c] : d[pr][nt][c];
        }
        /* The row group's other quad holds the other half of K: half h keeps rt pair h. */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float keep = half ? d[1][nt][c] : d[0][nt][c], send = half ? d[0][nt][c] : d[1][nt][c];
                x[nt][c] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
            }
    };
    bool runs[2][2]; /* [node tile][b]: whether node 8 nt + 2 q + b runs */
    float coef[2][2]; /* g c0 decay: of B k^ in R, of B q^ in O */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int t = 8 * nt + 2 * q + b;
            runs[nt][b] = t < T && ((live >> t) & 1u);
            coef[nt][b] = runs[nt][b] ? ts.c0[t] * decay * s.gate[own0 + t] : 0.0f;
        }
    uint32_t r_hi[4] = {}, r_lo[4] = {}; /* R as the A fragment a0..a3 */
    {
        float xk[2][2 * KEPT];
        products(false, xk);
        float r[2][2 * KEPT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int kr = 0; kr < KEPT; kr++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const int t = 8 * nt + 2 * q + b, local = warp_local_row0 + (KEPT * half + kr) * G + group;
                    r[nt][2 * kr + b] =
                        runs[nt][b] ? s.beta[own0 + t] * (s.v[(size_t)(own0 + t) * rows + local] - coef[nt][b] * xk[nt][2 * kr + b]) : 0.0f;
                }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) /* a0 (a2): kept row 0, nodes 2q.. (2q + 8..); a1 (a3): kept row 1 */
#pragma unroll
            for (int kr = 0; kr < KEPT; kr++)
                gdn__split_bf16x2(r[nt][2 * kr], r[nt][2 * kr + 1], r_hi[2 * nt + kr], r_lo[2 * nt + kr]);
    }
    float o[2][4];
    {
        float xq[2][2 * KEPT];
        products(true, xq);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) /* (padding nodes: any k^, q^) */
                o[nt][c] = runs[nt][c & 1] ? coef[nt][c & 1] * xq[nt][c] : 0.0f;
    }
    const float *product = ts.matrices(T, rows);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) { /* o[nt] += R^T M^T for outputs 8 nt + 2 q + c % 2 */
        const int t = 8 * nt + tq; /* the B fragment's column: output t, k = node */
        float m[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 2 * q + (e & 1) + 8 * (e >> 1);
            m[e] = t < T && j < T ? product[t * T + j] : 0.0f;
        }
        uint32_t m_hi[2], m_lo[2];
        gdn__split_bf16x2(m[0], m[1], m_hi[0], m_lo[0]);
        gdn__split_bf16x2(m[2], m[3], m_hi[1], m_lo[1]);
        gdn__mma_bf16_m16n8k16(o[nt], r_lo[0], r_lo[1], r_lo[2], r_lo[3], m_hi[0], m_hi[1]);
        gdn__mma_bf16_m16n8k16(o[nt], r_hi[0], r_hi[1], r_hi[2], r_hi[3], m_lo[0], m_lo[1]);
        gdn__mma_bf16_m16n8k16(o[nt], r_hi[0], r_hi[1], r_hi[2], r_hi[3], m_hi[0], m_hi[1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int kr = 0; kr < KEPT; kr++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int t = 8 * nt + 2 * q + b;
                if (t < T) out[out_base + t * out_token_stride + warp_row0 + (KEPT * half + kr) * G + group] = gdn__from_f32<O>(o[nt][2 * kr + b]);
            }
}

/* A row set's own tokens of a tree for the big fp32 instances with K = 128 (a row group is two quads),
 * with the products on the tensor cores: the warp's 8 rows times all T <= 16 nodes' k^ and q^ as
 * m16n8k16 bf16 MMAs (A: 16 nodes; B: the rows, one column a quad, so a row's two halves of K are two
 * columns), each operand a bf16 pair hi + lo, three MMAs a product (hi hi + lo hi + hi lo; the lo lo
 * term dropped): about 16 bits of each. A quad's B values are its own elements of K in a permuted
 * order, which its A values follow; the two quads of a group hold different elements, so each pass
 * takes one half's columns and the halves are summed after. Each lane then holds nodes tq and tq + 8
 * of its quad position's row in each rt, and forms their corrections depth by depth (a node's
 * ancestors are shallower; nodes of one depth in parallel), then their outputs. PRESPLIT: the nodes'
 * hi and lo words were formed once for the CTA (nodes_to_bf16_pairs; the DIRECT_SETS instance, whose
 * registers have room for it: in the staged one it spilled). */
template <int K, typename O, typename Geo, bool PRESPLIT>
__device__ __forceinline__ void tree_set_mma_split(float (&st)[Geo::RT][Geo::NV][Geo::EV], float decay, const shared_tokens &s,
                                                   const tree_shared &ts, uint32_t live, int own0, int T, int rows, int warp_local_row0,
                                                   int warp_row0, int lane, O *out, int64_t out_base, int64_t out_token_stride)
{
    constexpr int RT = Geo::RT, EV = Geo::EV, L = Geo::L, G = Geo::G, CH = Geo::NV * Geo::EV / 4;
    static_assert(L == 8 && G == 4 && EV % 4 == 0, "two quads a row group");
    const int q = lane & 3, tq = lane >> 2;
    uint32_t sb[RT][CH][2], sl[RT][CH][2]; /* the rows as B fragments: hi, lo */
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int n = 4 * c / EV, e0 = 4 * c % EV;
            gdn__split_bf16x2(st[rt][n][e0], st[rt][n][e0 + 1], sb[rt][c][0], sl[rt][c][0]);
            gdn__split_bf16x2(st[rt][n][e0 + 2], st[rt][n][e0 + 3], sb[rt][c][1], sl[rt][c][1]);
        }
    release_rows<Geo>(st);
    const bool top_live = tq < T, bottom_live = tq + 8 < T;
    /* The rows times all nodes' k^ (q_side false) or q^: d[rt][node tq, tq + 8] of the warp's row rt G + q. */
    const auto products = [&](bool q_side, float (&d)[RT][2]) {
#pragma unroll
        for (int rt = 0; rt < RT; rt++) d[rt][0] = d[rt][1] = 0.0f;
        const float *base = q_side ? s.qhat : s.khat + (size_t)own0 * K;
        const float *top = base + (size_t)tq * K, *bottom = base + (size_t)(tq + 8) * K;
#pragma unroll 1 /* one pass's loads in flight at a time */
        for (int hf = 0; hf < 2; hf++) { /* the columns of the quads holding half hf of their rows */
            float acc[RT][4];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[rt][c] = 0.0f;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                float4 x, y;
                node_chunk<Geo>(top, bottom, top_live, bottom_live, hf, q, c, x, y);
                uint32_t a0, a1, a2, a3, l0, l1, l2, l3;
                if constexpr (PRESPLIT) { /* the words themselves (nodes_to_bf16_pairs) */
                    a0 = __float_as_uint(x.x), l0 = __float_as_uint(x.y), a1 = __float_as_uint(y.x), l1 = __float_as_uint(y.y);
                    a2 = __float_as_uint(x.z), l2 = __float_as_uint(x.w), a3 = __float_as_uint(y.z), l3 = __float_as_uint(y.w);
                } else {
                    gdn__split_bf16x2(x.x, x.y, a0, l0), gdn__split_bf16x2(y.x, y.y, a1, l1);
                    gdn__split_bf16x2(x.z, x.w, a2, l2), gdn__split_bf16x2(y.z, y.w, a3, l3);
                }
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    gdn__mma_bf16_m16n8k16(acc[rt], a0, a1, a2, a3, sl[rt][c][0], sl[rt][c][1]);
                    gdn__mma_bf16_m16n8k16(acc[rt], l0, l1, l2, l3, sb[rt][c][0], sb[rt][c][1]);
                    gdn__mma_bf16_m16n8k16(acc[rt], a0, a1, a2, a3, sb[rt][c][0], sb[rt][c][1]);
                }
            }
#pragma unroll
            for (int rt = 0; rt < RT; rt++) { /* this pass's valid columns: 2 q + hf */
                d[rt][0] += hf ? acc[rt][1] : acc[rt][0];
                d[rt][1] += hf ? acc[rt][3] : acc[rt][2];
            }
        }
    };
    int depth[2];
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
        const int t = tq + 8 * sl;
        depth[sl] = t < T && ((live >> t) & 1u) ? __popc(ts.ancestors[t]) : -1;
    }
    const int deepest = __reduce_max_sync(0xffffffffu, max(depth[0], depth[1]));
    {
        float dk[RT][2];
        products(false, dk);
        for (int level = 0; level <= deepest; level++) {
#pragma unroll
            for (int sl = 0; sl < 2; sl++) {
                if (depth[sl] != level) continue;
                const int t = tq + 8 * sl;
                const float base_coef = ts.c0[t] * decay, g = s.gate[own0 + t], beta = s.beta[own0 + t];
                const uint32_t ancestors = ts.ancestors[t];
                const float *coef = ts.ck + t * T;
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    const int local = warp_local_row0 + rt * G + q;
                    const float sum = ancestor_sum(ancestors, coef, ts.uown, rows, local, base_coef * dk[rt][sl]);
                    ts.uown[(size_t)t * rows + local] = beta * (s.v[(size_t)(own0 + t) * rows + local] - g * sum);
                }
            }
            __syncwarp();
        }
    }
    float dq[RT][2];
    products(true, dq);
#pragma unroll
    for (int sl = 0; sl < 2; sl++) {
        const int t = tq + 8 * sl;
        if (t >= T) continue;
        const bool is_live = (live >> t) & 1u; /* padding tokens: zero output (their corrections are never read) */
        const float base_coef = is_live ? ts.c0[t] * decay : 0.0f, g = s.gate[own0 + t], kq = s.kq[t];
        const uint32_t ancestors = is_live ? ts.ancestors[t] : 0u;
        const float *coef = ts.cq + t * T;
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const int local = warp_local_row0 + rt * G + q;
            float o = 0.0f;
            if (is_live) {
                const float sum = ancestor_sum(ancestors, coef, ts.uown, rows, local, base_coef * dq[rt][sl]);
                o = g * sum + ts.uown[(size_t)t * rows + local] * kq;
            }
            out[out_base + t * out_token_stride + warp_row0 + rt * G + q] = gdn__from_f32<O>(o);
        }
    }
    __syncwarp(); /* every lane's reads of the corrections before the next set's writes */
}


#endif /* GDN_CUDA_TREE_CUH */
