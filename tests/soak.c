/*
 * gdn-soak (issue 17): a long random serving run against an independent float64 model, with host
 * memory (and, on the GPU, device memory) watched for growth. Not a Criterion test: scripts/soak.sh
 * runs it on the CPU, scripts/soak_gpu.sh on a GPU host from a bundle.
 *
 *   gdn-soak [--steps N] [--seed S] [--verify cache|fold|ring|all] [--state f32|bf16] [--quiet]
 *            [--backend cpu|cuda] [--preset NAME] [--layers L] [--slots N] [--max-batch B]
 *            [--max-tokens T] [--ring-length R] [--heads H] [--threads N] [--graphs lazy|at-create|off]
 *
 * Each step: arrivals (a reset, written or imported initial state), a random subset of the live
 * requests as rows in random order with explicit padding rows, now and then a fork into a fresh slot,
 * a decode or a verify of 1..max_tokens tokens (run_step, or run_layer per layer in a random order),
 * random accepted counts (0, T, out of range included) and commit, retirement (finished or cancelled
 * requests), so slots are reused all the time. Every output of every step is compared with the model
 * (SPEC 1 per token, in double, straight from gdn__ref_gdn_token); live states are read back at random
 * points and all of them at the end (SPEC 4 tolerances, bf16 ones with --state bf16). --verify all
 * (the default) runs the steps in three equal parts, one engine per strategy (cache, fold, ring).
 *
 * Two modes.
 *   Full model (the default on the CPU backend): tiny preset (HK 2, HV 4, K = V = 64), 2 layers,
 *     8 slots, max_batch 4, max_tokens 4, ring_length 4 (frequent write-backs). The model tracks every
 *     value head; inputs and initial states are drawn fresh for every element.
 *   Sampled heads (the default with --backend cuda, or --heads H below HV): qwen3-next (HK 16, HV 32,
 *     K = V = 128), 3 layers, 32 slots, max_batch 8, max_tokens 8, ring_length 8, graphs captured at
 *     creation. One token of one layer is 0.5M state elements there, far too many to model in float64
 *     for every head of 1e5 steps; value heads are independent in GDN (head h reads key head
 *     h / (HV / HK) and nothing else), so each request's model tracks H value heads (default 2) drawn
 *     at admission, and over thousands of requests every head is covered. Outputs of the tracked heads
 *     are checked every step, every other head's outputs must be finite, padding rows are zero in
 *     every head (the output buffers are poisoned before a quarter of the steps), and state checks
 *     compare the tracked heads of the whole state read back (gdn_slot_read_state, or
 *     gdn_slot_export_async into backend memory and a download). Inputs and initial states are windows
 *     at random offsets into banks of SPEC 4 random values drawn once (host copies for the model and
 *     the synchronous writes, a backend copy for gdn_slot_import_async), so no step draws a random
 *     number per element. The model's rows run on --threads threads (default: every core).
 *   --backend cpu with --heads below HV runs the sampled mode on the CPU backend (how it is tested
 *   without a GPU). Without a usable GPU (or in a build without CUDA), --backend cuda stops at once
 *   with exit status 3 (gdn_engine_create returns GDN_ENODEV).
 *
 * Memory: everything the soak itself needs is allocated before the first step. After a warm-up (the
 * first 5% of a part's steps, at least 200) it reads jemalloc's "stats.allocated" (after an "epoch"
 * bump) and the library's allocation counter (gdn__allocation_count) at every state check and at the
 * end of the part, and on the CUDA backend the library's device allocations (gdn__cuda_live_allocations
 * and gdn__cuda_device_allocations, engine/backend_impl.h), and reports the growth: all must stay flat
 * (the step path allocates nothing). On the CUDA backend jemalloc's total may move within 64 KiB (the
 * driver's own threads allocate too); the library's host and device counters must not move at all.
 * Exit status 0 when every check passed and memory stayed flat, 1 otherwise, 2 for bad arguments,
 * 3 when the CUDA backend is not available.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jemalloc/jemalloc.h>

#include "engine/alloc.h"
#include "engine/backend_impl.h"
#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"
#include "row_model.h"

/* Upper bounds of the options (the step's host arrays are sized by them). */
enum { MAX_BATCH_CAP = 64, MAX_SLOTS_CAP = 256, MAX_HV = 256, MAX_THREADS = 64 };
/* Host memory range allowed after the warm-up on the CUDA backend (see main). */
#define HOST_SLACK_CUDA ((uint64_t)64 * 1024)

typedef struct options {
    int64_t steps;
    uint64_t seed;
    const char *verify, *state, *preset;
    gdn_backend_kind backend;
    int32_t layers, slots, max_batch, max_tokens, ring_length, heads, threads;
    gdn_graph_mode graphs;
    int quiet;
} options;

typedef struct request {
    int live;
    int32_t slot;
    int32_t remaining;
    int32_t heads[MAX_HV]; /* the value heads the model tracks (every head in the full mode) */
    double *state;         /* [layers][H][V * K] */
} request;

/* One model thread's scratch and statistics. */
typedef struct worker {
    struct soak *s;
    pthread_t thread;
    double *S, *out;      /* [H][V K]; [max_tokens][H][V] */
    double q[256], k[256], v[256];
    double worst_output;
    int64_t outputs_checked, finite_checked;
} worker;

/* The step whose outputs the model checks (read by the model threads). */
typedef struct step_context {
    int verify;
    int32_t T, n, bucket;
    int32_t rows[MAX_BATCH_CAP], row_req[MAX_BATCH_CAP], accepted[MAX_BATCH_CAP];
    const void *o[16];       /* per layer: the outputs [bucket, T, HV, V] in host memory */
    int64_t bank_at[16][5];  /* sampled mode: per layer, q k v a b's offsets into their banks */
} step_context;

typedef struct soak {
    options opt;
    gdn_engine *e;
    gdn_engine_config cfg;
    gdn__rng rng;
    gdn_dtype sd, id, od;
    int32_t L, SLOTS, MB, MT, HK, HV, K, V, H;
    int sampled;  /* the sampled-heads mode (banks, download, threads) */
    size_t elems; /* HV V K */
    size_t vk;    /* V K */
    float *A_log, *dt_bias; /* [L][HV] */
    request req[MAX_SLOTS_CAP];
    /* preallocated scratch */
    double *in; /* full mode: inputs of a step [L][MB][MT][...] */
    size_t token_doubles;
    unsigned char *raw, *staging; /* raw: one state of every layer; staging: inputs or states */
    size_t staging_bytes;
    unsigned char *o_host; /* sampled mode: the outputs [L][MB][MT][HV][V] downloaded */
    unsigned char *poison; /* sampled mode: 0x7f bytes, one layer's outputs */
    /* sampled mode: banks of random values (host; the state bank also in backend memory) */
    unsigned char *bank_normal, *bank_gate, *bank_state; /* input dtype N(0,1); 0.1 N(0,1); state dtype 0.1 N(0,1) */
    int64_t bank_normal_len, bank_gate_len, bank_state_len;
    gdn__backend aux; /* backend memory of the engine's kind, outside the engine */
    void *d_bank_state, *d_export;
    step_context cur;
    /* model threads */
    worker workers[MAX_THREADS];
    int nthreads;
    pthread_mutex_t mu, fail_mu;
    pthread_cond_t go, done;
    unsigned generation;
    int tasks, next_task, finished, quit;
    /* statistics */
    int64_t decode_steps, verify_steps, rows, padding_rows, forks, admitted, retired, state_checks, accepted_zero,
        accepted_full, accepted_clamped, outputs_checked, finite_checked, poisoned_steps, exports;
    double worst_output, worst_state;
    double model_seconds; /* wall time of the model's output checks */
    atomic_int failed;
    int no_device;
    int have_spare;
    double spare;
} soak;

static double uniform(soak *s) { return gdn__rng_uniform(&s->rng); }
static int32_t below(soak *s, int32_t n) { return (int32_t)(gdn__rng_next(&s->rng) % (uint64_t)n); }
/* N(0, 1) by Marsaglia's polar method from the seeded source, both values of each pair used (the
 * inputs are drawn by the million; Box-Muller's cos and log per value were a sixth of the run). */
static double normal(soak *s)
{
    if (s->have_spare) {
        s->have_spare = 0;
        return s->spare;
    }
    double u, v, r2;
    do {
        u = 2.0 * gdn__rng_uniform(&s->rng) - 1.0;
        v = 2.0 * gdn__rng_uniform(&s->rng) - 1.0;
        r2 = u * u + v * v;
    } while (r2 >= 1.0 || r2 == 0.0);
    const double f = sqrt(-2.0 * log(r2) / r2);
    s->spare = v * f, s->have_spare = 1;
    return u * f;
}

static void failf(soak *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(soak *s, const char *fmt, ...)
{
    pthread_mutex_lock(&s->fail_mu);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gdn-soak: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    s->failed = 1;
    pthread_mutex_unlock(&s->fail_mu);
}

#define CHECK(s, call)                                                                                             \
    do {                                                                                                           \
        gdn_status check_status_ = (call);                                                                         \
        if (check_status_ != GDN_OK) {                                                                             \
            failf(s, "%s:%d: %s returned %s", __FILE__, __LINE__, #call, gdn_status_name(check_status_));           \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

static double round_to(double x, gdn_dtype dtype)
{
    uint32_t tmp[1];
    gdn__store_f32(tmp, dtype, 0, (float)x);
    return gdn__load_f32(tmp, dtype, 0);
}

/* An output against the model's (unrounded) value: the ratio to SPEC 4's tolerance against the value
 * rounded to the output dtype, or on the GPU (`boundary`), when smaller, against the unrounded value
 * less half an output ulp: a value on a rounding boundary may round either way, the GPU's fp32 sums
 * land on the other side of one now and then, and at |o| >= 0.5 one bf16 ulp is more than the
 * bf16-state tolerance. (The CPU backend's float64 rounds as the model does: no allowance there.) */
static double output_ratio(double got, double exact, gdn_dtype od, double abs_tol, double rel_tol, int boundary)
{
    const double want = round_to(exact, od);
    const double rounded = fabs(got - want) / (abs_tol + rel_tol * fabs(want));
    if (!boundary) return rounded;
    const int mantissa = od == GDN_DTYPE_BF16 ? 8 : 24;
    const double half_ulp = exact != 0.0 && isfinite(exact) ? ldexp(1.0, ilogb(exact) - mantissa) : 0.0;
    const double off = fabs(got - exact) - half_ulp;
    const double unrounded = (off > 0.0 ? off : 0.0) / (abs_tol + rel_tol * fabs(exact));
    return rounded < unrounded ? rounded : unrounded;
}

static uint64_t jemalloc_allocated(void)
{
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    mallctl("epoch", &epoch, &len, &epoch, len);
    size_t allocated = 0;
    len = sizeof allocated;
    if (mallctl("stats.allocated", &allocated, &len, NULL, 0) != 0) return 0;
    return allocated;
}

/* The library's device allocations: live ones, and all made so far (0 without CUDA). */
static int64_t device_live(void)
{
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_live_allocations();
#else
    return 0;
#endif
}
static uint64_t device_made(void)
{
#ifdef GDN_HAVE_CUDA
    return gdn__cuda_device_allocations();
#else
    return 0;
#endif
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* ---- model threads: the step's (layer, row) checks spread over the workers ---- */

static void check_row(soak *s, worker *w, int32_t layer, int32_t i);

static void run_task(soak *s, worker *w, int task)
{
    const int32_t bucket = s->cur.bucket;
    check_row(s, w, task / bucket, task % bucket);
}

static void work(soak *s, worker *w)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (s->next_task >= s->tasks) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        const int task = s->next_task++;
        pthread_mutex_unlock(&s->mu);
        run_task(s, w, task);
        pthread_mutex_lock(&s->mu);
        if (++s->finished == s->tasks) pthread_cond_signal(&s->done);
        pthread_mutex_unlock(&s->mu);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    soak *s = w->s;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->generation == seen && !s->quit) pthread_cond_wait(&s->go, &s->mu);
        if (s->quit) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        seen = s->generation;
        pthread_mutex_unlock(&s->mu);
        work(s, w);
    }
}

/* Runs tasks 0..count-1 (layer-major over the bucket's rows): on the calling thread alone, in order,
 * with one thread, else spread over every worker, the calling thread included. */
static void run_tasks(soak *s, int count)
{
    if (s->nthreads == 1) {
        for (int t = 0; t < count && !s->failed; t++) run_task(s, &s->workers[0], t);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->tasks = count, s->next_task = 0, s->finished = 0;
    s->generation++;
    pthread_cond_broadcast(&s->go);
    pthread_mutex_unlock(&s->mu);
    work(s, &s->workers[0]);
    pthread_mutex_lock(&s->mu);
    while (s->finished < s->tasks) pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the model ---- */

static double *row_inputs(soak *s, int32_t layer, int32_t row)
{
    return s->in + ((size_t)layer * s->MB + (size_t)row) * s->MT * s->token_doubles;
}

/* A request's model state of one layer: [H][V K]. */
static double *model_state(soak *s, request *r, int32_t layer) { return r->state + (size_t)layer * s->H * s->vk; }

static void store_state(soak *s, double *dst, const double *src, size_t n)
{
    for (size_t j = 0; j < n; j++) dst[j] = round_to(src[j], s->sd);
}

/* Sampled mode: `n` values of a bank from element `at`, widened. */
static void widen(const unsigned char *bank, gdn_dtype dtype, int64_t at, int32_t n, double *out)
{
    for (int32_t j = 0; j < n; j++) out[j] = gdn__load_f32(bank, dtype, at + j);
}

/* SPEC 1 for token t of row i (T tokens) on the request's tracked heads, from S [H][V K]; outputs
 * [H][V] into out. */
static void model_token(soak *s, worker *w, const request *r, int32_t layer, int32_t i, int32_t T, int32_t t, double *S,
                        double *out)
{
    const float *A_log = s->A_log + (size_t)layer * s->HV, *dt_bias = s->dt_bias + (size_t)layer * s->HV;
    if (!s->sampled) { /* every head, from the inputs saved as drawn */
        const test_row_model m = {s->HK, s->HV, s->K, s->V, A_log, dt_bias, (double)s->cfg.model.scale, 1};
        test_model_token(&m, row_inputs(s, layer, i), T, t, S, out);
        return;
    }
    const int64_t *at = s->cur.bank_at[layer];
    const int32_t per_key = s->HV / s->HK;
    const int64_t rt = (int64_t)i * T + t; /* dense [bucket, T, ...]: row-token index */
    for (int32_t j = 0; j < s->H; j++) {
        const int32_t h = r->heads[j], kh = h / per_key;
        widen(s->bank_normal, s->id, at[0] + (rt * s->HK + kh) * s->K, s->K, w->q);
        widen(s->bank_normal, s->id, at[1] + (rt * s->HK + kh) * s->K, s->K, w->k);
        widen(s->bank_normal, s->id, at[2] + (rt * s->HV + h) * s->V, s->V, w->v);
        const double a = gdn__load_f32(s->bank_gate, s->id, at[3] + rt * s->HV + h);
        const double b = gdn__load_f32(s->bank_gate, s->id, at[4] + rt * s->HV + h);
        gdn__ref_gdn_token(s->K, s->V, S + (size_t)j * s->vk, w->q, w->k, w->v, a, b, A_log[h], dt_bias[h],
                           (double)s->cfg.model.scale, 1, out + (size_t)j * s->V);
    }
}

/* One (layer, bucket row) of the current step: padding rows output zeros in every head; a live row's
 * tracked heads match the model (whose state advances by the row's kept tokens), its other heads are
 * finite. Runs on any model thread: it touches only its own request's model of this layer. */
static void check_row(soak *s, worker *w, int32_t layer, int32_t i)
{
    const step_context *c = &s->cur;
    const int32_t T = c->T;
    const size_t per_row = (size_t)T * s->HV * s->V;
    const void *o = c->o[layer];
    const gdn_dtype od = s->od;
    if (i >= c->n || c->rows[i] < 0) { /* padding: zeros */
        for (size_t j = 0; j < per_row; j++)
            if (gdn__load_f32(o, od, (int64_t)(i * per_row + j)) != 0.0f) {
                failf(s, "layer %d padding row %d output %zu is not zero", layer, i, j);
                return;
            }
        return;
    }
    request *r = &s->req[c->row_req[i]];
    double *model = model_state(s, r, layer);
    int32_t keep = c->verify ? c->accepted[i] : 1;
    keep = keep < 0 ? 0 : (keep > T ? T : keep);
    /* One pass: every token's outputs, and the state after the kept ones into the model. */
    const size_t state_doubles = (size_t)s->H * s->vk, out_per_token = (size_t)s->H * s->V;
    memcpy(w->S, model, sizeof(double) * state_doubles);
    for (int32_t t = 0; t < T; t++) {
        model_token(s, w, r, layer, i, T, t, w->S, w->out + (size_t)t * out_per_token);
        if (t + 1 == keep) store_state(s, model, w->S, state_doubles);
    }
    const gdn__tolerance tol = gdn__spec4_tolerance(s->sd);
    const int boundary = s->opt.backend != GDN_BACKEND_CPU;
    for (int32_t t = 0; t < T; t++)
        for (int32_t j = 0; j < s->H; j++) {
            const int32_t h = r->heads[j];
            const size_t at = i * per_row + ((size_t)t * s->HV + h) * s->V;
            for (int32_t x = 0; x < s->V; x++) {
                const double got = gdn__load_f32(o, od, (int64_t)(at + x));
                const double exact = w->out[(size_t)t * out_per_token + (size_t)j * s->V + x];
                const double ratio = output_ratio(got, exact, od, tol.out_abs, tol.out_rel, boundary);
                if (!(ratio <= 1.0)) {
                    const double want = round_to(exact, od);
                    failf(s, "layer %d row %d (slot %d) token %d head %d output %d: %.6g, model %.6g (%.0f%% of tolerance)",
                          layer, i, c->rows[i], t, h, x, got, want, 100 * ratio);
                    return;
                }
                if (ratio > w->worst_output) w->worst_output = ratio;
            }
        }
    w->outputs_checked += (int64_t)((size_t)T * out_per_token);
    if (s->sampled) /* the heads the model does not track: finite (not garbage, not the poison) */
        for (size_t j = 0; j < per_row; j++) {
            const float x = gdn__load_f32(o, od, (int64_t)(i * per_row + j));
            if (!isfinite(x) || fabsf(x) > 1e4f) {
                failf(s, "layer %d row %d (slot %d) output %zu is %g", layer, i, c->rows[i], j, (double)x);
                return;
            }
        }
    if (s->sampled) w->finite_checked += (int64_t)per_row;
}

/* ---- banks (sampled mode) ---- */

/* A window of `need` elements at a random offset (a multiple of 64 elements) into a bank of `len`. */
static int64_t bank_window(soak *s, int64_t len, int64_t need)
{
    const int64_t positions = (len - need) / 64 + 1;
    return 64 * (int64_t)(gdn__rng_next(&s->rng) % (uint64_t)positions);
}

static unsigned char *fill_bank(soak *s, int64_t len, gdn_dtype dtype, double scale)
{
    unsigned char *bank = malloc((size_t)len * gdn_dtype_size(dtype));
    if (!bank) return NULL;
    for (int64_t j = 0; j < len; j++) gdn__store_f32(bank, dtype, j, (float)(scale * normal(s)));
    return bank;
}

/* ---- requests ---- */

static void random_raw_state(soak *s, unsigned char *raw, double *model)
{
    for (size_t j = 0; j < s->elems; j++) {
        gdn__store_f32(raw, s->sd, (int64_t)j, (float)(0.1 * normal(s)));
        model[j] = gdn__load_f32(raw, s->sd, (int64_t)j);
    }
}

/* Sampled mode: the tracked heads of layer l's model from a state in the host bank at element `at`. */
static void model_from_bank(soak *s, request *r, int32_t layer, int64_t at)
{
    double *m = model_state(s, r, layer);
    for (int32_t j = 0; j < s->H; j++)
        widen(s->bank_state, s->sd, at + (int64_t)r->heads[j] * (int64_t)s->vk, (int32_t)s->vk, m + (size_t)j * s->vk);
}

static void admit(soak *s, request *r)
{
    int32_t slot;
    if (gdn_slot_alloc(s->e, &slot) != GDN_OK) return;
    r->live = 1, r->slot = slot, r->remaining = 1 + below(s, 40);
    s->admitted++;
    if (s->sampled) { /* H distinct value heads (a partial shuffle) */
        int32_t all[MAX_HV];
        for (int32_t h = 0; h < s->HV; h++) all[h] = h;
        for (int32_t j = 0; j < s->H; j++) {
            const int32_t pick = j + below(s, s->HV - j), t = all[j];
            all[j] = all[pick], all[pick] = t;
            r->heads[j] = all[j];
        }
    }
    const double u = uniform(s);
    const size_t ssize = gdn_dtype_size(s->sd);
    if (u < 0.3) { /* a fresh request */
        CHECK(s, gdn_slot_reset(s->e, slot, NULL));
        memset(r->state, 0, sizeof(double) * s->H * s->vk * s->L);
    } else if (!s->sampled && u < 0.65) { /* a prefill's final state, through the host */
        for (int32_t l = 0; l < s->L; l++) {
            random_raw_state(s, s->raw, model_state(s, r, l));
            CHECK(s, gdn_slot_write_state(s->e, l, slot, s->raw));
        }
    } else if (!s->sampled) { /* a prefill's final state, device-side (all layers in one launch) */
        const size_t bytes = s->elems * ssize;
        for (int32_t l = 0; l < s->L; l++) random_raw_state(s, s->staging + bytes * (size_t)l, model_state(s, r, l));
        CHECK(s, gdn_slot_import_async(s->e, slot, s->staging, (int64_t)s->elems, NULL));
    } else if (u < 0.5) { /* through the host, each layer from its own window of the bank */
        for (int32_t l = 0; l < s->L; l++) {
            const int64_t at = bank_window(s, s->bank_state_len, (int64_t)s->elems);
            model_from_bank(s, r, l, at);
            CHECK(s, gdn_slot_write_state(s->e, l, slot, s->bank_state + (size_t)at * ssize));
        }
    } else { /* device-side, from the bank in backend memory at a random layer stride */
        const int64_t stride = (int64_t)s->elems + 64 * below(s, 257);
        const int64_t at = bank_window(s, s->bank_state_len, (s->L - 1) * stride + (int64_t)s->elems);
        for (int32_t l = 0; l < s->L; l++) model_from_bank(s, r, l, at + l * stride);
        CHECK(s, gdn_slot_import_async(s->e, slot, (const unsigned char *)s->d_bank_state + (size_t)at * ssize, stride, NULL));
    }
}

static void retire(soak *s, request *r)
{
    CHECK(s, gdn_slot_free(s->e, r->slot));
    r->live = 0;
    s->retired++;
}

static void check_state(soak *s, request *r, int q)
{
    const gdn__tolerance tol = gdn__spec4_tolerance(s->sd);
    const size_t layer_bytes = s->elems * gdn_dtype_size(s->sd);
    /* Sampled mode: half of the checks read every layer through a device-side export. */
    const int export = s->sampled && uniform(s) < 0.5;
    if (export) {
        CHECK(s, gdn_slot_export_async(s->e, r->slot, s->d_export, (int64_t)s->elems, NULL));
        CHECK(s, gdn_engine_download(s->e, s->raw, s->d_export, layer_bytes * (size_t)s->L, NULL));
        CHECK(s, gdn_engine_synchronize(s->e, NULL));
        s->exports++;
    }
    for (int32_t l = 0; l < s->L && !s->failed; l++) {
        const unsigned char *raw = export ? s->raw + layer_bytes * (size_t)l : s->raw;
        if (!export) CHECK(s, gdn_slot_read_state(s->e, l, r->slot, s->raw));
        const double *m = model_state(s, r, l);
        for (int32_t j = 0; j < s->H; j++) {
            const int64_t head = s->sampled ? r->heads[j] : j;
            for (size_t x = 0; x < s->vk; x++) {
                const double want = m[(size_t)j * s->vk + x];
                const double got = gdn__load_f32(raw, s->sd, head * (int64_t)s->vk + (int64_t)x);
                const double ratio = fabs(got - want) / (tol.state_abs + tol.state_rel * fabs(want));
                if (!(ratio <= 1.0)) {
                    failf(s, "request %d (slot %d) layer %d head %d element %zu: state %.6g, model %.6g (%.0f%% of tolerance)%s",
                          q, r->slot, l, (int)head, x, got, want, 100 * ratio, export ? " (exported)" : "");
                    return;
                }
                if (ratio > s->worst_state) s->worst_state = ratio;
            }
        }
    }
    s->state_checks++;
}

/* ---- one step ---- */

/* Full mode: every input drawn fresh, saved as the model reads it. */
static void write_inputs(soak *s, int32_t layer, int32_t bucket, int32_t T)
{
    gdn_layer_io io;
    CHECK(s, gdn_engine_layer_io(s->e, layer, &io));
    const gdn_dtype id = s->id;
    const size_t isz = gdn_dtype_size(id);
    const size_t nqk = (size_t)s->HK * s->K, nv = (size_t)s->HV * s->V, ng = (size_t)s->HV;
    void *dst[5] = {io.q, io.k, io.v, io.a, io.b};
    const size_t per[5] = {nqk, nqk, nv, ng, ng};
    const double scale[5] = {1.0, 1.0, 1.0, 0.1, 0.1};
    size_t offset[5] = {0, (size_t)T * nqk, 2 * (size_t)T * nqk, 2 * (size_t)T * nqk + (size_t)T * nv,
                        2 * (size_t)T * nqk + (size_t)T * nv + (size_t)T * ng};
    for (int p = 0; p < 5; p++) {
        const size_t n = (size_t)bucket * (size_t)T * per[p];
        for (size_t e = 0; e < n; e++) {
            gdn__store_f32(s->staging, id, (int64_t)e, (float)(scale[p] * normal(s)));
            const size_t row = e / ((size_t)T * per[p]), within = e % ((size_t)T * per[p]);
            if (row < (size_t)s->MB) row_inputs(s, layer, (int32_t)row)[offset[p] + within] = gdn__load_f32(s->staging, id, (int64_t)e);
        }
        CHECK(s, gdn_engine_upload(s->e, dst[p], s->staging, n * isz, NULL));
    }
}

/* Sampled mode: each input tensor is a window of its bank, uploaded from there. */
static void bank_inputs(soak *s, int32_t layer, int32_t bucket, int32_t T)
{
    gdn_layer_io io;
    CHECK(s, gdn_engine_layer_io(s->e, layer, &io));
    const size_t isz = gdn_dtype_size(s->id);
    void *dst[5] = {io.q, io.k, io.v, io.a, io.b};
    const int64_t rows = (int64_t)bucket * T;
    const int64_t n[5] = {rows * s->HK * s->K, rows * s->HK * s->K, rows * s->HV * s->V, rows * s->HV, rows * s->HV};
    for (int p = 0; p < 5; p++) {
        const int gate = p >= 3;
        const unsigned char *bank = gate ? s->bank_gate : s->bank_normal;
        const int64_t at = bank_window(s, gate ? s->bank_gate_len : s->bank_normal_len, n[p]);
        s->cur.bank_at[layer][p] = at;
        CHECK(s, gdn_engine_upload(s->e, dst[p], bank + (size_t)at * isz, (size_t)n[p] * isz, NULL));
    }
}

static void step(soak *s)
{
    /* Arrivals (one slot stays free for forks when it can). */
    const int32_t arrivals = below(s, 3);
    for (int32_t a = 0; a < arrivals; a++)
        if (gdn_slot_count(s->e) < s->SLOTS - 1)
            for (int32_t q = 0; q < s->SLOTS; q++)
                if (!s->req[q].live) {
                    admit(s, &s->req[q]);
                    break;
                }
    if (s->failed) return;

    /* Rows: live requests in random order, some left out, explicit padding rows. The sampled mode has
     * more live requests than rows: half of its steps take a random batch size, so that every bucket
     * runs. */
    int32_t order[MAX_SLOTS_CAP], nlive = 0;
    for (int32_t q = 0; q < s->SLOTS; q++)
        if (s->req[q].live) order[nlive++] = q;
    for (int32_t i = nlive - 1; i > 0; i--) {
        const int32_t j = below(s, i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    const int32_t limit = s->sampled && uniform(s) < 0.5 ? below(s, s->MB + 1) : s->MB;
    int32_t rows[MAX_BATCH_CAP], writes[MAX_BATCH_CAP], row_req[MAX_BATCH_CAP], n = 0;
    for (int32_t k = 0; k < nlive && n < limit; k++) {
        if (uniform(s) < 0.2) continue;
        if (n < limit - 1 && uniform(s) < 0.1) {
            rows[n] = -1, writes[n] = -1, row_req[n] = -1, n++;
            s->padding_rows++;
        }
        const request *r = &s->req[order[k]];
        rows[n] = r->slot, writes[n] = r->slot, row_req[n] = order[k], n++;
    }
    int forked[MAX_BATCH_CAP] = {0};
    for (int32_t i = 0; i < n; i++) {
        int32_t fresh;
        if (rows[i] < 0 || uniform(s) > 0.05 || gdn_slot_alloc(s->e, &fresh) != GDN_OK) continue;
        writes[i] = fresh, forked[i] = 1;
        s->forks++;
    }
    const int verify = s->MT > 1 && uniform(s) < 0.5; /* max_tokens 1: decodes only */
    const int32_t T = verify ? 1 + below(s, s->MT) : 1;
    gdn_step st = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = n, .slots = rows,
                   .write_slots = writes};
    int32_t bucket = 0;
    CHECK(s, gdn_engine_begin_step(s->e, &st, NULL, &bucket));
    const size_t o_layer_bytes = (size_t)s->MB * s->MT * s->HV * s->V * gdn_dtype_size(s->od);
    const int poison = s->sampled && uniform(s) < 0.25;
    for (int32_t l = 0; l < s->L; l++) {
        if (s->sampled) bank_inputs(s, l, bucket, T);
        else write_inputs(s, l, bucket, T);
        if (poison) {
            gdn_layer_io io;
            CHECK(s, gdn_engine_layer_io(s->e, l, &io));
            CHECK(s, gdn_engine_upload(s->e, io.o, s->poison, o_layer_bytes, NULL));
        }
    }
    s->poisoned_steps += poison;
    if (uniform(s) < 0.5) {
        CHECK(s, gdn_engine_run_step(s->e, NULL));
    } else {
        const int32_t first = below(s, s->L);
        for (int32_t j = 0; j < s->L; j++) CHECK(s, gdn_engine_run_layer(s->e, (first + j) % s->L, NULL));
    }
    int32_t accepted[MAX_BATCH_CAP] = {0};
    if (verify) {
        for (int32_t i = 0; i < s->MB; i++) {
            const double u = uniform(s);
            accepted[i] = u < 0.2 ? 0 : (u < 0.45 ? T : (u < 0.5 ? (below(s, 2) ? -3 : T + 2) : below(s, T + 1)));
        }
        CHECK(s, gdn_engine_upload(s->e, gdn_engine_accepted(s->e), accepted, sizeof(int32_t) * (size_t)s->MB, NULL));
        CHECK(s, gdn_engine_commit(s->e, NULL));
        s->verify_steps++;
        /* a live row's count outside 0..T is clamped and raises the device flag; the check clears it */
        int clamped = 0;
        for (int32_t i = 0; i < n; i++) clamped |= rows[i] >= 0 && (accepted[i] < 0 || accepted[i] > T);
        if (clamped) {
            const gdn_status flag = gdn_engine_check_device_error(s->e, NULL);
            if (flag != GDN_EDEVICE) failf(s, "a clamped accepted count: device flag %s, expected EDEVICE", gdn_status_name(flag));
        }
    } else {
        s->decode_steps++;
    }

    /* Outputs and the model, row by row (an empty step writes no outputs). */
    step_context *c = &s->cur;
    c->verify = verify, c->T = T, c->n = n, c->bucket = bucket;
    memcpy(c->rows, rows, sizeof rows);
    memcpy(c->row_req, row_req, sizeof row_req);
    memcpy(c->accepted, accepted, sizeof accepted);
    if (n > 0) {
        const size_t o_bytes = (size_t)bucket * T * s->HV * s->V * gdn_dtype_size(s->od);
        for (int32_t l = 0; l < s->L; l++) {
            gdn_layer_io io;
            CHECK(s, gdn_engine_layer_io(s->e, l, &io));
            if (s->opt.backend == GDN_BACKEND_CPU) { /* backend memory is host memory */
                c->o[l] = io.o;
            } else {
                c->o[l] = s->o_host + o_layer_bytes * (size_t)l;
                CHECK(s, gdn_engine_download(s->e, s->o_host + o_layer_bytes * (size_t)l, io.o, o_bytes, NULL));
            }
        }
        if (s->opt.backend != GDN_BACKEND_CPU) CHECK(s, gdn_engine_synchronize(s->e, NULL));
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        run_tasks(s, s->L * bucket);
        s->model_seconds += seconds_since(&t0);
    }
    if (s->failed) return;
    for (int32_t i = 0; i < n; i++) {
        if (rows[i] < 0) continue;
        request *r = &s->req[row_req[i]];
        int32_t keep = verify ? accepted[i] : 1;
        if (verify) {
            s->accepted_zero += accepted[i] <= 0, s->accepted_full += accepted[i] >= T;
            s->accepted_clamped += accepted[i] < 0 || accepted[i] > T;
        }
        keep = keep < 0 ? 0 : (keep > T ? T : keep);
        if (forked[i]) { /* the request moves to its new slot */
            /* A fork that committed nothing leaves the new slot strategy-defined (cache: as it was; fold and
             * ring: the read slot's state): carry the state over explicitly, device-side. */
            if (keep == 0) CHECK(s, gdn_slot_copy_async(s->e, writes[i], rows[i], NULL));
            CHECK(s, gdn_slot_free(s->e, rows[i]));
            r->slot = writes[i];
        }
        r->remaining -= keep;
    }
    s->rows += n;

    /* Retirement: finished requests, and now and then a cancelled one. */
    for (int32_t q = 0; q < s->SLOTS && !s->failed; q++)
        if (s->req[q].live && (s->req[q].remaining <= 0 || uniform(s) < 0.01)) retire(s, &s->req[q]);
}

/* ---- a part: one strategy ---- */

typedef struct part_result {
    double seconds, create_seconds;
    uint64_t mem_warm, mem_min, mem_max, mem_end; /* jemalloc stats.allocated */
    uint64_t lib_allocs_after_warmup;            /* gdn__allocation_count growth after the warm-up */
    int64_t dev_warm, dev_min, dev_max, dev_end;  /* gdn__cuda_live_allocations */
    uint64_t dev_allocs_after_warmup;            /* gdn__cuda_device_allocations growth */
    int warmed;
} part_result;

static void watch_memory(part_result *pr)
{
    const uint64_t m = jemalloc_allocated();
    const int64_t d = device_live();
    if (m < pr->mem_min) pr->mem_min = m;
    if (m > pr->mem_max) pr->mem_max = m;
    if (d < pr->dev_min) pr->dev_min = d;
    if (d > pr->dev_max) pr->dev_max = d;
}

static void run_part(soak *s, gdn_verify_strategy strategy, int64_t steps, part_result *pr)
{
    gdn_model_config model;
    gdn_model_preset(s->opt.preset, s->L, &model);
    gdn_engine_config_init(&s->cfg, &model);
    s->cfg.backend = s->opt.backend;
    s->cfg.state_dtype = s->sd;
    s->cfg.num_slots = s->SLOTS, s->cfg.max_batch = s->MB, s->cfg.max_tokens = s->MT;
    s->cfg.verify_strategy = strategy;
    s->cfg.ring_length = s->opt.ring_length;
    s->cfg.graph_mode = s->opt.graphs;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gdn_status st = gdn_engine_create(&s->cfg, &s->e);
    pr->create_seconds = seconds_since(&t0);
    if (st == GDN_ENODEV) {
        fprintf(stderr, "gdn-soak: the CUDA backend is not available (gdn_engine_create: GDN_ENODEV: %s)\n",
                gdn_status_string(st));
        s->no_device = 1;
        s->failed = 1;
        return;
    }
    if (st != GDN_OK) {
        failf(s, "engine_create: %s", gdn_status_name(st));
        return;
    }
    s->cfg = *gdn_engine_get_config(s->e);
    for (int32_t l = 0; l < s->L; l++) {
        float *A_log = s->A_log + (size_t)l * s->HV, *dt_bias = s->dt_bias + (size_t)l * s->HV;
        for (int32_t h = 0; h < s->HV; h++) A_log[h] = (float)(0.1 * normal(s)), dt_bias[h] = (float)(0.1 * normal(s));
        CHECK(s, gdn_engine_set_layer_params(s->e, l, A_log, dt_bias));
    }
    for (int32_t q = 0; q < s->SLOTS; q++) s->req[q].live = 0;
    const int64_t warmup = steps / 20 > 200 ? steps / 20 : (steps < 200 ? steps / 2 : 200);
    uint64_t lib_allocs_warm = 0, dev_allocs_warm = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < steps && !s->failed; i++) {
        step(s);
        if (i + 1 == warmup) {
            pr->mem_warm = pr->mem_min = pr->mem_max = jemalloc_allocated();
            pr->dev_warm = pr->dev_min = pr->dev_max = device_live();
            lib_allocs_warm = gdn__allocation_count();
            dev_allocs_warm = device_made();
            pr->warmed = 1;
        }
        /* Random state checks: one live request now and then, all of them rarely. */
        const double u = uniform(s);
        if (u < 0.03 || i + 1 == steps) {
            for (int32_t q = 0; q < s->SLOTS && !s->failed; q++)
                if (s->req[q].live && (u < 0.002 || i + 1 == steps || below(s, 4) == 0)) check_state(s, &s->req[q], q);
            if (i + 1 > warmup) watch_memory(pr);
        }
        if (!s->opt.quiet && (i + 1) % 10000 == 0) {
            fprintf(stderr, "  %lld / %lld steps\n", (long long)(i + 1), (long long)steps);
        }
    }
    pr->seconds = seconds_since(&t0);
    if (!pr->warmed) { /* a run cut short by a failure */
        pr->mem_warm = pr->mem_min = pr->mem_max = jemalloc_allocated();
        pr->dev_warm = pr->dev_min = pr->dev_max = device_live();
        lib_allocs_warm = gdn__allocation_count(), dev_allocs_warm = device_made();
    }
    pr->mem_end = jemalloc_allocated();
    pr->dev_end = device_live();
    watch_memory(pr);
    pr->lib_allocs_after_warmup = gdn__allocation_count() - lib_allocs_warm;
    pr->dev_allocs_after_warmup = device_made() - dev_allocs_warm;
    if (!s->failed) {
        st = gdn_engine_check_device_error(s->e, NULL);
        if (st != GDN_OK) failf(s, "device error flag: %s", gdn_status_name(st));
        int32_t live = 0;
        for (int32_t q = 0; q < s->SLOTS; q++) live += s->req[q].live;
        if (gdn_slot_count(s->e) != live) failf(s, "slot_count %d, live requests %d", gdn_slot_count(s->e), live);
    }
    gdn_engine_destroy(s->e);
    s->e = NULL;
}

/* ---- setup ---- */

static void usage(void)
{
    fprintf(stderr,
            "usage: gdn-soak [--steps N] [--seed S] [--verify cache|fold|ring|all] [--state f32|bf16] [--quiet]\n"
            "                [--backend cpu|cuda] [--preset tiny|qwen3-next|qwen3.5] [--layers L] [--slots N]\n"
            "                [--max-batch B] [--max-tokens T] [--ring-length R] [--heads H] [--threads N]\n"
            "                [--graphs lazy|at-create|off]\n");
}

/* Parses the options over the mode's defaults (the backend picks them, so it is read first). */
static int parse_options(int argc, char **argv, options *o)
{
    o->backend = GDN_BACKEND_CPU;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--backend")) {
            if (!strcmp(argv[i + 1], "cuda")) o->backend = GDN_BACKEND_CUDA;
            else if (strcmp(argv[i + 1], "cpu") != 0) return 0;
        }
    const int gpu = o->backend == GDN_BACKEND_CUDA;
    o->steps = 100000, o->seed = 1, o->verify = "all", o->state = "f32";
    o->preset = gpu ? "qwen3-next" : "tiny";
    o->layers = gpu ? 3 : 2, o->slots = gpu ? 32 : 8, o->max_batch = gpu ? 8 : 4, o->max_tokens = gpu ? 8 : 4;
    o->ring_length = gpu ? 8 : 4;
    o->heads = gpu ? 2 : 0; /* 0: every head */
    o->threads = 0;          /* 0: one on the CPU backend, every core on CUDA */
    o->graphs = GDN_GRAPHS_AT_CREATE;
    o->quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (!v) return 0;
        i++;
        if (!strcmp(a, "--steps")) o->steps = (int64_t)strtod(v, NULL);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--verify")) o->verify = v;
        else if (!strcmp(a, "--state")) o->state = v;
        else if (!strcmp(a, "--backend")) continue;
        else if (!strcmp(a, "--preset")) o->preset = v;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--slots")) o->slots = atoi(v);
        else if (!strcmp(a, "--max-batch")) o->max_batch = atoi(v);
        else if (!strcmp(a, "--max-tokens")) o->max_tokens = atoi(v);
        else if (!strcmp(a, "--ring-length")) o->ring_length = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--graphs")) {
            if (!strcmp(v, "lazy")) o->graphs = GDN_GRAPHS_LAZY;
            else if (!strcmp(v, "at-create")) o->graphs = GDN_GRAPHS_AT_CREATE;
            else if (!strcmp(v, "off")) o->graphs = GDN_GRAPHS_OFF;
            else return 0;
        } else return 0;
    }
    gdn_model_config m;
    if (gdn_model_preset(o->preset, 1, &m) != GDN_OK || m.num_v_heads > MAX_HV) return 0;
    if (o->heads < 0 || o->heads > m.num_v_heads) return 0;
    if (o->layers < 1 || o->layers > 16 || o->slots < 2 || o->slots > MAX_SLOTS_CAP || o->max_batch < 1 ||
        o->max_batch > MAX_BATCH_CAP || o->max_tokens < 1 || o->max_tokens > GDN_MAX_TOKENS || o->threads < 0 ||
        o->threads > MAX_THREADS || o->steps < 1)
        return 0;
    if (strcmp(o->state, "f32") != 0 && strcmp(o->state, "bf16") != 0) return 0;
    return 1;
}

/* Sampled mode: the banks (host), the state bank and the export buffer in backend memory (an
 * allocator of the engine's kind outside the engine: engine/backend_impl.h), the outputs' host copy. */
static gdn_status setup_sampled(soak *s)
{
    const int64_t largest = (int64_t)s->MB * s->MT * (s->HV * s->V > s->HK * s->K ? s->HV * s->V : s->HK * s->K);
    s->bank_normal_len = 16 * largest + 65536;
    s->bank_gate_len = 16 * (int64_t)s->MB * s->MT * s->HV + 65536;
    s->bank_state_len = (int64_t)(s->L + 2) * ((int64_t)s->elems + 65536);
    s->bank_normal = fill_bank(s, s->bank_normal_len, s->id, 1.0);
    s->bank_gate = fill_bank(s, s->bank_gate_len, s->id, 0.1);
    s->bank_state = fill_bank(s, s->bank_state_len, s->sd, 0.1);
    const size_t o_layer_bytes = (size_t)s->MB * s->MT * s->HV * s->V * gdn_dtype_size(s->od);
    s->o_host = malloc(o_layer_bytes * (size_t)s->L);
    s->poison = malloc(o_layer_bytes);
    if (!s->bank_normal || !s->bank_gate || !s->bank_state || !s->o_host || !s->poison) return GDN_ENOMEM;
    memset(s->poison, 0x7f, o_layer_bytes);
    gdn_status st = s->opt.backend == GDN_BACKEND_CUDA ? gdn__backend_cuda_create(0, 0, &s->aux)
                                                       : gdn__backend_cpu_create(0, &s->aux);
    if (st != GDN_OK) return st;
    const size_t ssize = gdn_dtype_size(s->sd), bank_bytes = (size_t)s->bank_state_len * ssize;
    st = s->aux.iface->alloc(s->aux.ctx, bank_bytes, &s->d_bank_state);
    if (st == GDN_OK) st = s->aux.iface->alloc(s->aux.ctx, s->elems * ssize * (size_t)s->L, &s->d_export);
    /* alloc zero-fills on the backend's own stream, which does not wait for the legacy one: wait for the
     * whole device before the upload. */
    if (st == GDN_OK) st = s->aux.iface->synchronize(s->aux.ctx, NULL);
    if (st == GDN_OK) st = s->aux.iface->upload(s->aux.ctx, s->d_bank_state, s->bank_state, bank_bytes, NULL);
    if (st == GDN_OK) st = s->aux.iface->synchronize(s->aux.ctx, NULL);
    return st;
}

static void teardown_sampled(soak *s)
{
    if (s->aux.iface) {
        s->aux.iface->free(s->aux.ctx, s->d_bank_state);
        s->aux.iface->free(s->aux.ctx, s->d_export);
        s->aux.iface->destroy(s->aux.ctx);
    }
    free(s->bank_normal), free(s->bank_gate), free(s->bank_state), free(s->o_host), free(s->poison);
}

int main(int argc, char **argv)
{
    static soak s; /* large (the requests); zero-initialised */
    options *o = &s.opt;
    if (!parse_options(argc, argv, o)) {
        usage();
        return 2;
    }
    struct timespec wall0;
    clock_gettime(CLOCK_MONOTONIC, &wall0);
    gdn_verify_strategy strategies[3];
    const char *names[3];
    int nparts = 0;
    const char *verify = o->verify;
    if (!strcmp(verify, "all") || !strcmp(verify, "cache")) strategies[nparts] = GDN_VERIFY_CACHE, names[nparts++] = "cache";
    if (!strcmp(verify, "all") || !strcmp(verify, "fold")) strategies[nparts] = GDN_VERIFY_FOLD, names[nparts++] = "fold";
    if (!strcmp(verify, "all") || !strcmp(verify, "ring")) strategies[nparts] = GDN_VERIFY_RING, names[nparts++] = "ring";
    if (nparts == 0) {
        usage();
        return 2;
    }
    s.sd = !strcmp(o->state, "bf16") ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
    s.id = GDN_DTYPE_BF16, s.od = GDN_DTYPE_BF16; /* gdn_engine_config_init's */
    s.rng = gdn__rng_seeded(o->seed);
    gdn_model_config model;
    gdn_model_preset(o->preset, o->layers, &model);
    s.L = o->layers, s.SLOTS = o->slots, s.MB = o->max_batch, s.MT = o->max_tokens;
    s.HK = model.num_k_heads, s.HV = model.num_v_heads, s.K = model.head_dim_k, s.V = model.head_dim_v;
    s.H = o->heads ? o->heads : s.HV;
    s.sampled = s.H < s.HV || o->backend != GDN_BACKEND_CPU;
    s.vk = (size_t)s.V * s.K;
    s.elems = (size_t)s.HV * s.vk;
    s.token_doubles = 2 * (size_t)s.HK * s.K + (size_t)s.HV * s.V + 2 * (size_t)s.HV;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s.nthreads = o->threads ? o->threads : (o->backend == GDN_BACKEND_CPU ? 1 : (int)(cores < 1 ? 1 : cores));
    if (s.nthreads > MAX_THREADS) s.nthreads = MAX_THREADS;
    pthread_mutex_init(&s.mu, NULL), pthread_mutex_init(&s.fail_mu, NULL);
    pthread_cond_init(&s.go, NULL), pthread_cond_init(&s.done, NULL);

    /* Everything the soak needs, before the first step. */
    int ok_alloc = 1;
    for (int32_t q = 0; q < s.SLOTS; q++) {
        s.req[q].state = calloc((size_t)s.H * s.vk * (size_t)s.L, sizeof(double));
        for (int32_t h = 0; h < s.HV; h++) s.req[q].heads[h] = h;
        ok_alloc &= s.req[q].state != NULL;
    }
    s.A_log = calloc((size_t)s.L * s.HV, sizeof(float));
    s.dt_bias = calloc((size_t)s.L * s.HV, sizeof(float));
    s.raw = malloc(s.elems * 4 * (size_t)s.L);
    s.staging_bytes = (size_t)s.MB * s.MT * (size_t)s.HV * s.V * 4 + s.elems * 4 * (size_t)s.L;
    s.staging = malloc(s.staging_bytes);
    if (!s.sampled) s.in = calloc((size_t)s.L * s.MB * s.MT * s.token_doubles, sizeof(double));
    ok_alloc &= s.A_log && s.dt_bias && s.raw && s.staging && (s.sampled || s.in);
    for (int t = 0; t < s.nthreads; t++) {
        worker *w = &s.workers[t];
        w->s = &s;
        w->S = malloc(sizeof(double) * (size_t)s.H * s.vk);
        w->out = malloc(sizeof(double) * (size_t)s.MT * s.H * s.V);
        ok_alloc &= w->S && w->out;
    }
    if (!ok_alloc) {
        fprintf(stderr, "gdn-soak: out of host memory\n");
        return 1;
    }
    const char *graphs = o->graphs == GDN_GRAPHS_LAZY ? "lazy" : (o->graphs == GDN_GRAPHS_OFF ? "off" : "at-create");
    printf("gdn-soak: %lld steps, seed %llu, verify %s, state %s, %s preset, %d layers, %d slots, max_batch %d, "
           "max_tokens %d, ring_length %d, %s backend",
           (long long)o->steps, (unsigned long long)o->seed, verify, o->state, o->preset, s.L, s.SLOTS, s.MB, s.MT,
           o->ring_length, o->backend == GDN_BACKEND_CUDA ? "CUDA" : "CPU");
    if (o->backend == GDN_BACKEND_CUDA) printf(", graphs %s", graphs);
    if (s.sampled) printf(", model tracks %d of %d value heads per request, %d model threads", s.H, s.HV, s.nthreads);
    printf("\n");
    fflush(stdout);

    /* The CUDA backend must be there before anything is set up for it: a small engine asks. */
    if (o->backend == GDN_BACKEND_CUDA) {
        gdn_model_config tiny;
        gdn_engine_config probe;
        gdn_model_preset("tiny", 1, &tiny);
        gdn_engine_config_init(&probe, &tiny);
        probe.backend = GDN_BACKEND_CUDA, probe.graph_mode = GDN_GRAPHS_OFF;
        probe.num_slots = 2, probe.max_batch = 1, probe.max_tokens = 1;
        gdn_engine *e = NULL;
        const gdn_status st = gdn_engine_create(&probe, &e);
        gdn_engine_destroy(e);
        if (st == GDN_ENODEV) {
            fprintf(stderr, "gdn-soak: the CUDA backend is not available: gdn_engine_create returned GDN_ENODEV (%s)\n",
                    gdn_status_string(st));
            printf("gdn-soak: FAIL (no CUDA device)\n");
            return 3;
        }
        if (st != GDN_OK) {
            fprintf(stderr, "gdn-soak: a CUDA engine could not be created: %s\n", gdn_status_name(st));
            return 1;
        }
    }
    if (s.sampled) {
        const gdn_status st = setup_sampled(&s);
        if (st != GDN_OK) {
            fprintf(stderr, "gdn-soak: setting up the banks: %s\n", gdn_status_name(st));
            teardown_sampled(&s);
            return st == GDN_ENODEV ? 3 : 1;
        }
    }
    for (int t = 1; t < s.nthreads; t++)
        if (pthread_create(&s.workers[t].thread, NULL, worker_main, &s.workers[t]) != 0) {
            fprintf(stderr, "gdn-soak: pthread_create failed\n");
            return 1;
        }

    int flat = 1;
    double total = 0;
    for (int p = 0; p < nparts && !s.failed; p++) {
        const int64_t part_steps = o->steps / nparts + (p < o->steps % nparts);
        part_result pr;
        memset(&pr, 0, sizeof pr);
        const int64_t d0 = s.decode_steps, v0 = s.verify_steps;
        const double m0 = s.model_seconds;
        run_part(&s, strategies[p], part_steps, &pr);
        if (s.no_device) break;
        total += pr.seconds;
        const int64_t growth = (int64_t)pr.mem_end - (int64_t)pr.mem_warm;
        /* The CUDA driver's own threads may hold a few transient host allocations when jemalloc is read:
         * HOST_SLACK_CUDA of range is allowed there (a leak of even 8 bytes a step passes it in 8k steps);
         * the library's counters are exact on both backends. */
        const uint64_t slack = o->backend == GDN_BACKEND_CUDA ? HOST_SLACK_CUDA : 0;
        int part_flat = pr.mem_max - pr.mem_min <= slack && pr.lib_allocs_after_warmup == 0;
        if (o->backend == GDN_BACKEND_CUDA) part_flat &= pr.dev_max == pr.dev_min && pr.dev_allocs_after_warmup == 0;
        flat &= part_flat;
        printf("  %-5s %lld steps (%lld decode, %lld verify) in %.1f s (%.2f ms/step, %.1f s of it checking outputs); "
               "host memory after warm-up: %llu bytes, range %llu..%llu, growth %lld bytes; library allocations "
               "after warm-up: %llu",
               names[p], (long long)part_steps, (long long)(s.decode_steps - d0), (long long)(s.verify_steps - v0),
               pr.seconds, 1e3 * pr.seconds / (double)part_steps, s.model_seconds - m0, (unsigned long long)pr.mem_warm,
               (unsigned long long)pr.mem_min, (unsigned long long)pr.mem_max, (long long)growth,
               (unsigned long long)pr.lib_allocs_after_warmup);
        if (o->backend == GDN_BACKEND_CUDA)
            printf("; device allocations live %lld (range %lld..%lld), made after warm-up %llu; engine created in %.1f s",
                   (long long)pr.dev_warm, (long long)pr.dev_min, (long long)pr.dev_max,
                   (unsigned long long)pr.dev_allocs_after_warmup, pr.create_seconds);
        printf(" -> %s\n", part_flat ? "flat" : "GROWS");
        fflush(stdout);
    }
    if (s.nthreads > 1) {
        pthread_mutex_lock(&s.mu);
        s.quit = 1;
        pthread_cond_broadcast(&s.go);
        pthread_mutex_unlock(&s.mu);
        for (int t = 1; t < s.nthreads; t++) pthread_join(s.workers[t].thread, NULL);
    }
    for (int t = 0; t < s.nthreads; t++) {
        const worker *w = &s.workers[t];
        if (w->worst_output > s.worst_output) s.worst_output = w->worst_output;
        s.outputs_checked += w->outputs_checked, s.finite_checked += w->finite_checked;
    }
    if (s.sampled) teardown_sampled(&s);
    const int no_device = s.no_device;
    if (!no_device) {
        printf("  rows %lld (padding %lld), forks %lld, admitted %lld, retired %lld, accepted 0: %lld, all T: %lld, "
               "clamped: %lld; outputs checked %lld, state checks %lld\n",
               (long long)s.rows, (long long)s.padding_rows, (long long)s.forks, (long long)s.admitted,
               (long long)s.retired, (long long)s.accepted_zero, (long long)s.accepted_full,
               (long long)s.accepted_clamped, (long long)s.outputs_checked, (long long)s.state_checks);
        if (s.sampled)
            printf("  untracked outputs checked finite %lld, state checks through export %lld, steps with poisoned "
                   "outputs %lld\n",
                   (long long)s.finite_checked, (long long)s.exports, (long long)s.poisoned_steps);
        printf("  worst output %.3f, worst state %.3f of SPEC 4's tolerance; %.1f s in all (%.1f s of wall time)\n",
               s.worst_output, s.worst_state, total, seconds_since(&wall0));
    }
    const int ok = !s.failed && flat;
    printf("gdn-soak: %s\n", ok ? "PASS"
                                : (no_device ? "FAIL (no CUDA device)"
                                             : (s.failed ? "FAIL (a check failed)" : "FAIL (memory grew)")));
    for (int32_t q = 0; q < s.SLOTS; q++) free(s.req[q].state);
    for (int t = 0; t < s.nthreads; t++) free(s.workers[t].S), free(s.workers[t].out);
    free(s.A_log), free(s.dt_bias), free(s.in), free(s.raw), free(s.staging);
    return ok ? 0 : (no_device ? 3 : 1);
}
