/*
 * The op layer on the CPU backend (include/gdn/gdn_op.h): strided views against dense tensors under
 * every verify strategy, every refused description (status code, nothing changed), and flush and the
 * slot operations with pending work (op_checks.c; test_gpu_op.c runs them on the GPU).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn_op.h"
#include "op_checks.h"
#include "support.h"

Test(op, strided_views_match_dense_cache_f32) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_F32, 1); }
Test(op, strided_views_match_dense_cache_bf16) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 2); }
Test(op, strided_views_match_dense_fold_f32) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_F32, 3); }
Test(op, strided_views_match_dense_fold_bf16) { op_check_views(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 4); }
Test(op, strided_views_match_dense_fold_bf16_three_tokens)
{
    op_check_views_tokens(GDN_BACKEND_CPU, "tiny", GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 3, 7);
}
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
MUTATION(write_through_below_never, op->ring_write_through = -2)
MUTATION(unknown_kind, op->kind = (gdn_step_kind)7)
MUTATION(decode_of_two, op->kind = GDN_STEP_DECODE)
MUTATION(verify_too_long, op->tokens = TOKENS + 1)
MUTATION(verify_of_a_decode_only_layer, (op->max_tokens = 1, op->tokens = 1))
MUTATION(batch_too_big, op->batch = ROWS + 1)
MUTATION(negative_batch, op->batch = -1)
MUTATION(null_q, op->q.data = NULL)
MUTATION(null_output, op->o.data = NULL)
MUTATION(null_slots, op->read_slots = NULL)
MUTATION(null_workspace, op->workspace = NULL)
MUTATION(null_params, op->A_log = NULL)
MUTATION(small_slot_stride, op->pool.slot_stride = 4 * 64 * 64 - 1)
MUTATION(overflowing_slot_stride, op->pool.slot_stride = INT64_MAX / 2)

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
        {write_through_below_never, GDN_ECONFIG_RING_WRITE_THROUGH, "ring_write_through -2"},
        {unknown_kind, GDN_ESTEP_KIND, "kind 7"},
        {decode_of_two, GDN_ESTEP_TOKENS, "decode with T = 2"},
        {verify_too_long, GDN_ESTEP_TOKENS, "T > max_tokens"},
        {verify_of_a_decode_only_layer, GDN_ESTEP_KIND, "a verify with max_tokens 1"},
        {batch_too_big, GDN_ESTEP_BATCH, "batch > max_batch"},
        {negative_batch, GDN_ESTEP_BATCH, "batch -1"},
        {null_q, GDN_EINVAL, "q NULL"},
        {null_output, GDN_EINVAL, "o NULL"},
        {null_slots, GDN_EINVAL, "read_slots NULL"},
        {null_workspace, GDN_EINVAL, "workspace NULL"},
        {null_params, GDN_EINVAL, "A_log NULL"},
        {small_slot_stride, GDN_EINVAL, "slot_stride < HV V K"},
        {overflowing_slot_stride, GDN_EINVAL, "slot_stride x slots overflows"},
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
/* Flush and slot operations (op_checks.c; test_gpu_op.c runs the same checks on the GPU)           */
/* ---------------------------------------------------------------------------------------------- */

Test(op, slot_operations_cache) { op_check_slot_ops(GDN_BACKEND_CPU, GDN_VERIFY_CACHE, 31); }
Test(op, slot_operations_fold) { op_check_slot_ops(GDN_BACKEND_CPU, GDN_VERIFY_FOLD, 32); }
Test(op, slot_operations_ring) { op_check_slot_ops(GDN_BACKEND_CPU, GDN_VERIFY_RING, 33); }
Test(op, slot_operation_refusals_change_nothing) { op_check_slot_op_refusals(GDN_BACKEND_CPU, 34); }
