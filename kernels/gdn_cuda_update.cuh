/*
 * The state update of the layer-step kernel (gdn_cuda_layer.cu): one token applied to the rows a
 * thread holds in fp32 registers (the delta rule, SPEC 1), optionally with the decay kept outside.
 */
#ifndef GDN_CUDA_UPDATE_CUH
#define GDN_CUDA_UPDATE_CUH

#include "cuda_common.cuh"
#include "gdn_cuda.h"
#include "gdn_cuda_rows.cuh"

#include "gdn_cuda_prepare.cuh"

/* Decay outside the rows (DECAY_OUTSIDE: fold with bf16 state, whose token loops are the longest
 * per byte): the thread's rows hold the state divided by `decay`, the product of the gates applied
 * since the rows were loaded (the same for the whole CTA), so a token updates an element with one
 * FMA, S/G += (u/G) k^, instead of a multiply and an FMA. The decay is folded into the rows before it
 * drops below this bound (u/G stays small and finite whatever the gates) and at every store.
 * Measured on the H100 (bench/results/2026-11-22-h100-strategies.md): bf16 replay verify 3-7%
 * faster; fp32 fold no faster (at 80 registers it spills), so fp32 keeps the plain update. */
#define GDN__DECAY_FOLD_BELOW 0.00390625f /* 2^-8 */

/* The thread's part of dk = S.k^ and (OUTPUT) dq = S.q^ for each of its rows: its slice of k^ and q^. */
template <typename Geo, bool OUTPUT>
__device__ __forceinline__ void row_partials(const float (&st)[Geo::RT][Geo::NV][Geo::EV], const float (&k)[Geo::NV][Geo::EV],
                                             const float (&q)[Geo::NV][Geo::EV], float (&dk)[Geo::RT], float (&dq)[Geo::RT])
{
#pragma unroll
    for (int rt = 0; rt < Geo::RT; rt++) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int n = 0; n < Geo::NV; n++)
#pragma unroll
            for (int e = 0; e < Geo::EV; e++) {
                a0 = fmaf(st[rt][n][e], k[n][e], a0);
                if (OUTPUT) a1 = fmaf(st[rt][n][e], q[n][e], a1);
            }
        dk[rt] = a0;
        dq[rt] = a1;
    }
}

/* dk = S.k^ and (OUTPUT) dq = S.q^ over each of the thread's rows, summed over the lane group. */
template <typename Geo, bool OUTPUT>
__device__ __forceinline__ void row_products(const float (&st)[Geo::RT][Geo::NV][Geo::EV], const token_values<Geo> &tv,
                                             float (&dk)[Geo::RT], float (&dq)[Geo::RT])
{
    row_partials<Geo, OUTPUT>(st, tv.k, tv.q, dk, dq);
    row_sums<Geo::L, Geo::RT, OUTPUT>(dk, dq);
}

/* The rows' update by one token, S = g S + u k^ (G = g), or with DECAY_OUTSIDE (G = decay * g)
 * st += (u / G) k^ and decay = G. */
template <typename Geo, bool DECAY_OUTSIDE>
__device__ __forceinline__ void update_rows(float (&st)[Geo::RT][Geo::NV][Geo::EV], float &decay, float G,
                                            const float (&u)[Geo::RT], const float (&k)[Geo::NV][Geo::EV])
{
    constexpr int EV = Geo::EV, NV = Geo::NV, RT = Geo::RT;
    if constexpr (DECAY_OUTSIDE) {
        if (G < GDN__DECAY_FOLD_BELOW) { /* uniform over the CTA */
            scale_rows<Geo>(st, G);
            G = 1.0f;
        }
        const float inverse = __fdividef(1.0f, G); /* G >= 2^-8: no range issue */
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const float step = u[rt] * inverse;
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e++) st[rt][n][e] = fmaf(step, k[n][e], st[rt][n][e]);
        }
        decay = G;
    } else {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int n = 0; n < NV; n++)
#pragma unroll
                for (int e = 0; e < EV; e++) st[rt][n][e] = fmaf(G, st[rt][n][e], u[rt] * k[n][e]);
    }
}

/* One token applied to the thread's rows: dk = S.k^ (and dq = S.q^ when OUTPUT) over each row, one
 * lane-group reduction each, then u = beta (v - g dk), o = g dq + u k^.q^, S = g S + u k^. With
 * DECAY_OUTSIDE (state = decay * st, G = decay * g) the same reads u = beta (v - G dk'),
 * o = G dq' + u k^.q^, st += (u / G) k^, decay = G, where dk', dq' are the products with st. The
 * products come first: they need only the rows and k^ (and q^), not the gate, whose shared-memory
 * read would otherwise hold them back. */
template <typename Geo, bool OUTPUT, bool DECAY_OUTSIDE>
__device__ __forceinline__ void apply_token(float (&st)[Geo::RT][Geo::NV][Geo::EV], float &decay,
                                            const token_values<Geo> &tv, float (&o)[Geo::RT])
{
    constexpr int RT = Geo::RT;
    float dk[RT], dq[RT];
    row_products<Geo, OUTPUT>(st, tv, dk, dq);
    const float G = DECAY_OUTSIDE ? decay * tv.g : tv.g;
    float u[RT];
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
        u[rt] = tv.beta * (tv.v[rt] - G * dk[rt]);
        if (OUTPUT) o[rt] = G * dq[rt] + u[rt] * tv.kq;
    }
    update_rows<Geo, DECAY_OUTSIDE>(st, decay, G, u, tv.k);
}

/* A ring record (its correction u stored when it was appended, in the token's v slot) applied to
 * the thread's rows: S = g S + u k^, no products. */
template <typename Geo, bool DECAY_OUTSIDE>
__device__ __forceinline__ void apply_record(float (&st)[Geo::RT][Geo::NV][Geo::EV], float &decay, const token_values<Geo> &tv)
{
    update_rows<Geo, DECAY_OUTSIDE>(st, decay, DECAY_OUTSIDE ? decay * tv.g : tv.g, tv.v, tv.k);
}

#endif /* GDN_CUDA_UPDATE_CUH */
