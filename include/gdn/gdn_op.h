/*
 * gdn-engine op layer: the GDN layer step and its commit as stateless operations over memory the
 * caller owns: its q, k, v, a, b and output tensors (strided views, SPEC 2), its state pool, its slot
 * arrays in backend memory, and the verify strategy's memory (the "workspace", sized by
 * gdn_op_workspace_bytes). An op allocates nothing, never synchronises, and enqueues only kernels on
 * the given stream, so it is valid inside any CUDA stream capture (the caller's own graphs). The
 * engine (gdn.h) is the managed level above: pools, buckets, slot allocation, graph table.
 *
 * Backends. GDN_BACKEND_CUDA: every pointer is device memory of the current CUDA device and `stream`
 * is a cudaStream_t (NULL: the legacy default stream). GDN_BACKEND_CPU: every pointer is host memory,
 * the float64 reference runs before the call returns, `stream` is ignored. AUTO is refused (an op
 * does not guess where its pointers live).
 *
 * Semantics: SPEC 1 (the math) and 3 (slots, padding, verify and commit under each strategy). Row i
 * reads slot read_slots[i] and writes write_slots[i] (NULL: the same); a negative read slot is a
 * padding row (zero output, no state touched); a slot >= pool.num_slots is treated as padding and
 * sets *error_flag (when not NULL).
 */
#ifndef GDN_GDN_OP_H
#define GDN_GDN_OP_H

#include <stddef.h>
#include <stdint.h>

#include "gdn/gdn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gdn_view (a strided per-token tensor) and gdn_conv_pool (the conv states) are declared in gdn.h. */

/*
 * The whole mixer step (SPEC 6), optional: a depthwise causal conv (width W, SiLU) over the row's
 * raw input x = q | k | v with a per-slot conv state, and a gated RMSNorm of the output. The conv
 * state lives in a gdn_conv_pool (declared in gdn.h: slot s's window of its previous W - 1 inputs,
 * oldest first, in the op's input dtype). It follows the state through every strategy: padding rows
 * touch neither, a decode advances both, a verify neither until its commit, which advances both by
 * the accepted tokens; slot operations cover both.
 */
typedef struct gdn_mixer {
    int32_t conv_width;           /* W in 2..4; 0: no conv (q, k, v are given) */
    gdn_dtype conv_weight_dtype;  /* F32 or BF16 */
    const void *conv_weight;      /* [conv_dim][W], conv_dim = 2 HK K + HV V; tap W-1 meets x */
    const void *conv_bias;        /* [conv_dim] in conv_weight_dtype, or NULL */
    gdn_conv_pool conv;           /* the caller's conv states, pool.num_slots of them */
    const float *norm_weight;     /* [V] fp32; NULL: no norm (the output is o) */
    float norm_eps;               /* 0: 1e-6 */
} gdn_mixer;

/* One layer step. */
typedef struct gdn_op_layer {
    gdn_backend_kind backend; /* CPU or CUDA */
    gdn_model_config model;   /* heads, head dims, scale (0: K^-0.5), l2norm; num_layers is ignored */
    gdn_dtype input_dtype;    /* BF16 or F16: q, k, v, a, b */
    gdn_dtype output_dtype;   /* BF16 or F32 */
    gdn_step_kind kind;       /* DECODE (T = 1) or VERIFY */
    int32_t tokens;           /* T */
    int32_t batch;            /* rows, >= 0 */
    gdn_view q, k, v, a, b;   /* [batch, T, HK, K] x 2, [batch, T, HV, V], [batch, T, HV] x 2 */
    gdn_view o;               /* [batch, T, HV, V] output (y with the mixer's norm) */
    const gdn_mixer *mixer;   /* NULL: the recurrence alone (SPEC 1) */
    gdn_view x;               /* with the conv: [batch, T, conv_dim] raw input (head_stride unused);
                               * q, k, v are then not read and may be NULL */
    gdn_view z;               /* with the norm: [batch, T, HV, V] gate input */
    const float *A_log;       /* [HV] */
    const float *dt_bias;     /* [HV] */
    gdn_state_pool pool;      /* the caller's pool (dtype F32 or BF16; slot_stride >= HV * V * K) */
    const int32_t *read_slots;  /* backend memory [batch] */
    const int32_t *write_slots; /* backend memory [batch], or NULL */
    int32_t *error_flag;        /* backend memory, sticky, or NULL */

    /* The verify strategy and its memory: CACHE (a verify writes every token's state into the
     * workspace, commit copies the accepted one into the pool), FOLD or RING (gdn.h describes
     * both). The workspace is the strategy's memory for this layer, gdn_op_workspace_bytes() bytes,
     * 16-byte aligned (cudaMalloc and malloc give that), zero-filled before first use and then only
     * touched by ops with the same shape fields. */
    gdn_verify_strategy strategy;
    void *workspace;
    int32_t max_batch;   /* the workspace's shape: most rows, most tokens, ring length (0: 16, or 8
                          * with max_tokens 1: gdn.h's GDN_DEFAULT_DECODE_RING_LENGTH) */
    int32_t max_tokens;
    int32_t ring_length;
    /* RING decode steps of at most this many rows (batch) write every row's state back instead of
     * appending a record (gdn.h's ring_write_through: 0 the default, -1 never). Not a shape field. */
    int32_t ring_write_through;

    /* CUDA, compute capability 9.0 and up: nonzero launches the step (and the commit) with
     * programmatic dependent launch: the kernel loads its rows' state before the kernel preceding it
     * on the stream has finished and waits for it only before reading q, k, v, a, b, so that kernel
     * (and any still running when it allows its dependents to launch) must not write read_slots,
     * write_slots, the pool, the workspace or the mixer's conv pool. 0: ordinary stream order. gdn.h's launch_overlap says
     * what the preceding kernel does to benefit. */
    int32_t overlap_preceding;

    /* Per-row token counts and token trees (SPEC 3), step data in backend memory like the slots
     * (both NULL: every row runs its T tokens as a chain, and neither is read; the chain stays the
     * fast path). Read on the device, so a bad value cannot be refused: it is treated as padding and
     * sets *error_flag, never read out of bounds.
     *   token_counts [batch]: row i runs n[i] in 1..T tokens; positions t >= n[i] are padding (zero
     *     output, no state effect, nothing a commit can pick); a commit clamps accepted[i] to n[i].
     *     A count outside 1..T makes the row padding.
     *   parents [batch][T] (row i at parents + i * T): token t of row i runs from the state after
     *     its parent p in -1..t-1 (-1: the slot's state), its output is read from the state after
     *     it; a chain is p = t - 1. A parent outside -1..t-1 makes the token (and its descendants)
     *     padding. Commit such a step with gdn_op_commit_node: the row's state becomes the state
     *     after the accepted node (its path: the node's ancestors and itself).
     * Every strategy runs them: CACHE keeps the state after each node, FOLD and RING keep each
     * node's inputs and their commit moves the accepted path's to the front, in path order, so the
     * fold or the ring folds only the path (its length, not T). Both backends; with a mixer each
     * node's conv follows its path and the window advances along the accepted path. With
     * overlap_preceding the preceding kernel must not write them either (they are read before the
     * wait, with the slots). */
    const int32_t *token_counts;
    const int32_t *parents;
} gdn_op_layer;

/*
 * Bytes of workspace `op` needs (only backend, model, dtypes, pool.dtype, pool.num_slots, strategy,
 * max_batch, max_tokens, ring_length and the mixer's conv width and norm weight (NULL or not) are
 * read: with the conv the stored tokens hold raw x; on CUDA the fused mixer keeps its counts and the
 * norm's o there). 0 for an invalid description (gdn_op_layer_step on it says why).
 */
GDN_API size_t gdn_op_workspace_bytes(const gdn_op_layer *op);

/*
 * Runs the layer step on `stream`: outputs into o; under CACHE a decode writes the pool and a verify
 * the workspace; FOLD and RING as in gdn.h. Returns, changing nothing: GDN_EINVAL (NULL op or a
 * required pointer, AUTO backend, AUTO strategy, a model or dtype outside gdn.h's ranges),
 * GDN_ESTEP_KIND (also a verify with max_tokens 1: such a layer runs decodes only, and under CACHE
 * its workspace holds no verify cache), GDN_ESTEP_TOKENS (decode with T != 1, verify outside 1..max_tokens),
 * GDN_ESTEP_BATCH (batch < 0 or > max_batch), GDN_ENOTSUP (alignment on CUDA; a mixer on CUDA
 * with head_dim_k other than 128), GDN_ENODEV (CUDA in a build without it); GDN_ECUDA when the launch fails. A mixer:
 * GDN_EINVAL for a conv width outside 2..4 (0: none), a NULL conv weight, conv pool, x (with the
 * conv) or z (with the norm), or a window that is not one contiguous block per slot.
 */
GDN_API gdn_status gdn_op_layer_step(const gdn_op_layer *op, void *stream);

/*
 * Commits the verify step that `op` describes (the same fields as its gdn_op_layer_step): row i
 * advances by accepted[i] tokens (backend memory [batch], clamped to 0..T, or to 0..n[i] with
 * token_counts; a count outside that range also sets *error_flag), which stands for node
 * accepted[i] - 1: with parents, the path to that node. Same errors.
 */
GDN_API gdn_status gdn_op_commit(const gdn_op_layer *op, const int32_t *accepted, void *stream);

/*
 * Commits a token-tree verify step (or any verify step) by accepted node: row i's state becomes the
 * state after node accepted_node[i] (backend memory [batch], -1..n[i]-1; -1: nothing accepted, the
 * slot unchanged), that is after the node's path, root first (op->parents; NULL: a chain, where
 * node j is the count j + 1). A node outside -1..n[i]-1 (or a count or a parent on its path that
 * the step treated as padding): the row is left unchanged and *error_flag set. Same errors as
 * gdn_op_commit.
 */
GDN_API gdn_status gdn_op_commit_node(const gdn_op_layer *op, const int32_t *accepted_node, void *stream);

/*
 * Pending work and slots (one layer: the op's pool and workspace; the step fields are not read).
 * All enqueue on `stream` and are capturable; slot numbers are host values baked into the launch.
 *   flush: the pending work of slots[0..count) (backend memory; < 0 skipped; count <= max_batch)
 *     is written into their states in place (fold: accepted tokens folded; ring: records written
 *     back); nothing to do under CACHE.
 *   slot_copy: dst becomes src, pending work included (nothing is folded).
 *   slot_import: the slot's state becomes src (HV * V * K elements of the pool's dtype, backend
 *     memory), pending work dropped; slot_reset: the same with zeros.
 *   slot_export: dst becomes the slot's current state (under fold and ring its pending work is
 *     written back in place first).
 *   With the mixer's conv the window lives in the caller's conv pool: flush and export bring it up
 *     to date in place (read it there after them), copy carries it, reset zeroes it; import leaves
 *     it to the caller (write it there).
 * GDN_ESLOT_RANGE for a slot outside the pool, GDN_EINVAL for NULL buffers, dst == src, or (flush,
 * export under fold and ring) NULL A_log / dt_bias; GDN_ESTEP_BATCH for a count outside
 * 0..max_batch; the description's own codes as gdn_op_layer_step.
 */
GDN_API gdn_status gdn_op_flush(const gdn_op_layer *op, const int32_t *slots, int32_t count, void *stream);
GDN_API gdn_status gdn_op_slot_copy(const gdn_op_layer *op, int32_t dst, int32_t src, void *stream);
GDN_API gdn_status gdn_op_slot_import(const gdn_op_layer *op, int32_t slot, const void *src, void *stream);
GDN_API gdn_status gdn_op_slot_reset(const gdn_op_layer *op, int32_t slot, void *stream);
GDN_API gdn_status gdn_op_slot_export(const gdn_op_layer *op, int32_t slot, void *dst, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* GDN_GDN_OP_H */
