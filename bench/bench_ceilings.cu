/*
 * gdn-bench --ceilings: what plain memory passes of a layer step's shape reach on this GPU, beside the
 * copy ceiling of SPEC 5 (2 GiB device-to-device, bytes read + written):
 *   - read: a 2 GiB contiguous read (every byte once, summed);
 *   - state read: the states of B rows (random distinct slots of a pool of --slots slots), each CTA
 *     reading a 32 KB tile of one head into registers, 16-byte loads, all in flight before the first
 *     use; the floor of a decode that reads the state and does not write it (the ring strategy);
 *   - state read + write: the same tiles written back in place; the floor of a decode that writes
 *     its state (cache, fold).
 * Each pass does as little arithmetic as keeps its loads alive. The state passes run as one CUDA graph
 * of launches, replayed, like the step graphs of --strategies: launch j reads layer pool j mod
 * --layers and the j-th group of B slots, and there are enough launches (a multiple of --layers) that
 * what they read exceeds 4x the L2 size, so every launch reads cold state. Times are per launch.
 *
 *   gdn-bench --ceilings [--preset qwen3-next,qwen3.5] [--state f32,bf16] [--batch 1,4,16,64,256,512]
 *                        [--slots 1024] [--layers 8] [--samples 20]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdn/gdn.h"

extern "C" { /* the C declarations of bench_common.h (its system headers are in already) */
#include "bench_common.h"
}

/* 16-byte pieces a lane reads of its tile, warps a CTA: 8 x 16 B x 32 lanes x 8 warps = 32 KB a CTA. */
#define TILE_PIECES 8
#define TILE_WARPS 8
#define TILE_BYTES (TILE_PIECES * 16 * 32 * TILE_WARPS)

__global__ void contiguous_read_kernel(const uint4 *__restrict__ a, size_t n, unsigned *sink)
{
    unsigned x = 0;
#pragma unroll 8
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(a + i);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u) sink[0] = x; /* keeps the loads; never true for the zeroed buffer */
}

/* blockIdx.y: the row; blockIdx.x: the tile of its slot's state. WRITE: the tile goes to `to`. */
template <bool WRITE>
__global__ void __launch_bounds__(TILE_WARPS * 32) state_tile_kernel(const char *from, char *to,
                                                                     const int *slots, size_t slot_bytes, unsigned *out)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t at = (size_t)slots[blockIdx.y] * slot_bytes + (size_t)blockIdx.x * TILE_BYTES + (size_t)warp * TILE_PIECES * 512;
    const uint4 *src = reinterpret_cast<const uint4 *>(from + at) + lane;
    uint4 v[TILE_PIECES];
#pragma unroll
    for (int e = 0; e < TILE_PIECES; e++) v[e] = __ldcs(src + e * 32);
    unsigned x = 0;
#pragma unroll
    for (int e = 0; e < TILE_PIECES; e++) x ^= v[e].x ^ v[e].y ^ v[e].z ^ v[e].w;
    if (WRITE) {
        uint4 *dst = reinterpret_cast<uint4 *>(to + at) + lane;
#pragma unroll
        for (int e = 0; e < TILE_PIECES; e++) __stcs(dst + e * 32, make_uint4(v[e].x ^ x, v[e].y, v[e].z, v[e].w));
    }
    if (lane == 0) out[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = x;
}

/* Captures launch(s) into a graph and times `samples` replays after a warm-up one; *us: per replay. */
template <typename Launch> static int time_captured(cudaStream_t s, int samples, Launch launch, double *us)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch(s);
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    CHECK_CUDA(cudaGraphLaunch(exec, s)); /* warm-up */
    CHECK_CUDA(cudaEventRecord(e0, s));
    for (int i = 0; i < samples; i++) CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(e1, s));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    *us = ms * 1e3 / samples;
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    return 0;
}

/* One graph of state passes over B rows each (see the top); *us: per launch. */
static int time_state_pass(int write, char **pools, int layers, const int *slots, int num_slots, int B, size_t slot_bytes,
                           size_t l2_bytes, unsigned *out, cudaStream_t s, int samples, double *us)
{
    const dim3 grid((unsigned)(slot_bytes / TILE_BYTES), (unsigned)B);
    const size_t per_launch = slot_bytes * (size_t)B;
    int launches = layers;
    while ((size_t)launches * per_launch < 4 * l2_bytes) launches += layers;
    const int groups = num_slots / B;
    const int rc = time_captured(s, samples, [&](cudaStream_t st) {
        for (int j = 0; j < launches; j++) {
            char *pool = pools[j % layers];
            const int *rows = slots + (size_t)(j / layers % groups) * B;
            if (write) state_tile_kernel<true><<<grid, TILE_WARPS * 32, 0, st>>>(pool, pool, rows, slot_bytes, out);
            else state_tile_kernel<false><<<grid, TILE_WARPS * 32, 0, st>>>(pool, NULL, rows, slot_bytes, out);
        }
    }, us);
    *us /= launches;
    return rc;
}

static int contiguous_read(cudaStream_t s, int samples, double *gbps)
{
    const size_t bytes = (size_t)2 << 30;
    void *a = NULL;
    unsigned *sink = NULL;
    int sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
    CHECK_CUDA(cudaMemsetAsync(a, 0, bytes, s));
    double us = 0;
    const int rc = time_captured(s, samples, [&](cudaStream_t st) {
        contiguous_read_kernel<<<sms * 4, 512, 0, st>>>(static_cast<const uint4 *>(a), bytes / 16, sink);
    }, &us);
    *gbps = bytes / us / 1e3;
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(sink));
    return rc;
}

extern "C" int gdn_bench_ceilings_main(int argc, char **argv)
{
    const char *presets = "qwen3-next,qwen3.5", *states = "f32,bf16";
    int batch[32] = {1, 4, 16, 64, 256, 512}, nbatch = 6, num_slots = 1024, layers = 8, samples = 20;
    static const char usage[] =
        "usage: gdn-bench --ceilings [--preset qwen3-next,qwen3.5] [--state f32,bf16] [--batch 1,4,16,64,256,512]\n"
        "                            [--slots 1024] [--layers 8] [--samples 20]\n";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("%s", usage);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "gdn-bench --ceilings: %s needs a value\n%s", a, usage);
            return 2;
        }
        if (!strcmp(a, "--preset")) presets = v;
        else if (!strcmp(a, "--state")) states = v;
        else if (!strcmp(a, "--batch")) nbatch = bench_parse_list(v, batch, 32);
        else if (!strcmp(a, "--slots")) num_slots = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--samples")) samples = atoi(v);
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
        i++;
    }
    int max_b = 0, min_b = nbatch > 0 ? batch[0] : 0;
    for (int j = 0; j < nbatch; j++) max_b = batch[j] > max_b ? batch[j] : max_b, min_b = batch[j] < min_b ? batch[j] : min_b;
    if (nbatch < 1 || layers < 2 || layers > 64 || samples < 1 || num_slots < max_b || min_b < 1) {
        fprintf(stderr, "gdn-bench --ceilings: needs batches >= 1, --layers 2..64, --samples >= 1 and --slots >= the largest batch\n");
        return 2;
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
        printf("gdn-bench --ceilings: no CUDA device; nothing measured\n");
        return 0;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double copy_gbps = 0, read_gbps = 0;
    if (gdn_bench_copy_ceiling(s, &copy_gbps) || contiguous_read(s, samples, &read_gbps)) return 3;
    printf("# %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
    printf("# copy ceiling %.1f GB/s (2 GiB D2D, read + write); contiguous read %.1f GB/s (2 GiB, %.1f%% of copy)\n", copy_gbps,
           read_gbps, 100.0 * read_gbps / copy_gbps);
    printf("# state passes: %d KB tiles, 16-byte loads in flight, rows over %d slots, %d layer pools, cold (4x L2 a graph)\n",
           TILE_BYTES / 1024, num_slots, layers);
    printf("%-11s %4s %5s | %9s %8s %7s | %9s %8s %7s\n", "preset", "st", "B", "read us", "GB/s", "% copy", "r+w us", "GB/s",
           "% copy");

    /* Random distinct slots for the rows. */
    int32_t *host_slots = static_cast<int32_t *>(malloc(sizeof(int32_t) * (size_t)num_slots));
    if (!host_slots) return 3;
    for (int j = 0; j < num_slots; j++) host_slots[j] = j;
    gdn_bench_rng_seed(35);
    gdn_bench_shuffle(host_slots, num_slots);
    int *slots = NULL;
    CHECK_CUDA(cudaMalloc(&slots, sizeof(int) * (size_t)num_slots));
    CHECK_CUDA(cudaMemcpy(slots, host_slots, sizeof(int) * (size_t)num_slots, cudaMemcpyHostToDevice));
    free(host_slots);

    int rc = 0;
    for (const char *p = presets; *p && !rc;) {
        const size_t n = strcspn(p, ",");
        char name[32] = {0};
        if (n >= sizeof name) return 2;
        memcpy(name, p, n);
        p += n + (p[n] == ',');
        gdn_model_config m;
        if (gdn_model_preset(name, 1, &m) != GDN_OK) {
            fprintf(stderr, "gdn-bench --ceilings: unknown preset %s\n", name);
            return 2;
        }
        for (const char *q = states; *q && !rc;) {
            const size_t sn = strcspn(q, ",");
            const int f32 = sn == 3 && !strncmp(q, "f32", 3);
            q += sn + (q[sn] == ',');
            const size_t slot_bytes = (size_t)m.num_v_heads * m.head_dim_k * m.head_dim_v * (f32 ? 4 : 2);
            if (slot_bytes % TILE_BYTES) continue; /* the tiles must cover a slot */
            char *pools[64] = {0};
            unsigned *out = NULL;
            for (int l = 0; l < layers; l++) CHECK_CUDA(cudaMalloc(&pools[l], slot_bytes * (size_t)num_slots));
            for (int l = 0; l < layers; l++) CHECK_CUDA(cudaMemsetAsync(pools[l], 0, slot_bytes * (size_t)num_slots, s));
            CHECK_CUDA(cudaMalloc(&out, sizeof(unsigned) * (size_t)max_b * (slot_bytes / TILE_BYTES)));
            for (int j = 0; j < nbatch && !rc; j++) {
                double r_us = 0, rw_us = 0;
                rc = time_state_pass(0, pools, layers, slots, num_slots, batch[j], slot_bytes, (size_t)prop.l2CacheSize, out, s, samples,
                                     &r_us) ||
                     time_state_pass(1, pools, layers, slots, num_slots, batch[j], slot_bytes, (size_t)prop.l2CacheSize, out, s, samples,
                                     &rw_us);
                const double bytes = (double)slot_bytes * batch[j];
                printf("%-11s %4s %5d | %9.2f %8.1f %7.1f | %9.2f %8.1f %7.1f\n", name, f32 ? "f32" : "bf16", batch[j], r_us,
                       bytes / r_us / 1e3, 100.0 * bytes / r_us / 1e3 / copy_gbps, rw_us, 2 * bytes / rw_us / 1e3,
                       100.0 * 2 * bytes / rw_us / 1e3 / copy_gbps);
            }
            for (int l = 0; l < layers; l++) CHECK_CUDA(cudaFree(pools[l]));
            CHECK_CUDA(cudaFree(out));
        }
    }
    CHECK_CUDA(cudaFree(slots));
    CHECK_CUDA(cudaStreamDestroy(s));
    return rc ? 3 : 0;
}
