/*
 * gdn-bench --tree: speculative verify + commit as the frameworks run it (SPEC 3), one layer through
 * the op layer on the GPU, per preset, state dtype and strategy at batch B:
 *   chain4    every row a chain of T = 4 (the fast path: no counts, no parents);
 *   tree16    every row a 16-node tree of depth 4 (four chains of four, listed level by level as
 *             EAGLE-style drafts list them: parents -1 x4, 0..3, 4..7, 8..11), commit by node;
 *   mixed     T = 4 with per-row counts, half the rows n = 1 and half n = 4;
 *   counts4   T = 4 with per-row counts all 4 (the mixed step's bar);
 *   chain16   every row a chain of T = 16 (as many tokens as the tree);
 *   pchain4, pchain16   the chains given as trees (parents t - 1), committed by node;
 *   tree8     an 8-node tree of depth 4 (two chains of four: parents -1 x2, 0..5), committed by node.
 * Each step commits a random node per row (chain and counts: a count drawn from 0..n; a shape with
 * parents: a node drawn from -1..T - 1), so that fold and ring carry their accepted paths into the next step. Cold
 * state: rows rotate over G groups of B slots whose states exceed 4x the L2 size. The time is the
 * mean GPU time of a verify plus its commit (CUDA events over `steps` steps after as many warm-up
 * steps), and each row's ratio to chain4 of the same strategy is printed.
 *
 *   gdn-bench --tree [--preset qwen3-next] [--state bf16,f32] [--batch 64] [--strategy cache,fold,ring]
 *                    [--steps 200]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "gdn/gdn_op.h"

enum { SHAPES = 8, MAX_T = 16, TREE_T = 16 };
static const char *const shape_names[SHAPES] = {"chain4", "tree16", "mixed", "counts4", "chain16", "pchain4", "pchain16", "tree8"};

/* Every buffer of one (preset, dtype, strategy) setup, in device memory. */
typedef struct setup {
    gdn_op_layer op;
    int32_t B, groups;
    void *pool, *workspace, *q, *k, *v, *a, *b, *out;
    float *params;
    int32_t *rows;          /* [groups][B] read slots */
    int32_t *counts[SHAPES], *parents[SHAPES], *accepted; /* parents: [B][T] of the tree shapes; accepted: [steps][B] */
    int32_t *flag;
} setup;

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int upload_random_bf16(void *dst, size_t n, double scale)
{
    uint16_t *h = malloc(n * 2);
    if (!h) return 1;
    for (size_t e = 0; e < n; e++) h[e] = bf16_of((float)(scale * gdn_bench_rng_normal()));
    const int bad = cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess;
    free(h);
    return bad;
}

static int upload_ints(int32_t *dst, const int32_t *src, size_t n)
{
    return cudaMemcpy(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess;
}

static int shape_tokens(int s) { return s == 1 || s == 4 || s == 6 ? TREE_T : s == 7 ? 8 : 4; }
/* The tree shapes' roots: node t's parent is t - roots (-1 for the first roots nodes); 0: no parents. */
static int shape_roots(int s) { return s == 1 ? 4 : s == 7 ? 2 : s == 5 || s == 6 ? 1 : 0; }

/* Accepted values for `steps` steps of shape s: counts 0..n (chain, counts) or nodes -1..T - 1 (a
 * shape with parents). */
static int32_t *make_accepted(int s, int32_t B, int steps)
{
    int32_t *h = malloc(sizeof(int32_t) * (size_t)B * steps);
    for (int64_t e = 0; e < (int64_t)B * steps; e++) {
        const int32_t i = (int32_t)(e % B);
        const int32_t n = s == 2 && i % 2 == 0 ? 1 : shape_tokens(s);
        h[e] = (int32_t)(gdn_bench_rng_next() % (n + 1)) - (shape_roots(s) ? 1 : 0);
    }
    return h;
}

static int run_shape(setup *c, int s, int steps, double *us)
{
    gdn_op_layer op = c->op;
    op.tokens = shape_tokens(s);
    op.token_counts = s == 2 || s == 3 ? c->counts[s] : NULL;
    op.parents = c->parents[s];
    int32_t *acc_h = make_accepted(s, c->B, steps);
    if (upload_ints(c->accepted, acc_h, (size_t)c->B * steps)) return 1;
    free(acc_h);
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    for (int pass = 0; pass < 2; pass++) { /* warm-up, then timed */
        if (pass == 1) CHECK_CUDA(cudaEventRecord(start, NULL));
        for (int n = 0; n < steps; n++) {
            op.read_slots = c->rows + (int64_t)(n % c->groups) * c->B;
            CHECK_GDN(gdn_op_layer_step(&op, NULL));
            const int32_t *acc = c->accepted + (int64_t)n * c->B;
            CHECK_GDN(op.parents ? gdn_op_commit_node(&op, acc, NULL) : gdn_op_commit(&op, acc, NULL));
        }
    }
    CHECK_CUDA(cudaEventRecord(stop, NULL));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    *us = 1000.0 * ms / steps;
    int32_t flag = 0;
    CHECK_CUDA(cudaMemcpy(&flag, c->flag, 4, cudaMemcpyDeviceToHost));
    cudaEventDestroy(start), cudaEventDestroy(stop);
    if (flag) fprintf(stderr, "gdn-bench --tree: the device error flag was raised (%s)\n", shape_names[s]);
    return flag != 0;
}

static int bench_one(const char *preset, gdn_dtype sdt, gdn_verify_strategy strategy, int32_t B, int steps)
{
    setup c = {0};
    c.B = B;
    gdn_op_layer *op = &c.op;
    CHECK_GDN(gdn_model_preset(preset, 1, &op->model));
    const int32_t HK = op->model.num_k_heads, HV = op->model.num_v_heads, K = op->model.head_dim_k, V = op->model.head_dim_v;
    const size_t slot_bytes = (size_t)HV * V * K * (sdt == GDN_DTYPE_F32 ? 4 : 2);
    int device = 0, l2 = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    c.groups = (int32_t)((4.0 * l2) / ((double)slot_bytes * B)) + 1;
    const int32_t slots = c.groups * B;
    CHECK_CUDA(cudaMalloc(&c.pool, slot_bytes * slots));
    CHECK_CUDA(cudaMemset(c.pool, 0, slot_bytes * slots));
    const size_t qk = (size_t)B * MAX_T * HK * K, vv = (size_t)B * MAX_T * HV * V, g = (size_t)B * MAX_T * HV;
    CHECK_CUDA(cudaMalloc(&c.q, qk * 2));
    CHECK_CUDA(cudaMalloc(&c.k, qk * 2));
    CHECK_CUDA(cudaMalloc(&c.v, vv * 2));
    CHECK_CUDA(cudaMalloc(&c.a, g * 2));
    CHECK_CUDA(cudaMalloc(&c.b, g * 2));
    CHECK_CUDA(cudaMalloc(&c.out, vv * 2));
    if (upload_random_bf16(c.q, qk, 1.0) || upload_random_bf16(c.k, qk, 1.0) || upload_random_bf16(c.v, vv, 1.0) ||
        upload_random_bf16(c.a, g, 0.5) || upload_random_bf16(c.b, g, 0.5))
        return 1;
    float *params_h = malloc(sizeof(float) * 2 * HV);
    for (int h = 0; h < 2 * HV; h++) params_h[h] = (float)(0.1 * gdn_bench_rng_normal());
    CHECK_CUDA(cudaMalloc((void **)&c.params, sizeof(float) * 2 * HV));
    CHECK_CUDA(cudaMemcpy(c.params, params_h, sizeof(float) * 2 * HV, cudaMemcpyHostToDevice));
    free(params_h);
    int32_t *ints = malloc(sizeof(int32_t) * (size_t)slots);
    for (int32_t e = 0; e < slots; e++) ints[e] = e;
    CHECK_CUDA(cudaMalloc((void **)&c.rows, sizeof(int32_t) * slots));
    if (upload_ints(c.rows, ints, (size_t)slots)) return 1;
    int32_t counts_h[SHAPES][1024], parents_h[1024 * TREE_T];
    if (B > 1024) return 1;
    for (int32_t i = 0; i < B; i++) counts_h[2][i] = i % 2 == 0 ? 1 : 4, counts_h[3][i] = 4;
    for (int s = 2; s <= 3; s++) {
        CHECK_CUDA(cudaMalloc((void **)&c.counts[s], sizeof(int32_t) * B));
        if (upload_ints(c.counts[s], counts_h[s], (size_t)B)) return 1;
    }
    for (int s = 0; s < SHAPES; s++) {
        const int T = shape_tokens(s), roots = shape_roots(s);
        if (!roots) continue;
        for (int32_t i = 0; i < B; i++)
            for (int t = 0; t < T; t++) parents_h[i * T + t] = t < roots ? -1 : t - roots;
        CHECK_CUDA(cudaMalloc((void **)&c.parents[s], sizeof(int32_t) * B * T));
        if (upload_ints(c.parents[s], parents_h, (size_t)B * T)) return 1;
    }
    CHECK_CUDA(cudaMalloc((void **)&c.accepted, sizeof(int32_t) * (size_t)B * steps));
    CHECK_CUDA(cudaMalloc((void **)&c.flag, 4));
    CHECK_CUDA(cudaMemset(c.flag, 0, 4));
    free(ints);

    op->backend = GDN_BACKEND_CUDA;
    op->input_dtype = GDN_DTYPE_BF16, op->output_dtype = GDN_DTYPE_BF16;
    op->kind = GDN_STEP_VERIFY;
    op->batch = B;
    op->A_log = c.params, op->dt_bias = c.params + HV;
    op->q = (gdn_view){c.q, 0, 0, 0}, op->k = (gdn_view){c.k, 0, 0, 0}, op->v = (gdn_view){c.v, 0, 0, 0};
    op->a = (gdn_view){c.a, 0, 0, 0}, op->b = (gdn_view){c.b, 0, 0, 0}, op->o = (gdn_view){c.out, 0, 0, 0};
    op->pool = (gdn_state_pool){c.pool, sdt, slots, (int64_t)HV * V * K};
    op->error_flag = c.flag;
    op->strategy = strategy;
    op->max_batch = B, op->max_tokens = MAX_T;
    const size_t ws = gdn_op_workspace_bytes(op);
    if (!ws) return 1;
    CHECK_CUDA(cudaMalloc(&c.workspace, ws));
    CHECK_CUDA(cudaMemset(c.workspace, 0, ws));
    op->workspace = c.workspace;

    static const char *const strategy_names[] = {"cache", "fold", "auto", "ring"};
    double us[SHAPES];
    int bad = 0;
    for (int s = 0; s < SHAPES && !bad; s++) bad = run_shape(&c, s, steps, &us[s]);
    if (!bad)
        for (int s = 0; s < SHAPES; s++)
            printf("%-11s %-5s %-5s B=%-4d %-8s %9.2f us  %5.2fx chain4\n", preset, sdt == GDN_DTYPE_F32 ? "f32" : "bf16",
                   strategy_names[strategy], B, shape_names[s], us[s], us[s] / us[0]);
    void *all[] = {c.pool, c.workspace, c.q, c.k, c.v, c.a, c.b, c.out, c.params, c.rows, c.accepted, c.flag};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++) cudaFree(all[n]);
    for (int s = 0; s < SHAPES; s++) cudaFree(c.counts[s]), cudaFree(c.parents[s]);
    return bad;
}

int gdn_bench_tree_main(int argc, char **argv)
{
    const char *presets = "qwen3-next", *states = "bf16,f32", *strategies = "cache,fold,ring";
    int batch = 64, steps = 200;
    for (int n = 1; n < argc; n++) {
        const char *a = argv[n], *v = n + 1 < argc ? argv[n + 1] : NULL;
        if (v && !strcmp(a, "--preset")) presets = v, n++;
        else if (v && !strcmp(a, "--state")) states = v, n++;
        else if (v && !strcmp(a, "--strategy")) strategies = v, n++;
        else if (v && !strcmp(a, "--batch")) batch = atoi(v), n++;
        else if (v && !strcmp(a, "--steps")) steps = atoi(v), n++;
        else {
            fprintf(stderr, "usage: gdn-bench --tree [--preset p,..] [--state bf16,f32] [--strategy cache,fold,ring] "
                            "[--batch B] [--steps N]\n");
            return 2;
        }
    }
    if (batch < 1 || batch > 1024 || steps < 1) return 2;
    gdn_bench_rng_seed(7);
    printf("gdn-bench --tree: one layer, verify + commit, mean GPU us per step (cold state)\n");
    int bad = 0;
    char plist[256];
    snprintf(plist, sizeof plist, "%s", presets);
    for (char *p = strtok(plist, ","); p; p = strtok(NULL, ",")) {
        char preset[64];
        snprintf(preset, sizeof preset, "%s", p);
        for (int si = 0; si < 2; si++) {
            const gdn_dtype sdt = si == 0 ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
            if (!strstr(states, si == 0 ? "bf16" : "f32")) continue;
            static const gdn_verify_strategy order[] = {GDN_VERIFY_CACHE, GDN_VERIFY_FOLD, GDN_VERIFY_RING};
            static const char *const names[] = {"cache", "fold", "ring"};
            for (int k = 0; k < 3; k++)
                if (strstr(strategies, names[k])) bad |= bench_one(preset, sdt, order[k], batch, steps);
        }
    }
    return bad ? 1 : 0;
}
