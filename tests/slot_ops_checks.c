/* See slot_ops_checks.h. */
#include "slot_ops_checks.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#ifdef GDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* A buffer in the backend's memory (device memory on CUDA), for import and export, every byte 0xff
 * (a NaN pattern: what an export leaves alone stays recognisable, and nothing reads unset memory). */
#define BUFFER_POISON 0xff
static void *buffer_alloc(gdn_backend_kind backend, size_t bytes)
{
    void *p = NULL;
#ifdef GDN_HAVE_CUDA
    if (backend == GDN_BACKEND_CUDA) {
        cr_assert_eq(cudaMalloc(&p, bytes), cudaSuccess);
        cr_assert_eq(cudaMemset(p, BUFFER_POISON, bytes), cudaSuccess);
        return p;
    }
#endif
    (void)backend;
    p = malloc(bytes);
    cr_assert_not_null(p);
    memset(p, BUFFER_POISON, bytes);
    return p;
}

static void buffer_free(gdn_backend_kind backend, void *p)
{
#ifdef GDN_HAVE_CUDA
    if (backend == GDN_BACKEND_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)backend;
    free(p);
}

/* An engine whose slots 0..5 hold random states and, under fold and ring, pending tokens or ring
 * records (verify + commit, decode, verify + commit). */
gdn_engine *slot_ops_engine_with_pending(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    gdn_engine_config c = test_config("tiny", 2, GDN_DTYPE_F32, 8, 6, 3);
    c.backend = backend;
    c.verify_strategy = strategy;
    c.ring_length = 8;
    c.ring_write_through = -1; /* decodes leave records for the slot operations */
    test_rng rng = test_rng_seeded(seed);
    gdn_engine *e = test_engine_create(&c, &rng, NULL);
    for (int32_t s = 0; s < 8; s++) {
        int32_t slot;
        cr_assert_eq(gdn_slot_alloc(e, &slot), GDN_OK);
        test_fill_slot_state(e, slot, &rng);
    }
    const int32_t rows[] = {0, 1, 2, 3, 4, 5}, accepted[] = {3, 2, 1, 0, 3, 2};
    for (int step = 0; step < 3; step++) { /* verify, decode, verify: pending tokens at the end */
        const int verify = step != 1;
        for (int32_t l = 0; l < 2; l++) {
            test_inputs in;
            test_write_inputs(e, l, 6, verify ? 3 : 1, &rng, &in);
            test_inputs_free(&in);
        }
        test_run_step(e, verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, verify ? 3 : 1, 6, rows, NULL);
        if (verify) {
            test_set_accepted(e, accepted, 6);
            cr_assert_eq(gdn_engine_commit(e, NULL), GDN_OK);
        }
    }
    return e;
}

static void assert_same_state(gdn_engine *e, int32_t a, int32_t b, const char *what)
{
    for (int32_t l = 0; l < 2; l++) {
        double *x = test_read_state(e, l, a), *y = test_read_state(e, l, b);
        cr_assert_eq(memcmp(x, y, test_state_elems(e) * sizeof(double)), 0, "%s: layer %d", what, l);
        free(x), free(y);
    }
}

void slot_ops_keep_current_states(gdn_backend_kind backend, gdn_verify_strategy strategy, uint64_t seed)
{
    gdn_engine *e = slot_ops_engine_with_pending(backend, strategy, seed);
    const size_t elems = test_state_elems(e);
    /* copy: the pending tokens / records travel with the state. */
    cr_assert_eq(gdn_slot_copy_async(e, 6, 1, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    assert_same_state(e, 6, 1, "copy");
    /* export: the current state (written back first), then the slot reads the same. */
    const int64_t stride = (int64_t)elems + 32;
    const size_t buf_bytes = (size_t)(2 * stride) * sizeof(float);
    float *out = calloc((size_t)(2 * stride), sizeof(float));
    void *buf = buffer_alloc(backend, buf_bytes);
    cr_assert_eq(gdn_slot_export_async(e, 2, buf, stride, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_download(e, out, buf, buf_bytes, NULL), GDN_OK);
    cr_assert_eq(gdn_engine_synchronize(e, NULL), GDN_OK);
    for (int32_t l = 0; l < 2; l++) {
        double *x = test_read_state(e, l, 2);
        for (size_t i = 0; i < elems; i++) cr_assert_eq((double)out[l * stride + (int64_t)i], x[i], "export layer %d", l);
        free(x);
        /* The gap after each layer's state is not the export's to write. */
        const unsigned char *gap = (const unsigned char *)(out + l * stride + (int64_t)elems);
        for (size_t b = 0; b < (size_t)(stride - (int64_t)elems) * sizeof(float); b++)
            cr_assert_eq(gap[b], BUFFER_POISON, "export wrote into the gap after layer %d", l);
    }
    /* import: exactly the given state, pending tokens / records dropped. */
    for (int64_t i = 0; i < 2 * stride; i++) out[i] = (float)(0.001 * (double)(i % 977));
    cr_assert_eq(gdn_engine_upload(e, buf, out, buf_bytes, NULL), GDN_OK);
    cr_assert_eq(gdn_slot_import_async(e, 4, buf, stride, NULL), GDN_OK);
    for (int32_t l = 0; l < 2; l++) {
        double *x = test_read_state(e, l, 4);
        for (size_t i = 0; i < elems; i++) cr_assert_eq(x[i], (double)out[l * stride + (int64_t)i], "import layer %d", l);
        free(x);
    }
    /* A source freed and taken again since the last step: its old tokens are not its own. */
    int32_t again;
    cr_assert_eq(gdn_slot_free(e, 5), GDN_OK);
    cr_assert_eq(gdn_slot_alloc(e, &again), GDN_OK);
    cr_assert_eq(again, 5);
    cr_assert_eq(gdn_slot_copy_async(e, 7, 5, NULL), GDN_OK);
    assert_same_state(e, 7, 5, "copy of a reused slot");
    /* The next step's fetch must not clear what a copy wrote into a reused destination. */
    cr_assert_eq(gdn_slot_free(e, 3), GDN_OK);
    cr_assert_eq(gdn_slot_alloc(e, &again), GDN_OK);
    cr_assert_eq(gdn_slot_copy_async(e, 3, 0, NULL), GDN_OK);
    const int32_t row[] = {6};
    for (int32_t l = 0; l < 2; l++) {
        test_rng rng = test_rng_seeded(seed + 7);
        test_inputs in;
        test_write_inputs(e, l, 1, 1, &rng, &in);
        test_inputs_free(&in);
    }
    test_run_step(e, GDN_STEP_DECODE, 1, 1, row, NULL); /* its fetch applies the staged clears */
    assert_same_state(e, 3, 0, "copy into a reused slot, after the next step");
    free(out);
    buffer_free(backend, buf);
    gdn_engine_destroy(e);
}

