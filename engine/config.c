/* Model presets, configuration defaults and validation (one status per wrong field). */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct model_preset {
    const char *name;
    int32_t num_k_heads, num_v_heads, head_dim_k, head_dim_v;
} model_preset;

/* SPEC section 1's presets. */
static const model_preset presets[] = {
    {"qwen3-next", 16, 32, 128, 128},
    {"qwen3.5", 16, 64, 128, 128},
    {"tiny", 2, 4, 64, 64},
};

gdn_status gdn_model_preset(const char *name, int32_t num_layers, gdn_model_config *model)
{
    if (!name || !model) return GDN_EINVAL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        memset(model, 0, sizeof *model);
        model->num_layers = num_layers;
        model->num_k_heads = presets[i].num_k_heads;
        model->num_v_heads = presets[i].num_v_heads;
        model->head_dim_k = presets[i].head_dim_k;
        model->head_dim_v = presets[i].head_dim_v;
        model->scale = 0.0f;
        model->use_qk_l2norm = 1;
        return GDN_OK;
    }
    return GDN_EINVAL;
}

int32_t gdn__default_buckets(int32_t max_batch, int32_t *buckets, int32_t capacity)
{
    int32_t n = 0;
    for (int32_t size = 1; size < max_batch && n < capacity - 1;) {
        buckets[n++] = size;
        if (size < 8) size *= 2;
        else if (size < 256) size += 8;
        else size += 16;
    }
    buckets[n++] = max_batch; /* the list always ends at max_batch */
    return n;
}

gdn_status gdn_engine_config_init(gdn_engine_config *config, const gdn_model_config *model)
{
    if (!config || !model) return GDN_EINVAL;
    memset(config, 0, sizeof *config);
    config->model = *model;
    config->state_dtype = GDN_DTYPE_F32;
    config->input_dtype = GDN_DTYPE_BF16;
    config->output_dtype = GDN_DTYPE_BF16;
    config->num_slots = 64;
    config->max_batch = 64;
    config->max_tokens = 4;
    config->num_buckets = 0;
    config->verify_strategy = GDN_VERIFY_AUTO;
    config->backend = GDN_BACKEND_AUTO;
    config->device = 0;
    config->graph_mode = GDN_GRAPHS_LAZY;
    return GDN_OK;
}

static int is_supported_head_dim(int32_t d) { return d == 64 || d == 128 || d == 256; }

/* A view whose data is `bytes`-aligned and whose strides are multiples of `elements`. */
static int view_keeps(const gdn_view *v, uintptr_t bytes, int64_t elements)
{
    return (uintptr_t)v->data % bytes == 0 && v->row_stride % elements == 0 && v->token_stride % elements == 0 &&
           v->head_stride % elements == 0;
}

gdn_status gdn_engine_config_validate(const gdn_engine_config *c)
{
    if (!c) return GDN_EINVAL;
    const gdn_model_config *m = &c->model;
    if (m->num_layers < 1) return GDN_ECONFIG_LAYERS;
    if (m->num_k_heads < 1 || m->num_v_heads < 1 || m->num_v_heads % m->num_k_heads != 0)
        return GDN_ECONFIG_HEADS;
    if (!is_supported_head_dim(m->head_dim_k) || !is_supported_head_dim(m->head_dim_v))
        return GDN_ECONFIG_HEAD_DIM;
    if (!isfinite(m->scale) || m->scale < 0.0f) return GDN_ECONFIG_SCALE;
    if (c->state_dtype != GDN_DTYPE_F32 && c->state_dtype != GDN_DTYPE_BF16) return GDN_ECONFIG_STATE_DTYPE;
    if (c->input_dtype != GDN_DTYPE_BF16 && c->input_dtype != GDN_DTYPE_F16) return GDN_ECONFIG_INPUT_DTYPE;
    if (c->output_dtype != GDN_DTYPE_BF16 && c->output_dtype != GDN_DTYPE_F32) return GDN_ECONFIG_OUTPUT_DTYPE;
    if (c->num_slots < 1) return GDN_ECONFIG_SLOTS;
    if (c->max_batch < 1) return GDN_ECONFIG_MAX_BATCH;
    if (c->max_tokens < 1 || c->max_tokens > GDN_MAX_TOKENS) return GDN_ECONFIG_MAX_TOKENS;
    if (c->num_buckets < 0 || c->num_buckets > GDN_MAX_BUCKETS) return GDN_ECONFIG_BUCKETS;
    if (c->num_buckets > 0) {
        for (int32_t i = 0; i < c->num_buckets; i++) {
            if (c->buckets[i] < 1) return GDN_ECONFIG_BUCKETS;
            if (i > 0 && c->buckets[i] <= c->buckets[i - 1]) return GDN_ECONFIG_BUCKETS;
        }
        if (c->buckets[c->num_buckets - 1] != c->max_batch) return GDN_ECONFIG_BUCKETS;
    }
    if (c->verify_strategy != GDN_VERIFY_CACHE && c->verify_strategy != GDN_VERIFY_FOLD &&
        c->verify_strategy != GDN_VERIFY_AUTO && c->verify_strategy != GDN_VERIFY_RING)
        return GDN_ECONFIG_VERIFY;
    if (c->ring_length != 0 && (c->ring_length < GDN_MIN_RING_LENGTH || c->ring_length > GDN_MAX_RING_LENGTH))
        return GDN_ECONFIG_RING;
    if (c->backend != GDN_BACKEND_AUTO && c->backend != GDN_BACKEND_CUDA && c->backend != GDN_BACKEND_CPU)
        return GDN_ECONFIG_BACKEND;
    if (c->graph_mode != GDN_GRAPHS_LAZY && c->graph_mode != GDN_GRAPHS_AT_CREATE && c->graph_mode != GDN_GRAPHS_OFF)
        return GDN_ECONFIG_GRAPHS;
    if (c->state_pool) {
        const int64_t elems = (int64_t)m->num_v_heads * m->head_dim_v * m->head_dim_k;
        const int64_t slot = c->state_slot_stride ? c->state_slot_stride : elems;
        const int64_t layer = c->state_layer_stride ? c->state_layer_stride : slot * c->num_slots;
        const int64_t size = (int64_t)gdn_dtype_size(c->state_dtype);
        if (c->state_slot_stride < 0 || c->state_layer_stride < 0 || slot < elems || layer < slot * c->num_slots ||
            (slot * size) % 16 != 0 || (layer * size) % 16 != 0 || (uintptr_t)c->state_pool % 16 != 0)
            return GDN_ECONFIG_POOL;
    }
    if (c->io_views)
        for (int32_t l = 0; l < m->num_layers; l++) {
            const gdn_layer_views *v = &c->io_views[l];
            if (!v->q.data || !v->k.data || !v->v.data || !v->a.data || !v->b.data || !v->o.data)
                return GDN_ECONFIG_VIEWS;
            if (!view_keeps(&v->q, 16, 8) || !view_keeps(&v->k, 16, 8) || !view_keeps(&v->v, 4, 2))
                return GDN_ECONFIG_VIEWS;
        }
    return GDN_OK;
}

gdn_status gdn__config_resolve(const gdn_engine_config *config, gdn_engine_config *resolved)
{
    gdn_status status = gdn_engine_config_validate(config);
    if (status != GDN_OK) return status;
    *resolved = *config;
    if (resolved->num_buckets == 0)
        resolved->num_buckets = gdn__default_buckets(resolved->max_batch, resolved->buckets, GDN_MAX_BUCKETS);
    const char *disable = getenv("GDN_DISABLE_GRAPHS");
    if (disable && strcmp(disable, "1") == 0) resolved->graph_mode = GDN_GRAPHS_OFF;
    if (resolved->verify_strategy == GDN_VERIFY_AUTO) /* see GDN_VERIFY_AUTO for the measurements */
        resolved->verify_strategy =
            resolved->max_tokens > 1 && resolved->max_batch >= 16 ? GDN_VERIFY_FOLD : GDN_VERIFY_CACHE;
    if (resolved->ring_length == 0) resolved->ring_length = GDN_DEFAULT_RING_LENGTH;
    if (resolved->model.scale == 0.0f) resolved->model.scale = 1.0f / sqrtf((float)resolved->model.head_dim_k);
    return GDN_OK;
}

int32_t gdn__bucket_for(const gdn_engine_config *resolved, int32_t batch)
{
    for (int32_t i = 0; i < resolved->num_buckets; i++)
        if (resolved->buckets[i] >= batch) return resolved->buckets[i];
    return resolved->max_batch;
}
