/*
 * The engine: owns the configuration, the backend, the slot table and every buffer, and turns the
 * public step calls into backend kernel launches. Everything is allocated in gdn_engine_create; the
 * step path (begin_step, run_layer, commit) only validates on the host, stages slot indices and
 * enqueues work. Policy lives here; backends (backend_cpu.c, backend_cuda.c) only run it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "backend_impl.h"
#include "config.h"
#include "graphs/graph_cache.h"
#include "kernels/ref/gdn_ref.h"
#include "op_impl.h"
#include "slots.h"

/* One step as the engine remembers it between begin_step and the next begin_step. */
typedef struct step_state {
    int active;             /* begin_step succeeded */
    gdn_step_kind kind;
    int32_t tokens;
    int32_t batch;          /* rows the caller gave */
    int32_t bucket;         /* padded rows the kernels run */
    int32_t bucket_index;   /* position of bucket in the bucket list */
    int32_t variant;        /* GDN__VARIANT_* bits: the step has token counts / parents (verify only) */
    int rows_fetched;       /* the step's first work (the device copy of its rows) was launched */
    int32_t layers_done;    /* distinct layers run */
    int committed;
    int caller_work;        /* GDN_STEP_CALLER_WORK: the caller enqueues the work; bookkeeping done */
} step_state;

struct gdn_engine {
    gdn_engine_config config; /* resolved: buckets and scale filled in */
    gdn__backend backend;
    gdn__slot_table slots;

    /* Backend memory. Every layer is an op of the op layer (op_impl.h): the stack holds layer 0's
     * description (pool, workspace, rows, strategy) and the strides to the others. */
    gdn__op_stack stack;
    void *state;                /* the pools: [L] at stack.pool_layer_stride, slots at pool.slot_stride */
    void *workspaces;           /* [L] strategy workspaces of stack.workspace_layer_bytes */
    void *io_block;             /* every layer's q, k, v, a, b, o (unless the caller's views) */
    float *params;              /* [L][2][HV]: A_log then dt_bias */
    int32_t *indices;           /* the step's staged block [staged_capacity] (for a step of bucket
                                 * B and T tokens: read slots [B], write slots [B], token counts
                                 * [B], parents [B][T]), accepted [max_batch], error flag [1],
                                 * flush row [1] */

    gdn_layer_io *io;     /* host [L] */
    /* The mixer (SPEC 6; config.mixer), when on: each layer's description (its weights in
     * mixer_weights, its conv pool at conv + l * stack.conv_layer_stride elements). */
    gdn_mixer *mixers;    /* host [L], NULL without the mixer */
    void *conv;           /* the conv pools (the engine's, or config.mixer.conv_pool.data) */
    int owns_conv;
    void *mixer_weights;  /* [L] blocks of mixer_layer_bytes: conv weight, conv bias, norm weight */
    size_t mixer_layer_bytes, conv_bias_at, norm_weight_at;
    gdn_layer_views *views; /* host [L]: the step tensors (the caller's io views, or dense views of io) */
    int owns_state;       /* the pools are the engine's (not config.state_pool) */
    uint8_t *layer_ran;   /* host [L] */
    int32_t *row_staging; /* host [staged_capacity]: the step's staged block, as uploaded */
    int32_t *clear_list;  /* fold, ring: host [num_slots]: freed slots whose counts the next step clears */
    uint8_t *clear_flag;  /* fold, ring: host [num_slots]: in clear_list */
    int32_t clear_count;
    step_state step;
    void *last_stream;       /* the stream of the engine's last enqueued work (synchronous calls order after it) */
    int enqueued_any;        /* last_stream is set */
    int after_fetch;         /* the engine's last enqueue or record was the rows' fetch: the next layer
                              * kernel reads the rows it wrote, so it waits for it before any read */

    /* Step graphs (backends with graph support, graph_mode != OFF). */
    gdn__graph_cache graphs;
    int use_graphs;
    int capturing;           /* inside a capture: run_layer and commit record into it */
    gdn__graph_key capture_key;
    uint8_t *capture_ran;    /* host [L]: layers recorded in the current capture */
    int32_t capture_layers;
    int capture_committed;
    gdn_memory_report memory;
};

/* ---------------------------------------------------------------------------------------------- */
/* Helpers                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

/* The staged block of a step of `bucket` rows and T tokens: read slots at the start, then write
 * slots, token counts and parents [bucket][T], so that one upload of the block's used prefix
 * (2 * bucket values for a plain step) sets them all, at addresses fixed per (bucket, T) that a
 * captured graph bakes in. The largest block (max_batch rows, max_tokens tokens) comes first in the
 * index block. */
static int64_t staged_capacity(const gdn_engine_config *c)
{
    return 3 * (int64_t)c->max_batch + (int64_t)c->max_batch * c->max_tokens;
}
static int32_t staged_values(int32_t bucket, int32_t tokens, int32_t variant)
{
    if (variant & GDN__VARIANT_PARENTS) return 3 * bucket + bucket * tokens;
    return variant & GDN__VARIANT_COUNTS ? 3 * bucket : 2 * bucket;
}
static int32_t *read_slots_buffer(const gdn_engine *e) { return e->indices; }
static int32_t *write_slots_buffer(const gdn_engine *e, int32_t bucket) { return e->indices + bucket; }
static int32_t *token_counts_buffer(const gdn_engine *e, int32_t bucket) { return e->indices + 2 * bucket; }
static int32_t *parents_buffer(const gdn_engine *e, int32_t bucket) { return e->indices + 3 * bucket; }
static int32_t *accepted_buffer(const gdn_engine *e) { return e->indices + staged_capacity(&e->config); }
static int32_t *error_flag_buffer(const gdn_engine *e) { return accepted_buffer(e) + e->config.max_batch; }
static int32_t *flush_row_buffer(const gdn_engine *e) { return accepted_buffer(e) + e->config.max_batch + 1; }
static int fold(const gdn_engine *e) { return e->config.verify_strategy == GDN_VERIFY_FOLD; }
static int ring(const gdn_engine *e) { return e->config.verify_strategy == GDN_VERIFY_RING; }
/* The mixer's conv is on: every slot has a conv window per layer. */
static int has_conv(const gdn_engine *e) { return e->config.mixer.conv_width > 0; }
/* Fold and ring keep per-slot counts of tokens that are not in the pool yet. */
static int keeps_tokens(const gdn_engine *e) { return fold(e) || ring(e); }
/* Work was enqueued on `stream`: the synchronous calls order themselves after it. */
static gdn_status enqueued_on(gdn_engine *e, void *stream, gdn_status status)
{
    if (status == GDN_OK) e->last_stream = stream, e->enqueued_any = 1;
    return status;
}

/* Fold, ring: the slot's count of pending tokens or records in `layer`. */
static int32_t *slot_count(const gdn_engine *e, int32_t slot, int32_t layer)
{
    return gdn__op_slot_count(&e->stack, slot) + layer * gdn__op_counts_layer_stride(&e->stack);
}

static size_t align_up(size_t bytes) { return (bytes + 255u) & ~(size_t)255u; }

static gdn_status backend_alloc(gdn_engine *e, size_t bytes, void **out, uint64_t *counter)
{
    gdn_status status = e->backend.iface->alloc(e->backend.ctx, bytes, out);
    if (status == GDN_OK) {
        *counter += bytes;
        e->memory.total += bytes;
    }
    return status;
}

static int64_t state_elems_per_slot(const gdn_engine_config *c)
{
    return (int64_t)c->model.num_v_heads * c->model.head_dim_v * c->model.head_dim_k;
}

#ifndef GDN_HAVE_CUDA
/* This build has no CUDA backend: asking for it is the same as having no GPU. */
gdn_status gdn__backend_cuda_create(int32_t device, size_t staging_bytes, gdn__backend *out)
{
    (void)device, (void)staging_bytes, (void)out;
    return GDN_ENODEV;
}
#endif

static gdn_status create_backend(const gdn_engine_config *c, size_t staging_bytes, gdn__backend *out)
{
    /* The CPU reference's scratch for the mixer's conv (config.c checked that it fits). */
    const size_t mixer_scratch = c->mixer.conv_width > 0 ? gdn__ref_mixer_scratch_bytes((int32_t)gdn__conv_dim(&c->model),
                                                                                      c->mixer.conv_width,
                                                                                      gdn__mixer_scratch_tokens(c))
                                                         : 0;
    switch (c->backend) {
    case GDN_BACKEND_CPU: return gdn__backend_cpu_create_scratch(staging_bytes, mixer_scratch, out);
    case GDN_BACKEND_CUDA: return gdn__backend_cuda_create(c->device, staging_bytes, out);
    case GDN_BACKEND_AUTO: {
        gdn_status status = gdn__backend_cuda_create(c->device, staging_bytes, out);
        return status == GDN_ENODEV ? gdn__backend_cpu_create_scratch(staging_bytes, mixer_scratch, out) : status;
    }
    }
    return GDN_ECONFIG_BACKEND;
}

/* Carves every layer's q, k, v (with the mixer's conv: x instead), a, b, o (and the norm's z) out of
 * one allocation. */
static gdn_status allocate_io(gdn_engine *e)
{
    const gdn_engine_config *c = &e->config;
    const size_t rows = (size_t)c->max_batch * (size_t)c->max_tokens;
    const size_t in = gdn_dtype_size(c->input_dtype), out = gdn_dtype_size(c->output_dtype);
    const size_t HK = (size_t)c->model.num_k_heads, HV = (size_t)c->model.num_v_heads;
    const size_t K = (size_t)c->model.head_dim_k, V = (size_t)c->model.head_dim_v;
    const size_t qk_bytes = align_up(rows * HK * K * in);
    const size_t v_bytes = align_up(rows * HV * V * in);
    const size_t gate_bytes = align_up(rows * HV * in);
    const size_t o_bytes = align_up(rows * HV * V * out);
    const int conv = c->mixer.conv_width > 0;
    const size_t x_bytes = conv ? align_up(rows * (size_t)gdn__conv_dim(&c->model) * in) : 0;
    const size_t z_bytes = c->mixer.use_norm ? align_up(rows * HV * V * in) : 0;
    const size_t per_layer = (conv ? x_bytes : 2 * qk_bytes + v_bytes) + 2 * gate_bytes + o_bytes + z_bytes;
    gdn_status status = backend_alloc(e, per_layer * (size_t)c->model.num_layers, &e->io_block,
                                      &e->memory.io_buffers);
    if (status != GDN_OK) return status;
    for (int32_t l = 0; l < c->model.num_layers; l++) {
        char *p = (char *)e->io_block + (size_t)l * per_layer;
        gdn_layer_io *io = &e->io[l];
        if (conv) {
            io->x = p, p += x_bytes;
        } else {
            io->q = p, p += qk_bytes;
            io->k = p, p += qk_bytes;
            io->v = p, p += v_bytes;
        }
        io->a = p, p += gate_bytes;
        io->b = p, p += gate_bytes;
        io->o = p, p += o_bytes;
        if (z_bytes) io->z = p;
    }
    return GDN_OK;
}

/* The mixer (config.mixer): every layer's conv pool (the engine's, dense and zeroed, or the
 * caller's), its weights (zero until gdn_engine_set_mixer_params) and its gdn_mixer description; the
 * stack's layer 0 carries layer 0's, with the conv pools' layer stride. */
static gdn_status allocate_mixer(gdn_engine *e)
{
    const gdn_engine_config *c = &e->config;
    const gdn_mixer_config *mc = &c->mixer;
    if (!gdn__config_mixer_on(c)) return GDN_OK;
    const int32_t L = c->model.num_layers, W = mc->conv_width;
    const int64_t C = gdn__conv_dim(&c->model);
    const size_t in = gdn_dtype_size(c->input_dtype), wsize = gdn_dtype_size(mc->conv_weight_dtype);
    int64_t slot = 0, token = 0, channel = 0, layer = 0;
    gdn_status status;
    e->mixers = gdn__calloc((size_t)L, sizeof *e->mixers);
    if (!e->mixers) return GDN_ENOMEM;
    if (W > 0) {
        gdn__conv_pool_strides(c, &slot, &token, &channel, &layer);
        if (mc->conv_pool.data) {
            e->conv = mc->conv_pool.data;
            token = mc->conv_pool.token_stride, channel = mc->conv_pool.channel_stride; /* as given (0, 0: dense) */
        } else {
            status = backend_alloc(e, (size_t)(layer * L) * in, &e->conv, &e->memory.conv_pools);
            if (status != GDN_OK) return status;
            e->owns_conv = 1;
            token = channel = 0; /* dense */
        }
    }
    /* One block a layer: conv weight [C][W], conv bias [C], norm weight [V]. */
    const size_t weight_bytes = W > 0 ? align_up((size_t)(C * W) * wsize) : 0, bias_bytes = W > 0 ? align_up((size_t)C * wsize) : 0;
    e->conv_bias_at = weight_bytes;
    e->norm_weight_at = weight_bytes + bias_bytes;
    e->mixer_layer_bytes = e->norm_weight_at + (mc->use_norm ? align_up((size_t)c->model.head_dim_v * sizeof(float)) : 0);
    status = backend_alloc(e, e->mixer_layer_bytes * (size_t)L, &e->mixer_weights, &e->memory.parameters);
    if (status != GDN_OK) return status;
    for (int32_t l = 0; l < L; l++) {
        char *block = (char *)e->mixer_weights + (size_t)l * e->mixer_layer_bytes;
        e->mixers[l] = (gdn_mixer){
            .conv_width = W,
            .conv_weight_dtype = mc->conv_weight_dtype,
            .conv_weight = W > 0 ? block : NULL,
            .conv_bias = W > 0 ? block + e->conv_bias_at : NULL, /* zeros until set: no bias */
            .conv = {W > 0 ? (char *)e->conv + (size_t)(l * layer) * in : NULL, slot, token, channel},
            .norm_weight = mc->use_norm ? (const float *)(block + e->norm_weight_at) : NULL,
            .norm_eps = mc->norm_eps,
        };
    }
    e->stack.op.mixer = &e->mixers[0];
    e->stack.conv_layer_stride = layer;
    return GDN_OK;
}

static gdn_status allocate_everything(gdn_engine *e)
{
    const gdn_engine_config *c = &e->config;
    const int32_t L = c->model.num_layers, HV = c->model.num_v_heads;
    const size_t state_size = gdn_dtype_size(c->state_dtype);
    gdn_status status;

    e->io = gdn__calloc((size_t)L, sizeof *e->io);
    e->layer_ran = gdn__calloc((size_t)L, sizeof *e->layer_ran);
    e->row_staging = gdn__calloc((size_t)staged_capacity(c), sizeof *e->row_staging);
    e->capture_ran = gdn__calloc((size_t)L, sizeof *e->capture_ran);
    if (!e->io || !e->layer_ran || !e->row_staging || !e->capture_ran) return GDN_ENOMEM;
    if (keeps_tokens(e)) {
        e->clear_list = gdn__calloc((size_t)c->num_slots, sizeof *e->clear_list);
        e->clear_flag = gdn__calloc((size_t)c->num_slots, sizeof *e->clear_flag);
        if (!e->clear_list || !e->clear_flag) return GDN_ENOMEM;
    }
    e->use_graphs = e->backend.iface->graph_launch != NULL && c->graph_mode != GDN_GRAPHS_OFF;
    if (e->use_graphs && (status = gdn__graph_cache_init(&e->graphs, c->num_buckets, c->max_tokens)) != GDN_OK)
        return status;
    if ((status = gdn__slots_init(&e->slots, c->num_slots)) != GDN_OK) return status;

    const size_t index_values = (size_t)staged_capacity(c) + (size_t)c->max_batch + 2; /* + accepted, flag, flush row */
    status = backend_alloc(e, index_values * sizeof(int32_t), (void **)&e->indices, &e->memory.indices);
    if (status != GDN_OK) return status;
    int64_t slot_stride, layer_stride;
    if (c->state_pool) { /* the caller's pools */
        slot_stride = c->state_slot_stride ? c->state_slot_stride : state_elems_per_slot(c);
        layer_stride = c->state_layer_stride ? c->state_layer_stride : slot_stride * c->num_slots;
        e->state = c->state_pool;
    } else {
        slot_stride = state_elems_per_slot(c);
        layer_stride = slot_stride * c->num_slots;
        status = backend_alloc(e, (size_t)(layer_stride * L) * state_size, &e->state, &e->memory.state_pools);
        if (status != GDN_OK) return status;
        e->owns_state = 1;
    }

    /* Layer 0 as an op; the strategy's workspaces, one a layer, in one allocation. */
    e->stack.op = (gdn_op_layer){
        .backend = e->backend.iface->kind,
        .model = c->model,
        .input_dtype = c->input_dtype,
        .output_dtype = c->output_dtype,
        .pool = {e->state, c->state_dtype, c->num_slots, slot_stride},
        .read_slots = read_slots_buffer(e),
        .error_flag = error_flag_buffer(e),
        .strategy = c->verify_strategy,
        .max_batch = c->max_batch,
        .max_tokens = c->max_tokens,
        .ring_length = c->ring_length,
        .ring_write_through = c->ring_write_through,
    };
    if ((status = allocate_mixer(e)) != GDN_OK) return status; /* the layout depends on the mixer */
    e->stack.layout = gdn__op_layout_of(&e->stack.op, 0); /* the CPU backend has its own scratch */
    e->stack.num_layers = L;
    e->stack.pool_layer_stride = layer_stride;
    e->stack.workspace_layer_bytes = e->stack.layout.bytes;
    uint64_t *counter = fold(e) ? &e->memory.token_store : ring(e) ? &e->memory.ring : &e->memory.verify_cache;
    status = backend_alloc(e, (size_t)e->stack.workspace_layer_bytes * (size_t)L, &e->workspaces, counter);
    if (status != GDN_OK) return status;
    e->stack.op.workspace = e->workspaces;

    e->views = gdn__calloc((size_t)L, sizeof *e->views);
    if (!e->views) return GDN_ENOMEM;
    if (c->io_views) { /* the caller's tensors: keep a copy of the views */
        memcpy(e->views, c->io_views, (size_t)L * sizeof *e->views);
        e->config.io_views = e->views;
        for (int32_t l = 0; l < L; l++)
            e->io[l] = (gdn_layer_io){e->views[l].q.data, e->views[l].k.data, e->views[l].v.data,
                                      e->views[l].a.data, e->views[l].b.data, e->views[l].o.data,
                                      e->views[l].x.data, e->views[l].z.data};
    } else { /* the engine's buffers, as dense views (all-zero strides) */
        if ((status = allocate_io(e)) != GDN_OK) return status;
        for (int32_t l = 0; l < L; l++)
            e->views[l] = (gdn_layer_views){.q.data = e->io[l].q, .k.data = e->io[l].k, .v.data = e->io[l].v,
                                            .a.data = e->io[l].a, .b.data = e->io[l].b, .o.data = e->io[l].o,
                                            .x.data = e->io[l].x, .z.data = e->io[l].z};
    }
    return backend_alloc(e, (size_t)L * 2 * (size_t)HV * sizeof(float), (void **)&e->params, &e->memory.parameters);
}

static void release_everything(gdn_engine *e)
{
    if (e->backend.iface) {
        const gdn__backend_iface *b = e->backend.iface;
        b->synchronize(e->backend.ctx, NULL);
        for (int32_t i = 0; i < gdn__graph_cache_size(&e->graphs); i++) {
            gdn__graph_entry *entry = gdn__graph_cache_entry_at(&e->graphs, i);
            if (entry->exec) b->graph_destroy(e->backend.ctx, entry->exec);
        }
        if (e->owns_state) b->free(e->backend.ctx, e->state);
        if (e->owns_conv) b->free(e->backend.ctx, e->conv);
        b->free(e->backend.ctx, e->mixer_weights);
        b->free(e->backend.ctx, e->workspaces);
        b->free(e->backend.ctx, e->io_block);
        b->free(e->backend.ctx, e->params);
        b->free(e->backend.ctx, e->indices);
        b->destroy(e->backend.ctx);
    }
    gdn__graph_cache_release(&e->graphs);
    gdn__slots_release(&e->slots);
    gdn__free(e->capture_ran);
    gdn__free(e->clear_list);
    gdn__free(e->clear_flag);
    gdn__free(e->io);
    gdn__free(e->mixers);
    gdn__free(e->views);
    gdn__free(e->layer_ran);
    gdn__free(e->row_staging);
}

static gdn_status capture_all_graphs(gdn_engine *e);
static gdn_status begin_synchronous(gdn_engine *e, void **stream);
static gdn_status end_synchronous(gdn_engine *e, void *stream, gdn_status status);

/* ---------------------------------------------------------------------------------------------- */
/* Lifecycle                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

gdn_status gdn_engine_create(const gdn_engine_config *config, gdn_engine **out)
{
    if (!config || !out) return GDN_EINVAL;
    gdn_engine_config resolved;
    gdn_status status = gdn__config_resolve(config, &resolved);
    if (status != GDN_OK) return status;

    gdn_engine *e = gdn__calloc(1, sizeof *e);
    if (!e) return GDN_ENOMEM;
    e->config = resolved;
    /* Staging: a step's block (rows, counts, parents), and (fold, ring) up to every slot as a count
     * clear. */
    const int clears = resolved.verify_strategy == GDN_VERIFY_FOLD || resolved.verify_strategy == GDN_VERIFY_RING;
    const size_t staging = (size_t)staged_capacity(&resolved) + (clears ? (size_t)resolved.num_slots : 0);
    status = create_backend(&resolved, staging * sizeof(int32_t), &e->backend);
    if (status == GDN_OK && gdn__config_mixer_on(&resolved) && e->backend.iface->kind == GDN_BACKEND_CUDA &&
        !gdn__cuda_mixer_runs(resolved.model.head_dim_k))
        status = GDN_ENOTSUP;
    if (status == GDN_OK) status = allocate_everything(e);
    if (status == GDN_OK) /* the zero fills, enqueued on the backend's own stream */
        status = e->backend.iface->synchronize(e->backend.ctx, e->backend.iface->own_stream(e->backend.ctx));
    if (status == GDN_OK && e->use_graphs && resolved.graph_mode == GDN_GRAPHS_AT_CREATE) status = capture_all_graphs(e);
    if (status != GDN_OK) {
        release_everything(e);
        gdn__free(e);
        return status;
    }
    *out = e;
    return GDN_OK;
}

void gdn_engine_destroy(gdn_engine *engine)
{
    if (!engine) return;
    release_everything(engine);
    gdn__free(engine);
}

gdn_backend_kind gdn_engine_backend(const gdn_engine *engine)
{
    return engine ? engine->backend.iface->kind : GDN_BACKEND_AUTO;
}

const gdn_engine_config *gdn_engine_get_config(const gdn_engine *engine) { return engine ? &engine->config : NULL; }

const char *gdn_engine_last_error(const gdn_engine *engine)
{
    return engine ? engine->backend.iface->last_error(engine->backend.ctx) : "";
}

gdn_status gdn_engine_memory(const gdn_engine *engine, gdn_memory_report *report)
{
    if (!engine || !report) return GDN_EINVAL;
    *report = engine->memory;
    return GDN_OK;
}

gdn_status gdn_engine_set_layer_params(gdn_engine *e, int32_t layer, const float *A_log, const float *dt_bias)
{
    if (!e || !A_log || !dt_bias) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    const size_t HV = (size_t)e->config.model.num_v_heads;
    float *dst = e->params + (size_t)layer * 2 * HV;
    const gdn__backend_iface *b = e->backend.iface;
    void *stream = NULL;
    gdn_status status = begin_synchronous(e, &stream);
    if (status == GDN_OK) status = b->upload(e->backend.ctx, dst, A_log, HV * sizeof(float), stream);
    if (status == GDN_OK) status = b->upload(e->backend.ctx, dst + HV, dt_bias, HV * sizeof(float), stream);
    return end_synchronous(e, stream, status);
}

gdn_status gdn_engine_set_mixer_params(gdn_engine *e, int32_t layer, const void *conv_weight, const void *conv_bias,
                                       const float *norm_weight)
{
    if (!e) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    const gdn_mixer_config *mc = &e->config.mixer;
    const int conv = mc->conv_width > 0, norm = mc->use_norm != 0;
    if (conv != (conv_weight != NULL) || (!conv && conv_bias) || norm != (norm_weight != NULL)) return GDN_EINVAL;
    if (!conv && !norm) return GDN_OK; /* no mixer: nothing to set */
    const size_t wsize = gdn_dtype_size(mc->conv_weight_dtype), C = conv ? (size_t)gdn__conv_dim(&e->config.model) : 0;
    char *block = (char *)e->mixer_weights + (size_t)layer * e->mixer_layer_bytes;
    const gdn__backend_iface *b = e->backend.iface;
    void *stream = NULL;
    gdn_status status = begin_synchronous(e, &stream);
    if (status == GDN_OK && conv) status = b->upload(e->backend.ctx, block, conv_weight, C * (size_t)mc->conv_width * wsize, stream);
    if (status == GDN_OK && conv) /* no bias: zeros, so that the step's parameters never change */
        status = conv_bias ? b->upload(e->backend.ctx, block + e->conv_bias_at, conv_bias, C * wsize, stream)
                           : b->zero(e->backend.ctx, block + e->conv_bias_at, C * wsize, stream);
    if (status == GDN_OK && norm)
        status = b->upload(e->backend.ctx, block + e->norm_weight_at, norm_weight,
                           (size_t)e->config.model.head_dim_v * sizeof(float), stream);
    return end_synchronous(e, stream, status);
}

/* ---------------------------------------------------------------------------------------------- */
/* Slots and buffers                                                                                */
/* ---------------------------------------------------------------------------------------------- */

gdn_status gdn_slot_alloc(gdn_engine *e, int32_t *slot)
{
    if (!e || !slot) return GDN_EINVAL;
    return gdn__slots_alloc(&e->slots, slot);
}

/* The current step still needs its slots while a layer is left to run or a verify awaits commit. */
static int step_needs_slot(const gdn_engine *e, int32_t slot)
{
    const step_state *st = &e->step;
    if (!st->active || st->batch == 0) return 0;
    const int all_ran = st->layers_done == e->config.model.num_layers;
    if (all_ran && (st->kind == GDN_STEP_DECODE || st->committed)) return 0;
    const int32_t *reads = e->row_staging, *writes = e->row_staging + st->bucket;
    for (int32_t i = 0; i < st->batch; i++)
        if (reads[i] == slot || writes[i] == slot) return 1;
    return 0;
}

gdn_status gdn_slot_free(gdn_engine *e, int32_t slot)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = gdn__slots_check_live(&e->slots, slot);
    if (status != GDN_OK) return status;
    if (step_needs_slot(e, slot)) return GDN_ESLOT_BUSY;
    status = gdn__slots_free(&e->slots, slot);
    if (status == GDN_OK && keeps_tokens(e) && !e->clear_flag[slot]) { /* the next step clears its counts */
        e->clear_flag[slot] = 1;
        e->clear_list[e->clear_count++] = slot;
    }
    return status;
}

/* One slot's state in one layer (HV * V * K elements; a caller's pool may leave gaps between slots). */
static size_t slot_state_bytes(const gdn_engine *e)
{
    return (size_t)state_elems_per_slot(&e->config) * gdn_dtype_size(e->config.state_dtype);
}

static void *slot_state(const gdn_engine *e, int32_t layer, int32_t slot)
{
    const int64_t offset = layer * e->stack.pool_layer_stride + (int64_t)slot * e->stack.op.pool.slot_stride;
    return (char *)e->state + (size_t)offset * gdn_dtype_size(e->config.state_dtype);
}

/* Fold: the slot's state in layers [first, end) is now exactly what the pool holds (nothing
 * pending). */
static gdn_status clear_pending_layers(gdn_engine *e, int32_t slot, int32_t first, int32_t end, void *stream)
{
    gdn_status status = GDN_OK;
    for (int32_t l = first; keeps_tokens(e) && l < end && status == GDN_OK; l++)
        status = e->backend.iface->zero(e->backend.ctx, slot_count(e, slot, l), sizeof(int32_t), stream);
    return status;
}

static gdn_status clear_pending(gdn_engine *e, int32_t slot, void *stream)
{
    return clear_pending_layers(e, slot, 0, e->config.model.num_layers, stream);
}

static gdn_op_layer layer_op(const gdn_engine *e, int32_t layer);
static void rows_consumed(gdn_engine *e);

/* A stream that a capture the engine did not start is recording: engine-tracked calls refuse it. */
static int caller_capturing(const gdn_engine *e, void *stream)
{
    const gdn__backend_iface *b = e->backend.iface;
    return !e->capturing && b->stream_capturing && b->stream_capturing(e->backend.ctx, stream);
}

/* The synchronous calls (parameters, state reads and writes) run on the backend's own stream,
 * ordered after the engine's last enqueued work and waited for alone: no legacy-stream or device
 * synchronisation stalls the caller's other streams. Refused while the stream of that last work is
 * being captured (the ordering would land in the caller's graph). */
static gdn_status begin_synchronous(gdn_engine *e, void **stream)
{
    const gdn__backend_iface *b = e->backend.iface;
    *stream = b->own_stream(e->backend.ctx);
    if (!e->enqueued_any) return GDN_OK;
    if (caller_capturing(e, e->last_stream)) return GDN_EMISUSE;
    return b->order_after(e->backend.ctx, e->last_stream);
}

static gdn_status end_synchronous(gdn_engine *e, void *stream, gdn_status status)
{
    return status == GDN_OK ? e->backend.iface->synchronize(e->backend.ctx, stream) : status;
}

/* Fold, ring: a zero-token step of `layer` over the one row in the flush row buffer: that slot's
 * pending tokens or records written into its state in place. */
static gdn_status write_back_flush_row(gdn_engine *e, int32_t layer, void *stream)
{
    const gdn_op_layer op = layer_op(e, layer);
    const gdn__layer_params p = gdn__op_write_back_params(&op, &e->stack.layout, flush_row_buffer(e), 1);
    return e->backend.iface->layer_step(e->backend.ctx, &p, stream);
}

/* Fold, ring: writes the slot's pending tokens or records of one layer into that layer's state (a
 * zero-token step of the one slot), enqueued on `stream`. Layers keep their own pending counts, so
 * the others stay as they are. */
static gdn_status flush_slot_layer(gdn_engine *e, int32_t slot, int32_t layer, void *stream)
{
    if (!keeps_tokens(e)) return GDN_OK;
    const gdn__backend_iface *b = e->backend.iface;
    gdn_status status = GDN_OK;
    if (e->clear_flag[slot]) /* freed since the last step: its pending tokens belong to the last owner */
        status = clear_pending_layers(e, slot, layer, layer + 1, stream);
    if (status == GDN_OK) status = b->upload(e->backend.ctx, flush_row_buffer(e), &slot, sizeof slot, stream);
    return status == GDN_OK ? write_back_flush_row(e, layer, stream) : status;
}

gdn_status gdn_slot_reset(gdn_engine *e, int32_t slot, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = gdn__slots_check_live(&e->slots, slot);
    if (status != GDN_OK) return status;
    /* A reset between begin and a layer would change the state that layer reads; between a verify
     * and its commit it would be lost (cache) or mixed with the accepted tokens (fold, ring). */
    if (step_needs_slot(e, slot)) return GDN_ESLOT_BUSY;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    for (int32_t l = 0; l < e->config.model.num_layers && status == GDN_OK; l++)
        status = e->backend.iface->zero(e->backend.ctx, slot_state(e, l, slot), slot_state_bytes(e), stream);
    if (status == GDN_OK) status = clear_pending(e, slot, stream);
    if (status == GDN_OK && has_conv(e)) { /* the conv windows of every layer, one launch */
        const gdn__slot_copy_params p = gdn__op_window_import_params(&e->stack, slot, NULL, 0);
        status = e->backend.iface->slot_copy(e->backend.ctx, &p, stream);
    }
    return enqueued_on(e, stream, status);
}

int gdn_slot_is_allocated(const gdn_engine *e, int32_t slot)
{
    return e && gdn__slots_check_live(&e->slots, slot) == GDN_OK;
}

int32_t gdn_slot_count(const gdn_engine *e)
{
    return e ? e->slots.num_slots - e->slots.free_count : 0;
}

/* A slot a device-side operation (or a state write) may touch: allocated and not needed by the
 * current step. */
static gdn_status check_idle_slot(const gdn_engine *e, int32_t slot)
{
    gdn_status status = gdn__slots_check_live(&e->slots, slot);
    if (status != GDN_OK) return status;
    return step_needs_slot(e, slot) ? GDN_ESLOT_BUSY : GDN_OK;
}

/* A slot whose state may be read or written now: allocated and, for a write (or any access under
 * the ring strategy), not needed by the current step: a write would change what a layer still to
 * run reads, or be lost or mixed at the commit; a ring read writes back in place the records that
 * the pending commit is about to count. */
static gdn_status check_slot_layer(const gdn_engine *e, int32_t layer, int32_t slot, int writes)
{
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    return writes || ring(e) ? check_idle_slot(e, slot) : gdn__slots_check_live(&e->slots, slot);
}

/* The mixer's conv window of `slot` in `layer` (one block of window_bytes). */
static void *slot_window(const gdn_engine *e, int32_t layer, int32_t slot)
{
    const gdn_mixer *m = &e->mixers[layer];
    return (char *)m->conv.data + (size_t)((int64_t)slot * m->conv.slot_stride) * gdn_dtype_size(e->config.input_dtype);
}
static size_t window_bytes(const gdn_engine *e)
{
    return (size_t)(e->config.mixer.conv_width - 1) * (size_t)gdn__conv_dim(&e->config.model) *
           gdn_dtype_size(e->config.input_dtype);
}

/* The slot's current state (or, with `window`, its conv window) of one layer into host memory:
 * under fold and ring both lag by the pending work, which is written back first. */
static gdn_status read_slot_layer(gdn_engine *e, int32_t layer, int32_t slot, int window, void *host_dst)
{
    gdn_status status = check_slot_layer(e, layer, slot, 0);
    void *stream = NULL;
    if (status == GDN_OK) status = begin_synchronous(e, &stream);
    if (status != GDN_OK) return status;
    status = flush_slot_layer(e, slot, layer, stream);
    if (status == GDN_OK)
        status = e->backend.iface->download(e->backend.ctx, host_dst,
                                            window ? slot_window(e, layer, slot) : slot_state(e, layer, slot),
                                            window ? window_bytes(e) : slot_state_bytes(e), stream);
    return end_synchronous(e, stream, status);
}

gdn_status gdn_slot_read_state(gdn_engine *e, int32_t layer, int32_t slot, void *host_dst)
{
    if (!e || !host_dst) return GDN_EINVAL;
    return read_slot_layer(e, layer, slot, 0, host_dst);
}

gdn_status gdn_slot_write_state(gdn_engine *e, int32_t layer, int32_t slot, const void *host_src)
{
    if (!e || !host_src) return GDN_EINVAL;
    gdn_status status = check_slot_layer(e, layer, slot, 1);
    void *stream = NULL;
    if (status == GDN_OK) status = begin_synchronous(e, &stream);
    if (status != GDN_OK) return status;
    /* Fold, ring: the written state replaces the layer's pending work too (nothing to fold); with
     * the mixer's conv that work is written back first, so that the window is the slot's current one. */
    if (has_conv(e)) status = flush_slot_layer(e, slot, layer, stream);
    if (status == GDN_OK) status = clear_pending_layers(e, slot, layer, layer + 1, stream);
    if (status == GDN_OK)
        status = e->backend.iface->upload(e->backend.ctx, slot_state(e, layer, slot), host_src, slot_state_bytes(e), stream);
    return end_synchronous(e, stream, status);
}

gdn_status gdn_engine_state_pool(gdn_engine *e, int32_t layer, gdn_state_pool *pool)
{
    if (!e || !pool) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    pool->data = slot_state(e, layer, 0);
    pool->dtype = e->config.state_dtype;
    pool->num_slots = e->config.num_slots;
    pool->slot_stride = e->stack.op.pool.slot_stride;
    return GDN_OK;
}

gdn_status gdn_slot_read_conv_state(gdn_engine *e, int32_t layer, int32_t slot, void *host_dst)
{
    if (!e || !host_dst || !has_conv(e)) return GDN_EINVAL;
    return read_slot_layer(e, layer, slot, 1, host_dst);
}

gdn_status gdn_slot_write_conv_state(gdn_engine *e, int32_t layer, int32_t slot, const void *host_src)
{
    if (!e || !host_src || !has_conv(e)) return GDN_EINVAL;
    gdn_status status = check_slot_layer(e, layer, slot, 1);
    void *stream = NULL;
    if (status == GDN_OK) status = begin_synchronous(e, &stream);
    if (status != GDN_OK) return status;
    status = flush_slot_layer(e, slot, layer, stream); /* the state is current; the window then replaced */
    if (status == GDN_OK)
        status = e->backend.iface->upload(e->backend.ctx, slot_window(e, layer, slot), host_src, window_bytes(e), stream);
    return end_synchronous(e, stream, status);
}

gdn_status gdn_engine_conv_pool(gdn_engine *e, int32_t layer, gdn_conv_pool *pool)
{
    if (!e || !pool || !has_conv(e)) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    *pool = e->mixers[layer].conv;
    return GDN_OK;
}

gdn_status gdn_engine_layer_io(gdn_engine *e, int32_t layer, gdn_layer_io *io)
{
    if (!e || !io) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    *io = e->io[layer];
    return GDN_OK;
}

int32_t *gdn_engine_accepted(gdn_engine *e) { return e ? accepted_buffer(e) : NULL; }

gdn_status gdn_engine_upload(gdn_engine *e, void *dst, const void *src, size_t bytes, void *stream)
{
    if (!e || !dst || !src) return GDN_EINVAL;
    return enqueued_on(e, stream, e->backend.iface->upload(e->backend.ctx, dst, src, bytes, stream));
}

gdn_status gdn_engine_download(gdn_engine *e, void *dst, const void *src, size_t bytes, void *stream)
{
    if (!e || !dst || !src) return GDN_EINVAL;
    return enqueued_on(e, stream, e->backend.iface->download(e->backend.ctx, dst, src, bytes, stream));
}

gdn_status gdn_engine_synchronize(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    return e->backend.iface->synchronize(e->backend.ctx, stream);
}

gdn_status gdn_engine_check_device_error(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    const gdn__backend_iface *b = e->backend.iface;
    int32_t flag = 0;
    gdn_status status = b->download(e->backend.ctx, &flag, error_flag_buffer(e), sizeof flag, stream);
    if (status == GDN_OK) status = b->synchronize(e->backend.ctx, stream);
    if (status != GDN_OK) return status;
    if (!flag) return GDN_OK;
    status = b->zero(e->backend.ctx, error_flag_buffer(e), sizeof flag, stream);
    if (status == GDN_OK) status = b->synchronize(e->backend.ctx, stream);
    return status == GDN_OK ? GDN_EDEVICE : status;
}

/* ---------------------------------------------------------------------------------------------- */
/* Steps                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

static int32_t bucket_index_of(const gdn_engine_config *c, int32_t bucket)
{
    for (int32_t i = 0; i < c->num_buckets; i++)
        if (c->buckets[i] == bucket) return i;
    return -1;
}

/* A step's token counts and parents (gdn_step), checked on the host so that the device never meets
 * a bad one from the engine: GDN_OK with *variant set, or the refusal. */
static gdn_status check_counts_and_parents(const gdn_step *step, int32_t *variant)
{
    *variant = (step->token_counts ? GDN__VARIANT_COUNTS : 0) | (step->parents ? GDN__VARIANT_PARENTS : 0);
    if (!*variant) return GDN_OK;
    if (step->kind == GDN_STEP_DECODE) return step->token_counts ? GDN_ESTEP_TOKENS : GDN_ESTEP_PARENTS;
    const int32_t T = step->tokens;
    for (int32_t i = 0; i < step->batch; i++) {
        if (step->slots[i] < 0) continue; /* padding rows ignore theirs */
        const int32_t n = step->token_counts ? step->token_counts[i] : T;
        if (n < 1 || n > T) return GDN_ESTEP_TOKENS;
        for (int32_t t = 0; step->parents && t < n; t++) {
            const int32_t parent = step->parents[(int64_t)i * T + t];
            if (parent < -1 || parent >= t) return GDN_ESTEP_PARENTS;
        }
    }
    return GDN_OK;
}

/* Stages the step's token counts and parents after its rows (staged_values): live rows as given;
 * padding rows, and parents past a row's count, as a full chain, so that the device reads only
 * values it would accept. */
static void stage_counts_and_parents(gdn_engine *e, const gdn_step *step, int32_t bucket, int32_t variant)
{
    if (!variant) return;
    const int32_t T = step->tokens;
    int32_t *counts = e->row_staging + 2 * bucket, *parents = e->row_staging + 3 * bucket;
    for (int32_t i = 0; i < bucket; i++) {
        const int live = i < step->batch && step->slots[i] >= 0;
        counts[i] = live && step->token_counts ? step->token_counts[i] : T;
        if (!(variant & GDN__VARIANT_PARENTS)) continue;
        for (int32_t t = 0; t < T; t++)
            parents[(int64_t)i * T + t] = live && t < counts[i] ? step->parents[(int64_t)i * T + t] : t - 1;
    }
}

gdn_status gdn_engine_begin_step(gdn_engine *e, const gdn_step *step, void *stream, int32_t *bucket_out)
{
    if (!e || !step) return GDN_EINVAL;
    if (e->capturing || (step->flags & ~GDN_STEP_CALLER_WORK) != 0) return GDN_EMISUSE;
    const gdn_engine_config *c = &e->config;
    const int caller_work = (step->flags & GDN_STEP_CALLER_WORK) != 0;
    if (step->kind != GDN_STEP_DECODE && step->kind != GDN_STEP_VERIFY) return GDN_ESTEP_KIND;
    if (step->batch < 0 || step->batch > c->max_batch) return GDN_ESTEP_BATCH;
    if (step->batch > 0 && !step->slots) return GDN_EINVAL;
    if (step->kind == GDN_STEP_VERIFY && c->max_tokens == 1) return GDN_ESTEP_KIND; /* decode only */
    if (step->kind == GDN_STEP_DECODE ? step->tokens != 1 : (step->tokens < 1 || step->tokens > c->max_tokens))
        return GDN_ESTEP_TOKENS;
    gdn_status status = gdn__slots_check_step(&e->slots, step->batch, step->slots, step->write_slots);
    if (status != GDN_OK) return status;
    int32_t variant = 0;
    if ((status = check_counts_and_parents(step, &variant)) != GDN_OK) return status;

    /* Stage the padded rows, read slots then write slots (w = r unless given), then the counts and
     * parents of a step that has them, as one upload. */
    const int32_t bucket = gdn__bucket_for(c, step->batch == 0 ? 1 : step->batch);
    int32_t *staged_read = e->row_staging, *staged_write = e->row_staging + bucket;
    for (int32_t i = 0; i < bucket; i++) {
        const int live = i < step->batch && step->slots[i] >= 0;
        staged_read[i] = live ? step->slots[i] : -1;
        staged_write[i] = live ? (step->write_slots ? step->write_slots[i] : step->slots[i]) : -1;
    }
    stage_counts_and_parents(e, step, bucket, variant);
    (void)stream; /* the rows reach the device with the step's first work (fetch_rows) */
    if (step->batch > 0 || caller_work) { /* the caller's graph fetches rows whatever the batch */
        status = e->backend.iface->stage_rows(e->backend.ctx, staged_read, staged_values(bucket, step->tokens, variant),
                                              e->clear_list, e->clear_count, !caller_work);
        if (status != GDN_OK) {
            e->step.active = 0; /* the staging may be half-written: no step can run on it */
            return status;
        }
    }

    e->step = (step_state){
        .active = 1,
        .kind = step->kind,
        .tokens = step->tokens,
        .batch = step->batch,
        .bucket = bucket,
        .bucket_index = bucket_index_of(c, bucket),
        .variant = variant,
        .caller_work = caller_work,
    };
    memset(e->layer_ran, 0, (size_t)c->model.num_layers);
    if (caller_work) { /* all bookkeeping now: the caller's work consumes the staged rows */
        rows_consumed(e);
        e->step.rows_fetched = 1;
        memset(e->layer_ran, 1, (size_t)c->model.num_layers);
        e->step.layers_done = c->model.num_layers;
        e->step.committed = step->kind == GDN_STEP_VERIFY;
    }
    if (bucket_out) *bucket_out = bucket;
    return GDN_OK;
}

/* Layer `layer` as an op: its pool, workspace and gate parameters (the step fields left to fill). */
static gdn_op_layer layer_op(const gdn_engine *e, int32_t layer)
{
    gdn_op_layer op = gdn__op_stack_layer(&e->stack, layer);
    op.A_log = e->params + (size_t)layer * 2 * (size_t)e->config.model.num_v_heads;
    op.dt_bias = op.A_log + e->config.model.num_v_heads;
    if (e->mixers) op.mixer = &e->mixers[layer];
    return op;
}

/* The step's device arrays of its variant: token counts and parents where it has them, else NULL
 * (the plain step's kernels read neither). */
static void set_variant_arrays(const gdn_engine *e, gdn_op_layer *op, int32_t bucket, int32_t variant)
{
    op->token_counts = variant & GDN__VARIANT_COUNTS ? token_counts_buffer(e, bucket) : NULL;
    op->parents = variant & GDN__VARIANT_PARENTS ? parents_buffer(e, bucket) : NULL;
}

/* A step of `bucket` rows and `tokens` tokens of one layer, on the engine's rows and tensors, to be
 * enqueued or recorded next: it overlaps the kernel before it (with launch_overlap). */
static gdn__layer_params layer_params(gdn_engine *e, int32_t layer, gdn_step_kind kind, int32_t tokens, int32_t bucket,
                                      int32_t variant)
{
    gdn_op_layer op = layer_op(e, layer);
    /* The layer after the fetch overlaps it too, reading its rows after the wait (the layer
     * kernels can; the ring's kernels read theirs before it). */
    const int after_fetch = e->after_fetch;
    op.overlap_preceding = e->config.launch_overlap && !(after_fetch && ring(e));
    e->after_fetch = 0;
    const gdn_layer_views *v = &e->views[layer];
    op.kind = kind;
    op.tokens = tokens;
    op.batch = bucket;
    op.write_slots = write_slots_buffer(e, bucket);
    set_variant_arrays(e, &op, bucket, variant);
    op.q = v->q, op.k = v->k, op.v = v->v, op.a = v->a, op.b = v->b, op.o = v->o;
    op.x = v->x, op.z = v->z; /* the mixer's (read only with its parts) */
    gdn__layer_params p = gdn__op_step_params(&op, &e->stack.layout);
    p.rows_from_preceding = after_fetch && op.overlap_preceding;
    return p;
}

/* The commit of a verify step of `bucket` rows and `tokens` tokens, every layer in one launch. A
 * tree step's accepted buffer holds nodes (gdn_op_commit_node), any other's counts. */
static gdn__commit_params commit_params(const gdn_engine *e, int32_t tokens, int32_t bucket, int32_t variant)
{
    gdn__op_stack s = e->stack;
    s.op.kind = GDN_STEP_VERIFY;
    s.op.tokens = tokens;
    s.op.batch = bucket;
    s.op.write_slots = write_slots_buffer(e, bucket);
    set_variant_arrays(e, &s.op, bucket, variant);
    s.op.overlap_preceding = e->config.launch_overlap; /* the commit waits before any access */
    gdn__commit_params c = gdn__op_commit_params(&s, accepted_buffer(e));
    c.accepted_nodes = (variant & GDN__VARIANT_PARENTS) != 0;
    return c;
}

/* Enqueues (or records) the step's first work: the staged rows to the device and, under fold,
 * the staged clears of freed slots' pending counts in every layer. `carry`: the launch carries the
 * rows (the engine's direct launches and its own graphs, whose launches set them); a caller's
 * graph replays without the engine, so its fetch reads the host ring. */
static gdn_status fetch_staged_rows(gdn_engine *e, int carry, void *stream)
{
    e->after_fetch = 1;
    return e->backend.iface->fetch_rows(e->backend.ctx, read_slots_buffer(e), keeps_tokens(e) ? slot_count(e, 0, 0) : NULL,
                                        e->config.model.num_layers, gdn__op_counts_layer_stride(&e->stack),
                                        e->config.launch_overlap, carry, stream);
}

/* The staged rows (and clears) went to the device with the work just launched. */
static void rows_consumed(gdn_engine *e)
{
    e->backend.iface->consume_rows(e->backend.ctx);
    for (int32_t c = 0; c < e->clear_count; c++) e->clear_flag[e->clear_list[c]] = 0;
    e->clear_count = 0;
}

/* Direct launches: the step's rows reach the device before its first kernel. */
static gdn_status ensure_rows(gdn_engine *e, void *stream)
{
    if (e->step.rows_fetched) return GDN_OK;
    gdn_status status = fetch_staged_rows(e, 1, stream);
    if (status != GDN_OK) return status;
    rows_consumed(e);
    e->step.rows_fetched = 1;
    return GDN_OK;
}

/* run_layer inside a capture: records the layer's launch for the shape being captured. */
static gdn_status capture_layer(gdn_engine *e, int32_t layer, void *stream)
{
    if (e->capture_ran[layer] || e->capture_committed) return GDN_EMISUSE;
    const gdn__layer_params params = layer_params(e, layer, (gdn_step_kind)e->capture_key.kind, e->capture_key.tokens,
                                                  e->capture_key.bucket, e->capture_key.variant);
    gdn_status status = e->backend.iface->layer_step(e->backend.ctx, &params, stream);
    if (status != GDN_OK) return status;
    e->capture_ran[layer] = 1;
    e->capture_layers++;
    return GDN_OK;
}

gdn_status gdn_engine_run_layer(gdn_engine *e, int32_t layer, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    if (e->capturing) return capture_layer(e, layer, stream);
    if (!e->step.active || e->step.committed || e->layer_ran[layer] || e->step.caller_work) return GDN_EMISUSE;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    if (e->step.batch > 0) { /* an empty step touches nothing */
        gdn_status status = ensure_rows(e, stream);
        if (status != GDN_OK) return status;
        const gdn__layer_params params = layer_params(e, layer, e->step.kind, e->step.tokens, e->step.bucket,
                                                      e->step.variant);
        status = enqueued_on(e, stream, e->backend.iface->layer_step(e->backend.ctx, &params, stream));
        if (status != GDN_OK) return status;
    }
    e->layer_ran[layer] = 1;
    e->step.layers_done++;
    return GDN_OK;
}

/* The work of one step: the caller's capture callback, or every layer in order. Runs directly, or
 * inside a capture (then run_layer and commit record instead of tracking the current step). */
static gdn_status step_work(gdn_engine *e, gdn_step_kind kind, int32_t tokens, int32_t bucket, void *stream)
{
    const gdn_engine_config *c = &e->config;
    if (c->capture) return c->capture(c->capture_user, e, kind, tokens, bucket, stream);
    for (int32_t l = 0; l < c->model.num_layers; l++) {
        gdn_status status = gdn_engine_run_layer(e, l, stream);
        if (status != GDN_OK) return status;
    }
    return GDN_OK;
}

/* Records the work of `key`'s shape and instantiates it into `entry` (graph_cache.h's capture). */
static gdn_status capture_graph(void *ctx, const gdn__graph_key *key, gdn__graph_entry *entry)
{
    gdn_engine *e = ctx;
    const gdn__backend_iface *b = e->backend.iface;
    void *capture_stream = NULL;
    gdn_status status = b->capture_begin(e->backend.ctx, &capture_stream);
    if (status != GDN_OK) return status;
    e->capturing = 1;
    e->capture_key = *key;
    memset(e->capture_ran, 0, (size_t)e->config.model.num_layers);
    e->capture_layers = 0;
    e->capture_committed = 0;
    if (key->kind == GDN__GRAPH_COMMIT) { /* a verify step's commit, alone */
        const gdn__commit_params p = commit_params(e, key->tokens, key->bucket, key->variant);
        status = b->commit(e->backend.ctx, &p, capture_stream);
    } else { /* a step: the copy of its rows from the host mailbox, then its work */
        status = fetch_staged_rows(e, 1, capture_stream);
        if (status == GDN_OK) status = step_work(e, (gdn_step_kind)key->kind, key->tokens, key->bucket, capture_stream);
        if (status == GDN_OK && e->capture_layers != e->config.model.num_layers) status = GDN_EMISUSE;
    }
    e->capturing = 0;
    void *graph = NULL;
    gdn_status end_status = b->capture_end(e->backend.ctx, status == GDN_OK, &graph);
    if (status != GDN_OK) return status;
    if (end_status != GDN_OK) return end_status;
    entry->exec = graph;
    entry->includes_commit = e->capture_committed;
    return GDN_OK;
}

/* GDN_GRAPHS_AT_CREATE: every (bucket, kind, T) the configuration allows. */
static gdn_status capture_all_graphs(gdn_engine *e)
{
    const gdn_engine_config *c = &e->config;
    return gdn__graph_cache_capture_all(&e->graphs, c->buckets, capture_graph, e, c->graph_progress, c->graph_progress_user);
}

gdn_status gdn_engine_run_step(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (e->capturing || !e->step.active || e->step.committed || e->step.layers_done > 0) return GDN_EMISUSE;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    step_state *st = &e->step;
    const int32_t L = e->config.model.num_layers;
    if (st->batch == 0) { /* nothing to run: an empty step touches nothing */
        memset(e->layer_ran, 1, (size_t)L);
        st->layers_done = L;
        return GDN_OK;
    }
    if (!e->use_graphs) {
        gdn_status status = ensure_rows(e, stream);
        if (status == GDN_OK) status = step_work(e, st->kind, st->tokens, st->bucket, stream);
        if (status == GDN_OK && st->layers_done != L) status = GDN_EMISUSE; /* callback skipped a layer */
        return status;
    }
    const gdn__graph_key key = gdn__graph_key_make(st->kind, st->tokens, st->bucket, st->variant);
    gdn__graph_entry *entry = NULL;
    gdn_status status = gdn__graph_cache_get(&e->graphs, &key, st->bucket_index, capture_graph, e, &entry);
    if (status != GDN_OK) return status;
    status = enqueued_on(e, stream, e->backend.iface->graph_launch(e->backend.ctx, entry->exec, stream));
    if (status != GDN_OK) return status;
    rows_consumed(e); /* the graph's first nodes fetched them */
    st->rows_fetched = 1;
    memset(e->layer_ran, 1, (size_t)L);
    st->layers_done = L;
    if (entry->includes_commit) st->committed = 1;
    return GDN_OK;
}

gdn_status gdn_engine_commit(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    const gdn_engine_config *c = &e->config;
    if (e->capturing) { /* the capture callback ends a verify graph with its commit */
        if (e->capture_key.kind != GDN_STEP_VERIFY || e->capture_committed || e->capture_layers != c->model.num_layers)
            return GDN_EMISUSE;
        const gdn__commit_params p = commit_params(e, e->capture_key.tokens, e->capture_key.bucket, e->capture_key.variant);
        gdn_status status = e->backend.iface->commit(e->backend.ctx, &p, stream);
        if (status == GDN_OK) e->capture_committed = 1;
        return status;
    }
    const int all_layers_ran = e->step.layers_done == c->model.num_layers;
    if (!e->step.active || e->step.kind != GDN_STEP_VERIFY || e->step.committed || !all_layers_ran)
        return GDN_EMISUSE;
    if (caller_capturing(e, stream)) return GDN_EMISUSE;
    if (e->step.batch > 0 && e->use_graphs) { /* a one-node graph: cheaper to launch than the kernel */
        const gdn__graph_key key = gdn__graph_key_make(GDN__GRAPH_COMMIT, e->step.tokens, e->step.bucket, e->step.variant);
        gdn__graph_entry *entry = NULL;
        gdn_status status = gdn__graph_cache_get(&e->graphs, &key, e->step.bucket_index, capture_graph, e, &entry);
        if (status != GDN_OK) return status;
        status = enqueued_on(e, stream, e->backend.iface->graph_launch(e->backend.ctx, entry->exec, stream));
        if (status != GDN_OK) return status;
    } else if (e->step.batch > 0) {
        const gdn__commit_params p = commit_params(e, e->step.tokens, e->step.bucket, e->step.variant);
        gdn_status status = enqueued_on(e, stream, e->backend.iface->commit(e->backend.ctx, &p, stream));
        if (status != GDN_OK) return status;
    }
    e->step.committed = 1;
    return GDN_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Caller-owned work (GDN_STEP_CALLER_WORK): pure enqueues for the begun step's shape                 */
/* ---------------------------------------------------------------------------------------------- */

static int caller_work_step(const gdn_engine *e) { return !e->capturing && e->step.active && e->step.caller_work; }

gdn_status gdn_engine_enqueue_rows(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (!caller_work_step(e)) return GDN_EMISUSE;
    return enqueued_on(e, stream, fetch_staged_rows(e, 0, stream));
}

gdn_status gdn_engine_enqueue_layer(gdn_engine *e, int32_t layer, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (layer < 0 || layer >= e->config.model.num_layers) return GDN_ELAYER;
    if (!caller_work_step(e)) return GDN_EMISUSE;
    const gdn__layer_params params = layer_params(e, layer, e->step.kind, e->step.tokens, e->step.bucket, e->step.variant);
    return enqueued_on(e, stream, e->backend.iface->layer_step(e->backend.ctx, &params, stream));
}

gdn_status gdn_engine_enqueue_commit(gdn_engine *e, void *stream)
{
    if (!e) return GDN_EINVAL;
    if (!caller_work_step(e) || e->step.kind != GDN_STEP_VERIFY) return GDN_EMISUSE;
    const gdn__commit_params p = commit_params(e, e->step.tokens, e->step.bucket, e->step.variant);
    return enqueued_on(e, stream, e->backend.iface->commit(e->backend.ctx, &p, stream));
}

gdn_status gdn_engine_step_rows(const gdn_engine *e, const int32_t **read_slots, const int32_t **write_slots,
                                int32_t *bucket)
{
    if (!e) return GDN_EINVAL;
    if (!e->step.active) return GDN_EMISUSE;
    if (read_slots) *read_slots = read_slots_buffer(e);
    if (write_slots) *write_slots = write_slots_buffer(e, e->step.bucket);
    if (bucket) *bucket = e->step.bucket;
    return GDN_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* Device-side slot operations                                                                      */
/* ---------------------------------------------------------------------------------------------- */

/* A slot whose counts are about to be overwritten on the device needs no clear from the next
 * fetch (which would run after, and undo, the overwrite). */
static void drop_staged_clear(gdn_engine *e, int32_t slot)
{
    if (!keeps_tokens(e) || !e->clear_flag[slot]) return;
    for (int32_t c = 0; c < e->clear_count; c++)
        if (e->clear_list[c] == slot) {
            e->clear_list[c] = e->clear_list[--e->clear_count];
            break;
        }
    e->clear_flag[slot] = 0;
}

gdn_status gdn_slot_copy_async(gdn_engine *e, int32_t dst, int32_t src, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = check_idle_slot(e, dst);
    if (status == GDN_OK) status = check_idle_slot(e, src);
    if (status != GDN_OK) return status;
    if (dst == src) return GDN_EINVAL;
    /* src freed and taken again since the last step: its counts belong to the last owner (the next
     * fetch would clear them), so dst starts with none. */
    const int src_counts_valid = !keeps_tokens(e) || !e->clear_flag[src];
    const gdn__slot_copy_params p = gdn__op_copy_params(&e->stack, dst, src, src_counts_valid);
    status = enqueued_on(e, stream, e->backend.iface->slot_copy(e->backend.ctx, &p, stream));
    if (status == GDN_OK) drop_staged_clear(e, dst);
    return status;
}

gdn_status gdn_slot_import_async(gdn_engine *e, int32_t slot, const void *src, int64_t layer_stride, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = check_idle_slot(e, slot);
    if (status != GDN_OK) return status;
    if (!src || layer_stride < state_elems_per_slot(&e->config)) return GDN_EINVAL;
    const gdn__slot_copy_params p = gdn__op_import_params(&e->stack, slot, src, layer_stride);
    status = enqueued_on(e, stream, e->backend.iface->slot_copy(e->backend.ctx, &p, stream));
    if (status == GDN_OK) drop_staged_clear(e, slot);
    return status;
}

/* Fold, ring: writes back what the slot has pending in every layer, in place, on `stream` (export:
 * its state and its conv window are then current in the pools). */
static gdn_status write_back_slot(gdn_engine *e, int32_t slot, void *stream)
{
    if (!keeps_tokens(e)) return GDN_OK;
    /* The flush row (a launch that sets it, so that a captured export carries its slot), then a
     * zero-token step of that one row a layer. A slot freed and taken again since the last step has
     * nothing of its own pending: its counts are cleared first, as the next fetch would. */
    const gdn__slot_copy_params set = gdn__op_set_row_params(&e->stack, flush_row_buffer(e), slot, e->clear_flag[slot]);
    gdn_status status = e->backend.iface->slot_copy(e->backend.ctx, &set, stream);
    for (int32_t l = 0; l < e->config.model.num_layers && status == GDN_OK; l++)
        status = write_back_flush_row(e, l, stream);
    if (status != GDN_OK) return status;
    drop_staged_clear(e, slot);
    return GDN_OK;
}

gdn_status gdn_slot_export_async(gdn_engine *e, int32_t slot, void *dst, int64_t layer_stride, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = check_idle_slot(e, slot);
    if (status != GDN_OK) return status;
    if (!dst || layer_stride < state_elems_per_slot(&e->config)) return GDN_EINVAL;
    if ((status = write_back_slot(e, slot, stream)) != GDN_OK) return status;
    const gdn__slot_copy_params p = gdn__op_export_params(&e->stack, slot, dst, layer_stride);
    return enqueued_on(e, stream, e->backend.iface->slot_copy(e->backend.ctx, &p, stream));
}

gdn_status gdn_slot_import_conv_async(gdn_engine *e, int32_t slot, const void *src, int64_t layer_stride, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = check_idle_slot(e, slot);
    if (status != GDN_OK) return status;
    if (!src || !has_conv(e) || layer_stride < (int64_t)(window_bytes(e) / gdn_dtype_size(e->config.input_dtype)))
        return GDN_EINVAL;
    const gdn__slot_copy_params p = gdn__op_window_import_params(&e->stack, slot, src, layer_stride);
    return enqueued_on(e, stream, e->backend.iface->slot_copy(e->backend.ctx, &p, stream));
}

gdn_status gdn_slot_export_conv_async(gdn_engine *e, int32_t slot, void *dst, int64_t layer_stride, void *stream)
{
    if (!e) return GDN_EINVAL;
    gdn_status status = check_idle_slot(e, slot);
    if (status != GDN_OK) return status;
    if (!dst || !has_conv(e) || layer_stride < (int64_t)(window_bytes(e) / gdn_dtype_size(e->config.input_dtype)))
        return GDN_EINVAL;
    if ((status = write_back_slot(e, slot, stream)) != GDN_OK) return status;
    const gdn__slot_copy_params p = gdn__op_window_export_params(&e->stack, slot, dst, layer_stride);
    return enqueued_on(e, stream, e->backend.iface->slot_copy(e->backend.ctx, &p, stream));
}
