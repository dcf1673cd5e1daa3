/*
 * gdn-bench --engine: the engine's whole step (SPEC 5, issue 4). A qwen3-next model of 36 GDN layers
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
 *   gdn-bench --engine [--state f32|bf16] [--layers N] [--max-batch N] [--tokens 1,2,4] [--host-burst N] [--json FILE]
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

int gdn_bench_engine_main(int argc, char **argv);
int gdn_bench_spin(cudaStream_t stream, double milliseconds);


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

/* Median over 20 repetitions of the GPU time (CUDA events) of `work`: 8 whole steps (per step), or
 * one step as direct launches; behind_spin queues the work behind a 2 ms kernel first, so the GPU
 * runs it back to back with no host launch gaps. */
static int time_on_gpu(gdn_engine *e, const int32_t *slots, int32_t bucket, int32_t tokens, int32_t layers,
                       cudaStream_t s, timed_work work, int behind_spin, double *median_us)
{
    enum { REPS = 20 };
    const int steps = work == TIMED_STEPS ? 8 : 1;
    double samples[REPS];
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
    *median_us = median_of(samples, REPS);
    return 0;
}

/* Steps issued back to back between syncs when timing the host (--host-burst): 12 queues up to 12
 * steps of GPU work; a serving loop that waits for each step's sampled tokens runs 1 or 2 ahead. */
static int host_burst = 12;

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

    /* GPU time per step: graph replays (with their row fetches) queued behind a spin kernel. */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_STEPS, 1, &row->graph_us)) return -1;
    /* The same step as direct launches, as the host issues them (launch gaps included). */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_DIRECT, 0, &row->direct_us)) return -1;
    /* Sum of single-layer kernel times: the direct launches queued behind a spin kernel. */
    if (time_on_gpu(e, slots, bucket, tokens, layers, s, TIMED_DIRECT, 1, &row->kernel_sum_us)) return -1;
    return 0;
}

/* Random bf16 inputs in every layer's buffers (the timing does not depend on their values, but
 * zeros are never timed). */
static int fill_inputs(gdn_engine *e, const gdn_engine_config *c)
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
        CHECK_GDN(gdn_engine_upload(e, io.q, host, n_qk * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.k, host + 1, n_qk * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.v, host, n_v * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.a, host + 2, n_g * 2, NULL));
        CHECK_GDN(gdn_engine_upload(e, io.b, host + 3, n_g * 2, NULL));
    }
    CHECK_GDN(gdn_engine_synchronize(e, NULL));
    free(host);
    return 0;
}

static void progress(void *user, int32_t done, int32_t total)
{
    (void)user;
    if (done == total || done % 16 == 0) fprintf(stderr, "\rcapturing graphs: %d/%d", done, total);
    if (done == total) fputc('\n', stderr);
}

int gdn_bench_engine_main(int argc, char **argv)
{
    gdn_dtype state = GDN_DTYPE_BF16;
    int32_t layers = 36, max_batch = 128, tokens[8] = {1, 2, 4}, n_tokens = 3;
    const char *json = NULL;
    gdn_verify_strategy verify = GDN_VERIFY_AUTO; /* the library's default unless asked */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--state") && v) state = strcmp(argv[++i], "f32") == 0 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        else if (!strcmp(a, "--verify") && v && (!strcmp(v, "auto") || !strcmp(v, "cache") || !strcmp(v, "replay"))) {
            verify = !strcmp(v, "cache") ? GDN_VERIFY_CACHE : !strcmp(v, "replay") ? GDN_VERIFY_REPLAY : GDN_VERIFY_AUTO;
            i++;
        } else if (!strcmp(a, "--layers") && v) layers = atoi(argv[++i]);
        else if (!strcmp(a, "--max-batch") && v) max_batch = atoi(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else if (!strcmp(a, "--host-burst") && v) {
            host_burst = atoi(argv[++i]);
            if (host_burst < 1 || host_burst > 12) host_burst = 12;
        } else if (!strcmp(a, "--tokens") && v) {
            n_tokens = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_tokens < 8; tok = strtok(NULL, ",")) tokens[n_tokens++] = atoi(tok);
        } else {
            fprintf(stderr, "usage: gdn-bench --engine [--state f32|bf16] [--layers N] [--max-batch N] [--tokens 1,2,4] "
                            "[--host-burst 1..12] [--verify auto|cache|replay] [--json FILE]\n");
            return 2;
        }
    }
    int32_t max_tokens = 1;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] > max_tokens) max_tokens = tokens[i];

    gdn_model_config model;
    CHECK_GDN(gdn_model_preset("qwen3-next", layers, &model));
    gdn_engine_config c;
    CHECK_GDN(gdn_engine_config_init(&c, &model));
    c.state_dtype = state;
    c.num_slots = max_batch;
    c.max_batch = max_batch;
    c.max_tokens = max_tokens;
    c.verify_strategy = verify;
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = GDN_GRAPHS_AT_CREATE;
    c.graph_progress = progress;
    gdn_engine *e = NULL;
    const double t_create = now_us();
    CHECK_GDN(gdn_engine_create(&c, &e));
    const double create_ms = (now_us() - t_create) / 1000.0;
    const gdn_engine_config *rc = gdn_engine_get_config(e);
    gdn_memory_report mem;
    CHECK_GDN(gdn_engine_memory(e, &mem));
    const char *strategy = rc->verify_strategy == GDN_VERIFY_REPLAY ? "replay" : "cache";
    printf("engine: qwen3-next x %d layers, %s state, %d slots, max_batch %d, max_tokens %d, %d buckets, %s verify; created"
           " in %.0f ms (graphs included); host timed in bursts of %d steps\n", layers,
           state == GDN_DTYPE_F32 ? "f32" : "bf16", max_batch, max_batch, max_tokens, rc->num_buckets, strategy, create_ms,
           host_burst);
    printf("device memory: pools %.2f GiB, verify cache %.2f GiB, token store %.2f GiB, io %.2f GiB, total %.2f GiB\n",
           mem.state_pools / 1073741824.0, mem.verify_cache / 1073741824.0, mem.token_store / 1073741824.0,
           mem.io_buffers / 1073741824.0, mem.total / 1073741824.0);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)max_batch);
    for (int32_t i = 0; i < max_batch; i++) CHECK_GDN(gdn_slot_alloc(e, &slots[i]));
    for (int32_t i = 0; i < max_batch; i++) CHECK_GDN(gdn_slot_reset(e, slots[i], NULL));
    if (fill_inputs(e, rc)) return 1;
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
        fprintf(f, "{\"mode\": \"engine\", \"preset\": \"qwen3-next\", \"layers\": %d, \"state\": \"%s\", \"verify\": \"%s\", "
                   "\"host_burst\": %d, \"rows\": [\n", layers, state == GDN_DTYPE_F32 ? "f32" : "bf16", strategy, host_burst);
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
    gdn_engine_destroy(e);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* gdn-bench --strategies: the cache and replay verify strategies side by side (issue 5)            */
/* ---------------------------------------------------------------------------------------------- */

/*
 * For each preset, state dtype and T: the device memory each strategy holds beyond the state pools
 * (from the engine's own report; the same numbers on every backend), and, on the CUDA backend, the
 * GPU time per layer of a verify step of T tokens plus its commit, in steady state (every slot holds
 * the previous verify's accepted tokens, so the replay strategy's fold is included), against a decode
 * step, for batch B.
 *
 *   gdn-bench --strategies [--slots N] [--batch B] [--layers L] [--json FILE]
 */
typedef struct strategy_row {
    const char *preset;
    gdn_dtype state;
    int32_t tokens;
    gdn_verify_strategy strategy;
    double beyond_pools_pct;  /* memory beyond the pools, % of the pools */
    double verify_us, decode_us; /* per layer, CUDA only (0 otherwise) */
} strategy_row;

static int time_strategy(gdn_engine *e, const int32_t *slots, int32_t batch, int32_t tokens, int32_t layers,
                         cudaStream_t s, strategy_row *row)
{
    CHECK_GDN(gdn_engine_synchronize(e, NULL));
    for (int w = 0; w < 3; w++) /* steady state: each verify leaves accepted tokens pending */
        if (issue_step(e, slots, batch, tokens, s) || issue_step(e, slots, batch, 1, s)) return -1;
    double verify = 0, decode = 0;
    if (time_on_gpu(e, slots, batch, tokens, layers, s, TIMED_STEPS, 1, &verify)) return -1;
    if (time_on_gpu(e, slots, batch, 1, layers, s, TIMED_STEPS, 1, &decode)) return -1;
    row->verify_us = verify / layers;
    row->decode_us = decode / layers;
    return 0;
}

int gdn_bench_strategies_main(int argc, char **argv);

int gdn_bench_strategies_main(int argc, char **argv)
{
    int32_t num_slots = 1024, batch = 64, layers = 4;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--slots") && v) num_slots = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--layers") && v) layers = atoi(argv[++i]);
        else if (!strcmp(a, "--json") && v) json = argv[++i];
        else {
            fprintf(stderr, "usage: gdn-bench --strategies [--slots N] [--batch B] [--layers L] [--json FILE]\n");
            return 2;
        }
    }
    static const char *const preset_names[] = {"qwen3-next", "qwen3.5"};
    static const gdn_dtype states[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    static const int32_t token_counts[] = {4, 8};
    strategy_row rows[32];
    int n_rows = 0;
    cudaStream_t s = NULL;
    int gpu = 0;
    /* ratio: verify + commit over this engine's decode; vs cache: over the cache strategy's decode of
     * the same preset, dtype and T (the fastest T = 1 step, what the replay targets compare with). */
    printf("%-10s %5s %2s %-7s | %16s | %16s %10s %8s %9s\n", "preset", "state", "T", "verify", "beyond pools %",
           "verify+commit us", "decode us", "ratio", "vs cache");
    for (int pi = 0; pi < 2; pi++)
        for (int si = 0; si < 2; si++)
            for (int ti = 0; ti < 2; ti++)
                for (int strategy = 0; strategy < 2; strategy++) {
                    gdn_model_config model;
                    CHECK_GDN(gdn_model_preset(preset_names[pi], layers, &model));
                    gdn_engine_config c;
                    CHECK_GDN(gdn_engine_config_init(&c, &model));
                    c.state_dtype = states[si];
                    c.num_slots = num_slots;
                    c.max_batch = batch;
                    c.max_tokens = token_counts[ti];
                    c.verify_strategy = strategy ? GDN_VERIFY_REPLAY : GDN_VERIFY_CACHE;
                    c.graph_mode = GDN_GRAPHS_LAZY;
                    gdn_engine *e = NULL;
                    CHECK_GDN(gdn_engine_create(&c, &e));
                    gdn_memory_report m;
                    CHECK_GDN(gdn_engine_memory(e, &m));
                    strategy_row *r = &rows[n_rows++];
                    *r = (strategy_row){.preset = preset_names[pi], .state = states[si], .tokens = token_counts[ti],
                                        .strategy = c.verify_strategy};
                    r->beyond_pools_pct = 100.0 * (double)(m.verify_cache + m.token_store) / (double)m.state_pools;
                    gpu = gdn_engine_backend(e) == GDN_BACKEND_CUDA;
                    if (gpu) {
                        if (!s) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
                        int32_t *slots = malloc(sizeof(int32_t) * (size_t)batch), *accepted = malloc(sizeof(int32_t) * (size_t)batch);
                        for (int32_t i = 0; i < batch; i++) {
                            CHECK_GDN(gdn_slot_alloc(e, &slots[i]));
                            accepted[i] = 1 + i % token_counts[ti]; /* 1..T, mean about T/2 */
                        }
                        if (fill_inputs(e, gdn_engine_get_config(e))) return 1;
                        CHECK_GDN(gdn_engine_upload(e, gdn_engine_accepted(e), accepted, sizeof(int32_t) * (size_t)batch, NULL));
                        if (time_strategy(e, slots, batch, token_counts[ti], layers, s, r)) return 1;
                        CHECK_GDN(gdn_engine_check_device_error(e, s));
                        free(slots), free(accepted);
                    }
                    printf("%-10s %5s %2d %-7s | %16.2f | ", r->preset, r->state == GDN_DTYPE_F32 ? "f32" : "bf16",
                           r->tokens, strategy ? "replay" : "cache", r->beyond_pools_pct);
                    const double cache_decode = strategy ? r[-1].decode_us : r->decode_us; /* cache row first */
                    if (gpu)
                        printf("%16.2f %10.2f %8.3f %9.3f\n", r->verify_us, r->decode_us, r->verify_us / r->decode_us,
                               r->verify_us / cache_decode);
                    else printf("%16s %10s %8s %9s\n", "n/a", "n/a", "n/a", "n/a");
                    gdn_engine_destroy(e);
                }
    if (!gpu) printf("(no GPU: memory only; the engines ran on the CPU backend, whose allocations are the same)\n");
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"mode\": \"strategies\", \"slots\": %d, \"batch\": %d, \"layers\": %d, \"gpu\": %d, \"rows\": [\n",
                num_slots, batch, layers, gpu);
        for (int i = 0; i < n_rows; i++)
            fprintf(f, "  {\"preset\": \"%s\", \"state\": \"%s\", \"T\": %d, \"strategy\": \"%s\", \"beyond_pools_pct\": %.3f, "
                       "\"verify_commit_us\": %.3f, \"decode_us\": %.3f}%s\n", rows[i].preset,
                    rows[i].state == GDN_DTYPE_F32 ? "f32" : "bf16", rows[i].tokens,
                    rows[i].strategy == GDN_VERIFY_REPLAY ? "replay" : "cache", rows[i].beyond_pools_pct, rows[i].verify_us,
                    rows[i].decode_us, i + 1 < n_rows ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    if (s) cudaStreamDestroy(s);
    return 0;
}
