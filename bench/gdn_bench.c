/*
 * gdn-bench: validates and times the CUDA layer-step and commit kernels (SPEC section 5).
 *
 * For every (preset, state dtype, B, T) of the sweep it
 *   1. validates the configuration once against the float64 reference (kernels/ref/) on fresh random
 *      inputs (SPEC 4 distributions) at min(B, 4) rows, one of them a padding row when B >= 2: output,
 *      pool (and cache) within SPEC 4 tolerances, slots outside the step and the padding row bit-exact,
 *      graph replay bit-exact with the direct launch, and for verify also commit bit-exact;
 *   2. times the step with the state cold: it rotates among enough distinct pools (and caches) that
 *      the footprint exceeds 4x the L2 size, as direct launches and as a replayed CUDA graph of N
 *      launches, with CUDA events, after a warm-up, median of many samples;
 *   3. reports us per layer step, bytes moved, GB/s and the percentage of the device-to-device copy
 *      bandwidth measured at start (2 GiB buffers).
 * A failed validation makes the exit code nonzero. --json FILE writes every result.
 *
 *   gdn-bench [--quick] [--preset qwen3-next,qwen3.5,tiny,wide] [--state f32,bf16] [--batch 1,2,...]
 *             [--tokens 1,2,...] [--commit] [--strided] [--json FILE] [--no-time]
 *   gdn-bench --engine ...       the whole-engine step of a 36-layer model (bench_engine.c)
 *   gdn-bench --strategies ...   cache, fold and ring verify: memory beyond the pools, decode and
 *                                verify + commit time, bytes moved (bench_strategies.c)
 *   gdn-bench --tree ...         per-row counts and token trees: verify + commit beside chains (bench_tree.c)
 *   gdn-bench --drift ...        bf16-state drift from a float64 run over thousands of decode steps,
 *                                per-token rounding vs the ring strategy (bench_drift.c)
 *   gdn-bench --ceilings ...     plain read and read + write passes of the state's shape beside the
 *                                copy ceiling: the floors of the decodes (bench_ceilings.cu)
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "kernels/dtype_convert.h"
#include "kernels/gdn_cuda.h"
#include "kernels/ref/gdn_ref.h"
#include "kernels/ref/gdn_spec.h"

/* ---------------------------------------------------------------------------------------------- */
/* Helpers                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

static gdn__rng bench_rng = {0x9e3779b97f4a7c15ull}; /* the tests' source (kernels/ref/gdn_spec.h) */

void gdn_bench_rng_seed(uint64_t seed) { bench_rng = gdn__rng_seeded(seed); }
uint64_t gdn_bench_rng_next(void) { return gdn__rng_next(&bench_rng); }
double gdn_bench_rng_normal(void) { return gdn__rng_normal(&bench_rng); }
void gdn_bench_shuffle(int32_t *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        const int x = (int)(gdn_bench_rng_next() % (uint64_t)(i + 1));
        const int32_t t = a[i];
        a[i] = a[x], a[x] = t;
    }
}

/* n elements of `dtype` drawn from sigma * N(0, 1). */
static void fill_normal(void *dst, gdn_dtype dtype, int64_t n, double sigma)
{
    for (int64_t i = 0; i < n; i++) gdn__store_f32(dst, dtype, i, (float)(sigma * gdn_bench_rng_normal()));
}

static double now_s(void) { return bench_now_s(); }
static double median(double *v, int n) { return bench_median(v, n); }

static size_t dsize(gdn_dtype d) { return d == GDN_DTYPE_F32 ? 4 : 2; }
static const char *dname(gdn_dtype d) { return d == GDN_DTYPE_F32 ? "f32" : d == GDN_DTYPE_BF16 ? "bf16" : "f16"; }

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = (int)strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* Presets and options                                                                              */
/* ---------------------------------------------------------------------------------------------- */

typedef struct preset {
    const char *name;
    int HK, HV, K, V;
} preset;

/* The library's model presets (gdn_model_preset), then shapes that are not models. */
static preset presets[] = {
    {"qwen3-next", 0, 0, 0, 0},
    {"qwen3.5", 0, 0, 0, 0},
    {"tiny", 0, 0, 0, 0},
    {"wide", 2, 4, 256, 256}, /* not a model: covers K = V = 256 */
};

static int load_model_presets(void)
{
    for (int j = 0; j < 3; j++) {
        gdn_model_config m;
        if (gdn_model_preset(presets[j].name, 1, &m) != GDN_OK) return -1;
        presets[j].HK = m.num_k_heads, presets[j].HV = m.num_v_heads;
        presets[j].K = m.head_dim_k, presets[j].V = m.head_dim_v;
    }
    return 0;
}

typedef struct options {
    int npresets;
    const preset *presets[8];
    int nstates;
    gdn_dtype states[2];
    int nbatch, batch[32];
    int ntokens, tokens[32];
    int commit, time, reps;
    const char *json;
} options;

typedef struct result {
    const char *preset;
    gdn_dtype state;
    int B, T;
    double val_pct; /* max error, % of tolerance */
    int val_ok;
    double direct_us, graph_us, host_us, bytes, gbps, pct_copy;
    int instances;
    double commit_us, commit_bytes, commit_gbps, commit_pct; /* per layer; T >= 2 with --commit */
} result;

static double copy_gbps; /* device-to-device copy bandwidth, bytes read + written per second / 1e9 */
static size_t l2_bytes;

/* ---------------------------------------------------------------------------------------------- */
/* Copy ceiling                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

static int measure_copy(cudaStream_t s)
{
    const size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    CHECK_CUDA(cudaMemsetAsync(a, 0x3c, bytes, s));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double t[20];
    for (int r = -3; r < 20; r++) {
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    copy_gbps = 2.0 * bytes / median(t, 20) / 1e9;
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    return 0;
}

/* The copy ceiling for the other modes (bench_strategies.c): the same measurement. */
int gdn_bench_copy_ceiling(cudaStream_t s, double *gbps)
{
    if (measure_copy(s)) return -1;
    *gbps = copy_gbps;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* Validation against the float64 reference                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Tolerances of SPEC 4 (kernels/ref/gdn_spec.h). */
static void tolerances(gdn_dtype state, double *out_abs, double *out_rel, double *st_abs, double *st_rel)
{
    const gdn__tolerance t = gdn__spec4_tolerance(state);
    *out_abs = t.out_abs, *out_rel = t.out_rel, *st_abs = t.state_abs, *st_rel = t.state_rel;
}

/* Max of |got - want| / (abs + rel * |want|) over n elements; NaN counts as infinitely wrong. */
static double max_ratio(const void *got, const void *want, gdn_dtype d, int64_t n, double abs_tol, double rel_tol)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = gdn__load_f32(got, d, i), w = gdn__load_f32(want, d, i);
        double r = fabs(g - w) / (abs_tol + rel_tol * fabs(w));
        if (!(r <= worst)) worst = isnan(r) ? INFINITY : r;
    }
    return worst;
}

typedef struct host_case {
    gdn__layer_params p; /* host pointers */
    size_t q_bytes, v_bytes, ab_bytes, out_bytes, pool_bytes, cache_bytes;
} host_case;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/*
 * Validates one configuration; *pct receives the largest error as % of its tolerance (bit-exact checks
 * count as 0% or infinity). Returns 0 when it passes, 1 when it fails, -1 on a CUDA error.
 */
static int validate(const preset *pr, gdn_dtype sd, int B, int T, cudaStream_t s, double *pct)
{
    const int Bv = B < 4 ? B : 4;
    const int slots = Bv + 3; /* spare slots that must stay untouched */
    const int HK = pr->HK, HV = pr->HV, K = pr->K, V = pr->V;
    const int64_t slot = (int64_t)HV * V * K;
    const size_t es = dsize(sd);
    gdn__layer_params h = {0};
    h.B = Bv, h.T = T, h.HK = HK, h.HV = HV, h.K = K, h.V = V;
    h.scale = 1.0f / sqrtf((float)K);
    h.use_qk_l2norm = 1;
    h.input_dtype = GDN_DTYPE_BF16, h.state_dtype = sd, h.output_dtype = GDN_DTYPE_BF16;
    h.num_slots = slots, h.slot_stride = slot;
    const size_t nq = (size_t)Bv * T * HK * K, nv = (size_t)Bv * T * HV * V, nab = (size_t)Bv * T * HV;
    const size_t pool_bytes = (size_t)slots * slot * es, cache_bytes = T > 1 ? (size_t)Bv * T * slot * es : 0;
    void *q = xmalloc(nq * 2), *k = xmalloc(nq * 2), *v = xmalloc(nv * 2), *a = xmalloc(nab * 2), *b = xmalloc(nab * 2);
    float *A_log = xmalloc(HV * 4), *dt_bias = xmalloc(HV * 4);
    void *pool0 = xmalloc(pool_bytes), *pool_ref = xmalloc(pool_bytes), *pool_gpu = xmalloc(pool_bytes);
    void *pool_graph = xmalloc(pool_bytes), *out_ref = xmalloc(nv * 2), *out_gpu = xmalloc(nv * 2);
    void *out_graph = xmalloc(nv * 2);
    void *cache_ref = xmalloc(cache_bytes), *cache_gpu = xmalloc(cache_bytes), *cache_graph = xmalloc(cache_bytes);
    int32_t rs[4], accepted[4];
    fill_normal(q, GDN_DTYPE_BF16, (int64_t)nq, 1.0);
    fill_normal(k, GDN_DTYPE_BF16, (int64_t)nq, 1.0);
    fill_normal(v, GDN_DTYPE_BF16, (int64_t)nv, 1.0);
    fill_normal(a, GDN_DTYPE_BF16, (int64_t)nab, 0.1);
    fill_normal(b, GDN_DTYPE_BF16, (int64_t)nab, 0.1);
    fill_normal(A_log, GDN_DTYPE_F32, HV, 0.1);
    fill_normal(dt_bias, GDN_DTYPE_F32, HV, 0.1);
    fill_normal(pool0, sd, (int64_t)slots * slot, 0.1);
    for (int i = 0; i < Bv; i++) rs[i] = slots - 1 - 2 * i; /* scattered, not 0..Bv-1 */
    if (Bv >= 2) rs[1] = -1;                                /* a padding row */
    for (int i = 0; i < Bv; i++) accepted[i] = (int32_t)((i * 7 + 1) % (T + 1)); /* 1, 0 (pad), ... */
    if (Bv >= 3) accepted[2] = T;
    if (Bv >= 4) accepted[3] = 0;

    /* Device copies. */
    void *d_q, *d_k, *d_v, *d_a, *d_b, *d_pool, *d_out, *d_cache = NULL;
    float *d_A, *d_dt;
    int32_t *d_rs, *d_acc, *d_flag;
    CHECK_CUDA(cudaMalloc(&d_q, nq * 2));
    CHECK_CUDA(cudaMalloc(&d_k, nq * 2));
    CHECK_CUDA(cudaMalloc(&d_v, nv * 2));
    CHECK_CUDA(cudaMalloc(&d_a, nab * 2));
    CHECK_CUDA(cudaMalloc(&d_b, nab * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_A, HV * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_dt, HV * 4));
    CHECK_CUDA(cudaMalloc(&d_pool, pool_bytes));
    CHECK_CUDA(cudaMalloc(&d_out, nv * 2));
    if (cache_bytes) CHECK_CUDA(cudaMalloc(&d_cache, cache_bytes));
    CHECK_CUDA(cudaMalloc((void **)&d_rs, 4 * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_acc, 4 * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_flag, 4));
    CHECK_CUDA(cudaMemcpy(d_q, q, nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_k, k, nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_v, v, nv * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_a, a, nab * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_b, b, nab * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_A, A_log, HV * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_dt, dt_bias, HV * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_rs, rs, Bv * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_acc, accepted, Bv * 4, cudaMemcpyHostToDevice));

    gdn__layer_params d = h;
    d.q = d_q, d.k = d_k, d.v = d_v, d.a = d_a, d.b = d_b, d.A_log = d_A, d.dt_bias = d_dt;
    d.state = d_pool, d.out = d_out, d.read_slots = d_rs, d.error_flag = d_flag;
    d.cache = d_cache, d.cache_row_stride = T > 1 ? (int64_t)T * slot : 0;

    /* Direct launch, then the same inputs through a captured graph. */
    for (int pass = 0; pass < 2; pass++) {
        CHECK_CUDA(cudaMemcpy(d_pool, pool0, pool_bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemset(d_out, 0xff, nv * 2)); /* poison: bf16 NaN */
        if (d_cache) CHECK_CUDA(cudaMemset(d_cache, 0xff, cache_bytes));
        CHECK_CUDA(cudaMemset(d_flag, 0, 4));
        if (pass == 0) {
            CHECK_GDN(gdn__cuda_layer_step(&d, s));
        } else {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            CHECK_GDN(gdn__cuda_layer_step(&d, s));
            CHECK_CUDA(cudaStreamEndCapture(s, &g));
            CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
            CHECK_CUDA(cudaGraphLaunch(ge, s));
            CHECK_CUDA(cudaStreamSynchronize(s));
            CHECK_CUDA(cudaGraphExecDestroy(ge));
            CHECK_CUDA(cudaGraphDestroy(g));
        }
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_CUDA(cudaMemcpy(pass ? out_graph : out_gpu, d_out, nv * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(pass ? pool_graph : pool_gpu, d_pool, pool_bytes, cudaMemcpyDeviceToHost));
        if (d_cache) CHECK_CUDA(cudaMemcpy(pass ? cache_graph : cache_gpu, d_cache, cache_bytes, cudaMemcpyDeviceToHost));
    }
    int32_t flag = -1;
    CHECK_CUDA(cudaMemcpy(&flag, d_flag, 4, cudaMemcpyDeviceToHost));

    /* Reference on host copies. */
    memcpy(pool_ref, pool0, pool_bytes);
    memset(out_ref, 0xff, nv * 2);
    if (cache_bytes) memset(cache_ref, 0xff, cache_bytes);
    gdn__layer_params r = h;
    r.q = q, r.k = k, r.v = v, r.a = a, r.b = b, r.A_log = A_log, r.dt_bias = dt_bias;
    r.state = pool_ref, r.out = out_ref, r.read_slots = rs, r.cache = cache_bytes ? cache_ref : NULL;
    r.cache_row_stride = d.cache_row_stride;
    if (gdn__ref_layer_step(&r) != GDN_OK) return -1;

    double oa, orl, sa, srl;
    tolerances(sd, &oa, &orl, &sa, &srl);
    double worst = max_ratio(out_gpu, out_ref, GDN_DTYPE_BF16, (int64_t)nv, oa, orl);
    const char *what = "output";
    double e;
    /* Pool: compared with the tolerance (slots in the step) and bit-exact elsewhere (pad/untouched). */
    for (int sl = 0; sl < slots; sl++) {
        int in_step = 0;
        for (int i = 0; i < Bv; i++) in_step |= rs[i] == sl;
        const char *gp = (const char *)pool_gpu + (size_t)sl * slot * es, *rp = (const char *)pool_ref + (size_t)sl * slot * es;
        if (in_step && T == 1) {
            e = max_ratio(gp, rp, sd, slot, sa, srl);
        } else {
            e = memcmp(gp, rp, (size_t)slot * es) ? INFINITY : 0.0;
        }
        if (e > worst) worst = e, what = in_step && T == 1 ? "state" : "untouched slot";
    }
    if (cache_bytes)
        for (int i = 0; i < Bv; i++) {
            if (rs[i] < 0) continue; /* padding rows: the cache is not written, content undefined */
            e = max_ratio((const char *)cache_gpu + (size_t)i * T * slot * es, (const char *)cache_ref + (size_t)i * T * slot * es,
                          sd, (int64_t)T * slot, sa, srl);
            if (e > worst) worst = e, what = "cache";
        }
    if (memcmp(out_gpu, out_graph, nv * 2) || memcmp(pool_gpu, pool_graph, pool_bytes) ||
        (cache_bytes && memcmp(cache_gpu, cache_graph, cache_bytes)))
        worst = INFINITY, what = "graph vs direct";
    if (flag != 0) worst = INFINITY, what = "error flag";

    /* Commit (verify only): one layer, the GPU cache as source on both sides, bit-exact. */
    if (cache_bytes) {
        gdn__commit_params c = {0};
        c.B = Bv, c.T = T, c.num_layers = 1, c.HV = HV, c.K = K, c.V = V, c.state_dtype = sd;
        c.num_slots = slots, c.slot_stride = slot, c.cache_row_stride = d.cache_row_stride;
        c.state_layer_stride = (int64_t)slots * slot, c.cache_layer_stride = (int64_t)Bv * T * slot;
        c.state = d_pool, c.cache = d_cache, c.read_slots = d_rs, c.accepted = d_acc, c.error_flag = d_flag;
        CHECK_GDN(gdn__cuda_commit(&c, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_CUDA(cudaMemcpy(pool_graph, d_pool, pool_bytes, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(&flag, d_flag, 4, cudaMemcpyDeviceToHost));
        memcpy(pool_ref, pool_gpu, pool_bytes); /* the pool after the verify (unchanged) */
        c.state = pool_ref, c.cache = cache_gpu, c.read_slots = rs, c.accepted = accepted, c.error_flag = NULL;
        gdn__ref_commit(&c);
        if (memcmp(pool_graph, pool_ref, pool_bytes) || flag != 0) worst = INFINITY, what = "commit";
    }

    *pct = 100.0 * worst;
    const int ok = worst <= 1.0;
    if (!ok)
        fprintf(stderr, "VALIDATION FAILED: %s %s B=%d T=%d: %s at %.1f%% of tolerance\n", pr->name, dname(sd), B, T,
                what, 100.0 * worst);

    cudaFree(d_q), cudaFree(d_k), cudaFree(d_v), cudaFree(d_a), cudaFree(d_b), cudaFree(d_A), cudaFree(d_dt);
    cudaFree(d_pool), cudaFree(d_out), cudaFree(d_cache), cudaFree(d_rs), cudaFree(d_acc), cudaFree(d_flag);
    free(q), free(k), free(v), free(a), free(b), free(A_log), free(dt_bias), free(pool0), free(pool_ref);
    free(pool_gpu), free(pool_graph), free(out_ref), free(out_gpu), free(out_graph), free(cache_ref);
    free(cache_gpu), free(cache_graph);
    return ok ? 0 : 1;
}

/*
 * The 64-bit offset check: a qwen3.5 bf16 pool of 2050 slots (4.3 GB, 2.15e9 elements) updated at its
 * last slot, whose element offset is past 2^31, compared with the reference run on a one-slot pool.
 */
static int validate_large_offset(cudaStream_t s, double *pct)
{
    const preset *pr = &presets[1];
    const int64_t slot = (int64_t)pr->HV * pr->V * pr->K, slots = 2050;
    gdn__layer_params h = {0};
    h.B = 1, h.T = 1, h.HK = pr->HK, h.HV = pr->HV, h.K = pr->K, h.V = pr->V;
    h.scale = 1.0f / sqrtf((float)pr->K), h.use_qk_l2norm = 1;
    h.input_dtype = GDN_DTYPE_BF16, h.state_dtype = GDN_DTYPE_BF16, h.output_dtype = GDN_DTYPE_F32;
    h.slot_stride = slot;
    const size_t nq = (size_t)pr->HK * pr->K, nv = (size_t)pr->HV * pr->V;
    void *q = xmalloc(nq * 2), *k = xmalloc(nq * 2), *v = xmalloc(nv * 2), *a = xmalloc(pr->HV * 2), *b = xmalloc(pr->HV * 2);
    float *A_log = xmalloc(pr->HV * 4), *dt = xmalloc(pr->HV * 4), *o_ref = xmalloc(nv * 4), *o_gpu = xmalloc(nv * 4);
    void *S_ref = xmalloc(slot * 2), *S_gpu = xmalloc(slot * 2);
    fill_normal(q, GDN_DTYPE_BF16, nq, 1.0), fill_normal(k, GDN_DTYPE_BF16, nq, 1.0);
    fill_normal(v, GDN_DTYPE_BF16, nv, 1.0), fill_normal(a, GDN_DTYPE_BF16, pr->HV, 0.1);
    fill_normal(b, GDN_DTYPE_BF16, pr->HV, 0.1), fill_normal(A_log, GDN_DTYPE_F32, pr->HV, 0.1);
    fill_normal(dt, GDN_DTYPE_F32, pr->HV, 0.1), fill_normal(S_ref, GDN_DTYPE_BF16, slot, 0.1);
    void *d_q, *d_k, *d_v, *d_a, *d_b, *d_pool, *d_out;
    float *d_A, *d_dt;
    int32_t *d_rs;
    const int32_t last = (int32_t)(slots - 1);
    CHECK_CUDA(cudaMalloc(&d_pool, (size_t)slots * slot * 2));
    CHECK_CUDA(cudaMalloc(&d_q, nq * 2));
    CHECK_CUDA(cudaMalloc(&d_k, nq * 2));
    CHECK_CUDA(cudaMalloc(&d_v, nv * 2));
    CHECK_CUDA(cudaMalloc(&d_a, pr->HV * 2));
    CHECK_CUDA(cudaMalloc(&d_b, pr->HV * 2));
    CHECK_CUDA(cudaMalloc((void **)&d_A, pr->HV * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_dt, pr->HV * 4));
    CHECK_CUDA(cudaMalloc(&d_out, nv * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_rs, 4));
    CHECK_CUDA(cudaMemcpy(d_q, q, nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_k, k, nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_v, v, nv * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_a, a, pr->HV * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_b, b, pr->HV * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_A, A_log, pr->HV * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_dt, dt, pr->HV * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_rs, &last, 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_pool, 0, (size_t)slots * slot * 2));
    char *d_last = (char *)d_pool + (size_t)last * slot * 2;
    CHECK_CUDA(cudaMemcpy(d_last, S_ref, slot * 2, cudaMemcpyHostToDevice));
    gdn__layer_params d = h;
    d.q = d_q, d.k = d_k, d.v = d_v, d.a = d_a, d.b = d_b, d.A_log = d_A, d.dt_bias = d_dt;
    d.state = d_pool, d.num_slots = slots, d.out = d_out, d.read_slots = d_rs;
    CHECK_GDN(gdn__cuda_layer_step(&d, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(o_gpu, d_out, nv * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(S_gpu, d_last, slot * 2, cudaMemcpyDeviceToHost));
    const int32_t zero = 0;
    gdn__layer_params r = h;
    r.q = q, r.k = k, r.v = v, r.a = a, r.b = b, r.A_log = A_log, r.dt_bias = dt;
    r.state = S_ref, r.num_slots = 1, r.out = o_ref, r.read_slots = &zero;
    if (gdn__ref_layer_step(&r) != GDN_OK) return -1;
    double oa, orl, sa, srl;
    tolerances(GDN_DTYPE_BF16, &oa, &orl, &sa, &srl);
    double e1 = max_ratio(o_gpu, o_ref, GDN_DTYPE_F32, nv, oa, orl), e2 = max_ratio(S_gpu, S_ref, GDN_DTYPE_BF16, slot, sa, srl);
    *pct = 100.0 * (e1 > e2 ? e1 : e2);
    cudaFree(d_pool), cudaFree(d_q), cudaFree(d_k), cudaFree(d_v), cudaFree(d_a), cudaFree(d_b);
    cudaFree(d_A), cudaFree(d_dt), cudaFree(d_out), cudaFree(d_rs);
    free(q), free(k), free(v), free(a), free(b), free(A_log), free(dt), free(o_ref), free(o_gpu), free(S_ref), free(S_gpu);
    return *pct <= 100.0 ? 0 : 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* Timing                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

/* Fills `bytes` of device memory with copies of `src` (src_bytes of random data). */
static int fill_device(void *dst, size_t bytes, const void *src, size_t src_bytes, cudaStream_t s)
{
    for (size_t off = 0; off < bytes; off += src_bytes) {
        size_t n = bytes - off < src_bytes ? bytes - off : src_bytes;
        CHECK_CUDA(cudaMemcpyAsync((char *)dst + off, src, n, cudaMemcpyDeviceToDevice, s));
    }
    return 0;
}

/* Times `n` launches of `fn` per sample: direct (host loop) and as one replayed graph. */
typedef int (*launch_fn)(void *ctx, int j, cudaStream_t s);

static int time_launches(launch_fn fn, void *ctx, int n, int reps, cudaStream_t s, double *direct_us,
                         double *graph_us, double *host_us)
{
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double *td = xmalloc(sizeof(double) * reps), *tg = xmalloc(sizeof(double) * reps), *th = xmalloc(sizeof(double) * reps);
    for (int j = 0; j < n; j++) /* warm-up */
        if (fn(ctx, j, s)) return -1;
    for (int r = 0; r < reps; r++) {
        CHECK_CUDA(cudaEventRecord(e0, s));
        double h0 = now_s();
        for (int j = 0; j < n; j++)
            if (fn(ctx, j, s)) return -1;
        th[r] = (now_s() - h0) / n * 1e6;
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        td[r] = ms * 1e3 / n;
    }
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < n; j++)
        if (fn(ctx, j, s)) return -1;
    CHECK_CUDA(cudaStreamEndCapture(s, &g));
    CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
    CHECK_CUDA(cudaGraphLaunch(ge, s)); /* warm-up */
    for (int r = 0; r < reps; r++) {
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_CUDA(cudaGraphLaunch(ge, s));
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        tg[r] = ms * 1e3 / n;
    }
    *direct_us = median(td, reps), *graph_us = median(tg, reps), *host_us = median(th, reps);
    CHECK_CUDA(cudaGraphExecDestroy(ge));
    CHECK_CUDA(cudaGraphDestroy(g));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    free(td), free(tg), free(th);
    return 0;
}

typedef struct step_ctx {
    gdn__layer_params p;  /* instance 0 */
    int instances;
    const int32_t *d_slots; /* [instances, B] */
    int64_t cache_instance_stride;
} step_ctx;

static int launch_step(void *vctx, int j, cudaStream_t s)
{
    const step_ctx *c = vctx;
    gdn__layer_params p = c->p;
    const int inst = j % c->instances;
    p.read_slots = c->d_slots + (int64_t)inst * p.B;
    if (p.cache) p.cache = (char *)p.cache + (size_t)inst * c->cache_instance_stride * dsize(p.state_dtype);
    CHECK_GDN(gdn__cuda_layer_step(&p, s));
    return 0;
}

typedef struct commit_ctx {
    gdn__commit_params p;
    const int32_t *d_accepted; /* [T, B]: launch j uses row j % T */
} commit_ctx;

static int launch_commit(void *vctx, int j, cudaStream_t s)
{
    const commit_ctx *c = vctx;
    gdn__commit_params p = c->p;
    p.accepted = c->d_accepted + (int64_t)(j % p.T) * p.B;
    CHECK_GDN(gdn__cuda_commit(&p, s));
    return 0;
}

/* --strided: the timed kernels read q, k, v as column slices of one fused projection [B, T, 2 HK K + HV V]
 * and a, b interleaved [B, T, 2 HV], as a serving engine holds them (SPEC 2); same bytes as dense. */
static int strided_inputs;

/* Times one configuration with cold state; fills the timing fields of `res`. */
static int time_case(const preset *pr, gdn_dtype sd, int B, int T, int do_commit, int reps_max, cudaStream_t s,
                     const void *d_rand, size_t rand_bytes, result *res)
{
    const int HK = pr->HK, HV = pr->HV, K = pr->K, V = pr->V;
    const int64_t slot = (int64_t)HV * V * K;
    const size_t es = dsize(sd), slot_bytes = (size_t)slot * es;
    const int verify = T > 1;
    const size_t per_inst = (size_t)B * slot_bytes * (1 + (verify ? T : 0));
    int inst = (int)((4 * l2_bytes + per_inst - 1) / per_inst) + 1;
    if (inst > 512) inst = 512;
    size_t free_b, total_b;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const size_t nq = (size_t)B * T * HK * K, nv = (size_t)B * T * HV * V, nab = (size_t)B * T * HV;
    const size_t io_bytes = (2 * nq + 2 * nv + 2 * nab) * 2 + 4096;
    while (inst > 1 && (size_t)inst * per_inst + io_bytes > free_b * 0.9) inst--;
    if ((size_t)inst * per_inst + io_bytes > free_b * 0.9) {
        fprintf(stderr, "skip %s %s B=%d T=%d: needs %.1f GB\n", pr->name, dname(sd), B, T, (inst * per_inst) / 1e9);
        res->direct_us = res->graph_us = NAN;
        return 0;
    }
    void *d_pool, *d_cache = NULL, *d_io;
    int32_t *d_slots, *d_acc;
    float *d_A;
    CHECK_CUDA(cudaMalloc(&d_pool, (size_t)inst * B * slot_bytes));
    if (verify) CHECK_CUDA(cudaMalloc(&d_cache, (size_t)inst * B * T * slot_bytes));
    CHECK_CUDA(cudaMalloc(&d_io, io_bytes));
    CHECK_CUDA(cudaMalloc((void **)&d_slots, (size_t)inst * B * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_acc, (size_t)T * B * 4));
    CHECK_CUDA(cudaMalloc((void **)&d_A, 2 * HV * 4));
    /* Random contents: the state in its dtype (the random source holds 0.1 * N(0,1) of that dtype),
     * inputs as bf16 from the bf16 part of the source. */
    if (fill_device(d_pool, (size_t)inst * B * slot_bytes, (const char *)d_rand + (sd == GDN_DTYPE_BF16 ? rand_bytes / 2 : 0),
                    rand_bytes / 2, s))
        return -1;
    if (fill_device(d_io, io_bytes, (const char *)d_rand + rand_bytes / 2, rand_bytes / 2, s)) return -1;
    if (fill_device(d_A, 2 * HV * 4, d_rand, rand_bytes / 2, s)) return -1;
    /* Slots: instance j uses the slots j*B .. j*B+B-1, shuffled. */
    int32_t *slots = xmalloc((size_t)inst * B * 4), *acc = xmalloc((size_t)T * B * 4);
    for (int j = 0; j < inst; j++) {
        int32_t *row = slots + (size_t)j * B;
        for (int i = 0; i < B; i++) row[i] = j * B + i;
        gdn_bench_shuffle(row, B);
    }
    for (int j = 0; j < T; j++)
        for (int i = 0; i < B; i++) acc[(size_t)j * B + i] = (i + j) % T + 1;
    CHECK_CUDA(cudaMemcpy(d_slots, slots, (size_t)inst * B * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_acc, acc, (size_t)T * B * 4, cudaMemcpyHostToDevice));

    step_ctx c = {0};
    gdn__layer_params *p = &c.p;
    p->B = B, p->T = T, p->HK = HK, p->HV = HV, p->K = K, p->V = V;
    p->scale = 1.0f / sqrtf((float)K), p->use_qk_l2norm = 1;
    p->input_dtype = GDN_DTYPE_BF16, p->state_dtype = sd, p->output_dtype = GDN_DTYPE_BF16;
    char *io = d_io;
    p->q = io, io += nq * 2;
    p->k = io, io += nq * 2;
    p->v = io, io += nv * 2;
    p->a = io, io += nab * 2;
    p->b = io, io += nab * 2;
    p->out = io, io += nv * 2;
    if (strided_inputs) { /* the same bytes, laid out as a fused projection and interleaved gates */
        const int64_t N = 2 * (int64_t)HK * K + (int64_t)HV * V;
        char *fused = d_io, *ab = fused + nq * 4 + nv * 2;
        p->q = fused, p->k = fused + (size_t)HK * K * 2, p->v = fused + (size_t)2 * HK * K * 2;
        p->q_strides = p->k_strides = (gdn__strides){T * N, N, K};
        p->v_strides = (gdn__strides){T * N, N, V};
        p->a = ab, p->b = ab + (size_t)HV * 2;
        p->a_strides = p->b_strides = (gdn__strides){(int64_t)T * 2 * HV, 2 * HV, 1};
    }
    p->A_log = d_A, p->dt_bias = d_A + HV;
    p->state = d_pool, p->num_slots = (int64_t)inst * B, p->slot_stride = slot;
    p->cache = d_cache, p->cache_row_stride = verify ? (int64_t)T * slot : 0;
    c.instances = inst, c.d_slots = d_slots, c.cache_instance_stride = (int64_t)B * T * slot;

    /* Launches per sample: at least every instance once and about 200 us of work. */
    double d_us, g_us, h_us;
    if (time_launches(launch_step, &c, inst, 3, s, &d_us, &g_us, &h_us)) return -1;
    int n = inst;
    while (n * g_us < 200.0 && n < 4096) n *= 2;
    int reps = (int)(0.25e6 / (n * g_us));
    reps = reps < 5 ? 5 : reps > reps_max ? reps_max : reps;
    if (time_launches(launch_step, &c, n, reps, s, &d_us, &g_us, &h_us)) return -1;
    /* State: decode reads and writes it once; verify reads it once and writes T cache entries; both
     * are B * slot_bytes * (1 + T). Plus q, k, v, a, b read and o written (all bf16). */
    const double bytes = (double)B * slot_bytes * (1 + T) + (double)(2 * nq + nv + 2 * nab) * 2 + (double)nv * 2;
    res->direct_us = d_us, res->graph_us = g_us, res->host_us = h_us, res->bytes = bytes;
    res->gbps = bytes / (g_us * 1e-6) / 1e9, res->pct_copy = 100.0 * res->gbps / copy_gbps, res->instances = inst;

    if (do_commit && verify) {
        commit_ctx cc = {0};
        gdn__commit_params *q = &cc.p;
        q->B = B, q->T = T, q->num_layers = inst, q->HV = HV, q->K = K, q->V = V, q->state_dtype = sd;
        q->state = d_pool, q->state_layer_stride = (int64_t)B * slot, q->num_slots = B, q->slot_stride = slot;
        q->cache = d_cache, q->cache_layer_stride = (int64_t)B * T * slot, q->cache_row_stride = (int64_t)T * slot;
        q->read_slots = d_slots, q->accepted = d_acc;
        cc.d_accepted = d_acc;
        /* Per-layer slots: the first instance's list is a permutation of 0..B-1. */
        double cd, cg, ch;
        const int cn = T < 4 ? 4 : T;
        if (time_launches(launch_commit, &cc, cn, 3, s, &cd, &cg, &ch)) return -1;
        int creps = (int)(0.2e6 / (cn * cg));
        creps = creps < 5 ? 5 : creps > reps_max ? reps_max : creps;
        if (time_launches(launch_commit, &cc, cn, creps, s, &cd, &cg, &ch)) return -1;
        res->commit_us = cg / inst; /* per layer */
        res->commit_bytes = 2.0 * B * slot_bytes;
        res->commit_gbps = res->commit_bytes / (res->commit_us * 1e-6) / 1e9;
        res->commit_pct = 100.0 * res->commit_gbps / copy_gbps;
    }
    CHECK_CUDA(cudaStreamSynchronize(s));
    cudaFree(d_pool), cudaFree(d_cache), cudaFree(d_io), cudaFree(d_slots), cudaFree(d_acc), cudaFree(d_A);
    free(slots), free(acc);
    return 0;
}

/*
 * The launch floor: a B = 1 step whose only row is padding (one slot-index load, V output zeros per
 * head, no state traffic), timed like a case. What a B = 1 step costs beyond moving its state.
 */
static int measure_floor(const preset *pr, cudaStream_t s, double *graph_us)
{
    const int64_t slot = (int64_t)pr->HV * pr->V * pr->K;
    void *d_buf;
    const size_t bytes = (size_t)slot * 4 + 65536;
    CHECK_CUDA(cudaMalloc(&d_buf, bytes));
    CHECK_CUDA(cudaMemset(d_buf, 0, bytes));
    step_ctx c = {0};
    gdn__layer_params *p = &c.p;
    p->B = 1, p->T = 1, p->HK = pr->HK, p->HV = pr->HV, p->K = pr->K, p->V = pr->V;
    p->scale = 1.0f, p->use_qk_l2norm = 1;
    p->input_dtype = GDN_DTYPE_BF16, p->state_dtype = GDN_DTYPE_F32, p->output_dtype = GDN_DTYPE_BF16;
    char *b = (char *)d_buf + (size_t)slot * 4;
    p->q = b, p->k = b + 8192, p->v = b + 16384, p->a = b + 32768, p->b = b + 36864, p->out = b + 40960;
    p->A_log = (const float *)(b + 57344), p->dt_bias = (const float *)(b + 59392);
    p->state = d_buf, p->num_slots = 1, p->slot_stride = slot;
    int32_t *d_rs = (int32_t *)(b + 61440);
    const int32_t pad = -1;
    CHECK_CUDA(cudaMemcpy(d_rs, &pad, 4, cudaMemcpyHostToDevice));
    c.instances = 1, c.d_slots = d_rs;
    double d_us, h_us;
    if (time_launches(launch_step, &c, 200, 20, s, &d_us, graph_us, &h_us)) return -1;
    CHECK_CUDA(cudaFree(d_buf));
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* Main                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: gdn-bench [--quick] [--preset a,b] [--state f32,bf16] [--batch 1,2,..] "
                    "[--tokens 1,2,..] [--commit] [--strided] [--no-time] [--reps N] [--json FILE]\n"
                    "       gdn-bench --engine ... | --strategies ... | --drift ... | --tree ... | --ceilings ...  (each takes --help)\n");
}

static void write_json(const char *path, const result *rs, int n, const char *gpu)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return;
    }
    fprintf(f, "{\n  \"gpu\": \"%s\",\n  \"copy_gbps\": %.1f,\n  \"l2_bytes\": %zu,\n  \"results\": [\n", gpu, copy_gbps, l2_bytes);
    for (int i = 0; i < n; i++) {
        const result *r = &rs[i];
        fprintf(f,
                "    {\"preset\": \"%s\", \"state\": \"%s\", \"B\": %d, \"T\": %d, \"validation_pct_of_tol\": %.2f, "
                "\"valid\": %s, \"direct_us\": %.3f, \"graph_us\": %.3f, \"host_us\": %.3f, \"bytes\": %.0f, "
                "\"gbps\": %.1f, \"pct_copy\": %.1f, \"instances\": %d",
                r->preset, dname(r->state), r->B, r->T, isfinite(r->val_pct) ? r->val_pct : 1e9, r->val_ok ? "true" : "false",
                isnan(r->direct_us) ? -1.0 : r->direct_us, isnan(r->graph_us) ? -1.0 : r->graph_us, r->host_us, r->bytes,
                r->gbps, r->pct_copy, r->instances);
        if (r->commit_us > 0)
            fprintf(f, ", \"commit_us_per_layer\": %.3f, \"commit_bytes_per_layer\": %.0f, \"commit_gbps\": %.1f, "
                       "\"commit_pct_copy\": %.1f", r->commit_us, r->commit_bytes, r->commit_gbps, r->commit_pct);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--engine")) return gdn_bench_engine_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--strategies")) return gdn_bench_strategies_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--drift")) return gdn_bench_drift_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--tree")) return gdn_bench_tree_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--ceilings")) return gdn_bench_ceilings_main(argc - 1, argv + 1);
    if (load_model_presets()) {
        fprintf(stderr, "gdn-bench: gdn_model_preset failed\n");
        return 2;
    }
    options o = {0};
    o.time = 1, o.reps = 50;
    static const int def_batch[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, def_tokens[] = {1, 2, 4, 8, 16};
    const char *preset_arg = "qwen3-next,qwen3.5", *state_arg = "f32,bf16";
    int quick = 0;
    o.nbatch = 10, memcpy(o.batch, def_batch, sizeof def_batch);
    o.ntokens = 5, memcpy(o.tokens, def_tokens, sizeof def_tokens);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            quick = 1;
        } else if (!strcmp(a, "--commit")) {
            o.commit = 1;
        } else if (!strcmp(a, "--strided")) {
            strided_inputs = 1;
        } else if (!strcmp(a, "--no-time")) {
            o.time = 0;
        } else if (v && !strcmp(a, "--preset")) {
            preset_arg = v, i++;
        } else if (v && !strcmp(a, "--state")) {
            state_arg = v, i++;
        } else if (v && !strcmp(a, "--batch")) {
            o.nbatch = parse_list(v, o.batch, 32), i++;
        } else if (v && !strcmp(a, "--tokens")) {
            o.ntokens = parse_list(v, o.tokens, 32), i++;
        } else if (v && !strcmp(a, "--reps")) {
            o.reps = atoi(v), i++;
        } else if (v && !strcmp(a, "--json")) {
            o.json = v, i++;
        } else {
            usage();
            return 2;
        }
    }
    if (quick) {
        static const int qb[] = {1, 64, 256}, qt[] = {1, 4};
        if (!strcmp(preset_arg, "qwen3-next,qwen3.5")) preset_arg = "qwen3-next";
        o.nbatch = 3, memcpy(o.batch, qb, sizeof qb);
        o.ntokens = 2, memcpy(o.tokens, qt, sizeof qt);
        o.reps = 15;
    }
    for (size_t j = 0; j < sizeof presets / sizeof presets[0]; j++) {
        const char *hit = strstr(preset_arg, presets[j].name);
        /* "qwen3-next" must not match inside another name; names here are prefix-free enough. */
        if (hit && (hit == preset_arg || hit[-1] == ',')) o.presets[o.npresets++] = &presets[j];
    }
    if (strstr(state_arg, "f32")) o.states[o.nstates++] = GDN_DTYPE_F32;
    if (strstr(state_arg, "bf16")) o.states[o.nstates++] = GDN_DTYPE_BF16;
    if (!o.npresets || !o.nstates || !o.nbatch || !o.ntokens) {
        usage();
        return 2;
    }

    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 2;
    }
    l2_bytes = (size_t)prop.l2CacheSize;
    /* A blocking stream: it orders with the legacy default stream that the plain cudaMemset and
     * cudaMemcpy calls of the validation use (with a non-blocking stream a poisoning memset could land
     * after the kernel, and it did). */
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) return 2;
    if (o.time && measure_copy(s)) return 2;
    printf("# %s, %d SMs, L2 %.0f MB, copy ceiling %.1f GB/s (2 GiB D2D, read + write)\n", prop.name,
           prop.multiProcessorCount, l2_bytes / 1048576.0, copy_gbps);

    int failures = 0;
    double big_pct = 0;
    int rc = validate_large_offset(s, &big_pct);
    printf("# 64-bit offset check (qwen3.5 bf16, slot 2049, offset > 2^31 elements): %s, %.1f%% of tolerance\n",
           rc == 0 ? "ok" : "FAILED", big_pct);
    if (rc) failures++;

    /* Random source for the timing buffers: the first half fp32, the second bf16, 0.1 * N(0, 1). */
    const size_t rand_bytes = (size_t)64 << 20;
    void *h_rand = xmalloc(rand_bytes), *d_rand;
    fill_normal(h_rand, GDN_DTYPE_F32, (int64_t)(rand_bytes / 2 / 4), 0.1);
    fill_normal((char *)h_rand + rand_bytes / 2, GDN_DTYPE_BF16, (int64_t)(rand_bytes / 2 / 2), 0.1);
    if (cudaMalloc(&d_rand, rand_bytes) != cudaSuccess ||
        cudaMemcpy(d_rand, h_rand, rand_bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        return 2;

    if (o.time)
        for (int pi = 0; pi < o.npresets; pi++) {
            double floor_us;
            if (measure_floor(o.presets[pi], s, &floor_us)) return 3;
            printf("# %s launch floor (B = 1, padding row only, graph replay): %.2f us\n", o.presets[pi]->name, floor_us);
        }

    const int max_results = o.npresets * o.nstates * o.nbatch * o.ntokens;
    result *res = calloc((size_t)max_results, sizeof *res);
    int nres = 0;
    printf("%-10s %-5s %4s %3s %8s %9s %9s %8s %10s %8s %7s", "preset", "state", "B", "T", "val%tol", "direct_us",
           "graph_us", "host_us", "MB", "GB/s", "%copy");
    if (o.commit) printf(" %10s %8s %7s", "commit_us", "GB/s", "%copy");
    printf("\n");
    for (int pi = 0; pi < o.npresets; pi++)
        for (int si = 0; si < o.nstates; si++)
            for (int ti = 0; ti < o.ntokens; ti++)
                for (int bi = 0; bi < o.nbatch; bi++) {
                    const preset *pr = o.presets[pi];
                    const gdn_dtype sd = o.states[si];
                    const int B = o.batch[bi], T = o.tokens[ti];
                    result *r = &res[nres++];
                    r->preset = pr->name, r->state = sd, r->B = B, r->T = T;
                    int v = validate(pr, sd, B, T, s, &r->val_pct);
                    if (v < 0) return 3;
                    r->val_ok = v == 0;
                    failures += v;
                    if (o.time && time_case(pr, sd, B, T, o.commit, o.reps, s, d_rand, rand_bytes, r)) return 3;
                    printf("%-10s %-5s %4d %3d %8.1f %9.2f %9.2f %8.2f %10.2f %8.1f %7.1f", pr->name, dname(sd), B, T,
                           r->val_pct, r->direct_us, r->graph_us, r->host_us, r->bytes / 1e6, r->gbps, r->pct_copy);
                    if (o.commit && T > 1) printf(" %10.2f %8.1f %7.1f", r->commit_us, r->commit_gbps, r->commit_pct);
                    printf("\n");
                    fflush(stdout);
                }
    if (o.json) write_json(o.json, res, nres, prop.name);
    printf("# %d validation failure(s)\n", failures);
    free(res), free(h_rand);
    cudaFree(d_rand);
    cudaStreamDestroy(s);
    return failures ? 1 : 0;
}
