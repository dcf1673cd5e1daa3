/*
 * gdn-model-loop: a small model loop around the engine's whole mixer step (SPEC 6), with nothing but
 * the installed public API (gdn/gdn.h; build it against `pkg-config gdn`).
 *
 * The model: an embedding table, then L GDN mixer layers, each h += out_proj(mixer(in_proj(h))),
 * where in_proj is one fused projection [D] -> [x | z | a | b] (x = q | k | v before the conv) that the
 * caller runs and writes in bf16 into its own tensor, and the engine reads x, z, a and b where they lie
 * (io_views: strided column slices, no copy); the engine runs the conv with its per-slot window, the
 * recurrence and the gated RMSNorm, writing y; out_proj and the residual are the caller's again.
 * Requests alternate decode steps and speculative verify steps of T draft tokens whose acceptance is
 * simulated (a fixed pseudo-random count in 0..T per row; the engine commits it, windows included).
 *
 * The whole step is one capture callback (gdn_engine_config.capture): the embedding, per layer the
 * caller's in_proj, the engine's layer and the caller's out_proj, then on a verify step the "sampler"
 * that writes the accepted counts and the engine's commit. gdn_engine_run_step runs it: directly on
 * the CPU backend, and on CUDA inside the step graph that the engine captures once per (T, kind) and
 * replays afterwards, so that a step is two small uploads (tokens, acceptance) and one graph launch
 * (then the check downloads the hidden states and the inputs it needs).
 *
 * The caller's side of the step goes through a table (struct proj_backend, model_loop.h): this file
 * has the plain-C one for the CPU backend; model_loop_cuda.cu (built when the build has CUDA) has the
 * CUDA one: device tensors, the projections as cuBLAS GEMMs, the engine on GDN_BACKEND_CUDA with the
 * same mixer configuration. The CUDA backend's fused mixer kernels run every strategy with K = 128
 * (the model's heads here have Qwen's head size); a build whose kernels refuse the mixer
 * (GDN_ENOTSUP from gdn_engine_create) makes the example say so and exit with status 3.
 *
 * The check: an independent float64 run of the same model (this file's own conv, recurrence and norm,
 * written from SPEC 1 and 6; the projections round x, z, a, b to bf16 as the caller's do) gives every
 * verified token's final hidden state and, at the end, every slot's state and conv window (read back
 * through the API, from device memory on CUDA), which the engine's must match within SPEC 4 (abs 1e-2
 * + rel 1e-2). Each window must also hold, bit for bit, the raw inputs x of the slot's last W - 1
 * accepted tokens as the caller gave them ("bit-exact"): the float64 run's own bf16 inputs can be a
 * rounding step away from those past the first layer, where the hidden states carry the engine's fp32
 * output (and on CUDA the fp32 GEMMs), so they are compared within the tolerance only.
 *
 *   gdn-model-loop [--backend auto|cpu|cuda] [--verify auto|cache|fold|ring] [--steps N] [--layers N]
 * --backend auto (the default): CUDA when this program was built with it and a GPU is present, else
 * the CPU backend; the last line but one names the backend that ran.
 * Exit status: 0 when every check passed, 1 otherwise, 2 on a bad argument, 3 when the CUDA backend
 * cannot run this here (not built into this program, no GPU, or no mixer support in the library).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdn/gdn.h>

#include "model_loop.h"

static gdn_engine *the_engine; /* for CHECK's CUDA detail */
#define CHECK(call)                                                                                 \
    do {                                                                                            \
        gdn_status status_ = (call);                                                                \
        if (status_ != GDN_OK) {                                                                    \
            fprintf(stderr, "%s:%d: %s: GDN_%s (%s)\n", __FILE__, __LINE__, #call,                  \
                    gdn_status_name(status_), gdn_status_string(status_));                          \
            if (the_engine && *gdn_engine_last_error(the_engine))                                   \
                fprintf(stderr, "  CUDA: %s\n", gdn_engine_last_error(the_engine));                 \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* xorshift64*: the example's own random source. */
static uint64_t rng_state = 7;
static double uniform(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static double normal(void) { return sqrt(-2.0 * log(1.0 - uniform())) * cos(6.283185307179586 * uniform()); }
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t to_bf16(double x)
{
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static double silu(double x) { return x / (1.0 + exp(-x)); }

/* ---------------------------------------------------------------------------------------------- */
/* The caller's side of the step on the CPU backend (plain C, host memory)                         */
/* ---------------------------------------------------------------------------------------------- */

typedef struct cpu_ctx {
    const model *m;
    step_tensors t;
    double *h;                        /* [R][T_MAX][D] */
    int32_t tokens[R * T_MAX], accepted[R];
} cpu_ctx;

static void *cpu_open(const model *m, step_tensors *t, void **stream)
{
    cpu_ctx *c = calloc(1, sizeof *c);
    c->m = m, *stream = NULL;
    c->h = calloc((size_t)(R * T_MAX * D), sizeof(double));
    for (int32_t l = 0; l < m->L; l++) {
        c->t.fused[l] = calloc((size_t)(R * T_MAX * m->N), 2);
        c->t.y[l] = calloc((size_t)(R * T_MAX * m->HV * m->V), 4);
    }
    *t = c->t;
    return c;
}

static int cpu_set_inputs(void *ctx, const int32_t *tokens, const int32_t *accepted, void *stream)
{
    cpu_ctx *c = ctx;
    (void)stream;
    memcpy(c->tokens, tokens, sizeof c->tokens), memcpy(c->accepted, accepted, sizeof c->accepted);
    return 0;
}

static int cpu_embed(void *ctx, void *stream)
{
    cpu_ctx *c = ctx;
    (void)stream;
    for (int r = 0; r < R * T_MAX; r++)
        for (int d = 0; d < D; d++) c->h[r * D + d] = c->tokens[r] >= 0 ? c->m->embed[(int64_t)c->tokens[r] * D + d] : 0.0;
    return 0;
}

static int cpu_in_proj(void *ctx, int32_t l, void *stream)
{
    cpu_ctx *c = ctx;
    const model *m = c->m;
    (void)stream;
    for (int64_t r = 0; r < R * T_MAX; r++)
        for (int64_t n = 0; n < m->N; n++) {
            double acc = 0.0;
            for (int d = 0; d < D; d++) acc += c->h[r * D + d] * m->in_w[l][d * m->N + n];
            c->t.fused[l][r * m->N + n] = to_bf16(acc);
        }
    return 0;
}

static int cpu_out_proj(void *ctx, int32_t l, int32_t T, void *stream)
{
    cpu_ctx *c = ctx;
    const model *m = c->m;
    const int64_t HVV = (int64_t)m->HV * m->V;
    (void)stream;
    for (int64_t i = 0; i < R; i++) /* only the step's tokens carry on */
        for (int64_t r = i * T_MAX; r < i * T_MAX + T; r++)
            for (int d = 0; d < D; d++) {
                double acc = 0.0;
                for (int64_t e = 0; e < HVV; e++) acc += (double)c->t.y[l][r * HVV + e] * m->out_w[l][e * D + d];
                c->h[r * D + d] += acc;
            }
    return 0;
}

static int cpu_sample(void *ctx, int32_t *accepted, void *stream)
{
    (void)stream;
    memcpy(accepted, ((cpu_ctx *)ctx)->accepted, sizeof(int32_t) * R);
    return 0;
}

static int cpu_read_back(void *ctx, double *host_h, uint16_t *host_fused, void *stream)
{
    const cpu_ctx *c = ctx;
    const size_t fused_elements = (size_t)(R * T_MAX * c->m->N);
    (void)stream;
    memcpy(host_h, c->h, sizeof(double) * R * T_MAX * D);
    for (int32_t l = 0; l < c->m->L; l++) memcpy(host_fused + l * fused_elements, c->t.fused[l], 2 * fused_elements);
    return 0;
}

static void cpu_close(void *ctx)
{
    cpu_ctx *c = ctx;
    for (int32_t l = 0; l < c->m->L; l++) free(c->t.fused[l]), free(c->t.y[l]);
    free(c->h), free(c);
}

static const proj_backend cpu_proj = {"cpu", cpu_open, cpu_set_inputs, cpu_embed, cpu_in_proj,
                                      cpu_out_proj, cpu_sample, cpu_read_back, cpu_close};

/* ---------------------------------------------------------------------------------------------- */
/* The step: the engine's capture callback, the same on both backends                              */
/* ---------------------------------------------------------------------------------------------- */

typedef struct step_user {
    const proj_backend *proj;
    void *ctx;
    int32_t layers;
} step_user;

/* On CUDA this runs once per (T, kind) inside the engine's capture (every call below only enqueues on
 * `stream`, the capture stream); the graph it leaves is what each later step of that shape replays. The
 * bucket is always R here (max_batch is R and every step has R rows). */
static gdn_status model_step(void *user, gdn_engine *e, gdn_step_kind kind, int32_t T, int32_t bucket, void *stream)
{
    const step_user *u = user;
    const proj_backend *p = u->proj;
    (void)bucket;
    if (p->embed(u->ctx, stream)) return GDN_ECUDA;
    for (int32_t l = 0; l < u->layers; l++) {
        if (p->in_proj(u->ctx, l, stream)) return GDN_ECUDA;
        gdn_status status = gdn_engine_run_layer(e, l, stream);
        if (status != GDN_OK) return status;
        if (p->out_proj(u->ctx, l, T, stream)) return GDN_ECUDA;
    }
    if (kind != GDN_STEP_VERIFY) return GDN_OK;
    /* the "sampler" on the device writes the accepted counts; the engine commits them */
    if (p->sample(u->ctx, gdn_engine_accepted(e), stream)) return GDN_ECUDA;
    return gdn_engine_commit(e, stream);
}

/* ---------------------------------------------------------------------------------------------- */
/* The independent float64 run: one token of one request through every layer                       */
/* ---------------------------------------------------------------------------------------------- */

typedef struct ref_state {
    double *S[MAX_L];   /* [HV][V][K] */
    double *win[MAX_L]; /* [W-1][C] raw inputs */
} ref_state;

static void ref_token(const model *m, ref_state *rs, int token, double *h /* [D] out */)
{
    const int64_t C = m->C, HV = m->HV, V = m->V, K = m->K, HK = m->HK, N = m->N;
    double *in = malloc(sizeof(double) * (size_t)N), *c = malloc(sizeof(double) * (size_t)C);
    double *y = malloc(sizeof(double) * (size_t)(HV * V));
    memcpy(h, m->embed + (int64_t)token * D, sizeof(double) * D);
    for (int32_t l = 0; l < m->L; l++) {
        for (int64_t n = 0; n < N; n++) { /* the projection, rounded as the caller's is */
            double acc = 0.0;
            for (int d = 0; d < D; d++) acc += h[d] * m->in_w[l][d * N + n];
            in[n] = from_bf16(to_bf16(acc));
        }
        double *win = rs->win[l];
        for (int64_t ch = 0; ch < C; ch++) { /* SPEC 6: conv over [window; x], SiLU, window moves on */
            double acc = 0.0;
            for (int j = 0; j < W; j++) acc += m->conv_w[l][ch * W + j] * (j < W - 1 ? win[j * C + ch] : in[ch]);
            c[ch] = silu(acc);
            for (int j = 0; j < W - 2; j++) win[j * C + ch] = win[(j + 1) * C + ch];
            win[(W - 2) * C + ch] = in[ch];
        }
        for (int64_t hv = 0; hv < HV; hv++) { /* SPEC 1 per value head, then the gated norm */
            const int64_t kh = hv / (HV / HK);
            const double *q = c + kh * K, *k = c + HK * K + kh * K, *v = c + 2 * HK * K + hv * V;
            const double a = in[C + HV * V + hv], b = in[C + HV * V + HV + hv], *z = in + C + hv * V;
            const double x = a + m->dt_bias[l][hv], sp = x <= 20.0 ? log1p(exp(x)) : x;
            const double g = exp(-exp(m->A_log[l][hv]) * sp), beta = 1.0 / (1.0 + exp(-b));
            double qn = 0.0, kn = 0.0;
            for (int64_t d = 0; d < K; d++) qn += q[d] * q[d], kn += k[d] * k[d];
            qn = 1.0 / sqrt(K) / sqrt(qn + 1e-6), kn = 1.0 / sqrt(kn + 1e-6);
            double *S = rs->S[l] + hv * V * K, *o = y + hv * V, ms = 0.0;
            for (int64_t r = 0; r < V; r++) {
                double *row = S + r * K, sk = 0.0, sq = 0.0;
                for (int64_t d = 0; d < K; d++) row[d] *= g, sk += row[d] * k[d] * kn;
                const double u = beta * (v[r] - sk);
                for (int64_t d = 0; d < K; d++) row[d] += u * k[d] * kn, sq += row[d] * q[d] * qn;
                o[r] = sq, ms += sq * sq;
            }
            const double scale = 1.0 / sqrt(ms / V + 1e-6);
            for (int64_t r = 0; r < V; r++) o[r] = o[r] * scale * m->norm_w[l][r] * silu(z[r]);
        }
        for (int d = 0; d < D; d++) { /* out projection and residual */
            double acc = 0.0;
            for (int64_t e = 0; e < HV * V; e++) acc += (double)(float)y[e] * m->out_w[l][e * D + d];
            h[d] += acc;
        }
    }
    free(in), free(c), free(y);
}

static void ref_copy(const model *m, ref_state *dst, const ref_state *src)
{
    for (int32_t l = 0; l < m->L; l++) {
        memcpy(dst->S[l], src->S[l], sizeof(double) * (size_t)(m->HV * m->V * m->K));
        memcpy(dst->win[l], src->win[l], sizeof(double) * (size_t)((W - 1) * m->C));
    }
}

static void ref_alloc(const model *m, ref_state *rs)
{
    for (int32_t l = 0; l < m->L; l++) {
        rs->S[l] = calloc((size_t)(m->HV * m->V * m->K), sizeof(double));
        rs->win[l] = calloc((size_t)((W - 1) * m->C), sizeof(double));
    }
}

static void ref_release(const model *m, ref_state *rs)
{
    for (int32_t l = 0; l < m->L; l++) free(rs->S[l]), free(rs->win[l]);
}

/* ---------------------------------------------------------------------------------------------- */
/* The loop                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Largest error as a fraction of SPEC 4's fp32 tolerance: hidden and slot states (printed), and the
 * conv windows (inputs, not outputs: past the first layer the float64 run's own bf16 inputs may be a
 * bf16 step away from those the engine was given, which is < 0.8 of the tolerance, so this catches
 * wrong inputs, not rounding). */
static double worst = 0.0, worst_window = 0.0;
static void compare_into(double *w, double got, double want, const char *what, int a, int b)
{
    const double ratio = fabs(got - want) / (1e-2 + 1e-2 * fabs(want));
    if (!(ratio <= 1.0)) fprintf(stderr, "%s (%d, %d): %.6g, float64 %.6g\n", what, a, b, got, want);
    if (!(ratio <= *w)) *w = isnan(ratio) ? INFINITY : ratio;
}
static void compare(double got, double want, const char *what, int a, int b) { compare_into(&worst, got, want, what, a, b); }

/* The token request i proposes at position p (the draft model's and the target's script). */
static int token_at(int i, int p) { return (int)(mix64((uint64_t)i * 1000003u + (uint64_t)p) % VOCAB); }

int main(int argc, char **argv)
{
    gdn_verify_strategy verify = GDN_VERIFY_AUTO;
    gdn_backend_kind backend = GDN_BACKEND_AUTO;
    int steps = 12, layers = 2;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--verify") && a + 1 < argc) {
            const char *v = argv[++a];
            verify = !strcmp(v, "cache") ? GDN_VERIFY_CACHE : !strcmp(v, "fold") ? GDN_VERIFY_FOLD
                   : !strcmp(v, "ring") ? GDN_VERIFY_RING : GDN_VERIFY_AUTO;
        } else if (!strcmp(argv[a], "--backend") && a + 1 < argc && (!strcmp(argv[a + 1], "auto") ||
                   !strcmp(argv[a + 1], "cpu") || !strcmp(argv[a + 1], "cuda"))) {
            const char *v = argv[++a];
            backend = !strcmp(v, "cpu") ? GDN_BACKEND_CPU : !strcmp(v, "cuda") ? GDN_BACKEND_CUDA : GDN_BACKEND_AUTO;
        } else if (!strcmp(argv[a], "--steps") && a + 1 < argc) {
            steps = atoi(argv[++a]);
        } else if (!strcmp(argv[a], "--layers") && a + 1 < argc) {
            layers = atoi(argv[++a]);
        } else {
            fprintf(stderr, "usage: %s [--backend auto|cpu|cuda] [--verify auto|cache|fold|ring] [--steps N] "
                    "[--layers 1..%d]\n", argv[0], MAX_L);
            return 2;
        }
    }
    if (layers < 1 || layers > MAX_L || steps < 1) return 2;

    /* The backend: CUDA when asked for, or with auto when this program has it and a GPU is present. */
    const proj_backend *proj = &cpu_proj;
    if (backend != GDN_BACKEND_CPU) {
#ifdef GDN_MODEL_LOOP_CUDA
        if (model_loop_cuda_device_count() > 0) proj = &model_loop_cuda_proj;
        else if (backend == GDN_BACKEND_CUDA) {
            fprintf(stderr, "gdn-model-loop: CUDA backend: no usable GPU here (--backend cpu runs the CPU backend)\n");
            return 3;
        }
#else
        if (backend == GDN_BACKEND_CUDA) {
            fprintf(stderr, "gdn-model-loop: CUDA backend: not built into this program (it is when the build has CUDA)\n");
            return 3;
        }
#endif
    }
    const int on_cuda = proj != &cpu_proj;

    /* The model, random (the weights are rounded to fp32 once, as the engine stores them). */
    model m = {.L = layers};
    gdn_model_config mc;
    CHECK(gdn_model_preset("tiny", layers, &mc));
    mc.head_dim_k = mc.head_dim_v = 128; /* tiny's few heads at Qwen's head size (the CUDA mixer's) */
    m.HK = mc.num_k_heads, m.HV = mc.num_v_heads, m.K = mc.head_dim_k, m.V = mc.head_dim_v;
    m.C = 2 * (int64_t)m.HK * m.K + (int64_t)m.HV * m.V;
    m.N = m.C + (int64_t)m.HV * m.V + 2 * m.HV;
    const int64_t HVV = (int64_t)m.HV * m.V;
    m.embed = malloc(sizeof(double) * VOCAB * D);
    for (int64_t e = 0; e < VOCAB * D; e++) m.embed[e] = normal();
    for (int32_t l = 0; l < layers; l++) {
        m.in_w[l] = malloc(sizeof(double) * (size_t)(D * m.N));
        for (int64_t e = 0; e < D * m.N; e++) /* a and b columns 10x smaller (SPEC 4's gate scale) */
            m.in_w[l][e] = normal() / sqrt(D) * (e % m.N >= m.C + HVV ? 0.1 : 1.0);
        m.out_w[l] = malloc(sizeof(double) * (size_t)(HVV * D));
        for (int64_t e = 0; e < HVV * D; e++) m.out_w[l][e] = normal() / sqrt((double)HVV);
        m.conv_w[l] = malloc(sizeof(double) * (size_t)(m.C * W));
        for (int64_t e = 0; e < m.C * W; e++) m.conv_w[l][e] = (float)(0.5 * normal());
        m.norm_w[l] = malloc(sizeof(double) * (size_t)m.V);
        for (int64_t e = 0; e < m.V; e++) m.norm_w[l][e] = (float)(1.0 + 0.3 * normal());
        m.A_log[l] = malloc(sizeof(double) * (size_t)m.HV), m.dt_bias[l] = malloc(sizeof(double) * (size_t)m.HV);
        for (int64_t h = 0; h < m.HV; h++) m.A_log[l][h] = (float)(0.1 * normal()), m.dt_bias[l][h] = (float)(0.1 * normal());
    }

    /* The caller's step tensors in backend memory: one fused [R, T_MAX, N] bf16 tensor and one
     * y [R, T_MAX, HV V] per layer, and the backend's own (hidden states, tokens, acceptance). */
    step_tensors t;
    void *stream = NULL;
    void *ctx = proj->open(&m, &t, &stream);
    if (!ctx) return on_cuda ? 3 : 1;
    gdn_layer_views views[MAX_L];
    for (int32_t l = 0; l < layers; l++) {
        const int64_t col_z = m.C, col_a = m.C + HVV, col_b = col_a + m.HV;
        /* Strides for the step's T (dense [B, T, N] of the step): the rows' stride changes with T, so
         * the views are set for T_MAX and every step writes T_MAX token slots (unused ones zero). */
        views[l] = (gdn_layer_views){
            .x = {t.fused[l], T_MAX * m.N, m.N, 0},
            .z = {t.fused[l] + col_z, T_MAX * m.N, m.N, m.V},
            .a = {t.fused[l] + col_a, T_MAX * m.N, m.N, 1},
            .b = {t.fused[l] + col_b, T_MAX * m.N, m.N, 1},
            .o = {t.y[l], T_MAX * HVV, HVV, m.V},
        };
    }

    gdn_engine_config cfg;
    CHECK(gdn_engine_config_init(&cfg, &mc));
    cfg.backend = on_cuda ? GDN_BACKEND_CUDA : GDN_BACKEND_CPU;
    cfg.output_dtype = GDN_DTYPE_F32;
    cfg.num_slots = SLOTS;
    cfg.max_batch = R;
    cfg.max_tokens = T_MAX;
    cfg.verify_strategy = verify;
    cfg.io_views = views;
    cfg.mixer = (gdn_mixer_config){.conv_width = W, .conv_weight_dtype = GDN_DTYPE_F32, .use_norm = 1};
    step_user user = {proj, ctx, layers};
    cfg.capture = model_step, cfg.capture_user = &user; /* the whole step, in the step graph on CUDA */
    gdn_engine *e = NULL;
    const gdn_status created = gdn_engine_create(&cfg, &e);
    if (created == GDN_ENOTSUP && on_cuda) {
        fprintf(stderr, "gdn-model-loop: CUDA backend: mixer not supported by this build (gdn_engine_create: "
                "GDN_ENOTSUP; --backend cpu runs the CPU backend)\n");
        proj->close(ctx);
        return 3;
    }
    CHECK(created);
    the_engine = e;
    for (int32_t l = 0; l < layers; l++) {
        float A[64], dt[64], *cw = malloc(sizeof(float) * (size_t)(m.C * W)), nw[256];
        for (int64_t h = 0; h < m.HV; h++) A[h] = (float)m.A_log[l][h], dt[h] = (float)m.dt_bias[l][h];
        for (int64_t i = 0; i < m.C * W; i++) cw[i] = (float)m.conv_w[l][i];
        for (int64_t i = 0; i < m.V; i++) nw[i] = (float)m.norm_w[l][i];
        CHECK(gdn_engine_set_layer_params(e, l, A, dt));
        CHECK(gdn_engine_set_mixer_params(e, l, cw, NULL, nw));
        free(cw);
    }

    /* Admit R requests: a slot each, state and window zero (no prefill here). */
    int32_t slot[R];
    int pos[R];
    ref_state ref[R], spare;
    const int64_t WE = (W - 1) * m.C;
    uint16_t *given[R][MAX_L]; /* each slot's window as the inputs given to the engine make it */
    for (int i = 0; i < R; i++) {
        CHECK(gdn_slot_alloc(e, &slot[i]));
        CHECK(gdn_slot_reset(e, slot[i], stream));
        ref_alloc(&m, &ref[i]);
        for (int32_t l = 0; l < layers; l++) given[i][l] = calloc((size_t)WE, sizeof(uint16_t));
        pos[i] = 0;
    }
    ref_alloc(&m, &spare);

    double *h = malloc(sizeof(double) * (size_t)(R * T_MAX * D)), *want = malloc(sizeof(double) * D);
    uint16_t *fused = malloc(sizeof(uint16_t) * (size_t)(layers * R * T_MAX * m.N));
    int accepted_total = 0, verified_total = 0;
    for (int s = 0; s < steps; s++) {
        const int is_verify = s % 2 == 1, T = is_verify ? 2 + s / 2 % 3 : 1;
        /* The step's inputs: its tokens, and the acceptance that its "sampler" will report. */
        int32_t tokens[R * T_MAX], acc[R];
        for (int i = 0; i < R; i++) {
            for (int k = 0; k < T_MAX; k++) tokens[i * T_MAX + k] = k < T ? token_at(i, pos[i] + k) : -1;
            acc[i] = is_verify ? (int32_t)(mix64((uint64_t)(s * 31 + i)) % (uint64_t)(T + 1)) : 1;
        }
        if (proj->set_inputs(ctx, tokens, acc, stream)) return 1;
        /* The step: model_step (embeddings, per layer the caller's projection, the engine's mixer, the
         * caller's out projection with the residual; the sampler and the commit), through the engine. */
        const gdn_step step = {.kind = is_verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = R, .slots = slot};
        CHECK(gdn_engine_begin_step(e, &step, stream, NULL));
        CHECK(gdn_engine_run_step(e, stream));
        if (proj->read_back(ctx, h, fused, stream)) return 1;
        /* The windows the engine must now hold: the accepted tokens' raw inputs x, as given. */
        for (int i = 0; i < R; i++)
            for (int32_t l = 0; l < layers; l++)
                for (int k = 0; k < acc[i]; k++) {
                    const uint16_t *x = fused + ((int64_t)l * R * T_MAX + (int64_t)i * T_MAX + k) * m.N;
                    memmove(given[i][l], given[i][l] + m.C, sizeof(uint16_t) * (size_t)((W - 2) * m.C));
                    memcpy(given[i][l] + (W - 2) * m.C, x, sizeof(uint16_t) * (size_t)m.C);
                }
        /* The float64 run: every token's final hidden state; the state after the accepted ones. */
        for (int i = 0; i < R; i++) {
            ref_copy(&m, &spare, &ref[i]);
            for (int k = 0; k < T; k++) {
                ref_token(&m, &spare, token_at(i, pos[i] + k), want);
                for (int d = 0; d < D; d++) compare(h[((int64_t)i * T_MAX + k) * D + d], want[d], "hidden (row, token)", i, k);
                if (k + 1 == acc[i]) ref_copy(&m, &ref[i], &spare);
            }
            pos[i] += acc[i];
            if (is_verify) accepted_total += acc[i], verified_total += T;
        }
    }

    /* Every slot's state and window through the API (pending work written back; device memory read
     * back on CUDA) against the float64 run; each window also bit for bit against the raw inputs x the
     * engine was given ("bit-exact"), as the float64 run's own bf16 inputs past the first layer may
     * differ from those by a rounding step (the hidden states carry the engine's fp32 output). */
    const int64_t SE = HVV * m.K;
    float *state = malloc(sizeof(float) * (size_t)SE);
    uint16_t *win = malloc(sizeof(uint16_t) * (size_t)WE);
    int windows_ok = 1;
    for (int i = 0; i < R; i++)
        for (int32_t l = 0; l < layers; l++) {
            CHECK(gdn_slot_read_state(e, l, slot[i], state));
            CHECK(gdn_slot_read_conv_state(e, l, slot[i], win));
            for (int64_t k = 0; k < SE; k++) compare(state[k], ref[i].S[l][k], "state (row, layer)", i, l);
            for (int64_t k = 0; k < WE; k++)
                compare_into(&worst_window, from_bf16(win[k]), ref[i].win[l][k], "conv window (row, layer)", i, l);
            if (memcmp(win, given[i][l], sizeof(uint16_t) * (size_t)WE)) {
                fprintf(stderr, "conv window (row %d, layer %d): not the inputs given\n", i, (int)l);
                windows_ok = 0;
            }
        }
    windows_ok &= worst_window <= 1.0;
    CHECK(gdn_engine_check_device_error(e, stream));
    for (int i = 0; i < R; i++) CHECK(gdn_slot_free(e, slot[i]));
    const gdn_verify_strategy used = gdn_engine_get_config(e)->verify_strategy;
    printf("gdn-model-loop: %s backend, %d mixer layers (tiny heads, W %d, gated norm), %d steps, verify %s, "
           "%d of %d draft tokens accepted\n",
           proj->name, layers, W, steps, used == GDN_VERIFY_FOLD ? "fold" : used == GDN_VERIFY_RING ? "ring" : "cache",
           accepted_total, verified_total);
    const int pass = worst <= 1.0 && windows_ok;
    printf("checks: hidden states and slot states vs float64 at %.2f%% of SPEC 4's tolerance, conv windows %s: %s\n",
           100.0 * worst, windows_ok ? "bit-exact" : "DIFFER", pass ? "PASS" : "FAIL");

    gdn_engine_destroy(e);
    proj->close(ctx);
    for (int i = 0; i < R; i++) {
        ref_release(&m, &ref[i]);
        for (int32_t l = 0; l < layers; l++) free(given[i][l]);
    }
    ref_release(&m, &spare);
    for (int32_t l = 0; l < layers; l++) {
        free(m.in_w[l]), free(m.out_w[l]), free(m.conv_w[l]), free(m.norm_w[l]);
        free(m.A_log[l]), free(m.dt_bias[l]);
    }
    free(m.embed), free(h), free(want), free(fused), free(state), free(win);
    return pass ? 0 : 1;
}
