/*
 * The mixer step's conv and gated norm as separate kernels (gdn-bench --engine --separate), the
 * baseline the fused mixer step is measured against (issue 15): what a serving engine runs today
 * around a recurrence-only kernel, written plainly.
 *   conv: one thread per (row, channel) of x [B, T, conv_dim]: the depthwise causal conv of W taps
 *     over [window of the row's slot; x], SiLU, into the recurrence's q | k | v; a decode moves the
 *     window (the last W - 1 of the sequence), a verify leaves it (its commit is not modelled).
 *   norm: one warp per (row, token, value head): y = o rsqrt(mean(o^2) + eps) w silu(z).
 * Padding rows (read slot < 0) are skipped. bf16 activations and weights, fp32 norm weight.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gdn/gdn.h"

extern "C" { /* the C declarations of bench_common.h (its system headers are in already) */
#include "bench_common.h"
}

#define SEPARATE_MAX_WIDTH 4

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

__global__ void separate_conv_kernel(gdn_bench_separate c, const __nv_bfloat16 *weight, const __nv_bfloat16 *bias,
                                     __nv_bfloat16 *window, const int32_t *read_slots, int32_t T, int move_window,
                                     __nv_bfloat16 *q, __nv_bfloat16 *k, __nv_bfloat16 *v)
{
    const int64_t i = blockIdx.y;
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t slot = read_slots[i];
    if (slot < 0 || ch >= c.conv_dim) return;
    const int W = c.conv_width, rows = W - 1;
    float seq[SEPARATE_MAX_WIDTH - 1 + 16], w[SEPARATE_MAX_WIDTH];
    __nv_bfloat16 *win = window + (int64_t)slot * rows * c.conv_dim + ch;
    for (int j = 0; j < rows; j++) seq[j] = __bfloat162float(win[(int64_t)j * c.conv_dim]);
    for (int j = 0; j < W; j++) w[j] = __bfloat162float(weight[(int64_t)ch * W + j]);
    const float b = __bfloat162float(bias[ch]);
    const __nv_bfloat16 *x = static_cast<const __nv_bfloat16 *>(c.x);
    const int qk = c.HK * c.K;
    for (int t = 0; t < T; t++) {
        seq[rows + t] = __bfloat162float(x[(i * T + t) * c.conv_dim + ch]);
        float acc = b;
        for (int j = 0; j < W; j++) acc = fmaf(w[j], seq[t + j], acc);
        const __nv_bfloat16 out = __float2bfloat16(silu(acc));
        const int64_t row = i * T + t;
        if (ch < qk) q[row * qk + ch] = out;
        else if (ch < 2 * qk) k[row * qk + ch - qk] = out;
        else v[row * (int64_t)c.HV * c.V + ch - 2 * qk] = out;
    }
    if (move_window)
        for (int j = 0; j < rows; j++) win[(int64_t)j * c.conv_dim] = __float2bfloat16(seq[T + j]);
}

template <typename O>
__global__ void separate_norm_kernel(gdn_bench_separate c, const O *o, const int32_t *read_slots, int32_t bucket, int32_t T)
{
    const int lane = threadIdx.x & 31;
    const int64_t unit = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (row, token, head) */
    const int64_t units = (int64_t)bucket * T * c.HV;
    if (unit >= units) return;
    const int64_t i = unit / ((int64_t)T * c.HV);
    if (read_slots[i] < 0) return;
    const int64_t base = unit * c.V;
    float sum = 0.0f;
    for (int e = lane; e < c.V; e += 32) {
        const float x = (float)o[base + e];
        sum = fmaf(x, x, sum);
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float rstd = rsqrtf(sum / (float)c.V + c.norm_eps);
    const __nv_bfloat16 *z = static_cast<const __nv_bfloat16 *>(c.z);
    __nv_bfloat16 *y = static_cast<__nv_bfloat16 *>(c.y);
    for (int e = lane; e < c.V; e += 32)
        y[base + e] = __float2bfloat16((float)o[base + e] * rstd * c.norm_weight[e] * silu(__bfloat162float(z[base + e])));
}

extern "C" int gdn_bench_separate_conv(const gdn_bench_separate *c, int32_t layer, const int32_t *read_slots, int32_t bucket,
                                       int32_t T, void *q, void *k, void *v, cudaStream_t s)
{
    if (c->conv_width < 2 || c->conv_width > SEPARATE_MAX_WIDTH || T > 16) return -1;
    const dim3 grid((unsigned)((c->conv_dim + 127) / 128), (unsigned)bucket);
    auto *window = static_cast<__nv_bfloat16 *>(c->window) + (int64_t)layer * c->num_slots * (c->conv_width - 1) * c->conv_dim;
    separate_conv_kernel<<<grid, 128, 0, s>>>(*c, static_cast<const __nv_bfloat16 *>(c->weight),
                                              static_cast<const __nv_bfloat16 *>(c->bias), window, read_slots, T, T == 1,
                                              static_cast<__nv_bfloat16 *>(q), static_cast<__nv_bfloat16 *>(k),
                                              static_cast<__nv_bfloat16 *>(v));
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int gdn_bench_separate_norm(const gdn_bench_separate *c, const void *o, int o_is_f32, const int32_t *read_slots,
                                       int32_t bucket, int32_t T, cudaStream_t s)
{
    const int64_t units = (int64_t)bucket * T * c->HV;
    const unsigned blocks = (unsigned)((units + 3) / 4);
    if (o_is_f32) separate_norm_kernel<float><<<blocks, 128, 0, s>>>(*c, static_cast<const float *>(o), read_slots, bucket, T);
    else separate_norm_kernel<__nv_bfloat16><<<blocks, 128, 0, s>>>(*c, static_cast<const __nv_bfloat16 *>(o), read_slots, bucket, T);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
