/* See op_checks.h. */
#include "op_checks.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend_impl.h"
#include "kernels/dtype_convert.h"
#include "support.h"

enum { MAX_ROWS = 6, NUM_SLOTS = 10, MAX_T = 4, STEPS = 14, POOL_GAP = 64 };

/* One op instance: a backend, and dense or strided tensors in its memory. */
typedef struct instance {
    gdn__backend be;
    int strided;
    gdn_op_layer op;
    void *proj, *gates, *out, *pool, *workspace, *slots, *writes, *accepted, *params;
    size_t proj_bytes, gates_bytes, out_bytes, pool_bytes;
    int64_t proj_row, proj_token, gate_row, gate_token, out_row, out_token, out_head;
} instance;

typedef struct geometry {
    int32_t HK, HV, K, V, T;
    size_t in_size, out_size, state_size;
} geometry;

static void *backend_alloc(gdn__backend *be, size_t bytes)
{
    void *p = NULL;
    cr_assert_eq(be->iface->alloc(be->ctx, bytes, &p), GDN_OK);
    /* CUDA zero-fills on the backend's private (non-blocking) stream: done before any upload lands. */
    cr_assert_eq(be->iface->synchronize(be->ctx, NULL), GDN_OK);
    return p;
}
static void upload(gdn__backend *be, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(be->iface->upload(be->ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(be->iface->synchronize(be->ctx, NULL), GDN_OK);
}
static void download(gdn__backend *be, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(be->iface->download(be->ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(be->iface->synchronize(be->ctx, NULL), GDN_OK);
}

/* Fused projection per token: q [HK K] | k [HK K] | v [HV V] | 8 spare; gates per token: (a, b) pairs
 * per head, then 2 spare; output heads padded by 8, tokens by 8, rows by 8. */
static void setup_instance(instance *in, gdn_backend_kind kind, int strided, const gdn_op_layer *shape, const geometry *g)
{
    memset(in, 0, sizeof *in);
    in->strided = strided;
    if (kind == GDN_BACKEND_CPU) cr_assert_eq(gdn__backend_cpu_create(4096, &in->be), GDN_OK);
    else cr_assert_eq(gdn__backend_cuda_create(0, 4096, &in->be), GDN_OK);
    const int64_t N = 2 * (int64_t)g->HK * g->K + (int64_t)g->HV * g->V + 8, M = 2 * (int64_t)g->HV + 2;
    in->proj_token = strided ? N : 0, in->proj_row = strided ? MAX_T * N + 16 : 0;
    in->gate_token = strided ? M : 0, in->gate_row = strided ? MAX_T * M + 1 : 0;
    in->out_head = strided ? g->V + 8 : 0, in->out_token = strided ? g->HV * (g->V + 8) + 8 : 0;
    in->out_row = strided ? MAX_T * in->out_token + 8 : 0;
    in->proj_bytes = (size_t)(strided ? MAX_ROWS * in->proj_row : MAX_ROWS * MAX_T * (N - 8)) * g->in_size;
    in->gates_bytes = (size_t)(strided ? MAX_ROWS * in->gate_row : 2 * MAX_ROWS * MAX_T * g->HV) * g->in_size;
    in->out_bytes = (size_t)(strided ? MAX_ROWS * in->out_row : MAX_ROWS * MAX_T * g->HV * g->V) * g->out_size;
    in->op = *shape;
    in->op.backend = kind;
    in->op.pool.slot_stride = (int64_t)g->HV * g->V * g->K + POOL_GAP;
    in->pool_bytes = (size_t)(NUM_SLOTS * in->op.pool.slot_stride) * g->state_size;
    in->proj = backend_alloc(&in->be, in->proj_bytes);
    in->gates = backend_alloc(&in->be, in->gates_bytes);
    in->out = backend_alloc(&in->be, in->out_bytes);
    in->pool = backend_alloc(&in->be, in->pool_bytes);
    in->slots = backend_alloc(&in->be, MAX_ROWS * sizeof(int32_t));
    in->writes = backend_alloc(&in->be, MAX_ROWS * sizeof(int32_t));
    in->accepted = backend_alloc(&in->be, MAX_ROWS * sizeof(int32_t));
    in->params = backend_alloc(&in->be, 2 * (size_t)g->HV * sizeof(float));
    const size_t ws = gdn_op_workspace_bytes(&in->op);
    cr_assert_gt(ws, 0, "a valid op needs workspace");
    in->workspace = backend_alloc(&in->be, ws);
    in->op.pool.data = in->pool;
    in->op.workspace = in->workspace;
    in->op.A_log = in->params;
    in->op.dt_bias = (const float *)in->params + g->HV;
    in->op.read_slots = in->slots;
}

static void free_instance(instance *in)
{
    void *all[] = {in->proj, in->gates, in->out, in->pool, in->workspace, in->slots, in->writes, in->accepted, in->params};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) in->be.iface->free(in->be.ctx, all[i]);
    in->be.iface->destroy(in->be.ctx);
}

/* Points the views at this step's T (dense views are [B, T, ...] of the step's own T). */
static void set_views(instance *in, const geometry *g, int32_t T)
{
    const int64_t qk = (int64_t)g->HK * g->K;
    char *proj = in->proj, *gates = in->gates;
    if (in->strided) {
        in->op.q = (gdn_view){proj, in->proj_row, in->proj_token, g->K};
        in->op.k = (gdn_view){proj + (size_t)qk * g->in_size, in->proj_row, in->proj_token, g->K};
        in->op.v = (gdn_view){proj + (size_t)(2 * qk) * g->in_size, in->proj_row, in->proj_token, g->V};
        in->op.a = (gdn_view){gates, in->gate_row, in->gate_token, 2};
        in->op.b = (gdn_view){gates + g->in_size, in->gate_row, in->gate_token, 2};
        in->op.o = (gdn_view){in->out, in->out_row, in->out_token, in->out_head};
    } else {
        const size_t rows = MAX_ROWS * (size_t)T;
        in->op.q = (gdn_view){proj, 0, 0, 0};
        in->op.k = (gdn_view){proj + rows * qk * g->in_size, 0, 0, 0};
        in->op.v = (gdn_view){proj + 2 * rows * qk * g->in_size, 0, 0, 0};
        in->op.a = (gdn_view){gates, 0, 0, 0};
        in->op.b = (gdn_view){gates + rows * g->HV * g->in_size, 0, 0, 0};
        in->op.o = (gdn_view){in->out, 0, 0, 0};
    }
}

/* Element (i, t, h, d) of a view as the op sees it, dense strides filled in. */
static int64_t view_at(const gdn_view *v, int32_t T, int32_t H, int32_t D, int32_t i, int32_t t, int32_t h, int32_t d)
{
    if (!v->row_stride && !v->token_stride && !v->head_stride)
        return (((int64_t)i * T + t) * H + h) * D + d;
    return i * v->row_stride + t * v->token_stride + h * v->head_stride + d;
}

/* Writes the step's inputs (host arrays in dense order, raw input dtype bits) into the instance. */
static void write_inputs(instance *in, const geometry *g, int32_t B, int32_t T, const uint16_t *q, const uint16_t *k,
                         const uint16_t *v, const uint16_t *a, const uint16_t *b)
{
    set_views(in, g, T);
    uint16_t *proj = calloc(in->proj_bytes / 2, 2), *gates = calloc(in->gates_bytes / 2, 2);
    const char *pbase = in->proj, *gbase = in->gates;
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++) {
            for (int32_t h = 0; h < g->HK; h++)
                for (int32_t d = 0; d < g->K; d++) {
                    const int64_t src = (((int64_t)i * T + t) * g->HK + h) * g->K + d;
                    proj[((const char *)in->op.q.data - pbase) / 2 + view_at(&in->op.q, T, g->HK, g->K, i, t, h, d)] = q[src];
                    proj[((const char *)in->op.k.data - pbase) / 2 + view_at(&in->op.k, T, g->HK, g->K, i, t, h, d)] = k[src];
                }
            for (int32_t h = 0; h < g->HV; h++) {
                for (int32_t d = 0; d < g->V; d++)
                    proj[((const char *)in->op.v.data - pbase) / 2 + view_at(&in->op.v, T, g->HV, g->V, i, t, h, d)] =
                        v[(((int64_t)i * T + t) * g->HV + h) * g->V + d];
                const int64_t src = ((int64_t)i * T + t) * g->HV + h;
                gates[((const char *)in->op.a.data - gbase) / 2 + view_at(&in->op.a, T, g->HV, 1, i, t, h, 0)] = a[src];
                gates[((const char *)in->op.b.data - gbase) / 2 + view_at(&in->op.b, T, g->HV, 1, i, t, h, 0)] = b[src];
            }
        }
    upload(&in->be, in->proj, proj, in->proj_bytes);
    upload(&in->be, in->gates, gates, in->gates_bytes);
    free(proj), free(gates);
}

/* The step's outputs as doubles in dense order [B, T, HV, V]. */
static double *read_outputs(instance *in, const geometry *g, int32_t B, int32_t T)
{
    unsigned char *raw = malloc(in->out_bytes);
    download(&in->be, raw, in->out, in->out_bytes);
    double *o = malloc(sizeof(double) * (size_t)B * T * g->HV * g->V);
    const gdn_dtype dt = in->op.output_dtype;
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < g->HV; h++)
                for (int32_t d = 0; d < g->V; d++)
                    o[(((int64_t)i * T + t) * g->HV + h) * g->V + d] =
                        gdn__load_f32(raw, dt, view_at(&in->op.o, T, g->HV, g->V, i, t, h, d));
    free(raw);
    return o;
}

/* The pool as stored (raw bytes, gaps included). */
static unsigned char *read_pool(instance *in)
{
    unsigned char *raw = malloc(in->pool_bytes);
    download(&in->be, raw, in->pool, in->pool_bytes);
    return raw;
}

static uint16_t random_input(test_rng *rng, gdn_dtype dtype, double scale)
{
    const float x = (float)(scale * test_rng_normal(rng));
    return dtype == GDN_DTYPE_BF16 ? gdn__f32_to_bf16(x) : gdn__f32_to_f16(x);
}

void op_check_views(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype state_dtype,
                    uint64_t seed)
{
    op_check_views_tokens(backend, preset, strategy, state_dtype, MAX_T, seed);
}

void op_check_views_tokens(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy,
                           gdn_dtype state_dtype, int32_t max_tokens, uint64_t seed)
{
    cr_assert(max_tokens >= 1 && max_tokens <= MAX_T, "max_tokens %d", max_tokens);
    gdn_model_config model;
    cr_assert_eq(gdn_model_preset(preset, 1, &model), GDN_OK);
    const geometry g = {model.num_k_heads, model.num_v_heads, model.head_dim_k, model.head_dim_v, 0, 2, 2,
                        gdn_dtype_size(state_dtype)};
    const gdn_op_layer shape = {
        .model = model,
        .input_dtype = GDN_DTYPE_BF16,
        .output_dtype = GDN_DTYPE_BF16,
        .pool = {.dtype = state_dtype, .num_slots = NUM_SLOTS},
        .strategy = strategy,
        .max_batch = MAX_ROWS,
        .max_tokens = max_tokens,
        .ring_length = 5, /* short: write-backs happen inside the sequence */
        .ring_write_through = -1, /* the ring's own decode (ring_checks.c tests the write-through) */
    };
    const int count = backend == GDN_BACKEND_CUDA ? 4 : 2;
    instance inst[4];
    for (int n = 0; n < count; n++) setup_instance(&inst[n], n < 2 ? GDN_BACKEND_CPU : GDN_BACKEND_CUDA, n % 2, &shape, &g);

    test_rng rng = test_rng_seeded(seed);
    /* Pool: random states, the gaps between slots a pattern that must survive. */
    unsigned char *pool0 = malloc(inst[0].pool_bytes);
    for (size_t e = 0; e < inst[0].pool_bytes / g.state_size; e++) {
        const int64_t within = (int64_t)e % inst[0].op.pool.slot_stride;
        const float x = within < (int64_t)g.HV * g.V * g.K ? (float)(0.1 * test_rng_normal(&rng)) : -4096.0f;
        gdn__store_f32(pool0, state_dtype, (int64_t)e, x);
    }
    float params[2 * 64];
    for (int32_t h = 0; h < 2 * g.HV; h++) params[h] = (float)(0.1 * test_rng_normal(&rng));
    for (int n = 0; n < count; n++) {
        upload(&inst[n].be, inst[n].pool, pool0, inst[n].pool_bytes);
        upload(&inst[n].be, inst[n].params, params, 2 * (size_t)g.HV * sizeof(float));
    }

    const size_t max_tok = (size_t)MAX_ROWS * MAX_T;
    uint16_t *q = malloc(2 * max_tok * g.HK * g.K), *k = malloc(2 * max_tok * g.HK * g.K);
    uint16_t *v = malloc(2 * max_tok * g.HV * g.V), *a = malloc(2 * max_tok * g.HV), *b = malloc(2 * max_tok * g.HV);
    unsigned char *poison = malloc(inst[1].out_bytes);
    memset(poison, 0xff, inst[1].out_bytes);
    double worst_out = 0.0, worst_state = 0.0;
    for (int step = 0; step < STEPS; step++) {
        const int verify = step % 3 != 0;
        const int32_t T = verify ? 1 + test_rng_below(&rng, max_tokens) : 1;
        const int32_t B = 1 + test_rng_below(&rng, MAX_ROWS);
        int32_t slots[MAX_ROWS], writes[MAX_ROWS], accepted[MAX_ROWS], used[NUM_SLOTS] = {0};
        for (int32_t i = 0; i < B; i++) {
            int32_t s;
            do s = test_rng_below(&rng, NUM_SLOTS);
            while (used[s]);
            used[s] = 1;
            slots[i] = test_rng_below(&rng, 7) == 0 ? -1 : s;
            writes[i] = slots[i];
            accepted[i] = test_rng_below(&rng, T + 1);
        }
        /* Sometimes the first live row writes a slot no row reads (a fork). */
        const int fork = step % 4 == 1 && slots[0] >= 0;
        if (fork)
            for (int32_t s = 0; s < NUM_SLOTS; s++)
                if (!used[s]) {
                    writes[0] = s;
                    break;
                }
        for (size_t e = 0; e < (size_t)B * T * g.HK * g.K; e++)
            q[e] = random_input(&rng, GDN_DTYPE_BF16, 1.0), k[e] = random_input(&rng, GDN_DTYPE_BF16, 1.0);
        for (size_t e = 0; e < (size_t)B * T * g.HV * g.V; e++) v[e] = random_input(&rng, GDN_DTYPE_BF16, 1.0);
        for (size_t e = 0; e < (size_t)B * T * g.HV; e++)
            a[e] = random_input(&rng, GDN_DTYPE_BF16, 0.1), b[e] = random_input(&rng, GDN_DTYPE_BF16, 0.1);

        double *outs[4];
        unsigned char *pools[4];
        for (int n = 0; n < count; n++) {
            instance *in = &inst[n];
            write_inputs(in, &g, B, T, q, k, v, a, b);
            upload(&in->be, in->out, poison, in->out_bytes);
            upload(&in->be, in->slots, slots, sizeof(int32_t) * B);
            upload(&in->be, in->writes, writes, sizeof(int32_t) * B);
            upload(&in->be, in->accepted, accepted, sizeof(int32_t) * B);
            in->op.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
            in->op.tokens = T;
            in->op.batch = B;
            in->op.write_slots = fork ? in->writes : NULL;
            cr_assert_eq(gdn_op_layer_step(&in->op, NULL), GDN_OK, "step %d instance %d", step, n);
            if (verify) cr_assert_eq(gdn_op_commit(&in->op, in->accepted, NULL), GDN_OK);
            cr_assert_eq(in->be.iface->synchronize(in->be.ctx, NULL), GDN_OK);
            outs[n] = read_outputs(in, &g, B, T);
            pools[n] = read_pool(in);
        }
        const size_t n_out = (size_t)B * T * g.HV * g.V;
        for (int32_t i = 0; i < B; i++)
            if (slots[i] < 0)
                for (size_t e = 0; e < (size_t)T * g.HV * g.V; e++)
                    cr_assert_eq(outs[0][(size_t)i * T * g.HV * g.V + e], 0.0, "padding row %d output", i);
        for (int n = 1; n < count; n += 2) {
            cr_assert_eq(memcmp(outs[n], outs[n - 1], n_out * sizeof(double)), 0, "step %d: strided outputs differ (%d)", step, n);
            cr_assert_eq(memcmp(pools[n], pools[n - 1], inst[0].pool_bytes), 0, "step %d: strided pool differs (%d)", step, n);
        }
        for (size_t e = 0; e < inst[0].pool_bytes / g.state_size; e++)
            if ((int64_t)e % inst[0].op.pool.slot_stride >= (int64_t)g.HV * g.V * g.K)
                cr_assert_eq(gdn__load_f32(pools[0], state_dtype, (int64_t)e), -4096.0f, "a gap between slots was written");
        if (count == 4) { /* the GPU against the float64 reference */
            /* The CPU op rounds the state where the GPU does: outputs compare at the fp32 bound. */
            const gdn__tolerance t = gdn__spec4_tolerance(state_dtype), f32 = gdn__spec4_tolerance(GDN_DTYPE_F32);
            const double r = test_error_ratio(outs[2], outs[0], n_out, f32.out_abs, f32.out_rel);
            cr_assert_leq(r, 1.0, "step %d: GPU outputs off by %.3g of the tolerance", step, r);
            worst_out = fmax(worst_out, r);
            const size_t n_state = inst[0].pool_bytes / g.state_size;
            double *s_gpu = malloc(n_state * sizeof(double)), *s_cpu = malloc(n_state * sizeof(double));
            for (size_t e = 0; e < n_state; e++)
                s_gpu[e] = gdn__load_f32(pools[2], state_dtype, (int64_t)e), s_cpu[e] = gdn__load_f32(pools[0], state_dtype, (int64_t)e);
            const double rs = test_error_ratio(s_gpu, s_cpu, n_state, t.state_abs, t.state_rel);
            cr_assert_leq(rs, 1.0, "step %d: GPU states off by %.3g of the tolerance", step, rs);
            worst_state = fmax(worst_state, rs);
            free(s_gpu), free(s_cpu);
        }
        for (int n = 0; n < count; n++) free(outs[n]), free(pools[n]);
    }
    if (count == 4) cr_log_info("worst GPU error: outputs %.3f, states %.3f of the tolerance", worst_out, worst_state);
    free(q), free(k), free(v), free(a), free(b), free(poison), free(pool0);
    for (int n = 0; n < count; n++) free_instance(&inst[n]);
}

/* ---------------------------------------------------------------------------------------------- */
/* Flush and slot operations                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* The tiny preset (HK 2, HV 4, K = V = 64) over an F32 pool of WORK_SLOTS slots. */
enum {
    WORK_SLOTS = 8, WORK_ROWS = 3, WORK_T = 2, WORK_HK = 2, WORK_HV = 4, WORK_D = 64,
    WORK_STATE = WORK_HV * WORK_D * WORK_D, WORK_SLOT_BYTES = WORK_STATE * 4
};

/* The op's buffers, all in the backend's memory (device memory on CUDA). LIST holds the slot lists
 * that flush reads (up to WORK_ROWS + 1 entries, so that a refused count reads nothing out of it). */
enum { W_Q, W_K, W_V, W_A, W_B, W_OUT, W_POOL, W_PARAMS, W_ROWS, W_ACCEPTED, W_LIST, W_BUFFERS };
static const size_t work_bytes[W_BUFFERS] = {
    [W_Q] = 2 * WORK_ROWS * WORK_T * WORK_HK * WORK_D, [W_K] = 2 * WORK_ROWS * WORK_T * WORK_HK * WORK_D,
    [W_V] = 2 * WORK_ROWS * WORK_T * WORK_HV * WORK_D, [W_A] = 2 * WORK_ROWS * WORK_T * WORK_HV,
    [W_B] = 2 * WORK_ROWS * WORK_T * WORK_HV,          [W_OUT] = 4 * WORK_ROWS * WORK_T * WORK_HV * WORK_D,
    [W_POOL] = (size_t)WORK_SLOTS * WORK_SLOT_BYTES,   [W_PARAMS] = 4 * 2 * WORK_HV,
    [W_ROWS] = 4 * WORK_ROWS,                          [W_ACCEPTED] = 4 * WORK_ROWS,
    [W_LIST] = 4 * (WORK_ROWS + 1),
};

typedef struct work_op {
    gdn__backend be;
    gdn_op_layer op;
    void *mem[W_BUFFERS];
    void *workspace;
    size_t workspace_bytes;
} work_op;

static void work_backend(gdn__backend *be, gdn_backend_kind kind)
{
    if (kind == GDN_BACKEND_CPU) cr_assert_eq(gdn__backend_cpu_create(4096, be), GDN_OK);
    else cr_assert_eq(gdn__backend_cuda_create(0, 4096, be), GDN_OK, "CUDA backend");
}

/* Points the op's fields at the work op's buffers. */
static void work_point(work_op *w)
{
    gdn_op_layer *op = &w->op;
    op->q = (gdn_view){w->mem[W_Q], 0, 0, 0}, op->k = (gdn_view){w->mem[W_K], 0, 0, 0};
    op->v = (gdn_view){w->mem[W_V], 0, 0, 0}, op->a = (gdn_view){w->mem[W_A], 0, 0, 0};
    op->b = (gdn_view){w->mem[W_B], 0, 0, 0}, op->o = (gdn_view){w->mem[W_OUT], 0, 0, 0};
    op->A_log = w->mem[W_PARAMS], op->dt_bias = (const float *)w->mem[W_PARAMS] + WORK_HV;
    op->pool = (gdn_state_pool){w->mem[W_POOL], GDN_DTYPE_F32, WORK_SLOTS, WORK_STATE};
    op->read_slots = w->mem[W_ROWS];
    op->workspace = w->workspace;
}

/* A tiny op over `backend` memory whose slots 0..2 have pending work (two verify + commit steps);
 * the same seed draws the same pool, parameters and inputs on every backend. */
static work_op *make_work_op(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    work_op *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    work_backend(&w->be, backend);
    gdn_op_layer *op = &w->op;
    cr_assert_eq(gdn_model_preset("tiny", 1, &op->model), GDN_OK);
    cr_assert(op->model.num_k_heads == WORK_HK && op->model.num_v_heads == WORK_HV && op->model.head_dim_k == WORK_D &&
              op->model.head_dim_v == WORK_D, "the tiny preset changed");
    op->backend = backend, op->input_dtype = GDN_DTYPE_BF16, op->output_dtype = GDN_DTYPE_F32;
    op->kind = GDN_STEP_VERIFY, op->tokens = WORK_T, op->batch = WORK_ROWS;
    op->strategy = strategy, op->max_batch = WORK_ROWS, op->max_tokens = WORK_T, op->ring_length = 6;
    op->ring_write_through = -1; /* decodes leave pending work for the slot operations */
    for (int n = 0; n < W_BUFFERS; n++) w->mem[n] = backend_alloc(&w->be, work_bytes[n]);
    work_point(w); /* the pool's shape first: the workspace depends on it */
    w->workspace_bytes = gdn_op_workspace_bytes(op);
    cr_assert_gt(w->workspace_bytes, 0);
    w->workspace = backend_alloc(&w->be, w->workspace_bytes); /* zero-filled */
    op->workspace = w->workspace;

    test_rng rng = test_rng_seeded(seed);
    float *pool = malloc(work_bytes[W_POOL]), params[2 * WORK_HV];
    for (size_t e = 0; e < work_bytes[W_POOL] / 4; e++) pool[e] = (float)(0.1 * test_rng_normal(&rng));
    for (int h = 0; h < 2 * WORK_HV; h++) params[h] = (float)(0.1 * test_rng_normal(&rng));
    upload(&w->be, w->mem[W_POOL], pool, work_bytes[W_POOL]);
    upload(&w->be, w->mem[W_PARAMS], params, sizeof params);
    free(pool);
    int32_t rows[WORK_ROWS], accepted[WORK_ROWS];
    for (int i = 0; i < WORK_ROWS; i++) rows[i] = i, accepted[i] = 1 + i % 2;
    upload(&w->be, w->mem[W_ROWS], rows, sizeof rows);
    upload(&w->be, w->mem[W_ACCEPTED], accepted, sizeof accepted);
    uint16_t *q = malloc(work_bytes[W_Q]), *k = malloc(work_bytes[W_K]), *v = malloc(work_bytes[W_V]);
    uint16_t *a = malloc(work_bytes[W_A]), *b = malloc(work_bytes[W_B]);
    for (int step = 0; step < 2; step++) {
        for (size_t e = 0; e < work_bytes[W_Q] / 2; e++)
            q[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng)), k[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng));
        for (size_t e = 0; e < work_bytes[W_V] / 2; e++) v[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng));
        for (size_t e = 0; e < work_bytes[W_A] / 2; e++)
            a[e] = gdn__f32_to_bf16((float)(0.1 * test_rng_normal(&rng))),
            b[e] = gdn__f32_to_bf16((float)(0.1 * test_rng_normal(&rng)));
        /* The uploads synchronise: the previous step has read its inputs before they are replaced. */
        upload(&w->be, w->mem[W_Q], q, work_bytes[W_Q]), upload(&w->be, w->mem[W_K], k, work_bytes[W_K]);
        upload(&w->be, w->mem[W_V], v, work_bytes[W_V]);
        upload(&w->be, w->mem[W_A], a, work_bytes[W_A]), upload(&w->be, w->mem[W_B], b, work_bytes[W_B]);
        cr_assert_eq(gdn_op_layer_step(op, NULL), GDN_OK, "step %d", step);
        cr_assert_eq(gdn_op_commit(op, w->mem[W_ACCEPTED], NULL), GDN_OK, "commit %d", step);
    }
    cr_assert_eq(w->be.iface->synchronize(w->be.ctx, NULL), GDN_OK, "the steps ran: %s", w->be.iface->last_error(w->be.ctx));
    free(q), free(k), free(v), free(a), free(b);
    return w;
}

/* A host copy of `bytes` bytes of the work op's memory at `src`. */
static void *work_read(work_op *w, const void *src, size_t bytes)
{
    void *host = malloc(bytes);
    cr_assert_not_null(host);
    download(&w->be, host, src, bytes);
    return host;
}

/* A second op on its own backend of the same kind, every buffer and the workspace copied. */
static work_op *clone_work_op(work_op *w)
{
    work_op *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    work_backend(&c->be, w->op.backend);
    c->op = w->op;
    c->workspace_bytes = w->workspace_bytes;
    for (int n = 0; n <= W_BUFFERS; n++) {
        void **dst = n < W_BUFFERS ? &c->mem[n] : &c->workspace, *src = n < W_BUFFERS ? w->mem[n] : w->workspace;
        const size_t bytes = n < W_BUFFERS ? work_bytes[n] : w->workspace_bytes;
        void *host = work_read(w, src, bytes);
        *dst = backend_alloc(&c->be, bytes);
        upload(&c->be, *dst, host, bytes);
        free(host);
    }
    work_point(c);
    return c;
}

static void free_work_op(work_op *w)
{
    for (int n = 0; n < W_BUFFERS; n++) w->be.iface->free(w->be.ctx, w->mem[n]);
    w->be.iface->free(w->be.ctx, w->workspace);
    w->be.iface->destroy(w->be.ctx);
    free(w);
}

/* Backend memory: slot `slot` of the pool; the flush list, holding `count` slots. */
static void *work_slot(const work_op *w, int32_t slot) { return (char *)w->mem[W_POOL] + (size_t)slot * WORK_SLOT_BYTES; }
static const int32_t *work_list(work_op *w, const int32_t *slots, int32_t count)
{
    upload(&w->be, w->mem[W_LIST], slots, sizeof(int32_t) * (size_t)count);
    return w->mem[W_LIST];
}

/* Exact comparison of two slots' states (host copies of backend memory). */
static int work_slots_equal(work_op *x, int32_t sx, work_op *y, int32_t sy)
{
    void *a = work_read(x, work_slot(x, sx), WORK_SLOT_BYTES), *b = work_read(y, work_slot(y, sy), WORK_SLOT_BYTES);
    const int equal = memcmp(a, b, WORK_SLOT_BYTES) == 0;
    free(a), free(b);
    return equal;
}

/* |gpu - cpu| within SPEC 4 (fp32 state) over `n` floats: the ratio to the tolerance. */
static double work_error_ratio(const float *gpu, const float *cpu, size_t n, double abs_tol, double rel_tol)
{
    double *g = malloc(n * sizeof(double)), *c = malloc(n * sizeof(double));
    for (size_t e = 0; e < n; e++) g[e] = gpu[e], c[e] = cpu[e];
    const double r = test_error_ratio(g, c, n, abs_tol, rel_tol);
    free(g), free(c);
    return r;
}

void op_check_slot_ops(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    work_op *w = make_work_op(backend, strategy, seed);
    work_op *twin = clone_work_op(w);
    const int32_t one[1] = {1}, pair[2] = {2, 6}, rest[2] = {0, 2};
    void *buf = backend_alloc(&w->be, WORK_SLOT_BYTES), *back = backend_alloc(&w->be, WORK_SLOT_BYTES);

    /* export = the state after a flush of that slot (the twin flushes it explicitly). */
    cr_assert_eq(gdn_op_slot_export(&w->op, 1, buf, NULL), GDN_OK);
    cr_assert_eq(gdn_op_flush(&twin->op, work_list(twin, one, 1), 1, NULL), GDN_OK);
    float *exported = work_read(w, buf, WORK_SLOT_BYTES), *flushed = work_read(twin, work_slot(twin, 1), WORK_SLOT_BYTES);
    cr_assert_eq(memcmp(exported, flushed, WORK_SLOT_BYTES), 0, "export of slot 1");
    free(exported), free(flushed);

    /* copy carries the pending work: flushing both gives the same state. */
    cr_assert_eq(gdn_op_slot_copy(&w->op, 6, 2, NULL), GDN_OK);
    cr_assert_eq(gdn_op_flush(&w->op, work_list(w, pair, 2), 2, NULL), GDN_OK);
    cr_assert(work_slots_equal(w, 6, w, 2), "copy then flush");
    if (strategy != GDN_VERIFY_CACHE) /* and the flush did change it: there was work pending */
        cr_assert(!work_slots_equal(w, 2, twin, 2), "slot 2 had no pending work");

    /* import drops the pending work; export returns exactly what was imported; reset gives zeros. */
    float *pattern = malloc(WORK_SLOT_BYTES), *got;
    for (int i = 0; i < WORK_STATE; i++) pattern[i] = (float)(0.001 * (i % 1013));
    upload(&w->be, buf, pattern, WORK_SLOT_BYTES);
    cr_assert_eq(gdn_op_slot_import(&w->op, 0, buf, NULL), GDN_OK);
    cr_assert_eq(gdn_op_slot_export(&w->op, 0, back, NULL), GDN_OK);
    got = work_read(w, back, WORK_SLOT_BYTES);
    cr_assert_eq(memcmp(got, pattern, WORK_SLOT_BYTES), 0, "import then export");
    free(got);
    cr_assert_eq(gdn_op_slot_reset(&w->op, 0, NULL), GDN_OK);
    cr_assert_eq(gdn_op_slot_export(&w->op, 0, back, NULL), GDN_OK);
    got = work_read(w, back, WORK_SLOT_BYTES);
    for (int i = 0; i < WORK_STATE; i++) cr_assert_eq(got[i], 0.0f, "reset then export, element %d", i);
    free(got), free(pattern);

    if (backend == GDN_BACKEND_CUDA) { /* the GPU against the float64 reference: the same scenario on the CPU */
        work_op *cpu = make_work_op(GDN_BACKEND_CPU, strategy, seed);
        const int32_t all[3] = {0, 1, 2};
        cr_assert_eq(gdn_op_flush(&cpu->op, work_list(cpu, all, 3), 3, NULL), GDN_OK);
        cr_assert_eq(gdn_op_flush(&twin->op, work_list(twin, rest, 2), 2, NULL), GDN_OK); /* slot 1 already is */
        const gdn__tolerance t = gdn__spec4_tolerance(GDN_DTYPE_F32);
        float *g_pool = work_read(twin, twin->mem[W_POOL], work_bytes[W_POOL]);
        float *c_pool = work_read(cpu, cpu->mem[W_POOL], work_bytes[W_POOL]);
        const double rs = work_error_ratio(g_pool, c_pool, work_bytes[W_POOL] / 4, t.state_abs, t.state_rel);
        cr_assert_leq(rs, 1.0, "flushed GPU pool off by %.3g of the tolerance", rs);
        /* the slot that w copied and flushed on the GPU: the CPU's flushed slot 2 */
        float *g_copy = work_read(w, work_slot(w, 6), WORK_SLOT_BYTES);
        const double rc = work_error_ratio(g_copy, c_pool + 2 * (size_t)WORK_STATE, WORK_STATE, t.state_abs, t.state_rel);
        cr_assert_leq(rc, 1.0, "copied and flushed GPU slot off by %.3g of the tolerance", rc);
        float *g_out = work_read(twin, twin->mem[W_OUT], work_bytes[W_OUT]);
        float *c_out = work_read(cpu, cpu->mem[W_OUT], work_bytes[W_OUT]);
        const double ro = work_error_ratio(g_out, c_out, work_bytes[W_OUT] / 4, t.out_abs, t.out_rel);
        cr_assert_leq(ro, 1.0, "GPU outputs off by %.3g of the tolerance", ro);
        cr_log_info("worst GPU error: flushed states %.2e, copied slot %.2e, outputs %.2e of the tolerance", rs, rc, ro);
        free(g_pool), free(c_pool), free(g_copy), free(g_out), free(c_out);
        free_work_op(cpu);
    }
    w->be.iface->free(w->be.ctx, buf), w->be.iface->free(w->be.ctx, back);
    free_work_op(w), free_work_op(twin);
}

void op_check_slot_op_refusals(gdn_backend_kind backend, uint64_t seed)
{
    work_op *w = make_work_op(backend, GDN_VERIFY_FOLD, seed);
    void *pool_before = work_read(w, w->mem[W_POOL], work_bytes[W_POOL]);
    void *ws_before = work_read(w, w->workspace, w->workspace_bytes);
    void *buf = backend_alloc(&w->be, WORK_SLOT_BYTES);
    const int32_t four[4] = {0, 1, 2, 3};
    const int32_t *rows = work_list(w, four, 4);
    cr_assert_eq(gdn_op_slot_copy(&w->op, WORK_SLOTS, 1, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_copy(&w->op, 1, -1, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_copy(&w->op, 1, 1, NULL), GDN_EINVAL, "dst == src");
    cr_assert_eq(gdn_op_slot_export(&w->op, 1, NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_slot_export(&w->op, -1, buf, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_import(&w->op, WORK_SLOTS + 3, buf, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_reset(&w->op, WORK_SLOTS, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_flush(&w->op, rows, WORK_ROWS + 1, NULL), GDN_ESTEP_BATCH);
    cr_assert_eq(gdn_op_flush(&w->op, rows, -1, NULL), GDN_ESTEP_BATCH);
    cr_assert_eq(gdn_op_flush(&w->op, NULL, 2, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_flush(NULL, rows, 1, NULL), GDN_EINVAL);
    gdn_op_layer no_params = w->op;
    no_params.A_log = NULL;
    cr_assert_eq(gdn_op_flush(&no_params, rows, 1, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_slot_export(&no_params, 1, buf, NULL), GDN_EINVAL, "export under fold without A_log");
    gdn_op_layer auto_backend = w->op;
    auto_backend.backend = GDN_BACKEND_AUTO;
    cr_assert_eq(gdn_op_slot_copy(&auto_backend, 2, 1, NULL), GDN_EINVAL, "AUTO backend");
    cr_assert_eq(gdn_op_slot_reset(&auto_backend, 1, NULL), GDN_EINVAL, "AUTO backend");
    cr_assert_eq(w->be.iface->synchronize(w->be.ctx, NULL), GDN_OK);
    void *pool_after = work_read(w, w->mem[W_POOL], work_bytes[W_POOL]);
    void *ws_after = work_read(w, w->workspace, w->workspace_bytes);
    cr_assert_eq(memcmp(pool_after, pool_before, work_bytes[W_POOL]), 0, "a refused call changed the pool");
    cr_assert_eq(memcmp(ws_after, ws_before, w->workspace_bytes), 0, "a refused call changed the workspace");
    free(pool_before), free(ws_before), free(pool_after), free(ws_after);
    w->be.iface->free(w->be.ctx, buf);
    free_work_op(w);
}
