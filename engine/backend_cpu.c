/*
 * The CPU backend: backend memory is host memory from jemalloc, every operation completes before it
 * returns, and the math is the float64 reference (kernels/ref/gdn_ref.c), so CPU results are the
 * reference's. The reference's scratch is allocated here once, keeping the step path allocation-free.
 */
#include <string.h>

#include "alloc.h"
#include "backend_impl.h"
#include "kernels/ref/gdn_ref.h"

typedef struct cpu_backend {
    void *scratch;      /* gdn__ref_scratch_bytes() + the mixer's (gdn__ref_mixer_scratch_bytes) */
    int32_t *staged;    /* the staged rows of the next step, then its clears */
    int32_t staged_count;
    int32_t staged_clears;
    int32_t staging_capacity;
} cpu_backend;

static gdn_status cpu_alloc(void *ctx, size_t bytes, void **out)
{
    (void)ctx;
    *out = gdn__calloc(1, bytes ? bytes : 1);
    return *out ? GDN_OK : GDN_ENOMEM;
}

static void cpu_free(void *ctx, void *ptr)
{
    (void)ctx;
    gdn__free(ptr);
}

static gdn_status cpu_zero(void *ctx, void *ptr, size_t bytes, void *stream)
{
    (void)ctx, (void)stream;
    memset(ptr, 0, bytes);
    return GDN_OK;
}

static gdn_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, void *stream)
{
    (void)ctx, (void)stream;
    memmove(dst, src, bytes);
    return GDN_OK;
}

static gdn_status cpu_stage_rows(void *ctx, const int32_t *rows, int32_t count, const int32_t *clears, int32_t n_clears,
                                 int carry)
{
    (void)carry;
    cpu_backend *cpu = ctx;
    if (count < 0 || n_clears < 0 || (int64_t)count + n_clears > cpu->staging_capacity) return GDN_EINVAL;
    memcpy(cpu->staged, rows, sizeof(int32_t) * (size_t)count);
    if (n_clears) memcpy(cpu->staged + count, clears, sizeof(int32_t) * (size_t)n_clears);
    cpu->staged_count = count;
    cpu->staged_clears = n_clears;
    return GDN_OK;
}

static gdn_status cpu_fetch_rows(void *ctx, int32_t *dst, int32_t *pending, int32_t num_layers, int64_t counts_layer_stride,
                                 int overlap, int carry, void *stream)
{
    (void)stream;
    (void)overlap;
    (void)carry;
    cpu_backend *cpu = ctx;
    memcpy(dst, cpu->staged, sizeof(int32_t) * (size_t)cpu->staged_count);
    if (pending)
        for (int32_t c = 0; c < cpu->staged_clears; c++)
            for (int32_t l = 0; l < num_layers; l++) pending[l * counts_layer_stride + cpu->staged[cpu->staged_count + c]] = 0;
    return GDN_OK;
}

static void cpu_consume_rows(void *ctx) { (void)ctx; }

/* The reference runs before each call returns: every stream is the same, already finished. */
static void *cpu_own_stream(void *ctx)
{
    (void)ctx;
    return NULL;
}

static gdn_status cpu_order_after(void *ctx, void *stream)
{
    (void)ctx, (void)stream;
    return GDN_OK;
}

static gdn_status cpu_layer_step(void *ctx, const gdn__layer_params *params, void *stream)
{
    (void)stream;
    gdn__ref_layer_step_in(params, ((cpu_backend *)ctx)->scratch);
    return GDN_OK;
}

static gdn_status cpu_commit(void *ctx, const gdn__commit_params *params, void *stream)
{
    (void)ctx, (void)stream;
    gdn__ref_commit(params);
    return GDN_OK;
}

static gdn_status cpu_synchronize(void *ctx, void *stream)
{
    (void)ctx, (void)stream;
    return GDN_OK;
}

static const char *cpu_last_error(const void *ctx)
{
    (void)ctx;
    return "";
}

static void cpu_destroy(void *ctx)
{
    cpu_backend *cpu = ctx;
    if (!cpu) return;
    gdn__free(cpu->scratch);
    gdn__free(cpu->staged);
    gdn__free(cpu);
}

static gdn_status cpu_slot_copy(void *ctx, const gdn__slot_copy_params *params, void *stream)
{
    (void)ctx, (void)stream;
    gdn__ref_slot_copy(params);
    return GDN_OK;
}

static const gdn__backend_iface cpu_iface = {
    .kind = GDN_BACKEND_CPU,
    .name = "cpu (float64 reference)",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .stage_rows = cpu_stage_rows,
    .fetch_rows = cpu_fetch_rows,
    .own_stream = cpu_own_stream,
    .order_after = cpu_order_after,
    .consume_rows = cpu_consume_rows,
    .layer_step = cpu_layer_step,
    .commit = cpu_commit,
    .slot_copy = cpu_slot_copy,
    .synchronize = cpu_synchronize,
    .last_error = cpu_last_error,
    .destroy = cpu_destroy,
};

gdn_status gdn__backend_cpu_create(size_t staging_bytes, gdn__backend *out)
{
    return gdn__backend_cpu_create_scratch(staging_bytes, 0, out);
}

gdn_status gdn__backend_cpu_create_scratch(size_t staging_bytes, size_t extra_scratch, gdn__backend *out)
{
    cpu_backend *cpu = gdn__calloc(1, sizeof *cpu);
    if (!cpu) return GDN_ENOMEM;
    cpu->staging_capacity = (int32_t)(staging_bytes / sizeof(int32_t));
    cpu->scratch = gdn__malloc(gdn__ref_scratch_bytes() + extra_scratch);
    cpu->staged = gdn__calloc((size_t)cpu->staging_capacity + 1, sizeof(int32_t));
    if (!cpu->scratch || !cpu->staged) {
        cpu_destroy(cpu);
        return GDN_ENOMEM;
    }
    out->iface = &cpu_iface;
    out->ctx = cpu;
    return GDN_OK;
}
