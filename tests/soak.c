/*
 * gdn-soak (issue 17): a long random serving run on the CPU backend against an independent float64
 * model, with host memory watched for growth. Not a Criterion test; scripts/soak.sh runs it.
 *
 *   gdn-soak [--steps N] [--seed S] [--verify cache|fold|ring|all] [--state f32|bf16] [--quiet]
 *
 * tiny preset (HK 2, HV 4, K = V = 64), 2 layers, 8 slots, max_batch 4, max_tokens 4. Each step:
 * arrivals (a reset, written or imported initial state), a random subset of the live requests as rows
 * in random order with explicit padding rows, now and then a fork into a fresh slot, a decode or a
 * verify of 1..4 tokens (run_step, or run_layer per layer in a random order), random accepted counts
 * (0, T, out of range included) and commit, retirement (finished or cancelled requests), so slots are
 * reused all the time. Every output of every step is compared with the model (SPEC 1 per token, in
 * double, straight from gdn__ref_gdn_token); live states are read back at random points and all of
 * them at the end (SPEC 4 tolerances). --verify all (the default) runs the steps in three equal parts,
 * one engine per strategy (cache, fold, ring with ring_length 4: frequent write-backs).
 *
 * Memory: everything the soak itself needs is allocated before the first step. After a warm-up (the
 * first 5% of a part's steps, at least 200) it reads jemalloc's "stats.allocated" (after an "epoch"
 * bump) and the library's allocation counter (gdn__allocation_count) at every state check and at the
 * end of the part, and reports the growth: both must stay flat (the step path allocates nothing).
 * Exit status 0 when every check passed and memory stayed flat, 1 otherwise.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jemalloc/jemalloc.h>

#include "engine/alloc.h"
#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_mixer_ref.h"
#include "kernels/ref/gdn_spec.h"
#include "row_model.h"

enum { LAYERS = 2, SLOTS = 8, MAX_BATCH = 4, MAX_TOKENS = 4, MAX_ROWS = MAX_BATCH };

typedef struct request {
    int live;
    int32_t slot;
    int32_t remaining;
    double *state; /* [LAYERS][elems] */
} request;

typedef struct soak {
    gdn_engine *e;
    gdn_engine_config cfg;
    gdn__rng rng;
    gdn_dtype sd;
    int32_t HK, HV, K, V;
    size_t elems;
    float A_log[LAYERS][8], dt_bias[LAYERS][8];
    request req[SLOTS];
    /* preallocated scratch */
    double *S, *out, *in; /* state; outputs [T][HV][V]; inputs of a step [LAYERS][rows][T][...] */
    size_t token_doubles;
    unsigned char *raw, *staging;
    size_t staging_bytes;
    /* statistics */
    int64_t decode_steps, verify_steps, rows, padding_rows, forks, admitted, retired, state_checks, accepted_zero,
        accepted_full, accepted_clamped, outputs_checked;
    double worst_output, worst_state;
    int failed;
    int quiet;
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
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gdn-soak: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    s->failed = 1;
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

/* ---- the model ---- */

static double *row_inputs(soak *s, int32_t layer, int32_t row)
{
    return s->in + ((size_t)layer * MAX_ROWS + (size_t)row) * MAX_TOKENS * s->token_doubles;
}

static void store_state(soak *s, double *dst, const double *src);

/* SPEC 1 for `count` of a row's T tokens from S; outputs [count][HV][V] into out (may be NULL). When
 * keep_at is not NULL, the state after `keep` tokens (1..count) is stored there as the pool would. */
static void model_tokens(soak *s, int32_t layer, const double *row, int32_t T, int32_t count, double *S, double *out,
                         int32_t keep, double *keep_at)
{
    const test_row_model m = {s->HK, s->HV, s->K, s->V, s->A_log[layer], s->dt_bias[layer], (double)s->cfg.model.scale, 1};
    for (int32_t t = 0; t < count; t++) {
        test_model_token(&m, row, T, t, S, out ? out + (size_t)t * s->HV * s->V : NULL);
        if (keep_at && t + 1 == keep) store_state(s, keep_at, S);
    }
}

static void store_state(soak *s, double *dst, const double *src)
{
    for (size_t j = 0; j < s->elems; j++) dst[j] = round_to(src[j], s->sd);
}

/* ---- requests ---- */

static void random_raw_state(soak *s, unsigned char *raw, double *model)
{
    for (size_t j = 0; j < s->elems; j++) {
        gdn__store_f32(raw, s->sd, (int64_t)j, (float)(0.1 * normal(s)));
        model[j] = gdn__load_f32(raw, s->sd, (int64_t)j);
    }
}

static void admit(soak *s, request *r)
{
    int32_t slot;
    if (gdn_slot_alloc(s->e, &slot) != GDN_OK) return;
    r->live = 1, r->slot = slot, r->remaining = 1 + below(s, 40);
    s->admitted++;
    const double u = uniform(s);
    if (u < 0.3) { /* a fresh request */
        CHECK(s, gdn_slot_reset(s->e, slot, NULL));
        memset(r->state, 0, sizeof(double) * s->elems * LAYERS);
    } else if (u < 0.65) { /* a prefill's final state, through the host */
        for (int32_t l = 0; l < LAYERS; l++) {
            random_raw_state(s, s->raw, r->state + s->elems * (size_t)l);
            CHECK(s, gdn_slot_write_state(s->e, l, slot, s->raw));
        }
    } else { /* a prefill's final state, device-side (all layers in one launch) */
        const size_t bytes = s->elems * gdn_dtype_size(s->sd);
        for (int32_t l = 0; l < LAYERS; l++) random_raw_state(s, s->staging + bytes * (size_t)l, r->state + s->elems * (size_t)l);
        CHECK(s, gdn_slot_import_async(s->e, slot, s->staging, (int64_t)s->elems, NULL));
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
    for (int32_t l = 0; l < LAYERS && !s->failed; l++) {
        CHECK(s, gdn_slot_read_state(s->e, l, r->slot, s->raw));
        const double *m = r->state + s->elems * (size_t)l;
        for (size_t j = 0; j < s->elems; j++) {
            const double got = gdn__load_f32(s->raw, s->sd, (int64_t)j);
            const double ratio = fabs(got - m[j]) / (tol.state_abs + tol.state_rel * fabs(m[j]));
            if (!(ratio <= 1.0)) {
                failf(s, "request %d (slot %d) layer %d element %zu: state %.6g, model %.6g (%.0f%% of tolerance)", q, r->slot,
                      l, j, got, m[j], 100 * ratio);
                return;
            }
            if (ratio > s->worst_state) s->worst_state = ratio;
        }
    }
    s->state_checks++;
}

/* ---- one step ---- */

static void write_inputs(soak *s, int32_t layer, int32_t bucket, int32_t T)
{
    gdn_layer_io io;
    CHECK(s, gdn_engine_layer_io(s->e, layer, &io));
    const gdn_dtype id = s->cfg.input_dtype;
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
            if (row < MAX_ROWS) row_inputs(s, layer, (int32_t)row)[offset[p] + within] = gdn__load_f32(s->staging, id, (int64_t)e);
        }
        CHECK(s, gdn_engine_upload(s->e, dst[p], s->staging, n * isz, NULL));
    }
}

static void step(soak *s)
{
    /* Arrivals (one slot stays free for forks when it can). */
    const int32_t arrivals = below(s, 3);
    for (int32_t a = 0; a < arrivals; a++)
        if (gdn_slot_count(s->e) < SLOTS - 1)
            for (int32_t q = 0; q < SLOTS; q++)
                if (!s->req[q].live) {
                    admit(s, &s->req[q]);
                    break;
                }
    if (s->failed) return;

    /* Rows: live requests in random order, some left out, explicit padding rows. */
    int32_t order[SLOTS], nlive = 0;
    for (int32_t q = 0; q < SLOTS; q++)
        if (s->req[q].live) order[nlive++] = q;
    for (int32_t i = nlive - 1; i > 0; i--) {
        const int32_t j = below(s, i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    int32_t rows[MAX_ROWS], writes[MAX_ROWS], row_req[MAX_ROWS], n = 0;
    for (int32_t k = 0; k < nlive && n < MAX_BATCH; k++) {
        if (uniform(s) < 0.2) continue;
        if (n < MAX_BATCH - 1 && uniform(s) < 0.1) {
            rows[n] = -1, writes[n] = -1, row_req[n] = -1, n++;
            s->padding_rows++;
        }
        const request *r = &s->req[order[k]];
        rows[n] = r->slot, writes[n] = r->slot, row_req[n] = order[k], n++;
    }
    int forked[MAX_ROWS] = {0};
    for (int32_t i = 0; i < n; i++) {
        int32_t fresh;
        if (rows[i] < 0 || uniform(s) > 0.05 || gdn_slot_alloc(s->e, &fresh) != GDN_OK) continue;
        writes[i] = fresh, forked[i] = 1;
        s->forks++;
    }
    const int verify = uniform(s) < 0.5;
    const int32_t T = verify ? 1 + below(s, MAX_TOKENS) : 1;
    gdn_step st = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = n, .slots = rows,
                   .write_slots = writes};
    int32_t bucket = 0;
    CHECK(s, gdn_engine_begin_step(s->e, &st, NULL, &bucket));
    for (int32_t l = 0; l < LAYERS; l++) write_inputs(s, l, bucket, T);
    if (uniform(s) < 0.5) {
        CHECK(s, gdn_engine_run_step(s->e, NULL));
    } else {
        const int32_t first = below(s, LAYERS);
        for (int32_t j = 0; j < LAYERS; j++) CHECK(s, gdn_engine_run_layer(s->e, (first + j) % LAYERS, NULL));
    }
    int32_t accepted[MAX_BATCH] = {0};
    if (verify) {
        for (int32_t i = 0; i < MAX_BATCH; i++) {
            const double u = uniform(s);
            accepted[i] = u < 0.2 ? 0 : (u < 0.45 ? T : (u < 0.5 ? (below(s, 2) ? -3 : T + 2) : below(s, T + 1)));
        }
        CHECK(s, gdn_engine_upload(s->e, gdn_engine_accepted(s->e), accepted, sizeof accepted, NULL));
        CHECK(s, gdn_engine_commit(s->e, NULL));
        s->verify_steps++;
    } else {
        s->decode_steps++;
    }

    /* Outputs and the model, row by row. */
    const gdn__tolerance tol = gdn__spec4_tolerance(s->sd);
    const gdn_dtype od = s->cfg.output_dtype;
    for (int32_t l = 0; l < LAYERS && !s->failed && n > 0; l++) { /* (an empty step writes no outputs) */
        gdn_layer_io io;
        CHECK(s, gdn_engine_layer_io(s->e, l, &io));
        const size_t per_row = (size_t)T * s->HV * s->V;
        for (int32_t i = 0; i < bucket; i++) {
            if (i >= n || rows[i] < 0) { /* padding: zeros */
                for (size_t j = 0; j < per_row; j++)
                    if (gdn__load_f32(io.o, od, (int64_t)(i * per_row + j)) != 0.0f) {
                        failf(s, "layer %d padding row %d output %zu is not zero", l, i, j);
                        return;
                    }
                continue;
            }
            request *r = &s->req[row_req[i]];
            double *model = r->state + s->elems * (size_t)l;
            int32_t keep = verify ? accepted[i] : 1;
            keep = keep < 0 ? 0 : (keep > T ? T : keep);
            /* One pass: every token's outputs, and the state after the kept ones into the model. */
            memcpy(s->S, model, sizeof(double) * s->elems);
            model_tokens(s, l, row_inputs(s, l, i), T, T, s->S, s->out, keep, model);
            for (size_t j = 0; j < per_row; j++) {
                const double got = gdn__load_f32(io.o, od, (int64_t)(i * per_row + j));
                const double want = round_to(s->out[j], od);
                const double ratio = fabs(got - want) / (tol.out_abs + tol.out_rel * fabs(want));
                if (!(ratio <= 1.0)) {
                    failf(s, "layer %d row %d (slot %d) output %zu: %.6g, model %.6g (%.0f%% of tolerance)", l, i, rows[i], j,
                          got, want, 100 * ratio);
                    return;
                }
                if (ratio > s->worst_output) s->worst_output = ratio;
            }
            s->outputs_checked += (int64_t)per_row;
        }
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
    for (int32_t q = 0; q < SLOTS && !s->failed; q++)
        if (s->req[q].live && (s->req[q].remaining <= 0 || uniform(s) < 0.01)) retire(s, &s->req[q]);
}

/* ---- a part: one strategy ---- */

typedef struct part_result {
    double seconds;
    uint64_t mem_warm, mem_min, mem_max, mem_end; /* jemalloc stats.allocated */
    uint64_t lib_allocs_after_warmup;            /* gdn__allocation_count growth after the warm-up */
} part_result;

static void run_part(soak *s, gdn_verify_strategy strategy, int64_t steps, part_result *pr)
{
    gdn_model_config model;
    gdn_model_preset("tiny", LAYERS, &model);
    gdn_engine_config_init(&s->cfg, &model);
    s->cfg.backend = GDN_BACKEND_CPU;
    s->cfg.state_dtype = s->sd;
    s->cfg.num_slots = SLOTS, s->cfg.max_batch = MAX_BATCH, s->cfg.max_tokens = MAX_TOKENS;
    s->cfg.verify_strategy = strategy;
    s->cfg.ring_length = 4;
    gdn_status st = gdn_engine_create(&s->cfg, &s->e);
    if (st != GDN_OK) {
        failf(s, "engine_create: %s", gdn_status_name(st));
        return;
    }
    s->cfg = *gdn_engine_get_config(s->e);
    for (int32_t l = 0; l < LAYERS; l++) {
        for (int32_t h = 0; h < s->HV; h++) s->A_log[l][h] = (float)(0.1 * normal(s)), s->dt_bias[l][h] = (float)(0.1 * normal(s));
        CHECK(s, gdn_engine_set_layer_params(s->e, l, s->A_log[l], s->dt_bias[l]));
    }
    for (int32_t q = 0; q < SLOTS; q++) s->req[q].live = 0;
    const int64_t warmup = steps / 20 > 200 ? steps / 20 : (steps < 200 ? steps / 2 : 200);
    uint64_t lib_allocs_warm = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < steps && !s->failed; i++) {
        step(s);
        if (i + 1 == warmup) {
            pr->mem_warm = pr->mem_min = pr->mem_max = jemalloc_allocated();
            lib_allocs_warm = gdn__allocation_count();
        }
        /* Random state checks: one live request now and then, all of them rarely. */
        const double u = uniform(s);
        if (u < 0.03 || i + 1 == steps) {
            for (int32_t q = 0; q < SLOTS && !s->failed; q++)
                if (s->req[q].live && (u < 0.002 || i + 1 == steps || below(s, 4) == 0)) check_state(s, &s->req[q], q);
            if (i + 1 > warmup) {
                const uint64_t m = jemalloc_allocated();
                if (m < pr->mem_min) pr->mem_min = m;
                if (m > pr->mem_max) pr->mem_max = m;
            }
        }
        if (!s->quiet && (i + 1) % 10000 == 0) {
            fprintf(stderr, "  %lld / %lld steps\n", (long long)(i + 1), (long long)steps);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pr->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    pr->mem_end = jemalloc_allocated();
    if (pr->mem_end < pr->mem_min) pr->mem_min = pr->mem_end;
    if (pr->mem_end > pr->mem_max) pr->mem_max = pr->mem_end;
    pr->lib_allocs_after_warmup = gdn__allocation_count() - lib_allocs_warm;
    if (!s->failed) {
        st = gdn_engine_check_device_error(s->e, NULL);
        if (st != GDN_OK) failf(s, "device error flag: %s", gdn_status_name(st));
        int32_t live = 0;
        for (int32_t q = 0; q < SLOTS; q++) live += s->req[q].live;
        if (gdn_slot_count(s->e) != live) failf(s, "slot_count %d, live requests %d", gdn_slot_count(s->e), live);
    }
    gdn_engine_destroy(s->e);
    s->e = NULL;
}

static void usage(void)
{
    fprintf(stderr, "usage: gdn-soak [--steps N] [--seed S] [--verify cache|fold|ring|all] [--state f32|bf16] [--quiet]\n");
}

int main(int argc, char **argv)
{
    int64_t steps = 100000;
    uint64_t seed = 1;
    const char *verify = "all", *state = "f32";
    soak s;
    memset(&s, 0, sizeof s);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = (int64_t)strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--verify") && i + 1 < argc) verify = argv[++i];
        else if (!strcmp(argv[i], "--state") && i + 1 < argc) state = argv[++i];
        else if (!strcmp(argv[i], "--quiet")) s.quiet = 1;
        else {
            usage();
            return 2;
        }
    }
    gdn_verify_strategy strategies[3];
    const char *names[3];
    int nparts = 0;
    if (!strcmp(verify, "all") || !strcmp(verify, "cache")) strategies[nparts] = GDN_VERIFY_CACHE, names[nparts++] = "cache";
    if (!strcmp(verify, "all") || !strcmp(verify, "fold")) strategies[nparts] = GDN_VERIFY_FOLD, names[nparts++] = "fold";
    if (!strcmp(verify, "all") || !strcmp(verify, "ring")) strategies[nparts] = GDN_VERIFY_RING, names[nparts++] = "ring";
    if (nparts == 0 || (strcmp(state, "f32") && strcmp(state, "bf16")) || steps < 1) {
        usage();
        return 2;
    }
    s.sd = !strcmp(state, "bf16") ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
    s.rng = gdn__rng_seeded(seed);
    gdn_model_config model;
    gdn_model_preset("tiny", LAYERS, &model);
    s.HK = model.num_k_heads, s.HV = model.num_v_heads, s.K = model.head_dim_k, s.V = model.head_dim_v;
    s.elems = (size_t)s.HV * s.V * s.K;
    s.token_doubles = 2 * (size_t)s.HK * s.K + (size_t)s.HV * s.V + 2 * (size_t)s.HV;
    /* Everything the soak needs, before the first step. */
    for (int32_t q = 0; q < SLOTS; q++) s.req[q].state = calloc(s.elems * LAYERS, sizeof(double));
    s.S = malloc(sizeof(double) * s.elems);
    s.out = malloc(sizeof(double) * MAX_TOKENS * (size_t)s.HV * s.V);
    s.in = calloc((size_t)LAYERS * MAX_ROWS * MAX_TOKENS * s.token_doubles, sizeof(double));
    s.raw = malloc(s.elems * 4);
    s.staging_bytes = (size_t)MAX_BATCH * MAX_TOKENS * (size_t)s.HV * s.V * 4 + s.elems * 4 * LAYERS;
    s.staging = malloc(s.staging_bytes);

    printf("gdn-soak: %lld steps, seed %llu, verify %s, state %s, tiny preset, %d layers, %d slots, max_batch %d, "
           "max_tokens %d, CPU backend\n",
           (long long)steps, (unsigned long long)seed, verify, state, LAYERS, SLOTS, MAX_BATCH, MAX_TOKENS);
    int flat = 1;
    double total = 0;
    for (int p = 0; p < nparts && !s.failed; p++) {
        const int64_t part_steps = steps / nparts + (p < steps % nparts);
        part_result pr;
        memset(&pr, 0, sizeof pr);
        const int64_t d0 = s.decode_steps, v0 = s.verify_steps;
        run_part(&s, strategies[p], part_steps, &pr);
        total += pr.seconds;
        const int64_t growth = (int64_t)pr.mem_end - (int64_t)pr.mem_warm;
        const int part_flat = pr.mem_max == pr.mem_min && pr.lib_allocs_after_warmup == 0;
        flat &= part_flat;
        printf("  %-5s %lld steps (%lld decode, %lld verify) in %.1f s (%.2f ms/step); host memory after warm-up: "
               "%llu bytes, range %llu..%llu, growth %lld bytes; library allocations after warm-up: %llu -> %s\n",
               names[p], (long long)part_steps, (long long)(s.decode_steps - d0), (long long)(s.verify_steps - v0),
               pr.seconds, 1e3 * pr.seconds / (double)part_steps, (unsigned long long)pr.mem_warm,
               (unsigned long long)pr.mem_min, (unsigned long long)pr.mem_max, (long long)growth,
               (unsigned long long)pr.lib_allocs_after_warmup, part_flat ? "flat" : "GROWS");
    }
    printf("  rows %lld (padding %lld), forks %lld, admitted %lld, retired %lld, accepted 0: %lld, all T: %lld, "
           "clamped: %lld; outputs checked %lld, state checks %lld\n",
           (long long)s.rows, (long long)s.padding_rows, (long long)s.forks, (long long)s.admitted, (long long)s.retired,
           (long long)s.accepted_zero, (long long)s.accepted_full, (long long)s.accepted_clamped,
           (long long)s.outputs_checked, (long long)s.state_checks);
    printf("  worst output %.3f, worst state %.3f of SPEC 4's tolerance; %.1f s in all\n", s.worst_output, s.worst_state, total);
    const int ok = !s.failed && flat;
    printf("gdn-soak: %s\n", ok ? "PASS" : (s.failed ? "FAIL (a check failed)" : "FAIL (host memory grew)"));
    for (int32_t q = 0; q < SLOTS; q++) free(s.req[q].state);
    free(s.S), free(s.out), free(s.in), free(s.raw), free(s.staging);
    return ok ? 0 : 1;
}
