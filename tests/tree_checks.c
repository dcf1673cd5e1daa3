/*
 * Per-row token counts and token trees (SPEC 3) through the op layer, on either backend: random trees
 * against a straightforward float64 model written here (per node: run the token from its parent's
 * state), every node accepted in turn, under each verify strategy with fp32 and bf16 state; mixed
 * counts; a tree that is a chain against the chain path, bit for bit; and bad counts, parents and
 * nodes, read on the device, as padding with the sticky flag raised. The op's tensors live in backend
 * memory; the test keeps host copies and moves them around each call.
 */
#include "tree_checks.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend_impl.h"
#include "gdn/gdn_op.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_spec.h"
#include "support.h"
#include "tree_model.h"

enum { MAXT = TREE_MAX_NODES, WARM = 3, MAX_DIM = 256, MAX_HV = 64 };


/* One set of step inputs, bf16, dense [B, MAXT, ...] (a step of T tokens reads them as [B, T, ...]). */
typedef struct inputs {
    uint16_t *q, *k, *v, *a, *b;
} inputs;

typedef struct tcase {
    gdn_op_layer op;
    gdn__backend be;
    int32_t HK, HV, K, V, B, slots;
    gdn_dtype sdt;
    inputs in[2];           /* host: 0: the warm-up chain, 1: the tree step */
    inputs dev[2];          /* the same in backend memory */
    float *out, *dev_out;   /* [B, T, HV, V] f32 */
    unsigned char *pool, *pool0, *dev_pool;
    size_t pool_bytes, slot_bytes, out_bytes;
    float A_log[MAX_HV], dt_bias[MAX_HV];
    int32_t *read, *counts, *parents, *accepted; /* host */
    int32_t *dev_ints;      /* backend: read [B], counts [B], parents [B * MAXT], accepted [B], flag [1] */
    int32_t flag;
    void *ws, *dev_export;
    size_t ws_bytes;
    void *allocs[24];       /* backend memory, freed with the case */
    int allocs_used;
} tcase;

static uint16_t bf16(double x) { return gdn__f32_to_bf16((float)x); }

static void *be_alloc(tcase *c, size_t bytes)
{
    void *ptr = NULL;
    cr_assert_eq(c->be.iface->alloc(c->be.ctx, bytes, &ptr), GDN_OK);
    cr_assert_eq(c->be.iface->synchronize(c->be.ctx, NULL), GDN_OK); /* the backend's zero-fill first */
    cr_assert_lt(c->allocs_used, (int)(sizeof c->allocs / sizeof c->allocs[0]));
    c->allocs[c->allocs_used++] = ptr;
    return ptr;
}
static void be_upload(tcase *c, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(c->be.iface->upload(c->be.ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(c->be.iface->synchronize(c->be.ctx, NULL), GDN_OK);
}
static void be_download(tcase *c, void *dst, const void *src, size_t bytes)
{
    cr_assert_eq(c->be.iface->download(c->be.ctx, dst, src, bytes, NULL), GDN_OK);
    cr_assert_eq(c->be.iface->synchronize(c->be.ctx, NULL), GDN_OK);
}

static size_t qk_elems(const tcase *c) { return (size_t)c->B * MAXT * c->HK * c->K; }
static size_t v_elems(const tcase *c) { return (size_t)c->B * MAXT * c->HV * c->V; }
static size_t gate_elems(const tcase *c) { return (size_t)c->B * MAXT * c->HV; }

static void fill_inputs(const tcase *c, inputs *in, test_rng *rng)
{
    for (size_t e = 0; e < qk_elems(c); e++) in->q[e] = bf16(test_rng_normal(rng)), in->k[e] = bf16(test_rng_normal(rng));
    for (size_t e = 0; e < v_elems(c); e++) in->v[e] = bf16(test_rng_normal(rng));
    for (size_t e = 0; e < gate_elems(c); e++) in->a[e] = bf16(0.1 * test_rng_normal(rng)), in->b[e] = bf16(0.1 * test_rng_normal(rng));
}

static tcase *tc_create(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                        int32_t B, uint64_t seed)
{
    tcase *c = calloc(1, sizeof *c);
    gdn_op_layer *op = &c->op;
    cr_assert_eq(gdn_model_preset(preset, 1, &op->model), GDN_OK);
    c->HK = op->model.num_k_heads, c->HV = op->model.num_v_heads, c->K = op->model.head_dim_k, c->V = op->model.head_dim_v;
    cr_assert_leq(c->HV, MAX_HV);
    if (backend == GDN_BACKEND_CPU) cr_assert_eq(gdn__backend_cpu_create(4096, &c->be), GDN_OK);
    else cr_assert_eq(gdn__backend_cuda_create(0, 4096, &c->be), GDN_OK);
    test_rng rng = test_rng_seeded(seed);
    c->B = B, c->slots = B + 1, c->sdt = sdt; /* slot B is in no step */
    for (int s = 0; s < 2; s++) {
        inputs *in = &c->in[s], *dev = &c->dev[s];
        in->q = calloc(qk_elems(c), 2), in->k = calloc(qk_elems(c), 2), in->v = calloc(v_elems(c), 2);
        in->a = calloc(gate_elems(c), 2), in->b = calloc(gate_elems(c), 2);
        fill_inputs(c, in, &rng);
        dev->q = be_alloc(c, qk_elems(c) * 2), dev->k = be_alloc(c, qk_elems(c) * 2), dev->v = be_alloc(c, v_elems(c) * 2);
        dev->a = be_alloc(c, gate_elems(c) * 2), dev->b = be_alloc(c, gate_elems(c) * 2);
        be_upload(c, dev->q, in->q, qk_elems(c) * 2), be_upload(c, dev->k, in->k, qk_elems(c) * 2);
        be_upload(c, dev->v, in->v, v_elems(c) * 2);
        be_upload(c, dev->a, in->a, gate_elems(c) * 2), be_upload(c, dev->b, in->b, gate_elems(c) * 2);
    }
    c->out_bytes = v_elems(c) * sizeof(float);
    c->out = calloc(1, c->out_bytes), c->dev_out = be_alloc(c, c->out_bytes);
    c->slot_bytes = (size_t)c->HV * c->V * c->K * gdn_dtype_size(sdt);
    c->pool_bytes = c->slot_bytes * (size_t)c->slots;
    c->pool = malloc(c->pool_bytes), c->pool0 = malloc(c->pool_bytes), c->dev_pool = be_alloc(c, c->pool_bytes);
    c->dev_export = be_alloc(c, c->slot_bytes);
    for (size_t e = 0; e < (size_t)c->HV * c->V * c->K * (size_t)c->slots; e++)
        gdn__store_f32(c->pool0, sdt, (int64_t)e, (float)(0.1 * test_rng_normal(&rng)));
    for (int h = 0; h < c->HV; h++) c->A_log[h] = (float)(0.1 * test_rng_normal(&rng)), c->dt_bias[h] = (float)(0.1 * test_rng_normal(&rng));
    float *params = be_alloc(c, 2 * sizeof(float) * (size_t)c->HV);
    be_upload(c, params, c->A_log, sizeof(float) * (size_t)c->HV);
    be_upload(c, params + c->HV, c->dt_bias, sizeof(float) * (size_t)c->HV);
    c->read = calloc((size_t)B, sizeof(int32_t));
    c->counts = calloc((size_t)B, sizeof(int32_t));
    c->parents = calloc((size_t)B * MAXT, sizeof(int32_t));
    c->accepted = calloc((size_t)B, sizeof(int32_t));
    c->dev_ints = be_alloc(c, sizeof(int32_t) * ((size_t)B * (3 + MAXT) + 1));
    for (int32_t i = 0; i < B; i++) c->read[i] = (i * 3 + 1) % B; /* slots in another order than rows */
    be_upload(c, c->dev_ints, c->read, sizeof(int32_t) * (size_t)B);
    op->backend = backend;
    op->input_dtype = GDN_DTYPE_BF16;
    op->output_dtype = GDN_DTYPE_F32;
    op->kind = GDN_STEP_VERIFY;
    op->batch = B;
    op->A_log = params, op->dt_bias = params + c->HV;
    op->o = (gdn_view){c->dev_out, 0, 0, 0};
    op->pool = (gdn_state_pool){c->dev_pool, sdt, c->slots, (int64_t)c->HV * c->V * c->K};
    op->read_slots = c->dev_ints;
    op->error_flag = c->dev_ints + (size_t)B * (3 + MAXT);
    op->strategy = strategy;
    op->max_batch = B, op->max_tokens = MAXT;
    c->ws_bytes = gdn_op_workspace_bytes(op);
    cr_assert_gt(c->ws_bytes, 0);
    c->ws = calloc(1, c->ws_bytes);
    op->workspace = be_alloc(c, c->ws_bytes);
    return c;
}

static void tc_free(tcase *c)
{
    for (int s = 0; s < 2; s++) free(c->in[s].q), free(c->in[s].k), free(c->in[s].v), free(c->in[s].a), free(c->in[s].b);
    free(c->out), free(c->pool), free(c->pool0), free(c->read), free(c->counts), free(c->parents), free(c->accepted);
    free(c->ws);
    for (int n = 0; n < c->allocs_used; n++) c->be.iface->free(c->be.ctx, c->allocs[n]);
    c->be.iface->destroy(c->be.ctx);
    free(c);
}

static int32_t *dev_counts(const tcase *c) { return c->dev_ints + c->B; }
static int32_t *dev_parents(const tcase *c) { return c->dev_ints + 2 * (size_t)c->B; }
static int32_t *dev_accepted(const tcase *c) { return c->dev_ints + (size_t)c->B * (2 + MAXT); }

/* Fresh pool and workspace, no flag. */
static void tc_reset(tcase *c)
{
    memcpy(c->pool, c->pool0, c->pool_bytes);
    be_upload(c, c->dev_pool, c->pool0, c->pool_bytes);
    be_upload(c, c->op.workspace, c->ws, c->ws_bytes); /* c->ws stays zero */
    c->flag = 0;
}

/* The op reading input set s as a step of T tokens, outputs poisoned. */
static void tc_use(tcase *c, int s, int32_t T)
{
    const inputs *in = &c->dev[s];
    c->op.tokens = T;
    c->op.q = (gdn_view){in->q, 0, 0, 0}, c->op.k = (gdn_view){in->k, 0, 0, 0}, c->op.v = (gdn_view){in->v, 0, 0, 0};
    c->op.a = (gdn_view){in->a, 0, 0, 0}, c->op.b = (gdn_view){in->b, 0, 0, 0};
    memset(c->out, 0x7f, c->out_bytes);
    be_upload(c, c->dev_out, c->out, c->out_bytes);
}

/* The step as c->counts / c->parents say (each used when `counts` / `parents`): the host arrays and
 * the flag go to the backend, the outputs, the pool and the flag come back. */
static gdn_status tc_step(tcase *c, int counts, int parents)
{
    be_upload(c, dev_counts(c), c->counts, sizeof(int32_t) * (size_t)c->B);
    be_upload(c, dev_parents(c), c->parents, sizeof(int32_t) * (size_t)c->B * MAXT);
    be_upload(c, c->op.error_flag, &c->flag, sizeof(int32_t));
    c->op.token_counts = counts ? dev_counts(c) : NULL;
    c->op.parents = parents ? dev_parents(c) : NULL;
    const gdn_status status = gdn_op_layer_step(&c->op, NULL);
    be_download(c, c->out, c->dev_out, c->out_bytes);
    be_download(c, c->pool, c->dev_pool, c->pool_bytes);
    be_download(c, &c->flag, c->op.error_flag, sizeof(int32_t));
    return status;
}

/* The commit of the last step with c->accepted, by count or by node. */
static gdn_status tc_commit(tcase *c, int by_node)
{
    be_upload(c, dev_accepted(c), c->accepted, sizeof(int32_t) * (size_t)c->B);
    be_upload(c, c->op.error_flag, &c->flag, sizeof(int32_t));
    const gdn_status status = by_node ? gdn_op_commit_node(&c->op, dev_accepted(c), NULL)
                                      : gdn_op_commit(&c->op, dev_accepted(c), NULL);
    be_download(c, c->pool, c->dev_pool, c->pool_bytes);
    be_download(c, &c->flag, c->op.error_flag, sizeof(int32_t));
    return status;
}

/* The warm-up: a chain verify of WARM tokens from set 0, two accepted (fold and ring then hold
 * pending work when the tree step runs; the ring's records start at 2). */
static void tc_warm_up(tcase *c)
{
    tc_use(c, 0, WARM);
    cr_assert_eq(tc_step(c, 0, 0), GDN_OK);
    for (int32_t i = 0; i < c->B; i++) c->accepted[i] = 2;
    cr_assert_eq(tc_commit(c, 0), GDN_OK);
}

/* ---- the model: SPEC 1 straight, one token at a time ---- */

/* Token t of row i of input set s (a step of T tokens) on value head h's state S [V, K]; o [V] or NULL. */
static void model_token(const tcase *c, int s, int32_t T, int32_t i, int32_t t, int32_t h, double *S, double *o)
{
    const inputs *in = &c->in[s];
    const int32_t HK = c->HK, HV = c->HV, K = c->K, V = c->V;
    const int32_t kh = h / (HV / HK);
    const int64_t at = (int64_t)i * T + t;
    double q[MAX_DIM], k[MAX_DIM], v[MAX_DIM];
    for (int e = 0; e < K; e++)
        q[e] = gdn__bf16_to_f32(in->q[(at * HK + kh) * K + e]), k[e] = gdn__bf16_to_f32(in->k[(at * HK + kh) * K + e]);
    for (int e = 0; e < V; e++) v[e] = gdn__bf16_to_f32(in->v[(at * HV + h) * V + e]);
    tree_model_token(K, V, S, q, k, v, gdn__bf16_to_f32(in->a[at * HV + h]), gdn__bf16_to_f32(in->b[at * HV + h]),
                     c->A_log[h], c->dt_bias[h], 1.0 / sqrt((double)K), 1, o);
}

/* Row i's starting state for head h: its slot in pool0, then the warm-up's first two tokens when
 * warm (rounded to the state dtype under CACHE, whose commit stores it). */
static void model_start(const tcase *c, int32_t i, int32_t h, int warm, double *S)
{
    const int32_t HV = c->HV, K = c->K, V = c->V;
    const int64_t base = ((int64_t)c->read[i] * HV + h) * V * K;
    for (int64_t e = 0; e < (int64_t)V * K; e++) S[e] = gdn__load_f32(c->pool0, c->sdt, base + e);
    if (!warm) return;
    for (int32_t t = 0; t < 2; t++) model_token(c, 0, WARM, i, t, h, S, NULL);
    if (c->op.strategy == GDN_VERIFY_CACHE)
        for (int64_t e = 0; e < (int64_t)V * K; e++) S[e] = c->sdt == GDN_DTYPE_BF16 ? gdn__bf16_to_f32(bf16(S[e])) : (double)(float)S[e];
}

/* The state after node `node` of row i (parents row `par`, T tokens), o [V] its output (or NULL). */
static void model_node(const tcase *c, int32_t T, int32_t i, const int32_t *par, int32_t node, int32_t h, int warm,
                       double *S, double *o)
{
    int32_t path[MAXT];
    const int32_t len = tree_path(par, node, path);
    model_start(c, i, h, warm, S);
    for (int32_t j = 0; j < len; j++) model_token(c, 1, T, i, path[j], h, S, j + 1 == len ? o : NULL);
}

/* ---- trees ---- */

/* The state of `slot` after the op (pending work written back), widened. */
static void export_state(tcase *c, int32_t slot, double *S)
{
    unsigned char *buf = malloc(c->slot_bytes);
    cr_assert_eq(gdn_op_slot_export(&c->op, slot, c->dev_export, NULL), GDN_OK);
    be_download(c, buf, c->dev_export, c->slot_bytes);
    for (int64_t e = 0; e < (int64_t)c->HV * c->V * c->K; e++) S[e] = gdn__load_f32(buf, c->sdt, e);
    free(buf);
}

static double max_ratio(double a, double b, double abs_tol, double rel_tol)
{
    const double r = fabs(a - b) / (abs_tol + rel_tol * fabs(b));
    return isnan(r) ? INFINITY : r;
}

/*
 * Random trees of up to T nodes (or chains with counts when `chain`), nodes accepted in turn
 * (`rounds` of them, every node when rounds > T): outputs of every node and the committed state
 * against the model, the untouched slot bit-exact, no flag.
 */
static void random_case(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                        int chain, int32_t T, int32_t B, int32_t rounds, uint64_t seed)
{
    tcase *c = tc_create(backend, preset, strategy, sdt, B, seed);
    const int32_t HV = c->HV, K = c->K, V = c->V;
    test_rng rng = test_rng_seeded(seed * 31 + 7);
    for (int32_t i = 0; i < B; i++) {
        c->counts[i] = i == 0 ? 1 : 1 + test_rng_below(&rng, T); /* one n = 1 row */
        if (i == 1) c->counts[i] = T;
        tree_random(&rng, c->counts[i], c->parents + (int64_t)i * T);
    }
    const gdn__tolerance tol = gdn__spec4_tolerance(sdt);
    double *S = malloc(sizeof(double) * V * K), *got = malloc(sizeof(double) * HV * V * K), o[MAX_DIM];
    double worst_out = 0, worst_state = 0;
    if (rounds > T + 1) rounds = T + 1;
    for (int32_t round = 0; round < rounds; round++) {
        tc_reset(c);
        tc_warm_up(c);
        tc_use(c, 1, T);
        cr_assert_eq(tc_step(c, 1, !chain), GDN_OK);
        const int32_t *parents_of_row0 = chain ? NULL : c->parents;
        if (round == 0) /* every node's output (the same every round) */
            for (int32_t i = 0; i < B; i++)
                for (int32_t t = 0; t < T; t++)
                    for (int32_t h = 0; h < HV; h++) {
                        const float *row = c->out + (((int64_t)i * T + t) * HV + h) * V;
                        if (t >= c->counts[i]) {
                            for (int r = 0; r < V; r++) cr_assert_eq(row[r], 0.0f, "row %d token %d past n", i, t);
                            continue;
                        }
                        model_node(c, T, i, parents_of_row0 ? parents_of_row0 + (int64_t)i * T : NULL, t, h, 1, S, o);
                        for (int r = 0; r < V; r++) {
                            const double e = max_ratio(row[r], o[r], tol.out_abs, tol.out_rel);
                            if (e > worst_out) worst_out = e;
                        }
                    }
        for (int32_t i = 0; i < B; i++) c->accepted[i] = (round * 7 + i) % (c->counts[i] + 1) - 1;
        if (rounds == T + 1)
            for (int32_t i = 0; i < B; i++) c->accepted[i] = round % (c->counts[i] + 1) - 1; /* every node */
        cr_assert_eq(tc_commit(c, 1), GDN_OK);
        cr_assert_eq(c->flag, 0, "round %d raised the flag", round);
        cr_assert_eq(memcmp(c->pool + c->slot_bytes * B, c->pool0 + c->slot_bytes * B, c->slot_bytes), 0,
                     "the slot in no step changed");
        for (int32_t i = 0; i < B; i++) {
            export_state(c, c->read[i], got);
            for (int32_t h = 0; h < HV; h++) {
                model_node(c, T, i, parents_of_row0 ? parents_of_row0 + (int64_t)i * T : NULL, c->accepted[i], h, 1, S, NULL);
                for (int64_t e = 0; e < (int64_t)V * K; e++) {
                    const double r = max_ratio(got[(int64_t)h * V * K + e], S[e], tol.state_abs, tol.state_rel);
                    if (r > worst_state) worst_state = r;
                }
            }
        }
    }
    cr_log_info("%s %s strategy %d state %s %s: worst output %.1f%%, state %.1f%% of tolerance",
                backend == GDN_BACKEND_CUDA ? "cuda" : "cpu", preset, strategy, sdt == GDN_DTYPE_BF16 ? "bf16" : "f32",
                chain ? "chains" : "trees", 100 * worst_out, 100 * worst_state);
    cr_assert_leq(worst_out, 1.0, "output error %.3g x tolerance", worst_out);
    cr_assert_leq(worst_state, 1.0, "state error %.3g x tolerance", worst_state);
    free(S), free(got);
    tc_free(c);
}

void tree_check_random(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                       int chain, int32_t B, int32_t rounds, uint64_t seed)
{
    random_case(backend, preset, strategy, sdt, chain, chain ? 8 : MAXT, B, rounds, seed);
}

void tree_check_random_nodes(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                             int32_t nodes, int32_t B, int32_t rounds, uint64_t seed)
{
    random_case(backend, preset, strategy, sdt, 0, nodes, B, rounds, seed);
}

/* A tree that is a chain (p = t - 1) against the chain path (parents NULL), mixed counts: outputs,
 * pool and every exported state bit for bit; commit by node j against commit by count j + 1. */
void tree_check_chain_is_chain(gdn_backend_kind backend, const char *preset, gdn_verify_strategy strategy, gdn_dtype sdt,
                               uint64_t seed)
{
    enum { B = 4, T = 7 };
    tcase *c[2] = {tc_create(backend, preset, strategy, sdt, B, seed), tc_create(backend, preset, strategy, sdt, B, seed)};
    const int32_t HV = c[0]->HV, K = c[0]->K, V = c[0]->V;
    test_rng rng = test_rng_seeded(seed);
    int32_t acc[B];
    for (int32_t i = 0; i < B; i++) {
        const int32_t n = i == 0 ? 1 : 1 + test_rng_below(&rng, T);
        acc[i] = test_rng_below(&rng, n + 1);
        for (int s = 0; s < 2; s++) {
            c[s]->counts[i] = n;
            for (int32_t t = 0; t < T; t++) c[s]->parents[(int64_t)i * T + t] = t - 1;
        }
    }
    for (int s = 0; s < 2; s++) {
        tc_reset(c[s]);
        tc_warm_up(c[s]); /* it writes accepted[]: the step's come after it */
        for (int32_t i = 0; i < B; i++) c[s]->accepted[i] = s == 0 ? acc[i] : acc[i] - 1;
        tc_use(c[s], 1, T);
        cr_assert_eq(tc_step(c[s], 1, s == 1), GDN_OK);
    }
    cr_assert_eq(memcmp(c[0]->out, c[1]->out, sizeof(float) * B * T * HV * V), 0, "outputs differ");
    cr_assert_eq(tc_commit(c[0], 0), GDN_OK);
    cr_assert_eq(tc_commit(c[1], 1), GDN_OK);
    cr_assert_eq(memcmp(c[0]->pool, c[1]->pool, c[0]->pool_bytes), 0, "pools differ after the commit");
    double *S[2] = {malloc(sizeof(double) * HV * V * K), malloc(sizeof(double) * HV * V * K)};
    for (int32_t slot = 0; slot < B; slot++) {
        export_state(c[0], slot, S[0]), export_state(c[1], slot, S[1]);
        cr_assert_eq(memcmp(S[0], S[1], sizeof(double) * HV * V * K), 0, "slot %d differs", slot);
    }
    cr_assert_eq(c[0]->flag + c[1]->flag, 0);
    free(S[0]), free(S[1]);
    tc_free(c[0]), tc_free(c[1]);
}


/* Bad counts and parents, read on the device: the row or the token (and its descendants) is padding,
 * the flag is raised, the rest runs as the model says; a commit of a node under a bad parent or
 * outside -1..n-1 leaves the slot bit-exact and raises the flag. */
void tree_check_bad_values(gdn_backend_kind backend, gdn_verify_strategy strategy)
{
    enum { B = 4, T = 6 };
    tcase *c = tc_create(backend, "tiny", strategy, GDN_DTYPE_F32, B, 21);
    const int32_t HV = c->HV, K = c->K, V = c->V;
    static const int32_t counts[B] = {T, 0, T + 1, T};
    static const int32_t par[B][T] = {{-1, 0, 0, 1, -1, 4}, {-1, 0, 1, 2, 3, 4}, {-1, 0, 1, 2, 3, 4},
                                      {-1, -2, 2, 2, 0, 4}}; /* row 3: 1 (< -1) and 2 (>= t) bad, 3 under 2 */
    static const int live3[T] = {1, 0, 0, 0, 1, 1};
    memcpy(c->counts, counts, sizeof counts);
    memcpy(c->parents, par, sizeof par);
    tc_reset(c);
    tc_use(c, 1, T);
    cr_assert_eq(tc_step(c, 1, 1), GDN_OK);
    cr_assert_eq(c->flag, 1, "bad counts and parents raise the flag");
    double *S = malloc(sizeof(double) * V * K), *got = malloc(sizeof(double) * HV * V * K), o[MAX_DIM];
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++) {
            const int live = i == 0 || (i == 3 && live3[t]);
            for (int32_t h = 0; h < HV; h++) {
                const float *row = c->out + (((int64_t)i * T + t) * HV + h) * V;
                if (live) model_node(c, T, i, par[i], t, h, 0, S, o);
                for (int r = 0; r < V; r++) {
                    if (!live) cr_assert_eq(row[r], 0.0f, "row %d token %d is padding", i, t);
                    else cr_assert_leq(max_ratio(row[r], o[r], 1e-2, 1e-2), 1.0, "row %d token %d", i, t);
                }
            }
        }
    /* Commit: row 0 node 3 (fine), row 1 node 0 (bad count), row 2 -1 (bad count), row 3 node 3
     * (under a bad parent). Then row 3 node 5 (fine, its path 4 -> 5) on a second run. */
    c->flag = 0;
    static const int32_t nodes[B] = {3, 0, -1, 3};
    memcpy(c->accepted, nodes, sizeof nodes);
    cr_assert_eq(tc_commit(c, 1), GDN_OK);
    cr_assert_eq(c->flag, 1, "a node under a bad parent, or a row with a bad count, raises the flag");
    for (int32_t i = 0; i < B; i++) {
        export_state(c, c->read[i], got);
        if (i == 0) {
            for (int32_t h = 0; h < HV; h++) {
                model_node(c, T, i, par[i], 3, h, 0, S, NULL);
                for (int64_t e = 0; e < (int64_t)V * K; e++)
                    cr_assert_leq(max_ratio(got[(int64_t)h * V * K + e], S[e], 1e-2, 1e-2), 1.0);
            }
            continue;
        }
        const int64_t base = (int64_t)c->read[i] * HV * V * K;
        for (int64_t e = 0; e < (int64_t)HV * V * K; e++)
            cr_assert_eq(got[e], (double)gdn__load_f32(c->pool0, c->sdt, base + e), "row %d's slot changed", i);
    }
    cr_assert_eq(memcmp(c->pool + c->slot_bytes * B, c->pool0 + c->slot_bytes * B, c->slot_bytes), 0);

    /* A good step with bad nodes only: no flag from the step, the flag from the commit. */
    for (int32_t i = 0; i < B; i++) {
        c->counts[i] = 3;
        for (int32_t t = 0; t < T; t++) c->parents[(int64_t)i * T + t] = t == 2 ? 0 : t - 1;
    }
    tc_reset(c);
    tc_use(c, 1, T);
    cr_assert_eq(tc_step(c, 1, 1), GDN_OK);
    cr_assert_eq(c->flag, 0, "a good step raises no flag");
    static const int32_t bad_nodes[B] = {3, -2, 1, 100};
    memcpy(c->accepted, bad_nodes, sizeof bad_nodes);
    cr_assert_eq(tc_commit(c, 1), GDN_OK);
    cr_assert_eq(c->flag, 1, "nodes outside -1..n-1 raise the flag");
    for (int32_t i = 0; i < B; i++) {
        if (i == 2) continue; /* node 1 of row 2 is fine */
        export_state(c, c->read[i], got);
        const int64_t base = (int64_t)c->read[i] * HV * V * K;
        for (int64_t e = 0; e < (int64_t)HV * V * K; e++)
            cr_assert_eq(got[e], (double)gdn__load_f32(c->pool0, c->sdt, base + e), "row %d's slot changed", i);
    }
    free(S), free(got);
    tc_free(c);
}


/* Host-side refusals of the node commit: no op or no nodes (GDN_EINVAL), a decode (GDN_ESTEP_KIND);
 * nothing changes. */
void tree_check_commit_node_refusals(gdn_backend_kind backend)
{
    tcase *c = tc_create(backend, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 2, 31);
    tc_reset(c);
    tc_use(c, 1, 2);
    int32_t *accepted = dev_accepted(c);
    cr_assert_eq(gdn_op_commit_node(NULL, accepted, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_commit_node(&c->op, NULL, NULL), GDN_EINVAL);
    c->op.kind = GDN_STEP_DECODE, c->op.tokens = 1;
    cr_assert_eq(gdn_op_commit_node(&c->op, accepted, NULL), GDN_ESTEP_KIND);
    unsigned char *ws = malloc(c->ws_bytes);
    be_download(c, ws, c->op.workspace, c->ws_bytes);
    cr_assert_eq(memcmp(ws, c->ws, c->ws_bytes), 0, "a refused call wrote the workspace");
    be_download(c, c->pool, c->dev_pool, c->pool_bytes);
    cr_assert_eq(memcmp(c->pool, c->pool0, c->pool_bytes), 0);
    free(ws);
    tc_free(c);
}

