/*
 * gdn-bench --drift: how far a bf16 state drifts from exact arithmetic over thousands of decode steps,
 * when it is rounded to bf16 after every token (the cache strategy: the pool is rewritten by every
 * decode) against the ring strategy (the pool is a checkpoint rewritten once every L tokens; the
 * tokens in between live in the ring as fp32 corrections u and the raw k, a).
 *
 * One layer, `--rows` rows (default 4), `--steps` decode steps (default 4096) with fresh random inputs
 * every step (SPEC 4: q, k, v ~ N(0,1); a, b ~ 0.1 N(0,1); initial state 0.1 N(0,1), bf16), every
 * variant fed the same tokens, against a float64 run of the same tokens from the same initial state
 * that is never rounded (kernels/ref: gdn__ref_head, on host threads). At the checkpoints (256, 1024,
 * 4096 and --steps) it reports, over all rows and heads,
 *   state:  ||S - S_exact|| / ||S_exact||  (Frobenius), S read with gdn_slot_read_state;
 *   output: ||o - o_exact|| / ||o_exact|| of that step's output (fp32 output buffer).
 * Reading a ring slot's state writes its ring back first (one bf16 rounding, the same one any bf16
 * read-out of the state needs) and empties the ring, so each checkpoint adds one write-back to the
 * ring runs and shifts their write-back phase. The floor line is one bf16 rounding of the exact state.
 *
 * Two decay regimes: "fast", SPEC 4's A_log, dt_bias ~ 0.1 N(0,1) (g ~ 0.5: the state forgets fast),
 * and "slow", A_log = 0, dt_bias = -4 (g ~ 0.98, as in trained models), where rounding errors
 * accumulate over ~50 tokens.
 *
 * Variants: cache with bf16 state (rounded every token), the ring with each --ring-length (default 4,
 * 16, 32; ring_write_through -1, so that small --rows keep the ring's own decode), and cache with
 * fp32 state (the arithmetic's own error, for scale). The backend is CUDA when a GPU is present
 * (default geometry qwen3-next), else the CPU backend (default tiny), whose arithmetic is float64 and
 * whose only errors are the stores' roundings.
 *
 *   gdn-bench --drift [--preset NAME] [--rows N] [--steps N] [--ring-length 4,16,32] [--backend auto|cpu|cuda]
 *                     [--json FILE]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_ref.h"

#define MAX_VARIANTS 12
#define MAX_CHECKS 8
#define CHUNK 256

typedef struct dvariant {
    gdn_verify_strategy strategy;
    int32_t ring_length;
    gdn_dtype state;
    char name[40];
} dvariant;

typedef struct dresult {
    double state_rel[MAX_CHECKS], out_rel[MAX_CHECKS];
} dresult;

/* n bf16 values of sigma N(0, 1) into bf (and their exact values into d, if not NULL). */
static void fill_bf16(uint16_t *bf, double *d, int64_t n, double sigma)
{
    for (int64_t i = 0; i < n; i++) {
        bf[i] = gdn__f32_to_bf16((float)(sigma * gdn_bench_rng_normal()));
        if (d) d[i] = gdn__bf16_to_f32(bf[i]);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* The float64 run, on host threads: each (row, head) pair is independent                           */
/* ---------------------------------------------------------------------------------------------- */

typedef struct ref_job {
    int32_t rows, HK, HV, K, V, n; /* n: tokens of this chunk */
    double scale;
    double *S;                     /* [rows][HV][V][K] */
    const double *q, *k, *v;       /* [n][rows][HK][K], [n][rows][HV][V] */
    const double *a, *b;           /* [rows][HV][n] */
    const float *A_log, *dt_bias;
    double *o_last;                /* [rows][HV][V]: output of the chunk's last token */
    int nthreads;
} ref_job;

typedef struct ref_thread {
    const ref_job *job;
    int tid;
    pthread_t th;
    double *out; /* [n][V] scratch */
} ref_thread;

static void *ref_worker(void *arg)
{
    ref_thread *t = arg;
    const ref_job *j = t->job;
    const int32_t pairs = j->rows * j->HV, group = j->HV / j->HK;
    for (int32_t p = t->tid; p < pairs; p += j->nthreads) {
        const int32_t row = p / j->HV, h = p % j->HV, kh = h / group;
        double *S = j->S + (int64_t)p * j->V * j->K;
        const int64_t qk_off = ((int64_t)row * j->HK + kh) * j->K, v_off = ((int64_t)row * j->HV + h) * j->V;
        gdn__ref_head(j->n, j->K, j->V, S, j->q + qk_off, j->k + qk_off, (int64_t)j->rows * j->HK * j->K, j->v + v_off,
                      (int64_t)j->rows * j->HV * j->V, j->a + (int64_t)p * j->n, j->b + (int64_t)p * j->n, j->A_log[h],
                      j->dt_bias[h], j->scale, 1, t->out, j->V, NULL, NULL);
        memcpy(j->o_last + (int64_t)p * j->V, t->out + (int64_t)(j->n - 1) * j->V, sizeof(double) * (size_t)j->V);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Main                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: gdn-bench --drift [--preset NAME] [--rows N] [--steps N] [--ring-length 4,16,32] "
                    "[--backend auto|cpu|cuda] [--json FILE]\n");
}

static double rel_rms(double err2, double ref2) { return ref2 > 0 ? sqrt(err2 / ref2) : NAN; }

int gdn_bench_drift_main(int argc, char **argv)
{
    const char *preset = NULL, *json = NULL, *backend_arg = "auto";
    int rows = 4, steps = 4096, rings[8] = {4, 16, 32}, nrings = 3;
    gdn_bench_rng_seed(0x2545f4914f6cdd1dull);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--preset")) preset = v, i++;
        else if (!strcmp(a, "--rows")) rows = atoi(v), i++;
        else if (!strcmp(a, "--steps")) steps = atoi(v), i++;
        else if (!strcmp(a, "--ring-length")) nrings = bench_parse_list(v, rings, 8), i++;
        else if (!strcmp(a, "--backend")) backend_arg = v, i++;
        else if (!strcmp(a, "--json")) json = v, i++;
        else {
            usage();
            return 2;
        }
    }
    if (rows < 1 || steps < 1 || nrings < 0) {
        usage();
        return 2;
    }
    int ndev = 0;
    const int have_gpu = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
    if (!have_gpu) cudaGetLastError();
    gdn_backend_kind backend = !strcmp(backend_arg, "cpu")    ? GDN_BACKEND_CPU
                               : !strcmp(backend_arg, "cuda") ? GDN_BACKEND_CUDA
                               : have_gpu                     ? GDN_BACKEND_CUDA
                                                              : GDN_BACKEND_CPU;
    if (!preset) preset = backend == GDN_BACKEND_CUDA ? "qwen3-next" : "tiny";
    gdn_model_config model;
    if (gdn_model_preset(preset, 1, &model) != GDN_OK) {
        fprintf(stderr, "unknown preset %s\n", preset);
        return 2;
    }
    const int32_t HK = model.num_k_heads, HV = model.num_v_heads, K = model.head_dim_k, V = model.head_dim_v;
    if (HV > 256) {
        fprintf(stderr, "drift: at most 256 value heads\n");
        return 2;
    }
    char device[320] = "CPU backend (float64 arithmetic, roundings only at the stores)";
    if (backend == GDN_BACKEND_CUDA) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
            fprintf(stderr, "no CUDA device\n");
            return 2;
        }
        snprintf(device, sizeof device, "CUDA backend, %s (fp32 arithmetic)", prop.name);
    }

    /* Variants. */
    dvariant vars[MAX_VARIANTS];
    int nvars = 0;
    vars[nvars++] = (dvariant){GDN_VERIFY_CACHE, 0, GDN_DTYPE_BF16, "bf16, rounded every token"};
    for (int j = 0; j < nrings && nvars < MAX_VARIANTS - 1; j++) {
        vars[nvars] = (dvariant){GDN_VERIFY_RING, rings[j], GDN_DTYPE_BF16, ""};
        snprintf(vars[nvars].name, sizeof vars[nvars].name, "bf16, ring L=%d", rings[j]);
        nvars++;
    }
    vars[nvars++] = (dvariant){GDN_VERIFY_CACHE, 0, GDN_DTYPE_F32, "f32, rounded every token"};

    /* Checkpoints. */
    int checks[MAX_CHECKS], nchecks = 0;
    static const int wanted[] = {256, 1024, 4096};
    for (int j = 0; j < 3; j++)
        if (wanted[j] <= steps) checks[nchecks++] = wanted[j];
    if (!nchecks || checks[nchecks - 1] != steps) checks[nchecks++] = steps;

    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = (int)(nproc < 1 ? 1 : nproc > 64 ? 64 : nproc);
    if (nthreads > rows * HV) nthreads = rows * HV;

    printf("# drift: %s; preset %s (HK %d, HV %d, K %d, V %d), 1 layer, %d rows, %d decode steps, fresh SPEC 4 inputs "
           "every step; float64 reference on %d host threads\n",
           device, preset, HK, HV, K, V, rows, steps, nthreads);
    printf("# relative RMS ||x - x_exact|| / ||x_exact|| over all rows and heads; states read with gdn_slot_read_state "
           "(for a ring slot the read writes the ring back first: one bf16 rounding, and the ring restarts empty)\n");

    const int64_t nS = (int64_t)rows * HV * V * K, nqk = (int64_t)rows * HK * K, nv = (int64_t)rows * HV * V,
                  ng = (int64_t)rows * HV;
    double *S_ref = malloc(sizeof(double) * (size_t)nS), *o_ref = malloc(sizeof(double) * (size_t)nv);
    uint16_t *S0 = malloc(2 * (size_t)nS);
    void *S_read = malloc(4 * (size_t)(HV * V * K));
    float *S0_f32 = malloc(4 * (size_t)nS), *o_eng = malloc(4 * (size_t)nv);
    uint16_t *qb = malloc(2 * (size_t)(CHUNK * nqk)), *kb = malloc(2 * (size_t)(CHUNK * nqk));
    uint16_t *vb = malloc(2 * (size_t)(CHUNK * nv)), *ab = malloc(2 * (size_t)(CHUNK * ng)), *bb = malloc(2 * (size_t)(CHUNK * ng));
    double *qd = malloc(sizeof(double) * (size_t)(CHUNK * nqk)), *kd = malloc(sizeof(double) * (size_t)(CHUNK * nqk));
    double *vd = malloc(sizeof(double) * (size_t)(CHUNK * nv));
    double *ad = malloc(sizeof(double) * (size_t)(CHUNK * ng)), *bd = malloc(sizeof(double) * (size_t)(CHUNK * ng));
    ref_thread *threads = calloc((size_t)nthreads, sizeof *threads);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)rows);
    if (!S_ref || !o_ref || !S0 || !S_read || !S0_f32 || !o_eng || !qb || !kb || !vb || !ab || !bb || !qd || !kd || !vd ||
        !ad || !bd || !threads || !slots) {
        fprintf(stderr, "out of host memory\n");
        return 2;
    }
    for (int t = 0; t < nthreads; t++) threads[t].out = malloc(sizeof(double) * (size_t)CHUNK * (size_t)V);

    static const char *const regime_names[] = {"fast", "slow"};
    static const char *const regime_text[] = {"A_log, dt_bias ~ 0.1 N(0,1) (SPEC 4)", "A_log = 0, dt_bias = -4"};
    dresult results[2][MAX_VARIANTS];
    double floor_rel[2][MAX_CHECKS], g_mean[2];
    float A_log[2][256], dt_bias[2][256];
    memset(results, 0, sizeof results);

    for (int reg = 0; reg < 2; reg++) {
        for (int32_t h = 0; h < HV; h++) {
            A_log[reg][h] = reg == 0 ? (float)(0.1 * gdn_bench_rng_normal()) : 0.0f;
            dt_bias[reg][h] = reg == 0 ? (float)(0.1 * gdn_bench_rng_normal()) : -4.0f;
        }
        /* Initial state (bf16 values, so that every variant and the reference start equal). */
        fill_bf16(S0, S_ref, nS, 0.1);
        for (int64_t i = 0; i < nS; i++) S0_f32[i] = gdn__bf16_to_f32(S0[i]);

        gdn_engine *eng[MAX_VARIANTS] = {0};
        gdn_layer_io io[MAX_VARIANTS];
        double scale = 0;
        for (int vi = 0; vi < nvars; vi++) {
            gdn_engine_config c;
            CHECK_GDN(gdn_engine_config_init(&c, &model));
            c.state_dtype = vars[vi].state;
            c.output_dtype = GDN_DTYPE_F32;
            c.num_slots = rows, c.max_batch = rows, c.max_tokens = 1;
            c.num_buckets = 1, c.buckets[0] = rows;
            c.verify_strategy = vars[vi].strategy;
            c.ring_length = vars[vi].ring_length;
            c.ring_write_through = -1; /* the ring's own decode: rounded at write-backs only */
            c.backend = backend;
            c.graph_mode = GDN_GRAPHS_LAZY;
            const gdn_status st = gdn_engine_create(&c, &eng[vi]);
            if (st != GDN_OK) {
                fprintf(stderr, "drift: engine %s not created: %s\n", vars[vi].name, gdn_status_name(st));
                return 3;
            }
            CHECK_GDN(gdn_engine_set_layer_params(eng[vi], 0, A_log[reg], dt_bias[reg]));
            CHECK_GDN(gdn_engine_layer_io(eng[vi], 0, &io[vi]));
            scale = gdn_engine_get_config(eng[vi])->model.scale;
            for (int r = 0; r < rows; r++) {
                CHECK_GDN(gdn_slot_alloc(eng[vi], &slots[r]));
                const int64_t off = (int64_t)r * HV * V * K;
                CHECK_GDN(gdn_slot_write_state(eng[vi], 0, slots[r],
                                               vars[vi].state == GDN_DTYPE_F32 ? (const void *)(S0_f32 + off)
                                                                               : (const void *)(S0 + off)));
            }
        }
        /* Slots are 0..rows-1 in every engine (fresh engines hand them out in order). */

        double g_sum = 0;
        int64_t g_n = 0;
        int done = 0, ci = 0;
        while (done < steps) {
            int n = steps - done < CHUNK ? steps - done : CHUNK;
            if (done + n > checks[ci]) n = checks[ci] - done;
            /* Inputs of the chunk: bf16 for the engines, their exact values for the reference. */
            fill_bf16(qb, qd, n * nqk, 1.0);
            fill_bf16(kb, kd, n * nqk, 1.0);
            fill_bf16(vb, vd, n * nv, 1.0);
            fill_bf16(ab, NULL, n * ng, 0.1);
            fill_bf16(bb, NULL, n * ng, 0.1);
            for (int t = 0; t < n; t++) /* a, b: [t][row][h] for the engines, [row][h][t] for the reference */
                for (int64_t p = 0; p < ng; p++) {
                    ad[p * n + t] = gdn__bf16_to_f32(ab[t * ng + p]);
                    bd[p * n + t] = gdn__bf16_to_f32(bb[t * ng + p]);
                    g_sum += gdn__ref_decay(ad[p * n + t], A_log[reg][p % HV], dt_bias[reg][p % HV]), g_n++;
                }
            ref_job job = {.rows = rows, .HK = HK, .HV = HV, .K = K, .V = V, .n = n, .scale = scale, .S = S_ref,
                           .q = qd, .k = kd, .v = vd, .a = ad, .b = bd, .A_log = A_log[reg], .dt_bias = dt_bias[reg],
                           .o_last = o_ref, .nthreads = nthreads};
            for (int t = 0; t < nthreads; t++) {
                threads[t].job = &job, threads[t].tid = t;
                if (pthread_create(&threads[t].th, NULL, ref_worker, &threads[t])) {
                    fprintf(stderr, "pthread_create failed\n");
                    return 2;
                }
            }
            const int at_check = done + n == checks[ci];
            for (int t = 0; t < n; t++)
                for (int vi = 0; vi < nvars; vi++) {
                    gdn_engine *e = eng[vi];
                    CHECK_GDN(gdn_engine_upload(e, io[vi].q, qb + (int64_t)t * nqk, 2 * (size_t)nqk, NULL));
                    CHECK_GDN(gdn_engine_upload(e, io[vi].k, kb + (int64_t)t * nqk, 2 * (size_t)nqk, NULL));
                    CHECK_GDN(gdn_engine_upload(e, io[vi].v, vb + (int64_t)t * nv, 2 * (size_t)nv, NULL));
                    CHECK_GDN(gdn_engine_upload(e, io[vi].a, ab + (int64_t)t * ng, 2 * (size_t)ng, NULL));
                    CHECK_GDN(gdn_engine_upload(e, io[vi].b, bb + (int64_t)t * ng, 2 * (size_t)ng, NULL));
                    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = rows, .slots = slots};
                    CHECK_GDN(gdn_engine_begin_step(e, &step, NULL, NULL));
                    CHECK_GDN(gdn_engine_run_step(e, NULL));
                    CHECK_GDN(gdn_engine_synchronize(e, NULL)); /* steps one by one: a plain loop, not a timing */
                }
            /* Outputs of the checkpoint step are read after the reference is done (below): keep them now. */
            float *o_keep = NULL;
            if (at_check) {
                o_keep = malloc(4 * (size_t)nv * (size_t)nvars);
                for (int vi = 0; vi < nvars; vi++) {
                    CHECK_GDN(gdn_engine_download(eng[vi], o_keep + (int64_t)vi * nv, io[vi].o, 4 * (size_t)nv, NULL));
                    CHECK_GDN(gdn_engine_synchronize(eng[vi], NULL));
                }
            }
            for (int t = 0; t < nthreads; t++) pthread_join(threads[t].th, NULL);
            done += n;
            if (!at_check) continue;

            /* Checkpoint: states and outputs against the float64 run. */
            double ref2 = 0, floor2 = 0, oref2 = 0;
            for (int64_t i = 0; i < nS; i++) {
                const double x = S_ref[i], r = gdn__bf16_to_f32(gdn__f32_to_bf16((float)x));
                ref2 += x * x, floor2 += (r - x) * (r - x);
            }
            for (int64_t i = 0; i < nv; i++) oref2 += o_ref[i] * o_ref[i];
            floor_rel[reg][ci] = rel_rms(floor2, ref2);
            for (int vi = 0; vi < nvars; vi++) {
                double err2 = 0, oerr2 = 0;
                for (int r = 0; r < rows; r++) {
                    CHECK_GDN(gdn_slot_read_state(eng[vi], 0, slots[r], S_read));
                    const double *x = S_ref + (int64_t)r * HV * V * K;
                    for (int64_t i = 0; i < (int64_t)HV * V * K; i++) {
                        const double d = gdn__load_f32(S_read, vars[vi].state, i) - x[i];
                        err2 += d * d;
                    }
                }
                for (int64_t i = 0; i < nv; i++) {
                    const double d = o_keep[(int64_t)vi * nv + i] - o_ref[i];
                    oerr2 += d * d;
                }
                results[reg][vi].state_rel[ci] = rel_rms(err2, ref2);
                results[reg][vi].out_rel[ci] = rel_rms(oerr2, oref2);
            }
            free(o_keep);
            fprintf(stderr, "drift: %s regime, step %d\n", regime_names[reg], done);
            ci++;
        }
        g_mean[reg] = g_n ? g_sum / (double)g_n : NAN;
        for (int vi = 0; vi < nvars; vi++) {
            CHECK_GDN(gdn_engine_check_device_error(eng[vi], NULL));
            gdn_engine_destroy(eng[vi]);
        }

        printf("\nregime %s: %s; mean decay g %.3f\n", regime_names[reg], regime_text[reg], g_mean[reg]);
        printf("%-28s | state rel RMS at step", "variant");
        for (int j = 0; j < nchecks; j++) printf(" %9d", checks[j]);
        printf(" | output rel RMS at step");
        for (int j = 0; j < nchecks; j++) printf(" %9d", checks[j]);
        printf("\n");
        for (int vi = 0; vi < nvars; vi++) {
            printf("%-28s | %21s", vars[vi].name, "");
            for (int j = 0; j < nchecks; j++) printf(" %9.2e", results[reg][vi].state_rel[j]);
            printf(" | %22s", "");
            for (int j = 0; j < nchecks; j++) printf(" %9.2e", results[reg][vi].out_rel[j]);
            printf("\n");
        }
        printf("%-28s | %21s", "(one bf16 rounding: floor)", "");
        for (int j = 0; j < nchecks; j++) printf(" %9.2e", floor_rel[reg][j]);
        printf(" |\n");
        fflush(stdout);
    }

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"mode\": \"drift\", \"device\": \"%s\", \"preset\": \"%s\", \"rows\": %d, \"steps\": %d, \"checkpoints\": [",
                device, preset, rows, steps);
        for (int j = 0; j < nchecks; j++) fprintf(f, "%d%s", checks[j], j + 1 < nchecks ? ", " : "");
        fprintf(f, "],\n \"regimes\": [\n");
        for (int reg = 0; reg < 2; reg++) {
            fprintf(f, "  {\"name\": \"%s\", \"params\": \"%s\", \"g_mean\": %.5f, \"floor_state_rel\": [", regime_names[reg],
                    regime_text[reg], g_mean[reg]);
            for (int j = 0; j < nchecks; j++) fprintf(f, "%.4e%s", floor_rel[reg][j], j + 1 < nchecks ? ", " : "");
            fprintf(f, "], \"variants\": [\n");
            for (int vi = 0; vi < nvars; vi++) {
                fprintf(f, "    {\"name\": \"%s\", \"strategy\": \"%s\", \"ring_length\": %d, \"state\": \"%s\", \"state_rel\": [",
                        vars[vi].name, vars[vi].strategy == GDN_VERIFY_RING ? "ring" : "cache", vars[vi].ring_length,
                        vars[vi].state == GDN_DTYPE_F32 ? "f32" : "bf16");
                for (int j = 0; j < nchecks; j++) fprintf(f, "%.4e%s", results[reg][vi].state_rel[j], j + 1 < nchecks ? ", " : "");
                fprintf(f, "], \"out_rel\": [");
                for (int j = 0; j < nchecks; j++) fprintf(f, "%.4e%s", results[reg][vi].out_rel[j], j + 1 < nchecks ? ", " : "");
                fprintf(f, "]}%s\n", vi + 1 < nvars ? "," : "");
            }
            fprintf(f, "  ]}%s\n", reg == 0 ? "," : "");
        }
        fprintf(f, " ]\n}\n");
        fclose(f);
    }
    for (int t = 0; t < nthreads; t++) free(threads[t].out);
    free(S_ref), free(o_ref), free(S0), free(S_read), free(S0_f32), free(o_eng), free(qb), free(kb), free(vb), free(ab);
    free(bb), free(qd), free(kd), free(vd), free(ad), free(bd), free(threads), free(slots);
    return 0;
}
