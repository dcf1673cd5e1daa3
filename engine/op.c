/*
 * The op layer (include/gdn/gdn_op.h): checks an op description, lays out its workspace, turns it
 * into the kernels' parameters (kernels/gdn_kernel_params.h) and runs the backend's kernel: the CUDA
 * launchers or the float64 reference. No allocation, no synchronisation.
 */
#include "gdn/gdn_op.h"

#include <math.h>
#include <string.h>

#include "kernels/gdn_kernel_params.h"
#include "kernels/ref/gdn_ref.h"
#ifdef GDN_HAVE_CUDA
#include "kernels/gdn_cuda.h"
#endif

/* The workspace, in bytes from its start; every part 256-byte aligned. */
typedef struct op_layout {
    int64_t cache;            /* CACHE: [max_batch][max_tokens][HV V K] in the pool's dtype */
    int64_t cache_row_stride; /* elements */
    int64_t token_store;      /* REPLAY: [num_slots][max_tokens][token elems] in input_dtype */
    int64_t ring;             /* RING: [num_slots][capacity] records */
    int32_t ring_capacity;
    int32_t ring_length;
    int64_t counts;           /* REPLAY pending / RING record counts: int32 [num_slots] */
    int64_t arrivals;         /* REPLAY, RING: uint32 [max_batch], zero between steps */
    int64_t flush_row;        /* REPLAY, RING: int32, the row of a single-slot write-back */
    int64_t side_bytes;       /* REPLAY, RING: one slot's stored tokens or records */
    int64_t scratch;          /* CPU: the reference's scratch */
    int64_t bytes;
} op_layout;

static int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

/* The op as an engine configuration, so that one validator gives the same codes as gdn_engine_create. */
static gdn_status check_description(const gdn_op_layer *op)
{
    if (op->backend != GDN_BACKEND_CPU && op->backend != GDN_BACKEND_CUDA) return GDN_EINVAL;
    if (op->strategy != GDN_VERIFY_CACHE && op->strategy != GDN_VERIFY_REPLAY && op->strategy != GDN_VERIFY_RING)
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
    c.backend = op->backend;
    c.graph_mode = GDN_GRAPHS_OFF;
    return gdn_engine_config_validate(&c);
}

static op_layout layout_of(const gdn_op_layer *op)
{
    op_layout l;
    memset(&l, 0, sizeof l);
    const int32_t HK = op->model.num_k_heads, HV = op->model.num_v_heads, K = op->model.head_dim_k,
                  V = op->model.head_dim_v;
    const int64_t slots = op->pool.num_slots, in_size = (int64_t)gdn_dtype_size(op->input_dtype);
    int64_t at = 0;
    if (op->strategy == GDN_VERIFY_CACHE) {
        l.cache = at;
        l.cache_row_stride = (int64_t)op->max_tokens * HV * V * K;
        at = align256(at + op->max_batch * l.cache_row_stride * (int64_t)gdn_dtype_size(op->pool.dtype));
    } else {
        if (op->strategy == GDN_VERIFY_REPLAY) {
            l.token_store = at;
            l.side_bytes = op->max_tokens * gdn__token_elems(HK, HV, K, V) * in_size;
        } else {
            l.ring_length = op->ring_length ? op->ring_length : GDN_DEFAULT_RING_LENGTH;
            l.ring_capacity = l.ring_length > op->max_tokens ? l.ring_length : op->max_tokens;
            l.ring = at;
            l.side_bytes = l.ring_capacity * gdn__ring_record_bytes(HK, HV, K, V);
        }
        at = align256(at + slots * l.side_bytes);
        l.counts = at;
        at = align256(at + slots * (int64_t)sizeof(int32_t));
        l.arrivals = at;
        at = align256(at + op->max_batch * (int64_t)sizeof(uint32_t));
        l.flush_row = at;
        at = align256(at + (int64_t)sizeof(int32_t));
    }
    if (op->backend == GDN_BACKEND_CPU) {
        l.scratch = at;
        at = align256(at + (int64_t)gdn__ref_scratch_bytes());
    }
    l.bytes = at;
    return l;
}

size_t gdn_op_workspace_bytes(const gdn_op_layer *op)
{
    if (!op || check_description(op) != GDN_OK) return 0;
    return (size_t)layout_of(op).bytes;
}

/* Elements of one slot's state (HV * V * K). */
static int64_t state_elems(const gdn_op_layer *op)
{
    return (int64_t)op->model.num_v_heads * op->model.head_dim_v * op->model.head_dim_k;
}

/* The pool and workspace that every op needs, and a backend this build has. */
static gdn_status check_memory(const gdn_op_layer *op)
{
    if (!op->pool.data || !op->workspace || op->pool.slot_stride < state_elems(op)) return GDN_EINVAL;
#ifndef GDN_HAVE_CUDA
    if (op->backend == GDN_BACKEND_CUDA) return GDN_ENODEV;
#endif
    return GDN_OK;
}

/* The kernels' parameters that do not depend on the step's tensors: B rows read from `rows`, T
 * tokens (0: a write-back), the pool, the gates' parameters and the strategy's workspace. */
static gdn__layer_params base_params(const gdn_op_layer *op, const op_layout *layout, int32_t B, int32_t T,
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
    if (op->strategy == GDN_VERIFY_CACHE) {
        if (verify) p.cache = ws + layout->cache, p.cache_row_stride = layout->cache_row_stride;
    } else if (op->strategy == GDN_VERIFY_REPLAY) {
        p.token_store = ws + layout->token_store;
        p.store_tokens = op->max_tokens;
        p.pending = (int32_t *)(ws + layout->counts);
        p.replay_verify = verify;
        p.arrivals = (uint32_t *)(ws + layout->arrivals);
    } else {
        p.ring = ws + layout->ring;
        p.ring_capacity = layout->ring_capacity;
        p.ring_length = layout->ring_length;
        p.ring_count = (int32_t *)(ws + layout->counts);
        p.replay_verify = verify;
        p.arrivals = (uint32_t *)(ws + layout->arrivals);
    }
    return p;
}

/* Everything a step or commit needs, checked; the kernels' parameters with the workspace laid out. */
static gdn_status prepare(const gdn_op_layer *op, gdn__layer_params *p, op_layout *layout)
{
    if (!op) return GDN_EINVAL;
    gdn_status status = check_description(op);
    if (status != GDN_OK) return status;
    if (op->kind != GDN_STEP_DECODE && op->kind != GDN_STEP_VERIFY) return GDN_ESTEP_KIND;
    if (op->kind == GDN_STEP_DECODE ? op->tokens != 1 : (op->tokens < 1 || op->tokens > op->max_tokens))
        return GDN_ESTEP_TOKENS;
    if (op->batch < 0 || op->batch > op->max_batch) return GDN_ESTEP_BATCH;
    if (!op->q.data || !op->k.data || !op->v.data || !op->a.data || !op->b.data || !op->o.data || !op->A_log ||
        !op->dt_bias || !op->read_slots)
        return GDN_EINVAL;
    if ((status = check_memory(op)) != GDN_OK) return status;
    *layout = layout_of(op);
    *p = base_params(op, layout, op->batch, op->tokens, op->kind == GDN_STEP_VERIFY, op->read_slots);
    p->write_slots = op->write_slots;
    gdn__layer_params_views(p, &op->q, &op->k, &op->v, &op->a, &op->b, &op->o);
    return GDN_OK;
}

/* The backend's layer step (the CPU one runs on the workspace's scratch). */
static gdn_status run_layer(const gdn_op_layer *op, const gdn__layer_params *p, const op_layout *layout, void *stream)
{
    if (op->backend == GDN_BACKEND_CPU) {
        gdn__ref_layer_step_in(p, (char *)op->workspace + layout->scratch);
        return GDN_OK;
    }
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_layer_step(p, stream);
#else
    (void)stream;
    return GDN_ENODEV;
#endif
}

gdn_status gdn_op_layer_step(const gdn_op_layer *op, void *stream)
{
    gdn__layer_params p;
    op_layout layout;
    const gdn_status status = prepare(op, &p, &layout);
    return status == GDN_OK ? run_layer(op, &p, &layout, stream) : status;
}

gdn_status gdn_op_commit(const gdn_op_layer *op, const int32_t *accepted, void *stream)
{
    gdn__layer_params p;
    op_layout layout;
    const gdn_status status = prepare(op, &p, &layout);
    if (status != GDN_OK) return status;
    if (op->kind != GDN_STEP_VERIFY) return GDN_ESTEP_KIND;
    if (!accepted) return GDN_EINVAL;
    const gdn__commit_params c = {
        .B = p.B,
        .T = p.T,
        .num_layers = 1,
        .HV = p.HV,
        .K = p.K,
        .V = p.V,
        .state_dtype = p.state_dtype,
        .state = p.state,
        .num_slots = p.num_slots,
        .slot_stride = p.slot_stride,
        .cache = p.cache,
        .cache_row_stride = p.cache_row_stride,
        .read_slots = p.read_slots,
        .write_slots = p.write_slots,
        .accepted = accepted,
        .error_flag = p.error_flag,
        .pending = p.pending,
        .ring_count = p.ring_count,
    };
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

/* ---------------------------------------------------------------------------------------------- */
/* Flush and slot operations                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* The description without a step: what slot operations need (pool, workspace, strategy). */
static gdn_status prepare_slots(const gdn_op_layer *op, op_layout *layout)
{
    if (!op) return GDN_EINVAL;
    gdn_status status = check_description(op);
    if (status == GDN_OK) status = check_memory(op);
    if (status == GDN_OK) *layout = layout_of(op);
    return status;
}

static gdn_status run_slot_copy(const gdn_op_layer *op, const gdn__slot_copy_params *p, void *stream)
{
    if (op->backend == GDN_BACKEND_CPU) {
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

static char *slot_state(const gdn_op_layer *op, int32_t slot)
{
    return (char *)op->pool.data + (size_t)((int64_t)slot * op->pool.slot_stride) * gdn_dtype_size(op->pool.dtype);
}
static int64_t state_bytes(const gdn_op_layer *op) { return state_elems(op) * (int64_t)gdn_dtype_size(op->pool.dtype); }
static int keeps_work(const gdn_op_layer *op) { return op->strategy != GDN_VERIFY_CACHE; }
static char *side_of(const gdn_op_layer *op, const op_layout *l, int32_t slot)
{
    return (char *)op->workspace + (op->strategy == GDN_VERIFY_REPLAY ? l->token_store : l->ring) +
           (size_t)(slot * l->side_bytes);
}
static int32_t *count_of(const gdn_op_layer *op, const op_layout *l, int32_t slot)
{
    return (int32_t *)((char *)op->workspace + l->counts) + slot;
}

/* A zero-token step of `count` rows read from `rows` (backend memory): their pending work written
 * back in place. */
static gdn_status write_back(const gdn_op_layer *op, const op_layout *layout, const int32_t *rows, int32_t count,
                             void *stream)
{
    gdn__layer_params p = base_params(op, layout, count, 0, 0, rows);
    /* T = 0 reads no token input and writes no output; the kernels still want valid pointers. */
    p.q = p.k = p.v = p.a = p.b = p.out = op->workspace;
    return run_layer(op, &p, layout, stream);
}

gdn_status gdn_op_flush(const gdn_op_layer *op, const int32_t *slots, int32_t count, void *stream)
{
    op_layout layout;
    gdn_status status = prepare_slots(op, &layout);
    if (status != GDN_OK) return status;
    if (!op->A_log || !op->dt_bias || (count > 0 && !slots)) return GDN_EINVAL;
    if (count < 0 || count > op->max_batch) return GDN_ESTEP_BATCH;
    if (!keeps_work(op) || count == 0) return GDN_OK;
    return write_back(op, &layout, slots, count, stream);
}

static gdn_status check_slot(const gdn_op_layer *op, int32_t slot)
{
    return slot < 0 || slot >= op->pool.num_slots ? GDN_ESLOT_RANGE : GDN_OK;
}

gdn_status gdn_op_slot_copy(const gdn_op_layer *op, int32_t dst, int32_t src, void *stream)
{
    op_layout l;
    gdn_status status = prepare_slots(op, &l);
    if (status == GDN_OK) status = check_slot(op, dst);
    if (status == GDN_OK) status = check_slot(op, src);
    if (status != GDN_OK) return status;
    if (dst == src) return GDN_EINVAL;
    gdn__slot_copy_params p = {.layers = 1};
    p.region[p.regions++] = (gdn__slot_region){slot_state(op, src), slot_state(op, dst), state_bytes(op), 0, 0};
    if (keeps_work(op)) {
        p.region[p.regions++] = (gdn__slot_region){side_of(op, &l, src), side_of(op, &l, dst), l.side_bytes, 0, 0};
        p.region[p.regions++] = (gdn__slot_region){count_of(op, &l, src), count_of(op, &l, dst), sizeof(int32_t), 0, 0};
    }
    return run_slot_copy(op, &p, stream);
}

gdn_status gdn_op_slot_import(const gdn_op_layer *op, int32_t slot, const void *src, void *stream)
{
    op_layout l;
    gdn_status status = prepare_slots(op, &l);
    if (status == GDN_OK) status = check_slot(op, slot);
    if (status != GDN_OK) return status;
    gdn__slot_copy_params p = {.layers = 1};
    /* src NULL: a reset (zeros) */
    p.region[p.regions++] = (gdn__slot_region){src, slot_state(op, slot), state_bytes(op), 0, 0};
    if (keeps_work(op)) p.region[p.regions++] = (gdn__slot_region){NULL, count_of(op, &l, slot), sizeof(int32_t), 0, 0};
    return run_slot_copy(op, &p, stream);
}

gdn_status gdn_op_slot_reset(const gdn_op_layer *op, int32_t slot, void *stream)
{
    return gdn_op_slot_import(op, slot, NULL, stream);
}

gdn_status gdn_op_slot_export(const gdn_op_layer *op, int32_t slot, void *dst, void *stream)
{
    op_layout l;
    gdn_status status = prepare_slots(op, &l);
    if (status == GDN_OK) status = check_slot(op, slot);
    if (status != GDN_OK) return status;
    if (!dst || (keeps_work(op) && (!op->A_log || !op->dt_bias))) return GDN_EINVAL;
    if (keeps_work(op)) { /* write the slot's pending work back first: its row set by a launch */
        int32_t *row = (int32_t *)((char *)op->workspace + l.flush_row);
        const gdn__slot_copy_params set = {.layers = 1, .set_at = row, .set_value = slot};
        status = run_slot_copy(op, &set, stream);
        if (status == GDN_OK) status = write_back(op, &l, row, 1, stream);
        if (status != GDN_OK) return status;
    }
    gdn__slot_copy_params p = {.layers = 1};
    p.region[p.regions++] = (gdn__slot_region){slot_state(op, slot), dst, state_bytes(op), 0, 0};
    return run_slot_copy(op, &p, stream);
}
