/*
 * The engine's whole mixer step (SPEC 6; gdn_engine_config.mixer in include/gdn/gdn.h) on the CPU
 * backend against the float64 oracle of kernels/ref/gdn_mixer_ref.h: two layers of the tiny preset,
 * fresh random inputs per layer and step (x, z, a, b rounded to bf16 as the engine reads them),
 * outputs poisoned first, SPEC 4's tolerances (y with o's), under every verify strategy, with fp32
 * and bf16 state, padding rows (given, and the bucket's), every accepted count 0..T, forks (write
 * slots), conv off and norm off, conv widths 2..4, bf16 conv weights, no bias, caller-owned conv
 * pools (vLLM's [conv_dim][W-1] with gaps) and strided io views, the slot operations with a window
 * present, and every refusal's status. The CPU backend has no graphs (nothing to capture here).
 *
 * The oracle keeps each slot's logical state per layer (pending work included). With fp32 state it
 * runs unrounded: the engine's fp32 stores are far inside SPEC 4, so long pending chains (fold's
 * pending tokens, the ring's records) are exercised between the state checks. With bf16 state every
 * slot of a step is read through gdn_slot_read_state after the step (a read writes pending work back:
 * the engine then stores exactly where the oracle rounds, once per call as SPEC 4 says), checked
 * within SPEC 4, and the engine's bf16 state adopted, so a one-ulp tie flip cannot grow; fold's and
 * the ring's pending work then lasts one step (the fp32 tests cover the long chains).
 *
 * Windows are compared bit for bit: they hold raw bf16 inputs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"

enum {
    L = 2,          /* layers */
    NUM_SLOTS = 10, /* all allocated; the sequences use slots 0..SEQ_SLOTS-1 */
    SEQ_SLOTS = 6,
    MAX_ROWS = 8,
    MAX_T = 4,
    RING_LENGTH = 4,
    /* caller memory: per token IN_LEAD | x (or q | k | v) | z (heads padded) | (a, b) pairs | IN_TAIL */
    IN_LEAD = 8,
    IN_TAIL = 8,
    IN_ROW_PAD = 24,
    Z_HEAD_GAP = 4,
    CONV_GAP = 8,   /* elements after each slot's window in the caller's conv pool */
    CONV_LAYER_GAP = 40,
};

static const uint32_t OUT_POISON = 0xffffffffu; /* a NaN */

typedef struct em_cfg {
    gdn_verify_strategy strategy;
    gdn_dtype state_dtype;
    int32_t W; /* 0: 4 */
    gdn_dtype weight_dtype;
    int no_conv, no_norm, no_bias;
    int caller_memory; /* caller conv pool (vLLM layout, gaps) and strided io views of one fused tensor */
    uint64_t seed;
} em_cfg;

typedef struct em {
    em_cfg cfg;
    gdn_engine *e;
    int32_t HK, HV, K, V, W;
    int64_t C, state_elems, window_elems;
    gdn__tolerance tol;
    gdn__rng rng;
    int read_every_step; /* bf16 state: see the top of the file */
    /* caller memory */
    uint16_t *fused[L];  /* [MAX_ROWS][MAX_T][N] + row pads */
    int64_t N, R, x_at, z_at, gate_at;
    float *out_mem[L];
    uint16_t *conv_mem;
    gdn_layer_views views[L];
    gdn_layer_io io[L];
    /* the oracle */
    gdn__mixer_ref_model m[L];
    double *dweight[L], *dbias[L], *dnorm[L], *dparams[L];
    gdn__mixer_ref_slot ref[L][NUM_SLOTS];
    int step;
    double worst_out, worst_state;
} em;

static double rnd(em *t, double scale) { return scale * gdn__rng_normal(&t->rng); }
static uint16_t to_bf16(double x) { return gdn__f32_to_bf16((float)x); }
static double from_bf16(uint16_t h) { return (double)gdn__bf16_to_f32(h); }
static double round_to(gdn_dtype dt, double x) { return dt == GDN_DTYPE_BF16 ? from_bf16(to_bf16(x)) : (double)(float)x; }
static size_t state_size(const em *t) { return gdn_dtype_size(t->cfg.state_dtype); }

/* Element (window row j, channel c) within one slot's window block, in the pool's layout. */
static int64_t win_at(const em *t, int32_t j, int64_t c)
{
    return t->cfg.caller_memory ? c * (t->W - 1) + j : j * t->C + c;
}

/* ---------------------------------------------------------------------------------------------- */
/* Creation                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

static gdn_engine_config em_config(const em_cfg *cfg)
{
    gdn_model_config model;
    cr_assert_eq(gdn_model_preset("tiny", L, &model), GDN_OK);
    gdn_engine_config c;
    cr_assert_eq(gdn_engine_config_init(&c, &model), GDN_OK);
    c.state_dtype = cfg->state_dtype;
    c.output_dtype = GDN_DTYPE_F32;
    c.num_slots = NUM_SLOTS;
    c.max_batch = MAX_ROWS;
    c.max_tokens = MAX_T;
    c.backend = GDN_BACKEND_CPU;
    c.verify_strategy = cfg->strategy;
    c.ring_length = RING_LENGTH;
    c.mixer.conv_width = cfg->no_conv ? 0 : cfg->W ? cfg->W : 4;
    c.mixer.conv_weight_dtype = cfg->weight_dtype;
    c.mixer.use_norm = !cfg->no_norm;
    c.mixer.norm_eps = 1e-6f;
    return c;
}

/* The oracle's weights and the engine's, the same values (bf16 weights rounded for both). */
static void set_weights(em *t, int32_t l)
{
    const int64_t C = t->C, W = t->W, HV = t->HV, V = t->V;
    float *params = malloc(sizeof(float) * 2 * (size_t)HV);
    t->dparams[l] = malloc(sizeof(double) * 2 * (size_t)HV);
    for (int64_t h = 0; h < 2 * HV; h++) t->dparams[l][h] = params[h] = (float)rnd(t, 0.1);
    cr_assert_eq(gdn_engine_set_layer_params(t->e, l, params, params + HV), GDN_OK);
    float *norm = NULL;
    if (!t->cfg.no_norm) {
        norm = malloc(sizeof(float) * (size_t)V);
        t->dnorm[l] = malloc(sizeof(double) * (size_t)V);
        for (int64_t d = 0; d < V; d++) t->dnorm[l][d] = norm[d] = (float)(1.0 + rnd(t, 0.3));
    }
    void *weight = NULL, *bias = NULL;
    if (W > 0) {
        const int bf = t->cfg.weight_dtype == GDN_DTYPE_BF16;
        weight = malloc((size_t)(C * W) * (bf ? 2 : 4));
        bias = malloc((size_t)C * (bf ? 2 : 4));
        t->dweight[l] = malloc(sizeof(double) * (size_t)(C * W));
        t->dbias[l] = malloc(sizeof(double) * (size_t)C);
        for (int64_t e = 0; e < C * W + C; e++) {
            const double x = rnd(t, e < C * W ? 0.5 : 0.1);
            const int is_w = e < C * W;
            const int64_t i = is_w ? e : e - C * W;
            double *d = is_w ? &t->dweight[l][i] : &t->dbias[l][i];
            if (bf) ((uint16_t *)(is_w ? weight : bias))[i] = to_bf16(x), *d = from_bf16(to_bf16(x));
            else ((float *)(is_w ? weight : bias))[i] = (float)x, *d = (float)x;
        }
    }
    const gdn_status st = gdn_engine_set_mixer_params(t->e, l, weight, t->cfg.no_bias ? NULL : bias, norm);
    cr_assert_eq(st, GDN_OK, "set_mixer_params: %s", gdn_status_name(st));
    t->m[l] = (gdn__mixer_ref_model){.HK = t->HK, .HV = t->HV, .K = t->K, .V = t->V, .use_conv = W > 0, .W = (int32_t)W,
                                     .conv_weight = t->dweight[l], .conv_bias = t->cfg.no_bias ? NULL : t->dbias[l],
                                     .use_norm = !t->cfg.no_norm, .norm_weight = t->dnorm[l], .norm_eps = 1e-6,
                                     .A_log = t->dparams[l], .dt_bias = t->dparams[l] + HV, .scale = 0.0,
                                     .use_qk_l2norm = 1};
    cr_assert_eq(gdn__ref_mixer_check(&t->m[l]), GDN_OK);
    free(params), free(norm), free(weight), free(bias);
}

/* A random state (0.1 N(0, 1)) and window (N(0, 1)) into every slot of every layer, through the
 * synchronous writes, and into the oracle. */
static void fill_slots(em *t)
{
    void *state = malloc((size_t)t->state_elems * state_size(t));
    uint16_t *win = malloc((size_t)(t->window_elems > 0 ? t->window_elems : 1) * 2);
    for (int32_t l = 0; l < L; l++)
        for (int32_t s = 0; s < NUM_SLOTS; s++) {
            cr_assert_eq(gdn__ref_mixer_slot_init(&t->ref[l][s], &t->m[l]), GDN_OK);
            for (int64_t e = 0; e < t->state_elems; e++) {
                const double x = round_to(t->cfg.state_dtype, rnd(t, 0.1));
                if (t->cfg.state_dtype == GDN_DTYPE_BF16) ((uint16_t *)state)[e] = to_bf16(x);
                else ((float *)state)[e] = (float)x;
                t->ref[l][s].S[e] = x;
            }
            cr_assert_eq(gdn_slot_write_state(t->e, l, s, state), GDN_OK);
            if (t->W == 0) continue;
            for (int32_t j = 0; j < t->W - 1; j++)
                for (int64_t c = 0; c < t->C; c++) {
                    const uint16_t h = to_bf16(rnd(t, 1.0));
                    win[win_at(t, j, c)] = h;
                    t->ref[l][s].window[j * t->C + c] = from_bf16(h);
                }
            const gdn_status st = gdn_slot_write_conv_state(t->e, l, s, win);
            cr_assert_eq(st, GDN_OK, "write_conv_state: %s", gdn_status_name(st));
        }
    free(state), free(win);
}

static em *em_create(const em_cfg *cfg)
{
    em *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->cfg = *cfg;
    t->rng = gdn__rng_seeded(cfg->seed);
    gdn_engine_config c = em_config(cfg);
    t->HK = c.model.num_k_heads, t->HV = c.model.num_v_heads, t->K = c.model.head_dim_k, t->V = c.model.head_dim_v;
    t->W = c.mixer.conv_width;
    t->C = 2 * (int64_t)t->HK * t->K + (int64_t)t->HV * t->V;
    t->state_elems = (int64_t)t->HV * t->V * t->K;
    t->window_elems = t->W > 0 ? (t->W - 1) * t->C : 0;
    t->tol = gdn__spec4_tolerance(cfg->state_dtype);
    t->read_every_step = cfg->state_dtype == GDN_DTYPE_BF16;
    if (cfg->caller_memory) {
        const int64_t HV = t->HV, V = t->V;
        t->x_at = IN_LEAD, t->z_at = IN_LEAD + t->C, t->gate_at = t->z_at + HV * (V + Z_HEAD_GAP);
        t->N = t->gate_at + 2 * HV + IN_TAIL;
        t->R = MAX_T * t->N + IN_ROW_PAD;
        for (int32_t l = 0; l < L; l++) {
            const size_t n = (size_t)(MAX_ROWS * t->R);
            t->fused[l] = malloc(n * 2);
            for (size_t e = 0; e < n; e++) t->fused[l][e] = 0x7fc0; /* NaN where no view points */
            t->out_mem[l] = malloc(sizeof(float) * (size_t)(MAX_ROWS * MAX_T * HV * V));
            uint16_t *in = t->fused[l];
            gdn_layer_views *v = &t->views[l];
            if (t->W > 0) {
                v->x = (gdn_view){in + t->x_at, t->R, t->N, 0};
            } else {
                v->q = (gdn_view){in + t->x_at, t->R, t->N, t->K};
                v->k = (gdn_view){in + t->x_at + (int64_t)t->HK * t->K, t->R, t->N, t->K};
                v->v = (gdn_view){in + t->x_at + 2 * (int64_t)t->HK * t->K, t->R, t->N, V};
            }
            if (!cfg->no_norm) v->z = (gdn_view){in + t->z_at, t->R, t->N, V + Z_HEAD_GAP};
            v->a = (gdn_view){in + t->gate_at, t->R, t->N, 2};
            v->b = (gdn_view){in + t->gate_at + 1, t->R, t->N, 2};
            v->o = (gdn_view){t->out_mem[l], 0, 0, 0};
        }
        c.io_views = t->views;
        if (t->W > 0) { /* vLLM's [conv_dim][W-1] per slot, CONV_GAP after each, CONV_LAYER_GAP after each layer */
            const int64_t slot = t->window_elems + CONV_GAP, layer = NUM_SLOTS * slot + CONV_LAYER_GAP;
            t->conv_mem = malloc((size_t)(L * layer) * 2);
            for (int64_t e = 0; e < L * layer; e++) t->conv_mem[e] = 0x7fc0;
            c.mixer.conv_pool = (gdn_conv_pool){t->conv_mem, slot, 1, t->W - 1};
            c.mixer.conv_layer_stride = layer;
        }
    }
    const gdn_status st = gdn_engine_create(&c, &t->e);
    cr_assert_eq(st, GDN_OK, "gdn_engine_create: %s", gdn_status_name(st));
    for (int32_t s = 0; s < NUM_SLOTS; s++) {
        int32_t slot = -1;
        cr_assert_eq(gdn_slot_alloc(t->e, &slot), GDN_OK);
        cr_assert_eq(slot, s);
    }
    for (int32_t l = 0; l < L; l++) {
        cr_assert_eq(gdn_engine_layer_io(t->e, l, &t->io[l]), GDN_OK);
        set_weights(t, l);
    }
    fill_slots(t);
    return t;
}

static void em_free(em *t)
{
    gdn_engine_destroy(t->e);
    for (int32_t l = 0; l < L; l++) {
        for (int32_t s = 0; s < NUM_SLOTS; s++) gdn__ref_mixer_slot_free(&t->ref[l][s]);
        free(t->dweight[l]), free(t->dbias[l]), free(t->dnorm[l]), free(t->dparams[l]);
        free(t->fused[l]), free(t->out_mem[l]);
    }
    free(t->conv_mem);
    free(t);
}

/* ---------------------------------------------------------------------------------------------- */
/* Pools: raw bytes, and the states through the API                                                 */
/* ---------------------------------------------------------------------------------------------- */

/* Every layer's raw state and window bytes of `slot`, straight from the pools (no write-back). */
typedef struct pool_snap {
    unsigned char *state[L][NUM_SLOTS];
    uint16_t *window[L][NUM_SLOTS];
} pool_snap;

static void snap_take(em *t, pool_snap *p)
{
    for (int32_t l = 0; l < L; l++) {
        gdn_state_pool sp;
        cr_assert_eq(gdn_engine_state_pool(t->e, l, &sp), GDN_OK);
        gdn_conv_pool cp = {0};
        if (t->W > 0) cr_assert_eq(gdn_engine_conv_pool(t->e, l, &cp), GDN_OK);
        for (int32_t s = 0; s < NUM_SLOTS; s++) {
            const size_t sb = (size_t)t->state_elems * state_size(t);
            p->state[l][s] = malloc(sb);
            memcpy(p->state[l][s], (char *)sp.data + (size_t)(s * sp.slot_stride) * state_size(t), sb);
            p->window[l][s] = NULL;
            if (t->W == 0) continue;
            p->window[l][s] = malloc((size_t)t->window_elems * 2);
            memcpy(p->window[l][s], (uint16_t *)cp.data + s * cp.slot_stride, (size_t)t->window_elems * 2);
        }
    }
}

static void snap_free(pool_snap *p)
{
    for (int32_t l = 0; l < L; l++)
        for (int32_t s = 0; s < NUM_SLOTS; s++) free(p->state[l][s]), free(p->window[l][s]);
}

/* Slots with keep[s] set: bit-exact in both pools of every layer against the snapshot. */
static void snap_assert_kept(em *t, const pool_snap *p, const int *keep, const char *what)
{
    pool_snap now;
    snap_take(t, &now);
    for (int32_t l = 0; l < L; l++)
        for (int32_t s = 0; s < NUM_SLOTS; s++) {
            if (!keep[s]) continue;
            cr_assert_eq(memcmp(now.state[l][s], p->state[l][s], (size_t)t->state_elems * state_size(t)), 0,
                         "step %d (%s): layer %d, slot %d (not in the step): its state changed", t->step, what, l, s);
            if (t->W > 0)
                cr_assert_eq(memcmp(now.window[l][s], p->window[l][s], (size_t)t->window_elems * 2), 0,
                             "step %d (%s): layer %d, slot %d (not in the step): its conv window changed", t->step, what, l, s);
        }
    snap_free(&now);
}

/* Slot s's state and window in layer l through the API (a read writes pending work back) against
 * the oracle: the state within SPEC 4, the window bit for bit. With bf16 state the engine's stored
 * state is adopted (see the top of the file). */
static void check_slot(em *t, int32_t l, int32_t s, const char *when)
{
    void *state = malloc((size_t)t->state_elems * state_size(t));
    gdn_status st = gdn_slot_read_state(t->e, l, s, state);
    cr_assert_eq(st, GDN_OK, "%s: read_state(%d, %d): %s", when, l, s, gdn_status_name(st));
    double worst = 0.0;
    gdn__mixer_ref_slot *ref = &t->ref[l][s];
    for (int64_t e = 0; e < t->state_elems; e++) {
        const double got = t->cfg.state_dtype == GDN_DTYPE_BF16 ? from_bf16(((uint16_t *)state)[e]) : ((float *)state)[e];
        const double want = ref->S[e];
        const double ratio = fabs(got - want) / (t->tol.state_abs + t->tol.state_rel * fabs(want));
        cr_assert(ratio <= 1.0, "%s (step %d): layer %d, slot %d, state element %lld: %.6g, float64 %.6g (%.3g of the tolerance)",
                  when, t->step, l, s, (long long)e, got, want, ratio);
        if (ratio > worst) worst = ratio;
        if (t->cfg.state_dtype == GDN_DTYPE_BF16) ref->S[e] = got;
    }
    if (worst > t->worst_state) t->worst_state = worst;
    free(state);
    if (t->W == 0) {
        cr_assert_eq(gdn_slot_read_conv_state(t->e, l, s, &(uint16_t){0}), GDN_EINVAL, "a conv read without the conv");
        return;
    }
    uint16_t *win = malloc((size_t)t->window_elems * 2);
    st = gdn_slot_read_conv_state(t->e, l, s, win);
    cr_assert_eq(st, GDN_OK, "%s: read_conv_state(%d, %d): %s", when, l, s, gdn_status_name(st));
    for (int32_t j = 0; j < t->W - 1; j++)
        for (int64_t c = 0; c < t->C; c++) {
            const uint16_t got = win[win_at(t, j, c)], want = to_bf16(ref->window[j * t->C + c]);
            cr_assert_eq(got, want, "%s (step %d): layer %d, slot %d, window row %d, channel %lld: 0x%04x, oracle 0x%04x",
                         when, t->step, l, s, j, (long long)c, got, want);
        }
    free(win);
}

static void check_all_slots(em *t, const char *when)
{
    for (int32_t l = 0; l < L; l++)
        for (int32_t s = 0; s < NUM_SLOTS; s++) check_slot(t, l, s, when);
}

/* ---------------------------------------------------------------------------------------------- */
/* A step                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

enum { IN_X, IN_Z, IN_A, IN_B };

/* Where element e of token (i, t) of tensor n lies in layer l's inputs (x: channel e of q | k | v). */
static uint16_t *in_at(em *t, int32_t l, int n, int32_t i, int32_t tok, int32_t T, int64_t e)
{
    const int64_t HV = t->HV, V = t->V, qk = (int64_t)t->HK * t->K, it = (int64_t)i * T + tok;
    if (t->cfg.caller_memory) {
        uint16_t *base = t->fused[l] + i * t->R + tok * t->N;
        switch (n) {
        case IN_X: return base + t->x_at + e;
        case IN_Z: return base + t->z_at + e / V * (V + Z_HEAD_GAP) + e % V;
        case IN_A: return base + t->gate_at + 2 * e;
        default: return base + t->gate_at + 2 * e + 1;
        }
    }
    const gdn_layer_io *io = &t->io[l];
    switch (n) {
    case IN_X:
        if (t->W > 0) return (uint16_t *)io->x + it * t->C + e;
        if (e < qk) return (uint16_t *)io->q + it * qk + e;
        if (e < 2 * qk) return (uint16_t *)io->k + it * qk + e - qk;
        return (uint16_t *)io->v + it * HV * V + e - 2 * qk;
    case IN_Z: return (uint16_t *)io->z + it * HV * V + e;
    case IN_A: return (uint16_t *)io->a + it * HV + e;
    default: return (uint16_t *)io->b + it * HV + e;
    }
}

typedef struct step_inputs {
    double *x, *z, *a, *b; /* [B][T][...] */
} step_inputs;

static step_inputs draw_inputs(em *t, int32_t l, int32_t B, int32_t T)
{
    const int64_t HV = t->HV, V = t->V, bt = (int64_t)B * T;
    const int64_t count[4] = {t->C, HV * V, HV, HV};
    const double scale[4] = {1.0, 1.0, 0.1, 0.1};
    step_inputs si;
    double **dst[4] = {&si.x, &si.z, &si.a, &si.b};
    for (int n = 0; n < 4; n++) {
        *dst[n] = malloc(sizeof(double) * (size_t)(bt * count[n]));
        if (n == IN_Z && t->cfg.no_norm) continue;
        for (int32_t i = 0; i < B; i++)
            for (int32_t tok = 0; tok < T; tok++)
                for (int64_t e = 0; e < count[n]; e++) {
                    uint16_t *at = in_at(t, l, n, i, tok, T, e);
                    *at = to_bf16(rnd(t, scale[n]));
                    (*dst[n])[((int64_t)i * T + tok) * count[n] + e] = from_bf16(*at);
                }
    }
    return si;
}

static void free_inputs(step_inputs *si) { free(si->x), free(si->z), free(si->a), free(si->b); }

static float *out_of(em *t, int32_t l) { return t->cfg.caller_memory ? t->out_mem[l] : (float *)t->io[l].o; }
static size_t out_elems(const em *t) { return (size_t)MAX_ROWS * MAX_T * (size_t)t->HV * (size_t)t->V; }

/*
 * One step of B rows (rows[i] < 0: padding; writes: the write slots or NULL) and T tokens: fresh
 * inputs, poisoned outputs, begin + run_step (+ commit with accepted[] for a verify), the oracle,
 * then the checks: outputs within SPEC 4 (padding rows, the bucket's included, exactly 0; nothing
 * past the bucket written), a cache verify wrote neither pool before its commit, and slots outside
 * the step bit-exact in both pools.
 */
static void em_step(em *t, gdn_step_kind kind, int32_t T, int32_t B, const int32_t *rows, const int32_t *writes,
                    const int32_t *accepted)
{
    const int64_t HV = t->HV, V = t->V, C = t->C, HVV = HV * V;
    step_inputs si[L];
    for (int32_t l = 0; l < L; l++) {
        si[l] = draw_inputs(t, l, B, T);
        memset(out_of(t, l), 0xff, out_elems(t) * 4);
    }
    int keep[NUM_SLOTS];
    for (int32_t s = 0; s < NUM_SLOTS; s++) {
        keep[s] = 1;
        for (int32_t i = 0; i < B; i++)
            if (rows[i] >= 0 && (rows[i] == s || (writes && writes[i] == s))) keep[s] = 0;
    }
    pool_snap before;
    snap_take(t, &before);
    const gdn_step step = {.kind = kind, .tokens = T, .batch = B, .slots = rows, .write_slots = writes};
    int32_t bucket = 0;
    gdn_status st = gdn_engine_begin_step(t->e, &step, NULL, &bucket);
    cr_assert_eq(st, GDN_OK, "step %d: begin_step: %s", t->step, gdn_status_name(st));
    st = gdn_engine_run_step(t->e, NULL);
    cr_assert_eq(st, GDN_OK, "step %d: run_step: %s", t->step, gdn_status_name(st));
    if (kind == GDN_STEP_VERIFY) {
        if (t->cfg.strategy == GDN_VERIFY_CACHE) { /* nothing in either pool before the commit */
            int all[NUM_SLOTS];
            for (int32_t s = 0; s < NUM_SLOTS; s++) all[s] = 1;
            snap_assert_kept(t, &before, all, "a cache verify before its commit");
        } else {
            snap_assert_kept(t, &before, keep, "verify before its commit");
        }
        int32_t *acc = gdn_engine_accepted(t->e);
        memcpy(acc, accepted, sizeof(int32_t) * (size_t)B);
        st = gdn_engine_commit(t->e, NULL);
        cr_assert_eq(st, GDN_OK, "step %d: commit: %s", t->step, gdn_status_name(st));
    }
    snap_assert_kept(t, &before, keep, kind == GDN_STEP_DECODE ? "decode" : "verify and commit");
    snap_free(&before);

    /* The oracle and the outputs, layer by layer. */
    double *ref_out = malloc(sizeof(double) * (size_t)(B * T * HVV));
    for (int32_t l = 0; l < L; l++) {
        for (int32_t i = 0; i < B; i++) {
            const int32_t r = rows[i];
            if (r < 0) continue;
            const int32_t w = writes ? writes[i] : r;
            const int64_t it = (int64_t)i * T;
            const double *x = si[l].x + it * C, *a = si[l].a + it * HV, *b = si[l].b + it * HV;
            const double *z = t->cfg.no_norm ? NULL : si[l].z + it * HVV;
            gdn__mixer_ref_slot fork = {0}, *cur = &t->ref[l][r];
            if (w != r) { /* a fork: the row runs on a copy of its read slot, which stays as it was */
                cr_assert_eq(gdn__ref_mixer_slot_init(&fork, &t->m[l]), GDN_OK);
                gdn__ref_mixer_slot_copy(&t->m[l], &fork, cur);
                cur = &fork;
            }
            if (kind == GDN_STEP_DECODE)
                cr_assert_eq(gdn__ref_mixer_run(&t->m[l], cur, 1, x, a, b, z, ref_out + it * HVV), GDN_OK);
            else
                cr_assert_eq(gdn__ref_mixer_verify_commit(&t->m[l], cur, T, x, a, b, z, accepted[i], ref_out + it * HVV),
                             GDN_OK);
            if (w != r) {
                gdn__ref_mixer_slot_copy(&t->m[l], &t->ref[l][w], &fork);
                gdn__ref_mixer_slot_free(&fork);
            }
        }
        const float *out = out_of(t, l);
        double worst = 0.0;
        for (size_t e = 0; e < out_elems(t); e++) {
            const int64_t it = (int64_t)e / HVV, i = it / T;
            uint32_t bits;
            memcpy(&bits, &out[e], 4);
            if (it >= (int64_t)bucket * T) {
                cr_assert_eq(bits, OUT_POISON, "step %d: layer %d, output element %zu past the bucket was written", t->step,
                             l, e);
            } else if (i >= B || rows[i] < 0) {
                cr_assert(out[e] == 0.0f, "step %d: layer %d, padding row %lld: output %g, not 0", t->step, l, (long long)i,
                          out[e]);
            } else {
                const double want = ref_out[e], got = out[e];
                const double ratio = fabs(got - want) / (t->tol.out_abs + t->tol.out_rel * fabs(want));
                cr_assert(ratio <= 1.0, "step %d (%s, T = %d): layer %d, row %lld (slot %d, accepted %d), token %lld, "
                          "element %lld: %.6g, float64 %.6g (%.3g of the tolerance)", t->step,
                          kind == GDN_STEP_DECODE ? "decode" : "verify", T, l, (long long)i, rows[i],
                          accepted ? accepted[i] : 1, (long long)(it % T), (long long)(e % HVV), got, want, ratio);
                if (ratio > worst) worst = ratio;
            }
        }
        if (worst > t->worst_out) t->worst_out = worst;
        free_inputs(&si[l]);
    }
    free(ref_out);
    t->step++;
    if (t->read_every_step) {
        char when[48];
        snprintf(when, sizeof when, "after step %d", t->step - 1);
        for (int32_t l = 0; l < L; l++)
            for (int32_t s = 0; s < NUM_SLOTS; s++)
                if (!keep[s]) check_slot(t, l, s, when);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Scenarios                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/*
 * A random sequence over slots 0..SEQ_SLOTS-1 (the others never take part and stay bit-exact):
 * decodes, verifies of T = 2..4 whose accepted counts cycle through 0..T, padding rows given and
 * from the bucket; every state and window checked every few steps and at the end.
 */
static void run_sequence(const em_cfg *cfg)
{
    em *t = em_create(cfg);
    pool_snap start;
    snap_take(t, &start);
    static const char kinds[] = "DDVVDVDDVVVDVDDV";
    int32_t cursor = 0, seen[MAX_T + 1] = {0}, padding = 0;
    for (int k = 0; kinds[k]; k++) {
        const gdn_step_kind kind = kinds[k] == 'V' ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
        const int32_t T = kind == GDN_STEP_VERIFY ? 2 + k % 3 : 1;
        const int32_t B = 1 + (int32_t)(gdn__rng_next(&t->rng) % 5); /* buckets 1, 2, 4, 8: 3 and 5 pad */
        int32_t perm[SEQ_SLOTS], rows[MAX_ROWS], accepted[MAX_ROWS];
        for (int s = 0; s < SEQ_SLOTS; s++) perm[s] = s;
        for (int s = SEQ_SLOTS - 1; s > 0; s--) {
            const int r = (int)(gdn__rng_next(&t->rng) % (uint64_t)(s + 1)), tmp = perm[s];
            perm[s] = perm[r], perm[r] = tmp;
        }
        for (int32_t i = 0; i < B; i++) {
            const int pad = (k % 3 == 1 && i == B / 2) || gdn__rng_next(&t->rng) % 6 == 0;
            rows[i] = pad ? -1 : perm[i];
            padding += pad;
            accepted[i] = cursor % (T + 1);
            if (kind == GDN_STEP_VERIFY && !pad) seen[accepted[i]]++, cursor++;
        }
        em_step(t, kind, T, B, rows, NULL, kind == GDN_STEP_VERIFY ? accepted : NULL);
        if (k % 5 == 4) check_all_slots(t, "during the sequence");
    }
    int never[NUM_SLOTS];
    for (int32_t s = 0; s < NUM_SLOTS; s++) never[s] = s >= SEQ_SLOTS;
    snap_assert_kept(t, &start, never, "the whole sequence");
    snap_free(&start);
    check_all_slots(t, "at the end");
    for (int n = 0; n <= 2; n++) cr_assert_gt(seen[n], 0, "the sequence never accepted %d tokens", n);
    cr_assert_gt(padding, 0);
    cr_assert_eq(gdn_engine_check_device_error(t->e, NULL), GDN_OK);
    cr_log_info("seed %llu: worst output %.3g, worst state %.3g of SPEC 4's tolerance", (unsigned long long)cfg->seed,
                t->worst_out, t->worst_state);
    em_free(t);
}

/*
 * A verify of T tokens where row i accepts i (0..T; two more rows give -2 and T + 3, clamped), then a
 * decode of the same rows, for T = 2, 4, 3; every state and window checked after each round.
 */
static void run_accepted_counts(const em_cfg *cfg)
{
    em *t = em_create(cfg);
    static const int32_t Ts[] = {2, 4, 3};
    for (int r = 0; r < 3; r++) {
        const int32_t T = Ts[r], B = T + 3;
        int32_t rows[MAX_ROWS], accepted[MAX_ROWS];
        for (int32_t i = 0; i < B; i++) rows[i] = (i + 3 * r) % NUM_SLOTS, accepted[i] = i;
        accepted[T + 1] = -2, accepted[T + 2] = T + 3;
        em_step(t, GDN_STEP_VERIFY, T, B, rows, NULL, accepted);
        em_step(t, GDN_STEP_DECODE, 1, B, rows, NULL, NULL);
        check_all_slots(t, "after a verify with every accepted count and a decode");
    }
    em_free(t);
}

/*
 * Forks: rows that read slot r and write slot w leave r as it was (pending work included) and give w
 * the row's state and window: decodes forking 1 -> 6 and 3 -> 7, then a verify forking 6 -> 8 and
 * 1 -> 9 (accepted >= 1: with 0 the strategies differ, gdn.h), then decodes of every slot involved.
 */
static void run_forks(const em_cfg *cfg)
{
    em *t = em_create(cfg);
    const int32_t r1[4] = {0, 1, 2, 3}, a1[4] = {1, 2, 0, 3};
    em_step(t, GDN_STEP_VERIFY, 3, 4, r1, NULL, a1);
    const int32_t w2[4] = {0, 6, 2, 7};
    em_step(t, GDN_STEP_DECODE, 1, 4, r1, w2, NULL);
    const int32_t r3[5] = {6, 7, -1, 1, 3}, w3[5] = {8, 7, 5, 9, 3}, a3[5] = {2, 1, 0, 3, 1};
    em_step(t, GDN_STEP_VERIFY, 3, 5, r3, w3, a3);
    check_all_slots(t, "after the forks");
    const int32_t r4[6] = {6, 7, 8, 9, 1, 3};
    em_step(t, GDN_STEP_DECODE, 1, 6, r4, NULL, NULL);
    check_all_slots(t, "after decodes of the forked slots");
    em_free(t);
}

/* Writes slot s's window of every layer (random) through import_conv_async from a layered buffer,
 * and its state through import_async, as a prefill hand-off; the oracle follows. */
static void prefill_hand_off(em *t, int32_t s)
{
    const int64_t sl = t->state_elems + 16, wl = t->window_elems + 8; /* layer strides with gaps */
    void *states = malloc((size_t)(L * sl) * state_size(t));
    uint16_t *wins = malloc((size_t)(L * wl) * 2);
    for (int32_t l = 0; l < L; l++) {
        for (int64_t e = 0; e < t->state_elems; e++) {
            const double x = round_to(t->cfg.state_dtype, rnd(t, 0.1));
            if (t->cfg.state_dtype == GDN_DTYPE_BF16) ((uint16_t *)states)[l * sl + e] = to_bf16(x);
            else ((float *)states)[l * sl + e] = (float)x;
            t->ref[l][s].S[e] = x;
        }
        for (int32_t j = 0; j < t->W - 1; j++)
            for (int64_t c = 0; c < t->C; c++) {
                const uint16_t h = to_bf16(rnd(t, 1.0));
                wins[l * wl + win_at(t, j, c)] = h;
                t->ref[l][s].window[j * t->C + c] = from_bf16(h);
            }
    }
    gdn_status st = gdn_slot_import_async(t->e, s, states, sl, NULL);
    cr_assert_eq(st, GDN_OK, "import_async: %s", gdn_status_name(st));
    st = gdn_slot_import_conv_async(t->e, s, wins, wl, NULL);
    cr_assert_eq(st, GDN_OK, "import_conv_async: %s", gdn_status_name(st));
    free(states), free(wins);
}

/*
 * The slot operations with windows and pending work present: copy_async (7 <- 2, both carried,
 * pending work included), reset (3: state and window zero), a prefill hand-off into 4 (import_async
 * and import_conv_async), write_state / write_conv_state of slot 0 (pending work first written back,
 * so the other part stays current), export_async / export_conv_async of slot 1 against the oracle,
 * free and alloc again; then the slots go on through a decode and a verify, and everything is
 * checked.
 */
static void run_slot_ops(const em_cfg *cfg)
{
    em *t = em_create(cfg);
    const int32_t rows[5] = {0, 1, 2, 3, 4}, acc1[5] = {1, 2, 0, 2, 1}, acc2[5] = {2, 3, 1, 1, 3};
    em_step(t, GDN_STEP_VERIFY, 2, 5, rows, NULL, acc1);
    em_step(t, GDN_STEP_DECODE, 1, 5, rows, NULL, NULL);
    em_step(t, GDN_STEP_VERIFY, 3, 5, rows, NULL, acc2); /* fold, ring: work pending in 0..4 */
    pool_snap before;
    snap_take(t, &before);

    gdn_status st = gdn_slot_copy_async(t->e, 7, 2, NULL);
    cr_assert_eq(st, GDN_OK, "copy_async: %s", gdn_status_name(st));
    for (int32_t l = 0; l < L; l++) gdn__ref_mixer_slot_copy(&t->m[l], &t->ref[l][7], &t->ref[l][2]);
    st = gdn_slot_reset(t->e, 3, NULL);
    cr_assert_eq(st, GDN_OK, "reset: %s", gdn_status_name(st));
    for (int32_t l = 0; l < L; l++) {
        memset(t->ref[l][3].S, 0, sizeof(double) * (size_t)t->state_elems);
        if (t->W > 0) memset(t->ref[l][3].window, 0, sizeof(double) * (size_t)t->window_elems);
    }
    if (t->W > 0) prefill_hand_off(t, 4);
    int untouched[NUM_SLOTS] = {0};
    untouched[5] = untouched[6] = untouched[8] = untouched[9] = 1;
    snap_assert_kept(t, &before, untouched, "copy, reset and import");
    snap_free(&before);

    /* Slot 0: a new window alone (its state stays the current one, pending work included), then a
     * new state alone (its window stays). */
    if (t->W > 0) {
        uint16_t *win = malloc((size_t)t->window_elems * 2);
        for (int32_t j = 0; j < t->W - 1; j++)
            for (int64_t c = 0; c < t->C; c++) {
                win[win_at(t, j, c)] = to_bf16(rnd(t, 1.0));
                t->ref[1][0].window[j * t->C + c] = from_bf16(win[win_at(t, j, c)]);
            }
        st = gdn_slot_write_conv_state(t->e, 1, 0, win);
        cr_assert_eq(st, GDN_OK, "write_conv_state: %s", gdn_status_name(st));
        free(win);
    }
    void *state = malloc((size_t)t->state_elems * state_size(t));
    for (int64_t e = 0; e < t->state_elems; e++) {
        const double x = round_to(t->cfg.state_dtype, rnd(t, 0.1));
        if (t->cfg.state_dtype == GDN_DTYPE_BF16) ((uint16_t *)state)[e] = to_bf16(x);
        else ((float *)state)[e] = (float)x;
        t->ref[0][0].S[e] = x;
    }
    st = gdn_slot_write_state(t->e, 0, 0, state);
    cr_assert_eq(st, GDN_OK, "write_state: %s", gdn_status_name(st));
    free(state);

    /* Slot 1 exported (pending work written back first) against the oracle. */
    if (t->W > 0) {
        const int64_t wl = t->window_elems + 4;
        uint16_t *wins = malloc((size_t)(L * wl) * 2);
        st = gdn_slot_export_conv_async(t->e, 1, wins, wl, NULL);
        cr_assert_eq(st, GDN_OK, "export_conv_async: %s", gdn_status_name(st));
        for (int32_t l = 0; l < L; l++)
            for (int32_t j = 0; j < t->W - 1; j++)
                for (int64_t c = 0; c < t->C; c++)
                    cr_assert_eq(wins[l * wl + win_at(t, j, c)], to_bf16(t->ref[l][1].window[j * t->C + c]),
                                 "export_conv_async: layer %d, row %d, channel %lld", l, j, (long long)c);
        free(wins);
    }
    const int64_t sl = t->state_elems;
    void *states = malloc((size_t)(L * sl) * state_size(t));
    st = gdn_slot_export_async(t->e, 1, states, sl, NULL);
    cr_assert_eq(st, GDN_OK, "export_async: %s", gdn_status_name(st));
    for (int32_t l = 0; l < L; l++)
        for (int64_t e = 0; e < t->state_elems; e++) {
            const double got = t->cfg.state_dtype == GDN_DTYPE_BF16 ? from_bf16(((uint16_t *)states)[l * sl + e])
                                                                    : ((float *)states)[l * sl + e];
            const double want = t->ref[l][1].S[e];
            cr_assert(fabs(got - want) <= t->tol.state_abs + t->tol.state_rel * fabs(want),
                      "export_async: layer %d, element %lld: %.6g, float64 %.6g", l, (long long)e, got, want);
        }
    free(states);

    /* Free and take again: the slot keeps its state and window until reset (gdn.h). */
    cr_assert_eq(gdn_slot_free(t->e, 2), GDN_OK);
    int32_t again = -1;
    cr_assert_eq(gdn_slot_alloc(t->e, &again), GDN_OK);
    cr_assert_eq(again, 2);
    cr_assert_eq(gdn_slot_reset(t->e, 2, NULL), GDN_OK);
    for (int32_t l = 0; l < L; l++) {
        memset(t->ref[l][2].S, 0, sizeof(double) * (size_t)t->state_elems);
        if (t->W > 0) memset(t->ref[l][2].window, 0, sizeof(double) * (size_t)t->window_elems);
    }

    const int32_t next[6] = {7, 2, 3, 4, 0, 1}, acc3[6] = {2, 1, 2, 0, 1, 2};
    em_step(t, GDN_STEP_DECODE, 1, 6, next, NULL, NULL);
    em_step(t, GDN_STEP_VERIFY, 2, 6, next, NULL, acc3);
    check_all_slots(t, "after the slot operations");
    em_free(t);
}

/* ---------------------------------------------------------------------------------------------- */
/* Tests                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

#define CFG(strategy_, seed_) .strategy = (strategy_), .seed = (seed_)
#define SEQUENCE_TEST(name, ...) \
    Test(engine_mixer, name) { const em_cfg cfg = {__VA_ARGS__}; run_sequence(&cfg); }

/* fp32 state, W = 4, bias, norm, the engine's own buffers. */
SEQUENCE_TEST(sequence_cache, CFG(GDN_VERIFY_CACHE, 1001))
SEQUENCE_TEST(sequence_fold, CFG(GDN_VERIFY_FOLD, 1002))
SEQUENCE_TEST(sequence_ring, CFG(GDN_VERIFY_RING, 1003))
/* bf16 state (read and checked after every step). */
SEQUENCE_TEST(bf16_state_cache, CFG(GDN_VERIFY_CACHE, 1011), .state_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(bf16_state_fold, CFG(GDN_VERIFY_FOLD, 1012), .state_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(bf16_state_ring, CFG(GDN_VERIFY_RING, 1013), .state_dtype = GDN_DTYPE_BF16)
/* Conv off (q, k, v are the inputs; norm on) and norm off (the output is o). */
SEQUENCE_TEST(conv_off_cache, CFG(GDN_VERIFY_CACHE, 1021), .no_conv = 1)
SEQUENCE_TEST(conv_off_fold, CFG(GDN_VERIFY_FOLD, 1022), .no_conv = 1)
SEQUENCE_TEST(conv_off_ring, CFG(GDN_VERIFY_RING, 1023), .no_conv = 1)
SEQUENCE_TEST(norm_off_cache, CFG(GDN_VERIFY_CACHE, 1031), .no_norm = 1)
SEQUENCE_TEST(norm_off_fold, CFG(GDN_VERIFY_FOLD, 1032), .no_norm = 1)
SEQUENCE_TEST(norm_off_ring, CFG(GDN_VERIFY_RING, 1033), .no_norm = 1)
/* Conv widths 2 and 3, bf16 conv weights, no bias. */
SEQUENCE_TEST(width_2_fold, CFG(GDN_VERIFY_FOLD, 1041), .W = 2)
SEQUENCE_TEST(width_3_ring, CFG(GDN_VERIFY_RING, 1042), .W = 3)
SEQUENCE_TEST(width_3_cache_bf16_weights, CFG(GDN_VERIFY_CACHE, 1043), .W = 3, .weight_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(no_bias_ring_bf16_state, CFG(GDN_VERIFY_RING, 1044), .no_bias = 1, .state_dtype = GDN_DTYPE_BF16)
/* The caller's memory: a vLLM-layout conv pool with gaps, x, z, a, b as slices of one fused tensor. */
SEQUENCE_TEST(caller_memory_cache, CFG(GDN_VERIFY_CACHE, 1051), .caller_memory = 1)
SEQUENCE_TEST(caller_memory_fold, CFG(GDN_VERIFY_FOLD, 1052), .caller_memory = 1)
SEQUENCE_TEST(caller_memory_ring_bf16_state, CFG(GDN_VERIFY_RING, 1053), .caller_memory = 1, .state_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(caller_memory_conv_off_fold, CFG(GDN_VERIFY_FOLD, 1054), .caller_memory = 1, .no_conv = 1)

Test(engine_mixer, every_accepted_count_cache) { const em_cfg c = {CFG(GDN_VERIFY_CACHE, 1101)}; run_accepted_counts(&c); }
Test(engine_mixer, every_accepted_count_fold) { const em_cfg c = {CFG(GDN_VERIFY_FOLD, 1102)}; run_accepted_counts(&c); }
Test(engine_mixer, every_accepted_count_ring) { const em_cfg c = {CFG(GDN_VERIFY_RING, 1103)}; run_accepted_counts(&c); }
Test(engine_mixer, every_accepted_count_fold_bf16_state)
{
    const em_cfg c = {CFG(GDN_VERIFY_FOLD, 1104), .state_dtype = GDN_DTYPE_BF16, .caller_memory = 1};
    run_accepted_counts(&c);
}
Test(engine_mixer, every_accepted_count_ring_width_2)
{
    const em_cfg c = {CFG(GDN_VERIFY_RING, 1105), .W = 2};
    run_accepted_counts(&c);
}

Test(engine_mixer, forks_cache) { const em_cfg c = {CFG(GDN_VERIFY_CACHE, 1201)}; run_forks(&c); }
Test(engine_mixer, forks_fold) { const em_cfg c = {CFG(GDN_VERIFY_FOLD, 1202), .caller_memory = 1}; run_forks(&c); }
Test(engine_mixer, forks_ring) { const em_cfg c = {CFG(GDN_VERIFY_RING, 1203)}; run_forks(&c); }

Test(engine_mixer, slot_ops_cover_the_window_cache) { const em_cfg c = {CFG(GDN_VERIFY_CACHE, 1301)}; run_slot_ops(&c); }
Test(engine_mixer, slot_ops_cover_the_window_fold) { const em_cfg c = {CFG(GDN_VERIFY_FOLD, 1302)}; run_slot_ops(&c); }
Test(engine_mixer, slot_ops_cover_the_window_ring) { const em_cfg c = {CFG(GDN_VERIFY_RING, 1303), .caller_memory = 1}; run_slot_ops(&c); }
Test(engine_mixer, slot_ops_cover_the_window_fold_bf16_state)
{
    const em_cfg c = {CFG(GDN_VERIFY_FOLD, 1304), .state_dtype = GDN_DTYPE_BF16};
    run_slot_ops(&c);
}
Test(engine_mixer, slot_ops_conv_off_ring) { const em_cfg c = {CFG(GDN_VERIFY_RING, 1305), .no_conv = 1}; run_slot_ops(&c); }

/* ---------------------------------------------------------------------------------------------- */
/* Buffers, memory and refusals                                                                     */
/* ---------------------------------------------------------------------------------------------- */

/* The engine's own buffers: x instead of q, k, v with the conv; z with the norm; the memory report. */
Test(engine_mixer, buffers_and_memory_report)
{
    em_cfg cfg = {CFG(GDN_VERIFY_FOLD, 1401)};
    gdn_engine_config c = em_config(&cfg);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    gdn_layer_io io;
    cr_assert_eq(gdn_engine_layer_io(e, 1, &io), GDN_OK);
    cr_assert(io.x && io.z && io.a && io.b && io.o && !io.q && !io.k && !io.v);
    gdn_memory_report m;
    cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
    const uint64_t C = 2 * 2 * 64 + 4 * 64;
    cr_assert_eq(m.conv_pools, (uint64_t)L * NUM_SLOTS * 3 * C * 2, "conv pools: %llu bytes", (unsigned long long)m.conv_pools);
    cr_assert_eq(m.total, m.state_pools + m.conv_pools + m.verify_cache + m.token_store + m.ring + m.io_buffers +
                              m.parameters + m.indices);
    gdn_conv_pool p;
    cr_assert_eq(gdn_engine_conv_pool(e, 1, &p), GDN_OK);
    cr_assert(p.data && p.slot_stride == 3 * (int64_t)C && p.token_stride == 0 && p.channel_stride == 0);
    cr_assert_eq(gdn_engine_conv_pool(e, 2, &p), GDN_ELAYER);
    cr_assert_eq(gdn_engine_get_config(e)->mixer.norm_eps, 1e-6f);
    gdn_engine_destroy(e);

    cfg.no_conv = 1;
    c = em_config(&cfg);
    c.mixer.norm_eps = 0.0f; /* the default */
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_get_config(e)->mixer.norm_eps, 1e-6f);
    cr_assert_eq(gdn_engine_layer_io(e, 0, &io), GDN_OK);
    cr_assert(io.q && io.k && io.v && io.z && !io.x);
    cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
    cr_assert_eq(m.conv_pools, 0);
    cr_assert_eq(gdn_engine_conv_pool(e, 0, &p), GDN_EINVAL, "a conv pool without the conv");
    gdn_engine_destroy(e);
}

/* Every configuration refusal of the mixer, each with its code, before anything is allocated. */
Test(engine_mixer, refused_configurations)
{
    const em_cfg cfg = {CFG(GDN_VERIFY_CACHE, 1501)};
    const int64_t C = 2 * 2 * 64 + 4 * 64;
    static uint16_t pool_mem[L * NUM_SLOTS * 3 * 512 + 64];
    gdn_layer_views views[L];
    static uint16_t view_mem[64];
    struct {
        const char *what;
        gdn_status expected;
    } cases[] = {
        {"conv_width 1", GDN_ECONFIG_MIXER},
        {"conv_width 5", GDN_ECONFIG_MIXER},
        {"conv_width -2", GDN_ECONFIG_MIXER},
        {"F16 conv weights", GDN_ECONFIG_MIXER},
        {"norm_eps NaN", GDN_ECONFIG_MIXER},
        {"norm_eps -1", GDN_ECONFIG_MIXER},
        {"conv_dim past 2^29", GDN_ECONFIG_MIXER},
        {"a conv pool without the conv", GDN_ECONFIG_CONV_POOL},
        {"a conv pool with a negative stride", GDN_ECONFIG_CONV_POOL},
        {"a conv pool whose window is not one block", GDN_ECONFIG_CONV_POOL},
        {"a conv pool slot stride below (W-1) conv_dim", GDN_ECONFIG_CONV_POOL},
        {"a conv pool layer stride below num_slots slots", GDN_ECONFIG_CONV_POOL},
        {"a conv pool at an odd address", GDN_ECONFIG_CONV_POOL},
        {"io views without x (conv on)", GDN_ECONFIG_VIEWS},
        {"io views without z (norm on)", GDN_ECONFIG_VIEWS},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gdn_engine_config c = em_config(&cfg);
        gdn_mixer_config *m = &c.mixer;
        const gdn_conv_pool dense = {pool_mem, 0, 0, 0};
        switch (k) {
        case 0: m->conv_width = 1; break;
        case 1: m->conv_width = 5; break;
        case 2: m->conv_width = -2; break;
        case 3: m->conv_weight_dtype = GDN_DTYPE_F16; break;
        case 4: m->norm_eps = NAN; break;
        case 5: m->norm_eps = -1.0f; break;
        case 6: c.model.num_k_heads = c.model.num_v_heads = 1 << 22; break;
        case 7: m->conv_width = 0, m->conv_pool = dense; break;
        case 8: m->conv_pool = dense, m->conv_pool.slot_stride = -1; break;
        case 9: m->conv_pool = (gdn_conv_pool){pool_mem, 3 * C + 8, 1, 4}; break; /* channel stride W: gaps */
        case 10: m->conv_pool = dense, m->conv_pool.slot_stride = 3 * C - 1; break;
        case 11: m->conv_pool = dense, m->conv_layer_stride = NUM_SLOTS * 3 * C - 1; break;
        case 12: m->conv_pool = (gdn_conv_pool){(char *)pool_mem + 1, 0, 0, 0}; break;
        default:
            for (int32_t l = 0; l < L; l++)
                views[l] = (gdn_layer_views){.x.data = view_mem, .z.data = view_mem, .a.data = view_mem,
                                             .b.data = view_mem, .o.data = view_mem};
            if (k == 13) views[1].x.data = NULL;
            else views[0].z.data = NULL;
            c.io_views = views;
        }
        cr_assert_eq(gdn_engine_config_validate(&c), cases[k].expected, "%s: validate says %s", cases[k].what,
                     gdn_status_name(gdn_engine_config_validate(&c)));
        gdn_engine *e = (gdn_engine *)&c; /* not NULL: a refused create must leave it alone */
        cr_assert_eq(gdn_engine_create(&c, &e), cases[k].expected, "%s", cases[k].what);
        cr_assert_eq(e, (gdn_engine *)&c, "%s: *out changed", cases[k].what);
    }
    /* What is accepted: views with x and no q, k, v; a vLLM-layout caller pool; conv off with a norm. */
    gdn_engine_config c = em_config(&cfg);
    for (int32_t l = 0; l < L; l++)
        views[l] = (gdn_layer_views){.x.data = view_mem, .z.data = view_mem, .a.data = view_mem, .b.data = view_mem,
                                     .o.data = view_mem};
    c.io_views = views;
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
    c.mixer.conv_pool = (gdn_conv_pool){pool_mem, 0, 1, 3};
    cr_assert_eq(gdn_engine_config_validate(&c), GDN_OK);
}

/* The CUDA backend runs the mixer with every strategy, the ring's included, at K = 128 only: it
 * refuses another key head size at creation (GDN_ENOTSUP); a build or a machine without a GPU says
 * GDN_ENODEV first. */
Test(engine_mixer, cuda_runs_the_mixer_with_the_ring_at_k_128_only)
{
    const em_cfg cfg = {CFG(GDN_VERIFY_RING, 1601)};
    gdn_engine_config c = em_config(&cfg);
    c.backend = GDN_BACKEND_CUDA;
    gdn_engine *e = NULL;
    gdn_engine_config plain = c;
    plain.mixer = (gdn_mixer_config){0};
    const int gpu = gdn_engine_create(&plain, &e) == GDN_OK;
    gdn_engine_destroy(e);
    e = NULL;
    cr_assert_eq(c.model.head_dim_k, 64, "the tiny preset");
    const gdn_status st = gdn_engine_create(&c, &e);
    cr_assert_eq(st, gpu ? GDN_ENOTSUP : GDN_ENODEV, "CUDA with a mixer at K = 64: %s", gdn_status_name(st));
    cr_assert_null(e);
    c.mixer.conv_width = 0; /* the norm alone is a mixer too */
    cr_assert_eq(gdn_engine_create(&c, &e), gpu ? GDN_ENOTSUP : GDN_ENODEV);
    cr_assert_null(e);
    c.mixer.conv_width = 4;
    c.model.head_dim_k = c.model.head_dim_v = 128;
    const gdn_status at_128 = gdn_engine_create(&c, &e);
    cr_assert_eq(at_128, gpu ? GDN_OK : GDN_ENODEV, "CUDA ring with a mixer at K = 128: %s", gdn_status_name(at_128));
    gdn_engine_destroy(e);
}

/* The mixer's calls, each refusal with its code and changing nothing. */
Test(engine_mixer, refused_calls_change_nothing)
{
    const em_cfg cfg = {CFG(GDN_VERIFY_RING, 1701)};
    em *t = em_create(&cfg);
    const int32_t rows[3] = {0, 1, 2}, acc[3] = {1, 2, 1};
    em_step(t, GDN_STEP_VERIFY, 2, 3, rows, NULL, acc); /* records pending */
    pool_snap before;
    snap_take(t, &before);
    const int64_t C = t->C;
    float *w = calloc((size_t)(C * 4), sizeof(float)), norm[64] = {0};
    uint16_t *win = calloc((size_t)(L * 3 * C), 2);
    gdn_engine *e = t->e;
    /* set_mixer_params */
    cr_assert_eq(gdn_engine_set_mixer_params(NULL, 0, w, NULL, norm), GDN_EINVAL);
    cr_assert_eq(gdn_engine_set_mixer_params(e, 2, w, NULL, norm), GDN_ELAYER);
    cr_assert_eq(gdn_engine_set_mixer_params(e, -1, w, NULL, norm), GDN_ELAYER);
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, NULL, NULL, norm), GDN_EINVAL, "conv on, no conv weight");
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, w, NULL, NULL), GDN_EINVAL, "norm on, no norm weight");
    /* the window's calls */
    cr_assert_eq(gdn_slot_read_conv_state(e, 2, 0, win), GDN_ELAYER);
    cr_assert_eq(gdn_slot_read_conv_state(e, 0, NUM_SLOTS, win), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_slot_read_conv_state(e, 0, 0, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_write_conv_state(e, 0, -1, win), GDN_EINVAL);
    cr_assert_eq(gdn_slot_write_conv_state(e, 0, 0, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_import_conv_async(e, 0, win, 3 * C - 1, NULL), GDN_EINVAL, "layer stride below the window");
    cr_assert_eq(gdn_slot_import_conv_async(e, 0, NULL, 3 * C, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_export_conv_async(e, 0, win, 3 * C - 1, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_export_conv_async(e, NUM_SLOTS, win, 3 * C, NULL), GDN_ESLOT_RANGE);
    cr_assert_eq(gdn_slot_free(e, 9), GDN_OK);
    cr_assert_eq(gdn_slot_read_conv_state(e, 0, 9, win), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_write_conv_state(e, 0, 9, win), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_import_conv_async(e, 9, win, 3 * C, NULL), GDN_ESLOT_FREE);
    cr_assert_eq(gdn_slot_export_conv_async(e, 9, win, 3 * C, NULL), GDN_ESLOT_FREE);
    /* Busy: a verify that ran and awaits its commit needs slots 0..2 (the ring: reads too). */
    const gdn_step step = {.kind = GDN_STEP_VERIFY, .tokens = 2, .batch = 3, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_OK);
    cr_assert_eq(gdn_slot_write_conv_state(e, 0, 1, win), GDN_ESLOT_BUSY);
    cr_assert_eq(gdn_slot_read_conv_state(e, 0, 1, win), GDN_ESLOT_BUSY, "a ring read mid-verify");
    cr_assert_eq(gdn_slot_import_conv_async(e, 2, win, 3 * C, NULL), GDN_ESLOT_BUSY);
    cr_assert_eq(gdn_slot_export_conv_async(e, 0, win, 3 * C, NULL), GDN_ESLOT_BUSY);
    cr_assert_eq(gdn_slot_write_state(e, 1, 0, w), GDN_ESLOT_BUSY);
    int keep[NUM_SLOTS];
    for (int32_t s = 0; s < NUM_SLOTS; s++) keep[s] = 1;
    snap_assert_kept(t, &before, keep, "the refused calls");
    snap_free(&before);
    /* The verify is dropped by the next begin (as accepting 0): the oracle is unchanged. */
    em_step(t, GDN_STEP_DECODE, 1, 3, rows, NULL, NULL);
    free(w), free(win);
    em_free(t);
}

/* An engine without the mixer: the mixer's calls are refused (GDN_EINVAL), its own work as before. */
Test(engine_mixer, calls_without_a_mixer)
{
    const em_cfg cfg = {CFG(GDN_VERIFY_FOLD, 1801), .no_conv = 1, .no_norm = 1};
    gdn_engine_config c = em_config(&cfg);
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    int32_t s;
    cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
    float w[8] = {0};
    uint16_t win[8];
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, w, NULL, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, NULL, NULL, w), GDN_EINVAL);
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, NULL, w, NULL), GDN_EINVAL, "a bias without the conv");
    cr_assert_eq(gdn_engine_set_mixer_params(e, 0, NULL, NULL, NULL), GDN_OK, "nothing to set");
    cr_assert_eq(gdn_slot_read_conv_state(e, 0, s, win), GDN_EINVAL);
    cr_assert_eq(gdn_slot_write_conv_state(e, 0, s, win), GDN_EINVAL);
    cr_assert_eq(gdn_slot_import_conv_async(e, s, win, 1 << 20, NULL), GDN_EINVAL);
    cr_assert_eq(gdn_slot_export_conv_async(e, s, win, 1 << 20, NULL), GDN_EINVAL);
    gdn_layer_io io;
    cr_assert_eq(gdn_engine_layer_io(e, 0, &io), GDN_OK);
    cr_assert(io.q && !io.x && !io.z);
    gdn_engine_destroy(e);
}
