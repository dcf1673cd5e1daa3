/* Presets, configuration defaults, and validation: each invalid field has its own status. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine/alloc.h"
#include "gdn/gdn.h"
#include "gdn/gdn_op.h"
#include "kernels/gdn_kernel_params.h"
#include "kernels/ref/gdn_ref.h"
#include "support.h"

static gdn_engine_config valid(void) { return test_config("tiny", 2, GDN_DTYPE_F32, 8, 8, 4); }

/* The field's status from both validate and create, and create must leave *out untouched. */
static void expect_invalid(const gdn_engine_config *config, gdn_status expected)
{
    cr_assert_eq(gdn_engine_config_validate(config), expected, "validate gave %s, wanted %s",
                 gdn_status_name(gdn_engine_config_validate(config)), gdn_status_name(expected));
    gdn_engine *sentinel = (gdn_engine *)(uintptr_t)0x1234;
    gdn_engine *out = sentinel;
    cr_assert_eq(gdn_engine_create(config, &out), expected);
    cr_assert_eq(out, sentinel, "a failed create must not write *out");
}

Test(config, presets_match_the_spec)
{
    gdn_model_config m;
    cr_assert_eq(gdn_model_preset("qwen3-next", 36, &m), GDN_OK);
    cr_assert(m.num_layers == 36 && m.num_k_heads == 16 && m.num_v_heads == 32 && m.head_dim_k == 128 &&
              m.head_dim_v == 128 && m.use_qk_l2norm == 1 && m.scale == 0.0f);
    cr_assert_eq(gdn_model_preset("qwen3.5", 1, &m), GDN_OK);
    cr_assert(m.num_k_heads == 16 && m.num_v_heads == 64 && m.head_dim_k == 128 && m.head_dim_v == 128);
    cr_assert_eq(gdn_model_preset("tiny", 1, &m), GDN_OK);
    cr_assert(m.num_k_heads == 2 && m.num_v_heads == 4 && m.head_dim_k == 64 && m.head_dim_v == 64);
    cr_assert_eq(gdn_model_preset("llama", 1, &m), GDN_EINVAL);
    cr_assert_eq(gdn_model_preset(NULL, 1, &m), GDN_EINVAL);
    cr_assert_eq(gdn_model_preset("tiny", 1, NULL), GDN_EINVAL);
}

Test(config, defaults_are_valid_and_documented)
{
    gdn_model_config m;
    gdn_model_preset("qwen3-next", 4, &m);
    gdn_engine_config c;
    cr_assert_eq(gdn_engine_config_init(&c, &m), GDN_OK);
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
    cr_assert_eq(c.state_dtype, GDN_DTYPE_F32);
    cr_assert_eq(c.input_dtype, GDN_DTYPE_BF16);
    cr_assert_eq(c.output_dtype, GDN_DTYPE_BF16);
    cr_assert_eq(c.verify_strategy, GDN_VERIFY_AUTO);
    cr_assert_eq(c.backend, GDN_BACKEND_AUTO);
    cr_assert_eq(c.num_buckets, 0);
    cr_assert_eq(gdn_engine_config_init(NULL, &m), GDN_EINVAL);
    cr_assert_eq(gdn_engine_config_init(&c, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_config_validate(NULL), GDN_EINVAL);
}

Test(config, rejects_bad_layers)
{
    gdn_engine_config c = valid();
    c.model.num_layers = 0;
    expect_invalid(&c, GDN_ECONFIG_LAYERS);
}

Test(config, rejects_bad_heads)
{
    gdn_engine_config c = valid();
    c.model.num_k_heads = 0;
    expect_invalid(&c, GDN_ECONFIG_HEADS);
    c = valid();
    c.model.num_v_heads = -4;
    expect_invalid(&c, GDN_ECONFIG_HEADS);
    c = valid();
    c.model.num_k_heads = 3; /* HV = 4 is not a multiple of 3 */
    expect_invalid(&c, GDN_ECONFIG_HEADS);
}

Test(config, rejects_bad_head_dims)
{
    gdn_engine_config c = valid();
    c.model.head_dim_k = 96;
    expect_invalid(&c, GDN_ECONFIG_HEAD_DIM);
    c = valid();
    c.model.head_dim_v = 32;
    expect_invalid(&c, GDN_ECONFIG_HEAD_DIM);
    c = valid();
    c.model.head_dim_k = 512;
    expect_invalid(&c, GDN_ECONFIG_HEAD_DIM);
}

Test(config, rejects_bad_scale)
{
    gdn_engine_config c = valid();
    c.model.scale = -1.0f;
    expect_invalid(&c, GDN_ECONFIG_SCALE);
    c.model.scale = NAN;
    expect_invalid(&c, GDN_ECONFIG_SCALE);
    c.model.scale = INFINITY;
    expect_invalid(&c, GDN_ECONFIG_SCALE);
}

Test(config, rejects_bad_dtypes)
{
    gdn_engine_config c = valid();
    c.state_dtype = GDN_DTYPE_F16;
    expect_invalid(&c, GDN_ECONFIG_STATE_DTYPE);
    c = valid();
    c.input_dtype = GDN_DTYPE_F32;
    expect_invalid(&c, GDN_ECONFIG_INPUT_DTYPE);
    c = valid();
    c.output_dtype = GDN_DTYPE_F16;
    expect_invalid(&c, GDN_ECONFIG_OUTPUT_DTYPE);
    c = valid();
    c.output_dtype = (gdn_dtype)9;
    expect_invalid(&c, GDN_ECONFIG_OUTPUT_DTYPE);
}

Test(config, rejects_bad_sizes)
{
    gdn_engine_config c = valid();
    c.num_slots = 0;
    expect_invalid(&c, GDN_ECONFIG_SLOTS);
    c = valid();
    c.max_batch = 0;
    expect_invalid(&c, GDN_ECONFIG_MAX_BATCH);
    c = valid();
    c.max_tokens = 0;
    expect_invalid(&c, GDN_ECONFIG_MAX_TOKENS);
    c.max_tokens = GDN_MAX_TOKENS + 1;
    expect_invalid(&c, GDN_ECONFIG_MAX_TOKENS);
}

Test(config, rejects_bad_buckets)
{
    gdn_engine_config c = valid(); /* max_batch 8 */
    c.num_buckets = 3;
    c.buckets[0] = 2, c.buckets[1] = 2, c.buckets[2] = 8; /* not strictly increasing */
    expect_invalid(&c, GDN_ECONFIG_BUCKETS);
    c.buckets[0] = 0, c.buckets[1] = 4; /* zero */
    expect_invalid(&c, GDN_ECONFIG_BUCKETS);
    c.buckets[0] = 1, c.buckets[1] = 4, c.buckets[2] = 6; /* does not end at max_batch */
    expect_invalid(&c, GDN_ECONFIG_BUCKETS);
    c.num_buckets = GDN_MAX_BUCKETS + 1;
    expect_invalid(&c, GDN_ECONFIG_BUCKETS);
    c.num_buckets = -1;
    expect_invalid(&c, GDN_ECONFIG_BUCKETS);
    c.num_buckets = 3, c.buckets[2] = 8;
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
}

Test(config, rejects_bad_strategy_and_backend)
{
    gdn_engine_config c = valid();
    c.verify_strategy = (gdn_verify_strategy)7;
    expect_invalid(&c, GDN_ECONFIG_VERIFY);
    c = valid();
    c.backend = (gdn_backend_kind)7;
    expect_invalid(&c, GDN_ECONFIG_BACKEND);
}

Test(config, rejects_bad_ring_length)
{
    gdn_engine_config c = valid();
    c.verify_strategy = GDN_VERIFY_RING;
    c.ring_length = GDN_MIN_RING_LENGTH - 1;
    expect_invalid(&c, GDN_ECONFIG_RING);
    c.ring_length = GDN_MAX_RING_LENGTH + 1;
    expect_invalid(&c, GDN_ECONFIG_RING);
    c.ring_length = -16;
    expect_invalid(&c, GDN_ECONFIG_RING);
    /* In the order the fields are declared: verify_strategy, ring_length, backend. */
    c.verify_strategy = (gdn_verify_strategy)7;
    expect_invalid(&c, GDN_ECONFIG_VERIFY);
    c.verify_strategy = GDN_VERIFY_RING;
    c.backend = (gdn_backend_kind)7;
    expect_invalid(&c, GDN_ECONFIG_RING);
    c = valid();
    c.verify_strategy = GDN_VERIFY_RING;
    const int32_t good[] = {0, GDN_MIN_RING_LENGTH, GDN_DEFAULT_RING_LENGTH, GDN_MAX_RING_LENGTH};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        c.ring_length = good[i];
        cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK, "ring_length %d", good[i]);
    }
}

/* ring_write_through: below -1 refused with its own code (after ring_length, before backend); -1, 0
 * and row counts accepted; 0 resolves to GDN_RING_WRITE_THROUGH_HEADS_F32 / _BF16 row-heads' worth of
 * rows by the state's dtype, -1 and counts stay. */
Test(config, ring_write_through_is_checked_and_resolved)
{
    gdn_engine_config c = valid();
    c.verify_strategy = GDN_VERIFY_RING;
    const int32_t bad[] = {-2, -100, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.ring_write_through = bad[i];
        expect_invalid(&c, GDN_ECONFIG_RING_WRITE_THROUGH);
    }
    c.ring_length = 3;
    expect_invalid(&c, GDN_ECONFIG_RING);
    c.ring_length = 0;
    c.backend = (gdn_backend_kind)7;
    expect_invalid(&c, GDN_ECONFIG_RING_WRITE_THROUGH);
    const gdn_dtype states[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    const int32_t heads[] = {GDN_RING_WRITE_THROUGH_HEADS_F32, GDN_RING_WRITE_THROUGH_HEADS_BF16};
    cr_assert_neq(heads[0], heads[1], "the dtypes' defaults differ, so that this checks which one applies");
    for (int d = 0; d < 2; d++) {
        c = valid();
        c.verify_strategy = GDN_VERIFY_RING;
        c.state_dtype = states[d];
        const int32_t good[] = {-1, 0, 1, 3, 1 << 20};
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
            c.ring_write_through = good[i];
            gdn_engine *e = NULL;
            cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK, "ring_write_through %d", good[i]);
            const int32_t rows = heads[d] / c.model.num_v_heads;
            const int32_t expected = good[i] ? good[i] : rows > 0 ? rows : -1;
            cr_assert_eq(gdn_engine_get_config(e)->ring_write_through, expected, "state %s, ring_write_through %d",
                         d ? "bf16" : "fp32", good[i]);
            gdn_engine_destroy(e);
        }
    }
}

/* The default ring_write_through with the mixer's conv covers every decode step (max_batch rows),
 * whatever the state dtype; the norm alone keeps the plain default (GDN_RING_WRITE_THROUGH_HEADS_F32 /
 * _BF16 row-heads); -1 and row counts stay as given. heads -1: max_batch rows. */
Test(config, ring_write_through_default_covers_every_step_with_the_conv)
{
    const struct {
        gdn_dtype state;
        int32_t conv_width, use_norm, option, heads;
    } cases[] = {
        {GDN_DTYPE_BF16, 4, 1, 0, -1},
        {GDN_DTYPE_F32, 4, 1, 0, -1},
        {GDN_DTYPE_BF16, 2, 0, 0, -1},
        {GDN_DTYPE_BF16, 0, 1, 0, GDN_RING_WRITE_THROUGH_HEADS_BF16},
        {GDN_DTYPE_F32, 0, 1, 0, GDN_RING_WRITE_THROUGH_HEADS_F32},
        {GDN_DTYPE_BF16, 4, 1, -1, 0},
        {GDN_DTYPE_F32, 4, 1, 3, 0},
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        gdn_engine_config c = valid();
        c.verify_strategy = GDN_VERIFY_RING;
        c.state_dtype = cases[n].state;
        c.mixer = (gdn_mixer_config){.conv_width = cases[n].conv_width, .conv_weight_dtype = GDN_DTYPE_BF16,
                                     .use_norm = cases[n].use_norm};
        c.ring_write_through = cases[n].option;
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK, "case %zu", n);
        const int32_t rows = cases[n].heads < 0 ? c.max_batch : cases[n].heads / c.model.num_v_heads;
        const int32_t expected = cases[n].option ? cases[n].option : rows > 0 ? rows : -1;
        cr_assert_eq(gdn_engine_get_config(e)->ring_write_through, expected, "case %zu: %d rows, wanted %d", n,
                     gdn_engine_get_config(e)->ring_write_through, expected);
        gdn_engine_destroy(e);
    }
}

Test(config, ring_length_zero_resolves_to_the_default_and_the_ring_replaces_the_cache)
{
    gdn_engine_config c = valid(); /* ring_length 0 */
    c.verify_strategy = GDN_VERIFY_RING;
    cr_assert_eq(c.ring_length, 0);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_get_config(e)->verify_strategy, GDN_VERIFY_RING);
    cr_assert_eq(gdn_engine_get_config(e)->ring_length, GDN_DEFAULT_RING_LENGTH);
    gdn_memory_report r;
    cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
    cr_assert_gt(r.ring, 0);
    cr_assert_eq(r.verify_cache, 0);
    cr_assert_eq(r.token_store, 0);
    cr_assert_eq(r.total, r.state_pools + r.ring + r.io_buffers + r.parameters + r.indices);
    gdn_engine_destroy(e);
}

Test(config, auto_strategy_follows_the_measured_rule)
{
    /* bench/results/2026-11-27-h100-auto-strategy.md: without the mixer FOLD for every draft except
     * two-token drafts of one or two rows with bf16 state; with the mixer FOLD from max_batch 16, with
     * fp32 state from 4 (2026-11-27-h100-mixer-verify-conv.md). Decode only (max_tokens 1), without
     * the mixer: RING above GDN_AUTO_RING_HEADS_F32 / _BF16 row-heads (tiny: 4 value heads), else
     * CACHE (2026-11-30-h200-decode-only-ring.md). */
    const struct { int32_t max_tokens, max_batch; gdn_dtype state; int mixer; gdn_verify_strategy expected; } cases[] = {
        {1, 16, GDN_DTYPE_F32, 0, GDN_VERIFY_CACHE},  {1, 1, GDN_DTYPE_BF16, 0, GDN_VERIFY_CACHE},
        {2, 1, GDN_DTYPE_F32, 0, GDN_VERIFY_FOLD},    {2, 1, GDN_DTYPE_BF16, 0, GDN_VERIFY_CACHE},
        {2, 2, GDN_DTYPE_BF16, 0, GDN_VERIFY_CACHE},  {2, 3, GDN_DTYPE_BF16, 0, GDN_VERIFY_FOLD},
        {3, 1, GDN_DTYPE_BF16, 0, GDN_VERIFY_FOLD},   {4, 8, GDN_DTYPE_F32, 0, GDN_VERIFY_FOLD},
        {GDN_MAX_TOKENS, 16, GDN_DTYPE_BF16, 0, GDN_VERIFY_FOLD},
        {4, 8, GDN_DTYPE_F32, 1, GDN_VERIFY_FOLD},    {4, 4, GDN_DTYPE_F32, 1, GDN_VERIFY_FOLD},
        {4, 3, GDN_DTYPE_F32, 1, GDN_VERIFY_CACHE},   {4, 8, GDN_DTYPE_BF16, 1, GDN_VERIFY_CACHE},
        {4, 15, GDN_DTYPE_BF16, 1, GDN_VERIFY_CACHE}, {2, 16, GDN_DTYPE_BF16, 1, GDN_VERIFY_FOLD},
        {1, 32, GDN_DTYPE_F32, 1, GDN_VERIFY_CACHE},  {1, 64, GDN_DTYPE_F32, 0, GDN_VERIFY_CACHE},
        {1, 65, GDN_DTYPE_F32, 0, GDN_VERIFY_RING},   {1, 65, GDN_DTYPE_F32, 1, GDN_VERIFY_CACHE},
        {1, 1024, GDN_DTYPE_BF16, 0, GDN_VERIFY_CACHE}, {1, 1025, GDN_DTYPE_BF16, 0, GDN_VERIFY_RING},
        {2, 1025, GDN_DTYPE_BF16, 0, GDN_VERIFY_FOLD}};
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        gdn_engine_config c = valid();
        c.verify_strategy = GDN_VERIFY_AUTO;
        c.max_tokens = cases[n].max_tokens;
        c.max_batch = cases[n].max_batch;
        c.num_slots = cases[n].max_batch;
        c.state_dtype = cases[n].state;
        if (cases[n].mixer) c.mixer.conv_width = 4, c.mixer.conv_weight_dtype = GDN_DTYPE_F32, c.mixer.use_norm = 1;
        cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
        cr_assert_eq(gdn_engine_get_config(e)->verify_strategy, cases[n].expected,
                     "max_tokens %d, max_batch %d, state %d, mixer %d", c.max_tokens, c.max_batch, (int)c.state_dtype,
                     cases[n].mixer);
        gdn_memory_report r;
        cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
        /* what each strategy allocates, so the choice is not only a reported label */
        if (cases[n].expected == GDN_VERIFY_FOLD) cr_assert(r.verify_cache == 0 && r.token_store > 0 && r.ring == 0);
        else if (cases[n].expected == GDN_VERIFY_RING) cr_assert(r.verify_cache == 0 && r.token_store == 0 && r.ring > 0);
        else cr_assert(r.verify_cache > 0 && r.token_store == 0 && r.ring == 0); /* (max_tokens 1: the scratch) */
        if (cases[n].expected == GDN_VERIFY_RING) /* a decode-only engine's default ring length */
            cr_assert_eq(gdn_engine_get_config(e)->ring_length, GDN_DEFAULT_DECODE_RING_LENGTH);
        gdn_engine_destroy(e);
        cr_assert_eq(c.verify_strategy, GDN_VERIFY_AUTO, "create must not change the caller's config");
    }
}

/* A decode-only engine (max_tokens 1) refuses verify steps (GDN_ESTEP_KIND, nothing changes) and
 * so keeps no verify cache under the cache strategy: 2 layers x 64 rows of 64 KB states would be 8
 * MB; what the strategy's counter holds is the CPU reference's scratch. */
Test(config, decode_only_cache_engine_has_no_verify_cache_and_refuses_verifies)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 64, 64, 1);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_get_config(e)->verify_strategy, GDN_VERIFY_CACHE);
    gdn_memory_report r;
    cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
    cr_assert_lt(r.verify_cache, 1u << 20, "verify cache %llu bytes", (unsigned long long)r.verify_cache);
    int32_t slot = -1;
    cr_assert_eq(gdn_slot_alloc(e, &slot), GDN_OK);
    gdn_step st = {.kind = GDN_STEP_VERIFY, .tokens = 1, .batch = 1, .slots = &slot};
    cr_assert_eq(gdn_engine_begin_step(e, &st, NULL, NULL), GDN_ESTEP_KIND);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_EMISUSE, "no step began");
    st.kind = GDN_STEP_DECODE;
    cr_assert_eq(gdn_engine_begin_step(e, &st, NULL, NULL), GDN_OK, "a decode still runs");
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_commit(e, NULL), GDN_EMISUSE);
    gdn_engine_destroy(e);
    c.max_tokens = 2; /* the cache a verify needs: max_batch x max_tokens states a layer */
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
    cr_assert_geq(r.verify_cache, 2ull * 64 * 2 * 4 * 64 * 64 * 4);
    gdn_engine_destroy(e);
}

/* AUTO keeps the cache strategy for a decode-only engine over the caller's state pool, whatever its
 * size: the caller may read its own pool, which a ring lets lag behind the steps. */
Test(config, auto_keeps_the_cache_over_the_callers_pool)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 80, 80, 1);
    c.backend = GDN_BACKEND_CPU;
    c.verify_strategy = GDN_VERIFY_AUTO;
    const size_t slot_elems = 4 * 64 * 64;
    float *pool = calloc(2 * 80 * slot_elems, sizeof(float));
    cr_assert_not_null(pool);
    for (int own = 0; own < 2; own++) {
        gdn_engine_config ck = c;
        if (own) ck.state_pool = pool;
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&ck, &e), GDN_OK);
        cr_assert_eq(gdn_engine_get_config(e)->verify_strategy, own ? GDN_VERIFY_CACHE : GDN_VERIFY_RING);
        cr_assert_eq(gdn_engine_get_config(e)->ring_length, GDN_DEFAULT_DECODE_RING_LENGTH,
                     "reported for every strategy");
        gdn_engine_destroy(e);
    }
    free(pool);
}

Test(config, fold_strategy_allocates_a_token_store_instead_of_the_cache)
{
    gdn_engine_config c = valid(); /* tiny: HK 2, HV 4, K = V = 64; 2 layers, 8 slots, max_tokens 4 */
    c.verify_strategy = GDN_VERIFY_FOLD;
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    gdn_memory_report r;
    cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
    cr_assert_eq(r.verify_cache, 0);
    /* Per layer, each part 256-byte aligned: the stored tokens (slots x T x (k, v, a, b) in bf16),
     * the pending counts per slot, the arrival counts per row, the flush row. */
#define ALIGN256(x) (((x) + 255) / 256 * 256)
    const uint64_t token_elems = 2 * 64 + 4 * 64 + 2 * 4;
    const uint64_t per_layer = ALIGN256(8ull * 4 * token_elems * 2) + ALIGN256(8ull * 4) +
                               ALIGN256((uint64_t)c.max_batch * 4) + ALIGN256(4ull);
#undef ALIGN256
    cr_assert_eq(r.token_store, 2 * per_layer);
    cr_assert_eq(r.ring, 0);
    cr_assert_eq(r.total, r.state_pools + r.token_store + r.io_buffers + r.parameters + r.indices);
    gdn_engine_destroy(e);
}

Test(config, default_buckets_follow_the_documented_list)
{
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 4, 300, 1);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    const gdn_engine_config *r = gdn_engine_get_config(e);
    const int32_t expected_head[] = {1, 2, 4, 8, 16, 24, 32};
    for (size_t i = 0; i < sizeof expected_head / sizeof expected_head[0]; i++)
        cr_assert_eq(r->buckets[i], expected_head[i], "bucket %zu", i);
    /* 1, 2, 4, 8, then 16..256 by 8 (31 entries), then 272, 288, then max_batch 300 */
    cr_assert_eq(r->num_buckets, 4 + 31 + 2 + 1);
    cr_assert_eq(r->buckets[34], 256);
    cr_assert_eq(r->buckets[35], 272);
    cr_assert_eq(r->buckets[36], 288);
    cr_assert_eq(r->buckets[37], 300);
    cr_assert_float_eq(r->model.scale, 0.125f, 1e-7, "scale resolves to K^-0.5");
    gdn_engine_destroy(e);
}

Test(config, create_rejects_null_and_destroy_null_is_a_noop)
{
    gdn_engine *e = NULL;
    gdn_engine_config c = valid();
    cr_assert_eq(gdn_engine_create(NULL, &e), GDN_EINVAL);
    cr_assert_eq(gdn_engine_create(&c, NULL), GDN_EINVAL);
    gdn_engine_destroy(NULL);
}

Test(config, cuda_backend_without_gpu_is_enodev)
{
    if (test_have_gpu()) cr_skip_test("a GPU is present: the ENODEV path cannot be exercised here");
    gdn_engine_config c = valid();
    c.backend = GDN_BACKEND_CUDA;
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_ENODEV);
    cr_assert_null(e);
    c.backend = GDN_BACKEND_AUTO; /* falls back to the CPU reference */
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_backend(e), GDN_BACKEND_CPU);
    gdn_engine_destroy(e);
}

Test(config, memory_report_adds_up)
{
    gdn_engine_config c = valid(); /* tiny: HV 4, K = V = 64, 2 layers, 8 slots, fp32 */
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    gdn_memory_report r;
    cr_assert_eq(gdn_engine_memory(e, &r), GDN_OK);
    const uint64_t slot_bytes = 4ull * 64 * 64 * 4;
    cr_assert_eq(r.state_pools, 2 * 8 * slot_bytes);
    cr_assert_eq(r.verify_cache, 2 * 8 * 4 * slot_bytes); /* layers x max_batch x max_tokens */
    cr_assert_gt(r.io_buffers, 0);
    cr_assert_eq(r.token_store, 0);
    cr_assert_eq(r.ring, 0);
    cr_assert_eq(r.total, r.state_pools + r.verify_cache + r.io_buffers + r.parameters + r.indices);
    cr_assert_eq(gdn_engine_memory(e, NULL), GDN_EINVAL);
    gdn_engine_destroy(e);
}

/* ---- size arithmetic (issue 17.6): the largest configuration that fits, and one step larger ---- */

__extension__ typedef __int128 wide;
static const wide size_limit = INT64_MAX; /* = min(INT64_MAX, SIZE_MAX) on a 64-bit host */

static wide align256w(wide x) { return (x + 255) / 256 * 256; }

/* One layer's strategy workspace as engine/op.c lays it out for a CPU op (with the reference's
 * scratch), in 128-bit arithmetic. */
static wide workspace_bytes_wide(const gdn_engine_config *c, gdn_verify_strategy strategy)
{
    const gdn_model_config *m = &c->model;
    const wide slot_bytes = (wide)m->num_v_heads * m->head_dim_v * m->head_dim_k * (wide)gdn_dtype_size(c->state_dtype);
    wide at = 0;
    if (strategy == GDN_VERIFY_CACHE) { /* max_tokens 1: decodes only, no verify cache */
        at = c->max_tokens > 1 ? align256w((wide)c->max_batch * c->max_tokens * slot_bytes) : 256;
    } else {
        wide side;
        if (strategy == GDN_VERIFY_FOLD) {
            side = (wide)c->max_tokens * gdn__token_elems(m->num_k_heads, m->num_v_heads, m->head_dim_k, m->head_dim_v) *
                   (wide)gdn_dtype_size(c->input_dtype);
        } else {
            const int32_t length = c->ring_length    ? c->ring_length
                                   : c->max_tokens > 1 ? GDN_DEFAULT_RING_LENGTH
                                                       : GDN_DEFAULT_DECODE_RING_LENGTH;
            side = (wide)(length > c->max_tokens ? length : c->max_tokens) *
                   gdn__ring_record_bytes(m->num_k_heads, m->num_v_heads, m->head_dim_k, m->head_dim_v);
        }
        at = align256w((wide)c->num_slots * side) + align256w((wide)c->num_slots * 4) +
             align256w((wide)c->max_batch * 4) + align256w(4);
    }
    return at + align256w((wide)gdn__ref_scratch_bytes());
}

/* Everything an engine of this (CPU) configuration sizes, by the rule in engine/config.c: per layer
 * the pool, the workspace, the io buffers and A_log / dt_bias, times num_layers, plus the index block. */
static wide engine_bytes_wide(const gdn_engine_config *c, gdn_verify_strategy strategy)
{
    const gdn_model_config *m = &c->model;
    const wide HK = m->num_k_heads, HV = m->num_v_heads, K = m->head_dim_k, V = m->head_dim_v;
    const wide in = (wide)gdn_dtype_size(c->input_dtype), out = (wide)gdn_dtype_size(c->output_dtype);
    const wide rows = (wide)c->max_batch * c->max_tokens;
    const wide pool = (wide)c->num_slots * HV * V * K * (wide)gdn_dtype_size(c->state_dtype);
    const wide io = 2 * align256w(rows * HK * K * in) + align256w(rows * HV * V * in) + 2 * align256w(rows * HV * in) +
                    align256w(rows * HV * V * out);
    const wide layer = pool + workspace_bytes_wide(c, strategy) + io + 2 * HV * 4;
    return (wide)m->num_layers * layer + (3 * (wide)c->max_batch + 2) * 4;
}

/* A model whose one slot is 2^48 bytes in fp32 (HV = 2^30, K = V = 256): sizes overflow at small counts. */
static gdn_engine_config huge(gdn_verify_strategy strategy, int32_t layers, int32_t num_slots, int32_t max_batch,
                              int32_t max_tokens)
{
    gdn_engine_config c = test_config("tiny", layers, GDN_DTYPE_F32, num_slots, max_batch, max_tokens);
    c.model.num_k_heads = 16;
    c.model.num_v_heads = 1 << 30;
    c.model.head_dim_k = c.model.head_dim_v = 256;
    c.verify_strategy = strategy;
    return c;
}

/* The largest value of *field in [1, hi] that validates (validation is monotone in it; 1 does). */
static int32_t largest_accepted(gdn_engine_config *c, int32_t *field, int32_t hi)
{
    int32_t lo = 1;
    *field = lo;
    cr_assert_eq(gdn_engine_config_validate(c), GDN_OK);
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        *field = mid;
        if (gdn_engine_config_validate(c) == GDN_OK) lo = mid;
        else hi = mid - 1;
    }
    *field = lo;
    return lo;
}

/* Refused with `expected` by validate and create, before create allocated anything. */
static void expect_refused_before_allocating(const gdn_engine_config *c, gdn_status expected)
{
    const uint64_t calls = gdn__allocation_count();
    const int64_t live = gdn__allocation_live();
    expect_invalid(c, expected);
    cr_assert_eq(gdn__allocation_count(), calls, "a refused configuration allocated");
    cr_assert_eq(gdn__allocation_live(), live);
}

Test(config, the_largest_slot_count_that_fits_is_accepted_and_one_more_is_refused)
{
    const gdn_verify_strategy strategies[] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_RING};
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
        gdn_engine_config c = huge(strategies[i], 1, 1, 2, 4);
        const int32_t n = largest_accepted(&c, &c.num_slots, INT32_MAX - 2 * c.max_batch - 8);
        cr_assert_gt(n, 1000, "2^63 / 2^48: some 32000 slots");
        /* n fits, in every size the engine or the op layer computes; n + 1 does not */
        const wide fits = engine_bytes_wide(&c, strategies[i]);
        cr_assert(fits <= size_limit, "strategy %d: %d slots are %.4g bytes", strategies[i], n, (double)fits);
        cr_assert(workspace_bytes_wide(&c, strategies[i]) <= size_limit);
        gdn_engine_config more = c;
        more.num_slots = n + 1;
        cr_assert(engine_bytes_wide(&more, strategies[i]) > size_limit, "strategy %d: %d slots still fit: a tighter rule",
                  strategies[i], n + 1);
        expect_refused_before_allocating(&more, GDN_ECONFIG_SLOTS);
        /* The accepted edge asks the allocator for its real size (no wrap-around to a small one):
         * 2^63 bytes cannot be had, so create fails cleanly. (The sanitizer build runs with ASan's
         * allocator_may_return_null=1, as a program that handles NULL from malloc needs.) */
        const int64_t live = gdn__allocation_live();
        gdn_engine *sentinel = (gdn_engine *)(uintptr_t)0x1234, *e = sentinel;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_ENOMEM);
        cr_assert_eq(e, sentinel);
        cr_assert_eq(gdn__allocation_live(), live);

        /* The op layer: the same edge, gdn_op_workspace_bytes exact at n and 0 past it. */
        gdn_op_layer op = {.backend = GDN_BACKEND_CPU, .model = c.model, .input_dtype = c.input_dtype,
                           .output_dtype = c.output_dtype, .kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1,
                           .pool = {(void *)(uintptr_t)256, GDN_DTYPE_F32, n, 0}, .strategy = strategies[i],
                           .max_batch = c.max_batch, .max_tokens = c.max_tokens};
        cr_assert(gdn_op_workspace_bytes(&op) == (size_t)workspace_bytes_wide(&c, strategies[i]));
        op.pool.num_slots = n + 1;
        cr_assert_eq(gdn_op_workspace_bytes(&op), 0);
        op.model.num_layers = 1;
        cr_assert_eq(gdn_op_layer_step(&op, NULL), GDN_ECONFIG_SLOTS);
    }
}

Test(config, the_largest_layer_count_and_batch_that_fit_are_accepted_and_one_more_is_refused)
{
    /* Layers: 16 slots of 2^48 bytes a layer, some 2^11 layers. */
    gdn_engine_config c = huge(GDN_VERIFY_CACHE, 1, 16, 1, 1);
    const int32_t layers = largest_accepted(&c, &c.model.num_layers, INT32_MAX);
    cr_assert(layers > 1000 && layers < 2048, "%d layers", layers);
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_CACHE) <= size_limit);
    c.model.num_layers = layers + 1;
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_CACHE) > size_limit);
    expect_refused_before_allocating(&c, GDN_ECONFIG_LAYERS);

    /* max_batch: the verify cache (max_batch x 16 tokens x 2^48 bytes) and the io buffers. */
    c = huge(GDN_VERIFY_CACHE, 1, 1, 1, GDN_MAX_TOKENS);
    const int32_t batch = largest_accepted(&c, &c.max_batch, (INT32_MAX - 2) / 3);
    cr_assert(batch > 1000 && batch < 2048, "max_batch %d", batch);
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_CACHE) <= size_limit);
    c.max_batch = batch + 1;
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_CACHE) > size_limit);
    expect_refused_before_allocating(&c, GDN_ECONFIG_MAX_BATCH);

    /* The io buffers (fold: no cache, and one slot). */
    c = huge(GDN_VERIFY_FOLD, 1, 1, 1, GDN_MAX_TOKENS);
    const int32_t io_batch = largest_accepted(&c, &c.max_batch, (INT32_MAX - 2) / 3);
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_FOLD) <= size_limit);
    c.max_batch = io_batch + 1;
    cr_assert(engine_bytes_wide(&c, GDN_VERIFY_FOLD) > size_limit);
    expect_refused_before_allocating(&c, GDN_ECONFIG_MAX_BATCH);
}

Test(config, int32_index_arithmetic_bounds_max_batch_and_num_slots)
{
    /* The index block holds 3 max_batch + 2 int32 values. */
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 1, (INT32_MAX - 2) / 3, 1);
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
    c.max_batch++;
    expect_refused_before_allocating(&c, GDN_ECONFIG_MAX_BATCH);
    /* A staging entry holds 2 max_batch + num_slots values (+ 8 of header room). */
    c = test_config("tiny", 1, GDN_DTYPE_F32, INT32_MAX - 2 - 8, 1, 1);
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
    c.num_slots++;
    expect_refused_before_allocating(&c, GDN_ECONFIG_SLOTS);
    c.num_slots = INT32_MAX;
    expect_refused_before_allocating(&c, GDN_ECONFIG_SLOTS);
}

Test(config, caller_pool_strides_that_overflow_are_refused)
{
    gdn_engine_config c = valid(); /* 8 slots of 4 x 64 x 64 fp32 */
    c.state_pool = (void *)(uintptr_t)4096;
    c.state_slot_stride = (int64_t)1 << 61; /* x 8 slots overflows int64 elements */
    expect_refused_before_allocating(&c, GDN_ECONFIG_POOL);
    c.state_slot_stride = 0;
    c.state_layer_stride = INT64_MAX / 2; /* x 4 bytes */
    expect_refused_before_allocating(&c, GDN_ECONFIG_POOL);
    c.state_layer_stride = (int64_t)1 << 60; /* 2^62 bytes: fits one layer, not two */
    expect_refused_before_allocating(&c, GDN_ECONFIG_LAYERS);
    c.model.num_layers = 1;
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
}
