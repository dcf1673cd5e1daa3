/*
 * gdn-bench --engine: the engine's whole step (SPEC 5, issue 4). A model of 36 GDN layers (--preset, qwen3-next by default)
 * on the CUDA backend with graphs captured at creation; for each bucket and T it reports
 *   - host us per step: begin_step + run_step (+ commit for verify) as the serving loop calls them,
 *     each step timed alone inside bursts of --host-burst steps (default 12) after a sync (the ring
 *     holds 64, so no call waits for the ring): median and 90th percentile, and the median of the
 *     commit call alone;
 *   - GPU us per step, replaying the step's graph (index upload included);
 *   - the same step as 36 direct launches (gdn_engine_run_layer per layer);
 *   - the sum of the single-layer kernel times: the 36 direct launches queued behind a spin kernel, so
 *     the GPU runs them back to back with no host launch gaps;
 * and the ratio graph / sum (target <= 1.05) and host us (target <= 5).
 *
 * The ring strategy (--verify ring, --ring-length L): a row's decode costs depend on its ring's fill
 * level (every L-th decode of a row writes its state back). Before a bucket's decode or verify is
 * timed its slots are reset and staggered (row i joins the first L steps of that kind only after
 * floor(i L / bucket) of them, which leaves the rows at fill levels spread over 0..L-1 for decodes,
 * and writing back in different steps), and every GPU sample is a whole number of L steps (at least
 * 8), reported as the MEAN per step over the samples, so that the write-backs count at their true
 * rate (verify rows: accepted 1 or 2 alternately, so their write-backs come every few steps).
 * The other strategies keep their medians of 8-step samples (one step for direct launches).
 *
 *   gdn-bench --engine [--state f32|bf16] [--layers N] [--max-batch N] [--tokens 1,2,4] [--host-burst N]
 *                      [--verify auto|cache|fold|ring] [--ring-length L] [--ring-write-through N]
 *                      [--mixer | --separate] [--bucket N]
 *                      [--mixer-parts conv|norm] [--json FILE]
 * --mixer: every layer runs the whole mixer step (SPEC 6: conv W = 4 with its window, the recurrence,
 * the gated norm; random bf16 conv weights and bias, norm weights near 1). --mixer-parts conv or norm
 * keeps that part alone (with --mixer), to see what each costs.
 * --separate: the same work as separate kernels, the fused step's baseline (issue 15): the engine
 * runs the recurrence only, and its step graph (a capture callback, graphs captured lazily) holds per
 * layer a conv kernel (into q, k, v; a decode moves the window), the layer, and a gated-norm kernel
 * (bench_separate.cu). Only the graph column includes them: the direct and kernel-sum columns run
 * the recurrence alone.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"


static double now_us(void) { return 1e6 * bench_now_s(); }
static double median_of(double *v, int n) { return bench_median(v, n); }

typedef struct engine_row {
    int32_t bucket, tokens;
    double host_us, host_p90_us, commit_host_us, graph_us, direct_us, kernel_sum_us;
} engine_row;

/* One step as the serving loop issues it; *commit_us (if not NULL) gets the host time of the commit
 * call alone (0 for a decode). */
static int issue_step_timed(gdn_engine *e, const int32_t *slots, int32_t batch, int32_t tokens, cudaStream_t s,
                            double *commit_us)
{
    gdn_step step = {.kind = tokens == 1 ? GDN_STEP_DECODE : GDN_STEP_VERIFY, .tokens = tokens, .batch = batch, .slots = slots};
    CHECK_GDN(gdn_engine_begin_step(e, &step, s, NULL));
    CHECK_GDN(gdn_engine_run_step(e, s));
    const double t0 = commit_us ? now_us() : 0;
    if (tokens > 1) CHECK_GDN(gdn_engine_commit(e, s));
    if (commit_us) *commit_us = tokens > 1 ? now_us() - t0 : 0;
    return 0;
}

static int issue_step(gdn_engine *e, const int32_t *slots, int32_t batch, int32_t tokens, cudaStream_t s)
{
    return issue_step_timed(e, slots, batch, tokens, s, NULL);
}

/* The same step as direct launches, one per layer. */
static int issue_direct(gdn_engine *e, const int32_t *slots, int32_t batch, int32_t tokens, int32_t layers, cudaStream_t s)
{
    gdn_step step = {.kind = tokens == 1 ? GDN_STEP_DECODE : GDN_STEP_VERIFY, .tokens = tokens, .batch = batch, .slots = slots};
    CHECK_GDN(gdn_engine_begin_step(e, &step, s, NULL));
    for (int32_t l = 0; l < layers; l++) CHECK_GDN(gdn_engine_run_layer(e, l, s));
    if (tokens > 1) CHECK_GDN(gdn_engine_commit(e, s));
    return 0;
}

typedef enum timed_work { TIMED_STEPS, TIMED_DIRECT } timed_work;

/* How GPU time is sampled. Cache and fold: 20 samples of 8 whole steps (graph replays) or of one
 * step (direct launches), median. Ring: samples of a whole number of L steps (at least 8) for both,
 * their mean (see the file comment): about 160 graph-replayed steps in all, and about 48 steps for
 * each direct-launch measurement (at least 2 samples; they matter less, and cost 36 launches a step). */
typedef struct sample_plan {
    int graph_steps, direct_steps, graph_reps, direct_reps, mean;
} sample_plan;

static const sample_plan plain_plan = {8, 1, 20, 20, 0};

static sample_plan ring_plan(int32_t ring_length)
{
    const int steps = ring_length >= 8 ? ring_length : ring_length * ((8 + ring_length - 1) / ring_length);
    const int graph_reps = 160 / steps < 5 ? 5 : 160 / steps, direct_reps = 48 / steps < 2 ? 2 : 48 / steps;
    return (sample_plan){steps, steps, graph_reps, direct_reps, 1};
}

/* GPU time per step (CUDA events) of `work` sampled as `plan` says; behind_spin queues the work behind
 * a 2 ms kernel first, so the GPU runs it back to back with no host launch gaps. */
static int time_on_gpu(gdn_engine *e, const int32_t *slots, int32_t bucket, int32_t tokens, int32_t layers,
                       cudaStream_t s, timed_work work, int behind_spin, const sample_plan *plan, double *median_us)
{
    enum { MAX_REPS = 64 };
    const int steps = work == TIMED_STEPS ? plan->graph_steps : plan->direct_steps;
    const int reps = work == TIMED_STEPS ? plan->graph_reps : plan->direct_reps;
    const int REPS = reps < MAX_REPS ? reps : MAX_REPS;
    double samples[MAX_REPS];
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    for (int r = 0; r < REPS; r++) {
        CHECK_CUDA(cudaStreamSynchronize(s));
        if (behind_spin && gdn_bench_spin(s, 2.0)) return -1;
        CHECK_CUDA(cudaEventRecord(start, s));
        for (int i = 0; i < steps; i++) {
            const int failed = work == TIMED_STEPS ? issue_step(e, slots, bucket, tokens, s)
                                                   : issue_direct(e, slots, bucket, tokens, layers, s);
            if (failed) return -1;
        }
        CHECK_CUDA(cudaEventRecord(stop, s));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        samples[r] = 1000.0 * ms / steps;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    double sum = 0;
    for (int r = 0; r < REPS; r++) sum += samples[r];
    *median_us = plan->mean ? sum / REPS : median_of(samples, REPS);
    return 0;
}

/* Ring strategy: resets the bucket's slots (state and ring emptied), then runs L steps of the row's
 * kind (decode, or verify + commit of `tokens`) in which row i joins only from step floor(i L / bucket)
 * on (the others are padding rows), so that the rows' fill levels end spread (decodes: over 0..L-1,
 * distinct when bucket <= L) and their write-backs fall in different steps, as a serving loop's rows
 * do. Without it a verify row would start from whatever the row before it left: after decodes that
 * write through, every ring empty and the rows writing back in the same steps. */
static int stagger_ring(gdn_engine *e, const int32_t *slots, int32_t bucket, int32_t tokens, int32_t ring_length,
                        cudaStream_t s)
{
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)bucket);
    if (!rows) return -1;
    for (int32_t i = 0; i < bucket; i++) CHECK_GDN(gdn_slot_reset(e, slots[i], s));
    for (int32_t j = 0; j < ring_length; j++) {
        int live = 0;
        for (int32_t i = 0; i < bucket; i++) {
            const int32_t join = (int32_t)((int64_t)i * ring_length / bucket);
            rows[i] = j >= join ? slots[i] : -1;
            live += rows[i] >= 0;
        }
        if (live && issue_step(e, rows, bucket, tokens, s)) return -1;
    }
    free(rows);
    return 0;
}

/* Steps issued back to back between syncs when timing the host (--host-burst): 12 queues up to 12
 * steps of GPU work; a serving loop that waits for each step's sampled tokens runs 1 or 2 ahead. */
static int host_burst = 12;

/* Ring length when the engine runs the ring strategy, else 0. */
static int32_t ring_length_of(const gdn_engine *e)
{
    const gdn_engine_config *c = gdn_engine_get_config(e);
    return c->verify_strategy == GDN_VERIFY_RING ? c->ring_length : 0;
}

static int measure(gdn_engine *e, const int32_t *slots, int32_t bucket, int32_t tokens, int32_t layers, cudaStream_t s,
                   engine_row *row)
{
    enum { SAMPLES = 372 };
    const int BURST = host_burst, BURSTS = SAMPLES / host_burst;
    for (int w = 0; w < 3; w++)
        if (issue_step(e, slots, bucket, tokens, s)) return -1;
    CHECK_CUDA(cudaStreamSynchronize(s));

    /* Host time: every step of bursts that stay well inside the staging ring, each burst after a
     * sync, timed one by one; the median of all of them (and the 90th percentile). */
    double host[SAMPLES], commit[SAMPLES];
    int n_host = 0;
    for (int b = 0; b < BURSTS; b++) {
        CHECK_CUDA(cudaStreamSynchronize(s));
        for (int i = 0; i < BURST; i++) {
            const double t0 = now_us();
            if (issue_step_timed(e, slots, bucket, tokens, s, &commit[n_host])) return -1;
            host[n_host++] = now_us() - t0;
        }
    }
    row->host_us = median_of(host, n_host); /* sorts host[] */
    row->host_p90_us = host[(int)(0.9 * (n_host - 1))];
    row->commit_host_us = median_of(commit, n_host);

    const int32_t ring_length = ring_length_of(e);
    const sample_plan plan = ring_length ? ring_plan(ring_length) : plain_plan;
    if (ring_length && stagger_ring(e, slots, bucket, tokens, ring_length, s)) return -1;
    /* GPU time per step: graph replays (with their row fetches) queued behind a spin kernel. */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_STEPS, 1, &plan, &row->graph_us)) return -1;
    /* The same step as direct launches, as the host issues them (launch gaps included). */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_DIRECT, 0, &plan, &row->direct_us)) return -1;
    /* Sum of single-layer kernel times: the direct launches queued behind a spin kernel. */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_DIRECT, 1, &plan, &row->kernel_sum_us)) return -1;
    return 0;
}

/* Random bf16 inputs in every layer's buffers (the timing does not depend on their values, but
 * zeros are never timed). */
int gdn_bench_fill_inputs(gdn_engine *e, const gdn_engine_config *c)
{
    const size_t rows = (size_t)c->max_batch * (size_t)c->max_tokens;
    const size_t n_v = rows * (size_t)c->model.num_v_heads * (size_t)c->model.head_dim_v;
    uint16_t *host = malloc(n_v * sizeof(uint16_t));
    if (!host) return -1;
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n_v; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        host[i] = gdn__f32_to_bf16((float)((double)(x >> 11) / 9007199254740992.0 - 0.5));
    }
    const size_t n_qk = rows * (size_t)c->model.num_k_heads * (size_t)c->model.head_dim_k;
    const size_t n_g = rows * (size_t)c->model.num_v_heads;
    for (int32_t l = 0; l < c->model.num_layers; l++) {
        gdn_layer_io io;
        CHECK_GDN(gdn_engine_layer_io(e, l, &io));
        if (c->mixer.conv_width > 0) { /* x = q | k | v before the conv: n_qk twice, then n_v */
            CHECK_GDN(gdn_engine_upload(e, io.x, host, n_qk * 2, NULL));
            CHECK_GDN(gdn_engine_upload(e, (uint16_t *)io.x + n_qk, host + 1, n_qk * 2, NULL));
            CHECK_GDN(gdn_engine_upload(e, (uint16_t *)io.x + 2 * n_qk, host, n_v * 2, NULL));
        } else {
            CHECK_GDN(gdn_engine_upload(e, io.q, host, n_qk * 2, NULL));
            CHECK_GDN(gdn_engine_upload(e, io.k, host + 1, n_qk * 2, NULL));
            CHECK_GDN(gdn_engine_upload(e, io.v, host, n_v * 2, NULL));
        }
        if (c->mixer.use_norm) CHECK_GDN(gdn_engine_upload(e, io.z, host + 4, n_v * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.a, host + 2, n_g * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.b, host + 3, n_g * 2, NULL));
    }
    CHECK_GDN(gdn_engine_synchronize(e, NULL));
    free(host);
    return 0;
}

/* --separate: per layer, the conv kernel, the engine's recurrence, the gated-norm kernel. */
typedef struct separate_run {
    gdn_bench_separate sep;
    int o_is_f32;
} separate_run;

static gdn_status separate_capture(void *user, gdn_engine *e, gdn_step_kind kind, int32_t tokens, int32_t bucket,
                                   void *stream)
{
    (void)kind;
    const separate_run *run = user;
    const int32_t *read_slots = NULL;
    gdn_status status = gdn_engine_step_rows(e, &read_slots, NULL, NULL);
    for (int32_t l = 0; status == GDN_OK && l < gdn_engine_get_config(e)->model.num_layers; l++) {
        gdn_layer_io io;
        status = gdn_engine_layer_io(e, l, &io);
        if (status == GDN_OK && gdn_bench_separate_conv(&run->sep, l, read_slots, bucket, tokens, io.q, io.k, io.v, stream))
            status = GDN_ECUDA;
        if (status == GDN_OK) status = gdn_engine_run_layer(e, l, stream);
        if (status == GDN_OK && gdn_bench_separate_norm(&run->sep, io.o, run->o_is_f32, read_slots, bucket, tokens, stream))
            status = GDN_ECUDA;
    }
    return status;
}

/* Device buffers of --separate, filled with a nonzero bf16 pattern (the timing does not depend on the
 * values, but zeros are never timed). */
static int separate_setup(separate_run *run, const gdn_model_config *m, int32_t slots, int32_t rows)
{
    gdn_bench_separate *c = &run->sep;
    *c = (gdn_bench_separate){.HK = m->num_k_heads, .HV = m->num_v_heads, .K = m->head_dim_k, .V = m->head_dim_v,
                              .conv_width = 4, .num_slots = slots, .norm_eps = 1e-6f};
    c->conv_dim = 2 * c->HK * c->K + c->HV * c->V;
    const size_t io = (size_t)rows * c->HV * c->V * 2;
    const size_t sizes[6] = {(size_t)rows * c->conv_dim * 2, (size_t)m->num_layers * slots * 3 * c->conv_dim * 2,
                             (size_t)c->conv_dim * 4 * 2, (size_t)c->conv_dim * 2, io, io};
    void **ptrs[6] = {&c->x, &c->window, &c->weight, &c->bias, &c->z, &c->y};
    for (int n = 0; n < 6; n++) {
        CHECK_CUDA(cudaMalloc(ptrs[n], sizes[n]));
        CHECK_CUDA(cudaMemset(*ptrs[n], 0x3c, sizes[n])); /* bf16 0x3c3c, about 0.0115 */
    }
    float norm_w[256];
    for (int32_t v = 0; v < c->V && v < 256; v++) norm_w[v] = 1.0f + 0.001f * (float)v;
    CHECK_CUDA(cudaMalloc((void **)&c->norm_weight, sizeof(float) * (size_t)c->V));
    CHECK_CUDA(cudaMemcpy(c->norm_weight, norm_w, sizeof(float) * (size_t)c->V, cudaMemcpyHostToDevice));
    return 0;
}

static void progress(void *user, int32_t done, int32_t total)
{
    (void)user;
    if (done == total || done % 16 == 0) fprintf(stderr, "\rcapturing graphs: %d/%d", done, total);
    if (done == total) fputc('\n', stderr);
}

/*
 * --tp N: tensor parallelism as a serving engine runs it, one engine per device (devices 0..N-1),
 * each holding HK / N key heads and HV / N value heads of every layer, all driven from this one
 * thread. For each bucket and T: each device's step time with the others idle (the one-GPU time for
 * its heads), then with every device stepping at once (the host issuing device 0's step, then device
 * 1's, ...), GPU time per device from its own events; both queued behind a 2 ms spin on each device so
 * that the GPUs run the steps back to back. A concurrent time above the alone time is serialisation
 * through the host or a shared stream.
 */
static int tp_main(const gdn_engine_config *base, int tp, const int32_t *tokens, int n_tokens, int32_t only_bucket)
{
    enum { MAX_TP = 8, REPS = 20, STEPS = 8 };
    int devices = 0;
    CHECK_CUDA(cudaGetDeviceCount(&devices));
    if (tp < 1 || tp > MAX_TP || tp > devices || base->model.num_k_heads % tp || base->model.num_v_heads % tp) {
        fprintf(stderr, "--tp %d: needs 1..%d devices (this host has %d) dividing HK = %d and HV = %d\n", tp, MAX_TP, devices,
                base->model.num_k_heads, base->model.num_v_heads);
        return 2;
    }
    gdn_engine *e[MAX_TP];
    cudaStream_t s[MAX_TP];
    cudaEvent_t start[MAX_TP], stop[MAX_TP];
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)base->max_batch);
    int32_t *accepted = malloc(sizeof(int32_t) * (size_t)base->max_batch);
    for (int32_t i = 0; i < base->max_batch; i++) accepted[i] = 1 + i % 2;
    for (int d = 0; d < tp; d++) {
        gdn_engine_config c = *base;
        c.device = d;
        c.model.num_k_heads /= tp, c.model.num_v_heads /= tp;
        c.graph_progress = NULL;
        CHECK_GDN(gdn_engine_create(&c, &e[d]));
        for (int32_t i = 0; i < c.max_batch; i++) CHECK_GDN(gdn_slot_alloc(e[d], &slots[i]));
        for (int32_t i = 0; i < c.max_batch; i++) CHECK_GDN(gdn_slot_reset(e[d], slots[i], NULL));
        if (gdn_bench_fill_inputs(e[d], gdn_engine_get_config(e[d]))) return 1;
        CHECK_GDN(gdn_engine_upload(e[d], gdn_engine_accepted(e[d]), accepted, sizeof(int32_t) * (size_t)c.max_batch, NULL));
        CHECK_GDN(gdn_engine_synchronize(e[d], NULL));
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
        CHECK_CUDA(cudaEventCreate(&start[d]));
        CHECK_CUDA(cudaEventCreate(&stop[d]));
    }
    char name[256];
    {
        struct cudaDeviceProp prop;
        CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
        snprintf(name, sizeof name, "%s", prop.name);
    }
    printf("tensor parallel: %d engines (devices 0..%d, %s), each %d layers with HK %d, HV %d, %s state, "
           "max_batch %d; one host thread; us per step (GPU events, median of %d samples of %d steps)\n",
           tp, tp - 1, name, base->model.num_layers, base->model.num_k_heads / tp, base->model.num_v_heads / tp,
           base->state_dtype == GDN_DTYPE_F32 ? "f32" : "bf16", base->max_batch, REPS, STEPS);
    printf("\n%7s %3s |", "bucket", "T");
    for (int d = 0; d < tp; d++) printf(" alone %d ", d);
    printf("|");
    for (int d = 0; d < tp; d++) printf("  all, %d ", d);
    printf("| worst all / alone\n");
    const int32_t bucket_list[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    for (size_t bi = 0; bi < sizeof bucket_list / sizeof bucket_list[0]; bi++) {
        const int32_t bucket = bucket_list[bi];
        if (bucket > base->max_batch) break;
        if (only_bucket && bucket != only_bucket) continue;
        for (int ti = 0; ti < n_tokens; ti++) {
            const int32_t T = tokens[ti];
            double alone[MAX_TP], together[MAX_TP];
            for (int mode = 0; mode < 1 + tp; mode++) { /* mode d < tp: device d alone; mode tp: every device */
                double samples[MAX_TP][REPS];
                const int first = mode < tp ? mode : 0, last = mode < tp ? mode + 1 : tp;
                for (int r = 0; r < REPS; r++) {
                    for (int d = first; d < last; d++) {
                        CHECK_CUDA(cudaSetDevice(d));
                        CHECK_CUDA(cudaStreamSynchronize(s[d]));
                        if (gdn_bench_spin(s[d], 2.0)) return 1;
                        CHECK_CUDA(cudaEventRecord(start[d], s[d]));
                    }
                    for (int i = 0; i < STEPS; i++)
                        for (int d = first; d < last; d++)
                            if (issue_step(e[d], slots, bucket, T, s[d])) return 1;
                    for (int d = first; d < last; d++) {
                        CHECK_CUDA(cudaSetDevice(d));
                        CHECK_CUDA(cudaEventRecord(stop[d], s[d]));
                    }
                    for (int d = first; d < last; d++) {
                        CHECK_CUDA(cudaSetDevice(d));
                        CHECK_CUDA(cudaEventSynchronize(stop[d]));
                        float ms = 0;
                        CHECK_CUDA(cudaEventElapsedTime(&ms, start[d], stop[d]));
                        samples[d][r] = 1000.0 * ms / STEPS;
                    }
                }
                for (int d = first; d < last; d++) (mode < tp ? alone : together)[d] = median_of(samples[d], REPS);
            }
            double worst = 0;
            printf("%7d %3d |", bucket, T);
            for (int d = 0; d < tp; d++) printf(" %8.1f", alone[d]);
            printf(" |");
            for (int d = 0; d < tp; d++) {
                printf(" %8.1f", together[d]);
                if (together[d] / alone[d] > worst) worst = together[d] / alone[d];
            }
            printf(" | %6.3f\n", worst);
            fflush(stdout);
        }
    }
    for (int d = 0; d < tp; d++) {
        CHECK_GDN(gdn_engine_check_device_error(e[d], s[d]));
        CHECK_CUDA(cudaSetDevice(d));
        cudaStreamDestroy(s[d]), cudaEventDestroy(start[d]), cudaEventDestroy(stop[d]);
        gdn_engine_destroy(e[d]);
    }
    free(slots), free(accepted);
    return 0;
}

#ifdef GDN_PHASE_TRACE
/* A -Dphase_trace=true build (kernels/gdn_phase_trace.cuh): the layer and ring kernels' last records. */
void gdn__phase_trace_dump_layer(const char *path);
void gdn__phase_trace_dump_mixer(const char *path);
void gdn__phase_trace_dump_ring_decode(const char *path);
static void dump_phase_trace(void)
{
    const char *dir = getenv("GDN_PHASE_TRACE_DIR");
    char path[4096];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/layer.bin", dir), gdn__phase_trace_dump_layer(path);
    snprintf(path, sizeof path, "%s/mixer.bin", dir), gdn__phase_trace_dump_mixer(path);
    snprintf(path, sizeof path, "%s/ring_stream.bin", dir), gdn__phase_trace_dump_ring_decode(path);
}
#endif

int gdn_bench_engine_main(int argc, char **argv)
{
    gdn_dtype state = GDN_DTYPE_BF16;
    int32_t layers = 36, max_batch = 128, tokens[8] = {1, 2, 4}, n_tokens = 3;
    const char *json = NULL;
    gdn_verify_strategy verify = GDN_VERIFY_AUTO; /* the library's default unless asked */
    int32_t ring_length = 0;                      /* 0: the library's default */
    int32_t ring_write_through = 0;               /* 0: the library's default; -1 never */
    int mixer = 0, separate = 0;
    int mixer_conv = 1, mixer_norm = 1; /* --mixer-parts */
    int32_t only_bucket = 0; /* --bucket N: that bucket alone (for profilers) */
    int tp = 0;              /* --tp N: one engine per device, heads split N ways */
    const char *preset = "qwen3-next"; /* --preset: a gdn_model_preset name */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--state") && v) state = strcmp(argv[++i], "f32") == 0 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        else if (!strcmp(a, "--verify") && v &&
                 (!strcmp(v, "auto") || !strcmp(v, "cache") || !strcmp(v, "fold") || !strcmp(v, "ring"))) {
            verify = !strcmp(v, "cache")    ? GDN_VERIFY_CACHE
                     : !strcmp(v, "fold") ? GDN_VERIFY_FOLD
                     : !strcmp(v, "ring")   ? GDN_VERIFY_RING
                                            : GDN_VERIFY_AUTO;
            i++;
        } else if (!strcmp(a, "--ring-length") && v) ring_length = atoi(argv[++i]);
        else if (!strcmp(a, "--ring-write-through") && v) ring_write_through = atoi(argv[++i]);
        else if (!strcmp(a, "--layers") && v) layers = atoi(argv[++i]);
        else if (!strcmp(a, "--preset") && v) preset = argv[++i];
        else if (!strcmp(a, "--mixer")) mixer = 1;
        else if (!strcmp(a, "--separate")) separate = 1;
        else if (!strcmp(a, "--mixer-parts") && v && (!strcmp(v, "conv") || !strcmp(v, "norm"))) {
            mixer_conv = !strcmp(v, "conv"), mixer_norm = !mixer_conv;
            i++;
        }
        else if (!strcmp(a, "--bucket") && v) only_bucket = atoi(argv[++i]);
        else if (!strcmp(a, "--tp") && v) tp = atoi(argv[++i]);
        else if (!strcmp(a, "--max-batch") && v) max_batch = atoi(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else if (!strcmp(a, "--host-burst") && v) {
            host_burst = atoi(argv[++i]);
            if (host_burst < 1 || host_burst > 12) host_burst = 12;
        } else if (!strcmp(a, "--tokens") && v) {
            n_tokens = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_tokens < 8; tok = strtok(NULL, ",")) tokens[n_tokens++] = atoi(tok);
        } else {
            fprintf(stderr, "usage: gdn-bench --engine [--preset qwen3-next|qwen3.5|tiny] [--state f32|bf16] [--layers N] [--max-batch N] [--tokens 1,2,4] "
                            "[--host-burst 1..12] [--verify auto|cache|fold|ring] [--ring-length 4..32] [--ring-write-through N] "
                            "[--mixer | --separate] [--bucket N] "
                            "[--mixer-parts conv|norm] [--tp N] [--json FILE]\n");
            return 2;
        }
    }
    if ((!mixer_conv || !mixer_norm) && !mixer) { /* a part of a mixer that is not there */
        fprintf(stderr, "gdn-bench --engine: --mixer-parts needs --mixer\n");
        return 2;
    }
    int32_t max_tokens = 1;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] > max_tokens) max_tokens = tokens[i];

    gdn_model_config model;
    if (gdn_model_preset(preset, layers, &model) != GDN_OK) {
        fprintf(stderr, "gdn-bench --engine: no model preset '%s' (qwen3-next, qwen3.5, tiny)\n", preset);
        return 2;
    }
    gdn_engine_config c;
    CHECK_GDN(gdn_engine_config_init(&c, &model));
    c.state_dtype = state;
    c.num_slots = max_batch;
    c.max_batch = max_batch;
    c.max_tokens = max_tokens;
    c.verify_strategy = verify;
    c.ring_length = ring_length;
    c.ring_write_through = ring_write_through;
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = GDN_GRAPHS_AT_CREATE;
    c.graph_progress = progress;
    if (mixer)
        c.mixer = (gdn_mixer_config){.conv_width = mixer_conv ? 4 : 0, .conv_weight_dtype = GDN_DTYPE_BF16, .use_norm = mixer_norm};
    static separate_run run;
    if (separate) {
        if (mixer || separate_setup(&run, &model, c.num_slots, max_batch * max_tokens)) return 1;
        run.o_is_f32 = c.output_dtype == GDN_DTYPE_F32;
        c.capture = separate_capture, c.capture_user = &run;
        c.graph_mode = GDN_GRAPHS_LAZY; /* the callback reads the step's rows buffer */
    }
    if (tp) {
        if (mixer || separate) {
            fprintf(stderr, "--tp: the plain step only\n");
            return 2;
        }
        return tp_main(&c, tp, tokens, n_tokens, only_bucket);
    }
    gdn_engine *e = NULL;
    const double t_create = now_us();
    CHECK_GDN(gdn_engine_create(&c, &e));
    const double create_ms = (now_us() - t_create) / 1000.0;
    const gdn_engine_config *rc = gdn_engine_get_config(e);
    gdn_memory_report mem;
    CHECK_GDN(gdn_engine_memory(e, &mem));
    const char *strategy = rc->verify_strategy == GDN_VERIFY_FOLD ? "fold"
                           : rc->verify_strategy == GDN_VERIFY_RING ? "ring"
                                                                    : "cache";
    const int32_t ring_len = rc->verify_strategy == GDN_VERIFY_RING ? rc->ring_length : 0;
    char ring_note[160] = "", through[48] = "no decode writes through";
    if (rc->ring_write_through > 0) snprintf(through, sizeof through, "decodes write through up to %d rows", rc->ring_write_through);
    if (ring_len)
        snprintf(ring_note, sizeof ring_note, " (ring length %d, %s; GPU times: means over whole ring cycles)", ring_len, through);
    printf("engine: %s x %d layers%s, %s state, %d slots, max_batch %d, max_tokens %d, %d buckets, %s verify%s; created"
           " in %.0f ms (graphs included); host timed in bursts of %d steps\n", preset, layers,
           mixer      ? (!mixer_norm ? " (mixer step: conv W 4, no norm)"
                         : !mixer_conv ? " (mixer step: gated norm, no conv)"
                                       : " (whole mixer step: conv W 4, gated norm)")
           : separate ? " (recurrence + separate conv W 4 and gated-norm kernels; graph column only)"
                      : "",
           state == GDN_DTYPE_F32 ? "f32" : "bf16", max_batch, max_batch, max_tokens, rc->num_buckets, strategy, ring_note,
           create_ms, host_burst);
    printf("device memory: pools %.2f GiB, verify cache %.2f GiB, token store %.2f GiB, ring %.2f GiB (%.2f%% of the pools), "
           "io %.2f GiB, total %.2f GiB\n",
           mem.state_pools / 1073741824.0, mem.verify_cache / 1073741824.0, mem.token_store / 1073741824.0,
           mem.ring / 1073741824.0, 100.0 * (double)mem.ring / (double)mem.state_pools, mem.io_buffers / 1073741824.0,
           mem.total / 1073741824.0);
    if (mixer) { /* random weights: the timing does not depend on them, but zeros are never timed */
        const size_t C = 2 * (size_t)model.num_k_heads * model.head_dim_k + (size_t)model.num_v_heads * model.head_dim_v;
        uint16_t *w = malloc(sizeof(uint16_t) * C * 5);
        float *norm_w = malloc(sizeof(float) * (size_t)model.head_dim_v);
        for (size_t j = 0; j < C * 5; j++) w[j] = gdn__f32_to_bf16((float)(0.25 * ((double)((j * 2654435761u) % 1000) / 500.0 - 1.0)));
        for (int32_t j = 0; j < model.head_dim_v; j++) norm_w[j] = 1.0f + 0.001f * (float)j;
        for (int32_t l = 0; l < layers; l++)
            CHECK_GDN(gdn_engine_set_mixer_params(e, l, mixer_conv ? w : NULL, mixer_conv ? w + 4 * C : NULL,
                                                  mixer_norm ? norm_w : NULL));
        free(w), free(norm_w);
    }
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)max_batch);
    for (int32_t i = 0; i < max_batch; i++) CHECK_GDN(gdn_slot_alloc(e, &slots[i]));
    for (int32_t i = 0; i < max_batch; i++) CHECK_GDN(gdn_slot_reset(e, slots[i], NULL));
    if (gdn_bench_fill_inputs(e, rc)) return 1;
    int32_t *accepted = malloc(sizeof(int32_t) * (size_t)max_batch);
    for (int32_t i = 0; i < max_batch; i++) accepted[i] = 1 + i % 2;
    CHECK_GDN(gdn_engine_upload(e, gdn_engine_accepted(e), accepted, sizeof(int32_t) * (size_t)max_batch, NULL));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const int32_t bucket_list[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    engine_row rows[64];
    int n_rows = 0;
    printf("\n%7s %3s | %9s %9s %9s | %10s %10s %12s | %11s\n", "bucket", "T", "host us", "host p90", "commit",
           "graph us", "direct us", "kernel sum", "graph / sum");
    for (size_t bi = 0; bi < sizeof bucket_list / sizeof bucket_list[0]; bi++) {
        if (bucket_list[bi] > max_batch) break;
        if (only_bucket && bucket_list[bi] != only_bucket) continue;
        for (int ti = 0; ti < n_tokens && n_rows < 64; ti++) {
            engine_row *r = &rows[n_rows];
            r->bucket = bucket_list[bi], r->tokens = tokens[ti];
            if (measure(e, slots, r->bucket, r->tokens, layers, s, r)) return 1;
            printf("%7d %3d | %9.2f %9.2f %9.2f | %10.1f %10.1f %12.1f | %11.3f\n", r->bucket, r->tokens, r->host_us,
                   r->host_p90_us, r->commit_host_us, r->graph_us, r->direct_us, r->kernel_sum_us,
                   r->graph_us / r->kernel_sum_us);
            n_rows++;
        }
    }
    CHECK_GDN(gdn_engine_check_device_error(e, s));
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"mode\": \"engine\", \"mixer\": %d, \"preset\": \"%s\", \"layers\": %d, \"state\": \"%s\", \"verify\": \"%s\", "
                   "\"ring_length\": %d, \"gpu_time\": \"%s\", \"memory\": {\"state_pools\": %llu, \"verify_cache\": %llu, "
                   "\"token_store\": %llu, \"ring\": %llu, \"total\": %llu}, \"host_burst\": %d, \"rows\": [\n",
                mixer, preset, layers, state == GDN_DTYPE_F32 ? "f32" : "bf16", strategy, ring_len,
                ring_len ? "mean over samples of whole ring cycles" : "median of samples",
                (unsigned long long)mem.state_pools, (unsigned long long)mem.verify_cache,
                (unsigned long long)mem.token_store, (unsigned long long)mem.ring, (unsigned long long)mem.total, host_burst);
        for (int i = 0; i < n_rows; i++)
            fprintf(f, "  {\"bucket\": %d, \"T\": %d, \"host_us\": %.3f, \"host_p90_us\": %.3f, \"commit_host_us\": %.3f, "
                       "\"graph_us\": %.3f, \"direct_us\": %.3f, \"kernel_sum_us\": %.3f}%s\n", rows[i].bucket, rows[i].tokens,
                    rows[i].host_us, rows[i].host_p90_us, rows[i].commit_host_us, rows[i].graph_us,
                    rows[i].direct_us, rows[i].kernel_sum_us, i + 1 < n_rows ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    cudaStreamDestroy(s);
    free(slots), free(accepted);
#ifdef GDN_PHASE_TRACE
    dump_phase_trace();
#endif
    gdn_engine_destroy(e);
    return 0;
}
