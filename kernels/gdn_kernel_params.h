/*
 * Parameters of the GDN kernel families, shared by the float64 CPU reference (kernels/ref/) and the
 * CUDA kernels (kernels/gdn_cuda_*.cu). Plain C so that both sides and the tests include it. All pointers are
 * in the memory space of the backend that runs the call; all offsets are int64_t.
 *
 * Layer step (one launch per layer): for each batch row i in [0, B) and value head h in [0, HV):
 *   r = read_slots[i], w = write_slots[i] (write_slots == NULL means w = r).
 *   r < 0, or r >= num_slots, or w >= num_slots: padding row. No state read or write, no cache write,
 *   o[i, :, h, :] = 0. A slot >= num_slots additionally sets *error_flag = 1 (if error_flag != NULL).
 *   Otherwise S = state[r, h] (as fp32/fp64), run tokens t = 0..T-1 (SPEC 1), o[i, t, h, :] = S q^.
 *   cache == NULL (decode / plain update): state[w, h] = S after T tokens.
 *   cache != NULL (verify): cache[i, t, h] = S after token t for every t; the pool is not written.
 *
 * Replay strategy (SPEC 3.2; token_store != NULL, cache == NULL): each slot keeps the inputs of its
 * last verify's tokens, and pending[slot] of them are accepted but not yet in its state. For a live
 * row: S = state[r, h]; fold stored tokens 0..pending[r]-1 of slot r into S (the update without
 * outputs); then
 *   replay_verify == 0 (decode, or a flush when T == 0): run the T tokens, state[w, h] = S;
 *   replay_verify == 1 (verify): state[w, h] = S (the folded state), run the T tokens from it for the
 *   outputs, and store their inputs as slot w's tokens, once every fold that reads slot r's is done;
 * and once every head of the row has read pending[r] and slot r's tokens: pending[w] = 0. A token's
 * stored inputs (input_dtype) are k [HK, K], v [HV, V], a [HV], b [HV] in that order.
 *
 * Commit (one launch for all layers): row i is skipped when r = read_slots[i] < 0 (padding). With
 * w = write_slots[i] (or r when write_slots is NULL) and n = clamp(accepted[i], 0, T):
 *   r >= num_slots or w >= num_slots: skipped, *error_flag = 1 (the verify treated the row as padding).
 *   n == 0: nothing changes.  n > 0: for every layer l, state_l[w] = cache_l[i, n - 1] (a plain copy
 *   in state_dtype, so bit-exact with the cache). Replay strategy (pending != NULL): pending_l[w] = n
 *   for every layer instead (n == 0 included).
 */
#ifndef GDN_KERNEL_PARAMS_H
#define GDN_KERNEL_PARAMS_H

#include <stdint.h>

#include "gdn/gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdn__layer_params {
    /* Geometry. */
    int32_t B;  /* rows (a padded bucket: padding rows have read_slots[i] < 0) */
    int32_t T;  /* tokens per row, 1..GDN_MAX_TOKENS */
    int32_t HK, HV, K, V;
    float scale;           /* already resolved: never 0 here */
    int32_t use_qk_l2norm;

    /* Inputs, dense row-major. */
    gdn_dtype input_dtype; /* BF16 or F16 for q, k, v, a, b */
    const void *q;         /* [B, T, HK, K] */
    const void *k;         /* [B, T, HK, K] */
    const void *v;         /* [B, T, HV, V] */
    const void *a;         /* [B, T, HV] */
    const void *b;         /* [B, T, HV] */
    const float *A_log;    /* [HV] fp32 */
    const float *dt_bias;  /* [HV] fp32 */

    /* State pool [num_slots, HV, V, K] with slot_stride elements between slots. */
    gdn_dtype state_dtype; /* F32 or BF16 */
    void *state;
    int64_t num_slots;
    int64_t slot_stride;
    const int32_t *read_slots;  /* [B] */
    const int32_t *write_slots; /* [B] or NULL */

    /* Output [B, T, HV, V]. */
    gdn_dtype output_dtype; /* BF16 or F32 */
    void *out;

    /* Verify cache [B_cache, cache_tokens, HV, V, K] in state_dtype, indexed by batch row; NULL for an
     * in-place update. cache_row_stride = cache_tokens * HV * V * K elements. */
    void *cache;
    int64_t cache_row_stride;

    int32_t *error_flag; /* sticky, may be NULL */

    /* Replay strategy; token_store == NULL selects the cache strategy (or a plain update). */
    void *token_store;         /* [num_slots][store_tokens][token elements] in input_dtype */
    int32_t store_tokens;      /* tokens a slot keeps (the engine's max_tokens) */
    int32_t *pending;          /* [num_slots] */
    int32_t replay_verify;
    uint32_t *arrivals;        /* [B] zeroed, left zeroed: the CUDA kernel's per-row count of finished
                                * CTAs, so that the last one does the row's bookkeeping */
} gdn__layer_params;

/* Elements of one stored token (k, v, a, b), rounded up to 16 bytes of 2-byte inputs so that every
 * stored token starts 16-byte aligned (the CUDA kernel copies them with 16-byte cp.async). Host and
 * device. */
#ifdef __CUDACC__
#define GDN__HOST_DEVICE __host__ __device__
#else
#define GDN__HOST_DEVICE
#endif
static inline GDN__HOST_DEVICE int64_t gdn__token_elems(int32_t HK, int32_t HV, int32_t K, int32_t V)
{
    return ((int64_t)HK * K + (int64_t)HV * V + 2 * (int64_t)HV + 7) / 8 * 8;
}

typedef struct gdn__commit_params {
    int32_t B;          /* rows of the verify step */
    int32_t T;          /* tokens of the verify step */
    int32_t num_layers;
    int32_t HV, K, V;
    gdn_dtype state_dtype;
    void *state;                /* layer 0's pool; layer l at state + l * state_layer_stride */
    int64_t state_layer_stride; /* elements */
    int64_t num_slots;
    int64_t slot_stride;
    const void *cache;          /* layer 0's cache; layer l at cache + l * cache_layer_stride */
    int64_t cache_layer_stride; /* elements */
    int64_t cache_row_stride;   /* elements */
    const int32_t *read_slots;  /* [B] */
    const int32_t *write_slots; /* [B] or NULL */
    const int32_t *accepted;    /* [B] */
    int32_t *error_flag;
    /* Replay strategy: instead of copying from the cache, pending_l[w] = n for every layer (layer l's
     * counts at pending + l * num_slots); cache is NULL then. */
    int32_t *pending;
} gdn__commit_params;

#ifdef __cplusplus
}
#endif

#endif /* GDN_KERNEL_PARAMS_H */
