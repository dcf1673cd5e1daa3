/*
 * The op layer's whole mixer step (SPEC 6; gdn_mixer in include/gdn/gdn_op.h) on the CPU backend
 * against the float64 oracle of kernels/ref/gdn_mixer_ref.h: random sequences of decodes, verifies and
 * commits over a few slots under every verify strategy, with x, z, a and b as strided column slices of
 * one fused input tensor, a dense or vLLM-layout conv pool, conv widths 2..4, F32 or BF16 conv weights
 * and pools, conv and norm each switched off, every accepted count, forks (write slots), slot copy and
 * reset, and the refused descriptions.
 *
 * The oracle rounds the state to the pool's dtype where each strategy stores it (SPEC 4: cache at every
 * decode and commit, fold when the next step or a flush folds, ring at its write-backs, with the ring's
 * records replayed over the rounded checkpoint), so the bf16 pools are held to SPEC 4's bf16 tolerances
 * with no slack for another rounding schedule; every bf16 store must be the oracle's rounding or one ulp
 * beside it, and the op's is then adopted (store_into says why).
 *
 * What is compared: every output row of every step (within SPEC 4's tolerances; padding rows exactly
 * 0, and nothing outside the step's outputs written), the bytes of every slot not in a step (pool and
 * conv pool, bit-exact), and at a few points each slot's state (gdn_op_slot_export, within SPEC 4) and
 * conv window (read from the conv pool after gdn_op_flush or gdn_op_slot_export of the slot: bit-exact,
 * the window holds raw bf16 inputs).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn_op.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"

enum {
    NUM_SLOTS = 10,  /* the pool; the random sequences use slots 0..SEQ_SLOTS-1 only */
    SEQ_SLOTS = 6,
    MAX_ROWS = 8,
    MAX_T = 4,
    RING_LENGTH = 4, /* the shortest ring: write-backs happen within a few steps */
    POOL_GAP = 32,   /* elements between two slots' states */
    CONV_GAP = 8,    /* elements between two slots' windows (vLLM layout only) */
    IN_LEAD = 8,     /* fused input tensor, per token: IN_LEAD | x | z (heads padded) | (a, b) pairs | IN_TAIL */
    IN_TAIL = 8,
    IN_ROW_PAD = 24, /* elements between rows, after MAX_T tokens */
    Z_HEAD_GAP = 4,
    OUT_HEAD_GAP = 4, /* output view [row][token][head], each padded */
    OUT_TOKEN_GAP = 8,
    OUT_ROW_GAP = 8,
};

static const uint32_t OUT_POISON = 0xffffffffu; /* a NaN */

/* ---------------------------------------------------------------------------------------------- */
/* One op over host memory, and the oracle beside it                                                */
/* ---------------------------------------------------------------------------------------------- */

typedef struct mix_cfg {
    int32_t HK, HV, K, V; /* 0: the tiny preset */
    gdn_verify_strategy strategy;
    gdn_dtype pool_dtype;
    int32_t W; /* conv width; 0: 4 */
    gdn_dtype weight_dtype;
    int no_conv, no_bias, no_norm, vllm_layout; /* no_conv: q, k, v given */
    int dense_views; /* x (or q, k, v), z, a, b dense [B, T, ...] tensors of the step's T, not slices */
    int counts;      /* run_sequence: verify steps give each row its own token count (SPEC 3) */
    int trees;       /* run_sequence: verify steps are token trees, committed by accepted node */
    int write_through; /* ring: the op's default ring_write_through (else -1: decodes append records) */
    uint64_t seed;
} mix_cfg;

typedef struct mix {
    mix_cfg cfg;
    int32_t HK, HV, K, V, W;
    int64_t C;           /* conv_dim */
    int64_t N, R;        /* fused input tensor: token and row strides */
    int64_t x_at, z_at, gate_at; /* column of x, z and the (a, b) pairs within a token */
    int64_t dense_at[6];         /* dense views: where x (q, k, v), z, a and b start */
    int64_t out_head, out_token, out_row;
    int64_t state_elems, conv_window_elems, conv_ts, conv_cs;
    gdn_op_layer op;
    gdn_mixer mixer;
    uint16_t *in;
    size_t in_elems;
    float *out;
    size_t out_elems;
    unsigned char *pool;
    size_t pool_bytes;
    uint16_t *conv;
    size_t conv_elems;
    unsigned char *workspace;
    size_t ws_bytes;
    void *weight, *bias;
    float *norm_w, *params;
    int32_t rows[MAX_ROWS], accepted[MAX_ROWS];
    const int32_t *writes; /* the next steps' write slots (host [B]), or NULL: the read slots */
    const int32_t *counts; /* the next verify steps' token counts (host [B]), or NULL: every row T */
    const int32_t *parents; /* the next verify steps' trees (host [B][T]), or NULL: chains; accepted[] are nodes */
    int32_t write_slots[MAX_ROWS];
    int32_t error_flag;
    /* the oracle */
    gdn__mixer_ref_model m;
    double *dweight, *dbias, *dnorm, *dparams;
    gdn__mixer_ref_slot ref[NUM_SLOTS]; /* each slot's current state, its pending tokens included */
    int32_t pending[NUM_SLOTS];         /* tokens the pool lags by (fold: accepted, not folded; ring: records) */
    int fresh_oracle; /* verify + commit as two plain runs instead of gdn__ref_mixer_verify_commit */
    gdn__tolerance tol;
    gdn__rng rng;
    int step;
    double worst_out, worst_state;
} mix;

static double rnd(mix *mx, double scale) { return scale * gdn__rng_normal(&mx->rng); }
static uint16_t to_bf16(double x) { return gdn__f32_to_bf16((float)x); }
static double from_bf16(uint16_t h) { return (double)gdn__bf16_to_f32(h); }
static double round_bf16(double x) { return from_bf16(to_bf16(x)); }

static size_t pool_size(const mix *mx) { return gdn_dtype_size(mx->cfg.pool_dtype); }
static double pool_get(const mix *mx, const void *base, int64_t e)
{
    return mx->cfg.pool_dtype == GDN_DTYPE_BF16 ? from_bf16(((const uint16_t *)base)[e]) : (double)((const float *)base)[e];
}
static unsigned char *slot_state(const mix *mx, int32_t s)
{
    return mx->pool + (size_t)(s * mx->op.pool.slot_stride) * pool_size(mx);
}
/* Element (window row j, channel c) of slot s's window in the conv pool. */
static int64_t conv_at(const mix *mx, int32_t s, int32_t j, int64_t c)
{
    return s * mx->mixer.conv.slot_stride + j * mx->conv_ts + c * mx->conv_cs;
}

static mix *mix_create(const mix_cfg *cfg)
{
    mix *mx = calloc(1, sizeof *mx);
    cr_assert_not_null(mx);
    mx->cfg = *cfg;
    mx->rng = gdn__rng_seeded(cfg->seed);
    gdn_op_layer *op = &mx->op;
    if (cfg->HK) {
        op->model = (gdn_model_config){.num_layers = 1, .num_k_heads = cfg->HK, .num_v_heads = cfg->HV,
                                       .head_dim_k = cfg->K, .head_dim_v = cfg->V, .scale = 0.0f, .use_qk_l2norm = 1};
    } else {
        cr_assert_eq(gdn_model_preset("tiny", 1, &op->model), GDN_OK);
        cr_assert(op->model.num_k_heads == 2 && op->model.num_v_heads == 4 && op->model.head_dim_k == 64 &&
                  op->model.head_dim_v == 64, "the tiny preset changed");
    }
    const int32_t HK = mx->HK = op->model.num_k_heads, HV = mx->HV = op->model.num_v_heads;
    const int32_t K = mx->K = op->model.head_dim_k, V = mx->V = op->model.head_dim_v;
    const int32_t W = mx->W = cfg->no_conv ? 0 : cfg->W ? cfg->W : 4;
    const int64_t C = mx->C = 2 * (int64_t)HK * K + (int64_t)HV * V;
    mx->state_elems = (int64_t)HV * V * K;
    mx->tol = gdn__spec4_tolerance(cfg->pool_dtype);

    /* The fused input tensor, NaN everywhere no view points (a stray read shows in the outputs). */
    mx->x_at = IN_LEAD, mx->z_at = IN_LEAD + C, mx->gate_at = IN_LEAD + C + (int64_t)HV * (V + Z_HEAD_GAP);
    mx->N = mx->gate_at + 2 * HV + IN_TAIL;
    mx->R = MAX_T * mx->N + IN_ROW_PAD;
    cr_assert_gt(mx->R, MAX_T * C, "x must be a strided view");
    mx->in_elems = (size_t)(MAX_ROWS * mx->R);
    { /* the dense layout: q | k | v (x: the same span), then z, a, b */
        const int64_t bt = MAX_ROWS * MAX_T, qk = (int64_t)HK * K;
        int64_t *d = mx->dense_at;
        d[0] = 0, d[1] = d[0] + bt * qk, d[2] = d[1] + bt * qk, d[3] = d[2] + bt * HV * V, d[4] = d[3] + bt * HV * V;
        d[5] = d[4] + bt * HV;
        if ((size_t)(d[5] + bt * HV) > mx->in_elems) mx->in_elems = (size_t)(d[5] + bt * HV);
    }
    mx->in = malloc(mx->in_elems * 2);
    for (size_t e = 0; e < mx->in_elems; e++) mx->in[e] = 0x7fc0;
    mx->out_head = V + OUT_HEAD_GAP, mx->out_token = HV * mx->out_head + OUT_TOKEN_GAP;
    mx->out_row = MAX_T * mx->out_token + OUT_ROW_GAP;
    mx->out_elems = (size_t)(MAX_ROWS * mx->out_row);
    mx->out = malloc(mx->out_elems * 4);

    /* Parameters: the op's in their dtypes, the oracle's the same values widened. */
    mx->params = malloc(sizeof(float) * 2 * (size_t)HV);
    mx->dparams = malloc(sizeof(double) * 2 * (size_t)HV);
    for (int h = 0; h < 2 * HV; h++) mx->dparams[h] = mx->params[h] = (float)rnd(mx, 0.1);
    mx->norm_w = malloc(sizeof(float) * (size_t)V);
    mx->dnorm = malloc(sizeof(double) * (size_t)V);
    for (int d = 0; d < V; d++) mx->dnorm[d] = mx->norm_w[d] = (float)(1.0 + rnd(mx, 0.3));
    if (W > 0) {
        const int bf = cfg->weight_dtype == GDN_DTYPE_BF16;
        mx->weight = malloc((size_t)(C * W) * (bf ? 2 : 4));
        mx->bias = malloc((size_t)C * (bf ? 2 : 4));
        mx->dweight = malloc(sizeof(double) * (size_t)(C * W));
        mx->dbias = malloc(sizeof(double) * (size_t)C);
        for (int64_t e = 0; e < C * W + C; e++) {
            const double x = rnd(mx, e < C * W ? 0.5 : 0.1);
            double *d = e < C * W ? &mx->dweight[e] : &mx->dbias[e - C * W];
            void *w = e < C * W ? mx->weight : mx->bias;
            const int64_t i = e < C * W ? e : e - C * W;
            if (bf) ((uint16_t *)w)[i] = to_bf16(x), *d = round_bf16(x);
            else ((float *)w)[i] = (float)x, *d = (float)x;
        }
    }

    /* The conv pool: random raw inputs in every slot, and CONV_GAP poison between slots (vLLM). */
    if (W > 0) {
        const int64_t wn = (int64_t)(W - 1) * C;
        mx->conv_window_elems = wn;
        gdn_conv_pool *cp = &mx->mixer.conv;
        if (cfg->vllm_layout) cp->slot_stride = wn + CONV_GAP, cp->token_stride = 1, cp->channel_stride = W - 1;
        else cp->slot_stride = wn, cp->token_stride = 0, cp->channel_stride = 0;
        mx->conv_ts = cfg->vllm_layout ? 1 : C, mx->conv_cs = cfg->vllm_layout ? W - 1 : 1;
        mx->conv_elems = (size_t)(NUM_SLOTS * cp->slot_stride);
        mx->conv = malloc(mx->conv_elems * 2);
        for (size_t e = 0; e < mx->conv_elems; e++) mx->conv[e] = 0x7fc0;
        for (int32_t s = 0; s < NUM_SLOTS; s++)
            for (int32_t j = 0; j < W - 1; j++)
                for (int64_t c = 0; c < C; c++) mx->conv[conv_at(mx, s, j, c)] = to_bf16(rnd(mx, 1.0));
        cp->data = mx->conv;
    }

    /* The state pool: 0.1 N(0, 1) in the pool's dtype, POOL_GAP elements of poison between slots. */
    op->pool = (gdn_state_pool){NULL, cfg->pool_dtype, NUM_SLOTS, mx->state_elems + POOL_GAP};
    mx->pool_bytes = (size_t)(NUM_SLOTS * op->pool.slot_stride) * pool_size(mx);
    mx->pool = malloc(mx->pool_bytes);
    memset(mx->pool, 0xff, mx->pool_bytes);
    for (int32_t s = 0; s < NUM_SLOTS; s++)
        for (int64_t e = 0; e < mx->state_elems; e++) {
            const double x = rnd(mx, 0.1);
            if (cfg->pool_dtype == GDN_DTYPE_BF16) ((uint16_t *)slot_state(mx, s))[e] = to_bf16(x);
            else ((float *)slot_state(mx, s))[e] = (float)x;
        }
    op->pool.data = mx->pool;

    /* The mixer and the op. */
    gdn_mixer *mi = &mx->mixer;
    mi->conv_width = W;
    mi->conv_weight_dtype = cfg->weight_dtype;
    mi->conv_weight = mx->weight;
    mi->conv_bias = cfg->no_bias ? NULL : mx->bias;
    mi->norm_weight = cfg->no_norm ? NULL : mx->norm_w;
    mi->norm_eps = 1e-6f;
    op->backend = GDN_BACKEND_CPU;
    op->input_dtype = GDN_DTYPE_BF16;
    op->output_dtype = GDN_DTYPE_F32;
    op->mixer = mi;
    uint16_t *in = mx->in;
    if (cfg->dense_views) {
        const int64_t *d = mx->dense_at;
        if (W > 0) op->x = (gdn_view){in + d[0], 0, 0, 0};
        else op->q = (gdn_view){in + d[0], 0, 0, 0}, op->k = (gdn_view){in + d[1], 0, 0, 0}, op->v = (gdn_view){in + d[2], 0, 0, 0};
        if (!cfg->no_norm) op->z = (gdn_view){in + d[3], 0, 0, 0};
        op->a = (gdn_view){in + d[4], 0, 0, 0};
        op->b = (gdn_view){in + d[5], 0, 0, 0};
    } else {
        if (W > 0) {
            op->x = (gdn_view){in + mx->x_at, mx->R, mx->N, 0};
        } else { /* x is q | k | v already: the three are slices of it */
            op->q = (gdn_view){in + mx->x_at, mx->R, mx->N, K};
            op->k = (gdn_view){in + mx->x_at + (int64_t)HK * K, mx->R, mx->N, K};
            op->v = (gdn_view){in + mx->x_at + 2 * (int64_t)HK * K, mx->R, mx->N, V};
        }
        if (!cfg->no_norm) op->z = (gdn_view){in + mx->z_at, mx->R, mx->N, V + Z_HEAD_GAP};
        op->a = (gdn_view){in + mx->gate_at, mx->R, mx->N, 2};
        op->b = (gdn_view){in + mx->gate_at + 1, mx->R, mx->N, 2};
    }
    op->o = (gdn_view){mx->out, mx->out_row, mx->out_token, mx->out_head};
    op->A_log = mx->params;
    op->dt_bias = mx->params + HV;
    op->read_slots = mx->rows;
    op->write_slots = NULL;
    op->error_flag = &mx->error_flag;
    op->strategy = cfg->strategy;
    op->max_batch = MAX_ROWS;
    op->max_tokens = MAX_T;
    op->ring_length = RING_LENGTH;
    op->ring_write_through = cfg->write_through ? 0 : -1;
    op->kind = GDN_STEP_DECODE;
    op->tokens = 1;
    mx->ws_bytes = gdn_op_workspace_bytes(op);
    cr_assert_gt(mx->ws_bytes, 0, "a valid mixer op needs a workspace");
    mx->workspace = calloc(1, mx->ws_bytes);
    op->workspace = mx->workspace;

    /* The oracle: the same model, and each slot as the pools hold it. */
    mx->m = (gdn__mixer_ref_model){.HK = HK, .HV = HV, .K = K, .V = V, .use_conv = W > 0, .W = W,
                                   .conv_weight = mx->dweight, .conv_bias = cfg->no_bias ? NULL : mx->dbias,
                                   .use_norm = !cfg->no_norm, .norm_weight = mx->dnorm, .norm_eps = 1e-6,
                                   .A_log = mx->dparams, .dt_bias = mx->dparams + HV, .scale = 0.0, .use_qk_l2norm = 1};
    cr_assert_eq(gdn__ref_mixer_check(&mx->m), GDN_OK);
    for (int32_t s = 0; s < NUM_SLOTS; s++) {
        cr_assert_eq(gdn__ref_mixer_slot_init(&mx->ref[s], &mx->m), GDN_OK);
        for (int64_t e = 0; e < mx->state_elems; e++) mx->ref[s].S[e] = pool_get(mx, slot_state(mx, s), e);
        for (int32_t j = 0; j < W - 1; j++)
            for (int64_t c = 0; c < C; c++) mx->ref[s].window[j * C + c] = from_bf16(mx->conv[conv_at(mx, s, j, c)]);
    }
    return mx;
}

static void mix_free(mix *mx)
{
    for (int32_t s = 0; s < NUM_SLOTS; s++) gdn__ref_mixer_slot_free(&mx->ref[s]);
    free(mx->in), free(mx->out), free(mx->pool), free(mx->conv), free(mx->workspace), free(mx->weight), free(mx->bias);
    free(mx->norm_w), free(mx->params), free(mx->dweight), free(mx->dbias), free(mx->dnorm), free(mx->dparams);
    free(mx);
}

/* ---------------------------------------------------------------------------------------------- */
/* A step                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* The oracle's slot s is stored: its state rounded to the pool's dtype (SPEC 4: the reference rounds
 * where the op stores), nothing pending. */
static double round_pool(const mix *mx, double x)
{
    return mx->cfg.pool_dtype == GDN_DTYPE_BF16 ? round_bf16(x) : (double)(float)x;
}
/*
 * The oracle's state `cur` is stored into pool slot w, where the op has just stored it: rounded to the
 * pool's dtype. With an fp32 pool the stored state must be within a few fp32 roundings of it (a store
 * the op did not make fails here). With a bf16 pool the op's own rounding is adopted, after checking that it is the
 * oracle's, or one bf16 ulp beside it (float32 and float64 arithmetic may round a value near a tie
 * apart), or within 1e-6 of it (float32 noise on an element that cancelled to almost 0; the states are
 * ~0.1): left to grow, such a flip would make later outputs differ from the oracle by more than SPEC
 * 4's bf16 output tolerance once the gated norm amplifies a small o (y ~ o / rms(o) * silu(z)).
 */
static void store_into(mix *mx, gdn__mixer_ref_slot *cur, int32_t w, const char *what)
{
    const unsigned char *stored = slot_state(mx, w);
    for (int64_t e = 0; e < mx->state_elems; e++) {
        const double model = round_pool(mx, cur->S[e]);
        const double got = pool_get(mx, stored, e);
        if (mx->cfg.pool_dtype != GDN_DTYPE_BF16) { /* a few fp32 roundings apart at most: the store happened */
            cr_assert(fabs(got - model) <= 1e-6 + 1e-5 * fabs(model),
                      "step %d, %s: slot %d, stored fp32 state element %lld is %.9g, the float64 state %.9g", mx->step, what,
                      w, (long long)e, got, cur->S[e]);
            cur->S[e] = model;
            continue;
        }
        if (got != model) {
            int ex;
            frexp(fmax(fabs(got), fabs(model)), &ex);
            const double ulp = ldexp(1.0, ex - 8);
            cr_assert(fabs(got - model) <= fmax(ulp, 1e-6), "step %d, %s: slot %d, stored state element %lld (head %lld, "
                      "row %lld, col %lld) is %.6g, the float64 state rounded to bf16 %.6g (unrounded %.9g): more than one "
                      "ulp apart",
                      mx->step, what, w, (long long)e, (long long)(e / (mx->V * mx->K)), (long long)(e / mx->K % mx->V),
                      (long long)(e % mx->K), got, model, cur->S[e]);
        }
        cur->S[e] = got;
    }
}

/* The step's inputs for the oracle, [B][T][...], each rounded to bf16 as the op reads them. */
typedef struct step_inputs {
    double *x, *a, *b, *z;
} step_inputs;

enum { IN_X, IN_Z, IN_A, IN_B };

/* Where element e of token (i, t) of a step of T tokens lies in the input buffer: IN_X channel e of x
 * (q | k | v without the conv), IN_Z element e = h V + d of z, IN_A and IN_B head e. */
static int64_t in_at(const mix *mx, int tensor, int32_t i, int32_t t, int32_t T, int64_t e)
{
    const int64_t HV = mx->HV, V = mx->V, qk = (int64_t)mx->HK * mx->K, it = (int64_t)i * T + t;
    if (mx->cfg.dense_views) {
        const int64_t *d = mx->dense_at;
        switch (tensor) {
        case IN_X:
            if (mx->W > 0) return d[0] + it * mx->C + e;
            return e < qk ? d[0] + it * qk + e : e < 2 * qk ? d[1] + it * qk + e - qk : d[2] + it * HV * V + e - 2 * qk;
        case IN_Z: return d[3] + it * HV * V + e;
        case IN_A: return d[4] + it * HV + e;
        default: return d[5] + it * HV + e;
        }
    }
    const int64_t tok = i * mx->R + t * mx->N;
    switch (tensor) {
    case IN_X: return tok + mx->x_at + e;
    case IN_Z: return tok + mx->z_at + e / V * (V + Z_HEAD_GAP) + e % V;
    case IN_A: return tok + mx->gate_at + 2 * e;
    default: return tok + mx->gate_at + 2 * e + 1;
    }
}

static step_inputs draw_inputs(mix *mx, int32_t B, int32_t T)
{
    const int64_t C = mx->C, HV = mx->HV, V = mx->V, bt = (int64_t)B * T;
    step_inputs si = {malloc(sizeof(double) * (size_t)(bt * C)), malloc(sizeof(double) * (size_t)(bt * HV)),
                      malloc(sizeof(double) * (size_t)(bt * HV)), malloc(sizeof(double) * (size_t)(bt * HV * V))};
    double *const dst[4] = {si.x, si.z, si.a, si.b};
    const int64_t count[4] = {C, HV * V, HV, HV};
    const double scale[4] = {1.0, 1.0, 0.1, 0.1};
    for (int32_t i = 0; i < B; i++)
        for (int32_t t = 0; t < T; t++)
            for (int n = 0; n < 4; n++)
                for (int64_t e = 0; e < count[n]; e++) {
                    uint16_t *at = &mx->in[in_at(mx, n, i, t, T, e)];
                    *at = to_bf16(rnd(mx, scale[n]));
                    dst[n][((int64_t)i * T + t) * count[n] + e] = from_bf16(*at);
                }
    return si;
}

static void free_inputs(step_inputs *si) { free(si->x), free(si->a), free(si->b), free(si->z); }

static int row_of_slot(const int32_t *rows, int32_t B, int32_t s)
{
    for (int32_t i = 0; i < B; i++)
        if (rows[i] == s) return i;
    return -1;
}

/* Every byte of the pool and conv pool that the step may not change is as in the snapshots: all of a
 * slot no row reads, and the gaps between slots. */
static void assert_untouched(const mix *mx, const unsigned char *pool0, const uint16_t *conv0, const int32_t *rows,
                             int32_t B, const char *what)
{
    const int32_t *writes = mx->writes;
    const size_t ss = (size_t)mx->op.pool.slot_stride * pool_size(mx), used = (size_t)mx->state_elems * pool_size(mx);
    for (int32_t s = 0; s < NUM_SLOTS; s++) {
        int in_step = row_of_slot(rows, B, s) >= 0;
        for (int32_t i = 0; writes && i < B; i++) in_step |= rows[i] >= 0 && writes[i] == s;
        const size_t from = in_step ? used : 0;
        cr_assert_eq(memcmp(mx->pool + s * ss + from, pool0 + s * ss + from, ss - from), 0,
                     "step %d (%s): the state pool of slot %d changed (%s)", mx->step, what, s,
                     in_step ? "the gap after the slot's state" : "the slot is not in the step");
        if (!mx->conv) continue;
        const size_t cs = (size_t)mx->mixer.conv.slot_stride, cu = in_step ? (size_t)mx->conv_window_elems : 0;
        cr_assert_eq(memcmp(mx->conv + s * cs + cu, conv0 + s * cs + cu, (cs - cu) * 2), 0,
                     "step %d (%s): the conv pool of slot %d changed (%s)", mx->step, what, s,
                     in_step ? "the gap after the slot's window" : "the slot is not in the step");
    }
}

/*
 * One step of B rows (rows[i] < 0: padding) and T tokens: fresh random inputs, poisoned outputs, the op
 * (and, for a verify, its commit with accepted[]), the oracle, and the checks of outputs and of the
 * bytes the step may not touch.
 */
/* The path of `node` in `par` (a tree's parents), root first: its length (0 for node -1). */
static int32_t tree_path_of(const int32_t *par, int32_t node, int32_t *path)
{
    int32_t len = 0;
    for (int32_t t = node; t >= 0; t = par[t]) path[len++] = t;
    for (int32_t j = 0; j < len / 2; j++) {
        const int32_t keep = path[j];
        path[j] = path[len - 1 - j], path[len - 1 - j] = keep;
    }
    return len;
}

/* Runs tokens path[0..len) of the step's inputs on `slot`, token by token (the last one's output in
 * `out`). */
static void run_path(const mix *mx, gdn__mixer_ref_slot *slot, const int32_t *path, int32_t len, const double *x,
                     const double *a, const double *b, const double *z, double *out)
{
    const int64_t C = mx->C, HV = mx->HV, HVV = HV * mx->V;
    for (int32_t j = 0; j < len; j++)
        cr_assert_eq(gdn__ref_mixer_token(&mx->m, slot, x + (int64_t)path[j] * C, a + (int64_t)path[j] * HV,
                                          b + (int64_t)path[j] * HV, z ? z + (int64_t)path[j] * HVV : NULL, out),
                     GDN_OK);
}

/* Tree node t's output (out [HV V]): a copy of the row's slot runs the node's path, token by token. */
static void tree_node(const mix *mx, const gdn__mixer_ref_slot *start, const int32_t *par, int32_t t, const double *x,
                      const double *a, const double *b, const double *z, double *out)
{
    int32_t path[MAX_T];
    const int32_t len = tree_path_of(par, t, path);
    gdn__mixer_ref_slot copy;
    cr_assert_eq(gdn__ref_mixer_slot_init(&copy, &mx->m), GDN_OK);
    gdn__ref_mixer_slot_copy(&mx->m, &copy, start);
    run_path(mx, &copy, path, len, x, a, b, z, out);
    gdn__ref_mixer_slot_free(&copy);
}

/* Whether a ring verify writes the slot back before its own tokens: it forks, or its T tokens do not
 * fit the ring's capacity (max(L, max_tokens)) after the pending records. */
static int ring_writes_back_first(int fork, int32_t pending, int32_t T)
{
    return fork || pending + T > (RING_LENGTH > MAX_T ? RING_LENGTH : MAX_T);
}

/* The ring's write-back before a verify: the state `before` (unrounded) goes into slot w, and the
 * accepted tokens' records hold corrections u computed from it, so replayed over the stored (rounded)
 * state they give `run` (their unrounded run from `before`) plus the write-back's rounding error
 * decayed by their gates: added to run. The tokens: path[0..n), or 0..n-1 when path is NULL. */
static void add_ring_write_back_error(mix *mx, gdn__mixer_ref_slot *run, const gdn__mixer_ref_slot *before, int32_t w,
                                      const double *a, const double *b, const int32_t *path, int32_t n, const char *what)
{
    const int64_t HV = mx->HV, head = (int64_t)mx->V * mx->K;
    gdn__mixer_ref_slot stored;
    cr_assert_eq(gdn__ref_mixer_slot_init(&stored, &mx->m), GDN_OK);
    gdn__ref_mixer_slot_copy(&mx->m, &stored, before);
    store_into(mx, &stored, w, what);
    for (int64_t h = 0; h < HV; h++) {
        double decay = 1.0;
        for (int32_t j = 0; j < n; j++) {
            const int64_t t = path ? path[j] : j;
            double g;
            gdn__ref_gdn_gates(a[t * HV + h], b[t * HV + h], mx->dparams[h], mx->dparams[HV + h], &g, NULL);
            decay *= g;
        }
        for (int64_t e = h * head; e < (h + 1) * head; e++) run->S[e] += decay * (stored.S[e] - before->S[e]);
    }
    gdn__ref_mixer_slot_free(&stored);
}

static void mix_step(mix *mx, gdn_step_kind kind, int32_t T, int32_t B, const int32_t *rows, const int32_t *accepted)
{
    const int64_t HV = mx->HV, V = mx->V, C = mx->C, HVV = HV * V;
    gdn_op_layer *op = &mx->op;
    step_inputs si = draw_inputs(mx, B, T);
    memcpy(mx->rows, rows, sizeof(int32_t) * (size_t)B);
    if (mx->writes) memcpy(mx->write_slots, mx->writes, sizeof(int32_t) * (size_t)B);
    op->write_slots = mx->writes ? mx->write_slots : NULL;
    if (accepted) memcpy(mx->accepted, accepted, sizeof(int32_t) * (size_t)B);
    op->kind = kind, op->tokens = T, op->batch = B;
    const int32_t *counts = kind == GDN_STEP_VERIFY ? mx->counts : NULL;
    const int32_t *parents = kind == GDN_STEP_VERIFY ? mx->parents : NULL;
    op->token_counts = counts;
    op->parents = parents;
    unsigned char *pool0 = malloc(mx->pool_bytes);
    memcpy(pool0, mx->pool, mx->pool_bytes);
    uint16_t *conv0 = mx->conv ? malloc(mx->conv_elems * 2) : NULL;
    if (conv0) memcpy(conv0, mx->conv, mx->conv_elems * 2);
    memset(mx->out, 0xff, mx->out_elems * 4);

    const gdn_status st = gdn_op_layer_step(op, NULL);
    cr_assert_eq(st, GDN_OK, "step %d: %s of T = %d, %d rows: status %s", mx->step,
                 kind == GDN_STEP_DECODE ? "decode" : "verify", T, B, gdn_status_name(st));

    if (kind == GDN_STEP_VERIFY) {
        if (mx->cfg.strategy == GDN_VERIFY_CACHE) { /* the verify itself wrote neither pool */
            cr_assert_eq(memcmp(mx->pool, pool0, mx->pool_bytes), 0, "step %d: a cache verify wrote the state pool", mx->step);
            if (conv0)
                cr_assert_eq(memcmp(mx->conv, conv0, mx->conv_elems * 2), 0, "step %d: a cache verify wrote the conv pool", mx->step);
        } else {
            assert_untouched(mx, pool0, conv0, rows, B, "verify");
        }
        const gdn_status cs = parents ? gdn_op_commit_node(op, mx->accepted, NULL) : gdn_op_commit(op, mx->accepted, NULL);
        cr_assert_eq(cs, GDN_OK, "step %d: commit: status %s", mx->step, gdn_status_name(cs));
    }
    /* The oracle, row by row (after the commit: its stores are read from the pool). */
    double *ref_out = calloc((size_t)(B * T * HVV), sizeof(double)), *scratch = malloc(sizeof(double) * (size_t)(T * HVV));
    const gdn_verify_strategy strategy = mx->cfg.strategy;
    for (int32_t i = 0; i < B; i++) {
        const int32_t s = rows[i];
        if (s < 0) continue;
        const int64_t it = (int64_t)i * T;
        const double *x = si.x + it * C, *a = si.a + it * HV, *b = si.b + it * HV, *z = mx->m.use_norm ? si.z + it * HVV : NULL;
        double *out = ref_out + it * HVV;
        /* A row that writes another slot (a fork) works on a copy of its read slot and leaves that alone. */
        const int32_t w = mx->writes ? mx->writes[i] : s;
        const int fork = w != s;
        gdn__mixer_ref_slot forked = {0}, *cur = &mx->ref[s];
        if (fork) {
            cr_assert_eq(gdn__ref_mixer_slot_init(&forked, &mx->m), GDN_OK);
            gdn__ref_mixer_slot_copy(&mx->m, &forked, cur);
            cur = &forked;
        }
        int32_t pending = mx->pending[s];
        if (parents) { /* a tree: each node from the state after its parent */
            const int32_t Ti = counts ? counts[i] : T;
            const int32_t *par = parents + (int64_t)i * T;
            for (int32_t t = 0; t < Ti; t++) tree_node(mx, cur, par, t, x, a, b, z, out + (int64_t)t * HVV);
            int32_t path[MAX_T];
            const int32_t len = tree_path_of(par, accepted[i], path);
            /* The ring writes back first when the tree does not fit its ring (or the row forks), as a chain. */
            const int ring_store_first = strategy == GDN_VERIFY_RING && ring_writes_back_first(fork, pending, T);
            if (ring_store_first) {
                gdn__mixer_ref_slot run;
                cr_assert_eq(gdn__ref_mixer_slot_init(&run, &mx->m), GDN_OK);
                gdn__ref_mixer_slot_copy(&mx->m, &run, cur);
                run_path(mx, &run, path, len, x, a, b, z, scratch);
                add_ring_write_back_error(mx, &run, cur, w, a, b, path, len, "a ring write-back before a tree verify");
                gdn__ref_mixer_slot_copy(&mx->m, cur, &run);
                gdn__ref_mixer_slot_free(&run);
            } else {
                /* fold stores the folded state before its own tokens; the accepted path then runs from it */
                if (strategy == GDN_VERIFY_FOLD) store_into(mx, cur, w, "the write-back before a tree verify");
                run_path(mx, cur, path, len, x, a, b, z, scratch);
            }
            if (strategy == GDN_VERIFY_CACHE) store_into(mx, cur, w, "a tree commit"), pending = 0;
            else pending = (strategy == GDN_VERIFY_RING && !ring_store_first ? pending : 0) + len;
        } else if (kind == GDN_STEP_DECODE) {
            cr_assert_eq(gdn__ref_mixer_run(&mx->m, cur, 1, x, a, b, z, out), GDN_OK);
            /* The op's default ring_write_through: steps of at most GDN_RING_WRITE_THROUGH_HEADS_F32 /
             * _BF16 row-heads write every row back, with the conv every step (gdn.h). */
            const int32_t through_heads = mx->cfg.pool_dtype == GDN_DTYPE_BF16 ? GDN_RING_WRITE_THROUGH_HEADS_BF16
                                                                                : GDN_RING_WRITE_THROUGH_HEADS_F32;
            const int through = mx->cfg.write_through && (!mx->cfg.no_conv || B <= through_heads / HV);
            if (strategy == GDN_VERIFY_RING && !fork && !through && pending + 1 < RING_LENGTH) { /* a record */
                const size_t at = (size_t)(slot_state(mx, w) - mx->pool);
                cr_assert_eq(memcmp(mx->pool + at, pool0 + at, (size_t)mx->state_elems * pool_size(mx)), 0,
                             "step %d: a ring decode of %d rows that appends a record wrote slot %d's state", mx->step, B, w);
                pending++;
            } else store_into(mx, cur, w, "decode"), pending = 0; /* cache and fold store; a full ring, a fork or a write-through writes back */
        } else {
            /* A verify, then its commit. Fold: the step folds the slot's pending tokens and stores that
             * state before its own tokens; ring: so does a verify that does not fit the ring, or forks.
             * The outputs come from the state before that store (the kernel keeps it unrounded); the
             * accepted tokens then run from the stored state. Cache: the commit stores the state after
             * the accepted tokens. */
            /* With counts the row runs its first Ti tokens (the rest are padding), and accepts at most Ti. */
            const int32_t Ti = counts ? counts[i] : T;
            const int32_t n = accepted[i] < 0 ? 0 : (accepted[i] > Ti ? Ti : accepted[i]);
            const int store_first =
                strategy == GDN_VERIFY_FOLD || (strategy == GDN_VERIFY_RING && ring_writes_back_first(fork, pending, T));
            gdn__mixer_ref_slot copy;
            cr_assert_eq(gdn__ref_mixer_slot_init(&copy, &mx->m), GDN_OK);
            gdn__ref_mixer_slot_copy(&mx->m, &copy, cur);
            if (strategy == GDN_VERIFY_RING && store_first) {
                /* The ring keeps each token's correction u as computed from the unrounded state: replayed
                 * over the stored (rounded) state, the accepted tokens give the unrounded run plus the
                 * store's rounding error decayed by their gates. */
                if (mx->fresh_oracle) {
                    cr_assert_eq(gdn__ref_mixer_run(&mx->m, &copy, Ti, x, a, b, z, out), GDN_OK);
                    gdn__ref_mixer_slot_copy(&mx->m, &copy, cur);
                    if (n > 0) cr_assert_eq(gdn__ref_mixer_run(&mx->m, &copy, n, x, a, b, z, scratch), GDN_OK);
                } else {
                    cr_assert_eq(gdn__ref_mixer_verify_commit(&mx->m, &copy, Ti, x, a, b, z, n, out), GDN_OK);
                }
                add_ring_write_back_error(mx, &copy, cur, w, a, b, NULL, n, "a ring write-back before a verify");
                gdn__ref_mixer_slot_copy(&mx->m, cur, &copy);
            } else if (mx->fresh_oracle) { /* outputs from a copy; the slot runs exactly the accepted tokens */
                cr_assert_eq(gdn__ref_mixer_run(&mx->m, &copy, Ti, x, a, b, z, out), GDN_OK);
                if (store_first) store_into(mx, cur, w, "the write-back before a verify");
                if (n > 0) cr_assert_eq(gdn__ref_mixer_run(&mx->m, cur, n, x, a, b, z, scratch), GDN_OK);
            } else {
                cr_assert_eq(gdn__ref_mixer_verify_commit(&mx->m, &copy, Ti, x, a, b, z, n, out), GDN_OK);
                if (!store_first) gdn__ref_mixer_slot_copy(&mx->m, cur, &copy);
                else if (store_into(mx, cur, w, "the write-back before a verify"), n > 0) cr_assert_eq(gdn__ref_mixer_run(&mx->m, cur, n, x, a, b, z, scratch), GDN_OK);
            }
            gdn__ref_mixer_slot_free(&copy);
            if (strategy == GDN_VERIFY_CACHE) store_into(mx, cur, w, "commit"), pending = 0;
            else pending = (strategy == GDN_VERIFY_RING && !store_first ? pending : 0) + n;
        }
        if (fork) { /* the write slot gets the row's state; the read slot keeps its own, pending work included */
            gdn__ref_mixer_slot_copy(&mx->m, &mx->ref[w], &forked);
            gdn__ref_mixer_slot_free(&forked);
        }
        mx->pending[w] = pending;
    }

    /* Outputs: within SPEC 4 (y with o's tolerances), padding rows exactly 0, nothing else written. */
    double worst = 0.0;
    for (int32_t i = 0; i < MAX_ROWS; i++)
        for (int32_t t = 0; t < MAX_T; t++)
            for (int64_t h = 0; h < HV; h++)
                for (int64_t d = 0; d < mx->out_head; d++) {
                    const int64_t at = i * mx->out_row + t * mx->out_token + h * mx->out_head + d;
                    const float got = mx->out[at];
                    uint32_t bits;
                    memcpy(&bits, &got, 4);
                    if (i >= B || t >= T || d >= V) {
                        cr_assert_eq(bits, OUT_POISON, "step %d: output element (row %d, token %d, head %d, %d) "
                                     "outside the step's outputs was written", mx->step, i, t, (int)h, (int)d);
                    } else if (rows[i] < 0) {
                        cr_assert(got == 0.0f, "step %d: padding row %d, token %d, head %d, %d: output %g, not 0",
                                  mx->step, i, t, (int)h, (int)d, got);
                    } else if (counts && t >= counts[i]) {
                        cr_assert(got == 0.0f, "step %d: row %d token %d past its count %d, head %d, %d: output %g, not 0",
                                  mx->step, i, t, counts[i], (int)h, (int)d, got);
                    } else {
                        const double ref = ref_out[((int64_t)i * T + t) * HVV + h * V + d];
                        const double ratio = fabs((double)got - ref) / (mx->tol.out_abs + mx->tol.out_rel * fabs(ref));
                        cr_assert(ratio <= 1.0, "step %d (%s, T = %d): row %d (slot %d, accepted %d), token %d, head %d, %d: "
                                  "output %.6g, float64 %.6g (%.3g of the tolerance)", mx->step,
                                  kind == GDN_STEP_DECODE ? "decode" : "verify", T, i, rows[i],
                                  accepted ? accepted[i] : 1, t, (int)h, (int)d, got, ref, ratio);
                        if (ratio > worst) worst = ratio;
                    }
                }
    if (worst > mx->worst_out) mx->worst_out = worst;

    assert_untouched(mx, pool0, conv0, rows, B, kind == GDN_STEP_DECODE ? "decode" : "verify and commit");
    /* a live row's accepted count outside 0..T is clamped and raises the flag (and only that) */
    int32_t clamped = 0;
    for (int32_t i = 0; accepted && !parents && i < B; i++)
        clamped |= rows[i] >= 0 && (accepted[i] < 0 || accepted[i] > (counts ? counts[i] : T));
    cr_assert_eq(mx->error_flag, clamped, "step %d: the error flag is %d, expected %d", mx->step, mx->error_flag, clamped);
    mx->error_flag = 0;
    free(ref_out), free(scratch), free(pool0), free(conv0);
    free_inputs(&si);
    mx->step++;
}

/* Slot s's window in the conv pool against the oracle's, bit for bit; `after` names what updated it. */
static void assert_window(const mix *mx, int32_t s, const char *when, const char *after)
{
    for (int32_t j = 0; j < mx->W - 1; j++)
        for (int64_t c = 0; c < mx->C; c++) {
            const uint16_t got = mx->conv[conv_at(mx, s, j, c)], want = to_bf16(mx->ref[s].window[j * mx->C + c]);
            cr_assert_eq(got, want, "%s (after step %d), read after %s: slot %d, window row %d, channel %lld: "
                         "bf16 0x%04x (%g), oracle 0x%04x (%g)", when, mx->step, after, s, j, (long long)c, got,
                         from_bf16(got), want, mx->ref[s].window[j * mx->C + c]);
        }
}

/*
 * Every slot's state and window against the oracle: even slots flushed, then their window read from
 * the conv pool, then their state exported; odd slots exported (which brings the window up to date
 * too), window read, then flushed (which then changes nothing) and the window read again. Either way,
 * after both the pool holds exactly what export returned (nothing is pending any more).
 */
static void mix_check_states(mix *mx, const char *when)
{
    const size_t sbytes = (size_t)mx->state_elems * pool_size(mx);
    unsigned char *exported = malloc(sbytes);
    double worst = 0.0;
    for (int32_t s = 0; s < NUM_SLOTS; s++) {
        const int32_t list[1] = {s};
        gdn_status st;
        memset(exported, 0xff, sbytes);
        if (s % 2 == 0) {
            st = gdn_op_flush(&mx->op, list, 1, NULL);
            cr_assert_eq(st, GDN_OK, "%s: flush of slot %d: %s", when, s, gdn_status_name(st));
            assert_window(mx, s, when, "flush");
        }
        st = gdn_op_slot_export(&mx->op, s, exported, NULL);
        cr_assert_eq(st, GDN_OK, "%s: export of slot %d: %s", when, s, gdn_status_name(st));
        if (s % 2 == 1) {
            assert_window(mx, s, when, "export");
            st = gdn_op_flush(&mx->op, list, 1, NULL);
            cr_assert_eq(st, GDN_OK, "%s: flush of slot %d: %s", when, s, gdn_status_name(st));
            assert_window(mx, s, when, "export and flush");
        }
        cr_assert_eq(memcmp(exported, slot_state(mx, s), sbytes), 0,
                     "%s: slot %d: the pool after flush and export differs from what export returned", when, s);
        if (mx->cfg.strategy != GDN_VERIFY_CACHE) { /* the write-back of pending work */
            store_into(mx, &mx->ref[s], s, when);
            mx->pending[s] = 0;
        }
        for (int64_t e = 0; e < mx->state_elems; e++) {
            const double got = pool_get(mx, exported, e), ref = mx->ref[s].S[e];
            const double ratio = fabs(got - ref) / (mx->tol.state_abs + mx->tol.state_rel * fabs(ref));
            cr_assert(ratio <= 1.0, "%s (after step %d): slot %d, state element %lld (head %lld, row %lld, col %lld): "
                      "%.6g, float64 %.6g (%.3g of the tolerance)", when, mx->step, s, (long long)e,
                      (long long)(e / (mx->V * mx->K)), (long long)(e / mx->K % mx->V), (long long)(e % mx->K), got, ref, ratio);
            if (ratio > worst) worst = ratio;
        }
    }
    if (worst > mx->worst_state) mx->worst_state = worst;
    cr_assert_eq(mx->error_flag, 0, "%s: the error flag was raised", when);
    free(exported);
}

/* ---------------------------------------------------------------------------------------------- */
/* Scenarios                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/*
 * A random sequence over slots 0..SEQ_SLOTS-1 (the others never take part: they must stay bit-exact
 * to the end): decodes, verifies of T = 2..4 with commits whose accepted counts cycle through 0..T,
 * padding rows; states and windows checked every few steps and at the end.
 */
static void run_sequence(const mix_cfg *cfg)
{
    mix *mx = mix_create(cfg);
    unsigned char *pool_start = malloc(mx->pool_bytes);
    memcpy(pool_start, mx->pool, mx->pool_bytes);
    static const char kinds[] = "DDVVDVDDVVVDVDDV"; /* decodes after verifies, verifies back to back */
    const int steps = (int)sizeof kinds - 1;
    int32_t cursor = 0, seen_accepted[MAX_T + 1] = {0}, padding_rows = 0;
    for (int step = 0; step < steps; step++) {
        const gdn_step_kind kind = kinds[step] == 'V' ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
        const int32_t T = kind == GDN_STEP_VERIFY ? 2 + step % 3 : 1;
        const int32_t B = 1 + (int32_t)(gdn__rng_next(&mx->rng) % 4);
        int32_t perm[SEQ_SLOTS], rows[MAX_ROWS], accepted[MAX_ROWS], counts[MAX_ROWS], parents[MAX_ROWS * MAX_T];
        for (int s = 0; s < SEQ_SLOTS; s++) perm[s] = s;
        for (int s = SEQ_SLOTS - 1; s > 0; s--) {
            const int r = (int)(gdn__rng_next(&mx->rng) % (uint64_t)(s + 1)), tmp = perm[s];
            perm[s] = perm[r], perm[r] = tmp;
        }
        for (int32_t i = 0; i < B; i++) {
            const int pad = (step % 3 == 1 && i == B / 2) || gdn__rng_next(&mx->rng) % 5 == 0;
            rows[i] = pad ? -1 : perm[i];
            padding_rows += pad;
            /* with counts: n = 1 (a decode row in the verify), T, or between */
            counts[i] = i == 0 ? 1 : i == 1 ? T : 1 + (int32_t)(gdn__rng_next(&mx->rng) % (uint64_t)T);
            const int32_t n = cfg->counts ? counts[i] : T;
            accepted[i] = cursor % (n + 1);
            /* trees: random recursive trees of n nodes, the accepted node from -1..n-1 */
            for (int32_t t = 0; cfg->trees && t < T; t++)
                parents[i * T + t] = t == 0 ? -1 : (int32_t)(gdn__rng_next(&mx->rng) % (uint64_t)(t + 1)) - 1;
            if (cfg->trees) accepted[i] = cursor % (n + 1) - 1;
            if (kind == GDN_STEP_VERIFY && !pad) seen_accepted[accepted[i] + (cfg->trees ? 1 : 0)]++, cursor++;
        }
        mx->counts = cfg->counts ? counts : NULL;
        mx->parents = cfg->trees ? parents : NULL;
        mix_step(mx, kind, T, B, rows, kind == GDN_STEP_VERIFY ? accepted : NULL);
        if (step % 5 == 4) {
            char when[32];
            snprintf(when, sizeof when, "after step %d", step);
            mix_check_states(mx, when);
        }
    }
    mix_check_states(mx, "at the end");
    for (int n = 0; n <= (cfg->trees ? 1 : 2); n++) /* trees: node n - 1 */
        cr_assert_gt(seen_accepted[n], 0, "the sequence never accepted %s %d", cfg->trees ? "node" : "count", cfg->trees ? n - 1 : n);
    cr_assert_gt(padding_rows, 0);
    /* Slots that never took part: bit-exact, after every flush and export above too. */
    const size_t ss = (size_t)mx->op.pool.slot_stride * pool_size(mx);
    cr_assert_eq(memcmp(mx->pool + SEQ_SLOTS * ss, pool_start + SEQ_SLOTS * ss, (NUM_SLOTS - SEQ_SLOTS) * ss), 0,
                 "slots that never took part changed");
    cr_log_info("seed %llu: worst output %.3g, worst state %.3g of SPEC 4's tolerance", (unsigned long long)cfg->seed,
                mx->worst_out, mx->worst_state);
    free(pool_start);
    mix_free(mx);
}

/*
 * A verify of T tokens where row i accepts i (0..T; two more rows give -2 and T + 3, clamped), then a
 * decode of the same rows; the oracle runs exactly the accepted tokens (no verify_commit), then the
 * decode token. Three rounds, T = 2, 4, 3; states and windows after each.
 */
static void run_accepted_counts(const mix_cfg *cfg)
{
    mix *mx = mix_create(cfg);
    mx->fresh_oracle = 1;
    static const int32_t Ts[] = {2, 4, 3};
    for (int r = 0; r < 3; r++) {
        const int32_t T = Ts[r], B = T + 3;
        int32_t rows[MAX_ROWS], accepted[MAX_ROWS];
        for (int32_t i = 0; i < B; i++) rows[i] = (i + 3 * r) % NUM_SLOTS, accepted[i] = i;
        accepted[T + 1] = -2, accepted[T + 2] = T + 3;
        mix_step(mx, GDN_STEP_VERIFY, T, B, rows, accepted);
        mix_step(mx, GDN_STEP_DECODE, 1, B, rows, NULL);
        char when[48];
        snprintf(when, sizeof when, "after the verify of T = %d and a decode", T);
        mix_check_states(mx, when);
    }
    mix_free(mx);
}

/*
 * Slot operations cover the window too (gdn_op.h): with work pending, slot 7 becomes a copy of slot 2
 * (pending work included) and slot 3 is reset (window and state zero); then both go on through a
 * decode and a verify, and every slot is checked.
 */
static void run_slot_ops(const mix_cfg *cfg)
{
    mix *mx = mix_create(cfg);
    const int32_t rows[3] = {0, 1, 2}, acc1[3] = {1, 2, 0}, acc2[3] = {2, 3, 1};
    mix_step(mx, GDN_STEP_VERIFY, 2, 3, rows, acc1);
    mix_step(mx, GDN_STEP_DECODE, 1, 2, rows, NULL);
    mix_step(mx, GDN_STEP_VERIFY, 3, 3, rows, acc2);
    gdn_status st = gdn_op_slot_copy(&mx->op, 7, 2, NULL);
    cr_assert_eq(st, GDN_OK, "slot_copy: %s", gdn_status_name(st));
    gdn__ref_mixer_slot_copy(&mx->m, &mx->ref[7], &mx->ref[2]);
    mx->pending[7] = mx->pending[2];
    st = gdn_op_slot_reset(&mx->op, 3, NULL);
    cr_assert_eq(st, GDN_OK, "slot_reset: %s", gdn_status_name(st));
    memset(mx->ref[3].S, 0, sizeof(double) * (size_t)mx->state_elems);
    if (mx->ref[3].window) memset(mx->ref[3].window, 0, sizeof(double) * (size_t)mx->conv_window_elems);
    mx->pending[3] = 0;
    const int32_t next[3] = {7, 2, 3}, acc3[3] = {2, 1, 2};
    mix_step(mx, GDN_STEP_DECODE, 1, 3, next, NULL);
    mix_step(mx, GDN_STEP_VERIFY, 2, 3, next, acc3);
    mix_check_states(mx, "after slot_copy and slot_reset");
    mix_free(mx);
}

Test(op_mixer, slot_copy_and_reset_cover_the_window_cache) { const mix_cfg c = {.strategy = GDN_VERIFY_CACHE, .seed = 401}; run_slot_ops(&c); }
Test(op_mixer, slot_copy_and_reset_cover_the_window_fold) { const mix_cfg c = {.strategy = GDN_VERIFY_FOLD, .seed = 402}; run_slot_ops(&c); }
Test(op_mixer, slot_copy_and_reset_cover_the_window_ring) { const mix_cfg c = {.strategy = GDN_VERIFY_RING, .seed = 403, .vllm_layout = 1}; run_slot_ops(&c); }

/*
 * Forks (write_slots): a row that reads slot r and writes slot w leaves r as it was (pending work
 * included) and puts the row's state and window into w: decodes forking 1 -> 6 and 3 -> 7 while 0 and 2
 * write in place, then a verify forking 6 -> 8 and 1 -> 9 (accepted >= 1: with 0 the strategies
 * differ, gdn.h), then decodes of every slot involved.
 */
static void run_forks(const mix_cfg *cfg)
{
    mix *mx = mix_create(cfg);
    const int32_t r1[4] = {0, 1, 2, 3}, a1[4] = {1, 2, 0, 3};
    mix_step(mx, GDN_STEP_VERIFY, 3, 4, r1, a1); /* pending work in slots 0..3 */
    const int32_t w2[4] = {0, 6, 2, 7};
    mx->writes = w2;
    mix_step(mx, GDN_STEP_DECODE, 1, 4, r1, NULL);
    const int32_t r3[5] = {6, 7, -1, 1, 3}, w3[5] = {8, 7, 5, 9, 3}, a3[5] = {2, 1, 0, 3, 1};
    mx->writes = w3;
    mix_step(mx, GDN_STEP_VERIFY, 3, 5, r3, a3);
    mx->writes = NULL;
    mix_check_states(mx, "after the forks");
    const int32_t r4[6] = {6, 7, 8, 9, 1, 3};
    mix_step(mx, GDN_STEP_DECODE, 1, 6, r4, NULL);
    mix_check_states(mx, "after decodes of the forked slots");
    mix_free(mx);
}

Test(op_mixer, forks_cache) { const mix_cfg c = {.strategy = GDN_VERIFY_CACHE, .seed = 501}; run_forks(&c); }
Test(op_mixer, forks_fold) { const mix_cfg c = {.strategy = GDN_VERIFY_FOLD, .seed = 502, .vllm_layout = 1}; run_forks(&c); }
Test(op_mixer, forks_ring) { const mix_cfg c = {.strategy = GDN_VERIFY_RING, .seed = 503}; run_forks(&c); }
Test(op_mixer, forks_ring_bf16_pool) { const mix_cfg c = {.strategy = GDN_VERIFY_RING, .seed = 504, .pool_dtype = GDN_DTYPE_BF16}; run_forks(&c); }

/* Defaults: F32 pool and conv weights, W = 4, bias, norm, dense conv pool. */
#define TINY(strategy_, seed_) .strategy = (strategy_), .seed = (seed_)
#define SMALL(strategy_, seed_) .HK = 1, .HV = 2, .K = 64, .V = 64, TINY(strategy_, seed_)

#define SEQUENCE_TEST(name, ...) \
    Test(op_mixer, name) { const mix_cfg cfg = {__VA_ARGS__}; run_sequence(&cfg); }

/* The tiny preset, conv pool dense [W-1][conv_dim] and vLLM's [conv_dim][W-1]. */
SEQUENCE_TEST(tiny_dense_cache, TINY(GDN_VERIFY_CACHE, 101))
SEQUENCE_TEST(tiny_dense_fold, TINY(GDN_VERIFY_FOLD, 102))
SEQUENCE_TEST(tiny_dense_ring, TINY(GDN_VERIFY_RING, 103))
SEQUENCE_TEST(tiny_vllm_cache, TINY(GDN_VERIFY_CACHE, 111), .vllm_layout = 1)
SEQUENCE_TEST(tiny_vllm_fold, TINY(GDN_VERIFY_FOLD, 112), .vllm_layout = 1)
SEQUENCE_TEST(tiny_vllm_ring, TINY(GDN_VERIFY_RING, 113), .vllm_layout = 1)
/* HK 1, HV 2, K = V = 64: the smallest legal shape. */
SEQUENCE_TEST(small_dense_cache, SMALL(GDN_VERIFY_CACHE, 121))
SEQUENCE_TEST(small_dense_fold, SMALL(GDN_VERIFY_FOLD, 122))
SEQUENCE_TEST(small_dense_ring, SMALL(GDN_VERIFY_RING, 123))
SEQUENCE_TEST(small_vllm_cache, SMALL(GDN_VERIFY_CACHE, 131), .vllm_layout = 1)
SEQUENCE_TEST(small_vllm_fold, SMALL(GDN_VERIFY_FOLD, 132), .vllm_layout = 1)
SEQUENCE_TEST(small_vllm_ring, SMALL(GDN_VERIFY_RING, 133), .vllm_layout = 1)
/* Conv widths 2 and 3, no bias, BF16 conv weights (the oracle has the weights rounded too). */
SEQUENCE_TEST(width_2_ring, TINY(GDN_VERIFY_RING, 141), .W = 2, .vllm_layout = 1)
SEQUENCE_TEST(width_3_fold, TINY(GDN_VERIFY_FOLD, 142), .W = 3)
SEQUENCE_TEST(no_bias_cache, SMALL(GDN_VERIFY_CACHE, 143), .no_bias = 1)
SEQUENCE_TEST(bf16_weights_fold, TINY(GDN_VERIFY_FOLD, 144), .weight_dtype = GDN_DTYPE_BF16, .vllm_layout = 1)
/* BF16 pool: the pool rounds once per store; SPEC 4's bf16 tolerances. */
SEQUENCE_TEST(bf16_pool_cache, TINY(GDN_VERIFY_CACHE, 151), .pool_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(bf16_pool_fold, TINY(GDN_VERIFY_FOLD, 152), .pool_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(bf16_pool_ring, TINY(GDN_VERIFY_RING, 153), .pool_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(write_through_ring, TINY(GDN_VERIFY_RING, 154), .write_through = 1, .vllm_layout = 1)
SEQUENCE_TEST(write_through_bf16_pool_ring, TINY(GDN_VERIFY_RING, 155), .write_through = 1, .pool_dtype = GDN_DTYPE_BF16)
/* 64 value heads: the plain default would cover 2 rows, the conv's covers every step, and without the
 * conv the 3-4-row decodes append records. */
SEQUENCE_TEST(write_through_conv_default_ring, .HK = 16, .HV = 64, .K = 64, .V = 64, TINY(GDN_VERIFY_RING, 156),
              .write_through = 1)
SEQUENCE_TEST(write_through_conv_default_bf16_pool_ring, .HK = 16, .HV = 64, .K = 64, .V = 64, TINY(GDN_VERIFY_RING, 157),
              .write_through = 1, .pool_dtype = GDN_DTYPE_BF16)
SEQUENCE_TEST(write_through_default_conv_off_ring, .HK = 16, .HV = 64, .K = 64, .V = 64, TINY(GDN_VERIFY_RING, 158),
              .write_through = 1, .no_conv = 1)
/* Conv off (x is q | k | v, given as q, k, v; norm on) and norm off (conv on; the output is o). */
SEQUENCE_TEST(conv_off_cache, TINY(GDN_VERIFY_CACHE, 161), .no_conv = 1)
SEQUENCE_TEST(conv_off_fold, TINY(GDN_VERIFY_FOLD, 162), .no_conv = 1)
SEQUENCE_TEST(conv_off_ring, TINY(GDN_VERIFY_RING, 163), .no_conv = 1)
/* Dense views (all strides 0: [B, T, ...] of the step's T) instead of slices of a fused tensor. */
SEQUENCE_TEST(dense_views_cache, TINY(GDN_VERIFY_CACHE, 181), .dense_views = 1)
SEQUENCE_TEST(dense_views_fold, SMALL(GDN_VERIFY_FOLD, 182), .dense_views = 1, .vllm_layout = 1)
SEQUENCE_TEST(dense_views_conv_off_ring, TINY(GDN_VERIFY_RING, 183), .dense_views = 1, .no_conv = 1)
SEQUENCE_TEST(norm_off_cache, TINY(GDN_VERIFY_CACHE, 171), .no_norm = 1)
SEQUENCE_TEST(norm_off_fold, TINY(GDN_VERIFY_FOLD, 172), .no_norm = 1)
SEQUENCE_TEST(norm_off_ring, TINY(GDN_VERIFY_RING, 173), .no_norm = 1, .vllm_layout = 1)
/* Per-row token counts (SPEC 3) in the verify steps: positions past a row's count output exactly 0,
 * the window and state advance by the accepted tokens of the row's first n. */
SEQUENCE_TEST(token_counts_cache, TINY(GDN_VERIFY_CACHE, 191), .counts = 1)
SEQUENCE_TEST(token_counts_fold, TINY(GDN_VERIFY_FOLD, 192), .counts = 1, .vllm_layout = 1)
SEQUENCE_TEST(token_counts_ring, TINY(GDN_VERIFY_RING, 193), .counts = 1)
SEQUENCE_TEST(token_counts_fold_bf16_pool_width_3, TINY(GDN_VERIFY_FOLD, 194), .counts = 1, .pool_dtype = GDN_DTYPE_BF16, .W = 3)
/* Token trees (SPEC 3) with counts: every node's conv reads its own path's inputs; the commit by
 * accepted node advances the window and the state along that path only. */
SEQUENCE_TEST(token_trees_cache, TINY(GDN_VERIFY_CACHE, 195), .counts = 1, .trees = 1)
SEQUENCE_TEST(token_trees_fold, TINY(GDN_VERIFY_FOLD, 196), .counts = 1, .trees = 1, .vllm_layout = 1)
SEQUENCE_TEST(token_trees_cache_bf16_pool_width_2, SMALL(GDN_VERIFY_CACHE, 197), .trees = 1, .pool_dtype = GDN_DTYPE_BF16, .W = 2)
SEQUENCE_TEST(token_trees_fold_bf16_pool_no_norm, TINY(GDN_VERIFY_FOLD, 198), .trees = 1, .pool_dtype = GDN_DTYPE_BF16, .no_norm = 1)
/* The ring: the accepted path's records (raw x with them) move to the ring's front at the commit */
SEQUENCE_TEST(token_trees_ring, TINY(GDN_VERIFY_RING, 199), .counts = 1, .trees = 1)
SEQUENCE_TEST(token_trees_ring_bf16_pool_vllm_width_3, SMALL(GDN_VERIFY_RING, 200), .trees = 1, .pool_dtype = GDN_DTYPE_BF16,
              .vllm_layout = 1, .W = 3)
SEQUENCE_TEST(token_trees_ring_write_through, TINY(GDN_VERIFY_RING, 205), .trees = 1, .write_through = 1)

Test(op_mixer, every_accepted_count_cache) { const mix_cfg c = {TINY(GDN_VERIFY_CACHE, 201)}; run_accepted_counts(&c); }
Test(op_mixer, every_accepted_count_fold) { const mix_cfg c = {TINY(GDN_VERIFY_FOLD, 202)}; run_accepted_counts(&c); }
Test(op_mixer, every_accepted_count_ring) { const mix_cfg c = {TINY(GDN_VERIFY_RING, 203), .vllm_layout = 1}; run_accepted_counts(&c); }
Test(op_mixer, every_accepted_count_ring_width_2) { const mix_cfg c = {SMALL(GDN_VERIFY_RING, 204), .W = 2}; run_accepted_counts(&c); }

/* ---------------------------------------------------------------------------------------------- */
/* Refusals                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

typedef void (*mix_mutation)(gdn_op_layer *op, gdn_mixer *mixer);
#define MIX_MUTATION(name, body) static void name(gdn_op_layer *op, gdn_mixer *mixer) { (void)op, (void)mixer; body; }
MIX_MUTATION(width_1, mixer->conv_width = 1)
MIX_MUTATION(width_5, mixer->conv_width = 5)
MIX_MUTATION(width_negative, mixer->conv_width = -4)
MIX_MUTATION(null_conv_weight, mixer->conv_weight = NULL)
MIX_MUTATION(null_x, op->x.data = NULL)
MIX_MUTATION(null_z, op->z.data = NULL)
MIX_MUTATION(null_conv_pool, mixer->conv.data = NULL)
MIX_MUTATION(f16_weights, mixer->conv_weight_dtype = GDN_DTYPE_F16)
MIX_MUTATION(small_dense_conv_stride, mixer->conv.slot_stride = 3 * (2 * 2 * 64 + 4 * 64) - 1)
MIX_MUTATION(gappy_window, (mixer->conv.token_stride = 1, mixer->conv.channel_stride = 4)) /* W = 4: a gap per channel */

Test(op_mixer, refused_mixers_change_nothing)
{
    const mix_cfg cfg = {TINY(GDN_VERIFY_FOLD, 301)};
    mix *mx = mix_create(&cfg);
    /* Pending work in the workspace first: two verifies with commits, a decode. */
    const int32_t rows[3] = {0, 1, 2}, accepted[3] = {1, 2, 0};
    mix_step(mx, GDN_STEP_VERIFY, 2, 3, rows, accepted);
    mix_step(mx, GDN_STEP_VERIFY, 3, 3, rows, accepted);
    mix_step(mx, GDN_STEP_DECODE, 1, 3, rows, NULL);
    memcpy(mx->rows, rows, sizeof rows);
    memcpy(mx->accepted, accepted, sizeof accepted);
    const struct {
        mix_mutation change;
        gdn_status expected; /* GDN_OK here: any error code */
        int commit_too;      /* a commit of such a description has nothing it could do either */
        const char *what;
    } cases[] = {
        {width_1, GDN_EINVAL, 1, "conv_width 1"},
        {width_5, GDN_EINVAL, 1, "conv_width 5"},
        {null_conv_weight, GDN_EINVAL, 0, "conv on, conv_weight NULL"},
        {null_x, GDN_EINVAL, 0, "conv on, x NULL"},
        {null_z, GDN_EINVAL, 0, "norm on, z NULL"},
        {null_conv_pool, GDN_EINVAL, 1, "conv on, conv pool data NULL"},
        {width_negative, GDN_OK, 1, "conv_width -4"},
        {f16_weights, GDN_OK, 0, "F16 conv weights"},
        {small_dense_conv_stride, GDN_OK, 1, "dense conv pool with slot_stride < (W-1) conv_dim"},
        {gappy_window, GDN_EINVAL, 1, "a window that is not one contiguous block (channel_stride W)"},
    };
    unsigned char *pool0 = malloc(mx->pool_bytes), *ws0 = malloc(mx->ws_bytes);
    uint16_t *conv0 = malloc(mx->conv_elems * 2);
    float *out0 = malloc(mx->out_elems * 4);
    memset(mx->out, 0xff, mx->out_elems * 4);
    memcpy(pool0, mx->pool, mx->pool_bytes), memcpy(ws0, mx->workspace, mx->ws_bytes);
    memcpy(conv0, mx->conv, mx->conv_elems * 2), memcpy(out0, mx->out, mx->out_elems * 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int verify = 0; verify < 2; verify++) {
            gdn_op_layer op = mx->op;
            gdn_mixer mixer = mx->mixer;
            op.mixer = &mixer;
            op.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, op.tokens = verify ? 3 : 1, op.batch = 3;
            cases[c].change(&op, &mixer);
            const gdn_status st = gdn_op_layer_step(&op, NULL);
            if (cases[c].expected != GDN_OK)
                cr_assert_eq(st, cases[c].expected, "%s, %s: status %s", verify ? "verify" : "decode", cases[c].what,
                             gdn_status_name(st));
            else
                cr_assert_lt(st, 0, "%s, %s: accepted", verify ? "verify" : "decode", cases[c].what);
            if (verify && cases[c].commit_too) {
                const gdn_status cs = gdn_op_commit(&op, mx->accepted, NULL);
                cr_assert_lt(cs, 0, "commit, %s: status %s", cases[c].what, gdn_status_name(cs));
            }
            cr_assert_eq(memcmp(mx->pool, pool0, mx->pool_bytes), 0, "%s: the refused op changed the pool", cases[c].what);
            cr_assert_eq(memcmp(mx->conv, conv0, mx->conv_elems * 2), 0, "%s: the refused op changed the conv pool",
                         cases[c].what);
            cr_assert_eq(memcmp(mx->workspace, ws0, mx->ws_bytes), 0, "%s: the refused op changed the workspace",
                         cases[c].what);
            cr_assert_eq(memcmp(mx->out, out0, mx->out_elems * 4), 0, "%s: the refused op wrote outputs", cases[c].what);
        }
#ifndef GDN_HAVE_CUDA
    gdn_op_layer cuda = mx->op;
    cuda.backend = GDN_BACKEND_CUDA;
    cuda.kind = GDN_STEP_VERIFY, cuda.tokens = 2, cuda.batch = 3;
    cr_assert_eq(gdn_op_layer_step(&cuda, NULL), GDN_ENODEV, "a CUDA mixer op in a build without CUDA");
    cr_assert_eq(gdn_op_commit(&cuda, mx->accepted, NULL), GDN_ENODEV, "a CUDA mixer commit in a build without CUDA");
    cuda.kind = GDN_STEP_DECODE, cuda.tokens = 1;
    cr_assert_eq(gdn_op_layer_step(&cuda, NULL), GDN_ENODEV, "a CUDA mixer decode in a build without CUDA");
    cr_assert_eq(memcmp(mx->pool, pool0, mx->pool_bytes), 0, "the CUDA op changed the pool");
    cr_assert_eq(memcmp(mx->conv, conv0, mx->conv_elems * 2), 0, "the CUDA op changed the conv pool");
    cr_assert_eq(memcmp(mx->workspace, ws0, mx->ws_bytes), 0, "the CUDA op changed the workspace");
#endif
    /* The unmutated description runs, and still matches the oracle. */
    mix_step(mx, GDN_STEP_VERIFY, 2, 3, rows, accepted);
    mix_step(mx, GDN_STEP_DECODE, 1, 3, rows, NULL);
    mix_check_states(mx, "after the refusals");
    free(pool0), free(ws0), free(conv0), free(out0);
    mix_free(mx);
}
