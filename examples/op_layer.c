/*
 * gdn-op-layer: the op layer (gdn/gdn_op.h) driven directly over the caller's own tensors, as a
 * serving engine with its own pools and projections would: q, k and v are column slices of one fused
 * projection output [B, T, 2 HK K + HV V], a and b are interleaved in another [B, T, HV, 2], the pool
 * has its own slot stride, and the strategy's workspace is the caller's allocation. Runs on the CPU
 * backend over host memory (on CUDA the same calls take device pointers and a stream). Prints a
 * checksum of the outputs; exit status 0 when every call succeeded and every output is finite.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdn/gdn_op.h>

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float wave(int64_t i) { return (float)sin(0.37 * (double)i) * 0.5f; } /* deterministic inputs */

int main(void)
{
    gdn_model_config model;
    gdn_model_preset("tiny", 1, &model); /* HK 2, HV 4, K = V = 64 */
    const int32_t HK = model.num_k_heads, HV = model.num_v_heads, K = model.head_dim_k, V = model.head_dim_v;
    enum { B = 3, T = 2, SLOTS = 8 };
    const int64_t N = 2 * HK * K + HV * V;  /* fused projection width */
    const int64_t slot_stride = HV * V * K + 256; /* the caller's pool layout */

    uint16_t *proj = malloc(sizeof(uint16_t) * B * T * N), *gates = malloc(sizeof(uint16_t) * B * T * HV * 2);
    float *out = malloc(sizeof(float) * B * T * HV * V), *pool = calloc((size_t)(SLOTS * slot_stride), sizeof(float));
    float A_log[16], dt_bias[16];
    for (int64_t i = 0; i < B * T * N; i++) proj[i] = to_bf16(wave(i));
    for (int64_t i = 0; i < B * T * HV * 2; i++) gates[i] = to_bf16(0.2f * wave(7 * i));
    for (int h = 0; h < HV; h++) A_log[h] = 0.1f * wave(h), dt_bias[h] = 0.1f * wave(h + 5);
    int32_t read_slots[B] = {5, -1, 2}; /* row 1 is padding */
    int32_t accepted[B] = {1, 0, 2};

    gdn_op_layer op = {
        .backend = GDN_BACKEND_CPU,
        .model = model,
        .input_dtype = GDN_DTYPE_BF16,
        .output_dtype = GDN_DTYPE_F32,
        .kind = GDN_STEP_VERIFY,
        .tokens = T,
        .batch = B,
        .q = {proj, T * N, N, K},
        .k = {proj + HK * K, T * N, N, K},
        .v = {proj + 2 * HK * K, T * N, N, V},
        .a = {gates, T * HV * 2, HV * 2, 2},
        .b = {gates + 1, T * HV * 2, HV * 2, 2},
        .o = {out, 0, 0, 0}, /* dense [B, T, HV, V] */
        .A_log = A_log,
        .dt_bias = dt_bias,
        .pool = {pool, GDN_DTYPE_F32, SLOTS, slot_stride},
        .read_slots = read_slots,
        .strategy = GDN_VERIFY_RING,
        .max_batch = B,
        .max_tokens = T,
    };
    const size_t bytes = gdn_op_workspace_bytes(&op);
    void *workspace = calloc(1, bytes); /* zero-filled once */
    op.workspace = workspace;

    gdn_status status = gdn_op_layer_step(&op, NULL);                      /* verify: outputs of T tokens */
    if (status == GDN_OK) status = gdn_op_commit(&op, accepted, NULL);    /* keep accepted[i] of them */
    op.kind = GDN_STEP_DECODE, op.tokens = 1;                              /* then a decode step */
    if (status == GDN_OK) status = gdn_op_layer_step(&op, NULL);
    if (status != GDN_OK) {
        fprintf(stderr, "gdn-op-layer: GDN_%s (%s)\n", gdn_status_name(status), gdn_status_string(status));
        return 1;
    }
    double sum = 0.0;
    int finite = 1;
    for (int64_t i = 0; i < B * 1 * HV * V; i++) sum += out[i], finite &= isfinite(out[i]) != 0;
    printf("gdn-op-layer: ring strategy over strided views, workspace %zu bytes; decode output sum %.6f (%s)\n", bytes,
           sum, finite ? "finite" : "NOT FINITE");
    free(proj), free(gates), free(out), free(pool), free(workspace);
    return finite ? 0 : 1;
}
