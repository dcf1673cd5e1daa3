/*
 * The fused mixer step on the GPU (SPEC 6; gdn_mixer in include/gdn/gdn_op.h; kernels/gdn_cuda_mixer.cuh):
 * the same random sequence of decodes, verifies and commits runs on a CUDA op and on a CPU op (the
 * float64 reference, itself held to the oracle by test_op_mixer.c), over identical initial states and
 * windows, with x, z, a and b strided column slices of one fused input tensor, a padded output, a
 * padded pool and a dense or vLLM-layout conv pool; padding rows, rows that write another slot, every
 * accepted count, a slot copy and a slot reset on the way. Most runs take 1-6 rows; the big_grids runs
 * take 16-32 rows of 32 value heads, where every kernel switches to its big instance.
 *
 * After every step: each live output within SPEC 4 of the CPU's (bf16 outputs: one bf16 ulp beside it,
 * both sides being rounded), padding rows' outputs exactly 0 and
 * nothing outside the step's outputs written (poisoned before each step); slots outside the step
 * bit-exact (pool and window). At the end (after a flush under fold): every slot's state within SPEC
 * 4 and every window bit-exact (it holds raw inputs). Skips visibly without a GPU.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend_impl.h"
#include "engine/op_impl.h"
#include "gdn/gdn_op.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_spec.h"
#include "support.h"

/* ROWS_CAP: the most rows a configuration may ask for (max_rows); DEFAULT_ROWS: the small suites'. */
enum { ROWS_CAP = 32, DEFAULT_ROWS = 6, SLOTS_CAP = ROWS_CAP + 3, MAX_T = 4, POOL_GAP = 32, CONV_GAP = 8, K_DIM = 128 };

typedef struct gm_cfg {
    int32_t HK, HV;                /* K = V = 128 */
    gdn_verify_strategy strategy;
    gdn_dtype pool_dtype, weight_dtype, out_dtype;
    int32_t W;                     /* conv width; 0: no conv */
    int norm, vllm_layout, bias;
    int counts;                    /* verify steps give each row its own token count (SPEC 3) */
    int trees;                     /* verify steps are token trees, committed by accepted node */
    int32_t ring_length;           /* the ring strategy's L (0: the default) */
    int32_t ring_write_through;    /* gdn_op_layer's (0: the default; -1: the ring's own decodes) */
    int32_t fill_steps;            /* the first fill_steps steps verify MAX_T tokens in slots 0..B-1 and accept them all;
                                    * the next decodes those slots, and a full ring must be among them */
    int32_t min_rows, max_rows;    /* a step's rows: min_rows..max_rows (0: 1..DEFAULT_ROWS) */
    int overlap;                   /* gdn_op_layer's overlap_preceding (PDL) */
    int32_t steps;
    uint64_t seed;
} gm_cfg;

/* Shapes and host-side layouts shared by both sides. */
typedef struct gm_shape {
    int32_t HK, HV, K, V, C;
    int32_t min_rows, max_rows, num_slots, spare_slot; /* the step's rows never use spare_slot (num_slots - 1) */
    int64_t in_token, in_row, out_head, out_token, out_row;
    size_t in_bytes, out_bytes, pool_bytes, conv_bytes, weight_bytes, out_size, pool_size;
} gm_shape;

/* One backend's op and its memory. */
typedef struct gm_side {
    gdn__backend be;
    gdn_op_layer op;
    gdn_mixer mixer;
    void *in, *out, *pool, *conv, *ws, *slots, *writes, *accepted, *counts, *parents, *params, *weights, *bias, *norm_w;
} gm_side;

static void *side_alloc(gm_side *s, size_t bytes)
{
    void *p = NULL;
    cr_assert_eq(s->be.iface->alloc(s->be.ctx, bytes, &p), GDN_OK);
    cr_assert_eq(s->be.iface->synchronize(s->be.ctx, NULL), GDN_OK);
    return p;
}
static void put(gm_side *s, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(s->be.iface->upload(s->be.ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(s->be.iface->synchronize(s->be.ctx, NULL), GDN_OK);
}
static void get(gm_side *s, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(s->be.iface->synchronize(s->be.ctx, NULL), GDN_OK);
    cr_assert_eq(s->be.iface->download(s->be.ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(s->be.iface->synchronize(s->be.ctx, NULL), GDN_OK);
}

static gm_shape shape_of(const gm_cfg *c)
{
    gm_shape g = {.HK = c->HK, .HV = c->HV, .K = K_DIM, .V = K_DIM};
    g.min_rows = c->min_rows ? c->min_rows : 1;
    g.max_rows = c->max_rows ? c->max_rows : DEFAULT_ROWS;
    cr_assert(g.min_rows <= g.max_rows && g.max_rows <= ROWS_CAP, "a test asks for %d..%d rows", g.min_rows, g.max_rows);
    g.spare_slot = g.max_rows + 2, g.num_slots = g.spare_slot + 1;
    g.C = 2 * g.HK * g.K + g.HV * g.V;
    /* per token: x [C] | z [HV V] | (a, b) [2 HV] | pad, a multiple of 8 elements (x's 16-byte rows) */
    const int64_t used = g.C + (int64_t)g.HV * g.V + 2 * g.HV;
    g.in_token = (used + 8) / 8 * 8 + 8;
    g.in_row = MAX_T * g.in_token + 8;
    g.in_bytes = (size_t)(g.max_rows * g.in_row) * 2;
    g.out_size = gdn_dtype_size(c->out_dtype);
    g.out_head = g.V + 4, g.out_token = g.HV * g.out_head + 8, g.out_row = MAX_T * g.out_token + 8;
    g.out_bytes = (size_t)(g.max_rows * g.out_row) * g.out_size;
    g.pool_size = gdn_dtype_size(c->pool_dtype);
    g.pool_bytes = (size_t)(g.num_slots * ((int64_t)g.HV * g.V * g.K + POOL_GAP)) * g.pool_size;
    g.conv_bytes = c->W ? (size_t)(g.num_slots * ((int64_t)(c->W - 1) * g.C + CONV_GAP)) * 2 : 2;
    g.weight_bytes = (size_t)g.C * (c->W ? c->W : 1) * gdn_dtype_size(c->weight_dtype);
    return g;
}

static void side_create(gm_side *s, gdn_backend_kind kind, const gm_cfg *c, const gm_shape *g)
{
    memset(s, 0, sizeof *s);
    if (kind == GDN_BACKEND_CPU) cr_assert_eq(gdn__backend_cpu_create(4096, &s->be), GDN_OK);
    else cr_assert_eq(gdn__backend_cuda_create(0, 4096, &s->be), GDN_OK);
    s->in = side_alloc(s, g->in_bytes);
    s->out = side_alloc(s, g->out_bytes);
    s->pool = side_alloc(s, g->pool_bytes);
    s->conv = side_alloc(s, g->conv_bytes);
    s->slots = side_alloc(s, (size_t)g->max_rows * sizeof(int32_t));
    s->writes = side_alloc(s, (size_t)g->max_rows * sizeof(int32_t));
    s->accepted = side_alloc(s, (size_t)g->max_rows * sizeof(int32_t));
    s->counts = side_alloc(s, (size_t)g->max_rows * sizeof(int32_t));
    s->parents = side_alloc(s, (size_t)g->max_rows * MAX_T * sizeof(int32_t));
    s->params = side_alloc(s, 2 * (size_t)g->HV * sizeof(float));
    s->weights = side_alloc(s, g->weight_bytes);
    s->bias = side_alloc(s, (size_t)g->C * gdn_dtype_size(c->weight_dtype));
    s->norm_w = side_alloc(s, (size_t)g->V * sizeof(float));
    const int64_t rows = c->W ? c->W - 1 : 0;
    s->mixer = (gdn_mixer){
        .conv_width = c->W,
        .conv_weight_dtype = c->weight_dtype,
        .conv_weight = c->W ? s->weights : NULL,
        .conv_bias = c->W && c->bias ? s->bias : NULL,
        .conv = {s->conv, rows * g->C + CONV_GAP, c->vllm_layout ? 1 : g->C, c->vllm_layout ? rows : 1},
        .norm_weight = c->norm ? s->norm_w : NULL,
        .norm_eps = 1e-6f,
    };
    s->op = (gdn_op_layer){
        .backend = kind,
        .model = {.num_layers = 1, .num_k_heads = g->HK, .num_v_heads = g->HV, .head_dim_k = g->K, .head_dim_v = g->V,
                  .use_qk_l2norm = 1},
        .input_dtype = GDN_DTYPE_BF16,
        .output_dtype = c->out_dtype,
        .mixer = &s->mixer,
        .A_log = s->params,
        .dt_bias = (const float *)s->params + g->HV,
        .pool = {s->pool, c->pool_dtype, g->num_slots, (int64_t)g->HV * g->V * g->K + POOL_GAP},
        .read_slots = s->slots,
        .strategy = c->strategy,
        .max_batch = g->max_rows,
        .max_tokens = MAX_T,
        .ring_length = c->ring_length,
        .ring_write_through = c->ring_write_through,
        .overlap_preceding = c->overlap,
    };
    const char *in = s->in;
    s->op.x = (gdn_view){s->in, g->in_row, g->in_token, 0};
    s->op.z = (gdn_view){(void *)(in + (size_t)g->C * 2), g->in_row, g->in_token, g->V};
    s->op.a = (gdn_view){(void *)(in + (size_t)(g->C + (int64_t)g->HV * g->V) * 2), g->in_row, g->in_token, 2};
    s->op.b = (gdn_view){(void *)(in + (size_t)(g->C + (int64_t)g->HV * g->V + 1) * 2), g->in_row, g->in_token, 2};
    s->op.o = (gdn_view){s->out, g->out_row, g->out_token, g->out_head};
    if (!c->W) { /* q, k, v as column slices of x's place */
        s->op.q = (gdn_view){s->in, g->in_row, g->in_token, g->K};
        s->op.k = (gdn_view){(void *)(in + (size_t)g->HK * g->K * 2), g->in_row, g->in_token, g->K};
        s->op.v = (gdn_view){(void *)(in + (size_t)2 * g->HK * g->K * 2), g->in_row, g->in_token, g->V};
    }
    const size_t ws = gdn_op_workspace_bytes(&s->op);
    cr_assert_gt(ws, 0, "a valid mixer op needs workspace");
    s->ws = side_alloc(s, ws);
    s->op.workspace = s->ws;
}

static void side_free(gm_side *s)
{
    void *all[] = {s->in, s->out, s->pool, s->conv, s->ws, s->slots, s->writes, s->accepted, s->counts, s->parents, s->params,
                   s->weights, s->bias, s->norm_w};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) s->be.iface->free(s->be.ctx, all[i]);
    s->be.iface->destroy(s->be.ctx);
}

/* Both sides get the same bytes. */
static void put_both(gm_side *sides, size_t offset_of_field, const void *src, size_t bytes)
{
    for (int n = 0; n < 2; n++) put(&sides[n], *(void **)((char *)&sides[n] + offset_of_field), src, bytes);
}
#define PUT_BOTH(sides, field, src, bytes) put_both(sides, offsetof(gm_side, field), src, bytes)

static uint16_t bf16_of(double x) { return gdn__f32_to_bf16((float)x); }

static void fill_random(void *dst, size_t n, gdn_dtype dtype, test_rng *rng, double scale, double offset)
{
    for (size_t e = 0; e < n; e++) {
        const double x = offset + scale * test_rng_normal(rng);
        if (dtype == GDN_DTYPE_F32) ((float *)dst)[e] = (float)x;
        else ((uint16_t *)dst)[e] = bf16_of(x);
    }
}

static double value_at(const void *base, gdn_dtype dtype, int64_t e)
{
    return dtype == GDN_DTYPE_F32 ? (double)((const float *)base)[e] : (double)gdn__bf16_to_f32(((const uint16_t *)base)[e]);
}

/* How far a GPU output is from the CPU's, as a share of SPEC 4's output tolerance: both are rounded
 * to the output dtype, so one of its ulps (bf16) is allowed beside the tolerance. */
static double out_error(double got, double want, gdn_dtype out_dtype, const gdn__tolerance *tol)
{
    const double ulp = out_dtype == GDN_DTYPE_BF16 && want != 0.0 ? ldexp(1.0, ilogb(want) - 7) : 0.0;
    const double off = fabs(got - want) > ulp ? fabs(got - want) - ulp : 0.0;
    return off / (tol->out_abs + tol->out_rel * fabs(want));
}

/* Output element (i, t, h, d) in the padded output. */
static int64_t out_at(const gm_shape *g, int32_t i, int32_t t, int32_t h, int32_t d)
{
    return i * g->out_row + t * g->out_token + h * g->out_head + d;
}

typedef struct gm_run {
    gm_cfg cfg;
    gm_shape g;
    gm_side side[2]; /* [0] CPU (the reference), [1] CUDA */
    test_rng rng;
    gdn__tolerance tol;
    unsigned char *host_out[2], *pool_before, *conv_before, *pool_after, *conv_after;
} gm_run;

static void run_create(gm_run *run, const gm_cfg *cfg)
{
    memset(run, 0, sizeof *run);
    run->cfg = *cfg;
    run->g = shape_of(cfg);
    run->rng = test_rng_seeded(cfg->seed);
    run->tol = gdn__spec4_tolerance(cfg->pool_dtype);
    const gm_shape *g = &run->g;
    side_create(&run->side[0], GDN_BACKEND_CPU, cfg, g);
#ifdef GM_CPU_TWIN /* a development aid: both sides on the CPU */
    side_create(&run->side[1], GDN_BACKEND_CPU, cfg, g);
#else
    side_create(&run->side[1], GDN_BACKEND_CUDA, cfg, g);
#endif
    gm_side *sides = run->side;

    /* Parameters and initial slots: random, the same bits on both sides. */
    float *params = malloc(2 * (size_t)g->HV * sizeof(float));
    for (int32_t h = 0; h < g->HV; h++) {
        params[h] = (float)(-1.0 + 1.5 * test_rng_uniform(&run->rng));
        params[g->HV + h] = (float)(0.5 * test_rng_normal(&run->rng));
    }
    PUT_BOTH(sides, params, params, 2 * (size_t)g->HV * sizeof(float));
    void *weights = malloc(g->weight_bytes), *bias = malloc((size_t)g->C * 4);
    fill_random(weights, g->weight_bytes / gdn_dtype_size(cfg->weight_dtype), cfg->weight_dtype, &run->rng, 0.5, 0.0);
    fill_random(bias, (size_t)g->C, cfg->weight_dtype, &run->rng, 0.2, 0.0);
    PUT_BOTH(sides, weights, weights, g->weight_bytes);
    PUT_BOTH(sides, bias, bias, (size_t)g->C * gdn_dtype_size(cfg->weight_dtype));
    float *norm_w = malloc((size_t)g->V * sizeof(float));
    fill_random(norm_w, (size_t)g->V, GDN_DTYPE_F32, &run->rng, 0.3, 1.0);
    PUT_BOTH(sides, norm_w, norm_w, (size_t)g->V * sizeof(float));
    void *pool = malloc(g->pool_bytes), *conv = malloc(g->conv_bytes);
    fill_random(pool, g->pool_bytes / g->pool_size, cfg->pool_dtype, &run->rng, 0.1, 0.0);
    fill_random(conv, g->conv_bytes / 2, GDN_DTYPE_BF16, &run->rng, 1.0, 0.0);
    PUT_BOTH(sides, pool, pool, g->pool_bytes);
    PUT_BOTH(sides, conv, conv, g->conv_bytes);
    free(params), free(weights), free(bias), free(norm_w), free(pool), free(conv);
    for (int n = 0; n < 2; n++) run->host_out[n] = malloc(g->out_bytes);
    run->pool_before = malloc(g->pool_bytes), run->conv_before = malloc(g->conv_bytes);
    run->pool_after = malloc(g->pool_bytes), run->conv_after = malloc(g->conv_bytes);
}

static void run_free(gm_run *run)
{
    for (int n = 0; n < 2; n++) side_free(&run->side[n]), free(run->host_out[n]);
    free(run->pool_before), free(run->conv_before), free(run->pool_after), free(run->conv_after);
}

/* The byte ranges of slot s in the pool and in the conv pool. */
static size_t pool_slot_bytes(const gm_run *run) { return (size_t)run->side[0].op.pool.slot_stride * run->g.pool_size; }
static size_t conv_slot_bytes(const gm_run *run) { return (size_t)run->side[0].mixer.conv.slot_stride * 2; }

/* Slots other than the step's reads and writes are bit-exact on the GPU across the step. */
static void assert_others_untouched(gm_run *run, const int32_t *rows, const int32_t *writes, int32_t B, int step)
{
    gm_side *gpu = &run->side[1];
    get(gpu, run->pool_after, gpu->pool, run->g.pool_bytes);
    get(gpu, run->conv_after, gpu->conv, run->g.conv_bytes);
    for (int32_t s = 0; s < run->g.num_slots; s++) {
        int in_step = 0;
        for (int32_t i = 0; i < B; i++) in_step |= rows[i] == s || writes[i] == s;
        if (in_step) continue;
        const size_t p = pool_slot_bytes(run), c = run->cfg.W ? conv_slot_bytes(run) : 0;
        cr_assert(memcmp(run->pool_before + s * p, run->pool_after + s * p, p) == 0, "step %d: slot %d's state changed", step, s);
        if (c) cr_assert(memcmp(run->conv_before + s * c, run->conv_after + s * c, c) == 0, "step %d: slot %d's window changed", step, s);
    }
}

/* One step (and its commit) on both sides, then the checks. */
static void run_step(gm_run *run, int step)
{
    const gm_cfg *c = &run->cfg;
    const gm_shape *g = &run->g;
    gm_side *sides = run->side;
    const int filling = step < c->fill_steps, after_fill = c->fill_steps > 0 && step == c->fill_steps;
    const int verify = filling || (!after_fill && test_rng_below(&run->rng, 2));
    const int32_t T = filling ? MAX_T : verify ? 2 + test_rng_below(&run->rng, MAX_T - 1) : 1;
    const int32_t B = g->min_rows + test_rng_below(&run->rng, g->max_rows - g->min_rows + 1);
    /* distinct slots from 0..spare_slot-1; a row may write another unused slot; one may be padding */
    const int32_t spare = g->spare_slot;
    int32_t perm[SLOTS_CAP], rows[ROWS_CAP], writes[ROWS_CAP], accepted[ROWS_CAP], counts[ROWS_CAP], parents[ROWS_CAP * MAX_T];
    for (int32_t s = 0; s < spare; s++) perm[s] = s;
    for (int32_t s = spare - 1; s > 0; s--) {
        const int32_t j = test_rng_below(&run->rng, s + 1), t = perm[s];
        perm[s] = perm[j], perm[j] = t;
    }
    int32_t next = 0;
    for (int32_t i = 0; i < B; i++) rows[i] = perm[next++];
    for (int32_t i = 0; i < B; i++) writes[i] = next < spare && test_rng_below(&run->rng, 4) == 0 ? perm[next++] : rows[i];
    if (B > 1 && test_rng_below(&run->rng, 3) == 0) rows[test_rng_below(&run->rng, B)] = -1;
    if (filling || after_fill) /* the same slots every time, in place: their rings fill */
        for (int32_t i = 0; i < B; i++) rows[i] = writes[i] = i;
    if (after_fill) { /* the decode meets at least one full ring (its records and token outnumber a warp) */
        const gdn__op_layout l = gdn__op_layout_of(&sides[1].op, 0);
        int32_t count[SLOTS_CAP], full = 0;
        get(&sides[1], count, (const char *)sides[1].ws + l.counts, (size_t)g->num_slots * sizeof(int32_t));
        for (int32_t i = 0; i < B; i++) full += rows[i] >= 0 && count[rows[i]] == l.ring_capacity;
        cr_assert_gt(full, 0, "step %d: no row of the decode after the fill has a full ring of %d records", step, l.ring_capacity);
    }
    /* with counts: row 0 has n = 1 (a decode row inside the verify), the others 1..T */
    const int with_counts = verify && c->counts;
    for (int32_t i = 0; i < B; i++) counts[i] = with_counts ? (i == 0 ? 1 : 1 + test_rng_below(&run->rng, T)) : T;
    for (int32_t i = 0; i < B; i++) accepted[i] = filling ? counts[i] : test_rng_below(&run->rng, counts[i] + 1);
    /* trees: random recursive trees (each token's parent uniform in -1..t-1), the accepted node in -1..n-1 */
    const int with_trees = verify && c->trees;
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++) parents[i * T + t] = with_trees ? test_rng_below(&run->rng, t + 1) - 1 : t - 1;
    if (with_trees)
        for (int32_t i = 0; i < B; i++) accepted[i] -= 1;

    uint16_t *in = malloc(g->in_bytes);
    for (size_t e = 0; e < g->in_bytes / 2; e++) in[e] = bf16_of(test_rng_normal(&run->rng));
    PUT_BOTH(sides, in, in, g->in_bytes);
    PUT_BOTH(sides, slots, rows, (size_t)B * sizeof(int32_t));
    PUT_BOTH(sides, writes, writes, (size_t)B * sizeof(int32_t));
    PUT_BOTH(sides, accepted, accepted, (size_t)B * sizeof(int32_t));
    PUT_BOTH(sides, counts, counts, (size_t)B * sizeof(int32_t));
    PUT_BOTH(sides, parents, parents, (size_t)B * T * sizeof(int32_t));
    memset(run->host_out[0], 0xff, g->out_bytes); /* NaN in either dtype */
    PUT_BOTH(sides, out, run->host_out[0], g->out_bytes);
    free(in);
    get(&sides[1], run->pool_before, sides[1].pool, g->pool_bytes);
    get(&sides[1], run->conv_before, sides[1].conv, g->conv_bytes);

    for (int n = 0; n < 2; n++) {
        gm_side *s = &sides[n];
        s->op.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
        s->op.tokens = T;
        s->op.batch = B;
        s->op.write_slots = s->writes;
        s->op.token_counts = with_counts ? s->counts : NULL;
        s->op.parents = with_trees ? s->parents : NULL;
        gdn_status status = gdn_op_layer_step(&s->op, NULL);
        cr_assert_eq(status, GDN_OK, "step %d (%s): %s", step, n ? "cuda" : "cpu", gdn_status_name(status));
        if (verify) {
            status = with_trees ? gdn_op_commit_node(&s->op, s->accepted, NULL) : gdn_op_commit(&s->op, s->accepted, NULL);
            cr_assert_eq(status, GDN_OK, "commit %d (%s): %s", step, n ? "cuda" : "cpu", gdn_status_name(status));
        }
        get(s, run->host_out[n], s->out, g->out_bytes);
    }

    /* Outputs: live rows within SPEC 4 of the CPU's; padding rows 0; nothing else written. */
    unsigned char *written = calloc(g->out_bytes / g->out_size, 1);
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < g->HV; h++)
                for (int32_t d = 0; d < g->V; d++) {
                    const int64_t e = out_at(g, i, t, h, d);
                    written[e] = 1;
                    const double want = value_at(run->host_out[0], c->out_dtype, e), got = value_at(run->host_out[1], c->out_dtype, e);
                    if (rows[i] < 0 || t >= counts[i]) {
                        cr_assert(got == 0.0 && want == 0.0, "step %d: padding row or token, row %d output (%d, %d, %d) = %g (cpu %g)",
                                  step, i, t, h, d, got, want);
                        continue;
                    }
                    cr_assert(isfinite(got), "step %d: row %d token %d head %d [%d] not written (%g)", step, i, t, h, d, got);
                    const double ratio = out_error(got, want, c->out_dtype, &run->tol);
                    cr_assert(ratio <= 1.0, "step %d (%s T=%d): row %d token %d head %d [%d]: gpu %.6g, reference %.6g (%.2f of the tolerance)",
                              step, verify ? "verify" : "decode", T, i, t, h, d, got, want, ratio);
                }
    for (size_t e = 0; e < g->out_bytes / g->out_size; e++)
        if (!written[e])
            cr_assert(isnan(value_at(run->host_out[1], c->out_dtype, (int64_t)e)), "step %d: output element %zu outside the step written",
                      step, e);
    free(written);
    assert_others_untouched(run, rows, writes, B, step);
}

/* Every slot's state within SPEC 4 of the CPU's and its window bit-exact (after a flush: fold and
 * ring, whose windows are their checkpoints' until then). */
static void assert_slots_match(gm_run *run, const char *when)
{
    const gm_shape *g = &run->g;
    gm_side *sides = run->side;
    int32_t all[SLOTS_CAP];
    for (int32_t s = 0; s < g->num_slots; s++) all[s] = s;
    for (int n = 0; n < 2; n++) {
        if (run->cfg.strategy == GDN_VERIFY_CACHE) continue;
        for (int32_t first = 0; first < g->num_slots; first += g->max_rows) { /* max_rows slots a flush */
            const int32_t count = g->num_slots - first < g->max_rows ? g->num_slots - first : g->max_rows;
            put(&sides[n], sides[n].slots, all + first, (size_t)count * sizeof(int32_t));
            const gdn_status status = gdn_op_flush(&sides[n].op, sides[n].slots, count, NULL);
            cr_assert_eq(status, GDN_OK, "%s: flush (%s): %s", when, n ? "cuda" : "cpu", gdn_status_name(status));
        }
    }
    get(&sides[0], run->pool_before, sides[0].pool, g->pool_bytes);
    get(&sides[1], run->pool_after, sides[1].pool, g->pool_bytes);
    const int64_t slot = sides[0].op.pool.slot_stride, elems = (int64_t)g->HV * g->V * g->K;
    for (int32_t s = 0; s < g->num_slots; s++)
        for (int64_t e = 0; e < elems; e++) {
            const double want = value_at(run->pool_before, run->cfg.pool_dtype, s * slot + e);
            const double got = value_at(run->pool_after, run->cfg.pool_dtype, s * slot + e);
            cr_assert(fabs(got - want) <= run->tol.state_abs + run->tol.state_rel * fabs(want),
                      "%s: slot %d state [%ld]: gpu %.6g, reference %.6g", when, s, (long)e, got, want);
        }
    if (!run->cfg.W) return;
    get(&sides[0], run->conv_before, sides[0].conv, g->conv_bytes);
    get(&sides[1], run->conv_after, sides[1].conv, g->conv_bytes);
    cr_assert(memcmp(run->conv_before, run->conv_after, g->conv_bytes) == 0, "%s: the windows differ", when);
}

static void run_sequence(const gm_cfg *cfg)
{
#ifndef GM_CPU_TWIN
    test_require_gpu();
#endif
    gm_run run;
    run_create(&run, cfg);
    const int32_t steps = test_scaled_steps(cfg->steps ? cfg->steps : 16);
    /* (the check after a copy writes every ring back: not before a fill's decode) */
    const int32_t copy_step = steps / 2 > cfg->fill_steps ? steps / 2 : cfg->fill_steps + 1;
    for (int step = 0; step < steps; step++) {
        run_step(&run, step);
        if (step == copy_step) { /* a slot copy and a reset, both sides (7 to 2, reset 5 where there are so many) */
            const int32_t last = run.g.num_slots - 1, from = last < 7 ? last : 7, to = from == 2 ? 0 : 2;
            for (int n = 0; n < 2; n++) {
                cr_assert_eq(gdn_op_slot_copy(&run.side[n].op, from, to, NULL), GDN_OK);
                cr_assert_eq(gdn_op_slot_reset(&run.side[n].op, last < 5 ? last : 5, NULL), GDN_OK);
            }
            assert_slots_match(&run, "after a slot copy and reset");
        }
    }
    assert_slots_match(&run, "at the end");
    run_free(&run);
}

#define GPU_MIXER_TEST(name, ...)                                                                   \
    Test(gpu_mixer, name, .timeout = 600)                                                           \
    {                                                                                               \
        const gm_cfg c = {__VA_ARGS__};                                                             \
        run_sequence(&c);                                                                           \
    }

GPU_MIXER_TEST(cache_f32_pool_conv_norm, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .seed = 1)
GPU_MIXER_TEST(cache_bf16_pool_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1, .vllm_layout = 1, .seed = 2)
GPU_MIXER_TEST(fold_f32_pool_conv_norm, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .seed = 3)
GPU_MIXER_TEST(fold_bf16_pool_width_3_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_FOLD,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 3,
               .norm = 1, .vllm_layout = 1, .seed = 4)
GPU_MIXER_TEST(cache_norm_only, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 0, .norm = 1, .seed = 5)
GPU_MIXER_TEST(fold_conv_only_width_2, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_F32, .W = 2, .norm = 0, .bias = 1, .seed = 6)
GPU_MIXER_TEST(cache_conv_only_width_2, .HK = 1, .HV = 2, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_BF16, .W = 2, .norm = 0, .seed = 7)
GPU_MIXER_TEST(qwen3_next_heads_cache_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .steps = 8,
               .seed = 8)
GPU_MIXER_TEST(qwen3_next_heads_fold_f32, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .steps = 8, .seed = 9)
/* Launched overlapped (PDL), with qwen3-next's heads and one row: the fold decode runs two row sets a
 * CTA there (the layer kernel's launcher leaves room for two such grids), which the launches without
 * the overlap never take. */
GPU_MIXER_TEST(qwen3_next_heads_fold_bf16_overlapped, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .bias = 1, .overlap = 1, .min_rows = 1, .max_rows = 1, .steps = 16, .seed = 40)
/* Per-row token counts in the verify steps (positions past a row's count: exactly 0 on both sides). */
GPU_MIXER_TEST(token_counts_cache, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .counts = 1, .seed = 10)
GPU_MIXER_TEST(token_counts_fold_bf16_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1, .vllm_layout = 1, .counts = 1,
               .seed = 11)
GPU_MIXER_TEST(token_counts_qwen3_next_heads_fold_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .bias = 1, .counts = 1, .steps = 8, .seed = 12)
/* Token trees with the mixer: each node's conv follows its path; the commit by node moves the window
 * (cache: from the stored x of the path; fold: the path's stored tokens fold next). */
GPU_MIXER_TEST(token_trees_cache, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .counts = 1,
               .trees = 1, .seed = 14)
GPU_MIXER_TEST(token_trees_fold_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1, .vllm_layout = 1, .trees = 1,
               .seed = 15)
GPU_MIXER_TEST(token_trees_qwen3_next_heads_fold_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .bias = 1, .counts = 1, .trees = 1, .steps = 8, .seed = 16)
GPU_MIXER_TEST(token_trees_qwen3_next_heads_cache_bf16_width_3, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_CACHE,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_BF16, .W = 3, .norm = 1,
               .trees = 1, .steps = 8, .seed = 17)
GPU_MIXER_TEST(token_counts_qwen3_next_heads_cache_f32, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_CACHE,
               .pool_dtype = GDN_DTYPE_F32, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .counts = 1, .steps = 8, .seed = 13)

/* What the fused kernels do not run (a key head size other than 128) is refused on CUDA with
 * GDN_ENOTSUP, changing nothing. */
Test(gpu_mixer, other_head_sizes_are_refused, .timeout = 600)
{
    test_require_gpu();
    const gm_cfg cfg = {.HK = 2, .HV = 4, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
                        .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .seed = 10};
    gm_run run;
    run_create(&run, &cfg);
    gm_side *gpu = &run.side[1];
    get(gpu, run.pool_before, gpu->pool, run.g.pool_bytes);
    gdn_op_layer op = gpu->op;
    op.kind = GDN_STEP_DECODE, op.tokens = 1, op.batch = 1;
    op.model.head_dim_k = 64; /* the pool's slots and the windows still fit: only the head size differs */
    gdn_mixer dense_windows = gpu->mixer;
    dense_windows.conv.token_stride = dense_windows.conv.channel_stride = 0;
    op.mixer = &dense_windows;
    const gdn_status status = gdn_op_layer_step(&op, NULL);
    cr_assert_eq(status, GDN_ENOTSUP, "K = 64 with a mixer on CUDA: %s", gdn_status_name(status));
    get(gpu, run.pool_after, gpu->pool, run.g.pool_bytes);
    cr_assert(memcmp(run.pool_before, run.pool_after, run.g.pool_bytes) == 0);
    run_free(&run);
}

/* ---------------------------------------------------------------------------------------------- */
/* The engine on CUDA (graphs replayed) against the engine on the CPU backend                       */
/* ---------------------------------------------------------------------------------------------- */

enum { E_LAYERS = 3, E_SLOTS = 6, E_ROWS = 4 };

/* Two engines with one configuration but the backend: the same weights, slots and inputs; after every
 * step every output within SPEC 4 of the CPU's (bf16 outputs: an ulp beside), and at the end every
 * slot's state (gdn_slot_read_state) within SPEC 4 and its window bit-exact. The CUDA engine runs
 * graphs (one per bucket and T, replayed with new slots): the counts the fused kernel leaves at zero
 * between steps, the norm's scratch and the commit's window kernel all go through replays. */
static void run_engine_twins(gdn_verify_strategy strategy, gdn_dtype state_dtype, uint64_t seed)
{
    test_require_gpu();
    test_rng rng = test_rng_seeded(seed);
    gdn_engine_config c = test_config("tiny", E_LAYERS, state_dtype, E_SLOTS, E_ROWS, MAX_T);
    c.model.head_dim_k = c.model.head_dim_v = K_DIM;
    c.verify_strategy = strategy;
    c.output_dtype = GDN_DTYPE_BF16;
    c.mixer = (gdn_mixer_config){.conv_width = 4, .conv_weight_dtype = GDN_DTYPE_BF16, .use_norm = 1};
    const int32_t HK = c.model.num_k_heads, HV = c.model.num_v_heads, K = K_DIM, V = K_DIM;
    const int32_t C = 2 * HK * K + HV * V;
    gdn_engine *e[2] = {NULL, NULL};
    for (int n = 0; n < 2; n++) {
        c.backend = n ? GDN_BACKEND_CUDA : GDN_BACKEND_CPU;
        const gdn_status status = gdn_engine_create(&c, &e[n]);
        cr_assert_eq(status, GDN_OK, "gdn_engine_create (%s): %s", n ? "cuda" : "cpu", gdn_status_name(status));
        for (int32_t s = 0; s < E_SLOTS; s++) {
            int32_t slot = -1;
            cr_assert_eq(gdn_slot_alloc(e[n], &slot), GDN_OK);
            cr_assert_eq(slot, s);
        }
    }
    /* weights, states and windows: the same bits in both */
    float *params = malloc(sizeof(float) * 2 * (size_t)HV), *norm_w = malloc(sizeof(float) * (size_t)V);
    uint16_t *conv_w = malloc(2 * (size_t)C * 4), *bias = malloc(2 * (size_t)C), *window = malloc(2 * (size_t)3 * C);
    const size_t state_elems = (size_t)HV * V * K;
    void *state = malloc(state_elems * gdn_dtype_size(state_dtype));
    for (int32_t l = 0; l < E_LAYERS; l++) {
        for (int32_t h = 0; h < HV; h++) {
            params[h] = (float)(-1.0 + 1.5 * test_rng_uniform(&rng));
            params[HV + h] = (float)(0.5 * test_rng_normal(&rng));
        }
        fill_random(conv_w, (size_t)C * 4, GDN_DTYPE_BF16, &rng, 0.5, 0.0);
        fill_random(bias, (size_t)C, GDN_DTYPE_BF16, &rng, 0.2, 0.0);
        fill_random(norm_w, (size_t)V, GDN_DTYPE_F32, &rng, 0.3, 1.0);
        for (int n = 0; n < 2; n++) {
            cr_assert_eq(gdn_engine_set_layer_params(e[n], l, params, params + HV), GDN_OK);
            cr_assert_eq(gdn_engine_set_mixer_params(e[n], l, conv_w, bias, norm_w), GDN_OK);
        }
        for (int32_t s = 0; s < E_SLOTS; s++) {
            fill_random(state, state_elems, state_dtype, &rng, 0.1, 0.0);
            fill_random(window, (size_t)3 * C, GDN_DTYPE_BF16, &rng, 1.0, 0.0);
            for (int n = 0; n < 2; n++) {
                cr_assert_eq(gdn_slot_write_state(e[n], l, s, state), GDN_OK);
                cr_assert_eq(gdn_slot_write_conv_state(e[n], l, s, window), GDN_OK);
            }
        }
    }
    const gdn__tolerance tol = gdn__spec4_tolerance(state_dtype);
    const size_t out_elems = (size_t)E_ROWS * MAX_T * HV * V;
    uint16_t *out[2] = {malloc(2 * out_elems), malloc(2 * out_elems)};
    const size_t in_elems = (size_t)E_ROWS * MAX_T * ((size_t)C + (size_t)HV * V + 2 * (size_t)HV);
    uint16_t *in = malloc(2 * in_elems);
    const int32_t steps = test_scaled_steps(24);
    for (int step = 0; step < steps; step++) {
        const int verify = step % 3 != 0;
        const int32_t T = verify ? 2 + test_rng_below(&rng, MAX_T - 1) : 1;
        const int32_t B = 1 + test_rng_below(&rng, E_ROWS);
        int32_t rows[E_ROWS], accepted[E_ROWS];
        const int32_t first = test_rng_below(&rng, E_SLOTS);
        for (int32_t i = 0; i < B; i++) rows[i] = (first + i) % E_SLOTS, accepted[i] = test_rng_below(&rng, T + 1);
        if (B > 1 && step % 4 == 1) rows[B - 1] = -1; /* a padding row */
        fill_random(in, in_elems, GDN_DTYPE_BF16, &rng, 1.0, 0.0);
        for (int n = 0; n < 2; n++) {
            for (int32_t l = 0; l < E_LAYERS; l++) { /* x, z, a, b dense [B, T, ...] in the engine's buffers */
                gdn_layer_io io;
                cr_assert_eq(gdn_engine_layer_io(e[n], l, &io), GDN_OK);
                const size_t nx = (size_t)B * T * C, nz = (size_t)B * T * HV * V, ng = (size_t)B * T * HV;
                cr_assert_eq(gdn_engine_upload(e[n], io.x, in, 2 * nx, NULL), GDN_OK);
                cr_assert_eq(gdn_engine_upload(e[n], io.z, in + nx, 2 * nz, NULL), GDN_OK);
                cr_assert_eq(gdn_engine_upload(e[n], io.a, in + nx + nz, 2 * ng, NULL), GDN_OK);
                cr_assert_eq(gdn_engine_upload(e[n], io.b, in + nx + nz + ng, 2 * ng, NULL), GDN_OK);
                memset(out[n], 0xff, 2 * out_elems);
                cr_assert_eq(gdn_engine_upload(e[n], io.o, out[n], 2 * out_elems, NULL), GDN_OK);
            }
            test_run_step(e[n], verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, B, rows, NULL);
            if (verify) {
                test_set_accepted(e[n], accepted, B);
                const gdn_status status = gdn_engine_commit(e[n], NULL);
                cr_assert_eq(status, GDN_OK, "commit (%s): %s", n ? "cuda" : "cpu", gdn_status_name(status));
            }
            cr_assert_eq(gdn_engine_synchronize(e[n], NULL), GDN_OK);
        }
        for (int32_t l = 0; l < E_LAYERS; l++) {
            for (int n = 0; n < 2; n++) {
                gdn_layer_io io;
                cr_assert_eq(gdn_engine_layer_io(e[n], l, &io), GDN_OK);
                cr_assert_eq(gdn_engine_download(e[n], out[n], io.o, 2 * (size_t)B * T * HV * V, NULL), GDN_OK);
                cr_assert_eq(gdn_engine_synchronize(e[n], NULL), GDN_OK);
            }
            for (size_t j = 0; j < (size_t)B * T * HV * V; j++) {
                const int32_t i = (int32_t)(j / ((size_t)T * HV * V));
                const double want = value_at(out[0], GDN_DTYPE_BF16, (int64_t)j), got = value_at(out[1], GDN_DTYPE_BF16, (int64_t)j);
                if (rows[i] < 0) {
                    cr_assert(got == 0.0, "step %d layer %d: padding row output %g", step, l, got);
                    continue;
                }
                cr_assert(isfinite(got) && out_error(got, want, GDN_DTYPE_BF16, &tol) <= 1.0,
                          "step %d (%s T=%d) layer %d output [%zu]: gpu %.6g, cpu %.6g", step, verify ? "verify" : "decode", T,
                          l, j, got, want);
            }
        }
    }
    double *states[2] = {malloc(sizeof(double) * state_elems), malloc(sizeof(double) * state_elems)};
    void *raw = malloc(state_elems * 4);
    uint16_t *windows[2] = {malloc(2 * (size_t)3 * C), malloc(2 * (size_t)3 * C)};
    for (int32_t l = 0; l < E_LAYERS; l++)
        for (int32_t s = 0; s < E_SLOTS; s++) {
            for (int n = 0; n < 2; n++) {
                cr_assert_eq(gdn_slot_read_state(e[n], l, s, raw), GDN_OK);
                for (size_t j = 0; j < state_elems; j++) states[n][j] = value_at(raw, state_dtype, (int64_t)j);
                cr_assert_eq(gdn_slot_read_conv_state(e[n], l, s, windows[n]), GDN_OK);
            }
            for (size_t j = 0; j < state_elems; j++)
                cr_assert(fabs(states[1][j] - states[0][j]) <= tol.state_abs + tol.state_rel * fabs(states[0][j]),
                          "layer %d slot %d state [%zu]: gpu %.6g, cpu %.6g", l, s, j, states[1][j], states[0][j]);
            cr_assert(memcmp(windows[0], windows[1], 2 * (size_t)3 * C) == 0, "layer %d slot %d: the windows differ", l, s);
        }
    for (int n = 0; n < 2; n++) gdn_engine_destroy(e[n]), free(out[n]), free(states[n]), free(windows[n]);
    free(params), free(norm_w), free(conv_w), free(bias), free(window), free(state), free(in), free(raw);
}

Test(gpu_mixer, engine_graphs_match_the_cpu_engine_cache_f32, .timeout = 600)
{
    run_engine_twins(GDN_VERIFY_CACHE, GDN_DTYPE_F32, 21);
}
Test(gpu_mixer, engine_graphs_match_the_cpu_engine_fold_bf16, .timeout = 600)
{
    run_engine_twins(GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 22);
}
Test(gpu_mixer, engine_graphs_match_the_cpu_engine_fold_f32, .timeout = 600)
{
    run_engine_twins(GDN_VERIFY_FOLD, GDN_DTYPE_F32, 23);
}
/* The ring strategy (records of raw x; the window is the checkpoint's and moves at write-backs): L =
 * 4 makes most rows write back within a few steps, decodes and verifies alike. */
GPU_MIXER_TEST(ring_f32_pool_conv_norm, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .ring_length = 4,
               .seed = 21)
GPU_MIXER_TEST(ring_bf16_pool_width_3_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_F32, .W = 3, .norm = 1,
               .vllm_layout = 1, .ring_length = 4, .seed = 22)
GPU_MIXER_TEST(ring_norm_only, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 0, .norm = 1, .ring_length = 4, .seed = 23)
GPU_MIXER_TEST(ring_conv_only_width_2_default_length, .HK = 1, .HV = 2, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_BF16, .W = 2, .norm = 0,
               .bias = 1, .steps = 24, .seed = 24)
GPU_MIXER_TEST(qwen3_next_heads_ring_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .ring_length = 4,
               .steps = 8, .seed = 25)
GPU_MIXER_TEST(qwen3_next_heads_ring_f32_vllm_window, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_F32, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1,
               .vllm_layout = 1, .steps = 8, .seed = 26)
GPU_MIXER_TEST(token_counts_ring_bf16_vllm_window, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1,
               .vllm_layout = 1, .counts = 1, .ring_length = 4, .seed = 27)
/* The ring's own decodes (ring_write_through -1), which append records; the suites above write their
 * decodes through (the conv's default covers their grids), in the layer kernel's fold decode over the
 * records. */
GPU_MIXER_TEST(ring_own_decodes_f32_pool, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .ring_length = 4,
               .ring_write_through = -1, .seed = 41)
GPU_MIXER_TEST(ring_own_decodes_qwen3_next_heads_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .bias = 1, .ring_length = 4, .ring_write_through = -1, .steps = 8, .seed = 43)
/* A ring of 32 filled by verifies that accept every token, then decodes that write it through: on
 * two value heads one-warp CTAs, where a full ring's 32 records and the own token outnumber the
 * threads. */
GPU_MIXER_TEST(ring_32_filled_then_written_through_bf16, .HK = 1, .HV = 2, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .bias = 1, .ring_length = 32, .min_rows = 6, .max_rows = 6, .fill_steps = 8, .steps = 20, .seed = 43)
GPU_MIXER_TEST(ring_32_filled_then_written_through_f32, .HK = 1, .HV = 2, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_F32, .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_F32, .W = 3, .norm = 1,
               .ring_length = 32, .min_rows = 6, .max_rows = 6, .fill_steps = 8, .steps = 20, .seed = 44)
/* Ring trees: each node's conv follows its path over the records; the commit by node moves the
 * path's records (raw x with them) to the ring's front. */
GPU_MIXER_TEST(token_trees_ring, .HK = 2, .HV = 4, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .counts = 1,
               .trees = 1, .ring_length = 4, .seed = 28)
GPU_MIXER_TEST(token_trees_qwen3_next_heads_ring_bf16_width_3, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_BF16, .W = 3, .norm = 1,
               .trees = 1, .ring_length = 4, .steps = 8, .seed = 29)
/* 16-32 rows of 32 value heads: the grids on which the fused kernels' decodes and other verifies take
 * their big instances (64 bf16 or 32 fp32 state values a thread). The suites above, at most 6 rows,
 * reach them only in the verifies that take them early (bf16 fold and cache from 4 rows, the ring's
 * bf16 chains from 4, fp32 fold from 2: state_regs_for's big_early). */
GPU_MIXER_TEST(big_grids_fold_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .min_rows = 16,
               .max_rows = 32, .steps = 6, .seed = 31)
GPU_MIXER_TEST(big_grids_fold_f32_vllm_window_counts, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD,
               .pool_dtype = GDN_DTYPE_F32, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1,
               .vllm_layout = 1, .counts = 1, .min_rows = 16, .max_rows = 32, .steps = 6, .seed = 32)
GPU_MIXER_TEST(big_grids_fold_bf16_trees, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_FOLD, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .counts = 1, .trees = 1,
               .min_rows = 16, .max_rows = 32, .steps = 6, .seed = 33)
GPU_MIXER_TEST(big_grids_cache_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .min_rows = 16,
               .max_rows = 32, .steps = 6, .seed = 34)
GPU_MIXER_TEST(big_grids_cache_f32_width_3, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_CACHE, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_F32, .out_dtype = GDN_DTYPE_BF16, .W = 3, .norm = 1, .min_rows = 16, .max_rows = 32,
               .steps = 6, .seed = 35)
GPU_MIXER_TEST(big_grids_ring_bf16, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_BF16,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1, .bias = 1, .ring_length = 4,
               .min_rows = 16, .max_rows = 32, .steps = 6, .seed = 36)
GPU_MIXER_TEST(big_grids_ring_bf16_own_decodes, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING,
               .pool_dtype = GDN_DTYPE_BF16, .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_BF16, .W = 4, .norm = 1,
               .ring_length = 4, .ring_write_through = -1, .min_rows = 16, .max_rows = 32, .steps = 6, .seed = 45)
GPU_MIXER_TEST(big_grids_ring_f32_vllm_window, .HK = 16, .HV = 32, .strategy = GDN_VERIFY_RING, .pool_dtype = GDN_DTYPE_F32,
               .weight_dtype = GDN_DTYPE_BF16, .out_dtype = GDN_DTYPE_F32, .W = 4, .norm = 1, .vllm_layout = 1,
               .ring_length = 4, .min_rows = 16, .max_rows = 32, .steps = 6, .seed = 37)
