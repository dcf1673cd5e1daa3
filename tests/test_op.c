/*
 * The op layer on the CPU backend (include/gdn/gdn_op.h): strided views against dense tensors under
 * every verify strategy, and every refused description (status code, nothing changed).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn_op.h"
#include "kernels/dtype_convert.h"
#include "op_checks.h"
#include "support.h"

Test(op, strided_views_match_dense_cache_f32) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1); }
Test(op, strided_views_match_dense_cache_bf16) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 2); }
Test(op, strided_views_match_dense_fold_f32) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 3); }
Test(op, strided_views_match_dense_fold_bf16) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4); }
Test(op, strided_views_match_dense_ring_f32) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_F32, 5); }
Test(op, strided_views_match_dense_ring_bf16) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_RING, GDN_DTYPE_BF16, 6); }

enum { ROWS = 3, SLOTS = 4, TOKENS = 2 };

typedef struct valid_op {
    gdn_op_layer op;
    uint16_t q[ROWS * TOKENS * 2 * 64], k[ROWS * TOKENS * 2 * 64], v[ROWS * TOKENS * 4 * 64];
    uint16_t a[ROWS * TOKENS * 4], b[ROWS * TOKENS * 4];
    float out[ROWS * TOKENS * 4 * 64], pool[SLOTS * 4 * 64 * 64], params[8];
    int32_t slots[ROWS], accepted[ROWS];
    void *workspace;
} valid_op;

/* A verify op of the tiny preset on host memory: random inputs and pool, poisoned output. */
static valid_op *make_valid_op(void)
{
    valid_op *s = calloc(1, sizeof *s);
    test_rng rng = test_rng_seeded(77);
    for (size_t e = 0; e < sizeof s->q / 2; e++) s->q[e] = s->k[e] = (uint16_t)(0x3f00 + test_rng_below(&rng, 128));
    for (size_t e = 0; e < sizeof s->v / 2; e++) s->v[e] = (uint16_t)(0x3f00 + test_rng_below(&rng, 128));
    for (size_t e = 0; e < sizeof s->a / 2; e++) s->a[e] = s->b[e] = (uint16_t)(0x3d00 + test_rng_below(&rng, 128));
    for (size_t e = 0; e < sizeof s->pool / 4; e++) s->pool[e] = (float)(0.1 * test_rng_normal(&rng));
    for (int h = 0; h < 8; h++) s->params[h] = (float)(0.1 * test_rng_normal(&rng));
    memset(s->out, 0xff, sizeof s->out);
    for (int i = 0; i < ROWS; i++) s->slots[i] = i, s->accepted[i] = 1;
    gdn_op_layer *op = &s->op;
    cr_assert_eq(gdn_model_preset("tiny", 1, &op->model), GDN_OK);
    op->backend = GDN_BACKEND_CPU;
    op->input_dtype = GDN_DTYPE_BF16;
    op->output_dtype = GDN_DTYPE_F32;
    op->kind = GDN_STEP_VERIFY;
    op->tokens = TOKENS;
    op->batch = ROWS;
    op->q = (gdn_view){s->q, 0, 0, 0};
    op->k = (gdn_view){s->k, 0, 0, 0};
    op->v = (gdn_view){s->v, 0, 0, 0};
    op->a = (gdn_view){s->a, 0, 0, 0};
    op->b = (gdn_view){s->b, 0, 0, 0};
    op->o = (gdn_view){s->out, 0, 0, 0};
    op->A_log = s->params;
    op->dt_bias = s->params + 4;
    op->pool = (gdn_state_pool){s->pool, GDN_DTYPE_F32, SLOTS, 4 * 64 * 64};
    op->read_slots = s->slots;
    op->strategy = GDN_VERIFY_RING;
    op->max_batch = ROWS;
    op->max_tokens = TOKENS;
    const size_t bytes = gdn_op_workspace_bytes(op);
    cr_assert_gt(bytes, 0);
    s->workspace = calloc(1, bytes);
    op->workspace = s->workspace;
    return s;
}

typedef void (*mutation)(gdn_op_layer *op);
#define MUTATION(name, body) static void name(gdn_op_layer *op) { body; }
MUTATION(auto_backend, op->backend = GDN_BACKEND_AUTO)
MUTATION(auto_strategy, op->strategy = GDN_VERIFY_AUTO)
MUTATION(odd_head_dim, op->model.head_dim_k = 96)
MUTATION(odd_heads, op->model.num_v_heads = 3)
MUTATION(f16_state, op->pool.dtype = GDN_DTYPE_F16)
MUTATION(f32_inputs, op->input_dtype = GDN_DTYPE_F32)
MUTATION(f16_output, op->output_dtype = GDN_DTYPE_F16)
MUTATION(no_slots, op->pool.num_slots = 0)
MUTATION(no_batch, op->max_batch = 0)
MUTATION(too_many_tokens, op->max_tokens = GDN_MAX_TOKENS + 1)
MUTATION(short_ring, op->ring_length = 3)
MUTATION(unknown_kind, op->kind = (gdn_step_kind)7)
MUTATION(decode_of_two, op->kind = GDN_STEP_DECODE)
MUTATION(verify_too_long, op->tokens = TOKENS + 1)
MUTATION(batch_too_big, op->batch = ROWS + 1)
MUTATION(negative_batch, op->batch = -1)
MUTATION(null_q, op->q.data = NULL)
MUTATION(null_output, op->o.data = NULL)
MUTATION(null_slots, op->read_slots = NULL)
MUTATION(null_workspace, op->workspace = NULL)
MUTATION(null_params, op->A_log = NULL)
MUTATION(small_slot_stride, op->pool.slot_stride = 4 * 64 * 64 - 1)

Test(op, bad_descriptions_are_refused_and_change_nothing)
{
    valid_op *s = make_valid_op();
    const struct {
        mutation change;
        gdn_status expected;
        const char *what;
    } cases[] = {
        {auto_backend, GDN_EINVAL, "AUTO backend"},
        {auto_strategy, GDN_EINVAL, "AUTO strategy"},
        {odd_head_dim, GDN_ECONFIG_HEAD_DIM, "K = 96"},
        {odd_heads, GDN_ECONFIG_HEADS, "HV not a multiple of HK"},
        {f16_state, GDN_ECONFIG_STATE_DTYPE, "fp16 pool"},
        {f32_inputs, GDN_ECONFIG_INPUT_DTYPE, "fp32 inputs"},
        {f16_output, GDN_ECONFIG_OUTPUT_DTYPE, "fp16 output"},
        {no_slots, GDN_ECONFIG_SLOTS, "empty pool"},
        {no_batch, GDN_ECONFIG_MAX_BATCH, "max_batch 0"},
        {too_many_tokens, GDN_ECONFIG_MAX_TOKENS, "max_tokens 17"},
        {short_ring, GDN_ECONFIG_RING, "ring_length 3"},
        {unknown_kind, GDN_ESTEP_KIND, "kind 7"},
        {decode_of_two, GDN_ESTEP_TOKENS, "decode with T = 2"},
        {verify_too_long, GDN_ESTEP_TOKENS, "T > max_tokens"},
        {batch_too_big, GDN_ESTEP_BATCH, "batch > max_batch"},
        {negative_batch, GDN_ESTEP_BATCH, "batch -1"},
        {null_q, GDN_EINVAL, "q NULL"},
        {null_output, GDN_EINVAL, "o NULL"},
        {null_slots, GDN_EINVAL, "read_slots NULL"},
        {null_workspace, GDN_EINVAL, "workspace NULL"},
        {null_params, GDN_EINVAL, "A_log NULL"},
        {small_slot_stride, GDN_EINVAL, "slot_stride < HV V K"},
    };
    float *pool_before = malloc(sizeof s->pool);
    memcpy(pool_before, s->pool, sizeof s->pool);
    void *ws_before = malloc(gdn_op_workspace_bytes(&s->op));
    memcpy(ws_before, s->workspace, gdn_op_workspace_bytes(&s->op));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gdn_op_layer op = s->op;
        cases[c].change(&op);
        cr_assert_eq(gdn_op_layer_step(&op, NULL), cases[c].expected, "step, %s", cases[c].what);
        cr_assert_eq(gdn_op_commit(&op, s->accepted, NULL), cases[c].expected, "commit, %s", cases[c].what);
    }
    cr_assert_eq(gdn_op_layer_step(NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_commit(NULL, s->accepted, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_workspace_bytes(NULL), 0);
    cr_assert_eq(gdn_op_commit(&s->op, NULL, NULL), GDN_EINVAL, "accepted NULL");
    gdn_op_layer decode = s->op;
    decode.kind = GDN_STEP_DECODE, decode.tokens = 1;
    cr_assert_eq(gdn_op_commit(&decode, s->accepted, NULL), GDN_ESTEP_KIND, "commit of a decode");
#ifndef GDN_HAVE_CUDA
    gdn_op_layer cuda = s->op;
    cuda.backend = GDN_BACKEND_CUDA;
    cr_assert_eq(gdn_op_layer_step(&cuda, NULL), GDN_ENODEV, "CUDA in a build without it");
#endif
    unsigned char poison[sizeof s->out];
    memset(poison, 0xff, sizeof poison);
    cr_assert_eq(memcmp(s->out, poison, sizeof poison), 0, "a refused op wrote outputs");
    cr_assert_eq(memcmp(s->pool, pool_before, sizeof s->pool), 0, "a refused op changed the pool");
    cr_assert_eq(memcmp(s->workspace, ws_before, gdn_op_workspace_bytes(&s->op)), 0, "a refused op changed the workspace");
    /* The valid op itself runs: outputs written, finite. */
    cr_assert_eq(gdn_op_layer_step(&s->op, NULL), GDN_OK);
    cr_assert_eq(gdn_op_commit(&s->op, s->accepted, NULL), GDN_OK);
    for (size_t e = 0; e < sizeof s->out / 4; e++) cr_assert(s->out[e] == s->out[e], "output %zu not written", e);
    free(pool_before), free(ws_before), free(s->workspace), free(s);
}

/* ---------------------------------------------------------------------------------------------- */
/* Flush and slot operations                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum { WS = 8, WROWS = 3, WT = 2 };

typedef struct work_op {
    gdn_op_layer op;
    uint16_t q[WROWS * WT * 2 * 64], k[WROWS * WT * 2 * 64], v[WROWS * WT * 4 * 64], a[WROWS * WT * 4],
        b[WROWS * WT * 4];
    float out[WROWS * WT * 4 * 64], pool[WS * 4 * 64 * 64], params[8];
    int32_t rows[WROWS], accepted[WROWS];
    void *workspace;
    size_t workspace_bytes;
} work_op;

/* A tiny op over host memory whose slots 0..2 have pending work (two verify + commit steps). */
static work_op *make_work_op(gdn_verify_strategy strategy, uint64_t seed)
{
    work_op *w = calloc(1, sizeof *w);
    test_rng rng = test_rng_seeded(seed);
    for (size_t e = 0; e < sizeof w->pool / 4; e++) w->pool[e] = (float)(0.1 * test_rng_normal(&rng));
    for (int h = 0; h < 8; h++) w->params[h] = (float)(0.1 * test_rng_normal(&rng));
    gdn_op_layer *op = &w->op;
    cr_assert_eq(gdn_model_preset("tiny", 1, &op->model), GDN_OK);
    op->backend = GDN_BACKEND_CPU, op->input_dtype = GDN_DTYPE_BF16, op->output_dtype = GDN_DTYPE_F32;
    op->kind = GDN_STEP_VERIFY, op->tokens = WT, op->batch = WROWS;
    op->q = (gdn_view){w->q, 0, 0, 0}, op->k = (gdn_view){w->k, 0, 0, 0}, op->v = (gdn_view){w->v, 0, 0, 0};
    op->a = (gdn_view){w->a, 0, 0, 0}, op->b = (gdn_view){w->b, 0, 0, 0}, op->o = (gdn_view){w->out, 0, 0, 0};
    op->A_log = w->params, op->dt_bias = w->params + 4;
    op->pool = (gdn_state_pool){w->pool, GDN_DTYPE_F32, WS, 4 * 64 * 64};
    op->read_slots = w->rows;
    op->strategy = strategy, op->max_batch = WROWS, op->max_tokens = WT, op->ring_length = 6;
    w->workspace_bytes = gdn_op_workspace_bytes(op);
    w->workspace = calloc(1, w->workspace_bytes);
    op->workspace = w->workspace;
    for (int i = 0; i < WROWS; i++) w->rows[i] = i, w->accepted[i] = 1 + i % 2;
    for (int step = 0; step < 2; step++) {
        for (size_t e = 0; e < sizeof w->q / 2; e++)
            w->q[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng)), w->k[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng));
        for (size_t e = 0; e < sizeof w->v / 2; e++) w->v[e] = gdn__f32_to_bf16((float)test_rng_normal(&rng));
        for (size_t e = 0; e < sizeof w->a / 2; e++)
            w->a[e] = gdn__f32_to_bf16((float)(0.1 * test_rng_normal(&rng))), w->b[e] = gdn__f32_to_bf16((float)(0.1 * test_rng_normal(&rng)));
        cr_assert_eq(gdn_op_layer_step(op, NULL), GDN_OK);
        cr_assert_eq(gdn_op_commit(op, w->accepted, NULL), GDN_OK);
    }
    return w;
}

static work_op *clone_work_op(const work_op *w)
{
    work_op *c = malloc(sizeof *c);
    memcpy(c, w, sizeof *c);
    c->workspace = malloc(w->workspace_bytes);
    memcpy(c->workspace, w->workspace, w->workspace_bytes);
    c->op.pool.data = c->pool, c->op.workspace = c->workspace, c->op.A_log = c->params, c->op.dt_bias = c->params + 4;
    return c;
}

static void free_work_op(work_op *w) { free(w->workspace), free(w); }

static const float *slot_of(const work_op *w, int32_t slot) { return w->pool + (size_t)slot * 4 * 64 * 64; }
enum { SLOT_BYTES = 4 * 64 * 64 * 4 };

static void slot_ops_match_flushed_states(gdn_verify_strategy strategy, uint64_t seed)
{
    work_op *w = make_work_op(strategy, seed);
    work_op *twin = clone_work_op(w);
    int32_t one[1];
    /* export = the state after a flush of that slot (the twin flushes it explicitly). */
    float *buf = malloc(SLOT_BYTES);
    cr_assert_eq(gdn_op_slot_export(&w->op, 1, buf, NULL), GDN_OK);
    one[0] = 1;
    cr_assert_eq(gdn_op_flush(&twin->op, one, 1, NULL), GDN_OK);
    cr_assert_eq(memcmp(buf, slot_of(twin, 1), SLOT_BYTES), 0, "export of slot 1");
    /* copy carries the pending work: flushing both gives the same state. */
    cr_assert_eq(gdn_op_slot_copy(&w->op, 6, 2, NULL), GDN_OK);
    int32_t pair[2] = {2, 6};
    cr_assert_eq(gdn_op_flush(&w->op, pair, 2, NULL), GDN_OK);
    cr_assert_eq(memcmp(slot_of(w, 6), slot_of(w, 2), SLOT_BYTES), 0, "copy then flush");
    if (strategy != GDN_VERIFY_CACHE) /* and the flush did change it: there was work pending */
        cr_assert_neq(memcmp(slot_of(w, 2), slot_of(twin, 2), SLOT_BYTES), 0, "slot 2 had no pending work");
    /* import drops the pending work; export returns exactly what was imported; reset gives zeros. */
    for (int i = 0; i < 4 * 64 * 64; i++) buf[i] = (float)(0.001 * (i % 1013));
    cr_assert_eq(gdn_op_slot_import(&w->op, 0, buf, NULL), GDN_OK);
    float *back = malloc(SLOT_BYTES);
    cr_assert_eq(gdn_op_slot_export(&w->op, 0, back, NULL), GDN_OK);
    cr_assert_eq(memcmp(back, buf, SLOT_BYTES), 0, "import then export");
    cr_assert_eq(gdn_op_slot_reset(&w->op, 0, NULL), GDN_OK);
    cr_assert_eq(gdn_op_slot_export(&w->op, 0, back, NULL), GDN_OK);
    for (int i = 0; i < 4 * 64 * 64; i++) cr_assert_eq(back[i], 0.0f, "reset then export, element %d", i);
    free(buf), free(back);
    free_work_op(w), free_work_op(twin);
}

Test(op, slot_operations_cache) { slot_ops_match_flushed_states(GDN_VERIFY_CACHE, 31); }
Test(op, slot_operations_fold) { slot_ops_match_flushed_states(GDN_VERIFY_FOLD, 32); }
Test(op, slot_operations_ring) { slot_ops_match_flushed_states(GDN_VERIFY_RING, 33); }

Test(op, slot_operation_refusals_change_nothing)
{
    work_op *w = make_work_op(GDN_VERIFY_FOLD, 34);
    work_op *before = clone_work_op(w);
    float buf[16];
    int32_t rows[4] = {0, 1, 2, 3};
    cr_assert_eq(gdn_op_slot_copy(&w->op, WS, 1, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_copy(&w->op, 1, -1, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_slot_copy(&w->op, 1, 1, NULL), GDN_EINVAL, "dst == src");
    cr_assert_eq(gdn_op_slot_export(&w->op, 1, NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_slot_import(&w->op, WS + 3, buf, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_op_flush(&w->op, rows, WROWS + 1, NULL), GDN_ESTEP_BATCH);
    cr_assert_eq(gdn_op_flush(&w->op, NULL, 2, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_op_flush(NULL, rows, 1, NULL), GDN_EINVAL);
    gdn_op_layer no_params = w->op;
    no_params.A_log = NULL;
    cr_assert_eq(gdn_op_flush(&no_params, rows, 1, NULL), GDN_EINVAL);
    cr_assert_eq(memcmp(w->pool, before->pool, sizeof w->pool), 0, "a refused call changed the pool");
    cr_assert_eq(memcmp(w->workspace, before->workspace, w->workspace_bytes), 0, "a refused call changed the workspace");
    free_work_op(w), free_work_op(before);
}
