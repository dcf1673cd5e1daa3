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
        .max_tokens = MAX_T,
        .ring_length = 5, /* short: write-backs happen inside the sequence */
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
        const int32_t T = verify ? 1 + test_rng_below(&rng, MAX_T) : 1;
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
