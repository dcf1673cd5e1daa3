/* Model presets, configuration defaults and validation (one status per wrong field). */
#include "config.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gdn_kernel_params.h"
#include "kernels/ref/gdn_ref.h"

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
    config->launch_overlap = 1;
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

/* ---------------------------------------------------------------------------------------------- */
/* Size arithmetic (issue 17.6)                                                                     */
/* ---------------------------------------------------------------------------------------------- */

/*
 * Every byte count of an engine, or of an op layer's workspace, must fit in int64_t (the op layer's
 * offsets) and in size_t (the allocations). The validator computes them here with checked arithmetic,
 * before anything is allocated, grouped by the field that sizes them, and refuses a configuration
 * whose sizes do not fit with that field's status:
 *
 *   slot part   (GDN_ECONFIG_SLOTS)      the pool: num_slots x HV x V x K x state size (the caller's
 *                                        state_pool: its layer stride x state size, GDN_ECONFIG_POOL);
 *                                        fold / ring: num_slots x one slot's stored tokens (max_tokens
 *                                        x token elems x input size) or ring (capacity x record bytes),
 *                                        and num_slots int32 counts; the mixer's conv pools (num_slots
 *                                        windows of (W - 1) conv_dim inputs; the caller's conv_pool: its
 *                                        layer stride, GDN_ECONFIG_CONV_POOL), with the conv the fold
 *                                        tokens and ring records hold raw x instead of k and v
 *   batch part  (GDN_ECONFIG_MAX_BATCH)  cache: max_batch x max_tokens x HV x V x K x state size;
 *                                        fold / ring: max_batch arrival counters and the flush row;
 *                                        the CPU reference's scratch unless the backend is CUDA; the
 *                                        io buffers (not with the caller's io_views): max_batch x
 *                                        max_tokens x (2 HK K + HV V + 2 HV) x input size and
 *                                        max_batch x max_tokens x HV x V x output size (with the mixer:
 *                                        x instead of q, k, v, and z; the cache's raw x per row; the
 *                                        reference's conv scratch)
 *   one layer   = slot part + batch part + A_log and dt_bias (2 HV floats) and the mixer's weights
 *                 (conv_dim x (W + 1) and V, 4 bytes each at most); when the sum does not fit,
 *                 the larger part's status
 *   total       = num_layers x one layer  (GDN_ECONFIG_LAYERS), + the index block (3 max_batch + 2)
 *                 int32: everything is checked against the limit less the index block
 *
 * Each buffer's parts are 256-byte aligned as engine/op.c and engine/engine.c lay them out, so a
 * configuration that passes has no size that overflows (the engine's own allocations are at most
 * these: its CPU backend counts the scratch once, not per layer). The int32 index arithmetic adds two
 * bounds: 3 max_batch + 2 (the index block) <= INT32_MAX (GDN_ECONFIG_MAX_BATCH), and 2 max_batch +
 * num_slots + 8 (a staging entry: a step's read and write rows and up to every slot's count clear)
 * <= INT32_MAX (GDN_ECONFIG_SLOTS).
 */
#define SIZE_LIMIT ((int64_t)((uint64_t)SIZE_MAX < (uint64_t)INT64_MAX ? (uint64_t)SIZE_MAX : (uint64_t)INT64_MAX))

/* Checked products, sums and 256-byte round-ups of byte counts: -1 (sticky) when the result would
 * pass `limit` or an operand is already -1. */
static int64_t mul_upto(int64_t a, int64_t b, int64_t limit)
{
    if (a < 0 || b < 0) return -1;
    return a != 0 && b > limit / a ? -1 : a * b;
}
static int64_t add_upto(int64_t a, int64_t b, int64_t limit)
{
    if (a < 0 || b < 0) return -1;
    return b > limit - a ? -1 : a + b;
}
static int64_t align256_upto(int64_t a, int64_t limit)
{
    if (a < 0 || a > limit - 255) return -1;
    return (a + 255) / 256 * 256;
}

int gdn__config_mixer_on(const gdn_engine_config *c) { return c->mixer.conv_width > 0 || c->mixer.use_norm != 0; }

int64_t gdn__conv_dim(const gdn_model_config *m)
{
    return 2 * (int64_t)m->num_k_heads * m->head_dim_k + (int64_t)m->num_v_heads * m->head_dim_v;
}

void gdn__conv_pool_strides(const gdn_engine_config *c, int64_t *slot, int64_t *token, int64_t *channel, int64_t *layer)
{
    const gdn_conv_pool *p = &c->mixer.conv_pool;
    const int64_t C = gdn__conv_dim(&c->model), window = (int64_t)(c->mixer.conv_width - 1) * C;
    *slot = p->data && p->slot_stride ? p->slot_stride : window;
    if (p->data) gdn__conv_window_strides(p->token_stride, p->channel_stride, C, token, channel);
    else *token = C, *channel = 1;
    *layer = p->data && c->mixer.conv_layer_stride ? c->mixer.conv_layer_stride : *slot * c->num_slots;
}

/* The strategy gdn__config_resolve picks (AUTO: see GDN_VERIFY_AUTO for the measurements). */
static gdn_verify_strategy resolved_strategy(const gdn_engine_config *c)
{
    if (c->verify_strategy != GDN_VERIFY_AUTO) return c->verify_strategy;
    if (c->max_tokens <= 1) { /* decode only: the ring where its decode can run and runs faster */
        const int64_t heads = (int64_t)c->max_batch * c->model.num_v_heads;
        const int64_t above = c->state_dtype == GDN_DTYPE_F32 ? GDN_AUTO_RING_HEADS_F32 : GDN_AUTO_RING_HEADS_BF16;
        return !c->state_pool && !gdn__config_mixer_on(c) && heads > above ? GDN_VERIFY_RING : GDN_VERIFY_CACHE;
    }
    /* with the mixer the cache wins small engines: bf16 state below max_batch 16, fp32 below 4 */
    if (gdn__config_mixer_on(c))
        return c->max_batch >= (c->state_dtype == GDN_DTYPE_F32 ? 4 : 16) ? GDN_VERIFY_FOLD : GDN_VERIFY_CACHE;
    /* without the mixer the cache wins only two-token verifies of one or two rows with bf16 state */
    const int cache_wins = c->state_dtype == GDN_DTYPE_BF16 && c->max_tokens == 2 && c->max_batch <= 2;
    return cache_wins ? GDN_VERIFY_CACHE : GDN_VERIFY_FOLD;
}

int32_t gdn__mixer_scratch_tokens(const gdn_engine_config *c)
{
    const gdn_verify_strategy strategy = resolved_strategy(c);
    const int32_t length = gdn__ring_length_or_default(c->ring_length, c->max_tokens);
    const int32_t before = strategy == GDN_VERIFY_FOLD   ? c->max_tokens
                           : strategy == GDN_VERIFY_RING ? (length > c->max_tokens ? length : c->max_tokens)
                                                         : 0;
    return before + c->max_tokens;
}

/* The size checks above, for a configuration whose fields are each valid. */
static gdn_status check_sizes(const gdn_engine_config *c)
{
    const gdn_model_config *m = &c->model;
    /* Products of int32 fields, head dims (<= 256) and element sizes (<= 4) fit in int64 unchecked
     * as long as at most one int32 field takes part. */
    const int64_t HK = m->num_k_heads, HV = m->num_v_heads, K = m->head_dim_k, V = m->head_dim_v;
    const int64_t state_size = (int64_t)gdn_dtype_size(c->state_dtype);
    const int64_t in_size = (int64_t)gdn_dtype_size(c->input_dtype), out_size = (int64_t)gdn_dtype_size(c->output_dtype);
    const int64_t slots = c->num_slots, batch = c->max_batch, tokens = c->max_tokens;

    if (batch > (INT32_MAX - 2) / 3) return GDN_ECONFIG_MAX_BATCH;
    if (2 * batch + slots + 8 > INT32_MAX) return GDN_ECONFIG_SLOTS;
    const int64_t limit = SIZE_LIMIT - (3 * batch + 2) * (int64_t)sizeof(int32_t);
    const gdn_verify_strategy strategy = resolved_strategy(c);
    const int64_t slot_elems = HV * V * K, slot_bytes = slot_elems * state_size;
    /* The mixer (its fields already checked: conv_dim <= INT32_MAX / 4 with the conv). */
    const int conv = c->mixer.conv_width > 0, norm = c->mixer.use_norm != 0;
    const int64_t C = conv ? gdn__conv_dim(m) : 0, W = conv ? c->mixer.conv_width : 0;

    /* The slot part. */
    int64_t slot_part;
    if (c->state_pool) {
        const int64_t stride = c->state_slot_stride ? c->state_slot_stride : slot_elems;
        slot_part = mul_upto(c->state_layer_stride ? c->state_layer_stride : mul_upto(stride, slots, limit), state_size,
                             limit);
        if (slot_part < 0) return GDN_ECONFIG_POOL;
    } else {
        slot_part = mul_upto(slots, slot_bytes, limit);
    }
    if (conv) { /* the conv pools: the caller's layer stride, or the engine's dense windows */
        int64_t cs, ct, cc, cl;
        gdn__conv_pool_strides(c, &cs, &ct, &cc, &cl);
        const int64_t conv_part = c->mixer.conv_pool.data ? mul_upto(cl, in_size, limit)
                                                          : align256_upto(mul_upto(slots, (W - 1) * C * in_size, limit), limit);
        if (conv_part < 0 && c->mixer.conv_pool.data) return GDN_ECONFIG_CONV_POOL;
        slot_part = add_upto(slot_part, conv_part, limit);
    }
    if (strategy != GDN_VERIFY_CACHE) {
        int64_t side; /* one slot's stored tokens or ring records */
        if (strategy == GDN_VERIFY_FOLD) {
            side = tokens * (conv ? gdn__mixer_token_elems((int32_t)C, m->num_v_heads)
                                  : gdn__token_elems(m->num_k_heads, m->num_v_heads, m->head_dim_k, m->head_dim_v)) *
                   in_size;
        } else {
            const int64_t length = gdn__ring_length_or_default(c->ring_length, c->max_tokens);
            side = (length > tokens ? length : tokens) *
                   (conv ? gdn__mixer_record_bytes((int32_t)C, m->num_v_heads, m->head_dim_v)
                         : gdn__ring_record_bytes(m->num_k_heads, m->num_v_heads, m->head_dim_k, m->head_dim_v));
        }
        slot_part = add_upto(slot_part, align256_upto(mul_upto(slots, side, limit), limit), limit);
        slot_part = add_upto(slot_part, align256_upto(slots * (int64_t)sizeof(int32_t), limit), limit);
    }
    if (slot_part < 0) return GDN_ECONFIG_SLOTS;

    /* The batch part. */
    int64_t batch_part = 0;
    if (strategy == GDN_VERIFY_CACHE) {
        if (tokens > 1) {
            batch_part = align256_upto(mul_upto(batch * tokens, slot_bytes, limit), limit);
            if (conv) /* a verify's raw x per row, for the commit's window */
                batch_part = add_upto(batch_part, align256_upto(mul_upto(batch * tokens, C * in_size, limit), limit), limit);
        } else {
            batch_part = GDN__WORKSPACE_MIN_BYTES; /* decodes only: no verify cache */
        }
    } else {
        batch_part = align256_upto(batch * (int64_t)sizeof(uint32_t), limit); /* arrival counters */
        batch_part = add_upto(batch_part, align256_upto((int64_t)sizeof(int32_t), limit), limit); /* flush row */
    }
    if (c->backend != GDN_BACKEND_CUDA) { /* the CPU reference's scratch */
        batch_part = add_upto(batch_part, align256_upto((int64_t)gdn__ref_scratch_bytes(), limit), limit);
        if (conv)
            batch_part = add_upto(batch_part,
                                  align256_upto((int64_t)gdn__ref_mixer_scratch_bytes((int32_t)C, (int32_t)W,
                                                                                      gdn__mixer_scratch_tokens(c)),
                                                limit),
                                  limit);
    }
    if (!c->io_views) {
        const int64_t rows = batch * tokens;
        const int64_t qk = align256_upto(mul_upto(rows, HK * K * in_size, limit), limit);
        const int64_t v = align256_upto(mul_upto(rows, HV * V * in_size, limit), limit);
        const int64_t gate = align256_upto(mul_upto(rows, HV * in_size, limit), limit);
        const int64_t o = align256_upto(mul_upto(rows, HV * V * out_size, limit), limit);
        if (conv) { /* x instead of q, k and v */
            batch_part = add_upto(batch_part, align256_upto(mul_upto(rows, C * in_size, limit), limit), limit);
        } else {
            batch_part = add_upto(batch_part, mul_upto(2, qk, limit), limit);
            batch_part = add_upto(batch_part, v, limit);
        }
        if (norm) batch_part = add_upto(batch_part, align256_upto(mul_upto(rows, HV * V * in_size, limit), limit), limit);
        batch_part = add_upto(batch_part, mul_upto(2, gate, limit), limit);
        batch_part = add_upto(batch_part, o, limit);
    }
    if (batch_part < 0) return GDN_ECONFIG_MAX_BATCH;

    /* One layer, then all of them. */
    int64_t params = align256_upto(2 * HV * (int64_t)sizeof(float), limit); /* A_log, dt_bias; the mixer's weights */
    if (conv) params = add_upto(params, align256_upto(C * (W + 1) * 4, limit), limit);
    if (norm) params = add_upto(params, align256_upto(V * 4, limit), limit);
    const int64_t layer = add_upto(add_upto(slot_part, batch_part, limit), params, limit);
    if (layer < 0) {
        if (slot_part < batch_part) return GDN_ECONFIG_MAX_BATCH;
        return c->state_pool ? GDN_ECONFIG_POOL : GDN_ECONFIG_SLOTS;
    }
    if (mul_upto(layer, m->num_layers, limit) < 0) return GDN_ECONFIG_LAYERS;
    return GDN_OK;
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
    if (c->ring_write_through < -1) return GDN_ECONFIG_RING_WRITE_THROUGH;
    if (c->backend != GDN_BACKEND_AUTO && c->backend != GDN_BACKEND_CUDA && c->backend != GDN_BACKEND_CPU)
        return GDN_ECONFIG_BACKEND;
    if (c->graph_mode != GDN_GRAPHS_LAZY && c->graph_mode != GDN_GRAPHS_AT_CREATE && c->graph_mode != GDN_GRAPHS_OFF)
        return GDN_ECONFIG_GRAPHS;
    const gdn_mixer_config *mx = &c->mixer;
    if (mx->conv_width != 0 && (mx->conv_width < 2 || mx->conv_width > GDN__MAX_CONV_WIDTH)) return GDN_ECONFIG_MIXER;
    if (mx->conv_weight_dtype != GDN_DTYPE_F32 && mx->conv_weight_dtype != GDN_DTYPE_BF16) return GDN_ECONFIG_MIXER;
    if (!isfinite(mx->norm_eps) || mx->norm_eps < 0.0f) return GDN_ECONFIG_MIXER;
    if (mx->conv_width > 0 && gdn__conv_dim(m) > INT32_MAX / 4) return GDN_ECONFIG_MIXER;
    if (mx->conv_pool.data) { /* the caller's conv pools: one block per slot's window, 2-byte elements */
        if (mx->conv_width == 0) return GDN_ECONFIG_CONV_POOL;
        const gdn_conv_pool *p = &mx->conv_pool;
        if (p->slot_stride < 0 || p->token_stride < 0 || p->channel_stride < 0 || mx->conv_layer_stride < 0 ||
            (uintptr_t)p->data % 2 != 0)
            return GDN_ECONFIG_CONV_POOL;
        int64_t slot, token, channel, layer;
        const int64_t C = gdn__conv_dim(m), rows = mx->conv_width - 1;
        gdn__conv_pool_strides(c, &slot, &token, &channel, &layer);
        const int contiguous = (token == C && channel == 1) || (token == 1 && channel == rows);
        const int64_t extent = mul_upto(slot, c->num_slots, SIZE_LIMIT / 2);
        if (!contiguous || slot < rows * C || extent < 0 || layer < extent || layer > SIZE_LIMIT / 2)
            return GDN_ECONFIG_CONV_POOL;
    }
    if (c->state_pool) { /* strides in elements; every product checked (SIZE_LIMIT: bytes) */
        const int64_t elems = (int64_t)m->num_v_heads * m->head_dim_v * m->head_dim_k;
        const int64_t size = (int64_t)gdn_dtype_size(c->state_dtype);
        if (c->state_slot_stride < 0 || c->state_layer_stride < 0) return GDN_ECONFIG_POOL;
        const int64_t slot = c->state_slot_stride ? c->state_slot_stride : elems;
        const int64_t slots_extent = mul_upto(slot, c->num_slots, SIZE_LIMIT / size);
        const int64_t layer = c->state_layer_stride ? c->state_layer_stride : slots_extent;
        if (slots_extent < 0 || layer > SIZE_LIMIT / size || slot < elems || layer < slots_extent ||
            (slot * size) % 16 != 0 || (layer * size) % 16 != 0 || (uintptr_t)c->state_pool % 16 != 0)
            return GDN_ECONFIG_POOL;
    }
    if (c->io_views)
        for (int32_t l = 0; l < m->num_layers; l++) {
            const gdn_layer_views *v = &c->io_views[l];
            if (!v->a.data || !v->b.data || !v->o.data) return GDN_ECONFIG_VIEWS;
            if (mx->use_norm && !v->z.data) return GDN_ECONFIG_VIEWS;
            if (mx->conv_width > 0) { /* x, whole tokens; q, k and v are not read */
                if (!v->x.data) return GDN_ECONFIG_VIEWS;
                continue;
            }
            if (!v->q.data || !v->k.data || !v->v.data) return GDN_ECONFIG_VIEWS;
            if (!view_keeps(&v->q, 16, 8) || !view_keeps(&v->k, 16, 8) || !view_keeps(&v->v, 4, 2))
                return GDN_ECONFIG_VIEWS;
        }
    return check_sizes(c);
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
    const char *overlap = getenv("GDN_LAUNCH_OVERLAP");
    if (overlap && strcmp(overlap, "0") == 0) resolved->launch_overlap = 0;
    resolved->verify_strategy = resolved_strategy(resolved);
    resolved->ring_length = gdn__ring_length_or_default(resolved->ring_length, resolved->max_tokens);
    resolved->ring_write_through =
        gdn__ring_write_through_rows(resolved->ring_write_through, resolved->model.num_v_heads, resolved->state_dtype,
                                     resolved->mixer.conv_width > 0, resolved->max_batch);
    if (resolved->model.scale == 0.0f) resolved->model.scale = 1.0f / sqrtf((float)resolved->model.head_dim_k);
    if (resolved->mixer.use_norm && resolved->mixer.norm_eps == 0.0f) resolved->mixer.norm_eps = 1e-6f;
    return GDN_OK;
}

int32_t gdn__ring_write_through_rows(int32_t option, int32_t num_v_heads, gdn_dtype state_dtype, int conv,
                                     int32_t max_batch)
{
    /* Read once (the op layer asks at every step); threads that race compute the same value. */
    static atomic_int off = -1;
    int turned_off = atomic_load_explicit(&off, memory_order_relaxed);
    if (turned_off < 0) {
        const char *e = getenv("GDN_RING_WRITE_THROUGH");
        turned_off = e && strcmp(e, "0") == 0;
        atomic_store_explicit(&off, turned_off, memory_order_relaxed);
    }
    if (turned_off || option < 0) return -1;
    if (option > 0) return option;
    if (conv) return max_batch > 0 ? max_batch : -1;
    /* By state dtype: up to where writing through measured faster than the ring's own decode
     * (bench/results/2026-11-29-h200-ring-write-through-defaults.md). */
    const int32_t heads =
        state_dtype == GDN_DTYPE_BF16 ? GDN_RING_WRITE_THROUGH_HEADS_BF16 : GDN_RING_WRITE_THROUGH_HEADS_F32;
    const int32_t rows = num_v_heads > 0 ? heads / num_v_heads : 0;
    return rows > 0 ? rows : -1;
}

int32_t gdn__bucket_for(const gdn_engine_config *resolved, int32_t batch)
{
    for (int32_t i = 0; i < resolved->num_buckets; i++)
        if (resolved->buckets[i] >= batch) return resolved->buckets[i];
    return resolved->max_batch;
}
