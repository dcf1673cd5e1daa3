/*
 * Directed checks of the ring verify strategy (GDN_VERIFY_RING), run on the CPU backend by test_ring.c
 * and on the CUDA backend by test_gpu_fold.c: see ring_checks.h. A host model per slot and layer
 * (the checkpoint the pool holds, the current state, the record count h) follows every step, and every
 * step compares every slot's raw pool bytes (gdn_engine_state_pool, downloaded: a read through the API
 * would write back) with the model: untouched bit for bit unless the model wrote back there.
 */
#include "ring_checks.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "support.h"

/*
 * The model of slot s, layer l: ckpt (what the pool holds, rounded to the state dtype), cur (the
 * current state: ckpt with the ring's records, in float64, never rounded) and h (records). Every step
 * goes through fx_step, which checks every output against cur, and, for every allocated slot and
 * layer, that the raw pool bytes are unchanged unless the model wrote back there (then the pool must
 * hold the model's ckpt).
 */
typedef struct fx {
    gdn_engine *e;
    gdn_engine_config c;
    float *params;
    test_rng rng;
    size_t elems;
    int32_t layers, num_slots, capacity;
    double *ckpt, *cur; /* [num_slots][layers][elems] */
    int32_t *h;         /* [num_slots][layers] */
    uint8_t *live;      /* [num_slots]: allocated and modelled */
} fx;

static double *ckpt_of(fx *f, int32_t s, int32_t l) { return f->ckpt + ((size_t)s * (size_t)f->layers + (size_t)l) * f->elems; }
static double *cur_of(fx *f, int32_t s, int32_t l) { return f->cur + ((size_t)s * (size_t)f->layers + (size_t)l) * f->elems; }
static int32_t *h_of(fx *f, int32_t s, int32_t l) { return &f->h[(size_t)s * (size_t)f->layers + (size_t)l]; }
static const float *A_log_of(const fx *f, int32_t l) { return f->params + (size_t)l * 2 * (size_t)f->c.model.num_v_heads; }
static const float *dt_bias_of(const fx *f, int32_t l) { return A_log_of(f, l) + f->c.model.num_v_heads; }

/* Tolerances: bf16 state, SPEC 4's; fp32 state, far tighter than one token's effect on a state (~0.05),
 * the CPU backend (the float64 reference, fp32 records) tighter than the GPU's fp32 arithmetic. */
static int on_cpu(const fx *f) { return f->c.backend == GDN_BACKEND_CPU; }
static double st_abs(const fx *f) { return f->c.state_dtype == GDN_DTYPE_BF16 ? 0.016 : on_cpu(f) ? 1e-5 : 1e-4; }
static double st_rel(const fx *f) { return f->c.state_dtype == GDN_DTYPE_BF16 ? 5e-3 : on_cpu(f) ? 1e-5 : 1e-4; }
static double out_abs(const fx *f) { return f->c.state_dtype == GDN_DTYPE_BF16 ? 1e-3 : on_cpu(f) ? 1e-4 : 1e-3; }
static double out_rel(const fx *f) { return f->c.state_dtype == GDN_DTYPE_BF16 ? 5e-3 : on_cpu(f) ? 1e-4 : 1e-3; }

/* ring_write_through as gdn.h's (-1: decodes append records; the directed checks of the ring's own
 * decode use that). */
static fx fx_make_through(gdn_backend_kind backend, gdn_dtype state_dtype, int32_t ring_length, int32_t max_tokens,
                          int32_t num_slots, int32_t max_batch, int32_t write_through, uint64_t seed)
{
    fx f;
    memset(&f, 0, sizeof f);
    f.rng = test_rng_seeded(seed);
    f.c = test_config("tiny", 2, state_dtype, num_slots, max_batch, max_tokens);
    f.c.output_dtype = GDN_DTYPE_F32; /* outputs checked tighter than bf16 allows */
    f.c.verify_strategy = GDN_VERIFY_RING;
    f.c.ring_length = ring_length;
    f.c.ring_write_through = write_through;
    f.c.backend = backend;
    f.e = test_engine_create(&f.c, &f.rng, &f.params);
    f.c = *gdn_engine_get_config(f.e);
    cr_assert_eq(f.c.verify_strategy, GDN_VERIFY_RING);
    cr_assert_eq(f.c.ring_length, ring_length);
    f.elems = test_state_elems(f.e);
    f.layers = 2, f.num_slots = num_slots;
    f.capacity = ring_length > max_tokens ? ring_length : max_tokens;
    f.ckpt = calloc(f.elems * 2 * (size_t)num_slots, sizeof(double));
    f.cur = calloc(f.elems * 2 * (size_t)num_slots, sizeof(double));
    f.h = calloc(2 * (size_t)num_slots, sizeof(int32_t));
    f.live = calloc((size_t)num_slots, 1);
    return f;
}

static fx fx_make(gdn_backend_kind backend, gdn_dtype state_dtype, int32_t ring_length, int32_t max_tokens,
                  int32_t num_slots, int32_t max_batch, uint64_t seed)
{
    return fx_make_through(backend, state_dtype, ring_length, max_tokens, num_slots, max_batch, -1, seed);
}

static void fx_free(fx *f)
{
    gdn_engine_destroy(f->e);
    free(f->params), free(f->ckpt), free(f->cur), free(f->h), free(f->live);
}

/* Takes the model of `slot` from the engine (a slot whose rings are empty: just written or reset). */
static void fx_adopt(fx *f, int32_t slot)
{
    f->live[slot] = 1;
    for (int32_t l = 0; l < f->layers; l++) {
        double *s = test_read_state(f->e, l, slot);
        memcpy(ckpt_of(f, slot, l), s, sizeof(double) * f->elems);
        memcpy(cur_of(f, slot, l), s, sizeof(double) * f->elems);
        *h_of(f, slot, l) = 0;
        free(s);
    }
}

/* Allocates a slot with a random state in every layer. */
static int32_t fx_alloc(fx *f)
{
    int32_t s;
    cr_assert_eq(gdn_slot_alloc(f->e, &s), GDN_OK);
    test_fill_slot_state(f->e, s, &f->rng);
    fx_adopt(f, s);
    return s;
}

static void fx_release(fx *f, int32_t slot)
{
    cr_assert_eq(gdn_slot_free(f->e, slot), GDN_OK);
    f->live[slot] = 0;
}

/* The model's write-back: the current state, rounded, becomes the checkpoint; the ring empties. */
static void model_write_back(fx *f, int32_t slot, int32_t layer)
{
    double *cur = cur_of(f, slot, layer);
    test_round_to(cur, f->elems, f->c.state_dtype);
    memcpy(ckpt_of(f, slot, layer), cur, sizeof(double) * f->elems);
    *h_of(f, slot, layer) = 0;
}

/* Raw pool bytes of every slot, [num_slots][layers][state bytes]. */
static unsigned char *fx_pools(fx *f)
{
    const size_t per_slot = test_state_bytes(f->e) * (size_t)f->layers;
    unsigned char *all = malloc(per_slot * (size_t)f->num_slots);
    for (int32_t s = 0; s < f->num_slots; s++) {
        unsigned char *one = test_snapshot_pool(f->e, s);
        memcpy(all + per_slot * (size_t)s, one, per_slot);
        free(one);
    }
    return all;
}

static double *widen(const fx *f, const unsigned char *raw)
{
    double *out = malloc(sizeof(double) * f->elems);
    for (size_t j = 0; j < f->elems; j++) {
        if (f->c.state_dtype == GDN_DTYPE_F32) {
            float x;
            memcpy(&x, raw + 4 * j, 4);
            out[j] = x;
        } else {
            uint16_t b;
            memcpy(&b, raw + 2 * j, 2);
            const uint32_t bits = (uint32_t)b << 16;
            float x;
            memcpy(&x, &bits, 4);
            out[j] = x;
        }
    }
    return out;
}

/*
 * One step of `n` rows (read rows[i], write writes[i] or rows[i]; rows[i] < 0: padding) and T tokens
 * on every layer; a verify is committed with accepted[] unless accepted is NULL (then it stays
 * uncommitted, and the next begin drops it). Returns the number of (row, layer) write-backs.
 */
static int32_t fx_step(fx *f, gdn_step_kind kind, int32_t T, int32_t n, const int32_t *rows, const int32_t *writes,
                       const int32_t *accepted)
{
    const int verify = kind == GDN_STEP_VERIFY;
    const size_t bytes = test_state_bytes(f->e), out_per_token = (size_t)f->c.model.num_v_heads * (size_t)f->c.model.head_dim_v;
    unsigned char *before = fx_pools(f);
    test_inputs in[2];
    for (int32_t l = 0; l < f->layers; l++) test_write_inputs(f->e, l, n, T, &f->rng, &in[l]), test_poison_outputs(f->e, l);
    test_run_step(f->e, kind, T, n, rows, writes);
    if (verify && accepted) {
        test_set_accepted(f->e, accepted, n);
        cr_assert_eq(gdn_engine_commit(f->e, NULL), GDN_OK);
    }
    unsigned char *after = fx_pools(f);
    uint8_t *wrote = calloc((size_t)f->num_slots * (size_t)f->layers, 1); /* [slot][layer]: the model wrote back */
    double *expected = malloc(sizeof(double) * out_per_token * (size_t)T);
    double *scratch = malloc(sizeof(double) * f->elems);
    int32_t write_backs = 0;
    for (int32_t l = 0; l < f->layers; l++) {
        double *out = test_read_outputs(f->e, l, n, T);
        /* Outputs first, from every row's read slot as it was before the step. */
        for (int32_t i = 0; i < n; i++) {
            const double *got = out + (size_t)i * (size_t)T * out_per_token;
            if (rows[i] < 0) {
                for (size_t j = 0; j < (size_t)T * out_per_token; j++) cr_assert_eq(got[j], 0.0, "padding row %d", i);
                continue;
            }
            memcpy(scratch, cur_of(f, rows[i], l), sizeof(double) * f->elems);
            test_reference_row(&f->c, &in[l], i, T, A_log_of(f, l), dt_bias_of(f, l), scratch, expected);
            const double ratio = test_error_ratio(got, expected, (size_t)T * out_per_token, out_abs(f), out_rel(f));
            cr_assert_leq(ratio, 1.0, "layer %d row %d (slot %d, %d records): outputs at %.0f%% of tolerance", l, i, rows[i],
                          *h_of(f, rows[i], l), 100 * ratio);
        }
        /* Then the model: each row's write slot from its read slot. */
        for (int32_t i = 0; i < n; i++) {
            if (rows[i] < 0) continue;
            const int32_t r = rows[i], w = writes ? writes[i] : r, h = *h_of(f, r, l);
            const int32_t keep = verify ? (accepted ? accepted[i] : 0) : 1;
            const int through = !verify && gdn__bucket_for(&f->c, n) <= f->c.ring_write_through; /* resolved: -1 never */
            const int flush = r != w || through || (verify ? h + T > f->capacity : h + 1 >= f->c.ring_length);
            if (r != w) {
                memcpy(cur_of(f, w, l), cur_of(f, r, l), sizeof(double) * f->elems);
                f->live[w] = 1;
            }
            double *cur = cur_of(f, w, l);
            if (flush && verify) model_write_back(f, w, l);
            test_reference_row(&f->c, &in[l], i, keep, A_log_of(f, l), dt_bias_of(f, l), cur, NULL);
            if (flush && !verify) model_write_back(f, w, l);
            else *h_of(f, w, l) = (flush ? 0 : h) + keep;
            cr_assert_leq(*h_of(f, w, l), f->capacity);
            wrote[(size_t)w * (size_t)f->layers + (size_t)l] = (uint8_t)flush;
            write_backs += flush;
        }
        free(out);
    }
    /* The raw pools: untouched bit for bit unless the model wrote back there, else the model's ckpt. */
    for (int32_t s = 0; s < f->num_slots; s++)
        for (int32_t l = 0; l < f->layers; l++) {
            const size_t at = ((size_t)s * (size_t)f->layers + (size_t)l) * bytes;
            if (!wrote[(size_t)s * (size_t)f->layers + (size_t)l]) {
                cr_assert_eq(memcmp(before + at, after + at, bytes), 0, "slot %d layer %d: the pool changed (%d records)", s,
                             l, f->live[s] ? *h_of(f, s, l) : -1);
                continue;
            }
            double *pool = widen(f, after + at);
            const double ratio = test_error_ratio(pool, ckpt_of(f, s, l), f->elems, st_abs(f), st_rel(f));
            cr_assert_leq(ratio, 1.0, "slot %d layer %d: the written-back pool at %.0f%% of tolerance", s, l, 100 * ratio);
            free(pool);
        }
    for (int32_t l = 0; l < f->layers; l++) test_inputs_free(&in[l]);
    free(before), free(after), free(wrote), free(expected), free(scratch);
    return write_backs;
}

static int32_t fx_decode(fx *f, int32_t n, const int32_t *rows) { return fx_step(f, GDN_STEP_DECODE, 1, n, rows, NULL, NULL); }

/* Reads `slot` of `layer` through the API: the current state, written back into the pool (which then
 * holds exactly what the read returned); a second read returns the same bytes. */
static void fx_read(fx *f, int32_t slot, int32_t layer)
{
    const size_t bytes = test_state_bytes(f->e);
    unsigned char *got = malloc(bytes), *again = malloc(bytes);
    cr_assert_eq(gdn_slot_read_state(f->e, layer, slot, got), GDN_OK);
    model_write_back(f, slot, layer);
    double *state = widen(f, got);
    const double ratio = test_error_ratio(state, ckpt_of(f, slot, layer), f->elems, st_abs(f), st_rel(f));
    cr_assert_leq(ratio, 1.0, "slot %d layer %d: read at %.0f%% of tolerance", slot, layer, 100 * ratio);
    unsigned char *pool = test_snapshot_pool(f->e, slot);
    cr_assert_eq(memcmp(pool + bytes * (size_t)layer, got, bytes), 0, "slot %d layer %d: the pool holds what the read returned",
                 slot, layer);
    cr_assert_eq(gdn_slot_read_state(f->e, layer, slot, again), GDN_OK);
    cr_assert_eq(memcmp(got, again, bytes), 0, "slot %d layer %d: a second read differs", slot, layer);
    /* The model's checkpoint is what the engine holds now, exactly. */
    memcpy(ckpt_of(f, slot, layer), state, sizeof(double) * f->elems);
    memcpy(cur_of(f, slot, layer), state, sizeof(double) * f->elems);
    free(got), free(again), free(state), free(pool);
}

static void fx_read_all(fx *f, int32_t slot)
{
    for (int32_t l = 0; l < f->layers; l++) fx_read(f, slot, l);
}

/* A ring fills with decodes and is written back by the decode that would make it hold ring_length
 * records, not one earlier; a verify is written back when h + T > C, not when h + T == C. */
void ring_check_write_back_points_are_exact(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make(backend, dtypes[d], 4, 6, 4, 2, 620 + (uint64_t)d); /* C = 6 */
        const int32_t s = fx_alloc(&f);
        for (int32_t k = 1; k <= 3; k++) cr_assert_eq(fx_decode(&f, 1, &s), 0, "decode %d appends", k);
        cr_assert_eq(*h_of(&f, s, 0), 3);
        cr_assert_eq(fx_decode(&f, 1, &s), 2, "the 4th decode writes back (both layers)");
        cr_assert_eq(*h_of(&f, s, 1), 0);
        /* h = 2, T = 4: fits exactly (h + T == C). */
        const int32_t all4[] = {4}, all5[] = {5};
        fx_decode(&f, 1, &s), fx_decode(&f, 1, &s);
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 4, 1, &s, NULL, all4), 0, "h + T == C fits");
        cr_assert_eq(*h_of(&f, s, 0), 6, "a full ring");
        /* A decode on a ring holding more than ring_length - 1 records writes back. */
        cr_assert_eq(fx_decode(&f, 1, &s), 2);
        fx_decode(&f, 1, &s), fx_decode(&f, 1, &s); /* h = 2 */
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 5, 1, &s, NULL, all5), 2, "h + T == C + 1 writes back first");
        cr_assert_eq(*h_of(&f, s, 0), 5);
        fx_read_all(&f, s);
        fx_free(&f);
    }
}

/* (b) A read in the middle of a ring returns the current state, writes it back into that layer's pool
 * only (the other layer keeps its ring), and a second read returns the same bytes. */
void ring_check_a_read_in_the_middle_of_a_ring_returns_the_current_state(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make(backend, dtypes[d], 8, 4, 4, 2, 630 + (uint64_t)d);
        const int32_t s = fx_alloc(&f), other = fx_alloc(&f);
        const int32_t both[] = {s, other};
        for (int k = 0; k < 3; k++) cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 2, both, NULL, NULL), 0);
        fx_read(&f, s, 0); /* raw pools of layer 1 and of `other`: fx_step checked them unchanged so far */
        cr_assert_eq(*h_of(&f, s, 0), 0);
        cr_assert_eq(*h_of(&f, s, 1), 3, "layer 1 keeps its ring");
        unsigned char *pool = test_snapshot_pool(f.e, s);
        double *layer1 = widen(&f, pool + test_state_bytes(f.e));
        cr_assert_eq(memcmp(layer1, ckpt_of(&f, s, 1), sizeof(double) * f.elems), 0, "layer 1's pool still lags");
        free(pool), free(layer1);
        fx_read(&f, s, 0); /* a read of an empty ring: the pool as it is */
        /* The layers' rings now differ (0 and 3 records): a verify of 3 accepted 2 (2 and 5), then
         * decodes until layer 1's ring is written back (5 -> 6 -> 7 -> write-back at the 3rd). */
        const int32_t two[] = {2, 1};
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 3, 2, both, NULL, two), 0);
        cr_assert_eq(fx_decode(&f, 2, both), 0);
        cr_assert_eq(fx_decode(&f, 2, both), 0);
        cr_assert_eq(fx_decode(&f, 2, both), 1, "only layer 1 of slot s is full");
        cr_assert_eq(*h_of(&f, s, 0), 5);
        cr_assert_eq(*h_of(&f, s, 1), 0);
        fx_read_all(&f, s), fx_read_all(&f, other);
        fx_free(&f);
    }
}

/* A write in the middle of a ring replaces the state and empties that layer's ring only: it reads back
 * exactly, the next steps start from it, and the other layer keeps and applies its records. */
void ring_check_a_write_in_the_middle_of_a_ring_replaces_it(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make(backend, dtypes[d], 8, 4, 4, 2, 635 + (uint64_t)d);
        const int32_t s = fx_alloc(&f), other = fx_alloc(&f);
        const int32_t both[] = {s, other}, accepted[] = {3, 2};
        fx_decode(&f, 2, both);
        fx_step(&f, GDN_STEP_VERIFY, 4, 2, both, NULL, accepted); /* 4 and 3 records */
        const size_t bytes = test_state_bytes(f.e);
        unsigned char *written = malloc(bytes);
        for (size_t j = 0; j < f.elems; j++) {
            const float x = (float)(0.1 * test_rng_normal(&f.rng));
            if (dtypes[d] == GDN_DTYPE_F32) memcpy(written + 4 * j, &x, 4);
            else { /* truncated to bf16: any bf16 value will do */
                uint32_t bits;
                memcpy(&bits, &x, 4);
                const uint16_t b = (uint16_t)(bits >> 16);
                memcpy(written + 2 * j, &b, 2);
            }
        }
        cr_assert_eq(gdn_slot_write_state(f.e, 0, s, written), GDN_OK);
        double *state = widen(&f, written);
        memcpy(ckpt_of(&f, s, 0), state, sizeof(double) * f.elems);
        memcpy(cur_of(&f, s, 0), state, sizeof(double) * f.elems);
        *h_of(&f, s, 0) = 0;
        unsigned char *pool = test_snapshot_pool(f.e, s);
        cr_assert_eq(memcmp(pool, written, bytes), 0, "layer 0's pool holds the written state");
        double *lagging = widen(&f, pool + bytes);
        cr_assert_eq(memcmp(lagging, ckpt_of(&f, s, 1), sizeof(double) * f.elems), 0, "layer 1's pool still lags");
        cr_assert_eq(*h_of(&f, s, 1), 4);
        free(pool), free(lagging), free(state), free(written);
        /* Steps from there: layer 0 of s from the written state, layer 1 with its 4 records. */
        fx_decode(&f, 2, both);
        fx_step(&f, GDN_STEP_VERIFY, 3, 2, both, NULL, accepted);
        fx_decode(&f, 2, both);
        fx_read_all(&f, s), fx_read_all(&f, other);
        fx_free(&f);
    }
}

/* (c) Reset and free in the middle of a ring: a reset slot reads zeros and steps from zeros; a freed
 * slot's next owner, whose state is written straight into the pool (as a prefill kernel would), never
 * sees the last owner's records, whether it is read first or stepped first. */
void ring_check_reset_and_free_in_the_middle_of_a_ring(gdn_backend_kind backend)
{
    fx f = fx_make(backend, GDN_DTYPE_F32, 8, 4, 4, 2, 640);
    const int32_t a = fx_alloc(&f), b = fx_alloc(&f);
    const int32_t both[] = {a, b};
    for (int k = 0; k < 3; k++) fx_decode(&f, 2, both);
    cr_assert_eq(gdn_slot_reset(f.e, a, NULL), GDN_OK);
    unsigned char *pool = test_snapshot_pool(f.e, a);
    for (size_t j = 0; j < test_state_bytes(f.e) * 2; j++) cr_assert_eq(pool[j], 0, "reset zeroes the pool");
    free(pool);
    fx_adopt(&f, a); /* reads zeros: the records are gone */
    for (int32_t l = 0; l < 2; l++)
        for (size_t j = 0; j < f.elems; j++) cr_assert_eq(cur_of(&f, a, l)[j], 0.0, "layer %d: a reset slot reads zeros", l);
    fx_decode(&f, 2, both); /* a from zeros (h 0 -> 1), b with 3 records (-> 4) */
    const int32_t accepted[] = {1, 3};
    fx_step(&f, GDN_STEP_VERIFY, 4, 2, both, NULL, accepted); /* a: 2 records, b: 7 */

    /* Reset with records, then straight to a step (no read in between). */
    cr_assert_eq(gdn_slot_reset(f.e, a, NULL), GDN_OK);
    for (int32_t l = 0; l < 2; l++) {
        memset(ckpt_of(&f, a, l), 0, sizeof(double) * f.elems), memset(cur_of(&f, a, l), 0, sizeof(double) * f.elems);
        *h_of(&f, a, l) = 0;
    }
    fx_decode(&f, 1, &a);

    /* Free b (7 records), and hand its slot to a new request twice: first read, then stepped first. */
    gdn_state_pool pools[2];
    for (int32_t l = 0; l < 2; l++) cr_assert_eq(gdn_engine_state_pool(f.e, l, &pools[l]), GDN_OK);
    float *fresh = malloc(sizeof(float) * f.elems);
    for (int round = 0; round < 2; round++) {
        cr_assert_gt(*h_of(&f, b, 0), 0, "the last owner left records");
        fx_release(&f, b);
        int32_t again;
        cr_assert_eq(gdn_slot_alloc(f.e, &again), GDN_OK);
        cr_assert_eq(again, b, "the freed slot is handed out again");
        for (int32_t l = 0; l < 2; l++) {
            for (size_t j = 0; j < f.elems; j++) {
                fresh[j] = (float)(0.1 * test_rng_normal(&f.rng));
                ckpt_of(&f, b, l)[j] = cur_of(&f, b, l)[j] = fresh[j];
            }
            *h_of(&f, b, l) = 0;
            const size_t offset = (size_t)b * (size_t)pools[l].slot_stride * sizeof(float);
            cr_assert_eq(gdn_engine_upload(f.e, (char *)pools[l].data + offset, fresh, sizeof(float) * f.elems, NULL), GDN_OK);
        }
        cr_assert_eq(gdn_engine_synchronize(f.e, NULL), GDN_OK);
        f.live[b] = 1;
        if (round == 0) /* exactly what was written: the read applied none of the last owner's records */
            for (int32_t l = 0; l < 2; l++) {
                double *got = test_read_state(f.e, l, b);
                cr_assert_eq(memcmp(got, ckpt_of(&f, b, l), sizeof(double) * f.elems), 0, "layer %d: the read applied "
                             "the last owner's records", l);
                free(got);
            }
        /* Outputs (fx_step) come from the written state alone. */
        fx_decode(&f, 2, both);
        fx_step(&f, GDN_STEP_VERIFY, 4, 2, both, NULL, accepted); /* b: 1 + 3 records again */
        fx_decode(&f, 2, both);
    }
    free(fresh);
    fx_read_all(&f, a), fx_read_all(&f, b);
    fx_free(&f);
}

/* (d) A verify that does not fit the ring's free space (h + T > C): correct outputs, the state before
 * its tokens written back, and after a commit of 0..T tokens (or none: uncommitted, dropped by the next
 * begin) the right state and records, which the next steps apply. */
void ring_check_a_verify_that_does_not_fit_writes_back_first(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        const int32_t T = 5;
        fx f = fx_make(backend, dtypes[d], 4, 6, 4, 2, 650 + (uint64_t)d); /* C = 6 */
        for (int32_t acc = -1; acc <= T; acc++) { /* -1: uncommitted */
            const int32_t s = fx_alloc(&f);
            for (int k = 0; k < 3; k++) fx_decode(&f, 1, &s);
            cr_assert_eq(*h_of(&f, s, 0), 3);
            const int32_t accepted[] = {acc};
            cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, T, 1, &s, NULL, acc < 0 ? NULL : accepted), 2, "3 + 5 > 6");
            cr_assert_eq(*h_of(&f, s, 1), acc < 0 ? 0 : acc);
            /* The next steps: a decode (writes back when acc >= 3), a verify that fits or not. */
            fx_decode(&f, 1, &s);
            const int32_t two[] = {2};
            fx_step(&f, GDN_STEP_VERIFY, 3, 1, &s, NULL, two);
            fx_decode(&f, 1, &s);
            fx_read_all(&f, s);
            fx_release(&f, s);
        }
        fx_free(&f);
    }
}

/* (e) Forks: a row that reads slot r and writes slot w != r writes its state into w (a decode: after
 * its token; a verify: before its tokens, whose accepted prefix becomes w's records) whatever w held
 * (here a freed slot with records of its last owner), and leaves r and r's ring as they were. */
void ring_check_forks_write_back_into_the_new_slot(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make(backend, dtypes[d], 4, 4, 6, 3, 660 + (uint64_t)d);
        const int32_t r = fx_alloc(&f), stale = fx_alloc(&f), q = fx_alloc(&f);
        const int32_t pair[] = {r, stale};
        fx_decode(&f, 2, pair), fx_decode(&f, 2, pair); /* 2 records each */
        fx_release(&f, stale);                          /* freed with records */
        int32_t w;
        cr_assert_eq(gdn_slot_alloc(f.e, &w), GDN_OK);
        cr_assert_eq(w, stale);
        /* Decode fork r -> w beside an ordinary row q. */
        const int32_t rows[] = {q, r}, writes[] = {q, w};
        cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 2, rows, writes, NULL), 2, "the fork writes back, both layers");
        cr_assert_eq(*h_of(&f, r, 0), 2, "the read slot keeps its ring");
        cr_assert_eq(*h_of(&f, w, 0), 0);
        /* Steps on both branches: r's records and w's written-back state. */
        const int32_t branches[] = {r, w};
        fx_decode(&f, 2, branches);
        /* Verify fork r -> w2 (r with 3 records), accepted 2; the new slot's records then decode. */
        int32_t w2;
        cr_assert_eq(gdn_slot_alloc(f.e, &w2), GDN_OK);
        const int32_t vrows[] = {r, w}, vwrites[] = {w2, w}, accepted[] = {2, 1};
        fx_step(&f, GDN_STEP_VERIFY, 3, 2, vrows, vwrites, accepted);
        cr_assert_eq(*h_of(&f, w2, 0), 2);
        cr_assert_eq(*h_of(&f, r, 0), 3, "the read slot keeps its ring");
        const int32_t three[] = {r, w, w2};
        fx_decode(&f, 3, three);
        /* A verify fork whose accepted count is 0: the new slot holds the read slot's current state. */
        int32_t w3;
        cr_assert_eq(gdn_slot_alloc(f.e, &w3), GDN_OK);
        const int32_t zero[] = {0};
        fx_step(&f, GDN_STEP_VERIFY, 4, 1, &w2, &w3, zero);
        cr_assert_eq(*h_of(&f, w3, 1), 0);
        const int32_t four[] = {r, w, w2, w3};
        fx_step(&f, GDN_STEP_DECODE, 1, 3, four + 1, NULL, NULL);
        for (int i = 0; i < 4; i++) fx_read_all(&f, four[i]);
        fx_free(&f);
    }
}

/* (f) Slots outside the step, rows that append to their rings, and padding rows: pools untouched bit
 * for bit (fx_step compares every slot's raw pool), padding outputs zero, and the rings of the slots
 * outside the step intact (their reads at the end apply them). */
void ring_check_slots_outside_the_step_and_padding_rows_are_bit_exact(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make(backend, dtypes[d], 6, 4, 8, 6, 670 + (uint64_t)d);
        int32_t s[8];
        for (int i = 0; i < 8; i++) s[i] = fx_alloc(&f);
        /* Rings of 1..5 records in slots 0..4 (decodes of a shrinking subset), 0 in 5..7. */
        for (int k = 0; k < 5; k++) fx_decode(&f, 5 - k, s);
        for (int i = 0; i < 5; i++) cr_assert_eq(*h_of(&f, s[i], 0), 5 - i);
        /* Decode: slots 1 and 3 with padding rows around them; 0, 2, 4 (with records) and 5..7 outside. */
        const int32_t rows[] = {-1, s[1], -1, s[3], -1};
        cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 5, rows, NULL, NULL), 0);
        /* Verify with padding rows, accepted 0 and full: slots 2 (3 records) and 0 (5) do not fit and write
         * back, 4 (1) and 6 (0) append. */
        const int32_t vrows[] = {s[2], -1, s[0], s[4], -1, s[6]}, accepted[] = {0, 4, 4, 1, 2, 3};
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 4, 6, vrows, NULL, accepted), 4);
        /* An uncommitted verify and the decode that drops it. */
        const int32_t urows[] = {s[3], -1, s[5]};
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 2, 3, urows, NULL, NULL), 0);
        const int32_t drows[] = {-1, s[5], s[7]};
        fx_step(&f, GDN_STEP_DECODE, 1, 3, drows, NULL, NULL);
        for (int i = 0; i < 8; i++) fx_read_all(&f, s[i]);
        fx_free(&f);
    }
}

/* Decode steps of at most ring_write_through rows write every row back (after applying its records)
 * and leave its ring empty; larger ones append. Explicit row counts, the default (by the state's dtype) and
 * -1; forks, padding rows, rings filled by verifies and by larger decodes; every step checked against
 * the model (outputs, pools bit for bit). */
void ring_check_small_decodes_write_through(gdn_backend_kind backend)
{
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        /* buckets 1, 2, 4: rows <= 2 write through */
        fx f = fx_make_through(backend, dtypes[d], 8, 4, 8, 4, 2, 690 + (uint64_t)d);
        cr_assert_eq(f.c.ring_write_through, 2);
        int32_t s[4];
        for (int j = 0; j < 4; j++) s[j] = fx_alloc(&f);
        const int32_t L = f.layers;
        cr_assert_eq(fx_decode(&f, 1, &s[0]), L, "a one-row decode writes back");
        cr_assert_eq(*h_of(&f, s[0], 0), 0);
        cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 3, s, NULL, NULL), 0, "bucket 4 appends");
        cr_assert_eq(*h_of(&f, s[1], 1), 1);
        const int32_t acc[] = {3, 1, 0, 2};
        cr_assert_eq(fx_step(&f, GDN_STEP_VERIFY, 4, 4, s, NULL, acc), 0);
        cr_assert_eq(*h_of(&f, s[0], 0), 4, "1 + 3 accepted");
        /* Rows with 4, 2, 1 records written through, a padding row between them. */
        const int32_t two[] = {s[0], -1};
        cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 2, two, NULL, NULL), L, "records applied, written back");
        cr_assert_eq(*h_of(&f, s[0], 1), 0);
        cr_assert_eq(fx_decode(&f, 1, &s[1]), L);
        /* Forks: records (s[2]: 1) and none (s[0]) into freed slots; the read slots keep theirs. */
        fx_release(&f, s[3]);
        int32_t fresh;
        cr_assert_eq(gdn_slot_alloc(f.e, &fresh), GDN_OK);
        const int32_t reads[] = {s[2], s[0]}, writes[] = {fresh, s[0]};
        cr_assert_eq(fx_step(&f, GDN_STEP_DECODE, 1, 2, reads, writes, NULL), 2 * L);
        cr_assert_eq(*h_of(&f, s[2], 0), 1, "the read slot keeps its ring");
        cr_assert_eq(*h_of(&f, fresh, 0), 0);
        for (int k = 0; k < 3; k++) fx_decode(&f, 1, &s[2]);
        fx_read_all(&f, s[2]), fx_read_all(&f, fresh);
        fx_free(&f);
    }
    /* The default: GDN_RING_WRITE_THROUGH_HEADS_F32 / _BF16 row-heads by the state's dtype; -1: never. */
    const int32_t heads[] = {GDN_RING_WRITE_THROUGH_HEADS_F32, GDN_RING_WRITE_THROUGH_HEADS_BF16};
    for (int d = 0; d < 2; d++) {
        fx f = fx_make_through(backend, dtypes[d], 8, 2, 4, 4, 0, 694 + 2 * (uint64_t)d);
        const int32_t rows = heads[d] / f.c.model.num_v_heads;
        cr_assert_eq(f.c.ring_write_through, rows > 0 ? rows : -1);
        fx_free(&f);
    }
    fx f = fx_make_through(backend, GDN_DTYPE_F32, 8, 2, 4, 4, -1, 695);
    cr_assert_eq(f.c.ring_write_through, -1);
    const int32_t s0 = fx_alloc(&f);
    cr_assert_eq(fx_decode(&f, 1, &s0), 0, "never: a one-row decode appends");
    fx_free(&f);
}
