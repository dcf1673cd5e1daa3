/*
 * The op layer (include/gdn/gdn_op.h): checks an op description, lays out its workspace, turns it
 * into the kernels' parameters (kernels/gdn_kernel_params.h) and runs the backend's kernel: the CUDA
 * launchers or the float64 reference. No allocation, no synchronisation. The builders (op_impl.h)
 * serve the engine too, over a stack of layers.
 */
#include "op_impl.h"
#include "config.h"

#include <math.h>
#include <string.h>

#include "kernels/ref/gdn_ref.h"
#ifdef GDN_HAVE_CUDA
#include "kernels/gdn_cuda.h"
#endif

static int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

/* The cache strategy's verify cache (and, with the conv, its stored x): none with max_tokens 1, which
 * runs decodes only. */
static int keeps_verify_cache(const gdn_op_layer *op) { return op->strategy == GDN_VERIFY_CACHE && op->max_tokens > 1; }

/* The op as an engine configuration, so that one validator gives the same codes as gdn_engine_create. */
gdn_status gdn__op_check_description(const gdn_op_layer *op)
{
    if (op->backend != GDN_BACKEND_CPU && op->backend != GDN_BACKEND_CUDA) return GDN_EINVAL;
    if (op->strategy != GDN_VERIFY_CACHE && op->strategy != GDN_VERIFY_FOLD && op->strategy != GDN_VERIFY_RING)
        return GDN_EINVAL;
    if (op->pool.num_slots < 1 || op->pool.num_slots > INT32_MAX) return GDN_ECONFIG_SLOTS;
    gdn_engine_config c;
    memset(&c, 0, sizeof c);
    c.model = op->model;
    c.model.num_layers = 1;
    c.state_dtype = op->pool.dtype;
    c.input_dtype = op->input_dtype;
    c.output_dtype = op->output_dtype;
    c.num_slots = (int32_t)op->pool.num_slots;
    c.max_batch = op->max_batch;
    c.max_tokens = op->max_tokens;
    c.num_buckets = 1;
    c.buckets[0] = op->max_batch;
    c.verify_strategy = op->strategy;
    c.ring_length = op->ring_length;
    c.ring_write_through = op->ring_write_through;
    c.backend = op->backend;
    c.graph_mode = GDN_GRAPHS_OFF;
    return gdn_engine_config_validate(&c);
}

int gdn__cuda_mixer_runs(int32_t head_dim_k) { return head_dim_k == 128; }

/* The mixer's conv width (0: no conv) and conv_dim. */
static int32_t conv_width_of(const gdn_op_layer *op) { return op->mixer ? op->mixer->conv_width : 0; }
static int64_t conv_dim_of(const gdn_op_layer *op)
{
    return 2 * (int64_t)op->model.num_k_heads * op->model.head_dim_k + (int64_t)op->model.num_v_heads * op->model.head_dim_v;
}

gdn__op_layout gdn__op_layout_of(const gdn_op_layer *op, int with_scratch)
{
    gdn__op_layout l;
    memset(&l, 0, sizeof l);
    const int32_t HK = op->model.num_k_heads, HV = op->model.num_v_heads, K = op->model.head_dim_k,
                  V = op->model.head_dim_v;
    const int64_t slots = op->pool.num_slots, in_size = (int64_t)gdn_dtype_size(op->input_dtype);
    const int conv = conv_width_of(op) > 0;
    const int32_t C = conv ? (int32_t)conv_dim_of(op) : 0; /* check_mixer: it fits */
    int32_t tokens_before_own = 0; /* the most tokens a row folds or replays before its own */
    int64_t at = 0;
    if (op->strategy == GDN_VERIFY_CACHE) {
        if (keeps_verify_cache(op)) {
            l.cache = at;
            l.cache_row_stride = (int64_t)op->max_tokens * HV * V * K;
            at = align256(at + op->max_batch * l.cache_row_stride * (int64_t)gdn_dtype_size(op->pool.dtype));
            if (conv) { /* a verify's raw x per row, for the commit's window */
                l.x_store = at;
                at = align256(at + (int64_t)op->max_batch * op->max_tokens * C * in_size);
            }
        }
    } else {
        if (op->strategy == GDN_VERIFY_FOLD) {
            l.token_store = at;
            l.side_bytes = op->max_tokens * (conv ? gdn__mixer_token_elems(C, HV) : gdn__token_elems(HK, HV, K, V)) * in_size;
            tokens_before_own = op->max_tokens;
        } else {
            l.ring_length = gdn__ring_length_or_default(op->ring_length, op->max_tokens);
            l.ring_capacity = l.ring_length > op->max_tokens ? l.ring_length : op->max_tokens;
            l.ring = at;
            l.side_bytes = l.ring_capacity * (conv ? gdn__mixer_record_bytes(C, HV, V) : gdn__ring_record_bytes(HK, HV, K, V));
            tokens_before_own = l.ring_capacity;
        }
        at = align256(at + slots * l.side_bytes);
        l.counts = at;
        at = align256(at + slots * (int64_t)sizeof(int32_t));
        l.arrivals = at;
        at = align256(at + op->max_batch * (int64_t)sizeof(uint32_t));
        l.flush_row = at;
        at = align256(at + (int64_t)sizeof(int32_t));
        if (op->strategy == GDN_VERIFY_FOLD && op->backend == GDN_BACKEND_CUDA) {
            l.key_arrivals = at;
            at = align256(at + (int64_t)op->max_batch * HK * (int64_t)sizeof(uint32_t));
        }
        if (op->strategy == GDN_VERIFY_RING && op->backend == GDN_BACKEND_CUDA) { /* the two-kernel decode's */
            l.ring_prep = at;
            at = align256(at + (int64_t)op->max_batch * HV * gdn__ring_prep_floats(l.ring_capacity) * (int64_t)sizeof(float));
        }
    }
    if (op->backend == GDN_BACKEND_CUDA && op->mixer && (conv || op->mixer->norm_weight)) {
        l.mixer_arrivals = at; /* the fused kernel's counts (kernels/gdn_kernel_params.h) */
        at = align256(at + (int64_t)op->max_batch * (HK + HV) * (int64_t)sizeof(uint32_t));
        if (op->mixer->norm_weight) {
            l.norm_scratch = at;
            at = align256(at + (int64_t)op->max_batch * op->max_tokens * HV * V * (int64_t)sizeof(float));
        }
    }
    if (with_scratch && op->backend == GDN_BACKEND_CPU) {
        l.scratch = at;
        at += (int64_t)gdn__ref_scratch_bytes();
        if (conv) at += (int64_t)gdn__ref_mixer_scratch_bytes(C, conv_width_of(op), tokens_before_own + op->max_tokens);
        at = align256(at);
    }
    l.bytes = at > GDN__WORKSPACE_MIN_BYTES ? at : GDN__WORKSPACE_MIN_BYTES;
    return l;
}

size_t gdn_op_workspace_bytes(const gdn_op_layer *op)
{
    if (!op || gdn__op_check_description(op) != GDN_OK) return 0;
    if (conv_width_of(op) > 0 && conv_dim_of(op) > INT32_MAX / 4) return 0;
    return (size_t)gdn__op_layout_of(op, 1).bytes;
}

/* Elements of one slot's state (HV * V * K). */
static int64_t state_elems(const gdn_op_layer *op)
{
    return (int64_t)op->model.num_v_heads * op->model.head_dim_v * op->model.head_dim_k;
}

int gdn__op_keeps_work(const gdn_op_layer *op) { return op->strategy != GDN_VERIFY_CACHE; }

gdn_op_layer gdn__op_stack_layer(const gdn__op_stack *s, int32_t l)
{
    gdn_op_layer op = s->op;
    op.pool.data = (char *)op.pool.data + (size_t)(l * s->pool_layer_stride) * gdn_dtype_size(op.pool.dtype);
    op.workspace = (char *)op.workspace + (size_t)(l * s->workspace_layer_bytes);
    return op;
}

/* The kernels' parameters that do not depend on the step's tensors: B rows read from `rows`, T
 * tokens (0: a write-back), the pool, the gates' parameters and the strategy's workspace. */
static gdn__layer_params base_params(const gdn_op_layer *op, const gdn__op_layout *layout, int32_t B, int32_t T,
                                     int verify, const int32_t *rows)
{
    const gdn_model_config *m = &op->model;
    char *ws = op->workspace;
    gdn__layer_params p = {
        .B = B,
        .T = T,
        .HK = m->num_k_heads,
        .HV = m->num_v_heads,
        .K = m->head_dim_k,
        .V = m->head_dim_v,
        .scale = m->scale > 0.0f ? m->scale : 1.0f / sqrtf((float)m->head_dim_k),
        .use_qk_l2norm = m->use_qk_l2norm,
        .input_dtype = op->input_dtype,
        .A_log = op->A_log,
        .dt_bias = op->dt_bias,
        .state_dtype = op->pool.dtype,
        .state = op->pool.data,
        .num_slots = op->pool.num_slots,
        .slot_stride = op->pool.slot_stride,
        .read_slots = rows,
        .output_dtype = op->output_dtype,
        .error_flag = op->error_flag,
    };
    if (op->mixer) {
        const gdn_mixer *m = op->mixer;
        p.mixer.conv_width = m->conv_width;
        p.mixer.conv_dim = (int32_t)conv_dim_of(op);
        p.mixer.conv_weight_dtype = m->conv_weight_dtype;
        p.mixer.conv_weight = m->conv_weight;
        p.mixer.conv_bias = m->conv_bias;
        p.mixer.conv_state = m->conv.data;
        p.mixer.conv_slot_stride = m->conv.slot_stride;
        p.mixer.conv_token_stride = m->conv.token_stride;
        p.mixer.conv_channel_stride = m->conv.channel_stride;
        if (m->conv_width > 0 && keeps_verify_cache(op))
            p.mixer.x_store = ws + layout->x_store, p.mixer.x_store_tokens = op->max_tokens;
        p.mixer.norm_weight = m->norm_weight;
        p.mixer.norm_eps = m->norm_eps;
        if (layout->mixer_arrivals) p.mixer.arrivals = (uint32_t *)(ws + layout->mixer_arrivals);
        if (layout->norm_scratch) p.mixer.norm_scratch = (float *)(ws + layout->norm_scratch);
    }
    if (op->strategy == GDN_VERIFY_CACHE) {
        if (verify) p.cache = ws + layout->cache, p.cache_row_stride = layout->cache_row_stride;
    } else if (op->strategy == GDN_VERIFY_FOLD) {
        p.token_store = ws + layout->token_store;
        p.store_tokens = op->max_tokens;
        p.pending = (int32_t *)(ws + layout->counts);
        p.deferred_verify = verify;
        p.arrivals = (uint32_t *)(ws + layout->arrivals);
        if (layout->key_arrivals) p.key_arrivals = (uint32_t *)(ws + layout->key_arrivals);
    } else {
        p.ring = ws + layout->ring;
        p.ring_capacity = layout->ring_capacity;
        p.ring_length = layout->ring_length;
        p.ring_count = (int32_t *)(ws + layout->counts);
        if (layout->ring_prep) p.ring_prep = (float *)(ws + layout->ring_prep);
        p.deferred_verify = verify;
        p.arrivals = (uint32_t *)(ws + layout->arrivals);
    }
    return p;
}

gdn__layer_params gdn__op_step_params(const gdn_op_layer *op, const gdn__op_layout *layout)
{
    gdn__layer_params p = base_params(op, layout, op->batch, op->tokens, op->kind == GDN_STEP_VERIFY, op->read_slots);
    p.write_slots = op->write_slots;
    p.overlap_preceding = op->overlap_preceding != 0;
    p.token_counts = op->token_counts;
    p.parents = op->parents;
    /* A ring decode of few rows writes every row back: the kernels' rule with a ring length of 1. */
    if (op->strategy == GDN_VERIFY_RING && op->kind == GDN_STEP_DECODE &&
        op->batch <= gdn__ring_write_through_rows(op->ring_write_through, op->model.num_v_heads, op->pool.dtype,
                                                  op->mixer && op->mixer->conv_width > 0, op->max_batch))
        p.ring_length = 1;
    gdn__layer_params_views(&p, &op->q, &op->k, &op->v, &op->a, &op->b, &op->o);
    if (op->mixer) { /* x: one "head" of conv_dim channels; z as the output */
        p.mixer.x = op->x.data;
        p.mixer.x_strides = (gdn__strides){op->x.row_stride, op->x.token_stride, 0};
        p.mixer.z = op->z.data;
        p.mixer.z_strides = (gdn__strides){op->z.row_stride, op->z.token_stride, op->z.head_stride};
    }
    return p;
}

gdn__layer_params gdn__op_write_back_params(const gdn_op_layer *op, const gdn__op_layout *layout,
                                            const int32_t *rows, int32_t count)
{
    gdn__layer_params p = base_params(op, layout, count, 0, 0, rows);
    /* T = 0 reads no token input and writes no output; the kernels still want valid pointers. */
    p.q = p.k = p.v = p.a = p.b = p.out = op->workspace;
    return p;
}

int32_t *gdn__op_slot_count(const gdn__op_stack *s, int32_t slot)
{
    return (int32_t *)((char *)s->op.workspace + s->layout.counts) + slot;
}

int64_t gdn__op_counts_layer_stride(const gdn__op_stack *s)
{
    return s->workspace_layer_bytes / (int64_t)sizeof(int32_t);
}

gdn__commit_params gdn__op_commit_params(const gdn__op_stack *s, const int32_t *accepted)
{
    const gdn_op_layer *op = &s->op;
    const int64_t state_size = (int64_t)gdn_dtype_size(op->pool.dtype);
    gdn__commit_params c = {
        .B = op->batch,
        .T = op->tokens,
        .num_layers = s->num_layers,
        .HV = op->model.num_v_heads,
        .K = op->model.head_dim_k,
        .V = op->model.head_dim_v,
        .state_dtype = op->pool.dtype,
        .state = op->pool.data,
        .state_layer_stride = s->pool_layer_stride,
        .num_slots = op->pool.num_slots,
        .slot_stride = op->pool.slot_stride,
        .read_slots = op->read_slots,
        .write_slots = op->write_slots,
        .accepted = accepted,
        .error_flag = op->error_flag,
        .overlap_preceding = op->overlap_preceding != 0,
        .counts_layer_stride = gdn__op_counts_layer_stride(s),
        .token_counts = op->token_counts,
        .parents = op->parents,
    };
    char *ws = op->workspace;
    if (op->strategy == GDN_VERIFY_CACHE) {
        c.cache = ws + s->layout.cache;
        c.cache_layer_stride = s->workspace_layer_bytes / state_size;
        c.cache_row_stride = s->layout.cache_row_stride;
    } else if (op->strategy == GDN_VERIFY_FOLD) {
        c.pending = (int32_t *)(ws + s->layout.counts);
        c.entries = ws + s->layout.token_store;
        c.entries_per_slot = op->max_tokens;
    } else {
        c.ring_count = (int32_t *)(ws + s->layout.counts);
        c.entries = ws + s->layout.ring;
        c.entries_per_slot = s->layout.ring_capacity;
    }
    if (c.entries) { /* a tree's commit moves the accepted path's stored tokens or records */
        c.entry_slot_bytes = s->layout.side_bytes;
        c.entry_bytes = s->layout.side_bytes / c.entries_per_slot;
        c.entries_layer_bytes = s->workspace_layer_bytes;
    }
    if (op->mixer && op->mixer->conv_width > 0 && op->strategy == GDN_VERIFY_CACHE) {
        const gdn_mixer *m = op->mixer;
        c.conv_width = m->conv_width;
        c.conv_dim = (int32_t)conv_dim_of(op);
        c.input_dtype = op->input_dtype;
        c.conv_state = m->conv.data;
        c.conv_slot_stride = m->conv.slot_stride;
        c.conv_token_stride = m->conv.token_stride;
        c.conv_channel_stride = m->conv.channel_stride;
        c.conv_layer_stride = s->conv_layer_stride;
        c.x_store = ws + s->layout.x_store;
        c.x_store_tokens = op->max_tokens;
        c.x_store_layer_stride = s->workspace_layer_bytes / (int64_t)gdn_dtype_size(op->input_dtype);
    }
    return c;
}

/* The pool state of `slot` in layer 0, and its bytes. */
static char *slot_state(const gdn__op_stack *s, int32_t slot)
{
    return (char *)s->op.pool.data + (size_t)((int64_t)slot * s->op.pool.slot_stride) * gdn_dtype_size(s->op.pool.dtype);
}
static int64_t state_bytes(const gdn__op_stack *s) { return state_elems(&s->op) * (int64_t)gdn_dtype_size(s->op.pool.dtype); }
static int64_t pool_layer_bytes(const gdn__op_stack *s)
{
    return s->pool_layer_stride * (int64_t)gdn_dtype_size(s->op.pool.dtype);
}
/* The slot's stored tokens or ring records in layer 0. */
static char *side_of(const gdn__op_stack *s, int32_t slot)
{
    const int64_t at = s->op.strategy == GDN_VERIFY_FOLD ? s->layout.token_store : s->layout.ring;
    return (char *)s->op.workspace + at + (size_t)(slot * s->layout.side_bytes);
}

static void add_region(gdn__slot_copy_params *p, const void *src, void *dst, int64_t bytes, int64_t src_layer_stride,
                       int64_t dst_layer_stride)
{
    p->region[p->regions++] = (gdn__slot_region){src, dst, bytes, src_layer_stride, dst_layer_stride};
}

/* A zero fill of the slot's counts in every layer. */
static void clear_counts(const gdn__op_stack *s, gdn__slot_copy_params *p, int32_t slot)
{
    add_region(p, NULL, gdn__op_slot_count(s, slot), sizeof(int32_t), 0, s->workspace_layer_bytes);
}

/* The mixer's conv window of `slot` in layer 0 (one contiguous block: check_mixer), and its bytes
 * (0 without the conv). */
static char *window_of(const gdn__op_stack *s, int32_t slot)
{
    const gdn_mixer *m = s->op.mixer;
    return (char *)m->conv.data + (size_t)((int64_t)slot * m->conv.slot_stride) * gdn_dtype_size(s->op.input_dtype);
}
static int64_t window_bytes(const gdn__op_stack *s)
{
    const int32_t W = conv_width_of(&s->op);
    return W > 0 ? (int64_t)(W - 1) * conv_dim_of(&s->op) * (int64_t)gdn_dtype_size(s->op.input_dtype) : 0;
}
static int64_t window_layer_bytes(const gdn__op_stack *s)
{
    return s->conv_layer_stride * (int64_t)gdn_dtype_size(s->op.input_dtype);
}

gdn__slot_copy_params gdn__op_copy_params(const gdn__op_stack *s, int32_t dst, int32_t src, int src_counts_valid)
{
    gdn__slot_copy_params p = {.layers = s->num_layers};
    const int64_t pool_stride = pool_layer_bytes(s), ws_stride = s->workspace_layer_bytes;
    add_region(&p, slot_state(s, src), slot_state(s, dst), state_bytes(s), pool_stride, pool_stride);
    if (gdn__op_keeps_work(&s->op)) {
        add_region(&p, side_of(s, src), side_of(s, dst), s->layout.side_bytes, ws_stride, ws_stride);
        if (src_counts_valid)
            add_region(&p, gdn__op_slot_count(s, src), gdn__op_slot_count(s, dst), sizeof(int32_t), ws_stride, ws_stride);
        else
            clear_counts(s, &p, dst);
    }
    if (window_bytes(s) > 0)
        add_region(&p, window_of(s, src), window_of(s, dst), window_bytes(s), window_layer_bytes(s), window_layer_bytes(s));
    return p;
}

gdn__slot_copy_params gdn__op_import_params(const gdn__op_stack *s, int32_t slot, const void *src,
                                            int64_t src_layer_stride)
{
    gdn__slot_copy_params p = {.layers = s->num_layers};
    const int64_t size = (int64_t)gdn_dtype_size(s->op.pool.dtype);
    add_region(&p, src, slot_state(s, slot), state_bytes(s), src_layer_stride * size, pool_layer_bytes(s));
    if (gdn__op_keeps_work(&s->op)) clear_counts(s, &p, slot);
    if (!src && window_bytes(s) > 0) /* a reset zeroes the window too; an import leaves it to the caller */
        add_region(&p, NULL, window_of(s, slot), window_bytes(s), 0, window_layer_bytes(s));
    return p;
}

gdn__slot_copy_params gdn__op_set_row_params(const gdn__op_stack *s, int32_t *row, int32_t slot, int clear)
{
    gdn__slot_copy_params p = {.layers = s->num_layers, .set_at = row, .set_value = slot};
    if (clear) clear_counts(s, &p, slot);
    return p;
}

gdn__slot_copy_params gdn__op_export_params(const gdn__op_stack *s, int32_t slot, void *dst, int64_t dst_layer_stride)
{
    gdn__slot_copy_params p = {.layers = s->num_layers};
    const int64_t size = (int64_t)gdn_dtype_size(s->op.pool.dtype);
    add_region(&p, slot_state(s, slot), dst, state_bytes(s), pool_layer_bytes(s), dst_layer_stride * size);
    return p;
}

gdn__slot_copy_params gdn__op_window_import_params(const gdn__op_stack *s, int32_t slot, const void *src,
                                                   int64_t src_layer_stride)
{
    gdn__slot_copy_params p = {.layers = s->num_layers};
    const int64_t size = (int64_t)gdn_dtype_size(s->op.input_dtype);
    add_region(&p, src, window_of(s, slot), window_bytes(s), src_layer_stride * size, window_layer_bytes(s));
    return p;
}

gdn__slot_copy_params gdn__op_window_export_params(const gdn__op_stack *s, int32_t slot, void *dst,
                                                   int64_t dst_layer_stride)
{
    gdn__slot_copy_params p = {.layers = s->num_layers};
    const int64_t size = (int64_t)gdn_dtype_size(s->op.input_dtype);
    add_region(&p, window_of(s, slot), dst, window_bytes(s), window_layer_bytes(s), dst_layer_stride * size);
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* The public ops: one layer, checked, run on the backend directly                                  */
/* ---------------------------------------------------------------------------------------------- */

/* The pool and workspace that every op needs, and a backend this build has. */
static gdn_status check_memory(const gdn_op_layer *op)
{
    if (!op->pool.data || !op->workspace || op->pool.slot_stride < state_elems(op)) return GDN_EINVAL;
    /* The pool's extent in bytes must fit int64 (the kernels' offsets). */
    if (op->pool.slot_stride > INT64_MAX / op->pool.num_slots / (int64_t)gdn_dtype_size(op->pool.dtype)) return GDN_EINVAL;
#ifndef GDN_HAVE_CUDA
    if (op->backend == GDN_BACKEND_CUDA) return GDN_ENODEV;
#endif
    return GDN_OK;
}

/* The mixer's own fields: GDN_EINVAL for a width outside 2..4 (0: no conv), a missing weight,
 * conv pool or norm weight's gate input, or a window that is not one contiguous block per slot. */
static gdn_status check_mixer(const gdn_op_layer *op)
{
    const gdn_mixer *m = op->mixer;
    if (!m) return GDN_OK;
    if (m->conv_width != 0 && (m->conv_width < 2 || m->conv_width > GDN__MAX_CONV_WIDTH)) return GDN_EINVAL;
    if (m->conv_width > 0) {
        if (!m->conv_weight || !m->conv.data) return GDN_EINVAL;
        if (m->conv_weight_dtype != GDN_DTYPE_F32 && m->conv_weight_dtype != GDN_DTYPE_BF16) return GDN_EINVAL;
        const int64_t rows = m->conv_width - 1, C = conv_dim_of(op);
        if (C > INT32_MAX / 4) return GDN_EINVAL;
        int64_t ts, cs;
        gdn__conv_window_strides(m->conv.token_stride, m->conv.channel_stride, C, &ts, &cs);
        const int contiguous = (ts == C && cs == 1) || (ts == 1 && cs == rows);
        if (!contiguous || m->conv.slot_stride < rows * C) return GDN_EINVAL;
    }
    if (m->norm_eps < 0.0f) return GDN_EINVAL;
    return GDN_OK;
}

/* The description as a one-layer stack, checked (pool, workspace, strategy). */
static gdn_status one_layer(const gdn_op_layer *op, gdn__op_stack *s)
{
    if (!op) return GDN_EINVAL;
    gdn_status status = gdn__op_check_description(op);
    if (status == GDN_OK) status = check_memory(op);
    if (status == GDN_OK) status = check_mixer(op);
    if (status != GDN_OK) return status;
    s->op = *op;
    s->layout = gdn__op_layout_of(op, 1);
    s->num_layers = 1;
    s->pool_layer_stride = 0;
    s->workspace_layer_bytes = s->layout.bytes;
    s->conv_layer_stride = 0;
    return GDN_OK;
}

/* A step's or commit's description, checked. */
static gdn_status check_step(const gdn_op_layer *op, gdn__op_stack *s)
{
    gdn_status status = one_layer(op, s);
    if (status != GDN_OK) return status;
    if (op->kind != GDN_STEP_DECODE && op->kind != GDN_STEP_VERIFY) return GDN_ESTEP_KIND;
    if (op->kind == GDN_STEP_DECODE ? op->tokens != 1 : (op->tokens < 1 || op->tokens > op->max_tokens))
        return GDN_ESTEP_TOKENS;
    if (op->batch < 0 || op->batch > op->max_batch) return GDN_ESTEP_BATCH;
    const int conv = conv_width_of(op) > 0;
    if ((conv ? !op->x.data : (!op->q.data || !op->k.data || !op->v.data)) || !op->a.data || !op->b.data ||
        !op->o.data || !op->A_log || !op->dt_bias || !op->read_slots)
        return GDN_EINVAL;
    if (op->mixer && op->mixer->norm_weight && !op->z.data) return GDN_EINVAL;
    if (op->mixer && op->backend == GDN_BACKEND_CUDA && !gdn__cuda_mixer_runs(op->model.head_dim_k))
        return GDN_ENOTSUP;
    return GDN_OK;
}

/* The backend's layer step (the CPU one runs on the workspace's scratch). */
static gdn_status run_layer(const gdn__op_stack *s, const gdn__layer_params *p, void *stream)
{
    if (s->op.backend == GDN_BACKEND_CPU) {
        gdn__ref_layer_step_in(p, (char *)s->op.workspace + s->layout.scratch);
        return GDN_OK;
    }
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_layer_step(p, stream);
#else
    (void)stream;
    return GDN_ENODEV;
#endif
}

static gdn_status run_slot_copy(const gdn__op_stack *s, const gdn__slot_copy_params *p, void *stream)
{
    if (s->op.backend == GDN_BACKEND_CPU) {
        gdn__ref_slot_copy(p);
        return GDN_OK;
    }
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_slot_copy(p, stream);
#else
    (void)stream;
    return GDN_ENODEV;
#endif
}

gdn_status gdn_op_layer_step(const gdn_op_layer *op, void *stream)
{
    gdn__op_stack s;
    const gdn_status status = check_step(op, &s);
    if (status != GDN_OK) return status;
    if (op->kind == GDN_STEP_VERIFY && op->max_tokens == 1) return GDN_ESTEP_KIND; /* decode only */
    const gdn__layer_params p = gdn__op_step_params(op, &s.layout);
    return run_layer(&s, &p, stream);
}

/* The commit by count (nodes == 0) or by node. */
static gdn_status commit(const gdn_op_layer *op, const int32_t *accepted, int nodes, void *stream)
{
    gdn__op_stack s;
    const gdn_status status = check_step(op, &s);
    if (status != GDN_OK) return status;
    if (op->kind != GDN_STEP_VERIFY) return GDN_ESTEP_KIND;
    if (!accepted) return GDN_EINVAL;
    if (op->max_tokens == 1) return GDN_ESTEP_KIND; /* decode only: no verify to commit */
    gdn__commit_params c = gdn__op_commit_params(&s, accepted);
    c.accepted_nodes = nodes;
    if (op->backend == GDN_BACKEND_CPU) {
        gdn__ref_commit(&c);
        return GDN_OK;
    }
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_commit(&c, stream);
#else
    (void)stream;
    return GDN_ENODEV;
#endif
}

gdn_status gdn_op_commit(const gdn_op_layer *op, const int32_t *accepted, void *stream)
{
    return commit(op, accepted, 0, stream);
}

gdn_status gdn_op_commit_node(const gdn_op_layer *op, const int32_t *accepted_node, void *stream)
{
    return commit(op, accepted_node, 1, stream);
}

gdn_status gdn_op_flush(const gdn_op_layer *op, const int32_t *slots, int32_t count, void *stream)
{
    gdn__op_stack s;
    gdn_status status = one_layer(op, &s);
    if (status != GDN_OK) return status;
    if (!op->A_log || !op->dt_bias || (count > 0 && !slots)) return GDN_EINVAL;
    if (count < 0 || count > op->max_batch) return GDN_ESTEP_BATCH;
    if (!gdn__op_keeps_work(op) || count == 0) return GDN_OK;
    const gdn__layer_params p = gdn__op_write_back_params(op, &s.layout, slots, count);
    return run_layer(&s, &p, stream);
}

static gdn_status check_slot(const gdn_op_layer *op, int32_t slot)
{
    return slot < 0 || slot >= op->pool.num_slots ? GDN_ESLOT_RANGE : GDN_OK;
}

gdn_status gdn_op_slot_copy(const gdn_op_layer *op, int32_t dst, int32_t src, void *stream)
{
    gdn__op_stack s;
    gdn_status status = one_layer(op, &s);
    if (status == GDN_OK) status = check_slot(op, dst);
    if (status == GDN_OK) status = check_slot(op, src);
    if (status != GDN_OK) return status;
    if (dst == src) return GDN_EINVAL;
    const gdn__slot_copy_params p = gdn__op_copy_params(&s, dst, src, 1);
    return run_slot_copy(&s, &p, stream);
}

/* Import of src into the slot; src NULL: a reset (zeros). */
static gdn_status import_or_reset(const gdn_op_layer *op, int32_t slot, const void *src, void *stream)
{
    gdn__op_stack s;
    gdn_status status = one_layer(op, &s);
    if (status == GDN_OK) status = check_slot(op, slot);
    if (status != GDN_OK) return status;
    const gdn__slot_copy_params p = gdn__op_import_params(&s, slot, src, 0);
    return run_slot_copy(&s, &p, stream);
}

gdn_status gdn_op_slot_import(const gdn_op_layer *op, int32_t slot, const void *src, void *stream)
{
    if (!src) return GDN_EINVAL;
    return import_or_reset(op, slot, src, stream);
}

gdn_status gdn_op_slot_reset(const gdn_op_layer *op, int32_t slot, void *stream)
{
    return import_or_reset(op, slot, NULL, stream);
}

gdn_status gdn_op_slot_export(const gdn_op_layer *op, int32_t slot, void *dst, void *stream)
{
    gdn__op_stack s;
    gdn_status status = one_layer(op, &s);
    if (status == GDN_OK) status = check_slot(op, slot);
    if (status != GDN_OK) return status;
    if (!dst || (gdn__op_keeps_work(op) && (!op->A_log || !op->dt_bias))) return GDN_EINVAL;
    if (gdn__op_keeps_work(op)) { /* write the slot's pending work back first: its row set by a launch */
        int32_t *row = (int32_t *)((char *)op->workspace + s.layout.flush_row);
        const gdn__slot_copy_params set = gdn__op_set_row_params(&s, row, slot, 0);
        status = run_slot_copy(&s, &set, stream);
        const gdn__layer_params p = gdn__op_write_back_params(op, &s.layout, row, 1);
        if (status == GDN_OK) status = run_layer(&s, &p, stream);
        if (status != GDN_OK) return status;
    }
    const gdn__slot_copy_params p = gdn__op_export_params(&s, slot, dst, 0);
    return run_slot_copy(&s, &p, stream);
}
