/*
 * gdn-serving-loop: a simulated LLM serving loop driving the GDN layers of a model through gdn-engine,
 * with nothing but the installed public API (gdn/gdn.h; build it against `pkg-config gdn`).
 *
 * In the order a serving engine does it:
 *   1. Create an engine (backend AUTO: CUDA when there is a GPU, else the float64 CPU backend; the
 *      program says which) and give every layer its A_log and dt_bias.
 *   2. Requests arrive at a varying rate. Admitting one takes a slot (gdn_slot_alloc) and gives it an
 *      initial state: a prefill's final state written into every layer (gdn_slot_write_state) or
 *      zeros (gdn_slot_reset). When every slot is taken, arrivals wait (GDN_ESLOT_EXHAUSTED is an
 *      ordinary answer).
 *   3. Each step takes up to max_batch live requests, round-robin, and runs a decode step (T = 1) or
 *      a speculative verify step (T = 2..max_tokens): per layer, write q, k, v, a, b into the layer's
 *      static buffers, run the layer, read its output. After a verify the "sampler" writes how many
 *      draft tokens each row accepted into the engine's accepted buffer (device memory on CUDA) and
 *      the engine commits them. Requests advance by what they accepted and retire (gdn_slot_free).
 *   With --tree each verify step is a token tree, as EAGLE-style drafting makes one: every row drafts
 *      a random tree of 1..T nodes (T up to 16; gdn_step.token_counts and .parents), the sampler
 *      accepts one root path by writing its last node (-1: none) into the accepted buffer, and the
 *      request advances by that path's length. Positions past a row's nodes must come back zero.
 *   4. Outputs are poisoned before each layer runs and must come back finite; at the end the
 *      device's sticky error flag must be clear and every slot returned. (The comparison with a float64
 *      reference lives in the test suite: tests/serving_loop_check.c.)
 *   With --tp N the loop runs as a tensor-parallel serving engine does: one engine per device (CUDA
 *      device d, or N CPU engines), engine d holding key heads [d HK/N, (d+1) HK/N) and value heads
 *      [d HV/N, (d+1) HV/N) of every layer, all driven from this thread. Every call goes to each engine
 *      in turn: the same slots, the same step, each engine its heads' slice of the inputs; a layer is
 *      started on every device before any output is read back. (The all-reduce after the output
 *      projection is the caller's; tests/test_gpu_tp.c checks the union against one engine.)
 *
 *   gdn-serving-loop [--preset tiny|qwen3-next|qwen3.5] [--layers N] [--steps N] [--seed N]
 *                    [--state f32|bf16] [--output bf16|f32] [--backend auto|cpu|cuda]
 *                    [--max-batch N] [--max-tokens N] [--slots N] [--verify auto|cache|fold|ring]
 *                    [--tree] [--tp N] [--verbose]
 * Exit status: 0 when every check passed, 1 otherwise, 2 on a bad argument.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdn/gdn.h>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        gdn_status status_ = (call);                                                                \
        if (status_ != GDN_OK) {                                                                    \
            fprintf(stderr, "%s:%d: %s: GDN_%s (%s)\n", __FILE__, __LINE__, #call,                  \
                    gdn_status_name(status_), gdn_status_string(status_));                          \
            if (engine && gdn_engine_last_error(engine)[0])                                         \
                fprintf(stderr, "  CUDA: %s\n", gdn_engine_last_error(engine));                     \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

#define MAX_TP 8
static gdn_engine *engine; /* the engine being called, for CHECK's error text */
static gdn_engine *engines[MAX_TP];
static int tp = 1;

/* Runs `call` (which names `engine`) on every engine in turn. */
#define EACH(call)                                                                                  \
    for (int d_ = 0; d_ < tp; d_++) {                                                               \
        engine = engines[d_];                                                                       \
        CHECK(call);                                                                                \
    }

/* Copies heads [h0, h0 + h) of each of `rows` rows of `heads` heads of `width` 2-byte values. */
static void slice_heads(uint16_t *dst, const uint16_t *src, size_t rows, int heads, int h0, int h, size_t width)
{
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * h * width, src + (r * heads + h0) * width, sizeof(uint16_t) * h * width);
}

/* xorshift64*: the example's own random source. */
static uint64_t rng_state = 42;
static double uniform(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static double normal(void) { return sqrt(-2.0 * log(1.0 - uniform())) * cos(6.283185307179586 * uniform()); }
static int between(int lo, int hi) { return lo + (int)(uniform() * (hi - lo + 1)); }

/* bf16 <-> fp32 (round to nearest even), the input and output format used here. */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

typedef struct options {
    const char *preset;
    int layers, steps, max_batch, max_tokens, slots, verbose, tree;
    gdn_dtype state, output;
    gdn_backend_kind backend;
    gdn_verify_strategy verify;
} options;

static int parse(int argc, char **argv, options *o)
{
    *o = (options){"tiny", 3, 96, 16, 0, 0, 0, 0, GDN_DTYPE_F32, GDN_DTYPE_BF16, GDN_BACKEND_AUTO, GDN_VERIFY_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--verbose")) { o->verbose = 1; continue; }
        if (!strcmp(a, "--tree")) { o->tree = 1; continue; }
        if (!v) return 0;
        i++;
        if (!strcmp(a, "--preset")) o->preset = v;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--seed")) rng_state = strtoull(v, NULL, 10) | 1u;
        else if (!strcmp(a, "--max-batch")) o->max_batch = atoi(v);
        else if (!strcmp(a, "--max-tokens")) o->max_tokens = atoi(v);
        else if (!strcmp(a, "--slots")) o->slots = atoi(v);
        else if (!strcmp(a, "--tp")) tp = atoi(v);
        else if (!strcmp(a, "--state")) o->state = !strcmp(v, "bf16") ? GDN_DTYPE_BF16 : GDN_DTYPE_F32;
        else if (!strcmp(a, "--output")) o->output = !strcmp(v, "f32") ? GDN_DTYPE_F32 : GDN_DTYPE_BF16;
        else if (!strcmp(a, "--backend"))
            o->backend = !strcmp(v, "cpu") ? GDN_BACKEND_CPU : !strcmp(v, "cuda") ? GDN_BACKEND_CUDA : GDN_BACKEND_AUTO;
        else if (!strcmp(a, "--verify"))
            o->verify = !strcmp(v, "cache")    ? GDN_VERIFY_CACHE
                        : !strcmp(v, "fold") ? GDN_VERIFY_FOLD
                        : !strcmp(v, "ring")   ? GDN_VERIFY_RING
                                               : GDN_VERIFY_AUTO;
        else return 0;
    }
    if (o->slots == 0) o->slots = o->max_batch + o->max_batch / 4;
    if (o->max_tokens == 0) o->max_tokens = o->tree ? GDN_MAX_TOKENS : 4; /* trees of up to 16 nodes */
    return o->steps >= 0 && tp >= 1 && tp <= MAX_TP;
}

int main(int argc, char **argv)
{
    options o;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: see the comment at the top of examples/serving_loop.c\n");
        return 2;
    }
    gdn_model_config model;
    CHECK(gdn_model_preset(o.preset, o.layers, &model));
    gdn_engine_config config;
    CHECK(gdn_engine_config_init(&config, &model));
    config.state_dtype = o.state, config.output_dtype = o.output, config.backend = o.backend;
    config.num_slots = o.slots, config.max_batch = o.max_batch, config.max_tokens = o.max_tokens;
    config.verify_strategy = o.verify;
    const int L = o.layers, HK = model.num_k_heads, HV = model.num_v_heads, K = model.head_dim_k, V = model.head_dim_v;
    if (HK % tp || HV % tp) {
        fprintf(stderr, "--tp %d does not divide the %d key and %d value heads\n", tp, HK, HV);
        return 2;
    }
    const int HKp = HK / tp, HVp = HV / tp; /* each engine's heads */
    config.model.num_k_heads = HKp, config.model.num_v_heads = HVp;
    for (int d = 0; d < tp; d++) {
        config.device = d;
        const gdn_status created = gdn_engine_create(&config, &engines[d]);
        if (created != GDN_OK) {
            fprintf(stderr, "engine %d of %d: GDN_%s (%s)%s\n", d, tp, gdn_status_name(created), gdn_status_string(created),
                    tp > 1 ? " (--tp needs that many GPUs with the CUDA backend)" : "");
            return created == GDN_ENODEV ? 2 : 1;
        }
    }
    engine = engines[0];
    const gdn_engine_config *c = gdn_engine_get_config(engine);
    const char *strategies[] = {"cache", "fold", "auto", "ring"};
    printf("gdn-serving-loop: %s backend, %s x %d layers, %s state, %s verify%s, %d slots, batches up to %d, T up to %d\n",
           gdn_engine_backend(engine) == GDN_BACKEND_CUDA ? "CUDA (GPU)" : "CPU (float64 reference, no GPU used)",
           o.preset, L, o.state == GDN_DTYPE_F32 ? "fp32" : "bf16", strategies[c->verify_strategy],
           o.tree ? " of token trees" : "", o.slots, o.max_batch, o.max_tokens);
    if (tp > 1) printf("tensor parallel: %d engines (%s), each %d key and %d value heads\n", tp,
                       gdn_engine_backend(engine) == GDN_BACKEND_CUDA ? "one per device" : "all on the CPU", HKp, HVp);

    float *params = malloc(sizeof(float) * 2 * HV);
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < 2 * HV; h++) params[h] = (float)(0.1 * normal());
        for (int d = 0; d < tp; d++) { /* each engine its value heads' A_log and dt_bias */
            engine = engines[d];
            CHECK(gdn_engine_set_layer_params(engine, l, params + d * HVp, params + HV + d * HVp));
        }
    }

    /* Host staging (a real engine's tensors are already on the device). */
    const size_t rows = (size_t)o.max_batch * o.max_tokens, out_size = gdn_dtype_size(o.output);
    const size_t state_elems = (size_t)HV * V * K, state_size = gdn_dtype_size(o.state);
    uint16_t *qk = malloc(sizeof(uint16_t) * 2 * rows * HK * K), *v = malloc(sizeof(uint16_t) * rows * HV * V);
    uint16_t *ab = malloc(sizeof(uint16_t) * 2 * rows * HV);
    uint16_t *part = malloc(sizeof(uint16_t) * rows * (HV * V > HK * K ? HV * V : HK * K)); /* one engine's slice */
    unsigned char *out = malloc(rows * HV * V * out_size), *prefill = malloc(state_elems * state_size);
    const size_t part_state = state_elems / tp * state_size; /* one engine's heads of a slot's state */
    int32_t *slot_of_row = malloc(sizeof(int32_t) * o.max_batch), *accepted = malloc(sizeof(int32_t) * o.max_batch);
    int32_t *counts = malloc(sizeof(int32_t) * o.max_batch), *parents = malloc(sizeof(int32_t) * o.max_batch * o.max_tokens);
    int32_t *live = malloc(sizeof(int32_t) * o.slots), *tokens_left = calloc((size_t)o.slots, sizeof(int32_t));
    int n_live = 0, waiting = 0, cursor = 0;
    long admitted = 0, retired = 0, decode_steps = 0, verify_steps = 0, drafted = 0, kept = 0, bad_outputs = 0;

    for (int step = 0; step < o.steps; step++) {
        /* Arrivals and admission. */
        waiting += between(0, 2);
        while (waiting > 0) {
            int32_t slot;
            engine = engines[0];
            const gdn_status s = gdn_slot_alloc(engine, &slot);
            if (s == GDN_ESLOT_EXHAUSTED) break;
            CHECK(s);
            for (int d = 1; d < tp; d++) { /* the engines hand out slots in lockstep */
                int32_t twin;
                engine = engines[d];
                CHECK(gdn_slot_alloc(engine, &twin));
                if (twin != slot) {
                    fprintf(stderr, "engine %d allocated slot %d, engine 0 slot %d\n", d, twin, slot);
                    return 1;
                }
            }
            if (uniform() < 0.5) {
                EACH(gdn_slot_reset(engine, slot, NULL));
            } else { /* a prefill's final state, one layer at a time */
                for (int l = 0; l < L; l++) {
                    for (size_t e = 0; e < state_elems; e++) {
                        const float x = (float)(0.1 * normal());
                        if (o.state == GDN_DTYPE_F32) memcpy(prefill + 4 * e, &x, 4);
                        else ((uint16_t *)prefill)[e] = to_bf16(x);
                    }
                    EACH(gdn_slot_write_state(engine, l, slot, prefill + d_ * part_state));
                }
            }
            tokens_left[slot] = between(4, 40);
            live[n_live++] = slot;
            waiting--, admitted++;
        }
        if (n_live == 0) continue;

        /* The step's rows, round-robin over the live requests. */
        const int batch = n_live < o.max_batch ? n_live : o.max_batch;
        for (int i = 0; i < batch; i++) slot_of_row[i] = live[(cursor + i) % n_live];
        cursor = (cursor + batch) % n_live;
        const int verify = o.max_tokens > 1 && uniform() < 0.5;
        const int T = verify ? between(2, o.max_tokens) : 1;
        int tree = verify && o.tree;
        /* A draft tree per row: n nodes, node t's parent in -1..t-1 (mostly the node before it). */
        for (int i = 0; tree && i < batch; i++) {
            counts[i] = between(1, T);
            for (int t = 0; t < counts[i]; t++) parents[i * T + t] = uniform() < 0.5 ? t - 1 : between(-1, t - 1);
        }
        gdn_step step_desc = {.kind = verify ? GDN_STEP_VERIFY : GDN_STEP_DECODE, .tokens = T, .batch = batch,
                              .slots = slot_of_row, .token_counts = tree ? counts : NULL, .parents = tree ? parents : NULL};
        int32_t bucket;
        engine = engines[0];
        gdn_status began = gdn_engine_begin_step(engine, &step_desc, NULL, &bucket);
        if (began == GDN_ENOTSUP && tree) { /* a backend whose kernels do not run trees: chains instead */
            printf("token trees are not supported on this backend: verify steps run chains instead\n");
            o.tree = tree = 0;
            step_desc.token_counts = step_desc.parents = NULL;
            began = gdn_engine_begin_step(engine, &step_desc, NULL, &bucket);
        }
        CHECK(began);
        for (int d = 1; d < tp; d++) {
            engine = engines[d];
            CHECK(gdn_engine_begin_step(engine, &step_desc, NULL, NULL));
        }

        const size_t n = (size_t)batch * T;
        for (int l = 0; l < L; l++) {
            for (size_t e = 0; e < 2 * n * HK * K; e++) qk[e] = to_bf16((float)normal());
            for (size_t e = 0; e < n * HV * V; e++) v[e] = to_bf16((float)normal());
            for (size_t e = 0; e < 2 * n * HV; e++) ab[e] = to_bf16((float)(0.1 * normal()));
            for (int d = 0; d < tp; d++) { /* each engine its heads of the inputs; the layer starts everywhere */
                gdn_layer_io io;
                engine = engines[d];
                CHECK(gdn_engine_layer_io(engine, l, &io));
                const struct { void *to; const uint16_t *from; int heads, h, width; } in[] = {
                    {io.q, qk, HK, HKp, K}, {io.k, qk + n * HK * K, HK, HKp, K}, {io.v, v, HV, HVp, V},
                    {io.a, ab, HV, HVp, 1}, {io.b, ab + n * HV, HV, HVp, 1}};
                for (int p = 0; p < 5; p++) {
                    slice_heads(part, in[p].from, n, in[p].heads, d * in[p].h, in[p].h, (size_t)in[p].width);
                    CHECK(gdn_engine_upload(engine, in[p].to, part, n * in[p].h * in[p].width * 2, NULL));
                    CHECK(gdn_engine_synchronize(engine, NULL)); /* part is refilled next */
                }
                memset(out, 0xff, n * HVp * V * out_size); /* NaN: a row left unwritten shows */
                CHECK(gdn_engine_upload(engine, io.o, out, n * HVp * V * out_size, NULL));
                CHECK(gdn_engine_run_layer(engine, l, NULL));
            }
            for (int d = 0; d < tp; d++) {
                gdn_layer_io io;
                engine = engines[d];
                CHECK(gdn_engine_layer_io(engine, l, &io));
                CHECK(gdn_engine_download(engine, out, io.o, n * HVp * V * out_size, NULL));
                CHECK(gdn_engine_synchronize(engine, NULL)); /* the staging buffers are reused next layer */
                for (size_t e = 0; e < n * HVp * V; e++) {
                    float x;
                    if (o.output == GDN_DTYPE_F32) memcpy(&x, out + 4 * e, 4);
                    else x = from_bf16(((uint16_t *)out)[e]);
                    const int row = (int)(e / ((size_t)T * HVp * V)), t = (int)(e / ((size_t)HVp * V) % (size_t)T);
                    bad_outputs += tree && t >= counts[row] ? x != 0.0f : !isfinite(x); /* past a row's nodes: zeros */
                }
            }
        }
        /* The sampler: accepted draft tokens per row, or for a tree the accepted node (-1: none). */
        for (int i = 0; i < batch; i++) accepted[i] = tree ? between(-1, counts[i] - 1) : verify ? between(0, T) : 1;
        if (verify) {
            EACH(gdn_engine_upload(engine, gdn_engine_accepted(engine), accepted, sizeof(int32_t) * batch, NULL));
            EACH(gdn_engine_synchronize(engine, NULL)); /* accepted is rewritten below */
            EACH(gdn_engine_commit(engine, NULL));
            verify_steps++;
            for (int i = 0; i < batch; i++) {
                drafted += tree ? counts[i] : T;
                if (tree) { /* the request advances by the accepted node's path */
                    int depth = 0;
                    for (int t = accepted[i]; t >= 0; t = parents[i * T + t]) depth++;
                    accepted[i] = depth;
                }
                kept += accepted[i];
            }
        } else {
            decode_steps++;
        }
        if (o.verbose)
            printf("step %3d: %s T=%d, %d rows in bucket %d, %d live, %d waiting\n", step, verify ? "verify" : "decode",
                   T, batch, bucket, n_live, waiting);

        /* Retire the requests that have their tokens. */
        for (int i = 0; i < batch; i++) {
            const int32_t slot = slot_of_row[i];
            tokens_left[slot] -= accepted[i];
            if (tokens_left[slot] > 0) continue;
            EACH(gdn_slot_free(engine, slot));
            for (int j = 0; j < n_live; j++)
                if (live[j] == slot) live[j] = live[--n_live];
            retired++;
        }
        if (n_live > 0) cursor %= n_live;
    }
    for (; n_live > 0; n_live--) EACH(gdn_slot_free(engine, live[n_live - 1]));

    gdn_status device = GDN_OK;
    int slots_left = 0;
    for (int d = 0; d < tp; d++) {
        const gdn_status flag = gdn_engine_check_device_error(engines[d], NULL);
        if (flag != GDN_OK) device = flag;
        slots_left += gdn_slot_count(engines[d]);
    }
    printf("steps: %ld decode, %ld verify (%ld of %ld drafted tokens accepted); requests: %ld admitted, %ld "
           "retired\n", decode_steps, verify_steps, kept, drafted, admitted, retired);
    const int pass = bad_outputs == 0 && device == GDN_OK && slots_left == 0;
    printf("checks: %ld %s, device error flag %s, %d slots still held: %s\n", bad_outputs,
           o.tree ? "bad outputs (non-finite, or not zero past a row's nodes)" : "non-finite outputs",
           device == GDN_OK ? "clear" : gdn_status_name(device), slots_left, pass ? "PASS" : "FAIL");
    for (int d = 0; d < tp; d++) gdn_engine_destroy(engines[d]);
    free(part), free(params), free(qk), free(v), free(ab), free(out), free(prefill), free(slot_of_row), free(accepted);
    free(counts), free(parents);
    free(live), free(tokens_left);
    return pass ? 0 : 1;
}
