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
 * Fold strategy (SPEC 3.2; token_store != NULL, cache == NULL): each slot keeps the inputs of its
 * last verify's tokens, and pending[slot] of them are accepted but not yet in its state. For a live
 * row: S = state[r, h]; fold stored tokens 0..pending[r]-1 of slot r into S (the update without
 * outputs); then
 *   deferred_verify == 0 (decode, or a flush when T == 0): run the T tokens, state[w, h] = S;
 *   deferred_verify == 1 (verify): state[w, h] = S (the folded state), run the T tokens from it for the
 *   outputs, and store their inputs as slot w's tokens, once every fold that reads slot r's is done;
 * and once every head of the row has read pending[r] and slot r's tokens: pending[w] = 0. A token's
 * stored inputs (input_dtype) are k [HK, K], v [HV, V], a [HV], b [HV] in that order.
 *
 * Ring strategy (ring != NULL; cache == NULL, token_store == NULL): each slot keeps a checkpoint state
 * (the pool) and ring_count[slot] records (0..ring_capacity), record j holding the raw k [HK, K] of a
 * token (input_dtype), its k's norm scales and log decays (fp32, per value head) and its fp32
 * correction u [HV, V] (gdn__ring_record_bytes; with the mixer's conv raw x and a instead of k and the
 * pairs). The state of slot s is S0 (the pool) with records 0..count-1 applied in order:
 * S = g_j S + u_j k^_j^T (g_j = exp(l_j), k^_j = scale_j k_j). For a live row with
 * h = clamp(ring_count[r], 0, ring_capacity):
 *   T == 0 (a flush, w == r): state[w] = S_h; count[w] = 0 (no write when h == 0).
 *   decode (deferred_verify == 0, T == 1): o from S_h and the token (u = beta (v - g S_h k^)). If w != r
 *     or h + 1 >= ring_length: state[w] = S_{h+1} and count[w] = 0; else record h of slot w = the
 *     token, count[w] = h + 1.
 *   verify (deferred_verify == 1): outputs of the T tokens from S_h. flush = w != r or
 *     h + T > ring_capacity; base = flush ? 0 : h. If flush: state[w] = S_h. Records base..base+T-1
 *     of slot w = the T tokens; count[w] = base (commit then adds the accepted count).
 * Every head of the row reads ring_count[r] and the records it needs before any of them is
 * overwritten or the count changes (the CUDA kernel's last CTA of the row writes what is shared).
 *
 * Commit (one launch for all layers): row i is skipped when r = read_slots[i] < 0 (padding). With
 * w = write_slots[i] (or r when write_slots is NULL) and n = clamp(accepted[i], 0, T) (accepted[i]
 * outside 0..T: *error_flag = 1 too, the commit goes on with n):
 *   r >= num_slots or w >= num_slots: skipped, *error_flag = 1 (the verify treated the row as padding).
 *   n == 0: nothing changes.  n > 0: for every layer l, state_l[w] = cache_l[i, n - 1] (a plain copy
 *   in state_dtype, so bit-exact with the cache). Fold strategy (pending != NULL): pending_l[w] = n
 *   for every layer instead (n == 0 included).
 *
 * Per-row token counts and token trees (SPEC 3): gdn__layer_params.token_counts / .parents and
 * gdn__commit_params.token_counts / .parents / .accepted_nodes say how each of the above runs per
 * node and which path a commit takes; all NULL / 0 is exactly the above.
 */
#ifndef GDN_KERNEL_PARAMS_H
#define GDN_KERNEL_PARAMS_H

#include <stdint.h>

#include "gdn/gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define GDN__HOST_DEVICE __host__ __device__
#else
#define GDN__HOST_DEVICE
#endif

/* Where element (row i, token t, head h, 0) of a per-token tensor lies, in elements from its start:
 * i * row + t * token + h * head (the last dimension contiguous; SPEC 2's strided views). A dense
 * [B, T, H, D] tensor has head = D, token = H * D, row = T * H * D. */
typedef struct gdn__strides {
    int64_t row, token, head;
} gdn__strides;

static inline GDN__HOST_DEVICE int64_t gdn__at(gdn__strides s, int64_t i, int64_t t, int64_t h)
{
    return i * s.row + t * s.token + h * s.head;
}
static inline GDN__HOST_DEVICE gdn__strides gdn__dense(int32_t T, int32_t H, int32_t D)
{
    gdn__strides s;
    s.head = D;
    s.token = (int64_t)H * D;
    s.row = (int64_t)T * H * D;
    return s;
}

/* The whole mixer step (SPEC 6) around the recurrence, per row and token: with conv_width W > 0, the
 * row's raw input x [conv_dim = 2 HK K + HV V] (q | k | v, head-major) goes through the depthwise
 * causal conv over the slot's window of the previous W - 1 inputs (tap W-1 meets x; + bias) and SiLU,
 * giving q, k, v (the q, k, v views are not read); with norm_weight != NULL the output is the gated
 * RMSNorm y = o rsqrt(mean_V(o^2) + eps) norm_weight silu(z) per value head instead of o.
 * The conv state (the window, in input_dtype) follows S through every strategy:
 *   decode: window of w = the last W - 1 of [window of r; x];
 *   cache verify: windows untouched, x of row i's tokens kept in x_store row i; commit advances
 *     window of w from window of r by the first n of them;
 *   fold: stored tokens are raw x, a, b (gdn__mixer_token_elems); folding a pending token runs its
 *     conv from the slot's window and advances it; a verify stores the window after the fold;
 *   ring: the window is the checkpoint's (written only at write-backs, advanced by the records'
 *     x); records hold raw x, a and u (gdn__mixer_record_bytes). */
/* The widest causal conv (SPEC 6: W in 2..4): its W - 1 window rows bound every per-channel buffer. */
#define GDN__MAX_CONV_WIDTH 4

typedef struct gdn__mixer_params {
    int32_t conv_width;          /* W in 2..4; 0: no conv */
    int32_t conv_dim;            /* 2 HK K + HV V */
    const void *x;               /* [B, T, conv_dim] input_dtype; strides: row, token (head unused) */
    gdn__strides x_strides;
    gdn_dtype conv_weight_dtype; /* F32 or BF16 */
    const void *conv_weight;     /* [conv_dim, W] */
    const void *conv_bias;       /* [conv_dim] or NULL */
    void *conv_state;            /* window row j of slot s, channel c at s * slot + j * token + c * channel */
    int64_t conv_slot_stride, conv_token_stride, conv_channel_stride; /* elements */
    void *x_store;               /* cache strategy: [B_cache][store_tokens][conv_dim] input_dtype */
    int32_t x_store_tokens;
    const void *z;               /* [B, T, HV, V] input_dtype, with the norm */
    gdn__strides z_strides;
    const float *norm_weight;    /* [V]; NULL: no norm */
    float norm_eps;
    /* CUDA only (the reference needs neither): uint32 [B][HK + HV], zero between launches and left
     * zero, the fused kernel's arrival counts, key-head groups' (the last CTA to have read a key
     * head's window channels moves them) then value heads' (the last CTA of a head normalises it);
     * and, with the norm, fp32 [B][T][HV][V], o before the norm. */
    uint32_t *arrivals;
    float *norm_scratch;
} gdn__mixer_params;

/* A conv pool's window strides with "both 0" resolved to dense [W - 1][conv_dim]. */
static inline GDN__HOST_DEVICE void gdn__conv_window_strides(int64_t token, int64_t channel, int64_t conv_dim,
                                                             int64_t *token_out, int64_t *channel_out)
{
    const int dense = token == 0 && channel == 0;
    *token_out = dense ? conv_dim : token;
    *channel_out = dense ? 1 : channel;
}

/* A row whose slots cannot be used, treated as padding with the error flag raised: a read or write
 * slot >= num_slots, or a live read slot (>= 0) with a write slot < 0 (nowhere to write). The one
 * test of the reference, the layer, ring and commit kernels. */
static inline GDN__HOST_DEVICE int gdn__row_slots_invalid(int64_t r, int64_t w, int64_t num_slots)
{
    return r >= num_slots || w >= num_slots || (r >= 0 && w < 0);
}

static inline GDN__HOST_DEVICE int gdn__mixer_on(const gdn__mixer_params *m)
{
    return m->conv_width > 0 || m->norm_weight != NULL;
}

typedef struct gdn__layer_params {
    /* Geometry. */
    int32_t B;  /* rows (a padded bucket: padding rows have read_slots[i] < 0) */
    int32_t T;  /* tokens per row, 1..GDN_MAX_TOKENS */
    int32_t HK, HV, K, V;
    float scale;           /* already resolved: never 0 here */
    int32_t use_qk_l2norm;

    /* Inputs, views with the strides beside them (gdn__dense for dense tensors). The CUDA kernels
     * copy q, k (and, for the fold store, v) in 16-byte pieces: their data and strides keep every
     * head 16-byte aligned there. */
    gdn_dtype input_dtype; /* BF16 or F16 for q, k, v, a, b */
    const void *q;         /* [B, T, HK, K] */
    const void *k;         /* [B, T, HK, K] */
    const void *v;         /* [B, T, HV, V] */
    const void *a;         /* [B, T, HV] (D = 1) */
    const void *b;         /* [B, T, HV] (D = 1) */
    gdn__strides q_strides, k_strides, v_strides, a_strides, b_strides;
    const float *A_log;    /* [HV] fp32 */
    const float *dt_bias;  /* [HV] fp32 */

    /* State pool [num_slots, HV, V, K] with slot_stride elements between slots. */
    gdn_dtype state_dtype; /* F32 or BF16 */
    void *state;
    int64_t num_slots;
    int64_t slot_stride;
    const int32_t *read_slots;  /* [B] */
    const int32_t *write_slots; /* [B] or NULL */

    /* Output [B, T, HV, V], a view. */
    gdn_dtype output_dtype; /* BF16 or F32 */
    void *out;
    gdn__strides out_strides;

    /* Verify cache [B_cache, cache_tokens, HV, V, K] in state_dtype, indexed by batch row; NULL for an
     * in-place update. cache_row_stride = cache_tokens * HV * V * K elements. */
    void *cache;
    int64_t cache_row_stride;

    int32_t *error_flag; /* sticky, may be NULL */

    /* CUDA: launch with programmatic dependent launch (cuda_common.cuh, gdn__launch): the kernel
     * reads its slot rows and its layer's pool, counts and records before the preceding kernel on the
     * stream has finished, so that kernel must write none of them (it may write the inputs). */
    int32_t overlap_preceding;
    /* With overlap_preceding: the preceding kernel writes the slot rows, counts and parents (the
     * engine's fetch), so the kernel waits for it before it reads anything. Taken by the decode
     * instances of small grids; the launcher launches any other in stream order instead (measured
     * faster so). */
    int32_t rows_from_preceding;
    /* Set by the launcher: the kernel allows its dependents to launch first thing, not after its
     * wait (cuda_common.cuh says what that keeps safe). */
    int32_t allow_dependents_first;

    /* Fold strategy; token_store == NULL selects the cache strategy (or a plain update). */
    void *token_store;         /* [num_slots][store_tokens][token elements] in input_dtype */
    int32_t store_tokens;      /* tokens a slot keeps (the engine's max_tokens) */
    int32_t *pending;          /* [num_slots] */
    int32_t deferred_verify;
    uint32_t *arrivals;        /* [B] zeroed, left zeroed: the CUDA kernel's per-row count of finished
                                * CTAs, so that the last one does the row's bookkeeping (fold, ring) */
    uint32_t *key_arrivals;    /* CUDA fold: [B][HK] zeroed, left zeroed: per row and key head, the
                                * CTAs that have read slot r's stored k of that head; the last stores
                                * the verify's own k (and the gates of the head group) as slot w's */

    /* Ring strategy; ring == NULL selects another. */
    void *ring;                /* [num_slots][ring_capacity] records of gdn__ring_record_bytes() bytes */
    int32_t ring_capacity;     /* records a slot's ring holds: max(ring_length, max_tokens) */
    int32_t ring_length;       /* L: a decode writes the state back when its ring would hold L records
                                * (1: every decode does; the op layer's ring_write_through steps) */
    int32_t *ring_count;       /* [num_slots] records in each slot's ring (this layer) */
    float *ring_prep;          /* CUDA: [B][HV][gdn__ring_prep_floats(ring_capacity)] scratch of the
                                * two-kernel decode (kernels/gdn_cuda_ring_decode.cu); NULL: one kernel */

    gdn__mixer_params mixer;   /* all zero: the plain recurrence */

    /* Per-row token counts and token trees (SPEC 3), step data like the slots; both NULL: every row
     * runs its T tokens as a chain, and nothing below is read. Row i runs n = token_counts[i] tokens
     * (NULL: T); n outside 1..T makes the row padding and sets *error_flag. Tokens t >= n are padding:
     * zero output, no state effect, no cache entry, stored token or record. With parents != NULL
     * ([B][T], row i at parents + i * T) token t of row i runs from the state after its parent
     * p = parents[i * T + t] (-1: the state the row starts from: the slot's, after a fold or the ring's
     * records) and its output and cache entry t are the state after it; a parent outside -1..t-1 (or a
     * padding parent) makes the token padding, the bad parent setting *error_flag. A decode whose token
     * is padding is a padding row. Fold and ring keep the n tokens' inputs at their node positions;
     * the commit picks the accepted path (gdn__tree_path). */
    const int32_t *token_counts; /* [B] or NULL */
    const int32_t *parents;      /* [B][T] or NULL */
} gdn__layer_params;

/* The step's tensors from views (gdn.h): data and strides (all-zero strides stay zero: dense, resolved
 * by gdn__layer_params_resolved). */
static inline void gdn__layer_params_views(gdn__layer_params *p, const gdn_view *q, const gdn_view *k,
                                           const gdn_view *v, const gdn_view *a, const gdn_view *b, const gdn_view *o)
{
    const gdn_view *views[6] = {q, k, v, a, b, o};
    gdn__strides *strides[6] = {&p->q_strides, &p->k_strides, &p->v_strides, &p->a_strides, &p->b_strides,
                                &p->out_strides};
    for (int n = 0; n < 6; n++) {
        strides[n]->row = views[n]->row_stride;
        strides[n]->token = views[n]->token_stride;
        strides[n]->head = views[n]->head_stride;
    }
    p->q = q->data, p->k = k->data, p->v = v->data, p->a = a->data, p->b = b->data, p->out = o->data;
}

/* A copy of `in` whose all-zero stride sets are dense (the zero value means "dense", so that callers
 * that build dense parameters need not spell the strides out). Host and device. */
static inline GDN__HOST_DEVICE gdn__strides gdn__strides_or_dense(gdn__strides s, int32_t T, int32_t H, int32_t D)
{
    return s.row == 0 && s.token == 0 && s.head == 0 ? gdn__dense(T, H, D) : s;
}
static inline GDN__HOST_DEVICE gdn__layer_params gdn__layer_params_resolved(const gdn__layer_params *in)
{
    gdn__layer_params p = *in;
    p.q_strides = gdn__strides_or_dense(p.q_strides, p.T, p.HK, p.K);
    p.k_strides = gdn__strides_or_dense(p.k_strides, p.T, p.HK, p.K);
    p.v_strides = gdn__strides_or_dense(p.v_strides, p.T, p.HV, p.V);
    p.a_strides = gdn__strides_or_dense(p.a_strides, p.T, p.HV, 1);
    p.b_strides = gdn__strides_or_dense(p.b_strides, p.T, p.HV, 1);
    p.out_strides = gdn__strides_or_dense(p.out_strides, p.T, p.HV, p.V);
    return p;
}

/* One ring record: raw k [HK, K] in the input dtype (2-byte); then for each value head h an fp32 pair
 * {the scale that normalises its key head's k (k^ = scale k), the log decay l = -exp(A_log[h])
 * softplus(a + dt_bias[h])}, written once by the step that appends the record so that no reader
 * forms them again, padded to 16 bytes; then u [HV, V] fp32. Offsets in bytes; every part starts
 * 16-byte aligned. */
static inline GDN__HOST_DEVICE int64_t gdn__ring_norm_decay_offset(int32_t HK, int32_t K) { return (int64_t)HK * K * 2; }
static inline GDN__HOST_DEVICE int64_t gdn__ring_u_offset(int32_t HK, int32_t HV, int32_t K)
{
    return (gdn__ring_norm_decay_offset(HK, K) + (int64_t)HV * 8 + 15) / 16 * 16;
}
static inline GDN__HOST_DEVICE int64_t gdn__ring_record_bytes(int32_t HK, int32_t HV, int32_t K, int32_t V)
{
    return gdn__ring_u_offset(HK, HV, K) + (int64_t)HV * V * 4;
}

/* The CUDA ring decode's per (row, value head) scratch (kernels/gdn_cuda_ring_decode.cu): a header of
 * 16 floats, then three arrays of ring_capacity + 1 coefficients, each rounded up to 16 bytes. */
static inline GDN__HOST_DEVICE int32_t gdn__ring_prep_stride(int32_t capacity) { return (capacity + 1 + 3) / 4 * 4; }
static inline GDN__HOST_DEVICE int32_t gdn__ring_prep_floats(int32_t capacity) { return 16 + 3 * gdn__ring_prep_stride(capacity); }

/* The longest chain the CUDA ring verify's streamed pass takes (kernels/gdn_cuda_ring_decode.cu). */
#define GDN__RING_VERIFY_MAX_TOKENS 8

/* With the mixer's conv: one stored token of the fold strategy is raw x [conv_dim], a, b (2-byte
 * inputs, rounded up to 16 bytes); one ring record is raw x [conv_dim] and a [HV], padded to 16
 * bytes, then u [HV, V] fp32. */
static inline GDN__HOST_DEVICE int64_t gdn__mixer_token_elems(int32_t conv_dim, int32_t HV)
{
    return ((int64_t)conv_dim + 2 * (int64_t)HV + 7) / 8 * 8;
}
static inline GDN__HOST_DEVICE int64_t gdn__mixer_record_a_offset(int32_t conv_dim) { return (int64_t)conv_dim * 2; }
static inline GDN__HOST_DEVICE int64_t gdn__mixer_record_u_offset(int32_t conv_dim, int32_t HV)
{
    return (gdn__mixer_record_a_offset(conv_dim) + (int64_t)HV * 2 + 15) / 16 * 16;
}
static inline GDN__HOST_DEVICE int64_t gdn__mixer_record_bytes(int32_t conv_dim, int32_t HV, int32_t V)
{
    return gdn__mixer_record_u_offset(conv_dim, HV) + (int64_t)HV * V * 4;
}

/* Elements of one stored token (k, v, a, b), rounded up to 16 bytes of 2-byte inputs so that every
 * stored token starts 16-byte aligned (the CUDA kernel copies them with 16-byte cp.async). Host and
 * device. */
static inline GDN__HOST_DEVICE int64_t gdn__token_elems(int32_t HK, int32_t HV, int32_t K, int32_t V)
{
    return ((int64_t)HK * K + (int64_t)HV * V + 2 * (int64_t)HV + 7) / 8 * 8;
}
/* Where a stored token's v [HV, V] and its gates (a [HV], then b [HV]) start, in elements from the
 * token's start (k [HK, K] is first). */
static inline GDN__HOST_DEVICE int64_t gdn__token_v_offset(int32_t HK, int32_t K) { return (int64_t)HK * K; }
static inline GDN__HOST_DEVICE int64_t gdn__token_gates_offset(int32_t HK, int32_t HV, int32_t K, int32_t V)
{
    return gdn__token_v_offset(HK, K) + (int64_t)HV * V;
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
    int32_t overlap_preceding;  /* CUDA: may launch before the preceding kernel ends (it waits before any access) */
    /* Fold strategy: instead of copying from the cache, pending_l[w] = n for every layer (layer l's
     * counts at pending + l * counts_layer_stride); cache is NULL then. */
    int32_t *pending;
    /* Ring strategy: ring_count_l[w] += n for every layer instead (layer l's counts at ring_count +
     * l * counts_layer_stride; the verify left count_l[w] at the records' base); cache and pending
     * are NULL. */
    int32_t *ring_count;
    int64_t counts_layer_stride; /* int32 elements */
    /* Mixer conv under the cache strategy (conv_width > 0, x_store != NULL): for every layer, the
     * window of w becomes the last W - 1 of [window of r; x_store row i tokens 0..n-1] (n > 0). */
    int32_t conv_width, conv_dim;
    gdn_dtype input_dtype;
    void *conv_state;
    int64_t conv_slot_stride, conv_token_stride, conv_channel_stride, conv_layer_stride; /* elements */
    const void *x_store;
    int32_t x_store_tokens;
    int64_t x_store_layer_stride; /* elements */

    /* Per-row token counts and token trees (the verify's arrays, gdn__layer_params; all NULL / 0:
     * today's prefix commit). With accepted_nodes == 0, accepted[i] is a count, clamped to 0..n (n =
     * token_counts[i], or T), and stands for node count - 1; with accepted_nodes != 0 it is the
     * accepted node in -1..n-1 (-1: nothing). The accepted path is the node's ancestors and itself,
     * root first (gdn__tree_path; with parents NULL a chain: 0..node). An n outside 1..T, a node
     * outside -1..n-1 or a bad parent on the path: the row is skipped and *error_flag set.
     *   cache: state_l[w] = cache_l[i, node] (conv: the window advances by the path's x in order);
     *   fold, ring: the path's stored tokens or records are compacted to positions base..base+len-1
     *     (fold: base 0; ring: base = count_l[w], where the verify left it) in path order, then
     *     pending_l[w] = len (fold) or count_l[w] += len (ring). Path node j sits at j or later, so
     *     the copies in path order never overwrite an entry still to be read.
     * entries: layer 0's stored tokens (fold) or records (ring), slot s's entry j at entries + (s *
     * entry_slot_bytes + j * entry_bytes) bytes, layer l entries_layer_bytes further on. */
    const int32_t *token_counts;   /* [B] or NULL */
    const int32_t *parents;        /* [B][T] or NULL */
    int32_t accepted_nodes;
    void *entries;
    int64_t entry_bytes, entry_slot_bytes, entries_layer_bytes;
    int32_t entries_per_slot;      /* store_tokens (fold) or ring_capacity (ring) */
} gdn__commit_params;

/* Row i's T parents in a [B][T] parents array, or NULL for a chain (parents NULL). */
static inline GDN__HOST_DEVICE const int32_t *gdn__row_parents(const int32_t *parents, int64_t i, int32_t T)
{
    return parents ? parents + i * T : NULL;
}

/* The path of `node` in row `parents` (T entries; NULL: a chain), root first, into path[0..len):
 * its length (0 for node -1), or -1 when node is outside -1..n-1 or a parent on the way is outside
 * -1..t-1. Every step moves to a smaller index, so the walk ends within n steps. Host and device. */
static inline GDN__HOST_DEVICE int32_t gdn__tree_path(const int32_t *parents, int32_t n, int32_t node, int32_t *path)
{
    if (node < -1 || node >= n) return -1;
    int32_t len = 0;
    for (int32_t t = node; t >= 0; len++) {
        const int32_t parent = parents ? parents[t] : t - 1;
        if (parent < -1 || parent >= t) return -1;
        path[len] = t;
        t = parent;
    }
    for (int32_t j = 0; j < len / 2; j++) {
        const int32_t x = path[j];
        path[j] = path[len - 1 - j], path[len - 1 - j] = x;
    }
    return len;
}

/* Row i's own tokens under per-row counts and token trees (gdn__layer_params.token_counts / .parents;
 * both NULL: n = T, every token live). n: tokens run (0: the count is outside 1..T, the row is
 * padding); live: bit t set when token t runs (t < n, every parent on its path in -1..t-1); bad: a
 * count or parent was out of range (the caller raises the error flag). parent[t] (when not NULL)
 * receives each checked parent, -1 for a bad one. Host and device. */
typedef struct gdn__row_plan {
    int32_t n;
    uint32_t live;
    int32_t bad;
} gdn__row_plan;

/* A row plan's start: n from row i's count (T without counts); a count outside 1..T makes the row
 * padding (n = 0, bad). The callers then check the tokens' parents unless n is 0. */
static inline GDN__HOST_DEVICE gdn__row_plan gdn__plan_start(const int32_t *token_counts, int32_t T, int64_t i)
{
    gdn__row_plan plan = {T, 0u, 0};
    if (token_counts) {
        const int32_t n = token_counts[i];
        plan.n = n < 1 || n > T ? 0 : n;
        plan.bad = plan.n == 0;
    }
    return plan;
}

static inline GDN__HOST_DEVICE gdn__row_plan gdn__plan_row(const int32_t *token_counts, const int32_t *parents, int32_t T,
                                                           int64_t i, int32_t *parent)
{
    gdn__row_plan plan = gdn__plan_start(token_counts, T, i);
    if (plan.bad) return plan;
    for (int32_t t = 0; t < plan.n && t < GDN_MAX_TOKENS; t++) {
        const int32_t p = parents ? parents[i * T + t] : t - 1;
        const int ok = p >= -1 && p < t;
        if (parent) parent[t] = ok ? p : -1;
        if (!ok) plan.bad = 1;
        else if (p < 0 || ((plan.live >> p) & 1u)) plan.live |= 1u << t;
    }
    return plan;
}

/* The accepted path of a commit row (a live row: its slots checked) from its values: `count` its
 * token count (T without counts), `accepted` its accepted[] entry, `row_parents` its T parents (NULL:
 * a chain). Root first, into path (written only with parents; a chain's path is 0..n-1): its length,
 * or -1 when the row commits nothing because its count, its accepted node or a parent on the way is
 * out of range. *flag becomes 1 whenever a value was out of range (an accepted count is clamped into
 * 0..n and still committed). */
static inline GDN__HOST_DEVICE int32_t gdn__commit_path_of(const gdn__commit_params *p, int32_t count, int32_t accepted,
                                                          const int32_t *row_parents, int32_t *path, int *flag)
{
    int32_t node = accepted;
    if (!p->accepted_nodes) {
        if (node < 0 || node > count) *flag = 1;
        node = (node < 0 ? 0 : (node > count ? count : node)) - 1;
    }
    int32_t n = -1;
    if (count >= 1 && count <= p->T && count <= GDN_MAX_TOKENS)
        n = row_parents ? gdn__tree_path(row_parents, count, node, path) : (node >= -1 && node < count ? node + 1 : -1);
    if (n < 0) *flag = 1;
    return n;
}

/* Commit row i's parents (NULL for chains). */
static inline GDN__HOST_DEVICE const int32_t *gdn__commit_row_parents(const gdn__commit_params *p, int64_t i)
{
    return gdn__row_parents(p->parents, i, p->T);
}

/* The same for commit row i, read from p's arrays. */
static inline GDN__HOST_DEVICE int32_t gdn__commit_path(const gdn__commit_params *p, int64_t i, int32_t *path, int *flag)
{
    return gdn__commit_path_of(p, p->token_counts ? p->token_counts[i] : p->T, p->accepted[i], gdn__commit_row_parents(p, i),
                               path, flag);
}

/* Device-side slot operations (one launch for all layers): first, when set_at != NULL,
 * *set_at = set_value; then for each region r and layer l < layers, the bytes at
 * dst + l * dst_layer_stride become those at src + l * src_layer_stride (zeros when src == NULL).
 * Regions do not overlap. Passed by value: a captured launch refers to no host memory. */
#define GDN__MAX_SLOT_REGIONS 4
typedef struct gdn__slot_region {
    const void *src;
    void *dst;
    int64_t bytes;            /* per layer */
    int64_t src_layer_stride; /* bytes */
    int64_t dst_layer_stride; /* bytes */
} gdn__slot_region;

typedef struct gdn__slot_copy_params {
    int32_t layers;
    int32_t regions;
    gdn__slot_region region[GDN__MAX_SLOT_REGIONS];
    int32_t *set_at;
    int32_t set_value;
} gdn__slot_copy_params;

#ifdef __cplusplus
}
#endif

#endif /* GDN_KERNEL_PARAMS_H */
