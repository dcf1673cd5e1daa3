/*
 * The engine on the CUDA backend: graph replay bit-exact with direct launches (lazy and at-create
 * capture), the random 200-step scenario against the float64 host reference with graphs, no host or
 * device allocation after creation, a step that returns while the GPU is still busy, and a capture
 * callback whose own work is part of the replayed graph. Skips visibly without a GPU.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/alloc.h"
#include "engine/backend_impl.h"
#include "kernels/gdn_cuda.h"
#include "scenario.h"
#include "serving_loop_check.h"
#include "slot_ops_checks.h"
#include "support.h"

#ifdef GDN_HAVE_CUDA
#include <cuda_runtime.h>

int test_gpu_spin(void *stream, double milliseconds);
int test_gpu_late_writer(void *stream, void *const *dst, const void *const *src, const size_t *bytes, int count,
                         double milliseconds);

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static gdn_engine *cuda_engine(gdn_graph_mode mode, uint64_t seed, gdn_dtype state_dtype)
{
    gdn_engine_config c = test_config("qwen3-next", 3, state_dtype, 40, 32, 4);
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = mode;
    test_rng rng = test_rng_seeded(seed);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t s;
    for (int i = 0; i < 40; i++) {
        cr_assert_eq(gdn_slot_alloc(e, &s), GDN_OK);
        test_fill_slot_state(e, s, &rng);
    }
    return e;
}

/* The same steps on several engines with the same inputs; outputs and states must be identical. */
static void run_twins(gdn_engine **engines, int count)
{
    test_rng rng = test_rng_seeded(123);
    const int32_t batches[] = {3, 17, 1, 32, 9, 3}, kinds[] = {0, 1, 1, 0, 1, 0};
    for (size_t s = 0; s < sizeof batches / sizeof batches[0]; s++) {
        const int32_t B = batches[s], T = kinds[s] ? 2 + (int32_t)(s % 3) : 1;
        int32_t rows[32], accepted[32];
        for (int32_t i = 0; i < B; i++) rows[i] = (int32_t)((i * 7 + s * 3) % 40), accepted[i] = test_rng_below(&rng, T + 1);
        for (int32_t i = 0; i < B; i++) /* keep rows distinct */
            for (int32_t j = 0; j < i; j++)
                if (rows[j] == rows[i]) rows[i] = -1;
        for (int k = 0; k < count; k++) {
            test_rng inputs = test_rng_seeded(1000 + s); /* identical inputs for every twin */
            for (int32_t l = 0; l < 3; l++) {
                test_inputs in;
                test_write_inputs(engines[k], l, B, T, &inputs, &in);
                test_inputs_free(&in);
                test_poison_outputs(engines[k], l);
            }
            test_run_step(engines[k], kinds[s] ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, B, rows, NULL);
            if (kinds[s]) {
                test_set_accepted(engines[k], accepted, B);
                cr_assert_eq(gdn_engine_commit(engines[k], NULL), GDN_OK);
            }
        }
        const gdn_engine_config *c = gdn_engine_get_config(engines[0]);
        const size_t out_bytes = (size_t)B * T * 32 * 128 * gdn_dtype_size(c->output_dtype);
        unsigned char *first = malloc(out_bytes), *other = malloc(out_bytes);
        for (int32_t l = 0; l < 3; l++) {
            gdn_layer_io io;
            gdn_engine_layer_io(engines[0], l, &io);
            cr_assert_eq(gdn_engine_download(engines[0], first, io.o, out_bytes, NULL), GDN_OK);
            gdn_engine_synchronize(engines[0], NULL);
            for (int k = 1; k < count; k++) {
                gdn_engine_layer_io(engines[k], l, &io);
                cr_assert_eq(gdn_engine_download(engines[k], other, io.o, out_bytes, NULL), GDN_OK);
                gdn_engine_synchronize(engines[k], NULL);
                cr_assert_eq(memcmp(first, other, out_bytes), 0, "step %zu layer %d: outputs of engine %d differ", s, l, k);
            }
        }
        free(first), free(other);
        for (int32_t slot = 0; slot < 40; slot++) {
            unsigned char *a = test_snapshot_slot(engines[0], slot);
            for (int k = 1; k < count; k++) {
                unsigned char *b = test_snapshot_slot(engines[k], slot);
                cr_assert_eq(memcmp(a, b, 3 * test_state_bytes(engines[0])), 0, "step %zu slot %d differs", s, slot);
                free(b);
            }
            free(a);
        }
    }
}

static void count_progress(void *user, int32_t captured, int32_t total)
{
    int32_t *seen = user;
    seen[0] = captured, seen[1] = total;
}

Test(gpu_engine, graph_replay_is_bit_exact_with_direct_launches, .timeout = 600)
{
    test_require_gpu();
    gdn_engine *direct = cuda_engine(GDN_GRAPHS_OFF, 5, GDN_DTYPE_BF16);
    gdn_engine *lazy = cuda_engine(GDN_GRAPHS_LAZY, 5, GDN_DTYPE_BF16);
    gdn_engine_config c = *gdn_engine_get_config(lazy);
    c.graph_mode = GDN_GRAPHS_AT_CREATE;
    int32_t progress[2] = {0, 0};
    c.graph_progress = count_progress;
    c.graph_progress_user = progress;
    c.num_buckets = 0;
    test_rng rng = test_rng_seeded(5);
    gdn_engine *eager = test_engine_create(&c, &rng, NULL);
    const int32_t expected_graphs = gdn_engine_get_config(eager)->num_buckets * (1 + 2 * 4); /* + commits */
    cr_assert_eq(progress[1], expected_graphs);
    cr_assert_eq(progress[0], expected_graphs, "progress reports every capture");
    int32_t s;
    for (int i = 0; i < 40; i++) {
        gdn_slot_alloc(eager, &s);
        test_fill_slot_state(eager, s, &rng);
    }
    gdn_engine *engines[] = {direct, lazy, eager};
    run_twins(engines, 3);
    for (int k = 0; k < 3; k++) gdn_engine_destroy(engines[k]);
}

Test(gpu_engine, random_200_step_scenario_with_graphs, .timeout = 900)
{
    test_require_gpu();
    const gdn_dtype dtypes[] = {GDN_DTYPE_F32, GDN_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CUDA, .graph_mode = GDN_GRAPHS_LAZY,
                              .state_dtype = dtypes[d], .layers = 3, .steps = 200, .num_slots = 24, .max_batch = 16,
                              .max_tokens = 4, .seed = 300 + (uint64_t)d};
        scenario_result r = run_scenario(&o);
        cr_log_info("tiny %s: 200 steps, %d buckets, worst state %.1f%%, output %.1f%% of tolerance",
                    d ? "bf16" : "fp32", r.buckets_seen, 100 * r.worst_state, 100 * r.worst_output);
        o.preset = "qwen3-next", o.steps = 30, o.seed += 10;
        r = run_scenario(&o);
        cr_log_info("qwen3-next %s: 30 steps, worst state %.1f%%, output %.1f%% of tolerance", d ? "bf16" : "fp32",
                    100 * r.worst_state, 100 * r.worst_output);
    }
}

/* A step's rows travel in its launch's parameters where they fit (small buckets), else through the
 * host ring (large buckets): steps that alternate between the two, as graph replays (whose launches
 * set the rows of the graph's fetch) and as direct launches, match the host model. */
Test(gpu_engine, rows_carried_in_the_launch_or_read_from_the_ring, .timeout = 600)
{
    test_require_gpu();
    const gdn_graph_mode modes[] = {GDN_GRAPHS_LAZY, GDN_GRAPHS_OFF};
    const gdn_verify_strategy strategies[] = {GDN_VERIFY_FOLD, GDN_VERIFY_CACHE};
    for (int m = 0; m < 2; m++) {
        scenario_options o = {.preset = "tiny", .backend = GDN_BACKEND_CUDA, .graph_mode = modes[m],
                              .state_dtype = GDN_DTYPE_F32, .strategy = strategies[m], .layers = 2, .steps = 60,
                              .num_slots = 120, .max_batch = 96, .max_tokens = 4, .check_every = 3, .min_live = 90,
                              .small_every = 2, .seed = 940 + (uint64_t)m};
        scenario_result r = run_scenario(&o);
        cr_log_info("%s: %d buckets, largest %d, worst state %.1f%%, output %.1f%% of tolerance",
                    m ? "direct, cache" : "graphs, fold", r.buckets_seen, r.largest_bucket, 100 * r.worst_state,
                    100 * r.worst_output);
        cr_assert_geq(r.largest_bucket, 64, "steps whose rows are read from the ring");
        cr_assert_geq(r.buckets_seen, 2, "steps whose rows travel in the launch");
    }
}

Test(gpu_engine, no_allocation_after_creation, .timeout = 300)
{
    test_require_gpu();
    gdn_engine_config c = test_config("qwen3-next", 3, GDN_DTYPE_BF16, 40, 32, 4);
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = GDN_GRAPHS_AT_CREATE;
    test_rng rng = test_rng_seeded(8);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    int32_t slots[32];
    for (int i = 0; i < 32; i++) gdn_slot_alloc(e, &slots[i]);
    int32_t accepted[32] = {0};
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    size_t free_before = 0, free_after = 0, total = 0;
    cudaMemGetInfo(&free_before, &total);
    const uint64_t device_before = gdn__cuda_device_allocations();
    const uint64_t host_before = gdn__thread_allocated_bytes(), library_before = gdn__allocation_count();
    gdn_status worst = GDN_OK;
    for (int32_t round = 0; round < 3; round++) {
        for (int32_t B = 1; B <= 32; B += 3) {
            for (int32_t T = 1; T <= 4; T++) {
                gdn_step st = {.kind = T == 1 ? GDN_STEP_DECODE : GDN_STEP_VERIFY, .tokens = T, .batch = B, .slots = slots};
                gdn_status s1 = gdn_engine_begin_step(e, &st, NULL, NULL);
                gdn_status s2 = gdn_engine_run_step(e, NULL);
                gdn_status s3 = T == 1 ? GDN_OK : gdn_engine_upload(e, gdn_engine_accepted(e), accepted, sizeof(int32_t) * (size_t)B, NULL);
                gdn_status s4 = T == 1 ? GDN_OK : gdn_engine_commit(e, NULL);
                if (s1 || s2 || s3 || s4) worst = s1 ? s1 : (s2 ? s2 : (s3 ? s3 : s4));
            }
        }
    }
    const uint64_t host_after = gdn__thread_allocated_bytes(), library_after = gdn__allocation_count();
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    cudaMemGetInfo(&free_after, &total);
    cr_assert_eq(worst, GDN_OK, "a step failed: %s", gdn_status_name(worst));
    cr_assert_eq(library_after, library_before, "the library allocated %llu times on the step path",
                 (unsigned long long)(library_after - library_before));
    /* jemalloc's counter also sees the CUDA runtime's own mallocs, which are not ours to control:
     * report it, and require that it stays small (no per-step growth of our making). */
    cr_log_info("jemalloc thread.allocated grew by %llu bytes over 3 x 44 steps (CUDA runtime included)",
                (unsigned long long)(host_after - host_before));
    cr_assert_eq(gdn__cuda_device_allocations(), device_before, "the library allocated device memory on the step path");
    /* cudaMemGetInfo sees the whole device, other processes included (a sanitizer, a parallel test):
     * report it, but the library's own counter above is the check. */
    cr_log_info("device free memory moved by %lld bytes over the steps (whole device)",
                (long long)free_before - (long long)free_after);
    gdn_engine_destroy(e);
}

Test(gpu_engine, a_step_returns_while_the_gpu_is_busy)
{
    test_require_gpu();
    gdn_engine *e = cuda_engine(GDN_GRAPHS_LAZY, 9, GDN_DTYPE_F32);
    cudaStream_t stream;
    cr_assert_eq(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const int32_t rows[] = {1, 2, 3}, accepted[] = {1, 2, 0};
    /* Warm up: capture the graphs used below. */
    for (int kind = 0; kind < 2; kind++) {
        gdn_step st = {.kind = kind ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = kind ? 3 : 1, .batch = 3, .slots = rows};
        cr_assert_eq(gdn_engine_begin_step(e, &st, stream, NULL), GDN_OK);
        cr_assert_eq(gdn_engine_run_step(e, stream), GDN_OK);
        if (kind) cr_assert_eq(gdn_engine_commit(e, stream), GDN_OK);
    }
    cr_assert_eq(cudaStreamSynchronize(stream), cudaSuccess);
    cr_assert_eq(test_gpu_spin(stream, 200.0), 0); /* 200 ms of GPU work queued ahead of the steps */
    cr_assert_eq(gdn_engine_upload(e, gdn_engine_accepted(e), accepted, sizeof accepted, stream), GDN_OK);
    const double t0 = now_us();
    for (int i = 0; i < 5; i++) {
        gdn_step verify = {.kind = GDN_STEP_VERIFY, .tokens = 3, .batch = 3, .slots = rows};
        cr_assert_eq(gdn_engine_begin_step(e, &verify, stream, NULL), GDN_OK);
        cr_assert_eq(gdn_engine_run_step(e, stream), GDN_OK);
        cr_assert_eq(gdn_engine_commit(e, stream), GDN_OK);
        gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 3, .slots = rows};
        cr_assert_eq(gdn_engine_begin_step(e, &decode, stream, NULL), GDN_OK);
        cr_assert_eq(gdn_engine_run_step(e, stream), GDN_OK);
    }
    const double elapsed = now_us() - t0;
    cr_assert_eq(cudaStreamQuery(stream), cudaErrorNotReady, "the steps waited for the GPU");
    cr_assert_lt(elapsed, 50000.0, "10 steps took %.0f us of host time behind a 200 ms kernel", elapsed);
    cr_log_info("10 steps enqueued in %.1f us of host time while the GPU was busy", elapsed);
    cr_assert_eq(cudaStreamSynchronize(stream), cudaSuccess);
    cr_assert_eq(gdn_engine_check_device_error(e, stream), GDN_OK);
    cudaStreamDestroy(stream);
    gdn_engine_destroy(e);
}

/* The synchronous calls order after the engine's own stream and wait for nothing else: a long kernel
 * on an unrelated blocking stream (which a legacy-stream or device synchronisation would wait for)
 * is still running when they return; a long kernel ahead of the engine's step on its stream is not. */
Test(gpu_engine, synchronous_calls_wait_for_the_engines_stream_only, .timeout = 300)
{
    test_require_gpu();
    gdn_engine *e = cuda_engine(GDN_GRAPHS_LAZY, 21, GDN_DTYPE_F32);
    const gdn_engine_config *c = gdn_engine_get_config(e);
    cudaStream_t engine_stream, unrelated;
    cr_assert_eq(cudaStreamCreateWithFlags(&engine_stream, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaStreamCreate(&unrelated), cudaSuccess); /* blocking: synchronises with the legacy stream */
    const size_t state_bytes = (size_t)c->model.num_v_heads * c->model.head_dim_v * c->model.head_dim_k * sizeof(float);
    float *before = gdn__malloc(state_bytes), *after = gdn__malloc(state_bytes);
    float *params = gdn__malloc(2 * (size_t)c->model.num_v_heads * sizeof(float));
    cr_assert(before && after && params);
    const int32_t rows[] = {5};
    cr_assert_eq(gdn_slot_read_state(e, 1, 5, before), GDN_OK);

    /* Ordering: 100 ms of work ahead of a decode step on the engine's stream; the read must see the step. */
    cr_assert_eq(test_gpu_spin(engine_stream, 100.0), 0);
    gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = rows};
    cr_assert_eq(gdn_engine_begin_step(e, &decode, engine_stream, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_run_step(e, engine_stream), GDN_OK);
    cr_assert_eq(gdn_slot_read_state(e, 1, 5, after), GDN_OK);
    cr_assert_eq(cudaStreamQuery(engine_stream), cudaSuccess, "the read returned before the engine's step ran");
    cr_assert_neq(memcmp(before, after, state_bytes), 0, "the read did not see the step's state");

    /* Independence: 300 ms on the unrelated stream; every synchronous call returns while it runs. */
    cr_assert_eq(test_gpu_spin(unrelated, 300.0), 0);
    const double t0 = now_us();
    cr_assert_eq(gdn_slot_read_state(e, 0, 5, after), GDN_OK);
    cr_assert_eq(gdn_slot_write_state(e, 0, 5, after), GDN_OK);
    for (int32_t h = 0; h < 2 * c->model.num_v_heads; h++) params[h] = 0.25f;
    cr_assert_eq(gdn_engine_set_layer_params(e, 2, params, params + c->model.num_v_heads), GDN_OK);
    const double elapsed = now_us() - t0;
    cr_assert_eq(cudaStreamQuery(unrelated), cudaErrorNotReady, "a synchronous call waited for an unrelated stream");
    cr_assert_lt(elapsed, 100000.0, "three synchronous calls took %.0f us behind an unrelated 300 ms kernel", elapsed);
    cr_assert_eq(cudaStreamSynchronize(unrelated), cudaSuccess);
    gdn__free(before);
    gdn__free(after);
    gdn__free(params);
    cudaStreamDestroy(engine_stream);
    cudaStreamDestroy(unrelated);
    gdn_engine_destroy(e);
}

/* The caller's own work in the captured graph: copy its "projected q" buffer into the layer's q,
 * then run the layer. */
typedef struct user_model {
    void *d_q[3];     /* the caller's own per-layer q, [max_batch * max_tokens * HK * K] bf16 */
    size_t q_bytes;
    int calls;
} user_model;

static gdn_status user_capture(void *user, gdn_engine *e, gdn_step_kind kind, int32_t tokens, int32_t bucket, void *stream)
{
    (void)kind, (void)tokens, (void)bucket;
    user_model *m = user;
    m->calls++;
    for (int32_t l = 0; l < 3; l++) {
        gdn_layer_io io;
        gdn_engine_layer_io(e, l, &io);
        if (cudaMemcpyAsync(io.q, m->d_q[l], m->q_bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess)
            return GDN_ECUDA;
        gdn_status s = gdn_engine_run_layer(e, l, stream);
        if (s != GDN_OK) return s;
    }
    return GDN_OK;
}

Test(gpu_engine, capture_callback_work_is_replayed_with_the_step, .timeout = 300)
{
    test_require_gpu();
    user_model m = {.q_bytes = (size_t)32 * 4 * 16 * 128 * 2};
    for (int l = 0; l < 3; l++) cr_assert_eq(cudaMalloc(&m.d_q[l], m.q_bytes), cudaSuccess);
    gdn_engine *plain = cuda_engine(GDN_GRAPHS_OFF, 11, GDN_DTYPE_F32);
    gdn_engine_config c = *gdn_engine_get_config(plain);
    c.graph_mode = GDN_GRAPHS_LAZY, c.capture = user_capture, c.capture_user = &m, c.num_buckets = 0;
    test_rng rng = test_rng_seeded(11);
    gdn_engine *with_callback = test_engine_create(&c, &rng, NULL);
    int32_t s;
    for (int i = 0; i < 40; i++) {
        gdn_slot_alloc(with_callback, &s);
        test_fill_slot_state(with_callback, s, &rng);
    }
    const int32_t rows[] = {4, 8, 15};
    for (int round = 0; round < 3; round++) {
        /* New "projections" each round: the callback's copy must run in every fold. */
        test_rng inputs = test_rng_seeded(500 + (uint64_t)round);
        for (int32_t l = 0; l < 3; l++) {
            test_inputs in;
            test_write_inputs(plain, l, 3, 1, &inputs, &in);
            test_inputs_free(&in);
            gdn_layer_io io;
            gdn_engine_layer_io(plain, l, &io);
            cr_assert_eq(cudaMemcpy(m.d_q[l], io.q, m.q_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
            gdn_engine_layer_io(with_callback, l, &io);
            gdn_layer_io pio;
            gdn_engine_layer_io(plain, l, &pio);
            cr_assert_eq(cudaMemset(io.q, 0, m.q_bytes), cudaSuccess); /* only the callback fills q */
            const size_t k_bytes = m.q_bytes, v_bytes = m.q_bytes * 2, g_bytes = (size_t)32 * 4 * 32 * 2;
            cr_assert_eq(cudaMemcpy(io.k, pio.k, k_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
            cr_assert_eq(cudaMemcpy(io.v, pio.v, v_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
            cr_assert_eq(cudaMemcpy(io.a, pio.a, g_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
            cr_assert_eq(cudaMemcpy(io.b, pio.b, g_bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
        }
        test_run_step(plain, GDN_STEP_DECODE, 1, 3, rows, NULL);
        test_run_step(with_callback, GDN_STEP_DECODE, 1, 3, rows, NULL);
        for (int i = 0; i < 3; i++) {
            unsigned char *a = test_snapshot_slot(plain, rows[i]), *b = test_snapshot_slot(with_callback, rows[i]);
            cr_assert_eq(memcmp(a, b, 3 * test_state_bytes(plain)), 0, "round %d row %d", round, i);
            free(a), free(b);
        }
    }
    cr_assert_eq(m.calls, 1, "captured once, replayed after");
    for (int l = 0; l < 3; l++) cudaFree(m.d_q[l]);
    gdn_engine_destroy(plain);
    gdn_engine_destroy(with_callback);
}

/* Fault injection: every device allocation of gdn_engine_create, and each graph capture (at creation
 * and lazily on the step path), fails in turn: the call returns its status, no device allocation is
 * left behind, an engine that existed stays usable, and a following create works. */
static gdn_engine_config fault_config(gdn_verify_strategy strategy, gdn_graph_mode mode)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 8, 4, 2);
    c.backend = GDN_BACKEND_CUDA;
    c.verify_strategy = strategy;
    c.graph_mode = mode;
    return c;
}

Test(gpu_engine, every_device_allocation_and_capture_failure_is_reported_and_leaks_nothing, .timeout = 300)
{
    test_require_gpu();
    const gdn_verify_strategy strategies[] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_RING};
    for (size_t si = 0; si < 3; si++) {
        const int64_t live = gdn__cuda_live_allocations();
        gdn_engine_config c = fault_config(strategies[si], GDN_GRAPHS_AT_CREATE);
        const uint64_t before = gdn__cuda_device_allocations();
        gdn_engine *e = NULL;
        cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
        const int64_t allocations = (int64_t)(gdn__cuda_device_allocations() - before);
        cr_assert_gt(allocations, 3);
        gdn_engine_destroy(e);
        cr_assert_eq(gdn__cuda_live_allocations(), live, "destroy left device allocations");
        for (int64_t n = 0; n < allocations; n++) { /* each allocation fails in turn */
            gdn__cuda_fail_alloc_after(n);
            e = NULL;
            cr_assert_eq(gdn_engine_create(&c, &e), GDN_ENOMEM, "strategy %zu, allocation %lld", si, (long long)n);
            cr_assert_null(e);
            cr_assert_eq(gdn__cuda_live_allocations(), live, "strategy %zu, allocation %lld leaked", si, (long long)n);
        }
        gdn__cuda_fail_alloc_after(-1);
        const int32_t buckets = c.num_buckets ? c.num_buckets : 3; /* 1, 2, 4 for max_batch 4 */
        const int64_t graphs = (int64_t)buckets * (1 + 2 * c.max_tokens);
        for (int64_t n = 0; n < graphs; n += 3) { /* captures at creation fail in turn */
            gdn__cuda_fail_capture_after(n);
            e = NULL;
            cr_assert_eq(gdn_engine_create(&c, &e), GDN_ECUDA, "strategy %zu, capture %lld", si, (long long)n);
            cr_assert_eq(gdn__cuda_live_allocations(), live, "strategy %zu, capture %lld leaked", si, (long long)n);
        }
        gdn__cuda_fail_capture_after(-1);

        /* A lazy capture that fails on the step path: the step reports it, the engine stays usable and
         * the same step then runs (captured on the retry) with the twin's results. */
        gdn_engine_config lazy = fault_config(strategies[si], GDN_GRAPHS_LAZY);
        test_rng rng = test_rng_seeded(300 + si);
        gdn_engine *twin = test_engine_create(&lazy, &rng, NULL);
        rng = test_rng_seeded(300 + si);
        e = test_engine_create(&lazy, &rng, NULL);
        int32_t slots[3];
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(gdn_slot_alloc(e, &slots[i]), GDN_OK);
            cr_assert_eq(gdn_slot_alloc(twin, &slots[i]), GDN_OK);
            test_rng fill = test_rng_seeded(400 + (uint64_t)i);
            test_fill_slot_state(e, slots[i], &fill);
            fill = test_rng_seeded(400 + (uint64_t)i);
            test_fill_slot_state(twin, slots[i], &fill);
        }
        gdn__cuda_fail_capture_after(0);
        gdn_step decode = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 3, .slots = slots};
        cr_assert_eq(gdn_engine_begin_step(e, &decode, NULL, NULL), GDN_OK);
        cr_assert_eq(gdn_engine_run_step(e, NULL), GDN_ECUDA, "the failed lazy capture is reported");
        cr_assert_neq(strlen(gdn_engine_last_error(e)), 0);
        gdn__cuda_fail_capture_after(-1);
        test_run_step(e, GDN_STEP_DECODE, 1, 3, slots, NULL);
        test_run_step(twin, GDN_STEP_DECODE, 1, 3, slots, NULL);
        for (int i = 0; i < 3; i++) {
            unsigned char *a = test_snapshot_slot(e, slots[i]), *b = test_snapshot_slot(twin, slots[i]);
            cr_assert_eq(memcmp(a, b, 2 * test_state_bytes(e)), 0, "strategy %zu slot %d after the retry", si, slots[i]);
            free(a), free(b);
        }
        cr_assert_eq(gdn_engine_check_device_error(e, NULL), GDN_OK);
        gdn_engine_destroy(e);
        gdn_engine_destroy(twin);
        cr_assert_eq(gdn__cuda_live_allocations(), live, "strategy %zu: device allocations left", si);
    }
}

/* Programmatic dependent launch (launch_overlap): a layer kernel may start while the caller's kernel
 * before it is still running, but must read the step's inputs only after that kernel ends. Here the
 * caller's kernel allows its dependents at once, spins 2 ms and only then writes layer 1's inputs
 * (poisoned until then). Under every strategy, decode and verify + commit steps give outputs and
 * states bit-exact with a twin engine that has the overlap off and its inputs written up front. */
static void late_inputs_are_waited_for(gdn_verify_strategy strategy, gdn_dtype state_dtype, uint64_t seed)
{
    gdn_engine *engines[2];
    for (int k = 0; k < 2; k++) {
        gdn_engine_config c = test_config("qwen3-next", 3, state_dtype, 40, 32, 4);
        c.backend = GDN_BACKEND_CUDA;
        c.verify_strategy = strategy;
        c.graph_mode = GDN_GRAPHS_OFF;
        c.launch_overlap = k == 0;
        test_rng rng = test_rng_seeded(seed);
        engines[k] = test_engine_create(&c, &rng, NULL);
        int32_t slot;
        for (int i = 0; i < 40; i++) {
            cr_assert_eq(gdn_slot_alloc(engines[k], &slot), GDN_OK);
            test_fill_slot_state(engines[k], slot, &rng);
        }
    }
    const gdn_engine_config *c = gdn_engine_get_config(engines[0]);
    const size_t rows_tokens = (size_t)c->max_batch * c->max_tokens, in = gdn_dtype_size(c->input_dtype);
    const size_t HK = (size_t)c->model.num_k_heads, HV = (size_t)c->model.num_v_heads;
    const size_t bytes[5] = {rows_tokens * HK * c->model.head_dim_k * in, rows_tokens * HK * c->model.head_dim_k * in,
                             rows_tokens * HV * c->model.head_dim_v * in, rows_tokens * HV * in, rows_tokens * HV * in};
    void *side[5];
    for (int n = 0; n < 5; n++) cr_assert_eq(cudaMalloc(&side[n], bytes[n]), cudaSuccess);
    cudaStream_t stream;
    cr_assert_eq(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

    const int32_t batches[] = {5, 9, 17, 3}, tokens[] = {1, 3, 4, 1};
    for (int s = 0; s < 4; s++) {
        const int32_t B = batches[s], T = tokens[s];
        const gdn_step_kind kind = T > 1 ? GDN_STEP_VERIFY : GDN_STEP_DECODE;
        int32_t rows[32], accepted[32];
        for (int32_t i = 0; i < B; i++) rows[i] = (int32_t)((i * 11 + s * 5) % 40), accepted[i] = (i + s) % (T + 1);
        for (int32_t i = 0; i < B; i++)
            for (int32_t j = 0; j < i; j++)
                if (rows[j] == rows[i]) rows[i] = -1;
        for (int k = 0; k < 2; k++) {
            test_rng inputs = test_rng_seeded(seed * 100 + (uint64_t)s);
            for (int32_t l = 0; l < 3; l++) {
                test_inputs drawn;
                test_write_inputs(engines[k], l, B, T, &inputs, &drawn);
                test_inputs_free(&drawn);
                test_poison_outputs(engines[k], l);
            }
        }
        /* Engine 0: layer 1's inputs set aside and poisoned; the late writer restores them. */
        gdn_layer_io io;
        gdn_engine_layer_io(engines[0], 1, &io);
        void *dst[5] = {io.q, io.k, io.v, io.a, io.b};
        for (int n = 0; n < 5; n++) {
            cr_assert_eq(cudaMemcpy(side[n], dst[n], bytes[n], cudaMemcpyDeviceToDevice), cudaSuccess);
            cr_assert_eq(cudaMemset(dst[n], 0x7f, bytes[n]), cudaSuccess);
        }
        cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
        gdn_step step = {.kind = kind, .tokens = T, .batch = B, .slots = rows};
        cr_assert_eq(gdn_engine_begin_step(engines[0], &step, stream, NULL), GDN_OK);
        cr_assert_eq(gdn_engine_run_layer(engines[0], 0, stream), GDN_OK);
        cr_assert_eq(test_gpu_late_writer(stream, dst, (const void *const *)side, bytes, 5, 2.0), 0);
        cr_assert_eq(gdn_engine_run_layer(engines[0], 1, stream), GDN_OK);
        cr_assert_eq(gdn_engine_run_layer(engines[0], 2, stream), GDN_OK);
        if (kind == GDN_STEP_VERIFY) {
            cr_assert_eq(gdn_engine_upload(engines[0], gdn_engine_accepted(engines[0]), accepted, sizeof(int32_t) * (size_t)B,
                                           stream), GDN_OK);
            cr_assert_eq(gdn_engine_commit(engines[0], stream), GDN_OK);
        }
        cr_assert_eq(cudaStreamSynchronize(stream), cudaSuccess);
        test_run_step(engines[1], kind, T, B, rows, NULL);
        if (kind == GDN_STEP_VERIFY) {
            test_set_accepted(engines[1], accepted, B);
            cr_assert_eq(gdn_engine_commit(engines[1], NULL), GDN_OK);
        }
        test_assert_twins_match(engines[0], engines[1], B, T, s);
    }
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(gdn_engine_check_device_error(engines[k], NULL), GDN_OK);
        gdn_engine_destroy(engines[k]);
    }
    for (int n = 0; n < 5; n++) cudaFree(side[n]);
    cudaStreamDestroy(stream);
}

Test(gpu_engine, overlapped_launch_waits_for_late_inputs_cache, .timeout = 300)
{
    test_require_gpu();
    late_inputs_are_waited_for(GDN_VERIFY_CACHE, GDN_DTYPE_BF16, 31);
}
Test(gpu_engine, overlapped_launch_waits_for_late_inputs_fold, .timeout = 300)
{
    test_require_gpu();
    late_inputs_are_waited_for(GDN_VERIFY_FOLD, GDN_DTYPE_BF16, 32);
}
Test(gpu_engine, overlapped_launch_waits_for_late_inputs_ring, .timeout = 300)
{
    test_require_gpu();
    late_inputs_are_waited_for(GDN_VERIFY_RING, GDN_DTYPE_BF16, 33);
}
/* With fp32 state the ring's verifies run its one-kernel step, which reads the records before its
 * wait and the step's inputs after it (bf16 chains take the streamed kernel). */
Test(gpu_engine, overlapped_launch_waits_for_late_inputs_ring_f32, .timeout = 300)
{
    test_require_gpu();
    late_inputs_are_waited_for(GDN_VERIFY_RING, GDN_DTYPE_F32, 34);
}

Test(gpu_engine, fold_strategy_runs_on_the_gpu_with_auto_backend)
{
    test_require_gpu();
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 4, 4, 2);
    c.verify_strategy = GDN_VERIFY_FOLD;
    c.backend = GDN_BACKEND_AUTO; /* AUTO picks the GPU here, whatever the strategy */
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    cr_assert_eq(gdn_engine_backend(e), GDN_BACKEND_CUDA);
    gdn_memory_report m;
    cr_assert_eq(gdn_engine_memory(e, &m), GDN_OK);
    cr_assert_eq(m.verify_cache, 0, "fold keeps no per-token states");
    cr_assert_gt(m.token_store, 0);
    gdn_engine_destroy(e);
}

/* A launch that fails reports its CUDA text through gdn_engine_last_error (the launchers consume the
 * error with cudaGetLastError; the text must survive that). The hook makes the next launch a real
 * failing one (an empty grid). */
Test(gpu_engine, a_failed_launch_keeps_its_cuda_text)
{
    test_require_gpu();
    gdn_engine_config c = test_config("tiny", 1, GDN_DTYPE_F32, 4, 4, 2);
    c.backend = GDN_BACKEND_CUDA;
    c.graph_mode = GDN_GRAPHS_OFF;
    gdn_engine *e = NULL;
    cr_assert_eq(gdn_engine_create(&c, &e), GDN_OK);
    int32_t slot;
    cr_assert_eq(gdn_slot_alloc(e, &slot), GDN_OK);
    gdn_step step = {.kind = GDN_STEP_DECODE, .tokens = 1, .batch = 1, .slots = &slot};
    cr_assert_eq(gdn_engine_begin_step(e, &step, NULL, NULL), GDN_OK);
    cr_assert_str_eq(gdn_engine_last_error(e), "");
    gdn__cuda_fail_next_launch();
    cr_assert_eq(gdn_engine_run_layer(e, 0, NULL), GDN_ECUDA);
    const char *text = gdn_engine_last_error(e);
    /* (Before the fix the launcher had consumed the error and the text read "no error".) */
    cr_assert(strstr(text, "invalid") != NULL && strstr(text, "no error") == NULL, "last_error: '%s'", text);
    cr_assert(strstr(text, "gdn__cuda_") != NULL, "the failing launcher is named: '%s'", text);
    gdn_engine_destroy(e);
}

/* A graph per (bucket, kind, T) that the caller captures itself: its own work (a memset of its own
 * buffer), the step's rows, every layer and the commit, captured once with GDN_STEP_CALLER_WORK steps
 * and then replayed with only begin_step before each launch. Over 60 steps with changing rows,
 * padding and accepted counts it must be bit-exact with a twin engine driven the ordinary way
 * (engine-captured graphs). Engine-tracked calls on the capturing stream are refused. */
Test(gpu_engine, caller_captured_graphs_match_engine_steps, .timeout = 600)
{
    test_require_gpu();
    gdn_engine_config c = test_config("tiny", 3, GDN_DTYPE_F32, 24, 16, 4);
    c.backend = GDN_BACKEND_CUDA;
    gdn_engine *e[2];
    for (int k = 0; k < 2; k++) {
        test_rng rng = test_rng_seeded(91);
        e[k] = test_engine_create(&c, &rng, NULL);
        for (int32_t s = 0; s < 24; s++) {
            int32_t slot;
            cr_assert_eq(gdn_slot_alloc(e[k], &slot), GDN_OK);
            test_fill_slot_state(e[k], slot, &rng);
        }
    }
    const gdn_engine_config *rc = gdn_engine_get_config(e[1]);
    cudaStream_t stream;
    cr_assert_eq(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    void *own = NULL;
    cr_assert_eq(cudaMalloc(&own, 4096), cudaSuccess);
    enum { SHAPES = 64 * 2 * 5 };
    cudaGraphExec_t graphs[SHAPES] = {0};
    int captures = 0;
    test_rng plan = test_rng_seeded(92);
    for (int step = 0; step < 60; step++) {
        const int verify = step % 3 != 0;
        const int32_t T = verify ? 1 + test_rng_below(&plan, 4) : 1, B = 1 + test_rng_below(&plan, 16);
        int32_t rows[16], accepted[16], used[24] = {0};
        for (int32_t i = 0; i < B; i++) {
            int32_t s;
            do s = test_rng_below(&plan, 24);
            while (used[s]);
            used[s] = 1;
            rows[i] = test_rng_below(&plan, 8) == 0 ? -1 : s;
            accepted[i] = test_rng_below(&plan, T + 1);
        }
        for (int k = 0; k < 2; k++) {
            test_rng inputs = test_rng_seeded(1000 + (uint64_t)step);
            for (int32_t l = 0; l < 3; l++) {
                test_inputs in;
                test_write_inputs(e[k], l, B, T, &inputs, &in);
                test_inputs_free(&in);
                test_poison_outputs(e[k], l);
            }
            if (verify) test_set_accepted(e[k], accepted, B);
            cr_assert_eq(gdn_engine_synchronize(e[k], NULL), GDN_OK);
        }
        test_run_step(e[0], verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, B, rows, NULL);
        if (verify) cr_assert_eq(gdn_engine_commit(e[0], NULL), GDN_OK);

        gdn_step st = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = B, .slots = rows,
                       .flags = GDN_STEP_CALLER_WORK};
        int32_t bucket = 0, bucket_index = 0;
        cr_assert_eq(gdn_engine_begin_step(e[1], &st, stream, &bucket), GDN_OK);
        while (rc->buckets[bucket_index] != bucket) bucket_index++;
        cudaGraphExec_t *exec = &graphs[(bucket_index * 2 + verify) * 5 + T];
        if (!*exec) {
            cudaGraph_t graph;
            cr_assert_eq(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
            cr_assert_eq(cudaMemsetAsync(own, step & 0xff, 4096, stream), cudaSuccess); /* the caller's own work */
            cr_assert_eq(gdn_engine_run_layer(e[1], 0, stream), GDN_EMISUSE, "engine-tracked call in a caller capture");
            cr_assert_eq(gdn_engine_enqueue_rows(e[1], stream), GDN_OK);
            for (int32_t l = 0; l < 3; l++) cr_assert_eq(gdn_engine_enqueue_layer(e[1], l, stream), GDN_OK);
            if (verify) cr_assert_eq(gdn_engine_enqueue_commit(e[1], stream), GDN_OK);
            cr_assert_eq(cudaStreamEndCapture(stream, &graph), cudaSuccess);
            cr_assert_eq(cudaGraphInstantiate(exec, graph, 0), cudaSuccess);
            cudaGraphDestroy(graph);
            captures++;
        }
        cr_assert_eq(cudaGraphLaunch(*exec, stream), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(stream), cudaSuccess);
        cr_assert_eq(gdn_engine_synchronize(e[0], NULL), GDN_OK);

        test_assert_twins_match(e[0], e[1], B, T, step);
    }
    cr_assert_lt(captures, 60, "graphs were replayed, not only captured");
    for (int i = 0; i < SHAPES; i++)
        if (graphs[i]) cudaGraphExecDestroy(graphs[i]);
    cudaFree(own);
    cudaStreamDestroy(stream);
    for (int k = 0; k < 2; k++) gdn_engine_destroy(e[k]);
}

/* Device-side slot operations with pending tokens and ring records, on the GPU. */
Test(gpu_engine, slot_operations_cache) { test_require_gpu(); slot_ops_keep_current_states(GDN_BACKEND_CUDA, GDN_VERIFY_CACHE, 95); }
Test(gpu_engine, slot_operations_fold) { test_require_gpu(); slot_ops_keep_current_states(GDN_BACKEND_CUDA, GDN_VERIFY_FOLD, 96); }
Test(gpu_engine, slot_operations_ring) { test_require_gpu(); slot_ops_keep_current_states(GDN_BACKEND_CUDA, GDN_VERIFY_RING, 97); }

/* The serving-loop check (tests/serving_loop_check.c) on the GPU, both strategies it models. */
Test(gpu_engine, serving_loop_matches_the_reference, .timeout = 600)
{
    test_require_gpu();
    char *cache[] = {"check", "--backend", "cuda", "--steps", "96", "--verify", "cache", "--preset", "qwen3-next"};
    cr_assert_eq(gdn_serving_loop_check(9, cache), 0);
    char *fold[] = {"check", "--backend", "cuda", "--steps", "96", "--verify", "fold", "--state", "bf16"};
    cr_assert_eq(gdn_serving_loop_check(9, fold), 0);
}

Test(gpu_engine, k_not_equal_v_and_l2norm_off)
{
    test_require_gpu();
    run_odd_geometry_steps(GDN_BACKEND_CUDA);
}

#else /* no CUDA in this build: one test that says so by skipping */

Test(gpu_engine, skipped_without_cuda)
{
    test_require_gpu();
    cr_assert_fail("a build without CUDA cannot have a usable GPU");
}

#endif
