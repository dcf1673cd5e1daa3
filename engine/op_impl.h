/*
 * The op layer's one parameter builder, shared by the public ops (engine/op.c, one layer) and the
 * engine (engine/engine.c, a stack of layers): every kernel parameter block that touches a pool or a
 * strategy's workspace is built here. A stack is num_layers layers of one shape whose pools and
 * workspaces sit at fixed strides, so that a commit or a slot operation covers every layer in one
 * launch.
 */
#ifndef GDN_ENGINE_OP_IMPL_H
#define GDN_ENGINE_OP_IMPL_H

#include "gdn/gdn_op.h"
#include "kernels/gdn_kernel_params.h"

/* A layer's workspace, in bytes from its start; every part 256-byte aligned. */
typedef struct gdn__op_layout {
    int64_t cache;            /* CACHE: [max_batch][max_tokens][HV V K] in the pool's dtype */
    int64_t cache_row_stride; /* elements */
    int64_t x_store;          /* CACHE with the mixer's conv: [max_batch][max_tokens][conv_dim] input_dtype */
    int64_t token_store;      /* FOLD: [num_slots][max_tokens][token elems] in input_dtype */
    int64_t ring;             /* RING: [num_slots][capacity] records */
    int32_t ring_capacity;
    int32_t ring_length;
    int64_t counts;           /* FOLD pending / RING record counts: int32 [num_slots] */
    int64_t arrivals;         /* FOLD, RING: uint32 [max_batch], zero between steps */
    int64_t flush_row;        /* FOLD, RING: int32, the row of a single-slot write-back */
    int64_t key_arrivals;     /* FOLD on CUDA: uint32 [max_batch][HK], zero between steps */
    int64_t ring_prep;        /* RING on CUDA: the decode's scratch, fp32 [max_batch][HV][gdn__ring_prep_floats] */
    int64_t side_bytes;       /* FOLD, RING: one slot's stored tokens or records */
    int64_t mixer_arrivals;   /* CUDA with a mixer: uint32 [max_batch][HK + HV], zero between steps */
    int64_t norm_scratch;     /* CUDA with the mixer's norm: fp32 [max_batch][max_tokens][HV][V] */
    int64_t scratch;          /* CPU ops: the reference's scratch (0 bytes when left out) */
    int64_t bytes;
} gdn__op_layout;

/* Layer l's pool at op.pool.data + l * pool_layer_stride elements and its workspace at op.workspace
 * + l * workspace_layer_bytes; op describes layer 0 (its A_log, dt_bias and tensors are not read). */
typedef struct gdn__op_stack {
    gdn_op_layer op;
    gdn__op_layout layout;
    int32_t num_layers;
    int64_t pool_layer_stride;     /* elements */
    int64_t workspace_layer_bytes; /* a multiple of 256 */
    int64_t conv_layer_stride;     /* elements between layers' conv-state pools (the mixer's conv) */
} gdn__op_stack;

/* Whether the CUDA backend's fused mixer kernels run this key head size (K = 128, every strategy);
 * the op layer and gdn_engine_create refuse a CUDA mixer otherwise (GDN_ENOTSUP). */
int gdn__cuda_mixer_runs(int32_t head_dim_k);

/* The checks every op makes of its description (same codes as gdn_engine_create). */
gdn_status gdn__op_check_description(const gdn_op_layer *op);

/* The workspace layout of a valid description; with_scratch: room for the CPU reference's scratch
 * (the public CPU ops run on it; the engine's CPU backend has its own). */
gdn__op_layout gdn__op_layout_of(const gdn_op_layer *op, int with_scratch);

/* Layer l of the stack as a one-layer description (pool and workspace moved to layer l). */
gdn_op_layer gdn__op_stack_layer(const gdn__op_stack *s, int32_t l);

/* A step of the description's shape (kind, tokens, batch, tensors, slots) for its one layer. */
gdn__layer_params gdn__op_step_params(const gdn_op_layer *op, const gdn__op_layout *layout);

/* A zero-token step of `count` rows read from `rows`: their pending tokens or records written into
 * their states in place (fold, ring). */
gdn__layer_params gdn__op_write_back_params(const gdn_op_layer *op, const gdn__op_layout *layout,
                                            const int32_t *rows, int32_t count);

/* The commit of the verify step the stack's op describes (batch rows, tokens, read and write
 * slots), every layer of the stack. */
gdn__commit_params gdn__op_commit_params(const gdn__op_stack *s, const int32_t *accepted);

/* Fold, ring: the slot's pending count in layer 0, and the int32 elements between layers. */
int32_t *gdn__op_slot_count(const gdn__op_stack *s, int32_t slot);
int64_t gdn__op_counts_layer_stride(const gdn__op_stack *s);
int gdn__op_keeps_work(const gdn_op_layer *op);

/* Slot operations over every layer of the stack, as one launch each:
 *   copy: dst's state and pending work become src's (src_counts_valid == 0: src's counts are
 *     stale, dst starts with none);
 *   import: the slot's state becomes src's (layer l at src + l * src_layer_stride elements; src
 *     NULL: zeros), its pending work dropped;
 *   set_row: *row = slot (a captured write-back carries its slot), and the slot's counts cleared
 *     when clear_counts;
 *   export: dst (layer l at dst + l * dst_layer_stride elements) becomes the slot's pool state
 *     (pending work must have been written back first). */
gdn__slot_copy_params gdn__op_copy_params(const gdn__op_stack *s, int32_t dst, int32_t src, int src_counts_valid);
gdn__slot_copy_params gdn__op_import_params(const gdn__op_stack *s, int32_t slot, const void *src,
                                            int64_t src_layer_stride);
gdn__slot_copy_params gdn__op_set_row_params(const gdn__op_stack *s, int32_t *row, int32_t slot, int clear_counts);
gdn__slot_copy_params gdn__op_export_params(const gdn__op_stack *s, int32_t slot, void *dst, int64_t dst_layer_stride);

/* The mixer's conv window of `slot` in every layer (the stack's conv pools, conv_layer_stride
 * elements apart), one block of (W - 1) conv_dim elements each, as one launch:
 *   window_import: it becomes src's (layer l at src + l * src_layer_stride elements; src NULL:
 *     zeros), the state and pending work left alone;
 *   window_export: dst (layer l at dst + l * dst_layer_stride elements) becomes it (pending work
 *     must have been written back first). */
gdn__slot_copy_params gdn__op_window_import_params(const gdn__op_stack *s, int32_t slot, const void *src,
                                                   int64_t src_layer_stride);
gdn__slot_copy_params gdn__op_window_export_params(const gdn__op_stack *s, int32_t slot, void *dst,
                                                   int64_t dst_layer_stride);

#endif /* GDN_ENGINE_OP_IMPL_H */
