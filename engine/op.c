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
            at = align256(at + slots * op->max_tokens * gdn__token_elems(HK, HV, K, V) * in_size);
        } else {
            l.ring_length = op->ring_length ? op->ring_length : GDN_DEFAULT_RING_LENGTH;
            l.ring_capacity = l.ring_length > op->max_tokens ? l.ring_length : op->max_tokens;
            l.ring = at;
            at = align256(at + slots * l.ring_capacity * gdn__ring_record_bytes(HK, HV, K, V));
        }
        l.counts = at;
        at = align256(at + slots * (int64_t)sizeof(int32_t));
        l.arrivals = at;
        at = align256(at + op->max_batch * (int64_t)sizeof(uint32_t));
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

static gdn__strides strides_of(const gdn_view *v, int32_t T, int32_t H, int32_t D)
{
    if (v->row_stride == 0 && v->token_stride == 0 && v->head_stride == 0) return gdn__dense(T, H, D);
    return (gdn__strides){.row = v->row_stride, .token = v->token_stride, .head = v->head_stride};
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
    const int32_t HK = op->model.num_k_heads, HV = op->model.num_v_heads, K = op->model.head_dim_k,
                  V = op->model.head_dim_v;
    if (!op->q.data || !op->k.data || !op->v.data || !op->a.data || !op->b.data || !op->o.data || !op->A_log ||
        !op->dt_bias || !op->pool.data || !op->read_slots || !op->workspace ||
        op->pool.slot_stride < (int64_t)HV * V * K)
        return GDN_EINVAL;
#ifndef GDN_HAVE_CUDA
    if (op->backend == GDN_BACKEND_CUDA) return GDN_ENODEV;
#endif
    *layout = layout_of(op);
    const int32_t T = op->tokens;
    char *ws = op->workspace;
    *p = (gdn__layer_params){
        .B = op->batch,
        .T = T,
        .HK = HK,
        .HV = HV,
        .K = K,
        .V = V,
        .scale = op->model.scale > 0.0f ? op->model.scale : 1.0f / sqrtf((float)K),
        .use_qk_l2norm = op->model.use_qk_l2norm,
        .input_dtype = op->input_dtype,
        .q = op->q.data,
        .k = op->k.data,
        .v = op->v.data,
        .a = op->a.data,
        .b = op->b.data,

        .A_log = op->A_log,
        .dt_bias = op->dt_bias,
        .state_dtype = op->pool.dtype,
        .state = op->pool.data,
        .num_slots = op->pool.num_slots,
        .slot_stride = op->pool.slot_stride,
        .read_slots = op->read_slots,
        .write_slots = op->write_slots,
        .output_dtype = op->output_dtype,
        .out = op->o.data,
        .error_flag = op->error_flag,
    };
    p->q_strides = strides_of(&op->q, T, HK, K);
    p->k_strides = strides_of(&op->k, T, HK, K);
    p->v_strides = strides_of(&op->v, T, HV, V);
    p->a_strides = strides_of(&op->a, T, HV, 1);
    p->b_strides = strides_of(&op->b, T, HV, 1);
    p->out_strides = strides_of(&op->o, T, HV, V);
    const int verify = op->kind == GDN_STEP_VERIFY;
    if (op->strategy == GDN_VERIFY_CACHE) {
        if (verify) p->cache = ws + layout->cache, p->cache_row_stride = layout->cache_row_stride;
    } else if (op->strategy == GDN_VERIFY_REPLAY) {
        p->token_store = ws + layout->token_store;
        p->store_tokens = op->max_tokens;
        p->pending = (int32_t *)(ws + layout->counts);
        p->replay_verify = verify;
        p->arrivals = (uint32_t *)(ws + layout->arrivals);
    } else {
        p->ring = ws + layout->ring;
        p->ring_capacity = layout->ring_capacity;
        p->ring_length = layout->ring_length;
        p->ring_count = (int32_t *)(ws + layout->counts);
        p->replay_verify = verify;
        p->arrivals = (uint32_t *)(ws + layout->arrivals);
    }
    return GDN_OK;
}

gdn_status gdn_op_layer_step(const gdn_op_layer *op, void *stream)
{
    gdn__layer_params p;
    op_layout layout;
    const gdn_status status = prepare(op, &p, &layout);
    if (status != GDN_OK) return status;
    if (op->backend == GDN_BACKEND_CPU) {
        gdn__ref_layer_step_in(&p, (char *)op->workspace + layout.scratch);
        return GDN_OK;
    }
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_layer_step(&p, stream);
#else
    (void)stream;
    return GDN_ENODEV;
#endif
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
