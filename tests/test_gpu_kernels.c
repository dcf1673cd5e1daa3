/*
 * GPU kernels against the float64 reference (SPEC 4 tolerances): the layer step (decode in place,
 * verify into the cache) and commit, over the presets, fp32 and bf16 state, B in {1, 3, 64, 257},
 * T in {1, 2, 4, 8, 16}, with scattered slots, random padding rows, separate write slots, poisoned
 * outputs, untouched slots checked bit-exact, and a qwen3.5 pool past 2^31 elements. Every test
 * skips visibly where there is no GPU (or no CUDA in this build).
 *
 * The reference is slow (float64, one thread), so for large batches it checks a random sample of
 * rows plus the last row; every row's padding / untouched-state property is still checked in full.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype_convert.h"
#include "kernels/ref/gdn_ref.h"
#include "support.h"

#ifdef GDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/gdn_cuda.h"

#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t err_ = (expr);                                                                 \
        cr_assert_eq(err_, cudaSuccess, "%s: %s", #expr, cudaGetErrorString(err_));               \
    } while (0)

/* ---- one layer-step case --------------------------------------------------------------------- */

typedef struct gpu_case {
    const char *preset;
    gdn_dtype state_dtype, input_dtype, output_dtype;
    int32_t B, T;
    int64_t num_slots;
    int64_t extra_stride;    /* slot_stride - HV*V*K */
    double padding_fraction; /* of rows */
    int separate_writes;
    int use_high_slots;      /* draw slots from the top of the pool (offsets past 2^31) */
    uint64_t seed;
} gpu_case;

typedef struct host_tensor {
    void *data;
    size_t bytes;
} host_tensor;

static host_tensor random_tensor(test_rng *rng, size_t n, double scale, gdn_dtype dtype)
{
    host_tensor t = {malloc(n * gdn_dtype_size(dtype) + 16), n * gdn_dtype_size(dtype)};
    for (size_t i = 0; i < n; i++) gdn__store_f32(t.data, dtype, (int64_t)i, (float)(scale * test_rng_normal(rng)));
    return t;
}

static void *to_device(const void *host, size_t bytes)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* The pool's filler for slots no test row uses: a fixed byte pattern (a small finite value). */
#define POOL_PATTERN 0x3c

/* Copies one row's inputs out of the batch tensors into a one-row host step for the reference. */
static void slice_row(const void *src, void *dst, size_t row_bytes, int32_t row)
{
    memcpy(dst, (const char *)src + row_bytes * (size_t)row, row_bytes);
}

static double output_abs_tol(gdn_dtype state) { return gdn__spec4_tolerance(state).out_abs; }
static double output_rel_tol(gdn_dtype state) { return gdn__spec4_tolerance(state).out_rel; }
static double state_abs_tol(gdn_dtype state) { return gdn__spec4_tolerance(state).state_abs; }
static double state_rel_tol(gdn_dtype state) { return gdn__spec4_tolerance(state).state_rel; }

typedef struct case_result {
    double worst_output, worst_state; /* as a fraction of tolerance */
} case_result;

static case_result run_case(const gpu_case *c)
{
    gdn_model_config m;
    cr_assert_eq(gdn_model_preset(c->preset, 1, &m), GDN_OK);
    const int32_t B = c->B, T = c->T, HK = m.num_k_heads, HV = m.num_v_heads, K = m.head_dim_k, V = m.head_dim_v;
    const int64_t state_elems = (int64_t)HV * V * K, slot_stride = state_elems + c->extra_stride;
    const size_t ssize = gdn_dtype_size(c->state_dtype), osize = gdn_dtype_size(c->output_dtype);
    const int verify = T > 1;
    test_rng rng = test_rng_seeded(c->seed);

    /* Rows: distinct random slots (from the top of the pool when asked), some padding rows. */
    int32_t *reads = malloc(sizeof(int32_t) * (size_t)B), *writes = malloc(sizeof(int32_t) * (size_t)B);
    const int64_t span = c->use_high_slots ? 2 * (int64_t)B + 2 : c->num_slots;
    const int64_t base = c->num_slots - span;
    cr_assert_geq(span, 2 * (int64_t)B, "pool too small for distinct read and write slots");
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)span);
    for (int64_t i = 0; i < span; i++) perm[i] = (int32_t)(base + i);
    for (int64_t i = span - 1; i > 0; i--) {
        const int32_t j = test_rng_below(&rng, (int32_t)(i + 1));
        const int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int32_t i = 0; i < B; i++) {
        const int pad = test_rng_uniform(&rng) < c->padding_fraction;
        reads[i] = pad ? -1 : perm[i];
        writes[i] = pad ? -1 : (c->separate_writes ? perm[B + i] : perm[i]);
    }

    /* Inputs (SPEC 4 distributions) and parameters. */
    const size_t n_qk = (size_t)B * T * HK * K, n_v = (size_t)B * T * HV * V, n_g = (size_t)B * T * HV;
    host_tensor q = random_tensor(&rng, n_qk, 1.0, c->input_dtype), k = random_tensor(&rng, n_qk, 1.0, c->input_dtype);
    host_tensor v = random_tensor(&rng, n_v, 1.0, c->input_dtype);
    host_tensor a = random_tensor(&rng, n_g, 0.1, c->input_dtype), b = random_tensor(&rng, n_g, 0.1, c->input_dtype);
    float *A_log = malloc(sizeof(float) * (size_t)HV), *dt_bias = malloc(sizeof(float) * (size_t)HV);
    for (int32_t h = 0; h < HV; h++) A_log[h] = (float)(0.1 * test_rng_normal(&rng)), dt_bias[h] = (float)(0.1 * test_rng_normal(&rng));

    /* Pool: pattern everywhere, random states in the slots the rows read. */
    const size_t pool_bytes = (size_t)(c->num_slots * slot_stride) * ssize;
    void *d_pool = NULL;
    CUDA_OK(cudaMalloc(&d_pool, pool_bytes));
    CUDA_OK(cudaMemset(d_pool, POOL_PATTERN, pool_bytes));
    host_tensor *initial = calloc((size_t)B, sizeof *initial);
    for (int32_t i = 0; i < B; i++) {
        if (reads[i] < 0) continue;
        initial[i] = random_tensor(&rng, (size_t)state_elems, 0.1, c->state_dtype);
        CUDA_OK(cudaMemcpy((char *)d_pool + (size_t)(reads[i] * slot_stride) * ssize, initial[i].data,
                           initial[i].bytes, cudaMemcpyHostToDevice));
    }
    unsigned char pattern_slot_probe[64];
    memset(pattern_slot_probe, POOL_PATTERN, sizeof pattern_slot_probe);

    void *d_q = to_device(q.data, q.bytes), *d_k = to_device(k.data, k.bytes), *d_v = to_device(v.data, v.bytes);
    void *d_a = to_device(a.data, a.bytes), *d_b = to_device(b.data, b.bytes);
    float *d_A = to_device(A_log, sizeof(float) * (size_t)HV), *d_dt = to_device(dt_bias, sizeof(float) * (size_t)HV);
    int32_t *d_reads = to_device(reads, sizeof(int32_t) * (size_t)B);
    int32_t *d_writes = c->separate_writes ? to_device(writes, sizeof(int32_t) * (size_t)B) : NULL;
    int32_t zero = 0, *d_flag = to_device(&zero, sizeof zero);
    const size_t out_bytes = (size_t)B * T * HV * V * osize;
    void *d_out = NULL, *d_cache = NULL;
    CUDA_OK(cudaMalloc(&d_out, out_bytes));
    CUDA_OK(cudaMemset(d_out, 0xff, out_bytes)); /* poison: NaN in bf16 and fp32 */
    const int64_t cache_row_stride = (int64_t)T * state_elems;
    if (verify) {
        CUDA_OK(cudaMalloc(&d_cache, (size_t)(B * cache_row_stride) * ssize));
        CUDA_OK(cudaMemset(d_cache, 0xff, (size_t)(B * cache_row_stride) * ssize));
    }

    gdn__layer_params p = {
        .B = B, .T = T, .HK = HK, .HV = HV, .K = K, .V = V, .scale = 1.0f / sqrtf((float)K), .use_qk_l2norm = 1,
        .input_dtype = c->input_dtype, .q = d_q, .k = d_k, .v = d_v, .a = d_a, .b = d_b, .A_log = d_A,
        .dt_bias = d_dt, .state_dtype = c->state_dtype, .state = d_pool, .num_slots = c->num_slots,
        .slot_stride = slot_stride, .read_slots = d_reads, .write_slots = d_writes,
        .output_dtype = c->output_dtype, .out = d_out, .cache = d_cache, .cache_row_stride = cache_row_stride,
        .error_flag = d_flag,
    };
    gdn_status status = gdn__cuda_layer_step(&p, NULL);
    cr_assert_eq(status, GDN_OK, "launch: %s", gdn_status_name(status));
    CUDA_OK(cudaDeviceSynchronize());
    int32_t flag = -1;
    CUDA_OK(cudaMemcpy(&flag, d_flag, sizeof flag, cudaMemcpyDeviceToHost));
    cr_assert_eq(flag, 0, "error flag raised on valid slots");

    void *out = malloc(out_bytes);
    CUDA_OK(cudaMemcpy(out, d_out, out_bytes, cudaMemcpyDeviceToHost));
    const size_t row_out = (size_t)T * HV * V;

    /* Padding rows output zeros; no output is left poisoned. */
    for (int32_t i = 0; i < B; i++) {
        for (size_t j = 0; j < row_out; j++) {
            const float x = gdn__load_f32(out, c->output_dtype, (int64_t)(i * row_out + j));
            cr_assert(!isnan(x), "row %d element %zu was never written", i, j);
            if (reads[i] < 0) cr_assert_eq(x, 0.0f, "padding row %d must output zeros", i);
        }
    }

    /* Rows to check against the reference: all of them for small B, else a sample plus the last. */
    int32_t sample[8], n_sample = 0;
    for (int32_t i = 0; i < B && n_sample < 8; i++) {
        const int32_t row = B <= 8 ? i : (n_sample == 7 ? B - 1 : test_rng_below(&rng, B));
        if (reads[row] >= 0) sample[n_sample++] = row;
        else if (B <= 8) continue;
    }

    case_result result = {0, 0};
    void *ref_state = malloc((size_t)state_elems * ssize), *ref_out = malloc(row_out * osize);
    void *ref_cache = verify ? malloc((size_t)cache_row_stride * ssize) : NULL;
    void *got_state = malloc((size_t)state_elems * ssize);
    const size_t qk_row = (size_t)T * HK * K * gdn_dtype_size(c->input_dtype);
    const size_t v_row = (size_t)T * HV * V * gdn_dtype_size(c->input_dtype);
    const size_t g_row = (size_t)T * HV * gdn_dtype_size(c->input_dtype);
    void *rq = malloc(qk_row), *rk = malloc(qk_row), *rv = malloc(v_row), *ra = malloc(g_row), *rb = malloc(g_row);
    double *actual = malloc(sizeof(double) * (size_t)(verify ? cache_row_stride : state_elems));
    double *expected = malloc(sizeof(double) * (size_t)(verify ? cache_row_stride : state_elems));
    for (int32_t s = 0; s < n_sample; s++) {
        const int32_t i = sample[s];
        slice_row(q.data, rq, qk_row, i), slice_row(k.data, rk, qk_row, i), slice_row(v.data, rv, v_row, i);
        slice_row(a.data, ra, g_row, i), slice_row(b.data, rb, g_row, i);
        memcpy(ref_state, initial[i].data, initial[i].bytes);
        const int32_t zero_slot = 0;
        gdn__layer_params r = p;
        r.B = 1, r.q = rq, r.k = rk, r.v = rv, r.a = ra, r.b = rb, r.A_log = A_log, r.dt_bias = dt_bias;
        r.state = ref_state, r.num_slots = 1, r.slot_stride = state_elems, r.read_slots = &zero_slot;
        r.write_slots = NULL, r.out = ref_out, r.cache = ref_cache, r.error_flag = NULL;
        cr_assert_eq(gdn__ref_layer_step(&r), GDN_OK);

        /* Outputs of every token. */
        for (size_t j = 0; j < row_out; j++) {
            actual[j] = gdn__load_f32(out, c->output_dtype, (int64_t)(i * row_out + j));
            expected[j] = gdn__load_f32(ref_out, c->output_dtype, (int64_t)j);
        }
        double ratio = test_error_ratio(actual, expected, row_out, output_abs_tol(c->state_dtype), output_rel_tol(c->state_dtype));
        cr_assert_leq(ratio, 1.0, "%s B=%d T=%d row %d outputs: %.0f%% of tolerance", c->preset, B, T, i, 100 * ratio);
        if (ratio > result.worst_output) result.worst_output = ratio;

        /* State: the cache for verify (every token), the write slot for decode. */
        const size_t n_state = (size_t)(verify ? cache_row_stride : state_elems);
        void *got = verify ? malloc(n_state * ssize) : got_state;
        const void *want = verify ? ref_cache : ref_state;
        if (verify)
            CUDA_OK(cudaMemcpy(got, (char *)d_cache + (size_t)(i * cache_row_stride) * ssize, n_state * ssize, cudaMemcpyDeviceToHost));
        else
            CUDA_OK(cudaMemcpy(got, (char *)d_pool + (size_t)(writes[i] * slot_stride) * ssize, n_state * ssize, cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < n_state; j++) {
            actual[j] = gdn__load_f32(got, c->state_dtype, (int64_t)j);
            expected[j] = gdn__load_f32(want, c->state_dtype, (int64_t)j);
        }
        ratio = test_error_ratio(actual, expected, n_state, state_abs_tol(c->state_dtype), state_rel_tol(c->state_dtype));
        cr_assert_leq(ratio, 1.0, "%s B=%d T=%d row %d state: %.0f%% of tolerance", c->preset, B, T, i, 100 * ratio);
        if (ratio > result.worst_state) result.worst_state = ratio;
        if (verify) free(got);
    }

    /* Slots: a verify writes no slot; a decode writes exactly the live rows' write slots; a separate
     * read slot keeps its initial state; unused slots keep the pattern. */
    for (int32_t i = 0; i < B; i++) {
        if (reads[i] < 0) continue;
        CUDA_OK(cudaMemcpy(got_state, (char *)d_pool + (size_t)(reads[i] * slot_stride) * ssize, (size_t)state_elems * ssize,
                           cudaMemcpyDeviceToHost));
        const int read_slot_unchanged = memcmp(got_state, initial[i].data, initial[i].bytes) == 0;
        if (verify || c->separate_writes) cr_assert(read_slot_unchanged, "row %d: read slot %d was written", i, reads[i]);
        else cr_assert_not(read_slot_unchanged, "row %d: decode did not write slot %d", i, reads[i]);
    }
    /* Unused slots are bit-exact (probe the tail of every 7th one), and so is the gap past each
     * written slot when the stride has one. */
    unsigned char probe[64];
    for (int64_t s = 0; s < c->num_slots; s += 7) {
        int used = 0;
        for (int32_t i = 0; i < B; i++) used |= reads[i] == s || writes[i] == s;
        if (used) continue;
        CUDA_OK(cudaMemcpy(probe, (char *)d_pool + (size_t)(s * slot_stride + state_elems) * ssize - sizeof probe,
                           sizeof probe, cudaMemcpyDeviceToHost));
        cr_assert_eq(memcmp(probe, pattern_slot_probe, sizeof probe), 0, "unused slot %lld changed", (long long)s);
    }
    for (int32_t i = 0; i < B && c->extra_stride * (int64_t)ssize >= (int64_t)sizeof probe; i++) {
        if (writes[i] < 0) continue;
        CUDA_OK(cudaMemcpy(probe, (char *)d_pool + (size_t)(writes[i] * slot_stride + state_elems) * ssize,
                           sizeof probe, cudaMemcpyDeviceToHost));
        cr_assert_eq(memcmp(probe, pattern_slot_probe, sizeof probe), 0, "row %d wrote past its slot", i);
    }

    /* Cleanup. */
    for (int32_t i = 0; i < B; i++) free(initial[i].data);
    free(initial), free(reads), free(writes), free(perm), free(A_log), free(dt_bias);
    free(q.data), free(k.data), free(v.data), free(a.data), free(b.data);
    free(out), free(ref_state), free(ref_out), free(ref_cache), free(got_state), free(actual), free(expected);
    free(rq), free(rk), free(rv), free(ra), free(rb);
    cudaFree(d_pool), cudaFree(d_q), cudaFree(d_k), cudaFree(d_v), cudaFree(d_a), cudaFree(d_b), cudaFree(d_A);
    cudaFree(d_dt), cudaFree(d_reads), cudaFree(d_writes), cudaFree(d_flag), cudaFree(d_out), cudaFree(d_cache);
    return result;
}

static void sweep(const char *preset, gdn_dtype state_dtype)
{
    test_require_gpu();
    const int32_t batches[] = {1, 3, 64, 257}, tokens[] = {1, 2, 4, 8, 16};
    double worst_out = 0, worst_state = 0;
    for (size_t bi = 0; bi < 4; bi++) {
        for (size_t ti = 0; ti < 5; ti++) {
            const int32_t B = batches[bi];
            gpu_case c = {
                .preset = preset, .state_dtype = state_dtype,
                .input_dtype = B == 3 ? GDN_DTYPE_F16 : GDN_DTYPE_BF16,
                .output_dtype = B == 3 ? GDN_DTYPE_F32 : GDN_DTYPE_BF16,
                .B = B, .T = tokens[ti], .num_slots = 2 * (int64_t)B + 5,
                .extra_stride = B == 64 ? 64 : 0, .padding_fraction = B == 1 ? 0.0 : 0.25,
                .separate_writes = (bi + ti) % 2, .seed = 1000 + bi * 10 + ti,
            };
            case_result r = run_case(&c);
            if (r.worst_output > worst_out) worst_out = r.worst_output;
            if (r.worst_state > worst_state) worst_state = r.worst_state;
        }
    }
    cr_log_info("%s %s state: worst output error %.1f%% of tolerance, worst state error %.1f%%", preset,
                state_dtype == GDN_DTYPE_BF16 ? "bf16" : "fp32", 100 * worst_out, 100 * worst_state);
}

Test(gpu_kernels, tiny_fp32_state) { sweep("tiny", GDN_DTYPE_F32); }
Test(gpu_kernels, tiny_bf16_state) { sweep("tiny", GDN_DTYPE_BF16); }
Test(gpu_kernels, qwen3_next_fp32_state, .timeout = 900) { sweep("qwen3-next", GDN_DTYPE_F32); }
Test(gpu_kernels, qwen3_next_bf16_state, .timeout = 900) { sweep("qwen3-next", GDN_DTYPE_BF16); }
Test(gpu_kernels, qwen3_5_fp32_state, .timeout = 900) { sweep("qwen3.5", GDN_DTYPE_F32); }
Test(gpu_kernels, qwen3_5_bf16_state, .timeout = 900) { sweep("qwen3.5", GDN_DTYPE_BF16); }

Test(gpu_kernels, offsets_past_2_pow_31_elements, .timeout = 900)
{
    test_require_gpu();
    /* qwen3.5: 64 * 128 * 128 = 1,048,576 elements a slot; 2100 slots = 2.2e9 elements > 2^31. The
     * rows use the top 2B+2 slots, all past element 2^31. */
    const gdn_dtype dtypes[] = {GDN_DTYPE_BF16, GDN_DTYPE_F32};
    for (int d = 0; d < 2; d++) {
        gpu_case decode = {.preset = "qwen3.5", .state_dtype = dtypes[d], .input_dtype = GDN_DTYPE_BF16,
                           .output_dtype = GDN_DTYPE_BF16, .B = 4, .T = 1, .num_slots = 2100,
                           .use_high_slots = 1, .separate_writes = 1, .seed = 77 + (uint64_t)d};
        cr_assert_gt((double)(decode.num_slots - 10) * 1048576.0, 2147483648.0);
        run_case(&decode);
        gpu_case verify = decode;
        verify.T = 4, verify.separate_writes = 0, verify.seed += 100;
        run_case(&verify);
    }
}

Test(gpu_kernels, all_padding_batch_touches_nothing)
{
    test_require_gpu();
    gpu_case c = {.preset = "qwen3-next", .state_dtype = GDN_DTYPE_F32, .input_dtype = GDN_DTYPE_BF16,
                  .output_dtype = GDN_DTYPE_BF16, .B = 8, .T = 1, .num_slots = 20, .padding_fraction = 1.0,
                  .seed = 5};
    run_case(&c); /* every row padding: zero outputs, every slot keeps the pattern */
    c.T = 4, c.seed = 6;
    run_case(&c);
}

Test(gpu_kernels, out_of_range_slot_is_padding_and_raises_the_flag)
{
    test_require_gpu();
    const int32_t HK = 2, HV = 4, K = 64, V = 64, B = 2;
    const int64_t elems = (int64_t)HV * V * K;
    test_rng rng = test_rng_seeded(9);
    host_tensor q = random_tensor(&rng, (size_t)B * HK * K, 1, GDN_DTYPE_BF16), v = random_tensor(&rng, (size_t)B * HV * V, 1, GDN_DTYPE_BF16);
    host_tensor g = random_tensor(&rng, (size_t)B * HV, 0.1, GDN_DTYPE_BF16);
    const float zeros[4] = {0};
    const int32_t reads[] = {0, 3}; /* num_slots = 2: row 1 is out of range */
    void *d_pool = NULL, *d_out = NULL;
    CUDA_OK(cudaMalloc(&d_pool, (size_t)(2 * elems) * 4));
    CUDA_OK(cudaMemset(d_pool, POOL_PATTERN, (size_t)(2 * elems) * 4));
    CUDA_OK(cudaMalloc(&d_out, (size_t)B * HV * V * 4));
    CUDA_OK(cudaMemset(d_out, 0xff, (size_t)B * HV * V * 4));
    int32_t zero = 0, *d_flag = to_device(&zero, sizeof zero);
    gdn__layer_params p = {.B = B, .T = 1, .HK = HK, .HV = HV, .K = K, .V = V, .scale = 0.125f, .use_qk_l2norm = 1,
                           .input_dtype = GDN_DTYPE_BF16, .q = to_device(q.data, q.bytes), .k = to_device(q.data, q.bytes),
                           .v = to_device(v.data, v.bytes), .a = to_device(g.data, g.bytes), .b = to_device(g.data, g.bytes),
                           .A_log = to_device(zeros, sizeof zeros), .dt_bias = to_device(zeros, sizeof zeros),
                           .state_dtype = GDN_DTYPE_F32, .state = d_pool, .num_slots = 2, .slot_stride = elems,
                           .read_slots = to_device(reads, sizeof reads), .output_dtype = GDN_DTYPE_F32, .out = d_out,
                           .error_flag = d_flag};
    cr_assert_eq(gdn__cuda_layer_step(&p, NULL), GDN_OK);
    CUDA_OK(cudaDeviceSynchronize());
    int32_t flag = 0;
    CUDA_OK(cudaMemcpy(&flag, d_flag, sizeof flag, cudaMemcpyDeviceToHost));
    cr_assert_eq(flag, 1, "the sticky flag must be raised");
    float out[2 * 4 * 64];
    CUDA_OK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    for (int i = HV * V; i < 2 * HV * V; i++) cr_assert_eq(out[i], 0.0f, "out-of-range row outputs zeros");
    cr_assert(!isnan(out[0]) && out[0] != 0.0f, "the valid row ran");
    unsigned char probe[256], pattern[256];
    memset(pattern, POOL_PATTERN, sizeof pattern);
    CUDA_OK(cudaMemcpy(probe, (char *)d_pool + (size_t)(2 * elems) * 4 - sizeof probe, sizeof probe, cudaMemcpyDeviceToHost));
    cr_assert_eq(memcmp(probe, pattern, sizeof probe), 0, "slot 1 untouched");
    free(q.data), free(v.data), free(g.data);
}

/* ---- commit -------------------------------------------------------------------------------- */

static void commit_case(const char *preset, gdn_dtype state_dtype, int32_t B, int32_t T, int separate_writes, uint64_t seed)
{
    gdn_model_config m;
    gdn_model_preset(preset, 1, &m);
    const int32_t L = 3, HV = m.num_v_heads, K = m.head_dim_k, V = m.head_dim_v;
    const int64_t elems = (int64_t)HV * V * K, num_slots = 2 * (int64_t)B + 3;
    const size_t ssize = gdn_dtype_size(state_dtype);
    const int64_t state_layer = num_slots * elems, cache_row = (int64_t)T * elems, cache_layer = (int64_t)B * cache_row;
    test_rng rng = test_rng_seeded(seed);
    int32_t *reads = malloc(sizeof(int32_t) * (size_t)B), *writes = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *accepted = malloc(sizeof(int32_t) * (size_t)B);
    for (int32_t i = 0; i < B; i++) {
        reads[i] = (i % 5 == 4) ? -1 : (int32_t)(num_slots - 1 - i);
        writes[i] = separate_writes ? i : reads[i];
        accepted[i] = i == 0 ? 0 : (i == 1 ? T : test_rng_below(&rng, T + 3) - 1); /* includes -1 and T+1 */
    }
    const size_t pool_bytes = (size_t)(L * state_layer) * ssize, cache_bytes = (size_t)(L * cache_layer) * ssize;
    host_tensor pool = random_tensor(&rng, (size_t)(L * state_layer), 0.1, state_dtype);
    host_tensor cache = random_tensor(&rng, (size_t)(L * cache_layer), 0.1, state_dtype);
    void *d_pool = to_device(pool.data, pool_bytes), *d_cache = to_device(cache.data, cache_bytes);
    int32_t zero = 0, *d_flag = to_device(&zero, sizeof zero);
    gdn__commit_params p = {.B = B, .T = T, .num_layers = L, .HV = HV, .K = K, .V = V, .state_dtype = state_dtype,
                            .state = d_pool, .state_layer_stride = state_layer, .num_slots = num_slots, .slot_stride = elems,
                            .cache = d_cache, .cache_layer_stride = cache_layer, .cache_row_stride = cache_row,
                            .read_slots = to_device(reads, sizeof(int32_t) * (size_t)B),
                            .write_slots = separate_writes ? to_device(writes, sizeof(int32_t) * (size_t)B) : NULL,
                            .accepted = to_device(accepted, sizeof(int32_t) * (size_t)B), .error_flag = d_flag};
    cr_assert_eq(gdn__cuda_commit(&p, NULL), GDN_OK);
    CUDA_OK(cudaDeviceSynchronize());

    /* Expected: the float64 reference's commit on the host copies (a plain copy: bit-exact). */
    gdn__commit_params h = p;
    h.state = pool.data, h.cache = cache.data, h.read_slots = reads, h.write_slots = separate_writes ? writes : NULL;
    int32_t ref_flag = 0; /* live rows with a count outside 0..T: clamped and flagged, as the reference */
    h.accepted = accepted, h.error_flag = &ref_flag;
    gdn__ref_commit(&h);
    void *got = malloc(pool_bytes);
    CUDA_OK(cudaMemcpy(got, d_pool, pool_bytes, cudaMemcpyDeviceToHost));
    cr_assert_eq(memcmp(got, pool.data, pool_bytes), 0, "%s B=%d T=%d: committed pools differ from the reference", preset, B, T);
    int32_t flag = -1;
    CUDA_OK(cudaMemcpy(&flag, d_flag, sizeof flag, cudaMemcpyDeviceToHost));
    int32_t clamped = 0;
    for (int32_t i = 0; i < B; i++) clamped |= reads[i] >= 0 && (accepted[i] < 0 || accepted[i] > T);
    cr_assert_eq(ref_flag, clamped);
    cr_assert_eq(flag, clamped, "%s B=%d T=%d: device flag %d, expected %d", preset, B, T, flag, clamped);
    free(got), free(pool.data), free(cache.data), free(reads), free(writes), free(accepted);
    cudaFree(d_pool), cudaFree(d_cache), cudaFree(d_flag);
    cudaFree((void *)p.read_slots), cudaFree((void *)p.write_slots), cudaFree((void *)p.accepted);
}

Test(gpu_kernels, commit_copies_the_accepted_cache_entry_for_every_layer)
{
    test_require_gpu();
    commit_case("tiny", GDN_DTYPE_F32, 7, 4, 0, 1);
    commit_case("tiny", GDN_DTYPE_BF16, 7, 4, 1, 2);
    commit_case("qwen3-next", GDN_DTYPE_F32, 3, 2, 0, 3);
    commit_case("qwen3-next", GDN_DTYPE_BF16, 33, 8, 1, 4);
    commit_case("qwen3.5", GDN_DTYPE_BF16, 2, 16, 0, 5);
}

/* ---- the engine on the CUDA backend ----------------------------------------------------------- */

Test(gpu_engine, engine_decode_verify_commit_match_the_cpu_engine)
{
    test_require_gpu();
    /* Twin engines (same seed: same parameters, states and inputs), one on each backend. */
    gdn_engine_config c = test_config("qwen3-next", 2, GDN_DTYPE_BF16, 16, 8, 4);
    test_rng rng_gpu = test_rng_seeded(3), rng_cpu = test_rng_seeded(3);
    gdn_engine_config cg = c;
    cg.backend = GDN_BACKEND_CUDA;
    gdn_engine *gpu = test_engine_create(&cg, &rng_gpu, NULL), *cpu = test_engine_create(&c, &rng_cpu, NULL);
    cr_assert_eq(gdn_engine_backend(gpu), GDN_BACKEND_CUDA);
    int32_t s;
    for (int i = 0; i < 6; i++) {
        gdn_slot_alloc(gpu, &s), gdn_slot_alloc(cpu, &s);
        test_fill_slot_state(gpu, s, &rng_gpu), test_fill_slot_state(cpu, s, &rng_cpu);
    }
    const int32_t rows[] = {4, 1, 5};
    const int32_t accepted[] = {2, 0, 4};
    for (int step = 0; step < 2; step++) {
        const int verify = step == 1;
        const int32_t T = verify ? 4 : 1;
        test_inputs ig[2], ic[2];
        for (int32_t l = 0; l < 2; l++) {
            test_write_inputs(gpu, l, 3, T, &rng_gpu, &ig[l]), test_write_inputs(cpu, l, 3, T, &rng_cpu, &ic[l]);
            test_poison_outputs(gpu, l);
        }
        test_run_step(gpu, verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, 3, rows, NULL);
        test_run_step(cpu, verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, T, 3, rows, NULL);
        if (verify) {
            test_set_accepted(gpu, accepted, 3), test_set_accepted(cpu, accepted, 3);
            cr_assert_eq(gdn_engine_commit(gpu, NULL), GDN_OK);
            cr_assert_eq(gdn_engine_commit(cpu, NULL), GDN_OK);
        }
        for (int32_t l = 0; l < 2; l++) {
            double *og = test_read_outputs(gpu, l, 3, T), *oc = test_read_outputs(cpu, l, 3, T);
            const size_t n = (size_t)3 * T * 32 * 128;
            const gdn__tolerance bf16 = gdn__spec4_tolerance(GDN_DTYPE_BF16);
            const double ratio = test_error_ratio(og, oc, n, bf16.out_abs, bf16.out_rel);
            cr_assert_leq(ratio, 1.0, "step %d layer %d outputs: %.0f%% of tolerance", step, l, 100 * ratio);
            free(og), free(oc);
            for (int i = 0; i < 3; i++) {
                double *sg = test_read_state(gpu, l, rows[i]), *sc = test_read_state(cpu, l, rows[i]);
                const double sr = test_error_ratio(sg, sc, 32 * 128 * 128, bf16.state_abs, bf16.state_rel);
                cr_assert_leq(sr, 1.0, "step %d layer %d row %d state: %.0f%% of tolerance", step, l, i, 100 * sr);
                free(sg), free(sc);
            }
            test_inputs_free(&ig[l]), test_inputs_free(&ic[l]);
        }
    }
    cr_assert_eq(gdn_engine_check_device_error(gpu, NULL), GDN_OK);
    gdn_engine_destroy(gpu);
    gdn_engine_destroy(cpu);
}

#else /* no CUDA in this build: one test that says so by skipping */

Test(gpu_kernels, skipped_without_cuda)
{
    test_require_gpu();
    cr_assert_fail("a build without CUDA cannot have a usable GPU");
}

#endif
