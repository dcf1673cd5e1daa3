/*
 * Tensor parallelism (README, "Several GPUs"): a serving engine that splits Qwen3-Next's heads over
 * tp GPUs runs one engine per device, engine d holding value heads [d HV/tp, (d+1) HV/tp) and key
 * heads [d HK/tp, (d+1) HK/tp) of every layer, all driven from one thread. Here the tp engines run
 * the same steps as one engine holding every head (CUDA, device 0) and as the float64 reference (CPU
 * backend): the union of their outputs and states must match both, with graphs on, while the
 * thread's current device is deliberately left on another GPU before every call. Skips visibly on a
 * host with fewer GPUs than the test needs.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn.h"
#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_spec.h"
#include "support.h"

#ifdef GDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define TP_LAYERS 2
#define TP_SLOTS 6
#define TP_ROWS 4
#define TP_TOKENS 4

/* TP_CPU_TWIN (a developer build, not in meson): every "CUDA" engine on the CPU backend, so that the
 * test's own bookkeeping can be checked on a machine without GPUs. */
#ifdef TP_CPU_TWIN
#undef GDN_HAVE_CUDA
#define GDN_BACKEND_CUDA GDN_BACKEND_CPU
#define test_require_gpu() ((void)0)
#endif

static int device_count(void)
{
#ifdef TP_CPU_TWIN
    return 8;
#endif
#ifdef GDN_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

/* Leaves the thread's current device on a GPU other than `device` (the engines must not care). */
static void wander_from(int device)
{
#ifdef GDN_HAVE_CUDA
    const int n = device_count();
    if (n > 1) cr_assert_eq(cudaSetDevice((device + 1) % n), cudaSuccess);
#else
    (void)device;
#endif
}

static void require_devices(int needed)
{
    test_require_gpu();
    const int have = device_count();
    if (have < needed) {
        char why[128];
        snprintf(why, sizeof why, "needs %d CUDA devices, this host has %d: tensor-parallel test skipped", needed, have);
        cr_skip_test("%s", why);
    }
}

/* One engine of the run and the heads it holds. */
typedef struct tp_engine {
    gdn_engine *e;
    int device;      /* -1: CPU */
    int32_t vh0, hv; /* value heads [vh0, vh0 + hv) */
    int32_t kh0, hk; /* key heads [kh0, kh0 + hk) */
} tp_engine;

static gdn_engine *create(const gdn_engine_config *full, gdn_backend_kind backend, int device, int tp)
{
    gdn_engine_config c = *full;
    c.backend = backend;
    c.device = device < 0 ? 0 : device;
    c.model.num_k_heads /= tp;
    c.model.num_v_heads /= tp;
    gdn_engine *e = NULL;
    if (device >= 0) wander_from(device);
    const gdn_status status = gdn_engine_create(&c, &e);
    cr_assert_eq(status, GDN_OK, "create (device %d, tp %d): %s", device, tp, gdn_status_name(status));
    return e;
}

/* Copies heads [h0, h0 + h) of rows of `heads` heads of `width` elements (`rows` of them) from src
 * into dst (rows of h heads), elements of `esize` bytes. */
static void slice_heads(void *dst, const void *src, size_t rows, int32_t heads, int32_t h0, int32_t h, size_t width, size_t esize)
{
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * (size_t)h * width * esize, (const char *)src + (r * (size_t)heads + (size_t)h0) * width * esize,
               (size_t)h * width * esize);
}

/* Draws SPEC 4 values for n elements of `dtype` into raw. */
static void draw(test_rng *rng, void *raw, size_t n, gdn_dtype dtype, double scale)
{
    for (size_t i = 0; i < n; i++) gdn__store_f32(raw, dtype, (int64_t)i, (float)(scale * test_rng_normal(rng)));
}

static void upload(tp_engine *t, void *dst, const void *src, size_t bytes)
{
    if (t->device >= 0) wander_from(t->device);
    cr_assert_eq(gdn_engine_upload(t->e, dst, src, bytes, NULL), GDN_OK);
}

/*
 * Runs `steps` steps (decodes and committed verifies, one padding row, random accepted counts) on the
 * CPU reference, one CUDA engine with every head, and tp CUDA engines with a share each, and checks
 * every output and, at the end, every state.
 */
static void run_tp(int tp, gdn_verify_strategy strategy, gdn_dtype state_dtype, int steps)
{
    require_devices(tp);
    gdn_engine_config config = test_config("qwen3-next", TP_LAYERS, state_dtype, TP_SLOTS, TP_ROWS, TP_TOKENS);
    config.verify_strategy = strategy;
    const int32_t HK = config.model.num_k_heads, HV = config.model.num_v_heads;
    const int32_t K = config.model.head_dim_k, V = config.model.head_dim_v;
    cr_assert(HK % tp == 0 && HV % tp == 0);

    enum { REF, FULL, PARTS };
    tp_engine eng[PARTS + 8];
    const int count = PARTS + tp;
    eng[REF] = (tp_engine){create(&config, GDN_BACKEND_CPU, -1, 1), -1, 0, HV, 0, HK};
    eng[FULL] = (tp_engine){create(&config, GDN_BACKEND_CUDA, 0, 1), 0, 0, HV, 0, HK};
    for (int d = 0; d < tp; d++)
        eng[PARTS + d] = (tp_engine){create(&config, GDN_BACKEND_CUDA, d, tp), d, d * HV / tp, HV / tp, d * HK / tp, HK / tp};

    test_rng rng = test_rng_seeded(0x7e5a + (uint64_t)tp * 31 + (uint64_t)strategy * 7 + (uint64_t)state_dtype);
    /* Layer parameters, sliced by value head. */
    for (int32_t l = 0; l < TP_LAYERS; l++) {
        float A_log[256], dt_bias[256];
        for (int32_t h = 0; h < HV; h++) A_log[h] = (float)(0.1 * test_rng_normal(&rng)), dt_bias[h] = (float)(0.1 * test_rng_normal(&rng));
        for (int n = 0; n < count; n++) {
            if (eng[n].device >= 0) wander_from(eng[n].device);
            cr_assert_eq(gdn_engine_set_layer_params(eng[n].e, l, A_log + eng[n].vh0, dt_bias + eng[n].vh0), GDN_OK);
        }
    }
    /* The same slots everywhere, with the same random states (each engine its heads). */
    int32_t slots[TP_SLOTS];
    for (int32_t s = 0; s < TP_SLOTS; s++)
        for (int n = 0; n < count; n++) {
            int32_t slot = -1;
            if (eng[n].device >= 0) wander_from(eng[n].device);
            cr_assert_eq(gdn_slot_alloc(eng[n].e, &slot), GDN_OK);
            if (n == 0) slots[s] = slot;
            cr_assert_eq(slot, slots[s], "engines hand out the same slots");
        }
    const size_t head_state = (size_t)V * K, state_size = gdn_dtype_size(state_dtype);
    void *state = malloc((size_t)HV * head_state * state_size);
    for (int32_t s = 0; s < TP_SLOTS; s++)
        for (int32_t l = 0; l < TP_LAYERS; l++) {
            draw(&rng, state, (size_t)HV * head_state, state_dtype, 0.1);
            for (int n = 0; n < count; n++) {
                if (eng[n].device >= 0) wander_from(eng[n].device);
                cr_assert_eq(gdn_slot_write_state(eng[n].e, l, slots[s],
                                                  (const char *)state + (size_t)eng[n].vh0 * head_state * state_size),
                             GDN_OK);
            }
        }

    const gdn_dtype in_dtype = config.input_dtype;
    const size_t in_size = gdn_dtype_size(in_dtype);
    const size_t max_tok = (size_t)TP_ROWS * TP_TOKENS;
    void *q = malloc(max_tok * HK * K * in_size), *k = malloc(max_tok * HK * K * in_size), *v = malloc(max_tok * HV * V * in_size);
    void *a = malloc(max_tok * HV * in_size), *b = malloc(max_tok * HV * in_size), *part = malloc(max_tok * HV * V * in_size);
    const gdn__tolerance tol = gdn__spec4_tolerance(state_dtype);
    size_t exact = 0, compared = 0;

    for (int step = 0; step < steps; step++) {
        const int verify = step % 3 == 2;
        const int32_t T = verify ? 1 + test_rng_below(&rng, TP_TOKENS) : 1;
        /* Rows: distinct slots, the last row padding. */
        int32_t rows[TP_ROWS];
        for (int32_t i = 0; i < TP_ROWS; i++) rows[i] = slots[(step + 2 * i) % TP_SLOTS];
        rows[TP_ROWS - 1] = -1;
        int32_t accepted[TP_ROWS];
        for (int32_t i = 0; i < TP_ROWS; i++) accepted[i] = test_rng_below(&rng, T + 1);
        const size_t tok = (size_t)TP_ROWS * (size_t)T;

        for (int32_t l = 0; l < TP_LAYERS; l++) {
            draw(&rng, q, tok * HK * K, in_dtype, 1.0), draw(&rng, k, tok * HK * K, in_dtype, 1.0);
            draw(&rng, v, tok * HV * V, in_dtype, 1.0);
            draw(&rng, a, tok * HV, in_dtype, 0.1), draw(&rng, b, tok * HV, in_dtype, 0.1);
            for (int n = 0; n < count; n++) {
                tp_engine *t = &eng[n];
                gdn_layer_io io;
                cr_assert_eq(gdn_engine_layer_io(t->e, l, &io), GDN_OK);
                slice_heads(part, q, tok, HK, t->kh0, t->hk, K, in_size), upload(t, io.q, part, tok * t->hk * K * in_size);
                slice_heads(part, k, tok, HK, t->kh0, t->hk, K, in_size), upload(t, io.k, part, tok * t->hk * K * in_size);
                slice_heads(part, v, tok, HV, t->vh0, t->hv, V, in_size), upload(t, io.v, part, tok * t->hv * V * in_size);
                slice_heads(part, a, tok, HV, t->vh0, t->hv, 1, in_size), upload(t, io.a, part, tok * t->hv * in_size);
                slice_heads(part, b, tok, HV, t->vh0, t->hv, 1, in_size), upload(t, io.b, part, tok * t->hv * in_size);
                if (t->device >= 0) wander_from(t->device);
                test_poison_outputs(t->e, l);
                if (t->device >= 0) wander_from(t->device);
                cr_assert_eq(gdn_engine_synchronize(t->e, NULL), GDN_OK); /* the host buffers are reused */
            }
        }
        /* The step on every engine, from this one thread, the current device elsewhere each time. */
        for (int n = 0; n < count; n++) {
            tp_engine *t = &eng[n];
            if (t->device >= 0) wander_from(t->device);
            gdn_step s = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = TP_ROWS, .slots = rows};
            cr_assert_eq(gdn_engine_begin_step(t->e, &s, NULL, NULL), GDN_OK, "begin step %d engine %d", step, n);
            if (t->device >= 0) wander_from(t->device);
            cr_assert_eq(gdn_engine_run_step(t->e, NULL), GDN_OK, "run step %d engine %d", step, n);
            if (verify) {
                upload(t, gdn_engine_accepted(t->e), accepted, sizeof accepted);
                if (t->device >= 0) wander_from(t->device);
                cr_assert_eq(gdn_engine_commit(t->e, NULL), GDN_OK);
            }
        }
        /* Outputs: the full CUDA engine and the union of the parts against the reference, and the
         * union against the full engine. */
        for (int32_t l = 0; l < TP_LAYERS; l++) {
            const size_t n_out = tok * HV * V;
            double *got[PARTS + 8];
            for (int n = 0; n < count; n++) {
                if (eng[n].device >= 0) wander_from(eng[n].device);
                got[n] = test_read_outputs(eng[n].e, l, TP_ROWS, T);
            }
            double *uni = malloc(sizeof(double) * n_out);
            for (int d = 0; d < tp; d++) {
                const tp_engine *t = &eng[PARTS + d];
                for (size_t r = 0; r < tok; r++)
                    memcpy(uni + (r * HV + t->vh0) * V, got[PARTS + d] + r * t->hv * V, sizeof(double) * t->hv * V);
            }
            const double full_err = test_error_ratio(got[FULL], got[REF], n_out, tol.out_abs, tol.out_rel);
            const double tp_err = test_error_ratio(uni, got[REF], n_out, tol.out_abs, tol.out_rel);
            const double tp_full = test_error_ratio(uni, got[FULL], n_out, tol.out_abs, tol.out_rel);
            cr_assert_leq(full_err, 1.0, "step %d layer %d: one engine's outputs at %.0f%% of tolerance", step, l, 100 * full_err);
            cr_assert_leq(tp_err, 1.0, "step %d layer %d: tp %d outputs at %.0f%% of tolerance", step, l, tp, 100 * tp_err);
            cr_assert_leq(tp_full, 1.0, "step %d layer %d: tp %d vs one engine at %.0f%%", step, l, tp, 100 * tp_full);
            for (size_t e = 0; e < n_out; e++) exact += uni[e] == got[FULL][e];
            compared += n_out;
            free(uni);
            for (int n = 0; n < count; n++) free(got[n]);
        }
    }

    /* States: every slot and layer. */
    const size_t n_state = (size_t)HV * head_state;
    size_t state_exact = 0;
    for (int32_t s = 0; s < TP_SLOTS; s++)
        for (int32_t l = 0; l < TP_LAYERS; l++) {
            double *ref = test_read_state(eng[REF].e, l, slots[s]);
            wander_from(0);
            double *full = test_read_state(eng[FULL].e, l, slots[s]);
            for (int d = 0; d < tp; d++) {
                wander_from(d);
                double *got = test_read_state(eng[PARTS + d].e, l, slots[s]);
                const size_t off = (size_t)eng[PARTS + d].vh0 * head_state, n = (size_t)eng[PARTS + d].hv * head_state;
                const double err = test_error_ratio(got, ref + off, n, tol.state_abs, tol.state_rel);
                cr_assert_leq(err, 1.0, "slot %d layer %d device %d: state at %.0f%% of tolerance", slots[s], l, d, 100 * err);
                for (size_t e = 0; e < n; e++) state_exact += got[e] == full[off + e];
                free(got);
            }
            const double full_err = test_error_ratio(full, ref, n_state, tol.state_abs, tol.state_rel);
            cr_assert_leq(full_err, 1.0, "slot %d layer %d: one engine's state at %.0f%% of tolerance", slots[s], l, 100 * full_err);
            free(ref), free(full);
        }
    printf("tp %d %s %s: outputs bit-exact with one engine %zu / %zu, states %zu / %zu\n", tp,
           strategy == GDN_VERIFY_CACHE ? "cache" : strategy == GDN_VERIFY_FOLD ? "fold" : "ring",
           state_dtype == GDN_DTYPE_F32 ? "f32" : "bf16", exact, compared, state_exact,
           (size_t)TP_SLOTS * TP_LAYERS * n_state);
    fflush(stdout);
    if (tp == 1) { /* the same kernels on the same heads */
        cr_assert_eq(exact, compared, "tp 1: %zu of %zu outputs differ from one engine", compared - exact, compared);
        cr_assert_eq(state_exact, (size_t)TP_SLOTS * TP_LAYERS * n_state, "tp 1: states differ from one engine");
    }

    for (int n = 0; n < count; n++) {
        if (eng[n].device >= 0) wander_from(eng[n].device);
        gdn_engine_destroy(eng[n].e);
    }
    free(state), free(q), free(k), free(v), free(a), free(b), free(part);
}

Test(gpu_tp, two_devices_cache_f32, .timeout = 600) { run_tp(2, GDN_VERIFY_CACHE, GDN_DTYPE_F32, test_scaled_steps(24)); }
Test(gpu_tp, two_devices_fold_bf16, .timeout = 600) { run_tp(2, GDN_VERIFY_FOLD, GDN_DTYPE_BF16, test_scaled_steps(24)); }
Test(gpu_tp, two_devices_ring_f32, .timeout = 600) { run_tp(2, GDN_VERIFY_RING, GDN_DTYPE_F32, test_scaled_steps(24)); }
Test(gpu_tp, two_devices_fold_f32, .timeout = 600) { run_tp(2, GDN_VERIFY_FOLD, GDN_DTYPE_F32, test_scaled_steps(24)); }
/* tp = 1 (one engine on device 0 beside the full one): the same kernels on the same heads, so the
 * union must be bit-exact; it runs on any GPU host. */
Test(gpu_tp, one_device_is_bit_exact, .timeout = 600) { run_tp(1, GDN_VERIFY_FOLD, GDN_DTYPE_BF16, test_scaled_steps(12)); }
